//! Wire formats of the reservation commands: the PERSISTENT RESERVE OUT CDB and
//! parameter lists, iSCSI TransportIDs, and the PERSISTENT RESERVE IN parameter data.
//!
//! Pure functions over bytes: every read is bounds-checked, nothing here panics on
//! any input.

use super::PrType;
use crate::sense::{codes, Sense};

/// PR OUT service actions (SPC-4 table 173).
pub(super) const SA_REGISTER: u8 = 0x00;
pub(super) const SA_RESERVE: u8 = 0x01;
pub(super) const SA_RELEASE: u8 = 0x02;
pub(super) const SA_CLEAR: u8 = 0x03;
pub(super) const SA_PREEMPT: u8 = 0x04;
pub(super) const SA_PREEMPT_AND_ABORT: u8 = 0x05;
pub(super) const SA_REGISTER_AND_IGNORE: u8 = 0x06;
pub(super) const SA_REGISTER_AND_MOVE: u8 = 0x07;

/// Length of the basic PR OUT parameter list.
const BASIC_LEN_BYTES: usize = 24;
/// Longest iSCSI name (RFC 7143) plus ",i,0x" and a 12-digit ISID.
const INITIATOR_PORT_NAME_MAX_BYTES: usize = 223 + 5 + 12;
/// iSCSI protocol identifier (SPC-4 table 408).
const PROTOCOL_ISCSI: u8 = 0x5;

fn be16(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes(b.get(at..at + 2)?.try_into().ok()?))
}

fn be32(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_be_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

fn be64(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_be_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

fn length_error() -> Sense {
    codes::PARAM_LIST_LENGTH_ERROR
}

/// The fields of a PERSISTENT RESERVE OUT CDB.
#[derive(Debug, Clone, Copy)]
pub(super) struct ProutCdb {
    pub service_action: u8,
    pub scope: u8,
    pub type_code: u8,
    pub param_list_len_bytes: u32,
}

impl ProutCdb {
    pub fn parse(cdb: &[u8]) -> Result<ProutCdb, Sense> {
        if cdb.len() < 10 {
            return Err(codes::INVALID_FIELD_IN_CDB.with_field(true, 0, None));
        }
        let service_action = cdb[1] & 0x1f;
        if service_action > SA_REGISTER_AND_MOVE {
            return Err(codes::INVALID_FIELD_IN_CDB.with_field(true, 1, Some(4)));
        }
        Ok(ProutCdb {
            service_action,
            scope: cdb[2] >> 4,
            type_code: cdb[2] & 0x0f,
            param_list_len_bytes: be32(cdb, 5).unwrap_or(0),
        })
    }

    /// The SCOPE and TYPE fields, which must name an LU-scope type we support.
    pub fn lu_scope_type(&self) -> Result<PrType, Sense> {
        if self.scope != 0 {
            return Err(codes::INVALID_FIELD_IN_CDB.with_field(true, 2, Some(7)));
        }
        PrType::from_code(self.type_code).ok_or(codes::INVALID_FIELD_IN_CDB.with_field(
            true,
            2,
            Some(3),
        ))
    }

    /// The parameter list the CDB announces, or PARAMETER LIST LENGTH ERROR if fewer
    /// bytes arrived.
    fn params<'a>(&self, params: &'a [u8]) -> Result<&'a [u8], Sense> {
        let len = usize::try_from(self.param_list_len_bytes).map_err(|_| length_error())?;
        params.get(..len).ok_or_else(length_error)
    }
}

/// The basic PR OUT parameter list (every service action but REGISTER AND MOVE).
#[derive(Debug, Clone, Default)]
pub(super) struct BasicParams {
    pub reservation_key: u64,
    pub service_action_key: u64,
    pub spec_i_pt: bool,
    pub all_tg_pt: bool,
    pub aptpl: bool,
    /// SPEC_I_PT: initiator port names of the listed TransportIDs.
    pub transport_ids: Vec<String>,
}

