//! Which commands a reservation blocks: SPC-4 table 46 (SPC commands) and SBC-3
//! table 13 (block commands) reduced to three classes, plus the short list SPC-2
//! lets through a RESERVE held by another I_T nexus.

/// How a command fares under a persistent reservation held by someone else.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum CmdClass {
    /// Allowed under every reservation type.
    Always,
    /// Reads the medium (or its data): allowed under Write Exclusive types, conflicts
    /// under Exclusive Access types.
    Read,
    /// Changes the medium or the logical unit: conflicts under every type.
    Write,
}

/// Classifies a CDB by operation code and, where needed, service action or bits.
/// Unknown operation codes are `Write`: conflicting is the safe answer.
pub(super) fn classify(cdb: &[u8]) -> CmdClass {
    use CmdClass::{Always, Read, Write};
    let Some(&op) = cdb.first() else {
        return Always;
    };
    let sa = cdb.get(1).map_or(0, |b| b & 0x1f);
    let byte = |i: usize| cdb.get(i).copied().unwrap_or(0);
    match op {
        // TEST UNIT READY, REQUEST SENSE, INQUIRY, LOG SENSE, PERSISTENT RESERVE IN/OUT
        // (the PR OUT handler decides), REPORT LUNS, RESERVE/RELEASE (their handlers
        // apply SPC-4 5.13.3), READ CAPACITY(10), ACCESS CONTROL IN/OUT.
        0x00 | 0x03 | 0x12 | 0x4d | 0x5e | 0x5f | 0xa0 | 0x16 | 0x17 | 0x56 | 0x57 | 0x25
        | 0x86 | 0x87 => Always,
        // SERVICE ACTION IN(16): READ CAPACITY(16) is allowed; GET LBA STATUS, READ
        // LONG(16) and the rest read.
        0x9e => {
            if sa == 0x10 {
                Always
            } else {
                Read
            }
        }
        // MAINTENANCE IN: REPORT IDENTIFYING INFORMATION, REPORT TARGET PORT GROUPS,
        // REPORT ALIASES, REPORT SUPPORTED OPERATION CODES / TASK MANAGEMENT FUNCTIONS,
        // REPORT PRIORITY, REPORT TIMESTAMP.
        0xa3 => match sa {
            0x05 | 0x0a | 0x0b | 0x0c | 0x0d | 0x0e | 0x0f => Always,
            _ => Read,
        },
        // SERVICE ACTION IN(12): READ MEDIA SERIAL NUMBER.
        0xab => {
            if sa == 0x01 {
                Always
            } else {
                Read
            }
        }
        // PREVENT ALLOW MEDIUM REMOVAL: allowing removal is harmless.
        0x1e => {
            if byte(4) & 0x03 == 0 {
                Always
            } else {
                Write
            }
        }
        // START STOP UNIT: START=1 with POWER CONDITION 0 is allowed.
        0x1b => {
            if byte(4) & 0x01 == 1 && byte(4) >> 4 == 0 {
                Always
            } else {
                Write
            }
        }
        // READ(6/10/12/16), VERIFY(10/12/16), PRE-FETCH(10/16), MODE SENSE(6/10),
        // READ BUFFER, RECEIVE DIAGNOSTIC RESULTS, READ ATTRIBUTE, READ DEFECT DATA
        // (10/12), READ LONG(10), RECEIVE COPY RESULTS, SECURITY PROTOCOL IN.
        0x08 | 0x28 | 0xa8 | 0x88 | 0x2f | 0xaf | 0x8f | 0x34 | 0x90 | 0x1a | 0x5a | 0x3c
        | 0x1c | 0x8c | 0x37 | 0xb7 | 0x3e | 0x84 | 0xa2 => Read,
        // POPULATE TOKEN reads the ranges its token will stand for; EXTENDED COPY and
        // WRITE USING TOKEN write.
        0x83 if sa == 0x10 => Read,
        // Variable length: READ(32) and VERIFY(32) read, the rest write.
        0x7f => match u16::from_be_bytes([byte(8), byte(9)]) {
            0x0009 | 0x000a => Read,
            _ => Write,
        },
        // WRITE*, WRITE AND VERIFY, WRITE SAME, UNMAP, COMPARE AND WRITE, SYNCHRONIZE
        // CACHE, MODE SELECT, LOG SELECT, WRITE BUFFER, SEND DIAGNOSTIC, FORMAT UNIT,
        // REASSIGN BLOCKS, EXTENDED COPY, MAINTENANCE OUT, SANITIZE, ... and anything
        // unknown.
        _ => Write,
    }
}

/// SPC-2: the commands another I_T nexus may still send while a RESERVE(6)/(10) is
/// held: INQUIRY, REQUEST SENSE, REPORT LUNS, RELEASE (a no-op for it), and the
/// MAINTENANCE IN reports multipath drivers poll (REPORT TARGET PORT GROUPS, REPORT
/// SUPPORTED OPERATION CODES / TASK MANAGEMENT FUNCTIONS).
pub(super) fn allowed_under_spc2(cdb: &[u8]) -> bool {
    let Some(&op) = cdb.first() else {
        return true;
    };
    let sa = cdb.get(1).map_or(0, |b| b & 0x1f);
    match op {
        0x12 | 0x03 | 0xa0 | 0x17 | 0x57 => true,
        0xa3 => matches!(sa, 0x0a | 0x0c | 0x0d),
        _ => false,
    }
}
