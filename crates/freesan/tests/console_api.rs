//! The management API routes the web console reads, against real `freesan serve`
//! processes with real iSCSI I/O:
//! - `GET /api/v1/history` shows the read rate of the LUN, of the path
//!   (initiator@portal), of the portal and of the node after `freesan bench`
//!   read the LUN;
//! - a benchmark job started with `POST /api/v1/bench` runs to done with IOPS,
//!   and a second start while it runs is refused (409);
//! - `GET /api/v1/disks` lists a free disk as free and the pool's members with
//!   their pool, state and a latency once they did I/O;
//! - CHAP and the allowed initiators set with `POST /api/v1/targets/{name}/chap`
//!   and `/acl` decide the next logins (made with the project's initiator), are
//!   shown by `GET /api/v1/targets` without the secret, and survive a restart.

mod common;
use common::*;
use serde_json::Value;
use std::path::Path;
use std::time::{Duration, Instant};

fn get(api: &str, auth: &str, path: &str) -> Value {
    let (code, body) = http(api, "GET", path, &[auth], "");
    assert_eq!(code, 200, "GET {path}: {body}");
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("GET {path}: {e}: {body}"))
}

fn post(api: &str, auth: &str, path: &str, body: &str) -> (u16, String) {
    http(
        api,
        "POST",
        path,
        &[auth, "Content-Type: application/json"],
        body,
    )
}

