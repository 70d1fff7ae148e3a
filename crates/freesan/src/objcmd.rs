//! `freesan disk ...`, `freesan lun ...` and `freesan host-group ...`: create, list and
//! delete disks, LUNs and host groups
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
        /// Command timeout in seconds: a request with no answer in it fails
        /// the disk (default 20; 0: wait as long as the disk does).
        #[arg(long)]
        io_timeout_secs: Option<u32>,
    },
    /// Every disk of the node, and whether it is free (in no pool and no LUN).
    List {
        /// Print the raw JSON.
        #[arg(long)]
        json: bool,
    },
    /// Take a disk that stopped answering back, once it answers again: it
    /// becomes free, to be given back to its pool (`freesan pool replace`,
    /// which rebuilds onto it) or used otherwise. Refused while the device
    /// has not answered every request sent to it before.
    Reopen {
        /// Disk name.
        name: String,
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
    /// Grow a LUN while it serves (file, disk, pool, cache, replicated);
    /// initiators are told CAPACITY DATA HAS CHANGED. Shrinking is refused unless
    /// forced, and then only for a file LUN no host group maps.
    Resize {
        /// Target name (IQN).
        #[arg(long)]
        target: String,
        /// LUN number.
        #[arg(long)]
        lun: u64,
        /// The new size (8G, 512M).
        #[arg(long)]
        size: String,
        /// Allow shrinking (cuts off the data beyond the new size) of a LUN no
        /// initiator sees.
        #[arg(long)]
        force: bool,
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
            io_timeout_secs,
        } => {
            let mut body = json!({ "name": name });
            if let Some(t) = io_timeout_secs {
                body["io_timeout_secs"] = json!(t);
            }
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
                if let Some(why) = d["stopped_answering"].as_str() {
                    println!("  FAILED: stopped answering ({why})");
                    match d["in_flight"].as_u64() {
                        Some(0) => println!(
                            "  its device holds no request: take it back with \
                             freesan disk reopen {}",
                            d["name"].as_str().unwrap_or("?")
                        ),
                        Some(n) => println!(
                            "  {n} request(s) still at the device: it can be taken back \
                             once they end"
                        ),
                        None => {}
                    }
                }
            }
        }
        DiskCmd::Reopen { name } => {
            let body = json!({ "name": name });
            let (code, v) = http(api, "POST", "/api/v1/disks/reopen", Some(&body))?;
            let v = ok_or_error(code, v)?;
            println!("disk {name} taken back: it is free");
            let at = &v["failed_in"];
            if let (Some(pool), Some(pos)) = (at["pool"].as_str(), at["position"].as_u64()) {
                println!(
                    "give it back to pool {pool}, which rebuilds onto it: \
                     freesan pool replace {pool} {pos} {name}"
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
        LunCmd::Resize {
            target,
            lun,
            size,
            force,
        } => {
            let body = json!({ "target": target, "lun": lun, "size": size, "force": force });
            let (code, v) = http(api, "POST", "/api/v1/luns/resize", Some(&body))?;
            let v = ok_or_error(code, v)?;
            let how = if v["shrunk"] == true {
                "shrunk"
            } else {
                "grown"
            };
            println!(
                "LUN {lun} of {target} {how} from {} to {} bytes",
                v["was_bytes"], v["size_bytes"]
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

/// `freesan host-group` subcommands (LUN masking).
#[derive(clap::Subcommand, Debug, Clone)]
pub enum HostGroupCmd {
    /// Create or replace a host group of a target: its initiators see only its
    /// LUNs (once a target has a group, an initiator in none sees no LUN).
    Create {
        /// Target name (IQN).
        #[arg(long)]
        target: String,
        /// Group name.
        #[arg(long)]
        name: String,
        /// An initiator name in the group (repeat for more).
        #[arg(long = "initiator")]
        initiators: Vec<String>,
        /// A CHAP name in the group (repeat for more).
        #[arg(long = "chap-user")]
        chap_users: Vec<String>,
        /// A LUN the group sees: `3` (as LUN 3) or `3:0` (LUN 3 shown as LUN 0);
        /// repeat for more.
        #[arg(long = "lun")]
        luns: Vec<String>,
    },
    /// Remove a host group created with `host-group create`.
    Delete {
        /// Target name (IQN).
        #[arg(long)]
        target: String,
        /// Group name.
        #[arg(long)]
        name: String,
    },
    /// Every host group of the node's targets.
    List {
        /// Print the raw JSON.
        #[arg(long)]
        json: bool,
    },
}

/// `3` or `3:0` as a host group's LUN entry.
fn host_group_lun(s: &str) -> Result<Value> {
    let (lun, seen) = match s.split_once(':') {
        Some((l, a)) => (l, Some(a)),
        None => (s, None),
    };
    let lun: u64 = lun
        .trim()
        .parse()
        .map_err(|_| anyhow::anyhow!("--lun {s:?}: expected LUN or LUN:AS"))?;
    Ok(match seen {
        Some(a) => {
            let a: u64 = a
                .trim()
                .parse()
                .map_err(|_| anyhow::anyhow!("--lun {s:?}: expected LUN or LUN:AS"))?;
            json!({ "lun": lun, "as": a })
        }
        None => json!({ "lun": lun }),
    })
}

/// Runs a `freesan host-group` subcommand against the API at `api`.
pub fn host_group(api: SocketAddr, cmd: HostGroupCmd) -> Result<()> {
    match cmd {
        HostGroupCmd::Create {
            target,
            name,
            initiators,
            chap_users,
            luns,
        } => {
            let luns = luns
                .iter()
                .map(|l| host_group_lun(l))
                .collect::<Result<Vec<_>>>()?;
            let group = json!({
                "name": name, "initiators": initiators, "chap_users": chap_users, "luns": luns,
            });
            let body = json!({ "target": target, "group": group });
            let (code, v) = http(api, "POST", "/api/v1/host-groups", Some(&body))?;
            ok_or_error(code, v)?;
            println!("host group {name} of {target} set");
        }
        HostGroupCmd::Delete { target, name } => {
            let body = json!({ "target": target, "name": name });
            let (code, v) = http(api, "POST", "/api/v1/host-groups/delete", Some(&body))?;
            ok_or_error(code, v)?;
            println!("host group {name} of {target} deleted");
        }
        HostGroupCmd::List { json } => {
            let (code, v) = http(api, "GET", "/api/v1/host-groups", None)?;
            let v = ok_or_error(code, v)?;
            if json {
                return print_json(&v);
            }
            for g in v.as_array().into_iter().flatten() {
                let luns: Vec<String> = g["luns"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|l| format!("{}->{}", l["lun"], l["as"]))
                    .collect();
                let members: Vec<&str> = g["initiators"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .chain(g["chap_users"].as_array().into_iter().flatten())
                    .filter_map(|m| m.as_str())
                    .collect();
                println!(
                    "{} {:<16} luns [{}]  members [{}]",
                    g["target"].as_str().unwrap_or("?"),
                    g["name"].as_str().unwrap_or("?"),
                    luns.join(", "),
                    members.join(", ")
                );
            }
        }
    }
    Ok(())
}
