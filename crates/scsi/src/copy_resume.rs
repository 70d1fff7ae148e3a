//! Copies that outlive a restart (issue 19): a copy command (EXTENDED COPY,
//! WRITE USING TOKEN) is recorded beside its destination LU's state file
//! (`lunN.copy.slots`, two checksummed slots written alternately:
//! [`crate::statefile::Slots`]) before its first block is written, and the record is
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
//!   was written there since. The partner undoes such a copy instead
//!   ([`crate::copy::CopyRun`], the `replica` crate's `undo.rs`).
//!
//! Records a node of the first release left in `lunN.copy.json` are moved into
//! the slots at start (see `migrate_json`) and run again the same way.
//!
//! Other copies run as before: a crash leaves each destination block either
//! as it was or as the source has it, and the initiator retries the command.
//! A copy that fails or is aborted drops its record at once: the initiator was
//! told, and may write the range itself.
//!
//! A record whose removal cannot be written (the state directory fails) would
//! be run again at the next start, over whatever the LU served since: the LU
//! answers NOT READY, MANUAL INTERVENTION REQUIRED (INQUIRY, REPORT LUNS and
//! REQUEST SENSE pass) until a retried write of the file succeeds, and the copy
//! command that ended is answered COPY TARGET DEVICE FAILURE. Sources on other
//! LUs are not held meanwhile.

use crate::cdb::op;
use crate::copy::{copy_blocks, CopyRun, Source, Status};
use crate::lu::Fail;
use crate::lu::LogicalUnit;
use crate::sense::{codes, Sense};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
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
///
/// Concurrent copies share the file's writes (group commit): a copy changes
/// the map, then waits until a write of the map at least as new as its change
/// is durable. Writes of the file are serialised, and each takes the map as it
/// is once it holds the file, so whoever writes next covers every change made
/// while the previous write ran; those changes' owners then find their version
/// durable without a write of their own. Without this each of ESXi's copy
/// commands in flight paid two file and folder syncs one after the other, on a
/// runtime worker (`examples/copyrate.rs`: recorded copies at 0.38 of
/// unrecorded ones with 4 commands in flight).
pub(crate) struct Intents {
    st: Mutex<State>,
    /// The record file (none without a state file: nothing is recorded), held
    /// while it is written, with the version of the map last made durable.
    file: Option<Mutex<(u64, crate::statefile::Slots)>>,
    /// Records found at start, not yet run again.
    found: Mutex<Vec<u64>>,
    resuming: AtomicBool,
    /// A record was removed from the map but the file still holds it (its
    /// write failed): a restart would run that copy again over whatever the
    /// LU served since, so the LU refuses commands until a write of the map
    /// succeeds (retried in the background, [`Intents::retry_removal`]).
    unremoved: AtomicBool,
    retrying: AtomicBool,
    /// Woken when `unremoved` clears.
    cleaned: tokio::sync::Notify,
    /// Tests: every write of the file fails.
    #[cfg(test)]
    fail_writes: AtomicBool,
}

/// LOGICAL UNIT NOT READY, MANUAL INTERVENTION REQUIRED: the copy records could
/// not be written.
const RECORDS_UNWRITABLE: Sense = Sense::new(crate::sense::key::NOT_READY, 0x04, 0x03);

struct State {
    next_id: u64,
    /// Bumped by every change of `copies`.
    version: u64,
    copies: BTreeMap<u64, Vec<Piece>>,
}

/// Each of the record file's two slots: room for the records of about 20 of
/// the largest copies (WRITE USING TOKEN: 64 ranges from a token of 64) or
/// hundreds of ESXi's, running at once on one LU. A copy that does not fit is
/// refused (COPY TARGET DEVICE FAILURE), logged.
const SLOT_BYTES: u64 = 256 << 10;

/// The record file of the LU whose reservation state file is `pr_state_file`:
/// `lunN.copy.slots` (see [`crate::statefile::Slots`]).
fn records_path(pr_state_file: &Path) -> PathBuf {
    crate::statefile::beside(pr_state_file, "copy").with_extension("slots")
}

