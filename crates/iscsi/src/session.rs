//! Sessions: the state a connection's tasks share, and the server-wide registry
//! (TSIH allocation, reinstatement, cross-session aborts for resets).

use crate::writer::Window;
use block::admission::LogGate;
use parking_lot::Mutex;
use scsi::{ItNexus, ScsiTarget};
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{watch, Notify};
use tokio::task::AbortHandle;

/// Identity of a session for reinstatement: initiator name, ISID, target, TPGT.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct SessionKey {
    pub initiator: String,
    pub isid: [u8; 6],
    pub target: usize,
    pub tpgt: u16,
}

/// A command executing in the SCSI layer.
pub(crate) struct Running {
    pub lun: u64,
    pub serial: u64,
    /// None during the command's first poll, on the connection's task (see
    /// `exec::spawn_command`): an abort then sets `aborted`, and the command
    /// is dropped instead of spawned (or, if that poll ran it to its end, not
    /// answered: `Session::aborted`).
    pub abort: Option<AbortHandle>,
    /// Aborted: during its first poll (then dropped instead of spawned), or
    /// since (its entry stays until its medium changes end, `scsi::in_flight`).
    pub aborted: bool,
}

impl Running {
    fn abort(&mut self) {
        self.aborted = true;
        if let Some(h) = &self.abort {
            h.abort();
        }
    }
}

/// A running command: its tag and serial (see [`Session::abort_where`]).
pub(crate) type TaskId = (u32, u64);

/// Most aborts of pending writes remembered per session.
const WRITE_ABORT_LUNS_MAX: usize = 4096;

/// Aborts of a session's writes still collecting Data-Out, by generation: the
/// latest abort of each LUN and of every LUN at once. Exact, so that aborts
/// on one LUN never drop a write on another (review of 2026-12-06: a bounded
/// list of marks counted a write as aborted once its marks were forgotten, so
/// 257 LU resets of a shared LU dropped another host's writes on its own,
/// unanswered).
#[derive(Default)]
pub(crate) struct WriteAborts {
    gen: u64,
    /// The generation of the latest abort of every LUN at once.
    all: u64,
    /// The generation of the latest abort of each LUN (as this session
    /// numbers it: one per LU it sees; past [`WRITE_ABORT_LUNS_MAX`], folded
    /// into `all`).
    by_lun: HashMap<u64, u64>,
}

/// What the tasks of one session share.
pub(crate) struct Session {
    pub tsih: u16,
    pub key: Option<SessionKey>,
    /// Index of the target (normal sessions).
    pub target: Option<usize>,
    pub scsi: Option<Arc<ScsiTarget>>,
    pub nexus: Option<ItNexus>,
    pub window: Arc<Window>,
    /// This session's share of the node's budget of buffered bytes
    /// ([`block::BufferBudget::session_from`] its source address): its
    /// commands' data take their bytes from it, so one session never holds
    /// more than `[limits] session_buffer_max` of the node's buffers, nor the
    /// sessions of one address more than `source_buffer_max`.
    pub buffers: block::BufferBudget,
    pub running: Mutex<HashMap<u32, Running>>,
    pub task_done: Notify,
    write_aborts: Mutex<WriteAborts>,
    serial: AtomicU64,
    /// Set to true to make the session close (reinstatement, shutdown, cold reset).
    pub kill: watch::Sender<bool>,
    /// Becomes true once the session has fully ended.
    pub ended: watch::Sender<bool>,
    /// Who logged in, from where: decides who may reinstate the session.
    pub origin: Origin,
    /// A discovery session (counted against the discovery caps, not `sessions_max`).
    pub discovery: bool,
    /// Set when the registry told the session to close to make room; it no longer
    /// counts against the caps.
    evicted: AtomicBool,
    /// Order of creation (smaller is older).
    created: u64,
    /// Read and write commands this session finished (per-path statistics).
    pub io: SessionIo,
}

