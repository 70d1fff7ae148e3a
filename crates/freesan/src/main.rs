//! The freesan binary: command line, start-up and signals.
//!
//! `freesan serve` with no arguments serves the embedded default (a thin 16 GiB LUN
//! in `./freesan-data`, on 127.0.0.1:3260); `--config FILE` serves a TOML
//! configuration; the quick flags `--portal`, `--target`, `--lun`, `--data-dir`
//! describe a node on the command line.
//!
//! What it does not do: any data-path or control-plane work itself: `serve` hands
//! the configuration to [`control::serve::run`]; the other commands talk to a
//! running node through its management API, or are tools of their own (`bench`,
//! `witness`, `cluster init`).

mod apicmd;
mod benchcmd;
mod cachecmd;
mod cmdline;
mod eventscmd;
mod objcmd;
mod poolcmd;
mod replicacmd;
mod service;
mod sockets;
mod statuscmd;

use anyhow::{bail, Result};
use clap::{Parser, Subcommand};
use control::{config, managed, secrets};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

#[derive(Parser)]
#[command(name = "freesan", version, about = "A software SAN in user space")]
struct Cli {
    /// Log lines as `text` or `json` (one object a line, for collectors); the
    /// default comes from FREESAN_LOG_FORMAT, else text.
    #[arg(long, global = true, value_enum, value_name = "FORMAT")]
    log_format: Option<service::LogFormat>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve LUNs over iSCSI until SIGTERM or SIGINT; SIGHUP reloads the
    /// configuration (targets, CHAP, ACLs).
    Serve(ServeArgs),
    /// Print the configuration `serve` would run with (as TOML) and exit.
    ShowConfig(ServeArgs),
    /// Benchmark a LUN (iSCSI with multipath, NBD, or a file) with the standard SAN
    /// patterns or one pattern; `bench chart` draws reports side by side; `bench
    /// check` verifies a LUN against a saved --verify-state after a crash.
    Bench(Box<BenchCmd>),
    /// Create and manage the RAID pools of a running node (through its management API).
    Pool {
        #[command(flatten)]
        api: poolcmd::ApiArg,
        #[command(subcommand)]
        cmd: poolcmd::PoolCmd,
    },
    /// Create and list the disks of a running node (pools are built from them).
    Disk {
        #[command(flatten)]
        api: poolcmd::ApiArg,
        #[command(subcommand)]
        cmd: objcmd::DiskCmd,
    },
    /// Create, list and delete the LUNs of a running node's targets.
    Lun {
        #[command(flatten)]
        api: poolcmd::ApiArg,
        #[command(subcommand)]
        cmd: objcmd::LunCmd,
    },
    /// LUN masking: which initiators see which LUNs of a running node's targets.
    HostGroup {
        #[command(flatten)]
        api: poolcmd::ApiArg,
        #[command(subcommand)]
        cmd: objcmd::HostGroupCmd,
    },
    /// HA pair state of a running node's replicated LUNs.
    Replica {
        #[command(flatten)]
        api: poolcmd::ApiArg,
        #[command(subcommand)]
        cmd: replicacmd::ReplicaCmd,
    },
    /// Run the witness of HA pairs (on a third host): breaks ties when the two
    /// nodes lose each other.
    Witness(replicacmd::WitnessArgs),
    /// The keys of an HA pair and its witness (`cluster init`).
    #[command(subcommand)]
    Cluster(replicacmd::ClusterCmd),
    /// The management API's tokens (`api token create --role admin|read-only`,
    /// `list`, `revoke`) and audit log (`api audit`).
    Api {
        #[command(subcommand)]
        cmd: apicmd::ApiCmd,
    },
    /// Ask a running node to re-read its configuration file (as SIGHUP does):
    /// targets, CHAP and ACLs change live; prints what needs a restart.
    Reload {
        #[command(flatten)]
        api: poolcmd::ApiArg,
        /// Print the raw JSON.
        #[arg(long)]
        json: bool,
    },
    /// A running node on one screen: health (pools, replicas), capacity, I/O
    /// rates, alerts, buffer memory (held, bound, high water, waits).
    Status {
        #[command(flatten)]
        api: poolcmd::ApiArg,
        /// Print the raw JSON.
        #[arg(long)]
        json: bool,
    },
    /// The node's events (disk failed, spare pulled in, partner lost, ...):
    /// `--follow` prints new ones as they come.
    Events {
        #[command(flatten)]
        api: poolcmd::ApiArg,
        /// Only events with a sequence number above N.
        #[arg(long, value_name = "N", default_value_t = 0)]
        since: u64,
        /// Keep waiting for new events and print them as they come.
        #[arg(long, short = 'f')]
        follow: bool,
        /// One JSON event per line.
        #[arg(long)]
        json: bool,
    },
    /// SSD cache status of a running node: hit rates, dirty data, advisor.
    Cache {
        #[command(flatten)]
        api: poolcmd::ApiArg,
        #[command(subcommand)]
        cmd: cachecmd::CacheCmd,
    },
}

