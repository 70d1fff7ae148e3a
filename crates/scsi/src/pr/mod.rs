//! Reservations: SPC-2 RESERVE/RELEASE and SPC-4 persistent reservations (PERSISTENT
//! RESERVE IN/OUT, every service action and type, APTPL persistence).
//!
//! The command-set core asks [`Reservations::check`] before executing any command and
//! routes the reservation commands here. Unit attentions that a PR OUT establishes on
//! other I_T nexuses come back as [`PendingUa`]s for the core to queue.
//!
//! What it does not do: abort tasks (PREEMPT AND ABORT reports the preempted nexuses
//! through [`Reservations::persistent_reserve_out_detailed`]; the core aborts them),
//! truncate Data-In to the allocation length, or deliver unit attentions.
//!
//! Key invariant: a PERSISTENT RESERVE OUT either completes entirely or leaves the
//! state untouched. Every change is computed on a copy of the state, persisted first
//! when APTPL is in force, and only then made visible, all under one mutex.
//!
//! Layout: this file holds the state machine; `wire` the parameter-list parsing,
//! TransportIDs and PR IN encoders; `access` the SPC-4/SBC-3 conflict tables;
//! `persist` the APTPL state file; `replica` the state exchange with an HA partner
//! (snapshot, install, unit attentions derived from a state difference).

mod access;
mod persist;
mod replica;
mod wire;

#[cfg(test)]
pub(crate) mod tests;

use crate::sense::{codes, key, Sense};
use crate::{ItNexus, ScsiError, TargetPort};
use access::CmdClass;
use block::Bytes;
use parking_lot::Mutex;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Most registrations (I_T nexuses) one logical unit keeps; one more is refused with
/// INSUFFICIENT REGISTRATION RESOURCES.
pub const REGISTRATIONS_MAX: usize = 1024;

/// INVALID RELEASE OF PERSISTENT RESERVATION (not among the shared codes).
const INVALID_RELEASE_OF_PR: Sense = Sense::new(key::ILLEGAL_REQUEST, 0x26, 0x04);

/// Whether a command may run under the current reservations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Run it.
    Allowed,
    /// Answer RESERVATION CONFLICT.
    Conflict,
}

/// A unit attention to establish on other I_T nexuses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingUa {
    /// Initiator port name the UA is for.
    pub initiator_port: Arc<str>,
    /// Only through this relative target port; None means through every port.
    pub relative_port_id: Option<u16>,
    /// The unit attention condition.
    pub sense: Sense,
}

/// Why a reservation command failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PrError {
    /// Answer RESERVATION CONFLICT.
    Conflict,
    /// Answer CHECK CONDITION with this sense.
    Check(Sense),
}

impl From<Sense> for PrError {
    fn from(sense: Sense) -> Self {
        PrError::Check(sense)
    }
}

/// One I_T nexus as the reservation state names it: initiator port name plus relative
/// target port identifier. Names compare without regard to ASCII case (iSCSI names are
/// case-folded by their stringprep profile; ISIDs are hex).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NexusId {
    /// Initiator port name, `<initiator name>,i,0x<isid>`.
    pub initiator_port: Arc<str>,
    /// Relative target port identifier.
    pub relative_port_id: u16,
}

impl NexusId {
    pub(crate) fn of(nexus: &ItNexus) -> NexusId {
        NexusId {
            initiator_port: nexus.initiator_port.clone(),
            relative_port_id: nexus.relative_port_id,
        }
    }

    fn is(&self, nexus: &ItNexus) -> bool {
        self.relative_port_id == nexus.relative_port_id
            && self
                .initiator_port
                .eq_ignore_ascii_case(&nexus.initiator_port)
    }

    fn same(&self, other: &NexusId) -> bool {
        self.relative_port_id == other.relative_port_id
            && self
                .initiator_port
                .eq_ignore_ascii_case(&other.initiator_port)
    }

    fn ua(&self, sense: Sense) -> PendingUa {
        PendingUa {
            initiator_port: self.initiator_port.clone(),
            relative_port_id: Some(self.relative_port_id),
            sense,
        }
    }
}

