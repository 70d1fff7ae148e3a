//! The Debian package: `cargo deb` builds it from this build's binary (no second
//! build), `dpkg -i` installs the binary, the unit, the configuration and the
//! user `freesan` (in no other group) the node runs as, `systemd-analyze verify`
//! accepts the unit, and the installed binary started as that user with the
//! installed configuration (root's, readable by the group freesan, holding a
//! secret) serves its LUN and a loop device given to the user as a second one
//! (in a network namespace of its own, so its default
//! ports 3260 and 8260 collide with nothing). Root's CLI finds the node's
//! token without being told where, and a token root makes is one the node
//! reads. A data directory of root's, as a version that ran as root left it,
//! is given to the user at the install. The package is purged,
//! /var/lib/freesan removed and the user (when the test made it) deleted at
//! the end.
//!
//! Installs on this machine: needs root, dpkg and cargo-deb; skipped otherwise
//! (a failure under FREESAN_REQUIRE_TOOLS=1).

use crate::common;

use common::*;
use std::path::Path;
use std::process::Command;

const UNIT: &str = "/usr/lib/systemd/system/freesan.service";
const CONFIG: &str = "/etc/freesan/freesan.toml";

/// Purges the package and its data directory, also when the test fails, and
/// deletes the user the package made (a package leaves it, as Debian's do).
struct Purge {
    user_was_there: bool,
}

impl Drop for Purge {
    fn drop(&mut self) {
        let _ = Command::new("dpkg").args(["--purge", "freesan"]).output();
        let _ = std::fs::remove_dir_all("/var/lib/freesan");
        if !self.user_was_there {
            // (a purge that failed leaves the override, which would name a
            // group that no longer exists: dpkg would then refuse to work)
            let _ = Command::new("dpkg-statoverride")
                .args(["--remove", CONFIG])
                .output();
            let _ = Command::new("userdel").arg("freesan").output();
            let _ = Command::new("groupdel").arg("freesan").output();
        }
    }
}

/// Detaches a loop device and gives its node back to its owner (a uid).
struct Detach(String, String);

impl Drop for Detach {
    fn drop(&mut self) {
        let _ = Command::new("losetup").args(["-d", &self.0]).output();
        let _ = Command::new("chown").args([&self.1, &self.0]).output();
    }
}

