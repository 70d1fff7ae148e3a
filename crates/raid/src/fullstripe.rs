//! Full-stripe writes of parity pools: gathering sequential partial-stripe writes
//! into whole stripes, writing whole stripes without the journal, and the
//! write-intent regions that make that safe across a crash.
//!
//! A whole-stripe write replaces every data chunk of the stripe, so no older
//! acknowledged data of that stripe depends on its parity: it needs no reads and
//! no journal record. What it needs is that a crash in the middle (some chunks
//! new, some old, parity of neither) is found and the stripe's parity recomputed
//! before a later member loss reconstructs from it. That is the write intent: the
//! pool's data area is cut into regions (`region_stripes` stripes, 64 MiB of
//! every member by default); before the first whole-stripe write into a region,
//! the region is recorded as dirty in the superblocks (FUA, group-committed), and
//! a region idle for a while is flushed and cleared again. Each of those updates
//! costs every member a seek to its superblock and back, which in the middle of a
//! stream stalls the whole pool: a stream entering a new region marks the next
//! [`INTENT_AHEAD`] as well, and idle regions are cleared [`CLEAR_BATCH`] at a
//! time (or when the pool is quiet, or after [`REGION_IDLE_MAX`]). An unclean assemble
//! resyncs the dirty regions' parity from their data in the background
//! (`background.rs`), and until then partial writes there reconstruct-write.
//!
//! Gathering: a partial-stripe write that looks like part of a sequential stream
//! (it lies within a few stripes of a recent write, or joins a stripe already
//! gathering)
//! while other writes are in flight waits for the rest of its stripe, as long as
//! writes keep arriving at the pool: it gives up when no write has arrived for
//! about four member-write latencies (an EWMA, clamped to [`GATHER_IDLE_MIN`],
//! [`GATHER_IDLE_MAX`]), or after [`GATHER_MAX`]. With many writes in flight the
//! next ones come only as earlier ones complete, so the wait must outlast a member
//! write, not a network round trip. When the writes waiting on a stripe cover all
//! of it, they are written as one whole stripe; when the wait ends first, they are
//! written together as one journaled partial-stripe update.

use crate::io::Seg;
use crate::pool::Inner;
use crate::util::{join_all, BoxFut};
use crate::{gf, io::unavailable};
use block::{BlockError, BlockResult, Bytes};
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

/// Bounds of the idle time after which a gathering stripe stops waiting.
pub(crate) const GATHER_IDLE_MIN: Duration = Duration::from_millis(1);
pub(crate) const GATHER_IDLE_MAX: Duration = Duration::from_millis(50);
/// Longest a partial-stripe write waits for the rest of its stripe.
pub(crate) const GATHER_MAX: Duration = Duration::from_millis(200);
/// Bytes of every member one write-intent region covers.
pub(crate) const REGION_MEMBER_BYTES: u64 = 64 << 20;
/// Most dirty regions at once (bounds the superblock, ~16 KiB of it); beyond it
/// whole-stripe writes fall back to the journal and mirror writes wait for the
/// cleaner.
pub(crate) const MAX_DIRTY_REGIONS: usize = 2048;
/// A region without whole-stripe writes for this long may be flushed and cleared.
pub(crate) const REGION_IDLE: Duration = Duration::from_secs(2);
/// Idle regions are cleared together once this many are clearable (or the pool
/// is quiet, or one has been idle for [`REGION_IDLE_MAX`]): clearing is a
/// superblock write on every member, a seek to the start of each disk and back
/// in the middle of a stream.
pub(crate) const CLEAR_BATCH: usize = 8;
/// Longest a clearable region stays dirty while the pool is busy elsewhere.
pub(crate) const REGION_IDLE_MAX: Duration = Duration::from_secs(30);
/// A stream that enters a new region (the one below it is dirty) marks this
/// many regions beyond it in the same superblock write, so a sequential writer
/// pays one superblock update per `1 + INTENT_AHEAD` regions instead of one each.
pub(crate) const INTENT_AHEAD: u64 = 4;
/// Recent write ranges remembered for stream detection.
const RECENT_WRITES: usize = 64;
/// How close (in stripes) to a recent write a write must be to count as a stream.
const NEAR_STRIPES: u64 = 4;
/// How many of the recent writes must be that close for a write that does not
/// start exactly where one of them ended to count as part of a stream. One was
/// enough before: then about one random write in eight on RAID 5 of 10 HDDs of
/// 512 MiB (64 recent writes, each with a window of 9 of the pool's 4,088
/// stripes) was taken for a stream and waited the whole `GATHER_MAX` for a
/// stripe that never filled, holding its request and leaving the members
/// shallower queues (`bench/raid-smallwrite` counts these as gather timeouts).
/// A stream has dozens of its own writes in the window; random writes
/// rarely have three (under 0.5% of them even with the writes confined to a
/// quarter of that pool).
const STREAM_NEIGHBOURS: usize = 3;
/// A gathering stripe whose stream has written this many stripes further on
/// stops waiting (requests of a stream arrive nearly in order).
const PASSED_STRIPES: u64 = 3;

