//! The SSD cache tier of freesan.
//!
//! This crate will hold the cache layer (modes, dirty log, destage); today it holds
//! its pure core: the admission and eviction [`policy`] layer, deterministic
//! [`trace`] generators to evaluate policies, a [`sim`]ulation loop, and the sizing
//! [`advisor`] that estimates the miss-ratio curve of a workload by sampling.
//!
//! What it does not do (yet): any I/O. Policies see cache-block numbers and hand
//! out slots; reading, writing and persisting blocks is the cache layer's job.
//!
//! Key invariant: a policy never holds more than its capacity, allocates all its
//! memory when built, and the slot of a cached block never changes while it stays
//! cached (so the slot doubles as the block's frame on the SSD).
//!
//! # The default: S3-FIFO eviction behind second-miss admission
//!
//! [`default_policy`] is [`S3Fifo`] wrapped in a [`Doorkeeper`] (shown as
//! `s3fifo+dk`); every other combination of [`PolicyKind`] and [`Admission`] stays
//! selectable. The choice comes from `examples/policies.rs` (seeded traces over 500k
//! blocks, 6M accesses counted after a 1.5M warm-up; hit ratio %, then SSD
//! insertions per 100 accesses):
//!
//! | workload                        | lru         | sieve       | 2q          | s3fifo      | s3fifo+dk  |
//! |---------------------------------|-------------|-------------|-------------|-------------|------------|
//! | zipf(0.9), cache 10%            | 62.90 [37.1]| 69.05 [30.9]| 67.76 [32.2]| 69.41 [30.6]| 70.72 [4.5]|
//! | zipf(0.9), cache 1%             | 38.12 [61.9]| 48.05 [52.0]| 46.20 [53.8]| 48.14 [51.9]| 49.41 [2.3]|
//! | zipf(0.7), cache 10%            | 35.42 [64.6]| 43.42 [56.6]| 42.27 [57.7]| 44.51 [55.5]| 46.75 [7.4]|
//! | hot set + full scans, cache 10% | 64.95 [35.0]| 68.67 [31.3]| 66.13 [33.9]| 69.25 [30.8]| 69.90 [0.2]|
//! | shifting hot set, cache 10%     | 88.13 [11.9]| 69.31 [30.7]| 85.57 [14.4]| 85.37 [14.6]| 83.62 [5.6]|
//!
//! Why this one:
//! - It beats LRU where the issue requires it: +7.8 points on Zipf(0.9) with the
//!   cache at 10% of the data, +4.9 on a hot set with periodic full scans (where a
//!   third of all accesses are the scan and ~70% is the most any policy can reach),
//!   and +11 on the other Zipf cases. It has the best hit ratio of all the policies
//!   measured on four of the five workloads.
//! - It writes the SSD far less: a block seen once (most of a scan, the long tail of
//!   a Zipf workload) is never inserted, so insertions drop to 0.5-12% of LRU's on
//!   those four workloads. For an SSD cache each insertion is a cache-block write
//!   that competes with hits for SSD bandwidth and wears the flash; in a RAM cache
//!   this would matter less.
//! - Hits are cheap: S3-FIFO only bumps a 2-bit counter (no list move under a lock).
//! - While the cache has free slots every miss is admitted, so a warm-up pass fills
//!   an empty cache.
//!
//! The price: on a hot set that jumps to a new place (LRU's best case, where pure
//! recency is exactly right) it trails LRU by 4.5 points, because each new hot block
//! pays a probation (one extra miss at the doorkeeper, then a hit in the small queue
//! or a round trip through the ghost). Plain S3-FIFO trails by 2.8 and `lru+dk` by
//! 2.3 there; SIEVE, otherwise close to S3-FIFO, collapses to 69%. Workloads of that
//! shape can select another policy.
//!
//! # Memory
//!
//! Every structure is allocated when the policy is built, sized by its capacity,
//! and [`Policy::memory_bytes`] reports it. Per cached block (measured by the
//! example at 16384 blocks): LRU and FIFO 22.0 bytes (8 key, 8 links, 6 index),
//! SIEVE 22.1, 2Q 23.0, S3-FIFO 20.5 (8 key, 6 index, 4 queue link, 1 counter and
//! flags, 1.5 ghost Bloom filter), the default `s3fifo+dk` 22.2 (1.7 more for the
//! doorkeeper's filter). The index is 1.5 `u32` buckets per block with a key
//! fingerprint in the bits the slot number leaves free.
//!
//! At 64 KiB cache blocks (16384 per GiB) the default takes 355 KiB per GiB of
//! cache: under the vendor's 400 KB, not at the quarter the issue aims for. That
//! aim (~6 bytes per block at 64 KiB) is below the 8 bytes of the key alone, so it
//! is reached through the cache block size: at 256 KiB blocks the default takes
//! 89 KiB per GiB. The slot number is the block's frame on the SSD, so there is no
//! second map beside the policy.

pub mod advisor;
mod bits;
mod config;
mod destage;
mod hash;
pub mod path;
pub mod policy;
pub mod replay;
mod seq;
pub mod sim;
mod ssd;
mod stats;
pub mod trace;
pub mod tracefile;
mod volume;

pub use config::{CacheConfig, CacheMode};
pub use ssd::SECTOR_BYTES;
pub use stats::{AdvicePoint, CacheStatus, DeviceStatus};
pub use volume::{CacheDevice, CacheVolume};

pub use advisor::{Advisor, AdvisorConfig, MrcPoint};
pub use policy::{
    default_policy, Access, Admission, Doorkeeper, Fifo, Lru, Policy, PolicyKind, S3Fifo, Sieve,
    TwoQ, UnknownPolicy,
};
pub use sim::{simulate, SimStats};
