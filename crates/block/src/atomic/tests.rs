use super::*;
use crate::MemVolume;
use std::sync::atomic::AtomicI64;
use std::sync::Arc;

const BS: u32 = 512;
const BLOCKS: u64 = 4096;
const KEY: u64 = 0x5eed;

fn mem() -> Arc<MemVolume> {
    Arc::new(MemVolume::new(BS, BLOCKS))
}

fn records() -> Arc<MemVolume> {
    Arc::new(MemVolume::new(
        BS,
        AtomicWrites::records_bytes(BS) / BS as u64,
    ))
}

fn fill(byte: u8, blocks: u64) -> Bytes {
    Bytes::from(vec![byte; (blocks * BS as u64) as usize])
}

/// The process "dies" after a number of writes across the volumes that share
/// `left`: the write that finds it at 1 lands only its first `tear` blocks, and
/// every write after that is lost (fails, changes nothing).
struct Cut {
    inner: VolumeRef,
    left: Arc<AtomicI64>,
    tear: u64,
}

#[async_trait]
impl Volume for Cut {
    fn geometry(&self) -> Geometry {
        self.inner.geometry()
    }
    async fn read(&self, lba: u64, blocks: u32) -> BlockResult<Bytes> {
        self.inner.read(lba, blocks).await
    }
    async fn write(&self, lba: u64, data: Bytes, fua: bool) -> BlockResult<()> {
        let left = self.left.fetch_sub(1, Ordering::SeqCst);
        let dead = || Err(BlockError::Io(std::io::Error::other("cut")));
        if left <= 0 {
            return dead();
        }
        if left == 1 {
            let keep = ((self.tear * BS as u64) as usize).min(data.len());
            if keep > 0 {
                self.inner.write(lba, data.slice(..keep), fua).await?;
            }
            return dead();
        }
        self.inner.write(lba, data, fua).await
    }
    async fn flush(&self) -> BlockResult<()> {
        Ok(())
    }
    async fn discard(&self, lba: u64, blocks: u64) -> BlockResult<()> {
        self.inner.discard(lba, blocks).await
    }
}

/// Writes one block at a time, yielding in between, so a read running at the same
/// time can see a write half done unless something keeps them apart.
struct Piecewise(VolumeRef);

#[async_trait]
impl Volume for Piecewise {
    fn geometry(&self) -> Geometry {
        self.0.geometry()
    }
    async fn read(&self, lba: u64, blocks: u32) -> BlockResult<Bytes> {
        let mut out = BytesMut::new();
        for i in 0..blocks as u64 {
            out.extend_from_slice(&self.0.read(lba + i, 1).await?);
            tokio::task::yield_now().await;
        }
        Ok(out.freeze())
    }
    async fn write(&self, lba: u64, data: Bytes, fua: bool) -> BlockResult<()> {
        for (i, c) in data.chunks(BS as usize).enumerate() {
            self.0
                .write(lba + i as u64, Bytes::copy_from_slice(c), fua)
                .await?;
            tokio::task::yield_now().await;
        }
        Ok(())
    }
    async fn flush(&self) -> BlockResult<()> {
        Ok(())
    }
    async fn discard(&self, lba: u64, blocks: u64) -> BlockResult<()> {
        self.0.discard(lba, blocks).await
    }
}

#[tokio::test]
async fn an_atomic_write_reads_back_and_leaves_no_record() {
    let (d, r) = (mem(), records());
    let v = AtomicWrites::new(d.clone(), r.clone(), KEY).unwrap();
    assert_eq!(
        v.atomic_write_max_blocks(),
        (ATOMIC_BYTES_MAX / BS as u64) as u32
    );
    v.write_atomic(100, fill(0xa6, 64)).await.unwrap();
    assert_eq!(v.read(100, 64).await.unwrap(), fill(0xa6, 64));
    // the record was cleared: a new instance replays nothing
    let again = AtomicWrites::new(d, r, KEY).unwrap();
    assert_eq!(again.recover().await.unwrap(), 0);
    assert_eq!(again.read(100, 64).await.unwrap(), fill(0xa6, 64));
}

