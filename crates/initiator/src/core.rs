//! The session core: a pure state machine (no sockets, no clocks) holding the
//! sequence numbers, the tasks in flight and the outbox of PDUs to send.
//!
//! Callers submit commands (which queue their PDUs in CmdSN order); the reader
//! feeds every target PDU to [`Core::on_pdu`], which assembles Data-In, answers
//! R2T and NOP-In by queueing PDUs, and completes tasks through oneshot channels.

use crate::frame::{FrameRef, OutPdu};
use crate::login::LoginParams;
use crate::InitiatorError;
use bytes::{Bytes, BytesMut};
use iscsi_proto::pdu::{
    encode_initiator_bhs, DataOut, InitiatorPdu, LogoutRequest, NopOut, ScsiCommand,
};
use iscsi_proto::target::{async_event, Residual, TargetPdu};
use iscsi_proto::{lun_to_wire, sn_le, sn_lt, RESERVED_TAG};
use std::collections::{HashMap, VecDeque};
use tokio::sync::oneshot;

/// The outcome of a SCSI command that reached the target and got a status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScsiResult {
    /// SCSI status (0 GOOD, 2 CHECK CONDITION, 8 BUSY, ...).
    pub status: u8,
    /// Sense data, when the target sent some.
    pub sense: Option<Bytes>,
    /// Data read (at most the length asked for).
    pub data_in: Bytes,
    /// Residual count the target reported.
    pub residual: Residual,
}

/// What a completed task sends to its waiter.
pub(crate) type TaskResult = Result<ScsiResult, InitiatorError>;

/// Most bytes of sense data kept (SPC: 252 is the largest useful).
const SENSE_BYTES_MAX: usize = 252;
/// CDBs longer than 16 bytes go in an extended CDB AHS; the format caps it.
pub(crate) const CDB_BYTES_MAX: usize = 260;

struct Task {
    data_out: Bytes,
    data_in_len_bytes: u32,
    data_in: BytesMut,
    /// Highest byte written into `data_in` plus one.
    data_in_end_bytes: u32,
    done: Option<oneshot::Sender<TaskResult>>,
}

/// Why a command could not be queued now.
#[derive(Debug)]
pub(crate) enum SubmitError {
    /// CmdSN is beyond MaxCmdSN: wait for the target to open the window.
    WindowClosed,
    /// The session is closed or the request is invalid.
    Failed(InitiatorError),
}

/// What the reader must do after a batch of PDUs.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RxEffects {
    /// MaxCmdSN moved: wake commands waiting for the window.
    pub window_opened: bool,
    /// PDUs were queued: wake the writer.
    pub outbox_pushed: bool,
    /// The target asked for a logout (Async event 1).
    pub logout_requested: bool,
    /// A Logout Response arrived: the connection is finished.
    pub logged_out: bool,
}

/// Negotiated values the core needs.
#[derive(Debug, Clone, Copy)]
pub(crate) struct CoreParams {
    pub send_segment_bytes_max: u32,
    pub first_burst_bytes: u32,
    pub immediate_data: bool,
    pub initial_r2t: bool,
}

impl From<&LoginParams> for CoreParams {
    fn from(p: &LoginParams) -> Self {
        CoreParams {
            send_segment_bytes_max: p.send_data_segment_bytes_max.max(512),
            first_burst_bytes: p.first_burst_bytes,
            immediate_data: p.immediate_data,
            initial_r2t: p.initial_r2t,
        }
    }
}

/// Sequence numbers, tasks and outbox of one session/connection.
pub(crate) struct Core {
    params: CoreParams,
    cmd_sn: u32,
    exp_cmd_sn: u32,
    max_cmd_sn: u32,
    exp_stat_sn: u32,
    next_itt: u32,
    tasks: HashMap<u32, Task>,
    outbox: VecDeque<OutPdu>,
    closed: Option<InitiatorError>,
    logout: Option<(u32, oneshot::Sender<TaskResult>)>,
}

impl Core {
    /// A core entering full feature phase with the values login ended with.
    pub fn new(
        params: CoreParams,
        cmd_sn: u32,
        exp_cmd_sn: u32,
        max_cmd_sn: u32,
        exp_stat_sn: u32,
    ) -> Core {
        Core {
            params,
            cmd_sn,
            exp_cmd_sn,
            max_cmd_sn,
            exp_stat_sn,
            next_itt: 1,
            tasks: HashMap::with_capacity(256),
            outbox: VecDeque::with_capacity(256),
            closed: None,
            logout: None,
        }
    }

    /// ExpStatSN to stamp on outgoing PDUs.
    pub fn exp_stat_sn(&self) -> u32 {
        self.exp_stat_sn
    }

    /// Commands in flight.
    pub fn tasks_in_flight(&self) -> usize {
        self.tasks.len()
    }

