//! [`ScsiTarget`]: the logical units of one target device, command dispatch and the
//! task management entry points.
//!
//! Order of checks for a command to an existing LU (SAM-5 / SPC-4): CDB shape,
//! capacity change, unit attention (except INQUIRY, REPORT LUNS, REQUEST SENSE),
//! NACA, ALUA port state, reservations, stopped unit, then the command itself.

use crate::alua::{self, Alua};
use crate::cdb::{op, sa, Cdb};
use crate::lu::{into_response, CmdResult, Fail, LogicalUnit};
use crate::masking::{self, HostGroup, Masking};
use crate::pr::{Access, NexusId};
use crate::sense::{codes, Sense};
use crate::stats::{Direction, LuStats};
use crate::thin::LuEvent;
use crate::{
    admin, capacity, copy, inquiry, mode, opcodes, provisioning, replication, rw, sanitize,
    AluaState, Command, ItNexus, LunConfig, PortGroup, PrReplication, Response, ScsiError,
    TargetConfig, TargetPort,
};
use crate::{CopyReach, ResetKind, TaskAbort};
use block::{Bytes, VolumeRef};
use parking_lot::RwLock;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// A SCSI target device: the logical units behind one iSCSI target.
pub struct ScsiTarget {
    config: TargetConfig,
    /// The logical units, in LUN order; LUNs are added and removed at run time
    /// ([`ScsiTarget::add_lun`], [`ScsiTarget::remove_lun`]), so a command holds its
    /// LU by reference count, not by this lock.
    luns: RwLock<Vec<Arc<LogicalUnit>>>,
    alua: Alua,
    /// This node's ports now (the configuration's, then as
    /// [`ScsiTarget::set_ports`] changed them).
    ports: RwLock<Arc<Vec<TargetPort>>>,
    /// Every target port of the device, for ALL_TG_PT, SPEC_I_PT and REGISTER AND MOVE:
    /// this node's ports plus every other port of every port group (the HA partner's).
    pr_ports: RwLock<Arc<Vec<TargetPort>>>,
    /// EXTENDED COPY bounds and held copy statuses.
    copies: copy::Copies,
    /// Host groups (LUN masking); consulted only while `masked` is set.
    masking: RwLock<Arc<Masking>>,
    masked: AtomicBool,
    /// Who the transport admits to the target, as it describes it
    /// ([`ScsiTarget::set_admission`]), for [`ScsiTarget::access_lines`].
    admission: RwLock<Vec<String>>,
    /// The transport's hook for PREEMPT AND ABORT.
    task_abort: RwLock<Option<Arc<dyn TaskAbort>>>,
    /// The transport's answer to which other targets a copy may reach.
    copy_reach: RwLock<Option<Arc<dyn CopyReach>>>,
    /// Operator events of the LUs ([`ScsiTarget::subscribe_events`]).
    events: tokio::sync::broadcast::Sender<LuEvent>,
}

/// This node's `ports`, then a port for every relative port id that only a port
/// group names (the partner node's ports in an HA pair), named like iSCSI target
/// ports of target `name`.
fn all_target_ports(name: &str, ports: &[TargetPort], groups: &[PortGroup]) -> Vec<TargetPort> {
    let mut all = ports.to_vec();
    for g in groups {
        for &rel in &g.relative_port_ids {
            if !all.iter().any(|p| p.relative_id == rel) {
                all.push(TargetPort {
                    relative_id: rel,
                    group_id: g.id,
                    name: format!("{name},t,0x{rel:04x}"),
                });
            }
        }
    }
    all
}

/// Refuses a port list with a relative port id twice.
fn check_unique_ports(ports: &[TargetPort]) -> Result<(), ScsiError> {
    let mut rel_ids: Vec<u16> = ports.iter().map(|p| p.relative_id).collect();
    rel_ids.sort_unstable();
    if rel_ids.windows(2).any(|w| w[0] == w[1]) {
        return Err(ScsiError::Config(
            "duplicate relative target port id".into(),
        ));
    }
    Ok(())
}

/// Refuses a LUN that `luns` already has or that flat addressing cannot reach.
fn check_new_lun(luns: &[Arc<LogicalUnit>], lun: u64) -> Result<(), ScsiError> {
    if luns.iter().any(|l| l.lun == lun) {
        return Err(ScsiError::Config(format!("lun {lun} is configured twice")));
    }
    if lun >= 0x4000 {
        return Err(ScsiError::Config(format!(
            "lun {lun} is beyond flat addressing (16383)"
        )));
    }
    Ok(())
}

/// The unit attention that sense data (fixed or descriptor format) reports.
fn unit_attention_of(b: &[u8]) -> Option<Sense> {
    let (key, asc, ascq) = match b.first()? & 0x7f {
        0x70 | 0x71 if b.len() >= 14 => (b[2] & 0x0f, b[12], b[13]),
        0x72 | 0x73 if b.len() >= 4 => (b[1] & 0x0f, b[2], b[3]),
        _ => return None,
    };
    (key == crate::sense::key::UNIT_ATTENTION).then(|| Sense::new(key, asc, ascq))
}

/// Commands that neither report nor consume a unit attention (SAM-5 5.14).
fn ua_exempt(opcode: u8) -> bool {
    matches!(opcode, op::INQUIRY | op::REPORT_LUNS | op::REQUEST_SENSE)
}

/// Most operator events queued for a slow subscriber.
const EVENTS_QUEUED_MAX: usize = 256;

/// What a command with this operation code counts as in the LU's statistics.
fn direction(opcode: Option<u8>) -> Direction {
    match opcode {
        Some(op::READ_6 | op::READ_10 | op::READ_12 | op::READ_16) => Direction::Read,
        Some(o) if allocates(o).is_some() && o != op::UNMAP => Direction::Write,
        _ => Direction::Other,
    }
}

/// Commands that may change how much space a thin LU holds: Some(true) for those
/// after which its use is sampled at once (UNMAP frees, WRITE SAME may allocate
/// far more than it carries), Some(false) for those counted by their data.
fn allocates(opcode: u8) -> Option<bool> {
    match opcode {
        op::WRITE_6
        | op::WRITE_10
        | op::WRITE_12
        | op::WRITE_16
        | op::WRITE_VERIFY_10
        | op::WRITE_VERIFY_12
        | op::WRITE_VERIFY_16
        | op::COMPARE_AND_WRITE
        | op::ORWRITE_16
        | op::WRITE_ATOMIC_16 => Some(false),
        op::WRITE_SAME_10 | op::WRITE_SAME_16 | op::UNMAP => Some(true),
        _ => None,
    }
}

/// SANITIZE is offered on LUs not replicated to an HA partner (see `sanitize`).
pub(crate) fn sanitize_offered(lu: &LogicalUnit) -> bool {
    lu.pr_replication.read().is_none()
}

