//! A real Prometheus (Debian's `prometheus`) scrapes a node's `GET /metrics` with
//! a read-only bearer token while `freesan bench` reads a LUN on a RAID 1 pool;
//! its query API then shows a non-zero read rate for that LUN, and the pool as
//! degraded once a member is failed through the API. `promtool check metrics`
//! accepts the text, and `/metrics` without a token is refused.

use crate::common;
use common::*;
use serde_json::Value;
use std::io::{Read, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// One HTTP/1.1 request (Connection: close); returns (status, body).
fn http(addr: &str, path: &str, headers: &[&str]) -> (u16, String) {
    let Ok(mut s) = std::net::TcpStream::connect(addr) else {
        return (0, String::new());
    };
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut req = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    for h in headers {
        req += h;
        req += "\r\n";
    }
    req += "\r\n";
    let _ = s.write_all(req.as_bytes());
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    let out = String::from_utf8_lossy(&out).into_owned();
    let code = out.get(9..12).and_then(|c| c.parse().ok()).unwrap_or(0);
    let (head, body) = out.split_once("\r\n\r\n").unwrap_or((&out, ""));
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(body)
    } else {
        body.to_string()
    };
    (code, body)
}

/// The body of a chunked HTTP/1.1 response.
fn dechunk(mut s: &str) -> String {
    let mut out = String::new();
    while let Some((len, rest)) = s.split_once("\r\n") {
        let n = usize::from_str_radix(len.trim(), 16).unwrap_or(0);
        if n == 0 || rest.len() < n {
            break;
        }
        out += &rest[..n];
        s = rest[n..].trim_start_matches("\r\n");
    }
    out
}

