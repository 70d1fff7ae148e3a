//! Measures the initiator against the freesan target in the same process:
//! QD32 4 KiB random reads for a few seconds, one path then two paths.
//! Run with `cargo run --release -p initiator --example inprocess_iops`.

use block::{MemVolume, Volume, VolumeRef};
use initiator::{open_url, OpenOptions};
use iscsi::{Auth, Limits, Portal, Server, ServerConfig, TargetSpec};
use rand::{Rng, SeedableRng};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const IQN: &str = "iqn.2026-01.org.freesan:bench";
const BLOCKS: u64 = 2 * 1024 * 1024; // 1 GiB of 512-byte blocks
const QUEUE_DEPTH: usize = 32;
const SECONDS: u64 = 5;

fn target(vol: VolumeRef) -> Arc<scsi::ScsiTarget> {
    let cfg = scsi::TargetConfig::one_port_group(
        IQN,
        2,
        vec![(
            0,
            scsi::LunConfig {
                naa: [0x60, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15],
                serial: "BENCH".into(),
                vendor: "FREESAN".into(),
                product: "BENCH".into(),
                revision: "0001".into(),
                read_only: false,
                state_file: None,
                physical_block_exponent: 0,
                sanitize_rate_bytes_per_s: 0,
            },
            vol,
        )],
    );
    Arc::new(scsi::ScsiTarget::new(cfg).expect("scsi target"))
}

async fn run(vol: Arc<dyn Volume>, label: &str) {
    let done = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + Duration::from_secs(SECONDS);
    let mut set = tokio::task::JoinSet::new();
    for w in 0..QUEUE_DEPTH {
        let (vol, done) = (vol.clone(), done.clone());
        set.spawn(async move {
            let mut rng = rand::rngs::StdRng::seed_from_u64(w as u64);
            while Instant::now() < deadline {
                let lba = rng.gen_range(0..BLOCKS / 8) * 8;
                vol.read(lba, 8).await.expect("read");
                done.fetch_add(1, Ordering::Relaxed);
            }
        });
    }
    while set.join_next().await.is_some() {}
    let n = done.load(Ordering::Relaxed);
    println!(
        "{label}: {} IOPS (QD{QUEUE_DEPTH}, 4 KiB random read, {SECONDS} s)",
        n / SECONDS
    );
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let vol: VolumeRef = Arc::new(MemVolume::new(512, BLOCKS));
        // Touch every chunk so reads are of allocated memory.
        let chunk = block::Bytes::from(vec![1u8; 1 << 20]);
        for lba in (0..BLOCKS).step_by(2048) {
            vol.write(lba, chunk.clone(), false).await.expect("fill");
        }
        let cfg = ServerConfig {
            partner_portals: Vec::new(),
            portals: vec![
                Portal {
                    addr: "127.0.0.1:0".parse().expect("addr"),
                    tpgt: 1,
                },
                Portal {
                    addr: "127.0.0.2:0".parse().expect("addr"),
                    tpgt: 2,
                },
            ],
            targets: vec![TargetSpec {
                iqn: IQN.into(),
                alias: None,
                scsi: target(vol),
                auth: Auth::default(),
                allowed_initiators: vec![],
            }],
            discovery_auth: Auth::default(),
            limits: Limits::default(),
            buffers: block::BufferBudget::unlimited(),
        };
        let server = Server::bind(cfg).await.expect("bind");
        let addr = server.local_addrs()[0];
        tokio::spawn(server.run(std::future::pending()));
        let url = format!("iscsi://{addr}/{IQN}/0");
        let one = open_url(
            &url,
            &OpenOptions {
                single_path: true,
                ..OpenOptions::default()
            },
        )
        .await
        .expect("open one path");
        run(one, "1 path").await;
        let two = open_url(&url, &OpenOptions::default())
            .await
            .expect("open two paths");
        run(two, "2 paths round-robin").await;
    });
}
