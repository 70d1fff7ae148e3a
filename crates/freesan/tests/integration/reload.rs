//! Configuration reload while the node serves: SIGHUP adds a target with CHAP,
//! `freesan reload` (POST /api/v1/reload) changes that target's CHAP secret, and a
//! session of another target doing verified writes all along sees no error and
//! every block it had acknowledged reads back.

use crate::common;

use common::*;
use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

const IQN_B: &str = "iqn.2026-11.org.freesan:itest-b";
const INITIATOR: &str = "iqn.2026-11.org.freesan:reload-test";

fn config(dir: &Path, b_secret: Option<&str>, a_size: &str) -> String {
    let d = dir.display();
    let mut s = format!(
        "data_dir = \"{d}/data\"\n[api]\naddress = \"127.0.0.1:0\"\n[nbd]\naddress = \"127.0.0.1:0\"\n\
         [[portal]]\naddress = \"127.0.0.1:0\"\n\
         [[target]]\niqn = \"{IQN}\"\nchap = {{ user = \"alice\", secret = \"secret-of-alice\" }}\n\
         [[target.lun]]\npath = \"{d}/lun0.img\"\nsize = \"{a_size}\"\n"
    );
    if let Some(secret) = b_secret {
        s += &format!(
            "[[target]]\niqn = \"{IQN_B}\"\nchap = {{ user = \"bob\", secret = \"{secret}\" }}\n\
             [[target.lun]]\npath = \"{d}/lunb.img\"\nsize = \"8M\"\n"
        );
    }
    s
}

/// Logs in to target B with `secret`; Ok once in full feature phase.
fn login_b(rt: &tokio::runtime::Runtime, portal: SocketAddr, secret: &str) -> Result<(), String> {
    let mut opts = initiator::LoginOptions::new(INITIATOR, IQN_B);
    opts.chap = Some(("bob".into(), secret.into()));
    rt.block_on(async {
        let s = initiator::Session::login(portal, &opts)
            .await
            .map_err(|e| e.to_string())?;
        drop(s);
        Ok(())
    })
}

/// The targets SendTargets=All lists.
fn discovered(rt: &tokio::runtime::Runtime, portal: SocketAddr) -> Vec<String> {
    rt.block_on(initiator::discover(portal, INITIATOR, None))
        .map(|ts| ts.into_iter().map(|t| t.0).collect())
        .unwrap_or_default()
}

/// The verified writer `bench` to `url` was still running when the reloads
/// were done (else the test proves nothing), ends without an error, and every
/// block it had acknowledged reads back.
fn ran_through(mut bench: std::process::Child, url: &str, state: &Path, what: &str) {
    assert!(
        bench.try_wait().unwrap().is_none(),
        "the verified writes ended before the reloads were done; the test proves nothing"
    );
    let status = bench.wait().unwrap();
    assert!(status.success(), "verified writes {what} failed: {status}");
    assert_acknowledged_writes_intact(url, state, what);
}

