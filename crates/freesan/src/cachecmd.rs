//! `freesan cache ...`: SSD cache status through a running node's management API:
//! hit rates (total and last 10 s), dirty bytes, destage rate, occupancy, devices,
//! memory of the block map, and the advisor's size recommendation.

use crate::poolcmd::{http, ok_or_error};
use anyhow::Result;
use serde_json::Value;
use std::net::SocketAddr;

/// `freesan cache` subcommands.
#[derive(clap::Subcommand, Debug, Clone)]
pub enum CacheCmd {
    /// Status of every cache, or of one, with the advisor's estimate.
    Status {
        /// Cache name.
        name: Option<String>,
        /// Print the raw JSON.
        #[arg(long)]
        json: bool,
    },
    /// Mark cache device DEVICE (position in `devices`) failed, as pulling it would:
    /// a write-back mirror goes on from the other SSD in write-through and destages.
    /// Refused when it is the last healthy device of a write-back cache, unless --force.
    Fail {
        /// Cache name.
        name: String,
        /// Device position.
        device: usize,
        /// Fail it even when that loses data not yet written to the backing volume.
        #[arg(long)]
        force: bool,
    },
    /// Put the cache in front of its LUNs while they serve I/O (created afresh on
    /// its devices: it starts empty).
    Attach {
        /// Cache name.
        name: String,
    },
    /// Take the cache out from under its LUNs while they serve I/O: dirty data is
    /// destaged first (writes go through meanwhile), then the LUNs use the backing.
    Detach {
        /// Cache name.
        name: String,
    },
    /// Replace failed device DEVICE with DISK (a free `[[disk]]`): the cache is
    /// detached (destaged), rebuilt on the new pair and attached again, empty.
    Replace {
        /// Cache name.
        name: String,
        /// Device position.
        device: usize,
        /// A `[[disk]]` of the config that nothing uses.
        disk: String,
    },
}

fn pct(v: &Value) -> String {
    v.as_f64()
        .map(|r| format!("{:.1}%", r * 100.0))
        .unwrap_or_else(|| "-".into())
}

fn bytes(v: &Value) -> String {
    let b = v.as_u64().unwrap_or(0) as f64;
    if b >= (1u64 << 30) as f64 {
        format!("{:.2} GiB", b / (1u64 << 30) as f64)
    } else {
        format!("{:.1} MiB", b / (1u64 << 20) as f64)
    }
}

fn print(c: &Value) {
    if c["attached"] == false {
        println!(
            "cache {}  mode {}  detached (its LUNs use the backing)",
            c["name"].as_str().unwrap_or("?"),
            c["mode"].as_str().unwrap_or("?"),
        );
        return;
    }
    println!(
        "cache {}  mode {}  state: {}",
        c["name"].as_str().unwrap_or("?"),
        c["mode"].as_str().unwrap_or("?"),
        c["state"].as_str().unwrap_or("?")
    );
    println!(
        "  capacity {} in {} blocks of {} KiB; occupancy {:.1}% ({} cached, {} valid)",
        bytes(&c["capacity_bytes"]),
        c["frames"],
        c["block_bytes"].as_u64().unwrap_or(0) / 1024,
        c["occupancy_percent"].as_f64().unwrap_or(0.0),
        c["cached_blocks"],
        bytes(&c["valid_bytes"]),
    );
    println!(
        "  hit rate  read {} (last 10 s {})   write {} (last 10 s {})",
        pct(&c["read_hit_ratio"]),
        pct(&c["recent_read_hit_ratio"]),
        pct(&c["write_hit_ratio"]),
        pct(&c["recent_write_hit_ratio"]),
    );
    println!(
        "  dirty {} in {} blocks; destaged {} ({:.1} MB/s over 10 s); destage errors {}, backing errors {}",
        bytes(&c["dirty_bytes"]),
        c["dirty_blocks"],
        bytes(&c["destaged_bytes"]),
        c["destage_mb_s"].as_f64().unwrap_or(0.0),
        c["destage_errors"],
        c["backing_errors"],
    );
    if c["unreadable_dirty_bytes"].as_u64().unwrap_or(0) > 0 {
        println!(
            "  UNREADABLE DIRTY DATA: {} no cache device can read, {} of it LOST (a resilver \
             could not read it on the surviving half); reads of those blocks fail until they \
             are written again (the node's log names them)",
            bytes(&c["unreadable_dirty_bytes"]),
            bytes(&c["lost_dirty_bytes"]),
        );
    }
    println!(
        "  sequential bypass: {} reads, {} writes; fills {}",
        c["bypassed_reads"], c["bypassed_writes"], c["fills"]
    );
    if let Some(devs) = c["devices"].as_array() {
        let d: Vec<String> = devs
            .iter()
            .map(|d| {
                format!(
                    "{} {}",
                    d["name"].as_str().unwrap_or("?"),
                    d["state"].as_str().unwrap_or("?")
                )
            })
            .collect();
        println!("  devices: {}", d.join(", "));
    }
    println!(
        "  block map in RAM: {} ({} KiB per GiB of cache); advisor {}",
        bytes(&c["map_memory_bytes"]),
        c["map_bytes_per_gib"].as_u64().unwrap_or(0) / 1024,
        bytes(&c["advisor_memory_bytes"]),
    );
    if let Some(curve) = c["advisor_curve"].as_array() {
        if !curve.is_empty() {
            println!("  advisor (estimated hit ratio of this workload by cache size):");
            for p in curve {
                println!(
                    "    {:>12}  {}",
                    bytes(&p["cache_bytes"]),
                    pct(&p["hit_ratio"])
                );
            }
        }
    }
    match c["advisor_bytes_for_90_percent"].as_u64() {
        Some(b) => println!(
            "  advisor: {} of cache for a 90% hit rate",
            bytes(&Value::from(b))
        ),
        None => println!("  advisor: no size in its range reaches a 90% hit rate (yet)"),
    }
}

/// Runs a `freesan cache` command against the API at `api`.
pub fn run(api: SocketAddr, cmd: CacheCmd) -> Result<()> {
    match cmd {
        CacheCmd::Status { name, json } => {
            let path = match &name {
                Some(n) => format!("/api/v1/caches/{n}"),
                None => "/api/v1/caches".to_string(),
            };
            let (code, v) = http(api, "GET", &path, None)?;
            let v = ok_or_error(code, v)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&v)?);
                return Ok(());
            }
            match v.as_array() {
                Some(all) if all.is_empty() => println!("no cache configured"),
                Some(all) => all.iter().for_each(print),
                None => print(&v),
            }
            Ok(())
        }
        CacheCmd::Fail {
            name,
            device,
            force,
        } => {
            let body = serde_json::json!({ "device": device, "force": force });
            post(api, &name, "fail", Some(&body))
        }
        CacheCmd::Attach { name } => post(api, &name, "attach", None),
        CacheCmd::Detach { name } => post(api, &name, "detach", None),
        CacheCmd::Replace { name, device, disk } => {
            let body = serde_json::json!({ "device": device, "disk": disk });
            post(api, &name, "replace", Some(&body))
        }
    }
}

/// POSTs a cache action and prints the cache's new status.
fn post(api: SocketAddr, name: &str, action: &str, body: Option<&Value>) -> Result<()> {
    let (code, v) = http(
        api,
        "POST",
        &format!("/api/v1/caches/{name}/{action}"),
        body,
    )?;
    print(&ok_or_error(code, v)?);
    Ok(())
}
