//! Shared helpers for the raid integration tests.
#![allow(dead_code)]

use block::{Bytes, FaultPlan, FaultVolume, MemVolume, Volume, VolumeRef};
use parking_lot::Mutex;
use raid::{Member, Pool, PoolConfig, RaidLevel};
use std::sync::Arc;

pub const BS: u32 = 512;
pub const CHUNK: u32 = 8 * 1024;
/// reserved (1 MiB superblocks + 256 KiB journal -> 2 MiB) + 32 chunks data
pub const MEMBER_BLOCKS: u64 = (2 << 20) / 512 + 32 * 16;

pub struct TestMember {
    pub mem: Arc<MemVolume>,
    pub fault: Arc<FaultVolume>,
    pub plan: Arc<Mutex<FaultPlan>>,
}

pub fn member(blocks: u64) -> TestMember {
    let mem = Arc::new(MemVolume::new(BS, blocks));
    let fault = Arc::new(FaultVolume::new(mem.clone()));
    let plan = fault.plan();
    TestMember { mem, fault, plan }
}

impl TestMember {
    pub fn as_member(&self, name: &str) -> Member {
        Member::new(name, self.fault.clone() as VolumeRef)
    }
}

pub fn members_for(level: RaidLevel) -> usize {
    match level {
        RaidLevel::Raid0 => 3,
        RaidLevel::Raid1 => 3,
        RaidLevel::Raid5 => 4,
        RaidLevel::Raid6 => 5,
        RaidLevel::Raid10 => 4,
        RaidLevel::Raid10Far => 4,
        RaidLevel::F1 => 4,
    }
}

pub fn config(level: RaidLevel) -> PoolConfig {
    let mut c = PoolConfig::new("t", level);
    c.chunk_bytes = CHUNK;
    c.journal_bytes = Some(256 * 1024);
    c.rebuild_rate_mb_s = 0;
    c
}

pub async fn make_pool(level: RaidLevel, n: usize) -> (Pool, Vec<TestMember>) {
    let ms: Vec<TestMember> = (0..n).map(|_| member(MEMBER_BLOCKS)).collect();
    let pool = Pool::create(
        config(level),
        ms.iter()
            .enumerate()
            .map(|(i, m)| m.as_member(&format!("m{i}")))
            .collect(),
        vec![],
    )
    .await
    .expect("create");
    (pool, ms)
}

pub fn pattern(seed: u64, blocks: u64) -> Bytes {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut v = vec![0u8; (blocks * BS as u64) as usize];
    for b in v.iter_mut() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = x as u8;
    }
    Bytes::from(v)
}

pub async fn check_all(pool: &dyn Volume, oracle: &MemVolume) {
    let n = pool.geometry().block_count;
    let step = 64u64;
    let mut at = 0;
    while at < n {
        let c = step.min(n - at);
        let got = pool.read(at, c as u32).await.expect("read");
        let want = oracle.read(at, c as u32).await.unwrap();
        assert!(got == want, "mismatch in blocks {at}..{}", at + c);
        at += c;
    }
}

/// Polls every future concurrently on this task; outputs in order.
pub async fn futures_join<F: std::future::Future>(
    futs: impl IntoIterator<Item = F>,
) -> Vec<F::Output> {
    let mut futs: Vec<std::pin::Pin<Box<F>>> = futs.into_iter().map(Box::pin).collect();
    let mut out: Vec<Option<F::Output>> = futs.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (i, f) in futs.iter_mut().enumerate() {
            if out[i].is_none() {
                match f.as_mut().poll(cx) {
                    std::task::Poll::Ready(v) => out[i] = Some(v),
                    std::task::Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            std::task::Poll::Pending
        } else {
            std::task::Poll::Ready(())
        }
    })
    .await;
    out.into_iter().map(|o| o.expect("ready")).collect()
}

/// Writes the whole pool (and the oracle) with requests of varying sizes.
pub async fn fill(pool: &Pool, oracle: &MemVolume, seed: u64) {
    let total = pool.geometry().block_count;
    let mut at = 0;
    let mut i = 0;
    while at < total {
        let n = (37 + (i * 13) % 90).min(total - at);
        let d = pattern(seed + i, n);
        pool.write(at, d.clone(), false).await.unwrap();
        oracle.write(at, d, false).await.unwrap();
        at += n;
        i += 1;
    }
}

/// A new pool of `level` over `members`, its initial resync done, filled
/// with the pattern of `seed` (also written to the returned oracle) and
/// flushed.
pub async fn create_filled(level: RaidLevel, members: Vec<Member>, seed: u64) -> (Pool, MemVolume) {
    let pool = Pool::create(config(level), members, vec![])
        .await
        .expect("create");
    pool.wait_idle().await;
    let oracle = MemVolume::new(BS, pool.geometry().block_count);
    fill(&pool, &oracle, seed).await;
    pool.flush().await.unwrap();
    (pool, oracle)
}

/// The test members as pool members named m0, m1, ...
pub fn members_of(ms: &[TestMember]) -> Vec<Member> {
    ms.iter()
        .enumerate()
        .map(|(i, m)| m.as_member(&format!("m{i}")))
        .collect()
}
