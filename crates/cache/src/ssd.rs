//! Where the cache lives on its SSDs: the on-disk format (superblock, frame table,
//! frames) and the set of cache devices (mirrored for write-back, striped for the
//! other modes).
//!
//! Every cache device has the same layout:
//!
//! ```text
//! [0, 4K)        superblock copy A      (the two copies alternate by generation,
//! [4K, 8K)       superblock copy B       so a torn superblock write leaves the other)
//! [8K, ...)      frame table: 4 KiB pages of 170 records, each page checksummed
//!                and numbered; a mirrored cache keeps two copies of it (slot 0,
//!                then slot 1), a striped one a single copy
//! [data, ...)    frames: one cache block each, 1 MiB aligned
//! ```
//!
//! The space between the table and the frames, and past the last frame,
//! holds nothing; a keeper writes zeroes to a page of it to ask whether a
//! device still takes writes ([`DeviceLayout::free_page`]).
//!
//! The table's two slots (write-back): a page write goes to the slot that does
//! not hold the page's last durable version, with a sequence number one above
//! it, and the next write of that page waits for it. A write torn by a power
//! cut (an SSD of 512-byte blocks may keep part of a 4 KiB write; both mirror
//! halves take it at once, so both may tear) leaves the other slot whole, and
//! the open takes each page's valid copy of the highest number. With one slot
//! (a write-back cache made by a version before slots), such a tear on both
//! halves made the cache refuse to start with its dirty records out of reach.
//!
//! A record is 24 bytes: the cache-block number held by the frame (`u64::MAX` when
//! empty), then a `u64` bitmap of valid 4 KiB sectors and one of dirty sectors.
//! Mirrored devices hold every frame and its record; striped devices hold frames
//! `i, i + n, i + 2n, ...` of an `n`-device set and their records.
//!
//! Key invariant (write-back): a record on the SSD that marks sectors dirty always
//! describes data that is on the SSD in that frame: data is written (FUA) before the
//! record that points at it, and a frame is reused for another block only after a
//! record saying it is no longer dirty is durable.

use crate::CacheMode;
use block::{BlockError, BlockResult, Bytes, VolumeRef};
use parking_lot::RwLock;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

/// The unit of validity and dirtiness inside a cache block.
pub const SECTOR_BYTES: u64 = 4096;
/// Bytes of one table page.
pub(crate) const PAGE_BYTES: u64 = 4096;
pub(crate) const TABLE_OFFSET: u64 = 2 * 4096;
const RECORD_BYTES: usize = 24;
const PAGE_HEADER: usize = 8;
/// Where a page keeps its sequence number: the 8 bytes after its last record
/// (zero in pages written before slots).
const PAGE_SEQ: usize = PAGE_BYTES as usize - 8;
/// Records in one table page.
pub(crate) const RECORDS_PER_PAGE: usize = (PAGE_BYTES as usize - PAGE_HEADER) / RECORD_BYTES;
const MAGIC: &[u8; 8] = b"FSNCACH1";
/// The superblock's mode byte flag of a table in two copies.
const SLOTS_2: u8 = 0x10;
/// The superblock's mode byte flag of a table that may hold lost sectors
/// (see [`Superblock::lost_sectors`]).
const LOST_SECTORS: u8 = 0x20;
const DATA_ALIGN: u64 = 1 << 20;
/// The key of an empty frame in the table.
pub(crate) const NO_KEY: u64 = u64::MAX;

