//! Write hole: power is cut in the middle of stripe updates (every possible cut
//! point of a write sequence), the members lose their volatile caches, the pool is
//! re-assembled with one member missing, and every acknowledged write must read
//! back; an interrupted write reads as old or new data per block.

use crate::common;

use block::{Bytes, CrashSimVolume, MemVolume, Volume, VolumeRef};
use common::*;
use raid::{Member, Pool, RaidLevel};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

/// The power cut after a shared budget of writes (block's fault layer).
pub(crate) use block::CutVolume as Cut;

/// `n` members that lose their volatile caches on `crash()`.
fn crash_sims(n: usize) -> Vec<Arc<CrashSimVolume>> {
    (0..n)
        .map(|_| Arc::new(CrashSimVolume::new(BS, MEMBER_BLOCKS)))
        .collect()
}

/// Pool members over `sims` whose writes stop when the shared `budget` runs out.
fn cut_members(sims: &[Arc<CrashSimVolume>], budget: &Arc<AtomicI64>) -> Vec<Member> {
    sims.iter()
        .enumerate()
        .map(|(i, s)| {
            Member::new(
                format!("m{i}"),
                Arc::new(Cut {
                    inner: s.clone() as VolumeRef,
                    budget: budget.clone(),
                }) as VolumeRef,
            )
        })
        .collect()
}

/// A RAID 5 pool of `n` members that lose their volatile caches on `crash()`,
/// its writes stopped when the shared budget (unarmed: -1) runs out; created
/// and idle.
async fn cut_raid5(n: usize) -> (Vec<Arc<CrashSimVolume>>, Arc<AtomicI64>, Pool) {
    let sims = crash_sims(n);
    let budget = Arc::new(AtomicI64::new(-1));
    let pool = Pool::create(
        config(RaidLevel::Raid5),
        cut_members(&sims, &budget),
        vec![],
    )
    .await
    .unwrap();
    pool.wait_idle().await;
    (sims, budget, pool)
}

/// Blocks of `pool` that differ from `oracle`, except blocks of the interrupted
/// write `torn` that hold its new data (it may land, block by block).
async fn count_wrong(pool: &Pool, oracle: &MemVolume, torn: Option<&(u64, Bytes)>) -> usize {
    let mut wrong = 0;
    for lba in 0..pool.geometry().block_count {
        let got = pool.read(lba, 1).await.expect("read after crash");
        let want = oracle.read(lba, 1).await.unwrap();
        if got == want {
            continue;
        }
        if let Some((tl, td)) = torn {
            if lba >= *tl && lba < tl + (td.len() / BS as usize) as u64 {
                let off = ((lba - tl) * BS as u64) as usize;
                if got[..] == td[off..off + BS as usize] {
                    continue;
                }
            }
        }
        wrong += 1;
    }
    wrong
}

/// Runs one cut point; returns the number of blocks that read back wrong.
async fn one_cut(
    level: RaidLevel,
    n: usize,
    budget_writes: i64,
    fua: bool,
    journal: bool,
) -> usize {
    let sims = crash_sims(n);
    let budget = Arc::new(AtomicI64::new(-1));
    let members = cut_members(&sims, &budget);
    let mut cfg = config(level);
    cfg.unsafe_disable_journal = !journal;
    let pool = Pool::create(cfg, members, vec![]).await.unwrap();
    pool.wait_idle().await;
    let total = pool.geometry().block_count;
    let oracle = MemVolume::new(BS, total);
    let mut at = 0;
    let mut i = 0;
    while at < total {
        let c = 64.min(total - at);
        let d = pattern(1000 + i, c);
        pool.write(at, d.clone(), false).await.unwrap();
        oracle.write(at, d, false).await.unwrap();
        at += c;
        i += 1;
    }
    pool.flush().await.unwrap();
    // and in place (a flush does not wait for that)
    pool.wait_applied().await;
    // arm the cut and write small pieces (partial stripes: read-modify-write)
    budget.store(budget_writes, Ordering::SeqCst);
    let mut torn: Option<(u64, Bytes)> = None;
    for w in 0..40u64 {
        let lba = (w * 97 + budget_writes as u64 * 31) % (total - 24);
        let blocks = 1 + (w * 7) % 24;
        let d = pattern(w + 7 * budget_writes as u64, blocks);
        match pool.write(lba, d.clone(), fua).await {
            Ok(()) => oracle.write(lba, d, false).await.unwrap(),
            Err(_) => {
                torn = Some((lba, d));
                break;
            }
        }
    }
    drop(pool);
    // re-assemble with one member missing (the combination that opens the hole)
    let pool = crashed_without(&sims, budget_writes as usize % n).await;
    count_wrong(&pool, &oracle, torn.as_ref()).await
}

/// The power goes (every member loses its volatile cache), and the pool is
/// assembled again without member `missing` (the others found in reverse).
async fn crashed_without(sims: &[Arc<CrashSimVolume>], missing: usize) -> Pool {
    for s in sims {
        s.crash();
    }
    let members: Vec<Member> = sims
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != missing)
        .rev()
        .map(|(i, s)| Member::new(format!("m{i}"), s.clone() as VolumeRef))
        .collect();
    Pool::assemble(members, false).await.expect("assemble")
}