/// One dirty write-intent region.
#[derive(Debug)]
pub(crate) struct Region {
    /// The superblocks on disk list it.
    pub durable: bool,
    /// `intent_seq` when it was added (a persist covering it makes it durable).
    pub seq: u64,
    /// Whole-stripe writes into it in flight.
    pub inflight: u32,
    pub last_use: Instant,
    /// The cleaner is flushing to clear it; a new write cancels that.
    pub clearing: bool,
    /// A write has entered it (false for a region marked ahead of a stream).
    pub written: bool,
}

/// Stripes written whole without FUA that wait for the members' next flush
/// (`Inner::unflushed_whole`) before one is flushed for them.
const UNFLUSHED_WHOLE_MAX: usize = 1 << 16;

impl Region {
    /// Idle long enough to clear: [`REGION_IDLE`], except that a region marked
    /// ahead of a stream that has not reached it waits [`REGION_IDLE_MAX`] unless
    /// the pool is `quiet` (the stream has stopped).
    fn clearable(&self, quiet: bool) -> bool {
        let idle = if self.written || quiet {
            REGION_IDLE
        } else {
            REGION_IDLE_MAX
        };
        self.inflight == 0 && self.durable && self.last_use.elapsed() >= idle
    }
}

/// Partial-stripe writes waiting for the rest of their stripe.
pub(crate) struct Batch {
    id: u64,
    /// (first block within the stripe's data, bytes), in arrival order.
    parts: Vec<(u64, Bytes)>,
    fua: bool,
    waiters: Vec<oneshot::Sender<Result<(), BatchError>>>,
}

#[derive(Default)]
pub(crate) struct Gather {
    batches: HashMap<u64, Batch>,
    next_id: u64,
    recent: VecDeque<(u64, u64)>,
}

/// Blocks of `0..total` covered by the union of the parts.
fn covered_blocks(parts: &[(u64, Bytes)], bs: u64, total: u64) -> u64 {
    let mut iv: Vec<(u64, u64)> = parts
        .iter()
        .map(|(at, b)| (*at, (*at + b.len() as u64 / bs).min(total)))
        .collect();
    iv.sort_unstable();
    let mut sum = 0;
    let mut cur_end = 0;
    for (a, b) in iv {
        let a = a.max(cur_end);
        if b > a {
            sum += b - a;
            cur_end = b;
        }
    }
    sum
}

impl Inner {
    /// Blocks of pool data in one stripe.
    pub(crate) fn stripe_blocks(&self) -> u64 {
        self.layout.data_chunks() as u64 * self.cb
    }

    /// Writes one stripe's group of a request: whole stripes directly, sequential
    /// partial stripes through the gatherer, others as partial-stripe updates.
    pub(crate) async fn write_parity_group(
        self: &Arc<Self>,
        s: u64,
        segs: &[Seg],
        data: &Bytes,
        fua: bool,
        lba: u64,
        blocks: u64,
    ) -> BlockResult<()> {
        let sb = self.stripe_blocks();
        let first = segs[0];
        let rel = first.d as u64 * self.cb + first.off;
        let len: u64 = segs.iter().map(|g| g.blocks).sum();
        let bytes = data.slice(first.buf_off..first.buf_off + (len * self.bs) as usize);
        if len == sb {
            return self.write_full_stripe(s, bytes, fua).await;
        }
        if self.should_gather(s, lba, blocks) {
            return self.gather_write(s, rel, bytes, fua).await;
        }
        self.write_parity_stripe(s, segs, data, fua).await
    }

