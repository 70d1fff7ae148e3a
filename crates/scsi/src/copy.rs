//! Copy offload inside the target (SPC-4 third-party copy, LID1): EXTENDED COPY with
//! identification CSCD descriptors (0xE4, naming an LU by its NAA) and block-to-block
//! segment descriptors (0x02), as VMware's VAAI "full copy" sends them; RECEIVE COPY
//! RESULTS (COPY STATUS, OPERATING PARAMETERS); the Third-party Copy VPD page (0x8F).
//!
//! Where the data goes: from one LU of the target the command arrived at to another
//! (or the same), through each LU's own volume, so a copy onto a RAID pool, a cache
//! or a replicated LUN is as durable as a WRITE there: each chunk is written like a
//! WRITE, FUA when the destination runs with its write cache disabled, under the
//! destination's write-ordering lock shared. A copy target outside this target is
//! not reachable (COPY ABORTED): an initiator can only copy between LUs it could
//! read and write itself, and the reservation and ALUA checks of a READ on the
//! source and a WRITE on the destination apply to the copy.
//!
//! Bounds: at most [`CSCD_MAX`] CSCD and [`SEGMENTS_MAX`] segment descriptors in
//! [`DESC_LIST_MAX`] bytes, 65535 blocks a segment, [`CONCURRENT_MAX`] copies running
//! per target and [`CONCURRENT_PER_INITIATOR_MAX`] per initiator (more wait),
//! [`CHUNKS_IN_FLIGHT`] chunks of [`CHUNK_BYTES`] in memory per copy, and
//! [`HELD_MAX`] held copy statuses per target (a finished one goes first: the requester's own, else the busiest port's;
//! a copy waiting for its turn is held, in progress, so that its list identifier
//! sent again meanwhile is OPERATION IN PROGRESS: more than [`HELD_MAX`] are held
//! only while that many copy commands wait, which the sessions' command windows
//! bound).
//! A copy stops between chunks when its command is aborted; what it wrote stays
//! written (each chunk is whole), and its status says "completed with errors".
//! Overlapping ranges on one LU are copied as by memmove.
//!
//! Windows' ODX (POPULATE TOKEN, WRITE USING TOKEN, RECEIVE ROD TOKEN INFORMATION)
//! lives in [`crate::odx`] and runs on the same machinery: the chunk engine
//! ([`copy_blocks`]), the access checks ([`check_access`]), the concurrency bound and
//! the held statuses (keyed by I_T nexus and a LID1 or LID4 list identifier).

use crate::cdb::{op, param_u16, param_u32, param_u64, Cdb};
use crate::lu::{CmdResult, Done, Fail, LogicalUnit};
use crate::odx;
use crate::pr::Access;
use crate::rw::check_range;
use crate::sense::{codes, Sense};
use crate::ItNexus;
use block::Bytes;
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU16, AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;

/// Most CSCD (target) descriptors in one EXTENDED COPY.
pub(crate) const CSCD_MAX: u16 = 8;
/// Most segment descriptors in one EXTENDED COPY.
pub(crate) const SEGMENTS_MAX: u16 = 16;
/// Most bytes of CSCD plus segment descriptors.
pub(crate) const DESC_LIST_MAX: u32 = 1024;
/// Copies running at once per target.
pub(crate) const CONCURRENT_MAX: u16 = 8;
/// Copies running at once per initiator on a target: one host's copies
/// cannot hold every slot while the others' wait (and time out).
pub(crate) const CONCURRENT_PER_INITIATOR_MAX: u16 = CONCURRENT_MAX / 2;
/// Copy statuses held per target for RECEIVE COPY RESULTS.
pub(crate) const HELD_MAX: usize = 64;
/// Bytes read and written at a time.
pub(crate) const CHUNK_BYTES: u64 = 1 << 20;
/// Chunks of one copy read, then written concurrently (`copy_blocks`). A copy
/// onto a RAID 5 pool of simulated HDDs moved 282 MB/s one chunk at a time
/// with 4 commands in flight (the members seek between the commands' regions
/// for every 1 MiB) and 690-730 MB/s with four (`examples/copyrate.rs --dst
/// raid5`), as fast as the host's 4 MiB writes; single 4 MiB chunks did as
/// well there but cost a fifth of a copy between RAM-backed LUs (a 1 MiB chunk
/// stays in the CPU's cache between its read and its write), so a copy goes
/// one chunk at a time until a write has to wait.
pub(crate) const CHUNKS_IN_FLIGHT: usize = 4;

const HEADER_LEN: usize = 16;
const CSCD_LEN: usize = 32;
const CSCD_IDENT: u8 = 0xe4;
const SEG_B2B: u8 = 0x02;
const SEG_B2B_LEN: usize = 28;
/// Descriptor type codes this copy manager implements.
const IMPLEMENTED: [u8; 2] = [SEG_B2B, CSCD_IDENT];

/// RECEIVE COPY RESULTS service actions.
const SA_COPY_STATUS: u8 = 0x00;
const SA_OPERATING_PARAMETERS: u8 = 0x03;

/// COPY MANAGER STATUS values (ODX reports them with its own codes, see
/// [`crate::odx`]).
pub(crate) const IN_PROGRESS: u8 = 0x00;
pub(crate) const DONE_OK: u8 = 0x01;
pub(crate) const DONE_ERR: u8 = 0x02;

/// Progress of one copy, as COPY STATUS and RECEIVE ROD TOKEN INFORMATION report it.
#[derive(Default)]
pub(crate) struct Status {
    pub state: AtomicU8,
    pub segments: AtomicU16,
    pub bytes: AtomicU64,
    /// What only the ROD token commands report.
    pub detail: Mutex<Detail>,
}

/// The outcome of a POPULATE TOKEN or WRITE USING TOKEN beyond its progress.
#[derive(Default)]
pub(crate) struct Detail {
    /// The service action that started it.
    pub service_action: u8,
    /// Its status byte and sense, once it ended in an error.
    pub failure: Option<(u8, Option<Sense>)>,
    /// The ROD token POPULATE TOKEN created.
    pub token: Option<Box<[u8; odx::TOKEN_LEN]>>,
    /// Block size of the LU written (transfer counts are in its blocks).
    pub block_size: u32,
    /// WRITE USING TOKEN: the token held less than the ranges asked for.
    pub residual: bool,
}

