//! The node's side of an HA pair: opens the replicated LUNs over their local
//! copies, runs the sync listener, and keeps each target's ALUA port groups in
//! step with the replication state (this node's group and the partner's).

use crate::config::ClusterConfig;
use anyhow::{Context, Result};
use block::VolumeRef;
use replica::{ConnectionSink, Mode, PathState, ReplicaConfig, ReplicatedVolume};
use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

/// Relative port ids (and iSCSI TPGTs) of node 2's portals start here, so the
/// two nodes' ports never share an id.
pub const NODE2_PORT_BASE: u16 = 0x100;

/// Relative port id of portal `index` (0-based) of node `node_id`.
pub fn port_id(node_id: u8, index: usize) -> u16 {
    let base = if node_id == 2 { NODE2_PORT_BASE } else { 0 };
    base + index as u16 + 1
}

/// The replicated volumes of this node.
pub struct Cluster {
    cfg: ClusterConfig,
    volumes: Vec<Arc<ReplicatedVolume>>,
    sinks: HashMap<String, ConnectionSink>,
}

impl Cluster {
    /// An empty cluster side for this configuration.
    pub fn new(cfg: ClusterConfig) -> Cluster {
        Cluster {
            cfg,
            volumes: Vec::new(),
            sinks: HashMap::new(),
        }
    }

    /// The cluster configuration.
    pub fn config(&self) -> &ClusterConfig {
        &self.cfg
    }

    /// Replicates `local` as volume `name`; its state lives under `data_dir`.
    pub fn replicate(
        &mut self,
        name: &str,
        mode: Option<&str>,
        data_dir: &Path,
        local: VolumeRef,
    ) -> Result<Arc<ReplicatedVolume>> {
        let c = &self.cfg;
        let safe: String = name
            .chars()
            .map(|ch| {
                if ch.is_ascii_alphanumeric() || ch == '.' || ch == '-' {
                    ch
                } else {
                    '_'
                }
            })
            .collect();
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
            state_dir: data_dir.join("replicas").join(safe),
        };
        let (vol, sink) = ReplicatedVolume::open(rcfg, local)
            .with_context(|| format!("opening replicated volume {name}"))?;
        let vol = Arc::new(vol);
        self.sinks.insert(name.to_string(), sink);
        self.volumes.push(vol.clone());
        Ok(vol)
    }

    /// Starts accepting the partner's sync connections.
    pub async fn listen(&mut self) -> Result<()> {
        let sinks = std::mem::take(&mut self.sinks);
        let l = replica::SyncListener::bind(&self.cfg.sync, sinks)
            .await
            .with_context(|| format!("binding the sync addresses {:?}", self.cfg.sync))?;
        // heartbeats on every sync link (UDP on the same addresses), link i of
        // `sync` paired with link i of `peer_sync`
        let sync: Vec<_> = l.local_addrs();
        l.spawn();
        let monitor = replica::SyncLinkMonitor::start(
            &sync,
            &self.cfg.peer_sync,
            std::time::Duration::from_millis(self.cfg.heartbeat_interval_ms),
            std::time::Duration::from_millis(self.cfg.peer_timeout_ms),
        )
        .await
        .context("starting the sync link heartbeats")?;
        for v in &self.volumes {
            v.set_link_monitor(monitor.clone());
        }
        Ok(())
    }

    /// Stops replicating (at shutdown): links closed, copies flushed, bitmaps
    /// persisted; the partner goes on alone as after a failure.
    pub async fn shutdown(&self) {
        for v in &self.volumes {
            v.shutdown().await;
        }
    }

    /// The replicated volume named `name`.
    pub fn volume(&self, name: &str) -> Option<&Arc<ReplicatedVolume>> {
        self.volumes.iter().find(|v| v.name() == name)
    }

    /// Status of every replicated volume.
    pub fn statuses(&self) -> Vec<serde_json::Value> {
        self.volumes
            .iter()
            .map(|v| serde_json::to_value(v.status()).unwrap_or_default())
            .collect()
    }

    /// Keeps `target`'s two port groups (ids 1 and 2, one per node) in step with
    /// `volumes`: a group is as available as its worst replicated LUN.
    pub fn drive_alua(&self, target: Arc<scsi::ScsiTarget>, volumes: Vec<Arc<ReplicatedVolume>>) {
        if volumes.is_empty() {
            return;
        }
        let me = self.cfg.node_id as u16;
        let peer = 3 - me;
        for v in &volumes {
            let mut rx = v.port_states();
            let target = target.clone();
            let all = volumes.clone();
            tokio::spawn(async move {
                loop {
                    let worst = |f: fn(&replica::PortStates) -> PathState| {
                        all.iter()
                            .map(|v| f(&v.port_states().borrow()))
                            .max_by_key(|s| match s {
                                PathState::Active => 0,
                                PathState::Standby => 1,
                                PathState::Unavailable => 2,
                            })
                            .unwrap_or(PathState::Unavailable)
                    };
                    target.set_port_group_state(me, alua(worst(|p| p.local)));
                    target.set_port_group_state(peer, alua(worst(|p| p.peer)));
                    if rx.changed().await.is_err() {
                        return;
                    }
                }
            });
        }
    }
}

fn alua(s: PathState) -> scsi::AluaState {
    match s {
        PathState::Active => scsi::AluaState::ActiveOptimized,
        PathState::Standby => scsi::AluaState::Standby,
        PathState::Unavailable => scsi::AluaState::Unavailable,
    }
}
