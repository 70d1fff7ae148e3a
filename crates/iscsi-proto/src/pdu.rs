//! The Basic Header Segment: opcodes and typed initiator PDUs.

use crate::ProtoError;

/// Length of the Basic Header Segment in bytes.
pub const BHS_LEN: usize = 48;

/// Opcodes (low 6 bits of byte 0).
pub mod opcode {
    /// NOP-Out (initiator).
    pub const NOP_OUT: u8 = 0x00;
    /// SCSI Command (initiator).
    pub const SCSI_COMMAND: u8 = 0x01;
    /// SCSI Task Management Function Request (initiator).
    pub const TASK_MGMT_REQUEST: u8 = 0x02;
    /// Login Request (initiator).
    pub const LOGIN_REQUEST: u8 = 0x03;
    /// Text Request (initiator).
    pub const TEXT_REQUEST: u8 = 0x04;
    /// SCSI Data-Out (initiator).
    pub const DATA_OUT: u8 = 0x05;
    /// Logout Request (initiator).
    pub const LOGOUT_REQUEST: u8 = 0x06;
    /// SNACK Request (initiator).
    pub const SNACK_REQUEST: u8 = 0x10;
    /// NOP-In (target).
    pub const NOP_IN: u8 = 0x20;
    /// SCSI Response (target).
    pub const SCSI_RESPONSE: u8 = 0x21;
    /// Task Management Function Response (target).
    pub const TASK_MGMT_RESPONSE: u8 = 0x22;
    /// Login Response (target).
    pub const LOGIN_RESPONSE: u8 = 0x23;
    /// Text Response (target).
    pub const TEXT_RESPONSE: u8 = 0x24;
    /// SCSI Data-In (target).
    pub const DATA_IN: u8 = 0x25;
    /// Logout Response (target).
    pub const LOGOUT_RESPONSE: u8 = 0x26;
    /// Ready To Transfer (target).
    pub const R2T: u8 = 0x31;
    /// Asynchronous Message (target).
    pub const ASYNC_MESSAGE: u8 = 0x32;
    /// Reject (target).
    pub const REJECT: u8 = 0x3f;
}

/// Final bit (byte 1, bit 7) shared by most PDUs.
pub const FLAG_FINAL: u8 = 0x80;

/// NOP-Out: a ping, or the answer to a target ping.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NopOut {
    /// Raw 8-byte LUN field.
    pub lun: u64,
    /// Initiator task tag; 0xffffffff when answering a target NOP-In.
    pub itt: u32,
    /// Target transfer tag; the ping's TTT when answering one, else 0xffffffff.
    pub ttt: u32,
    /// Command sequence number.
    pub cmd_sn: u32,
    /// Expected status sequence number.
    pub exp_stat_sn: u32,
}

/// SCSI Command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScsiCommand {
    /// F bit: no unsolicited Data-Out PDUs follow.
    pub final_bit: bool,
    /// R bit: data flows to the initiator.
    pub read: bool,
    /// W bit: data flows to the target.
    pub write: bool,
    /// Task attribute (0 untagged, 1 simple, 2 ordered, 3 head of queue, 4 ACA).
    pub attr: u8,
    /// Raw 8-byte LUN field.
    pub lun: u64,
    /// Initiator task tag.
    pub itt: u32,
    /// Expected Data Transfer Length in bytes.
    pub edtl_bytes: u32,
    /// Command sequence number.
    pub cmd_sn: u32,
    /// Expected status sequence number.
    pub exp_stat_sn: u32,
    /// The first 16 CDB bytes.
    pub cdb: [u8; 16],
}

/// SCSI Task Management Function Request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TaskMgmtRequest {
    /// Function code (1 ABORT TASK .. 8 TASK REASSIGN).
    pub function: u8,
    /// Raw 8-byte LUN field.
    pub lun: u64,
    /// Initiator task tag of this request.
    pub itt: u32,
    /// Referenced task tag (ABORT TASK).
    pub rtt: u32,
    /// Command sequence number.
    pub cmd_sn: u32,
    /// Expected status sequence number.
    pub exp_stat_sn: u32,
    /// CmdSN of the referenced task.
    pub ref_cmd_sn: u32,
    /// Expected DataSN (task reassign).
    pub exp_data_sn: u32,
}