/// The identity and state of a cache, on every one of its devices.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Superblock {
    /// Random id shared by the devices of one cache.
    pub cache_id: u64,
    /// Bumped at every state change; the newest copy wins.
    pub generation: u64,
    /// The mode the cache ran in when this was written.
    pub mode: CacheMode,
    /// Cache block size in bytes.
    pub block_bytes: u32,
    /// Frames of the whole cache.
    pub frames: u32,
    /// Devices of the cache.
    pub device_count: u8,
    /// This device's position.
    pub device_index: u8,
    /// Mirrored (every device holds every frame) or striped.
    pub mirrored: bool,
    /// Size of the backing volume in bytes (a cache refuses a different volume size).
    pub backing_bytes: u64,
    /// Which volume the cache is in front of ([`crate::CacheConfig::backing_id`]):
    /// a cache whose devices name another one neither serves nor destages what
    /// they hold. 0: not known (written by a version without it, or a backing
    /// with no identity).
    pub backing_id: u128,
    /// The table is complete (written at a clean shutdown): clean frames may be
    /// trusted too. When false only dirty records are (write-back).
    pub clean: bool,
    /// The mirror partner failed after this generation; this copy alone is current.
    pub partner_failed: bool,
    /// Copies of the table ([`DeviceLayout::slots`]): 2, or 0 in superblocks
    /// written before slots (one copy). Encoded as a flag of the mode byte,
    /// which a version before slots refuses.
    pub table_slots: u8,
    /// The table may hold lost sectors: dirty and not valid in a record,
    /// acknowledged data no copy holds any more (a resilver could not read
    /// it on the survivor). Reads of them are medium errors until the host
    /// writes them. A flag of the mode byte, which a version before it
    /// refuses: it would read such a sector as dirty and serve whatever the
    /// frame holds, or as clean and serve the backing's older data.
    pub lost_sectors: bool,
}

impl Superblock {
    /// The table's copies per page on devices this superblock describes.
    pub(crate) fn slots(&self) -> u32 {
        u32::from(self.table_slots).clamp(1, 2)
    }

    /// The layout of each device this superblock describes.
    pub(crate) fn layout(&self) -> DeviceLayout {
        let local = if self.mirrored {
            self.frames
        } else {
            self.frames.div_ceil(self.device_count.max(1) as u32)
        };
        DeviceLayout::for_frames(local, self.block_bytes as u64, self.slots())
    }

    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; 4096];
        b[0..8].copy_from_slice(MAGIC);
        b[8..16].copy_from_slice(&self.cache_id.to_le_bytes());
        b[16..24].copy_from_slice(&self.generation.to_le_bytes());
        // two table copies are marked in the mode byte, where a version
        // before them finds no mode it knows: it refuses the superblock
        // (and does not format the device) instead of reading one copy at
        // the wrong place
        // (so is a table that may hold lost sectors)
        b[24] = self.mode as u8
            | if self.slots() == 2 { SLOTS_2 } else { 0 }
            | if self.lost_sectors { LOST_SECTORS } else { 0 };
        b[25] = self.device_count;
        b[26] = self.device_index;
        b[27] = u8::from(self.mirrored)
            | u8::from(self.clean) << 1
            | u8::from(self.partner_failed) << 2;
        b[28..32].copy_from_slice(&self.block_bytes.to_le_bytes());
        b[32..36].copy_from_slice(&self.frames.to_le_bytes());
        b[40..48].copy_from_slice(&self.backing_bytes.to_le_bytes());
        b[48..64].copy_from_slice(&self.backing_id.to_le_bytes());
        let crc = crc32c::crc32c(&b[..4092]);
        b[4092..].copy_from_slice(&crc.to_le_bytes());
        b
    }

    pub(crate) fn decode(b: &[u8]) -> Option<Superblock> {
        if b.len() < 4096 || &b[0..8] != MAGIC {
            return None;
        }
        let crc = u32::from_le_bytes(b[4092..4096].try_into().ok()?);
        if crc != crc32c::crc32c(&b[..4092]) {
            return None;
        }
        let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap_or([0; 8]));
        let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().unwrap_or([0; 4]));
        Some(Superblock {
            cache_id: u64_at(8),
            generation: u64_at(16),
            mode: CacheMode::from_u8(b[24] & !(SLOTS_2 | LOST_SECTORS))?,
            device_count: b[25],
            device_index: b[26],
            mirrored: b[27] & 1 != 0,
            clean: b[27] & 2 != 0,
            partner_failed: b[27] & 4 != 0,
            block_bytes: u32_at(28),
            frames: u32_at(32),
            table_slots: if b[24] & SLOTS_2 != 0 { 2 } else { 0 },
            lost_sectors: b[24] & LOST_SECTORS != 0,
            backing_bytes: u64_at(40),
            backing_id: u128::from_le_bytes(b[48..64].try_into().unwrap_or([0; 16])),
        })
    }
}

/// Zeroes both superblock copies of `vol` (FUA): a device taken as a
/// replacement may carry another cache's superblock, perhaps at a higher
/// generation, which must not outlive a crash before this cache writes its own.
pub(crate) async fn wipe_superblocks(vol: &VolumeRef) -> BlockResult<()> {
    vol.write(0, Bytes::from(vec![0u8; TABLE_OFFSET as usize]), true)
        .await
}