/// A list identifier: LID1 commands (EXTENDED COPY LID1) and LID4 ones (the ROD
/// token commands) are separate name spaces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ListId {
    Lid1(u8),
    Lid4(u32),
}

struct Held {
    initiator_port: Arc<str>,
    /// With the initiator port, the I_T nexus the copy belongs to: one
    /// initiator port (an open-iscsi interface gives all its sessions one
    /// ISID) reaches the target through several target ports, each a nexus
    /// of its own (review of 2026-12-06: keyed by the initiator port alone,
    /// one path's logout dropped every path's statuses and unread tokens).
    relative_port_id: u16,
    list_id: ListId,
    status: Arc<Status>,
}

impl Held {
    fn of(&self, nexus: &ItNexus) -> bool {
        *self.initiator_port == *nexus.initiator_port
            && self.relative_port_id == nexus.relative_port_id
    }
}

/// The copies of one target: the concurrency bound, the held statuses and the ROD
/// tokens.
pub(crate) struct Copies {
    pub(crate) slots: tokio::sync::Semaphore,
    /// Copies running (holding a slot or waiting for one) per initiator name.
    running: Mutex<std::collections::HashMap<Arc<str>, u16>>,
    /// Told when an initiator's copy ends (one of its others may start).
    ended: tokio::sync::Notify,
    held: Mutex<VecDeque<Held>>,
    pub(crate) tokens: odx::Tokens,
}

/// A copy's place: its initiator's share (counted from the moment it is
/// taken, given back on drop, also while still waiting for a slot), then
/// one of the target's slots.
pub(crate) struct Slot<'a> {
    copies: &'a Copies,
    initiator: Arc<str>,
    permit: Option<tokio::sync::SemaphorePermit<'a>>,
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        self.copies.leave(&self.initiator);
    }
}

impl Copies {
    /// One of the target's copy slots, held while a copy runs; an initiator
    /// with [`CONCURRENT_PER_INITIATOR_MAX`] copies running waits for one of
    /// them to end first, so that it never holds the others' slots.
    pub(crate) async fn slot(&self, nexus: &ItNexus) -> Result<Slot<'_>, Fail> {
        let initiator = nexus.initiator_name.clone();
        loop {
            let ended = self.ended.notified();
            tokio::pin!(ended);
            ended.as_mut().enable();
            {
                let mut r = self.running.lock();
                let n = r.entry(initiator.clone()).or_insert(0);
                if *n < CONCURRENT_PER_INITIATOR_MAX {
                    *n += 1;
                    break;
                }
            }
            ended.await;
        }
        // counted from here: given back if the wait below is dropped (an abort)
        let mut slot = Slot {
            copies: self,
            initiator,
            permit: None,
        };
        slot.permit = Some(
            self.slots
                .acquire()
                .await
                .map_err(|_| Fail::from(codes::INTERNAL_TARGET_FAILURE))?,
        );
        Ok(slot)
    }

    fn leave(&self, initiator: &Arc<str>) {
        let mut r = self.running.lock();
        if let Some(n) = r.get_mut(initiator) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                r.remove(initiator);
            }
        }
        drop(r);
        self.ended.notify_waiters();
    }
}

/// The parameter list of a copy command (its length at CDB bytes 10-13, cut to
/// what arrived); None when it is empty: nothing to do.
pub(crate) fn param_list<'a>(cdb: &Cdb, data_out: &'a [u8]) -> Option<&'a [u8]> {
    let param_len = cdb.u32_at(10) as usize;
    (param_len != 0).then(|| &data_out[..data_out.len().min(param_len)])
}

impl Default for Copies {
    fn default() -> Self {
        Copies {
            slots: tokio::sync::Semaphore::new(CONCURRENT_MAX as usize),
            running: Mutex::new(std::collections::HashMap::new()),
            ended: tokio::sync::Notify::new(),
            held: Mutex::new(VecDeque::new()),
            tokens: odx::Tokens::default(),
        }
    }
}

impl Copies {
    /// The nexus is gone: its held statuses go with it.
    pub fn nexus_lost(&self, nexus: &ItNexus) {
        self.held.lock().retain(|h| !h.of(nexus));
    }

    pub(crate) fn find(&self, nexus: &ItNexus, list_id: ListId) -> Option<Arc<Status>> {
        self.held
            .lock()
            .iter()
            .find(|h| h.of(nexus) && h.list_id == list_id)
            .map(|h| h.status.clone())
    }

    /// Registers a copy under `list_id`; Err if one with that id is still running.
    pub(crate) fn start(&self, nexus: &ItNexus, list_id: ListId) -> Result<Arc<Status>, Sense> {
        let mut held = self.held.lock();
        if let Some(i) = held
            .iter()
            .position(|h| h.of(nexus) && h.list_id == list_id)
        {
            if held[i].status.state.load(Ordering::Acquire) == IN_PROGRESS {
                return Err(codes::OPERATION_IN_PROGRESS);
            }
            held.remove(i);
        }
        if held.len() >= HELD_MAX {
            // A finished one (none when every held copy runs or waits): the
            // requester's own oldest, else the oldest of the initiator port
            // holding the most (finished or not). One host issuing copies
            // does not push the others' results out before they read them.
            let count = |port: &str| held.iter().filter(|h| *h.initiator_port == *port).count();
            let victim = held
                .iter()
                .enumerate()
                .filter(|(_, h)| h.status.state.load(Ordering::Acquire) != IN_PROGRESS)
                .min_by_key(|(i, h)| {
                    let own = *h.initiator_port == *nexus.initiator_port;
                    (!own, std::cmp::Reverse(count(&h.initiator_port)), *i)
                })
                .map(|(i, _)| i);
            if let Some(i) = victim {
                held.remove(i);
            }
        }
        let status = Arc::new(Status::default());
        held.push_back(Held {
            initiator_port: nexus.initiator_port.clone(),
            relative_port_id: nexus.relative_port_id,
            list_id,
            status: status.clone(),
        });
        Ok(status)
    }

