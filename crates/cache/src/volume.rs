//! The cache layer: a [`Volume`] over a backing volume and one or more cache devices.
//!
//! Data path, per cache block a request touches (blocks are locked in address order:
//! shared for reads and fills, exclusive for writes, so a fill never races a write):
//! - read: a block cached with every needed sector valid is read from the SSD; a
//!   block the policy admits is filled (the whole block read from the backing
//!   volume, merged under any valid sectors, written to the SSD); otherwise the
//!   backing volume serves it. Sequential streams past the cutoff bypass (reading
//!   dirty sectors from the SSD where there are any).
//! - write-back: the data goes to both mirrored devices (FUA), then the frame's
//!   record (FUA, group-committed per table page); only then is it acknowledged.
//! - the other modes, degraded write-back and bypassed writes: the backing volume
//!   first (FUA if it overwrites dirty sectors), then the cache copy is updated
//!   (read-only, write-through) or dropped (write-around, bypass).
//!
//! Frames in use by an I/O or holding dirty data are pinned in the policy, so the
//! policy never hands them to another block.

use crate::bits::{hull, range_mask, runs, FrameBits};
use crate::config::{CacheConfig, CacheMode};
use crate::path::Step;
use crate::policy::{Access, Policy};
use crate::seq::SeqDetector;
use crate::ssd::{
    encode_page, Device, DeviceLayout, Record, Superblock, MEDIA_ERRORS_MAX, NO_KEY,
    RECORDS_PER_PAGE, SECTOR_BYTES, TABLE_OFFSET,
};
use crate::stats::{self, AdvicePoint, CacheStatus, Counters, DeviceStatus, Window};
use crate::{Advisor, AdvisorConfig};
use async_trait::async_trait;
use block::{
    join_all, BlockError, BlockResult, BoxFut, Bytes, BytesMut, Geometry, Volume, VolumeRef,
};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use tokio::sync::{Notify, RwLock};

const LOCK_STRIPES: usize = 4096;
/// Destage batches failing in a row after which a drain (a detach) gives up
/// with the backing volume's error instead of waiting for ever (the destager
/// retries a failed batch after 1 s).
pub(crate) const DRAIN_FAILED_BATCHES_MAX: u32 = 5;

/// Dirty sectors no cache device could read are tried again by the destage
/// after this long (see [`State::unreadable`]).
pub(crate) const UNREADABLE_RETRY_AFTER: std::time::Duration = std::time::Duration::from_secs(600);

/// A cache device handed to [`CacheVolume::open`].
#[derive(Clone)]
pub struct CacheDevice {
    /// Name shown in status and logs.
    pub name: String,
    /// The device.
    pub volume: VolumeRef,
}

/// What to do with one cache block of a request.
#[derive(Clone, Copy, Debug)]
enum Plan {
    /// Serve from the SSD frame.
    Ssd(u32),
    /// Read the whole block from the backing volume into the frame.
    Fill(u32),
    /// Backing volume only (merging the frame's dirty sectors if `Some`).
    Backing(Option<(u32, u64)>),
    /// The newest data of some sectors was only in a frame whose device is
    /// lost: an error, never the older data of the backing volume.
    Lost,
    /// Dirty sectors of the piece no cache device could read (recorded in
    /// [`State::unreadable`]): a medium error at this host LBA, without
    /// reading the devices again.
    Unreadable(u64),
}

/// The part of a request inside one cache block.
#[derive(Clone, Copy, Debug)]
struct Piece {
    key: u64,
    /// Byte offset of the piece inside the request buffer.
    buf_off: usize,
    /// Byte offset inside the cache block.
    blk_off: u64,
    len: u64,
    /// Sectors the piece touches (partially or wholly).
    mask: u64,
}

pub(crate) struct State {
    pub policy: Box<dyn Policy>,
    pub valid: FrameBits,
    pub dirty: FrameBits,
    io_pins: HashMap<u32, u32>,
    /// Frames a destage batch is writing to the backing volume, with the sectors
    /// written again since its snapshot (those stay dirty when it ends).
    pub destaging: HashMap<u32, u64>,
    /// Per frame, dirty sectors no cache device could read when the destage
    /// last tried, and when: the destage leaves them dirty and reads them no
    /// more until the host writes them again, or [`UNREADABLE_RETRY_AFTER`]
    /// has passed (the error may have been passing). Every pass re-read
    /// them, counting a medium error on each device a second, and their
    /// neighbours' write failed with them.
    /// (tokio's clock: tests move it past the retry time)
    pub unreadable: HashMap<u32, (u64, tokio::time::Instant)>,
    /// The frames that may hold lost sectors ([`State::lost`]): added where
    /// they are made, loaded or put back, dropped by a count that finds none
    /// in them, so the count never walks every frame (it runs at every
    /// status, scrape and watcher poll, under this lock).
    pub lost_frames: std::collections::HashSet<u32>,
    pub dirty_frames: usize,
    pub dirty_sectors: u64,
    pub advisor: Option<Advisor>,
}

impl State {
    /// An empty map of `frames` frames of `spb` sectors.
    fn empty(cfg: &CacheConfig, frames: usize, spb: u32, advisor: Option<Advisor>) -> State {
        State {
            policy: cfg.policy.build_with(cfg.admission, frames),
            valid: FrameBits::new(frames, spb),
            dirty: FrameBits::new(frames, spb),
            io_pins: HashMap::new(),
            destaging: HashMap::new(),
            unreadable: HashMap::new(),
            lost_frames: std::collections::HashSet::new(),
            dirty_frames: 0,
            dirty_sectors: 0,
            advisor,
        }
    }

    fn is_dirty(&self, slot: u32) -> bool {
        self.dirty.get(slot) != 0
    }

    fn repin(&mut self, slot: u32) {
        let pin = self.is_dirty(slot) || self.io_pins.contains_key(&slot);
        self.policy.set_pinned(slot, pin);
    }

    pub(crate) fn pin_io(&mut self, slot: u32) {
        *self.io_pins.entry(slot).or_insert(0) += 1;
        self.policy.set_pinned(slot, true);
    }

    pub(crate) fn unpin_io(&mut self, slot: u32) {
        if let Some(n) = self.io_pins.get_mut(&slot) {
            *n -= 1;
            if *n == 0 {
                self.io_pins.remove(&slot);
            }
        }
        self.repin(slot);
    }

    /// A slot just handed to a new block: nothing in it is valid.
    fn reset(&mut self, slot: u32) {
        debug_assert_eq!(self.dirty.get(slot), 0);
        self.valid.set(slot, 0);
    }

    /// Sets the frame's dirty bitmap, keeping the counts right.
    pub(crate) fn set_dirty(&mut self, slot: u32, dirty: u64) {
        let old = self.dirty.get(slot);
        if old == dirty {
            return;
        }
        // sectors no longer dirty (destaged, written through, discarded,
        // dropped) are no longer unreadable dirty data
        self.readable_again(slot, !dirty);
        self.dirty_sectors =
            self.dirty_sectors + dirty.count_ones() as u64 - old.count_ones() as u64;
        match (old != 0, dirty != 0) {
            (false, true) => self.dirty_frames += 1,
            (true, false) => self.dirty_frames -= 1,
            _ => {}
        }
        self.dirty.set(slot, dirty);
        // (dirty and not valid: lost, loaded or put back as it stood)
        if dirty & !self.valid.get(slot) != 0 {
            self.lost_frames.insert(slot);
        }
        self.repin(slot);
    }

    /// Sectors `mask` of frame `slot` are no longer unreadable dirty data.
    pub(crate) fn readable_again(&mut self, slot: u32, mask: u64) {
        if let Some((u, _)) = self.unreadable.get_mut(&slot) {
            *u &= !mask;
            if *u == 0 {
                self.unreadable.remove(&slot);
            }
        }
    }

    /// The dirty sectors of frame `slot` the destage leaves out now: those no
    /// device could read, unless that was [`UNREADABLE_RETRY_AFTER`] ago
    /// (then they are tried again).
    pub(crate) fn unreadable_now(&mut self, slot: u32) -> u64 {
        match self.unreadable.get(&slot) {
            Some(&(_, since)) if since.elapsed() >= UNREADABLE_RETRY_AFTER => {
                self.unreadable.remove(&slot);
                0
            }
            Some(&(mask, _)) => mask,
            None => 0,
        }
    }

    /// The lost sectors of frame `slot`: dirty and not valid, acknowledged
    /// data no copy holds (a resilver could not read it on the survivor; see
    /// [`Inner::resilver`]). Never read, filled or destaged: reads of them
    /// are medium errors until the host writes them. The table records them
    /// as they are in memory (dirty, not valid), so they outlive a restart.
    pub(crate) fn lost(&self, slot: u32) -> u64 {
        self.dirty.get(slot) & !self.valid.get(slot)
    }

    /// Sectors lost in every frame ([`State::lost`]).
    pub(crate) fn lost_sectors(&mut self) -> u64 {
        let (valid, dirty) = (&self.valid, &self.dirty);
        self.lost_frames
            .retain(|&f| dirty.get(f) & !valid.get(f) != 0);
        self.lost_frames
            .iter()
            .map(|&f| self.lost(f).count_ones() as u64)
            .sum()
    }

    /// The dirty sectors of frame `slot` reads answer with a medium error
    /// without reading them: those recorded unreadable and the lost ones.
    fn unanswerable(&self, slot: u32) -> u64 {
        self.unreadable.get(&slot).map_or(0, |r| r.0) | self.lost(slot)
    }

    pub(crate) fn record(&self, slot: u32) -> Record {
        match self.policy.key_of(slot) {
            Some(key) => Record {
                key,
                valid: self.valid.get(slot),
                dirty: self.dirty.get(slot),
            },
            None => Record::EMPTY,
        }
    }
}

#[derive(Default)]
struct PageCommit {
    want: u64,
    durable: u64,
    writing: bool,
    /// The version of the page last written whole to every live device (its
    /// slot holds it; the next write goes to the other slot). After a full
    /// table write that shifted a device's versions (`shifted`), the highest
    /// any device got: both slots of every device then hold the page as it
    /// is, so the next version may go to either.
    seq: u64,
    /// Devices (bit `d`) whose newest valid copy of the page lies in the slot
    /// of version `seq + 1`, found at open (a page write that tore on that
    /// device only, the other slot holding the version before): the next
    /// full table write numbers their copies one further, so that its first
    /// step writes the torn slot, never that device's one valid copy.
    shifted: u8,
}

/// Table pages read at once when a cache loads its map (1 MiB).
const TABLE_READ_PAGES: u32 = 256;

pub(crate) struct Inner {
    pub name: String,
    pub backing: VolumeRef,
    pub devs: Vec<Device>,
    pub mirrored: bool,
    pub layout: DeviceLayout,
    pub cfg: CacheConfig,
    /// The geometry at open; the block count is `block_count` (it grows).
    geo_at_open: Geometry,
    block_count: AtomicU64,
    /// One grow at a time.
    growing: tokio::sync::Mutex<()>,
    /// Backing block bytes.
    pub bs: u64,
    pub block_bytes: u64,
    pub frames: u32,
    pub state: Mutex<State>,
    locks: Box<[RwLock<()>]>,
    /// Per lock stripe, held shared while a destage batch writes those blocks to
    /// the backing volume and exclusive by anything else that writes them there
    /// (write-through, discard, a write-back write that found no frame), so an
    /// older destaged copy never lands after a newer write. Taken after `locks`.
    backing_locks: Box<[RwLock<()>]>,
    pub counters: Counters,
    pub window: Mutex<Window>,
    seq: Mutex<SeqDetector>,
    pages: Mutex<HashMap<u32, PageCommit>>,
    pages_done: Notify,
    /// Wakes the destager (dirty data appeared, a device failed, a detach waits).
    pub destage_wake: Notify,
    /// Signalled by the destager after each batch.
    pub destage_progress: Notify,
    /// The last batch's failure (None once one succeeds): a drain gives up
    /// after [`DRAIN_FAILED_BATCHES_MAX`] in a row.
    pub destage_failure: Mutex<Option<String>>,
    /// Foreground requests in flight.
    pub fg_inflight: AtomicUsize,
    /// Last time a foreground request started (tokio's clock, so a test can
    /// move it on).
    pub fg_last: Mutex<tokio::time::Instant>,
    pub sb: Mutex<Superblock>,
    /// A mirror device failed: write-back runs as write-through until repaired.
    pub degraded: AtomicBool,
    /// The cache must empty itself of dirty data (detach, mode change).
    pub drain: AtomicBool,
    pub stopping: AtomicBool,
    gate: RwLock<()>,
    /// The survivor's superblock says its partner failed (written before any write
    /// that skipped the failed device is acknowledged).
    failure_recorded: AtomicBool,
    sb_write: tokio::sync::Mutex<()>,
    /// The mirror halves may still differ on dirty sectors (an unclean stop,
    /// `even_mirror` not done): a clean stop then still writes the table as
    /// not clean, so the next start evens them again.
    uneven: AtomicBool,
}

/// An SSD cache in front of a backing volume.
pub struct CacheVolume {
    pub(crate) inner: Arc<Inner>,
    tasks: Mutex<Vec<tokio::task::JoinHandle<()>>>,
}

struct FgGuard<'a>(&'a Inner);

