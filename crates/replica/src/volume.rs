//! The replicated volume: a [`Volume`] over the local copy that keeps the
//! partner's copy identical (the write ordering, forwarding and the partner's
//! requests); its connection's life (connect, handshake, resync, decide) is in
//! `session.rs`.

use crate::bitmap::DirtyBitmap;
use crate::link::{Framed, Link, LinkLost};
use crate::meta::{Meta, MetaFile};
use crate::secure::ClusterKeys;
use async_trait::async_trait;
use block::{BlockError, BlockResult, Bytes, Geometry, LockMode, RangeLocks, Volume, VolumeRef};
use parking_lot::Mutex;
use replica_proto::{error_codes, Message, Op, OpResult, REPAIR_BYTES_MAX};
use serde::Serialize;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, watch};

/// How long an operator's change of the copy waits for a meeting with the
/// partner, or a decision to go on alone, to end (`Inner::between_meetings`).
const OPERATOR_WAIT: Duration = Duration::from_secs(15);

/// How long a grow waits for the partner's copy to grow (a pool zeroes its
/// new stripes first: minutes on disks): a partner that stops answering
/// heartbeats closes the link long before.
const GROW_PATIENCE: Duration = Duration::from_secs(3600);

/// What this node saw of the partner's copy at their last handshake since
/// it started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PartnerSeen {
    /// Not met, or met and joined (what its copy is now is not known once
    /// that session ends).
    NotMet,
    /// Consistent: it may be serving alone.
    Consistent,
    /// Not consistent (an interrupted resync target, or discarded).
    NotConsistent,
}

/// How the two nodes serve a replicated volume.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// Both nodes serve reads and writes.
    ActiveActive,
    /// Only the leader serves; the other node's paths report standby.
    ActivePassive,
}

impl ReplicaConfig {
    /// The name of this volume's survivor grant at the witness: one grant per
    /// replicated volume, since each volume's copies fall behind and resync on
    /// their own (a grant per pair would be released by the first volume back in
    /// sync while another still depends on it).
    pub fn witness_key(&self) -> String {
        witness_key(&self.cluster, &self.name)
    }
}

/// The survivor grant of volume `name` of pair `cluster` (see
/// [`ReplicaConfig::witness_key`]): `cluster:name`, or, when that is longer
/// than the protocol's names ([`replica_proto::NAME_BYTES_MAX`] bytes),
/// `cluster:#` and the SHA-256 of the name in hex. The encoder cut long names
/// short (review of 2026-12-06): the LUNs of a long-named target then shared
/// one grant, and the first back in sync released it while another still
/// depended on it, so the partner could claim it and serve that LUN beside
/// this node (two writers).
pub fn witness_key(cluster: &str, name: &str) -> String {
    use sha2::Digest;
    let key = format!("{cluster}:{name}");
    if key.len() <= replica_proto::NAME_BYTES_MAX {
        return key;
    }
    format!(
        "{cluster}:#{}",
        hex::encode(sha2::Sha256::digest(name.as_bytes()))
    )
}

/// Bytes a hashed [`witness_key`] adds to the cluster name: ":#" and 64 hex digits.
const HASHED_KEY_EXTRA_BYTES: usize = 2 + 64;

/// Refuses a pair or volume name that does not fit the sync protocol's names
/// ([`replica_proto::NAME_BYTES_MAX`] bytes): the handshake names the volume
/// (cut short, it named no volume of the partner's and the LUN never
/// replicated), and the witness request its grant (see [`witness_key`]).
pub fn check_names(cluster: &str, name: &str) -> Result<(), String> {
    let max = replica_proto::NAME_BYTES_MAX;
    if name.len() > max {
        return Err(format!(
            "replicated volume \"{name}\" is {} bytes, more than the {max} the cluster \
             protocol carries: use a shorter cluster name or target IQN",
            name.len()
        ));
    }
    let key = witness_key(cluster, name);
    if key.len() > max {
        return Err(format!(
            "cluster name {cluster:?} is too long for its witness grants ({} bytes; at most {})",
            cluster.len(),
            max - HASHED_KEY_EXTRA_BYTES
        ));
    }
    Ok(())
}

/// Configuration of one node's side of a replicated volume.
#[derive(Debug, Clone)]
pub struct ReplicaConfig {
    /// Name of the volume, the same on both nodes.
    pub name: String,
    /// The pair's name (with the volume's, it names this volume's survivor grant
    /// at the witness).
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
    /// This node's cluster keys: every sync and witness connection is
    /// authenticated and encrypted with them (`secure.rs`).
    pub keys: Arc<ClusterKeys>,
    /// The node's budget of buffered data bytes. The partner's writes are
    /// charged to it while they are applied (counted, never waiting: this
    /// node's own frontend writes hold permits while the partner applies them,
    /// so two nodes waiting for each other's applies could stop the pair);
    /// resync copies this node sends take permits (waiting, holding nothing).
    pub buffers: block::BufferBudget,
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
pub(crate) struct RoleState {
    pub(crate) role: Role,
    pub(crate) link: Option<Arc<Link>>,
    /// The partner is a resync target (not in sync yet).
    pub(crate) peer_resyncing: bool,
    /// Shared, so the per-I/O snapshot of the role costs no allocation.
    pub(crate) reason: Arc<str>,
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
    /// A copy that is not consistent and was changed by a resync, or failed
    /// under a write, since it was last consistent (it may lack acknowledged
    /// data; such a copy cannot be kept).
    pub partial: bool,
    /// The witness address, if any.
    pub witness: Option<String>,
    /// Whether the witness answered the last request (None: not asked yet).
    pub witness_reachable: Option<bool>,
    /// The partner's offloaded copies under way whose overwritten blocks this
    /// node keeps, to undo them if the partner is lost before they end.
    pub partner_copies_open: usize,
    /// Paths of this node and of the partner.
    pub local_paths: PathState,
    /// Paths of the partner as this node sees them.
    pub peer_paths: PathState,
    /// Times this node's settled role changed since it started.
    pub role_changes: u64,
    /// When it last changed (Unix ms), if it has.
    pub role_changed_ms: Option<u64>,
    /// Failovers since start: this node went on serving alone after serving
    /// with its partner (leader or follower, then solo).
    pub failovers: u64,
    /// When the last one happened (Unix ms), if one has.
    pub last_failover_ms: Option<u64>,
    /// Every sync link's heartbeat state (empty when not monitored).
    pub sync_links: Vec<crate::monitor::SyncLinkState>,
    /// Heartbeats with the partner over the client-facing networks (its portals),
    /// apart from the sync links: tells a failed sync link from a failed partner.
    pub client_links: Vec<crate::monitor::SyncLinkState>,
    /// Why who may reach the volume's LUN differs between the two nodes, as the
    /// SCSI layer last found when it compared them
    /// ([`ReplicatedVolume::set_access_mismatch`]); None when they agreed or
    /// were not compared.
    pub access_mismatch: Option<String>,
    /// Blocks rewritten on this copy from the partner's because a read of
    /// theirs failed here with a medium error (a pool's lost blocks, bad
    /// sectors): every block of each such read, since the node started.
    pub repaired_blocks: u64,
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

pub(crate) struct InFlightForward {
    op: Op,
    applied: bool,
}

pub(crate) struct Inner {
    pub(crate) cfg: ReplicaConfig,
    pub(crate) local: VolumeRef,
    /// The geometry at open; the served block count is `block_count` (it grows).
    geo_at_open: Geometry,
    block_count: AtomicU64,
    pub(crate) meta_file: MetaFile,
    pub(crate) meta: Mutex<Meta>,
    pub(crate) bitmap: DirtyBitmap,
    /// What the partner's unfinished copies overwrote here (`undo.rs`).
    pub(crate) undo: crate::undo::CopyUndo,
    pub(crate) locks: RangeLocks,
    pub(crate) role_tx: watch::Sender<RoleState>,
    /// Forwarded ops in flight, by link (`forward_key`) and request id: each
    /// link numbers its requests from 1, and a forward on a closed link can
    /// end after a new link reused its id (review of 2026-12-06: keyed by the
    /// id alone, it removed the new link's entry).
    pub(crate) forwards: Mutex<HashMap<ForwardKey, InFlightForward>>,
    /// Writes started while serving alone: a resync lets them finish before
    /// it takes the set of regions to copy.
    pub(crate) solo_writes: Arc<block::inflight::InFlight>,
    /// Times this node's copy was detached after a failure (the connection
    /// manager backs off while the disk keeps failing).
    pub(crate) detaches: AtomicU64,
    /// Times the operator kept this copy ([`ReplicatedVolume::keep_copy`]): the
    /// connection manager judges the copies afresh (a refusal before no longer
    /// holds it back from deciding).
    pub(crate) operator_changes: AtomicU64,
    /// The partner's copy at the last handshake since this node started
    /// (`keep_copy`).
    pub(crate) partner_seen: Mutex<PartnerSeen>,
    /// Handshakes completed with the partner, and the times the copies came
    /// in sync (a new meeting may undo the partner's kept copies, and a resync
    /// target keeps nothing: `undo.rs`).
    pub(crate) meetings: AtomicU64,
    /// Flushes of both copies made through this node (ordered here or
    /// forwarded to the leader, which makes each on both): how many began,
    /// and the highest number among those that ended on both (see
    /// [`Inner::flushed`]).
    flushes_begun: AtomicU64,
    flushes_covered: AtomicU64,
    /// The copies this node runs, with the meeting of their first write: a
    /// copy the pair met again during fails (its first writes may have been
    /// undone at that meeting).
    pub(crate) copies: Mutex<HashMap<u64, u64>>,
    pub(crate) resync_total: AtomicU64,
    pub(crate) resync_done: AtomicU64,
    pub(crate) resynced_bytes: AtomicU64,
    /// 0 not asked, 1 reachable, 2 unreachable.
    pub(crate) witness_state: AtomicU8,
    /// The number of the last request to the witness; held while one is
    /// asked, so that this node's requests go one at a time and in order
    /// (see [`Inner::ask_witness`]).
    witness_seq: tokio::sync::Mutex<crate::meta::SeqFile>,
    /// Set by `shutdown`.
    pub(crate) stop_tx: watch::Sender<bool>,
    /// Serialises metadata updates made from request handlers.
    pub(crate) meta_write: tokio::sync::Mutex<()>,
    /// Held by the connection manager while it meets the partner (handshake
    /// and session) or decides alone, and by the operator's changes of the
    /// copy (`discard_copy`, `keep_copy`): a change made while a handshake
    /// judged the copy as it was (or a decision read it) would be
    /// overwritten, or would call a copy a resync is writing consistent.
    pub(crate) meeting: tokio::sync::Mutex<()>,
    /// The SCSI layer's handler of the partner's requests.
    pub(crate) scsi_peer: parking_lot::RwLock<Option<Arc<dyn ScsiPeer>>>,
    /// The partner said, at the last meeting, that it takes repair requests
    /// (`hello_flags::REPAIR`).
    pub(crate) partner_repairs: std::sync::atomic::AtomicBool,
    /// The partner's peer timeout as its last hello said (ms; 0: not said):
    /// its lease on serving lasts that long, so a survivor waits out the
    /// longer of the two ([`Inner::partner_timeout_ms`]).
    partner_timeout: AtomicU64,
    /// Blocks this copy could not read and got from the partner's copy.
    repaired_blocks: AtomicU64,
    /// See [`ReplicaStatus::access_mismatch`].
    access_mismatch: Mutex<Option<String>>,
    /// Heartbeats on every sync link (node-wide), when running.
    pub(crate) monitor: parking_lot::RwLock<Option<Arc<crate::monitor::SyncLinkMonitor>>>,
    /// Heartbeats over the client-facing networks, if monitored.
    pub(crate) client_monitor: parking_lot::RwLock<Option<Arc<crate::monitor::SyncLinkMonitor>>>,
    pub(crate) ports_tx: watch::Sender<PortStates>,
    /// Role history for the status and metrics (see [`RoleHistory`]).
    history: Mutex<RoleHistory>,
}

/// What an operator asks after a failover: how often and when the role changed.
#[derive(Debug, Clone, Copy, Default)]
struct RoleHistory {
    /// The last role other than Deciding.
    settled: Option<Role>,
    changes: u64,
    changed_ms: Option<u64>,
    failovers: u64,
    failover_ms: Option<u64>,
}

impl RoleHistory {
    /// Notes that the role is now `role` (at `now_ms`).
    fn note(&mut self, role: Role, now_ms: u64) {
        if role == Role::Deciding || self.settled == Some(role) {
            return;
        }
        if self.settled.is_some() {
            self.changes += 1;
            self.changed_ms = Some(now_ms);
        }
        if role == Role::Solo && matches!(self.settled, Some(Role::Leader | Role::Follower)) {
            self.failovers += 1;
            self.failover_ms = Some(now_ms);
        }
        self.settled = Some(role);
    }
}

/// A forwarded op's key: its link (by address: the forward holds the link, so
/// the address is not reused meanwhile) and its request id on it.
pub(crate) type ForwardKey = (usize, u64);

fn forward_key(link: &Arc<Link>, id: u64) -> ForwardKey {
    (Arc::as_ptr(link) as *const () as usize, id)
}

/// Whether an op whose local part completed may simply run again (through a
/// new session with the partner, see `partner_has_it`): writes, zeroing,
/// discards, flushes and grows land the same the second time. Not a
/// compare-and-write: its compare would meet its own data.
fn rerun(op: &Op) -> bool {
    !matches!(op, Op::CompareAndWrite { .. })
}

#[cfg(test)]
mod role_history_tests {
    use super::{Role, RoleHistory};