/// Commands that touch the medium and so fail on a stopped unit.
fn media_access(opcode: u8, service_action: u8) -> bool {
    allocates(opcode).is_some()
        || matches!(
            opcode,
            op::TEST_UNIT_READY
                | op::READ_6
                | op::READ_10
                | op::READ_12
                | op::READ_16
                | op::VERIFY_10
                | op::VERIFY_12
                | op::VERIFY_16
                | op::PRE_FETCH_10
                | op::PRE_FETCH_16
                | op::SYNC_CACHE_10
                | op::SYNC_CACHE_16
                | op::EXTENDED_COPY
        )
        || (opcode == op::SERVICE_ACTION_IN_16 && service_action == sa::GET_LBA_STATUS)
}

impl Drop for ScsiTarget {
    /// A sanitize still running stops with the target (the node stops); its
    /// record makes the next start run it again.
    fn drop(&mut self) {
        for lu in self.luns.read().iter() {
            lu.sanitize.stop_job();
        }
    }
}

impl ScsiTarget {
    /// Builds the target; loads persisted state (APTPL reservations) from each LUN's state file.
    pub fn new(config: TargetConfig) -> Result<Self, ScsiError> {
        let (events, _) = tokio::sync::broadcast::channel(EVENTS_QUEUED_MAX);
        let mut luns: Vec<Arc<LogicalUnit>> = Vec::with_capacity(config.luns.len());
        for (lun, cfg, vol) in &config.luns {
            check_new_lun(&luns, *lun)?;
            let alua = Alua::new(&config.ports, &config.port_groups);
            luns.push(Arc::new(LogicalUnit::new(
                *lun,
                cfg.clone(),
                vol.clone(),
                alua,
                events.clone(),
            )?));
        }
        luns.sort_by_key(|l| l.lun);
        check_unique_ports(&config.ports)?;
        for lu in &luns {
            crate::sanitize::resume(lu);
            crate::copy_resume::resume(lu, &luns);
        }
        let alua = Alua::new(&config.ports, &config.port_groups);
        let pr_ports = all_target_ports(&config.name, &config.ports, &config.port_groups);
        Ok(ScsiTarget {
            ports: RwLock::new(Arc::new(config.ports.clone())),
            config,
            luns: RwLock::new(luns),
            alua,
            pr_ports: RwLock::new(Arc::new(pr_ports)),
            copies: copy::Copies::default(),
            masking: RwLock::new(Arc::new(Masking::default())),
            masked: AtomicBool::new(false),
            admission: RwLock::new(Vec::new()),
            task_abort: RwLock::new(None),
            copy_reach: RwLock::new(None),
            events,
        })
    }

    /// Operator events of every LU (thin threshold reached, out of space), for
    /// the control plane's event log. A subscriber that lags loses the oldest.
    pub fn subscribe_events(&self) -> tokio::sync::broadcast::Receiver<LuEvent> {
        self.events.subscribe()
    }

    /// Sets `lun`'s thin provisioning soft threshold to `percent` of the space it
    /// can reach (its capacity, or less on a smaller file system); None or 0
    /// turns it off. The use is sampled at once. False if no such LUN.
    pub fn set_thin_threshold(&self, lun: u64, percent: Option<u8>) -> bool {
        let Some(lu) = self.lu(lun) else {
            return false;
        };
        lu.thin.set(percent);
        lu.thin_written(0, true, false);
        true
    }

    /// `lun`'s thin provisioning soft threshold in percent, if one is set.
    pub fn thin_threshold(&self, lun: u64) -> Option<u8> {
        self.lu(lun).and_then(|l| l.thin.get())
    }

    /// The configuration the target was built with (its `luns` and `ports` are
    /// those it started with; see [`ScsiTarget::lun_ids`] and
    /// [`ScsiTarget::ports`] for the current ones).
    pub fn config(&self) -> &TargetConfig {
        &self.config
    }

    /// This node's target ports now.
    pub fn ports(&self) -> Arc<Vec<TargetPort>> {
        self.ports.read().clone()
    }

    /// Makes `ports` this node's target ports while the target serves (portals
    /// added or removed by a configuration reload): a port that is no longer
    /// listed leaves its ALUA group, a new one joins the group it names, on the
    /// target and on every LU, with the group's states untouched. Device
    /// identification (VPD 83h) and REPORT TARGET PORT GROUPS answer with the
    /// new ports from the next command; persistent reservations registered
    /// through a removed port stay (their I_T nexus may come back). Err, and
    /// nothing changes, if a relative port id is listed twice or a port names a
    /// group the target does not have.
    pub fn set_ports(&self, ports: Vec<TargetPort>) -> Result<(), ScsiError> {
        check_unique_ports(&ports)?;
        if let Some(p) = ports.iter().find(|p| !self.alua.has_group(p.group_id)) {
            return Err(ScsiError::Config(format!(
                "port {} names port group {}, which target {} does not have",
                p.relative_id, p.group_id, self.config.name
            )));
        }
        let mut cur = self.ports.write();
        let gone: Vec<u16> = cur
            .iter()
            .filter(|o| !ports.iter().any(|p| p.relative_id == o.relative_id))
            .map(|o| o.relative_id)
            .collect();
        let added: Vec<TargetPort> = ports
            .iter()
            .filter(|p| !cur.iter().any(|o| o == *p))
            .cloned()
            .collect();
        if gone.is_empty() && added.is_empty() {
            return Ok(());
        }
        self.alua.retarget(&gone, &added);
        for lu in self.all_lus() {
            lu.alua.retarget(&gone, &added);
        }
        let pr = all_target_ports(&self.config.name, &ports, &self.alua.groups());
        *self.pr_ports.write() = Arc::new(pr);
        tracing::info!(target = %self.config.name, removed = ?gone,
            added = ?added.iter().map(|p| p.relative_id).collect::<Vec<_>>(),
            "target ports changed");
        *cur = Arc::new(ports);
        Ok(())
    }

    #[inline]
    fn lu(&self, lun: u64) -> Option<Arc<LogicalUnit>> {
        self.luns.read().iter().find(|l| l.lun == lun).cloned()
    }

    /// Whether a client that is no I_T nexus of this target (an NBD client)
    /// may read (`write` false) or write `lun` now: it is held to the LU's
    /// reservations as an initiator that never registered (SPC-4 5.13.1), so
    /// a reservation that fences unregistered initiators (write exclusive or
    /// exclusive access, of any type) fences it too. False for a LUN this
    /// target does not have, and for every LUN while host groups are set: such
    /// a client names no initiator, and under LUN masking an initiator no
    /// group names sees nothing.
    pub fn unregistered_access(&self, lun: u64, write: bool) -> bool {
        if self.masked.load(Ordering::Acquire) {
            return false;
        }
        let Some(lu) = self.lu(lun) else {
            return false;
        };
        // relative port 0: no target port has it, so no iSCSI nexus is this one
        static NEXUS: std::sync::LazyLock<ItNexus> = std::sync::LazyLock::new(|| ItNexus {
            initiator_name: Arc::from("nbd"),
            initiator_port: Arc::from("nbd,i,0x000000000000"),
            relative_port_id: 0,
            chap_user: None,
        });
        // READ(10) / WRITE(10) of one block: the commands' classes are what count
        let cdb: [u8; 10] = [if write { 0x2a } else { 0x28 }, 0, 0, 0, 0, 0, 0, 0, 1, 0];
        // the LU's own gates too: while a copy recorded before a restart runs
        // again (or its record could not be removed) no command may see the
        // blocks, or it would overwrite what this client wrote meanwhile; a
        // sanitize erases what a write puts there; a stopped unit serves none
        lu.intents.gate(cdb[0]).is_ok()
            && lu.sanitize.gate(cdb[0], true).is_ok()
            && !lu.stopped.load(Ordering::Relaxed)
            && lu.pr.check(&NEXUS, &cdb) == Access::Allowed
    }

