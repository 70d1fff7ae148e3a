//! `freesan bench`: runs the standard SAN patterns (or one custom pattern) against an
//! iSCSI LUN (every portal, round-robin), an NBD export or a local file, and prints
//! a table, JSON/CSV files and a last one-line summary; `freesan bench chart` draws
//! the side-by-side charts from JSON reports; `freesan bench check` reads a LUN back
//! against a saved verification state (after a crash).

use anyhow::{bail, Context, Result};
use block::VolumeRef;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Arguments of `freesan bench` (running a workload).
#[derive(clap::Args, Debug, Clone)]
pub struct RunArgs {
    /// `iscsi://[user[%secret]@]HOST:PORT/IQN/LUN` (all portals of the target, round
    /// robin), `nbd://HOST:PORT/EXPORT`, or `file:PATH`.
    /// (Required unless a subcommand is given.)
    #[arg(long, value_name = "URL")]
    pub target: Option<String>,
    /// iSCSI: keep to the portal given instead of discovering every portal.
    #[arg(long)]
    pub single_path: bool,
    /// iSCSI with several paths: send everything to one path and fail over only when
    /// it fails (instead of round-robin).
    #[arg(long, conflicts_with = "single_path")]
    pub failover_only: bool,
    /// Run a suite: `standard` (4K/8K/64K/256K patterns).
    #[arg(long, value_name = "NAME")]
    pub suite: Option<String>,
    /// Only these patterns of the suite (comma separated, e.g. 4k-randread,256k-seqread).
    #[arg(long, value_name = "LIST", requires = "suite")]
    pub only: Option<String>,
    /// Block size of a custom pattern (4k, 8k, 64k, 256k, 1m, ...).
    #[arg(long, value_name = "SIZE", default_value = "4k")]
    pub bs: String,
    /// randread | randwrite | randrw | read | write | rw.
    #[arg(long, value_name = "MODE", default_value = "randread")]
    pub rw: String,
    /// Read percentage for randrw and rw.
    #[arg(long, value_name = "N", default_value_t = 67)]
    pub read_pct: u8,
    /// Workers.
    #[arg(long, value_name = "N")]
    pub threads: Option<u32>,
    /// Outstanding I/O per worker.
    #[arg(long, value_name = "N")]
    pub qd: Option<u32>,
    /// Measured seconds per pattern.
    #[arg(long, value_name = "N")]
    pub secs: Option<f64>,
    /// Warm-up seconds before each measured window.
    #[arg(long, value_name = "N")]
    pub ramp: Option<f64>,
    /// Region of the LUN to use, from its start (e.g. 2G); default the whole LUN.
    #[arg(long, value_name = "SIZE")]
    pub size: Option<String>,
    /// Write self-checking blocks and check every read (LBA, generation, CRC32C).
    #[arg(long)]
    pub verify: bool,
    /// With --verify: keep the map of acknowledged writes in FILE (checkpointed every
    /// second) so that `freesan bench check` can verify the LUN after a crash.
    #[arg(long, value_name = "FILE", requires = "verify")]
    pub verify_state: Option<PathBuf>,
    /// Issue every write with FUA.
    #[arg(long)]
    pub fua: bool,
    /// Write the results as JSON.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Write the results as CSV.
    #[arg(long, value_name = "FILE")]
    pub csv: Option<PathBuf>,
    /// Also draw the charts of this run to PREFIX.svg and PREFIX.png.
    #[arg(long, value_name = "PREFIX")]
    pub chart: Option<PathBuf>,
    /// Label of this configuration in charts and reports.
    #[arg(long)]
    pub label: Option<String>,
    /// CHAP user for iSCSI (or put it in the URL).
    #[arg(long)]
    pub chap_user: Option<String>,
    /// CHAP secret for iSCSI.
    #[arg(long)]
    pub chap_secret: Option<String>,
    /// No progress line.
    #[arg(long)]
    pub quiet: bool,
}

/// `freesan bench chart A.json B.json ...`.
#[derive(clap::Args, Debug, Clone)]
pub struct ChartArgs {
    /// JSON reports written by `freesan bench --json`, one per configuration.
    #[arg(required = true)]
    pub reports: Vec<PathBuf>,
    /// Output prefix: PREFIX.svg and PREFIX.png.
    #[arg(long, value_name = "PREFIX", default_value = "bench-chart")]
    pub out: PathBuf,
    /// Labels of the configurations, in order (default: each report's label or file name).
    #[arg(long, value_delimiter = ',')]
    pub labels: Vec<String>,
}

/// `freesan bench check --target URL --verify-state FILE`.
#[derive(clap::Args, Debug, Clone)]
pub struct CheckArgs {
    /// The LUN, as for `freesan bench --target`.
    #[arg(long, value_name = "URL")]
    pub target: String,
    /// The state written by `freesan bench --verify --verify-state FILE`.
    #[arg(long, value_name = "FILE")]
    pub verify_state: PathBuf,
    /// iSCSI: keep to the portal given.
    #[arg(long)]
    pub single_path: bool,
    /// Accept blocks that a write was in flight to at the crash reading as neither
    /// old nor new (they are counted and listed); every other block must be right.
    #[arg(long)]
    pub in_flight_may_be_torn: bool,
}

