//! ALUA, implicit and explicit: target port group states, REPORT TARGET PORT GROUPS,
//! SET TARGET PORT GROUPS, and which commands a port in Standby or Unavailable state
//! still accepts (SPC-4 5.15.2.4).
//!
//! # Two layers per logical unit and group
//!
//! Each LU keeps, for every target port group, two states:
//!
//! - the *implicit* state, which the device sets itself: the configuration's
//!   initial state, then [`crate::ScsiTarget::set_lun_port_group_state`] /
//!   [`crate::ScsiTarget::set_port_group_state`] (in an HA pair, the cluster drives it
//!   from the replica's role: the partner down makes its group Unavailable, a
//!   resyncing node is Unavailable, an active-passive follower is Standby);
//! - the *explicit* state, which an application client sets with SET TARGET PORT
//!   GROUPS (none until one does: it then constrains nothing).
//!
//! The state the LU reports and enforces (the *effective* state) is the worse of the
//! two, in the order active/optimized < active/non-optimized < standby <
//! unavailable. So an operator can demote a group (e.g. make node 2's paths
//! non-optimized, or put them in standby) but never make a path usable that the
//! device itself cannot serve through; and setting active/optimized explicitly
//! gives the implicit state back its full say. An implicit change never clears the
//! explicit state: when the partner comes back its group returns to the state the
//! operator chose for it.
//!
//! REPORT TARGET PORT GROUPS reports the effective state and, per group, STATUS CODE
//! 01h once a SET TARGET PORT GROUPS changed its explicit state, 02h once the
//! effective state changed implicitly afterwards (00h before either).
//!
//! # Persistence
//!
//! The explicit states of an LU survive a restart: they are kept in a small JSON file
//! next to the LU's persistent-reservation state file (`lunN.pr.json` ->
//! `lunN.alua.json`, see [`state_path`]), written atomically (temporary file, fsync,
//! rename, fsync of the directory) before a change takes effect, and loaded when the
//! LU is built. An LU without a state file keeps them in memory only.

use crate::cdb::{op, sa, Cdb};
use crate::lu::{CmdResult, Done, Fail, LogicalUnit};
use crate::sense::{codes, Sense};
use crate::{AluaState, ItNexus, PortGroup, ScsiError, TargetPort};
use parking_lot::{Mutex, RwLock};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

impl AluaState {
    /// The ASYMMETRIC ACCESS STATE code (SPC-4 table 160).
    pub fn code(self) -> u8 {
        match self {
            AluaState::ActiveOptimized => 0,
            AluaState::ActiveNonOptimized => 1,
            AluaState::Standby => 2,
            AluaState::Unavailable => 3,
        }
    }

    /// The state of an ASYMMETRIC ACCESS STATE code; None for the codes this device
    /// does not support (logical block dependent, offline, transitioning, reserved).
    pub fn from_code(code: u8) -> Option<AluaState> {
        Some(match code {
            0 => AluaState::ActiveOptimized,
            1 => AluaState::ActiveNonOptimized,
            2 => AluaState::Standby,
            3 => AluaState::Unavailable,
            _ => return None,
        })
    }

    /// The worse of two states (the one that allows less).
    pub fn worse(self, other: AluaState) -> AluaState {
        if other.code() > self.code() {
            other
        } else {
            self
        }
    }

    fn name(self) -> &'static str {
        match self {
            AluaState::ActiveOptimized => "active-optimized",
            AluaState::ActiveNonOptimized => "active-non-optimized",
            AluaState::Standby => "standby",
            AluaState::Unavailable => "unavailable",
        }
    }

    fn from_name(s: &str) -> Option<AluaState> {
        [
            AluaState::ActiveOptimized,
            AluaState::ActiveNonOptimized,
            AluaState::Standby,
            AluaState::Unavailable,
        ]
        .into_iter()
        .find(|a| a.name() == s)
    }
}

/// RTPG STATUS CODE: no status available.
const STATUS_NONE: u8 = 0x00;
/// RTPG STATUS CODE: altered by SET TARGET PORT GROUPS.
const STATUS_EXPLICIT: u8 = 0x01;
/// RTPG STATUS CODE: altered by implicit asymmetric logical unit access behaviour.
const STATUS_IMPLICIT: u8 = 0x02;

/// One group of one LU: both layers and the RTPG status code.
#[derive(Debug, Clone)]
struct Group {
    id: u16,
    implicit: AluaState,
    explicit: Option<AluaState>,
    status: u8,
    relative_port_ids: Vec<u16>,
}

impl Group {
    fn effective(&self) -> AluaState {
        match self.explicit {
            Some(e) => self.implicit.worse(e),
            None => self.implicit,
        }
    }
}

