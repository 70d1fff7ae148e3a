//! Counters of a cache and the status it reports (hit rates total and recent, dirty
//! bytes, destage rate, occupancy, devices, memory, the advisor's curve).

use serde::Serialize;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Instant;

/// Seconds the "recent" figures cover.
pub(crate) const RECENT_SECS: u64 = 10;

/// Monotonic counters, updated on the data path without locks.
#[derive(Default)]
pub(crate) struct Counters {
    pub read_hits: AtomicU64,
    pub read_misses: AtomicU64,
    pub write_hits: AtomicU64,
    pub write_misses: AtomicU64,
    pub bypassed_reads: AtomicU64,
    pub bypassed_writes: AtomicU64,
    pub fills: AtomicU64,
    pub destaged_bytes: AtomicU64,
    pub destage_errors: AtomicU64,
    pub backing_errors: AtomicU64,
    pub ssd_errors: AtomicU64,
    pub frameless_writes: AtomicU64,
    pub stripe_destages: AtomicU64,
}

#[derive(Clone, Copy, Default, Debug)]
pub(crate) struct Snapshot {
    pub read_hits: u64,
    pub read_misses: u64,
    pub write_hits: u64,
    pub write_misses: u64,
    pub destaged_bytes: u64,
}

impl Counters {
    pub(crate) fn snapshot(&self) -> Snapshot {
        Snapshot {
            read_hits: self.read_hits.load(Relaxed),
            read_misses: self.read_misses.load(Relaxed),
            write_hits: self.write_hits.load(Relaxed),
            write_misses: self.write_misses.load(Relaxed),
            destaged_bytes: self.destaged_bytes.load(Relaxed),
        }
    }

    pub(crate) fn add(c: &AtomicU64, n: u64) {
        c.fetch_add(n, Relaxed);
    }
}

/// One snapshot per second for the last [`RECENT_SECS`] seconds.
#[derive(Default)]
pub(crate) struct Window {
    samples: VecDeque<(Instant, Snapshot)>,
}

impl Window {
    pub(crate) fn push(&mut self, now: Instant, s: Snapshot) {
        self.samples.push_back((now, s));
        while self.samples.len() > RECENT_SECS as usize + 1 {
            self.samples.pop_front();
        }
    }

    /// The oldest sample of the window, to subtract from the current counters.
    pub(crate) fn oldest(&self) -> Option<(Instant, Snapshot)> {
        self.samples.front().copied()
    }
}

fn ratio(hits: u64, misses: u64) -> Option<f64> {
    let n = hits + misses;
    (n > 0).then(|| hits as f64 / n as f64)
}

/// One cache device in the status.
#[derive(Clone, Debug, Serialize)]
pub struct DeviceStatus {
    /// The device's name.
    pub name: String,
    /// "ok" or "failed".
    pub state: String,
    /// Reads of cached data it answered with a medium error since the start
    /// (unreadable sectors: the device stays in service, the data is read
    /// from the other copy or the backing volume and written again).
    pub media_errors: u64,
}

/// One point of the advisor's estimated curve.
#[derive(Clone, Debug, Serialize)]
pub struct AdvicePoint {
    /// Cache size.
    pub cache_bytes: u64,
    /// Estimated hit ratio at that size (0..1).
    pub hit_ratio: f64,
}