    #[test]
    fn a_failover_is_serving_alone_after_serving_together() {
        let mut h = RoleHistory::default();
        // start-up: deciding, then a first settled role is no change
        h.note(Role::Deciding, 1);
        h.note(Role::Follower, 2);
        assert_eq!((h.changes, h.failovers, h.changed_ms), (0, 0, None));
        // the partner is lost: deciding (not counted), then solo
        h.note(Role::Deciding, 3);
        h.note(Role::Solo, 4);
        assert_eq!((h.changes, h.changed_ms), (1, Some(4)));
        assert_eq!((h.failovers, h.failover_ms), (1, Some(4)));
        // the partner comes back: leader is a change, not a failover
        h.note(Role::Leader, 5);
        assert_eq!((h.changes, h.failovers), (2, 1));
        // the same role again is nothing
        h.note(Role::Leader, 6);
        assert_eq!(h.changed_ms, Some(5));
        // solo straight after a restart without the partner is no failover
        let mut cold = RoleHistory::default();
        cold.note(Role::Solo, 7);
        cold.note(Role::Target, 8);
        cold.note(Role::Solo, 9);
        assert_eq!((cold.changes, cold.failovers), (2, 0));
    }
}

fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// A volume replicated synchronously to the partner node.
pub struct ReplicatedVolume {
    inner: Arc<Inner>,
}

/// Where the listener hands connections that named this volume.
#[derive(Clone)]
pub struct ConnectionSink {
    pub(crate) tx: mpsc::Sender<(Framed, Message)>,
}

impl ConnectionSink {
    pub(crate) async fn deliver(&self, f: Framed, hello: Message) {
        let _ = self.tx.send((f, hello)).await;
    }
}

/// Whether `e` says the copy itself failed (the disk below), not the request.
/// A copy out of space (a thin file on a full file system, a full pool) or
/// made read-only under the node (a file system remounted read-only after
/// errors) has failed too: it cannot take the pair's writes, which the other
/// copy takes. Counted as a request error, the write failed on one copy and
/// stood on the other, and the two nodes served different data for those
/// blocks until the next meeting. (md and DRBD fail such a member as well.)
/// When both copies run out of space at once, the follower detaches too (it
/// cannot tell), and is filled in once it has room again.
fn copy_failed(e: &BlockError) -> bool {
    matches!(
        e,
        BlockError::Medium { .. }
            | BlockError::WriteFault { .. }
            | BlockError::Io(_)
            | BlockError::Unavailable(_)
            | BlockError::NoSpace { .. }
            | BlockError::ReadOnly
    )
}

/// The answer to a request this node cannot serve now.
fn unavailable() -> OpResult {
    OpResult::Error {
        code: error_codes::UNAVAILABLE,
        lba: 0,
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
        Op::Write { lba, data, .. } | Op::CopyWrite { lba, data, .. } => {
            Some((*lba, data.len() as u64 / bs))
        }
        Op::CompareAndWrite { lba, data, .. } => Some((*lba, data.len() as u64 / bs)),
        Op::WriteZeroes { lba, blocks, .. } | Op::Discard { lba, blocks } => Some((*lba, *blocks)),
        Op::Flush | Op::Grow { .. } => None,
    }
}

/// A copy during which the pair met again.
fn met_again(name: &str) -> BlockError {
    BlockError::Unavailable(format!(
        "replica {name}: the nodes met again during the copy; it may be partly undone"
    ))
}

/// What an op's outcome is to the caller: `Some(offset)` for a miscompare.
type OpOutcome = BlockResult<Option<usize>>;

impl Inner {
    pub(crate) fn role(&self) -> RoleState {
        self.role_tx.borrow().clone()
    }

    /// Notes the partner's peer timeout from its hello (None: it did not say).
    pub(crate) fn note_partner_timeout(&self, ms: Option<u64>) {
        if let Some(ms) = ms {
            self.partner_timeout.store(ms, Ordering::Release);
        }
    }

    /// How long the partner's lease on serving may outlast its last ping
    /// here: the longer of the two nodes' peer timeouts (a partner with a
    /// longer one, not yet met since this process started, is not known).
    pub(crate) fn partner_timeout_ms(&self) -> u64 {
        self.cfg
            .peer_timeout_ms
            .max(self.partner_timeout.load(Ordering::Acquire))
    }

