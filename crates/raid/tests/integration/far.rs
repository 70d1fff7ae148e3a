//! RAID 10 far ("far 2"): placement seen from the members, degraded reads from
//! the second halves, adjacent losses, scrub, assemble, spares and rebuild.

use crate::common;

use block::{BlockError, MemVolume, Volume};
use common::*;
use raid::{MemberState, Pool, PoolState, RaidLevel};

const FAR: RaidLevel = RaidLevel::Raid10Far;

/// Rows per half (stripes) of a far pool over `n` test members.
fn half_blocks(pool: &Pool, n: usize) -> u64 {
    pool.geometry().block_count / n as u64
}

#[tokio::test]
async fn far_geometry_and_status() {
    for n in 2..=5usize {
        let (pool, _ms) = make_pool(FAR, n).await;
        let st = pool.status();
        assert_eq!(st.level, FAR);
        assert_eq!(st.redundancy, 1);
        // half of the raw data area is usable, whatever n
        assert_eq!(st.capacity_bytes, 2 * st.usable_bytes, "n={n}");
        let data_area = MEMBER_BLOCKS - pool.data_offset_bytes() / BS as u64;
        let chunk = (CHUNK / BS) as u64;
        assert_eq!(
            pool.geometry().block_count,
            data_area / chunk / 2 * chunk * n as u64
        );
        let json = serde_json::to_string(&st).unwrap();
        assert!(json.contains("\"level\":\"raid10-far\""), "{json}");
    }
}

#[tokio::test]
async fn far_places_primary_on_first_halves_and_copy_on_next_member() {
    let n = 4;
    let (pool, ms) = make_pool(FAR, n).await;
    pool.wait_idle().await;
    let oracle = MemVolume::new(BS, pool.geometry().block_count);
    fill(&pool, &oracle, 3).await;
    let chunk = (CHUNK / BS) as u64;
    let off = pool.data_offset_bytes() / BS as u64;
    let half = half_blocks(&pool, n);
    // pool chunk c = stripe s, data chunk d: member d at row s (first half) and
    // member d+1 at half + row s (second half)
    for c in 0..pool.geometry().block_count / chunk {
        let (s, d) = (c / n as u64, (c % n as u64) as usize);
        let want = oracle.read(c * chunk, chunk as u32).await.unwrap();
        let first = ms[d].mem.read(off + s * chunk, chunk as u32).await.unwrap();
        let second = ms[(d + 1) % n]
            .mem
            .read(off + half + s * chunk, chunk as u32)
            .await
            .unwrap();
        assert_eq!(first, want, "chunk {c} primary");
        assert_eq!(second, want, "chunk {c} copy");
    }
    // reads come from the first halves only: the second halves are unreadable
    // (medium errors) and a full read sees no error at all
    for m in &ms {
        m.plan
            .lock()
            .bad_read_blocks
            .push(off + half..off + 2 * half);
    }
    let before: Vec<u64> = pool.status().members.iter().map(|m| m.reads).collect();
    check_all(&pool, &oracle).await;
    let st = pool.status();
    for (i, m) in st.members.iter().enumerate() {
        assert_eq!(m.errors, 0, "member {i} read from its second half");
        assert!(m.reads > before[i], "member {i} served no reads");
    }
}

