//! Target PDUs: typed headers, their encoder and (for initiators and tests) parser.
//!
//! Every target PDU carries StatSN, ExpCmdSN and MaxCmdSN at the same offsets; they
//! are passed separately as [`SeqNumbers`] so that a connection's writer can stamp
//! them at the moment the PDU goes on the wire.

use crate::pdu::{be32, opcode, BHS_LEN, FLAG_FINAL};
use crate::{ProtoError, RESERVED_TAG};

/// The sequence numbers stamped on every target PDU.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SeqNumbers {
    /// StatSN (meaning depends on the PDU: consumed by status-bearing PDUs, "next" otherwise).
    pub stat_sn: u32,
    /// ExpCmdSN.
    pub exp_cmd_sn: u32,
    /// MaxCmdSN.
    pub max_cmd_sn: u32,
}

/// Residual count of a response.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Residual {
    /// The transfer matched the expected length.
    #[default]
    None,
    /// Fewer bytes were transferred than expected (U bit).
    Underflow(u32),
    /// More bytes were needed than expected (O bit).
    Overflow(u32),
}

impl Residual {
    /// Residual of a transfer of `expected_bytes` when the command needed `needed_bytes`.
    pub fn of(expected_bytes: u32, needed_bytes: u32) -> Residual {
        use std::cmp::Ordering::*;
        match needed_bytes.cmp(&expected_bytes) {
            Equal => Residual::None,
            Less => Residual::Underflow(expected_bytes - needed_bytes),
            Greater => Residual::Overflow(needed_bytes - expected_bytes),
        }
    }

    fn flags(self) -> u8 {
        match self {
            Residual::None => 0,
            Residual::Underflow(_) => 0x02,
            Residual::Overflow(_) => 0x04,
        }
    }

    fn count(self) -> u32 {
        match self {
            Residual::None => 0,
            Residual::Underflow(n) | Residual::Overflow(n) => n,
        }
    }

    fn from_wire(flags: u8, count: u32) -> Residual {
        if flags & 0x04 != 0 {
            Residual::Overflow(count)
        } else if flags & 0x02 != 0 {
            Residual::Underflow(count)
        } else {
            Residual::None
        }
    }
}

/// NOP-In: answer to a ping, or a target ping (TTT != 0xffffffff).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NopIn {
    /// Raw LUN field (echoed).
    pub lun: u64,
    /// ITT of the NOP-Out answered, 0xffffffff for a target ping.
    pub itt: u32,
    /// TTT of a target ping, 0xffffffff for an answer.
    pub ttt: u32,
}

/// SCSI Response (the data segment holds SenseLength + sense data).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScsiResponse {
    /// ITT of the command.
    pub itt: u32,
    /// iSCSI response code (0x00 command completed at target, 0x01 target failure).
    pub response: u8,
    /// SCSI status.
    pub status: u8,
    /// Residual of the (write, or only) direction.
    pub residual: Residual,
    /// Residual of the read direction of a bidirectional command.
    pub bidi_residual: Residual,
    /// Number of Data-In PDUs sent for the command (ExpDataSN).
    pub exp_data_sn: u32,
}

/// SCSI Data-In; with `status` set, the status is phase-collapsed (S bit).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DataIn {
    /// F bit: last PDU of a sequence.
    pub final_bit: bool,
    /// A bit: acknowledge requested (ERL > 0 only).
    pub ack: bool,
    /// S bit and status: this PDU also ends the command.
    pub status: Option<u8>,
    /// Residual (valid with S).
    pub residual: Residual,
    /// Raw LUN field.
    pub lun: u64,
    /// ITT of the command.
    pub itt: u32,
    /// TTT (0xffffffff unless A is set).
    pub ttt: u32,
    /// DataSN.
    pub data_sn: u32,
    /// Offset of this data in the command's buffer.
    pub buffer_offset_bytes: u32,
}

/// Ready To Transfer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct R2t {
    /// Raw LUN field.
    pub lun: u64,
    /// ITT of the command.
    pub itt: u32,
    /// TTT the Data-Out PDUs must carry.
    pub ttt: u32,
    /// R2T sequence number of the command.
    pub r2t_sn: u32,
    /// Offset of the requested data.
    pub buffer_offset_bytes: u32,
    /// Length of the requested data.
    pub desired_len_bytes: u32,
}

