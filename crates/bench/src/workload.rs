//! Workload specifications and the standard suite of SAN benchmark patterns.

use crate::BenchError;
use block::Geometry;
use serde::{Deserialize, Serialize};

/// One benchmark pattern: what I/O to issue, how much of it in parallel, for how long.
///
/// Offsets are aligned to `block_size_bytes` inside the region. "Sequential" means each
/// thread walks its own contiguous slice of the region (the region split in `threads`
/// equal parts), one block after the other, wrapping at the end of its slice; its
/// `queue_depth` in-flight I/Os are consecutive blocks. "Random" picks a uniformly
/// random block of the whole region.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Workload {
    /// Pattern name, e.g. `4k-randread`; it labels reports and charts.
    pub name: String,
    /// Size of every I/O, a multiple of the volume's logical block size.
    pub block_size_bytes: u32,
    /// Percentage of I/Os that are reads (0..=100); the rest are writes.
    pub read_pct: u8,
    /// Percentage of I/Os at a random offset (100 = random, 0 = sequential).
    pub random_pct: u8,
    /// Number of independent workers ("threads", each a tokio task).
    pub threads: u32,
    /// I/Os each worker keeps in flight.
    pub queue_depth: u32,
    /// Length of the measured window.
    pub duration_secs: f64,
    /// Warm-up before the measured window; its I/O is excluded from the figures.
    #[serde(default)]
    pub ramp_up_secs: f64,
    /// Start of the region in bytes (a multiple of `block_size_bytes`).
    #[serde(default)]
    pub region_offset_bytes: u64,
    /// Size of the region in bytes; `None` means up to the end of the volume.
    #[serde(default)]
    pub region_size_bytes: Option<u64>,
    /// Seed of the offset and read/write choices (worker `t` uses `seed + t`).
    #[serde(default)]
    pub seed: u64,
    /// Write self-checking records and check every read (see [`crate::verify`]).
    #[serde(default)]
    pub verify: bool,
    /// Issue writes with FUA (forced unit access).
    #[serde(default)]
    pub fua: bool,
    /// Stop after this many I/Os have been issued (ramp-up included), even if the
    /// duration has not elapsed. `None`: run for the duration.
    #[serde(default)]
    pub io_count_max: Option<u64>,
}

/// Default workers of the published reports.
pub const DEFAULT_THREADS: u32 = 8;
/// Default outstanding I/O per worker of the published reports.
pub const DEFAULT_QUEUE_DEPTH: u32 = 8;
/// Default measured window.
pub const DEFAULT_DURATION_SECS: f64 = 30.0;
/// Default warm-up.
pub const DEFAULT_RAMP_UP_SECS: f64 = 5.0;

impl Workload {
    /// A pattern with the report defaults: 8 threads x 8 QD, 30 s after a 5 s ramp-up,
    /// the whole volume, seed 1, no verification.
    pub fn new(name: &str, block_size_bytes: u32, read_pct: u8, random_pct: u8) -> Self {
        Workload {
            name: name.to_string(),
            block_size_bytes,
            read_pct,
            random_pct,
            threads: DEFAULT_THREADS,
            queue_depth: DEFAULT_QUEUE_DEPTH,
            duration_secs: DEFAULT_DURATION_SECS,
            ramp_up_secs: DEFAULT_RAMP_UP_SECS,
            region_offset_bytes: 0,
            region_size_bytes: None,
            seed: 1,
            verify: false,
            fua: false,
            io_count_max: None,
        }
    }

