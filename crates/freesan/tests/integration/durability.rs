//! Durability end to end: data written and synced (SYNCHRONIZE CACHE) before a
//! SIGKILL of the server is there after the restart, with the same LUN identity.

use crate::common;
use common::*;

fn start(dir: &std::path::Path) -> Node {
    start_file_lun(dir, "64M", "serve.log")
}

fn naa(url: &str) -> String {
    let (ok, out) = run("iscsi-inq", &["-e", "1", "-c", "131", url]);
    assert!(ok, "iscsi-inq failed: {out}");
    let lu: Vec<&str> = out
        .split("DEVICE DESIGNATOR")
        .filter(|d| d.contains("LOGICAL_UNIT"))
        .collect();
    assert!(
        lu.iter().any(|d| d.contains("(3) NAA")),
        "no NAA designator: {out}"
    );
    lu.concat()
}

#[test]
fn synced_writes_survive_sigkill_and_identity_is_stable() {
    if !have("qemu-io") || !have("iscsi-inq") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut node = start(dir.path());
    let url = node.url(0, 0);
    let id_before = naa(&url);
    // Two patterns, each flushed (qemu-io's flush sends SYNCHRONIZE CACHE), then SIGKILL.
    let (ok, out) = run(
        "qemu-io",
        &[
            "-f",
            "raw",
            "-c",
            "write -P 0x5a 1M 4M",
            "-c",
            "flush",
            "-c",
            "write -P 0xa5 8M 64k",
            "-c",
            "flush",
            &url,
        ],
    );
    assert!(ok && !out.contains("error"), "write failed: {out}");
    node.kill9();

    let node = start(dir.path());
    let url = node.url(0, 0);
    let (ok, out) = run(
        "qemu-io",
        &[
            "-f",
            "raw",
            "-c",
            "read -P 0x5a 1M 4M",
            "-c",
            "read -P 0xa5 8M 64k",
            "-c",
            "read -P 0 0 1M",
            &url,
        ],
    );
    assert!(
        ok && !out.contains("Pattern verification failed"),
        "data lost after SIGKILL: {out}"
    );
    assert_eq!(naa(&url), id_before, "LUN identity changed across restart");
}

#[test]
fn sigterm_shuts_down_cleanly() {
    if !have("qemu-io") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut node = start(dir.path());
    let url = node.url(0, 0);
    let (ok, out) = run("qemu-io", &["-f", "raw", "-c", "write -P 0x11 0 1M", &url]);
    assert!(ok, "write failed: {out}");
    assert!(node.terminate(), "freesan did not exit cleanly on SIGTERM");
    let log = std::fs::read_to_string(&node.log).unwrap();
    assert!(log.contains("stopped cleanly"), "no clean-stop line: {log}");
    // the written data is in the file
    let data = std::fs::read(dir.path().join("lun0.img")).unwrap();
    assert!(data[..1 << 20].iter().all(|&b| b == 0x11));
}
