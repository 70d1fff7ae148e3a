//! How deep each member's queue runs: the time integral of the requests the pool
//! has outstanding on a member, and the time the member had at least one.
//!
//! `status().members[i].inflight_us` grows by the number of requests outstanding
//! times the time they were (request-µs), `busy_us` by the time at least one was.
//! Over an interval, `Δinflight_us / Δt` is the member's mean queue depth as the
//! pool issued it, `Δinflight_us / Δbusy_us` the mean depth while it had work, and
//! `Δbusy_us / Δt` how much of the time it had work at all. Only the pool's own
//! requests count (data, parity, journal ring, superblocks, flushes are not I/O
//! requests here); a member shared with something else may be busier than this.
//!
//! It also counts how often the member answers out of order: a request that
//! completes while one issued before it is still outstanding has *overtaken*
//! it (`reordered` of `completed`). A disk that reorders its queue (NCQ, TCQ,
//! or a scheduler in front of it) serves the nearest request first, so a far
//! one, such as a journal ring write, can wait behind many; a FIFO disk never
//! overtakes. The journal's spare copy depends on it (`commit.rs`).
//!
//! Key invariant: every request counted in is counted out exactly once, also when
//! its future is dropped (the count is a guard).

use parking_lot::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// The depth clock of one member (under a short synchronous lock).
pub(crate) struct DepthMeter {
    clock: Mutex<Clock>,
}

struct Clock {
    /// Requests outstanding now.
    n: u64,
    /// When `n` last changed.
    since: Instant,
    /// Integral of `n` over time up to `since`, ns.
    depth_ns: u64,
    /// Time with `n > 0` up to `since`, ns.
    busy_ns: u64,
    /// Issue tags of the requests outstanding now.
    outstanding: std::collections::BTreeSet<u64>,
    next_tag: u64,
    completed: u64,
    reordered: u64,
}

impl Clock {
    fn advance(&mut self, now: Instant) {
        let dt = now.saturating_duration_since(self.since).as_nanos() as u64;
        self.depth_ns = self.depth_ns.saturating_add(self.n.saturating_mul(dt));
        if self.n > 0 {
            self.busy_ns = self.busy_ns.saturating_add(dt);
        }
        self.since = now;
    }
}

/// A snapshot of a member's depth clock, µs since the pool attached it.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Depth {
    pub inflight_us: u64,
    pub busy_us: u64,
    /// Requests completed.
    pub completed: u64,
    /// Of them, those that completed before one issued earlier.
    pub reordered: u64,
}

impl Default for DepthMeter {
    fn default() -> Self {
        DepthMeter {
            clock: Mutex::new(Clock {
                n: 0,
                since: Instant::now(),
                depth_ns: 0,
                busy_ns: 0,
                outstanding: Default::default(),
                next_tag: 0,
                completed: 0,
                reordered: 0,
            }),
        }
    }
}

impl DepthMeter {
    /// A request is issued: its tag.
    fn up(&self) -> u64 {
        let mut c = self.clock.lock();
        c.advance(Instant::now());
        c.n += 1;
        let tag = c.next_tag;
        c.next_tag += 1;
        c.outstanding.insert(tag);
        tag
    }

    /// Request `tag` ended (`done`: it completed, rather than being dropped).
    fn down(&self, tag: u64, done: bool) {
        let mut c = self.clock.lock();
        c.advance(Instant::now());
        c.n = c.n.saturating_sub(1);
        c.outstanding.remove(&tag);
        if done {
            c.completed += 1;
            if c.outstanding.first().is_some_and(|&t| t < tag) {
                c.reordered += 1;
            }
        }
    }

    /// The integrals up to now.
    pub fn snapshot(&self) -> Depth {
        let mut c = self.clock.lock();
        c.advance(Instant::now());
        Depth {
            inflight_us: c.depth_ns / 1000,
            busy_us: c.busy_ns / 1000,
            completed: c.completed,
            reordered: c.reordered,
        }
    }
}

/// One request outstanding on a member: counted in the member's `inflight`
/// (which mirrors read from) and its depth clock until dropped.
/// `finish` when the request completed; dropped otherwise (a cancelled
/// request is not a completion, in or out of order).
pub(crate) struct InFlight<'a> {
    count: &'a AtomicU64,
    meter: &'a DepthMeter,
    tag: u64,
    done: bool,
}

impl<'a> InFlight<'a> {
    pub fn new(count: &'a AtomicU64, meter: &'a DepthMeter) -> Self {
        count.fetch_add(1, Ordering::Relaxed);
        let tag = meter.up();
        InFlight {
            count,
            meter,
            tag,
            done: false,
        }
    }

    /// The request completed (successfully or not).
    pub fn finish(mut self) {
        self.done = true;
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.count.fetch_sub(1, Ordering::Relaxed);
        self.meter.down(self.tag, self.done);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_completing_before_an_earlier_one_is_reordered() {
        let m = DepthMeter::default();
        let n = AtomicU64::new(0);
        // in order: a, then b
        let a = InFlight::new(&n, &m);
        let b = InFlight::new(&n, &m);
        a.finish();
        b.finish();
        let s = m.snapshot();
        assert_eq!((s.completed, s.reordered), (2, 0));
        // d overtakes c; a cancelled request is no completion
        let c = InFlight::new(&n, &m);
        let d = InFlight::new(&n, &m);
        let e = InFlight::new(&n, &m);
        d.finish();
        drop(e);
        c.finish();
        let s = m.snapshot();
        assert_eq!((s.completed, s.reordered), (4, 1));
        assert_eq!(n.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn two_requests_for_the_whole_time_are_depth_two() {
        let m = DepthMeter::default();
        let n = AtomicU64::new(0);
        let t0 = m.snapshot();
        let a = InFlight::new(&n, &m);
        let b = InFlight::new(&n, &m);
        assert_eq!(n.load(Ordering::Relaxed), 2);
        std::thread::sleep(std::time::Duration::from_millis(20));
        drop(a);
        drop(b);
        assert_eq!(n.load(Ordering::Relaxed), 0);
        let t1 = m.snapshot();
        let depth = (t1.inflight_us - t0.inflight_us) as f64;
        let busy = (t1.busy_us - t0.busy_us) as f64;
        assert!(busy >= 20_000.0, "busy {busy} µs");
        // both were outstanding for the whole busy time
        assert!(
            (depth / busy - 2.0).abs() < 0.05,
            "depth {depth} busy {busy}"
        );
        // idle time adds to neither
        std::thread::sleep(std::time::Duration::from_millis(5));
        let t2 = m.snapshot();
        assert_eq!(t2.inflight_us, t1.inflight_us);
        assert_eq!(t2.busy_us, t1.busy_us);
    }
}
