//! A write-back SSD cache over a RAID 5 pool: acknowledged writes survive a SIGKILL
//! of the node (dirty data on the mirrored SSDs, reloaded and destaged at restart),
//! and losing one SSD of the mirror in the middle of a run loses nothing (checked
//! with `freesan bench --verify` state and `bench check`). The cache is detached,
//! attached and has a failed SSD replaced while the LUN serves verified writes,
//! without an I/O error, and what was written around a detached cache is never
//! shadowed by what it held.

use crate::common;
use common::*;

fn config(dir: &std::path::Path) -> std::path::PathBuf {
    config_over(dir, 4, "p")
}

/// The cache in front of pool `backing`; with 8 disks there is a second pool,
/// q, of p's shape and size.
fn config_over(dir: &std::path::Path, disks: usize, backing: &str) -> std::path::PathBuf {
    config_over_with(dir, disks, backing, "")
}

/// [`config_over`] with `disk_extra` (lines) in every pool disk's section.
fn config_over_with(
    dir: &std::path::Path,
    disks: usize,
    backing: &str,
    disk_extra: &str,
) -> std::path::PathBuf {
    let mut s = config_head_with(dir, disks, disk_extra);
    // ssd2: a free disk to replace a failed cache device with
    for i in 0..3 {
        s += &format!(
            "[[disk]]\nname = \"ssd{i}\"\nsize = \"40M\"\npath = \"{}/ssd{i}.img\"\n",
            dir.display()
        );
    }
    s += "[[pool]]\nname = \"p\"\nlevel = \"raid5\"\nchunk = \"16K\"\nmembers = [\"d0\", \"d1\", \"d2\", \"d3\"]\n";
    if disks == 8 {
        s += "[[pool]]\nname = \"q\"\nlevel = \"raid5\"\nchunk = \"16K\"\nmembers = [\"d4\", \"d5\", \"d6\", \"d7\"]\n";
    }
    // dirty data stays in the cache (destage only when idle below 90%)
    s += &format!("[[cache]]\nname = \"c\"\npool = \"{backing}\"\nmode = \"write-back\"\ndevices = [\"ssd0\", \"ssd1\"]\n\
          size = \"32M\"\nblock_size = \"64K\"\ndirty_low_percent = 90\ndirty_high_percent = 95\n");
    s += &format!("[[target]]\niqn = \"{IQN}\"\n[[target.lun]]\ncache = \"c\"\n");
    let path = dir.join("node.toml");
    std::fs::write(&path, s).unwrap();
    path
}

/// Pool p of [`config_over`] with cache c in front of it, with `cache` added
/// to its section (its mode...); `None`: no `[[cache]]`, the LUN on the pool
/// directly, as an operator who took the cache out of the configuration has it.
/// Written to `dir/NAME.toml`.
fn config_cache(dir: &std::path::Path, name: &str, cache: Option<&str>) -> std::path::PathBuf {
    let mut s = config_head(dir, 4);
    for i in 0..3 {
        s += &format!(
            "[[disk]]\nname = \"ssd{i}\"\nsize = \"40M\"\npath = \"{}/ssd{i}.img\"\n",
            dir.display()
        );
    }
    s += "[[pool]]\nname = \"p\"\nlevel = \"raid5\"\nchunk = \"16K\"\nmembers = [\"d0\", \"d1\", \"d2\", \"d3\"]\n";
    match cache {
        Some(extra) => {
            s += "[[cache]]\nname = \"c\"\npool = \"p\"\ndevices = [\"ssd0\", \"ssd1\"]\n\
                  size = \"32M\"\nblock_size = \"64K\"\n";
            s += extra;
            s += &format!("[[target]]\niqn = \"{IQN}\"\n[[target.lun]]\ncache = \"c\"\n");
        }
        None => s += &format!("[[target]]\niqn = \"{IQN}\"\n[[target.lun]]\npool = \"p\"\n"),
    }
    let path = dir.join(format!("{name}.toml"));
    std::fs::write(&path, s).unwrap();
    path
}

