//! Events and alerts on a real HA pair: node 1 has a RAID 1 pool with a hot
//! spare, a write-back SSD cache over it, and a replicated LUN shared with node
//! 2. The test fails a pool member, an SSD of the cache, and SIGKILLs node 2;
//! each event arrives once at a webhook receiver and once at an SMTP sink (both
//! run by the test on loopback), with the right severity, and nothing below
//! `min_severity` is delivered. Node 1 is then SIGKILLed and restarted: its
//! event log still holds every event, and new events get higher sequence numbers.

use crate::common;
use common::pair::{wait_for_replica, LoopbackPair};
use common::{freesan, metric_sample, scrape_metrics, IQN};
use serde_json::Value;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const CLUSTER: &str = "ev";
/// Node 1's pool: two members and a hot spare (the restart keeps this config:
/// the pool comes up on the spare and leaves the replaced d0 out).
const BEFORE: &str = "members = [\"d0\", \"d1\"]\nspares = [\"d2\"]";

/// What a receiver got: (kind, severity, object) per delivery.
type Got = Arc<Mutex<Vec<(String, String, String)>>>;

/// A loopback listener whose connections `conn` serves, each on a thread of
/// its own, recording what it receives: (address, what was received).
fn receiver(conn: fn(TcpStream, Got)) -> (String, Got) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let got: Got = Arc::default();
    let g = got.clone();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(s) = s else { continue };
            let g = g.clone();
            std::thread::spawn(move || conn(s, g));
        }
    });
    (addr, got)
}

/// A minimal HTTP/1.1 server: every POST body (a JSON event) is recorded and
/// answered 200.
fn webhook_receiver() -> (String, Got) {
    let (addr, got) = receiver(http_conn);
    (format!("http://{addr}/hook"), got)
}

fn http_conn(s: TcpStream, got: Got) {
    let mut r = BufReader::new(s.try_clone().unwrap());
    let mut w = s;
    loop {
        let mut len = 0usize;
        let mut first = true;
        loop {
            let mut line = String::new();
            if r.read_line(&mut line).unwrap_or(0) == 0 {
                return;
            }
            if first {
                assert!(line.starts_with("POST /hook "), "webhook request: {line}");
                first = false;
            }
            let l = line.trim_end();
            if l.is_empty() {
                break;
            }
            if let Some((k, v)) = l.split_once(':') {
                if k.eq_ignore_ascii_case("content-length") {
                    len = v.trim().parse().unwrap();
                }
            }
        }
        let mut body = vec![0; len];
        r.read_exact(&mut body).unwrap();
        let e: Value = serde_json::from_slice(&body).expect("webhook body is a JSON event");
        got.lock().unwrap().push((
            e["kind"].as_str().unwrap().to_string(),
            e["severity"].as_str().unwrap().to_string(),
            e["object"].as_str().unwrap().to_string(),
        ));
        w.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
            .unwrap();
    }
}

/// A minimal SMTP server: records each message's subject
/// (`[freesan SEVERITY] KIND OBJECT: message`).
fn smtp_sink() -> (String, Got) {
    receiver(smtp_conn)
}

fn smtp_conn(s: TcpStream, got: Got) {
    let mut r = BufReader::new(s.try_clone().unwrap());
    let mut w = s;
    w.write_all(b"220 sink ESMTP\r\n").unwrap();
    loop {
        let mut line = String::new();
        if r.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        let cmd = line.trim_end().to_ascii_uppercase();
        if cmd.starts_with("EHLO") || cmd.starts_with("HELO") {
            w.write_all(b"250-sink\r\n250 8BITMIME\r\n").unwrap();
        } else if cmd.starts_with("DATA") {
            w.write_all(b"354 go on\r\n").unwrap();
            let mut msg = String::new();
            loop {
                let mut l = String::new();
                if r.read_line(&mut l).unwrap_or(0) == 0 {
                    return;
                }
                if l == ".\r\n" {
                    break;
                }
                msg += &l;
            }
            // headers end at the first empty line; unfold them
            let head = msg.split("\r\n\r\n").next().unwrap().replace("\r\n ", " ");
            let subject = head
                .lines()
                .find_map(|l| l.strip_prefix("Subject: "))
                .expect("mail has a subject")
                .to_string();
            // [freesan critical] disk_failed d0: ...
            let rest = subject.strip_prefix("[freesan ").expect(&subject);
            let (sev, rest) = rest.split_once("] ").expect(&subject);
            let (kind, rest) = rest.split_once(' ').expect(&subject);
            let (object, _) = rest.split_once(": ").expect(&subject);
            got.lock()
                .unwrap()
                .push((kind.to_string(), sev.to_string(), object.to_string()));
            w.write_all(b"250 queued\r\n").unwrap();
        } else if cmd.starts_with("QUIT") {
            let _ = w.write_all(b"221 bye\r\n");
            return;
        } else {
            // MAIL, RCPT, RSET, NOOP
            w.write_all(b"250 ok\r\n").unwrap();
        }
    }
}