#[tokio::test]
async fn crash_mid_stripe_then_member_loss_keeps_acknowledged_writes() {
    for (level, n) in [
        (RaidLevel::Raid5, 4),
        (RaidLevel::Raid6, 5),
        (RaidLevel::F1, 3),
        (RaidLevel::Raid1, 2),
        (RaidLevel::Raid10, 4),
        (RaidLevel::Raid10Far, 3),
    ] {
        let parity = matches!(level, RaidLevel::Raid5 | RaidLevel::Raid6 | RaidLevel::F1);
        for budget in 1..40 {
            // parity pools acknowledge non-FUA writes after the FUA journal record, so
            // even unflushed acknowledged writes must survive; mirrors need FUA
            let wrong = one_cut(level, n, budget, !parity, true).await;
            assert_eq!(
                wrong, 0,
                "{level:?}: cut after {budget} member writes lost data"
            );
        }
    }
}

#[tokio::test]
async fn without_the_journal_the_hole_is_real() {
    // the same scenario with the journal off must lose acknowledged data at some
    // cut point: this is what shows the test above can fail
    let mut bad = 0;
    for budget in 1..40 {
        bad += one_cut(RaidLevel::Raid5, 4, budget, true, false).await;
    }
    assert!(
        bad > 0,
        "expected the unprotected pool to show the write hole"
    );
}

/// Whole-stripe writes skip the journal: a cut in the middle leaves a stripe with
/// some chunks new, some old, and parity of neither. Runs one cut point: FUA
/// whole-stripe writes until the cut, crash, assemble with every member (an
/// unclean assemble resyncs the regions with whole-stripe writes when `intent`),
/// then lose a member; returns the blocks that read back wrong (an interrupted
/// write may read old or new per block, never anything else).
async fn one_full_stripe_cut(
    level: RaidLevel,
    n: usize,
    budget_writes: i64,
    intent: bool,
) -> usize {
    let sims = crash_sims(n);
    let budget = Arc::new(AtomicI64::new(-1));
    let members = cut_members(&sims, &budget);
    let mut cfg = config(level);
    cfg.unsafe_disable_write_intent = !intent;
    let pool = Pool::create(cfg, members, vec![]).await.unwrap();
    pool.wait_idle().await;
    let total = pool.geometry().block_count;
    let stripe = pool.geometry().optimal_io_blocks as u64;
    let stripes = total / stripe;
    let oracle = MemVolume::new(BS, total);
    for s in 0..stripes {
        let d = pattern(5000 + s, stripe);
        pool.write(s * stripe, d.clone(), false).await.unwrap();
        oracle.write(s * stripe, d, false).await.unwrap();
    }
    pool.flush().await.unwrap();
    // and in place (a flush does not wait for that)
    pool.wait_applied().await;
    budget.store(budget_writes, Ordering::SeqCst);
    let mut torn: Option<(u64, Bytes)> = None;
    for w in 0..12u64 {
        let s = (w * 5 + budget_writes as u64) % stripes;
        let d = pattern(w + 100 * budget_writes as u64, stripe);
        match pool.write(s * stripe, d.clone(), true).await {
            Ok(()) => oracle.write(s * stripe, d, false).await.unwrap(),
            Err(_) => {
                torn = Some((s * stripe, d));
                break;
            }
        }
    }
    drop(pool);
    for s in &sims {
        s.crash();
    }
    let members: Vec<Member> = sims
        .iter()
        .enumerate()
        .rev()
        .map(|(i, s)| Member::new(format!("m{i}"), s.clone() as VolumeRef))
        .collect();
    let pool = Pool::assemble(members, false).await.expect("assemble");
    pool.wait_idle().await;
    pool.fail_member(budget_writes as usize % n).await.unwrap();
    count_wrong(&pool, &oracle, torn.as_ref()).await
}

#[tokio::test]
async fn crash_mid_full_stripe_then_member_loss_reads_old_or_new() {
    for (level, n) in [
        (RaidLevel::Raid5, 4),
        (RaidLevel::Raid6, 5),
        (RaidLevel::F1, 3),
    ] {
        for budget in 1..30 {
            let wrong = one_full_stripe_cut(level, n, budget, true).await;
            assert_eq!(
                wrong, 0,
                "{level:?}: whole-stripe write cut after {budget} member writes"
            );
        }
    }
}

#[tokio::test]
async fn without_the_write_intent_a_torn_full_stripe_is_wrong() {
    // the control: the same cuts with the intent off must corrupt some block
    let mut bad = 0;
    for budget in 1..30 {
        bad += one_full_stripe_cut(RaidLevel::Raid5, 4, budget, false).await;
    }
    assert!(
        bad > 0,
        "expected torn whole stripes without the write intent"
    );
}

