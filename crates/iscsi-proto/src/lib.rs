//! iSCSI wire protocol (RFC 7143) as a pure codec: no sockets, no clocks, no tasks.
//!
//! What it does:
//! - parses the 48-byte Basic Header Segment of every initiator PDU into a typed
//!   [`pdu::InitiatorPdu`], with its Additional Header Segments (extended CDB,
//!   bidirectional read length) and data segment ([`frame`]), from a read
//!   buffer that keeps long commands' data in allocations of their own
//!   ([`recv`]);
//! - encodes every target PDU (NOP-In, SCSI Response, Data-In, R2T, Task Management
//!   Response, Login/Text/Logout Response, Reject, Async Message) ([`target`]);
//! - pads to 4 bytes and computes/checks HeaderDigest and DataDigest CRC32C ([`digest`]);
//! - parses and encodes `key=value` text parameters, reassembling text that spans
//!   several PDUs ([`text`]);
//! - runs target-side login negotiation as a pure state machine ([`login`]), CHAP
//!   included ([`chap`]), producing Login Responses and, at the end, the negotiated
//!   session and connection parameters.
//!
//! What it does not do: any I/O, session bookkeeping across connections (TSIH
//! allocation, reinstatement), or SCSI semantics; that is the `iscsi` crate.
//!
//! Key invariant: no function here panics or allocates without a bound on bytes that
//! came from the network; every malformed input is a typed [`ProtoError`] or an
//! iSCSI status answer.

pub mod chap;
pub mod digest;
mod error;
pub mod frame;
pub mod login;
mod params;
pub mod pdu;
pub mod recv;
pub mod target;
pub mod text;

pub use bytes;
pub use error::ProtoError;
pub use frame::{decode_frame, Frame, FrameLimits};
pub use login::{
    InitiatorChap, LoginConfig, LoginNegotiator, LoginOutcome, LoginStep, Negotiated,
    OperationalLimits, SessionType, TargetAuth,
};
pub use pdu::{parse_bhs, Bhs, InitiatorPdu, BHS_LEN};

/// Reserved tag value: "no task" for ITT/TTT.
pub const RESERVED_TAG: u32 = 0xffff_ffff;

/// Serial number arithmetic (RFC 1982, 32 bits): `a < b`.
pub fn sn_lt(a: u32, b: u32) -> bool {
    a != b && (b.wrapping_sub(a) as i32) > 0
}

/// Serial number arithmetic (RFC 1982, 32 bits): `a <= b`.
pub fn sn_le(a: u32, b: u32) -> bool {
    a == b || sn_lt(a, b)
}

/// Decodes the 8-byte SAM LUN field (peripheral or flat space addressing) into a
/// LUN number. Other addressing methods map to a number no configuration uses.
pub fn lun_from_wire(raw: u64) -> u64 {
    let b = raw.to_be_bytes();
    match b[0] >> 6 {
        0 if b[0] == 0 => b[1] as u64,
        0 | 1 => (((b[0] & 0x3f) as u64) << 8) | b[1] as u64,
        _ => u64::MAX,
    }
}

/// Encodes a LUN number as an 8-byte SAM LUN field (peripheral addressing below
/// 256, flat space addressing up to 16383).
pub fn lun_to_wire(lun: u64) -> u64 {
    let mut b = [0u8; 8];
    if lun < 256 {
        b[1] = lun as u8;
    } else {
        b[0] = 0x40 | ((lun >> 8) & 0x3f) as u8;
        b[1] = lun as u8;
    }
    u64::from_be_bytes(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serial_numbers_wrap() {
        assert!(sn_lt(1, 2));
        assert!(sn_lt(0xffff_fff0, 5));
        assert!(!sn_lt(5, 0xffff_fff0));
        assert!(sn_le(7, 7));
    }

    #[test]
    fn lun_roundtrip() {
        for lun in [0u64, 1, 255, 256, 1000, 16383] {
            assert_eq!(lun_from_wire(lun_to_wire(lun)), lun);
        }
        assert_eq!(lun_from_wire(0x0001_0000_0000_0000), 1);
        assert_eq!(lun_from_wire(0xc000_0000_0000_0000), u64::MAX);
    }
}