#[test]
fn debian_package_installs_and_serves() {
    // SAFETY: geteuid has no preconditions
    let root = unsafe { libc::geteuid() } == 0;
    if !root
        || !have("dpkg")
        || !have("cargo-deb")
        || !have("systemd-analyze")
        || !have("unshare")
        || !have("losetup")
        || !have("setpriv")
        || !have("iscsi-inq")
        || !have("ip")
    {
        eprintln!(
            "skipping: needs root, dpkg, cargo-deb, systemd-analyze, unshare, losetup, \
             setpriv, iscsi-inq and ip"
        );
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
    let _purge = Purge {
        user_was_there: run("getent", &["passwd", "freesan"]).0,
    };
    // what a version that ran as root left: its data directory and a state
    // file in it, root's (the postinst gives them to the user)
    std::fs::create_dir("/var/lib/freesan").unwrap();
    std::fs::create_dir("/var/lib/freesan/targets").unwrap();
    std::fs::write("/var/lib/freesan/targets/left-by-root", b"x").unwrap();
    let (ok, log) = run("dpkg", &["-i", &deb.display().to_string()]);
    assert!(ok, "dpkg -i: {log}");
    assert!(log.contains("now runs as user freesan"), "{log}");
    let (_, owner) = run(
        "stat",
        &["-c", "%U", "/var/lib/freesan/targets/left-by-root"],
    );
    assert_eq!(owner.trim(), "freesan", "the old version's state file");
    for f in ["/usr/bin/freesan", UNIT, CONFIG] {
        assert!(Path::new(f).exists(), "{f} not installed");
    }
    let (ok, log) = run("dpkg", &["-V", "freesan"]);
    assert!(ok && log.trim().is_empty(), "installed files differ: {log}");
    let (ok, log) = run("systemd-analyze", &["verify", UNIT]);
    assert!(ok, "systemd-analyze verify: {log}");
    let unit = std::fs::read_to_string(UNIT).unwrap();
    assert!(unit.lines().any(|l| l == "User=freesan"), "{unit}");

    // the user, in its own group alone (group disk would open every disk of
    // the host), and what it owns or may read
    let (ok, groups) = run("id", &["-nG", "freesan"]);
    assert!(ok, "no user freesan: {groups}");
    let groups: Vec<&str> = groups.split_whitespace().collect();
    assert_eq!(groups, ["freesan"]);
    let (_, owners) = run("stat", &["-c", "%U:%G %a", CONFIG, "/var/lib/freesan"]);
    assert_eq!(
        owners.lines().collect::<Vec<_>>(),
        ["root:freesan 640", "freesan:freesan 700"],
        "the configuration and the data directory"
    );
    // a block device as LUN 1, given to the user
    let img = out.path().join("disk.img");
    std::fs::File::create(&img)
        .unwrap()
        .set_len(32 << 20)
        .unwrap();
    let (ok, dev) = run("losetup", &["-f", "--show", &img.display().to_string()]);
    assert!(ok, "losetup: {dev}");
    let dev = dev.trim().to_string();
    // as a udev rule with OWNER="freesan" gives it (the README's way; this
    // machine has no udev: its loop nodes are root's, 0600); put back at the
    // end
    let (_, was) = run("stat", &["-c", "%u", &dev]);
    let _detach = Detach(dev.clone(), was.trim().to_string());
    let (ok, log) = run("chown", &["freesan", &dev]);
    assert!(ok, "{log}");
    // and a secret in the configuration: accepted from root's file the
    // node's group alone may read (refused in any other file but a 0600 one)
    let config = std::fs::read_to_string(CONFIG)
        .unwrap()
        .replacen(
            "data_dir =",
            "discovery_chap = { user = \"disc\", secret = \"discovery-secret-1\" }\ndata_dir =",
            1,
        )
        .replacen(
            "[api]",
            &format!("[[target.lun]]\npath = \"{}\"\n\n[api]", _detach.0),
            1,
        );
    std::fs::write(CONFIG, config).unwrap();
    // root's show-config reads the service's data directory as its user
    // (refused before, and told to use runuser), the secret masked
    let (ok, shown) = run("/usr/bin/freesan", &["show-config", "--config", CONFIG]);
    assert!(ok, "{shown}");
    assert!(
        shown.contains("user = \"disc\"") && !shown.contains("discovery-secret-1"),
        "{shown}"
    );

    // the installed binary with the installed configuration, run as the
    // unit runs it (user freesan, its groups) in a network namespace: serves
    // LUN 0, answers root's status (the token found in /var/lib/freesan
    // without --data-dir), reads the token root makes, stops cleanly on SIGTERM
    let script = format!(
        "set -e\n\
         ip link set lo up\n\
         setpriv --reuid freesan --regid freesan --init-groups --inh-caps=-all \
           /usr/bin/freesan serve --config {CONFIG} --log-format json > {d}/serve.out 2> {d}/serve.log &\n\
         pid=$!\n\
         trap 'kill $pid 2>/dev/null && wait $pid' EXIT\n\
         for i in $(seq 600); do grep -q 'connect with:' {d}/serve.log && break; kill -0 $pid; sleep 0.05; done\n\
         echo \"node uid $(stat -c %U /proc/$pid)\"\n\
         iscsi-inq iscsi://127.0.0.1:3260/iqn.2026-11.org.freesan:storage/0\n\
         for lun in 0 1; do\n\
           /usr/bin/freesan bench --target iscsi://127.0.0.1:3260/iqn.2026-11.org.freesan:storage/$lun \
             --single-path --rw randwrite --bs 4k --secs 1 --ramp 0 --verify --quiet\n\
         done\n\
         /usr/bin/freesan status --api 127.0.0.1:8260\n\
         tok=$(/usr/bin/freesan api token create --role read-only --name by-root --data-dir /var/lib/freesan)\n\
         echo \"tokens file $(stat -c %U /var/lib/freesan/api/tokens.json)\"\n\
         FREESAN_API_TOKEN=$tok /usr/bin/freesan status --api 127.0.0.1:8260 | grep -q 'health  '\n\
         /usr/bin/freesan status --api 127.0.0.1:8260\n\
         kill -TERM $pid\n\
         wait $pid\n",
        d = out.path().display()
    );
    // (bounded: a node that never stops would otherwise hold the test; -k:
    // one that ignores SIGTERM is killed, with the whole group)
    let (ok, log) = run(
        "timeout",
        &["-k", "30", "300", "unshare", "-n", "bash", "-c", &script],
    );
    let serve_log = std::fs::read_to_string(out.path().join("serve.log")).unwrap_or_default();
    assert!(ok, "the installed node: {log}\nserve log:\n{serve_log}");
    assert!(log.contains("node uid freesan"), "{log}");
    assert!(log.contains("tokens file freesan"), "{log}");
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
