//! Persistent reservations kept identical on the two nodes of an HA pair.
//!
//! One node orders every PERSISTENT RESERVE OUT of a LUN (the leader). A PR OUT that
//! arrives at the other node is forwarded ([`PrReplication::forward_out`]) and run on the
//! leader ([`crate::ScsiTarget::execute_pr_out_here`]); after a PR OUT changed the state,
//! the leader pushes the whole new state to the partner ([`PrReplication::push_state`]),
//! which installs it ([`crate::ScsiTarget::install_pr_state`]) before the command answers.
//! PR OUTs of one LU run one at a time on a node, each together with its push, so the
//! partner never installs an older state after a newer one. PERSISTENT RESERVE IN and
//! the reservation checks of every other command read the local copy.
//!
//! The state pushed after a PR OUT lists the unit attentions that command established;
//! the partner queues them for the I_T nexuses it knows (those that reached it), so unit
//! attentions are the same whichever node ran the command. A state installed without
//! that list (a snapshot from [`crate::ScsiTarget::pr_state`], e.g. when a node rejoins)
//! raises the unit attentions [`crate::pr`]'s state difference derives.
//!
//! A PREEMPT AND ABORT aborts the preempted I_T nexuses' tasks on both nodes: the leader
//! aborts those it runs ([`TaskAbort`]), and the state it pushes names the nexuses (never
//! the one that sent the command), so the partner aborts its own before the push
//! returns and the command answers.
//!
//! The explicit ALUA states (SET TARGET PORT GROUPS; see the `alua` module) go the same
//! way through the same link: a SET TARGET PORT GROUPS arriving at the node that does
//! not order changes is forwarded ([`PrReplication::forward_set_tpg`]) and applied on
//! the other ([`crate::ScsiTarget::set_target_port_groups_here`]), which pushes its
//! whole explicit state ([`PrReplication::push_alua_state`]) before answering; the
//! implicit states stay each node's own (the cluster drives both from the replica).
//!
//! SPC-2 RESERVE and RELEASE go the same way as a PR OUT (forwarded to the leader,
//! run there in order with the PR OUTs, the new state pushed before answering), and
//! the state the nodes exchange names the SPC-2 reservation's holder: a host that
//! reserved the LU through one node's ports is its only writer through both (before,
//! each node kept its own, and a second host reserved the LU through the other node
//! and wrote beside the first). An SPC-2 reservation also ends without a command,
//! when its holder's I_T nexus is lost or the LU is reset, on the node the nexus or
//! the reset reached: the node that orders changes then pushes its new state; the
//! other ends it at once for its own paths and asks the orderer to end it too
//! ([`PrReplication::forward_spc2_end`]), before the reset is answered or a
//! session reinstating the nexus is let in. Not covered: a holder whose nexus went
//! with its node (the partner failed) keeps the reservation on the survivor until
//! a reset, as after any path loss the target does not see.
//!
//! Not replicated: the D_SENSE mode bit (a forwarded command's sense data is in the
//! leader's format).

use crate::cdb::Cdb;
use crate::lu::{CmdResult, Done, Fail, LogicalUnit};
use crate::pr::NexusId;
use crate::sense::codes;
use crate::{admin, AluaState, ItNexus, Response, TargetPort};
use block::Bytes;
use std::sync::Arc;