/// How many copies the record file beside `pr_state_file` holds (0 when there
/// is none): what a restart would run again. For tests and diagnostics.
pub fn copy_records(pr_state_file: &Path) -> usize {
    crate::statefile::Slots::open(&records_path(pr_state_file), SLOT_BYTES)
        .1
        .and_then(|b| serde_json::from_slice::<Record>(&b).ok())
        .map_or(0, |r| r.copies.len())
}

/// Writes `json` as the record file beside `pr_state_file`: what a node killed
/// mid-copy leaves.
/// A record [`Intents::add`] has put in the map and not yet seen durable:
/// dropped armed, it is removed at once (see there).
struct Unwritten<'a> {
    intents: &'a Arc<Intents>,
    id: Option<u64>,
}

impl Unwritten<'_> {
    fn disarm(mut self) {
        self.id = None;
    }
}

impl Drop for Unwritten<'_> {
    fn drop(&mut self) {
        if let Some(id) = self.id.take() {
            self.intents.remove_now(id);
        }
    }
}

#[cfg(test)]
pub(crate) fn plant(pr_state_file: &Path, json: &[u8]) {
    let (mut slots, _) = crate::statefile::Slots::open(&records_path(pr_state_file), SLOT_BYTES);
    slots.write(json).expect("planting a copy record");
}

/// The records of a node that ran the first release of copy records, which
/// kept them in `lunN.copy.json` (the same JSON, rewritten whole per change):
/// when the slots hold nothing, that file's records are written into them
/// (durably) and become what was `found`; the old file is removed once the
/// slots hold what it held, so a crash in between finds them in one place or
/// the other, never neither. When the slots were written after it (they hold
/// anything, even no copy), they are the newer and the old file only goes. An
/// unreadable old file is logged and left (it is never run).
fn migrate_json(
    pr_state_file: &Path,
    slots: &mut crate::statefile::Slots,
    found: Option<Vec<u8>>,
) -> Option<Vec<u8>> {
    let old = crate::statefile::beside(pr_state_file, "copy");
    let bytes = match std::fs::read(&old) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return found,
        Err(e) => {
            tracing::error!(file = %old.display(), error = %e, "unreadable copy records, left");
            return found;
        }
    };
    let found = match found {
        // the slots were written after the old file: they are the newer
        Some(f) => f,
        None => {
            if let Err(e) = serde_json::from_slice::<Record>(&bytes) {
                tracing::error!(file = %old.display(), error = %e, "unreadable copy records, left");
                return None;
            }
            match slots.write(&bytes) {
                Ok(()) => {
                    tracing::info!(file = %old.display(), "copy records moved to their slots")
                }
                // they still run now, but are not recorded: a crash before
                // they end leaves their ranges as a copy that was not recorded
                // would. The old file goes all the same, so that no later
                // start runs them again over what the LU served since.
                Err(e) => tracing::error!(
                    file = %old.display(),
                    error = %e,
                    "copy records not moved to their slots; run without a record"
                ),
            }
            bytes
        }
    };
    if let Err(e) = std::fs::remove_file(&old) {
        tracing::warn!(file = %old.display(), error = %e, "old copy record file not removed");
    }
    Some(found)
}

pub(crate) fn hex(naa: &[u8; 16]) -> String {
    naa.iter().map(|b| format!("{b:02x}")).collect()
}

