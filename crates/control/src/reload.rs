//! Configuration reload while the node serves (SIGHUP, `POST /api/v1/reload`).
//!
//! What it applies live: targets appended to the configuration (their LUNs are
//! opened and they become discoverable and loginable), and for the running
//! targets their CHAP, mutual CHAP and per-initiator CHAP, allowed initiators,
//! alias and host groups (LUN masking); discovery CHAP. Sessions already logged
//! in are not touched: authentication applies at login, and host groups apply
//! to the next command of every session (that is what LUN masking means).
//!
//! What it does not apply (it keeps what runs and names each in the log and in
//! the answer, under `not_applied`): portals, LUNs of running targets, targets
//! removed or reordered, pools, disks, caches, limits, the API, NBD, the cluster
//! and the data directory; those need a restart (or the objects API). Targets
//! added by a reload are not exported over NBD and are not managed by the
//! objects API (`freesan lun`) until the next restart.
//!
//! Invariant: a reload either installs the whole new target table or none of it
//! (a new target whose LUNs cannot be opened fails the reload, and nothing
//! changes); reloads run one at a time.

use crate::cluster::Cluster;
use crate::config::Config;
use crate::pools::Pools;
use anyhow::{Context, Result};
use serde::Serialize;
use std::sync::Arc;

/// Reads the configuration anew (the file and `managed.toml`, as at start-up).
pub type LoadConfig = Arc<dyn Fn() -> Result<Config> + Send + Sync>;

/// Moments of a node's life that a service manager wants to hear of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lifecycle {
    /// The node serves (after the banner).
    Ready,
    /// A reload begins.
    Reloading,
    /// A reload ended (applied or refused): the node serves again.
    Reloaded,
    /// The node begins to shut down.
    Stopping,
}

/// Told of every [`Lifecycle`] moment (the binary: sd_notify).
pub type LifecycleHook = Arc<dyn Fn(Lifecycle) + Send + Sync>;

/// What a reload did.
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct ReloadReport {
    /// Changes now in effect, one line each.
    pub applied: Vec<String>,
    /// Changes found in the file that need a restart (the running value is kept).
    pub not_applied: Vec<String>,
}

/// Reloads the configuration of a running node.
pub struct Reloader {
    load: LoadConfig,
    iscsi: iscsi::Reloader,
    pools: Arc<Pools>,
    cluster: Option<Arc<Cluster>>,
    lifecycle: Option<LifecycleHook>,
    /// The configuration in effect (what the last reload applied of it).
    current: tokio::sync::Mutex<Config>,
}

impl Reloader {
    /// A reloader of the node started with `cfg`.
    pub(crate) fn new(
        load: LoadConfig,
        iscsi: iscsi::Reloader,
        pools: Arc<Pools>,
        cluster: Option<Arc<Cluster>>,
        cfg: Config,
        lifecycle: Option<LifecycleHook>,
    ) -> Reloader {
        Reloader {
            load,
            lifecycle,
            iscsi,
            pools,
            cluster,
            current: tokio::sync::Mutex::new(cfg),
        }
    }

    /// Reads the configuration and applies what can be applied live. Fails (and
    /// changes nothing) when the file cannot be read or is invalid, or when a new
    /// target cannot be built.
    pub async fn reload(&self) -> Result<ReloadReport> {
        let mut current = self.current.lock().await;
        let tell = |l| {
            if let Some(h) = &self.lifecycle {
                h(l)
            }
        };
        tell(Lifecycle::Reloading);
        let r = self.apply(&mut current).await;
        tell(Lifecycle::Reloaded);
        if let Err(e) = &r {
            tracing::error!("reload refused, the running configuration stays: {e:#}");
        }
        r
    }

    /// Gives running target `t.iqn` the CHAP and allowed initiators of `t` (they
    /// apply at the next login); the rest of the running configuration stays.
    pub(crate) async fn set_target_access(&self, t: &crate::config::TargetConfig) -> Result<()> {
        let mut current = self.current.lock().await;
        let mut specs = self.iscsi.targets();
        let Some(spec) = specs.iter_mut().find(|s| s.iqn == t.iqn) else {
            anyhow::bail!("target {} does not run", t.iqn);
        };
        spec.auth = crate::serve::target_auth(t);
        spec.allowed_initiators = t.allowed_initiators.clone();
        self.iscsi
            .replace(specs, crate::serve::discovery_auth(&current))
            .context("installing the new target table")?;
        if let Some(c) = current.targets.iter_mut().find(|c| c.iqn == t.iqn) {
            c.chap = t.chap.clone();
            c.allowed_initiators = t.allowed_initiators.clone();
        }
        tracing::info!(target = %t.iqn, chap = t.chap.is_some(), allowed_initiators = t.allowed_initiators.len(), "target access changed through the API (applies at login)");
        Ok(())
    }