impl Drop for FgGuard<'_> {
    fn drop(&mut self) {
        self.0.fg_inflight.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Inner {
    fn fg(&self) -> FgGuard<'_> {
        self.fg_inflight.fetch_add(1, Ordering::AcqRel);
        *self.fg_last.lock() = tokio::time::Instant::now();
        FgGuard(self)
    }

    pub(crate) fn mode(&self) -> CacheMode {
        self.cfg.mode
    }

    /// Whether writes go to the cache first right now.
    fn writes_back(&self) -> bool {
        self.cfg.mode == CacheMode::WriteBack
            && !self.degraded.load(Ordering::Acquire)
            && !self.drain.load(Ordering::Acquire)
    }

    fn live_devices(&self) -> usize {
        self.devs.iter().filter(|d| !d.is_failed()).count()
    }

    /// The lock stripes of cache blocks `keys`, sorted and deduplicated (every
    /// caller takes them in this order, so lockers never deadlock).
    fn stripes(keys: &[u64]) -> Vec<usize> {
        let mut stripes: Vec<usize> = keys.iter().map(|k| (*k as usize) % LOCK_STRIPES).collect();
        stripes.sort_unstable();
        stripes.dedup();
        stripes
    }

    /// Read guards on the stripes of `keys` in `locks`, taken in stripe order.
    async fn read_guards<'a>(
        locks: &'a [RwLock<()>],
        keys: &[u64],
    ) -> Vec<tokio::sync::RwLockReadGuard<'a, ()>> {
        let mut g = Vec::new();
        for s in Self::stripes(keys) {
            g.push(locks[s].read().await);
        }
        g
    }

    /// Write guards on the stripes of `keys` in `locks`, taken in stripe order.
    async fn write_guards<'a>(
        locks: &'a [RwLock<()>],
        keys: &[u64],
    ) -> Vec<tokio::sync::RwLockWriteGuard<'a, ()>> {
        let mut g = Vec::new();
        for s in Self::stripes(keys) {
            g.push(locks[s].write().await);
        }
        g
    }

    /// Locks the cache blocks `keys` shared (reads, fills, destage).
    pub(crate) async fn lock_shared(
        &self,
        keys: &[u64],
    ) -> Vec<tokio::sync::RwLockReadGuard<'_, ()>> {
        Self::read_guards(&self.locks, keys).await
    }

    /// Locks the cache blocks `keys` exclusive (writes, discards).
    async fn lock_exclusive(&self, keys: &[u64]) -> Vec<tokio::sync::RwLockWriteGuard<'_, ()>> {
        Self::write_guards(&self.locks, keys).await
    }

    /// Locks the backing copies of cache blocks `keys` shared (a destage batch
    /// writing them), taken while holding their [`Inner::lock_shared`] locks.
    pub(crate) async fn lock_backing_shared(
        &self,
        keys: &[u64],
    ) -> Vec<tokio::sync::RwLockReadGuard<'_, ()>> {
        Self::read_guards(&self.backing_locks, keys).await
    }

    /// Locks the backing copies of cache blocks `keys` exclusive: waits for any
    /// destage batch still writing them. Taken while holding their
    /// [`Inner::lock_exclusive`] locks.
    async fn lock_backing_exclusive(
        &self,
        keys: &[u64],
    ) -> Vec<tokio::sync::RwLockWriteGuard<'_, ()>> {
        Self::write_guards(&self.backing_locks, keys).await
    }

    /// The pieces of a byte range `[off, off + len)` of the volume, one per block.
    fn pieces(&self, off: u64, len: u64) -> Vec<Piece> {
        let mut out = Vec::new();
        let mut pos = off;
        while pos < off + len {
            let key = pos / self.block_bytes;
            let blk_off = pos % self.block_bytes;
            let n = (self.block_bytes - blk_off).min(off + len - pos);
            let first = (blk_off / SECTOR_BYTES) as u32;
            let last = ((blk_off + n).div_ceil(SECTOR_BYTES)) as u32;
            out.push(Piece {
                key,
                buf_off: (pos - off) as usize,
                blk_off,
                len: n,
                mask: range_mask(first, last - first),
            });
            pos += n;
        }
        out
    }

    /// Sectors of block `key` that exist (the last block may be short).
    fn block_len(&self, key: u64) -> u64 {
        let size = self.geo().size_bytes();
        (size - key * self.block_bytes).min(self.block_bytes)
    }

    fn full_mask(&self, key: u64) -> u64 {
        range_mask(0, self.block_len(key).div_ceil(SECTOR_BYTES) as u32)
    }

    /// Device(s) and byte offset of a frame's data.
    fn frame_devices(&self, slot: u32) -> (Vec<usize>, u64) {
        if self.mirrored {
            (
                (0..self.devs.len()).collect(),
                self.layout.frame_offset(slot),
            )
        } else {
            let n = self.devs.len() as u32;
            (
                vec![(slot % n) as usize],
                self.layout.frame_offset(slot / n),
            )
        }
    }

    /// Copies the sectors `mask` names of the frame at byte `base` (a block
    /// of `len` bytes) from device `src` to device `dst`, run by run. A run
    /// `src` cannot read is a medium error, `src` kept in service (see
    /// [`Device::read_frame_at`]); any other error fails the device.
    async fn copy_runs(
        &self,
        src: usize,
        dst: usize,
        base: u64,
        mask: u64,
        len: u64,
    ) -> BlockResult<()> {
        for (first, n) in runs(mask) {
            let start = first as u64 * SECTOR_BYTES;
            let end = ((first + n) as u64 * SECTOR_BYTES).min(len);
            let data = (self.devs[src])
                .read_frame_at(base + start, end - start)
                .await?;
            self.devs[dst].write_at(base + start, data, false).await?;
        }
        Ok(())
    }

    /// Reads `len` bytes at `off` inside frame `slot` from a live copy. A copy
    /// that answers a medium error stays in service: the next copy is read,
    /// and one that reads is written over the unreadable one (the same bytes,
    /// so a torn write cannot lose anything; a disk remaps a sector it is
    /// written), as md's RAID 1 corrects a read error. With no copy left that
    /// reads, the medium error is the answer (at the SSD's block: see
    /// [`Inner::host_medium`]).
    pub(crate) async fn ssd_read(&self, slot: u32, off: u64, len: u64) -> BlockResult<Bytes> {
        let (devs, base) = self.frame_devices(slot);
        let mut last = BlockError::Unavailable("no cache device left".into());
        let mut unreadable = Vec::new();
        // The sectors the frame holds now: only they are written over an
        // unreadable copy. The span read may cover sectors it does not hold,
        // which a fill running beside this read (fills share the block's
        // lock) may be writing; written back from here, their old bytes
        // would land over the fill's (review of 2026-12-06). Sectors held
        // cannot change while the caller holds the block's lock.
        // (one copy: nothing to write again, and no lock on a read hit's path)
        let held = match devs.len() > 1 {
            true => self.state.lock().valid.get(slot),
            false => 0,
        };
        // spread mirrored reads over both copies
        let start = slot as usize % devs.len().max(1);
        for i in 0..devs.len() {
            let at = devs[(start + i) % devs.len()];
            let d = &self.devs[at];
            if d.is_failed() {
                continue;
            }
            match d.read_frame_at(base + off, len).await {
                Ok(b) => {
                    for &bad in &unreadable {
                        self.write_again(bad, base, off, &b, held).await;
                    }
                    return Ok(b);
                }
                Err(e) => {
                    Counters::add(&self.counters.ssd_errors, 1);
                    if !matches!(e, BlockError::Medium { .. }) {
                        self.on_device_failure();
                    } else if !self.fail_if_wearing_out(at) {
                        unreadable.push(at);
                    }
                    last = e;
                }
            }
        }
        Err(last)
    }

    /// After a medium error on device `at`: fails it if it met more than
    /// [`MEDIA_ERRORS_MAX`] of them lately and it is a half of a whole
    /// mirror (the other half then holds every frame alone, as after any
    /// failure: the cache goes write-through and says so, and the half is
    /// replaced). Never the last copy: a single device, or a survivor, with
    /// unreadable sectors still serves the rest of its data. True if it
    /// failed it.
    fn fail_if_wearing_out(&self, at: usize) -> bool {
        let d = &self.devs[at];
        let recent = d.recent_media_errors();
        if recent <= MEDIA_ERRORS_MAX
            || !self.mirrored
            || self.live_devices() < self.devs.len()
            || self.devs.iter().any(|d| d.resilver_cursor().is_some())
        {
            return false;
        }
        let why = BlockError::Unavailable(format!(
            "{recent} unreadable sectors met lately (more than {MEDIA_ERRORS_MAX}, halved each hour): taken out of the mirror"
        ));
        if d.fail(&why) {
            self.on_device_failure();
        }
        true
    }

    /// The destage could not read `len` bytes at `off` of frame `slot` from
    /// any device (a medium error). If the span held clean sectors, the
    /// frame forgets them ([`Inner::forget_clean`]): they may be the
    /// unreadable ones, and the next pass reads the dirty ones alone.
    /// Otherwise the span is read again a sector at a time, and the dirty
    /// sectors no device can read are recorded as [`State::unreadable`].
    /// The caller holds the block's lock.
    pub(crate) async fn unreadable_found(&self, slot: u32, off: u64, len: u64) {
        const PIECE: u64 = SECTOR_BYTES;
        let span = sector_mask(off, len);
        let (valid, dirty) = {
            let st = self.state.lock();
            (st.valid.get(slot), st.dirty.get(slot))
        };
        if valid & span & !dirty != 0 {
            self.forget_clean(slot);
            return;
        }
        let mut bad = 0;
        let mut at = off;
        while at < off + len {
            let n = (PIECE - at % PIECE).min(off + len - at);
            if let Err(BlockError::Medium { .. }) = self.ssd_read(slot, at, n).await {
                bad |= sector_mask(at, n);
            }
            at += n;
        }
        let mut st = self.state.lock();
        let bad = bad & st.dirty.get(slot);
        if bad != 0 {
            let now = tokio::time::Instant::now();
            let e = st.unreadable.entry(slot).or_insert((0, now));
            *e = (e.0 | bad, now);
        }
    }

    /// After a medium error in frame `slot`: forgets the clean sectors it
    /// holds (the backing volume has them; the next fill writes them again,
    /// which a disk remaps) and returns the dirty ones it holds. Reducing what a frame
    /// holds to its dirty sectors is safe under a shared lock of its block.
    pub(crate) fn forget_clean(&self, slot: u32) -> u64 {
        let mut st = self.state.lock();
        let dirty = st.dirty.get(slot);
        let valid = st.valid.get(slot);
        st.valid.set(slot, valid & dirty);
        // (lost sectors are dirty and not held)
        valid & dirty
    }

    /// Writes `data`, read at `off` of a frame at `base` from another copy,
    /// over device `dev`'s unreadable copy: the sectors of it that `held`
    /// names only, run by run. A write that fails fails the device.
    async fn write_again(&self, dev: usize, base: u64, off: u64, data: &Bytes, held: u64) {
        let d: &Device = &self.devs[dev];
        let span = off..off + data.len() as u64;
        for (first, n) in runs(held) {
            let start = (first as u64 * SECTOR_BYTES).max(span.start);
            let end = ((first + n) as u64 * SECTOR_BYTES).min(span.end);
            if start >= end {
                continue;
            }
            let part = data.slice((start - off) as usize..(end - off) as usize);
            if d.write_at(base + start, part, false).await.is_err() {
                // the write failed the device
                self.on_device_failure();
                return;
            }
        }
        tracing::info!(device = %d.name(), "cache device: unreadable sectors written again from the other copy");
    }

    /// A medium error [`Inner::ssd_read`] gave for frame `slot`, which holds
    /// block `key`, at the host's block instead of the SSD's (the sense data
    /// names it), within `span` (byte offset and length in the block: the
    /// request's piece; an SSD sector larger than the host's block could
    /// otherwise name one before it). Any other error as it is.
    fn host_medium(&self, e: BlockError, key: u64, slot: u32, span: (u64, u64)) -> BlockError {
        let BlockError::Medium { lba } = e else {
            return e;
        };
        let (devs, base) = self.frame_devices(slot);
        let dbs = devs.first().map_or(1, |&d| self.devs[d].block_bytes());
        let (from, len) = span;
        let in_frame = (lba * dbs)
            .saturating_sub(base)
            .clamp(from, from + len.max(1) - 1);
        BlockError::Medium {
            lba: (key * self.block_bytes + in_frame) / self.bs,
        }
    }

    /// Writes into frame `slot` on every live copy; Ok if at least one took it.
    async fn ssd_write(&self, slot: u32, off: u64, data: Bytes, fua: bool) -> BlockResult<()> {
        let (devs, base) = self.frame_devices(slot);
        let futs: Vec<BoxFut<'_, BlockResult<()>>> = devs
            .iter()
            .filter(|&&d| self.devs[d].takes_frame(slot))
            .map(|&d| {
                let data = data.clone();
                Box::pin(async move { self.devs[d].write_at(base + off, data, fua).await })
                    as BoxFut<'_, _>
            })
            .collect();
        if futs.is_empty() {
            return Err(BlockError::Unavailable("no cache device left".into()));
        }
        let results = join_all(futs).await;
        let ok = results.iter().filter(|r| r.is_ok()).count();
        if ok < results.len() {
            Counters::add(&self.counters.ssd_errors, (results.len() - ok) as u64);
            self.on_device_failure();
        }
        if ok == 0 {
            return Err(results
                .into_iter()
                .find_map(|r| r.err())
                .unwrap_or(BlockError::Unavailable("cache write failed".into())));
        }
        self.record_failure().await
    }

    /// When a mirror half has failed, makes sure the survivor's superblock says so
    /// (a newer generation than the failed half's) before a write that only the
    /// survivor holds is acknowledged; after a restart the stale half is then
    /// never trusted.
    pub(crate) async fn record_failure(&self) -> BlockResult<()> {
        if !self.mirrored
            || self.failure_recorded.load(Ordering::Acquire)
            || self.live_devices() == self.devs.len()
        {
            return Ok(());
        }
        let g = self.sb_write.lock().await;
        if self.failure_recorded.load(Ordering::Acquire) {
            return Ok(());
        }
        self.write_superblocks_locked(&g, |_| {}).await?;
        self.failure_recorded.store(true, Ordering::Release);
        tracing::warn!(cache = %self.name, "the surviving cache device records its partner's failure");
        Ok(())
    }

    /// A device failed: a mirror goes write-through and destages from the survivor;
    /// a striped cache forgets the failed device's frames (they are re-read from the
    /// backing volume).
    fn on_device_failure(&self) {
        if self.mirrored {
            if self.live_devices() < self.devs.len() && !self.degraded.swap(true, Ordering::AcqRel)
            {
                tracing::error!(
                    cache = %self.name,
                    "a mirrored cache device failed: write-through until repaired; destaging from the survivor"
                );
                self.destage_wake.notify_one();
            }
        } else {
            let n = self.devs.len() as u32;
            let mut st = self.state.lock();
            for slot in 0..self.frames {
                if self.devs[(slot % n) as usize].is_failed() && !st.io_pins.contains_key(&slot) {
                    if let Some(key) = st.policy.key_of(slot) {
                        st.valid.set(slot, 0);
                        st.policy.remove(key);
                    }
                }
            }
        }
    }

    /// After an unclean stop, makes the two mirror halves agree on every
    /// dirty sector: a write in flight at the crash (not acknowledged) may
    /// have reached one half only. Reads of a frame go to one half while both
    /// live (`ssd_read`), so what they return stays the same as long as that
    /// half does; but if it failed later, reads would turn to the other and
    /// the data would change without a write. Each dirty frame's dirty
    /// sectors are copied from the half its reads use to the other, with the
    /// block locked against writers and the frame pinned; then the other half
    /// is flushed. In the background: reads and writes go on meanwhile.
    async fn even_mirror(&self) {
        // the dirty sectors at the start: those the halves may disagree on
        // (a destage may clean them before they are reached: they stay valid,
        // and are copied all the same)
        let todo: Vec<(u64, u32, u64)> = {
            let st = self.state.lock();
            (0..self.frames)
                .filter_map(|slot| {
                    let d = st.dirty.get(slot);
                    (d != 0).then_some(())?;
                    st.policy.key_of(slot).map(|key| (key, slot, d))
                })
                .collect()
        };
        tracing::info!(cache = %self.name, frames = todo.len(),
            "unclean stop: making the mirror halves agree on the dirty blocks");
        /// Unpins the frame when dropped, the task aborted included.
        struct Pinned<'a>(&'a Inner, u32);
        impl Drop for Pinned<'_> {
            fn drop(&mut self) {
                self.0.state.lock().unpin_io(self.1);
            }
        }
        let mut copied = 0usize;
        for (key, slot, was_dirty) in todo {
            if self.stopping.load(Ordering::Acquire) {
                return;
            }
            let (devs, base) = self.frame_devices(slot);
            let src = devs[slot as usize % devs.len()];
            let Some(&dst) = devs.iter().find(|&&d| d != src) else {
                return;
            };
            if self.devs[src].is_failed() || self.devs[dst].is_failed() {
                // one half left: nothing to agree with
                self.uneven.store(false, Ordering::Release);
                return;
            }
            let _lock = self.lock_shared(&[key]).await;
            let (mask, _pin) = {
                let mut st = self.state.lock();
                let m = was_dirty & st.valid.get(slot);
                if st.policy.key_of(slot) != Some(key) || m == 0 {
                    continue;
                }
                st.pin_io(slot);
                (m, Pinned(self, slot))
            };
            let len = self.block_len(key);
            let mut ok = true;
            // run by run: sectors the first half cannot read, the halves
            // agree on the second half's copy (either version of a write the
            // crash cut short may stand), rather than the first half failing
            // for them; the runs after them are still copied
            for (first, n) in runs(mask) {
                let run = range_mask(first, n);
                let r = match self.copy_runs(src, dst, base, run, len).await {
                    Err(BlockError::Medium { .. }) => {
                        self.copy_runs(dst, src, base, run, len).await
                    }
                    r => r,
                };
                match r {
                    Ok(()) => {}
                    Err(BlockError::Medium { .. }) => {
                        tracing::error!(cache = %self.name, block = key,
                            "cache: dirty data unreadable on both mirror halves");
                    }
                    Err(_) => {
                        ok = false;
                        break;
                    }
                }
            }
            if !ok {
                // a half failed (marked by read_frame_at or write_at): degraded
                self.on_device_failure();
                let _ = self.record_failure().await;
                self.uneven.store(false, Ordering::Release);
                return;
            }
            copied += 1;
        }
        for d in &self.devs {
            if !d.is_failed() {
                if let Err(e) = d.vol().flush().await {
                    d.fail(&e);
                    self.on_device_failure();
                    let _ = self.record_failure().await;
                    break;
                }
            }
        }
        self.uneven.store(false, Ordering::Release);
        tracing::info!(cache = %self.name, frames = copied, "mirror halves agree on the dirty blocks");
    }

    /// The resilver's copy of the dirty sectors `dirty` of frame `slot`
    /// (holding block `key`, locked exclusively and pinned by the caller)
    /// from `survivor` to `d`, which met a medium error: the sectors the
    /// survivor cannot read, one at a time, become lost ([`State::lost`]:
    /// durably, in both superblock copies' flag first, then in the frame's
    /// record) and the others are copied. Reads of lost sectors are medium
    /// errors until the host writes them, as RAID's lost blocks are, and
    /// the mirror becomes whole again; nothing is written over them (the
    /// next host write does, and a disk remaps a sector it is written).
    async fn copy_around_lost(
        &self,
        survivor: usize,
        d: usize,
        slot: u32,
        key: u64,
        dirty: u64,
    ) -> BlockResult<()> {
        let base = self.layout.frame_offset(slot);
        let len = self.block_bytes;
        let mut bad = 0u64;
        for (first, n) in runs(dirty) {
            for s in first..first + n {
                let at = s as u64 * SECTOR_BYTES;
                let part = SECTOR_BYTES.min(len - at);
                match self.devs[survivor].read_frame_at(base + at, part).await {
                    Ok(_) => {}
                    Err(BlockError::Medium { .. }) => bad |= 1 << s,
                    Err(e) => return Err(e),
                }
            }
        }
        if bad != 0 {
            self.allow_lost_sectors().await?;
            let lost = {
                let mut st = self.state.lock();
                let v = st.valid.get(slot);
                st.valid.set(slot, v & !bad);
                st.lost_frames.insert(slot);
                st.lost(slot)
            };
            self.persist_pages(&[slot / RECORDS_PER_PAGE as u32])
                .await?;
            tracing::error!(cache = %self.name, block = key,
                host_lba = (key * self.block_bytes
                    + bad.trailing_zeros() as u64 * SECTOR_BYTES) / self.bs,
                lost_bytes = bad.count_ones() as u64 * SECTOR_BYTES,
                frame_lost_bytes = lost.count_ones() as u64 * SECTOR_BYTES,
                "cache: dirty data the surviving mirror half cannot read is LOST; \
                 reads of it fail (medium error) until the host writes it again");
        }
        self.copy_runs(survivor, d, base, dirty & !bad, len).await
    }

    /// Copies every frame of the survivor onto replaced mirror half `d` (see
    /// [`CacheVolume::replace_device`]), then makes it live and writes its map.
    async fn resilver(&self, d: usize) -> BlockResult<()> {
        let survivor = 1 - d;
        for slot in 0..self.frames {
            loop {
                if self.devs[d].resilver_cursor().is_none() {
                    return Err(BlockError::Unavailable(
                        "the replacement device failed".into(),
                    ));
                }
                let key = {
                    let st = self.state.lock();
                    let key = st.policy.key_of(slot);
                    if key.is_none() {
                        // an empty frame: nothing to copy, but a block given the
                        // frame from now on must reach the new device too (ordered
                        // by the state lock, under which frames are given out)
                        self.devs[d].set_resilver_cursor(slot + 1);
                    }
                    key
                };
                let Some(key) = key else { break };
                let _g = self.lock_exclusive(&[key]).await;
                {
                    let mut st = self.state.lock();
                    if st.policy.key_of(slot) != Some(key) {
                        continue;
                    }
                    // not handed to another block while it is copied
                    st.pin_io(slot);
                }
                let base = self.layout.frame_offset(slot);
                // the sectors the frame holds only: a latent error in sectors
                // it never wrote must not fail the survivor, and with it the
                // replacement (review of 2026-12-06)
                let valid = self.state.lock().valid.get(slot);
                let mut copied = self
                    .copy_runs(survivor, d, base, valid, self.block_bytes)
                    .await;
                if let Err(BlockError::Medium { .. }) = copied {
                    // sectors the survivor cannot read: its clean ones are
                    // forgotten (the backing has them) and the dirty ones
                    // copied alone; dirty ones that cannot be read are
                    // lost, and the rest copied around them. Before (review
                    // of 2026-12-06) the survivor failed, and with it every
                    // dirty block of the cache; then (until 2026-12-07) the
                    // replacement was given up, the cache left without
                    // redundancy, write-through, for a few sectors.
                    let dirty = self.forget_clean(slot);
                    copied = match self
                        .copy_runs(survivor, d, base, dirty, self.block_bytes)
                        .await
                    {
                        Err(BlockError::Medium { .. }) => {
                            self.copy_around_lost(survivor, d, slot, key, dirty).await
                        }
                        r => r,
                    };
                }
                // the cursor passes the frame before the frame is let go: a
                // block given the frame next is written to both halves
                if copied.is_ok() {
                    self.devs[d].set_resilver_cursor(slot + 1);
                }
                self.state.lock().unpin_io(slot);
                copied?;
                break;
            }
            if slot % 64 == 63 {
                // foreground I/O first
                tokio::task::yield_now().await;
            }
        }
        // every block locked: no write or map update in flight while the device
        // becomes live and gets the whole map
        let mut all = Vec::with_capacity(LOCK_STRIPES);
        for l in self.locks.iter() {
            all.push(l.write().await);
        }
        // and no destage batch still writing (it updates the map when it ends)
        let mut out = Vec::with_capacity(LOCK_STRIPES);
        for l in self.backing_locks.iter() {
            out.push(l.write().await);
        }
        self.devs[d].vol().flush().await?;
        self.devs[d].finish_resilver();
        self.write_full_table(false).await?;
        // a half that failed its table write just now (write_full_table goes
        // on with the survivor) leaves the cache degraded
        if self.live_devices() < self.devs.len() {
            let which = if self.devs[d].is_failed() {
                "the replaced device"
            } else {
                "the surviving device (the replaced one now holds the cache alone)"
            };
            return Err(BlockError::Unavailable(format!(
                "cache {}: {which} failed while the table was written",
                self.name
            )));
        }
        self.failure_recorded.store(false, Ordering::Release);
        self.degraded.store(false, Ordering::Release);
        Ok(())
    }

    /// Whether frame `slot` lives only on failed devices.
    pub(crate) fn frame_lost(&self, slot: u32) -> bool {
        let (devs, _) = self.frame_devices(slot);
        devs.iter().all(|&d| self.devs[d].is_failed())
    }

    fn advise(&self, st: &mut State, key: u64, step: Step) {
        if let Some(a) = st.advisor.as_mut() {
            a.record_step(key, step);
        }
    }

    // ---------------------------------------------------------------- reads

    async fn read_bytes(&self, off: u64, len: u64, bypass: bool) -> BlockResult<BytesMut> {
        let pieces = self.pieces(off, len);
        let keys: Vec<u64> = pieces.iter().map(|p| p.key).collect();
        let _locks = self.lock_shared(&keys).await;
        let plans = {
            let mut st = self.state.lock();
            let mut plans = Vec::with_capacity(pieces.len());
            for p in &pieces {
                let step = Step::read(bypass);
                self.advise(&mut st, p.key, step);
                let access = step.apply(&mut *st.policy, p.key);
                // dirty sectors no device could read answer as a disk's
                // pending sector does, until written or tried again: read
                // again at every host retry, their medium errors would take a
                // mirror half out for one lost sector
                // (a record past its retry time stays: the destage, which
                // reads the sectors again, is the one to drop it)
                // (and so do lost ones, for good)
                let recorded = match access {
                    Access::Hit { slot } => st.unanswerable(slot) & p.mask,
                    _ => 0,
                };
                let plan = if recorded != 0 {
                    Plan::Unreadable(self.first_of(p, recorded))
                } else if bypass {
                    match access {
                        // data the cache holds is served from it, stream or not
                        Access::Hit { slot }
                            if st.valid.get(slot) & p.mask == p.mask && !self.frame_lost(slot) =>
                        {
                            st.pin_io(slot);
                            Plan::Ssd(slot)
                        }
                        Access::Hit { slot }
                            if st.dirty.get(slot) & p.mask != 0 && !self.frame_lost(slot) =>
                        {
                            st.pin_io(slot);
                            Plan::Backing(Some((slot, st.dirty.get(slot) & p.mask)))
                        }
                        Access::Hit { slot } if st.dirty.get(slot) & p.mask != 0 => Plan::Lost,
                        _ => Plan::Backing(None),
                    }
                } else {
                    match access {
                        Access::Hit { slot } if self.frame_lost(slot) => {
                            if st.dirty.get(slot) & p.mask != 0 {
                                Plan::Lost
                            } else {
                                Plan::Backing(None)
                            }
                        }
                        Access::Hit { slot } => {
                            st.pin_io(slot);
                            if st.valid.get(slot) & p.mask == p.mask {
                                Plan::Ssd(slot)
                            } else {
                                Plan::Fill(slot)
                            }
                        }
                        Access::Inserted { slot, .. } => {
                            st.reset(slot);
                            st.pin_io(slot);
                            if self.frame_lost(slot) {
                                // striped set lost this frame's device: keep it out
                                st.unpin_io(slot);
                                st.policy.remove(p.key);
                                Plan::Backing(None)
                            } else {
                                Plan::Fill(slot)
                            }
                        }
                        Access::Bypassed => Plan::Backing(None),
                    }
                };
                match plan {
                    Plan::Ssd(_) => Counters::add(&self.counters.read_hits, 1),
                    Plan::Unreadable(_) => {}
                    _ => Counters::add(&self.counters.read_misses, 1),
                }
                plans.push(plan);
            }
            if bypass {
                Counters::add(&self.counters.bypassed_reads, 1);
            }
            plans
        };
        let mut out = BytesMut::zeroed(len as usize);
        let futs: Vec<BoxFut<'_, BlockResult<Bytes>>> = pieces
            .iter()
            .zip(plans.iter())
            .map(|(p, plan)| Box::pin(self.read_piece(*p, *plan)) as BoxFut<'_, _>)
            .collect();
        let results = join_all(futs).await;
        {
            let mut st = self.state.lock();
            for plan in &plans {
                match *plan {
                    Plan::Ssd(s) | Plan::Fill(s) | Plan::Backing(Some((s, _))) => st.unpin_io(s),
                    Plan::Backing(None) | Plan::Lost | Plan::Unreadable(_) => {}
                }
            }
        }
        for (p, r) in pieces.iter().zip(results) {
            let data = r?;
            out[p.buf_off..p.buf_off + p.len as usize].copy_from_slice(&data);
        }
        Ok(out)
    }

    /// Reads one piece as planned; returns exactly `p.len` bytes.
    async fn read_piece(&self, p: Piece, plan: Plan) -> BlockResult<Bytes> {
        match plan {
            Plan::Ssd(slot) => {
                let s0 = p.blk_off / SECTOR_BYTES * SECTOR_BYTES;
                let s1 = (p.blk_off + p.len).div_ceil(SECTOR_BYTES) * SECTOR_BYTES;
                let s1 = s1.min(self.block_len(p.key));
                match self.ssd_read(slot, s0, s1 - s0).await {
                    Ok(b) => {
                        Ok(b.slice((p.blk_off - s0) as usize..(p.blk_off - s0 + p.len) as usize))
                    }
                    // the backing volume has the data unless some of it is
                    // dirty here (the frame is pinned: its bits are its own)
                    Err(e) => {
                        let medium = matches!(e, BlockError::Medium { .. });
                        // the clean sectors it held are the backing's:
                        // forgotten, the next read fills them, which writes
                        // the unreadable one again
                        let dirty = match medium {
                            true => self.forget_clean(slot),
                            false => self.state.lock().dirty.get(slot),
                        } & p.mask;
                        if dirty == 0 {
                            return self.read_piece_backing(p, None).await;
                        }
                        // unreadable dirty sectors are this read's error; the
                        // error may lie in a clean sector of the span read
                        let r = match medium {
                            true => self.read_piece_backing(p, Some((slot, dirty))).await,
                            false => Err(e),
                        };
                        if let Err(e) = &r {
                            tracing::error!(cache = %self.name, block = p.key, error = %e,
                                "cache: dirty data unreadable on every cache device");
                        }
                        r
                    }
                }
            }
            Plan::Backing(d) => self.read_piece_backing(p, d).await,
            Plan::Lost => Err(BlockError::Unavailable(
                "cache: the newest data of this block was on a lost cache device".into(),
            )),
            Plan::Fill(slot) => self.fill(p, slot).await,
            Plan::Unreadable(lba) => {
                tracing::debug!(cache = %self.name, block = p.key, lba,
                    "cache: read of dirty data no cache device could read");
                Err(BlockError::Medium { lba })
            }
        }
    }

    /// The host LBA of the first of the sectors `mask` names within piece `p`.
    fn first_of(&self, p: &Piece, mask: u64) -> u64 {
        let first = mask.trailing_zeros() as u64 * SECTOR_BYTES;
        (p.key * self.block_bytes + first.max(p.blk_off)) / self.bs
    }

    async fn backing_read(&self, off: u64, len: u64) -> BlockResult<Bytes> {
        let r = self
            .backing
            .read(off / self.bs, (len / self.bs) as u32)
            .await;
        if r.is_err() {
            Counters::add(&self.counters.backing_errors, 1);
        }
        r
    }

    /// The piece from the backing volume, with the frame's dirty sectors laid over it.
    async fn read_piece_backing(&self, p: Piece, dirty: Option<(u32, u64)>) -> BlockResult<Bytes> {
        let base = p.key * self.block_bytes;
        let data = self.backing_read(base + p.blk_off, p.len).await?;
        let Some((slot, mask)) = dirty else {
            return Ok(data);
        };
        // the dirty sectors only, each run within the piece's sector-aligned
        // span (review of 2026-12-06: the whole span was read, and a latent
        // error in a sector never written there failed the device)
        let s0 = p.blk_off / SECTOR_BYTES * SECTOR_BYTES;
        let s1 =
            ((p.blk_off + p.len).div_ceil(SECTOR_BYTES) * SECTOR_BYTES).min(self.block_len(p.key));
        let mut out = BytesMut::from(&data[..]);
        let host = |e| self.host_medium(e, p.key, slot, (p.blk_off, p.len));
        // dirty sectors no device can read are recorded, so the host's
        // retries are answered from the record rather than reading every
        // copy again (and counting its medium errors) each time
        let lost = |start: u64, end: u64, e: BlockError| async move {
            if matches!(e, BlockError::Medium { .. }) {
                self.unreadable_found(slot, start, end - start).await;
            }
            host(e)
        };
        // one read, from the first dirty sector to the last
        if let Some((first, n)) = hull(mask) {
            let start = (first as u64 * SECTOR_BYTES).max(s0);
            let end = ((first + n) as u64 * SECTOR_BYTES).min(s1);
            if start < end {
                match self.ssd_read(slot, start, end - start).await {
                    Ok(cached) => overlay(&mut out, p.blk_off, &cached, start, mask),
                    // then run by run: an unreadable sector between the runs
                    // is not this read's (one run: the same read again, no)
                    Err(BlockError::Medium { .. }) if runs(mask).nth(1).is_some() => {
                        for (first, n) in runs(mask) {
                            let start = (first as u64 * SECTOR_BYTES).max(s0);
                            let end = ((first + n) as u64 * SECTOR_BYTES).min(s1);
                            if start < end {
                                match self.ssd_read(slot, start, end - start).await {
                                    Ok(cached) => {
                                        overlay(&mut out, p.blk_off, &cached, start, mask)
                                    }
                                    Err(e) => return Err(lost(start, end, e).await),
                                }
                            }
                        }
                    }
                    Err(e) => return Err(lost(start, end, e).await),
                }
            }
        }
        Ok(out.freeze())
    }

    /// Fills frame `slot` with block `p.key` and returns the piece.
    async fn fill(&self, p: Piece, slot: u32) -> BlockResult<Bytes> {
        let blen = self.block_len(p.key);
        let base = p.key * self.block_bytes;
        let backing = self.backing_read(base, blen).await?;
        let (mut valid, dirty, lost) = {
            let st = self.state.lock();
            (st.valid.get(slot), st.dirty.get(slot), st.lost(slot))
        };
        let mut block = BytesMut::from(&backing[..]);
        // sectors the cache holds are as new as or newer than the backing
        // volume's: one read from the first of them to the last, never the
        // sectors past them (review of 2026-12-06: the whole frame was read,
        // and a latent error in sectors never written there failed a device,
        // the survivor of a degraded mirror among them)
        if let Some((first, n)) = hull(valid) {
            let start = first as u64 * SECTOR_BYTES;
            let end = ((first + n) as u64 * SECTOR_BYTES).min(blen);
            match self.ssd_read(slot, start, end - start).await {
                Ok(cached) => overlay(&mut block, 0, &cached, start, valid),
                // Unreadable sectors: the clean ones the frame held are the
                // backing's and are forgotten, so the fill writes them again
                // (a disk remaps a sector it is written); the dirty ones are
                // read alone, and if they cannot be, that is this read's error
                // (the frame keeps them dirty, the device stays in service).
                Err(BlockError::Medium { .. }) => {
                    valid = self.forget_clean(slot);
                    if let Some((first, n)) = hull(dirty & !lost) {
                        let start = first as u64 * SECTOR_BYTES;
                        let end = ((first + n) as u64 * SECTOR_BYTES).min(blen);
                        match self.ssd_read(slot, start, end - start).await {
                            Ok(cached) => overlay(&mut block, 0, &cached, start, dirty & !lost),
                            // Not filled: this piece from the backing with
                            // the dirty sectors it covers read alone (their
                            // error is this read's only if they are its own)
                            Err(_) => {
                                let r = self
                                    .read_piece_backing(p, Some((slot, dirty & p.mask)))
                                    .await;
                                if let Err(e) = &r {
                                    tracing::error!(cache = %self.name, block = p.key, error = %e,
                                        "cache: dirty data unreadable on every cache device");
                                }
                                return r;
                            }
                        }
                    }
                }
                Err(e) if dirty != 0 => {
                    tracing::error!(error = %e, "cache: dirty data unreadable on every cache device");
                    return Err(e);
                }
                // clean: the backing volume's copy is as new, served as it is
                // (the read failed the devices that could not serve it)
                Err(_) => {
                    Counters::add(&self.counters.fills, 1);
                    return Ok(backing.slice(p.blk_off as usize..(p.blk_off + p.len) as usize));
                }
            }
        }
        let block = block.freeze();
        Counters::add(&self.counters.fills, 1);
        // only the sectors the frame lacks are written: those it holds (dirty
        // ones among them, acknowledged data whose only copies these are) are
        // never rewritten in place, where a power cut mid-write could tear them
        // (from the length read: a grow meanwhile must not mark sectors valid
        // that were not written)
        // Lost sectors are not filled either: the backing's data there is
        // older than what was acknowledged, and marked valid it would be
        // served as the newest (they cannot change meanwhile: a write takes
        // the block's lock exclusively, and the destage leaves them out)
        let full = range_mask(0, blen.div_ceil(SECTOR_BYTES) as u32) & !lost;
        let mut written = true;
        for (first, n) in runs(full & !valid) {
            let start = first as u64 * SECTOR_BYTES;
            let end = ((first + n) as u64 * SECTOR_BYTES).min(blen);
            let data = block.slice(start as usize..end as usize);
            if self.ssd_write(slot, start, data, false).await.is_err() {
                written = false;
                break;
            }
        }
        if written {
            self.state.lock().valid.set(slot, full);
        }
        Ok(block.slice(p.blk_off as usize..(p.blk_off + p.len) as usize))
    }

    // ---------------------------------------------------------------- writes

    async fn write_bytes(&self, off: u64, data: Bytes, fua: bool) -> BlockResult<()> {
        // observed on arrival, before any wait, to see a stream in its issue order
        let bypass = self.seq.lock().observe(
            off,
            data.len() as u64,
            self.fg_inflight.load(Ordering::Relaxed),
        );
        // sub-sector writes are widened to whole sectors by reading around them
        let s0 = off / SECTOR_BYTES * SECTOR_BYTES;
        let s1 = (off + data.len() as u64).div_ceil(SECTOR_BYTES) * SECTOR_BYTES;
        let s1 = s1.min(self.geo().size_bytes());
        let pieces = self.pieces(s0, s1 - s0);
        let keys: Vec<u64> = pieces.iter().map(|p| p.key).collect();
        let _locks = self.lock_exclusive(&keys).await;
        let end = off + data.len() as u64;
        let (off, data) = if s0 != off || s1 != end {
            // Only the sectors the write covers in part are read: the one it
            // starts in, the one it ends in (one read if they are the same).
            // The whole span was read, so a write covering a lost or
            // unreadable sector whole, but not starting or ending on a
            // sector's edge, failed with it, and the sector could never be
            // written good again by such a host (review of 2026-12-07).
            let mut wide = BytesMut::zeroed((s1 - s0) as usize);
            let mut edges = Vec::with_capacity(2);
            if s0 != off {
                edges.push(s0);
            }
            let last = end / SECTOR_BYTES * SECTOR_BYTES;
            if s1 != end && edges.last() != Some(&last) {
                edges.push(last);
            }
            for e in edges {
                let e_end = (e + SECTOR_BYTES).min(s1);
                // a medium error meeting the sectors around the write is the
                // write's, at its own first block
                let b = self
                    .read_unlocked_plain(e, e_end - e)
                    .await
                    .map_err(|err| match err {
                        BlockError::Medium { .. } => BlockError::Medium { lba: off / self.bs },
                        err => err,
                    })?;
                wide[(e - s0) as usize..(e_end - s0) as usize].copy_from_slice(&b);
            }
            let at = (off - s0) as usize;
            wide[at..at + data.len()].copy_from_slice(&data);
            (s0, wide.freeze())
        } else {
            (off, data)
        };
        if bypass {
            Counters::add(&self.counters.bypassed_writes, 1);
        }
        if self.writes_back() && !bypass {
            self.write_back(&pieces, data).await
        } else {
            let _out = self.lock_backing_exclusive(&keys).await;
            self.write_through(&pieces, off, data, fua, bypass).await
        }
    }

    /// Reads the current contents (cache or backing) without locking or admitting:
    /// used under a write's exclusive locks to widen a sub-sector write.
    async fn read_unlocked_plain(&self, off: u64, len: u64) -> BlockResult<BytesMut> {
        let pieces = self.pieces(off, len);
        let mut out = BytesMut::zeroed(len as usize);
        for p in pieces {
            // the backing's data with the frame's dirty sectors over it: its
            // clean ones are the backing's (as for a bypassed read), so they
            // are not read from the SSDs, where one unreadable would fail the
            // write
            let hit = {
                let mut st = self.state.lock();
                // dirty sectors recorded unreadable, or lost: the write's
                // error, as a read's (their frame may hold anything there)
                let slot = st.policy.get(p.key);
                if let Some(slot) = slot {
                    let recorded = st.unanswerable(slot) & p.mask;
                    if recorded != 0 {
                        return Err(BlockError::Medium {
                            lba: self.first_of(&p, recorded),
                        });
                    }
                }
                match slot {
                    Some(slot) if st.dirty.get(slot) & p.mask != 0 && !self.frame_lost(slot) => {
                        st.pin_io(slot);
                        Some((slot, st.dirty.get(slot) & p.mask))
                    }
                    _ => None,
                }
            };
            let r = self.read_piece_backing(p, hit).await;
            if let Some((slot, _)) = hit {
                self.state.lock().unpin_io(slot);
            }
            let b = r?;
            out[p.buf_off..p.buf_off + p.len as usize].copy_from_slice(&b);
        }
        Ok(out)
    }

    async fn write_back(&self, pieces: &[Piece], data: Bytes) -> BlockResult<()> {
        // plan: a frame for every block (a full cache of dirty blocks sends the block
        // straight to the backing volume)
        let slots: Vec<Option<u32>> = {
            let mut st = self.state.lock();
            let slots: Vec<Option<u32>> = pieces
                .iter()
                .map(|p| {
                    self.advise(&mut st, p.key, Step::Admit);
                    match Step::Admit.apply(&mut *st.policy, p.key) {
                        Access::Hit { slot } if !self.frame_lost(slot) => {
                            Counters::add(&self.counters.write_hits, 1);
                            st.pin_io(slot);
                            Some(slot)
                        }
                        Access::Inserted { slot, .. } if !self.frame_lost(slot) => {
                            Counters::add(&self.counters.write_misses, 1);
                            st.reset(slot);
                            st.pin_io(slot);
                            Some(slot)
                        }
                        Access::Bypassed => {
                            // every frame holds dirty data (or is in use)
                            Counters::add(&self.counters.write_misses, 1);
                            Counters::add(&self.counters.frameless_writes, 1);
                            None
                        }
                        _ => {
                            Counters::add(&self.counters.write_misses, 1);
                            None
                        }
                    }
                })
                .collect();
            // A block whose dirty sectors sat on devices that failed since
            // this write took the write-back path (both halves going at once):
            // written to the backing and acknowledged, it would leave their
            // record standing, and the next start would bring the old data
            // back over it. It fails as a read of them does; the write-through
            // path (taken from now on) drops such sectors only once the record
            // says so.
            let lost_dirty = pieces.iter().zip(&slots).any(|(p, s)| {
                s.is_none()
                    && st.policy.get(p.key).is_some_and(|slot| {
                        self.frame_lost(slot) && st.dirty.get(slot) & p.mask != 0
                    })
            });
            if lost_dirty {
                for slot in slots.iter().flatten() {
                    st.unpin_io(*slot);
                }
                return Err(BlockError::Unavailable(
                    "cache: the newest data of this block was on a lost cache device".into(),
                ));
            }
            slots
        };
        let mut _out = Vec::new();
        if slots.iter().any(|s| s.is_none()) {
            self.destage_wake.notify_one();
            let direct: Vec<u64> = pieces
                .iter()
                .zip(slots.iter())
                .filter(|(_, s)| s.is_none())
                .map(|(p, _)| p.key)
                .collect();
            _out = self.lock_backing_exclusive(&direct).await;
        }
        let futs: Vec<BoxFut<'_, BlockResult<()>>> = pieces
            .iter()
            .zip(slots.iter())
            .map(|(p, slot)| {
                let d = data.slice(p.buf_off..p.buf_off + p.len as usize);
                let p = *p;
                let slot = *slot;
                Box::pin(async move {
                    match slot {
                        Some(slot) => self.ssd_write(slot, p.blk_off, d, true).await,
                        None => {
                            let r = self
                                .backing
                                .write((p.key * self.block_bytes + p.blk_off) / self.bs, d, true)
                                .await;
                            if r.is_err() {
                                Counters::add(&self.counters.backing_errors, 1);
                            }
                            r
                        }
                    }
                }) as BoxFut<'_, _>
            })
            .collect();
        let results = join_all(futs).await;
        let mut pages = Vec::new();
        {
            let mut st = self.state.lock();
            for ((p, slot), r) in pieces.iter().zip(slots.iter()).zip(results.iter()) {
                let Some(slot) = *slot else { continue };
                if r.is_ok() {
                    let v = st.valid.get(slot) | p.mask;
                    st.valid.set(slot, v);
                    let d = st.dirty.get(slot) | p.mask;
                    st.set_dirty(slot, d);
                    if let Some(again) = st.destaging.get_mut(&slot) {
                        *again |= p.mask;
                    }
                    // written again: readable, and the destage's to write
                    st.readable_again(slot, p.mask);
                    pages.push(slot / RECORDS_PER_PAGE as u32);
                }
                st.unpin_io(slot);
            }
        }
        pages.sort_unstable();
        pages.dedup();
        self.persist_pages(&pages).await?;
        if let Some(e) = results.into_iter().find_map(|r| r.err()) {
            return Err(e);
        }
        if self.dirty_share() > self.cfg.dirty_low_percent as f64 / 100.0 {
            self.destage_wake.notify_one();
        }
        Ok(())
    }

    async fn write_through(
        &self,
        pieces: &[Piece],
        off: u64,
        data: Bytes,
        fua: bool,
        bypass: bool,
    ) -> BlockResult<()> {
        let overlaps_dirty = {
            let st = self.state.lock();
            pieces.iter().any(|p| {
                st.policy
                    .get(p.key)
                    .is_some_and(|s| st.dirty.get(s) & p.mask != 0)
            })
        };
        let r = self
            .backing
            .write(off / self.bs, data.clone(), fua || overlaps_dirty)
            .await;
        if let Err(e) = r {
            Counters::add(&self.counters.backing_errors, 1);
            return Err(e);
        }
        // update or drop the cache's copy
        let step = Step::write(self.mode(), self.writes_back(), bypass);
        let update = step != Step::Drop;
        // frames whose dirty sectors this write drops stay pinned until the record
        // saying so is durable (else the frame could be reused under a dirty record)
        let mut dropped: Vec<u32> = Vec::new();
        // (slot, valid, dirty) as they stood before this write dropped sectors
        let mut before: Vec<(u32, u64, u64)> = Vec::new();
        let slots: Vec<Option<u32>> = {
            let mut st = self.state.lock();
            pieces
                .iter()
                .map(|p| {
                    self.advise(&mut st, p.key, step);
                    let access = step.apply(&mut *st.policy, p.key);
                    Counters::add(
                        if step.is_hit(&access) {
                            &self.counters.write_hits
                        } else {
                            &self.counters.write_misses
                        },
                        1,
                    );
                    let found = match access {
                        Access::Hit { slot } => Some(slot),
                        Access::Inserted { slot, .. } => {
                            st.reset(slot);
                            Some(slot)
                        }
                        Access::Bypassed => None,
                    };
                    let slot = found?;
                    if update && !self.frame_lost(slot) {
                        st.pin_io(slot);
                        Some(slot)
                    } else {
                        // drop the written sectors from the cache
                        let v0 = st.valid.get(slot);
                        st.valid.set(slot, v0 & !p.mask);
                        let d = st.dirty.get(slot);
                        if d & p.mask != 0 {
                            st.pin_io(slot);
                            dropped.push(slot);
                            before.push((slot, v0, d));
                            st.set_dirty(slot, d & !p.mask);
                        }
                        None
                    }
                })
                .collect()
        };
        let futs: Vec<BoxFut<'_, BlockResult<()>>> = pieces
            .iter()
            .zip(slots.iter())
            .filter_map(|(p, s)| {
                let slot = (*s)?;
                let d = data.slice(p.buf_off..p.buf_off + p.len as usize);
                let p = *p;
                Some(
                    Box::pin(async move { self.ssd_write(slot, p.blk_off, d, false).await })
                        as BoxFut<'_, _>,
                )
            })
            .collect();
        let results = join_all(futs).await;
        let mut pages = Vec::new();
        // frames whose dirty sectors this write made clean stay pinned until
        // the records saying so are durable: reused before, a crash would bring
        // back a "dirty" record over another block's data (as for `dropped`)
        let mut cleaned = Vec::new();
        // (slot, dirty before) of cleaned frames that now hold the new data,
        // and of those whose SSD write failed
        let mut cleaned_ok: Vec<(u32, u64)> = Vec::new();
        let mut cleaned_failed: Vec<(u32, u64)> = Vec::new();
        {
            let mut st = self.state.lock();
            let mut results = results.into_iter();
            for (p, s) in pieces.iter().zip(slots.iter()) {
                let Some(slot) = *s else {
                    continue;
                };
                let ok = matches!(results.next(), Some(Ok(())));
                let v = if ok {
                    st.valid.get(slot) | p.mask
                } else {
                    st.valid.get(slot) & !p.mask
                };
                st.valid.set(slot, v);
                let d = st.dirty.get(slot);
                if d & p.mask != 0 {
                    st.set_dirty(slot, d & !p.mask);
                    pages.push(slot / RECORDS_PER_PAGE as u32);
                    cleaned.push(slot);
                    if ok {
                        cleaned_ok.push((slot, d));
                    } else {
                        cleaned_failed.push((slot, d));
                    }
                } else {
                    st.unpin_io(slot);
                }
            }
        }
        pages.extend(dropped.iter().map(|s| s / RECORDS_PER_PAGE as u32));
        pages.sort_unstable();
        pages.dedup();
        let r = self.persist_pages(&pages).await;
        if !dropped.is_empty() || !cleaned.is_empty() {
            let mut st = self.state.lock();
            if r.is_err() {
                // The records still say "dirty" on the SSD: memory says so
                // again, so the frames are not reused under them (a crash
                // would bring the record back over another block's data) and
                // a retried write meets the same state, not a clean one it
                // would acknowledge. Dropped frames still hold their old
                // data; cleaned ones the new data, on the backing too. A
                // cleaned frame whose SSD write failed holds neither: it
                // stays pinned (never reused) until the cache restarts, its
                // sectors dirty and not valid, so reads of them fail as lost
                // and a retried write meets dirty sectors again (review of
                // 2026-12-06: left clean, the retry went to the backing and
                // was acknowledged, and at the next start the record brought
                // the old dirty data back over it).
                for &(slot, v, d) in &before {
                    st.valid.set(slot, v);
                    st.set_dirty(slot, d);
                }
                for &(slot, d) in cleaned_ok.iter().chain(&cleaned_failed) {
                    st.set_dirty(slot, d);
                }
                let keep: Vec<u32> = cleaned_failed.iter().map(|&(s, _)| s).collect();
                for slot in dropped.into_iter().chain(cleaned) {
                    if !keep.contains(&slot) {
                        st.unpin_io(slot);
                    }
                }
                return r;
            }
            for slot in dropped.into_iter().chain(cleaned) {
                st.unpin_io(slot);
            }
        }
        r
    }

    pub(crate) fn dirty_share(&self) -> f64 {
        self.state.lock().dirty_frames as f64 / self.frames.max(1) as f64
    }

    // ---------------------------------------------------------------- the map

    /// Makes the records of `pages` durable on every live mirrored device as they
    /// stand in memory now (group commit: one write covers every change made
    /// before it started). A no-op for striped caches (their map is written at a
    /// clean shutdown only).
    pub(crate) async fn persist_pages(&self, pages: &[u32]) -> BlockResult<()> {
        if !self.mirrored {
            return Ok(());
        }
        for &page in pages {
            let my = {
                let mut pc = self.pages.lock();
                let e = pc.entry(page).or_default();
                e.want += 1;
                e.want
            };
            loop {
                let notified = self.pages_done.notified();
                tokio::pin!(notified);
                notified.as_mut().enable();
                let lead = {
                    let mut pc = self.pages.lock();
                    let e = pc.entry(page).or_default();
                    if e.durable >= my {
                        break;
                    }
                    if e.writing {
                        None
                    } else {
                        e.writing = true;
                        Some((e.want, e.seq + 1))
                    }
                };
                let Some((version, seq)) = lead else {
                    notified.await;
                    continue;
                };
                // into the slot not holding the last durable copy: a write
                // torn by a power cut leaves that one whole
                let bytes = Bytes::from(self.page_bytes(page, seq));
                let r = self.write_page_all(page, seq, bytes).await;
                {
                    let mut pc = self.pages.lock();
                    let e = pc.entry(page).or_default();
                    e.writing = false;
                    if r.is_ok() {
                        e.durable = e.durable.max(version);
                        e.seq = seq;
                    }
                }
                self.pages_done.notify_waiters();
                r?;
            }
        }
        Ok(())
    }

    /// The encoded table page `page` of a mirrored cache, from memory, as version `seq`.
    fn page_bytes(&self, page: u32, seq: u64) -> Vec<u8> {
        let st = self.state.lock();
        let first = page * RECORDS_PER_PAGE as u32;
        let last = (first + RECORDS_PER_PAGE as u32).min(self.layout.local_frames);
        let recs: Vec<Record> = (first..last).map(|slot| st.record(slot)).collect();
        encode_page(page, seq, &recs)
    }

    async fn write_page_all(&self, page: u32, seq: u64, bytes: Bytes) -> BlockResult<()> {
        let off = self.layout.page_offset(page, self.layout.slot_of(seq));
        let futs: Vec<BoxFut<'_, BlockResult<()>>> = self
            .devs
            .iter()
            .filter(|d| !d.is_failed())
            .map(|d| {
                let b = bytes.clone();
                Box::pin(async move { d.write_at(off, b, true).await }) as BoxFut<'_, _>
            })
            .collect();
        let results = join_all(futs).await;
        if results.iter().any(|r| r.is_err()) {
            self.on_device_failure();
        }
        if results.iter().any(|r| r.is_ok()) {
            self.record_failure().await
        } else {
            Err(BlockError::Unavailable(
                "no cache device took the map update".into(),
            ))
        }
    }

    /// Writes every table page of every live device and the superblocks with `clean`.
    ///
    /// Every page's version moves on by the table's slots (one more where a
    /// device's copies are `shifted`): each slot of each page is written
    /// once, as one version above the last, the second slot only once the
    /// first is flushed. Callers keep page writes out meanwhile
    /// (open, stop, detach, the resilver's end).
    pub(crate) async fn write_full_table(&self, clean: bool) -> BlockResult<()> {
        // a table holding lost sectors goes only where both superblock
        // copies already say it may
        if self.state.lock().lost_sectors() != 0 {
            self.allow_lost_sectors().await?;
        }
        let (base, shifted): (Vec<u64>, Vec<u8>) = {
            let pc = self.pages.lock();
            (0..self.layout.table_pages)
                .map(|p| pc.get(&p).map_or((0, 0), |e| (e.seq, e.shifted)))
                .unzip()
        };
        let mut failed = None;
        for (d, dev) in self.devs.iter().enumerate() {
            if dev.is_failed() {
                continue;
            }
            // per page, this device's versions start one further where its
            // newest valid copy is in the slot the next version goes to
            let first: Vec<u64> = base
                .iter()
                .zip(&shifted)
                .map(|(b, sh)| b + 1 + u64::from(d < 8 && sh >> d & 1 != 0))
                .collect();
            if let Err(e) = self.write_device_table(d, dev, &first).await {
                dev.fail(&e);
                tracing::error!(cache = %self.name, device = %dev.name(), error = %e,
                    "writing the cache's table failed; the device is failed");
                failed = Some(e);
            }
        }
        {
            // (the highest version any device got: both slots of every live
            // device now hold the page as it is, so the next version may go
            // to either slot of a device whose versions were shifted)
            let mut pc = self.pages.lock();
            for (p, (b, sh)) in base.iter().zip(&shifted).enumerate() {
                let e = pc.entry(p as u32).or_default();
                e.seq = b + self.layout.slots as u64 + u64::from(*sh != 0);
                e.shifted = 0;
            }
        }
        if let Some(e) = failed {
            self.on_device_failure();
            // a mirror goes on with its survivor, a striped cache with the
            // devices left, their failed device's frames forgotten (the
            // superblocks below, a generation on, say the failed device's
            // table is stale); none left, the caller serves without the cache
            if self.live_devices() == 0 {
                return Err(e);
            }
        }
        // the table just written holds lost sectors or not (callers keep
        // writes out, and only the resilver, which is one of them, makes
        // sectors lost): a version before lost sectors may read it again
        // once it holds none
        let lost = self.state.lock().lost_sectors() != 0;
        self.write_superblocks(|sb| {
            sb.clean = clean;
            sb.lost_sectors = lost;
        })
        .await
    }

    /// Makes both superblock copies of every live device say the table may
    /// hold lost sectors, before a record holding one is written: a version
    /// before them refuses such a superblock, and with one copy alone it
    /// would take the other, older, and read the table wrongly.
    async fn allow_lost_sectors(&self) -> BlockResult<()> {
        if self.sb.lock().lost_sectors {
            return Ok(());
        }
        for _ in 0..2 {
            self.write_superblocks(|sb| sb.lost_sectors = true).await?;
        }
        Ok(())
    }

    /// Writes device `d`'s whole table, every slot, each page's versions from
    /// `first` on, and flushes it after each slot.
    async fn write_device_table(&self, d: usize, dev: &Device, first: &[u64]) -> BlockResult<()> {
        for step in 0..self.layout.slots as u64 {
            for page in 0..self.layout.table_pages {
                let seq = first[page as usize] + step;
                let bytes = {
                    let st = self.state.lock();
                    let first = page * RECORDS_PER_PAGE as u32;
                    let last = (first + RECORDS_PER_PAGE as u32).min(self.layout.local_frames);
                    let recs: Vec<Record> = (first..last)
                        .map(|local| {
                            let slot = self.slot_of_local(d, local);
                            if slot < self.frames {
                                st.record(slot)
                            } else {
                                Record::EMPTY
                            }
                        })
                        .collect();
                    encode_page(page, seq, &recs)
                };
                let at = self.layout.page_offset(page, self.layout.slot_of(seq));
                dev.write_at(at, Bytes::from(bytes), false).await?;
            }
            dev.vol().flush().await?;
        }
        Ok(())
    }

    fn slot_of_local(&self, dev: usize, local: u32) -> u32 {
        if self.mirrored {
            local
        } else {
            local * self.devs.len() as u32 + dev as u32
        }
    }

    /// Bumps the generation, applies `f` and writes every live device's superblock.
    /// One at a time: a superblock computed before a failure must not land
    /// after the one that records it.
    pub(crate) async fn write_superblocks(
        &self,
        f: impl FnOnce(&mut Superblock),
    ) -> BlockResult<()> {
        let g = self.sb_write.lock().await;
        self.write_superblocks_locked(&g, f).await
    }

    /// [`Inner::write_superblocks`] under the caller's hold of `sb_write`.
    async fn write_superblocks_locked(
        &self,
        _held: &tokio::sync::MutexGuard<'_, ()>,
        f: impl FnOnce(&mut Superblock),
    ) -> BlockResult<()> {
        let sb = {
            let mut sb = self.sb.lock();
            sb.generation += 1;
            sb.partner_failed = self.mirrored && self.live_devices() < self.devs.len();
            f(&mut sb);
            sb.clone()
        };
        let (mut ok, mut failed) = (0, false);
        for (i, dev) in self.devs.iter().enumerate() {
            if dev.is_failed() {
                continue;
            }
            let mut mine = sb.clone();
            mine.device_index = i as u8;
            if dev.write_superblock(&mine).await.is_ok() {
                ok += 1;
            } else {
                failed = true;
            }
        }
        if failed {
            // the device failed (write_at marked it): the cache is degraded
            // from now on, and says so (before, only data-path failures did)
            self.on_device_failure();
        }
        if ok == 0 {
            return Err(BlockError::Unavailable("no cache device left".into()));
        }
        Ok(())
    }

    /// The cache's state as [`CacheStatus::state`] says it.
    fn state_line(&self) -> String {
        if self.live_devices() == 0 {
            "failed: no cache device left (serving from the backing volume)".to_string()
        } else if self.degraded.load(Ordering::Acquire) {
            "degraded: a mirror device failed, write-through until repaired".to_string()
        } else if !self.mirrored && self.live_devices() < self.devs.len() {
            format!(
                "degraded: {} of {} cache devices failed (their blocks are read from the backing volume)",
                self.devs.len() - self.live_devices(),
                self.devs.len()
            )
        } else if self.drain.load(Ordering::Acquire) {
            "draining: destaging every dirty block".to_string()
        } else {
            "ok".to_string()
        }
    }

    /// Every device's state as [`CacheStatus::devices`] says it.
    fn device_states(&self) -> Vec<DeviceStatus> {
        self.devs
            .iter()
            .map(|d| DeviceStatus {
                name: d.name(),
                media_errors: d.media_errors(),
                state: match d.resilver_cursor() {
                    Some(c) => format!(
                        "resilvering {:.0}%",
                        100.0 * c as f64 / self.frames.max(1) as f64
                    ),
                    None if d.is_failed() => "failed".into(),
                    None => "ok".into(),
                },
            })
            .collect()
    }

    pub(crate) fn status(&self) -> CacheStatus {
        let now = self.counters.snapshot();
        let rates = stats::rates(now, self.window.lock().oldest());
        let mut st = self.state.lock();
        let map = st.policy.memory_bytes() + st.valid.memory_bytes() + st.dirty.memory_bytes();
        let capacity_bytes = self.frames as u64 * self.block_bytes;
        let (curve, advice, advisor_mem) = match &st.advisor {
            Some(a) => (
                a.curve()
                    .iter()
                    .map(|p| AdvicePoint {
                        cache_bytes: p.cache_blocks * self.block_bytes,
                        hit_ratio: p.hit_ratio,
                    })
                    .collect(),
                a.recommend(0.9).map(|b| b * self.block_bytes),
                a.memory_bytes() as u64,
            ),
            None => (Vec::new(), None, 0),
        };
        let state = self.state_line();
        let lost_bytes = st.lost_sectors() * SECTOR_BYTES;
        CacheStatus {
            name: self.name.clone(),
            mode: self.cfg.mode.name().to_string(),
            state,
            block_bytes: self.block_bytes as u32,
            frames: self.frames,
            capacity_bytes,
            cached_blocks: st.policy.len() as u64,
            valid_bytes: (0..self.frames)
                .filter(|&f| st.policy.key_of(f).is_some())
                .map(|f| st.valid.get(f).count_ones() as u64 * SECTOR_BYTES)
                .sum(),
            occupancy_percent: 100.0 * st.policy.len() as f64 / self.frames.max(1) as f64,
            dirty_blocks: st.dirty_frames as u64,
            dirty_bytes: st.dirty_sectors * SECTOR_BYTES,
            unreadable_dirty_bytes: st
                .unreadable
                .iter()
                .map(|(&f, (m, _))| (m & !st.lost(f)).count_ones() as u64 * SECTOR_BYTES)
                .sum::<u64>()
                + lost_bytes,
            lost_dirty_bytes: lost_bytes,
            read_hits: now.read_hits,
            read_misses: now.read_misses,
            write_hits: now.write_hits,
            write_misses: now.write_misses,
            read_hit_ratio: rates.read,
            write_hit_ratio: rates.write,
            recent_read_hit_ratio: rates.recent_read,
            recent_write_hit_ratio: rates.recent_write,
            bypassed_reads: self.counters.bypassed_reads.load(Ordering::Relaxed),
            bypassed_writes: self.counters.bypassed_writes.load(Ordering::Relaxed),
            fills: self.counters.fills.load(Ordering::Relaxed),
            destaged_bytes: now.destaged_bytes,
            destage_mb_s: rates.destage_mb_s,
            destage_errors: self.counters.destage_errors.load(Ordering::Relaxed),
            backing_errors: self.counters.backing_errors.load(Ordering::Relaxed),
            frameless_writes: self.counters.frameless_writes.load(Ordering::Relaxed),
            stripe_destages: self.counters.stripe_destages.load(Ordering::Relaxed),
            devices: self.device_states(),
            map_memory_bytes: map as u64,
            map_bytes_per_gib: if capacity_bytes == 0 {
                0
            } else {
                (map as u128 * (1u128 << 30) / capacity_bytes as u128) as u64
            },
            advisor_memory_bytes: advisor_mem,
            advisor_curve: curve,
            advisor_bytes_for_90_percent: advice,
        }
    }
}

