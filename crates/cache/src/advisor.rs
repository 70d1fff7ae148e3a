//! The sizing advisor: estimates the miss-ratio curve of the live workload and
//! recommends a cache size for a target hit ratio.
//!
//! Method: miniature simulations over a spatially hashed sample (SHARDS sampling,
//! Waldspurger et al., FAST '15 and ATC '17). A key is in the sample when a hash of
//! it falls below a threshold, so a sampled block has *all* its accesses sampled and
//! re-use is preserved. For each candidate size `S` the advisor runs the policy the
//! cache really uses (not LRU stack distances, which would describe a different
//! policy) at `S * R` blocks on the keys sampled at rate `R`; its hit ratio estimates
//! the full-size cache's. Each size gets the rate `R = max(rate, min_sample_blocks / S)`,
//! so small sizes are not simulated with a handful of blocks. Thresholds are nested
//! (a key sampled at a low rate is sampled at every higher one), so one hash per
//! access decides for all sizes.
//!
//! What it does not do: account for the cost of misses (all blocks weigh the same),
//! or age its counters (call [`Advisor::reset_stats`] to start a new window; the
//! miniature caches keep their contents, so the new window starts warm).
//!
//! Accuracy: sampling keeps whole blocks, so a workload whose hits are dominated by
//! a few extremely hot blocks is estimated worse than one whose heat is spread. The
//! SHARDS_adj correction compensates most of that bias (see `adjusted_hit_ratio`);
//! the crate's tests bound the error on Zipf traces.

use crate::hash::{mix64, SALT_SAMPLE};
use crate::path::Step;
use crate::policy::{Admission, Policy, PolicyKind};

/// Rates are fixed-point fractions of `2^RATE_BITS`.
const RATE_BITS: u32 = 24;
const RATE_ONE: u64 = 1 << RATE_BITS;

/// How the advisor samples and which sizes it evaluates.
#[derive(Clone, Debug)]
pub struct AdvisorConfig {
    /// The eviction policy simulated (the one the cache runs).
    pub policy: PolicyKind,
    /// The admission simulated (the one the cache runs).
    pub admission: Admission,
    /// Candidate cache sizes, in cache blocks.
    pub sizes_blocks: Vec<u64>,
    /// The base sampling rate, in `(0, 1]`.
    pub sample_rate: f64,
    /// Each miniature cache holds at least this many blocks (by raising its rate).
    pub min_sample_blocks: u64,
}

impl AdvisorConfig {
    /// `points` sizes spaced geometrically from `min_blocks` to `max_blocks`, the
    /// default policy and admission, a 1% base rate and at least 512 blocks per
    /// miniature cache (with 256, two small caches on the LIRS paper's looping
    /// traces were estimated 4.3 and 4.7 points low; docs/0003-cache.md).
    pub fn geometric(min_blocks: u64, max_blocks: u64, points: usize) -> Self {
        let min = min_blocks.max(1) as f64;
        let max = (max_blocks.max(min_blocks)).max(1) as f64;
        let points = points.max(1);
        let mut sizes_blocks: Vec<u64> = (0..points)
            .map(|i| {
                let t = if points == 1 {
                    1.0
                } else {
                    i as f64 / (points - 1) as f64
                };
                (min * (max / min).powf(t)).round() as u64
            })
            .collect();
        sizes_blocks.dedup();
        Self {
            policy: PolicyKind::DEFAULT,
            admission: Admission::DEFAULT,
            sizes_blocks,
            sample_rate: 0.01,
            min_sample_blocks: 512,
        }
    }
}

/// One estimated point of the miss-ratio curve.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MrcPoint {
    /// Cache size, in cache blocks.
    pub cache_blocks: u64,
    /// The estimated hit ratio at that size.
    pub hit_ratio: f64,
    /// The sampling rate used for this size.
    pub sample_rate: f64,
    /// Sampled accesses behind the estimate.
    pub sampled_accesses: u64,
}

struct Mini {
    cache_blocks: u64,
    /// Sampled iff `hash >> (64 - RATE_BITS) < threshold`.
    threshold: u64,
    policy: Box<dyn Policy>,
    accesses: u64,
    hits: u64,
}

/// Miss-ratio-curve estimation by miniature simulation over a spatial sample.
pub struct Advisor {
    /// Sorted by size, so thresholds are non-increasing.
    minis: Vec<Mini>,
    accesses: u64,
}

