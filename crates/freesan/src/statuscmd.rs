//! `freesan status`: a running node at a glance through its management API
//! (version, portals, LUNs, pools, caches, replicated LUNs, and the node's
//! buffer memory: held, bound, high water, waits).

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
    let b = &v["buffer_memory"];
    let n = |k: &str| b[k].as_u64().unwrap_or(0);
    println!(
        "  buffer memory  {} held of {} (high water {}); {} waits, {} refused",
        mib(n("held_bytes")),
        mib(n("max_bytes")),
        mib(n("high_water_bytes")),
        n("waits"),
        n("refusals")
    );
    Ok(())
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1u64 << 20) as f64)
}