/// Task management response codes.
pub mod tmf_response {
    /// Function complete.
    pub const COMPLETE: u8 = 0;
    /// Task does not exist.
    pub const NO_TASK: u8 = 1;
    /// LUN does not exist.
    pub const NO_LUN: u8 = 2;
    /// Task still allegiant.
    pub const STILL_ALLEGIANT: u8 = 3;
    /// Task allegiance reassignment not supported.
    pub const REASSIGN_NOT_SUPPORTED: u8 = 4;
    /// Task management function not supported.
    pub const NOT_SUPPORTED: u8 = 5;
    /// Function authorization failed.
    pub const AUTH_FAILED: u8 = 6;
    /// Function rejected.
    pub const REJECTED: u8 = 255;
}

/// Task Management Function Response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TaskMgmtResponse {
    /// Response code (see [`tmf_response`]).
    pub response: u8,
    /// ITT of the request.
    pub itt: u32,
}

/// Login Response (the data segment holds text parameters).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoginResponse {
    /// T bit.
    pub transit: bool,
    /// C bit: more text follows in the next response.
    pub cont: bool,
    /// Current stage.
    pub csg: u8,
    /// Next stage.
    pub nsg: u8,
    /// Version-max.
    pub version_max: u8,
    /// Version-active.
    pub version_active: u8,
    /// ISID (echoed).
    pub isid: [u8; 6],
    /// TSIH (set in the final response of a leading login).
    pub tsih: u16,
    /// ITT (echoed).
    pub itt: u32,
    /// Status class.
    pub status_class: u8,
    /// Status detail.
    pub status_detail: u8,
}

/// Text Response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TextResponse {
    /// F bit: the target's text is complete.
    pub final_bit: bool,
    /// C bit: the text continues in the next response.
    pub cont: bool,
    /// Raw LUN field.
    pub lun: u64,
    /// ITT of the request.
    pub itt: u32,
    /// TTT (0xffffffff when final, else a tag to continue with).
    pub ttt: u32,
}

/// Logout Response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogoutResponse {
    /// 0 closed, 1 CID not found, 2 recovery not supported, 3 cleanup failed.
    pub response: u8,
    /// ITT of the request.
    pub itt: u32,
    /// Time2Wait in seconds.
    pub time2wait_s: u16,
    /// Time2Retain in seconds.
    pub time2retain_s: u16,
}

/// Reject reason codes.
pub mod reject_reason {
    /// Data (payload) digest error.
    pub const DATA_DIGEST: u8 = 0x02;
    /// SNACK reject.
    pub const SNACK: u8 = 0x03;
    /// Protocol error.
    pub const PROTOCOL_ERROR: u8 = 0x04;
    /// Command not supported.
    pub const NOT_SUPPORTED: u8 = 0x05;
    /// Immediate command reject (too many immediate commands).
    pub const IMMEDIATE: u8 = 0x06;
    /// Task in progress.
    pub const TASK_IN_PROGRESS: u8 = 0x07;
    /// Invalid data ack.
    pub const INVALID_DATA_ACK: u8 = 0x08;
    /// Invalid PDU field.
    pub const INVALID_FIELD: u8 = 0x09;
    /// Long op reject: out of resources.
    pub const OUT_OF_RESOURCES: u8 = 0x0a;
    /// Waiting for logout.
    pub const WAITING_FOR_LOGOUT: u8 = 0x0c;
}

/// Reject (the data segment holds the offending header).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reject {
    /// Reason code (see [`reject_reason`]).
    pub reason: u8,
    /// DataSN/R2TSN (ERL > 0 only).
    pub data_sn: u32,
}

/// Async event codes.
pub mod async_event {
    /// SCSI asynchronous event (sense data in the data segment).
    pub const SCSI: u8 = 0;
    /// The target requests a logout.
    pub const LOGOUT_REQUEST: u8 = 1;
    /// The target will drop this connection.
    pub const DROP_CONNECTION: u8 = 2;
    /// The target will drop all connections of the session.
    pub const DROP_SESSION: u8 = 3;
    /// The target requests parameter renegotiation.
    pub const NEGOTIATE: u8 = 4;
}