/// Port group states of one target (or LU), changeable at run time.
pub(crate) struct Alua {
    groups: RwLock<Vec<Group>>,
    /// Relative port id -> group id (changed only by [`Alua::retarget`]; read
    /// per command only while some group is not active).
    port_group: RwLock<Vec<(u16, u16)>>,
    /// Fast path: every group is active (no per-command lookup needed).
    all_active: AtomicBool,
    /// Serialises changes of the explicit states with the write of their file.
    explicit_write: Mutex<()>,
}

fn active(s: AluaState) -> bool {
    matches!(
        s,
        AluaState::ActiveOptimized | AluaState::ActiveNonOptimized
    )
}

impl Alua {
    /// From the configuration (its states are the implicit ones); with no groups
    /// configured, one group per distinct `group_id` of the ports, active/optimized.
    pub fn new(ports: &[TargetPort], groups: &[PortGroup]) -> Alua {
        let mut groups = groups.to_vec();
        if groups.is_empty() {
            for p in ports {
                match groups.iter_mut().find(|g| g.id == p.group_id) {
                    Some(g) => g.relative_port_ids.push(p.relative_id),
                    None => groups.push(PortGroup {
                        id: p.group_id,
                        state: AluaState::ActiveOptimized,
                        relative_port_ids: vec![p.relative_id],
                    }),
                }
            }
        }
        let mut port_group: Vec<(u16, u16)> =
            ports.iter().map(|p| (p.relative_id, p.group_id)).collect();
        for g in &groups {
            for &rel in &g.relative_port_ids {
                if !port_group.iter().any(|&(r, _)| r == rel) {
                    port_group.push((rel, g.id));
                }
            }
        }
        let all_active = groups.iter().all(|g| active(g.state));
        let groups = groups
            .into_iter()
            .map(|g| Group {
                id: g.id,
                implicit: g.state,
                explicit: None,
                status: STATUS_NONE,
                relative_port_ids: g.relative_port_ids,
            })
            .collect();
        Alua {
            groups: RwLock::new(groups),
            port_group: RwLock::new(port_group),
            all_active: AtomicBool::new(all_active),
            explicit_write: Mutex::new(()),
        }
    }

    /// A snapshot of the groups with their effective states.
    pub fn groups(&self) -> Vec<PortGroup> {
        self.groups
            .read()
            .iter()
            .map(|g| PortGroup {
                id: g.id,
                state: g.effective(),
                relative_port_ids: g.relative_port_ids.clone(),
            })
            .collect()
    }

    /// Takes ports `gone` out of their groups and puts each port of `added` in
    /// its group (a port portals added at run time; see
    /// [`crate::ScsiTarget::set_ports`]). States are untouched. A port whose group
    /// this target does not have is left out (the caller checks first).
    pub fn retarget(&self, gone: &[u16], added: &[TargetPort]) {
        let mut groups = self.groups.write();
        let mut map = self.port_group.write();
        map.retain(|(r, _)| !gone.contains(r));
        for g in groups.iter_mut() {
            g.relative_port_ids.retain(|r| !gone.contains(r));
        }
        for p in added {
            let Some(g) = groups.iter_mut().find(|g| g.id == p.group_id) else {
                continue;
            };
            if !g.relative_port_ids.contains(&p.relative_id) {
                g.relative_port_ids.push(p.relative_id);
            }
            map.retain(|(r, _)| *r != p.relative_id);
            map.push((p.relative_id, p.group_id));
        }
    }

    fn refresh_all_active(&self, groups: &[Group]) {
        let all = groups.iter().all(|g| active(g.effective()));
        self.all_active.store(all, Ordering::Release);
    }

    /// Sets a group's implicit state; false when no such group exists. The RTPG
    /// status code becomes 02h when the effective state changed.
    pub fn set_state(&self, group_id: u16, state: AluaState) -> bool {
        let mut groups = self.groups.write();
        let Some(g) = groups.iter_mut().find(|g| g.id == group_id) else {
            return false;
        };
        let before = g.effective();
        g.implicit = state;
        if g.effective() != before {
            g.status = STATUS_IMPLICIT;
        }
        self.refresh_all_active(&groups);
        true
    }

    /// The explicit states set (group id, state), in group order of the
    /// configuration; groups without one are left out.
    pub fn explicit_states(&self) -> Vec<(u16, AluaState)> {
        self.groups
            .read()
            .iter()
            .filter_map(|g| g.explicit.map(|e| (g.id, e)))
            .collect()
    }

    /// Whether the target has a group `id`.
    pub(crate) fn has_group(&self, id: u16) -> bool {
        self.groups.read().iter().any(|g| g.id == id)
    }

    /// The explicit states after `changes` (group, state) are applied to `current`.
    fn merged(current: &[(u16, AluaState)], changes: &[(u16, AluaState)]) -> Vec<(u16, AluaState)> {
        let mut next = current.to_vec();
        for &(id, s) in changes {
            match next.iter_mut().find(|(g, _)| *g == id) {
                Some(e) => e.1 = s,
                None => next.push((id, s)),
            }
        }
        next
    }