/// Read and write commands a session finished: relaxed atomic adds on the
/// command's completion, read as a [`SessionIoStats`] snapshot.
#[derive(Default)]
pub(crate) struct SessionIo {
    reads: AtomicU64,
    writes: AtomicU64,
    read_bytes: AtomicU64,
    write_bytes: AtomicU64,
    latency_sum_us: AtomicU64,
}

/// What a session's read and write commands did since it logged in.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SessionIoStats {
    /// Commands with the Read flag (and not the Write flag) finished.
    pub reads: u64,
    /// Commands with the Write flag finished.
    pub writes: u64,
    /// Data-In bytes of the reads.
    pub read_bytes: u64,
    /// Data-Out bytes of the writes.
    pub write_bytes: u64,
    /// Sum of the reads' and writes' latencies (arrival at the LU to its answer),
    /// in microseconds.
    pub latency_sum_us: u64,
}

impl SessionIo {
    /// Counts a finished read (`write` false) or write of `bytes` that took `us`.
    pub(crate) fn record(&self, write: bool, bytes: u64, us: u64) {
        let (n, b) = if write {
            (&self.writes, &self.write_bytes)
        } else {
            (&self.reads, &self.read_bytes)
        };
        n.fetch_add(1, Ordering::Relaxed);
        b.fetch_add(bytes, Ordering::Relaxed);
        self.latency_sum_us.fetch_add(us, Ordering::Relaxed);
    }

    pub(crate) fn snapshot(&self) -> SessionIoStats {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        SessionIoStats {
            reads: get(&self.reads),
            writes: get(&self.writes),
            read_bytes: get(&self.read_bytes),
            write_bytes: get(&self.write_bytes),
            latency_sum_us: get(&self.latency_sum_us),
        }
    }
}

/// Hands out creation order numbers.
static CREATED: AtomicU64 = AtomicU64::new(0);

/// Where a session comes from and who it proved to be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Origin {
    /// Source address of the connection.
    pub source: IpAddr,
    /// CHAP name authenticated at login, if CHAP was used.
    pub chap_user: Option<String>,
    /// The CHAP credentials were the initiator's own (per-initiator entry).
    pub chap_per_initiator: bool,
    /// The CHAP credentials proved (an EXTENDED COPY reaches another target's
    /// LUs only when that target would ask the same of this initiator).
    pub chap_proven: Option<iscsi_proto::login::ChapCredentials>,
    /// CHAP was done with a weak digest, MD5 or SHA-1 (a target that comes to
    /// refuse them closes the session).
    pub chap_weak: bool,
    /// The TPGT of the portal it logged in through (its sessions close when
    /// that portal is removed).
    pub tpgt: u16,
}

impl Origin {
    /// Whether a login from `new` may reinstate (close and replace) a session
    /// from `self` with the same initiator name and ISID. With the initiator's own
    /// CHAP secret, the same CHAP name is enough (it proves the identity, from any
    /// address). With a shared secret (the target-wide one) or without CHAP, the
    /// same CHAP name (or none) and also the same source address are needed:
    /// anyone may claim an initiator name, and a shared secret does not tell
    /// initiators apart.
    pub(crate) fn may_reinstate(&self, new: &Origin) -> bool {
        self.chap_user == new.chap_user
            && self.chap_per_initiator == new.chap_per_initiator
            && (new.chap_per_initiator || self.source == new.source)
    }
}

impl Session {
    pub(crate) fn new(
        tsih: u16,
        key: Option<SessionKey>,
        target: Option<usize>,
        scsi: Option<Arc<ScsiTarget>>,
        nexus: Option<ItNexus>,
        window: Arc<Window>,
        origin: Origin,
    ) -> Self {
        Session {
            tsih,
            discovery: key.is_none(),
            key,
            target,
            scsi,
            nexus,
            window,
            buffers: block::BufferBudget::node().session_from(origin.source),
            origin,
            evicted: AtomicBool::new(false),
            created: CREATED.fetch_add(1, Ordering::Relaxed),
            running: Mutex::new(HashMap::new()),
            task_done: Notify::new(),
            serial: AtomicU64::new(1),
            kill: watch::channel(false).0,
            ended: watch::channel(false).0,
            io: SessionIo::default(),
            write_aborts: Mutex::new(WriteAborts::default()),
        }
    }