/// Asynchronous Message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AsyncMessage {
    /// Raw LUN field (for SCSI events).
    pub lun: u64,
    /// Event code (see [`async_event`]).
    pub event: u8,
    /// Vendor code.
    pub vcode: u8,
    /// Parameter1.
    pub param1: u16,
    /// Parameter2.
    pub param2: u16,
    /// Parameter3.
    pub param3: u16,
}

/// A target PDU header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TargetPdu {
    /// NOP-In.
    NopIn(NopIn),
    /// SCSI Response.
    ScsiResponse(ScsiResponse),
    /// Task Management Function Response.
    TaskMgmtResponse(TaskMgmtResponse),
    /// Login Response.
    LoginResponse(LoginResponse),
    /// Text Response.
    TextResponse(TextResponse),
    /// SCSI Data-In.
    DataIn(DataIn),
    /// Logout Response.
    LogoutResponse(LogoutResponse),
    /// R2T.
    R2t(R2t),
    /// Asynchronous Message.
    AsyncMessage(AsyncMessage),
    /// Reject.
    Reject(Reject),
}

fn put32(b: &mut [u8; BHS_LEN], off: usize, v: u32) {
    b[off..off + 4].copy_from_slice(&v.to_be_bytes());
}

fn put64(b: &mut [u8; BHS_LEN], off: usize, v: u64) {
    b[off..off + 8].copy_from_slice(&v.to_be_bytes());
}

fn get64(b: &[u8; BHS_LEN], off: usize) -> u64 {
    let mut x = [0u8; 8];
    x.copy_from_slice(&b[off..off + 8]);
    u64::from_be_bytes(x)
}

fn get16(b: &[u8; BHS_LEN], off: usize) -> u16 {
    u16::from_be_bytes([b[off], b[off + 1]])
}

impl TargetPdu {
    /// Whether sending this PDU consumes a StatSN (it carries status).
    pub fn carries_status(&self) -> bool {
        match self {
            TargetPdu::NopIn(n) => n.ttt == RESERVED_TAG,
            TargetPdu::DataIn(d) => d.status.is_some(),
            TargetPdu::R2t(_) => false,
            TargetPdu::TextResponse(_)
            | TargetPdu::ScsiResponse(_)
            | TargetPdu::TaskMgmtResponse(_)
            | TargetPdu::LoginResponse(_)
            | TargetPdu::LogoutResponse(_)
            | TargetPdu::AsyncMessage(_)
            | TargetPdu::Reject(_) => true,
        }
    }

