//! A write-back SSD cache over a RAID 5 pool: acknowledged writes survive a SIGKILL
//! of the node (dirty data on the mirrored SSDs, reloaded and destaged at restart),
//! and losing one SSD of the mirror in the middle of a run loses nothing (checked
//! with `freesan bench --verify` state and `bench check`).

mod common;
use common::*;

fn config(dir: &std::path::Path) -> std::path::PathBuf {
    let mut s = config_head(dir, 4);
    for i in 0..2 {
        s += &format!(
            "[[disk]]\nname = \"ssd{i}\"\nsize = \"40M\"\npath = \"{}/ssd{i}.img\"\n",
            dir.display()
        );
    }
    s += "[[pool]]\nname = \"p\"\nlevel = \"raid5\"\nchunk = \"16K\"\nmembers = [\"d0\", \"d1\", \"d2\", \"d3\"]\n";
    // dirty data stays in the cache (destage only when idle below 90%)
    s += "[[cache]]\nname = \"c\"\npool = \"p\"\nmode = \"write-back\"\ndevices = [\"ssd0\", \"ssd1\"]\n\
          size = \"32M\"\nblock_size = \"64K\"\ndirty_low_percent = 90\ndirty_high_percent = 95\n";
    s += &format!("[[target]]\niqn = \"{IQN}\"\n[[target.lun]]\ncache = \"c\"\n");
    let path = dir.join("node.toml");
    std::fs::write(&path, s).unwrap();
    path
}

fn cache_status(api: &str) -> serde_json::Value {
    let (ok, out) = freesan(&["cache", "--api", api, "status", "c", "--json"]);
    assert!(ok, "{out}");
    serde_json::from_str(&out).expect("cache status json")
}

#[test]
fn write_back_cache_sigkill_during_writes_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path());
    let state = dir.path().join("verify.state");
    let mut node = start_config(dir.path(), &cfg);
    let api = node.api.clone().expect("no API address in the banner");
    let mut bench = start_verified_writes(&node.url(0, 0), &state, "8k", 4, 4);
    let st = cache_status(&api);
    assert!(
        st["dirty_blocks"].as_u64().unwrap_or(0) > 0,
        "no dirty data in the cache at the kill: {st}"
    );
    node.kill9();
    let _ = bench.wait();
    // restart: the map is reloaded from the SSDs, dirty blocks served and destaged
    let node = start_config(dir.path(), &cfg);
    let api = node.api.clone().expect("no API address in the banner");
    let st = cache_status(&api);
    assert!(
        st["cached_blocks"].as_u64().unwrap_or(0) > 0,
        "nothing reloaded: {st}"
    );
    assert_acknowledged_writes_intact(&node.url(0, 0), &state, "after SIGKILL");
}

#[test]
fn losing_one_ssd_of_the_mirror_mid_run_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path());
    let state = dir.path().join("verify.state");
    let mut node = start_config(dir.path(), &cfg);
    let api = node.api.clone().expect("no API address in the banner");
    let mut bench = start_verified_writes(&node.url(0, 0), &state, "8k", 4, 4);
    let (ok, out) = freesan(&["cache", "--api", &api, "fail", "c", "0"]);
    assert!(ok, "{out}");
    let status = bench.wait().unwrap();
    assert!(status.success(), "I/O failed after an SSD was lost");
    let st = cache_status(&api);
    assert!(
        st["state"].as_str().unwrap_or("").starts_with("degraded"),
        "{st}"
    );
    assert_acknowledged_writes_intact(&node.url(0, 0), &state, "with one SSD left");
    // and after a crash of the node on top, from the survivor alone
    node.kill9();
    let node = start_config(dir.path(), &cfg);
    assert_acknowledged_writes_intact(&node.url(0, 0), &state, "survivor after SIGKILL");
}
