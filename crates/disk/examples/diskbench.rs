//! diskbench: IOPS and CPU per I/O of FileVolume for both engines, with a floor
//! measured in the same run (32 plain threads doing synchronous pread/pwrite, the
//! way tgt's rdwr backend issues I/O, without its dispatch hops).
//!
//! Usage: cargo run --release -p disk --example diskbench -- [DIR] [SECONDS] [SIZE]
//! (defaults: /dev/shm, 3, 1G). Writes DIR/diskbench.img and removes it after.

use block::{Bytes, Volume};
use disk::{parse_size, DirectIo, Engine, FileOptions, FileVolume};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const QUEUE_DEPTH: usize = 32;

#[derive(Clone, Copy, Debug)]
enum Pattern {
    RandRead4k,
    RandWrite4k,
    SeqRead256k,
    SeqWrite256k,
}

impl Pattern {
    fn io_bytes(self) -> u64 {
        match self {
            Pattern::RandRead4k | Pattern::RandWrite4k => 4096,
            _ => 256 * 1024,
        }
    }
    fn is_write(self) -> bool {
        matches!(self, Pattern::RandWrite4k | Pattern::SeqWrite256k)
    }
    fn is_random(self) -> bool {
        matches!(self, Pattern::RandRead4k | Pattern::RandWrite4k)
    }
}

const PATTERNS: [Pattern; 4] = [
    Pattern::RandRead4k,
    Pattern::RandWrite4k,
    Pattern::SeqRead256k,
    Pattern::SeqWrite256k,
];

struct Figures {
    iops: f64,
    mb_per_s: f64,
    cpu_us_per_io: f64,
}

fn cpu_seconds() -> f64 {
    // SAFETY: getrusage fills the zeroed struct.
    let ru = unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut ru);
        ru
    };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

fn xorshift(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}

/// Byte offset of the next I/O of worker `w`.
fn next_offset(p: Pattern, w: usize, n: u64, rng: &mut u64, size_bytes: u64) -> u64 {
    let io = p.io_bytes();
    let slots = size_bytes / io;
    if p.is_random() {
        xorshift(rng) % slots * io
    } else {
        // Each worker streams through its own region.
        let region = slots / QUEUE_DEPTH as u64;
        (w as u64 * region + n % region.max(1)) * io
    }
}

fn figures(ops: u64, bytes: u64, secs: f64, cpu: f64) -> Figures {
    Figures {
        iops: ops as f64 / secs,
        mb_per_s: bytes as f64 / secs / 1e6,
        cpu_us_per_io: cpu * 1e6 / ops.max(1) as f64,
    }
}

async fn bench_volume(v: Arc<FileVolume>, p: Pattern, secs: f64, size_bytes: u64) -> Figures {
    let stop = Arc::new(AtomicBool::new(false));
    let ops = Arc::new(AtomicU64::new(0));
    let bs = v.geometry().block_size_bytes as u64;
    let payload = Bytes::from(vec![0x5au8; p.io_bytes() as usize]);
    let cpu0 = cpu_seconds();
    let t0 = Instant::now();
    let mut tasks = Vec::new();
    for w in 0..QUEUE_DEPTH {
        let (v, stop, ops, payload) = (v.clone(), stop.clone(), ops.clone(), payload.clone());
        tasks.push(tokio::spawn(async move {
            let mut rng = 0x9e37_79b9_7f4a_7c15u64 ^ ((w as u64 + 1) * 0x1234_5678);
            let mut n = 0u64;
            let mut done = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let lba = next_offset(p, w, n, &mut rng, size_bytes) / bs;
                n += 1;
                let r = if p.is_write() {
                    v.write(lba, payload.clone(), false).await
                } else {
                    v.read(lba, (p.io_bytes() / bs) as u32).await.map(|_| ())
                };
                if let Err(e) = r {
                    eprintln!("I/O error: {e}");
                    break;
                }
                done += 1;
            }
            ops.fetch_add(done, Ordering::Relaxed);
        }));
    }
    tokio::time::sleep(Duration::from_secs_f64(secs)).await;
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        let _ = t.await;
    }
    let secs = t0.elapsed().as_secs_f64();
    let ops = ops.load(Ordering::Relaxed);
    figures(ops, ops * p.io_bytes(), secs, cpu_seconds() - cpu0)
}

