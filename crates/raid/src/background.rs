//! Background work of a pool: rebuild of replaced members and the initial (lazy)
//! resync. One worker task per pool, woken by membership changes.
//!
//! Both go stripe by stripe under the stripe's exclusive lock, so foreground
//! writes are ordered with them; writes during a rebuild go to the rebuilding
//! member as well, and the rebuild redoes them harmlessly. Both share the members
//! with foreground I/O (while it is in flight they rest after each unit of work as
//! long as the unit took) and respect the pool's MB/s cap. A RAID 5 / F1 rebuild
//! of one member reads [`REBUILD_BATCH_BYTES`] of every survivor per step.

use crate::gf;
use crate::layout::Scheme;
use crate::pool::{At, Inner, MemberHandle, View};
use crate::status::{MemberState, Progress};
use crate::util::{join_all, BoxFut};
use block::{BlockError, BlockResult, Bytes};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

const PERSIST_INTERVAL: Duration = Duration::from_millis(1000);
/// Share of the members' time rebuild, resync and scrub take while foreground I/O
/// is in flight (each unit of work is followed by a rest as long as the unit).
const BUSY_SHARE: f64 = 0.5;
/// A stalled rebuild's first and longest waits before it tries its stripe again.
const REBUILD_RETRY_FIRST: Duration = Duration::from_millis(50);
const REBUILD_RETRY_MAX: Duration = Duration::from_secs(30);

/// How long a rebuild held at a stripe waits before its next try, after
/// `attempts` failed ones (at least 1): 50 ms doubling, at most 30 s.
pub(crate) fn rebuild_retry_after(attempts: u64) -> Duration {
    REBUILD_RETRY_FIRST
        .saturating_mul(1u32 << attempts.saturating_sub(1).min(20))
        .min(REBUILD_RETRY_MAX)
}

/// Bytes of every member one batched rebuild step reads (RAID 5 and F1): large
/// enough that a step's seek away from the foreground I/O is amortized.
const REBUILD_BATCH_BYTES: u64 = 8 << 20;

/// Pacing state of one background pass: under foreground load a pass takes at
/// most [`BUSY_SHARE`] of the time; in any case it stays under the pool's MB/s cap
/// (`rebuild_rate_mb_s`, 0 = none).
pub(crate) struct Pacer {
    started: Instant,
    last: Instant,
}

impl Pacer {
    pub(crate) fn new() -> Self {
        let now = Instant::now();
        Pacer {
            started: now,
            last: now,
        }
    }
}

/// Starts the pool's worker task.
pub(crate) fn spawn_worker(inner: &Arc<Inner>) {
    let weak = Arc::downgrade(inner);
    let wake = inner.wake.clone();
    let weak_timer = Arc::downgrade(inner);
    tokio::spawn(async move {
        // clears idle write-intent regions of parity pools
        loop {
            tokio::time::sleep(Duration::from_secs(1)).await;
            let Some(inner) = weak_timer.upgrade() else {
                return;
            };
            if inner.closed.load(Ordering::SeqCst) {
                return;
            }
            if inner.layout.scheme() != Scheme::Striped {
                inner.clean_intents().await;
            }
        }
    });
    tokio::spawn(async move {
        loop {
            let pass = {
                let Some(inner) = weak.upgrade() else { return };
                if inner.closed.load(Ordering::SeqCst) {
                    return;
                }
                inner.maintenance_pass().await
            };
            // (holding no reference to the pool: a close is not held up)
            match pass {
                Pass::Worked => {}
                Pass::Idle => wake.notified().await,
                Pass::RestFor(pause) => {
                    tokio::select! {
                        _ = tokio::time::sleep(pause) => {}
                        _ = wake.notified() => {}
                    }
                }
            }
        }
    });
}

pub(crate) fn progress(started: Instant, done_bytes: u64, total_bytes: u64) -> Progress {
    let secs = started.elapsed().as_secs_f64().max(1e-6);
    let rate = done_bytes as f64 / secs;
    Progress {
        done_bytes,
        total_bytes,
        rate_mb_s: rate / 1e6,
        eta_secs: (rate > 0.0)
            .then(|| (total_bytes.saturating_sub(done_bytes) as f64 / rate) as u64),
    }
}

