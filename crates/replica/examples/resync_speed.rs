//! How fast a resync copies over loopback between two nodes whose copies are
//! files on this machine's disk, against the disk itself: node 1 is away while
//! node 2 writes `MIB` MiB alone (1 MiB writes, then one flush), node 1 returns,
//! and the time until both are in sync is measured, with the flushes node 2's
//! copy took meanwhile (the resync source makes a range durable before it clears
//! its bits). The peer figure: the same bytes written to a file and flushed
//! once, and with one flush per MiB, on the same disk.
//!
//! `cargo run --release -p replica --example resync_speed -- [MIB] [DIR]`
//! (default 256 MiB under /var/tmp).
use async_trait::async_trait;
use block::{BlockError, BlockResult, Bytes, Geometry, Volume, VolumeRef};
use replica::secure::ClusterKeys;
use replica::{Mode, ReplicaConfig, ReplicatedVolume, SyncListener, SyncSinks};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const BS: u64 = 4096;

/// A file as a volume with a volatile cache (the page cache): `flush` is fdatasync.
struct FileCopy {
    file: Arc<File>,
    blocks: u64,
    flushes: AtomicU64,
}

fn io(e: std::io::Error) -> BlockError {
    BlockError::Io(e)
}

#[async_trait]
impl Volume for FileCopy {
    fn geometry(&self) -> Geometry {
        Geometry {
            block_size_bytes: BS as u32,
            block_count: self.blocks,
            thin: false,
            volatile_cache: true,
            optimal_io_blocks: 1,
            max_io_blocks: 1024,
        }
    }
    async fn read(&self, lba: u64, blocks: u32) -> BlockResult<Bytes> {
        let f = self.file.clone();
        tokio::task::spawn_blocking(move || {
            let mut b = vec![0u8; blocks as usize * BS as usize];
            f.read_exact_at(&mut b, lba * BS).map_err(io)?;
            Ok(Bytes::from(b))
        })
        .await
        .map_err(|e| io(std::io::Error::other(e)))?
    }
    async fn write(&self, lba: u64, data: Bytes, fua: bool) -> BlockResult<()> {
        let f = self.file.clone();
        tokio::task::spawn_blocking(move || {
            f.write_all_at(&data, lba * BS).map_err(io)?;
            if fua {
                f.sync_data().map_err(io)?;
            }
            Ok(())
        })
        .await
        .map_err(|e| io(std::io::Error::other(e)))?
    }
    async fn flush(&self) -> BlockResult<()> {
        self.flushes.fetch_add(1, Ordering::Relaxed);
        let f = self.file.clone();
        tokio::task::spawn_blocking(move || f.sync_data().map_err(io))
            .await
            .map_err(|e| io(std::io::Error::other(e)))?
    }
    async fn discard(&self, _lba: u64, _blocks: u64) -> BlockResult<()> {
        Ok(())
    }
}

fn copy_file(path: &Path, bytes: u64) -> Arc<FileCopy> {
    let file = File::options()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)
        .expect("copy file");
    file.set_len(bytes).expect("size");
    Arc::new(FileCopy {
        file: Arc::new(file),
        blocks: bytes / BS,
        flushes: AtomicU64::new(0),
    })
}

fn cfg(
    node: u8,
    dir: &Path,
    peer: Vec<std::net::SocketAddr>,
    keys: Arc<ClusterKeys>,
) -> ReplicaConfig {
    ReplicaConfig {
        name: "vol".into(),
        cluster: "speed".into(),
        node_id: node,
        preferred_node: 2,
        peer_sync: peer,
        witness: None,
        mode: Mode::ActiveActive,
        region_bytes: 64 << 10,
        heartbeat_interval_ms: 250,
        peer_timeout_ms: 1500,
        io_wait_ms: 5000,
        state_dir: dir.join(format!("node{node}")),
        keys,
        buffers: block::BufferBudget::unlimited(),
    }
}

fn in_sync(s: &replica::ReplicaStatus) -> bool {
    s.state == "in-sync"
}

#[tokio::main]
async fn main() {
    let mut args = std::env::args().skip(1);
    let mib: u64 = args.next().map_or(256, |a| a.parse().expect("MIB"));
    let base = PathBuf::from(args.next().unwrap_or_else(|| "/var/tmp".into()));
    let dir = tempfile::tempdir_in(&base).expect("temporary folder");
    let bytes = (mib + 16) << 20;
    let keys: Vec<Arc<ClusterKeys>> = ClusterKeys::generate("speed")
        .expect("keys")
        .into_iter()
        .map(Arc::new)
        .collect();
    let c1 = copy_file(&dir.path().join("c1"), bytes);
    let c2 = copy_file(&dir.path().join("c2"), bytes);

    let (n2, sink2) = ReplicatedVolume::open(
        cfg(2, dir.path(), vec![], keys[1].clone()),
        c2.clone() as VolumeRef,
    )
    .expect("node 2");
    let sinks = SyncSinks::default();
    sinks.insert("vol", sink2);
    let l = SyncListener::bind(&["127.0.0.1:0".parse().unwrap()], sinks, keys[1].clone())
        .await
        .expect("listener");
    let addr2 = l.local_addrs()[0];
    l.spawn();
    let open1 = || {
        ReplicatedVolume::open(
            cfg(1, dir.path(), vec![addr2], keys[0].clone()),
            c1.clone() as VolumeRef,
        )
        .expect("node 1")
        .0
    };
    let n1 = open1();
    assert!(
        n1.wait_until(in_sync, Duration::from_secs(60)).await,
        "never in sync"
    );
    n1.shutdown().await;
    // node 2 alone: MIB MiB of writes, then one flush
    let chunk = Bytes::from(vec![0x5au8; 1 << 20]);
    for i in 0..mib {
        n2.write(i * (1 << 20) / BS, chunk.clone(), false)
            .await
            .expect("write alone");
    }
    n2.flush().await.expect("flush");
    let before = c2.flushes.load(Ordering::Relaxed);
    let t = Instant::now();
    let n1 = open1();
    assert!(
        n1.wait_until(in_sync, Duration::from_secs(600)).await,
        "never in sync"
    );
    let secs = t.elapsed().as_secs_f64();
    let flushes = c2.flushes.load(Ordering::Relaxed) - before;
    println!(
        "resync of {mib} MiB: {secs:.2} s, {:.0} MiB/s; the source's copy flushed {flushes} times",
        mib as f64 / secs
    );
    n1.shutdown().await;

    // the disk alone: the same bytes written and flushed once, and flushed per MiB
    for per_mib in [false, true] {
        let f = copy_file(&dir.path().join("raw"), bytes);
        let t = Instant::now();
        for i in 0..mib {
            f.write(i * (1 << 20) / BS, chunk.clone(), false)
                .await
                .expect("raw write");
            if per_mib {
                f.flush().await.expect("raw flush");
            }
        }
        f.flush().await.expect("raw flush");
        let secs = t.elapsed().as_secs_f64();
        println!(
            "the disk: {mib} MiB written, {}: {secs:.2} s, {:.0} MiB/s",
            if per_mib {
                "flushed per MiB"
            } else {
                "flushed once"
            },
            mib as f64 / secs
        );
    }
}