/// One table record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Record {
    pub key: u64,
    pub valid: u64,
    pub dirty: u64,
}

impl Record {
    pub(crate) const EMPTY: Record = Record {
        key: NO_KEY,
        valid: 0,
        dirty: 0,
    };
}

/// Encodes one table page, version `seq`, from its records (at most [`RECORDS_PER_PAGE`]).
pub(crate) fn encode_page(page_no: u32, seq: u64, records: &[Record]) -> Vec<u8> {
    let mut b = vec![0u8; PAGE_BYTES as usize];
    b[0..4].copy_from_slice(&page_no.to_le_bytes());
    b[PAGE_SEQ..].copy_from_slice(&seq.to_le_bytes());
    for (i, r) in records.iter().enumerate().take(RECORDS_PER_PAGE) {
        let o = PAGE_HEADER + i * RECORD_BYTES;
        b[o..o + 8].copy_from_slice(&r.key.to_le_bytes());
        b[o + 8..o + 16].copy_from_slice(&r.valid.to_le_bytes());
        b[o + 16..o + 24].copy_from_slice(&r.dirty.to_le_bytes());
    }
    let crc = crc32c::crc32c(&b[8..]) ^ crc32c::crc32c(&b[0..4]);
    b[4..8].copy_from_slice(&crc.to_le_bytes());
    b
}

/// Decodes a table page: its version and records; `None` if its checksum or
/// number is wrong.
pub(crate) fn decode_page(page_no: u32, b: &[u8]) -> Option<(u64, Vec<Record>)> {
    if b.len() < PAGE_BYTES as usize {
        return None;
    }
    let no = u32::from_le_bytes(b[0..4].try_into().ok()?);
    let crc = u32::from_le_bytes(b[4..8].try_into().ok()?);
    if no != page_no || crc != crc32c::crc32c(&b[8..]) ^ crc32c::crc32c(&b[0..4]) {
        return None;
    }
    let mut out = Vec::with_capacity(RECORDS_PER_PAGE);
    for i in 0..RECORDS_PER_PAGE {
        let o = PAGE_HEADER + i * RECORD_BYTES;
        let at = |x: usize| u64::from_le_bytes(b[x..x + 8].try_into().unwrap_or([0; 8]));
        out.push(Record {
            key: at(o),
            valid: at(o + 8),
            dirty: at(o + 16),
        });
    }
    let seq = u64::from_le_bytes(b[PAGE_SEQ..PAGE_BYTES as usize].try_into().ok()?);
    Some((seq, out))
}

/// Geometry of one device: how many frames it holds and where they start.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct DeviceLayout {
    pub local_frames: u32,
    pub table_pages: u32,
    /// Copies of the table: 2 for a mirrored (write-back) cache, 1 otherwise
    /// and in caches made before slots.
    pub slots: u32,
    pub data_offset: u64,
    pub block_bytes: u64,
}

impl DeviceLayout {
    /// The layout holding `local_frames` frames of `block_bytes`, with `slots`
    /// copies of the table.
    pub(crate) fn for_frames(local_frames: u32, block_bytes: u64, slots: u32) -> DeviceLayout {
        let table_pages = (local_frames as usize).div_ceil(RECORDS_PER_PAGE) as u32;
        let table_end = TABLE_OFFSET + table_pages as u64 * slots as u64 * PAGE_BYTES;
        DeviceLayout {
            local_frames,
            table_pages,
            slots,
            data_offset: table_end.div_ceil(DATA_ALIGN) * DATA_ALIGN,
            block_bytes,
        }
    }

    /// The most frames of `block_bytes` a device of `device_bytes` holds.
    pub(crate) fn fitting(device_bytes: u64, block_bytes: u64, slots: u32) -> u32 {
        let mut n = (device_bytes.saturating_sub(TABLE_OFFSET + DATA_ALIGN) / block_bytes)
            .min(u32::MAX as u64 - 1) as u32;
        while n > 0 && DeviceLayout::for_frames(n, block_bytes, slots).end() > device_bytes {
            n -= 1;
        }
        n
    }

    /// Bytes of the device used.
    pub(crate) fn end(&self) -> u64 {
        self.data_offset + self.local_frames as u64 * self.block_bytes
    }

