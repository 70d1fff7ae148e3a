//! The Debian package: `cargo deb` builds it from this build's binary (no second
//! build), `dpkg -i` installs the binary, the unit and the configuration,
//! `systemd-analyze verify` accepts the unit, and the installed binary started
//! with the installed configuration serves its LUN (in a network namespace of
//! its own, so its default ports 3260 and 8260 collide with nothing). The
//! package is purged and /var/lib/freesan removed at the end.
//!
//! Installs on this machine: needs root, dpkg and cargo-deb; skipped otherwise
//! (a failure under FREESAN_REQUIRE_TOOLS=1).

use crate::common;

use common::*;
use std::path::Path;
use std::process::Command;

const UNIT: &str = "/usr/lib/systemd/system/freesan.service";
const CONFIG: &str = "/etc/freesan/freesan.toml";

/// Purges the package and its data directory, also when the test fails.
struct Purge;

impl Drop for Purge {
    fn drop(&mut self) {
        let _ = Command::new("dpkg").args(["--purge", "freesan"]).output();
        let _ = std::fs::remove_dir_all("/var/lib/freesan");
    }
}

#[test]
fn debian_package_installs_and_serves() {
    // SAFETY: geteuid has no preconditions
    let root = unsafe { libc::geteuid() } == 0;
    if !root || !have("dpkg") || !have("cargo-deb") || !have("systemd-analyze") || !have("unshare")
    {
        eprintln!("skipping: needs root, dpkg, cargo-deb, systemd-analyze and unshare");
        return;
    }
    assert!(
        !Path::new("/var/lib/freesan").exists() && !Path::new("/usr/bin/freesan").exists(),
        "freesan is already installed on this machine; the test would overwrite it"
    );
    let root_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let out = tempfile::tempdir().unwrap();
    // the binary of this test run (target/<profile>/freesan), not a new build
    let profile = Path::new(env!("CARGO_BIN_EXE_freesan"))
        .parent()
        .and_then(|p| p.file_name())
        .and_then(|p| p.to_str())
        .expect("profile directory")
        .to_string();
    let (ok, log) = run(
        "cargo",
        &[
            "deb",
            "-p",
            "freesan",
            "--no-build",
            "--profile",
            &profile,
            "--manifest-path",
            &root_dir.join("Cargo.toml").display().to_string(),
            "--output",
            &out.path().display().to_string(),
        ],
    );
    assert!(ok, "cargo deb: {log}");
    let deb = std::fs::read_dir(out.path())
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|x| x == "deb"))
        .expect("a .deb");
    let _purge = Purge;
    let (ok, log) = run("dpkg", &["-i", &deb.display().to_string()]);
    assert!(ok, "dpkg -i: {log}");
    for f in ["/usr/bin/freesan", UNIT, CONFIG] {
        assert!(Path::new(f).exists(), "{f} not installed");
    }
    let (ok, log) = run("dpkg", &["-V", "freesan"]);
    assert!(ok && log.trim().is_empty(), "installed files differ: {log}");
    let (ok, log) = run("systemd-analyze", &["verify", UNIT]);
    assert!(ok, "systemd-analyze verify: {log}");

    // the installed binary with the installed configuration, in a network
    // namespace: serves LUN 0, answers status, stops cleanly on SIGTERM
    let script = format!(
        "set -e\n\
         ip link set lo up\n\
         /usr/bin/freesan serve --config {CONFIG} --log-format json 2> {d}/serve.log &\n\
         pid=$!\n\
         for i in $(seq 600); do grep -q 'connect with:' {d}/serve.log && break; kill -0 $pid; sleep 0.05; done\n\
         iscsi-inq iscsi://127.0.0.1:3260/iqn.2026-11.org.freesan:storage/0\n\
         /usr/bin/freesan bench --target iscsi://127.0.0.1:3260/iqn.2026-11.org.freesan:storage/0 \
           --single-path --rw randwrite --bs 4k --secs 1 --ramp 0 --verify --quiet\n\
         /usr/bin/freesan status --api 127.0.0.1:8260 --data-dir /var/lib/freesan\n\
         kill -TERM $pid\n\
         wait $pid\n",
        d = out.path().display()
    );
    let (ok, log) = run("unshare", &["-n", "bash", "-c", &script]);
    let serve_log = std::fs::read_to_string(out.path().join("serve.log")).unwrap_or_default();
    assert!(ok, "the installed node: {log}\nserve log:\n{serve_log}");
    assert!(log.contains("Vendor") || log.contains("vendor"), "{log}");
    assert!(log.contains("health         ok"), "{log}");
    assert!(serve_log.contains("freesan stopped cleanly"), "{serve_log}");
    // JSON log lines for collectors
    assert!(
        serve_log
            .lines()
            .any(|l| l.starts_with('{') && l.contains("\"level\"")),
        "{serve_log}"
    );
}
