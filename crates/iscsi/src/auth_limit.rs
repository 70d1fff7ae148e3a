//! Failed authentications rate-limited per source address.
//!
//! Every CHAP failure is counted against its source address. A source that fails
//! `failures_max` times within `window` is locked out for `lockout`: its new
//! connections are closed at once, before login, so it can neither guess further
//! nor hold login slots. The table is bounded: when it is full, records whose
//! window and lockout have passed go first, then the least recently seen.

use block::admission::LogGate;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::net::IpAddr;
use std::time::{Duration, Instant};

/// What is known of one source's recent failures.
#[derive(Debug, Clone, Copy)]
struct Record {
    failures: u32,
    window_start: Instant,
    last: Instant,
    locked_until: Option<Instant>,
}

/// The settings of an [`AuthLimiter`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct AuthLimits {
    /// Failures within `window` that lock a source out (at least 1).
    pub failures_max: u32,
    /// Period over which failures are counted.
    pub window: Duration,
    /// How long a source stays locked out.
    pub lockout: Duration,
    /// Most sources remembered at once (at least 16).
    pub sources_max: usize,
}

/// Counters of failed authentications since the server started, for the
/// control plane's events (read by polling; never blocks a login).
#[derive(Debug, Default)]
pub struct AuthStats {
    /// Failed authentications.
    pub failures_total: std::sync::atomic::AtomicU64,
    /// Sources locked out for failing too often.
    pub lockouts_total: std::sync::atomic::AtomicU64,
    /// The source most recently locked out.
    pub last_locked_source: Mutex<Option<IpAddr>>,
}

/// Per-source failure counts and lockouts.
pub(crate) struct AuthLimiter {
    /// Totals, shared with [`crate::Server::auth_stats`].
    pub(crate) stats: std::sync::Arc<AuthStats>,
    records: Mutex<HashMap<IpAddr, Record>>,
    limits: AuthLimits,
    /// For the lines about refused connections of locked sources.
    log: LogGate,
}

/// What one failure did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Failure {
    /// Failures of this source in the current window.
    pub failures: u32,
    /// This failure locked the source out.
    pub locked_now: bool,
}

impl AuthLimiter {
    /// A limiter with these settings.
    pub(crate) fn new(limits: AuthLimits) -> AuthLimiter {
        AuthLimiter {
            stats: Default::default(),
            records: Mutex::new(HashMap::new()),
            limits: AuthLimits {
                failures_max: limits.failures_max.max(1),
                sources_max: limits.sources_max.max(16),
                ..limits
            },
            log: LogGate::new(Duration::from_secs(1)),
        }
    }

    /// How long `source` remains locked out, if it is.
    pub(crate) fn locked(&self, source: IpAddr) -> Option<Duration> {
        let source = block::admission::source_key(source);
        let now = Instant::now();
        let g = self.records.lock();
        let until = g.get(&source)?.locked_until?;
        until.checked_duration_since(now).filter(|d| !d.is_zero())
    }

    /// Logs (at most once a second) that a connection of a locked-out source was closed.
    pub(crate) fn log_refused(&self, source: IpAddr, left: Duration) {
        if let Some(suppressed) = self.log.allow() {
            tracing::warn!(
                %source,
                lockout_left_ms = left.as_millis() as u64,
                suppressed,
                "connection closed: too many failed authentications from this source"
            );
        }
    }

