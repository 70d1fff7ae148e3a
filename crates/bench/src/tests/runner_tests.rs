use super::{mem, quick};
use crate::{run, run_with, BenchError, ProgressSample, RunOptions, Workload};
use async_trait::async_trait;
use block::{BlockResult, Bytes, DelayVolume, FaultVolume, Geometry, Volume, VolumeRef};
use parking_lot::Mutex;
use std::sync::Arc;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mem_volume_run_counts_everything() {
    let v = mem(4096, 16384);
    let w = quick("4k-randrw50", 4096, 50, 100);
    let r = run(v, &w, None).await.unwrap();
    let ios = r.reads + r.writes;
    assert!(ios > 1000, "too few I/Os: {ios}");
    assert_eq!(r.errors(), 0);
    assert_eq!(r.latency.count, ios);
    assert_eq!(r.read_latency.count, r.reads);
    assert_eq!(r.write_latency.count, r.writes);
    assert_eq!(r.read_bytes, r.reads * 4096);
    assert!(
        (r.measured_secs - 0.3).abs() < 0.05,
        "measured {}",
        r.measured_secs
    );
    assert!((r.iops - ios as f64 / r.measured_secs).abs() < 1.0);
    assert!((r.mb_per_sec - ios as f64 * 4096.0 / r.measured_secs / 1e6).abs() < 0.01);
    assert!((r.mib_per_sec * 1048576.0 - r.mb_per_sec * 1e6).abs() < 1.0);
    assert!(r.latency.p50_us <= r.latency.p99_us && r.latency.p99_us <= r.latency.p999_us);
    assert!(r.latency.p999_us <= r.latency.max_us);
    assert!(r.cpu_pct_one_core > 0.0 && r.cpu_us_per_io > 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delay_volume_iops_follow_littles_law() {
    let delay = Duration::from_millis(10);
    let v: VolumeRef = Arc::new(DelayVolume::new(mem(4096, 4096), delay, delay));
    let mut w = quick("4k-randread", 4096, 70, 100);
    w.threads = 4;
    w.queue_depth = 8;
    w.duration_secs = 1.0;
    w.ramp_up_secs = 0.2;
    let r = run(v, &w, None).await.unwrap();
    let expected = 32.0 / delay.as_secs_f64();
    assert!(
        r.iops > 0.5 * expected && r.iops < 1.2 * expected,
        "iops {} vs expected {expected}",
        r.iops
    );
    // The timer rounds sleeps up to the next millisecond, and a loaded machine
    // schedules late: wide bounds above, none below the injected delay.
    assert!(
        r.latency.p50_us >= 10_000.0 && r.latency.p50_us < 15_000.0,
        "p50 {}",
        r.latency.p50_us
    );
    assert!(
        r.latency.avg_us >= 10_000.0 && r.latency.avg_us < 16_000.0,
        "avg {}",
        r.latency.avg_us
    );
    assert!(r.read_latency.p50_us >= 10_000.0 && r.write_latency.p50_us >= 10_000.0);
    // Ramp-up excluded: the measured window is the duration, not duration + ramp-up.
    assert!((r.measured_secs - 1.0).abs() < 0.05);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_write_mix_follows_spec() {
    for (read_pct, lo, hi) in [(67u8, 0.64, 0.70), (0, 0.0, 0.0), (100, 1.0, 1.0)] {
        let w = quick("mix", 4096, read_pct, 100);
        let r = run(mem(4096, 8192), &w, None).await.unwrap();
        let frac = r.reads as f64 / (r.reads + r.writes) as f64;
        assert!(
            frac >= lo && frac <= hi,
            "read_pct {read_pct}: read fraction {frac}"
        );
        assert!((r.read_iops + r.write_iops - r.iops).abs() < 1e-6);
    }
}

/// Records the LBA of every read in call order.
/// Records the LBA of every read. Its reads wait until reads below and at or
/// above `split` have both arrived: each of two threads walking the two
/// halves then gets its share of a shared I/O budget whatever the machine's
/// load (on a loaded machine one thread took the whole budget before the
/// other issued a read).
struct Recorder {
    inner: VolumeRef,
    lbas: Mutex<Vec<u64>>,
    split: u64,
    /// (a read below `split` seen, one at or above it seen)
    seen: tokio::sync::watch::Sender<(bool, bool)>,
}

#[async_trait]
impl Volume for Recorder {
    fn geometry(&self) -> Geometry {
        self.inner.geometry()
    }
    async fn read(&self, lba: u64, blocks: u32) -> BlockResult<Bytes> {
        self.lbas.lock().push(lba);
        let high = lba >= self.split;
        self.seen
            .send_modify(|s| if high { s.1 = true } else { s.0 = true });
        let mut rx = self.seen.subscribe();
        let _ = rx.wait_for(|&(low, high)| low && high).await;
        self.inner.read(lba, blocks).await
    }
    async fn write(&self, lba: u64, data: Bytes, fua: bool) -> BlockResult<()> {
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
async fn sequential_walks_each_threads_slice_in_order() {
    let rec = Arc::new(Recorder {
        inner: mem(512, 1024),
        lbas: Mutex::new(Vec::new()),
        split: 48 * 8,
        seen: tokio::sync::watch::channel((false, false)).0,
    });
    // 1024 sectors = 128 blocks of 4K; region from block 16, 64 blocks: slices of 32.
    let mut w = quick("seq", 4096, 100, 0);
    w.threads = 2;
    w.queue_depth = 4;
    w.region_offset_bytes = 16 * 4096;
    w.region_size_bytes = Some(64 * 4096);
    w.io_count_max = Some(400);
    let r = run(rec.clone(), &w, None).await.unwrap();
    assert!(r.reads >= 390, "reads {}", r.reads);
    let lbas = rec.lbas.lock().clone();
    for (slice_start, slice_blocks) in [(16u64, 32u64), (48, 32)] {
        let mine: Vec<u64> = lbas
            .iter()
            .map(|l| l / 8)
            .filter(|b| *b >= slice_start && *b < slice_start + slice_blocks)
            .collect();
        // the I/O budget is shared: on a loaded machine one worker may take most
        // of it, so only ask that each worker walked its slice for a while
        assert!(mine.len() >= 4, "slice {slice_start}: {} reads", mine.len());
        assert_eq!(
            mine[0], slice_start,
            "a thread starts at the start of its slice"
        );
        for pair in mine.windows(2) {
            let next = slice_start + (pair[0] - slice_start + 1) % slice_blocks;
            assert_eq!(
                pair[1], next,
                "not sequential in slice {slice_start}: {pair:?}"
            );
        }
    }
    assert!(
        lbas.iter()
            .all(|l| l % 8 == 0 && *l >= 16 * 8 && *l < 80 * 8),
        "outside the region"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn io_errors_are_counted_not_fatal() {
    let fv = Arc::new(FaultVolume::new(mem(4096, 1024)));
    fv.plan().lock().bad_write_blocks = std::iter::once(0..512).collect();
    let w = quick("4k-randrw", 4096, 50, 100);
    let r = run(fv, &w, None).await.unwrap();
    assert!(r.write_errors > 0);
    assert_eq!(r.read_errors, 0);
    assert!(r.reads > 0 && r.writes > 0);
    assert!(r.first_error.as_deref().unwrap_or("").contains("write"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn io_count_max_stops_the_run() {
    let mut w = quick("4k", 4096, 50, 100);
    w.duration_secs = 30.0;
    w.io_count_max = Some(500);
    let t = std::time::Instant::now();
    let r = run(mem(4096, 1024), &w, None).await.unwrap();
    assert!(t.elapsed() < Duration::from_secs(5));
    assert_eq!(r.reads + r.writes, 500);
    assert!(r.measured_secs < 5.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn progress_sink_gets_samples_about_once_a_second() {
    let samples: Arc<Mutex<Vec<ProgressSample>>> = Arc::default();
    let s2 = samples.clone();
    let mut w = quick("4k", 4096, 100, 100);
    w.duration_secs = 1.3;
    w.ramp_up_secs = 1.2;
    let opts = RunOptions {
        progress: Some(Arc::new(move |s: &ProgressSample| s2.lock().push(*s))),
        ..RunOptions::default()
    };
    let r = run_with(mem(4096, 1024), &w, opts).await.unwrap();
    let s = samples.lock().clone();
    assert_eq!(s.len(), 3, "{s:?}");
    assert!(s[0].ramping && !s[1].ramping);
    assert!(s[0].iops > 0.0 && s[1].mbps > 0.0);
    assert!(s[2].done && !s[1].done);
    assert_eq!(r.timeline.len(), 2);
    assert!((r.timeline[0].elapsed_secs - 1.0).abs() < 0.2);
}

#[tokio::test]
async fn invalid_workloads_are_rejected() {
    let v = mem(4096, 1024);
    let mut cases: Vec<(&str, Workload)> = Vec::new();
    cases.push(("block_size_bytes", quick("x", 1000, 50, 50)));
    let mut w = quick("x", 4096, 101, 50);
    cases.push(("read_pct", w.clone()));
    w.read_pct = 50;
    w.region_offset_bytes = 100;
    cases.push(("region_offset_bytes", w.clone()));
    w.region_offset_bytes = 0;
    w.region_size_bytes = Some(4096 * 2000);
    cases.push(("region_size_bytes", w.clone()));
    w.region_size_bytes = None;
    w.threads = 0;
    cases.push(("threads", w.clone()));
    for (field, w) in cases {
        match run(v.clone(), &w, None).await {
            Err(BenchError::InvalidWorkload { field: f, .. }) => assert_eq!(f, field),
            other => panic!("{field}: expected InvalidWorkload, got {other:?}"),
        }
    }
}

#[test]
fn standard_suite_has_the_eight_report_patterns() {
    let s = crate::Suite::standard();
    let names: Vec<&str> = s.workloads.iter().map(|w| w.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "4k-randread",
            "4k-randwrite",
            "8k-randrw67",
            "8k-seqrw67",
            "64k-seqread",
            "64k-seqwrite",
            "256k-seqread",
            "256k-seqwrite"
        ]
    );
    assert!(s
        .workloads
        .iter()
        .all(|w| w.threads == 8 && w.queue_depth == 8));
    let w = s.get("8k-seqrw67").unwrap();
    assert_eq!(
        (w.block_size_bytes, w.read_pct, w.random_pct),
        (8192, 67, 0)
    );
    let w = s.get("4k-randwrite").unwrap();
    assert_eq!(
        (w.block_size_bytes, w.read_pct, w.random_pct),
        (4096, 0, 100)
    );
    let json = serde_json::to_string(&s).unwrap();
    assert_eq!(serde_json::from_str::<crate::Suite>(&json).unwrap(), s);
    let short = s
        .clone()
        .with_duration_secs(2.0, 0.5)
        .with_threads_qd(2, 16)
        .only(&["64k-seqread"]);
    assert_eq!(short.workloads.len(), 1);
    assert_eq!(short.workloads[0].queue_depth, 16);
    // A minimal JSON spec takes the defaults of the optional fields.
    let w: Workload = serde_json::from_str(
        r#"{"name":"a","block_size_bytes":4096,"read_pct":100,"random_pct":100,"threads":1,"queue_depth":1,"duration_secs":1}"#,
    )
    .unwrap();
    assert!(!w.verify && w.region_size_bytes.is_none() && w.ramp_up_secs == 0.0);
}
