//! The replicated volume: a [`Volume`] over the local copy that keeps the
//! partner's copy identical, and the task that connects, decides and resyncs.

use crate::bitmap::DirtyBitmap;
use crate::link::{Framed, Link, LinkLost};
use crate::meta::{Meta, MetaFile};
use crate::plan::{plan, Plan};
use crate::witness;
use async_trait::async_trait;
use block::{BlockError, BlockResult, Bytes, Geometry, LockMode, RangeLocks, Volume, VolumeRef};
use parking_lot::Mutex;
use replica_proto::{error_codes, hello_flags, Message, Op, OpResult};
use serde::Serialize;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, watch, Notify};

/// Bitmap chunk sent per message in the handshake.
const BITMAP_CHUNK_BYTES: usize = 256 << 10;
/// Largest resync copy in one message.
const RESYNC_COPY_BYTES_MAX: u64 = 1 << 20;
/// Resync copies in flight at once.
const RESYNC_IN_FLIGHT_MAX: usize = 4;
/// Pause between connection attempts.
const RECONNECT_PAUSE: Duration = Duration::from_millis(300);
/// Cleaning period of the write-intent bitmap.
const CLEAN_PERIOD: Duration = Duration::from_secs(1);

/// How the two nodes serve a replicated volume.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// Both nodes serve reads and writes.
    ActiveActive,
    /// Only the leader serves; the other node's paths report standby.
    ActivePassive,
}

/// Configuration of one node's side of a replicated volume.
#[derive(Debug, Clone)]
pub struct ReplicaConfig {
    /// Name of the volume, the same on both nodes.
    pub name: String,
    /// The pair's name (the witness keeps one grant per cluster).
    pub cluster: String,
    /// This node: 1 or 2.
    pub node_id: u8,
    /// The node that survives when the nodes lose each other and no witness is
    /// configured, and that leads when both copies are equal.
    pub preferred_node: u8,
    /// The partner's sync addresses; node 1 dials them (in order, the next one
    /// when a link fails), node 2 waits for node 1.
    pub peer_sync: Vec<SocketAddr>,
    /// The witness, if any.
    pub witness: Option<SocketAddr>,
    /// Active-active or active-passive.
    pub mode: Mode,
    /// Bytes covered by one bit of the dirty bitmap.
    pub region_bytes: u32,
    /// Interval between heartbeats.
    pub heartbeat_interval_ms: u64,
    /// Silence after which the partner (or the link) counts as lost.
    pub peer_timeout_ms: u64,
    /// How long I/O waits for a decision (failover) before failing over to
    /// another path with NOT READY.
    pub io_wait_ms: u64,
    /// Folder of this copy's metadata and bitmap.
    pub state_dir: PathBuf,
}

/// A node's part in the pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Role {
    /// Waiting for the partner or for the decision after losing it; I/O waits.
    Deciding,
    /// Not serving: the partner (or the witness) has the newer data, or the copies
    /// cannot be joined automatically.
    Down,
    /// Serving alone; changes are tracked for the partner's return.
    Solo,
    /// Orders every write of the pair and serves; the partner is in sync or being
    /// resynchronised from this node.
    Leader,
    /// In sync; forwards writes to the leader; serves in active-active mode.
    Follower,
    /// Being resynchronised; not serving until in sync.
    Target,
}

#[derive(Clone)]
struct RoleState {
    role: Role,
    link: Option<Arc<Link>>,
    /// The partner is a resync target (not in sync yet).
    peer_resyncing: bool,
    reason: String,
}

/// What the ALUA port groups should say: this node's ports and the partner's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortStates {
    /// This node's ports.
    pub local: PathState,
    /// The partner's ports, as far as this node knows.
    pub peer: PathState,
}

/// The state of one node's paths.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum PathState {
    /// Serving I/O.
    Active,
    /// In sync but not serving (active-passive).
    Standby,
    /// Not serving.
    Unavailable,
}

/// Status of a replicated volume as shown by the API and CLI.
#[derive(Debug, Clone, Serialize)]
pub struct ReplicaStatus {
    /// Volume name.
    pub name: String,
    /// This node.
    pub node_id: u8,
    /// The preferred node.
    pub preferred_node: u8,
    /// Serving mode.
    pub mode: Mode,
    /// This node's role.
    pub role: Role,
    /// Why the role is what it is.
    pub reason: String,
    /// The partner's sync address when connected.
    pub peer: Option<String>,
    /// "in-sync", "resyncing", "degraded" (serving alone) or "down".
    pub state: &'static str,
    /// Regions to copy in the running resync.
    pub resync_regions_total: u64,
    /// Regions copied so far in it.
    pub resync_regions_done: u64,
    /// Bytes copied by resyncs since start (source side).
    pub resynced_bytes: u64,
    /// Regions marked in this node's bitmap.
    pub dirty_regions: u64,
    /// Bytes per region.
    pub region_bytes: u32,
    /// Volume size.
    pub size_bytes: u64,
    /// Generation of the data held.
    pub generation: String,
    /// Whether this copy is consistent.
    pub consistent: bool,
    /// The witness address, if any.
    pub witness: Option<String>,
    /// Whether the witness answered the last request (None: not asked yet).
    pub witness_reachable: Option<bool>,
    /// Paths of this node and of the partner.
    pub local_paths: PathState,
    /// Paths of the partner as this node sees them.
    pub peer_paths: PathState,
    /// Every sync link's heartbeat state (empty when not monitored).
    pub sync_links: Vec<crate::monitor::SyncLinkState>,
}

/// The SCSI layer's side of the pair's link (persistent reservations): opaque
/// requests from the partner, and the state to hand a partner that becomes in sync.
#[async_trait]
pub trait ScsiPeer: Send + Sync + 'static {
    /// Answers a request the partner sent with [`ReplicatedVolume::scsi_request`].
    async fn handle(&self, request: Bytes) -> Bytes;
    /// Runs on the resync source once the data is copied, before the partner
    /// becomes in sync (and starts serving): gives it the SCSI state it must hold.
    async fn before_in_sync(&self) -> Result<(), String>;
}

struct InFlightForward {
    op: Op,
    applied: bool,
}

