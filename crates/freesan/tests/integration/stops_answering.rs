//! A pool member that stops answering, on a real node: disk `d1` of a RAID 1
//! pool is a file on an ext4 file system (a loop mount) that is frozen
//! (`fsfreeze`), so the kernel takes its writes and answers none, as a hung
//! drive does. With `io_timeout_secs = 2` on that disk, verified random
//! writes to the LUN go on (each one meeting the hung disk answers once its
//! request times out), the pool is degraded with `d1` failed, `GET /disks`,
//! the metrics and a critical event say the disk stopped answering, and
//! every acknowledged write reads back. Then `d0`, on a second frozen file
//! system, holds the pool's last copy: it is waited for past its timeout,
//! not failed, and the writes answer after its thaw. d1 is not taken back
//! while its device holds requests (CLI and console refuse), is taken back
//! (from the console) once thawed, rebuilt into its pool and serves alone.
//! The node then stops cleanly. Both members on one frozen file system (a
//! stall they share, writes held, reads answered) are both waited for. A
//! disk a LUN serves directly, or a cache's backing disk, is waited for.
//! And a node that is itself stopped past the timeout fails no disk.

use crate::common;
use common::*;
use std::path::{Path, PathBuf};
use std::process::Command;

fn ok(cmd: &mut Command) -> bool {
    cmd.status().is_ok_and(|s| s.success())
}

/// An ext4 file system on a loop device over a file in `dir`, mounted on
/// `dir/name`; unmounted (lazily) when dropped. None where loop mounts are
/// not allowed.
pub(crate) struct Mounted(pub(crate) PathBuf);

impl Mounted {
    pub(crate) fn new(dir: &Path, name: &str) -> Option<Mounted> {
        let img = dir.join(format!("{name}.img"));
        std::fs::File::create(&img)
            .unwrap()
            .set_len(256 << 20)
            .unwrap();
        let mnt = dir.join(name);
        std::fs::create_dir(&mnt).unwrap();
        if !ok(Command::new("mkfs.ext4").args(["-q", "-F"]).arg(&img)) {
            return None;
        }
        ok(Command::new("mount")
            .args(["-o", "loop"])
            .arg(&img)
            .arg(&mnt))
        .then_some(Mounted(mnt))
    }
}

/// Says a test is skipped where loop mounts are not allowed (not root),
/// unless the tools are required (`FREESAN_REQUIRE_TOOLS`, as in CI).
pub(crate) fn skipped() {
    assert!(
        std::env::var("FREESAN_REQUIRE_TOOLS").is_err(),
        "loop mounts and fsfreeze are required (run the tests as root)"
    );
    eprintln!("skipped: no loop mount here (not root?)");
}

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// Thaws the frozen file system at its path when dropped: before the node
/// (whose exit waits for the requests the kernel holds) is killed.
pub(crate) struct Frozen(PathBuf);

impl Frozen {
    pub(crate) fn freeze(mnt: &Path) -> Frozen {
        assert!(
            ok(Command::new("fsfreeze").arg("-f").arg(mnt)),
            "fsfreeze -f"
        );
        Frozen(mnt.to_path_buf())
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        let _ = Command::new("fsfreeze").arg("-u").arg(&self.0).status();
    }
}

