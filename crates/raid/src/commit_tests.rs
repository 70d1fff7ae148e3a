//! The group commit's leader and a checkpoint that waits for the leader's own
//! completing record (`commit.rs`, `journal_reserve`): a checkpoint that takes
//! the ring's lock after the leader took its batch from the queue is not seen
//! by `refuse_riding`, and waits for the data-first record the leader's own
//! completing record completes; a leader that then waited for the ring's lock
//! waited for itself.

use crate::commit::{BeforeReserve, TakenBatch};
use crate::pool::Inner;
use crate::util::BoxFut;
use crate::{Member, Pool, PoolConfig, RaidLevel};
use block::{Bytes, HoldVolume, MemVolume, Volume, VolumeRef};
use parking_lot::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;
use tokio::sync::Notify;

const BS: u32 = 4096;
const WAIT: Duration = Duration::from_secs(20);

fn pattern(seed: u8, blocks: usize) -> Bytes {
    Bytes::from(
        (0..blocks * BS as usize)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
            .collect::<Vec<u8>>(),
    )
}

/// What the hook does and saw.
#[derive(Default)]
struct Script {
    /// The next batch without a completing record waits for `release`
    /// (its leader keeps the copy set busy meanwhile).
    hold_plain: AtomicBool,
    held: AtomicBool,
    release: Notify,
    /// A checkpoint of everything takes the ring's lock as soon as a leader
    /// took a batch of at least this many records with its own completing
    /// record among them.
    fire_at_records: parking_lot::Mutex<Option<usize>>,
    fired: AtomicBool,
    checkpoint: Mutex<Option<tokio::task::JoinHandle<block::BlockResult<()>>>>,
    seen: Mutex<Vec<TakenBatch>>,
}

fn hook(inner: Weak<Inner>, script: Arc<Script>) -> BeforeReserve {
    Arc::new(move |b: TakenBatch| -> BoxFut<'static, ()> {
        let (inner, script) = (inner.clone(), script.clone());
        Box::pin(async move {
            let Some(inner) = inner.upgrade() else {
                return;
            };
            script.seen.lock().push(b);
            if b.riding == 0 && script.hold_plain.swap(false, Ordering::SeqCst) {
                let released = script.release.notified();
                script.held.store(true, Ordering::SeqCst);
                released.await;
                return;
            }
            let at = *script.fire_at_records.lock();
            if !b.own_riding || at.is_none_or(|n| b.records < n) {
                return;
            }
            if script.fired.swap(true, Ordering::SeqCst) {
                return;
            }
            let task = tokio::spawn({
                let inner = inner.clone();
                async move { inner.checkpoint_all().await }
            });
            *script.checkpoint.lock() = Some(task);
            let j = inner.journal.as_ref().expect("a journal");
            while j.alloc.try_lock().is_ok() {
                tokio::task::yield_now().await;
            }
        })
    })
}

struct Rig {
    pool: Arc<Pool>,
    /// The members (their reads held all at once: `hold`).
    members: Vec<Arc<HoldVolume>>,
    script: Arc<Script>,
}

impl Rig {
    /// Every member's reads wait (`true`) or go (`false`).
    fn hold_reads(&self, on: bool) {
        for m in &self.members {
            if on {
                m.reads.hold();
            } else {
                m.reads.open();
            }
        }
    }
}

/// A RAID 5 of 3 over memory members whose reads can be held, idle and
/// flushed, the hook set.
async fn rig() -> Rig {
    let held: Vec<Arc<HoldVolume>> = (0..3)
        .map(|_| Arc::new(HoldVolume::new(Arc::new(MemVolume::new(BS, 2048)))))
        .collect();
    let members = held
        .iter()
        .enumerate()
        .map(|(i, h)| Member::new(format!("m{i}"), h.clone() as VolumeRef))
        .collect();
    let mut cfg = PoolConfig::new("leader", RaidLevel::Raid5);
    cfg.chunk_bytes = 16 * 1024;
    cfg.journal_bytes = Some(2 << 20);
    let pool = Pool::create(cfg, members, vec![]).await.expect("create");
    pool.wait_idle().await;
    pool.flush().await.unwrap();
    let script = Arc::new(Script::default());
    *pool.inner.before_reserve.lock() = Some(hook(Arc::downgrade(&pool.inner), script.clone()));
    Rig {
        pool: Arc::new(pool),
        members: held,
        script,
    }
}