struct Inner {
    cfg: ReplicaConfig,
    local: VolumeRef,
    geo: Geometry,
    meta_file: MetaFile,
    meta: Mutex<Meta>,
    bitmap: DirtyBitmap,
    locks: RangeLocks,
    role_tx: watch::Sender<RoleState>,
    forwards: Mutex<HashMap<u64, InFlightForward>>,
    solo_writes: AtomicUsize,
    solo_drained: Notify,
    resync_total: AtomicU64,
    resync_done: AtomicU64,
    resynced_bytes: AtomicU64,
    /// 0 not asked, 1 reachable, 2 unreachable.
    witness_state: AtomicU8,
    /// Set by `shutdown`.
    stop_tx: watch::Sender<bool>,
    /// Serialises metadata updates made from request handlers.
    meta_write: tokio::sync::Mutex<()>,
    /// The SCSI layer's handler of the partner's requests.
    scsi_peer: parking_lot::RwLock<Option<Arc<dyn ScsiPeer>>>,
    /// Heartbeats on every sync link (node-wide), when running.
    monitor: parking_lot::RwLock<Option<Arc<crate::monitor::SyncLinkMonitor>>>,
    ports_tx: watch::Sender<PortStates>,
}

/// A volume replicated synchronously to the partner node.
pub struct ReplicatedVolume {
    inner: Arc<Inner>,
}

/// Where the listener hands connections that named this volume.
#[derive(Clone)]
pub struct ConnectionSink {
    tx: mpsc::Sender<(Framed, Message)>,
}

impl ConnectionSink {
    pub(crate) async fn deliver(&self, f: Framed, hello: Message) {
        let _ = self.tx.send((f, hello)).await;
    }
}

fn err_of(e: &BlockError) -> OpResult {
    let (code, lba) = match e {
        BlockError::Medium { lba } => (error_codes::MEDIUM, *lba),
        BlockError::WriteFault { lba } => (error_codes::WRITE_FAULT, *lba),
        BlockError::OutOfRange { lba, .. } => (error_codes::OUT_OF_RANGE, *lba),
        BlockError::ReadOnly => (error_codes::READ_ONLY, 0),
        BlockError::Unavailable(_) => (error_codes::UNAVAILABLE, 0),
        BlockError::NotSupported(_) => (error_codes::NOT_SUPPORTED, 0),
        _ => (error_codes::IO, 0),
    };
    OpResult::Error { code, lba }
}

fn block_err_of(code: u8, lba: u64, what: &str) -> BlockError {
    match code {
        error_codes::MEDIUM => BlockError::Medium { lba },
        error_codes::WRITE_FAULT => BlockError::WriteFault { lba },
        error_codes::READ_ONLY => BlockError::ReadOnly,
        error_codes::NOT_SUPPORTED => BlockError::NotSupported("not supported by the partner"),
        error_codes::UNAVAILABLE => {
            BlockError::Unavailable(format!("partner unavailable ({what})"))
        }
        _ => BlockError::WriteFault { lba },
    }
}

/// The blocks an op covers (none for a flush).
fn span(op: &Op, bs: u64) -> Option<(u64, u64)> {
    match op {
        Op::Write { lba, data, .. } => Some((*lba, data.len() as u64 / bs)),
        Op::CompareAndWrite { lba, data, .. } => Some((*lba, data.len() as u64 / bs)),
        Op::WriteZeroes { lba, blocks, .. } | Op::Discard { lba, blocks } => Some((*lba, *blocks)),
        Op::Flush => None,
    }
}

/// What an op's outcome is to the caller: `Some(offset)` for a miscompare.
type OpOutcome = BlockResult<Option<usize>>;

impl Inner {
    fn role(&self) -> RoleState {
        self.role_tx.borrow().clone()
    }

    fn set_role(&self, role: Role, link: Option<Arc<Link>>, peer_resyncing: bool, reason: String) {
        if *self.stop_tx.borrow() && role != Role::Down {
            if let Some(l) = link {
                l.close("volume stopped");
            }
            return;
        }
        tracing::info!(volume = %self.cfg.name, ?role, peer_resyncing, %reason, "replica role");
        let st = RoleState {
            role,
            link,
            peer_resyncing,
            reason,
        };
        self.bitmap
            .set_keep(!matches!(role, Role::Leader | Role::Follower) || peer_resyncing);
        let aa = self.cfg.mode == Mode::ActiveActive;
        let ports = match (role, peer_resyncing) {
            (Role::Leader, false) => PortStates {
                local: PathState::Active,
                peer: if aa {
                    PathState::Active
                } else {
                    PathState::Standby
                },
            },
            (Role::Leader, true) | (Role::Solo, _) => PortStates {
                local: PathState::Active,
                peer: PathState::Unavailable,
            },
            (Role::Follower, _) => PortStates {
                local: if aa {
                    PathState::Active
                } else {
                    PathState::Standby
                },
                peer: PathState::Active,
            },
            (Role::Target, _) | (Role::Down, _) => PortStates {
                local: PathState::Unavailable,
                peer: PathState::Active,
            },
            (Role::Deciding, _) => PortStates {
                local: PathState::Unavailable,
                peer: PathState::Unavailable,
            },
        };
        self.role_tx.send_replace(st);
        self.ports_tx.send_if_modified(|p| {
            let changed = *p != ports;
            *p = ports;
            changed
        });
    }

    fn store_meta(&self, m: Meta) -> std::io::Result<()> {
        self.meta_file.store(&m)?;
        *self.meta.lock() = m;
        Ok(())
    }

    /// Waits until this node may serve I/O, or fails with NOT READY.
    async fn wait_serving(&self, deadline: Instant) -> BlockResult<RoleState> {
        let mut rx = self.role_tx.subscribe();
        loop {
            let st = rx.borrow_and_update().clone();
            let lease = || st.link.as_ref().is_some_and(|l| l.lease_valid());
            match st.role {
                Role::Solo => return Ok(st),
                Role::Leader if st.peer_resyncing || lease() => return Ok(st),
                Role::Follower if self.cfg.mode == Mode::ActiveActive && lease() => return Ok(st),
                Role::Follower if self.cfg.mode == Mode::ActivePassive => {
                    return Err(BlockError::Unavailable(
                        "standby node of an active-passive pair".into(),
                    ))
                }
                Role::Down | Role::Target => {
                    return Err(BlockError::Unavailable(format!(
                        "replica {} not serving: {}",
                        self.cfg.name, st.reason
                    )))
                }
                _ => {}
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(BlockError::Unavailable(format!(
                    "replica {}: no decision after losing the partner",
                    self.cfg.name
                )));
            }
            // the lease may lapse or the role change: look again soon
            let _ =
                tokio::time::timeout(Duration::from_millis(20).min(deadline - now), rx.changed())
                    .await;
        }
    }

