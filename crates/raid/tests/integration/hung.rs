//! A member that stops answering (takes requests and never answers, as a hung
//! disk or a lost path does), behind the disk layer's command timeout
//! (`disk::TimedDisk`, as the node opens every disk): the pool fails it at the
//! timeout and goes on degraded, its reads reconstructed and its writes
//! kept, instead of waiting with it.

use crate::common;

use block::{MemVolume, Volume, VolumeRef};
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
