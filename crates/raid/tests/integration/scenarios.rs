//! Assembly, failure, repair, spare, scrub, F1 skew and rebuild-rate scenarios.

use crate::common;

use block::{BlockError, DelayVolume, MemVolume, Volume, VolumeRef};
use common::*;
use raid::{Member, MemberState, Pool, PoolState, RaidError, RaidLevel};
use std::sync::Arc;
use std::time::Duration;

#[tokio::test]
async fn assemble_shuffled_and_degraded() {
    let (pool, ms) = make_pool(RaidLevel::Raid5, 4).await;
    let oracle = MemVolume::new(BS, pool.geometry().block_count);
    fill(&pool, &oracle, 1).await;
    pool.shutdown().await.unwrap();
    drop(pool);
    let mut order = members_of(&ms);
    order.reverse();
    order.swap(0, 2);
    let pool = Pool::assemble(order, false).await.unwrap();
    check_all(&pool, &oracle).await;
    assert_ne!(pool.status().state, PoolState::Failed);
    pool.shutdown().await.unwrap();
    drop(pool);
    // one member missing: degraded, data intact
    let mut some = members_of(&ms);
    some.remove(1);
    let pool = Pool::assemble(some, false).await.unwrap();
    let st = pool.status();
    assert_eq!(st.state, PoolState::Degraded);
    assert_eq!(st.members[1].state, MemberState::Failed);
    assert_eq!(st.members[1].name, "missing");
    check_all(&pool, &oracle).await;
    drop(pool);
    // two missing: beyond tolerance -> failed, I/O errors
    let mut few = members_of(&ms);
    few.drain(0..2); // m1 is stale now (it missed the degraded generation)
    let pool = Pool::assemble(few, false).await.unwrap();
    assert_eq!(pool.status().state, PoolState::Failed);
    assert!(matches!(
        pool.read(0, 1).await,
        Err(BlockError::Unavailable(_))
    ));
}

#[tokio::test]
async fn foreign_members_refused_and_a_failed_stale_member_left_out() {
    let (a, ams) = make_pool(RaidLevel::Raid1, 3).await;
    let (b, bms) = make_pool(RaidLevel::Raid1, 3).await;
    drop(b);
    let mut mixed = members_of(&ams);
    mixed.push(bms[0].as_member("b0"));
    drop(a);
    assert!(matches!(
        Pool::assemble(mixed, false).await,
        Err(RaidError::ForeignMember { .. })
    ));
    // stale generation: member 2 failed while the others went on
    let pool = Pool::assemble(members_of(&ams), false).await.unwrap();
    let oracle = MemVolume::new(BS, pool.geometry().block_count);
    pool.fail_member(2).await.unwrap();
    fill(&pool, &oracle, 7).await;
    pool.shutdown().await.unwrap();
    drop(pool);
    // without force the failed member stays out: the pool comes up degraded
    // on the others, as it ran, and the stale copy is never read
    let pool = Pool::assemble(members_of(&ams), false).await.unwrap();
    let st = pool.status();
    assert_eq!(st.state, PoolState::Degraded);
    assert_eq!(st.members[2].state, MemberState::Failed);
    assert_eq!(st.members[2].name, "missing");
    check_all(&pool, &oracle).await;
    pool.shutdown().await.unwrap();
    drop(pool);
    // force: newest set wins, the stale member is rebuilt
    let pool = Pool::assemble(members_of(&ams), true).await.unwrap();
    assert_eq!(pool.status().members[2].state, MemberState::Rebuilding);
    pool.wait_idle().await;
    assert_eq!(pool.status().state, PoolState::Optimal);
    // the rebuilt member alone must hold the data
    ams[0].plan.lock().dead = true;
    ams[1].plan.lock().dead = true;
    check_all(&pool, &oracle).await;
}

#[tokio::test]
async fn corrupt_superblock_is_an_error() {
    let (pool, ms) = make_pool(RaidLevel::Raid5, 3).await;
    drop(pool);
    let garbage = pattern(5, 256);
    ms[0].mem.write(0, garbage.clone(), false).await.unwrap();
    ms[0].mem.write(128, garbage, false).await.unwrap();
    assert!(matches!(
        Pool::assemble(members_of(&ms), false).await,
        Err(RaidError::BadSuperblock { .. })
    ));
}

async fn medium_error_case(level: RaidLevel, n: usize) {
    let (pool, ms) = make_pool(level, n).await;
    pool.wait_idle().await;
    let oracle = MemVolume::new(BS, pool.geometry().block_count);
    fill(&pool, &oracle, 3).await;
    // pool lba 5 lives on data chunk 0 of stripe 0, member-area block 5
    let pos = pool.layout().data_positions(0, 0)[0];
    let abs = pool.data_offset_bytes() / BS as u64 + 5;
    ms[pos].mem.write(abs, pattern(99, 1), false).await.unwrap(); // garbage under the bad sector
    ms[pos].plan.lock().bad_read_blocks.push(abs..abs + 1);
    let got = pool
        .read(0, 16)
        .await
        .expect("read must be served from redundancy");
    assert_eq!(got, oracle.read(0, 16).await.unwrap());
    ms[pos].plan.lock().bad_read_blocks.clear();
    assert_eq!(
        ms[pos].mem.read(abs, 1).await.unwrap(),
        oracle.read(5, 1).await.unwrap(),
        "{level:?}: bad sector not rewritten"
    );
    let st = pool.status();
    assert_eq!(
        st.members[pos].state,
        MemberState::Active,
        "medium error must not fail the member"
    );
    assert!(st.members[pos].errors >= 1);
}

#[tokio::test]
async fn medium_error_repaired_and_rewritten() {
    medium_error_case(RaidLevel::Raid5, 4).await;
    medium_error_case(RaidLevel::Raid6, 5).await;
    medium_error_case(RaidLevel::Raid1, 2).await;
    medium_error_case(RaidLevel::Raid10, 4).await;
    medium_error_case(RaidLevel::Raid10Far, 3).await;
}

/// A degraded parity pool that meets an unreadable sector where it has no
/// redundancy left answers the blocks it cannot compute with a medium error
/// at the first block asked for, as a disk does for its own bad sector; the
/// pool keeps serving every other block. It answered "unavailable" (SCSI: NOT
/// READY), which a multipath initiator retries on every path for ever, and
/// the pool looked as if it had failed.
#[tokio::test]
async fn a_degraded_read_that_meets_an_unreadable_sector_is_a_medium_error() {
    for (level, n, gone) in [
        (RaidLevel::Raid5, 4, vec![1]),
        (RaidLevel::Raid6, 5, vec![1, 2]),
    ] {
        let (pool, ms) = make_pool(level, n).await;
        pool.wait_idle().await;
        let oracle = MemVolume::new(BS, pool.geometry().block_count);
        fill(&pool, &oracle, 4).await;
        for &p in &gone {
            ms[p].plan.lock().dead = true;
            pool.fail_member(p).await.unwrap();
        }
        // member 0's block at row 5 of stripe 0 cannot be read
        let abs = pool.data_offset_bytes() / BS as u64 + 5;
        ms[0].plan.lock().bad_read_blocks.push(abs..abs + 1);
        let cb = (CHUNK / BS) as u64;
        let l = pool.layout();
        for d in 0..l.data_chunks() {
            let pos = l.data_positions(0, d)[0];
            let lba = d as u64 * cb + 5;
            let r = pool.read(lba, 1).await;
            if pos == 0 || gone.contains(&pos) {
                assert!(
                    matches!(r, Err(BlockError::Medium { lba: at }) if at == lba),
                    "{level:?} block {lba} (position {pos}): {r:?}"
                );
                // a write there cannot read what its parity needs either, and
                // this disk does not remap what is written: after the row is
                // given up, its sector still cannot be read, so the write
                // fails with a medium error naming the written block
                let w = pool.write(lba, pattern(9, 1), false).await;
                if pos != 0 {
                    assert!(
                        matches!(w, Err(BlockError::Medium { lba: at }) if at == lba),
                        "{level:?} write of block {lba} (position {pos}): {w:?}"
                    );
                }
            } else {
                assert_eq!(r.unwrap(), oracle.read(lba, 1).await.unwrap());
            }
            // the rows around it read right
            let next = d as u64 * cb + 6;
            assert_eq!(
                pool.read(next, 1).await.unwrap(),
                oracle.read(next, 1).await.unwrap()
            );
        }
        assert_ne!(pool.status().state, PoolState::Failed);
    }
}

