//! Online resize of a LUN on a RAID 5 pool: `freesan lun resize` reaches the
//! pool's grow, which extends the member files itself, zeroes the new stripes and
//! commits the size in the superblocks while `freesan bench --verify` writes; the
//! initiator is told and sees the new size; every acknowledged write reads back;
//! after a SIGKILL the pool reassembles at the new size and a member failure loses
//! nothing; shrinking is refused.

use crate::common;
use common::scsi::{capacity_bytes, command};
use common::*;

const MIB: u64 = 1 << 20;

fn config(dir: &std::path::Path) -> std::path::PathBuf {
    let mut s = config_head(dir, 4);
    s += "[[pool]]\nname = \"p\"\nlevel = \"raid5\"\nchunk = \"16K\"\n\
          members = [\"d0\", \"d1\", \"d2\", \"d3\"]\n";
    s += &format!("[[target]]\niqn = \"{IQN}\"\n[[target.lun]]\npool = \"p\"\n");
    let path = dir.join("node.toml");
    std::fs::write(&path, s).unwrap();
    path
}

/// Grows LUN 0 to 200M through the API while `freesan bench --verify` writes
/// for `secs` s; every acknowledged write reads back afterwards.
fn grow_under_verified_writes(api: &str, url: &str, state: &std::path::Path, secs: u32) {
    let mut bench = start_verified_writes(url, state, "16k", 2, secs);
    let (ok, out) = cli(
        api,
        &[
            "lun", "resize", "--target", IQN, "--lun", "0", "--size", "200M",
        ],
    );
    assert!(ok && out.contains("grown"), "{out}");
    assert!(
        bench.wait().unwrap().success(),
        "verified writes failed during the resize"
    );
    assert_acknowledged_writes_intact(url, state, "across the resize");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_lun_grows_while_verified_writes_run() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path());
    let mut node = start_config(dir.path(), &cfg);
    let api = node.api.clone().expect("no API address in the banner");
    let url = node.url(0, 0);

    let addr = node.portals[0].parse().unwrap();
    let s = initiator::Session::login(
        addr,
        &initiator::LoginOptions::new("iqn.2026-11.test:pool-resize", IQN),
    )
    .await
    .expect("login");
    for _ in 0..4 {
        if command(&s, &[0; 6], 0).await.status == 0 {
            break;
        }
    }
    // 64 MiB members, 17 MiB reserved (superblocks + 16 MiB journal): 47 MiB
    // of data on each, three of four members' worth
    assert_eq!(capacity_bytes(&s).await, 3 * 47 * MIB);

    let state = dir.path().join("verify.state");
    grow_under_verified_writes(&api, &url, &state, 4);

    let r = command(&s, &[0; 6], 0).await;
    assert_eq!(r.status, 2, "no CAPACITY DATA HAS CHANGED");
    assert_eq!(capacity_bytes(&s).await, 200 * MIB);
    // the member files were extended by the grow: 17 MiB reserved plus the
    // stripes (16 KiB per member each) that hold 200 MiB, rounded up
    let stripes = (200 * MIB).div_ceil(3 * 16 * 1024);
    for i in 0..4 {
        let len = std::fs::metadata(dir.path().join(format!("d{i}.img")))
            .unwrap()
            .len();
        assert_eq!(len, 17 * MIB + stripes * 16 * 1024, "d{i}");
    }
    let p = pool_status(&api, "p");
    assert_eq!(p["usable_bytes"].as_u64(), Some(200 * MIB), "{p}");

    // a verified run that reaches the new space
    let state2 = dir.path().join("verify2.state");
    let mut bench = start_verified_writes(&url, &state2, "256k", 2, 2);
    assert!(bench.wait().unwrap().success());
    assert_acknowledged_writes_intact(&url, &state2, "after the pool resize");
    drop(s);

    // SIGKILL, restart: the pool reassembles at the new size; lose a member
    node.kill9();
    let node = start_config(dir.path(), &cfg);
    let api = node.api.clone().expect("no API address in the banner");
    let p = pool_status(&api, "p");
    assert_eq!(p["usable_bytes"].as_u64(), Some(200 * MIB), "{p}");
    let (ok, out) = freesan(&["pool", "--api", &api, "fail", "p", "1"]);
    assert!(ok, "{out}");
    assert_eq!(pool_status(&api, "p")["state"], "degraded");
    // (the second run wrote over the first one's blocks: its state is the one)
    assert_acknowledged_writes_intact(&node.url(0, 0), &state2, "restart, member lost");

    // shrinking is refused
    let (ok, out) = cli(
        &api,
        &[
            "lun", "resize", "--target", IQN, "--lun", "0", "--size", "100M",
        ],
    );
    assert!(!ok && out.contains("shrinking"), "{out}");
}

/// A LUN on a write-back SSD cache in front of a RAID 5 pool: the resize grows
/// the pool below the cache, then the cache; dirty data in the cache survives a
/// SIGKILL right after, and the node comes back at the new size.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cached_pool_lun_grows_and_keeps_its_dirty_data_across_a_sigkill() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = config_head(dir.path(), 4);
    for i in 0..2 {
        s += &format!(
            "[[disk]]\nname = \"ssd{i}\"\nsize = \"32M\"\npath = \"{}/ssd{i}.img\"\n",
            dir.path().display()
        );
    }
    s += "[[pool]]\nname = \"p\"\nlevel = \"raid5\"\nchunk = \"16K\"\n\
          members = [\"d0\", \"d1\", \"d2\", \"d3\"]\n";
    s += "[[cache]]\nname = \"c\"\npool = \"p\"\nmode = \"write-back\"\n\
          devices = [\"ssd0\", \"ssd1\"]\nsize = \"16M\"\nblock_size = \"64K\"\n";
    s += &format!("[[target]]\niqn = \"{IQN}\"\n[[target.lun]]\ncache = \"c\"\n");
    let cfg = dir.path().join("node.toml");
    std::fs::write(&cfg, s).unwrap();
    let mut node = start_config(dir.path(), &cfg);
    let api = node.api.clone().expect("no API address in the banner");
    let url = node.url(0, 0);

    let state = dir.path().join("verify.state");
    grow_under_verified_writes(&api, &url, &state, 3);
    assert_eq!(
        pool_status(&api, "p")["usable_bytes"].as_u64(),
        Some(200 * MIB)
    );

    // writes over the whole grown LUN, then a SIGKILL with them still dirty in
    // the write-back cache
    let state2 = dir.path().join("verify2.state");
    let mut bench = start_verified_writes(&url, &state2, "64k", 2, 2);
    assert!(bench.wait().unwrap().success());
    node.kill9();
    let node = start_config(dir.path(), &cfg);
    let addr = node.portals[0].parse().unwrap();
    let s = initiator::Session::login(
        addr,
        &initiator::LoginOptions::new("iqn.2026-11.test:cached-resize", IQN),
    )
    .await
    .expect("login");
    for _ in 0..4 {
        if command(&s, &[0; 6], 0).await.status == 0 {
            break;
        }
    }
    assert_eq!(
        capacity_bytes(&s).await,
        200 * MIB,
        "the size after a restart"
    );
    assert_acknowledged_writes_intact(&node.url(0, 0), &state2, "cached resize, SIGKILL");
}
