//! SANITIZE (SBC-4 5.30): wiping a whole LU before it is reused or retired.
//!
//! - OVERWRITE writes an initialization pattern (up to one block, repeated to
//!   fill each block) over every block, in 1 to 31 passes, inverted between
//!   passes when INVERT is set.
//! - BLOCK ERASE deallocates every block (thin LUs only: they read back as
//!   zeroes, LBPRZ), so VPD 0xB1 reports WABEREQ 01b.
//! - EXIT FAILURE MODE leaves the failure mode of a sanitize that failed with
//!   AUSE set. CRYPTOGRAPHIC ERASE is not offered: freesan does not encrypt.
//!
//! The operation is a job the LU owns, not the command: it goes on when the
//! command is aborted, its session ends or the LU is reset (as SBC requires),
//! and a command with IMMED waits for nothing. From its start until it ends
//! every command but INQUIRY, REPORT LUNS and REQUEST SENSE (which reports the
//! progress) answers NOT READY, SANITIZE IN PROGRESS. A job that fails leaves
//! the LU in sanitize failure mode: media access answers SANITIZE COMMAND
//! FAILED until a sanitize succeeds (or EXIT FAILURE MODE, after one with
//! AUSE).
//!
//! Key invariants: the job takes the LU's write-ordering lock exclusively, so
//! no write that began before it lands in the middle of it and none begins
//! while it runs; and a sanitize that was running when the node stopped is
//! recorded beside the LU's state file and runs again at the next start, before
//! any command sees the LU's blocks (SBC: it resumes after a power on).
//!
//! Not offered on a LU replicated to an HA partner: the partner would go on
//! serving its copy while this node sanitizes (the "in progress" state is one
//! node's), so a write acknowledged there could be overwritten here.
//!
//! The job is paced (`LunConfig::sanitize_rate_bytes_per_s`) so that wiping
//! one LU does not take the whole pool's bandwidth from the others.

use crate::cdb::{sa, Cdb};
use crate::lu::{CmdResult, Done, LogicalUnit};
use crate::sense::{codes, Sense};
use block::Bytes;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::oneshot;

/// Bytes written (or deallocated) per volume request.
const CHUNK_BYTES: u64 = 1 << 20;
/// Blocks deallocated per request of a BLOCK ERASE.
const ERASE_CHUNK_BYTES: u64 = 64 << 20;
/// Most OVERWRITE passes (the OVERWRITE COUNT field's 5 bits).
const PASSES_MAX: u8 = 31;

/// What a sanitize does; kept in the resume file while it runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "action", rename_all = "snake_case")]
pub(crate) enum Action {
    /// Write `pattern` over every block `passes` times, inverted every other
    /// pass when `invert`.
    Overwrite {
        /// The initialization pattern, at most one block long.
        pattern: Vec<u8>,
        /// 1..=31.
        passes: u8,
        /// Invert the pattern between consecutive passes.
        invert: bool,
    },
    /// Deallocate every block.
    BlockErase,
}

/// A sanitize's record in the resume file.
#[derive(Debug, Serialize, Deserialize)]
struct Resume {
    version: u32,
    ause: bool,
    #[serde(flatten)]
    action: Action,
}

/// Where a LU stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Idle,
    Running,
    /// The last sanitize failed; `ause`: EXIT FAILURE MODE may leave this.
    Failed {
        ause: bool,
    },
}

impl Phase {
    fn to_u8(self) -> u8 {
        match self {
            Phase::Idle => 0,
            Phase::Running => 1,
            Phase::Failed { ause: false } => 2,
            Phase::Failed { ause: true } => 3,
        }
    }

    fn from_u8(v: u8) -> Phase {
        match v {
            1 => Phase::Running,
            2 => Phase::Failed { ause: false },
            3 => Phase::Failed { ause: true },
            _ => Phase::Idle,
        }
    }
}

