//! Logical block provisioning writes: WRITE SAME(10/16) and UNMAP.
//!
//! WRITE SAME with the UNMAP bit on a thin volume deallocates the range whatever the
//! data block holds (the range then reads as zeroes, LBPRZ=1), as initiators and
//! libiscsi expect; WRITE SAME of a zero block becomes `write_zeroes`; any other
//! block is repeated into one bounded buffer and written chunk by chunk. UNMAP validates every descriptor before touching anything.

use crate::cdb::{op, param_u16, param_u32, param_u64, Cdb};
use crate::inquiry::{Limits, UNMAP_BLOCKS_MAX, UNMAP_DESCRIPTORS_MAX};
use crate::lu::{CmdResult, Done, Fail, LogicalUnit};
use crate::rw::check_range;
use crate::sense::codes;
use block::{Bytes, BytesMut};

/// Largest buffer WRITE SAME builds to repeat a non-zero block.
const WRITE_SAME_CHUNK_BYTES_MAX: usize = 1 << 20;

/// WRITE SAME(10) and WRITE SAME(16).
pub(crate) async fn write_same(lu: &LogicalUnit, cdb: &Cdb, data_out: &Bytes) -> CmdResult {
    let geo = lu.geometry();
    let sixteen = cdb.opcode() == op::WRITE_SAME_16;
    let flags = cdb.b(1);
    let (lba, blocks_field, len_byte) = if sixteen {
        (cdb.u64_at(2), cdb.u32_at(10) as u64, 10u16)
    } else {
        (cdb.u32_at(2) as u64, cdb.u16_at(7) as u64, 7u16)
    };
    let ndob = sixteen && flags & 0x01 != 0;
    let unmap = flags & 0x08 != 0;
    let bs = geo.block_size_bytes;
    let len = if ndob { 0 } else { bs };
    if flags >> 5 != 0 {
        return Err(Fail::Check(cdb.invalid(1, Some(7)), len));
    }
    if flags & 0x10 != 0 {
        // ANCHOR: anchored LBAs are not supported (ANC_SUP = 0).
        return Err(Fail::Check(cdb.invalid(1, Some(4)), len));
    }
    if !sixteen && flags & 0x06 != 0 {
        // PBDATA / LBDATA need protection information or are obsolete.
        return Err(Fail::Check(cdb.invalid(1, Some(2)), len));
    }
    if lba > geo.block_count {
        return Err(Fail::Check(codes::LBA_OUT_OF_RANGE, len));
    }
    // WSNZ = 0: a zero length means "to the end of the medium".
    let blocks = if blocks_field == 0 {
        geo.block_count - lba
    } else {
        blocks_field
    };
    check_range(&geo, lba, blocks).map_err(|s| Fail::Check(s, len))?;
    // MAXIMUM WRITE SAME LENGTH bounds the blocks written, also when a zero field
    // means "to the end of the medium" (as libiscsi's ZeroBlocks tests read SBC).
    if blocks > Limits::of(&geo).write_same_blocks_max {
        return Err(Fail::Check(cdb.invalid(len_byte, None), len));
    }
    lu.check_writable().map_err(|s| Fail::Check(s, len))?;
    if data_out.len() != len as usize {
        return Err(Fail::Check(codes::INVALID_FIELD_IN_CIU, len));
    }
    let done = Done {
        data_in: Bytes::new(),
        transfer_len_bytes: len,
    };
    if blocks == 0 {
        return Ok(done);
    }
    let zero = ndob || (unmap && geo.thin) || data_out.iter().all(|&b| b == 0);
    if zero {
        let may_unmap = unmap && geo.thin;
        lu.change(false, move |v| async move {
            v.write_zeroes(lba, blocks, may_unmap).await
        })
        .await
        .map_err(|e| Fail::Check(lu.io_error(&e), len))?;
        if lu.force_fua() {
            lu.volume
                .flush()
                .await
                .map_err(|e| Fail::Check(lu.io_error(&e), len))?;
        }
        return Ok(done);
    }
    let chunk_blocks = ((WRITE_SAME_CHUNK_BYTES_MAX / bs as usize) as u64)
        .min(Limits::of(&geo).transfer_blocks_max as u64)
        .clamp(1, blocks);
    let mut buf = BytesMut::with_capacity(chunk_blocks as usize * bs as usize);
    for _ in 0..chunk_blocks {
        buf.extend_from_slice(data_out);
    }
    let buf = buf.freeze();
    let fua = lu.force_fua();
    let mut at = 0u64;
    while at < blocks {
        let n = (blocks - at).min(chunk_blocks);
        let chunk = buf.slice(..(n * bs as u64) as usize);
        lu.change(false, move |v| async move {
            v.write(lba + at, chunk, fua).await
        })
        .await
        .map_err(|e| Fail::Check(lu.io_error(&e), len))?;
        at += n;
    }
    Ok(done)
}

/// UNMAP: deallocates every range of the parameter list (thin volumes only).
pub(crate) async fn unmap(lu: &LogicalUnit, cdb: &Cdb, data_out: &Bytes) -> CmdResult {
    let geo = lu.geometry();
    if !geo.thin {
        return Err(codes::INVALID_OPCODE.into());
    }
    if cdb.b(1) & 0x01 != 0 {
        return Err(cdb.invalid(1, Some(0)).into());
    }
    let plist_len = cdb.u16_at(7) as usize;
    if plist_len == 0 {
        return Ok(Done::empty());
    }
    let len = plist_len as u32;
    if plist_len < 8 {
        return Err(Fail::Check(codes::PARAM_LIST_LENGTH_ERROR, len));
    }
    if data_out.len() < plist_len {
        return Err(Fail::Check(codes::INVALID_FIELD_IN_CIU, len));
    }
    lu.check_writable().map_err(|s| Fail::Check(s, len))?;
    let p = &data_out[..plist_len];
    let desc_len = param_u16(p, 2) as usize;
    // A partial trailing descriptor is ignored (SBC-3 5.28.2).
    let usable = desc_len.min(plist_len - 8) / 16;
    if usable as u32 > UNMAP_DESCRIPTORS_MAX {
        return Err(Fail::Check(
            codes::INVALID_FIELD_IN_PARAM.with_field(false, 2, None),
            len,
        ));
    }
    let mut ranges = Vec::with_capacity(usable);
    let mut total_blocks = 0u64;
    for i in 0..usable {
        let off = 8 + 16 * i;
        let lba = param_u64(p, off);
        let blocks = param_u32(p, off + 8) as u64;
        check_range(&geo, lba, blocks).map_err(|s| Fail::Check(s, len))?;
        total_blocks += blocks;
        if total_blocks > UNMAP_BLOCKS_MAX as u64 {
            return Err(Fail::Check(
                codes::INVALID_FIELD_IN_PARAM.with_field(false, (off + 8) as u16, None),
                len,
            ));
        }
        if blocks > 0 {
            ranges.push((lba, blocks));
        }
    }
    for (lba, blocks) in ranges {
        lu.change(false, move |v| async move { v.discard(lba, blocks).await })
            .await
            .map_err(|e| Fail::Check(lu.io_error(&e), len))?;
    }
    if lu.force_fua() {
        lu.volume
            .flush()
            .await
            .map_err(|e| Fail::Check(lu.io_error(&e), len))?;
    }
    Ok(Done {
        data_in: Bytes::new(),
        transfer_len_bytes: len,
    })
}