    /// Whether a client that is no I_T nexus of this target (an NBD client)
    /// may know that `lun` exists: not while host groups are set (under LUN
    /// masking an initiator no group names sees nothing, and such a client
    /// names no initiator), nor for a LUN this target does not have.
    pub fn nbd_visible(&self, lun: u64) -> bool {
        !self.masked.load(Ordering::Acquire) && self.lu(lun).is_some()
    }

    /// A snapshot of the logical units (for walks that must not hold the lock).
    fn all_lus(&self) -> Vec<Arc<LogicalUnit>> {
        self.luns.read().clone()
    }

    /// Size in bytes of `lun` now; None if there is no such LUN.
    pub fn lun_size_bytes(&self, lun: u64) -> Option<u64> {
        self.lu(lun).map(|l| l.geometry().size_bytes())
    }

    /// The lock ordering LUN `lun`'s changes (shared by writes, exclusive
    /// for a read-modify-write such as COMPARE AND WRITE): for the node's
    /// other frontends of the same volume (NBD). None if there is no such LUN.
    pub fn lun_write_order(&self, lun: u64) -> Option<Arc<tokio::sync::RwLock<()>>> {
        self.lu(lun).map(|l| l.write_order.clone())
    }

    /// The volume LUN `lun` serves; None if there is no such LUN.
    pub fn lun_volume(&self, lun: u64) -> Option<VolumeRef> {
        self.lu(lun).map(|l| l.volume.clone())
    }

    /// The LUNs the target has now, in order.
    pub fn lun_ids(&self) -> Vec<u64> {
        self.luns.read().iter().map(|l| l.lun).collect()
    }

    /// Adds logical unit `lun` while the target serves, its persistent reservations
    /// linked to the HA partner from the first command when `pr` is given (see
    /// [`ScsiTarget::set_pr_replication`]): every I_T nexus of the other LUs gets
    /// REPORTED LUNS DATA HAS CHANGED, so initiators rescan. Err if the LUN exists
    /// or is out of range, or its volume or state cannot be used.
    pub fn add_lun(
        &self,
        lun: u64,
        cfg: LunConfig,
        volume: VolumeRef,
        pr: Option<Arc<dyn PrReplication>>,
    ) -> Result<(), ScsiError> {
        let alua = Alua::new(&self.ports(), &self.alua.groups());
        let lu = Arc::new(LogicalUnit::new(
            lun,
            cfg,
            volume,
            alua,
            self.events.clone(),
        )?);
        *lu.pr_replication.write() = pr;
        crate::sanitize::resume(&lu);
        let others = {
            let mut luns = self.luns.write();
            check_new_lun(&luns, lun)?;
            let others = luns.clone();
            luns.push(lu.clone());
            luns.sort_by_key(|l| l.lun);
            crate::copy_resume::resume(&lu, &luns);
            others
        };
        tracing::info!(target = %self.config.name, lun, "logical unit added");
        for lu in others {
            lu.uas.raise_all(codes::REPORTED_LUNS_DATA_CHANGED, None);
        }
        Ok(())
    }

    /// Removes logical unit `lun` while the target serves: commands already running
    /// on it finish, new ones get LOGICAL UNIT NOT SUPPORTED, and the other LUs'
    /// nexuses get REPORTED LUNS DATA HAS CHANGED. Returns once no change of
    /// its medium is in flight (its commands' writes, copies writing it from
    /// other LUs' commands, which stop as at a reset) and its volume is
    /// flushed: before (review of 2026-12-06), a write already running was
    /// acknowledged after the final flush and after the delete answered, its
    /// disk by then given back to the free disks. Returns the volume, or None
    /// if there is no such LUN.
    pub async fn remove_lun(&self, lun: u64) -> Option<VolumeRef> {
        let (gone, others) = {
            let mut luns = self.luns.write();
            let i = luns.iter().position(|l| l.lun == lun)?;
            let gone = luns.remove(i);
            (gone, luns.clone())
        };
        tracing::info!(target = %self.config.name, lun, "logical unit removed");
        gone.sanitize.stop_job();
        self.copies.tokens.revoke_lu(&gone);
        for lu in others {
            lu.uas.raise_all(codes::REPORTED_LUNS_DATA_CHANGED, None);
        }
        gone.resets.fetch_add(1, Ordering::AcqRel);
        self.stop_copies(&gone, Some(&gone)).await;
        if !gone.changes_stopped().await {
            tracing::error!(
                lun,
                "writes to a removed LUN did not end within the wait: \
                they may land after the removal (a disk that stalls)"
            );
        }
        if let Err(e) = gone.volume.flush().await {
            tracing::error!(lun, error = %e, "flush of a removed LUN failed");
        }
        Some(gone.volume.clone())
    }

    /// Current ALUA target port groups (states as changed at run time for the whole
    /// target; see [`ScsiTarget::lun_port_groups`] for one LU's).
    pub fn port_groups(&self) -> Vec<PortGroup> {
        self.alua.groups()
    }

    /// The port groups as LU `lun` reports them (effective states: the worse of the
    /// implicit and the explicit one); None if no such LUN.
    pub fn lun_port_groups(&self, lun: u64) -> Option<Vec<PortGroup>> {
        self.lu(lun).map(|l| l.alua.groups())
    }

    /// Changes the implicit ALUA state of a target port group for LU `lun` only (the
    /// paths of one replicated LUN follow its own replication state) and, if the
    /// state the LU reports changed (the worse of the implicit and the explicit
    /// state: see the `alua` module), establishes ASYMMETRIC ACCESS STATE CHANGED on
    /// that LU's I_T nexuses. False if no such LUN or group.
    pub fn set_lun_port_group_state(&self, lun: u64, group_id: u16, state: AluaState) -> bool {
        let Some(lu) = self.lu(lun) else {
            return false;
        };
        let before = lu
            .alua
            .groups()
            .iter()
            .find(|g| g.id == group_id)
            .map(|g| g.state);
        if !lu.alua.set_state(group_id, state) {
            return false;
        }
        if before != Some(state) {
            tracing::info!(lun, group_id, ?state, "ALUA state changed");
            lu.uas.raise_all(codes::ALUA_STATE_CHANGED, None);
        }
        true
    }

