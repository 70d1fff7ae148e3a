//! The member superblock: who the member is, which pool it belongs to and the
//! state of every position.
//!
//! On-disk format (two slots, at member bytes 0 and 64 KiB; each write goes to slot
//! `events % 2` with FUA so a torn write never destroys the last good copy):
//!
//! ```text
//! 0   8  magic "FSANRAID"
//! 8   4  format version, little endian: 1, or 2 when the payload lists lost
//!        blocks (an earlier version, which knows only 1, then refuses the member
//!        instead of serving the zeroes that stand in for them as data)
//! 12  4  payload length in bytes
//! 16  4  crc32c of the payload
//! 20  4  crc32c of bytes 0..20
//! 32  .. payload: JSON of `Superblock`
//! ```
//!
//! The rest of the 1 MiB region is left alone, except its last block: the
//! pool's keeper writes zeroes there to ask whether a member still takes
//! writes ([`probe_lba`]).
//!
//! A superblock that lists lost blocks is written to both slots, one after the
//! other, so no slot an earlier version could fall back on says nothing of them.
//!
//! A reader takes the valid slot with the highest `events`. Nothing read from a disk
//! is trusted: a bad magic, version, length or checksum, malformed JSON, or values
//! that do not describe a sane pool, are errors, never panics.

use crate::status::MemberState;
use crate::RaidLevel;
use block::{BlockError, Bytes, VolumeRef};
use serde::{Deserialize, Serialize};

/// Bytes reserved at the start of every member for the superblock slots.
pub(crate) const SUPERBLOCK_REGION_BYTES: u64 = 1 << 20;
/// Bytes of one superblock slot.
pub(crate) const SLOT_BYTES: u64 = 64 * 1024;

/// The member block a pool's keeper writes to ask whether a member still
/// takes writes (raid's `keep.rs`): the superblock region's last block,
/// past both slots, never read.
pub(crate) fn probe_lba(block_size_bytes: u32) -> u64 {
    SUPERBLOCK_REGION_BYTES / u64::from(block_size_bytes) - 1
}
const MAGIC: &[u8; 8] = b"FSANRAID";
const VERSION: u32 = 1;
/// The format version of a superblock whose payload lists lost blocks.
const VERSION_LOST: u32 = 2;
/// Most ranges of lost blocks a rebuild records (adjacent ones merge): past it
/// a rebuild that would lose more is held as before, and says why.
pub(crate) const LOST_RANGES_MAX: usize = 512;
/// Most ranges a superblock may list: writes into the middle of lost ranges
/// split them, up to this; past it a write keeps the range whole (its blocks
/// stay recorded lost, never served as stand-ins). About 24 KB of JSON at
/// most, well inside a slot.
pub(crate) const LOST_RANGES_KEPT_MAX: usize = 2 * LOST_RANGES_MAX;
const HEADER_BYTES: usize = 32;

/// One position as the superblock records it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct MemberRecord {
    pub uuid: String,
    pub state: MemberState,
    /// Stripes rebuilt so far (meaningful while `state == Rebuilding`).
    pub rebuild_checkpoint_stripes: u64,
}