/// Mirrors: a cut between the copies of a write leaves them different. Runs one
/// cut point on a mirror pool and returns the mismatches a scrub finds after the
/// crash, an assemble with every member and the resync of the regions the
/// write intent listed (none are expected; without the intent some are).
async fn one_mirror_cut(level: RaidLevel, n: usize, budget_writes: i64, intent: bool) -> u64 {
    let sims = crash_sims(n);
    let budget = Arc::new(AtomicI64::new(-1));
    let members = cut_members(&sims, &budget);
    let mut cfg = config(level);
    cfg.unsafe_disable_write_intent = !intent;
    let pool = Pool::create(cfg, members, vec![]).await.unwrap();
    pool.wait_idle().await;
    pool.shutdown().await.unwrap();
    drop(pool);
    let members = cut_members(&sims, &budget);
    // a clean restart: nothing to resync; the intent is armed from here on
    let pool = Pool::assemble(members, false).await.unwrap();
    if !intent {
        // the control pool: assemble turned the intent on; reopen it without
        drop(pool);
        return one_mirror_cut_unprotected(sims, budget, budget_writes).await;
    }
    write_until_cut(&pool, &budget, budget_writes).await;
    drop(pool);
    scrub_after_crash(&sims).await
}

async fn write_until_cut(pool: &Pool, budget: &Arc<AtomicI64>, budget_writes: i64) {
    let total = pool.geometry().block_count;
    budget.store(budget_writes, Ordering::SeqCst);
    for w in 0..40u64 {
        let lba = (w * 97 + budget_writes as u64 * 31) % (total - 24);
        let blocks = 1 + (w * 7) % 24;
        let d = pattern(w + 7 * budget_writes as u64, blocks);
        if pool.write(lba, d, true).await.is_err() {
            break;
        }
    }
}

async fn scrub_after_crash(sims: &[Arc<CrashSimVolume>]) -> u64 {
    for s in sims {
        s.crash();
    }
    let members: Vec<Member> = sims
        .iter()
        .enumerate()
        .map(|(i, s)| Member::new(format!("m{i}"), s.clone() as VolumeRef))
        .collect();
    let pool = Pool::assemble(members, false).await.expect("assemble");
    pool.wait_idle().await;
    let report = pool.scrub().await.unwrap().unwrap();
    report.mismatches
}

async fn one_mirror_cut_unprotected(
    sims: Vec<Arc<CrashSimVolume>>,
    budget: Arc<AtomicI64>,
    budget_writes: i64,
) -> u64 {
    // a fresh pool with the intent off, on the same kind of members
    let n = sims.len();
    let fresh = crash_sims(n);
    let members = cut_members(&fresh, &budget);
    let mut cfg = config(RaidLevel::Raid1);
    cfg.unsafe_disable_write_intent = true;
    let pool = Pool::create(cfg, members, vec![]).await.unwrap();
    pool.wait_idle().await;
    write_until_cut(&pool, &budget, budget_writes).await;
    drop(pool);
    drop(sims);
    scrub_after_crash(&fresh).await
}

#[tokio::test]
async fn crash_between_mirror_copies_is_resynced_from_the_intent() {
    for (level, n) in [
        (RaidLevel::Raid1, 2),
        (RaidLevel::Raid10, 4),
        (RaidLevel::Raid10Far, 2),
        (RaidLevel::Raid10Far, 3),
    ] {
        for budget in 1..16 {
            let mismatches = one_mirror_cut(level, n, budget, true).await;
            assert_eq!(
                mismatches, 0,
                "{level:?}: copies differ after a cut after {budget} member writes"
            );
        }
    }
}

#[tokio::test]
async fn without_the_write_intent_mirror_copies_stay_different() {
    let mut bad = 0;
    for budget in 1..16 {
        bad += one_mirror_cut(RaidLevel::Raid1, 2, budget, false).await;
    }
    assert!(
        bad > 0,
        "expected differing copies without the write intent"
    );
}