/// Everything a cache reports.
#[derive(Clone, Debug, Serialize)]
pub struct CacheStatus {
    /// The cache's name.
    pub name: String,
    /// Configured mode.
    pub mode: String,
    /// "ok", "degraded: write-through until repaired", "destaging before ..." etc.
    pub state: String,
    /// Cache block size.
    pub block_bytes: u32,
    /// Frames (cache blocks the cache can hold).
    pub frames: u32,
    /// Bytes of cache (frames x block size).
    pub capacity_bytes: u64,
    /// Blocks cached now.
    pub cached_blocks: u64,
    /// Bytes of valid data held (4 KiB sectors).
    pub valid_bytes: u64,
    /// Cached blocks over frames, percent.
    pub occupancy_percent: f64,
    /// Frames holding data not yet on the backing volume.
    pub dirty_blocks: u64,
    /// Bytes not yet on the backing volume (dirty 4 KiB sectors).
    pub dirty_bytes: u64,
    /// Of `dirty_bytes`, those the destage found no cache device could read
    /// (medium errors on every copy): they stay dirty, and reads of them
    /// fail, until the host writes them again; a drain cannot end meanwhile.
    pub unreadable_dirty_bytes: u64,
    /// Of `unreadable_dirty_bytes`, those lost for good: a mirror's resilver
    /// found them unreadable on the survivor, and the mirror became whole
    /// without them. Recorded in the table (they outlive a restart); reads
    /// of them fail until the host writes them.
    pub lost_dirty_bytes: u64,
    /// Cache-block accesses by reads served from the cache / not.
    pub read_hits: u64,
    /// See `read_hits`.
    pub read_misses: u64,
    /// Cache-block accesses by writes that found the block cached / not.
    pub write_hits: u64,
    /// See `write_hits`.
    pub write_misses: u64,
    /// Read hit ratio since start (0..1), if any read.
    pub read_hit_ratio: Option<f64>,
    /// Write hit ratio since start.
    pub write_hit_ratio: Option<f64>,
    /// Read hit ratio over the last 10 seconds.
    pub recent_read_hit_ratio: Option<f64>,
    /// Write hit ratio over the last 10 seconds.
    pub recent_write_hit_ratio: Option<f64>,
    /// Requests of sequential streams that bypassed the cache.
    pub bypassed_reads: u64,
    /// See `bypassed_reads`.
    pub bypassed_writes: u64,
    /// Blocks read from the backing volume into the cache.
    pub fills: u64,
    /// Bytes destaged since start.
    pub destaged_bytes: u64,
    /// Destage rate over the last 10 seconds.
    pub destage_mb_s: f64,
    /// Destage attempts the backing volume failed (the data stays dirty).
    pub destage_errors: u64,
    /// Other errors returned by the backing volume.
    pub backing_errors: u64,
    /// Write-back writes (cache blocks) sent to the backing volume because every
    /// frame held dirty data: the destage was what limited the cache.
    pub frameless_writes: u64,
    /// Destage writes of a whole stripe of the backing volume (its gaps read
    /// from it), written instead of several read-modify-writes.
    pub stripe_destages: u64,
    /// Cache devices.
    pub devices: Vec<DeviceStatus>,
    /// Heap bytes of the in-memory block map (policy, index, sector bitmaps).
    pub map_memory_bytes: u64,
    /// The same per GiB of cache.
    pub map_bytes_per_gib: u64,
    /// Heap bytes of the advisor.
    pub advisor_memory_bytes: u64,
    /// The advisor's estimated hit ratio at several cache sizes.
    pub advisor_curve: Vec<AdvicePoint>,
    /// The advisor's smallest cache for a 90% hit ratio, if one of its sizes gets there.
    pub advisor_bytes_for_90_percent: Option<u64>,
}

pub(crate) struct Rates {
    pub read: Option<f64>,
    pub write: Option<f64>,
    pub recent_read: Option<f64>,
    pub recent_write: Option<f64>,
    pub destage_mb_s: f64,
}

pub(crate) fn rates(now: Snapshot, then: Option<(Instant, Snapshot)>) -> Rates {
    let (recent_read, recent_write, destage_mb_s) = match then {
        Some((t, o)) => {
            let secs = t.elapsed().as_secs_f64().max(1e-3);
            (
                ratio(now.read_hits - o.read_hits, now.read_misses - o.read_misses),
                ratio(
                    now.write_hits - o.write_hits,
                    now.write_misses - o.write_misses,
                ),
                (now.destaged_bytes - o.destaged_bytes) as f64 / secs / 1e6,
            )
        }
        None => (None, None, 0.0),
    };
    Rates {
        read: ratio(now.read_hits, now.read_misses),
        write: ratio(now.write_hits, now.write_misses),
        recent_read,
        recent_write,
        destage_mb_s,
    }
}
