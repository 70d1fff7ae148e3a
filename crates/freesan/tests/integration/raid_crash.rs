//! RAID 5 and RAID 6 pools survive a SIGKILL during heavy writes: restart (the
//! pool is assembled and its stripe journal replayed), fail as many members as the
//! level tolerates through the management API, and every block acknowledged before
//! the kill reads back correctly (`freesan bench --verify` state + `bench check`).
//!
//! Partial-stripe writes are journaled: members may be failed right after the
//! restart. Whole-stripe writes are not (they are protected by the write intent and
//! the post-crash resync of the regions it lists): a member lost after that resync
//! loses nothing; a member lost before it may leave blocks under the writes in
//! flight at the crash torn, never any other block; with `journal_whole_stripes`
//! nothing may be torn even then. See docs/0002-raid.md.

use crate::common;
use common::*;
use std::time::{Duration, Instant};

/// A node with disks d0.. as the members of pool `p`, and with `jdev` one more
/// disk as its journal device.
fn config(
    dir: &std::path::Path,
    level: &str,
    members: usize,
    journal_all: bool,
    jdev: bool,
) -> std::path::PathBuf {
    let mut s = config_head(dir, members + usize::from(jdev));
    let names: Vec<String> = (0..members).map(|i| format!("\"d{i}\"")).collect();
    s += &format!(
        "[[pool]]\nname = \"p\"\nlevel = \"{level}\"\nchunk = \"16K\"\nmembers = [{}]\n",
        names.join(", ")
    );
    if journal_all {
        s += "journal_whole_stripes = true\n";
    }
    if jdev {
        s += &format!("journal_device = \"d{members}\"\n");
    }
    s += &format!("[[target]]\niqn = \"{IQN}\"\n[[target.lun]]\npool = \"p\"\n");
    let path = dir.join("node.toml");
    std::fs::write(&path, s).unwrap();
    path
}

/// When the members are failed after the restart, and what the check accepts.
#[derive(Clone, Copy, PartialEq)]
enum Degrade {
    /// Right away; every acknowledged block must be intact.
    AtOnce,
    /// After the post-crash resync; every acknowledged block must be intact.
    AfterResync,
    /// Right away; blocks under writes in flight at the kill may be torn.
    AtOnceInFlightMayBeTorn,
}

fn pool_status(api: &str) -> serde_json::Value {
    let (ok, out) = freesan(&["pool", "--api", api, "status", "p", "--json"]);
    assert!(ok, "{out}");
    let v: serde_json::Value = serde_json::from_str(&out).expect("status json");
    if v.is_array() {
        v[0].clone()
    } else {
        v
    }
}

fn crash_then_degrade(
    level: &str,
    members: usize,
    bs: &str,
    fail: &[usize],
    journal_all: bool,
    jdev: bool,
    when: Degrade,
) {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), level, members, journal_all, jdev);
    let state = dir.path().join("verify.state");
    let mut node = start_config(dir.path(), &cfg);
    let url = node.url(0, 0);
    let mut bench = start_verified_writes(&url, &state, bs, 4, 5);
    if bs == WHOLE_STRIPE {
        let api = node.api.clone().expect("no API address in the banner");
        let p = pool_status(&api);
        let writes = &p["stripe_writes"];
        if journal_all {
            // whole stripes go through the journal: none is written in place
            assert_eq!(p["journal_whole_stripes"], true, "{p}");
            assert_eq!(writes["full"].as_u64(), Some(0), "{p}");
            assert!(writes["partial"].as_u64().unwrap_or(0) > 0, "{p}");
        } else {
            // the writes really take the whole-stripe path (no journal record)
            assert!(
                writes["full"].as_u64().unwrap_or(0) > 0,
                "no whole-stripe writes: {p}"
            );
        }
    }
    if jdev {
        let api = node.api.clone().expect("no API address in the banner");
        let p = pool_status(&api);
        assert!(
            p["journal_device"].is_object(),
            "no journal device in the status: {p}"
        );
        assert!(
            p["write_path"]["journal_ring_writes"].as_u64().unwrap_or(0) > 0,
            "{p}"
        );
    }
    node.kill9();
    let _ = bench.wait();

    // restart: assemble + journal replay; then lose members within tolerance
    let node = start_config(dir.path(), &cfg);
    let api = node.api.clone().expect("no API address in the banner");
    if when == Degrade::AfterResync {
        let log = std::fs::read_to_string(&node.log).unwrap_or_default();
        assert!(
            log.contains("unclean shutdown: resyncing the regions written last"),
            "the restart found no dirty write-intent region: {log}"
        );
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let p = pool_status(&api);
            if p["unsynced_regions"].as_u64() == Some(0) && p["state"] == "optimal" {
                break;
            }
            assert!(Instant::now() < deadline, "resync did not finish: {p}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    for pos in fail {
        let (ok, out) = freesan(&["pool", "--api", &api, "fail", "p", &pos.to_string()]);
        assert!(ok, "failing member {pos} refused: {out}");
    }
    let p = pool_status(&api);
    assert_eq!(
        p["state"], "degraded",
        "pool not degraded after failing members: {p}"
    );
    let what = format!("{level} after SIGKILL + member failure");
    if when == Degrade::AtOnceInFlightMayBeTorn {
        let (ok, out) = bench_check_with(&node.url(0, 0), &state, &["--in-flight-may-be-torn"]);
        assert!(
            ok,
            "{what}: blocks not under a write in flight were lost: {out}"
        );
    } else {
        assert_acknowledged_writes_intact(&node.url(0, 0), &state, &what);
    }
}

