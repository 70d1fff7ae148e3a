//! Exports added and removed while the server runs: a new export serves at once;
//! a removed one is gone for new clients, its connected clients are closed, and
//! the removal returns only after every request that had started has finished,
//! so nothing reaches the volume through NBD afterwards.

use crate::common;

use block::{Bytes, DelayVolume, MemVolume, Volume, VolumeRef};
use common::{pattern, start, Raw};
use nbd::proto::{encode_request, Command, Request};
use nbd::{NbdClient, NbdExport, NbdLimits};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::AsyncWriteExt;

/// A volume that counts the writes that reached it (before passing them on).
struct Arrivals {
    inner: VolumeRef,
    writes: std::sync::atomic::AtomicU64,
}

#[async_trait::async_trait]
impl Volume for Arrivals {
    fn geometry(&self) -> block::Geometry {
        self.inner.geometry()
    }
    async fn read(&self, lba: u64, blocks: u32) -> block::BlockResult<Bytes> {
        self.inner.read(lba, blocks).await
    }
    async fn write(&self, lba: u64, data: Bytes, fua: bool) -> block::BlockResult<()> {
        self.writes
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.inner.write(lba, data, fua).await
    }
    async fn flush(&self) -> block::BlockResult<()> {
        self.inner.flush().await
    }
    async fn discard(&self, lba: u64, blocks: u64) -> block::BlockResult<()> {
        self.inner.discard(lba, blocks).await
    }
}

fn export(name: &str, volume: VolumeRef) -> NbdExport {
    NbdExport {
        name: name.into(),
        description: format!("{name} added at run time"),
        volume,
        read_only: false,
        access: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_added_export_serves_and_a_removed_one_takes_no_more_writes() {
    let srv = start(&[(512, 2048, false)], NbdLimits::default()).await;
    assert!(NbdClient::connect(srv.addr, "lun1").await.is_err());
    let mem = Arc::new(MemVolume::new(512, 2048));
    let arrivals = Arc::new(Arrivals {
        inner: Arc::new(DelayVolume::new(
            mem.clone(),
            Duration::ZERO,
            Duration::from_millis(300),
        )),
        writes: Default::default(),
    });
    let slow: VolumeRef = arrivals.clone();
    srv.exports.add(export("lun1", slow.clone())).unwrap();
    assert!(
        srv.exports.add(export("lun1", slow.clone())).is_err(),
        "names stay unique"
    );
    assert_eq!(srv.exports.names(), vec!["lun0", "lun1"]);

    let c = NbdClient::connect(srv.addr, "lun1").await.unwrap();
    c.write(0, Bytes::from(pattern(1, 4096)), false)
        .await
        .unwrap();
    assert_eq!(&mem.read(0, 8).await.unwrap()[..], &pattern(1, 4096)[..]);

    // A write in flight when the removal starts lands before `remove` returns.
    let mut raw = Raw::connect(srv.addr, "lun1").await;
    let before = arrivals.writes.load(std::sync::atomic::Ordering::SeqCst);
    raw.send(Command::Write, 0, 7, 8192, 4096, &pattern(2, 4096))
        .await;
    // the write has reached the volume (which holds it 300 ms) when the
    // removal starts
    tokio::time::timeout(Duration::from_secs(20), async {
        while arrivals.writes.load(std::sync::atomic::Ordering::SeqCst) == before {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
    .await
    .expect("the write reached the volume");
    assert!(srv.exports.remove("lun1").await);
    assert_eq!(
        &mem.read(16, 8).await.unwrap()[..],
        &pattern(2, 4096)[..],
        "the in-flight write finished before the removal returned"
    );
    let rep = raw.reply().await.expect("the in-flight write is answered");
    assert_eq!((rep.cookie, rep.error), (7, 0));

    // After the removal: no new client, and the connected ones write nothing.
    assert!(NbdClient::connect(srv.addr, "lun1").await.is_err());
    let before = mem.read(0, 2048).await.unwrap();
    assert!(c
        .write(0, Bytes::from(pattern(3, 4096)), true)
        .await
        .is_err());
    let hdr = encode_request(&Request {
        flags: 0,
        command: Command::Write,
        cookie: 8,
        offset_bytes: 0,
        length_bytes: 4096,
    });
    // The server closed the connection: the write may not even be sent.
    if raw.sock.write_all(&hdr).await.is_ok() && raw.sock.write_all(&pattern(4, 4096)).await.is_ok()
    {
        if let Some(rep) = raw.reply().await {
            assert_ne!(rep.error, 0, "a write after the removal is refused");
        }
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(mem.read(0, 2048).await.unwrap(), before, "nothing landed");
    assert!(!srv.exports.remove("lun1").await, "already gone");

    // The name can serve again, a new volume.
    let fresh = Arc::new(MemVolume::new(512, 64));
    srv.exports.add(export("lun1", fresh.clone())).unwrap();
    let c2 = NbdClient::connect(srv.addr, "lun1").await.unwrap();
    assert_eq!(c2.export_size_bytes(), 64 * 512);
    c2.write(0, Bytes::from(pattern(5, 512)), true)
        .await
        .unwrap();
    assert_eq!(&fresh.read(0, 1).await.unwrap()[..], &pattern(5, 512)[..]);
    c2.disconnect().await.unwrap();
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn removing_the_default_export_leaves_no_default() {
    let srv = start(&[(512, 64, false)], NbdLimits::default()).await;
    let c = NbdClient::connect(srv.addr, "").await.unwrap();
    assert!(srv.exports.remove("lun0").await);
    assert!(
        c.read(0, 1).await.is_err(),
        "the connected client is closed"
    );
    assert!(NbdClient::connect(srv.addr, "").await.is_err());
    srv.stop().await;
}