#[test]
fn a_pool_member_that_stops_answering_is_failed_and_the_lun_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let (Some(mounted), Some(mounted0)) = (
        Mounted::new(dir.path(), "frz"),
        Mounted::new(dir.path(), "frz0"),
    ) else {
        return skipped();
    };
    let d = dir.path().display();
    let cfg = format!(
        "data_dir = \"{d}/data\"\n[api]\naddress = \"127.0.0.1:0\"\nconsole = \"127.0.0.1:0\"\n\
         [[portal]]\naddress = \"127.0.0.1:0\"\n\
         [[disk]]\nname = \"d0\"\nsize = \"64M\"\npath = \"{m0}/d0.img\"\nio_timeout_secs = 2\n\
         [[disk]]\nname = \"d1\"\nsize = \"64M\"\npath = \"{m}/d1.img\"\nio_timeout_secs = 2\n\
         [[pool]]\nname = \"p\"\nlevel = \"raid1\"\nmembers = [\"d0\", \"d1\"]\n\
         [[target]]\niqn = \"{IQN}\"\n[[target.lun]]\npool = \"p\"\n",
        m = mounted.0.display(),
        m0 = mounted0.0.display()
    );
    let (mut node, api, auth) = serve(dir.path(), &cfg);
    await_pool_state(&api, "p", "optimal");

    let frozen = Frozen::freeze(&mounted.0);
    let state = dir.path().join("verify.json");
    let bench = start_verified_writes(&node.url(0, 0), &state, "4k", 2, 4);
    let out = bench.wait_with_output().expect("bench");
    assert!(out.status.success(), "the writes failed while d1 hung");
    let p = pool_status(&api, "p");
    assert_eq!(p["state"], "degraded", "{p}");
    let d1 = p["members"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == "d1")
        .unwrap_or_else(|| panic!("no d1 in {p}"));
    assert_eq!(d1["state"], "failed", "{p}");
    let (d0, d1) = (disk_now(&api, &auth, "d0"), disk_now(&api, &auth, "d1"));
    assert!(d0["stopped_answering"].is_null(), "{d0}");
    assert_eq!(d0["timeouts"], 0, "{d0}");
    let why = d1["stopped_answering"]
        .as_str()
        .unwrap_or_else(|| panic!("{d1}"));
    assert!(why.contains("no answer in 2.0 s"), "{d1}");
    assert!(d1["timeouts"].as_u64().unwrap() >= 1, "{d1}");
    let (ok_list, list) = cli(&api, &["disk", "list"]);
    assert!(
        ok_list
            && list.contains("stopped answering")
            && list.contains("still at the device: it can be taken back once they end"),
        "{list}"
    );
    let (ok_status, status) = cli(&api, &["status"]);
    assert!(
        ok_status && status.contains("disk d1 stopped answering"),
        "{status}"
    );
    let metrics = scrape_metrics(&api, &dir.path().join("data"));
    assert!(
        metric_sample(&metrics, "freesan_disk_io_timeouts_total{", "\"d1\"") >= 1.0,
        "{metrics}"
    );
    let ev = await_event(&api, |e| e["kind"] == "disk_stopped_answering");
    assert_eq!(ev["severity"], "critical", "{ev}");
    assert!(ev["message"].as_str().unwrap_or("").contains("d1"), "{ev}");
    assert_acknowledged_writes_intact(&node.url(0, 0), &state, "with d1 hung");
    // not taken back while the writes it timed out on are still held by the
    // frozen file system (one could land over a rebuild), nor a disk that
    // has not failed
    let (ok_reopen, out) = cli(&api, &["disk", "reopen", "d1"]);
    assert!(!ok_reopen && out.contains("no answer"), "{out}");
    let (ok_reopen, out) = cli(&api, &["disk", "reopen", "d0"]);
    assert!(!ok_reopen && out.contains("has not failed"), "{out}");

    // d0 now holds the pool's last copy: when it stops answering too, it is
    // waited for (said: `timeouts_waited`, the metric, a critical event),
    // not failed, and the writes answer once it answers again
    let frozen0 = Frozen::freeze(&mounted0.0);
    let state0 = dir.path().join("verify0.json");
    let bench = start_verified_writes(&node.url(0, 0), &state0, "4k", 2, 2);
    await_waited_for_and_said(&api, &auth, "d0");
    let (code, metrics) = http(&api, "GET", "/metrics", &[&auth], "");
    assert_eq!(code, 200, "{metrics}");
    assert!(
        metric_sample(&metrics, "freesan_disk_io_timeouts_waited_total{", "\"d0\"") >= 1.0,
        "{metrics}"
    );
    drop(frozen0);
    let out = bench.wait_with_output().expect("bench");
    assert!(out.status.success(), "the writes failed while d0 stalled");
    let p = pool_status(&api, "p");
    assert_eq!(p["state"], "degraded", "{p}");
    assert_acknowledged_writes_intact(&node.url(0, 0), &state0, "after d0's stall");

    // the console's storage page says both, and that d1's device still
    // holds requests; its take-back is refused there too (looked at:
    // screenshots)
    let console = crate::console::tools().then(|| {
        let admin = make_token(&dir.path().join("data"), "admin", "console");
        let shots = crate::console::repo().join("target/console-screenshots");
        let url = format!("http://{}/", crate::console::console_addr(&node));
        move |expect: &str, notice: &str, after: &str, names: [&str; 2]| {
            let input = serde_json::json!({
                "scenario": "page",
                "url": url,
                "token": admin,
                "page": "storage",
                "selector": "#st-disks",
                "expect": expect,
                "shots": shots,
                "name": names[0],
                "click": "button[data-act=reopen][data-name=d1]",
                "notice": notice,
                "after": after,
                "click_name": names[1],
            });
            let (ok, out) = crate::console::drive_with(Command::new("node"), &input);
            assert!(ok, "{out}");
        }
    });
    if let Some(console) = &console {
        console(
            "waited past its timeout \\d+×[\\s\\S]*stopped answering: a \\w+ at lba \
             [\\s\\S]*?\\d+ requests? still at the device",
            "Take back d1: .*no answer",
            "stopped answering",
            [
                "storage-disk-stopped-answering",
                "storage-disk-take-back-refused",
            ],
        );
    }

    // thawed, the requests the kernel held end: d1, answering again, is
    // taken back (from the console where it can be driven) and given back
    // to its pool, which rebuilds onto it
    drop(frozen);
    await_disk(&api, &auth, "d1", |d| d["in_flight"] == 0);
    let (ok_list, list) = cli(&api, &["disk", "list"]);
    assert!(
        ok_list && list.contains("take it back with freesan disk reopen d1"),
        "{list}"
    );
    match &console {
        Some(console) => console(
            "stopped answering",
            "Take back d1: done · give it back to pool p with Replace… at position 1",
            "^(?![\\s\\S]*stopped answering)",
            ["storage-disk-answering-again", "storage-disk-taken-back"],
        ),
        None => {
            let (ok_reopen, out) = cli(&api, &["disk", "reopen", "d1"]);
            assert!(
                ok_reopen && out.contains("freesan pool replace p 1 d1"),
                "{out}"
            );
        }
    }
    let d1 = await_disk(&api, &auth, "d1", |d| d["role"] == "free");
    assert!(d1["stopped_answering"].is_null(), "{d1}");
    let (ok_replace, out) = cli(&api, &["pool", "replace", "p", "1", "d1"]);
    assert!(ok_replace, "{out}");
    await_pool_state(&api, "p", "optimal");
    let d1 = await_disk(&api, &auth, "d1", |d| d["role"] == "member");
    assert_eq!(d1["state"], "active", "{d1}");
    // the rebuilt d1 alone (d0 failed) serves what was written before it
    // came back, copied by the rebuild (the last run's writes: every run
    // writes the same blocks, so only the last run's map can be checked),
    // and takes new writes
    let (ok_fail, out) = cli(&api, &["pool", "fail", "p", "0"]);
    assert!(ok_fail, "{out}");
    assert_acknowledged_writes_intact(&node.url(0, 0), &state0, "from the rebuilt d1 alone");
    let state2 = dir.path().join("verify2.json");
    let bench = start_verified_writes(&node.url(0, 0), &state2, "4k", 2, 2);
    let out = bench.wait_with_output().expect("bench");
    assert!(out.status.success(), "the writes failed on d1 alone");
    assert_acknowledged_writes_intact(&node.url(0, 0), &state2, "from the rebuilt d1 alone");
    assert!(
        node.terminate(),
        "the node did not stop cleanly after the thaw"
    );
}

