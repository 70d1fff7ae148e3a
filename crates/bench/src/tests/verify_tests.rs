use super::{mem, quick};
use crate::verify::{check_records, fill_records};
use crate::{
    run, run_with, verify_pass, BenchError, Region, RunOptions, RunResult, VerifyKind, VerifyMap,
    VerifyState, Workload,
};
use async_trait::async_trait;
use block::{BlockResult, Bytes, FaultVolume, Geometry, Volume, VolumeRef};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

#[derive(Clone, Copy, PartialEq, Debug)]
enum Fault {
    /// Acknowledge the write without writing anything.
    Lose,
    /// Write the data one I/O block further on (or back, at the end of the volume).
    Misdirect,
    /// Flip one bit of the data on the way down.
    FlipBit,
}

/// Injects `fault` into the writes numbered `first`, `first + every`, ... (0-based).
struct Faulty {
    inner: VolumeRef,
    fault: Fault,
    first: u64,
    every: u64,
    writes: AtomicU64,
    injected: AtomicU64,
}

impl Faulty {
    fn new(inner: VolumeRef, fault: Fault, first: u64, every: u64) -> Arc<Self> {
        Arc::new(Faulty {
            inner,
            fault,
            first,
            every,
            writes: AtomicU64::new(0),
            injected: AtomicU64::new(0),
        })
    }
}

#[async_trait]
impl Volume for Faulty {
    fn geometry(&self) -> Geometry {
        self.inner.geometry()
    }
    async fn read(&self, lba: u64, blocks: u32) -> BlockResult<Bytes> {
        self.inner.read(lba, blocks).await
    }
    async fn write(&self, lba: u64, data: Bytes, fua: bool) -> BlockResult<()> {
        let n = self.writes.fetch_add(1, Ordering::SeqCst);
        if n < self.first || !(n - self.first).is_multiple_of(self.every) {
            return self.inner.write(lba, data, fua).await;
        }
        self.injected.fetch_add(1, Ordering::SeqCst);
        let g = self.inner.geometry();
        let blocks = data.len() as u64 / g.block_size_bytes as u64;
        match self.fault {
            Fault::Lose => Ok(()),
            Fault::Misdirect => {
                let to = if lba + 2 * blocks <= g.block_count {
                    lba + blocks
                } else {
                    lba - blocks
                };
                self.inner.write(to, data, fua).await
            }
            Fault::FlipBit => {
                let mut v = data.to_vec();
                let bit = (n as usize * 7919) % (v.len() * 8);
                v[bit / 8] ^= 1 << (bit % 8);
                self.inner.write(lba, Bytes::from(v), fua).await
            }
        }
    }
    async fn flush(&self) -> BlockResult<()> {
        self.inner.flush().await
    }
    async fn discard(&self, lba: u64, blocks: u64) -> BlockResult<()> {
        self.inner.discard(lba, blocks).await
    }
}

fn verifying(bs: u32, read_pct: u8, random_pct: u8, region_blocks: u64) -> Workload {
    let mut w = quick("verify", bs, read_pct, random_pct);
    w.verify = true;
    w.region_size_bytes = Some(region_blocks * bs as u64);
    w.duration_secs = 3.0;
    w.io_count_max = Some(20_000);
    w
}

