//! Unit management commands: REQUEST SENSE, REPORT LUNS, START STOP UNIT, PREVENT
//! ALLOW MEDIUM REMOVAL, and the routing of RESERVE/RELEASE and PERSISTENT RESERVE
//! IN/OUT to [`crate::pr`].

use crate::cdb::{op, Cdb};
use crate::lu::{CmdResult, Done, Fail, LogicalUnit};
use crate::pr::PrError;
use crate::sense::codes;
use crate::ua::key_of;
use crate::{ItNexus, TargetPort};
use block::Bytes;
use std::sync::atomic::Ordering;

/// REQUEST SENSE: the oldest unit attention (consumed), the NOT READY condition of
/// a stopped unit, or NO SENSE; LOGICAL UNIT NOT SUPPORTED for a missing LUN.
pub(crate) fn request_sense(lu: Option<&LogicalUnit>, nexus: &ItNexus, cdb: &Cdb) -> CmdResult {
    let desc = cdb.b(1) & 0x01 != 0;
    let alloc_len = cdb.b(4) as u32;
    let sense = match lu {
        None => codes::LUN_NOT_SUPPORTED,
        Some(lu) => match lu.uas.pop(nexus) {
            Some(ua) => ua,
            None => match lu.sanitize.sense() {
                Some(s) => s,
                None if lu.stopped.load(Ordering::Relaxed) => codes::NOT_READY_INIT_REQUIRED,
                None => codes::NO_SENSE,
            },
        },
    };
    Ok(Done::alloc(sense.encode(desc).to_vec(), alloc_len))
}

/// Encodes a LUN number in the 8-byte SAM LUN format (peripheral or flat addressing).
pub fn encode_lun(lun: u64) -> [u8; 8] {
    let mut b = [0u8; 8];
    if lun < 256 {
        b[1] = lun as u8;
    } else {
        let l = (lun & 0x3fff) as u16;
        b[0] = 0x40 | (l >> 8) as u8;
        b[1] = l as u8;
    }
    b
}

/// REPORT LUNS.
pub(crate) fn report_luns(luns: &[u64], cdb: &Cdb) -> CmdResult {
    let select = cdb.b(2);
    let alloc_len = cdb.u32_at(6);
    if alloc_len < 16 {
        return Err(cdb.invalid(6, None).into());
    }
    let list: &[u64] = match select {
        0x00 | 0x02 => luns,
        0x01 => &[], // no well-known logical units
        _ => return Err(cdb.invalid(2, None).into()),
    };
    let mut d = Vec::with_capacity(8 + 8 * list.len());
    d.extend_from_slice(&((8 * list.len()) as u32).to_be_bytes());
    d.extend_from_slice(&[0; 4]);
    for &l in list {
        d.extend_from_slice(&encode_lun(l));
    }
    Ok(Done::alloc(d, alloc_len))
}

/// START STOP UNIT. The medium is not removable: LOEJ only matters for the
/// MEDIUM REMOVAL PREVENTED check; a stopped unit answers NOT READY to media access.
pub(crate) async fn start_stop_unit(lu: &LogicalUnit, cdb: &Cdb) -> CmdResult {
    let power_condition = cdb.b(4) >> 4;
    let no_flush = cdb.b(4) & 0x04 != 0;
    let loej = cdb.b(4) & 0x02 != 0;
    let start = cdb.b(4) & 0x01 != 0;
    if power_condition != 0 {
        return Ok(Done::empty());
    }
    if loej && !lu.media.lock().prevent.is_empty() {
        return Err(codes::MEDIUM_REMOVAL_PREVENTED.into());
    }
    if !start && !no_flush {
        lu.volume.flush().await.map_err(|e| lu.io_error(&e))?;
    }
    lu.stopped.store(!start, Ordering::Relaxed);
    Ok(Done::empty())
}

/// PREVENT ALLOW MEDIUM REMOVAL, tracked per I_T nexus.
/// READ DEFECT DATA(10)/(12): a virtual disk has no defects; both lists are valid
/// and empty, in the format asked for (smartctl reads the grown list this way).
pub(crate) fn read_defect_data(cdb: &Cdb) -> CmdResult {
    let twelve = cdb.opcode() == op::READ_DEFECT_DATA_12;
    let (flags, alloc_len) = if twelve {
        (cdb.b(1), cdb.u32_at(6))
    } else {
        (cdb.b(2), cdb.u16_at(7) as u32)
    };
    // REQ_PLIST, REQ_GLIST -> PLISTV, GLISTV; DEFECT LIST FORMAT echoed.
    let valid = flags & 0x1f;
    let data = if twelve {
        vec![0, valid, 0, 0, 0, 0, 0, 0]
    } else {
        vec![0, valid, 0, 0]
    };
    Ok(Done::alloc(data, alloc_len))
}

