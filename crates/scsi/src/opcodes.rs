//! REPORT SUPPORTED OPERATION CODES and REPORT SUPPORTED TASK MANAGEMENT FUNCTIONS.
//!
//! The table below is the single list of what `execute` implements; each entry carries
//! its CDB usage data (which bits the device server looks at).

use crate::cdb::{op, sa, Cdb};
use crate::lu::{CmdResult, Done};

/// One supported command.
struct Entry {
    opcode: u8,
    service_action: Option<u8>,
    /// CDB usage data; its length is the CDB length.
    usage: &'static [u8],
    /// Only for thin-provisioned volumes.
    thin_only: bool,
    /// Only for volumes with atomic writes.
    atomic_only: bool,
    /// Only for LUs not replicated to an HA partner: SANITIZE, and ORWRITE,
    /// whose read and write are atomic only against this node's writes.
    local_only: bool,
}

const fn e(opcode: u8, service_action: Option<u8>, usage: &'static [u8]) -> Entry {
    Entry {
        opcode,
        service_action,
        usage,
        thin_only: false,
        atomic_only: false,
        local_only: false,
    }
}

/// A SANITIZE service action: the CDB's usage data (IMMED, AUSE, the service
/// action, the parameter list length).
const fn sanitize(service_action: u8, thin_only: bool) -> Entry {
    Entry {
        opcode: op::SANITIZE,
        service_action: Some(service_action),
        usage: &[0x48, 0xbf, 0, 0, 0, 0, 0, 0xff, 0xff, 0],
        thin_only,
        atomic_only: false,
        local_only: true,
    }
}

const RW10: [u8; 8] = [0xff, 0xff, 0xff, 0xff, 0x1f, 0xff, 0xff, 0x00];
const RW16: [u8; 14] = [
    0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x1f, 0x00,
];

macro_rules! cat {
    ($a:expr, $b:expr, $rest:expr) => {{
        const A: [u8; 2] = [$a, $b];
        const R: &[u8] = &$rest;
        const N: usize = 2 + R.len();
        const OUT: [u8; N] = {
            let mut o = [0u8; N];
            o[0] = A[0];
            o[1] = A[1];
            let mut i = 0;
            while i < R.len() {
                o[2 + i] = R[i];
                i += 1;
            }
            o
        };
        &OUT
    }};
}

