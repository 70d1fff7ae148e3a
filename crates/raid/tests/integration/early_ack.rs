//! Early acknowledgement of journaled stripe updates (`commit.rs`): a small
//! write of a parity pool is acknowledged once its journal record is durable,
//! while its in-place writes still run. Members here hold back every non-FUA
//! write (the in-place writes; journal ring writes are FUA) until released:
//! - the write is acknowledged while its in-place writes are held;
//! - a read of that stripe waits for them and returns the new data, while a
//!   read of another stripe does not wait;
//! - a flush does not wait for them (the record is durable: a crash after the
//!   flush keeps the write, below);
//! - a crash while they are still held, then the loss of any one member (RAID 5)
//!   or any two (RAID 6), keeps the acknowledged data (the record is replayed);
//! - with every read held too, a small write is still acknowledged (its data
//!   record goes first; its reads and parity follow), and a crash then, with
//!   the loss of any member (two on RAID 6), keeps it: assemble computes the
//!   parity from the data record and the rest of the stripe;
//! - a journal copy stuck on one member does not hold the acknowledgement (a
//!   spare copy makes the batch durable), and a checkpoint waits for it.

use crate::common;

use async_trait::async_trait;
use block::{BlockError, BlockResult, Bytes, Extent, Geometry, MemVolume, Volume, VolumeRef};
use common::*;
use raid::{Member, Pool, RaidLevel, SpareWhen};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Gate {
    Open,
    Held,
    /// Reads wait too.
    HeldAll,
    /// The machine "lost power": held writes fail, nothing more lands.
    Dead,
}

/// The first member block past the superblocks (their region is the first
/// MiB of a member; the journal ring follows it).
const RING_FROM: u64 = (1 << 20) / BS as u64;

/// A member whose non-FUA writes wait while the shared gate is held, and
/// whose FUA writes past the superblocks (the journal ring's) wait while its
/// own `stuck` flag is set (a copy stuck behind a deep queue).
struct Gated {
    inner: Arc<MemVolume>,
    gate: watch::Receiver<Gate>,
    stuck: watch::Receiver<bool>,
    /// This member's non-FUA writes (its in-place writes) wait while set.
    pinned: watch::Receiver<bool>,
    /// Answer after a delay set by the block asked for, so requests in flight
    /// together complete out of issue order (as an NCQ disk's do); without
    /// it a member answers at once, in order.
    jitter: bool,
}

impl Gated {
    async fn jitter(&self, lba: u64) {
        if self.jitter {
            let us = lba.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 54; // 0..1023
            tokio::time::sleep(Duration::from_micros(us * 3)).await;
        }
    }
}

#[async_trait]
impl Volume for Gated {
    fn geometry(&self) -> Geometry {
        self.inner.geometry()
    }
    async fn read(&self, lba: u64, blocks: u32) -> BlockResult<Bytes> {
        self.jitter(lba).await;
        let mut g = self.gate.clone();
        let state = *g
            .wait_for(|s| *s != Gate::HeldAll)
            .await
            .map_err(|_| BlockError::Io(std::io::Error::other("gate gone")))?;
        if state == Gate::Dead {
            return Err(BlockError::Io(std::io::Error::other("power lost")));
        }
        self.inner.read(lba, blocks).await
    }
    async fn write(&self, lba: u64, data: Bytes, fua: bool) -> BlockResult<()> {
        self.jitter(lba).await;
        let mut g = self.gate.clone();
        let state = if fua && lba >= RING_FROM {
            let mut st = self.stuck.clone();
            st.wait_for(|s| !*s)
                .await
                .map_err(|_| BlockError::Io(std::io::Error::other("gate gone")))?;
            *g.borrow()
        } else {
            let mut pin = self.pinned.clone();
            tokio::select! {
                r = pin.wait_for(|p| !*p) => {
                    r.map_err(|_| BlockError::Io(std::io::Error::other("gate gone")))?;
                }
                // a pinned write fails when the power is lost
                r = g.wait_for(|s| *s == Gate::Dead) => {
                    r.map_err(|_| BlockError::Io(std::io::Error::other("gate gone")))?;
                }
            }
            *g.wait_for(|s| *s != Gate::Held && *s != Gate::HeldAll)
                .await
                .map_err(|_| BlockError::Io(std::io::Error::other("gate gone")))?
        };
        if state == Gate::Dead {
            return Err(BlockError::Io(std::io::Error::other("power lost")));
        }
        self.inner.write(lba, data, fua).await
    }
    async fn flush(&self) -> BlockResult<()> {
        self.inner.flush().await
    }
    async fn discard(&self, lba: u64, blocks: u64) -> BlockResult<()> {
        self.inner.discard(lba, blocks).await
    }
    async fn block_status(&self, lba: u64, blocks: u64) -> BlockResult<Vec<Extent>> {
        self.inner.block_status(lba, blocks).await
    }
}