    /// After a link failed under a request: waits for the role that follows.
    async fn after_link_lost(&self, link: &Arc<Link>, deadline: Instant) -> BlockResult<RoleState> {
        link.close("a request found the link down");
        let mut rx = self.role_tx.subscribe();
        loop {
            let st = rx.borrow_and_update().clone();
            let same = st.link.as_ref().is_some_and(|l| Arc::ptr_eq(l, link));
            if !same && st.role != Role::Deciding {
                return Ok(st);
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(BlockError::Unavailable(
                    "no decision after the link failed".into(),
                ));
            }
            let _ = tokio::time::timeout(deadline - now, rx.changed()).await;
        }
    }

    fn deadline(&self) -> Instant {
        Instant::now() + Duration::from_millis(self.cfg.io_wait_ms)
    }

    /// Runs a client op in whatever role this node has.
    async fn submit(self: &Arc<Self>, op: Op) -> OpOutcome {
        let deadline = self.deadline();
        loop {
            let st = self.wait_serving(deadline).await?;
            match st.role {
                Role::Solo => {
                    self.solo_writes.fetch_add(1, Ordering::AcqRel);
                    let still = self.role_tx.borrow().role == Role::Solo;
                    let r = if still {
                        Some(self.ordered(&st, &op, None).await)
                    } else {
                        None
                    };
                    if self.solo_writes.fetch_sub(1, Ordering::AcqRel) == 1 {
                        self.solo_drained.notify_waiters();
                    }
                    match r {
                        Some(Ok(r)) => return r,
                        Some(Err(LinkLost)) | None => continue,
                    }
                }
                Role::Leader => match self.ordered(&st, &op, None).await {
                    Ok(r) => return r,
                    Err(LinkLost) => {
                        let link = st.link.as_ref().expect("leader has a link");
                        // the local part is done: the op stands if this node goes on
                        let next = self.after_link_lost(link, deadline).await?;
                        return match next.role {
                            Role::Solo | Role::Leader => self.local_outcome_after_loss(&op).await,
                            _ => Err(BlockError::Unavailable(format!(
                                "partner lost and this node stopped: {}",
                                next.reason
                            ))),
                        };
                    }
                },
                Role::Follower => {
                    let link = st.link.clone().expect("follower has a link");
                    match self.forward(&link, &op).await {
                        Ok(r) => return r,
                        Err(applied) => {
                            let next = self.after_link_lost(&link, deadline).await?;
                            match next.role {
                                Role::Solo | Role::Leader if applied => {
                                    return self.local_outcome_after_loss(&op).await
                                }
                                Role::Solo | Role::Leader => continue,
                                _ => {
                                    return Err(BlockError::Unavailable(format!(
                                        "partner lost and this node stopped: {}",
                                        next.reason
                                    )))
                                }
                            }
                        }
                    }
                }
                _ => continue,
            }
        }
    }

    /// An op whose local part completed when the link failed, on a node that goes on:
    /// it stands as done (a flush is repeated locally to be sure).
    async fn local_outcome_after_loss(&self, op: &Op) -> OpOutcome {
        if matches!(op, Op::Flush) {
            self.local.flush().await?;
        }
        Ok(None)
    }

    /// Performs the local part of an op (the write part for COMPARE AND WRITE).
    async fn local_apply(&self, op: &Op) -> BlockResult<()> {
        match op {
            Op::Write { lba, fua, data } => self.local.write(*lba, data.clone(), *fua).await,
            Op::CompareAndWrite { lba, fua, data, .. } => {
                self.local.write(*lba, data.clone(), *fua).await
            }
            Op::WriteZeroes {
                lba,
                blocks,
                may_unmap,
            } => self.local.write_zeroes(*lba, *blocks, *may_unmap).await,
            Op::Discard { lba, blocks } => self.local.discard(*lba, *blocks).await,
            Op::Flush => self.local.flush().await,
        }
    }

    /// Orders an op on this node (leader or solo): range lock, write intent, local
    /// and partner parts at once. `forwarded` is the follower's id when the op came
    /// from it (its data is not sent back). `Err(LinkLost)` means the local part
    /// succeeded but the partner's outcome is unknown.
    async fn ordered(
        &self,
        st: &RoleState,
        op: &Op,
        forwarded: Option<u64>,
    ) -> Result<OpOutcome, LinkLost> {
        let bs = self.geo.block_size_bytes as u64;
        let link = st.link.as_ref();
        let Some((lba, blocks)) = span(op, bs) else {
            // flush: both nodes (a forwarded flush is flushed by the follower itself)
            let remote = async {
                match (link, forwarded) {
                    (Some(l), None) => l
                        .request(|id| Message::Apply { id, op: Op::Flush })
                        .await
                        .map(Some),
                    _ => Ok(None),
                }
            };
            let (lr, rr) = tokio::join!(self.local.flush(), remote);
            if let Err(e) = lr {
                return Ok(Err(e));
            }
            return match rr? {
                None | Some(OpResult::Ok) => Ok(Ok(None)),
                Some(OpResult::Error { code, lba }) => Ok(Err(block_err_of(code, lba, "flush"))),
                Some(OpResult::Miscompare { .. }) => Ok(Err(BlockError::WriteFault { lba: 0 })),
            };
        };
        let _range = self
            .locks
            .lock(lba, lba + blocks, LockMode::Exclusive)
            .await;
        let _intent = match self.bitmap.begin_write(lba, blocks).await {
            Ok(h) => h,
            Err(e) => return Ok(Err(BlockError::Io(e))),
        };
        if let Op::CompareAndWrite { compare, .. } = op {
            let current = match self.local.read(lba, blocks as u32).await {
                Ok(c) => c,
                Err(e) => return Ok(Err(e)),
            };
            if let Some(i) = block::first_difference(compare, &current) {
                return Ok(Ok(Some(i)));
            }
        }
        let remote = async {
            match (link, forwarded) {
                (Some(l), Some(fid)) => l
                    .request(|id| Message::ApplyForwarded {
                        id,
                        forward_id: fid,
                    })
                    .await
                    .map(Some),
                (Some(l), None) => {
                    let wire = match op {
                        Op::CompareAndWrite { lba, fua, data, .. } => Op::Write {
                            lba: *lba,
                            fua: *fua,
                            data: data.clone(),
                        },
                        other => other.clone(),
                    };
                    l.request(|id| Message::Apply { id, op: wire })
                        .await
                        .map(Some)
                }
                (None, _) => Ok(None),
            }
        };
        let (lr, rr) = tokio::join!(self.local_apply(op), remote);
        match (lr, rr) {
            (Err(e), Ok(Some(OpResult::Ok))) => {
                self.bitmap.pin(lba, blocks);
                tracing::error!(volume = %self.cfg.name, lba, "local write failed, partner's succeeded: region kept dirty");
                Ok(Err(e))
            }
            (Err(e), _) => Ok(Err(e)),
            (Ok(()), Err(LinkLost)) => Err(LinkLost),
            (Ok(()), Ok(None | Some(OpResult::Ok))) => Ok(Ok(None)),
            (Ok(()), Ok(Some(OpResult::Error { code, lba: at }))) => {
                self.bitmap.pin(lba, blocks);
                tracing::error!(volume = %self.cfg.name, lba, code, "partner's write failed: region kept dirty");
                Ok(Err(block_err_of(code, at, "write")))
            }
            (Ok(()), Ok(Some(OpResult::Miscompare { .. }))) => {
                Ok(Err(BlockError::WriteFault { lba }))
            }
        }
    }

