//! Test harness: starts real `freesan serve` processes on loopback ports chosen by
//! the kernel, learns the ports from the banner, and runs outside clients.
#![allow(dead_code)]
pub mod netns;
pub mod pair;
pub mod scsi;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// The target name every harness node serves.
pub const IQN: &str = "iqn.2026-11.org.freesan:itest";

/// A running freesan process.
pub struct Node {
    pub child: Option<Child>,
    pub portals: Vec<String>,
    /// The NBD address from the banner, when serving NBD.
    pub nbd: Option<String>,
    /// The management API address from the banner, when serving it.
    pub api: Option<String>,
    pub log: PathBuf,
    log_thread: Option<std::thread::JoinHandle<()>>,
}

/// True when the named program is on PATH; under FREESAN_REQUIRE_TOOLS=1 (the test
/// command sets it) a missing program fails the test instead of skipping it.
pub fn have(tool: &str) -> bool {
    let found = Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {tool}"))
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if !found {
        assert!(
            std::env::var("FREESAN_REQUIRE_TOOLS").is_err(),
            "{tool} is required (scripts/test-all installs it)"
        );
        eprintln!("skipping: {tool} is not installed");
    }
    found
}

impl Node {
    /// An iSCSI session of `initiator_name` to target `IQN` through the first portal.
    pub async fn login(&self, initiator_name: &str) -> initiator::Session {
        let addr = self.portals[0].parse().unwrap();
        initiator::Session::login(addr, &initiator::LoginOptions::new(initiator_name, IQN))
            .await
            .expect("login")
    }