/// Keeps a LUN's persistent-reservation state and explicit ALUA states identical on
/// the two nodes of an HA pair.
#[async_trait::async_trait]
pub trait PrReplication: Send + Sync + 'static {
    /// Called for every PERSISTENT RESERVE OUT before it runs. `None`: run it on this
    /// node (this node orders PR changes: it is the leader, or alone). `Some(resp)`:
    /// the partner ran it and `resp` is its answer; the partner has already installed
    /// the new state on this node (through [`crate::ScsiTarget::install_pr_state`])
    /// before answering.
    async fn forward_out(
        &self,
        lun: u64,
        nexus: &ItNexus,
        cdb: &Bytes,
        data: &Bytes,
    ) -> Option<Response>;

    /// After a PR OUT ran on this node and changed the state (PRgeneration, a
    /// registration, the reservation or APTPL): sends `state` to the partner, which
    /// installs it with [`crate::ScsiTarget::install_pr_state`]. The command answers
    /// only after this returns; on Err it answers CHECK CONDITION, HARDWARE ERROR /
    /// INTERNAL TARGET FAILURE, and the local change stays (the partner gets the whole
    /// state with the next change or when it rejoins). A node that is alone should
    /// return Ok.
    async fn push_state(&self, lun: u64, state: Bytes) -> Result<(), String>;

    /// Called for every SET TARGET PORT GROUPS that changes something, with its
    /// validated `changes` (group, state), before it runs. `None`: apply them on this
    /// node (it orders changes, or is alone). `Some(Ok(()))`: the partner applied
    /// them and has already installed its new explicit states on this node (through
    /// [`crate::ScsiTarget::install_alua_state`]). `Some(Err(why))`: they could not be
    /// applied now (the command answers NOT READY, so multipath retries on another
    /// path). The default runs every SET TARGET PORT GROUPS here.
    async fn forward_set_tpg(
        &self,
        lun: u64,
        nexus: &ItNexus,
        changes: &[(u16, AluaState)],
    ) -> Option<Result<(), String>> {
        let _ = (lun, nexus, changes);
        None
    }

    /// After a SET TARGET PORT GROUPS changed the explicit ALUA states on this node
    /// (or when a partner rejoins): sends them all (`states`: group, state) to the
    /// partner, which installs them with [`crate::ScsiTarget::install_alua_state`],
    /// sparing `origin` (the I_T nexus that sent the command, if any) the unit
    /// attention. The command answers only after this returns; on Err it answers
    /// HARDWARE ERROR and the local change stays (the partner gets the whole state
    /// with the next change or when it rejoins). A node that is alone should return
    /// Ok. The default sends nothing.
    async fn push_alua_state(
        &self,
        lun: u64,
        origin: Option<&ItNexus>,
        states: &[(u16, AluaState)],
    ) -> Result<(), String> {
        let _ = (lun, origin, states);
        Ok(())
    }

    /// The SPC-2 reservation of `lun` ended on this node without a command: its
    /// holder's I_T nexus was lost (`holder`) or the LU was reset (None: whoever
    /// holds it). `None`: this node orders changes (it then pushes its state
    /// itself). `Some(Ok(()))`: the partner, which orders them, ended the
    /// reservation if `holder` still held it there and installed its state back
    /// on this node. `Some(Err(why))`: it could not be asked. The default orders
    /// everything here.
    async fn forward_spc2_end(
        &self,
        lun: u64,
        holder: Option<&NexusId>,
    ) -> Option<Result<(), String>> {
        let _ = (lun, holder);
        None
    }

    /// A reset reached `lun` on this node (`kind`): the partner establishes
    /// the same unit attention on its own I_T nexuses of the LU, whose
    /// initiators reach the same LU through its ports (SAM: every nexus of
    /// the LU learns of a reset), and stops its copies into it. Awaited
    /// before the reset is answered; an error is logged and the reset still
    /// answered (a partner that cannot be asked now learns nothing). The
    /// default tells nobody.
    async fn reset_elsewhere(&self, lun: u64, kind: ResetKind) -> Result<(), String> {
        let _ = (lun, kind);
        Ok(())
    }

    /// Who may reach the LU changed on this node ([`crate::ScsiTarget::access_lines`]:
    /// host groups, admission rules): a replicated LU compares them with the
    /// partner's. Must not wait. The default does nothing.
    fn access_changed(&self) {}
}

/// Which reset reached a LU, for [`PrReplication::reset_elsewhere`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResetKind {
    /// LOGICAL UNIT RESET: BUS DEVICE RESET FUNCTION OCCURRED (29h/03h).
    LogicalUnit,
    /// TARGET WARM or COLD RESET: POWER ON, RESET, OR BUS DEVICE RESET
    /// OCCURRED (29h/00h), as this node raises for it.
    Target,
}

impl ResetKind {
    /// The code on the wire between the two nodes.
    pub fn code(self) -> u8 {
        match self {
            ResetKind::LogicalUnit => 0,
            ResetKind::Target => 1,
        }
    }

    /// From [`ResetKind::code`]; None for a code this version does not know.
    pub fn from_code(c: u8) -> Option<ResetKind> {
        match c {
            0 => Some(ResetKind::LogicalUnit),
            1 => Some(ResetKind::Target),
            _ => None,
        }
    }

    /// The unit attention the reset establishes.
    pub(crate) fn sense(self) -> crate::sense::Sense {
        match self {
            ResetKind::LogicalUnit => crate::sense::codes::BUS_DEVICE_RESET,
            ResetKind::Target => crate::sense::codes::POWER_ON_RESET,
        }
    }
}

/// Tells the partner that a reset of `kind` reached `lu` here (see
/// [`PrReplication::reset_elsewhere`]), and returns once it has answered or
/// could not be asked. Runs to its end even if the caller goes away.
pub(crate) async fn reset_everywhere(lu: Arc<LogicalUnit>, kind: ResetKind) {
    let Some(repl) = lu.pr_replication.read().clone() else {
        return;
    };
    block::detach::detached(async move {
        if let Err(why) = repl.reset_elsewhere(lu.lun, kind).await {
            tracing::warn!(
                lun = lu.lun,
                why,
                "the partner could not be told of the reset: its initiators get no unit attention for it"
            );
        }
    })
    .await
}