    /// Follower: sends an op to the leader. `Err(applied)` when the link failed;
    /// `applied` tells whether the write part had been applied here.
    async fn forward(&self, link: &Arc<Link>, op: &Op) -> Result<OpOutcome, bool> {
        let mut fid = 0;
        let r = link
            .request(|id| {
                fid = id;
                self.forwards.lock().insert(
                    id,
                    InFlightForward {
                        op: op.clone(),
                        applied: false,
                    },
                );
                Message::Forward { id, op: op.clone() }
            })
            .await;
        let entry = self.forwards.lock().remove(&fid);
        match r {
            Ok(OpResult::Ok) => {
                if matches!(op, Op::Flush) {
                    // the leader flushed its copy; this node flushes its own
                    if let Err(e) = self.local.flush().await {
                        return Ok(Err(e));
                    }
                }
                Ok(Ok(None))
            }
            Ok(OpResult::Miscompare { offset }) => Ok(Ok(Some(offset as usize))),
            Ok(OpResult::Error { code, lba }) => Ok(Err(block_err_of(code, lba, "forward"))),
            Err(LinkLost) => Err(entry.is_some_and(|e| e.applied)),
        }
    }

    /// A resync target's copy stops being consistent with the first change the
    /// source sends; until then it still holds its own generation whole (so a
    /// source lost at once leaves it able to serve).
    async fn target_changes(&self) -> std::io::Result<()> {
        if !self.meta.lock().consistent {
            return Ok(());
        }
        let _one = self.meta_write.lock().await;
        let mut m = *self.meta.lock();
        if m.consistent {
            m.consistent = false;
            self.store_meta(m)?;
        }
        Ok(())
    }

    /// Handles one request from the partner.
    async fn handle(self: Arc<Self>, link: Arc<Link>, msg: Message) {
        if matches!(msg, Message::Apply { .. } | Message::ResyncData { .. })
            && self.role().role == Role::Target
        {
            if let Err(e) = self.target_changes().await {
                link.close(&format!("cannot persist resync state: {e}"));
                return;
            }
        }
        let (id, result) = match msg {
            Message::Apply { id, op } => (id, self.handle_apply(&op).await),
            Message::ApplyForwarded { id, forward_id } => {
                let op = self.forwards.lock().get(&forward_id).map(|f| f.op.clone());
                let r = match op {
                    Some(op) => {
                        let r = self.local_apply(&op).await;
                        if r.is_ok() {
                            if let Some(f) = self.forwards.lock().get_mut(&forward_id) {
                                f.applied = true;
                            }
                        }
                        r.map_or_else(|e| err_of(&e), |()| OpResult::Ok)
                    }
                    None => OpResult::Error {
                        code: error_codes::UNAVAILABLE,
                        lba: 0,
                    },
                };
                (id, r)
            }
            Message::Forward { id, op } => {
                let st = self.role();
                let same = st.link.as_ref().is_some_and(|l| Arc::ptr_eq(l, &link));
                let r = if st.role == Role::Leader && !st.peer_resyncing && same {
                    match self.ordered(&st, &op, Some(id)).await {
                        Ok(Ok(None)) => OpResult::Ok,
                        Ok(Ok(Some(offset))) => OpResult::Miscompare {
                            offset: offset as u32,
                        },
                        Ok(Err(e)) => err_of(&e),
                        Err(LinkLost) => return,
                    }
                } else {
                    OpResult::Error {
                        code: error_codes::UNAVAILABLE,
                        lba: 0,
                    }
                };
                (id, r)
            }
            Message::ResyncData { id, lba, data } => {
                let r = self.local.write(lba, data.clone(), false).await;
                if r.is_ok() {
                    let bs = self.geo.block_size_bytes as u64;
                    let rb = self.bitmap.region_blocks();
                    let end = lba + data.len() as u64 / bs;
                    for reg in lba / rb..end.div_ceil(rb) {
                        self.bitmap.clear_region(reg);
                    }
                }
                (id, r.map_or_else(|e| err_of(&e), |()| OpResult::Ok))
            }
            Message::ResyncDone { id, gens } => (id, self.finish_as_target(&link, gens).await),
            Message::ScsiRequest { id, data } => {
                let peer = self.scsi_peer.read().clone();
                let reply = match peer {
                    Some(p) => p.handle(data).await,
                    None => Bytes::new(),
                };
                let _ = link.send(Message::ScsiReply { id, data: reply }).await;
                return;
            }
            other => {
                tracing::warn!(volume = %self.cfg.name, ?other, "unexpected message from the partner");
                link.close("protocol violation");
                return;
            }
        };
        let _ = link.send(Message::Done { id, result }).await;
    }

    async fn handle_apply(&self, op: &Op) -> OpResult {
        let st = self.role();
        if !matches!(st.role, Role::Follower | Role::Target) {
            return OpResult::Error {
                code: error_codes::UNAVAILABLE,
                lba: 0,
            };
        }
        match self.local_apply(op).await {
            Ok(()) => OpResult::Ok,
            Err(e) => err_of(&e),
        }
    }

    async fn finish_as_target(
        &self,
        link: &Arc<Link>,
        gens: replica_proto::Generations,
    ) -> OpResult {
        if let Err(e) = self.local.flush().await {
            return err_of(&e);
        }
        let m = Meta {
            current: gens.current,
            synced: gens.synced,
            consistent: true,
        };
        if let Err(e) = self.store_meta(m) {
            return err_of(&BlockError::Io(e));
        }
        if let Err(e) = self.bitmap.clear_all().await {
            return err_of(&BlockError::Io(e));
        }
        self.set_role(Role::Follower, Some(link.clone()), false, "in sync".into());
        OpResult::Ok
    }
}