#[tokio::test]
async fn refuses_what_it_cannot_make_atomic() {
    let v = AtomicWrites::new(mem(), records(), KEY).unwrap();
    let too_big = ATOMIC_BYTES_MAX / BS as u64 + 1;
    assert!(matches!(
        v.write_atomic(0, fill(1, too_big)).await,
        Err(BlockError::NotSupported(_))
    ));
    assert!(matches!(
        v.write_atomic(BLOCKS - 1, fill(1, 2)).await,
        Err(BlockError::OutOfRange { .. })
    ));
    // a record area too small, or of another block size
    let small = Arc::new(MemVolume::new(BS, 8));
    assert!(AtomicWrites::new(mem(), small, KEY).is_err());
    let other = Arc::new(MemVolume::new(4096, 4096));
    assert!(AtomicWrites::new(mem(), other, KEY).is_err());
}

/// Cuts the power after every write of an atomic write in turn (the record, the
/// in-place write, the clearing of the record), tearing the write it stops in
/// at several points; after a restart the blocks hold all of the old data or all
/// of the new, and all of the new whenever the write was answered.
#[tokio::test]
async fn a_crash_at_any_write_leaves_all_old_or_all_new() {
    const N: u64 = 48;
    let old = fill(0x11, N);
    let new = fill(0xee, N);
    let mut saw_new_after_error = false;
    let mut saw_old = false;
    for writes in 1..=4i64 {
        for tear in [0u64, 1, N / 2, N] {
            let (d, r) = (mem(), records());
            d.write(200, old.clone(), true).await.unwrap();
            let left = Arc::new(AtomicI64::new(writes));
            let cut = |inner: Arc<MemVolume>| -> VolumeRef {
                Arc::new(Cut {
                    inner,
                    left: left.clone(),
                    tear,
                })
            };
            let v = AtomicWrites::new(cut(d.clone()), cut(r.clone()), KEY).unwrap();
            let answered = v.write_atomic(200, new.clone()).await.is_ok();
            // the restart: the same media, without the cut
            let after = AtomicWrites::new(d.clone(), r.clone(), KEY).unwrap();
            after.recover().await.unwrap();
            let got = after.read(200, N as u32).await.unwrap();
            assert!(
                got == old || got == new,
                "cut after {writes} writes, torn at {tear} blocks: a mix of old and new"
            );
            if answered {
                assert_eq!(got, new, "answered, then lost (cut after {writes})");
            } else if got == new {
                saw_new_after_error = true;
            } else {
                saw_old = true;
            }
            // neighbours untouched
            assert_eq!(after.read(199, 1).await.unwrap(), fill(0, 1));
            assert_eq!(after.read(200 + N, 1).await.unwrap(), fill(0, 1));
        }
    }
    // both outcomes of an unanswered write happened: the cases cover a cut
    // before the record was durable and one after
    assert!(saw_old && saw_new_after_error);
}

/// A crash while the restart applies a record: the next restart applies it again.
#[tokio::test]
async fn a_crash_during_replay_is_replayed_again() {
    const N: u64 = 32;
    let (d, r) = (mem(), records());
    d.write(0, fill(0x11, N), true).await.unwrap();
    // the record lands, nothing else does
    let left = Arc::new(AtomicI64::new(2));
    let cut = |inner: Arc<MemVolume>, tear| -> VolumeRef {
        Arc::new(Cut {
            inner,
            left: left.clone(),
            tear,
        })
    };
    let v = AtomicWrites::new(cut(d.clone(), 0), cut(r.clone(), 0), KEY).unwrap();
    assert!(v.write_atomic(0, fill(0xee, N)).await.is_err());
    assert_eq!(d.read(0, N as u32).await.unwrap(), fill(0x11, N));
    // the first restart tears its in-place write half way
    left.store(1, Ordering::SeqCst);
    let torn = AtomicWrites::new(cut(d.clone(), N / 2), cut(r.clone(), N / 2), KEY).unwrap();
    assert!(torn.recover().await.is_err());
    let half = d.read(0, N as u32).await.unwrap();
    assert_ne!(half, fill(0x11, N));
    assert_ne!(half, fill(0xee, N));
    // the second restart completes it
    let fine = AtomicWrites::new(d.clone(), r.clone(), KEY).unwrap();
    assert_eq!(fine.recover().await.unwrap(), 1);
    assert_eq!(fine.read(0, N as u32).await.unwrap(), fill(0xee, N));
}