/// The sectors a span of `len` bytes at `off` of a block touches.
fn sector_mask(off: u64, len: u64) -> u64 {
    let first = off / SECTOR_BYTES;
    let end = (off + len).div_ceil(SECTOR_BYTES);
    range_mask(first as u32, (end - first) as u32)
}

/// Copies the sectors in `mask` from `src` (which starts at block offset `src_off`)
/// into `dst` (which starts at block offset `dst_off`), clipped to both buffers.
fn overlay(dst: &mut [u8], dst_off: u64, src: &[u8], src_off: u64, mask: u64) {
    let mut m = mask;
    while m != 0 {
        let s = m.trailing_zeros() as u64;
        m &= m - 1;
        let a = (s * SECTOR_BYTES).max(dst_off).max(src_off);
        let b = ((s + 1) * SECTOR_BYTES)
            .min(dst_off + dst.len() as u64)
            .min(src_off + src.len() as u64);
        if a < b {
            dst[(a - dst_off) as usize..(b - dst_off) as usize]
                .copy_from_slice(&src[(a - src_off) as usize..(b - src_off) as usize]);
        }
    }
}

impl CacheVolume {
    /// Opens (or, on blank devices, creates) the cache `name` over `backing`.
    ///
    /// Write-back needs exactly two devices (mirrored); the other modes stripe over
    /// one or more. Existing devices are recognised by their superblocks: after a
    /// clean shutdown every cached block comes back; after a crash a write-back
    /// cache reloads its dirty blocks (and destages them) and the other modes start
    /// empty. A cache that holds dirty data refuses to open with a different block
    /// size, device count or backing size.
    pub async fn open(
        name: &str,
        backing: VolumeRef,
        devices: Vec<CacheDevice>,
        cfg: CacheConfig,
    ) -> BlockResult<CacheVolume> {
        Self::open_as(name, backing, devices, cfg, false).await
    }