    /// A page of a device of `device_bytes` that holds nothing (between the
    /// table and the frames, or past the last frame), for a keeper's write
    /// probe (cache's `keep.rs`); `None` when the layout fills the device
    /// to the page.
    pub(crate) fn free_page(&self, device_bytes: u64) -> Option<u64> {
        let table_end = self.page_offset(0, self.slots);
        if table_end + PAGE_BYTES <= self.data_offset {
            return Some(self.data_offset - PAGE_BYTES);
        }
        (self.end() + PAGE_BYTES <= device_bytes).then_some(self.end())
    }

    pub(crate) fn frame_offset(&self, local: u32) -> u64 {
        self.data_offset + local as u64 * self.block_bytes
    }

    /// Where copy `slot` of table page `page` lives.
    pub(crate) fn page_offset(&self, page: u32, slot: u32) -> u64 {
        TABLE_OFFSET + (slot as u64 * self.table_pages as u64 + page as u64) * PAGE_BYTES
    }

    /// The slot a page's version `seq` is written to.
    pub(crate) fn slot_of(&self, seq: u64) -> u32 {
        (seq % self.slots as u64) as u32
    }
}

/// No resilver running on a device.
const NOT_RESILVERING: u32 = u32::MAX;

/// One cache device (its volume can be replaced after a failure).
pub(crate) struct Device {
    /// Name and volume, replaced together by [`Device::replace`].
    pub(crate) slot: RwLock<(String, VolumeRef)>,
    pub failed: AtomicBool,
    /// While a replaced mirror half is being filled: frames below this are
    /// copied and take writes like a live device; `NOT_RESILVERING` otherwise.
    resilver: AtomicU32,
    /// The device's logical block size.
    bs: u64,
    /// Reads of frame data it answered with a medium error (sectors it
    /// could not read, the device kept in service).
    media_errors: std::sync::atomic::AtomicU64,
    /// The medium errors met lately: when the count was last halved, and
    /// the count (see [`Device::recent_media_errors`]).
    recent: parking_lot::Mutex<(std::time::Instant, u32)>,
}

/// A mirror half is failed once it answers more medium errors than this,
/// counted as md counts a member's corrected read errors (its default
/// `max_corrected_read_errors`): halved for every hour that passes. A device
/// whose unreadable sectors keep growing is wearing out; written again from
/// the other half, each costs the reads a retry and the half a rewrite, and
/// the next may be a sector of dirty data the other half cannot read either.
pub(crate) const MEDIA_ERRORS_MAX: u32 = 20;

impl Device {
    pub(crate) fn new(name: String, vol: VolumeRef) -> Device {
        let bs = vol.geometry().block_size_bytes as u64;
        Device {
            slot: RwLock::new((name, vol)),
            failed: AtomicBool::new(false),
            resilver: AtomicU32::new(NOT_RESILVERING),
            bs,
            media_errors: Default::default(),
            recent: parking_lot::Mutex::new((std::time::Instant::now(), 0)),
        }
    }

    /// The medium errors met lately: each counts one, and the count halves
    /// for every hour that passes.
    pub(crate) fn recent_media_errors(&self) -> u32 {
        self.count_recent(0)
    }

    /// Halves the recent count for every hour passed, then adds `more`.
    fn count_recent(&self, more: u32) -> u32 {
        self.count_recent_at(more, std::time::Instant::now())
    }

    /// [`Device::count_recent`] at time `now`.
    fn count_recent_at(&self, more: u32, now: std::time::Instant) -> u32 {
        let mut g = self.recent.lock();
        let hours = now.saturating_duration_since(g.0).as_secs() / 3600;
        if hours > 0 {
            g.1 = g.1.checked_shr(hours.min(32) as u32).unwrap_or(0);
            g.0 += std::time::Duration::from_secs(hours * 3600);
        }
        g.1 = g.1.saturating_add(more);
        g.1
    }

    /// The device's logical block size.
    pub(crate) fn block_bytes(&self) -> u64 {
        self.bs
    }

    /// Frame reads it answered with a medium error since the start.
    pub(crate) fn media_errors(&self) -> u64 {
        self.media_errors.load(Ordering::Relaxed)
    }

    /// The device's name.
    pub(crate) fn name(&self) -> String {
        self.slot.read().0.clone()
    }

    /// The device's volume.
    pub(crate) fn vol(&self) -> VolumeRef {
        self.slot.read().1.clone()
    }