impl ReplicatedVolume {
    /// Opens this node's side over its local copy and starts connecting to the
    /// partner. Returns the volume and the sink the listener hands connections to.
    pub fn open(cfg: ReplicaConfig, local: VolumeRef) -> std::io::Result<(Self, ConnectionSink)> {
        std::fs::create_dir_all(&cfg.state_dir)?;
        let geo = local.geometry();
        let meta_file = MetaFile::new(&cfg.state_dir);
        let meta = meta_file.load()?;
        let bitmap = DirtyBitmap::open(
            &cfg.state_dir.join("replica.bitmap"),
            geo.block_count,
            geo.block_size_bytes,
            cfg.region_bytes,
        )?;
        let (role_tx, _) = watch::channel(RoleState {
            role: Role::Deciding,
            link: None,
            peer_resyncing: false,
            reason: "starting: waiting for the partner".into(),
        });
        let (ports_tx, _) = watch::channel(PortStates {
            local: PathState::Unavailable,
            peer: PathState::Unavailable,
        });
        bitmap.set_keep(true);
        let inner = Arc::new(Inner {
            cfg,
            local,
            geo,
            meta_file,
            meta: Mutex::new(meta),
            bitmap,
            locks: RangeLocks::default(),
            role_tx,
            forwards: Mutex::new(HashMap::new()),
            solo_writes: AtomicUsize::new(0),
            solo_drained: Notify::new(),
            resync_total: AtomicU64::new(0),
            resync_done: AtomicU64::new(0),
            resynced_bytes: AtomicU64::new(0),
            witness_state: AtomicU8::new(0),
            stop_tx: watch::channel(false).0,
            meta_write: tokio::sync::Mutex::new(()),
            scsi_peer: parking_lot::RwLock::new(None),
            monitor: parking_lot::RwLock::new(None),
            ports_tx,
        });
        let (tx, rx) = mpsc::channel(4);
        tokio::spawn(manager(inner.clone(), rx));
        tokio::spawn(cleaner(Arc::downgrade(&inner)));
        Ok((ReplicatedVolume { inner }, ConnectionSink { tx }))
    }

    /// Stops replicating: the link is closed, the node stops serving this volume
    /// (the partner goes on alone as if this node had failed) and the local copy
    /// is flushed.
    pub async fn shutdown(&self) {
        let i = &self.inner;
        i.stop_tx.send_replace(true);
        let st = i.role();
        i.set_role(Role::Down, None, false, "stopped".into());
        if let Some(l) = st.link {
            l.close("shutting down");
        }
        if let Err(e) = i.local.flush().await {
            tracing::warn!(volume = %i.cfg.name, "flush at shutdown: {e}");
        }
        let _ = i.bitmap.persist().await;
    }

    /// Throws this node's copy away: it becomes a brand-new copy that the partner
    /// copies in full at their next meeting. Only while this node does not serve
    /// (role down): the way out of a split brain, where both copies took writes
    /// alone and the writes of one side must be given up.
    pub async fn discard_copy(&self) -> Result<(), String> {
        let i = &self.inner;
        let st = i.role();
        if st.role != Role::Down {
            return Err(format!(
                "this node's copy is {:?}; only a copy that is down (not serving) can be discarded",
                st.role
            ));
        }
        i.store_meta(Meta::fresh()).map_err(|e| e.to_string())?;
        tracing::warn!(volume = %i.cfg.name, "this node's copy was discarded: the partner will copy it in full");
        i.set_role(
            Role::Down,
            None,
            false,
            "copy discarded: waiting for the partner to copy its data here".into(),
        );
        Ok(())
    }

    /// Waits until the status satisfies `f`, at most `timeout`; false on timeout.
    pub async fn wait_until(&self, f: impl Fn(&ReplicaStatus) -> bool, timeout: Duration) -> bool {
        let mut rx = self.inner.role_tx.subscribe();
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            rx.borrow_and_update();
            if f(&self.status()) {
                return true;
            }
            // progress counters move without a role change: look again at least every 50 ms
            let step = tokio::time::Instant::now() + Duration::from_millis(50);
            if tokio::time::timeout_at(step.min(deadline), rx.changed())
                .await
                .is_err()
                && tokio::time::Instant::now() >= deadline
            {
                return f(&self.status());
            }
        }
    }

    /// Lets the volume see every sync link's heartbeats: it dials a link that
    /// answers, and shows them all in its status.
    pub fn set_link_monitor(&self, m: Arc<crate::monitor::SyncLinkMonitor>) {
        *self.inner.monitor.write() = Some(m);
    }

    /// Installs the SCSI layer's handler of the partner's requests.
    pub fn set_scsi_peer(&self, peer: Arc<dyn ScsiPeer>) {
        *self.inner.scsi_peer.write() = Some(peer);
    }

    /// This node's role now.
    pub fn role(&self) -> Role {
        self.inner.role().role
    }

    /// Whether the partner is connected and in sync (or being resynchronised from
    /// this node): SCSI state changes made here must reach it.
    pub fn partner_attached(&self) -> bool {
        let st = self.inner.role();
        st.role == Role::Leader && st.link.is_some()
    }

    /// Sends an opaque request to the partner's [`ScsiPeer`] and returns its reply.
    pub async fn scsi_request(&self, data: Bytes) -> BlockResult<Bytes> {
        let Some(link) = self.inner.role().link else {
            return Err(BlockError::Unavailable("no partner connected".into()));
        };
        link.request_scsi(data)
            .await
            .map_err(|LinkLost| BlockError::Unavailable("the partner link failed".into()))
    }

    /// The volume's name.
    pub fn name(&self) -> &str {
        &self.inner.cfg.name
    }

    /// Follows the states the ALUA port groups should show.
    pub fn port_states(&self) -> watch::Receiver<PortStates> {
        self.inner.ports_tx.subscribe()
    }

    /// The current status.
    pub fn status(&self) -> ReplicaStatus {
        let i = &self.inner;
        let st = i.role();
        let meta = *i.meta.lock();
        let ports = *i.ports_tx.borrow();
        let state = match (st.role, st.peer_resyncing) {
            (Role::Leader, false) | (Role::Follower, _) => "in-sync",
            (Role::Leader, true) | (Role::Target, _) => "resyncing",
            (Role::Solo, _) => "degraded",
            (Role::Deciding, _) => "deciding",
            (Role::Down, _) => "down",
        };
        ReplicaStatus {
            name: i.cfg.name.clone(),
            node_id: i.cfg.node_id,
            preferred_node: i.cfg.preferred_node,
            mode: i.cfg.mode,
            role: st.role,
            reason: st.reason.clone(),
            peer: st.link.as_ref().map(|l| l.peer.clone()),
            state,
            resync_regions_total: i.resync_total.load(Ordering::Relaxed),
            resync_regions_done: i.resync_done.load(Ordering::Relaxed),
            resynced_bytes: i.resynced_bytes.load(Ordering::Relaxed),
            dirty_regions: i.bitmap.count(),
            region_bytes: i.cfg.region_bytes,
            size_bytes: i.geo.size_bytes(),
            generation: format!("{:016x}/{:016x}", meta.current, meta.synced),
            consistent: meta.consistent,
            witness: i.cfg.witness.map(|w| w.to_string()),
            witness_reachable: match i.witness_state.load(Ordering::Relaxed) {
                1 => Some(true),
                2 => Some(false),
                _ => None,
            },
            local_paths: ports.local,
            peer_paths: ports.peer,
            sync_links: i
                .monitor
                .read()
                .as_ref()
                .map_or_else(Vec::new, |m| m.links()),
        }
    }
}