    fn forget(&self, status: &Arc<Status>) {
        self.held.lock().retain(|h| !Arc::ptr_eq(&h.status, status));
    }
}

/// Marks the status finished with errors unless the copy got to its end (covers an
/// aborted command, whose future is dropped between chunks).
pub(crate) struct Finish<'a> {
    pub status: Option<&'a Status>,
    pub ok: bool,
}

impl Drop for Finish<'_> {
    fn drop(&mut self) {
        if let Some(s) = self.status {
            s.state
                .store(if self.ok { DONE_OK } else { DONE_ERR }, Ordering::Release);
        }
    }
}

/// One block-to-block segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Segment {
    src: u16,
    dst: u16,
    blocks: u16,
    src_lba: u64,
    dst_lba: u64,
}

/// An identification CSCD descriptor: the designator and the disk block length.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Cscd {
    /// (association and designator type byte, designator).
    designator: (u8, Vec<u8>),
    block_len: u32,
}

/// A parsed parameter list.
#[derive(Debug, PartialEq, Eq)]
struct CopyList {
    list_id: u8,
    /// LIST ID USAGE: 00b hold the status, 10b do not hold it, 11b no list id.
    usage: u8,
    cscds: Vec<Cscd>,
    segments: Vec<Segment>,
}

fn param_error(byte: usize) -> Sense {
    codes::INVALID_FIELD_IN_PARAM.with_field(false, byte as u16, None)
}

/// Parses and checks an EXTENDED COPY (LID1) parameter list (SPC-4 6.4.3).
fn parse(p: &[u8]) -> Result<CopyList, Sense> {
    if p.len() < HEADER_LEN {
        return Err(codes::PARAM_LIST_LENGTH_ERROR);
    }
    let list_id = p[0];
    let usage = (p[1] >> 3) & 0x03;
    if usage == 0x01 {
        return Err(param_error(1));
    }
    let cscd_len = param_u16(p, 2) as usize;
    let seg_len = param_u32(p, 8) as usize;
    let inline_len = param_u32(p, 12) as usize;
    if cscd_len + seg_len > DESC_LIST_MAX as usize {
        return Err(codes::PARAM_LIST_LENGTH_ERROR);
    }
    if HEADER_LEN + cscd_len + seg_len + inline_len > p.len() {
        return Err(codes::PARAM_LIST_LENGTH_ERROR);
    }
    if inline_len != 0 {
        // MAXIMUM INLINE DATA LENGTH is 0.
        return Err(param_error(12));
    }
    let cscd_area = &p[HEADER_LEN..HEADER_LEN + cscd_len];
    if !cscd_len.is_multiple_of(CSCD_LEN) {
        return Err(codes::PARAM_LIST_LENGTH_ERROR);
    }
    if cscd_len / CSCD_LEN > CSCD_MAX as usize {
        return Err(codes::TOO_MANY_TARGET_DESCRIPTORS);
    }
    let mut cscds = Vec::with_capacity(cscd_len / CSCD_LEN);
    for (i, d) in cscd_area.chunks_exact(CSCD_LEN).enumerate() {
        let at = HEADER_LEN + i * CSCD_LEN;
        if d[0] != CSCD_IDENT {
            return Err(codes::UNSUPPORTED_TARGET_DESCRIPTOR.with_field(false, at as u16, None));
        }
        // Byte 1: LU ID TYPE (ignored in SPC-4), NUL (obsolete), device type.
        if d[1] & 0x1f != 0 {
            return Err(param_error(at + 1));
        }
        let len = (d[7] as usize).min(20);
        cscds.push(Cscd {
            designator: (d[5] & 0x3f, d[8..8 + len].to_vec()),
            block_len: u32::from_be_bytes([0, d[29], d[30], d[31]]),
        });
    }
    let seg_start = HEADER_LEN + cscd_len;
    let seg_area = &p[seg_start..seg_start + seg_len];
    let mut segments = Vec::new();
    let mut off = 0;
    while off < seg_area.len() {
        let d = &seg_area[off..];
        if d.len() < 4 {
            return Err(codes::PARAM_LIST_LENGTH_ERROR);
        }
        let len = 4 + param_u16(d, 2) as usize;
        if segments.len() == SEGMENTS_MAX as usize {
            return Err(codes::TOO_MANY_SEGMENT_DESCRIPTORS);
        }
        let at = seg_start + off;
        if d[0] != SEG_B2B {
            return Err(codes::UNSUPPORTED_SEGMENT_DESCRIPTOR.with_field(false, at as u16, None));
        }
        if len != SEG_B2B_LEN {
            return Err(param_error(at + 2));
        }
        if d.len() < len {
            return Err(codes::PARAM_LIST_LENGTH_ERROR);
        }
        // Byte 1: DC (the count is in destination blocks) and CAT; both LUs must
        // have one block size, so DC changes nothing and CAT has nothing to keep.
        segments.push(Segment {
            src: param_u16(d, 4),
            dst: param_u16(d, 6),
            blocks: param_u16(d, 10),
            src_lba: param_u64(d, 12),
            dst_lba: param_u64(d, 20),
        });
        off += len;
    }
    Ok(CopyList {
        list_id,
        usage,
        cscds,
        segments,
    })
}

/// The node's other targets an EXTENDED COPY may reach, as its transport
/// decides: those the command's initiator could log in to with what its session
/// proved (their ACL, their CHAP). Which of their LUs the copy then reaches is
/// their own masking.
pub trait CopyReach: Send + Sync + 'static {
    /// The targets besides the one `nexus` goes to whose LUs its copies may name.
    fn targets(&self, nexus: &ItNexus) -> Vec<Arc<crate::ScsiTarget>>;
}