/// What one unit of background work asks of the worker next.
enum Pass {
    /// Nothing to do: wait to be woken.
    Idle,
    /// Go on at once.
    Worked,
    /// A rebuild is held at a stripe it cannot read: try again after this
    /// long, or when woken.
    RestFor(Duration),
}

impl Inner {
    /// One unit of background work.
    async fn maintenance_pass(self: &Arc<Self>) -> Pass {
        let failed = self.is_failed();
        let (rebuilding, resync, region) = {
            let mut st = self.state.lock();
            let rebuilding = !failed
                && st
                    .slots
                    .iter()
                    .any(|s| s.state == MemberState::Rebuilding && s.member.is_some());
            if !rebuilding {
                // its target or the pool failed: the rebuild is over, not held
                st.rebuild_over();
            }
            (
                rebuilding,
                st.resync_cursor.is_some(),
                st.resync_regions.first().copied(),
            )
        };
        if failed {
            Pass::Idle
        } else if rebuilding {
            self.rebuild_pass()
                .await
                .map_or(Pass::Worked, Pass::RestFor)
        } else if let Some(r) = region {
            self.region_resync(r).await;
            Pass::Worked
        } else if resync {
            self.resync_pass().await;
            Pass::Worked
        } else {
            Pass::Idle
        }
    }

    /// The rebuild could not read stripe `s`: it is tried again after a
    /// back-off that doubles from 50 ms up to 30 s per failed attempt (a
    /// sector that stays unreadable held the worker in a loop that re-read
    /// the stripe and logged a warning 20 times a second, for ever). The
    /// status says where it is held and why; the log says so at attempts 1,
    /// 2, 4, 8... Returns how long to wait (None: the pool failed, nothing
    /// to retry).
    fn rebuild_stalled_at(&self, s: u64, e: &BlockError) -> Option<Duration> {
        if self.is_failed() {
            // not a stall: a member failed and took the pool with it
            {
                let mut st = self.state.lock();
                st.rebuild_stalled = None;
                st.salvage_ready = None;
            }
            return None;
        }
        let attempts = {
            let mut st = self.state.lock();
            let stall = match st.rebuild_stalled.as_mut() {
                Some(stall) if stall.stripe == s => stall,
                _ => st.rebuild_stalled.insert(crate::status::RebuildStall {
                    stripe: s,
                    ..Default::default()
                }),
            };
            stall.attempts += 1;
            stall.error = e.to_string();
            stall.attempts
        };
        if attempts.is_power_of_two() {
            tracing::warn!(pool = %self.name, stripe = s, attempts, error = %e,
                "rebuild cannot read stripe; retrying it, backing off (an unreadable sector on a member it reads from?)");
        }
        Some(rebuild_retry_after(attempts))
    }

    /// The rebuild could not compute stripe `s`: before it may give up rows
    /// of it at its next try, every journal record is checkpointed (not under
    /// the stripe's lock, which records being applied may wait for). A record
    /// written before a member failed covers that member's chunk; replayed
    /// after a crash over a row given up, it would put real data beside the
    /// stand-in values and leave the row's parity wrong. Records written
    /// since cannot cover an unknown chunk of such a row: the update would
    /// have had to read it.
    pub(crate) async fn prepare_salvage(&self, s: u64) {
        if let Some(generation) = self.checkpoint_for_salvage().await {
            self.state.lock().salvage_ready = Some((s, generation));
        }
    }

    /// Checkpoints every journal record before rows are given up (see
    /// [`Inner::prepare_salvage`]): the pool's generation it holds for (a
    /// member failing or joining meanwhile makes it moot: its records), or
    /// None if the pool failed or the checkpoint did.
    pub(crate) async fn checkpoint_for_salvage(&self) -> Option<u64> {
        if self.is_failed() {
            return None;
        }
        let generation = self.state.lock().generation;
        match self.checkpoint_all().await {
            Ok(()) => Some(generation),
            Err(e) => {
                tracing::warn!(pool = %self.name, error = %e,
                    "checkpoint before giving up unreadable rows failed");
                None
            }
        }
    }