/// Parses the basic parameter list (SPC-4 6.16.3), with SPEC_I_PT TransportIDs for
/// REGISTER.
pub(super) fn parse_basic(cdb: &ProutCdb, params: &[u8]) -> Result<BasicParams, Sense> {
    let p = cdb.params(params)?;
    if p.len() < BASIC_LEN_BYTES {
        return Err(length_error());
    }
    let flags = p[20];
    let registering = matches!(cdb.service_action, SA_REGISTER | SA_REGISTER_AND_IGNORE);
    let mut out = BasicParams {
        reservation_key: be64(p, 0).unwrap_or(0),
        service_action_key: be64(p, 8).unwrap_or(0),
        spec_i_pt: flags & 0x08 != 0,
        // ALL_TG_PT and APTPL only mean something when registering.
        all_tg_pt: registering && flags & 0x04 != 0,
        aptpl: registering && flags & 0x01 != 0,
        transport_ids: Vec::new(),
    };
    if !out.spec_i_pt {
        if p.len() != BASIC_LEN_BYTES {
            return Err(length_error());
        }
        return Ok(out);
    }
    if cdb.service_action != SA_REGISTER {
        return Err(codes::INVALID_FIELD_IN_PARAM.with_field(false, 20, Some(3)));
    }
    let list_len = be32(p, 24).ok_or_else(length_error)?;
    let list_len = usize::try_from(list_len).map_err(|_| length_error())?;
    let list = p
        .get(28..)
        .and_then(|rest| rest.get(..list_len))
        .ok_or_else(length_error)?;
    let mut at = 0;
    while at < list.len() {
        // more than can ever be registered: refused before the rest is parsed
        // (a 16 MiB list holds ~760k TransportIDs, each checked against the
        // others under the LU's reservation lock)
        if out.transport_ids.len() >= super::REGISTRATIONS_MAX {
            return Err(codes::INSUFFICIENT_REGISTRATION_RESOURCES);
        }
        let (port, used) = parse_transport_id(&list[at..], 28 + at)?;
        out.transport_ids.push(port);
        at += used;
    }
    Ok(out)
}

/// The REGISTER AND MOVE parameter list (SPC-4 6.16.4).
#[derive(Debug, Clone)]
pub(super) struct MoveParams {
    pub reservation_key: u64,
    pub service_action_key: u64,
    pub unreg: bool,
    pub aptpl: bool,
    pub relative_port_id: u16,
    /// Initiator port name of the destination.
    pub transport_id: String,
}

pub(super) fn parse_move(cdb: &ProutCdb, params: &[u8]) -> Result<MoveParams, Sense> {
    let p = cdb.params(params)?;
    if p.len() < BASIC_LEN_BYTES {
        return Err(length_error());
    }
    let tid_len = be32(p, 20).ok_or_else(length_error)?;
    let tid_len = usize::try_from(tid_len).map_err(|_| length_error())?;
    let tid = p
        .get(24..)
        .and_then(|rest| rest.get(..tid_len))
        .ok_or_else(length_error)?;
    let (port, _) = parse_transport_id(tid, 24)?;
    Ok(MoveParams {
        reservation_key: be64(p, 0).unwrap_or(0),
        service_action_key: be64(p, 8).unwrap_or(0),
        unreg: p[17] & 0x02 != 0,
        aptpl: p[17] & 0x01 != 0,
        relative_port_id: be16(p, 18).unwrap_or(0),
        transport_id: port,
    })
}

/// Parses one iSCSI TransportID with format code 01b (initiator port name) at the
/// start of `buf`; `offset` is its position in the parameter list (for the field
/// pointer). Returns the initiator port name (`<name>,i,0x<isid>`) and the bytes used.
///
/// Format 00b (initiator device name, meaning every port of that initiator) is
/// refused: registrations here are per I_T nexus and its ports are unknown.
pub(super) fn parse_transport_id(buf: &[u8], offset: usize) -> Result<(String, usize), Sense> {
    let invalid = || {
        codes::INVALID_FIELD_IN_PARAM.with_field(
            false,
            u16::try_from(offset).unwrap_or(u16::MAX),
            None,
        )
    };
    let head = buf.get(..4).ok_or_else(length_error)?;
    if head[0] & 0x0f != PROTOCOL_ISCSI || head[0] >> 6 != 0b01 {
        return Err(invalid());
    }
    let additional = usize::from(be16(head, 2).unwrap_or(0));
    let total = 4 + additional;
    let body = buf.get(4..total).ok_or_else(length_error)?;
    let text_len = body.iter().position(|&b| b == 0).unwrap_or(body.len());
    let text = std::str::from_utf8(&body[..text_len]).map_err(|_| invalid())?;
    if text.len() > INITIATOR_PORT_NAME_MAX_BYTES || !text.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(invalid());
    }
    let lower = text.to_ascii_lowercase();
    let sep = lower.rfind(",i,0x").ok_or_else(invalid)?;
    let (name, isid) = (&text[..sep], &text[sep + 5..]);
    if name.is_empty() || isid.len() != 12 || !isid.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(invalid());
    }
    Ok((format!("{name},i,0x{}", isid.to_ascii_lowercase()), total))
}

