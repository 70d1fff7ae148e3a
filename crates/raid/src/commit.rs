//! Applying a stripe update: the journal record first (parity levels), then the
//! member writes in place; and the group commit of journal records.
//!
//! Group commit: a stripe update hands its record to the journal's queue. The
//! members are cut into disjoint copy sets of `redundancy + 1` (five on RAID 5 of
//! 10). If a set has no ring write running, the update becomes its leader: it
//! takes every queued record (up to `BATCH_BYTES_MAX`), gives them consecutive
//! sequence numbers and adjacent ring space, and writes them as one FUA write to
//! each member of the set; otherwise it waits, and the records that queued behind
//! the running writes go out together as soon as a set is free. Every record
//! stays a separately checksummed record (replay and the on-disk format are
//! unchanged), and no update starts its in-place writes, or is acknowledged,
//! before the ring write carrying its record is durable. Successive batches start
//! at successive sets (F1: one copy always on the hot member), so the journal's
//! seeks are spread over every member.
//!
//! Early acknowledgement: once its record is durable, a journaled update is
//! complete as far as a crash is concerned (replay redoes it), so it is
//! acknowledged then, and its in-place writes run on a task that keeps the
//! stripe's lock until they are done. Every other user of the stripe (writes,
//! reconstructing reads, rebuild, scrub) takes that lock, so it waits; a plain
//! read of a healthy stripe takes no lock, so the stripe is marked in
//! `Inner::applying` before the acknowledgement and unmarked after its in-place
//! writes, and a read of a marked stripe waits for the lock first. The bytes of
//! in-place writes running after their acknowledgement are bounded
//! (`APPLY_BUDGET_KIB`); a flush does not wait for them (their records are
//! durable), a shutdown's checkpoint does. This takes the in-place
//! writes out of the acknowledged path: a small write waits for its reads and
//! the ring write, not for a third round of seeks.
//!
//! Data first (2026-11-28): a partial update of a healthy stripe journaled on
//! the members does not wait for its reads either. Holding the stripe's lock,
//! it journals a *data-first record* (its new data only, header link
//! `LINK_DATA_FIRST`) through the group commit, which sets aside, after the
//! batch's records, a slot (with its sequence number) for the record that will
//! complete it; once the data-first record is durable on `redundancy + 1`
//! members the write is acknowledged. A task then reads, computes the parity,
//! writes the *completing record* (data and parity, the whole update as
//! before, linked to the data-first record) into its slot, and only then
//! writes in place (`Completions`: the completing records of a batch go out
//! together, one ring write per copy). After a crash, a completing record is
//! replayed like any record, and a data-first record without one is completed
//! by assemble (`Inner::resolve_data_first`): nothing of its update was
//! written in place, so its stripe is consistent and its parity can be
//! computed from the new data and the rest of the stripe, reconstructed where
//! members are missing. The slot is reserved with the data-first record, so a
//! completing record never needs ring space a checkpoint would have to wait
//! for (a checkpoint waits for the data-first record, which waits for its
//! completion). At most `DATA_FIRST_BACKLOG` such updates are acknowledged and
//! not yet in place. The member queues then run as deep as that backlog lets
//! them instead of `redundancy + 1` requests per client request: with NCQ
//! that is what lifts the small-write figure (docs/0002-raid.md). Degraded
//! stripes, stripes not yet resynced and pools with a journal device go as
//! before.
//!
//! Completing records ride the next group commit (2026-12-03): once its
//! parity is known, a completing record goes into the group-commit queue like
//! any record, keeping the sequence number set aside for it, and is written
//! with whatever records the next batch carries, to that batch's copies. A
//! batch's completing records used to take a ring write per copy of their
//! own into their slots; now they share the ring writes of the data-first
//! records behind them: about half the ring writes per update, +7-10%
//! small-write IOPS on RAID 5 without NCQ (+1-5% on RAID 6), no change
//! beyond the spread with NCQ, where ring writes side by side were cheap
//! already (docs/0002-raid.md). The slot is
//! still set aside, and is where the record goes whenever riding could wait
//! for a checkpoint that waits for it: a checkpoint waits for every
//! data-first record up to its sequence, and such a record waits for its
//! completing record. So a checkpoint first stops records completing
//! data-first records up to its sequence from riding (`refuse_riding`: those
//! queued are turned away, later ones are not queued), and a batch carrying
//! completing records never waits for the ring's lock or a checkpoint
//! (`journal_reserve`: it turns them away instead); a record turned away
//! (`bounced`) is written into its slot as before. A leader whose own record
//! is turned away stops leading: it hands the rest of its batch back to the
//! queue (a checkpoint that took the ring's lock after the leader took its
//! batch may be waiting for that very record, and `refuse_riding` did not
//! see it in the queue). Replay does not care where
//! a record lies: records are taken by sequence number from every copy. Since
//! a completing record's sequence number is older than the batch it rides, a
//! ring write is tracked (`Straggler`) by its batch's lowest sequence number,
//! and the ring space of checkpointed records is freed by sequence, not by
//! position (`Alloc::live` is no longer in sequence order).
//!
//! Spare copies (2026-11-28; two since 2026-12-02, three since 2026-12-03): while the members reorder
//! their queues, a batch also goes to members past its copy set (`JOURNAL_SPARE_COPIES`,
//! `Pool::set_journal_spare_copies`), and is durable once any `redundancy + 1`
//! copies are. An NCQ disk serves the nearest request first, so a ring write
//! far from the data it is busy with can wait behind a deep queue; the
//! fastest `redundancy + 1` of `redundancy + 4` copies come back much sooner
//! than all of `redundancy + 1`. Whether the members reorder is measured, not configured: the share of
//! their completions that overtook an earlier request (`meter.rs`,
//! `spares_now`); a FIFO disk gets no spare, which would only cost it a
//! positioning. A copy still running when the batch is durable
//! (`Straggler`) holds back every checkpoint that would free its ring space
//! (`Journal::wait_done`), so it can never land on a newer record's copy.
//!
//! Key invariant: a record's in-place writes start only after a copy of the
//! record is durable on `redundancy + 1` members (fewer only when fewer are
//! writable), exactly as without batching; and nothing reads a stripe in place
//! between the acknowledgement of an update and the end of its in-place writes.

use crate::io::{unavailable, MemberOp, OpKind};
use crate::journal::{self, Entry, Journal};
use crate::pool::{Inner, View};
use crate::status::WritePath;
use crate::util::{join_all, BoxFut};
use block::{BlockError, BlockResult, Bytes};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::OwnedRwLockWriteGuard;

/// Unit tests: see `Inner::before_reserve`.
#[cfg(test)]
pub(crate) type BeforeReserve = Arc<dyn Fn(TakenBatch) -> BoxFut<'static, ()> + Send + Sync>;

/// Unit tests: the batch a leader took, as `Inner::before_reserve` sees it.
#[cfg(test)]
#[derive(Clone, Copy, Debug)]
pub(crate) struct TakenBatch {
    /// Records in it.
    pub records: usize,
    /// Of them, completing records riding it.
    pub riding: usize,
    /// Whether the leader's own record is one of those.
    pub own_riding: bool,
}

/// Most bytes one group commit writes to each copy (records beyond it wait for
/// the next one; a single bigger record goes alone).
const BATCH_BYTES_MAX: u64 = 2 << 20;
/// Tries at completing an acknowledged data-first update (its reads and its
/// completing record) before it is given up (its record completed: see
/// `complete_data_first`).
const COMPLETION_TRIES: u32 = 5;

/// Most group commits writing at once (each on its own members).
const JOURNAL_SETS_MAX: usize = 8;

/// Most KiB of in-place writes running after their acknowledgement (per pool);
/// more updates wait for room before they are acknowledged.
pub(crate) const APPLY_BUDGET_KIB: u32 = 64 << 10;