    /// Paces one unit of background work (see [`Pacer`]).
    pub(crate) async fn throttle(&self, pacer: &mut Pacer, done_bytes: u64) {
        let step = pacer.last.elapsed();
        if self.fg_inflight.load(Ordering::SeqCst) > 0 {
            // foreground I/O is waiting: rest as long as the last unit took, so
            // background work holds the members at most BUSY_SHARE of the time
            tokio::time::sleep(step.mul_f64((1.0 - BUSY_SHARE) / BUSY_SHARE)).await;
        }
        let rate = self.state.lock().rebuild_rate_mb_s;
        if rate > 0 {
            let due = Duration::from_secs_f64(done_bytes as f64 / (rate as f64 * 1e6));
            let elapsed = pacer.started.elapsed();
            if due > elapsed {
                tokio::time::sleep(due - elapsed).await;
            }
        } else {
            tokio::task::yield_now().await;
        }
        pacer.last = Instant::now();
    }

    /// About once a [`PERSIST_INTERVAL`], records a pass's progress (rebuild
    /// checkpoints, resync cursor) in the superblocks, after flushing the members:
    /// rebuilt or resynced data must be durable before the checkpoint says so.
    async fn persist_progress(&self, last: &mut Instant) {
        if last.elapsed() > PERSIST_INTERVAL {
            *last = Instant::now();
            let _ = self.flush_then_persist().await;
        }
    }

    /// Moves the rebuild checkpoint of member `h` at `pos` from stripe `from`
    /// to `to` (the stripes below `to` are written), unless it moved or the
    /// member changed meanwhile; every rebuild path moves it here (per
    /// stripe, the single-parity batch, the mirror batch). At the end, the member counts as present for
    /// the pool from then on (`is_failed`): its stripes are flushed and that
    /// checkpoint becomes the durable one first, and the next acknowledgement
    /// waits for a superblock carrying it (`needed_intent`).
    /// Before (2026-12-04, found by review), the superblocks still carried
    /// the checkpoint of the last periodic flush until the rebuild's final
    /// flush and superblock write; the other copy of a RAID 1 failing in
    /// between was recorded with that older checkpoint while writes went on,
    /// acknowledged on the rebuilt member alone, and a crash left a pool that
    /// no longer assembled. An error is the member's flush failing.
    pub(crate) async fn advance_rebuild(
        &self,
        pos: usize,
        h: &Arc<MemberHandle>,
        from: u64,
        to: u64,
    ) -> BlockResult<()> {
        let end = to >= self.stripes();
        if end {
            if let Err(e) = h.volume.flush().await {
                h.errors.fetch_add(1, Ordering::Relaxed);
                return Err(e);
            }
        }
        let mut st = self.state.lock();
        let sl = &mut st.slots[pos];
        if !sl.member.as_ref().is_some_and(|m| Arc::ptr_eq(m, h))
            || sl.state != MemberState::Rebuilding
            || sl.rebuild_cp_stripes != from
        {
            return Ok(());
        }
        sl.rebuild_cp_stripes = to;
        if end {
            sl.durable_cp_stripes = to;
            // a superblock change that needs no new generation (members of
            // another generation are judged stale at assembly)
            st.intent_seq += 1;
            self.needed_intent
                .fetch_max(st.intent_seq, Ordering::SeqCst);
        }
        Ok(())
    }

    /// Flushes the members, then lets the superblocks carry the rebuild
    /// checkpoints and the resync cursor as they stood before the flush (see
    /// `Slot::durable_cp_stripes`), and writes them.
    pub(crate) async fn flush_then_persist(&self) -> BlockResult<()> {
        let (cps, cursor): (Vec<(String, u64)>, Option<u64>) = {
            let st = self.state.lock();
            (
                st.slots
                    .iter()
                    .map(|s| (s.uuid.clone(), s.rebuild_cp_stripes))
                    .collect(),
                st.resync_cursor,
            )
        };
        self.flush_members().await?;
        {
            let mut st = self.state.lock();
            for (sl, (uuid, cp)) in st.slots.iter_mut().zip(cps) {
                // the same member, not restarted since (never lowered: the
                // end of a rebuild may have moved it past `cp` meanwhile)
                if sl.uuid == uuid && sl.rebuild_cp_stripes >= cp {
                    sl.durable_cp_stripes = sl.durable_cp_stripes.max(cp);
                }
            }
            if let (Some(was), Some(now)) = (cursor, st.resync_cursor) {
                if now >= was {
                    st.resync_durable = was;
                }
            }
        }
        self.persist().await
    }