/// Aborts running tasks for PREEMPT AND ABORT and for a reset that came
/// through the HA partner: the transport knows them.
#[async_trait::async_trait]
pub trait TaskAbort: Send + Sync + 'static {
    /// Aborts every task the I_T nexuses `victims` have on the target's LUN
    /// `target_lun` (each nexus may number it differently: see
    /// [`crate::ScsiTarget::seen_lun`]) and returns once they are gone.
    async fn abort_tasks(&self, target_lun: u64, victims: &[NexusId]);

    /// Aborts every task of every I_T nexus on the target's LUN `target_lun`
    /// (a LOGICAL UNIT or target reset through the partner); true once they
    /// are gone, false if some did not end within the transport's drain time.
    async fn abort_lu_tasks(&self, target_lun: u64) -> bool;
}

/// PERSISTENT RESERVE OUT on `lu`: forwarded to the partner when `forward` and the
/// partner orders PR changes; otherwise run here, one at a time per LU, with the new
/// state pushed to the partner before answering. A PREEMPT AND ABORT aborts the
/// preempted nexuses' tasks on this LU through `aborter` (except the issuing
/// nexus: the command itself is one of its tasks) before it answers.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn pr_out(
    lu: &LogicalUnit,
    nexus: &ItNexus,
    cdb: &Cdb,
    raw_cdb: &Bytes,
    data: &Bytes,
    ports: &[TargetPort],
    forward: bool,
    aborter: Option<Arc<dyn TaskAbort>>,
) -> CmdResult {
    let repl = lu.pr_replication.read().clone();
    if let (true, Some(r)) = (forward, &repl) {
        if let Some(resp) = r.forward_out(lu.lun, nexus, raw_cdb, data).await {
            return Err(Fail::Forwarded(resp));
        }
    }
    let order = lu.pr_order.clone().lock_owned().await;
    // the copy records made before a preemption (see below)
    let cut = lu.intents.cut();
    let (done, state, victims) = admin::pr_out(lu, nexus, cdb, data, ports, repl.is_some())?;
    let victims: Vec<NexusId> = victims
        .into_iter()
        .filter(|v| {
            !(v.initiator_port.eq_ignore_ascii_case(&nexus.initiator_port)
                && v.relative_port_id == nexus.relative_port_id)
        })
        .collect();
    // The change is made here: its aborts and the partner's copy of it run to
    // their end, in order, even if this command is dropped (aborted itself,
    // its connection lost). Dropped before the push, the partner kept the old
    // reservation (a preempted initiator still writing through its ports),
    // and a retry changes nothing here, so pushes nothing.
    let (lun, write_order, intents) = (lu.lun, lu.write_order.clone(), lu.intents.clone());
    let pushed = block::detach::detached(async move {
        let _order = order;
        abort_preempted(lun, &victims, aborter.as_ref(), &write_order, "here").await;
        if !victims.is_empty() {
            // a preempted initiator's copy onto this LU, sent to another LU
            // (so no task of this one), stops at its next batch: its restart
            // record goes now, before the answer, or a crash in between ran
            // it again at the next start over what was written after the
            // fence (review of 2026-12-06). Other copies made before lose
            // theirs too (they run on, as unrecorded copies do).
            intents.retire(cut, None).await;
        }
        match &repl {
            Some(r) => push(r.as_ref(), lun, state).await,
            None => true,
        }
    })
    .await;
    if !pushed {
        // The change stays here. HARDWARE ERROR rather than NOT READY: multipath
        // initiators retry NOT READY on another path, and a retried PR OUT would
        // run against the changed state (e.g. a second REGISTER conflicts).
        return Err(Fail::Check(
            codes::INTERNAL_TARGET_FAILURE,
            done.transfer_len_bytes,
        ));
    }
    Ok(done)
}

/// RESERVE(6/10) or RELEASE(6/10) on `lu`: with an HA partner, forwarded to it
/// when `forward` and it orders changes, otherwise run here in order with the
/// PR OUTs, the state pushed before answering (as [`pr_out`]), changed or not:
/// a holder's RESERVE again, which changes nothing, puts right a partner whose
/// copy missed a push.
pub(crate) async fn reserve_release(
    lu: &LogicalUnit,
    nexus: &ItNexus,
    cdb: &Cdb,
    raw_cdb: &Bytes,
    forward: bool,
) -> CmdResult {
    let Some(repl) = lu.pr_replication.read().clone() else {
        return admin::reserve_release(lu, nexus, cdb);
    };
    if forward {
        if let Some(resp) = repl
            .forward_out(lu.lun, nexus, raw_cdb, &Bytes::new())
            .await
        {
            return Err(Fail::Forwarded(resp));
        }
    }
    let order = lu.pr_order.clone().lock_owned().await;
    let state = admin::reserve_release_replicated(lu, nexus, cdb)?;
    let lun = lu.lun;
    let pushed = block::detach::detached(async move {
        let _order = order;
        push(repl.as_ref(), lun, Some(state)).await
    })
    .await;
    if !pushed {
        return Err(Fail::Check(codes::INTERNAL_TARGET_FAILURE, 0));
    }
    Ok(Done::empty())
}

