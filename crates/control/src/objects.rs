//! Creating disks, pools and LUNs while the node serves (the management API's
//! `POST /api/v1/disks`, `/pools`, `/luns`; `freesan disk|pool|lun create`).
//!
//! Every new object is checked against the whole configuration as it would be
//! at the next start (the running configuration plus the object, through
//! [`Config::validate`]), brought up, and only then recorded in
//! `DATA_DIR/managed.toml` (see [`crate::managed`]), so what the node runs and what
//! it will start with again stay the same. Creations are serialised.

use crate::cluster::Cluster;
use crate::config::{Config, DiskConfig, HostGroupConfig, LunConfig, PoolConfig};
use crate::managed::Managed;
use crate::pools::Pools;
use api::ApiError;
use serde::Deserialize;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

/// How long a change asked for through the API waits for another one to end
/// ([`Objects::op_lock`]).
const OP_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// The running configuration and the objects created at run time.
struct State {
    cfg: Config,
    managed: Managed,
}

/// Run-time creation of disks, pools and LUNs.
pub struct Objects {
    data_dir: PathBuf,
    state: parking_lot::Mutex<State>,
    /// Serialises creations and deletions.
    op: tokio::sync::Mutex<()>,
    /// The SCSI targets by name: those of the start, then those a reload added
    /// ([`Objects::adopt_reload`]).
    targets: parking_lot::RwLock<HashMap<String, Arc<scsi::ScsiTarget>>>,
    /// The NBD server's exports, when the node serves NBD: they follow LUNs.
    nbd: Option<nbd::NbdExports>,
}

/// `POST /api/v1/luns`: a LUN of `target`, described as in the config file.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LunRequest {
    target: String,
    lun: LunConfig,
}

/// `POST /api/v1/luns/delete`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LunRef {
    target: String,
    lun: u64,
}

/// `POST /api/v1/luns/resize`: grow LUN `lun` of `target` to `size`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LunResize {
    target: String,
    lun: u64,
    size: String,
    /// Shrink (cutting data off) a LUN no initiator sees.
    #[serde(default)]
    force: bool,
}

/// `POST /api/v1/host-groups`: a host group of `target` (replaces one of its name).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct HostGroupRequest {
    target: String,
    group: HostGroupConfig,
}

/// `POST /api/v1/host-groups/delete`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct HostGroupRef {
    target: String,
    name: String,
}

fn bad(e: impl std::fmt::Display) -> ApiError {
    ApiError::BadRequest(e.to_string())
}

fn conflict(e: anyhow::Error) -> ApiError {
    ApiError::Conflict(format!("{e:#}"))
}

/// `p` made absolute against the node's working folder (not resolved: a
/// `/dev/disk/by-id` link must stay the stable name it is).
fn absolute(p: std::path::PathBuf) -> Result<std::path::PathBuf, ApiError> {
    std::path::absolute(&p).map_err(|e| bad(format!("{}: {e}", p.display())))
}

fn parse<T: serde::de::DeserializeOwned>(body: Value) -> Result<T, ApiError> {
    serde_json::from_value(body).map_err(bad)
}

impl Objects {
    /// Run-time objects of a node started with `cfg` (the config file merged with
    /// `managed.toml`) serving `targets`.
    pub fn new(
        cfg: &Config,
        targets: HashMap<String, Arc<scsi::ScsiTarget>>,
    ) -> anyhow::Result<Objects> {
        Ok(Objects {
            data_dir: cfg.data_dir.clone(),
            state: parking_lot::Mutex::new(State {
                cfg: cfg.clone(),
                managed: Managed::load(&cfg.data_dir)?,
            }),
            op: tokio::sync::Mutex::new(()),
            targets: parking_lot::RwLock::new(targets),
            nbd: None,
        })
    }

    /// Target `iqn` as the node runs it now (config file and `managed.toml`).
    pub fn target_config(&self, iqn: &str) -> Option<crate::config::TargetConfig> {
        self.state
            .lock()
            .cfg
            .targets
            .iter()
            .find(|t| t.iqn == iqn)
            .cloned()
    }

    /// The SCSI targets by name now (for metrics, status).
    pub fn targets(&self) -> HashMap<String, Arc<scsi::ScsiTarget>> {
        self.targets.read().clone()
    }

    /// Takes in what a configuration reload applied: `running` (the
    /// configuration in effect now) gives the targets' access settings, the
    /// portals and discovery CHAP that later changes are checked against (the
    /// LUNs of targets it knew stay its own, as it created or deleted them), and
    /// the targets `added` (name, SCSI device, their LUNs' NBD exports) become
    /// manageable (`freesan lun`), listed in status and metrics, and served over
    /// NBD.
    pub(crate) fn adopt_reload(
        &self,
        running: &Config,
        added: Vec<(String, Arc<scsi::ScsiTarget>, Vec<nbd::NbdExport>)>,
    ) {
        {
            let mut st = self.state.lock();
            st.cfg.portals = running.portals.clone();
            st.cfg.discovery_chap = running.discovery_chap.clone();
            for t in &running.targets {
                match st.cfg.targets.iter_mut().find(|o| o.iqn == t.iqn) {
                    Some(o) => {
                        let luns = std::mem::take(&mut o.luns);
                        *o = t.clone();
                        o.luns = luns;
                    }
                    None => st.cfg.targets.push(t.clone()),
                }
            }
        }
        for (iqn, scsi, exports) in added {
            if let Some(n) = &self.nbd {
                for e in exports {
                    if let Err(err) = n.add(e) {
                        tracing::warn!(target = %iqn, error = %err, "LUN of an added target not served over NBD");
                    }
                }
            }
            self.targets.write().insert(iqn, scsi);
        }
    }