/// Login stage codes (CSG/NSG).
pub mod stage {
    /// SecurityNegotiation.
    pub const SECURITY: u8 = 0;
    /// LoginOperationalNegotiation.
    pub const OPERATIONAL: u8 = 1;
    /// FullFeaturePhase.
    pub const FULL_FEATURE: u8 = 3;
}

/// Login Request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoginRequest {
    /// T bit: the initiator is ready to go to `nsg`.
    pub transit: bool,
    /// C bit: the text continues in the next PDU.
    pub cont: bool,
    /// Current stage.
    pub csg: u8,
    /// Next stage (meaningful with `transit`).
    pub nsg: u8,
    /// Highest version supported.
    pub version_max: u8,
    /// Lowest version supported.
    pub version_min: u8,
    /// Initiator session id (6 bytes).
    pub isid: [u8; 6],
    /// Target session identifying handle (0 for a new session).
    pub tsih: u16,
    /// Initiator task tag.
    pub itt: u32,
    /// Connection id.
    pub cid: u16,
    /// Command sequence number.
    pub cmd_sn: u32,
    /// Expected status sequence number.
    pub exp_stat_sn: u32,
}

/// Text Request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TextRequest {
    /// F bit: last PDU of this text exchange from the initiator.
    pub final_bit: bool,
    /// C bit: the text continues in the next PDU.
    pub cont: bool,
    /// Raw 8-byte LUN field.
    pub lun: u64,
    /// Initiator task tag.
    pub itt: u32,
    /// Target transfer tag (0xffffffff, or the one the target sent to continue).
    pub ttt: u32,
    /// Command sequence number.
    pub cmd_sn: u32,
    /// Expected status sequence number.
    pub exp_stat_sn: u32,
}

/// SCSI Data-Out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DataOut {
    /// F bit: last PDU of a sequence.
    pub final_bit: bool,
    /// Raw 8-byte LUN field.
    pub lun: u64,
    /// Initiator task tag of the command.
    pub itt: u32,
    /// Target transfer tag from the R2T, 0xffffffff for unsolicited data.
    pub ttt: u32,
    /// Expected status sequence number.
    pub exp_stat_sn: u32,
    /// Data sequence number within the sequence.
    pub data_sn: u32,
    /// Offset of this PDU's data in the command's buffer.
    pub buffer_offset_bytes: u32,
}

/// Logout Request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogoutRequest {
    /// Reason: 0 close session, 1 close connection, 2 remove connection for recovery.
    pub reason: u8,
    /// Initiator task tag.
    pub itt: u32,
    /// Connection id to close.
    pub cid: u16,
    /// Command sequence number.
    pub cmd_sn: u32,
    /// Expected status sequence number.
    pub exp_stat_sn: u32,
}

/// SNACK Request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SnackRequest {
    /// SNACK type (0 Data/R2T, 1 status, 2 DataACK, 3 R-Data).
    pub snack_type: u8,
    /// Raw 8-byte LUN field.
    pub lun: u64,
    /// Initiator task tag.
    pub itt: u32,
    /// Target transfer tag.
    pub ttt: u32,
    /// Expected status sequence number.
    pub exp_stat_sn: u32,
    /// First missing number.
    pub beg_run: u32,
    /// Number of missing PDUs (0: all from beg_run).
    pub run_length: u32,
}

/// A parsed initiator PDU header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InitiatorPdu {
    /// NOP-Out.
    NopOut(NopOut),
    /// SCSI Command.
    ScsiCommand(ScsiCommand),
    /// Task Management Function Request.
    TaskMgmt(TaskMgmtRequest),
    /// Login Request.
    Login(LoginRequest),
    /// Text Request.
    Text(TextRequest),
    /// SCSI Data-Out.
    DataOut(DataOut),
    /// Logout Request.
    Logout(LogoutRequest),
    /// SNACK Request.
    Snack(SnackRequest),
}