/// A LU's sanitize state: the phase, the progress of a running job, and the
/// resume file.
pub(crate) struct Sanitizer {
    /// The [`Phase`], read by every command without a lock (an atomic load on
    /// the hot path); changed only under `transition`.
    phase: AtomicU8,
    /// Serialises changes of phase (with the record's write in `begin`, which
    /// no command waits for).
    transition: Mutex<()>,
    done_bytes: AtomicU64,
    total_bytes: AtomicU64,
    /// `lunN.sanitize.json` beside the state file; None keeps nothing across
    /// restarts.
    resume_path: Option<PathBuf>,
    /// A sanitize found in the resume file at start, to run again.
    pending: Mutex<Option<(Action, bool)>>,
    /// The running job, stopped when the LU goes away (its record stays).
    job: Mutex<Option<tokio::task::AbortHandle>>,
}

impl Sanitizer {
    /// The state of a LU whose state file is `state_file`: a sanitize recorded
    /// there as running makes the LU start with it in progress (run it with
    /// [`resume`]).
    pub(crate) fn load(state_file: Option<&std::path::Path>) -> Sanitizer {
        let resume_path = state_file.map(|f| crate::statefile::beside(f, "sanitize"));
        // Some(None): a record that cannot be used
        let found = resume_path.as_deref().and_then(|p| match std::fs::read(p) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => {
                tracing::error!(path = %p.display(), error = %e,
                    "cannot read the sanitize record; the LU starts in sanitize failure mode");
                Some(None)
            }
            Ok(bytes) => match serde_json::from_slice::<Resume>(&bytes) {
                Ok(r) if r.version == 1 => Some(Some((r.action, r.ause))),
                Ok(r) => {
                    tracing::error!(path = %p.display(), version = r.version,
                        "sanitize record of an unknown version; the LU starts in sanitize failure mode");
                    Some(None)
                }
                Err(e) => {
                    tracing::error!(path = %p.display(), error = %e,
                        "unreadable sanitize record; the LU starts in sanitize failure mode");
                    Some(None)
                }
            },
        });
        let phase = match &found {
            None => Phase::Idle,
            Some(Some(_)) => Phase::Running,
            // a sanitize was running, and what it was is lost: never serve the
            // half-wiped blocks as if nothing had happened
            Some(None) => Phase::Failed { ause: false },
        };
        let pending = found.flatten();
        Sanitizer {
            phase: AtomicU8::new(phase.to_u8()),
            transition: Mutex::new(()),
            done_bytes: AtomicU64::new(0),
            total_bytes: AtomicU64::new(0),
            resume_path,
            pending: Mutex::new(pending),
            job: Mutex::new(None),
        }
    }

    fn phase(&self) -> Phase {
        Phase::from_u8(self.phase.load(Ordering::Acquire))
    }

    fn set_phase(&self, p: Phase) {
        self.phase.store(p.to_u8(), Ordering::Release);
    }

    /// Stops a running job (the LU is removed, or the node stops). Its record
    /// stays, so the next start with this state file runs it again.
    pub(crate) fn stop_job(&self) {
        if let Some(j) = self.job.lock().take() {
            j.abort();
        }
    }

    /// The fraction done, out of 65536.
    fn progress(&self) -> u16 {
        let total = self.total_bytes.load(Ordering::Relaxed).max(1);
        let done = self.done_bytes.load(Ordering::Relaxed).min(total);
        ((done as u128 * 65536) / total as u128).min(65535) as u16
    }

    /// Whether a command may run now: while a sanitize runs only INQUIRY,
    /// REPORT LUNS and REQUEST SENSE do; in failure mode media access
    /// (`media`) is refused. Err: the sense to answer with.
    pub(crate) fn gate(&self, opcode: u8, media: bool) -> Result<(), Sense> {
        use crate::cdb::op;
        match self.phase() {
            Phase::Idle => Ok(()),
            Phase::Running => match opcode {
                op::INQUIRY | op::REPORT_LUNS | op::REQUEST_SENSE => Ok(()),
                _ => Err(codes::SANITIZE_IN_PROGRESS.with_progress(self.progress())),
            },
            Phase::Failed { .. } if media => Err(codes::SANITIZE_FAILED),
            Phase::Failed { .. } => Ok(()),
        }
    }

    /// What REQUEST SENSE reports when no unit attention is pending: the
    /// progress of a running sanitize, or its failure; None otherwise.
    pub(crate) fn sense(&self) -> Option<Sense> {
        match self.phase() {
            Phase::Idle => None,
            Phase::Running => Some(codes::SANITIZE_IN_PROGRESS.with_progress(self.progress())),
            Phase::Failed { .. } => Some(codes::SANITIZE_FAILED),
        }
    }

    /// Marks a sanitize as started (and records it for a restart). Err if one
    /// runs already or it cannot be recorded.
    fn begin(&self, action: &Action, ause: bool) -> Result<(), Sense> {
        let _t = self.transition.lock();
        if self.phase() == Phase::Running {
            return Err(codes::SANITIZE_IN_PROGRESS.with_progress(self.progress()));
        }
        if let Some(p) = &self.resume_path {
            let rec = Resume {
                version: 1,
                ause,
                action: action.clone(),
            };
            let json = serde_json::to_vec(&rec).map_err(|_| codes::INTERNAL_TARGET_FAILURE)?;
            if let Err(e) = crate::statefile::write_atomic(p, &json) {
                tracing::error!(path = %p.display(), error = %e,
                    "cannot record the sanitize; not started");
                return Err(codes::INTERNAL_TARGET_FAILURE);
            }
        }
        self.done_bytes.store(0, Ordering::Relaxed);
        self.set_phase(Phase::Running);
        Ok(())
    }

    /// Ends a sanitize: Idle on success (its record removed), else failure mode.
    fn finish(&self, ok: bool, ause: bool) {
        if ok {
            if let Some(p) = &self.resume_path {
                if let Err(e) = crate::statefile::remove(p) {
                    // the next start runs the (finished) sanitize again: safe
                    tracing::warn!(path = %p.display(), error = %e,
                        "cannot remove the sanitize record");
                }
            }
        }
        let _t = self.transition.lock();
        self.set_phase(if ok {
            Phase::Idle
        } else {
            Phase::Failed { ause }
        });
    }

    fn exit_failure_mode(&self) -> Result<(), Sense> {
        let _t = self.transition.lock();
        match self.phase() {
            Phase::Failed { ause: false } => {
                Err(codes::INVALID_FIELD_IN_CDB.with_field(true, 1, Some(5)))
            }
            Phase::Failed { ause: true } => {
                self.set_phase(Phase::Idle);
                if let Some(p) = &self.resume_path {
                    let _ = crate::statefile::remove(p);
                }
                Ok(())
            }
            // nothing failed: nothing to leave
            Phase::Idle | Phase::Running => Ok(()),
        }
    }
}

