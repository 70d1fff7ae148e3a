//! Several paths (one session per portal) to the same logical unit as one volume.
//!
//! Path selection is round-robin over healthy paths or failover-only. A path
//! failure (transport error, command timeout, NOT READY such as ALUA standby) marks
//! the path failed, reports a [`PathEvent`], closes its session and retries the I/O
//! on another healthy path; a background task per failed path logs in again with
//! the same ISID under a bounded exponential backoff and restores it.

use crate::lun::{IscsiLun, LunError};
use crate::InitiatorError;
use async_trait::async_trait;
use block::{BlockError, BlockResult, Bytes, Geometry, Volume};
use parking_lot::{Mutex, RwLock};
use std::collections::VecDeque;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, SystemTime};
use tokio::sync::{broadcast, Notify};

/// Path events kept for [`Multipath::path_event_history`].
const EVENT_HISTORY_MAX: usize = 256;
/// Capacity of the path event broadcast channel.
const EVENT_CHANNEL_CAPACITY: usize = 64;
/// Most attempts of one I/O across paths before giving up.
const IO_ATTEMPTS_MAX: u32 = 64;

/// How I/O is spread over healthy paths.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PathPolicy {
    /// Each I/O goes to the next healthy path.
    RoundRobin,
    /// All I/O goes to one path until it fails.
    FailoverOnly,
}

/// Multipath behaviour.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MultipathOptions {
    /// Path selection policy.
    pub policy: PathPolicy,
    /// First delay before re-logging in to a failed path.
    pub reconnect_backoff_min_ms: u64,
    /// Largest delay between re-login attempts.
    pub reconnect_backoff_max_ms: u64,
    /// How long an I/O waits for a path to come back when none is healthy.
    pub no_path_wait_ms: u64,
    /// Delay before a write-type request that failed on a path is re-issued on
    /// another. At error recovery level 0 the target may still execute the copy it
    /// received on the dead connection; waiting lets it drain so that the stale copy
    /// cannot land after a later overlapping write sent through the other path.
    pub in_doubt_retry_delay_ms: u64,
}

impl Default for MultipathOptions {
    fn default() -> Self {
        MultipathOptions {
            policy: PathPolicy::RoundRobin,
            reconnect_backoff_min_ms: 100,
            reconnect_backoff_max_ms: 5_000,
            no_path_wait_ms: 5_000,
            in_doubt_retry_delay_ms: 100,
        }
    }
}

/// What happened to a path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PathEventKind {
    /// The path stopped serving I/O.
    Failed {
        /// Why.
        reason: String,
    },
    /// The path serves I/O again (re-logged in).
    Restored,
}

/// A change of a path's state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathEvent {
    /// Index of the path (order of the paths given to [`Multipath::new`]).
    pub path_index: usize,
    /// Portal address of the path.
    pub addr: SocketAddr,
    /// What happened.
    pub kind: PathEventKind,
    /// When.
    pub at: SystemTime,
}

/// I/O counters of one path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathStats {
    /// Portal address.
    pub addr: SocketAddr,
    /// Whether the path serves I/O now.
    pub healthy: bool,
    /// Reads completed.
    pub reads: u64,
    /// Writes completed.
    pub writes: u64,
    /// Other commands completed (flush, discard, write zeroes).
    pub others: u64,
    /// Bytes read.
    pub read_bytes: u64,
    /// Bytes written.
    pub written_bytes: u64,
    /// Times the path was marked failed.
    pub failures: u64,
}

#[derive(Default)]
struct Counters {
    reads: AtomicU64,
    writes: AtomicU64,
    others: AtomicU64,
    read_bytes: AtomicU64,
    written_bytes: AtomicU64,
    failures: AtomicU64,
}

struct Path {
    addr: SocketAddr,
    lun: RwLock<Arc<IscsiLun>>,
    healthy: AtomicBool,
    reconnecting: AtomicBool,
    counters: Counters,
}

