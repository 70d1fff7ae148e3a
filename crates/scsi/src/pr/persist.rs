//! The APTPL state file: registrations, the reservation, PRgeneration and the APTPL
//! flag as JSON, written atomically (temporary file, fsync, rename, fsync of the
//! directory) so that a crash leaves either the old or the new state.
//!
//! The same JSON is what the HA partner receives ([`encode`] / [`decode`]); a state
//! pushed after a PERSISTENT RESERVE OUT also carries the unit attentions that command
//! established and, after a PREEMPT AND ABORT, the I_T nexuses whose tasks the partner
//! must abort too (the state file never holds either).

use super::{NexusId, PendingUa, PrState, PrType, Registration, Reservation, REGISTRATIONS_MAX};
use crate::sense::{key, Sense};
use crate::ScsiError;
use serde::{Deserialize, Serialize};
use std::fs;
use std::io;
use std::path::Path;
use std::sync::Arc;

/// Format version written to (and required in) the file.
const FORMAT_VERSION: u32 = 1;

#[derive(Debug, Serialize, Deserialize)]
struct FileState {
    version: u32,
    generation: u32,
    aptpl: bool,
    registrations: Vec<FileRegistration>,
    reservation: Option<FileReservation>,
    /// Only in a state pushed to the HA partner after a PR OUT: the unit attentions
    /// that command established (possibly none). Absent in the state file and in
    /// snapshots, whose receiver derives unit attentions from the difference.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    unit_attentions: Option<Vec<FileUa>>,
    /// Only in a state pushed after a PREEMPT AND ABORT: the preempted I_T nexuses
    /// (not the one that sent the command), whose tasks the partner aborts as well.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    abort_tasks_of: Vec<FileNexus>,
    /// Only in a state for the HA partner: the holder of the SPC-2 reservation
    /// (RESERVE(6)/(10)), which the nodes keep identical like the rest. Never in
    /// the state file: SPC-2 reservations do not outlive a power loss.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    spc2_holder: Option<FileNexus>,
}

/// An I_T nexus named in a pushed state.
#[derive(Debug, Serialize, Deserialize)]
struct FileNexus {
    initiator_port: String,
    relative_port_id: u16,
}

/// A unit attention for the nexuses of one initiator port.
#[derive(Debug, Serialize, Deserialize)]
struct FileUa {
    initiator_port: String,
    /// None: through every target port.
    relative_port_id: Option<u16>,
    asc: u8,
    ascq: u8,
}

#[derive(Debug, Serialize, Deserialize)]
struct FileRegistration {
    initiator_port: String,
    relative_port_id: u16,
    key: u64,
    all_tg_pt: bool,
}

#[derive(Debug, Serialize, Deserialize)]
struct FileReservation {
    type_code: u8,
    /// None for all-registrants types.
    holder_initiator_port: Option<String>,
    holder_relative_port_id: u16,
}

fn to_file(st: &PrState) -> FileState {
    FileState {
        version: FORMAT_VERSION,
        generation: st.generation,
        aptpl: st.aptpl,
        registrations: st
            .registrations
            .iter()
            .map(|r| FileRegistration {
                initiator_port: r.nexus.initiator_port.to_string(),
                relative_port_id: r.nexus.relative_port_id,
                key: r.key,
                all_tg_pt: r.all_tg_pt,
            })
            .collect(),
        reservation: st.reservation.as_ref().map(|res| FileReservation {
            type_code: res.kind.code(),
            holder_initiator_port: res.holder.as_ref().map(|h| h.initiator_port.to_string()),
            holder_relative_port_id: res.holder.as_ref().map_or(0, |h| h.relative_port_id),
        }),
        unit_attentions: None,
        abort_tasks_of: Vec::new(),
        spc2_holder: None,
    }
}

fn from_file(f: FileState) -> Result<PrState, String> {
    if f.version != FORMAT_VERSION {
        return Err(format!("unsupported format version {}", f.version));
    }
    if f.registrations.len() > REGISTRATIONS_MAX {
        return Err(format!(
            "{} registrations (most {REGISTRATIONS_MAX})",
            f.registrations.len()
        ));
    }
    let mut st = PrState {
        generation: f.generation,
        aptpl: f.aptpl,
        registrations: Vec::with_capacity(f.registrations.len()),
        reservation: None,
    };
    for r in f.registrations {
        if r.key == 0 || r.initiator_port.is_empty() {
            return Err("registration with an empty key or initiator port".into());
        }
        let nexus = NexusId {
            initiator_port: Arc::from(r.initiator_port),
            relative_port_id: r.relative_port_id,
        };
        if st.find_id(&nexus).is_some() {
            return Err(format!("I_T nexus {nexus:?} registered twice"));
        }
        st.registrations.push(Registration {
            nexus,
            key: r.key,
            all_tg_pt: r.all_tg_pt,
        });
    }
    if let Some(res) = f.reservation {
        let kind = PrType::from_code(res.type_code)
            .ok_or_else(|| format!("unknown reservation type {}", res.type_code))?;
        let holder = match (kind.all_registrants(), res.holder_initiator_port) {
            (true, _) => None,
            (false, Some(port)) => Some(NexusId {
                initiator_port: Arc::from(port),
                relative_port_id: res.holder_relative_port_id,
            }),
            (false, None) => return Err("reservation without a holder".into()),
        };
        st.reservation = Some(Reservation { kind, holder });
        if st.drop_orphaned_reservation().is_some() {
            return Err("reservation held by an unregistered I_T nexus".into());
        }
    }
    Ok(st)
}