    /// Encodes the 48-byte header for a data segment of `data_len_bytes`.
    pub fn encode(&self, seq: &SeqNumbers, data_len_bytes: u32) -> [u8; BHS_LEN] {
        let mut b = [0u8; BHS_LEN];
        let dl = data_len_bytes.min(0x00ff_ffff).to_be_bytes();
        b[5..8].copy_from_slice(&dl[1..4]);
        put32(&mut b, 24, seq.stat_sn);
        put32(&mut b, 28, seq.exp_cmd_sn);
        put32(&mut b, 32, seq.max_cmd_sn);
        put32(&mut b, 16, RESERVED_TAG);
        match self {
            TargetPdu::NopIn(p) => {
                b[0] = opcode::NOP_IN;
                b[1] = FLAG_FINAL;
                put64(&mut b, 8, p.lun);
                put32(&mut b, 16, p.itt);
                put32(&mut b, 20, p.ttt);
            }
            TargetPdu::ScsiResponse(p) => {
                b[0] = opcode::SCSI_RESPONSE;
                b[1] = FLAG_FINAL | p.residual.flags() | (p.bidi_residual.flags() << 2);
                b[2] = p.response;
                b[3] = p.status;
                put32(&mut b, 16, p.itt);
                put32(&mut b, 36, p.exp_data_sn);
                put32(&mut b, 40, p.bidi_residual.count());
                put32(&mut b, 44, p.residual.count());
            }
            TargetPdu::TaskMgmtResponse(p) => {
                b[0] = opcode::TASK_MGMT_RESPONSE;
                b[1] = FLAG_FINAL;
                b[2] = p.response;
                put32(&mut b, 16, p.itt);
            }
            TargetPdu::LoginResponse(p) => {
                b[0] = opcode::LOGIN_RESPONSE;
                b[1] = (if p.transit { 0x80 } else { 0 })
                    | (if p.cont { 0x40 } else { 0 })
                    | ((p.csg & 3) << 2)
                    | (p.nsg & 3);
                b[2] = p.version_max;
                b[3] = p.version_active;
                b[8..14].copy_from_slice(&p.isid);
                b[14..16].copy_from_slice(&p.tsih.to_be_bytes());
                put32(&mut b, 16, p.itt);
                b[36] = p.status_class;
                b[37] = p.status_detail;
            }
            TargetPdu::TextResponse(p) => {
                b[0] = opcode::TEXT_RESPONSE;
                b[1] = (if p.final_bit { 0x80 } else { 0 }) | (if p.cont { 0x40 } else { 0 });
                put64(&mut b, 8, p.lun);
                put32(&mut b, 16, p.itt);
                put32(&mut b, 20, p.ttt);
            }
            TargetPdu::DataIn(p) => {
                b[0] = opcode::DATA_IN;
                b[1] = (if p.final_bit || p.status.is_some() {
                    0x80
                } else {
                    0
                }) | (if p.ack { 0x40 } else { 0 });
                put64(&mut b, 8, p.lun);
                put32(&mut b, 16, p.itt);
                put32(&mut b, 20, p.ttt);
                match p.status {
                    Some(st) => {
                        b[1] |= 0x01 | p.residual.flags();
                        b[3] = st;
                        put32(&mut b, 44, p.residual.count());
                    }
                    None => put32(&mut b, 24, 0),
                }
                put32(&mut b, 36, p.data_sn);
                put32(&mut b, 40, p.buffer_offset_bytes);
            }
            TargetPdu::LogoutResponse(p) => {
                b[0] = opcode::LOGOUT_RESPONSE;
                b[1] = FLAG_FINAL;
                b[2] = p.response;
                put32(&mut b, 16, p.itt);
                b[40..42].copy_from_slice(&p.time2wait_s.to_be_bytes());
                b[42..44].copy_from_slice(&p.time2retain_s.to_be_bytes());
            }
            TargetPdu::R2t(p) => {
                b[0] = opcode::R2T;
                b[1] = FLAG_FINAL;
                put64(&mut b, 8, p.lun);
                put32(&mut b, 16, p.itt);
                put32(&mut b, 20, p.ttt);
                put32(&mut b, 36, p.r2t_sn);
                put32(&mut b, 40, p.buffer_offset_bytes);
                put32(&mut b, 44, p.desired_len_bytes);
            }
            TargetPdu::AsyncMessage(p) => {
                b[0] = opcode::ASYNC_MESSAGE;
                b[1] = FLAG_FINAL;
                put64(&mut b, 8, p.lun);
                b[36] = p.event;
                b[37] = p.vcode;
                b[38..40].copy_from_slice(&p.param1.to_be_bytes());
                b[40..42].copy_from_slice(&p.param2.to_be_bytes());
                b[42..44].copy_from_slice(&p.param3.to_be_bytes());
            }
            TargetPdu::Reject(p) => {
                b[0] = opcode::REJECT;
                b[1] = FLAG_FINAL;
                b[2] = p.reason;
                put32(&mut b, 36, p.data_sn);
            }
        }
        b
    }
}