impl Intents {
    /// The records beside `state_file` (none without one).
    pub(crate) fn load(state_file: Option<&std::path::Path>) -> Arc<Intents> {
        let (slots, found) = match state_file {
            Some(f) => {
                let (mut slots, found) =
                    crate::statefile::Slots::open(&records_path(f), SLOT_BYTES);
                let found = migrate_json(f, &mut slots, found);
                (Some(slots), found)
            }
            None => (None, None),
        };
        let rec: Record = found
            .and_then(|b| match serde_json::from_slice(&b) {
                Ok(r) => Some(r),
                Err(e) => {
                    tracing::error!(file = ?state_file, error = %e, "unreadable copy records, ignored");
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
        Arc::new(Intents {
            resuming: AtomicBool::new(!found.is_empty()),
            unremoved: AtomicBool::new(false),
            retrying: AtomicBool::new(false),
            cleaned: tokio::sync::Notify::new(),
            #[cfg(test)]
            fail_writes: AtomicBool::new(false),
            st: Mutex::new(State {
                next_id: map.len() as u64,
                version: 0,
                copies: map,
            }),
            file: slots.map(|s| Mutex::new((0, s))),
            found: Mutex::new(found),
        })
    }

    /// NOT READY while copies found at start run again (see the module doc),
    /// and while a removed record is still on file ([`Intents::unremoved`]).
    pub(crate) fn gate(&self, opcode: u8) -> Result<(), Sense> {
        let unremoved = self.unremoved.load(Ordering::Acquire);
        if !unremoved && !self.resuming.load(Ordering::Acquire) {
            return Ok(());
        }
        match opcode {
            op::INQUIRY | op::REPORT_LUNS | op::REQUEST_SENSE => Ok(()),
            _ if unremoved => Err(RECORDS_UNWRITABLE),
            _ => Err(BECOMING_READY),
        }
    }

    /// Makes the map durable up to at least `version` (see the struct's doc).
    /// Blocking: a write and an `fdatasync`.
    fn persist(&self, version: u64) -> std::io::Result<()> {
        let Some(file) = &self.file else {
            return Ok(());
        };
        let mut file = file.lock();
        let (durable, slots) = &mut *file;
        if *durable >= version {
            return Ok(());
        }
        #[cfg(test)]
        if self.fail_writes.load(Ordering::Acquire) {
            return Err(std::io::Error::other("injected write failure"));
        }
        let (now, rec) = {
            let st = self.st.lock();
            let rec = Record {
                copies: st.copies.values().cloned().collect(),
            };
            (st.version, rec)
        };
        let bytes = serde_json::to_vec(&rec).map_err(std::io::Error::other)?;
        slots.write(&bytes)?;
        *durable = now;
        Ok(())
    }

    /// [`Intents::persist`] on the blocking pool.
    async fn persist_async(self: &Arc<Self>, version: u64) -> std::io::Result<()> {
        let me = self.clone();
        match tokio::task::spawn_blocking(move || me.persist(version)).await {
            Ok(r) => r,
            Err(e) => Err(std::io::Error::other(e)),
        }
    }

    /// Changes the map; returns the version that holds the change.
    fn change(&self, f: impl FnOnce(&mut State)) -> u64 {
        let mut st = self.st.lock();
        f(&mut st);
        st.version += 1;
        st.version
    }

    /// Adds a copy's record; returns once it is durable. Dropped before then
    /// (its command aborted while the record is written), the record is
    /// removed again before the drop returns: the file write under way still
    /// lands, and a record nobody removes would run a copy that never ran at
    /// the next start, over what the initiator wrote since.
    async fn add(self: &Arc<Self>, pieces: Vec<Piece>) -> std::io::Result<u64> {
        let mut id = 0;
        let version = self.change(|st| {
            id = st.next_id;
            st.next_id += 1;
            st.copies.insert(id, pieces);
        });
        let unwritten = Unwritten {
            intents: self,
            id: Some(id),
        };
        if let Err(e) = self.persist_async(version).await {
            // a write that did succeed meanwhile may hold it: write it out
            // (the copy is refused, so it must not run again at the next start)
            let v = self.change(|st| {
                st.copies.remove(&id);
            });
            let _ = self.persist_async(v).await;
            unwritten.disarm();
            return Err(e);
        }
        unwritten.disarm();
        Ok(id)
    }

    /// Removes a copy's record; returns once that is durable.
    async fn remove(self: &Arc<Self>, id: u64) -> std::io::Result<()> {
        let mut removed = false;
        let version = self.change(|st| removed = st.copies.remove(&id).is_some());
        if removed {
            if let Err(e) = self.persist_async(version).await {
                self.removal_failed(&e);
                return Err(e);
            }
        }
        Ok(())
    }

    /// [`Intents::remove`] where nothing can wait (a copy's future dropped
    /// mid-way, its command aborted): the removal is durable before this returns,
    /// so before the abort is answered.
    fn remove_now(self: &Arc<Self>, id: u64) {
        let mut removed = false;
        let version = self.change(|st| removed = st.copies.remove(&id).is_some());
        if removed {
            if let Err(e) = self.persist(version) {
                self.removal_failed(&e);
            }
        }
    }

    /// The id the next record gets: the records below it were made before now.
    pub(crate) fn cut(&self) -> u64 {
        self.st.lock().next_id
    }

    /// Removes, durably, the records made before `cut` of copies that a
    /// reset (or the LU's removal) stopped: every one (`src` None: this LU,
    /// their destination, was reset) or those reading the LU named `src`.
    /// Those copies stop at their next batch and drop their records then,
    /// but the reset is answered before: a crash in between ran them again
    /// at the next start, over what the initiator wrote after the answer
    /// (review of 2026-12-06). A removal that cannot be written refuses the
    /// LU as [`Intents::remove`]'s does.
    pub(crate) async fn retire(self: &Arc<Self>, cut: u64, src: Option<&str>) {
        let mut removed = 0;
        let version = self.change(|st| {
            st.copies.retain(|&id, pieces| {
                let stopped = id < cut
                    && src.is_none_or(|n| pieces.iter().any(|p| p.src.as_deref() == Some(n)));
                removed += usize::from(stopped);
                !stopped
            });
        });
        if removed == 0 {
            return;
        }
        tracing::info!(
            records = removed,
            "copy: the restart records of copies a reset stopped are removed"
        );
        if let Err(e) = self.persist_async(version).await {
            self.removal_failed(&e);
        }
    }

    /// A removal did not reach the file: the LU is refused until a write of
    /// the map does (see [`Intents::unremoved`]).
    fn removal_failed(self: &Arc<Self>, e: &std::io::Error) {
        tracing::error!(
            error = %e,
            "could not remove a copy record; the LU is refused until its record file can be written"
        );
        // under the map's lock, as the retry task clears both (see there)
        let start = {
            let _st = self.st.lock();
            self.unremoved.store(true, Ordering::Release);
            !self.retrying.swap(true, Ordering::AcqRel)
        };
        if start {
            self.retry_removal();
        }
    }

    /// Writes the map again, backing off from 50 ms to 5 s between tries,
    /// until a write of the map as it stands succeeds; then lets commands in.
    /// One such task at a time (`retrying`, set by the caller). The flags are
    /// cleared under the map's lock and only when no change came after the
    /// map written: a removal that fails meanwhile changed the map first, so
    /// it is written by the next turn of this loop, never left on file with
    /// the LU taking commands.
    fn retry_removal(self: &Arc<Self>) {
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            // (no runtime: the LU stays refused; nothing can retry)
            return;
        };
        let me = self.clone();
        rt.spawn(async move {
            let mut wait = std::time::Duration::from_millis(50);
            loop {
                let version = me.st.lock().version;
                match me.persist_async(version).await {
                    Ok(()) => {
                        let st = me.st.lock();
                        if st.version == version {
                            me.unremoved.store(false, Ordering::Release);
                            me.retrying.store(false, Ordering::Release);
                            break;
                        }
                        continue;
                    }
                    Err(e) => tracing::warn!(error = %e, "copy record file still unwritable"),
                }
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(std::time::Duration::from_secs(5));
            }
            me.cleaned.notify_waiters();
            tracing::info!("copy record file written again; the LU takes commands");
        });
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
    pub(crate) async fn start(
        dst: &'a LogicalUnit,
        pieces: &[(From<'_>, u64, u64)],
        own: bool,
    ) -> Result<Recorded<'a>, Fail> {
        let none = Recorded { dst, id: None };
        if !own || dst.intents.file.is_none() || dst.pr_replication.read().is_some() {
            return Ok(none);
        }
        let mut out = Vec::with_capacity(pieces.len());
        for (from, dst_lba, blocks) in pieces {
            let (src, src_lba) = match from {
                From::Lu(s, lba) => {
                    // a source range on the destination LU that a destination
                    // range overlaps: running it again would read moved data
                    if std::ptr::eq(Arc::as_ptr(s), dst)
                        && pieces.iter().any(|(_, d, n)| {
                            // (not range-checked yet: saturating, and a
                            // range past the end fails in copy_blocks)
                            *d < lba.saturating_add(*blocks) && *lba < d.saturating_add(*n)
                        })
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
        match dst.intents.add(out).await {
            Ok(id) => Ok(Recorded { dst, id: Some(id) }),
            Err(e) => {
                tracing::error!(lun = dst.lun, error = %e, "copy: could not record the copy");
                Err(codes::COPY_TARGET_FAILURE.into())
            }
        }
    }

    /// The copy succeeded: its data is made durable, then its record goes
    /// (durably, before the command is answered: a record outliving its copy
    /// would overwrite what the initiator writes to the range afterwards).
    pub(crate) async fn done(mut self) -> Result<(), Fail> {
        let Some(id) = self.id else {
            return Ok(());
        };
        self.dst.volume.flush().await.map_err(|e| {
            tracing::error!(lun = self.dst.lun, error = %e, "copy: flushing the destination failed");
            Fail::from(codes::COPY_TARGET_FAILURE)
        })?;
        self.id = None;
        // still on file: a restart would run it again, so the LU is refused
        // until it is not (see Intents::unremoved), and the command fails
        self.dst.intents.remove(id).await.map_err(|_| {
            tracing::error!(
                lun = self.dst.lun,
                "copy done, but its record could not be removed"
            );
            Fail::from(codes::COPY_TARGET_FAILURE)
        })?;
        Ok(())
    }
}

impl Drop for Recorded<'_> {
    /// A copy that failed or was aborted: its record goes at once (the
    /// initiator is told and may write the range itself).
    fn drop(&mut self) {
        if let Some(id) = self.id.take() {
            self.dst.intents.remove_now(id);
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
            let pieces = lu
                .intents
                .st
                .lock()
                .copies
                .get(&id)
                .cloned()
                .unwrap_or_default();
            tracing::warn!(
                lun = lu.lun,
                ranges = pieces.len(),
                "a copy was running when the node stopped; running it again"
            );
            let status = Status::default();
            let run = CopyRun::new();
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
                if let Err(e) =
                    copy_blocks(&run, src, &lu, p.dst_lba, p.blocks, &status, None).await
                {
                    tracing::error!(lun = lu.lun, error = ?e, "copy to finish failed; the range is left as it is");
                    ok = false;
                }
            }
            if let Err(e) = lu.volume.flush().await {
                tracing::error!(lun = lu.lun, error = %e, "copy to finish: flush failed");
                ok = false;
            }
            if let Err(e) = run.end().await {
                tracing::error!(lun = lu.lun, error = ?e, "copy to finish: ending it failed");
                ok = false;
            }
            if ok {
                tracing::info!(lun = lu.lun, "copy finished");
            }
            // a failure is logged and keeps the LU refused (Intents::unremoved)
            let _ = lu.intents.remove(id).await;
        }
        lu.intents.resuming.store(false, Ordering::Release);
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn piece(i: u64) -> Piece {
        Piece {
            src: Some("60".repeat(16)),
            src_lba: i,
            dst_lba: 1000 + i,
            blocks: 8,
        }
    }

    fn on_file(pr: &Path) -> Vec<u64> {
        let (_, found) = crate::statefile::Slots::open(&records_path(pr), SLOT_BYTES);
        let rec: Record = serde_json::from_slice(&found.unwrap_or_default()).unwrap_or_default();
        rec.copies.iter().map(|c| c[0].src_lba).collect()
    }

    /// Concurrent copies share the record file's writes; each add and each
    /// removal is on the file when it returns, whatever write carried it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn each_change_is_durable_when_it_returns() {
        let dir = crate::tests::TempDir::new("intents");
        let pr = dir.path().join("lun0.pr.json");
        let intents = Intents::load(Some(&pr));
        let tasks: Vec<_> = (0..16u64)
            .map(|i| {
                let (intents, pr) = (intents.clone(), pr.clone());
                tokio::spawn(async move {
                    let id = intents.add(vec![piece(i)]).await.unwrap();
                    assert!(on_file(&pr).contains(&i), "copy {i} not on file once added");
                    tokio::task::yield_now().await;
                    intents.remove(id).await.unwrap();
                    assert!(!on_file(&pr).contains(&i), "copy {i} on file once removed");
                })
            })
            .collect();
        for t in tasks {
            t.await.unwrap();
        }
        assert_eq!(copy_records(&pr), 0);
        // found again at a restart: what was on file
        intents.add(vec![piece(99)]).await.unwrap();
        drop(intents);
        let again = Intents::load(Some(&pr));
        assert_eq!(again.found.lock().len(), 1);
        assert!(again.gate(op::READ_10).is_err());
    }

    /// A copy whose command is aborted while its record is being written
    /// leaves no record behind (the write under way still lands; a later
    /// write of the map must not carry it on).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_add_dropped_while_its_record_is_written_leaves_none() {
        let dir = crate::tests::TempDir::new("intents-dropped");
        let pr = dir.path().join("lun0.pr.json");
        let intents = Intents::load(Some(&pr));
        let mut add = Box::pin(intents.add(vec![piece(5)]));
        assert!(
            !block::poll_once(&mut add),
            "the record was written at once"
        );
        drop(add);
        // a later copy comes and goes: the map is written out again
        let id = intents.add(vec![piece(6)]).await.unwrap();
        intents.remove(id).await.unwrap();
        assert!(
            on_file(&pr).is_empty(),
            "a restart would run the dropped copy: {:?}",
            on_file(&pr)
        );
        drop(intents);
        assert!(Intents::load(Some(&pr)).found.lock().is_empty());
    }

    /// A removal that does not reach the file leaves a record a restart would
    /// run again: the LU is refused (NOT READY, MANUAL INTERVENTION REQUIRED)
    /// until a retried write of the file succeeds, and then takes commands.
    #[tokio::test]
    async fn a_record_that_could_not_be_removed_refuses_the_lu_until_written() {
        let dir = crate::tests::TempDir::new("intents-unremoved");
        let pr = dir.path().join("lun0.pr.json");
        let intents = Intents::load(Some(&pr));
        let id = intents.add(vec![piece(7)]).await.unwrap();
        intents.fail_writes.store(true, Ordering::Release);
        assert!(intents.remove(id).await.is_err());
        assert_eq!(on_file(&pr), vec![7], "the failed removal left the record");
        let refused = intents.gate(op::WRITE_10).unwrap_err();
        assert_eq!((refused.key, refused.asc, refused.ascq), (0x02, 0x04, 0x03));
        assert!(intents.gate(op::READ_10).is_err());
        assert!(intents.gate(op::INQUIRY).is_ok());
        // the retries keep failing while the file cannot be written
        tokio::task::yield_now().await;
        assert!(intents.gate(op::READ_10).is_err());
        // once it can, the record goes and the LU takes commands
        let cleaned = intents.cleaned.notified();
        tokio::pin!(cleaned);
        cleaned.as_mut().enable();
        intents.fail_writes.store(false, Ordering::Release);
        if intents.unremoved.load(Ordering::Acquire) {
            tokio::time::timeout(std::time::Duration::from_secs(30), cleaned)
                .await
                .expect("the retry wrote the record file");
        }
        assert!(on_file(&pr).is_empty());
        assert!(intents.gate(op::WRITE_10).is_ok());
    }
}
