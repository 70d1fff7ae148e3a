//! Reservation state exchanged with the HA partner node: snapshots, the state a
//! PR OUT, RESERVE or RELEASE produced, and installing either one.
//!
//! Both are the state file's JSON ([`super::persist`]), with the SPC-2
//! reservation's holder added (the state file never holds it). The state a PR OUT produced
//! also lists the unit attentions that command established; the receiving node queues
//! exactly those (for the I_T nexuses it knows), so a command gets the same unit
//! attentions whichever node ran it, and the nexus that sent it gets none. A snapshot
//! carries no list: the receiver derives the unit attentions from the difference
//! between its state and the snapshot ([`state_change_uas`]).

use super::{persist, NexusId, PendingUa, PrState, Reservations};
use crate::sense::codes;
use crate::{ItNexus, ScsiError, TargetPort};
use block::Bytes;
use std::io;

impl Reservations {
    /// The reservation state (registrations, reservation, PRgeneration, APTPL,
    /// and the SPC-2 reservation's holder) in the state file's JSON format.
    pub(crate) fn state(&self) -> Bytes {
        let g = self.inner.lock();
        Bytes::from(persist::encode(&g.pr, g.spc2.as_ref(), None, &[]))
    }

    /// [`Reservations::persistent_reserve_out_detailed`], also returning the new state
    /// for the HA partner when the command changed it (PRgeneration, a registration, the
    /// reservation or APTPL); the state lists the unit attentions the command established.
    pub(crate) fn persistent_reserve_out_replicated(
        &self,
        nexus: &ItNexus,
        cdb: &[u8],
        params: &[u8],
        ports: &[TargetPort],
    ) -> Result<(super::PrOutOutcome, Option<Bytes>), super::PrError> {
        self.run_out(nexus, cdb, params, ports, true)
    }

    /// Replaces the persistent-reservation state with `state` (from [`Reservations::state`]
    /// or a PR OUT of the partner) and persists it like a local change. Returns the unit
    /// attentions to establish: the ones listed in `state`, or for a snapshot those
    /// [`state_change_uas`] derives. An identical state changes nothing and raises none.
    /// With them, the I_T nexuses whose tasks a PREEMPT AND ABORT aborts on this node
    /// too (listed in a state pushed after one). Last, the error of persisting
    /// it, if that failed: the state is installed all the same (see below).
    #[allow(clippy::type_complexity)]
    pub(crate) fn install_state(
        &self,
        state: &[u8],
    ) -> Result<(Vec<PendingUa>, Vec<NexusId>, Option<ScsiError>), ScsiError> {
        let persist::Decoded {
            state: next,
            spc2,
            uas: listed,
            aborts,
        } = persist::decode(state).map_err(ScsiError::PrState)?;
        let mut g = self.inner.lock();
        g.spc2 = spc2;
        if g.pr == next {
            return Ok((Vec::new(), aborts, None));
        }
        if next.aptpl && self.state_file.is_none() {
            tracing::warn!("installing APTPL reservations on a LUN without a state file");
        }
        // Installed even when it cannot be persisted here: the node that
        // ordered the change has made it, and a retry of the command finds it
        // done there and pushes nothing, so refused here the old reservations
        // would hold on this node's paths (a preempted initiator still writing
        // through them) until the next change. The failure still reaches the
        // partner, whose initiator is told (HARDWARE ERROR): the change is not
        // durable on both nodes.
        let unsaved = self
            .persist_transition(&g.pr, &next)
            .err()
            .map(|source: io::Error| ScsiError::State {
                path: self.state_file.clone().unwrap_or_default(),
                source,
            });
        let uas = listed.unwrap_or_else(|| state_change_uas(&g.pr, &next));
        tracing::debug!(
            generation = next.generation,
            registrations = next.registrations.len(),
            reservation = ?next.reservation.as_ref().map(|r| r.kind),
            unit_attentions = uas.len(),
            "persistent reservation state installed"
        );
        g.pr = next;
        Ok((uas, aborts, unsaved))
    }
}

/// Unit attentions for a state change known only as a before/after pair. For every
/// I_T nexus registered in `old`:
///
/// 0. nobody is registered in `new` (what a CLEAR leaves): RESERVATIONS PREEMPTED
///    (SPC-4 5.13.11.2.6);
/// 1. otherwise, not registered in `new`: REGISTRATIONS PREEMPTED;
/// 2. still registered, and a Registrants Only or All Registrants reservation of `old`
///    is gone in `new`: RESERVATIONS RELEASED, except for the old holder (SPC-4
///    5.13.11.2.2 / 5.13.11.2.3: a released Write Exclusive or Exclusive Access
///    reservation establishes none);
/// 3. still registered, and the reservation changed type: RESERVATIONS RELEASED,
///    except for the new holder (SPC-4 5.13.11.2.4.3, a PREEMPT that changes the type).
///
/// Nothing else raises a unit attention: a new reservation, a holder that changed with
/// the type kept (PREEMPT of the same type, REGISTER AND MOVE), new registrations, key,
/// PRgeneration or APTPL changes.
pub(super) fn state_change_uas(old: &PrState, new: &PrState) -> Vec<PendingUa> {
    // Some(exempt holder) when surviving registrants get RESERVATIONS RELEASED.
    let released = match (&old.reservation, &new.reservation) {
        (Some(o), None) if o.kind.registrants_get_access() => Some(o.holder.as_ref()),
        (Some(o), Some(n)) if o.kind != n.kind => Some(n.holder.as_ref()),
        _ => None,
    };
    let mut uas = Vec::new();
    for r in &old.registrations {
        if new.registrations.is_empty() {
            uas.push(r.nexus.ua(codes::RESERVATIONS_PREEMPTED));
        } else if new.find_id(&r.nexus).is_none() {
            uas.push(r.nexus.ua(codes::REGISTRATIONS_PREEMPTED));
        } else if let Some(exempt) = released {
            if !exempt.is_some_and(|h| h.same(&r.nexus)) {
                uas.push(r.nexus.ua(codes::RESERVATIONS_RELEASED));
            }
        }
    }
    uas
}