    /// Checks the spec against a volume's geometry and resolves the region.
    pub fn region(&self, g: &Geometry) -> Result<Region, BenchError> {
        let bad =
            |field: &'static str, reason: String| BenchError::InvalidWorkload { field, reason };
        let vbs = g.block_size_bytes;
        if self.block_size_bytes == 0 || !self.block_size_bytes.is_multiple_of(vbs) {
            return Err(bad(
                "block_size_bytes",
                format!(
                    "{} is not a positive multiple of the volume block size {vbs}",
                    self.block_size_bytes
                ),
            ));
        }
        let io_blocks = self.block_size_bytes / vbs;
        if io_blocks > g.max_io_blocks.max(1) {
            return Err(bad(
                "block_size_bytes",
                format!(
                    "{} exceeds the volume's largest I/O of {} bytes",
                    self.block_size_bytes,
                    g.max_io_blocks as u64 * vbs as u64
                ),
            ));
        }
        if self.read_pct > 100 {
            return Err(bad("read_pct", format!("{} > 100", self.read_pct)));
        }
        if self.random_pct > 100 {
            return Err(bad("random_pct", format!("{} > 100", self.random_pct)));
        }
        if self.threads == 0 || self.threads > 4096 {
            return Err(bad(
                "threads",
                format!("{} is not in 1..=4096", self.threads),
            ));
        }
        if self.queue_depth == 0 || self.queue_depth > 1024 {
            return Err(bad(
                "queue_depth",
                format!("{} is not in 1..=1024", self.queue_depth),
            ));
        }
        if !(self.duration_secs.is_finite() && self.duration_secs > 0.0) {
            return Err(bad(
                "duration_secs",
                format!("{} is not a positive number", self.duration_secs),
            ));
        }
        if !(self.ramp_up_secs.is_finite() && self.ramp_up_secs >= 0.0) {
            return Err(bad(
                "ramp_up_secs",
                format!("{} is not a non-negative number", self.ramp_up_secs),
            ));
        }
        let bs = self.block_size_bytes as u64;
        if !self.region_offset_bytes.is_multiple_of(bs) {
            return Err(bad(
                "region_offset_bytes",
                format!(
                    "{} is not aligned to the block size {bs}",
                    self.region_offset_bytes
                ),
            ));
        }
        let size = g.size_bytes();
        if self.region_offset_bytes >= size {
            return Err(bad(
                "region_offset_bytes",
                format!(
                    "{} is beyond the volume ({size} bytes)",
                    self.region_offset_bytes
                ),
            ));
        }
        let avail = size - self.region_offset_bytes;
        let region_bytes = self.region_size_bytes.unwrap_or(avail);
        if region_bytes > avail {
            return Err(bad(
                "region_size_bytes",
                format!("{region_bytes} runs past the end of the volume ({avail} bytes available)"),
            ));
        }
        let blocks = region_bytes / bs;
        if blocks == 0 {
            return Err(bad(
                "region_size_bytes",
                format!("{region_bytes} holds no block of {bs} bytes"),
            ));
        }
        if self.verify && vbs < crate::verify::RECORD_HEADER_BYTES as u32 {
            return Err(bad(
                "verify",
                format!("volume block size {vbs} is too small for a record header"),
            ));
        }
        Ok(Region {
            offset_bytes: self.region_offset_bytes,
            io_block_bytes: self.block_size_bytes,
            blocks,
            volume_block_bytes: vbs,
        })
    }
}

/// The part of a volume a workload touches, in I/O blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Region {
    /// Byte offset of block 0 of the region on the volume.
    pub offset_bytes: u64,
    /// Size of one I/O block (the workload's block size).
    pub io_block_bytes: u32,
    /// Number of I/O blocks in the region.
    pub blocks: u64,
    /// The volume's logical block size (one verification record each).
    pub volume_block_bytes: u32,
}

impl Region {
    /// Volume LBA of the first logical block of I/O block `block`.
    pub fn lba_of(&self, block: u64) -> u64 {
        (self.offset_bytes + block * self.io_block_bytes as u64) / self.volume_block_bytes as u64
    }

    /// Logical blocks per I/O block.
    pub fn lbas_per_block(&self) -> u32 {
        self.io_block_bytes / self.volume_block_bytes
    }

    /// Size of the region in bytes.
    pub fn size_bytes(&self) -> u64 {
        self.blocks * self.io_block_bytes as u64
    }
}

/// An ordered list of workloads run one after the other.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Suite {
    /// The patterns, in run order.
    pub workloads: Vec<Workload>,
}

impl Suite {
    /// The eight patterns of the published SAN reports, 8 threads x 8 QD each:
    /// `4k-randread`, `4k-randwrite`, `8k-randrw67`, `8k-seqrw67`, `64k-seqread`,
    /// `64k-seqwrite`, `256k-seqread`, `256k-seqwrite`.
    pub fn standard() -> Self {
        const K: u32 = 1024;
        Suite {
            workloads: vec![
                Workload::new("4k-randread", 4 * K, 100, 100),
                Workload::new("4k-randwrite", 4 * K, 0, 100),
                Workload::new("8k-randrw67", 8 * K, 67, 100),
                Workload::new("8k-seqrw67", 8 * K, 67, 0),
                Workload::new("64k-seqread", 64 * K, 100, 0),
                Workload::new("64k-seqwrite", 64 * K, 0, 0),
                Workload::new("256k-seqread", 256 * K, 100, 0),
                Workload::new("256k-seqwrite", 256 * K, 0, 0),
            ],
        }
    }

    /// Sets the measured window and ramp-up of every pattern.
    pub fn with_duration_secs(mut self, duration_secs: f64, ramp_up_secs: f64) -> Self {
        for w in &mut self.workloads {
            w.duration_secs = duration_secs;
            w.ramp_up_secs = ramp_up_secs;
        }
        self
    }

    /// Sets threads and queue depth of every pattern.
    pub fn with_threads_qd(mut self, threads: u32, queue_depth: u32) -> Self {
        for w in &mut self.workloads {
            w.threads = threads;
            w.queue_depth = queue_depth;
        }
        self
    }

    /// Keeps only the patterns whose name is in `names` (in suite order).
    pub fn only(mut self, names: &[&str]) -> Self {
        self.workloads.retain(|w| names.contains(&w.name.as_str()));
        self
    }

    /// The pattern called `name`.
    pub fn get(&self, name: &str) -> Option<&Workload> {
        self.workloads.iter().find(|w| w.name == name)
    }
}
