//! LUN masking end to end: host groups from the config file and from the CLI decide
//! what libiscsi's `iscsi-ls` sees through two initiator names (REPORT LUNS and the
//! capacity of each LUN it lists), contradicting groups are refused, and groups
//! created at run time come back after a restart.

use crate::common;
use common::*;
use std::path::Path;

fn config(dir: &Path) -> std::path::PathBuf {
    let mut s = format!(
        "data_dir = \"{d}/data\"\n[api]\naddress = \"127.0.0.1:0\"\n[[portal]]\naddress = \"127.0.0.1:0\"\n\
         [[target]]\niqn = \"{IQN}\"\n",
        d = dir.display()
    );
    // LUN n is (n + 1) * 8 MiB, so a listed size tells which LUN is behind a number.
    for n in 0..3 {
        s += &format!(
            "[[target.lun]]\npath = \"{d}/lun{n}.img\"\nsize = \"{}M\"\n",
            (n + 1) * 8,
            d = dir.display()
        );
    }
    s += "[[target.host_group]]\nname = \"a\"\ninitiators = [\"iqn.2026-11.test:a\"]\n\
          luns = [{ lun = 0 }, { lun = 2, as = 1 }]\n";
    let path = dir.join("node.toml");
    std::fs::write(&path, s).unwrap();
    path
}

/// (LUN number, size in MiB) of every LUN `iscsi-ls` shows `initiator`.
fn seen(node: &Node, initiator: &str) -> Vec<(u64, u64)> {
    let url = format!("iscsi://{}", node.portals[0]);
    let (ok, out) = run("iscsi-ls", &["-s", "-i", initiator, &url]);
    assert!(ok, "iscsi-ls as {initiator}: {out}");
    // "Lun:1    Type:DIRECT_ACCESS (Size:24M)"
    let mut luns = Vec::new();
    for line in out.lines() {
        let Some(rest) = line.trim().strip_prefix("Lun:") else {
            continue;
        };
        let lun: u64 = rest.split_whitespace().next().unwrap().parse().unwrap();
        let size = line
            .split("Size:")
            .nth(1)
            .and_then(|s| s.trim_end_matches(')').trim_end_matches('M').parse().ok())
            .unwrap_or_else(|| panic!("no size in {line:?}"));
        // iscsi-ls prints whole MiB below the size (7M for 8 MiB): round to 8 MiB.
        let size: u64 = size;
        luns.push((lun, (size + 4) / 8 * 8));
    }
    luns
}

#[test]
fn host_groups_decide_what_each_initiator_sees() {
    if !have("iscsi-ls") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path());
    let mut node = start_config(dir.path(), &cfg);
    let api = node.api.clone().expect("no API address in the banner");
    let (a, b) = ("iqn.2026-11.test:a", "iqn.2026-11.test:b");

    // From the config file: a sees LUN 0 and LUN 2 as 1; b is in no group.
    assert_eq!(seen(&node, a), vec![(0, 8), (1, 24)]);
    assert_eq!(seen(&node, b), vec![]);

    // From the CLI: b sees LUN 1 as its LUN 0.
    let (ok, out) = cli(
        &api,
        &[
            "host-group",
            "create",
            "--target",
            IQN,
            "--name",
            "b",
            "--initiator",
            b,
            "--lun",
            "1:0",
        ],
    );
    assert!(ok, "{out}");
    assert_eq!(seen(&node, b), vec![(0, 16)]);
    assert_eq!(seen(&node, a), vec![(0, 8), (1, 24)]);

    // Refused: an initiator in two groups, a number mapped twice, changing or
    // deleting the config file's group; nothing changes.
    for (args, why) in [
        (
            vec!["--name", "c", "--initiator", a, "--lun", "1"],
            "two host groups",
        ),
        (
            vec!["--name", "c", "--lun", "1:0", "--lun", "2:0"],
            "mapped twice",
        ),
        (vec!["--name", "a", "--lun", "1"], "config file"),
    ] {
        let mut all = vec!["host-group", "create", "--target", IQN];
        all.extend(args);
        let (ok, out) = cli(&api, &all);
        assert!(!ok && out.contains(why), "{all:?}: {out}");
    }
    let (ok, out) = cli(
        &api,
        &["host-group", "delete", "--target", IQN, "--name", "a"],
    );
    assert!(!ok && out.contains("config file"), "{out}");
    assert_eq!(seen(&node, a), vec![(0, 8), (1, 24)]);
    assert_eq!(seen(&node, b), vec![(0, 16)]);
    let (ok, out) = cli(&api, &["host-group", "list"]);
    assert!(ok && out.contains(" a ") && out.contains(" b "), "{out}");

    // After a restart the run-time group is still there.
    assert!(node.terminate(), "clean stop");
    let mut node = start_config(dir.path(), &cfg);
    let api = node.api.clone().unwrap();
    assert_eq!(seen(&node, b), vec![(0, 16)]);
    let (ok, out) = cli(
        &api,
        &["host-group", "delete", "--target", IQN, "--name", "b"],
    );
    assert!(ok, "{out}");
    assert_eq!(seen(&node, b), vec![]);
    assert_eq!(seen(&node, a), vec![(0, 8), (1, 24)]);
    assert!(node.terminate());
}