/// Polls `GET path` until `ok` holds for its answer, for at most `secs`.
fn await_get(api: &str, auth: &str, path: &str, secs: u64, ok: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        let v = get(api, auth, path);
        if ok(&v) {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "GET {path} never answered as expected in {secs} s; last: {v}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn any_sample(series: &Value, f: impl Fn(&Value) -> bool) -> bool {
    series.as_array().is_some_and(|a| a.iter().any(f))
}

fn admin(dir: &Path) -> String {
    let t = std::fs::read_to_string(dir.join("data/api/cli-token")).unwrap();
    format!("Authorization: Bearer {}", t.trim())
}

#[test]
fn history_bench_jobs_and_disks_show_real_io() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = config_head(dir.path(), 3);
    s += "[[pool]]\nname = \"p\"\nlevel = \"raid1\"\nmembers = [\"d0\", \"d1\"]\n";
    s += &format!("[[target]]\niqn = \"{IQN}\"\n[[target.lun]]\npool = \"p\"\n");
    let cfg = dir.path().join("node.toml");
    std::fs::write(&cfg, s).unwrap();
    let node = start_config(dir.path(), &cfg);
    let api = node.api.clone().expect("no API address in the banner");
    let auth = admin(dir.path());
    let portal = node.portals[0].clone();

    // the window is bounded
    for bad in ["0", "3601", "x"] {
        let (code, body) = http(
            &api,
            "GET",
            &format!("/api/v1/history?window={bad}"),
            &[&auth],
            "",
        );
        assert_eq!(code, 400, "window={bad}: {body}");
    }

    // an outside initiator reads the LUN
    let (ok, out) = freesan(&[
        "bench",
        "--target",
        &node.url(0, 0),
        "--single-path",
        "--rw",
        "randread",
        "--secs",
        "2",
        "--ramp",
        "0",
        "--quiet",
    ]);
    assert!(ok, "freesan bench: {out}");
    let lun = format!("{IQN}/0");
    let path = format!("iqn.2026-01.org.freesan:initiator@{portal}");
    let reads = |s: &Value| s["read_iops"].as_f64().unwrap_or(0.0) > 0.0;
    let h = await_get(&api, &auth, "/api/v1/history?window=120", 30, |h| {
        any_sample(&h["luns"][&lun], reads) && any_sample(&h["paths"][&path], reads)
    });
    assert_eq!(h["interval_s"], 1);
    assert!(any_sample(&h["node"], reads), "node: {}", h["node"]);
    assert!(
        any_sample(&h["portals"][&portal], reads),
        "portals: {}",
        h["portals"]
    );
    assert!(
        any_sample(&h["luns"][&lun], |s| reads(s)
            && s["latency_us"].as_f64().unwrap() > 0.0
            && s["read_mbs"].as_f64().unwrap() > 0.0),
        "{}",
        h["luns"][&lun]
    );
    let node_series = h["node"].as_array().unwrap();
    assert!(
        node_series
            .windows(2)
            .all(|w| w[0]["t"].as_u64() < w[1]["t"].as_u64()),
        "not oldest first: {}",
        h["node"]
    );
    assert!(
        node_series.len() <= 121,
        "{} samples in 120 s",
        node_series.len()
    );

    // disks: the free one, and the members with the latency of that I/O
    let disks = get(&api, &auth, "/api/v1/disks");
    let by_name = |n: &str| {
        disks
            .as_array()
            .unwrap()
            .iter()
            .find(|d| d["name"] == n)
            .cloned()
            .unwrap_or_else(|| panic!("disk {n} not listed: {disks}"))
    };
    let d2 = by_name("d2");
    assert_eq!(d2["role"], "free", "{d2}");
    assert_eq!(d2["pool"], Value::Null, "{d2}");
    assert_eq!(d2["size_bytes"], 64 << 20, "{d2}");
    let members = [by_name("d0"), by_name("d1")];
    for m in &members {
        assert_eq!(m["role"], "member", "{m}");
        assert_eq!(m["pool"], "p", "{m}");
        assert_eq!(m["state"], "active", "{m}");
        assert_eq!(m["errors"], 0, "{m}");
        assert_eq!(m["model"], "file", "{m}");
        // the pool wrote its superblocks to every member
        assert!(m["write_latency_us"].as_f64().unwrap() > 0.0, "{m}");
    }
    assert!(
        members
            .iter()
            .any(|m| m["reads"].as_u64().unwrap() > 0
                && m["read_latency_us"].as_f64().unwrap() > 0.0),
        "no member shows the reads: {members:?}"
    );

    // bench jobs
    let b = get(&api, &auth, "/api/v1/bench");
    let patterns: Vec<&str> = b["patterns"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(patterns.contains(&"4k-randread"), "{b}");
    assert!(patterns.contains(&"64k-seqwrite"), "{b}");
    for (body, want) in [
        (format!("{{\"target\":\"{IQN}\",\"lun\":0,\"pattern\":\"no-such\",\"secs\":1}}"), 400),
        (format!("{{\"target\":\"{IQN}\",\"lun\":0,\"pattern\":\"4k-randread\",\"secs\":0}}"), 400),
        (format!("{{\"target\":\"{IQN}\",\"lun\":0,\"pattern\":\"4k-randread\",\"secs\":61}}"), 400),
        // a writing pattern overwrites the LUN: only when asked to
        (format!("{{\"target\":\"{IQN}\",\"lun\":0,\"pattern\":\"4k-randwrite\",\"secs\":1}}"), 400),
        ("{\"target\":\"iqn.2026-11.org.freesan:none\",\"lun\":0,\"pattern\":\"4k-randread\",\"secs\":1}".to_string(), 404),
        (format!("{{\"target\":\"{IQN}\",\"lun\":9,\"pattern\":\"4k-randread\",\"secs\":1}}"), 404),
    ] {
        let (code, answer) = post(&api, &auth, "/api/v1/bench", &body);
        assert_eq!(code, want, "{body}: {answer}");
    }
    let start =
        format!("{{\"target\":\"{IQN}\",\"lun\":0,\"pattern\":\"4k-randread\",\"secs\":3}}");
    let (code, answer) = post(&api, &auth, "/api/v1/bench", &start);
    assert_eq!(code, 202, "{answer}");
    let id = serde_json::from_str::<Value>(&answer).unwrap()["id"]
        .as_u64()
        .expect("job id");
    let (code, answer) = post(&api, &auth, "/api/v1/bench", &start);
    assert_eq!(code, 409, "a second job while one runs: {answer}");
    let job = |b: &Value| {
        b["jobs"]
            .as_array()
            .unwrap()
            .iter()
            .find(|j| j["id"] == id)
            .cloned()
            .unwrap_or(Value::Null)
    };
    let b = await_get(&api, &auth, "/api/v1/bench", 90, |b| {
        job(b)["state"] != "running"
    });
    let j = job(&b);
    assert_eq!(j["state"], "done", "{j}");
    assert_eq!(j["pattern"], "4k-randread", "{j}");
    assert_eq!(j["secs"], 3, "{j}");
    assert!(j["result"]["iops"].as_f64().unwrap() > 0.0, "{j}");
    assert!(
        j["result"]["latency_us_mean"].as_f64().unwrap() > 0.0,
        "{j}"
    );
    assert!(
        j["finished_ms"].as_u64().unwrap() >= j["started_ms"].as_u64().unwrap(),
        "{j}"
    );
    // its load shows in the history as a path of the node's own initiator
    let own = format!("iqn.2026-01.org.freesan:node-bench@{portal}");
    await_get(&api, &auth, "/api/v1/history?window=300", 30, |h| {
        any_sample(&h["paths"][&own], reads)
    });
    // a new job may start once it is done
    let (code, answer) = post(&api, &auth, "/api/v1/bench", &start);
    assert_eq!(code, 202, "{answer}");
}

/// Logs in to `portal` as `initiator` with `chap`; true when the login succeeds.
fn logs_in(portal: &str, initiator: &str, chap: Option<(&str, &str)>) -> bool {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut o = initiator::LoginOptions::new(initiator, IQN);
        o.chap = chap.map(|(u, s)| (u.to_string(), s.to_string()));
        match initiator::Session::login(portal.parse().unwrap(), &o).await {
            Ok(s) => {
                let _ = s.logout().await;
                true
            }
            Err(_) => false,
        }
    })
}

