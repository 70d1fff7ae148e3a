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

pub mod pr;
pub mod sense;

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

/// A SCSI target device: the logical units behind one iSCSI target.
pub struct ScsiTarget {
    config: TargetConfig,
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
}

impl ScsiTarget {
    /// Builds the target; loads persisted state (APTPL reservations) from each LUN's state file.
    pub fn new(config: TargetConfig) -> Result<Self, ScsiError> {
        Ok(ScsiTarget { config })
    }

    /// The configuration the target was built with.
    pub fn config(&self) -> &TargetConfig {
        &self.config
    }

    /// Executes one command from `nexus`. Never panics on any CDB or data.
    pub async fn execute(&self, nexus: &ItNexus, cmd: Command) -> Response {
        let _ = (nexus, cmd);
        unimplemented_response()
    }

    /// LOGICAL UNIT RESET task management function from `nexus`.
    pub async fn lun_reset(&self, nexus: &ItNexus, lun: u64) -> bool {
        let _ = (nexus, lun);
        false
    }

    /// TARGET WARM/COLD RESET from `nexus` (every LUN).
    pub async fn target_reset(&self, nexus: &ItNexus) {
        let _ = nexus;
    }

    /// CLEAR TASK SET on `lun` from `nexus`: establishes the unit attention the
    /// standard asks for on other nexuses (commands are aborted by the transport).
    pub async fn clear_task_set(&self, nexus: &ItNexus, lun: u64) {
        let _ = (nexus, lun);
    }

    /// The I_T nexus is gone (session closed): drops SPC-2 reservations it held.
    pub fn nexus_lost(&self, nexus: &ItNexus) {
        let _ = nexus;
    }

    /// Flushes every LUN's volume (clean shutdown).
    pub async fn flush_all(&self) {}
}

fn unimplemented_response() -> Response {
    // ILLEGAL REQUEST / INVALID COMMAND OPERATION CODE in fixed format
    let mut sense = vec![0u8; 18];
    sense[0] = 0x70;
    sense[2] = 0x05;
    sense[7] = 10;
    sense[12] = 0x20;
    Response {
        status: status::CHECK_CONDITION,
        sense: Some(Bytes::from(sense)),
        data_in: Bytes::new(),
        transfer_len_bytes: 0,
    }
}