/// The LUs an EXTENDED COPY may name: those of its target its initiator sees,
/// and those of the node's other targets it may reach ([`CopyReach`]).
pub(crate) struct CopyLus<'a> {
    pub own: Vec<Arc<LogicalUnit>>,
    pub foreign: Vec<Arc<LogicalUnit>>,
    /// The other targets reached (whose ROD tokens WRITE USING TOKEN may use).
    pub reached: Vec<Arc<crate::ScsiTarget>>,
    /// Whether the command's initiator sees an LU now (of another target:
    /// true), as `own` and `foreign` said at the start: asked again before
    /// each batch, so that a host group or ACL changed while a copy runs
    /// stops it.
    pub sees: &'a Sees<'a>,
}

/// See [`CopyLus::sees`].
pub(crate) type Sees<'a> = dyn Fn(&LogicalUnit, bool) -> bool + Sync + 'a;

/// The LU a CSCD names: an LU designator (association 00b) of type NAA equal to an
/// LU's, among `lus`; true when it is another target's.
fn resolve(cscd: &Cscd, lus: &CopyLus) -> Option<(Arc<LogicalUnit>, bool)> {
    let (assoc_type, value) = &cscd.designator;
    if *assoc_type != 0x03 {
        return None;
    }
    let named = |l: &&Arc<LogicalUnit>| l.config.naa[..] == value[..];
    let (lu, foreign) = match lus.own.iter().find(named) {
        Some(l) => (l, false),
        None => (lus.foreign.iter().find(named)?, true),
    };
    let bs = lu.geometry().block_size_bytes;
    (cscd.block_len == 0 || cscd.block_len == bs).then(|| (lu.clone(), foreign))
}

/// The checks a READ(16) (`write` false) or WRITE(16) through `nexus` would pass,
/// on an LU of its own target. On an LU of another target (`foreign`), which
/// `nexus` does not go to, the same, except that the LU must be under no
/// reservation at all: its holder and registrants are nexuses of that target,
/// and one of this target can carry the same initiator port and relative port
/// id (open-iscsi gives one ISID to all of an interface's sessions). Every
/// portal serves every target, so the relative port id names that target's
/// port there for the ALUA check.
pub(crate) fn check_access(
    lu: &LogicalUnit,
    nexus: &ItNexus,
    write: bool,
    foreign: bool,
) -> Result<(), Fail> {
    let mut cdb = [0u8; 16];
    cdb[0] = if write { op::WRITE_16 } else { op::READ_16 };
    let parsed = Cdb::parse(&cdb).map_err(Fail::from)?;
    // an LU finishing a copy recorded before a restart serves no copy either:
    // written now, its recorded copy would overwrite this one after it was
    // answered; read, it would give half of the recorded one
    if lu.alua.check(nexus.relative_port_id, &parsed).is_err()
        || lu.stopped.load(Ordering::Relaxed)
        || lu.intents.gate(cdb[0]).is_err()
    {
        return Err(codes::COPY_TARGET_NOT_REACHABLE.into());
    }
    let conflict = match foreign {
        false => lu.pr.check(nexus, &cdb) == Access::Conflict,
        true => lu.pr.reserved(),
    };
    if conflict {
        return Err(Fail::Conflict);
    }
    if write {
        lu.check_writable()?;
    }
    Ok(())
}

/// One copy command's writes, numbered for [`block::Volume::write_copy`]: a
/// replicated destination's partner keeps what they overwrite, to undo the copy
/// if this node is lost before it ends. [`CopyRun::end`] tells every destination
/// written that the copy ended, before the command is answered; a run dropped
/// without it (a failed or aborted copy) tells them from a task of its own.
pub(crate) struct CopyRun {
    id: u64,
    dsts: Mutex<Vec<block::VolumeRef>>,
    /// The LUs the copy reads or writes (by address) and their reset counts
    /// when it started (see [`LogicalUnit::resets`]).
    resets: Mutex<Vec<(usize, u64)>>,
}

impl CopyRun {
    pub(crate) fn new() -> CopyRun {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        CopyRun {
            id: NEXT.fetch_add(1, Ordering::Relaxed),
            dsts: Mutex::new(Vec::new()),
            resets: Mutex::new(Vec::new()),
        }
    }

    /// Notes `lu`'s reset count now, unless noted before: the copy stops at
    /// its next batch once the LU was reset since ([`Self::reset_since`]).
    /// Called for every LU of a copy before its first block moves.
    pub(crate) fn watch(&self, lu: &LogicalUnit) {
        let at = lu as *const LogicalUnit as usize;
        let mut r = self.resets.lock();
        if !r.iter().any(|(x, _)| *x == at) {
            r.push((at, lu.resets.load(Ordering::Acquire)));
        }
    }

    /// Whether `lu` was reset since the copy noted it (COPY ABORTED then);
    /// notes it if it was not.
    fn reset_since(&self, lu: &LogicalUnit) -> Result<(), Fail> {
        self.watch(lu);
        let at = lu as *const LogicalUnit as usize;
        let now = lu.resets.load(Ordering::Acquire);
        if self.resets.lock().iter().any(|&(x, n)| x == at && n != now) {
            tracing::warn!(
                lun = lu.lun,
                "copy: stopped by a reset of a logical unit it reads or writes"
            );
            return Err(codes::COPY_ABORTED.into());
        }
        Ok(())
    }

    fn writes_to(&self, v: &block::VolumeRef) {
        let mut d = self.dsts.lock();
        let p = Arc::as_ptr(v) as *const ();
        if !d.iter().any(|x| Arc::as_ptr(x) as *const () == p) {
            d.push(v.clone());
        }
    }

    /// The copy ended: every destination it wrote lets go of what it kept.
    /// Every destination is told, even after one failed.
    pub(crate) async fn end(self) -> Result<(), Fail> {
        let dsts = std::mem::take(&mut *self.dsts.lock());
        let mut r = Ok(());
        for v in dsts {
            if let Err(e) = v.copy_end(self.id).await {
                tracing::error!(copy = self.id, error = %e, "copy: ending the copy on its destination failed");
                r = Err(Fail::from(codes::COPY_TARGET_FAILURE));
            }
        }
        r
    }
}

impl Drop for CopyRun {
    fn drop(&mut self) {
        let dsts = std::mem::take(&mut *self.dsts.lock());
        if dsts.is_empty() {
            return;
        }
        let id = self.id;
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                for v in dsts {
                    if let Err(e) = v.copy_end(id).await {
                        tracing::warn!(copy = id, error = %e, "copy: ending a failed copy on its destination failed");
                    }
                }
            });
        }
    }
}

