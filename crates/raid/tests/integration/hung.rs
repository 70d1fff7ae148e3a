//! A member that stops answering (takes requests and never answers, as a hung
//! disk or a lost path does), behind the disk layer's command timeout
//! (`disk::TimedDisk`, as the node opens every disk): the pool fails it at the
//! timeout and goes on degraded, its reads reconstructed and its writes
//! kept, instead of waiting with it.

use crate::common;

use block::{FaultVolume, MemVolume, Volume, VolumeRef};
use common::*;
use raid::{Member, MemberState, Pool, PoolState, RaidLevel};
use std::sync::Arc;
use std::time::Duration;

/// The command timeout member 1, the one that hangs, gets here.
const LIMIT: Duration = Duration::from_millis(200);

/// The others': long enough that a loaded machine cannot make them fail too.
const LIMIT_OTHERS: Duration = Duration::from_secs(10);

/// A pool of `level` whose members are `ms`, each behind a command timeout
/// when `timed`, filled with a pattern (also written to the returned oracle).
async fn pool_over(level: RaidLevel, ms: &[TestMember], timed: bool) -> (Pool, MemVolume) {
    create_filled(level, members_over(ms, timed), 5).await
}

/// `ms` as pool members, each behind a command timeout of its own when
/// `timed` (member 1's short).
fn members_over(ms: &[TestMember], timed: bool) -> Vec<Member> {
    ms.iter()
        .enumerate()
        .map(|(i, m)| {
            let name = format!("m{i}");
            let v = m.fault.clone() as VolumeRef;
            let limit = if i == 1 { LIMIT } else { LIMIT_OTHERS };
            let v = if timed {
                Arc::new(disk::TimedDisk::with_timeout(v, &name, limit)) as VolumeRef
            } else {
                v
            };
            Member::new(name, v)
        })
        .collect()
}

/// A pool assembled (a node starting) while a member hangs: behind the
/// command timeout the assemble finds that member missing and the pool
/// serves degraded, every block as it was.
#[tokio::test]
async fn an_assemble_that_meets_a_hung_member_goes_on_without_it() {
    let level = RaidLevel::Raid5;
    let ms: Vec<TestMember> = (0..members_for(level))
        .map(|_| member(MEMBER_BLOCKS))
        .collect();
    let (pool, oracle) = pool_over(level, &ms, false).await;
    pool.flush().await.unwrap();
    drop(pool);
    ms[1].plan.lock().hung = true;
    let pool = tokio::time::timeout(
        Duration::from_secs(30),
        Pool::assemble(members_over(&ms, true), false),
    )
    .await
    .expect("the assemble waited with its hung member")
    .expect("assemble");
    let st = pool.status();
    assert_eq!(st.state, PoolState::Degraded, "{st:?}");
    assert_ne!(st.members[1].state, MemberState::Active, "{st:?}");
    check_all(&pool, &oracle).await;
}

/// A pool assembled (a node starting) while every member is stalled (an
/// HBA resetting, the file system under every disk file frozen) for three
/// command timeouts: each member's keeper finds the others silent too and
/// waits, so the assemble goes on once the stall ends and the pool is
/// whole. Before, each member was given up at its timeout while the pool
/// was assembled, and it came up failed.
#[tokio::test]
async fn an_assemble_that_meets_a_stall_every_member_shares_waits_it_out() {
    assemble_stall_is_waited_out(FaultVolume::set_hung).await;
}

/// The same for a stall that holds writes only (a frozen file system under
/// every disk file), met by the journal's replay: the pool stopped with
/// small writes journaled, so the assemble writes them in place before the
/// pool's own keepers are given. The members, named this pool's by their
/// superblocks by then, are asked a write (to their probe block): asked a
/// read, they answered and the first to time out was failed.
#[tokio::test]
async fn an_assemble_that_meets_a_write_stall_every_member_shares_waits_it_out() {
    assemble_stall_is_waited_out(FaultVolume::set_writes_hung).await;
}