    /// Creates the cache `name` on `devices` afresh, ignoring whatever they hold:
    /// for attaching a cache that this process detached (and so emptied) before,
    /// possibly with a replaced device. Never use it on devices that may hold
    /// dirty data.
    pub async fn create_fresh(
        name: &str,
        backing: VolumeRef,
        devices: Vec<CacheDevice>,
        cfg: CacheConfig,
    ) -> BlockResult<CacheVolume> {
        Self::open_as(name, backing, devices, cfg, true).await
    }

    async fn open_as(
        name: &str,
        backing: VolumeRef,
        devices: Vec<CacheDevice>,
        cfg: CacheConfig,
        fresh: bool,
    ) -> BlockResult<CacheVolume> {
        cfg.validate().map_err(BlockError::Unavailable)?;
        // a stall every device shares (a node starting under it) is waited
        // out, not failed device by device
        crate::keep::keep_while_opening(&devices);
        let geo = backing.geometry();
        let bs = geo.block_size_bytes as u64;
        if !SECTOR_BYTES.is_multiple_of(bs) || !geo.size_bytes().is_multiple_of(SECTOR_BYTES) {
            return Err(BlockError::Unavailable(format!(
                "cache {name}: the backing volume's block size ({bs}) must divide 4096 and its size be a multiple of 4 KiB"
            )));
        }
        let mirrored = cfg.mode == CacheMode::WriteBack;
        if mirrored && devices.len() != 2 {
            return Err(BlockError::Unavailable(format!(
                "cache {name}: write-back needs two devices (a mirror), got {}",
                devices.len()
            )));
        }
        if devices.is_empty() || devices.len() > 16 {
            return Err(BlockError::Unavailable(format!(
                "cache {name}: needs 1..=16 devices"
            )));
        }
        let devs: Vec<Device> = devices
            .into_iter()
            .map(|d| Device::new(d.name, d.volume))
            .collect();
        let block_bytes = cfg.block_bytes as u64;
        let min_dev = devs.iter().map(|d| d.size_bytes()).min().unwrap_or(0);
        let layout_with = |slots: u32| {
            let mut local = DeviceLayout::fitting(min_dev, block_bytes, slots);
            if let Some(limit) = cfg.size_bytes {
                // (a configured size past 2^32 frames is as many as a device may hold)
                let want = (limit / block_bytes).min(u32::MAX as u64) as u32;
                let per_dev = if mirrored {
                    want
                } else {
                    want.div_ceil(devs.len() as u32)
                };
                local = local.min(per_dev);
            }
            if local == 0 {
                return Err(BlockError::Unavailable(format!(
                    "cache {name}: devices too small for one {block_bytes}-byte frame"
                )));
            }
            Ok(DeviceLayout::for_frames(local, block_bytes, slots))
        };
        // two copies of the table where it holds dirty records (see `ssd`)
        let mut layout = layout_with(if mirrored { 2 } else { 1 })?;
        let spb = (block_bytes / SECTOR_BYTES) as u32;

        // what the devices say
        let mut sbs = Vec::new();
        // the newest generation any superblock copy on the devices holds: a
        // fresh cache starts above it, or an older cache's copy (the slot
        // the fresh one has not written yet) would be taken as the newest at
        // the next start, with its identity and its "clean" table
        let mut floor = 0;
        // devices that may hold a table no valid superblock describes: one
        // that cannot be read, one whose superblock is damaged
        let mut unknown = Vec::new();
        // read together: a stall they share is waited out once, not once
        // per device in turn
        type Read = BlockResult<(Option<Superblock>, bool)>;
        let reads: Vec<BoxFut<'_, Read>> = devs
            .iter()
            .map(|d| -> BoxFut<'_, Read> { Box::pin(d.read_superblock()) })
            .collect();
        let read = join_all(reads).await;
        for (d, sb) in devs.iter().zip(read) {
            let sb = match sb {
                Ok((sb, damaged)) => {
                    if damaged && sb.is_none() {
                        unknown.push(format!("{}: damaged superblock", d.name()));
                    }
                    sb
                }
                Err(e) => {
                    tracing::warn!(cache = %name, device = %d.name(), error = %e,
                        "cache device superblock unreadable");
                    unknown.push(format!("{}: superblock unreadable: {e}", d.name()));
                    None
                }
            };
            floor = floor.max(sb.as_ref().map_or(0, |s| s.generation));
            sbs.push(if fresh { None } else { sb });
        }
        // With no valid superblock anywhere, formatting would write an empty
        // table over one that may hold dirty, acknowledged data; only devices
        // that read as never used (or `create_fresh`) are formatted.
        if !fresh && sbs.iter().all(Option::is_none) && !unknown.is_empty() {
            return Err(BlockError::Unavailable(format!(
                "cache {name}: no device carries a readable cache superblock and {} may hold \
                 this cache's table (dirty data): refusing to format them",
                unknown.join(", ")
            )));
        }
        let newest = Inner::whose_table(name, &devs, &sbs, cfg.backing_id).await?;
        // a cache of one table copy laid out again with two (frames moved)
        let mut relaid = false;
        if let Some(old) = newest
            .as_ref()
            .filter(|s| mirrored && s.mirrored && s.slots() == 1)
        {
            // made before the table had two copies
            let one = layout_with(1)?;
            let in_place = DeviceLayout::for_frames(one.local_frames, block_bytes, 2);
            let on: Vec<usize> = (0..devs.len())
                .filter(|&i| sbs[i].as_ref().is_some_and(|s| s.cache_id == old.cache_id))
                .collect();
            if in_place.data_offset == one.data_offset {
                // the second copy fits before the frames: they stay where they are
                layout = in_place;
                tracing::info!(cache = %name, "the cache's table gets a second copy (made by an earlier version with one)");
            } else if Inner::holds_dirty(&devs, &on, old).await {
                // two copies would move the frames under the dirty data
                layout = one;
                tracing::warn!(cache = %name, frames = old.frames,
                    "this write-back cache keeps one copy of its table (made by an earlier \
                     version): a power cut during a table write can tear a page on both SSDs \
                     and leave the cache unable to start; drain it (detach it), and the next \
                     attach or start lays it out with two");
            } else {
                tracing::info!(cache = %name, "laid out again with two copies of its table (made by an earlier version with one, no dirty data): it starts empty");
                relaid = true;
            }
        }
        let local = layout.local_frames;
        let frames = if mirrored {
            local
        } else {
            local.checked_mul(devs.len() as u32).ok_or_else(|| {
                BlockError::Unavailable(format!(
                    "cache {name}: {} devices of {local} frames of {block_bytes} bytes pass the 2^32 frames a cache holds: choose a larger block_bytes or a size",
                    devs.len()
                ))
            })?
        };
        let advisor = cfg.advisor.then(|| {
            let backing_blocks = geo.size_bytes().div_ceil(block_bytes).max(1);
            let lo = (frames as u64 / 16).max(64);
            let hi = backing_blocks.max(lo * 2);
            let mut ac = AdvisorConfig::geometric(lo, hi, 12);
            ac.policy = cfg.policy;
            ac.admission = cfg.admission;
            Advisor::new(&ac)
        });
        let state = State::empty(&cfg, frames as usize, spb, advisor);
        let sb = Superblock {
            cache_id: newest
                .as_ref()
                .map(|s| s.cache_id)
                .unwrap_or_else(rand::random),
            generation: newest.as_ref().map_or(floor, |s| s.generation),
            mode: cfg.mode,
            block_bytes: cfg.block_bytes,
            frames,
            device_count: devs.len() as u8,
            device_index: 0,
            mirrored,
            backing_bytes: geo.size_bytes(),
            backing_id: cfg.backing_id,
            clean: false,
            partner_failed: false,
            table_slots: layout.slots as u8,
            lost_sectors: newest.as_ref().is_some_and(|s| s.lost_sectors),
        };
        let mut out_geo = geo;
        out_geo.thin = false;
        let inner = Arc::new(Inner {
            name: name.to_string(),
            backing,
            devs,
            mirrored,
            layout,
            geo_at_open: out_geo,
            block_count: AtomicU64::new(out_geo.block_count),
            growing: tokio::sync::Mutex::new(()),
            bs,
            block_bytes,
            frames,
            state: Mutex::new(state),
            locks: (0..LOCK_STRIPES).map(|_| RwLock::new(())).collect(),
            backing_locks: (0..LOCK_STRIPES).map(|_| RwLock::new(())).collect(),
            counters: Counters::default(),
            window: Mutex::new(Window::default()),
            seq: Mutex::new(SeqDetector::keeping_rereads(
                cfg.seq_cutoff_bytes,
                block_bytes,
                frames as usize,
            )),
            pages: Mutex::new(HashMap::new()),
            pages_done: Notify::new(),
            destage_wake: Notify::new(),
            destage_progress: Notify::new(),
            destage_failure: Mutex::new(None),
            fg_inflight: AtomicUsize::new(0),
            fg_last: Mutex::new(tokio::time::Instant::now()),
            sb: Mutex::new(sb),
            degraded: AtomicBool::new(false),
            drain: AtomicBool::new(false),
            stopping: AtomicBool::new(false),
            gate: RwLock::new(()),
            failure_recorded: AtomicBool::new(false),
            uneven: AtomicBool::new(false),
            sb_write: tokio::sync::Mutex::new(()),
            cfg,
        });
        let mut uneven = false;
        if let Some(old) = newest {
            inner.load(&old, &sbs, !unknown.is_empty()).await?;
            uneven = mirrored && !old.clean && inner.state.lock().dirty_frames > 0;
        } else {
            tracing::info!(cache = %name, frames, block_bytes, "formatting new cache devices");
        }
        if relaid {
            // the old superblocks go first: a crash before the new ones are
            // written leaves blank devices (nothing dirty was on them), not
            // an old superblock over a table laid out anew
            for d in inner.devs.iter().filter(|d| !d.is_failed()) {
                if let Err(e) = crate::ssd::wipe_superblocks(&d.vol()).await {
                    // (its table write below fails it too)
                    tracing::warn!(cache = %name, device = %d.name(), error = %e,
                        "clearing an old superblock failed");
                }
            }
        }
        // fresh table on the devices for what is loaded, then "not clean" until a
        // clean shutdown writes the whole table again
        inner.write_full_table(false).await?;
        if inner.layout.slots == 2 {
            // both superblock copies (a write goes to the one its generation
            // picks): a version before table slots refuses a copy marked with
            // two, and must find no older unmarked one to use instead
            inner.write_superblocks(|_| {}).await?;
        }
        inner.keep_devices();
        let vol = CacheVolume {
            inner: inner.clone(),
            tasks: Mutex::new(Vec::new()),
        };
        vol.start_tasks();
        if uneven {
            inner.uneven.store(true, Ordering::Release);
            vol.tasks
                .lock()
                .push(tokio::spawn(async move { inner.even_mirror().await }));
        }
        Ok(vol)
    }

    /// The cache's status and statistics.
    pub fn status(&self) -> CacheStatus {
        self.inner.status()
    }

    /// The cache's state and its devices' states, as in [`CacheVolume::status`],
    /// without the counters: cheap enough to poll (no lock of the block map).
    pub fn health(&self) -> (String, Vec<DeviceStatus>) {
        (self.inner.state_line(), self.inner.device_states())
    }

    /// Bytes of acknowledged data the cache lost ([`CacheStatus::lost_dirty_bytes`]);
    /// cheap while none is.
    pub fn lost_dirty_bytes(&self) -> u64 {
        self.inner.state.lock().lost_sectors() * SECTOR_BYTES
    }

    /// The backing volume.
    pub fn backing(&self) -> VolumeRef {
        self.inner.backing.clone()
    }

    /// Destages every dirty block and returns when none is left (new writes go to
    /// the backing volume meanwhile). Used before detaching.
    pub async fn drain(&self) -> BlockResult<()> {
        self.inner.drain.store(true, Ordering::Release);
        // a write that chose write-back before the flag was set may still be
        // on its way to the SSDs: it ends (dirty) before the count is looked at,
        // or a detach would move the LUNs to the backing past its data
        drop(self.inner.gate.write().await);
        // destage batches that failed in a row while this drain waited
        let mut failed = 0;
        loop {
            let progress = self.inner.destage_progress.notified();
            tokio::pin!(progress);
            progress.as_mut().enable();
            if self.inner.state.lock().dirty_frames == 0 && self.batches_ended().await {
                return Ok(());
            }
            if self.inner.live_devices() == 0 {
                return Err(BlockError::Unavailable(
                    "no cache device left: dirty data cannot be destaged".into(),
                ));
            }
            self.inner.destage_wake.notify_one();
            progress.await;
            if self.inner.state.lock().dirty_frames == 0 && self.batches_ended().await {
                return Ok(());
            }
            match self.inner.destage_failure.lock().clone() {
                None => failed = 0,
                Some(why) => {
                    failed += 1;
                    if failed >= DRAIN_FAILED_BATCHES_MAX {
                        // (the dirty data stays in the cache, still destaged
                        // in the background; the caller may try again)
                        return Err(BlockError::Unavailable(format!(
                            "{failed} destage batches failed in a row, dirty data stays in the cache: {why}"
                        )));
                    }
                }
            }
        }
    }

    /// Waits until no destage batch is in flight (each holds the backing
    /// locks of its blocks until its clean records are written), and says
    /// whether nothing is dirty then. A batch marks its blocks clean in memory
    /// before it writes those records, so a drain that saw nothing dirty could
    /// end while the SSDs still said dirty; if that record write fails, the
    /// blocks are dirty again (review of 2026-12-06).
    async fn batches_ended(&self) -> bool {
        let mut all = Vec::with_capacity(self.inner.backing_locks.len());
        for l in self.inner.backing_locks.iter() {
            all.push(l.write().await);
        }
        drop(all);
        self.inner.state.lock().dirty_frames == 0
    }

    /// Ends a [`CacheVolume::drain`] that is given up (a detach that failed):
    /// writes go back to the configured mode.
    pub fn undrain(&self) {
        self.inner.drain.store(false, Ordering::Release);
    }

    /// Stops the cache cleanly: waits for requests in flight, stops destaging and
    /// writes the whole map (so the next start finds every cached block).
    pub async fn shutdown(&self) -> BlockResult<()> {
        let _gate = self.inner.gate.write().await;
        self.stop_tasks().await;
        let clean = !self.inner.uneven.load(Ordering::Acquire);
        self.inner.write_full_table(clean).await
    }

    /// Stops destaging and the timer (the caller holds the gate exclusively).
    /// Starts destaging and the counters' timer.
    fn start_tasks(&self) {
        let mut tasks = self.tasks.lock();
        tasks.push(tokio::spawn(crate::destage::run(self.inner.clone())));
        tasks.push(tokio::spawn(crate::destage::tick(self.inner.clone())));
    }

    async fn stop_tasks(&self) {
        self.inner.stopping.store(true, Ordering::Release);
        self.inner.destage_wake.notify_one();
        let tasks: Vec<_> = std::mem::take(&mut *self.tasks.lock());
        for t in tasks {
            t.abort();
            let _ = t.await;
        }
    }

    /// Takes the cache out of service after [`CacheVolume::drain`] and after the
    /// caller has sent the I/O elsewhere (the backing): stops destaging, forgets
    /// every cached block and writes the empty map, so a later start cannot serve
    /// blocks that were written around the cache meanwhile. Refuses (and leaves
    /// the cache as it is) while dirty data remains.
    pub async fn detach(&self) -> BlockResult<()> {
        let _gate = self.inner.gate.write().await;
        if self.inner.state.lock().dirty_frames != 0 {
            return Err(BlockError::Unavailable(format!(
                "cache {}: dirty data left; drain it first",
                self.inner.name
            )));
        }
        self.stop_tasks().await;
        {
            let i = &self.inner;
            let mut st = i.state.lock();
            let advisor = st.advisor.take();
            let spb = (i.block_bytes / SECTOR_BYTES) as u32;
            *st = State::empty(&i.cfg, i.frames as usize, spb, advisor);
        }
        let r = self.inner.write_full_table(true).await;
        if r.is_err() {
            // The caller puts the LUNs back on the cache (pools.rs): it serves
            // on, empty, rather than refuse them all, and destages again what
            // is written to it from now on (review of 2026-12-06: left without
            // its destage task, write-back data stayed dirty for good)
            self.inner.stopping.store(false, Ordering::Release);
            self.start_tasks();
        }
        r
    }

    /// Puts `device` in place of the failed half `index` of a write-back mirror
    /// while the cache serves: the new device is filled from the survivor in the
    /// background, frame by frame (each frame locked and pinned while copied;
    /// writes reach the new device for frames already copied), and once complete
    /// the map is written to it and the cache leaves write-through for write-back
    /// again, warm. Progress shows in the device's status ("resilvering N%"). A
    /// striped cache has nothing to copy: replace its device by detaching it.
    pub async fn replace_device(&self, index: usize, device: CacheDevice) -> BlockResult<()> {
        let i = &self.inner;
        if !i.mirrored {
            return Err(BlockError::NotSupported(
                "only a write-back mirror is filled while serving; detach a striped cache to replace its device",
            ));
        }
        let Some(d) = i.devs.get(index) else {
            return Err(BlockError::Unavailable(format!("no cache device {index}")));
        };
        let survivor = &i.devs[1 - index];
        if !d.is_failed() || d.resilver_cursor().is_some() || survivor.is_failed() {
            return Err(BlockError::Unavailable(format!(
                "cache {}: device {index} must have failed and its partner must be live",
                i.name
            )));
        }
        if device.volume.geometry().size_bytes() < i.layout.end() {
            return Err(BlockError::Unavailable(format!(
                "cache {}: {} is smaller than the {} bytes the cache uses on each device",
                i.name,
                device.name,
                i.layout.end()
            )));
        }
        // the outgoing half's failure is on the survivor's superblock before
        // anything else: the fill's end then leaves it at least two
        // generations behind, so it is never taken back as the half that
        // only missed the last superblock write (see `Inner::load`), should a
        // start find it again (the new device not yet recorded, a crash)
        i.record_failure().await?;
        // and a superblock of another cache left on the new device (a used
        // SSD) could, at a higher generation, win the next start if a crash
        // cut the fill short: this cache's dirty data on the survivor would
        // be taken for another cache's. Wiped before the device is taken
        crate::ssd::wipe_superblocks(&device.volume)
            .await
            .map_err(|e| {
                BlockError::Unavailable(format!(
                    "cache {}: {} refused the wipe of its superblocks: {e}",
                    i.name, device.name
                ))
            })?;
        if !d.replace(device.name.clone(), device.volume) {
            return Err(BlockError::Unavailable(format!(
                "cache {}: {} has another block size",
                i.name, device.name
            )));
        }
        i.keep_devices();
        tracing::info!(cache = %i.name, index, device = %device.name, "cache device replaced: filling it from its mirror");
        let inner = i.clone();
        let t = tokio::spawn(async move {
            // an abort (detach, shutdown) leaves the new device failed, if
            // it was still being filled: once filled and live, the new
            // device may hold the only current copy (the survivor failing
            // during the final table write; review of 2026-12-06: it was
            // failed too, and the cache had no device left)
            struct Abandon<'a>(&'a Device, bool);
            impl Drop for Abandon<'_> {
                fn drop(&mut self) {
                    if !self.1 && self.0.resilver_cursor().is_some() {
                        self.0.abandon_resilver();
                    }
                }
            }
            let mut guard = Abandon(&inner.devs[index], false);
            match inner.resilver(index).await {
                Ok(()) => {
                    guard.1 = true;
                    tracing::info!(cache = %inner.name, index, "cache mirror complete again: write-back");
                }
                Err(e) => {
                    tracing::error!(cache = %inner.name, index, "filling the replaced cache device failed: {e}")
                }
            }
        });
        self.tasks.lock().push(t);
        Ok(())
    }

    /// Marks cache device `index` failed (an operator pulling it, or a test).
    pub async fn fail_device(&self, index: usize) -> BlockResult<()> {
        if let Some(d) = self.inner.devs.get(index) {
            d.fail(&BlockError::Unavailable("failed by request".into()));
            self.inner.on_device_failure();
        }
        self.inner.record_failure().await
    }
}

