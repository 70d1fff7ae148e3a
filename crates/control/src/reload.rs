//! Configuration reload while the node serves (SIGHUP, `POST /api/v1/reload`).
//!
//! What it applies live: targets appended to the configuration (their LUNs are
//! opened and they become discoverable and loginable), and for the running
//! targets their CHAP, mutual CHAP and per-initiator CHAP, allowed initiators,
//! alias and host groups (LUN masking); discovery CHAP; and on a node outside
//! an HA pair its portals. A session logged in before is closed when the new
//! access settings would refuse its login (an initiator the ACL no longer
//! lists, CHAP credentials other than those it proved); the others keep
//! running, and host groups apply to the next command of every session (that
//! is what LUN masking means).
//!
//! Portals: a portal added is bound (a failure to bind refuses the whole
//! reload), joins every target's ALUA port group (VPD 83h and REPORT TARGET
//! PORT GROUPS name it) and is listed by SendTargets; a portal removed stops
//! accepting and the sessions that came through it close; the portals that
//! stay keep their TPGT and their sessions. A new portal takes the smallest
//! TPGT no portal of the node has (after a restart TPGTs follow the file's
//! order again).
//!
//! What it does not apply (it keeps what runs and names each in the log and in
//! the answer, under `not_applied`): portals of a node in an HA pair (its
//! client-network heartbeats run on them and the partner advertises them),
//! LUNs of running targets, targets removed or reordered, pools, disks,
//! caches, limits, the API, NBD, the cluster and the data directory; those
//! need a restart (or the objects API). Targets added by a reload are
//! exported over NBD, listed in status and metrics and managed by the objects
//! API (`freesan lun`) like those of the start.
//!
//! Invariant: a reload either installs the whole new target table or none of it
//! (a new target whose LUNs cannot be opened fails the reload, and nothing
//! changes); reloads run one at a time.

use crate::cluster::Cluster;
use crate::config::Config;
use crate::pools::Pools;
use anyhow::{Context, Result};
use serde::Serialize;
use std::path::PathBuf;
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
    /// The portals served, as configured, with their TPGTs (changed only while
    /// `current` is held).
    portals: parking_lot::Mutex<Vec<iscsi::Portal>>,
    /// What else learns of a reload: the run-time objects (targets added
    /// become manageable and are listed) and the NBD server (their LUNs are
    /// exported), when the node has them ([`Reloader::attach`]).
    objects: std::sync::OnceLock<Arc<crate::objects::Objects>>,
    nbd: std::sync::OnceLock<nbd::NbdExports>,
    /// The event log: targets added follow their LU events into it.
    events: Arc<crate::events::log::EventLog>,
    /// The key, certificate and secret files the node read at start, with
    /// what they held then: a reload that finds one changed in place says
    /// that it needs a restart (the path compares equal in the config).
    credentials: Vec<CredentialFile>,
}

/// A file of keys, certificates or secrets the node reads once, at start.
#[derive(Debug, Clone, PartialEq, Eq)]
struct CredentialFile {
    /// The setting that names it, as the config file spells it.
    setting: &'static str,
    path: PathBuf,
    /// SHA-256 of its contents (None: it could not be read).
    digest: Option<[u8; 32]>,
}