/// Most data-first updates acknowledged and not yet written in place (per
/// pool); more wait for room before their record is written.
pub(crate) const DATA_FIRST_BACKLOG: usize = 256;
/// Members a batch is written to beyond its copy set (see "A spare copy").
/// Measured (2026-11-28, `bench/raid-smallwrite`, same run): with NCQ RAID 5
/// of 10 4K writes 263 -> 298 IOPS, RAID 6 of 6 132 -> 147; without NCQ,
/// written always, it cost 5-7% (hence `spares_now`). Two spares: 310 on
/// RAID 5, at 0.5 more ring writes per update, with the 16 MiB ring of then.
/// With the 64 MiB ring (2026-12-02, `raid-smallwrite --secs 4 --ncq on
/// --spare-copies 1|2|3`, same session): RAID 5 of 10 323/307/515 IOPS (4K,
/// 8K, 8K 67/33) with one, 342/333/528 with two, 351/343/515 with three;
/// RAID 6 of 6 145/139/302 with one, 166/155/303 with two (over three runs
/// of each, interleaved: 6%, 4% and 2% ahead). Two it is: the
/// second-fastest of four copies (five on RAID 6) returns sooner still, and
/// the ring writes no longer run into checkpoints. Three since completing
/// records ride group commits (2026-12-03, each ring write carries more
/// updates, so a copy costs less per update; `--spare-copies 3|2`, two whole
/// runs each, interleaved, NCQ on): RAID 5 of 10 384/382 against 365/364
/// IOPS at 4K, RAID 6 of 6 175/177 against 159/159 at 4K and 168/155 against
/// 150/154 at 8K; RAID 5 8K and both 8K 67/33 mixes within the spread
/// (331/315 against 345/329, 525/531 against 537/535, 323/321 against
/// 324/323). Four and five did worse on RAID 5 8K writes with NCQ (three
/// interleaved rounds: 366/367/359 with three, 360/354/334 with four,
/// 354/347/350 with five): with the members 99% busy, another copy's write
/// costs more than the shorter wait saves.
pub(crate) const JOURNAL_SPARE_COPIES: usize = 3;
/// The spare copy is written while at least this percentage of the members'
/// recent completions overtook an earlier request (a reordering queue; FIFO
/// disks show 0%, NCQ disks under this load 60-85%).
const SPARE_REORDERED_PERCENT: u64 = 10;
/// Completions over which the members' reordering is judged again.
const SPARE_WINDOW: u64 = 256;

/// When a journal batch gets its spare copies (`Pool::set_journal_spare_copies`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpareWhen {
    /// While the members reorder their queues (the default).
    Reordering,
    /// Always (tests that need a spare on members that answer in order).
    Always,
}

/// Whether the members reorder their queues, judged over the last
/// `SPARE_WINDOW` completions (see "A spare copy").
#[derive(Default)]
pub(crate) struct SpareVerdict {
    completed: u64,
    reordered: u64,
    on: bool,
}

/// A durable record: its sequence number, and whether it has every copy it
/// should (`redundancy + 1` on the members, or the journal device): then it
/// survives a crash together with the loss of `redundancy` members. A
/// data-first record also gets the ring slot set aside for the record that
/// completes it (`then`).
#[derive(Clone)]
pub(crate) struct Durable {
    seq: u64,
    full: bool,
    then: Option<Then>,
    /// A completing record turned away from the group commit (see "Completing
    /// records ride the next group commit"): nothing was written; it goes to
    /// its slot instead.
    bounced: bool,
}

/// The slot of the record completing a data-first record: its sequence number
/// (given with the data-first record's, registered in flight) and where it goes.
#[derive(Clone)]
pub(crate) struct Then {
    seq: u64,
    area: Arc<Completions>,
    idx: usize,
}

/// What a record handed to the group commit is.
pub(crate) struct RecordKind {
    /// The header link (see `journal`).
    link: u64,
    /// Ring blocks to set aside for a completing record (data-first only).
    reserve: u64,
    /// A completing record: its sequence number and its data-first record's.
    riding: Option<(u64, u64)>,
}

impl RecordKind {
    /// A whole stripe update.
    fn whole() -> Self {
        RecordKind {
            link: 0,
            reserve: 0,
            riding: None,
        }
    }

    /// A data-first record, with `reserve` blocks set aside for the record
    /// completing it.
    fn data_first(reserve: u64) -> Self {
        RecordKind {
            link: journal::LINK_DATA_FIRST,
            reserve,
            riding: None,
        }
    }

    /// The record (sequence `seq`) completing data-first record `dseq`.
    fn completing(seq: u64, dseq: u64) -> Self {
        RecordKind {
            link: journal::LINK_COMPLETES | dseq,
            reserve: 0,
            riding: Some((seq, dseq)),
        }
    }
}

/// A record waiting for its group commit.
pub(crate) struct Pending {
    ticket: u64,
    stripe: u64,
    entries: Vec<Entry>,
    payloads: Vec<Bytes>,
    blocks: u64,
    kind: RecordKind,
}

/// The batch a leader (its own record: ticket `own`) takes from the head of
/// `queue`: as many records as fit `cap` blocks (at least one), up to
/// `journal::MAX_ENTRIES`. A leader whose own record is a completing record
/// always carries it: if it lies beyond that, it goes alone. Its task is the
/// one its data-first record waits for, so it must never lead a batch it
/// may have to wait for without its own record in it, where `bounce` would
/// not see it (see `journal_reserve`).
fn take_batch(queue: &mut Vec<Pending>, own: u64, cap: u64) -> Vec<Pending> {
    let mut total = 0;
    let mut n = 0;
    while n < queue.len()
        && (n == 0 || total + queue[n].blocks + queue[n].kind.reserve <= cap)
        && n < journal::MAX_ENTRIES
    {
        total += queue[n].blocks + queue[n].kind.reserve;
        n += 1;
    }
    if let Some(i) = queue
        .iter()
        .position(|p| p.ticket == own && p.kind.riding.is_some())
        .filter(|&i| i >= n)
    {
        return vec![queue.remove(i)];
    }
    queue.drain(..n).collect()
}

/// The ring space a group commit set aside, after its own records, for the
/// records completing its data-first records, on the same copies: where a
/// completing record goes when it may not ride a later group commit (see
/// "Completing records ride the next group commit"; a slot whose record rides
/// is given up, so the others do not wait for it). Each update
/// puts its completing record in its slot once its parity is known; the last
/// one to do so (every other slot filled, or given up by an update that
/// failed) writes them all as one FUA write per copy, so the completing
/// records of a batch cost one ring write per copy, as the batch did.
/// Measured (2026-11-28, `bench/raid-smallwrite`, RAID 5 of 10): writing
/// whatever was filled whenever no write was running took 1.5 ring writes per
/// update instead of 0.8, for the same IOPS with NCQ and 5-11% fewer without.
/// (A slot given up is written as zeroes, which no scan takes for a record;
/// the same holds for the span of a write that a later one rewrites.)
pub(crate) struct Completions {
    /// Per copy: the position (for a member, to fail it on an error), the
    /// device, and the absolute lba of the area's first block.
    targets: Vec<(Option<usize>, Arc<crate::pool::MemberHandle>, u64)>,
    /// Per slot: first block within the area, and its size in blocks.
    slots: Vec<(u64, u64)>,
    st: parking_lot::Mutex<CompletionState>,
    done: tokio::sync::Notify,
}

#[derive(Default)]
struct CompletionState {
    filled: Vec<Option<Bytes>>,
    /// Per slot, once written: how many copies hold it.
    written: Vec<Option<usize>>,
    /// Slots whose update failed before its record (never filled).
    abandoned: Vec<bool>,
    writing: bool,
}

/// Clears `writing` if a writer's future is dropped mid-write.
struct WritingGuard<'a>(&'a Completions, bool);

impl Drop for WritingGuard<'_> {
    fn drop(&mut self) {
        if self.1 {
            self.0.st.lock().writing = false;
            self.0.done.notify_waiters();
        }
    }
}

impl Completions {
    /// Slot `idx` will not be filled (its update failed, or its record rides
    /// a group commit): the other slots' records do not wait for it.
    fn abandon(&self, idx: usize) {
        self.st.lock().abandoned[idx] = true;
        self.done.notify_waiters();
    }

    /// Slot `idx`, given up for a group commit that turned its record away,
    /// will be filled after all (a write of other slots in between may have
    /// zeroed it; the record's own write comes after).
    fn reclaim(&self, idx: usize) {
        self.st.lock().abandoned[idx] = false;
    }