/// Runs again a sanitize that was in progress when the node stopped (from
/// [`Sanitizer::load`]); nothing if there was none. Outside a tokio runtime
/// (a target built by a tool, not a node) the sanitize stays pending and the LU
/// keeps answering SANITIZE IN PROGRESS.
pub(crate) fn resume(lu: &Arc<LogicalUnit>) {
    if tokio::runtime::Handle::try_current().is_err() {
        if lu.sanitize.pending.lock().is_some() {
            tracing::error!(
                lun = lu.lun,
                "a sanitize to resume, but no runtime to run it"
            );
        }
        return;
    }
    let Some((action, ause)) = lu.sanitize.pending.lock().take() else {
        return;
    };
    tracing::warn!(
        lun = lu.lun,
        ?action,
        "a sanitize was running when the node stopped; running it again"
    );
    let (tx, _) = oneshot::channel();
    spawn_job(lu.clone(), action, ause, tx);
}

/// SANITIZE. `offered`: the LU may be sanitized (not replicated).
pub(crate) async fn sanitize(
    lu: &Arc<LogicalUnit>,
    cdb: &Cdb,
    data: &[u8],
    offered: bool,
) -> CmdResult {
    if !offered {
        return Err(codes::INVALID_OPCODE.into());
    }
    let b1 = cdb.b(1);
    let immed = b1 & 0x80 != 0;
    let ause = b1 & 0x20 != 0;
    if b1 & 0x40 != 0 {
        // ZNR: for zoned devices only
        return Err(cdb.invalid(1, Some(6)).into());
    }
    for i in 2..=6 {
        if cdb.b(i) != 0 {
            return Err(cdb.invalid(i as u16, None).into());
        }
    }
    let param_len = cdb.u16_at(7) as usize;
    let geo = lu.geometry();
    let action = match cdb.service_action() {
        sa::SANITIZE_OVERWRITE => overwrite_params(cdb, data, param_len, geo.block_size_bytes)?,
        sa::SANITIZE_BLOCK_ERASE if geo.thin => {
            if param_len != 0 {
                return Err(cdb.invalid(7, None).into());
            }
            Action::BlockErase
        }
        sa::SANITIZE_EXIT_FAILURE_MODE => {
            if param_len != 0 {
                return Err(cdb.invalid(7, None).into());
            }
            lu.sanitize.exit_failure_mode()?;
            return Ok(Done::empty());
        }
        _ => return Err(cdb.invalid(1, Some(4)).into()),
    };
    lu.check_writable()?;
    lu.sanitize.begin(&action, ause)?;
    tracing::warn!(lun = lu.lun, ?action, immed, "SANITIZE started");
    let (tx, rx) = oneshot::channel();
    spawn_job(lu.clone(), action, ause, tx);
    if immed {
        return Ok(Done::empty());
    }
    match rx.await {
        Ok(Ok(())) => Ok(Done::empty()),
        Ok(Err(s)) => Err(s.into()),
        Err(_) => Err(codes::SANITIZE_FAILED.into()),
    }
}

