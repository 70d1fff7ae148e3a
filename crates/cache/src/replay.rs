//! Replaying a recorded block trace through the cache's own decision path.
//!
//! A [`Replayer`] is the cache minus the bytes: the sequential-stream detector the
//! volume uses, the policy it builds from the same [`CacheConfig`] fields (admission
//! filter and eviction), the per-block [`Step`] the data path takes for a read or a
//! write in each mode, and optionally the sizing [`Advisor`] fed exactly as the
//! volume feeds it. Each request touches every cache block it covers, once, in
//! address order, as `CacheVolume` splits it. What is not modelled: timing (the
//! detector sees one request in flight), device failures, and pinning of dirty
//! blocks (destage is assumed to keep up).
//!
//! [`belady`] gives the ceiling: the optimal offline policy (evict the block used
//! furthest in the future, or do not insert at all when the missed block is that
//! block) over the same block accesses.

use crate::advisor::{Advisor, AdvisorConfig};
use crate::config::{CacheConfig, CacheMode};
use crate::path::Step;
use crate::policy::{Access, Admission, Policy, PolicyKind};
use crate::seq::SeqDetector;
use crate::sim::SimStats;
use crate::tracefile::{blocks_of, Request};
use std::collections::{BinaryHeap, HashMap};

/// What a replay runs: the cache's settings that matter to its decisions.
#[derive(Clone, Debug)]
pub struct ReplayConfig {
    /// How writes meet the cache.
    pub mode: CacheMode,
    /// Cache block size in bytes.
    pub block_bytes: u64,
    /// Cache size in cache blocks.
    pub cache_blocks: usize,
    /// Eviction policy.
    pub policy: PolicyKind,
    /// Admission filter.
    pub admission: Admission,
    /// Sequential cutoff (0: no bypass).
    pub seq_cutoff_bytes: u64,
    /// Streams that re-read data they bypassed are cached (the cache's detector);
    /// false replays the earlier detector that bypassed every long stream.
    pub keep_rereads: bool,
    /// Run the advisor beside the cache, with these settings.
    pub advisor: Option<AdvisorConfig>,
}

impl ReplayConfig {
    /// The replay of a cache configured as `cfg`, holding `cache_blocks` blocks,
    /// without an advisor.
    pub fn from_cache(cfg: &CacheConfig, cache_blocks: usize) -> Self {
        Self {
            mode: cfg.mode,
            block_bytes: u64::from(cfg.block_bytes),
            cache_blocks,
            policy: cfg.policy,
            admission: cfg.admission,
            seq_cutoff_bytes: cfg.seq_cutoff_bytes,
            keep_rereads: true,
            advisor: None,
        }
    }
}

/// Counts of a replay, in cache-block accesses.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReplayStats {
    /// Block accesses (reads and writes).
    pub accesses: u64,
    /// Of which hits (as the cache's counters count them).
    pub hits: u64,
    /// Blocks inserted (fills and write allocations): SSD block writes.
    pub insertions: u64,
    /// Block accesses by reads.
    pub read_accesses: u64,
    /// Of which hits.
    pub read_hits: u64,
    /// Read block accesses the sequential detector bypassed.
    pub bypassed_reads: u64,
    /// Write block accesses the sequential detector bypassed.
    pub bypassed_writes: u64,
}

impl ReplayStats {
    /// Hits over accesses.
    pub fn hit_ratio(&self) -> f64 {
        ratio(self.hits, self.accesses)
    }

    /// Insertions over accesses (SSD block writes per access).
    pub fn insertion_ratio(&self) -> f64 {
        ratio(self.insertions, self.accesses)
    }

    /// Share of read accesses the sequential bypass sent to the backing volume.
    pub fn bypassed_read_ratio(&self) -> f64 {
        ratio(self.bypassed_reads, self.read_accesses)
    }
}

fn ratio(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 / whole as f64
    }
}

/// The cache's decision path over a recorded trace.
pub struct Replayer {
    mode: CacheMode,
    block_bytes: u64,
    policy: Box<dyn Policy>,
    seq: SeqDetector,
    advisor: Option<Advisor>,
    stats: ReplayStats,
}

impl Replayer {
    /// An empty cache as `config` describes.
    pub fn new(config: &ReplayConfig) -> Self {
        Self {
            mode: config.mode,
            block_bytes: config.block_bytes.max(1),
            policy: config
                .policy
                .build_with(config.admission, config.cache_blocks.max(1)),
            seq: if config.keep_rereads {
                SeqDetector::keeping_rereads(
                    config.seq_cutoff_bytes,
                    config.block_bytes.max(1),
                    config.cache_blocks,
                )
            } else {
                SeqDetector::new(config.seq_cutoff_bytes)
            },
            advisor: config.advisor.as_ref().map(Advisor::new),
            stats: ReplayStats::default(),
        }
    }

