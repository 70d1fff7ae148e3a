//! Disks, pools and LUNs created through the CLI while the node serves: they serve
//! at once, survive a restart (DATA_DIR/managed.toml), refuse what the config
//! would refuse, and a LUN created at run time can be deleted again.

use crate::common;
use common::*;
use std::path::Path;

fn ok(api: &str, args: &[&str]) -> String {
    let (ok, out) = cli(api, args);
    assert!(ok, "freesan {args:?} failed: {out}");
    out
}

fn refused(api: &str, args: &[&str], why: &str) {
    let (ok, out) = cli(api, args);
    assert!(!ok, "freesan {args:?} was accepted: {out}");
    assert!(
        out.contains(why),
        "freesan {args:?}: expected {why:?} in {out}"
    );
}

/// Two seconds of `bench --verify` 16K random writes to `url` (run to the end),
/// keeping the verification state in `state`.
fn verified_random_writes(url: &str, state: &Path) -> (bool, String) {
    run(
        env!("CARGO_BIN_EXE_freesan"),
        &[
            "bench",
            "--target",
            url,
            "--single-path",
            "--bs",
            "16k",
            "--rw",
            "randwrite",
            "--threads",
            "2",
            "--qd",
            "4",
            "--secs",
            "2",
            "--ramp",
            "0",
            "--verify",
            "--quiet",
            "--verify-state",
            state.to_str().unwrap(),
        ],
    )
}

fn luns(api: &str) -> Vec<serde_json::Value> {
    let out = ok(api, &["lun", "list", "--json"]);
    serde_json::from_str::<Vec<serde_json::Value>>(&out).expect("lun list JSON")
}

#[test]
fn disks_pools_and_luns_created_at_run_time_serve_and_survive_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = one_file_lun_config(dir.path());
    let mut node = start_config(dir.path(), &cfg);
    let api = node.api.clone().expect("no API address in the banner");

    for d in ["d0", "d1", "d2"] {
        ok(&api, &["disk", "create", d, "--size", "64M"]);
    }
    ok(
        &api,
        &[
            "disk",
            "create",
            "d3",
            "--size",
            "64M",
            "--io-timeout-secs",
            "7",
        ],
    );
    refused(
        &api,
        &["disk", "create", "d0", "--size", "64M"],
        "configured twice",
    );
    let out = ok(&api, &["disk", "list"]);
    assert_eq!(out.matches(" free").count(), 4, "{out}");
    ok(
        &api,
        &[
            "pool", "create", "p", "--level", "raid5", "--member", "d0,d1,d2", "--chunk", "16K",
        ],
    );
    // a disk in a pool is not free for another
    refused(
        &api,
        &[
            "pool", "create", "q", "--level", "raid1", "--member", "d2,d3",
        ],
        "used twice",
    );
    refused(
        &api,
        &["lun", "create", "--target", IQN, "--pool", "nosuch"],
        "not configured",
    );
    refused(
        &api,
        &[
            "lun",
            "create",
            "--target",
            "iqn.2026-11.org.freesan:nosuch",
            "--pool",
            "p",
        ],
        "no target named",
    );
    let out = ok(&api, &["lun", "create", "--target", IQN, "--pool", "p"]);
    assert!(
        out.contains("LUN 1 of"),
        "the lowest free LUN number: {out}"
    );
    let l = luns(&api);
    assert_eq!(l.len(), 2, "{l:?}");
    assert_eq!(l[1]["lun"], 1);
    assert_eq!(l[1]["created_at_run_time"], true);
    assert_eq!(l[0]["created_at_run_time"], false);

    // the new LUN serves I/O at once: verified writes, then a check of every one
    let state = dir.path().join("verify.state");
    let url = node.url(0, 1);
    let (done, out) = verified_random_writes(&url, &state);
    assert!(done, "verified writes to the new LUN failed: {out}");
    assert_acknowledged_writes_intact(&url, &state, "the LUN created at run time");

    // after a restart the disks, the pool and the LUN are back, with the data
    assert!(node.terminate(), "unclean exit");
    let mut node = start_config(dir.path(), &cfg);
    let api = node.api.clone().expect("no API address in the banner");
    let l = luns(&api);
    assert_eq!(l.len(), 2, "the LUN did not come back: {l:?}");
    let out = ok(&api, &["pool", "status", "p"]);
    assert!(out.contains("raid5"), "{out}");
    assert_acknowledged_writes_intact(&node.url(0, 1), &state, "the LUN after a restart");
    // and each disk with its command timeout
    let disks: serde_json::Value =
        serde_json::from_str(&ok(&api, &["disk", "list", "--json"])).expect("disk list JSON");
    let timeout_of = |n: &str| {
        disks
            .as_array()
            .unwrap()
            .iter()
            .find(|d| d["name"] == n)
            .unwrap_or_else(|| panic!("no {n} in {disks}"))["io_timeout_secs"]
            .clone()
    };
    assert_eq!(timeout_of("d3"), 7, "{disks}");
    assert_eq!(timeout_of("d0"), 20, "{disks}");

    let listed = |portal: &str| {
        let (done, out) = run("iscsi-ls", &["-s", &format!("iscsi://{portal}")]);
        assert!(done, "{out}");
        out
    };
    let tools = have("iscsi-ls");
    if tools {
        let out = listed(&node.portals[0]);
        assert!(out.contains("Lun:1"), "LUN 1 not listed: {out}");
    }
    // LUNs of the config file are deleted there; run-time ones here
    refused(
        &api,
        &["lun", "delete", "--target", IQN, "--lun", "0"],
        "config file",
    );
    refused(
        &api,
        &["lun", "delete", "--target", IQN, "--lun", "7"],
        "no LUN 7",
    );
    ok(&api, &["lun", "delete", "--target", IQN, "--lun", "1"]);
    assert_eq!(luns(&api).len(), 1);
    if tools {
        let out = listed(&node.portals[0]);
        assert!(!out.contains("Lun:1"), "LUN 1 still listed: {out}");
    }
    assert!(node.terminate(), "unclean exit");
    let node = start_config(dir.path(), &cfg);
    let api = node.api.clone().expect("no API address in the banner");
    assert_eq!(luns(&api).len(), 1, "a deleted LUN came back");
    ok(&api, &["pool", "status", "p"]);
}

