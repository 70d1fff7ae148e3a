//! Copies that outlive a restart (issue 19): a copy command (EXTENDED COPY,
//! WRITE USING TOKEN) is recorded beside its destination LU's state file
//! (`lunN.copy.json`) before its first block is written, and the record is
//! removed once it ends (after a flush of the destination when it succeeded).
//! A record found at start is run again, whole, before any command sees the
//! destination's blocks: until then the LU answers NOT READY, LOGICAL UNIT IS
//! IN PROCESS OF BECOMING READY (INQUIRY, REPORT LUNS and REQUEST SENSE pass).
//! So a SIGKILL or a power loss in the middle of a copy leaves every range of
//! it copied once the node is back, never half of one.
//!
//! Running a copy again is the same as running it to its end only when its
//! source has not changed, which holds at start: no command reached the LUs
//! since. What is recorded is therefore limited to copies that can be run
//! again from what this LU's target holds alone:
//! - every source and the destination are LUs of the command's target (not of
//!   another target of the node, which may start later or not at all);
//! - one destination LU, the one whose file holds the record;
//! - no source range overlaps a destination range (a copy within one LU whose
//!   ranges overlap moved data it would read again);
//! - the destination is not replicated to an HA partner: the partner serves it
//!   while this node is down, so a copy run again here would overwrite what
//!   was written there since.
//!
//! Other copies run as before: a crash leaves each destination block either
//! as it was or as the source has it, and the initiator retries the command.
//! A copy that fails or is aborted drops its record at once: the initiator was
//! told, and may write the range itself.

use crate::cdb::op;
use crate::copy::{copy_blocks, Source, Status};
use crate::lu::Fail;
use crate::lu::LogicalUnit;
use crate::sense::{codes, Sense};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// LOGICAL UNIT NOT READY, IN PROCESS OF BECOMING READY.
const BECOMING_READY: Sense = Sense::new(crate::sense::key::NOT_READY, 0x04, 0x01);

/// One range of a copy: `blocks` blocks from the source LU (by NAA; none for
/// zeroes) at `src_lba` to the destination at `dst_lba`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Piece {
    pub src: Option<String>,
    pub src_lba: u64,
    pub dst_lba: u64,
    pub blocks: u64,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct Record {
    /// The copies running (or found at start), each its ranges in order.
    copies: Vec<Vec<Piece>>,
}

/// The copy records of one LU (the destination).
pub(crate) struct Intents {
    path: Option<PathBuf>,
    st: Mutex<(u64, BTreeMap<u64, Vec<Piece>>)>,
    /// Records found at start, not yet run again.
    found: Mutex<Vec<u64>>,
    resuming: AtomicBool,
}

fn hex(naa: &[u8; 16]) -> String {
    naa.iter().map(|b| format!("{b:02x}")).collect()
}

impl Intents {
    /// The records beside `state_file` (none without one).
    pub(crate) fn load(state_file: Option<&std::path::Path>) -> Intents {
        let path = state_file.map(|f| crate::statefile::beside(f, "copy"));
        let rec: Record = path
            .as_deref()
            .and_then(|p| match std::fs::read(p) {
                Ok(b) => match serde_json::from_slice(&b) {
                    Ok(r) => Some(r),
                    Err(e) => {
                        tracing::error!(file = %p.display(), error = %e, "unreadable copy record, ignored");
                        None
                    }
                },
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
                Err(e) => {
                    tracing::error!(file = %p.display(), error = %e, "unreadable copy record, ignored");
                    None
                }
            })
            .unwrap_or_default();
        let map: BTreeMap<u64, Vec<Piece>> = rec
            .copies
            .into_iter()
            .filter(|c| !c.is_empty())
            .enumerate()
            .map(|(i, c)| (i as u64, c))
            .collect();
        let found: Vec<u64> = map.keys().copied().collect();
        Intents {
            path,
            resuming: AtomicBool::new(!found.is_empty()),
            st: Mutex::new((map.len() as u64, map)),
            found: Mutex::new(found),
        }
    }

    /// NOT READY while copies found at start run again (see the module doc).
    pub(crate) fn gate(&self, opcode: u8) -> Result<(), Sense> {
        if !self.resuming.load(Ordering::Acquire) {
            return Ok(());
        }
        match opcode {
            op::INQUIRY | op::REPORT_LUNS | op::REQUEST_SENSE => Ok(()),
            _ => Err(BECOMING_READY),
        }
    }

    /// Writes the file with the copies in `map` (removes it when none).
    fn save(&self, map: &BTreeMap<u64, Vec<Piece>>) -> std::io::Result<()> {
        let Some(p) = &self.path else {
            return Ok(());
        };
        if map.is_empty() {
            return crate::statefile::remove(p);
        }
        let rec = Record {
            copies: map.values().cloned().collect(),
        };
        let bytes = serde_json::to_vec(&rec).map_err(std::io::Error::other)?;
        crate::statefile::write_atomic(p, &bytes)
    }

    fn add(&self, pieces: Vec<Piece>) -> std::io::Result<u64> {
        let mut st = self.st.lock();
        let id = st.0;
        st.0 += 1;
        st.1.insert(id, pieces);
        if let Err(e) = self.save(&st.1) {
            st.1.remove(&id);
            return Err(e);
        }
        Ok(id)
    }

