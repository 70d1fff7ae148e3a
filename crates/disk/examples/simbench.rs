//! simbench: real-time figures of simulated disks against their models' nominal
//! figures. One HDD and one SSD (store: a sparse `MemVolume`), each run with 4K
//! random read at QD1 and QD32 and 256K sequential read and write at QD8, a few
//! seconds each; prints measured, nominal and their ratio, plus the precise
//! scheduler's lateness and CPU cost.
//!
//! Usage: cargo run --release -p disk --example simbench -- [SECONDS] [hdd|ssd|all]

use block::{Bytes, MemVolume, Volume, VolumeRef};
use disk::sim::{scheduler_stats, HddParams, Nominal, SimDisk, SplitMix64, SsdParams};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const BS: u32 = 4096;
/// Sequential streams wrap within this span so the sparse store stays small.
const SEQ_SPAN_BYTES: u64 = 512 << 20;

#[derive(Clone, Copy, Debug)]
enum Pattern {
    RandRead4kQd1,
    RandRead4kQd32,
    SeqRead256kQd8,
    SeqWrite256kQd8,
}

impl Pattern {
    fn name(self) -> &'static str {
        match self {
            Pattern::RandRead4kQd1 => "4K rand read  QD1 ",
            Pattern::RandRead4kQd32 => "4K rand read  QD32",
            Pattern::SeqRead256kQd8 => "256K seq read  QD8",
            Pattern::SeqWrite256kQd8 => "256K seq write QD8",
        }
    }
    fn qd(self) -> usize {
        match self {
            Pattern::RandRead4kQd1 => 1,
            Pattern::RandRead4kQd32 => 32,
            _ => 8,
        }
    }
    fn blocks(self) -> u32 {
        match self {
            Pattern::RandRead4kQd1 | Pattern::RandRead4kQd32 => 1,
            _ => (256 * 1024) / BS,
        }
    }
    fn is_seq(self) -> bool {
        matches!(self, Pattern::SeqRead256kQd8 | Pattern::SeqWrite256kQd8)
    }
    fn nominal(self, n: &Nominal) -> f64 {
        match self {
            Pattern::RandRead4kQd1 => n.rand_read_4k_iops_qd1,
            Pattern::RandRead4kQd32 => n.rand_read_4k_iops_qd32,
            Pattern::SeqRead256kQd8 => n.seq_read_mb_s,
            Pattern::SeqWrite256kQd8 => n.seq_write_mb_s,
        }
    }
}

const PATTERNS: [Pattern; 4] = [
    Pattern::RandRead4kQd1,
    Pattern::RandRead4kQd32,
    Pattern::SeqRead256kQd8,
    Pattern::SeqWrite256kQd8,
];

fn process_cpu_s() -> f64 {
    // SAFETY: getrusage fills the zeroed struct.
    let ru = unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut ru);
        ru
    };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

struct Run {
    ops: u64,
    bytes: u64,
    secs: f64,
    latency_us_mean: f64,
}

async fn run(disk: Arc<SimDisk>, p: Pattern, secs: f64) -> Run {
    let blocks_total = disk.geometry().block_count;
    let seq_slots = SEQ_SPAN_BYTES / (p.blocks() as u64 * BS as u64);
    let next_seq = Arc::new(AtomicU64::new(0));
    let ops = Arc::new(AtomicU64::new(0));
    let lat_ns = Arc::new(AtomicU64::new(0));
    let payload = Bytes::from(vec![0x5au8; (p.blocks() * BS) as usize]);
    let t0 = Instant::now();
    let deadline = t0 + Duration::from_secs_f64(secs);
    let mut set = tokio::task::JoinSet::new();
    for task in 0..p.qd() {
        let (disk, next_seq, ops, lat_ns, payload) = (
            Arc::clone(&disk),
            Arc::clone(&next_seq),
            Arc::clone(&ops),
            Arc::clone(&lat_ns),
            payload.clone(),
        );
        set.spawn(async move {
            let mut rng = SplitMix64::new(0xB00 + task as u64);
            while Instant::now() < deadline {
                let lba = if p.is_seq() {
                    (next_seq.fetch_add(1, Ordering::Relaxed) % seq_slots) * p.blocks() as u64
                } else {
                    rng.below(blocks_total)
                };
                let start = Instant::now();
                let res = match p {
                    Pattern::SeqWrite256kQd8 => disk.write(lba, payload.clone(), false).await,
                    _ => disk.read(lba, p.blocks()).await.map(|_| ()),
                };
                if let Err(e) = res {
                    eprintln!("I/O error: {e}");
                    return;
                }
                lat_ns.fetch_add(start.elapsed().as_nanos() as u64, Ordering::Relaxed);
                ops.fetch_add(1, Ordering::Relaxed);
            }
        });
    }
    while set.join_next().await.is_some() {}
    let secs = t0.elapsed().as_secs_f64();
    let ops = ops.load(Ordering::Relaxed);
    Run {
        ops,
        bytes: ops * p.blocks() as u64 * BS as u64,
        secs,
        latency_us_mean: lat_ns.load(Ordering::Relaxed) as f64 / 1e3 / ops.max(1) as f64,
    }
}