/// A RAID 5 left with small writes journaled is assembled while every
/// member stalls (`stall_with`) for three command timeouts: nothing is
/// failed, every block reads back.
async fn assemble_stall_is_waited_out(stall_with: fn(&FaultVolume, bool)) {
    let level = RaidLevel::Raid5;
    let ms: Vec<TestMember> = (0..members_for(level))
        .map(|_| member(MEMBER_BLOCKS))
        .collect();
    let (pool, oracle) = pool_over(level, &ms, false).await;
    // small writes (read-modify-write, journaled), and no flush: a stop
    for w in 0..16u64 {
        let d = pattern(900 + w, 1 + w % 5);
        let lba = w * 53 % (pool.geometry().block_count - 8);
        pool.write(lba, d.clone(), false).await.unwrap();
        oracle.write(lba, d, false).await.unwrap();
    }
    drop(pool);
    for m in &ms {
        stall_with(&m.fault, true);
    }
    let (members, disks) = all_timed(&ms, LIMIT);
    let assemble = tokio::spawn(Pool::assemble(members, false));
    stall_ends_after_three_timeouts(&ms, &disks, stall_with).await;
    let pool = tokio::time::timeout(Duration::from_secs(30), assemble)
        .await
        .expect("the assemble never ended")
        .unwrap()
        .unwrap_or_else(|e| {
            let timings: Vec<_> = disks.iter().map(|d| d.timing()).collect();
            panic!("assemble: {e}: {timings:?}")
        });
    nothing_was_failed("the assemble", &pool, &disks, &oracle).await;
}

/// Waits until some member waited out a command timeout for its keeper,
/// lets the stall go on two more, then ends it (`stall_with` cleared on
/// every member).
async fn stall_ends_after_three_timeouts(
    ms: &[TestMember],
    disks: &[Arc<disk::TimedDisk>],
    stall_with: fn(&FaultVolume, bool),
) {
    until("a member held", || {
        disks.iter().any(|d| d.timing().held >= 1)
    })
    .await;
    tokio::time::sleep(LIMIT * 2).await;
    for m in ms {
        stall_with(&m.fault, false);
    }
}

/// After a stall (`what`): every member active, the pool neither degraded
/// nor failed, no disk timed out or failed, every block as the oracle has
/// it.
async fn nothing_was_failed(
    what: &str,
    pool: &Pool,
    disks: &[Arc<disk::TimedDisk>],
    oracle: &MemVolume,
) {
    let st = pool.status();
    assert!(
        st.members.iter().all(|m| m.state == MemberState::Active),
        "{what}: {st:?}"
    );
    assert!(
        !matches!(st.state, PoolState::Degraded | PoolState::Failed),
        "{what}: {st:?}"
    );
    for d in disks {
        let t = d.timing();
        assert_eq!((t.timeouts, t.failed), (0, None), "{what}");
    }
    check_all(pool, oracle).await;
}

/// Small and large writes over the whole pool, and a flush, while member 1
/// is hung: every one must answer, and the pool's data must read back whole.
#[tokio::test]
async fn a_member_that_stops_answering_is_failed_at_the_command_timeout() {
    for level in [
        RaidLevel::Raid1,
        RaidLevel::Raid5,
        RaidLevel::Raid6,
        RaidLevel::Raid10,
        RaidLevel::F1,
    ] {
        let ms: Vec<TestMember> = (0..members_for(level))
            .map(|_| member(MEMBER_BLOCKS))
            .collect();
        let (pool, oracle) = pool_over(level, &ms, true).await;
        ms[1].plan.lock().hung = true;
        let blocks = pool.geometry().block_count;
        // every request gets an answer well within the bound (each one at
        // most waits out the timeout of its own requests to the hung member)
        let bound = Duration::from_secs(30);
        let work = async {
            let mut i = 0u64;
            let mut at = 3u64;
            while at < blocks {
                let n = if i.is_multiple_of(3) { 64 } else { 5 }.min(blocks - at);
                let d = pattern(900 + i, n);
                pool.write(at, d.clone(), i.is_multiple_of(4))
                    .await
                    .expect("write");
                oracle.write(at, d, false).await.unwrap();
                at += n + 97;
                i += 1;
            }
            pool.flush().await.expect("flush");
            check_all(&pool, &oracle).await;
        };
        tokio::time::timeout(bound, work)
            .await
            .unwrap_or_else(|_| panic!("{level:?}: the pool waited with its hung member"));
        let st = pool.status();
        assert_eq!(st.state, PoolState::Degraded, "{level:?}");
        assert_eq!(st.members[1].state, MemberState::Failed, "{level:?}");
        assert!(
            st.members
                .iter()
                .enumerate()
                .all(|(i, m)| i == 1 || m.state == MemberState::Active),
            "{level:?}: {:?}",
            st.members
        );
    }
}