/// Like `one_cut`, but the partial-stripe writes run concurrently, so their journal
/// records share group commits (one ring write carrying several records); every
/// write acknowledged before the cut must survive the crash and the loss of
/// `lose` members, and every interrupted one reads old or new per block.
/// With `ride`, the records completing data-first updates ride later group
/// commits (the default), else they go to the slots set aside behind their
/// batch (`concurrent_writes_share_group_commits` checks that each way is
/// taken). Returns the blocks read back wrong.
async fn one_concurrent_cut(
    level: RaidLevel,
    n: usize,
    budget_writes: i64,
    lose: usize,
    journal: bool,
    ride: bool,
) -> usize {
    let sims = crash_sims(n);
    let budget = Arc::new(AtomicI64::new(-1));
    let mut cfg = config(level);
    cfg.unsafe_disable_journal = !journal;
    let pool = Pool::create(cfg, cut_members(&sims, &budget), vec![])
        .await
        .unwrap();
    pool.wait_idle().await;
    pool.set_completions_ride(ride);
    let total = pool.geometry().block_count;
    let oracle = MemVolume::new(BS, total);
    let mut at = 0;
    while at < total {
        let c = 64.min(total - at);
        let d = pattern(3000 + at, c);
        pool.write(at, d.clone(), false).await.unwrap();
        oracle.write(at, d, false).await.unwrap();
        at += c;
    }
    pool.flush().await.unwrap();
    // and in place (a flush does not wait for that)
    pool.wait_applied().await;
    budget.store(budget_writes, Ordering::SeqCst);
    // 24 writes of 1..8 blocks in distinct slots, all in flight at once
    let slot = total / 24;
    let writes: Vec<(u64, Bytes)> = (0..24u64)
        .map(|w| {
            let blocks = 1 + (w * 5 + budget_writes as u64) % 8;
            let lba = w * slot + (w * 13 + budget_writes as u64 * 7) % (slot - blocks);
            (lba, pattern(w * 101 + budget_writes as u64, blocks))
        })
        .collect();
    let futs: Vec<_> = writes
        .iter()
        .map(|(lba, d)| pool.write(*lba, d.clone(), false))
        .collect();
    let results = futures_join(futs).await;
    let mut torn = Vec::new();
    for ((lba, d), r) in writes.iter().zip(results) {
        match r {
            Ok(()) => oracle.write(*lba, d.clone(), false).await.unwrap(),
            Err(_) => torn.push((*lba, d.clone())),
        }
    }
    drop(pool);
    for s in &sims {
        s.crash();
    }
    let members: Vec<Member> = sims
        .iter()
        .enumerate()
        .filter(|(i, _)| (0..lose).all(|k| *i != (budget_writes as usize + 2 * k) % n))
        .map(|(i, s)| Member::new(format!("m{i}"), s.clone() as VolumeRef))
        .collect();
    let pool = Pool::assemble(members, false).await.expect("assemble");
    let mut wrong = 0;
    for lba in 0..total {
        let got = pool.read(lba, 1).await.expect("read after crash");
        let want = oracle.read(lba, 1).await.unwrap();
        if got == want {
            continue;
        }
        let new_of_torn = torn.iter().any(|(tl, td)| {
            lba >= *tl && lba < tl + (td.len() / BS as usize) as u64 && {
                let off = ((lba - tl) * BS as u64) as usize;
                got[..] == td[off..off + BS as usize]
            }
        });
        if !new_of_torn {
            wrong += 1;
        }
    }
    wrong
}

