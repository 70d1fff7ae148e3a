//! Software RAID pools for freesan: a [`Pool`] is a `block::Volume` over member
//! volumes, at RAID 0, 1 (n-way mirror), 5, 6 (P+Q over GF(2^8)), 10 (stripe of
//! mirrors, near or far layout) or F1 (RAID 5 with parity skewed onto one member so SSDs wear out at
//! different times).
//!
//! What it does: chunk placement per level ([`layout`]), full-stripe writes without
//! reads, read-modify-write or reconstruct-write for partial stripes, degraded
//! reads, repair of medium errors, a superblock on every member (create/assemble,
//! generations, member states), a stripe journal that closes the RAID 5/6 write
//! hole (group-committed, on the members or on a journal device), hot spares, background rebuild with a rate limit, lazy
//! initial resync, scrub (RAID 6 locates the bad member), and a serde status.
//! See docs/0002-raid.md for the design and the on-disk format.
//!
//! It grows online ([`Pool::grow_to`], `Volume::grow`) into room the members have
//! beyond what the pool uses (RAID 10 far excepted).
//!
//! What it does not do: open devices (members are `VolumeRef`s), reshape (changing
//! level, chunk or member count), or write-intent bitmaps for mirrors (an unclean
//! mirror resyncs fully in the background).
//!
//! Key invariant: a read never returns data other than what was last acknowledged
//! for that block; when redundancy cannot decide, the pool answers with an error
//! (`BlockError::Unavailable` or `Medium`), never with wrong data.

mod background;
mod commit;
#[cfg(test)]
mod commit_tests;
mod fullstripe;
#[cfg(any(test, feature = "fuzzing"))]
pub mod fuzzing;
mod gf;
mod grow;
mod io;
mod jdev;
mod journal;
mod keep;
pub mod layout;
mod lost;
mod meter;
mod order;
mod pool;
#[cfg(test)]
mod replay_tests;
mod scrub;
mod status;
mod superblock;
mod util;

pub use commit::SpareWhen;
pub use jdev::JOURNAL_DEVICES_MAX;
pub use layout::{layout_for, Layout, Scheme};
pub use pool::{Member, Pool};
pub use status::{
    JournalDeviceStatus, MemberState, MemberStatus, PoolState, PoolStatus, Progress, RebuildStall,
    ScrubReport, SpareStatus, StripeWrites, WritePath,
};
pub use superblock::SuperblockState;

use serde::{Deserialize, Serialize};

/// A RAID level.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RaidLevel {
    /// Striping, no redundancy.
    Raid0,
    /// N-way mirror.
    Raid1,
    /// Single rotating parity.
    Raid5,
    /// Double parity (P + Q).
    Raid6,
    /// Stripe of two-way mirror pairs (md's "near 2" layout).
    Raid10,
    /// RAID 10 "far 2": a stripe over the first halves of all members, the second
    /// copies shifted by one member in the second halves (see [`layout::Raid10Far`]).
    #[serde(rename = "raid10-far")]
    Raid10Far,
    /// Single parity skewed onto the last member (see [`layout::F1`]).
    F1,
}

/// Default chunk: 128 KiB. A 4 KiB random I/O then touches one member (one seek),
/// and a 256 KiB sequential I/O spans two members in parallel; on HDDs a 128 KiB
/// transfer (~1 ms at 150 MB/s) costs about a tenth of a seek, so larger chunks buy
/// little for random I/O while smaller ones split sequential I/O into more seeks.
/// Measured against 32K..512K on RAID 5 of 10 simulated HDDs (256 KiB sequential
/// writes at 32 in flight): 128K writes fastest (docs/0002-raid.md, "Chunk size").
pub const DEFAULT_CHUNK_BYTES: u32 = 128 * 1024;
/// Default rebuild and resync cap in MB/s (about half an HDD's sequential rate).
pub const DEFAULT_REBUILD_RATE_MB_S: u32 = 100;
/// Stripe-journal size on each member of a parity pool whose members are too
/// small for [`LARGE_JOURNAL_BYTES`] (see [`default_journal_bytes`]).
pub const DEFAULT_JOURNAL_BYTES: u64 = 16 << 20;
/// Stripe-journal size on each member of a parity pool whose smallest member
/// holds at least eight times as much (any real disk). Measured against 16 MiB
/// (`bench/raid-smallwrite --journal-mib 16|64`, docs/0002-raid.md, "Ring
/// size"): with NCQ, RAID 5 of 10 small random writes 5-19% faster, since a
/// group commit no longer waits for a checkpoint to free ring space.
pub const LARGE_JOURNAL_BYTES: u64 = 64 << 20;
/// Stripe-journal size on each member of a parity pool whose smallest member
/// holds at least eight times as much (2 GiB; any real disk holds hundreds of
/// times more). Measured against 64 and 128 MiB (`bench/raid-smallwrite
/// --journal-mib N --secs 12`, docs/0002-raid.md, "Ring size"): with NCQ,
/// RAID 5 of 10 8K random writes at 69-72% of the arithmetic limit with 64
/// MiB, 76% with 128 and 78% with 256, where no group commit waited for a
/// checkpoint and no completing record needed its slot. Assemble reads the
/// members' rings together, piece by piece, keeping only the records above
/// the checkpoint (`journal::Scanner`), so the larger ring neither lengthens
/// a start by reading ten rings one after the other nor is held whole.
pub const LARGEST_JOURNAL_BYTES: u64 = 256 << 20;