/// Starts the node of `cfg`, writes (verified, state in `state`) until its
/// cache holds dirty data, then SIGKILLs it.
fn killed_with_dirty_data(dir: &std::path::Path, cfg: &std::path::Path, state: &std::path::Path) {
    let mut node = start_config(dir, cfg);
    let api = node.api.clone().expect("no API address in the banner");
    let mut bench = start_verified_writes(&node.url(0, 0), state, "8k", 2, 10);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while cache_status(&api)["dirty_blocks"].as_u64().unwrap_or(0) == 0 {
        assert!(
            bench.try_wait().unwrap().is_none() && std::time::Instant::now() < deadline,
            "no dirty data in the cache while the bench wrote"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    node.kill9();
    let _ = bench.wait();
}

fn num(v: &serde_json::Value) -> f64 {
    v.as_f64().unwrap_or_else(|| panic!("not a number: {v}"))
}

fn cache_status(api: &str) -> serde_json::Value {
    let (ok, out) = freesan(&["cache", "--api", api, "status", "c", "--json"]);
    assert!(ok, "{out}");
    serde_json::from_str(&out).expect("cache status json")
}

#[test]
fn write_back_cache_sigkill_during_writes_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path());
    let state = dir.path().join("verify.state");
    let mut node = start_config(dir.path(), &cfg);
    let api = node.api.clone().expect("no API address in the banner");
    // a pool behind a cache reads before it journals (data_first defaults to
    // off there: the cache's misses are reads that deep queues would delay)
    let p = pool_status(&api, "p");
    assert_eq!(p["data_first"], false, "{p}");
    let mut bench = start_verified_writes(&node.url(0, 0), &state, "8k", 4, 10);
    let st = cache_status(&api);
    assert!(
        st["dirty_blocks"].as_u64().unwrap_or(0) > 0,
        "no dirty data in the cache at the kill: {st}"
    );
    // a 32 MiB cache under 8K random writes over the whole LUN runs out of
    // frames: those writes go straight to the pool, and are counted. Awaited
    // while the bench runs: how soon depends on the machine's load.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let st = cache_status(&api);
        if num(&st["frameless_writes"]) > 0.0 {
            break;
        }
        assert!(
            bench.try_wait().unwrap().is_none() && std::time::Instant::now() < deadline,
            "the cache never ran out of frames while the bench wrote: {st}"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    // the cache's counters reach Prometheus: each scraped counter lies between
    // the status read before the scrape and the one read after it
    let text = scrape_metrics(&api, &dir.path().join("data"));
    let after = cache_status(&api);
    for (family, field) in [
        (
            "freesan_cache_hits_total{cache=\"c\",op=\"write\"}",
            "write_hits",
        ),
        (
            "freesan_cache_misses_total{cache=\"c\",op=\"write\"}",
            "write_misses",
        ),
        (
            "freesan_cache_frameless_writes_total{cache=\"c\"}",
            "frameless_writes",
        ),
        (
            "freesan_cache_stripe_destages_total{cache=\"c\"}",
            "stripe_destages",
        ),
    ] {
        let v = metric_sample(&text, family, "");
        let (lo, hi) = (num(&st[field]), num(&after[field]));
        assert!(
            lo <= v && v <= hi,
            "{family} = {v}, status {field} {lo}..{hi}"
        );
    }
    node.kill9();
    let _ = bench.wait();
    // restart: the map is reloaded from the SSDs, dirty blocks served and destaged
    let node = start_config(dir.path(), &cfg);
    let api = node.api.clone().expect("no API address in the banner");
    let st = cache_status(&api);
    assert!(
        st["cached_blocks"].as_u64().unwrap_or(0) > 0,
        "nothing reloaded: {st}"
    );
    assert_acknowledged_writes_intact(&node.url(0, 0), &state, "after SIGKILL");
}

/// The configuration of a write-back cache holding dirty data is pointed at
/// another pool of the same shape and size: the node refuses to start rather
/// than serve p's cached blocks as q's or destage them into q. Pointed back
/// at p, every acknowledged write is there.
#[test]
fn a_dirty_cache_pointed_at_another_pool_refuses_to_start() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config_over(dir.path(), 8, "p");
    let state = dir.path().join("verify.state");
    killed_with_dirty_data(dir.path(), &cfg, &state);
    let elsewhere = config_over(dir.path(), 8, "q");
    let (ok, out) = serve_expecting_refusal(&elsewhere);
    assert!(
        !ok,
        "started with the cache's dirty data in front of another pool: {out}"
    );
    assert!(out.contains("another backing volume"), "{out}");
    let cfg = config_over(dir.path(), 8, "p");
    let node = start_config(dir.path(), &cfg);
    assert_acknowledged_writes_intact(&node.url(0, 0), &state, "pointed back at its pool");
}