    /// True when a partial-stripe write should wait for the rest of its stripe.
    fn should_gather(&self, s: u64, lba: u64, blocks: u64) -> bool {
        let mut g = self.gather.lock();
        // requests of one stream arrive slightly out of order: a write within a
        // few stripes of a recent one counts as part of a stream
        let near = NEAR_STRIPES * self.stripe_blocks();
        let close = g
            .recent
            .iter()
            .filter(|&&(a, b)| lba <= b + near && a <= lba + blocks + near)
            .count();
        let adjacent = g.recent.iter().any(|&(_, b)| b == lba);
        let sequential = adjacent || close >= STREAM_NEIGHBOURS;
        if g.recent.len() == RECENT_WRITES {
            g.recent.pop_front();
        }
        g.recent.push_back((lba, lba + blocks));
        g.batches.contains_key(&s) || (sequential && self.fg_inflight.load(Ordering::SeqCst) > 1)
    }

    async fn gather_write(
        self: &Arc<Self>,
        s: u64,
        rel: u64,
        bytes: Bytes,
        fua: bool,
    ) -> BlockResult<()> {
        let total = self.stripe_blocks();
        let (tx, mut rx) = oneshot::channel();
        let (leader, complete) = {
            let mut g = self.gather.lock();
            if !g.batches.contains_key(&s) {
                let id = g.next_id;
                g.next_id += 1;
                g.batches.insert(
                    s,
                    Batch {
                        id,
                        parts: Vec::new(),
                        fua: false,
                        waiters: Vec::new(),
                    },
                );
            }
            let b = g.batches.get_mut(&s).expect("just inserted");
            let leader = b.parts.is_empty().then_some(b.id);
            b.parts.push((rel, bytes));
            b.fua |= fua;
            b.waiters.push(tx);
            let complete = if covered_blocks(&b.parts, self.bs, total) == total {
                g.batches.remove(&s)
            } else {
                None
            };
            (leader, complete)
        };
        if let Some(b) = complete {
            self.spawn_batch(s, b);
        } else if let Some(id) = leader {
            let cap = Instant::now() + GATHER_MAX;
            let passed = loop {
                let idle = self.gather_idle();
                let now = Instant::now();
                // earlier stripes still being written: their completions free
                // the initiator's window, and the rest of this stripe follows
                let last = if self.stripe_writes.load(Ordering::Relaxed) > 0 {
                    now
                } else {
                    self.last_write_at()
                };
                if self.stream_passed(s) {
                    break true;
                }
                if now >= cap || now.saturating_duration_since(last) >= idle {
                    break false;
                }
                let until = (last + idle).min(cap);
                if let Ok(r) = tokio::time::timeout_at(until.into(), &mut rx).await {
                    return finish(r);
                }
            };
            let b = {
                let mut g = self.gather.lock();
                match g.batches.get(&s) {
                    Some(b) if b.id == id => g.batches.remove(&s),
                    _ => None,
                }
            };
            if let Some(b) = b {
                self.gather_timeouts.fetch_add(1, Ordering::Relaxed);
                if passed {
                    self.gather_passed.fetch_add(1, Ordering::Relaxed);
                }
                self.spawn_batch(s, b);
            }
        }
        finish(rx.await)
    }

    /// True when writes have arrived a few stripes past `s` (its stream has
    /// moved on, so the rest of `s` is not coming).
    fn stream_passed(&self, s: u64) -> bool {
        let sb = self.stripe_blocks();
        let lo = (s + PASSED_STRIPES) * sb;
        let hi = lo + NEAR_STRIPES * sb;
        self.gather
            .lock()
            .recent
            .iter()
            .any(|&(a, _)| a >= lo && a < hi)
    }

    /// How long without a new write ends a gathering wait: about four member
    /// writes.
    fn gather_idle(&self) -> Duration {
        let ewma = Duration::from_nanos(self.write_ewma_ns.load(Ordering::Relaxed));
        (4 * ewma).clamp(GATHER_IDLE_MIN, GATHER_IDLE_MAX)
    }