#[test]
fn raid5_sigkill_during_writes_then_member_failure() {
    crash_then_degrade("raid5", 4, "8k", &[1], false, false, Degrade::AtOnce);
}

/// Chunk 16K: a RAID 5 of 4 and a RAID 6 of 5 both hold 48K of data per stripe;
/// aligned random writes of that size are whole-stripe writes (no journal).
const WHOLE_STRIPE: &str = "48k";

#[test]
fn raid5_sigkill_during_whole_stripe_writes_then_member_failure_after_resync() {
    crash_then_degrade(
        "raid5",
        4,
        WHOLE_STRIPE,
        &[2],
        false,
        false,
        Degrade::AfterResync,
    );
}

#[test]
fn raid5_whole_stripe_writes_member_lost_before_resync_tears_only_writes_in_flight() {
    crash_then_degrade(
        "raid5",
        4,
        WHOLE_STRIPE,
        &[2],
        false,
        false,
        Degrade::AtOnceInFlightMayBeTorn,
    );
}

#[test]
fn raid6_journaled_whole_stripe_writes_then_two_member_failures_at_once() {
    crash_then_degrade(
        "raid6",
        5,
        WHOLE_STRIPE,
        &[1, 4],
        true,
        false,
        Degrade::AtOnce,
    );
}

#[test]
fn raid6_sigkill_during_whole_stripe_writes_then_two_member_failures_after_resync() {
    crash_then_degrade(
        "raid6",
        5,
        WHOLE_STRIPE,
        &[1, 4],
        false,
        false,
        Degrade::AfterResync,
    );
}

#[test]
fn raid6_sigkill_during_writes_then_two_member_failures() {
    crash_then_degrade("raid6", 5, "8k", &[0, 3], false, false, Degrade::AtOnce);
}

/// `journal_device`: the stripe journal on its own disk. A SIGKILL during small
/// writes, then a member failed at once: every acknowledged block is intact (the
/// records are replayed from the device). The pool's disks without the device
/// do not start: its records would be lost.
#[test]
fn raid5_with_a_journal_device_sigkill_then_member_failure() {
    crash_then_degrade("raid5", 4, "8k", &[1], false, true, Degrade::AtOnce);
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), "raid5", 4, false, true);
    let mut node = start_config(dir.path(), &cfg);
    assert!(node.terminate(), "clean stop");
    let without = std::fs::read_to_string(&cfg)
        .unwrap()
        .replace("journal_device = \"d4\"\n", "");
    std::fs::write(&cfg, without).unwrap();
    let (ok, out) = serve_expecting_refusal(&cfg);
    assert!(!ok, "started without its journal device: {out}");
    assert!(out.contains("journal device"), "{out}");
}