impl CacheVolume {
    /// Stops the background tasks (destage, resilver) without writing anything
    /// more, as a power loss or a SIGKILL does, and returns once none of them
    /// runs: a task aborted by [`Drop`] may still be inside a poll on another
    /// thread, and on in-memory test volumes one poll can carry several writes.
    /// For crash tests, which must not let a task outlive the "power", and
    /// for a shutdown that cannot wait for an attach or detach to end.
    pub async fn halt(&self) {
        for t in self.abort_tasks() {
            let _ = t.await;
        }
    }

    /// Asks every background task to stop; returns them (they may still be
    /// inside a poll elsewhere).
    fn abort_tasks(&self) -> Vec<tokio::task::JoinHandle<()>> {
        let tasks: Vec<_> = self.tasks.lock().drain(..).collect();
        for t in &tasks {
            t.abort();
        }
        tasks
    }
}

impl Drop for CacheVolume {
    fn drop(&mut self) {
        self.abort_tasks();
    }
}

impl Inner {
    /// The served geometry (the backing volume's, as far as it has been grown here).
    pub fn geo(&self) -> Geometry {
        Geometry {
            block_count: self.block_count.load(Ordering::Acquire),
            ..self.geo_at_open
        }
    }

    /// Which superblock's table the cache takes. One cache on the devices:
    /// its newest copy (`load` then checks it names this volume). Several
    /// (generations of different caches do not compare: a used SSD put in
    /// place of a mirror half while the node was down carries another cache's
    /// superblock, perhaps at a higher generation, which as "the newest" would
    /// fail the half holding this cache's dirty data), their tables decide:
    /// - a cache of another volume holding dirty data refuses the start (that
    ///   volume's acknowledged writes; failed or adopted here, its table
    ///   would be overwritten);
    /// - of the caches of this volume (or recording none), the one holding
    ///   dirty data is taken (the others' devices are then failed, or in the
    ///   modes without dirty data, overwritten), unless it records no volume
    ///   while another names this one; two holding dirty data refuse the start
    ///   (either may be the only copy of acknowledged writes);
    /// - none holding dirty data: the cache starts empty (the newer table need
    ///   not be the last one in front of the volume: a warm read cache would
    ///   serve blocks it has since changed).
    async fn whose_table(
        name: &str,
        devs: &[Device],
        sbs: &[Option<Superblock>],
        backing_id: u128,
    ) -> BlockResult<Option<Superblock>> {
        let ours =
            |s: &Superblock| s.backing_id == 0 || backing_id == 0 || s.backing_id == backing_id;
        // (cache id, newest copy, its devices), in device order
        let mut caches: Vec<(u64, Superblock, Vec<usize>)> = Vec::new();
        for (i, s) in sbs.iter().enumerate() {
            let Some(s) = s else { continue };
            match caches.iter_mut().find(|(id, _, _)| *id == s.cache_id) {
                Some((_, newest, on)) => {
                    if s.generation > newest.generation {
                        *newest = s.clone();
                    }
                    on.push(i);
                }
                None => caches.push((s.cache_id, s.clone(), vec![i])),
            }
        }
        if caches.len() <= 1 {
            return Ok(caches.pop().map(|(_, s, _)| s));
        }
        let names = |on: &[usize]| {
            on.iter()
                .map(|&d| devs[d].name())
                .collect::<Vec<_>>()
                .join(", ")
        };
        let mut dirty_here = Vec::new();
        for (id, sb, on) in &caches {
            let dirty = sb.mode == CacheMode::WriteBack && Self::holds_dirty(devs, on, sb).await;
            if !dirty {
                continue;
            }
            if !ours(sb) {
                return Err(BlockError::Unavailable(format!(
                    "cache {name}: device(s) {} hold dirty data (or a table that could not be \
                     read) of another backing volume (cache id {id:016x}, volume id {:032x}; this one is {backing_id:032x}); \
                     put them back in front of that volume and detach it, or zero their \
                     first {} KiB to give that data up",
                    names(on),
                    sb.backing_id,
                    TABLE_OFFSET / 1024
                )));
            }
            dirty_here.push((id, sb, on));
        }
        match dirty_here.as_slice() {
            [] => {
                tracing::warn!(cache = %name, caches = caches.len(),
                    "the devices hold several caches and none holds dirty data of this volume: starting empty");
                Ok(None)
            }
            // a cache recording no volume (written before backing ids) may
            // be another volume's: while another cache on the devices names
            // this one, the devices were mixed, and its dirty data is not
            // destaged here on a guess
            [(id, sb, on)]
                if sb.backing_id == 0
                    && backing_id != 0
                    && caches.iter().any(|(_, s, _)| s.backing_id == backing_id) =>
            {
                Err(BlockError::Unavailable(format!(
                    "cache {name}: device(s) {} hold dirty data (or a table that could not be \
                     read) of cache {id:016x}, which records no backing volume, while other \
                     devices hold a cache of this one; put them back where they came from, or \
                     zero their first {} KiB to give that data up",
                    names(on),
                    TABLE_OFFSET / 1024
                )))
            }
            [(_, sb, _)] => Ok(Some((*sb).clone())),
            [(a, _, on_a), (b, _, on_b), ..] => Err(BlockError::Unavailable(format!(
                "cache {name}: devices {} (cache id {a:016x}) and {} (cache id {b:016x}) \
                 hold dirty data (or tables that could not be read) of two different caches \
                 of this volume (or of a volume not recorded); either may be the only copy \
                 of acknowledged writes, so neither is taken: zero the first {} KiB of the \
                 devices that do not belong (after making sure their data is not needed) \
                 and start again",
                names(on_a),
                names(on_b),
                TABLE_OFFSET / 1024
            ))),
        }
    }