#[tokio::test]
async fn far_degraded_reads_use_the_second_half_and_medium_errors_repair() {
    for n in [2usize, 3, 4] {
        let (pool, ms) = make_pool(FAR, n).await;
        pool.wait_idle().await;
        let oracle = MemVolume::new(BS, pool.geometry().block_count);
        fill(&pool, &oracle, 11).await;
        // a bad sector under a primary copy: served from the copy, rewritten
        let off = pool.data_offset_bytes() / BS as u64;
        let abs = off + 5;
        ms[0].mem.write(abs, pattern(99, 1), false).await.unwrap();
        ms[0].plan.lock().bad_read_blocks.push(abs..abs + 1);
        assert_eq!(
            pool.read(0, 16).await.unwrap(),
            oracle.read(0, 16).await.unwrap()
        );
        ms[0].plan.lock().bad_read_blocks.clear();
        assert_eq!(
            ms[0].mem.read(abs, 1).await.unwrap(),
            oracle.read(5, 1).await.unwrap(),
            "n={n}: bad sector not rewritten"
        );
        assert_eq!(pool.status().members[0].state, MemberState::Active);
        // a bad sector under a second-half copy (read once the primary is gone)
        let half = half_blocks(&pool, n);
        let chunk = (CHUNK / BS) as u64;
        // pool chunk 1 (stripe 0, d = 1 % n) has its copy on member (d+1) % n
        let d = 1 % n;
        let copy_member = (d + 1) % n;
        let cabs = off + half + 3;
        if copy_member != d {
            ms[copy_member]
                .mem
                .write(cabs, pattern(98, 1), false)
                .await
                .unwrap();
            ms[copy_member]
                .plan
                .lock()
                .bad_read_blocks
                .push(cabs..cabs + 1);
        }
        // lose the primary member of chunk 1: its data comes from the next member
        ms[d].plan.lock().dead = true;
        let got = pool.read(chunk, chunk as u32).await;
        // the copy has a bad sector and no other copy is left: an error, never
        // wrong data
        assert!(
            matches!(got, Err(BlockError::Medium { .. })),
            "n={n}: {got:?}"
        );
        ms[copy_member].plan.lock().bad_read_blocks.clear();
        ms[copy_member]
            .mem
            .write(cabs, oracle.read(chunk + 3, 1).await.unwrap(), false)
            .await
            .unwrap();
        check_all(&pool, &oracle).await;
        assert_eq!(pool.status().state, PoolState::Degraded);
    }
}

#[tokio::test]
async fn far_survives_non_adjacent_losses_and_fails_on_adjacent_ones() {
    let n = 4;
    let (pool, ms) = make_pool(FAR, n).await;
    pool.wait_idle().await;
    let oracle = MemVolume::new(BS, pool.geometry().block_count);
    fill(&pool, &oracle, 5).await;
    ms[0].plan.lock().dead = true;
    ms[2].plan.lock().dead = true;
    check_all(&pool, &oracle).await;
    let st = pool.status();
    assert_eq!(st.state, PoolState::Degraded, "{st:?}");
    // writes still land on the survivors' copies
    let d = pattern(777, 300);
    pool.write(100, d.clone(), true).await.unwrap();
    oracle.write(100, d, false).await.unwrap();
    check_all(&pool, &oracle).await;
    // member 1 is adjacent to both 0 and 2: data is lost, the pool says so
    pool.fail_member(1).await.unwrap();
    assert_eq!(pool.status().state, PoolState::Failed);
    assert!(matches!(
        pool.read(0, 1).await,
        Err(BlockError::Unavailable(_))
    ));
}

#[tokio::test]
async fn far_scrub_repairs_the_second_copy() {
    let n = 3;
    let (pool, ms) = make_pool(FAR, n).await;
    pool.wait_idle().await;
    let oracle = MemVolume::new(BS, pool.geometry().block_count);
    fill(&pool, &oracle, 41).await;
    let off = pool.data_offset_bytes() / BS as u64;
    let half = half_blocks(&pool, n);
    let chunk = (CHUNK / BS) as u64;
    // stripe 1, data chunk 0: copy on member 1, second half, row 1
    ms[1]
        .mem
        .write(off + half + chunk + 2, pattern(55, 1), false)
        .await
        .unwrap();
    let rep = pool.scrub().await.unwrap().unwrap();
    assert_eq!((rep.mismatches, rep.repaired), (1, 1), "{rep:?}");
    assert_eq!(rep.bad_blocks_by_position, vec![0, 1, 0]);
    // lose the primary: the repaired copy must give the right data
    ms[0].plan.lock().dead = true;
    check_all(&pool, &oracle).await;
    let rep2 = pool.scrub().await.unwrap().unwrap();
    assert_eq!(rep2.mismatches, 0);
}