/// A parsed Basic Header Segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bhs {
    /// I bit: immediate delivery (outside the CmdSN window).
    pub immediate: bool,
    /// Length of the Additional Header Segments in bytes (a multiple of 4).
    pub ahs_len_bytes: usize,
    /// Length of the data segment in bytes, without padding.
    pub data_len_bytes: u32,
    /// The typed PDU.
    pub pdu: InitiatorPdu,
}

impl Bhs {
    /// The initiator task tag of the PDU.
    pub fn itt(&self) -> u32 {
        match &self.pdu {
            InitiatorPdu::NopOut(p) => p.itt,
            InitiatorPdu::ScsiCommand(p) => p.itt,
            InitiatorPdu::TaskMgmt(p) => p.itt,
            InitiatorPdu::Login(p) => p.itt,
            InitiatorPdu::Text(p) => p.itt,
            InitiatorPdu::DataOut(p) => p.itt,
            InitiatorPdu::Logout(p) => p.itt,
            InitiatorPdu::Snack(p) => p.itt,
        }
    }
}

/// Big-endian u32 at `off`.
pub(crate) fn be32(b: &[u8; BHS_LEN], off: usize) -> u32 {
    u32::from_be_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]])
}

fn be16(b: &[u8; BHS_LEN], off: usize) -> u16 {
    u16::from_be_bytes([b[off], b[off + 1]])
}

fn be64(b: &[u8; BHS_LEN], off: usize) -> u64 {
    let mut x = [0u8; 8];
    x.copy_from_slice(&b[off..off + 8]);
    u64::from_be_bytes(x)
}

/// Opcode of a raw header (low 6 bits of byte 0).
pub fn raw_opcode(b: &[u8; BHS_LEN]) -> u8 {
    b[0] & 0x3f
}

/// Data segment length announced by a raw header (any opcode).
pub fn raw_data_len_bytes(b: &[u8; BHS_LEN]) -> u32 {
    u32::from_be_bytes([0, b[5], b[6], b[7]])
}