#[derive(clap::Args)]
#[command(args_conflicts_with_subcommands = true)]
struct BenchCmd {
    #[command(subcommand)]
    sub: Option<BenchSub>,
    #[command(flatten)]
    run: benchcmd::RunArgs,
}

#[derive(Subcommand)]
enum BenchSub {
    /// Draw charts (SVG and PNG) from JSON reports, one bar per report.
    Chart(benchcmd::ChartArgs),
    /// Read a LUN back against the state of an earlier `bench --verify --verify-state`.
    Check(benchcmd::CheckArgs),
}

#[derive(clap::Args, Clone)]
struct ServeArgs {
    /// A TOML configuration file (see docs/config.md); cannot be combined with
    /// --portal, --target or --lun.
    #[arg(long, short)]
    config: Option<PathBuf>,
    /// Listen on ADDR:PORT (repeatable; every portal serves every target).
    #[arg(long = "portal", value_name = "ADDR:PORT")]
    portals: Vec<SocketAddr>,
    /// The target name the quick flags define.
    #[arg(long, value_name = "IQN")]
    target: Option<String>,
    /// A LUN backed by a file or block device, created sparse with SIZE (like 4G) when
    /// missing (repeatable; LUN numbers 0, 1, ... in order).
    #[arg(long = "lun", value_name = "PATH[:SIZE]")]
    luns: Vec<String>,
    /// Where LUN identities, reservations and state live.
    #[arg(long, value_name = "DIR")]
    data_dir: Option<PathBuf>,
    /// Also serve every LUN over NBD on ADDR:PORT (exports lun0, lun1, ...).
    #[arg(long, value_name = "ADDR:PORT")]
    nbd: Option<SocketAddr>,
    /// Serve the management API (used by `freesan pool`) on ADDR:PORT.
    #[arg(long, value_name = "ADDR:PORT")]
    api: Option<SocketAddr>,
    /// Serve the web console on ADDR:PORT (its own listener, the API's tokens;
    /// the API itself on 127.0.0.1:8260 unless --api or the config says where).
    #[arg(long, value_name = "ADDR:PORT")]
    console: Option<SocketAddr>,
}

impl ServeArgs {
    /// The configuration to run: the config file (or the quick flags) plus the
    /// objects created at run time (`DATA_DIR/managed.toml`).
    fn config(&self) -> Result<config::Config> {
        let cfg = self.config_file()?;
        self.with_data_dir(cfg)
    }

