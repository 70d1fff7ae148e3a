//! RAID 5 and RAID 6 pools survive a SIGKILL during heavy writes: restart (the
//! pool is assembled and its stripe journal replayed), fail as many members as the
//! level tolerates through the management API, and every block acknowledged before
//! the kill reads back correctly (`freesan bench --verify` state + `bench check`),
//! with partial-stripe writes (journaled) and with whole-stripe writes (written in
//! place under the write intent).

mod common;
use common::*;

fn config(dir: &std::path::Path, level: &str, members: usize) -> std::path::PathBuf {
    let mut s = config_head(dir, members);
    let names: Vec<String> = (0..members).map(|i| format!("\"d{i}\"")).collect();
    s += &format!(
        "[[pool]]\nname = \"p\"\nlevel = \"{level}\"\nchunk = \"16K\"\nmembers = [{}]\n",
        names.join(", ")
    );
    s += &format!("[[target]]\niqn = \"{IQN}\"\n[[target.lun]]\npool = \"p\"\n");
    let path = dir.join("node.toml");
    std::fs::write(&path, s).unwrap();
    path
}

fn crash_then_degrade(level: &str, members: usize, bs: &str, fail: &[usize]) {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), level, members);
    let state = dir.path().join("verify.state");
    let mut node = start_config(dir.path(), &cfg);
    let url = node.url(0, 0);
    let mut bench = start_verified_writes(&url, &state, bs, 4, 5);
    if bs == WHOLE_STRIPE {
        // the writes really take the whole-stripe path (no journal record)
        let api = node.api.clone().expect("no API address in the banner");
        let (ok, out) = freesan(&["pool", "--api", &api, "status", "p", "--json"]);
        assert!(ok, "{out}");
        let v: serde_json::Value = serde_json::from_str(&out).expect("status json");
        let p = if v.is_array() { &v[0] } else { &v };
        assert!(
            p["stripe_writes"]["full"].as_u64().unwrap_or(0) > 0,
            "no whole-stripe writes: {out}"
        );
    }
    node.kill9();
    let _ = bench.wait();

    // restart: assemble + journal replay; then lose members within tolerance
    let node = start_config(dir.path(), &cfg);
    let api = node.api.clone().expect("no API address in the banner");
    for pos in fail {
        let (ok, out) = freesan(&["pool", "--api", &api, "fail", "p", &pos.to_string()]);
        assert!(ok, "failing member {pos} refused: {out}");
    }
    let (ok, out) = freesan(&["pool", "--api", &api, "status", "p", "--json"]);
    assert!(ok, "{out}");
    assert!(
        out.contains("\"degraded\""),
        "pool not degraded after failing members: {out}"
    );
    assert_acknowledged_writes_intact(
        &node.url(0, 0),
        &state,
        &format!("{level} after SIGKILL + member failure"),
    );
}

#[test]
fn raid5_sigkill_during_writes_then_member_failure() {
    crash_then_degrade("raid5", 4, "8k", &[1]);
}

/// Chunk 16K: a RAID 5 of 4 and a RAID 6 of 5 both hold 48K of data per stripe;
/// aligned random writes of that size are whole-stripe writes (no journal).
const WHOLE_STRIPE: &str = "48k";

#[test]
fn raid5_sigkill_during_whole_stripe_writes_then_member_failure() {
    crash_then_degrade("raid5", 4, WHOLE_STRIPE, &[2]);
}

#[test]
fn raid6_sigkill_during_whole_stripe_writes_then_two_member_failures() {
    crash_then_degrade("raid6", 5, WHOLE_STRIPE, &[1, 4]);
}

#[test]
fn raid6_sigkill_during_writes_then_two_member_failures() {
    crash_then_degrade("raid6", 5, "8k", &[0, 3]);
}
