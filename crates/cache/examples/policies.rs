//! Compares every cache policy on synthetic block workloads and checks the sizing
//! advisor against exact simulation.
//!
//! Run: `cargo run --release -p cache --example policies`
//!
//! Prints three tables: hit ratios (and SSD insertions per 100 accesses) of every
//! policy on each workload, memory per cached block, and the advisor's estimated
//! miss-ratio curve next to the exact one. Traces are seeded: the output is the same
//! on every run.

use cache::trace::{HotScan, ShiftingHot, Zipf};
use cache::{
    default_policy, simulate, Admission, Advisor, AdvisorConfig, Policy, PolicyKind, SimStats,
};

/// Blocks in the simulated volume (at 64 KiB cache blocks: 32 GiB of data).
const KEYS: u64 = 500_000;
/// Accesses per workload, of which the first `WARMUP` only fill the cache.
const ACCESSES: usize = 7_500_000;
const WARMUP: usize = 1_500_000;

struct Workload {
    name: &'static str,
    cache_blocks: usize,
    trace: Vec<u64>,
}

fn workloads() -> Vec<Workload> {
    let ten_percent = (KEYS / 10) as usize;
    vec![
        Workload {
            name: "zipf(0.9), cache 10%",
            cache_blocks: ten_percent,
            trace: Zipf::new(KEYS, 0.9, 1).take(ACCESSES).collect(),
        },
        Workload {
            name: "zipf(0.9), cache 1%",
            cache_blocks: ten_percent / 10,
            trace: Zipf::new(KEYS, 0.9, 2).take(ACCESSES).collect(),
        },
        Workload {
            name: "zipf(0.7), cache 10%",
            cache_blocks: ten_percent,
            trace: Zipf::new(KEYS, 0.7, 3).take(ACCESSES).collect(),
        },
        Workload {
            // Hot set = 60% of the cache, uniform; a full scan of all blocks after
            // every 1M hot accesses (scans are a third of the accesses; the counted
            // window is four whole cycles).
            name: "hot set + full scans, cache 10%",
            cache_blocks: ten_percent,
            trace: HotScan::new(KEYS, (ten_percent * 6 / 10) as u64, 1_000_000, 4)
                .take(ACCESSES)
                .collect(),
        },
        Workload {
            // 90% of accesses to a hot set of 60% of the cache that moves every 1M
            // accesses, 10% uniform over everything.
            name: "shifting hot set, cache 10%",
            cache_blocks: ten_percent,
            trace: ShiftingHot::new(KEYS, (ten_percent * 6 / 10) as u64, 90, 1_000_000, 5)
                .take(ACCESSES)
                .collect(),
        },
    ]
}

fn contenders(capacity: usize) -> Vec<Box<dyn Policy>> {
    let mut all: Vec<Box<dyn Policy>> = PolicyKind::ALL.iter().map(|k| k.build(capacity)).collect();
    all.push(PolicyKind::Lru.build_with(Admission::SecondMiss, capacity));
    all.push(default_policy(capacity));
    all
}

fn main() {
    let workloads = workloads();
    let names: Vec<&str> = contenders(1).iter().map(|p| p.name()).collect();
    let default_name = default_policy(1).name();

    println!(
        "Hit ratio, % of accesses after a {WARMUP}-access warm-up ({} counted); {KEYS} blocks",
        ACCESSES - WARMUP
    );
    println!("(in brackets: blocks inserted, i.e. SSD writes, per 100 accesses; +dk = second-miss admission)");
    print!("{:<33}", "workload");
    for n in &names {
        print!("{n:>14}");
    }
    println!();
    let mut results: Vec<Vec<SimStats>> = Vec::new();
    for w in &workloads {
        print!("{:<33}", w.name);
        let mut row = Vec::new();
        for mut p in contenders(w.cache_blocks) {
            let s = simulate(&mut p, w.trace.iter().copied(), WARMUP);
            print!(
                "{:>14}",
                format!(
                    "{:.2} [{:.1}]",
                    100.0 * s.hit_ratio(),
                    100.0 * s.insertion_ratio()
                )
            );
            row.push(s);
        }
        println!();
        results.push(row);
    }
    let lru = names.iter().position(|&n| n == "lru").unwrap_or(0);
    let def = names.iter().position(|&n| n == default_name).unwrap_or(0);
    println!("\nDefault ({default_name}) over LRU, hit ratio in percentage points (SSD writes: default / LRU):");
    for (w, row) in workloads.iter().zip(&results) {
        println!(
            "  {:<33}{:+6.2}    writes x{:.3}",
            w.name,
            100.0 * (row[def].hit_ratio() - row[lru].hit_ratio()),
            row[def].insertions as f64 / row[lru].insertions.max(1) as f64
        );
    }

    println!("\nMemory per cached block (allocated heap / capacity), capacity 16384 blocks (1 GiB at 64 KiB):");
    println!(
        "{:<14}{:>12}{:>14}{:>20}{:>20}",
        "policy", "bytes", "bytes/block", "KiB/GiB @64KiB", "KiB/GiB @256KiB"
    );
    for p in contenders(16_384) {
        let name = p.name();
        let bytes = p.memory_bytes();
        let per_block = bytes as f64 / 16_384.0;
        println!(
            "{:<14}{:>12}{:>14.2}{:>20.1}{:>20.1}",
            name,
            bytes,
            per_block,
            per_block * 16_384.0 / 1024.0,
            per_block * 4_096.0 / 1024.0
        );
    }
    println!("(vendor: ~400 KB/GiB; aim: a quarter of that, ~100 KB/GiB)");

    let w = &workloads[0];
    let sizes: Vec<u64> = [1, 2, 5, 10, 20, 40]
        .iter()
        .map(|pct| KEYS * pct / 100)
        .collect();
    let mut config = AdvisorConfig::geometric(1, 1, 1);
    config.sizes_blocks = sizes.clone();
    let mut advisor = Advisor::new(&config);
    for (i, &k) in w.trace.iter().enumerate() {
        if i == WARMUP {
            advisor.reset_stats();
        }
        advisor.record(k);
    }
    println!(
        "\nAdvisor on {} ({} + {} admission, base sample rate {:.1}%, >= {} blocks per size), advisor memory {} KiB:",
        w.name.split(',').next().unwrap_or(w.name),
        config.policy,
        config.admission,
        100.0 * config.sample_rate,
        config.min_sample_blocks,
        advisor.memory_bytes() / 1024
    );
    println!(
        "{:>12}{:>8}{:>12}{:>12}{:>10}{:>14}",
        "cache", "% data", "exact %", "estimate %", "error", "sample rate"
    );
    for point in advisor.curve() {
        let mut p = config
            .policy
            .build_with(config.admission, point.cache_blocks as usize);
        let exact = simulate(&mut p, w.trace.iter().copied(), WARMUP).hit_ratio();
        println!(
            "{:>12}{:>8}{:>12.2}{:>12.2}{:>+10.2}{:>13.1}%",
            point.cache_blocks,
            100 * point.cache_blocks / KEYS,
            100.0 * exact,
            100.0 * point.hit_ratio,
            100.0 * (point.hit_ratio - exact),
            100.0 * point.sample_rate
        );
    }
    for target in [0.5, 0.6, 0.7] {
        match advisor.recommend(target) {
            Some(blocks) => println!(
                "  recommend({target:.2}) = {blocks} blocks ({:.1}% of the data)",
                100.0 * blocks as f64 / KEYS as f64
            ),
            None => println!("  recommend({target:.2}) = none of the candidate sizes reaches it"),
        }
    }
}