    /// The session with its share taken from `node` (the frontend's budget)
    /// instead of the process's node budget.
    pub(crate) fn with_buffers(mut self, node: &block::BufferBudget) -> Self {
        self.buffers = node.session_from(self.origin.source);
        self
    }

    /// Writes of this session still collecting Data-Out on `lun` (as this
    /// session numbers it; `None`: every LUN) are aborted by another session's
    /// reset or PREEMPT AND ABORT: the connection that holds them drops them
    /// when their data is complete (`write_aborted`) instead of executing them.
    pub(crate) fn abort_pending_writes(&self, lun: Option<u64>) {
        let mut w = self.write_aborts.lock();
        w.gen += 1;
        let gen = w.gen;
        match lun {
            Some(l) if w.by_lun.len() < WRITE_ABORT_LUNS_MAX || w.by_lun.contains_key(&l) => {
                w.by_lun.insert(l, gen);
            }
            // every LUN, or (never with LUNs the session sees) too many
            _ => w.all = gen,
        }
    }

    /// The abort generation a write still collecting Data-Out starts in.
    pub(crate) fn write_abort_gen(&self) -> u64 {
        self.write_aborts.lock().gen
    }

    /// Whether a write on `lun` that started in generation `since` was aborted
    /// by [`Session::abort_pending_writes`].
    pub(crate) fn write_aborted(&self, lun: u64, since: u64) -> bool {
        let w = self.write_aborts.lock();
        let latest = w.by_lun.get(&lun).copied().unwrap_or(0).max(w.all);
        latest > since
    }

    /// Order of creation: tells apart sessions that reuse a TSIH.
    pub(crate) fn created(&self) -> u64 {
        self.created
    }

    pub(crate) fn next_serial(&self) -> u64 {
        self.serial.fetch_add(1, Ordering::Relaxed)
    }

    /// Removes a finished command (only the entry it created).
    pub(crate) fn finish(&self, itt: u32, serial: u64) {
        let mut r = self.running.lock();
        if r.get(&itt).is_some_and(|e| e.serial == serial) {
            r.remove(&itt);
        }
        drop(r);
        self.task_done.notify_waiters();
    }

    /// Whether the running command `itt` (`serial`) was aborted. Looked at
    /// before the command is answered: an abort after that finds a command that
    /// completed first (and still waits for its entry to go, after the answer).
    pub(crate) fn aborted(&self, itt: u32, serial: u64) -> bool {
        self.running
            .lock()
            .get(&itt)
            .is_some_and(|e| e.serial == serial && e.aborted)
    }

    /// Aborts running commands matching `pred` (on their LUN); returns them,
    /// each by its tag and serial (an initiator may give a tag to a new
    /// command once the old one is answered: a wait for the aborted one must
    /// not wait for that one; review of 2026-12-06).
    pub(crate) fn abort_where(&self, pred: impl Fn(u64) -> bool) -> Vec<TaskId> {
        let mut r = self.running.lock();
        let mut tasks = Vec::new();
        for (itt, t) in r.iter_mut() {
            if pred(t.lun) {
                t.abort();
                tasks.push((*itt, t.serial));
            }
        }
        tasks
    }

    /// Aborts the running command `itt` of LUN `lun`; None if no such
    /// command runs.
    pub(crate) fn abort_where_itt(&self, itt: u32, lun: u64) -> Option<TaskId> {
        let mut r = self.running.lock();
        let t = r.get_mut(&itt).filter(|t| t.lun == lun)?;
        t.abort();
        Some((itt, t.serial))
    }

