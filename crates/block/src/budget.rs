//! The node's one budget of buffered data bytes.
//!
//! Every frontend holds data in memory for a while: read data waiting to be
//! written to a slow reader, Data-Out and NBD write payloads waiting to be
//! applied, the partner's replicated writes waiting to be applied. Per-session
//! bounds keep one client small, but hundreds of sessions times their bounds is
//! more memory than a node has. A [`BufferBudget`] is the node's total: a command
//! takes a [`BufferPermit`] for its bytes *before* its buffer is allocated (or
//! its payload read from the socket) and the permit goes with the buffer until
//! the bytes are on the wire or applied; a connection that cannot get one stops
//! reading its socket, so TCP flow control pushes back on the client instead of
//! the node's memory growing.
//!
//! Rules that keep it free of deadlock (each frontend states how it follows them):
//! - one acquire per command, for all of its bytes, clamped to the whole budget
//!   (a command larger than the budget waits until the budget is free, then runs
//!   alone), never a second acquire while the first permit is held;
//! - whoever waits holds no permit whose release depends on the waiter itself
//!   (an iSCSI reader that is collecting Data-Out for earlier writes of its
//!   connection does not wait: it answers TASK SET FULL instead);
//! - work that other permits' release depends on never waits: the partner's
//!   replicated writes are [`charged`](BufferBudget::charge) (counted, may
//!   overdraw the budget, never wait), because a node's frontend writes hold
//!   permits while the partner applies them, and two nodes each waiting for the
//!   other's applies would stop the pair.
//!
//! The semaphore is fair (first come, first served), so a large command is not
//! starved by small ones. Units are KiB: one acquire covers up to 4 TiB.
//!
//! *Sessions.* First come, first served lets one client take the whole budget:
//! an iSCSI session with 128 reads of 16 MiB queued, read at the minimum rate,
//! held 2 GiB for hours and every other client waited behind it. So each
//! session (an iSCSI session, an NBD connection) takes its bytes from a
//! [`session`](BufferBudget::session_from) budget of its own, a share of the node's
//! (`[limits] session_buffer_max`, an eighth of the node's by default: see
//! *Sources*), and then from the node's: a permit holds the same bytes at
//! every level. A
//! session at its share waits on its own, holding nothing of the node's beyond
//! what it already has; the rules above apply at each level (a session's bytes
//! are released by the same events as the node's).
//!
//! *Sources.* A share per session still let one host hold everything: it may
//! open dozens of sessions (`sessions_per_source_max`) or NBD connections, each
//! with a share. So the sessions of one source address take their bytes from
//! that source's share first (`[limits] source_buffer_max`, a quarter of the
//! node's by default, and a session's share half of that, each at least
//! [`SESSION_BYTES_MIN`]):
//! [`session_from`](BufferBudget::session_from) makes a session of a source,
//! and a permit then holds its bytes at three levels: the session's, the
//! source's and the node's. A source's share lives as long as one of its
//! sessions does.
//!
//! Key invariant: bytes held by permits taken with `acquire`/`try_acquire` never
//! exceed the budget's maximum; `charge`d bytes may go beyond it and then hold
//! back every waiter until they are returned.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use tokio::sync::{Semaphore, SemaphorePermit};

/// Levels of a budget: a session's share, its source's and the node's.
const LEVELS_MAX: usize = 3;

/// What a level of a budget is the budget of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Node,
    Source,
    Session,
}

/// Bytes per unit of the budget.
const UNIT_BYTES: u64 = 1024;

/// Largest budget in units (4 TiB), also what [`BufferBudget::unlimited`] holds.
fn units_max() -> u64 {
    (u32::MAX as u64).min(Semaphore::MAX_PERMITS as u64)
}

/// The node's budget of buffered bytes; cloning shares it.
#[derive(Clone)]
pub struct BufferBudget {
    inner: Arc<Inner>,
}

