//! Two-node HA topology in Linux network namespaces, for integration tests.
//!
//! [`Topology::create`] builds four namespaces named after a short per-test prefix
//! (tests in one binary run in parallel, so each test passes its own prefix):
//!
//! | namespace     | role                                   |
//! |---------------|----------------------------------------|
//! | `{prefix}-cl` | client (initiators)                    |
//! | `{prefix}-n1` | storage node 1                         |
//! | `{prefix}-n2` | storage node 2                         |
//! | `{prefix}-wi` | witness (quorum tie breaker)           |
//!
//! and links them with veth pairs created directly inside the namespaces, so no
//! interface ever appears in (or touches) the host's own namespace and names only
//! need to be unique per namespace.
//!
//! Address plan (every link its own /24; the namespaces isolate parallel tests
//! from each other, so the plan is the same for every prefix):
//!
//! | link                                 | subnet         | addresses              | interface names         |
//! |--------------------------------------|----------------|------------------------|-------------------------|
//! | client path `j` to node `k`          | `10.k.j.0/24`  | client `.1`, node `.2` | client `n{k}p{j}`, node `cl{j}` |
//! | sync link `l` (n1 <-> n2)            | `10.100.l.0/24`| n1 `.1`, n2 `.2`       | `sy{l}` on both nodes   |
//! | witness link to node `k`             | `10.200.k.0/24`| witness `.1`, node `.2`| witness `n{k}`, node `wi` |
//!
//! Nodes are numbered 1 and 2, client paths and sync links from 1. No namespace
//! has a default route, so an address is reachable only over the link whose
//! subnet it is on: cutting a link really cuts that path. The one exception is
//! the client network: the client namespace forwards, and node `k` routes
//! `10.{3-k}.j.0/24` via the client on its path `j`, so the two nodes reach each
//! other's portal `j` over their client links `j` (as on one switched client
//! network; heartbeats run there) and never over a sync or witness link.
//!
//! Shaping ([`TopologyOptions::client_link_rate_mbit`]): a token bucket
//! (`tc qdisc add dev IF root tbf rate {r}mbit burst 256kb latency 50ms`) on both
//! ends of every client link, i.e. egress in each direction. 256 KiB of burst is
//! four 64 KiB GSO segments, enough to sustain 1 Gbit/s with high-resolution
//! timers; 50 ms of latency bounds the queue (about 6 MB at 1 Gbit/s) before tbf
//! drops.
//!
//! Processes run in a namespace with `ip netns exec NS PROGRAM ARGS...`, which
//! execs the program, so the [`Child`]'s PID is the program's own. Dropping the
//! topology SIGKILLs (by PID) whatever still runs inside its namespaces, then
//! deletes them, which also removes the veths; this runs on panic as well.

use std::ffi::OsStr;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpStream};
use std::os::unix::fs::MetadataExt;
use std::os::unix::io::AsRawFd;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

/// tbf burst on shaped client links (see the module docs).
pub const TBF_BURST: &str = "256kb";
/// tbf latency on shaped client links (see the module docs).
pub const TBF_LATENCY: &str = "50ms";

/// Serialises `ip netns add/del`: concurrent first uses race on making
/// `/run/netns` a shared mount.
static NETNS_LOCK: Mutex<()> = Mutex::new(());

/// What [`Topology::create`] builds.
#[derive(Clone, Debug)]
pub struct TopologyOptions {
    /// Client <-> node veths per node (paths of the multipath initiator); 1..=99.
    pub client_links_per_node: u32,
    /// n1 <-> n2 veths for replication; 0..=99.
    pub sync_links: u32,
    /// When set, tbf-shape both ends of every client link to this many Mbit/s.
    pub client_link_rate_mbit: Option<u32>,
}

impl Default for TopologyOptions {
    fn default() -> Self {
        TopologyOptions {
            client_links_per_node: 2,
            sync_links: 1,
            client_link_rate_mbit: None,
        }
    }
}

/// Client, two storage nodes and a witness in their own network namespaces; see
/// the module docs for names and addresses. Deleted on drop.
pub struct Topology {
    prefix: String,
    opts: TopologyOptions,
    client: String,
    nodes: [String; 2],
    witness: String,
}