/// Opens a benchmark target URL as a volume.
pub async fn open_target(
    url: &str,
    single_path: bool,
    failover_only: bool,
    chap: Option<(String, String)>,
) -> Result<VolumeRef> {
    if let Some(path) = url.strip_prefix("file:") {
        let opts = disk::FileOptions::default();
        let v = disk::FileVolume::open(Path::new(path), &opts)
            .with_context(|| format!("opening {path}"))?;
        return Ok(Arc::new(v));
    }
    if url.starts_with("nbd://") {
        let (addr, export) =
            nbd::parse_nbd_url(url).with_context(|| format!("bad NBD URL {url}"))?;
        let c = nbd::NbdClient::connect(&addr, &export)
            .await
            .with_context(|| format!("connecting to {url}"))?;
        return Ok(Arc::new(c));
    }
    if url.starts_with("iscsi://") {
        let opts = initiator::OpenOptions {
            single_path,
            policy: if failover_only {
                initiator::PathPolicy::FailoverOnly
            } else {
                initiator::PathPolicy::RoundRobin
            },
            chap,
            ..initiator::OpenOptions::default()
        };
        let mp = initiator::open_multipath(url, &opts)
            .await
            .with_context(|| format!("opening {url}"))?;
        let paths = mp.path_stats().len();
        eprintln!(
            "iSCSI: {paths} path(s), {}",
            if paths < 2 {
                "single path"
            } else if failover_only {
                "failover only"
            } else {
                "round-robin"
            }
        );
        // Path failures and restorations as they happen: the I/O itself is retried
        // on another path and never fails while one path works.
        let mut events = mp.path_events();
        tokio::spawn(async move {
            while let Ok(e) = events.recv().await {
                match e.kind {
                    initiator::PathEventKind::Failed { reason } => {
                        eprintln!("\npath {} ({}) failed: {reason}", e.path_index, e.addr)
                    }
                    initiator::PathEventKind::Restored => {
                        eprintln!("\npath {} ({}) restored", e.path_index, e.addr)
                    }
                }
            }
        });
        return Ok(Arc::new(mp));
    }
    bail!("unknown target {url:?}: use iscsi://HOST:PORT/IQN/LUN, nbd://HOST:PORT/EXPORT or file:PATH")
}

fn size_arg(s: &str, what: &str) -> Result<u64> {
    disk::parse_size(s).with_context(|| format!("{what} {s:?} is not a size (like 4k or 2G)"))
}

/// The workloads the arguments ask for.
fn workloads(a: &RunArgs) -> Result<Vec<bench::Workload>> {
    let mut list = match a.suite.as_deref() {
        Some("standard") => {
            let mut s = bench::Suite::standard();
            if let Some(only) = &a.only {
                let names: Vec<&str> = only.split(',').map(str::trim).collect();
                s = s.only(&names);
                if s.workloads.is_empty() {
                    bail!("--only {only:?} names no pattern of the standard suite");
                }
            }
            s.workloads
        }
        Some(other) => bail!("unknown suite {other:?} (known: standard)"),
        None => {
            let bs = size_arg(&a.bs, "--bs")?;
            if bs == 0 || bs > 8 << 20 || bs % 512 != 0 {
                bail!("--bs must be a multiple of 512 bytes up to 8M");
            }
            let (read_pct, random_pct) = match a.rw.as_str() {
                "randread" => (100, 100),
                "randwrite" => (0, 100),
                "randrw" => (a.read_pct.min(100), 100),
                "read" => (100, 0),
                "write" => (0, 0),
                "rw" => (a.read_pct.min(100), 0),
                other => {
                    bail!("--rw {other:?}: use randread, randwrite, randrw, read, write or rw")
                }
            };
            let name = format!("{}-{}", a.bs.to_lowercase(), a.rw);
            vec![bench::Workload::new(&name, bs as u32, read_pct, random_pct)]
        }
    };
    for w in &mut list {
        if let Some(t) = a.threads {
            w.threads = t;
        }
        if let Some(q) = a.qd {
            w.queue_depth = q;
        }
        if let Some(s) = a.secs {
            w.duration_secs = s;
        }
        w.ramp_up_secs = match a.ramp {
            Some(r) => r,
            None => (w.duration_secs / 5.0).min(2.0),
        };
        if let Some(sz) = &a.size {
            w.region_size_bytes = Some(size_arg(sz, "--size")?);
        }
        w.verify = a.verify;
        w.fua = a.fua;
    }
    Ok(list)
}

fn chap_of(a_user: &Option<String>, a_secret: &Option<String>) -> Result<Option<(String, String)>> {
    match (a_user, a_secret) {
        (Some(u), Some(s)) => Ok(Some((u.clone(), s.clone()))),
        (None, None) => Ok(None),
        _ => bail!("--chap-user and --chap-secret go together"),
    }
}