/// What a PERSISTENT RESERVE OUT did besides changing the state.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PrOutOutcome {
    /// Unit attentions to establish on other I_T nexuses.
    pub unit_attentions: Vec<PendingUa>,
    /// PREEMPT AND ABORT only: the I_T nexuses whose registrations were removed; the
    /// core aborts every task they have in the task set of this logical unit.
    pub abort_tasks_of: Vec<NexusId>,
}

/// Persistent reservation type (SPC-4 table 170).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PrType {
    WriteExclusive,
    ExclusiveAccess,
    WriteExclusiveRegistrantsOnly,
    ExclusiveAccessRegistrantsOnly,
    WriteExclusiveAllRegistrants,
    ExclusiveAccessAllRegistrants,
}

impl PrType {
    fn from_code(code: u8) -> Option<PrType> {
        Some(match code {
            1 => PrType::WriteExclusive,
            3 => PrType::ExclusiveAccess,
            5 => PrType::WriteExclusiveRegistrantsOnly,
            6 => PrType::ExclusiveAccessRegistrantsOnly,
            7 => PrType::WriteExclusiveAllRegistrants,
            8 => PrType::ExclusiveAccessAllRegistrants,
            _ => return None,
        })
    }

    fn code(self) -> u8 {
        match self {
            PrType::WriteExclusive => 1,
            PrType::ExclusiveAccess => 3,
            PrType::WriteExclusiveRegistrantsOnly => 5,
            PrType::ExclusiveAccessRegistrantsOnly => 6,
            PrType::WriteExclusiveAllRegistrants => 7,
            PrType::ExclusiveAccessAllRegistrants => 8,
        }
    }

    /// Every registrant is a reservation holder.
    fn all_registrants(self) -> bool {
        matches!(
            self,
            PrType::WriteExclusiveAllRegistrants | PrType::ExclusiveAccessAllRegistrants
        )
    }

    /// Registrants only or all registrants: registered nexuses get access.
    fn registrants_get_access(self) -> bool {
        !matches!(self, PrType::WriteExclusive | PrType::ExclusiveAccess)
    }

    /// Reads by non-holders conflict too.
    fn exclusive_access(self) -> bool {
        matches!(
            self,
            PrType::ExclusiveAccess
                | PrType::ExclusiveAccessRegistrantsOnly
                | PrType::ExclusiveAccessAllRegistrants
        )
    }
}

/// One registered I_T nexus.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Registration {
    nexus: NexusId,
    key: u64,
    /// Registered by a REGISTER with ALL_TG_PT=1 (one entry per target port); key
    /// changes and unregistration apply to the whole group.
    all_tg_pt: bool,
}

/// The persistent reservation, when one exists (LU scope only).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Reservation {
    kind: PrType,
    /// The holding nexus; None for all-registrants types (every registrant holds it).
    holder: Option<NexusId>,
}

/// Persistent-reservation state: what APTPL persists.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct PrState {
    generation: u32,
    registrations: Vec<Registration>,
    reservation: Option<Reservation>,
    aptpl: bool,
}

impl PrState {
    fn find(&self, nexus: &ItNexus) -> Option<usize> {
        self.registrations.iter().position(|r| r.nexus.is(nexus))
    }

    fn find_id(&self, id: &NexusId) -> Option<usize> {
        self.registrations.iter().position(|r| r.nexus.same(id))
    }

    /// Is the registration at `idx` a reservation holder?
    fn is_holder(&self, idx: usize) -> bool {
        let (Some(res), Some(reg)) = (&self.reservation, self.registrations.get(idx)) else {
            return false;
        };
        match &res.holder {
            None => res.kind.all_registrants(),
            Some(h) => h.same(&reg.nexus),
        }
    }

    /// Key of the holder of a non-all-registrants reservation.
    fn holder_key(&self) -> Option<u64> {
        let holder = self.reservation.as_ref()?.holder.as_ref()?;
        self.find_id(holder).map(|i| self.registrations[i].key)
    }

    /// The registrations that change together with the one at `idx`: itself, plus its
    /// ALL_TG_PT siblings (same initiator port, same key).
    fn group_of(&self, idx: usize) -> Vec<usize> {
        let Some(me) = self.registrations.get(idx) else {
            return Vec::new();
        };
        if !me.all_tg_pt {
            return vec![idx];
        }
        (0..self.registrations.len())
            .filter(|&i| {
                let r = &self.registrations[i];
                i == idx
                    || (r.all_tg_pt
                        && r.key == me.key
                        && r.nexus
                            .initiator_port
                            .eq_ignore_ascii_case(&me.nexus.initiator_port))
            })
            .collect()
    }