const TABLE: &[Entry] = &[
    e(op::TEST_UNIT_READY, None, &[0x00, 0, 0, 0, 0, 0]),
    e(op::REQUEST_SENSE, None, &[0x03, 0x01, 0, 0, 0xff, 0]),
    e(op::READ_6, None, &[0x08, 0x1f, 0xff, 0xff, 0xff, 0]),
    e(op::WRITE_6, None, &[0x0a, 0x1f, 0xff, 0xff, 0xff, 0]),
    e(op::INQUIRY, None, &[0x12, 0x01, 0xff, 0xff, 0xff, 0]),
    e(op::MODE_SELECT_6, None, &[0x15, 0x11, 0, 0, 0xff, 0]),
    e(op::RESERVE_6, None, &[0x16, 0, 0, 0, 0, 0]),
    e(op::RELEASE_6, None, &[0x17, 0, 0, 0, 0, 0]),
    e(op::MODE_SENSE_6, None, &[0x1a, 0x08, 0xff, 0xff, 0xff, 0]),
    e(op::START_STOP_UNIT, None, &[0x1b, 0x01, 0, 0x0f, 0xf7, 0]),
    e(op::PREVENT_ALLOW, None, &[0x1e, 0, 0, 0, 0x03, 0]),
    e(
        op::READ_CAPACITY_10,
        None,
        &[0x25, 0, 0xff, 0xff, 0xff, 0xff, 0, 0, 0x01, 0],
    ),
    e(op::READ_10, None, cat!(0x28, 0x1a, RW10)),
    e(op::WRITE_10, None, cat!(0x2a, 0x1a, RW10)),
    e(op::WRITE_VERIFY_10, None, cat!(0x2e, 0x12, RW10)),
    e(op::VERIFY_10, None, cat!(0x2f, 0x16, RW10)),
    e(op::PRE_FETCH_10, None, cat!(0x34, 0x02, RW10)),
    e(op::SYNC_CACHE_10, None, cat!(0x35, 0x02, RW10)),
    e(
        op::READ_DEFECT_DATA_10,
        None,
        &[0x37, 0, 0x1f, 0, 0, 0, 0, 0xff, 0xff, 0],
    ),
    e(op::WRITE_SAME_10, None, cat!(0x41, 0x08, RW10)),
    Entry {
        opcode: op::UNMAP,
        service_action: None,
        usage: &[0x42, 0, 0, 0, 0, 0, 0x1f, 0xff, 0xff, 0],
        thin_only: true,
        atomic_only: false,
        local_only: false,
    },
    e(
        op::MODE_SELECT_10,
        None,
        &[0x55, 0x11, 0, 0, 0, 0, 0, 0xff, 0xff, 0],
    ),
    e(op::RESERVE_10, None, &[0x56, 0, 0, 0, 0, 0, 0, 0, 0, 0]),
    e(op::RELEASE_10, None, &[0x57, 0, 0, 0, 0, 0, 0, 0, 0, 0]),
    e(
        op::MODE_SENSE_10,
        None,
        &[0x5a, 0x18, 0xff, 0xff, 0, 0, 0, 0xff, 0xff, 0],
    ),
    e(
        op::PR_IN,
        Some(0),
        &[0x5e, 0x1f, 0, 0, 0, 0, 0, 0xff, 0xff, 0],
    ),
    e(
        op::PR_IN,
        Some(1),
        &[0x5e, 0x1f, 0, 0, 0, 0, 0, 0xff, 0xff, 0],
    ),
    e(
        op::PR_IN,
        Some(2),
        &[0x5e, 0x1f, 0, 0, 0, 0, 0, 0xff, 0xff, 0],
    ),
    e(
        op::PR_IN,
        Some(3),
        &[0x5e, 0x1f, 0, 0, 0, 0, 0, 0xff, 0xff, 0],
    ),
    e(op::PR_OUT, Some(0), &PR_OUT_USAGE),
    e(op::PR_OUT, Some(1), &PR_OUT_USAGE),
    e(op::PR_OUT, Some(2), &PR_OUT_USAGE),
    e(op::PR_OUT, Some(3), &PR_OUT_USAGE),
    e(op::PR_OUT, Some(4), &PR_OUT_USAGE),
    e(op::PR_OUT, Some(5), &PR_OUT_USAGE),
    e(op::PR_OUT, Some(6), &PR_OUT_USAGE),
    e(op::PR_OUT, Some(7), &PR_OUT_USAGE),
    e(op::READ_16, None, cat!(0x88, 0x1a, RW16)),
    e(
        op::COMPARE_AND_WRITE,
        None,
        &[
            0x89, 0x1a, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0xff, 0x1f, 0,
        ],
    ),
    e(
        op::EXTENDED_COPY,
        Some(0x00),
        &[
            0x83, 0x1f, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0, 0,
        ],
    ),
    e(op::EXTENDED_COPY, Some(0x10), &TOKEN_OUT_USAGE),
    e(op::EXTENDED_COPY, Some(0x11), &TOKEN_OUT_USAGE),
    e(
        op::RECEIVE_COPY_RESULTS,
        Some(0x00),
        &[
            0x84, 0x1f, 0xff, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0, 0,
        ],
    ),
    e(
        op::RECEIVE_COPY_RESULTS,
        Some(0x03),
        &[
            0x84, 0x1f, 0xff, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0, 0,
        ],
    ),
    e(
        op::RECEIVE_COPY_RESULTS,
        Some(0x07),
        &[
            0x84, 0x1f, 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0, 0,
        ],
    ),
    e(op::WRITE_16, None, cat!(0x8a, 0x1a, RW16)),
    Entry {
        opcode: op::ORWRITE_16,
        service_action: None,
        usage: cat!(0x8b, 0x1a, RW16),
        thin_only: false,
        atomic_only: false,
        local_only: true,
    },
    e(op::WRITE_VERIFY_16, None, cat!(0x8e, 0x12, RW16)),
    e(op::VERIFY_16, None, cat!(0x8f, 0x16, RW16)),
    e(op::PRE_FETCH_16, None, cat!(0x90, 0x02, RW16)),
    e(op::SYNC_CACHE_16, None, cat!(0x91, 0x02, RW16)),
    e(op::WRITE_SAME_16, None, cat!(0x93, 0x09, RW16)),
    // WRITE ATOMIC(16): the ATOMIC BOUNDARY field (bytes 10-11) is examined (it
    // must be zero), so its usage matches WRITE(16)'s transfer length bytes
    Entry {
        opcode: op::WRITE_ATOMIC_16,
        service_action: None,
        usage: cat!(0x9c, 0x18, RW16),
        thin_only: false,
        atomic_only: true,
        local_only: false,
    },
    sanitize(sa::SANITIZE_OVERWRITE, false),
    sanitize(sa::SANITIZE_BLOCK_ERASE, true),
    sanitize(sa::SANITIZE_EXIT_FAILURE_MODE, false),
    e(
        op::SERVICE_ACTION_IN_16,
        Some(sa::READ_CAPACITY_16),
        &[
            0x9e, 0x1f, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0, 0,
        ],
    ),
    e(
        op::SERVICE_ACTION_IN_16,
        Some(sa::GET_LBA_STATUS),
        &[
            0x9e, 0x1f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0,
            0,
        ],
    ),
    e(
        op::REPORT_LUNS,
        None,
        &[0xa0, 0, 0xff, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0, 0],
    ),
    e(
        op::MAINTENANCE_IN,
        Some(sa::REPORT_TARGET_PORT_GROUPS),
        &[0xa3, 0xff, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0, 0],
    ),
    e(
        op::MAINTENANCE_IN,
        Some(sa::REPORT_SUPPORTED_OPCODES),
        &[
            0xa3, 0x1f, 0x87, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0, 0,
        ],
    ),
    e(
        op::MAINTENANCE_IN,
        Some(sa::REPORT_SUPPORTED_TMFS),
        &[0xa3, 0x1f, 0x80, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0, 0],
    ),
    e(
        op::MAINTENANCE_OUT,
        Some(sa::SET_TARGET_PORT_GROUPS),
        &[0xa4, 0x1f, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0, 0],
    ),
    e(op::READ_12, None, cat!(0xa8, 0x1a, RW12)),
    e(op::WRITE_12, None, cat!(0xaa, 0x1a, RW12)),
    e(op::WRITE_VERIFY_12, None, cat!(0xae, 0x12, RW12)),
    e(op::VERIFY_12, None, cat!(0xaf, 0x16, RW12)),
    e(
        op::READ_DEFECT_DATA_12,
        None,
        &[0xb7, 0x1f, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0, 0],
    ),
];

