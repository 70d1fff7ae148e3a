//! What a cache is told: its mode, block size, policy and thresholds.

use crate::policy::{Admission, PolicyKind};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// How writes meet the cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
#[repr(u8)]
pub enum CacheMode {
    /// Reads are cached; writes go to the backing volume and update blocks already
    /// cached. Losing a cache device loses nothing.
    ReadOnly = 1,
    /// Like read-only, but written blocks are also admitted to the cache.
    WriteThrough = 2,
    /// Writes go to the backing volume only and drop what the cache held for them.
    WriteAround = 3,
    /// Writes are acknowledged once on both mirrored cache devices (data and map
    /// durable), and destaged to the backing volume later.
    WriteBack = 4,
}

impl CacheMode {
    /// The mode's name, as the configuration spells it.
    pub fn name(self) -> &'static str {
        match self {
            CacheMode::ReadOnly => "read-only",
            CacheMode::WriteThrough => "write-through",
            CacheMode::WriteAround => "write-around",
            CacheMode::WriteBack => "write-back",
        }
    }

    pub(crate) fn from_u8(v: u8) -> Option<CacheMode> {
        Some(match v {
            1 => CacheMode::ReadOnly,
            2 => CacheMode::WriteThrough,
            3 => CacheMode::WriteAround,
            4 => CacheMode::WriteBack,
            _ => return None,
        })
    }
}

impl fmt::Display for CacheMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for CacheMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Ok(match s {
            "read-only" | "ro" => CacheMode::ReadOnly,
            "write-through" | "wt" => CacheMode::WriteThrough,
            "write-around" | "wa" => CacheMode::WriteAround,
            "write-back" | "wb" => CacheMode::WriteBack,
            _ => {
                return Err(format!(
                    "unknown cache mode {s:?} (read-only, write-through, write-around, write-back)"
                ))
            }
        })
    }
}

/// Settings of one cache.
#[derive(Clone, Debug)]
pub struct CacheConfig {
    /// How writes meet the cache.
    pub mode: CacheMode,
    /// Cache block size in bytes: a power of two from 4 KiB to 256 KiB.
    pub block_bytes: u32,
    /// Use at most this many bytes of each device for frames (`None`: all of it).
    pub size_bytes: Option<u64>,
    /// Eviction policy.
    pub policy: PolicyKind,
    /// Admission filter.
    pub admission: Admission,
    /// A request continuing a sequential stream longer than this bypasses the
    /// cache; 0 never bypasses.
    pub seq_cutoff_bytes: u64,
    /// Below this share of dirty frames (percent) destaging runs only while the
    /// volume is idle.
    pub dirty_low_percent: u8,
    /// Above this share destaging runs at full speed; between the two it yields to
    /// foreground I/O (about half the backing volume's time).
    pub dirty_high_percent: u8,
    /// Most bytes destaged in one batch (sorted by address and coalesced).
    pub destage_batch_bytes: u64,
    /// Run the sizing advisor (sampled miniature caches beside the real one).
    pub advisor: bool,
    /// Identifies the backing volume (a pool's uuid), kept in the superblocks:
    /// devices that hold blocks of another volume are not served from, and
    /// dirty blocks of another volume are never destaged into this one (the
    /// open is refused). 0: no identity (checked by size only).
    pub backing_id: u128,
    /// The backing volume was served without this cache since the devices'
    /// table was written (freesan's `cache-fronts.toml` says so): their clean
    /// blocks may be stale and their dirty blocks older than what the volume
    /// holds, so the cache starts empty, and refuses to open if it holds dirty
    /// data. Not kept on the devices.
    pub table_stale: bool,
}

impl Default for CacheConfig {
    fn default() -> Self {
        CacheConfig {
            mode: CacheMode::ReadOnly,
            block_bytes: 128 * 1024,
            size_bytes: None,
            policy: PolicyKind::DEFAULT,
            admission: Admission::DEFAULT,
            seq_cutoff_bytes: 4 << 20,
            dirty_low_percent: 10,
            dirty_high_percent: 60,
            destage_batch_bytes: 16 << 20,
            advisor: true,
            backing_id: 0,
            table_stale: false,
        }
    }
}

impl CacheConfig {
    /// Checks the settings; the error says which one is wrong.
    pub fn validate(&self) -> Result<(), String> {
        let b = self.block_bytes as u64;
        if !b.is_power_of_two() || !(4096..=262144).contains(&b) {
            return Err(format!(
                "cache block size {b} must be a power of two from 4K to 256K"
            ));
        }
        if self.dirty_low_percent > self.dirty_high_percent || self.dirty_high_percent > 100 {
            return Err("dirty watermarks need low <= high <= 100".into());
        }
        Ok(())
    }
}
