//! The SCSI block command set (SPC-4 / SBC-3) over a [`block::Volume`].
//!
//! A [`ScsiTarget`] holds the logical units of one SCSI target device and executes
//! decoded commands for any transport (iSCSI today): it decodes CDBs, moves data
//! to and from the volume, keeps per-LUN state (mode pages, unit attentions,
//! SPC-2 and persistent reservations, ALUA) and answers with a status, sense data
//! and Data-In bytes.
//!
//! What it does not do: any transport work. The transport gathers all Data-Out
//! bytes before calling [`ScsiTarget::execute`], truncates Data-In to what the
//! initiator allowed, computes residuals from [`Response::transfer_len_bytes`],
//! and handles task management by calling the reset/abort entry points here.
//!
//! Key invariant: a command that completes with GOOD status after writing has made
//! its data as durable as the LUN's write-cache setting promises (FUA, WCE=0 and
//! SYNCHRONIZE CACHE all reach stable storage before the answer).
//!
//! Layout: `target` (dispatch, order of checks, task management), `lu` (per-LU state,
//! result types, block error mapping), `cdb` (decode helpers), `rw` (read/write,
//! verify, COMPARE AND WRITE, ORWRITE, PRE-FETCH, SYNCHRONIZE CACHE), `provisioning`
//! (WRITE SAME, UNMAP), `sanitize` (SANITIZE: overwrite, block erase, failure mode,
//! resumed after a restart), `copy` (EXTENDED COPY, RECEIVE COPY RESULTS), `odx` (POPULATE
//! TOKEN, WRITE USING TOKEN, RECEIVE ROD TOKEN INFORMATION: Windows ODX), `capacity`
//! (READ CAPACITY, GET LBA STATUS), `inquiry` (standard data, VPD pages, block limits),
//! `mode` (MODE SENSE/SELECT), `opcodes` (REPORT SUPPORTED OPERATION CODES / TMFs),
//! `alua` (port group states, implicit and explicit: RTPG, SET TARGET PORT GROUPS),
//! `masking` (host groups: who sees which LUs), `ua` (unit attention queues), `admin`
//! (REQUEST SENSE, REPORT LUNS, START STOP, PREVENT ALLOW, reservation routing), `pr`
//! (reservations), `replication` (persistent reservations and explicit ALUA states
//! kept identical on the two nodes of an HA pair), `sense` (sense data), `statefile` (per-LUN state files
//! written atomically).

mod admin;
mod alua;
mod capacity;
pub mod cdb;
mod copy;
mod copy_resume;
mod inquiry;
mod lu;
mod masking;
mod mode;
mod odx;
mod opcodes;
pub mod pr;
mod provisioning;
mod replication;
mod rw;
mod sanitize;
pub mod sense;
mod statefile;
pub mod stats;
mod target;
#[cfg(test)]
mod tests;
mod thin;
mod ua;

pub use admin::encode_lun;
pub use block::detach::{in_flight, InFlight};
pub use copy::CopyReach;
pub use copy_resume::copy_records;
pub use inquiry::{Limits, CAW_BLOCKS_MAX, UNMAP_BLOCKS_MAX, UNMAP_DESCRIPTORS_MAX};
pub use masking::{check_host_groups, HostGroup};
pub use replication::{PrReplication, ResetKind, TaskAbort};
pub use stats::{Direction, LuStats};
pub use target::ScsiTarget;
pub use thin::{LuEvent, CHECK_BYTES as THIN_CHECK_BYTES};
pub use ua::UA_QUEUE_DEPTH_MAX;

use block::{Bytes, VolumeRef};
use std::path::PathBuf;
use std::sync::Arc;

/// SCSI status codes used in responses.
pub mod status {
    /// Command completed.
    pub const GOOD: u8 = 0x00;
    /// Sense data describes an error.
    pub const CHECK_CONDITION: u8 = 0x02;
    /// COMPARE AND WRITE miscompare uses CHECK CONDITION; this one is for conflicts.
    pub const RESERVATION_CONFLICT: u8 = 0x18;
    /// The LUN cannot accept the command now.
    pub const BUSY: u8 = 0x08;
    /// The task set is full.
    pub const TASK_SET_FULL: u8 = 0x28;
    /// The command was aborted by another I_T nexus.
    pub const TASK_ABORTED: u8 = 0x40;
    /// PRE-FETCH found the blocks fit in cache (not used: PRE-FETCH answers GOOD).
    pub const CONDITION_MET: u8 = 0x04;
}

/// One target port: an iSCSI target portal group (TPGT) seen from SCSI.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetPort {
    /// Relative target port identifier (1-based, unique within the target).
    pub relative_id: u16,
    /// Target port group (ALUA) this port belongs to.
    pub group_id: u16,
    /// SCSI name of the port, e.g. `iqn.2026-11.org.freesan:t1,t,0x0001`.
    pub name: String,
}

/// ALUA access state of a target port group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AluaState {
    /// Active/optimized.
    ActiveOptimized,
    /// Active/non-optimized.
    ActiveNonOptimized,
    /// Standby: only management commands are accepted.
    Standby,
    /// Unavailable.
    Unavailable,
}

/// A target port group for REPORT TARGET PORT GROUPS.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortGroup {
    /// Target port group identifier.
    pub id: u16,
    /// Its current access state.
    pub state: AluaState,
    /// Relative target port identifiers of its ports.
    pub relative_port_ids: Vec<u16>,
}