/// A plain write after an answered atomic write is never undone by a replay.
#[tokio::test]
async fn a_later_write_survives_the_restart() {
    let (d, r) = (mem(), records());
    let v = AtomicWrites::new(d.clone(), r.clone(), KEY).unwrap();
    v.write_atomic(10, fill(0xaa, 16)).await.unwrap();
    v.write(12, fill(0xbb, 4), true).await.unwrap();
    let after = AtomicWrites::new(d, r, KEY).unwrap();
    assert_eq!(after.recover().await.unwrap(), 0);
    assert_eq!(after.read(12, 4).await.unwrap(), fill(0xbb, 4));
    assert_eq!(after.read(10, 2).await.unwrap(), fill(0xaa, 2));
}

/// Two records a crash left over the same blocks are applied in sequence order.
#[tokio::test]
async fn overlapping_records_replay_in_sequence_order() {
    let (d, r) = (mem(), records());
    let slot = slot_blocks(BS);
    let rec = |seq, byte| {
        encode(
            BS,
            &Record {
                seq,
                lba: 5,
                key: KEY,
                data: fill(byte, 8),
            },
        )
    };
    // the newer one in the lower slot
    r.write(0, rec(9, 0x99), true).await.unwrap();
    r.write(slot, rec(4, 0x44), true).await.unwrap();
    // one of another volume in the last slot, never applied
    let foreign = encode(
        BS,
        &Record {
            seq: 20,
            lba: 5,
            key: KEY + 1,
            data: fill(0xf0, 8),
        },
    );
    r.write(3 * slot, foreign, true).await.unwrap();
    // and a torn one in a third slot, which must be ignored
    let mut torn = BytesMut::from(&rec(12, 0xcc)[..]);
    let n = torn.len();
    torn[n - 1] ^= 1;
    r.write(2 * slot, torn.freeze(), true).await.unwrap();
    let v = AtomicWrites::new(d, r.clone(), KEY).unwrap();
    assert_eq!(v.recover().await.unwrap(), 2);
    assert_eq!(v.read(5, 8).await.unwrap(), fill(0x99, 8));
    // every slot header was cleared (the torn one stays as it was: never applied)
    for s in 0..2 {
        assert!(header_blocks(BS, &r.read(s * slot, 1).await.unwrap()).is_none());
    }
    // numbering goes on above what was found
    assert_eq!(v.inner.next_seq.load(Ordering::SeqCst), 10);
}

/// Reads and writes running beside atomic writes never see one half done, even on
/// a volume that writes a block at a time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_running_beside_an_atomic_write_sees_part_of_it() {
    const N: u32 = 32;
    let data: VolumeRef = Arc::new(Piecewise(mem()));
    let v = Arc::new(AtomicWrites::new(data, records(), KEY).unwrap());
    v.write(0, fill(0, N as u64), true).await.unwrap();
    let writer = {
        let v = v.clone();
        tokio::spawn(async move {
            for i in 1..=60u8 {
                v.write_atomic(0, fill(i, N as u64)).await.unwrap();
            }
        })
    };
    let mut readers = Vec::new();
    for _ in 0..3 {
        let v = v.clone();
        readers.push(tokio::spawn(async move {
            let mut mixed = 0;
            for _ in 0..200 {
                let got = v.read(0, N).await.unwrap();
                if got.iter().any(|&b| b != got[0]) {
                    mixed += 1;
                }
            }
            mixed
        }));
    }
    writer.await.unwrap();
    for r in readers {
        assert_eq!(r.await.unwrap(), 0, "a read saw part of an atomic write");
    }
    assert_eq!(v.read(0, N).await.unwrap(), fill(60, N as u64));
}