async fn futures_join<'a>(
    futs: Vec<impl std::future::Future<Output = block::BlockResult<()>> + Send + 'a>,
) -> Vec<block::BlockResult<()>> {
    let boxed: Vec<block::BoxFut<'a, block::BlockResult<()>>> = futs
        .into_iter()
        .map(|f| -> block::BoxFut<'a, block::BlockResult<()>> { Box::pin(f) })
        .collect();
    block::join_all(boxed).await
}

#[tokio::test]
async fn group_committed_records_survive_a_crash_and_member_loss() {
    for (level, n, lose) in [(RaidLevel::Raid5, 4, 1), (RaidLevel::Raid6, 5, 2)] {
        for ride in [true, false] {
            for budget in (1..60).step_by(3) {
                let wrong = one_concurrent_cut(level, n, budget, lose, true, ride).await;
                assert_eq!(
                    wrong, 0,
                    "{level:?}: concurrent writes, cut after {budget} member writes lost data (completing records riding: {ride})"
                );
            }
        }
    }
}

#[tokio::test]
async fn without_the_journal_concurrent_writes_lose_data() {
    // the control of the test above
    let mut bad = 0;
    for budget in (1..60).step_by(3) {
        bad += one_concurrent_cut(RaidLevel::Raid5, 4, budget, 1, false, true).await;
    }
    assert!(
        bad > 0,
        "expected the unprotected pool to show the write hole"
    );
}

#[tokio::test]
async fn concurrent_writes_share_group_commits() {
    let (_sims, _budget, pool) = cut_raid5(5).await;
    let slot = pool.geometry().block_count / 32;
    // 32 two-block writes in flight at once, one per 32nd of the pool
    let writes_at = |at: u64, seed: u64| {
        let futs: Vec<_> = (0..32u64)
            .map(|w| pool.write(w * slot + at, pattern(w + seed, 2), false))
            .collect();
        async move {
            for r in futures_join(futs).await {
                r.unwrap();
            }
        }
    };
    writes_at(3, 0).await;
    // every update went data-first: its data record in a group commit, then,
    // once its parity was known, the record completing it in a later group
    // commit, beside other records
    pool.wait_applied().await;
    let w = pool.status().write_path;
    assert_eq!(w.data_first_acks, 32);
    assert_eq!(w.journal_records, 64);
    assert_eq!(w.completions_riding + w.completions_in_slots, 32);
    assert!(w.completions_riding > 0);
    assert!(
        w.journal_batches < 32,
        "32 concurrent updates took {} group commits",
        w.journal_batches
    );
    assert!(w.journal_batch_records_max > 1);
    // two copies per ring write on RAID 5, the completing records in the
    // group commits: fewer ring writes than updates per copy (the spare
    // copies a pool writes while its members reorder, which a loaded machine
    // makes them do, aside)
    let ring_writes = w.journal_ring_writes - w.journal_spare_copies;
    assert!(
        ring_writes < 2 * 32,
        "64 records of 32 updates took {ring_writes} ring writes (and {} spare copies)",
        w.journal_spare_copies
    );
    // completing records in the slots their batch set aside share ring
    // writes too
    pool.set_completions_ride(false);
    writes_at(4, 80).await;
    pool.wait_applied().await;
    let w1 = pool.status().write_path;
    assert_eq!(w1.data_first_acks - w.data_first_acks, 32);
    assert_eq!(w1.completions_in_slots - w.completions_in_slots, 32);
    let batches = w1.journal_batches - w.journal_batches;
    let completion_writes = (w1.journal_ring_writes
        - w1.journal_spare_copies
        - (w.journal_ring_writes - w.journal_spare_copies)
        - 2 * batches)
        / 2;
    assert!(
        completion_writes < 32,
        "32 completing records took {completion_writes} ring writes"
    );
    // and the same without data-first records: one record per update
    pool.set_data_first(false);
    writes_at(5, 40).await;
    let w2 = pool.status().write_path;
    assert_eq!(w2.data_first_acks - w1.data_first_acks, 0);
    assert_eq!(w2.journal_records, 128 + 32);
    assert!(w2.journal_batches - w1.journal_batches < 32);
}

/// A rebuild checkpoint reaches the superblocks only once the stripes below it
/// were flushed on the new member. Here a superblock is written for another
/// reason (a rate change) while the first rebuilt batch sits in the new
/// member's volatile cache; the power is cut, the pool reassembled and the
/// other copy lost: the new member must serve nothing it does not hold. Before,
/// the superblock carried the in-memory checkpoint, and the reads below it
/// returned the zeroes the power cut left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebuild_checkpoint_is_never_recorded_ahead_of_a_flush() {
    // 2 MiB reserved + 16 MiB of data per member, 64 KiB chunks: a rebuild
    // batch (8 MiB) is half the pool
    let blocks = (2 << 20) / BS as u64 + (16 << 20) / BS as u64;
    let sims: Vec<Arc<CrashSimVolume>> = (0..3)
        .map(|_| Arc::new(CrashSimVolume::new(BS, blocks)))
        .collect();
    let budget = Arc::new(AtomicI64::new(-1));
    let cut = cut_members(&sims, &budget);
    let mut cut = cut.into_iter();
    let (m0, m1, m2) = (
        cut.next().unwrap(),
        cut.next().unwrap(),
        cut.next().unwrap(),
    );
    let mut cfg = config(RaidLevel::Raid1);
    cfg.chunk_bytes = 64 * 1024;
    let pool = Pool::create(cfg, vec![m0, m1], vec![]).await.unwrap();
    pool.wait_idle().await;
    let total = pool.geometry().block_count;
    let mut at = 0;
    while at < total {
        let c = 2048.min(total - at);
        pool.write(at, pattern(at, c), false).await.unwrap();
        at += c;
    }
    pool.flush().await.unwrap();
    // a slow rebuild onto a fresh member: its first batch is copied at once,
    // then it waits (the checkpoint's own flush comes a second after the start)
    pool.set_rebuild_rate_mb_s(1).await.unwrap();
    pool.fail_member(1).await.unwrap();
    pool.replace_member(1, m2).await.unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while pool.status().rebuild.is_none_or(|p| p.done_bytes == 0) {
        assert!(
            std::time::Instant::now() < deadline,
            "the rebuild never began"
        );
        tokio::task::yield_now().await;
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    }
    // a superblock written now, for another reason
    pool.set_rebuild_rate_mb_s(2).await.unwrap();
    // the power goes: nothing more is written, volatile caches are lost
    budget.store(0, Ordering::SeqCst);
    drop(pool);
    for s in &sims {
        s.crash();
    }
    // back with the old copy (made unreadable after the assemble) and the new
    // member: whatever the new member serves must be the data
    let old = Arc::new(block::FaultVolume::new(sims[0].clone() as VolumeRef));
    let pool = Pool::assemble(
        vec![
            Member::new("m0", old.clone() as VolumeRef),
            Member::new("m2", sims[2].clone() as VolumeRef),
        ],
        false,
    )
    .await
    .expect("assemble");
    pool.set_rebuild_rate_mb_s(1).await.unwrap();
    old.plan().lock().dead = true;
    let (mut wrong, mut served) = (0u64, 0u64);
    for lba in (0..total).step_by(128) {
        if let Ok(got) = pool.read(lba, 1).await {
            served += 1;
            if got != pattern(lba, 1) {
                wrong += 1;
            }
        }
    }
    assert_eq!(wrong, 0, "blocks served wrong ({served} served)");
}