/// Where the data of [`copy_blocks`] comes from.
#[derive(Clone, Copy)]
pub(crate) enum Source<'a> {
    /// Blocks of an LU from this LBA on.
    Lu(&'a LogicalUnit, u64),
    /// Zeroes (the block device zero ROD token).
    Zeros,
}

/// The initiator a copy runs for. Its chunks pass the checks a READ and a WRITE
/// of that nexus would ([`check_access`]), batch by batch, under the LUs'
/// write-ordering locks: a reservation taken from it while the copy runs (a
/// PREEMPT AND ABORT, which waits for those locks before it answers) stops the
/// copy before its next batch. The checks once at the start let a fenced
/// initiator's copy go on writing after the fence had answered. `None`: a copy
/// resumed at start, which no initiator runs.
#[derive(Clone, Copy)]
pub(crate) struct Through<'a> {
    pub nexus: &'a ItNexus,
    pub src_foreign: bool,
    pub dst_foreign: bool,
    /// [`CopyLus::sees`].
    pub sees: &'a Sees<'a>,
}

impl Through<'_> {
    /// [`check_access`] as a command through the nexus would pass it now,
    /// visibility included.
    fn check(&self, lu: &LogicalUnit, write: bool) -> Result<(), Fail> {
        let foreign = if write {
            self.dst_foreign
        } else {
            self.src_foreign
        };
        if !(self.sees)(lu, foreign) {
            return Err(codes::COPY_TARGET_NOT_REACHABLE.into());
        }
        check_access(lu, self.nexus, write, foreign)
    }
}

/// Whether `blocks` blocks from `src` fit at `dst_lba` of `dst`: both ranges
/// inside their LUs (COPY ABORTED otherwise) and the block sizes equal (COPY
/// TARGET DEVICE NOT REACHABLE otherwise).
fn segment_fits(src: Source<'_>, dst: &LogicalUnit, dst_lba: u64, blocks: u64) -> Result<(), Fail> {
    let dg = dst.geometry();
    if let Source::Lu(s, src_lba) = src {
        let sg = s.geometry();
        if sg.block_size_bytes != dg.block_size_bytes {
            return Err(codes::COPY_TARGET_NOT_REACHABLE.into());
        }
        if check_range(&sg, src_lba, blocks).is_err() {
            return Err(codes::COPY_ABORTED.into());
        }
    }
    if check_range(&dg, dst_lba, blocks).is_err() {
        return Err(codes::COPY_ABORTED.into());
    }
    Ok(())
}

/// The chunk engine of every copy: `blocks` blocks from `src` to `dst` at `dst_lba`,
/// chunk by chunk, each chunk written like a WRITE (FUA when the destination's write
/// cache is off, under its write-ordering lock shared), counting bytes into `status`.
/// An LU being sanitized (or in sanitize failure mode) is neither read nor written:
/// the copy stops with COPY TARGET DEVICE NOT REACHABLE.
/// Overlapping ranges of one LU are copied as by memmove. Both ranges must be inside
/// their LUs (COPY ABORTED otherwise) and the block sizes equal.
pub(crate) async fn copy_blocks(
    run: &CopyRun,
    src: Source<'_>,
    dst: &LogicalUnit,
    dst_lba: u64,
    blocks: u64,
    status: &Status,
    through: Option<Through<'_>>,
) -> Result<(), Fail> {
    let dg = dst.geometry();
    let bs = dg.block_size_bytes as u64;
    let mut chunk = (CHUNK_BYTES / bs).min(dg.max_io_blocks.max(1) as u64);
    let mut backwards = false;
    segment_fits(src, dst, dst_lba, blocks)?;
    if let Source::Lu(s, src_lba) = src {
        chunk = chunk.min(s.geometry().max_io_blocks.max(1) as u64);
        // memmove: a destination that overlaps the source from above is copied backwards.
        backwards = std::ptr::eq(s, dst) && dst_lba > src_lba && dst_lba < src_lba + blocks;
    }
    let chunk = chunk.max(1);
    // One zeroed chunk serves every zero write (a Bytes clone shares it).
    let zeros = match src {
        Source::Zeros => Bytes::from(vec![0u8; (chunk.min(blocks) * bs) as usize]),
        Source::Lu(..) => Bytes::new(),
    };
    let mut done = 0u64;
    // Chunks a batch takes: one while the destination completes each write at
    // once (page cache, tmpfs: the chunk stays in the CPU's cache between its
    // read and its write), CHUNKS_IN_FLIGHT once a write waits (disks: writes
    // in flight together spare the members' seeks). Learned per destination
    // across copies: ESXi's commands are only four chunks each.
    let mut batch_len = dst
        .copy_batch
        .load(Ordering::Relaxed)
        .clamp(1, CHUNKS_IN_FLIGHT);
    while done < blocks {
        // up to batch_len chunks read, in copy order, then written together:
        // no write of the batch lands on a range a later read of it needs
        // (memmove order holds batch by batch)
        let mut batch = Vec::with_capacity(batch_len);
        let mut read = done;
        while batch.len() < batch_len && read < blocks {
            let n = chunk.min(blocks - read);
            let off = if backwards { blocks - read - n } else { read };
            let data = match src {
                Source::Lu(s, src_lba) => {
                    // held shared while reading, so that a SANITIZE (which sets its
                    // phase, then takes the lock exclusively) never runs under the read
                    let _order = s.write_order.read().await;
                    if s.sanitize.gate(op::READ_16, true).is_err() {
                        return Err(codes::COPY_TARGET_NOT_REACHABLE.into());
                    }
                    run.reset_since(s)?;
                    if let Some(t) = &through {
                        t.check(s, false)?;
                    }
                    s.volume.read(src_lba + off, n as u32).await.map_err(|e| {
                        tracing::error!(lun = s.lun, error = %e, "copy: reading the source failed");
                        Fail::from(codes::COPY_TARGET_FAILURE)
                    })?
                }
                Source::Zeros => zeros.slice(..(n * bs) as usize),
            };
            batch.push((off, data));
            read += n;
        }
        let fua = dst.force_fua();
        run.writes_to(&dst.volume);
        let order = dst.write_order.clone().read_owned().await;
        if dst.sanitize.gate(op::WRITE_16, true).is_err() {
            return Err(codes::COPY_TARGET_NOT_REACHABLE.into());
        }
        let copying = dst.copy_writes.clone().read_owned().await;
        run.reset_since(dst)?;
        if let Some(t) = &through {
            t.check(dst, true)?;
        }
        // The batch's writes run to their end, under the write order, even if
        // the copy is dropped (its command aborted, a PREEMPT AND ABORT): a
        // write handed to a disk, a cache or a replica still lands, and must
        // not land after the abort is answered, over the initiator's next
        // write (see `block::detach`).
        let (volume, id) = (dst.volume.clone(), run.id);
        let (results, waited) = block::detach::detached(async move {
            let _order = (order, copying);
            let writes: Vec<block::BoxFut<'static, block::BlockResult<u64>>> = batch
                .into_iter()
                .map(
                    |(off, data)| -> block::BoxFut<'static, block::BlockResult<u64>> {
                        let volume = volume.clone();
                        Box::pin(async move {
                            let len = data.len() as u64;
                            volume.write_copy(id, dst_lba + off, data, fua).await?;
                            Ok(len)
                        })
                    },
                )
                .collect();
            // each polled once here: those that finish at once are done, the
            // rest are waited for together
            let mut results = Vec::with_capacity(writes.len());
            let mut waiting = Vec::new();
            for mut w in writes {
                match block::poll_now(&mut w) {
                    Some(r) => results.push(r),
                    None => waiting.push(w),
                }
            }
            let waited = !waiting.is_empty();
            results.extend(block::join_all(waiting).await);
            (results, waited)
        })
        .await;
        let learned = if waited { CHUNKS_IN_FLIGHT } else { 1 };
        if learned != batch_len {
            batch_len = learned;
            dst.copy_batch.store(learned, Ordering::Relaxed);
        }
        // each chunk counts in the status once it is written
        let mut failed = None;
        for r in results {
            match r {
                Ok(len) => {
                    status.bytes.fetch_add(len, Ordering::Relaxed);
                }
                Err(e) => failed = failed.or(Some(e)),
            }
        }
        if let Some(e) = failed {
            tracing::error!(lun = dst.lun, error = %e, "copy: writing the destination failed");
            return Err(Fail::from(codes::COPY_TARGET_FAILURE));
        }
        done = read;
    }
    Ok(())
}