/// The superblock payload.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Superblock {
    pub pool_uuid: String,
    pub pool_name: String,
    pub level: RaidLevel,
    pub chunk_bytes: u32,
    pub block_size_bytes: u32,
    pub member_count: u32,
    /// This member's position; `None` for a hot spare.
    pub position: Option<u32>,
    pub member_uuid: String,
    pub members: Vec<MemberRecord>,
    pub spares: Vec<String>,
    /// Bumped on every membership or state change.
    pub generation: u64,
    /// Bumped on every superblock write (picks the newer slot).
    pub events: u64,
    pub data_offset_blocks: u64,
    pub stripes: u64,
    pub journal_offset_blocks: u64,
    pub journal_blocks: u64,
    pub journal_checkpoint_seq: u64,
    /// Stripes below this are known consistent; `None` when the resync is done.
    pub resync_cursor_stripes: Option<u64>,
    /// True only after an orderly shutdown.
    pub clean: bool,
    pub rebuild_rate_mb_s: u32,
    /// Stripes per write-intent region (0 in superblocks from before regions).
    #[serde(default)]
    pub intent_region_stripes: u64,
    /// Regions that may hold a whole-stripe write not yet known consistent; an
    /// unclean assemble resyncs their parity.
    #[serde(default)]
    pub dirty_regions: Vec<u64>,
    /// The uuid of the pool's journal device (see `jdev.rs`), when the journal is
    /// there rather than on the members.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub journal_device_uuid: Option<String>,
    /// The uuid of the second journal device of a mirrored pair, while both
    /// serve (a failed one is dropped from the superblocks).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub journal_device_mirror_uuid: Option<String>,
    /// Blocks the pool exposes when fewer than its stripes hold (a pool grown to
    /// a size that is not a whole number of stripes); absent: every data block of
    /// every stripe. The blocks past it in the last stripe are zeroes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_blocks: Option<u64>,
    /// Pool blocks whose data is lost: `[first, count]` ranges, sorted, apart
    /// (see `lost.rs`). A rebuild that met an unreadable sector where the
    /// pool had no redundancy left records them; reads of them fail with a
    /// medium error until they are written.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub lost_blocks: Vec<[u64; 2]>,
}

impl Superblock {
    /// Checks the values describe a pool we can run (after a successful decode).
    pub fn validate(&self) -> Result<(), String> {
        let bs = self.block_size_bytes;
        if !(512..=65536).contains(&bs) || !bs.is_power_of_two() {
            return Err(format!("block size {bs}"));
        }
        if self.chunk_bytes < bs
            || !self.chunk_bytes.is_multiple_of(bs)
            || self.chunk_bytes > crate::CHUNK_BYTES_MAX
        {
            return Err(format!("chunk {} bytes", self.chunk_bytes));
        }
        // counters a pool only ever adds one to: near 2^64 they would wrap,
        // and a stale copy would pass for the newest
        if self.generation > u64::MAX / 2 || self.events > u64::MAX / 2 {
            return Err(format!(
                "generation {} or events {} out of range",
                self.generation, self.events
            ));
        }
        if self.member_count == 0
            || self.member_count > 64
            || self.members.len() != self.member_count as usize
        {
            return Err(format!("member count {}", self.member_count));
        }
        let Ok(layout) = crate::layout_for(self.level, self.member_count as usize) else {
            return Err("level does not fit member count".into());
        };
        if let Some(p) = self.position {
            if p >= self.member_count {
                return Err(format!("position {p}"));
            }
        }
        if self.stripes == 0 || self.data_offset_blocks == 0 {
            return Err("empty data area".into());
        }
        // the ring and the data start past the superblocks: a record or a
        // guest's write there would overwrite them
        if self.journal_offset_blocks < SUPERBLOCK_REGION_BYTES / bs as u64 {
            return Err(format!(
                "journal at block {} inside the superblock region",
                self.journal_offset_blocks
            ));
        }
        let cb = (self.chunk_bytes / bs) as u64;
        if self
            .stripes
            .checked_mul(cb)
            .and_then(|x| x.checked_add(self.data_offset_blocks))
            .is_none()
        {
            return Err("data area overflows".into());
        }
        if self
            .journal_offset_blocks
            .saturating_add(self.journal_blocks)
            > self.data_offset_blocks
        {
            return Err("journal overlaps data".into());
        }
        // a parity pool's ring must take two whole-stripe records, as at
        // creation: a smaller one could not place the next record without
        // overwriting the last
        if matches!(layout.scheme(), crate::layout::Scheme::Parity { .. })
            && self.journal_blocks > 0
            && self.journal_blocks
                < crate::journal::min_ring_blocks(self.member_count as usize, cb, bs as usize)
        {
            return Err(format!(
                "journal of {} blocks holds fewer than two full-stripe records",
                self.journal_blocks
            ));
        }
        // the areas of a far layout each span the stripes on every member
        if self
            .stripes
            .checked_mul(cb)
            .and_then(|x| x.checked_mul(layout.areas()))
            .and_then(|x| x.checked_add(self.data_offset_blocks))
            .is_none()
        {
            return Err("data area overflows".into());
        }
        for m in &self.members {
            if m.rebuild_checkpoint_stripes > self.stripes {
                return Err(format!(
                    "rebuild checkpoint {} past {} stripes",
                    m.rebuild_checkpoint_stripes, self.stripes
                ));
            }
        }
        if self.resync_cursor_stripes.is_some_and(|c| c > self.stripes) {
            return Err("resync cursor past the stripes".into());
        }
        // the next record's sequence number must not wrap
        if self.journal_checkpoint_seq > u64::MAX / 2 {
            return Err(format!(
                "journal checkpoint {}",
                self.journal_checkpoint_seq
            ));
        }
        if !self.lost_blocks.is_empty() && self.level == RaidLevel::Raid0 {
            return Err("lost blocks on a pool with no redundancy".into());
        }
        if self.lost_blocks.len() > LOST_RANGES_KEPT_MAX {
            return Err(format!("{} lost ranges", self.lost_blocks.len()));
        }
        let exposed = self
            .stripes
            .checked_mul(cb * layout.data_chunks() as u64)
            .ok_or("data area overflows")?;
        let mut past = 0u64;
        for (i, &[first, count]) in self.lost_blocks.iter().enumerate() {
            let end = first.checked_add(count).ok_or("lost range overflows")?;
            // sorted and apart (adjacent ranges are kept merged)
            if count == 0
                || end > self.volume_blocks.unwrap_or(exposed).min(exposed)
                || (i > 0 && first <= past)
            {
                return Err(format!("lost range [{first}, {count}]"));
            }
            past = end;
        }
        if let Some(v) = self.volume_blocks {
            // inside the last stripe: the stripes before it are all exposed
            let row = cb * layout.data_chunks() as u64;
            let cap = self.stripes.checked_mul(row).ok_or("data area overflows")?;
            if v == 0 || v > cap || v <= cap - row {
                return Err(format!(
                    "volume of {v} blocks over {} stripes",
                    self.stripes
                ));
            }
        }
        Ok(())
    }
}

