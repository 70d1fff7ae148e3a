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

/// Runs `cdb` with Data-Out `out` on LUN 0 of session `s`, past the unit
/// attentions a new nexus meets first; returns the status.
async fn scsi_status(s: &initiator::Session, cdb: &[u8], out: &[u8]) -> u8 {
    for _ in 0..8 {
        let r = s
            .command(0, cdb, bytes::Bytes::copy_from_slice(out), 0)
            .await
            .expect("command");
        let ua = r.status == 2
            && r.sense
                .as_deref()
                .and_then(initiator::parse_sense)
                .is_some_and(|x| x.key == 6);
        if !ua {
            return r.status;
        }
    }
    panic!("unit attentions without end");
}

/// PERSISTENT RESERVE OUT: service action `sa`, reservation type `ty`, with
/// `key` and `sa_key` in the parameter list.
async fn prout(s: &initiator::Session, sa: u8, ty: u8, key: u64, sa_key: u64) -> u8 {
    let mut p = [0u8; 24];
    p[..8].copy_from_slice(&key.to_be_bytes());
    p[8..16].copy_from_slice(&sa_key.to_be_bytes());
    let cdb = [0x5f, sa, ty, 0, 0, 0, 0, 0, 24, 0];
    scsi_status(s, &cdb, &p).await
}

/// An NBD client counts as an initiator that never registered: a reservation
/// that fences those (here WRITE EXCLUSIVE - REGISTRANTS ONLY, as fence_scsi
/// takes) refuses its writes, and lets its reads through; released, it writes
/// again. Before, NBD went straight to the volume whatever the reservations.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nbd_clients_are_held_to_the_luns_scsi_reservations() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path());
    let node = start_config(dir.path(), &cfg);
    let nbd_addr = node.nbd.clone().expect("nbd address");
    let c = nbd::NbdClient::connect(&nbd_addr, "lun0").await.unwrap();
    let per_block = (4096 / c.geometry().block_size_bytes) as u32;
    c.write(0, block_of(1), true)
        .await
        .expect("no reservation yet");
    let s = initiator::Session::login(
        node.portals[0].parse().unwrap(),
        &initiator::LoginOptions::new("iqn.2026-12.test:fencer", IQN),
    )
    .await
    .expect("login");
    const WE_RO: u8 = 5;
    assert_eq!(prout(&s, 0x00, 0, 0, 0xabc).await, 0, "REGISTER");
    assert_eq!(prout(&s, 0x01, WE_RO, 0xabc, 0).await, 0, "RESERVE");
    assert!(
        c.write(0, block_of(2), true).await.is_err(),
        "an NBD write went through a WRITE EXCLUSIVE - REGISTRANTS ONLY reservation"
    );
    assert_eq!(
        c.read(0, per_block).await.expect("reads are let through"),
        block_of(1)
    );
    assert_eq!(prout(&s, 0x02, WE_RO, 0xabc, 0).await, 0, "RELEASE");
    c.write(0, block_of(3), true)
        .await
        .expect("released: NBD writes again");
    assert_eq!(c.read(0, per_block).await.unwrap(), block_of(3));
    let _ = s.logout().await;
    drop(node);
}

/// The names `nbdinfo --list` gets from the NBD server at `addr`.
fn nbd_list(addr: &str) -> String {
    let out = std::process::Command::new("nbdinfo")
        .args(["--list", &format!("nbd://{addr}")])
        .output()
        .expect("nbdinfo runs");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Under LUN masking an initiator no host group names sees nothing, and an
/// NBD client names none: the target's LUNs are neither listed nor opened
/// while it has host groups (their requests were refused, but the names were
/// listed and the exports opened), and come back when the groups go.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_masked_targets_luns_are_neither_listed_nor_opened_over_nbd() {
    if !have("nbdinfo") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path());
    let node = start_config(dir.path(), &cfg);
    let api = node.api.clone().expect("api address");
    let nbd_addr = node.nbd.clone().expect("nbd address");
    assert!(nbd_list(&nbd_addr).contains("lun0"));
    nbd::NbdClient::connect(&nbd_addr, "lun0")
        .await
        .expect("no host groups yet");
    cli(
        &api,
        &[
            "host-group",
            "create",
            "--target",
            IQN,
            "--name",
            "a",
            "--initiator",
            "iqn.2026-12.test:a",
            "--lun",
            "0",
        ],
    );
    let listed = nbd_list(&nbd_addr);
    assert!(
        !listed.contains("lun0"),
        "a masked LUN is listed:\n{listed}"
    );
    assert!(
        nbd::NbdClient::connect(&nbd_addr, "lun0").await.is_err(),
        "a masked LUN was opened over NBD"
    );
    cli(
        &api,
        &["host-group", "delete", "--target", IQN, "--name", "a"],
    );
    assert!(nbd_list(&nbd_addr).contains("lun0"));
    nbd::NbdClient::connect(&nbd_addr, "lun0")
        .await
        .expect("unmasked again");
    drop(node);
}