/// The credential files `cfg` names, with their contents' digests now.
fn credential_files(cfg: &Config) -> Vec<CredentialFile> {
    use sha2::Digest;
    let mut named: Vec<(&'static str, &PathBuf)> = Vec::new();
    if let Some(a) = &cfg.api {
        named.extend(a.cert.iter().map(|p| ("[api] cert", p)));
        named.extend(a.key.iter().map(|p| ("[api] key", p)));
    }
    if let Some(n) = &cfg.nbd {
        named.extend(n.tls_cert.iter().map(|p| ("[nbd] tls_cert", p)));
        named.extend(n.tls_key.iter().map(|p| ("[nbd] tls_key", p)));
        named.extend(n.tls_client_ca.iter().map(|p| ("[nbd] tls_client_ca", p)));
        named.extend(n.tls_psk_file.iter().map(|p| ("[nbd] tls_psk_file", p)));
    }
    if let Some(c) = &cfg.cluster {
        named.push(("[cluster] key_file", &c.key_file));
    }
    named.extend(
        cfg.alerts
            .webhook_secret_file
            .iter()
            .map(|p| ("[alerts] webhook_secret_file", p)),
    );
    named
        .into_iter()
        .map(|(setting, path)| CredentialFile {
            setting,
            path: path.clone(),
            digest: std::fs::read(path)
                .ok()
                .map(|b| sha2::Sha256::digest(&b).into()),
        })
        .collect()
}

/// Names each credential file that `now` (the new config's) finds with other
/// contents than the node read at start (`started`) under the same setting
/// and path; a setting that names another path is reported with its section.
fn credentials_changed(
    started: &[CredentialFile],
    now: &[CredentialFile],
    report: &mut ReloadReport,
) {
    for n in now {
        if let Some(s) = started
            .iter()
            .find(|s| s.setting == n.setting && s.path == n.path)
        {
            if s.digest != n.digest {
                report.not_applied.push(format!(
                    "{} {}: the file changed; the node uses what it read at start until a restart",
                    n.setting,
                    n.path.display()
                ));
            }
        }
    }
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
        events: Arc<crate::events::log::EventLog>,
    ) -> Reloader {
        Reloader {
            load,
            lifecycle,
            iscsi,
            pools,
            cluster,
            portals: parking_lot::Mutex::new(crate::targets::iscsi_portals(&cfg)),
            credentials: credential_files(&cfg),
            current: tokio::sync::Mutex::new(cfg),
            objects: std::sync::OnceLock::new(),
            nbd: std::sync::OnceLock::new(),
            events,
        }
    }

    /// The LUNs running target `t` (as the last reload left it) serves now:
    /// as the run-time objects have them when attached (`freesan lun` creates
    /// and deletes them between reloads), else as `t` lists them.
    fn luns_now(&self, t: &crate::config::TargetConfig) -> Vec<crate::config::LunConfig> {
        self.objects
            .get()
            .and_then(|o| o.target_config(&t.iqn))
            .map_or_else(|| t.luns.clone(), |c| c.luns)
    }

    /// Tells later reloads of the node's run-time objects and NBD exports
    /// (once, at start, when they exist).
    pub(crate) fn attach(
        &self,
        objects: Option<Arc<crate::objects::Objects>>,
        nbd: Option<nbd::NbdExports>,
    ) {
        if let Some(o) = objects {
            let _ = self.objects.set(o);
        }
        if let Some(n) = nbd {
            let _ = self.nbd.set(n);
        }
    }

    /// Reads the configuration and applies what can be applied live. Fails (and
    /// changes nothing) when the file cannot be read or is invalid, or when a new
    /// target cannot be built.
    pub async fn reload(&self) -> Result<ReloadReport> {
        // the API's changes wait meanwhile, and it waits for theirs (taken
        // before `current`, as those changes take it inside): a LUN created
        // while a reload added a target over the same pool or file both went
        // through, two LUNs over one backing, and the create's commit put the
        // configuration back without the reload's target (review of
        // 2026-12-06)
        let _changes = match self.objects.get() {
            Some(o) => Some(o.hold_changes().await),
            None => None,
        };
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

    /// Gives running target `iqn` the CHAP `chap` (`Some(None)`: off) and/or
    /// the allowed initiators `acl` (sessions they no longer admit are closed,
    /// see `iscsi::Reloader::replace`); the rest of its settings (mutual and per-initiator CHAP, alias) stay as the running
    /// configuration has them.
    pub(crate) async fn set_target_access(
        &self,
        iqn: &str,
        chap: Option<Option<crate::config::Chap>>,
        acl: Option<Vec<String>>,
    ) -> Result<()> {
        let mut current = self.current.lock().await;
        let Some(t) = current.targets.iter().find(|t| t.iqn == iqn) else {
            anyhow::bail!("target {iqn} does not run");
        };
        let mut t = t.clone();
        if let Some(c) = chap {
            t.chap = c;
        }
        if let Some(a) = acl {
            t.allowed_initiators = a;
        }
        let mut specs = self.iscsi.targets();
        let Some(spec) = specs.iter_mut().find(|s| s.iqn == iqn) else {
            anyhow::bail!("target {iqn} does not run");
        };
        spec.auth = crate::targets::target_auth(&t);
        spec.allowed_initiators = t.allowed_initiators.clone();
        let scsi = spec.scsi.clone();
        let closed = self
            .iscsi
            .replace(specs, crate::targets::discovery_auth(&current))
            .context("installing the new target table")?;
        // (once in force: the HA partner compares them)
        scsi.set_admission(crate::targets::admission_lines(&t));
        tracing::info!(target = %iqn, chap = t.chap.is_some(), allowed_initiators = t.allowed_initiators.len(),
            sessions_closed = closed, "target access changed through the API");
        if let Some(c) = current.targets.iter_mut().find(|c| c.iqn == iqn) {
            *c = t;
        }
        Ok(())
    }

    async fn apply(&self, current: &mut Config) -> Result<ReloadReport> {
        let new = (self.load)().context("reading the configuration")?;
        new.validate().context("the new configuration")?;
        let mut report = ReloadReport::default();
        let live_portals = self.cluster.is_none();
        // what runs: disks, pools and caches the API created or changed since
        // the start are the run-time objects' (the new configuration has them
        // from managed.toml), not a change of the file
        let mut running_cfg = current.clone();
        if let Some(o) = self.objects.get() {
            let (now, _) = o.snapshot();
            running_cfg.disks = now.disks;
            running_cfg.pools = now.pools;
            running_cfg.caches = now.caches;
        }
        not_applied(&running_cfg, &new, live_portals, &mut report);
        credentials_changed(&self.credentials, &credential_files(&new), &mut report);
        let running = self.iscsi.targets();
        let old_portals = self.portals.lock().clone();
        let new_portals = (live_portals && new.portals != current.portals)
            .then(|| assign_tpgts(&old_portals, &new));
        let portals = new_portals.clone().unwrap_or_else(|| old_portals.clone());
        let mut specs = Vec::with_capacity(running.len());
        let mut host_groups = Vec::new();
        // who each running target admits, recorded once the new table is in force
        let mut admissions = Vec::new();
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
            if old.is_some_and(|o| self.luns_now(o) != t.luns) {
                report.not_applied.push(format!(
                    "target {}: LUN changes need a restart (or `freesan lun`)",
                    t.iqn
                ));
            }
            let mut s = spec.clone();
            s.alias = t.alias.clone();
            s.auth = crate::targets::target_auth(t);
            s.allowed_initiators = t.allowed_initiators.clone();
            admissions.push((s.scsi.clone(), crate::targets::admission_lines(t)));
            if s.auth != spec.auth {
                report
                    .applied
                    .push(format!("target {}: CHAP changed", t.iqn));
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
        // what the running targets serve stays theirs: a target the reload
        // adds may not open a file, pool, cache or disk one of them serves
        // (also one a target removed from the file still serves, and one a
        // running target's LUN had before the file changed it, a change not
        // applied): two LUNs over the same blocks, each with its own locks,
        // reservations and identity
        let mut claims = current.clone();
        claims.targets = running
            .iter()
            .filter_map(|r| current.targets.iter().find(|o| o.iqn == r.iqn))
            .map(|o| {
                let mut o = o.clone();
                o.luns = self.luns_now(&o);
                o
            })
            .chain(
                new.targets
                    .iter()
                    .filter(|t| !running.iter().any(|r| r.iqn == t.iqn))
                    .cloned(),
            )
            .collect();
        claims
            .check_single_users()
            .context("a target the reload adds against the running ones")?;
        // targets new to the node, appended; a refused reload gives back what
        // the ones built before its failure took (undo_built)
        let mut added = Vec::new();
        let mut built: Vec<&crate::config::TargetConfig> = Vec::new();
        // built as the node runs: a changed data_dir or [cluster] takes
        // effect at the next start only (reported below), so a new target's
        // state files and its ALUA port groups (this node's id, the partner's
        // portals) follow the running ones (review of 2026-12-06: built from
        // the file's, a changed node_id put this node's ports in the
        // partner's group, its paths unavailable while it served alone)
        let as_running = Config {
            data_dir: current.data_dir.clone(),
            cluster: current.cluster.clone(),
            ..new.clone()
        };
        for (ti, t) in new.targets.iter().enumerate() {
            if running.iter().any(|r| r.iqn == t.iqn) {
                continue;
            }
            built.push(t);
            let made = crate::targets::build_target(
                &as_running,
                ti,
                t,
                &portals,
                &self.pools,
                self.cluster.as_deref(),
            );
            let (spec, opened, exports) = match made {
                Ok(m) => m,
                Err(e) => {
                    self.undo_built(&built).await;
                    return Err(e.context(format!("new target {}", t.iqn)));
                }
            };
            let luns: Vec<String> = opened
                .iter()
                .map(|l| format!("LUN {} {}", l.id, l.path))
                .collect();
            report
                .applied
                .push(format!("target {} added ({})", t.iqn, luns.join(", ")));
            added.push((t.iqn.clone(), spec.scsi.clone(), exports));
            specs.push(spec);
        }
        if let Some(p) = &new_portals {
            if let Err(e) = self
                .set_portals(&running, &old_portals, p, &mut report)
                .await
            {
                self.undo_built(&built).await;
                return Err(e);
            }
        }
        let discovery = crate::targets::discovery_auth(&new);
        if new.discovery_chap != current.discovery_chap
            || new.discovery_chap_md5 != current.discovery_chap_md5
        {
            report.applied.push("discovery CHAP changed".into());
        }
        match self.iscsi.replace(specs, discovery) {
            Ok(0) => {}
            Ok(closed) => report.applied.push(format!(
                "{closed} session(s) the new access settings no longer admit closed"
            )),
            Err(e) => {
                self.undo_built(&built).await;
                return Err(anyhow::Error::from(e).context("installing the new target table"));
            }
        }
        for (scsi, lines) in admissions {
            scsi.set_admission(lines);
        }
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
        if new_portals.is_none() {
            applied_cfg.portals = current.portals.clone();
        }
        applied_cfg.pools = current.pools.clone();
        applied_cfg.disks = current.disks.clone();
        applied_cfg.caches = current.caches.clone();
        applied_cfg.limits = current.limits.clone();
        applied_cfg.api = current.api.clone();
        applied_cfg.nbd = current.nbd.clone();
        applied_cfg.cluster = current.cluster.clone();
        applied_cfg.alerts = current.alerts.clone();
        applied_cfg.data_dir = current.data_dir.clone();
        for t in &mut applied_cfg.targets {
            if let Some(o) = current.targets.iter().find(|o| o.iqn == t.iqn) {
                t.luns = self.luns_now(o);
            }
        }
        // a target removed from the file keeps serving until a restart: it
        // stays in the record of what runs (its files stay claimed, its
        // CHAP can still be changed)
        for r in &running {
            if !applied_cfg.targets.iter().any(|t| t.iqn == r.iqn) {
                if let Some(o) = current.targets.iter().find(|o| o.iqn == r.iqn) {
                    let mut o = o.clone();
                    o.luns = self.luns_now(&o);
                    applied_cfg.targets.push(o);
                }
            }
        }
        for (iqn, scsi, _) in &added {
            crate::events::watch::follow(&self.events, iqn, scsi);
        }
        match self.objects.get() {
            Some(o) => o.adopt_reload(&applied_cfg, added),
            None => {
                if let Some(n) = self.nbd.get() {
                    for e in added.into_iter().flat_map(|(_, _, e)| e) {
                        if let Err(err) = n.add(e) {
                            tracing::warn!(error = %err, "LUN of an added target not served over NBD");
                        }
                    }
                }
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

impl Reloader {
    /// A refused reload takes nothing with it: the disks the new targets'
    /// LUNs took go back to the free disks, and their replicated volumes are
    /// dropped (else every retry found "replicated volume ... exists already"
    /// and the disks "already in use" until a restart, and the partner met an
    /// orphan volume with no target). Only targets the reload added, none of
    /// whose disks or volumes a running target has (the claims check).
    async fn undo_built(&self, targets: &[&crate::config::TargetConfig]) {
        for t in targets {
            for (i, l) in t.luns.iter().enumerate() {
                let id = l.id.unwrap_or(i as u64);
                if let Some(d) = &l.disk {
                    self.pools.release_lun_disk(d);
                }
                if let (true, Some(c)) = (l.replicated, &self.cluster) {
                    c.forget(&c.volume_name(&t.iqn, id)).await;
                }
            }
        }
    }

    /// Makes `portals` the node's portals: the running targets' SCSI ports
    /// first (a port no initiator reaches yet is harmless), then the iSCSI
    /// listeners; when a listener cannot be bound the SCSI ports go back to
    /// `old` and the reload fails with nothing changed.
    async fn set_portals(
        &self,
        running: &[iscsi::TargetSpec],
        old: &[iscsi::Portal],
        portals: &[iscsi::Portal],
        report: &mut ReloadReport,
    ) -> Result<()> {
        let group = crate::targets::SINGLE_NODE_GROUP;
        let ports = |spec: &iscsi::TargetSpec, p: &[iscsi::Portal]| {
            crate::targets::target_ports(&spec.iqn, p, group)
        };
        for spec in running {
            spec.scsi
                .set_ports(ports(spec, portals))
                .with_context(|| format!("target {}: its new ports", spec.iqn))?;
        }
        let change = match self.iscsi.set_portals(portals).await {
            Ok(c) => c,
            Err(e) => {
                for spec in running {
                    if let Err(e) = spec.scsi.set_ports(ports(spec, old)) {
                        tracing::error!(target = %spec.iqn, "reload: restoring the ports: {e}");
                    }
                }
                return Err(e).context("changing the portals");
            }
        };
        for p in &change.added {
            report
                .applied
                .push(format!("portal {} added (TPGT {})", p.addr, p.tpgt));
        }
        for p in &change.removed {
            report
                .applied
                .push(format!("portal {} removed (TPGT {})", p.addr, p.tpgt));
        }
        if change.sessions_closed > 0 {
            report.applied.push(format!(
                "{} session(s) through removed portals closed",
                change.sessions_closed
            ));
        }
        *self.portals.lock() = portals.to_vec();
        Ok(())
    }
}

/// The portals of `new` with their TPGTs: a portal `old` has keeps its TPGT,
/// a new one takes the smallest port id that neither `old` nor the others use
/// (so a removed portal's sessions, closed by TPGT, are never confused with a
/// new portal's).
fn assign_tpgts(old: &[iscsi::Portal], new: &Config) -> Vec<iscsi::Portal> {
    let node_id = new.cluster.as_ref().map_or(1, |c| c.node_id);
    let kept: Vec<Option<u16>> = new
        .portals
        .iter()
        .map(|p| old.iter().find(|o| o.addr == p.address).map(|o| o.tpgt))
        .collect();
    let mut used: Vec<u16> = old.iter().map(|o| o.tpgt).collect();
    new.portals
        .iter()
        .zip(kept)
        .map(|(p, tpgt)| {
            let tpgt = tpgt.unwrap_or_else(|| {
                let t = (0..)
                    .map(|i| crate::cluster::port_id(node_id, i))
                    .find(|t| !used.contains(t))
                    .expect("a free port id");
                used.push(t);
                t
            });
            iscsi::Portal {
                addr: p.address,
                tpgt,
            }
        })
        .collect()
}

/// Lists the node-wide sections that differ and cannot change live (portals
/// can when `live_portals`).
fn not_applied(old: &Config, new: &Config, live_portals: bool, report: &mut ReloadReport) {
    if old.portals != new.portals && !live_portals {
        report.not_applied.push(
            "portals changed: in an HA pair they need a restart (client-network heartbeats run on them and the partner advertises them)"
                .into(),
        );
    }
    let mut differs = |what: &str, same: bool| {
        if !same {
            report
                .not_applied
                .push(format!("{what} changed: needs a restart"));
        }
    };
    differs("data_dir", old.data_dir == new.data_dir);
    differs("pools", old.pools == new.pools);
    differs("disks", old.disks == new.disks);
    differs("caches", old.caches == new.caches);
    differs("limits", old.limits == new.limits);
    differs("api", old.api == new.api);
    differs("nbd", old.nbd == new.nbd);
    differs("cluster", old.cluster == new.cluster);
    // alert delivery starts once, with the destinations and webhook secret
    // it read then: a removed webhook or a rotated secret needs a restart
    differs("alerts", old.alerts == new.alerts);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn portal(addr: &str, tpgt: u16) -> iscsi::Portal {
        iscsi::Portal {
            addr: addr.parse().unwrap(),
            tpgt,
        }
    }

    fn with_portals(addrs: &[&str]) -> Config {
        let mut s = "data_dir = \"/nonexistent\"\ntarget = []\n".to_string();
        for a in addrs {
            s += &format!("[[portal]]\naddress = \"{a}\"\n");
        }
        toml::from_str(&s).unwrap()
    }

    /// A credential file rewritten in place (same setting, same path: the
    /// sections compare equal) is named as needing a restart; an untouched
    /// one is not. Before, `freesan reload` answered "no changes" to a
    /// replaced NBD client CA while the old one kept admitting its clients.
    #[test]
    fn a_credential_file_changed_in_place_is_named_as_needing_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().display();
        let cfg: Config = toml::from_str(&format!(
            "data_dir = \"/nonexistent\"\ntarget = []\nportal = []\n[nbd]\naddress = \"127.0.0.1:0\"\n\
             tls_client_ca = \"{d}/ca.pem\"\ntls_psk_file = \"{d}/psk\"\n"
        ))
        .unwrap();
        std::fs::write(dir.path().join("ca.pem"), "authority A").unwrap();
        std::fs::write(dir.path().join("psk"), "alice:00112233").unwrap();
        let started = credential_files(&cfg);
        assert_eq!(started.len(), 2);
        let mut report = ReloadReport::default();
        credentials_changed(&started, &credential_files(&cfg), &mut report);
        assert_eq!(report, ReloadReport::default(), "nothing changed");

        std::fs::write(dir.path().join("ca.pem"), "authority B").unwrap();
        credentials_changed(&started, &credential_files(&cfg), &mut report);
        assert_eq!(report.not_applied.len(), 1, "{report:?}");
        assert!(report.not_applied[0].starts_with("[nbd] tls_client_ca "));
        assert!(report.not_applied[0].contains("ca.pem"));
        // a file gone is a change too
        std::fs::remove_file(dir.path().join("psk")).unwrap();
        let mut report = ReloadReport::default();
        credentials_changed(&started, &credential_files(&cfg), &mut report);
        assert_eq!(report.not_applied.len(), 2, "{report:?}");
    }

    #[test]
    fn portals_that_stay_keep_their_tpgt_and_new_ones_take_a_free_one() {
        let old = [
            portal("127.0.0.1:3260", 1),
            portal("127.0.0.2:3260", 2),
            portal("127.0.0.3:3260", 3),
        ];
        // .2 removed, .4 added, .3 moved first: .3 keeps 3, .4 takes 4 (not
        // 2, which the removed portal's sessions still carry)
        let got = assign_tpgts(
            &old,
            &with_portals(&["127.0.0.3:3260", "127.0.0.1:3260", "127.0.0.4:3260"]),
        );
        assert_eq!(
            got,
            [
                portal("127.0.0.3:3260", 3),
                portal("127.0.0.1:3260", 1),
                portal("127.0.0.4:3260", 4)
            ]
        );
        // once .2 is gone, its TPGT is free again
        let got = assign_tpgts(
            &got,
            &with_portals(&[
                "127.0.0.3:3260",
                "127.0.0.1:3260",
                "127.0.0.4:3260",
                "127.0.0.5:3260",
            ]),
        );
        assert_eq!(got[3], portal("127.0.0.5:3260", 2));
    }
}