/// Whether network namespaces (and veths) can be used here: running as root, `ip`
/// on PATH and a throwaway namespace with a veth pair can be created and deleted.
/// Like [`super::have`]: prints a skip message when not, and fails the test
/// instead under FREESAN_REQUIRE_TOOLS.
pub fn available() -> bool {
    static PROBE: OnceLock<Result<(), String>> = OnceLock::new();
    match PROBE.get_or_init(probe) {
        Ok(()) => true,
        Err(why) => {
            assert!(
                std::env::var("FREESAN_REQUIRE_TOOLS").is_err(),
                "network namespaces are required: {why}"
            );
            eprintln!("skipping: network namespaces are not usable: {why}");
            false
        }
    }
}

fn probe() -> Result<(), String> {
    if unsafe { libc::geteuid() } != 0 {
        return Err("not running as root".into());
    }
    let ip_found = Command::new("sh")
        .args(["-c", "command -v ip"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if !ip_found {
        return Err("`ip` (iproute2) is not installed".into());
    }
    let name = format!("fsnprobe{}", std::process::id());
    let _guard = NETNS_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let (ok, out) = ip(&["netns", "add", &name]);
    if !ok {
        return Err(format!("ip netns add: {}", out.trim()));
    }
    let (veth_ok, veth_out) = ip(&[
        "-n", &name, "link", "add", "name", "pa", "type", "veth", "peer", "name", "pb",
    ]);
    let (del_ok, del_out) = ip(&["netns", "del", &name]);
    if !veth_ok {
        return Err(format!("veth: {}", veth_out.trim()));
    }
    if !del_ok {
        return Err(format!("ip netns del: {}", del_out.trim()));
    }
    Ok(())
}

/// Runs `ip ARGS`; returns (success, stdout + stderr).
fn ip(args: &[&str]) -> (bool, String) {
    output(Command::new("ip").args(args))
}

fn output(cmd: &mut Command) -> (bool, String) {
    match cmd.stdin(Stdio::null()).output() {
        Ok(out) => {
            let mut s = String::from_utf8_lossy(&out.stdout).into_owned();
            s.push_str(&String::from_utf8_lossy(&out.stderr));
            (out.status.success(), s)
        }
        Err(e) => (false, format!("{cmd:?}: {e}")),
    }
}

/// Runs `ip ARGS` and panics with its output when it fails.
fn ip_ok(args: &[&str]) {
    let (ok, out) = ip(args);
    assert!(ok, "ip {}: {}", args.join(" "), out.trim());
}

fn tc_ok(args: &[&str]) {
    let (ok, out) = output(Command::new("tc").args(args));
    assert!(ok, "tc {}: {}", args.join(" "), out.trim());
}

fn ns_path(ns: &str) -> String {
    format!("/run/netns/{ns}")
}

fn ns_exists(ns: &str) -> bool {
    Path::new(&ns_path(ns)).exists()
}

/// True when process `pid` is inside network namespace `ns` (by name).
pub fn pid_in_ns(pid: u32, ns: &str) -> bool {
    let (Ok(a), Ok(b)) = (
        std::fs::metadata(format!("/proc/{pid}/ns/net")),
        std::fs::metadata(ns_path(ns)),
    ) else {
        return false;
    };
    a.dev() == b.dev() && a.ino() == b.ino()
}

/// The names in `ip netns list`.
pub fn list_namespaces() -> Vec<String> {
    let (ok, out) = ip(&["netns", "list"]);
    assert!(ok, "ip netns list: {out}");
    out.lines()
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_string)
        .collect()
}

fn v4(a: u8, b: u8, c: u8, d: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(a, b, c, d))
}

fn octet(n: u32) -> u8 {
    u8::try_from(n).expect("index fits an octet")
}