async fn bench(name: &str, disk: SimDisk, secs: f64) {
    let disk = Arc::new(disk);
    let nominal = disk.nominal();
    println!("\n{name}: nominal {nominal:?}");
    println!(
        "{:<20} {:>11} {:>11} {:>7} {:>10} {:>9} {:>9} {:>9} {:>8} {:>8}",
        "pattern",
        "measured",
        "nominal",
        "ratio",
        "lat_us",
        "late_avg",
        "late_p99",
        "late_max",
        "sched%",
        "proc%"
    );
    for p in PATTERNS {
        let s0 = scheduler_stats();
        let cpu0 = process_cpu_s();
        let r = run(Arc::clone(&disk), p, secs).await;
        let cpu = process_cpu_s() - cpu0;
        let s1 = scheduler_stats();
        let fired = (s1.fired - s0.fired).max(1) as f64;
        let late_avg_us = (s1.overshoot_ns_mean * s1.fired as f64
            - s0.overshoot_ns_mean * s0.fired as f64)
            / fired
            / 1e3;
        let (measured, unit) = if p.is_seq() {
            (r.bytes as f64 / 1e6 / r.secs, "MB/s")
        } else {
            (r.ops as f64 / r.secs, "IOPS")
        };
        let nom = p.nominal(&nominal);
        println!(
            "{:<20} {:>6.0} {unit} {:>6.0} {unit} {:>7.3} {:>10.1} {:>7.1}us {:>7.0}us {:>7.0}us {:>7.1}% {:>7.1}%",
            p.name(),
            measured,
            nom,
            measured / nom,
            r.latency_us_mean,
            late_avg_us,
            s1.overshoot_ns_p99_bound as f64 / 1e3,
            s1.overshoot_ns_max as f64 / 1e3,
            (s1.thread_cpu_ns - s0.thread_cpu_ns) as f64 / 1e9 / r.secs * 100.0,
            cpu / r.secs * 100.0,
        );
    }
}

fn main() {
    let mut args = std::env::args().skip(1);
    let secs: f64 = args.next().and_then(|s| s.parse().ok()).unwrap_or(3.0);
    let which = args.next().unwrap_or_else(|| "all".into());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap_or_else(|e| panic!("tokio runtime: {e}"));
    rt.block_on(async {
        if which == "all" || which == "hdd" {
            // 1 TiB sparse store: the whole stroke of the modelled disk.
            let store: VolumeRef = Arc::new(MemVolume::new(BS, 1 << 28));
            let d = SimDisk::hdd(store, HddParams::default())
                .unwrap_or_else(|e| panic!("hdd: {e}"));
            bench("HDD 7200 rpm, 1 TiB", d, secs).await;
        }
        if which == "all" || which == "ssd" {
            let store: VolumeRef = Arc::new(MemVolume::new(BS, 1 << 26));
            let d = SimDisk::ssd(store, SsdParams::default())
                .unwrap_or_else(|e| panic!("ssd: {e}"));
            bench("SATA SSD, 256 GiB", d, secs).await;
        }
        // Idle cost: nothing outstanding, the scheduler thread must sleep.
        let s0 = scheduler_stats();
        tokio::time::sleep(Duration::from_secs(1)).await;
        let s1 = scheduler_stats();
        println!(
            "\nidle 1 s: scheduler thread CPU {:.3} ms, fired {}, total fired {}, spins {}, sleeps {}",
            (s1.thread_cpu_ns - s0.thread_cpu_ns) as f64 / 1e6,
            s1.fired - s0.fired,
            s1.fired,
            s1.spins,
            s1.sleeps
        );
    });
}
