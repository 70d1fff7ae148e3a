//! CDB decoding helpers: opcode numbers, CDB lengths, and bounds-safe field access.
//!
//! Every CDB is copied into a fixed 16-byte [`Cdb`] after its length has been checked
//! against its opcode group, so handlers read fields with constant indices that can
//! never go out of bounds, whatever the initiator sent.

use crate::sense::{codes, Sense};

/// Operation codes the command set knows about.
pub mod op {
    /// TEST UNIT READY.
    pub const TEST_UNIT_READY: u8 = 0x00;
    /// REQUEST SENSE.
    pub const REQUEST_SENSE: u8 = 0x03;
    /// READ(6).
    pub const READ_6: u8 = 0x08;
    /// WRITE(6).
    pub const WRITE_6: u8 = 0x0a;
    /// INQUIRY.
    pub const INQUIRY: u8 = 0x12;
    /// MODE SELECT(6).
    pub const MODE_SELECT_6: u8 = 0x15;
    /// RESERVE(6).
    pub const RESERVE_6: u8 = 0x16;
    /// RELEASE(6).
    pub const RELEASE_6: u8 = 0x17;
    /// MODE SENSE(6).
    pub const MODE_SENSE_6: u8 = 0x1a;
    /// START STOP UNIT.
    pub const START_STOP_UNIT: u8 = 0x1b;
    /// PREVENT ALLOW MEDIUM REMOVAL.
    pub const PREVENT_ALLOW: u8 = 0x1e;
    /// READ CAPACITY(10).
    pub const READ_CAPACITY_10: u8 = 0x25;
    /// READ(10).
    pub const READ_10: u8 = 0x28;
    /// WRITE(10).
    pub const WRITE_10: u8 = 0x2a;
    /// WRITE AND VERIFY(10).
    pub const WRITE_VERIFY_10: u8 = 0x2e;
    /// VERIFY(10).
    pub const VERIFY_10: u8 = 0x2f;
    /// PRE-FETCH(10).
    pub const PRE_FETCH_10: u8 = 0x34;
    /// SYNCHRONIZE CACHE(10).
    pub const SYNC_CACHE_10: u8 = 0x35;
    /// WRITE SAME(10).
    pub const WRITE_SAME_10: u8 = 0x41;
    /// UNMAP.
    pub const UNMAP: u8 = 0x42;
    /// SANITIZE.
    pub const SANITIZE: u8 = 0x48;
    /// MODE SELECT(10).
    pub const MODE_SELECT_10: u8 = 0x55;
    /// RESERVE(10).
    pub const RESERVE_10: u8 = 0x56;
    /// RELEASE(10).
    pub const RELEASE_10: u8 = 0x57;
    /// MODE SENSE(10).
    pub const MODE_SENSE_10: u8 = 0x5a;
    /// PERSISTENT RESERVE IN.
    pub const PR_IN: u8 = 0x5e;
    /// PERSISTENT RESERVE OUT.
    pub const PR_OUT: u8 = 0x5f;
    /// READ(16).
    pub const READ_16: u8 = 0x88;
    /// EXTENDED COPY (LID1 is service action 0).
    pub const EXTENDED_COPY: u8 = 0x83;
    /// RECEIVE COPY RESULTS (LID1 service actions).
    pub const RECEIVE_COPY_RESULTS: u8 = 0x84;
    /// COMPARE AND WRITE.
    pub const COMPARE_AND_WRITE: u8 = 0x89;
    /// WRITE(16).
    pub const WRITE_16: u8 = 0x8a;
    /// ORWRITE(16).
    pub const ORWRITE_16: u8 = 0x8b;
    pub const WRITE_ATOMIC_16: u8 = 0x9c;
    /// WRITE AND VERIFY(16).
    pub const WRITE_VERIFY_16: u8 = 0x8e;
    /// VERIFY(16).
    pub const VERIFY_16: u8 = 0x8f;
    /// PRE-FETCH(16).
    pub const PRE_FETCH_16: u8 = 0x90;
    /// SYNCHRONIZE CACHE(16).
    pub const SYNC_CACHE_16: u8 = 0x91;
    /// WRITE SAME(16).
    pub const WRITE_SAME_16: u8 = 0x93;
    /// SERVICE ACTION IN(16): READ CAPACITY(16), GET LBA STATUS.
    pub const SERVICE_ACTION_IN_16: u8 = 0x9e;
    /// REPORT LUNS.
    pub const REPORT_LUNS: u8 = 0xa0;
    /// MAINTENANCE IN: REPORT TARGET PORT GROUPS, REPORT SUPPORTED OPCODES / TMFS.
    pub const MAINTENANCE_IN: u8 = 0xa3;
    /// MAINTENANCE OUT: SET TARGET PORT GROUPS.
    pub const MAINTENANCE_OUT: u8 = 0xa4;
    /// READ(12).
    pub const READ_12: u8 = 0xa8;
    /// READ DEFECT DATA(10).
    pub const READ_DEFECT_DATA_10: u8 = 0x37;
    /// READ DEFECT DATA(12).
    pub const READ_DEFECT_DATA_12: u8 = 0xb7;
    /// WRITE(12).
    pub const WRITE_12: u8 = 0xaa;
    /// WRITE AND VERIFY(12).
    pub const WRITE_VERIFY_12: u8 = 0xae;
    /// VERIFY(12).
    pub const VERIFY_12: u8 = 0xaf;
}

