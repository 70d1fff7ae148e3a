//! The figures of one run.

use crate::{VerifySummary, Workload};
use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

/// Latency distribution of a set of I/Os, in microseconds.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LatencySummary {
    /// Number of I/Os the figures describe.
    pub count: u64,
    /// Mean.
    pub avg_us: f64,
    /// Median.
    pub p50_us: f64,
    /// 99th percentile.
    pub p99_us: f64,
    /// 99.9th percentile.
    pub p999_us: f64,
    /// Largest.
    pub max_us: f64,
}

/// Histograms record nanoseconds, 3 significant digits, up to one hour.
pub(crate) fn new_histogram() -> Histogram<u64> {
    // Constant, valid bounds: this cannot fail.
    Histogram::new_with_bounds(1, 3_600_000_000_000, 3).expect("valid histogram bounds")
}

impl LatencySummary {
    /// Summarises a histogram of nanoseconds.
    pub(crate) fn from_histogram_ns(h: &Histogram<u64>) -> Self {
        if h.is_empty() {
            return LatencySummary::default();
        }
        let us = |ns: u64| ns as f64 / 1000.0;
        LatencySummary {
            count: h.len(),
            avg_us: h.mean() / 1000.0,
            p50_us: us(h.value_at_quantile(0.5)),
            p99_us: us(h.value_at_quantile(0.99)),
            p999_us: us(h.value_at_quantile(0.999)),
            max_us: us(h.max()),
        }
    }
}

/// Throughput over one interval of a run (about one second).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TimelinePoint {
    /// Seconds since the run started (ramp-up included) at the end of the interval.
    pub elapsed_secs: f64,
    /// I/Os per second over the interval.
    pub iops: f64,
    /// Decimal MB per second over the interval.
    pub mbps: f64,
    /// The interval lies in the ramp-up (not measured).
    pub ramping: bool,
}

/// Everything measured in one run of one [`Workload`].
///
/// Rates count I/O that completed successfully inside the measured window; errors count
/// every failed I/O of the run, ramp-up included.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunResult {
    /// Pattern name (the workload's).
    pub name: String,
    /// The workload as run.
    pub spec: Workload,
    /// Length of the measured window actually covered (shorter than the spec when the
    /// run stopped early: I/O limit, verification failure).
    pub measured_secs: f64,
    /// Reads completed in the window.
    pub reads: u64,
    /// Writes completed in the window.
    pub writes: u64,
    /// Bytes read in the window.
    pub read_bytes: u64,
    /// Bytes written in the window.
    pub write_bytes: u64,
    /// I/Os per second, reads plus writes.
    pub iops: f64,
    /// Reads per second.
    pub read_iops: f64,
    /// Writes per second.
    pub write_iops: f64,
    /// Decimal megabytes (1e6 bytes) per second, both directions.
    pub mb_per_sec: f64,
    /// Mebibytes (2^20 bytes) per second, both directions.
    pub mib_per_sec: f64,
    /// Decimal MB/s read.
    pub read_mb_per_sec: f64,
    /// Decimal MB/s written.
    pub write_mb_per_sec: f64,
    /// Latency of all I/Os.
    pub latency: LatencySummary,
    /// Latency of reads.
    pub read_latency: LatencySummary,
    /// Latency of writes.
    pub write_latency: LatencySummary,
    /// CPU (user + system) of this process during the window, in % of one core.
    pub cpu_pct_one_core: f64,
    /// CPU microseconds per measured I/O.
    pub cpu_us_per_io: f64,
    /// Failed reads (whole run).
    pub read_errors: u64,
    /// Failed writes (whole run).
    pub write_errors: u64,
    /// Text of the first I/O error.
    pub first_error: Option<String>,
    /// Throughput about once a second, ramp-up included.
    pub timeline: Vec<TimelinePoint>,
    /// Verification outcome, when the workload verified.
    pub verify: Option<VerifySummary>,
}

impl RunResult {
    /// Failed I/Os of the run.
    pub fn errors(&self) -> u64 {
        self.read_errors + self.write_errors
    }

    /// False when verification found a bad block.
    pub fn verify_passed(&self) -> bool {
        self.verify.as_ref().is_none_or(|v| v.passed)
    }
}
