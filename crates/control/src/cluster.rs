//! The node's side of an HA pair: opens the replicated LUNs over their local
//! copies, runs the sync listener, and keeps each target's ALUA port groups in
//! step with the replication state (this node's group and the partner's), per LUN.

use crate::config::ClusterConfig;
use anyhow::{Context, Result};
use block::VolumeRef;
use parking_lot::{Mutex, RwLock};
use replica::{Mode, PathState, ReplicaConfig, ReplicatedVolume, SyncLinkMonitor, SyncSinks};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Relative port ids (and iSCSI TPGTs) of node 2's portals start here, so the
/// two nodes' ports never share an id.
pub const NODE2_PORT_BASE: u16 = 0x100;

/// Relative port id of portal `index` (0-based) of node `node_id`.
pub fn port_id(node_id: u8, index: usize) -> u16 {
    let base = if node_id == 2 { NODE2_PORT_BASE } else { 0 };
    base + index as u16 + 1
}

/// The replicated volumes of this node (some opened at start, some created at
/// run time through the management API).
pub struct Cluster {
    cfg: ClusterConfig,
    keys: Arc<replica::secure::ClusterKeys>,
    data_dir: PathBuf,
    volumes: RwLock<Vec<Arc<ReplicatedVolume>>>,
    sinks: SyncSinks,
    monitor: Mutex<Option<Arc<SyncLinkMonitor>>>,
    client_monitor: Mutex<Option<Arc<SyncLinkMonitor>>>,
}

impl Cluster {
    /// An empty cluster side for this configuration; replica state lives under
    /// `data_dir`. Fails when the key file cannot be read, is readable by
    /// others, or belongs to another cluster or node.
    pub fn new(cfg: ClusterConfig, data_dir: &Path) -> Result<Cluster> {
        let mut keys = replica::secure::ClusterKeys::load(&cfg.key_file)
            .with_context(|| format!("cluster key file {}", cfg.key_file.display()))?;
        keys.set_sync_encryption(cfg.encrypt);
        if keys.cluster() != cfg.name {
            anyhow::bail!(
                "cluster key file {} is for cluster {:?}, not {:?}",
                cfg.key_file.display(),
                keys.cluster(),
                cfg.name
            );
        }
        if keys.me().node_id() != cfg.node_id {
            anyhow::bail!(
                "cluster key file {} is {}'s, but this is node {}",
                cfg.key_file.display(),
                keys.me().name(),
                cfg.node_id
            );
        }
        Ok(Cluster {
            cfg,
            keys: Arc::new(keys),
            data_dir: data_dir.to_path_buf(),
            volumes: RwLock::new(Vec::new()),
            sinks: SyncSinks::default(),
            monitor: Mutex::new(None),
            client_monitor: Mutex::new(None),
        })
    }

    /// The replicated volume name of LUN `lun` of target `iqn`: the same on both
    /// nodes (it names the volume in the sync handshake and derives the identity).
    pub fn volume_name(&self, iqn: &str, lun: u64) -> String {
        volume_name(&self.cfg.name, iqn, lun)
    }

    /// Replicates `local` as volume `name`. Before [`Cluster::listen`] the partner's
    /// connections for it are accepted once the listener starts; after it (a LUN
    /// created at run time), at once.
    pub fn replicate(
        &self,
        name: &str,
        mode: Option<&str>,
        local: VolumeRef,
    ) -> Result<Arc<ReplicatedVolume>> {
        if self.volume(name).is_some() {
            anyhow::bail!("replicated volume {name} exists already");
        }
        let c = &self.cfg;
        let rcfg = ReplicaConfig {
            name: name.to_string(),
            cluster: c.name.clone(),
            node_id: c.node_id,
            preferred_node: c.preferred_node,
            peer_sync: c.peer_sync.clone(),
            witness: c.witness,
            mode: match mode {
                Some("active-passive") => Mode::ActivePassive,
                _ => Mode::ActiveActive,
            },
            region_bytes: c
                .region
                .as_deref()
                .and_then(disk::parse_size)
                .unwrap_or(64 << 10) as u32,
            heartbeat_interval_ms: c.heartbeat_interval_ms,
            peer_timeout_ms: c.peer_timeout_ms,
            io_wait_ms: (c.peer_timeout_ms * 2).max(3000),
            state_dir: self.state_dir(name),
            keys: self.keys.clone(),
            buffers: block::BufferBudget::node(),
        };
        let (vol, sink) = ReplicatedVolume::open(rcfg, local)
            .with_context(|| format!("opening replicated volume {name}"))?;
        let vol = Arc::new(vol);
        if let Some(m) = self.monitor.lock().clone() {
            vol.set_link_monitor(m);
        }
        if let Some(m) = self.client_monitor.lock().clone() {
            vol.set_client_link_monitor(m);
        }
        self.sinks.insert(name, sink);
        self.volumes.write().push(vol.clone());
        Ok(vol)
    }

    /// Where this node keeps replicated volume `name`'s state (generations, bitmap).
    pub fn state_dir(&self, name: &str) -> PathBuf {
        self.data_dir
            .join("replicas")
            .join(crate::identity::safe_name(name))
    }