#[test]
fn reload_adds_a_target_and_changes_chap_without_dropping_sessions() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("node.toml");
    std::fs::write(&cfg, config(dir.path(), None, "16M")).unwrap();
    let mut node = start_config(dir.path(), &cfg);
    let api = node.api.clone().expect("api");
    let portal: SocketAddr = node.portals[0].parse().unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    assert_eq!(discovered(&rt, portal), vec![IQN.to_string()]);

    // an unrelated session: verified random writes to target A for the whole test
    let url_a = format!("iscsi://alice%secret-of-alice@{portal}/{IQN}/0");
    let state = dir.path().join("verify.state");
    let bench = start_verified_writes(&url_a, &state, "4k", 1, 30);

    // 1. SIGHUP: target B appears, loginable with its CHAP, refusing another secret
    std::fs::write(&cfg, config(dir.path(), Some("secret-of-bob-1"), "16M")).unwrap();
    let pid = node.child.as_ref().unwrap().id() as i32;
    // SAFETY: a signal to the child this test started
    assert_eq!(unsafe { libc::kill(pid, libc::SIGHUP) }, 0);
    let deadline = Instant::now() + Duration::from_secs(30);
    while !discovered(&rt, portal).iter().any(|t| t == IQN_B) {
        assert!(
            Instant::now() < deadline,
            "target B never appeared after SIGHUP; log: {}",
            std::fs::read_to_string(&node.log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    login_b(&rt, portal, "secret-of-bob-1").expect("login to the added target with its CHAP");
    // the added target is the node's like the others: listed, exported over
    // NBD, and its LUNs managed through the API
    let (ok, out) = cli(&api, &["status", "--json"]);
    assert!(ok, "{out}");
    let st: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert!(
        st["luns"]
            .as_array()
            .unwrap()
            .iter()
            .any(|l| l["target"] == IQN_B && l["lun"] == 0),
        "status does not list the added target's LUN: {st}"
    );
    let nbd_addr = node.nbd.clone().expect("nbd address");
    let c = rt
        .block_on(nbd::NbdClient::connect(&nbd_addr, &format!("{IQN_B}/lun0")))
        .expect("the added target's LUN is an NBD export");
    assert_eq!(c.export_size_bytes(), 8 << 20);
    drop(c);
    let f = dir.path().join("data").join("lunb1.img");
    let (ok, out) = cli(
        &api,
        &[
            "lun",
            "create",
            "--target",
            IQN_B,
            "--lun",
            "1",
            "--file",
            f.to_str().unwrap(),
            "--size",
            "8M",
        ],
    );
    assert!(ok, "freesan lun create on the added target: {out}");
    assert!(
        login_b(&rt, portal, "secret-of-bob-2").is_err(),
        "target B accepted a secret it was not given"
    );

    // 2. the API: B's CHAP secret changes; A's LUN size change is refused (needs a restart)
    std::fs::write(&cfg, config(dir.path(), Some("secret-of-bob-2"), "32M")).unwrap();
    let (ok, out) = cli(&api, &["reload", "--json"]);
    assert!(ok, "freesan reload: {out}");
    let report: serde_json::Value = serde_json::from_str(&out).expect("reload answers JSON");
    let has = |k: &str, needle: &str| {
        report[k].as_array().is_some_and(|a| {
            a.iter()
                .any(|s| s.as_str().is_some_and(|s| s.contains(needle)))
        })
    };
    assert!(
        has("applied", &format!("target {IQN_B}: CHAP changed")),
        "{report}"
    );
    assert!(
        has("not_applied", &format!("target {IQN}: LUN changes")),
        "{report}"
    );
    // the LUN created through the API on B is not a change the file asks for
    assert!(
        !has("not_applied", &format!("target {IQN_B}: LUN")),
        "{report}"
    );
    login_b(&rt, portal, "secret-of-bob-2").expect("login with the new CHAP secret");
    assert!(
        login_b(&rt, portal, "secret-of-bob-1").is_err(),
        "target B still accepts its old CHAP secret"
    );

    // the unrelated session ran through both reloads without an error
    ran_through(bench, &url_a, &state, "after two reloads");
    let log = std::fs::read_to_string(&node.log).unwrap_or_default();
    assert!(log.contains("SIGHUP: reloading"), "{log}");
    assert!(node.terminate(), "the node did not stop cleanly");
}

fn portals_config(dir: &Path, portals: &[SocketAddr]) -> String {
    let d = dir.display();
    let mut s = format!("data_dir = \"{d}/data\"\n[api]\naddress = \"127.0.0.1:0\"\n");
    for p in portals {
        s += &format!("[[portal]]\naddress = \"{p}\"\n");
    }
    s += &format!(
        "[[target]]\niqn = \"{IQN}\"\n[[target.lun]]\npath = \"{d}/lun0.img\"\nsize = \"16M\"\n"
    );
    s
}

/// `freesan reload --json`: the report.
fn reload(api: &str) -> serde_json::Value {
    let (ok, out) = cli(api, &["reload", "--json"]);
    assert!(ok, "freesan reload: {out}");
    serde_json::from_str(&out).expect("reload answers JSON")
}

/// The relative port ids of REPORT TARGET PORT GROUPS' groups, through `s`
/// (past the unit attentions a new nexus meets first).
async fn rtpg_ports(s: &initiator::Session) -> Vec<u16> {
    let cdb = [0xa3, 0x0a, 0, 0, 0, 0, 0, 0, 4, 0, 0, 0];
    for _ in 0..8 {
        let r = s
            .command(0, &cdb, bytes::Bytes::new(), 1024)
            .await
            .expect("REPORT TARGET PORT GROUPS");
        if r.status == 2 {
            continue;
        }
        let d = &r.data_in;
        let mut ports = Vec::new();
        let mut off = 4;
        while off + 8 <= d.len() {
            let n = d[off + 7] as usize;
            for i in 0..n {
                let p = off + 8 + 4 * i;
                ports.push(u16::from_be_bytes([d[p + 2], d[p + 3]]));
            }
            off += 8 + 4 * n;
        }
        return ports;
    }
    panic!("unit attentions without end");
}

/// A portal added by a reload is bound, discoverable, loginable and in the
/// target's ALUA port group; removing it closes the session that came through
/// it and refuses new connections, while a session on the portal that stays
/// does verified writes through both reloads without an error.
#[test]
fn reload_adds_and_removes_a_portal_without_dropping_other_sessions() {
    let dir = tempfile::tempdir().unwrap();
    let a: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let b: SocketAddr = format!("127.0.0.2:{}", free_port()).parse().unwrap();
    let cfg = dir.path().join("node.toml");
    std::fs::write(&cfg, portals_config(dir.path(), &[a])).unwrap();
    let mut node = start_config(dir.path(), &cfg);
    let api = node.api.clone().expect("api");
    let rt = tokio::runtime::Runtime::new().unwrap();
    assert!(
        std::net::TcpStream::connect(b).is_err(),
        "something already listens on {b}"
    );

    let url_a = format!("iscsi://{a}/{IQN}/0");
    let state = dir.path().join("verify.state");
    let bench = start_verified_writes(&url_a, &state, "4k", 1, 30);

    // 1. portal B added
    std::fs::write(&cfg, portals_config(dir.path(), &[a, b])).unwrap();
    let report = reload(&api);
    let applied = report["applied"].to_string();
    assert!(
        applied.contains(&format!("portal {b} added (TPGT 2)")),
        "{report}"
    );
    assert_eq!(report["not_applied"], serde_json::json!([]), "{report}");
    let found = rt
        .block_on(initiator::discover(a, INITIATOR, None))
        .expect("discovery through A");
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].1, vec![(a, 1), (b, 2)], "SendTargets lists both");
    let opts = initiator::LoginOptions::new(INITIATOR, IQN);
    let on_b = rt
        .block_on(initiator::Session::login(b, &opts))
        .expect("login through the added portal");
    assert_eq!(rt.block_on(rtpg_ports(&on_b)), vec![1, 2]);
    let (ok, out) = cli(&api, &["status", "--json"]);
    assert!(ok && out.contains(&b.to_string()), "status: {out}");

    // a portal whose address cannot be bound refuses the whole reload: the
    // portals, and B's session, stay as they were
    let busy = std::net::TcpListener::bind("127.0.0.3:0").unwrap();
    let c = busy.local_addr().unwrap();
    std::fs::write(&cfg, portals_config(dir.path(), &[a, b, c])).unwrap();
    let (ok, out) = cli(&api, &["reload", "--json"]);
    assert!(!ok, "a reload with an unbindable portal was applied: {out}");
    let found = rt
        .block_on(initiator::discover(a, INITIATOR, None))
        .expect("discovery through A");
    assert_eq!(found[0].1, vec![(a, 1), (b, 2)], "portals changed: {out}");
    assert_eq!(rt.block_on(rtpg_ports(&on_b)), vec![1, 2]);
    drop(busy);

    // 2. portal B removed: its session closes, it accepts nothing more
    std::fs::write(&cfg, portals_config(dir.path(), &[a])).unwrap();
    let report = reload(&api);
    let applied = report["applied"].to_string();
    assert!(
        applied.contains(&format!("portal {b} removed (TPGT 2)")),
        "{report}"
    );
    assert!(
        applied.contains("1 session(s) through removed portals closed"),
        "{report}"
    );
    assert!(
        std::net::TcpStream::connect(b).is_err(),
        "the removed portal still accepts connections"
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    while !on_b.is_closed() {
        assert!(
            Instant::now() < deadline,
            "the session through B stays open"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let on_a = rt
        .block_on(initiator::Session::login(a, &opts))
        .expect("login through A");
    assert_eq!(rt.block_on(rtpg_ports(&on_a)), vec![1]);
    let _ = rt.block_on(on_a.logout());

    // the session on A ran through both reloads without an error
    ran_through(bench, &url_a, &state, "after adding and removing a portal");
    assert!(node.terminate(), "the node did not stop cleanly");
}

/// Config with target A on lun0.img, a free disk d3, and `more` appended.
fn claims_config(dir: &Path, more: &str) -> String {
    let d = dir.display();
    format!(
        "data_dir = \"{d}/data\"\n[api]\naddress = \"127.0.0.1:0\"\n\
         [[portal]]\naddress = \"127.0.0.1:0\"\n\
         [[disk]]\nname = \"d3\"\npath = \"{d}/d3.img\"\nsize = \"8M\"\n\
         [[target]]\niqn = \"{IQN}\"\n[[target.lun]]\npath = \"{d}/lun0.img\"\nsize = \"16M\"\n{more}"
    )
}

/// A reload never opens what a running target serves (two LUNs over the same
/// blocks, each with its own locks and identity), not even when the file no
/// longer lists that target; and a reload refused half-way takes nothing with
/// it: the disk its first new target took is free for the next try.
#[test]
fn a_reload_neither_opens_a_served_file_twice_nor_keeps_what_a_refused_one_took() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().display().to_string();
    let cfg = dir.path().join("node.toml");
    std::fs::write(&cfg, claims_config(dir.path(), "")).unwrap();
    let mut node = start_config(dir.path(), &cfg);
    let api = node.api.clone().expect("api");

    // target A renamed in the file: A keeps serving lun0.img, so the "new"
    // target may not open it too
    let renamed = claims_config(dir.path(), "").replace(
        &format!("iqn = \"{IQN}\""),
        "iqn = \"iqn.2026-11.org.freesan:renamed\"",
    );
    std::fs::write(&cfg, renamed).unwrap();
    let (ok, out) = cli(&api, &["reload", "--json"]);
    assert!(!ok, "a reload opened lun0.img a second time: {out}");
    assert!(out.contains("serves both"), "{out}");

    // X takes disk d3, Y cannot be opened (its "file" is a folder): refused
    let x = "[[target]]\niqn = \"iqn.2026-11.org.freesan:x\"\n[[target.lun]]\ndisk = \"d3\"\n";
    let y = |dir: &str| {
        format!("[[target]]\niqn = \"iqn.2026-11.org.freesan:y\"\n[[target.lun]]\npath = \"{dir}/y.img\"\nsize = \"8M\"\n")
    };
    std::fs::create_dir_all(dir.path().join("adir/y.img")).unwrap();
    let bad = claims_config(dir.path(), &format!("{x}{}", y(&format!("{d}/adir"))));
    std::fs::write(&cfg, bad).unwrap();
    let (ok, out) = cli(&api, &["reload", "--json"]);
    assert!(
        !ok,
        "the reload with target y unopenable went through: {out}"
    );
    // fixed, the same targets come up: d3 went back to the free disks
    std::fs::write(&cfg, claims_config(dir.path(), &format!("{x}{}", y(&d)))).unwrap();
    let report = reload(&api);
    let applied = report["applied"].to_string();
    assert!(
        applied.contains("iqn.2026-11.org.freesan:x added")
            && applied.contains("iqn.2026-11.org.freesan:y added"),
        "{report}"
    );
    assert!(node.terminate(), "the node did not stop cleanly");
}

/// Disks and a pool created through the API are what runs, not a change of
/// the file: a reload of the unchanged file reports nothing not applied.
/// Before, the reload compared the file with what ran at the start and said
/// "disks changed" and "pools changed: needs a restart" after every creation.
#[test]
fn a_reload_after_objects_created_at_run_time_reports_no_change() {
    let dir = tempfile::tempdir().unwrap();
    let a: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let cfg = dir.path().join("node.toml");
    std::fs::write(&cfg, portals_config(dir.path(), &[a])).unwrap();
    let node = start_config(dir.path(), &cfg);
    let api = node.api.clone().expect("api");
    for d in ["d0", "d1", "d2"] {
        let (ok, out) = cli(&api, &["disk", "create", d, "--size", "64M"]);
        assert!(ok, "{out}");
    }
    let (ok, out) = cli(
        &api,
        &[
            "pool", "create", "p", "--level", "raid5", "--member", "d0,d1,d2", "--chunk", "16K",
        ],
    );
    assert!(ok, "{out}");
    let report = reload(&api);
    assert_eq!(report["not_applied"], serde_json::json!([]), "{report}");
}
