//! Which cache fronts which volume: `DATA_DIR/cache-fronts.toml`.
//!
//! A cache's table describes the volume behind it as it was when the table was
//! written. If the volume is then served without the cache (its `[[cache]]`
//! taken out of the configuration and the LUN pointed at the pool or disk
//! directly, with no `cache detach`), two things go wrong:
//! - a write-back cache may hold the newest data of blocks (dirty, acknowledged):
//!   the volume served bare returns the older data;
//! - put back later, the cache loads its old table: its clean blocks are stale
//!   where the volume was written meanwhile, and its dirty blocks, destaged,
//!   would overwrite newer writes.
//!
//! So the node records here, durably and before a cache serves, which cache
//! fronts which volume (by the backing id the cache also keeps in its
//! superblocks), and removes the record once `cache detach` has destaged and
//! emptied it. Serving a recorded volume bare is refused while the cache was
//! write-back, and drops the record otherwise; a cache whose volume has no
//! record while the file exists starts empty (refused if it holds dirty data).
//! A node with no file yet (new, or one that ran an earlier version) creates it
//! marked "first start" and trusts every table until a start has opened every
//! configured cache (the mark is cleared then): a start that fails half way
//! leaves nothing recorded that it did not open. A cache over a disk is also
//! recorded under the disk's path (as configured and resolved), checked when a
//! LUN serves a path.
//!
//! Key invariant: while a record names a volume, nothing but its cache writes to
//! it; a volume without one has no cache whose table describes it.

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The file's name in the data directory.
pub const FILE: &str = "cache-fronts.toml";

/// A cache in front of a volume.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Front {
    /// The cache's name.
    pub cache: String,
    /// Configured write-back: it may hold data the volume does not.
    pub write_back: bool,
    /// Its devices (`[[disk]]` names).
    #[serde(default)]
    pub devices: Vec<String>,
    /// For a cache over a disk: the disk's file or device, as configured and
    /// resolved, so that a LUN given that path directly is checked too.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub paths: Vec<String>,
}

#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    /// By the volume's backing id (32 hex digits).
    #[serde(default)]
    volume: BTreeMap<String, Front>,
    /// Written by a node's first start with the file, cleared once a start
    /// has opened every configured cache: until then every table is trusted.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    first_start: bool,
}

/// The record of which cache fronts which volume (see the module notes).
#[derive(Debug, Default)]
pub struct Fronts {
    /// None: not kept (no data directory; tests).
    path: Option<PathBuf>,
    file: File,
}

fn key(volume_id: u128) -> String {
    format!("{volume_id:032x}")
}

impl Fronts {
    /// Reads `DATA_DIR/cache-fronts.toml`. A node without it yet (new, or
    /// one that ran an earlier version) creates it marked as a first start,
    /// before any cache opens.
    pub fn open(data_dir: &Path) -> Result<Fronts> {
        let path = data_dir.join(FILE);
        match std::fs::read_to_string(&path) {
            Ok(s) => Ok(Fronts {
                file: toml::from_str(&s).with_context(|| format!("reading {}", path.display()))?,
                path: Some(path),
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let f = Fronts {
                    path: Some(path),
                    file: File {
                        first_start: true,
                        ..File::default()
                    },
                };
                f.save()?;
                Ok(f)
            }
            Err(e) => Err(e).with_context(|| format!("reading {}", path.display())),
        }
    }

    fn save(&self) -> Result<()> {
        let Some(path) = &self.path else {
            return Ok(());
        };
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        }
        let mut text = String::from(
            "# Which cache fronts which volume (by backing id), written by freesan: a volume\n\
             # named here is not served without its cache. See docs/0003-cache.md.\n",
        );
        text += &toml::to_string(&self.file).context("encoding the cache fronts")?;
        crate::identity::write_atomic(path, text.as_bytes())
    }

    /// Whether the volume was served without a cache since a cache's table of
    /// it was written: the record is kept and names none. (During a first
    /// start, no.)
    pub fn table_stale(&self, volume_id: u128) -> bool {
        self.path.is_some()
            && !self.file.first_start
            && !self.file.volume.contains_key(&key(volume_id))
    }

    /// Every configured cache opened: the first start, if this was one, is
    /// over, and from now on a volume without a record was served without a
    /// cache.
    pub fn opened_all(&mut self) -> Result<()> {
        if !self.file.first_start {
            return Ok(());
        }
        self.file.first_start = false;
        self.save()
    }

    /// Records, durably, that `front` (a cache) fronts the volume from now on.
    /// (A record of the same cache in front of another volume stays: nothing
    /// here proves that the devices it holds now held none of that volume's
    /// data; `cache detach`, or the operator, removes it.)
    pub fn fronting(&mut self, volume_id: u128, front: Front) -> Result<()> {
        let here = key(volume_id);
        if self.file.volume.get(&here) == Some(&front) {
            return Ok(());
        }
        self.file.volume.insert(here, front);
        self.save()
    }

    /// The cache in front of the volume was detached (destaged and emptied).
    pub fn detached(&mut self, volume_id: u128) -> Result<()> {
        if self.file.volume.remove(&key(volume_id)).is_some() {
            self.save()?;
        }
        Ok(())
    }

    /// The file or device at `paths` (as given, and resolved) is about to be
    /// served by a LUN: as [`Fronts::serving_bare`] for every disk a cache
    /// fronts under one of those paths.
    pub fn serving_path_bare(&mut self, paths: &[String]) -> Result<()> {
        let found: Vec<String> = self
            .file
            .volume
            .iter()
            .filter(|(_, f)| f.paths.iter().any(|p| paths.contains(p)))
            .map(|(k, _)| k.clone())
            .collect();
        for k in found {
            self.bare(k, &format!("file {}", paths[0]))?;
        }
        Ok(())
    }

