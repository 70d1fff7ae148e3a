//! Sense data: the error half of every SCSI answer, in fixed or descriptor format.

use block::Bytes;

/// Sense keys (SPC-4 table 50).
pub mod key {
    /// No sense.
    pub const NO_SENSE: u8 = 0x0;
    /// Recovered error.
    pub const RECOVERED_ERROR: u8 = 0x1;
    /// Not ready.
    pub const NOT_READY: u8 = 0x2;
    /// Medium error.
    pub const MEDIUM_ERROR: u8 = 0x3;
    /// Hardware error.
    pub const HARDWARE_ERROR: u8 = 0x4;
    /// Illegal request.
    pub const ILLEGAL_REQUEST: u8 = 0x5;
    /// Unit attention.
    pub const UNIT_ATTENTION: u8 = 0x6;
    /// Data protect.
    pub const DATA_PROTECT: u8 = 0x7;
    /// Aborted command.
    pub const ABORTED_COMMAND: u8 = 0xb;
    /// COPY ABORTED: an EXTENDED COPY stopped while processing its segments.
    pub const COPY_ABORTED: u8 = 0xa;
    /// Miscompare.
    pub const MISCOMPARE: u8 = 0xe;
}

/// One sense condition: key, additional sense code and qualifier, plus the optional
/// INFORMATION field and sense-key-specific field pointer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sense {
    /// Sense key.
    pub key: u8,
    /// Additional sense code.
    pub asc: u8,
    /// Additional sense code qualifier.
    pub ascq: u8,
    /// INFORMATION field (e.g. first bad LBA, miscompare offset), with VALID set.
    pub information: Option<u64>,
    /// Sense-key-specific field pointer: (in CDB rather than parameter data, byte, bit).
    pub field_pointer: Option<FieldPointer>,
    /// Sense-key-specific progress indication (NOT READY, e.g. a sanitize running):
    /// the fraction done, out of 65536. Ignored when a field pointer is set.
    pub progress: Option<u16>,
}

/// Points at the offending field of an ILLEGAL REQUEST.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FieldPointer {
    /// True when the field is in the CDB, false when in the parameter list.
    pub in_cdb: bool,
    /// Byte offset of the field.
    pub byte: u16,
    /// Bit of the field's most significant bit, when it is not a whole byte.
    pub bit: Option<u8>,
}

impl Sense {
    /// A sense condition with no INFORMATION or field pointer.
    pub const fn new(key: u8, asc: u8, ascq: u8) -> Sense {
        Sense {
            key,
            asc,
            ascq,
            information: None,
            field_pointer: None,
            progress: None,
        }
    }

    /// Adds a progress indication (fraction done, out of 65536).
    pub const fn with_progress(mut self, done: u16) -> Sense {
        self.progress = Some(done);
        self
    }

    /// Adds the INFORMATION field.
    pub const fn with_information(mut self, info: u64) -> Sense {
        self.information = Some(info);
        self
    }

    /// Adds a field pointer into the CDB (`in_cdb`) or the parameter list.
    pub const fn with_field(mut self, in_cdb: bool, byte: u16, bit: Option<u8>) -> Sense {
        self.field_pointer = Some(FieldPointer { in_cdb, byte, bit });
        self
    }