/// Service actions of SERVICE ACTION IN(16), MAINTENANCE IN and MAINTENANCE OUT.
pub mod sa {
    /// READ CAPACITY(16).
    pub const READ_CAPACITY_16: u8 = 0x10;
    /// GET LBA STATUS.
    pub const GET_LBA_STATUS: u8 = 0x12;
    /// REPORT TARGET PORT GROUPS.
    pub const REPORT_TARGET_PORT_GROUPS: u8 = 0x0a;
    /// REPORT SUPPORTED OPERATION CODES.
    pub const REPORT_SUPPORTED_OPCODES: u8 = 0x0c;
    /// REPORT SUPPORTED TASK MANAGEMENT FUNCTIONS.
    pub const REPORT_SUPPORTED_TMFS: u8 = 0x0d;
    /// SET TARGET PORT GROUPS (MAINTENANCE OUT).
    pub const SET_TARGET_PORT_GROUPS: u8 = 0x0a;
    /// SANITIZE: OVERWRITE.
    pub const SANITIZE_OVERWRITE: u8 = 0x01;
    /// SANITIZE: BLOCK ERASE.
    pub const SANITIZE_BLOCK_ERASE: u8 = 0x02;
    /// SANITIZE: CRYPTOGRAPHIC ERASE (not offered).
    pub const SANITIZE_CRYPTO_ERASE: u8 = 0x03;
    /// SANITIZE: EXIT FAILURE MODE.
    pub const SANITIZE_EXIT_FAILURE_MODE: u8 = 0x1f;
}

/// Length of the CDB an opcode uses, from its group code (SPC-4 4.2.5.1);
/// None for variable-length and vendor-specific groups.
pub fn cdb_len_bytes(opcode: u8) -> Option<usize> {
    match opcode >> 5 {
        0 => Some(6),
        1 | 2 => Some(10),
        4 => Some(16),
        5 => Some(12),
        _ => None,
    }
}

/// A length-checked CDB, zero padded to 16 bytes.
#[derive(Debug, Clone, Copy)]
pub struct Cdb {
    bytes: [u8; 16],
    len_bytes: usize,
}

impl Cdb {
    /// Checks `raw` against its opcode's length and copies it. Errors: empty CDB or
    /// unknown group -> INVALID COMMAND OPERATION CODE; too short -> INVALID FIELD IN CDB.
    pub fn parse(raw: &[u8]) -> Result<Cdb, Sense> {
        let opcode = *raw.first().ok_or(codes::INVALID_OPCODE)?;
        let len_bytes = cdb_len_bytes(opcode).ok_or(codes::INVALID_OPCODE)?;
        if raw.len() < len_bytes {
            return Err(codes::INVALID_FIELD_IN_CDB.with_field(true, raw.len() as u16, None));
        }
        let mut bytes = [0u8; 16];
        bytes[..len_bytes].copy_from_slice(&raw[..len_bytes]);
        Ok(Cdb { bytes, len_bytes })
    }

    /// The operation code.
    #[inline]
    pub fn opcode(&self) -> u8 {
        self.bytes[0]
    }

