//! Per-LU command counters for metrics: commands and bytes by direction, errors,
//! commands in flight and a latency histogram with fixed buckets.
//!
//! What it does not do: export anything; the control plane reads a
//! [`LuStats`] snapshot through [`crate::ScsiTarget::lun_stats`] at scrape time.
//!
//! Key invariant: the data path only does relaxed atomic adds on counters the LU
//! owns (no lock, no allocation); a snapshot may be torn across counters (a
//! command counted in `commands` whose bytes are not yet added), never within one.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// Upper bounds (inclusive) of the latency buckets, in microseconds; one more
/// bucket (+Inf) holds the rest.
pub const LATENCY_BUCKETS_US: [u64; 14] = [
    50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000,
    1_000_000,
];

/// What a command moved data for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// READ (6/10/12/16).
    Read,
    /// WRITE, WRITE AND VERIFY, COMPARE AND WRITE, ORWRITE, WRITE SAME.
    Write,
    /// Everything else (INQUIRY, TEST UNIT READY, SYNCHRONIZE CACHE, UNMAP ...).
    Other,
}

impl Direction {
    /// The label value metrics use.
    pub fn as_str(self) -> &'static str {
        match self {
            Direction::Read => "read",
            Direction::Write => "write",
            Direction::Other => "other",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// Counters of one direction.
#[derive(Default)]
struct DirCounters {
    commands: AtomicU64,
    bytes: AtomicU64,
    errors: AtomicU64,
    latency_sum_us: AtomicU64,
    /// One per bound in [`LATENCY_BUCKETS_US`] plus +Inf; not cumulative.
    latency_buckets: [AtomicU64; LATENCY_BUCKETS_US.len() + 1],
}

/// The live counters of one LU.
#[derive(Default)]
pub(crate) struct LuCounters {
    dirs: [DirCounters; 3],
    in_flight: AtomicU64,
}

/// Marks a command in flight until it is finished or dropped (an aborted task).
pub(crate) struct InFlight<'a> {
    counters: &'a LuCounters,
    started: Instant,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.counters.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

impl LuCounters {
    /// Counts a command as started.
    pub(crate) fn start(&self) -> InFlight<'_> {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        InFlight {
            counters: self,
            started: Instant::now(),
        }
    }

    /// Counts a finished command: `bytes` moved, whether it failed, and its
    /// latency since `flight` started.
    pub(crate) fn finish(&self, flight: InFlight<'_>, dir: Direction, bytes: u64, failed: bool) {
        let us = flight.started.elapsed().as_micros().min(u64::MAX as u128) as u64;
        drop(flight);
        let d = &self.dirs[dir.index()];
        d.commands.fetch_add(1, Ordering::Relaxed);
        if bytes > 0 {
            d.bytes.fetch_add(bytes, Ordering::Relaxed);
        }
        if failed {
            d.errors.fetch_add(1, Ordering::Relaxed);
        }
        d.latency_sum_us.fetch_add(us, Ordering::Relaxed);
        let i = LATENCY_BUCKETS_US.partition_point(|&b| b < us);
        d.latency_buckets[i].fetch_add(1, Ordering::Relaxed);
    }

    /// A snapshot of the counters.
    pub(crate) fn snapshot(&self) -> LuStats {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let dir = |d: &DirCounters| DirStats {
            commands: get(&d.commands),
            bytes: get(&d.bytes),
            errors: get(&d.errors),
            latency_sum_us: get(&d.latency_sum_us),
            latency_buckets: std::array::from_fn(|i| get(&d.latency_buckets[i])),
        };
        LuStats {
            read: dir(&self.dirs[Direction::Read.index()]),
            write: dir(&self.dirs[Direction::Write.index()]),
            other: dir(&self.dirs[Direction::Other.index()]),
            in_flight: get(&self.in_flight),
        }
    }
}

/// Counters of one direction since the LU was added.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DirStats {
    /// Commands finished (good or not).
    pub commands: u64,
    /// Data bytes moved by the commands that succeeded (Data-In for reads,
    /// Data-Out for writes).
    pub bytes: u64,
    /// Commands answered with CHECK CONDITION or RESERVATION CONFLICT.
    pub errors: u64,
    /// Sum of the commands' latencies, in microseconds.
    pub latency_sum_us: u64,
    /// Commands per latency bucket ([`LATENCY_BUCKETS_US`], then +Inf); not
    /// cumulative.
    pub latency_buckets: [u64; LATENCY_BUCKETS_US.len() + 1],
}

/// A snapshot of one LU's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LuStats {
    /// READ commands.
    pub read: DirStats,
    /// Commands that write.
    pub write: DirStats,
    /// Other commands.
    pub other: DirStats,
    /// Commands executing now.
    pub in_flight: u64,
}

impl LuStats {
    /// The counters of `dir`.
    pub fn dir(&self, dir: Direction) -> &DirStats {
        match dir {
            Direction::Read => &self.read,
            Direction::Write => &self.write,
            Direction::Other => &self.other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_by_direction_and_bucket() {
        let c = LuCounters::default();
        let f = c.start();
        assert_eq!(c.snapshot().in_flight, 1);
        c.finish(f, Direction::Read, 4096, false);
        let f = c.start();
        c.finish(f, Direction::Write, 512, true);
        let s = c.snapshot();
        assert_eq!(s.in_flight, 0);
        assert_eq!((s.read.commands, s.read.bytes, s.read.errors), (1, 4096, 0));
        assert_eq!(
            (s.write.commands, s.write.bytes, s.write.errors),
            (1, 512, 1)
        );
        assert_eq!(s.read.latency_buckets.iter().sum::<u64>(), 1);
        assert_eq!(s.other.commands, 0);
    }

    #[test]
    fn a_dropped_command_leaves_flight() {
        let c = LuCounters::default();
        drop(c.start());
        assert_eq!(c.snapshot().in_flight, 0);
        assert_eq!(c.snapshot().read.commands, 0);
    }
}
