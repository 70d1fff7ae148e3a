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
        "data_dir = \"{d}/data\"\n[api]\naddress = \"127.0.0.1:0\"\n[[portal]]\naddress = \"127.0.0.1:0\"\n\
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
    let mut bench = start_verified_writes(&url_a, &state, "4k", 1, 30);

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
    login_b(&rt, portal, "secret-of-bob-2").expect("login with the new CHAP secret");
    assert!(
        login_b(&rt, portal, "secret-of-bob-1").is_err(),
        "target B still accepts its old CHAP secret"
    );

    // the unrelated session ran through both reloads without an error
    assert!(
        bench.try_wait().unwrap().is_none(),
        "the verified writes ended before the reloads were done; the test proves nothing"
    );
    let status = bench.wait().unwrap();
    assert!(
        status.success(),
        "verified writes to target A failed: {status}"
    );
    assert_acknowledged_writes_intact(&url_a, &state, "after two reloads");
    let log = std::fs::read_to_string(&node.log).unwrap_or_default();
    assert!(log.contains("SIGHUP: reloading"), "{log}");
    assert!(node.terminate(), "the node did not stop cleanly");
}