    pub(crate) fn is_failed(&self) -> bool {
        self.failed.load(Ordering::Acquire)
    }

    /// Puts a new volume in place of this failed device and starts a resilver at
    /// frame 0: the device stays failed for reads until [`Device::finish_resilver`].
    /// False if the device has not failed or the volume's block size differs.
    pub(crate) fn replace(&self, name: String, vol: VolumeRef) -> bool {
        if !self.is_failed() || vol.geometry().block_size_bytes as u64 != self.bs {
            return false;
        }
        *self.slot.write() = (name, vol);
        // the counts were the old device's
        self.media_errors.store(0, Ordering::Relaxed);
        *self.recent.lock() = (std::time::Instant::now(), 0);
        self.resilver.store(0, Ordering::Release);
        true
    }

    /// Frames copied by the running resilver, if one runs.
    pub(crate) fn resilver_cursor(&self) -> Option<u32> {
        match self.resilver.load(Ordering::Acquire) {
            NOT_RESILVERING => None,
            c => Some(c),
        }
    }

    /// Frames below `cursor` are copied.
    pub(crate) fn set_resilver_cursor(&self, cursor: u32) {
        self.resilver.store(cursor, Ordering::Release);
    }

    /// Whether a write into frame `slot` must reach this device: it is live, or
    /// the resilver has copied that frame already.
    pub(crate) fn takes_frame(&self, slot: u32) -> bool {
        !self.is_failed() || self.resilver_cursor().is_some_and(|c| slot < c)
    }

    /// The resilver copied everything: the device is live again.
    pub(crate) fn finish_resilver(&self) {
        self.resilver.store(NOT_RESILVERING, Ordering::Release);
        self.failed.store(false, Ordering::Release);
    }

    /// The resilver stopped before the end: the device stays failed.
    pub(crate) fn abandon_resilver(&self) {
        self.resilver.store(NOT_RESILVERING, Ordering::Release);
        self.failed.store(true, Ordering::Release);
    }

    /// Marks the device failed; returns true if it was not already.
    pub(crate) fn fail(&self, why: &BlockError) -> bool {
        if self.resilver_cursor().is_some() {
            // a failure of the device being filled ends its resilver
            self.abandon_resilver();
            tracing::error!(device = %self.name(), "replacement cache device failed while being filled: {why}");
            return false;
        }
        let first = !self.failed.swap(true, Ordering::AcqRel);
        if first {
            tracing::error!(device = %self.name(), "cache device failed: {why}");
        }
        first
    }

    pub(crate) fn size_bytes(&self) -> u64 {
        self.vol().geometry().size_bytes()
    }

    /// Reads `len` bytes of frame data at byte `offset` (both multiples of
    /// the device block). A medium error (sectors of this
    /// device that cannot be read) costs what they held, not the device; it
    /// is counted and answered, and the caller reads another copy, the
    /// backing volume or answers the host's read with it. Any other error
    /// fails the device. A device that failed for every unreadable sector
    /// took the whole cache out for one latent error, and with it every
    /// dirty block a single SSD held (review of 2026-12-06).
    pub(crate) async fn read_frame_at(&self, offset: u64, len: u64) -> BlockResult<Bytes> {
        let r = self
            .read_failing(offset, len, |e| !matches!(e, BlockError::Medium { .. }))
            .await;
        if let Err(BlockError::Medium { lba }) = &r {
            self.media_errors.fetch_add(1, Ordering::Relaxed);
            self.count_recent(1);
            tracing::warn!(device = %self.name(), lba, "cache device: unreadable sector");
        }
        r
    }

    /// [`Device::read_frame_at`] for a copy of the table: a medium error (that
    /// copy's sector cannot be read) does not fail the device, since the
    /// page has other copies and the open's full table write writes it
    /// again; any other error does (review of 2026-12-06: one bad table
    /// sector failed a half of the mirror at every start).
    pub(crate) async fn read_table_at(&self, offset: u64, len: u64) -> BlockResult<Bytes> {
        self.read_failing(offset, len, |e| !matches!(e, BlockError::Medium { .. }))
            .await
    }

    /// Reads `len` bytes at byte `offset`; an error for which `fails` holds
    /// fails the device.
    async fn read_failing(
        &self,
        offset: u64,
        len: u64,
        fails: impl Fn(&BlockError) -> bool,
    ) -> BlockResult<Bytes> {
        if self.is_failed() {
            return Err(BlockError::Unavailable(format!("{} failed", self.name())));
        }
        let r = self
            .vol()
            .read(offset / self.bs, (len / self.bs) as u32)
            .await;
        if let Err(e) = &r {
            if fails(e) {
                self.fail(e);
            }
        }
        r
    }