    /// Feeds one request, as `CacheVolume::read` / `write` would take it.
    pub fn request(&mut self, r: &Request) {
        let bypass = self.seq.observe(r.offset_bytes, r.len_bytes, 1);
        let step = if r.write {
            Step::write(self.mode, true, bypass)
        } else {
            Step::read(bypass)
        };
        for key in blocks_of(r, self.block_bytes) {
            if let Some(a) = self.advisor.as_mut() {
                a.record_step(key, step);
            }
            let access = step.apply(&mut *self.policy, key);
            let hit = step.is_hit(&access);
            let s = &mut self.stats;
            s.accesses += 1;
            s.hits += u64::from(hit);
            s.insertions += u64::from(matches!(access, Access::Inserted { .. }));
            if r.write {
                s.bypassed_writes += u64::from(bypass);
            } else {
                s.read_accesses += 1;
                s.read_hits += u64::from(hit);
                s.bypassed_reads += u64::from(bypass);
            }
        }
    }

    /// Feeds every request of `trace`.
    pub fn run<'a>(&mut self, trace: impl IntoIterator<Item = &'a Request>) -> ReplayStats {
        for r in trace {
            self.request(r);
        }
        self.stats
    }

    /// Counts so far.
    pub fn stats(&self) -> ReplayStats {
        self.stats
    }

    /// The advisor, if one runs.
    pub fn advisor(&self) -> Option<&Advisor> {
        self.advisor.as_ref()
    }

    /// The policy (to inspect what is cached).
    pub fn policy(&self) -> &dyn Policy {
        &*self.policy
    }
}

/// Every cache-block access of `trace` at `block_bytes`, in order (each request
/// counts once for every block it covers).
pub fn block_keys(trace: &[Request], block_bytes: u64) -> Vec<u64> {
    let mut keys = Vec::with_capacity(trace.len());
    for r in trace {
        keys.extend(blocks_of(r, block_bytes.max(1)));
    }
    keys
}

/// Distinct blocks among `keys`.
pub fn distinct(keys: &[u64]) -> usize {
    let mut v = keys.to_vec();
    v.sort_unstable();
    v.dedup();
    v.len()
}

/// Belady's optimum over `keys` with `capacity` blocks: on a miss with the cache
/// full, the block whose next use is furthest away leaves, and if that is the
/// missed block itself it is not inserted. No policy hits more; its insertions
/// are the fewest any policy reaching that hit ratio needs.
pub fn belady(keys: &[u64], capacity: usize) -> SimStats {
    const NEVER: usize = usize::MAX;
    let mut next = vec![NEVER; keys.len()];
    let mut last: HashMap<u64, usize> = HashMap::new();
    for (i, &k) in keys.iter().enumerate().rev() {
        next[i] = last.insert(k, i).unwrap_or(NEVER);
    }
    drop(last);
    // cached key -> its next use; heap of (next use, key), stale entries skipped
    let mut cached: HashMap<u64, usize> = HashMap::with_capacity(capacity);
    let mut heap: BinaryHeap<(usize, u64)> = BinaryHeap::new();
    let mut stats = SimStats::default();
    for (i, &k) in keys.iter().enumerate() {
        stats.accesses += 1;
        let n = next[i];
        if let Some(slot) = cached.get_mut(&k) {
            stats.hits += 1;
            *slot = n;
            heap.push((n, k));
            continue;
        }
        if capacity == 0 || n == NEVER {
            continue;
        }
        if cached.len() >= capacity {
            let victim = loop {
                let (nu, key) = heap.pop().expect("a full cache has entries");
                if cached.get(&key) == Some(&nu) {
                    break (nu, key);
                }
            };
            if victim.0 <= n {
                heap.push(victim);
                continue;
            }
            cached.remove(&victim.1);
        }
        cached.insert(k, n);
        heap.push((n, k));
        stats.insertions += 1;
    }
    stats
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::simulate;
    use crate::trace::Zipf;

    #[test]
    fn belady_is_a_ceiling_and_exact_on_a_small_case() {
        // capacity 2: a b c a b -> a miss, b miss, c miss (not inserted: used never
        // again), a hit, b hit
        let s = belady(&[1, 2, 3, 1, 2], 2);
        assert_eq!((s.hits, s.insertions), (2, 2));
        let keys: Vec<u64> = Zipf::new(5000, 0.8, 3).take(100_000).collect();
        for cap in [50, 500, 2000] {
            let opt = belady(&keys, cap).hit_ratio();
            for kind in PolicyKind::ALL {
                let mut p = kind.build(cap);
                let h = simulate(&mut p, keys.iter().copied(), 0).hit_ratio();
                assert!(opt >= h, "{kind} at {cap}: {h} above the optimum {opt}");
            }
        }
    }

    #[test]
    fn replay_of_plain_reads_without_bypass_equals_simulation() {
        let keys: Vec<u64> = Zipf::new(5000, 0.8, 4).take(50_000).collect();
        let trace: Vec<Request> = keys
            .iter()
            .map(|&k| Request {
                offset_bytes: k * 65536,
                len_bytes: 4096,
                write: false,
            })
            .collect();
        let config = ReplayConfig {
            mode: CacheMode::ReadOnly,
            block_bytes: 65536,
            cache_blocks: 500,
            policy: PolicyKind::Lru,
            admission: Admission::All,
            seq_cutoff_bytes: 0,
            keep_rereads: true,
            advisor: None,
        };
        let replay = Replayer::new(&config).run(&trace);
        let mut p = PolicyKind::Lru.build(500);
        let sim = simulate(&mut p, keys.iter().copied(), 0);
        assert_eq!((replay.hits, replay.insertions), (sim.hits, sim.insertions));
        assert_eq!(block_keys(&trace, 65536), keys);
    }
}
