//! The precise completion scheduler: one thread per process holding a min-heap of
//! due instants, sleeping on a condition variable until shortly before the earliest
//! one and spinning only the last stretch.
//!
//! tokio's timers have 1 ms granularity; an SSD answers in 80 µs. The scheduler
//! thread asks the kernel for 1 ns timer slack (`PR_SET_TIMERSLACK`), sleeps until
//! `SPIN_NS` before the due instant and spins (checking for an earlier entry) the
//! rest of the way. Nothing due within `SPIN_NS` means no spinning: an idle process
//! burns no CPU. Firing runs the disk's model and wakes the waiting tasks from this
//! thread.

use super::disk::Core;
use parking_lot::{Condvar, Mutex, MutexGuard};
use std::cmp::Ordering as CmpOrdering;
use std::collections::BinaryHeap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::{Duration, Instant};

/// How long before a due instant the scheduler stops sleeping and spins.
const SPIN_NS: u64 = 60_000;

/// Overshoot histogram buckets: [0,1), [1,2), [2,4), ... µs, the last open-ended.
const BUCKETS: usize = 12;

struct Entry {
    due: Instant,
    seq: u64,
    at_ns: u64,
    target: Weak<Core>,
}

impl PartialEq for Entry {
    fn eq(&self, other: &Self) -> bool {
        self.due == other.due && self.seq == other.seq
    }
}
impl Eq for Entry {}
impl PartialOrd for Entry {
    fn partial_cmp(&self, other: &Self) -> Option<CmpOrdering> {
        Some(self.cmp(other))
    }
}
impl Ord for Entry {
    // Reversed: BinaryHeap is a max-heap and the earliest entry must be on top.
    fn cmp(&self, other: &Self) -> CmpOrdering {
        other
            .due
            .cmp(&self.due)
            .then_with(|| other.seq.cmp(&self.seq))
    }
}

struct Heap {
    entries: BinaryHeap<Entry>,
    seq: u64,
}

/// Counters the scheduler keeps about itself.
#[derive(Default)]
struct Counters {
    fired: AtomicU64,
    overshoot_ns_sum: AtomicU64,
    overshoot_ns_max: AtomicU64,
    overshoot_us_log2: [AtomicU64; BUCKETS],
    spins: AtomicU64,
    sleeps: AtomicU64,
    tid: AtomicU64,
}

pub(crate) struct Scheduler {
    heap: Mutex<Heap>,
    cv: Condvar,
    /// Set when an entry earlier than the one being spun on is pushed.
    kick: AtomicBool,
    counters: Counters,
}

static SCHEDULER: OnceLock<Arc<Scheduler>> = OnceLock::new();

/// The process-wide scheduler, started on first use.
pub(crate) fn scheduler() -> &'static Arc<Scheduler> {
    SCHEDULER.get_or_init(|| {
        let s = Arc::new(Scheduler {
            heap: Mutex::new(Heap {
                entries: BinaryHeap::new(),
                seq: 0,
            }),
            cv: Condvar::new(),
            kick: AtomicBool::new(false),
            counters: Counters::default(),
        });
        let run = Arc::clone(&s);
        std::thread::Builder::new()
            .name("sim-timer".into())
            .spawn(move || run.run())
            .unwrap_or_else(|e| panic!("cannot start the sim-timer thread: {e}"));
        s
    })
}

impl Scheduler {
    /// Calls `target.fire(at_ns)` at `due`. The heap holds at most a few entries
    /// per outstanding request (a disk arms a timer only when its earliest
    /// completion moves earlier), so it is bounded by the disks' queue depths.
    pub(crate) fn schedule(&self, due: Instant, at_ns: u64, target: Weak<Core>) {
        let mut h = self.heap.lock();
        h.seq += 1;
        let seq = h.seq;
        let is_head = h.entries.peek().is_none_or(|top| due < top.due);
        h.entries.push(Entry {
            due,
            seq,
            at_ns,
            target,
        });
        drop(h);
        if is_head {
            self.kick.store(true, Ordering::Release);
            self.cv.notify_one();
        }
    }

