//! The web console ([api] console), driven in a real headless Chromium: a real
//! `freesan serve` process with free disks and an SSD cache; node scripts under
//! `console/test/` (playwright-core over the DevTools protocol, Debian's
//! `/usr/bin/chromium`) sign in with a token, create a pool from free disks and a
//! LUN on it, run a benchmark from the console and read the LUN's IOPS off the
//! chart's data, fail a member (typing its name) and follow the alert and the
//! rebuild to its end, read the cache hit rate and the advisor's curve, run
//! axe-core and a Tab walk on every page, save a screenshot of every page to
//! `target/console-screenshots/`, and check that a read-only session has no
//! action and that the API refuses its POST (403). The console's size and its
//! first load over a 1 Mbit/s link are printed (never pass/fail).
//!
//! Needs node, chromium and the console's npm packages (`scripts/build-console`);
//! skipped when missing unless FREESAN_REQUIRE_TOOLS=1.

use crate::common;
use common::*;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

pub(crate) fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// One raw HTTP/1.1 GET; returns the head (status line and headers, lower
/// case) and the body bytes.
fn get_raw(addr: &str, path: &str, headers: &[&str]) -> (String, Vec<u8>) {
    let mut s = std::net::TcpStream::connect(addr).expect("connect to the console");
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut req = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    for h in headers {
        req += h;
        req += "\r\n";
    }
    req += "\r\n";
    s.write_all(req.as_bytes()).unwrap();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    let split = out
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("an HTTP answer");
    let head = String::from_utf8_lossy(&out[..split]).to_ascii_lowercase();
    let mut body = out[split + 4..].to_vec();
    if head.contains("transfer-encoding: chunked") {
        body = dechunk(&body);
    }
    (head, body)
}

fn dechunk(mut b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(i) = b.windows(2).position(|w| w == b"\r\n") {
        let n = usize::from_str_radix(String::from_utf8_lossy(&b[..i]).trim(), 16).unwrap_or(0);
        if n == 0 {
            break;
        }
        out.extend_from_slice(&b[i + 2..i + 2 + n]);
        b = &b[i + 2 + n + 2..];
    }
    out
}

/// The console address from the node's banner (`console: http://ADDR/`).
pub(crate) fn console_addr(node: &Node) -> String {
    let log = std::fs::read_to_string(&node.log).unwrap();
    log.lines()
        .find_map(|l| l.trim().strip_prefix("console:"))
        .map(|u| {
            u.trim()
                .trim_start_matches("http://")
                .trim_end_matches('/')
                .to_string()
        })
        .unwrap_or_else(|| panic!("no console in the banner: {log}"))
}

/// node, chromium and the console's npm packages, or a skip (a failure under
/// FREESAN_REQUIRE_TOOLS=1).
pub(crate) fn tools() -> bool {
    if !have("node") || !have("chromium") {
        return false;
    }
    if !repo().join("console/node_modules/playwright-core").is_dir() {
        assert!(
            std::env::var("FREESAN_REQUIRE_TOOLS").is_err(),
            "the console's npm packages are missing: run scripts/build-console"
        );
        eprintln!("skipping: console/node_modules is missing (run scripts/build-console)");
        return false;
    }
    true
}

/// Runs `console/test/drive.mjs` with `input`; returns (success, output).
fn drive(input: &serde_json::Value) -> (bool, String) {
    drive_with(Command::new("node"), input)
}

