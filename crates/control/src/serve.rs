//! `freesan serve`: opens the LUNs, builds the SCSI targets, starts the portals and
//! runs until told to stop (the binary: SIGTERM or SIGINT), then shuts down
//! cleanly (sessions closed, data flushed).

use crate::cluster::{port_id, Cluster};
use crate::config::Config;
use crate::node::NodeControl;
use crate::objects::Objects;
use crate::pools::Pools;
use crate::targets::{build_target, discovery_auth, iscsi_portals, OpenedLun};
use anyhow::{bail, Context, Result};
use std::sync::Arc;

/// Builds the iSCSI server configuration and the NBD exports: opens (or creates)
/// every backing file and loads every LUN identity.
fn build(
    cfg: &Config,
    pools: &Pools,
    cluster: Option<&Cluster>,
) -> Result<(iscsi::ServerConfig, Vec<OpenedLun>, Vec<nbd::NbdExport>)> {
    std::fs::create_dir_all(&cfg.data_dir)
        .with_context(|| format!("creating data directory {}", cfg.data_dir.display()))?;
    let portals = iscsi_portals(cfg);
    let mut targets = Vec::new();
    let mut opened = Vec::new();
    let mut exports = Vec::new();
    for (ti, t) in cfg.targets.iter().enumerate() {
        let (spec, o, e) = build_target(cfg, ti, t, &portals, pools, cluster)?;
        targets.push(spec);
        opened.extend(o);
        exports.extend(e);
    }
    let partner_portals = cfg.cluster.as_ref().map_or_else(Vec::new, |c| {
        let peer = 3 - c.node_id;
        c.peer_portals
            .iter()
            .enumerate()
            .map(|(j, a)| iscsi::Portal {
                addr: *a,
                tpgt: port_id(peer, j),
            })
            .collect()
    });
    let server = iscsi::ServerConfig {
        portals,
        partner_portals,
        targets,
        discovery_auth: discovery_auth(cfg),
        limits: cfg.limits.to_iscsi(),
        buffers: block::BufferBudget::node(),
    };
    Ok((server, opened, exports))
}

fn human(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    format!("{v:.1} {}", UNITS[u])
}

/// What whoever starts the node may plug into it (all optional).
#[derive(Default)]
pub struct Hooks {
    /// Reads the configuration anew for a reload; without it the node cannot
    /// reload (the API answers 404 to `POST /api/v1/reload`).
    pub load_config: Option<crate::reload::LoadConfig>,
    /// Each message asks for a reload (the binary sends one per SIGHUP).
    pub reload_requests: Option<tokio::sync::mpsc::Receiver<()>>,
    /// Told when the node is ready, reloads and stops (the binary: sd_notify).
    pub lifecycle: Option<crate::reload::LifecycleHook>,
}

/// Runs the node until the future `stop_signal()` returns ends, then shuts it
/// down cleanly. `stop_signal` is called once, just before the banner, so that
/// whoever starts the node may stop it from then on (the binary passes its
/// SIGTERM and SIGINT watcher).
pub async fn run<S, F>(cfg: Config, stop_signal: S) -> Result<()>
where
    S: FnOnce() -> F,
    F: std::future::Future<Output = ()>,
{
    run_with(cfg, stop_signal, Hooks::default()).await
}

