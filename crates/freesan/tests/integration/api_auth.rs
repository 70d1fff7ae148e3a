//! The management API of a real node, attacked the way a local user, a web page
//! or a stolen read-only token would: no token, a wrong token, a read-only token
//! on changing endpoints, a cross-site form post, a foreign Host header (DNS
//! rebinding) and an oversized body are refused and change nothing; the local
//! CLI finds its admin token by itself; tokens made and revoked with
//! `freesan api token ...` apply to the running node at once; changes are
//! in the audit log (`freesan api audit`).

use crate::common;
use common::*;
use serde_json::Value;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

fn config(dir: &Path) -> std::path::PathBuf {
    let s = format!(
        "{}[[target]]\niqn = \"{IQN}\"\n[[target.lun]]\npath = \"{d}/lun0.img\"\nsize = \"16M\"\n",
        config_head(dir, 3),
        d = dir.display()
    );
    let path = dir.join("node.toml");
    std::fs::write(&path, s).unwrap();
    path
}

/// What the node holds, as the local admin CLI sees it: its disks and LUNs, and
/// of each pool what an action would change (members and their states, spares,
/// scrub, rebuild rate), not the counters a background resync moves.
fn state(api: &str) -> (Value, Value, Value, Value) {
    let get = |what: &str, sub: &str| {
        let (ok, out) = freesan(&[what, "--api", api, sub, "--json"]);
        assert!(ok, "freesan {what}: {out}");
        serde_json::from_str::<Value>(&out).unwrap_or_else(|e| panic!("{what}: {e}: {out}"))
    };
    let pools: Vec<Value> = get("pool", "status")
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            let members: Vec<Value> = p["members"]
                .as_array()
                .unwrap()
                .iter()
                .map(|m| serde_json::json!([m["name"], m["state"]]))
                .collect();
            serde_json::json!({
                "name": p["name"], "members": members, "spares": p["spares"],
                "scrub": p["scrub"], "rebuild_rate_mb_s": p["rebuild_rate_mb_s"],
            })
        })
        .collect();
    // what an attacker could change of a disk, not its I/O counters (the
    // pool's own superblock and journal I/O moves them)
    let disks: Vec<Value> = get("disk", "list")
        .as_array()
        .unwrap()
        .iter()
        .map(|d| {
            serde_json::json!({
                "name": d["name"], "size": d["size"], "pool": d["pool"], "role": d["role"],
                "state": d["state"], "free": d["free"],
            })
        })
        .collect();
    (
        Value::Array(disks),
        Value::Array(pools),
        get("lun", "list"),
        get("host-group", "list"),
    )
}