#[async_trait]
impl Volume for ReplicatedVolume {
    fn geometry(&self) -> Geometry {
        self.inner.geo
    }

    async fn read(&self, lba: u64, blocks: u32) -> BlockResult<Bytes> {
        self.inner.geo.check_range(lba, blocks as u64)?;
        self.inner.wait_serving(self.inner.deadline()).await?;
        self.inner.local.read(lba, blocks).await
    }

    async fn write(&self, lba: u64, data: Bytes, fua: bool) -> BlockResult<()> {
        let blocks = self.inner.geo.blocks_in(data.len())?;
        self.inner.geo.check_range(lba, blocks)?;
        self.inner
            .submit(Op::Write { lba, fua, data })
            .await
            .map(|_| ())
    }

    async fn flush(&self) -> BlockResult<()> {
        self.inner.submit(Op::Flush).await.map(|_| ())
    }

    async fn discard(&self, lba: u64, blocks: u64) -> BlockResult<()> {
        self.inner.geo.check_range(lba, blocks)?;
        self.inner
            .submit(Op::Discard { lba, blocks })
            .await
            .map(|_| ())
    }

    async fn write_zeroes(&self, lba: u64, blocks: u64, may_unmap: bool) -> BlockResult<()> {
        self.inner.geo.check_range(lba, blocks)?;
        self.inner
            .submit(Op::WriteZeroes {
                lba,
                blocks,
                may_unmap,
            })
            .await
            .map(|_| ())
    }

    async fn compare_and_write(
        &self,
        lba: u64,
        compare: Bytes,
        data: Bytes,
        fua: bool,
    ) -> BlockResult<Option<usize>> {
        let blocks = self.inner.geo.blocks_in(compare.len())?;
        self.inner.geo.check_range(lba, blocks)?;
        if data.len() != compare.len() {
            return Err(BlockError::Misaligned {
                len_bytes: data.len(),
            });
        }
        self.inner
            .submit(Op::CompareAndWrite {
                lba,
                fua,
                compare,
                data,
            })
            .await
    }

    async fn block_status(&self, lba: u64, blocks: u64) -> BlockResult<Vec<block::Extent>> {
        self.inner.wait_serving(self.inner.deadline()).await?;
        self.inner.local.block_status(lba, blocks).await
    }
}

/// Clears idle regions of the write-intent bitmap while in sync.
async fn cleaner(inner: std::sync::Weak<Inner>) {
    loop {
        tokio::time::sleep(CLEAN_PERIOD).await;
        let Some(i) = inner.upgrade() else { return };
        if i.bitmap.clean_idle() > 0 {
            if let Err(e) = i.bitmap.persist().await {
                tracing::warn!(volume = %i.cfg.name, "persisting the bitmap: {e}");
            }
        }
    }
}

/// Connects, handshakes, resyncs and decides, for the life of the volume.
async fn manager(inner: Arc<Inner>, conns: mpsc::Receiver<(Framed, Message)>) {
    let mut stop = inner.stop_tx.subscribe();
    tokio::select! {
        biased;
        _ = stop.wait_for(|s| *s) => {}
        _ = manage(&inner, conns) => {}
    }
}

async fn manage(inner: &Arc<Inner>, mut conns: mpsc::Receiver<(Framed, Message)>) {
    let timeout = Duration::from_millis(inner.cfg.peer_timeout_ms);
    let mut peer_seen = Instant::now();
    let mut next_peer = 0usize;
    let mut last_decide: Option<Instant> = None;
    let mut conns_open = true;
    // the partner answered but the copies cannot be joined (split brain...):
    // never go on alone automatically then, an operator must choose
    let mut unjoinable = false;
    loop {
        if *inner.stop_tx.borrow() {
            return;
        }
        let dial = inner.cfg.node_id == 1 && !inner.cfg.peer_sync.is_empty();
        let conn: Option<(Framed, Option<Message>)> = tokio::select! {
            c = conns.recv(), if conns_open => match c {
                Some((f, hello)) => Some((f, Some(hello))),
                None => {
                    // nobody hands this volume connections (it only dials)
                    conns_open = false;
                    None
                }
            },
            c = async {
                // the next link in turn, or the first after it that answers heartbeats
                let n = inner.cfg.peer_sync.len();
                let monitor = inner.monitor.read().clone();
                let pick = monitor
                    .and_then(|m| (0..n).map(|k| (next_peer + k) % n).find(|&i| m.is_up(i)))
                    .unwrap_or(next_peer % n);
                let addr = inner.cfg.peer_sync[pick];
                match tokio::time::timeout(Duration::from_millis(500), TcpStream::connect(addr)).await {
                    Ok(Ok(s)) => Some(Framed::new(s)),
                    _ => {
                        tokio::time::sleep(RECONNECT_PAUSE).await;
                        None
                    }
                }
            }, if dial => {
                if c.is_none() { next_peer += 1; }
                c.map(|f| (f, None))
            },
            _ = tokio::time::sleep(RECONNECT_PAUSE), if !dial => None,
        };
        if let Some((f, hello)) = conn {
            match handshake(inner, f, hello).await {
                Ok((f, p, peer_meta, peer_bits)) => {
                    unjoinable = false;
                    let link = session(inner, f, p, peer_meta, peer_bits).await;
                    peer_seen = link.last_ping_recv();
                    // the link in use failed: dial the next sync link first
                    next_peer += 1;
                    if !matches!(inner.role().role, Role::Solo | Role::Down) {
                        inner.set_role(
                            Role::Deciding,
                            None,
                            false,
                            format!("lost the partner ({})", link.peer),
                        );
                    }
                    last_decide = None;
                    continue;
                }
                Err(e) => {
                    tracing::warn!(volume = %inner.cfg.name, "handshake with the partner failed: {e}");
                    if ["split brain", "diverged", "unrelated", "consistent"]
                        .iter()
                        .any(|k| e.contains(k))
                    {
                        unjoinable = true;
                        if inner.role().role != Role::Solo {
                            inner.set_role(Role::Down, None, false, e);
                        }
                    }
                    tokio::time::sleep(RECONNECT_PAUSE).await;
                    // a partner that accepts connections but cannot complete a
                    // handshake is no partner: the decision below still applies
                }
            }
        }
        let role = inner.role().role;
        let due = match last_decide {
            None => {
                peer_seen.elapsed() >= timeout
                    || role == Role::Deciding && peer_seen.elapsed() >= timeout
            }
            Some(t) => t.elapsed() >= Duration::from_secs(2),
        };
        if matches!(role, Role::Deciding | Role::Down) && due && !unjoinable {
            decide(inner, peer_seen).await;
            last_decide = Some(Instant::now());
        }
    }
}

