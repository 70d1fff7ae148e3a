//! `freesan replica status` (HA pair state through a running node's API) and
//! `freesan witness` (the tie-breaker service of a pair, run on a third host).

use crate::poolcmd::{http, ok_or_error};
use anyhow::{Context, Result};
use serde_json::Value;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

/// `freesan replica` subcommands.
#[derive(clap::Subcommand, Debug, Clone)]
pub enum ReplicaCmd {
    /// State of every replicated LUN: in sync, resyncing (with progress) or
    /// degraded, role, preferred node, witness.
    Status {
        /// Print the raw JSON.
        #[arg(long)]
        json: bool,
    },
    /// After a split brain (both copies took writes alone): throw THIS node's
    /// copy of NAME away; the partner copies its data here and the writes this
    /// node took alone are lost. Only a copy that is down can be discarded.
    Discard {
        /// The replicated volume (as `replica status` names it).
        name: String,
        /// Confirms that this node's lone writes are to be given up.
        #[arg(long, required = true)]
        lose_this_nodes_writes: bool,
    },
    /// When both copies were discarded (no copy is consistent, so they are
    /// never joined): keep THIS node's copy of NAME. It becomes the source the
    /// partner is copied from in full, and may serve alone as a consistent
    /// copy may. Only a copy that is down and not consistent can be kept; an
    /// unfinished resync target's copy is partial.
    Keep {
        /// The replicated volume (as `replica status` names it).
        name: String,
        /// Confirms that this node's copy holds the data to keep.
        #[arg(long, required = true)]
        this_copy_holds_the_data: bool,
    },
}

/// Runs a `freesan replica` subcommand.
pub fn run(api: SocketAddr, cmd: ReplicaCmd) -> Result<()> {
    match cmd {
        ReplicaCmd::Status { json } => {
            let (code, v) = http(api, "GET", "/api/v1/replicas", None)?;
            let v = ok_or_error(code, v)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&v)?);
                return Ok(());
            }
            let list = v.as_array().cloned().unwrap_or_default();
            if list.is_empty() {
                println!("no replicated LUN on this node");
            }
            for r in &list {
                print_one(r);
            }
            Ok(())
        }
        ReplicaCmd::Discard { name, .. } => act(
            api,
            "discard",
            &name,
            "discarded this node's copy; it will be copied from the partner",
        ),
        ReplicaCmd::Keep { name, .. } => act(
            api,
            "keep",
            &name,
            "kept this node's copy; the partner will be copied from it",
        ),
    }
}

/// POSTs `/api/v1/replicas/VERB` for volume `name`; prints `done` and the new status.
fn act(api: SocketAddr, verb: &str, name: &str, done: &str) -> Result<()> {
    let body = serde_json::json!({ "name": name });
    let (code, v) = http(
        api,
        "POST",
        &format!("/api/v1/replicas/{verb}"),
        Some(&body),
    )?;
    let v = ok_or_error(code, v)?;
    println!("{done}");
    print_one(&v);
    Ok(())
}

fn print_one(r: &Value) {
    let s = |k: &str| r[k].as_str().unwrap_or("-").to_string();
    let n = |k: &str| r[k].as_u64().unwrap_or(0);
    println!("{}", s("name"));
    println!(
        "  state {}  role {}  node {} (preferred {})  mode {}",
        s("state"),
        s("role"),
        n("node_id"),
        n("preferred_node"),
        s("mode")
    );
    println!("  why   {}", s("reason"));
    println!(
        "  paths here {}  partner {}  partner link {}",
        s("local_paths"),
        s("peer_paths"),
        s("peer")
    );
    let total = n("resync_regions_total");
    let done = n("resync_regions_done");
    if s("state") == "resyncing" && total > 0 {
        println!(
            "  resync {done}/{total} regions ({:.1}%)",
            100.0 * done as f64 / total as f64
        );
    }
    println!(
        "  dirty regions {} of {} KiB  resynced {} MiB  generation {}  consistent {}",
        n("dirty_regions"),
        n("region_bytes") / 1024,
        n("resynced_bytes") >> 20,
        s("generation"),
        r["consistent"].as_bool().unwrap_or(false)
    );
    let links = r["sync_links"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|l| ("sync link", l))
        .chain(
            r["client_links"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|l| ("client net", l)),
        );
    for (kind, l) in links {
        let rtt = l["rtt_us"]
            .as_u64()
            .map_or("-".to_string(), |u| format!("{u} us"));
        println!(
            "  {kind} {} -> {}: {} (rtt {rtt})",
            l["local"].as_str().unwrap_or("-"),
            l["peer"].as_str().unwrap_or("-"),
            if l["up"].as_bool() == Some(true) {
                "up"
            } else {
                "DOWN"
            },
        );
    }
    let reach = match r["witness_reachable"].as_bool() {
        Some(true) => "reachable",
        Some(false) => "unreachable",
        None => "not asked yet",
    };
    match r["witness"].as_str() {
        Some(w) => println!("  witness {w} ({reach})"),
        None => println!("  witness none (the preferred node survives a split)"),
    }
    if let Some(why) = r["access_mismatch"].as_str() {
        println!("  ACCESS DIFFERS: {why}");
    }
    if let Some(n) = r["repaired_blocks"].as_u64().filter(|&n| n > 0) {
        println!("  {n} blocks this copy could not read were repaired from the partner's");
    }
}