    /// When the last write arrived at the pool.
    fn last_write_at(&self) -> Instant {
        self.epoch + Duration::from_nanos(self.last_write_ns.load(Ordering::Relaxed))
    }

    /// Notes a write's arrival (for gathering).
    pub(crate) fn note_write_arrival(&self) {
        let ns = self.epoch.elapsed().as_nanos() as u64;
        self.last_write_ns.fetch_max(ns, Ordering::Relaxed);
    }

    /// Feeds a member write's latency into the EWMA.
    pub(crate) fn note_member_write(&self, took: Duration) {
        let sample = took.as_nanos().min(u64::MAX as u128) as u64;
        let old = self.write_ewma_ns.load(Ordering::Relaxed);
        let new = if old == 0 {
            sample
        } else {
            old - old / 8 + sample / 8
        };
        self.write_ewma_ns.store(new, Ordering::Relaxed);
    }

    /// Writes a batch in its own task, so a waiter that goes away cannot cut the
    /// others' write short.
    fn spawn_batch(self: &Arc<Self>, s: u64, b: Batch) {
        let inner = self.clone();
        tokio::spawn(async move {
            let r = inner.write_batch(s, &b.parts, b.fua).await;
            let r = r.map_err(|e| match e {
                BlockError::Medium { lba } => BatchError::Medium(lba),
                other => BatchError::Other(other.to_string()),
            });
            for w in b.waiters {
                let _ = w.send(r.clone());
            }
        });
    }

    /// Merges the parts (later ones win where they overlap) and writes them as a
    /// whole stripe if they cover it, else as one partial-stripe update.
    async fn write_batch(
        self: &Arc<Self>,
        s: u64,
        parts: &[(u64, Bytes)],
        fua: bool,
    ) -> BlockResult<()> {
        let total = self.stripe_blocks();
        let bs = self.bs as usize;
        let mut buf = vec![0u8; total as usize * bs];
        let mut have = vec![false; total as usize];
        for (at, b) in parts {
            let at = *at as usize;
            let n = (b.len() / bs).min(total as usize - at);
            buf[at * bs..(at + n) * bs].copy_from_slice(&b[..n * bs]);
            have[at..at + n].iter_mut().for_each(|h| *h = true);
        }
        let buf = Bytes::from(buf);
        if have.iter().all(|&h| h) {
            return self.write_full_stripe(s, buf, fua).await;
        }
        let base = s * total;
        let mut segs = Vec::new();
        let mut i = 0usize;
        while i < have.len() {
            if !have[i] {
                i += 1;
                continue;
            }
            let start = i;
            while i < have.len() && have[i] {
                i += 1;
            }
            for mut g in self.segments(base + start as u64, (i - start) as u64) {
                g.buf_off += start * bs;
                segs.push(g);
            }
        }
        // One record per update: a stripe cut into more runs than a record's
        // entries (small blocks written every other one within the gather
        // window) is written part by part instead, in order (later parts win
        // where they overlap, as merged), each part one contiguous update.
        if segs.len() + self.layout.parity_positions(s).len() > crate::journal::MAX_ENTRIES {
            for (at, b) in parts {
                let n = (b.len() / bs).min(total as usize - *at as usize);
                let part = b.slice(..n * bs);
                let segs = self.segments(base + at, n as u64);
                self.write_parity_stripe(s, &segs, &part, fua).await?;
            }
            return Ok(());
        }
        self.write_parity_stripe(s, &segs, &buf, fua).await
    }