/// The control: without the command timeout, the same pool waits as long
/// as its hung member does.
#[tokio::test]
async fn without_the_command_timeout_the_pool_waits_with_a_hung_member() {
    let level = RaidLevel::Raid5;
    let ms: Vec<TestMember> = (0..members_for(level))
        .map(|_| member(MEMBER_BLOCKS))
        .collect();
    let (pool, _oracle) = pool_over(level, &ms, false).await;
    ms[1].plan.lock().hung = true;
    // a write to every data chunk of the first stripe touches member 1; ten
    // timeouts' worth of waiting for an answer that must not come
    let stripe = CHUNK as u64 / BS as u64 * (members_for(level) as u64 - 1);
    let w = pool.write(0, pattern(1, stripe), false);
    assert!(
        tokio::time::timeout(LIMIT * 10, w).await.is_err(),
        "a pool without the timeout answered while its member hung"
    );
    assert_eq!(pool.status().members[1].state, MemberState::Active);
}

/// A pool of `level` over fresh members, each behind the same command
/// timeout `limit`, filled with a pattern: the members' fault layers, the timed
/// disks to watch, the pool and its oracle.
struct TimedPool {
    ms: Vec<TestMember>,
    disks: Vec<Arc<disk::TimedDisk>>,
    pool: Arc<Pool>,
    oracle: Arc<MemVolume>,
}

async fn timed_pool(level: RaidLevel, limit: Duration) -> TimedPool {
    let ms: Vec<TestMember> = (0..members_for(level))
        .map(|_| member(MEMBER_BLOCKS))
        .collect();
    let (members, disks) = all_timed(&ms, limit);
    let (pool, oracle) = create_filled(level, members, 5).await;
    TimedPool {
        ms,
        disks,
        pool: Arc::new(pool),
        oracle: Arc::new(oracle),
    }
}

/// `ms` as pool members, each behind the same command timeout, with
/// the timed disks to watch.
fn all_timed(ms: &[TestMember], limit: Duration) -> (Vec<Member>, Vec<Arc<disk::TimedDisk>>) {
    let disks: Vec<_> = (0..ms.len())
        .map(|i| {
            let v = ms[i].fault.clone() as VolumeRef;
            Arc::new(disk::TimedDisk::with_timeout(v, &format!("m{i}"), limit))
        })
        .collect();
    let members = disks
        .iter()
        .enumerate()
        .map(|(i, d)| Member::new(format!("m{i}"), d.clone() as VolumeRef))
        .collect();
    (members, disks)
}

