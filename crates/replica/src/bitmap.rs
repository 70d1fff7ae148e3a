//! The persistent dirty bitmap of one copy: one bit per region of the volume.
//!
//! A set bit means "this region may differ from the partner's copy". It serves
//! two purposes, as DRBD's activity log and bitmap do together:
//! - write intent: the node that orders writes (the leader, or a node writing
//!   alone) sets and persists a region's bit *before* the first write to it, so
//!   after a crash of either or both nodes the regions with writes in flight are
//!   known and resynchronised, and the copies never stay different;
//! - change tracking: while the partner is away or being resynchronised bits are
//!   not cleared, so on its return only those regions are copied.
//!
//! In sync, a region's bit is cleared once no write to it has been in flight for
//! a whole cleaning period and both copies have been flushed since (the
//! cleaner in `session.rs`); clearing is written lazily (a late clear costs at
//! most a needless region copy after a crash), setting is durable before the
//! write.
//!
//! Setting is group-committed: concurrent writers entering new regions share one
//! page write and one `fdatasync`.

use parking_lot::Mutex;
use std::collections::{BTreeSet, HashMap, HashSet};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Bytes of one persisted page of the bitmap.
const PAGE_BYTES: u64 = 4096;
/// Regions one page covers.
const REGIONS_PER_PAGE: u64 = PAGE_BYTES * 8;

struct State {
    bits: Vec<u8>,
    /// Pages changed in memory since their last write.
    pages_changed: BTreeSet<u64>,
    /// Incremented whenever a bit is set (a change that must be durable).
    set_epoch: u64,
    /// Writes in flight per region.
    in_flight: HashMap<u64, u32>,
    /// Regions written since the last cleaning pass.
    touched: HashSet<u64>,
    /// Keep every bit (partner away or being resynchronised).
    keep: bool,
    /// Regions where the copies are known to differ (a write failed on one
    /// side only): never cleaned, only a resync clears them.
    pinned: HashSet<u64>,
    /// The newest `set_epoch` known durable on disk. A write whose regions'
    /// bits are already set in memory still waits while a newer epoch is not
    /// durable: the bit may be one another writer set and is still writing
    /// (or failed to write), and going ahead on it would leave this write
    /// with no bit on disk.
    durable_epoch: u64,
}

/// The bitmap of one copy, backed by a file.
pub(crate) struct DirtyBitmap {
    file: Arc<std::fs::File>,
    /// Regions the volume has (it grows: [`DirtyBitmap::grow`]).
    regions: AtomicU64,
    region_blocks: u64,
    state: Mutex<State>,
    /// One persister at a time; holds the epoch durable on disk.
    persisted: tokio::sync::Mutex<u64>,
    /// Tests: every write of the file fails.
    #[cfg(test)]
    fail_writes: std::sync::atomic::AtomicBool,
}

/// Holds the regions of one write in flight; dropping it ends the write.
pub(crate) struct WriteHold<'a> {
    bitmap: &'a DirtyBitmap,
    first: u64,
    last: u64,
}

impl Drop for WriteHold<'_> {
    fn drop(&mut self) {
        let mut s = self.bitmap.state.lock();
        for r in self.first..=self.last {
            if let Some(n) = s.in_flight.get_mut(&r) {
                *n -= 1;
                if *n == 0 {
                    s.in_flight.remove(&r);
                }
            }
        }
    }
}

/// Most regions a bitmap tracks (512 MiB of bits in memory; 256 TiB in 64 KiB
/// regions). A size above it is refused before anything grows: the size may
/// come from the partner (its hello, a forwarded grow), and a bitmap for a
/// huge size would take the node's memory (or abort it).
pub const REGIONS_MAX: u64 = 1 << 32;

/// The regions of `block_count` blocks, if at most [`REGIONS_MAX`].
fn regions_of(block_count: u64, region_blocks: u64) -> std::io::Result<u64> {
    let regions = block_count.div_ceil(region_blocks);
    if regions > REGIONS_MAX {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!(
                "{block_count} blocks make {regions} regions of the write-intent bitmap, more than its {REGIONS_MAX}: raise region_bytes"
            ),
        ));
    }
    Ok(regions)
}

