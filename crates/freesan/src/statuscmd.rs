//! `freesan status`: a running node on one screen through its management API:
//! health (pools, replicas), capacity (LUNs, pools), I/O rates, alerts, buffer
//! memory. `freesan reload`: asks the node to re-read its configuration.
//!
//! What it does not do: count I/O itself. Rates come from two samples of the
//! node's counters a second apart (`io` in `GET /api/v1/status`); alerts are the
//! warnings and critical events at the tail of `GET /api/v1/events`.

use crate::poolcmd::{http, ok_or_error};
use anyhow::Result;
use serde_json::Value;
use std::net::SocketAddr;

/// Prints the node's status (`json`: the raw JSON of `GET /api/v1/status`).
pub fn run(api: SocketAddr, json: bool) -> Result<()> {
    let (code, v) = http(api, "GET", "/api/v1/status", None)?;
    let v = ok_or_error(code, v)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    let count = |k: &str| v[k].as_array().map_or(0, Vec::len);
    println!("freesan {}", v["version"].as_str().unwrap_or("?"));
    let portals: Vec<&str> = v["portals"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    println!("  portals        {}", portals.join(" "));
    println!(
        "  LUNs {}  pools {}  caches {}  replicated {}",
        count("luns"),
        count("pools"),
        count("caches"),
        count("replicas")
    );
    println!("  health         {}", health(&v));
    println!("  capacity       {}", capacity(&v));
    println!("  I/O            {}", io_rates(api, &v));
    let b = &v["buffer_memory"];
    let n = |k: &str| b[k].as_u64().unwrap_or(0);
    println!(
        "  buffer memory  {} held of {} (high water {}); {} waits, {} refused; \
         {} a session ({} waits at it), {} a source address ({} waits at it)",
        mib(n("held_bytes")),
        mib(n("max_bytes")),
        mib(n("high_water_bytes")),
        n("waits"),
        n("refusals"),
        mib(n("session_max_bytes")),
        n("session_waits"),
        mib(n("source_max_bytes")),
        n("source_waits")
    );
    alerts(api);
    Ok(())
}

/// `ok`, or what is not: pools not optimal or with lost blocks, caches not
/// ok or holding dirty data they cannot read, disks that stopped answering,
/// replicas not in sync.
fn health(v: &Value) -> String {
    let mut bad = Vec::new();
    for p in v["pools"].as_array().into_iter().flatten() {
        let state = p["state"].as_str().unwrap_or("?");
        if state != "optimal" {
            bad.push(format!(
                "pool {} {state}",
                p["name"].as_str().unwrap_or("?")
            ));
        }
        // redundant again, but with blocks a rebuild could not recover
        if let Some(n) = p["lost_blocks"].as_u64().filter(|&n| n > 0) {
            bad.push(format!(
                "pool {} has {n} lost blocks",
                p["name"].as_str().unwrap_or("?")
            ));
        }
    }
    for c in v["caches"].as_array().into_iter().flatten() {
        let name = c["name"].as_str().unwrap_or("?");
        let state = c["state"].as_str().unwrap_or("ok");
        if c["attached"].as_bool() != Some(false) && state != "ok" && !state.starts_with("draining")
        {
            bad.push(format!("cache {name} {state}"));
        }
        let n = |k: &str| c[k].as_u64().unwrap_or(0);
        if n("lost_dirty_bytes") > 0 {
            bad.push(format!(
                "cache {name} lost {} bytes of written data",
                n("lost_dirty_bytes")
            ));
        }
        if n("unreadable_dirty_bytes") > n("lost_dirty_bytes") {
            bad.push(format!(
                "cache {name} cannot read {} bytes of dirty data",
                n("unreadable_dirty_bytes") - n("lost_dirty_bytes")
            ));
        }
    }
    for d in v["disks_stopped_answering"]
        .as_array()
        .into_iter()
        .flatten()
    {
        bad.push(format!(
            "disk {} stopped answering and is failed",
            d["name"].as_str().unwrap_or("?")
        ));
    }
    for d in v["disks_waited_for"].as_array().into_iter().flatten() {
        bad.push(format!(
            "disk {} is not answering; {} requests wait for it past its timeout",
            d["name"].as_str().unwrap_or("?"),
            d["requests"].as_u64().unwrap_or(0)
        ));
    }
    for r in v["replicas"].as_array().into_iter().flatten() {
        let state = r["state"].as_str().unwrap_or("?");
        if state != "in-sync" {
            bad.push(format!(
                "replica {} {state}",
                r["name"].as_str().unwrap_or("?")
            ));
        }
    }
    if bad.is_empty() {
        "ok".into()
    } else {
        format!("ATTENTION: {}", bad.join(", "))
    }
}

fn capacity(v: &Value) -> String {
    let luns: u64 = v["luns"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|l| l["size_bytes"].as_u64())
        .sum();
    let (mut usable, mut raw) = (0u64, 0u64);
    for p in v["pools"].as_array().into_iter().flatten() {
        usable += p["usable_bytes"].as_u64().unwrap_or(0);
        raw += p["capacity_bytes"].as_u64().unwrap_or(0);
    }
    let mut s = format!("LUNs {}", gib(luns));
    if raw > 0 {
        s += &format!("; pools {} usable of {} raw", gib(usable), gib(raw));
    }
    s
}

/// The node's I/O counters (`io.{read,write}_{bytes,ops}` of its status, summed
/// over every LUN); None when it shows none (an older node).
fn io_counters(v: &Value) -> Option<[u64; 4]> {
    let io = &v["io"];
    let n = |k: &str| io[k].as_u64();
    Some([
        n("read_bytes")?,
        n("write_bytes")?,
        n("read_ops")?,
        n("write_ops")?,
    ])
}

/// Rates over one second from two samples of the node's counters.
fn io_rates(api: SocketAddr, first: &Value) -> String {
    let Some(a) = io_counters(first) else {
        return "no I/O counters on this node".into();
    };
    let started = std::time::Instant::now();
    std::thread::sleep(std::time::Duration::from_secs(1));
    let second = match http(api, "GET", "/api/v1/status", None) {
        Ok((200, v)) => v,
        _ => return "the node did not answer the second sample".into(),
    };
    let Some(b) = io_counters(&second) else {
        return "no I/O counters on this node".into();
    };
    let secs = started.elapsed().as_secs_f64().max(0.001);
    let rate = |i: usize| b[i].saturating_sub(a[i]) as f64 / secs;
    format!(
        "read {:.1} MiB/s ({:.0} IOPS), write {:.1} MiB/s ({:.0} IOPS)",
        rate(0) / (1u64 << 20) as f64,
        rate(2),
        rate(1) / (1u64 << 20) as f64,
        rate(3)
    )
}

/// How far back `freesan status` looks for alerts, in events.
const ALERTS_LOOKBACK_EVENTS: u64 = 1000;

/// The node's recent warnings and critical events (`GET /api/v1/events`, the
/// newest [`ALERTS_LOOKBACK_EVENTS`]), newest last.
fn alerts(api: SocketAddr) {
    const SHOWN: usize = 10;
    let get = |query: &str| match http(api, "GET", &format!("/api/v1/events?{query}"), None) {
        Ok((200, v)) => Ok(v),
        Ok((code, v)) => Err(format!("HTTP {code}: {}", v["error"])),
        Err(e) => Err(format!("{e:#}")),
    };
    // the log is read oldest first: learn where it ends, then read its tail
    let tail = get("limit=1").and_then(|v| {
        let last = v["last_seq"].as_u64().unwrap_or(0);
        let since = last.saturating_sub(ALERTS_LOOKBACK_EVENTS);
        get(&format!("since={since}&limit={ALERTS_LOOKBACK_EVENTS}"))
    });
    let events = match tail {
        Ok(v) => v,
        Err(e) => {
            println!("  alerts         (events: {e})");
            return;
        }
    };
    let list = events["events"].as_array().cloned().unwrap_or_default();
    let serious: Vec<&Value> = list
        .iter()
        .filter(|e| matches!(e["severity"].as_str(), Some("warning" | "critical")))
        .collect();
    if serious.is_empty() {
        println!("  alerts         none");
        return;
    }
    println!("  alerts         {} (latest {SHOWN} shown)", serious.len());
    for e in serious.iter().rev().take(SHOWN).rev() {
        println!(
            "    {} {} {}",
            e["time"].as_str().unwrap_or(""),
            e["severity"].as_str().unwrap_or(""),
            e["message"].as_str().unwrap_or("")
        );
    }
}

/// `freesan reload`: `POST /api/v1/reload`; prints what was applied and what
/// needs a restart (`json`: the raw answer).
pub fn reload(api: SocketAddr, json: bool) -> Result<()> {
    let (code, v) = http(api, "POST", "/api/v1/reload", Some(&serde_json::json!({})))?;
    let v = ok_or_error(code, v)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    let lines = |k: &str| -> Vec<String> {
        v[k].as_array()
            .into_iter()
            .flatten()
            .filter_map(|s| s.as_str().map(str::to_string))
            .collect()
    };
    let (applied, not_applied) = (lines("applied"), lines("not_applied"));
    if applied.is_empty() && not_applied.is_empty() {
        println!("no changes");
    }
    for a in applied {
        println!("applied:      {a}");
    }
    for n in not_applied {
        println!("not applied:  {n}");
    }
    Ok(())
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1u64 << 20) as f64)
}