pub(crate) fn prevent_allow(lu: &LogicalUnit, nexus: &ItNexus, cdb: &Cdb) -> CmdResult {
    let prevent = cdb.b(4) & 0x03;
    let mut media = lu.media.lock();
    match prevent {
        0 => {
            media.prevent.remove(&key_of(nexus));
        }
        1 => {
            media.prevent.insert(key_of(nexus));
        }
        _ => return Err(cdb.invalid(4, Some(1)).into()),
    }
    Ok(Done::empty())
}

fn pr_fail(e: PrError) -> Fail {
    match e {
        PrError::Conflict => Fail::Conflict,
        PrError::Check(s) => Fail::Check(s, 0),
    }
}

/// RESERVE(6/10) and RELEASE(6/10).
pub(crate) fn reserve_release(lu: &LogicalUnit, nexus: &ItNexus, cdb: &Cdb) -> CmdResult {
    let reserve = reserves(cdb)?;
    lu.pr.reserve_or_release(nexus, reserve).map_err(pr_fail)?;
    Ok(Done::empty())
}

/// [`reserve_release`] on an LU an HA partner shares: the whole reservation state
/// for the partner (see [`crate::replication`], which orders these calls).
pub(crate) fn reserve_release_replicated(
    lu: &LogicalUnit,
    nexus: &ItNexus,
    cdb: &Cdb,
) -> Result<Bytes, Fail> {
    reserve_release(lu, nexus, cdb)?;
    Ok(lu.pr.state())
}

/// Whether `cdb` (RESERVE or RELEASE, 6 or 10) reserves; third-party
/// reservations are refused.
fn reserves(cdb: &Cdb) -> Result<bool, Fail> {
    let ten = matches!(cdb.opcode(), op::RESERVE_10 | op::RELEASE_10);
    if ten && cdb.b(1) & 0x12 != 0 {
        // third-party reservations are not supported
        return Err(cdb.invalid(1, Some(4)).into());
    }
    Ok(matches!(cdb.opcode(), op::RESERVE_6 | op::RESERVE_10))
}

/// PERSISTENT RESERVE IN.
pub(crate) fn pr_in(lu: &LogicalUnit, nexus: &ItNexus, cdb: &Cdb) -> CmdResult {
    let alloc_len = cdb.u16_at(7) as u32;
    let data = lu
        .pr
        .persistent_reserve_in(nexus, cdb.as_slice())
        .map_err(pr_fail)?;
    let n = data.len().min(alloc_len as usize);
    Ok(Done {
        transfer_len_bytes: n as u32,
        data_in: data.slice(..n),
    })
}

/// PERSISTENT RESERVE OUT; the unit attentions it establishes are queued here. With
/// `want_state`, also returns the new state for the HA partner when the command changed
/// it (see [`crate::replication`], which orders these calls).
pub(crate) fn pr_out(
    lu: &LogicalUnit,
    nexus: &ItNexus,
    cdb: &Cdb,
    data_out: &Bytes,
    ports: &[TargetPort],
    want_state: bool,
) -> Result<(Done, Option<Bytes>, Vec<crate::pr::NexusId>), Fail> {
    let plist_len = cdb.u32_at(5);
    if data_out.len() < plist_len as usize {
        return Err(Fail::Check(codes::INVALID_FIELD_IN_CIU, plist_len));
    }
    let params = &data_out[..plist_len as usize];
    let (out, state) = if want_state {
        lu.pr
            .persistent_reserve_out_replicated(nexus, cdb.as_slice(), params, ports)
    } else {
        lu.pr
            .persistent_reserve_out_detailed(nexus, cdb.as_slice(), params, ports)
            .map(|out| (out, None))
    }
    .map_err(|e| pr_fail(e).with_len(plist_len))?;
    for ua in &out.unit_attentions {
        lu.uas
            .raise_for(&ua.initiator_port, ua.relative_port_id, ua.sense);
    }
    let done = Done {
        data_in: Bytes::new(),
        transfer_len_bytes: plist_len,
    };
    Ok((done, state, out.abort_tasks_of))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lun_encoding() {
        assert_eq!(encode_lun(0), [0; 8]);
        assert_eq!(encode_lun(5)[..2], [0, 5]);
        assert_eq!(encode_lun(300)[..2], [0x41, 0x2c]);
    }
}
