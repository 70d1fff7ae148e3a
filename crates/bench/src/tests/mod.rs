//! Tests of the engine over in-memory volumes, verification, reports and charts.

mod chart_tests;
mod report_tests;
mod runner_tests;
mod verify_tests;

use crate::{LatencySummary, RunResult, Workload};
use block::{MemVolume, VolumeRef};
use std::sync::Arc;

/// An in-memory volume of `blocks` logical blocks of `bs` bytes.
pub(crate) fn mem(bs: u32, blocks: u64) -> VolumeRef {
    Arc::new(MemVolume::new(bs, blocks))
}

/// A short workload for tests: 4 threads x 4 QD, 0.3 s, no ramp-up.
pub(crate) fn quick(name: &str, bs: u32, read_pct: u8, random_pct: u8) -> Workload {
    let mut w = Workload::new(name, bs, read_pct, random_pct);
    w.threads = 4;
    w.queue_depth = 4;
    w.duration_secs = 0.3;
    w.ramp_up_secs = 0.0;
    w
}

/// A synthetic result with the given figures (for report and chart tests).
pub(crate) fn fake_result(w: &Workload, iops: f64, lat_avg_us: f64) -> RunResult {
    let mbps = iops * w.block_size_bytes as f64 / 1e6;
    let lat = LatencySummary {
        count: (iops * 10.0) as u64,
        avg_us: lat_avg_us,
        p50_us: lat_avg_us * 0.9,
        p99_us: lat_avg_us * 3.1,
        p999_us: lat_avg_us * 7.3,
        max_us: lat_avg_us * 20.7,
    };
    RunResult {
        name: w.name.clone(),
        spec: w.clone(),
        measured_secs: 10.0,
        reads: (iops * 10.0 * w.read_pct as f64 / 100.0) as u64,
        writes: (iops * 10.0 * (100 - w.read_pct) as f64 / 100.0) as u64,
        read_bytes: 0,
        write_bytes: 0,
        iops,
        read_iops: iops * w.read_pct as f64 / 100.0,
        write_iops: iops * (100 - w.read_pct) as f64 / 100.0,
        mb_per_sec: mbps,
        mib_per_sec: mbps * 1e6 / 1048576.0,
        read_mb_per_sec: mbps * w.read_pct as f64 / 100.0,
        write_mb_per_sec: mbps * (100 - w.read_pct) as f64 / 100.0,
        latency: lat.clone(),
        read_latency: lat.clone(),
        write_latency: lat,
        cpu_pct_one_core: 42.5,
        cpu_us_per_io: 3.25,
        read_errors: 0,
        write_errors: 0,
        first_error: None,
        timeline: vec![crate::TimelinePoint {
            elapsed_secs: 1.0,
            iops,
            mbps,
            ramping: false,
        }],
        verify: None,
    }
}
