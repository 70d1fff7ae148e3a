//! Smoke test of the network-namespace HA topology harness (common/netns.rs):
//! every link carries traffic, faults cut exactly the link they name, client links
//! are shaped, processes run (with their own PIDs) inside a namespace, and
//! everything is gone after the drop.

use crate::common;
use common::netns::{self, Topology, TopologyOptions};
use common::*;
use std::net::{IpAddr, TcpListener};
use std::process::Command;
use std::time::{Duration, Instant};

/// Port of the TCP listeners the test opens in both node namespaces.
const PORT: u16 = 7000;

/// `ping` is optional (not installed everywhere): checked without `have`, which
/// would fail the test under FREESAN_REQUIRE_TOOLS.
fn ping_installed() -> bool {
    Command::new("sh")
        .args(["-c", "command -v ping"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

/// One reachability probe from `ns` to `addr`: a TCP connect to the node's
/// listener, plus an ICMP echo when ping is installed.
fn reaches(t: &Topology, ns: &str, addr: IpAddr, ping: bool) -> bool {
    if !t.can_connect(ns, addr, PORT, Duration::from_millis(500)) {
        return false;
    }
    !ping || t.run(ns, "ping", ["-c1", "-W1", &addr.to_string()]).0
}

fn assert_reaches(t: &Topology, ns: &str, addr: IpAddr, ping: bool) {
    // a link that just came up may need a moment (carrier, ARP)
    let deadline = Instant::now() + Duration::from_secs(3);
    while !reaches(t, ns, addr, ping) {
        assert!(Instant::now() < deadline, "{ns} cannot reach {addr}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn assert_unreachable(t: &Topology, ns: &str, addr: IpAddr, ping: bool) {
    assert!(
        !t.can_connect(ns, addr, PORT, Duration::from_millis(500)),
        "{ns} still reaches {addr} over TCP"
    );
    if ping {
        assert!(
            !t.run(ns, "ping", ["-c1", "-W1", &addr.to_string()]).0,
            "{ns} still pings {addr}"
        );
    }
}

#[test]
fn topology_links_faults_shaping_processes_teardown() {
    if !netns::available() || !have("tc") || !have("sleep") || !have("bash") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let ping = ping_installed();
    if !ping {
        eprintln!("ping is not installed: checking reachability over TCP only");
    }
    let t = Topology::create(
        "nts1",
        TopologyOptions {
            client_link_rate_mbit: Some(1000),
            ..TopologyOptions::default()
        },
    );
    let names: Vec<String> = t.namespaces().iter().map(|s| s.to_string()).collect();
    let listed = netns::list_namespaces();
    for ns in &names {
        assert!(listed.contains(ns), "{ns} missing from {listed:?}");
    }

    // listeners in both nodes, opened from inside their namespaces
    let _listeners: Vec<TcpListener> = (1..=2)
        .map(|k| {
            t.in_netns(t.ns_node(k), || TcpListener::bind(("0.0.0.0", PORT)))
                .expect("listen in node namespace")
        })
        .collect();
    let up = |ns: &str, addr| assert_reaches(&t, ns, addr, ping);
    let down = |ns: &str, addr| assert_unreachable(&t, ns, addr, ping);

    // client -> every portal address of both nodes
    for k in 1..=2 {
        for j in 1..=t.options().client_links_per_node {
            up(t.ns_client(), t.client_portal_addr(k, j));
        }
    }
    // the short-command path too: bash's /dev/tcp inside the client namespace
    let (ok, out) = t.run(
        t.ns_client(),
        "timeout",
        [
            "2".to_string(),
            "bash".into(),
            "-c".into(),
            format!("exec 3<>/dev/tcp/{}/{PORT}", t.client_portal_addr(2, 1)),
        ],
    );
    assert!(ok, "bash /dev/tcp from the client namespace: {out}");
    // n1 -> n2 over sync, witness -> both nodes
    up(t.ns_node(1), t.sync_addr(2, 1));
    for k in 1..=2 {
        up(t.ns_witness(), t.node_addr_on_witness_link(k));
    }

    // faults cut exactly the named link, and heal
    t.set_sync_link(1, false);
    down(t.ns_node(1), t.sync_addr(2, 1));
    t.set_sync_link(1, true);
    up(t.ns_node(1), t.sync_addr(2, 1));

    t.set_client_link(1, 1, false);
    down(t.ns_client(), t.client_portal_addr(1, 1));
    up(t.ns_client(), t.client_portal_addr(1, 2));
    t.set_client_link(1, 1, true);
    up(t.ns_client(), t.client_portal_addr(1, 1));

    t.set_witness_link(2, false);
    down(t.ns_witness(), t.node_addr_on_witness_link(2));
    up(t.ns_witness(), t.node_addr_on_witness_link(1));
    t.set_witness_link(2, true);
    up(t.ns_witness(), t.node_addr_on_witness_link(2));

    // shaping on both ends of a client link
    let (cif, nif) = t.client_ifnames(2, 2);
    for (ns, ifname) in [(t.ns_client(), &cif), (t.ns_node(2), &nif)] {
        let (ok, out) = run("tc", &["-n", ns, "qdisc", "show", "dev", ifname]);
        assert!(ok, "tc qdisc show: {out}");
        assert!(
            out.contains("qdisc tbf") && out.contains("rate 1Gbit"),
            "no 1 Gbit tbf on {ns}/{ifname}: {out}"
        );
    }

    // a process in a node namespace is the Child itself (ip netns exec execs it)
    let log = dir.path().join("sleep.log");
    let mut child = t.spawn(t.ns_node(1), "sleep", ["30"], &log);
    let pid = child.id();
    // right after the fork the PID still runs the test binary, then `ip`, then
    // sleep: had `ip` forked instead of exec'ing, it would stay "ip"
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap();
        if comm.trim() == "sleep" {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "PID {pid} is {comm:?}, not the program itself"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(netns::pid_in_ns(pid, t.ns_node(1)), "PID {pid} not in n1");
    assert!(!netns::pid_in_ns(pid, t.ns_node(2)));
    unsafe {
        libc::kill(pid as libc::pid_t, libc::SIGKILL);
    }
    let status = child.wait().unwrap();
    assert!(!status.success(), "sleep was not killed: {status}");

    drop(t);
    let listed = netns::list_namespaces();
    for ns in &names {
        assert!(!listed.contains(ns), "{ns} survived the drop: {listed:?}");
    }
}
