//! A journal device: an SSD (or any fast volume) that holds the stripe journal's
//! ring instead of the members, as md's write journal does. A record is then
//! written once, with FUA, to the device, and the members never seek to a ring:
//! a small write costs its read-modify-write and nothing more on the disks.
//!
//! Layout of the device: a header block at byte 0 (`FSRJDEV1`, the pool uuid and
//! the device's own uuid, crc32c), the ring from byte `HEADER_BYTES` on, as large
//! as the members' rings (`journal_blocks`). The members' superblocks name the
//! device's uuid, so `assemble` refuses to run without it (its records would not
//! be replayed) unless forced, and refuses a device of another pool.
//!
//! What it does not do: mirror the device. A lone device that dies takes the
//! records not yet checkpointed with it; the pool then checkpoints at once (every
//! member flushed, so every acknowledged write is on the members) and journals on
//! the members again. A crash together with the loss of the device before that
//! checkpoint loses what the members' volatile caches held (md's journal has the
//! same limit; its answer is a mirrored journal device).

use crate::pool::MemberHandle;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

/// Bytes before the ring on a journal device.
pub(crate) const HEADER_BYTES: u64 = 64 * 1024;
const MAGIC: &[u8; 8] = b"FSRJDEV1";

/// The journal device of a pool.
pub(crate) struct JournalDev {
    pub h: Arc<MemberHandle>,
    /// Device lba of ring block 0.
    pub ring_offset_blocks: u64,
    /// Set after a write error: records go to the members from then on.
    pub failed: AtomicBool,
}

/// The header block: magic, then `pool_uuid` and `device_uuid` (32 hex digits
/// each), then crc32c of what precedes it.
pub(crate) fn header(pool_uuid: &str, device_uuid: &str, bs: usize) -> Vec<u8> {
    let mut b = vec![0u8; bs.max(128)];
    b[0..8].copy_from_slice(MAGIC);
    let p = pool_uuid.as_bytes();
    let d = device_uuid.as_bytes();
    b[8..8 + p.len().min(40)].copy_from_slice(&p[..p.len().min(40)]);
    b[48..48 + d.len().min(40)].copy_from_slice(&d[..d.len().min(40)]);
    let crc = crc32c::crc32c(&b[..88]);
    b[88..92].copy_from_slice(&crc.to_le_bytes());
    b.truncate(bs.max(128));
    b
}

/// (pool uuid, device uuid) of a header block, `None` when it is not one.
pub(crate) fn parse_header(b: &[u8]) -> Option<(String, String)> {
    if b.len() < 92 || &b[0..8] != MAGIC {
        return None;
    }
    let crc = u32::from_le_bytes(b[88..92].try_into().ok()?);
    if crc != crc32c::crc32c(&b[..88]) {
        return None;
    }
    let text = |r: &[u8]| -> Option<String> {
        let end = r.iter().position(|&c| c == 0).unwrap_or(r.len());
        String::from_utf8(r[..end].to_vec()).ok()
    };
    Some((text(&b[8..48])?, text(&b[48..88])?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_roundtrip_and_corruption() {
        let h = header("0123456789abcdef0123456789abcdef", "fedcba", 512);
        assert_eq!(h.len(), 512);
        assert_eq!(
            parse_header(&h),
            Some((
                "0123456789abcdef0123456789abcdef".to_string(),
                "fedcba".to_string()
            ))
        );
        let mut bad = h.clone();
        bad[20] ^= 1;
        assert_eq!(parse_header(&bad), None);
        assert_eq!(parse_header(&h[..50]), None);
    }
}