struct Rig {
    mems: Vec<Arc<MemVolume>>,
    gate: watch::Sender<Gate>,
    stuck: Vec<watch::Sender<bool>>,
    pinned: Vec<watch::Sender<bool>>,
    pool: Pool,
    oracle: MemVolume,
}

/// A pool of `n` gated members, filled with a pattern and flushed, gate open.
async fn rig(level: RaidLevel, n: usize) -> Rig {
    rig_with(level, n, false).await
}

/// `rig`, its members answering out of order when `jitter` is set.
async fn rig_with(level: RaidLevel, n: usize, jitter: bool) -> Rig {
    let (gate, rx) = watch::channel(Gate::Open);
    let mems: Vec<Arc<MemVolume>> = (0..n)
        .map(|_| Arc::new(MemVolume::new(BS, MEMBER_BLOCKS)))
        .collect();
    let (stuck, stuck_rx): (Vec<_>, Vec<_>) = (0..n).map(|_| watch::channel(false)).unzip();
    let (pinned, pinned_rx): (Vec<_>, Vec<_>) = (0..n).map(|_| watch::channel(false)).unzip();
    let members = mems
        .iter()
        .zip(stuck_rx.into_iter().zip(pinned_rx))
        .enumerate()
        .map(|(i, (m, (stuck, pinned)))| {
            let v = Arc::new(Gated {
                inner: m.clone(),
                gate: rx.clone(),
                stuck,
                pinned,
                jitter,
            }) as VolumeRef;
            Member::new(format!("m{i}"), v)
        })
        .collect();
    let (pool, oracle) = create_filled(level, members, 11).await;
    // and in place (a flush does not wait for that)
    pool.wait_applied().await;
    Rig {
        mems,
        gate,
        stuck,
        pinned,
        pool,
        oracle,
    }
}

const WAIT: Duration = Duration::from_secs(20);

/// The pool assembled from `mems` without the positions in `lost`.
async fn assemble_without(mems: &[Arc<MemVolume>], lost: &[usize]) -> Pool {
    let members: Vec<Member> = mems
        .iter()
        .enumerate()
        .filter(|(i, _)| !lost.contains(i))
        .map(|(i, m)| Member::new(format!("m{i}"), m.clone() as VolumeRef))
        .collect();
    Pool::assemble(members, false).await.expect("assemble")
}

/// The power is lost (nothing held lands), the acknowledged `writes` go into
/// the oracle, and the members minus `lost` are assembled: every block must
/// read back as the oracle has it.
async fn crash_and_lose(
    r: Rig,
    writes: Vec<(u64, Bytes)>,
    level: RaidLevel,
    lost: impl Iterator<Item = usize>,
) {
    r.gate.send_replace(Gate::Dead);
    // stuck ring writes now fail too: they never land
    for s in &r.stuck {
        s.send_replace(false);
    }
    drop(r.pool);
    for (lba, d) in writes {
        r.oracle.write(lba, d, false).await.unwrap();
    }
    let lost: Vec<usize> = lost.collect();
    let pool = assemble_without(&r.mems, &lost).await;
    for lba in 0..pool.geometry().block_count {
        assert_eq!(
            pool.read(lba, 1).await.unwrap(),
            r.oracle.read(lba, 1).await.unwrap(),
            "{level:?} without members {lost:?}: block {lba}"
        );
    }
}