/// The OVERWRITE parameter list: INVERT, TEST (must be 0), OVERWRITE COUNT,
/// the pattern's length and the pattern.
fn overwrite_params(
    cdb: &Cdb,
    data: &[u8],
    param_len: usize,
    block_bytes: u32,
) -> Result<Action, Sense> {
    if param_len < 5 || param_len > 4 + block_bytes as usize {
        return Err(cdb.invalid(7, None));
    }
    if data.len() < param_len {
        return Err(codes::PARAM_LIST_LENGTH_ERROR);
    }
    let p = &data[..param_len];
    let bad = |byte: u16, bit| codes::INVALID_FIELD_IN_PARAM.with_field(false, byte, bit);
    let invert = p[0] & 0x80 != 0;
    let passes = p[0] & 0x1f;
    if p[0] & 0x60 != 0 {
        return Err(bad(0, Some(6)));
    }
    if passes == 0 || passes > PASSES_MAX {
        return Err(bad(0, Some(4)));
    }
    if p[1] != 0 {
        return Err(bad(1, None));
    }
    let pattern_len = u16::from_be_bytes([p[2], p[3]]) as usize;
    if pattern_len == 0 || pattern_len > block_bytes as usize || 4 + pattern_len != param_len {
        return Err(bad(2, None));
    }
    Ok(Action::Overwrite {
        pattern: p[4..].to_vec(),
        passes,
        invert,
    })
}

fn spawn_job(
    lu: Arc<LogicalUnit>,
    action: Action,
    ause: bool,
    done: oneshot::Sender<Result<(), Sense>>,
) {
    let sanitizer = lu.clone();
    let handle = tokio::spawn(async move {
        let r = {
            // no write that began before this lands in the middle of the job
            let _order = lu.write_order.write().await;
            let r = run(&lu, &action).await;
            match r {
                Ok(()) => lu.volume.flush().await.map_err(|e| lu.io_error(&e)),
                Err(e) => Err(e),
            }
        };
        match &r {
            Ok(()) => tracing::warn!(lun = lu.lun, ?action, "SANITIZE completed"),
            Err(s) => tracing::error!(lun = lu.lun, ?action, sense = ?s,
                "SANITIZE failed; the LU is in sanitize failure mode"),
        }
        lu.sanitize.finish(r.is_ok(), ause);
        let _ = done.send(r.map_err(|_| codes::SANITIZE_FAILED));
    });
    *sanitizer.sanitize.job.lock() = Some(handle.abort_handle());
}