fn first_kind(r: &RunResult) -> VerifyKind {
    let v = r.verify.as_ref().expect("verify summary");
    assert!(!v.passed && v.failures >= 1, "{v:?}");
    v.first_failure.as_ref().expect("first failure").kind
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn detects_a_lost_write() {
    let f = Faulty::new(mem(4096, 1024), Fault::Lose, 300, 97);
    let r = run(f.clone(), &verifying(4096, 50, 100, 256), None)
        .await
        .unwrap();
    assert!(f.injected.load(Ordering::SeqCst) >= 1);
    assert_eq!(first_kind(&r), VerifyKind::LostWrite);
    assert!(!r.verify_passed());
    // The run stops issuing at the first failure.
    assert!(r.reads + r.writes < 20_000);
    assert!(crate::summary_line(std::slice::from_ref(&r)).contains("verify=failed lba="));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn detects_a_bit_flip() {
    let f = Faulty::new(mem(4096, 1024), Fault::FlipBit, 300, 97);
    let r = run(f, &verifying(8192, 50, 100, 128), None).await.unwrap();
    assert_eq!(first_kind(&r), VerifyKind::Corrupt);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn detects_a_misdirected_write_during_the_run() {
    let f = Faulty::new(mem(4096, 1024), Fault::Misdirect, 300, 97);
    let r = run(f, &verifying(4096, 50, 100, 256), None).await.unwrap();
    // Reading the target finds a record of another LBA (misplaced); reading the
    // intended block finds the old generation (lost): whichever comes first.
    let k = first_kind(&r);
    assert!(
        matches!(k, VerifyKind::Misplaced | VerifyKind::LostWrite),
        "{k:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_pass_classifies_a_misdirected_write() {
    // One sequential writer, no wrap, over a whole volume: the last write (block 63)
    // is misdirected one block back, onto block 62, which is never written again.
    let vol = mem(4096, 64);
    let f = Faulty::new(vol.clone(), Fault::Misdirect, 63, 1_000_000);
    let mut w = verifying(4096, 0, 0, 64);
    w.threads = 1;
    w.queue_depth = 1;
    w.io_count_max = Some(64);
    let map = Arc::new(VerifyMap::new(w.region(&vol.geometry()).unwrap()));
    let r = run_with(
        f.clone(),
        &w,
        RunOptions {
            verify_map: Some(map.clone()),
            ..RunOptions::default()
        },
    )
    .await
    .unwrap();
    assert_eq!(r.writes, 64);
    assert_eq!(f.injected.load(Ordering::SeqCst), 1);
    let rep = verify_pass(vol, &map.snapshot(true)).await.unwrap();
    assert!(!rep.passed());
    assert_eq!(rep.count_of(VerifyKind::Misplaced), 1, "{rep:?}");
    assert_eq!(rep.count_of(VerifyKind::LostWrite), 1, "{rep:?}");
    let mis = rep
        .failures
        .iter()
        .find(|f| f.kind == VerifyKind::Misplaced)
        .unwrap();
    assert_eq!((mis.lba, mis.found_lba), (62, Some(63)));
    assert_eq!(rep.blocks_checked, 64);
}

/// Reorders completions: every I/O yields a pseudo-random number of times.
struct Jitter {
    inner: VolumeRef,
    n: AtomicU64,
}

impl Jitter {
    async fn jitter(&self) {
        let n = self.n.fetch_add(1, Ordering::Relaxed);
        for _ in 0..(n.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 61) {
            tokio::task::yield_now().await;
        }
    }
}

#[async_trait]
impl Volume for Jitter {
    fn geometry(&self) -> Geometry {
        self.inner.geometry()
    }
    async fn read(&self, lba: u64, blocks: u32) -> BlockResult<Bytes> {
        self.jitter().await;
        self.inner.read(lba, blocks).await
    }
    async fn write(&self, lba: u64, data: Bytes, fua: bool) -> BlockResult<()> {
        self.jitter().await;
        self.inner.write(lba, data, fua).await
    }
    async fn flush(&self) -> BlockResult<()> {
        self.inner.flush().await
    }
    async fn discard(&self, lba: u64, blocks: u64) -> BlockResult<()> {
        self.inner.discard(lba, blocks).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_false_alarm_under_heavy_concurrency() {
    // 128 I/Os in flight over 64 blocks, and over 4096 blocks; random and sequential.
    for (region_blocks, random_pct) in [(64u64, 100u8), (4096, 100), (4096, 0), (64, 0)] {
        let base = mem(512, 4096 * 8);
        let v: VolumeRef = Arc::new(Jitter {
            inner: base.clone(),
            n: AtomicU64::new(0),
        });
        let mut w = verifying(4096, 50, random_pct, region_blocks);
        w.threads = 8;
        w.queue_depth = 16;
        w.duration_secs = 0.5;
        w.io_count_max = Some(30_000);
        let map = Arc::new(VerifyMap::new(w.region(&v.geometry()).unwrap()));
        let opts = RunOptions {
            verify_map: Some(map.clone()),
            ..RunOptions::default()
        };
        let r = run_with(v, &w, opts).await.unwrap();
        let s = r.verify.clone().unwrap();
        assert!(
            s.passed,
            "region {region_blocks} random {random_pct}: {s:?}"
        );
        assert!(s.reads_checked > 1000, "{s:?}");
        let rep = verify_pass(base, &map.snapshot(true)).await.unwrap();
        assert!(rep.passed(), "{rep:?}");
        assert!(rep.blocks_checked > 0);
        assert_eq!(rep.blocks_checked + rep.blocks_unwritten, region_blocks);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_and_torn_writes_are_uncertain_not_false_alarms() {
    let fv = Arc::new(FaultVolume::new(mem(512, 2048)));
    let plan = fv.plan();
    let mut w = verifying(4096, 50, 100, 64);
    w.io_count_max = Some(4000);
    let map = Arc::new(VerifyMap::new(w.region(&fv.geometry()).unwrap()));
    let opts = RunOptions {
        verify_map: Some(map.clone()),
        ..RunOptions::default()
    };
    // Fill, then tear one write after 3 of its 8 sectors, and fail writes to a range.
    let r1 = run_with(fv.clone(), &w, opts.clone()).await.unwrap();
    assert!(r1.verify_passed());
    plan.lock().tear_next_write_after_blocks = Some(3);
    plan.lock().bad_write_blocks = std::iter::once(80..96).collect();
    let r2 = run_with(fv.clone(), &w, opts.clone()).await.unwrap();
    assert!(r2.write_errors >= 2, "{}", r2.write_errors);
    assert!(r2.verify_passed(), "{:?}", r2.verify);
    plan.lock().bad_write_blocks.clear();
    let r3 = run_with(fv.clone(), &w, opts).await.unwrap();
    assert!(r3.verify_passed(), "{:?}", r3.verify);
    assert!(verify_pass(fv, &map.snapshot(true)).await.unwrap().passed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn state_file_roundtrip_and_crash_check() {
    let dir = std::env::temp_dir().join(format!("bench-verify-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("state.bin");
    let vol = mem(4096, 512);
    let mut w = verifying(4096, 30, 100, 256);
    w.region_offset_bytes = 64 * 4096;
    w.duration_secs = 1.3;
    w.io_count_max = None;
    let opts = RunOptions {
        verify_state_path: Some(path.clone()),
        checkpoint_interval_secs: 1,
        ..RunOptions::default()
    };
    let r = run_with(vol.clone(), &w, opts).await.unwrap();
    assert!(r.verify_passed());
    let state = VerifyState::load(&path).unwrap();
    assert!(state.complete);
    assert_eq!(state.region.offset_bytes, 64 * 4096);
    assert!(state.written_blocks() > 200);
    assert_eq!(VerifyState::from_bytes(&state.to_bytes()).unwrap(), state);
    // A second process would check this way after restarting the server.
    let rep = verify_pass(vol.clone(), &state).await.unwrap();
    assert!(rep.passed(), "{rep:?}");
    // A server that lost everything fails the check.
    let rep = verify_pass(mem(4096, 512), &state).await.unwrap();
    assert_eq!(rep.count_of(VerifyKind::LostWrite), state.written_blocks());
    // A continuing run under the loaded map keeps the history.
    let map = Arc::new(VerifyMap::from_state(&state));
    let opts = RunOptions {
        verify_map: Some(map.clone()),
        ..RunOptions::default()
    };
    w.duration_secs = 0.3;
    assert!(run_with(vol.clone(), &w, opts)
        .await
        .unwrap()
        .verify_passed());
    assert!(verify_pass(vol.clone(), &map.snapshot(true))
        .await
        .unwrap()
        .passed());
    // The old state is now stale: generations moved on, still no false alarm for a
    // lower bound, and an old complete state sees "future" generations.
    let rep = verify_pass(vol.clone(), &state).await.unwrap();
    assert!(rep.count_of(VerifyKind::FutureGeneration) > 0);
    let mut lower = state.clone();
    lower.complete = false;
    assert!(verify_pass(vol.clone(), &lower).await.unwrap().passed());
    // Damage is detected.
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[100] ^= 1;
    assert!(matches!(
        VerifyState::from_bytes(&bytes),
        Err(BenchError::StateFormat(_))
    ));
    assert!(matches!(
        VerifyState::from_bytes(b"nope"),
        Err(BenchError::StateFormat(_))
    ));
    // A map for another region is refused.
    let other = Arc::new(VerifyMap::new(Region {
        offset_bytes: 0,
        io_block_bytes: 4096,
        blocks: 10,
        volume_block_bytes: 4096,
    }));
    let opts = RunOptions {
        verify_map: Some(other),
        ..RunOptions::default()
    };
    assert!(matches!(
        run_with(vol, &w, opts).await,
        Err(BenchError::VerifyMapMismatch(_))
    ));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn record_checks_classify_each_kind() {
    let region = Region {
        offset_bytes: 0,
        io_block_bytes: 8192,
        blocks: 16,
        volume_block_bytes: 512,
    };
    let mut buf = vec![0u8; 8192];
    fill_records(&mut buf, 512, region.lba_of(3), 77, 5, 0x10002);
    let kind = |data: &[u8], lo, hi| {
        check_records(data, &region, 77, 3, lo, hi)
            .err()
            .map(|f| f.kind)
    };
    assert_eq!(kind(&buf, 5, 5), None);
    assert_eq!(kind(&buf, 4, 6), None);
    assert_eq!(kind(&buf, 6, 6), Some(VerifyKind::LostWrite));
    assert_eq!(kind(&buf, 1, 4), Some(VerifyKind::FutureGeneration));
    assert_eq!(
        check_records(&buf, &region, 78, 3, 1, 9).unwrap_err().kind,
        VerifyKind::LostWrite
    );
    assert_eq!(
        check_records(&buf, &region, 77, 4, 1, 9).unwrap_err().kind,
        VerifyKind::Misplaced
    );
    assert_eq!(kind(&vec![0u8; 8192], 1, 1), Some(VerifyKind::LostWrite));
    assert_eq!(kind(&vec![0u8; 8192], 0, 0), None);
    let mut bad = buf.clone();
    bad[512 * 7 + 300] ^= 4;
    let f = check_records(&bad, &region, 77, 3, 5, 5).unwrap_err();
    assert_eq!((f.kind, f.lba), (VerifyKind::Corrupt, 3 * 16 + 7));
    // Never-acknowledged blocks accept anything but a valid record of ours that is
    // misplaced or too new.
    assert_eq!(kind(&bad[..512 * 7], 0, 5), None);
    assert_eq!(
        kind(&bad[..512 * 7], 0, 1),
        Some(VerifyKind::FutureGeneration)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefill_makes_every_read_checkable() {
    let vol = mem(512, 4096);
    let mut w = verifying(8192, 100, 100, 200);
    w.io_count_max = Some(3000);
    let map = Arc::new(VerifyMap::new(w.region(&vol.geometry()).unwrap()));
    assert_eq!(
        crate::prefill(vol.clone(), map.clone(), 8).await.unwrap(),
        0
    );
    assert_eq!(map.snapshot(true).written_blocks(), 200);
    let opts = RunOptions {
        verify_map: Some(map.clone()),
        ..RunOptions::default()
    };
    let r = run_with(vol.clone(), &w, opts).await.unwrap();
    let v = r.verify.unwrap();
    assert!(
        v.passed && v.reads_unwritten == 0 && v.reads_checked == 3000,
        "{v:?}"
    );
    let rep = verify_pass(vol.clone(), &map.snapshot(true)).await.unwrap();
    assert_eq!((rep.blocks_checked, rep.blocks_unwritten), (200, 0));
    // Lose the content of one block behind the map's back: the read-only run notices.
    vol.discard(region_lba(&map, 17), 16).await.unwrap();
    let opts = RunOptions {
        verify_map: Some(map.clone()),
        ..RunOptions::default()
    };
    w.io_count_max = Some(20_000);
    let r = run_with(vol, &w, opts).await.unwrap();
    let f = r.verify.unwrap().first_failure.unwrap();
    assert_eq!(
        (f.kind, f.block, f.found_gen),
        (VerifyKind::LostWrite, 17, None)
    );
}

fn region_lba(map: &VerifyMap, block: u64) -> u64 {
    map.region().lba_of(block)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn torn_blocks_under_writes_in_flight_are_told_apart() {
    let vol = mem(4096, 256);
    let mut w = verifying(4096, 0, 100, 256);
    w.duration_secs = 0.3;
    let map = Arc::new(VerifyMap::new(w.region(&vol.geometry()).unwrap()));
    let opts = RunOptions {
        verify_map: Some(map.clone()),
        ..RunOptions::default()
    };
    assert!(run_with(vol.clone(), &w, opts)
        .await
        .unwrap()
        .verify_passed());
    let mut state = map.snapshot(true);
    let written: Vec<u64> = (0..state.acked.len() as u64)
        .filter(|&b| state.acked[b as usize] > 0)
        .take(2)
        .collect();
    let (in_flight, settled) = (written[0], written[1]);
    // a write to `in_flight` was issued (generation + 1) and never acknowledged
    state.uncertain = vec![(in_flight, state.acked[in_flight as usize] + 1)];
    let garbage = Bytes::from(vec![0xa5u8; 4096]);
    let lba = |b: u64| state.region.lba_of(b);
    vol.write(lba(in_flight), garbage.clone(), false)
        .await
        .unwrap();
    let rep = verify_pass(vol.clone(), &state).await.unwrap();
    assert!(!rep.passed());
    assert_eq!(rep.in_flight_failures, 1, "{rep:?}");
    assert!(rep.passed_allowing_torn_in_flight());
    // damage to a block no write was in flight to is never excused
    vol.write(lba(settled), garbage, false).await.unwrap();
    let rep = verify_pass(vol.clone(), &state).await.unwrap();
    assert_eq!(rep.failure_count(), 2);
    assert_eq!(rep.in_flight_failures, 1);
    assert!(!rep.passed_allowing_torn_in_flight());
    // a checkpoint (incomplete state) knows no upper bound: nothing is excused
    state.complete = false;
    let rep = verify_pass(vol, &state).await.unwrap();
    assert_eq!(rep.in_flight_failures, 0);
    assert!(!rep.passed_allowing_torn_in_flight());
}
