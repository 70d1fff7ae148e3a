//! `SimDisk` over `MemVolume` under tokio's paused clock: data correctness, timing
//! of the model in virtual time (deterministic), failures and statistics.

use block::{BlockError, Bytes, MemVolume, Volume, VolumeRef};
use disk::sim::{
    HddParams, SimClock, SimDisk, SimDiskConfig, SimError, SimModelConfig, SplitMix64, SsdParams,
};
use std::sync::Arc;
use tokio::time::Instant;

const BS: u32 = 4096;
/// tokio nanoseconds per model nanosecond: 1 µs of model resolution.
const SLOWDOWN: u32 = 1000;
const CLOCK: SimClock = SimClock::Tokio { slowdown: SLOWDOWN };

fn store(blocks: u64) -> VolumeRef {
    Arc::new(MemVolume::new(BS, blocks))
}

fn disk(model: SimModelConfig, blocks: u64) -> SimDisk {
    let cfg = SimDiskConfig {
        model,
        queue_depth_max: 64,
    };
    SimDisk::from_config_with_clock(store(blocks), &cfg, CLOCK).expect("sim disk")
}

fn hdd(blocks: u64) -> SimDisk {
    disk(SimModelConfig::Hdd(HddParams::default()), blocks)
}

fn ssd(blocks: u64) -> SimDisk {
    disk(SimModelConfig::Ssd(SsdParams::default()), blocks)
}

/// Model seconds elapsed since `t0`.
fn model_secs(t0: Instant) -> f64 {
    t0.elapsed().as_secs_f64() / SLOWDOWN as f64
}

fn pattern(seed: u64, blocks: usize) -> Bytes {
    let mut rng = SplitMix64::new(seed);
    let mut v = vec![0u8; blocks * BS as usize];
    for chunk in v.chunks_mut(8) {
        chunk.copy_from_slice(&rng.next_u64().to_le_bytes()[..chunk.len()]);
    }
    Bytes::from(v)
}

#[tokio::test(start_paused = true)]
async fn sim_data_roundtrip_on_both_models() {
    for d in [hdd(1 << 16), ssd(1 << 16)] {
        let mut rng = SplitMix64::new(7);
        let mut written = Vec::new();
        for i in 0..40u64 {
            let blocks = 1 + rng.below(16) as usize;
            let lba = rng.below((1 << 16) - 16);
            let data = pattern(i, blocks);
            d.write(lba, data.clone(), i % 5 == 0).await.expect("write");
            written.push((lba, data));
        }
        d.flush().await.expect("flush");
        // Later writes win where ranges overlap: check against a replay on a MemVolume.
        let oracle = MemVolume::new(BS, 1 << 16);
        for (lba, data) in &written {
            oracle
                .write(*lba, data.clone(), false)
                .await
                .expect("oracle");
        }
        for (lba, data) in &written {
            let blocks = (data.len() / BS as usize) as u32;
            let got = d.read(*lba, blocks).await.expect("read");
            assert_eq!(got, oracle.read(*lba, blocks).await.expect("oracle read"));
        }
        let (lba, data) = &written[0];
        let blocks = (data.len() / BS as usize) as u64;
        d.write_zeroes(*lba, blocks, false)
            .await
            .expect("write zeroes");
        let zeroes = d.read(*lba, blocks as u32).await.expect("read");
        assert!(zeroes.iter().all(|&b| b == 0));
        d.write(*lba, data.clone(), false).await.expect("rewrite");
        d.discard(*lba, blocks).await.expect("discard");
        let zeroes = d.read(*lba, blocks as u32).await.expect("read");
        assert!(
            zeroes.iter().all(|&b| b == 0),
            "thin store reads zeroes after discard"
        );
        let s = d.stats();
        assert_eq!(s.writes, 41);
        assert_eq!(s.flushes, 1);
        assert_eq!(s.trims, 2);
        assert_eq!(s.errors, 0);
        assert!(s.reads >= 42);
        assert_eq!(
            s.written_bytes,
            written.iter().map(|(_, d)| d.len() as u64).sum::<u64>() + data.len() as u64
        );
    }
}

#[tokio::test(start_paused = true)]
async fn sim_out_of_range_is_rejected_before_the_model() {
    let d = hdd(1024);
    let t0 = Instant::now();
    assert!(matches!(
        d.read(1020, 8).await,
        Err(BlockError::OutOfRange { .. })
    ));
    assert_eq!(
        t0.elapsed().as_nanos(),
        0,
        "no device time for a rejected request"
    );
}

async fn qd1_random_reads(d: &SimDisk, n: u64, blocks: u64) -> f64 {
    let mut rng = SplitMix64::new(42);
    let t0 = Instant::now();
    for _ in 0..n {
        d.read(rng.below(blocks), 1).await.expect("read");
    }
    model_secs(t0)
}

#[tokio::test(start_paused = true)]
async fn sim_hdd_qd1_random_reads_take_n_times_the_nominal_latency() {
    let blocks = 1u64 << 28; // 1 TiB, sparse
    let d = hdd(blocks);
    let n = 300;
    let secs = qd1_random_reads(&d, n, blocks).await;
    let nominal = d.nominal().rand_read_4k_iops_qd1;
    let expect = n as f64 / nominal;
    assert!(
        (secs - expect).abs() < expect * 0.05,
        "{n} reads took {secs} s of model time, nominal {expect} s"
    );
}

