//! `freesan events [--follow] [--since N]`: the node's event log (disk failed,
//! partner lost, rebuild finished, ...) through `GET /api/v1/events`; with
//! `--follow`, waits for new events (long poll) and prints them as they come.
//!
//! What it does not do: deliver alerts (the node does, see `docs/alerts.md`).

use anyhow::{Context, Result};
use serde_json::Value;
use std::net::SocketAddr;

/// Events asked for per request.
const PAGE: usize = 500;
/// How long one long poll waits on the node.
const WAIT_MS: u64 = 25_000;

fn line(e: &Value) -> String {
    format!(
        "{:>6}  {}  {:<8} {:<24} {:<20} {}",
        e["seq"].as_u64().unwrap_or(0),
        e["time"].as_str().unwrap_or("-"),
        e["severity"].as_str().unwrap_or("-"),
        e["kind"].as_str().unwrap_or("-"),
        e["object"].as_str().unwrap_or("-"),
        e["message"].as_str().unwrap_or("")
    )
}

/// Prints the events after `since` (all kept, or the last `limit`), then with
/// `follow` every new one until interrupted.
pub fn run(api: SocketAddr, since: u64, follow: bool, json: bool) -> Result<()> {
    let mut since = since;
    let mut printed_any = false;
    loop {
        let wait = if follow { WAIT_MS } else { 0 };
        let path = format!("/api/v1/events?since={since}&limit={PAGE}&wait_ms={wait}");
        let (code, v) = crate::poolcmd::http(api, "GET", &path, None)?;
        let v = crate::poolcmd::ok_or_error(code, v)?;
        let events = v["events"]
            .as_array()
            .context("malformed events answer")?
            .clone();
        for e in &events {
            if json {
                println!("{}", serde_json::to_string(e)?);
            } else {
                println!("{}", line(e));
            }
            printed_any = true;
            since = since.max(e["seq"].as_u64().unwrap_or(since));
        }
        if events.len() == PAGE {
            continue;
        }
        if !follow {
            if !printed_any && !json {
                println!("no events");
            }
            return Ok(());
        }
    }
}