    /// Waits until none of `tasks` is running any more (or the timeout passes).
    /// Whether they are gone.
    pub(crate) async fn wait_gone(&self, tasks: &[TaskId], timeout: Duration) -> bool {
        let wait = async {
            loop {
                let notified = self.task_done.notified();
                tokio::pin!(notified);
                notified.as_mut().enable();
                {
                    let r = self.running.lock();
                    let running =
                        |&(itt, serial): &TaskId| r.get(&itt).is_some_and(|e| e.serial == serial);
                    if !tasks.iter().any(running) {
                        return;
                    }
                }
                notified.await;
            }
        };
        tokio::time::timeout(timeout, wait).await.is_ok()
    }

    /// Waits until none of `itts` is running, however long that takes,
    /// saying every `drain` that it still waits (`what`: for what). For the
    /// paths that must not go on while an aborted write may still land: a
    /// connection's end (the session's `ended`, which a reinstatement waits
    /// for), a logout's answer, PREEMPT AND ABORT's. Before (review of
    /// 2026-12-06) they went on after `drain` as if the commands had ended,
    /// and a write a stalled disk finished later could land over what the
    /// initiator wrote next.
    pub(crate) async fn wait_all_gone(&self, tasks: &[TaskId], drain: Duration, what: &str) {
        while !self.wait_gone(tasks, drain).await {
            tracing::warn!(
                tsih = self.tsih,
                what,
                "aborted commands still at the volume: waiting for them before going on"
            );
        }
    }

    /// Waits until no command is running (or the timeout passes).
    pub(crate) async fn drain(&self, timeout: Duration) {
        let tasks: Vec<TaskId> = (self.running.lock().iter())
            .map(|(itt, e)| (*itt, e.serial))
            .collect();
        self.wait_gone(&tasks, timeout).await;
    }
}

/// Every session of the server.
pub(crate) struct Registry {
    inner: Mutex<RegInner>,
    caps: Caps,
    log: LogGate,
}

/// How many sessions the registry holds.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Caps {
    /// Normal sessions in all.
    pub sessions_max: usize,
    /// Discovery sessions in all.
    pub discovery_sessions_max: usize,
    /// Discovery sessions from one source address.
    pub discovery_sessions_per_source_max: usize,
    /// Normal sessions from one source address.
    pub sessions_per_source_max: usize,
}

pub(crate) use block::admission::source_key;

#[derive(Default)]
struct RegInner {
    next_tsih: u16,
    sessions: HashMap<u16, Arc<Session>>,
}

/// Why a session could not be registered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RegisterError {
    /// `sessions_max` normal sessions exist, or `sessions_per_source_max`
    /// from this source.
    Full,
    /// A session with this key exists and the login is not from its identity;
    /// carries the existing session's source address.
    NotSameIdentity(IpAddr),
}

impl Registry {
    /// An empty registry with these caps.
    pub(crate) fn new(caps: Caps) -> Registry {
        Registry {
            inner: Mutex::new(RegInner::default()),
            caps: Caps {
                sessions_max: caps.sessions_max,
                discovery_sessions_max: caps.discovery_sessions_max.max(1),
                discovery_sessions_per_source_max: caps.discovery_sessions_per_source_max.max(1),
                sessions_per_source_max: caps.sessions_per_source_max.max(1),
            },
            log: LogGate::new(Duration::from_secs(1)),
        }
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.inner.lock().sessions.len()
    }

    /// The registered sessions (for metrics), oldest first.
    pub(crate) fn snapshot(&self) -> Vec<Arc<Session>> {
        let mut v: Vec<Arc<Session>> = self.inner.lock().sessions.values().cloned().collect();
        v.sort_by_key(|s| s.created);
        v
    }