/// A write to a degraded parity pool whose read-modify-write meets an
/// unreadable sector where the row has no redundancy left gives up that row
/// as a rebuild would (every journal record checkpointed, the row's unknown
/// data blocks recorded lost, the unreadable sector written with a stand-in
/// that keeps the row's parity right), then is done: acknowledged, it reads
/// back, also after a restart. Only the row's other unknown blocks are lost
/// (a medium error at each); every other block reads right, also with one
/// more member gone where the level allows it (the row's parity agrees).
/// Before, every write to that row failed (a medium error naming the
/// written block) until a rebuild salvaged it, which a degraded pool without
/// a spare never started.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_degraded_write_that_meets_an_unreadable_sector_gives_up_only_that_row() {
    for (level, n, gone) in [
        (RaidLevel::Raid5, 4, vec![1]),
        (RaidLevel::Raid6, 5, vec![1, 2]),
        (RaidLevel::Raid6, 5, vec![1]),
    ] {
        let (pool, ms, oracle) = filled_pool(level, n, n + gone.len()).await;
        for &p in &gone {
            ms[p].plan.lock().dead = true;
            pool.fail_member(p).await.unwrap();
        }
        // member 0's block at row 5 of stripe 0 cannot be read (and, on
        // RAID 6 with one member gone, member 3's too); a disk remaps a
        // sector it is written
        let bad: Vec<usize> = if gone.len() < level_parity(level) {
            vec![0, 3]
        } else {
            vec![0]
        };
        unreadable_row_5(&pool, &ms, &bad);
        let cb = (CHUNK / BS) as u64;
        let l = pool.layout();
        let k = l.data_chunks();
        let unknown = |pos: usize| bad.contains(&pos) || gone.contains(&pos);
        // the row's data blocks on unknown positions: the first is written
        let at_unknown = row_5_blocks_on(&pool, &unknown);
        assert!(at_unknown.len() >= 2, "{level:?}");
        // a member holding a readable data block of the row
        let witness = (0..k)
            .map(|d| l.data_positions(0, d)[0])
            .find(|&pos| !unknown(pos));
        let target = *at_unknown
            .iter()
            .find(|&&b| b / cb != 0)
            .unwrap_or(&at_unknown[0]);
        let data = pattern(77, 1);
        pool.write(target, data.clone(), false)
            .await
            .unwrap_or_else(|e| panic!("{level:?}: the write of block {target}: {e:?}"));
        oracle.write(target, data.clone(), false).await.unwrap();
        let lost: Vec<u64> = at_unknown
            .iter()
            .copied()
            .filter(|&b| b != target)
            .collect();
        lost_listed_and_sectors_written(&pool, &ms, &bad, &lost, level);
        assert_eq!(pool.read(target, 1).await.unwrap(), data);
        check_all_but_lost(&pool, &oracle, &lost).await;
        // kept across a restart
        pool.shutdown().await.unwrap();
        drop(pool);
        let live: Vec<Member> = (0..n)
            .filter(|p| !gone.contains(p))
            .map(|p| ms[p].as_member(&format!("m{p}")))
            .collect();
        let pool = Pool::assemble(live, true).await.unwrap();
        assert_eq!(pool.status().lost_blocks, lost.len() as u64, "{level:?}");
        check_all_but_lost(&pool, &oracle, &lost).await;
        // the lost members replaced: the rebuild takes the row as it is
        for (i, &p) in gone.iter().enumerate() {
            let m = ms[n + i].as_member(&format!("r{i}"));
            pool.replace_member(p, m).await.unwrap();
        }
        wait_status(&pool, 120, |st| st.state == PoolState::Optimal).await;
        assert_eq!(pool.status().lost_blocks, lost.len() as u64, "{level:?}");
        check_all_but_lost(&pool, &oracle, &lost).await;
        // one more member gone: the rest still read right through the row's
        // parity, which the stand-ins kept right
        if let Some(w) = witness {
            pool.fail_member(w).await.unwrap();
            check_all_but_lost(&pool, &oracle, &lost).await;
        }
        assert_ne!(pool.status().state, PoolState::Failed);
    }
}

/// A scrub that meets unreadable sectors beyond the redundancy of a row
/// (two in one row of a RAID 5, three of a RAID 6, both copies of a mirror
/// block) gives the row up as a rebuild would: the row's unreadable data
/// blocks are recorded lost (a medium error each; the report counts them
/// read errors it could not repair), the sectors are written with stand-ins
/// that keep the row's parity right, and every other block reads right, also
/// with one more member gone, which reads through that parity. Two members
/// unreadable in different rows of one stripe are both repaired (each row
/// can be rebuilt). Before, the scrub skipped both stripes and left them as
/// they were: the next member loss would have lost the rows' other blocks
/// too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scrub_gives_up_only_the_rows_it_cannot_rebuild() {
    for (level, n, bad) in [
        (RaidLevel::Raid5, 4, vec![0, 1]),
        (RaidLevel::Raid6, 5, vec![0, 1, 2]),
        (RaidLevel::Raid1, 2, vec![0, 1]),
    ] {
        let (pool, ms, oracle) = filled_pool(level, n, n).await;
        let off = unreadable_row_5(&pool, &ms, &bad);
        let cb = (CHUNK / BS) as u64;
        let l = pool.layout();
        let k = l.data_chunks();
        let lost = row_5_blocks_on(&pool, &|p| bad.contains(&p));
        assert!(!lost.is_empty(), "{level:?}");
        let witness = (0..k)
            .map(|d| l.data_positions(0, d)[0])
            .find(|&pos| !bad.contains(&pos));
        // and two members unreadable in different rows of stripe 1: each
        // row can be rebuilt, though neither chunk can be whole
        let one = off + cb;
        ms[bad[0]]
            .plan
            .lock()
            .bad_read_blocks
            .push(one + 2..one + 3);
        ms[bad[1]]
            .plan
            .lock()
            .bad_read_blocks
            .push(one + 7..one + 8);
        let rep = pool.scrub().await.unwrap().unwrap();
        assert_eq!(rep.unrepairable, lost.len() as u64, "{level:?}: {rep:?}");
        assert_eq!(rep.read_errors, bad.len() as u64 + 2, "{level:?}: {rep:?}");
        assert_eq!(rep.repaired, 2, "{level:?}: {rep:?}");
        assert_eq!(rep.stripes_skipped, 0, "{level:?}: {rep:?}");
        for (i, &m) in bad.iter().enumerate() {
            let want = 1 + u64::from(i < 2);
            assert_eq!(rep.bad_blocks_by_position[m], want, "{level:?}: {rep:?}");
        }
        lost_listed_and_sectors_written(&pool, &ms, &bad, &lost, level);
        check_all_but_lost(&pool, &oracle, &lost).await;
        // a second scrub finds nothing more
        let rep = pool.scrub().await.unwrap().unwrap();
        assert_eq!(
            (rep.mismatches, rep.read_errors, rep.unrepairable),
            (0, 0, 0),
            "{level:?}: {rep:?}"
        );
        if let Some(w) = witness {
            pool.fail_member(w).await.unwrap();
            check_all_but_lost(&pool, &oracle, &lost).await;
        }
    }
}