    /// Changes the implicit ALUA state of a target port group for every LU (and LUs
    /// added later) and establishes ASYMMETRIC ACCESS STATE CHANGED on every I_T nexus
    /// of every LU. False if no such group.
    pub fn set_port_group_state(&self, group_id: u16, state: AluaState) -> bool {
        if !self.alua.set_state(group_id, state) {
            return false;
        }
        tracing::info!(group_id, ?state, "ALUA state changed");
        for lu in self.all_lus() {
            lu.alua.set_state(group_id, state);
            lu.uas.raise_all(codes::ALUA_STATE_CHANGED, None);
        }
        true
    }

    /// The explicit ALUA states of LU `lun` (group, state), as SET TARGET PORT GROUPS
    /// set them (see the `alua` module for how they combine with the implicit ones);
    /// None if no such LUN.
    pub fn lun_explicit_alua(&self, lun: u64) -> Option<Vec<(u16, AluaState)>> {
        self.lu(lun).map(|l| l.alua.explicit_states())
    }

    /// Sends `lun`'s explicit ALUA states to the partner through the LU's
    /// [`PrReplication::push_alua_state`], ordered with this node's SET TARGET PORT
    /// GROUPS (for a node handing its state to a rejoining partner). Err if no such
    /// LUN, no replication is set, or the push failed.
    pub async fn push_alua_state(&self, lun: u64) -> Result<(), String> {
        let lu = self
            .lu(lun)
            .ok_or_else(|| format!("lun {lun} does not exist"))?;
        let repl = lu.pr_replication.read().clone();
        let repl = repl.ok_or_else(|| format!("lun {lun} has no replication"))?;
        let _order = lu.alua_order.lock().await;
        repl.push_alua_state(lun, None, &lu.alua.explicit_states())
            .await
    }

    /// Replaces `lun`'s explicit ALUA states with `states` (from the partner's
    /// [`PrReplication::push_alua_state`]) and persists them like a local change; if
    /// they changed, every I_T nexus but `origin` (initiator port, relative target
    /// port id of the nexus that sent the SET TARGET PORT GROUPS) gets ASYMMETRIC
    /// ACCESS STATE CHANGED. Groups this target does not have are ignored.
    pub fn install_alua_state(
        &self,
        lun: u64,
        origin: Option<(&str, u16)>,
        states: &[(u16, AluaState)],
    ) -> Result<(), ScsiError> {
        let lu = self
            .lu(lun)
            .ok_or_else(|| ScsiError::Config(format!("lun {lun} does not exist")))?;
        let origin = origin.map(|(port, rel)| alua::nexus_of(port, rel));
        alua::install(&lu, origin.as_ref(), states)
    }

    /// Applies the validated `changes` of a SET TARGET PORT GROUPS that the partner
    /// forwarded ([`PrReplication::forward_set_tpg`]) from its I_T nexus `origin`
    /// (initiator port, relative target port id): ordered with this node's own, and
    /// pushed to the partner like them before returning. Err: why not (nothing
    /// changed when the state file could not be written).
    pub async fn set_target_port_groups_here(
        &self,
        lun: u64,
        origin: (&str, u16),
        changes: &[(u16, AluaState)],
    ) -> Result<(), String> {
        let lu = self
            .lu(lun)
            .ok_or_else(|| format!("lun {lun} does not exist"))?;
        let origin = alua::nexus_of(origin.0, origin.1);
        alua::apply_here(&lu, Some(&origin), changes, true)
            .await
            .map_err(|s| format!("sense {:x}/{:02x}/{:02x}", s.key, s.asc, s.ascq))
    }

    /// Whether `lun` currently runs with its volatile write cache enabled (WCE);
    /// None when there is no such LUN.
    pub fn write_cache_enabled(&self, lun: u64) -> Option<bool> {
        self.lu(lun).map(|l| !l.force_fua())
    }

    /// Replaces the target's host groups (LUN masking; none: every initiator sees
    /// every LU under its own number). Every I_T nexus of every LU gets REPORTED
    /// LUNS DATA HAS CHANGED. Err, and nothing changes, if the groups contradict
    /// each other (see [`HostGroup`]).
    pub fn set_host_groups(&self, groups: Vec<HostGroup>) -> Result<(), ScsiError> {
        let m = Masking::new(groups)?;
        let active = m.active();
        {
            let mut cur = self.masking.write();
            if cur.groups() == m.groups() {
                return Ok(());
            }
            *cur = Arc::new(m);
            self.masked.store(active, Ordering::Release);
        }
        tracing::info!(target = %self.config.name, "host groups changed");
        for lu in self.all_lus() {
            lu.uas.raise_all(codes::REPORTED_LUNS_DATA_CHANGED, None);
        }
        self.access_changed();
        Ok(())
    }

    /// Records who the transport admits to the target (its initiator ACL, whether
    /// it asks for CHAP...), one line each, for [`ScsiTarget::access_lines`]; the
    /// SCSI layer does not act on them.
    pub fn set_admission(&self, mut lines: Vec<String>) {
        lines.sort();
        lines.dedup();
        {
            let mut cur = self.admission.write();
            if *cur == lines {
                return;
            }
            *cur = lines;
        }
        self.access_changed();
    }

    /// Who may reach LUN `lun`, one line each, sorted, in a form that two nodes
    /// serving it compare ([`PrReplication::access_changed`]): the admission
    /// rules, then the members of each host group that maps it and the number
    /// it shows under there (group names do not count), or that no group maps
    /// it, or that the target has no host groups. None if no such LUN.
    pub fn access_lines(&self, lun: u64) -> Option<Vec<String>> {
        self.lu(lun)?;
        let mut out: Vec<String> = self
            .admission
            .read()
            .iter()
            .map(|l| format!("admit {l}"))
            .collect();
        if !self.masked.load(Ordering::Acquire) {
            out.push("no host groups".into());
            return Some(out);
        }
        let mut groups: Vec<String> = Vec::new();
        for g in self.masking.read().groups() {
            for &(seen, _) in g.luns.iter().filter(|&&(_, t)| t == lun) {
                // as masking matches them: initiator names folded, each once
                let mut initiators: Vec<String> = g
                    .initiators
                    .iter()
                    .map(|i| i.to_ascii_lowercase())
                    .collect();
                initiators.sort();
                initiators.dedup();
                let mut chap = g.chap_users.clone();
                chap.sort();
                chap.dedup();
                groups.push(format!(
                    "seen as LUN {seen} by initiators [{}] and CHAP users [{}]",
                    initiators.join(", "),
                    chap.join(", ")
                ));
            }
        }
        if groups.is_empty() {
            groups.push("mapped by no host group".into());
        }
        groups.sort();
        out.extend(groups);
        Some(out)
    }

    /// Tells every LU's partner link that who may reach it changed.
    fn access_changed(&self) {
        for lu in self.all_lus() {
            if let Some(r) = lu.pr_replication.read().clone() {
                r.access_changed();
            }
        }
    }

    /// The host groups in force.
    pub fn host_groups(&self) -> Vec<HostGroup> {
        self.masking.read().groups().to_vec()
    }

