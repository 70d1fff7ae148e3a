//! Admission of connections not yet authenticated (an iSCSI login, the
//! handshake of a sync link or of a witness exchange): a budget per source
//! address and in total, kept apart from established sessions, so that idle or
//! slow sockets from a few addresses cannot keep anyone else from getting in.
//!
//! A connection holds a slot from accept until its login or handshake
//! completes or fails. When a source is at its own budget, its oldest
//! connection is dropped for the new one (its idle ones, those that have not
//! sent a whole message yet, first); when the whole budget is used, the victim
//! is taken from the source holding the most slots. A source with few slots (a
//! real peer getting in) is therefore never the one to lose one while another
//! holds more. Dropped connections are logged, at most one line a second with
//! the count of the others.

use parking_lot::Mutex;
use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::Notify;

/// The source a per-source bound counts: the address, an IPv4 one the same
/// whether it arrives plain or mapped (`::ffff:a.b.c.d`, on a dual-stack
/// listener). An IPv6 /64 is not one source here: on a storage network it
/// is the whole subnet, every host of it; see [`subnet_of`].
pub fn source_key(ip: IpAddr) -> IpAddr {
    ip.to_canonical()
}

/// The IPv6 /64 an address is in (None for IPv4): the share of addresses one
/// host may be given and rotate through, and also a whole LAN's subnet, so
/// bounds on it are set well above a host's.
pub fn subnet_of(ip: IpAddr) -> Option<IpAddr> {
    match ip.to_canonical() {
        IpAddr::V4(_) => None,
        IpAddr::V6(v6) => {
            let bits = u128::from(v6) & !((1u128 << 64) - 1);
            Some(IpAddr::V6(std::net::Ipv6Addr::from(bits)))
        }
    }
}

/// Connections open per source ([`source_key`]), at most `max` each: the
/// bound of a listener whose connections, once admitted, are not taken back.
#[derive(Debug)]
pub struct PerSource {
    counts: Mutex<HashMap<IpAddr, usize>>,
    max: usize,
}

/// One connection's place in its source's count; given back on drop.
#[derive(Debug)]
pub struct SourceSlot {
    table: Arc<PerSource>,
    source: IpAddr,
}

impl PerSource {
    /// A table allowing `max` (at least 1) connections per source.
    pub fn new(max: usize) -> Arc<Self> {
        Arc::new(PerSource {
            counts: Mutex::new(HashMap::new()),
            max: max.max(1),
        })
    }

    /// Whether a connection from `ip` would get a place now (no place is
    /// taken: [`PerSource::take`] decides).
    pub fn has_room(&self, ip: IpAddr) -> bool {
        let c = self.counts.lock();
        c.get(&source_key(ip)).copied().unwrap_or(0) < self.max
    }

    /// A place for a connection from `ip`, or None when its source has `max`.
    pub fn take(self: &Arc<Self>, ip: IpAddr) -> Option<SourceSlot> {
        let source = source_key(ip);
        let mut c = self.counts.lock();
        let n = c.entry(source).or_insert(0);
        if *n >= self.max {
            return None;
        }
        *n += 1;
        Some(SourceSlot {
            table: self.clone(),
            source,
        })
    }

    /// Sources holding a place now.
    pub fn sources(&self) -> usize {
        self.counts.lock().len()
    }
}

impl Drop for SourceSlot {
    fn drop(&mut self) {
        let mut c = self.table.counts.lock();
        if let Some(n) = c.get_mut(&self.source) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                c.remove(&self.source);
            }
        }
    }
}

/// One connection being admitted, as the budget tracks it.
struct Entry {
    id: u64,
    started: Instant,
    /// True until the connection has sent its first whole message.
    idle: Arc<AtomicBool>,
    /// Signalled when the connection must give up its slot.
    evict: Arc<Notify>,
}

#[derive(Default)]
struct Inner {
    next_id: u64,
    total: usize,
    by_source: HashMap<IpAddr, VecDeque<Entry>>,
}

/// The admission budget of a listener.
pub struct AdmissionBudget {
    inner: Mutex<Inner>,
    per_source_max: usize,
    total_max: usize,
    log: LogGate,
}

/// A slot; dropping it gives the slot back.
pub struct AdmissionSlot {
    budget: Arc<AdmissionBudget>,
    source: IpAddr,
    id: u64,
    idle: Arc<AtomicBool>,
    evict: Arc<Notify>,
}

impl AdmissionSlot {
    /// The connection sent its first whole message: it is no longer idle.
    pub fn mark_active(&self) {
        self.idle.store(false, Ordering::Relaxed);
    }

    /// Completes when the budget takes the slot back for a newer connection.
    pub async fn evicted(&self) {
        self.evict.notified().await
    }