struct Pair {
    p: LoopbackPair,
    webhook: String,
    smtp: String,
}

impl Pair {
    /// Node 1: pool, spare, write-back cache (LUN 0) and the replicated LUN 1,
    /// with alerts; node 2: a file LUN 0 and the replicated LUN 1.
    /// `members`: node 1's pool members and spares.
    fn start(&self, k: usize, members: &str) -> common::Node {
        let d = self.p.node_dir(k);
        let mut cfg = self.p.head(k, self.p.sync[2 - k], "");
        let lun0 = if k == 1 {
            cfg += &format!(
                r#"[alerts]
webhook = ["{w}"]
min_severity = "warning"
[alerts.smtp]
server = "{m}"
from = "freesan@example.org"
to = ["ops@example.org"]
"#,
                w = self.webhook,
                m = self.smtp
            );
            for (name, size) in [
                ("d0", "64M"),
                ("d1", "64M"),
                ("d2", "64M"),
                ("ssd0", "40M"),
                ("ssd1", "40M"),
            ] {
                cfg += &format!(
                    "[[disk]]\nname = \"{name}\"\nsize = \"{size}\"\npath = \"{}/{name}.img\"\n",
                    d.display()
                );
            }
            cfg += &format!("[[pool]]\nname = \"p\"\nlevel = \"raid1\"\n{members}\n");
            cfg += "[[cache]]\nname = \"c\"\npool = \"p\"\nmode = \"write-back\"\ndevices = [\"ssd0\", \"ssd1\"]\n\
                    size = \"32M\"\nblock_size = \"64K\"\n";
            "cache = \"c\"\n".to_string()
        } else {
            format!("path = \"{}/lun0.img\"\nsize = \"16M\"\n", d.display())
        };
        cfg += &format!(
            "[[target]]\niqn = \"{IQN}\"\n[[target.lun]]\n{lun0}[[target.lun]]\npath = \"{}/lun1.img\"\nsize = \"16M\"\nreplicated = true\n",
            d.display()
        );
        let cfg = self.p.write_config(k, &cfg);
        self.p
            .start_config(k, &cfg, &format!("serve{}.log", now_ms()))
    }
}

fn now_ms() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis()
}

fn api(node: &common::Node) -> &str {
    node.api.as_deref().expect("the node serves its API")
}

/// Runs `freesan ARGS --api API`, expecting success; returns its output.
fn cli(node: &common::Node, args: &[&str]) -> String {
    let mut all = vec![args[0], "--api", api(node)];
    all.extend_from_slice(&args[1..]);
    let (ok, out) = freesan(&all);
    assert!(ok, "freesan {args:?}: {out}");
    out
}

/// Waits (up to 60 s) until `f` holds for `node`'s replica status of LUN 1.
fn wait_replica(node: &common::Node, what: &str, f: impl Fn(&Value) -> bool) {
    wait_for_replica(node, what, f);
}