/// A RAID 5 of 4 (`cfg`) over members with volatile caches behind fault
/// layers: the caches, the fault layers, the pool with stripe 0 written,
/// flushed and in place, and its oracle.
async fn raid5_on_crash_sims(
    cfg: raid::PoolConfig,
    cut: Option<&Arc<AtomicI64>>,
) -> (
    Vec<Arc<CrashSimVolume>>,
    Vec<Arc<block::FaultVolume>>,
    Pool,
    MemVolume,
) {
    let sims = crash_sims(4);
    let faults: Vec<Arc<block::FaultVolume>> = sims
        .iter()
        .map(|s| Arc::new(block::FaultVolume::new(s.clone() as VolumeRef)))
        .collect();
    let members: Vec<Member> = faults
        .iter()
        .enumerate()
        .map(|(i, f)| {
            let v: VolumeRef = match cut {
                Some(budget) => Arc::new(Cut {
                    inner: f.clone() as VolumeRef,
                    budget: budget.clone(),
                }),
                None => f.clone(),
            };
            Member::new(format!("m{i}"), v)
        })
        .collect();
    let pool = Pool::create(cfg, members, vec![]).await.unwrap();
    pool.wait_idle().await;
    let oracle = MemVolume::new(BS, pool.geometry().block_count);
    let stripe = pool.geometry().optimal_io_blocks as u64;
    let d = pattern(1, stripe);
    pool.write(0, d.clone(), false).await.unwrap();
    oracle.write(0, d, false).await.unwrap();
    pool.flush().await.unwrap();
    pool.wait_applied().await;
    (sims, faults, pool, oracle)
}

/// Block row 5 of stripe 0 unreadable on members `bad` (disks that remap a
/// sector they are written).
fn unreadable_row_5(pool: &Pool, faults: &[Arc<block::FaultVolume>], bad: &[usize]) {
    let off = pool.data_offset_bytes() / BS as u64;
    for &m in bad {
        let plan = faults[m].plan();
        let mut plan = plan.lock();
        plan.remap_on_write = true;
        plan.bad_read_blocks.push(off + 5..off + 6);
    }
}

/// A write that a degraded RAID 5 could do only by giving up a row
/// (`lost.rs`: its member 0 cannot read a sector the row needs, member 1 is
/// gone) rests on the stand-in written over that sector: the written block
/// lives only in the parity, computed with it. Power cut right after the
/// write is acknowledged, the block must still read back. With the stand-in
/// written without FUA (until review found it), the cut lost it, the
/// remapped sector read its old bytes, and the block came back wrong.
#[tokio::test]
async fn a_write_that_gave_up_a_row_survives_a_power_cut() {
    let (sims, faults, pool, oracle) = raid5_on_crash_sims(config(RaidLevel::Raid5), None).await;
    faults[1].plan().lock().dead = true;
    pool.fail_member(1).await.unwrap();
    unreadable_row_5(&pool, &faults, &[0]);
    let cb = (CHUNK / BS) as u64;
    let l = pool.layout();
    let chunk = (0..l.data_chunks())
        .find(|&c| l.data_positions(0, c)[0] == 1)
        .expect("a data chunk of stripe 0 on member 1");
    let target = chunk as u64 * cb + 5;
    let data = pattern(99, 1);
    pool.write(target, data.clone(), false).await.unwrap();
    oracle.write(target, data, false).await.unwrap();
    drop(pool);
    for s in &sims {
        s.crash();
    }
    let members: Vec<Member> = [0usize, 2, 3]
        .iter()
        .map(|&i| Member::new(format!("m{i}"), sims[i].clone() as VolumeRef))
        .collect();
    let pool = Pool::assemble(members, false).await.expect("assemble");
    assert!(
        pool.read(target, 1).await.unwrap() == oracle.read(target, 1).await.unwrap(),
        "the acknowledged write came back wrong after the power cut"
    );
}

/// The same give-up for an update acknowledged early (data first) whose
/// completion meets two unreadable sectors in its row (`complete_given_up`:
/// no completing record), with an older update of that row in the journal
/// and a later update of the stripe after it, then a power cut: the
/// acknowledged block and the row's parity must be right (one more member
/// failed, the rest reads right). Without the checkpoint the give-up ends
/// with, assemble replayed the older record over the row and left the
/// data-first record out (a later record of its stripe): block 37 read wrong
/// (found by review).
#[tokio::test]
async fn an_update_given_up_around_survives_a_power_cut_and_the_replay() {
    // without the write intent, whose resync after the crash would
    // recompute the row's parity anyway: the journal alone must do
    let mut cfg = config(RaidLevel::Raid5);
    cfg.unsafe_disable_write_intent = true;
    let (sims, faults, pool, oracle) = raid5_on_crash_sims(cfg, None).await;
    let stripe = pool.geometry().optimal_io_blocks as u64;
    let cb = (CHUNK / BS) as u64;
    let l = pool.layout();
    let pos = |c: usize| l.data_positions(0, c)[0];
    // an older update of row 5 (chunk 2), still in the journal
    let ahead = pool.status().write_path.journal_checkpoints_ahead;
    let older = pattern(7, 1);
    pool.write(2 * cb + 5, older.clone(), false).await.unwrap();
    oracle.write(2 * cb + 5, older, false).await.unwrap();
    pool.wait_applied().await;
    // chunks 0 and 1 cannot be read at row 5; the disks remap
    unreadable_row_5(&pool, &faults, &[pos(0), pos(1)]);
    let data = pattern(99, 1);
    pool.write(5, data.clone(), false).await.unwrap();
    oracle.write(5, data, false).await.unwrap();
    pool.wait_applied().await;
    // a later update of the stripe (row 10), which leaves the given-up
    // update's data-first record out of assemble's completion
    let later = pattern(8, 1);
    pool.write(2 * cb + 10, later.clone(), false).await.unwrap();
    oracle.write(2 * cb + 10, later, false).await.unwrap();
    pool.wait_applied().await;
    let wp = pool.status().write_path;
    assert_eq!(wp.journal_checkpoints_ahead, ahead, "{wp:?}");
    let witness = pos(2);
    let vols = sims.iter().map(|s| s.clone() as VolumeRef).collect();
    let pool = cut_and_assemble(pool, &sims, vols).await;
    pool.wait_idle().await;
    assert_eq!(pool.status().lost_blocks, 1, "{:?}", pool.status());
    let lost = cb + 5;
    reads_but_lost(&pool, &oracle, stripe, lost, None).await;
    pool.fail_member(witness).await.unwrap();
    reads_but_lost(&pool, &oracle, stripe, lost, None).await;
}