/// Encodes a superblock into one slot image (a whole number of blocks).
pub(crate) fn encode(sb: &Superblock, block_size: u32) -> Result<Vec<u8>, String> {
    let payload = serde_json::to_vec(sb).map_err(|e| e.to_string())?;
    if payload.len() + HEADER_BYTES > SLOT_BYTES as usize {
        return Err(format!("superblock of {} bytes too large", payload.len()));
    }
    let len = crate::util::align_up((payload.len() + HEADER_BYTES) as u64, block_size as u64);
    let mut out = vec![0u8; len as usize];
    out[0..8].copy_from_slice(MAGIC);
    let version = if sb.lost_blocks.is_empty() {
        VERSION
    } else {
        VERSION_LOST
    };
    out[8..12].copy_from_slice(&version.to_le_bytes());
    out[12..16].copy_from_slice(&(payload.len() as u32).to_le_bytes());
    out[16..20].copy_from_slice(&crc32c::crc32c(&payload).to_le_bytes());
    let hcrc = crc32c::crc32c(&out[0..20]);
    out[20..24].copy_from_slice(&hcrc.to_le_bytes());
    out[HEADER_BYTES..HEADER_BYTES + payload.len()].copy_from_slice(&payload);
    Ok(out)
}

fn le32(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

/// Decodes one slot image.
pub(crate) fn decode(buf: &[u8]) -> Result<Superblock, String> {
    if buf.len() < HEADER_BYTES || &buf[0..8] != MAGIC {
        return Err("no superblock magic".into());
    }
    let hcrc = le32(buf, 20).ok_or("short header")?;
    if crc32c::crc32c(&buf[0..20]) != hcrc {
        return Err("header checksum mismatch".into());
    }
    let version = le32(buf, 8).ok_or("short header")?;
    if version != VERSION && version != VERSION_LOST {
        return Err(format!("unsupported version {version}"));
    }
    let len = le32(buf, 12).ok_or("short header")? as usize;
    let payload = buf
        .get(HEADER_BYTES..HEADER_BYTES.saturating_add(len))
        .ok_or("payload length beyond slot")?;
    if crc32c::crc32c(payload) != le32(buf, 16).ok_or("short header")? {
        return Err("payload checksum mismatch".into());
    }
    let sb: Superblock = serde_json::from_slice(payload).map_err(|e| e.to_string())?;
    if (version == VERSION_LOST) == sb.lost_blocks.is_empty() {
        return Err(format!(
            "version {version} with {} lost ranges",
            sb.lost_blocks.len()
        ));
    }
    sb.validate()?;
    Ok(sb)
}

/// Both slots as read (an error as its text); None when the volume is
/// smaller than the superblock region (it cannot have been a member).
async fn read_slots(volume: &VolumeRef) -> Option<[Result<Bytes, String>; 2]> {
    let g = volume.geometry();
    let bs = g.block_size_bytes as u64;
    if g.block_count < SUPERBLOCK_REGION_BYTES / bs {
        return None;
    }
    let slot_blocks = SLOT_BYTES / bs;
    let read = |slot: u64| async move {
        volume
            .read(slot * slot_blocks, slot_blocks as u32)
            .await
            .map_err(|e| e.to_string())
    };
    Some([read(0).await, read(1).await])
}

/// The newest superblock of `slots` valid for a member of `bs`-byte blocks,
/// or why there is none.
fn best_of(slots: &[Result<Bytes, String>; 2], bs: u32) -> Result<Superblock, String> {
    let mut best: Option<Superblock> = None;
    let mut why = String::from("no superblock");
    for slot in slots {
        match slot.as_ref().map(|buf| decode(buf)) {
            Ok(Ok(sb)) if sb.block_size_bytes != bs => {
                why = "block size differs from the member's".into();
            }
            Ok(Ok(sb)) => {
                if best.as_ref().is_none_or(|b| sb.events > b.events) {
                    best = Some(sb);
                }
            }
            Ok(Err(e)) => why = e,
            Err(e) => why = e.clone(),
        }
    }
    best.ok_or(why)
}

/// Why a disk gives assembly no superblock.
pub(crate) enum NoSuperblock {
    /// Neither slot could be read at all: the disk fails or does not answer.
    Unreadable(String),
    /// What it holds is not a valid superblock of a member this size.
    Invalid(String),
}

/// Reads both slots and returns the newest valid superblock.
pub(crate) async fn read_best(volume: &VolumeRef) -> Result<Superblock, NoSuperblock> {
    let slots = read_slots(volume).await.ok_or(NoSuperblock::Invalid(
        "member smaller than the superblock region".into(),
    ))?;
    if let [Err(e), Err(_)] = &slots {
        return Err(NoSuperblock::Unreadable(e.clone()));
    }
    best_of(&slots, volume.geometry().block_size_bytes).map_err(NoSuperblock::Invalid)
}

/// What the superblock region of a disk holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SuperblockState {
    /// A valid superblock (in one slot at least).
    Formatted,
    /// Neither slot read carries the superblock magic: no pool's disk.
    Blank,
    /// A slot could not be read, or carries the magic but does not decode:
    /// it may be a pool's disk, and must not be taken for a blank one.
    Unknown(String),
}