/// The node's event log through `freesan events --json`.
fn events(node: &common::Node) -> Vec<Value> {
    cli(node, &["events", "--json"])
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// Waits (up to 60 s) until both receivers hold every `(kind, severity, object)`.
fn wait_delivered(hook: &Got, mail: &Got, want: &[(&str, &str, &str)], log: &Path) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let has = |g: &Got| {
            let g = g.lock().unwrap();
            want.iter().all(|(k, s, o)| {
                g.iter()
                    .any(|(k2, s2, o2)| k2 == k && s2 == s && o2.as_str() == *o)
            })
        };
        if has(hook) && has(mail) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "not delivered: {want:?}\nwebhook: {:?}\nmail: {:?}\n{}",
            hook.lock().unwrap(),
            mail.lock().unwrap(),
            std::fs::read_to_string(log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn failures_reach_webhook_and_mail_once_and_the_log_survives_a_restart() {
    let (webhook, hook) = webhook_receiver();
    let (smtp, mail) = smtp_sink();
    let pair = Pair {
        p: LoopbackPair::new(CLUSTER),
        webhook,
        smtp,
    };
    let mut n1 = pair.start(1, BEFORE);
    let mut n2 = pair.start(2, "");
    for n in [&n1, &n2] {
        wait_replica(n, "in sync", |s| s["state"] == "in-sync");
    }

    // a pool member fails: the hot spare takes its place and is rebuilt
    cli(&n1, &["pool", "fail", "p", "0"]);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let p: Value = serde_json::from_str(&cli(&n1, &["pool", "status", "p", "--json"])).unwrap();
        if p["state"] == "optimal" {
            break;
        }
        assert!(Instant::now() < deadline, "rebuild never finished: {p}");
        std::thread::sleep(Duration::from_millis(50));
    }
    // an SSD of the write-back cache fails: the cache goes write-through
    cli(&n1, &["cache", "fail", "c", "0"]);
    // the partner dies
    let killed_ms = now_ms() as u64;
    n2.kill9();
    wait_replica(&n1, "the partner's loss noticed", |s| s["peer"].is_null());

    let want = [
        ("disk_failed", "critical", "d0"),
        ("spare_pulled_in", "warning", "d2"),
        ("cache_device_failed", "critical", "c/ssd0"),
        ("cache_write_through", "warning", "c"),
        ("partner_lost", "critical", &format!("{CLUSTER}/{IQN}/lun1")),
    ];
    wait_delivered(&hook, &mail, &want, &n1.log);
    // the failover is in the replica's status and in the metrics: node 1 (the
    // preferred node) serves alone, once, since the kill
    let r = wait_for_replica(&n1, "node 1 serving alone", |s| s["role"] == "solo");
    assert_eq!(r["failovers"], 1, "{r}");
    let at = r["last_failover_ms"].as_u64().expect("a failover time");
    assert!(at >= killed_ms && at <= now_ms() as u64, "{r}");
    let text = scrape_metrics(api(&n1), &pair.p.node_dir(1).join("data"));
    let sample = |name: &str| metric_sample(&text, name, "lun1");
    assert_eq!(sample("freesan_replica_failovers_total{"), 1.0);
    assert_eq!(
        (sample("freesan_replica_last_failover_timestamp_seconds{") * 1e3).round() as u64,
        at
    );
    // `freesan status` shows them among its alerts
    let status = cli(&n1, &["status"]);
    let alerts: Vec<&str> = status
        .lines()
        .skip_while(|l| !l.trim_start().starts_with("alerts"))
        .skip(1)
        .take_while(|l| l.starts_with("    "))
        .collect();
    assert!(
        alerts.len() >= want.len() && alerts.iter().any(|l| l.contains(" critical ")),
        "{status}"
    );

    // node 1 dies too (no clean shutdown): nothing more can be delivered now
    n1.kill9();
    for (name, g) in [("webhook", &hook), ("mail", &mail)] {
        let g = g.lock().unwrap();
        for (k, s, o) in &want {
            let n = g.iter().filter(|(k2, _, o2)| k2 == k && o2 == o).count();
            assert_eq!(n, 1, "{name}: {k} {o} delivered {n} times: {g:?}");
            assert!(g.iter().any(|(k2, s2, _)| k2 == k && s2 == s));
        }
        // below min_severity = warning: never delivered
        for (k, s, _) in g.iter() {
            assert_ne!(s, "info", "{name}: info event {k} delivered");
        }
    }

    // the event log survives the SIGKILL; new events continue its numbering
    let n1 = pair.start(1, BEFORE);
    let log = events(&n1);
    let mut last_before = 0;
    for (k, s, o) in &want {
        let e = log
            .iter()
            .find(|e| e["kind"] == *k && e["object"] == *o)
            .unwrap_or_else(|| panic!("{k} {o} not in the log after restart: {log:?}"));
        assert_eq!(e["severity"], *s);
        last_before = last_before.max(e["seq"].as_u64().unwrap());
    }
    for k in ["rebuild_started", "rebuild_finished"] {
        assert!(
            log.iter()
                .any(|e| e["kind"] == k && e["object"] == "p" && e["severity"] == "info"),
            "{k} not in the log: {log:?}"
        );
    }
    let started: Vec<u64> = log
        .iter()
        .filter(|e| e["kind"] == "node_started")
        .map(|e| e["seq"].as_u64().unwrap())
        .collect();
    assert_eq!(started.len(), 2, "one node_started per start: {log:?}");
    assert!(
        started[1] > last_before,
        "new events are numbered after the old"
    );
    let seqs: Vec<u64> = log.iter().map(|e| e["seq"].as_u64().unwrap()).collect();
    assert!(
        seqs.windows(2).all(|w| w[1] == w[0] + 1),
        "gapless: {seqs:?}"
    );
    // --since shows only what came after
    let after: Vec<Value> = cli(
        &n1,
        &["events", "--json", "--since", &last_before.to_string()],
    )
    .lines()
    .map(|l| serde_json::from_str(l).unwrap())
    .collect();
    assert!(after
        .iter()
        .all(|e| e["seq"].as_u64().unwrap() > last_before));
    assert!(after.iter().any(|e| e["kind"] == "node_started"));
}

/// One POST the signed receiver got: the event, and whether its signature and
/// timestamp checked out.
#[derive(Debug, Clone)]
struct Signed {
    seq: u64,
    kind: String,
    message: String,
    valid: bool,
}

/// Serves webhook POSTs on `l`, checking each one's signature against
/// `secret` (HMAC-SHA256 of `TIMESTAMP.BODY`, the timestamp within 5 minutes
/// of now), as a receiver of the node's alerts would.
fn signed_receiver(l: TcpListener, secret: &'static [u8]) -> Arc<Mutex<Vec<Signed>>> {
    use hmac::Mac;
    let got: Arc<Mutex<Vec<Signed>>> = Arc::default();
    let g = got.clone();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(s) = s else { continue };
            let g = g.clone();
            std::thread::spawn(move || {
                let mut r = BufReader::new(s.try_clone().unwrap());
                let mut w = s;
                loop {
                    let (mut len, mut ts, mut sig) = (0usize, None::<String>, None::<String>);
                    loop {
                        let mut line = String::new();
                        if r.read_line(&mut line).unwrap_or(0) == 0 {
                            return;
                        }
                        let l = line.trim_end();
                        if l.is_empty() {
                            break;
                        }
                        if let Some((k, v)) = l.split_once(':') {
                            let v = v.trim().to_string();
                            match k.to_ascii_lowercase().as_str() {
                                "content-length" => len = v.parse().unwrap(),
                                "x-freesan-timestamp" => ts = Some(v),
                                "x-freesan-signature" => sig = Some(v),
                                _ => {}
                            }
                        }
                    }
                    let mut body = vec![0; len];
                    r.read_exact(&mut body).unwrap();
                    let valid = match (&ts, &sig) {
                        (Some(ts), Some(sig)) => {
                            let mut mac =
                                hmac::Hmac::<sha2::Sha256>::new_from_slice(secret).unwrap();
                            mac.update(ts.as_bytes());
                            mac.update(b".");
                            mac.update(&body);
                            let want =
                                format!("sha256={}", hex::encode(mac.finalize().into_bytes()));
                            let age = (now_ms() / 1000) as i64 - ts.parse::<i64>().unwrap_or(0);
                            *sig == want && age.abs() < 300
                        }
                        _ => false,
                    };
                    let e: Value = serde_json::from_slice(&body).expect("a JSON event");
                    g.lock().unwrap().push(Signed {
                        seq: e["seq"].as_u64().unwrap(),
                        kind: e["kind"].as_str().unwrap().to_string(),
                        message: e["message"].as_str().unwrap().to_string(),
                        valid,
                    });
                    w.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
                        .unwrap();
                }
            });
        }
    });
    got
}

