//! Disks and RAID pools of the configuration: opens (or creates) every `[[disk]]`,
//! assembles (or, on blank disks, creates) every `[[pool]]` over them, hands pool
//! volumes to the LUNs that name them, and carries out the management API's pool
//! actions.

use crate::config::{Config, DiskConfig};
use crate::fronts::{Front, Fronts};
use anyhow::{bail, Context, Result};
use block::VolumeRef;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

/// A configured SSD cache: what it is made of (to attach it again) and, while it
/// is attached, its volume. LUNs serve `front`, which forwards to the cache while
/// attached and to the backing while detached.
pub struct CacheSlot {
    cfg: cache::CacheConfig,
    backing: VolumeRef,
    devices: parking_lot::Mutex<Vec<cache::CacheDevice>>,
    vol: parking_lot::Mutex<Option<Arc<cache::CacheVolume>>>,
    front: Arc<block::SwitchVolume>,
    /// Serialises attach, detach and device replacement.
    op: tokio::sync::Mutex<()>,
    /// The node's record of which cache fronts which volume.
    fronts: Arc<parking_lot::Mutex<Fronts>>,
    /// For that record: the disk's paths, for a cache over a disk.
    disk_paths: Vec<String>,
    /// What it caches, as a LUN on it directly would name it (`pool NAME`, `disk NAME`).
    over: String,
}

impl CacheSlot {
    fn volume(&self) -> Option<Arc<cache::CacheVolume>> {
        self.vol.lock().clone()
    }

    fn check_device(&self, name: &str, device: usize) -> Result<(), api::ApiError> {
        if device >= self.devices.lock().len() {
            return Err(api::ApiError::BadRequest(format!(
                "cache {name} has no device {device}"
            )));
        }
        Ok(())
    }

    fn status(&self, name: &str) -> serde_json::Value {
        match self.volume() {
            Some(v) => {
                let mut s = serde_json::to_value(v.status()).unwrap_or_default();
                s["attached"] = serde_json::Value::Bool(true);
                s
            }
            None => serde_json::json!({
                "name": name,
                "mode": self.cfg.mode.to_string(),
                "state": "detached",
                "attached": false,
                "devices": self.devices.lock().iter().map(|d| serde_json::json!({"name": d.name, "state": "detached"})).collect::<Vec<_>>(),
            }),
        }
    }

    /// Drains the cache's dirty data (writes go through it meanwhile), moves the
    /// LUNs to the backing once their requests in flight are done, and empties it.
    async fn detach(&self, name: &str) -> Result<(), api::ApiError> {
        let conflict = |e: block::BlockError| api::ApiError::Conflict(format!("cache {name}: {e}"));
        let Some(v) = self.volume() else {
            return Err(api::ApiError::Conflict(format!(
                "cache {name} is not attached"
            )));
        };
        if let Err(e) = v.drain().await {
            v.undrain();
            return Err(conflict(e));
        }
        if let Err(e) = self.front.switch(self.backing.clone()).await {
            v.undrain();
            return Err(conflict(e));
        }
        // writes that were in flight through the cache during the first drain
        let done = async {
            v.drain().await?;
            v.detach().await
        };
        if let Err(e) = done.await {
            // keep serving through the cache rather than around dirty data
            let _ = self.front.switch(v.clone() as VolumeRef).await;
            v.undrain();
            return Err(conflict(e));
        }
        *self.vol.lock() = None;
        // destaged and emptied: the volume may be served without it
        if let Err(e) = self.fronts.lock().detached(self.cfg.backing_id) {
            tracing::error!(cache = %name, error = %format!("{e:#}"),
                "the record that the cache no longer fronts its volume could not be written");
        }
        tracing::info!(cache = %name, "cache detached: dirty data destaged, LUNs on the backing");
        Ok(())
    }

    /// Records, durably, that this cache fronts its volume.
    fn front_record(&self, name: &str) -> Result<()> {
        let devices = self.devices.lock().iter().map(|d| d.name.clone()).collect();
        let front = front_of(name, &self.cfg, devices, self.disk_paths.clone());
        self.fronts.lock().fronting(self.cfg.backing_id, front)
    }

