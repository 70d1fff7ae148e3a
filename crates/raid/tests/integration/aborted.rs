//! A write whose caller goes away (an aborted SCSI command, a cache or replica
//! layer that gives up) still ends on every member. Member writes are polled
//! by the pool write itself, so a dropped pool write would drop those still
//! under way: a mirror half left without the write answers reads with the old
//! data while the other half answers with the new; a parity stripe left with
//! its new parity and old data reconstructs its other chunks wrongly once a
//! member is lost.
//!
//! Each test first waits for the new pool's initial sync, which would
//! otherwise copy the first half over the second and hide the loss.

use crate::common::*;
use block::{Bytes, HoldVolume, MemVolume, Volume, VolumeRef};
use raid::{Member, Pool, RaidLevel};
use std::sync::Arc;
use std::time::Duration;

/// A new pool of `level` over `members`, its initial sync done.
async fn synced_pool(level: RaidLevel, members: &[Arc<HoldVolume>]) -> Arc<Pool> {
    let pool = Pool::create(
        config(level),
        members
            .iter()
            .enumerate()
            .map(|(i, h)| Member::new(format!("m{i}"), h.clone() as VolumeRef))
            .collect(),
        vec![],
    )
    .await
    .expect("create");
    pool.wait_idle().await;
    Arc::new(pool)
}

/// `n` blank member disks.
fn mems(n: usize) -> Vec<Arc<MemVolume>> {
    (0..n)
        .map(|_| Arc::new(MemVolume::new(BS, MEMBER_BLOCKS)))
        .collect()
}

/// The pool reads `data` at `lba`, its redundancy matches its data
/// everywhere, and it stops.
async fn consistent_and_stopped(pool: &Pool, lba: u64, data: &Bytes) {
    assert_eq!(&pool.read(lba, 8).await.unwrap(), data);
    pool.wait_applied().await;
    let report = pool.scrub().await.unwrap().unwrap();
    assert_eq!(
        report.mismatches, 0,
        "redundancy does not match the data: {report:?}"
    );
    pool.shutdown().await.unwrap();
}

/// A pool whose members are held behind gates the test opens.
async fn held_pool(
    level: RaidLevel,
    n: usize,
) -> (Arc<Pool>, Vec<Arc<MemVolume>>, Vec<Arc<HoldVolume>>) {
    let mems: Vec<Arc<MemVolume>> = mems(n);
    let holds: Vec<Arc<HoldVolume>> = mems
        .iter()
        .map(|m| Arc::new(HoldVolume::new(m.clone() as VolumeRef)))
        .collect();
    (synced_pool(level, &holds).await, mems, holds)
}

/// `n` blank disks, each behind a fault injector and then a gate that, like
/// a disk's queue, finishes a request once issued.
struct Faulty {
    mems: Vec<Arc<MemVolume>>,
    faults: Vec<Arc<block::FaultVolume>>,
    holds: Vec<Arc<HoldVolume>>,
}

fn faulty(n: usize) -> Faulty {
    let mems: Vec<Arc<MemVolume>> = mems(n);
    let faults: Vec<Arc<block::FaultVolume>> = mems
        .iter()
        .map(|m| Arc::new(block::FaultVolume::new(m.clone() as VolumeRef)))
        .collect();
    let holds: Vec<Arc<HoldVolume>> = faults
        .iter()
        .map(|f| Arc::new(HoldVolume::queued(f.clone() as VolumeRef)))
        .collect();
    Faulty {
        mems,
        faults,
        holds,
    }
}

/// Whether member `m` holds `data` at member block `at`.
async fn holds_at(m: &MemVolume, at: u64, data: &[u8]) -> bool {
    m.read(at, (data.len() / BS as usize) as u32).await.unwrap() == data
}