    /// Stops replicating volume `name` (its LUN was deleted): the link closes, the
    /// copy is flushed and its state persisted, as at shutdown.
    pub async fn forget(&self, name: &str) {
        let Some(v) = self.volume(name) else { return };
        self.sinks.remove(name);
        self.volumes.write().retain(|x| x.name() != name);
        v.shutdown().await;
    }

    /// Starts accepting the partner's sync connections, and the heartbeats on
    /// every sync link and (unless turned off) on the client-facing networks,
    /// this node's `portals` paired in order with the partner's.
    pub async fn listen(&self, portals: &[std::net::SocketAddr]) -> Result<()> {
        let l = replica::SyncListener::bind(&self.cfg.sync, self.sinks.clone(), self.keys.clone())
            .await
            .with_context(|| format!("binding the sync addresses {:?}", self.cfg.sync))?;
        // heartbeats on every sync link (UDP on the same addresses), link i of
        // `sync` paired with link i of `peer_sync`
        let sync: Vec<_> = l.local_addrs();
        l.spawn();
        let monitor = replica::SyncLinkMonitor::start(
            "sync",
            &sync,
            &self.cfg.peer_sync,
            std::time::Duration::from_millis(self.cfg.heartbeat_interval_ms),
            std::time::Duration::from_millis(self.cfg.peer_timeout_ms),
            replica::HeartbeatAuth::new(&self.keys),
        )
        .await
        .context("starting the sync link heartbeats")?;
        for v in self.volumes.read().iter() {
            v.set_link_monitor(monitor.clone());
        }
        *self.monitor.lock() = Some(monitor);
        let pairs = portals.len().min(self.cfg.peer_portals.len());
        if self.cfg.client_heartbeats && pairs > 0 {
            let interval = std::time::Duration::from_millis(self.cfg.heartbeat_interval_ms);
            let timeout = std::time::Duration::from_millis(self.cfg.peer_timeout_ms);
            match SyncLinkMonitor::start(
                "client",
                &portals[..pairs],
                &self.cfg.peer_portals[..pairs],
                interval,
                timeout,
                replica::HeartbeatAuth::new(&self.keys),
            )
            .await
            {
                Ok(m) => {
                    for v in self.volumes.read().iter() {
                        v.set_client_link_monitor(m.clone());
                    }
                    *self.client_monitor.lock() = Some(m);
                }
                // the sync links still decide; only the status loses detail
                Err(e) => tracing::warn!("heartbeats on the client networks not started: {e}"),
            }
        }
        Ok(())
    }

    /// Stops replicating (at shutdown): links closed, copies flushed, bitmaps
    /// persisted; the partner goes on alone as after a failure.
    pub async fn shutdown(&self) {
        let volumes = self.volumes.read().clone();
        for v in volumes {
            v.shutdown().await;
        }
    }

    /// The replicated volume named `name`.
    pub fn volume(&self, name: &str) -> Option<Arc<ReplicatedVolume>> {
        self.volumes
            .read()
            .iter()
            .find(|v| v.name() == name)
            .cloned()
    }

    /// Status of every replicated volume.
    pub fn statuses(&self) -> Vec<serde_json::Value> {
        self.volumes
            .read()
            .iter()
            .map(|v| serde_json::to_value(v.status()).unwrap_or_default())
            .collect()
    }

    /// Typed status of every replicated volume, for the event watcher.
    pub fn replica_statuses(&self) -> Vec<replica::ReplicaStatus> {
        self.volumes.read().iter().map(|v| v.status()).collect()
    }

    /// Keeps the ALUA states of LUN `lun` of `target` for this node's port group
    /// and the partner's in step with its replicated volume: each replicated LUN's
    /// paths follow its own state (a LUN resyncing does not take the others'
    /// paths away). Stops when the volume or the LUN goes.
    pub fn drive_alua(
        &self,
        target: &Arc<scsi::ScsiTarget>,
        lun: u64,
        volume: Arc<ReplicatedVolume>,
    ) {
        let me = self.cfg.node_id as u16;
        let peer = 3 - me;
        let update = move |t: &scsi::ScsiTarget, p: &replica::PortStates| {
            t.set_lun_port_group_state(lun, me, alua(p.local))
                && t.set_lun_port_group_state(lun, peer, alua(p.peer))
        };
        let mut rx = volume.port_states();
        let first = *rx.borrow_and_update();
        update(target, &first);
        let target = Arc::downgrade(target);
        tokio::spawn(async move {
            while rx.changed().await.is_ok() {
                let states = *rx.borrow_and_update();
                let Some(t) = target.upgrade() else { return };
                if !update(&t, &states) {
                    return;
                }
            }
        });
    }
}

fn alua(s: PathState) -> scsi::AluaState {
    match s {
        PathState::Active => scsi::AluaState::ActiveOptimized,
        PathState::Standby => scsi::AluaState::Standby,
        PathState::Unavailable => scsi::AluaState::Unavailable,
    }
}

/// The replicated volume name of LUN `lun` of target `iqn` in cluster
/// `cluster` (see [`Cluster::volume_name`]).
pub fn volume_name(cluster: &str, iqn: &str, lun: u64) -> String {
    format!("{cluster}/{iqn}/lun{lun}")
}