    /// Removes the registrations at `indices` and returns them.
    fn remove(&mut self, indices: &[usize]) -> Vec<Registration> {
        let mut removed = Vec::new();
        let mut i = 0;
        self.registrations.retain(|r| {
            let drop = indices.contains(&i);
            i += 1;
            if drop {
                removed.push(r.clone());
            }
            !drop
        });
        removed
    }

    /// After registrations went away: a reservation whose holder is no longer
    /// registered (or, for all-registrants types, that has no registrant left) is
    /// released. Returns the released type.
    fn drop_orphaned_reservation(&mut self) -> Option<PrType> {
        let res = self.reservation.as_ref()?;
        let orphaned = match &res.holder {
            None => self.registrations.is_empty(),
            Some(h) => self.find_id(h).is_none(),
        };
        if orphaned {
            self.reservation.take().map(|r| r.kind)
        } else {
            None
        }
    }

    fn bump_generation(&mut self) {
        self.generation = self.generation.wrapping_add(1);
    }
}

/// Everything behind the mutex.
#[derive(Debug, Default)]
struct Inner {
    pr: PrState,
    /// SPC-2 RESERVE holder.
    spc2: Option<NexusId>,
}

/// Reservation state of one logical unit, shared by every session that reaches it.
pub struct Reservations {
    inner: Mutex<Inner>,
    state_file: Option<PathBuf>,
}

impl std::fmt::Debug for Reservations {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reservations")
            .field("state_file", &self.state_file)
            .finish_non_exhaustive()
    }
}

impl Reservations {
    /// Loads persisted (APTPL) state from `state_file` if it exists. With a state file
    /// the LUN reports PTPL_C=1 and honours APTPL; without one it refuses APTPL=1.
    pub fn load(state_file: Option<&Path>) -> Result<Self, ScsiError> {
        let pr = match state_file {
            Some(path) => persist::load(path)?.unwrap_or_default(),
            None => PrState::default(),
        };
        Ok(Reservations {
            inner: Mutex::new(Inner { pr, spc2: None }),
            state_file: state_file.map(Path::to_path_buf),
        })
    }

    /// Whether any reservation (persistent or SPC-2) is held on the LU.
    pub fn reserved(&self) -> bool {
        let g = self.inner.lock();
        g.spc2.is_some() || g.pr.reservation.is_some()
    }

    /// SPC-4 5.13.1 / SPC-2: may `cdb` from `nexus` run now?
    ///
    /// RESERVE/RELEASE and PERSISTENT RESERVE OUT are always let through to their
    /// handlers when no SPC-2 reservation of another nexus stands in the way: the
    /// handlers decide conflicts themselves.
    pub fn check(&self, nexus: &ItNexus, cdb: &[u8]) -> Access {
        if cdb.is_empty() {
            return Access::Allowed;
        }
        let g = self.inner.lock();
        if let Some(holder) = &g.spc2 {
            if !holder.is(nexus) && !access::allowed_under_spc2(cdb) {
                return Access::Conflict;
            }
        }
        let Some(res) = &g.pr.reservation else {
            return Access::Allowed;
        };
        let class = access::classify(cdb);
        if class == CmdClass::Always {
            return Access::Allowed;
        }
        if let Some(idx) = g.pr.find(nexus) {
            if g.pr.is_holder(idx) || res.kind.registrants_get_access() {
                return Access::Allowed;
            }
        }
        match (class, res.kind.exclusive_access()) {
            (CmdClass::Read, false) => Access::Allowed,
            _ => Access::Conflict,
        }
    }