/// The update given up around (`complete_given_up`) with the power cut
/// after every number of member writes it makes: its data-first record, the
/// superblocks that record the lost block, the stand-in, the update and the
/// parity, the checkpoint. Assemble must complete whatever record it finds
/// open, although the row still cannot be read: it gives the row up again
/// around the update. Every block of the stripe must read as written (the
/// update's block as old or new data if it was not acknowledged), or, for
/// the row's two unreadable blocks, fail; and so again with one more member
/// failed, through the row's parity. Without the give-up in assemble, a cut
/// after the data-first record and before the checkpoint left a pool that
/// could not be assembled.
#[tokio::test]
async fn an_update_given_up_around_survives_a_power_cut_at_every_step() {
    let cb = (CHUNK / BS) as u64;
    let mut cuts = 0;
    let mut n = 1i64;
    loop {
        let budget = Arc::new(AtomicI64::new(-1));
        let (sims, faults, pool, oracle) =
            raid5_on_crash_sims(config(RaidLevel::Raid5), Some(&budget)).await;
        let stripe = pool.geometry().optimal_io_blocks as u64;
        let l = pool.layout();
        let pos = |c: usize| l.data_positions(0, c)[0];
        unreadable_row_5(&pool, &faults, &[pos(0), pos(1)]);
        let witness = pos(2);
        let data = pattern(99, 1);
        budget.store(n, Ordering::SeqCst);
        let acked = pool.write(5, data.clone(), false).await.is_ok();
        if acked {
            oracle.write(5, data.clone(), false).await.unwrap();
        }
        pool.wait_applied().await;
        // the give-up's checkpoint comes after the update is applied, under
        // the stripe's lock: a write of the stripe (the data it holds, so
        // whether it lands does not matter) waits for that lock, and so for
        // the checkpoint's writes, which the cut must be able to reach too
        let same = oracle.read(2 * cb + 10, 1).await.unwrap();
        let _ = pool.write(2 * cb + 10, same, false).await;
        pool.wait_applied().await;
        let left = budget.load(Ordering::SeqCst);
        // the same disks (their unreadable sectors stay until written); a
        // cut whose assemble fails panics in `cut_and_assemble`, named by
        // the cut below
        eprintln!("cut after {n} writes (acknowledged: {acked})");
        let vols = faults.iter().map(|f| f.clone() as VolumeRef).collect();
        let pool = cut_and_assemble(pool, &sims, vols).await;
        pool.wait_idle().await;
        let torn = (!acked).then_some((5, &data));
        reads_but_lost(&pool, &oracle, stripe, cb + 5, torn).await;
        // and through the row's parity
        pool.fail_member(witness).await.unwrap();
        reads_but_lost(&pool, &oracle, stripe, cb + 5, torn).await;
        cuts += 1;
        if left > 0 {
            // the whole sequence ran before the cut
            break;
        }
        n += 1;
    }
    assert!(cuts > 5, "only {cuts} cut points");
}

/// Blocks `0..n` read as `oracle` holds them, but `lost`, which fails; and
/// block `torn.0`, written with `torn.1` but not acknowledged, may also read
/// as that or fail.
async fn reads_but_lost(
    pool: &Pool,
    oracle: &MemVolume,
    n: u64,
    lost: u64,
    torn: Option<(u64, &Bytes)>,
) {
    for lba in 0..n {
        let unacked = torn.filter(|t| t.0 == lba).map(|t| t.1);
        match pool.read(lba, 1).await {
            Ok(b) => assert!(
                b == oracle.read(lba, 1).await.unwrap() || unacked == Some(&b),
                "block {lba} wrong after the power cut"
            ),
            Err(e) => assert!(lba == lost || unacked.is_some(), "block {lba}: {e:?}"),
        }
    }
}

/// The power cut (volatile caches of `sims` lost, `pool` gone), then the pool
/// assembled again over `volumes`.
async fn cut_and_assemble(
    pool: Pool,
    sims: &[Arc<CrashSimVolume>],
    volumes: Vec<VolumeRef>,
) -> Pool {
    drop(pool);
    for s in sims {
        s.crash();
    }
    let members: Vec<Member> = volumes
        .into_iter()
        .enumerate()
        .map(|(i, v)| Member::new(format!("m{i}"), v))
        .collect();
    Pool::assemble(members, false).await.expect("assemble")
}