    /// The NBD server's exports, when the node serves NBD (for metrics).
    pub fn nbd(&self) -> Option<&nbd::NbdExports> {
        self.nbd.as_ref()
    }

    /// LUNs created and deleted from now on are added to and removed from `nbd`.
    pub fn with_nbd(mut self, nbd: Option<nbd::NbdExports>) -> Objects {
        self.nbd = nbd;
        self
    }

    /// True when `iqn` is the first target (its LUNs are also NBD's `lunN`).
    fn first_target(cfg: &Config, iqn: &str) -> bool {
        cfg.targets.first().is_some_and(|t| t.iqn == iqn)
    }

    fn target(&self, iqn: &str) -> Result<Arc<scsi::ScsiTarget>, ApiError> {
        self.targets
            .read()
            .get(iqn)
            .cloned()
            .ok_or_else(|| ApiError::NotFound(format!("no target named {iqn}")))
    }

    /// Checks `next` as a whole configuration, as the next start will.
    fn check(next: &Config, managed: &Managed) -> Result<(), ApiError> {
        next.validate().map_err(|e| bad(format!("{e:#}")))?;
        // What is applied must be recordable in managed.toml: TOML has no
        // integer at or above 2^63, so such a number, applied first, made the
        // save fail after the change ran (a host group mapping LUN 2^63 in
        // force but in no file and no listing; review of 2026-12-06).
        toml::to_string(managed).map_err(|e| {
            bad(format!(
                "the change cannot be recorded ({e}): numbers must be below 2^63"
            ))
        })?;
        Ok(())
    }

    /// The running configuration and the run-time objects (copies).
    pub(crate) fn snapshot(&self) -> (Config, Managed) {
        let st = self.state.lock();
        (st.cfg.clone(), st.managed.clone())
    }

    /// Records the new state in `managed.toml` and makes it the running one.
    fn commit(&self, cfg: Config, managed: Managed) -> Result<(), ApiError> {
        managed
            .save(&self.data_dir)
            .map_err(|e| ApiError::Internal(format!("{e:#}")))?;
        *self.state.lock() = State { cfg, managed };
        Ok(())
    }

    /// The lock serialising creations and deletions, for a reload of the
    /// configuration: waited for as long as the change holding it runs.
    pub(crate) async fn hold_changes(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.op.lock().await
    }