    /// PERSISTENT RESERVE IN: the whole parameter data (the core truncates it to the
    /// allocation length).
    pub fn persistent_reserve_in(&self, nexus: &ItNexus, cdb: &[u8]) -> Result<Bytes, PrError> {
        let _ = nexus;
        let Some(&b1) = cdb.get(1) else {
            return Err(codes::INVALID_FIELD_IN_CDB.with_field(true, 0, None).into());
        };
        let g = self.inner.lock();
        let pr = &g.pr;
        let data = match b1 & 0x1f {
            0 => wire::read_keys(pr.generation, pr.registrations.iter().map(|r| r.key)),
            1 => {
                let res = pr.reservation.as_ref().map(|r| {
                    let key = if r.kind.all_registrants() {
                        0
                    } else {
                        pr.holder_key().unwrap_or(0)
                    };
                    (key, r.kind.code())
                });
                wire::read_reservation(pr.generation, res)
            }
            2 => wire::report_capabilities(self.state_file.is_some(), pr.aptpl),
            3 => {
                let type_code = pr.reservation.as_ref().map_or(0, |r| r.kind.code());
                let descs = pr
                    .registrations
                    .iter()
                    .enumerate()
                    .map(|(i, r)| wire::FullStatus {
                        key: r.key,
                        holder_type: pr.is_holder(i).then_some(type_code),
                        relative_port_id: r.nexus.relative_port_id,
                        initiator_port: &r.nexus.initiator_port,
                    });
                wire::read_full_status(pr.generation, descs)
            }
            _ => {
                return Err(codes::INVALID_FIELD_IN_CDB
                    .with_field(true, 1, Some(4))
                    .into())
            }
        };
        Ok(Bytes::from(data))
    }

    /// PERSISTENT RESERVE OUT with its parameter list; `ports` are every port of the
    /// target (for ALL_TG_PT and SPEC_I_PT).
    pub fn persistent_reserve_out(
        &self,
        nexus: &ItNexus,
        cdb: &[u8],
        params: &[u8],
        ports: &[TargetPort],
    ) -> Result<Vec<PendingUa>, PrError> {
        self.persistent_reserve_out_detailed(nexus, cdb, params, ports)
            .map(|o| o.unit_attentions)
    }

    /// [`Reservations::persistent_reserve_out`], also naming the nexuses whose tasks a
    /// PREEMPT AND ABORT aborts.
    pub fn persistent_reserve_out_detailed(
        &self,
        nexus: &ItNexus,
        cdb: &[u8],
        params: &[u8],
        ports: &[TargetPort],
    ) -> Result<PrOutOutcome, PrError> {
        self.run_out(nexus, cdb, params, ports, false)
            .map(|(out, _)| out)
    }

    /// Runs a PR OUT; with `want_state`, also returns the new state encoded for the HA
    /// partner (with the unit attentions the command established) when it changed.
    fn run_out(
        &self,
        nexus: &ItNexus,
        cdb: &[u8],
        params: &[u8],
        ports: &[TargetPort],
        want_state: bool,
    ) -> Result<(PrOutOutcome, Option<Bytes>), PrError> {
        let cdb = wire::ProutCdb::parse(cdb)?;
        let mut g = self.inner.lock();
        if let Some(holder) = &g.spc2 {
            if !holder.is(nexus) {
                return Err(PrError::Conflict);
            }
        }
        let mut next = g.pr.clone();
        let mut out = PrOutOutcome::default();
        match cdb.service_action {
            wire::SA_REGISTER | wire::SA_REGISTER_AND_IGNORE => {
                let p = wire::parse_basic(&cdb, params)?;
                self.check_aptpl(p.aptpl, 20)?;
                let ignore = cdb.service_action == wire::SA_REGISTER_AND_IGNORE;
                register(&mut next, nexus, &p, ignore, ports, &mut out)?;
            }
            wire::SA_RESERVE => {
                let p = wire::parse_basic(&cdb, params)?;
                let kind = cdb.lu_scope_type()?;
                reserve(&mut next, nexus, p.reservation_key, kind)?;
            }
            wire::SA_RELEASE => {
                let p = wire::parse_basic(&cdb, params)?;
                release(&mut next, nexus, p.reservation_key, &cdb, &mut out)?;
            }
            wire::SA_CLEAR => {
                let p = wire::parse_basic(&cdb, params)?;
                clear(&mut next, nexus, p.reservation_key, &mut out)?;
            }
            wire::SA_PREEMPT | wire::SA_PREEMPT_AND_ABORT => {
                let p = wire::parse_basic(&cdb, params)?;
                let abort = cdb.service_action == wire::SA_PREEMPT_AND_ABORT;
                preempt(&mut next, nexus, &p, &cdb, abort, &mut out)?;
            }
            wire::SA_REGISTER_AND_MOVE => {
                let p = wire::parse_move(&cdb, params)?;
                self.check_aptpl(p.aptpl, 17)?;
                register_and_move(&mut next, nexus, &p, ports)?;
            }
            _ => {
                return Err(codes::INVALID_FIELD_IN_CDB
                    .with_field(true, 1, Some(4))
                    .into())
            }
        }
        let changed = next != g.pr;
        self.commit(&mut g, next)?;
        let state = (want_state && changed).then(|| {
            // the command itself is one of the sender's tasks: never aborted
            let aborts: Vec<NexusId> = (out.abort_tasks_of.iter())
                .filter(|v| !v.is(nexus))
                .cloned()
                .collect();
            Bytes::from(persist::encode(
                &g.pr,
                g.spc2.as_ref(),
                Some(&out.unit_attentions),
                &aborts,
            ))
        });
        tracing::debug!(
            initiator_port = %nexus.initiator_port,
            relative_port_id = nexus.relative_port_id,
            service_action = cdb.service_action,
            generation = g.pr.generation,
            registrations = g.pr.registrations.len(),
            reservation = ?g.pr.reservation.as_ref().map(|r| r.kind),
            "PERSISTENT RESERVE OUT done"
        );
        Ok((out, state))
    }