    fn run(self: Arc<Self>) {
        set_timer_slack_ns(1);
        // SAFETY: gettid has no preconditions.
        let tid = unsafe { libc::syscall(libc::SYS_gettid) } as u64;
        self.counters.tid.store(tid, Ordering::Relaxed);
        let mut guard = self.heap.lock();
        loop {
            let Some(due) = guard.entries.peek().map(|e| e.due) else {
                self.counters.sleeps.fetch_add(1, Ordering::Relaxed);
                self.cv.wait(&mut guard);
                continue;
            };
            let now = Instant::now();
            if due <= now {
                if let Some(e) = guard.entries.pop() {
                    self.record_overshoot(now.duration_since(e.due));
                    MutexGuard::unlocked(&mut guard, || {
                        if let Some(core) = e.target.upgrade() {
                            core.fire(e.at_ns);
                        }
                    });
                }
                continue;
            }
            let left = due - now;
            if left > Duration::from_nanos(SPIN_NS) {
                self.counters.sleeps.fetch_add(1, Ordering::Relaxed);
                self.kick.store(false, Ordering::Relaxed);
                self.cv
                    .wait_for(&mut guard, left - Duration::from_nanos(SPIN_NS));
            } else {
                self.counters.spins.fetch_add(1, Ordering::Relaxed);
                self.kick.store(false, Ordering::Relaxed);
                MutexGuard::unlocked(&mut guard, || {
                    while Instant::now() < due && !self.kick.load(Ordering::Acquire) {
                        std::hint::spin_loop();
                    }
                });
            }
        }
    }

    fn record_overshoot(&self, late: Duration) {
        let c = &self.counters;
        let ns = late.as_nanos().min(u64::MAX as u128) as u64;
        c.fired.fetch_add(1, Ordering::Relaxed);
        c.overshoot_ns_sum.fetch_add(ns, Ordering::Relaxed);
        c.overshoot_ns_max.fetch_max(ns, Ordering::Relaxed);
        let us = ns / 1000;
        let bucket = if us == 0 {
            0
        } else {
            (64 - us.leading_zeros() as usize).min(BUCKETS - 1)
        };
        c.overshoot_us_log2[bucket].fetch_add(1, Ordering::Relaxed);
    }
}

fn set_timer_slack_ns(ns: u64) {
    // SAFETY: PR_SET_TIMERSLACK only changes this thread's timer slack.
    unsafe {
        libc::prctl(libc::PR_SET_TIMERSLACK, ns as libc::c_ulong);
    }
}

/// What the precise scheduler has done since the process started: how late it
/// fired and how much CPU its thread used.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SchedulerStats {
    /// Timer entries fired.
    pub fired: u64,
    /// Mean lateness of a firing (actual instant minus due instant), ns.
    pub overshoot_ns_mean: f64,
    /// Largest lateness seen, ns.
    pub overshoot_ns_max: u64,
    /// 99th percentile lateness, as the upper bound of its power-of-two µs bucket, ns.
    pub overshoot_ns_p99_bound: u64,
    /// Times the thread spun to the due instant.
    pub spins: u64,
    /// Times the thread went to sleep on its condition variable.
    pub sleeps: u64,
    /// CPU time used by the scheduler thread (from schedstat), ns; 0 if unknown.
    pub thread_cpu_ns: u64,
}

/// A snapshot of the precise scheduler's counters (all zero before first use).
pub fn scheduler_stats() -> SchedulerStats {
    let Some(s) = SCHEDULER.get() else {
        return SchedulerStats::default();
    };
    let c = &s.counters;
    let fired = c.fired.load(Ordering::Relaxed);
    let buckets: Vec<u64> = c
        .overshoot_us_log2
        .iter()
        .map(|b| b.load(Ordering::Relaxed))
        .collect();
    let target = (fired as f64 * 0.99).ceil() as u64;
    let mut acc = 0u64;
    let mut p99 = 0u64;
    for (i, n) in buckets.iter().enumerate() {
        acc += n;
        if acc >= target && fired > 0 {
            p99 = (1u64 << i) * 1000;
            break;
        }
    }
    SchedulerStats {
        fired,
        overshoot_ns_mean: c.overshoot_ns_sum.load(Ordering::Relaxed) as f64 / fired.max(1) as f64,
        overshoot_ns_max: c.overshoot_ns_max.load(Ordering::Relaxed),
        overshoot_ns_p99_bound: p99,
        spins: c.spins.load(Ordering::Relaxed),
        sleeps: c.sleeps.load(Ordering::Relaxed),
        thread_cpu_ns: thread_cpu_ns(c.tid.load(Ordering::Relaxed)),
    }
}

fn thread_cpu_ns(tid: u64) -> u64 {
    if tid == 0 {
        return 0;
    }
    std::fs::read_to_string(format!("/proc/self/task/{tid}/schedstat"))
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}
