//! Objects created while the node runs (through the management API: `freesan disk
//! create`, `freesan pool create`, `freesan lun create`) are kept in
//! `DATA_DIR/managed.toml`, a config fragment in the config file's own syntax
//! (`[[disk]]`, `[[pool]]`, `[[target]]` with `[[target.lun]]`), and merged into
//! the configuration at every start, so they come back after a restart. The
//! operator's config file is never rewritten.

use crate::config::{Chap, Config, DiskConfig, HostGroupConfig, LunConfig, PoolConfig};
use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// The objects created at run time.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Managed {
    /// Disks.
    #[serde(rename = "disk", default, skip_serializing_if = "Vec::is_empty")]
    pub disks: Vec<DiskConfig>,
    /// Pools.
    #[serde(rename = "pool", default, skip_serializing_if = "Vec::is_empty")]
    pub pools: Vec<PoolConfig>,
    /// LUNs, under the (configured) targets they belong to.
    #[serde(rename = "target", default, skip_serializing_if = "Vec::is_empty")]
    pub targets: Vec<ManagedTarget>,
    /// Pools whose disks changed at run time (spare added, member replaced): the
    /// disks they are assembled from now, in place of the config's lists.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pool_disks: Vec<PoolDisks>,
    /// Caches whose devices changed at run time (a device replaced).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cache_devices: Vec<CacheDevices>,
    /// Targets whose CHAP was set at run time (`POST /api/v1/targets/{name}/chap`),
    /// in place of the config's `chap`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub target_chap: Vec<TargetChap>,
    /// Targets whose allowed initiators were set at run time
    /// (`POST /api/v1/targets/{name}/acl`), in place of the config's list.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub target_acl: Vec<TargetAcl>,
}

/// A target's CHAP as set at run time.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TargetChap {
    /// The target.
    pub iqn: String,
    /// Its CHAP credentials; none: CHAP off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chap: Option<Chap>,
}

/// A target's allowed initiators as set at run time.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TargetAcl {
    /// The target.
    pub iqn: String,
    /// The initiators that may log in; empty: any.
    #[serde(default)]
    pub initiators: Vec<String>,
}

/// The disks of a pool after run-time changes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PoolDisks {
    /// The pool.
    pub name: String,
    /// Its members now.
    pub members: Vec<String>,
    /// Its spares now.
    #[serde(default)]
    pub spares: Vec<String>,
}

/// The devices of a cache after run-time changes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CacheDevices {
    /// The cache.
    pub name: String,
    /// Its devices now, in order.
    pub devices: Vec<String>,
}

/// LUNs added to one configured target.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ManagedTarget {
    /// The target's name (it must be in the config file).
    pub iqn: String,
    /// The LUNs (every one with its `id`).
    #[serde(rename = "lun", default)]
    pub luns: Vec<LunConfig>,
    /// Host groups created at run time (`freesan host-group create`).
    #[serde(rename = "host_group", default, skip_serializing_if = "Vec::is_empty")]
    pub host_groups: Vec<HostGroupConfig>,
}

impl Managed {
    /// Where the objects of the node with data directory `data_dir` are kept.
    pub fn path(data_dir: &Path) -> PathBuf {
        data_dir.join("managed.toml")
    }