    /// RESERVE(6)/RESERVE(10) (SPC-2, with the SPC-4 5.13.3 exceptions: CRH=1).
    pub fn reserve(&self, nexus: &ItNexus) -> Result<(), PrError> {
        self.reserve_or_release(nexus, true)
    }

    /// RELEASE(6)/RELEASE(10) (SPC-2, with the SPC-4 5.13.3 exceptions): a release
    /// from a nexus that holds nothing is a GOOD no-op.
    pub fn release(&self, nexus: &ItNexus) -> Result<(), PrError> {
        self.reserve_or_release(nexus, false)
    }

    /// RESERVE (`reserve`) or RELEASE from `nexus`.
    pub(crate) fn reserve_or_release(&self, nexus: &ItNexus, reserve: bool) -> Result<(), PrError> {
        let mut g = self.inner.lock();
        match spc2_exception(&g.pr, nexus) {
            Spc2Exception::Good => return Ok(()),
            Spc2Exception::Conflict => return Err(PrError::Conflict),
            Spc2Exception::Spc2 => {}
        }
        let held_by_it = g.spc2.as_ref().map(|h| h.is(nexus));
        match (reserve, held_by_it) {
            (true, Some(false)) => return Err(PrError::Conflict),
            (true, None) => g.spc2 = Some(NexusId::of(nexus)),
            (false, Some(true)) => g.spc2 = None,
            // the holder reserving again, a release from a non-holder
            _ => {}
        }
        Ok(())
    }

    /// The nexus is gone: SPC-2 reservations it held are released. True if it
    /// held one.
    pub fn nexus_lost(&self, nexus: &ItNexus) -> bool {
        self.end_spc2(Some(&NexusId::of(nexus)))
    }

    /// LOGICAL UNIT RESET / TARGET RESET: SPC-2 reservations are released;
    /// persistent reservations are kept.
    pub fn reset(&self) {
        self.end_spc2(None);
    }

    /// Ends the SPC-2 reservation if `holder` holds it (None: whoever does).
    /// True if it ended.
    pub(crate) fn end_spc2(&self, holder: Option<&NexusId>) -> bool {
        let mut g = self.inner.lock();
        let ends = match (&g.spc2, holder) {
            (None, _) => false,
            (Some(_), None) => true,
            (Some(h), Some(who)) => h.same(who),
        };
        if ends {
            g.spc2 = None;
        }
        ends
    }

    /// Current PRgeneration (for status and metrics).
    pub fn generation(&self) -> u32 {
        self.inner.lock().pr.generation
    }

    /// Number of registered I_T nexuses (for status and metrics).
    pub fn registration_count(&self) -> usize {
        self.inner.lock().pr.registrations.len()
    }

    /// APTPL=1 needs somewhere to persist to.
    fn check_aptpl(&self, aptpl: bool, byte: u16) -> Result<(), PrError> {
        if aptpl && self.state_file.is_none() {
            return Err(codes::INVALID_FIELD_IN_PARAM
                .with_field(false, byte, Some(0))
                .into());
        }
        Ok(())
    }

