//! The read/write family: READ/WRITE(6/10/12/16), WRITE ATOMIC(16), WRITE AND
//! VERIFY, VERIFY, COMPARE AND WRITE, ORWRITE, PRE-FETCH and SYNCHRONIZE CACHE.
//!
//! Hot path: READ hands the volume's `Bytes` straight to Data-In; WRITE slices the
//! Data-Out `Bytes` without copying. Plain writes take the LU's write-ordering lock
//! shared (one uncontended atomic operation); COMPARE AND WRITE and ORWRITE take it
//! exclusive across read-modify-write, so no write can slip in between.

use crate::cdb::{op, Cdb};
use crate::inquiry::{Limits, CAW_BLOCKS_MAX};
use crate::lu::{CmdResult, Done, Fail, LogicalUnit};
use crate::sense::{codes, Sense};
use block::first_difference;
use block::{Bytes, BytesMut, Geometry};

/// LBA, length and flags of a read/write-like CDB.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Rw {
    pub lba: u64,
    pub blocks: u32,
    /// FUA bit.
    pub fua: bool,
    /// RDPROTECT / WRPROTECT / VRPROTECT / ORPROTECT field.
    pub protect: u8,
    /// Byte of the CDB holding the transfer length (for field pointers).
    pub len_byte: u16,
}

/// Decodes LBA / transfer length / flags for the 6, 10, 12 and 16 byte layouts.
pub(crate) fn decode_rw(cdb: &Cdb) -> Rw {
    let flags = cdb.b(1);
    match cdb.len_bytes() {
        6 => {
            let lba = (cdb.u24_at(1) & 0x1f_ffff) as u64;
            let blocks = match cdb.b(4) {
                0 if cdb.opcode() == op::READ_6 || cdb.opcode() == op::WRITE_6 => 256,
                n => n as u32,
            };
            Rw {
                lba,
                blocks,
                fua: false,
                protect: 0,
                len_byte: 4,
            }
        }
        10 => Rw {
            lba: cdb.u32_at(2) as u64,
            blocks: cdb.u16_at(7) as u32,
            fua: flags & 0x08 != 0,
            protect: flags >> 5,
            len_byte: 7,
        },
        12 => Rw {
            lba: cdb.u32_at(2) as u64,
            blocks: cdb.u32_at(6),
            fua: flags & 0x08 != 0,
            protect: flags >> 5,
            len_byte: 6,
        },
        _ => Rw {
            lba: cdb.u64_at(2),
            blocks: cdb.u32_at(10),
            fua: flags & 0x08 != 0,
            protect: flags >> 5,
            len_byte: 10,
        },
    }
}

/// LOGICAL BLOCK ADDRESS OUT OF RANGE unless `[lba, lba + blocks)` fits the volume.
#[inline]
pub(crate) fn check_range(geo: &Geometry, lba: u64, blocks: u64) -> Result<(), Sense> {
    match lba.checked_add(blocks) {
        Some(end) if end <= geo.block_count => Ok(()),
        _ => Err(codes::LBA_OUT_OF_RANGE),
    }
}

/// Bytes in `blocks` blocks, as the u32 the transport compares with its EDTL.
#[inline]
fn bytes_of(geo: &Geometry, blocks: u64) -> u32 {
    u32::try_from(blocks.saturating_mul(geo.block_size_bytes as u64)).unwrap_or(u32::MAX)
}

/// Common checks of a data-moving CDB: no protection information, in range, within
/// the maximum transfer length.
fn check_transfer(cdb: &Cdb, geo: &Geometry, rw: &Rw) -> Result<(), Fail> {
    let len = bytes_of(geo, rw.blocks as u64);
    if rw.protect != 0 {
        return Err(Fail::Check(cdb.invalid(1, Some(7)), len));
    }
    check_range(geo, rw.lba, rw.blocks as u64).map_err(|s| Fail::Check(s, len))?;
    if rw.blocks > Limits::of(geo).transfer_blocks_max {
        return Err(Fail::Check(cdb.invalid(rw.len_byte, None), len));
    }
    Ok(())
}