/// `freesan witness` arguments.
#[derive(clap::Args, Debug, Clone)]
pub struct WitnessArgs {
    /// Listen on ADDR:PORT.
    #[arg(long, value_name = "ADDR:PORT")]
    pub listen: SocketAddr,
    /// File that keeps the survivor grants across restarts.
    #[arg(long, value_name = "FILE", default_value = "witness-state.json")]
    pub state: PathBuf,
    /// The witness's cluster key file (`witness.key` of `freesan cluster init`):
    /// only the two nodes of that cluster are answered.
    #[arg(long, value_name = "FILE")]
    pub key_file: PathBuf,
}

/// Runs the witness until SIGTERM or SIGINT.
pub async fn witness(args: WitnessArgs) -> Result<()> {
    // the grant file and its temporary copies are the witness's alone
    // SAFETY: umask only changes the process's file-creation mask.
    unsafe {
        libc::umask(0o077);
    }
    let keys = replica::secure::ClusterKeys::load(&args.key_file)
        .with_context(|| format!("cluster key file {}", args.key_file.display()))?;
    let w = replica::witness::WitnessServer::bind(args.listen, args.state.clone(), Arc::new(keys))
        .await
        .with_context(|| format!("binding the witness on {}", args.listen))?;
    let stop_signal = crate::shutdown_signal();
    eprintln!(
        "freesan witness on {} (grants in {})",
        w.local_addr()?,
        args.state.display()
    );
    w.run(stop_signal).await;
    Ok(())
}

/// `freesan cluster ...`: the keys of an HA pair.
#[derive(clap::Subcommand, Debug)]
pub enum ClusterCmd {
    /// Make a new cluster's keys: `node1.key`, `node2.key` and `witness.key` in
    /// DIR (mode 0600; DIR is created 0700). Install each on its host and name it
    /// in `[cluster] key_file` (nodes) or `freesan witness --key-file` (witness).
    Init {
        /// The cluster's name (`[cluster] name` on both nodes).
        #[arg(long)]
        name: String,
        /// Folder to write the three key files to (they must not exist yet).
        #[arg(long, value_name = "DIR")]
        out: PathBuf,
    },
}

/// Runs a `freesan cluster` command.
pub fn cluster(cmd: ClusterCmd) -> Result<()> {
    match cmd {
        ClusterCmd::Init { name, out } => {
            use std::os::unix::fs::DirBuilderExt;
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(&out)
                .with_context(|| format!("creating {}", out.display()))?;
            let keys = replica::secure::ClusterKeys::generate(&name)?;
            for k in &keys {
                let path = out.join(format!("{}.key", k.me().name()));
                k.store(&path)?;
                println!("{}", path.display());
            }
            std::fs::File::open(&out)?.sync_all()?;
            eprintln!(
                "cluster {name:?}: copy node1.key to node 1, node2.key to node 2 and witness.key to the witness \
                 (each mode 0600 and owned by the user the node or witness runs as, `chown freesan` for the \
                 package's; or root's with that user's group: chmod 640), then remove the others from each host"
            );
            Ok(())
        }
    }
}
