//! Opening one LUN as the configuration describes it: its volume (a file or block
//! device, a disk, a pool or a cache, replicated through the cluster if asked),
//! its identity and SCSI settings, and its NBD export names. Used at start
//! ([`crate::serve`]) and for LUNs created at run time ([`crate::objects`]).
//!
//! What it does not do: add the LUN to a target or an NBD server; the caller does.

use crate::cluster::Cluster;
use crate::config::LunConfig;
use crate::identity;
use crate::pools::Pools;
use anyhow::{bail, Context, Result};
use block::VolumeRef;
use std::path::Path;
use std::sync::Arc;

/// Opens the volume a LUN serves: its file or block device, or its pool. Returns the
/// volume, a description of what backs it, and the data its saved state
/// belongs to ([`identity::Owner::key`]: for a cache, the cache's pool or disk).
fn lun_volume(l: &LunConfig, pools: &Pools) -> Result<(VolumeRef, String, String)> {
    if let Some(name) = &l.pool {
        let vol = pools.lun_pool_volume(name)?;
        return Ok((vol, format!("pool {name}"), format!("pool {name}")));
    }
    if let Some(name) = &l.cache {
        let vol = pools.cache_volume(name)?;
        let over = pools.cache_over(name)?;
        return Ok((vol, format!("cache {name}"), over));
    }
    if let Some(name) = &l.disk {
        let vol = pools.take_disk_volume(name)?;
        return Ok((vol, format!("disk {name}"), format!("disk {name}")));
    }
    let Some(path) = &l.path else {
        bail!("neither path nor pool given");
    };
    pools.lun_path(path)?;
    let opts = disk::FileOptions {
        create_size_bytes: l.size.as_deref().and_then(disk::parse_size),
        thick: l.thick,
        block_size_bytes: l.block_size,
        sync_writes: l.sync_writes,
        read_only: l.read_only,
        // (created through the API: the file its checks approved)
        resolved: l.resolved.clone(),
        ..disk::FileOptions::default()
    };
    if let Some(parent) = path.parent() {
        if !parent.as_os_str().is_empty() && !path.exists() {
            std::fs::create_dir_all(parent)
                .with_context(|| format!("creating {}", parent.display()))?;
        }
    }
    let vol = disk::FileVolume::open(path, &opts)
        .with_context(|| format!("opening {}", path.display()))?;
    let shown = path.display().to_string();
    Ok((Arc::new(vol), shown.clone(), shown))
}

/// READ CAPACITY(16)'s LOGICAL BLOCKS PER PHYSICAL BLOCK EXPONENT for `l`'s
/// `physical_block_size` over blocks of `bs` bytes (0 without one).
pub(crate) fn physical_exponent(bs: u32, l: &LunConfig) -> Result<u8> {
    let Some(p) = l.physical_block_size else {
        return Ok(0);
    };
    if p < bs || !(p / bs).is_power_of_two() || (p / bs).trailing_zeros() > 15 {
        bail!("physical_block_size {p} is not a power-of-two multiple (at most 2^15) of the LUN's {bs}-byte blocks");
    }
    Ok((p / bs).trailing_zeros() as u8)
}

/// `volume` with atomic writes (`block::AtomicWrites`), its records in
/// `lunN.atomic` beside the LUN's other state, keyed by the LUN's NAA so that a
/// file left from an earlier LUN of that number is never applied to this one.
/// Records a crash left are applied at once when a runtime is running (else before
/// the first I/O).
fn with_atomic_writes(
    volume: VolumeRef,
    tdir: &Path,
    lun_id: u64,
    naa: &[u8; 16],
) -> Result<VolumeRef> {
    let bs = volume.geometry().block_size_bytes;
    std::fs::create_dir_all(tdir).with_context(|| format!("creating {}", tdir.display()))?;
    let path = tdir.join(format!("lun{lun_id}.atomic"));
    // Atomic writes are rare next to the LUN's other I/O: the record file uses
    // tokio's blocking pool, not an io_uring ring and thread of its own per LUN.
    let opts = disk::FileOptions {
        create_size_bytes: Some(block::AtomicWrites::records_bytes(bs)),
        block_size_bytes: bs,
        engine: disk::Engine::Threads,
        queue_depth_max: block::ATOMIC_SLOTS as u32 * 2,
        ..disk::FileOptions::default()
    };
    let records = disk::FileVolume::open(&path, &opts)
        .with_context(|| format!("opening {}", path.display()))?;
    let key = block::AtomicWrites::key_of(naa);
    let v = Arc::new(block::AtomicWrites::new(volume, Arc::new(records), key)?);
    if let Ok(rt) = tokio::runtime::Handle::try_current() {
        let r = v.clone();
        let p = path.clone();
        rt.spawn(async move {
            match r.recover().await {
                Ok(0) => {}
                Ok(n) => tracing::warn!(records = n, file = %p.display(), "applied atomic writes a crash had interrupted"),
                Err(e) => tracing::error!(error = %e, file = %p.display(), "atomic write records could not be applied"),
            }
        });
    }
    Ok(v)
}