    /// Allocates a TSIH, builds the session with it and registers it. Returns the
    /// new session and the session it reinstates (same key), if any; a session
    /// with the same key but another identity ([`Origin::may_reinstate`]) is kept
    /// and the new one refused.
    ///
    /// A normal session (with a key) is refused when `sessions_max` normal sessions
    /// exist. A discovery session (no key) always gets in: when its source is at
    /// its cap, that source's oldest discovery session is told to close; when all
    /// discovery sessions are used, the oldest of the source holding the most is.
    pub(crate) fn register(
        &self,
        key: Option<&SessionKey>,
        origin: &Origin,
        build: impl FnOnce(u16) -> Session,
    ) -> Result<(Arc<Session>, Option<Arc<Session>>), RegisterError> {
        let source = origin.source;
        let mut g = self.inner.lock();
        // a session being closed already (reinstated, killed) may still be
        // registered beside the one that took its place: the live one is the
        // one to reinstate
        let old = key.and_then(|k| {
            g.sessions
                .values()
                .filter(|s| s.key.as_ref() == Some(k))
                .max_by_key(|s| (!*s.kill.borrow(), s.created))
                .cloned()
        });
        if let Some(old) = &old {
            if !old.origin.may_reinstate(origin) {
                return Err(RegisterError::NotSameIdentity(old.origin.source));
            }
        }
        if key.is_some() {
            let normal = g.sessions.values().filter(|s| !s.discovery).count();
            if old.is_none() && normal >= self.caps.sessions_max {
                return Err(RegisterError::Full);
            }
            // one source never takes every session from the others
            let here = source_key(source);
            let from_here = g
                .sessions
                .values()
                .filter(|s| !s.discovery && source_key(s.origin.source) == here)
                .count();
            if old.is_none() && from_here >= self.caps.sessions_per_source_max {
                return Err(RegisterError::Full);
            }
        } else {
            self.make_room_for_discovery(&g, source);
        }
        if g.sessions.len() >= usize::from(u16::MAX) {
            return Err(RegisterError::Full);
        }
        let mut tsih = g.next_tsih;
        loop {
            tsih = tsih.wrapping_add(1);
            if tsih != 0 && !g.sessions.contains_key(&tsih) {
                break;
            }
        }
        g.next_tsih = tsih;
        let s = Arc::new(build(tsih));
        g.sessions.insert(tsih, s.clone());
        Ok((s, old))
    }

    fn make_room_for_discovery(&self, g: &RegInner, source: IpAddr) {
        let live: Vec<&Arc<Session>> = g
            .sessions
            .values()
            .filter(|s| s.discovery && !s.evicted.load(Ordering::Relaxed))
            .collect();
        let source = source_key(source);
        let mut per_source: HashMap<IpAddr, usize> = HashMap::new();
        for s in &live {
            *per_source.entry(source_key(s.origin.source)).or_default() += 1;
        }
        let own = per_source.get(&source).copied().unwrap_or(0);
        let from = if own >= self.caps.discovery_sessions_per_source_max {
            source
        } else if live.len() >= self.caps.discovery_sessions_max {
            match per_source.iter().max_by_key(|(_, n)| **n) {
                Some((ip, _)) => *ip,
                None => return,
            }
        } else {
            return;
        };
        let Some(victim) = live
            .iter()
            .filter(|s| source_key(s.origin.source) == from)
            .min_by_key(|s| s.created)
        else {
            return;
        };
        victim.evicted.store(true, Ordering::Relaxed);
        victim.kill.send_replace(true);
        if let Some(suppressed) = self.log.allow() {
            tracing::warn!(
                source = %from,
                new_from = %source,
                tsih = victim.tsih,
                suppressed,
                "discovery session cap reached: closing the oldest discovery session of {from}"
            );
        }
    }

    /// Removes `session` (not another that has since taken its TSIH).
    pub(crate) fn remove_session(&self, session: &Arc<Session>) {
        let mut g = self.inner.lock();
        if g.sessions
            .get(&session.tsih)
            .is_some_and(|s| Arc::ptr_eq(s, session))
        {
            g.sessions.remove(&session.tsih);
        }
    }