/// An update acknowledged early (data first: its new data journaled, its
/// reads and parity done after the acknowledgement) whose completion meets
/// two unreadable sectors in its row on a healthy RAID 5: the written
/// block's own old data and another data block, so neither a
/// read-modify-write nor a reconstruct-write can read what it needs. The
/// row is given up around the update: the update lands and reads back, the
/// other unreadable block is recorded lost, the row's parity is right (a
/// member failed, the rest reads right). Before, the acknowledged update was
/// dropped ("could not be written in place: LOST") and its block read as a
/// medium error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acknowledged_update_whose_completion_meets_two_bad_sectors_lands() {
    let (pool, ms, oracle) = filled_pool(RaidLevel::Raid5, 4, 4).await;
    pool.wait_applied().await;
    let cb = (CHUNK / BS) as u64;
    let l = pool.layout();
    // chunks 0 and 1 of stripe 0 cannot be read at row 5
    let (p0, p1) = (l.data_positions(0, 0)[0], l.data_positions(0, 1)[0]);
    let witness = l.data_positions(0, 2)[0];
    unreadable_row_5(&pool, &ms, &[p0, p1]);
    let target = 5; // chunk 0, row 5
    let data = pattern(4242, 1);
    pool.write(target, data.clone(), false).await.unwrap();
    oracle.write(target, data.clone(), false).await.unwrap();
    pool.wait_applied().await;
    let lost = vec![cb + 5];
    lost_listed_and_sectors_written(&pool, &ms, &[p0, p1], &lost, RaidLevel::Raid5);
    assert_eq!(pool.read(target, 1).await.unwrap(), data);
    check_all_but_lost(&pool, &oracle, &lost).await;
    pool.fail_member(witness).await.unwrap();
    check_all_but_lost(&pool, &oracle, &lost).await;
}

/// Makes block row 5 of stripe 0 unreadable on members `bad` (disks that
/// remap a sector they are written); the members' data offset in blocks.
fn unreadable_row_5(pool: &Pool, ms: &[TestMember], bad: &[usize]) -> u64 {
    let off = pool.data_offset_bytes() / BS as u64;
    for &m in bad {
        let mut p = ms[m].plan.lock();
        p.remap_on_write = true;
        p.bad_read_blocks.push(off + 5..off + 6);
    }
    off
}

/// The pool blocks of row 5 of stripe 0 whose every copy lies on a position
/// `on` says yes to.
fn row_5_blocks_on(pool: &Pool, on: &dyn Fn(usize) -> bool) -> Vec<u64> {
    let cb = (CHUNK / BS) as u64;
    let l = pool.layout();
    (0..l.data_chunks())
        .filter(|&d| l.data_positions(0, d).iter().all(|&p| on(p)))
        .map(|d| d as u64 * cb + 5)
        .collect()
}

/// The pool's status lists exactly `lost`, and the unreadable sectors of
/// members `bad` were written (remapped).
fn lost_listed_and_sectors_written(
    pool: &Pool,
    ms: &[TestMember],
    bad: &[usize],
    lost: &[u64],
    level: RaidLevel,
) {
    let st = pool.status();
    let listed: Vec<u64> = st.lost_ranges.iter().flat_map(|&[a, c]| a..a + c).collect();
    assert_eq!(listed, lost, "{level:?}: {st:?}");
    for &m in bad {
        assert!(
            ms[m].plan.lock().bad_read_blocks.is_empty(),
            "{level:?}: member {m}'s unreadable sector was not written"
        );
    }
}

/// Parity members of a parity level.
fn level_parity(level: RaidLevel) -> usize {
    match level {
        RaidLevel::Raid6 => 2,
        _ => 1,
    }
}

#[tokio::test]
async fn dead_members_degrade_then_fail_never_wrong_data() {
    let (pool, ms) = make_pool(RaidLevel::Raid6, 5).await;
    let oracle = MemVolume::new(BS, pool.geometry().block_count);
    fill(&pool, &oracle, 11).await;
    ms[1].plan.lock().dead = true;
    // writes and reads go on without an error to the caller
    let d = pattern(12, 40);
    pool.write(100, d.clone(), false).await.unwrap();
    oracle.write(100, d, false).await.unwrap();
    check_all(&pool, &oracle).await;
    assert_eq!(pool.status().state, PoolState::Degraded);
    ms[3].plan.lock().dead = true;
    let d = pattern(13, 70);
    pool.write(300, d.clone(), true).await.unwrap();
    oracle.write(300, d, false).await.unwrap();
    check_all(&pool, &oracle).await;
    ms[4].plan.lock().dead = true;
    let total = pool.geometry().block_count;
    let mut errors = 0;
    for lba in (0..total).step_by(7) {
        match pool.read(lba, 1).await {
            Ok(b) => assert_eq!(b, oracle.read(lba, 1).await.unwrap(), "wrong data at {lba}"),
            Err(_) => errors += 1,
        }
    }
    assert!(errors > 0);
    assert!(pool.write(0, pattern(1, 1), false).await.is_err());
    assert_eq!(pool.status().state, PoolState::Failed);
}

/// A RAID 5 pool of `n` members and a hot spare named "spare", filled with
/// `seed`'s pattern (also in the returned oracle).
async fn raid5_with_spare(n: usize, seed: u64) -> (Pool, Vec<TestMember>, TestMember, MemVolume) {
    let ms: Vec<TestMember> = (0..n).map(|_| member(MEMBER_BLOCKS)).collect();
    let spare = member(MEMBER_BLOCKS);
    let pool = Pool::create(
        config(RaidLevel::Raid5),
        members_of(&ms),
        vec![spare.as_member("spare")],
    )
    .await
    .unwrap();
    let oracle = MemVolume::new(BS, pool.geometry().block_count);
    fill(&pool, &oracle, seed).await;
    (pool, ms, spare, oracle)
}

#[tokio::test]
async fn hot_spare_pulled_in_and_rebuilt() {
    let (pool, ms, _spare, oracle) = raid5_with_spare(4, 21).await;
    ms[2].plan.lock().dead = true;
    check_all(&pool, &oracle).await; // detects the dead member
    pool.wait_idle().await;
    let st = pool.status();
    assert_eq!(st.state, PoolState::Optimal, "{st:?}");
    assert_eq!(st.members[2].name, "spare");
    assert!(st.spares.is_empty());
    // the spare now carries its share: lose another member
    ms[0].plan.lock().dead = true;
    check_all(&pool, &oracle).await;
}

/// A member whose first failed write is a superblock write (a mirror's
/// write intent, written before the data: the first write a RAID 1 sends a
/// disk that stopped answering) is replaced by the hot spare, as one that
/// fails a data write is. Before, the superblock write failed it and left
/// the spare unused, the pool degraded (found by the node test that takes a
/// retired disk back).
#[tokio::test]
async fn a_member_failed_by_a_superblock_write_is_replaced_by_the_spare() {
    for level in [RaidLevel::Raid1, RaidLevel::Raid5, RaidLevel::Raid6] {
        let ms: Vec<TestMember> = (0..members_for(level))
            .map(|_| member(MEMBER_BLOCKS))
            .collect();
        let spare = member(MEMBER_BLOCKS);
        let pool = Pool::create(
            config(level),
            members_of(&ms),
            vec![spare.as_member("spare")],
        )
        .await
        .unwrap();
        pool.wait_idle().await;
        let oracle = MemVolume::new(BS, pool.geometry().block_count);
        // every write to member 1's superblock region fails; its data area
        // still takes writes
        let sb_blocks = (1 << 20) / BS as u64;
        ms[1].plan.lock().bad_write_blocks.push(0..sb_blocks);
        fill(&pool, &oracle, 41).await;
        pool.flush().await.unwrap(); // a checkpoint: superblocks written
        pool.wait_idle().await;
        let st = pool.status();
        assert_eq!(st.state, PoolState::Optimal, "{level:?}: {st:?}");
        assert_eq!(st.members[1].name, "spare", "{level:?}: {st:?}");
        assert!(st.spares.is_empty(), "{level:?}: {st:?}");
        check_all(&pool, &oracle).await;
    }
}