/// Operation code 83h received through `lu` of a target whose LUs (those `nexus`
/// sees) are `lus`: EXTENDED COPY (LID1) here, POPULATE TOKEN and WRITE USING TOKEN
/// in [`crate::odx`].
pub(crate) async fn extended_copy(
    copies: &Copies,
    lu: &LogicalUnit,
    lus: &CopyLus<'_>,
    nexus: &ItNexus,
    cdb: &Cdb,
    data_out: &[u8],
) -> CmdResult {
    match cdb.service_action() {
        0x00 => {}
        odx::SA_POPULATE_TOKEN => {
            return odx::populate_token(copies, lu, &lus.own, nexus, cdb, data_out).await
        }
        odx::SA_WRITE_USING_TOKEN => {
            return odx::write_using_token(copies, lu, lus, nexus, cdb, data_out).await
        }
        _ => return Err(cdb.invalid(1, Some(4)).into()),
    }
    let Some(p) = param_list(cdb, data_out) else {
        return Ok(Done::empty());
    };
    let list = parse(p)?;
    // registered before waiting for a slot: the same list identifier sent
    // again meanwhile is OPERATION IN PROGRESS, not a second copy
    let status = match list.usage {
        0x03 => None,
        _ => Some(copies.start(nexus, ListId::Lid1(list.list_id))?),
    };
    let mut finish = Finish {
        status: status.as_deref(),
        ok: false,
    };
    let _slot = copies.slot(nexus).await?;
    let lu_of = |index: u16| -> Result<(Arc<LogicalUnit>, bool), Fail> {
        list.cscds
            .get(index as usize)
            .and_then(|c| resolve(c, lus))
            .ok_or_else(|| Fail::from(codes::COPY_TARGET_NOT_REACHABLE))
    };
    // every segment resolved and checked before any block moves, so that the
    // copy can be recorded whole (crate::copy_resume)
    let mut plan = Vec::with_capacity(list.segments.len());
    let mut own = true;
    // (from here: a reset of an LU the copy reads or writes stops it)
    let run = CopyRun::new();
    for seg in &list.segments {
        let (src, src_foreign) = lu_of(seg.src)?;
        let (dst, dst_foreign) = lu_of(seg.dst)?;
        run.watch(&src);
        run.watch(&dst);
        check_access(&src, nexus, false, src_foreign)?;
        check_access(&dst, nexus, true, dst_foreign)?;
        own &= !src_foreign && !dst_foreign;
        // (review of 2026-12-06: a segment past its LU was found only when
        // its turn came, after the segments before it were written)
        segment_fits(
            Source::Lu(&src, seg.src_lba),
            &dst,
            seg.dst_lba,
            u64::from(seg.blocks),
        )?;
        let through = Through {
            nexus,
            src_foreign,
            dst_foreign,
            sees: lus.sees,
        };
        plan.push((src, dst, seg, through));
    }
    // recorded when one destination LU takes every segment
    let one_dst = plan
        .first()
        .map(|(_, d, _, _)| d.clone())
        .filter(|d| plan.iter().all(|(_, x, _, _)| Arc::ptr_eq(x, d)));
    let pieces: Vec<_> = plan
        .iter()
        .map(|(src, _, seg, _)| {
            (
                crate::copy_resume::From::Lu(src, seg.src_lba),
                seg.dst_lba,
                u64::from(seg.blocks),
            )
        })
        .collect();
    let recorded = match &one_dst {
        Some(d) => Some(crate::copy_resume::Recorded::start(d, &pieces, own).await?),
        None => None,
    };
    for (src, dst, seg, through) in &plan {
        let none = Status::default();
        let st = status.as_deref().unwrap_or(&none);
        let src = Source::Lu(src, seg.src_lba);
        copy_blocks(
            &run,
            src,
            dst,
            seg.dst_lba,
            u64::from(seg.blocks),
            st,
            Some(*through),
        )
        .await?;
        if let Some(s) = &status {
            s.segments.fetch_add(1, Ordering::Relaxed);
        }
    }
    if let Some(r) = recorded {
        r.done().await?;
    }
    run.end().await?;
    finish.ok = true;
    drop(finish);
    if let (Some(s), 0x02) = (&status, list.usage) {
        copies.forget(s);
    }
    Ok(Done::empty())
}