    /// Creates the cache afresh on its devices and moves the LUNs onto it.
    async fn attach(&self, name: &str) -> Result<(), api::ApiError> {
        if self.volume().is_some() {
            return Err(api::ApiError::Conflict(format!(
                "cache {name} is already attached"
            )));
        }
        let devices = self.devices.lock().clone();
        // recorded before the cache can hold anything the volume does not
        self.front_record(name)
            .map_err(|e| api::ApiError::Conflict(format!("cache {name}: {e:#}")))?;
        let made = async {
            let v = cache::CacheVolume::create_fresh(
                name,
                self.backing.clone(),
                devices,
                self.cfg.clone(),
            )
            .await
            .map(Arc::new)?;
            if let Err(e) = self.front.switch(v.clone() as VolumeRef).await {
                let _ = v.shutdown().await;
                return Err(e);
            }
            Ok(v)
        };
        let v = match made.await {
            Ok(v) => v,
            Err(e) => {
                // nothing was served through it
                let _ = self.fronts.lock().detached(self.cfg.backing_id);
                return Err(api::ApiError::Conflict(format!("cache {name}: {e}")));
            }
        };
        *self.vol.lock() = Some(v);
        tracing::info!(cache = %name, "cache attached");
        Ok(())
    }
}

/// The pools of a running node, by name, and the disks not (yet) in any pool.
#[derive(Default)]
pub struct Pools {
    /// Pools by name (more are created at run time).
    pools: parking_lot::RwLock<BTreeMap<String, Arc<raid::Pool>>>,
    caches: BTreeMap<String, CacheSlot>,
    /// Configured disks that no pool uses, available as spares and replacements.
    free_disks: parking_lot::Mutex<BTreeMap<String, VolumeRef>>,
    /// Disks a LUN serves directly, back to `free_disks` when the LUN is deleted.
    lun_disks: parking_lot::Mutex<BTreeMap<String, VolumeRef>>,
    /// Every disk opened, by name, with its read and write timing.
    timed: parking_lot::Mutex<BTreeMap<String, Arc<disk::TimedDisk>>>,
    /// Which cache fronts which volume (`DATA_DIR/cache-fronts.toml`).
    fronts: Arc<parking_lot::Mutex<Fronts>>,
}

fn raid_level(s: &str) -> Result<raid::RaidLevel> {
    Ok(match s.to_ascii_lowercase().as_str() {
        "raid0" => raid::RaidLevel::Raid0,
        "raid1" => raid::RaidLevel::Raid1,
        "raid5" => raid::RaidLevel::Raid5,
        "raid6" => raid::RaidLevel::Raid6,
        "raid10" => raid::RaidLevel::Raid10,
        "raid10-far" => raid::RaidLevel::Raid10Far,
        "raidf1" | "f1" => raid::RaidLevel::F1,
        other => bail!(
            "unknown RAID level {other:?} (raid0, raid1, raid5, raid6, raid10, raid10-far, raidf1)"
        ),
    })
}

/// The record of cache `name` (settings `cc`) in front of its volume.
fn front_of(
    name: &str,
    cc: &cache::CacheConfig,
    devices: Vec<String>,
    paths: Vec<String>,
) -> Front {
    Front {
        cache: name.to_string(),
        write_back: cc.mode == cache::CacheMode::WriteBack,
        devices,
        paths,
    }
}

/// `p` as given and resolved (symlinks, `..`: a device's name under
/// /dev/disk/by-id and its kernel name), without repeats.
fn path_forms(p: &std::path::Path) -> Vec<String> {
    let mut v = vec![p.display().to_string()];
    if let Ok(r) = std::fs::canonicalize(p) {
        let r = r.display().to_string();
        if r != v[0] {
            v.push(r);
        }
    }
    v
}

/// The paths of configured disk `name` (none for a disk kept in memory or
/// not configured).
fn disk_paths(cfg: &Config, name: &str) -> Vec<String> {
    match cfg.disks.iter().find(|d| d.name == name) {
        Some(d) if !d.memory => path_forms(&match &d.path {
            Some(p) => p.clone(),
            None => default_disk_path(&cfg.data_dir, &d.name),
        }),
        _ => Vec::new(),
    }
}

/// What identifies a cache's backing volume in its superblocks: a pool's
/// uuid; for a disk, its name in the configuration (a disk carries no
/// identity of its own: one whose path changed under the same name is not
/// told apart, beyond its size).
fn backing_id(c: &crate::config::CacheConfig, pools: &BTreeMap<String, Arc<raid::Pool>>) -> u128 {
    match (&c.pool, &c.disk) {
        (Some(p), _) => pool_id(p, pools),
        (None, Some(d)) => disk_id(d),
        (None, None) => 0,
    }
}

/// The backing id of pool `name`: its uuid.
fn pool_id(name: &str, pools: &BTreeMap<String, Arc<raid::Pool>>) -> u128 {
    match pools.get(name).map(|p| u128::from_str_radix(p.uuid(), 16)) {
        Some(Ok(id)) => id.max(1),
        _ => named_id(&format!("pool:{name}")),
    }
}

/// The backing id of disk `name`: a digest of its name.
fn disk_id(name: &str) -> u128 {
    named_id(&format!("disk:{name}"))
}