    async fn apply(&self, current: &mut Config) -> Result<ReloadReport> {
        let new = (self.load)().context("reading the configuration")?;
        new.validate().context("the new configuration")?;
        let mut report = ReloadReport::default();
        not_applied(current, &new, &mut report);
        let running = self.iscsi.targets();
        let portals = crate::serve::iscsi_portals(current);
        let mut specs = Vec::with_capacity(running.len());
        let mut host_groups = Vec::new();
        // the running targets, in their order; each takes its new auth and ACLs
        for spec in &running {
            let Some(t) = new.targets.iter().find(|t| t.iqn == spec.iqn) else {
                report.not_applied.push(format!(
                    "target {} was removed from the configuration: it keeps serving until a restart",
                    spec.iqn
                ));
                specs.push(spec.clone());
                continue;
            };
            let old = current.targets.iter().find(|o| o.iqn == t.iqn);
            if old.is_some_and(|o| o.luns != t.luns) {
                report.not_applied.push(format!(
                    "target {}: LUN changes need a restart (or `freesan lun`)",
                    t.iqn
                ));
            }
            let mut s = spec.clone();
            s.alias = t.alias.clone();
            s.auth = crate::serve::target_auth(t);
            s.allowed_initiators = t.allowed_initiators.clone();
            if s.auth != spec.auth {
                report
                    .applied
                    .push(format!("target {}: CHAP changed (applies at login)", t.iqn));
            }
            if s.allowed_initiators != spec.allowed_initiators {
                report
                    .applied
                    .push(format!("target {}: allowed initiators changed", t.iqn));
            }
            if old.is_none_or(|o| o.host_groups != t.host_groups) {
                let groups: Vec<scsi::HostGroup> =
                    t.host_groups.iter().map(|g| g.to_scsi()).collect();
                host_groups.push((t.iqn.clone(), spec.scsi.clone(), groups));
            }
            specs.push(s);
        }
        // targets new to the node, appended
        for (ti, t) in new.targets.iter().enumerate() {
            if running.iter().any(|r| r.iqn == t.iqn) {
                continue;
            }
            let (spec, opened, _exports) = crate::serve::build_target(
                &new,
                ti,
                t,
                &portals,
                &self.pools,
                self.cluster.as_deref(),
            )
            .with_context(|| format!("new target {}", t.iqn))?;
            let luns: Vec<String> = opened
                .iter()
                .map(|l| format!("LUN {} {}", l.id, l.path))
                .collect();
            report
                .applied
                .push(format!("target {} added ({})", t.iqn, luns.join(", ")));
            specs.push(spec);
        }
        let discovery = crate::serve::discovery_auth(&new);
        if new.discovery_chap != current.discovery_chap {
            report.applied.push("discovery CHAP changed".into());
        }
        self.iscsi
            .replace(specs, discovery)
            .context("installing the new target table")?;
        for (iqn, scsi, groups) in host_groups {
            match scsi.set_host_groups(groups) {
                Ok(()) => report
                    .applied
                    .push(format!("target {iqn}: host groups set")),
                Err(e) => report
                    .not_applied
                    .push(format!("target {iqn}: host groups refused: {e}")),
            }
        }
        // what runs now: the new file, except for what could not be applied
        let mut applied_cfg = new.clone();
        applied_cfg.portals = current.portals.clone();
        applied_cfg.pools = current.pools.clone();
        applied_cfg.disks = current.disks.clone();
        applied_cfg.caches = current.caches.clone();
        applied_cfg.limits = current.limits.clone();
        applied_cfg.api = current.api.clone();
        applied_cfg.nbd = current.nbd.clone();
        applied_cfg.cluster = current.cluster.clone();
        applied_cfg.data_dir = current.data_dir.clone();
        for t in &mut applied_cfg.targets {
            if let Some(o) = current.targets.iter().find(|o| o.iqn == t.iqn) {
                t.luns = o.luns.clone();
            }
        }
        *current = applied_cfg;
        for a in &report.applied {
            tracing::info!("reload: {a}");
        }
        for n in &report.not_applied {
            tracing::warn!("reload: not applied: {n}");
        }
        if report.applied.is_empty() && report.not_applied.is_empty() {
            tracing::info!("reload: no changes");
        }
        Ok(report)
    }
}

/// Lists the node-wide sections that differ and cannot change live.
fn not_applied(old: &Config, new: &Config, report: &mut ReloadReport) {
    let mut differs = |what: &str, same: bool| {
        if !same {
            report
                .not_applied
                .push(format!("{what} changed: needs a restart"));
        }
    };
    differs("portals", old.portals == new.portals);
    differs("data_dir", old.data_dir == new.data_dir);
    differs("pools", old.pools == new.pools);
    differs("disks", old.disks == new.disks);
    differs("caches", old.caches == new.caches);
    differs("limits", old.limits == new.limits);
    differs("api", old.api == new.api);
    differs("nbd", old.nbd == new.nbd);
    differs("cluster", old.cluster == new.cluster);
}