    /// Starts `freesan serve` with the given extra arguments, portals on port 0 of
    /// each address, and waits until its banner lists the portals.
    pub fn start(addrs: &[&str], args: &[String], log: &Path) -> Node {
        // the node refuses a configuration holding secrets (CHAP) that others
        // may read; the tests write theirs with the umask's 0644
        if let Some(i) = args.iter().position(|a| a == "--config") {
            if let Some(cfg) = args.get(i + 1) {
                make_private(Path::new(cfg));
            }
        }
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_freesan"));
        cmd.arg("serve");
        for a in addrs {
            cmd.arg("--portal").arg(format!("{a}:0"));
        }
        cmd.args(args);
        cmd.env("RUST_LOG", "info");
        cmd.stdout(Stdio::null()).stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("spawn freesan");
        let stderr = child.stderr.take().expect("stderr");
        let (tx, rx) = mpsc::channel();
        let log_path = log.to_path_buf();
        let log_thread = std::thread::spawn(move || {
            let mut out = std::fs::File::create(&log_path).expect("log file");
            let mut sent = false;
            let mut portals = Vec::new();
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                use std::io::Write;
                let _ = writeln!(out, "{line}");
                if let Some(p) = line.trim().strip_prefix("portal:") {
                    portals.push(p.trim().to_string());
                }
                if let Some(p) = line.trim().strip_prefix("nbd:") {
                    portals.push(format!("nbd={}", p.trim()));
                }
                if let Some(p) = line.trim().strip_prefix("api:") {
                    portals.push(format!("api={}", p.trim()));
                }
                if !sent && line.starts_with("connect with:") {
                    let _ = tx.send(portals.clone());
                    sent = true;
                }
            }
            if !sent {
                let _ = tx.send(Vec::new());
            }
        });
        let portals = rx
            .recv_timeout(Duration::from_secs(60))
            .expect("freesan printed no banner within 60 s");
        let nbd = portals
            .iter()
            .find_map(|p| p.strip_prefix("nbd=").map(str::to_string));
        let api = portals
            .iter()
            .find_map(|p| p.strip_prefix("api=").map(str::to_string));
        let portals: Vec<String> = portals
            .into_iter()
            .filter(|p| !p.starts_with("nbd=") && !p.starts_with("api="))
            .collect();
        assert!(
            !portals.is_empty(),
            "freesan exited before serving; log: {}",
            std::fs::read_to_string(log).unwrap_or_default()
        );
        Node {
            child: Some(child),
            portals,
            nbd,
            api,
            log: log.to_path_buf(),
            log_thread: Some(log_thread),
        }
    }

    /// `iscsi://PORTAL/IQN/LUN` for portal `i`.
    pub fn url(&self, i: usize, lun: u32) -> String {
        format!("iscsi://{}/{}/{}", self.portals[i], IQN, lun)
    }

    /// SIGKILL: no chance to flush anything.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM and wait (up to 10 s) for the exit; returns whether it exited cleanly.
    pub fn terminate(&mut self) -> bool {
        let Some(mut c) = self.child.take() else {
            return false;
        };
        let pid = c.id() as i32;
        unsafe {
            libc::kill(pid, libc::SIGTERM);
        }
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(c.wait().map(|s| s.success()).unwrap_or(false));
        });
        match rx.recv_timeout(Duration::from_secs(10)) {
            Ok(ok) => {
                // the process is gone: its log is complete once the reader sees EOF
                if let Some(t) = self.log_thread.take() {
                    let _ = t.join();
                }
                ok
            }
            Err(_) => {
                unsafe {
                    libc::kill(pid, libc::SIGKILL);
                }
                false
            }
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// Runs a program and returns (success, stdout + stderr).
pub fn run(prog: &str, args: &[&str]) -> (bool, String) {
    let out = Command::new(prog).args(args).output().expect("run client");
    let mut s = String::from_utf8_lossy(&out.stdout).into_owned();
    s.push_str(&String::from_utf8_lossy(&out.stderr));
    (out.status.success(), s)
}

/// Starts `freesan bench --verify` random writes of `bs` against `url` (one path,
/// `threads` x 8 in flight, `secs` seconds) that keep their verification state in
/// `state`, and returns once the first checkpoint of acknowledged writes exists,
/// i.e. with the run in full swing.
pub fn start_verified_writes(url: &str, state: &Path, bs: &str, threads: u32, secs: u32) -> Child {
    let mut bench = Command::new(env!("CARGO_BIN_EXE_freesan"))
        .args([
            "bench",
            "--target",
            url,
            "--single-path",
            "--bs",
            bs,
            "--rw",
            "randwrite",
        ])
        .args([
            "--threads",
            &threads.to_string(),
            "--qd",
            "8",
            "--secs",
            &secs.to_string(),
        ])
        .args(["--ramp", "0", "--verify", "--quiet", "--verify-state"])
        .arg(state)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn bench");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !state.exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "bench wrote no verification state"
        );
        assert!(
            bench.try_wait().unwrap().is_none(),
            "bench exited before its first checkpoint"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    bench
}

/// Runs this build's `freesan` with `args`; returns (success, stdout + stderr).
/// `freesan pool status NAME --json` through the API at `api`.
pub fn pool_status(api: &str, name: &str) -> serde_json::Value {
    let (ok, out) = freesan(&["pool", "--api", api, "status", name, "--json"]);
    assert!(ok, "{out}");
    let v: serde_json::Value = serde_json::from_str(&out).expect("status json");
    if v.is_array() {
        v[0].clone()
    } else {
        v
    }
}

pub fn freesan(args: &[&str]) -> (bool, String) {
    run(env!("CARGO_BIN_EXE_freesan"), args)
}

/// `freesan WHAT --api API ARGS...` (`args[0]` is WHAT); returns (success, output).
pub fn cli(api: &str, args: &[&str]) -> (bool, String) {
    let mut all = vec![args[0], "--api", api];
    all.extend_from_slice(&args[1..]);
    freesan(&all)
}

/// Waits (up to 30 s) for an event of the node at `api` that `want` picks, read
/// through `freesan events --json`; returns it.
pub fn await_event(api: &str, want: impl Fn(&serde_json::Value) -> bool) -> serde_json::Value {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let (ok, out) = cli(api, &["events", "--json"]);
        assert!(ok, "{out}");
        if let Some(e) = out
            .lines()
            .map(|l| {
                serde_json::from_str::<serde_json::Value>(l)
                    .unwrap_or_else(|e| panic!("not an event ({e}): {l}"))
            })
            .find(|e| want(e))
        {
            return e;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the awaited event did not come: {out}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The node's log once it holds `what`, waited for (at most 20 s): a node
/// answers a client and logs why from its own threads, so the line may land
/// after the client saw the answer.
pub fn await_log(log: &Path, what: &str) -> String {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        if text.contains(what) {
            return text;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the log never said {what:?}: {text}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A loopback port nobody listens on now (the caller binds it later). Taken
/// below the kernel's ephemeral range (32768 and up), from a counter this test
/// process owns: a port the kernel picked (another test's `:0` listener, or a
/// connection's source port) could be taken again before the caller binds it,
/// which failed a CI run ("binding the sync addresses: Address already in use").
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let start = std::process::id() % 1_000 * 10;
    for _ in 0..10_000 {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let port = (20_000 + (start + n) % 12_000) as u16;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free loopback port under 32000");
}

/// A node config with an API and a portal on ports the kernel picks, data under
/// `dir`, and target IQN with one 16M file LUN (`dir/lun0.img`); returns its path.
pub fn one_file_lun_config(dir: &Path) -> PathBuf {
    let s = format!(
        "data_dir = \"{d}/data\"\n[api]\naddress = \"127.0.0.1:0\"\n[[portal]]\naddress = \"127.0.0.1:0\"\n\
         [[target]]\niqn = \"{IQN}\"\n[[target.lun]]\npath = \"{d}/lun0.img\"\nsize = \"16M\"\n",
        d = dir.display()
    );
    let path = dir.join("node.toml");
    std::fs::write(&path, s).unwrap();
    path
}

/// The head of a node config: data under `dir`, API and one portal on ports the
/// kernel picks, and `disks` file disks `d0..` of 64M in `dir`.
/// A node on 127.0.0.1 serving target `IQN` with one LUN on the file
/// `DIR/lun0.img` (created at `size` when missing), its data directory
/// `DIR/data`, its log in `DIR/LOG`.
pub fn start_file_lun(dir: &Path, size: &str, log: &str) -> Node {
    let lun = format!("{}:{size}", dir.join("lun0.img").display());
    Node::start(
        &["127.0.0.1"],
        &[
            "--target".into(),
            IQN.into(),
            "--lun".into(),
            lun,
            "--data-dir".into(),
            dir.join("data").display().to_string(),
        ],
        &dir.join(log),
    )
}

pub fn config_head(dir: &Path, disks: usize) -> String {
    config_head_with(dir, disks, "")
}

/// [`config_head`] with `disk_extra` (lines) in every disk's section.
pub fn config_head_with(dir: &Path, disks: usize, disk_extra: &str) -> String {
    let mut s = format!(
        "data_dir = \"{d}/data\"\n[api]\naddress = \"127.0.0.1:0\"\n[[portal]]\naddress = \"127.0.0.1:0\"\n",
        d = dir.display()
    );
    for i in 0..disks {
        s += &format!(
            "[[disk]]\nname = \"d{i}\"\nsize = \"64M\"\npath = \"{}/d{i}.img\"\n{disk_extra}",
            dir.display()
        );
    }
    s
}

/// Runs `freesan serve --config CFG` expecting it to refuse to start (at most
/// 30 s, so a node that starts after all ends the test instead of hanging it);
/// returns (exited with success, output).
pub fn serve_expecting_refusal(cfg: &Path) -> (bool, String) {
    let cfg = cfg.display().to_string();
    run(
        "timeout",
        &[
            "30",
            env!("CARGO_BIN_EXE_freesan"),
            "serve",
            "--config",
            &cfg,
        ],
    )
}

/// Makes `path` readable by its owner only (mode 0600), as files holding
/// secrets must be for the node to read them.
pub fn make_private(path: &Path) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .unwrap_or_else(|e| panic!("chmod 600 {}: {e}", path.display()));
}

/// Starts `freesan serve --config CFG`, logging to `dir/serve.log`.
pub fn start_config(dir: &Path, cfg: &Path) -> Node {
    Node::start(
        &[],
        &["--config".into(), cfg.display().to_string()],
        &dir.join("serve.log"),
    )
}

/// `freesan bench check` of the LUN at `url` against the verification state a
/// `bench --verify --verify-state` run left; returns (success, output).
pub fn bench_check(url: &str, state: &Path) -> (bool, String) {
    bench_check_with(url, state, &[])
}

/// [`bench_check`] with extra options (e.g. `--in-flight-may-be-torn`).
pub fn bench_check_with(url: &str, state: &Path, extra: &[&str]) -> (bool, String) {
    let state = state.to_str().expect("utf-8 state path");
    let mut args = vec![
        "bench",
        "check",
        "--single-path",
        "--target",
        url,
        "--verify-state",
        state,
    ];
    args.extend_from_slice(extra);
    freesan(&args)
}

/// Asserts that every block acknowledged by the run behind `state` reads back
/// correctly from `url`; `what` names the situation in the failure message.
pub fn assert_acknowledged_writes_intact(url: &str, state: &Path, what: &str) {
    let (ok, out) = bench_check(url, state);
    assert!(ok, "{what}: acknowledged writes lost: {out}");
    assert!(
        out.contains("every acknowledged block reads back correctly"),
        "{what}: {out}"
    );
}

/// One raw HTTP/1.1 request; returns (status, body). Status 0: closed unanswered.
pub fn http(api: &str, method: &str, path: &str, headers: &[&str], body: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(api).expect("connect to the API");
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    if !headers
        .iter()
        .any(|h| h.to_ascii_lowercase().starts_with("host:"))
    {
        req += &format!("Host: {api}\r\n");
    }
    for h in headers {
        req += h;
        req += "\r\n";
    }
    req += "\r\n";
    req += body;
    let _ = s.write_all(req.as_bytes());
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    let out = String::from_utf8_lossy(&out).into_owned();
    let code = out.get(9..12).and_then(|c| c.parse().ok()).unwrap_or(0);
    let body = out.split("\r\n\r\n").nth(1).unwrap_or_default().to_string();
    (code, body)
}

/// `GET /metrics` of the node at `api` whose data directory is `data`, with a
/// new read-only token: the exposition text.
pub fn scrape_metrics(api: &str, data: &Path) -> String {
    let token = make_token(data, "read-only", "metrics");
    let (code, text) = http(
        api,
        "GET",
        "/metrics",
        &[&format!("Authorization: Bearer {token}")],
        "",
    );
    assert_eq!(code, 200, "{text}");
    text
}

/// The value of the first sample of `text` whose line starts with `series`
/// (a family name, with its labels or their opening brace) and contains `with`.
pub fn metric_sample(text: &str, series: &str, with: &str) -> f64 {
    text.lines()
        .find(|l| l.starts_with(series) && l.contains(with))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or_else(|| panic!("no {series} with {with:?} in:\n{text}"))
}

/// `freesan api token create` for the node whose data directory is `data`: the token.
pub fn make_token(data: &Path, role: &str, name: &str) -> String {
    let d = data.to_str().unwrap();
    let (ok, out) = freesan(&[
        "api",
        "token",
        "create",
        "--role",
        role,
        "--name",
        name,
        "--data-dir",
        d,
    ]);
    assert!(ok, "token create: {out}");
    out.lines()
        .find(|l| l.starts_with("fsn_"))
        .unwrap_or_else(|| panic!("no token printed: {out}"))
        .to_string()
}
