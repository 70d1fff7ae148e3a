//! The persistent metadata of one node's copy: generations and consistency,
//! written atomically (new file, fsync, rename, fsync of the folder).

use replica_proto::Generations;
use serde::{Deserialize, Serialize};
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
    /// The copy was changed by a resync, or failed under a write, since it was
    /// last consistent: it may lack acknowledged data (never kept by the
    /// operator: `ReplicatedVolume::keep_copy`). A file written before this
    /// existed reads as partial: nothing tells.
    #[serde(default = "partial_unknown")]
    pub partial: bool,
}

fn partial_unknown() -> bool {
    true
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
            partial: false,
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

    /// Marks the copy changed in part (a resync's first change, a failed
    /// write): not consistent, and never kept by the operator. False when it
    /// was so already (nothing to store).
    pub fn mark_partial(&mut self) -> bool {
        let was = (self.consistent, self.partial);
        self.consistent = false;
        self.partial = true;
        was != (false, true)
    }

    /// A new generation id: random, never 0 (no data) nor `not`.
    pub fn new_generation(not: u64) -> u64 {
        loop {
            let g: u64 = rand::random();
            if g != 0 && g != not {
                return g;
            }
        }
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
        block::durable::replace_file(
            &self.path,
            &serde_json::to_vec_pretty(m).map_err(std::io::Error::other)?,
        )
    }
}

/// The numbers of a node's requests to the witness: each above every one
/// this node sent before, across restarts, whatever the clock does. The
/// witness refuses a number not above the last it took from the node (a
/// replayed request); numbered from the clock alone, a node whose clock
/// stepped back across its restart was refused until the clock passed its
/// old numbers, and could not claim the grant to serve alone meanwhile.
/// The last number is stored durably before its request is sent (requests
/// are rare: claims when deciding, releases when back in sync), so numbers
/// never run ahead of the clock by more than the clock stepped back.
pub(crate) struct SeqFile {
    path: PathBuf,
    last: u64,
}

impl SeqFile {
    /// Opens the record in `dir` (none yet: from 0). A damaged record is
    /// replaced by the clock's numbers, with a warning: the witness then
    /// refuses this node only if its clock is behind the numbers it sent.
    pub fn open(dir: &Path) -> std::io::Result<SeqFile> {
        let path = dir.join("witness.seq");
        let last = match std::fs::read_to_string(&path) {
            Ok(s) => s.trim().parse::<u64>().unwrap_or_else(|e| {
                tracing::warn!(file = %path.display(), "witness request number unreadable ({e}): numbering from the clock");
                0
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => 0,
            Err(e) => {
                return Err(std::io::Error::new(
                    e.kind(),
                    format!("{}: {e}", path.display()),
                ))
            }
        };
        Ok(SeqFile { path, last })
    }

    /// The next number, stored before it is returned: the clock's `now`
    /// (microseconds) when it is ahead of every earlier one, else one more
    /// than the last.
    /// The write and its syncs run on a blocking thread, not on the async
    /// worker that asks.
    pub async fn next(&mut self, now: u64) -> std::io::Result<u64> {
        let after = self.last.checked_add(1).ok_or_else(|| {
            std::io::Error::other(format!("{}: numbers exhausted", self.path.display()))
        })?;
        let seq = now.max(after);
        let path = self.path.clone();
        // skipping a number costs nothing; storing two at once would race on
        // the temporary file (a write left running by a caller that gave up,
        // and the next one): the writes take turns, and one that finds a
        // higher number stored leaves it
        self.last = seq;
        static WRITING: std::sync::Mutex<()> = std::sync::Mutex::new(());
        tokio::task::spawn_blocking(move || {
            let _turn = WRITING.lock().unwrap_or_else(|p| p.into_inner());
            let stored = std::fs::read_to_string(&path)
                .ok()
                .and_then(|s| s.trim().parse::<u64>().ok());
            if stored.is_some_and(|n| n >= seq) {
                return Ok(());
            }
            block::durable::replace_file(&path, seq.to_string().as_bytes())
                .map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", path.display())))
        })
        .await
        .map_err(|e| std::io::Error::other(format!("{}: {e}", self.path.display())))??;
        Ok(seq)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A clock that steps back across a restart (or runs backwards while
    /// the node runs) never yields a number at or below an earlier one.
    #[tokio::test]
    async fn witness_numbers_rise_across_restarts_whatever_the_clock() {
        let d = tempfile::tempdir().unwrap();
        let mut s = SeqFile::open(d.path()).unwrap();
        assert_eq!(s.next(5_000_000_000).await.unwrap(), 5_000_000_000);
        assert_eq!(s.next(4_000_000_000).await.unwrap(), 5_000_000_001);
        drop(s);
        // restarted with the clock an hour and more behind
        let mut s = SeqFile::open(d.path()).unwrap();
        let n = s.next(1_000_000).await.unwrap();
        assert!(n > 5_000_000_001, "{n}");
        assert!(s.next(1_000_001).await.unwrap() > n);
        drop(s);
        let mut s = SeqFile::open(d.path()).unwrap();
        assert!(s.next(0).await.unwrap() > n + 1);
        // a clock far ahead is followed
        assert_eq!(s.next(u64::MAX / 2).await.unwrap(), u64::MAX / 2);
        // numbers do not run ahead of the clock across restarts
        drop(s);
        let d = tempfile::tempdir().unwrap();
        let mut s = SeqFile::open(d.path()).unwrap();
        assert_eq!(s.next(7_000).await.unwrap(), 7_000);
        drop(s);
        let mut s = SeqFile::open(d.path()).unwrap();
        assert_eq!(s.next(9_000).await.unwrap(), 9_000);
        // a damaged record: numbered from the clock
        std::fs::write(d.path().join("witness.seq"), b"garbage").unwrap();
        let mut s = SeqFile::open(d.path()).unwrap();
        assert_eq!(s.next(10_000).await.unwrap(), 10_000);
        // the last number there is: an error, not a repeat
        std::fs::write(d.path().join("witness.seq"), u64::MAX.to_string()).unwrap();
        let mut s = SeqFile::open(d.path()).unwrap();
        assert!(s.next(1).await.is_err());
    }

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
            partial: true,
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
        let old = f.load().unwrap();
        assert_eq!(old.target_from, 0);
        assert!(old.partial, "an older file cannot say its copy is whole");
    }

    #[test]
    fn marking_partial_says_whether_anything_changed() {
        let mut m = Meta::fresh();
        assert!(m.mark_partial());
        assert!(!m.consistent && m.partial);
        assert!(!m.mark_partial());
        for _ in 0..100 {
            let g = Meta::new_generation(7);
            assert!(g != 0 && g != 7);
        }
    }
}