    /// Reads the objects of `data_dir` (none if the file does not exist).
    pub fn load(data_dir: &Path) -> Result<Managed> {
        let path = Managed::path(data_dir);
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Managed::default()),
            Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
        };
        // (the error names the line, not its text: it may hold a CHAP secret)
        toml::from_str(&text).map_err(|e| {
            anyhow::anyhow!(
                "parsing {}: {}",
                path.display(),
                crate::config::toml_error(&text, &e)
            )
        })
    }

    /// Replaces the file atomically and durably (written aside, synced, renamed,
    /// directory synced): after a crash it holds either the old or the new list.
    pub fn save(&self, data_dir: &Path) -> Result<()> {
        let text = format!(
            "# Objects created through freesan's management API (freesan disk/pool/lun create).\n\
             # Merged into the configuration at every start; edit only while the node is stopped.\n\n{}",
            toml::to_string_pretty(self)?
        );
        std::fs::create_dir_all(data_dir)
            .with_context(|| format!("creating {}", data_dir.display()))?;
        crate::identity::write_atomic(&Managed::path(data_dir), text.as_bytes())
    }

    /// Adds these objects to `cfg` (after the config file's own).
    pub fn merge_into(&self, cfg: &mut Config) -> Result<()> {
        // What the API created was checked against `[api] allowed_paths`
        // then, and is checked again at every start: a symlink swapped while
        // the node was down (by a user who may write in an allowed folder)
        // must not lead it to open another file or device.
        // Where each path leads now is what its open must reach.
        let allowed = crate::allowed::Allowed::new(cfg);
        let check = |p: &Option<PathBuf>| -> Result<Option<PathBuf>> {
            let Some(p) = p else { return Ok(None) };
            allowed.check_path(p).map(Some).map_err(|e| {
                anyhow::anyhow!(
                    "{}: {} was created through the API and no longer passes its checks: {e}",
                    Managed::path(&cfg.data_dir).display(),
                    p.display()
                )
            })
        };
        let mut disks = Vec::with_capacity(self.disks.len());
        for d in &self.disks {
            let mut d = d.clone();
            d.resolved = check(&d.path)?;
            disks.push(d);
        }
        let mut luns = Vec::new();
        for mt in &self.targets {
            let mut l2 = Vec::with_capacity(mt.luns.len());
            for l in &mt.luns {
                let mut l = l.clone();
                l.resolved = check(&l.path)?;
                l2.push(l);
            }
            luns.push(l2);
        }
        cfg.disks.extend(disks);
        cfg.pools.extend(self.pools.iter().cloned());
        for (mt, luns) in self.targets.iter().zip(luns) {
            let Some(t) = cfg.targets.iter_mut().find(|t| t.iqn == mt.iqn) else {
                bail!(
                    "{}: LUNs were created on target {}, which the configuration no longer has",
                    Managed::path(&cfg.data_dir).display(),
                    mt.iqn
                );
            };
            t.luns.extend(luns);
            t.host_groups.extend(mt.host_groups.iter().cloned());
        }
        for pd in &self.pool_disks {
            let Some(p) = cfg.pools.iter_mut().find(|p| p.name == pd.name) else {
                bail!(
                    "{}: pool {} changed its disks at run time, but the configuration no longer has it",
                    Managed::path(&cfg.data_dir).display(),
                    pd.name
                );
            };
            p.members = pd.members.clone();
            p.spares = pd.spares.clone();
        }
        for tc in &self.target_chap {
            let Some(t) = cfg.targets.iter_mut().find(|t| t.iqn == tc.iqn) else {
                bail!(
                    "{}: CHAP of target {} was set at run time, but the configuration no longer has it",
                    Managed::path(&cfg.data_dir).display(),
                    tc.iqn
                );
            };
            t.chap = tc.chap.clone();
        }
        for ta in &self.target_acl {
            let Some(t) = cfg.targets.iter_mut().find(|t| t.iqn == ta.iqn) else {
                bail!(
                    "{}: allowed initiators of target {} were set at run time, but the configuration no longer has it",
                    Managed::path(&cfg.data_dir).display(),
                    ta.iqn
                );
            };
            t.allowed_initiators = ta.initiators.clone();
        }
        for cd in &self.cache_devices {
            let Some(c) = cfg.caches.iter_mut().find(|c| c.name == cd.name) else {
                bail!(
                    "{}: cache {} changed its devices at run time, but the configuration no longer has it",
                    Managed::path(&cfg.data_dir).display(),
                    cd.name
                );
            };
            c.devices = cd.devices.clone();
        }
        Ok(())
    }

    /// Records pool `name`'s disks now.
    pub fn set_pool_disks(&mut self, name: &str, members: Vec<String>, spares: Vec<String>) {
        self.pool_disks.retain(|p| p.name != name);
        self.pool_disks.push(PoolDisks {
            name: name.to_string(),
            members,
            spares,
        });
    }

    /// Records target `iqn`'s CHAP now (None: off).
    pub fn set_target_chap(&mut self, iqn: &str, chap: Option<Chap>) {
        self.target_chap.retain(|t| t.iqn != iqn);
        self.target_chap.push(TargetChap {
            iqn: iqn.to_string(),
            chap,
        });
    }

    /// Records target `iqn`'s allowed initiators now (empty: any).
    pub fn set_target_acl(&mut self, iqn: &str, initiators: Vec<String>) {
        self.target_acl.retain(|t| t.iqn != iqn);
        self.target_acl.push(TargetAcl {
            iqn: iqn.to_string(),
            initiators,
        });
    }

    /// Records cache `name`'s devices now.
    pub fn set_cache_devices(&mut self, name: &str, devices: Vec<String>) {
        self.cache_devices.retain(|c| c.name != name);
        self.cache_devices.push(CacheDevices {
            name: name.to_string(),
            devices,
        });
    }

    /// Whether LUN `id` of target `iqn` was created at run time.
    pub fn has_lun(&self, iqn: &str, id: u64) -> bool {
        self.targets
            .iter()
            .any(|t| t.iqn == iqn && t.luns.iter().any(|l| l.id == Some(id)))
    }

    /// Records LUN `lun` (with its id set) of target `iqn`.
    pub fn add_lun(&mut self, iqn: &str, lun: LunConfig) {
        match self.targets.iter_mut().find(|t| t.iqn == iqn) {
            Some(t) => t.luns.push(lun),
            None => self.targets.push(ManagedTarget {
                iqn: iqn.to_string(),
                luns: vec![lun],
                host_groups: vec![],
            }),
        }
    }

    /// Whether host group `name` of target `iqn` was created at run time.
    pub fn has_host_group(&self, iqn: &str, name: &str) -> bool {
        self.targets
            .iter()
            .any(|t| t.iqn == iqn && t.host_groups.iter().any(|g| g.name == name))
    }

    /// Records host group `group` of target `iqn`, replacing one of its name.
    pub fn set_host_group(&mut self, iqn: &str, group: HostGroupConfig) {
        self.remove_host_group(iqn, &group.name);
        match self.targets.iter_mut().find(|t| t.iqn == iqn) {
            Some(t) => t.host_groups.push(group),
            None => self.targets.push(ManagedTarget {
                iqn: iqn.to_string(),
                luns: vec![],
                host_groups: vec![group],
            }),
        }
    }

    /// Forgets host group `name` of target `iqn`.
    pub fn remove_host_group(&mut self, iqn: &str, name: &str) {
        for t in &mut self.targets {
            if t.iqn == iqn {
                t.host_groups.retain(|g| g.name != name);
            }
        }
        self.targets
            .retain(|t| !t.luns.is_empty() || !t.host_groups.is_empty());
    }

    /// Forgets LUN `id` of target `iqn`.
    pub fn remove_lun(&mut self, iqn: &str, id: u64) {
        for t in &mut self.targets {
            if t.iqn == iqn {
                t.luns.retain(|l| l.id != Some(id));
            }
        }
        self.targets
            .retain(|t| !t.luns.is_empty() || !t.host_groups.is_empty());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_dir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("freesan-managed-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn objects_round_trip_and_merge_after_the_config_files_own() {
        let dir = temp_dir("rt");
        assert_eq!(Managed::load(&dir).unwrap(), Managed::default());
        let mut m = Managed::default();
        m.disks.push(DiskConfig {
            name: "d9".into(),
            path: None,
            resolved: None,
            size: Some("64M".into()),
            sim: None,
            memory: true,
            io_timeout_secs: Some(5),
        });
        let mut lun = LunConfig::file(dir.join("x.img"), Some("1M".into()));
        lun.id = Some(7);
        m.add_lun("iqn.2026-11.org.freesan:t", lun);
        m.save(&dir).unwrap();
        let back = Managed::load(&dir).unwrap();
        assert_eq!(back, m);
        assert!(back.has_lun("iqn.2026-11.org.freesan:t", 7));
        assert!(!back.has_lun("iqn.2026-11.org.freesan:t", 0));

        let mut cfg = Config::from_quick_flags(&crate::config::QuickFlags {
            target: Some("iqn.2026-11.org.freesan:t".into()),
            data_dir: Some(dir.clone()),
            ..Default::default()
        });
        back.merge_into(&mut cfg).unwrap();
        assert_eq!(cfg.disks.len(), 1);
        assert_eq!(cfg.targets[0].luns.len(), 2);
        assert_eq!(cfg.targets[0].luns[1].id, Some(7));

        let mut gone = back.clone();
        gone.remove_lun("iqn.2026-11.org.freesan:t", 7);
        assert!(gone.targets.is_empty());
        // LUNs of a target the config no longer has are an error, not dropped
        let mut other = Config::from_quick_flags(&crate::config::QuickFlags {
            data_dir: Some(dir.clone()),
            ..Default::default()
        });
        assert!(back.merge_into(&mut other).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn target_chap_and_acl_set_at_run_time_override_the_file() {
        let dir = temp_dir("access");
        let iqn = "iqn.2026-11.org.freesan:t";
        let quick = crate::config::QuickFlags {
            target: Some(iqn.into()),
            data_dir: Some(dir.clone()),
            ..Default::default()
        };
        let mut m = Managed::default();
        m.set_target_chap(
            iqn,
            Some(Chap {
                user: "u".into(),
                secret: "secret-of-u-1".into(),
            }),
        );
        m.set_target_acl(iqn, vec!["iqn.2026-11.test:a".into()]);
        // set again: the newest replaces the older
        m.set_target_chap(iqn, None);
        m.save(&dir).unwrap();
        let back = Managed::load(&dir).unwrap();
        assert_eq!(back, m);
        assert_eq!(back.target_chap.len(), 1);
        let mut cfg = Config::from_quick_flags(&quick);
        cfg.targets[0].chap = Some(Chap {
            user: "file".into(),
            secret: "secret-of-file".into(),
        });
        back.merge_into(&mut cfg).unwrap();
        assert_eq!(cfg.targets[0].chap, None);
        assert_eq!(cfg.targets[0].allowed_initiators, ["iqn.2026-11.test:a"]);
        // a target the config no longer has is an error
        let mut other = Config::from_quick_flags(&crate::config::QuickFlags {
            data_dir: Some(dir.clone()),
            ..Default::default()
        });
        assert!(back.merge_into(&mut other).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A LUN the API created in an allowed folder whose file is swapped for
    /// a symlink to a file elsewhere while the node is down is refused at
    /// the next start, not opened. (Before, the path was checked once, when
    /// created, and opened by name at every start.)
    #[test]
    fn a_created_path_swapped_for_a_link_elsewhere_is_refused_at_start() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        let outside = dir.path().join("outside.img");
        std::fs::create_dir_all(data.join("luns")).unwrap();
        std::fs::write(&outside, b"not the node's").unwrap();
        let img = data.join("luns").join("x.img");
        std::fs::write(&img, b"").unwrap();
        let mut m = Managed::default();
        let mut lun = LunConfig::file(img.clone(), Some("1M".into()));
        lun.id = Some(3);
        m.add_lun("iqn.2026-11.org.freesan:t", lun);
        let cfg = || {
            Config::from_quick_flags(&crate::config::QuickFlags {
                target: Some("iqn.2026-11.org.freesan:t".into()),
                data_dir: Some(data.clone()),
                ..Default::default()
            })
        };
        m.merge_into(&mut cfg())
            .expect("inside the data directory: served");
        std::fs::remove_file(&img).unwrap();
        std::os::unix::fs::symlink(&outside, &img).unwrap();
        let e = format!("{:#}", m.merge_into(&mut cfg()).unwrap_err());
        assert!(e.contains("outside the paths"), "{e}");
    }

    /// A data directory another user owns is refused before anything in it
    /// is read.
    #[test]
    fn a_data_directory_of_another_user_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        crate::secrets::check_data_dir(dir.path()).expect("our own");
        crate::secrets::check_data_dir(&dir.path().join("not-yet")).expect("to be made");
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return; // only root can give a folder away
        }
        std::os::unix::fs::chown(dir.path(), Some(65534), None).unwrap();
        let e = format!(
            "{:#}",
            crate::secrets::check_data_dir(dir.path()).unwrap_err()
        );
        assert!(e.contains("uid 65534"), "{e}");
        // root is told to run as the folder's user, not to take the folder
        assert!(e.contains("runuser") && !e.contains("chown"), "{e}");
    }
}