fn bench_sync_threads(path: &Path, p: Pattern, secs: f64, size_bytes: u64) -> Figures {
    let file = match std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
    {
        Ok(f) => Arc::new(f),
        Err(e) => {
            eprintln!("open {}: {e}", path.display());
            return figures(0, 0, 1.0, 0.0);
        }
    };
    let stop = Arc::new(AtomicBool::new(false));
    let cpu0 = cpu_seconds();
    let t0 = Instant::now();
    let handles: Vec<_> = (0..QUEUE_DEPTH)
        .map(|w| {
            let (file, stop) = (file.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut buf = vec![0x5au8; p.io_bytes() as usize];
                let mut rng = 0x9e37_79b9_7f4a_7c15u64 ^ ((w as u64 + 1) * 0x1234_5678);
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let off = next_offset(p, w, n, &mut rng, size_bytes);
                    let r = if p.is_write() {
                        file.write_all_at(&buf, off)
                    } else {
                        file.read_exact_at(&mut buf, off)
                    };
                    if r.is_err() {
                        break;
                    }
                    n += 1;
                }
                n
            })
        })
        .collect();
    std::thread::sleep(Duration::from_secs_f64(secs));
    stop.store(true, Ordering::Relaxed);
    let ops: u64 = handles.into_iter().map(|h| h.join().unwrap_or(0)).sum();
    let secs = t0.elapsed().as_secs_f64();
    figures(ops, ops * p.io_bytes(), secs, cpu_seconds() - cpu0)
}

fn print(label: &str, p: Pattern, f: &Figures, floor: &Figures) {
    println!(
        "{label:<22} {:<13} {:>9.0} IOPS {:>8.1} MB/s {:>6.1} us CPU/IO   x{:.2} of floor",
        format!("{p:?}"),
        f.iops,
        f.mb_per_s,
        f.cpu_us_per_io,
        f.iops / floor.iops.max(1.0)
    );
}

fn main() {
    let mut args = std::env::args().skip(1);
    let dir = PathBuf::from(args.next().unwrap_or_else(|| "/dev/shm".into()));
    let secs: f64 = args.next().and_then(|s| s.parse().ok()).unwrap_or(3.0);
    let size_bytes = args.next().and_then(|s| parse_size(&s)).unwrap_or(1 << 30);
    let path = dir.join("diskbench.img");
    let _ = std::fs::remove_file(&path);

    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("runtime: {e}");
            return;
        }
    };
    rt.block_on(async {
        // Fill the file so reads hit data, not holes.
        let opts = FileOptions {
            create_size_bytes: Some(size_bytes),
            ..FileOptions::default()
        };
        let v = match FileVolume::open(&path, &opts) {
            Ok(v) => v,
            Err(e) => {
                eprintln!("open {}: {e}", path.display());
                return;
            }
        };
        let chunk = Bytes::from(vec![0xa5u8; 1 << 20]);
        let bs = v.geometry().block_size_bytes as u64;
        for off in (0..v.geometry().size_bytes()).step_by(1 << 20) {
            if let Err(e) = v.write(off / bs, chunk.clone(), false).await {
                eprintln!("fill: {e}");
                return;
            }
        }
        let _ = v.flush().await;
        drop(v);
        println!(
            "diskbench: {} ({} MiB), {secs} s per run, {QUEUE_DEPTH} in flight, 2 tokio workers",
            path.display(),
            size_bytes >> 20
        );
        for p in PATTERNS {
            let floor = bench_sync_threads(&path, p, secs, size_bytes);
            print("sync pread threads", p, &floor, &floor);
            for engine in [Engine::IoUring, Engine::Threads] {
                for direct in [DirectIo::Auto, DirectIo::Off, DirectIo::On] {
                    let opts = FileOptions {
                        engine,
                        direct,
                        ..FileOptions::default()
                    };
                    let v = match FileVolume::open(&path, &opts) {
                        Ok(v) => Arc::new(v),
                        Err(_) => continue, // e.g. O_DIRECT refused here
                    };
                    let label = format!(
                        "{engine:?} {direct:?}{}",
                        if v.is_direct() { " (dio)" } else { "" }
                    );
                    let f = bench_volume(v, p, secs, size_bytes).await;
                    print(&label, p, &f, &floor);
                }
            }
        }
    });
    let _ = std::fs::remove_file(&path);
}