impl Topology {
    /// Builds the namespaces and links (see the module docs), first deleting
    /// stale namespaces of the same names that a crashed earlier run left.
    /// `prefix`: 1 to 6 characters of `[a-z0-9]`, unique per test.
    pub fn create(prefix: &str, opts: TopologyOptions) -> Topology {
        assert!(
            (1..=6).contains(&prefix.len())
                && prefix
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit()),
            "netns prefix must be 1..=6 chars of [a-z0-9]: {prefix:?}"
        );
        assert!(
            (1..=99).contains(&opts.client_links_per_node),
            "client_links_per_node must be 1..=99"
        );
        assert!(opts.sync_links <= 99, "sync_links must be 0..=99");
        // Built before anything exists, so a panic half way still tears down.
        let topo = Topology {
            prefix: prefix.to_string(),
            opts,
            client: format!("{prefix}-cl"),
            nodes: [format!("{prefix}-n1"), format!("{prefix}-n2")],
            witness: format!("{prefix}-wi"),
        };
        {
            let _guard = NETNS_LOCK.lock().unwrap_or_else(|e| e.into_inner());
            for ns in topo.namespaces() {
                if ns_exists(ns) {
                    eprintln!("netns: deleting stale namespace {ns}");
                    let (ok, out) = ip(&["netns", "del", ns]);
                    assert!(ok, "deleting stale namespace {ns}: {out}");
                }
            }
            for ns in topo.namespaces() {
                ip_ok(&["netns", "add", ns]);
            }
        }
        for ns in topo.namespaces() {
            ip_ok(&["-n", ns, "link", "set", "lo", "up"]);
        }
        for k in 1..=2 {
            for j in 1..=topo.opts.client_links_per_node {
                let (cif, nif) = topo.client_ifnames(k, j);
                topo.veth(
                    (topo.ns_client(), &cif, topo.client_addr(k, j)),
                    (topo.ns_node(k), &nif, topo.client_portal_addr(k, j)),
                );
                if let Some(rate) = topo.opts.client_link_rate_mbit {
                    let rate = format!("{rate}mbit");
                    for (ns, ifname) in [(topo.ns_client(), &cif), (topo.ns_node(k), &nif)] {
                        tc_ok(&[
                            "-n",
                            ns,
                            "qdisc",
                            "add",
                            "dev",
                            ifname,
                            "root",
                            "tbf",
                            "rate",
                            &rate,
                            "burst",
                            TBF_BURST,
                            "latency",
                            TBF_LATENCY,
                        ]);
                    }
                }
            }
        }
        // the client networks are routed through the client namespace, so each
        // node reaches the partner's portal j over its own client link j (as two
        // nodes on one switched client network would): heartbeats run there too
        let (ok, out) = output(Command::new("ip").args([
            "netns",
            "exec",
            topo.ns_client(),
            "sysctl",
            "-qw",
            "net.ipv4.ip_forward=1",
        ]));
        assert!(ok, "enabling forwarding in {}: {out}", topo.ns_client());
        for k in 1..=2 {
            for j in 1..=topo.opts.client_links_per_node {
                let IpAddr::V4(peer) = topo.client_portal_addr(3 - k, j) else {
                    unreachable!("IPv4 topology")
                };
                let o = peer.octets();
                ip_ok(&[
                    "-n",
                    topo.ns_node(k),
                    "route",
                    "add",
                    &format!("{}.{}.{}.0/24", o[0], o[1], o[2]),
                    "via",
                    &topo.client_addr(k, j).to_string(),
                ]);
            }
        }
        for l in 1..=topo.opts.sync_links {
            let name = topo.sync_ifname(l);
            topo.veth(
                (topo.ns_node(1), &name, topo.sync_addr(1, l)),
                (topo.ns_node(2), &name, topo.sync_addr(2, l)),
            );
        }
        for k in 1..=2 {
            let (wif, nif) = topo.witness_ifnames(k);
            topo.veth(
                (topo.ns_witness(), &wif, topo.witness_addr_for(k)),
                (topo.ns_node(k), &nif, topo.node_addr_on_witness_link(k)),
            );
        }
        topo
    }

    /// A veth pair between two namespaces, addressed (/24) and up.
    fn veth(&self, a: (&str, &str, IpAddr), b: (&str, &str, IpAddr)) {
        ip_ok(&[
            "-n", a.0, "link", "add", "name", a.1, "type", "veth", "peer", "name", b.1, "netns",
            b.0,
        ]);
        for (ns, ifname, addr) in [a, b] {
            ip_ok(&[
                "-n",
                ns,
                "addr",
                "add",
                &format!("{addr}/24"),
                "dev",
                ifname,
            ]);
            ip_ok(&["-n", ns, "link", "set", ifname, "up"]);
        }
    }

    /// The prefix this topology was created with.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The options this topology was created with.
    pub fn options(&self) -> &TopologyOptions {
        &self.opts
    }

    /// All four namespace names: client, n1, n2, witness.
    pub fn namespaces(&self) -> [&str; 4] {
        [&self.client, &self.nodes[0], &self.nodes[1], &self.witness]
    }

    pub fn ns_client(&self) -> &str {
        &self.client
    }

    /// Node `k` (1 or 2).
    pub fn ns_node(&self, k: u32) -> &str {
        &self.nodes[node_index(k)]
    }

    pub fn ns_witness(&self) -> &str {
        &self.witness
    }

    /// Node `node`'s address on client path `path` (where it serves its portal).
    pub fn client_portal_addr(&self, node: u32, path: u32) -> IpAddr {
        self.check_client_link(node, path);
        v4(10, octet(node), octet(path), 2)
    }

    /// The client's address on its path `path` to node `node`.
    pub fn client_addr(&self, node: u32, path: u32) -> IpAddr {
        self.check_client_link(node, path);
        v4(10, octet(node), octet(path), 1)
    }

    /// Node `node`'s address on sync link `link`.
    pub fn sync_addr(&self, node: u32, link: u32) -> IpAddr {
        node_index(node);
        self.check_sync_link(link);
        v4(10, 100, octet(link), octet(node))
    }

    /// The witness's address on its link to node `node`.
    pub fn witness_addr_for(&self, node: u32) -> IpAddr {
        node_index(node);
        v4(10, 200, octet(node), 1)
    }

    /// Node `node`'s address on its link to the witness.
    pub fn node_addr_on_witness_link(&self, node: u32) -> IpAddr {
        node_index(node);
        v4(10, 200, octet(node), 2)
    }

    /// Interface names of client path `path` to node `node`: (client side, node side).
    pub fn client_ifnames(&self, node: u32, path: u32) -> (String, String) {
        self.check_client_link(node, path);
        (format!("n{node}p{path}"), format!("cl{path}"))
    }

    /// Interface name of sync link `link` (the same on both nodes).
    pub fn sync_ifname(&self, link: u32) -> String {
        self.check_sync_link(link);
        format!("sy{link}")
    }

    /// Interface names of the witness link to node `node`: (witness side, node side).
    pub fn witness_ifnames(&self, node: u32) -> (String, String) {
        node_index(node);
        (format!("n{node}"), "wi".to_string())
    }

    fn check_client_link(&self, node: u32, path: u32) {
        node_index(node);
        assert!(
            (1..=self.opts.client_links_per_node).contains(&path),
            "no client path {path} (have 1..={})",
            self.opts.client_links_per_node
        );
    }

    fn check_sync_link(&self, link: u32) {
        assert!(
            (1..=self.opts.sync_links).contains(&link),
            "no sync link {link} (have 1..={})",
            self.opts.sync_links
        );
    }

    fn check_ns(&self, ns: &str) {
        assert!(
            self.namespaces().contains(&ns),
            "{ns} is not a namespace of this topology"
        );
    }

    fn set_link(&self, ns: &str, ifname: &str, up: bool) {
        ip_ok(&[
            "-n",
            ns,
            "link",
            "set",
            ifname,
            if up { "up" } else { "down" },
        ]);
    }

    /// Takes sync link `link` down (or up) on both n1's and n2's side.
    pub fn set_sync_link(&self, link: u32, up: bool) {
        let name = self.sync_ifname(link);
        self.set_link(self.ns_node(1), &name, up);
        self.set_link(self.ns_node(2), &name, up);
    }

    /// Takes client path `path` to node `node` down (or up) on both sides.
    pub fn set_client_link(&self, node: u32, path: u32, up: bool) {
        let (cif, nif) = self.client_ifnames(node, path);
        self.set_link(self.ns_client(), &cif, up);
        self.set_link(self.ns_node(node), &nif, up);
    }

    /// Takes the witness link to node `node` down (or up) on both sides.
    pub fn set_witness_link(&self, node: u32, up: bool) {
        let (wif, nif) = self.witness_ifnames(node);
        self.set_link(self.ns_witness(), &wif, up);
        self.set_link(self.ns_node(node), &nif, up);
    }

    /// `ip netns exec NS PROGRAM`, ready for arguments, environment and stdio.
    pub fn command(&self, ns: &str, program: impl AsRef<OsStr>) -> Command {
        self.check_ns(ns);
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", ns]).arg(program);
        cmd
    }

    /// Starts `program args...` in namespace `ns` with stdout and stderr appended
    /// to `log` and stdin from /dev/null. `ip netns exec` execs the program, so
    /// the child's PID is the program's own.
    pub fn spawn<I, S>(&self, ns: &str, program: impl AsRef<OsStr>, args: I, log: &Path) -> Child
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .unwrap_or_else(|e| panic!("log file {}: {e}", log.display()));
        let err = out.try_clone().expect("clone log file");
        let program = program.as_ref();
        self.command(ns, program)
            .args(args)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {program:?} in {ns}: {e}"))
    }

    /// Runs a short command in namespace `ns`; returns (success, stdout + stderr).
    pub fn run<I, S>(&self, ns: &str, program: impl AsRef<OsStr>, args: I) -> (bool, String)
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        output(self.command(ns, program).args(args))
    }

    /// Runs `f` on a thread that has joined network namespace `ns`: sockets it
    /// opens (listeners included) live in that namespace, also after `f` returns.
    pub fn in_netns<R, F>(&self, ns: &str, f: F) -> R
    where
        F: FnOnce() -> R + Send,
        R: Send,
    {
        self.check_ns(ns);
        let path = ns_path(ns);
        std::thread::scope(|s| {
            s.spawn(move || {
                let file =
                    std::fs::File::open(&path).unwrap_or_else(|e| panic!("open {path}: {e}"));
                let rc = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
                assert!(rc == 0, "setns {path}: {}", std::io::Error::last_os_error());
                f()
            })
            .join()
            .unwrap_or_else(|e| std::panic::resume_unwind(e))
        })
    }

    /// Whether a TCP connection from namespace `ns` to `addr:port` succeeds
    /// within `timeout`.
    pub fn can_connect(&self, ns: &str, addr: IpAddr, port: u16, timeout: Duration) -> bool {
        self.in_netns(ns, move || {
            TcpStream::connect_timeout(&SocketAddr::new(addr, port), timeout).is_ok()
        })
    }
}

fn node_index(k: u32) -> usize {
    assert!(k == 1 || k == 2, "nodes are 1 and 2, not {k}");
    (k - 1) as usize
}

impl Drop for Topology {
    fn drop(&mut self) {
        // Only what this topology created: processes inside its namespaces (killed
        // by PID, each checked to still be in the namespace), then the namespaces.
        for ns in self.namespaces() {
            if !ns_exists(ns) {
                continue;
            }
            let (_, out) = ip(&["netns", "pids", ns]);
            for pid in out.split_whitespace().filter_map(|p| p.parse::<u32>().ok()) {
                if pid_in_ns(pid, ns) {
                    unsafe {
                        libc::kill(pid as libc::pid_t, libc::SIGKILL);
                    }
                }
            }
        }
        let _guard = NETNS_LOCK.lock().unwrap_or_else(|e| e.into_inner());
        for ns in self.namespaces() {
            if ns_exists(ns) {
                let (ok, out) = ip(&["netns", "del", ns]);
                if !ok {
                    eprintln!("netns: deleting {ns} failed: {}", out.trim());
                }
            }
        }
    }
}