struct Inner {
    sem: Semaphore,
    max_units: u64,
    held_units: AtomicU64,
    high_water_units: AtomicU64,
    /// Units charged beyond what the semaphore had: paid back from releases
    /// before any permit returns to the semaphore.
    debt_units: AtomicU64,
    waits: AtomicU64,
    refusals: AtomicU64,
    /// The budget this one is a share of (a session's: its source's or the
    /// node's; a source's: the node's).
    parent: Option<Arc<Inner>>,
    kind: Kind,
    /// Units of the share a [`BufferBudget::session_from`] of this node gets
    /// (at most `source_units`).
    session_units: u64,
    /// Units of the share the sessions of one source address get together.
    source_units: u64,
    /// Acquires of this node's sessions that waited for their session's own
    /// share (not for this budget).
    session_waits: AtomicU64,
    /// Acquires of this node's sessions that waited for their source's share.
    source_waits: AtomicU64,
    /// The node's live source shares, by address.
    sources: Mutex<HashMap<IpAddr, Weak<Inner>>>,
}

/// What the budget holds now and has held (for status and metrics).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct BufferStatus {
    /// The bound (`[limits] buffer_memory_max`).
    pub max_bytes: u64,
    /// Bytes held by permits now (KiB granularity); above `max_bytes` only while
    /// the partner's replicated writes overdraw it.
    pub held_bytes: u64,
    /// Most bytes held at once since start.
    pub high_water_bytes: u64,
    /// Acquires that had to wait for other permits to come back.
    pub waits: u64,
    /// Acquires refused at once (the caller answered "busy" instead of waiting).
    pub refusals: u64,
    /// The most one session may hold (`[limits] session_buffer_max`, at most
    /// `source_max_bytes`).
    pub session_max_bytes: u64,
    /// Acquires that waited because their session held its whole share.
    pub session_waits: u64,
    /// The most the sessions of one source address may hold together
    /// (`[limits] source_buffer_max`).
    pub source_max_bytes: u64,
    /// Acquires that waited because their source held its whole share.
    pub source_waits: u64,
}

/// Bytes of a budget held until dropped.
#[must_use = "the bytes go back to the budget when the permit is dropped"]
pub struct BufferPermit {
    inner: Option<Arc<Inner>>,
    units: u64,
}

impl std::fmt::Debug for BufferPermit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "BufferPermit({} KiB)", self.units)
    }
}

impl std::fmt::Debug for BufferBudget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("BufferBudget").field(&self.status()).finish()
    }
}

impl Default for BufferBudget {
    /// An unlimited budget (that still counts).
    fn default() -> Self {
        BufferBudget::unlimited()
    }
}

static NODE: OnceLock<BufferBudget> = OnceLock::new();

impl BufferBudget {
    /// A budget of `max_bytes` (at least 1 KiB, at most 4 TiB) whose sessions
    /// and sources get the default shares ([`default_session_bytes`],
    /// [`default_source_bytes`]).
    pub fn new(max_bytes: u64) -> BufferBudget {
        let (session, source) = (
            default_session_bytes(max_bytes),
            default_source_bytes(max_bytes),
        );
        BufferBudget::with_shares(max_bytes, session, source)
    }

    /// A budget of `max_bytes` whose [`session`](Self::session_from)s may hold at
    /// most `session_bytes` each, and the sessions of one source address at
    /// most `source_bytes` together (each at least [`SESSION_BYTES_MIN`], at
    /// most the whole budget; a session's share at most its source's).
    pub fn with_shares(max_bytes: u64, session_bytes: u64, source_bytes: u64) -> BufferBudget {
        let max_units = max_bytes.div_ceil(UNIT_BYTES).clamp(1, units_max());
        let share = |bytes: u64| {
            bytes
                .max(SESSION_BYTES_MIN)
                .div_ceil(UNIT_BYTES)
                .clamp(1, max_units)
        };
        let source_units = share(source_bytes);
        let mut node = Inner::new(max_units, None, Kind::Node);
        node.session_units = share(session_bytes).min(source_units);
        node.source_units = source_units;
        BufferBudget {
            inner: Arc::new(node),
        }
    }