/// Pushes `state` (if any) to the partner; false (logged) if that failed.
async fn push(repl: &dyn PrReplication, lun: u64, state: Option<Bytes>) -> bool {
    let Some(state) = state else {
        return true;
    };
    match repl.push_state(lun, state).await {
        Ok(()) => true,
        Err(e) => {
            tracing::error!(lun, error = %e, "pushing reservation state to the partner failed");
            false
        }
    }
}

/// The SPC-2 reservation of `lu` ended here without a command: its holder's
/// I_T nexus was lost (`holder`), or a reset reached the LU (None; called for
/// every reset, since the holder may be known to the leader only). Returns
/// once the partner agrees: a follower has the leader end it there too (see
/// [`PrReplication::forward_spc2_end`]), which installs its state back; the
/// node that orders changes pushes its own. Awaited, so that a reset is not
/// answered, nor a reinstating session let in, before the reservation ended on
/// both nodes: ended later, it would end one taken since. Runs to its end
/// even if the caller goes away.
pub(crate) async fn spc2_end_everywhere(lu: Arc<LogicalUnit>, holder: Option<NexusId>) {
    let Some(repl) = lu.pr_replication.read().clone() else {
        return;
    };
    block::detach::detached(async move {
        let lun = lu.lun;
        match repl.forward_spc2_end(lun, holder.as_ref()).await {
            Some(Ok(())) => {}
            Some(Err(why)) => tracing::warn!(
                lun,
                why,
                "the partner could not be told that an SPC-2 reservation ended"
            ),
            None => {
                if let Err(e) = push_snapshot(&lu, repl.as_ref()).await {
                    tracing::error!(lun, error = %e, "pushing reservation state to the partner failed");
                }
            }
        }
    })
    .await
}

/// Pushes `lu`'s whole reservation state through `repl`, ordered with its PR
/// OUTs: none runs between the snapshot and its push, so the partner cannot
/// install it over a newer state.
pub(crate) async fn push_snapshot(
    lu: &LogicalUnit,
    repl: &dyn PrReplication,
) -> Result<(), String> {
    let _order = lu.pr_order.lock().await;
    repl.push_state(lu.lun, lu.pr.state()).await
}

/// On the node that orders changes: ends `lu`'s SPC-2 reservation if `holder`
/// holds it (None: whoever does), in order with the PR OUTs, and pushes its
/// state to the partner before returning, changed or not (a partner whose
/// copy missed a push is put right).
pub(crate) async fn end_spc2_here(
    lu: &LogicalUnit,
    holder: Option<&NexusId>,
) -> Result<(), String> {
    let order = lu.pr_order.clone().lock_owned().await;
    lu.pr.end_spc2(holder);
    let repl = lu.pr_replication.read().clone();
    let (lun, state) = (lu.lun, lu.pr.state());
    let pushed = block::detach::detached(async move {
        let _order = order;
        match repl {
            Some(r) => push(r.as_ref(), lun, Some(state)).await,
            None => true,
        }
    })
    .await;
    match pushed {
        true => Ok(()),
        false => Err("the new state did not reach the partner".into()),
    }
}

/// The PREEMPT AND ABORT of the preempted nexuses `victims` on LU `lun`, on
/// the node that ran it (`at` "here") or on the partner that installed its
/// state ("on the partner"): their tasks are aborted through `aborter`, then
/// the writes under way on the LU (a copy's batch, run by a command sent to
/// another LU and so not aborted) end before this returns; the next ones see
/// the new reservation (crate::copy::Through).
pub(crate) async fn abort_preempted(
    lun: u64,
    victims: &[NexusId],
    aborter: Option<&Arc<dyn TaskAbort>>,
    write_order: &tokio::sync::RwLock<()>,
    at: &str,
) {
    if victims.is_empty() {
        return;
    }
    if let Some(a) = aborter {
        tracing::info!(
            lun,
            nexuses = victims.len(),
            at,
            "PREEMPT AND ABORT: aborting their tasks"
        );
        a.abort_tasks(lun, victims).await;
    }
    drop(write_order.write().await);
}

#[cfg(test)]
mod tests;