#[test]
fn the_api_refuses_callers_without_the_right_token_origin_or_host() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path());
    let data = dir.path().join("data");
    let node = start_config(dir.path(), &cfg);
    let api = node.api.clone().expect("no API address in the banner");

    // the local CLI finds the node's admin token without being told
    let (ok, out) = freesan(&[
        "pool", "--api", &api, "create", "p", "--level", "raid1", "--member", "d0,d1",
    ]);
    assert!(ok, "the local CLI could not create a pool: {out}");
    let before = state(&api);

    // tokens are kept hashed, 0600, in a 0700 folder; the CLI's copy is 0600
    let cli_token = std::fs::read_to_string(data.join("api/cli-token")).unwrap();
    let file = std::fs::read_to_string(data.join("api/tokens.json")).unwrap();
    assert!(!file.contains(cli_token.trim().trim_start_matches("fsn_")));
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&data.join("api")), 0o700);
    assert_eq!(mode(&data.join("api/tokens.json")), 0o600);
    assert_eq!(mode(&data.join("api/cli-token")), 0o600);

    // a read-only token made while the node runs applies at once
    let ro = make_token(&data, "read-only", "auditor");
    let ro_auth = format!("Authorization: Bearer {ro}");
    let admin_auth = format!("Authorization: Bearer {}", cli_token.trim());
    let wrong = format!("Authorization: Bearer fsn_{}", "a".repeat(64));
    let json = "Content-Type: application/json";
    assert_eq!(http(&api, "GET", "/api/v1/pools", &[&ro_auth], "").0, 200);

    let attacks: [(&str, &str); 9] = [
        (
            "/api/v1/disks",
            r#"{"name":"huge","memory":true,"size":"1T"}"#,
        ),
        (
            "/api/v1/luns",
            r#"{"target":"iqn.2026-11.org.freesan:itest","lun":{"path":"/dev/sda"}}"#,
        ),
        ("/api/v1/pools/p/fail", r#"{"position":0}"#),
        ("/api/v1/pools/p/scrub", ""),
        ("/api/v1/pools/p/rebuild-rate", r#"{"mb_s":1}"#),
        (
            "/api/v1/luns/delete",
            r#"{"target":"iqn.2026-11.org.freesan:itest","lun":0}"#,
        ),
        (
            "/api/v1/luns/resize",
            r#"{"target":"iqn.2026-11.org.freesan:itest","lun":0,"size":"1T"}"#,
        ),
        (
            "/api/v1/host-groups",
            r#"{"target":"iqn.2026-11.org.freesan:itest","group":{"name":"x","luns":[]}}"#,
        ),
        (
            "/api/v1/host-groups/delete",
            r#"{"target":"iqn.2026-11.org.freesan:itest","name":"x"}"#,
        ),
    ];
    for (path, body) in attacks.iter().copied() {
        let (code, _) = http(&api, "POST", path, &[json], body);
        assert_eq!(code, 401, "{path} with no token");
        let (code, _) = http(&api, "POST", path, &[json, &wrong], body);
        assert_eq!(code, 401, "{path} with a wrong token");
        let (code, answer) = http(&api, "POST", path, &[json, &ro_auth], body);
        assert_eq!(code, 403, "{path} with a read-only token: {answer}");
        // a cross-site form post, with and without a token
        let form = "Content-Type: application/x-www-form-urlencoded";
        let evil = "Origin: http://evil.example";
        let (code, _) = http(&api, "POST", path, &[form, evil], "position=0");
        assert!(code == 401 || code == 403, "{path} form post: {code}");
        let (code, _) = http(&api, "POST", path, &[form, evil, &admin_auth], "position=0");
        assert_eq!(code, 403, "{path} form post with a token");
        let (code, _) = http(&api, "POST", path, &[form, &admin_auth], body);
        assert_eq!(code, 415, "{path} non-JSON post with a token");
        // DNS rebinding: a page's own name in Host, even with a token
        let (code, _) = http(
            &api,
            "POST",
            path,
            &["Host: evil.example", json, &admin_auth],
            body,
        );
        assert_eq!(code, 421, "{path} with a foreign Host");
    }
    // every route the node describes, the list above or not: a change
    // without a token or with a wrong one is unauthorised, with a read-only
    // one forbidden (and audited); a read without a token is unauthorised
    let (code, doc) = http(&api, "GET", "/api/v1/openapi.json", &[&ro_auth], "");
    assert_eq!(code, 200, "{doc}");
    let doc: Value = serde_json::from_str(&doc).unwrap();
    let mut posts = Vec::new();
    for (path, item) in doc["paths"].as_object().expect("paths") {
        // a path's parameters named: any name will do, the guard comes first
        let path: String = path
            .split('/')
            .map(|part| if part.starts_with('{') { "x" } else { part })
            .collect::<Vec<_>>()
            .join("/");
        if item.get("get").is_some() {
            let (code, _) = http(&api, "GET", &path, &[], "");
            assert_eq!(code, 401, "GET {path} with no token");
        }
        if item.get("post").is_some() {
            for (who, auth, want) in [
                ("no", "", 401),
                ("a wrong", &*wrong, 401),
                ("a read-only", &*ro_auth, 403),
            ] {
                let headers: Vec<&str> =
                    [json, auth].into_iter().filter(|h| !h.is_empty()).collect();
                let (code, answer) = http(&api, "POST", &path, &headers, "{}");
                assert_eq!(code, want, "POST {path} with {who} token: {answer}");
            }
            posts.push(path);
        }
    }
    for needed in [
        "/api/v1/replicas/discard",
        "/api/v1/replicas/keep",
        "/api/v1/reload",
        "/api/v1/bench",
    ] {
        assert!(
            posts.iter().any(|p| p == needed),
            "{needed} is not described: {posts:?}"
        );
    }
    let (code, _) = http(
        &api,
        "GET",
        "/api/v1/luns",
        &["Host: rebound.evil.example:8260", &admin_auth],
        "",
    );
    assert_eq!(code, 421, "a GET with a foreign Host");
    let big = format!(r#"{{"name":"d9","pad":"{}"}}"#, "x".repeat(100 << 10));
    let (code, _) = http(&api, "POST", "/api/v1/disks", &[json, &admin_auth], &big);
    assert_eq!(code, 413, "an oversized body");
    assert_eq!(state(&api), before, "an attack changed the node");

    // the CLI with a read-only token is refused; with none found it says how to give one
    let (ok, out) = freesan(&[
        "disk", "--api", &api, "--token", &ro, "create", "x", "--size", "1M",
    ]);
    assert!(!ok && out.contains("403"), "{out}");
    let empty = dir.path().join("empty");
    let (ok, out) = freesan(&[
        "disk",
        "--api",
        &api,
        "--data-dir",
        empty.to_str().unwrap(),
        "list",
    ]);
    assert!(!ok && out.contains("--token"), "{out}");
    // --token-file (a token no command line shows) is honoured; it is the
    // token sent, so a read-only one is refused a change
    let token_file = dir.path().join("ro.token");
    std::fs::write(&token_file, format!("{ro}\n")).unwrap();
    let tf = token_file.to_str().unwrap();
    let (ok, out) = freesan(&[
        "disk",
        "--api",
        &api,
        "--data-dir",
        empty.to_str().unwrap(),
        "--token-file",
        tf,
        "list",
    ]);
    assert!(ok, "{out}");
    let (ok, out) = freesan(&[
        "disk",
        "--api",
        &api,
        "--token-file",
        tf,
        "create",
        "x",
        "--size",
        "1M",
    ]);
    assert!(!ok && out.contains("403"), "{out}");
    // FREESAN_API_TOKEN and --data-dir are honoured
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_freesan"))
        .args(["disk", "--api", &api, "list", "--json"])
        .env("FREESAN_API_TOKEN", &ro)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (ok, out) = freesan(&[
        "disk",
        "--api",
        &api,
        "--data-dir",
        data.to_str().unwrap(),
        "list",
    ]);
    assert!(ok, "{out}");

    // the audit log names who did what, and is readable with a read-only token
    let (ok, out) = freesan(&[
        "api", "audit", "--api", &api, "--token", &ro, "--json", "--limit", "1000",
    ]);
    assert!(ok, "{out}");
    let log: Vec<Value> = serde_json::from_str(&out).unwrap();
    assert!(
        log.iter()
            .any(|e| e["who"] == "local-cli" && e["path"] == "/api/v1/pools" && e["status"] == 200),
        "{out}"
    );
    assert_eq!(
        log.iter()
            .filter(|e| e["who"] == "auditor" && e["status"] == 403)
            .count(),
        // each attack once with the read-only token, each described change
        // once, and its two CLI attempts (--token, --token-file)
        attacks.len() + posts.len() + 2,
        "{out}"
    );
    let mode = std::fs::metadata(data.join("audit.log"))
        .unwrap()
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(mode, 0o600);

    // list and revoke: the revoked token is refused at once
    let d = data.to_str().unwrap();
    let (ok, out) = freesan(&["api", "token", "list", "--data-dir", d]);
    assert!(
        ok && out.contains("auditor") && out.contains("local-cli") && !out.contains(&ro),
        "{out}"
    );
    let (ok, out) = freesan(&["api", "token", "revoke", "auditor", "--data-dir", d]);
    assert!(ok, "{out}");
    // granting and taking back a privilege on the host is in the audit log too
    let log = std::fs::read_to_string(data.join("audit.log")).unwrap();
    for what in ["token create auditor", "token revoke auditor"] {
        assert!(log.contains(what), "no {what:?} in the audit log");
    }
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(http(&api, "GET", "/api/v1/pools", &[&ro_auth], "").0, 401);
    drop(node);
}

#[test]
fn tokens_can_be_made_before_the_node_first_starts() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path());
    let data = dir.path().join("data");
    let admin = make_token(&data, "admin", "ops");
    let node = start_config(dir.path(), &cfg);
    let api = node.api.clone().expect("no API address in the banner");
    let auth = format!("Authorization: Bearer {admin}");
    let (code, body) = http(
        &api,
        "POST",
        "/api/v1/disks",
        &["Content-Type: application/json", &auth],
        r#"{"name":"m","size":"1M"}"#,
    );
    assert_eq!(code, 200, "{body}");
    let (ok, out) = freesan(&[
        "api",
        "token",
        "list",
        "--data-dir",
        data.to_str().unwrap(),
        "--json",
    ]);
    assert!(ok, "{out}");
    let v: Vec<Value> = serde_json::from_str(&out).unwrap();
    assert_eq!(v.len(), 2, "{out}");
}