    /// A budget for one session (an iSCSI session, an NBD connection) from
    /// `source`: its permits take their bytes from the session's share
    /// first, then from the share all sessions from that address hold
    /// together, then from the node's, so the session never holds more than
    /// its share, nor a client's many sessions more than one source's. A
    /// command larger than the share is clamped to it (it runs alone in its
    /// session). Of a session's budget: another session of the same node's.
    /// There is no session of no source: every frontend names its peer.
    pub fn session_from(&self, source: IpAddr) -> BufferBudget {
        let node = self.inner.root();
        // one key per host, as the per-source bounds of admission have
        let source = crate::admission::source_key(source);
        let share = {
            let mut sources = node.sources.lock().unwrap_or_else(|e| e.into_inner());
            match sources.get(&source).and_then(Weak::upgrade) {
                Some(s) => s,
                None => {
                    // addresses whose sessions have all ended go when another comes
                    sources.retain(|_, s| s.strong_count() > 0);
                    let s = Arc::new(Inner::new(
                        node.source_units,
                        Some(node.clone()),
                        Kind::Source,
                    ));
                    sources.insert(source, Arc::downgrade(&s));
                    s
                }
            }
        };
        BufferBudget {
            inner: Arc::new(Inner::new(node.session_units, Some(share), Kind::Session)),
        }
    }

    /// Bytes held now by the sessions of each source address that has one.
    pub fn sources_held(&self) -> Vec<(IpAddr, u64)> {
        let sources = self.inner.root().sources.lock();
        let sources = sources.unwrap_or_else(|e| e.into_inner());
        let mut held: Vec<(IpAddr, u64)> = sources
            .iter()
            .filter_map(|(a, s)| {
                let s = s.upgrade()?;
                Some((*a, s.held_units.load(Ordering::Acquire) * UNIT_BYTES))
            })
            .collect();
        held.sort();
        held
    }

    /// A budget so large it never holds anything back; it still counts.
    pub fn unlimited() -> BufferBudget {
        BufferBudget::new(units_max() * UNIT_BYTES)
    }

    /// The budget of this process's node: the one [`BufferBudget::install_node`]
    /// set, or an unlimited one if nothing was installed before the first call.
    /// For frontends that are not handed a budget explicitly.
    pub fn node() -> BufferBudget {
        NODE.get_or_init(BufferBudget::unlimited).clone()
    }

    /// Makes `b` this process's node budget; fails (giving `b` back) once a
    /// budget is in place, so the node installs it before starting anything.
    pub fn install_node(b: BufferBudget) -> Result<(), BufferBudget> {
        NODE.set(b)
    }

    /// The bound in bytes.
    pub fn max_bytes(&self) -> u64 {
        self.inner.max_units * UNIT_BYTES
    }

    /// Units for `bytes`, clamped to the whole budget so that one command larger
    /// than the budget can still run (alone).
    fn units_clamped(&self, bytes: u64) -> u64 {
        bytes.div_ceil(UNIT_BYTES).min(self.inner.max_units)
    }

