//! Disks and RAID pools of the configuration: opens (or creates) every `[[disk]]`,
//! assembles (or, on blank disks, creates) every `[[pool]]` over them, hands pool
//! volumes to the LUNs that name them, and carries out the management API's pool
//! actions.

use crate::config::{Config, DiskConfig};
use anyhow::{bail, Context, Result};
use block::VolumeRef;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

/// The pools of a running node, by name, and the disks not (yet) in any pool.
#[derive(Default)]
pub struct Pools {
    pools: BTreeMap<String, Arc<raid::Pool>>,
    /// Configured disks that no pool uses, available as spares and replacements.
    free_disks: parking_lot::Mutex<BTreeMap<String, VolumeRef>>,
}

fn raid_level(s: &str) -> Result<raid::RaidLevel> {
    Ok(match s.to_ascii_lowercase().as_str() {
        "raid0" => raid::RaidLevel::Raid0,
        "raid1" => raid::RaidLevel::Raid1,
        "raid5" => raid::RaidLevel::Raid5,
        "raid6" => raid::RaidLevel::Raid6,
        "raid10" => raid::RaidLevel::Raid10,
        "raidf1" | "f1" => raid::RaidLevel::F1,
        other => bail!("unknown RAID level {other:?} (raid0, raid1, raid5, raid6, raid10, raidf1)"),
    })
}

/// Opens a configured disk: the file or device, or a simulated disk over its data file.
fn open_disk(cfg: &Config, d: &DiskConfig) -> Result<VolumeRef> {
    let store = if d.memory {
        let size = d
            .size
            .as_deref()
            .and_then(disk::parse_size)
            .with_context(|| format!("disk {}: memory = true needs a size", d.name))?;
        let bs = disk::FileOptions::default().block_size_bytes;
        Arc::new(block::MemVolume::new_thick(bs, size / bs as u64)) as VolumeRef
    } else {
        open_disk_file(cfg, d)?
    };
    match &d.sim {
        None => Ok(store),
        Some(sim) => {
            let s = disk::SimDisk::from_config(store, sim)
                .map_err(|e| anyhow::anyhow!("disk {}: {e}", d.name))?;
            Ok(Arc::new(s))
        }
    }
}

fn open_disk_file(cfg: &Config, d: &DiskConfig) -> Result<VolumeRef> {
    let path: PathBuf = match &d.path {
        Some(p) => p.clone(),
        None => cfg.data_dir.join("disks").join(format!("{}.img", d.name)),
    };
    if let Some(parent) = path.parent() {
        if !path.exists() && !parent.as_os_str().is_empty() {
            std::fs::create_dir_all(parent)
                .with_context(|| format!("creating {}", parent.display()))?;
        }
    }
    let opts = disk::FileOptions {
        create_size_bytes: d.size.as_deref().and_then(disk::parse_size),
        ..disk::FileOptions::default()
    };
    let file = disk::FileVolume::open(&path, &opts)
        .with_context(|| format!("disk {}: opening {}", d.name, path.display()))?;
    Ok(Arc::new(file))
}

impl Pools {
    /// Opens every disk and pool of `cfg`: a pool whose disks carry no superblock
    /// is created (fast: parity is made consistent in the background); otherwise it
    /// is assembled from whatever members carry one (in any order).
    pub async fn open(cfg: &Config) -> Result<Pools> {
        let mut disks = BTreeMap::new();
        for d in &cfg.disks {
            disks.insert(d.name.clone(), open_disk(cfg, d)?);
        }
        let mut pools = BTreeMap::new();
        for p in &cfg.pools {
            let mut take = |names: &[String]| -> Vec<raid::Member> {
                names
                    .iter()
                    .filter_map(|n| disks.remove(n).map(|v| raid::Member::new(n.clone(), v)))
                    .collect()
            };
            let members = take(&p.members);
            let spares = take(&p.spares);
            let mut formatted = false;
            for m in members.iter().chain(spares.iter()) {
                formatted |= raid::has_superblock(&m.volume).await;
            }
            let pool = if formatted {
                let mut all = members;
                all.extend(spares);
                raid::Pool::assemble(all, p.force_assemble)
                    .await
                    .with_context(|| format!("pool {}: assembling", p.name))?
            } else {
                let mut pc = raid::PoolConfig::new(p.name.clone(), raid_level(&p.level)?);
                if let Some(c) = &p.chunk {
                    pc.chunk_bytes = disk::parse_size(c)
                        .and_then(|c| u32::try_from(c).ok())
                        .with_context(|| format!("pool {}: chunk {c}", p.name))?;
                }
                if let Some(r) = p.rebuild_rate_mb_s {
                    pc.rebuild_rate_mb_s = r;
                }
                tracing::info!(pool = %p.name, level = %p.level, "creating pool on blank disks");
                raid::Pool::create(pc, members, spares)
                    .await
                    .with_context(|| format!("pool {}: creating", p.name))?
            };
            if let Some(r) = p.rebuild_rate_mb_s {
                pool.set_rebuild_rate_mb_s(r)
                    .await
                    .with_context(|| format!("pool {}: rebuild rate", p.name))?;
            }
            let st = pool.status();
            tracing::info!(pool = %p.name, state = ?st.state, "pool ready");
            pools.insert(p.name.clone(), Arc::new(pool));
        }
        Ok(Pools {
            pools,
            free_disks: parking_lot::Mutex::new(disks),
        })
    }