    /// Why the session closed, if it did.
    pub fn closed(&self) -> Option<&InitiatorError> {
        self.closed.as_ref()
    }

    /// Moves every queued PDU into `out` (keeps both allocations).
    pub fn drain_outbox(&mut self, out: &mut Vec<OutPdu>) {
        out.extend(self.outbox.drain(..));
    }

    fn alloc_itt(&mut self) -> u32 {
        loop {
            let itt = self.next_itt;
            self.next_itt = self.next_itt.wrapping_add(1);
            if itt != RESERVED_TAG && !self.tasks.contains_key(&itt) {
                return itt;
            }
        }
    }

    fn window_open(&self) -> bool {
        sn_le(self.cmd_sn, self.max_cmd_sn)
    }

    /// Queues a SCSI command (and its immediate/unsolicited data) in CmdSN order.
    pub fn submit(
        &mut self,
        lun: u64,
        cdb: &[u8],
        data_out: Bytes,
        data_in_len_bytes: u32,
    ) -> Result<(u32, oneshot::Receiver<TaskResult>), SubmitError> {
        if let Some(e) = &self.closed {
            return Err(SubmitError::Failed(e.clone()));
        }
        if cdb.is_empty() || cdb.len() > CDB_BYTES_MAX {
            return Err(SubmitError::Failed(InitiatorError::InvalidRequest(
                "CDB length",
            )));
        }
        if !data_out.is_empty() && data_in_len_bytes > 0 {
            return Err(SubmitError::Failed(InitiatorError::InvalidRequest(
                "bidirectional commands are not supported",
            )));
        }
        let Ok(data_out_len) = u32::try_from(data_out.len()) else {
            return Err(SubmitError::Failed(InitiatorError::InvalidRequest(
                "data too long",
            )));
        };
        if !self.window_open() {
            return Err(SubmitError::WindowClosed);
        }
        let itt = self.alloc_itt();
        let cmd_sn = self.cmd_sn;
        self.cmd_sn = self.cmd_sn.wrapping_add(1);
        let lun_raw = lun_to_wire(lun);
        let seg = self.params.send_segment_bytes_max as usize;
        let first_burst = (self.params.first_burst_bytes as usize).min(data_out.len());
        let immediate_len = if self.params.immediate_data {
            first_burst.min(seg)
        } else {
            0
        };
        let unsolicited_end = if self.params.initial_r2t {
            immediate_len
        } else {
            first_burst
        };
        let mut cdb16 = [0u8; 16];
        let n = cdb.len().min(16);
        cdb16[..n].copy_from_slice(&cdb[..n]);
        let ahs = if cdb.len() > 16 {
            iscsi_proto::frame::encode_ahs(&iscsi_proto::frame::Ahs {
                extended_cdb: Some(Bytes::copy_from_slice(&cdb[16..])),
                bidi_read_len_bytes: None,
            })
        } else {
            Vec::new()
        };
        let cmd = InitiatorPdu::ScsiCommand(ScsiCommand {
            final_bit: unsolicited_end == immediate_len,
            read: data_in_len_bytes > 0,
            write: data_out_len > 0,
            attr: 1,
            lun: lun_raw,
            itt,
            edtl_bytes: if data_out_len > 0 {
                data_out_len
            } else {
                data_in_len_bytes
            },
            cmd_sn,
            exp_stat_sn: 0,
            cdb: cdb16,
        });
        let imm = data_out.slice(..immediate_len);
        let header = encode_initiator_bhs(&cmd, false, ahs.len(), imm.len() as u32);
        self.outbox.push_back(OutPdu {
            header,
            ahs,
            data: imm,
        });
        if unsolicited_end > immediate_len {
            self.queue_data_out(
                lun_raw,
                itt,
                RESERVED_TAG,
                &data_out,
                immediate_len,
                unsolicited_end,
            );
        }
        let (tx, rx) = oneshot::channel();
        self.tasks.insert(
            itt,
            Task {
                data_out,
                data_in_len_bytes,
                data_in: BytesMut::new(),
                data_in_end_bytes: 0,
                done: Some(tx),
            },
        );
        Ok((itt, rx))
    }

    /// Queues Data-Out PDUs carrying `data[start..end]`, each at most one segment.
    fn queue_data_out(
        &mut self,
        lun_raw: u64,
        itt: u32,
        ttt: u32,
        data: &Bytes,
        start: usize,
        end: usize,
    ) {
        let seg = self.params.send_segment_bytes_max as usize;
        let mut off = start;
        let mut data_sn = 0u32;
        while off < end {
            let n = (end - off).min(seg);
            let pdu = InitiatorPdu::DataOut(DataOut {
                final_bit: off + n == end,
                lun: lun_raw,
                itt,
                ttt,
                exp_stat_sn: 0,
                data_sn,
                buffer_offset_bytes: off as u32,
            });
            self.outbox.push_back(OutPdu {
                header: encode_initiator_bhs(&pdu, false, 0, n as u32),
                ahs: Vec::new(),
                data: data.slice(off..off + n),
            });
            data_sn = data_sn.wrapping_add(1);
            off += n;
        }
    }