    pub(crate) fn set_role(
        &self,
        role: Role,
        link: Option<Arc<Link>>,
        peer_resyncing: bool,
        reason: String,
    ) {
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
            reason: reason.into(),
        };
        self.bitmap
            .set_keep(!matches!(role, Role::Leader | Role::Follower) || peer_resyncing);
        if matches!(role, Role::Leader | Role::Follower) && !peer_resyncing {
            // in sync: nothing of the partner's copies is kept any more, and
            // this node's copies under way fail (a resync target keeps
            // nothing, so their writes made before are not undoable)
            self.undo.in_sync();
            self.meetings.fetch_add(1, Ordering::AcqRel);
        }
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
        self.history.lock().note(role, unix_ms());
        self.role_tx.send_replace(st);
        self.ports_tx.send_if_modified(|p| {
            let changed = *p != ports;
            *p = ports;
            changed
        });
    }

    /// Asks the witness for the survivor grant (`claim`) or releases it, if
    /// `still()` holds once this node's earlier request has ended; None if it
    /// no longer does. Returns the holder afterwards. Each request carries a
    /// number above the last (microseconds since the epoch, or one more than
    /// the last: rising across restarts too), and they go one at a time.
    pub(crate) async fn ask_witness(
        &self,
        addr: SocketAddr,
        claim: bool,
        still: impl FnOnce() -> bool,
    ) -> Option<std::io::Result<u8>> {
        let mut numbers = self.witness_seq.lock().await;
        if !still() {
            return None;
        }
        let micros = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_micros() as u64);
        let seq = match numbers.next(micros).await {
            Ok(seq) => seq,
            Err(e) => {
                return Some(Err(std::io::Error::new(
                    e.kind(),
                    format!("this node could not store its witness request number: {e}"),
                )))
            }
        };
        let (cluster, node_id) = (self.cfg.witness_key(), self.cfg.node_id);
        let msg = if claim {
            Message::WitnessClaim {
                cluster,
                node_id,
                seq,
            }
        } else {
            Message::WitnessRelease {
                cluster,
                node_id,
                seq,
            }
        };
        let r = crate::witness::ask(addr, &self.cfg.keys, msg).await;
        self.witness_state
            .store(if r.is_ok() { 1 } else { 2 }, Ordering::Relaxed);
        Some(r)
    }

    /// The number the next flush of both copies will follow: once
    /// [`Inner::flushed`] passes it, a flush begun after this call has ended
    /// on both copies.
    pub(crate) fn flush_mark(&self) -> u64 {
        self.flushes_begun.load(Ordering::Acquire)
    }

    /// Numbers a flush of both copies about to begin.
    fn flush_begins(&self) -> u64 {
        self.flushes_begun.fetch_add(1, Ordering::AcqRel) + 1
    }

    /// Flush `n` (from [`Inner::flush_begins`]) ended on both copies.
    fn flush_ended(&self, n: u64) {
        self.flushes_covered.fetch_max(n, Ordering::AcqRel);
    }

    /// Whether a flush of both copies begun after `mark` (from
    /// [`Inner::flush_mark`]) has ended on both.
    pub(crate) fn flushed(&self, mark: u64) -> bool {
        self.flushes_covered.load(Ordering::Acquire) > mark
    }

    /// Flushes both copies through the ordering path (as a client's flush).
    pub(crate) async fn flush_both(self: &Arc<Self>) -> BlockResult<()> {
        self.submit(Op::Flush).await.map(|_| ())
    }

