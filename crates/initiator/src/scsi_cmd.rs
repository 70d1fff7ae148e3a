//! SCSI command blocks the LUN volume sends and the sense data it interprets.

use block::BlockError;

/// SCSI status codes used here.
pub(crate) mod status {
    pub const GOOD: u8 = 0x00;
    pub const CHECK_CONDITION: u8 = 0x02;
    pub const CONDITION_MET: u8 = 0x04;
    pub const BUSY: u8 = 0x08;
    pub const RESERVATION_CONFLICT: u8 = 0x18;
    pub const TASK_SET_FULL: u8 = 0x28;
    pub const TASK_ABORTED: u8 = 0x40;
}

/// Sense keys.
pub(crate) mod key {
    pub const NOT_READY: u8 = 0x2;
    pub const MEDIUM_ERROR: u8 = 0x3;
    pub const HARDWARE_ERROR: u8 = 0x4;
    pub const ILLEGAL_REQUEST: u8 = 0x5;
    pub const UNIT_ATTENTION: u8 = 0x6;
    pub const DATA_PROTECT: u8 = 0x7;
    pub const ABORTED_COMMAND: u8 = 0xb;
}

/// The fields of sense data that decide what to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Sense {
    /// Sense key.
    pub key: u8,
    /// Additional sense code.
    pub asc: u8,
    /// Additional sense code qualifier.
    pub ascq: u8,
    /// INFORMATION field (the failing LBA for medium errors), when valid.
    pub information: Option<u64>,
}

/// Parses fixed (0x70/0x71) or descriptor (0x72/0x73) sense data.
pub fn parse_sense(b: &[u8]) -> Option<Sense> {
    let code = *b.first()? & 0x7f;
    match code {
        0x70 | 0x71 => {
            let key = *b.get(2)? & 0x0f;
            let information = if b[0] & 0x80 != 0 {
                b.get(3..7)
                    .map(|x| u32::from_be_bytes([x[0], x[1], x[2], x[3]]) as u64)
            } else {
                None
            };
            Some(Sense {
                key,
                asc: b.get(12).copied().unwrap_or(0),
                ascq: b.get(13).copied().unwrap_or(0),
                information,
            })
        }
        0x72 | 0x73 => {
            let key = *b.get(1)? & 0x0f;
            let asc = b.get(2).copied().unwrap_or(0);
            let ascq = b.get(3).copied().unwrap_or(0);
            let add_len = b.get(7).copied().unwrap_or(0) as usize;
            let descs = b.get(8..(8 + add_len).min(b.len())).unwrap_or(&[]);
            let mut information = None;
            let mut i = 0;
            while i + 2 <= descs.len() {
                let ty = descs[i];
                let len = descs[i + 1] as usize;
                if ty == 0 && len >= 10 {
                    if let Some(x) = descs.get(i + 4..i + 12) {
                        let mut v = [0u8; 8];
                        v.copy_from_slice(x);
                        information = Some(u64::from_be_bytes(v));
                    }
                }
                i += 2 + len;
            }
            Some(Sense {
                key,
                asc,
                ascq,
                information,
            })
        }
        _ => None,
    }
}

/// How the LUN volume should treat a SCSI outcome that is not GOOD.
#[derive(Debug)]
pub(crate) enum Verdict {
    /// Retry the same command on the same path (unit attention, busy).
    Retry,
    /// The path cannot serve I/O (NOT READY, ALUA standby/unavailable, aborted).
    PathDown(String),
    /// A definite answer about the data.
    Error(BlockError),
}

/// Maps a non-GOOD status and its sense to what to do. `lba` is the first block
/// of the request, `write` whether it wrote.
pub(crate) fn verdict(st: u8, sense: Option<&[u8]>, lba: u64, write: bool) -> Verdict {
    match st {
        status::BUSY | status::TASK_SET_FULL => return Verdict::Retry,
        status::TASK_ABORTED => return Verdict::PathDown("task aborted".into()),
        status::RESERVATION_CONFLICT => {
            return Verdict::Error(BlockError::Unavailable("reservation conflict".into()))
        }
        status::CHECK_CONDITION => {}
        other => {
            return Verdict::Error(BlockError::Unavailable(format!("SCSI status {other:#04x}")))
        }
    }
    let Some(s) = sense.and_then(parse_sense) else {
        return Verdict::Error(BlockError::Unavailable(
            "CHECK CONDITION without sense".into(),
        ));
    };
    let at = s.information.unwrap_or(lba);
    match s.key {
        key::UNIT_ATTENTION => Verdict::Retry,
        key::NOT_READY => {
            Verdict::PathDown(format!("NOT READY asc {:#04x} ascq {:#04x}", s.asc, s.ascq))
        }
        key::ABORTED_COMMAND => Verdict::PathDown(format!(
            "ABORTED COMMAND asc {:#04x} ascq {:#04x}",
            s.asc, s.ascq
        )),
        key::MEDIUM_ERROR | key::HARDWARE_ERROR => {
            if write {
                Verdict::Error(BlockError::WriteFault { lba: at })
            } else {
                Verdict::Error(BlockError::Medium { lba: at })
            }
        }
        key::DATA_PROTECT if s.asc == 0x27 && s.ascq == 0x07 => {
            Verdict::Error(BlockError::NoSpace { lba: at })
        }
        key::DATA_PROTECT => Verdict::Error(BlockError::ReadOnly),
        key::ILLEGAL_REQUEST => match s.asc {
            0x21 => Verdict::Error(BlockError::OutOfRange {
                lba,
                blocks: 0,
                block_count: 0,
            }),
            0x20 | 0x24 | 0x26 => Verdict::Error(BlockError::NotSupported(
                "the target refused the command (ILLEGAL REQUEST)",
            )),
            _ => Verdict::Error(BlockError::Unavailable(format!(
                "ILLEGAL REQUEST asc {:#04x} ascq {:#04x}",
                s.asc, s.ascq
            ))),
        },
        k => Verdict::Error(BlockError::Unavailable(format!(
            "sense key {k:#x} asc {:#04x} ascq {:#04x}",
            s.asc, s.ascq
        ))),
    }
}