/// The file beside the bitmap recording the region size (in bytes) its bits
/// were set for: `[cluster] region` may change between two starts, and a bit
/// read under another region size names other blocks.
fn shape_path(bitmap: &Path) -> std::path::PathBuf {
    let mut p = bitmap.as_os_str().to_owned();
    p.push(".shape");
    p.into()
}

/// The region size the bits on disk were set for: `Ok(None)` when no shape
/// file exists (a new bitmap, or one written before the shape was recorded),
/// `Ok(Some(0))` when it exists and does not read as one (damaged: taken as
/// another size).
fn recorded_region_bytes(path: &Path) -> std::io::Result<Option<u64>> {
    match std::fs::read(path) {
        Ok(b) => Ok(Some(
            serde_json::from_slice::<serde_json::Value>(&b)
                .ok()
                .and_then(|v| v.get("region_bytes")?.as_u64())
                .unwrap_or(0),
        )),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

impl DirtyBitmap {
    /// Opens (or creates) the bitmap file for a volume of `block_count` blocks.
    ///
    /// When the bits on disk were set for another region size than this one
    /// (the shape file beside it says so, or is damaged) and any is set, every
    /// region is marked: a region that had a write in flight, or a change the
    /// partner lacks, is then resynchronised whatever size its bit stood for
    /// (a whole resync). The marks are durable before the new size is
    /// recorded, so a crash in between finds them again.
    pub fn open(
        path: &Path,
        block_count: u64,
        block_size_bytes: u32,
        region_bytes: u32,
    ) -> std::io::Result<DirtyBitmap> {
        let region_blocks = (region_bytes as u64 / block_size_bytes as u64).max(1);
        let regions = regions_of(block_count, region_blocks)?;
        let len = regions.div_ceil(8).div_ceil(PAGE_BYTES) * PAGE_BYTES;
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)?;
        let region_bytes_now = region_blocks * block_size_bytes as u64;
        let shape = shape_path(path);
        let recorded = recorded_region_bytes(&shape)?;
        let mut bits = vec![0u8; len as usize];
        if recorded.is_some_and(|was| was != region_bytes_now) {
            // The whole file as it is, before anything is cut or cleared:
            // with larger regions there are fewer, and the old bits past
            // them (writes to the upper part of the volume) count too.
            let mut old = vec![0u8; file.metadata()?.len() as usize];
            file.read_exact_at(&mut old, 0)?;
            if old.iter().any(|&b| b != 0) {
                tracing::warn!(bitmap = %path.display(), was = recorded.unwrap_or(0), now = region_bytes_now,
                    "the dirty bitmap's region size changed: every region is marked for resynchronisation");
                for r in 0..regions {
                    bits[(r / 8) as usize] |= 1 << (r % 8);
                }
                // durable before the new size is recorded (and before the
                // file is cut): a crash in between marks everything again
                file.write_all_at(&bits, 0)?;
                file.sync_all()?;
            }
        }
        if recorded != Some(region_bytes_now) {
            // (no shape file: a bitmap from before it was recorded is
            // taken at the size configured now, as it always was)
            block::durable::replace_file(
                &shape,
                serde_json::json!({ "region_bytes": region_bytes_now })
                    .to_string()
                    .as_bytes(),
            )?;
        }
        let have = file.metadata()?.len().min(len);
        file.read_exact_at(&mut bits[..have as usize], 0)?;
        if file.metadata()?.len() != len {
            file.set_len(len)?;
        }
        // bits past the last region stay clear
        for r in regions..len * 8 {
            bits[(r / 8) as usize] &= !(1 << (r % 8));
        }
        Ok(DirtyBitmap {
            file: Arc::new(file),
            regions: AtomicU64::new(regions),
            region_blocks,
            state: Mutex::new(State {
                bits,
                pages_changed: BTreeSet::new(),
                set_epoch: 0,
                in_flight: HashMap::new(),
                touched: HashSet::new(),
                keep: false,
                pinned: HashSet::new(),
                durable_epoch: 0,
            }),
            persisted: tokio::sync::Mutex::new(0),
            #[cfg(test)]
            fail_writes: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// Number of regions.
    #[cfg(test)]
    pub fn regions(&self) -> u64 {
        self.regions.load(Ordering::Acquire)
    }

    /// Blocks per region.
    pub fn region_blocks(&self) -> u64 {
        self.region_blocks
    }

    fn span(&self, lba: u64, blocks: u64) -> (u64, u64) {
        let first = lba / self.region_blocks;
        let last = (lba + blocks.max(1) - 1) / self.region_blocks;
        let regions = self.regions.load(Ordering::Acquire);
        (first, last.min(regions.saturating_sub(1)))
    }

    fn set_bit(s: &mut State, r: u64) -> bool {
        let (i, m) = ((r / 8) as usize, 1u8 << (r % 8));
        if s.bits[i] & m != 0 {
            return false;
        }
        s.bits[i] |= m;
        s.pages_changed.insert(r / REGIONS_PER_PAGE);
        true
    }

    fn clear_bit(s: &mut State, r: u64) {
        let (i, m) = ((r / 8) as usize, 1u8 << (r % 8));
        if s.bits[i] & m != 0 {
            s.bits[i] &= !m;
            s.pages_changed.insert(r / REGIONS_PER_PAGE);
        }
    }

    /// Marks the regions of a write dirty and durable before it starts; the hold
    /// keeps them from being cleaned until dropped.
    pub async fn begin_write(&self, lba: u64, blocks: u64) -> std::io::Result<WriteHold<'_>> {
        let (first, last) = self.span(lba, blocks);
        let need = {
            let mut s = self.state.lock();
            let mut changed = false;
            for r in first..=last {
                *s.in_flight.entry(r).or_insert(0) += 1;
                s.touched.insert(r);
                changed |= Self::set_bit(&mut s, r);
            }
            if changed {
                s.set_epoch += 1;
            }
            (s.set_epoch > s.durable_epoch).then_some(s.set_epoch)
        };
        let hold = WriteHold {
            bitmap: self,
            first,
            last,
        };
        if let Some(epoch) = need {
            self.persist_through(epoch).await?;
        }
        Ok(hold)
    }

    /// Writes the changed pages and syncs them, unless an earlier persist already
    /// covered `epoch` (group commit).
    async fn persist_through(&self, epoch: u64) -> std::io::Result<()> {
        let mut done = self.persisted.lock().await;
        if *done >= epoch {
            return Ok(());
        }
        let (pages, upto) = {
            let mut s = self.state.lock();
            let pages: Vec<(u64, Vec<u8>)> = std::mem::take(&mut s.pages_changed)
                .into_iter()
                .map(|p| {
                    let at = (p * PAGE_BYTES) as usize;
                    (p, s.bits[at..at + PAGE_BYTES as usize].to_vec())
                })
                .collect();
            (pages, s.set_epoch)
        };
        let file = self.file.clone();
        let ids: Vec<u64> = pages.iter().map(|(p, _)| *p).collect();
        #[cfg(test)]
        let fail = self.fail_writes.load(Ordering::Acquire);
        let r = tokio::task::spawn_blocking(move || -> std::io::Result<()> {
            #[cfg(test)]
            if fail {
                return Err(std::io::Error::other("injected write failure"));
            }
            for (p, data) in &pages {
                file.write_all_at(data, p * PAGE_BYTES)?;
            }
            file.sync_data()
        })
        .await
        .map_err(std::io::Error::other)
        .and_then(|r| r);
        if let Err(e) = r {
            // not durable: the pages stay to be written by the next persist
            // (a writer waiting behind this one writes them again instead of
            // finding nothing changed and taking its bit as durable)
            self.state.lock().pages_changed.extend(ids);
            return Err(e);
        }
        {
            let mut st = self.state.lock();
            st.durable_epoch = st.durable_epoch.max(upto);
        }
        *done = upto;
        Ok(())
    }

    /// Persists every change now (clears included).
    pub async fn persist(&self) -> std::io::Result<()> {
        let epoch = {
            let mut s = self.state.lock();
            s.set_epoch += 1;
            s.set_epoch
        };
        self.persist_through(epoch).await
    }

    /// Keep every bit from now on (true) or let idle regions be cleaned (false).
    pub fn set_keep(&self, keep: bool) {
        self.state.lock().keep = keep;
    }

    /// The first half of a cleaning pass that must flush both copies before
    /// it clears: the regions that could be cleared now (set, no write in
    /// flight, none begun since the previous pass, not pinned); a new period
    /// starts. Every write those regions had has finished, so a flush begun
    /// after this covers them all; [`DirtyBitmap::clear_if_still_idle`] then
    /// clears those no write has begun in since. None while bits are kept.
    pub fn idle_candidates(&self) -> Vec<u64> {
        let mut s = self.state.lock();
        if s.keep {
            s.touched.clear();
            return Vec::new();
        }
        let out: Vec<u64> = self
            .set_regions_locked(&s)
            .into_iter()
            .filter(|r| {
                !s.in_flight.contains_key(r) && !s.touched.contains(r) && !s.pinned.contains(r)
            })
            .collect();
        s.touched.clear();
        out
    }

    /// Clears those of `regions` (from [`DirtyBitmap::idle_candidates`]) that
    /// no write has begun in since; returns how many.
    pub fn clear_if_still_idle(&self, regions: &[u64]) -> u64 {
        let mut s = self.state.lock();
        if s.keep {
            return 0;
        }
        let mut cleared = 0;
        for &r in regions {
            if !s.in_flight.contains_key(&r) && !s.touched.contains(&r) && !s.pinned.contains(&r) {
                Self::clear_bit(&mut s, r);
                cleared += 1;
            }
        }
        cleared
    }

    /// One cleaning pass without a flush in the middle (tests): clears regions
    /// with no write in flight and none since the previous pass. Returns how
    /// many were cleared.
    #[cfg(test)]
    pub fn clean_idle(&self) -> u64 {
        let candidates = self.idle_candidates();
        self.clear_if_still_idle(&candidates)
    }

    fn set_regions_locked(&self, s: &State) -> Vec<u64> {
        let mut out = Vec::new();
        for (i, &b) in s.bits.iter().enumerate() {
            if b == 0 {
                continue;
            }
            for k in 0..8 {
                if b & (1 << k) != 0 {
                    out.push(i as u64 * 8 + k);
                }
            }
        }
        out
    }

    /// Every dirty region, in order.
    pub fn set_regions(&self) -> Vec<u64> {
        let s = self.state.lock();
        self.set_regions_locked(&s)
    }

    /// Regions kept dirty until a resync copies them ([`Bitmap::pin`]), in order.
    pub fn pinned_regions(&self) -> Vec<u64> {
        let mut out: Vec<u64> = self.state.lock().pinned.iter().copied().collect();
        out.sort_unstable();
        out
    }

    /// Number of dirty regions.
    pub fn count(&self) -> u64 {
        self.state
            .lock()
            .bits
            .iter()
            .map(|b| b.count_ones() as u64)
            .sum()
    }

    /// The bits, LSB first in each byte, covering every region.
    pub fn snapshot(&self) -> Vec<u8> {
        let s = self.state.lock();
        s.bits[..self.regions.load(Ordering::Acquire).div_ceil(8) as usize].to_vec()
    }

    /// Sets the bits of `bits` (regions from `first_region` on) and persists them.
    pub async fn merge(&self, first_region: u64, bits: &[u8]) -> std::io::Result<()> {
        {
            let regions = self.regions.load(Ordering::Acquire);
            let mut s = self.state.lock();
            for (i, &b) in bits.iter().enumerate() {
                for k in 0..8u64 {
                    let r = first_region + i as u64 * 8 + k;
                    if b & (1 << k) != 0 && r < regions {
                        Self::set_bit(&mut s, r);
                    }
                }
            }
        }
        self.persist().await
    }

    /// Marks every region dirty (a full sync) and persists.
    pub async fn set_all(&self) -> std::io::Result<()> {
        {
            let mut s = self.state.lock();
            for r in 0..self.regions.load(Ordering::Acquire) {
                Self::set_bit(&mut s, r);
            }
        }
        self.persist().await
    }

    /// Clears region `r` (it was just copied to the partner) unless a write to
    /// it is in flight (lazily persisted).
    pub fn clear_region(&self, r: u64) {
        let mut s = self.state.lock();
        if !s.in_flight.contains_key(&r) {
            s.pinned.remove(&r);
            Self::clear_bit(&mut s, r);
        }
    }

    /// Keeps the regions of a range dirty until a resync copies them.
    pub fn pin(&self, lba: u64, blocks: u64) {
        let (first, last) = self.span(lba, blocks);
        let mut s = self.state.lock();
        for r in first..=last {
            Self::set_bit(&mut s, r);
            s.pinned.insert(r);
        }
    }

    /// The regions `block_count` blocks need, if the bitmap may track them
    /// (see [`REGIONS_MAX`]).
    pub fn check_size(&self, block_count: u64) -> std::io::Result<u64> {
        regions_of(block_count, self.region_blocks)
    }

    /// Covers a volume grown to `block_count` blocks: the file grows (the new
    /// regions are clean: the new blocks read as zeroes on both copies) before the
    /// regions count. Never shrinks.
    pub async fn grow(&self, block_count: u64) -> std::io::Result<()> {
        let regions = self.check_size(block_count)?;
        if regions <= self.regions.load(Ordering::Acquire) {
            return Ok(());
        }
        let len = regions.div_ceil(8).div_ceil(PAGE_BYTES) * PAGE_BYTES;
        let _one = self.persisted.lock().await;
        let file = self.file.clone();
        tokio::task::spawn_blocking(move || -> std::io::Result<()> {
            if file.metadata()?.len() < len {
                file.set_len(len)?;
                file.sync_all()?;
            }
            Ok(())
        })
        .await
        .map_err(std::io::Error::other)??;
        let mut s = self.state.lock();
        if (s.bits.len() as u64) < len {
            s.bits.resize(len as usize, 0);
        }
        self.regions.fetch_max(regions, Ordering::AcqRel);
        Ok(())
    }

    /// Clears every region with no write in flight and persists.
    pub async fn clear_all(&self) -> std::io::Result<()> {
        {
            let mut s = self.state.lock();
            for r in self.set_regions_locked(&s) {
                if !s.in_flight.contains_key(&r) {
                    s.pinned.remove(&r);
                    Self::clear_bit(&mut s, r);
                }
            }
        }
        self.persist().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn set_bits_survive_reopen_and_clean_respects_writes_in_flight() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("bm");
        let b = DirtyBitmap::open(&p, 100_000, 512, 65536).unwrap();
        assert_eq!(b.region_blocks(), 128);
        assert_eq!(b.regions(), 782);
        let h1 = b.begin_write(0, 8).await.unwrap();
        let h2 = b.begin_write(128 * 700 + 120, 16).await.unwrap(); // spans 700 and 701
        assert_eq!(b.set_regions(), vec![0, 700, 701]);
        // reopened without any further persist: set bits are durable
        let b2 = DirtyBitmap::open(&p, 100_000, 512, 65536).unwrap();
        assert_eq!(b2.set_regions(), vec![0, 700, 701]);
        drop(h1);
        // touched in this period: not cleaned yet
        assert_eq!(b.clean_idle(), 0);
        // region 0 idle for a whole period, 700/701 still in flight
        assert_eq!(b.clean_idle(), 1);
        assert_eq!(b.set_regions(), vec![700, 701]);
        b.set_keep(true);
        drop(h2);
        b.clean_idle();
        assert_eq!(b.clean_idle(), 0, "kept while the partner is away");
        b.set_keep(false);
        assert_eq!(b.clean_idle(), 2);
        b.persist().await.unwrap();
        let b3 = DirtyBitmap::open(&p, 100_000, 512, 65536).unwrap();
        assert_eq!(b3.count(), 0);
    }

    #[tokio::test]
    async fn merge_snapshot_and_set_all() {
        let d = tempfile::tempdir().unwrap();
        let b = DirtyBitmap::open(&d.path().join("bm"), 1000, 4096, 65536).unwrap();
        assert_eq!(b.regions(), 63);
        b.merge(0, &[0b1000_0001, 0, 0, 0, 0, 0, 0, 0xff])
            .await
            .unwrap();
        assert_eq!(b.set_regions(), vec![0, 7, 56, 57, 58, 59, 60, 61, 62]);
        assert_eq!(b.snapshot().len(), 8);
        b.set_all().await.unwrap();
        assert_eq!(b.count(), 63);
        b.clear_all().await.unwrap();
        assert_eq!(b.count(), 0);
    }

    /// The region size changed between two opens (`[cluster] region`
    /// edited on both nodes): a bit set for a 64 KiB region must still cover
    /// the blocks that were written, so every region is marked; a clean
    /// bitmap stays clean. Before, the old bits were read at the new size and
    /// named other blocks: the written ones were never resynchronised.
    #[tokio::test]
    async fn a_changed_region_size_keeps_the_written_blocks_marked() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("bm");
        let b = DirtyBitmap::open(&p, 100_000, 512, 65536).unwrap();
        let lba = 128 * 5 + 3; // in region 5 of 128 blocks
                               // (the hold ends; the bit stays set until a cleaning pass)
        drop(b.begin_write(lba, 1).await.unwrap());
        drop(b);
        for region_bytes in [131072u32, 32768, 65536] {
            let again = DirtyBitmap::open(&p, 100_000, 512, region_bytes).unwrap();
            let r = lba / again.region_blocks();
            assert!(
                again.set_regions().contains(&r),
                "block {lba} not marked with {region_bytes}-byte regions"
            );
            assert_eq!(again.count(), again.regions(), "every region marked");
        }
        // a write near the end of the volume, whose 64 KiB region lies past
        // the last 128 KiB region: the only bit set
        let top = d.path().join("top");
        let b = DirtyBitmap::open(&top, 100_000, 512, 65536).unwrap();
        drop(b.begin_write(99_990, 1).await.unwrap());
        assert_eq!(b.set_regions(), vec![781]);
        drop(b);
        let again = DirtyBitmap::open(&top, 100_000, 512, 131072).unwrap();
        assert!(
            again.set_regions().contains(&(99_990 / 256)),
            "the write near the end"
        );
        assert_eq!(again.count(), again.regions());
        // a clean bitmap needs no resync under a new size
        let clean = d.path().join("clean");
        drop(DirtyBitmap::open(&clean, 100_000, 512, 65536).unwrap());
        let again = DirtyBitmap::open(&clean, 100_000, 512, 131072).unwrap();
        assert_eq!(again.count(), 0);
        // the same size again: the bits are read as they are
        let same = d.path().join("same");
        let b = DirtyBitmap::open(&same, 100_000, 512, 65536).unwrap();
        drop(b.begin_write(0, 1).await.unwrap());
        let again = DirtyBitmap::open(&same, 100_000, 512, 65536).unwrap();
        assert_eq!(again.set_regions(), vec![0]);
        // a damaged shape file is taken as another size
        std::fs::write(shape_path(&same), b"{garbage").unwrap();
        let again = DirtyBitmap::open(&same, 100_000, 512, 65536).unwrap();
        assert_eq!(again.count(), again.regions());
    }

    /// A bit whose page write failed is not taken as durable by the writes
    /// that follow into its region: each tries to persist it (and fails while
    /// the file cannot be written), and once a write succeeds the bit is on
    /// disk. Before, the failed page was dropped: the next write found the bit
    /// set in memory, wrote nothing and went ahead with no bit on disk.
    #[tokio::test]
    async fn a_failed_page_write_is_not_taken_as_durable() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("bm");
        let b = DirtyBitmap::open(&p, 100_000, 512, 65536).unwrap();
        b.fail_writes.store(true, Ordering::Release);
        assert!(b.begin_write(0, 8).await.is_err());
        assert!(b.begin_write(8, 8).await.is_err(), "the bit is not on disk");
        b.fail_writes.store(false, Ordering::Release);
        let _h = b.begin_write(16, 8).await.unwrap();
        let again = DirtyBitmap::open(&p, 100_000, 512, 65536).unwrap();
        assert_eq!(
            again.set_regions(),
            vec![0],
            "on disk once a write succeeded"
        );
    }
}