/// Takes exactly `len` bytes of Data-Out; fewer is INVALID FIELD IN COMMAND
/// INFORMATION UNIT (nothing is written), more is accepted (residual underflow).
fn take_data(data_out: &Bytes, len: u32) -> Result<Bytes, Fail> {
    if data_out.len() < len as usize {
        return Err(Fail::Check(codes::INVALID_FIELD_IN_CIU, len));
    }
    Ok(data_out.slice(..len as usize))
}

/// The whole blocks of Data-Out a write may use: at most what the CDB asks for. When
/// the initiator sent less (Expected Data Transfer Length below the CDB's length,
/// a residual overflow), the blocks that did arrive are written and the transport
/// reports the overflow, as initiators and libiscsi's residual tests expect.
fn take_blocks(data_out: &Bytes, len: u32, block_size: u32) -> Bytes {
    let avail = data_out.len().min(len as usize);
    let whole = avail - avail % block_size as usize;
    data_out.slice(..whole)
}

/// READ(6/10/12/16), reading no more whole blocks than cover `want` bytes
/// (what the initiator can take: its Expected Data Transfer Length).
///
/// A CDB asking for more is a residual overflow: the transport sends `want`
/// bytes and reports the rest as not transferred. The blocks past `want`
/// were read only to be dropped, and a client could make the node hold the
/// CDB's length (up to the largest transfer) for every read of its window
/// while the buffer budget counted what it takes (review of 2026-12-07).
/// Only what is read can fail: a medium error past `want` is not reported.
pub(crate) async fn read(lu: &LogicalUnit, cdb: &Cdb, want: u32) -> CmdResult {
    let geo = lu.geometry();
    let rw = decode_rw(cdb);
    check_transfer(cdb, &geo, &rw)?;
    if rw.blocks == 0 {
        return Ok(Done::empty());
    }
    let len = bytes_of(&geo, rw.blocks as u64);
    let blocks = rw.blocks.min(want.div_ceil(geo.block_size_bytes));
    if blocks == 0 {
        return Ok(Done {
            data_in: Bytes::new(),
            transfer_len_bytes: len,
        });
    }
    match lu.volume.read(rw.lba, blocks).await {
        Ok(data) => Ok(Done {
            data_in: data,
            transfer_len_bytes: len,
        }),
        Err(e) => Err(Fail::Check(lu.io_error(&e), len)),
    }
}

/// WRITE(6/10/12/16).
pub(crate) async fn write(lu: &LogicalUnit, cdb: &Cdb, data_out: &Bytes) -> CmdResult {
    let geo = lu.geometry();
    let rw = decode_rw(cdb);
    check_transfer(cdb, &geo, &rw)?;
    let len = bytes_of(&geo, rw.blocks as u64);
    lu.check_writable().map_err(|s| Fail::Check(s, len))?;
    let data = take_blocks(data_out, len, geo.block_size_bytes);
    if data.is_empty() {
        return Ok(Done {
            data_in: Bytes::new(),
            transfer_len_bytes: len,
        });
    }
    let fua = rw.fua || lu.force_fua();
    let lba = rw.lba;
    lu.change(false, move |v| async move { v.write(lba, data, fua).await })
        .await
        .map_err(|e| Fail::Check(lu.io_error(&e), len))?;
    Ok(Done {
        data_in: Bytes::new(),
        transfer_len_bytes: len,
    })
}