/// CDB builders (big-endian fields).
pub(crate) mod cdb {
    pub fn test_unit_ready() -> [u8; 6] {
        [0; 6]
    }

    pub fn inquiry_vpd(page: u8, alloc_len: u16) -> [u8; 6] {
        let l = alloc_len.to_be_bytes();
        [0x12, 0x01, page, l[0], l[1], 0]
    }

    pub fn read_capacity_10() -> [u8; 10] {
        [0x25, 0, 0, 0, 0, 0, 0, 0, 0, 0]
    }

    pub fn read_capacity_16(alloc_len: u32) -> [u8; 16] {
        let mut c = [0u8; 16];
        c[0] = 0x9e;
        c[1] = 0x10;
        c[10..14].copy_from_slice(&alloc_len.to_be_bytes());
        c
    }

    pub fn mode_sense_6_caching(alloc_len: u8) -> [u8; 6] {
        // DBD set, page 0x08 (caching), current values.
        [0x1a, 0x08, 0x08, 0, alloc_len, 0]
    }

    fn rw16(op: u8, flags: u8, lba: u64, blocks: u32) -> [u8; 16] {
        let mut c = [0u8; 16];
        c[0] = op;
        c[1] = flags;
        c[2..10].copy_from_slice(&lba.to_be_bytes());
        c[10..14].copy_from_slice(&blocks.to_be_bytes());
        c
    }

    pub fn read_16(lba: u64, blocks: u32) -> [u8; 16] {
        rw16(0x88, 0, lba, blocks)
    }

    pub fn write_16(lba: u64, blocks: u32, fua: bool) -> [u8; 16] {
        rw16(0x8a, if fua { 0x08 } else { 0 }, lba, blocks)
    }

    pub fn write_same_16(lba: u64, blocks: u32, unmap: bool) -> [u8; 16] {
        rw16(0x93, if unmap { 0x08 } else { 0 }, lba, blocks)
    }

    pub fn sync_cache_16() -> [u8; 16] {
        // LBA 0, NUMBER OF BLOCKS 0: the whole medium.
        let mut c = [0u8; 16];
        c[0] = 0x91;
        c
    }

    pub fn sync_cache_10() -> [u8; 10] {
        [0x35, 0, 0, 0, 0, 0, 0, 0, 0, 0]
    }

    pub fn unmap(param_len: u16) -> [u8; 10] {
        let l = param_len.to_be_bytes();
        [0x42, 0, 0, 0, 0, 0, 0, l[0], l[1], 0]
    }

    /// UNMAP parameter list with one block descriptor.
    pub fn unmap_params(lba: u64, blocks: u32) -> [u8; 24] {
        let mut p = [0u8; 24];
        p[0..2].copy_from_slice(&22u16.to_be_bytes());
        p[2..4].copy_from_slice(&16u16.to_be_bytes());
        p[8..16].copy_from_slice(&lba.to_be_bytes());
        p[16..20].copy_from_slice(&blocks.to_be_bytes());
        p
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixed_and_descriptor_sense() {
        let mut f = [0u8; 18];
        f[0] = 0xf0;
        f[2] = 0x03;
        f[3..7].copy_from_slice(&77u32.to_be_bytes());
        f[12] = 0x11;
        let s = parse_sense(&f).unwrap();
        assert_eq!((s.key, s.asc, s.information), (3, 0x11, Some(77)));
        assert!(matches!(
            verdict(2, Some(&f), 5, false),
            Verdict::Error(BlockError::Medium { lba: 77 })
        ));
        assert!(matches!(
            verdict(2, Some(&f), 5, true),
            Verdict::Error(BlockError::WriteFault { lba: 77 })
        ));
        let d = [0x72, 0x02, 0x04, 0x0b, 0, 0, 0, 0];
        let s = parse_sense(&d).unwrap();
        assert_eq!((s.key, s.asc, s.ascq), (2, 4, 0x0b));
        assert!(matches!(
            verdict(2, Some(&d), 0, true),
            Verdict::PathDown(_)
        ));
        let mut d = vec![0x72, 0x03, 0x11, 0, 0, 0, 0, 12, 0, 10, 0x80, 0];
        d.extend_from_slice(&9u64.to_be_bytes());
        assert_eq!(parse_sense(&d).unwrap().information, Some(9));
        assert!(parse_sense(&[]).is_none());
        assert!(parse_sense(&[0x70]).is_none());
        assert!(matches!(verdict(8, None, 0, false), Verdict::Retry));
        let ua = [0x70, 0, 0x06, 0, 0, 0, 0, 10, 0, 0, 0, 0, 0x29, 0];
        assert!(matches!(verdict(2, Some(&ua), 0, false), Verdict::Retry));
        let ro = [0x70, 0, 0x07, 0, 0, 0, 0, 10, 0, 0, 0, 0, 0x27, 0];
        assert!(matches!(
            verdict(2, Some(&ro), 0, true),
            Verdict::Error(BlockError::ReadOnly)
        ));
    }
}
