//! The persistent metadata of one node's copy: generations and consistency,
//! written atomically (new file, fsync, rename, fsync of the folder).

use replica_proto::Generations;
use serde::{Deserialize, Serialize};
use std::io::Write;
use std::path::{Path, PathBuf};

/// What a node knows about its copy across restarts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Meta {
    /// Id of the data this copy holds (0: none yet, a brand-new copy).
    pub current: u64,
    /// Id of the last generation held in sync with the partner.
    pub synced: u64,
    /// False while the copy is a resync target that has not finished.
    pub consistent: bool,
    /// The partner's generation when this node, as the resync source, last
    /// ended a resync (0: none). A partner that missed that end is still an
    /// unfinished target of that generation, holding everything but what its
    /// own bitmap names, and this node resumes it (see `plan::resume`).
    #[serde(default)]
    pub target_from: u64,
}

impl Meta {
    /// A brand-new copy: holds nothing the partner lacks, needs a full sync
    /// unless both copies are brand new.
    pub fn fresh() -> Meta {
        Meta {
            current: 0,
            synced: 0,
            consistent: true,
            target_from: 0,
        }
    }

    /// The generations as sent on the wire.
    pub fn gens(&self) -> Generations {
        Generations {
            current: self.current,
            synced: self.synced,
        }
    }

    /// Holds writes the partner lacks (wrote alone since the last sync).
    pub fn solo(&self) -> bool {
        self.current != self.synced
    }
}

/// The metadata file of a copy.
pub(crate) struct MetaFile {
    path: PathBuf,
}

impl MetaFile {
    pub fn new(dir: &Path) -> MetaFile {
        MetaFile {
            path: dir.join("replica.meta.json"),
        }
    }

    /// Loads the metadata; a missing file is a fresh copy.
    pub fn load(&self) -> std::io::Result<Meta> {
        match std::fs::read(&self.path) {
            Ok(b) => serde_json::from_slice(&b).map_err(|e| {
                std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!("{}: {e}", self.path.display()),
                )
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Meta::fresh()),
            Err(e) => Err(e),
        }
    }

    /// Replaces the metadata durably.
    pub fn store(&self, m: &Meta) -> std::io::Result<()> {
        let tmp = self.path.with_extension("json.new");
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(&serde_json::to_vec_pretty(m).map_err(std::io::Error::other)?)?;
        f.sync_all()?;
        drop(f);
        std::fs::rename(&tmp, &self.path)?;
        if let Some(dir) = self.path.parent() {
            std::fs::File::open(dir)?.sync_all()?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_fresh_default() {
        let d = tempfile::tempdir().unwrap();
        let f = MetaFile::new(d.path());
        assert_eq!(f.load().unwrap(), Meta::fresh());
        let m = Meta {
            current: 7,
            synced: 5,
            consistent: false,
            target_from: 3,
        };
        f.store(&m).unwrap();
        assert_eq!(f.load().unwrap(), m);
        assert!(m.solo());
        // a file written before target_from existed reads as 0
        std::fs::write(
            d.path().join("replica.meta.json"),
            br#"{"current": 9, "synced": 9, "consistent": true}"#,
        )
        .unwrap();
        assert_eq!(f.load().unwrap().target_from, 0);
    }
}