#[tokio::test]
async fn reads_wait_for_the_in_place_writes_of_an_acknowledged_update_and_a_flush_does_not() {
    for (level, n) in [(RaidLevel::Raid5, 4), (RaidLevel::Raid6, 5)] {
        let r = rig(level, n).await;
        let stripe_blocks = r.pool.geometry().optimal_io_blocks as u64;
        r.gate.send_replace(Gate::Held);
        let before = r.pool.status().write_path.early_acks;
        let new = pattern(99, 2);
        tokio::time::timeout(WAIT, r.pool.write(3, new.clone(), false))
            .await
            .expect("acknowledged while the in-place writes are held")
            .unwrap();
        assert_eq!(r.pool.status().write_path.early_acks, before + 1);
        // another stripe is read at once
        let far = 3 * stripe_blocks + 1;
        let got = tokio::time::timeout(WAIT, r.pool.read(far, 1))
            .await
            .expect("a read of another stripe does not wait")
            .unwrap();
        assert_eq!(got, r.oracle.read(far, 1).await.unwrap());
        // the written stripe waits: no read can return until the writes land
        let read = r.pool.read(3, 2);
        tokio::pin!(read);
        assert!(
            tokio::time::timeout(Duration::from_millis(200), &mut read)
                .await
                .is_err(),
            "{level:?}: read returned while the in-place writes were held"
        );
        // a flush returns: the acknowledged write is durable in its record
        tokio::time::timeout(WAIT, r.pool.flush())
            .await
            .expect("a flush does not wait for in-place writes")
            .unwrap();
        r.gate.send_replace(Gate::Open);
        let got = tokio::time::timeout(WAIT, read).await.unwrap().unwrap();
        assert_eq!(got, new, "{level:?}: read after the acknowledgement");
        r.oracle.write(3, new, false).await.unwrap();
        check_all(&r.pool, &r.oracle).await;
    }
}

#[tokio::test]
async fn a_crash_before_the_in_place_writes_and_a_member_loss_keep_acknowledged_writes() {
    for (level, n, lose) in [(RaidLevel::Raid5, 4, 1), (RaidLevel::Raid6, 5, 2)] {
        for first_lost in 0..n {
            let r = rig(level, n).await;
            let stripe_blocks = r.pool.geometry().optimal_io_blocks as u64;
            r.gate.send_replace(Gate::Held);
            // small writes to distinct stripes (a second update of one stripe
            // waits for the first's in-place writes), each acknowledged with
            // nothing in place
            let mut writes = Vec::new();
            for w in 0..6u64 {
                let lba = 5 + w * 2 * stripe_blocks + w;
                let d = pattern(500 + w + first_lost as u64 * 10, 1 + w % 3);
                tokio::time::timeout(WAIT, r.pool.write(lba, d.clone(), false))
                    .await
                    .expect("acknowledged while the in-place writes are held")
                    .unwrap();
                writes.push((lba, d));
            }
            // a flush returns with the in-place writes still held; then the
            // power is lost and they never land
            tokio::time::timeout(WAIT, r.pool.flush())
                .await
                .expect("a flush does not wait for in-place writes")
                .unwrap();
            crash_and_lose(
                r,
                writes,
                level,
                (first_lost..first_lost + lose).map(|k| k % n),
            )
            .await;
        }
    }
}

#[tokio::test]
async fn a_write_acknowledged_before_its_reads_survives_a_crash_and_a_member_loss() {
    for (level, n, lose) in [(RaidLevel::Raid5, 4, 1), (RaidLevel::Raid6, 5, 2)] {
        for first_lost in 0..n {
            let r = rig(level, n).await;
            let stripe_blocks = r.pool.geometry().optimal_io_blocks as u64;
            let before = r.pool.status().write_path;
            r.gate.send_replace(Gate::HeldAll);
            // small writes to distinct stripes, one spanning two chunks, each
            // acknowledged while no member read can return
            let mut writes = Vec::new();
            for w in 0..6u64 {
                let lba = 5 + w * 2 * stripe_blocks + w * 7;
                let d = pattern(700 + w + first_lost as u64 * 10, 1 + w % 3);
                tokio::time::timeout(WAIT, r.pool.write(lba, d.clone(), false))
                    .await
                    .expect("acknowledged while every read is held")
                    .unwrap();
                writes.push((lba, d));
            }
            // across the end of a stripe's first chunk (another stripe than the
            // writes above: a second update of a stripe would wait for the first)
            let spanning = 13 * stripe_blocks + stripe_blocks / (n as u64 - lose as u64) - 1;
            let d = pattern(800 + first_lost as u64, 3);
            tokio::time::timeout(WAIT, r.pool.write(spanning, d.clone(), false))
                .await
                .expect("acknowledged while every read is held")
                .unwrap();
            writes.push((spanning, d));
            let after = r.pool.status().write_path;
            assert_eq!(after.data_first_acks - before.data_first_acks, 7);
            // power lost: no read, parity or in-place write ever happened
            crash_and_lose(
                r,
                writes,
                level,
                (first_lost..first_lost + lose).map(|k| k % n),
            )
            .await;
        }
    }
}

