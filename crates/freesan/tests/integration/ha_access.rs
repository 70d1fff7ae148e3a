//! Who may reach a replicated LUN on an HA pair: each node's own host groups,
//! initiator ACL and CHAP users. The nodes compare them when they come in sync
//! (a change made while the partner is away included) and whenever either
//! changes them; a difference shows in both nodes'
//! replica status and raises `replica_access_differs`, and its end
//! `replica_access_agrees`.

use crate::common;
use common::pair::{wait_for_replica, LoopbackPair};
use common::{freesan, IQN};
use serde_json::Value;

const CLUSTER: &str = "access";

/// `freesan host-group create` on `node`: initiator `who` sees LUN 0.
fn group(node: &common::Node, who: &str) {
    let api = node.api.as_deref().expect("the node serves its API");
    let (ok, out) = freesan(&[
        "host-group",
        "--api",
        api,
        "create",
        "--target",
        IQN,
        "--name",
        "hosts",
        "--initiator",
        who,
        "--lun",
        "0",
    ]);
    assert!(ok, "{out}");
}

/// The kinds of `node`'s events.
fn event_kinds(node: &common::Node) -> Vec<String> {
    let api = node.api.as_deref().expect("the node serves its API");
    let (ok, out) = freesan(&["events", "--api", api, "--json"]);
    assert!(ok, "{out}");
    out.lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap()["kind"].to_string())
        .collect()
}

#[test]
fn access_rules_that_differ_between_the_nodes_are_reported_on_both() {
    let p = LoopbackPair::new(CLUSTER);
    let n1 = p.start_one_lun(1);
    let n2 = p.start_one_lun(2);
    for n in [&n1, &n2] {
        wait_for_replica(n, "in sync with the same rules", |s| {
            s["state"] == "in-sync" && s["access_mismatch"].is_null()
        });
    }
    // node 1 alone masks the LUN: node 2 still shows it to everyone
    group(&n1, "iqn.2026-12.test:a");
    for n in [&n1, &n2] {
        let s = wait_for_replica(n, "the difference found", |s| {
            s["access_mismatch"].is_string()
        });
        assert!(
            s["access_mismatch"].as_str().unwrap().contains("differs"),
            "{s}"
        );
    }
    let api = n1.api.as_deref().unwrap();
    let (ok, out) = freesan(&["replica", "status", "--api", api]);
    assert!(ok && out.contains("ACCESS DIFFERS"), "{out}");
    // each node says so in its events (its watcher polls once a second)
    for n in [&n1, &n2] {
        await_event(n, "replica_access_differs");
    }
    // node 2 takes the same group: the same rules again
    group(&n2, "iqn.2026-12.test:a");
    for n in [&n1, &n2] {
        wait_for_replica(n, "the rules agreeing again", |s| {
            s["access_mismatch"].is_null()
        });
        await_event(n, "replica_access_agrees");
    }
    // a change made while the partner is away is found when they meet again
    let mut n2 = n2;
    assert!(n2.terminate(), "node 2 stopped cleanly");
    let (ok, out) = freesan(&[
        "host-group",
        "--api",
        api,
        "delete",
        "--target",
        IQN,
        "--name",
        "hosts",
    ]);
    assert!(ok, "{out}");
    let n2 = p.start_one_lun(2);
    for n in [&n1, &n2] {
        wait_for_replica(n, "the difference found at the meeting", |s| {
            s["state"] == "in-sync" && s["access_mismatch"].is_string()
        });
    }
}

/// Waits (up to 30 s) until `node`'s events hold one of `kind`.
fn await_event(node: &common::Node, kind: &str) {
    let want = format!("\"{kind}\"");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let kinds = event_kinds(node);
        if kinds.contains(&want) {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no {kind} event: {kinds:?}"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}