    /// Writes `data` at byte `offset` (on a device being resilvered too).
    pub(crate) async fn write_at(&self, offset: u64, data: Bytes, fua: bool) -> BlockResult<()> {
        if self.is_failed() && self.resilver_cursor().is_none() {
            return Err(BlockError::Unavailable(format!("{} failed", self.name())));
        }
        let r = self.vol().write(offset / self.bs, data, fua).await;
        if let Err(e) = &r {
            self.fail(e);
        }
        r
    }

    /// Reads both superblock copies and returns the newest valid one.
    /// The newest valid superblock copy, and whether a copy carries the
    /// magic but does not decode (a damaged superblock: this device may hold
    /// a cache's table, so it is not a blank one).
    pub(crate) async fn read_superblock(&self) -> BlockResult<(Option<Superblock>, bool)> {
        // both 4 KiB copies, however large the device's blocks
        let blocks = (2 * 4096u64).div_ceil(self.bs).max(1) as u32;
        let b = self.vol().read(0, blocks).await?;
        let copy = |i: usize| b.get(i * 4096..(i + 1) * 4096).unwrap_or(&[]);
        let (a, c) = (Superblock::decode(copy(0)), Superblock::decode(copy(1)));
        let magic = |i: usize| copy(i).get(0..8) == Some(&MAGIC[..]);
        let damaged = (a.is_none() && magic(0)) || (c.is_none() && magic(1));
        let best = match (a, c) {
            (Some(a), Some(c)) => Some(if a.generation >= c.generation { a } else { c }),
            (a, c) => a.or(c),
        };
        Ok((best, damaged))
    }

    /// Writes `sb` into the copy its generation selects (FUA).
    pub(crate) async fn write_superblock(&self, sb: &Superblock) -> BlockResult<()> {
        let off = (sb.generation % 2) * 4096;
        self.write_at(off, Bytes::from(sb.encode()), true).await
    }

    /// Table page `page` of `layout` on this device: the valid copy of the
    /// highest version and that version, `None` when no copy is valid. A copy
    /// that cannot be read counts as not valid while another reads; the error
    /// when none does.
    pub(crate) async fn read_page(
        &self,
        layout: &DeviceLayout,
        page: u32,
    ) -> BlockResult<Option<(u64, Vec<Record>)>> {
        let mut one = self.read_pages(layout, page, 1).await;
        one.pop().unwrap_or(Ok(None))
    }

