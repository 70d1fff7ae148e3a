//! Task management functions: aborts and resets, answered once the affected
//! commands are gone.

use crate::conn::{pdu_log, Conn, Flow};
use bytes::Bytes;
use iscsi_proto::frame::Frame;
use iscsi_proto::pdu::TaskMgmtRequest;
use iscsi_proto::target::{reject_reason, tmf_response, TargetPdu, TaskMgmtResponse};
use iscsi_proto::{lun_from_wire, sn_le, sn_lt};
use std::sync::Arc;
use std::time::Duration;

/// Function codes.
mod function {
    pub const ABORT_TASK: u8 = 1;
    pub const ABORT_TASK_SET: u8 = 2;
    pub const CLEAR_ACA: u8 = 3;
    pub const CLEAR_TASK_SET: u8 = 4;
    pub const LOGICAL_UNIT_RESET: u8 = 5;
    pub const TARGET_WARM_RESET: u8 = 6;
    pub const TARGET_COLD_RESET: u8 = 7;
    pub const TASK_REASSIGN: u8 = 8;
}

/// Whether every aborted task of `aborted` (per session) ended within `drain`.
async fn all_gone(
    aborted: &[(Arc<crate::session::Session>, Vec<crate::session::TaskId>)],
    drain: Duration,
) -> bool {
    let mut gone = true;
    for (s, itts) in aborted {
        gone &= s.wait_gone(itts, drain).await;
    }
    gone
}

/// Aborts the tasks every session of target `target` but `except` has on the
/// target's LU `lu`, each session's as it numbers the LU (LUN masking gives
/// each its own numbers); returns the sessions and the tasks aborted.
fn abort_on_lu(
    ctx: &crate::server::Ctx,
    target: usize,
    lu: u64,
    except: Option<&Arc<crate::session::Session>>,
) -> Vec<(Arc<crate::session::Session>, Vec<crate::session::TaskId>)> {
    let mut aborted = Vec::new();
    for s in ctx.registry.of_target(target) {
        if except.is_some_and(|e| Arc::ptr_eq(&s, e)) {
            continue;
        }
        let (Some(scsi), Some(nexus)) = (&s.scsi, &s.nexus) else {
            continue;
        };
        if let Some(theirs) = scsi.seen_lun(nexus, lu) {
            s.abort_pending_writes(Some(theirs));
            let itts = s.abort_where(|l| l == theirs);
            aborted.push((s, itts));
        }
    }
    aborted
}

/// Sends the task management response `r` (a refusal) on `out`.
async fn rejected(out: &crate::exec::ConnOut, r: TargetPdu) {
    let _ = out
        .tx
        .send(crate::writer::OutPdu::new(r, Bytes::new()))
        .await;
}