    /// The full-chunk content every position in `want` should hold for stripe `s`,
    /// computed from the other members.
    pub(crate) async fn stripe_image(
        &self,
        s: u64,
        want: &[usize],
        view: &View,
    ) -> BlockResult<Vec<Vec<u8>>> {
        let k = self.layout.data_chunks();
        match self.layout.scheme() {
            Scheme::Striped => Err(BlockError::NotSupported("raid0 has no redundancy")),
            Scheme::Mirror => {
                let mut out = Vec::new();
                for &pos in want {
                    let d = (0..k)
                        .find(|&d| self.layout.data_positions(s, d).contains(&pos))
                        .ok_or(BlockError::NotSupported("position holds no data chunk"))?;
                    let mut got = None;
                    for src in self.layout.data_positions(s, d) {
                        if want.contains(&src) {
                            continue;
                        }
                        let Some(h) = view.readable(src, s) else {
                            continue;
                        };
                        match self.m_read(h, s * self.cb, self.cb).await {
                            Ok(b) => {
                                got = Some(b.to_vec());
                                break;
                            }
                            Err(e) => self.member_error(src, h, &e).await,
                        }
                    }
                    out.push(got.ok_or_else(|| {
                        BlockError::Unavailable(format!("stripe {s}: no readable copy"))
                    })?);
                }
                Ok(out)
            }
            Scheme::Parity { parity_count } => {
                let cols = self.read_rows(s, 0, self.cb, &vec![true; k], view).await?;
                let cols: Vec<Vec<u8>> = cols.into_iter().flatten().collect();
                if cols.len() != k {
                    return Err(BlockError::Unavailable(format!("stripe {s} unreadable")));
                }
                let refs: Vec<&[u8]> = cols.iter().map(|c| c.as_slice()).collect();
                let len = (self.cb * self.bs) as usize;
                let mut p = vec![0u8; len];
                let mut q = vec![0u8; if parity_count > 1 { len } else { 0 }];
                gf::compute_pq(
                    &refs,
                    &mut p,
                    (parity_count > 1).then_some(q.as_mut_slice()),
                );
                let pp = self.layout.parity_positions(s);
                let mut out = Vec::new();
                for &pos in want {
                    if let Some(d) = (0..k).find(|&d| self.layout.data_positions(s, d)[0] == pos) {
                        out.push(cols[d].clone());
                    } else if pp.first() == Some(&pos) {
                        out.push(p.clone());
                    } else if pp.get(1) == Some(&pos) {
                        out.push(q.clone());
                    } else {
                        return Err(BlockError::NotSupported("position not in stripe"));
                    }
                }
                Ok(out)
            }
        }
    }