fn file_nexus(n: &NexusId) -> FileNexus {
    FileNexus {
        initiator_port: n.initiator_port.to_string(),
        relative_port_id: n.relative_port_id,
    }
}

fn nexus_of(n: FileNexus) -> NexusId {
    NexusId {
        initiator_port: Arc::from(n.initiator_port),
        relative_port_id: n.relative_port_id,
    }
}

/// The state as JSON for the HA partner, with `spc2` the SPC-2 reservation's
/// holder; `uas` are the unit attentions the PR OUT that produced it established
/// (None for a snapshot), `aborts` the nexuses whose tasks a PREEMPT AND ABORT
/// aborts on the partner too.
pub(super) fn encode(
    st: &PrState,
    spc2: Option<&NexusId>,
    uas: Option<&[PendingUa]>,
    aborts: &[NexusId],
) -> Vec<u8> {
    let mut f = to_file(st);
    f.abort_tasks_of = aborts.iter().map(file_nexus).collect();
    f.spc2_holder = spc2.map(file_nexus);
    f.unit_attentions = uas.map(|uas| {
        uas.iter()
            .map(|u| FileUa {
                initiator_port: u.initiator_port.to_string(),
                relative_port_id: u.relative_port_id,
                asc: u.sense.asc,
                ascq: u.sense.ascq,
            })
            .collect()
    });
    // Plain structs of strings and integers: serializing them cannot fail.
    serde_json::to_vec(&f).unwrap_or_default()
}

/// What [`decode`] returns.
pub(super) struct Decoded {
    /// The persistent-reservation state.
    pub state: PrState,
    /// The SPC-2 reservation's holder.
    pub spc2: Option<NexusId>,
    /// The unit attentions listed with it (None: derive them).
    pub uas: Option<Vec<PendingUa>>,
    /// The nexuses whose tasks to abort.
    pub aborts: Vec<NexusId>,
}

/// Parses what [`encode`] (or the state file) holds, with the same validation as
/// loading the state file.
pub(super) fn decode(bytes: &[u8]) -> Result<Decoded, String> {
    let mut f: FileState = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
    if f.abort_tasks_of.len() > REGISTRATIONS_MAX {
        return Err(format!(
            "{} nexuses to abort (most {REGISTRATIONS_MAX})",
            f.abort_tasks_of.len()
        ));
    }
    let aborts = std::mem::take(&mut f.abort_tasks_of)
        .into_iter()
        .map(nexus_of)
        .collect();
    let spc2 = f.spc2_holder.take().map(nexus_of);
    if spc2.as_ref().is_some_and(|n| n.initiator_port.is_empty()) {
        return Err("SPC-2 reservation held by an empty initiator port".into());
    }
    let uas = f.unit_attentions.take().map(|uas| {
        uas.into_iter()
            .map(|u| PendingUa {
                initiator_port: Arc::from(u.initiator_port),
                relative_port_id: u.relative_port_id,
                sense: Sense::new(key::UNIT_ATTENTION, u.asc, u.ascq),
            })
            .collect()
    });
    Ok(Decoded {
        state: from_file(f)?,
        spc2,
        uas,
        aborts,
    })
}

/// Reads the state file; Ok(None) when there is none.
pub(super) fn load(path: &Path) -> Result<Option<PrState>, ScsiError> {
    let state_err = |source: io::Error| ScsiError::State {
        path: path.to_path_buf(),
        source,
    };
    let text = match fs::read(path) {
        Ok(text) => text,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(state_err(e)),
    };
    let file: FileState = serde_json::from_slice(&text)
        .map_err(|e| state_err(io::Error::new(io::ErrorKind::InvalidData, e)))?;
    from_file(file)
        .map(Some)
        .map_err(|msg| state_err(io::Error::new(io::ErrorKind::InvalidData, msg)))
}

/// Writes `st` atomically: temporary file, fsync, rename over `path`, fsync the
/// directory.
pub(super) fn save(path: &Path, st: &PrState) -> io::Result<()> {
    let json = serde_json::to_vec_pretty(&to_file(st)).map_err(io::Error::other)?;
    crate::statefile::write_atomic(path, &json)
}

/// Removes the state file (APTPL turned off); a missing file is fine.
pub(super) fn remove(path: &Path) -> io::Result<()> {
    crate::statefile::remove(path)
}