/// After losing the partner: goes on alone if the witness (or, without one, the
/// preference) says so, once the partner's lease has run out; otherwise stops.
async fn decide(inner: &Arc<Inner>, peer_last_ping: Instant) {
    let meta = *inner.meta.lock();
    if !meta.consistent {
        inner.set_role(
            Role::Down,
            None,
            false,
            "this copy is an unfinished resync target; waiting for the partner".into(),
        );
        return;
    }
    let me = inner.cfg.node_id;
    let granted = match inner.cfg.witness {
        Some(addr) => {
            let claim = Message::WitnessClaim {
                cluster: inner.cfg.cluster.clone(),
                node_id: me,
            };
            match witness::ask(addr, claim).await {
                Ok(holder) => {
                    inner.witness_state.store(1, Ordering::Relaxed);
                    if holder == me {
                        Ok(())
                    } else {
                        Err(format!(
                            "the witness gave the survivor grant to node {holder}"
                        ))
                    }
                }
                Err(e) => {
                    inner.witness_state.store(2, Ordering::Relaxed);
                    Err(format!("partner and witness ({addr}) unreachable: {e}"))
                }
            }
        }
        None if inner.cfg.preferred_node == me => Ok(()),
        None => Err("partner unreachable and this is not the preferred node (no witness)".into()),
    };
    if let Err(why) = granted {
        inner.set_role(Role::Down, None, false, why);
        return;
    }
    // the partner's lease on serving ends at most one timeout after its last ping
    let lease_end = peer_last_ping + Duration::from_millis(inner.cfg.peer_timeout_ms);
    tokio::time::sleep_until(lease_end.into()).await;
    if !meta.solo() {
        let mut fresh = 0u64;
        while fresh == 0 || fresh == meta.current {
            fresh = rand::random();
        }
        let m = Meta {
            current: fresh,
            ..meta
        };
        if let Err(e) = inner.store_meta(m) {
            inner.set_role(
                Role::Down,
                None,
                false,
                format!("cannot persist the new generation: {e}"),
            );
            return;
        }
    }
    inner.set_role(
        Role::Solo,
        None,
        false,
        "partner lost: serving alone, tracking changes".into(),
    );
}

type Handshake = (Framed, Plan, Meta, Vec<u8>);

async fn handshake(
    inner: &Arc<Inner>,
    mut f: Framed,
    hello: Option<Message>,
) -> Result<Handshake, String> {
    let io = |e: std::io::Error| e.to_string();
    let meta = *inner.meta.lock();
    let cfg = &inner.cfg;
    let mut flags = 0;
    if meta.consistent {
        flags |= hello_flags::CONSISTENT;
    }
    if cfg.preferred_node == cfg.node_id {
        flags |= hello_flags::PREFERRED;
    }
    f.send(&Message::Hello {
        node_id: cfg.node_id,
        volume: cfg.name.clone(),
        block_size_bytes: inner.geo.block_size_bytes,
        block_count: inner.geo.block_count,
        region_bytes: cfg.region_bytes,
        gens: meta.gens(),
        flags,
    })
    .await
    .map_err(io)?;
    let bits = inner.bitmap.snapshot();
    for (i, chunk) in bits.chunks(BITMAP_CHUNK_BYTES).enumerate() {
        f.send(&Message::Bitmap {
            first_region: (i * BITMAP_CHUNK_BYTES * 8) as u64,
            bits: Bytes::copy_from_slice(chunk),
        })
        .await
        .map_err(io)?;
    }
    f.send(&Message::BitmapDone).await.map_err(io)?;
    let hello = match hello {
        Some(h) => h,
        None => tokio::time::timeout(Duration::from_secs(5), f.recv())
            .await
            .map_err(|_| "no hello from the partner".to_string())?
            .map_err(io)?,
    };
    let Message::Hello {
        node_id,
        volume,
        block_size_bytes,
        block_count,
        region_bytes,
        gens,
        flags,
    } = hello
    else {
        return Err("the partner did not start with a hello".into());
    };
    if volume != cfg.name || node_id == cfg.node_id || !(1..=2).contains(&node_id) {
        return Err(format!(
            "unexpected partner: node {node_id}, volume {volume}"
        ));
    }
    if block_size_bytes != inner.geo.block_size_bytes
        || block_count != inner.geo.block_count
        || region_bytes != cfg.region_bytes
    {
        return Err(format!(
            "the copies differ in shape: {block_count} blocks of {block_size_bytes} bytes, region {region_bytes} (here {} of {}, region {})",
            inner.geo.block_count, inner.geo.block_size_bytes, cfg.region_bytes
        ));
    }
    let mut peer_bits = vec![0u8; bits.len()];
    loop {
        match tokio::time::timeout(Duration::from_secs(10), f.recv()).await {
            Ok(Ok(Message::Bitmap { first_region, bits })) => {
                let at = (first_region / 8) as usize;
                if first_region % 8 != 0 || at + bits.len() > peer_bits.len() {
                    return Err("partner's bitmap does not fit the volume".into());
                }
                peer_bits[at..at + bits.len()].copy_from_slice(&bits);
            }
            Ok(Ok(Message::BitmapDone)) => break,
            Ok(Ok(_)) => return Err("unexpected message during the handshake".into()),
            Ok(Err(e)) => return Err(e.to_string()),
            Err(_) => return Err("the partner's bitmap did not arrive".into()),
        }
    }
    let peer_meta = Meta {
        current: gens.current,
        synced: gens.synced,
        consistent: flags & hello_flags::CONSISTENT != 0,
    };
    let p = plan(cfg.node_id, meta, node_id, peer_meta, cfg.preferred_node)?;
    Ok((f, p, peer_meta, peer_bits))
}