/// An atomic write whose caller gives up half-way (an aborted command) still runs
/// to its end: it leaves no record that a restart would apply over a write
/// answered after it, and no slot taken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abandoned_atomic_write_leaves_no_record_behind() {
    let (d, r) = (mem(), records());
    let held = Arc::new(crate::HoldVolume::new(d.clone()));
    let v = Arc::new(AtomicWrites::new(held.clone(), r.clone(), KEY).unwrap());
    v.recover().await.unwrap();
    // in-place writes wait at the gate: an atomic write's record is durable by
    // the time it arrives there
    held.writes.hold();
    for round in 0..ATOMIC_SLOTS as u8 + 1 {
        let w = {
            let v = v.clone();
            tokio::spawn(async move { v.write_atomic(8, fill(0xa0 + round, 8)).await })
        };
        held.writes.arrivals(2 * round as usize + 1).await;
        w.abort();
        assert!(w.await.unwrap_err().is_cancelled());
        held.writes.release(1);
        // a plain write over the same blocks, answered after the abandoned one
        let p = {
            let v = v.clone();
            tokio::spawn(async move { v.write(8, fill(0xb0 + round, 8), true).await })
        };
        held.writes.arrivals(2 * round as usize + 2).await;
        held.writes.release(1);
        p.await.unwrap().unwrap();
        if round == 0 {
            // what a restart would find now
            let restart = AtomicWrites::new(d.clone(), r.clone(), KEY).unwrap();
            assert_eq!(
                restart.recover().await.unwrap(),
                0,
                "a record was left behind"
            );
            assert_eq!(d.read(8, 8).await.unwrap(), fill(0xb0, 8));
        }
        assert!(
            v.inner.free.lock().iter().all(|&f| f),
            "an abandoned atomic write kept its slot"
        );
    }
    held.writes.open();
    let again = AtomicWrites::new(d, r, KEY).unwrap();
    assert_eq!(
        again.recover().await.unwrap(),
        0,
        "a record was left behind"
    );
    assert_eq!(
        again.read(8, 8).await.unwrap(),
        fill(0xb0 + ATOMIC_SLOTS as u8, 8)
    );
}

/// An atomic write that fails in place keeps its record; a plain write over its
/// blocks answered after that is not undone by the restart's replay, and a read
/// never sees the failed write half done.
#[tokio::test]
async fn a_write_after_a_failed_atomic_write_is_not_undone_by_the_replay() {
    const N: u64 = 16;
    let (d, r) = (mem(), records());
    d.write(0, fill(0x11, 64), true).await.unwrap();
    let faulty = Arc::new(crate::FaultVolume::new(d.clone()));
    let plan = faulty.plan();
    let v = AtomicWrites::new(faulty.clone(), r.clone(), KEY).unwrap();
    v.recover().await.unwrap();
    // the in-place write lands its first 5 blocks, then fails
    plan.lock().tear_next_write_after_blocks = Some(5);
    assert!(v.write_atomic(4, fill(0xee, N)).await.is_err());
    // while the blocks cannot be written, what overlaps the record fails too
    plan.lock().bad_write_blocks = std::iter::once(0..64).collect();
    assert!(v.read(10, 2).await.is_err());
    assert!(v.write(12, fill(0xbb, 2), true).await.is_err());
    // elsewhere is untouched by it
    assert_eq!(v.read(40, 2).await.unwrap(), fill(0x11, 2));
    plan.lock().bad_write_blocks.clear();
    // a read sees the atomic write whole (applied), never torn
    assert_eq!(v.read(4, N as u32).await.unwrap(), fill(0xee, N));
    v.write(12, fill(0xbb, 2), true).await.unwrap();
    // atomic writes go on, in the freed slot too
    for i in 0..ATOMIC_SLOTS {
        v.write_atomic(30 + i, fill(0xcc, 1)).await.unwrap();
    }
    let after = AtomicWrites::new(d, r, KEY).unwrap();
    assert_eq!(after.recover().await.unwrap(), 0);
    assert_eq!(after.read(12, 2).await.unwrap(), fill(0xbb, 2));
    assert_eq!(after.read(4, 8).await.unwrap(), fill(0xee, 8));
}