#[test]
fn with_tls_the_local_cli_pins_the_nodes_certificate_and_plain_http_gets_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path());
    let text = std::fs::read_to_string(&cfg).unwrap().replacen(
        "[api]\naddress = \"127.0.0.1:0\"\n",
        "[api]\naddress = \"127.0.0.1:0\"\ntls = true\n",
        1,
    );
    std::fs::write(&cfg, text).unwrap();
    let data = dir.path().join("data");
    let node = start_config(dir.path(), &cfg);
    let api = node.api.clone().expect("no API address in the banner");
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&data.join("api/tls-key.pem")), 0o600);
    assert!(data.join("api/serving-cert.pem").exists());
    // the local CLI finds token and certificate by itself
    let (ok, out) = freesan(&[
        "pool", "--api", &api, "create", "p", "--level", "raid1", "--member", "d0,d1",
    ]);
    assert!(ok, "{out}");
    let (ok, out) = freesan(&["pool", "--api", &api, "status", "p", "--json"]);
    assert!(ok, "{out}");
    // plain HTTP, even with the admin token, gets no HTTP answer
    let token = std::fs::read_to_string(data.join("api/cli-token")).unwrap();
    let auth = format!("Authorization: Bearer {}", token.trim());
    let (code, _) = http(&api, "GET", "/api/v1/pools", &[&auth], "");
    assert_eq!(code, 0, "plain HTTP was answered");
    // pinning a copy of the node's certificate works; pinning another one (what a
    // client sees when someone in the middle answers) fails
    let copy = dir.path().join("copy.pem");
    std::fs::copy(data.join("api/serving-cert.pem"), &copy).unwrap();
    let (ok, out) = freesan(&[
        "pool",
        "--api",
        &api,
        "--tls-cert",
        copy.to_str().unwrap(),
        "status",
    ]);
    assert!(ok, "pinning the node's own certificate: {out}");
    let other = tempfile::tempdir().unwrap();
    let (other_cert, _) = api::tls::ensure_generated(other.path(), &[]).unwrap();
    let (ok, out) = freesan(&[
        "pool",
        "--api",
        &api,
        "--tls-cert",
        other_cert.to_str().unwrap(),
        "status",
    ]);
    assert!(
        !ok && out.contains("TLS"),
        "another certificate was accepted: {out}"
    );
    drop(node);
}