    /// The lock serialising creations and deletions, for a change the API
    /// asked for: waited for at most [`OP_WAIT`], since every change waiting
    /// holds one of the API's change slots (a LUN growing over a pool zeroes
    /// its new space under it, which can take long); then 409.
    async fn op_lock(&self) -> Result<tokio::sync::MutexGuard<'_, ()>, ApiError> {
        tokio::time::timeout(OP_WAIT, self.op.lock())
            .await
            .map_err(|_| {
                ApiError::Conflict(
                    "another change of disks, pools, LUNs or host groups is still running \
                     (a LUN growing over a pool zeroes its new space first); try again once \
                     it has ended"
                        .into(),
                )
            })
    }

    /// Creates a disk (a file, by default in `DATA_DIR/disks`, or a simulated
    /// disk); it joins the free disks.
    pub async fn create_disk(&self, pools: &Pools, body: Value) -> Result<Value, ApiError> {
        let mut d: DiskConfig = parse(body)?;
        // kept absolute: a relative one would name another file from another
        // working folder at the next start
        d.path = d.path.map(absolute).transpose()?;
        if d.path.is_none() && d.sim.is_none() {
            if d.size.is_none() {
                return Err(bad(format!(
                    "disk {}: give a size for a new file, or a path",
                    d.name
                )));
            }
            d.path = Some(crate::pools::default_disk_path(&self.data_dir, &d.name));
        }
        let _op = self.op_lock().await?;
        let (mut cfg, mut managed) = self.snapshot();
        crate::allowed::check_disk(&crate::allowed::Allowed::new(&cfg), &cfg, &mut d)?;
        cfg.disks.push(d.clone());
        managed.disks.push(d.clone());
        Self::check(&cfg, &managed)?;
        pools.add_disk(&cfg, &d).map_err(conflict)?;
        self.commit(cfg, managed)?;
        tracing::info!(disk = %d.name, "disk created");
        Ok(json!({ "name": d.name, "free_disks": pools.free_disk_names() }))
    }

    /// Takes a disk that stopped answering back, now that it answers again
    /// (`{"name"}`): it joins the free disks, to be given back to its pool
    /// (`pool replace`, `add-spare`: rebuilt onto) or used otherwise.
    /// Refused while it has not failed, while the device has not answered
    /// every request sent to it before, and while something still serves
    /// from it (a LUN or cache directly, a cache's device not yet replaced,
    /// a pool's spare or journal device, a pool member the pool has not
    /// failed).
    pub async fn reopen_disk(&self, pools: &Pools, body: Value) -> Result<Value, ApiError> {
        #[derive(serde::Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Req {
            name: String,
        }
        let Req { name } = parse(body)?;
        let _op = self.op_lock().await?;
        let listed = self.disks(pools).await;
        let Some(d) = listed.iter().find(|d| d["name"] == name.as_str()) else {
            return Err(ApiError::NotFound(format!("no disk named {name:?}")));
        };
        if d["stopped_answering"].is_null() {
            return Err(ApiError::Conflict(format!(
                "disk {name} has not failed: there is nothing to take back"
            )));
        }
        let statuses = pools.statuses();
        if let Some(why) = take_back_refused(d, &statuses) {
            return Err(ApiError::Conflict(format!("disk {name}: {why}")));
        }
        // the failed position it leaves, for the way back into its pool
        let failed_in = statuses.iter().find_map(|p| {
            let m = p["members"]
                .as_array()?
                .iter()
                .find(|m| m["name"] == name.as_str() && m["state"] == "failed")?;
            Some(json!({ "pool": p["name"], "position": m["position"] }))
        });
        pools.reinstate_disk(&name).map_err(conflict)?;
        tracing::warn!(disk = %name, "disk that stopped answering taken back: it is free");
        Ok(json!({
            "name": name,
            "free_disks": pools.free_disk_names(),
            "failed_in": failed_in,
        }))
    }

    /// Creates a pool on free blank disks; usable at once.
    pub async fn create_pool(&self, pools: &Pools, body: Value) -> Result<Value, ApiError> {
        let p: PoolConfig = parse(body)?;
        if p.force_assemble {
            return Err(bad("force_assemble is for assembling, not creating"));
        }
        let _op = self.op_lock().await?;
        let (mut cfg, mut managed) = self.snapshot();
        cfg.pools.push(p.clone());
        managed.pools.push(p.clone());
        Self::check(&cfg, &managed)?;
        pools.create_pool(&p).await.map_err(conflict)?;
        self.commit(cfg, managed)?;
        tracing::info!(pool = %p.name, level = %p.level, "pool created");
        pools
            .status(&p.name)
            .ok_or_else(|| ApiError::Internal("pool vanished".into()))
    }

    /// Adds a LUN to a configured target while it serves; a replicated one starts
    /// replicating with the partner node (create it on both nodes).
    pub async fn create_lun(
        &self,
        pools: &Pools,
        cluster: Option<&Cluster>,
        body: Value,
    ) -> Result<Value, ApiError> {
        let LunRequest { target, mut lun } = parse(body)?;
        lun.path = lun.path.map(absolute).transpose()?;
        let scsi_target = self.target(&target)?;
        let _op = self.op_lock().await?;
        let (mut cfg, mut managed) = self.snapshot();
        let id = lun.id.unwrap_or_else(|| {
            (0..)
                .find(|i| !scsi_target.lun_ids().contains(i))
                .unwrap_or(0)
        });
        lun.id = Some(id);
        crate::allowed::check_lun(&crate::allowed::Allowed::new(&cfg), &cfg, &mut lun)?;
        if scsi_target.lun_ids().contains(&id) {
            return Err(ApiError::Conflict(format!(
                "target {target} has a LUN {id} already"
            )));
        }
        match cfg.targets.iter_mut().find(|t| t.iqn == target) {
            Some(t) => t.luns.push(lun.clone()),
            None => return Err(ApiError::NotFound(format!("no target named {target}"))),
        }
        managed.add_lun(&target, lun.clone());
        Self::check(&cfg, &managed)?;
        let built = crate::lun::open_lun(&self.data_dir, pools, cluster, &target, &lun, id)
            .map_err(|e| {
                if let Some(d) = &lun.disk {
                    pools.release_lun_disk(d);
                }
                conflict(e)
            })?;
        let pr = built.replicated.as_ref().map(|r| {
            crate::ha_scsi::PrLink::new(id, r.clone(), &scsi_target) as Arc<dyn scsi::PrReplication>
        });
        let size_bytes = built.volume.geometry().size_bytes();
        let mut nbd_exports = crate::lun::nbd_exports(
            Self::first_target(&cfg, &target),
            &target,
            id,
            &built,
            lun.read_only,
        );
        for e in &mut nbd_exports {
            e.access = Some(Arc::new(crate::lun::LunAccess::new(
                scsi_target.clone(),
                id,
            )));
        }
        if let Err(e) = scsi_target.add_lun(id, built.scsi, built.volume, pr) {
            if let (Some(r), Some(c)) = (&built.replicated, cluster) {
                c.forget(r.name()).await;
            }
            if let Some(d) = &lun.disk {
                pools.release_lun_disk(d);
            }
            return Err(ApiError::Conflict(e.to_string()));
        }
        if lun.thin_threshold_percent.is_some() {
            scsi_target.set_thin_threshold(id, lun.thin_threshold_percent);
        }
        if let (Some(r), Some(c)) = (&built.replicated, cluster) {
            c.drive_alua(&scsi_target, id, r.clone());
        }
        if let Some(n) = &self.nbd {
            for e in nbd_exports {
                if let Err(err) = n.add(e) {
                    tracing::warn!(%target, lun = id, error = %err, "LUN not served over NBD");
                }
            }
        }
        self.commit(cfg, managed)?;
        tracing::info!(%target, lun = id, backing = %built.backing, "LUN created");
        Ok(json!({
            "target": target,
            "lun": id,
            "backing": built.backing,
            "size_bytes": size_bytes,
            "replicated": built.replicated.is_some(),
        }))
    }

    /// Deletes a LUN created at run time (those of the config file are removed
    /// there): initiators see it go (REPORTED LUNS DATA HAS CHANGED), its data is
    /// flushed and left on its backing, a disk it served becomes free, and its
    /// identity and reservations are forgotten (a new LUN with its number is a new
    /// device). A replicated LUN stops replicating on this node.
    pub async fn delete_lun(
        &self,
        pools: &Pools,
        cluster: Option<&Cluster>,
        body: Value,
    ) -> Result<Value, ApiError> {
        let LunRef { target, lun: id } = parse(body)?;
        let scsi_target = self.target(&target)?;
        let _op = self.op_lock().await?;
        let (mut cfg, mut managed) = self.snapshot();
        if !managed.has_lun(&target, id) {
            return Err(if scsi_target.lun_ids().contains(&id) {
                ApiError::Conflict(format!(
                    "LUN {id} of {target} is in the config file: remove it there"
                ))
            } else {
                ApiError::NotFound(format!("target {target} has no LUN {id}"))
            });
        }
        let lun = cfg
            .targets
            .iter()
            .find(|t| t.iqn == target)
            .and_then(|t| t.luns.iter().find(|l| l.id == Some(id)))
            .cloned();
        // NBD first: once its exports are gone no NBD write is in flight, and
        // the SCSI removal's flush covers every write NBD acknowledged.
        if let Some(n) = &self.nbd {
            n.remove(&format!("{target}/lun{id}")).await;
            if Self::first_target(&cfg, &target) {
                n.remove(&format!("lun{id}")).await;
            }
        }
        scsi_target.remove_lun(id).await;
        if let (Some(l), Some(c)) = (&lun, cluster) {
            if l.replicated {
                let name = c.volume_name(&target, id);
                c.forget(&name).await;
                let _ = std::fs::remove_dir_all(c.state_dir(&name));
            }
        }
        if let Some(d) = lun.as_ref().and_then(|l| l.disk.as_ref()) {
            pools.release_lun_disk(d);
        }
        let tdir = crate::identity::target_dir(&self.data_dir, &target);
        for f in [
            format!("lun{id}.identity.json"),
            format!("lun{id}.pr.json"),
            format!("lun{id}.alua.json"),
            format!("lun{id}.atomic"),
            format!("lun{id}.sanitize.json"),
            // a copy's restart records: a LUN made later with this number
            // would run them onto itself at its first start (found by review
            // of 2026-12-06)
            format!("lun{id}.copy.slots"),
            format!("lun{id}.copy.json"),
        ] {
            let _ = std::fs::remove_file(tdir.join(f));
        }
        for t in &mut cfg.targets {
            if t.iqn == target {
                t.luns.retain(|l| l.id != Some(id));
            }
        }
        managed.remove_lun(&target, id);
        self.commit(cfg, managed)?;
        tracing::info!(%target, lun = id, "LUN deleted");
        Ok(json!({ "target": target, "lun": id, "deleted": true }))
    }

    /// Grows a LUN while it serves (its volume grows: a file, a disk, a cache over
    /// its backing, a pool, both copies of a replicated LUN): initiators get
    /// CAPACITY DATA HAS CHANGED with their next command. Smaller sizes are refused.
    pub async fn resize_lun(&self, body: Value) -> Result<Value, ApiError> {
        let LunResize {
            target,
            lun,
            size,
            force,
        } = parse(body)?;
        let bytes = disk::parse_size(&size)
            .ok_or_else(|| bad(format!("size {size:?}: expected e.g. 4G, 512M, 16GiB")))?;
        // the checks below (the LUN, its size, whether it is mapped) under
        // the changes' lock: read before it, a host group mapping the LUN or
        // its delete could come between them and the resize (review of
        // 2026-12-06)
        let _op = self.op_lock().await?;
        let t = self.target(&target)?;
        let vol = t
            .lun_volume(lun)
            .ok_or_else(|| ApiError::NotFound(format!("target {target} has no LUN {lun}")))?;
        let g = vol.geometry();
        let bs = u64::from(g.block_size_bytes);
        if bytes % bs != 0 {
            return Err(bad(format!(
                "{bytes} bytes is not a whole number of {bs}-byte blocks"
            )));
        }
        let blocks = bytes / bs;
        if blocks < g.block_count {
            if !force {
                return Err(ApiError::Conflict(format!(
                    "LUN {lun} of {target} has {} bytes: shrinking would cut its data off \
                     (--force shrinks a LUN that no host group maps)",
                    g.size_bytes()
                )));
            }
            if t.lun_mapped(lun) {
                return Err(ApiError::Conflict(format!(
                    "LUN {lun} of {target} is visible to initiators: shrinking it needs \
                     host groups that map it to nobody first"
                )));
            }
            t.shrink_lun(lun, blocks).await.map_err(|e| {
                ApiError::Conflict(format!("LUN {lun} of {target} cannot shrink: {e}"))
            })?;
            tracing::warn!(%target, lun, from = g.size_bytes(), to = bytes, "LUN shrunk (forced)");
            return Ok(
                json!({ "target": target, "lun": lun, "size_bytes": bytes, "was_bytes": g.size_bytes(), "shrunk": true }),
            );
        }
        let (cfg, _) = self.snapshot();
        crate::allowed::check_growth(&cfg, &target, lun, g.size_bytes(), bytes)?;
        vol.grow(blocks)
            .await
            .map_err(|e| ApiError::Conflict(format!("LUN {lun} of {target} cannot grow: {e}")))?;
        tracing::info!(%target, lun, from = g.size_bytes(), to = bytes, "LUN grown");
        Ok(
            json!({ "target": target, "lun": lun, "size_bytes": bytes, "was_bytes": g.size_bytes() }),
        )
    }

    /// Applies `cfg`'s host groups of `iqn` to the running target.
    fn apply_host_groups(&self, cfg: &Config, iqn: &str) -> Result<(), ApiError> {
        let groups = cfg
            .targets
            .iter()
            .find(|t| t.iqn == iqn)
            .map(|t| t.host_groups.iter().map(|g| g.to_scsi()).collect())
            .unwrap_or_default();
        self.target(iqn)?
            .set_host_groups(groups)
            .map_err(|e| bad(format!("{e:#}")))
    }

    /// Creates or replaces a host group of a target (LUN masking); its initiators
    /// are told to rescan.
    pub async fn set_host_group(&self, body: Value) -> Result<Value, ApiError> {
        let HostGroupRequest { target, group } = parse(body)?;
        self.target(&target)?;
        let _op = self.op_lock().await?;
        let (mut cfg, mut managed) = self.snapshot();
        let name = group.name.clone();
        let t = cfg
            .targets
            .iter_mut()
            .find(|t| t.iqn == target)
            .ok_or_else(|| ApiError::NotFound(format!("no target named {target}")))?;
        if t.host_groups.iter().any(|g| g.name == name) && !managed.has_host_group(&target, &name) {
            return Err(ApiError::Conflict(format!(
                "host group {name} of {target} is in the config file: change it there"
            )));
        }
        t.host_groups.retain(|g| g.name != name);
        t.host_groups.push(group.clone());
        managed.set_host_group(&target, group);
        Self::check(&cfg, &managed)?;
        self.apply_host_groups(&cfg, &target)?;
        self.commit(cfg, managed)?;
        tracing::info!(%target, group = %name, "host group set");
        Ok(json!({ "target": target, "name": name, "set": true }))
    }

    /// Removes a host group created at run time.
    pub async fn delete_host_group(&self, body: Value) -> Result<Value, ApiError> {
        let HostGroupRef { target, name } = parse(body)?;
        self.target(&target)?;
        let _op = self.op_lock().await?;
        let (mut cfg, mut managed) = self.snapshot();
        if !managed.has_host_group(&target, &name) {
            let in_file = cfg
                .targets
                .iter()
                .any(|t| t.iqn == target && t.host_groups.iter().any(|g| g.name == name));
            return Err(if in_file {
                ApiError::Conflict(format!(
                    "host group {name} of {target} is in the config file: remove it there"
                ))
            } else {
                ApiError::NotFound(format!("target {target} has no host group {name}"))
            });
        }
        for t in &mut cfg.targets {
            if t.iqn == target {
                t.host_groups.retain(|g| g.name != name);
            }
        }
        managed.remove_host_group(&target, &name);
        self.apply_host_groups(&cfg, &target)?;
        self.commit(cfg, managed)?;
        tracing::info!(%target, group = %name, "host group deleted");
        Ok(json!({ "target": target, "name": name, "deleted": true }))
    }

    /// Every host group of every target, as the targets apply them.
    pub fn host_groups_now(&self) -> Vec<Value> {
        let st = self.state.lock();
        let mut out = Vec::new();
        for t in &st.cfg.targets {
            for g in &t.host_groups {
                let luns: Vec<Value> = g
                    .luns
                    .iter()
                    .map(|l| json!({ "lun": l.lun, "as": l.seen_as.unwrap_or(l.lun) }))
                    .collect();
                out.push(json!({
                    "target": t.iqn,
                    "name": g.name,
                    "initiators": g.initiators,
                    "chap_users": g.chap_users,
                    "luns": luns,
                    "runtime": st.managed.has_host_group(&t.iqn, &g.name),
                }));
            }
        }
        out
    }

    /// Records pool `name`'s disks after a run-time change (spare added, member
    /// replaced): the next start assembles it from these.
    pub async fn record_pool_disks(
        &self,
        name: &str,
        members: Vec<String>,
        spares: Vec<String>,
    ) -> Result<(), ApiError> {
        let _op = self.op.lock().await;
        let (mut cfg, mut managed) = self.snapshot();
        if let Some(p) = cfg.pools.iter_mut().find(|p| p.name == name) {
            p.members = members.clone();
            p.spares = spares.clone();
        }
        managed.set_pool_disks(name, members, spares);
        self.commit(cfg, managed)
    }

    /// Records cache `name`'s devices after one was replaced.
    pub async fn record_cache_devices(
        &self,
        name: &str,
        devices: Vec<String>,
    ) -> Result<(), ApiError> {
        let _op = self.op.lock().await;
        let (mut cfg, mut managed) = self.snapshot();
        if let Some(c) = cfg.caches.iter_mut().find(|c| c.name == name) {
            c.devices = devices.clone();
        }
        managed.set_cache_devices(name, devices);
        self.commit(cfg, managed)
    }

    /// Every LUN the node serves now: target, number, size, whether it was
    /// created at run time.
    pub fn targets_now(&self, sessions: &[iscsi::SessionInfo], portals: &[String]) -> Vec<Value> {
        let st = self.state.lock();
        let targets = self.targets();
        let mut out = Vec::new();
        for t in &st.cfg.targets {
            let luns: Vec<Value> = targets.get(&t.iqn).map_or_else(Vec::new, |s| {
                s.lun_ids()
                    .into_iter()
                    .map(|id| {
                        let l = t.lun(id);
                        json!({
                            "lun": id,
                            "size_bytes": s.lun_size_bytes(id),
                            "backing": l.map(describe),
                            "pool": l.and_then(|l| l.pool.clone()),
                            "cache": l.and_then(|l| l.cache.clone()),
                            "replicated": l.is_some_and(|l| l.replicated),
                        })
                    })
                    .collect()
            });
            let sessions: Vec<Value> = sessions
                .iter()
                .filter(|x| !x.discovery && x.target == t.iqn)
                .map(|x| {
                    json!({
                        "initiator": x.initiator,
                        "isid": x.isid,
                        "tsih": x.tsih,
                        "portals": [x.portal],
                        // one connection per session (MaxConnections=1)
                        "connections": 1,
                        "commands_running": x.commands_running,
                        "commands_aborting": x.commands_aborting,
                        "buffered_bytes": x.buffered_bytes,
                    })
                })
                .collect();
            out.push(json!({
                "name": t.iqn,
                "alias": t.alias,
                "portals": portals,
                "luns": luns,
                "chap": t.chap.as_ref().map(|c| json!({
                    "user": c.user,
                    "mutual": t.mutual_chap.is_some(),
                })),
                "chap_initiators": t.chap_initiators.iter().map(|c| c.initiator.clone()).collect::<Vec<_>>(),
                "acl": t.allowed_initiators,
                "sessions": sessions,
            }));
        }
        out
    }

    /// Sets target `iqn`'s CHAP (`Some(None)`: off) and/or its allowed
    /// initiators (empty: any): checked as the next start will see the
    /// configuration, applied live to new logins by `reloader`, then recorded in
    /// `managed.toml`.
    pub async fn set_target_access(
        &self,
        iqn: &str,
        chap: Option<Option<crate::config::Chap>>,
        acl: Option<Vec<String>>,
        reloader: Option<&crate::reload::Reloader>,
    ) -> Result<(), ApiError> {
        let Some(reloader) = reloader else {
            return Err(ApiError::NotFound(
                "this node was started without a way to change its targets live".into(),
            ));
        };
        let _op = self.op_lock().await?;
        let (mut cfg, mut managed) = self.snapshot();
        let Some(t) = cfg.targets.iter_mut().find(|t| t.iqn == iqn) else {
            return Err(ApiError::NotFound(format!("no target named {iqn}")));
        };
        if let Some(c) = &chap {
            t.chap = c.clone();
            managed.set_target_chap(iqn, c.clone());
        }
        if let Some(a) = &acl {
            t.allowed_initiators = a.clone();
            managed.set_target_acl(iqn, a.clone());
        }
        Self::check(&cfg, &managed)?;
        reloader
            .set_target_access(iqn, chap, acl)
            .await
            .map_err(|e| ApiError::Conflict(format!("{e:#}")))?;
        self.commit(cfg, managed)
    }

    pub fn luns_now(&self) -> Vec<Value> {
        let st = self.state.lock();
        let targets = self.targets();
        let mut out = Vec::new();
        for t in &st.cfg.targets {
            let Some(scsi_target) = targets.get(&t.iqn) else {
                continue;
            };
            for id in scsi_target.lun_ids() {
                let l = t.lun(id);
                out.push(json!({
                    "target": t.iqn,
                    "lun": id,
                    "size_bytes": scsi_target.lun_size_bytes(id),
                    "backing": l.map(describe),
                    "replicated": l.is_some_and(|l| l.replicated),
                    "created_at_run_time": st.managed.has_lun(&t.iqn, id),
                }));
            }
        }
        out
    }

    /// Every disk of the running configuration and whether it is free.
    pub async fn disks(&self, pools: &Pools) -> Vec<Value> {
        let st = self.snapshot();
        let free = pools.free_disk_names();
        // where each disk is used: (pool or cache, role, state)
        let mut used: HashMap<String, (Option<String>, &str, String)> = HashMap::new();
        for p in pools.statuses() {
            let pool = p["name"].as_str().map(str::to_string);
            for m in p["members"].as_array().into_iter().flatten() {
                if let Some(n) = m["name"].as_str() {
                    let state = m["state"].as_str().unwrap_or("unknown").to_string();
                    used.insert(n.to_string(), (pool.clone(), "member", state));
                }
            }
            for m in p["spares"].as_array().into_iter().flatten() {
                if let Some(n) = m["name"].as_str() {
                    used.insert(n.to_string(), (pool.clone(), "spare", "spare".into()));
                }
            }
        }
        for p in &st.0.pools {
            for j in p.journal_devices() {
                used.insert(j, (Some(p.name.clone()), "journal", "active".into()));
            }
        }
        for c in &st.0.caches {
            let attached = pools
                .cache_status(&c.name)
                .is_some_and(|s| s["attached"] == Value::Bool(true));
            let state = if attached { "active" } else { "detached" };
            for d in &c.devices {
                used.insert(d.clone(), (None, "cache", state.into()));
            }
            if let Some(d) = &c.disk {
                used.insert(d.clone(), (None, "cache-backing", "active".into()));
            }
        }
        for t in &st.0.targets {
            for l in &t.luns {
                if let Some(d) = &l.disk {
                    used.insert(d.clone(), (None, "lun", "active".into()));
                }
            }
        }
        st.0.disks
            .iter()
            .map(|d| {
                let is_free = free.contains(&d.name);
                let (pool, role, state) = if is_free {
                    (None, "free", "ok".to_string())
                } else {
                    // neither free nor used: a member failed or replaced out
                    // of its pool, which is never handed out again on its own
                    used.get(&d.name)
                        .cloned()
                        .unwrap_or((None, "retired", "retired".into()))
                };
                let (timing, size_bytes) = pools.disk_timing(&d.name).unzip();
                let timing = timing.unwrap_or_default();
                // a disk that stopped answering is failed, whatever holds it
                let state = match &timing.failed {
                    Some(_) if state != "retired" => "failed".to_string(),
                    _ => state,
                };
                json!({
                    "name": d.name,
                    "size": d.size,
                    "size_bytes": size_bytes,
                    "model": disk_model(d),
                    "simulated": d.sim.as_ref().map(|s| match s.model {
                        disk::sim::SimModelConfig::Hdd(_) => "hdd",
                        disk::sim::SimModelConfig::Ssd(_) => "ssd",
                    }),
                    "free": is_free,
                    "pool": pool,
                    "role": role,
                    "state": state,
                    "errors": timing.read_errors + timing.write_errors,
                    "io_timeout_secs": d.io_timeout().map(|t| t.as_secs()),
                    "timeouts": timing.timeouts,
                    "timeouts_waited": timing.held,
                    "waiting_past_timeout": timing.holding,
                    "in_flight": timing.in_flight,
                    "stopped_answering": timing.failed,
                    "reads": timing.reads,
                    "writes": timing.writes,
                    "read_latency_us": (timing.read_latency_us() * 10.0).round() / 10.0,
                    "write_latency_us": (timing.write_latency_us() * 10.0).round() / 10.0,
                    "created_at_run_time": st.1.disks.iter().any(|m| m.name == d.name),
                })
            })
            .collect()
    }
}