const ALLOWED: &str = "iqn.2026-11.test:allowed";
const OTHER: &str = "iqn.2026-11.test:other";
const CHAP: (&str, &str) = ("alice", "secret-of-alice-1");

#[test]
fn chap_and_acl_set_through_the_api_decide_logins_and_survive_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = one_file_lun_config(dir.path());
    let mut node = start_config(dir.path(), &cfg);
    let api = node.api.clone().expect("no API address in the banner");
    let auth = admin(dir.path());
    let chap_path = format!("/api/v1/targets/{IQN}/chap");
    let acl_path = format!("/api/v1/targets/{IQN}/acl");

    let t = get(&api, &auth, "/api/v1/targets");
    let t0 = &t[0];
    assert_eq!(t0["name"], IQN, "{t}");
    assert_eq!(t0["chap"], Value::Null, "{t}");
    assert_eq!(t0["acl"], serde_json::json!([]), "{t}");
    assert_eq!(t0["luns"][0]["lun"], 0, "{t}");
    assert_eq!(t0["luns"][0]["size_bytes"], 16 << 20, "{t}");
    assert!(
        t0["portals"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p == node.portals[0].as_str()),
        "{t}"
    );
    assert!(logs_in(&node.portals[0], OTHER, None), "no CHAP yet");

    // refused changes change nothing
    for (path, body, want) in [
        (
            chap_path.as_str(),
            "{\"user\":\"alice\",\"secret\":\"short\"}",
            400,
        ),
        (chap_path.as_str(), "{\"user\":\"alice\"}", 400),
        (acl_path.as_str(), "{\"initiators\":[\"not an iqn\"]}", 400),
        (
            "/api/v1/targets/iqn.2026-11.org.freesan:none/chap",
            "{\"user\":null}",
            404,
        ),
    ] {
        let (code, answer) = post(&api, &auth, path, body);
        assert_eq!(code, want, "{path} {body}: {answer}");
    }
    assert!(
        logs_in(&node.portals[0], OTHER, None),
        "a refused change applied"
    );

    let (code, answer) = post(
        &api,
        &auth,
        &chap_path,
        &format!("{{\"user\":\"{}\",\"secret\":\"{}\"}}", CHAP.0, CHAP.1),
    );
    assert_eq!(code, 200, "{answer}");
    assert!(
        !answer.contains(CHAP.1),
        "the answer shows the secret: {answer}"
    );
    let (code, answer) = post(
        &api,
        &auth,
        &acl_path,
        &format!("{{\"initiators\":[\"{ALLOWED}\"]}}"),
    );
    assert_eq!(code, 200, "{answer}");

    let check = |node: &Node, when: &str| {
        let p = &node.portals[0];
        assert!(
            !logs_in(p, ALLOWED, None),
            "{when}: login without the secret"
        );
        assert!(
            !logs_in(p, ALLOWED, Some((CHAP.0, "wrong-secret-123"))),
            "{when}: wrong secret"
        );
        assert!(
            !logs_in(p, OTHER, Some(CHAP)),
            "{when}: initiator not in the ACL"
        );
        assert!(
            logs_in(p, ALLOWED, Some(CHAP)),
            "{when}: the right secret and initiator"
        );
        let (code, body) = http(
            node.api.as_deref().unwrap(),
            "GET",
            "/api/v1/targets",
            &[&auth],
            "",
        );
        assert_eq!(code, 200, "{body}");
        assert!(
            !body.contains(CHAP.1),
            "{when}: GET /targets shows the secret: {body}"
        );
        let t: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(t[0]["chap"]["user"], CHAP.0, "{when}: {t}");
        assert_eq!(t[0]["chap"]["mutual"], false, "{when}: {t}");
        assert_eq!(t[0]["acl"], serde_json::json!([ALLOWED]), "{when}: {t}");
    };
    check(&node, "live");

    // a logged-in session is listed
    {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let mut o = initiator::LoginOptions::new(ALLOWED, IQN);
            o.chap = Some((CHAP.0.into(), CHAP.1.into()));
            let s = initiator::Session::login(node.portals[0].parse().unwrap(), &o)
                .await
                .expect("login");
            let t = get(&api, &auth, "/api/v1/targets");
            let sessions = t[0]["sessions"].as_array().unwrap();
            assert_eq!(sessions.len(), 1, "{t}");
            assert_eq!(sessions[0]["initiator"], ALLOWED, "{t}");
            assert_eq!(sessions[0]["isid"].as_str().unwrap().len(), 12, "{t}");
            assert_eq!(sessions[0]["connections"], 1, "{t}");
            assert_eq!(
                sessions[0]["portals"],
                serde_json::json!([node.portals[0]]),
                "{t}"
            );
            let _ = s.logout().await;
        });
    }

    assert!(node.terminate(), "the node did not stop cleanly");
    let mut node = start_config(dir.path(), &cfg);
    check(&node, "after a restart");

    // and both can be undone
    let api = node.api.clone().unwrap();
    let (code, answer) = post(&api, &auth, &chap_path, "{\"user\":null}");
    assert_eq!(code, 200, "{answer}");
    assert_eq!(
        serde_json::from_str::<Value>(&answer).unwrap()["chap"],
        Value::Null
    );
    assert!(logs_in(&node.portals[0], ALLOWED, None), "CHAP off");
    assert!(!logs_in(&node.portals[0], OTHER, None), "the ACL stays");
    let (code, answer) = post(&api, &auth, &acl_path, "{\"initiators\":[]}");
    assert_eq!(code, 200, "{answer}");
    assert!(
        logs_in(&node.portals[0], OTHER, None),
        "an empty ACL lets anyone in"
    );
    assert!(node.terminate());
}