/// Encodes an initiator port name as an iSCSI TransportID, format 01b: NUL-terminated,
/// padded to a multiple of 4 bytes, at least 24 bytes long.
pub(super) fn encode_transport_id(initiator_port: &str) -> Vec<u8> {
    let text = initiator_port.as_bytes();
    let text = &text[..text.len().min(INITIATOR_PORT_NAME_MAX_BYTES)];
    let body_len = (text.len() + 1).next_multiple_of(4).max(20);
    let mut out = Vec::with_capacity(4 + body_len);
    out.push(0x40 | PROTOCOL_ISCSI);
    out.push(0);
    out.extend_from_slice(&(body_len as u16).to_be_bytes());
    out.extend_from_slice(text);
    out.resize(4 + body_len, 0);
    out
}

/// READ KEYS parameter data (SPC-4 6.15.2).
pub(super) fn read_keys(generation: u32, keys: impl Iterator<Item = u64>) -> Vec<u8> {
    let mut out = Vec::with_capacity(8);
    out.extend_from_slice(&generation.to_be_bytes());
    out.extend_from_slice(&[0; 4]);
    for key in keys {
        out.extend_from_slice(&key.to_be_bytes());
    }
    let additional = (out.len() - 8) as u32;
    out[4..8].copy_from_slice(&additional.to_be_bytes());
    out
}

/// READ RESERVATION parameter data (SPC-4 6.15.3): `reservation` is (key, type).
pub(super) fn read_reservation(generation: u32, reservation: Option<(u64, u8)>) -> Vec<u8> {
    let mut out = Vec::with_capacity(24);
    out.extend_from_slice(&generation.to_be_bytes());
    match reservation {
        None => out.extend_from_slice(&0u32.to_be_bytes()),
        Some((key, type_code)) => {
            out.extend_from_slice(&16u32.to_be_bytes());
            out.extend_from_slice(&key.to_be_bytes());
            out.extend_from_slice(&[0; 4]); // obsolete
            out.push(0);
            out.push(type_code & 0x0f); // scope LU (0)
            out.extend_from_slice(&[0; 2]); // obsolete
        }
    }
    out
}

/// REPORT CAPABILITIES parameter data (SPC-4 6.15.4).
pub(super) fn report_capabilities(ptpl_capable: bool, ptpl_active: bool) -> Vec<u8> {
    let mut out = vec![0u8; 8];
    out[1] = 8; // LENGTH
                // CRH (SPC-4 5.13.3 exceptions), SIP_C, ATP_C, PTPL_C.
    out[2] = 0x10 | 0x08 | 0x04 | u8::from(ptpl_capable);
    // TMV, ALLOW COMMANDS 001b (TEST UNIT READY allowed through WE and EA), PTPL_A.
    out[3] = 0x80 | (0b001 << 4) | u8::from(ptpl_active);
    // Types: WR_EX_AR, EX_AC_RO, WR_EX_RO, EX_AC, WR_EX; EX_AC_AR.
    out[4] = 0x80 | 0x40 | 0x20 | 0x08 | 0x02;
    out[5] = 0x01;
    out
}

/// One READ FULL STATUS descriptor's inputs.
pub(super) struct FullStatus<'a> {
    pub key: u64,
    /// Some(type code) when this nexus is a reservation holder.
    pub holder_type: Option<u8>,
    pub relative_port_id: u16,
    pub initiator_port: &'a str,
}

/// READ FULL STATUS parameter data (SPC-4 6.15.5): one descriptor per registered I_T
/// nexus, ALL_TG_PT always zero (each descriptor names a single nexus).
pub(super) fn read_full_status<'a>(
    generation: u32,
    descriptors: impl Iterator<Item = FullStatus<'a>>,
) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&generation.to_be_bytes());
    out.extend_from_slice(&[0; 4]);
    for d in descriptors {
        out.extend_from_slice(&d.key.to_be_bytes());
        out.extend_from_slice(&[0; 4]);
        out.push(u8::from(d.holder_type.is_some())); // R_HOLDER; ALL_TG_PT = 0
        out.push(d.holder_type.unwrap_or(0) & 0x0f); // scope LU (0), type
        out.extend_from_slice(&[0; 4]);
        out.extend_from_slice(&d.relative_port_id.to_be_bytes());
        let tid = encode_transport_id(d.initiator_port);
        out.extend_from_slice(&(tid.len() as u32).to_be_bytes());
        out.extend_from_slice(&tid);
    }
    let additional = (out.len() - 8) as u32;
    out[4..8].copy_from_slice(&additional.to_be_bytes());
    out
}