/// Why disk `d` (as [`Objects::disks`] lists it; it stopped answering)
/// is not taken back for what it is now, given the pools' statuses: only a
/// free disk, a retired one (a spare or a replacement took its place) or a
/// member its pool has failed is.
fn take_back_refused(d: &Value, pools: &[Value]) -> Option<String> {
    let name = d["name"].as_str().unwrap_or("?");
    let pool = d["pool"].as_str().unwrap_or("?");
    Some(match d["role"].as_str().unwrap_or("") {
        "free" | "retired" => return None,
        "member" => {
            // the pool must have failed it: until then it counts on it
            let failed = pools.iter().any(|p| {
                p["name"] == pool
                    && p["members"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .any(|m| m["name"] == name && m["state"] == "failed")
            });
            if failed {
                return None;
            }
            format!(
                "pool {pool} has not failed it yet (it fails a member at its next request); \
                 try again in a moment"
            )
        }
        "cache" => "a cache's device is taken back once the cache no longer has it: replace \
                    it in the cache first (freesan cache replace)"
            .into(),
        "spare" => format!("a spare of pool {pool} is not taken back"),
        "journal" => format!(
            "a journal device of pool {pool} is not taken back while the node runs (the \
             pool journals on its members since it failed)"
        ),
        role => format!(
            "it is served from directly (as a {role}); its requests fail until the node \
             restarts"
        ),
    })
}

/// What a disk is: a simulated HDD or SSD, memory, a block device's model as
/// the kernel reports it, or a file.
fn disk_model(d: &crate::config::DiskConfig) -> String {
    if let Some(s) = &d.sim {
        return match s.model {
            disk::sim::SimModelConfig::Hdd(_) => "simulated 7200 rpm HDD".into(),
            disk::sim::SimModelConfig::Ssd(_) => "simulated SATA SSD".into(),
        };
    }
    if d.memory {
        return "memory".into();
    }
    let Some(path) = &d.path else {
        return "file".into();
    };
    let is_dev = std::fs::metadata(path).is_ok_and(|m| {
        use std::os::unix::fs::FileTypeExt;
        m.file_type().is_block_device()
    });
    if !is_dev {
        return "file".into();
    }
    let model = std::fs::canonicalize(path).ok().and_then(|p| {
        let name = p.file_name()?.to_string_lossy().into_owned();
        let text = std::fs::read_to_string(format!("/sys/class/block/{name}/device/model")).ok()?;
        Some(text.trim().to_string()).filter(|s| !s.is_empty())
    });
    model.unwrap_or_else(|| "block device".into())
}

/// What backs a LUN, as the config names it.
fn describe(l: &LunConfig) -> String {
    if let Some(p) = &l.pool {
        format!("pool {p}")
    } else if let Some(c) = &l.cache {
        format!("cache {c}")
    } else if let Some(d) = &l.disk {
        format!("disk {d}")
    } else if let Some(p) = &l.path {
        p.display().to_string()
    } else {
        String::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A change whose numbers managed.toml cannot hold (TOML integers end
    /// below 2^63) is refused before it is applied: applied, its save failed
    /// and it ran unrecorded. The configuration's own bounds refuse the
    /// numbers known to reach that far (a host group's target LUN, a sanitize
    /// rate); serializing the objects before they apply is the backstop.
    #[test]
    fn a_change_managed_toml_cannot_record_is_refused_first() {
        let mut cfg = Config::from_quick_flags(&crate::config::QuickFlags::default());
        let iqn = cfg.targets[0].iqn.clone();
        let mut group = crate::config::HostGroupConfig {
            name: "g".into(),
            initiators: vec!["iqn.2026-12.org.example:h".into()],
            chap_users: Vec::new(),
            luns: vec![crate::config::HostGroupLun {
                lun: 0,
                seen_as: Some(5),
            }],
        };
        let mut managed = Managed::default();
        managed.set_host_group(&iqn, group.clone());
        cfg.targets[0].host_groups.push(group.clone());
        Objects::check(&cfg, &managed).unwrap();
        group.luns.push(crate::config::HostGroupLun {
            lun: 1 << 63,
            seen_as: Some(6),
        });
        managed.set_host_group(&iqn, group.clone());
        cfg.targets[0].host_groups[0] = group;
        let r = Objects::check(&cfg, &managed);
        assert!(
            matches!(&r, Err(ApiError::BadRequest(m)) if m.contains("flat addressing")),
            "{r:?}"
        );
        // a LUN's sanitize rate, the same
        cfg.targets[0].host_groups.clear();
        let mut managed = Managed::default();
        let mut lun = cfg.targets[0].luns[0].clone();
        lun.sanitize_rate_mib_s = u64::MAX;
        managed.add_lun(&iqn, lun.clone());
        cfg.targets[0].luns[0] = lun;
        let r = Objects::check(&cfg, &managed);
        assert!(
            matches!(&r, Err(ApiError::BadRequest(m)) if m.contains("sanitize_rate_mib_s")),
            "{r:?}"
        );
    }

    /// A disk that stopped answering is taken back only from where nothing
    /// counts on it: free, retired, or a member its pool has failed; not a
    /// member its pool has not failed yet, a cache's device, a spare, a
    /// journal device, a disk a LUN or cache serves from directly. Each
    /// refusal says what to do.
    #[test]
    fn a_disk_is_taken_back_only_where_nothing_counts_on_it() {
        let disk = |role: &str| json!({ "name": "d1", "pool": "p", "role": role });
        let pool = |state: &str| {
            vec![json!({ "name": "p", "members": [
                { "name": "d0", "state": "active" },
                { "name": "d1", "state": state },
            ] })]
        };
        for role in ["free", "retired"] {
            assert_eq!(take_back_refused(&disk(role), &[]), None, "{role}");
        }
        assert_eq!(take_back_refused(&disk("member"), &pool("failed")), None);
        let refused = |role: &str, pools: &[Value]| {
            take_back_refused(&disk(role), pools).unwrap_or_else(|| panic!("{role} taken back"))
        };
        assert!(refused("member", &pool("active")).contains("has not failed it yet"));
        // failed in another pool of the same member name: not this one
        let other = vec![json!({ "name": "q", "members": [{ "name": "d1", "state": "failed" }] })];
        assert!(refused("member", &other).contains("has not failed it yet"));
        assert!(refused("cache", &[]).contains("freesan cache replace"));
        assert!(refused("spare", &[]).contains("a spare of pool p"));
        assert!(refused("journal", &[]).contains("journal device of pool p"));
        for role in ["lun", "cache-backing"] {
            assert!(
                refused(role, &[]).contains("served from directly"),
                "{role}"
            );
        }
    }

    /// A change that finds another one holding the lock waits for it at most
    /// [`OP_WAIT`], then is answered 409 (each change waiting holds one of
    /// the API's change slots); once the lock is free it goes through. The
    /// clock is the test runtime's, paused and advanced.
    #[tokio::test(start_paused = true)]
    async fn a_change_waits_at_most_ten_seconds_for_another_then_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let text = format!(
            "data_dir = {:?}\n[[portal]]\naddress = \"127.0.0.1:3260\"\n\
             [[target]]\niqn = \"iqn.2026-11.org.freesan:t1\"\n\
             [[target.lun]]\npath = {:?}\nsize = \"1M\"\n",
            dir.path().display().to_string(),
            dir.path().join("l.img").display().to_string()
        );
        let cfg: Config = toml::from_str(&text).unwrap();
        let objects = Arc::new(Objects::new(&cfg, HashMap::new()).unwrap());
        let pools = Arc::new(Pools::open(&cfg).await.unwrap());
        let body = || json!({ "name": "d0", "size": "1M" });
        let held = objects.op.lock().await;
        let started = tokio::time::Instant::now();
        let waiting = {
            let (objects, pools) = (objects.clone(), pools.clone());
            tokio::spawn(async move { objects.create_disk(&pools, body()).await })
        };
        let r = tokio::time::timeout(OP_WAIT * 6, waiting)
            .await
            .expect("the change waited on")
            .unwrap();
        assert!(matches!(r, Err(ApiError::Conflict(_))), "{r:?}");
        let waited = started.elapsed();
        assert!(waited >= OP_WAIT && waited < OP_WAIT * 2, "{waited:?}");
        drop(held);
        objects.create_disk(&pools, body()).await.unwrap();
        assert!(objects.snapshot().0.disks.iter().any(|d| d.name == "d0"));
    }
}