    /// Replaces every explicit state with `states` (groups not named get none),
    /// writing them to `file` first (atomically) when given: on a write error
    /// nothing changes. Groups the target does not have are ignored (a state file
    /// or partner with an older configuration). Returns whether any explicit state
    /// changed; the groups whose explicit state changed get RTPG status 01h.
    pub fn install_explicit(
        &self,
        states: &[(u16, AluaState)],
        file: Option<&Path>,
    ) -> std::io::Result<bool> {
        let _w = self.explicit_write.lock();
        self.replace_explicit(states, file)
    }

    /// [`Alua::install_explicit`] for states the partner pushed: applied even
    /// when they cannot be saved (the error is returned beside whether any
    /// changed). Refused, the two nodes reported and enforced different
    /// states, and a retry through the partner, which found nothing left to
    /// change there, pushed nothing (review of 2026-12-06; as for reservations).
    pub fn install_explicit_from_partner(
        &self,
        states: &[(u16, AluaState)],
        file: Option<&Path>,
    ) -> (bool, Option<std::io::Error>) {
        let _w = self.explicit_write.lock();
        match self.replace_explicit(states, file) {
            Ok(changed) => (changed, None),
            Err(e) => (
                self.replace_explicit(states, None).unwrap_or(false),
                Some(e),
            ),
        }
    }

    /// [`Alua::install_explicit`] with `explicit_write` held.
    fn replace_explicit(
        &self,
        states: &[(u16, AluaState)],
        file: Option<&Path>,
    ) -> std::io::Result<bool> {
        let mut next: Vec<(u16, AluaState)> = Vec::new();
        for &(id, s) in states {
            if !self.has_group(id) {
                tracing::warn!(
                    group = id,
                    "explicit ALUA state for an unknown port group ignored"
                );
                continue;
            }
            match next.iter_mut().find(|(g, _)| *g == id) {
                Some(e) => e.1 = s,
                None => next.push((id, s)),
            }
        }
        let mut sorted = next.clone();
        sorted.sort_by_key(|&(g, _)| g);
        let mut current = self.explicit_states();
        current.sort_by_key(|&(g, _)| g);
        if sorted == current {
            return Ok(false);
        }
        if let Some(path) = file {
            save(path, &sorted)?;
        }
        let mut groups = self.groups.write();
        for g in groups.iter_mut() {
            let want = next.iter().find(|(id, _)| *id == g.id).map(|&(_, s)| s);
            if want != g.explicit {
                g.explicit = want;
                g.status = STATUS_EXPLICIT;
            }
        }
        self.refresh_all_active(&groups);
        Ok(true)
    }

    /// Applies the (validated) changes of one SET TARGET PORT GROUPS on top of the
    /// current explicit states; see [`Alua::install_explicit`].
    pub fn set_explicit(
        &self,
        changes: &[(u16, AluaState)],
        file: Option<&Path>,
    ) -> std::io::Result<bool> {
        let _w = self.explicit_write.lock();
        let next = Alua::merged(&self.explicit_states(), changes);
        self.replace_explicit(&next, file)
    }

    /// Loads the explicit states persisted in `file` (none if there is no file).
    pub fn load_explicit(&self, file: &Path) -> Result<(), ScsiError> {
        let states = load(file)?;
        if !states.is_empty() {
            tracing::info!(file = %file.display(), groups = states.len(), "explicit ALUA states loaded");
        }
        // already on disk: not written again
        self.install_explicit(&states, None)
            .map_err(|source| ScsiError::State {
                path: file.to_path_buf(),
                source,
            })?;
        Ok(())
    }

    /// State of the group the port belongs to (active when the port is unknown).
    pub fn port_state(&self, relative_port_id: u16) -> AluaState {
        if self.all_active.load(Ordering::Acquire) {
            return AluaState::ActiveOptimized;
        }
        let Some((_, gid)) = self
            .port_group
            .read()
            .iter()
            .find(|&&(r, _)| r == relative_port_id)
            .copied()
        else {
            return AluaState::ActiveOptimized;
        };
        self.groups
            .read()
            .iter()
            .find(|g| g.id == gid)
            .map_or(AluaState::ActiveOptimized, |g| g.effective())
    }

    /// NOT READY sense when `cdb` may not run through a port in `state`.
    pub fn check(&self, relative_port_id: u16, cdb: &Cdb) -> Result<(), Sense> {
        match self.port_state(relative_port_id) {
            AluaState::ActiveOptimized | AluaState::ActiveNonOptimized => Ok(()),
            AluaState::Standby if allowed_in_standby(cdb) => Ok(()),
            AluaState::Standby => Err(codes::PORT_STANDBY),
            AluaState::Unavailable if allowed_in_unavailable(cdb) => Ok(()),
            AluaState::Unavailable => Err(codes::PORT_UNAVAILABLE),
        }
    }

