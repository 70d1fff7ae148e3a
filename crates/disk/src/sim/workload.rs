//! A closed-loop workload driven in virtual time: the way nominal figures are
//! computed and the way model tests run many requests without a clock.

use super::{SimModel, SimOp, SimOpKind, SplitMix64};

/// A fixed-pattern workload: `queue_depth` requests outstanding at all times (a new
/// one is submitted the instant one completes) until `ops` have completed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Workload {
    /// Writes instead of reads.
    pub write: bool,
    /// Request size in bytes.
    pub len_bytes: u64,
    /// Requests kept outstanding.
    pub queue_depth: u32,
    /// Requests to complete.
    pub ops: u64,
    /// Random offsets (aligned to `len_bytes`) over `span_bytes`; otherwise a
    /// sequential stream from offset 0, wrapping at `span_bytes`.
    pub random: bool,
    /// Bytes of the device the workload touches, from offset 0.
    pub span_bytes: u64,
    /// Seed of the offset generator.
    pub seed: u64,
}

impl Workload {
    /// Random 4 KiB requests over `capacity_bytes`.
    pub fn random_4k(write: bool, queue_depth: u32, ops: u64, capacity_bytes: u64) -> Self {
        Workload {
            write,
            len_bytes: 4096,
            queue_depth,
            ops,
            random: true,
            span_bytes: capacity_bytes,
            seed: 0x0005_EED0_FF12_E5A4,
        }
    }

    /// A sequential stream of `len_bytes` requests from offset 0.
    pub fn sequential(write: bool, len_bytes: u64, queue_depth: u32, ops: u64) -> Self {
        Workload {
            write,
            len_bytes,
            queue_depth,
            ops,
            random: false,
            span_bytes: u64::MAX,
            seed: 0,
        }
    }
}

/// What a closed-loop run measured, in virtual time.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ClosedLoopResult {
    /// Requests completed.
    pub ops: u64,
    /// Bytes moved.
    pub bytes: u64,
    /// Virtual time from the first submission to the last completion.
    pub elapsed_ns: u64,
}

impl ClosedLoopResult {
    /// Completed requests per (virtual) second.
    pub fn iops(&self) -> f64 {
        self.ops as f64 * 1e9 / self.elapsed_ns.max(1) as f64
    }

    /// Throughput in MB/s (10^6 bytes per second).
    pub fn mb_s(&self) -> f64 {
        self.bytes as f64 * 1e3 / self.elapsed_ns.max(1) as f64
    }

    /// Mean interval between completions in microseconds (the latency at depth 1).
    pub fn us_per_op(&self) -> f64 {
        self.elapsed_ns as f64 / 1e3 / self.ops.max(1) as f64
    }
}

/// Runs `wl` on `model` from virtual time 0 and returns what it measured.
pub fn run_closed_loop(model: &mut dyn SimModel, wl: &Workload) -> ClosedLoopResult {
    let span = wl.span_bytes.min(model.capacity_bytes());
    let slots = (span / wl.len_bytes.max(1)).max(1);
    let mut rng = SplitMix64::new(wl.seed);
    let mut next_seq = 0u64;
    let mut next_op = |rng: &mut SplitMix64| {
        let slot = if wl.random {
            rng.below(slots)
        } else {
            let s = next_seq % slots;
            next_seq += 1;
            s
        };
        let kind = if wl.write {
            SimOpKind::Write { fua: false }
        } else {
            SimOpKind::Read
        };
        SimOp {
            kind,
            offset_bytes: slot * wl.len_bytes,
            len_bytes: wl.len_bytes,
            extra_ns: 0,
        }
    };
    let mut issued = 0u64;
    let mut completed = 0u64;
    let mut now = 0u64;
    while issued < wl.ops && issued < wl.queue_depth as u64 {
        model.submit(now, issued, next_op(&mut rng));
        issued += 1;
    }
    let mut done = Vec::new();
    while completed < wl.ops {
        let Some(t) = model.next_event_ns() else {
            break;
        };
        now = now.max(t);
        done.clear();
        model.advance(now, &mut done);
        for _ in 0..done.len() {
            completed += 1;
            if issued < wl.ops {
                model.submit(now, issued, next_op(&mut rng));
                issued += 1;
            }
        }
    }
    ClosedLoopResult {
        ops: completed,
        bytes: completed * wl.len_bytes,
        elapsed_ns: now,
    }
}
