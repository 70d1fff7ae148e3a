//! Property test: every level, random I/O against a MemVolume oracle, with member
//! failures within tolerance, rebuilds onto new members and online grows (the
//! pool uses part of its members) in between.

use crate::common;

use block::{MemVolume, Volume};
use common::*;
use proptest::prelude::*;
use raid::{MemberState, Pool, RaidLevel};
use std::collections::BTreeSet;

#[derive(Debug, Clone)]
enum Op {
    Write {
        lba_frac: u32,
        blocks: u64,
        fua: bool,
        seed: u64,
    },
    Read {
        lba_frac: u32,
        blocks: u64,
    },
    Flush,
    Discard {
        lba_frac: u32,
        blocks: u64,
    },
    Kill {
        pos: usize,
    },
    Replace,
    WaitIdle,
    Grow {
        frac: u32,
    },
}

/// Member blocks: the pool uses `MEMBER_BLOCKS` at creation, 16 chunks more are
/// room to grow into.
const ROOM_BLOCKS: u64 = MEMBER_BLOCKS + 16 * (CHUNK / BS) as u64;

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (any::<u32>(), 1u64..80, any::<bool>(), any::<u64>())
            .prop_map(|(lba_frac, blocks, fua, seed)| Op::Write { lba_frac, blocks, fua, seed }),
        4 => (any::<u32>(), 1u64..120).prop_map(|(lba_frac, blocks)| Op::Read { lba_frac, blocks }),
        1 => Just(Op::Flush),
        1 => (any::<u32>(), 1u64..100).prop_map(|(lba_frac, blocks)| Op::Discard { lba_frac, blocks }),
        1 => (0usize..8).prop_map(|pos| Op::Kill { pos }),
        1 => Just(Op::Replace),
        1 => Just(Op::WaitIdle),
        1 => any::<u32>().prop_map(|frac| Op::Grow { frac }),
    ]
}

fn place(frac: u32, blocks: u64, total: u64) -> (u64, u64) {
    let blocks = blocks.min(total);
    let lba = (frac as u64 * (total - blocks + 1)) >> 32;
    (lba, blocks)
}

async fn run(level: RaidLevel, n: usize, ops: Vec<Op>) {
    let mut ms: Vec<TestMember> = (0..n).map(|_| member(ROOM_BLOCKS)).collect();
    let mut cfg = config(level);
    cfg.member_bytes = Some(MEMBER_BLOCKS * BS as u64);
    let pool = Pool::create(cfg, members_of(&ms), vec![])
        .await
        .expect("create");
    let mut total = pool.geometry().block_count;
    let oracle = MemVolume::new(BS, 2 * total);
    let redundancy = pool.status().redundancy;
    let mut down: BTreeSet<usize> = BTreeSet::new();
    for op in ops {
        let label = format!("{op:?}");
        let step = async {
            #[allow(clippy::redundant_locals)]
            let ms = &mut ms;
            match op {
                Op::Write {
                    lba_frac,
                    blocks,
                    fua,
                    seed,
                } => {
                    let (lba, blocks) = place(lba_frac, blocks, total);
                    let data = pattern(seed, blocks);
                    pool.write(lba, data.clone(), fua).await.expect("write");
                    oracle.write(lba, data, false).await.unwrap();
                }
                Op::Read { lba_frac, blocks } => {
                    let (lba, blocks) = place(lba_frac, blocks, total);
                    let got = pool.read(lba, blocks as u32).await.expect("read");
                    let want = oracle.read(lba, blocks as u32).await.unwrap();
                    assert!(got == want, "{level:?}: read {lba}+{blocks} differs");
                }
                Op::Flush => pool.flush().await.expect("flush"),
                Op::Discard { lba_frac, blocks } => {
                    let (lba, blocks) = place(lba_frac, blocks, total);
                    pool.discard(lba, blocks).await.expect("discard");
                    oracle.discard(lba, blocks).await.unwrap();
                }
                Op::Kill { pos } => {
                    let pos = pos % n;
                    let st = pool.status();
                    let mut gone: BTreeSet<usize> = st
                        .members
                        .iter()
                        .filter(|m| m.state != MemberState::Active)
                        .map(|m| m.position)
                        .collect();
                    gone.extend(down.iter().copied());
                    gone.insert(pos);
                    // raid10 tolerates one per pair only (far: no two adjacent):
                    // keep to its guaranteed one
                    if redundancy > 0 && gone.len() <= redundancy {
                        ms[pos].plan.lock().dead = true;
                        down.insert(pos);
                    }
                }
                Op::Replace => {
                    if let Some(&pos) = down.iter().next() {
                        pool.fail_member(pos).await.unwrap();
                        let fresh = member(ROOM_BLOCKS);
                        pool.replace_member(pos, fresh.as_member("new"))
                            .await
                            .expect("replace");
                        ms[pos] = fresh;
                        down.remove(&pos);
                    }
                }
                Op::WaitIdle => pool.wait_idle().await,
                Op::Grow { frac } => {
                    let max = pool.max_block_count();
                    let target = total + ((frac as u64 * (max - total + 1)) >> 32);
                    let healthy = down.is_empty()
                        && pool
                            .status()
                            .members
                            .iter()
                            .all(|m| m.state == MemberState::Active);
                    match pool.grow_to(target).await {
                        Ok(()) => {
                            assert_eq!(pool.geometry().block_count, target);
                            total = target;
                        }
                        Err(e) => {
                            assert!(!healthy, "{level:?}: grow to {target} refused: {e}");
                            assert_eq!(pool.geometry().block_count, total);
                        }
                    }
                }
            }
        };
        if tokio::time::timeout(std::time::Duration::from_secs(20), step)
            .await
            .is_err()
        {
            panic!("{level:?}: {label} hung; status {:?}", pool.status());
        }
    }
    check_all(&pool, &oracle).await;
    // bring it back to full redundancy, then lose as many members as allowed
    for pos in std::mem::take(&mut down) {
        pool.fail_member(pos).await.unwrap();
        let fresh = member(ROOM_BLOCKS);
        pool.replace_member(pos, fresh.as_member("new2"))
            .await
            .expect("replace");
        ms[pos] = fresh;
    }
    pool.wait_idle().await;
    check_all(&pool, &oracle).await;
    for pos in 0..redundancy {
        ms[(pos * 2 + 1) % n].plan.lock().dead = true;
    }
    check_all(&pool, &oracle).await;
}

fn cases() -> u32 {
    std::env::var("RAID_PROPTEST_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(16)
}

macro_rules! level_test {
    ($name:ident, $level:expr) => {
        level_test!($name, $level, members_for($level));
    };
    ($name:ident, $level:expr, $n:expr) => {
        proptest! {
            #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]
            #[test]
            fn $name(ops in proptest::collection::vec(op(), 1..60)) {
                let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
                rt.block_on(run($level, $n, ops));
            }
        }
    };
}

level_test!(oracle_raid0, RaidLevel::Raid0);
level_test!(oracle_raid1, RaidLevel::Raid1);
level_test!(oracle_raid5, RaidLevel::Raid5);
level_test!(oracle_raid6, RaidLevel::Raid6);
level_test!(oracle_raid10, RaidLevel::Raid10);
level_test!(oracle_f1, RaidLevel::F1);
level_test!(oracle_raid10_far_2, RaidLevel::Raid10Far, 2);
level_test!(oracle_raid10_far_3, RaidLevel::Raid10Far, 3);
level_test!(oracle_raid10_far_4, RaidLevel::Raid10Far, 4);
level_test!(oracle_raid10_far_5, RaidLevel::Raid10Far, 5);
