//! Failed authentications rate-limited per source address.
//!
//! Every CHAP failure is counted against its source address. A source that fails
//! `failures_max` times within `window` is locked out for `lockout`: its new
//! connections are closed at once, before login, so it can neither guess further
//! nor hold login slots. An IPv6 source is also counted in its /64, which locks
//! out at [`SUBNET_FACTOR`] times `failures_max`: a host rotating through its
//! addresses gets no fresh guesses with each, while one misconfigured host of
//! a storage LAN (a /64 is the whole subnet) does not lock out the others. The
//! tables are bounded: when one is full, records whose window and lockout have
//! passed go first, then the least recently seen.

use block::admission::LogGate;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::net::IpAddr;
use std::time::{Duration, Instant};

/// An IPv6 /64 is locked out after this many times the failures of one address.
pub(crate) const SUBNET_FACTOR: u32 = 8;

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
    /// The same per IPv6 /64, at [`SUBNET_FACTOR`] times the failures.
    subnets: Mutex<HashMap<IpAddr, Record>>,
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
            subnets: Mutex::new(HashMap::new()),
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
        let now = Instant::now();
        let left = |map: &Mutex<HashMap<IpAddr, Record>>, key: IpAddr| {
            let until = map.lock().get(&key)?.locked_until?;
            until.checked_duration_since(now).filter(|d| !d.is_zero())
        };
        let own = left(&self.records, block::admission::source_key(source));
        let subnet = block::admission::subnet_of(source).and_then(|s| left(&self.subnets, s));
        own.max(subnet)
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
        let now = Instant::now();
        if let Some(subnet) = block::admission::subnet_of(source) {
            let max = self.limits.failures_max.saturating_mul(SUBNET_FACTOR);
            if self.count(&self.subnets, subnet, max, now).locked_now {
                tracing::warn!(
                    %subnet,
                    lockout_ms = self.limits.lockout.as_millis() as u64,
                    "too many failed authentications from this IPv6 /64: its sources are locked out"
                );
            }
        }
        let source = block::admission::source_key(source);
        let f = self.count(&self.records, source, self.limits.failures_max, now);
        use std::sync::atomic::Ordering::Relaxed;
        self.stats.failures_total.fetch_add(1, Relaxed);
        if f.locked_now {
            *self.stats.last_locked_source.lock() = Some(source);
            self.stats.lockouts_total.fetch_add(1, Relaxed);
        }
        f
    }

    /// Counts a failure of `key` in `map`, which locks out at `failures_max`.
    fn count(
        &self,
        map: &Mutex<HashMap<IpAddr, Record>>,
        key: IpAddr,
        failures_max: u32,
        now: Instant,
    ) -> Failure {
        let mut g = map.lock();
        if !g.contains_key(&key) && g.len() >= self.limits.sources_max {
            self.make_room(&mut g, now);
        }
        let r = g.entry(key).or_insert(Record {
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
        let locked_now = r.failures >= failures_max && r.locked_until.is_none_or(|u| u <= now);
        if locked_now {
            r.locked_until = Some(now + self.limits.lockout);
            // A new window starts after the lockout.
            r.failures = 0;
            r.window_start = now + self.limits.lockout;
        }
        Failure {
            failures: if locked_now { failures_max } else { r.failures },
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
    /// gets no fresh guesses with each: the /64 is locked out after
    /// SUBNET_FACTOR times an address's failures (before, each address had
    /// its own). One failing host of a /64 (a storage LAN) does not lock out
    /// the others. An IPv4 address counts the same plain or mapped.
    #[test]
    fn an_ipv6_64_is_bounded_and_a_mapped_ipv4_is_its_address() {
        let l = limiter(64);
        let ip = |s: &str| -> IpAddr { s.parse().unwrap() };
        for _ in 0..3 {
            l.failed(ip("2001:db8:7::1"));
        }
        assert!(l.locked(ip("2001:db8:7::1")).is_some());
        assert!(
            l.locked(ip("2001:db8:7::2")).is_none(),
            "its neighbour still logs in"
        );
        let budget = 3 * SUBNET_FACTOR;
        let mut locked = false;
        for i in 4..=budget {
            let f = l.failed(ip(&format!("2001:db8:7::{i:x}")));
            assert!(!f.locked_now, "one failure per address locks none out");
            locked = l.locked(ip("2001:db8:7::abcd")).is_some();
            if locked {
                assert_eq!(i, budget, "the /64 locked out early");
            }
        }
        assert!(locked, "a host rotating through its /64 was never stopped");
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