/// Runs `console/test/drive.mjs` with `input` through `node` (a command that
/// runs node, perhaps in a network namespace); returns (success, output).
pub(crate) fn drive_with(mut node: Command, input: &serde_json::Value) -> (bool, String) {
    let out = node
        .arg(repo().join("console/test/drive.mjs"))
        .env("FREESAN_CONSOLE_TEST", input.to_string())
        .output()
        .expect("run node");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

fn config(dir: &Path) -> PathBuf {
    let d = dir.display();
    let mut s = format!(
        "data_dir = \"{d}/data\"\n[api]\naddress = \"127.0.0.1:0\"\nconsole = \"127.0.0.1:0\"\n\
         [[portal]]\naddress = \"127.0.0.1:0\"\n"
    );
    for name in ["p0", "p1", "ssd0", "ssd1", "d0", "d1", "d2"] {
        s += &format!("[[disk]]\nname = \"{name}\"\nsize = \"64M\"\npath = \"{d}/{name}.img\"\n");
    }
    s += "[[pool]]\nname = \"p\"\nlevel = \"raid1\"\nmembers = [\"p0\", \"p1\"]\n";
    s += "[[cache]]\nname = \"c\"\npool = \"p\"\nmode = \"write-back\"\ndevices = [\"ssd0\", \"ssd1\"]\n\
          size = \"16M\"\nblock_size = \"64K\"\n";
    s += &format!("[[target]]\niqn = \"{IQN}\"\n[[target.lun]]\ncache = \"c\"\n");
    let path = dir.join("node.toml");
    std::fs::write(&path, s).unwrap();
    path
}

#[test]
fn the_console_runs_the_node_in_a_real_browser() {
    if !tools() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path());
    let node = start_config(dir.path(), &cfg);
    let console = console_addr(&node);
    let data = dir.path().join("data");
    let admin = make_token(&data, "admin", "console-admin");
    let ro = make_token(&data, "read-only", "console-reader");

    // the static files: no token, strict headers, gzip, long cache for hashed names
    let (head, body) = get_raw(&console, "/", &[]);
    assert!(head.starts_with("http/1.1 200"), "{head}");
    let index = String::from_utf8_lossy(&body).to_string();
    if index.contains("has no console") {
        assert!(
            std::env::var("FREESAN_REQUIRE_TOOLS").is_err(),
            "this freesan was built without console/dist: run scripts/build-console before cargo"
        );
        eprintln!("skipping: this freesan was built without the console (run scripts/build-console, then build)");
        return;
    }
    for h in [
        "content-security-policy: default-src 'self'",
        "x-frame-options: deny",
        "x-content-type-options: nosniff",
        "content-type: text/html",
        "cache-control: no-cache",
    ] {
        assert!(head.contains(h), "no {h:?} on /: {head}");
    }
    assert!(!head.contains("unsafe-inline"), "{head}");
    let js = index
        .split('"')
        .find(|s| s.starts_with("/app-") && s.ends_with(".js"))
        .expect("the script in index.html")
        .to_string();
    let css = index
        .split('"')
        .find(|s| s.starts_with("/app-") && s.ends_with(".css"))
        .expect("the style sheet in index.html")
        .to_string();
    let mut raw_total = body.len();
    let mut gz_total = get_raw(&console, "/", &["Accept-Encoding: gzip"]).1.len();
    for f in [&js, &css] {
        let (head, plain) = get_raw(&console, f, &[]);
        assert!(
            head.contains("cache-control: public, max-age=31536000, immutable"),
            "{head}"
        );
        assert!(!head.contains("content-encoding"), "{head}");
        let (gzhead, gz) = get_raw(&console, f, &["Accept-Encoding: gzip, br"]);
        assert!(gzhead.contains("content-encoding: gzip"), "{gzhead}");
        assert!(gz.len() < plain.len());
        raw_total += plain.len();
        gz_total += gz.len();
    }
    // the API on the console's listener: the same gate
    let (code, _) = http(&console, "GET", "/api/v1/pools", &[], "");
    assert_eq!(code, 401, "the console's API answered without a token");
    let (code, _) = http(
        &console,
        "GET",
        "/api/v1/pools",
        &["Authorization: Bearer fsk_not-a-token"],
        "",
    );
    assert_eq!(code, 401, "the console's API answered a wrong token");
    let (code, body) = http(
        &console,
        "GET",
        "/api/v1/whoami",
        &[&format!("Authorization: Bearer {ro}")],
        "",
    );
    assert_eq!(code, 200, "{body}");
    let who: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(who["role"], "read-only", "{who}");
    assert_eq!(who["name"], "console-reader", "{who}");
    let (code, body) = http(
        &console,
        "POST",
        "/api/v1/pools",
        &[
            &format!("Authorization: Bearer {ro}"),
            "Content-Type: application/json",
        ],
        r#"{"name":"x","level":"raid1","members":["d0","d1"]}"#,
    );
    assert_eq!(code, 403, "a read-only POST: {body}");
    let (code, _) = http(&console, "GET", "/api/v1/no-such-route", &[], "");
    assert_eq!(code, 404);

    // traffic through the cache so that its advisor has a curve to show
    let url = node.url(0, 0);
    let (ok, out) = freesan(&[
        "bench",
        "--target",
        &url,
        "--single-path",
        "--bs",
        "64k",
        "--rw",
        "randrw",
        "--threads",
        "2",
        "--qd",
        "4",
        "--secs",
        "4",
        "--ramp",
        "0",
        "--size",
        "40M",
        "--quiet",
    ]);
    assert!(ok, "bench through the cache: {out}");

    let shots = repo().join("target/console-screenshots");
    std::fs::create_dir_all(&shots).unwrap();
    let input = serde_json::json!({
        "scenario": "main",
        "url": format!("http://{console}/"),
        "token": admin,
        "ro_token": ro,
        "target": IQN,
        "shots": shots,
    });
    let (ok, out) = drive(&input);
    println!("{out}");
    assert!(ok, "the browser scenario failed:\n{out}");
    println!("console size: {raw_total} bytes ({gz_total} gzipped) for index.html, {js} and {css}");
    println!("screenshots in {}", shots.display());
}