/// Parses a Basic Header Segment sent by an initiator.
pub fn parse_bhs(b: &[u8; BHS_LEN]) -> Result<Bhs, ProtoError> {
    let immediate = b[0] & 0x40 != 0;
    let flags = b[1];
    let final_bit = flags & FLAG_FINAL != 0;
    let ahs_len_bytes = b[4] as usize * 4;
    let data_len_bytes = raw_data_len_bytes(b);
    let lun = be64(b, 8);
    let itt = be32(b, 16);
    let pdu = match raw_opcode(b) {
        opcode::NOP_OUT => InitiatorPdu::NopOut(NopOut {
            lun,
            itt,
            ttt: be32(b, 20),
            cmd_sn: be32(b, 24),
            exp_stat_sn: be32(b, 28),
        }),
        opcode::SCSI_COMMAND => {
            let mut cdb = [0u8; 16];
            cdb.copy_from_slice(&b[32..48]);
            InitiatorPdu::ScsiCommand(ScsiCommand {
                final_bit,
                read: flags & 0x40 != 0,
                write: flags & 0x20 != 0,
                attr: flags & 0x07,
                lun,
                itt,
                edtl_bytes: be32(b, 20),
                cmd_sn: be32(b, 24),
                exp_stat_sn: be32(b, 28),
                cdb,
            })
        }
        opcode::TASK_MGMT_REQUEST => InitiatorPdu::TaskMgmt(TaskMgmtRequest {
            function: flags & 0x7f,
            lun,
            itt,
            rtt: be32(b, 20),
            cmd_sn: be32(b, 24),
            exp_stat_sn: be32(b, 28),
            ref_cmd_sn: be32(b, 32),
            exp_data_sn: be32(b, 36),
        }),
        opcode::LOGIN_REQUEST => {
            let mut isid = [0u8; 6];
            isid.copy_from_slice(&b[8..14]);
            InitiatorPdu::Login(LoginRequest {
                transit: flags & 0x80 != 0,
                cont: flags & 0x40 != 0,
                csg: (flags >> 2) & 0x03,
                nsg: flags & 0x03,
                version_max: b[2],
                version_min: b[3],
                isid,
                tsih: be16(b, 14),
                itt,
                cid: be16(b, 20),
                cmd_sn: be32(b, 24),
                exp_stat_sn: be32(b, 28),
            })
        }
        opcode::TEXT_REQUEST => InitiatorPdu::Text(TextRequest {
            final_bit,
            cont: flags & 0x40 != 0,
            lun,
            itt,
            ttt: be32(b, 20),
            cmd_sn: be32(b, 24),
            exp_stat_sn: be32(b, 28),
        }),
        opcode::DATA_OUT => InitiatorPdu::DataOut(DataOut {
            final_bit,
            lun,
            itt,
            ttt: be32(b, 20),
            exp_stat_sn: be32(b, 28),
            data_sn: be32(b, 36),
            buffer_offset_bytes: be32(b, 40),
        }),
        opcode::LOGOUT_REQUEST => InitiatorPdu::Logout(LogoutRequest {
            reason: flags & 0x7f,
            itt,
            cid: be16(b, 20),
            cmd_sn: be32(b, 24),
            exp_stat_sn: be32(b, 28),
        }),
        opcode::SNACK_REQUEST => InitiatorPdu::Snack(SnackRequest {
            snack_type: flags & 0x0f,
            lun,
            itt,
            ttt: be32(b, 20),
            exp_stat_sn: be32(b, 28),
            beg_run: be32(b, 40),
            run_length: be32(b, 44),
        }),
        other => return Err(ProtoError::UnknownOpcode(other)),
    };
    Ok(Bhs {
        immediate,
        ahs_len_bytes,
        data_len_bytes,
        pdu,
    })
}