async fn until(what: &str, mut done: impl FnMut() -> bool) {
    tokio::time::timeout(WAIT, async {
        while !done() {
            tokio::task::yield_now().await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("never: {what}"));
}

/// The task's result, once it ended (at most [`WAIT`]; `what` says what must
/// end).
async fn ends<T>(task: tokio::task::JoinHandle<block::BlockResult<T>>, what: &str) -> T {
    tokio::time::timeout(WAIT, task)
        .await
        .unwrap_or_else(|_| panic!("never ended: {what}"))
        .unwrap()
        .unwrap()
}

/// The checkpoint the hook started ends, and the pool is left without the
/// hook.
async fn checkpoint_ends(r: &Rig) {
    until("the checkpoint started", || {
        r.script.fired.load(Ordering::SeqCst)
    })
    .await;
    let task = r.script.checkpoint.lock().take().expect("a checkpoint");
    ends(task, "the checkpoint and the leader waited for each other").await;
    *r.pool.inner.before_reserve.lock() = None;
    tokio::time::timeout(WAIT, r.pool.wait_applied())
        .await
        .expect("every update went in place");
}

/// A data-first update's completion leads the group commit that would carry
/// its completing record, alone; a checkpoint of everything (a shutdown's)
/// takes the ring's lock right after the leader took its batch. The leader's
/// record is turned away and goes to its slot, and the leader does not wait
/// for the ring's lock: the checkpoint ends, the update is in place, and the
/// pool goes on. Without it, the checkpoint and the leader waited for each
/// other for ever.
#[tokio::test]
async fn a_leader_whose_completing_record_is_turned_away_does_not_wait_for_the_checkpoint() {
    let r = rig().await;
    *r.script.fire_at_records.lock() = Some(1);
    let before = r.pool.status().write_path;
    let data = pattern(7, 1);
    r.pool.write(3, data.clone(), false).await.unwrap();
    checkpoint_ends(&r).await;
    let after = r.pool.status().write_path;
    assert_eq!(after.completions_in_slots - before.completions_in_slots, 1);
    assert_eq!(after.completions_riding, before.completions_riding);
    assert_eq!(r.pool.read(3, 1).await.unwrap(), data);
    // the group commit goes on
    let more = pattern(9, 2);
    r.pool.write(40, more.clone(), false).await.unwrap();
    assert_eq!(r.pool.read(40, 2).await.unwrap(), more);
}

/// The same with another update's record in the leader's batch: the leader
/// hands it back to the queue, where its own writer leads it once the
/// checkpoint is done; every update is acknowledged and reads back.
#[tokio::test]
async fn a_leader_that_stops_leading_hands_the_rest_of_its_batch_back() {
    let r = rig().await;
    *r.script.fire_at_records.lock() = Some(2);
    let before = r.pool.status().write_path;
    // D: acknowledged, its completion waiting for its reads
    r.hold_reads(true);
    let d = pattern(7, 1);
    r.pool.write(3, d.clone(), false).await.unwrap();
    // X: its leader holds the copy set
    r.script.hold_plain.store(true, Ordering::SeqCst);
    let x = pattern(8, 1);
    let wx = tokio::spawn({
        let (pool, x) = (r.pool.clone(), x.clone());
        async move { pool.write(100, x, false).await }
    });
    until("X's leader holds the copy set", || {
        r.script.held.load(Ordering::SeqCst)
    })
    .await;
    // D's completing record queues behind it, then Y's record
    let j = r.pool.inner.journal.as_ref().unwrap();
    r.hold_reads(false);
    until("D's completing record queued", || {
        j.group.lock().queued() == 1
    })
    .await;
    let y = pattern(9, 1);
    let wy = tokio::spawn({
        let (pool, y) = (r.pool.clone(), y.clone());
        async move { pool.write(200, y, false).await }
    });
    until("Y's record queued", || j.group.lock().queued() == 2).await;
    r.script.release.notify_one();
    checkpoint_ends(&r).await;
    for w in [wx, wy] {
        ends(w, "acknowledged").await;
    }
    let seen = r.script.seen.lock().clone();
    assert!(
        seen.iter()
            .any(|b| b.own_riding && b.records == 2 && b.riding == 1),
        "{seen:?}"
    );
    // D's completing record to its slot (turned away), X's too (the
    // checkpoint covers X's data-first record: refused before it queued),
    // Y's rides (Y's records came after the checkpoint)
    let after = r.pool.status().write_path;
    assert_eq!(
        (
            after.completions_in_slots - before.completions_in_slots,
            after.completions_riding - before.completions_riding
        ),
        (2, 1)
    );
    for (lba, want) in [(3, d), (100, x), (200, y)] {
        assert_eq!(r.pool.read(lba, 1).await.unwrap(), want, "block {lba}");
    }
}

/// A journaled (not data-first) partial update that must wait for its share
/// of the apply budget waits before its record has a sequence number: the
/// budget's holders may be waiting for a checkpoint (data-first updates queued
/// behind one hold their share until their record is written; here the test
/// holds the whole budget and lets it go only once a checkpoint of everything
/// has ended). Without it, the update waited for the budget holding a record
/// the checkpoint waited for: neither ended.
#[tokio::test]
async fn an_update_waits_for_the_apply_budget_before_its_record_is_numbered() {
    let r = rig().await;
    r.pool.set_data_first(false);
    let inner = r.pool.inner.clone();
    let all = inner
        .apply_budget
        .clone()
        .acquire_many_owned(crate::commit::APPLY_BUDGET_KIB)
        .await
        .unwrap();
    let waiting = inner.budget_wait.notified();
    let data = pattern(5, 1);
    let w = tokio::spawn({
        let (pool, data) = (r.pool.clone(), data.clone());
        async move { pool.write(3, data, false).await }
    });
    tokio::time::timeout(WAIT, waiting)
        .await
        .expect("the update waits for the budget");
    // a checkpoint of everything, then the budget let go
    let checkpoint = tokio::spawn({
        let inner = inner.clone();
        async move {
            let r = inner.checkpoint_all().await;
            drop(all);
            r
        }
    });
    ends(
        checkpoint,
        "the checkpoint waited for the update, which waited for the budget",
    )
    .await;
    ends(w, "acknowledged").await;
    tokio::time::timeout(WAIT, r.pool.wait_applied())
        .await
        .expect("in place");
    assert!(r.pool.status().write_path.early_acks > 0);
    assert_eq!(r.pool.read(3, 1).await.unwrap(), data);
}

/// The journal device fails under a batch while a checkpoint of everything
/// (a shutdown's) holds the ring's lock and waits for that batch: the batch's
/// checkpoint after the device loss does not take the ring's lock, both end,
/// the batch goes to the members and its write is acknowledged. Before, the
/// leader waited for the ring's lock with its batch in flight: neither ended,
/// and no journaled write of the pool went on.
#[tokio::test]
async fn a_journal_device_lost_under_a_batch_does_not_wait_for_a_checkpoint_waiting_for_it() {
    let members = (0..3)
        .map(|i| {
            Member::new(
                format!("m{i}"),
                Arc::new(MemVolume::new(BS, 2048)) as VolumeRef,
            )
        })
        .collect();
    // the device's writes wait at a gate when held; behind it, a fault layer
    // fails them once the device is dead
    let faulty = Arc::new(block::FaultVolume::new(
        Arc::new(MemVolume::new(BS, 1024)) as VolumeRef
    ));
    let gate = Arc::new(HoldVolume::new(faulty.clone() as VolumeRef));
    let dev = gate.clone() as VolumeRef;
    let mut cfg = PoolConfig::new("jdev", RaidLevel::Raid5);
    cfg.chunk_bytes = 16 * 1024;
    cfg.journal_bytes = Some(2 << 20);
    let pool =
        Pool::create_with_journal_device(cfg, members, vec![], Some(Member::new("ssd", dev)))
            .await
            .expect("create");
    pool.wait_idle().await;
    pool.flush().await.unwrap();
    let pool = Arc::new(pool);
    let inner = pool.inner.clone();
    gate.writes.hold();
    let data = pattern(4, 1);
    let w = tokio::spawn({
        let (pool, data) = (pool.clone(), data.clone());
        async move { pool.write(3, data, false).await }
    });
    tokio::time::timeout(WAIT, gate.writes.arrivals(1))
        .await
        .expect("the batch reaches the device");
    let checkpoint = tokio::spawn({
        let inner = inner.clone();
        async move { inner.checkpoint_all().await }
    });
    let j = inner.journal.as_ref().unwrap();
    until("the checkpoint holds the ring's lock", || {
        j.alloc.try_lock().is_err()
    })
    .await;
    faulty.plan().lock().dead = true;
    gate.writes.open();
    ends(
        checkpoint,
        "the checkpoint and the device loss waited for each other",
    )
    .await;
    ends(w, "acknowledged").await;
    assert!(pool.status().journal_device.is_some_and(|d| d.failed));
    assert_eq!(pool.read(3, 1).await.unwrap(), data);
    // journaled on the members from now on
    let more = pattern(6, 1);
    pool.write(70, more.clone(), false).await.unwrap();
    assert_eq!(pool.read(70, 1).await.unwrap(), more);
}