#[test]
fn the_api_refuses_paths_sizes_names_and_failures_beyond_what_the_node_allows() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().display().to_string();
    let naa = "600140500000000000000000000000aa";
    // the API may use this test's folder (where the disks are), nothing else
    let head = config_head(dir.path(), 3).replacen(
        "[api]\naddress = \"127.0.0.1:0\"\n",
        &format!("[api]\naddress = \"127.0.0.1:0\"\nallowed_paths = [\"{d}\"]\n"),
        1,
    );
    let s = format!(
        "{head}[[target]]\niqn = \"{IQN}\"\n[[target.lun]]\npath = \"{d}/lun0.img\"\nsize = \"16M\"\nnaa = \"{naa}\"\n"
    );
    let cfg = dir.path().join("node.toml");
    std::fs::write(&cfg, s).unwrap();
    let node = start_config(dir.path(), &cfg);
    let api = node.api.clone().expect("no API address in the banner");
    let cli = |args: &[&str]| {
        let mut all = vec![args[0], "--api", api.as_str()];
        all.extend_from_slice(&args[1..]);
        freesan(&all)
    };
    let before = state(&api);
    let outside = tempfile::tempdir().unwrap();
    let out_file = outside.path().join("x.img");
    for (file, why) in [
        (out_file.to_str().unwrap().to_string(), "outside"),
        ("/dev/sda".to_string(), "outside"),
        (format!("{d}/sub/../../x.img"), ".."),
        (format!("{d}/lun0.img"), "in use"),
        (format!("{d}/d1.img"), "in use"),
    ] {
        let (ok, out) = cli(&[
            "lun", "create", "--target", IQN, "--file", &file, "--size", "1M",
        ]);
        assert!(!ok && out.contains(why), "LUN on {file}: {out}");
    }
    assert!(!out_file.exists(), "a refused LUN left its file");
    let token = std::fs::read_to_string(dir.path().join("data/api/cli-token")).unwrap();
    let auth = format!("Authorization: Bearer {}", token.trim());
    let json = "Content-Type: application/json";
    let (code, body) = http(
        &api,
        "POST",
        "/api/v1/disks",
        &[json, &auth],
        r#"{"name":"huge","memory":true,"size":"1T"}"#,
    );
    assert_eq!(code, 409, "a 1 TiB memory disk: {body}");
    let lun = |l: &str| format!(r#"{{"target":"{IQN}","lun":{l}}}"#);
    let big = lun(&format!(
        r#"{{"path":"{d}/thick.img","size":"1000T","thick":true}}"#
    ));
    let (code, body) = http(&api, "POST", "/api/v1/luns", &[json, &auth], &big);
    assert_eq!(code, 409, "a thick 1000 TiB file: {body}");
    let sparse = lun(&format!(r#"{{"path":"{d}/sparse.img","size":"1000T"}}"#));
    let (code, body) = http(&api, "POST", "/api/v1/luns", &[json, &auth], &sparse);
    assert_eq!(code, 409, "a sparse 1000 TiB file: {body}");
    assert!(!dir.path().join("sparse.img").exists());
    // a disk's name is its file's name when it has no path: names reaching out
    // of the data directory are refused (before, "/outside/victim" opened
    // /outside/victim.img, beyond [api] allowed_paths), and so are disks larger
    // than their filesystem could ever hold
    let victim = outside.path().join("victim");
    std::fs::write(outside.path().join("victim.img"), vec![7u8; 65536]).unwrap();
    for name in [victim.to_str().unwrap(), "../escape", "a/b", ".hidden", ""] {
        let body = format!(r#"{{"name":"{name}","sim":{{"model":"ssd"}}}}"#);
        let (code, text) = http(&api, "POST", "/api/v1/disks", &[json, &auth], &body);
        assert!(
            code == 400 || code == 409,
            "disk named {name:?}: {code} {text}"
        );
    }
    assert!(!dir.path().join("escape.img").exists());
    let (code, body) = http(
        &api,
        "POST",
        "/api/v1/disks",
        &[json, &auth],
        r#"{"name":"vast","size":"1000T"}"#,
    );
    assert_eq!(code, 409, "a sparse 1000 TiB disk: {body}");
    let same = lun(&format!(
        r#"{{"path":"{d}/other.img","size":"1M","naa":"{}"}}"#,
        naa.to_uppercase()
    ));
    let (code, body) = http(&api, "POST", "/api/v1/luns", &[json, &auth], &same);
    assert_eq!(code, 409, "a second LUN with NAA {naa}: {body}");
    assert_eq!(state(&api), before, "a refused request changed the node");
    // a LUN inside the allowed folder is fine
    let (ok, out) = cli(&[
        "lun",
        "create",
        "--target",
        IQN,
        "--file",
        &format!("{d}/new.img"),
        "--size",
        "1M",
    ]);
    assert!(ok, "{out}");
    // its NAA was generated (kept in the data directory): another LUN cannot take it
    let targets = dir.path().join("data/targets");
    let generated = std::fs::read_dir(&targets)
        .unwrap()
        .map(|e| e.unwrap().path().join("lun1.identity.json"))
        .find(|p| p.exists())
        .expect("no identity file for the new LUN");
    let id: Value = serde_json::from_slice(&std::fs::read(generated).unwrap()).unwrap();
    let generated_naa = id["naa"].as_str().unwrap();
    let before = state(&api);
    let same = lun(&format!(
        r#"{{"path":"{d}/third.img","size":"1M","naa":"{generated_naa}"}}"#
    ));
    let (code, body) = http(&api, "POST", "/api/v1/luns", &[json, &auth], &same);
    assert_eq!(
        code, 409,
        "a LUN with the generated NAA {generated_naa}: {body}"
    );
    assert_eq!(state(&api), before, "a refused request changed the node");

    // failing members: the first of a mirror is fine, the second needs --force
    let (ok, out) = cli(&[
        "pool", "create", "p", "--level", "raid1", "--member", "d0,d1",
    ]);
    assert!(ok, "{out}");
    let (ok, out) = cli(&["pool", "fail", "p", "0"]);
    assert!(ok, "{out}");
    let (ok, out) = cli(&["pool", "fail", "p", "1"]);
    assert!(
        !ok && out.contains("--force"),
        "failing the last copy was accepted: {out}"
    );
    let (ok, out) = cli(&["pool", "status", "p", "--json"]);
    assert!(ok);
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["members"][1]["state"], "active", "{out}");
    let (ok, out) = cli(&["pool", "fail", "p", "1", "--force"]);
    assert!(ok, "--force was refused: {out}");

    // a simulated disk keeps its data in DATA_DIR/disks/NAME.img: that file is
    // in use, and a LUN on it (which would write under a pool's member) is
    // refused like any other path in use
    let (code, body) = http(
        &api,
        "POST",
        "/api/v1/disks",
        &[json, &auth],
        r#"{"name":"s1","size":"16M","sim":{"model":"ssd"}}"#,
    );
    assert_eq!(code, 200, "{body}");
    let member = dir.path().join("data/disks/s1.img");
    let on_member = lun(&format!(r#"{{"path":"{}","size":"1M"}}"#, member.display()));
    let (code, body) = http(&api, "POST", "/api/v1/luns", &[json, &auth], &on_member);
    assert_eq!(code, 409, "a LUN on a simulated disk's file: {body}");
    assert!(body.contains("in use"), "{body}");
    drop(node);
}

/// A local user who binds the API's port while the node is down gets no
/// token: before a token goes in clear to loopback, the CLI checks that the
/// socket that accepted the connection belongs to a user the node may run as
/// (root, the CLI's own user, the owner of the node's data directory). Here
/// the impostor listens as `nobody`, accepting at once or only after a while
/// (a connection not yet accepted showed as root's on kernels before 6.17);
/// the same impostor run as this test's own user does get the token, so the
/// capture would see one sent.
#[test]
fn the_cli_sends_no_token_to_a_port_another_user_holds() {
    // SAFETY: geteuid only reads the process's credentials.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: becoming another user takes root");
        return;
    }
    // (the system's: another user may not reach a python under root's home)
    const PYTHON: &str = "/usr/bin/python3";
    if !Path::new(PYTHON).exists() {
        eprintln!("skipped: no {PYTHON}");
        return;
    }
    const SECRET: &str = "not-for-impostors-0123456789";
    // listens once, prints what it was sent (up to the end of the head)
    const IMPOSTOR: &str = r#"
import socket, sys, time
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1])))
s.listen(1)
print("listening", flush=True)
time.sleep(float(sys.argv[2]))
s.settimeout(60)
c, _ = s.accept()
c.settimeout(10)
got = b""
while b"\r\n\r\n" not in got:
    part = c.recv(65536)
    if not part:
        break
    got += part