    /// The CDB bytes (its real length).
    pub fn as_slice(&self) -> &[u8] {
        &self.bytes[..self.len_bytes]
    }

    /// Length of the CDB in bytes.
    pub fn len_bytes(&self) -> usize {
        self.len_bytes
    }

    /// Byte `i` (zero past the end).
    #[inline]
    pub fn b(&self, i: usize) -> u8 {
        self.bytes.get(i).copied().unwrap_or(0)
    }

    /// Big-endian u16 at `i`.
    #[inline]
    pub fn u16_at(&self, i: usize) -> u16 {
        u16::from_be_bytes([self.b(i), self.b(i + 1)])
    }

    /// Big-endian u24 at `i`.
    #[inline]
    pub fn u24_at(&self, i: usize) -> u32 {
        u32::from_be_bytes([0, self.b(i), self.b(i + 1), self.b(i + 2)])
    }

    /// Big-endian u32 at `i`.
    #[inline]
    pub fn u32_at(&self, i: usize) -> u32 {
        u32::from_be_bytes([self.b(i), self.b(i + 1), self.b(i + 2), self.b(i + 3)])
    }

    /// Big-endian u64 at `i`.
    #[inline]
    pub fn u64_at(&self, i: usize) -> u64 {
        ((self.u32_at(i) as u64) << 32) | self.u32_at(i + 4) as u64
    }

    /// The CONTROL byte (last byte of the CDB).
    pub fn control(&self) -> u8 {
        self.b(self.len_bytes - 1)
    }

    /// Service action (low 5 bits of byte 1) for opcodes that have one.
    pub fn service_action(&self) -> u8 {
        self.b(1) & 0x1f
    }

    /// INVALID FIELD IN CDB pointing at `byte`/`bit` of this CDB.
    pub fn invalid(&self, byte: u16, bit: Option<u8>) -> Sense {
        codes::INVALID_FIELD_IN_CDB.with_field(true, byte, bit)
    }
}

/// Big-endian u16 from a parameter list (zero past the end).
pub fn param_u16(p: &[u8], i: usize) -> u16 {
    u16::from_be_bytes([
        p.get(i).copied().unwrap_or(0),
        p.get(i + 1).copied().unwrap_or(0),
    ])
}

/// Big-endian u32 from a parameter list (zero past the end).
pub fn param_u32(p: &[u8], i: usize) -> u32 {
    u32::from_be_bytes([
        p.get(i).copied().unwrap_or(0),
        p.get(i + 1).copied().unwrap_or(0),
        p.get(i + 2).copied().unwrap_or(0),
        p.get(i + 3).copied().unwrap_or(0),
    ])
}

/// Big-endian u64 from a parameter list (zero past the end).
pub fn param_u64(p: &[u8], i: usize) -> u64 {
    ((param_u32(p, i) as u64) << 32) | param_u32(p, i + 4) as u64
}

/// Writes `s` into `dst` as space-padded ASCII (non-printable bytes become spaces).
pub fn put_ascii(dst: &mut [u8], s: &str) {
    let src = s.as_bytes();
    for (i, d) in dst.iter_mut().enumerate() {
        *d = match src.get(i) {
            Some(&c) if (0x20..=0x7e).contains(&c) => c,
            _ => b' ',
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lengths_and_short_cdbs() {
        assert_eq!(cdb_len_bytes(0x28), Some(10));
        assert_eq!(cdb_len_bytes(0x88), Some(16));
        assert_eq!(cdb_len_bytes(0xa8), Some(12));
        assert_eq!(cdb_len_bytes(0x12), Some(6));
        assert_eq!(cdb_len_bytes(0x7f), None);
        assert!(Cdb::parse(&[]).is_err());
        assert!(Cdb::parse(&[0x28, 0, 0]).is_err());
        let c = Cdb::parse(&[0x28, 0, 0, 0, 0, 9, 0, 0, 2, 0x80]).unwrap();
        assert_eq!(c.u32_at(2), 9);
        assert_eq!(c.u16_at(7), 2);
        assert_eq!(c.control(), 0x80);
        assert_eq!(c.b(100), 0);
    }

    #[test]
    fn ascii_padding() {
        let mut b = [0u8; 8];
        put_ascii(&mut b, "ab\u{1}");
        assert_eq!(&b, b"ab      ");
    }
}