/// Handles one Task Management Function Request.
pub(crate) async fn on_tmf(conn: &mut Conn, f: &Frame, t: TaskMgmtRequest, imm: bool) -> Flow {
    if conn.discovery {
        pdu_log!(conn, warn, peer = %conn.peer, "task management in a discovery session");
        conn.reject(reject_reason::PROTOCOL_ERROR, &f.raw_header)
            .await;
        conn.consume_rejected_cmd_sn(&f.raw_header);
        return Flow::Continue;
    }
    if !imm && !conn.session.window.accept(t.cmd_sn, false) {
        pdu_log!(conn, warn, peer = %conn.peer, cmd_sn = t.cmd_sn, "TMF outside the CmdSN window; dropped");
        return Flow::Continue;
    }
    // one of the connection's waiter slots, held until answered: a flood of
    // task management functions waits here instead of piling up tasks
    let Ok(waiter) = conn.tmf_waiters.clone().acquire_owned().await else {
        return Flow::Continue;
    };
    let lun = lun_from_wire(t.lun);
    let itt = t.itt;
    let respond =
        move |response: u8| TargetPdu::TaskMgmtResponse(TaskMgmtResponse { response, itt });
    let drain = Duration::from_millis(conn.ctx.limits.drain_timeout_ms);
    pdu_log!(conn, info, peer = %conn.peer, function = t.function, lun, rtt = t.rtt, "task management");
    match t.function {
        function::ABORT_TASK => {
            // the task is the one of this tag on this LUN (SAM: I_T_L_Q); a
            // tag of another LUN's task does not name it (review of 2026-12-06)
            let ours =
                (conn.writes.get(&t.rtt)).is_some_and(|w| lun_from_wire(w.info.lun_raw) == lun);
            let write = if ours {
                conn.writes.remove(&t.rtt)
            } else {
                None
            };
            if let Some(w) = write {
                conn.buffered_bytes -= w.buffered_bytes();
                if w.info.holds_slot {
                    conn.session.window.release();
                }
                conn.send(respond(tmf_response::COMPLETE), Bytes::new())
                    .await;
                return Flow::Continue;
            }
            if let Some(task) = conn.session.abort_where_itt(t.rtt, lun) {
                let session = conn.session.clone();
                let out = conn.out.clone();
                tokio::spawn(async move {
                    let _waiter = waiter;
                    // a write the task already handed to the volume ends first
                    // (scsi::in_flight): answered earlier, the initiator's next
                    // write to the same blocks could land before it
                    let r = match session.wait_gone(&[task], drain).await {
                        true => tmf_response::COMPLETE,
                        false => {
                            tracing::warn!(
                                rtt = t.rtt,
                                "ABORT TASK: the task did not end within the drain time"
                            );
                            tmf_response::REJECTED
                        }
                    };
                    let _ = out
                        .tx
                        .send(crate::writer::OutPdu::new(respond(r), Bytes::new()))
                        .await;
                });
            } else {
                // RFC 7143 11.5.1: a task that is not here but whose RefCmdSN
                // is inside the CmdSN window and ahead of this request was sent
                // and not received: it counts as received, and aborted. Anything
                // else (above all a command already answered: its CmdSN is
                // behind the window) does not exist.
                let (exp, max) = conn.session.window.get();
                let r = if sn_le(exp, t.ref_cmd_sn)
                    && sn_le(t.ref_cmd_sn, max)
                    && sn_lt(t.ref_cmd_sn, t.cmd_sn)
                {
                    tmf_response::COMPLETE
                } else {
                    tmf_response::NO_TASK
                };
                conn.send(respond(r), Bytes::new()).await;
            }
        }
        function::ABORT_TASK_SET | function::CLEAR_TASK_SET | function::LOGICAL_UNIT_RESET => {
            drop_writes(conn, |l| l == lun);
            // This session's tasks on the LUN as it numbers it; for a reset or a
            // cleared task set, every session's tasks on the same LU, each as
            // that session numbers it (LUN masking gives each its own numbers).
            let mut aborted = vec![(conn.session.clone(), conn.session.abort_where(|l| l == lun))];
            let lu = match (&conn.session.scsi, &conn.session.nexus) {
                (Some(scsi), Some(nexus)) if t.function != function::ABORT_TASK_SET => {
                    scsi.target_lun(nexus, lun)
                }
                _ => None,
            };
            if let (Some(lu), Some(i)) = (lu, conn.session.target) {
                aborted.extend(abort_on_lu(&conn.ctx, i, lu, Some(&conn.session)));
            }
            let session = conn.session.clone();
            let out = conn.out.clone();
            let function = t.function;
            tokio::spawn(async move {
                let _waiter = waiter;
                if !all_gone(&aborted, drain).await {
                    // not reset: the initiator escalates
                    tracing::warn!(
                        lun,
                        function,
                        "task management: aborted tasks did not end within the drain time"
                    );
                    rejected(&out, respond(tmf_response::REJECTED)).await;
                    return;
                }
                let mut r = tmf_response::COMPLETE;
                if let (Some(scsi), Some(nexus)) = (&session.scsi, &session.nexus) {
                    match function {
                        function::CLEAR_TASK_SET => scsi.clear_task_set(nexus, lun).await,
                        function::LOGICAL_UNIT_RESET if !scsi.lun_reset(nexus, lun).await => {
                            r = tmf_response::NO_LUN;
                        }
                        _ => {}
                    }
                }
                let _ = out
                    .tx
                    .send(crate::writer::OutPdu::new(respond(r), Bytes::new()))
                    .await;
            });
        }
        function::TARGET_WARM_RESET | function::TARGET_COLD_RESET => {
            drop_writes(conn, |_| true);
            let sessions = conn
                .session
                .target
                .map(|i| conn.ctx.registry.of_target(i))
                .unwrap_or_default();
            // with host groups, the reset reaches the LUs the requester sees
            // and, on them, every session's tasks (each in its own numbers);
            // the tasks and sessions of other hosts' LUs are not its to end
            let scope = match (&conn.session.scsi, &conn.session.nexus) {
                (Some(scsi), Some(nexus)) if scsi.masked() => Some(scsi.seen_target_luns(nexus)),
                _ => None,
            };
            let aborted: Vec<_> = sessions
                .into_iter()
                .filter_map(|s| {
                    let lus = match &scope {
                        // the requester's own tasks are all on LUs it sees
                        Some(lus) if !Arc::ptr_eq(&s, &conn.session) => lus,
                        _ => {
                            s.abort_pending_writes(None);
                            let itts = s.abort_where(|_| true);
                            return Some((s, itts));
                        }
                    };
                    let (Some(scsi), Some(nexus)) = (&s.scsi, &s.nexus) else {
                        return None;
                    };
                    let theirs: Vec<u64> = lus
                        .iter()
                        .filter_map(|&lu| scsi.seen_lun(nexus, lu))
                        .collect();
                    if theirs.is_empty() {
                        return None;
                    }
                    for &l in &theirs {
                        s.abort_pending_writes(Some(l));
                    }
                    let itts = s.abort_where(|l| theirs.contains(&l));
                    Some((s, itts))
                })
                .collect();
            let masked = scope.is_some();
            let cold = t.function == function::TARGET_COLD_RESET;
            let session = conn.session.clone();
            let out = conn.out.clone();
            tokio::spawn(async move {
                let _waiter = waiter;
                if !all_gone(&aborted, drain).await {
                    // not reset, as a LUN reset whose tasks do not end: the
                    // initiator escalates (review of 2026-12-06: answered
                    // COMPLETE, with an aborted write still able to land)
                    tracing::warn!("target reset: aborted tasks did not end within the drain time");
                    rejected(&out, respond(tmf_response::REJECTED)).await;
                    return;
                }
                if let (Some(scsi), Some(nexus)) = (&session.scsi, &session.nexus) {
                    scsi.target_reset(nexus).await;
                }
                let _ = out
                    .tx
                    .send(crate::writer::OutPdu::new(
                        respond(tmf_response::COMPLETE),
                        Bytes::new(),
                    ))
                    .await;
                if cold {
                    // A cold reset drops every connection of the target, ours
                    // last; with host groups, only the requester's own
                    if !masked {
                        for (s, _) in &aborted {
                            if !Arc::ptr_eq(s, &session) {
                                let _ = s.kill.send_replace(true);
                            }
                        }
                    }
                    let _ = session.kill.send_replace(true);
                }
            });
        }
        function::CLEAR_ACA => {
            conn.send(respond(tmf_response::NOT_SUPPORTED), Bytes::new())
                .await
        }
        function::TASK_REASSIGN => {
            conn.send(respond(tmf_response::REASSIGN_NOT_SUPPORTED), Bytes::new())
                .await
        }
        _ => {
            conn.send(respond(tmf_response::REJECTED), Bytes::new())
                .await
        }
    }
    Flow::Continue
}