/// Waits until `what` holds (a counter the disks move), for at most 30 s.
async fn until(what: &str, holds: impl Fn() -> bool) {
    let t = std::time::Instant::now();
    while !holds() {
        assert!(t.elapsed() < Duration::from_secs(30), "never: {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Writes a pattern over the first `n` blocks from a task of its own, for
/// the oracle too once it answered.
fn write_behind(
    pool: &Arc<Pool>,
    oracle: &Arc<MemVolume>,
    seed: u64,
    n: u64,
) -> tokio::task::JoinHandle<block::BlockResult<()>> {
    let (pool, oracle) = (pool.clone(), oracle.clone());
    tokio::spawn(async move {
        let d = pattern(seed, n);
        pool.write(0, d.clone(), false).await?;
        oracle.write(0, d, false).await
    })
}

/// Every member stops answering at once, for several command timeouts (a
/// controller resetting, the path to every disk failing over): each one's
/// keeper finds the others silent too and waits, so when the stall ends
/// the writes in flight answer and the pool is whole. Without the keeper
/// the members were failed one after the other and the pool with them.
#[tokio::test]
async fn a_stall_every_member_shares_is_waited_out() {
    shared_stall_is_waited_out(FaultVolume::set_hung).await;
}

/// The same for a stall that holds writes only (a frozen file system under
/// every disk file still answers reads): the keeper asks the others a
/// write (to their probe block), not a read, so it sees the stall shared.
/// Asked a read, the others answered and the first member to time out was
/// failed.
#[tokio::test]
async fn a_write_stall_every_member_shares_is_waited_out() {
    shared_stall_is_waited_out(FaultVolume::set_writes_hung).await;
}

/// Every member of a RAID 1, 5 and 6 stalls (`stall_with` set on each, then
/// cleared) for three command timeouts under a write: nothing is failed,
/// every block reads back.
async fn shared_stall_is_waited_out(stall_with: fn(&FaultVolume, bool)) {
    for level in [RaidLevel::Raid1, RaidLevel::Raid5, RaidLevel::Raid6] {
        let TimedPool {
            ms,
            disks,
            pool,
            oracle,
        } = timed_pool(level, LIMIT).await;
        for m in &ms {
            stall_with(&m.fault, true);
        }
        let stripe = CHUNK as u64 / BS as u64 * 2;
        let w = write_behind(&pool, &oracle, 77, stripe);
        // a member with a request out (the journal's copies, say) waited
        // out a timeout (its keeper asked, the others probed and found
        // silent); the stall goes on two more
        stall_ends_after_three_timeouts(&ms, &disks, stall_with).await;
        let r = w.await.unwrap();
        let timings: Vec<_> = disks.iter().map(|d| d.timing()).collect();
        r.unwrap_or_else(|e| {
            panic!("{level:?}: the write in flight over the stall: {e}: {timings:?}")
        });
        nothing_was_failed(&format!("{level:?}"), &pool, &disks, &oracle).await;
    }
}

/// A parity pool that lost a member loses the data with any other one: a
/// second member that stops answering is waited for, not failed, and the
/// pool goes on when it answers again. Silent for
/// `disk::KEEP_TIMEOUT_FACTOR` timeouts, it is taken as dead all the same,
/// and the write answers (with an error, the pool failed) instead of
/// waiting for ever.
#[tokio::test]
async fn the_last_redundancy_is_waited_for_then_given_up() {
    let level = RaidLevel::Raid5;
    let TimedPool {
        ms,
        disks,
        pool,
        oracle,
    } = timed_pool(level, LIMIT).await;
    let stripe = CHUNK as u64 / BS as u64 * (members_for(level) as u64 - 1);

    // member 1 alone stops answering: the others answer, so it is failed
    ms[1].fault.set_hung(true);
    write_behind(&pool, &oracle, 81, stripe)
        .await
        .unwrap()
        .expect("write with member 1 hung");
    let st = pool.status();
    assert_eq!(st.state, PoolState::Degraded, "{st:?}");
    assert_eq!(st.members[1].state, MemberState::Failed);
    assert!(disks[1].timing().failed.is_some());

    // member 2 now holds the last redundancy: waited for, not failed
    ms[2].fault.set_hung(true);
    let w = write_behind(&pool, &oracle, 82, stripe);
    until("member 2 held", || disks[2].timing().held >= 1).await;
    tokio::time::sleep(LIMIT * 2).await;
    assert_eq!(pool.status().members[2].state, MemberState::Active);
    ms[2].fault.set_hung(false);
    w.await.unwrap().expect("the write over member 2's stall");
    let st = pool.status();
    assert_eq!(st.state, PoolState::Degraded, "{st:?}");
    assert_eq!(st.members[2].state, MemberState::Active);
    assert_eq!(disks[2].timing().failed, None);
    check_all(pool.as_ref(), oracle.as_ref()).await;

    // and silent for good: given up after the keep limit, the write answers
    let t0 = std::time::Instant::now();
    ms[2].fault.set_hung(true);
    let w = write_behind(&pool, &oracle, 83, stripe);
    let r = tokio::time::timeout(Duration::from_secs(30), w)
        .await
        .expect("the pool waited for ever on a dead last member")
        .unwrap();
    assert!(r.is_err(), "a write with the pool's last redundancy dead");
    let t = disks[2].timing();
    assert!(t.failed.is_some(), "{t:?}");
    assert!(
        t0.elapsed() >= LIMIT * disk::KEEP_TIMEOUT_FACTOR,
        "given up only after the keep limit: {:?}, {t:?}",
        t0.elapsed()
    );
    assert_eq!(pool.status().state, PoolState::Failed);
}

/// Two members of a RAID 5 stall under one write while the others answer:
/// the first to run out is let go (the others answer its keeper's probe),
/// the second then holds the last redundancy and is waited for, though the
/// first's failure is recorded only once the write's batch returns. Before,
/// each found the other still serving and both were let go: the pool
/// failed.
#[tokio::test]
async fn two_members_stalled_under_one_write_are_not_both_let_go() {
    let level = RaidLevel::Raid5;
    let limit = Duration::from_secs(1);
    let TimedPool {
        ms,
        disks,
        pool,
        oracle,
    } = timed_pool(level, limit).await;
    // a whole stripe: one write to every member
    let stripe = CHUNK as u64 / BS as u64 * (members_for(level) as u64 - 1);
    ms[1].fault.set_hung(true);
    ms[2].fault.set_hung(true);
    let w = write_behind(&pool, &oracle, 91, stripe);
    until("one let go and the other held", || {
        let (a, b) = (disks[1].timing(), disks[2].timing());
        (a.failed.is_some() && b.held >= 1) || (b.failed.is_some() && a.held >= 1)
    })
    .await;
    // (a longer timeout here: a probe missed on a loaded machine only
    // delays the first let-go, and the held member stays within its limit)
    tokio::time::sleep(limit).await;
    let failed_disks = disks.iter().filter(|d| d.timing().failed.is_some()).count();
    assert_eq!(failed_disks, 1, "both let go before the stall ended");
    ms[1].fault.set_hung(false);
    ms[2].fault.set_hung(false);
    w.await
        .unwrap()
        .expect("the write over the two stalled members");
    let st = pool.status();
    assert_eq!(st.state, PoolState::Degraded, "{st:?}");
    let failed: Vec<_> = (0..st.members.len())
        .filter(|&i| st.members[i].state == MemberState::Failed)
        .collect();
    assert!(failed == [1] || failed == [2], "{st:?}");
    check_all(pool.as_ref(), oracle.as_ref()).await;
}

/// A journal device (an SSD holding the stripe journal) that stops
/// answering is given up at its command timeout, keeper or no keeper:
/// the members hold every acknowledged write once the pool checkpoints,
/// so the pool hands the journal back to them and goes on, no member
/// failed. Waited for, every journaled write would have waited with it.
#[tokio::test]
async fn a_journal_device_that_stops_answering_is_given_up_to_the_members() {
    let ms: Vec<TestMember> = (0..4).map(|_| member(MEMBER_BLOCKS)).collect();
    let ssd = member((1 << 20) / BS as u64);
    let (members, disks) = all_timed(&ms, LIMIT_OTHERS);
    let jdisk = Arc::new(disk::TimedDisk::with_timeout(
        ssd.fault.clone() as VolumeRef,
        "ssd",
        LIMIT,
    ));
    let pool = Pool::create_with_journal_device(
        config(RaidLevel::Raid5),
        members,
        vec![],
        Some(Member::new("ssd", jdisk.clone() as VolumeRef)),
    )
    .await
    .unwrap();
    pool.wait_idle().await;
    let pool = Arc::new(pool);
    let oracle = Arc::new(MemVolume::new(BS, pool.geometry().block_count));
    ssd.fault.set_hung(true);
    // a partial-stripe write: journaled, on the device
    let w = write_behind(&pool, &oracle, 91, 3);
    tokio::time::timeout(LIMIT * 20, w)
        .await
        .expect("the write waited with the hung journal device")
        .unwrap()
        .expect("the write over the hung journal device");
    let t = jdisk.timing();
    assert_eq!((t.timeouts, t.held), (1, 0), "{t:?}");
    assert!(t.failed.is_some(), "{t:?}");
    let st = pool.status();
    assert!(
        st.journal_device.as_ref().is_some_and(|d| d.failed),
        "{st:?}"
    );
    assert!(
        st.members.iter().all(|m| m.state == MemberState::Active),
        "{st:?}"
    );
    // journaled on the members from then on
    let w = write_behind(&pool, &oracle, 92, 5);
    w.await.unwrap().unwrap();
    for d in &disks {
        assert_eq!(d.timing().timeouts, 0);
    }
    ssd.fault.set_hung(false);
    // (the oracle covers what was written; the rest of the pool reads zeroes)
    check_all(pool.as_ref(), oracle.as_ref()).await;
}