/// Waits until `done` holds (the pool's background work reached a state its
/// status shows), for `WAIT` at most.
async fn until(what: &str, mut done: impl FnMut() -> bool) {
    let t0 = std::time::Instant::now();
    while !done() {
        assert!(t0.elapsed() < WAIT, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// The record completing a data-first update rides a later group commit
/// (`commit.rs`, "Completing records ride the next group commit"). Here each
/// one rode and was durable, then the update's in-place writes landed on
/// every member but one (a torn stripe where that member holds the written
/// chunk or the parity: new parity beside old data, or the reverse), and the
/// power was lost. With any other member lost too, every block reads back:
/// the completing record is replayed. (The data-first record alone would be
/// completed from the stripe as found, torn, and rebuild the lost member
/// wrong: the test fails with completing records left out of the replay.)
#[tokio::test]
async fn a_completing_record_that_rode_a_group_commit_repairs_a_torn_stripe() {
    let (level, n) = (RaidLevel::Raid5, 4);
    for pinned in 0..n {
        for lost in (0..n).filter(|&x| x != pinned) {
            let r = rig(level, n).await;
            let stripe_blocks = r.pool.geometry().optimal_io_blocks as u64;
            let chunk_blocks = stripe_blocks / (n as u64 - 1);
            r.pinned[pinned].send_replace(true);
            let before = r.pool.status().write_path;
            let mut writes = Vec::new();
            for w in 0..9u64 {
                // every data chunk of stripes whose parity lies on each member
                let lba = (2 * w) * stripe_blocks + (w % 3) * chunk_blocks + 1 + w;
                let d = pattern(900 + w + 10 * pinned as u64 + 100 * lost as u64, 1 + w % 2);
                tokio::time::timeout(WAIT, r.pool.write(lba, d.clone(), false))
                    .await
                    .expect("acknowledged")
                    .unwrap();
                writes.push((lba, d));
                // one update at a time: its completing record durable before
                // the next one starts (no other group commit to share with)
                until("the completing record is durable", || {
                    let s = r.pool.status().write_path;
                    s.completions_riding + s.completions_in_slots
                        - before.completions_riding
                        - before.completions_in_slots
                        == w + 1
                })
                .await;
            }
            let after = r.pool.status().write_path;
            assert_eq!(after.data_first_acks - before.data_first_acks, 9);
            assert_eq!(after.completions_riding - before.completions_riding, 9);
            crash_and_lose(r, writes, level, std::iter::once(lost)).await;
        }
    }
}

/// A checkpoint that waits for data-first updates whose completing records
/// are still to be written (here: a shutdown, holding the ring while every
/// read is held) is not a deadlock: those records, which would otherwise
/// ride a group commit that the checkpoint holds back, are turned away to the
/// slots set aside behind their batch. Afterwards every write reads back,
/// with any member lost.
#[tokio::test]
async fn a_checkpoint_waiting_for_completing_records_turns_them_to_their_slots() {
    let (level, n) = (RaidLevel::Raid5, 4);
    for lost in 0..n {
        let r = rig(level, n).await;
        let stripe_blocks = r.pool.geometry().optimal_io_blocks as u64;
        let before = r.pool.status().write_path;
        r.gate.send_replace(Gate::HeldAll);
        let writes: Vec<(u64, Bytes)> = (0..6u64)
            .map(|w| {
                let lba = 7 + w * 2 * stripe_blocks + w;
                (lba, pattern(1300 + w + 10 * lost as u64, 1 + w % 3))
            })
            .collect();
        for (lba, d) in &writes {
            tokio::time::timeout(WAIT, r.pool.write(*lba, d.clone(), false))
                .await
                .expect("acknowledged while every read is held")
                .unwrap();
        }
        let pool = Arc::new(r.pool);
        let stop = tokio::spawn({
            let pool = pool.clone();
            async move { pool.shutdown().await }
        });
        // (a current-thread runtime: the shutdown runs at this yield until
        // its checkpoint holds the ring and waits for the six updates, whose
        // reads are still held)
        tokio::task::yield_now().await;
        assert!(!stop.is_finished());
        r.gate.send_replace(Gate::Open);
        tokio::time::timeout(WAIT, stop)
            .await
            .expect("the shutdown's checkpoint ends")
            .unwrap()
            .unwrap();
        let after = pool.status().write_path;
        assert_eq!(after.completions_in_slots - before.completions_in_slots, 6);
        assert_eq!(after.completions_riding, before.completions_riding);
        drop(pool);
        for (lba, d) in writes {
            r.oracle.write(lba, d, false).await.unwrap();
        }
        let pool = assemble_without(&r.mems, &[lost]).await;
        check_all(&pool, &r.oracle).await;
    }
}

/// Journal copies stuck on members (their ring writes never finish) do not
/// hold the acknowledgement: each batch also goes to as many spare members as
/// there are stuck ones (one, then two: the default), and is durable once
/// `redundancy + 1` copies are. A crash then, with the in-place writes held,
/// and the loss of any other member (two on RAID 6) keeps every acknowledged
/// write.
#[tokio::test]
async fn journal_copies_stuck_on_members_do_not_hold_the_acknowledgement() {
    for (level, n, lose) in [(RaidLevel::Raid5, 4, 1), (RaidLevel::Raid6, 6, 2)] {
        for spares in [1usize, 2] {
            for first in 0..n {
                let stuck: Vec<usize> = (first..first + spares).map(|k| k % n).collect();
                let r = rig(level, n).await;
                // these members answer in order: the spares only when told to
                r.pool.set_journal_spare_copies(spares, SpareWhen::Always);
                let stripe_blocks = r.pool.geometry().optimal_io_blocks as u64;
                let before = r.pool.status().write_path;
                r.gate.send_replace(Gate::Held);
                for &k in &stuck {
                    r.stuck[k].send_replace(true);
                }
                // one at a time, so successive batches rotate over every copy
                // set, the stuck members' included
                let mut writes = Vec::new();
                for w in 0..(2 * n as u64) {
                    let lba = 3 + w * 2 * stripe_blocks + w;
                    let d = pattern(
                        1100 + w + first as u64 * 20 + spares as u64 * 300,
                        1 + w % 2,
                    );
                    tokio::time::timeout(WAIT, r.pool.write(lba, d.clone(), false))
                        .await
                        .unwrap_or_else(|_| {
                            panic!("{level:?}: write {w} waited for the copies stuck on {stuck:?}")
                        })
                        .unwrap();
                    writes.push((lba, d));
                }
                let after = r.pool.status().write_path;
                assert!(
                    after.journal_spare_wins > before.journal_spare_wins,
                    "{level:?}: no batch was made durable by a spare copy"
                );
                // any other member (or pair) lost: a copy of every record is left
                let others: Vec<usize> = (0..n).filter(|k| !stuck.contains(k)).collect();
                let first_lost = first % others.len();
                let lost = (first_lost..first_lost + lose).map(|k| others[k % others.len()]);
                crash_and_lose(r, writes, level, lost).await;
            }
        }
    }
}

/// The spare copy goes only to members that reorder their queues: a pool
/// whose members complete out of order writes it (after judging a few hundred
/// completions), one whose members answer in order never does; both keep
/// every write.
#[tokio::test]
async fn spare_copies_go_only_to_members_that_reorder() {
    for jitter in [true, false] {
        let r = rig_with(RaidLevel::Raid5, 4, jitter).await;
        let (pool, oracle) = (&r.pool, &r.oracle);
        let total = pool.geometry().block_count;
        let mut reordered = 0.0;
        let mut spares = 0;
        for phase in 0..2u64 {
            let before = pool.status();
            for round in 0..12u64 {
                // sixteen small writes in flight at once, on distinct blocks
                let batch: Vec<(u64, Bytes)> = (0..16u64)
                    .map(|i| {
                        let lba = ((phase * 12 + round) * 16 + i) * 97 % (total - 2);
                        (lba, pattern(9000 + round * 16 + i + phase * 500, 1))
                    })
                    .collect();
                let futs: Vec<_> = batch
                    .iter()
                    .map(|(lba, d)| pool.write(*lba, d.clone(), false))
                    .collect();
                for ((lba, d), res) in batch.into_iter().zip(futures_join(futs).await) {
                    res.unwrap();
                    oracle.write(lba, d, false).await.unwrap();
                }
            }
            let after = pool.status();
            let (mut done, mut over) = (0, 0);
            for (a, b) in before.members.iter().zip(&after.members) {
                done += b.completed - a.completed;
                over += b.reordered - a.reordered;
            }
            assert!(done >= 256, "{done} completions");
            reordered = over as f64 / done as f64;
            spares = after.write_path.journal_spare_copies - before.write_path.journal_spare_copies;
        }
        // judged in the first phase, so the second shows the verdict
        if jitter {
            assert!(reordered > 0.2, "jittered members reordered {reordered}");
            assert!(spares > 0, "no spare copy on members that reorder");
        } else {
            assert_eq!(reordered, 0.0, "members answering at once in order");
            assert_eq!(spares, 0, "a spare copy on members that answer in order");
        }
        pool.wait_applied().await;
        check_all(pool, oracle).await;
    }
}

/// A spare copy still running after its batch was acknowledged holds back
/// the checkpoint that would free its ring space (it could otherwise land on
/// a newer record's copy): a shutdown, which checkpoints everything, waits for
/// it, and ends once it lands.
#[tokio::test]
async fn a_checkpoint_waits_for_a_copy_still_running() {
    for stuck in 0..4 {
        let r = rig(RaidLevel::Raid5, 4).await;
        r.pool.set_journal_spare_copies(1, SpareWhen::Always);
        let stripe_blocks = r.pool.geometry().optimal_io_blocks as u64;
        r.stuck[stuck].send_replace(true);
        let mut writes = Vec::new();
        for w in 0..8u64 {
            let lba = 7 + w * 2 * stripe_blocks + w;
            let d = pattern(1300 + w + stuck as u64 * 20, 1);
            tokio::time::timeout(WAIT, r.pool.write(lba, d.clone(), false))
                .await
                .expect("acknowledged without the stuck copy")
                .unwrap();
            writes.push((lba, d));
        }
        tokio::time::timeout(WAIT, r.pool.wait_applied())
            .await
            .expect("in place without the stuck copy");
        let shutdown = r.pool.shutdown();
        tokio::pin!(shutdown);
        assert!(
            tokio::time::timeout(Duration::from_millis(300), &mut shutdown)
                .await
                .is_err(),
            "member {stuck}: the checkpoint did not wait for the copy still running"
        );
        r.stuck[stuck].send_replace(false);
        tokio::time::timeout(WAIT, shutdown)
            .await
            .expect("the shutdown ends once the copy lands")
            .unwrap();
        for (lba, d) in writes {
            r.oracle.write(lba, d, false).await.unwrap();
        }
        let pool = assemble_without(&r.mems, &[(stuck + 1) % 4]).await;
        check_all(&pool, &r.oracle).await;
    }
}

/// A crash while assemble completes data-first records, after any number of
/// its member writes (the completing record's copies, the in-place writes, the
/// checkpoint), then a member lost: the next assemble still reads back every
/// acknowledged block.
#[tokio::test]
async fn a_crash_while_assemble_completes_data_first_records_keeps_them() {
    let n = 4;
    // how many member writes an assemble that is not cut makes
    let mut total = None;
    let mut cut = 0i64;
    loop {
        let r = rig(RaidLevel::Raid5, n).await;
        let stripe_blocks = r.pool.geometry().optimal_io_blocks as u64;
        r.gate.send_replace(Gate::HeldAll);
        let mut writes = Vec::new();
        for w in 0..4u64 {
            let lba = 9 + w * 3 * stripe_blocks + w;
            let d = pattern(900 + w + cut as u64, 1 + w % 2);
            tokio::time::timeout(WAIT, r.pool.write(lba, d.clone(), false))
                .await
                .expect("acknowledged while every read is held")
                .unwrap();
            writes.push((lba, d));
        }
        r.gate.send_replace(Gate::Dead);
        drop(r.pool);
        for (lba, d) in writes {
            r.oracle.write(lba, d, false).await.unwrap();
        }
        const UNCUT: i64 = 1 << 40;
        let budget = Arc::new(AtomicI64::new(if total.is_none() { UNCUT } else { cut }));
        let members: Vec<Member> = r
            .mems
            .iter()
            .enumerate()
            .map(|(i, m)| {
                let v = Arc::new(crate::write_hole::Cut {
                    inner: m.clone() as VolumeRef,
                    budget: budget.clone(),
                }) as VolumeRef;
                Member::new(format!("m{i}"), v)
            })
            .collect();
        let first = Pool::assemble(members, false).await;
        if total.is_none() {
            first.expect("assemble");
            total = Some(UNCUT - budget.load(Ordering::SeqCst));
            continue;
        }
        drop(first);
        let lost = cut as usize % n;
        let pool = assemble_without(&r.mems, &[lost]).await;
        for lba in 0..pool.geometry().block_count {
            assert_eq!(
                pool.read(lba, 1).await.unwrap(),
                r.oracle.read(lba, 1).await.unwrap(),
                "cut after {cut} of {total:?} member writes, member {lost} lost: block {lba}"
            );
        }
        let total = total.unwrap();
        if cut >= total {
            break;
        }
        cut += (total / 24).max(1);
    }
}

/// Many small writes wrap the journal ring several times: checkpoints run
/// ahead in the background while group commits go on; a crash afterwards (with
/// writes still in flight on other stripes) and any one member lost keep every
/// acknowledged block.
#[tokio::test]
async fn checkpoints_ahead_of_the_ring_keep_every_acknowledged_write() {
    for lost in 0..4 {
        let r = rig(RaidLevel::Raid5, 4).await;
        let total = r.pool.geometry().block_count;
        let before = r.pool.status().write_path;
        let mut w = 0u64;
        for round in 0..40u64 {
            // eight writes in flight at once, on distinct blocks of a round
            let batch: Vec<(u64, Bytes)> = (0..8u64)
                .map(|i| {
                    let lba = (round * 8 + i) * 53 % (total - 4);
                    (lba, pattern(7000 + w + i + lost as u64 * 1000, 1 + i % 4))
                })
                .collect();
            w += 8;
            let futs: Vec<_> = batch
                .iter()
                .map(|(lba, d)| r.pool.write(*lba, d.clone(), false))
                .collect();
            let results = futures_join(futs).await;
            for ((lba, d), res) in batch.into_iter().zip(results) {
                res.unwrap();
                r.oracle.write(lba, d, false).await.unwrap();
            }
        }
        let after = r.pool.status().write_path;
        assert!(
            after.journal_records - before.journal_records >= 320,
            "every small write journaled"
        );
        assert!(
            after.journal_checkpoints_ahead > before.journal_checkpoints_ahead,
            "the ring wrapped with no checkpoint started ahead"
        );
        r.gate.send_replace(Gate::Dead);
        drop(r.pool);
        let pool = assemble_without(&r.mems, &[lost]).await;
        check_all(&pool, &r.oracle).await;
    }
}

/// A partial update too large to set its completing record aside in the ring
/// (a small ring, large chunks) is not refused: it reads first, then journals
/// the whole update, as before data-first records.
#[tokio::test]
async fn an_update_too_large_for_a_data_first_record_reads_first() {
    let mut cfg = config(RaidLevel::Raid5);
    cfg.chunk_bytes = 64 * 1024;
    // just room for the two full-stripe records the pool needs (4 x 64K each,
    // with their headers)
    cfg.journal_bytes = Some(520 * 1024);
    let ms: Vec<TestMember> = (0..4).map(|_| member(MEMBER_BLOCKS)).collect();
    let members = ms
        .iter()
        .enumerate()
        .map(|(i, m)| m.as_member(&format!("m{i}")))
        .collect();
    let pool = Pool::create(cfg, members, vec![]).await.expect("create");
    pool.wait_idle().await;
    let chunk = 64 * 1024 / BS as u64;
    let before = pool.status().write_path;
    // a small write goes data-first
    let small = pattern(1, 2);
    pool.write(5, small.clone(), false).await.unwrap();
    // two chunks less a block: a data-first record of 128K and a completing
    // record of 192K, over half the ring
    let big = pattern(2, 2 * chunk - 1);
    let at = 3 * (3 * chunk) + 1;
    pool.write(at, big.clone(), false).await.unwrap();
    let after = pool.status().write_path;
    assert_eq!(after.partial_updates - before.partial_updates, 2);
    assert_eq!(after.data_first_acks - before.data_first_acks, 1);
    assert_eq!(pool.read(5, 2).await.unwrap(), small);
    assert_eq!(pool.read(at, 2 * chunk as u32 - 1).await.unwrap(), big);
}