    /// [`ServeArgs::config`] for `show-config`: root naming the data
    /// directory of the node's own user (the package's `freesan`), by
    /// `--data-dir` or in a config file, becomes that user first, as
    /// `freesan api token` does, and reads everything as the node does, the
    /// config file included (the package's is root's, readable by the
    /// node's group alone, which the rule for files holding secrets accepts
    /// for that group only). Before, it was refused and told to use
    /// `runuser`. Any other user, quick flags without `--data-dir` (the
    /// current folder would choose the user) and a config that is not a
    /// plain file (a pipe reads once) take the ordinary path.
    fn config_as_data_dir_owner(&self) -> Result<config::Config> {
        // SAFETY: geteuid only reads the process's credentials.
        if unsafe { libc::geteuid() } != 0 {
            return self.config();
        }
        let mut me = self.clone();
        let dir = match (&me.data_dir, &me.config) {
            (Some(d), _) => d.clone(),
            (None, Some(path)) if std::fs::metadata(path).is_ok_and(|m| m.is_file()) => {
                // (absolute while root: the user may not enter this folder)
                let path = std::fs::canonicalize(path)
                    .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
                let dir = config::Config::data_dir_in(&path)?;
                me.config = Some(path);
                dir
            }
            _ => return self.config(),
        };
        let dir = apicmd::act_as_owner_of(&dir)?;
        let mut cfg = me
            .config_file()
            .map_err(|e| e.context(format!("read as the owner of {}", dir.display())))?;
        cfg.data_dir = dir;
        me.with_data_dir(cfg)
    }

    /// `cfg` with the objects its data directory says were created at run time.
    fn with_data_dir(&self, mut cfg: config::Config) -> Result<config::Config> {
        // before reading what the data directory says the node created
        control::secrets::check_data_dir(&cfg.data_dir)?;
        managed::Managed::load(&cfg.data_dir)?.merge_into(&mut cfg)?;
        if let Some(c) = self.console {
            cfg.api
                .get_or_insert_with(|| {
                    config::ApiConfig::on(SocketAddr::from(([127, 0, 0, 1], 8260)))
                })
                .console = Some(c);
        }
        Ok(cfg)
    }

    fn config_file(&self) -> Result<config::Config> {
        let flags = config::QuickFlags {
            portals: self.portals.clone(),
            target: self.target.clone(),
            luns: self.luns.clone(),
            data_dir: self.data_dir.clone(),
            nbd: self.nbd,
            api: self.api,
        };
        match &self.config {
            Some(path) => {
                if !flags.defines_nothing() {
                    bail!("--config cannot be combined with --portal, --target or --lun");
                }
                let mut cfg = config::Config::load(path)?;
                if let Some(d) = &self.data_dir {
                    cfg.data_dir = d.clone();
                }
                if let Some(a) = self.api {
                    match &mut cfg.api {
                        Some(api) => api.address = a,
                        None => cfg.api = Some(config::ApiConfig::on(a)),
                    }
                }
                if let Some(a) = self.nbd {
                    cfg.nbd = Some(config::NbdConfig::on(a));
                }
                Ok(cfg)
            }
            None => Ok(config::Config::from_quick_flags(&flags)),
        }
    }
}

fn runtime() -> Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?)
}

/// Keeps glibc from giving every large I/O buffer (64K-8M reads and writes) its own
/// mmap that is unmapped again on free: with the default thresholds each 256K
/// transfer faulted in 64 fresh pages, which dominated the profile of large
/// sequential I/O on both sides of the wire. Freed buffers now return to the heap
/// and are reused; the heap is trimmed only past 1 GiB of free memory at its top.
///
/// One arena (unless MALLOC_ARENA_MAX says otherwise): glibc gives threads arenas
/// of their own (up to 8 per core) and keeps what each one freed for that arena,
/// so buffers that the node's budget (`[limits] buffer_memory_max`) bounds at any
/// moment filled one arena after another, and the process stayed at about the
/// bound times the worker threads. Measured with 2 workers: reads of 4K and 256K
/// as fast with one arena as with the default (within the run-to-run noise).
fn tune_allocator() {
    let arenas_set = std::env::var_os("MALLOC_ARENA_MAX").is_some();
    // SAFETY: mallopt only changes allocator parameters; called before any thread starts.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 64 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 1 << 30);
        if !arenas_set {
            libc::mallopt(libc::M_ARENA_MAX, 1);
        }
    }
}

