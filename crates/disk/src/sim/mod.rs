//! Simulated disks: a [`SimDisk`] stores data on a real volume (a `block::MemVolume`
//! or a sparse `FileVolume`) and answers each request when a device model says the
//! device would have finished it, in real time.
//!
//! The pieces, one file each:
//! - [`SimModel`]: a device as a discrete-event machine in virtual nanoseconds.
//!   Requests are submitted with their arrival time; the model says when the next
//!   completion happens and which requests are done by a given instant. Queueing is
//!   part of the model (busy actuator, busy dies, busy link), not only latency.
//! - [`HddModel`] (`hdd.rs`): one actuator, seek growing with the square root of
//!   the distance, positional rotational latency, zoned transfer rate, sequential
//!   detection and NCQ (shortest positioning time first among `ncq_depth`).
//! - [`SsdModel`] (`ssd.rs`): dies read in parallel, a write buffer drained at the
//!   program rate, and a shared link reserved as a calendar of busy intervals.
//! - `workload.rs`: a closed-loop driver in virtual time, used by `nominal()` so
//!   that the nominal figures are exactly what the model implies.
//! - `timer.rs`: the precise completion scheduler (one thread per process, a
//!   min-heap of due instants, sleep then a bounded spin).
//! - `disk.rs`: [`SimDisk`], the `block::Volume` over a store and a model.
//!
//! What it does not do: model an HDD volatile write cache (writes are write-through
//! and pay positioning), read/program interference on SSD dies, garbage collection,
//! or thermal throttling. Durability is the store's: the geometry is the store's.
//!
//! Key invariant: the model's timeline is driven by model time only (a completion
//! at `t` dispatches the next request at `t`, not at the instant the timer really
//! fired), so scheduler overshoot delays answers but never accumulates into the
//! device's busy time.

mod disk;
mod hdd;
mod rng;
mod ssd;
mod timer;
mod workload;

pub use disk::{SimClock, SimDisk, SimDiskConfig, SimModelConfig, SimStats};
pub use hdd::{HddModel, HddParams};
pub use rng::SplitMix64;
pub use ssd::{SsdModel, SsdParams};
pub use timer::{scheduler_stats, SchedulerStats};
pub use workload::{run_closed_loop, ClosedLoopResult, Workload};

/// What a simulated request asks the device to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SimOpKind {
    /// Read from the media.
    Read,
    /// Write to the media (`fua`: the write must be durable when it completes).
    Write {
        /// Force unit access.
        fua: bool,
    },
    /// Make previous writes durable; a barrier for the requests submitted after it.
    Flush,
    /// Discard or write-zeroes: a command with a small fixed cost and no data transfer.
    Trim,
}

/// One request as the model sees it: where, how much and what.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SimOp {
    /// Operation.
    pub kind: SimOpKind,
    /// Byte offset of the first byte on the device.
    pub offset_bytes: u64,
    /// Length in bytes (0 for flush).
    pub len_bytes: u64,
    /// Extra service time in nanoseconds (a slow sector being retried).
    pub extra_ns: u64,
}

impl SimOp {
    /// A read of `len_bytes` at `offset_bytes`.
    pub fn read(offset_bytes: u64, len_bytes: u64) -> Self {
        SimOp {
            kind: SimOpKind::Read,
            offset_bytes,
            len_bytes,
            extra_ns: 0,
        }
    }

    /// A write (not FUA) of `len_bytes` at `offset_bytes`.
    pub fn write(offset_bytes: u64, len_bytes: u64) -> Self {
        SimOp {
            kind: SimOpKind::Write { fua: false },
            offset_bytes,
            len_bytes,
            extra_ns: 0,
        }
    }

    /// A cache flush.
    pub fn flush() -> Self {
        SimOp {
            kind: SimOpKind::Flush,
            offset_bytes: 0,
            len_bytes: 0,
            extra_ns: 0,
        }
    }

    /// Byte offset one past the last byte.
    pub fn end_bytes(&self) -> u64 {
        self.offset_bytes + self.len_bytes
    }
}