/// A read cache taken out of the configuration (no `cache detach`) while the
/// pool is written without it, then put back: its table is stale, so it starts
/// empty, and the writes made without it read back (before, it loaded its old
/// table and served the blocks it held from before).
#[test]
fn a_read_cache_put_back_after_its_pool_was_served_without_it_starts_empty() {
    let dir = tempfile::tempdir().unwrap();
    let with = config_cache(dir.path(), "with", Some("mode = \"write-through\"\n"));
    let before = dir.path().join("before.state");
    let mut node = start_config(dir.path(), &with);
    let api = node.api.clone().expect("no API address in the banner");
    let bench = start_verified_writes(&node.url(0, 0), &before, "8k", 2, 3);
    assert!(bench.wait_with_output().unwrap().status.success());
    // the check's reads fill the cache too
    assert_acknowledged_writes_intact(&node.url(0, 0), &before, "through the cache");
    let st = cache_status(&api);
    assert!(num(&st["cached_blocks"]) > 0.0, "nothing cached: {st}");
    assert!(node.terminate(), "no clean stop");
    // the same pool served without the cache, and written again
    let without = config_cache(dir.path(), "without", None);
    let after = dir.path().join("after.state");
    let mut node = start_config(dir.path(), &without);
    let bench = start_verified_writes(&node.url(0, 0), &after, "8k", 2, 3);
    assert!(bench.wait_with_output().unwrap().status.success());
    assert!(node.terminate(), "no clean stop");
    // put back: empty, and what was written without it reads back
    let node = start_config(dir.path(), &with);
    let api = node.api.clone().expect("no API address in the banner");
    let st = cache_status(&api);
    assert_acknowledged_writes_intact(&node.url(0, 0), &after, "the cache put back");
    assert_eq!(
        num(&st["cached_blocks"]),
        0.0,
        "the stale table was loaded: {st}"
    );
}

/// A write-back cache holding dirty data taken out of the configuration: the
/// pool is not served without it (it would return older data for acknowledged
/// writes). Put back with `attached = false`, it destages and detaches at
/// start, and from then on the pool is served directly with every write in it.
#[test]
fn a_pool_whose_write_back_cache_was_never_detached_is_not_served_without_it() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path());
    let state = dir.path().join("verify.state");
    killed_with_dirty_data(dir.path(), &cfg, &state);
    let without = config_cache(dir.path(), "without", None);
    let (ok, out) = serve_expecting_refusal(&without);
    assert!(!ok, "served the pool without its write-back cache: {out}");
    assert!(out.contains("write-back cache \"c\""), "{out}");
    // the way out the refusal names: back in the configuration, detached at start
    let detaching = config_cache(
        dir.path(),
        "detaching",
        Some("mode = \"write-back\"\nattached = false\n"),
    );
    let mut node = start_config(dir.path(), &detaching);
    let api = node.api.clone().expect("no API address in the banner");
    assert_eq!(cache_status(&api)["attached"], false);
    assert_acknowledged_writes_intact(&node.url(0, 0), &state, "detached at start");
    assert!(node.terminate(), "no clean stop");
    let node = start_config(dir.path(), &without);
    assert_acknowledged_writes_intact(&node.url(0, 0), &state, "served without the cache");
}