/// Reads both slots once and tells whether the disk is formatted, blank, or
/// cannot be told (see [`SuperblockState`]).
pub(crate) async fn state(volume: &VolumeRef) -> SuperblockState {
    let Some(slots) = read_slots(volume).await else {
        return SuperblockState::Blank; // too small to have been a member
    };
    let why = match best_of(&slots, volume.geometry().block_size_bytes) {
        Ok(_) => return SuperblockState::Formatted,
        Err(why) => why,
    };
    for (slot, read) in slots.iter().enumerate() {
        match read {
            Err(e) => return SuperblockState::Unknown(format!("slot {slot} cannot be read: {e}")),
            Ok(buf) if buf.len() >= 8 && &buf[0..8] == MAGIC => {
                return SuperblockState::Unknown(format!("damaged superblock: {why}"));
            }
            Ok(_) => {}
        }
    }
    SuperblockState::Blank
}

/// Writes `sb` to its slot (`events % 2`) with FUA; one that lists lost
/// blocks then to the other slot too unless `other_has_lost` says that slot
/// lists some already (see the module's notes). Returns the bytes written.
pub(crate) async fn write(
    volume: &VolumeRef,
    sb: &Superblock,
    other_has_lost: bool,
) -> Result<u64, BlockError> {
    let bs = volume.geometry().block_size_bytes;
    let image =
        Bytes::from(encode(sb, bs).map_err(|_| BlockError::NotSupported("superblock too large"))?);
    let slot_blocks = SLOT_BYTES / bs as u64;
    let first = sb.events % 2;
    volume
        .write(first * slot_blocks, image.clone(), true)
        .await?;
    if sb.lost_blocks.is_empty() || other_has_lost {
        return Ok(image.len() as u64);
    }
    volume
        .write((1 - first) * slot_blocks, image.clone(), true)
        .await?;
    Ok(2 * image.len() as u64)
}