if got:
    c.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\n[]")
c.close()
print(repr(got), flush=True)
"#;
    let run = |as_nobody: bool, accept_after_s: &str| -> (bool, String, String) {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut cmd = if as_nobody {
            let mut c = std::process::Command::new("setpriv");
            c.args(["--reuid=65534", "--regid=65534", "--clear-groups", PYTHON]);
            c
        } else {
            std::process::Command::new(PYTHON)
        };
        let mut impostor = cmd
            .args(["-c", IMPOSTOR, &port.to_string(), accept_after_s])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("python3 runs");
        let mut out = std::io::BufReader::new(impostor.stdout.take().unwrap());
        let mut line = String::new();
        std::io::BufRead::read_line(&mut out, &mut line).unwrap();
        assert_eq!(line.trim(), "listening");
        let api = format!("127.0.0.1:{port}");
        let (ok, said) = freesan(&["pool", "status", "--api", &api, "--token", SECRET]);
        let mut got = String::new();
        std::io::Read::read_to_string(&mut out, &mut got).unwrap();
        impostor.wait().unwrap();
        (ok, said, got)
    };
    for accept_after_s in ["0", "1.5"] {
        let (ok, said, got) = run(true, accept_after_s);
        assert!(!ok, "{said}");
        assert!(
            said.contains("runs as user 65534") && said.contains("the token was not sent"),
            "accepting after {accept_after_s} s: {said}"
        );
        assert!(!got.contains(SECRET), "the impostor got the token: {got}");
    }
    // the capture sees a token that is sent
    let (_, said, got) = run(false, "0");
    assert!(got.contains(&format!("Bearer {SECRET}")), "{got} / {said}");
}