    /// Encodes as fixed (0x70) or descriptor (0x72) format sense data.
    pub fn encode(&self, descriptor: bool) -> Bytes {
        let sks = self.field_pointer.map(|fp| {
            let mut b = [0u8; 3];
            b[0] = 0x80 | if fp.in_cdb { 0x40 } else { 0 };
            if let Some(bit) = fp.bit {
                b[0] |= 0x08 | (bit & 7);
            }
            b[1..3].copy_from_slice(&fp.byte.to_be_bytes());
            b
        });
        let sks = sks.or_else(|| {
            self.progress.map(|p| {
                let [hi, lo] = p.to_be_bytes();
                [0x80, hi, lo]
            })
        });
        if descriptor {
            let mut out = vec![0x72, self.key & 0xf, self.asc, self.ascq, 0, 0, 0, 0];
            if let Some(info) = self.information {
                out.extend_from_slice(&[0x00, 0x0a, 0x80, 0]);
                out.extend_from_slice(&info.to_be_bytes());
            }
            if let Some(sks) = sks {
                out.extend_from_slice(&[0x02, 0x06, 0, 0]);
                out.extend_from_slice(&sks);
                out.push(0);
            }
            out[7] = (out.len() - 8) as u8;
            Bytes::from(out)
        } else {
            let mut out = vec![0u8; 18];
            out[0] = 0x70;
            out[2] = self.key & 0xf;
            // an INFORMATION that does not fit the fixed format's 4 bytes (an
            // LBA past 2^32 - 1) is left out, VALID clear, as SPC says: cut to
            // 32 bits it named another block (descriptor format carries it)
            if let Some(info) = self.information.and_then(|i| u32::try_from(i).ok()) {
                out[0] |= 0x80;
                out[3..7].copy_from_slice(&info.to_be_bytes());
            }
            out[7] = 10;
            out[12] = self.asc;
            out[13] = self.ascq;
            if let Some(sks) = sks {
                out[15..18].copy_from_slice(&sks);
            }
            Bytes::from(out)
        }
    }
}