/// Runs `freesan bench`.
pub async fn run(a: RunArgs) -> Result<()> {
    if let Some(s) = &a.chap_secret {
        // `ps` shows the command line to every user of the host
        crate::cmdline::hide_option("--chap-secret", s);
    }
    let Some(target) = a.target.clone() else {
        bail!("--target URL is required (iscsi://HOST:PORT/IQN/LUN, nbd://HOST:PORT/EXPORT or file:PATH)");
    };
    let list = workloads(&a)?;
    let volume = open_target(
        &target,
        a.single_path,
        a.failover_only,
        chap_of(&a.chap_user, &a.chap_secret)?,
    )
    .await?;
    let g = volume.geometry();
    eprintln!(
        "target {}: {} blocks of {} bytes ({:.1} GiB)",
        target,
        g.block_count,
        g.block_size_bytes,
        g.size_bytes() as f64 / (1u64 << 30) as f64
    );
    let mut results = Vec::new();
    let mut verify_failed = false;
    for w in &list {
        let line = bench::ProgressLine::new(&w.name);
        let opts = bench::RunOptions {
            progress: if a.quiet { None } else { Some(line.sink()) },
            verify_state_path: a.verify_state.clone(),
            checkpoint_interval_secs: if a.verify_state.is_some() { 1 } else { 0 },
            ..bench::RunOptions::default()
        };
        let r = bench::run_with(volume.clone(), w, opts)
            .await
            .with_context(|| format!("running {}", w.name))?;
        if r.verify.as_ref().is_some_and(|v| !v.passed) {
            verify_failed = true;
        }
        results.push(r);
    }
    println!("{}", bench::text_table(&results));
    let label = a.label.clone().unwrap_or_else(|| target.clone());
    if let Some(p) = &a.json {
        let report = bench::Report {
            meta: bench::ReportMeta::new(&target),
            results: results.clone(),
        };
        std::fs::write(p, report.to_json()?).with_context(|| format!("writing {}", p.display()))?;
    }
    if let Some(p) = &a.csv {
        std::fs::write(p, bench::to_csv(&results))
            .with_context(|| format!("writing {}", p.display()))?;
    }
    if let Some(prefix) = &a.chart {
        write_chart(&[(label, results.clone())], prefix)?;
    }
    let errors: u64 = results.iter().map(|r| r.errors()).sum();
    println!("{}", bench::summary_line(&results));
    if verify_failed {
        bail!("verification failed");
    }
    if errors > 0 {
        bail!("{errors} I/O errors");
    }
    Ok(())
}

fn write_chart(configs: &[(String, Vec<bench::RunResult>)], prefix: &Path) -> Result<()> {
    let chart = bench::chart(configs);
    let svg = prefix.with_extension("svg");
    let png = prefix.with_extension("png");
    std::fs::write(&svg, &chart.svg).with_context(|| format!("writing {}", svg.display()))?;
    let bytes = chart.to_png().context("rendering the chart as PNG")?;
    std::fs::write(&png, bytes).with_context(|| format!("writing {}", png.display()))?;
    eprintln!("charts: {} {}", svg.display(), png.display());
    Ok(())
}

/// Runs `freesan bench chart`.
pub fn chart(a: ChartArgs) -> Result<()> {
    let mut configs = Vec::new();
    for (i, p) in a.reports.iter().enumerate() {
        let text =
            std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
        let report =
            bench::Report::from_json(&text).with_context(|| format!("parsing {}", p.display()))?;
        let label = a.labels.get(i).cloned().unwrap_or_else(|| {
            p.file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_else(|| report.meta.target.clone())
        });
        configs.push((label, report.results));
    }
    write_chart(&configs, &a.out)
}

/// Runs `freesan bench check`.
pub async fn check(a: CheckArgs) -> Result<()> {
    let state = bench::VerifyState::load(&a.verify_state)
        .with_context(|| format!("reading {}", a.verify_state.display()))?;
    let volume = open_target(&a.target, a.single_path, false, None).await?;
    let report = bench::verify_pass(volume, &state).await?;
    println!(
        "check: {} blocks checked, {} never written, {} failures",
        report.blocks_checked,
        report.blocks_unwritten,
        report.failure_count()
    );
    for f in report.failures.iter().take(10) {
        println!("  {f:?}");
    }
    if report.in_flight_failures > 0 {
        println!(
            "check: {} of the failures are blocks under writes in flight at the crash",
            report.in_flight_failures
        );
    }
    let passed = if a.in_flight_may_be_torn {
        report.passed_allowing_torn_in_flight()
    } else {
        report.passed()
    };
    if !passed {
        bail!("verification after restart failed");
    }
    if report.passed() {
        println!("check: every acknowledged block reads back correctly");
    } else {
        println!(
            "check: every block not under a write in flight at the crash reads back correctly"
        );
    }
    Ok(())
}