/// Starts a node on `cfg` (written to `dir/node.toml`); returns it with its
/// API address and the Authorization header of a read-only token.
fn serve(dir: &Path, cfg: &str) -> (Node, String, String) {
    let cfg_path = dir.join("node.toml");
    std::fs::write(&cfg_path, cfg).unwrap();
    let node = start_config(dir, &cfg_path);
    let api = node.api.clone().expect("no API address in the banner");
    let token = make_token(&dir.join("data"), "read-only", "disks");
    (node, api, format!("Authorization: Bearer {token}"))
}

/// Waits (60 s at most) until `GET /disks` shows disk `name` as `holds`
/// wants; returns it.
fn await_disk(
    api: &str,
    auth: &str,
    name: &str,
    holds: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let d = disk_now(api, auth, name);
        if holds(&d) {
            return d;
        }
        assert!(std::time::Instant::now() < deadline, "never: {d}");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// Waits (60 s at most) until pool `pool` is in `state` (the initial
/// resync done: `optimal`).
fn await_pool_state(api: &str, pool: &str, state: &str) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while pool_status(api, pool)["state"] != state {
        assert!(
            std::time::Instant::now() < deadline,
            "{}",
            pool_status(api, pool)
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// Waits (60 s at most) until `GET /disks` says a request to disk `name`
/// was waited for past its timeout, the disk not failed; then that a
/// critical `disk_stalled` event and `freesan status` say so.
fn await_waited_for_and_said(api: &str, auth: &str, name: &str) {
    await_waited_for(api, auth, name);
    let ev = await_event(api, |e| e["kind"] == "disk_stalled" && e["object"] == name);
    assert_eq!(ev["severity"], "critical", "{ev}");
    assert!(ev["message"].as_str().unwrap_or("").contains(name), "{ev}");
    let (ok_status, status) = cli(api, &["status"]);
    assert!(
        ok_status && status.contains(&format!("disk {name} is not answering")),
        "{status}"
    );
}

/// Waits (60 s at most) until `GET /disks` says a request to disk `name`
/// was waited for past its timeout, the disk not failed.
fn await_waited_for(api: &str, auth: &str, name: &str) {
    await_disk(api, auth, name, |d| {
        assert!(d["stopped_answering"].is_null(), "{d}");
        d["timeouts_waited"].as_u64().unwrap() >= 1
    });
}

/// Disk `name` as `GET /disks` shows it now.
fn disk_now(api: &str, auth: &str, name: &str) -> serde_json::Value {
    let (code, body) = http(api, "GET", "/api/v1/disks", &[auth], "");
    assert_eq!(code, 200, "{body}");
    let disks: serde_json::Value = serde_json::from_str(&body).unwrap();
    disks
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["name"] == name)
        .unwrap_or_else(|| panic!("no {name} in {disks}"))
        .clone()
}

/// Both members of a RAID 1 pool are files on one ext4 file system that is
/// frozen (as a network file system failing over, or a snapshot taken under
/// every disk file, holds them): writes stall on both, while reads still
/// answer. Each member's keeper asks the other a write, finds it silent
/// too, and waits; after the thaw the writes answer, both members are
/// active, and no disk has a timeout. Asked a read (which the frozen file
/// system answers), the keeper failed the first member to time out.
#[test]
fn a_write_stall_every_member_shares_is_waited_out() {
    let dir = tempfile::tempdir().unwrap();
    let Some(mounted) = Mounted::new(dir.path(), "frz") else {
        return skipped();
    };
    let cfg = format!(
        "data_dir = \"{d}/data\"\n[api]\naddress = \"127.0.0.1:0\"\n\
         [[portal]]\naddress = \"127.0.0.1:0\"\n\
         [[disk]]\nname = \"d0\"\nsize = \"64M\"\npath = \"{m}/d0.img\"\nio_timeout_secs = 2\n\
         [[disk]]\nname = \"d1\"\nsize = \"64M\"\npath = \"{m}/d1.img\"\nio_timeout_secs = 2\n\
         [[pool]]\nname = \"p\"\nlevel = \"raid1\"\nmembers = [\"d0\", \"d1\"]\n\
         [[target]]\niqn = \"{IQN}\"\n[[target.lun]]\npool = \"p\"\n",
        d = dir.path().display(),
        m = mounted.0.display()
    );
    let (mut node, api, auth) = serve(dir.path(), &cfg);
    await_pool_state(&api, "p", "optimal");
    let frozen = Frozen::freeze(&mounted.0);
    let state = dir.path().join("verify.json");
    let bench = start_verified_writes(&node.url(0, 0), &state, "4k", 2, 2);
    // both wait (each asked, the other silent to a write) for a timeout
    // and more before the thaw
    await_waited_for(&api, &auth, "d0");
    await_waited_for(&api, &auth, "d1");
    drop(frozen);
    let out = bench.wait_with_output().expect("bench");
    assert!(out.status.success(), "the writes failed over the stall");
    let p = pool_status(&api, "p");
    assert_eq!(p["state"], "optimal", "a member was failed: {p}");
    for d in ["d0", "d1"].map(|n| disk_now(&api, &auth, n)) {
        assert_eq!(d["timeouts"].as_u64(), Some(0), "{d}");
        assert!(d["stopped_answering"].is_null(), "{d}");
    }
    assert_acknowledged_writes_intact(&node.url(0, 0), &state, "after the stall");
    assert!(node.terminate(), "the node did not stop cleanly");
}

/// A disk a LUN serves directly holds the only copy of its data: when it
/// stops answering (a file on a frozen ext4), it is waited for past its
/// command timeout, not failed, and the writes answer after the thaw.
/// Failed at the timeout, every later request to the LUN failed until the
/// node restarted.
#[test]
fn a_disk_a_lun_serves_directly_is_waited_for() {
    the_only_copy_is_waited_for("[[target.lun]]\ndisk = \"d0\"\n");
}

/// The same for a cache's backing disk (a write-through cache in front of
/// it, its SSD answering): the writes the cache passes through wait for
/// the disk rather than failing it.
#[test]
fn a_cache_backing_disk_is_waited_for() {
    let cache = "[[disk]]\nname = \"ssd0\"\nsize = \"64M\"\npath = \"DIR/ssd0.img\"\n\
                 [[cache]]\nname = \"c\"\ndisk = \"d0\"\nmode = \"write-through\"\n\
                 devices = [\"ssd0\"]\n\
                 [[target.lun]]\ncache = \"c\"\n";
    the_only_copy_is_waited_for(cache);
}

/// Disk `d0`, on an ext4 that is frozen under verified writes, served by
/// `lun` (the config's tail: the LUN, and what stands between; `DIR` in it
/// the test's directory): waited for,
/// said, and neither timed out nor failed; the writes intact after the thaw.
fn the_only_copy_is_waited_for(lun: &str) {
    let dir = tempfile::tempdir().unwrap();
    let Some(mounted) = Mounted::new(dir.path(), "frz") else {
        return skipped();
    };
    let cfg = format!(
        "data_dir = \"{d}/data\"\n[api]\naddress = \"127.0.0.1:0\"\n\
         [[portal]]\naddress = \"127.0.0.1:0\"\n\
         [[disk]]\nname = \"d0\"\nsize = \"64M\"\npath = \"{m}/d0.img\"\nio_timeout_secs = 2\n\
         [[target]]\niqn = \"{IQN}\"\n{lun}",
        d = dir.path().display(),
        m = mounted.0.display(),
        lun = lun.replace("DIR", &dir.path().display().to_string())
    );
    let (mut node, api, auth) = serve(dir.path(), &cfg);
    let frozen = Frozen::freeze(&mounted.0);
    let state = dir.path().join("verify.json");
    let bench = start_verified_writes(&node.url(0, 0), &state, "4k", 2, 2);
    await_waited_for_and_said(&api, &auth, "d0");
    drop(frozen);
    let out = bench.wait_with_output().expect("bench");
    assert!(out.status.success(), "the writes failed while d0 stalled");
    assert_acknowledged_writes_intact(&node.url(0, 0), &state, "after d0's stall");
    let d0 = disk_now(&api, &auth, "d0");
    assert_eq!(d0["timeouts"].as_u64(), Some(0), "{d0}");
    assert!(d0["stopped_answering"].is_null(), "{d0}");
    assert!(node.terminate(), "the node did not stop cleanly");
}

/// A node that is itself stopped (SIGSTOP, as a paused virtual machine or a
/// debugger stops it) for longer than its disks' command timeout, with
/// requests in flight: on waking, the requests the disks answered meanwhile
/// are taken, not timed out, and no disk is failed.
#[test]
fn a_node_stopped_past_its_disks_timeout_fails_no_disk() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config_head_with(dir.path(), 2, "io_timeout_secs = 2\n")
        + "[[pool]]\nname = \"p\"\nlevel = \"raid1\"\nmembers = [\"d0\", \"d1\"]\n"
        + &format!("[[target]]\niqn = \"{IQN}\"\n[[target.lun]]\npool = \"p\"\n");
    let (node, api, _) = serve(dir.path(), &cfg);
    let pid = node.child.as_ref().unwrap().id() as i32;
    let state = dir.path().join("verify.json");
    let bench = start_verified_writes(&node.url(0, 0), &state, "4k", 4, 6);
    // in full swing: requests in flight at the disks when the node stops
    unsafe { libc::kill(pid, libc::SIGSTOP) };
    std::thread::sleep(std::time::Duration::from_secs(5));
    unsafe { libc::kill(pid, libc::SIGCONT) };
    let out = bench.wait_with_output().expect("bench");
    assert!(out.status.success(), "the writes failed");
    let p = pool_status(&api, "p");
    assert!(
        p["members"]
            .as_array()
            .unwrap()
            .iter()
            .all(|m| m["state"] == "active"),
        "a disk was failed: {p}"
    );
    let metrics = scrape_metrics(&api, &dir.path().join("data"));
    for d in ["\"d0\"", "\"d1\""] {
        assert_eq!(
            metric_sample(&metrics, "freesan_disk_io_timeouts_total{", d),
            0.0,
            "{metrics}"
        );
    }
    assert_acknowledged_writes_intact(&node.url(0, 0), &state, "after the stop");
}

/// A disk that stopped answering is taken back from wherever its failure
/// left it, once it answers again, and not before. Pool member `d1` and
/// cache device `ssd1` (a write-back mirror with `ssd0`) are files on one
/// ext4 that is frozen under verified writes to both LUNs: each is failed
/// at its timeout (its sibling answered). The pool's spare takes `d1`'s
/// place, so `d1` is `retired`; `ssd1` is still the cache's, and its
/// take-back is refused until it is replaced in the cache (`freesan cache
/// replace`), and then, retired too, refused while its device holds the
/// frozen writes. Once thawed, both are taken back as free disks, and the
/// writes to both LUNs read back.
#[test]
fn a_retired_disk_and_a_cache_device_are_taken_back_once_they_answer() {
    let dir = tempfile::tempdir().unwrap();
    let Some(mounted) = Mounted::new(dir.path(), "frz") else {
        return skipped();
    };
    let (d, m) = (dir.path().display(), mounted.0.display());
    let disk = |name: &str, at: &dyn std::fmt::Display| {
        format!(
            "[[disk]]\nname = \"{name}\"\nsize = \"64M\"\npath = \"{at}/{name}.img\"\n\
             io_timeout_secs = 2\n"
        )
    };
    let mut cfg = format!(
        "data_dir = \"{d}/data\"\n[api]\naddress = \"127.0.0.1:0\"\n\
         [[portal]]\naddress = \"127.0.0.1:0\"\n"
    );
    for (name, at) in [
        ("d0", &d as &dyn std::fmt::Display),
        ("d1", &m),
        ("s", &d),
        ("b", &d),
        ("ssd0", &d),
        ("ssd1", &m),
        ("ssd2", &d),
    ] {
        cfg += &disk(name, at);
    }
    cfg += "[[pool]]\nname = \"p\"\nlevel = \"raid1\"\nmembers = [\"d0\", \"d1\"]\n\
            spares = [\"s\"]\n\
            [[cache]]\nname = \"c\"\ndisk = \"b\"\nmode = \"write-back\"\n\
            devices = [\"ssd0\", \"ssd1\"]\n";
    cfg += &format!(
        "[[target]]\niqn = \"{IQN}\"\n[[target.lun]]\nid = 0\npool = \"p\"\n\
         [[target.lun]]\nid = 1\ncache = \"c\"\n"
    );
    let (mut node, api, auth) = serve(dir.path(), &cfg);
    await_pool_state(&api, "p", "optimal");

    let frozen = Frozen::freeze(&mounted.0);
    let states = [0, 1].map(|lun| dir.path().join(format!("verify{lun}.json")));
    let benches = [0, 1]
        .map(|lun| start_verified_writes(&node.url(0, lun), &states[lun as usize], "4k", 2, 3));
    for (lun, bench) in benches.into_iter().enumerate() {
        let out = bench.wait_with_output().expect("bench");
        assert!(out.status.success(), "the writes to LUN {lun} failed");
    }
    // d1 failed and its pool's spare took its place: retired
    await_pool_state(&api, "p", "optimal");
    let d1 = await_disk(&api, &auth, "d1", |d| d["role"] == "retired");
    assert!(!d1["stopped_answering"].is_null(), "{d1}");
    let ssd1 = disk_now(&api, &auth, "ssd1");
    assert!(!ssd1["stopped_answering"].is_null(), "{ssd1}");
    assert_eq!(ssd1["role"], "cache", "{ssd1}");
    // the cache still names ssd1: not taken back until replaced there
    let (ok_reopen, out) = cli(&api, &["disk", "reopen", "ssd1"]);
    assert!(!ok_reopen && out.contains("freesan cache replace"), "{out}");
    let (ok_replace, out) = cli(&api, &["cache", "replace", "c", "1", "ssd2"]);
    assert!(ok_replace, "{out}");
    await_disk(&api, &auth, "ssd1", |d| d["role"] == "retired");
    // retired, each still has its timed-out writes in the frozen kernel
    for name in ["d1", "ssd1"] {
        let (ok_reopen, out) = cli(&api, &["disk", "reopen", name]);
        assert!(!ok_reopen && out.contains("no answer"), "{name}: {out}");
    }

    drop(frozen);
    for name in ["d1", "ssd1"] {
        await_disk(&api, &auth, name, |d| d["in_flight"] == 0);
        let (ok_reopen, out) = cli(&api, &["disk", "reopen", name]);
        // (no position of a pool waits for either: no way back to name)
        assert!(
            ok_reopen && out.contains("taken back") && !out.contains("pool replace"),
            "{name}: {out}"
        );
        let back = await_disk(&api, &auth, name, |d| d["role"] == "free");
        assert!(back["stopped_answering"].is_null(), "{back}");
        assert_eq!(back["state"], "ok", "{back}");
    }
    for (lun, state) in states.iter().enumerate() {
        assert_acknowledged_writes_intact(&node.url(0, lun as u32), state, &format!("LUN {lun}"));
    }
    assert!(node.terminate(), "the node did not stop cleanly");
}