/// Common conditions, named after their SPC-4 descriptions.
pub mod codes {
    use super::{key, Sense};
    /// LOGICAL UNIT NOT READY, SANITIZE IN PROGRESS.
    pub const SANITIZE_IN_PROGRESS: Sense = Sense::new(key::NOT_READY, 0x04, 0x1b);
    /// SANITIZE COMMAND FAILED: the medium is in sanitize failure mode.
    pub const SANITIZE_FAILED: Sense = Sense::new(key::MEDIUM_ERROR, 0x31, 0x03);
    /// INVALID COMMAND OPERATION CODE.
    pub const INVALID_OPCODE: Sense = Sense::new(key::ILLEGAL_REQUEST, 0x20, 0x00);
    /// INVALID FIELD IN CDB (add a field pointer with `with_field`).
    pub const INVALID_FIELD_IN_CDB: Sense = Sense::new(key::ILLEGAL_REQUEST, 0x24, 0x00);
    /// INVALID FIELD IN PARAMETER LIST.
    pub const INVALID_FIELD_IN_PARAM: Sense = Sense::new(key::ILLEGAL_REQUEST, 0x26, 0x00);
    /// PARAMETER LIST LENGTH ERROR.
    pub const PARAM_LIST_LENGTH_ERROR: Sense = Sense::new(key::ILLEGAL_REQUEST, 0x1a, 0x00);
    /// LOGICAL BLOCK ADDRESS OUT OF RANGE.
    pub const LBA_OUT_OF_RANGE: Sense = Sense::new(key::ILLEGAL_REQUEST, 0x21, 0x00);
    /// LOGICAL UNIT NOT SUPPORTED.
    pub const LUN_NOT_SUPPORTED: Sense = Sense::new(key::ILLEGAL_REQUEST, 0x25, 0x00);
    /// INSUFFICIENT REGISTRATION RESOURCES.
    pub const INSUFFICIENT_REGISTRATION_RESOURCES: Sense =
        Sense::new(key::ILLEGAL_REQUEST, 0x55, 0x04);
    /// WRITE PROTECTED.
    pub const WRITE_PROTECTED: Sense = Sense::new(key::DATA_PROTECT, 0x27, 0x00);
    /// A thin LU could not get the space a write needed (SBC-4 4.7.3.7).
    pub const SPACE_ALLOCATION_FAILED: Sense = Sense::new(key::DATA_PROTECT, 0x27, 0x07);
    /// A thin LU's use crossed its soft threshold (SBC-4 4.7.3.8).
    pub const THIN_SOFT_THRESHOLD_REACHED: Sense = Sense::new(key::UNIT_ATTENTION, 0x38, 0x07);
    /// UNRECOVERED READ ERROR.
    pub const UNRECOVERED_READ_ERROR: Sense = Sense::new(key::MEDIUM_ERROR, 0x11, 0x00);
    /// WRITE ERROR.
    pub const WRITE_ERROR: Sense = Sense::new(key::MEDIUM_ERROR, 0x0c, 0x00);
    /// INTERNAL TARGET FAILURE.
    pub const INTERNAL_TARGET_FAILURE: Sense = Sense::new(key::HARDWARE_ERROR, 0x44, 0x00);
    /// MISCOMPARE DURING VERIFY OPERATION.
    pub const MISCOMPARE_DURING_VERIFY: Sense = Sense::new(key::MISCOMPARE, 0x1d, 0x00);
    /// POWER ON, RESET, OR BUS DEVICE RESET OCCURRED.
    pub const POWER_ON_RESET: Sense = Sense::new(key::UNIT_ATTENTION, 0x29, 0x00);
    /// BUS DEVICE RESET FUNCTION OCCURRED (LUN reset).
    pub const BUS_DEVICE_RESET: Sense = Sense::new(key::UNIT_ATTENTION, 0x29, 0x03);
    /// MODE PARAMETERS CHANGED.
    pub const MODE_PARAMETERS_CHANGED: Sense = Sense::new(key::UNIT_ATTENTION, 0x2a, 0x01);
    /// RESERVATIONS PREEMPTED.
    pub const RESERVATIONS_PREEMPTED: Sense = Sense::new(key::UNIT_ATTENTION, 0x2a, 0x03);
    /// RESERVATIONS RELEASED.
    pub const RESERVATIONS_RELEASED: Sense = Sense::new(key::UNIT_ATTENTION, 0x2a, 0x04);
    /// REGISTRATIONS PREEMPTED.
    pub const REGISTRATIONS_PREEMPTED: Sense = Sense::new(key::UNIT_ATTENTION, 0x2a, 0x05);
    /// CAPACITY DATA HAS CHANGED.
    pub const CAPACITY_DATA_CHANGED: Sense = Sense::new(key::UNIT_ATTENTION, 0x2a, 0x09);
    /// COMMANDS CLEARED BY ANOTHER INITIATOR.
    pub const COMMANDS_CLEARED_BY_ANOTHER_INITIATOR: Sense =
        Sense::new(key::UNIT_ATTENTION, 0x2f, 0x00);
    /// REPORTED LUNS DATA HAS CHANGED.
    pub const REPORTED_LUNS_DATA_CHANGED: Sense = Sense::new(key::UNIT_ATTENTION, 0x3f, 0x0e);
    /// ASYMMETRIC ACCESS STATE CHANGED.
    pub const ALUA_STATE_CHANGED: Sense = Sense::new(key::UNIT_ATTENTION, 0x2a, 0x06);
    /// LOGICAL UNIT NOT ACCESSIBLE, TARGET PORT IN STANDBY STATE.
    pub const PORT_STANDBY: Sense = Sense::new(key::NOT_READY, 0x04, 0x0b);
    /// LOGICAL UNIT NOT ACCESSIBLE, TARGET PORT IN UNAVAILABLE STATE.
    pub const PORT_UNAVAILABLE: Sense = Sense::new(key::NOT_READY, 0x04, 0x0c);
    /// MEDIUM NOT PRESENT (after START STOP UNIT with LOEJ).
    pub const MEDIUM_NOT_PRESENT: Sense = Sense::new(key::NOT_READY, 0x3a, 0x00);
    /// LOGICAL UNIT NOT READY, INITIALIZING COMMAND REQUIRED (stopped unit).
    pub const NOT_READY_INIT_REQUIRED: Sense = Sense::new(key::NOT_READY, 0x04, 0x02);
    /// MEDIUM REMOVAL PREVENTED.
    pub const MEDIUM_REMOVAL_PREVENTED: Sense = Sense::new(key::ILLEGAL_REQUEST, 0x53, 0x02);
    /// INVALID FIELD IN COMMAND INFORMATION UNIT (Data-Out does not match the CDB).
    pub const INVALID_FIELD_IN_CIU: Sense = Sense::new(key::ILLEGAL_REQUEST, 0x0e, 0x03);
    /// SAVING PARAMETERS NOT SUPPORTED.
    pub const SAVING_PARAMETERS_NOT_SUPPORTED: Sense = Sense::new(key::ILLEGAL_REQUEST, 0x39, 0x00);
    /// NO ADDITIONAL SENSE INFORMATION (REQUEST SENSE with nothing to report).
    pub const NO_SENSE: Sense = Sense::new(key::NO_SENSE, 0x00, 0x00);
    /// I_T NEXUS LOSS OCCURRED.
    pub const IT_NEXUS_LOSS: Sense = Sense::new(key::UNIT_ATTENTION, 0x29, 0x07);
    /// LOGICAL UNIT NOT READY, CAUSE NOT REPORTABLE.
    pub const NOT_READY_CAUSE_NOT_REPORTABLE: Sense = Sense::new(key::NOT_READY, 0x04, 0x00);
    /// TOO MANY TARGET DESCRIPTORS (EXTENDED COPY CSCD descriptors).
    pub const TOO_MANY_TARGET_DESCRIPTORS: Sense = Sense::new(key::ILLEGAL_REQUEST, 0x26, 0x06);
    /// UNSUPPORTED TARGET DESCRIPTOR TYPE CODE.
    pub const UNSUPPORTED_TARGET_DESCRIPTOR: Sense = Sense::new(key::ILLEGAL_REQUEST, 0x26, 0x07);
    /// TOO MANY SEGMENT DESCRIPTORS.
    pub const TOO_MANY_SEGMENT_DESCRIPTORS: Sense = Sense::new(key::ILLEGAL_REQUEST, 0x26, 0x08);
    /// UNSUPPORTED SEGMENT DESCRIPTOR TYPE CODE.
    pub const UNSUPPORTED_SEGMENT_DESCRIPTOR: Sense = Sense::new(key::ILLEGAL_REQUEST, 0x26, 0x09);
    /// OPERATION IN PROGRESS (a copy with this list identifier is running).
    pub const OPERATION_IN_PROGRESS: Sense = Sense::new(key::ILLEGAL_REQUEST, 0x00, 0x16);
    /// COPY ABORTED with no further detail (a segment outside a copy target's capacity).
    pub const COPY_ABORTED: Sense = Sense::new(key::COPY_ABORTED, 0x00, 0x00);
    /// COPY ABORTED, COPY TARGET DEVICE NOT REACHABLE (no such CSCD, or not here).
    pub const COPY_TARGET_NOT_REACHABLE: Sense = Sense::new(key::COPY_ABORTED, 0x0d, 0x02);
    /// COPY ABORTED, THIRD PARTY DEVICE FAILURE (a copy target's read or write failed).
    pub const COPY_TARGET_FAILURE: Sense = Sense::new(key::COPY_ABORTED, 0x0d, 0x01);
    /// INVALID TOKEN OPERATION, UNSUPPORTED TOKEN TYPE (a ROD type we do not take).
    pub const TOKEN_UNSUPPORTED_TYPE: Sense = Sense::new(key::ILLEGAL_REQUEST, 0x23, 0x01);
    /// INVALID TOKEN OPERATION, TOKEN UNKNOWN (not one this target made).
    pub const TOKEN_UNKNOWN: Sense = Sense::new(key::ILLEGAL_REQUEST, 0x23, 0x04);
    /// INVALID TOKEN OPERATION, TOKEN CORRUPT (differs from the one made).
    pub const TOKEN_CORRUPT: Sense = Sense::new(key::ILLEGAL_REQUEST, 0x23, 0x05);
    /// INVALID TOKEN OPERATION, TOKEN REVOKED (its source LU went away, shrank or was reset).
    pub const TOKEN_REVOKED: Sense = Sense::new(key::ILLEGAL_REQUEST, 0x23, 0x06);
    /// INVALID TOKEN OPERATION, TOKEN EXPIRED (inactivity timeout or lifetime).
    pub const TOKEN_EXPIRED: Sense = Sense::new(key::ILLEGAL_REQUEST, 0x23, 0x07);
    /// INVALID TOKEN OPERATION, TOKEN CANCELLED (a used token reclaimed to make
    /// room for a new one).
    pub const TOKEN_CANCELLED: Sense = Sense::new(key::ILLEGAL_REQUEST, 0x23, 0x08);
    /// INVALID TOKEN OPERATION, TOKEN DELETED (by WRITE USING TOKEN's DEL_TKN).
    pub const TOKEN_DELETED: Sense = Sense::new(key::ILLEGAL_REQUEST, 0x23, 0x09);
    /// INVALID TOKEN OPERATION, INVALID TOKEN LENGTH.
    pub const TOKEN_INVALID_LENGTH: Sense = Sense::new(key::ILLEGAL_REQUEST, 0x23, 0x0a);
    /// INSUFFICIENT RESOURCES TO CREATE ROD TOKEN (the target holds its most tokens).
    pub const INSUFFICIENT_RESOURCES_FOR_ROD_TOKEN: Sense =
        Sense::new(key::ILLEGAL_REQUEST, 0x55, 0x0d);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An INFORMATION past 32 bits (an LBA of a volume over 2 TiB at 512-byte
    /// blocks) is left out of fixed-format sense with VALID clear, not cut to
    /// another block's number; descriptor format carries it whole.
    #[test]
    fn an_information_past_32_bits_is_not_cut_in_fixed_format() {
        let s = Sense::new(key::MEDIUM_ERROR, 0x11, 0).with_information((1 << 32) + 10);
        let fixed = s.encode(false);
        assert_eq!(fixed[0], 0x70, "VALID set");
        assert_eq!(&fixed[3..7], &[0; 4]);
        let d = s.encode(true);
        assert_eq!(&d[12..20], &((1u64 << 32) + 10).to_be_bytes());
        let small = Sense::new(key::MEDIUM_ERROR, 0x11, 0)
            .with_information(10)
            .encode(false);
        assert_eq!(small[0], 0xf0);
        assert_eq!(&small[3..7], &10u32.to_be_bytes());
    }

    #[test]
    fn fixed_and_descriptor_layouts() {
        let s = codes::LBA_OUT_OF_RANGE.with_information(0x1234);
        let f = s.encode(false);
        assert_eq!(f[0], 0xf0);
        assert_eq!(f[2], key::ILLEGAL_REQUEST);
        assert_eq!(&f[3..7], &[0, 0, 0x12, 0x34]);
        assert_eq!((f[12], f[13]), (0x21, 0));
        let d = s.encode(true);
        assert_eq!(d[0], 0x72);
        assert_eq!((d[1], d[2], d[3]), (key::ILLEGAL_REQUEST, 0x21, 0));
        assert_eq!(d[7] as usize, d.len() - 8);
        assert_eq!(&d[12..20], &0x1234u64.to_be_bytes());
    }

    #[test]
    fn progress_indication() {
        let f = codes::SANITIZE_IN_PROGRESS
            .with_progress(0x4000)
            .encode(false);
        assert_eq!((f[2], f[12], f[13]), (key::NOT_READY, 0x04, 0x1b));
        assert_eq!(&f[15..18], &[0x80, 0x40, 0x00]);
        let d = codes::SANITIZE_IN_PROGRESS
            .with_progress(0x4000)
            .encode(true);
        assert_eq!(&d[8..12], &[0x02, 0x06, 0, 0]);
        assert_eq!(&d[12..15], &[0x80, 0x40, 0x00]);
    }

    #[test]
    fn field_pointer_in_cdb() {
        let f = codes::INVALID_FIELD_IN_CDB
            .with_field(true, 1, Some(4))
            .encode(false);
        assert_eq!(f[15], 0x80 | 0x40 | 0x08 | 4);
        assert_eq!(&f[16..18], &[0, 1]);
    }
}
