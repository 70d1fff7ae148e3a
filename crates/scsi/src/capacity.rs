//! READ CAPACITY(10), READ CAPACITY(16) and GET LBA STATUS.

use crate::cdb::Cdb;
use crate::lu::{CmdResult, Done, LogicalUnit};
use crate::sense::codes;
use block::ExtentState;

/// Most blocks one GET LBA STATUS asks the volume about.
const LBA_STATUS_BLOCKS_MAX: u64 = 1 << 24;
/// Most descriptors one GET LBA STATUS returns.
const LBA_STATUS_DESCRIPTORS_MAX: usize = 1024;

/// READ CAPACITY(10): last LBA (0xffffffff when it does not fit) and block length.
pub(crate) fn read_capacity_10(lu: &LogicalUnit, cdb: &Cdb) -> CmdResult {
    let pmi = cdb.b(8) & 0x01 != 0;
    if !pmi && cdb.u32_at(2) != 0 {
        return Err(cdb.invalid(2, None).into());
    }
    let geo = lu.geometry();
    let last = geo.block_count.saturating_sub(1);
    let last32 = u32::try_from(last).unwrap_or(u32::MAX);
    let mut d = Vec::with_capacity(8);
    d.extend_from_slice(&last32.to_be_bytes());
    d.extend_from_slice(&geo.block_size_bytes.to_be_bytes());
    Ok(Done::alloc(d, 8))
}

/// READ CAPACITY(16): adds provisioning (LBPME/LBPRZ) and physical block layout.
pub(crate) fn read_capacity_16(lu: &LogicalUnit, cdb: &Cdb) -> CmdResult {
    let alloc_len = cdb.u32_at(10);
    let geo = lu.geometry();
    let mut d = vec![0u8; 32];
    d[0..8].copy_from_slice(&geo.block_count.saturating_sub(1).to_be_bytes());
    d[8..12].copy_from_slice(&geo.block_size_bytes.to_be_bytes());
    // byte 13: LOGICAL BLOCKS PER PHYSICAL BLOCK EXPONENT
    d[13] = lu.config.physical_block_exponent & 0x0f;
    if geo.thin {
        d[14] = 0x80 | 0x40; // LBPME, LBPRZ; LOWEST ALIGNED LBA = 0
    }
    Ok(Done::alloc(d, alloc_len))
}

/// GET LBA STATUS: mapped / deallocated descriptors from the volume's block status.
pub(crate) async fn get_lba_status(lu: &LogicalUnit, cdb: &Cdb) -> CmdResult {
    let lba = cdb.u64_at(2);
    let alloc_len = cdb.u32_at(10);
    let geo = lu.geometry();
    if lba >= geo.block_count {
        return Err(codes::LBA_OUT_OF_RANGE.into());
    }
    let want = (geo.block_count - lba).min(LBA_STATUS_BLOCKS_MAX);
    let extents = lu
        .volume
        .block_status(lba, want)
        .await
        .map_err(|e| lu.io_error(&e))?;
    let room = ((alloc_len as usize).saturating_sub(8) / 16).clamp(1, LBA_STATUS_DESCRIPTORS_MAX);
    let mut d = vec![0u8; 8];
    for e in extents.iter().filter(|e| e.blocks > 0).take(room) {
        d.extend_from_slice(&e.lba.to_be_bytes());
        let n = u32::try_from(e.blocks).unwrap_or(u32::MAX);
        d.extend_from_slice(&n.to_be_bytes());
        d.push(match e.state {
            ExtentState::Mapped => 0,
            ExtentState::Deallocated => 1,
        });
        d.extend_from_slice(&[0, 0, 0]);
    }
    let param_len = (d.len() - 4) as u32;
    d[0..4].copy_from_slice(&param_len.to_be_bytes());
    Ok(Done::alloc(d, alloc_len))
}