/// `--token` shows in `ps` to every user of the host: the CLI overwrites it
/// in its own command line as soon as it has read it, so a look at the
/// running command (here, while it waits for the API's answer) finds `x`s
/// where the token was, in both spellings, and the API address, which holds
/// the same digits, left alone.
#[test]
fn a_token_given_on_the_command_line_does_not_stay_in_it() {
    let api = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = api.local_addr().unwrap();
    // the port as the token: only the option's value may be hidden
    let secret = addr.port().to_string();
    let addr = addr.to_string();
    api.set_nonblocking(true).unwrap();
    for spelled in [
        vec!["--token".to_string(), secret.clone()],
        vec![format!("--token={secret}")],
    ] {
        let mut cli = std::process::Command::new(env!("CARGO_BIN_EXE_freesan"))
            .args(["pool", "status", "--api", &addr])
            .args(&spelled)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        // connected: it has read its arguments, and waits for an answer
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        let held = loop {
            match api.accept() {
                Ok((c, _)) => break c,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    assert!(
                        cli.try_wait().unwrap().is_none(),
                        "the CLI ended without connecting"
                    );
                    assert!(std::time::Instant::now() < deadline, "no connection");
                    std::thread::sleep(Duration::from_millis(10));
                }
                Err(e) => panic!("{e}"),
            }
        };
        let seen = std::fs::read(format!("/proc/{}/cmdline", cli.id())).unwrap();
        drop(held);
        let out = cli.wait_with_output().unwrap();
        let seen = String::from_utf8_lossy(&seen).replace('\0', " ");
        let hidden = "x".repeat(secret.len());
        assert!(seen.contains(&format!("--api {addr}")), "{seen}");
        assert!(
            seen.ends_with(&format!("--token {hidden} "))
                || seen.ends_with(&format!("--token={hidden} ")),
            "{seen}"
        );
        let said = String::from_utf8_lossy(&out.stderr);
        assert!(!said.contains("could not be hidden"), "{said}");
    }
}
