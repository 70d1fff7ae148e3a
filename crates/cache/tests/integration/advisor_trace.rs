//! The advisor against the cache it advises, on a real trace: its estimate at the
//! cache's own size matches the hit ratio the cache's decision path measures on
//! the same requests, within 3 points, with sampling on.
//!
//! The trace is the first 80,000 requests of `P3.lis` from the ARC paper's
//! storage-controller traces (Megiddo and Modha, "ARC: A Self-Tuning, Low
//! Overhead Replacement Cache", FAST '03; released on condition that the paper
//! is cited; copied from github.com/moka-rs/cache-trace `arc/P3.lis.zst`). See
//! docs/0003-cache.md.

use cache::replay::{ReplayConfig, Replayer};
use cache::tracefile::{self, Format, Request};
use cache::{AdvisorConfig, CacheConfig, CacheMode};
use proptest::prelude::*;
use std::path::Path;
use std::sync::OnceLock;

const BLOCK_BYTES: u64 = 32 << 10;
/// The advisor's base rate: the miniature caches see half the blocks.
const SAMPLE_RATE: f64 = 0.5;

fn trace() -> &'static [Request] {
    static TRACE: OnceLock<Vec<Request>> = OnceLock::new();
    TRACE.get_or_init(|| {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/P3-head80k.lis");
        let t = tracefile::read(&path, Some(Format::Arc)).expect("the committed trace reads");
        assert_eq!(t.requests.len(), 80_000);
        assert_eq!(t.skipped, 0);
        t.requests
    })
}

/// The cache's measured hit ratio and the advisor's estimate at its size (and
/// the rate that estimate sampled at).
fn measured_and_estimated(mode: CacheMode, cache_blocks: usize) -> (f64, f64, f64) {
    let cfg = CacheConfig {
        block_bytes: BLOCK_BYTES as u32,
        mode,
        ..CacheConfig::default()
    };
    let mut rc = ReplayConfig::from_cache(&cfg, cache_blocks);
    let mut ac = AdvisorConfig::geometric(cache_blocks as u64, cache_blocks as u64, 1);
    ac.policy = cfg.policy;
    ac.admission = cfg.admission;
    ac.sample_rate = SAMPLE_RATE;
    ac.min_sample_blocks = 32;
    rc.advisor = Some(ac);
    let mut r = Replayer::new(&rc);
    let stats = r.run(trace());
    let curve = r.advisor().expect("configured").curve();
    let point = curve
        .iter()
        .find(|p| p.cache_blocks == cache_blocks as u64)
        .expect("the cache's size is on the curve");
    (stats.hit_ratio(), point.hit_ratio, point.sample_rate)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(12))]

    #[test]
    fn the_advisor_predicts_the_cache_on_a_real_trace(
        cache_blocks in 200usize..2000,
        write_back in any::<bool>(),
    ) {
        let mode = if write_back { CacheMode::WriteBack } else { CacheMode::ReadOnly };
        let (measured, estimate, rate) = measured_and_estimated(mode, cache_blocks);
        prop_assert!(rate < 1.0, "sampling is off at {cache_blocks} blocks");
        prop_assert!(
            (estimate - measured).abs() <= 0.03,
            "{cache_blocks} blocks ({mode}): measured {:.2}%, advisor {:.2}% at a {:.0}% sample",
            100.0 * measured,
            100.0 * estimate,
            100.0 * rate
        );
    }
}