    /// Whether the tables on devices `on`, laid out as `sb` says, hold a
    /// dirty record; a page unreadable or damaged counts as one (refuse
    /// rather than guess).
    async fn holds_dirty(devs: &[Device], on: &[usize], sb: &Superblock) -> bool {
        let layout = sb.layout();
        for &d in on {
            for page in 0..layout.table_pages {
                match devs[d].read_page(&layout, page).await {
                    Ok(Some((_, recs)))
                        if !recs.iter().any(|r| r.key != NO_KEY && r.dirty != 0) => {}
                    _ => return true,
                }
            }
        }
        false
    }

    /// Loads the map an earlier run left on the devices; `unknown`: a
    /// device's superblock could not be read or was damaged.
    async fn load(
        &self,
        old: &Superblock,
        sbs: &[Option<Superblock>],
        unknown: bool,
    ) -> BlockResult<()> {
        let same_shape = old.block_bytes as u64 == self.block_bytes
            && old.device_count as usize == self.devs.len()
            && old.mirrored == self.mirrored
            && old.frames == self.frames
            // frames where they were (a cache of one table copy re-laid out
            // with two moves them)
            && old.layout().data_offset == self.layout.data_offset
            // a backing volume that grew (the superblocks may not say so yet when a
            // crash cut a grow short) keeps every cached block where it was
            && old.backing_bytes <= self.geo().size_bytes();
        // devices whose superblock is older than the newest (a mirror half that
        // failed earlier) or missing are not trusted; in the other modes such a
        // device serves, but its table is not read: it missed the writes that
        // went around it while it was failed, or is another cache's
        //
        // A mirror half one generation behind, with no failure recorded in the
        // newest copy, missed only the last superblock write: a crash came
        // between the two devices' writes (they are written one after the
        // other, after both tables). It holds everything acknowledged: a write
        // that only one half took is acknowledged only once that half's
        // superblock records its partner's failure (`record_failure`). It used
        // to be failed as "not part of this cache", leaving a healthy mirror
        // degraded after a crash during a clean stop or an open.
        let current = |s: &Superblock| {
            s.cache_id == old.cache_id
                && (s.generation == old.generation
                    || (old.mirrored && !old.partner_failed && s.generation + 1 == old.generation))
        };
        let mut stale = vec![false; self.devs.len()];
        for ((d, sb), stale) in self.devs.iter().zip(sbs).zip(stale.iter_mut()) {
            *stale = !matches!(sb, Some(s) if current(s));
            match sb {
                Some(s) if current(s) => {}
                Some(s) if s.cache_id == old.cache_id && old.partner_failed => {
                    d.fail(&BlockError::Unavailable(format!(
                        "stale mirror half (generation {} < {})",
                        s.generation, old.generation
                    )));
                }
                _ if old.partner_failed || old.mode == CacheMode::WriteBack => {
                    d.fail(&BlockError::Unavailable("not part of this cache".into()));
                }
                _ => {}
            }
        }
        // (before the returns below that start the cache empty: a mirror
        // that started empty with a half failed here took writes back on
        // one copy, its status "ok")
        self.degrade_if_a_half_failed();
        let dirty_possible = old.mode == CacheMode::WriteBack;
        // the devices were in front of another volume (the configuration now
        // names another pool, of the same size or larger): their blocks are
        // that volume's. Served here they would be wrong reads; destaged here,
        // they would overwrite this volume with another's data
        // a table this cache may not load as it stands: it starts empty,
        // unless the devices hold dirty data (refused: dropped here it would
        // be lost, destaged it would overwrite other or newer data)
        let not_loaded: Option<(String, String)> =
            if old.backing_id != 0 && old.backing_id != self.cfg.backing_id {
                // the devices were in front of another volume (the
                // configuration now names another pool, of the same size or
                // larger): their blocks are that volume's
                Some((
                    format!(
                        "the devices hold dirty data of another backing volume (id {:032x}; \
                         this one is {:032x}); point the cache back at that volume and detach \
                         it, or wipe the devices to give that data up",
                        old.backing_id, self.cfg.backing_id
                    ),
                    format!(
                    "cache devices were in front of another backing volume ({:032x}, now {:032x})",
                    old.backing_id, self.cfg.backing_id
                ),
                ))
            } else if self.cfg.table_stale {
                // the volume was served without this cache since the table was
                // written (the node's record of fronts says so)
                Some((
                    "the backing volume was served without this cache since its table was \
                     written, and the devices hold dirty data older than what the volume may \
                     hold now; wipe the devices to start the cache empty"
                        .into(),
                    "the backing volume was served without this cache, or the cache was \
                     detached, since its table was written"
                        .into(),
                ))
            } else if unknown && !self.mirrored {
                // a striped cache's devices fail one by one: one failed in an
                // earlier run keeps the older superblock and a table of blocks
                // written around it since; the device that cannot be read now
                // may be the one whose newer superblock says so (review of
                // 2026-12-06: the open refused outright, stopping the node's
                // start, because a dead device failed the table write)
                Some((
                    "a cache device's superblock could not be read, and the devices hold \
                     dirty data; replace the device"
                        .into(),
                    "a cache device's superblock could not be read (its table may be newer \
                     than the others')"
                        .into(),
                ))
            } else if !same_shape {
                // a clean stop of a write-back cache keeps its dirty data too (it
                // writes the whole table, dirty records included, and does not
                // destage): this used to be asked only after an unclean stop, so
                // a cleanly stopped cache started empty under a new shape and
                // erased them
                Some((
                    format!(
                        "the devices hold dirty data of a cache with another shape (block {} \
                         bytes, {} devices, {} frames); restore that configuration and detach \
                         it first",
                        old.block_bytes, old.device_count, old.frames
                    ),
                    "cache shape changed".into(),
                ))
            } else {
                None
            };
        if let Some((refusal, why)) = not_loaded {
            if dirty_possible && self.scan_dirty(old).await {
                return Err(BlockError::Unavailable(format!(
                    "cache {}: {refusal}",
                    self.name
                )));
            }
            tracing::warn!(cache = %self.name, "{why}: starting empty");
            return Ok(());
        }
        if !old.clean && !dirty_possible {
            tracing::info!(cache = %self.name, "cache was not shut down cleanly: starting empty");
            return Ok(());
        }
        let mut entries = Vec::new();
        let mut bits = Vec::new();
        let mut take = |d: usize, page: u32, recs: &[Record]| {
            for (i, r) in recs.iter().enumerate() {
                let local = page * RECORDS_PER_PAGE as u32 + i as u32;
                if local >= self.layout.local_frames || r.key == NO_KEY {
                    continue;
                }
                let slot = self.slot_of_local(d, local);
                // lost sectors (dirty, not valid: see `State::lost`) stay so
                let lost = r.dirty & !r.valid;
                let (valid, dirty) = if old.clean {
                    (r.valid, r.dirty)
                } else {
                    (r.dirty & !lost, r.dirty)
                };
                // a record's key and bitmaps come from the device: a key
                // past the volume (overflowing included) is dropped, and
                // the bitmaps keep only the block's sectors (bits past
                // them counted a dirty frame the map never held)
                let in_volume = r
                    .key
                    .checked_mul(self.block_bytes)
                    .is_some_and(|at| at < self.geo().size_bytes());
                if !in_volume {
                    continue;
                }
                let full = self.full_mask(r.key);
                let (valid, dirty) = (valid & full, dirty & full & (valid | lost));
                if valid == 0 && dirty == 0 {
                    continue;
                }
                entries.push((slot, r.key));
                bits.push((slot, valid, dirty));
            }
        };
        let live: Vec<usize> = (0..self.devs.len())
            .filter(|&d| !self.devs[d].is_failed() && !stale[d])
            .collect();
        if self.mirrored {
            // the map is, page by page, the valid copy of the highest
            // version on any live half: a page torn or unreadable in one slot
            // or on one half is read from another (the full table written at
            // open then repairs it); damaged everywhere, it may have held
            // dirty records, and the open is refused rather than serve the
            // older data of the backing volume
            // (read in runs of TABLE_READ_PAGES: a few large reads per copy)
            let mut chunks = Vec::with_capacity(live.len());
            // each live device's newest valid version of the page at hand
            let mut newest: Vec<(usize, u64)> = Vec::with_capacity(live.len());
            for page in 0..self.layout.table_pages {
                let i = (page % TABLE_READ_PAGES) as usize;
                if i == 0 {
                    let n = TABLE_READ_PAGES.min(self.layout.table_pages - page);
                    chunks.clear();
                    for &d in &live {
                        chunks.push(self.devs[d].read_pages(&self.layout, page, n).await);
                    }
                }
                let mut got: Option<(usize, u64, Vec<Record>)> = None;
                newest.clear();
                for (&d, chunk) in live.iter().zip(chunks.iter_mut()) {
                    match std::mem::replace(&mut chunk[i], Ok(None)) {
                        Ok(Some((seq, recs))) => {
                            newest.push((d, seq));
                            if got.as_ref().is_none_or(|g| seq > g.1) {
                                got = Some((d, seq, recs));
                            }
                        }
                        Ok(None) => {
                            tracing::warn!(cache = %self.name, device = d, page, "table page damaged")
                        }
                        Err(e) => {
                            tracing::warn!(cache = %self.name, device = d, page, error = %e, "table page unreadable")
                        }
                    }
                }
                match got {
                    Some((d, seq, recs)) => {
                        // the next write of the page goes to the other slot;
                        // a device whose newest valid copy is in that slot
                        // (its write of version `seq` tore) is shifted
                        let next = self.layout.slot_of(seq + 1);
                        let shifted = newest
                            .iter()
                            .filter(|&&(d, s)| {
                                self.layout.slots == 2 && d < 8 && self.layout.slot_of(s) == next
                            })
                            .fold(0u8, |m, &(d, _)| m | 1 << d);
                        let mut pc = self.pages.lock();
                        let e = pc.entry(page).or_default();
                        e.seq = seq;
                        e.shifted = shifted;
                        drop(pc);
                        take(d, page, &recs)
                    }
                    // (a clean stop keeps dirty records too: see `load`'s
                    // shape check)
                    None if dirty_possible => {
                        return Err(BlockError::Unavailable(format!(
                            "cache {}: table page {page} is damaged on every copy; it may hold \
                             dirty data",
                            self.name
                        )));
                    }
                    None => {}
                }
            }
        } else {
            for &d in &live {
                let mut chunk = Vec::new();
                for page in 0..self.layout.table_pages {
                    let i = (page % TABLE_READ_PAGES) as usize;
                    if i == 0 {
                        let n = TABLE_READ_PAGES.min(self.layout.table_pages - page);
                        chunk = self.devs[d].read_pages(&self.layout, page, n).await;
                    }
                    let page_read = std::mem::replace(&mut chunk[i], Ok(None));
                    let Some((_, recs)) = page_read? else {
                        if old.clean {
                            tracing::warn!(cache = %self.name, page, "table page unreadable");
                        }
                        if dirty_possible {
                            return Err(BlockError::Unavailable(format!(
                                "cache {}: table page {page} of device {d} is damaged on its only copy; it may hold dirty data",
                                self.name
                            )));
                        }
                        continue;
                    };
                    take(d, page, &recs);
                }
            }
        }
        entries.sort_unstable();
        entries.dedup_by_key(|e| e.0);
        let mut seen = std::collections::HashSet::new();
        entries.retain(|e| seen.insert(e.1));
        let mut st = self.state.lock();
        st.policy.restore(&entries);
        for (slot, valid, dirty) in bits {
            if st.policy.key_of(slot).is_some() {
                st.valid.set(slot, valid);
                st.set_dirty(slot, dirty);
            }
        }
        tracing::info!(
            cache = %self.name,
            blocks = entries.len(),
            dirty = st.dirty_frames,
            clean_shutdown = old.clean,
            "cache map loaded"
        );
        // lost sectors recorded before: named again at every start (the
        // event and the alert send the operator to the log)
        let mut lost: Vec<(u64, u64)> = st
            .lost_frames
            .iter()
            .filter_map(|&f| Some((st.policy.key_of(f)?, st.lost(f))))
            .filter(|&(_, m)| m != 0)
            .collect();
        lost.sort_unstable();
        const NAMED_MAX: usize = 64;
        for &(key, mask) in lost.iter().take(NAMED_MAX) {
            let (first, n) = hull(mask).unwrap_or((0, 0));
            let lba_at = |sector: u64| (key * self.block_bytes + sector * SECTOR_BYTES) / self.bs;
            tracing::error!(cache = %self.name, block = key,
                first_host_lba = lba_at(first as u64),
                last_host_lba = lba_at((first + n) as u64) - 1,
                lost_bytes = mask.count_ones() as u64 * SECTOR_BYTES,
                "cache: written data recorded LOST (a resilver could not read it); \
                 reads of it fail until the host writes it again");
        }
        if lost.len() > NAMED_MAX {
            tracing::error!(cache = %self.name, blocks = lost.len(),
                "cache: written data recorded LOST in more blocks than named above");
        }
        if st.dirty_frames > 0 {
            self.destage_wake.notify_one();
        }
        self.degrade_if_a_half_failed();
        Ok(())
    }