/// A Prometheus server this test started; killed (by its PID) when dropped.
struct Prometheus {
    child: Child,
    addr: String,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Prometheus {
    /// Starts Prometheus scraping `api`'s `/metrics` every second with the
    /// bearer token in `token_file`, and waits until it is ready.
    fn start(dir: &Path, api: &str, token_file: &Path) -> Prometheus {
        let cfg = format!(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n\
             scrape_configs:\n  - job_name: freesan\n    metrics_path: /metrics\n\
             \x20   authorization:\n      type: Bearer\n      credentials_file: {}\n\
             \x20   static_configs:\n      - targets: ['{api}']\n",
            token_file.display()
        );
        let cfg_path = dir.join("prometheus.yml");
        std::fs::write(&cfg_path, cfg).unwrap();
        let addr = format!("127.0.0.1:{}", free_port());
        let log = std::fs::File::create(dir.join("prometheus.log")).unwrap();
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", cfg_path.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("tsdb").display()
            ))
            .arg(format!("--web.listen-address={addr}"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn prometheus");
        let mut p = Prometheus { child, addr };
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if http(&p.addr, "/-/ready", &[]).0 == 200 {
                return p;
            }
            assert!(
                p.child.try_wait().unwrap().is_none(),
                "prometheus exited: {}",
                std::fs::read_to_string(dir.join("prometheus.log")).unwrap_or_default()
            );
            assert!(Instant::now() < deadline, "prometheus not ready in 60 s");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The value of instant query `q`'s first series, if it has one.
    fn query(&self, q: &str) -> Option<f64> {
        let enc: String = q
            .bytes()
            .map(|b| match b {
                b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'_' | b'.' | b'-' => {
                    (b as char).to_string()
                }
                _ => format!("%{b:02X}"),
            })
            .collect();
        let (code, body) = http(&self.addr, &format!("/api/v1/query?query={enc}"), &[]);
        if code != 200 {
            return None;
        }
        let v: Value = serde_json::from_str(&body).ok()?;
        v["data"]["result"][0]["value"][1].as_str()?.parse().ok()
    }

    /// Polls `q` until `ok` holds for its value, for at most 60 s; returns it.
    fn await_value(&self, q: &str, ok: impl Fn(f64) -> bool) -> f64 {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(v) = self.query(q) {
                if ok(v) {
                    return v;
                }
            }
            assert!(
                Instant::now() < deadline,
                "Prometheus never answered {q} as expected (last: {:?})",
                self.query(q)
            );
            std::thread::sleep(Duration::from_millis(250));
        }
    }
}

fn config(dir: &Path) -> std::path::PathBuf {
    let mut s = config_head(dir, 2);
    s += "[[pool]]\nname = \"p\"\nlevel = \"raid1\"\nmembers = [\"d0\", \"d1\"]\n";
    s += &format!("[[target]]\niqn = \"{IQN}\"\n[[target.lun]]\npool = \"p\"\n");
    let path = dir.join("node.toml");
    std::fs::write(&path, s).unwrap();
    path
}

#[test]
fn prometheus_scrapes_lun_rates_and_pool_state() {
    if !have("prometheus") || !have("promtool") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path());
    let node = start_config(dir.path(), &cfg);
    let api = node.api.clone().expect("no API address in the banner");
    let data = dir.path().join("data");
    let (ok, out) = freesan(&[
        "api",
        "token",
        "create",
        "--role",
        "read-only",
        "--name",
        "prometheus",
        "--data-dir",
        data.to_str().unwrap(),
    ]);
    assert!(ok, "token create: {out}");
    let token = out
        .lines()
        .find(|l| l.starts_with("fsn_"))
        .unwrap_or_else(|| panic!("no token printed: {out}"))
        .to_string();
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, &token).unwrap();

    // no token, no metrics
    let (code, body) = http(&api, "/metrics", &[]);
    assert_eq!(code, 401, "/metrics without a token: {body}");
    assert!(!body.contains("freesan_"), "{body}");

    // the text passes promtool's checks
    let auth = format!("Authorization: Bearer {token}");
    let (code, text) = http(&api, "/metrics", &[&auth]);
    assert_eq!(code, 200, "{text}");
    for family in [
        "freesan_lun_commands_total",
        "freesan_lun_command_latency_seconds_bucket",
        "freesan_pool_state",
        "freesan_disk_operations_total",
        "freesan_disk_io_time_seconds_total",
        "freesan_iscsi_portal_sessions",
        "process_resident_memory_bytes",
        "freesan_build_info",
    ] {
        assert!(text.contains(family), "no {family} in:\n{text}");
    }
    let mut check = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn promtool");
    check
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = check.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool check metrics failed:\n{}{}\n{text}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );

    let prom = Prometheus::start(dir.path(), &api, &token_file);
    prom.await_value("up{job=\"freesan\"}", |v| v == 1.0);

    // reads on LUN 0 while Prometheus scrapes
    let mut bench = Command::new(env!("CARGO_BIN_EXE_freesan"))
        .args(["bench", "--target", &node.url(0, 0), "--single-path"])
        .args([
            "--bs",
            "4k",
            "--rw",
            "randread",
            "--threads",
            "2",
            "--qd",
            "4",
        ])
        .args(["--secs", "120", "--ramp", "0", "--quiet"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn bench");
    let read = "rate(freesan_lun_bytes_total{job=\"freesan\",lun=\"0\",direction=\"read\"}[5s])";
    let rate = prom.await_value(read, |v| v > 0.0);
    eprintln!("Prometheus sees LUN 0 read at {rate:.0} bytes/s");
    let ops = "rate(freesan_lun_commands_total{lun=\"0\",direction=\"read\"}[5s])";
    prom.await_value(ops, |v| v > 0.0);
    // and the pool's disks, timed: a mean read latency above zero
    let disk_latency = "sum(rate(freesan_disk_io_time_seconds_total{direction=\"read\"}[5s])) \
         / sum(rate(freesan_disk_io_completed_total{direction=\"read\"}[5s]))";
    let mean = prom.await_value(disk_latency, |v| v > 0.0);
    eprintln!(
        "Prometheus sees the disks' mean read latency at {:.1} us",
        mean * 1e6
    );
    // `freesan status` turns the same counters into a read rate
    let (ok, out) = freesan(&["status", "--api", &api]);
    assert!(ok, "freesan status: {out}");
    let io = out
        .lines()
        .find(|l| l.trim_start().starts_with("I/O"))
        .unwrap_or_else(|| panic!("no I/O line: {out}"));
    let read_iops: f64 = io
        .split("read ")
        .nth(1)
        .and_then(|r| r.split('(').nth(1))
        .and_then(|r| r.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no read IOPS in {io:?}"));
    assert!(read_iops > 0.0, "freesan status shows no reads: {io}");

    // the pool is optimal, then degraded once a member fails
    let state = |s: &str| format!("freesan_pool_state{{pool=\"p\",state=\"{s}\"}}");
    prom.await_value(&state("optimal"), |v| v == 1.0);
    let (ok, out) = freesan(&["pool", "--api", &api, "fail", "p", "1"]);
    assert!(ok, "pool fail: {out}");
    prom.await_value(&state("degraded"), |v| v == 1.0);
    prom.await_value(&state("optimal"), |v| v == 0.0);
    prom.await_value("freesan_pool_degraded_members{pool=\"p\"}", |v| v == 1.0);
    prom.await_value(
        "freesan_disk_state{pool=\"p\",position=\"1\",state=\"failed\"}",
        |v| v == 1.0,
    );

    let _ = bench.kill();
    let _ = bench.wait();
    drop(prom);
    drop(node);
}
