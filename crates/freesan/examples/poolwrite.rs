//! poolwrite: in-process sequential-write figures of a RAID pool of simulated HDDs,
//! without any network protocol in between (to tell the pool's cost from the
//! target's). Usage: [NCQ=off] cargo run --release -p freesan --example poolwrite -- [LEVEL] [N] [BS_KIB] [QD] [SECS]
use block::{MemVolume, VolumeRef};
use disk::sim::SimDiskConfig;
use disk::SimDisk;
use raid::{Member, Pool, PoolConfig, RaidLevel};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[tokio::main]
async fn main() {
    let a: Vec<String> = std::env::args().collect();
    let level: RaidLevel = match a.get(1).map(String::as_str).unwrap_or("raid5") {
        "raid0" => RaidLevel::Raid0,
        "raid6" => RaidLevel::Raid6,
        "disk" => RaidLevel::Raid0,
        _ => RaidLevel::Raid5,
    };
    let n: usize = a.get(2).and_then(|s| s.parse().ok()).unwrap_or(10);
    let bs_kib: u64 = a.get(3).and_then(|s| s.parse().ok()).unwrap_or(256);
    let qd: usize = a.get(4).and_then(|s| s.parse().ok()).unwrap_or(32);
    let secs: u64 = a.get(5).and_then(|s| s.parse().ok()).unwrap_or(5);
    let ncq = std::env::var("NCQ").map_or(true, |v| v != "off");
    let cfg: SimDiskConfig = toml::from_str(&format!("model = \"hdd\"\nncq = {ncq}")).unwrap();
    let sims: Vec<Arc<SimDisk>> = (0..n)
        .map(|_| {
            let store = Arc::new(MemVolume::new(4096, (256u64 << 20) / 4096)) as VolumeRef;
            Arc::new(SimDisk::from_config(store, &cfg).unwrap())
        })
        .collect();
    let mut pool_ref = None;
    let vol: VolumeRef = if a.get(1).map(String::as_str) == Some("disk") {
        sims[0].clone()
    } else {
        let mut pc = PoolConfig::new("p", level);
        pc.rebuild_rate_mb_s = 0;
        let members = sims
            .iter()
            .enumerate()
            .map(|(i, s)| Member::new(format!("m{i}"), s.clone() as VolumeRef))
            .collect();
        let pool = Pool::create(pc, members, vec![]).await.unwrap();
        pool.wait_idle().await;
        let p = Arc::new(pool);
        pool_ref = Some(p.clone());
        p
    };
    let bs = vol.geometry().block_size_bytes as u64;
    let blocks = bs_kib * 1024 / bs;
    let total = vol.geometry().block_count / blocks * blocks;
    let next = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let end = Instant::now() + Duration::from_secs(secs);
    let mut tasks = Vec::new();
    for _ in 0..qd {
        let vol = vol.clone();
        let next = next.clone();
        tasks.push(tokio::spawn(async move {
            let buf = block::Bytes::from(vec![7u8; (blocks * bs) as usize]);
            let mut done = 0u64;
            while Instant::now() < end {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let lba = (i * blocks) % total;
                vol.write(lba, buf.clone(), false).await.unwrap();
                done += 1;
            }
            done
        }));
    }
    let t0 = Instant::now();
    let mut ops = 0;
    for t in tasks {
        ops += t.await.unwrap();
    }
    let mb = (ops * blocks * bs) as f64 / 1e6 / t0.elapsed().as_secs_f64();
    println!(
        "{} x{n} {bs_kib}K QD{qd}: {mb:.1} MB/s",
        a.get(1).map(String::as_str).unwrap_or("raid5")
    );
    if let Some(p) = pool_ref {
        println!("  {:?}", p.status().stripe_writes);
    }
}