    /// Counts a failed authentication of `source`.
    pub(crate) fn failed(&self, source: IpAddr) -> Failure {
        let source = block::admission::source_key(source);
        let now = Instant::now();
        let mut g = self.records.lock();
        if !g.contains_key(&source) && g.len() >= self.limits.sources_max {
            self.make_room(&mut g, now);
        }
        let r = g.entry(source).or_insert(Record {
            failures: 0,
            window_start: now,
            last: now,
            locked_until: None,
        });
        if now.duration_since(r.window_start) > self.limits.window {
            r.failures = 0;
            r.window_start = now;
        }
        r.failures = r.failures.saturating_add(1);
        r.last = now;
        let locked_now =
            r.failures >= self.limits.failures_max && r.locked_until.is_none_or(|u| u <= now);
        use std::sync::atomic::Ordering::Relaxed;
        self.stats.failures_total.fetch_add(1, Relaxed);
        if locked_now {
            *self.stats.last_locked_source.lock() = Some(source);
            self.stats.lockouts_total.fetch_add(1, Relaxed);
            r.locked_until = Some(now + self.limits.lockout);
            // A new window starts after the lockout.
            r.failures = 0;
            r.window_start = now + self.limits.lockout;
        }
        Failure {
            failures: if locked_now {
                self.limits.failures_max
            } else {
                r.failures
            },
            locked_now,
        }
    }

    fn make_room(&self, g: &mut HashMap<IpAddr, Record>, now: Instant) {
        let window = self.limits.window;
        g.retain(|_, r| {
            r.locked_until.is_some_and(|u| u > now) || now.duration_since(r.window_start) <= window
        });
        while g.len() >= self.limits.sources_max {
            let Some(oldest) = g.iter().min_by_key(|(_, r)| r.last).map(|(ip, _)| *ip) else {
                return;
            };
            g.remove(&oldest);
        }
    }

    /// Sources remembered.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.records.lock().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limiter(sources_max: usize) -> AuthLimiter {
        AuthLimiter::new(AuthLimits {
            failures_max: 3,
            window: Duration::from_secs(60),
            lockout: Duration::from_millis(200),
            sources_max,
        })
    }

    #[test]
    fn third_failure_locks_the_source_out_for_a_while() {
        let l = limiter(16);
        let a: IpAddr = "10.0.0.5".parse().unwrap();
        let b: IpAddr = "10.0.0.6".parse().unwrap();
        assert!(!l.failed(a).locked_now);
        assert!(!l.failed(a).locked_now);
        assert!(l.locked(a).is_none());
        assert!(l.failed(a).locked_now);
        assert!(l.locked(a).is_some());
        assert!(l.locked(b).is_none(), "other sources are not affected");
        std::thread::sleep(Duration::from_millis(250));
        assert!(l.locked(a).is_none(), "the lockout ends");
    }

    /// An IPv6 host that changes address within its /64 after each failure
    /// is one source: it is locked out after the third, whatever address
    /// comes next (before, each address had three guesses of its own), and an
    /// IPv4 address counts the same plain or mapped.
    #[test]
    fn an_ipv6_64_is_one_source_and_a_mapped_ipv4_is_its_address() {
        let l = limiter(16);
        let ip = |s: &str| -> IpAddr { s.parse().unwrap() };
        assert!(!l.failed(ip("2001:db8:7::1")).locked_now);
        assert!(!l.failed(ip("2001:db8:7::2")).locked_now);
        assert!(l.failed(ip("2001:db8:7::3")).locked_now);
        assert!(l.locked(ip("2001:db8:7:0:ffff::42")).is_some());
        assert!(l.locked(ip("2001:db8:8::1")).is_none(), "another /64");
        assert!(!l.failed(ip("10.0.0.9")).locked_now);
        assert!(!l.failed(ip("::ffff:10.0.0.9")).locked_now);
        assert!(l.failed(ip("10.0.0.9")).locked_now);
    }

    #[test]
    fn the_table_stays_bounded() {
        let l = limiter(16);
        for i in 0..1000u32 {
            let ip = IpAddr::from(std::net::Ipv4Addr::from(0x0a00_0000 + i));
            l.failed(ip);
            assert!(l.len() <= 16);
        }
        // The newest sources are still counted.
        let last = IpAddr::from(std::net::Ipv4Addr::from(0x0a00_0000 + 999));
        l.failed(last);
        assert!(l.failed(last).locked_now);
    }
}