/// A device model: a discrete-event machine in virtual nanoseconds.
///
/// The driver calls `advance(now)` then `submit(now, ..)` for each arriving request,
/// and `advance(t)` again when `next_event_ns()` says something completes at `t`.
/// Times passed in never go backwards in a way the model relies on: a model clamps
/// them to the latest time it has seen.
pub trait SimModel: Send + 'static {
    /// Short name for reports ("hdd", "ssd").
    fn kind(&self) -> &'static str;

    /// Capacity of the modelled device in bytes.
    fn capacity_bytes(&self) -> u64;

    /// A request identified by `tag` arrives at `now_ns`.
    fn submit(&mut self, now_ns: u64, tag: u64, op: SimOp);

    /// Virtual time of the next completion, if any request is outstanding.
    fn next_event_ns(&self) -> Option<u64>;

    /// Runs the device up to `now_ns` and appends the tags of the requests that have
    /// completed by then to `done`, in completion order.
    fn advance(&mut self, now_ns: u64, done: &mut Vec<u64>);

    /// Number of requests submitted and not yet completed.
    fn outstanding(&self) -> usize;

    /// A fresh, idle model with the same parameters and capacity.
    fn fresh(&self) -> Box<dyn SimModel>;

    /// The nominal figures these parameters imply (see [`Nominal`]).
    fn nominal(&self) -> Nominal {
        Nominal::of(self)
    }
}

/// The figures a model implies, computed by running a fresh copy of it in virtual
/// time with a closed-loop workload (seeded, so always the same figures): what a
/// real-time measurement of a [`SimDisk`] should reproduce.
///
/// Random figures use 4 KiB requests uniformly over the whole device; sequential
/// figures use 256 KiB requests at queue depth 8 from the start of the device (the
/// outer zone of an HDD).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Nominal {
    /// Random 4 KiB read IOPS at queue depth 1.
    pub rand_read_4k_iops_qd1: f64,
    /// Random 4 KiB read IOPS at queue depth 32.
    pub rand_read_4k_iops_qd32: f64,
    /// Random 4 KiB write IOPS at queue depth 1.
    pub rand_write_4k_iops_qd1: f64,
    /// Random 4 KiB write IOPS at queue depth 32.
    pub rand_write_4k_iops_qd32: f64,
    /// Sequential 256 KiB read throughput, MB/s (10^6 bytes per second).
    pub seq_read_mb_s: f64,
    /// Sequential 256 KiB write throughput, MB/s.
    pub seq_write_mb_s: f64,
}

impl Nominal {
    /// Runs the standard closed-loop workloads on fresh copies of `model`.
    pub fn of<M: SimModel + ?Sized>(model: &M) -> Nominal {
        let cap = model.capacity_bytes();
        let run = |wl: Workload| {
            let mut m = model.fresh();
            run_closed_loop(m.as_mut(), &wl)
        };
        let rand =
            |write: bool, qd: u32, ops: u64| run(Workload::random_4k(write, qd, ops, cap)).iops();
        let seq = |write: bool| run(Workload::sequential(write, 256 * 1024, 8, 2000)).mb_s();
        Nominal {
            rand_read_4k_iops_qd1: rand(false, 1, 2000),
            rand_read_4k_iops_qd32: rand(false, 32, 8000),
            rand_write_4k_iops_qd1: rand(true, 1, 2000),
            rand_write_4k_iops_qd32: rand(true, 32, 8000),
            seq_read_mb_s: seq(false),
            seq_write_mb_s: seq(true),
        }
    }
}

/// Errors of the simulated disks: bad parameters or a missing runtime.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// A model parameter is out of its range.
    #[error("invalid simulation parameter {name}: {reason}")]
    InvalidParam {
        /// Field name as in the config.
        name: &'static str,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// `SimClock::Tokio` was asked for outside a tokio runtime.
    #[error("SimClock::Tokio needs a tokio runtime")]
    NoRuntime,
}

pub(crate) fn check_pos(name: &'static str, v: f64) -> Result<(), SimError> {
    if v.is_finite() && v > 0.0 {
        Ok(())
    } else {
        Err(SimError::InvalidParam {
            name,
            reason: "must be a finite number > 0",
        })
    }
}

pub(crate) fn check_non_neg(name: &'static str, v: f64) -> Result<(), SimError> {
    if v.is_finite() && v >= 0.0 {
        Ok(())
    } else {
        Err(SimError::InvalidParam {
            name,
            reason: "must be a finite number >= 0",
        })
    }
}

/// Milliseconds (f64) to whole nanoseconds.
pub(crate) fn ms_to_ns(ms: f64) -> u64 {
    (ms * 1e6).round() as u64
}

/// Microseconds (f64) to whole nanoseconds.
pub(crate) fn us_to_ns(us: f64) -> u64 {
    (us * 1e3).round() as u64
}

/// Time to move `bytes` at `mb_s` (10^6 bytes per second), in nanoseconds.
pub(crate) fn xfer_ns(bytes: u64, mb_s: f64) -> u64 {
    (bytes as f64 * 1e3 / mb_s).round() as u64
}