    /// Whether some initiator may see the target's LUN `lun`: always without host
    /// groups, else when a group maps it.
    pub fn lun_mapped(&self, lun: u64) -> bool {
        !self.masked.load(Ordering::Acquire)
            || self
                .masking
                .read()
                .groups()
                .iter()
                .any(|g| g.luns.iter().any(|&(_, t)| t == lun))
    }

    /// The target's LUN that `nexus` calls `lun`; None if it sees no such LUN.
    #[inline]
    pub fn target_lun(&self, nexus: &ItNexus, lun: u64) -> Option<u64> {
        if !self.masked.load(Ordering::Acquire) {
            return Some(lun);
        }
        let view = self.masking.read().view(nexus);
        masking::to_target(&view, lun)
    }

    /// Sets which other targets of the node this target's EXTENDED COPY commands
    /// may reach (the transport decides; without it, none).
    pub fn set_copy_reach(&self, r: Arc<dyn CopyReach>) {
        *self.copy_reach.write() = Some(r);
    }

    /// The transport's hook that aborts tasks for PREEMPT AND ABORT.
    pub fn set_task_abort(&self, a: Arc<dyn TaskAbort>) {
        *self.task_abort.write() = Some(a);
    }

    /// The number `nexus` knows the target's LUN `target_lun` by; None if it does
    /// not see it.
    pub fn seen_lun(&self, nexus: &ItNexus, target_lun: u64) -> Option<u64> {
        if !self.masked.load(Ordering::Acquire) {
            return Some(target_lun);
        }
        let view = self.masking.read().view(nexus);
        view.iter()
            .find(|&&(_, t)| t == target_lun)
            .map(|&(s, _)| s)
    }

    /// The LUNs `nexus` sees (its numbers) that exist now, in order.
    fn visible_luns(&self, nexus: &ItNexus) -> Vec<u64> {
        if !self.masked.load(Ordering::Acquire) {
            return self.lun_ids();
        }
        let view = self.masking.read().view(nexus);
        let have = self.lun_ids();
        let mut seen: Vec<u64> = view
            .iter()
            .filter(|(_, t)| have.contains(t))
            .map(|&(s, _)| s)
            .collect();
        seen.sort_unstable();
        seen
    }

    /// Whether `lu` is one of this target's LUs and `nexus` sees it now.
    fn sees(&self, nexus: &ItNexus, lu: &LogicalUnit) -> bool {
        let here = self
            .lu(lu.lun)
            .is_some_and(|l| std::ptr::eq(l.as_ref(), lu));
        here && (!self.masked.load(Ordering::Acquire)
            || self
                .masking
                .read()
                .view(nexus)
                .iter()
                .any(|&(_, t)| t == lu.lun))
    }

    /// The LUs `nexus` sees (for the copy targets of EXTENDED COPY).
    fn visible_lus(&self, nexus: &ItNexus) -> Vec<Arc<LogicalUnit>> {
        if !self.masked.load(Ordering::Acquire) {
            return self.all_lus();
        }
        let view = self.masking.read().view(nexus);
        self.all_lus()
            .into_iter()
            .filter(|l| view.iter().any(|&(_, t)| t == l.lun))
            .collect()
    }

    /// The node's other targets an EXTENDED COPY (or WRITE USING TOKEN) from
    /// `nexus` may reach, as the transport says; of each, the copy may name the
    /// LUs that target's masking shows its initiator.
    fn reached_targets(&self, nexus: &ItNexus) -> Vec<Arc<ScsiTarget>> {
        let Some(reach) = self.copy_reach.read().clone() else {
            return Vec::new();
        };
        let mut t = reach.targets(nexus);
        t.retain(|t| !std::ptr::eq(t.as_ref(), self));
        t
    }

    /// The copy manager's state: copies, held statuses and ROD tokens (also
    /// for the tests' ROD token clock).
    pub(crate) fn copies(&self) -> &copy::Copies {
        &self.copies
    }

    /// Executes one command from `nexus`. Never panics on any CDB or data.
    pub async fn execute(&self, nexus: &ItNexus, cmd: Command) -> Response {
        let Some(lu) = self.target_lun(nexus, cmd.lun).and_then(|lun| self.lu(lun)) else {
            return into_response(self.execute_no_lun(nexus, &cmd), false);
        };
        let flight = lu.counters.start();
        let r = self.execute_lu(&lu, nexus, &cmd).await;
        let dir = direction(cmd.cdb.first().copied());
        let (data_in, failed) = match &r {
            Ok(d) => (d.data_in.len(), false),
            Err(Fail::Forwarded(f)) => (f.data_in.len(), f.status != crate::status::GOOD),
            Err(_) => (0, true),
        };
        let bytes = match dir {
            _ if failed => 0,
            Direction::Read => data_in as u64,
            Direction::Write => cmd.data_out.len() as u64,
            Direction::Other => 0,
        };
        lu.counters.finish(flight, dir, bytes, failed);
        into_response(r, lu.descriptor_sense())
    }

    /// The transport never answered `resp`, the response of `cdb` to `lun`
    /// (the command was aborted after it ran): a unit attention it reported
    /// (CHECK CONDITION, or the data of REQUEST SENSE) was not reported after
    /// all and is established again, ahead of the others, unless a reset
    /// superseded it meanwhile. Says whether it was.
    pub fn unanswered(&self, nexus: &ItNexus, lun: u64, cdb: &[u8], resp: &Response) -> bool {
        let sense = match (resp.status, cdb.first()) {
            (crate::status::CHECK_CONDITION, _) => resp.sense.as_deref(),
            (crate::status::GOOD, Some(&op::REQUEST_SENSE)) => Some(&resp.data_in[..]),
            _ => None,
        };
        let Some(ua) = sense.and_then(unit_attention_of) else {
            return false;
        };
        match self.target_lun(nexus, lun).and_then(|l| self.lu(l)) {
            Some(lu) => lu.uas.restore(nexus, ua),
            None => false,
        }
    }

    /// Command counters of every LU, in LUN order (for metrics).
    pub fn lun_stats(&self) -> Vec<(u64, LuStats)> {
        self.luns
            .read()
            .iter()
            .map(|l| (l.lun, l.counters.snapshot()))
            .collect()
    }

    /// A command to a LUN that does not exist.
    fn execute_no_lun(&self, nexus: &ItNexus, cmd: &Command) -> CmdResult {
        let cdb = Cdb::parse(&cmd.cdb)?;
        match cdb.opcode() {
            op::INQUIRY => inquiry::inquiry(&self.config.name, &self.ports(), None, nexus, &cdb),
            op::REPORT_LUNS => admin::report_luns(&self.visible_luns(nexus), &cdb),
            op::REQUEST_SENSE => admin::request_sense(None, nexus, &cdb),
            _ => Err(codes::LUN_NOT_SUPPORTED.into()),
        }
    }