fn drop_writes(conn: &mut Conn, pred: impl Fn(u64) -> bool) {
    let itts: Vec<u32> = conn
        .writes
        .iter()
        .filter(|(_, w)| pred(lun_from_wire(w.info.lun_raw)))
        .map(|(i, _)| *i)
        .collect();
    for itt in itts {
        if let Some(w) = conn.writes.remove(&itt) {
            conn.buffered_bytes -= w.buffered_bytes();
            if w.info.holds_slot {
                conn.session.window.release();
            }
        }
    }
}

/// PREEMPT AND ABORT's task abort for one target: the sessions of the preempted
/// I_T nexuses abort their commands on the LU (as each numbers it), and the call
/// returns once they are gone (bounded by the drain time, like a TMF); and a
/// reset through the HA partner's: every session's commands on the LU.
pub(crate) struct PreemptAbort {
    pub ctx: std::sync::Weak<crate::server::Ctx>,
    pub target: usize,
}

#[async_trait::async_trait]
impl scsi::TaskAbort for PreemptAbort {
    async fn abort_tasks(&self, target_lun: u64, victims: &[scsi::pr::NexusId]) {
        let Some(ctx) = self.ctx.upgrade() else {
            return;
        };
        let drain = Duration::from_millis(ctx.limits.drain_timeout_ms);
        let mut aborted = Vec::new();
        for s in ctx.registry.of_target(self.target) {
            let (Some(nexus), Some(scsi)) = (&s.nexus, &s.scsi) else {
                continue;
            };
            let hit = victims.iter().any(|v| {
                // folded: a registration may carry the name in capitals
                // (saved before names were folded at login, or from a
                // TransportID), as the reservation code matches it
                v.initiator_port.eq_ignore_ascii_case(&nexus.initiator_port)
                    && v.relative_port_id == nexus.relative_port_id
            });
            let Some(lun) = hit.then(|| scsi.seen_lun(nexus, target_lun)).flatten() else {
                continue;
            };
            s.abort_pending_writes(Some(lun));
            let itts = s.abort_where(|l| l == lun);
            tracing::info!(
                initiator = %nexus.initiator_port,
                lun,
                tasks = itts.len(),
                "tasks aborted by PREEMPT AND ABORT"
            );
            aborted.push((s, itts));
        }
        for (s, itts) in &aborted {
            s.wait_all_gone(itts, drain, "PREEMPT AND ABORT").await;
        }
    }

    async fn abort_lu_tasks(&self, target_lun: u64) -> bool {
        let Some(ctx) = self.ctx.upgrade() else {
            return true;
        };
        let drain = Duration::from_millis(ctx.limits.drain_timeout_ms);
        let aborted = abort_on_lu(&ctx, self.target, target_lun, None);
        let tasks: usize = aborted.iter().map(|(_, itts)| itts.len()).sum();
        if tasks > 0 {
            tracing::info!(
                lun = target_lun,
                tasks,
                "tasks aborted by a reset through the HA partner"
            );
        }
        all_gone(&aborted, drain).await
    }
}