#[tokio::test]
async fn a_member_a_spare_replaced_is_left_out_when_assembled_again() {
    let (pool, ms, spare, oracle) = raid5_with_spare(3, 23).await;
    pool.fail_member(1).await.unwrap(); // the spare takes its place and is rebuilt
    pool.wait_idle().await;
    fill(&pool, &oracle, 24).await;
    pool.shutdown().await.unwrap();
    drop(pool);
    // the configuration still lists the old member and the spare: the pool comes
    // up on the spare, the replaced member stays out (it is stale)
    let mut all = members_of(&ms);
    all.push(spare.as_member("spare"));
    let pool = Pool::assemble(all, false).await.expect("assemble");
    let st = pool.status();
    assert_eq!(st.state, PoolState::Optimal, "{st:?}");
    assert_eq!(st.members[1].name, "spare");
    assert!(
        st.spares.is_empty(),
        "the replaced member is not a spare: {st:?}"
    );
    ms[0].plan.lock().dead = true; // and the spare holds its share
    check_all(&pool, &oracle).await;
}

#[tokio::test]
async fn scrub_raid6_locates_and_repairs() {
    let (pool, ms) = make_pool(RaidLevel::Raid6, 6).await;
    pool.wait_idle().await;
    let oracle = MemVolume::new(BS, pool.geometry().block_count);
    fill(&pool, &oracle, 31).await;
    pool.flush().await.unwrap();
    // and in place (a flush does not wait for that)
    pool.wait_applied().await;
    // silently corrupt one block of data chunk 2 of stripe 3
    let pos = pool.layout().data_positions(3, 2)[0];
    let abs = pool.data_offset_bytes() / BS as u64 + 3 * (CHUNK / BS) as u64 + 4;
    ms[pos].mem.write(abs, pattern(77, 1), false).await.unwrap();
    let rep = pool.scrub().await.unwrap().unwrap();
    assert_eq!(rep.mismatches, 1, "{rep:?}");
    assert_eq!(rep.repaired, 1);
    assert_eq!(rep.unrepairable, 0);
    assert_eq!(
        rep.bad_blocks_by_position[pos], 1,
        "scrub blamed the wrong member: {rep:?}"
    );
    assert_eq!(pool.status().last_scrub, Some(rep));
    // the repair holds even when the parity members are gone
    for p in pool.layout().parity_positions(3) {
        ms[p].plan.lock().dead = true;
    }
    check_all(&pool, &oracle).await;
    let rep2 = pool.scrub().await.unwrap().unwrap();
    assert_eq!(rep2.mismatches, 0);
}

#[tokio::test]
async fn scrub_raid5_and_mirror_fix_mismatch() {
    for (level, n) in [(RaidLevel::Raid5, 4), (RaidLevel::Raid1, 2)] {
        let (pool, ms) = make_pool(level, n).await;
        pool.wait_idle().await;
        let oracle = MemVolume::new(BS, pool.geometry().block_count);
        fill(&pool, &oracle, 41).await;
        // corrupt a redundancy block: parity (raid5) or the second copy (raid1)
        let pos = match level {
            RaidLevel::Raid5 => pool.layout().parity_positions(1)[0],
            _ => 1,
        };
        let abs = pool.data_offset_bytes() / BS as u64 + (CHUNK / BS) as u64 + 2;
        ms[pos].mem.write(abs, pattern(55, 1), false).await.unwrap();
        let rep = pool.scrub().await.unwrap().unwrap();
        assert_eq!((rep.mismatches, rep.repaired), (1, 1), "{level:?} {rep:?}");
        assert_eq!(rep.bad_blocks_by_position[pos], 1);
        // lose a data member: the repaired redundancy must give the right data
        let victim = pool.layout().data_positions(1, 0)[0];
        ms[victim].plan.lock().dead = true;
        check_all(&pool, &oracle).await;
    }
}