    /// Queues an immediate Logout Request (close the session).
    pub fn submit_logout(&mut self) -> Result<oneshot::Receiver<TaskResult>, InitiatorError> {
        if let Some(e) = &self.closed {
            return Err(e.clone());
        }
        let itt = self.alloc_itt();
        let pdu = InitiatorPdu::Logout(LogoutRequest {
            reason: 0,
            itt,
            cid: 0,
            cmd_sn: self.cmd_sn,
            exp_stat_sn: 0,
        });
        self.outbox.push_back(OutPdu {
            header: encode_initiator_bhs(&pdu, true, 0, 0),
            ahs: Vec::new(),
            data: Bytes::new(),
        });
        let (tx, rx) = oneshot::channel();
        self.logout = Some((itt, tx));
        Ok(rx)
    }

    /// Forgets a task whose waiter gave up (timeout); its late answers are ignored.
    pub fn forget(&mut self, itt: u32) {
        self.tasks.remove(&itt);
    }

    /// Closes the core: every task and the logout waiter get `err`.
    pub fn fail_all(&mut self, err: InitiatorError) {
        if self.closed.is_none() {
            self.closed = Some(err.clone());
        }
        for (_, mut t) in self.tasks.drain() {
            if let Some(tx) = t.done.take() {
                let _ = tx.send(Err(err.clone()));
            }
        }
        if let Some((_, tx)) = self.logout.take() {
            let _ = tx.send(Err(err));
        }
        self.outbox.clear();
    }

    fn update_window(&mut self, exp: u32, max: u32) -> bool {
        // RFC 7143 4.2.2.1: ignore values that do not form a valid window.
        if !sn_le(exp.wrapping_sub(1), max) {
            return false;
        }
        let mut opened = false;
        if sn_lt(self.max_cmd_sn, max) {
            self.max_cmd_sn = max;
            opened = true;
        }
        if sn_lt(self.exp_cmd_sn, exp) {
            self.exp_cmd_sn = exp;
        }
        opened
    }

    fn complete(&mut self, itt: u32, res: TaskResult) {
        if let Some(mut t) = self.tasks.remove(&itt) {
            if let Some(tx) = t.done.take() {
                let _ = tx.send(res);
            }
        }
    }

    fn finish_ok(&mut self, itt: u32, status: u8, sense: Option<Bytes>, residual: Residual) {
        if let Some(mut t) = self.tasks.remove(&itt) {
            let end = t.data_in_end_bytes as usize;
            let mut buf = std::mem::take(&mut t.data_in);
            buf.truncate(end);
            let res = ScsiResult {
                status,
                sense,
                data_in: buf.freeze(),
                residual,
            };
            if let Some(tx) = t.done.take() {
                let _ = tx.send(Ok(res));
            }
        }
    }