fn named_id(named: &str) -> u128 {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(named.as_bytes());
    u128::from_le_bytes(digest[..16].try_into().unwrap_or([1; 16])).max(1)
}

/// The cache layer's settings from a `[[cache]]` section.
fn cache_config(c: &crate::config::CacheConfig) -> Result<cache::CacheConfig> {
    let mut cc = cache::CacheConfig::default();
    if let Some(m) = &c.mode {
        cc.mode = m
            .parse()
            .map_err(|e: String| anyhow::anyhow!("cache {}: {e}", c.name))?;
    }
    let size = |v: &str, what: &str| {
        disk::parse_size(v).with_context(|| format!("cache {}: {what} {v:?}", c.name))
    };
    if let Some(b) = &c.block_size {
        cc.block_bytes = u32::try_from(size(b, "block_size")?)?;
    }
    if let Some(v) = &c.size {
        cc.size_bytes = Some(size(v, "size")?);
    }
    if let Some(v) = &c.sequential_cutoff {
        cc.seq_cutoff_bytes = if v == "0" {
            0
        } else {
            size(v, "sequential_cutoff")?
        };
    }
    if let Some(p) = &c.policy {
        cc.policy = p
            .parse()
            .map_err(|e| anyhow::anyhow!("cache {}: {e}", c.name))?;
    }
    if let Some(a) = &c.admission {
        cc.admission = a
            .parse()
            .map_err(|e| anyhow::anyhow!("cache {}: {e}", c.name))?;
    }
    if let Some(v) = c.dirty_low_percent {
        cc.dirty_low_percent = v;
    }
    if let Some(v) = c.dirty_high_percent {
        cc.dirty_high_percent = v;
    }
    cc.validate()
        .map_err(|e| anyhow::anyhow!("cache {}: {e}", c.name))?;
    Ok(cc)
}

/// Opens a configured disk (see [`open_disk_untimed`]) with its reads and
/// writes timed, and its command timeout (no keeper: given up at it, until
/// what takes it gives it one, [`crate::keep`]).
fn open_disk(cfg: &Config, d: &DiskConfig) -> Result<Arc<disk::TimedDisk>> {
    let v = open_disk_untimed(cfg, d)?;
    Ok(Arc::new(match d.io_timeout() {
        Some(limit) => disk::TimedDisk::with_timeout(v, &d.name, limit),
        None => disk::TimedDisk::new(v),
    }))
}