    /// A mirror with a failed half runs write-through (`degraded`), and
    /// open() rewrites the survivor's superblock (partner_failed) next.
    fn degrade_if_a_half_failed(&self) {
        if self.mirrored && self.live_devices() < self.devs.len() {
            self.degraded.store(true, Ordering::Release);
            self.failure_recorded.store(true, Ordering::Release);
        }
    }

    /// Whether any table record of the old shape, on the devices not failed,
    /// marks dirty sectors ([`Inner::holds_dirty`]).
    async fn scan_dirty(&self, old: &Superblock) -> bool {
        let live: Vec<usize> = (0..self.devs.len())
            .filter(|&d| !self.devs[d].is_failed())
            .collect();
        Self::holds_dirty(&self.devs, &live, old).await
    }
}

#[async_trait]
impl Volume for CacheVolume {
    fn geometry(&self) -> Geometry {
        self.inner.geo()
    }

    /// Grows the backing volume, then records its new size in the cache devices'
    /// superblocks, then serves it. Blocks already cached keep their place (they are
    /// keyed by their position on the backing volume). A crash between the two
    /// leaves a backing volume larger than the superblocks say, which opening
    /// accepts (see [`Inner::load`]).
    /// To its end even if its caller gives up: dropped between its
    /// superblock writes it would leave the copies at different generations.
    async fn grow(&self, block_count: u64) -> BlockResult<()> {
        let inner = self.inner.clone();
        block::detach::detached(async move {
            let i = &*inner;
            let _one = i.growing.lock().await;
            // under the gate, as requests: a stop waits for it or is seen
            let _gate = i.gate.read().await;
            i.serving()?;
            let now = i.block_count.load(Ordering::Acquire);
            if block_count < now {
                return Err(BlockError::NotSupported("shrinking a volume"));
            }
            if block_count == now {
                return Ok(());
            }
            let bytes = block_count
                .checked_mul(i.bs)
                .filter(|b| b.is_multiple_of(SECTOR_BYTES))
                .ok_or_else(|| {
                    BlockError::Unavailable(format!(
                        "cache {}: a cached volume grows by whole 4 KiB sectors",
                        i.name
                    ))
                })?;
            i.backing.grow(block_count).await?;
            if i.backing.geometry().block_count < block_count {
                return Err(BlockError::Unavailable(format!(
                    "cache {}: the backing volume did not grow",
                    i.name
                )));
            }
            i.write_superblocks(|sb| sb.backing_bytes = bytes).await?;
            i.block_count.store(block_count, Ordering::Release);
            tracing::info!(cache = %i.name, from = now, to = block_count, "cached volume grown");
            Ok(())
        })
        .await
    }