    /// Takes `bytes` (clamped to the budget), waiting for other permits to come
    /// back when they are not free. Cancel-safe: dropping the future gives back
    /// whatever it had gathered.
    pub async fn acquire(&self, bytes: u64) -> BufferPermit {
        let units = self.units_clamped(bytes);
        if units == 0 {
            return BufferPermit::empty();
        }
        // units <= units_max() <= u32::MAX, and no more than any level's whole
        // (a share is at most the budget it is a share of)
        let n = units as u32;
        // each level in turn, this one first; what a cancelled wait had taken
        // goes back as its permits drop (no allocation: every command of
        // every frontend comes this way)
        let mut taken: [Option<SemaphorePermit<'_>>; LEVELS_MAX] = [None, None, None];
        for (slot, level) in taken.iter_mut().zip(self.inner.levels()) {
            *slot = Some(match level.sem.try_acquire_many(n) {
                Ok(p) => p,
                Err(_) => {
                    level.waits.fetch_add(1, Ordering::Relaxed);
                    level.count_share_wait();
                    match level.sem.acquire_many(n).await {
                        Ok(p) => p,
                        // never closed; what was taken goes back
                        Err(_) => return BufferPermit::empty(),
                    }
                }
            });
        }
        taken.into_iter().flatten().for_each(|p| p.forget());
        self.held(units)
    }

    /// Takes `bytes` (clamped to the budget) if they are free now, counting
    /// nothing: the fast path before a wait, or before answering "busy" (then
    /// call [`BufferBudget::count_refusal`]).
    pub fn try_acquire(&self, bytes: u64) -> Option<BufferPermit> {
        let units = self.units_clamped(bytes);
        if units == 0 {
            return Some(BufferPermit::empty());
        }
        let mut taken: [Option<SemaphorePermit<'_>>; LEVELS_MAX] = [None, None, None];
        for (slot, level) in taken.iter_mut().zip(self.inner.levels()) {
            *slot = Some(level.sem.try_acquire_many(units as u32).ok()?);
        }
        taken.into_iter().flatten().for_each(|p| p.forget());
        Some(self.held(units))
    }

    /// Records that a caller answered "busy" instead of waiting for bytes.
    /// Counted at every level: a session's refusals show in the node's status.
    pub fn count_refusal(&self) {
        for level in self.inner.levels() {
            level.refusals.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Counts `bytes` at once, without waiting, even beyond the budget (the
    /// excess is paid back from the next permits released, so waiters stay held
    /// back until the total is under the bound again). Only for work whose
    /// waiting could deadlock (see the module notes).
    pub fn charge(&self, bytes: u64) -> BufferPermit {
        let units = bytes.div_ceil(UNIT_BYTES);
        if units == 0 {
            return BufferPermit::empty();
        }
        let want = usize::try_from(units).unwrap_or(usize::MAX);
        for level in self.inner.levels() {
            let taken = level.sem.forget_permits(want) as u64;
            if taken < units {
                level.debt_units.fetch_add(units - taken, Ordering::AcqRel);
            }
        }
        self.held(units)
    }

    /// Counts `units` taken from every level's semaphore as held.
    fn held(&self, units: u64) -> BufferPermit {
        for level in self.inner.levels() {
            let now = level.held_units.fetch_add(units, Ordering::AcqRel) + units;
            level.high_water_units.fetch_max(now, Ordering::Relaxed);
        }
        BufferPermit {
            inner: Some(self.inner.clone()),
            units,
        }
    }

    /// What the budget holds now and has held.
    pub fn status(&self) -> BufferStatus {
        let i = &self.inner;
        BufferStatus {
            max_bytes: i.max_units * UNIT_BYTES,
            held_bytes: i.held_units.load(Ordering::Acquire) * UNIT_BYTES,
            high_water_bytes: i.high_water_units.load(Ordering::Relaxed) * UNIT_BYTES,
            waits: i.waits.load(Ordering::Relaxed),
            refusals: i.refusals.load(Ordering::Relaxed),
            session_max_bytes: i.session_units * UNIT_BYTES,
            session_waits: i.session_waits.load(Ordering::Relaxed),
            source_max_bytes: i.source_units * UNIT_BYTES,
            source_waits: i.source_waits.load(Ordering::Relaxed),
        }
    }
}

/// The smallest share of a budget a session gets (unless the budget is
/// smaller): the largest command a frontend takes bytes for at once (an NBD
/// request of up to 32 MiB, an iSCSI bidirectional command of 16 + 16 MiB).
/// A command is clamped to its session's share, but its buffer is not: with
/// a smaller share, commands would hold more memory than they count.
pub const SESSION_BYTES_MIN: u64 = 32 << 20;

/// The share of a budget of `max_bytes` the sessions of one source address
/// may hold together by default: a quarter, but at least
/// [`SESSION_BYTES_MIN`] and at most all of it.
pub fn default_source_bytes(max_bytes: u64) -> u64 {
    (max_bytes / 4).max(SESSION_BYTES_MIN).min(max_bytes)
}

/// The share one session may hold by default: half of its source's, so one
/// session that stops reading leaves its host's other sessions room (at
/// least [`SESSION_BYTES_MIN`], at most the source's share).
pub fn default_session_bytes(max_bytes: u64) -> u64 {
    let source = default_source_bytes(max_bytes);
    (source / 2).max(SESSION_BYTES_MIN).min(source)
}

impl Inner {
    fn new(max_units: u64, parent: Option<Arc<Inner>>, kind: Kind) -> Inner {
        Inner {
            sem: Semaphore::new(max_units as usize),
            max_units,
            held_units: AtomicU64::new(0),
            high_water_units: AtomicU64::new(0),
            debt_units: AtomicU64::new(0),
            waits: AtomicU64::new(0),
            refusals: AtomicU64::new(0),
            parent,
            kind,
            session_units: max_units,
            source_units: max_units,
            session_waits: AtomicU64::new(0),
            source_waits: AtomicU64::new(0),
            sources: Mutex::new(HashMap::new()),
        }
    }

    /// This budget, then the ones it is a share of.
    fn levels(&self) -> impl Iterator<Item = &Inner> {
        std::iter::successors(Some(self), |l| l.parent.as_deref())
    }

    /// The node's budget this one is (a share of).
    fn root(self: &Arc<Inner>) -> &Arc<Inner> {
        let mut l = self;
        while let Some(p) = &l.parent {
            l = p;
        }
        l
    }

    /// Counts, at the node, a wait of this level when it is a share.
    fn count_share_wait(&self) {
        let Some(node) = self.levels().last() else {
            return;
        };
        let counter = match self.kind {
            Kind::Node => return,
            Kind::Source => &node.source_waits,
            Kind::Session => &node.session_waits,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// Gives `units` held by a permit back to this level: first to a charge's
    /// debt, the rest to the waiters.
    fn release(&self, units: u64) {
        let mut give = units;
        // a charge that overdrew the budget is paid back before waiters get anything
        let mut debt = self.debt_units.load(Ordering::Acquire);
        while debt > 0 && give > 0 {
            let pay = debt.min(give);
            match self.debt_units.compare_exchange_weak(
                debt,
                debt - pay,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => {
                    give -= pay;
                    break;
                }
                Err(now) => debt = now,
            }
        }
        self.held_units.fetch_sub(units, Ordering::AcqRel);
        if give > 0 {
            self.sem.add_permits(give as usize);
        }
    }
}

impl BufferPermit {
    /// A permit for nothing (commands without data).
    pub fn empty() -> BufferPermit {
        BufferPermit {
            inner: None,
            units: 0,
        }
    }

    /// Bytes held (KiB granularity).
    pub fn bytes(&self) -> u64 {
        self.units * UNIT_BYTES
    }

    /// Gives back what is held beyond `bytes` (once a command knows how much
    /// of its data it really keeps, e.g. a read that ended in an error).
    pub fn shrink_to(&mut self, bytes: u64) {
        let keep = bytes.div_ceil(UNIT_BYTES);
        if keep >= self.units {
            return;
        }
        let Some(i) = &self.inner else { return };
        let excess = BufferPermit {
            inner: Some(i.clone()),
            units: self.units - keep,
        };
        self.units = keep;
        drop(excess);
    }

    /// Moves this permit's bytes into `self` from `other` (both must come from
    /// the same budget, or `other` must be empty).
    pub fn merge(&mut self, mut other: BufferPermit) {
        if other.units == 0 {
            return;
        }
        if self.inner.is_none() {
            std::mem::swap(self, &mut other);
            return;
        }
        // a permit of another budget (a session's and the node's) would be
        // given back to the wrong levels
        assert!(
            matches!((&self.inner, &other.inner), (Some(a), Some(b)) if Arc::ptr_eq(a, b)),
            "merged permits of different budgets"
        );
        self.units += other.units;
        other.units = 0;
        other.inner = None;
    }
}

impl Drop for BufferPermit {
    fn drop(&mut self) {
        let Some(i) = self.inner.take() else { return };
        // the session's share first: a waiter of this session may then go on
        // to the node's, which this release fills next
        i.levels().for_each(|level| level.release(self.units));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    const MIB: u64 = 1 << 20;

    /// A session of `node` from its own loopback address 127.0.0.`n`.
    fn session(node: &BufferBudget, n: u8) -> BufferBudget {
        node.session_from(IpAddr::from([127, 0, 0, n]))
    }

    #[tokio::test]
    async fn waits_until_bytes_come_back() {
        let b = BufferBudget::new(4 * MIB);
        let p1 = b.acquire(3 * MIB).await;
        assert_eq!(b.status().held_bytes, 3 * MIB);
        assert!(b.try_acquire(2 * MIB).is_none());
        b.count_refusal();
        let b2 = b.clone();
        let waiter = tokio::spawn(async move { b2.acquire(2 * MIB).await });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiter.is_finished(), "no room for 2 MiB while 3 are held");
        drop(p1);
        let p2 = waiter.await.unwrap();
        assert_eq!(p2.bytes(), 2 * MIB);
        let s = b.status();
        assert_eq!((s.held_bytes, s.high_water_bytes), (2 * MIB, 3 * MIB));
        assert_eq!((s.waits, s.refusals), (1, 1));
        drop(p2);
        assert_eq!(b.status().held_bytes, 0);
    }

    #[tokio::test]
    async fn a_command_larger_than_the_budget_runs_alone() {
        let b = BufferBudget::new(MIB);
        let small = b.acquire(4096).await;
        let b2 = b.clone();
        let big = tokio::spawn(async move { b2.acquire(16 * MIB).await });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!big.is_finished());
        drop(small);
        let big = big.await.unwrap();
        assert_eq!(big.bytes(), MIB, "clamped to the whole budget");
        assert!(b.try_acquire(1).is_none());
    }

    #[tokio::test]
    async fn charges_overdraw_and_hold_waiters_back_until_repaid() {
        let b = BufferBudget::new(2 * MIB);
        let p = b.acquire(MIB).await;
        let c = b.charge(3 * MIB);
        assert_eq!(b.status().held_bytes, 4 * MIB);
        let b2 = b.clone();
        let waiter = tokio::spawn(async move { b2.acquire(MIB).await });
        drop(p);
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiter.is_finished(), "3 MiB charged: still over the bound");
        drop(c);
        let w = waiter.await.unwrap();
        assert_eq!(b.status().held_bytes, MIB);
        drop(w);
        // everything back: the whole budget is free again, and no more
        let all = b.try_acquire(2 * MIB).expect("whole budget free");
        assert!(b.try_acquire(1).is_none());
        drop(all);
        assert_eq!(b.status().held_bytes, 0);
    }

    #[tokio::test]
    async fn merged_permits_release_together() {
        let b = BufferBudget::new(MIB);
        let mut p = BufferPermit::empty();
        p.merge(b.acquire(1000).await);
        p.merge(b.acquire(3000).await);
        assert_eq!(p.bytes(), 1024 + 3072);
        p.shrink_to(2000);
        assert_eq!((p.bytes(), b.status().held_bytes), (2048, 2048));
        drop(p);
        assert_eq!(b.status().held_bytes, 0);
        assert!(b.try_acquire(MIB).is_some());
    }

    #[tokio::test]
    async fn a_session_holds_at_most_its_share_and_others_go_on() {
        let node = BufferBudget::with_shares(128 * MIB, 32 * MIB, 128 * MIB);
        let a = session(&node, 11);
        let b = session(&node, 12);
        let a1 = a.acquire(16 * MIB).await;
        let a2 = a.acquire(16 * MIB).await;
        assert!(a.try_acquire(1).is_none(), "a holds its whole share");
        let a_more = a.clone();
        let waiter = tokio::spawn(async move { a_more.acquire(16 * MIB).await });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiter.is_finished(), "a waits for its own share");
        // the node has 96 MiB free: another session takes its share at once
        let b1 = b.try_acquire(32 * MIB).expect("b's share is free");
        let s = node.status();
        assert_eq!((s.held_bytes, s.session_max_bytes), (64 * MIB, 32 * MIB));
        assert_eq!((s.waits, s.session_waits), (0, 1));
        assert_eq!(a.status().held_bytes, 32 * MIB);
        drop(a1);
        let a3 = waiter.await.unwrap();
        assert_eq!(a.status().held_bytes, 32 * MIB);
        assert_eq!(node.status().held_bytes, 64 * MIB);
        drop((a2, a3, b1));
        assert_eq!(node.status().held_bytes, 0);
        assert_eq!(a.status().held_bytes, 0);
        assert!(
            node.try_acquire(128 * MIB).is_some(),
            "everything came back"
        );
    }

    #[tokio::test]
    async fn a_session_waiting_for_the_node_gives_its_share_back_when_cancelled() {
        let node = BufferBudget::with_shares(4 * MIB, 4 * MIB, 4 * MIB);
        let other = node.acquire(3 * MIB).await;
        let s = session(&node, 13);
        let s2 = s.clone();
        let waiter = tokio::spawn(async move { s2.acquire(2 * MIB).await });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiter.is_finished(), "the node has 1 MiB free");
        assert_eq!(node.status().waits, 1);
        waiter.abort();
        assert!(waiter.await.unwrap_err().is_cancelled());
        assert_eq!(s.status().held_bytes, 0);
        assert!(
            s.try_acquire(4 * MIB).is_none(),
            "the node still holds 3 MiB"
        );
        drop(other);
        let all = s.try_acquire(4 * MIB).expect("the share came back whole");
        assert_eq!(node.status().held_bytes, 4 * MIB);
        drop(all);
    }

    #[tokio::test]
    async fn a_sessions_command_larger_than_its_share_is_clamped_to_it() {
        let node = BufferBudget::with_shares(128 * MIB, 32 * MIB, 128 * MIB);
        let s = session(&node, 14);
        let big = s.acquire(64 * MIB).await;
        assert_eq!(big.bytes(), 32 * MIB);
        let mut c = s.charge(MIB);
        let held = |b: &BufferBudget| b.status().held_bytes;
        assert_eq!((held(&s), held(&node)), (33 * MIB, 33 * MIB));
        c.shrink_to(0);
        assert_eq!(held(&node), 32 * MIB);
        drop(big);
        assert_eq!((held(&s), held(&node)), (0, 0));
        // the charge's overdraw of the share was paid back: the share is whole
        assert!(s.try_acquire(32 * MIB).is_some());
        assert!(s
            .try_acquire(32 * MIB + 1)
            .is_some_and(|p| p.bytes() == 32 * MIB));
        // a share asked below the least is raised to it
        let small = BufferBudget::with_shares(128 * MIB, MIB, 128 * MIB);
        assert_eq!(small.status().session_max_bytes, SESSION_BYTES_MIN);
    }

    #[tokio::test]
    async fn the_sessions_of_one_source_hold_at_most_its_share_together() {
        let node = BufferBudget::with_shares(256 * MIB, 32 * MIB, 48 * MIB);
        let here: IpAddr = "127.0.0.2".parse().unwrap();
        let mapped: IpAddr = "::ffff:127.0.0.2".parse().unwrap();
        let (a, b) = (node.session_from(here), node.session_from(mapped));
        let other = node.session_from("127.0.0.3".parse().unwrap());
        let a1 = a.acquire(32 * MIB).await;
        assert!(a.try_acquire(1).is_none(), "a holds its session's share");
        let b1 = b.acquire(16 * MIB).await;
        // the same address (IPv4 or mapped): 48 MiB held, the source's share
        assert!(b.try_acquire(1).is_none(), "b's source holds its share");
        let b_more = b.clone();
        let waiter = tokio::spawn(async move { b_more.acquire(MIB).await });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiter.is_finished(), "b waits for its source's share");
        // another address goes on
        let o1 = other.try_acquire(32 * MIB).expect("another source's share");
        let s = node.status();
        assert_eq!(s.held_bytes, 80 * MIB);
        assert_eq!(
            (s.session_max_bytes, s.source_max_bytes),
            (32 * MIB, 48 * MIB)
        );
        assert_eq!((s.waits, s.session_waits, s.source_waits), (0, 0, 1));
        assert_eq!(
            node.sources_held(),
            [(here, 48 * MIB), ("127.0.0.3".parse().unwrap(), 32 * MIB)]
        );
        drop(a1);
        let b2 = waiter.await.unwrap();
        assert_eq!(node.status().held_bytes, 49 * MIB);
        drop((b1, b2, o1));
        assert_eq!(node.status().held_bytes, 0);
        // a source's share lives as long as one of its sessions
        drop((a, b, other));
        assert!(node.sources_held().is_empty());
        let again = node.session_from(here);
        assert!(again.try_acquire(32 * MIB).is_some(), "a new share, whole");
        // a session's share is at most its source's
        let small = BufferBudget::with_shares(256 * MIB, 128 * MIB, 64 * MIB);
        assert_eq!(small.status().session_max_bytes, 64 * MIB);
    }

    #[tokio::test]
    async fn a_session_waiting_for_the_node_gives_its_sources_share_back_when_cancelled() {
        let node = BufferBudget::with_shares(64 * MIB, 32 * MIB, 48 * MIB);
        let here: IpAddr = "127.0.0.2".parse().unwrap();
        let (a, b) = (node.session_from(here), node.session_from(here));
        let other = node.acquire(40 * MIB).await;
        let a1 = a.acquire(16 * MIB).await;
        // b's session and source have room, the node has 8 MiB
        let b2 = b.clone();
        let waiter = tokio::spawn(async move { b2.acquire(16 * MIB).await });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiter.is_finished());
        assert_eq!(node.status().waits, 1);
        waiter.abort();
        assert!(waiter.await.unwrap_err().is_cancelled());
        assert_eq!(
            node.sources_held(),
            [(here, 16 * MIB)],
            "b's bytes came back"
        );
        drop(other);
        // the source's share is whole but a's 16: b may take 32 at once
        let b1 = b.try_acquire(32 * MIB).expect("b's share and its source's");
        assert!(a.try_acquire(1).is_none(), "the source holds its 48 MiB");
        drop((a1, b1));
        assert_eq!(node.status().held_bytes, 0);
    }

    #[tokio::test]
    async fn a_charge_overdraws_a_source_and_holds_its_sessions_back_until_repaid() {
        let node = BufferBudget::with_shares(256 * MIB, 32 * MIB, 48 * MIB);
        let here: IpAddr = "127.0.0.2".parse().unwrap();
        let (a, b) = (node.session_from(here), node.session_from(here));
        let c = a.charge(64 * MIB);
        assert_eq!(node.sources_held(), [(here, 64 * MIB)]);
        assert!(b.try_acquire(MIB).is_none(), "the source is overdrawn");
        assert!(
            node.session_from("127.0.0.3".parse().unwrap())
                .try_acquire(32 * MIB)
                .is_some(),
            "another source is not"
        );
        drop(c);
        assert_eq!(node.status().held_bytes, 0);
        let whole = b.try_acquire(32 * MIB).expect("repaid: b's share is free");
        let rest = a.try_acquire(16 * MIB).expect("and the source's rest");
        assert!(a.try_acquire(1).is_none(), "but no more than 48 MiB");
        drop((whole, rest));
    }

    #[test]
    fn the_default_shares_are_a_quarter_and_an_eighth_within_bounds() {
        assert_eq!(default_source_bytes(2 << 30), 512 * MIB);
        assert_eq!(default_session_bytes(2 << 30), 256 * MIB);
        assert_eq!(default_source_bytes(64 * MIB), 32 * MIB);
        assert_eq!(default_session_bytes(64 * MIB), 32 * MIB);
        assert_eq!(default_session_bytes(8 * MIB), 8 * MIB);
        assert_eq!(default_session_bytes(8 * MIB), 8 * MIB);
        let b = BufferBudget::new(64 * MIB);
        assert_eq!(b.status().session_max_bytes, 32 * MIB);
        assert_eq!(session(&b, 15).status().max_bytes, 32 * MIB);
        let tiny = BufferBudget::new(8 * MIB);
        assert_eq!(session(&tiny, 16).status().max_bytes, 8 * MIB);
        // a session of a session is another session of the node
        let sibling = session(&session(&b, 17), 18);
        let p = sibling.try_acquire(MIB).unwrap();
        assert_eq!(
            (sibling.status().held_bytes, b.status().held_bytes),
            (MIB, MIB)
        );
        drop(p);
    }
}