/// RECEIVE COPY RESULTS (LID1): COPY STATUS and OPERATING PARAMETERS; RECEIVE ROD
/// TOKEN INFORMATION (LID4) in [`crate::odx`].
pub(crate) fn receive_copy_results(
    copies: &Copies,
    lu: &LogicalUnit,
    nexus: &ItNexus,
    cdb: &Cdb,
) -> CmdResult {
    let alloc_len = cdb.u32_at(10);
    let data = match cdb.service_action() {
        SA_COPY_STATUS => {
            let Some(s) = copies.find(nexus, ListId::Lid1(cdb.b(2))) else {
                return Err(cdb.invalid(2, None).into());
            };
            let mut d = vec![0u8; 12];
            d[0..4].copy_from_slice(&8u32.to_be_bytes());
            d[4] = s.state.load(Ordering::Acquire);
            d[5..7].copy_from_slice(&s.segments.load(Ordering::Relaxed).to_be_bytes());
            let bytes = s.bytes.load(Ordering::Relaxed);
            // TRANSFER COUNT UNITS: 00h bytes, 01h KiB when bytes do not fit.
            let (units, count) = match u32::try_from(bytes) {
                Ok(b) => (0u8, b),
                Err(_) => (1, u32::try_from(bytes >> 10).unwrap_or(u32::MAX)),
            };
            d[7] = units;
            d[8..12].copy_from_slice(&count.to_be_bytes());
            d
        }
        SA_OPERATING_PARAMETERS => operating_parameters(lu),
        odx::SA_RECEIVE_ROD_TOKEN_INFORMATION => {
            return odx::receive_rod_token_information(copies, lu, nexus, cdb)
        }
        _ => return Err(cdb.invalid(1, Some(4)).into()),
    };
    Ok(Done::alloc(data, alloc_len))
}

/// Largest segment in bytes: 65535 blocks (the descriptor's 16-bit count).
fn segment_bytes_max(lu: &LogicalUnit) -> u32 {
    u32::try_from(u64::from(u16::MAX) * u64::from(lu.geometry().block_size_bytes))
        .unwrap_or(u32::MAX)
}

fn operating_parameters(lu: &LogicalUnit) -> Vec<u8> {
    let mut d = vec![0u8; 44 + IMPLEMENTED.len()];
    let avail = (d.len() - 4) as u32;
    d[0..4].copy_from_slice(&avail.to_be_bytes());
    d[4] = 0x01; // SNLID: LIST ID USAGE 11b (no list identifier) is supported
    d[8..10].copy_from_slice(&CSCD_MAX.to_be_bytes());
    d[10..12].copy_from_slice(&SEGMENTS_MAX.to_be_bytes());
    d[12..16].copy_from_slice(&DESC_LIST_MAX.to_be_bytes());
    d[16..20].copy_from_slice(&segment_bytes_max(lu).to_be_bytes());
    // MAXIMUM INLINE DATA LENGTH, HELD DATA LIMIT, MAXIMUM STREAM DEVICE TRANSFER
    // SIZE: 0 (no inline or held data, no stream devices).
    d[34..36].copy_from_slice(&CONCURRENT_MAX.to_be_bytes());
    d[36] = CONCURRENT_MAX as u8;
    d[37] = lu.geometry().block_size_bytes.trailing_zeros() as u8; // DATA SEGMENT GRANULARITY
    d[43] = IMPLEMENTED.len() as u8;
    d[44..].copy_from_slice(&IMPLEMENTED);
    d
}

/// Appends one third-party copy descriptor, padded to a multiple of 4 bytes.
pub(crate) fn tpc_descriptor(out: &mut Vec<u8>, kind: u16, mut body: Vec<u8>) {
    while !body.len().is_multiple_of(4) {
        body.push(0);
    }
    out.extend_from_slice(&kind.to_be_bytes());
    out.extend_from_slice(&(body.len() as u16).to_be_bytes());
    out.extend_from_slice(&body);
}

