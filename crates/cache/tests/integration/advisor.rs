//! The advisor's miss-ratio curve against exact simulation of the same policy.

use cache::trace::Zipf;
use cache::{simulate, Advisor, AdvisorConfig, PolicyKind};

const KEYS: u64 = 200_000;
const ACCESSES: usize = 1_500_000;
const WARMUP: usize = 300_000;

fn max_error(alpha: f64, seed: u64, config: &AdvisorConfig) -> f64 {
    let trace: Vec<u64> = Zipf::new(KEYS, alpha, seed).take(ACCESSES).collect();
    let mut advisor = Advisor::new(config);
    for (i, &k) in trace.iter().enumerate() {
        if i == WARMUP {
            advisor.reset_stats();
        }
        advisor.record(k);
    }
    let curve = advisor.curve();
    assert_eq!(curve.len(), config.sizes_blocks.len());
    let mut worst: f64 = 0.0;
    for point in &curve {
        let mut exact_policy = config
            .policy
            .build_with(config.admission, point.cache_blocks as usize);
        let exact = simulate(&mut exact_policy, trace.iter().copied(), WARMUP).hit_ratio();
        let error = point.hit_ratio - exact;
        println!(
            "{} zipf({alpha}) seed {seed}: {:>6} blocks exact {:.2}% estimate {:.2}% ({:+.2})",
            config.policy,
            point.cache_blocks,
            100.0 * exact,
            100.0 * point.hit_ratio,
            100.0 * error
        );
        worst = worst.max(error.abs());
    }
    // Recommendations are consistent with the curve.
    let mid = curve[curve.len() / 2];
    let rec = advisor.recommend(mid.hit_ratio).expect("reachable target");
    assert!(rec <= mid.cache_blocks);
    assert_eq!(advisor.recommend(1.01), None);
    println!("advisor memory: {} bytes", advisor.memory_bytes());
    worst
}

fn sizes() -> Vec<u64> {
    [1, 2, 5, 10, 20]
        .iter()
        .map(|pct| KEYS * pct / 100)
        .collect()
}

#[test]
fn advisor_tracks_exact_default_policy_on_zipf() {
    let mut config = AdvisorConfig::geometric(1, 1, 1);
    config.sizes_blocks = sizes();
    for (alpha, seed) in [(0.9, 7), (0.8, 8)] {
        let worst = max_error(alpha, seed, &config);
        assert!(
            worst < 0.03,
            "zipf({alpha}): worst error {:.2} points",
            100.0 * worst
        );
    }
}

#[test]
fn advisor_works_for_lru_too() {
    let mut config = AdvisorConfig::geometric(1, 1, 1);
    config.sizes_blocks = sizes();
    config.policy = PolicyKind::Lru;
    config.admission = cache::Admission::All;
    let worst = max_error(0.9, 9, &config);
    assert!(worst < 0.03, "worst error {:.2} points", 100.0 * worst);
}
