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
//! A mirrored pair: with two devices every group commit is written to both at
//! once (same ring offsets, same bytes) and a record counts as durable when a
//! device holds it; the superblocks name both (`journal_device_uuid`,
//! `journal_device_mirror_uuid`). A device that fails a write is marked failed
//! and the pool checkpoints every record before the batch and writes
//! superblocks that name only its twin before the batch is acknowledged, so
//! from then on the twin holds every record a replay needs; assemble takes
//! either device alone (a device of the pool the superblocks no longer name is
//! left out). Key invariant: while both serve, each holds every record not
//! covered by a checkpoint, so a crash together with the loss of either device
//! (and up to `redundancy` members) loses nothing acknowledged.
//!
//! A replacement: when the superblocks name fewer than two devices and a blank
//! device (its first block all zeroes, as a new or wiped SSD reads) is given at
//! assemble, it joins as the twin once the journal has been replayed and
//! checkpointed: its ring is zeroed, the superblocks name both, then its header
//! is written. No record is copied: the checkpoint leaves none that a replay
//! would need, and every record after it goes to both. A device this pool
//! dropped after a failure is not taken back on its own (it is left out until
//! wiped), nor is anything else that is not blank.
//!
//! What it does not do: take a replacement while the pool runs (the next
//! assemble does), or survive both devices. When the
//! last device dies the pool checkpoints at once (every member flushed, so every
//! acknowledged write is on the members) and journals on the members again. A
//! crash together with the loss of the last device before that checkpoint loses
//! what the members' volatile caches held (md's journal has the same limit).

use crate::pool::{Inner, MemberHandle};
use crate::util::new_uuid;
use crate::{Member, RaidError, RaidResult};
use block::Bytes;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

/// Bytes before the ring on a journal device.
pub(crate) const HEADER_BYTES: u64 = 64 * 1024;

/// Bytes a journal device has for the ring, past its header.
pub(crate) fn ring_room_bytes(dev: &Member) -> u64 {
    let g = dev.volume.geometry();
    (g.block_count * g.block_size_bytes as u64).saturating_sub(HEADER_BYTES)
}
const MAGIC: &[u8; 8] = b"FSRJDEV1";
/// Most journal devices of a pool: one, or a mirrored pair.
pub const JOURNAL_DEVICES_MAX: usize = 2;

/// A journal device of a pool.
pub(crate) struct JournalDev {
    pub h: Arc<MemberHandle>,
    /// Device lba of ring block 0.
    pub ring_offset_blocks: u64,
    /// Set after a write error: records go to its twin, or to the members when
    /// it was the last, from then on.
    pub failed: AtomicBool,
}

/// Writes a header naming the pool to each of `devs` and attaches them to a new
/// pool (`Pool::create_with_journal_devices`).
pub(crate) async fn attach_new(
    inner: &mut Inner,
    devs: Vec<Member>,
    bs: u64,
    journal_blocks: u64,
) -> RaidResult<()> {
    if devs.is_empty() {
        return Ok(());
    }
    if inner.journal.is_none() {
        return Err(RaidError::Config(
            "a journal device needs a parity level with the journal on".into(),
        ));
    }
    if devs.len() > JOURNAL_DEVICES_MAX {
        return Err(RaidError::Config(format!(
            "at most {JOURNAL_DEVICES_MAX} journal devices (a mirrored pair), {} given",
            devs.len()
        )));
    }
    for dev in devs {
        let uuid = new_uuid();
        let h = MemberHandle::new(dev, uuid.clone());
        let g = h.volume.geometry();
        if g.block_size_bytes as u64 != bs || g.block_count < HEADER_BYTES / bs + journal_blocks {
            return Err(RaidError::Config(format!(
                "journal device {} must have {bs}-byte blocks and hold {} bytes",
                h.name,
                HEADER_BYTES + journal_blocks * bs
            )));
        }
        let hdr = header(&inner.uuid, &uuid, bs as usize);
        h.volume
            .write(0, Bytes::from(hdr), true)
            .await
            .map_err(|e| RaidError::Member {
                member: h.name.clone(),
                source: e,
            })?;
        inner.journal_devs.push(JournalDev {
            h,
            ring_offset_blocks: HEADER_BYTES / bs,
            failed: AtomicBool::new(false),
        });
    }
    Ok(())
}