/// WRITE ATOMIC(16) (SBC-4): all of the data lands or none of it, across a crash,
/// and no command running beside it sees part of it: the volume's
/// [`block::Volume::write_atomic`] does that (`block::AtomicWrites`). An LU whose
/// volume has no atomic writes (one replicated to a partner node) does not know the
/// command, and says so in REPORT SUPPORTED OPERATION CODES and the Block Limits
/// page. No atomic boundaries: a nonzero ATOMIC BOUNDARY is refused. The data is
/// durable when the command completes, FUA or not.
pub(crate) async fn write_atomic(lu: &LogicalUnit, cdb: &Cdb, data_out: &Bytes) -> CmdResult {
    let atomic = lu.volume.atomic_write_max_blocks();
    if atomic == 0 {
        return Err(codes::INVALID_OPCODE.into());
    }
    let geo = lu.geometry();
    let lba = cdb.u64_at(2);
    let blocks = cdb.u16_at(12) as u32;
    let len = bytes_of(&geo, blocks as u64);
    if cdb.b(1) >> 5 != 0 {
        return Err(Fail::Check(cdb.invalid(1, Some(7)), len));
    }
    if cdb.u16_at(10) != 0 {
        return Err(Fail::Check(cdb.invalid(10, None), len));
    }
    check_range(&geo, lba, blocks as u64).map_err(|s| Fail::Check(s, len))?;
    if blocks > crate::inquiry::atomic_write_blocks_max(&geo, atomic) {
        return Err(Fail::Check(cdb.invalid(12, None), len));
    }
    lu.check_writable().map_err(|s| Fail::Check(s, len))?;
    if blocks == 0 {
        return Ok(Done::empty());
    }
    // all of it or nothing: a short Data-Out is refused, not written in part
    let data = take_data(data_out, len)?;
    lu.change(
        false,
        move |v| async move { v.write_atomic(lba, data).await },
    )
    .await
    .map_err(|e| Fail::Check(lu.io_error(&e), len))?;
    Ok(Done {
        data_in: Bytes::new(),
        transfer_len_bytes: len,
    })
}

/// Compares `expected` with what the medium holds from `lba`, reading in chunks of at
/// most the maximum transfer length. MISCOMPARE carries the byte offset into
/// `expected` of the first difference.
async fn compare_medium(lu: &LogicalUnit, lba: u64, expected: &[u8]) -> Result<(), Sense> {
    let geo = lu.geometry();
    let bs = geo.block_size_bytes as usize;
    let chunk_blocks = Limits::of(&geo).transfer_blocks_max as usize;
    let mut off = 0usize;
    while off < expected.len() {
        let n_blocks = ((expected.len() - off) / bs).clamp(1, chunk_blocks);
        let got = lu
            .volume
            .read(lba + (off / bs) as u64, n_blocks as u32)
            .await
            .map_err(|e| lu.io_error(&e))?;
        let want = &expected[off..(off + got.len()).min(expected.len())];
        if let Some(i) = first_difference(want, &got) {
            return Err(codes::MISCOMPARE_DURING_VERIFY.with_information((off + i) as u64));
        }
        off += got.len();
    }
    Ok(())
}

/// VERIFY(10/12/16): BYTCHK 0 checks the medium is readable, 1 compares the
/// Data-Out blocks, 3 compares one Data-Out block against every block.
pub(crate) async fn verify(lu: &LogicalUnit, cdb: &Cdb, data_out: &Bytes) -> CmdResult {
    let geo = lu.geometry();
    let rw = decode_rw(cdb);
    let bytchk = (cdb.b(1) >> 1) & 0x03;
    let len = match bytchk {
        0 => 0,
        1 => bytes_of(&geo, rw.blocks as u64),
        3 => geo.block_size_bytes,
        _ => return Err(cdb.invalid(1, Some(2)).into()),
    };
    if rw.protect != 0 {
        return Err(Fail::Check(cdb.invalid(1, Some(7)), len));
    }
    check_range(&geo, rw.lba, rw.blocks as u64).map_err(|s| Fail::Check(s, len))?;
    if bytchk != 0 && rw.blocks > Limits::of(&geo).transfer_blocks_max {
        return Err(Fail::Check(cdb.invalid(rw.len_byte, None), len));
    }
    if rw.blocks == 0 {
        return Ok(Done::empty());
    }
    let done = Done {
        data_in: Bytes::new(),
        transfer_len_bytes: len,
    };
    match bytchk {
        0 => {
            let chunk = Limits::of(&geo).transfer_blocks_max as u64;
            let mut at = 0u64;
            while at < rw.blocks as u64 {
                let n = (rw.blocks as u64 - at).min(chunk) as u32;
                lu.volume
                    .read(rw.lba + at, n)
                    .await
                    .map_err(|e| lu.io_error(&e))?;
                at += n as u64;
            }
        }
        1 => {
            let data = take_data(data_out, len)?;
            compare_medium(lu, rw.lba, &data)
                .await
                .map_err(|s| Fail::Check(s, len))?;
        }
        _ => {
            let block = take_data(data_out, len)?;
            let bs = geo.block_size_bytes as usize;
            for i in 0..rw.blocks as u64 {
                let got = lu
                    .volume
                    .read(rw.lba + i, 1)
                    .await
                    .map_err(|e| Fail::Check(lu.io_error(&e), len))?;
                if let Some(d) = first_difference(&block, &got) {
                    let s = codes::MISCOMPARE_DURING_VERIFY.with_information(d.min(bs) as u64);
                    return Err(Fail::Check(s, len));
                }
            }
        }
    }
    Ok(done)
}