/// A valid superblock of a three-member RAID 5 (member 1's copy), for the
/// tests and the fuzz target's samples.
#[cfg(any(test, feature = "fuzzing"))]
pub(crate) fn sample_superblock() -> Superblock {
    Superblock {
        pool_uuid: "ab".repeat(16),
        pool_name: "p".into(),
        level: RaidLevel::Raid5,
        chunk_bytes: 65536,
        block_size_bytes: 512,
        member_count: 3,
        position: Some(1),
        member_uuid: "cd".repeat(16),
        members: (0..3)
            .map(|i| MemberRecord {
                uuid: format!("{i:032x}"),
                state: MemberState::Active,
                rebuild_checkpoint_stripes: 0,
            })
            .collect(),
        spares: vec![],
        generation: 3,
        events: 9,
        data_offset_blocks: 4096,
        stripes: 10,
        journal_offset_blocks: 2048,
        journal_blocks: 2048,
        journal_checkpoint_seq: 0,
        resync_cursor_stripes: Some(0),
        clean: false,
        rebuild_rate_mb_s: 100,
        intent_region_stripes: 2048,
        dirty_regions: vec![0, 3],
        journal_device_uuid: None,
        journal_device_mirror_uuid: None,
        volume_blocks: None,
        lost_blocks: vec![],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A disk is blank only when neither slot reads with the superblock
    /// magic: a damaged superblock or a slot that cannot be read leaves it
    /// unknown, so a pool whose members all look so is not created anew over
    /// them. (Before, any failure to read a valid superblock counted as a
    /// blank disk, and the pool was formatted again at start.)
    #[tokio::test]
    async fn a_damaged_or_unreadable_superblock_is_not_a_blank_disk() {
        use block::{FaultVolume, MemVolume, VolumeRef};
        use std::sync::Arc;
        let mem = Arc::new(MemVolume::new(512, 8192));
        let fault = Arc::new(FaultVolume::new(mem.clone()));
        let v: VolumeRef = fault.clone();
        assert_eq!(state(&v).await, SuperblockState::Blank);
        // garbage without the magic (a reused disk) is blank
        let noise: Vec<u8> = (0..4096u32).map(|i| (i * 7 + 3) as u8).collect();
        v.write(0, Bytes::from(noise), true).await.unwrap();
        assert_eq!(state(&v).await, SuperblockState::Blank);
        let sb = sample_superblock();
        write(&v, &sb, false).await.unwrap();
        assert_eq!(state(&v).await, SuperblockState::Formatted);
        // the payload damaged, the magic intact
        let lba = (sb.events % 2) * (SLOT_BYTES / 512);
        let mut slot = v.read(lba, 1).await.unwrap().to_vec();
        slot[40] ^= 1;
        v.write(lba, Bytes::from(slot), true).await.unwrap();
        assert!(
            matches!(state(&v).await, SuperblockState::Unknown(ref w) if w.contains("damaged")),
            "{:?}",
            state(&v).await
        );
        // and a disk whose superblock region cannot be read
        let fresh: VolumeRef = Arc::new(FaultVolume::new(Arc::new(MemVolume::new(512, 8192))));
        let f2 = Arc::new(FaultVolume::new(Arc::new(MemVolume::new(512, 8192))));
        f2.plan().lock().bad_read_blocks.push(0..1);
        let unreadable: VolumeRef = f2;
        assert_eq!(state(&fresh).await, SuperblockState::Blank);
        assert!(
            matches!(state(&unreadable).await, SuperblockState::Unknown(ref w) if w.contains("cannot be read")),
            "{:?}",
            state(&unreadable).await
        );
    }

    /// Fields a crafted or rotten superblock may carry that no pool writes
    /// are refused at decode: a chunk past the largest (a resync would
    /// allocate it per member), counters near 2^64 (they would wrap), a
    /// journal inside the superblock region (its records would overwrite
    /// them). Before, each passed.
    #[test]
    fn fields_no_pool_writes_are_refused() {
        assert!(sample_superblock().validate().is_ok());
        let mut smallest = sample_superblock();
        smallest.journal_blocks = 770;
        assert!(smallest.validate().is_ok(), "a ring of exactly two records");
        type Spoil = fn(&mut Superblock);
        let cases: [(&str, Spoil); 5] = [
            ("chunk", |s| s.chunk_bytes = 1 << 31),
            ("generation", |s| s.generation = u64::MAX),
            ("events", |s| s.events = u64::MAX - 1),
            ("journal", |s| s.journal_offset_blocks = 1),
            // two whole-stripe records of 3 x 128 blocks and a header need 770
            ("ring", |s| s.journal_blocks = 769),
        ];
        for (what, spoil) in cases {
            let mut sb = sample_superblock();
            spoil(&mut sb);
            assert!(sb.validate().is_err(), "{what}");
            let img = encode(&sb, 512).unwrap();
            assert!(decode(&img).is_err(), "{what} decoded");
        }
    }

    #[test]
    fn roundtrip_and_corruption_is_an_error() {
        let sb = sample_superblock();
        let img = encode(&sb, 512).unwrap();
        assert_eq!(decode(&img).unwrap(), sb);
        for i in [0usize, 9, 13, 17, 21, 40, img.len() - 1] {
            let mut bad = img.clone();
            bad[i] ^= 0x40;
            if i < 60 || bad[i] != 0x40 {
                let _ = decode(&bad); // must not panic
            }
        }
        let mut bad = img.clone();
        bad[40] ^= 1;
        assert!(decode(&bad).is_err());
        // a huge length field is an error, not a panic
        let mut bad = img.clone();
        bad[12..16].copy_from_slice(&u32::MAX.to_le_bytes());
        let hcrc = crc32c::crc32c(&bad[0..20]);
        bad[20..24].copy_from_slice(&hcrc.to_le_bytes());
        assert!(decode(&bad).is_err());
        // insane values behind a valid checksum are rejected
        let mut insane = sb.clone();
        insane.member_count = 1000;
        assert!(decode(&encode(&insane, 512).unwrap()).is_err());
    }

    /// Values a checksummed but wrong superblock could carry, each of which
    /// the pool would otherwise follow: a rebuild checkpoint or resync cursor
    /// past the stripes (the rebuild subtracts), a journal sequence about to
    /// wrap (later records would sort below the checkpoint and never replay).
    #[test]
    fn positions_past_the_pool_and_a_wrapping_sequence_are_refused() {
        assert!(sample_superblock().validate().is_ok());
        let mut sb = sample_superblock();
        sb.members[0].rebuild_checkpoint_stripes = sb.stripes + 1;
        assert!(sb.validate().unwrap_err().contains("rebuild checkpoint"));
        let mut sb = sample_superblock();
        sb.resync_cursor_stripes = Some(sb.stripes + 1);
        assert!(sb.validate().is_err());
        let mut sb = sample_superblock();
        sb.journal_checkpoint_seq = u64::MAX;
        assert!(sb.validate().unwrap_err().contains("journal checkpoint"));
    }

    #[test]
    fn volume_blocks_must_end_in_the_last_stripe() {
        // raid5 of 3: a stripe holds 2 chunks of 128 blocks; 10 stripes
        let row = 2 * 128;
        let mut sb = sample_superblock();
        for (v, ok) in [
            (None, true),
            (Some(10 * row), true),
            (Some(9 * row + 1), true),
            (Some(9 * row), false),
            (Some(10 * row + 1), false),
            (Some(0), false),
        ] {
            sb.volume_blocks = v;
            assert_eq!(decode(&encode(&sb, 512).unwrap()).is_ok(), ok, "{v:?}");
        }
        // written before grows existed: no field, the whole stripes
        sb.volume_blocks = None;
        let json = serde_json::to_string(&sb).unwrap();
        assert!(!json.contains("volume_blocks"));
    }

    #[test]
    fn raid10_layout_is_recorded_and_old_superblocks_read_as_near() {
        // the far layout is its own level name on disk, so it reassembles as far
        let mut far = sample_superblock();
        far.level = RaidLevel::Raid10Far;
        let img = encode(&far, 512).unwrap();
        assert_eq!(decode(&img).unwrap().level, RaidLevel::Raid10Far);
        let json = serde_json::to_string(&far).unwrap();
        assert!(json.contains("\"level\":\"raid10-far\""), "{json}");
        // a superblock written before the far layout existed says "raid10": near
        let mut near = sample_superblock();
        near.level = RaidLevel::Raid10;
        near.member_count = 4;
        near.members.push(near.members[0].clone());
        let old = serde_json::to_string(&near).unwrap();
        assert!(old.contains("\"level\":\"raid10\""));
        let back: Superblock = serde_json::from_str(&old).unwrap();
        assert_eq!(back.level, RaidLevel::Raid10);
    }

    /// A superblock that lists lost blocks is format version 2, which an
    /// earlier version refuses (it would serve the stand-in values as data),
    /// and is written to both slots, so an earlier version finds no version-1
    /// copy to fall back on. Ranges that overlap, touch, are empty or lie past
    /// the exposed blocks are refused, as is a version that does not match.
    #[tokio::test]
    async fn lost_blocks_make_a_version_2_superblock_in_both_slots() {
        use block::{MemVolume, VolumeRef};
        use std::sync::Arc;
        let mut sb = sample_superblock();
        let plain = encode(&sb, 512).unwrap();
        assert_eq!(le32(&plain, 8), Some(1));
        sb.lost_blocks = vec![[3, 2], [9, 1]];
        let img = encode(&sb, 512).unwrap();
        assert_eq!(le32(&img, 8), Some(2));
        assert_eq!(decode(&img).unwrap(), sb);
        let v: VolumeRef = Arc::new(MemVolume::new(512, 8192));
        write(&v, &sb, false).await.unwrap();
        let slots = read_slots(&v).await.unwrap();
        for slot in &slots {
            let buf = slot.as_ref().unwrap();
            assert_eq!(le32(buf, 8), Some(2));
            assert_eq!(decode(buf).unwrap(), sb);
        }
        // the header's version must say what the payload holds
        let mut lying = img.clone();
        lying[8..12].copy_from_slice(&1u32.to_le_bytes());
        let hcrc = crc32c::crc32c(&lying[0..20]);
        lying[20..24].copy_from_slice(&hcrc.to_le_bytes());
        assert!(decode(&lying).unwrap_err().contains("lost ranges"));
        // 2 data chunks x 128 blocks x 10 stripes exposed
        for bad in [
            vec![[3, 2], [5, 1]],
            vec![[3, 2], [4, 1]],
            vec![[9, 1], [3, 2]],
            vec![[3, 0]],
            vec![[2559, 2]],
            vec![[u64::MAX, 2]],
        ] {
            sb.lost_blocks = bad.clone();
            assert!(sb.validate().is_err(), "{bad:?}");
        }
        sb.lost_blocks = vec![[2559, 1]];
        sb.validate().unwrap();
        // the most a superblock may list, with pool block numbers of a
        // multi-terabyte pool and long ranges
        sb.stripes = 1 << 34;
        sb.lost_blocks = (0..LOST_RANGES_KEPT_MAX as u64 + 1)
            .map(|i| [(1 << 41) + 200_000 * i, 100_000])
            .collect();
        assert!(sb.validate().is_err());
        sb.lost_blocks.pop();
        sb.validate().unwrap();
        assert!(encode(&sb, 512).is_ok(), "a full list fits a slot");
    }
}