/// Parses a target PDU header (what an initiator does); returns the PDU, its
/// sequence numbers and its data segment length.
pub fn parse_target_bhs(b: &[u8; BHS_LEN]) -> Result<(TargetPdu, SeqNumbers, u32), ProtoError> {
    let seq = SeqNumbers {
        stat_sn: be32(b, 24),
        exp_cmd_sn: be32(b, 28),
        max_cmd_sn: be32(b, 32),
    };
    let dl = crate::pdu::raw_data_len_bytes(b);
    let f = b[1];
    let itt = be32(b, 16);
    let pdu = match b[0] & 0x3f {
        opcode::NOP_IN => TargetPdu::NopIn(NopIn {
            lun: get64(b, 8),
            itt,
            ttt: be32(b, 20),
        }),
        opcode::SCSI_RESPONSE => TargetPdu::ScsiResponse(ScsiResponse {
            itt,
            response: b[2],
            status: b[3],
            residual: Residual::from_wire(f, be32(b, 44)),
            bidi_residual: Residual::from_wire(f >> 2, be32(b, 40)),
            exp_data_sn: be32(b, 36),
        }),
        opcode::TASK_MGMT_RESPONSE => TargetPdu::TaskMgmtResponse(TaskMgmtResponse {
            response: b[2],
            itt,
        }),
        opcode::LOGIN_RESPONSE => {
            let mut isid = [0u8; 6];
            isid.copy_from_slice(&b[8..14]);
            TargetPdu::LoginResponse(LoginResponse {
                transit: f & 0x80 != 0,
                cont: f & 0x40 != 0,
                csg: (f >> 2) & 3,
                nsg: f & 3,
                version_max: b[2],
                version_active: b[3],
                isid,
                tsih: get16(b, 14),
                itt,
                status_class: b[36],
                status_detail: b[37],
            })
        }
        opcode::TEXT_RESPONSE => TargetPdu::TextResponse(TextResponse {
            final_bit: f & 0x80 != 0,
            cont: f & 0x40 != 0,
            lun: get64(b, 8),
            itt,
            ttt: be32(b, 20),
        }),
        opcode::DATA_IN => {
            let s = f & 0x01 != 0;
            TargetPdu::DataIn(DataIn {
                final_bit: f & 0x80 != 0,
                ack: f & 0x40 != 0,
                status: s.then_some(b[3]),
                residual: if s {
                    Residual::from_wire(f, be32(b, 44))
                } else {
                    Residual::None
                },
                lun: get64(b, 8),
                itt,
                ttt: be32(b, 20),
                data_sn: be32(b, 36),
                buffer_offset_bytes: be32(b, 40),
            })
        }
        opcode::LOGOUT_RESPONSE => TargetPdu::LogoutResponse(LogoutResponse {
            response: b[2],
            itt,
            time2wait_s: get16(b, 40),
            time2retain_s: get16(b, 42),
        }),
        opcode::R2T => TargetPdu::R2t(R2t {
            lun: get64(b, 8),
            itt,
            ttt: be32(b, 20),
            r2t_sn: be32(b, 36),
            buffer_offset_bytes: be32(b, 40),
            desired_len_bytes: be32(b, 44),
        }),
        opcode::ASYNC_MESSAGE => TargetPdu::AsyncMessage(AsyncMessage {
            lun: get64(b, 8),
            event: b[36],
            vcode: b[37],
            param1: get16(b, 38),
            param2: get16(b, 40),
            param3: get16(b, 42),
        }),
        opcode::REJECT => TargetPdu::Reject(Reject {
            reason: b[2],
            data_sn: be32(b, 36),
        }),
        other => return Err(ProtoError::UnknownOpcode(other)),
    };
    Ok((pdu, seq, dl))
}

/// Builds the data segment of a SCSI Response carrying sense data
/// (2-byte SenseLength then the sense bytes).
pub fn sense_segment(sense: &[u8]) -> Vec<u8> {
    let n = sense.len().min(u16::MAX as usize - 2);
    let mut v = Vec::with_capacity(n + 2);
    v.extend_from_slice(&(n as u16).to_be_bytes());
    v.extend_from_slice(&sense[..n]);
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn data_in_collapsed_status() {
        let d = DataIn {
            final_bit: true,
            ack: false,
            status: Some(0),
            residual: Residual::Underflow(512),
            lun: 0,
            itt: 9,
            ttt: RESERVED_TAG,
            data_sn: 3,
            buffer_offset_bytes: 8192,
        };
        let seq = SeqNumbers {
            stat_sn: 5,
            exp_cmd_sn: 6,
            max_cmd_sn: 70,
        };
        let h = TargetPdu::DataIn(d).encode(&seq, 4096);
        assert_eq!(h[0], 0x25);
        assert_eq!(h[1], 0x83);
        let (p, s, dl) = parse_target_bhs(&h).unwrap();
        assert_eq!(p, TargetPdu::DataIn(d));
        assert_eq!(s, seq);
        assert_eq!(dl, 4096);
    }

    #[test]
    fn residual_of() {
        assert_eq!(Residual::of(512, 512), Residual::None);
        assert_eq!(Residual::of(1024, 512), Residual::Underflow(512));
        assert_eq!(Residual::of(512, 1024), Residual::Overflow(512));
    }

    #[test]
    fn sense_segment_prefix() {
        assert_eq!(sense_segment(&[0x70, 0, 5]), vec![0, 3, 0x70, 0, 5]);
    }
}
