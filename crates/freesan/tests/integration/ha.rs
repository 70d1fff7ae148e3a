//! Two-node HA in network namespaces: a client namespace with two links to each
//! node, one sync link between the nodes, a witness namespace linked to both.
//! Real `freesan serve` processes, a real `freesan witness`, and `freesan bench`
//! with multipath over the four paths (SendTargets lists both nodes' portals).
//!
//! - SIGKILL of a node under `bench --verify` random writes: no I/O error reaches
//!   the workload (the longest I/O is printed; the issue asks for under 3 s),
//!   every acknowledged block reads back; the node returns, resyncs roughly what
//!   was written meanwhile, and the two backing files are byte-identical.
//! - Cutting only the sync link: exactly one node keeps accepting writes; the
//!   copies are identical once the link is back.
//! - Overlapping writes from two initiators, one through each node, over several
//!   runs: identical copies after every run.
//! - The leader's disk stops answering (a frozen file system): given up at its
//!   timeout, its copy detached, the partner serving alone without an error.

use crate::common;

use common::netns::{available, Topology, TopologyOptions};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::{Duration, Instant};

const IQN: &str = "iqn.2026-11.org.freesan:ha";
const PORT: u16 = 3260;
const SYNC_PORT: u16 = 3270;
const WITNESS_PORT: u16 = 3271;
const API: &str = "127.0.0.1:9100";
/// The web console's listener in each node's namespace.
const CONSOLE: &str = "127.0.0.1:9101";
const LUN_SIZE: &str = "256M";
/// The LUN's size when it is a `[[disk]]` on a small file system.
const DISK_LUN_SIZE: &str = "64M";

struct Ha {
    topo: Topology,
    dir: tempfile::TempDir,
    mode: String,
    /// Where each node's LUN lives when it is a `[[disk]]` (`d0.img` in
    /// each directory, with a 2 s command timeout) rather than a file.
    disk_dirs: Option<[PathBuf; 2]>,
    nodes: [Option<Child>; 2],
    _witness: Child,
}

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_freesan")
}

impl Ha {
    fn start(prefix: &str) -> Option<Ha> {
        Ha::start_with(prefix, "active-active")
    }

    fn start_with(prefix: &str, mode: &str) -> Option<Ha> {
        Ha::start_opts(prefix, mode, 1)
    }

    fn start_opts(prefix: &str, mode: &str, sync_links: u32) -> Option<Ha> {
        Ha::start_full(prefix, mode, sync_links, None)
    }

    fn start_full(
        prefix: &str,
        mode: &str,
        sync_links: u32,
        disk_dirs: Option<[PathBuf; 2]>,
    ) -> Option<Ha> {
        if !available() {
            return None;
        }
        let topo = Topology::create(
            prefix,
            TopologyOptions {
                sync_links,
                ..TopologyOptions::default()
            },
        );
        let dir = tempfile::tempdir().unwrap();
        // the pair's keys, as an operator makes them
        let keys = dir.path().join("keys");
        let st = std::process::Command::new(bin())
            .args(["cluster", "init", "--name", "ha-test", "--out"])
            .arg(&keys)
            .output()
            .unwrap();
        assert!(st.status.success(), "freesan cluster init failed: {st:?}");
        let witness = topo.spawn(
            topo.ns_witness(),
            bin(),
            [
                "witness".to_string(),
                "--listen".into(),
                format!("0.0.0.0:{WITNESS_PORT}"),
                "--state".into(),
                dir.path().join("witness.json").display().to_string(),
                "--key-file".into(),
                keys.join("witness.key").display().to_string(),
            ],
            &dir.path().join("witness.log"),
        );
        let mut ha = Ha {
            topo,
            dir,
            mode: mode.to_string(),
            disk_dirs,
            nodes: [None, None],
            _witness: witness,
        };
        for k in 1..=2 {
            ha.write_config(k);
            ha.start_node(k);
        }
        Some(ha)
    }

    fn node_dir(&self, k: u32) -> PathBuf {
        self.dir.path().join(format!("n{k}"))
    }