#[test]
fn losing_one_ssd_of_the_mirror_mid_run_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path());
    let state = dir.path().join("verify.state");
    let mut node = start_config(dir.path(), &cfg);
    let api = node.api.clone().expect("no API address in the banner");
    let mut bench = start_verified_writes(&node.url(0, 0), &state, "8k", 4, 4);
    let (ok, out) = freesan(&["cache", "--api", &api, "fail", "c", "0"]);
    assert!(ok, "{out}");
    let status = bench.wait().unwrap();
    assert!(status.success(), "I/O failed after an SSD was lost");
    let st = cache_status(&api);
    assert!(
        st["state"].as_str().unwrap_or("").starts_with("degraded"),
        "{st}"
    );
    // the survivor holds the only copy of what is not destaged: failing it is
    // refused without --force, and nothing changes
    let (ok, out) = freesan(&["cache", "--api", &api, "fail", "c", "1"]);
    assert!(
        !ok,
        "failing the last SSD of a write-back cache was accepted: {out}"
    );
    assert!(out.contains("last healthy"), "{out}");
    let st = cache_status(&api);
    assert_eq!(st["devices"][1]["state"], "ok", "{st}");
    assert_acknowledged_writes_intact(&node.url(0, 0), &state, "with one SSD left");
    // and after a crash of the node on top, from the survivor alone
    node.kill9();
    let node = start_config(dir.path(), &cfg);
    assert_acknowledged_writes_intact(&node.url(0, 0), &state, "survivor after SIGKILL");
    // an operator who means it can still pull it
    let api = node.api.clone().expect("no API address in the banner");
    let st = cache_cmd(&api, &["fail", "c", "1", "--force"]);
    assert_eq!(st["devices"][1]["state"], "failed", "{st}");
}

fn cache_cmd(api: &str, args: &[&str]) -> serde_json::Value {
    let mut all = vec!["cache", "--api", api];
    all.extend_from_slice(args);
    let (ok, out) = freesan(&all);
    assert!(ok, "freesan cache {args:?}: {out}");
    cache_status(api)
}