/// Opens a configured disk: the file or device, or a simulated disk over its data file.
fn open_disk_untimed(cfg: &Config, d: &DiskConfig) -> Result<VolumeRef> {
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

/// Where disk `name` keeps its data when its config gives no path.
pub fn default_disk_path(data_dir: &std::path::Path, name: &str) -> PathBuf {
    data_dir.join("disks").join(format!("{name}.img"))
}

fn open_disk_file(cfg: &Config, d: &DiskConfig) -> Result<VolumeRef> {
    let path: PathBuf = match &d.path {
        Some(p) => p.clone(),
        None => default_disk_path(&cfg.data_dir, &d.name),
    };
    if let Some(parent) = path.parent() {
        if !path.exists() && !parent.as_os_str().is_empty() {
            std::fs::create_dir_all(parent)
                .with_context(|| format!("creating {}", parent.display()))?;
        }
    }
    let opts = disk::FileOptions {
        create_size_bytes: d.size.as_deref().and_then(disk::parse_size),
        // (created through the API: the file its checks approved)
        resolved: d.resolved.clone(),
        ..disk::FileOptions::default()
    };
    let file = disk::FileVolume::open(&path, &opts)
        .with_context(|| format!("disk {}: opening {}", d.name, path.display()))?;
    Ok(Arc::new(file))
}

/// Takes the disks `names` out of `disks` as pool members (names not there are
/// skipped: the pool assembles without them or refuses).
fn take_members(disks: &mut BTreeMap<String, VolumeRef>, names: &[String]) -> Vec<raid::Member> {
    names
        .iter()
        .filter_map(|n| disks.remove(n).map(|v| raid::Member::new(n.clone(), v)))
        .collect()
}

/// Assembles pool `p` from `members` and `spares` when any of them carries a
/// superblock, or creates it on them when all are blank. `new` (a pool created
/// at run time) refuses disks that carry a superblock: they belong to some pool.
async fn open_pool(
    p: &crate::config::PoolConfig,
    members: Vec<raid::Member>,
    spares: Vec<raid::Member>,
    journal: Vec<raid::Member>,
    new: bool,
) -> Result<raid::Pool> {
    // one of a mirrored pair is enough to assemble (the pool then journals
    // unmirrored and logs it; its status lists the one device), and a blank disk
    // configured in place of a lost one joins the pair there (raid's
    // `jdev::adopt`); a pool made now gets every device configured
    let configured = p.journal_devices();
    if !configured.is_empty() && journal.is_empty() {
        bail!(
            "pool {}: journal device {} is not available",
            p.name,
            configured.join(", ")
        );
    }
    let mut formatted = Vec::new();
    let mut unknown = Vec::new();
    for m in members.iter().chain(spares.iter()) {
        match raid::superblock_state(&m.volume).await {
            raid::SuperblockState::Formatted => formatted.push(m.name.clone()),
            raid::SuperblockState::Blank => {}
            raid::SuperblockState::Unknown(why) => unknown.push(format!("{} ({why})", m.name)),
        }
    }
    if new && !formatted.is_empty() {
        bail!(
            "pool {}: disk(s) {} carry a RAID superblock (they belong to a pool); \
             refusing to overwrite them",
            p.name,
            formatted.join(", ")
        );
    }
    // A disk whose superblock cannot be read, or is damaged, may be a
    // member of this very pool: creating the pool over it would write new
    // superblocks, drop the journal's acknowledged records and lay the data
    // out anew. Only disks that are blank make a new pool.
    if formatted.is_empty() && !unknown.is_empty() {
        bail!(
            "pool {}: no member carries a readable RAID superblock, and disk(s) {} \
             may belong to a pool: refusing to create one over them (wipe them \
             to make a new pool)",
            p.name,
            unknown.join(", ")
        );
    }
    let pool = if !formatted.is_empty() {
        let mut all = members;
        all.extend(spares);
        raid::Pool::assemble_with_journal_devices(all, p.force_assemble, journal)
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
        pc.journal_bytes = p.journal_mib.map(|m| m << 20);
        tracing::info!(pool = %p.name, level = %p.level, "creating pool on blank disks");
        if journal.len() < configured.len() {
            bail!(
                "pool {}: creating it needs every journal device ({})",
                p.name,
                configured.join(", ")
            );
        }
        raid::Pool::create_with_journal_devices(pc, members, spares, journal)
            .await
            .with_context(|| format!("pool {}: creating", p.name))?
    };
    // what the members say against what the file says: another level is
    // another pool (disks moved from elsewhere, a swapped cable), and serving
    // it under this pool's name would hand its data to this pool's LUNs
    let st = pool.status();
    let want = raid_level(&p.level)?;
    if st.level != want {
        bail!(
            "pool {}: its disks carry a {:?} pool named {:?}, but [[pool]] says {}: \
             refusing to serve it",
            p.name,
            st.level,
            st.name,
            p.level
        );
    }
    if st.name != p.name {
        tracing::warn!(pool = %p.name, on_disk = %st.name,
            "the pool's disks carry another name (renamed in the configuration?)");
    }
    if let Some(c) = p.chunk.as_deref().and_then(disk::parse_size) {
        if c != u64::from(st.chunk_bytes) {
            tracing::warn!(pool = %p.name, chunk = c, on_disk = st.chunk_bytes,
                "chunk applies when a pool is created: this pool keeps its chunk");
        }
    }
    if let Some(r) = p.rebuild_rate_mb_s {
        pool.set_rebuild_rate_mb_s(r)
            .await
            .with_context(|| format!("pool {}: rebuild rate", p.name))?;
    }
    if let Some(m) = p.journal_mib {
        let has = pool.status().journal_bytes;
        if has != m << 20 {
            tracing::warn!(pool = %p.name, journal_mib = m, journal_bytes = has, "journal_mib applies when a pool is created: this pool keeps its ring");
        }
    }
    pool.set_journal_whole_stripes(p.journal_whole_stripes);
    pool.set_journal_devices_configured(p.journal_devices());
    if let Some(on) = p.data_first {
        pool.set_data_first(on);
    }
    let st = pool.status();
    tracing::info!(pool = %p.name, state = ?st.state, "pool ready");
    Ok(pool)
}

impl Pools {
    /// Opens every disk and pool of `cfg`: a pool whose disks carry no superblock
    /// is created (fast: parity is made consistent in the background); otherwise it
    /// is assembled from whatever members carry one (in any order).
    pub async fn open(cfg: &Config) -> Result<Pools> {
        let mut disks = BTreeMap::new();
        let mut timed = BTreeMap::new();
        for d in &cfg.disks {
            let t = open_disk(cfg, d)?;
            disks.insert(d.name.clone(), t.clone() as VolumeRef);
            timed.insert(d.name.clone(), t);
        }
        let mut pools = BTreeMap::new();
        for p in &cfg.pools {
            let members = take_members(&mut disks, &p.members);
            let spares = take_members(&mut disks, &p.spares);
            let journal = take_members(&mut disks, &p.journal_devices());
            let pool = open_pool(p, members, spares, journal, false).await?;
            pools.insert(p.name.clone(), Arc::new(pool));
        }
        // A pool behind a cache reads first unless told otherwise: the cache's
        // misses are reads, and data-first updates keep the disks' queues deep
        // (measured with bench/cache-vendor, docs/0002-raid.md).
        for c in &cfg.caches {
            let Some(name) = &c.pool else { continue };
            let explicit = cfg
                .pools
                .iter()
                .any(|p| &p.name == name && p.data_first.is_some());
            if let (Some(pool), false) = (pools.get(name), explicit) {
                tracing::info!(pool = %name, cache = %c.name, "pool behind a cache: small writes read before they are journaled (data_first = false)");
                pool.set_data_first(false);
            }
        }
        let fronts = Arc::new(parking_lot::Mutex::new(Fronts::open(&cfg.data_dir)?));
        let mut caches = BTreeMap::new();
        for c in &cfg.caches {
            let backing: VolumeRef = match (&c.pool, &c.disk) {
                (Some(p), None) => match pools.get(p) {
                    Some(pool) => pool.clone() as VolumeRef,
                    None => bail!("cache {}: no pool named {p:?}", c.name),
                },
                (None, Some(d)) => match disks.remove(d) {
                    Some(v) => {
                        // the only copy of what the cache fronts
                        v.keep_with(Arc::new(crate::keep::OnlyCopy));
                        v
                    }
                    None => bail!(
                        "cache {}: disk {d:?} is not configured or already used",
                        c.name
                    ),
                },
                _ => bail!("cache {}: give exactly one of pool and disk", c.name),
            };
            let mut devices = Vec::new();
            for d in &c.devices {
                match disks.remove(d) {
                    Some(v) => devices.push(cache::CacheDevice {
                        name: d.clone(),
                        volume: v,
                    }),
                    None => bail!("cache {}: device {d:?} is not a free [[disk]]", c.name),
                }
            }
            let mut cc = cache_config(c)?;
            cc.backing_id = backing_id(c, &pools);
            let opened = cache::CacheConfig {
                table_stale: fronts.lock().table_stale(cc.backing_id),
                ..cc.clone()
            };
            let vol = cache::CacheVolume::open(&c.name, backing.clone(), devices.clone(), opened)
                .await
                .with_context(|| format!("cache {}: opening", c.name))?;
            let st = vol.status();
            tracing::info!(cache = %c.name, mode = %st.mode, frames = st.frames, cached = st.cached_blocks, dirty = st.dirty_blocks, "cache ready");
            let vol = Arc::new(vol);
            let slot = CacheSlot {
                cfg: cc,
                backing,
                devices: parking_lot::Mutex::new(devices),
                front: Arc::new(block::SwitchVolume::new(vol.clone() as VolumeRef)),
                vol: parking_lot::Mutex::new(Some(vol)),
                op: tokio::sync::Mutex::new(()),
                fronts: fronts.clone(),
                disk_paths: c
                    .disk
                    .as_deref()
                    .map_or_else(Vec::new, |d| disk_paths(cfg, d)),
                over: (c.pool.as_ref().map(|p| format!("pool {p}")))
                    .or_else(|| c.disk.as_ref().map(|d| format!("disk {d}")))
                    .unwrap_or_default(),
            };
            // before anything is served through it
            slot.front_record(&c.name)
                .with_context(|| format!("cache {}", c.name))?;
            if !c.attached {
                // dirty data a crash left is destaged before the LUNs go around it
                slot.detach(&c.name)
                    .await
                    .map_err(|e| anyhow::anyhow!("cache {}: detaching at start: {e:?}", c.name))?;
            }
            caches.insert(c.name.clone(), slot);
        }
        fronts.lock().opened_all()?;
        Ok(Pools {
            pools: parking_lot::RwLock::new(pools),
            caches,
            free_disks: parking_lot::Mutex::new(disks),
            lun_disks: parking_lot::Mutex::new(BTreeMap::new()),
            timed: parking_lot::Mutex::new(timed),
            fronts,
        })
    }

    /// Every open disk's read and write timing, by name.
    pub fn disk_timings(&self) -> Vec<(String, disk::DiskTiming)> {
        self.timed
            .lock()
            .iter()
            .map(|(n, t)| (n.clone(), t.timing()))
            .collect()
    }

    /// Disk `name`'s read and write timing and its size, if it is open.
    pub fn disk_timing(&self, name: &str) -> Option<(disk::DiskTiming, u64)> {
        let t = self.timed.lock().get(name).cloned()?;
        Some((t.timing(), block::Volume::geometry(&*t).size_bytes()))
    }

    /// Opens disk `d` while the node runs (created if it is a new file or a
    /// simulated disk) and adds it to the free disks.
    pub fn add_disk(&self, cfg: &Config, d: &DiskConfig) -> Result<()> {
        if self.free_disks.lock().contains_key(&d.name) {
            bail!("disk {} exists already", d.name);
        }
        let v = open_disk(cfg, d)?;
        self.timed.lock().insert(d.name.clone(), v.clone());
        self.free_disks
            .lock()
            .insert(d.name.clone(), v as VolumeRef);
        Ok(())
    }

    /// Creates pool `p` while the node runs, on free disks that carry no
    /// superblock; the pool is usable at once (made consistent in the background).
    pub async fn create_pool(&self, p: &crate::config::PoolConfig) -> Result<()> {
        if self.pools.read().contains_key(&p.name) {
            bail!("pool {} exists already", p.name);
        }
        let (members, spares, journal) = {
            let mut free = self.free_disks.lock();
            if let Some(d) = p
                .members
                .iter()
                .chain(p.spares.iter())
                .chain(p.journal_device.iter())
                .chain(p.journal_device_mirror.iter())
                .find(|d| !free.contains_key(*d))
            {
                bail!("pool {}: disk {d:?} is not a free disk", p.name);
            }
            (
                take_members(&mut free, &p.members),
                take_members(&mut free, &p.spares),
                take_members(&mut free, &p.journal_devices()),
            )
        };
        let taken: Vec<raid::Member> = members
            .iter()
            .chain(&spares)
            .chain(journal.iter())
            .cloned()
            .collect();
        match open_pool(p, members, spares, journal, true).await {
            Ok(pool) => {
                self.pools.write().insert(p.name.clone(), Arc::new(pool));
                Ok(())
            }
            Err(e) => {
                // the disks are free again
                let mut free = self.free_disks.lock();
                for m in taken {
                    free.insert(m.name, m.volume);
                }
                Err(e)
            }
        }
    }

    /// Gives disk `name`, which a LUN served, back to the free disks (the LUN was
    /// deleted or never started).
    pub fn release_lun_disk(&self, name: &str) {
        if let Some(v) = self.lun_disks.lock().remove(name) {
            v.keep_with(Arc::new(crate::keep::GiveUp));
            self.free_disks.lock().insert(name.to_string(), v);
        }
    }

    /// Takes disk `name` back after it stopped answering, now that it
    /// answers again ([`disk::TimedDisk::reinstated`]): a new disk over the
    /// same device joins the free disks (a pool's failed member, given back
    /// with `replace` or `add-spare`, is rebuilt onto it). The failed one
    /// stays where it was (a pool's failed position), refusing every
    /// request. The caller checks that nothing serves from the disk.
    pub fn reinstate_disk(&self, name: &str) -> Result<()> {
        let mut timed = self.timed.lock();
        let Some(old) = timed.get(name).cloned() else {
            bail!("no disk named {name:?} is open");
        };
        let new = Arc::new(old.reinstated().map_err(anyhow::Error::msg)?);
        timed.insert(name.to_string(), new.clone());
        self.free_disks
            .lock()
            .insert(name.to_string(), new as VolumeRef);
        Ok(())
    }

    /// Names of the disks nothing uses.
    pub fn free_disk_names(&self) -> Vec<String> {
        self.free_disks.lock().keys().cloned().collect()
    }

    /// What cache `name` caches, as a LUN on it directly would name it.
    pub fn cache_over(&self, name: &str) -> Result<String> {
        match self.caches.get(name) {
            Some(c) => Ok(c.over.clone()),
            None => bail!("no cache named {name:?} is configured"),
        }
    }

    /// The volume LUNs naming cache `name` serve (the cache while it is
    /// attached, its backing while not).
    pub fn cache_volume(&self, name: &str) -> Result<VolumeRef> {
        match self.caches.get(name) {
            Some(c) => Ok(c.front.clone() as VolumeRef),
            None => bail!("no cache named {name:?} is configured"),
        }
    }

    /// Status of every cache.
    pub fn cache_statuses(&self) -> Vec<serde_json::Value> {
        self.caches.iter().map(|(n, c)| c.status(n)).collect()
    }

    /// Status of cache `name`.
    pub fn cache_status(&self, name: &str) -> Option<serde_json::Value> {
        Some(self.caches.get(name)?.status(name))
    }

    fn cache_slot(&self, name: &str) -> Result<&CacheSlot, api::ApiError> {
        self.caches
            .get(name)
            .ok_or_else(|| api::ApiError::NotFound(format!("no cache named {name:?}")))
    }

    /// Carries out an administrative action on cache `name`: attach, detach, or
    /// replace a device (detach, swap in a free disk, attach afresh).
    pub async fn cache_act(
        &self,
        name: &str,
        action: api::CacheAction,
    ) -> Result<serde_json::Value, api::ApiError> {
        let slot = self.cache_slot(name)?;
        // one action at a time, and no waiting for it: a detach holds the lock
        // for as long as its drain takes, and each change waiting here would
        // hold one of the API's change slots (a client asking again and
        // again could fill them all)
        let Ok(_op) = slot.op.try_lock() else {
            return Err(api::ApiError::Conflict(format!(
                "cache {name}: another action on it is still running (a detach destages \
                 every dirty block first); try again once it has ended"
            )));
        };
        match action {
            api::CacheAction::Attach => slot.attach(name).await?,
            api::CacheAction::Detach => slot.detach(name).await?,
            api::CacheAction::Fail { device, force } => {
                let v = slot.volume().ok_or_else(|| {
                    api::ApiError::Conflict(format!("cache {name} is not attached"))
                })?;
                slot.check_device(name, device)?;
                if !force && slot.cfg.mode == cache::CacheMode::WriteBack {
                    // the last healthy device of a write-back cache holds the only
                    // copy of what is not destaged yet (a resilvering one is not whole)
                    let st = v.status();
                    let healthy = |i: usize| st.devices[i].state == "ok";
                    let others = (0..st.devices.len()).filter(|&i| i != device && healthy(i));
                    if healthy(device) && others.count() == 0 {
                        return Err(api::ApiError::Conflict(format!(
                            "cache {name} is write-back and device {device} is its last healthy \
                             device: failing it would lose the data not yet on the backing volume \
                             ({} dirty blocks now); detach the cache first to destage it, or add \
                             \"force\": true (--force) to do it anyway",
                            st.dirty_blocks
                        )));
                    }
                }
                v.fail_device(device)
                    .await
                    .map_err(|e| api::ApiError::Conflict(e.to_string()))?;
                tracing::warn!(cache = %name, device, "cache device failed by request");
            }
            api::CacheAction::Replace { device, disk } => {
                slot.check_device(name, device)?;
                if let Some(v) = slot.volume() {
                    if v.status().devices[device].state != "failed" {
                        return Err(api::ApiError::Conflict(format!(
                            "cache {name}: device {device} has not failed (fail it or detach the cache first)"
                        )));
                    }
                }
                let Some(new) = self.free_disks.lock().remove(&disk) else {
                    return Err(api::ApiError::BadRequest(format!(
                        "no free disk named {disk:?} (it must be a [[disk]] of the config that nothing uses)"
                    )));
                };
                let replacement = cache::CacheDevice {
                    name: disk.clone(),
                    volume: new.clone(),
                };
                // a write-back mirror is filled from its survivor while it serves
                // and stays warm; any other cache is detached, swapped, attached
                let warm = slot
                    .volume()
                    .filter(|_| slot.cfg.mode == cache::CacheMode::WriteBack);
                let put_in = match &warm {
                    Some(v) => v
                        .replace_device(device, replacement.clone())
                        .await
                        .map_err(|e| api::ApiError::Conflict(format!("cache {name}: {e}"))),
                    None if slot.volume().is_some() => slot.detach(name).await,
                    None => Ok(()),
                };
                if let Err(e) = put_in {
                    self.free_disks.lock().insert(disk, new);
                    return Err(e);
                }
                let old = std::mem::replace(&mut slot.devices.lock()[device], replacement);
                tracing::info!(cache = %name, device, old = %old.name, new = %disk, warm = warm.is_some(), "cache device replaced");
                if warm.is_none() {
                    slot.attach(name).await?;
                }
            }
        }
        Ok(slot.status(name))
    }

    /// The volume of pool `name`.
    pub fn volume(&self, name: &str) -> Result<VolumeRef> {
        match self.pools.read().get(name) {
            Some(p) => Ok(p.clone() as VolumeRef),
            None => bail!("no pool named {name:?} is configured"),
        }
    }

    /// A LUN is about to serve file or device `path` directly: refused while a
    /// write-back cache fronts a disk of that path (see `fronts.rs`).
    pub fn lun_path(&self, path: &std::path::Path) -> Result<()> {
        self.fronts.lock().serving_path_bare(&path_forms(path))
    }

    /// The volume of pool `name` for a LUN served directly from it: refused
    /// while a write-back cache fronts it (see `fronts.rs`).
    pub fn lun_pool_volume(&self, name: &str) -> Result<VolumeRef> {
        let (vol, id) = {
            let pools = self.pools.read();
            let Some(p) = pools.get(name) else {
                bail!("no pool named {name:?} is configured");
            };
            (p.clone() as VolumeRef, pool_id(name, &pools))
        };
        self.fronts
            .lock()
            .serving_bare(id, &format!("pool {name}"))?;
        Ok(vol)
    }

    /// Takes configured disk `name` for a LUN of its own (it is no longer free);
    /// refused while a write-back cache fronts it (see `fronts.rs`).
    pub fn take_disk_volume(&self, name: &str) -> Result<VolumeRef> {
        let mut free = self.free_disks.lock();
        if free.contains_key(name) {
            self.fronts
                .lock()
                .serving_bare(disk_id(name), &format!("disk {name}"))?;
        }
        match free.remove(name) {
            Some(v) => {
                // the only copy of the LUN's data (a replicated LUN gives
                // it a keeper of its own)
                v.keep_with(Arc::new(crate::keep::OnlyCopy));
                self.lun_disks.lock().insert(name.to_string(), v.clone());
                Ok(v)
            }
            None => bail!("disk {name:?} is not configured or already in use"),
        }
    }

    /// Status of every pool.
    pub fn statuses(&self) -> Vec<serde_json::Value> {
        let names: Vec<String> = self.pools.read().keys().cloned().collect();
        names.iter().filter_map(|n| self.status(n)).collect()
    }

    /// Every pool's typed status, for the event watcher.
    pub fn pool_statuses(&self) -> Vec<raid::PoolStatus> {
        let pools: Vec<Arc<raid::Pool>> = self.pools.read().values().cloned().collect();
        pools.iter().map(|p| p.status()).collect()
    }

    /// Every attached cache's name, mode, state line, device states and lost
    /// data (cheap: no counters), for the event watcher.
    pub fn cache_health(&self) -> Vec<CacheHealth> {
        self.caches
            .iter()
            .filter_map(|(n, c)| {
                let v = c.volume()?;
                let (state, devices) = v.health();
                Some(CacheHealth {
                    name: n.clone(),
                    mode: c.cfg.mode,
                    state,
                    devices,
                    lost_bytes: v.lost_dirty_bytes(),
                })
            })
            .collect()
    }

    /// Status of pool `name`, with the disks still free for spares and replacements.
    pub fn status(&self, name: &str) -> Option<serde_json::Value> {
        let p = self.pools.read().get(name)?.clone();
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
            .read()
            .get(name)
            .cloned()
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
            api::PoolAction::Fail { position, force } => {
                if !force {
                    let st = pool.status();
                    let down = st
                        .members
                        .iter()
                        .filter(|m| m.state != raid::MemberState::Active)
                        .count();
                    let active = st
                        .members
                        .get(position)
                        .is_some_and(|m| m.state == raid::MemberState::Active);
                    if active && down >= st.redundancy {
                        return Err(api::ApiError::Conflict(format!(
                            "pool {name} survives {} failed member(s) and has {down} already: \
                             failing member {position} would lose its data \
                             (add \"force\": true, or --force, to do it anyway)",
                            st.redundancy
                        )));
                    }
                }
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

    /// Stops background work and persists every cache's map and every pool's state
    /// (clean shutdown; caches first, they sit above the pools).
    pub async fn shutdown(&self) {
        for (name, c) in &self.caches {
            // an attach or detach under way ends first: stopped between its
            // switch of the LUNs to the backing and its emptying, a cache
            // would write a full table the backing no longer matches
            let Ok(_op) =
                tokio::time::timeout(std::time::Duration::from_secs(60), c.op.lock()).await
            else {
                // its table is left as a crash leaves it (not clean): the
                // clean one written under a running detach was the hazard
                // above (review of 2026-12-06: it was written all the same);
                // its background work (destaging) stops all the same, before
                // the pools below it shut down
                tracing::warn!(cache = %name,
                    "an attach or detach is still running at shutdown: the cache's table is left unclean");
                if let Some(v) = c.volume() {
                    v.halt().await;
                }
                continue;
            };
            let Some(v) = c.volume() else { continue };
            if let Err(e) = v.shutdown().await {
                tracing::warn!(cache = %name, error = %e, "cache shutdown");
            }
        }
        let pools: Vec<_> = self
            .pools
            .read()
            .iter()
            .map(|(n, p)| (n.clone(), p.clone()))
            .collect();
        for (name, p) in pools {
            if let Err(e) = p.shutdown().await {
                tracing::warn!(pool = %name, error = %e, "pool shutdown");
            }
        }
    }
}

/// What the event watcher looks at in an attached cache ([`Pools::cache_health`]).
pub struct CacheHealth {
    pub name: String,
    pub mode: cache::CacheMode,
    /// The state line ([`cache::CacheStatus::state`]).
    pub state: String,
    pub devices: Vec<cache::DeviceStatus>,
    /// [`cache::CacheStatus::lost_dirty_bytes`].
    pub lost_bytes: u64,
}