#[tokio::test]
async fn f1_write_counts_show_the_skew() {
    for (level, expect_skew) in [(RaidLevel::F1, true), (RaidLevel::Raid5, false)] {
        let (pool, _ms) = make_pool(level, 4).await;
        pool.wait_idle().await;
        let before: Vec<u64> = pool.status().members.iter().map(|m| m.writes).collect();
        let total = pool.geometry().block_count;
        for i in 0..2000u64 {
            let lba = (i.wrapping_mul(2_654_435_761) % (total / 8)) * 8;
            pool.write(lba, pattern(i, 8), false).await.unwrap();
        }
        let w: Vec<u64> = pool
            .status()
            .members
            .iter()
            .zip(&before)
            .map(|(m, b)| m.writes - b)
            .collect();
        let others = (w[0] + w[1] + w[2]) as f64 / 3.0;
        let ratio = w[3] as f64 / others;
        println!("{level:?} per-member writes {w:?}, hot/others {ratio:.2}");
        if expect_skew {
            assert!(ratio > 1.5, "F1 hot member not skewed: {w:?}");
        } else {
            assert!(ratio < 1.3, "RAID5 should be even: {w:?}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rebuild_progress_moves_and_rate_limit_holds() {
    // 16 MiB data area per member
    let blocks = (2 << 20) / 512 + (16 << 20) / 512;
    let ms: Vec<TestMember> = (0..2).map(|_| member(blocks)).collect();
    let mut cfg = config(RaidLevel::Raid1);
    cfg.chunk_bytes = 64 * 1024;
    cfg.rebuild_rate_mb_s = 8;
    let pool = Pool::create(cfg, members_of(&ms), vec![]).await.unwrap();
    pool.set_rebuild_rate_mb_s(0).await.unwrap();
    pool.wait_idle().await; // initial resync at full speed
    pool.set_rebuild_rate_mb_s(8).await.unwrap();
    let d = pattern(3, 2048);
    pool.write(0, d.clone(), false).await.unwrap();
    ms[1].plan.lock().dead = true;
    pool.fail_member(1).await.unwrap();
    let fresh = member(blocks);
    pool.replace_member(1, fresh.as_member("new"))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let p1 = pool.status().rebuild.expect("rebuild progress");
    tokio::time::sleep(Duration::from_millis(700)).await;
    let p2 = pool.status().rebuild.expect("rebuild progress");
    assert!(
        p2.done_bytes > p1.done_bytes,
        "progress did not move: {p1:?} {p2:?}"
    );
    assert_eq!(p2.total_bytes, pool.geometry().size_bytes());
    // 8 MB/s for ~1 s: loosely bounded (well under the 16 MiB an unthrottled copy does at once)
    assert!(p2.done_bytes <= 12_000_000, "rate limit exceeded: {p2:?}");
    assert!(p2.eta_secs.is_some());
    pool.set_rebuild_rate_mb_s(0).await.unwrap();
    pool.wait_idle().await;
    assert_eq!(pool.status().state, PoolState::Optimal);
    ms[0].plan.lock().dead = true;
    assert_eq!(pool.read(0, 2048).await.unwrap(), d);
}

fn member_reads(pool: &Pool) -> u64 {
    pool.status().members.iter().map(|m| m.reads).sum()
}

/// A sequential stream of partial-stripe writes, many in flight, is gathered into
/// whole stripes (written without reading anything); the same writes one at a time
/// each read-modify-write. Both read back exactly.
#[tokio::test]
async fn sequential_partial_writes_in_flight_become_full_stripes() {
    for level in [RaidLevel::Raid5, RaidLevel::Raid6] {
        // members that take a moment per I/O, so requests overlap as on real disks
        let ms: Vec<Member> = (0..members_for(level))
            .map(|i| {
                let mem = Arc::new(MemVolume::new(BS, MEMBER_BLOCKS)) as VolumeRef;
                let slow =
                    DelayVolume::new(mem, Duration::from_micros(300), Duration::from_micros(300));
                Member::new(format!("m{i}"), Arc::new(slow) as VolumeRef)
            })
            .collect();
        let pool = Pool::create(config(level), ms, vec![]).await.unwrap();
        pool.wait_idle().await;
        let stripe = pool.geometry().optimal_io_blocks as u64;
        let piece = stripe / 3;
        let stripes = 8u64;
        let oracle = MemVolume::new(BS, pool.geometry().block_count);
        // one at a time: every piece is a partial-stripe update that reads
        let before = member_reads(&pool);
        for i in 0..stripes * 3 {
            let d = pattern(i, piece);
            pool.write(i * piece, d.clone(), false).await.unwrap();
            oracle.write(i * piece, d, false).await.unwrap();
        }
        let serial_reads = member_reads(&pool) - before;
        assert!(
            serial_reads >= stripes * 3,
            "{level:?}: serial reads {serial_reads}"
        );
        // all in flight at once, in order: after the first stripe, whole stripes
        let base = stripes * stripe;
        let writes: Vec<_> = (0..stripes * 3)
            .map(|i| (base + i * piece, pattern(1000 + i, piece)))
            .collect();
        let before = member_reads(&pool);
        let futs = writes
            .iter()
            .map(|(lba, d)| pool.write(*lba, d.clone(), false));
        for r in futures_join(futs).await {
            r.unwrap();
        }
        let gathered_reads = member_reads(&pool) - before;
        for (lba, d) in &writes {
            oracle.write(*lba, d.clone(), false).await.unwrap();
        }
        // only the stream's first stripe (its first piece was not yet known to be
        // sequential) may read
        assert!(
            gathered_reads <= 2 * members_for(level) as u64,
            "{level:?}: {gathered_reads} member reads for gathered writes (serial: {serial_reads})"
        );
        check_all(&pool, &oracle).await;
    }
}

/// A gathering stripe whose stream has moved on stops waiting at once, even while
/// other stripe writes are in progress (which otherwise keep a gather waiting for
/// the rest of its stripe): its missing piece is not coming. Members take 150 ms
/// per write, so the stripe write elsewhere is still in progress when it does.
#[tokio::test]
async fn a_gather_stops_waiting_once_its_stream_has_passed() {
    let level = RaidLevel::Raid5;
    let delays: Vec<Arc<DelayVolume>> = (0..members_for(level))
        .map(|_| {
            let mem = Arc::new(MemVolume::new(BS, MEMBER_BLOCKS)) as VolumeRef;
            Arc::new(DelayVolume::new(mem, Duration::ZERO, Duration::ZERO))
        })
        .collect();
    let ms: Vec<Member> = delays
        .iter()
        .enumerate()
        .map(|(i, d)| Member::new(format!("m{i}"), d.clone() as VolumeRef))
        .collect();
    let pool = Arc::new(Pool::create(config(level), ms, vec![]).await.unwrap());
    pool.wait_idle().await;
    let stripe = pool.geometry().optimal_io_blocks as u64;
    let piece = stripe / 3;
    let oracle = Arc::new(MemVolume::new(BS, pool.geometry().block_count));
    let write = |lba: u64, blocks: u64, seed: u64| {
        let (pool, oracle) = (pool.clone(), oracle.clone());
        tokio::spawn(async move {
            let d = pattern(seed, blocks);
            pool.write(lba, d.clone(), false).await.unwrap();
            oracle.write(lba, d, false).await.unwrap();
        })
    };
    // a stream: stripes 0 and 1 in pieces, all in flight
    let first: Vec<_> = (0..6).map(|i| write(i * piece, piece, i)).collect();
    for t in first {
        t.await.unwrap();
    }
    for d in &delays {
        d.set_delays(Duration::from_millis(150), Duration::from_millis(150));
    }
    let timeouts = |p: &Pool| p.status().stripe_writes.gather_timeouts;
    let passed = |p: &Pool| p.status().stripe_writes.gather_passed;
    let before = timeouts(&pool);
    // a whole-stripe write elsewhere keeps a stripe write in progress
    let far = write(20 * stripe, stripe, 99);
    tokio::task::yield_now().await;
    // the stream goes on with the first piece of stripe 2, then skips to stripe 5
    let a = write(2 * stripe, piece, 20);
    tokio::time::sleep(Duration::from_millis(5)).await;
    let d = write(5 * stripe, piece, 50);
    let gave_up = async {
        while timeouts(&pool) == before {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(30), gave_up)
        .await
        .expect("the gather of stripe 2 gives up");
    assert_eq!(
        passed(&pool),
        1,
        "the gather of stripe 2 ended for another reason than its stream passing"
    );
    assert!(
        !far.is_finished(),
        "the gather of stripe 2 waited until the other stripe write ended"
    );
    for t in [a, d, far] {
        t.await.unwrap();
    }
    check_all(&*pool, &oracle).await;
}

fn member_writes(pool: &Pool) -> u64 {
    pool.status().members.iter().map(|m| m.writes).sum()
}

/// A stream of whole-stripe writes entering a new region marks the regions
/// ahead of it in the same superblock update, so the next regions cost no
/// superblock write (a seek to the start of every member and back on disks); a
/// lone write elsewhere marks only its own region; and once the pool is quiet
/// the cleaner clears every region, those marked ahead included.
#[tokio::test]
async fn a_stream_marks_the_write_intent_ahead_and_a_quiet_pool_clears_it() {
    let level = RaidLevel::Raid5;
    let n = members_for(level) as u64;
    let ms: Vec<TestMember> = (0..n).map(|_| member(MEMBER_BLOCKS)).collect();
    let mut cfg = config(level);
    cfg.intent_region_stripes = Some(1);
    let members = ms
        .iter()
        .enumerate()
        .map(|(i, m)| m.as_member(&format!("m{i}")))
        .collect();
    let pool = Pool::create(cfg, members, vec![]).await.unwrap();
    pool.wait_idle().await;
    let stripe = pool.geometry().optimal_io_blocks as u64;
    let stripes = pool.geometry().block_count / stripe;
    assert!(stripes >= 16, "{stripes} stripes");
    let oracle = MemVolume::new(BS, pool.geometry().block_count);
    let write = |s: u64| {
        let d = pattern(s, stripe);
        let (pool, oracle) = (&pool, &oracle);
        async move {
            pool.write(s * stripe, d.clone(), false).await.unwrap();
            oracle.write(s * stripe, d, false).await.unwrap();
        }
    };
    assert_eq!(pool.status().intent_regions, 0);
    // region 0: nothing below it is dirty, so only itself (one superblock update)
    let before = member_writes(&pool);
    write(0).await;
    assert_eq!(pool.status().intent_regions, 1);
    let first = member_writes(&pool) - before;
    assert_eq!(first, 2 * n, "a data chunk and a superblock per member");
    // region 1 continues a stream: 1 and the four regions ahead, in one update
    let before = member_writes(&pool);
    write(1).await;
    assert_eq!(pool.status().intent_regions, 6);
    assert_eq!(member_writes(&pool) - before, 2 * n);
    // regions 2-5 were marked ahead: one write per member each, no superblock
    let before = member_writes(&pool);
    for s in 2..6 {
        write(s).await;
    }
    assert_eq!(member_writes(&pool) - before, 4 * n);
    assert_eq!(pool.status().intent_regions, 6);
    // a lone write far away marks its own region only
    write(12).await;
    assert_eq!(pool.status().intent_regions, 7);
    // quiet now: the cleaner clears all of them, those marked ahead included
    let end = std::time::Instant::now() + Duration::from_secs(20);
    while pool.status().intent_regions > 0 {
        assert!(std::time::Instant::now() < end, "{:?}", pool.status());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    check_all(&pool, &oracle).await;
}

/// A RAID 1 whose only complete copy fails while the other is being rebuilt
/// has failed: writes are refused (not acknowledged on the half-rebuilt copy,
/// whose reads above its checkpoint could never return them) and the status
/// says so. Before, the pool went on as "rebuilding".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_only_complete_copy_failing_during_a_rebuild_fails_the_pool() {
    let blocks = (2 << 20) / 512 + (16 << 20) / 512;
    let ms: Vec<TestMember> = (0..3).map(|_| member(blocks)).collect();
    let mut cfg = config(RaidLevel::Raid1);
    cfg.chunk_bytes = 64 * 1024;
    let pool = Pool::create(
        cfg,
        vec![ms[0].as_member("a"), ms[1].as_member("b")],
        vec![],
    )
    .await
    .unwrap();
    pool.wait_idle().await;
    // a slow rebuild onto a fresh member, then the complete copy is lost
    pool.set_rebuild_rate_mb_s(1).await.unwrap();
    ms[1].plan.lock().dead = true;
    pool.fail_member(1).await.unwrap();
    pool.replace_member(1, ms[2].as_member("c")).await.unwrap();
    assert!(pool.status().rebuild.is_some() || pool.status().state != PoolState::Optimal);
    ms[0].plan.lock().dead = true;
    pool.fail_member(0).await.unwrap();
    assert_eq!(pool.status().state, PoolState::Failed);
    let top = pool.geometry().block_count - 8;
    assert!(pool.write(top, pattern(1, 8), false).await.is_err());
}

/// Fills the whole pool with a pattern, the oracle alike.
async fn fill_all(pool: &Pool, oracle: &MemVolume) {
    let size = pool.geometry().block_count;
    let mut at = 0;
    while at < size {
        let n = (size - at).min(1024);
        let data = pattern(at, n);
        pool.write(at, data.clone(), false).await.unwrap();
        oracle.write(at, data, false).await.unwrap();
        at += n;
    }
    pool.flush().await.unwrap();
}

/// A pool of `level` over the first `n` of `total` members of 6 MiB (the
/// rest are spares to hand it), filled whole with a pattern, and its oracle.
async fn filled_pool(
    level: RaidLevel,
    n: usize,
    total: usize,
) -> (Pool, Vec<TestMember>, MemVolume) {
    let blocks = (2 << 20) / 512 + (4 << 20) / 512;
    let ms: Vec<TestMember> = (0..total).map(|_| member(blocks)).collect();
    let pool = Pool::create(
        config(level),
        (0..n).map(|i| ms[i].as_member(&format!("m{i}"))).collect(),
        vec![],
    )
    .await
    .unwrap();
    pool.wait_idle().await;
    let oracle = MemVolume::new(BS, pool.geometry().block_count);
    fill_all(&pool, &oracle).await;
    (pool, ms, oracle)
}

/// Waits (bounded) until `done` holds of the pool's status.
async fn wait_status(pool: &Pool, secs: u64, done: impl Fn(&raid::PoolStatus) -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(secs);
    loop {
        let st = pool.status();
        if done(&st) {
            return;
        }
        assert!(std::time::Instant::now() < deadline, "{st:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Every block reads as the oracle has it, except `lost` ones, which fail
/// with a medium error naming the first lost block of the read.
async fn check_all_but_lost(pool: &Pool, oracle: &MemVolume, lost: &[u64]) {
    let n = pool.geometry().block_count;
    let mut at = 0;
    while at < n {
        let c = 64.min(n - at);
        let first = lost
            .iter()
            .copied()
            .filter(|&b| b >= at && b < at + c)
            .min();
        match (pool.read(at, c as u32).await, first) {
            (Ok(got), None) => assert!(
                got == oracle.read(at, c as u32).await.unwrap(),
                "mismatch in blocks {at}..{}",
                at + c
            ),
            (Err(BlockError::Medium { lba }), Some(f)) => {
                assert_eq!(lba, f);
                // and every block of it that is not lost, one by one
                for b in (at..at + c).filter(|b| !lost.contains(b)) {
                    assert!(
                        pool.read(b, 1).await.expect("read") == oracle.read(b, 1).await.unwrap(),
                        "mismatch in block {b}, beside lost blocks"
                    );
                }
            }
            (r, f) => panic!("blocks {at}..{}: {:?} (lost: {f:?})", at + c, r.map(|_| ())),
        }
        at += c;
    }
    for &b in lost {
        assert!(
            matches!(pool.read(b, 1).await, Err(BlockError::Medium { lba }) if lba == b),
            "lost block {b} read without an error"
        );
    }
}

/// A rebuild whose survivor has an unreadable sector where the pool has no
/// redundancy left (RAID 1 of 2 and RAID 5 with one member rebuilt, RAID 6
/// with two) gives up only the blocks of that row, as md's bad-block log
/// does, and finishes:
/// - the status lists exactly the data blocks of that row that sat on the
///   unreadable and the rebuilt positions;
/// - reads of them fail with a medium error at that block, every other block
///   reads right, also with the member that had the bad sector gone (so the
///   row's parity was kept right);
/// - the record survives a restart (the superblocks hold it), and writing
///   the blocks makes them good, durably.
///
/// Before, the rebuild retried that stripe for ever and the pool never became
/// redundant again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sector_a_rebuild_cannot_recover_is_recorded_lost_and_the_rebuild_finishes() {
    for (level, n, rebuilt) in [
        (RaidLevel::Raid1, 2, vec![1]),
        (RaidLevel::Raid5, 3, vec![1]),
        (RaidLevel::Raid5, 4, vec![1]),
        (RaidLevel::Raid6, 4, vec![1, 2]),
        (RaidLevel::Raid6, 5, vec![1, 2]),
        (RaidLevel::Raid10, 4, vec![1]),
        (RaidLevel::Raid10Far, 3, vec![1]),
    ] {
        let mirror = matches!(
            level,
            RaidLevel::Raid1 | RaidLevel::Raid10 | RaidLevel::Raid10Far
        );
        let blocks = (2 << 20) / 512 + (4 << 20) / 512;
        let (pool, ms, oracle) = filled_pool(level, n, n + rebuilt.len()).await;
        // a disk remaps a sector it is written: the salvage must write it
        ms[0].plan.lock().remap_on_write = true;
        // member 0 gets a bad sector a quarter into its data area (in the
        // first area of a far layout, where the rebuilt member holds the
        // other copy of its chunk); the others are lost and replaced (held
        // still until all are in)
        let off = pool.data_offset_bytes() / BS as u64;
        let cb = (CHUNK / BS) as u64;
        let mrow = (blocks - off) / 4;
        ms[0]
            .plan
            .lock()
            .bad_read_blocks
            .push(off + mrow..off + mrow + 1);
        pool.set_rebuild_rate_mb_s(1).await.unwrap();
        for &p in &rebuilt {
            ms[p].plan.lock().dead = true;
            pool.fail_member(p).await.unwrap();
        }
        for (i, &p) in rebuilt.iter().enumerate() {
            let m = ms[n + i].as_member(&format!("r{i}"));
            pool.replace_member(p, m).await.unwrap();
        }
        pool.set_rebuild_rate_mb_s(0).await.unwrap();
        wait_status(&pool, 120, |st| st.state == PoolState::Optimal).await;
        // the data blocks of the row whose every copy (the one chunk of a
        // parity level) sits on an unknown position: the bad sector's, and
        // every position of a rebuilt member
        let l = pool.layout();
        let k = l.data_chunks();
        let area_blocks = pool.geometry().block_count / (k as u64 * cb) * cb;
        let bad_pos = (mrow / area_blocks) as usize * l.member_count();
        let (s, row) = ((mrow % area_blocks) / cb, mrow % cb);
        let unknown: Vec<usize> = std::iter::once(bad_pos)
            .chain(rebuilt.iter().flat_map(|&m| l.positions_of(m)))
            .collect();
        let mut want: Vec<u64> = (0..k)
            .filter(|&d| l.data_positions(s, d).iter().all(|p| unknown.contains(p)))
            .map(|d| (s * k as u64 + d as u64) * cb + row)
            .collect();
        want.sort_unstable();
        let st = pool.status();
        assert!(st.rebuild_stalled.is_none(), "{st:?}");
        let lost: Vec<u64> = st.lost_ranges.iter().flat_map(|&[a, c]| a..a + c).collect();
        assert_eq!(lost, want, "{level:?}: {st:?}");
        assert_eq!(st.lost_blocks, want.len() as u64);
        assert!(!lost.is_empty(), "{level:?}");
        assert!(
            ms[0].plan.lock().bad_read_blocks.is_empty(),
            "{level:?}: the unreadable sector was not written"
        );
        check_all_but_lost(&pool, &oracle, &lost).await;
        // a member holding a block of that row that is not lost (none in
        // the smallest pools): lost next, its block is computed from the
        // row's parity and stand-ins, which must agree
        let witness = (0..k)
            .map(|d| pool.layout().data_positions(s, d)[0])
            .find(|&pos| pos != 0 && !rebuilt.contains(&pos) && !mirror)
            .unwrap_or(0);
        // kept across a restart
        pool.shutdown().await.unwrap();
        drop(pool);
        let live: Vec<Member> = (0..n)
            .map(|p| match rebuilt.iter().position(|&r| r == p) {
                Some(i) => ms[n + i].as_member(&format!("r{i}")),
                None => ms[p].as_member(&format!("m{p}")),
            })
            .collect();
        let pool = Pool::assemble(live.clone(), false).await.unwrap();
        assert_eq!(pool.status().lost_blocks, lost.len() as u64, "{level:?}");
        check_all_but_lost(&pool, &oracle, &lost).await;
        // redundant again: without that member, the rest still read right
        pool.fail_member(witness).await.unwrap();
        check_all_but_lost(&pool, &oracle, &lost).await;
        // written: good again, and the record goes for good
        for &b in &lost {
            let data = pattern(1000 + b, 1);
            pool.write(b, data.clone(), false).await.unwrap();
            oracle.write(b, data, false).await.unwrap();
        }
        assert_eq!(pool.status().lost_blocks, 0);
        assert!(pool.status().lost_ranges.is_empty());
        check_all(&pool, &oracle).await;
        pool.shutdown().await.unwrap();
        drop(pool);
        let pool = Pool::assemble(live, false).await.unwrap();
        assert_eq!(pool.status().lost_blocks, 0, "{level:?}");
        check_all(&pool, &oracle).await;
    }
}

/// A journal record written before a member failed covers that member's
/// chunk. If it were still live when the rebuild gave up a row it covers, a
/// crash would replay it over the stand-in values: the real data beside
/// them, and the row's parity wrong for the blocks of that row that were not
/// lost, which the next member loss would then rebuild wrong. The rebuild
/// has every record checkpointed before it gives up anything, so nothing is
/// replayed over it. (RAID 5 of 4: the row holds a third data block, whose
/// member is failed after the crash.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_journal_record_is_replayed_over_a_row_the_rebuild_gave_up() {
    for data_first in [false, true] {
        replayed_over_a_given_up_row(data_first).await;
    }
}

async fn replayed_over_a_given_up_row(data_first: bool) {
    let (pool, ms, oracle) = filled_pool(RaidLevel::Raid5, 4, 5).await;
    // a clean restart: no write-intent region left to resync after the crash
    pool.shutdown().await.unwrap();
    drop(pool);
    let pool = Pool::assemble(members_of(&ms[..4]), false).await.unwrap();
    pool.wait_idle().await;
    let cb = (CHUNK / BS) as u64;
    let k = pool.layout().data_chunks() as u64;
    // a stripe whose parity is on member 3: members 0, 1, 2 hold data
    let s = (0..8)
        .find(|&s| pool.layout().parity_positions(s) == vec![3])
        .unwrap();
    let col = |pos: usize| {
        (0..k as usize)
            .find(|&d| pool.layout().data_positions(s, d)[0] == pos)
            .unwrap() as u64
    };
    let row = 5;
    let block = |pos: usize| (s * k + col(pos)) * cb + row;
    // a partial update of member 1's block: its record covers that chunk
    // (with the parity as written, or a data-first record)
    pool.set_data_first(data_first);
    let data = pattern(777, 1);
    pool.write(block(1), data.clone(), false).await.unwrap();
    oracle.write(block(1), data, false).await.unwrap();
    // member 0's sector of that row cannot be read; member 1 is lost
    let off = pool.data_offset_bytes() / BS as u64;
    let bad = off + s * cb + row;
    ms[0].plan.lock().bad_read_blocks.push(bad..bad + 1);
    ms[1].plan.lock().dead = true;
    pool.fail_member(1).await.unwrap();
    pool.replace_member(1, ms[4].as_member("r")).await.unwrap();
    wait_status(&pool, 120, |st| st.state == PoolState::Optimal).await;
    let mut lost = vec![block(0), block(1)];
    lost.sort_unstable();
    let st = pool.status();
    let got: Vec<u64> = st.lost_ranges.iter().flat_map(|&[a, c]| a..a + c).collect();
    assert_eq!(got, lost, "{st:?}");
    // a crash: the pool is dropped without its shutdown, its disks cut off
    for m in &ms {
        m.plan.lock().dead = true;
    }
    drop(pool);
    let fresh = |i: usize| {
        Member::new(
            format!("c{i}"),
            Arc::new(block::FaultVolume::new(ms[i].mem.clone())) as VolumeRef,
        )
    };
    let pool = Pool::assemble(vec![fresh(0), fresh(4), fresh(2), fresh(3)], false)
        .await
        .unwrap();
    pool.wait_idle().await;
    assert_eq!(pool.status().lost_blocks, 2);
    // the member with the row's third data block is lost: it must come back
    // right from the rest of the row
    pool.fail_member(2).await.unwrap();
    check_all_but_lost(&pool, &oracle, &lost).await;
}

/// The list of lost blocks is bounded: a rebuild that would need more
/// ranges than it keeps is held at its stripe, as before the list, and the
/// status says why; the blocks it recorded stay recorded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebuild_that_would_lose_more_ranges_than_are_kept_is_held_and_says_why() {
    let (pool, ms, _oracle) = filled_pool(RaidLevel::Raid5, 3, 4).await;
    // every other block of member 0's data area, from its start, unreadable
    let off = pool.data_offset_bytes() / BS as u64;
    ms[0].plan.lock().bad_read_blocks = (0..2000).map(|i| off + 2 * i..off + 2 * i + 1).collect();
    ms[1].plan.lock().dead = true;
    pool.fail_member(1).await.unwrap();
    pool.replace_member(1, ms[3].as_member("r")).await.unwrap();
    wait_status(&pool, 120, |st| {
        st.rebuild_stalled
            .as_ref()
            .is_some_and(|s| s.error.contains("lost blocks is full"))
    })
    .await;
    let st = pool.status();
    assert_ne!(st.state, PoolState::Optimal, "{st:?}");
    assert_eq!(st.members[1].state, MemberState::Rebuilding, "{st:?}");
    assert!(
        st.lost_ranges.len() <= 512 && st.lost_ranges.len() > 400,
        "{} ranges",
        st.lost_ranges.len()
    );
    let stall = st.rebuild_stalled.clone().unwrap();
    assert!(
        stall.error.contains(&format!("stripe {} ", stall.stripe)),
        "the status names another stripe than the error: {stall:?}"
    );
}

/// A member that is not thin: a discard is a hint it ignores, as a block
/// device whose discard does not zero (BLKDISCARD guarantees nothing).
struct Thick(VolumeRef);

#[async_trait::async_trait]
impl Volume for Thick {
    fn geometry(&self) -> block::Geometry {
        block::Geometry {
            thin: false,
            ..self.0.geometry()
        }
    }
    async fn read(&self, lba: u64, blocks: u32) -> block::BlockResult<block::Bytes> {
        self.0.read(lba, blocks).await
    }
    async fn write(&self, lba: u64, data: block::Bytes, fua: bool) -> block::BlockResult<()> {
        self.0.write(lba, data, fua).await
    }
    async fn flush(&self) -> block::BlockResult<()> {
        self.0.flush().await
    }
    async fn discard(&self, lba: u64, blocks: u64) -> block::BlockResult<()> {
        self.0.geometry().check_range(lba, blocks)
    }
}

/// A thin pool (its members' discards read as zeroes) that gets a thick
/// member as a replacement still reads what it discarded as zeroes, and its
/// parity still rebuilds every member. (Before, the pool sent the newcomer
/// discards it ignored: the discarded range read back old data from it, and
/// its stale chunks made parity rebuild wrong data after a later write.)
#[tokio::test]
async fn a_thick_replacement_in_a_thin_pool_keeps_discarded_blocks_zero() {
    for level in [RaidLevel::Raid5, RaidLevel::Raid1] {
        let (pool, _ms) = make_pool(level, 3).await;
        assert!(pool.geometry().thin);
        let oracle = MemVolume::new(BS, pool.geometry().block_count);
        fill(&pool, &oracle, 1).await;
        pool.fail_member(1).await.unwrap();
        let thick = Arc::new(Thick(Arc::new(MemVolume::new(BS, MEMBER_BLOCKS))));
        pool.replace_member(1, Member::new("thick", thick as VolumeRef))
            .await
            .unwrap();
        pool.wait_idle().await;
        let n = pool.geometry().block_count;
        pool.discard(0, n).await.unwrap();
        oracle.discard(0, n).await.unwrap();
        // a block written into every stripe after the discard
        let stripe = pool.geometry().optimal_io_blocks as u64;
        for (i, lba) in (0..n).step_by(stripe as usize).enumerate() {
            let d = pattern(100 + i as u64, 1);
            pool.write(lba, d.clone(), false).await.unwrap();
            oracle.write(lba, d, false).await.unwrap();
        }
        pool.flush().await.unwrap();
        check_all(&pool, &oracle).await;
        // each member lost in turn: what it held is rebuilt from the others
        for pos in 0..3 {
            pool.fail_member(pos).await.unwrap();
            check_all(&pool, &oracle).await;
            let fresh = Arc::new(MemVolume::new(BS, MEMBER_BLOCKS));
            pool.replace_member(pos, Member::new(format!("r{pos}"), fresh as VolumeRef))
                .await
                .unwrap();
            pool.wait_idle().await;
            assert_eq!(pool.status().state, PoolState::Optimal, "{level:?}");
        }
        check_all(&pool, &oracle).await;
    }
}

/// A RAID 5 pool loses one member (and goes on writing without it), then a
/// second (and fails: nothing more is acknowledged). Both errors were
/// transient. Assembled with force, the member whose loss failed the pool
/// comes back as it is and the one lost first is rebuilt: every acknowledged
/// write reads back, and the rebuilt member holds its share. Before, force
/// rebuilt both from the start, and the pool stayed failed.
#[tokio::test]
async fn force_takes_back_the_member_whose_loss_failed_the_pool() {
    let (pool, ms) = make_pool(RaidLevel::Raid5, 4).await;
    pool.wait_idle().await;
    let oracle = MemVolume::new(BS, pool.geometry().block_count);
    fill(&pool, &oracle, 21).await;
    ms[1].plan.lock().dead = true;
    let d = pattern(22, 300);
    pool.write(200, d.clone(), false).await.unwrap();
    oracle.write(200, d, false).await.unwrap();
    pool.flush().await.unwrap();
    assert_eq!(pool.status().state, PoolState::Degraded);
    ms[3].plan.lock().dead = true;
    // the write that meets the second loss fails; it rewrites what is there,
    // so either outcome reads the same
    let same = oracle.read(0, 64).await.unwrap();
    assert!(pool.write(0, same, false).await.is_err());
    assert_eq!(pool.status().state, PoolState::Failed);
    drop(pool);
    ms[1].plan.lock().dead = false;
    ms[3].plan.lock().dead = false;

    // without force the pool stays failed, both members out
    let pool = Pool::assemble(members_of(&ms), false).await.unwrap();
    assert_eq!(pool.status().state, PoolState::Failed);
    drop(pool);
    let pool = Pool::assemble(members_of(&ms), true).await.unwrap();
    let st = pool.status();
    assert_eq!(st.members[3].state, MemberState::Active, "{st:?}");
    assert_eq!(st.members[1].state, MemberState::Rebuilding, "{st:?}");
    check_all(&pool, &oracle).await;
    pool.wait_idle().await;
    assert_eq!(pool.status().state, PoolState::Optimal);
    // the rebuilt member holds its share
    ms[0].plan.lock().dead = true;
    check_all(&pool, &oracle).await;
}

/// A member still being rebuilt is not taken back whole by force: a RAID 6
/// pool whose replacement member is half rebuilt loses two more members (and
/// fails: the replacement cannot stand in yet), then the replacement is
/// failed too. Its own superblock is one generation behind the newest, as a
/// member whose loss failed the pool would be, but it holds nothing past its
/// rebuild checkpoint: taken back as it is, reads of those stripes returned
/// junk (and the others' rebuild used it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn force_does_not_take_back_a_member_that_was_still_being_rebuilt() {
    let (pool, ms) = make_pool(RaidLevel::Raid6, 5).await;
    pool.wait_idle().await;
    let oracle = MemVolume::new(BS, pool.geometry().block_count);
    fill(&pool, &oracle, 31).await;
    pool.flush().await.unwrap();
    ms[1].plan.lock().dead = true;
    pool.fail_member(1).await.unwrap();
    // the replacement's rebuild (stripe by stripe on RAID 6) stops half way:
    // its writes to the second half of its data area are held
    let fresh = member(MEMBER_BLOCKS);
    let held = Arc::new(block::HoldVolume::new(fresh.fault.clone() as VolumeRef));
    let data_start = pool.data_offset_bytes() / BS as u64;
    let half = data_start + (MEMBER_BLOCKS - data_start) / 2;
    held.writes.hold_range(half, MEMBER_BLOCKS);
    pool.replace_member(1, Member::new("new", held.clone() as VolumeRef))
        .await
        .unwrap();
    held.writes.arrivals(1).await;
    let _ = pool.fail_member(3).await;
    let _ = pool.fail_member(4).await;
    assert_eq!(pool.status().state, PoolState::Failed);
    let _ = pool.fail_member(1).await;
    drop(pool);
    held.writes.open();

    let members = vec![
        ms[0].as_member("m0"),
        fresh.as_member("new"),
        ms[2].as_member("m2"),
        ms[3].as_member("m3"),
        ms[4].as_member("m4"),
    ];
    let pool = Pool::assemble(members, true).await.unwrap();
    let st = pool.status();
    assert_ne!(st.members[1].state, MemberState::Active, "{st:?}");
    // whatever it serves is right
    let total = pool.geometry().block_count;
    for lba in (0..total).step_by(16) {
        let n = (total - lba).min(16) as u32;
        if let Ok(b) = pool.read(lba, n).await {
            let want = oracle.read(lba, n).await.unwrap();
            assert!(b == want, "wrong data at {lba}");
        }
    }
}