    /// Whether a later session with `session`'s key (its I_T nexus) is
    /// registered and not being closed: the session that reinstated it, which
    /// owns the nexus's state from then on.
    pub(crate) fn has_live_successor(&self, session: &Session) -> bool {
        let Some(key) = &session.key else {
            return false;
        };
        self.inner.lock().sessions.values().any(|s| {
            s.key.as_ref() == Some(key) && s.created > session.created && !*s.kill.borrow()
        })
    }

    /// Sessions logged in to target `idx`.
    pub(crate) fn of_target(&self, idx: usize) -> Vec<Arc<Session>> {
        self.inner
            .lock()
            .sessions
            .values()
            .filter(|s| s.target == Some(idx))
            .cloned()
            .collect()
    }
}

/// The SCSI initiator port name of a session: `<name>,i,0x<isid>`.
pub(crate) fn initiator_port(name: &str, isid: &[u8; 6]) -> String {
    let mut v = [0u8; 8];
    v[2..].copy_from_slice(isid);
    format!("{name},i,0x{:012x}", u64::from_be_bytes(v))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn build(tsih: u16, key: Option<SessionKey>) -> Session {
        build_from(tsih, key, "10.0.0.1")
    }

    fn origin(source: &str) -> Origin {
        Origin {
            source: source.parse().unwrap(),
            chap_user: None,
            chap_per_initiator: false,
            chap_proven: None,
            chap_weak: false,
            tpgt: 1,
        }
    }

    fn build_from(tsih: u16, key: Option<SessionKey>, source: &str) -> Session {
        let origin = origin(source);
        Session::new(
            tsih,
            key,
            Some(0),
            None,
            None,
            Arc::new(Window::new(1, 8)),
            origin,
        )
    }

    fn caps(sessions_max: usize) -> Caps {
        Caps {
            sessions_max,
            discovery_sessions_max: 3,
            discovery_sessions_per_source_max: 2,
            sessions_per_source_max: sessions_max,
        }
    }

    #[test]
    fn one_source_never_takes_every_session() {
        let reg = Registry::new(Caps {
            sessions_per_source_max: 2,
            ..caps(5)
        });
        let new = |src: &str, isid: u8| {
            let key = SessionKey {
                initiator: "iqn.a".into(),
                isid: [isid; 6],
                target: 0,
                tpgt: 1,
            };
            let r = reg.register(Some(&key), &origin(src), |t| {
                build_from(t, Some(key.clone()), src)
            });
            r.map(|_| ())
        };
        assert!(new("10.0.0.66", 1).is_ok());
        assert!(new("10.0.0.66", 2).is_ok());
        assert_eq!(new("10.0.0.66", 3), Err(RegisterError::Full));
        // hosts of one IPv6 /64 (one LAN) each have their own
        assert!(new("2001:db8::1", 4).is_ok());
        assert!(new("2001:db8::1", 5).is_ok());
        assert_eq!(new("2001:db8::1", 6), Err(RegisterError::Full));
        // an IPv4 peer of a dual-stack portal is its IPv4 address
        assert_eq!(
            source_key("::ffff:10.0.0.66".parse().unwrap()),
            source_key("10.0.0.66".parse().unwrap())
        );
        assert_ne!(
            source_key("::ffff:10.0.0.66".parse().unwrap()),
            source_key("::ffff:10.0.0.67".parse().unwrap())
        );
        // another source still gets in, up to the total
        assert!(new("10.0.0.7", 7).is_ok());
        assert_eq!(new("10.0.0.8", 8), Err(RegisterError::Full));
    }

    #[test]
    fn discovery_sessions_have_their_own_caps() {
        let reg = Registry::new(caps(1));
        let d = |src: &'static str| {
            reg.register(None, &origin(src), |t| build_from(t, None, src))
                .unwrap()
                .0
        };
        let a1 = d("10.0.0.66");
        let a2 = d("10.0.0.66");
        let a3 = d("10.0.0.66");
        // The source's own oldest went, nobody else's.
        assert!(*a1.kill.borrow() && !*a2.kill.borrow() && !*a3.kill.borrow());
        let g = d("10.0.0.7");
        let g2 = d("10.0.0.8");
        // All three used: the source with the most gives its oldest.
        assert!(*a2.kill.borrow() && !*g.kill.borrow() && !*g2.kill.borrow());
        // Discovery sessions do not count against sessions_max.
        let key = SessionKey {
            initiator: "iqn.a".into(),
            isid: [1; 6],
            target: 0,
            tpgt: 1,
        };
        assert!(reg
            .register(Some(&key), &origin("10.0.0.7"), |t| build(
                t,
                Some(key.clone())
            ))
            .is_ok());
        let other = SessionKey {
            isid: [2; 6],
            ..key.clone()
        };
        assert!(reg
            .register(Some(&other), &origin("10.0.0.7"), |t| build(
                t,
                Some(other.clone())
            ))
            .is_err());
    }

    #[test]
    fn port_name() {
        assert_eq!(
            initiator_port("iqn.a", &[0x80, 0x12, 0x34, 0x56, 0x78, 0x9a]),
            "iqn.a,i,0x80123456789a"
        );
    }

    #[test]
    fn tsih_allocation_and_reinstatement() {
        let reg = Registry::new(caps(2));
        let key = SessionKey {
            initiator: "iqn.a".into(),
            isid: [1; 6],
            target: 0,
            tpgt: 1,
        };
        let (a, old) = reg
            .register(Some(&key), &origin("10.0.0.1"), |t| {
                build(t, Some(key.clone()))
            })
            .unwrap();
        assert!(old.is_none());
        assert_ne!(a.tsih, 0);
        let (b, old) = reg
            .register(Some(&key), &origin("10.0.0.1"), |t| {
                build(t, Some(key.clone()))
            })
            .unwrap();
        assert_eq!(old.map(|o| o.tsih), Some(a.tsih));
        assert_ne!(a.tsih, b.tsih);
        // Registry full for a new key (two entries until the old one ends).
        let other = SessionKey {
            isid: [2; 6],
            ..key.clone()
        };
        assert!(reg
            .register(Some(&other), &origin("10.0.0.1"), |t| build(
                t,
                Some(other.clone())
            ))
            .is_err());
        reg.remove_session(&a);
        assert!(reg
            .register(Some(&other), &origin("10.0.0.1"), |t| build(
                t,
                Some(other.clone())
            ))
            .is_ok());
        assert_eq!(reg.of_target(0).len(), 2);
        assert_eq!(reg.len(), 2);
    }

    #[test]
    fn only_the_same_identity_reinstates() {
        let a = origin("10.0.0.1");
        let b = origin("10.0.0.2");
        assert!(a.may_reinstate(&a));
        assert!(!a.may_reinstate(&b), "no CHAP: another address may not");
        let shared = |src: &str| Origin {
            chap_user: Some("alice".into()),
            ..origin(src)
        };
        assert!(shared("10.0.0.1").may_reinstate(&shared("10.0.0.1")));
        assert!(!shared("10.0.0.1").may_reinstate(&shared("10.0.0.2")));
        assert!(!shared("10.0.0.1").may_reinstate(&a));
        let own = |src: &str, user: &str| Origin {
            chap_user: Some(user.into()),
            chap_per_initiator: true,
            ..origin(src)
        };
        assert!(own("10.0.0.1", "bob").may_reinstate(&own("10.0.0.9", "bob")));
        assert!(!own("10.0.0.1", "bob").may_reinstate(&own("10.0.0.1", "eve")));
        assert!(!own("10.0.0.1", "alice").may_reinstate(&shared("10.0.0.1")));
        // In the registry: refused, and the old session is untouched.
        let reg = Registry::new(caps(8));
        let key = SessionKey {
            initiator: "iqn.a".into(),
            isid: [1; 6],
            target: 0,
            tpgt: 1,
        };
        let (s, _) = reg
            .register(Some(&key), &a, |t| build(t, Some(key.clone())))
            .unwrap();
        assert_eq!(
            reg.register(Some(&key), &b, |t| build(t, Some(key.clone())))
                .err(),
            Some(RegisterError::NotSameIdentity(a.source))
        );
        assert!(!*s.kill.borrow() && reg.len() == 1);
        assert!(reg.snapshot().iter().any(|x| x.tsih == s.tsih));
    }

    /// A reinstated session's late end leaves the nexus's state to the session
    /// that took its place; a session closed with no successor does not.
    #[test]
    fn a_reinstated_session_knows_its_successor() {
        let reg = Registry::new(caps(8));
        let key = SessionKey {
            initiator: "iqn.a".into(),
            isid: [1; 6],
            target: 0,
            tpgt: 1,
        };
        let o = origin("10.0.0.1");
        let (first, none) = reg
            .register(Some(&key), &o, |t| build(t, Some(key.clone())))
            .unwrap();
        assert!(none.is_none());
        assert!(!reg.has_live_successor(&first));
        let (second, old) = reg
            .register(Some(&key), &o, |t| build(t, Some(key.clone())))
            .unwrap();
        assert!(Arc::ptr_eq(&old.unwrap(), &first));
        let _ = first.kill.send_replace(true);
        assert!(reg.has_live_successor(&first));
        assert!(!reg.has_live_successor(&second));
        // the successor being closed too: the old one's end does it
        let _ = second.kill.send_replace(true);
        assert!(!reg.has_live_successor(&first));
    }

    #[test]
    fn pending_writes_are_aborted_by_lun_and_by_generation() {
        let s = build(1, None);
        let before = s.write_abort_gen();
        s.abort_pending_writes(Some(3));
        // a write on LUN 3 that started before is aborted, one on LUN 4 is not
        assert!(s.write_aborted(3, before));
        assert!(!s.write_aborted(4, before));
        // one that started after is not
        let after = s.write_abort_gen();
        assert!(!s.write_aborted(3, after));
        s.abort_pending_writes(None);
        assert!(s.write_aborted(4, after));
        // however many aborts of another LUN come, a write on this one is
        // not aborted by them (a bounded list of marks counted it aborted)
        let old = s.write_abort_gen();
        for _ in 0..10_000 {
            s.abort_pending_writes(Some(9));
        }
        assert!(!s.write_aborted(4, old));
        assert!(s.write_aborted(9, old));
        assert!(!s.write_aborted(9, s.write_abort_gen()));
    }

    #[tokio::test]
    async fn finish_only_removes_own_entry() {
        let s = build(1, None);
        let h = tokio::spawn(async {});
        s.running.lock().insert(
            5,
            Running {
                lun: 0,
                serial: 2,
                abort: Some(h.abort_handle()),
                aborted: false,
            },
        );
        s.finish(5, 1);
        assert!(s.running.lock().contains_key(&5));
        s.finish(5, 2);
        assert!(s.running.lock().is_empty());
        s.wait_gone(&[(5, 2)], Duration::from_millis(10)).await;
    }

    /// An abort waits for the commands it aborted, not for a new command the
    /// initiator gave the same tag once the old one was answered (RFC 7143
    /// 3.2.4.3: tags are unique among outstanding tasks only). Before (review
    /// of 2026-12-06) the wait was by tag, and a LUN reset answered FUNCTION
    /// REJECTED for a command on another LUN that reused a tag.
    #[tokio::test]
    async fn an_abort_waits_for_its_commands_not_for_their_tags_reused() {
        let s = build(1, None);
        let entry = |serial| Running {
            lun: 0,
            serial,
            abort: None,
            aborted: false,
        };
        s.running.lock().insert(5, entry(1));
        let aborted = s.abort_where(|_| true);
        assert_eq!(aborted, vec![(5, 1)]);
        s.finish(5, 1);
        s.running.lock().insert(5, entry(2));
        assert!(s.wait_gone(&aborted, Duration::from_millis(50)).await);
    }
}
