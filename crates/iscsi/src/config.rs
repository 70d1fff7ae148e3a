//! What the binary hands the target: portals, targets, authentication, limits.

use std::net::SocketAddr;
use std::sync::Arc;

/// A CHAP user name and secret.
#[derive(Clone, PartialEq, Eq)]
pub struct ChapSecret {
    /// CHAP name.
    pub user: String,
    /// Shared secret (RFC 7143 asks for at least 12 bytes).
    pub secret: String,
}

impl std::fmt::Debug for ChapSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChapSecret")
            .field("user", &self.user)
            .finish_non_exhaustive()
    }
}

/// Authentication of a target or of discovery sessions.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Auth {
    /// When set the initiator must log in with CHAP using these credentials
    /// (unless its name is listed in `per_initiator`).
    pub chap: Option<ChapSecret>,
    /// When set the target proves itself with these if the initiator asks (mutual CHAP).
    pub mutual: Option<ChapSecret>,
    /// CHAP credentials per initiator name (targets only; ignored for discovery):
    /// a listed initiator must use its own, and a non-empty list makes CHAP required.
    pub per_initiator: Vec<(String, ChapSecret)>,
    /// Refuse CHAP with MD5 or SHA-1: initiators must offer SHA-256 or
    /// SHA3-256 (CHAP_A=7, 8).
    pub refuse_md5: bool,
}

/// One iSCSI target: a name and the SCSI device behind it.
#[derive(Clone)]
pub struct TargetSpec {
    /// Target IQN.
    pub iqn: String,
    /// TargetAlias.
    pub alias: Option<String>,
    /// The SCSI target device executing its commands.
    pub scsi: Arc<scsi::ScsiTarget>,
    /// Who must authenticate how.
    pub auth: Auth,
    /// Initiator names allowed to see and log in to the target; empty allows all.
    pub allowed_initiators: Vec<String>,
}

/// A listening address. Every portal serves every target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Portal {
    /// Address to listen on (port 0 picks one).
    pub addr: SocketAddr,
    /// Target portal group tag; also the SCSI relative target port id of this portal.
    pub tpgt: u16,
}

/// Bounds on everything the target holds for initiators.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// Most normal sessions at once (discovery sessions have their own caps).
    pub sessions_max: usize,
    /// Most normal sessions from one source address, so that one host never
    /// takes every session from the others.
    pub sessions_per_source_max: usize,
    /// Most discovery sessions at once; when all are used, the oldest of the
    /// source holding the most is closed for a new one.
    pub discovery_sessions_max: usize,
    /// Most discovery sessions from one source address; a new one closes that
    /// source's oldest.
    pub discovery_sessions_per_source_max: usize,
    /// Most connections still in login at once (not counted as sessions); when
    /// all are used the source holding the most gives up its oldest idle one.
    pub logins_in_progress_max: usize,
    /// Most connections in login from one source address; a new one replaces
    /// that source's oldest idle (else oldest) connection in login.
    pub logins_in_progress_per_source_max: usize,
    /// A new connection must send its first whole Login Request within this time.
    pub login_first_pdu_timeout_ms: u64,
    /// Failed authentications from one source address, within
    /// `auth_failure_window_ms`, after which that address is locked out.
    pub auth_failures_per_source_max: u32,
    /// Period over which failed authentications are counted.
    pub auth_failure_window_ms: u64,
    /// How long a locked-out source's connections are closed at once.
    pub auth_lockout_ms: u64,
    /// Most source addresses whose failures are remembered.
    pub auth_failure_sources_max: usize,
    /// CmdSN window: most non-immediate commands in flight per session.
    pub commands_in_flight_per_session_max: u32,
    /// MaxRecvDataSegmentLength the target declares.
    pub max_recv_data_segment_bytes: u32,
    /// Largest MaxBurstLength accepted.
    pub max_burst_bytes: u32,
    /// Largest FirstBurstLength accepted.
    pub first_burst_bytes: u32,
    /// Largest MaxOutstandingR2T accepted.
    pub max_outstanding_r2t: u32,
    /// Largest Expected Data Transfer Length of one command.
    pub max_transfer_bytes: u32,
    /// Most Data-Out bytes buffered per session for commands still receiving data.
    pub data_out_buffered_bytes_max_per_session: usize,
    /// Offer InitialR2T=Yes (no unsolicited Data-Out).
    pub initial_r2t: bool,
    /// Accept ImmediateData.
    pub immediate_data: bool,
    /// Idle time after which the target pings with a NOP-In.
    pub nop_in_interval_ms: u64,
    /// Time without an answer to a ping after which the connection is dropped;
    /// also the longest time a connection may take none of the data queued for
    /// it (a client that stopped reading is dropped and the buffers it held go
    /// back to the node's budget), and the longest a write may wait for Data-Out
    /// with none coming (the connection is dropped: its bytes were taken from
    /// the node's budget when it arrived). 0 turns all three off.
    pub nop_in_timeout_ms: u64,
    /// Longest login phase.
    pub login_timeout_ms: u64,
    /// How long logout and shutdown wait for running commands before aborting them.
    pub drain_timeout_ms: u64,
    /// PDUs queued to one connection's writer.
    pub writer_queue_pdus: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            sessions_max: 256,
            sessions_per_source_max: 64,
            discovery_sessions_max: 32,
            discovery_sessions_per_source_max: 4,
            logins_in_progress_max: 128,
            logins_in_progress_per_source_max: 8,
            login_first_pdu_timeout_ms: 2_000,
            auth_failures_per_source_max: 5,
            auth_failure_window_ms: 60_000,
            auth_lockout_ms: 60_000,
            auth_failure_sources_max: 4096,
            commands_in_flight_per_session_max: 128,
            max_recv_data_segment_bytes: 256 * 1024,
            max_burst_bytes: 1024 * 1024,
            first_burst_bytes: 256 * 1024,
            max_outstanding_r2t: 4,
            max_transfer_bytes: 16 * 1024 * 1024,
            data_out_buffered_bytes_max_per_session: 64 * 1024 * 1024,
            initial_r2t: false,
            immediate_data: true,
            nop_in_interval_ms: 5_000,
            nop_in_timeout_ms: 15_000,
            login_timeout_ms: 15_000,
            drain_timeout_ms: 5_000,
            writer_queue_pdus: 1024,
        }
    }
}

/// The whole target configuration.
#[derive(Clone)]
pub struct ServerConfig {
    /// Listening portals.
    pub portals: Vec<Portal>,
    /// Portals of the HA partner that serve the same targets: SendTargets lists
    /// them after this node's own, so initiators find every path of the pair.
    pub partner_portals: Vec<Portal>,
    /// Targets served on every portal.
    pub targets: Vec<TargetSpec>,
    /// Authentication required for discovery sessions.
    pub discovery_auth: Auth,
    /// Limits.
    pub limits: Limits,
    /// The node's budget of buffered data bytes, shared with its other frontends:
    /// read data waiting for the initiator and Data-Out waiting to be applied
    /// hold it (see `conn.rs` for how waiting for it cannot deadlock).
    pub buffers: block::BufferBudget,
}