impl Advisor {
    /// An advisor evaluating `config.sizes_blocks`; all memory is allocated here.
    pub fn new(config: &AdvisorConfig) -> Self {
        let base = (config.sample_rate.clamp(0.0, 1.0) * RATE_ONE as f64).round() as u64;
        let mut sizes = config.sizes_blocks.clone();
        sizes.retain(|&s| s > 0);
        sizes.sort_unstable();
        sizes.dedup();
        let minis = sizes
            .into_iter()
            .map(|cache_blocks| {
                let needed = (config.min_sample_blocks * RATE_ONE).div_ceil(cache_blocks);
                let threshold = base.max(needed).clamp(1, RATE_ONE);
                let mini_blocks = ((cache_blocks * threshold + RATE_ONE / 2) >> RATE_BITS).max(1);
                Mini {
                    cache_blocks,
                    threshold,
                    policy: config
                        .policy
                        .build_with(config.admission, mini_blocks as usize),
                    accesses: 0,
                    hits: 0,
                }
            })
            .collect();
        Self { minis, accesses: 0 }
    }

    /// Records a read of `key` the cache may admit (a [`Step::Access`]).
    pub fn record(&mut self, key: u64) {
        self.record_step(key, Step::Access);
    }

    /// Records an access to `key` as the cache makes it: the miniature caches take
    /// the same [`Step`] the real cache takes (a bypassed read refreshes a cached
    /// block but is never admitted nor counted as a hit; a write-back write is
    /// admitted), so the curve describes what the cache will do, not what a cache
    /// that admitted everything would.
    pub fn record_step(&mut self, key: u64, step: Step) {
        self.accesses += 1;
        let h = mix64(key ^ SALT_SAMPLE) >> (64 - RATE_BITS);
        // Smallest sizes first: they have the highest thresholds.
        for mini in &mut self.minis {
            if h >= mini.threshold {
                break;
            }
            mini.accesses += 1;
            let access = step.apply(&mut *mini.policy, key);
            if step.is_hit(&access) {
                mini.hits += 1;
            }
        }
    }

    /// Starts a new measurement window: counters drop to zero, cache contents stay.
    pub fn reset_stats(&mut self) {
        self.accesses = 0;
        for mini in &mut self.minis {
            mini.accesses = 0;
            mini.hits = 0;
        }
    }

    /// Accesses recorded in this window (sampled or not).
    pub fn accesses(&self) -> u64 {
        self.accesses
    }

    /// The estimated curve at every candidate size, smallest first. Sizes that have
    /// seen no sampled access yet are left out.
    pub fn curve(&self) -> Vec<MrcPoint> {
        self.minis
            .iter()
            .filter(|m| m.accesses > 0)
            .map(|m| MrcPoint {
                cache_blocks: m.cache_blocks,
                hit_ratio: self.adjusted_hit_ratio(m),
                sample_rate: m.threshold as f64 / RATE_ONE as f64,
                sampled_accesses: m.accesses,
            })
            .collect()
    }

    /// The hit ratio of a miniature cache, corrected for sampling (SHARDS_adj): a
    /// sample that drew fewer accesses than its rate predicts most likely missed some
    /// of the hottest blocks, whose accesses are hits at every size, so the shortfall
    /// is counted as hits (and a surplus, most likely a hot block drawn, as misses).
    fn adjusted_hit_ratio(&self, mini: &Mini) -> f64 {
        let expected = self.accesses as f64 * mini.threshold as f64 / RATE_ONE as f64;
        if expected < 1.0 {
            return mini.hits as f64 / mini.accesses as f64;
        }
        let adjusted = mini.hits as f64 + (expected - mini.accesses as f64);
        (adjusted / expected).clamp(0.0, 1.0)
    }

    /// The smallest cache, in blocks, estimated to reach `target_hit_ratio`
    /// (interpolating linearly between candidate sizes); `None` if even the largest
    /// candidate falls short or nothing has been sampled yet.
    pub fn recommend(&self, target_hit_ratio: f64) -> Option<u64> {
        let curve = self.curve();
        let at = curve.iter().position(|p| p.hit_ratio >= target_hit_ratio)?;
        if at == 0 {
            return Some(curve[0].cache_blocks);
        }
        let (lo, hi) = (curve[at - 1], curve[at]);
        let t = (target_hit_ratio - lo.hit_ratio) / (hi.hit_ratio - lo.hit_ratio);
        let span = (hi.cache_blocks - lo.cache_blocks) as f64;
        Some((lo.cache_blocks as f64 + t * span).ceil() as u64)
    }

    /// Heap bytes held by the advisor (its miniature caches and bookkeeping).
    pub fn memory_bytes(&self) -> usize {
        self.minis.capacity() * std::mem::size_of::<Mini>()
            + self
                .minis
                .iter()
                .map(|m| m.policy.memory_bytes() + std::mem::size_of_val(&*m.policy))
                .sum::<usize>()
    }
}