/// [`run`] with [`Hooks`]: reload on request, lifecycle notifications.
pub async fn run_with<S, F>(cfg: Config, stop_signal: S, mut hooks: Hooks) -> Result<()>
where
    S: FnOnce() -> F,
    F: std::future::Future<Output = ()>,
{
    cfg.validate()?;
    // one bound on buffered data for the whole node, in place before any
    // frontend, replica or export takes it (they use BufferBudget::node())
    let buffer_bytes = cfg.limits.buffer_memory_bytes()?;
    let (session_bytes, source_bytes) = cfg.limits.buffer_shares(buffer_bytes)?;
    let budget = block::BufferBudget::with_shares(buffer_bytes, session_bytes, source_bytes);
    if block::BufferBudget::install_node(budget).is_err() {
        bail!("the node's buffer budget was set before the node started");
    }
    crate::secrets::check_data_dir(&cfg.data_dir)?;
    crate::secrets::private_files(&cfg.data_dir)?;
    // before anything keeps state in it: the alert cursors are written at once
    std::fs::create_dir_all(&cfg.data_dir)
        .with_context(|| format!("creating data directory {}", cfg.data_dir.display()))?;
    let events = Arc::new(crate::events::log::EventLog::open(
        &cfg.data_dir,
        cfg.alerts
            .log_events_max
            .unwrap_or(crate::events::log::DEFAULT_EVENTS_MAX),
    )?);
    crate::events::deliver::start(&cfg.alerts, &events, &cfg.data_dir)?;
    let pools = std::sync::Arc::new(Pools::open(&cfg).await?);
    let cluster = cfg
        .cluster
        .clone()
        .map(|c| Cluster::new(c, &cfg.data_dir).map(Arc::new))
        .transpose()?;
    let (server_cfg, opened, exports) = build(&cfg, &pools, cluster.as_deref())?;
    if let Some(c) = &cluster {
        let portals: Vec<_> = cfg.portals.iter().map(|p| p.address).collect();
        c.listen(&portals).await?;
    }
    let targets: std::collections::HashMap<String, Arc<scsi::ScsiTarget>> = server_cfg
        .targets
        .iter()
        .map(|t| (t.iqn.clone(), t.scsi.clone()))
        .collect();
    let server = iscsi::Server::bind(server_cfg)
        .await
        .context("binding the portals")?;
    let reloader = hooks.load_config.take().map(|load| {
        Arc::new(crate::reload::Reloader::new(
            load,
            server.reloader(),
            pools.clone(),
            cluster.clone(),
            cfg.clone(),
            hooks.lifecycle.clone(),
            events.clone(),
        ))
    });
    let nbd_server = match &cfg.nbd {
        Some(n) => Some(
            nbd::NbdServer::bind(nbd::NbdConfig {
                listen: n.address,
                default_export: exports.first().map(|e| e.name.clone()),
                exports,
                limits: n.limits(),
                allowed_clients: n.allowed_ranges()?,
                tls: crate::nbdtls::prepare(n, &cfg.data_dir)?,
            })
            .await
            .with_context(|| format!("binding NBD on {}", n.address))?,
        ),
        None => None,
    };
    // without an API there are no run-time objects: NBD alone learns of the
    // targets a reload adds
    if let (Some(r), None) = (&reloader, &cfg.api) {
        r.attach(None, nbd_server.as_ref().map(|n| n.exports()));
    }
    let addrs = server.local_addrs();
    crate::events::watch::start(
        events.clone(),
        crate::events::watch::Sources {
            pools: pools.clone(),
            cluster: cluster.clone(),
            targets: targets
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            auth: Some(server.auth_stats()),
            certificates: crate::events::watch::certificate_files(&cfg),
        },
    );
    let api_server = match &cfg.api {
        Some(a) => {
            let summary = serde_json::json!({
                "version": env!("CARGO_PKG_VERSION"),
                "portals": addrs.iter().map(|a| a.to_string()).collect::<Vec<_>>(),
            });
            let objects = Arc::new(
                Objects::new(&cfg, targets)?.with_nbd(nbd_server.as_ref().map(|n| n.exports())),
            );
            if let Some(r) = &reloader {
                r.attach(Some(objects.clone()), None);
            }
            let control = std::sync::Arc::new(NodeControl {
                pools: pools.clone(),
                cluster: cluster.clone(),
                summary,
                reload: reloader.clone(),
                objects: objects.clone(),
                events: events.clone(),
                iscsi_sessions: Some(server.sessions()),
                history: Default::default(),
                bench: Default::default(),
            });
            NodeControl::start_sampler(&control);
            crate::api_node::prepare_node(&cfg.data_dir)?;
            let options = api::ApiOptions {
                data_dir: cfg.data_dir.clone(),
                hosts: a.hosts.clone(),
                limits: a.limits(),
                tls: crate::api_node::prepare_tls(a, &cfg.data_dir)?,
            };
            let mut srv = api::ApiServer::bind(a.address, control, options)
                .await
                .with_context(|| format!("binding the management API on {}", a.address))?;
            if let Some(c) = a.console {
                srv.bind_console(c)
                    .await
                    .with_context(|| format!("binding the web console on {c}"))?;
            }
            crate::api_node::note_local_node(srv.local_addr()?, &cfg.data_dir);
            Some(srv)
        }
        None => None,
    };
    events
        .record(crate::events::NewEvent::new(
            crate::events::Severity::Info,
            crate::events::EventKind::NodeStarted,
            cfg.data_dir.display().to_string(),
            format!("freesan {} started", env!("CARGO_PKG_VERSION")),
        ))
        .await;
    // watched before the banner: whoever starts the node may stop it at once
    let stop_signal = stop_signal();
    eprintln!("freesan {} serving", env!("CARGO_PKG_VERSION"));
    eprintln!("  data directory: {}", cfg.data_dir.display());
    for a in &addrs {
        eprintln!("  portal:         {a}");
    }
    if let Some(n) = &nbd_server {
        eprintln!("  nbd:            {}", n.local_addr());
    }
    if let Some(a) = &api_server {
        eprintln!("  api:            {}", a.local_addr()?);
        if let Some(c) = a.console_addr() {
            let scheme = if cfg.api.as_ref().is_some_and(|a| a.tls_enabled()) {
                "https"
            } else {
                "http"
            };
            eprintln!("  console:        {scheme}://{}/", c?);
        }
    }
    eprintln!(
        "  buffer memory:  {} at most, {} a session",
        human(buffer_bytes),
        human(session_bytes)
    );
    for l in &opened {
        eprintln!(
            "  LUN {:<3} {}  {} ({})",
            l.id,
            l.target,
            l.path,
            human(l.size_bytes)
        );
    }
    if let (Some(a), Some(l)) = (addrs.first(), opened.first()) {
        eprintln!("connect with:");
        eprintln!("  iscsi-ls -s iscsi://{a}");
        eprintln!("  iscsiadm -m discovery -t sendtargets -p {a} && iscsiadm -m node --login");
        eprintln!("  qemu-img info iscsi://{a}/{}/{}", l.target, l.id);
        if let (Some(n), Some(c)) = (&nbd_server, &cfg.nbd) {
            let url = crate::nbdtls::client_url(c, &cfg.data_dir, n.local_addr(), l.id);
            eprintln!("  nbdinfo '{url}'");
        }
    }
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    let api_addr = match &api_server {
        Some(a) => Some(a.local_addr()?),
        None => None,
    };
    let api_task = api_server.map(|a| tokio::spawn(a.run(stopped(stop_rx.clone()))));
    let nbd_task = nbd_server.map(|n| tokio::spawn(n.run(stopped(stop_rx.clone()))));
    let iscsi_task = tokio::spawn(server.run(stopped(stop_rx)));
    let reload_task = match (hooks.reload_requests.take(), &reloader) {
        (Some(mut requests), Some(r)) => {
            let r = r.clone();
            Some(tokio::spawn(async move {
                while requests.recv().await.is_some() {
                    // the outcome is logged by the reloader
                    let _ = r.reload().await;
                }
            }))
        }
        _ => None,
    };
    let tell = |l| {
        if let Some(h) = &hooks.lifecycle {
            h(l)
        }
    };
    tell(crate::reload::Lifecycle::Ready);
    stop_signal.await;
    tell(crate::reload::Lifecycle::Stopping);
    if let Some(t) = reload_task {
        t.abort();
    }
    // forgotten while the API still holds its port: once the port is free,
    // another node may take it and note its own data directory there
    if let Some(a) = api_addr {
        crate::api_node::forget_local_node(a, &cfg.data_dir);
    }
    stop_tx.send_replace(true);
    // every step runs whatever the one before it returned (review of
    // 2026-12-06: an API or NBD task's error returned at once, skipping the
    // iSCSI drain and flush, the replicas' and the pools' shutdown: pools
    // resynchronised and caches started cold at the next start); the first
    // error is returned at the end
    let mut first_error: Option<anyhow::Error> = None;
    let mut note = |r: Result<()>| {
        if let Err(e) = r {
            tracing::error!("shutdown: {e:#}");
            first_error.get_or_insert(e);
        }
    };
    if let Some(t) = api_task {
        note(
            t.await
                .context("API task")
                .and_then(|r| r.map_err(anyhow::Error::from)),
        );
    }
    if let Some(t) = nbd_task {
        note(
            t.await
                .context("NBD server task")
                .and_then(|r| r.map_err(anyhow::Error::from)),
        );
    }
    note(
        iscsi_task
            .await
            .context("iSCSI server task")
            .and_then(|r| r.map_err(anyhow::Error::from)),
    );
    if let Some(c) = &cluster {
        c.shutdown().await;
    }
    pools.shutdown().await;
    if let Some(e) = first_error {
        return Err(e);
    }
    eprintln!("freesan stopped cleanly");
    Ok(())
}