struct Inner {
    paths: Vec<Path>,
    opts: MultipathOptions,
    geometry: Geometry,
    identity: Option<Vec<u8>>,
    next: AtomicUsize,
    active: AtomicUsize,
    events: broadcast::Sender<PathEvent>,
    history: Mutex<VecDeque<PathEvent>>,
    path_up: Notify,
}

/// One logical unit over several paths, as a [`block::Volume`].
#[derive(Clone)]
pub struct Multipath {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Multipath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Multipath")
            .field(
                "paths",
                &self.inner.paths.iter().map(|p| p.addr).collect::<Vec<_>>(),
            )
            .field("policy", &self.inner.opts.policy)
            .finish()
    }
}

enum Op {
    Read(u64),
    Write(u64),
    Other,
}

impl Multipath {
    /// Groups `paths` (opened LUNs through different portals). Every path must
    /// report the same NAA designator in VPD page 0x83 and the same geometry;
    /// otherwise they are different logical units and grouping is refused.
    pub fn new(paths: Vec<IscsiLun>, opts: MultipathOptions) -> Result<Multipath, InitiatorError> {
        let first = paths.first().ok_or(InitiatorError::InvalidRequest(
            "multipath needs at least one path",
        ))?;
        let identity = first.identity().map(|x| x.to_vec());
        let geometry = first.geometry();
        for p in &paths[1..] {
            if identity.is_none() || p.identity() != identity.as_deref() {
                return Err(InitiatorError::IdentityMismatch(format!(
                    "{} and {} report different (or no) NAA designators",
                    first.addr(),
                    p.addr()
                )));
            }
            let g = p.geometry();
            if g.block_size_bytes != geometry.block_size_bytes
                || g.block_count != geometry.block_count
            {
                return Err(InitiatorError::IdentityMismatch(format!(
                    "{} and {} report different capacities",
                    first.addr(),
                    p.addr()
                )));
            }
        }
        let (events, _) = broadcast::channel(EVENT_CHANNEL_CAPACITY);
        let paths = paths
            .into_iter()
            .map(|l| Path {
                addr: l.addr(),
                lun: RwLock::new(Arc::new(l)),
                healthy: AtomicBool::new(true),
                reconnecting: AtomicBool::new(false),
                counters: Counters::default(),
            })
            .collect();
        Ok(Multipath {
            inner: Arc::new(Inner {
                paths,
                opts,
                geometry,
                identity,
                next: AtomicUsize::new(0),
                active: AtomicUsize::new(0),
                events,
                history: Mutex::new(VecDeque::with_capacity(EVENT_HISTORY_MAX)),
                path_up: Notify::new(),
            }),
        })
    }

    /// A receiver of every path event from now on.
    pub fn path_events(&self) -> broadcast::Receiver<PathEvent> {
        self.inner.events.subscribe()
    }

    /// The last path events (at most 256), oldest first.
    pub fn path_event_history(&self) -> Vec<PathEvent> {
        self.inner.history.lock().iter().cloned().collect()
    }

    /// Per-path counters and health.
    pub fn path_stats(&self) -> Vec<PathStats> {
        self.inner
            .paths
            .iter()
            .map(|p| {
                let c = &p.counters;
                PathStats {
                    addr: p.addr,
                    healthy: p.healthy.load(Ordering::Acquire),
                    reads: c.reads.load(Ordering::Relaxed),
                    writes: c.writes.load(Ordering::Relaxed),
                    others: c.others.load(Ordering::Relaxed),
                    read_bytes: c.read_bytes.load(Ordering::Relaxed),
                    written_bytes: c.written_bytes.load(Ordering::Relaxed),
                    failures: c.failures.load(Ordering::Relaxed),
                }
            })
            .collect()
    }

    /// The LUN identity (NAA designator) shared by every path.
    pub fn identity(&self) -> Option<&[u8]> {
        self.inner.identity.as_deref()
    }

    /// Number of paths.
    pub fn path_count(&self) -> usize {
        self.inner.paths.len()
    }