    /// Processes one target PDU. An error means the connection must be closed.
    pub fn on_pdu(&mut self, f: &FrameRef<'_>, fx: &mut RxEffects) -> Result<(), InitiatorError> {
        if f.pdu.carries_status() {
            self.exp_stat_sn = f.seq.stat_sn.wrapping_add(1);
        }
        fx.window_opened |= self.update_window(f.seq.exp_cmd_sn, f.seq.max_cmd_sn);
        match f.pdu {
            TargetPdu::DataIn(d) => {
                let Some(t) = self.tasks.get_mut(&d.itt) else {
                    tracing::debug!(itt = d.itt, "Data-In for an unknown task ignored");
                    return Ok(());
                };
                let off = d.buffer_offset_bytes as u64;
                let end = off + f.data.len() as u64;
                if end > t.data_in_len_bytes as u64 {
                    let e = InitiatorError::Protocol(format!(
                        "Data-In offset {off} + {} beyond the expected {} bytes",
                        f.data.len(),
                        t.data_in_len_bytes
                    ));
                    self.complete(d.itt, Err(e.clone()));
                    return Err(e);
                }
                let (off, end) = (off as usize, end as usize);
                if !f.data.is_empty() {
                    if t.data_in.capacity() == 0 {
                        t.data_in.reserve(t.data_in_len_bytes as usize);
                    }
                    if off == t.data_in.len() {
                        t.data_in.extend_from_slice(f.data);
                    } else {
                        if t.data_in.len() < end {
                            t.data_in.resize(end, 0);
                        }
                        t.data_in[off..end].copy_from_slice(f.data);
                    }
                    t.data_in_end_bytes = t.data_in_end_bytes.max(end as u32);
                }
                if let Some(status) = d.status {
                    self.finish_ok(d.itt, status, None, d.residual);
                }
            }
            TargetPdu::ScsiResponse(r) => {
                if r.response != 0 {
                    self.complete(r.itt, Err(InitiatorError::TargetFailure(r.response)));
                    return Ok(());
                }
                let sense = if f.data.len() >= 2 {
                    let sl = u16::from_be_bytes([f.data[0], f.data[1]]) as usize;
                    let sl = sl.min(f.data.len() - 2).min(SENSE_BYTES_MAX);
                    (sl > 0).then(|| Bytes::copy_from_slice(&f.data[2..2 + sl]))
                } else {
                    None
                };
                self.finish_ok(r.itt, r.status, sense, r.residual);
            }
            TargetPdu::R2t(r) => {
                let Some(t) = self.tasks.get(&r.itt) else {
                    tracing::debug!(itt = r.itt, "R2T for an unknown task ignored");
                    return Ok(());
                };
                let start = r.buffer_offset_bytes as u64;
                let end = start + r.desired_len_bytes as u64;
                if r.desired_len_bytes == 0 || end > t.data_out.len() as u64 {
                    let e = InitiatorError::Protocol(format!(
                        "R2T for bytes {start}..{end} of a {}-byte write",
                        t.data_out.len()
                    ));
                    self.complete(r.itt, Err(e.clone()));
                    return Err(e);
                }
                let data = t.data_out.clone();
                self.queue_data_out(r.lun, r.itt, r.ttt, &data, start as usize, end as usize);
                fx.outbox_pushed = true;
            }
            TargetPdu::NopIn(n) => {
                if n.ttt != RESERVED_TAG {
                    let pdu = InitiatorPdu::NopOut(NopOut {
                        lun: n.lun,
                        itt: RESERVED_TAG,
                        ttt: n.ttt,
                        cmd_sn: self.cmd_sn,
                        exp_stat_sn: 0,
                    });
                    self.outbox.push_back(OutPdu {
                        header: encode_initiator_bhs(&pdu, true, 0, 0),
                        ahs: Vec::new(),
                        data: Bytes::new(),
                    });
                    fx.outbox_pushed = true;
                }
            }
            TargetPdu::Reject(r) => {
                let itt = match f.data.get(16..20) {
                    Some(b) => u32::from_be_bytes([b[0], b[1], b[2], b[3]]),
                    None => RESERVED_TAG,
                };
                tracing::warn!(reason = r.reason, itt, "target rejected a PDU");
                if itt != RESERVED_TAG {
                    self.complete(itt, Err(InitiatorError::Rejected(r.reason)));
                }
            }
            TargetPdu::AsyncMessage(a) => match a.event {
                async_event::LOGOUT_REQUEST => fx.logout_requested = true,
                async_event::DROP_CONNECTION | async_event::DROP_SESSION => {
                    return Err(InitiatorError::ConnectionLost(
                        "target announced it drops the connection".into(),
                    ));
                }
                _ => tracing::debug!(event = a.event, "async message ignored"),
            },
            TargetPdu::LogoutResponse(l) => {
                if let Some((itt, tx)) = self.logout.take() {
                    if itt == l.itt {
                        let res = if l.response == 0 {
                            Ok(ScsiResult {
                                status: 0,
                                sense: None,
                                data_in: Bytes::new(),
                                residual: Residual::None,
                            })
                        } else {
                            Err(InitiatorError::Protocol(format!(
                                "logout response {}",
                                l.response
                            )))
                        };
                        let _ = tx.send(res);
                        fx.logged_out = true;
                    } else {
                        self.logout = Some((itt, tx));
                    }
                }
            }
            TargetPdu::TaskMgmtResponse(_) | TargetPdu::TextResponse(_) => {
                tracing::debug!("unexpected TMF/Text response ignored");
            }
            TargetPdu::LoginResponse(_) => {
                return Err(InitiatorError::Protocol(
                    "Login Response in full feature phase".into(),
                ));
            }
        }
        Ok(())
    }
}

/// Raw header of a PDU, for tests.
#[cfg(test)]
pub(crate) fn frame_of<'a>(
    pdu: TargetPdu,
    seq: iscsi_proto::target::SeqNumbers,
    raw: &'a mut [u8; iscsi_proto::pdu::BHS_LEN],
    data: &'a [u8],
) -> FrameRef<'a> {
    *raw = pdu.encode(&seq, data.len() as u32);
    FrameRef {
        pdu,
        seq,
        raw_header: raw,
        data,
    }
}

#[cfg(test)]
#[path = "core_tests.rs"]
mod tests;