    /// Gives the slot back now, while the connection goes on (it has been
    /// admitted: authenticated, past its handshake), so the budget never takes
    /// it back. False when it already had (the connection is to close:
    /// [`AdmissionSlot::evicted`] completes). Dropping the slot later gives
    /// back nothing more.
    pub fn settle(&self) -> bool {
        self.budget.release(self.source, self.id)
    }
}

impl Drop for AdmissionSlot {
    fn drop(&mut self) {
        self.budget.release(self.source, self.id);
    }
}

impl AdmissionBudget {
    /// A budget of `per_source_max` connections per address and `total_max` in all
    /// (each at least 1).
    pub fn new(per_source_max: usize, total_max: usize) -> Arc<AdmissionBudget> {
        Arc::new(AdmissionBudget {
            inner: Mutex::new(Inner::default()),
            per_source_max: per_source_max.max(1),
            total_max: total_max.max(1),
            log: LogGate::new(Duration::from_secs(1)),
        })
    }

    /// Gives a slot to a new connection from `source`, taking one back from
    /// another connection if the budget is used up (see the module header).
    pub fn admit(self: &Arc<Self>, source: IpAddr) -> AdmissionSlot {
        let source = source_key(source);
        let mut g = self.inner.lock();
        let own = g.by_source.get(&source).map_or(0, |q| q.len());
        let victim_source = if own >= self.per_source_max {
            Some(source)
        } else if g.total >= self.total_max {
            // The source holding the most slots; among equals, the one whose
            // oldest idle connection is oldest.
            g.by_source
                .iter()
                .max_by_key(|(_, q)| {
                    let oldest_idle = q
                        .iter()
                        .filter(|e| e.idle.load(Ordering::Relaxed))
                        .map(|e| std::cmp::Reverse(e.started))
                        .max();
                    (q.len(), oldest_idle.is_some(), oldest_idle)
                })
                .map(|(ip, _)| *ip)
        } else {
            None
        };
        if let Some(vs) = victim_source {
            let g = &mut *g;
            if let Some(q) = g.by_source.get_mut(&vs) {
                let pos = q
                    .iter()
                    .position(|e| e.idle.load(Ordering::Relaxed))
                    .unwrap_or(0);
                if let Some(e) = q.remove(pos) {
                    e.evict.notify_one();
                    g.total -= 1;
                    let reason = if vs == source {
                        "per-source budget used up"
                    } else {
                        "budget used up; the source holding the most slots gives one"
                    };
                    if let Some(suppressed) = self.log.allow() {
                        tracing::warn!(
                            source = %vs,
                            new_from = %source,
                            idle = e.idle.load(Ordering::Relaxed),
                            age_ms = e.started.elapsed().as_millis() as u64,
                            suppressed,
                            "dropping a connection not yet admitted: {reason}"
                        );
                    }
                }
                if q.is_empty() {
                    g.by_source.remove(&vs);
                }
            }
        }
        g.next_id += 1;
        let id = g.next_id;
        let idle = Arc::new(AtomicBool::new(true));
        let evict = Arc::new(Notify::new());
        g.by_source.entry(source).or_default().push_back(Entry {
            id,
            started: Instant::now(),
            idle: idle.clone(),
            evict: evict.clone(),
        });
        g.total += 1;
        AdmissionSlot {
            budget: self.clone(),
            source,
            id,
            idle,
            evict,
        }
    }

    /// Gives slot `id` back; false when it was already (taken back by an
    /// eviction, or given back before).
    fn release(&self, source: IpAddr, id: u64) -> bool {
        let mut g = self.inner.lock();
        let Some(q) = g.by_source.get_mut(&source) else {
            return false;
        };
        let Some(pos) = q.iter().position(|e| e.id == id) else {
            return false; // Already taken back by an eviction.
        };
        q.remove(pos);
        if q.is_empty() {
            g.by_source.remove(&source);
        }
        g.total -= 1;
        true
    }

    /// Slots in use: (from `source`, in total).
    #[cfg(test)]
    pub fn in_use(&self, source: IpAddr) -> (usize, usize) {
        let g = self.inner.lock();
        (g.by_source.get(&source).map_or(0, |q| q.len()), g.total)
    }
}

/// Lets a log line through at most once per interval and counts the rest.
pub struct LogGate {
    interval: Duration,
    start: Instant,
    /// Milliseconds after `start` of the last line let through, plus one (0: never).
    last_ms: AtomicU64,
    suppressed: AtomicU64,
}

impl LogGate {
    /// A gate letting one line through per `interval`.
    pub fn new(interval: Duration) -> LogGate {
        LogGate {
            interval,
            start: Instant::now(),
            last_ms: AtomicU64::new(0),
            suppressed: AtomicU64::new(0),
        }
    }