    /// REPORT TARGET PORT GROUPS (MAINTENANCE IN / 0x0a).
    pub fn report(&self, cdb: &Cdb) -> CmdResult {
        let extended = match cdb.b(1) >> 5 {
            0 => false,
            1 => true,
            _ => return Err(cdb.invalid(1, Some(7)).into()),
        };
        let alloc_len = cdb.u32_at(6);
        let mut d = vec![0u8; if extended { 8 } else { 4 }];
        if extended {
            d[4] = 0x10; // FORMAT TYPE 001b
        }
        for g in self.groups.read().iter() {
            d.push(0x80 | g.effective().code()); // PREF, state
            d.push(0x0f); // T_SUP=0: U_SUP, S_SUP, AN_SUP, AO_SUP
            d.extend_from_slice(&g.id.to_be_bytes());
            d.push(0);
            d.push(g.status);
            d.push(0);
            let ports = &g.relative_port_ids[..g.relative_port_ids.len().min(255)];
            d.push(ports.len() as u8);
            for &p in ports {
                d.extend_from_slice(&[0, 0]);
                d.extend_from_slice(&p.to_be_bytes());
            }
        }
        let n = (d.len() - 4) as u32;
        d[0..4].copy_from_slice(&n.to_be_bytes());
        Ok(Done::alloc(d, alloc_len))
    }

    /// The changes a SET TARGET PORT GROUPS (MAINTENANCE OUT / 0x0a) asks for:
    /// (group, state) per set target port group descriptor, validated as a whole
    /// (nothing is applied when one is wrong). A PARAMETER LIST LENGTH of zero asks
    /// for no change (SPC-4 6.45); one that is not 4 + a multiple of 4 truncates a
    /// descriptor: PARAMETER LIST LENGTH ERROR. An unknown group, a state this
    /// device does not support (logical block dependent, offline, transitioning,
    /// reserved codes) or one group named twice with different states: INVALID FIELD
    /// IN PARAMETER LIST pointing at it.
    pub fn parse_set(&self, cdb: &Cdb, data: &[u8]) -> Result<Vec<(u16, AluaState)>, Fail> {
        let plist_len = cdb.u32_at(6) as usize;
        if plist_len == 0 {
            return Ok(Vec::new());
        }
        if data.len() < plist_len {
            return Err(Fail::Check(codes::INVALID_FIELD_IN_CIU, plist_len as u32));
        }
        let p = &data[..plist_len];
        let len_error = || Fail::Check(codes::PARAM_LIST_LENGTH_ERROR, plist_len as u32);
        if p.len() < 4 || !(p.len() - 4).is_multiple_of(4) {
            return Err(len_error());
        }
        let bad = |byte: usize, bit: Option<u8>| {
            Fail::Check(
                codes::INVALID_FIELD_IN_PARAM.with_field(false, byte.min(0xffff) as u16, bit),
                plist_len as u32,
            )
        };
        let mut changes: Vec<(u16, AluaState)> = Vec::new();
        for (i, d) in p[4..].chunks_exact(4).enumerate() {
            let off = 4 + 4 * i;
            let Some(state) = AluaState::from_code(d[0] & 0x0f) else {
                return Err(bad(off, Some(3)));
            };
            let group = u16::from_be_bytes([d[2], d[3]]);
            if !self.has_group(group) {
                return Err(bad(off + 2, None));
            }
            match changes.iter().find(|(g, _)| *g == group) {
                Some(&(_, s)) if s != state => return Err(bad(off, Some(3))),
                Some(_) => {}
                None => changes.push((group, state)),
            }
        }
        Ok(changes)
    }
}

/// The file that keeps an LU's explicit ALUA states, next to its persistent
/// reservation state file `pr_state_file`: `lunN.pr.json` -> `lunN.alua.json`
/// (any other name gets `.alua.json` appended).
pub fn state_path(pr_state_file: &Path) -> PathBuf {
    crate::statefile::beside(pr_state_file, "alua")
}