    /// Puts `rec` (no larger than the slot) in slot `idx` and returns once it
    /// is written: how many copies hold it (0: none could be written).
    async fn write(&self, inner: &Inner, idx: usize, rec: Bytes) -> usize {
        self.st.lock().filled[idx] = Some(rec);
        loop {
            let notified = self.done.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let job = {
                let mut st = self.st.lock();
                if let Some(n) = st.written[idx] {
                    return n;
                }
                // wait for every slot of the batch, so that its completing
                // records go out in one ring write per copy
                let unfilled = (0..self.slots.len()).any(|i| {
                    self.slots[i].1 > 0
                        && st.filled[i].is_none()
                        && st.written[i].is_none()
                        && !st.abandoned[i]
                });
                if st.writing || unfilled {
                    None
                } else {
                    let todo: Vec<usize> = (0..self.slots.len())
                        .filter(|&i| st.filled[i].is_some() && st.written[i].is_none())
                        .collect();
                    let (lo, hi) = (todo[0], todo[todo.len() - 1]);
                    let bs = inner.bs as usize;
                    let span = (self.slots[hi].0 + self.slots[hi].1 - self.slots[lo].0) as usize;
                    let mut buf = vec![0u8; span * bs];
                    for i in lo..=hi {
                        if let Some(b) = &st.filled[i] {
                            let at = (self.slots[i].0 - self.slots[lo].0) as usize * bs;
                            buf[at..at + b.len()].copy_from_slice(b);
                        }
                    }
                    st.writing = true;
                    Some((todo, self.slots[lo].0, Bytes::from(buf)))
                }
            };
            let Some((todo, first, buf)) = job else {
                notified.await;
                continue;
            };
            let mut guard = WritingGuard(self, true);
            let futs: Vec<BoxFut<'_, BlockResult<()>>> = self
                .targets
                .iter()
                .map(|(_, h, base)| -> BoxFut<'_, BlockResult<()>> {
                    Box::pin(inner.m_write_abs(h, base + first, buf.clone(), true))
                })
                .collect();
            let results = join_all(futs).await;
            let mut ok = 0;
            for ((pos, h, _), r) in self.targets.iter().zip(&results) {
                match (r, pos) {
                    (Ok(()), _) => ok += 1,
                    (Err(_), Some(p)) => inner.fail_handle(*p, h).await,
                    (Err(e), None) => {
                        tracing::error!(pool = %inner.name, device = %h.name, error = %e, "journal device failed");
                    }
                }
            }
            let w = &inner.wp;
            w.journal_ring_writes
                .fetch_add(self.targets.len() as u64, Ordering::Relaxed);
            w.journal_ring_bytes
                .fetch_add(ok as u64 * buf.len() as u64, Ordering::Relaxed);
            {
                let mut st = self.st.lock();
                for i in todo {
                    st.written[i] = Some(ok);
                }
                st.writing = false;
            }
            guard.1 = false;
            self.done.notify_waiters();
        }
    }
}

/// The group-commit queue of a journal (under a short synchronous lock).
#[derive(Default)]
pub(crate) struct Group {
    queue: Vec<Pending>,
    /// Per copy set (see `journal_copies`): a leader's ring write is running there.
    busy: Vec<bool>,
    next_ticket: u64,
    /// Batches written so far (rotates the copies over the members).
    batches: u64,
    /// Outcome per ticket: the record's sequence number, or why it failed.
    results: HashMap<u64, Result<Durable, String>>,
    /// Completing records of data-first records up to this sequence no longer
    /// ride group commits: a checkpoint covering those may be waiting for them
    /// (see "Completing records ride the next group commit").
    ride_floor: u64,
}

#[cfg(test)]
impl Group {
    /// Records waiting for a leader.
    pub(crate) fn queued(&self) -> usize {
        self.queue.len()
    }
}

/// Counters behind `status().write_path`.
#[derive(Default)]
pub(crate) struct WriteCounters {
    pub partial_updates: AtomicU64,
    pub journal_records: AtomicU64,
    pub journal_batches: AtomicU64,
    pub journal_ring_writes: AtomicU64,
    pub journal_ring_bytes: AtomicU64,
    pub journal_batch_records_max: AtomicU64,
    pub journal_checkpoints: AtomicU64,
    pub lock_wait_us: AtomicU64,
    pub read_us: AtomicU64,
    pub journal_us: AtomicU64,
    pub apply_us: AtomicU64,
    pub early_acks: AtomicU64,
    pub journal_checkpoints_ahead: AtomicU64,
    pub data_first_acks: AtomicU64,
    pub completion_us: AtomicU64,
    pub journal_spare_wins: AtomicU64,
    pub journal_spare_copies: AtomicU64,
    pub completions_riding: AtomicU64,
    pub completions_in_slots: AtomicU64,
}

impl WriteCounters {
    pub fn snapshot(&self) -> WritePath {
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        WritePath {
            partial_updates: l(&self.partial_updates),
            journal_records: l(&self.journal_records),
            journal_batches: l(&self.journal_batches),
            journal_ring_writes: l(&self.journal_ring_writes),
            journal_ring_bytes: l(&self.journal_ring_bytes),
            journal_batch_records_max: l(&self.journal_batch_records_max),
            journal_checkpoints: l(&self.journal_checkpoints),
            lock_wait_us: l(&self.lock_wait_us),
            read_us: l(&self.read_us),
            journal_us: l(&self.journal_us),
            apply_us: l(&self.apply_us),
            early_acks: l(&self.early_acks),
            journal_checkpoints_ahead: l(&self.journal_checkpoints_ahead),
            data_first_acks: l(&self.data_first_acks),
            completion_us: l(&self.completion_us),
            journal_spare_wins: l(&self.journal_spare_wins),
            journal_spare_copies: l(&self.journal_spare_copies),
            completions_riding: l(&self.completions_riding),
            completions_in_slots: l(&self.completions_in_slots),
        }
    }
}

/// Adds the time since `t0` to a µs counter.
pub(crate) fn add_us(c: &AtomicU64, t0: Instant) {
    c.fetch_add(t0.elapsed().as_micros() as u64, Ordering::Relaxed);
}

/// A ring write of a batch still running: holds back checkpoints covering the
/// batch (`Journal::wait_done`) until it ends, acknowledged or not.
struct Straggler {
    inner: Arc<Inner>,
    first: u64,
}

impl Straggler {
    fn new(inner: &Arc<Inner>, first: u64) -> Self {
        if let Some(j) = &inner.journal {
            j.writing_begin(first);
        }
        Straggler {
            inner: Arc::clone(inner),
            first,
        }
    }
}

impl Drop for Straggler {
    fn drop(&mut self) {
        if let Some(j) = &self.inner.journal {
            j.writing_end(self.first);
        }
    }
}

/// Clears the leader flag and fails the batch's tickets if the leader's future
/// is dropped in the middle of its ring write (nobody else would).
struct LeaderGuard<'a> {
    j: &'a Journal,
    slot: usize,
    tickets: Vec<u64>,
    seqs: Vec<u64>,
    armed: bool,
}

impl Drop for LeaderGuard<'_> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        for &s in &self.seqs {
            self.j.complete(s);
        }
        let mut g = self.j.group.lock();
        if let Some(b) = g.busy.get_mut(self.slot) {
            *b = false;
        }
        for &t in &self.tickets {
            g.results
                .insert(t, Err("journal write abandoned".to_string()));
        }
        drop(g);
        self.j.group_done.notify_waiters();
    }
}

impl Durable {
    fn bounced() -> Self {
        Durable {
            seq: 0,
            full: false,
            then: None,
            bounced: true,
        }
    }
}

impl Inner {
    /// The journal devices that have not failed (none, one, or a mirrored pair).
    pub(crate) fn journal_devices(&self) -> Vec<&crate::jdev::JournalDev> {
        self.journal_devs
            .iter()
            .filter(|d| !d.failed.load(Ordering::Relaxed))
            .collect()
    }

    /// The journal, unless the pool has none or it is bypassed (test-only).
    fn active_journal(&self) -> Option<&Journal> {
        self.journal
            .as_ref()
            .filter(|_| !self.journal_bypass.load(Ordering::Relaxed))
    }