    async fn execute_lu(&self, lu: &Arc<LogicalUnit>, nexus: &ItNexus, cmd: &Command) -> CmdResult {
        let geo = lu.geometry();
        lu.check_capacity(&geo);
        let cdb = match Cdb::parse(&cmd.cdb) {
            Ok(c) => c,
            Err(s) => {
                // A malformed CDB still reports a pending unit attention first.
                return Err(lu.uas.pop(nexus).unwrap_or(s).into());
            }
        };
        let opcode = cdb.opcode();
        if !ua_exempt(opcode) && lu.uas.pending(nexus) {
            if let Some(ua) = lu.uas.pop(nexus) {
                return Err(ua.into());
            }
        }
        if cdb.control() & 0x04 != 0 {
            return Err(cdb.invalid((cdb.len_bytes() - 1) as u16, Some(2)).into());
        }
        lu.alua.check(nexus.relative_port_id, &cdb)?;
        lu.sanitize
            .gate(opcode, media_access(opcode, cdb.service_action()))?;
        lu.intents.gate(opcode)?;
        if lu.pr.check(nexus, cdb.as_slice()) == Access::Conflict {
            return Err(Fail::Conflict);
        }
        if media_access(opcode, cdb.service_action()) && lu.stopped.load(Ordering::Relaxed) {
            return Err(codes::NOT_READY_INIT_REQUIRED.into());
        }
        let r = self.dispatch(lu, nexus, &cdb, cmd).await;
        if let Some(force) = allocates(opcode) {
            let full = codes::SPACE_ALLOCATION_FAILED;
            let no_space = matches!(&r, Err(Fail::Check(s, _))
                if (s.key, s.asc, s.ascq) == (full.key, full.asc, full.ascq));
            lu.thin_written(cmd.data_out.len() as u64, force, no_space);
        }
        r
    }

    async fn dispatch(
        &self,
        lu: &Arc<LogicalUnit>,
        nexus: &ItNexus,
        cdb: &Cdb,
        cmd: &Command,
    ) -> CmdResult {
        let data = &cmd.data_out;
        match cdb.opcode() {
            op::READ_6 | op::READ_10 | op::READ_12 | op::READ_16 => {
                rw::read(lu, cdb, cmd.data_in_len_max).await
            }
            op::WRITE_6 | op::WRITE_10 | op::WRITE_12 | op::WRITE_16 => {
                rw::write(lu, cdb, data).await
            }
            op::TEST_UNIT_READY => Ok(Default::default()),
            op::INQUIRY => inquiry::inquiry(&self.config.name, &self.ports(), Some(lu), nexus, cdb),
            op::REQUEST_SENSE => admin::request_sense(Some(lu), nexus, cdb),
            op::REPORT_LUNS => admin::report_luns(&self.visible_luns(nexus), cdb),
            op::READ_CAPACITY_10 => capacity::read_capacity_10(lu, cdb),
            op::SERVICE_ACTION_IN_16 => match cdb.service_action() {
                sa::READ_CAPACITY_16 => capacity::read_capacity_16(lu, cdb),
                sa::GET_LBA_STATUS => capacity::get_lba_status(lu, cdb).await,
                _ => Err(cdb.invalid(1, Some(4)).into()),
            },
            op::MAINTENANCE_IN => match cdb.service_action() {
                sa::REPORT_TARGET_PORT_GROUPS => lu.alua.report(cdb),
                sa::REPORT_SUPPORTED_OPCODES => opcodes::report_supported_opcodes(
                    cdb,
                    lu.geometry().thin,
                    lu.volume.atomic_write_max_blocks() > 0,
                    sanitize_offered(lu),
                ),
                sa::REPORT_SUPPORTED_TMFS => opcodes::report_supported_tmfs(cdb),
                _ => Err(cdb.invalid(1, Some(4)).into()),
            },
            op::MAINTENANCE_OUT => match cdb.service_action() {
                sa::SET_TARGET_PORT_GROUPS => {
                    alua::set_target_port_groups(lu, nexus, cdb, data).await
                }
                _ => Err(cdb.invalid(1, Some(4)).into()),
            },
            op::MODE_SENSE_6 | op::MODE_SENSE_10 => mode::mode_sense(lu, cdb),
            op::MODE_SELECT_6 | op::MODE_SELECT_10 => mode::mode_select(lu, nexus, cdb, data),
            op::WRITE_VERIFY_10 | op::WRITE_VERIFY_12 | op::WRITE_VERIFY_16 => {
                rw::write_verify(lu, cdb, data).await
            }
            op::VERIFY_10 | op::VERIFY_12 | op::VERIFY_16 => rw::verify(lu, cdb, data).await,
            op::COMPARE_AND_WRITE => rw::compare_and_write(lu, cdb, data).await,
            op::ORWRITE_16 => rw::orwrite(lu, cdb, data).await,
            op::WRITE_ATOMIC_16 => rw::write_atomic(lu, cdb, data).await,
            op::PRE_FETCH_10 | op::PRE_FETCH_16 => rw::prefetch(lu, cdb).await,
            op::SYNC_CACHE_10 | op::SYNC_CACHE_16 => rw::sync_cache(lu, cdb).await,
            op::WRITE_SAME_10 | op::WRITE_SAME_16 => provisioning::write_same(lu, cdb, data).await,
            op::UNMAP => provisioning::unmap(lu, cdb, data).await,
            op::SANITIZE => sanitize::sanitize(lu, cdb, data, sanitize_offered(lu)).await,
            op::START_STOP_UNIT => admin::start_stop_unit(lu, cdb).await,
            op::PREVENT_ALLOW => admin::prevent_allow(lu, nexus, cdb),
            op::READ_DEFECT_DATA_10 | op::READ_DEFECT_DATA_12 => admin::read_defect_data(cdb),
            op::RESERVE_6 | op::RESERVE_10 | op::RELEASE_6 | op::RELEASE_10 => {
                replication::reserve_release(lu, nexus, cdb, &cmd.cdb, true).await
            }
            op::PR_IN => admin::pr_in(lu, nexus, cdb),
            op::EXTENDED_COPY => {
                let reached = self.reached_targets(nexus);
                let sees = |l: &LogicalUnit, foreign: bool| match foreign {
                    false => self.sees(nexus, l),
                    true => self.reached_targets(nexus).iter().any(|t| t.sees(nexus, l)),
                };
                let lus = copy::CopyLus {
                    own: self.visible_lus(nexus),
                    foreign: reached.iter().flat_map(|t| t.visible_lus(nexus)).collect(),
                    reached,
                    sees: &sees,
                };
                copy::extended_copy(&self.copies, lu, &lus, nexus, cdb, data).await
            }
            op::RECEIVE_COPY_RESULTS => copy::receive_copy_results(&self.copies, lu, nexus, cdb),
            op::PR_OUT => {
                let abort = self.task_abort.read().clone();
                let ports = self.pr_ports.read().clone();
                replication::pr_out(lu, nexus, cdb, &cmd.cdb, data, &ports, true, abort).await
            }
            _ => Err(codes::INVALID_OPCODE.into()),
        }
    }

    /// Connects `lun`'s persistent reservations to the HA partner node (replacing an
    /// earlier link). Only PERSISTENT RESERVE OUT consults it. False if no such LUN.
    pub fn set_pr_replication(&self, lun: u64, r: Arc<dyn PrReplication>) -> bool {
        let Some(lu) = self.lu(lun) else {
            return false;
        };
        *lu.pr_replication.write() = Some(r);
        true
    }