/// Paces the job: after `done` bytes, waits until they took at least their
/// share of the rate.
struct Pace {
    start: tokio::time::Instant,
    bytes_per_s: u64,
}

impl Pace {
    async fn after(&self, done: u64) {
        if self.bytes_per_s == 0 {
            return;
        }
        let due = Duration::from_secs_f64(done as f64 / self.bytes_per_s as f64);
        tokio::time::sleep_until(self.start + due).await;
    }
}

async fn run(lu: &LogicalUnit, action: &Action) -> Result<(), Sense> {
    let geo = lu.geometry();
    let bs = geo.block_size_bytes as u64;
    let capacity = geo.block_count * bs;
    let s = &lu.sanitize;
    match action {
        Action::BlockErase => {
            s.total_bytes.store(capacity, Ordering::Relaxed);
            let step = (ERASE_CHUNK_BYTES / bs).max(1);
            let mut lba = 0;
            while lba < geo.block_count {
                let n = step.min(geo.block_count - lba);
                lu.volume
                    .discard(lba, n)
                    .await
                    .map_err(|e| lu.io_error(&e))?;
                lba += n;
                s.done_bytes.fetch_add(n * bs, Ordering::Relaxed);
            }
            Ok(())
        }
        Action::Overwrite {
            pattern,
            passes,
            invert,
        } => {
            s.total_bytes
                .store(capacity * *passes as u64, Ordering::Relaxed);
            // paced jobs write an eighth of a second's worth at a time
            let rate = lu.config.sanitize_rate_bytes_per_s;
            let chunk_bytes = if rate == 0 {
                CHUNK_BYTES
            } else {
                (rate / 8).min(CHUNK_BYTES)
            };
            let chunk_blocks = (chunk_bytes / bs).max(1);
            let plain = fill(pattern, bs as usize, chunk_blocks as usize, false);
            let inverted = fill(pattern, bs as usize, chunk_blocks as usize, true);
            let pace = Pace {
                start: tokio::time::Instant::now(),
                bytes_per_s: rate,
            };
            let mut done = 0u64;
            for pass in 0..*passes {
                let buf = if *invert && pass % 2 == 1 {
                    &inverted
                } else {
                    &plain
                };
                let mut lba = 0;
                while lba < geo.block_count {
                    let n = chunk_blocks.min(geo.block_count - lba);
                    lu.volume
                        .write(lba, buf.slice(..(n * bs) as usize), false)
                        .await
                        .map_err(|e| lu.io_error(&e))?;
                    lba += n;
                    done += n * bs;
                    s.done_bytes.store(done, Ordering::Relaxed);
                    pace.after(done).await;
                }
            }
            Ok(())
        }
    }
}

/// `blocks` blocks of `block_bytes`, each filled with `pattern` repeated from
/// its start (inverted when `invert`).
fn fill(pattern: &[u8], block_bytes: usize, blocks: usize, invert: bool) -> Bytes {
    let mut block = Vec::with_capacity(block_bytes);
    while block.len() < block_bytes {
        let take = pattern.len().min(block_bytes - block.len());
        block.extend(pattern[..take].iter().map(|b| if invert { !b } else { *b }));
    }
    Bytes::from(block.repeat(blocks))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pattern_is_repeated_from_the_start_of_every_block() {
        let b = fill(&[1, 2, 3], 8, 2, false);
        assert_eq!(&b[..], &[1, 2, 3, 1, 2, 3, 1, 2, 1, 2, 3, 1, 2, 3, 1, 2]);
        let i = fill(&[0xaa], 4, 1, true);
        assert_eq!(&i[..], &[0x55; 4]);
    }
}