/// A LUN opened and ready to be added to its target.
pub(crate) struct BuiltLun {
    /// Its SCSI configuration (identity, state file).
    pub scsi: scsi::LunConfig,
    /// The volume it serves (replicated if it is).
    pub volume: VolumeRef,
    /// What backs it, for people.
    pub backing: String,
    /// Its replicated volume, if it is replicated.
    pub replicated: Option<Arc<replica::ReplicatedVolume>>,
}

/// Opens LUN `lun_id` of target `iqn` as `l` describes it: its volume (file,
/// disk, pool or cache; replicated through `cluster` if asked) and its identity
/// (derived from the cluster for a replicated LUN, so both nodes agree;
/// otherwise created once and kept under `data_dir`).
pub(crate) fn open_lun(
    data_dir: &Path,
    pools: &Pools,
    cluster: Option<&Cluster>,
    iqn: &str,
    l: &LunConfig,
    lun_id: u64,
) -> Result<BuiltLun> {
    let (mut volume, mut backing, data) = lun_volume(l, pools)?;
    let owner = identity::Owner {
        key: &data,
        shown: &backing,
    };
    let mut replicated = None;
    let id = match (l.replicated, cluster) {
        (true, Some(c)) => {
            let key = c.volume_name(iqn, lun_id);
            // the state kept under the LUN's number (its replica's too) is checked
            // to be this data's before the replica opens it
            identity::load_or_create_for(data_dir, iqn, lun_id, owner, || identity::derived(&key))?;
            let local = volume.clone();
            let r = c.replicate(&key, l.replica_mode.as_deref(), volume)?;
            // a disk served directly: given up while the partner holds a copy
            // (a pool's members and a cache's devices have their own keepers)
            if l.disk.is_some() {
                local.keep_with(Arc::new(crate::keep::UnderReplica(Arc::downgrade(&r))));
            }
            replicated = Some(r.clone());
            volume = r;
            backing = format!("{backing}, replicated");
            identity::derived(&key)
        }
        (true, None) => bail!("replicated needs a [cluster] section"),
        _ => identity::load_or_create(data_dir, iqn, lun_id, owner)?,
    };
    let naa = match &l.naa {
        Some(n) => identity::parse_naa(n)?,
        None => identity::parse_naa(&id.naa)?,
    };
    let tdir = identity::target_dir(data_dir, iqn);
    let physical_block_exponent = physical_exponent(volume.geometry().block_size_bytes, l)?;
    if l.atomic_writes && replicated.is_none() && !l.read_only {
        volume = with_atomic_writes(volume, &tdir, lun_id, &naa)
            .with_context(|| format!("the atomic-write records of LUN {lun_id}"))?;
    }
    Ok(BuiltLun {
        scsi: scsi::LunConfig {
            naa,
            serial: l.serial.clone().unwrap_or(id.serial),
            vendor: "FREESAN".into(),
            product: "freesan LUN".into(),
            revision: env!("CARGO_PKG_VERSION")
                .chars()
                .filter(|c| *c != '.')
                .take(4)
                .collect(),
            read_only: l.read_only,
            state_file: Some(tdir.join(format!("lun{lun_id}.pr.json"))),
            physical_block_exponent,
            sanitize_rate_bytes_per_s: l.sanitize_rate_mib_s.saturating_mul(1 << 20),
        },
        volume,
        backing,
        replicated,
    })
}