/// The body of the Third-party Copy VPD page (0x8F) for `lu`.
pub(crate) fn vpd_page(lu: &LogicalUnit) -> Vec<u8> {
    let mut out = Vec::with_capacity(512);
    // Block Device ROD Token Limits (0000h) first: Windows looks for it.
    odx::rod_limits_descriptor(&mut out, lu);
    // Supported Commands (0001h): EXTENDED COPY LID1, POPULATE TOKEN, WRITE USING
    // TOKEN; RECEIVE COPY RESULTS LID1, RECEIVE ROD TOKEN INFORMATION.
    let cmds: [(u8, &[u8]); 2] = [
        (
            op::EXTENDED_COPY,
            &[0x00, odx::SA_POPULATE_TOKEN, odx::SA_WRITE_USING_TOKEN],
        ),
        (
            op::RECEIVE_COPY_RESULTS,
            &[
                SA_COPY_STATUS,
                SA_OPERATING_PARAMETERS,
                odx::SA_RECEIVE_ROD_TOKEN_INFORMATION,
            ],
        ),
    ];
    let mut list = Vec::new();
    for (opcode, sas) in cmds {
        list.push(opcode);
        list.push(sas.len() as u8);
        list.extend_from_slice(sas);
    }
    let mut body = vec![list.len() as u8];
    body.extend_from_slice(&list);
    tpc_descriptor(&mut out, 0x0001, body);
    // Parameter Data (0004h).
    let mut body = vec![0u8; 28];
    body[4..6].copy_from_slice(&CSCD_MAX.to_be_bytes());
    body[6..8].copy_from_slice(&SEGMENTS_MAX.to_be_bytes());
    body[8..12].copy_from_slice(&DESC_LIST_MAX.to_be_bytes());
    tpc_descriptor(&mut out, 0x0004, body);
    // Supported Descriptors (0008h).
    let mut body = vec![IMPLEMENTED.len() as u8];
    body.extend_from_slice(&IMPLEMENTED);
    tpc_descriptor(&mut out, 0x0008, body);
    // General Copy Operations (8001h).
    let mut body = vec![0u8; 28];
    body[0..4].copy_from_slice(&u32::from(CONCURRENT_MAX).to_be_bytes());
    body[4..8].copy_from_slice(&u32::from(CONCURRENT_MAX).to_be_bytes());
    body[8..12].copy_from_slice(&segment_bytes_max(lu).to_be_bytes());
    body[12] = lu.geometry().block_size_bytes.trailing_zeros() as u8;
    tpc_descriptor(&mut out, 0x8001, body);
    // ROD Token Features (0106h) and Supported ROD Types (0108h).
    odx::rod_descriptors(&mut out, lu);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(list_id: u8, usage: u8, cscd_len: u16, seg_len: u32) -> Vec<u8> {
        let mut h = vec![0u8; HEADER_LEN];
        h[0] = list_id;
        h[1] = usage << 3;
        h[2..4].copy_from_slice(&cscd_len.to_be_bytes());
        h[8..12].copy_from_slice(&seg_len.to_be_bytes());
        h
    }

    fn cscd(naa: &[u8; 16], block_len: u32) -> Vec<u8> {
        let mut d = vec![0u8; CSCD_LEN];
        d[0] = CSCD_IDENT;
        d[4] = 0x01;
        d[5] = 0x03;
        d[7] = 16;
        d[8..24].copy_from_slice(naa);
        d[29..32].copy_from_slice(&block_len.to_be_bytes()[1..]);
        d
    }

    fn segment(src: u16, dst: u16, blocks: u16, src_lba: u64, dst_lba: u64) -> Vec<u8> {
        let mut d = vec![0u8; SEG_B2B_LEN];
        d[0] = SEG_B2B;
        d[2..4].copy_from_slice(&((SEG_B2B_LEN - 4) as u16).to_be_bytes());
        d[4..6].copy_from_slice(&src.to_be_bytes());
        d[6..8].copy_from_slice(&dst.to_be_bytes());
        d[10..12].copy_from_slice(&blocks.to_be_bytes());
        d[12..20].copy_from_slice(&src_lba.to_be_bytes());
        d[20..28].copy_from_slice(&dst_lba.to_be_bytes());
        d
    }

    fn list(cscds: &[Vec<u8>], segs: &[Vec<u8>]) -> Vec<u8> {
        let c: Vec<u8> = cscds.concat();
        let s: Vec<u8> = segs.concat();
        let mut p = header(7, 0, c.len() as u16, s.len() as u32);
        p.extend_from_slice(&c);
        p.extend_from_slice(&s);
        p
    }

    #[test]
    fn parses_what_esxi_sends() {
        let naa = [0x60; 16];
        let p = list(&[cscd(&naa, 512)], &[segment(0, 0, 2048, 0, 4096)]);
        let l = parse(&p).unwrap();
        assert_eq!(l.list_id, 7);
        assert_eq!(l.cscds[0].designator, (0x03, naa.to_vec()));
        assert_eq!(l.cscds[0].block_len, 512);
        assert_eq!(
            l.segments,
            vec![Segment {
                src: 0,
                dst: 0,
                blocks: 2048,
                src_lba: 0,
                dst_lba: 4096
            }]
        );
    }

    #[test]
    fn refuses_what_it_cannot_do_with_the_right_sense() {
        let naa = [0x60; 16];
        let good = list(&[cscd(&naa, 512)], &[segment(0, 0, 8, 0, 8)]);
        // Truncated anywhere: PARAMETER LIST LENGTH ERROR.
        for cut in [HEADER_LEN - 1, HEADER_LEN + CSCD_LEN - 1, good.len() - 1] {
            assert_eq!(parse(&good[..cut]), Err(codes::PARAM_LIST_LENGTH_ERROR));
        }
        // One CSCD too many, one segment too many.
        let many = vec![cscd(&naa, 512); CSCD_MAX as usize + 1];
        assert_eq!(
            parse(&list(&many, &[segment(0, 0, 1, 0, 1)])),
            Err(codes::TOO_MANY_TARGET_DESCRIPTORS)
        );
        let segs = vec![segment(0, 0, 1, 0, 1); SEGMENTS_MAX as usize + 1];
        assert_eq!(
            parse(&list(&[cscd(&naa, 512)], &segs)),
            Err(codes::TOO_MANY_SEGMENT_DESCRIPTORS)
        );
        // Descriptor lists longer than the maximum.
        let segs = vec![segment(0, 0, 1, 0, 1); 40];
        assert_eq!(
            parse(&list(&[cscd(&naa, 512)], &segs)),
            Err(codes::PARAM_LIST_LENGTH_ERROR)
        );
        // Unsupported descriptor types.
        let mut fc = cscd(&naa, 512);
        fc[0] = 0xe0;
        let e = parse(&list(&[fc], &[segment(0, 0, 1, 0, 1)])).unwrap_err();
        assert_eq!((e.asc, e.ascq), (0x26, 0x07));
        let mut stream = segment(0, 0, 1, 0, 1);
        stream[0] = 0x03;
        let e = parse(&list(&[cscd(&naa, 512)], &[stream])).unwrap_err();
        assert_eq!((e.asc, e.ascq), (0x26, 0x09));
        // Inline data is not supported.
        let mut p = good.clone();
        p[12..16].copy_from_slice(&4u32.to_be_bytes());
        p.extend_from_slice(&[0; 4]);
        assert_eq!(parse(&p).unwrap_err().asc, 0x26);
    }
}