/// WRITE AND VERIFY(10/12/16): writes, then reads back and compares.
pub(crate) async fn write_verify(lu: &LogicalUnit, cdb: &Cdb, data_out: &Bytes) -> CmdResult {
    let geo = lu.geometry();
    let mut rw = decode_rw(cdb);
    rw.fua = false;
    check_transfer(cdb, &geo, &rw)?;
    let len = bytes_of(&geo, rw.blocks as u64);
    lu.check_writable().map_err(|s| Fail::Check(s, len))?;
    let data = take_blocks(data_out, len, geo.block_size_bytes);
    if data.is_empty() {
        return Ok(Done {
            data_in: Bytes::new(),
            transfer_len_bytes: len,
        });
    }
    let (lba, written, fua) = (rw.lba, data.clone(), lu.force_fua());
    lu.change(
        false,
        move |v| async move { v.write(lba, written, fua).await },
    )
    .await
    .map_err(|e| Fail::Check(lu.io_error(&e), len))?;
    compare_medium(lu, rw.lba, &data)
        .await
        .map_err(|s| Fail::Check(s, len))?;
    Ok(Done {
        data_in: Bytes::new(),
        transfer_len_bytes: len,
    })
}

/// COMPARE AND WRITE: atomically compares the first half of Data-Out with the medium
/// and, if equal, writes the second half.
pub(crate) async fn compare_and_write(lu: &LogicalUnit, cdb: &Cdb, data_out: &Bytes) -> CmdResult {
    let geo = lu.geometry();
    let lba = cdb.u64_at(2);
    let blocks = cdb.b(13) as u32;
    let len = bytes_of(&geo, 2 * blocks as u64);
    if cdb.b(1) >> 5 != 0 {
        return Err(Fail::Check(cdb.invalid(1, Some(7)), len));
    }
    check_range(&geo, lba, blocks as u64).map_err(|s| Fail::Check(s, len))?;
    if blocks > CAW_BLOCKS_MAX || blocks > Limits::of(&geo).transfer_blocks_max {
        return Err(Fail::Check(cdb.invalid(13, None), len));
    }
    if blocks == 0 {
        // NLB 0 is a no-op, but Data-Out with it means the initiator's length and the
        // CDB disagree (e.g. 256 blocks wrapped into the one-byte field).
        if !data_out.is_empty() {
            return Err(Fail::Check(cdb.invalid(13, None), len));
        }
        return Ok(Done::empty());
    }
    lu.check_writable().map_err(|s| Fail::Check(s, len))?;
    if data_out.len() != len as usize {
        return Err(Fail::Check(codes::INVALID_FIELD_IN_CIU, len));
    }
    let half = len as usize / 2;
    let fua = cdb.b(1) & 0x08 != 0 || lu.force_fua();
    let (compare, data) = (data_out.slice(..half), data_out.slice(half..));
    let outcome = lu
        .change(true, move |v| async move {
            v.compare_and_write(lba, compare, data, fua).await
        })
        .await
        .map_err(|e| Fail::Check(lu.io_error(&e), len))?;
    if let Some(i) = outcome {
        let s = codes::MISCOMPARE_DURING_VERIFY.with_information(i as u64);
        return Err(Fail::Check(s, len));
    }
    Ok(Done {
        data_in: Bytes::new(),
        transfer_len_bytes: len,
    })
}