#[derive(serde::Serialize, serde::Deserialize)]
struct FileGroup {
    group: u16,
    state: String,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct FileState {
    version: u32,
    explicit: Vec<FileGroup>,
}

fn load(path: &Path) -> Result<Vec<(u16, AluaState)>, ScsiError> {
    let err = |msg: String| ScsiError::State {
        path: path.to_path_buf(),
        source: std::io::Error::new(std::io::ErrorKind::InvalidData, msg),
    };
    let text = match std::fs::read(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => {
            return Err(ScsiError::State {
                path: path.to_path_buf(),
                source,
            })
        }
    };
    let f: FileState = serde_json::from_slice(&text).map_err(|e| err(e.to_string()))?;
    if f.version != 1 {
        return Err(err(format!("unknown version {}", f.version)));
    }
    f.explicit
        .iter()
        .map(|g| {
            AluaState::from_name(&g.state)
                .map(|s| (g.group, s))
                .ok_or_else(|| err(format!("unknown ALUA state {:?}", g.state)))
        })
        .collect()
}

/// Writes `states` to `path` atomically: temporary file, fsync, rename, fsync of
/// the directory.
fn save(path: &Path, states: &[(u16, AluaState)]) -> std::io::Result<()> {
    let f = FileState {
        version: 1,
        explicit: states
            .iter()
            .map(|&(group, s)| FileGroup {
                group,
                state: s.name().to_string(),
            })
            .collect(),
    };
    let json = serde_json::to_vec_pretty(&f).map_err(std::io::Error::other)?;
    crate::statefile::write_atomic(path, &json)
}

/// SET TARGET PORT GROUPS on `lu` from `nexus`. In an HA pair (the LU has a
/// [`crate::PrReplication`] link) the node that orders changes runs it: a node
/// that does not forwards the validated changes there
/// ([`crate::PrReplication::forward_set_tpg`]); the ordering node applies them,
/// persists them and installs its whole explicit state on the partner
/// ([`crate::PrReplication::push_alua_state`]) before answering, so both nodes
/// report the new states when the command completes.
pub(crate) async fn set_target_port_groups(
    lu: &LogicalUnit,
    nexus: &ItNexus,
    cdb: &Cdb,
    data: &[u8],
) -> CmdResult {
    // the whole parameter list is the transfer, as for PERSISTENT RESERVE OUT
    let plist_len = cdb.u32_at(6);
    let done = Done {
        data_in: block::Bytes::new(),
        transfer_len_bytes: plist_len,
    };
    let changes = lu.alua.parse_set(cdb, data)?;
    if changes.is_empty() {
        return Ok(done);
    }
    let repl = lu.pr_replication.read().clone();
    if let Some(r) = &repl {
        match r.forward_set_tpg(lu.lun, nexus, &changes).await {
            None => {}
            Some(Ok(())) => return Ok(done),
            Some(Err(why)) => {
                // the leader may or may not have applied them: multipath retries
                // through another path, and applying the same states again is
                // harmless
                tracing::warn!(lun = lu.lun, why, "SET TARGET PORT GROUPS not possible now");
                return Err(Fail::Check(codes::PORT_UNAVAILABLE, plist_len));
            }
        }
    }
    match apply_here(lu, Some(nexus), &changes, false).await {
        Ok(()) => Ok(done),
        Err(s) => Err(Fail::Check(s, plist_len)),
    }
}

/// Applies `changes` on this node (which orders SET TARGET PORT GROUPS of `lu`):
/// persisted, in force, ASYMMETRIC ACCESS STATE CHANGED for every I_T nexus but
/// `origin`, and pushed to the partner, one change of the LU at a time. A change
/// that changes nothing is pushed only when `push_unchanged` (a command the
/// partner forwarded: it then answers from the state it holds, which a failed
/// earlier push may have left behind). Err (HARDWARE ERROR) when the state file
/// cannot be written (nothing changed) or the push failed (the change stays here;
/// the partner gets the whole state with the next change or when it rejoins).
pub(crate) async fn apply_here(
    lu: &LogicalUnit,
    origin: Option<&ItNexus>,
    changes: &[(u16, AluaState)],
    push_unchanged: bool,
) -> Result<(), Sense> {
    let order = lu.alua_order.clone().lock_owned().await;
    let file = lu.config.state_file.as_deref().map(state_path);
    let changed = lu
        .alua
        .set_explicit(changes, file.as_deref())
        .map_err(|e| {
            tracing::error!(lun = lu.lun, error = %e, "writing the explicit ALUA states failed");
            codes::INTERNAL_TARGET_FAILURE
        })?;
    if changed {
        tracing::info!(
            lun = lu.lun,
            ?changes,
            "explicit ALUA states set (SET TARGET PORT GROUPS)"
        );
        lu.uas.raise_all(codes::ALUA_STATE_CHANGED, origin);
    } else if !push_unchanged {
        return Ok(());
    }
    let repl = lu.pr_replication.read().clone();
    if let Some(r) = repl {
        // to its end even if this command is dropped: the states are set here,
        // and a retry changes nothing, so would push nothing
        let (lun, states, origin) = (lu.lun, lu.alua.explicit_states(), origin.cloned());
        let pushed = block::detach::detached(async move {
            let _order = order;
            r.push_alua_state(lun, origin.as_ref(), &states).await
        })
        .await;
        if let Err(e) = pushed {
            tracing::error!(lun = lu.lun, error = %e, "pushing explicit ALUA states to the partner failed");
            return Err(codes::INTERNAL_TARGET_FAILURE);
        }
    }
    Ok(())
}

/// Installs explicit states that came from the partner (or at a rejoin): persisted,
/// in force, and ASYMMETRIC ACCESS STATE CHANGED for every I_T nexus but `origin`
/// (the nexus that sent the SET TARGET PORT GROUPS, if it came through this node)
/// when they changed.
pub(crate) fn install(
    lu: &LogicalUnit,
    origin: Option<&ItNexus>,
    states: &[(u16, AluaState)],
) -> Result<(), ScsiError> {
    let file = lu.config.state_file.as_deref().map(state_path);
    let (changed, unsaved) = lu
        .alua
        .install_explicit_from_partner(states, file.as_deref());
    let unsaved = unsaved.map(|source| ScsiError::State {
        path: file.clone().unwrap_or_default(),
        source,
    });
    if changed {
        tracing::info!(
            lun = lu.lun,
            ?states,
            "explicit ALUA states installed from the partner"
        );
        lu.uas.raise_all(codes::ALUA_STATE_CHANGED, origin);
    }
    match unsaved {
        Some(e) => {
            tracing::error!(lun = lu.lun, error = %e, "explicit ALUA states installed but not saved");
            Err(e)
        }
        None => Ok(()),
    }
}

/// An I_T nexus that only names an initiator port and a target port (for unit
/// attention exceptions of commands that came through the partner).
pub(crate) fn nexus_of(initiator_port: &str, relative_port_id: u16) -> ItNexus {
    ItNexus {
        initiator_name: Arc::from(""),
        initiator_port: Arc::from(initiator_port),
        relative_port_id,
        chap_user: None,
    }
}

fn maintenance_mgmt(cdb: &Cdb) -> bool {
    match cdb.opcode() {
        op::MAINTENANCE_IN => matches!(
            cdb.service_action(),
            sa::REPORT_TARGET_PORT_GROUPS
                | sa::REPORT_SUPPORTED_OPCODES
                | sa::REPORT_SUPPORTED_TMFS
        ),
        // SPC-4 5.15.2.4.4 and 5.15.2.4.5: a Standby or Unavailable port accepts
        // SET TARGET PORT GROUPS (how a host brings the group back)
        op::MAINTENANCE_OUT => cdb.service_action() == sa::SET_TARGET_PORT_GROUPS,
        _ => false,
    }
}

/// Commands a Standby port accepts.
fn allowed_in_standby(cdb: &Cdb) -> bool {
    matches!(
        cdb.opcode(),
        op::INQUIRY
            | op::REPORT_LUNS
            | op::REQUEST_SENSE
            | op::MODE_SENSE_6
            | op::MODE_SENSE_10
            | op::MODE_SELECT_6
            | op::MODE_SELECT_10
            | op::PR_IN
            | op::PR_OUT
    ) || maintenance_mgmt(cdb)
}

/// Commands an Unavailable port accepts.
fn allowed_in_unavailable(cdb: &Cdb) -> bool {
    matches!(
        cdb.opcode(),
        op::INQUIRY | op::REPORT_LUNS | op::REQUEST_SENSE
    ) || maintenance_mgmt(cdb)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ports() -> Vec<TargetPort> {
        vec![
            TargetPort {
                relative_id: 1,
                group_id: 1,
                name: "t,t,0x1".into(),
            },
            TargetPort {
                relative_id: 2,
                group_id: 2,
                name: "t,t,0x2".into(),
            },
        ]
    }

    fn state_of(a: &Alua, id: u16) -> AluaState {
        a.groups().iter().find(|g| g.id == id).unwrap().state
    }

    /// (state code, status code) of group `id` in an RTPG answer.
    fn rtpg(a: &Alua, id: u16) -> (u8, u8) {
        let cdb = Cdb::parse(&[0xa3, 0x0a, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0]).unwrap();
        let d = a.report(&cdb).unwrap().data_in;
        let mut off = 4;
        while off < d.len() {
            let gid = u16::from_be_bytes([d[off + 2], d[off + 3]]);
            if gid == id {
                assert_eq!(d[off + 1], 0x0f, "supported states");
                return (d[off] & 0x0f, d[off + 5]);
            }
            off += 8 + 4 * d[off + 7] as usize;
        }
        panic!("no group {id}");
    }

    fn stpg(len: u32) -> Cdb {
        let mut c = [0u8; 12];
        c[0] = 0xa4;
        c[1] = 0x0a;
        c[6..10].copy_from_slice(&len.to_be_bytes());
        Cdb::parse(&c).unwrap()
    }

    fn sense(f: Fail) -> Sense {
        match f {
            Fail::Check(s, _) => s,
            other => panic!("not a CHECK CONDITION: {other:?}"),
        }
    }

    fn temp_file(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("scsi-alua-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir.join("lun0.pr.json")
    }

    #[test]
    fn standby_blocks_io_but_not_inquiry() {
        let a = Alua::new(&ports(), &[]);
        assert_eq!(a.groups().len(), 2);
        assert!(a.set_state(2, AluaState::Standby));
        assert!(!a.set_state(9, AluaState::Standby));
        let read = Cdb::parse(&[0x28, 0, 0, 0, 0, 0, 0, 0, 1, 0]).unwrap();
        let inq = Cdb::parse(&[0x12, 0, 0, 0, 36, 0]).unwrap();
        assert!(a.check(1, &read).is_ok());
        assert_eq!(a.check(2, &read), Err(codes::PORT_STANDBY));
        assert!(a.check(2, &inq).is_ok());
        a.set_state(2, AluaState::Unavailable);
        assert_eq!(a.check(2, &read), Err(codes::PORT_UNAVAILABLE));
    }

    #[test]
    fn set_target_port_groups_passes_standby_and_unavailable_ports() {
        let a = Alua::new(&ports(), &[]);
        let set = stpg(8);
        let other_out = Cdb::parse(&[0xa4, 0x06, 0, 0, 0, 0, 0, 0, 0, 8, 0, 0]).unwrap();
        for s in [AluaState::Standby, AluaState::Unavailable] {
            a.set_state(2, s);
            assert!(a.check(2, &set).is_ok(), "{s:?}");
            assert!(a.check(2, &other_out).is_err(), "{s:?}");
        }
    }

    #[test]
    fn effective_state_is_the_worse_of_implicit_and_explicit() {
        let a = Alua::new(&ports(), &[]);
        assert_eq!(rtpg(&a, 2), (0, STATUS_NONE));
        // explicit demotion
        assert!(a.set_explicit(&[(2, AluaState::Standby)], None).unwrap());
        assert_eq!(state_of(&a, 2), AluaState::Standby);
        assert_eq!(rtpg(&a, 2), (2, STATUS_EXPLICIT));
        assert_eq!(state_of(&a, 1), AluaState::ActiveOptimized);
        assert_eq!(
            rtpg(&a, 1),
            (0, STATUS_NONE),
            "a group not named keeps its status"
        );
        // the same again changes nothing
        assert!(!a.set_explicit(&[(2, AluaState::Standby)], None).unwrap());
        // an implicit state that is worse wins and is reported as implicit
        assert!(a.set_state(2, AluaState::Unavailable));
        assert_eq!(rtpg(&a, 2), (3, STATUS_IMPLICIT));
        // the explicit state cannot make the group better than the implicit one
        a.set_explicit(&[(2, AluaState::ActiveOptimized)], None)
            .unwrap();
        assert_eq!(state_of(&a, 2), AluaState::Unavailable);
        assert_eq!(rtpg(&a, 2), (3, STATUS_EXPLICIT));
        a.set_explicit(&[(2, AluaState::ActiveNonOptimized)], None)
            .unwrap();
        // the implicit state recovers: the explicit one remains in force
        a.set_state(2, AluaState::ActiveOptimized);
        assert_eq!(state_of(&a, 2), AluaState::ActiveNonOptimized);
        assert_eq!(rtpg(&a, 2), (1, STATUS_IMPLICIT));
        // an implicit change hidden by the explicit state alters no status
        a.set_explicit(&[(2, AluaState::Unavailable)], None)
            .unwrap();
        a.set_state(2, AluaState::Standby);
        assert_eq!(rtpg(&a, 2), (3, STATUS_EXPLICIT));
        // the fast path follows the effective state
        let read = Cdb::parse(&[0x28, 0, 0, 0, 0, 0, 0, 0, 1, 0]).unwrap();
        assert_eq!(a.check(2, &read), Err(codes::PORT_UNAVAILABLE));
        a.install_explicit(&[], None).unwrap();
        a.set_state(2, AluaState::ActiveOptimized);
        assert!(a.check(2, &read).is_ok());
        assert!(a.explicit_states().is_empty());
        assert_eq!(
            AluaState::Standby.worse(AluaState::ActiveNonOptimized),
            AluaState::Standby
        );
    }

    #[test]
    fn parameter_lists_are_validated_as_a_whole() {
        let a = Alua::new(&ports(), &[]);
        let desc = |state: u8, group: u16| {
            let g = group.to_be_bytes();
            [state, 0, g[0], g[1]]
        };
        let list = |descs: &[[u8; 4]]| {
            let mut v = vec![0u8; 4];
            for d in descs {
                v.extend_from_slice(d);
            }
            v
        };
        // zero length: no change, no data needed
        assert!(a.parse_set(&stpg(0), &[]).unwrap().is_empty());
        // header only: no change
        assert!(a.parse_set(&stpg(4), &[0; 4]).unwrap().is_empty());
        // truncated header or descriptor
        for len in [1u32, 3, 6, 9] {
            let s = sense(a.parse_set(&stpg(len), &[0; 16]).unwrap_err());
            assert_eq!((s.key, s.asc, s.ascq), (5, 0x1a, 0), "length {len}");
        }
        // fewer Data-Out bytes than the parameter list length
        let s = sense(a.parse_set(&stpg(8), &[0; 4]).unwrap_err());
        assert_eq!((s.asc, s.ascq), (0x0e, 0x03));
        // good list, trailing data beyond the length ignored
        let mut p = list(&[desc(2, 2), desc(0x01, 1)]);
        p.extend_from_slice(&[0xff; 4]);
        assert_eq!(
            a.parse_set(&stpg(12), &p).unwrap(),
            vec![(2, AluaState::Standby), (1, AluaState::ActiveNonOptimized)]
        );
        // reserved high bits of byte 0 are ignored
        assert_eq!(
            a.parse_set(&stpg(8), &list(&[desc(0xf3, 2)])).unwrap(),
            vec![(2, AluaState::Unavailable)]
        );
        // unknown group: field pointer at its TARGET PORT GROUP field
        let s = sense(
            a.parse_set(&stpg(12), &list(&[desc(2, 2), desc(2, 7)]))
                .unwrap_err(),
        );
        assert_eq!((s.key, s.asc, s.ascq), (5, 0x26, 0));
        assert_eq!(
            s.field_pointer.map(|f| (f.in_cdb, f.byte, f.bit)),
            Some((false, 10, None))
        );
        // unsupported states: logical block dependent, offline, transitioning, reserved
        for st in [0x4u8, 0x5, 0xe, 0xf] {
            let s = sense(a.parse_set(&stpg(8), &list(&[desc(st, 1)])).unwrap_err());
            assert_eq!((s.key, s.asc), (5, 0x26), "state {st:#x}");
            assert_eq!(s.field_pointer.map(|f| (f.byte, f.bit)), Some((4, Some(3))));
        }
        // one group named twice: the same state is fine, two states are not
        assert_eq!(
            a.parse_set(&stpg(12), &list(&[desc(2, 2), desc(2, 2)]))
                .unwrap()
                .len(),
            1
        );
        let s = sense(
            a.parse_set(&stpg(12), &list(&[desc(2, 2), desc(3, 2)]))
                .unwrap_err(),
        );
        assert_eq!((s.asc, s.field_pointer.map(|f| f.byte)), (0x26, Some(8)));
        // nothing was applied along the way
        assert!(a.explicit_states().is_empty());
    }

    #[test]
    fn explicit_states_persist_in_their_own_file() {
        let pr = temp_file("persist");
        let file = state_path(&pr);
        assert_eq!(file.file_name().unwrap(), "lun0.alua.json");
        assert_eq!(
            state_path(Path::new("/x/state")),
            PathBuf::from("/x/state.alua.json")
        );
        let a = Alua::new(&ports(), &[]);
        a.set_explicit(&[(2, AluaState::Standby)], Some(&file))
            .unwrap();
        a.set_explicit(&[(1, AluaState::ActiveNonOptimized)], Some(&file))
            .unwrap();
        assert!(!Path::new(&format!("{}.tmp", file.display())).exists());
        let b = Alua::new(&ports(), &[]);
        b.load_explicit(&file).unwrap();
        assert_eq!(
            b.explicit_states(),
            vec![(1, AluaState::ActiveNonOptimized), (2, AluaState::Standby)]
        );
        assert_eq!(state_of(&b, 2), AluaState::Standby);
        // a group the configuration no longer has is ignored
        let c = Alua::new(&ports()[..1], &[]);
        c.load_explicit(&file).unwrap();
        assert_eq!(
            c.explicit_states(),
            vec![(1, AluaState::ActiveNonOptimized)]
        );
        // no file: nothing explicit; a damaged one refuses to load
        let d = Alua::new(&ports(), &[]);
        d.load_explicit(&file.with_file_name("none.json")).unwrap();
        assert!(d.explicit_states().is_empty());
        std::fs::write(
            &file,
            b"{\"version\":1,\"explicit\":[{\"group\":1,\"state\":\"x\"}]}",
        )
        .unwrap();
        assert!(d.load_explicit(&file).is_err());
        // an unwritable file changes nothing
        let blocked = file.with_file_name("dir.alua.json");
        std::fs::create_dir_all(&blocked).unwrap();
        assert!(d
            .set_explicit(&[(2, AluaState::Standby)], Some(&blocked))
            .is_err());
        assert!(d.explicit_states().is_empty());
        let _ = std::fs::remove_dir_all(pr.parent().unwrap());
    }
}
