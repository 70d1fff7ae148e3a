//! Explicit ALUA on a real HA pair: two `freesan serve` processes on loopback
//! with one replicated LUN. SET TARGET PORT GROUPS sent through either node
//! (with the project's initiator, as a raw CDB with Data-Out) changes what
//! REPORT TARGET PORT GROUPS reports on both nodes by the time it answers; a
//! change made while the partner is away reaches it when it rejoins; the states
//! survive a restart of both nodes.

use crate::common;
use common::pair::{replica_status, wait_for_replica, LoopbackPair};
use common::IQN;
use serde_json::Value;
use std::path::PathBuf;
use std::time::{Duration, Instant};

const CLUSTER: &str = "alua";

struct Pair(LoopbackPair);

impl Pair {
    fn new() -> Pair {
        Pair(LoopbackPair::new(CLUSTER))
    }

    /// Starts node `k` (1 or 2) of the pair: one portal, one replicated 16M LUN.
    fn start(&self, k: usize) -> common::Node {
        self.0.start_one_lun(k)
    }

    /// Node `k`'s file of explicit ALUA states for LUN 0.
    fn alua_file(&self, k: usize) -> PathBuf {
        self.0
            .node_dir(k)
            .join("data/targets")
            .join(IQN.replace(':', "_"))
            .join("lun0.alua.json")
    }
}

fn wait_for(node: &common::Node, what: &str, f: impl Fn(&Value) -> bool) {
    wait_for_replica(node, what, f);
}

fn in_sync(a: &common::Node, b: &common::Node) {
    for n in [a, b] {
        wait_for(n, "in sync", |s| s["state"] == "in-sync");
    }
}

/// Runs `cdb` (with Data-Out `out`) on LUN 0 through `node`'s portal in a fresh
/// session, past the unit attentions a new nexus meets first.
fn command(node: &common::Node, cdb: &[u8], out: &[u8], din: u32) -> initiator::ScsiResult {
    let addr = node.portals[0].parse().unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let s = initiator::Session::login(
            addr,
            &initiator::LoginOptions::new("iqn.2026-11.test:alua", IQN),
        )
        .await
        .expect("login");
        for _ in 0..8 {
            let r = s
                .command(0, cdb, bytes::Bytes::copy_from_slice(out), din)
                .await
                .expect("command");
            let ua = r.status == 2
                && r.sense
                    .as_deref()
                    .and_then(initiator::parse_sense)
                    .is_some_and(|x| x.key == 6);
            if !ua {
                let _ = s.logout().await;
                return r;
            }
        }
        panic!("unit attentions without end");
    })
}