/// Encodes an initiator PDU header (used by tests, fuzzers and the bench initiator).
pub fn encode_initiator_bhs(
    pdu: &InitiatorPdu,
    immediate: bool,
    ahs_len_bytes: usize,
    data_len_bytes: u32,
) -> [u8; BHS_LEN] {
    let mut b = [0u8; BHS_LEN];
    let put32 = |b: &mut [u8; BHS_LEN], off: usize, v: u32| {
        b[off..off + 4].copy_from_slice(&v.to_be_bytes())
    };
    let put64 = |b: &mut [u8; BHS_LEN], off: usize, v: u64| {
        b[off..off + 8].copy_from_slice(&v.to_be_bytes())
    };
    let (op, flags) = match pdu {
        InitiatorPdu::NopOut(p) => {
            put64(&mut b, 8, p.lun);
            put32(&mut b, 16, p.itt);
            put32(&mut b, 20, p.ttt);
            put32(&mut b, 24, p.cmd_sn);
            put32(&mut b, 28, p.exp_stat_sn);
            (opcode::NOP_OUT, FLAG_FINAL)
        }
        InitiatorPdu::ScsiCommand(p) => {
            put64(&mut b, 8, p.lun);
            put32(&mut b, 16, p.itt);
            put32(&mut b, 20, p.edtl_bytes);
            put32(&mut b, 24, p.cmd_sn);
            put32(&mut b, 28, p.exp_stat_sn);
            b[32..48].copy_from_slice(&p.cdb);
            let f = (if p.final_bit { 0x80 } else { 0 })
                | (if p.read { 0x40 } else { 0 })
                | (if p.write { 0x20 } else { 0 })
                | (p.attr & 7);
            (opcode::SCSI_COMMAND, f)
        }
        InitiatorPdu::TaskMgmt(p) => {
            put64(&mut b, 8, p.lun);
            put32(&mut b, 16, p.itt);
            put32(&mut b, 20, p.rtt);
            put32(&mut b, 24, p.cmd_sn);
            put32(&mut b, 28, p.exp_stat_sn);
            put32(&mut b, 32, p.ref_cmd_sn);
            put32(&mut b, 36, p.exp_data_sn);
            (opcode::TASK_MGMT_REQUEST, 0x80 | (p.function & 0x7f))
        }
        InitiatorPdu::Login(p) => {
            b[2] = p.version_max;
            b[3] = p.version_min;
            b[8..14].copy_from_slice(&p.isid);
            b[14..16].copy_from_slice(&p.tsih.to_be_bytes());
            put32(&mut b, 16, p.itt);
            b[20..22].copy_from_slice(&p.cid.to_be_bytes());
            put32(&mut b, 24, p.cmd_sn);
            put32(&mut b, 28, p.exp_stat_sn);
            let f = (if p.transit { 0x80 } else { 0 })
                | (if p.cont { 0x40 } else { 0 })
                | ((p.csg & 3) << 2)
                | (p.nsg & 3);
            (opcode::LOGIN_REQUEST, f)
        }
        InitiatorPdu::Text(p) => {
            put64(&mut b, 8, p.lun);
            put32(&mut b, 16, p.itt);
            put32(&mut b, 20, p.ttt);
            put32(&mut b, 24, p.cmd_sn);
            put32(&mut b, 28, p.exp_stat_sn);
            let f = (if p.final_bit { 0x80 } else { 0 }) | (if p.cont { 0x40 } else { 0 });
            (opcode::TEXT_REQUEST, f)
        }
        InitiatorPdu::DataOut(p) => {
            put64(&mut b, 8, p.lun);
            put32(&mut b, 16, p.itt);
            put32(&mut b, 20, p.ttt);
            put32(&mut b, 28, p.exp_stat_sn);
            put32(&mut b, 36, p.data_sn);
            put32(&mut b, 40, p.buffer_offset_bytes);
            (opcode::DATA_OUT, if p.final_bit { 0x80 } else { 0 })
        }
        InitiatorPdu::Logout(p) => {
            put32(&mut b, 16, p.itt);
            b[20..22].copy_from_slice(&p.cid.to_be_bytes());
            put32(&mut b, 24, p.cmd_sn);
            put32(&mut b, 28, p.exp_stat_sn);
            (opcode::LOGOUT_REQUEST, 0x80 | (p.reason & 0x7f))
        }
        InitiatorPdu::Snack(p) => {
            put64(&mut b, 8, p.lun);
            put32(&mut b, 16, p.itt);
            put32(&mut b, 20, p.ttt);
            put32(&mut b, 28, p.exp_stat_sn);
            put32(&mut b, 40, p.beg_run);
            put32(&mut b, 44, p.run_length);
            (opcode::SNACK_REQUEST, 0x80 | (p.snack_type & 0x0f))
        }
    };
    b[0] = op | if immediate { 0x40 } else { 0 };
    b[1] = flags;
    b[4] = (ahs_len_bytes / 4).min(255) as u8;
    let dl = data_len_bytes.min(0x00ff_ffff).to_be_bytes();
    b[5..8].copy_from_slice(&dl[1..4]);
    b
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_opcode_is_an_error() {
        let mut b = [0u8; BHS_LEN];
        for op in [0x07u8, 0x1c, 0x20, 0x3f, 0x11] {
            b[0] = op;
            assert_eq!(parse_bhs(&b), Err(ProtoError::UnknownOpcode(op)));
        }
    }

    #[test]
    fn login_flags() {
        let mut b = [0u8; BHS_LEN];
        b[0] = 0x43;
        b[1] = 0x87; // T, CSG=1, NSG=3
        b[8..14].copy_from_slice(&[0x80, 1, 2, 3, 4, 5]);
        let bhs = parse_bhs(&b).unwrap();
        assert!(bhs.immediate);
        match bhs.pdu {
            InitiatorPdu::Login(l) => {
                assert!(l.transit && !l.cont);
                assert_eq!((l.csg, l.nsg), (1, 3));
                assert_eq!(l.isid, [0x80, 1, 2, 3, 4, 5]);
            }
            other => panic!("{other:?}"),
        }
    }
}
