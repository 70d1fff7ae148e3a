//! The acceptance check: the default policy's hit ratio beats LRU's on a
//! Zipf(0.9) workload with the cache at 10% of the data, and on a hot set with
//! periodic full scans. Seeded traces: the same numbers on every run.

use cache::trace::{HotScan, Zipf};
use cache::{default_policy, simulate, Lru};

const KEYS: u64 = 100_000;
const CACHE_BLOCKS: usize = 10_000;

/// Runs `trace` through LRU and the default policy and checks that the default's
/// hit ratio is more than `margin` above LRU's.
fn assert_default_beats_lru(workload: &str, trace: &[u64], warmup: usize, margin: f64) {
    let lru = simulate(&mut Lru::new(CACHE_BLOCKS), trace.iter().copied(), warmup);
    let def = simulate(
        &mut default_policy(CACHE_BLOCKS),
        trace.iter().copied(),
        warmup,
    );
    println!(
        "{workload}: lru {:.2}%, default {:.2}%",
        100.0 * lru.hit_ratio(),
        100.0 * def.hit_ratio()
    );
    assert!(
        def.hit_ratio() > lru.hit_ratio() + margin,
        "default {:.4} vs lru {:.4}",
        def.hit_ratio(),
        lru.hit_ratio()
    );
}

#[test]
fn default_beats_lru_on_zipf_0_9_at_10_percent() {
    let trace: Vec<u64> = Zipf::new(KEYS, 0.9, 42).take(1_200_000).collect();
    assert_default_beats_lru("zipf(0.9), cache 10%", &trace, 200_000, 0.03);
}

#[test]
fn default_beats_lru_on_hot_set_with_full_scans() {
    // Hot set of 60% of the cache; a scan of all 100k blocks after every 200k hot
    // accesses; the counted window is four whole cycles.
    let trace: Vec<u64> = HotScan::new(KEYS, 6_000, 200_000, 43)
        .take(1_500_000)
        .collect();
    assert_default_beats_lru("hot set + full scans, cache 10%", &trace, 300_000, 0.02);
}