    /// Applies a stripe update: journal record first (parity levels), then the
    /// member operations in place. Members that fail are failed; the update
    /// succeeds while the pool survives. With `lock` (the stripe's exclusive
    /// lock, owned) a journaled update returns once its record is durable and
    /// its in-place writes finish on their own task, which then releases the
    /// lock (see "Early acknowledgement" above).
    pub(crate) async fn commit(
        self: &Arc<Self>,
        s: u64,
        ops: Vec<MemberOp>,
        view: &View,
        fua: bool,
        lock: Option<OwnedRwLockWriteGuard<()>>,
    ) -> BlockResult<()> {
        let mut seq = None;
        if let Some(j) = self.active_journal() {
            let (entries, payloads) = self.record_of(&ops);
            let kib = (payloads.iter().map(|b| b.len()).sum::<usize>() >> 10)
                .clamp(1, APPLY_BUDGET_KIB as usize) as u32;
            // The share of the apply budget is taken before the record has
            // its sequence number, as a data-first update takes it: a
            // checkpoint waits for every record up to its sequence, and the
            // budget's holders may be waiting for that checkpoint (data-first
            // updates in the group commit behind it, review of 2026-12-06).
            // (None: the budget is never closed; applied in place as below.)
            let permit = if lock.is_some() && self.early_ack.load(Ordering::Relaxed) {
                #[cfg(test)]
                self.budget_wait.notify_waiters();
                self.apply_budget.clone().acquire_many_owned(kib).await.ok()
            } else {
                None
            };
            let t0 = Instant::now();
            let d = self
                .journal_append(j, s, entries, payloads, RecordKind::whole())
                .await?;
            add_us(&self.wp.journal_us, t0);
            let sq = d.seq;
            seq = Some(sq);
            // Only a record with all its copies may stand in for the in-place
            // writes: with a copy missing, the update is acknowledged only once
            // it is in place too, as before.
            // (a permit: the stripe's lock was handed over, early
            // acknowledgement is on)
            if let (true, Some(permit)) = (d.full, permit) {
                let guard = lock;
                // The record is durable: the update survives a crash from here on.
                // the stripe's lock is held until the task ends, so no other
                // update of `s` can be acknowledged in between
                self.applying.lock().insert(s);
                self.wp.early_acks.fetch_add(1, Ordering::Relaxed);
                let me = Arc::clone(self);
                let view = view.clone();
                tokio::spawn(async move {
                    if let Err(e) = me.apply(s, &ops, &view, fua, Some(sq)).await {
                        tracing::error!(pool = %me.name, stripe = s, error = %e,
                            "in-place writes of an acknowledged update failed; its journal record is replayed at the next assemble");
                    }
                    me.applying.lock().remove(&s);
                    drop(guard);
                    drop(permit);
                });
                return Ok(());
            }
        }
        let r = self.apply(s, &ops, view, fua, seq).await;
        // the stripe's lock (when handed over) is held until the writes are done
        drop(lock);
        r
    }

    /// The entries and payloads of the record of a stripe update.
    pub(crate) fn record_of(&self, ops: &[MemberOp]) -> (Vec<Entry>, Vec<Bytes>) {
        let bs = self.bs as usize;
        let entries = ops
            .iter()
            .map(|o| Entry {
                position: o.pos as u16,
                discard: matches!(o.kind, OpKind::Discard(_)),
                member_lba: o.mlba,
                blocks: match &o.kind {
                    OpKind::Write(b) => (b.len() / bs) as u32,
                    OpKind::Discard(n) => *n as u32,
                },
            })
            .collect();
        let payloads = ops
            .iter()
            .map(|o| match &o.kind {
                OpKind::Write(b) => b.clone(),
                OpKind::Discard(_) => Bytes::new(),
            })
            .collect();
        (entries, payloads)
    }

    /// Whether a partial update of stripe `s` may go data-first: journaled on
    /// the members (a journal device makes the acknowledged path short
    /// already), early acknowledgement on, and every position of the stripe
    /// readable and writable (a degraded update needs reconstruction, and is
    /// done as before).
    pub(crate) fn data_first_ok(&self, s: u64, view: &View) -> bool {
        self.data_first.load(Ordering::Relaxed)
            && self.early_ack.load(Ordering::Relaxed)
            && self.active_journal().is_some()
            && self.journal_devices().is_empty()
            && !self.is_uninit(s)
            && (0..view.slots.len())
                .all(|p| view.readable(p, s).is_some() && view.writable(p).is_some())
    }

    /// A data-first partial update (see "Data first" in the module notes):
    /// the new data is journaled and acknowledged; the reads, the parity, the
    /// completing record and the in-place writes follow on a task holding the
    /// stripe's lock.
    ///
    /// It runs on a task of its own: a caller that gives up (a dropped
    /// request) must not leave a record in flight, or a batch's slot
    /// unfilled, for ever.
    pub(crate) async fn commit_data_first(
        self: &Arc<Self>,
        s: u64,
        segs: &[crate::io::Seg],
        data: &Bytes,
        fua: bool,
        lock: OwnedRwLockWriteGuard<()>,
    ) -> BlockResult<()> {
        let me = Arc::clone(self);
        let job = me.data_first(s, segs.to_vec(), data.clone(), fua, lock);
        tokio::spawn(job)
            .await
            .unwrap_or_else(|e| Err(unavailable(format!("data-first update: {e}"))))
    }