/// Attaches the given devices of an assembled pool whose superblocks name
/// `named` (none, one, or a mirrored pair): every named device found is
/// attached; one of a pair may be missing (its twin holds every record); all
/// missing is refused unless `force`. A device of another pool is refused, one
/// of this pool the superblocks no longer name (failed earlier) is left out.
/// Returns the blank devices given (first block all zeroes): [`adopt`] may
/// make one the twin after the replay.
pub(crate) async fn attach_existing(
    inner: &mut Inner,
    pool_name: &str,
    named: &[String],
    devs: Vec<Member>,
    force: bool,
    bs: u64,
) -> RaidResult<Vec<Member>> {
    if named.is_empty() {
        if let Some(d) = devs.first() {
            return Err(RaidError::Config(format!(
                "pool {pool_name} has no journal device, {} given",
                d.name
            )));
        }
        return Ok(Vec::new());
    }
    let mut found: Vec<(String, Member)> = Vec::new();
    let mut blank = Vec::new();
    for dev in devs {
        let hdr = dev.volume.read(0, 1).await.map_err(|e| RaidError::Member {
            member: dev.name.clone(),
            source: e,
        })?;
        if hdr.iter().all(|&b| b == 0) {
            blank.push(dev);
            continue;
        }
        match parse_header(&hdr) {
            Some((p, d)) if p == inner.uuid && named.contains(&d) => {
                if !found.iter().any(|(u, _)| *u == d) {
                    found.push((d, dev));
                }
            }
            Some((p, d)) if p == inner.uuid => {
                tracing::warn!(pool = %pool_name, device = %dev.name, uuid = %d, "journal device no longer named by the superblocks (it failed earlier): left out");
            }
            _ => {
                return Err(RaidError::ForeignMember {
                    member: dev.name.clone(),
                    pool_uuid: inner.uuid.clone(),
                })
            }
        }
    }
    if found.is_empty() {
        if force {
            tracing::warn!(pool = %pool_name, devices = %named.join(", "), "journal device missing: its records are not replayed");
            return Ok(Vec::new());
        }
        return Err(RaidError::Config(format!(
            "pool {pool_name}: journal device {} missing (assemble with force to go without its records)",
            named.join(" and ")
        )));
    }
    if found.len() < named.len() {
        tracing::warn!(pool = %pool_name, "one journal device of the mirrored pair is missing; its twin holds every record, the journal goes on unmirrored");
    }
    for (uuid, dev) in found {
        inner.journal_devs.push(JournalDev {
            h: MemberHandle::new(dev, uuid),
            ring_offset_blocks: HEADER_BYTES / bs,
            failed: AtomicBool::new(false),
        });
    }
    Ok(blank)
}

/// Makes blank devices the twin of a pool left with one journal device, after
/// its journal was replayed and checkpointed (so no record on the survivor is
/// needed by a replay, and the new device needs none copied). Per device: the
/// ring is zeroed (nothing stale can ever read as a record), the superblocks
/// are written naming both devices, then the device's header with FUA. A crash
/// before the header leaves the device blank and the superblocks naming a
/// device not found (a missing twin): the next assemble takes it again, under a
/// new uuid. Devices beyond the pair, or given to a pool without a journal
/// device left, are left alone, and so is one of the wrong size (logged: the
/// pool serves without it rather than not at all). A device that fails a write
/// here is marked failed (logged; the superblocks name the survivor only
/// again) and the pool goes on unmirrored.
pub(crate) async fn adopt(
    inner: &mut Inner,
    pool_name: &str,
    blank: Vec<Member>,
    bs: u64,
) -> RaidResult<()> {
    let Some(ring_blocks) = inner.journal.as_ref().map(|j| j.ring_blocks) else {
        return Ok(());
    };
    for dev in blank {
        let serving = inner.journal_devices().len();
        if serving == 0 || serving >= JOURNAL_DEVICES_MAX {
            tracing::warn!(pool = %pool_name, device = %dev.name,
                "blank journal device given but not needed (no device left to mirror, or a pair already): left alone");
            continue;
        }
        let g = dev.volume.geometry();
        let ring_offset_blocks = HEADER_BYTES / bs;
        if g.block_size_bytes as u64 != bs || g.block_count < ring_offset_blocks + ring_blocks {
            // the pool serves without it rather than not at all
            tracing::error!(pool = %pool_name, device = %dev.name,
                "a journal device must have {bs}-byte blocks and hold {} bytes: not taken, the journal goes on unmirrored",
                HEADER_BYTES + ring_blocks * bs);
            continue;
        }
        let zeroed = async {
            dev.volume
                .write_zeroes(ring_offset_blocks, ring_blocks, false)
                .await?;
            dev.volume.flush().await
        }
        .await;
        if let Err(e) = zeroed {
            tracing::error!(pool = %pool_name, device = %dev.name, error = %e,
                "the new journal device failed while joining: the journal goes on unmirrored");
            continue;
        }
        let uuid = new_uuid();
        let hdr = header(&inner.uuid, &uuid, bs as usize);
        let h = MemberHandle::new(dev, uuid);
        inner.journal_devs.push(JournalDev {
            h: h.clone(),
            ring_offset_blocks,
            failed: AtomicBool::new(false),
        });
        inner
            .persist()
            .await
            .map_err(|e| RaidError::PoolFailed(format!("writing superblocks: {e}")))?;
        if let Err(e) = h.volume.write(0, Bytes::from(hdr), true).await {
            tracing::error!(pool = %pool_name, device = %h.name, error = %e,
                "the new journal device failed while joining: the journal goes on unmirrored");
            if let Some(d) = inner.journal_devs.last() {
                d.failed.store(true, std::sync::atomic::Ordering::SeqCst);
            }
            inner
                .persist()
                .await
                .map_err(|e| RaidError::PoolFailed(format!("writing superblocks: {e}")))?;
            continue;
        }
        tracing::info!(pool = %pool_name, device = %h.name,
            "blank journal device joined the mirrored pair (journal checkpointed, its ring zeroed)");
    }
    Ok(())
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