    /// Writes a whole stripe (`data`: every data chunk in order): parity computed
    /// from the new data, no reads, no journal record, under a durable write intent
    /// for its region. Falls back to a journaled update when the pool is degraded,
    /// the journal still holds a record for this stripe (replaying it later would
    /// revert this write), too many regions are dirty, or whole stripes are
    /// configured to be journaled.
    pub(crate) async fn write_full_stripe(
        self: &Arc<Self>,
        s: u64,
        data: Bytes,
        fua: bool,
    ) -> BlockResult<()> {
        let _g = self.lock_for(s).write().await;
        let view = self.view()?;
        let n = self.layout.member_count();
        let degraded = (0..n).any(|p| view.writable(p).is_none());
        let journaled = self.journal_whole.load(Ordering::Relaxed)
            || self.journal.as_ref().is_some_and(|j| j.has_live(s));
        let region = s / self.region_stripes;
        let ticket = if degraded || journaled {
            None
        } else if self.intent_off {
            Some(None)
        } else {
            self.intent_enter(region)
        };
        let Some(need) = ticket else {
            let segs = self.segments(s * self.stripe_blocks(), self.stripe_blocks());
            return self
                .write_parity_locked(s, &segs, &data, fua, view, None)
                .await;
        };
        self.full_writes.fetch_add(1, Ordering::Relaxed);
        let _busy = crate::io::FgGuard::new(&self.stripe_writes);
        let r = self.full_stripe_in_place(s, &data, fua, need, &view).await;
        if !self.intent_off {
            self.intent_leave(region);
        }
        r
    }