const RW12: [u8; 10] = [0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x1f, 0x00];
/// POPULATE TOKEN and WRITE USING TOKEN: list identifier, parameter list length.
const TOKEN_OUT_USAGE: [u8; 16] = [
    0x83, 0x1f, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0, 0,
];
const PR_OUT_USAGE: [u8; 10] = [0x5f, 0x1f, 0xff, 0, 0, 0xff, 0xff, 0xff, 0xff, 0];

/// Whether `opcode` (with service action `sa` where it has one) is implemented.
#[cfg(test)]
pub(crate) fn is_supported(opcode: u8, service_action: u8, thin: bool) -> bool {
    TABLE.iter().any(|e| {
        e.opcode == opcode
            && (e.service_action.is_none() || e.service_action == Some(service_action))
            && (thin || !e.thin_only)
            && !e.atomic_only
    })
}

fn has_service_actions(opcode: u8) -> bool {
    TABLE
        .iter()
        .any(|e| e.opcode == opcode && e.service_action.is_some())
}

/// The command timeouts descriptor (12 bytes): no nominal time, 60 s recommended.
fn timeouts() -> [u8; 12] {
    let mut t = [0u8; 12];
    t[1] = 0x0a;
    t[8..12].copy_from_slice(&60u32.to_be_bytes());
    t
}