/// Runs a connected session until the link is lost; returns the dead link.
async fn session(
    inner: &Arc<Inner>,
    f: Framed,
    p: Plan,
    peer_meta: Meta,
    peer_bits: Vec<u8>,
) -> Arc<Link> {
    // a target records that it is being resynchronised (and what remains to
    // copy) before it handles a single message of the partner
    let target_ready = match p {
        Plan::Target => inner.bitmap.merge(0, &peer_bits).await,
        Plan::Source { .. } => Ok(()),
    };
    let (tx, mut rx) = mpsc::channel::<Message>(256);
    let link = Link::start(
        f,
        tx,
        Duration::from_millis(inner.cfg.heartbeat_interval_ms),
        Duration::from_millis(inner.cfg.peer_timeout_ms),
    );
    tracing::info!(volume = %inner.cfg.name, peer = %link.peer, ?p, "partner connected");
    // the link dies with the session, even when the session is cancelled
    struct CloseOnDrop(Arc<Link>);
    impl Drop for CloseOnDrop {
        fn drop(&mut self) {
            self.0.close("session ended");
        }
    }
    let _close = CloseOnDrop(link.clone());
    match (&p, target_ready) {
        (Plan::Target, Ok(())) => inner.set_role(
            Role::Target,
            Some(link.clone()),
            false,
            "being resynchronised by the partner".into(),
        ),
        (Plan::Target, Err(e)) => link.close(&format!("cannot persist resync state: {e}")),
        (Plan::Source { .. }, _) => inner.set_role(
            Role::Leader,
            Some(link.clone()),
            true,
            "resynchronising the partner".into(),
        ),
    }
    // the partner's messages are handled only once the role is set
    let dispatch = {
        let inner = inner.clone();
        let link = link.clone();
        tokio::spawn(async move {
            while let Some(m) = rx.recv().await {
                tokio::spawn(inner.clone().handle(link.clone(), m));
            }
        })
    };
    if let Plan::Source { full } = p {
        if let Err(e) = resync(inner, &link, full, peer_meta, &peer_bits).await {
            link.close(&format!("resync failed: {e}"));
        }
    }
    link.closed().await;
    dispatch.abort();
    link
}

async fn resync(
    inner: &Arc<Inner>,
    link: &Arc<Link>,
    full: bool,
    peer_meta: Meta,
    peer_bits: &[u8],
) -> Result<(), String> {
    let io = |e: std::io::Error| e.to_string();
    // writes started alone must finish before the set of regions to copy is taken
    loop {
        let drained = inner.solo_drained.notified();
        tokio::pin!(drained);
        drained.as_mut().enable();
        if inner.solo_writes.load(Ordering::Acquire) == 0 {
            break;
        }
        drained.await;
    }
    if full {
        inner.bitmap.set_all().await.map_err(io)?;
    } else {
        inner.bitmap.merge(0, peer_bits).await.map_err(io)?;
    }
    let regions = inner.bitmap.set_regions();
    let rb = inner.bitmap.region_blocks();
    let bs = inner.geo.block_size_bytes as u64;
    inner
        .resync_total
        .store(regions.len() as u64, Ordering::Relaxed);
    inner.resync_done.store(0, Ordering::Relaxed);
    tracing::info!(volume = %inner.cfg.name, regions = regions.len(), full, peer = ?peer_meta, "resync starts");
    // runs of adjacent regions, at most RESYNC_COPY_BYTES_MAX each
    let per_copy = (RESYNC_COPY_BYTES_MAX / bs / rb).max(1);
    let mut runs: Vec<(u64, u64)> = Vec::new();
    for r in regions {
        match runs.last_mut() {
            Some((s, n)) if *s + *n == r && *n < per_copy => *n += 1,
            _ => runs.push((r, 1)),
        }
    }
    let copy = |start: u64, n: u64| {
        let inner = inner.clone();
        let link = link.clone();
        async move {
            let lba = start * rb;
            let blocks = (n * rb).min(inner.geo.block_count - lba);
            let _g = inner
                .locks
                .lock(lba, lba + blocks, LockMode::Exclusive)
                .await;
            let data = inner
                .local
                .read(lba, blocks as u32)
                .await
                .map_err(|e| e.to_string())?;
            let len = data.len() as u64;
            match link
                .request(|id| Message::ResyncData { id, lba, data })
                .await
            {
                Ok(OpResult::Ok) => {}
                Ok(other) => return Err(format!("partner refused resync data: {other:?}")),
                Err(LinkLost) => return Err("link lost".into()),
            }
            for r in start..start + n {
                inner.bitmap.clear_region(r);
            }
            inner.resync_done.fetch_add(n, Ordering::Relaxed);
            inner.resynced_bytes.fetch_add(len, Ordering::Relaxed);
            Ok::<(), String>(())
        }
    };
    let mut set = tokio::task::JoinSet::new();
    for (s, n) in runs {
        if set.len() >= RESYNC_IN_FLIGHT_MAX {
            if let Some(r) = set.join_next().await {
                r.map_err(|e| e.to_string())??;
            }
        }
        set.spawn(copy(s, n));
    }
    while let Some(r) = set.join_next().await {
        r.map_err(|e| e.to_string())??;
    }
    inner.local.flush().await.map_err(|e| e.to_string())?;
    let peer = inner.scsi_peer.read().clone();
    if let Some(p) = peer {
        p.before_in_sync().await?;
    }
    let mut m = *inner.meta.lock();
    if m.current == 0 {
        while m.current == 0 {
            m.current = rand::random();
        }
    }
    m.synced = m.current;
    m.consistent = true;
    let gens = m.gens();
    match link.request(|id| Message::ResyncDone { id, gens }).await {
        Ok(OpResult::Ok) => {}
        Ok(other) => return Err(format!("partner refused the end of the resync: {other:?}")),
        Err(LinkLost) => return Err("link lost".into()),
    }
    inner.store_meta(m).map_err(io)?;
    inner.bitmap.persist().await.map_err(io)?;
    inner.set_role(Role::Leader, Some(link.clone()), false, "in sync".into());
    tracing::info!(volume = %inner.cfg.name, bytes = inner.resynced_bytes.load(Ordering::Relaxed), "resync done: in sync");
    if let Some(addr) = inner.cfg.witness {
        let release = Message::WitnessRelease {
            cluster: inner.cfg.cluster.clone(),
            node_id: inner.cfg.node_id,
        };
        match witness::ask(addr, release).await {
            Ok(_) => inner.witness_state.store(1, Ordering::Relaxed),
            Err(_) => inner.witness_state.store(2, Ordering::Relaxed),
        }
    }
    Ok(())
}