    /// Persists `next` when APTPL is in force (or removes the file when APTPL was just
    /// turned off), then makes it the current state.
    fn commit(&self, g: &mut Inner, next: PrState) -> Result<(), PrError> {
        if let Err(e) = self.persist_transition(&g.pr, &next) {
            tracing::error!(path = ?self.state_file, error = %e, "persisting reservations failed");
            return Err(codes::INTERNAL_TARGET_FAILURE.into());
        }
        g.pr = next;
        Ok(())
    }

    /// Brings the state file from `current` to `next`: written when APTPL is in force
    /// in `next`, removed when APTPL was just turned off, untouched otherwise.
    fn persist_transition(&self, current: &PrState, next: &PrState) -> std::io::Result<()> {
        let Some(path) = &self.state_file else {
            return Ok(());
        };
        if next.aptpl {
            persist::save(path, next)
        } else if current.aptpl {
            persist::remove(path)
        } else {
            Ok(())
        }
    }
}

/// How SPC-4 5.13.3 says a RESERVE/RELEASE is handled while PR state exists.
enum Spc2Exception {
    /// Complete with GOOD and change nothing.
    Good,
    /// RESERVATION CONFLICT.
    Conflict,
    /// Process as SPC-2 says.
    Spc2,
}

fn spc2_exception(pr: &PrState, nexus: &ItNexus) -> Spc2Exception {
    if let Some(res) = &pr.reservation {
        if let Some(idx) = pr.find(nexus) {
            if pr.is_holder(idx) || res.kind.registrants_get_access() {
                return Spc2Exception::Good;
            }
        }
    }
    // SPC-2 5.5.1: while any I_T nexus is registered, RESERVE and RELEASE conflict.
    if pr.registrations.is_empty() {
        Spc2Exception::Spc2
    } else {
        Spc2Exception::Conflict
    }
}

/// REGISTER and REGISTER AND IGNORE EXISTING KEY (SPC-4 5.13.7, 5.13.11.2.3).
fn register(
    st: &mut PrState,
    nexus: &ItNexus,
    p: &wire::BasicParams,
    ignore_existing: bool,
    ports: &[TargetPort],
    out: &mut PrOutOutcome,
) -> Result<(), PrError> {
    match st.find(nexus) {
        None => {
            if !ignore_existing && p.reservation_key != 0 {
                return Err(PrError::Conflict);
            }
            if p.service_action_key == 0 {
                // Nothing to register; GOOD.
                st.bump_generation();
                return Ok(());
            }
            let me = NexusId::of(nexus);
            let port_ids = |all: bool| -> Vec<u16> {
                let mut ids = vec![nexus.relative_port_id];
                if all {
                    ids.extend(ports.iter().map(|p| p.relative_id));
                }
                ids
            };
            let mut new: Vec<NexusId> = Vec::new();
            let push = |id: NexusId, new: &mut Vec<NexusId>| {
                if !new.iter().any(|n| n.same(&id)) {
                    new.push(id);
                }
            };
            for rel in port_ids(p.all_tg_pt) {
                let id = NexusId {
                    initiator_port: me.initiator_port.clone(),
                    relative_port_id: rel,
                };
                // ALL_TG_PT: nexuses of this initiator port already registered through
                // other ports keep their own registration.
                if st.find_id(&id).is_none() {
                    push(id, &mut new);
                }
            }
            for port in &p.transport_ids {
                for rel in port_ids(p.all_tg_pt) {
                    let id = NexusId {
                        initiator_port: Arc::from(port.as_str()),
                        relative_port_id: rel,
                    };
                    if id.same(&me) {
                        continue;
                    }
                    if st.find_id(&id).is_some() {
                        return Err(codes::INVALID_FIELD_IN_PARAM.into());
                    }
                    push(id, &mut new);
                    // (checked as the list grows: the duplicate check is
                    // quadratic in it)
                    if st.registrations.len() + new.len() > REGISTRATIONS_MAX {
                        return Err(codes::INSUFFICIENT_REGISTRATION_RESOURCES.into());
                    }
                }
            }
            if st.registrations.len() + new.len() > REGISTRATIONS_MAX {
                return Err(codes::INSUFFICIENT_REGISTRATION_RESOURCES.into());
            }
            st.registrations
                .extend(new.into_iter().map(|nexus| Registration {
                    nexus,
                    key: p.service_action_key,
                    all_tg_pt: p.all_tg_pt,
                }));
        }
        Some(idx) => {
            if !ignore_existing && p.reservation_key != st.registrations[idx].key {
                return Err(PrError::Conflict);
            }
            if p.spec_i_pt {
                return Err(codes::INVALID_FIELD_IN_CDB.into());
            }
            let group = st.group_of(idx);
            if p.service_action_key == 0 {
                unregister(st, nexus, &group, out);
            } else {
                for i in group {
                    st.registrations[i].key = p.service_action_key;
                }
            }
        }
    }
    st.aptpl = p.aptpl;
    st.bump_generation();
    Ok(())
}

