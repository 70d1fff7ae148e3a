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

/// A node with disks d0.. as the members of pool `p`, and `journal` more disks
/// (by name) as its journal device and its mirror.
fn config(
    dir: &std::path::Path,
    level: &str,
    members: usize,
    journal_all: bool,
    journal: &[&str],
) -> std::path::PathBuf {
    let mut s = config_head(dir, members);
    for name in journal {
        s += &format!(
            "[[disk]]\nname = \"{name}\"\nsize = \"64M\"\npath = \"{}/{name}.img\"\n",
            dir.display()
        );
    }
    let names: Vec<String> = (0..members).map(|i| format!("\"d{i}\"")).collect();
    s += &format!(
        "[[pool]]\nname = \"p\"\nlevel = \"{level}\"\nchunk = \"16K\"\nmembers = [{}]\n",
        names.join(", ")
    );
    if journal_all {
        s += "journal_whole_stripes = true\n";
    }
    for (key, name) in ["journal_device", "journal_device_mirror"]
        .iter()
        .zip(journal)
    {
        s += &format!("{key} = \"{name}\"\n");
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
    let jdev_name = format!("d{members}");
    let journal: &[&str] = if jdev { &[&jdev_name] } else { &[] };
    let cfg = config(dir.path(), level, members, journal_all, journal);
    let state = dir.path().join("verify.state");
    let mut node = start_config(dir.path(), &cfg);
    let url = node.url(0, 0);
    let mut bench = start_verified_writes(&url, &state, bs, 4, 5);
    if bs == WHOLE_STRIPE {
        let api = node.api.clone().expect("no API address in the banner");
        let p = pool_status(&api, "p");
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
    if bs != WHOLE_STRIPE && !jdev {
        // small writes of a bare pool go data-first: the kill finds updates
        // acknowledged before their reads, parity and in-place writes
        let api = node.api.clone().expect("no API address in the banner");
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let p = pool_status(&api, "p");
            assert_eq!(p["data_first"], true, "{p}");
            if p["write_path"]["data_first_acks"].as_u64().unwrap_or(0) > 0 {
                break;
            }
            assert!(Instant::now() < deadline, "no data-first update: {p}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    if jdev {
        let api = node.api.clone().expect("no API address in the banner");
        let p = pool_status(&api, "p");
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
            let p = pool_status(&api, "p");
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
    let p = pool_status(&api, "p");
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
    let cfg = config(dir.path(), "raid5", 4, false, &["d4"]);
    let mut node = start_config(dir.path(), &cfg);
    assert!(node.terminate(), "clean stop");
    config(dir.path(), "raid5", 4, false, &[]);
    let (ok, out) = serve_expecting_refusal(&cfg);
    assert!(!ok, "started without its journal device: {out}");
    assert!(out.contains("journal device"), "{out}");
}

/// `[[pool]] journal_mib` sizes the ring of a pool being created (64 MiB
/// members take 16 MiB by default); a pool that exists keeps its ring when the
/// setting changes, shows it in its status and logs that the setting was not
/// applied.
#[test]
fn journal_mib_sizes_a_new_pool_s_ring_and_an_existing_pool_keeps_its_own() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let cfg = config(d, "raid5", 4, false, &[]);
    let with = |mib: u64| {
        let s = std::fs::read_to_string(&cfg).unwrap();
        let s = s.replace(
            "members = [\"d0\", \"d1\", \"d2\", \"d3\"]\n",
            &format!("members = [\"d0\", \"d1\", \"d2\", \"d3\"]\njournal_mib = {mib}\n"),
        );
        std::fs::write(&cfg, s).unwrap();
    };
    with(8);
    let ring = |node: &common::Node| {
        let api = node.api.clone().expect("no API address in the banner");
        pool_status(&api, "p")["journal_bytes"].as_u64()
    };
    let mut node = start_config(d, &cfg);
    assert_eq!(ring(&node), Some(8 << 20));
    assert!(node.terminate(), "clean stop");
    config(d, "raid5", 4, false, &[]);
    with(4);
    let mut node = start_config(d, &cfg);
    assert_eq!(
        ring(&node),
        Some(8 << 20),
        "an existing pool's ring changed"
    );
    assert!(node.terminate(), "clean stop");
    // and the operator is told the setting was not applied
    let log = std::fs::read_to_string(&node.log).unwrap();
    assert!(
        log.contains("journal_mib applies when a pool is created"),
        "no warning in the log:\n{log}"
    );
}

/// Waits until the node's pool `p` has made `n` journal ring writes (30 s at most).
fn await_journal_ring_writes(api: &str, n: u64) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while pool_status(api, "p")["write_path"]["journal_ring_writes"]
        .as_u64()
        .unwrap_or(0)
        < n
    {
        assert!(Instant::now() < deadline, "no journal writes");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A RAID 5 of d0-d3 whose stripe journal is on `journal` (a device and its
/// mirror): writes the configuration file, returns its path.
fn journal_config(d: &std::path::Path, journal: &[&str]) -> std::path::PathBuf {
    config(d, "raid5", 4, false, journal)
}

/// The pool's journal devices: (name, failed), and the configured ones it
/// does not use.
fn journal_devices(api: &str) -> (Vec<(String, bool)>, Vec<String>) {
    let p = pool_status(api, "p");
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
    let cfg = journal_config(d, &["d4", "d5"]);
    let s = |n: &str, f: bool| (n.to_string(), f);
    let mut node = start_config(d, &cfg);
    let api = node.api.clone().expect("no API address in the banner");
    assert_eq!(
        journal_devices(&api),
        (vec![s("d4", false), s("d5", false)], vec![])
    );
    node.kill9();
    // one start with d5 alone named (d4.img stays as it is)
    journal_config(d, &["d5"]);
    let mut node = start_config(d, &cfg);
    let api = node.api.clone().expect("no API address in the banner");
    assert_eq!(journal_devices(&api), (vec![s("d5", false)], vec![]));
    node.kill9();
    // d4 named again: left out, and said
    journal_config(d, &["d4", "d5"]);
    let mut node = start_config(d, &cfg);
    let api = node.api.clone().expect("no API address in the banner");
    assert_eq!(
        journal_devices(&api),
        (vec![s("d5", false)], vec!["d4".to_string()])
    );
    let e = common::await_event(&api, |e| e["kind"] == "disk_failed" && e["object"] == "d4");
    let m = e["message"].as_str().unwrap_or_default();
    assert!(
        m.contains("not in use at start") && m.contains("unmirrored on d5"),
        "{e}"
    );
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
    let cfg = journal_config(d, &["d4", "d5"]);
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
    journal_config(d, &["d5"]);
    std::fs::remove_file(d.join("d4.img")).unwrap();
    let mut node = start_config(d, &cfg);
    let api = node.api.clone().expect("no API address in the banner");
    let (ok, out) = freesan(&["pool", "--api", &api, "fail", "p", "1"]);
    assert!(ok, "failing member 1 refused: {out}");
    let p = pool_status(&api, "p");
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
    journal_config(d, &["d5", "d6"]);
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
    journal_config(d, &["d6"]);
    std::fs::remove_file(d.join("d5.img")).unwrap();
    let node = start_config(d, &cfg);
    assert_acknowledged_writes_intact(
        &node.url(0, 0),
        &state,
        "raid5 after SIGKILL with only the journal disk that replaced a lost one",
    );
}