    /// One pass of the rebuild from the lowest checkpoint; `Some(wait)` when
    /// it is held at a stripe it cannot read.
    async fn rebuild_pass(self: &Arc<Self>) -> Option<Duration> {
        let (start, count) = {
            let st = self.state.lock();
            let reb: Vec<u64> = st
                .slots
                .iter()
                .filter(|s| s.state == MemberState::Rebuilding && s.member.is_some())
                .map(|s| s.rebuild_cp_stripes)
                .collect();
            (
                reb.iter().copied().min().unwrap_or(self.stripes()),
                reb.len() as u64,
            )
        };
        // a member holds one chunk of each stripe per area
        let chunk_bytes = self.cb * self.bs;
        let total = (self.stripes() - start) * chunk_bytes * self.layout.areas() * count;
        let started = Instant::now();
        let mut pacer = Pacer::new();
        let mut done = 0u64;
        let mut last_persist = Instant::now();
        self.state.lock().rebuild = Some(progress(started, 0, total));
        tracing::info!(pool = %self.name, from_stripe = start, members = count, "rebuild started");
        let mut next = start;
        while next < self.stripes() {
            let s = next;
            next += 1;
            if self.closed.load(Ordering::SeqCst) {
                return None;
            }
            self.throttle(&mut pacer, done).await;
            let batch = match self.layout.scheme() {
                Scheme::Mirror => self.rebuild_mirror_batch(s).await,
                _ => self.rebuild_xor_batch(s).await,
            };
            if let Some(n) = batch {
                next = s + n;
                done += n * chunk_bytes * self.layout.areas();
                {
                    let mut st = self.state.lock();
                    st.rebuild_stalled = None;
                    st.salvage_ready = None;
                    st.rebuild = Some(progress(started, done, total));
                }
                self.persist_progress(&mut last_persist).await;
                continue;
            }
            let g = self.lock_for(s).write().await;
            let Ok(view) = self.view() else { return None };
            let targets: Vec<(usize, Arc<MemberHandle>)> = {
                let st = self.state.lock();
                st.slots
                    .iter()
                    .enumerate()
                    .filter(|(_, sl)| {
                        sl.state == MemberState::Rebuilding && sl.rebuild_cp_stripes == s
                    })
                    .filter_map(|(i, sl)| sl.member.clone().map(|h| (i, h)))
                    .collect()
            };
            if targets.is_empty() {
                continue;
            }
            // every grid position of the rebuilding members (one per area)
            let want: Vec<usize> = targets
                .iter()
                .flat_map(|(p, _)| self.layout.positions_of(*p))
                .collect();
            let generation = self.state.lock().generation;
            let images = match self.stripe_image(s, &want, &view).await {
                Ok(i) => i,
                // tried once more after a back-off, then given up row by
                // row: what cannot be read is recorded lost (see `lost.rs`)
                Err(e) if !self.state.lock().may_salvage(s) || self.is_failed() => {
                    drop(g);
                    self.prepare_salvage(s).await;
                    return self.rebuild_stalled_at(s, &e);
                }
                // (the checkpoint holds for the generation it was made at,
                // the current one: `may_salvage` just said so)
                Err(e) => match self.salvage_stripe(s, &want, &view, generation).await {
                    Ok(done) => done.images,
                    Err(salvage) => {
                        drop(g);
                        tracing::warn!(pool = %self.name, stripe = s, error = %e, %salvage,
                            "rebuild could not give up the unreadable rows of the stripe");
                        return self.rebuild_stalled_at(s, &salvage);
                    }
                },
            };
            {
                let mut st = self.state.lock();
                st.rebuild_stalled = None;
                st.salvage_ready = None;
            }
            let mut images = want.iter().copied().zip(images);
            for (pos, h) in targets.iter() {
                // the checkpoint moves only when every area of the member is
                // written: mirror reads do not take the stripe lock
                let mut ok = true;
                for (vpos, img) in images.by_ref().take(self.layout.areas() as usize) {
                    debug_assert_eq!(self.layout.member_of(vpos), *pos);
                    let at = At {
                        h,
                        base: view.base(vpos),
                    };
                    if ok
                        && self
                            .m_write(at, s * self.cb, Bytes::from(img), false)
                            .await
                            .is_err()
                    {
                        ok = false;
                    }
                    done += chunk_bytes;
                }
                if !ok || self.advance_rebuild(*pos, h, s, s + 1).await.is_err() {
                    self.fail_handle(*pos, h).await;
                }
            }
            drop(g);
            self.state.lock().rebuild = Some(progress(started, done, total));
            self.persist_progress(&mut last_persist).await;
        }
        if self.flush_members().await.is_err() {
            return None;
        }
        {
            let mut st = self.state.lock();
            let mut finished = false;
            for sl in st.slots.iter_mut() {
                if sl.state == MemberState::Rebuilding && sl.rebuild_cp_stripes >= self.stripes() {
                    // flushed just above
                    sl.durable_cp_stripes = sl.rebuild_cp_stripes;
                    sl.state = MemberState::Active;
                    finished = true;
                }
            }
            if finished {
                st.generation += 1;
            }
            if !st.slots.iter().any(|s| s.state == MemberState::Rebuilding) {
                st.rebuild_over();
            }
        }
        tracing::info!(pool = %self.name, "rebuild pass finished");
        let _ = self.persist().await;
        None
    }