/// Commands that only print (`pool`, `show-config`) end quietly when their output
/// pipe closes (`freesan pool status | head`), as Unix tools do, instead of
/// panicking in `println!`. Not for `serve` or `bench`, whose sockets must see
/// EPIPE as an error.
fn quiet_broken_pipe() {
    // SAFETY: restoring the default disposition of one signal; no handler runs.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

/// Watches SIGTERM and SIGINT from the moment it is called (so a signal that
/// arrives before the returned future is awaited still stops the process
/// cleanly, rather than killing it with the default action); the future ends
/// at the first of them.
fn shutdown_signal() -> impl std::future::Future<Output = ()> {
    use tokio::signal::unix::{signal, SignalKind};
    let term = signal(SignalKind::terminate());
    let int = signal(SignalKind::interrupt());
    async move {
        let (mut term, mut int) = match (term, int) {
            (Ok(t), Ok(i)) => (t, i),
            (Err(e), _) | (_, Err(e)) => {
                tracing::error!("cannot watch SIGTERM and SIGINT: {e}");
                std::future::pending::<()>().await;
                return;
            }
        };
        tokio::select! {
            _ = term.recv() => tracing::info!("SIGTERM: shutting down"),
            _ = int.recv() => tracing::info!("SIGINT: shutting down"),
        }
    }
}

fn main() {
    tune_allocator();
    let cli = Cli::parse();
    service::init_logs(cli.log_format);
    let result = match cli.command {
        Command::Serve(args) => args.config().and_then(|cfg| {
            let load: control::reload::LoadConfig = Arc::new(move || args.config());
            runtime().and_then(|rt| rt.block_on(service::serve(cfg, load, shutdown_signal)))
        }),
        Command::Bench(b) => match b.sub {
            Some(BenchSub::Chart(c)) => benchcmd::chart(c),
            Some(BenchSub::Check(c)) => runtime().and_then(|rt| rt.block_on(benchcmd::check(c))),
            None => runtime().and_then(|rt| rt.block_on(benchcmd::run(b.run))),
        },
        Command::Pool { api, cmd } => {
            quiet_broken_pipe();
            apicmd::use_credentials(&api);
            poolcmd::run(api.api, cmd)
        }
        Command::Disk { api, cmd } => {
            quiet_broken_pipe();
            apicmd::use_credentials(&api);
            objcmd::disk(api.api, cmd)
        }
        Command::Lun { api, cmd } => {
            quiet_broken_pipe();
            apicmd::use_credentials(&api);
            objcmd::lun(api.api, cmd)
        }
        Command::HostGroup { api, cmd } => {
            quiet_broken_pipe();
            apicmd::use_credentials(&api);
            objcmd::host_group(api.api, cmd)
        }
        Command::Replica { api, cmd } => {
            quiet_broken_pipe();
            apicmd::use_credentials(&api);
            replicacmd::run(api.api, cmd)
        }
        Command::Cluster(cmd) => replicacmd::cluster(cmd),
        Command::Api { cmd } => {
            quiet_broken_pipe();
            apicmd::run(cmd)
        }
        Command::Witness(args) => runtime().and_then(|rt| rt.block_on(replicacmd::witness(args))),
        Command::Status { api, json } => {
            quiet_broken_pipe();
            apicmd::use_credentials(&api);
            statuscmd::run(api.api, json)
        }
        Command::Events {
            api,
            since,
            follow,
            json,
        } => {
            quiet_broken_pipe();
            apicmd::use_credentials(&api);
            eventscmd::run(api.api, since, follow, json)
        }
        Command::Reload { api, json } => {
            quiet_broken_pipe();
            apicmd::use_credentials(&api);
            statuscmd::reload(api.api, json)
        }
        Command::Cache { api, cmd } => {
            quiet_broken_pipe();
            apicmd::use_credentials(&api);
            cachecmd::run(api.api, cmd)
        }
        Command::ShowConfig(args) => args.config_as_data_dir_owner().and_then(|cfg| {
            quiet_broken_pipe();
            cfg.validate()?;
            print!("{}", secrets::masked_toml(&cfg)?);
            Ok(())
        }),
    };
    if let Err(e) = result {
        eprintln!("freesan: {e:#}");
        std::process::exit(1);
    }
}