/// The ring a new parity pool gets when `PoolConfig::journal_bytes` is not set:
/// the largest of [`LARGEST_JOURNAL_BYTES`] and [`LARGE_JOURNAL_BYTES`] that
/// is at most an eighth of the smallest member (`member_bytes`) and that every
/// journal device (`device_bytes`, the bytes each holds past its header)
/// holds; [`DEFAULT_JOURNAL_BYTES`] otherwise, so small members (test files,
/// loop devices) and journal devices sized for it keep what they had.
pub fn default_journal_bytes(member_bytes: u64, device_bytes: &[u64]) -> u64 {
    [LARGEST_JOURNAL_BYTES, LARGE_JOURNAL_BYTES]
        .into_iter()
        .find(|&ring| member_bytes / 8 >= ring && device_bytes.iter().all(|&d| d >= ring))
        .unwrap_or(DEFAULT_JOURNAL_BYTES)
}

fn default_chunk_bytes() -> u32 {
    DEFAULT_CHUNK_BYTES
}

fn default_rebuild_rate_mb_s() -> u32 {
    DEFAULT_REBUILD_RATE_MB_S
}

/// How to build a pool; the shape of a `[[pool]]` entry in the TOML config
/// (members and spares are named separately, as device paths the caller opens).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct PoolConfig {
    /// Pool name (shown in status; stored in the superblocks).
    pub name: String,
    /// RAID level.
    pub level: RaidLevel,
    /// Chunk size in bytes: a multiple of the member block size.
    #[serde(default = "default_chunk_bytes")]
    pub chunk_bytes: u32,
    /// Cap on rebuild, resync and scrub throughput in MB/s; 0 means no cap (they
    /// still yield to foreground I/O).
    #[serde(default = "default_rebuild_rate_mb_s")]
    pub rebuild_rate_mb_s: u32,
    /// Stripe-journal bytes per member (parity levels only); `None` picks
    /// [`default_journal_bytes`] of the smallest member (or `member_bytes`) and
    /// the journal devices. Must hold at least two full-stripe records.
    #[serde(default)]
    pub journal_bytes: Option<u64>,
    /// Bytes of every member the pool uses (superblocks, journal and data area);
    /// `None` uses all of the smallest member. A smaller value leaves room to grow
    /// the pool later without growing the members ([`Pool::grow_to`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub member_bytes: Option<u64>,
    /// Test-only: turn the stripe journal off to show the write hole it closes.
    #[serde(skip)]
    #[doc(hidden)]
    pub unsafe_disable_journal: bool,
    /// Test-only: write whole stripes without recording the write intent, to show
    /// the torn stripes it finds after a crash.
    #[serde(skip)]
    #[doc(hidden)]
    pub unsafe_disable_write_intent: bool,
    /// Test-only: stripes per write-intent region (`None`: 64 MiB of every
    /// member), so tests on small members can cross regions.
    #[serde(skip)]
    #[doc(hidden)]
    pub intent_region_stripes: Option<u64>,
}

impl PoolConfig {
    /// A config with default chunk, rebuild rate and journal size.
    pub fn new(name: impl Into<String>, level: RaidLevel) -> Self {
        PoolConfig {
            name: name.into(),
            level,
            chunk_bytes: DEFAULT_CHUNK_BYTES,
            rebuild_rate_mb_s: DEFAULT_REBUILD_RATE_MB_S,
            journal_bytes: None,
            member_bytes: None,
            unsafe_disable_journal: false,
            unsafe_disable_write_intent: false,
            intent_region_stripes: None,
        }
    }
}

/// Errors of pool management (create, assemble, membership changes).
#[derive(Debug, thiserror::Error)]
pub enum RaidError {
    /// The requested configuration cannot be built.
    #[error("invalid pool configuration: {0}")]
    Config(String),
    /// A member's I/O failed during a management operation.
    #[error("member {member}: {source}")]
    Member {
        /// Member name.
        member: String,
        /// What the member said.
        #[source]
        source: block::BlockError,
    },
    /// A member's superblock is missing or corrupt.
    #[error("member {member}: bad superblock: {reason}")]
    BadSuperblock {
        /// Member name.
        member: String,
        /// What is wrong with it.
        reason: String,
    },
    /// Members of different pools (or unknown members) were given together.
    #[error("member {member} does not belong to pool {pool_uuid}")]
    ForeignMember {
        /// Member name.
        member: String,
        /// UUID of the pool being assembled.
        pool_uuid: String,
    },
    /// A member's generation is older than the newest; assemble with `force` to
    /// take the newest set and rebuild the stale members.
    #[error("member {member} is stale: generation {generation}, newest {newest}")]
    StaleGeneration {
        /// Member name.
        member: String,
        /// Its generation.
        generation: u64,
        /// The newest generation among the members.
        newest: u64,
    },
    /// Two members claim the same position.
    #[error("member {member} duplicates position {position}")]
    DuplicateMember {
        /// Member name.
        member: String,
        /// The contested position.
        position: usize,
    },
    /// A position number outside the pool, or in the wrong state for the request.
    #[error("position {position}: {reason}")]
    Position {
        /// The position asked for.
        position: usize,
        /// Why the request does not apply.
        reason: String,
    },
    /// The pool lost more members than its redundancy.
    #[error("pool failed: {0}")]
    PoolFailed(String),
}

/// Result of pool management operations.
pub type RaidResult<T> = Result<T, RaidError>;

/// Largest chunk a pool is made with or assembled from (a resync holds a
/// stripe's chunks in memory).
pub const CHUNK_BYTES_MAX: u32 = 16 << 20;

/// Whether `volume` carries a valid superblock, none, or one that cannot be
/// read or decoded (a pool's disk that must not be taken for a blank one).
pub async fn superblock_state(volume: &block::VolumeRef) -> SuperblockState {
    superblock::state(volume).await
}