/// Polls (bounded: 5 s) until member `m` holds `data` at `at`.
async fn lands(m: &MemVolume, at: u64, data: &[u8]) -> bool {
    for _ in 0..500 {
        if holds_at(m, at, data).await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mirror_write_whose_caller_is_aborted_reaches_both_halves() {
    let (pool, mems, holds) = held_pool(RaidLevel::Raid1, 2).await;
    let data = pattern(41, 8);
    // where the data lands on each half (a mirror: the same member block);
    // the second half holds exactly that write
    let at = pool.data_offset_bytes() / BS as u64 + 100;
    holds[1].writes.hold_range(at, at + 8);
    let w = {
        let (pool, data) = (pool.clone(), data.clone());
        tokio::spawn(async move { pool.write(100, data, false).await })
    };
    holds[1].writes.arrivals(1).await;
    assert!(
        lands(&mems[0], at, &data).await,
        "the first half never got the write"
    );
    assert!(
        !holds_at(&mems[1], at, &data).await,
        "the second half had the write before the abort"
    );
    w.abort();
    assert!(w.await.unwrap_err().is_cancelled());
    holds[1].writes.open();
    assert!(
        lands(&mems[1], at, &data).await,
        "the mirror halves differ at member block {at}: the aborted write reached one only"
    );
    // and the pool reads the same from either half
    assert_eq!(pool.read(100, 8).await.unwrap(), data);
    pool.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parity_update_whose_caller_is_aborted_leaves_the_stripe_consistent() {
    let (pool, mems, holds) = held_pool(RaidLevel::Raid5, 3).await;
    // the update is applied in place before its acknowledgement (as when a
    // copy of its record could not be written): the caller waits through
    // the in-place writes, and is aborted while one of them is held
    pool.set_early_ack(false);
    let data = pattern(43, 8);
    let pos = pool.layout().data_positions(0, 0)[0];
    let at = pool.data_offset_bytes() / BS as u64;
    holds[pos].writes.hold_range(at, at + 8);
    let w = {
        let (pool, data) = (pool.clone(), data.clone());
        tokio::spawn(async move { pool.write(0, data, false).await })
    };
    holds[pos].writes.arrivals(1).await;
    w.abort();
    assert!(w.await.unwrap_err().is_cancelled());
    assert!(
        !holds_at(&mems[pos], at, &data).await,
        "the data was in place before the abort"
    );
    holds[pos].writes.open();
    assert!(
        lands(&mems[pos], at, &data).await,
        "the aborted update's data never reached its member"
    );
    consistent_and_stopped(&pool, 0, &data).await;
}

/// A read that meets a medium error rewrites the block from redundancy under
/// the stripe's lock. Dropped while the member still has that repair write
/// (its caller aborted), the read keeps the lock until the write has ended:
/// a write of the stripe that went ahead could land first, and the repair's
/// older data over it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_whose_caller_is_aborted_keeps_its_stripe_until_its_repair_ends() {
    let Faulty {
        mems: _,
        faults,
        holds,
    } = faulty(3);
    let pool = synced_pool(RaidLevel::Raid5, &holds).await;
    let data = pattern(47, 8);
    pool.write(0, data.clone(), false).await.unwrap();
    pool.wait_applied().await;
    // the first chunk's member now has a bad sector there; its repair is held
    let pos = pool.layout().data_positions(0, 0)[0];
    let at = pool.data_offset_bytes() / BS as u64;
    let bad = at..at + 8;
    faults[pos].plan().lock().bad_read_blocks = Vec::from([bad]);
    holds[pos].writes.hold_range(at, at + 8);
    let read = {
        let pool = pool.clone();
        tokio::spawn(async move { pool.read(0, 8).await })
    };
    holds[pos].writes.arrivals(1).await;
    read.abort();
    assert!(read.await.unwrap_err().is_cancelled());
    // a write to the same stripe (its second chunk)
    let mut write = {
        let pool = pool.clone();
        tokio::spawn(async move {
            pool.write(CHUNK as u64 / BS as u64, pattern(48, 8), false)
                .await
        })
    };
    // it must wait for the repair; given a second, one that does not has
    // taken the stripe by then
    let early = tokio::time::timeout(Duration::from_secs(1), &mut write).await;
    holds[pos].writes.open();
    assert!(
        early.is_err(),
        "a write took the stripe while the aborted read's repair was under way"
    );
    write.await.unwrap().unwrap();
    consistent_and_stopped(&pool, 0, &data).await;
}

/// Regions still waiting for their post-crash resync are not forgotten by an
/// orderly stop: a clean shutdown before the resync had finished marked the
/// pool clean, and the next assemble resynced nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clean_stop_keeps_the_regions_still_to_resync_after_a_crash() {
    let mems: Vec<Arc<MemVolume>> = mems(2);
    let members = |hold_data: Option<u64>| {
        let holds: Vec<Arc<HoldVolume>> = mems
            .iter()
            .map(|m| Arc::new(HoldVolume::new(m.clone() as VolumeRef)))
            .collect();
        if let Some(from) = hold_data {
            // the data area's reads (the resync's) wait; superblocks are read
            for h in &holds {
                h.reads.hold_range(from, u64::MAX);
            }
        }
        let ms: Vec<Member> = holds
            .iter()
            .enumerate()
            .map(|(i, h)| Member::new(format!("m{i}"), h.clone() as VolumeRef))
            .collect();
        (ms, holds)
    };
    let (ms, _h) = members(None);
    let pool = Pool::create(config(RaidLevel::Raid1), ms, vec![])
        .await
        .expect("create");
    pool.wait_idle().await;
    let from = pool.data_offset_bytes() / BS as u64;
    pool.write(100, pattern(49, 8), false).await.unwrap();
    // a crash: no orderly stop, the region written last is dirty on disk
    drop(pool);
    let (ms, _held) = members(Some(from));
    let pool = Pool::assemble(ms, false).await.expect("assemble");
    assert!(
        pool.status().unsynced_regions > 0,
        "the crash left no region to resync"
    );
    // stopped in order before that resync could run
    pool.shutdown().await.unwrap();
    drop(pool);
    let (ms, _held_again) = members(Some(from));
    let pool = Pool::assemble(ms, false).await.expect("assemble again");
    assert!(
        pool.status().unsynced_regions > 0,
        "the orderly stop forgot the regions still to resync"
    );
}

/// A member that fails a write is failed in memory at once, and its failure
/// is written to the other members' superblocks by the write that met it.
/// A later write skips the failed member and must not be acknowledged before
/// that record is on disk: acknowledged first, a crash brought the member
/// back as active (its superblock, and the survivors', still said so), with
/// the write missing on it, for reads and the resync after the crash to take
/// its stale blocks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_that_skips_a_failed_member_waits_until_its_failure_is_on_disk() {
    let Faulty {
        mems,
        faults,
        holds,
    } = faulty(2);
    let pool = synced_pool(RaidLevel::Raid1, &holds).await;
    let at = pool.data_offset_bytes() / BS as u64;
    // (the region's write intent set and on disk already: the write below
    // waits for no superblock write of its own)
    pool.write(64, pattern(49, 8), false).await.unwrap();
    // the second half's superblock writes wait; the first half dies
    holds[1].writes.hold_below(at);
    faults[0].plan().lock().dead = true;
    let first = {
        let pool = pool.clone();
        tokio::spawn(async move { pool.write(0, pattern(50, 8), false).await })
    };
    holds[1].writes.arrivals(1).await;
    // a write after the failure: it reaches the second half only
    let data = pattern(51, 8);
    let mut second = {
        let (pool, data) = (pool.clone(), data.clone());
        tokio::spawn(async move { pool.write(64, data, false).await })
    };
    assert!(
        lands(&mems[1], at + 64, &data).await,
        "the write never reached the surviving half"
    );
    // given a second after its data landed, one that does not wait for the
    // failure's record has been acknowledged by then
    let early = tokio::time::timeout(Duration::from_secs(1), &mut second).await;
    holds[1].writes.open();
    assert!(
        early.is_err(),
        "a write was acknowledged while the failure of the member it skipped was not on disk"
    );
    second.await.unwrap().unwrap();
    first.await.unwrap().unwrap();
    // what the disks say now: the first half failed, the write on the second
    pool.shutdown().await.unwrap();
    drop(pool);
    faults[0].plan().lock().dead = false;
    let members = mems
        .iter()
        .enumerate()
        .map(|(i, m)| Member::new(format!("m{i}"), m.clone() as VolumeRef))
        .collect();
    let again = Pool::assemble(members, false).await.unwrap();
    assert_eq!(again.read(64, 8).await.unwrap(), data);
    assert_eq!(
        again.status().members[0].state,
        raid::MemberState::Failed,
        "{:?}",
        again.status().members
    );
    again.shutdown().await.unwrap();
}