    fn write_config(&self, k: u32) {
        let t = &self.topo;
        let peer = 3 - k;
        let d = self.node_dir(k);
        std::fs::create_dir_all(&d).unwrap();
        let cfg = format!(
            r#"data_dir = "{d}"
[api]
address = "{API}"
console = "{CONSOLE}"
[[portal]]
address = "{p1}:{PORT}"
allow_without_chap = true
[[portal]]
address = "{p2}:{PORT}"
allow_without_chap = true
[cluster]
name = "ha-test"
node_id = {k}
preferred_node = 1
sync = [{s}]
peer_sync = [{ps}]
peer_portals = ["{q1}:{PORT}", "{q2}:{PORT}"]
witness = "{w}:{WITNESS_PORT}"
key_file = "{keys}/node{k}.key"
{disk}[[target]]
iqn = "{IQN}"
[[target.lun]]
{backing}
replicated = true
replica_mode = "{mode}"
"#,
            mode = self.mode,
            disk = match &self.disk_dirs {
                Some(dirs) => format!(
                    "[[disk]]\nname = \"d0\"\npath = \"{}/d0.img\"\nsize = \"{DISK_LUN_SIZE}\"\n\
                     io_timeout_secs = 2\n",
                    dirs[(k - 1) as usize].display()
                ),
                None => String::new(),
            },
            backing = match &self.disk_dirs {
                Some(_) => "disk = \"d0\"".to_string(),
                None => format!("path = \"{}/lun0.img\"\nsize = \"{LUN_SIZE}\"", d.display()),
            },
            d = d.display(),
            p1 = t.client_portal_addr(k, 1),
            p2 = t.client_portal_addr(k, 2),
            s = self.sync_list(k),
            ps = self.sync_list(peer),
            q1 = t.client_portal_addr(peer, 1),
            q2 = t.client_portal_addr(peer, 2),
            w = t.witness_addr_for(k),
            keys = self.dir.path().join("keys").display(),
        );
        std::fs::write(d.join("node.toml"), cfg).unwrap();
    }

    /// Node `k`'s sync addresses, as a TOML list body.
    fn sync_list(&self, k: u32) -> String {
        (1..=self.topo.options().sync_links)
            .map(|l| format!("\"{}:{SYNC_PORT}\"", self.topo.sync_addr(k, l)))
            .collect::<Vec<_>>()
            .join(", ")
    }

    fn start_node(&mut self, k: u32) {
        let d = self.node_dir(k);
        common::make_private(&d.join("node.toml"));
        let child = self.topo.spawn(
            self.topo.ns_node(k),
            bin(),
            [
                "serve".to_string(),
                "--config".into(),
                d.join("node.toml").display().to_string(),
            ],
            &d.join("serve.log"),
        );
        self.nodes[(k - 1) as usize] = Some(child);
    }

    fn kill9(&mut self, k: u32) {
        if let Some(mut c) = self.nodes[(k - 1) as usize].take() {
            c.kill().unwrap();
            c.wait().unwrap();
        }
    }

    /// The replica status of LUN 0 on node `k` (None while its API is not up).
    fn status(&self, k: u32) -> Option<Value> {
        self.status_lun(k, 0)
    }

    /// The replica status of LUN `lun` on node `k`.
    fn status_lun(&self, k: u32, lun: u32) -> Option<Value> {
        let (ok, out) = self.topo.run(
            self.topo.ns_node(k),
            bin(),
            ["replica", "status", "--api", API, "--json"],
        );
        if !ok {
            return None;
        }
        let v: Value = serde_json::from_str(&out).ok()?;
        let suffix = format!("/lun{lun}");
        v.as_array()?
            .iter()
            .find(|r| r["name"].as_str().is_some_and(|n| n.ends_with(&suffix)))
            .cloned()
    }

    /// Waits until node `k`'s status satisfies `f`; panics with the last status
    /// and the node's log after `secs`.
    fn wait(&self, k: u32, secs: u64, what: &str, f: impl Fn(&Value) -> bool) -> Value {
        self.wait_lun(k, 0, secs, what, f)
    }

