//! NBD exports follow the LUNs created and deleted through the management API
//! while the node serves: a created LUN is an export at once; a deleted one is
//! gone for new clients, its connected clients are cut off, and no NBD write
//! reaches its backing file after the delete is acknowledged, although a client
//! keeps writing.

use crate::common;
use block::Volume;
use common::*;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

fn config(dir: &Path) -> std::path::PathBuf {
    let s = format!(
        "data_dir = \"{d}/data\"\n[api]\naddress = \"127.0.0.1:0\"\n[[portal]]\naddress = \"127.0.0.1:0\"\n\
         [nbd]\naddress = \"127.0.0.1:0\"\n\
         [[target]]\niqn = \"{IQN}\"\n[[target.lun]]\npath = \"{d}/lun0.img\"\nsize = \"16M\"\n",
        d = dir.display()
    );
    let path = dir.join("node.toml");
    std::fs::write(&path, s).unwrap();
    path
}

fn cli(api: &str, args: &[&str]) -> String {
    let mut all = vec![args[0], "--api", api];
    all.extend_from_slice(&args[1..]);
    let (ok, out) = freesan(&all);
    assert!(ok, "freesan {args:?} failed: {out}");
    out
}

fn block_of(seed: u64) -> block::Bytes {
    let mut v = vec![0u8; 4096];
    for (i, b) in v.iter_mut().enumerate() {
        *b = (seed.wrapping_mul(31).wrapping_add(i as u64 * 7) % 251) as u8;
    }
    block::Bytes::from(v)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exports_follow_luns_created_and_deleted_at_run_time() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path());
    let mut node = start_config(dir.path(), &cfg);
    let api = node.api.clone().expect("api address");
    let nbd_addr = node.nbd.clone().expect("nbd address");
    assert!(nbd::NbdClient::connect(&nbd_addr, "lun1").await.is_err());

    // inside the data directory: the API serves files only where the config allows
    let file = dir.path().join("data").join("lun1.img");
    let f = file.to_str().unwrap();
    cli(
        &api,
        &[
            "lun", "create", "--target", IQN, "--lun", "1", "--file", f, "--size", "16M",
        ],
    );
    let c = nbd::NbdClient::connect(&nbd_addr, "lun1")
        .await
        .expect("a created LUN is an NBD export at once");
    let by_iqn = nbd::NbdClient::connect(&nbd_addr, &format!("{IQN}/lun1"))
        .await
        .expect("also under IQN/lun1");
    assert_eq!(c.export_size_bytes(), 16 << 20);
    let bs = c.geometry().block_size_bytes as u64;
    let per_block = 4096 / bs;
    c.write(0, block_of(1), true).await.unwrap();
    assert_eq!(by_iqn.read(0, per_block as u32).await.unwrap(), block_of(1));

    // A writer that never stops: blocks 1.. in turn, FUA.
    let c = Arc::new(c);
    let stop = Arc::new(AtomicBool::new(false));
    let acked = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    let writer = {
        let (c, stop, acked, failed) = (c.clone(), stop.clone(), acked.clone(), failed.clone());
        tokio::spawn(async move {
            let mut seq = 2u64;
            while !stop.load(Ordering::Relaxed) {
                let lba = (1 + seq % 1000) * per_block;
                match c.write(lba, block_of(seq), true).await {
                    Ok(()) => acked.fetch_add(1, Ordering::Relaxed),
                    Err(_) => {
                        failed.fetch_add(1, Ordering::Relaxed);
                        tokio::time::sleep(Duration::from_millis(5)).await;
                        0
                    }
                };
                seq += 1;
            }
        })
    };
    tokio::time::timeout(Duration::from_secs(20), async {
        while acked.load(Ordering::Relaxed) < 10 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("the writer writes");

    let api2 = api.clone();
    tokio::task::spawn_blocking(move || {
        cli(&api2, &["lun", "delete", "--target", IQN, "--lun", "1"]);
    })
    .await
    .unwrap();
    // The delete is acknowledged: the file must not change any more.
    let after_delete = std::fs::read(&file).unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    stop.store(true, Ordering::Relaxed);
    writer.await.unwrap();
    assert!(
        failed.load(Ordering::Relaxed) > 0,
        "the connected client's writes fail after the delete"
    );
    assert!(
        std::fs::read(&file).unwrap() == after_delete,
        "an NBD write reached the deleted LUN's file after the delete was acknowledged"
    );
    assert!(c.write(0, block_of(99), true).await.is_err());
    assert!(
        by_iqn.read(0, 1).await.is_err(),
        "connected clients are cut off"
    );
    assert!(nbd::NbdClient::connect(&nbd_addr, "lun1").await.is_err());
    assert!(nbd::NbdClient::connect(&nbd_addr, &format!("{IQN}/lun1"))
        .await
        .is_err());
    assert_eq!(
        &after_delete[..4096],
        &block_of(1)[..],
        "acknowledged data kept"
    );

    // LUN 0 of the config file is untouched and still served.
    let c0 = nbd::NbdClient::connect(&nbd_addr, "lun0").await.unwrap();
    c0.write(0, block_of(7), true).await.unwrap();
    assert_eq!(c0.read(0, per_block as u32).await.unwrap(), block_of(7));
    assert!(node.terminate(), "clean stop");
}
