//! Reservations: SPC-2 RESERVE/RELEASE and SPC-4 persistent reservations (PERSISTENT
//! RESERVE IN/OUT, every service action and type, APTPL persistence).
//!
//! The command-set core asks [`Reservations::check`] before executing any command and
//! routes the reservation commands here. Unit attentions that a PR OUT establishes on
//! other I_T nexuses come back as [`PendingUa`]s for the core to queue.

use crate::sense::Sense;
use crate::{ItNexus, ScsiError, TargetPort};
use block::Bytes;
use std::path::Path;
use std::sync::Arc;

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

/// Reservation state of one logical unit.
pub struct Reservations {}

impl Reservations {
    /// Loads persisted (APTPL) state from `state_file` if it exists.
    pub fn load(state_file: Option<&Path>) -> Result<Self, ScsiError> {
        let _ = state_file;
        Ok(Reservations {})
    }

    /// SPC-4 5.13.1 / SPC-2: may `cdb` from `nexus` run now?
    pub fn check(&self, nexus: &ItNexus, cdb: &[u8]) -> Access {
        let _ = (nexus, cdb);
        Access::Allowed
    }

    /// PERSISTENT RESERVE IN: the whole parameter data (the core truncates it to the
    /// allocation length).
    pub fn persistent_reserve_in(&self, nexus: &ItNexus, cdb: &[u8]) -> Result<Bytes, PrError> {
        let _ = (nexus, cdb);
        Err(PrError::Check(crate::sense::codes::INVALID_OPCODE))
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
        let _ = (nexus, cdb, params, ports);
        Err(PrError::Check(crate::sense::codes::INVALID_OPCODE))
    }

    /// RESERVE(6)/RESERVE(10) (SPC-2).
    pub fn reserve(&self, nexus: &ItNexus) -> Result<(), PrError> {
        let _ = nexus;
        Ok(())
    }

    /// RELEASE(6)/RELEASE(10) (SPC-2).
    pub fn release(&self, nexus: &ItNexus) -> Result<(), PrError> {
        let _ = nexus;
        Ok(())
    }

    /// The nexus is gone: SPC-2 reservations it held are released.
    pub fn nexus_lost(&self, nexus: &ItNexus) {
        let _ = nexus;
    }

    /// LOGICAL UNIT RESET / TARGET RESET: SPC-2 reservations are released;
    /// persistent reservations are kept.
    pub fn reset(&self) {}
}