/// Failed atomic writes that keep every slot (their records wait to be
/// applied) do not stop the next atomic write for good: with no slot free,
/// it settles the kept records first (and fails while they cannot be
/// applied). Before (review of 2026-12-06), it waited for a slot for ever,
/// even once the fault had cleared.
#[tokio::test]
async fn atomic_writes_go_on_after_failed_ones_kept_every_slot() {
    let (d, r) = (mem(), records());
    let faulty = Arc::new(crate::FaultVolume::new(d.clone()));
    let plan = faulty.plan();
    let v = AtomicWrites::new(faulty.clone(), r.clone(), KEY).unwrap();
    v.recover().await.unwrap();
    plan.lock().bad_write_blocks = (0..ATOMIC_SLOTS).map(|i| i * 16..i * 16 + 1).collect();
    for i in 0..ATOMIC_SLOTS {
        assert!(v.write_atomic(i * 16, fill(0xaa, 1)).await.is_err());
    }
    // while they cannot be applied, the next one fails (it does not wait)
    let next = tokio::time::timeout(
        std::time::Duration::from_secs(5),
        v.write_atomic(1000, fill(0xbb, 1)),
    )
    .await
    .expect("an atomic write waited for a slot the failed ones keep");
    assert!(next.is_err());
    plan.lock().bad_write_blocks.clear();
    tokio::time::timeout(
        std::time::Duration::from_secs(5),
        v.write_atomic(1000, fill(0xbb, 1)),
    )
    .await
    .expect("an atomic write waited for a slot the failed ones keep")
    .unwrap();
    assert_eq!(v.read(1000, 1).await.unwrap(), fill(0xbb, 1));
    for i in 0..ATOMIC_SLOTS {
        assert_eq!(v.read(i * 16, 1).await.unwrap(), fill(0xaa, 1));
    }
}

/// The bytes of a read bound for a socket may be a view of the volume's
/// pages, read when the socket copies them: the first atomic write waits
/// until those handed out before it are gone (sent), so they never show part
/// of it; from its start on, such reads are ordinary ones, which hold up
/// neither it nor later atomic writes.
#[tokio::test]
async fn an_atomic_write_waits_for_the_bytes_of_a_read_for_a_socket() {
    let v = Arc::new(AtomicWrites::new(mem(), records(), KEY).unwrap());
    v.write(0, fill(1, 8), false).await.unwrap();
    let held = v.read_to_socket(0, 8).await.unwrap();
    let writer = {
        let v = v.clone();
        tokio::spawn(async move { v.write_atomic(0, fill(2, 8)).await })
    };
    let started = async {
        while !v.inner.views_off.load(Ordering::SeqCst) && !writer.is_finished() {
            tokio::task::yield_now().await;
        }
    };
    tokio::time::timeout(std::time::Duration::from_secs(10), started)
        .await
        .expect("the atomic write never started");
    for _ in 0..100 {
        tokio::task::yield_now().await;
    }
    assert!(
        !writer.is_finished(),
        "the atomic write ran under the bytes of a read"
    );
    // a read for a socket now is an ordinary one, answered at once
    let copy = v.read_to_socket(8, 8).await.unwrap();
    assert_eq!(copy, fill(0, 8));
    assert_eq!(held, fill(1, 8));
    drop(held);
    writer.await.unwrap().unwrap();
    assert_eq!(v.read(0, 8).await.unwrap(), fill(2, 8));
    // and it holds up no later atomic write
    let later = v.read_to_socket(0, 8).await.unwrap();
    tokio::time::timeout(
        std::time::Duration::from_secs(10),
        v.write_atomic(0, fill(3, 8)),
    )
    .await
    .expect("an atomic write waited for the bytes of a later read")
    .unwrap();
    assert_eq!(later, fill(2, 8));
    drop(copy);
}

/// A request read in several pieces for a socket, one over blocks a failed
/// atomic write kept its record for: the piece over them settles the record
/// while the earlier piece's bytes are held by the same caller (before
/// the review of 2026-12-06 the settle waited for those bytes for ever).
#[tokio::test]
async fn a_read_for_a_socket_over_a_kept_record_does_not_wait_for_itself() {
    let (d, r) = (mem(), records());
    let faulty = Arc::new(crate::FaultVolume::new(d.clone()));
    let plan = faulty.plan();
    let v = AtomicWrites::new(faulty.clone(), r.clone(), KEY).unwrap();
    v.recover().await.unwrap();
    plan.lock().tear_next_write_after_blocks = Some(2);
    assert!(v.write_atomic(16, fill(0xee, 8)).await.is_err());
    let first = v.read_to_socket(0, 16).await.unwrap();
    let second = tokio::time::timeout(std::time::Duration::from_secs(10), v.read_to_socket(16, 8))
        .await
        .expect("the read waited for bytes its own caller holds")
        .unwrap();
    assert_eq!(second, fill(0xee, 8));
    assert_eq!(first, fill(0, 16));
}