#[tokio::test(start_paused = true)]
async fn sim_ssd_qd1_random_reads_take_n_times_the_nominal_latency() {
    let blocks = 1u64 << 26; // 256 GiB, sparse
    let d = ssd(blocks);
    let n = 2000;
    let secs = qd1_random_reads(&d, n, blocks).await;
    let expect = n as f64 / d.nominal().rand_read_4k_iops_qd1;
    assert!(
        (secs - expect).abs() < expect * 0.03,
        "{n} reads took {secs} s of model time, nominal {expect} s"
    );
}

#[tokio::test(start_paused = true)]
async fn sim_hdd_qd32_reaches_the_ncq_figure() {
    let blocks = 1u64 << 28;
    let d = Arc::new(hdd(blocks));
    let per_task = 40u64;
    let t0 = Instant::now();
    let mut set = tokio::task::JoinSet::new();
    for task in 0..32u64 {
        let d = Arc::clone(&d);
        set.spawn(async move {
            let mut rng = SplitMix64::new(1000 + task);
            for _ in 0..per_task {
                d.read(rng.below(blocks), 1).await.expect("read");
            }
        });
    }
    while let Some(r) = set.join_next().await {
        r.expect("task");
    }
    let iops = (32 * per_task) as f64 / model_secs(t0);
    let nominal = d.nominal();
    assert!(
        (iops - nominal.rand_read_4k_iops_qd32).abs() < nominal.rand_read_4k_iops_qd32 * 0.10,
        "qd32 {iops} IOPS vs nominal {nominal:?}"
    );
    assert!(iops > 2.0 * nominal.rand_read_4k_iops_qd1);
}

#[tokio::test(start_paused = true)]
async fn sim_failed_disk_returns_io_errors_and_recovers() {
    let d = ssd(1024);
    d.write(0, pattern(1, 1), false).await.expect("write");
    d.fail();
    assert!(d.is_failed());
    assert!(matches!(d.read(0, 1).await, Err(BlockError::Io(_))));
    assert!(matches!(
        d.write(0, pattern(2, 1), false).await,
        Err(BlockError::Io(_))
    ));
    assert!(matches!(d.flush().await, Err(BlockError::Io(_))));
    assert!(matches!(d.discard(0, 1).await, Err(BlockError::Io(_))));
    assert!(matches!(d.block_status(0, 1).await, Err(BlockError::Io(_))));
    assert_eq!(d.stats().errors, 4);
    d.set_failed(false);
    assert_eq!(d.read(0, 1).await.expect("read"), pattern(1, 1));
}

#[tokio::test(start_paused = true)]
async fn sim_slow_range_costs_extra_device_time() {
    let d = ssd(1024);
    d.add_slow_range(100, 10, 50.0);
    let t0 = Instant::now();
    d.read(0, 1).await.expect("read");
    let fast = model_secs(t0);
    let t1 = Instant::now();
    d.read(105, 1).await.expect("read");
    let slow = model_secs(t1);
    assert!(slow - fast > 0.049 && slow - fast < 0.051, "{fast} {slow}");
    d.clear_slow_ranges();
    let t2 = Instant::now();
    d.read(105, 1).await.expect("read");
    assert!(model_secs(t2) < 0.001);
}

#[tokio::test(start_paused = true)]
async fn sim_queue_depth_max_bounds_the_device_queue() {
    // One slot: 8 concurrent SSD reads on 8 dies are served one after another.
    let cfg = SimDiskConfig {
        model: SimModelConfig::Ssd(SsdParams::default()),
        queue_depth_max: 1,
    };
    let d = Arc::new(SimDisk::from_config_with_clock(store(1 << 16), &cfg, CLOCK).expect("disk"));
    let t0 = Instant::now();
    let mut set = tokio::task::JoinSet::new();
    for i in 0..8u64 {
        let d = Arc::clone(&d);
        set.spawn(async move { d.read(i * 16, 1).await.map(|_| ()) });
    }
    while let Some(r) = set.join_next().await {
        r.expect("task").expect("read");
    }
    assert!(model_secs(t0) > 8.0 * 85e-6, "{}", model_secs(t0));
}

#[test]
fn sim_tokio_clock_needs_a_runtime() {
    let cfg = SimDiskConfig::default();
    assert!(matches!(
        SimDisk::from_config_with_clock(store(16), &cfg, CLOCK),
        Err(SimError::NoRuntime)
    ));
}

/// The precise scheduler in real time: correctness only, never timing.
#[tokio::test]
async fn sim_precise_clock_serves_requests() {
    let d = SimDisk::ssd(store(1024), SsdParams::default()).expect("disk");
    for i in 0..20u64 {
        d.write(i, pattern(i, 1), false).await.expect("write");
    }
    for i in 0..20u64 {
        assert_eq!(d.read(i, 1).await.expect("read"), pattern(i, 1));
    }
    let s = disk::sim::scheduler_stats();
    assert!(s.fired > 0, "{s:?}");
}