/// Holds an NBD client to what the SCSI target allows an initiator that never
/// registered and that no host group names (the reservations of LUN `lun`, and
/// LUN masking): without it, NBD reached LUNs that reservations fenced (as
/// `fence_scsi` does) or masking hid.
pub(crate) struct LunAccess {
    pub target: std::sync::Arc<scsi::ScsiTarget>,
    pub lun: u64,
    /// The LU's write order once looked up (every NBD change asks for it;
    /// the LU outlives its exports).
    pub order: std::sync::OnceLock<std::sync::Arc<tokio::sync::RwLock<()>>>,
}

impl LunAccess {
    pub(crate) fn new(target: std::sync::Arc<scsi::ScsiTarget>, lun: u64) -> LunAccess {
        LunAccess {
            target,
            lun,
            order: std::sync::OnceLock::new(),
        }
    }
}

impl nbd::ExportAccess for LunAccess {
    fn allows(&self, write: bool) -> bool {
        self.target.unregistered_access(self.lun, write)
    }

    fn visible(&self) -> bool {
        self.target.nbd_visible(self.lun)
    }

    fn write_order(&self) -> Option<std::sync::Arc<tokio::sync::RwLock<()>>> {
        if let Some(o) = self.order.get() {
            return Some(o.clone());
        }
        let o = self.target.lun_write_order(self.lun)?;
        Some(self.order.get_or_init(|| o).clone())
    }
}

/// The NBD exports of one LUN: `IQN/lunN`, and `lunN` too for LUNs of the first
/// target (`first_target`); none yet held to the SCSI target (`access`).
pub(crate) fn nbd_exports(
    first_target: bool,
    iqn: &str,
    lun_id: u64,
    b: &BuiltLun,
    read_only: bool,
) -> Vec<nbd::NbdExport> {
    let mut names = vec![format!("{iqn}/lun{lun_id}")];
    if first_target {
        names.insert(0, format!("lun{lun_id}"));
    }
    names
        .into_iter()
        .map(|name| nbd::NbdExport {
            name,
            description: format!("{iqn} LUN {lun_id} ({})", b.backing),
            volume: b.volume.clone(),
            read_only,
            access: None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    /// Taking a LUN without `id` out of the configuration file renumbers the
    /// ones after it; the next start used to give the LUN now numbered 0 the
    /// removed LUN's NAA, reservations and atomic-write records. It is refused
    /// instead, and served with its own state once given its old number.
    /// (Two workers: each open spawns the recovery of its atomic-write
    /// records, which holds the LUN's volume, and with it the claim on its
    /// file, until it has run.)
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_lun_renumbered_by_the_file_does_not_take_the_removed_luns_state() {
        let dir = tempfile::tempdir().unwrap();
        let text = format!(
            "data_dir = {:?}\n[[portal]]\naddress = \"127.0.0.1:3260\"\n\
             [[target]]\niqn = \"iqn.2026-12.org.freesan:t1\"\n\
             [[target.lun]]\npath = {:?}\nsize = \"1M\"\natomic_writes = true\n\
             [[target.lun]]\npath = {:?}\nsize = \"1M\"\natomic_writes = true\n",
            dir.path().display().to_string(),
            dir.path().join("a.img").display().to_string(),
            dir.path().join("b.img").display().to_string(),
        );
        let cfg: Config = toml::from_str(&text).unwrap();
        let pools = Pools::open(&cfg).await.unwrap();
        let t = &cfg.targets[0];
        let open = |l: usize, n: u64| open_lun(&cfg.data_dir, &pools, None, &t.iqn, &t.luns[l], n);
        let a = open(0, 0).unwrap().scsi.naa;
        let b = open(1, 1).unwrap().scsi.naa;
        assert_ne!(a, b);
        // a.img's LUN taken out of the file: b.img's is LUN 0
        let e = format!("{:#}", open(1, 0).err().expect("refused"));
        assert!(e.contains("`id = 1`"), "{e}");
        // given `id = 1`, it is served with its own identity
        assert_eq!(open(1, 1).unwrap().scsi.naa, b);
    }
}
