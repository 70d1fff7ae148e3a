//! Admission and eviction policies over cache-block keys.
//!
//! A [`Policy`] decides which blocks of the backing volume live in the cache: it is
//! told of every access and answers hit, inserted (with the block it evicted to make
//! room) or bypassed (it declined to admit). It is pure and synchronous: no I/O, no
//! clock, no allocation after construction, so the same code runs in the data path,
//! in the advisor's miniature simulations and in tests.
//!
//! Every policy keeps its blocks in one slot array (`0..capacity`); the slot a block
//! occupies never changes while it stays cached, so the cache layer uses it as the
//! block's frame on the SSD. A key is a cache-block number (volume LBA divided by the
//! cache block size).
//!
//! Policies, one file each: [`Lru`], [`Fifo`], [`Sieve`], [`S3Fifo`], [`TwoQ`]; and
//! [`Doorkeeper`], an admission filter that wraps any of them. [`PolicyKind`] and
//! [`Admission`] name them for configuration; [`default_policy`] is the default.

mod doorkeeper;
mod fifo;
pub(crate) mod ghost;
mod index;
mod lru;
mod s3fifo;
mod sieve;
mod sketch;
mod table;
mod two_q;
mod wtinylfu;

pub use doorkeeper::Doorkeeper;
pub use fifo::Fifo;
pub use lru::Lru;
pub use s3fifo::S3Fifo;
pub use sieve::Sieve;
pub use two_q::TwoQ;
pub use wtinylfu::WTinyLfu;

use std::fmt;
use std::str::FromStr;

/// What an access did to the cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// The block was cached, in `slot`.
    Hit {
        /// The block's slot (its frame on the SSD).
        slot: u32,
    },
    /// The block was not cached and now is, in `slot`. If a block had to leave to
    /// make room, it is `evicted` and `slot` is the slot it held. A policy evicts at
    /// most one block per insertion.
    Inserted {
        /// The slot now holding the block.
        slot: u32,
        /// The block that left the cache to make room, if one had to.
        evicted: Option<u64>,
    },
    /// The block was not cached and stays uncached: the policy declined to admit it
    /// (an admission filter), or the caller asked for no insertion.
    Bypassed,
}

impl Access {
    /// Whether the block was found in the cache.
    pub fn is_hit(&self) -> bool {
        matches!(self, Access::Hit { .. })
    }
}

/// An admission and eviction policy over at most `capacity()` cache blocks.
///
/// Invariants every implementation keeps (checked by the crate's property tests):
/// `len() <= capacity()`; `access` answers `Hit` exactly when `contains` was true
/// before it; after `Inserted` the key is contained and the evicted key is not;
/// after `remove` the key is not contained; slots of contained keys are distinct and
/// below `capacity()`.
pub trait Policy: Send {
    /// A short lowercase name ("lru", "s3fifo", ...).
    fn name(&self) -> &'static str;

    /// Records an access to `key`: a hit updates the policy's state; a miss inserts
    /// the key (evicting one block if full) unless the policy declines to admit it.
    fn access(&mut self, key: u64) -> Access;

    /// Records an access to `key` that inserts it on a miss whatever the admission
    /// filter thinks (a write into a write-back cache must land in the cache). Only
    /// admission filters differ from [`Policy::access`] here.
    fn admit(&mut self, key: u64) -> Access {
        self.access(key)
    }

    /// Records an access to `key` that must not insert it (a bypassed sequential
    /// stream, for instance): a hit counts as a hit and updates the state, a miss
    /// changes nothing. Returns the slot on a hit.
    fn touch(&mut self, key: u64) -> Option<u32>;

    /// The slot of `key` if it is cached, without changing any state.
    fn get(&self, key: u64) -> Option<u32>;

    /// Whether `key` is cached, without changing any state.
    fn contains(&self, key: u64) -> bool {
        self.get(key).is_some()
    }

    /// Drops `key` from the cache (invalidation, or a destaged block given up) and
    /// returns the slot it held. The slot is handed out again by a later insertion
    /// (at once or, for queue-based policies, when it comes up for eviction).
    fn remove(&mut self, key: u64) -> Option<u32>;

    /// The key cached in `slot`, if any (the reverse of [`Policy::get`]).
    fn key_of(&self, slot: u32) -> Option<u64>;

    /// Pins (or unpins) the block in `slot`: a pinned block is never evicted (a
    /// dirty block of a write-back cache, a frame under I/O). When every cached block
    /// is pinned and the cache is full, misses are [`Access::Bypassed`]. Removing a
    /// block unpins its slot.
    fn set_pinned(&mut self, slot: u32, pinned: bool);

    /// Blocks pinned now.
    fn pinned(&self) -> usize;

    /// Fills an empty policy with saved `(slot, key)` pairs (a cache map read back
    /// after a restart), each block in the slot it had. Panics if the policy is not
    /// empty or a slot repeats.
    fn restore(&mut self, entries: &[(u32, u64)]);

    /// Blocks cached now.
    fn len(&self) -> usize;

    /// Whether no block is cached.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The most blocks the policy will ever hold.
    fn capacity(&self) -> usize;

    /// Heap bytes held by the policy's structures (allocated capacity, so the figure
    /// is what the process pays, not what is in use). All structures are allocated
    /// up front, so this does not grow with use.
    fn memory_bytes(&self) -> usize;
}

/// The policies this crate implements, selectable by name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PolicyKind {
    /// Least recently used.
    Lru,
    /// First in, first out (hits change nothing).
    Fifo,
    /// SIEVE (NSDI '24): FIFO with a visited bit and a hand that keeps visited blocks
    /// in place.
    Sieve,
    /// S3-FIFO (SOSP '23): small probationary FIFO, main FIFO with reinsertion, ghost.
    S3Fifo,
    /// 2Q (VLDB '94, full version): A1in FIFO, Am LRU, A1out ghost.
    TwoQ,
    /// W-TinyLFU with an adaptive window (set dueling): LRU window, frequency-gated
    /// segmented-LRU main.
    WTinyLfu,
}

