//! `freesan bench --verify` end to end across a server crash: random writes with a
//! saved verification state, SIGKILL of the server mid-run, restart, and
//! `freesan bench check` finds every acknowledged block; wiping the LUN makes the
//! same check fail (so the check can fail).

use crate::common;
use common::*;

fn start(dir: &std::path::Path) -> Node {
    start_file_lun(dir, "64M", "serve.log")
}

#[test]
fn acknowledged_writes_survive_a_server_sigkill() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("verify.state");
    let mut node = start(dir.path());
    let url = node.url(0, 0);
    let mut bench = start_verified_writes(&url, &state, "4k", 2, 6);
    node.kill9();
    // the bench loses its only path, fails its I/O and saves the final state
    let status = bench.wait().unwrap();
    assert!(
        !status.success(),
        "bench claimed success with its server killed"
    );

    let mut node = start(dir.path());
    let (ok, out) = bench_check(&node.url(0, 0), &state);
    assert!(ok, "acknowledged writes lost across SIGKILL: {out}");
    let checked: u64 = out
        .split_whitespace()
        .zip(out.split_whitespace().skip(1))
        .find(|(_, w)| *w == "blocks")
        .and_then(|(n, _)| n.parse().ok())
        .unwrap_or(0);
    assert!(
        checked > 100,
        "too few blocks checked to mean anything: {out}"
    );

    // negative control: the same check on a wiped LUN must fail
    assert!(node.terminate());
    let lun = dir.path().join("lun0.img");
    let f = std::fs::OpenOptions::new().write(true).open(&lun).unwrap();
    f.set_len(0).unwrap();
    f.set_len(64 << 20).unwrap();
    drop(f);
    let node = start(dir.path());
    let (ok, out) = bench_check(&node.url(0, 0), &state);
    assert!(!ok, "check passed on a wiped LUN: {out}");
}