    /// Table pages `first..first + n` as [`Device::read_page`] gives each,
    /// with one read per slot (a slot whose read fails is read again page by
    /// page, so one bad sector costs no more than its page).
    pub(crate) async fn read_pages(
        &self,
        layout: &DeviceLayout,
        first: u32,
        n: u32,
    ) -> Vec<BlockResult<Option<(u64, Vec<Record>)>>> {
        let n = n as usize;
        let mut best: Vec<Option<(u64, Vec<Record>)>> = vec![None; n];
        let mut read = vec![false; n];
        let mut error: Vec<Option<BlockError>> = (0..n).map(|_| None).collect();
        for slot in 0..layout.slots {
            let whole = self
                .read_table_at(layout.page_offset(first, slot), n as u64 * PAGE_BYTES)
                .await;
            for i in 0..n {
                let page = first + i as u32;
                let raw = match &whole {
                    Ok(b) => Ok(b.slice(i * PAGE_BYTES as usize..(i + 1) * PAGE_BYTES as usize)),
                    Err(_) => {
                        self.read_table_at(layout.page_offset(page, slot), PAGE_BYTES)
                            .await
                    }
                };
                match raw {
                    Ok(raw) => {
                        read[i] = true;
                        if let Some((seq, recs)) = decode_page(page, &raw) {
                            if best[i].as_ref().is_none_or(|(s, _)| seq > *s) {
                                best[i] = Some((seq, recs));
                            }
                        }
                    }
                    Err(e) => error[i] = Some(e),
                }
            }
        }
        best.into_iter()
            .zip(read)
            .zip(error)
            .map(|((best, read), error)| match error {
                Some(e) if !read => Err(e),
                _ => Ok(best),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn superblock_round_trips_and_rejects_damage() {
        let sb = Superblock {
            cache_id: 77,
            generation: 5,
            mode: CacheMode::WriteBack,
            block_bytes: 131072,
            frames: 1000,
            device_count: 2,
            device_index: 1,
            mirrored: true,
            backing_bytes: 1 << 30,
            backing_id: 0x0123_4567_89ab_cdef_fedc_ba98_7654_3210,
            clean: true,
            partner_failed: false,
            table_slots: 2,
            lost_sectors: false,
        };
        let mut b = sb.encode();
        assert_eq!(Superblock::decode(&b), Some(sb.clone()));
        b[30] ^= 1;
        assert_eq!(Superblock::decode(&b), None);
        // a table that may hold lost sectors round-trips too, and its mode
        // byte is one a version before the flag does not know (it clears
        // only the slots flag): it refuses the superblock
        let lost = Superblock {
            lost_sectors: true,
            ..sb
        };
        let b = lost.encode();
        assert_eq!(Superblock::decode(&b), Some(lost));
        assert_eq!(CacheMode::from_u8(b[24] & !SLOTS_2), None);
    }

    #[test]
    fn pages_round_trip_and_reject_damage() {
        let recs: Vec<Record> = (0..RECORDS_PER_PAGE as u64)
            .map(|i| Record {
                key: i * 3,
                valid: i,
                dirty: i / 2,
            })
            .collect();
        let mut b = encode_page(9, 41, &recs);
        assert_eq!(decode_page(9, &b), Some((41, recs)));
        assert_eq!(decode_page(8, &b), None);
        b[100] ^= 4;
        assert_eq!(decode_page(9, &b), None);
    }

    #[test]
    fn layout_fits_the_device() {
        for bb in [65536u64, 131072, 262144] {
            let dev = 3 * (1 << 30) + 12345;
            for slots in [1, 2] {
                let n = DeviceLayout::fitting(dev, bb, slots);
                let l = DeviceLayout::for_frames(n, bb, slots);
                assert!(l.end() <= dev);
                assert!(DeviceLayout::for_frames(n + 1, bb, slots).end() > dev);
                assert_eq!(l.data_offset % DATA_ALIGN, 0);
                // the last copy of the last page ends before the frames
                let last = l.page_offset(l.table_pages - 1, slots - 1) + PAGE_BYTES;
                assert!(last <= l.data_offset);
                // the keeper's probe page holds nothing: past the table,
                // before the frames or past the last one, on the device
                let free = l.free_page(dev).expect("a page left free");
                let between = last <= free && free + PAGE_BYTES <= l.data_offset;
                let past = l.end() <= free && free + PAGE_BYTES <= dev;
                assert!(between || past, "{free} in {l:?}");
            }
        }
        // a table that ends on the frames' alignment, frames to the page
        // of the device: no free page
        let table_pages = ((DATA_ALIGN - TABLE_OFFSET) / PAGE_BYTES) as u32;
        let l = DeviceLayout::for_frames(table_pages * RECORDS_PER_PAGE as u32, 65536, 1);
        assert_eq!(l.data_offset, DATA_ALIGN);
        assert_eq!(l.free_page(l.end()), None);
        assert_eq!(l.free_page(l.end() + PAGE_BYTES), Some(l.end()));
    }

    /// The recent medium errors halve for every hour that passes (md's rule),
    /// whole hours only, the part of an hour left carried over.
    #[test]
    fn recent_medium_errors_halve_each_hour() {
        let d = Device::new(
            "d".into(),
            std::sync::Arc::new(block::MemVolume::new(512, 8)),
        );
        let t0 = std::time::Instant::now();
        *d.recent.lock() = (t0, 0);
        let hour = std::time::Duration::from_secs(3600);
        assert_eq!(d.count_recent_at(40, t0), 40);
        assert_eq!(d.count_recent_at(0, t0 + hour / 2), 40);
        assert_eq!(d.count_recent_at(0, t0 + hour + hour / 2), 20);
        // half an hour later: the second hour since t0 has passed
        assert_eq!(d.count_recent_at(1, t0 + 2 * hour), 11);
        assert_eq!(d.count_recent_at(0, t0 + 5 * hour), 1);
        assert_eq!(d.count_recent_at(0, t0 + 100 * hour), 0);
    }
}