impl PolicyKind {
    /// Every policy, in the order tables print them.
    pub const ALL: [PolicyKind; 6] = [
        PolicyKind::Lru,
        PolicyKind::Fifo,
        PolicyKind::Sieve,
        PolicyKind::TwoQ,
        PolicyKind::S3Fifo,
        PolicyKind::WTinyLfu,
    ];

    /// The default eviction policy; see the crate documentation for why.
    pub const DEFAULT: PolicyKind = PolicyKind::WTinyLfu;

    /// The policy's name, as accepted by `FromStr`.
    pub fn name(self) -> &'static str {
        match self {
            PolicyKind::Lru => "lru",
            PolicyKind::Fifo => "fifo",
            PolicyKind::Sieve => "sieve",
            PolicyKind::S3Fifo => "s3fifo",
            PolicyKind::TwoQ => "2q",
            PolicyKind::WTinyLfu => "wtinylfu",
        }
    }

    /// A policy of this kind holding at most `capacity` blocks, admitting every miss.
    pub fn build(self, capacity: usize) -> Box<dyn Policy> {
        match self {
            PolicyKind::Lru => Box::new(Lru::new(capacity)),
            PolicyKind::Fifo => Box::new(Fifo::new(capacity)),
            PolicyKind::Sieve => Box::new(Sieve::new(capacity)),
            PolicyKind::S3Fifo => Box::new(S3Fifo::new(capacity)),
            PolicyKind::TwoQ => Box::new(TwoQ::new(capacity)),
            PolicyKind::WTinyLfu => Box::new(WTinyLfu::new(capacity)),
        }
    }

    /// A policy of this kind holding at most `capacity` blocks, behind `admission`.
    pub fn build_with(self, admission: Admission, capacity: usize) -> Box<dyn Policy> {
        match admission {
            Admission::All => self.build(capacity),
            Admission::SecondMiss => Box::new(Doorkeeper::new(self.build(capacity))),
        }
    }
}

/// Which misses may enter the cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Admission {
    /// Every miss is inserted (the eviction policy alone decides).
    All,
    /// Once the cache is full, a block is inserted on its second miss within a
    /// window of about one cache's worth of misses ([`Doorkeeper`]).
    SecondMiss,
}

impl Admission {
    /// The default admission; see the crate documentation for why.
    pub const DEFAULT: Admission = Admission::All;

    /// The admission's name, as accepted by `FromStr`.
    pub fn name(self) -> &'static str {
        match self {
            Admission::All => "all",
            Admission::SecondMiss => "second-miss",
        }
    }
}

impl fmt::Display for Admission {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Admission {
    type Err = UnknownPolicy;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "all" => Ok(Admission::All),
            "second-miss" => Ok(Admission::SecondMiss),
            _ => Err(UnknownPolicy(s.to_string())),
        }
    }
}

impl fmt::Display for PolicyKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A name that no [`PolicyKind`] or [`Admission`] answers to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnknownPolicy(pub String);

impl fmt::Display for UnknownPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "unknown cache policy or admission {:?} (policies: lru, fifo, sieve, 2q, s3fifo, wtinylfu; \
             admissions: all, second-miss)",
            self.0
        )
    }
}

impl std::error::Error for UnknownPolicy {}

impl FromStr for PolicyKind {
    type Err = UnknownPolicy;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let lower = s.to_ascii_lowercase();
        PolicyKind::ALL
            .into_iter()
            .find(|k| k.name() == lower || (lower == "s3-fifo" && *k == PolicyKind::S3Fifo))
            .ok_or_else(|| UnknownPolicy(s.to_string()))
    }
}

/// The default policy holding at most `capacity` blocks: [`PolicyKind::DEFAULT`]
/// eviction (W-TinyLFU with a dueling window) with [`Admission::DEFAULT`] (every
/// miss; the frequency sketch between window and main does the filtering).
pub fn default_policy(capacity: usize) -> Box<dyn Policy> {
    PolicyKind::DEFAULT.build_with(Admission::DEFAULT, capacity)
}

/// A boxed policy is a policy, so wrappers such as [`Doorkeeper`] take
/// `Box<dyn Policy>` from [`PolicyKind::build`].
impl<P: Policy + ?Sized> Policy for Box<P> {
    fn name(&self) -> &'static str {
        (**self).name()
    }
    fn access(&mut self, key: u64) -> Access {
        (**self).access(key)
    }
    fn admit(&mut self, key: u64) -> Access {
        (**self).admit(key)
    }
    fn touch(&mut self, key: u64) -> Option<u32> {
        (**self).touch(key)
    }
    fn get(&self, key: u64) -> Option<u32> {
        (**self).get(key)
    }
    fn remove(&mut self, key: u64) -> Option<u32> {
        (**self).remove(key)
    }
    fn key_of(&self, slot: u32) -> Option<u64> {
        (**self).key_of(slot)
    }
    fn set_pinned(&mut self, slot: u32, pinned: bool) {
        (**self).set_pinned(slot, pinned)
    }
    fn pinned(&self) -> usize {
        (**self).pinned()
    }
    fn restore(&mut self, entries: &[(u32, u64)]) {
        (**self).restore(entries)
    }
    fn len(&self) -> usize {
        (**self).len()
    }
    fn capacity(&self) -> usize {
        (**self).capacity()
    }
    fn memory_bytes(&self) -> usize {
        (**self).memory_bytes()
    }
}

#[cfg(test)]
mod tests;