    /// Polled inline (a task per read cost 15-22% of the IOPS of a full
    /// cache's random reads, `bench/cache-vendor --caches full --patterns
    /// read`, 27,631-34,070 against 36,055-36,599), and run to its end even if
    /// its caller drops it (`block::detach`): a read that fills a frame holds
    /// the block's lock until the fill's SSD write has landed. Dropped there,
    /// it let a write to the block take the lock and land first; the fill's
    /// older copy, which the SSD still wrote, then overwrote it (and its
    /// frames stayed pinned for good).
    async fn read(&self, lba: u64, blocks: u32) -> BlockResult<Bytes> {
        let inner = self.inner.clone();
        block::detach::detached(async move { inner.read_op(lba, blocks).await }).await
    }

    async fn write(&self, lba: u64, data: Bytes, fua: bool) -> BlockResult<()> {
        let inner = self.inner.clone();
        to_completion(async move { inner.write_op(lba, data, fua).await }).await
    }

    async fn flush(&self) -> BlockResult<()> {
        // write-back data is durable when acknowledged; what went to the backing
        // volume is made durable there
        self.inner.backing.flush().await
    }

    async fn discard(&self, lba: u64, blocks: u64) -> BlockResult<()> {
        let inner = self.inner.clone();
        to_completion(async move { inner.discard_op(lba, blocks).await }).await
    }
}

/// Runs one write or discard of the cache on a task of its own and waits for
/// it. A caller that gives up (an aborted command drops its future) does not
/// stop it half-way: frames pinned for it would stay pinned for good, and a
/// table page write it leads would stay claimed, every later writer of that
/// page waiting on it. Kept on a task of its own rather than `block::detach`
/// (polled inline, a task only for what is left when dropped): inline, 4K
/// random writes to a full cache gave 14,725-17,350 IOPS against
/// 16,874-19,611 for this form in alternating runs (`bench/cache-vendor
/// --caches full --patterns write --secs 10 --repeat 2`, 2026-12-04), though
/// this same form re-run gave 16,379-16,642: within this machine's noise, so
/// not changed. The price: until the task has taken its locks, a caller that
/// gave up and writes the same blocks again is not ordered after it (a SCSI
/// initiator is: the LU's write order waits for it).
async fn to_completion<T: Send + 'static>(
    op: impl std::future::Future<Output = BlockResult<T>> + Send + 'static,
) -> BlockResult<T> {
    match tokio::spawn(op).await {
        Ok(r) => r,
        Err(e) => Err(BlockError::Io(std::io::Error::other(format!(
            "cache request ended abnormally: {e}"
        )))),
    }
}

impl Inner {
    /// Refuses a request once the cache has stopped (`shutdown`, `detach`):
    /// the map written then is what the next start trusts, so a read filling a
    /// frame, a write or a discard after it would change the cache behind that
    /// map (a frame recorded for one block holding another's data, dirty data
    /// never destaged). Checked under the gate, which `stopping` is only set
    /// under exclusively: a request either ran before the stop or sees it.
    fn serving(&self) -> BlockResult<()> {
        match self.stopping.load(Ordering::Acquire) {
            false => Ok(()),
            true => Err(BlockError::Unavailable(format!(
                "cache {} is stopped",
                self.name
            ))),
        }
    }

    async fn read_op(&self, lba: u64, blocks: u32) -> BlockResult<Bytes> {
        let i = self;
        i.geo().check_range(lba, blocks as u64)?;
        let _gate = i.gate.read().await;
        i.serving()?;
        let _fg = i.fg();
        let off = lba * i.bs;
        let len = blocks as u64 * i.bs;
        let bypass = i
            .seq
            .lock()
            .observe(off, len, i.fg_inflight.load(Ordering::Relaxed));
        Ok(i.read_bytes(off, len, bypass).await?.freeze())
    }

    async fn write_op(&self, lba: u64, data: Bytes, fua: bool) -> BlockResult<()> {
        let i = self;
        let blocks = i.geo().blocks_in(data.len())?;
        i.geo().check_range(lba, blocks)?;
        if blocks == 0 {
            return Ok(());
        }
        let _gate = i.gate.read().await;
        i.serving()?;
        let _fg = i.fg();
        i.write_bytes(lba * i.bs, data, fua).await
    }

    async fn discard_op(&self, lba: u64, blocks: u64) -> BlockResult<()> {
        let i = self;
        i.geo().check_range(lba, blocks)?;
        let _gate = i.gate.read().await;
        i.serving()?;
        let _fg = i.fg();
        let off = lba * i.bs;
        let len = blocks * i.bs;
        let pieces = i.pieces(off, len);
        let keys: Vec<u64> = pieces.iter().map(|p| p.key).collect();
        let _locks = i.lock_exclusive(&keys).await;
        let _out = i.lock_backing_exclusive(&keys).await;
        i.backing.discard(lba, blocks).await?;
        // drop only sectors the discard covers whole; the rest stays as it was
        let masks: Vec<(u64, u64)> = pieces
            .iter()
            .filter_map(|p| {
                let first = p.blk_off.div_ceil(SECTOR_BYTES) as u32;
                let end = ((p.blk_off + p.len) / SECTOR_BYTES) as u32;
                let end = if p.blk_off + p.len == i.block_len(p.key) {
                    (p.blk_off + p.len).div_ceil(SECTOR_BYTES) as u32
                } else {
                    end
                };
                (end > first).then(|| (p.key, range_mask(first, end - first)))
            })
            .collect();
        // The backing holds the discard before any dirty sector it covers is
        // clean in memory: a table page written meanwhile for another block
        // (group commit) would otherwise record it clean, and a crash before
        // the backing's flush bring back the backing's older data in place
        // of the acknowledged dirty data (review of 2026-12-06). The keys'
        // locks are held, so their dirty state cannot change in between.
        let covers_dirty = {
            let st = i.state.lock();
            masks.iter().any(|&(key, m)| {
                st.policy
                    .get(key)
                    .is_some_and(|slot| st.dirty.get(slot) & m != 0)
            })
        };
        if covers_dirty {
            i.backing.flush().await?;
        }
        let mut pages = Vec::new();
        let mut dropped = Vec::new();
        {
            let mut st = i.state.lock();
            for &(key, m) in &masks {
                if let Some(slot) = st.policy.get(key) {
                    let v0 = st.valid.get(slot);
                    st.valid.set(slot, v0 & !m);
                    let d = st.dirty.get(slot);
                    if d & m != 0 {
                        st.pin_io(slot);
                        dropped.push((slot, v0, d));
                        st.set_dirty(slot, d & !m);
                        pages.push(slot / RECORDS_PER_PAGE as u32);
                    }
                }
            }
        }
        pages.sort_unstable();
        pages.dedup();
        let mut r = Ok(());
        if !pages.is_empty() {
            r = i.persist_pages(&pages).await;
        }
        let mut st = i.state.lock();
        for (slot, v, d) in dropped {
            if r.is_err() {
                // the backing's flush or the records failed: the SSD may
                // still say "dirty" for these sectors, so memory does too
                // (the frame, unchanged, is not reused under that record)
                st.valid.set(slot, v);
                st.set_dirty(slot, d);
            }
            st.unpin_io(slot);
        }
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use block::MemVolume;

    /// A write-back cache as a version before table slots left it after a
    /// crash with dirty data, its table too large for a second copy before
    /// its frames (283 pages: frames at 2 MiB, with two copies at 3 MiB),
    /// starts with its one copy where it is and serves its dirty blocks
    /// (one in the first run of pages the load reads at once, one past it)
    /// from where that version put them. Laid out with two copies it would
    /// read the frames at 3 MiB (or refuse the start as another shape).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_large_dirty_cache_made_before_table_slots_keeps_its_one_copy() {
        const FRAMES: u32 = 48_000;
        let one = DeviceLayout::for_frames(FRAMES, 4096, 1);
        assert!(one.table_pages > TABLE_READ_PAGES);
        assert_eq!(one.data_offset, 2 << 20);
        assert_eq!(
            DeviceLayout::for_frames(FRAMES, 4096, 2).data_offset,
            3 << 20
        );
        // block 3 in frame 0 (page 0), block 5 in the first frame of page 270
        let far = 270 * RECORDS_PER_PAGE as u64;
        let backing: VolumeRef = Arc::new(MemVolume::new(4096, 1024));
        let data = Bytes::from(vec![0x3cu8; 4096]);
        let mut ssds: Vec<VolumeRef> = Vec::new();
        for i in 0..2u8 {
            let ssd: VolumeRef = Arc::new(MemVolume::new(4096, 51_000));
            let sb = Superblock {
                cache_id: 7,
                generation: 5,
                mode: CacheMode::WriteBack,
                block_bytes: 4096,
                frames: FRAMES,
                device_count: 2,
                device_index: i,
                mirrored: true,
                backing_bytes: 4 << 20,
                backing_id: 0,
                clean: false,
                partner_failed: false,
                table_slots: 0,
                lost_sectors: false,
            };
            ssd.write(1, Bytes::from(sb.encode()), false).await.unwrap();
            let dirty = |key| Record {
                key,
                valid: 1,
                dirty: 1,
            };
            for page in 0..one.table_pages {
                let recs: Vec<Record> = match page {
                    0 => vec![dirty(3)],
                    270 => vec![dirty(5)],
                    _ => vec![Record::EMPTY; RECORDS_PER_PAGE],
                };
                let at = one.page_offset(page, 0) / 4096;
                let b = Bytes::from(encode_page(page, 0, &recs));
                ssd.write(at, b, false).await.unwrap();
            }
            for frame in [0, far] {
                ssd.write(one.data_offset / 4096 + frame, data.clone(), false)
                    .await
                    .unwrap();
            }
            ssds.push(ssd);
        }
        let cfg = CacheConfig {
            mode: CacheMode::WriteBack,
            block_bytes: 4096,
            size_bytes: Some(FRAMES as u64 * 4096),
            dirty_low_percent: 90,
            dirty_high_percent: 95,
            ..CacheConfig::default()
        };
        let devices = ssds
            .iter()
            .enumerate()
            .map(|(i, v)| CacheDevice {
                name: format!("ssd{i}"),
                volume: v.clone(),
            })
            .collect();
        let vol = CacheVolume::open("t", backing.clone(), devices, cfg)
            .await
            .expect("the cache did not start");
        assert_eq!(vol.status().dirty_blocks, 2);
        assert_eq!(vol.read(3, 1).await.unwrap(), data);
        assert_eq!(vol.read(5, 1).await.unwrap(), data);
        vol.halt().await;
        for ssd in &ssds {
            let sb = ssd.read(0, 2).await.unwrap();
            assert_eq!(sb[24] & 0x10, 0, "marked as two copies");
            assert_eq!(sb[4096 + 24] & 0x10, 0, "marked as two copies");
        }
    }
}