/// Removes the registrations `group` of `nexus`; a reservation it held goes with it
/// (all-registrants: only with the last registrant), and a registrants-only release
/// tells the remaining registrants.
fn unregister(st: &mut PrState, nexus: &ItNexus, group: &[usize], out: &mut PrOutOutcome) {
    st.remove(group);
    if let Some(kind) = st.drop_orphaned_reservation() {
        if kind.registrants_get_access() {
            for r in &st.registrations {
                if !r.nexus.is(nexus) {
                    out.unit_attentions
                        .push(r.nexus.ua(codes::RESERVATIONS_RELEASED));
                }
            }
        }
    }
}

/// Registered nexus with matching RESERVATION KEY, or RESERVATION CONFLICT.
fn registered_with_key(st: &PrState, nexus: &ItNexus, key: u64) -> Result<usize, PrError> {
    match st.find(nexus) {
        Some(idx) if st.registrations[idx].key == key => Ok(idx),
        _ => Err(PrError::Conflict),
    }
}

/// RESERVE (SPC-4 5.13.9).
fn reserve(st: &mut PrState, nexus: &ItNexus, key: u64, kind: PrType) -> Result<(), PrError> {
    let idx = registered_with_key(st, nexus, key)?;
    match &st.reservation {
        None => {
            st.reservation = Some(Reservation {
                kind,
                holder: (!kind.all_registrants()).then(|| NexusId::of(nexus)),
            });
            Ok(())
        }
        Some(res) if st.is_holder(idx) && res.kind == kind => Ok(()),
        Some(_) => Err(PrError::Conflict),
    }
}

/// RELEASE (SPC-4 5.13.11.2.2).
fn release(
    st: &mut PrState,
    nexus: &ItNexus,
    key: u64,
    cdb: &wire::ProutCdb,
    out: &mut PrOutOutcome,
) -> Result<(), PrError> {
    let idx = registered_with_key(st, nexus, key)?;
    let Some(res) = &st.reservation else {
        return Ok(());
    };
    if !st.is_holder(idx) {
        return Ok(());
    }
    if cdb.scope != 0 || cdb.type_code != res.kind.code() {
        return Err(INVALID_RELEASE_OF_PR.into());
    }
    let kind = res.kind;
    st.reservation = None;
    if kind.registrants_get_access() {
        for r in &st.registrations {
            if !r.nexus.is(nexus) {
                out.unit_attentions
                    .push(r.nexus.ua(codes::RESERVATIONS_RELEASED));
            }
        }
    }
    Ok(())
}

/// CLEAR (SPC-4 5.13.11.2.6).
fn clear(
    st: &mut PrState,
    nexus: &ItNexus,
    key: u64,
    out: &mut PrOutOutcome,
) -> Result<(), PrError> {
    registered_with_key(st, nexus, key)?;
    for r in st.registrations.drain(..) {
        if !r.nexus.is(nexus) {
            out.unit_attentions
                .push(r.nexus.ua(codes::RESERVATIONS_PREEMPTED));
        }
    }
    st.reservation = None;
    st.bump_generation();
    Ok(())
}