/// ORWRITE(16): atomically ORs Data-Out into the blocks on the medium. Not on
/// an LU replicated to an HA partner (INVALID OPERATION CODE, and not reported
/// supported): the read and the write are ordered against this node's writes
/// only, so a write through the partner landing between them would be lost.
pub(crate) async fn orwrite(lu: &LogicalUnit, cdb: &Cdb, data_out: &Bytes) -> CmdResult {
    if !crate::target::sanitize_offered(lu) {
        return Err(codes::INVALID_OPCODE.into());
    }
    let geo = lu.geometry();
    let rw = decode_rw(cdb);
    check_transfer(cdb, &geo, &rw)?;
    let len = bytes_of(&geo, rw.blocks as u64);
    lu.check_writable().map_err(|s| Fail::Check(s, len))?;
    let data = take_data(data_out, len)?;
    if rw.blocks == 0 {
        return Ok(Done::empty());
    }
    let fua = rw.fua || lu.force_fua();
    let (lba, blocks) = (rw.lba, rw.blocks);
    lu.change(true, move |v| async move {
        let current = v.read(lba, blocks).await?;
        let mut merged = BytesMut::from(&current[..]);
        merged
            .iter_mut()
            .zip(data.iter())
            .for_each(|(m, d)| *m |= d);
        v.write(lba, merged.freeze(), fua).await
    })
    .await
    .map_err(|e| Fail::Check(lu.io_error(&e), len))?;
    Ok(Done {
        data_in: Bytes::new(),
        transfer_len_bytes: len,
    })
}

/// PRE-FETCH(10/16): range check only (the volume has its own caching).
pub(crate) async fn prefetch(lu: &LogicalUnit, cdb: &Cdb) -> CmdResult {
    let geo = lu.geometry();
    let (lba, blocks) = if cdb.opcode() == op::PRE_FETCH_10 {
        (cdb.u32_at(2) as u64, cdb.u16_at(7) as u64)
    } else {
        (cdb.u64_at(2), cdb.u32_at(10) as u64)
    };
    check_range(&geo, lba, blocks)?;
    Ok(Done::empty())
}

/// SYNCHRONIZE CACHE(10/16): range check, then flush the volume (even with IMMED,
/// the answer waits for the flush: durability is never faked).
pub(crate) async fn sync_cache(lu: &LogicalUnit, cdb: &Cdb) -> CmdResult {
    let geo = lu.geometry();
    let (lba, blocks) = if cdb.opcode() == op::SYNC_CACHE_10 {
        (cdb.u32_at(2) as u64, cdb.u16_at(7) as u64)
    } else {
        (cdb.u64_at(2), cdb.u32_at(10) as u64)
    };
    check_range(&geo, lba, blocks)?;
    lu.volume.flush().await.map_err(|e| lu.io_error(&e))?;
    Ok(Done::empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decode_layouts() {
        let c = Cdb::parse(&[0x08, 0x1f, 0xff, 0xff, 0, 0]).unwrap();
        let r = decode_rw(&c);
        assert_eq!((r.lba, r.blocks), (0x1f_ffff, 256));
        let c = Cdb::parse(&[0x2a, 0x08, 0, 0, 1, 0, 0, 0, 4, 0]).unwrap();
        let r = decode_rw(&c);
        assert_eq!((r.lba, r.blocks, r.fua), (256, 4, true));
        let c = Cdb::parse(&[0xa8, 0x20, 0, 0, 0, 1, 0, 0, 0, 9, 0, 0]).unwrap();
        let r = decode_rw(&c);
        assert_eq!((r.lba, r.blocks, r.protect), (1, 9, 1));
        let mut c16 = [0u8; 16];
        c16[0] = 0x88;
        c16[2..10].copy_from_slice(&u64::MAX.to_be_bytes());
        c16[13] = 1;
        let r = decode_rw(&Cdb::parse(&c16).unwrap());
        assert_eq!((r.lba, r.blocks), (u64::MAX, 1));
    }

    #[test]
    fn range_checks_do_not_overflow() {
        let g = Geometry {
            block_size_bytes: 512,
            block_count: 100,
            thin: true,
            volatile_cache: false,
            optimal_io_blocks: 1,
            max_io_blocks: 64,
        };
        assert!(check_range(&g, 100, 0).is_ok());
        assert!(check_range(&g, 101, 0).is_err());
        assert!(check_range(&g, u64::MAX, 2).is_err());
        assert!(check_range(&g, 99, 1).is_ok());
        assert_eq!(bytes_of(&g, u64::MAX), u32::MAX);
    }
}