/// Waits (up to 60 s) until the receiver holds an event `f` accepts.
fn wait_signed(got: &Arc<Mutex<Vec<Signed>>>, what: &str, log: &Path, f: impl Fn(&Signed) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !got.lock().unwrap().iter().any(&f) {
        assert!(
            Instant::now() < deadline,
            "never delivered: {what}\ngot: {:?}\n{}",
            got.lock().unwrap(),
            std::fs::read_to_string(log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Waits (up to 30 s) until the node's delivery cursor for the webhook has
/// reached `seq`: the node counts the event as delivered, so a SIGKILL now
/// cannot make the next start send it again (at least once, not at most once:
/// a kill before the cursor's write may repeat it, which this test is not about).
fn wait_cursor(data: &Path, seq: u64) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let cur: Option<u64> = std::fs::read(data.join("alerts-delivered.json"))
            .ok()
            .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
            .and_then(|v| v.as_object()?.values().filter_map(Value::as_u64).max());
        if cur.is_some_and(|c| c >= seq) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "cursor stays at {cur:?}, not {seq}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A webhook that is down when an event happens and the node is then killed:
/// after the restart the event still arrives, once, signed; a further restart
/// does not send it again (the delivery cursor survives).
#[test]
fn an_undelivered_event_is_sent_after_a_restart_once_and_signed() {
    const SECRET: &[u8] = b"webhook-secret-for-the-test-0123";
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // the receiver's port, with nothing listening on it until the node is down
    let port = common::free_port();
    std::fs::write(d.join("hook.key"), [SECRET, b"\n"].concat()).unwrap();
    common::make_private(&d.join("hook.key"));
    let mut cfg = common::config_head(d, 2);
    cfg += &format!(
        "[alerts]\nwebhook = [\"http://127.0.0.1:{port}/hook\"]\nwebhook_secret_file = \"hook.key\"\n\
         [[pool]]\nname = \"p\"\nlevel = \"raid1\"\nmembers = [\"d0\", \"d1\"]\n\
         [[target]]\niqn = \"{IQN}\"\n[[target.lun]]\npool = \"p\"\n"
    );
    let cfg_path = d.join("node.toml");
    std::fs::write(&cfg_path, cfg).unwrap();
    let start = |i: u32| {
        common::Node::start(
            &[],
            &["--config".into(), cfg_path.display().to_string()],
            &d.join(format!("serve{i}.log")),
        )
    };
    let mut node = start(1);
    let api = node.api.clone().expect("an API");
    let (ok, out) = common::cli(&api, &["pool", "fail", "p", "0"]);
    assert!(ok, "{out}");
    // the watcher looks at the pool once a second: await the event
    let failed = common::await_event(&api, |e| e["kind"] == "disk_failed");
    let seq = failed["seq"].as_u64().unwrap();
    // the first attempt failed (nothing listens): await its log line
    let deadline = Instant::now() + Duration::from_secs(30);
    while !std::fs::read_to_string(&node.log)
        .unwrap_or_default()
        .lines()
        .any(|l| l.contains("webhook not reached") && l.contains(&format!("seq={seq} ")))
    {
        assert!(Instant::now() < deadline, "no failed attempt logged");
        std::thread::sleep(Duration::from_millis(20));
    }
    node.kill9();

    let got = signed_receiver(TcpListener::bind(("127.0.0.1", port)).unwrap(), SECRET);
    let mut node = start(2);
    wait_signed(&got, "the event from before the restart", &node.log, |s| {
        s.seq == seq
    });
    // the second start says the member is still failed: a new event, after it
    wait_signed(
        &got,
        "the standing failure at the second start",
        &node.log,
        |s| s.kind == "disk_failed" && s.seq > seq,
    );
    let second = got.lock().unwrap().iter().map(|s| s.seq).max().unwrap();
    wait_cursor(&d.join("data"), second);
    node.kill9();
    let mut node = start(3);
    wait_signed(
        &got,
        "the standing failure at the third start",
        &node.log,
        |s| s.kind == "disk_failed" && s.seq > second,
    );
    node.kill9();
    let got = got.lock().unwrap().clone();
    let first: Vec<&Signed> = got.iter().filter(|s| s.seq == seq).collect();
    assert_eq!(first.len(), 1, "delivered once: {got:?}");
    assert_eq!(first[0].message, failed["message"].as_str().unwrap());
    let mut seqs: Vec<u64> = got.iter().map(|s| s.seq).collect();
    seqs.dedup();
    assert_eq!(seqs.len(), got.len(), "no event twice: {got:?}");
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "in order: {got:?}");
    assert!(got.iter().all(|s| s.valid), "every POST signed: {got:?}");
}
