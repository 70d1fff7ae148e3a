//! Two `freesan serve` nodes of one HA cluster on loopback: the cluster's keys,
//! the two sync ports, each node's folder and the head of its config (data, API,
//! one portal, `[cluster]`), and the replica status the tests wait on.

use super::{freesan, Node};
use serde_json::Value;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// An HA pair's shared test state (nodes are started by each test, from
/// [`LoopbackPair::head`] and what the test adds to it).
pub struct LoopbackPair {
    pub dir: tempfile::TempDir,
    /// Each node's sync (replication) port.
    pub sync: [u16; 2],
    cluster: &'static str,
}

impl LoopbackPair {
    /// Keys for cluster `cluster` (`freesan cluster init`) and two free sync ports.
    pub fn new(cluster: &'static str) -> LoopbackPair {
        let dir = tempfile::tempdir().unwrap();
        let p = LoopbackPair {
            dir,
            sync: [super::free_port(), super::free_port()],
            cluster,
        };
        p.init_keys("keys");
        p
    }

    /// Writes another set of keys for a cluster of the same name into `sub`
    /// (an attacker's, say).
    pub fn init_keys(&self, sub: &str) {
        let (ok, out) = freesan(&[
            "cluster",
            "init",
            "--name",
            self.cluster,
            "--out",
            self.dir.path().join(sub).to_str().unwrap(),
        ]);
        assert!(ok, "cluster init: {out}");
    }

    /// Node `k`'s folder (1 or 2), created.
    pub fn node_dir(&self, k: usize) -> PathBuf {
        let d = self.dir.path().join(format!("n{k}"));
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    /// The head of node `k`'s config: data in its folder, API and one portal
    /// on ports the kernel picks (`portal_extra` lines added to the portal), and
    /// the cluster, reaching its partner's sync link at `peer_port` (normally
    /// the partner's, `self.sync[2 - k]`), with fast heartbeats.
    pub fn head(&self, k: usize, peer_port: u16, portal_extra: &str) -> String {
        format!(
            r#"data_dir = "{d}/data"
[api]
address = "127.0.0.1:0"
[[portal]]
address = "127.0.0.1:0"
{portal_extra}[cluster]
name = "{cluster}"
node_id = {k}
preferred_node = 1
sync = ["127.0.0.1:{s}"]
peer_sync = ["127.0.0.1:{peer_port}"]
heartbeat_interval_ms = 100
peer_timeout_ms = 800
client_heartbeats = false
key_file = "{keys}/node{k}.key"
"#,
            d = self.node_dir(k).display(),
            cluster = self.cluster,
            s = self.sync[k - 1],
            keys = self.dir.path().join("keys").display(),
        )
    }

    /// Writes `cfg` as node `k`'s config and returns its path.
    pub fn write_config(&self, k: usize, cfg: &str) -> PathBuf {
        let p = self.node_dir(k).join("node.toml");
        std::fs::write(&p, cfg).unwrap();
        p
    }

    /// Starts node `k` with the config at `cfg`, logging to `log` in its folder.
    pub fn start_config(&self, k: usize, cfg: &std::path::Path, log: &str) -> Node {
        Node::start(
            &[],
            &["--config".into(), cfg.display().to_string()],
            &self.node_dir(k).join(log),
        )
    }

    /// Starts node `k` (1 or 2): one portal and target [`super::IQN`] with one
    /// replicated 16M LUN, logging to `serve.log`.
    pub fn start_one_lun(&self, k: usize) -> Node {
        let cfg = self.head(k, self.sync[2 - k], "")
            + &format!(
                "[[target]]\niqn = \"{}\"\n[[target.lun]]\npath = \"{}/lun0.img\"\n\
                 size = \"16M\"\nreplicated = true\n",
                super::IQN,
                self.node_dir(k).display()
            );
        let cfg = self.write_config(k, &cfg);
        self.start_config(k, &cfg, "serve.log")
    }
}

/// LUN 0's replica status on `node` (`freesan replica status`).
pub fn replica_status(node: &Node) -> Value {
    let api = node.api.as_deref().expect("the node serves its API");
    let (ok, out) = freesan(&["replica", "status", "--api", api, "--json"]);
    assert!(ok, "replica status: {out}");
    let v: Value = serde_json::from_str(&out).unwrap();
    v[0].clone()
}

/// Waits (up to 60 s) until `f` holds for `node`'s replica status; returns it.
pub fn wait_for_replica(node: &Node, what: &str, f: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let s = replica_status(node);
        if f(&s) {
            return s;
        }
        assert!(
            Instant::now() < deadline,
            "{what} never happened: {s}\n{}",
            std::fs::read_to_string(&node.log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}