    fn drop_record(&self, id: u64) {
        let mut st = self.st.lock();
        if st.1.remove(&id).is_some() {
            if let Err(e) = self.save(&st.1) {
                tracing::error!(error = %e, "could not remove a copy record");
            }
        }
    }
}

/// A source of a copy's range, as [`plan`] takes it.
pub(crate) enum From<'a> {
    Lu(&'a Arc<LogicalUnit>, u64),
    Zeros,
}

/// A copy onto `dst`, recorded when it can be run again after a restart (see
/// the module doc). Its record goes when it is dropped; [`Recorded::done`]
/// flushes the destination first.
pub(crate) struct Recorded<'a> {
    dst: &'a LogicalUnit,
    id: Option<u64>,
}

impl<'a> Recorded<'a> {
    /// Records the copy of `pieces` onto `dst` if it qualifies (`own`: every
    /// source is an LU of the command's target). Err only when it qualified
    /// and could not be recorded.
    pub(crate) fn start(
        dst: &'a LogicalUnit,
        pieces: &[(From<'_>, u64, u64)],
        own: bool,
    ) -> Result<Recorded<'a>, Fail> {
        let none = Recorded { dst, id: None };
        if !own || dst.intents.path.is_none() || dst.pr_replication.read().is_some() {
            return Ok(none);
        }
        let mut out = Vec::with_capacity(pieces.len());
        for (from, dst_lba, blocks) in pieces {
            let (src, src_lba) = match from {
                From::Lu(s, lba) => {
                    // a source range on the destination LU that a destination
                    // range overlaps: running it again would read moved data
                    if std::ptr::eq(Arc::as_ptr(s), dst)
                        && pieces
                            .iter()
                            .any(|(_, d, n)| *d < lba + blocks && *lba < d + n)
                    {
                        return Ok(none);
                    }
                    (Some(hex(&s.config.naa)), *lba)
                }
                From::Zeros => (None, 0),
            };
            out.push(Piece {
                src,
                src_lba,
                dst_lba: *dst_lba,
                blocks: *blocks,
            });
        }
        match dst.intents.add(out) {
            Ok(id) => Ok(Recorded { dst, id: Some(id) }),
            Err(e) => {
                tracing::error!(lun = dst.lun, error = %e, "copy: could not record the copy");
                Err(codes::COPY_TARGET_FAILURE.into())
            }
        }
    }

    /// The copy succeeded: its data is made durable, then its record goes.
    pub(crate) async fn done(self) -> Result<(), Fail> {
        if self.id.is_some() {
            self.dst.volume.flush().await.map_err(|e| {
                tracing::error!(lun = self.dst.lun, error = %e, "copy: flushing the destination failed");
                Fail::from(codes::COPY_TARGET_FAILURE)
            })?;
        }
        Ok(())
    }
}

impl Drop for Recorded<'_> {
    fn drop(&mut self) {
        if let Some(id) = self.id.take() {
            self.dst.intents.drop_record(id);
        }
    }
}

/// Runs again the copies found beside `lu`'s state file at start, with the
/// LUs of its target `luns` as sources, then lets commands reach it.
pub(crate) fn resume(lu: &Arc<LogicalUnit>, luns: &[Arc<LogicalUnit>]) {
    let found = std::mem::take(&mut *lu.intents.found.lock());
    if found.is_empty() {
        return;
    }
    if tokio::runtime::Handle::try_current().is_err() {
        tracing::error!(lun = lu.lun, "copies to finish, but no runtime to run them");
        *lu.intents.found.lock() = found;
        return;
    }
    let (lu, luns) = (lu.clone(), luns.to_vec());
    tokio::spawn(async move {
        for id in found {
            let pieces = lu.intents.st.lock().1.get(&id).cloned().unwrap_or_default();
            tracing::warn!(
                lun = lu.lun,
                ranges = pieces.len(),
                "a copy was running when the node stopped; running it again"
            );
            let status = Status::default();
            let mut ok = true;
            for p in &pieces {
                let src = match &p.src {
                    None => Some(Source::Zeros),
                    Some(naa) => luns
                        .iter()
                        .find(|l| hex(&l.config.naa) == *naa)
                        .map(|l| Source::Lu(l, p.src_lba)),
                };
                let Some(src) = src else {
                    tracing::error!(lun = lu.lun, source = ?p.src, "copy to finish: its source LU is gone; the range is left as it is");
                    ok = false;
                    continue;
                };
                if let Err(e) = copy_blocks(src, &lu, p.dst_lba, p.blocks, &status).await {
                    tracing::error!(lun = lu.lun, error = ?e, "copy to finish failed; the range is left as it is");
                    ok = false;
                }
            }
            if let Err(e) = lu.volume.flush().await {
                tracing::error!(lun = lu.lun, error = %e, "copy to finish: flush failed");
                ok = false;
            }
            if ok {
                tracing::info!(lun = lu.lun, "copy finished");
            }
            lu.intents.drop_record(id);
        }
        lu.intents.resuming.store(false, Ordering::Release);
    });
}