    async fn data_first(
        self: Arc<Self>,
        s: u64,
        segs: Vec<crate::io::Seg>,
        data: Bytes,
        fua: bool,
        lock: OwnedRwLockWriteGuard<()>,
    ) -> BlockResult<()> {
        let Some(j) = self.active_journal() else {
            return Err(unavailable("no journal".into()));
        };
        let bs = self.bs as usize;
        let cb = self.cb;
        let entries: Vec<Entry> = segs
            .iter()
            .map(|g| Entry {
                position: self.layout.data_positions(s, g.d)[0] as u16,
                discard: false,
                member_lba: s * cb + g.off,
                blocks: g.blocks as u32,
            })
            .collect();
        let payloads: Vec<Bytes> = segs
            .iter()
            .map(|g| data.slice(g.buf_off..g.buf_off + g.blocks as usize * bs))
            .collect();
        // the completing record: these writes and the parity of the rows they
        // touch (a read-modify-write or a reconstruct-write of a healthy
        // stripe writes no more than that)
        let r0 = segs.iter().map(|g| g.off).min().unwrap_or(0);
        let r1 = segs.iter().map(|g| g.off + g.blocks).max().unwrap_or(0);
        let mut whole = entries.clone();
        for p in self.layout.parity_positions(s) {
            whole.push(Entry {
                position: p as u16,
                discard: false,
                member_lba: s * cb + r0,
                blocks: (r1 - r0) as u32,
            });
        }
        let reserve = journal::record_blocks(&whole, bs);
        if journal::record_blocks(&entries, bs) + reserve > j.ring_blocks / 2 {
            // too large to set its completion aside (a small ring): as before,
            // read first, then journal the whole update
            let mut view = self.view()?;
            let ops = self.plan(s, &segs, &data, &mut view).await?;
            return self.commit(s, ops, &view, fua, Some(lock)).await;
        }
        let kib = ((data.len() >> 10) as u32).clamp(1, APPLY_BUDGET_KIB);
        let budget = self
            .apply_budget
            .clone()
            .acquire_many_owned(kib)
            .await
            .map_err(|_| unavailable("apply budget closed".into()))?;
        let backlog = self
            .data_first_backlog
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| unavailable("backlog closed".into()))?;
        let t0 = Instant::now();
        let d = self
            .journal_append(j, s, entries, payloads, RecordKind::data_first(reserve))
            .await?;
        add_us(&self.wp.journal_us, t0);
        let Some(then) = d.then.clone() else {
            j.complete(d.seq);
            return Err(unavailable("data-first record without its slot".into()));
        };
        self.applying.lock().insert(s);
        let me = Arc::clone(&self);
        let job = async move {
            let (r, checkpoint) = me
                .complete_data_first(s, &segs, &data, fua, d.seq, then)
                .await;
            me.applying.lock().remove(&s);
            drop(budget);
            drop(backlog);
            // written in place without a completing record: a checkpoint past
            // its record before another write of the stripe can be journaled
            // (the stripe's lock is held; the apply budget is not: an older
            // record may be waiting for it, and the checkpoint waits for that
            // record; the backlog is let go with it, nothing needs it here)
            let r = match (r, checkpoint) {
                (Ok(()), Some(upto)) => me.checkpoint(upto).await,
                (r, _) => r,
            };
            drop(lock);
            r
        };
        if !d.full {
            // a copy is missing: acknowledged only once in place, as before
            return job.await;
        }
        self.wp.early_acks.fetch_add(1, Ordering::Relaxed);
        self.wp.data_first_acks.fetch_add(1, Ordering::Relaxed);
        tokio::spawn(async move {
            if let Err(e) = job.await {
                tracing::error!(stripe = s, error = %e,
                    "a data-first update could not be completed in place (the line before says why)");
            }
        });
        Ok(())
    }

    /// The rest of a data-first update whose data record `dseq` is durable:
    /// read, compute the parity, write the completing record into its slot,
    /// then the members in place. With the result, the checkpoint to take
    /// (past `dseq`) when it was written in place without a completing
    /// record: nothing else keeps an older record of its rows from being
    /// replayed over them after a crash (a later write of the stripe makes
    /// assemble leave `dseq` out).
    async fn complete_data_first(
        self: &Arc<Self>,
        s: u64,
        segs: &[crate::io::Seg],
        data: &Bytes,
        fua: bool,
        dseq: u64,
        then: Then,
    ) -> (BlockResult<()>, Option<u64>) {
        let j = self
            .journal
            .as_ref()
            .expect("a data-first update has a journal");
        let mut checkpoint = None;
        // The update is acknowledged: its data must reach the members. A
        // failed attempt (a read that failed, a group commit whose leader was
        // dropped) is tried again while the pool stands. The record cannot
        // stay live past the last try: checkpoints (and with them every write
        // once the ring is full, and shutdown) would wait for it for ever.
        let mut tries = 0u32;
        let r = loop {
            match self.completion_attempt(j, s, segs, data, dseq, &then).await {
                Ok((ops, view, true)) => {
                    break self.apply(s, &ops, &view, fua, Some(then.seq)).await;
                }
                Ok((ops, view, false)) => {
                    // no copy of the completing record: placed without it (a
                    // crash in the middle and a member lost with it could
                    // leave this stripe's parity wrong: the write hole, here
                    // only while the members refuse ring writes)
                    then.area.abandon(then.idx);
                    j.complete(then.seq);
                    tracing::warn!(pool = %self.name, stripe = s,
                        "no copy of the completing journal record could be written; the acknowledged update is written in place without it");
                    // and, as for rows given up below, a checkpoint past it
                    // (the caller's): a later write of the stripe would leave
                    // its record out of assemble's completion while an older
                    // record of its rows is replayed
                    let r = self.apply(s, &ops, &view, fua, None).await;
                    if r.is_ok() {
                        checkpoint = Some(dseq);
                    }
                    break r;
                }
                Err(e) if tries < COMPLETION_TRIES && !self.is_failed() => {
                    tries += 1;
                    tracing::warn!(pool = %self.name, stripe = s, error = %e, tries,
                        "completing an acknowledged update failed; trying again");
                    tokio::time::sleep(std::time::Duration::from_millis(10 << tries)).await;
                }
                Err(e) => {
                    then.area.abandon(then.idx);
                    j.complete(then.seq);
                    // unreadable sectors beyond the redundancy: the rows are
                    // given up around the update, which is written (forced)
                    // without a completing record (see `complete_given_up`)
                    if matches!(e, BlockError::Medium { .. }) && !self.is_failed() {
                        match self.complete_given_up(s, segs, data).await {
                            Ok((ops, view)) => {
                                // no record holds the rows given up: a
                                // checkpoint past this update (the caller's)
                                let r = self.apply(s, &ops, &view, true, None).await;
                                if r.is_ok() {
                                    checkpoint = Some(dseq);
                                }
                                break r;
                            }
                            Err(e2) => tracing::error!(pool = %self.name, stripe = s, error = %e2,
                                "the rows of an acknowledged update could not be given up"),
                        }
                    }
                    tracing::error!(pool = %self.name, stripe = s, error = %e, tries,
                        "an acknowledged update could not be written in place: LOST (its stripe could not be read; reads return the older data, and its journal record is replayed only if the pool stops before a checkpoint passes it and before another write to the stripe)");
                    break Err(e);
                }
            }
        };
        j.complete(dseq);
        (r, checkpoint)
    }

    /// One try at the part of a data-first update before its in-place
    /// writes: read, compute the parity, write the completing record. Returns
    /// the member writes, the view they were planned on, and whether a copy of
    /// the completing record was written.
    async fn completion_attempt(
        self: &Arc<Self>,
        j: &Journal,
        s: u64,
        segs: &[crate::io::Seg],
        data: &Bytes,
        dseq: u64,
        then: &Then,
    ) -> BlockResult<(Vec<MemberOp>, View, bool)> {
        let t0 = Instant::now();
        let mut view = self.view()?;
        let ops = self.plan(s, segs, data, &mut view).await?;
        add_us(&self.wp.read_us, t0);
        let (entries, payloads) = self.record_of(&ops);
        let bs = self.bs as usize;
        let (_, slot_blocks) = then.area.slots[then.idx];
        if journal::record_blocks(&entries, bs) > slot_blocks {
            return Err(unavailable(format!(
                "pool {}: stripe {s}: the completing record outgrew its slot",
                self.name
            )));
        }
        let t1 = Instant::now();
        let copies = self
            .write_completion(j, s, then, dseq, entries, payloads)
            .await;
        add_us(&self.wp.completion_us, t1);
        Ok((ops, view, copies > 0))
    }

    /// Makes durable the record completing data-first record `dseq` (entries
    /// and payloads of the whole update, sequence `then.seq`): with the next
    /// group commit, beside other records, unless it is turned away (see
    /// "Completing records ride the next group commit"); else, or when riding
    /// is off, in the slot set aside for it. Returns how many copies hold it
    /// (0: none could be written).
    async fn write_completion(
        self: &Arc<Self>,
        j: &Journal,
        s: u64,
        then: &Then,
        dseq: u64,
        entries: Vec<Entry>,
        payloads: Vec<Bytes>,
    ) -> usize {
        if self.completions_ride.load(Ordering::Relaxed) {
            // the other completing records of its batch do not wait for its slot
            then.area.abandon(then.idx);
            let riding = self
                .journal_append(
                    j,
                    s,
                    entries.clone(),
                    payloads.clone(),
                    RecordKind::completing(then.seq, dseq),
                )
                .await;
            match riding {
                Ok(d) if !d.bounced => {
                    self.wp.completions_riding.fetch_add(1, Ordering::Relaxed);
                    return 1;
                }
                Ok(_) => then.area.reclaim(then.idx),
                Err(e) => {
                    // its group commit failed (a member, or a leader dropped
                    // mid-write): the slot set aside for it is still there
                    tracing::warn!(pool = %self.name, stripe = s, error = %e,
                        "completing journal record not written with the group commit; writing it to its slot");
                    then.area.reclaim(then.idx);
                }
            }
        }
        let pay: Vec<&[u8]> = payloads.iter().map(|b| b.as_ref()).collect();
        let rec = journal::encode(
            then.seq,
            self.pool_tag,
            journal::LINK_COMPLETES | dseq,
            &entries,
            &pay,
            self.bs as usize,
        );
        let copies = then.area.write(self, then.idx, Bytes::from(rec)).await;
        if copies > 0 {
            self.wp.journal_records.fetch_add(1, Ordering::Relaxed);
            self.wp.completions_in_slots.fetch_add(1, Ordering::Relaxed);
        }
        copies
    }

    /// The in-place writes of an update whose record (if any, `seq`) is durable.
    async fn apply(
        &self,
        s: u64,
        ops: &[MemberOp],
        view: &View,
        fua: bool,
        seq: Option<u64>,
    ) -> BlockResult<()> {
        let t0 = Instant::now();
        let futs: Vec<BoxFut<'_, BlockResult<()>>> = ops
            .iter()
            .map(|o| -> BoxFut<'_, BlockResult<()>> {
                Box::pin(async move {
                    match view.writable(o.pos) {
                        Some(h) => self.m_op(h, o, fua).await,
                        None => Ok(()),
                    }
                })
            })
            .collect();
        let results = join_all(futs).await;
        add_us(&self.wp.apply_us, t0);
        for (o, r) in ops.iter().zip(results) {
            if let Err(e) = r {
                if let Some(h) = view.writable(o.pos) {
                    tracing::warn!(pool = %self.name, position = o.pos, error = %e, "member write failed");
                    self.fail_handle(o.pos, &h).await;
                }
            }
        }
        if let (Some(j), Some(sq)) = (&self.journal, seq) {
            j.complete(sq);
        }
        if self.is_failed() {
            return Err(unavailable(format!(
                "pool {}: failed during write of stripe {s}",
                self.name
            )));
        }
        Ok(())
    }

    /// Whether an acknowledged update of stripe `s` is still being written in
    /// place (then a read must take the stripe's lock).
    pub(crate) fn is_applying(&self, s: u64) -> bool {
        // A whole budget: nothing acknowledged is being applied (a stripe is
        // marked only while its update holds part of the budget).
        if self.apply_budget.available_permits() == APPLY_BUDGET_KIB as usize {
            return false;
        }
        self.applying.lock().contains(&s)
    }

    /// Waits until every acknowledged update is written in place.
    pub(crate) async fn wait_applied(&self) {
        if let Ok(all) = self.apply_budget.acquire_many(APPLY_BUDGET_KIB).await {
            drop(all);
        }
    }

    /// Makes a record for stripe `s` durable through the group commit; returns its
    /// sequence number (registered in flight: the caller calls `complete` once its
    /// in-place writes are done) and whether it has all its copies.
    async fn journal_append(
        self: &Arc<Self>,
        j: &Journal,
        s: u64,
        entries: Vec<Entry>,
        payloads: Vec<Bytes>,
        kind: RecordKind,
    ) -> BlockResult<Durable> {
        let (reserve, riding) = (kind.reserve, kind.riding);
        let blocks = journal::record_blocks(&entries, self.bs as usize);
        if blocks + reserve > j.ring_blocks {
            return Err(BlockError::NotSupported(
                "journal record larger than the ring",
            ));
        }
        // a record replay would not decode must never be written, let alone
        // acknowledged (the update fails instead)
        if entries.len() > journal::MAX_ENTRIES {
            return Err(BlockError::NotSupported(
                "journal record with more entries than a record holds",
            ));
        }
        let ticket = {
            let mut g = j.group.lock();
            if riding.is_some_and(|(_, d)| d <= g.ride_floor) {
                return Ok(Durable::bounced());
            }
            let t = g.next_ticket;
            g.next_ticket += 1;
            g.queue.push(Pending {
                ticket: t,
                stripe: s,
                entries,
                payloads,
                blocks,
                kind,
            });
            t
        };
        loop {
            let notified = j.group_done.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let batch = {
                let mut g = j.group.lock();
                if let Some(r) = g.results.remove(&ticket) {
                    return r.map_err(|e| unavailable(format!("pool {}: {e}", self.name)));
                }
                let sets = self.journal_sets();
                if g.busy.len() != sets {
                    // (the sets change when the last journal device goes:
                    // a leader still writing keeps its set busy)
                    g.busy.resize(sets, false);
                }
                let from = g.batches as usize % sets;
                // lead only while the own record is still queued (not being
                // written by another set's leader)
                let queued = g.queue.iter().any(|p| p.ticket == ticket);
                let free = (0..sets)
                    .map(|i| (from + i) % sets)
                    .find(|&i| queued && !g.busy[i]);
                if let Some(slot) = free {
                    g.busy[slot] = true;
                    let cap = (BATCH_BYTES_MAX / self.bs).min(j.ring_blocks / 2).max(1);
                    let b = take_batch(&mut g.queue, ticket, cap);
                    g.batches += 1;
                    Some((b, slot))
                } else {
                    None
                }
            };
            match batch {
                Some((b, slot)) => {
                    let mut guard = LeaderGuard {
                        j,
                        slot,
                        tickets: b.iter().map(|p| p.ticket).collect(),
                        seqs: Vec::new(),
                        armed: true,
                    };
                    let out = self
                        .journal_group_write(j, b, slot, ticket, &mut guard.seqs)
                        .await;
                    guard.armed = false;
                    {
                        let mut g = j.group.lock();
                        if let Some(b) = g.busy.get_mut(slot) {
                            *b = false;
                        }
                        for (t, r) in out {
                            g.results.insert(t, r);
                        }
                    }
                    j.group_done.notify_waiters();
                }
                None => notified.await,
            }
        }
    }

    /// The leader's ring write: reserves adjacent space for every record of the
    /// batch, writes them as one FUA write per copy, and says per ticket whether
    /// its record is durable (with its sequence number).
    async fn journal_group_write(
        self: &Arc<Self>,
        j: &Journal,
        batch: Vec<Pending>,
        slot: usize,
        own: u64,
        seqs: &mut Vec<u64>,
    ) -> Vec<(u64, Result<Durable, String>)> {
        let fail = |batch: &[Pending], e: String| -> Vec<(u64, Result<Durable, String>)> {
            batch.iter().map(|p| (p.ticket, Err(e.clone()))).collect()
        };
        let mut batch = batch;
        #[cfg(test)]
        {
            let hook = self.before_reserve.lock().clone();
            if let Some(hook) = hook {
                hook(TakenBatch {
                    records: batch.len(),
                    riding: batch.iter().filter(|p| p.kind.riding.is_some()).count(),
                    own_riding: batch
                        .iter()
                        .any(|p| p.ticket == own && p.kind.riding.is_some()),
                })
                .await;
            }
        }
        let (start, rec_seqs, slots) = match self.journal_reserve(j, &mut batch, own, seqs).await {
            Ok(s) => s,
            Err(e) => return fail(&batch, e.to_string()),
        };
        if batch.is_empty() {
            // every record was a completing record, turned away, or the
            // leader's own was and it handed the rest back
            return Vec::new();
        }
        let total: u64 = batch.iter().map(|p| p.blocks).sum();
        let reserved: u64 = batch.iter().map(|p| p.kind.reserve).sum();
        let bs = self.bs as usize;
        let mut buf = Vec::with_capacity(total as usize * bs);
        for (p, &sq) in batch.iter().zip(rec_seqs.iter()) {
            j.note_stripe(p.stripe, sq);
            let pay: Vec<&[u8]> = p.payloads.iter().map(|b| b.as_ref()).collect();
            buf.extend_from_slice(&journal::encode(
                sq,
                self.pool_tag,
                p.kind.link,
                &p.entries,
                &pay,
                bs,
            ));
        }
        for (p, slot) in batch.iter().zip(&slots) {
            if let Some((sq, _, _)) = slot {
                j.note_stripe(p.stripe, *sq);
            }
        }
        // the slots of the completing records, after the batch's own records,
        // on the copies that got the batch (see `Completions`)
        let area_start = start + total;
        let completions = |targets: Vec<(Option<usize>, Arc<crate::pool::MemberHandle>, u64)>| {
            if reserved == 0 {
                return None;
            }
            let n = slots.len();
            Some(Arc::new(Completions {
                targets: targets
                    .into_iter()
                    .map(|(p, h, base)| (p, h, base + area_start))
                    .collect(),
                slots: slots
                    .iter()
                    .map(|sl| sl.map_or((0, 0), |(_, at, len)| (at - area_start, len)))
                    .collect(),
                st: parking_lot::Mutex::new(CompletionState {
                    filled: vec![None; n],
                    written: vec![None; n],
                    abandoned: vec![false; n],
                    writing: false,
                }),
                done: tokio::sync::Notify::new(),
            }))
        };
        let then = |area: &Option<Arc<Completions>>, i: usize| -> Option<Then> {
            let (seq, _, _) = slots[i]?;
            Some(Then {
                seq,
                area: area.clone()?,
                idx: i,
            })
        };
        let buf = Bytes::from(buf);
        let view = match self.view() {
            Ok(v) => v,
            Err(e) => {
                for &sq in seqs.iter() {
                    j.complete(sq);
                }
                return fail(&batch, e.to_string());
            }
        };
        let devs = self.journal_devices();
        if !devs.is_empty() {
            // every device of a mirrored pair gets the batch, at the same offsets
            let futs: Vec<BoxFut<'_, BlockResult<()>>> = devs
                .iter()
                .map(|d| -> BoxFut<'_, BlockResult<()>> {
                    Box::pin(self.m_write_abs(
                        &d.h,
                        d.ring_offset_blocks + start,
                        buf.clone(),
                        true,
                    ))
                })
                .collect();
            let results = join_all(futs).await;
            let w = &self.wp;
            w.journal_batches.fetch_add(1, Ordering::Relaxed);
            w.journal_ring_writes
                .fetch_add(devs.len() as u64, Ordering::Relaxed);
            w.journal_batch_records_max
                .fetch_max(batch.len() as u64, Ordering::Relaxed);
            let mut held = 0u64;
            for (d, r) in devs.iter().zip(&results) {
                match r {
                    Ok(()) => held += 1,
                    Err(e) => {
                        tracing::error!(pool = %self.name, device = %d.h.name, error = %e, "journal device failed");
                        d.failed.store(true, Ordering::SeqCst);
                    }
                }
            }
            w.journal_ring_bytes
                .fetch_add(held * buf.len() as u64, Ordering::Relaxed);
            if held < devs.len() as u64 {
                // A device is gone. Checkpoint everything before this batch (the
                // members flushed: every record the lost device held is in place)
                // and write superblocks that no longer name it, all before this
                // batch is acknowledged: from here on the records a replay needs
                // are on its twin, or (when it was the last) on the members,
                // which the journal goes back to.
                if held == 0 {
                    tracing::error!(pool = %self.name, "no journal device left; journaling on the members");
                }
                // Not under the ring's lock: this batch's sequence numbers
                // are in flight, and a checkpoint of everything (a shutdown's,
                // a salvage's) holds that lock while it waits for them
                // (review of 2026-12-06). Checkpoints may run side by side,
                // and this one waits only for records before the batch.
                let first = seqs.first().copied().unwrap_or(1);
                let cp = self.checkpoint(first.saturating_sub(1)).await;
                if let Err(e) = cp {
                    for &sq in seqs.iter() {
                        j.complete(sq);
                    }
                    return fail(&batch, format!("checkpoint after journal device loss: {e}"));
                }
            }
            if held > 0 {
                w.journal_records
                    .fetch_add(batch.len() as u64, Ordering::Relaxed);
                let area = completions(
                    devs.iter()
                        .zip(&results)
                        .filter(|(_, r)| r.is_ok())
                        .map(|(d, _)| (None, d.h.clone(), d.ring_offset_blocks))
                        .collect(),
                );
                // off the members: a member loss cannot take it
                return batch
                    .iter()
                    .zip(rec_seqs.iter())
                    .enumerate()
                    .map(|(i, (p, &seq))| {
                        let then = then(&area, i);
                        (
                            p.ticket,
                            Ok(Durable {
                                seq,
                                full: true,
                                then,
                                bounced: false,
                            }),
                        )
                    })
                    .collect();
            }
        }
        let set = self.layout.redundancy() + 1;
        let copies = self.journal_copies_n(&view, slot, set + self.spares_now(&view));
        // the copies a batch needs: its set, or every writable member if fewer
        let want = set.min(copies.len());
        self.wp
            .journal_spare_copies
            .fetch_add((copies.len() - want) as u64, Ordering::Relaxed);
        // (a completing record riding the batch has an older sequence number:
        // a checkpoint covering it must wait for this write too)
        let first = rec_seqs.iter().copied().min().unwrap_or(0);
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        for (i, &p) in copies.iter().enumerate() {
            let Some(h) = view.writable(p).map(|a| Arc::clone(a.h)) else {
                continue;
            };
            // registered before it starts: a checkpoint covering the batch
            // waits for it even if the batch is acknowledged without it
            let straggler = Straggler::new(self, first);
            let me = Arc::clone(self);
            let tx = tx.clone();
            let buf = buf.clone();
            let at = j.offset_blocks + start;
            tokio::spawn(async move {
                let r = me.m_write_abs(&h, at, buf, true).await;
                if r.is_err() {
                    me.fail_handle(p, &h).await;
                }
                let _ = tx.send((i, r.is_ok()));
                drop(straggler);
            });
        }
        drop(tx);
        // durable once `want` copies are (or every copy has answered)
        let mut written = 0u64;
        let mut held = Vec::new();
        while (written as usize) < want {
            let Some((i, ok)) = rx.recv().await else {
                break;
            };
            if ok {
                written += 1;
                if i >= want {
                    self.wp.journal_spare_wins.fetch_add(1, Ordering::Relaxed);
                }
                if let Some(h) = view.writable(copies[i]) {
                    held.push((Some(copies[i]), h.h.clone(), j.offset_blocks));
                }
            }
        }
        let area = completions(held);
        let w = &self.wp;
        w.journal_batches.fetch_add(1, Ordering::Relaxed);
        w.journal_ring_writes
            .fetch_add(copies.len() as u64, Ordering::Relaxed);
        w.journal_ring_bytes
            .fetch_add(written * buf.len() as u64, Ordering::Relaxed);
        w.journal_batch_records_max
            .fetch_max(batch.len() as u64, Ordering::Relaxed);
        if written == 0 {
            for &sq in seqs.iter() {
                j.complete(sq);
            }
            return fail(&batch, "journal write failed".to_string());
        }
        w.journal_records
            .fetch_add(batch.len() as u64, Ordering::Relaxed);
        let full = written as usize > self.layout.redundancy();
        batch
            .iter()
            .zip(rec_seqs.iter())
            .enumerate()
            .map(|(i, (p, &seq))| {
                let then = then(&area, i);
                let bounced = false;
                (
                    p.ticket,
                    Ok(Durable {
                        seq,
                        full,
                        then,
                        bounced,
                    }),
                )
            })
            .collect()
    }

    /// How many spare copies a batch gets now: `Pool::set_journal_spare_copies`
    /// while the members reorder their queues, else none. Without reordering
    /// (a FIFO disk) a copy waits its turn like every other request, and a
    /// spare costs a full positioning for nothing: measured (2026-11-28,
    /// `bench/raid-smallwrite`) without NCQ, always writing it took RAID 5 of
    /// 10 from 149/143/280 IOPS to 142/137/260 (4K, 8K, 8K 67/33).
    fn spares_now(&self, view: &View) -> usize {
        let n = self.journal_spares.load(Ordering::Relaxed);
        if n == 0 || self.spare_always.load(Ordering::Relaxed) {
            return n;
        }
        let (mut completed, mut reordered) = (0, 0);
        for (_, h) in view.member_handles() {
            let d = h.depth.snapshot();
            completed += d.completed;
            reordered += d.reordered;
        }
        let mut v = self.spare_verdict.lock();
        // (a member replaced restarts its counts: judge afresh)
        if completed < v.completed || reordered < v.reordered {
            *v = SpareVerdict::default();
        }
        let dc = completed - v.completed;
        if dc >= SPARE_WINDOW {
            v.on = (reordered - v.reordered) * 100 >= dc * SPARE_REORDERED_PERCENT;
            v.completed = completed;
            v.reordered = reordered;
        }
        if v.on {
            n
        } else {
            0
        }
    }

    /// How many group commits may write at once: one per disjoint set of
    /// `redundancy + 1` members (`JOURNAL_SETS_MAX` at most).
    ///
    /// Measured and not kept (2026-11-28, `bench/raid-smallwrite`, the two
    /// variants interleaved): a copy set per member (overlapping, ten on RAID 5
    /// of 10, six on RAID 6 of 6) shortens the wait for a free set, but batches
    /// get smaller (1.7 records instead of 3.2 on RAID 5), so each update costs
    /// about half a ring write more. With NCQ that bought 1-4% on RAID 5 and
    /// 4-9% on RAID 6 (deeper queues), without it cost 5-9% on RAID 5 and 7-11%
    /// on RAID 6, where every ring write is a full positioning (RAID 6 without
    /// NCQ fell to 75-81% of the unprotected figure). With data-first records
    /// (the acknowledged path is then this ring write alone), two group
    /// commits per disjoint set: +10% with NCQ, -10-13% without (docs/0002-raid.md).
    fn journal_sets(&self) -> usize {
        if !self.journal_devices().is_empty() {
            // one ring write at a time on the device (a failing device then
            // checkpoints without waiting for another batch that fails too)
            return 1;
        }
        let n = self.layout.member_count();
        let want = self.layout.redundancy() + 1;
        (n / want).clamp(1, JOURNAL_SETS_MAX)
    }

    /// The members that get the copies of a batch written from copy set `slot`:
    /// `redundancy + 1` writable ones starting at `slot * (redundancy + 1)`, so
    /// concurrent group commits use different members and successive ones rotate
    /// over them (F1: the hot member always holds one, so the journal keeps, and
    /// adds to, the wear skew instead of evening it out).
    pub(crate) fn journal_copies(&self, view: &View, slot: usize) -> Vec<usize> {
        self.journal_copies_n(view, slot, self.layout.redundancy() + 1)
    }

    /// `journal_copies`, and then up to `want` in all: the members that follow
    /// the set (a spare copy: see "A spare copy" in the module notes).
    fn journal_copies_n(&self, view: &View, slot: usize, want: usize) -> Vec<usize> {
        let n = self.layout.member_count();
        let set = self.layout.redundancy() + 1;
        let mut order: Vec<usize> = Vec::with_capacity(n + 1);
        if self.layout.level() == crate::RaidLevel::F1 {
            order.push(n - 1);
        }
        let first = (slot * set) % n.max(1);
        order.extend((0..n).map(|i| (first + i) % n));
        let mut copies: Vec<usize> = Vec::with_capacity(want);
        for p in order {
            if !copies.contains(&p) && view.writable(p).is_some() {
                copies.push(p);
            }
        }
        copies.truncate(want);
        copies
    }

    /// Starts a checkpoint up to record `upto` on its own task, unless one runs
    /// already; the ring's space up to there is freed when it ends. It holds no
    /// lock that group commits need while members flush (see `Inner::checkpoint`).
    fn checkpoint_ahead(self: &Arc<Self>, upto: u64) {
        if self.checkpoint_running.swap(true, Ordering::AcqRel) {
            return;
        }
        let me = Arc::clone(self);
        tokio::spawn(async move {
            me.wp
                .journal_checkpoints_ahead
                .fetch_add(1, Ordering::Relaxed);
            match me.checkpoint(upto).await {
                Ok(()) => {
                    if let Some(j) = &me.journal {
                        let mut a = j.alloc.lock().await;
                        a.live.retain(|r| r.0 > upto);
                    }
                }
                Err(e) => {
                    tracing::warn!(pool = %me.name, error = %e, "background journal checkpoint failed; the next group commit that needs the space checkpoints itself")
                }
            }
            me.checkpoint_running.store(false, Ordering::Release);
        });
    }

    /// Reserves adjacent ring blocks for the records of `batch`, giving them
    /// consecutive sequence numbers (pushed to `seqs`, registered in flight),
    /// checkpointing first when the space is still held by records not yet
    /// covered by a checkpoint. After the batch's records come the slots of
    /// the records that will complete its data-first ones, each with its
    /// sequence number (also pushed to `seqs` and in flight). A completing
    /// record riding the batch keeps the sequence number set aside for it
    /// (already in flight), and never waits for a checkpoint or for the ring's
    /// lock (a checkpoint may be waiting for it): when either would be needed
    /// it is turned away (`bounce`) and the rest goes on. When the leader's
    /// own record (ticket `own`) is one of those, the leader stops leading:
    /// it hands the rest of the batch back to the queue (`batch` left empty)
    /// and writes its record into its slot, since the checkpoint its batch
    /// would wait for may be waiting for that very record (a checkpoint that
    /// took the ring's lock after the leader took its batch from the queue,
    /// so that `refuse_riding` did not see it there). Returns the first
    /// ring block, each record's sequence number and, per record, its
    /// completing record's (sequence, ring block, blocks).
    #[allow(clippy::type_complexity)]
    async fn journal_reserve(
        self: &Arc<Self>,
        j: &Journal,
        batch: &mut Vec<Pending>,
        own: u64,
        seqs: &mut Vec<u64>,
    ) -> BlockResult<(u64, Vec<u64>, Vec<Option<(u64, u64, u64)>>)> {
        let riding = |b: &[Pending]| b.iter().any(|p| p.kind.riding.is_some());
        let none = || Ok((0, Vec::new(), Vec::new()));
        if riding(batch) && !self.journal_devices().is_empty() {
            // (a device's loss checkpoints everything before its batch)
            if self.bounce(j, batch, own) {
                return none();
            }
        }
        let mut a = match j.alloc.try_lock() {
            Ok(a) => a,
            Err(_) => {
                if self.bounce(j, batch, own) {
                    return none();
                }
                j.alloc.lock().await
            }
        };
        loop {
            let total: u64 = batch.iter().map(|p| p.blocks + p.kind.reserve).sum();
            if total > j.ring_blocks {
                return Err(BlockError::NotSupported(
                    "journal batch larger than the ring",
                ));
            }
            if batch.is_empty() {
                return Ok((0, Vec::new(), Vec::new()));
            }
            let (start, blocking) = a.place(total, j.ring_blocks);
            if blocking.is_some() && riding(batch) {
                if self.bounce(j, batch, own) {
                    return none();
                }
                continue;
            }
            match blocking {
                None => {
                    let mut at = start;
                    let mut f = j.inflight.lock();
                    let mut rec_seqs = Vec::with_capacity(batch.len());
                    for p in batch.iter() {
                        let seq = match p.kind.riding {
                            Some((seq, _)) => seq,
                            None => {
                                let seq = a.next_seq;
                                a.next_seq += 1;
                                f.seqs.insert(seq);
                                seqs.push(seq);
                                seq
                            }
                        };
                        a.live.push_back((seq, at, p.blocks));
                        at += p.blocks;
                        rec_seqs.push(seq);
                    }
                    let mut slots = Vec::with_capacity(batch.len());
                    for p in batch.iter() {
                        if p.kind.reserve == 0 {
                            slots.push(None);
                            continue;
                        }
                        let seq = a.next_seq;
                        a.next_seq += 1;
                        a.live.push_back((seq, at, p.kind.reserve));
                        slots.push(Some((seq, at, p.kind.reserve)));
                        at += p.kind.reserve;
                        f.seqs.insert(seq);
                        seqs.push(seq);
                    }
                    drop(f);
                    a.head_blocks = start + total;
                    // The next quarter of the ring still holds records: make it
                    // free now, in the background, so that no group commit has
                    // to wait for a checkpoint (members flushed, superblocks
                    // written) when it gets there.
                    // It covers the next half, so that the next one is due
                    // only a quarter of the ring later (a window sliding one
                    // record at a time would checkpoint every few records).
                    let ahead = (j.ring_blocks / journal::RECLAIM_PARTS).max(1);
                    if a.place(ahead, j.ring_blocks).1.is_some() {
                        if let (_, Some(upto)) = a.place(2 * ahead, j.ring_blocks) {
                            self.checkpoint_ahead(upto);
                        }
                    }
                    return Ok((start, rec_seqs, slots));
                }
                Some(upto) => {
                    self.wp.journal_checkpoints.fetch_add(1, Ordering::Relaxed);
                    self.checkpoint(upto).await?;
                    // (a completing record that rode a later batch sits
                    // among newer records: not in sequence order)
                    a.live.retain(|r| r.0 > upto);
                }
            }
        }
    }

    /// Turns away the completing records riding `batch` (removed from it):
    /// they go to the slots set aside for them instead. If the leader's own
    /// record (ticket `own`) is one of them, the rest of the batch goes back
    /// to the head of the queue, in its order, for another leader (`batch`
    /// left empty), and true is returned: the leader must not wait for
    /// anything on the batch's behalf (see `journal_reserve`).
    fn bounce(&self, j: &Journal, batch: &mut Vec<Pending>, own: u64) -> bool {
        let mut out = Vec::new();
        batch.retain(|p| {
            let ride = p.kind.riding.is_some();
            if ride {
                out.push(p.ticket);
            }
            !ride
        });
        if out.is_empty() {
            return false;
        }
        let handed_back = out.contains(&own);
        let mut g = j.group.lock();
        for t in out {
            g.results.insert(t, Ok(Durable::bounced()));
        }
        if handed_back {
            let rest = std::mem::take(batch);
            g.queue.splice(0..0, rest);
        }
        drop(g);
        j.group_done.notify_waiters();
        handed_back
    }

    /// A checkpoint up to `upto` is about to wait for every record up to
    /// there: the records completing data-first records up to `upto` no longer
    /// ride group commits, and those queued are turned away, since a group
    /// commit may wait for that checkpoint (see "Completing records ride the
    /// next group commit").
    pub(crate) fn refuse_riding(&self, upto: u64) {
        let Some(j) = &self.journal else {
            return;
        };
        let mut g = j.group.lock();
        if upto <= g.ride_floor {
            return;
        }
        g.ride_floor = upto;
        let mut out = Vec::new();
        g.queue.retain(|p| match p.kind.riding {
            Some((_, d)) if d <= upto => {
                out.push(p.ticket);
                false
            }
            _ => true,
        });
        for t in out {
            g.results.insert(t, Ok(Durable::bounced()));
        }
        drop(g);
        j.group_done.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pending(ticket: u64, blocks: u64, kind: RecordKind) -> Pending {
        Pending {
            ticket,
            stripe: ticket,
            entries: Vec::new(),
            payloads: Vec::new(),
            blocks,
            kind,
        }
    }

    fn tickets(b: &[Pending]) -> Vec<u64> {
        b.iter().map(|p| p.ticket).collect()
    }

    /// A leader whose own completing record lies past what fits one batch
    /// takes it alone (the deadlock `take_batch` is there for: review of
    /// 2026-12-06); any other leader takes the head of the queue.
    #[test]
    fn a_leader_always_carries_its_own_completing_record() {
        let queue = || {
            vec![
                pending(1, 300, RecordKind::data_first(200)),
                pending(2, 3, RecordKind::completing(10, 9)),
                pending(3, 3, RecordKind::whole()),
            ]
        };
        // the first record alone fills the batch
        let mut q = queue();
        assert_eq!(tickets(&take_batch(&mut q, 2, 256)), vec![2]);
        assert_eq!(tickets(&q), vec![1, 3]);
        let mut q = queue();
        assert_eq!(tickets(&take_batch(&mut q, 3, 256)), vec![1]);
        assert_eq!(tickets(&q), vec![2, 3]);
        let mut q = queue();
        assert_eq!(tickets(&take_batch(&mut q, 1, 256)), vec![1]);
        // room for all
        let mut q = queue();
        assert_eq!(tickets(&take_batch(&mut q, 2, 1024)), vec![1, 2, 3]);
        assert!(q.is_empty());
        let mut q = vec![
            pending(4, 3, RecordKind::whole()),
            pending(5, 3, RecordKind::completing(12, 11)),
        ];
        assert_eq!(tickets(&take_batch(&mut q, 5, 256)), vec![4, 5]);
    }
}