/// Waits until the node's pool `p` has made `n` journal ring writes (30 s at most).
fn await_journal_ring_writes(api: &str, n: u64) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while pool_status(api)["write_path"]["journal_ring_writes"]
        .as_u64()
        .unwrap_or(0)
        < n
    {
        assert!(Instant::now() < deadline, "no journal writes");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A RAID 5 of d0-d3 whose stripe journal is mirrored on d4 and d5: the
/// configuration file, and its text.
fn mirrored_journal_config(d: &std::path::Path) -> (std::path::PathBuf, String) {
    let cfg = config(d, "raid5", 4, false, true);
    let mirrored = std::fs::read_to_string(&cfg)
        .unwrap()
        .replace(
            "journal_device = \"d4\"\n",
            "journal_device = \"d4\"\njournal_device_mirror = \"d5\"\n",
        )
        .replace(
            "[[pool]]",
            &format!(
                "[[disk]]\nname = \"d5\"\nsize = \"64M\"\npath = \"{}/d5.img\"\n[[pool]]",
                d.display()
            ),
        );
    std::fs::write(&cfg, &mirrored).unwrap();
    (cfg, mirrored)
}

/// The pool's journal devices: (name, failed), and the configured ones it
/// does not use.
fn journal_devices(api: &str) -> (Vec<(String, bool)>, Vec<String>) {
    let p = pool_status(api);
    let devs = p["journal_devices"]
        .as_array()
        .unwrap_or_else(|| panic!("no journal devices in the status: {p}"))
        .iter()
        .filter_map(|j| Some((j["name"].as_str()?.to_string(), j["failed"].as_bool()?)))
        .collect();
    let missing = p["journal_devices_missing"]
        .as_array()
        .unwrap_or_else(|| panic!("no journal_devices_missing in the status: {p}"))
        .iter()
        .filter_map(|n| Some(n.as_str()?.to_string()))
        .collect();
    (devs, missing)
}

/// A journal disk the configuration names but the pool no longer uses (the
/// node ran once without it in the file, so the superblocks stopped naming
/// it; back in the file it still carries its old header) is listed under
/// `journal_devices_missing` and reported at start by a `disk_failed` event
/// saying the journal runs unmirrored.
#[test]
fn a_configured_journal_disk_the_pool_does_not_use_is_reported_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (cfg, mirrored) = mirrored_journal_config(d);
    let s = |n: &str, f: bool| (n.to_string(), f);
    let mut node = start_config(d, &cfg);
    let api = node.api.clone().expect("no API address in the banner");
    assert_eq!(
        journal_devices(&api),
        (vec![s("d4", false), s("d5", false)], vec![])
    );
    node.kill9();
    // one start with d5 alone named (d4 stays a free disk of the file)
    let alone = mirrored
        .replace("journal_device = \"d4\"\n", "journal_device = \"d5\"\n")
        .replace("journal_device_mirror = \"d5\"\n", "");
    std::fs::write(&cfg, &alone).unwrap();
    let mut node = start_config(d, &cfg);
    let api = node.api.clone().expect("no API address in the banner");
    assert_eq!(journal_devices(&api), (vec![s("d5", false)], vec![]));
    node.kill9();
    // d4 named again: left out, and said
    std::fs::write(&cfg, &mirrored).unwrap();
    let mut node = start_config(d, &cfg);
    let api = node.api.clone().expect("no API address in the banner");
    assert_eq!(
        journal_devices(&api),
        (vec![s("d5", false)], vec!["d4".to_string()])
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (ok, out) = common::cli(&api, &["events", "--json"]);
        assert!(ok, "{out}");
        let said = out
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .find(|e| e["kind"] == "disk_failed" && e["object"] == "d4");
        if let Some(e) = said {
            let m = e["message"].as_str().unwrap_or_default();
            assert!(
                m.contains("not in use at start") && m.contains("unmirrored on d5"),
                "{e}"
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no disk_failed event for d4: {out}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    node.kill9();
}

/// A RAID 5 whose journal is mirrored on two disks: SIGKILL during verified
/// small writes; the node restarts without the first journal disk (left out of
/// the configuration and its file gone, as when an SSD dies with the node),
/// then a member fails: every acknowledged block reads back from the records
/// on the twin. Then a blank disk is configured in place of the lost one: it
/// joins the pair at the next start, and after another SIGKILL mid-write it
/// alone (the twin gone too) holds the records of every acknowledged block.
#[test]
fn raid5_with_a_mirrored_journal_sigkill_then_a_journal_disk_and_a_member_lost() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (cfg, mirrored) = mirrored_journal_config(d);
    let state = d.join("verify.state");
    let mut node = start_config(d, &cfg);
    let mut bench = start_verified_writes(&node.url(0, 0), &state, "8k", 4, 5);
    let api = node.api.clone().expect("no API address in the banner");
    let (devs, _) = journal_devices(&api);
    let names: Vec<&str> = devs.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["d4", "d5"]);
    // records are being written (to both devices) when the node dies
    await_journal_ring_writes(&api, 20);
    node.kill9();
    let _ = bench.wait();

    // d4 is gone: out of the file, its image deleted
    let without = mirrored
        .replace("journal_device = \"d4\"\n", "journal_device = \"d5\"\n")
        .replace("journal_device_mirror = \"d5\"\n", "")
        .replace(
            &format!(
                "[[disk]]\nname = \"d4\"\nsize = \"64M\"\npath = \"{}/d4.img\"\n",
                d.display()
            ),
            "",
        );
    assert!(!without.contains("d4"), "{without}");
    std::fs::write(&cfg, &without).unwrap();
    std::fs::remove_file(d.join("d4.img")).unwrap();
    let mut node = start_config(d, &cfg);
    let api = node.api.clone().expect("no API address in the banner");
    let (ok, out) = freesan(&["pool", "--api", &api, "fail", "p", "1"]);
    assert!(ok, "failing member 1 refused: {out}");
    let p = pool_status(&api);
    assert_eq!(p["state"], "degraded", "{p}");
    assert_acknowledged_writes_intact(
        &node.url(0, 0),
        &state,
        "raid5 with a mirrored journal after SIGKILL, one journal disk and a member lost",
    );
    node.kill9();

    // a new, blank disk d6 is configured as d5's mirror: at the next start it
    // joins the pair; then, after another SIGKILL, d6 alone (d5 deleted) holds
    // the records of the writes the members' caches lost
    let replaced = without
        .replace(
            "journal_device = \"d5\"\n",
            "journal_device = \"d5\"\njournal_device_mirror = \"d6\"\n",
        )
        .replace(
            "[[pool]]",
            &format!(
                "[[disk]]\nname = \"d6\"\nsize = \"64M\"\npath = \"{}/d6.img\"\n[[pool]]",
                d.display()
            ),
        );
    std::fs::write(&cfg, &replaced).unwrap();
    let mut node = start_config(d, &cfg);
    let api = node.api.clone().expect("no API address in the banner");
    assert_eq!(
        journal_devices(&api),
        (
            vec![("d5".to_string(), false), ("d6".to_string(), false)],
            vec![]
        )
    );
    let mut bench = start_verified_writes(&node.url(0, 0), &state, "8k", 4, 5);
    await_journal_ring_writes(&api, 20);
    node.kill9();
    let _ = bench.wait();
    let only_d6 = replaced
        .replace("journal_device = \"d5\"\n", "journal_device = \"d6\"\n")
        .replace("journal_device_mirror = \"d6\"\n", "")
        .replace(
            &format!(
                "[[disk]]\nname = \"d5\"\nsize = \"64M\"\npath = \"{}/d5.img\"\n",
                d.display()
            ),
            "",
        );
    assert!(!only_d6.contains("\"d5\""), "{only_d6}");
    std::fs::write(&cfg, only_d6).unwrap();
    std::fs::remove_file(d.join("d5.img")).unwrap();
    let node = start_config(d, &cfg);
    assert_acknowledged_writes_intact(
        &node.url(0, 0),
        &state,
        "raid5 after SIGKILL with only the journal disk that replaced a lost one",
    );
}