fn gib(bytes: u64) -> String {
    format!("{:.1} GiB", bytes as f64 / (1u64 << 30) as f64)
}

#[cfg(test)]
mod tests {
    use super::health;
    use serde_json::json;

    #[test]
    fn a_cache_that_lost_or_cannot_read_dirty_data_needs_attention() {
        let with = |c: serde_json::Value| health(&json!({ "caches": [c] }));
        assert_eq!(
            with(json!({"name": "c", "state": "ok", "attached": true})),
            "ok"
        );
        assert_eq!(
            with(json!({"name": "c", "state": "draining: destaging every dirty block"})),
            "ok"
        );
        assert_eq!(
            with(json!({"name": "c", "state": "ok", "unreadable_dirty_bytes": 8192, "lost_dirty_bytes": 4096})),
            "ATTENTION: cache c lost 4096 bytes of written data, cache c cannot read 4096 bytes of dirty data"
        );
        let degraded = with(json!({"name": "c", "state": "degraded: a mirror device failed"}));
        assert!(
            degraded.starts_with("ATTENTION: cache c degraded"),
            "{degraded}"
        );
    }

    #[test]
    fn a_disk_that_stopped_answering_needs_attention() {
        assert_eq!(health(&json!({"disks_stopped_answering": []})), "ok");
        assert_eq!(
            health(&json!({"disks_stopped_answering": [{"name": "d1", "why": "x"}]})),
            "ATTENTION: disk d1 stopped answering and is failed"
        );
    }

    #[test]
    fn a_disk_waited_for_past_its_timeout_needs_attention() {
        assert_eq!(health(&json!({"disks_waited_for": []})), "ok");
        assert_eq!(
            health(&json!({"disks_waited_for": [{"name": "d0", "requests": 3}]})),
            "ATTENTION: disk d0 is not answering; 3 requests wait for it past its timeout"
        );
    }
}
