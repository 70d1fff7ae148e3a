//! The rebuild-rate cap of a running pool is changed through the management API
//! (`freesan pool rebuild-rate`), shows in `freesan pool status --json`, is
//! refused for unknown pools, and persists in the pool across a restart. And
//! what a start does with members that do not match their `[[pool]]` or whose
//! superblocks are damaged: it refuses, and writes nothing.

use crate::common;
use common::*;

fn config(dir: &std::path::Path) -> std::path::PathBuf {
    let mut s = config_head(dir, 3);
    // no rebuild_rate_mb_s: the pool's own (persisted) cap applies at every start
    s += "[[pool]]\nname = \"p\"\nlevel = \"raid5\"\nchunk = \"16K\"\nmembers = [\"d0\", \"d1\", \"d2\"]\n";
    s += &format!("[[target]]\niqn = \"{IQN}\"\n[[target.lun]]\npool = \"p\"\n");
    let path = dir.join("node.toml");
    std::fs::write(&path, s).unwrap();
    path
}

/// A directory with the pool's config, started once (so its members carry
/// superblocks) and stopped cleanly.
fn pool_created_once() -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path());
    let mut node = Node::start(
        &[],
        &["--config".into(), cfg.display().to_string()],
        &dir.path().join("serve.log"),
    );
    assert!(node.terminate(), "unclean exit");
    (dir, cfg)
}

fn rate(api: &str) -> u64 {
    let (ok, out) = freesan(&["pool", "--api", api, "status", "p", "--json"]);
    assert!(ok, "{out}");
    let v: serde_json::Value = serde_json::from_str(&out).expect("status JSON");
    v["rebuild_rate_mb_s"]
        .as_u64()
        .unwrap_or_else(|| panic!("no rebuild_rate_mb_s in {out}"))
}

#[test]
fn rebuild_rate_set_through_the_cli_shows_in_status_and_persists() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path());
    let start = || {
        Node::start(
            &[],
            &["--config".into(), cfg.display().to_string()],
            &dir.path().join("serve.log"),
        )
    };
    let mut node = start();
    let api = node.api.clone().expect("no API address in the banner");
    assert_eq!(rate(&api), 100, "a new pool starts with the default cap");

    let (ok, out) = freesan(&["pool", "--api", &api, "rebuild-rate", "p", "37"]);
    assert!(ok, "{out}");
    assert!(out.contains("rebuild rate 37 MB/s"), "{out}");
    assert_eq!(rate(&api), 37);

    let (ok, out) = freesan(&["pool", "--api", &api, "rebuild-rate", "p", "0"]);
    assert!(ok, "{out}");
    assert!(out.contains("rebuild rate uncapped"), "{out}");
    assert_eq!(rate(&api), 0);

    let (ok, out) = freesan(&["pool", "--api", &api, "rebuild-rate", "nosuch", "5"]);
    assert!(!ok, "an unknown pool was accepted: {out}");
    assert!(out.contains("no pool named"), "{out}");
    let (ok, out) = freesan(&["pool", "--api", &api, "rebuild-rate", "p", "-3"]);
    assert!(!ok, "a negative rate was accepted: {out}");

    let (ok, out) = freesan(&["pool", "--api", &api, "rebuild-rate", "p", "42"]);
    assert!(ok, "{out}");
    assert!(node.terminate(), "unclean exit");
    let node = start();
    let api = node.api.clone().expect("no API address in the banner");
    assert_eq!(rate(&api), 42, "the cap did not persist in the pool");
}

/// Members that carry a pool of another level than `[[pool]]` says (disks
/// moved from another node, a swapped cable) are not served under this
/// pool's name: the start is refused and says why. (Before, the
/// superblocks' level won silently.)
#[test]
fn members_carrying_another_level_are_refused_at_start() {
    let (_dir, cfg) = pool_created_once();
    let text = std::fs::read_to_string(&cfg).unwrap();
    std::fs::write(&cfg, text.replace("level = \"raid5\"", "level = \"raid0\"")).unwrap();
    let (ok, out) = serve_expecting_refusal(&cfg);
    assert!(
        !ok,
        "a raid5 pool was served as the configured raid0: {out}"
    );
    assert!(out.contains("says raid0"), "{out}");
}

/// A pool whose members' superblocks are all damaged (the magic there, the
/// checksums wrong) is not created anew over them at the next start: the
/// start is refused and the members are left as they were. (Before, no
/// valid superblock meant blank disks, and the pool was formatted again:
/// new superblocks, the journal's acknowledged records dropped.)
#[test]
fn members_whose_superblocks_are_damaged_are_not_formatted_again() {
    let (dir, cfg) = pool_created_once();
    let disks: Vec<_> = (0..3)
        .map(|i| dir.path().join(format!("d{i}.img")))
        .collect();
    for d in &disks {
        let mut b = std::fs::read(d).unwrap();
        // a byte of each slot's payload (slots at 0 and 64 KiB)
        for slot in [0usize, 64 << 10] {
            b[slot + 100] ^= 0xff;
        }
        std::fs::write(d, b).unwrap();
    }
    let before: Vec<Vec<u8>> = disks.iter().map(|d| std::fs::read(d).unwrap()).collect();
    let (ok, out) = serve_expecting_refusal(&cfg);
    assert!(
        !ok,
        "the pool was formatted over damaged superblocks: {out}"
    );
    assert!(out.contains("refusing to create one over them"), "{out}");
    let after: Vec<Vec<u8>> = disks.iter().map(|d| std::fs::read(d).unwrap()).collect();
    assert!(before == after, "the members were written");
}