    /// `lun`'s reservation state (registrations, reservation, PRgeneration, APTPL,
    /// and the SPC-2 reservation's holder) as JSON in the state file's format, for
    /// [`ScsiTarget::install_pr_state`] on the partner; None if no such LUN.
    pub fn pr_state(&self, lun: u64) -> Option<Bytes> {
        self.lu(lun).map(|l| l.pr.state())
    }

    /// Sends `lun`'s whole persistent-reservation state (a [`ScsiTarget::pr_state`]
    /// snapshot) to the partner through the LU's [`PrReplication::push_state`], ordered
    /// with this node's PR OUTs: no PR OUT runs between the snapshot and its push, so
    /// the partner cannot install it over a newer state (for a node handing its state
    /// to a rejoining partner). Err if no such LUN, no replication is set, or the push
    /// failed.
    pub async fn push_pr_state(&self, lun: u64) -> Result<(), String> {
        let lu = self
            .lu(lun)
            .ok_or_else(|| format!("lun {lun} does not exist"))?;
        let repl = lu.pr_replication.read().clone();
        let repl = repl.ok_or_else(|| format!("lun {lun} has no reservation replication"))?;
        replication::push_snapshot(&lu, repl.as_ref()).await
    }

    /// Replaces `lun`'s persistent-reservation state with `state` (from
    /// [`ScsiTarget::pr_state`] or [`PrReplication::push_state`] of the partner) and
    /// persists it like a local change. A pushed state carries the unit attentions its
    /// PR OUT established and they are queued for the I_T nexuses this node knows; a
    /// snapshot's are derived from the difference with the current state (see
    /// [`crate::pr`]'s `state_change_uas`). An unchanged state raises none. Does not wait
    /// for PR OUTs running here: only the node that orders PR changes should push.
    ///
    /// A state pushed after a PREEMPT AND ABORT names the preempted I_T nexuses: their
    /// tasks on this LU are aborted here too (through [`TaskAbort`]) before this returns,
    /// so the partner answers the command only once neither node runs them.
    pub async fn install_pr_state(&self, lun: u64, state: &[u8]) -> Result<(), ScsiError> {
        let lu = self
            .lu(lun)
            .ok_or_else(|| ScsiError::Config(format!("lun {lun} does not exist")))?;
        let (uas, aborts, unsaved) = lu.pr.install_state(state)?;
        for ua in uas {
            lu.uas
                .raise_for(&ua.initiator_port, ua.relative_port_id, ua.sense);
        }
        let aborter = self.task_abort.read().clone();
        crate::replication::abort_preempted(
            lun,
            &aborts,
            aborter.as_ref(),
            &lu.write_order,
            "on the partner",
        )
        .await;
        match unsaved {
            Some(e) => {
                tracing::error!(lun, error = %e, "reservation state installed but not persisted");
                Err(e)
            }
            None => Ok(()),
        }
    }

    /// Runs a PERSISTENT RESERVE OUT on this node without offering it to
    /// [`PrReplication::forward_out`]: on the leader, for a command the partner forwarded
    /// (`nexus` then goes through one of the partner's ports). Ordered with local PR OUTs
    /// and pushed like them. The unit attention, ALUA and control byte checks are the
    /// forwarding node's: they are not repeated here.
    pub async fn execute_pr_out_here(
        &self,
        lun: u64,
        nexus: &ItNexus,
        cdb: Bytes,
        data: Bytes,
    ) -> Response {
        let Some(lu) = self.lu(lun) else {
            return into_response(Err(codes::LUN_NOT_SUPPORTED.into()), false);
        };
        let r = match Cdb::parse(&cdb) {
            Ok(c) if c.opcode() == op::PR_OUT => {
                let abort = self.task_abort.read().clone();
                let ports = self.pr_ports.read().clone();
                replication::pr_out(&lu, nexus, &c, &cdb, &data, &ports, false, abort).await
            }
            Ok(c)
                if matches!(
                    c.opcode(),
                    op::RESERVE_6 | op::RESERVE_10 | op::RELEASE_6 | op::RELEASE_10
                ) =>
            {
                replication::reserve_release(&lu, nexus, &c, &cdb, false).await
            }
            Ok(_) => Err(codes::INVALID_OPCODE.into()),
            Err(s) => Err(s.into()),
        };
        into_response(r, lu.descriptor_sense())
    }

    /// On the node that orders `lun`'s changes, for the partner (see
    /// [`PrReplication::forward_spc2_end`]): ends the SPC-2 reservation if
    /// `holder` holds it (None: whoever does), in order with the PR OUTs, and
    /// installs the new state on the partner before returning.
    pub async fn end_spc2_here(&self, lun: u64, holder: Option<&NexusId>) -> Result<(), String> {
        let lu = self
            .lu(lun)
            .ok_or_else(|| format!("lun {lun} does not exist"))?;
        replication::end_spc2_here(&lu, holder).await
    }

    /// LOGICAL UNIT RESET task management function from `nexus`.
    pub async fn lun_reset(&self, nexus: &ItNexus, lun: u64) -> bool {
        let Some(lu) = self.target_lun(nexus, lun).and_then(|l| self.lu(l)) else {
            return false;
        };
        tracing::info!(lun, initiator = %nexus.initiator_port, "logical unit reset");
        self.reset_lu(lu, ResetKind::LogicalUnit).await;
        true
    }

    /// Resets `lu` for a reset of `kind` that came through this node: here,
    /// then the SPC-2 reservation ended and the partner told, both at once
    /// (each may wait for the partner); its tokens revoked and its copies
    /// stopped.
    async fn reset_lu(&self, lu: Arc<LogicalUnit>, kind: ResetKind) {
        // the tokens first: a WRITE USING TOKEN resolving one while the
        // partner is told took the reset's count as its baseline, and the
        // reset never stopped it (review of 2026-12-06)
        self.copies.tokens.revoke_lu(&lu);
        let cuts = self.copy_cuts(None);
        lu.reset(kind.sense());
        tokio::join!(
            replication::spc2_end_everywhere(lu.clone(), None),
            replication::reset_everywhere(lu.clone(), kind),
        );
        self.copies_stopped(&lu, cuts).await;
    }

    /// Shrinks `lun` to `blocks` (forced, for a LUN no host group maps): its
    /// ROD tokens revoked, its copies stopped (their restart records
    /// removed), then the volume shrinks with the LU's write order held
    /// exclusively, so a write or copy batch that passed its range check
    /// before ends first and none lands past the new end after it (review of
    /// 2026-12-06: the volume shrank under them, and on a file a write in
    /// flight extended it again, bringing cut data back at the next start).
    /// Refused if the writes do not end within the stop wait (a SANITIZE
    /// holds the write order to its end).
    pub async fn shrink_lun(&self, lun: u64, blocks: u64) -> Result<(), String> {
        let lu = self
            .lu(lun)
            .ok_or_else(|| format!("lun {lun} does not exist"))?;
        self.copies.tokens.revoke_lu(&lu);
        let cuts = self.copy_cuts(None);
        lu.resets.fetch_add(1, Ordering::AcqRel);
        self.copies_stopped(&lu, cuts).await;
        let Ok(_order) =
            tokio::time::timeout(crate::lu::STOP_WAIT, lu.write_order.clone().write_owned()).await
        else {
            return Err("its writes in flight did not end (a SANITIZE running?)".into());
        };
        lu.volume.shrink(blocks).await.map_err(|e| e.to_string())
    }