    async fn full_stripe_in_place(
        &self,
        s: u64,
        data: &Bytes,
        fua: bool,
        need: Option<u64>,
        view: &crate::pool::View,
    ) -> BlockResult<()> {
        if let Some(seq) = need {
            self.intent_durable(seq).await?;
        }
        let k = self.layout.data_chunks();
        let chunk = (self.cb * self.bs) as usize;
        let pp = self.layout.parity_positions(s);
        let refs: Vec<&[u8]> = (0..k).map(|d| &data[d * chunk..(d + 1) * chunk]).collect();
        let mut p = vec![0u8; chunk];
        let mut q = vec![0u8; if pp.len() > 1 { chunk } else { 0 }];
        gf::compute_pq(&refs, &mut p, (pp.len() > 1).then_some(q.as_mut_slice()));
        let mut writes: Vec<(usize, Bytes)> = (0..k)
            .map(|d| {
                (
                    self.layout.data_positions(s, d)[0],
                    data.slice(d * chunk..(d + 1) * chunk),
                )
            })
            .collect();
        writes.push((pp[0], Bytes::from(p)));
        if pp.len() > 1 {
            writes.push((pp[1], Bytes::from(q)));
        }
        let futs: Vec<BoxFut<'_, BlockResult<()>>> = writes
            .iter()
            .map(|(pos, b)| -> BoxFut<'_, BlockResult<()>> {
                Box::pin(async move {
                    match view.writable(*pos) {
                        Some(h) => self.m_write_in_order(h, s * self.cb, b.clone(), fua).await,
                        None => Ok(()),
                    }
                })
            })
            .collect();
        let results = join_all(futs).await;
        for ((pos, _), r) in writes.iter().zip(results) {
            if let Err(e) = r {
                if let Some(h) = view.writable(*pos) {
                    tracing::warn!(pool = %self.name, position = pos, error = %e, "member write failed");
                    self.fail_handle(*pos, &h).await;
                }
            }
        }
        if self.is_failed() {
            return Err(unavailable(format!(
                "pool {}: failed during write of stripe {s}",
                self.name
            )));
        }
        if !fua {
            // until the members' next flush these chunks and parity may be
            // in their volatile caches only: see `write_parity_locked`
            let at = self.flushes_started.load(Ordering::Acquire);
            let crossed = {
                let mut set = self.unflushed_whole.lock();
                set.insert(s, at).is_none() && set.len() == UNFLUSHED_WHOLE_MAX + 1
            };
            // bounded: a client that never flushes, with the write intent off
            // (nothing else flushes then), gets a flush every so many; only
            // the write that crosses the bound flushes (the set shrinks when
            // that flush ends, and the writes meanwhile must not each start one)
            if crossed {
                self.flush_members().await?;
            }
        }
        Ok(())
    }

    /// Registers a whole-stripe write into `region`: `Some(None)` when the region
    /// is already durable as dirty, `Some(Some(seq))` when a superblock write
    /// covering `seq` must come first, `None` when too many regions are dirty.
    fn intent_enter(&self, region: u64) -> Option<Option<u64>> {
        let mut st = self.state.lock();
        if let Some(r) = st.intent.get_mut(&region) {
            r.inflight += 1;
            r.clearing = false;
            r.written = true;
            r.last_use = Instant::now();
            return Some((!r.durable).then_some(r.seq));
        }
        if st.intent.len() >= MAX_DIRTY_REGIONS {
            return None;
        }
        st.intent_seq += 1;
        let seq = st.intent_seq;
        let now = Instant::now();
        let stream = region > 0 && st.intent.contains_key(&(region - 1));
        st.intent.insert(
            region,
            Region {
                durable: false,
                seq,
                inflight: 1,
                last_use: now,
                clearing: false,
                written: true,
            },
        );
        if stream {
            let regions = self.stripes().div_ceil(self.region_stripes);
            for a in (region + 1..regions).take(INTENT_AHEAD as usize) {
                if st.intent.len() >= MAX_DIRTY_REGIONS {
                    break;
                }
                st.intent.entry(a).or_insert(Region {
                    durable: false,
                    seq,
                    inflight: 0,
                    last_use: now,
                    clearing: false,
                    written: false,
                });
            }
        }
        Some(Some(seq))
    }

    /// Enters the write intent of stripe `s`'s region for a mirror write (or
    /// discard): waits for the superblocks to list the region, and for room when
    /// [`MAX_DIRTY_REGIONS`] are dirty (the cleaner frees idle regions every
    /// second). Returns the region to pass to [`Inner::intent_end`].
    pub(crate) async fn intent_begin(&self, s: u64) -> BlockResult<Option<u64>> {
        if self.intent_off {
            return Ok(None);
        }
        let region = s / self.region_stripes;
        loop {
            match self.intent_enter(region) {
                Some(None) => return Ok(Some(region)),
                Some(Some(seq)) => {
                    if let Err(e) = self.intent_durable(seq).await {
                        self.intent_leave(region);
                        return Err(e);
                    }
                    return Ok(Some(region));
                }
                None => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    }

    /// Leaves the region entered by [`Inner::intent_begin`].
    pub(crate) fn intent_end(&self, region: Option<u64>) {
        if let Some(r) = region {
            self.intent_leave(r);
        }
    }

    fn intent_leave(&self, region: u64) {
        let mut st = self.state.lock();
        let durable = self.durable_intent_seq.load(Ordering::SeqCst);
        if let Some(r) = st.intent.get_mut(&region) {
            r.inflight = r.inflight.saturating_sub(1);
            r.last_use = Instant::now();
            if r.seq <= durable {
                r.durable = true;
            }
        }
    }

    /// Waits until the superblocks list every intent up to `seq` (one superblock
    /// write serves every writer waiting at that time).
    async fn intent_durable(&self, seq: u64) -> BlockResult<()> {
        if self.durable_intent_seq.load(Ordering::SeqCst) >= seq {
            return Ok(());
        }
        let _g = self.sb_lock.lock().await;
        if self.durable_intent_seq.load(Ordering::SeqCst) >= seq {
            return Ok(());
        }
        self.persist_locked().await
    }

    /// Clears regions idle for [`REGION_IDLE`]: flush every member (their
    /// whole-stripe writes are then durable and consistent), drop them from the
    /// intent and persist. Called about once a second by the pool's timer task.
    pub(crate) async fn clean_intents(&self) {
        let any = {
            let mut st = self.state.lock();
            let durable = self.durable_intent_seq.load(Ordering::SeqCst);
            for r in st.intent.values_mut() {
                if r.seq <= durable {
                    r.durable = true;
                }
            }
            // quiet: no write in flight and none for REGION_IDLE; then regions
            // marked ahead of a stream that stopped are cleared as well
            let quiet = st
                .intent
                .values()
                .all(|r| r.inflight == 0 && (!r.written || r.last_use.elapsed() >= REGION_IDLE));
            let clearable = |r: &Region| r.clearable(quiet);
            let count = st.intent.values().filter(|r| clearable(r)).count();
            let stale = st
                .intent
                .values()
                .any(|r| clearable(r) && r.last_use.elapsed() >= REGION_IDLE_MAX);
            let go = count > 0 && (count >= CLEAR_BATCH || quiet || stale);
            if go {
                for r in st.intent.values_mut() {
                    if clearable(r) {
                        r.clearing = true;
                    }
                }
            }
            go
        };
        if !any || self.flush_members().await.is_err() {
            return;
        }
        let removed = {
            let mut st = self.state.lock();
            let before = st.intent.len();
            st.intent.retain(|_, r| !(r.clearing && r.inflight == 0));
            let removed = st.intent.len() != before;
            if removed {
                st.intent_seq += 1;
            }
            removed
        };
        if removed {
            if let Err(e) = self.persist().await {
                tracing::warn!(pool = %self.name, error = %e, "could not persist cleared write intents");
            }
        }
    }

    /// Regions the superblock lists as dirty: those with whole-stripe writes and
    /// those still waiting for their post-crash resync.
    pub(crate) fn dirty_regions(st: &crate::pool::State) -> Vec<u64> {
        let mut v: Vec<u64> = st.intent.keys().copied().collect();
        v.extend(st.resync_regions.iter().copied());
        v.sort_unstable();
        v.dedup();
        v
    }
}

/// How a gathered batch's write failed, for each of its waiters: a medium
/// error stays one (unreadable sectors its read-modify-write met), as the
/// same write not gathered answers.
#[derive(Clone, Debug)]
enum BatchError {
    Medium(u64),
    Other(String),
}

fn finish(r: Result<Result<(), BatchError>, oneshot::error::RecvError>) -> BlockResult<()> {
    match r {
        Ok(Ok(())) => Ok(()),
        Ok(Err(BatchError::Medium(lba))) => Err(BlockError::Medium { lba }),
        Ok(Err(BatchError::Other(e))) => Err(BlockError::Unavailable(e)),
        Err(_) => Err(BlockError::Unavailable(
            "stripe write abandoned".to_string(),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn coverage_counts_the_union() {
        let b = |n: usize| Bytes::from(vec![0u8; n * 512]);
        assert_eq!(covered_blocks(&[(0, b(4)), (2, b(4))], 512, 10), 6);
        assert_eq!(covered_blocks(&[(6, b(4)), (0, b(6))], 512, 10), 10);
        assert_eq!(covered_blocks(&[(0, b(2)), (5, b(2))], 512, 10), 4);
        assert_eq!(covered_blocks(&[(8, b(4))], 512, 10), 2);
    }

    /// A gathered update of a stripe cut into more runs than a journal
    /// record holds (512-byte blocks written every other one: 1,152 runs in
    /// a stripe of RAID 5 of 10 with 128 KiB chunks) is written part by
    /// part and reads back. Written as one record, it would be refused
    /// (more entries than a replay decodes), or before that acknowledged and
    /// then lost at a replay.
    #[tokio::test]
    async fn a_gathered_update_of_more_runs_than_a_record_holds_is_written_part_by_part() {
        use crate::{Member, Pool, PoolConfig, RaidLevel};
        use block::{MemVolume, Volume, VolumeRef};
        let members: Vec<Member> = (0..10)
            .map(|i| {
                let m = Arc::new(MemVolume::new(512, (64 << 20) / 512)) as VolumeRef;
                Member::new(format!("m{i}"), m)
            })
            .collect();
        let mut cfg = PoolConfig::new("runs", RaidLevel::Raid5);
        cfg.rebuild_rate_mb_s = 0; // unpaced
        let pool = Pool::create(cfg, members, vec![]).await.expect("create");
        pool.wait_idle().await;
        let total = pool.inner.stripe_blocks();
        assert_eq!(total, 9 * 256);
        let fill = |b: u64| (b % 251) as u8 + 1;
        let parts: Vec<(u64, Bytes)> = (0..total)
            .step_by(2)
            .map(|b| (b, Bytes::from(vec![fill(b); 512])))
            .collect();
        assert!(parts.len() > crate::journal::MAX_ENTRIES);
        pool.inner.write_batch(0, &parts, false).await.unwrap();
        let back = pool.read(0, total as u32).await.unwrap();
        for b in 0..total {
            let want = if b % 2 == 0 { fill(b) } else { 0 };
            let got = &back[b as usize * 512..(b as usize + 1) * 512];
            assert!(got.iter().all(|&x| x == want), "block {b}");
        }
        pool.shutdown().await.unwrap();
    }
}