#[tokio::test]
async fn far_assembles_as_far_and_rebuilds_both_halves() {
    let n = 5;
    let (pool, mut ms) = make_pool(FAR, n).await;
    let oracle = MemVolume::new(BS, pool.geometry().block_count);
    // usable at once: written while the initial resync runs
    fill(&pool, &oracle, 9).await;
    pool.wait_idle().await;
    pool.shutdown().await.unwrap();
    drop(pool);
    let mut order = members_of(&ms);
    order.reverse();
    let pool = Pool::assemble(order, false).await.unwrap();
    assert_eq!(pool.status().level, FAR);
    assert_eq!(pool.status().state, PoolState::Optimal);
    check_all(&pool, &oracle).await;
    pool.shutdown().await.unwrap();
    drop(pool);
    // one missing: degraded; replace it and rebuild
    let mut some = members_of(&ms);
    some.remove(2);
    let pool = Pool::assemble(some, false).await.unwrap();
    assert_eq!(pool.status().state, PoolState::Degraded);
    check_all(&pool, &oracle).await;
    let fresh = member(MEMBER_BLOCKS);
    pool.replace_member(2, fresh.as_member("new"))
        .await
        .unwrap();
    ms[2] = fresh;
    pool.wait_idle().await;
    let st = pool.status();
    assert_eq!(st.state, PoolState::Optimal, "{st:?}");
    assert_eq!(st.members[2].rebuilt_bytes, st.capacity_bytes / n as u64);
    // the rebuilt member holds both halves: lose each neighbour in turn
    ms[1].plan.lock().dead = true;
    check_all(&pool, &oracle).await;
    drop(pool);
    ms[1].plan.lock().dead = false;
    let pool = Pool::assemble(members_of(&ms), true).await.unwrap();
    pool.wait_idle().await;
    ms[3].plan.lock().dead = true;
    check_all(&pool, &oracle).await;
}

#[tokio::test]
async fn far_hot_spare_pulled_in_and_rebuilt() {
    let ms: Vec<TestMember> = (0..3).map(|_| member(MEMBER_BLOCKS)).collect();
    let spare = member(MEMBER_BLOCKS);
    let pool = Pool::create(config(FAR), members_of(&ms), vec![spare.as_member("spare")])
        .await
        .unwrap();
    let oracle = MemVolume::new(BS, pool.geometry().block_count);
    fill(&pool, &oracle, 21).await;
    ms[1].plan.lock().dead = true;
    check_all(&pool, &oracle).await; // reads of member 1's primaries fail it
    pool.wait_idle().await;
    let st = pool.status();
    assert_eq!(st.state, PoolState::Optimal, "{st:?}");
    assert_eq!(st.members[1].name, "spare");
    // the spare carries both of its halves: lose each neighbour
    ms[0].plan.lock().dead = true;
    check_all(&pool, &oracle).await;
}

#[tokio::test]
async fn far_discard_on_thin_members_reads_zeroes() {
    let (pool, _ms) = make_pool(FAR, 3).await;
    if !pool.geometry().thin {
        return;
    }
    let oracle = MemVolume::new(BS, pool.geometry().block_count);
    fill(&pool, &oracle, 2).await;
    pool.discard(7, 200).await.unwrap();
    oracle.discard(7, 200).await.unwrap();
    check_all(&pool, &oracle).await;
}

#[tokio::test]
async fn far_rebuilds_two_non_adjacent_members_stripe_by_stripe() {
    // two members rebuilding at once take the per-stripe path (one member
    // rebuilding takes the batched one, in the tests above)
    let n = 4;
    let (pool, mut ms) = make_pool(FAR, n).await;
    let oracle = MemVolume::new(BS, pool.geometry().block_count);
    fill(&pool, &oracle, 13).await;
    pool.wait_idle().await;
    for pos in [0, 2] {
        pool.fail_member(pos).await.unwrap();
    }
    assert_eq!(pool.status().state, PoolState::Degraded);
    for pos in [0, 2] {
        let fresh = member(MEMBER_BLOCKS);
        pool.replace_member(pos, fresh.as_member("new"))
            .await
            .unwrap();
        ms[pos] = fresh;
    }
    pool.wait_idle().await;
    assert_eq!(pool.status().state, PoolState::Optimal);
    // only the rebuilt members are left: every chunk has one copy on them
    ms[1].plan.lock().dead = true;
    ms[3].plan.lock().dead = true;
    check_all(&pool, &oracle).await;
}