    /// The volume `what` (a description for messages) is about to be served
    /// without a cache: refused while a write-back cache fronts it; a record of
    /// another cache is dropped (its table is stale from now on).
    pub fn serving_bare(&mut self, volume_id: u128, what: &str) -> Result<()> {
        self.bare(key(volume_id), what)
    }

    /// [`Fronts::serving_bare`] for the record under `k`.
    fn bare(&mut self, k: String, what: &str) -> Result<()> {
        let Some(f) = self.file.volume.get(&k).cloned() else {
            return Ok(());
        };
        if f.write_back {
            let file = self
                .path
                .as_deref()
                .map(|p| p.display().to_string())
                .unwrap_or_default();
            bail!(
                "{what} is fronted by write-back cache {c:?} (recorded in {file}; `freesan cache \
                 detach` removes the record): it may hold the newest data of this volume, and \
                 served without it the volume would return older data. Put the [[cache]] back \
                 (with `attached = false` it destages and detaches at start) and serve the LUN \
                 through it (`cache = {c:?}`); once detached, the volume may be served directly. \
                 If the cache's devices are lost for good, stop the node and remove the entry for \
                 volume {id} from that file to accept the loss of what only they held.",
                c = f.cache,
                id = k,
            );
        }
        tracing::warn!(volume = %what, cache = %f.cache,
            "served without the read cache that fronted it: that cache starts empty when it is put back");
        self.file.volume.remove(&k);
        self.save()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn front(cache: &str, write_back: bool) -> Front {
        Front {
            cache: cache.into(),
            write_back,
            devices: vec!["ssd0".into()],
            paths: vec![],
        }
    }

    #[test]
    fn a_volume_served_bare_leaves_its_read_cache_stale_and_refuses_if_write_back() {
        let dir = tempfile::tempdir().unwrap();
        // a node of an earlier version: no file, every table trusted
        let mut f = Fronts::open(dir.path()).unwrap();
        assert!(!f.table_stale(7));
        f.fronting(7, front("rc", false)).unwrap();
        f.fronting(8, front("wb", true)).unwrap();
        f.opened_all().unwrap();
        let mut f = Fronts::open(dir.path()).unwrap();
        assert!(!f.table_stale(7) && !f.table_stale(8));
        // a volume never cached is served bare freely
        f.serving_bare(9, "pool x").unwrap();
        // the write-back cache's volume is refused, and stays recorded
        let e = f.serving_bare(8, "pool w").unwrap_err().to_string();
        assert!(
            e.contains("write-back cache \"wb\"") && e.contains(FILE),
            "{e}"
        );
        // the read cache's record goes, durably: its table is stale from now on
        f.serving_bare(7, "pool r").unwrap();
        let f = Fronts::open(dir.path()).unwrap();
        assert!(f.table_stale(7));
        assert!(!f.table_stale(8));
        // a detach drops the record: served bare afterwards is no conflict
        let mut f = f;
        f.detached(8).unwrap();
        let mut f = Fronts::open(dir.path()).unwrap();
        f.serving_bare(8, "pool w").unwrap();
        assert!(f.table_stale(8));
        // not kept at all (no data directory): nothing is ever stale
        let mut none = Fronts::default();
        none.fronting(1, front("c", true)).unwrap();
        assert!(!none.table_stale(2));
    }

    #[test]
    fn a_first_start_that_fails_half_way_records_only_what_it_opened() {
        let dir = tempfile::tempdir().unwrap();
        let mut f = Fronts::open(dir.path()).unwrap();
        f.fronting(1, front("a", false)).unwrap();
        // cache b's open failed: the start ends here
        let mut f = Fronts::open(dir.path()).unwrap();
        assert!(!f.table_stale(2), "b is judged by a first start still");
        f.fronting(2, front("b", true)).unwrap();
        f.opened_all().unwrap();
        let f = Fronts::open(dir.path()).unwrap();
        assert!(!f.table_stale(1) && !f.table_stale(2));
        assert!(f.table_stale(3), "a cache put back later is judged");
    }

    #[test]
    fn a_node_without_caches_keeps_the_file_so_a_cache_put_back_later_is_judged() {
        let dir = tempfile::tempdir().unwrap();
        Fronts::open(dir.path()).unwrap().opened_all().unwrap();
        // a cache removed under an earlier version, put back now
        assert!(Fronts::open(dir.path()).unwrap().table_stale(5));
    }

    #[test]
    fn a_disk_a_write_back_cache_fronts_is_refused_under_its_paths_too() {
        let dir = tempfile::tempdir().unwrap();
        let mut f = Fronts::open(dir.path()).unwrap();
        let mut wb = front("c", true);
        wb.paths = vec!["/dev/disk/by-id/x".into(), "/dev/sdb".into()];
        f.fronting(3, wb).unwrap();
        f.serving_path_bare(&["/srv/other.img".into()]).unwrap();
        let e = f
            .serving_path_bare(&["/dev/disk/by-id/x".into(), "/dev/sdc".into()])
            .unwrap_err()
            .to_string();
        assert!(e.contains("file /dev/disk/by-id/x"), "{e}");
        assert!(f.serving_path_bare(&["/dev/sdb".into()]).is_err());
    }
}