    /// Some(number of lines suppressed since the last one) when a line may be
    /// written now, None when it must be dropped (and is counted).
    pub fn allow(&self) -> Option<u64> {
        let now_ms = self.start.elapsed().as_millis() as u64 + 1;
        let last = self.last_ms.load(Ordering::Relaxed);
        let due = last == 0 || now_ms.saturating_sub(last) >= self.interval.as_millis() as u64;
        if due
            && self
                .last_ms
                .compare_exchange(last, now_ms, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            Some(self.suppressed.swap(0, Ordering::Relaxed))
        } else {
            self.suppressed.fetch_add(1, Ordering::Relaxed);
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn per_source_slots_are_bounded_and_released() {
        let t = PerSource::new(2);
        let a = t.take(ip("127.0.0.3")).unwrap();
        // the same address arriving mapped on a dual-stack listener
        let _b = t.take(ip("::ffff:127.0.0.3")).unwrap();
        assert!(t.take(ip("127.0.0.3")).is_none());
        assert!(t.take(ip("127.0.0.4")).is_some());
        drop(a);
        assert!(t.take(ip("127.0.0.3")).is_some());
        assert!(t.sources() <= 2);
        // IPv6 hosts of one /64 (one LAN) are sources of their own
        let v6 = PerSource::new(1);
        let _x = v6.take(ip("2001:db8:1:2::1")).unwrap();
        assert!(v6.take(ip("2001:db8:1:2::1")).is_none());
        assert!(v6.take(ip("2001:db8:1:2::2")).is_some());
        assert_eq!(
            subnet_of(ip("2001:db8:1:2:ffff::9")),
            Some(ip("2001:db8:1:2::"))
        );
        assert_eq!(subnet_of(ip("::ffff:10.0.0.1")), None);
    }

    #[tokio::test]
    async fn per_source_budget_drops_the_oldest_idle_of_that_source() {
        let b = AdmissionBudget::new(2, 10);
        let a1 = b.admit(ip("10.0.0.1"));
        let a2 = b.admit(ip("10.0.0.1"));
        a1.mark_active();
        let other = b.admit(ip("10.0.0.2"));
        let a3 = b.admit(ip("10.0.0.1"));
        // a2 (idle) went, not a1 (active) nor the other source.
        tokio::time::timeout(Duration::from_millis(100), a2.evicted())
            .await
            .expect("a2 evicted");
        assert!(
            tokio::time::timeout(Duration::from_millis(20), a1.evicted())
                .await
                .is_err()
        );
        assert_eq!(b.in_use(ip("10.0.0.1")), (2, 3));
        drop(a2);
        assert_eq!(b.in_use(ip("10.0.0.1")), (2, 3));
        drop((a1, a3, other));
        assert_eq!(b.in_use(ip("10.0.0.1")), (0, 0));
    }

    #[tokio::test]
    async fn a_settled_slot_is_never_taken_back() {
        let b = AdmissionBudget::new(1, 10);
        let settled = b.admit(ip("10.0.0.1"));
        assert!(settled.settle());
        assert_eq!(b.in_use(ip("10.0.0.1")), (0, 0));
        // the source's next connection has its place, and the next one takes
        // that one's, never the settled one's
        let next = b.admit(ip("10.0.0.1"));
        let _after = b.admit(ip("10.0.0.1"));
        tokio::time::timeout(Duration::from_millis(100), next.evicted())
            .await
            .expect("the unsettled one went");
        // taken back before it could settle: it cannot
        assert!(!next.settle());
        assert!(
            tokio::time::timeout(Duration::from_millis(20), settled.evicted())
                .await
                .is_err()
        );
        drop(settled);
        assert_eq!(b.in_use(ip("10.0.0.1")), (1, 1));
    }

    #[tokio::test]
    async fn full_budget_takes_from_the_biggest_source() {
        let b = AdmissionBudget::new(8, 4);
        let flood: Vec<_> = (0..3).map(|_| b.admit(ip("10.0.0.66"))).collect();
        let good = b.admit(ip("10.0.0.1"));
        let good2 = b.admit(ip("10.0.0.2"));
        assert!(
            tokio::time::timeout(Duration::from_millis(100), flood[0].evicted())
                .await
                .is_ok()
        );
        assert_eq!(b.in_use(ip("10.0.0.66")), (2, 4));
        for _ in 0..20 {
            drop(b.admit(ip("10.0.0.66")));
        }
        assert_eq!(b.in_use(ip("10.0.0.1")).0, 1);
        drop((good, good2, flood));
        assert_eq!(b.in_use(ip("10.0.0.1")), (0, 0));
    }

    #[test]
    fn log_gate_counts_what_it_drops() {
        let g = LogGate::new(Duration::from_secs(3600));
        assert_eq!(g.allow(), Some(0));
        assert_eq!(g.allow(), None);
        assert_eq!(g.allow(), None);
    }
}