/// SET TARGET PORT GROUPS through `node`: (state code, group) per descriptor.
fn set_tpg(node: &common::Node, descs: &[(u8, u16)]) {
    let mut p = vec![0u8; 4];
    for &(state, group) in descs {
        p.extend_from_slice(&[state, 0]);
        p.extend_from_slice(&group.to_be_bytes());
    }
    let mut cdb = [0xa4, 0x0a, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
    cdb[6..10].copy_from_slice(&(p.len() as u32).to_be_bytes());
    let r = command(node, &cdb, &p, 0);
    assert_eq!(r.status, 0, "SET TARGET PORT GROUPS: {:?}", r.sense);
}

/// (group, state code, status code) per group from REPORT TARGET PORT GROUPS
/// through `node`.
fn rtpg(node: &common::Node) -> Vec<(u16, u8, u8)> {
    let r = command(node, &[0xa3, 0x0a, 0, 0, 0, 0, 0, 0, 4, 0, 0, 0], &[], 1024);
    assert_eq!(r.status, 0, "REPORT TARGET PORT GROUPS: {:?}", r.sense);
    let d = &r.data_in;
    let len = u32::from_be_bytes([d[0], d[1], d[2], d[3]]) as usize;
    let mut out = Vec::new();
    let mut off = 4;
    while off + 8 <= (4 + len).min(d.len()) {
        out.push((
            u16::from_be_bytes([d[off + 2], d[off + 3]]),
            d[off] & 0x0f,
            d[off + 5],
        ));
        off += 8 + 4 * d[off + 7] as usize;
    }
    out
}

/// States only (group, state code).
fn states(v: &[(u16, u8, u8)]) -> Vec<(u16, u8)> {
    v.iter().map(|&(g, s, _)| (g, s)).collect()
}

/// RTPG through `node` once the cluster has driven the implicit states for the
/// current replica roles: `settled` says when (the implicit part only lags the
/// replica status, never the explicit part, which is in place before a SET
/// TARGET PORT GROUPS answers or a rejoining node is in sync).
fn rtpg_when(
    node: &common::Node,
    settled: impl Fn(&[(u16, u8, u8)]) -> bool,
) -> Vec<(u16, u8, u8)> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let r = rtpg(node);
        if settled(&r) {
            return r;
        }
        assert!(
            Instant::now() < deadline,
            "ALUA states never settled: {r:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn none_unavailable(r: &[(u16, u8, u8)]) -> bool {
    r.iter().all(|&(_, s, _)| s != 3)
}

#[test]
fn set_target_port_groups_reaches_both_nodes_and_persists() {
    let pair = Pair::new();
    let mut n1 = pair.start(1);
    let mut n2 = pair.start(2);
    in_sync(&n1, &n2);
    // both groups active/optimized once the pair is in sync (active-active)
    for n in [&n1, &n2] {
        let r = rtpg_when(n, none_unavailable);
        assert_eq!(states(&r), vec![(1, 0), (2, 0)], "{r:?}");
    }
    // INQUIRY: TPGS = 11b
    let r = command(&n2, &[0x12, 0, 0, 0, 36, 0], &[], 36);
    assert_eq!(r.data_in[5] & 0x30, 0x30);

    // through the follower (it forwards to the leader), then through the leader:
    // when each command answers, both nodes report the change, with STATUS CODE 01h
    let roles = [
        replica_status(&n1)["role"].clone(),
        replica_status(&n2)["role"].clone(),
    ];
    let (leader, follower) = match (roles[0].as_str(), roles[1].as_str()) {
        (Some("leader"), Some("follower")) => (&n1, &n2),
        (Some("follower"), Some("leader")) => (&n2, &n1),
        _ => panic!("roles {roles:?}"),
    };
    set_tpg(follower, &[(1, 1)]);
    for n in [&n1, &n2] {
        let r = rtpg(n);
        assert_eq!(states(&r), vec![(1, 1), (2, 0)]);
        assert_eq!(r[0].2, 1, "STATUS CODE of group 1: {r:?}");
    }
    set_tpg(leader, &[(2, 2)]);
    for n in [&n1, &n2] {
        assert_eq!(rtpg(n), vec![(1, 1, 1), (2, 2, 1)]);
    }
    for k in [1, 2] {
        let f = std::fs::read_to_string(pair.alua_file(k)).expect("ALUA state file");
        assert!(
            f.contains("standby") && f.contains("active-non-optimized"),
            "{f}"
        );
    }

    // node 2 leaves: node 1 serves alone; node 2's group is unavailable whatever
    // was set (the worse of the two), and a change made now stays on node 1
    assert!(n2.terminate(), "node 2 did not stop cleanly");
    wait_for(&n1, "serving alone", |s| s["state"] == "degraded");
    let r = rtpg_when(&n1, |r| r.iter().any(|&(g, s, _)| g == 2 && s == 3));
    assert_eq!(states(&r), vec![(1, 1), (2, 3)]);
    set_tpg(&n1, &[(0, 1)]);
    assert_eq!(states(&rtpg(&n1)), vec![(1, 0), (2, 3)]);

    // node 2 comes back: it gets node 1's explicit states (its own file still
    // said group 1 non-optimized) before it is in sync
    let n2b = pair.start(2);
    in_sync(&n1, &n2b);
    for n in [&n1, &n2b] {
        let r = rtpg_when(n, none_unavailable);
        assert_eq!(states(&r), vec![(1, 0), (2, 2)], "{r:?}");
    }
    let f = std::fs::read_to_string(pair.alua_file(2)).unwrap();
    assert!(
        !f.contains("non-optimized"),
        "node 2 kept its old state: {f}"
    );

    // both nodes restart: the states come back from their files
    drop(n2);
    let mut n2 = n2b;
    assert!(n2.terminate(), "node 2 did not stop cleanly");
    assert!(n1.terminate(), "node 1 did not stop cleanly");
    let n1 = pair.start(1);
    let n2 = pair.start(2);
    in_sync(&n1, &n2);
    for n in [&n1, &n2] {
        let r = rtpg_when(n, none_unavailable);
        assert_eq!(states(&r), vec![(1, 0), (2, 2)], "{r:?}");
    }
    // and a SET TARGET PORT GROUPS still reaches both
    set_tpg(&n2, &[(0, 2)]);
    for n in [&n1, &n2] {
        assert_eq!(states(&rtpg(n)), vec![(1, 0), (2, 0)]);
    }
}