/// The I_T nexus a command arrived on: who sent it and through which port.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ItNexus {
    /// Initiator name (iSCSI name), e.g. `iqn.2007-10.com.github:sahlberg:libiscsi:iscsi-test`.
    pub initiator_name: Arc<str>,
    /// Initiator port name: `<initiator name>,i,0x<isid as 12 hex digits>`.
    pub initiator_port: Arc<str>,
    /// Relative id of the target port the nexus goes through.
    pub relative_port_id: u16,
    /// The CHAP name the initiator proved at login, if CHAP was used (host groups
    /// may name it).
    pub chap_user: Option<Arc<str>>,
}

/// Task attribute of a command (SAM).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TaskAttr {
    /// SIMPLE.
    Simple,
    /// ORDERED.
    Ordered,
    /// HEAD OF QUEUE.
    HeadOfQueue,
    /// ACA.
    Aca,
}

/// A decoded command as the transport hands it over.
#[derive(Debug, Clone)]
pub struct Command {
    /// The CDB (6 to 16 bytes, possibly more with an extended CDB AHS).
    pub cdb: Bytes,
    /// The LUN, already decoded from the 8-byte LUN field (flat or peripheral addressing).
    pub lun: u64,
    /// Every Data-Out byte the initiator sent (Expected Data Transfer Length for writes;
    /// empty for commands without Data-Out).
    pub data_out: Bytes,
    /// Expected Data Transfer Length for Data-In (bytes the initiator can take).
    pub data_in_len_max: u32,
    /// Task attribute.
    pub attr: TaskAttr,
}

/// What the command produced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    /// SCSI status byte (see [`status`]).
    pub status: u8,
    /// Sense data (fixed or descriptor format as the LUN's D_SENSE says), when status
    /// is CHECK CONDITION.
    pub sense: Option<Bytes>,
    /// Data-In bytes; may be longer than the initiator allowed (the transport truncates).
    pub data_in: Bytes,
    /// The number of bytes the CDB calls for in its data direction (e.g. transfer
    /// length x block size for READ/WRITE, allocation length clipped to what is
    /// available for INQUIRY). The transport compares it with the Expected Data
    /// Transfer Length to set residual overflow/underflow.
    pub transfer_len_bytes: u32,
}

/// Identity and settings of one logical unit.
#[derive(Debug, Clone)]
pub struct LunConfig {
    /// 16-byte NAA designator (type 6, IEEE registered extended) stable across restarts
    /// and identical on every port and node.
    pub naa: [u8; 16],
    /// Unit serial number (VPD 0x80), printable ASCII.
    pub serial: String,
    /// T10 vendor id (8 chars, space padded on the wire).
    pub vendor: String,
    /// Product id (16 chars).
    pub product: String,
    /// Product revision (4 chars).
    pub revision: String,
    /// Refuse writes (write protected).
    pub read_only: bool,
    /// File where persistent-reservation state (and other per-LUN state that must
    /// survive a restart) is kept; written atomically. None keeps it in memory only.
    pub state_file: Option<PathBuf>,
    /// Logical blocks per physical block, as a power of two (READ CAPACITY(16)'s
    /// LOGICAL BLOCKS PER PHYSICAL BLOCK EXPONENT): 3 for 512-byte blocks on
    /// 4 KiB sectors ("512e"), so initiators align their I/O; 0 for one block a
    /// sector.
    pub physical_block_exponent: u8,
    /// Bytes a second a SANITIZE OVERWRITE writes at most (0: as fast as the
    /// volume takes them), so that wiping one LU leaves the pool's bandwidth to
    /// the others.
    pub sanitize_rate_bytes_per_s: u64,
}

/// Description of the whole SCSI target device.
#[derive(Clone)]
pub struct TargetConfig {
    /// The target's SCSI name (the iSCSI target IQN).
    pub name: String,
    /// Its ports (one per iSCSI portal group).
    pub ports: Vec<TargetPort>,
    /// ALUA target port groups.
    pub port_groups: Vec<PortGroup>,
    /// Logical units: LUN number, configuration, volume.
    pub luns: Vec<(u64, LunConfig, VolumeRef)>,
}

impl TargetConfig {
    /// A target whose ports 1..=`port_count` (the iSCSI portal group tags) are all in
    /// one active/optimized ALUA group (id 1) and are named `<name>,t,0x<id as 4 hex
    /// digits>`, the iSCSI target port name: how a single node presents every portal.
    pub fn one_port_group(
        name: &str,
        port_count: u16,
        luns: Vec<(u64, LunConfig, VolumeRef)>,
    ) -> TargetConfig {
        let ports: Vec<TargetPort> = (1..=port_count)
            .map(|id| TargetPort {
                relative_id: id,
                group_id: 1,
                name: format!("{name},t,0x{id:04x}"),
            })
            .collect();
        TargetConfig {
            name: name.to_string(),
            port_groups: vec![PortGroup {
                id: 1,
                state: AluaState::ActiveOptimized,
                relative_port_ids: ports.iter().map(|p| p.relative_id).collect(),
            }],
            ports,
            luns,
        }
    }
}

/// Errors building a target (bad configuration, unreadable state file).
#[derive(Debug, thiserror::Error)]
pub enum ScsiError {
    /// The configuration is inconsistent.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// The persisted state could not be read or written.
    #[error("state file {path}: {source}")]
    State {
        /// The file.
        path: PathBuf,
        /// What failed.
        source: std::io::Error,
    },
    /// Persistent-reservation state received from the HA partner could not be decoded
    /// or is inconsistent.
    #[error("persistent reservation state: {0}")]
    PrState(String),
}
