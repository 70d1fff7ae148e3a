//! `freesan disk ...` and `freesan lun ...`: create, list and delete disks and LUNs
//! on a running node through its management API (kept across restarts in
//! `DATA_DIR/managed.toml`).

use crate::poolcmd::{http, ok_or_error};
use anyhow::{bail, Result};
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::path::PathBuf;

/// `freesan disk` subcommands.
#[derive(clap::Subcommand, Debug, Clone)]
pub enum DiskCmd {
    /// Create a disk pools can be built from: a file (by default
    /// DATA_DIR/disks/NAME.img, created with --size) or a block device (--path), or
    /// a simulated HDD or SSD (--sim) whose data lives in such a file.
    Create {
        /// Disk name.
        name: String,
        /// Size of a new file (4G, 512M).
        #[arg(long)]
        size: Option<String>,
        /// The file or block device (default DATA_DIR/disks/NAME.img).
        #[arg(long)]
        path: Option<PathBuf>,
        /// Simulate a device with the timing of a 7200 rpm HDD or a SATA SSD.
        #[arg(long, value_parser = ["hdd", "ssd"])]
        sim: Option<String>,
    },
    /// Every disk of the node, and whether it is free (in no pool and no LUN).
    List {
        /// Print the raw JSON.
        #[arg(long)]
        json: bool,
    },
}

/// `freesan lun` subcommands.
#[derive(clap::Subcommand, Debug, Clone)]
pub enum LunCmd {
    /// Add a LUN to a configured target while it serves (initiators are told to
    /// rescan); exactly one of --pool, --disk, --cache, --file. For an HA pair, run
    /// it with --replicated on both nodes.
    Create {
        /// Target name (IQN).
        #[arg(long)]
        target: String,
        /// LUN number (default: the lowest free one).
        #[arg(long)]
        lun: Option<u64>,
        /// Serve this pool.
        #[arg(long)]
        pool: Option<String>,
        /// Serve this free disk.
        #[arg(long)]
        disk: Option<String>,
        /// Serve this cache.
        #[arg(long)]
        cache: Option<String>,
        /// Serve this file (created with --size if missing).
        #[arg(long)]
        file: Option<PathBuf>,
        /// Size of a new file.
        #[arg(long)]
        size: Option<String>,
        /// Logical block size, 512 or 4096.
        #[arg(long, default_value_t = 512)]
        block_size: u32,
        /// Replicate synchronously to the HA partner (which creates the same LUN).
        #[arg(long)]
        replicated: bool,
        /// active-active (default) or active-passive.
        #[arg(long, requires = "replicated", value_parser = ["active-active", "active-passive"])]
        mode: Option<String>,
        /// Serve it write protected.
        #[arg(long)]
        read_only: bool,
    },
    /// Remove a LUN created with `lun create` (its data stays on its backing).
    Delete {
        /// Target name (IQN).
        #[arg(long)]
        target: String,
        /// LUN number.
        #[arg(long)]
        lun: u64,
    },
    /// Every LUN the node serves.
    List {
        /// Print the raw JSON.
        #[arg(long)]
        json: bool,
    },
}

fn print_json(v: &Value) -> Result<()> {
    println!("{}", serde_json::to_string_pretty(v)?);
    Ok(())
}

/// Runs a `freesan disk` subcommand against the API at `api`.
pub fn disk(api: SocketAddr, cmd: DiskCmd) -> Result<()> {
    match cmd {
        DiskCmd::Create {
            name,
            size,
            path,
            sim,
        } => {
            let mut body = json!({ "name": name });
            if let Some(s) = size {
                body["size"] = json!(s);
            }
            if let Some(p) = path {
                body["path"] = json!(p);
            }
            if let Some(m) = sim {
                body["sim"] = json!({ "model": m });
            }
            let (code, v) = http(api, "POST", "/api/v1/disks", Some(&body))?;
            ok_or_error(code, v)?;
            println!("disk {name} created");
        }
        DiskCmd::List { json } => {
            let (code, v) = http(api, "GET", "/api/v1/disks", None)?;
            let v = ok_or_error(code, v)?;
            if json {
                return print_json(&v);
            }
            for d in v.as_array().into_iter().flatten() {
                println!(
                    "{:<16} {:<8} {:<6} {}",
                    d["name"].as_str().unwrap_or("?"),
                    d["size"].as_str().unwrap_or("-"),
                    d["simulated"].as_str().unwrap_or("-"),
                    if d["free"].as_bool() == Some(true) {
                        "free"
                    } else {
                        "in use"
                    }
                );
            }
        }
    }
    Ok(())
}

/// Runs a `freesan lun` subcommand against the API at `api`.
pub fn lun(api: SocketAddr, cmd: LunCmd) -> Result<()> {
    match cmd {
        LunCmd::Create {
            target,
            lun,
            pool,
            disk,
            cache,
            file,
            size,
            block_size,
            replicated,
            mode,
            read_only,
        } => {
            let given = [
                pool.is_some(),
                disk.is_some(),
                cache.is_some(),
                file.is_some(),
            ];
            if given.iter().filter(|g| **g).count() != 1 {
                bail!("give exactly one of --pool, --disk, --cache and --file");
            }
            let file = match file {
                Some(f) if f.is_relative() => Some(std::env::current_dir()?.join(f)),
                f => f,
            };
            let l = json!({
                "id": lun, "pool": pool, "disk": disk, "cache": cache, "path": file,
                "size": size, "block_size": block_size, "replicated": replicated,
                "replica_mode": mode, "read_only": read_only,
            });
            let body = json!({ "target": target, "lun": l });
            let (code, v) = http(api, "POST", "/api/v1/luns", Some(&body))?;
            let v = ok_or_error(code, v)?;
            println!(
                "LUN {} of {} created: {} ({} bytes){}",
                v["lun"],
                target,
                v["backing"].as_str().unwrap_or("?"),
                v["size_bytes"],
                if replicated { ", replicated" } else { "" }
            );
        }
        LunCmd::Delete { target, lun } => {
            let body = json!({ "target": target, "lun": lun });
            let (code, v) = http(api, "POST", "/api/v1/luns/delete", Some(&body))?;
            ok_or_error(code, v)?;
            println!("LUN {lun} of {target} deleted");
        }
        LunCmd::List { json } => {
            let (code, v) = http(api, "GET", "/api/v1/luns", None)?;
            let v = ok_or_error(code, v)?;
            if json {
                return print_json(&v);
            }
            for l in v.as_array().into_iter().flatten() {
                println!(
                    "{} LUN {:<4} {:>14} bytes  {}{}{}",
                    l["target"].as_str().unwrap_or("?"),
                    l["lun"],
                    l["size_bytes"],
                    l["backing"].as_str().unwrap_or("?"),
                    if l["replicated"].as_bool() == Some(true) {
                        ", replicated"
                    } else {
                        ""
                    },
                    if l["created_at_run_time"].as_bool() == Some(true) {
                        " (created at run time)"
                    } else {
                        ""
                    }
                );
            }
        }
    }
    Ok(())
}