#[test]
fn attach_detach_and_ssd_replacement_while_serving_lose_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path());
    let state = dir.path().join("verify.state");
    let mut node = start_config(dir.path(), &cfg);
    let api = node.api.clone().expect("no API address in the banner");
    let mut bench = start_verified_writes(&node.url(0, 0), &state, "8k", 4, 12);

    let st = cache_cmd(&api, &["detach", "c"]);
    assert_eq!(st["attached"], false, "{st}");
    let st = cache_cmd(&api, &["attach", "c"]);
    assert_eq!(st["attached"], true, "{st}");
    assert_eq!(st["mode"], "write-back", "{st}");

    // lose SSD 0, put ssd2 in its place: a healthy mirror again
    let st = cache_cmd(&api, &["fail", "c", "0"]);
    assert_eq!(st["devices"][0]["state"], "failed", "{st}");
    let (ok, out) = freesan(&["cache", "--api", &api, "replace", "c", "1", "ssd2"]);
    assert!(!ok, "replacing a healthy device was accepted: {out}");
    let st = cache_cmd(&api, &["replace", "c", "0", "ssd2"]);
    assert_eq!(st["devices"][0]["name"], "ssd2", "{st}");
    // filled from the survivor while the writes go on, then a healthy mirror
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let st = loop {
        let st = cache_status(&api);
        if st["state"] == "ok" {
            break st;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "never a mirror again: {st}"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    assert_eq!(st["devices"][0]["state"], "ok", "{st}");
    assert_eq!(st["devices"][1]["state"], "ok", "{st}");

    // let the new cache take dirty writes, then go around it for the rest of the run
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while cache_status(&api)["dirty_blocks"].as_u64().unwrap_or(0) == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "no write reached the new cache"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let st = cache_cmd(&api, &["detach", "c"]);
    assert_eq!(st["attached"], false, "{st}");
    assert!(
        bench.try_wait().unwrap().is_none(),
        "the run ended before the cache was detached; nothing was written around it"
    );
    let status = bench.wait().unwrap();
    assert!(
        status.success(),
        "the workload saw an I/O error or a verification failure"
    );
    assert_acknowledged_writes_intact(&node.url(0, 0), &state, "after attach/detach/replace");

    // the config attaches the cache at start: it must come back empty, not with
    // the blocks it held before the writes that went around it
    node.kill9();
    let node = start_config(dir.path(), &cfg);
    let api = node.api.clone().expect("no API address in the banner");
    let st = cache_status(&api);
    assert_eq!(st["attached"], true, "{st}");
    assert_eq!(st["cached_blocks"], 0, "{st}");
    assert_acknowledged_writes_intact(&node.url(0, 0), &state, "restart after detach");
}

/// A node whose write-back cache ([`config_over`]) over a RAID 5 of simulated 7200 rpm disks
/// (a drain takes seconds) holds at least 100 dirty blocks of verified
/// writes (state in `dir/verify.state`); returns the node, its config and
/// a detach of the cache started as a child process, once it is draining.
fn draining_cache(
    dir: &std::path::Path,
) -> (common::Node, std::path::PathBuf, std::process::Child) {
    let cfg = config_over_with(dir, 4, "p", "sim = { model = \"hdd\" }\n");
    let node = start_config(dir, &cfg);
    let api = node.api.clone().expect("no API address in the banner");
    let state = dir.join("verify.state");
    let mut bench = start_verified_writes(&node.url(0, 0), &state, "8k", 2, 3);
    let status = bench.wait().unwrap();
    assert!(status.success(), "the workload failed");
    let dirty = cache_status(&api)["dirty_blocks"].as_u64().unwrap_or(0);
    assert!(dirty >= 100, "only {dirty} dirty blocks to drain");
    let mut detach = std::process::Command::new(env!("CARGO_BIN_EXE_freesan"))
        .args(["cache", "--api", &api, "detach", "c"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let st = cache_status(&api);
        if st["state"].as_str().unwrap_or("").starts_with("draining") {
            break;
        }
        assert!(
            detach.try_wait().unwrap().is_none() && std::time::Instant::now() < deadline,
            "the detach never drained: {st}"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    (node, cfg, detach)
}

/// While a detach drains the dirty data of a cache over slow disks, another
/// action on that cache is answered at once (409, "still running") instead
/// of waiting for the drain: a waiting change held one of the API's change
/// slots, so a client asking again and again could fill them all. The
/// detach itself ends as before.
#[test]
fn an_action_on_a_cache_whose_detach_is_draining_is_refused_not_queued() {
    let dir = tempfile::tempdir().unwrap();
    let (node, _, detach) = draining_cache(dir.path());
    let api = node.api.clone().unwrap();
    let (ok, out) = freesan(&["cache", "--api", &api, "fail", "c", "0"]);
    assert!(!ok, "an action during the drain was carried out: {out}");
    assert!(
        out.contains("still running"),
        "an action during the drain was not refused as such: {out}"
    );
    let st = cache_status(&api);
    assert_eq!(st["devices"][0]["state"], "ok", "{st}");
    let out = detach.wait_with_output().unwrap();
    assert!(out.status.success(), "the detach failed: {out:?}");
    assert_eq!(cache_status(&api)["attached"], false);
    let state = dir.path().join("verify.state");
    assert_acknowledged_writes_intact(&node.url(0, 0), &state, "after the detach");
}

/// A node told to stop (SIGTERM) while a detach drains its cache finishes
/// the detach first (stopped between the detach's switch of the LUNs to the
/// pool and its emptying, the cache would write a full table the pool no
/// longer matches), stops cleanly, and at the next start every acknowledged
/// write reads back, the cache attached again empty. Two waits make the
/// detach end first: the API's stop waits for the changes it runs, and the
/// caches' shutdown for an action holding the cache; this test checks what
/// they give together (with the second alone removed it still passes).
#[test]
fn a_node_stopped_while_a_detach_drains_finishes_it_first() {
    let dir = tempfile::tempdir().unwrap();
    let (mut node, cfg, detach) = draining_cache(dir.path());
    assert!(node.terminate(), "the node did not stop cleanly");
    let log = std::fs::read_to_string(&node.log).unwrap_or_default();
    assert!(
        log.contains("cache detached: dirty data destaged"),
        "the node stopped before the detach ended:\n{log}"
    );
    assert!(!log.contains("still running at shutdown"), "{log}");
    let _ = detach.wait_with_output();
    let node = start_config(dir.path(), &cfg);
    let api = node.api.clone().unwrap();
    let st = cache_status(&api);
    assert_eq!(st["attached"], true, "{st}");
    assert_eq!(st["dirty_blocks"], 0, "{st}");
    let state = dir.path().join("verify.state");
    assert_acknowledged_writes_intact(&node.url(0, 0), &state, "after the restart");
}