/// REPORT SUPPORTED OPERATION CODES (MAINTENANCE IN / 0x0c).
pub(crate) fn report_supported_opcodes(
    cdb: &Cdb,
    thin: bool,
    atomic: bool,
    local: bool,
) -> CmdResult {
    let rctd = cdb.b(2) & 0x80 != 0;
    let options = cdb.b(2) & 0x07;
    let req_op = cdb.b(3);
    let req_sa = cdb.u16_at(4);
    let alloc_len = cdb.u32_at(6);
    let visible = |e: &&Entry| {
        (thin || !e.thin_only) && (atomic || !e.atomic_only) && (local || !e.local_only)
    };
    if options == 0 {
        let mut d = vec![0u8; 4];
        for e in TABLE.iter().filter(visible) {
            d.push(e.opcode);
            d.push(0);
            d.extend_from_slice(&(e.service_action.unwrap_or(0) as u16).to_be_bytes());
            d.push(0);
            d.push(if rctd { 0x02 } else { 0 } | u8::from(e.service_action.is_some()));
            d.extend_from_slice(&(e.usage.len() as u16).to_be_bytes());
            if rctd {
                d.extend_from_slice(&timeouts());
            }
        }
        let n = (d.len() - 4) as u32;
        d[0..4].copy_from_slice(&n.to_be_bytes());
        return Ok(Done::alloc(d, alloc_len));
    }
    let with_sa = has_service_actions(req_op);
    let found = match options {
        1 if with_sa => return Err(cdb.invalid(2, Some(2)).into()),
        2 if !with_sa => return Err(cdb.invalid(2, Some(2)).into()),
        1..=3 => TABLE
            .iter()
            .filter(visible)
            .find(|e| e.opcode == req_op && (!with_sa || e.service_action == Some(req_sa as u8))),
        _ => return Err(cdb.invalid(2, Some(2)).into()),
    };
    let mut d = vec![0u8; 4];
    match found {
        Some(e) if !with_sa || req_sa <= 0xff => {
            d[1] = 0x03 | if rctd { 0x80 } else { 0 };
            d[2..4].copy_from_slice(&(e.usage.len() as u16).to_be_bytes());
            d.extend_from_slice(e.usage);
            if rctd {
                d.extend_from_slice(&timeouts());
            }
        }
        _ => d[1] = 0x01, // not supported
    }
    Ok(Done::alloc(d, alloc_len))
}

/// REPORT SUPPORTED TASK MANAGEMENT FUNCTIONS (MAINTENANCE IN / 0x0d).
pub(crate) fn report_supported_tmfs(cdb: &Cdb) -> CmdResult {
    let repd = cdb.b(2) & 0x80 != 0;
    let alloc_len = cdb.u32_at(6);
    // ABORT TASK, ABORT TASK SET, CLEAR TASK SET, LOGICAL UNIT RESET, TARGET RESET.
    let mut d = vec![0x80 | 0x40 | 0x10 | 0x08 | 0x02, 0, 0, 0];
    if repd {
        d.resize(16, 0);
        d[3] = 0x0c; // ADDITIONAL DATA LENGTH
    }
    Ok(Done::alloc(d, alloc_len))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_data_matches_cdb_lengths() {
        for e in TABLE {
            assert_eq!(e.usage[0], e.opcode, "opcode {:#x}", e.opcode);
            assert_eq!(
                Some(e.usage.len()),
                crate::cdb::cdb_len_bytes(e.opcode),
                "opcode {:#x}",
                e.opcode
            );
        }
    }

    #[test]
    fn lookups() {
        assert!(is_supported(op::READ_10, 0, false));
        assert!(!is_supported(op::UNMAP, 0, false));
        assert!(is_supported(op::UNMAP, 0, true));
        assert!(is_supported(op::SERVICE_ACTION_IN_16, 0x10, false));
        assert!(!is_supported(op::SERVICE_ACTION_IN_16, 0x11, false));
        assert!(!is_supported(0x04, 0, true));
        assert!(is_supported(op::EXTENDED_COPY, 0x10, false));
        assert!(is_supported(op::EXTENDED_COPY, 0x11, false));
        assert!(is_supported(op::RECEIVE_COPY_RESULTS, 0x07, false));
        assert!(!is_supported(op::RECEIVE_COPY_RESULTS, 0x08, false));
    }
}