    /// [`Ha::wait`] for LUN `lun`.
    fn wait_lun(
        &self,
        k: u32,
        lun: u32,
        secs: u64,
        what: &str,
        f: impl Fn(&Value) -> bool,
    ) -> Value {
        let deadline = Instant::now() + Duration::from_secs(secs);
        loop {
            let s = self.status_lun(k, lun);
            if let Some(s) = &s {
                if f(s) {
                    return s.clone();
                }
            }
            if Instant::now() >= deadline {
                let log =
                    std::fs::read_to_string(self.node_dir(k).join("serve.log")).unwrap_or_default();
                panic!("node {k}: {what} not reached in {secs} s; status {s:?}\nlog:\n{log}");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn wait_in_sync(&self) {
        for k in 1..=2 {
            self.wait(k, 120, "in sync", |s| s["state"] == "in-sync");
        }
    }

    /// With the pair in sync and heartbeats up on both client networks, cuts
    /// the only sync link and waits (20 s at most) until exactly one node serves
    /// alone and the other stands down: (serving alone, standing down).
    fn cut_the_sync_link(&self) -> (u32, u32) {
        self.wait_in_sync();
        let client_links_up = |s: &Value| {
            let l = s["client_links"].as_array().map_or(0, |a| a.len());
            l == 2 && (0..2).all(|i| s["client_links"][i]["up"] == true)
        };
        for k in 1..=2 {
            self.wait(k, 10, "heartbeats on both client networks", client_links_up);
        }
        self.topo.set_sync_link(1, false);
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let a = self.status(1).unwrap();
            let b = self.status(2).unwrap();
            match (a["role"].as_str().unwrap(), b["role"].as_str().unwrap()) {
                ("solo", "down") => return (1, 2),
                ("down", "solo") => return (2, 1),
                _ => {}
            }
            assert!(Instant::now() < deadline, "no single survivor: {a} / {b}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn url(&self, k: u32, path: u32) -> String {
        format!(
            "iscsi://{}:{PORT}/{IQN}/0",
            self.topo.client_portal_addr(k, path)
        )
    }

    /// A short `freesan bench` run through node `k` (one path, or multipath over
    /// every path SendTargets lists): 2 threads x 4 in flight over 8 MiB.
    fn io(&self, k: u32, single_path: bool, bs: &str, rw: &str, secs: u32) -> (bool, String) {
        let url = self.url(k, 1);
        let secs = secs.to_string();
        let mut args = vec!["--target", &url, "--bs", bs, "--rw", rw, "--threads", "2"];
        args.extend(["--qd", "4", "--secs", &secs, "--ramp", "0", "--size", "8M"]);
        if single_path {
            args.push("--single-path");
        }
        self.bench(&args)
    }

    /// Starts verified writes through node `k`, multipath, shaped by
    /// `workload` (`freesan bench` options, space-separated: block size,
    /// threads, time...),
    /// and waits until they are under way (their verification state saved):
    /// the bench, its state file and its JSON report.
    fn start_verified_writes(&self, k: u32, workload: &str) -> (Child, PathBuf, PathBuf) {
        let state = self.dir.path().join("verify.state");
        let report = self.dir.path().join("bench.json");
        let mut bench = self
            .topo
            .command(self.topo.ns_client(), bin())
            .args(["bench", "--target", &self.url(k, 1)])
            .args(workload.split_whitespace())
            .args(["--ramp", "0", "--verify", "--quiet", "--verify-state"])
            .arg(&state)
            .arg("--json")
            .arg(&report)
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(self.dir.path().join("bench.log")).unwrap())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        while !state.exists() {
            assert!(
                Instant::now() < deadline,
                "bench wrote no verification state"
            );
            assert!(bench.try_wait().unwrap().is_none(), "bench exited early");
            std::thread::sleep(Duration::from_millis(20));
        }
        (bench, state, report)
    }

    /// Every write acknowledged to the verified run whose state is `state`
    /// reads back through node 1 and through node 2.
    fn check_through_both(&self, state: &Path) {
        for k in 1..=2 {
            let (ok, out) = self.bench(&[
                "check",
                "--target",
                &self.url(k, 1),
                "--single-path",
                "--verify-state",
                state.to_str().unwrap(),
            ]);
            assert!(ok, "check through node {k}: {out}");
        }
    }

    /// Runs `freesan bench ARGS` in the client namespace; (success, output).
    fn bench(&self, args: &[&str]) -> (bool, String) {
        let mut all = vec!["bench"];
        all.extend_from_slice(args);
        self.topo.run(self.topo.ns_client(), bin(), all)
    }

    fn checksums(&self) -> [String; 2] {
        self.checksums_of("lun0.img")
    }

    /// SHA-256 of file `name` in each node's directory.
    fn checksums_of(&self, name: &str) -> [String; 2] {
        [1, 2].map(|k| {
            let (ok, out) = common::run(
                "sha256sum",
                &[self.node_dir(k).join(name).to_str().unwrap()],
            );
            assert!(ok, "{out}");
            out.split_whitespace().next().unwrap().to_string()
        })
    }
}

fn max_latency_us(report: &Path) -> f64 {
    let v: Value = serde_json::from_str(&std::fs::read_to_string(report).unwrap()).unwrap();
    fn walk(v: &Value, best: &mut f64) {
        match v {
            Value::Object(m) => {
                for (k, x) in m {
                    if k == "max_us" {
                        *best = best.max(x.as_f64().unwrap_or(0.0));
                    }
                    walk(x, best);
                }
            }
            Value::Array(a) => a.iter().for_each(|x| walk(x, best)),
            _ => {}
        }
    }
    let mut best = 0.0;
    walk(&v, &mut best);
    best
}

#[test]
fn leader_killed_under_verified_writes_loses_nothing_and_resyncs_incrementally() {
    // node 1 (preferred) copied the brand-new LUN to node 2: it is the leader
    kill_under_verified_writes("hak", 1);
}

#[test]
fn follower_killed_under_verified_writes_loses_nothing_and_resyncs_incrementally() {
    kill_under_verified_writes("haf", 2);
}

/// The leader's disk stops answering: its LUN is a `[[disk]]` (2 s command
/// timeout) on an ext4 that is frozen under verified writes. The partner
/// holds a complete copy, so the disk is given up at its timeout rather
/// than waited for (`keep::UnderReplica`), the local copy is detached, and
/// the partner serves alone: no error reaches the workload. Thawed and
/// restarted, the node gets its copy back from the partner: the copies are
/// identical and every acknowledged write reads back through both nodes.
/// Waited for instead (the keeper saying wait), the writes stalled for ten
/// timeouts while the partner held a copy.
#[test]
fn a_leaders_disk_that_stops_answering_is_detached_and_the_partner_serves() {
    let disks = tempfile::tempdir().unwrap();
    let Some(mounted) = crate::stops_answering::Mounted::new(disks.path(), "frz") else {
        return crate::stops_answering::skipped();
    };
    let other = disks.path().join("n2");
    std::fs::create_dir(&other).unwrap();
    let dirs = [mounted.0.clone(), other];
    let Some(mut ha) = Ha::start_full("had", "active-active", 1, Some(dirs.clone())) else {
        return;
    };
    ha.wait_in_sync();
    assert_eq!(ha.status(1).unwrap()["role"], "leader");
    let (mut bench, state, report) = ha.start_verified_writes(
        1,
        "--bs 4k --rw randwrite --threads 2 --qd 8 --secs 10 --size 48M",
    );
    let frozen = crate::stops_answering::Frozen::freeze(&mounted.0);
    let down = ha.wait(1, 30, "its copy detached", |s| s["role"] == "down");
    let why = down["reason"].as_str().unwrap_or_default();
    assert!(
        why.contains("local copy failed") && why.contains("no answer in 2.0 s"),
        "{down}"
    );
    ha.wait(2, 10, "serving alone", |s| s["role"] == "solo");
    // given up at its first timeout, not waited for past it
    let (ok, out) = ha.topo.run(
        ha.topo.ns_node(1),
        bin(),
        ["disk", "--api", API, "list", "--json"],
    );
    assert!(ok, "{out}");
    let disks: Value = serde_json::from_str(&out).unwrap();
    let d0 = &disks[0];
    assert_eq!(d0["name"], "d0", "{disks}");
    assert!(!d0["stopped_answering"].is_null(), "{d0}");
    assert_eq!(d0["timeouts_waited"], 0, "{d0}");
    let st = bench.wait().unwrap();
    let log = std::fs::read_to_string(ha.dir.path().join("bench.log")).unwrap_or_default();
    assert!(st.success(), "the workload saw an error:\n{log}");
    eprintln!(
        "longest I/O over the disk's stall: {:.0} ms",
        max_latency_us(&report) / 1000.0
    );
    // thawed (its timed-out writes end) and restarted: the partner repairs
    // the detached copy
    drop(frozen);
    ha.kill9(1);
    ha.start_node(1);
    ha.wait_in_sync();
    let sums = dirs.map(|d| {
        let (ok, out) = common::run("sha256sum", &[d.join("d0.img").to_str().unwrap()]);
        assert!(ok, "{out}");
        out.split_whitespace().next().unwrap().to_string()
    });
    assert_eq!(sums[0], sums[1], "the copies differ after the resync");
    ha.check_through_both(&state);
}

fn kill_under_verified_writes(prefix: &str, victim: u32) {
    let survivor = 3 - victim;
    let Some(mut ha) = Ha::start(prefix) else {
        return;
    };
    ha.wait_in_sync();
    assert_eq!(ha.status(1).unwrap()["role"], "leader");
    let (mut bench, state, report) = ha.start_verified_writes(
        1,
        "--bs 4k --rw randwrite --threads 2 --qd 8 --secs 14 --size 64M",
    );
    // writes flow through all four paths; then the victim dies
    std::thread::sleep(Duration::from_secs(4));
    ha.kill9(victim);
    let s = ha.wait(survivor, 10, "serving alone", |s| s["state"] == "degraded");
    assert_eq!(s["role"], "solo");
    let st = bench.wait().unwrap();
    let log = std::fs::read_to_string(ha.dir.path().join("bench.log")).unwrap_or_default();
    assert!(st.success(), "the workload saw an error:\n{log}");
    let max_us = max_latency_us(&report);
    eprintln!(
        "longest I/O through the failover: {:.0} ms",
        max_us / 1000.0
    );
    // the figure the issue asks about (< 3 s) is printed above; on this shared
    // machine a pass/fail bound is only a hang detector
    assert!(max_us < 20e6, "an I/O hung for {max_us} us");
    // the victim returns: incremental resync of what was written alone
    let alone = ha.wait(survivor, 5, "status", |_| true);
    let written_alone = alone["dirty_regions"].as_u64().unwrap();
    assert!(written_alone > 0);
    let before = alone["resynced_bytes"].as_u64().unwrap();
    ha.start_node(victim);
    ha.wait_in_sync();
    let after = ha.status(survivor).unwrap();
    let moved = after["resynced_bytes"].as_u64().unwrap() - before;
    let region = after["region_bytes"].as_u64().unwrap();
    let size = after["size_bytes"].as_u64().unwrap();
    eprintln!(
        "resynced {moved} bytes of a {size}-byte LUN ({written_alone} regions of {region} written alone)"
    );
    assert!(
        moved <= written_alone * region && moved < size / 2,
        "resync moved {moved} bytes"
    );
    let [a, b] = ha.checksums();
    assert_eq!(a, b, "the copies differ after the resync");
    // every acknowledged write reads back, through either node
    ha.check_through_both(&state);
}

/// The web console of each node, in a real Chromium run in that node's
/// namespace: after the sync link is cut, one node's HA page shows it serving
/// alone and the other's shows it standing down.
#[test]
fn the_console_shows_one_node_standing_down_when_the_sync_link_is_cut() {
    if !crate::console::tools() {
        return;
    }
    let Some(ha) = Ha::start("hcon") else { return };
    let (solo, down) = ha.cut_the_sync_link();
    let shots = crate::console::repo().join("target/console-screenshots");
    for (k, expect, name) in [
        (solo, "solo", "ha-serving-alone"),
        (down, "down", "ha-standing-down"),
    ] {
        let token = crate::common::make_token(&ha.node_dir(k), "admin", "console");
        let input = serde_json::json!({
            "scenario": "ha",
            "urls": [format!("http://{CONSOLE}/")],
            "tokens": [token],
            "expect": [expect],
            "names": [name],
            "shots": shots,
        });
        let (ok, out) =
            crate::console::drive_with(ha.topo.command(ha.topo.ns_node(k), "node"), &input);
        assert!(ok, "node {k}'s console never showed {expect}:\n{out}");
        assert!(out.contains("ok: the HA page of"), "{out}");
    }
}

#[test]
fn cutting_the_sync_link_leaves_exactly_one_writer() {
    let Some(ha) = Ha::start("has") else { return };
    // one node goes on alone (it holds the witness grant), the other stops
    let (solo, down) = ha.cut_the_sync_link();
    // the stopped node knows the partner is alive: the sync link failed
    let s = ha.status(down).unwrap();
    assert!(
        s["reason"]
            .as_str()
            .unwrap()
            .contains("still answers on the client network"),
        "{s}"
    );
    let write = |k: u32| ha.io(k, true, "64k", "write", 1);
    let (ok, out) = write(solo);
    assert!(ok, "the survivor refused writes: {out}");
    let (ok, _) = write(down);
    assert!(!ok, "the stopped node accepted writes");
    // the CLI refuses to discard the serving copy; the stopped one may be
    // discarded (then it is copied in full when the link returns)
    let name = ha.status(solo).unwrap()["name"]
        .as_str()
        .unwrap()
        .to_string();
    let replica = |k: u32, verb: &str, confirm: &str| {
        ha.topo.run(
            ha.topo.ns_node(k),
            bin(),
            ["replica", verb, &name, confirm, "--api", API],
        )
    };
    let discard = |k: u32| replica(k, "discard", "--lose-this-nodes-writes");
    let keep = |k: u32| replica(k, "keep", "--this-copy-holds-the-data");
    let (ok, out) = discard(solo);
    assert!(!ok && out.contains("down"), "{out}");
    // nothing to keep: one copy serves, the other is consistent
    let (ok, out) = keep(solo);
    assert!(!ok && out.contains("down"), "{out}");
    let (ok, out) = keep(down);
    assert!(!ok && out.contains("consistent"), "{out}");
    let (ok, out) = discard(down);
    assert!(ok, "{out}");
    let before = ha.status(solo).unwrap()["resynced_bytes"].as_u64().unwrap();
    ha.topo.set_sync_link(1, true);
    ha.wait_in_sync();
    let [a, b] = ha.checksums();
    assert_eq!(a, b, "the copies differ after the link came back");
    let s = ha.status(solo).unwrap();
    assert_eq!(
        s["resynced_bytes"].as_u64().unwrap() - before,
        s["size_bytes"].as_u64().unwrap(),
        "the discarded copy is copied in full"
    );
}

#[test]
fn overlapping_writes_from_two_initiators_through_both_nodes_converge() {
    let Some(ha) = Ha::start("hao") else { return };
    ha.wait_in_sync();
    for run in 0..3 {
        let spawn = |k: u32| {
            ha.topo
                .command(ha.topo.ns_client(), bin())
                .args(["bench", "--target", &ha.url(k, 1), "--single-path"])
                .args([
                    "--bs",
                    "8k",
                    "--rw",
                    "randwrite",
                    "--threads",
                    "2",
                    "--qd",
                    "8",
                ])
                .args(["--secs", "3", "--ramp", "0", "--size", "1M", "--quiet"])
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()
                .unwrap()
        };
        // the same 1 MiB, hammered through node 1 and node 2 at once
        let mut a = spawn(1);
        let mut b = spawn(2);
        assert!(a.wait().unwrap().success() && b.wait().unwrap().success());
        let [x, y] = ha.checksums();
        assert_eq!(x, y, "run {run}: the copies differ");
    }
}

#[test]
fn active_passive_serves_through_the_leader_only_and_fails_over() {
    let Some(mut ha) = Ha::start_with("hap", "active-passive") else {
        return;
    };
    ha.wait_in_sync();
    let s2 = ha.status(2).unwrap();
    assert_eq!(s2["local_paths"], "standby");
    let read = |ha: &Ha, k: u32| ha.io(k, true, "64k", "read", 1);
    assert!(read(&ha, 1).0, "the active node refused I/O");
    assert!(!read(&ha, 2).0, "the standby node served I/O");
    // multipath over all four paths keeps going, on the active node's two
    let (ok, out) = ha.io(1, false, "64k", "randrw", 2);
    assert!(ok, "{out}");
    // the active node dies: the standby takes over
    ha.kill9(1);
    ha.wait(2, 10, "serving alone", |s| s["state"] == "degraded");
    assert!(read(&ha, 2).0, "the survivor does not serve");
}

#[test]
fn persistent_reservations_hold_across_both_nodes() {
    if !common::have("iscsi-test-cu") {
        return;
    }
    let Some(ha) = Ha::start("hpr") else {
        return;
    };
    ha.wait_in_sync();
    // libiscsi's tests with the first initiator on node `first` and the second
    // on the other; CUnit's summary counts (tests total, ran, passed, failed,
    // inactive: the output also logs commands that fail on purpose)
    let cu = |tests: &str, first: u32| {
        let (ok, out) = ha.topo.run(
            ha.topo.ns_client(),
            "iscsi-test-cu",
            [
                "--dataloss",
                tests,
                &ha.url(first, 1),
                &ha.url(3 - first, 1),
            ],
        );
        eprintln!("{out}");
        let counts: Vec<u32> = (out.lines())
            .find_map(|l| l.trim().strip_prefix("tests "))
            .map(|rest| {
                rest.split_whitespace()
                    .filter_map(|n| n.parse().ok())
                    .collect()
            })
            .unwrap_or_default();
        let passed = ok && counts.len() == 5 && counts[2] == counts[1] && counts[3] == 0;
        (passed, counts.get(1).copied().unwrap_or(0), out)
    };
    // a persistent reservation taken through one node is enforced through
    // the other
    let (passed, ran, out) = cu("--test=SCSI.Pr[io]*", 1);
    assert!(ran >= 10, "too few PR tests ran ({ran}):\n{out}");
    assert!(passed, "PR tests failed across the nodes:\n{out}");
    // SPC-2 RESERVE(6) the same way: taken through one node, refused to the
    // second initiator through the other, and released on both by the
    // holder's logout, its I_T nexus loss, a LOGICAL UNIT RESET and target
    // resets; the holder first on node 1 (the leader), then on node 2 (whose
    // ends of the reservation go to the leader)
    for first in [1, 2] {
        let (passed, ran, out) = cu("--test=SCSI.Reserve6*", first);
        assert!(ran >= 5, "too few RESERVE(6) tests ran ({ran}):\n{out}");
        assert!(
            passed,
            "RESERVE(6) tests failed, holder on node {first}:\n{out}"
        );
        assert!(
            !out.contains("[SKIPPED]"),
            "RESERVE(6) tests skipped:\n{out}"
        );
    }
    // a LOGICAL UNIT RESET through either path (node) raises its unit
    // attention on both paths: the test resets through each in turn and
    // looks for it on every path
    let (passed, ran, out) = cu("--test=SCSI.MultipathIO.Reset", 1);
    assert!(
        ran >= 1 && !out.contains("[SKIPPED]"),
        "the multipath reset test did not run:\n{out}"
    );
    assert!(
        passed,
        "a reset through one node was not seen through the other:\n{out}"
    );
}

#[test]
fn a_second_sync_link_carries_on_when_the_first_is_cut() {
    let Some(ha) = Ha::start_opts("ha2", "active-active", 2) else {
        return;
    };
    ha.wait_in_sync();
    for k in 1..=2 {
        ha.wait(k, 10, "both sync links answering heartbeats", |s| {
            s["sync_links"][0]["up"] == true && s["sync_links"][1]["up"] == true
        });
    }
    // which link carries the replication now (node 1 dials node 2's address)
    let on_link = |s: &Value, k: u32, l: u32| {
        s["peer"]
            .as_str()
            .is_some_and(|p| p.starts_with(&format!("{}:", ha.topo.sync_addr(3 - k, l))))
    };
    let s1 = ha.status(1).unwrap();
    let used = if on_link(&s1, 1, 1) { 1 } else { 2 };
    assert!(on_link(&s1, 1, used), "{s1}");
    let other = 3 - used;
    ha.topo.set_sync_link(used, false);
    // the pair reconnects over the other link and is in sync again, nobody stays down
    for k in 1..=2 {
        ha.wait(k, 30, "in sync over the other link", |s| {
            s["state"] == "in-sync" && on_link(s, k, other)
        });
    }
    // the heartbeats on every sync link see the cut link down and the other up
    let (cut, kept) = ((used - 1) as usize, (other - 1) as usize);
    for k in 1..=2 {
        ha.wait(k, 10, "cut link seen down, the other up", |s| {
            s["sync_links"][cut]["up"] == false && s["sync_links"][kept]["up"] == true
        });
    }
    let (ok, out) = ha.io(1, false, "64k", "randwrite", 2);
    assert!(ok, "{out}");
    let [a, b] = ha.checksums();
    assert_eq!(a, b);
    // a client-facing link cut is seen by both nodes' heartbeats there
    ha.topo.set_client_link(2, 2, false);
    for k in 1..=2 {
        ha.wait(k, 10, "client network 2 down, 1 up", |s| {
            s["client_links"][0]["up"] == true && s["client_links"][1]["up"] == false
        });
    }
}

#[test]
fn a_replicated_lun_created_at_run_time_syncs_and_serves_through_both_nodes() {
    let Some(ha) = Ha::start("hal") else { return };
    ha.wait_in_sync();
    let cli = |k: u32, args: &[&str]| {
        let mut all = vec![args[0], "--api", API];
        all.extend_from_slice(&args[1..]);
        let (ok, out) = ha.topo.run(ha.topo.ns_node(k), bin(), all);
        assert!(ok, "node {k}: freesan {args:?}: {out}");
        out
    };
    let create = |k: u32| {
        let file = ha.node_dir(k).join("lun1.img");
        cli(
            k,
            &[
                "lun",
                "create",
                "--target",
                IQN,
                "--lun",
                "1",
                "--file",
                file.to_str().unwrap(),
                "--size",
                "32M",
                "--replicated",
            ],
        )
    };
    let url1 = |k: u32| {
        format!(
            "iscsi://{}:{PORT}/{IQN}/1",
            ha.topo.client_portal_addr(k, 1)
        )
    };
    // one second of writes to LUN 1 through node `k`, one path
    let write1 = |k: u32, bs: &str, rw: &str| {
        let url = url1(k);
        ha.bench(&[
            "--target",
            &url,
            "--single-path",
            "--bs",
            bs,
            "--rw",
            rw,
            "--threads",
            "1",
            "--qd",
            "4",
            "--secs",
            "1",
            "--ramp",
            "0",
            "--size",
            "4M",
        ])
    };
    // node 1 first: the partner does not know the LUN yet, so node 1 serves it
    // alone (the witness grants LUN 1 its own survivor grant) and tracks changes
    let out = create(1);
    assert!(out.contains("replicated"), "{out}");
    ha.wait_lun(1, 1, 30, "LUN 1 serving alone", |s| {
        s["state"] == "degraded"
    });
    let (ok, out) = write1(1, "256k", "write");
    assert!(ok, "writes to LUN 1 through node 1: {out}");
    // LUN 0's paths never depended on LUN 1 (ALUA states are per LUN)
    assert_eq!(ha.status(2).unwrap()["state"], "in-sync");
    let (ok, out) = ha.io(2, true, "4k", "randwrite", 1);
    assert!(
        ok,
        "LUN 0 through node 2 while LUN 1 is alone on node 1: {out}"
    );

    // node 2 creates it too: a brand-new copy, filled in full, then both serve
    create(2);
    for k in 1..=2 {
        ha.wait_lun(k, 1, 60, "LUN 1 in sync", |s| s["state"] == "in-sync");
    }
    let list = cli(2, &["lun", "list"]);
    assert!(
        list.contains("LUN 1") && list.contains("replicated"),
        "{list}"
    );
    // overlapping writes over all four paths of both nodes
    let (ok, out) = ha.bench(&[
        "--target",
        &url1(2),
        "--bs",
        "8k",
        "--rw",
        "randwrite",
        "--threads",
        "2",
        "--qd",
        "8",
        "--secs",
        "2",
        "--ramp",
        "0",
        "--size",
        "8M",
    ]);
    assert!(ok, "multipath writes to LUN 1: {out}");
    let [a, b] = ha.checksums_of("lun1.img");
    assert_eq!(a, b, "the two copies of the LUN created at run time differ");

    // deleting it on node 2 leaves node 1 serving it alone
    cli(2, &["lun", "delete", "--target", IQN, "--lun", "1"]);
    ha.wait_lun(1, 1, 30, "LUN 1 alone again", |s| s["state"] == "degraded");
    assert!(
        ha.status_lun(2, 1).is_none(),
        "node 2 still replicates LUN 1"
    );
    let (ok, out) = write1(1, "4k", "randwrite");
    assert!(ok, "LUN 1 through node 1 after node 2 deleted it: {out}");
    assert_eq!(ha.status(1).unwrap()["state"], "in-sync", "LUN 0 untouched");
}

#[test]
fn a_replicated_lun_grows_on_both_nodes_while_verified_writes_run() {
    let Some(ha) = Ha::start("hag") else { return };
    ha.wait_in_sync();
    let workload = "--bs 16k --rw randwrite --threads 2 --qd 4 --secs 4";
    let (mut bench, state, _) = ha.start_verified_writes(2, workload);
    // grown through node 1's API while the writes run through every path
    let (ok, out) = ha.topo.run(
        ha.topo.ns_node(1),
        bin(),
        [
            "lun", "resize", "--api", API, "--target", IQN, "--lun", "0", "--size", "320M",
        ],
    );
    assert!(ok && out.contains("grown"), "{out}");
    let st = bench.wait().unwrap();
    let log = std::fs::read_to_string(ha.dir.path().join("bench.log")).unwrap_or_default();
    assert!(
        st.success(),
        "the workload saw an error across the resize:\n{log}"
    );
    let grown = 320u64 << 20;
    for k in 1..=2 {
        ha.wait(k, 10, "the new size", |s| s["size_bytes"] == grown);
        // (a link judged failed under the load of the whole suite resyncs the
        // pair: in sync once that ends)
        ha.wait(k, 60, "in sync", |s| s["state"] == "in-sync");
        let file = std::fs::metadata(ha.node_dir(k).join("lun0.img")).unwrap();
        assert_eq!(file.len(), grown, "node {k}'s copy");
    }
    ha.check_through_both(&state);
    // a verified run over the whole grown LUN through node 2, new space included
    let state2 = ha.dir.path().join("verify2.state");
    let (ok, out) = ha.bench(&[
        "--target",
        &ha.url(2, 1),
        "--bs",
        "64k",
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
        state2.to_str().unwrap(),
    ]);
    assert!(ok, "{out}");
    ha.check_through_both(&state2);
    for k in 1..=2 {
        let tail = &std::fs::read(ha.node_dir(k).join("lun0.img")).unwrap()[256 << 20..];
        assert!(
            tail.iter().any(|&b| b != 0),
            "node {k}: nothing was written in the new space"
        );
    }
    let [a, b] = ha.checksums();
    assert_eq!(a, b, "the two copies differ after the resize");
}