    /// The volume of pool `name`.
    pub fn volume(&self, name: &str) -> Result<VolumeRef> {
        match self.pools.get(name) {
            Some(p) => Ok(p.clone() as VolumeRef),
            None => bail!("no pool named {name:?} is configured"),
        }
    }

    /// Takes configured disk `name` for a LUN of its own (it is no longer free).
    pub fn take_disk_volume(&self, name: &str) -> Result<VolumeRef> {
        match self.free_disks.lock().remove(name) {
            Some(v) => Ok(v),
            None => bail!("disk {name:?} is not configured or already in use"),
        }
    }

    /// Status of every pool.
    pub fn statuses(&self) -> Vec<serde_json::Value> {
        self.pools.keys().filter_map(|n| self.status(n)).collect()
    }

    /// Status of pool `name`, with the disks still free for spares and replacements.
    pub fn status(&self, name: &str) -> Option<serde_json::Value> {
        let p = self.pools.get(name)?;
        let mut v = serde_json::to_value(p.status()).ok()?;
        v["free_disks"] = serde_json::json!(self.free_disks.lock().keys().collect::<Vec<_>>());
        Some(v)
    }

    fn take_disk(&self, disk: &str) -> Result<raid::Member, api::ApiError> {
        match self.free_disks.lock().remove(disk) {
            Some(v) => Ok(raid::Member::new(disk.to_string(), v)),
            None => Err(api::ApiError::BadRequest(format!(
                "no free disk named {disk:?} (it must be a [[disk]] of the config that no pool uses)"
            ))),
        }
    }

    /// Carries out an administrative action on pool `name`.
    pub async fn act(
        &self,
        name: &str,
        action: api::PoolAction,
    ) -> Result<serde_json::Value, api::ApiError> {
        let pool = self
            .pools
            .get(name)
            .ok_or_else(|| api::ApiError::NotFound(format!("no pool named {name:?}")))?;
        let refused = |e: raid::RaidError| api::ApiError::Conflict(e.to_string());
        match action {
            api::PoolAction::Scrub => {
                let task = pool.scrub();
                let pname = name.to_string();
                tokio::spawn(async move {
                    match task.await {
                        Ok(Ok(r)) => tracing::info!(pool = %pname, report = ?r, "scrub finished"),
                        Ok(Err(e)) => tracing::warn!(pool = %pname, error = %e, "scrub failed"),
                        Err(e) => tracing::warn!(pool = %pname, error = %e, "scrub task died"),
                    }
                });
            }
            api::PoolAction::AddSpare { disk } => {
                let m = self.take_disk(&disk)?;
                pool.add_spare(m).await.map_err(refused)?;
            }
            api::PoolAction::Replace { position, disk } => {
                let m = self.take_disk(&disk)?;
                pool.replace_member(position, m).await.map_err(refused)?;
            }
            api::PoolAction::Fail { position } => {
                pool.fail_member(position).await.map_err(refused)?;
            }
            api::PoolAction::SetRebuildRate { mb_s } => {
                pool.set_rebuild_rate_mb_s(mb_s).await.map_err(refused)?;
                tracing::info!(pool = %name, rebuild_rate_mb_s = mb_s, "rebuild rate set");
            }
        }
        self.status(name)
            .ok_or_else(|| api::ApiError::NotFound(format!("no pool named {name:?}")))
    }

    /// Stops background work and persists every pool's state (clean shutdown).
    pub async fn shutdown(&self) {
        for (name, p) in &self.pools {
            if let Err(e) = p.shutdown().await {
                tracing::warn!(pool = %name, error = %e, "pool shutdown");
            }
        }
    }
}

/// The node as the management API sees it.
pub struct NodeControl {
    /// Pools of the node.
    pub pools: Arc<Pools>,
    /// Static description of the node (version, portals, targets, LUNs).
    pub summary: serde_json::Value,
}

#[async_trait::async_trait]
impl api::Control for NodeControl {
    fn status(&self) -> serde_json::Value {
        let mut s = self.summary.clone();
        s["pools"] = serde_json::Value::Array(self.pools.statuses());
        s
    }

    fn pools(&self) -> Vec<serde_json::Value> {
        self.pools.statuses()
    }

    fn pool(&self, name: &str) -> Option<serde_json::Value> {
        self.pools.status(name)
    }

    async fn pool_action(
        &self,
        name: &str,
        action: api::PoolAction,
    ) -> Result<serde_json::Value, api::ApiError> {
        self.pools.act(name, action).await
    }
}