    /// One batched rebuild step for a single-parity pool (RAID 5, F1) with exactly
    /// one member rebuilding from stripe `s` and every other member readable: the
    /// lost chunk of each stripe, data or parity, is the XOR of all the others, so
    /// each survivor is read in one large sequential request. `None` when the
    /// batch does not apply or a read failed (the caller goes stripe by stripe).
    async fn rebuild_xor_batch(&self, s: u64) -> Option<u64> {
        if !matches!(self.layout.scheme(), Scheme::Parity { parity_count: 1 }) {
            return None;
        }
        let n = self.batch_stripes().min(self.stripes() - s);
        if n < 2 {
            return None;
        }
        let (guards, view, target, h) = self.lock_rebuild_batch(s, n).await?;
        let others: Vec<usize> = (0..self.layout.member_count())
            .filter(|&p| p != target)
            .collect();
        if others
            .iter()
            .any(|&p| view.readable(p, s + n - 1).is_none())
        {
            return None;
        }
        let futs: Vec<BoxFut<'_, BlockResult<Bytes>>> = others
            .iter()
            .map(|&p| -> BoxFut<'_, BlockResult<Bytes>> {
                let hp = view.readable(p, s).expect("checked");
                Box::pin(self.m_read(hp, s * self.cb, n * self.cb))
            })
            .collect();
        let mut acc: Option<Vec<u8>> = None;
        for (&p, r) in others.iter().zip(join_all(futs).await) {
            match r {
                Ok(b) => match &mut acc {
                    None => acc = Some(b.to_vec()),
                    Some(a) => gf::xor_into(a, &b),
                },
                Err(e) => {
                    if let Some(hp) = view.readable(p, s) {
                        self.member_error(p, hp, &e).await;
                    }
                    return None;
                }
            }
        }
        let acc = acc?;
        // parity levels: positions are members, one area
        let at = At { h: &h, base: 0 };
        let written = self.m_write(at, s * self.cb, Bytes::from(acc), false).await;
        if written.is_err() || self.advance_rebuild(target, &h, s, s + n).await.is_err() {
            self.fail_handle(target, &h).await;
            return None;
        }
        drop(guards);
        Some(n)
    }

    async fn resync_pass(self: &Arc<Self>) {
        let Some(start) = self.state.lock().resync_cursor else {
            return;
        };
        let finished = self
            .resync_stripes(start..self.stripes(), |st, s| {
                st.resync_cursor = Some(s + 1)
            })
            .await;
        if !finished {
            return;
        }
        {
            let mut st = self.state.lock();
            st.resync_cursor = None;
            st.resync = None;
        }
        tracing::info!(pool = %self.name, "initial resync finished");
        let _ = self.persist().await;
    }

    /// Makes one write-intent region left dirty by an unclean shutdown consistent
    /// (parity recomputed from data, mirror copies from the primary), then drops
    /// it from the superblocks.
    async fn region_resync(self: &Arc<Self>, r: u64) {
        let first = r * self.region_stripes;
        let end = (first + self.region_stripes).min(self.stripes());
        tracing::info!(pool = %self.name, region = r, "resyncing a dirty region");
        if !self.resync_stripes(first..end, |_, _| {}).await {
            return;
        }
        {
            let mut st = self.state.lock();
            st.resync_regions.remove(&r);
            st.intent_seq += 1;
            if st.resync_regions.is_empty() && st.resync_cursor.is_none() {
                st.resync = None;
            }
        }
        let _ = self.persist().await;
    }

    /// Resyncs `stripes` in order, paced, each under its exclusive lock, calling
    /// `advance` on the state after each, and flushes the members at the end.
    /// False when it stopped early: the pool is closing, a rebuild must run first
    /// (it recomputes these stripes; the caller's state says where to resume), or
    /// a stripe could not be read (retried on the next pass).
    async fn resync_stripes(
        &self,
        stripes: std::ops::Range<u64>,
        mut advance: impl FnMut(&mut crate::pool::State, u64),
    ) -> bool {
        let stripe_bytes = self.cb * self.bs * self.layout.data_chunks() as u64;
        let total = (stripes.end - stripes.start) * stripe_bytes;
        let started = Instant::now();
        let mut pacer = Pacer::new();
        let mut done = 0u64;
        let mut last_persist = Instant::now();
        self.state.lock().resync = Some(progress(started, 0, total));
        let end = stripes.end;
        let mut next = stripes.start;
        while next < end {
            let s = next;
            next += 1;
            if self.closed.load(Ordering::SeqCst) {
                return false;
            }
            if self
                .state
                .lock()
                .slots
                .iter()
                .any(|sl| sl.state == MemberState::Rebuilding && sl.member.is_some())
            {
                let _ = self.persist().await;
                return false;
            }
            self.throttle(&mut pacer, done).await;
            if let Some(n) = self.resync_mirror_batch(s, end).await {
                next = s + n;
                advance(&mut self.state.lock(), s + n - 1);
                done += n * stripe_bytes;
                self.state.lock().resync = Some(progress(started, done, total));
                self.persist_progress(&mut last_persist).await;
                continue;
            }
            let g = self.lock_for(s).write().await;
            let Ok(view) = self.view() else { return false };
            if let Err(e) = self.resync_stripe(s, &view).await {
                tracing::warn!(pool = %self.name, stripe = s, error = %e, "resync cannot read stripe; retrying later");
                drop(g);
                tokio::time::sleep(Duration::from_millis(50)).await;
                return false;
            }
            advance(&mut self.state.lock(), s);
            drop(g);
            done += stripe_bytes;
            self.state.lock().resync = Some(progress(started, done, total));
            self.persist_progress(&mut last_persist).await;
        }
        self.flush_members().await.is_ok()
    }

    /// Stripes one batched mirror step covers from `s` (at most `end`): the same
    /// [`REBUILD_BATCH_BYTES`] per member as the RAID 5 rebuild; `None` when
    /// batching does not apply (placement that changes per stripe, fewer than two
    /// stripes left).
    /// Locks stripes `[s, s + n)` for a batched rebuild step and returns the
    /// guards, the member view, and the one member rebuilding from `s` with its
    /// handle; `None` unless exactly one member rebuilds and its checkpoint is `s`.
    async fn lock_rebuild_batch(
        &self,
        s: u64,
        n: u64,
    ) -> Option<(
        Vec<tokio::sync::RwLockWriteGuard<'_, ()>>,
        View,
        usize,
        Arc<MemberHandle>,
    )> {
        let mut guards = Vec::with_capacity(n as usize);
        for x in s..s + n {
            guards.push(self.lock_for(x).write().await);
        }
        let view = self.view().ok()?;
        let st = self.state.lock();
        let reb: Vec<usize> = (0..st.slots.len())
            .filter(|&i| st.slots[i].state == MemberState::Rebuilding)
            .collect();
        if reb.len() != 1 || st.slots[reb[0]].rebuild_cp_stripes != s {
            return None;
        }
        let h = st.slots[reb[0]].member.clone()?;
        drop(st);
        Some((guards, view, reb[0], h))
    }

    fn mirror_batch_len(&self, s: u64, end: u64) -> Option<u64> {
        if self.layout.scheme() != Scheme::Mirror || self.layout.cycle_stripes() != 1 {
            return None;
        }
        let n = self.batch_stripes().min(end.saturating_sub(s));
        (n >= 2).then_some(n)
    }

    /// Stripes of one batched step: [`REBUILD_BATCH_BYTES`] per member, and no
    /// more than the pool has stripe locks (a batch write-locks every stripe it
    /// covers, and two stripes sharing a lock would wait on each other: with
    /// 512-byte chunks a batch is 16,384 stripes).
    fn batch_stripes(&self) -> u64 {
        (REBUILD_BATCH_BYTES / (self.cb * self.bs)).clamp(1, crate::pool::STRIPE_LOCKS as u64)
    }

    /// Copies rows `[s, s + n)` from position `src` to every position in `dsts`,
    /// one large read and one large write each (a mirror chunk's rows are
    /// contiguous on its position). False when the read or a write failed (the
    /// member is failed or the error left to the per-stripe path).
    async fn copy_rows(&self, view: &View, s: u64, n: u64, src: usize, dsts: &[usize]) -> bool {
        let Some(hs) = view.readable(src, s + n - 1) else {
            return false;
        };
        let data = match self.m_read(hs, s * self.cb, n * self.cb).await {
            Ok(b) => b,
            Err(e) => {
                self.member_error(src, hs, &e).await;
                return false;
            }
        };
        let mut ok = true;
        for &d in dsts {
            if let Some(hd) = view.writable(d) {
                if self
                    .m_write(hd, s * self.cb, data.clone(), false)
                    .await
                    .is_err()
                {
                    self.fail_handle(d, &hd).await;
                    ok = false;
                }
            }
        }
        ok
    }

    /// One batched resync step of a mirror pool: for every data chunk, the rows
    /// of the whole batch are read from the first readable copy and written to the
    /// others (RAID 10 far: first half to the next member's second half), with
    /// every stripe of the batch locked. `None` when it does not apply or failed
    /// (the caller goes stripe by stripe).
    async fn resync_mirror_batch(&self, s: u64, end: u64) -> Option<u64> {
        let n = self.mirror_batch_len(s, end)?;
        let mut guards = Vec::with_capacity(n as usize);
        for x in s..s + n {
            guards.push(self.lock_for(x).write().await);
        }
        let view = self.view().ok()?;
        let last = s + n - 1;
        let mut jobs: Vec<(usize, Vec<usize>)> = Vec::new();
        for d in 0..self.layout.data_chunks() {
            let copies = self.layout.data_positions(s, d);
            let src = copies
                .iter()
                .copied()
                .find(|&p| view.readable(p, last).is_some())?;
            jobs.push((src, copies.into_iter().filter(|&p| p != src).collect()));
        }
        let futs: Vec<BoxFut<'_, bool>> = jobs
            .iter()
            .map(|(src, dsts)| -> BoxFut<'_, bool> {
                Box::pin(self.copy_rows(&view, s, n, *src, dsts))
            })
            .collect();
        let ok = join_all(futs).await.into_iter().all(|x| x);
        drop(guards);
        ok.then_some(n)
    }

    /// One batched rebuild step of a mirror pool with exactly one member
    /// rebuilding from stripe `s`: each of its positions (two for RAID 10 far) is
    /// copied from another copy in large requests, then the checkpoint moves past
    /// the batch. `None` when it does not apply or failed.
    async fn rebuild_mirror_batch(&self, s: u64) -> Option<u64> {
        let n = self.mirror_batch_len(s, self.stripes())?;
        let (guards, view, member, h) = self.lock_rebuild_batch(s, n).await?;
        let mut jobs: Vec<(usize, Vec<usize>)> = Vec::new();
        for t in self.layout.positions_of(member) {
            let d = (0..self.layout.data_chunks())
                .find(|&d| self.layout.data_positions(s, d).contains(&t))?;
            let src = self.layout.data_positions(s, d).into_iter().find(|&p| {
                self.layout.member_of(p) != member && view.readable(p, s + n - 1).is_some()
            })?;
            jobs.push((src, vec![t]));
        }
        let futs: Vec<BoxFut<'_, bool>> = jobs
            .iter()
            .map(|(src, dsts)| -> BoxFut<'_, bool> {
                Box::pin(self.copy_rows(&view, s, n, *src, dsts))
            })
            .collect();
        if !join_all(futs).await.into_iter().all(|x| x) {
            return None;
        }
        if self.advance_rebuild(member, &h, s, s + n).await.is_err() {
            self.fail_handle(member, &h).await;
            return None;
        }
        drop(guards);
        Some(n)
    }

    async fn resync_stripe(&self, s: u64, view: &View) -> BlockResult<()> {
        let k = self.layout.data_chunks();
        match self.layout.scheme() {
            Scheme::Striped => Ok(()),
            Scheme::Parity { .. } => {
                let pp = self.layout.parity_positions(s);
                let imgs = self.stripe_image(s, &pp, view).await?;
                for (&pos, img) in pp.iter().zip(imgs) {
                    if let Some(h) = view.writable(pos) {
                        if self
                            .m_write(h, s * self.cb, Bytes::from(img), false)
                            .await
                            .is_err()
                        {
                            self.fail_handle(pos, &h).await;
                        }
                    }
                }
                Ok(())
            }
            Scheme::Mirror => {
                for d in 0..k {
                    let copies = self.layout.data_positions(s, d);
                    let mut primary = None;
                    for &p in &copies {
                        let Some(h) = view.readable(p, s) else {
                            continue;
                        };
                        match self.m_read(h, s * self.cb, self.cb).await {
                            Ok(b) => {
                                primary = Some((p, b));
                                break;
                            }
                            Err(e) => self.member_error(p, h, &e).await,
                        }
                    }
                    let Some((pp, data)) = primary else {
                        return Err(BlockError::Unavailable(format!(
                            "stripe {s}: no readable copy"
                        )));
                    };
                    for &p in &copies {
                        if p == pp {
                            continue;
                        }
                        if let Some(h) = view.writable(p) {
                            if self
                                .m_write(h, s * self.cb, data.clone(), false)
                                .await
                                .is_err()
                            {
                                self.fail_handle(p, &h).await;
                            }
                        }
                    }
                }
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stalled_rebuild_backs_off_from_50_ms_to_30_s() {
        let ms = |a| rebuild_retry_after(a).as_millis();
        assert_eq!(ms(0), 50);
        assert_eq!(ms(1), 50);
        assert_eq!(ms(2), 100);
        assert_eq!(ms(3), 200);
        assert_eq!(ms(10), 25_600);
        assert_eq!(ms(11), 30_000);
        assert_eq!(ms(u64::MAX), 30_000);
    }
}