/// PREEMPT and PREEMPT AND ABORT (SPC-4 5.13.11.2.4-5).
fn preempt(
    st: &mut PrState,
    nexus: &ItNexus,
    p: &wire::BasicParams,
    cdb: &wire::ProutCdb,
    abort: bool,
    out: &mut PrOutOutcome,
) -> Result<(), PrError> {
    registered_with_key(st, nexus, p.reservation_key)?;
    let sark = p.service_action_key;
    let new_reservation = |kind: PrType| Reservation {
        kind,
        holder: (!kind.all_registrants()).then(|| NexusId::of(nexus)),
    };
    let removed = match st.reservation.clone() {
        Some(res) if res.kind.all_registrants() && sark == 0 => {
            // Preempt an all-registrants reservation: everybody else goes.
            let kind = cdb.lu_scope_type()?;
            let others: Vec<usize> = (0..st.registrations.len())
                .filter(|&i| !st.registrations[i].nexus.is(nexus))
                .collect();
            let removed = st.remove(&others);
            st.reservation = Some(new_reservation(kind));
            removed
        }
        Some(res) if !res.kind.all_registrants() && st.holder_key() == Some(sark) => {
            // Preempt the holder: its key's registrations go (except ours) and we
            // hold a new reservation of the requested type.
            let kind = cdb.lu_scope_type()?;
            let victims: Vec<usize> = (0..st.registrations.len())
                .filter(|&i| {
                    st.registrations[i].key == sark && !st.registrations[i].nexus.is(nexus)
                })
                .collect();
            let removed = st.remove(&victims);
            st.reservation = Some(new_reservation(kind));
            if kind != res.kind {
                for r in &st.registrations {
                    if !r.nexus.is(nexus) {
                        out.unit_attentions
                            .push(r.nexus.ua(codes::RESERVATIONS_RELEASED));
                    }
                }
            }
            removed
        }
        Some(res) if !res.kind.all_registrants() && sark == 0 => {
            return Err(codes::INVALID_FIELD_IN_PARAM
                .with_field(false, 8, None)
                .into());
        }
        _ => {
            // No reservation, or not the holder's key: only remove registrations.
            let victims: Vec<usize> = (0..st.registrations.len())
                .filter(|&i| sark != 0 && st.registrations[i].key == sark)
                .collect();
            if victims.is_empty() {
                return Err(PrError::Conflict);
            }
            let removed = st.remove(&victims);
            st.drop_orphaned_reservation();
            removed
        }
    };
    for r in removed {
        if !r.nexus.is(nexus) {
            out.unit_attentions
                .push(r.nexus.ua(codes::REGISTRATIONS_PREEMPTED));
            if abort {
                out.abort_tasks_of.push(r.nexus);
            }
        }
    }
    st.bump_generation();
    Ok(())
}

/// REGISTER AND MOVE (SPC-4 5.13.8).
fn register_and_move(
    st: &mut PrState,
    nexus: &ItNexus,
    p: &wire::MoveParams,
    ports: &[TargetPort],
) -> Result<(), PrError> {
    let idx = registered_with_key(st, nexus, p.reservation_key)?;
    let Some(res) = st.reservation.clone() else {
        return Err(PrError::Conflict);
    };
    if !st.is_holder(idx) || res.kind.all_registrants() {
        return Err(PrError::Conflict);
    }
    if p.service_action_key == 0 {
        return Err(codes::INVALID_FIELD_IN_PARAM
            .with_field(false, 8, None)
            .into());
    }
    let port_known = p.relative_port_id == nexus.relative_port_id
        || ports.iter().any(|tp| tp.relative_id == p.relative_port_id);
    if !port_known {
        return Err(codes::INVALID_FIELD_IN_PARAM
            .with_field(false, 18, None)
            .into());
    }
    let dest = NexusId {
        initiator_port: Arc::from(p.transport_id.as_str()),
        relative_port_id: p.relative_port_id,
    };
    if dest.is(nexus) {
        return Err(codes::INVALID_FIELD_IN_PARAM
            .with_field(false, 24, None)
            .into());
    }
    match st.find_id(&dest) {
        Some(d) => st.registrations[d].key = p.service_action_key,
        None => {
            if st.registrations.len() >= REGISTRATIONS_MAX {
                return Err(codes::INSUFFICIENT_REGISTRATION_RESOURCES.into());
            }
            st.registrations.push(Registration {
                nexus: dest.clone(),
                key: p.service_action_key,
                all_tg_pt: false,
            });
        }
    }
    st.reservation = Some(Reservation {
        kind: res.kind,
        holder: Some(dest),
    });
    if p.unreg {
        if let Some(me) = st.find(nexus) {
            st.remove(&[me]);
        }
    }
    st.aptpl = p.aptpl;
    st.bump_generation();
    Ok(())
}