    /// Waits until the connection manager is neither meeting the partner nor
    /// deciding alone, and keeps it from starting either (see `meeting`):
    /// at most [`OPERATOR_WAIT`], as a handshake or a decision ends by itself
    /// within it, while a joined session goes on (and its copy is not down).
    /// A copy that is not down (or a volume shut down) is refused at once;
    /// the caller checks the role again under the guard.
    pub(crate) async fn between_meetings(
        &self,
        verb: &str,
    ) -> Result<tokio::sync::MutexGuard<'_, ()>, String> {
        let down = |role: Role| {
            if *self.stop_tx.borrow() {
                return Err("this volume is shut down".to_string());
            }
            if role != Role::Down {
                return Err(format!(
                    "this node's copy is {role:?}; only a copy that is down (not serving) can be {verb}"
                ));
            }
            Ok(())
        };
        down(self.role().role)?;
        match tokio::time::timeout(OPERATOR_WAIT, self.meeting.lock()).await {
            Ok(guard) => {
                down(self.role().role)?;
                Ok(guard)
            }
            Err(_) => Err(format!(
                "this node's copy is {:?} and the node is still meeting its partner or deciding \
                 after {} s; try again",
                self.role().role,
                OPERATOR_WAIT.as_secs()
            )),
        }
    }

    pub(crate) fn store_meta(&self, m: Meta) -> std::io::Result<()> {
        self.meta_file.store(&m)?;
        *self.meta.lock() = m;
        Ok(())
    }

    /// Changes the metadata under the lock of its writers: `f` changes a copy
    /// and says whether it changed anything, which is then stored.
    pub(crate) async fn update_meta(
        &self,
        f: impl FnOnce(&mut Meta) -> bool,
    ) -> std::io::Result<()> {
        let _one = self.meta_write.lock().await;
        let mut m = *self.meta.lock();
        if f(&mut m) {
            self.store_meta(m)?;
        }
        Ok(())
    }

    /// This node's copy failed under a write (`why`) that the partner holds: the
    /// copy is marked inconsistent (persistently, so it never serves or feeds a
    /// resync until the partner has repaired it), the node stops serving the
    /// volume, and the partner is told ([`Message::Detach`]) so it goes on alone
    /// at once, without a tie-break. The region stays marked in this node's
    /// bitmap (pinned by the caller). False when the copy could not be marked:
    /// then the write must fail instead.
    pub(crate) async fn detach(&self, why: String) -> bool {
        // held until the role is down: the end of a resync taken meanwhile
        // (`finish_as_target`) sees the copy detached, and never calls it
        // consistent after this mark
        let one = self.meta_write.lock().await;
        let mut m = *self.meta.lock();
        if m.mark_partial() {
            if let Err(e) = self.store_meta(m) {
                tracing::error!(volume = %self.cfg.name, "cannot mark the failed copy inconsistent: {e}");
                return false;
            }
        }
        let _ = self.bitmap.persist().await;
        self.detaches.fetch_add(1, Ordering::AcqRel);
        let st = self.role();
        if st.role != Role::Down {
            tracing::error!(volume = %self.cfg.name, %why, "local copy failed: detached, the partner serves alone");
        }
        if let Some(l) = &st.link {
            // before the role changes: a message of the partner handled
            // meanwhile may close the link as not fitting the new role
            l.say_last(Message::Detach {
                reason: why.clone(),
            });
        }
        self.set_role(
            Role::Down,
            None,
            false,
            format!("local copy failed ({why}): detached; the partner serves alone and resyncs this copy once it works again"),
        );
        drop(one);
        if let Some(l) = st.link {
            // the partner closes the link when it reads this; if it does not
            // within a timeout, this side does
            let _ = l.send(Message::Detach { reason: why }).await;
            let timeout = Duration::from_millis(self.cfg.peer_timeout_ms);
            tokio::spawn(async move {
                let _ = tokio::time::timeout(timeout, l.closed()).await;
                l.close("detached");
            });
        }
        true
    }

    /// Waits until this node may serve I/O, or fails with NOT READY.
    async fn wait_serving(&self, deadline: Instant) -> BlockResult<RoleState> {
        let mut rx = self.role_tx.subscribe();
        loop {
            let st = rx.borrow_and_update().clone();
            let lease = || st.link.as_ref().is_some_and(|l| l.lease_valid());
            match st.role {
                Role::Solo => return Ok(st),
                Role::Leader if lease() => return Ok(st),
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

    /// Runs a client op in whatever role this node has, on a task of its own:
    /// a caller that goes away (an aborted command: ABORT TASK, LUN RESET,
    /// PREEMPT AND ABORT, a connection's drain) must not stop it half-way. On
    /// the leader, dropping it would release the range lock while the partner
    /// still applies the write, so an overlapping write could land there first
    /// and the copies would end different; on a follower, it would forget the
    /// forwarded write the leader is about to apply here, and the leader would
    /// keep it alone. The op ends as it would have, unanswered.
    async fn submit(self: &Arc<Self>, op: Op) -> OpOutcome {
        let me = self.clone();
        match tokio::spawn(async move { me.submit_here(op).await }).await {
            Ok(r) => r,
            Err(e) => Err(BlockError::Io(std::io::Error::other(format!(
                "replicated op task: {e}"
            )))),
        }
    }

    async fn submit_here(self: &Arc<Self>, op: Op) -> OpOutcome {
        let deadline = self.deadline();
        loop {
            let st = self.wait_serving(deadline).await?;
            match st.role {
                Role::Solo => {
                    let counted = self.solo_writes.enter();
                    let still = self.role_tx.borrow().role == Role::Solo;
                    let r = if still {
                        Some(self.ordered(&st, &op, None).await)
                    } else {
                        None
                    };
                    drop(counted);
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
                        if next.role == Role::Leader && rerun(&op) {
                            continue;
                        }
                        let next = self.partner_has_it(next, deadline).await?;
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
                            if next.role == Role::Leader && applied && rerun(&op) {
                                continue;
                            }
                            let next = match applied {
                                true => self.partner_has_it(next, deadline).await?,
                                false => next,
                            };
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

    /// The copy `copy` this node ran has ended: the partner lets go what its
    /// writes overwrote there (`undo.rs`) before the command is answered. Ok
    /// too when the partner's keeping no longer matters: this node serves alone
    /// (the partner stopped; at their next meeting this copy is the newer and
    /// overwrites whatever the partner puts back). Sent to a resync target too:
    /// it keeps nothing, but it may already follow (it does from the resync's
    /// end, before this node knows it) and keep this copy's last writes.
    async fn end_copy(&self, copy: u64) -> BlockResult<()> {
        let deadline = self.deadline();
        let st = self.wait_serving(deadline).await?;
        let link = match (st.role, &st.link) {
            (Role::Solo, _) => return Ok(()),
            (Role::Leader | Role::Follower, Some(l)) => l.clone(),
            _ => {
                return Err(BlockError::Unavailable(format!(
                    "replica {}: no partner link to end a copy on",
                    self.cfg.name
                )))
            }
        };
        match link.request(|id| Message::CopyEnd { id, copy }).await {
            Ok(OpResult::Ok) => Ok(()),
            Ok(OpResult::Error { code, lba }) => Err(block_err_of(code, lba, "copy end")),
            Ok(OpResult::Miscompare { .. }) => Err(BlockError::WriteFault { lba: 0 }),
            Err(LinkLost) => {
                let next = self.after_link_lost(&link, deadline).await?;
                match next.role {
                    Role::Solo | Role::Leader => Ok(()),
                    _ => Err(BlockError::Unavailable(format!(
                        "partner lost and this node stopped: {}",
                        next.reason
                    ))),
                }
            }
        }
    }

    /// After a link loss, an op whose local part completed and that the partner
    /// may not have got: when this node leads a new session with the partner,
    /// the partner's copy can still count as consistent (a resync target is,
    /// until a change of the session reaches it) and go on alone without the
    /// op if this node is lost next; acknowledged then, the op was lost
    /// (review of 2026-12-06). An op [`rerun`] allows runs again through the
    /// new session instead; the others wait here until the partner has the
    /// op's region (the resync ended: it was marked) or this node serves
    /// alone, within `deadline`.
    async fn partner_has_it(&self, next: RoleState, deadline: Instant) -> BlockResult<RoleState> {
        if !(next.role == Role::Leader && next.peer_resyncing) {
            return Ok(next);
        }
        // from the state now (the resync may have ended since `next`), and
        // through a decision (the link lost again: this node may go on alone)
        let mut rx = self.role_tx.subscribe();
        let mut st = rx.borrow_and_update().clone();
        loop {
            let waits = (st.role == Role::Leader && st.peer_resyncing) || st.role == Role::Deciding;
            if !waits {
                return Ok(st);
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(BlockError::Unavailable(
                    "the partner is being resynced and may not hold this write yet; retry".into(),
                ));
            }
            let _ = tokio::time::timeout(deadline - now, rx.changed()).await;
            st = rx.borrow_and_update().clone();
        }
    }

    /// An op whose local part completed when the link failed, on a node that goes on:
    /// it stands as done (a flush is repeated locally to be sure).
    async fn local_outcome_after_loss(&self, op: &Op) -> OpOutcome {
        match op {
            Op::Flush => self.local.flush().await?,
            Op::Grow { block_count } => self.expose(*block_count),
            _ => {}
        }
        Ok(None)
    }

    /// The served geometry.
    pub(crate) fn geo(&self) -> Geometry {
        Geometry {
            block_count: self.block_count.load(Ordering::Acquire),
            ..self.geo_at_open
        }
    }

    /// Serves a grown size (both copies, or this one alone, have it).
    pub(crate) fn expose(&self, block_count: u64) {
        let was = self.block_count.fetch_max(block_count, Ordering::AcqRel);
        if block_count > was {
            tracing::info!(volume = %self.cfg.name, from = was, to = block_count, "replicated volume grown");
        }
    }

    /// Grows the local copy and its bitmap (not yet served: see [`Inner::expose`]).
    pub(crate) async fn grow_local(&self, block_count: u64) -> BlockResult<()> {
        // (the size may be the partner's: checked before the volume grows)
        self.bitmap
            .check_size(block_count)
            .map_err(BlockError::Io)?;
        self.local.grow(block_count).await?;
        if self.local.geometry().block_count < block_count {
            return Err(BlockError::Unavailable(format!(
                "replica {}: the local volume did not grow",
                self.cfg.name
            )));
        }
        self.bitmap.grow(block_count).await.map_err(BlockError::Io)
    }

    /// Performs the local part of an op (the write part for COMPARE AND WRITE).
    /// `from_partner`: the op came from the partner (its copy writes are kept
    /// for undoing, `undo.rs`, unless this node is a resync target).
    async fn local_apply(&self, op: &Op, from_partner: bool) -> BlockResult<()> {
        let bs = self.geo_at_open.block_size_bytes as u64;
        match op {
            Op::CopyWrite {
                copy,
                lba,
                fua,
                data,
            } if from_partner => {
                let _g = self.undo.hold().await;
                match self.role().role {
                    // a resync target keeps nothing (it serves nothing yet), so
                    // this copy can no longer be undone whole here, even once
                    // in sync
                    Role::Target => {
                        self.undo.not_undoable(*copy);
                        self.local.write(*lba, data.clone(), *fua).await
                    }
                    Role::Leader | Role::Follower => {
                        self.undo
                            .write_keeping(&self.local, *copy, *lba, data.clone(), *fua)
                            .await
                    }
                    // the partner is lost (its copies are being or were
                    // undone): refused, as a request error, not a failure of
                    // this copy (which would detach it)
                    _ => Err(BlockError::NotSupported(
                        "a partner's copy write after its loss",
                    )),
                }
            }
            Op::Write { lba, fua, data }
            | Op::CopyWrite { lba, fua, data, .. }
            | Op::CompareAndWrite { lba, fua, data, .. } => {
                let write = self.local.write(*lba, data.clone(), *fua);
                self.undo
                    .write_over(*lba, data.len() as u64 / bs, write)
                    .await
            }
            Op::WriteZeroes {
                lba,
                blocks,
                may_unmap,
            } => {
                let write = self.local.write_zeroes(*lba, *blocks, *may_unmap);
                self.undo.write_over(*lba, *blocks, write).await
            }
            Op::Discard { lba, blocks } => {
                let write = self.local.discard(*lba, *blocks);
                self.undo.write_over(*lba, *blocks, write).await
            }
            Op::Flush => self.local.flush().await,
            Op::Grow { block_count } => self.grow_local(*block_count).await,
        }
    }

    /// After the partner's op was applied here: a grow is served from now on (the
    /// leader serves it once this answers).
    fn applied_from_partner(&self, op: &Op) {
        if let Op::Grow { block_count } = op {
            self.expose(*block_count);
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
        let bs = self.geo().block_size_bytes as u64;
        let link = st.link.as_ref();
        if let Op::Grow { block_count } = op {
            // this copy first, then the partner's, then served: no write reaches
            // the new blocks before both copies have them
            if let Err(e) = self.grow_local(*block_count).await {
                return Ok(Err(e));
            }
            // the partner's grow may take long (a pool zeroes its new
            // stripes): bounded by GROW_PATIENCE, not the four peer timeouts
            // of other requests, which broke the pair's link for a healthy
            // partner's slow grow (review of 2026-12-06)
            let remote = match (link, forwarded) {
                (Some(l), Some(fid)) => Some(
                    l.request_slow(GROW_PATIENCE, |id| Message::ApplyForwarded {
                        id,
                        forward_id: fid,
                    })
                    .await?,
                ),
                (Some(l), None) => Some(
                    l.request_slow(GROW_PATIENCE, |id| Message::Apply { id, op: op.clone() })
                        .await?,
                ),
                (None, _) => None,
            };
            return match remote {
                None | Some(OpResult::Ok) => {
                    self.expose(*block_count);
                    Ok(Ok(None))
                }
                Some(OpResult::Error { code, lba }) => Ok(Err(block_err_of(code, lba, "grow"))),
                Some(OpResult::Miscompare { .. }) => Ok(Err(BlockError::WriteFault { lba: 0 })),
            };
        }
        let Some((lba, blocks)) = span(op, bs) else {
            // flush: both copies at once, a forwarded one too (so that this
            // node knows when both are flushed: see `flushed`)
            let n = self.flush_begins();
            let remote = async {
                match link {
                    Some(l) => l
                        .request(|id| Message::Apply { id, op: Op::Flush })
                        .await
                        .map(Some),
                    None => Ok(None),
                }
            };
            let (lr, rr) = tokio::join!(self.local.flush(), remote);
            if let Err(e) = lr {
                // What this copy held since its last flush may be lost (Linux
                // drops the pages of a failed writeback), while the partner's
                // is durable: as the partner does with a flush of its own that
                // fails (`detach_on`), this copy is detached and the partner
                // goes on alone; it resyncs this one, whose bits since the last
                // good flush of both are still set. Kept in sync, a later good
                // flush of both let the cleaner clear them, and the copies
                // differed with nothing to say so (review of 2026-12-06).
                if copy_failed(&e)
                    && matches!(rr, Ok(Some(OpResult::Ok)))
                    && !st.peer_resyncing
                    && self.detach(format!("flush failed: {e}")).await
                {
                    return Ok(Ok(None));
                }
                return Ok(Err(e));
            }
            return match rr? {
                Some(OpResult::Ok) => {
                    self.flush_ended(n);
                    Ok(Ok(None))
                }
                None => Ok(Ok(None)),
                Some(OpResult::Error { code, lba }) => Ok(Err(block_err_of(code, lba, "flush"))),
                Some(OpResult::Miscompare { .. }) => Ok(Err(BlockError::WriteFault { lba: 0 })),
            };
        };
        // a forwarded op comes from the partner: checked before its range is used
        if let Err(e) = self.geo().check_range(lba, blocks) {
            return Ok(Err(e));
        }
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
        let (lr, rr) = tokio::join!(self.local_apply(op, forwarded.is_some()), remote);
        match (lr, rr) {
            (Err(e), Ok(Some(OpResult::Ok))) => {
                self.bitmap.pin(lba, blocks);
                // the partner holds the write and goes on alone; not while it is
                // a resync target (an incomplete copy that cannot serve: detaching
                // would leave no consistent copy, the write trapped on one that
                // never serves), then the write fails and the region stays pinned
                if copy_failed(&e)
                    && !st.peer_resyncing
                    && self.detach(format!("{e} at lba {lba}")).await
                {
                    return Ok(Ok(None));
                }
                tracing::error!(volume = %self.cfg.name, lba, "local write failed, partner's succeeded: region kept dirty");
                Ok(Err(e))
            }
            (Err(e), _) => {
                // failed here and perhaps there, perhaps half way on either
                // (a write cut short by the error): the region is copied again
                // at the next meeting
                self.bitmap.pin(lba, blocks);
                Ok(Err(e))
            }
            (Ok(()), Err(LinkLost)) => {
                // written here, perhaps not there: the region must be copied at
                // the next meeting whatever the bitmap's cleaner does before this
                // node leaves the in-sync state
                self.bitmap.pin(lba, blocks);
                Err(LinkLost)
            }
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
        // the entry goes when this ends, even if the caller drops it midway
        // (an aborted command): it holds the write's data
        struct Unlist<'a>(
            &'a Mutex<HashMap<ForwardKey, InFlightForward>>,
            Option<ForwardKey>,
        );
        impl Drop for Unlist<'_> {
            fn drop(&mut self) {
                if let Some(id) = self.1 {
                    self.0.lock().remove(&id);
                }
            }
        }
        let mut listed = Unlist(&self.forwards, None);
        let mut fid = forward_key(link, 0);
        let flush = matches!(op, Op::Flush).then(|| self.flush_begins());
        // a grow: the leader grows both copies before it answers
        let patience = match op {
            Op::Grow { .. } => GROW_PATIENCE,
            _ => link.request_patience(),
        };
        let r = link
            .request_slow(patience, |id| {
                fid = forward_key(link, id);
                listed.1 = Some(fid);
                self.forwards.lock().insert(
                    fid,
                    InFlightForward {
                        op: op.clone(),
                        applied: false,
                    },
                );
                Message::Forward { id, op: op.clone() }
            })
            .await;
        let entry = self.forwards.lock().remove(&fid);
        drop(listed);
        if matches!(r, Ok(OpResult::Ok))
            && !matches!(op, Op::Flush)
            && !entry.as_ref().is_some_and(|e| e.applied)
        {
            // the leader has every write applied here before it answers: an
            // answer without that would acknowledge data this copy lacks
            link.close("the partner acknowledged a forwarded write never applied here");
            return Err(false);
        }
        match r {
            Ok(OpResult::Ok) => {
                // (a flush: the leader had both copies flushed, this one too)
                if let Some(n) = flush {
                    self.flush_ended(n);
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
        let m = *self.meta.lock();
        if !m.consistent && m.partial {
            return Ok(());
        }
        // (a discarded copy, not consistent, is whole until its first change)
        self.update_meta(Meta::mark_partial).await
    }

    /// Handles one request from the partner.
    pub(crate) async fn handle(self: Arc<Self>, link: Arc<Link>, msg: Message) {
        // defence in depth (the link is authenticated): every message must fit
        // this node's role on this very link, or the link closes
        if let Some(why) = self.misplaced(&link, &msg) {
            tracing::warn!(volume = %self.cfg.name, why, "message from the partner refused");
            link.close(why);
            return;
        }
        if matches!(msg, Message::Apply { .. } | Message::ResyncData { .. })
            && self.role().role == Role::Target
        {
            if let Err(e) = self.target_changes().await {
                link.close(&format!("cannot persist resync state: {e}"));
                return;
            }
        }
        let (id, result) = match msg {
            Message::Apply { id, op } => match self.handle_apply(&op).await {
                Some(r) => (id, r),
                None => return,
            },
            Message::ApplyForwarded { id, forward_id } => {
                let key = forward_key(&link, forward_id);
                let op = self.forwards.lock().get(&key).map(|f| f.op.clone());
                let r = match op {
                    Some(op) => {
                        let r = self.local_apply(&op, false).await;
                        if r.is_ok() {
                            self.applied_from_partner(&op);
                            if let Some(f) = self.forwards.lock().get_mut(&key) {
                                f.applied = true;
                            }
                        }
                        match r {
                            Ok(()) => OpResult::Ok,
                            Err(e) => match self.detach_on(&op, &e).await {
                                true => return,
                                false => err_of(&e),
                            },
                        }
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
                // FUA: the regions' bits are cleared on both sides once this is
                // answered, and written out with the next page write; a copy
                // still in a volatile cache then would be lost with no bit left
                // to copy it again
                let r = match self.geo().blocks_in(data.len()) {
                    Ok(n) => match self.geo().check_range(lba, n) {
                        Ok(()) => self.local.write(lba, data.clone(), true).await,
                        Err(e) => Err(e),
                    },
                    Err(e) => Err(e),
                };
                match r {
                    Ok(()) => {
                        let bs = self.geo().block_size_bytes as u64;
                        let rb = self.bitmap.region_blocks();
                        let end = lba + data.len() as u64 / bs;
                        for reg in lba / rb..end.div_ceil(rb) {
                            self.bitmap.clear_region(reg);
                        }
                        (id, OpResult::Ok)
                    }
                    Err(e) => match self.write_failed(lba, data, &e).await {
                        Some(r) => (id, r),
                        None => return,
                    },
                }
            }
            Message::ResyncDone { id, gens } => (id, self.finish_as_target(&link, gens).await),
            Message::CopyEnd { id, copy } => {
                self.undo.end(copy);
                (id, OpResult::Ok)
            }
            Message::Repair { id, lba, blocks } => {
                (id, self.repair_partner(&link, lba, blocks).await)
            }
            Message::RepairData { id, lba, data } => match self.handle_repair_data(lba, data).await
            {
                Some(r) => (id, r),
                None => return,
            },
            Message::ReadCopy { id, lba, blocks } => {
                match self.read_for_partner(lba, blocks).await {
                    Ok(data) => {
                        let _ = link.send(Message::CopyData { id, data }).await;
                        return;
                    }
                    Err(e) => (id, err_of(&e)),
                }
            }
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

    /// Why `msg` may not be handled now (None: it may): resync data and its end
    /// only while this node is that link's resync target, the leader's ops only
    /// on the link this node follows, forwarded writes only while following
    /// (forwards themselves are checked at the leader where it orders them).
    fn misplaced(&self, link: &Arc<Link>, msg: &Message) -> Option<&'static str> {
        let st = self.role();
        let same = st.link.as_ref().is_some_and(|l| Arc::ptr_eq(l, link));
        match msg {
            Message::ResyncData { .. } | Message::ResyncDone { .. } => {
                (!(same && st.role == Role::Target)).then_some("resync data while not its target")
            }
            // (a follower that stopped following answers the op with an error)
            Message::Apply { .. } => (!same).then_some("the leader's op on a stale link"),
            Message::CopyEnd { .. } => (!same).then_some("a copy's end on a stale link"),
            Message::ApplyForwarded { .. } => (!(same && st.role == Role::Follower))
                .then_some("a forwarded write while not following"),
            // on this link but in another role (a node detaching its copy
            // is down before its Detach leaves): answered with an error, as a
            // forwarded write is, so the Detach still reaches the partner
            Message::Repair { .. } | Message::ReadCopy { .. } | Message::RepairData { .. } => {
                (!same).then_some("a repair on a stale link")
            }
            _ => None,
        }
    }

    /// Checks the range of a repair or a read of the partner's copy: inside
    /// the volume, and at most [`REPAIR_BYTES_MAX`] bytes.
    fn repair_range(&self, lba: u64, blocks: u64) -> BlockResult<()> {
        let bs = self.geo().block_size_bytes as u64;
        if blocks == 0 || blocks.saturating_mul(bs) > REPAIR_BYTES_MAX {
            return Err(BlockError::NotSupported(
                "a repair of no block or of more than 8 MiB",
            ));
        }
        self.geo().check_range(lba, blocks)
    }

    /// The follower's copy cannot read `[lba, lba + blocks)`: this leader
    /// writes the blocks of its own copy to it ([`Message::RepairData`]),
    /// holding the range's lock as any write of the range does (a failure
    /// there detaches the follower's copy, as a failed write does).
    async fn repair_partner(&self, link: &Arc<Link>, lba: u64, blocks: u64) -> OpResult {
        if let Err(e) = self.repair_range(lba, blocks) {
            return err_of(&e);
        }
        let st = self.role();
        if st.role != Role::Leader || st.peer_resyncing {
            return unavailable();
        }
        let _range = self
            .locks
            .lock(lba, lba + blocks, LockMode::Exclusive)
            .await;
        // pinned under the lock: a write that failed on one side there left
        // the copies different, and the follower's may be the newer
        if self.pinned_within(lba, blocks) {
            return unavailable();
        }
        let data = match self.local.read(lba, blocks as u32).await {
            Ok(d) => d,
            Err(e) => return err_of(&e),
        };
        match link
            .request(|id| Message::RepairData { id, lba, data })
            .await
        {
            Ok(OpResult::Ok) => {
                tracing::warn!(volume = %self.cfg.name, lba, blocks,
                    "the partner's copy could not read these blocks: written to it from this copy");
                OpResult::Ok
            }
            // the partner could not write them: said as a write fault, so it
            // is never taken for this copy being unable to read them
            Ok(OpResult::Error { lba: at, .. }) => OpResult::Error {
                code: error_codes::WRITE_FAULT,
                lba: at,
            },
            Ok(r) => r,
            Err(LinkLost) => unavailable(),
        }
    }

    /// The leader's repair of this follower's copy: `data` is what the copy
    /// holds logically, so it is written without touching what is kept to
    /// undo an unfinished copy of the leader's (`write_over` would forget
    /// those blocks), but inside the undo's gate. None when the copy failed
    /// under it and was detached.
    async fn handle_repair_data(&self, lba: u64, data: Bytes) -> Option<OpResult> {
        if self.role().role != Role::Follower {
            return Some(unavailable());
        }
        let checked = self
            .geo()
            .blocks_in(data.len())
            .and_then(|n| self.repair_range(lba, n));
        if let Err(e) = checked {
            return Some(err_of(&e));
        }
        let r = {
            let _g = self.undo.hold().await;
            self.local.write(lba, data.clone(), false).await
        };
        match r {
            Ok(()) => {
                self.repaired_blocks.fetch_add(
                    data.len() as u64 / self.geo().block_size_bytes as u64,
                    Ordering::Relaxed,
                );
                Some(OpResult::Ok)
            }
            Err(e) => self.write_failed(lba, data, &e).await,
        }
    }

    /// The partner's blocks `data` at `lba` could not be written here (`e`):
    /// the copy is detached if it failed (None: no answer), else the error
    /// to answer.
    async fn write_failed(&self, lba: u64, data: Bytes, e: &BlockError) -> Option<OpResult> {
        let op = Op::Write {
            lba,
            fua: false,
            data,
        };
        if self.detach_on(&op, e).await {
            return None;
        }
        Some(err_of(e))
    }

    /// The partner's copy cannot read `[lba, lba + blocks)`: this copy's
    /// blocks (a leader asking holds their range: no write of theirs is in
    /// flight; a follower asking serves a read with them, as any read that
    /// meets writes in flight).
    async fn read_for_partner(&self, lba: u64, blocks: u64) -> BlockResult<Bytes> {
        if !matches!(self.role().role, Role::Follower | Role::Leader) {
            return Err(BlockError::Unavailable("not serving in sync".into()));
        }
        self.repair_range(lba, blocks)?;
        self.local.read(lba, blocks as u32).await
    }

    /// This copy could not read `[lba, lba + blocks)` (`e`, a medium error:
    /// a pool's lost blocks, a disk's bad sector). While the partner is in
    /// sync and takes repairs, its copy stands in, and this copy is written
    /// with it (which makes a pool's lost blocks good again): a leader reads
    /// the partner's blocks holding the range's lock and writes them here; a
    /// follower asks the leader to write them here, as any write of the pair,
    /// and reads again. A read of more than one repair's worth
    /// ([`REPAIR_BYTES_MAX`]) is read again and repaired in pieces. A piece
    /// the partner answers it cannot read either (both copies have
    /// unreadable blocks there, different ones) is halved, each half read
    /// here again and repaired if it must be, down to single blocks: the
    /// read fails at the first block neither copy can read. A repair refused
    /// for any other reason (the partner gone, a pinned region, a refusal)
    /// ends the read with this copy's error at once.
    pub(crate) async fn read_repair(
        self: &Arc<Self>,
        lba: u64,
        blocks: u32,
        e: BlockError,
    ) -> BlockResult<Bytes> {
        let st = self.role();
        if st.link.is_none()
            || st.peer_resyncing
            || !self.partner_repairs.load(Ordering::SeqCst)
            || !matches!(st.role, Role::Leader | Role::Follower)
        {
            return Err(e);
        }
        let bs = self.geo().block_size_bytes as u64;
        let piece = (REPAIR_BYTES_MAX / bs).max(1);
        let (n, end) = (blocks as u64, lba + blocks as u64);
        // what is left to read, first ones last (popped first)
        let mut todo: Vec<(u64, u64)> = Vec::new();
        let halves = |todo: &mut Vec<(u64, u64)>, at: u64, n: u64| {
            let half = n / 2;
            todo.push((at + half, n - half));
            todo.push((at, half));
        };
        if n <= piece {
            // one piece: its error is known
            match self.repair_piece(lba, blocks, e).await {
                Ok(data) => return Ok(data),
                Err((_, true)) if n > 1 => halves(&mut todo, lba, n),
                Err((pe, _)) => return Err(pe),
            }
        } else {
            let mut at = lba;
            while at < end {
                let k = piece.min(end - at);
                todo.push((at, k));
                at += k;
            }
            todo.reverse();
        }
        let mut out = bytes::BytesMut::with_capacity((n * bs) as usize);
        while let Some((at, k)) = todo.pop() {
            // (pieces are taken in order: each goes at the end)
            debug_assert_eq!(out.len() as u64, (at - lba) * bs);
            let data = match self.local.read(at, k as u32).await {
                Ok(data) => data,
                Err(pe @ BlockError::Medium { .. }) => {
                    match self.repair_piece(at, k as u32, pe).await {
                        Ok(data) => data,
                        Err((_, true)) if k > 1 => {
                            halves(&mut todo, at, k);
                            continue;
                        }
                        Err((pe, _)) => return Err(pe),
                    }
                }
                Err(other) => return Err(other),
            };
            if data.len() as u64 != k * bs {
                return Err(BlockError::Unavailable(format!(
                    "a read of {k} blocks at lba {at} returned {} bytes",
                    data.len()
                )));
            }
            out.extend_from_slice(&data);
        }
        Ok(out.freeze())
    }

    /// [`Inner::read_repair`] of at most [`REPAIR_BYTES_MAX`] bytes: the
    /// blocks, or `e` (or the error of a read again) and whether the partner
    /// answered that it cannot read them either.
    async fn repair_piece(
        self: &Arc<Self>,
        lba: u64,
        blocks: u32,
        e: BlockError,
    ) -> Result<Bytes, (BlockError, bool)> {
        let n = blocks as u64;
        let st = self.role();
        let Some(link) = st.link.clone() else {
            return Err((e, false));
        };
        if st.peer_resyncing
            || !self.partner_repairs.load(Ordering::SeqCst)
            || self.repair_range(lba, n).is_err()
            || self.pinned_within(lba, n)
        {
            return Err((e, false));
        }
        let cannot_read = |r: &OpResult| matches!(r, OpResult::Error { code, .. } if *code == error_codes::MEDIUM);
        match st.role {
            // in a task of its own: dropped half way (an aborted command),
            // the range's lock would go while the write to this copy still
            // ran, and a newer write of the pair could land under it
            Role::Leader => {
                let inner = self.clone();
                let task = tokio::spawn(async move { inner.repair_here(&link, lba, n).await });
                match task.await {
                    Ok(Ok(data)) => Ok(data),
                    Ok(Err(partner_cannot)) => Err((e, partner_cannot)),
                    Err(_) => Err((e, false)),
                }
            }
            Role::Follower => match link
                .request(|id| Message::Repair { id, lba, blocks: n })
                .await
            {
                Ok(OpResult::Ok) => {
                    tracing::warn!(volume = %self.cfg.name, lba, blocks,
                        "blocks this copy could not read were written to it from the leader's");
                    match self.local.read(lba, blocks).await {
                        // a disk that still cannot read what it was written
                        // (no sector left to remap to): the leader's blocks
                        // serve this read; the copy stays as it is
                        Err(again @ BlockError::Medium { .. }) => {
                            let bs = self.geo().block_size_bytes as u64;
                            match link.read_copy(lba, n, bs).await {
                                Ok(Ok(data)) => Ok(data),
                                Ok(Err(r)) => Err((again, cannot_read(&r))),
                                Err(LinkLost) => Err((again, false)),
                            }
                        }
                        r => r.map_err(|e| (e, false)),
                    }
                }
                other => {
                    tracing::warn!(volume = %self.cfg.name, lba, answer = ?other.as_ref().ok(),
                        "the leader could not repair blocks this copy cannot read");
                    let partner_cannot = other.as_ref().is_ok_and(cannot_read);
                    Err((e, partner_cannot))
                }
            },
            _ => Err((e, false)),
        }
    }

    /// Whether a region of `[lba, lba + blocks)` is pinned: a write failed on
    /// one side there, and the copies are known to differ.
    fn pinned_within(&self, lba: u64, blocks: u64) -> bool {
        let rb = self.bitmap.region_blocks();
        let (first, end) = (lba / rb, (lba + blocks).div_ceil(rb));
        self.bitmap
            .pinned_regions()
            .iter()
            .any(|r| (first..end).contains(r))
    }

    /// The leader's part of [`Inner::read_repair`]: holding the range's lock,
    /// the follower's blocks, written to this copy while the pair is still
    /// joined on `link` (inside the undo's gate: after the link's loss, an
    /// undo of the follower's copies may be putting blocks back). When they
    /// cannot be had, whether the follower answered that its copy cannot
    /// read them either.
    async fn repair_here(&self, link: &Arc<Link>, lba: u64, n: u64) -> Result<Bytes, bool> {
        let bs = self.geo().block_size_bytes as u64;
        let _range = self.locks.lock(lba, lba + n, LockMode::Exclusive).await;
        // (again under the lock: a write failing on one side may have pinned
        // a region since the first look)
        if self.pinned_within(lba, n) {
            return Err(false);
        }
        let data = match link.read_copy(lba, n, bs).await {
            Ok(Ok(data)) => data,
            other => {
                tracing::warn!(volume = %self.cfg.name, lba, answer = ?other.as_ref().ok(),
                    "the partner's copy could not stand in for blocks this copy cannot read");
                let cannot = matches!(other, Ok(Err(OpResult::Error { code, .. })) if code == error_codes::MEDIUM);
                return Err(cannot);
            }
        };
        let gate = self.undo.hold().await;
        let st = self.role();
        let joined = st.role == Role::Leader
            && st.link.as_ref().is_some_and(|l| Arc::ptr_eq(l, link))
            && !link.is_closed_now();
        if !joined {
            return Err(false);
        }
        let written = self.local.write(lba, data.clone(), false).await;
        drop(gate);
        match written {
            Ok(()) => {
                self.repaired_blocks.fetch_add(n, Ordering::Relaxed);
                tracing::warn!(volume = %self.cfg.name, lba, blocks = n,
                    "blocks this copy could not read were read from the partner's and written here");
            }
            // this copy cannot take a write of blocks the partner holds: as
            // under any write of the pair, the region is pinned and the copy
            // detached (the partner goes on alone and resyncs it later); the
            // read is still served with the partner's blocks (a copy served
            // read-only is left alone: it takes no write by design)
            Err(we) if copy_failed(&we) && !matches!(we, BlockError::ReadOnly) => {
                self.bitmap.pin(lba, n);
                if !self
                    .detach(format!("{we} at lba {lba}, repairing it"))
                    .await
                {
                    tracing::error!(volume = %self.cfg.name, lba, error = %we,
                        "blocks read from the partner's copy could not be written to this one, nor the copy detached");
                }
            }
            Err(we) => {
                tracing::warn!(volume = %self.cfg.name, lba, error = %we,
                    "blocks read from the partner's copy could not be written to this one");
            }
        }
        Ok(data)
    }

    /// Applies the leader's op; None when this node's copy failed under it and
    /// was detached (the partner learns it from [`Message::Detach`]; no answer).
    async fn handle_apply(&self, op: &Op) -> Option<OpResult> {
        let st = self.role();
        if !matches!(st.role, Role::Follower | Role::Target) {
            return Some(OpResult::Error {
                code: error_codes::UNAVAILABLE,
                lba: 0,
            });
        }
        match self.local_apply(op, true).await {
            Ok(()) => {
                self.applied_from_partner(op);
                Some(OpResult::Ok)
            }
            Err(e) if self.detach_on(op, &e).await => None,
            Err(e) => Some(err_of(&e)),
        }
    }

    /// The partner's write `op` failed here with `e`: if the copy failed (not a
    /// request error), the region is pinned and the copy detached. True if so.
    async fn detach_on(&self, op: &Op, e: &BlockError) -> bool {
        if !copy_failed(e) {
            return false;
        }
        let bs = self.geo().block_size_bytes as u64;
        let at = span(op, bs);
        if let Some((lba, blocks)) = at {
            self.bitmap.pin(lba, blocks);
        }
        let lba = at.map_or(0, |(l, _)| l);
        self.detach(format!("{e} at lba {lba}")).await
    }

    async fn finish_as_target(
        &self,
        link: &Arc<Link>,
        gens: replica_proto::Generations,
    ) -> OpResult {
        if let Err(e) = self.local.flush().await {
            return err_of(&e);
        }
        let _one = self.meta_write.lock().await;
        if self.role().role != Role::Target {
            // detached by a failed write of the resync (`detach`): the copy
            // is not whole, whatever the partner copied
            return OpResult::Error {
                code: error_codes::UNAVAILABLE,
                lba: 0,
            };
        }
        let m = Meta {
            current: gens.current,
            synced: gens.synced,
            consistent: true,
            target_from: 0,
            partial: false,
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
        check_names(&cfg.cluster, &cfg.name)
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
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
            reason: Arc::from("starting: waiting for the partner"),
        });
        let (ports_tx, _) = watch::channel(PortStates {
            local: PathState::Unavailable,
            peer: PathState::Unavailable,
        });
        bitmap.set_keep(true);
        let undo = crate::undo::CopyUndo::new(&cfg.state_dir, geo.block_size_bytes as u64);
        let witness_seq = crate::meta::SeqFile::open(&cfg.state_dir)?;
        let inner = Arc::new(Inner {
            cfg,
            local,
            geo_at_open: geo,
            block_count: AtomicU64::new(geo.block_count),
            meta_file,
            meta: Mutex::new(meta),
            undo,
            bitmap,
            locks: RangeLocks::default(),
            role_tx,
            forwards: Mutex::new(HashMap::new()),
            solo_writes: block::inflight::InFlight::new(),
            detaches: AtomicU64::new(0),
            operator_changes: AtomicU64::new(0),
            partner_seen: Mutex::new(PartnerSeen::NotMet),
            meetings: AtomicU64::new(0),
            flushes_begun: AtomicU64::new(0),
            flushes_covered: AtomicU64::new(0),
            copies: Mutex::new(HashMap::new()),
            resync_total: AtomicU64::new(0),
            resync_done: AtomicU64::new(0),
            resynced_bytes: AtomicU64::new(0),
            witness_state: AtomicU8::new(0),
            witness_seq: tokio::sync::Mutex::new(witness_seq),
            history: Mutex::new(RoleHistory::default()),
            stop_tx: watch::channel(false).0,
            meta_write: tokio::sync::Mutex::new(()),
            meeting: tokio::sync::Mutex::new(()),
            scsi_peer: parking_lot::RwLock::new(None),
            partner_repairs: std::sync::atomic::AtomicBool::new(false),
            partner_timeout: AtomicU64::new(0),
            repaired_blocks: AtomicU64::new(0),
            access_mismatch: Mutex::new(None),
            monitor: parking_lot::RwLock::new(None),
            client_monitor: parking_lot::RwLock::new(None),
            ports_tx,
        });
        let (tx, rx) = mpsc::channel(4);
        tokio::spawn(crate::session::manager(inner.clone(), rx));
        tokio::spawn(crate::session::cleaner(Arc::downgrade(&inner)));
        if inner.cfg.witness.is_some() {
            tokio::spawn(crate::session::witness_keeper(Arc::downgrade(&inner)));
        }
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
        let _meeting = i.between_meetings("discarded").await?;
        // no generation, and never a source: even against a partner as new
        // as it, the partner's data is what gets copied (see plan::resume);
        // a copy changed in part stays so (`keep_copy`; a consistent one is
        // whole, whatever an older meta file said)
        let _one = i.meta_write.lock().await;
        let m = *i.meta.lock();
        let partial = m.partial && !m.consistent;
        i.store_meta(Meta {
            consistent: false,
            partial,
            ..Meta::fresh()
        })
        .map_err(|e| e.to_string())?;
        tracing::warn!(volume = %i.cfg.name, "this node's copy was discarded: the partner will copy it in full");
        i.set_role(
            Role::Down,
            None,
            false,
            "copy discarded: waiting for the partner to copy its data here".into(),
        );
        Ok(())
    }

    /// Keeps THIS node's copy when both copies were discarded (the wrong
    /// node's too), which nothing else joins: `plan` refuses two copies that
    /// are not consistent. The copy becomes a consistent copy of a new
    /// generation that wrote alone, so it is the source of a full copy for
    /// the partner, and may serve alone as any consistent copy may.
    ///
    /// Only a copy that is down, not consistent, and whole can be kept (a
    /// copy discarded from a consistent state and not changed since: not one
    /// a resync wrote into, nor one that failed under a write, `Meta::partial`),
    /// and only while the partner's copy, at the nodes' last meeting since
    /// this node started, was not consistent either: a partner that may be
    /// serving alone must never meet a second writer.
    pub async fn keep_copy(&self) -> Result<(), String> {
        let i = &self.inner;
        let _meeting = i.between_meetings("kept").await?;
        let _one = i.meta_write.lock().await;
        let meta = *i.meta.lock();
        if meta.consistent {
            return Err(
                "this node's copy is consistent: there is nothing to keep (to give up the \
                 partner's lone writes after a split brain, discard the partner's copy)"
                    .into(),
            );
        }
        if meta.partial {
            return Err(
                "this node's copy was changed by a resync, or failed under a write, since it \
                 was last consistent: it may lack acknowledged data, so it cannot be kept \
                 (keep the partner's copy if it is whole)"
                    .into(),
            );
        }
        if *i.partner_seen.lock() != PartnerSeen::NotConsistent {
            return Err(
                "the partner's copy has not been seen not consistent since this node started \
                 (it may be serving): keep is for copies both discarded, and needs the nodes \
                 to have met and refused each other"
                    .into(),
            );
        }
        let fresh = Meta::new_generation(meta.current);
        // solo (current != synced): never taken for a copy the partner holds too
        i.store_meta(Meta {
            current: fresh,
            synced: 0,
            consistent: true,
            target_from: 0,
            partial: false,
        })
        .map_err(|e| e.to_string())?;
        tracing::warn!(volume = %i.cfg.name, generation = %format!("{fresh:#x}"),
            "this node's copy was kept by the operator: it is the source for the partner");
        i.set_role(
            Role::Down,
            None,
            false,
            "copy kept: it is the source for the partner, or serves alone if allowed".into(),
        );
        // then the connection manager judges afresh
        i.operator_changes.fetch_add(1, Ordering::AcqRel);
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

    /// Lets the volume see the heartbeats with the partner over the client-facing
    /// networks: in its status, and in the reason it gives when it stops after
    /// losing the partner (a sync link failure when the partner still answers there).
    pub fn set_client_link_monitor(&self, m: Arc<crate::monitor::SyncLinkMonitor>) {
        *self.inner.client_monitor.write() = Some(m);
    }

    /// Uses `m`'s heartbeats on the sync links (status, and which link to dial).
    pub fn set_link_monitor(&self, m: Arc<crate::monitor::SyncLinkMonitor>) {
        *self.inner.monitor.write() = Some(m);
    }

    /// Installs the SCSI layer's handler of the partner's requests.
    pub fn set_scsi_peer(&self, peer: Arc<dyn ScsiPeer>) {
        *self.inner.scsi_peer.write() = Some(peer);
    }

    /// Records what the SCSI layer found when it compared who may reach the
    /// volume's LUN on both nodes (None: they agree); shown in the status.
    /// Returns the finding it replaces.
    pub fn set_access_mismatch(&self, why: Option<String>) -> Option<String> {
        std::mem::replace(&mut *self.inner.access_mismatch.lock(), why)
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
        let history = *i.history.lock();
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
            reason: st.reason.to_string(),
            peer: st.link.as_ref().map(|l| l.peer.clone()),
            state,
            resync_regions_total: i.resync_total.load(Ordering::Relaxed),
            resync_regions_done: i.resync_done.load(Ordering::Relaxed),
            resynced_bytes: i.resynced_bytes.load(Ordering::Relaxed),
            dirty_regions: i.bitmap.count(),
            region_bytes: i.cfg.region_bytes,
            size_bytes: i.geo().size_bytes(),
            generation: format!("{:016x}/{:016x}", meta.current, meta.synced),
            consistent: meta.consistent,
            partial: meta.partial && !meta.consistent,
            witness: i.cfg.witness.map(|w| w.to_string()),
            witness_reachable: match i.witness_state.load(Ordering::Relaxed) {
                1 => Some(true),
                2 => Some(false),
                _ => None,
            },
            role_changes: history.changes,
            role_changed_ms: history.changed_ms,
            failovers: history.failovers,
            last_failover_ms: history.failover_ms,
            partner_copies_open: i.undo.open_copies(),
            local_paths: ports.local,
            peer_paths: ports.peer,
            sync_links: i
                .monitor
                .read()
                .as_ref()
                .map_or_else(Vec::new, |m| m.links()),
            client_links: i
                .client_monitor
                .read()
                .as_ref()
                .map_or_else(Vec::new, |m| m.links()),
            access_mismatch: i.access_mismatch.lock().clone(),
            repaired_blocks: i.repaired_blocks.load(Ordering::Relaxed),
        }
    }
}

#[async_trait]
impl Volume for ReplicatedVolume {
    fn geometry(&self) -> Geometry {
        self.inner.geo()
    }

    /// Grows both copies: ordered like a write (a follower has the leader run it),
    /// each node grows its local volume and its bitmap, and the new size is served
    /// once both copies have it (or, the partner away, once this one has: the
    /// partner grows its copy to match when it comes back, before the resync).
    async fn grow(&self, block_count: u64) -> BlockResult<()> {
        let now = self.inner.geo().block_count;
        if block_count < now {
            return Err(BlockError::NotSupported("shrinking a volume"));
        }
        if block_count == now {
            return Ok(());
        }
        self.inner
            .submit(Op::Grow { block_count })
            .await
            .map(|_| ())
    }

    async fn read(&self, lba: u64, blocks: u32) -> BlockResult<Bytes> {
        self.inner.geo().check_range(lba, blocks as u64)?;
        self.inner.wait_serving(self.inner.deadline()).await?;
        match self.inner.local.read(lba, blocks).await {
            Err(e @ BlockError::Medium { .. }) => self.inner.read_repair(lba, blocks, e).await,
            r => r,
        }
    }

    async fn write(&self, lba: u64, data: Bytes, fua: bool) -> BlockResult<()> {
        let blocks = self.inner.geo().blocks_in(data.len())?;
        self.inner.geo().check_range(lba, blocks)?;
        self.inner
            .submit(Op::Write { lba, fua, data })
            .await
            .map(|_| ())
    }

    async fn flush(&self) -> BlockResult<()> {
        self.inner.submit(Op::Flush).await.map(|_| ())
    }

    async fn discard(&self, lba: u64, blocks: u64) -> BlockResult<()> {
        self.inner.geo().check_range(lba, blocks)?;
        self.inner
            .submit(Op::Discard { lba, blocks })
            .await
            .map(|_| ())
    }

    async fn write_zeroes(&self, lba: u64, blocks: u64, may_unmap: bool) -> BlockResult<()> {
        self.inner.geo().check_range(lba, blocks)?;
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
        let blocks = self.inner.geo().blocks_in(compare.len())?;
        self.inner.geo().check_range(lba, blocks)?;
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

    /// A copy's write: the partner keeps what it overwrites until
    /// [`Volume::copy_end`], and puts that back if it goes on alone before
    /// (`undo.rs`), so a copy cut short by this node's loss is undone there.
    /// A copy the pair meets again during (a handshake after a lost link)
    /// fails: the partner may have undone its first writes at that meeting.
    async fn write_copy(&self, copy: u64, lba: u64, data: Bytes, fua: bool) -> BlockResult<()> {
        let blocks = self.inner.geo().blocks_in(data.len())?;
        self.inner.geo().check_range(lba, blocks)?;
        let i = &self.inner;
        let now = i.meetings.load(Ordering::Acquire);
        let first = *i.copies.lock().entry(copy).or_insert(now);
        if first != now {
            return Err(met_again(&i.cfg.name));
        }
        i.submit(Op::CopyWrite {
            copy,
            lba,
            fua,
            data,
        })
        .await?;
        if i.meetings.load(Ordering::Acquire) != first {
            return Err(met_again(&i.cfg.name));
        }
        Ok(())
    }

    async fn copy_end(&self, copy: u64) -> BlockResult<()> {
        let i = &self.inner;
        let first = i.copies.lock().remove(&copy);
        i.end_copy(copy).await?;
        match first {
            Some(m) if m != i.meetings.load(Ordering::Acquire) => Err(met_again(&i.cfg.name)),
            _ => Ok(()),
        }
    }

    async fn block_status(&self, lba: u64, blocks: u64) -> BlockResult<Vec<block::Extent>> {
        self.inner.wait_serving(self.inner.deadline()).await?;
        self.inner.local.block_status(lba, blocks).await
    }
}