/// A rebuild at its very end: every stripe rebuilt, the rebuild's final flush
/// and superblock write still to come. The other copy fails now, and the pool
/// stands on the rebuilt member alone. The disks as they are when a write is
/// acknowledged then (a crash at that moment) must assemble, with the write:
/// the superblocks used to carry the rebuilt member's checkpoint of its last
/// periodic flush, so they said "the other copy failed, this one rebuilt
/// halfway", and the pool no longer assembled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_after_the_other_copy_fails_at_the_end_of_a_rebuild_survives_a_crash() {
    end_of_rebuild_write_survives_a_crash(RaidLevel::Raid1, 2).await;
}

/// As above on RAID 10 (near): its rebuild copies in batches, another way to
/// the end of the rebuild.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_raid10_write_after_the_mirror_fails_at_the_end_of_a_rebuild_survives_a_crash() {
    end_of_rebuild_write_survives_a_crash(RaidLevel::Raid10, 4).await;
}

/// A pool of `level` over `n` members whose member 1 is rebuilt onto a fresh
/// disk and whose member 0 (holding member 1's copy of block 64) fails as
/// the rebuild ends; a write to block 64 then; the disks as they are then
/// assemble with it.
async fn end_of_rebuild_write_survives_a_crash(level: RaidLevel, n: usize) {
    let Faulty {
        mems,
        faults,
        holds,
    } = faulty(n + 1);
    let pool = synced_pool(level, &holds[..n]).await;
    pool.write(64, pattern(52, 8), false).await.unwrap();
    // the second half is replaced; the new one's flushes wait
    pool.fail_member(1).await.unwrap();
    holds[n].flushes.hold();
    pool.replace_member(1, Member::new("new", holds[n].clone() as VolumeRef))
        .await
        .unwrap();
    // (flushes of the rebuild's own before its last stripe are let through)
    let full = pool.status().members[0].rebuilt_bytes;
    let mut seen = 1;
    loop {
        holds[n].flushes.arrivals(seen).await;
        if pool.status().members[1].rebuilt_bytes >= full {
            break;
        }
        holds[n].flushes.release(1);
        seen += 1;
    }
    // every stripe rebuilt, the final flush waiting; the first half dies and
    // a write comes
    faults[0].plan().lock().dead = true;
    let data = pattern(53, 8);
    pool.write(64, data.clone(), false).await.unwrap();
    // the disks as a crash now would leave them
    let image: Vec<VolumeRef> = {
        let mut v = Vec::new();
        // (member 1's place now taken by the new disk)
        for i in std::iter::once(0).chain(std::iter::once(n)).chain(2..n) {
            let copy = MemVolume::new(BS, MEMBER_BLOCKS);
            copy.write(
                0,
                mems[i].read(0, MEMBER_BLOCKS as u32).await.unwrap(),
                false,
            )
            .await
            .unwrap();
            v.push(Arc::new(copy) as VolumeRef);
        }
        v
    };
    holds[n].flushes.open();
    pool.shutdown().await.unwrap();
    drop(pool);
    let members = image
        .into_iter()
        .enumerate()
        .map(|(i, m)| Member::new(format!("m{i}"), m))
        .collect();
    let again = Pool::assemble(members, false)
        .await
        .expect("the disks as the acknowledgement left them assemble");
    let read = again.read(64, 8).await;
    assert_eq!(
        read.expect("the pool the crash left serves the acknowledged write"),
        data
    );
    again.shutdown().await.unwrap();
}
