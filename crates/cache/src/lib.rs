//! The SSD cache tier of freesan.
//!
//! A [`CacheVolume`] puts one or more SSDs in front of a backing volume (a pool or
//! a disk): read-only, write-through, write-around or mirrored write-back, with a
//! dirty map persisted on the SSDs, an address-order destager, a sequential bypass
//! and a sizing [`advisor`]. Its pure core is here too: the admission and eviction
//! [`policy`] layer, the per-block decision [`path`] that the volume, the trace
//! [`replay`] and the advisor share, readers of recorded traces ([`tracefile`]),
//! seeded [`trace`] generators and a [`sim`]ulation loop.
//!
//! What it does not do: decide on its own when to attach, detach or replace (the
//! control plane does), or cache anything it cannot make durable as promised.
//!
//! Key invariant: an acknowledged write-back write is on both SSDs and in a
//! durable map record before the acknowledgement, and a frame holding dirty data
//! is never given to another block; a policy never holds more than its capacity,
//! and a cached block's slot (its frame on the SSD) never changes while cached.
//!
//! # The default: W-TinyLFU with a dueling window, every miss admitted
//!
//! [`default_policy`] is W-TinyLFU ([`PolicyKind::WTinyLfu`]): an LRU window in
//! front of a segmented LRU guarded by a frequency sketch, the window's share
//! (100%, 50%, 20% or 5%)
//! chosen by miniature shadow caches on a 1% sample, moving only on a lead larger
//! than sampling noise. A window of 100% is exactly LRU, so the cache starts as
//! LRU and leaves it only when the shadows show a frequency-guarded main wins.
//! Every miss is inserted, so a policy that misses less than LRU also writes the
//! SSD less. Chosen on recorded traces (`examples/traces/main.rs`, docs/0003-cache.md:
//! at 128 KiB blocks, at 1/5/10/20% of the footprint, strictly above LRU in 34 of
//! 36 cells on nine traces, up to +5.6 points, MSN-FS at 1% and 5% -0.01 and
//! -0.13; insertions at most LRU's wherever it hits more) and on synthetic
//! workloads (`examples/policies.rs`: +5.9 and +10.2 points on Zipf(0.9) at 10%
//! and 1%, +9.4 on Zipf(0.7), +3.5 on a hot set with full scans, a tie on a
//! shifting hot set). The earlier default, S3-FIFO behind second-miss admission, wrote the SSD
//! far less but fell 13-31 points under LRU on the CloudPhysics trace, whose
//! blocks are re-read soon after their first use; it stays selectable (every
//! [`PolicyKind`] and [`Admission`] does).
//!
//! # Memory
//!
//! Every structure is allocated when the policy is built, sized by its capacity,
//! and [`Policy::memory_bytes`] reports it (the cache shows the whole map's bytes
//! per GiB in its status). The slot number is the block's frame on the SSD, so
//! there is no second map beside the policy.

pub mod advisor;
mod bits;
mod config;
mod destage;
#[cfg(feature = "fuzzing")]
pub mod fuzzing;
mod hash;
mod keep;
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