    /// The restart records (`copy_resume`) of every LU of the target now, as
    /// the id each LU's next record gets; `also` beside them (an LU just
    /// taken out of the list).
    fn copy_cuts(&self, also: Option<&Arc<LogicalUnit>>) -> Vec<(Arc<LogicalUnit>, u64)> {
        let mut lus = self.all_lus();
        lus.extend(also.cloned());
        lus.into_iter()
            .map(|l| {
                let cut = l.intents.cut();
                (l, cut)
            })
            .collect()
    }

    /// `lu`'s reset count went up (`cuts` taken before): waits for the batch
    /// its copies have in flight, then removes, durably, the restart records
    /// of the copies the reset stopped, those made before it that write `lu`
    /// or read it, before the reset is answered (`copy_resume::Intents::retire`).
    async fn copies_stopped(&self, lu: &Arc<LogicalUnit>, cuts: Vec<(Arc<LogicalUnit>, u64)>) {
        lu.copies_stopped().await;
        Self::retire_copies(lu, cuts).await;
    }

    /// The restart records part of [`Self::copies_stopped`], without waiting
    /// for the copies' writes in flight.
    async fn retire_copies(lu: &Arc<LogicalUnit>, cuts: Vec<(Arc<LogicalUnit>, u64)>) {
        let naa = crate::copy_resume::hex(&lu.config.naa);
        for (l, cut) in cuts {
            let src = (!Arc::ptr_eq(&l, lu)).then_some(naa.as_str());
            l.intents.retire(cut, src).await;
        }
    }

    /// [`Self::copies_stopped`] with the cuts taken now (the reset count was
    /// just raised; a record made in between is retired too, and its copy,
    /// which the reset may not stop, runs on without one: a crash leaves it
    /// half done, as an unrecorded copy, for the initiator to retry).
    async fn stop_copies(&self, lu: &Arc<LogicalUnit>, also: Option<&Arc<LogicalUnit>>) {
        let cuts = self.copy_cuts(also);
        self.copies_stopped(lu, cuts).await;
    }

    /// A reset of `kind` reached LUN `lun` through the HA partner: this
    /// node's tasks on the LU are aborted, as the partner aborted its own
    /// (SAM: a LOGICAL UNIT RESET aborts every task in the LU's task set,
    /// whichever node they came through), then every I_T nexus of the LU on
    /// this node gets its unit attention, PREVENT and the mode parameters
    /// return to their defaults, and copies into it stop (the SPC-2
    /// reservation is ended by the partner, in order with the reservation
    /// commands). Copies already writing are not waited for, so that the
    /// partner's answer does not wait on a disk. An error if some aborted
    /// task did not end within the drain time: the reset is then not done
    /// here (no unit attention raised), and the partner logs it.
    pub async fn reset_from_partner(&self, lun: u64, kind: ResetKind) -> Result<(), String> {
        let lu = self
            .lu(lun)
            .ok_or_else(|| format!("lun {lun} does not exist"))?;
        tracing::info!(lun, ?kind, "reset through the HA partner");
        let aborter = self.task_abort.read().clone();
        if let Some(a) = aborter {
            if !a.abort_lu_tasks(lun).await {
                return Err(format!(
                    "tasks on lun {lun} did not end within the drain time"
                ));
            }
        }
        self.copies.tokens.revoke_lu(&lu);
        let cuts = self.copy_cuts(None);
        lu.reset_but_reservations(kind.sense());
        Self::retire_copies(&lu, cuts).await;
        Ok(())
    }

    /// TARGET WARM/COLD RESET from `nexus`: every LU it sees (all of them
    /// without host groups; with them, an initiator never resets, and so
    /// never drops the reservations or tokens of, the LUs of other hosts).
    pub async fn target_reset(&self, nexus: &ItNexus) {
        tracing::info!(initiator = %nexus.initiator_port, "target reset");
        // every LU at once: each may wait for the HA partner (up to the
        // link's exchange time), and one after the other those waits added
        // up past an initiator's task management timeout
        let each: Vec<block::BoxFut<'_, ()>> = (self.visible_lus(nexus).into_iter())
            .map(|lu| Box::pin(self.reset_lu(lu, ResetKind::Target)) as block::BoxFut<'_, ()>)
            .collect();
        block::join_all(each).await;
    }

    /// Whether host groups decide what each initiator sees: a target reset
    /// then reaches only what its initiator sees (see [`Self::target_reset`]).
    pub fn masked(&self) -> bool {
        self.masked.load(Ordering::Acquire)
    }

    /// The target's LUNs that `nexus` sees (target numbers), in order.
    pub fn seen_target_luns(&self, nexus: &ItNexus) -> Vec<u64> {
        self.visible_lus(nexus).iter().map(|l| l.lun).collect()
    }

    /// CLEAR TASK SET on `lun` from `nexus`: establishes the unit attention the
    /// standard asks for on other nexuses (commands are aborted by the transport).
    pub async fn clear_task_set(&self, nexus: &ItNexus, lun: u64) {
        if let Some(lu) = self.target_lun(nexus, lun).and_then(|l| self.lu(l)) {
            let cuts = self.copy_cuts(None);
            lu.resets.fetch_add(1, Ordering::AcqRel);
            lu.uas
                .raise_all(codes::COMMANDS_CLEARED_BY_ANOTHER_INITIATOR, Some(nexus));
            self.copies_stopped(&lu, cuts).await;
        }
    }

    /// The I_T nexus is gone (session closed): drops SPC-2 reservations it held,
    /// on the HA partner too before returning.
    pub async fn nexus_lost(&self, nexus: &ItNexus) {
        let held: Vec<_> = self
            .all_lus()
            .into_iter()
            .filter(|lu| lu.nexus_lost(nexus))
            .collect();
        self.copies.nexus_lost(nexus);
        for lu in held {
            replication::spc2_end_everywhere(lu, Some(NexusId::of(nexus))).await;
        }
    }

    /// Flushes every LUN's volume (clean shutdown).
    pub async fn flush_all(&self) {
        for lu in self.all_lus() {
            if let Err(e) = lu.volume.flush().await {
                tracing::error!(lun = lu.lun, error = %e, "flush at shutdown failed");
            }
        }
    }

    /// The sense a command from `nexus` to `lun` would get for `s`, encoded in the
    /// LU's current sense format (for transports that build their own errors).
    pub fn encode_sense(&self, lun: u64, s: &Sense) -> block::Bytes {
        s.encode(self.lu(lun).is_some_and(|l| l.descriptor_sense()))
    }
}