/// Spares added at run time, one of them pulled in for a failed member, are kept:
/// after a restart the pool is assembled from its disks as they are now, not as
/// the config listed them.
#[test]
fn pool_disks_changed_at_run_time_are_assembled_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = config_head(dir.path(), 5);
    s += "[[pool]]\nname = \"p\"\nlevel = \"raid5\"\nchunk = \"16K\"\nmembers = [\"d0\", \"d1\", \"d2\"]\n";
    s += &format!("[[target]]\niqn = \"{IQN}\"\n[[target.lun]]\npool = \"p\"\n");
    let cfg = dir.path().join("node.toml");
    std::fs::write(&cfg, s).unwrap();
    let mut node = start_config(dir.path(), &cfg);
    let api = node.api.clone().expect("no API address in the banner");
    let state = dir.path().join("verify.state");
    let (done, out) = verified_random_writes(&node.url(0, 0), &state);
    assert!(done, "{out}");
    ok(&api, &["pool", "add-spare", "p", "d3"]);
    // d0 fails: the spare d3 takes its place; d4 becomes the new spare
    ok(&api, &["pool", "fail", "p", "0"]);
    ok(&api, &["pool", "add-spare", "p", "d4"]);
    let disks = |api: &str| {
        let out = ok(api, &["pool", "status", "p", "--json"]);
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        let names = |k: &str| {
            let mut n: Vec<String> = v[k]
                .as_array()
                .unwrap()
                .iter()
                .map(|m| m["name"].as_str().unwrap().to_string())
                .collect();
            n.sort();
            n
        };
        (names("members"), names("spares"), v["state"].clone())
    };
    let before = disks(&api);
    assert_eq!(before.0, ["d1", "d2", "d3"], "{before:?}");
    assert_eq!(before.1, ["d4"], "{before:?}");
    assert!(node.terminate(), "unclean exit");
    let node = start_config(dir.path(), &cfg);
    let api = node.api.clone().expect("no API address in the banner");
    let after = disks(&api);
    assert_eq!((&after.0, &after.1), (&before.0, &before.1), "{after:?}");
    // d0, failed and replaced, is no longer the pool's
    let out = ok(&api, &["disk", "list", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let d0 = v
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["name"] == "d0")
        .unwrap();
    assert_eq!(d0["free"], true, "{v}");
    assert_acknowledged_writes_intact(&node.url(0, 0), &state, "the pool after a restart");
}