    /// Marks a path failed by hand (maintenance, tests); it reconnects as usual.
    pub fn fail_path(&self, index: usize, reason: &str) {
        if let Some(p) = self.inner.paths.get(index) {
            let lun = p.lun.read().clone();
            Inner::path_failed(&self.inner, index, &lun, reason.to_string());
        }
    }

    /// Logs out of every path.
    pub async fn logout(&self) {
        for p in &self.inner.paths {
            let lun = p.lun.read().clone();
            p.healthy.store(false, Ordering::Release);
            let _ = lun.session().logout().await;
        }
    }

    async fn run<T, F, Fut>(&self, op: Op, f: F) -> BlockResult<T>
    where
        F: Fn(Arc<IscsiLun>) -> Fut,
        Fut: Future<Output = Result<T, LunError>>,
    {
        let inner = &self.inner;
        let mut last = String::from("no healthy path");
        for _ in 0..IO_ATTEMPTS_MAX {
            let Some((i, lun)) = inner.pick() else {
                let notified = inner.path_up.notified();
                tokio::pin!(notified);
                notified.as_mut().enable();
                if inner.pick().is_some() {
                    continue;
                }
                let wait = Duration::from_millis(inner.opts.no_path_wait_ms);
                if tokio::time::timeout(wait, notified).await.is_err() {
                    return Err(BlockError::Unavailable(format!("all paths failed: {last}")));
                }
                continue;
            };
            match f(lun.clone()).await {
                Ok(v) => {
                    let c = &inner.paths[i].counters;
                    match op {
                        Op::Read(b) => {
                            c.reads.fetch_add(1, Ordering::Relaxed);
                            c.read_bytes.fetch_add(b, Ordering::Relaxed);
                        }
                        Op::Write(b) => {
                            c.writes.fetch_add(1, Ordering::Relaxed);
                            c.written_bytes.fetch_add(b, Ordering::Relaxed);
                        }
                        Op::Other => {
                            c.others.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    return Ok(v);
                }
                Err(LunError::Block(e)) => return Err(e),
                Err(LunError::Path(why)) => {
                    last = format!("{}: {why}", inner.paths[i].addr);
                    Inner::path_failed(inner, i, &lun, why);
                    if !matches!(op, Op::Read(_)) && inner.opts.in_doubt_retry_delay_ms > 0 {
                        tokio::time::sleep(Duration::from_millis(
                            inner.opts.in_doubt_retry_delay_ms,
                        ))
                        .await;
                    }
                }
            }
        }
        Err(BlockError::Unavailable(format!(
            "I/O failed on every attempt: {last}"
        )))
    }
}

impl Inner {
    fn pick(&self) -> Option<(usize, Arc<IscsiLun>)> {
        let n = self.paths.len();
        let start = match self.opts.policy {
            PathPolicy::RoundRobin => self.next.fetch_add(1, Ordering::Relaxed),
            PathPolicy::FailoverOnly => self.active.load(Ordering::Relaxed),
        };
        for k in 0..n {
            let i = (start + k) % n;
            let p = &self.paths[i];
            if p.healthy.load(Ordering::Acquire) {
                if self.opts.policy == PathPolicy::FailoverOnly && k != 0 {
                    self.active.store(i, Ordering::Relaxed);
                }
                return Some((i, p.lun.read().clone()));
            }
        }
        None
    }

    fn emit(&self, ev: PathEvent) {
        {
            let mut h = self.history.lock();
            if h.len() == EVENT_HISTORY_MAX {
                h.pop_front();
            }
            h.push_back(ev.clone());
        }
        let _ = self.events.send(ev);
    }

    /// Marks path `i` failed if `lun` is still its current session; starts reconnection.
    fn path_failed(self: &Arc<Self>, i: usize, lun: &Arc<IscsiLun>, reason: String) {
        let p = &self.paths[i];
        if !Arc::ptr_eq(&p.lun.read(), lun) {
            return; // Already replaced by a newer session.
        }
        if !p.healthy.swap(false, Ordering::AcqRel) {
            return;
        }
        p.counters.failures.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(path = i, addr = %p.addr, %reason, "path failed");
        lun.session().close("path failed");
        self.emit(PathEvent {
            path_index: i,
            addr: p.addr,
            kind: PathEventKind::Failed { reason },
            at: SystemTime::now(),
        });
        if !p.reconnecting.swap(true, Ordering::AcqRel) {
            tokio::spawn(reconnect(Arc::downgrade(self), i));
        }
    }
}

async fn reconnect(weak: Weak<Inner>, i: usize) {
    let mut delay_ms = weak
        .upgrade()
        .map(|m| m.opts.reconnect_backoff_min_ms.max(1))
        .unwrap_or(100);
    loop {
        tokio::time::sleep(Duration::from_millis(delay_ms)).await;
        let Some(inner) = weak.upgrade() else { return };
        let p = &inner.paths[i];
        let old = p.lun.read().clone();
        match old.reopen().await {
            Ok(l) if l.identity() == inner.identity.as_deref() => {
                *p.lun.write() = Arc::new(l);
                p.reconnecting.store(false, Ordering::Release);
                p.healthy.store(true, Ordering::Release);
                tracing::info!(path = i, addr = %p.addr, "path restored");
                inner.emit(PathEvent {
                    path_index: i,
                    addr: p.addr,
                    kind: PathEventKind::Restored,
                    at: SystemTime::now(),
                });
                inner.path_up.notify_waiters();
                return;
            }
            Ok(l) => {
                tracing::error!(path = i, addr = %p.addr, "path now leads to another LUN; not restored");
                l.session().close("identity mismatch");
            }
            Err(e) => tracing::debug!(path = i, addr = %p.addr, error = %e, "re-login failed"),
        }
        delay_ms = (delay_ms * 2).min(inner.opts.reconnect_backoff_max_ms.max(1));
    }
}

#[async_trait]
impl Volume for Multipath {
    fn geometry(&self) -> Geometry {
        self.inner.geometry
    }

    async fn read(&self, lba: u64, blocks: u32) -> BlockResult<Bytes> {
        let bytes = blocks as u64 * self.inner.geometry.block_size_bytes as u64;
        self.run(
            Op::Read(bytes),
            |l| async move { l.io_read(lba, blocks).await },
        )
        .await
    }

    async fn write(&self, lba: u64, data: Bytes, fua: bool) -> BlockResult<()> {
        let bytes = data.len() as u64;
        self.run(Op::Write(bytes), |l| {
            let d = data.clone();
            async move { l.io_write(lba, d, fua).await }
        })
        .await
    }

    async fn flush(&self) -> BlockResult<()> {
        // Writes acknowledged through any path may sit in the volatile cache behind
        // that path (in an active-active pair, another node), so flush every healthy
        // path; a path failing here is handled like any path failure.
        let inner = &self.inner;
        let mut flushed = 0usize;
        for (i, p) in inner.paths.iter().enumerate() {
            if !p.healthy.load(Ordering::Acquire) {
                continue;
            }
            let lun = p.lun.read().clone();
            match lun.io_flush().await {
                Ok(()) => {
                    p.counters.others.fetch_add(1, Ordering::Relaxed);
                    flushed += 1;
                }
                Err(LunError::Block(e)) => return Err(e),
                Err(LunError::Path(why)) => Inner::path_failed(inner, i, &lun, why),
            }
        }
        if flushed > 0 {
            return Ok(());
        }
        self.run(Op::Other, |l| async move { l.io_flush().await })
            .await
    }

    async fn discard(&self, lba: u64, blocks: u64) -> BlockResult<()> {
        self.run(
            Op::Other,
            |l| async move { l.io_discard(lba, blocks).await },
        )
        .await
    }

    async fn write_zeroes(&self, lba: u64, blocks: u64, may_unmap: bool) -> BlockResult<()> {
        self.run(Op::Other, |l| async move {
            l.io_write_zeroes(lba, blocks, may_unmap).await
        })
        .await
    }
}