/// Power is cut while a member failure's new generation is written to the
/// members: one of them gets it (every cut point: after 1 and 2 of the 3
/// superblock writes). The pool assembles, degraded as the newest superblock
/// says, with every acknowledged block, with and without `force`. (Before, a
/// member one generation behind refused the assembly, and `force` rebuilt
/// both such members from the start: the pool failed for good.)
#[tokio::test]
async fn a_stop_between_the_superblock_writes_of_a_new_generation_loses_nothing() {
    for (landed, force) in [(1, false), (2, false), (1, true)] {
        let (sims, budget, pool) = cut_raid5(4).await;
        stopped_while_member_3_fails(sims, budget, pool, landed, force, 3).await;
    }
}

/// As above, with a hot spare that takes the failed member's place: the
/// failure and the spare's arrival make two generations in one superblock
/// write, and the members it missed are two behind. They are current all
/// the same, the spare too.
#[tokio::test]
async fn a_stop_while_a_spare_takes_a_failed_members_place_loses_nothing() {
    let sims = crash_sims(5);
    let budget = Arc::new(AtomicI64::new(-1));
    let mut members = cut_members(&sims, &budget);
    let spare = members.pop().unwrap();
    let pool = Pool::create(config(RaidLevel::Raid5), members, vec![spare])
        .await
        .unwrap();
    pool.wait_idle().await;
    stopped_while_member_3_fails(sims, budget, pool, 1, false, 4).await;
}

/// `pool` filled (pattern `seed`) and flushed; member 3 failed with only
/// `landed` member writes left before the power goes; the members crash and
/// are assembled (with `force` or not): the pool serves, and every block
/// reads back.
async fn stopped_while_member_3_fails(
    sims: Vec<Arc<CrashSimVolume>>,
    budget: Arc<AtomicI64>,
    pool: Pool,
    landed: i64,
    force: bool,
    seed: u64,
) {
    let oracle = MemVolume::new(BS, pool.geometry().block_count);
    fill(&pool, &oracle, seed).await;
    pool.flush().await.unwrap();
    pool.wait_applied().await;
    budget.store(landed, Ordering::SeqCst);
    let _ = pool.fail_member(3).await;
    drop(pool);
    for s in &sims {
        s.crash();
    }
    let members = sims
        .iter()
        .enumerate()
        .map(|(i, s)| Member::new(format!("m{i}"), s.clone() as VolumeRef))
        .collect();
    let pool = Pool::assemble(members, force)
        .await
        .unwrap_or_else(|e| panic!("{landed} landed, force {force}: {e}"));
    let st = pool.status();
    assert_ne!(
        st.state,
        raid::PoolState::Failed,
        "{landed}, {force}: {st:?}"
    );
    check_all(&pool, &oracle).await;
}

/// A partial update of a stripe just written whole without FUA: the whole
/// write may be lost with the members' caches at a power cut (it was not
/// FUA, and no flush came), but the partial update, acknowledged after its
/// journal record, must survive the cut and a member loss. Its records
/// carry parity computed from the whole write's chunks; once the update was
/// written in place (its completing record written), their replay put that
/// parity beside the older chunks on disk, and the update's own data
/// rebuilt from it was wrong when its member was the one missing (review of
/// 2026-12-06; RAID 5 with the fourth member missing failed without the
/// flush). Every member is tried as the missing one.
#[tokio::test]
async fn a_partial_update_after_an_unflushed_whole_stripe_write_survives_a_cut_and_a_loss() {
    // (a parity pool acknowledges a write once its journal record is
    // durable, FUA or not)
    for ((level, n), fua) in [(RaidLevel::Raid5, 4), (RaidLevel::Raid6, 5)]
        .into_iter()
        .flat_map(|l| [(l, false), (l, true)])
    {
        for missing in 0..n {
            let sims = crash_sims(n);
            let budget = Arc::new(AtomicI64::new(-1));
            let pool = Pool::create(config(level), cut_members(&sims, &budget), vec![])
                .await
                .unwrap();
            pool.wait_idle().await;
            let stripe = pool.geometry().optimal_io_blocks as u64;
            // stripe 1 written whole, not FUA, never flushed
            pool.write(stripe, pattern(1, stripe), false).await.unwrap();
            assert_eq!(pool.status().stripe_writes.full, 1, "not written whole");
            // then one block of it, written in place; the power is cut then
            // (nothing the pool writes after lands)
            let p = pattern(2, 1);
            pool.write(stripe + 1, p.clone(), fua).await.unwrap();
            pool.wait_applied().await;
            budget.store(0, Ordering::SeqCst);
            drop(pool);
            let pool = crashed_without(&sims, missing).await;
            assert_eq!(
                pool.read(stripe + 1, 1).await.unwrap(),
                p,
                "{level:?}, member {missing} missing, FUA {fua}: the write was lost"
            );
        }
    }
}
