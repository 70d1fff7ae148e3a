//! The data path: `block::Volume` for `Pool`.
//!
//! Reads go straight to the member holding the data (mirrors: the copy whose last
//! read ends where this one starts, else the one with the fewest outstanding
//! requests; RAID 10 far: the first-half copy); on a failed member they
//! reconstruct under the stripe's shared lock, and a medium error is repaired by rewriting the
//! reconstructed blocks. Writes take the stripe's exclusive lock; parity levels
//! pick read-modify-write or reconstruct-write by which reads less (a full-stripe
//! write reads nothing, a not-yet-resynced stripe always reconstruct-writes), then
//! journal the member writes and apply them in place. Whole stripes and gathered
//! sequential writes take the path in `fullstripe.rs`.

use crate::gf;
use crate::layout::Scheme;
use crate::meter::InFlight;
use crate::order::AfterFirstPoll;
use crate::pool::{At, Inner, MemberHandle, Pool, View};
use crate::util::{join_all, BoxFut};
use async_trait::async_trait;
use block::{BlockError, BlockResult, Bytes, BytesMut, Geometry, Volume};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// A piece of a request inside one data chunk.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Seg {
    pub stripe: u64,
    /// Data chunk index within the stripe.
    pub d: usize,
    /// First block within the chunk.
    pub off: u64,
    pub blocks: u64,
    /// Byte offset of this piece in the request buffer.
    pub buf_off: usize,
}

/// One member operation of a stripe update.
pub(crate) enum OpKind {
    Write(Bytes),
    Discard(u64),
}

/// A member operation at a data-area lba.
pub(crate) struct MemberOp {
    pub pos: usize,
    pub mlba: u64,
    pub kind: OpKind,
}

pub(crate) struct FgGuard<'a>(&'a AtomicU64);

impl<'a> FgGuard<'a> {
    pub(crate) fn new(c: &'a AtomicU64) -> Self {
        c.fetch_add(1, Ordering::SeqCst);
        FgGuard(c)
    }
}

impl Drop for FgGuard<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

pub(crate) fn unavailable(what: String) -> BlockError {
    BlockError::Unavailable(what)
}

impl Inner {
    /// Reads blocks of a position (grid lba `mlba` in the position's area),
    /// counting the I/O.
    pub async fn m_read(&self, at: At<'_>, mlba: u64, blocks: u64) -> BlockResult<Bytes> {
        let h = at.h;
        let mlba = at.base + mlba;
        let busy = InFlight::new(&h.inflight, &h.depth);
        h.reads.fetch_add(1, Ordering::Relaxed);
        h.head.store(mlba + blocks, Ordering::Relaxed);
        let r = h
            .volume
            .read(self.data_offset_blocks + mlba, blocks as u32)
            .await;
        busy.finish();
        match &r {
            Ok(b) => {
                h.read_bytes.fetch_add(b.len() as u64, Ordering::Relaxed);
            }
            Err(_) => {
                h.errors.fetch_add(1, Ordering::Relaxed);
            }
        }
        r
    }

    /// Writes member blocks at an absolute lba, counting the I/O.
    pub async fn m_write_abs(
        &self,
        h: &MemberHandle,
        lba: u64,
        data: Bytes,
        fua: bool,
    ) -> BlockResult<()> {
        let busy = InFlight::new(&h.inflight, &h.depth);
        h.writes.fetch_add(1, Ordering::Relaxed);
        let len = data.len() as u64;
        let end = lba + len / self.bs;
        let t0 = std::time::Instant::now();
        let write = h.volume.write(lba, data, fua);
        let r = AfterFirstPoll::new(write, || h.order.submitted(end)).await;
        self.note_member_write(t0.elapsed());
        busy.finish();
        match &r {
            Ok(()) => {
                h.written_bytes.fetch_add(len, Ordering::Relaxed);
            }
            Err(_) => {
                h.errors.fetch_add(1, Ordering::Relaxed);
            }
        }
        r
    }

    /// Writes a chunk of a whole stripe to a position, after the member's
    /// writes just below it when they are about to come (see `order.rs`).
    pub async fn m_write_in_order(
        &self,
        at: At<'_>,
        mlba: u64,
        data: Bytes,
        fua: bool,
    ) -> BlockResult<()> {
        let lba = self.data_offset_blocks + at.base + mlba;
        at.h.order
            .wait_turn(lba, crate::order::WINDOW_CHUNKS * self.cb)
            .await;
        self.m_write_abs(at.h, lba, data, fua).await
    }

    /// Writes blocks of a position (grid lba `mlba` in the position's area).
    pub async fn m_write(&self, at: At<'_>, mlba: u64, data: Bytes, fua: bool) -> BlockResult<()> {
        self.m_write_abs(at.h, self.data_offset_blocks + at.base + mlba, data, fua)
            .await
    }

    pub(crate) async fn m_op(&self, at: At<'_>, op: &MemberOp, fua: bool) -> BlockResult<()> {
        match &op.kind {
            OpKind::Write(b) => self.m_write(at, op.mlba, b.clone(), fua).await,
            OpKind::Discard(blocks) => {
                let h = at.h;
                let busy = InFlight::new(&h.inflight, &h.depth);
                h.writes.fetch_add(1, Ordering::Relaxed);
                // write_zeroes, not discard: the range must read as zeroes, as
                // the pool's discard promises, and a member that joined a
                // thin pool may be thick (a block device, whose BLKDISCARD
                // guarantees nothing): sent a discard it ignored, it kept old
                // chunks under parity computed for zeroes (review of
                // 2026-12-06). On a thin member it unmaps, as discard did.
                let lba = self.data_offset_blocks + at.base + op.mlba;
                let r = h.volume.write_zeroes(lba, *blocks, true).await;
                busy.finish();
                if r.is_err() {
                    h.errors.fetch_add(1, Ordering::Relaxed);
                }
                r
            }
        }
    }

    /// Reacts to a member error: a medium error is left to the caller to repair,
    /// anything else fails the member.
    pub async fn member_error(&self, pos: usize, h: At<'_>, e: &BlockError) {
        let h = h.h;
        if !matches!(e, BlockError::Medium { .. }) {
            tracing::warn!(pool = %self.name, position = pos, member = %h.name, error = %e, "member i/o error");
            self.fail_handle(pos, h).await;
        }
    }

    /// Splits a pool range into per-chunk pieces.
    pub fn segments(&self, lba: u64, blocks: u64) -> Vec<Seg> {
        let k = self.layout.data_chunks() as u64;
        let mut out = Vec::new();
        let mut cur = lba;
        let end = lba + blocks;
        while cur < end {
            let stripe = cur / (k * self.cb);
            let within = cur % (k * self.cb);
            let d = (within / self.cb) as usize;
            let off = within % self.cb;
            let n = (self.cb - off).min(end - cur);
            out.push(Seg {
                stripe,
                d,
                off,
                blocks: n,
                buf_off: ((cur - lba) * self.bs) as usize,
            });
            cur += n;
        }
        out
    }

    fn data_pos(&self, s: u64, d: usize) -> usize {
        self.layout.data_positions(s, d)[0]
    }

    /// Reads rows `[r0, r1)` of the data chunks flagged in `need`, reconstructing
    /// what cannot be read and rewriting blocks that had medium errors. Returns the
    /// columns (every column when reconstruction ran).
    pub async fn read_rows(
        &self,
        s: u64,
        r0: u64,
        r1: u64,
        need: &[bool],
        view: &View,
    ) -> BlockResult<Vec<Option<Vec<u8>>>> {
        let k = self.layout.data_chunks();
        let pp = self.layout.parity_positions(s);
        let rows = r1 - r0;
        let mlba = s * self.cb + r0;
        let mut cols: Vec<Option<Vec<u8>>> = vec![None; k];
        let mut medium: Vec<usize> = Vec::new();
        let mut failed = false;
        let want: Vec<usize> = (0..k).filter(|&d| need[d]).collect();
        self.read_cols(
            s,
            &want,
            mlba,
            rows,
            view,
            &mut cols,
            &mut medium,
            &mut failed,
        )
        .await;
        if want.iter().all(|&d| cols[d].is_some()) {
            return Ok(cols);
        }
        let rest: Vec<usize> = (0..k).filter(|&d| !need[d]).collect();
        self.read_cols(
            s,
            &rest,
            mlba,
            rows,
            view,
            &mut cols,
            &mut medium,
            &mut failed,
        )
        .await;
        let mut par: Vec<Option<Vec<u8>>> = vec![None; pp.len()];
        // positions whose chunk of this stripe could not be read (for the
        // message below: which disk holds the bad sector)
        let mut unreadable: Vec<usize> = medium.iter().map(|&d| self.data_pos(s, d)).collect();
        {
            let futs: Vec<BoxFut<'_, Option<BlockResult<Bytes>>>> = pp
                .iter()
                .map(|&p| -> BoxFut<'_, Option<BlockResult<Bytes>>> {
                    Box::pin(async move {
                        match view.readable(p, s) {
                            Some(h) => Some(self.m_read(h, mlba, rows).await),
                            None => None,
                        }
                    })
                })
                .collect();
            for (i, r) in join_all(futs).await.into_iter().enumerate() {
                match r {
                    Some(Ok(b)) => par[i] = Some(b.to_vec()),
                    Some(Err(e)) => {
                        if matches!(e, BlockError::Medium { .. }) {
                            unreadable.push(pp[i]);
                        }
                        if let Some(h) = view.readable(pp[i], s) {
                            self.member_error(pp[i], h, &e).await;
                        }
                    }
                    None => {}
                }
            }
        }
        let len = (rows * self.bs) as usize;
        if !gf::reconstruct(
            &mut cols,
            par[0].as_deref(),
            par.get(1).and_then(|q| q.as_deref()),
            len,
        ) {
            unreadable.sort_unstable();
            if !unreadable.is_empty() && !self.is_failed() {
                // unreadable sectors, not lost members: answered as a disk
                // answers for its own bad sector (a medium error at the first
                // block asked for), not as a pool that cannot serve, which
                // multipath initiators retry on every path for ever
                tracing::warn!(pool = %self.name, stripe = s, positions = ?unreadable,
                    member_block = mlba, "rows with more unreadable sectors than redundancy");
                let d = (0..k).find(|&d| need[d]).unwrap_or(0) as u64;
                return Err(BlockError::Medium {
                    lba: (s * k as u64 + d) * self.cb + r0,
                });
            }
            return Err(unavailable(format!(
                "pool {}: stripe {s} has more unreadable members than redundancy \
                 (unreadable sectors at position(s) {unreadable:?}, member block {mlba})",
                self.name
            )));
        }
        for d in medium {
            let pos = self.data_pos(s, d);
            if let (Some(h), Some(c)) = (view.writable(pos), &cols[d]) {
                tracing::info!(pool = %self.name, position = pos, stripe = s, "repairing medium error");
                if let Err(e) = self
                    .m_write(h, mlba, Bytes::copy_from_slice(c), false)
                    .await
                {
                    self.fail_handle(pos, &h).await;
                    tracing::warn!(error = %e, "repair write failed");
                }
            }
        }
        Ok(cols)
    }

    #[allow(clippy::too_many_arguments)]
    async fn read_cols(
        &self,
        s: u64,
        which: &[usize],
        mlba: u64,
        rows: u64,
        view: &View,
        cols: &mut [Option<Vec<u8>>],
        medium: &mut Vec<usize>,
        failed: &mut bool,
    ) {
        let futs: Vec<BoxFut<'_, Option<BlockResult<Bytes>>>> = which
            .iter()
            .map(|&d| -> BoxFut<'_, Option<BlockResult<Bytes>>> {
                let pos = self.data_pos(s, d);
                Box::pin(async move {
                    match view.readable(pos, s) {
                        Some(h) => Some(self.m_read(h, mlba, rows).await),
                        None => None,
                    }
                })
            })
            .collect();
        for (i, r) in join_all(futs).await.into_iter().enumerate() {
            let d = which[i];
            match r {
                Some(Ok(b)) => cols[d] = Some(b.to_vec()),
                Some(Err(e)) => {
                    let pos = self.data_pos(s, d);
                    if matches!(e, BlockError::Medium { .. }) {
                        medium.push(d);
                    } else {
                        *failed = true;
                    }
                    if let Some(h) = view.readable(pos, s) {
                        self.member_error(pos, h, &e).await;
                    }
                }
                None => {}
            }
        }
    }

    async fn read_seg(&self, seg: Seg) -> BlockResult<Bytes> {
        let s = seg.stripe;
        let mlba = s * self.cb + seg.off;
        match self.layout.scheme() {
            Scheme::Striped => {
                let view = self.view()?;
                let pos = self.data_pos(s, seg.d);
                let h = view.readable(pos, s).ok_or_else(|| {
                    unavailable(format!("pool {}: member {pos} failed", self.name))
                })?;
                match self.m_read(h, mlba, seg.blocks).await {
                    Ok(b) => Ok(b),
                    Err(e) => {
                        self.member_error(pos, h, &e).await;
                        Err(match e {
                            BlockError::Medium { lba } => BlockError::Medium {
                                lba: self.pool_lba(
                                    seg,
                                    lba.saturating_sub(self.data_offset_blocks + mlba),
                                ),
                            },
                            other => unavailable(format!("pool {}: {other}", self.name)),
                        })
                    }
                }
            }
            Scheme::Mirror => self.read_mirror_seg(seg).await,
            Scheme::Parity { .. } => {
                let view = self.view()?;
                let pos = self.data_pos(s, seg.d);
                if let Some(h) = view.readable(pos, s) {
                    // An acknowledged update still being written in place holds
                    // the stripe's lock: wait for it (released before any
                    // reconstruction below takes the lock again).
                    let g = if self.is_applying(s) {
                        Some(self.lock_for(s).read().await)
                    } else {
                        None
                    };
                    let r = self.m_read(h, mlba, seg.blocks).await;
                    drop(g);
                    match r {
                        Ok(b) => return Ok(b),
                        Err(e) => self.member_error(pos, h, &e).await,
                    }
                }
                let _g = self.lock_for(s).read().await;
                let view = self.view()?;
                let mut need = vec![false; self.layout.data_chunks()];
                need[seg.d] = true;
                let mut cols = self
                    .read_rows(s, seg.off, seg.off + seg.blocks, &need, &view)
                    .await?;
                cols[seg.d].take().map(Bytes::from).ok_or_else(|| {
                    unavailable(format!("pool {}: stripe {s} unreadable", self.name))
                })
            }
        }
    }

    fn pool_lba(&self, seg: Seg, within: u64) -> u64 {
        let k = self.layout.data_chunks() as u64;
        seg.stripe * k * self.cb + seg.d as u64 * self.cb + seg.off + within.min(seg.blocks - 1)
    }

    async fn read_mirror_seg(&self, seg: Seg) -> BlockResult<Bytes> {
        let s = seg.stripe;
        let mlba = s * self.cb + seg.off;
        let copies = self.layout.data_positions(s, seg.d);
        let far = self.layout.areas() > 1;
        let mut tried: Vec<usize> = Vec::new();
        let mut medium: Vec<usize> = Vec::new();
        loop {
            let view = self.view()?;
            let mut cands: Vec<usize> = copies
                .iter()
                .copied()
                .filter(|p| !tried.contains(p) && view.readable(*p, s).is_some())
                .collect();
            if self.is_uninit(s) {
                // before resync the copies may differ where nothing was written:
                // read one copy only, for stable answers
                cands.truncate(1);
            }
            // RAID 10 far: the primary copy (first half, a plain stripe over every
            // member) whenever it is readable; the second half only as a fallback.
            // Near: a read that continues a copy's last read stays on that copy
            // (one sequential stream per copy, no skipping); others go to the copy
            // with the fewest requests outstanding, then the nearest head. Heads
            // are member data-area lbas: `base(p) + mlba` is where `p` reads.
            let head_at = |p: usize| {
                view.readable(p, s)
                    .map_or(u64::MAX, |h| h.head.load(Ordering::Relaxed))
            };
            let target = |p: usize| view.base(p) + mlba;
            let chosen = if far {
                cands.first().copied()
            } else {
                cands
                    .iter()
                    .copied()
                    .find(|&p| head_at(p) == target(p))
                    .or_else(|| {
                        cands.iter().copied().min_by_key(|&p| {
                            let load = view
                                .readable(p, s)
                                .map_or(u64::MAX, |h| h.inflight.load(Ordering::Relaxed));
                            (load, head_at(p).abs_diff(target(p)))
                        })
                    })
            };
            let Some(pos) = chosen else {
                return Err(if medium.is_empty() {
                    unavailable(format!(
                        "pool {}: no copy of stripe {s} readable",
                        self.name
                    ))
                } else {
                    BlockError::Medium {
                        lba: self.pool_lba(seg, 0),
                    }
                });
            };
            tried.push(pos);
            let Some(h) = view.readable(pos, s) else {
                continue;
            };
            match self.m_read(h, mlba, seg.blocks).await {
                Ok(b) => {
                    if !medium.is_empty() {
                        self.repair_mirror(seg, &medium).await;
                    }
                    return Ok(b);
                }
                Err(e) => {
                    if matches!(e, BlockError::Medium { .. }) {
                        medium.push(pos);
                    }
                    self.member_error(pos, h, &e).await;
                }
            }
        }
    }

    /// Rewrites the copies at `bad` from a good copy, under the stripe lock.
    async fn repair_mirror(&self, seg: Seg, bad: &[usize]) {
        let s = seg.stripe;
        let mlba = s * self.cb + seg.off;
        let _g = self.lock_for(s).write().await;
        let Ok(view) = self.view() else { return };
        for pos in self.layout.data_positions(s, seg.d) {
            if bad.contains(&pos) {
                continue;
            }
            let Some(h) = view.readable(pos, s) else {
                continue;
            };
            let Ok(good) = self.m_read(h, mlba, seg.blocks).await else {
                continue;
            };
            for &b in bad {
                if let Some(hb) = view.writable(b) {
                    tracing::info!(pool = %self.name, position = b, stripe = s, "repairing medium error on mirror copy");
                    if self.m_write(hb, mlba, good.clone(), false).await.is_err() {
                        self.fail_handle(b, &hb).await;
                    }
                }
            }
            return;
        }
    }

    async fn write_striped(&self, segs: &[Seg], data: &Bytes, fua: bool) -> BlockResult<()> {
        let view = self.view()?;
        let futs: Vec<BoxFut<'_, BlockResult<()>>> = segs
            .iter()
            .map(|seg| -> BoxFut<'_, BlockResult<()>> {
                let pos = self.data_pos(seg.stripe, seg.d);
                let buf = data.slice(seg.buf_off..seg.buf_off + (seg.blocks * self.bs) as usize);
                let view = &view;
                Box::pin(async move {
                    let h = view
                        .writable(pos)
                        .ok_or_else(|| unavailable(format!("member {pos} failed")))?;
                    let r = self
                        .m_write(h, seg.stripe * self.cb + seg.off, buf, fua)
                        .await;
                    if let Err(e) = &r {
                        self.member_error(pos, h, e).await;
                    }
                    r
                })
            })
            .collect();
        for r in join_all(futs).await {
            r.map_err(|e| unavailable(format!("pool {}: {e}", self.name)))?;
        }
        Ok(())
    }

    async fn write_mirror_stripe(
        &self,
        s: u64,
        segs: &[Seg],
        data: &Bytes,
        fua: bool,
    ) -> BlockResult<()> {
        let _g = self.lock_for(s).write().await;
        let view = self.view()?;
        // copies written half-way by a crash are found by the write intent and
        // resynced at the next assemble
        let intent = self.intent_begin(s).await?;
        let mut jobs: Vec<(usize, usize, Arc<MemberHandle>, u64, Bytes)> = Vec::new();
        for (i, seg) in segs.iter().enumerate() {
            let buf = data.slice(seg.buf_off..seg.buf_off + (seg.blocks * self.bs) as usize);
            for pos in self.layout.data_positions(s, seg.d) {
                if let Some(h) = view.writable(pos) {
                    jobs.push((i, pos, h.h.clone(), s * self.cb + seg.off, buf.clone()));
                }
            }
        }
        let futs: Vec<BoxFut<'_, BlockResult<()>>> = jobs
            .iter()
            .map(|(_, pos, h, mlba, b)| -> BoxFut<'_, BlockResult<()>> {
                let at = At {
                    h,
                    base: view.base(*pos),
                };
                Box::pin(self.m_write(at, *mlba, b.clone(), fua))
            })
            .collect();
        let results = join_all(futs).await;
        self.intent_end(intent);
        let mut ok = vec![false; segs.len()];
        for ((i, pos, h, _, _), r) in jobs.iter().zip(results) {
            match r {
                Ok(()) => ok[*i] = true,
                Err(_) => self.fail_handle(*pos, h).await,
            }
        }
        if ok.iter().all(|&x| x) && !self.is_failed() {
            Ok(())
        } else {
            Err(unavailable(format!(
                "pool {}: no copy of stripe {s} written",
                self.name
            )))
        }
    }

    pub(crate) async fn write_parity_stripe(
        self: &Arc<Self>,
        s: u64,
        segs: &[Seg],
        data: &Bytes,
        fua: bool,
    ) -> BlockResult<()> {
        let _busy = FgGuard::new(&self.stripe_writes);
        let t0 = std::time::Instant::now();
        let g = self.lock_for(s).clone().write_owned().await;
        crate::commit::add_us(&self.wp.lock_wait_us, t0);
        let view = self.view()?;
        self.write_parity_locked(s, segs, data, fua, view, Some(g))
            .await
    }

    /// A journaled stripe update; the caller holds the stripe's exclusive lock,
    /// and hands it over as `lock` when the update may be acknowledged before
    /// its in-place writes end (see `commit.rs`).
    pub(crate) async fn write_parity_locked(
        self: &Arc<Self>,
        s: u64,
        segs: &[Seg],
        data: &Bytes,
        fua: bool,
        mut view: View,
        lock: Option<tokio::sync::OwnedRwLockWriteGuard<()>>,
    ) -> BlockResult<()> {
        self.partial_writes.fetch_add(1, Ordering::Relaxed);
        self.wp.partial_updates.fetch_add(1, Ordering::Relaxed);
        // A stripe written whole without FUA may hold its new chunks in the
        // members' volatile caches only, and whole-stripe writes have no
        // journal record. This update's record would carry parity computed
        // from them: after a power cut that lost them, its replay wrote that
        // parity beside the older chunks on disk, and with a member missing
        // too, this update's own data rebuilt from it was wrong (review of
        // 2026-12-06). The members are flushed first (rare: a partial update
        // right after a whole-stripe write of the same stripe).
        if self.unflushed_whole.lock().contains_key(&s) {
            self.flush_members().await?;
        }
        let lock = match lock {
            Some(g) if self.data_first_ok(s, &view) => {
                return self.commit_data_first(s, segs, data, fua, g).await;
            }
            other => other,
        };
        let t0 = std::time::Instant::now();
        let ops = self.plan(s, segs, data, &mut view).await?;
        crate::commit::add_us(&self.wp.read_us, t0);
        self.commit(s, ops, &view, fua, lock).await
    }

    /// The member operations of a partial update of stripe `s`: a
    /// read-modify-write when it reads less and can, else a reconstruct-write
    /// (`view` is refreshed when a read failed).
    pub(crate) async fn plan(
        &self,
        s: u64,
        segs: &[Seg],
        data: &Bytes,
        view: &mut View,
    ) -> BlockResult<Vec<MemberOp>> {
        let k = self.layout.data_chunks();
        let pp = self.layout.parity_positions(s);
        let r0 = segs.iter().map(|g| g.off).min().unwrap_or(0);
        let r1 = segs.iter().map(|g| g.off + g.blocks).max().unwrap_or(0);
        let rows = r1 - r0;
        let uninit = self.is_uninit(s);
        let rmw_ok = !uninit
            && segs
                .iter()
                .all(|g| view.readable(self.data_pos(s, g.d), s).is_some())
            && pp
                .iter()
                .all(|&p| view.readable(p, s).is_some() || view.writable(p).is_none());
        let rmw_reads: u64 = segs.iter().map(|g| g.blocks).sum::<u64>()
            + pp.iter()
                .filter(|&&p| view.readable(p, s).is_some())
                .count() as u64
                * rows;
        let covered =
            |d: usize| -> u64 { segs.iter().filter(|g| g.d == d).map(|g| g.blocks).sum() };
        let rcw_reads: u64 = (0..k).map(|d| rows - covered(d).min(rows)).sum();
        let mut ops = None;
        if rmw_ok && rmw_reads < rcw_reads {
            ops = self.rmw(s, segs, data, r0, rows, view).await;
            if ops.is_none() {
                *view = self.view()?;
            }
        }
        match ops {
            Some(o) => Ok(o),
            None => self.rcw(s, segs, data, r0, r1, view).await,
        }
    }

    /// Read-modify-write: new parity = old parity + delta of the changed data.
    /// `None` when a read failed (the caller falls back to reconstruct-write).
    async fn rmw(
        &self,
        s: u64,
        segs: &[Seg],
        data: &Bytes,
        r0: u64,
        rows: u64,
        view: &View,
    ) -> Option<Vec<MemberOp>> {
        let pp = self.layout.parity_positions(s);
        let bs = self.bs as usize;
        let mut reads: Vec<(usize, u64, u64)> = segs
            .iter()
            .map(|g| (self.data_pos(s, g.d), s * self.cb + g.off, g.blocks))
            .collect();
        for &p in &pp {
            if view.readable(p, s).is_some() {
                reads.push((p, s * self.cb + r0, rows));
            }
        }
        let futs: Vec<BoxFut<'_, BlockResult<Bytes>>> = reads
            .iter()
            .map(|&(p, mlba, n)| -> BoxFut<'_, BlockResult<Bytes>> {
                Box::pin(async move {
                    match view.readable(p, s) {
                        Some(h) => self.m_read(h, mlba, n).await,
                        None => Err(unavailable("member gone".into())),
                    }
                })
            })
            .collect();
        let results = join_all(futs).await;
        let mut bufs = Vec::with_capacity(results.len());
        let mut bad = false;
        for ((p, _, _), r) in reads.iter().zip(results) {
            match r {
                Ok(b) => bufs.push(b),
                Err(e) => {
                    bad = true;
                    if let Some(h) = view.readable(*p, s) {
                        self.member_error(*p, h, &e).await;
                    }
                }
            }
        }
        if bad {
            return None;
        }
        let mut par: Vec<Vec<u8>> = bufs[segs.len()..].iter().map(|b| b.to_vec()).collect();
        let mut ops = Vec::new();
        for (i, g) in segs.iter().enumerate() {
            let new = data.slice(g.buf_off..g.buf_off + g.blocks as usize * bs);
            let mut delta = bufs[i].to_vec();
            gf::xor_into(&mut delta, &new);
            let at = (g.off - r0) as usize * bs;
            let mut pi = 0;
            for (j, &p) in pp.iter().enumerate() {
                if view.readable(p, s).is_none() {
                    continue;
                }
                let dst = &mut par[pi][at..at + delta.len()];
                if j == 0 {
                    gf::xor_into(dst, &delta);
                } else {
                    gf::mul_xor_into(gf::pow2(g.d), dst, &delta);
                }
                pi += 1;
            }
            ops.push(MemberOp {
                pos: self.data_pos(s, g.d),
                mlba: s * self.cb + g.off,
                kind: OpKind::Write(new),
            });
        }
        let mut pi = 0;
        for &p in &pp {
            if view.readable(p, s).is_none() {
                continue;
            }
            ops.push(MemberOp {
                pos: p,
                mlba: s * self.cb + r0,
                kind: OpKind::Write(Bytes::from(std::mem::take(&mut par[pi]))),
            });
            pi += 1;
        }
        Some(ops)
    }

    /// Reconstruct-write: parity recomputed from the full rows of new and old data.
    pub(crate) async fn rcw(
        &self,
        s: u64,
        segs: &[Seg],
        data: &Bytes,
        r0: u64,
        r1: u64,
        view: &View,
    ) -> BlockResult<Vec<MemberOp>> {
        let k = self.layout.data_chunks();
        let pp = self.layout.parity_positions(s);
        let bs = self.bs as usize;
        let rows = r1 - r0;
        let rb = rows as usize * bs;
        let need: Vec<bool> = (0..k)
            .map(|d| {
                !segs
                    .iter()
                    .any(|g| g.d == d && g.off <= r0 && g.off + g.blocks >= r1)
            })
            .collect();
        let mut cols = if need.iter().any(|&n| n) {
            self.read_rows(s, r0, r1, &need, view).await?
        } else {
            vec![None; k]
        };
        let mut full: Vec<Vec<u8>> = Vec::with_capacity(k);
        for (d, col) in cols.iter_mut().enumerate() {
            let mut c = col.take().unwrap_or_else(|| vec![0u8; rb]);
            for g in segs.iter().filter(|g| g.d == d) {
                let at = (g.off - r0) as usize * bs;
                let n = g.blocks as usize * bs;
                c[at..at + n].copy_from_slice(&data[g.buf_off..g.buf_off + n]);
            }
            full.push(c);
        }
        let refs: Vec<&[u8]> = full.iter().map(|c| c.as_slice()).collect();
        let mut p = vec![0u8; rb];
        let mut q = vec![0u8; if pp.len() > 1 { rb } else { 0 }];
        gf::compute_pq(&refs, &mut p, (pp.len() > 1).then_some(q.as_mut_slice()));
        let mut ops = Vec::new();
        for g in segs {
            let pos = self.data_pos(s, g.d);
            if view.writable(pos).is_some() {
                ops.push(MemberOp {
                    pos,
                    mlba: s * self.cb + g.off,
                    kind: OpKind::Write(data.slice(g.buf_off..g.buf_off + g.blocks as usize * bs)),
                });
            }
        }
        for (j, &pos) in pp.iter().enumerate() {
            if view.writable(pos).is_some() {
                let buf = if j == 0 {
                    std::mem::take(&mut p)
                } else {
                    std::mem::take(&mut q)
                };
                ops.push(MemberOp {
                    pos,
                    mlba: s * self.cb + r0,
                    kind: OpKind::Write(Bytes::from(buf)),
                });
            }
        }
        Ok(ops)
    }

    async fn discard_stripe(self: &Arc<Self>, s: u64, segs: &[Seg]) -> BlockResult<()> {
        let k = self.layout.data_chunks() as u64;
        let full = segs.iter().map(|g| g.blocks).sum::<u64>() == k * self.cb;
        match self.layout.scheme() {
            Scheme::Parity { .. } if !full => {
                let len = segs.iter().map(|g| g.blocks).sum::<u64>() * self.bs;
                let zeroes = Bytes::from(vec![0u8; len as usize]);
                let base = segs.first().map_or(0, |g| g.buf_off);
                let segs: Vec<Seg> = segs
                    .iter()
                    .map(|g| Seg {
                        buf_off: g.buf_off - base,
                        ..*g
                    })
                    .collect();
                self.write_parity_stripe(s, &segs, &zeroes, false).await
            }
            _ => {
                let _g = self.lock_for(s).write().await;
                let view = self.view()?;
                let mut ops = Vec::new();
                if full && matches!(self.layout.scheme(), Scheme::Parity { .. }) {
                    for pos in 0..self.layout.member_count() {
                        if view.writable(pos).is_some() {
                            ops.push(MemberOp {
                                pos,
                                mlba: s * self.cb,
                                kind: OpKind::Discard(self.cb),
                            });
                        }
                    }
                } else {
                    for g in segs {
                        for pos in self.layout.data_positions(s, g.d) {
                            if view.writable(pos).is_some() {
                                ops.push(MemberOp {
                                    pos,
                                    mlba: s * self.cb + g.off,
                                    kind: OpKind::Discard(g.blocks),
                                });
                            }
                        }
                    }
                }
                let mirror = self.layout.scheme() == Scheme::Mirror;
                let intent = if mirror {
                    self.intent_begin(s).await?
                } else {
                    None
                };
                let r = self.commit(s, ops, &view, false, None).await;
                self.intent_end(intent);
                r
            }
        }
    }
}

impl Inner {
    /// The pool's blocks `lba..lba + blocks` (checked by the caller).
    async fn read_range(&self, lba: u64, blocks: u32) -> BlockResult<Bytes> {
        let _fg = FgGuard::new(&self.fg_inflight);
        let segs = self.segments(lba, blocks as u64);
        let futs: Vec<BoxFut<'_, BlockResult<Bytes>>> = segs
            .iter()
            .map(|&g| -> BoxFut<'_, BlockResult<Bytes>> { Box::pin(self.read_seg(g)) })
            .collect();
        let mut out = BytesMut::with_capacity(blocks as usize * self.bs as usize);
        for r in join_all(futs).await {
            out.extend_from_slice(&r?);
        }
        Ok(out.freeze())
    }
}

fn by_stripe(segs: Vec<Seg>) -> Vec<(u64, Vec<Seg>)> {
    let mut out: Vec<(u64, Vec<Seg>)> = Vec::new();
    for g in segs {
        match out.last_mut() {
            Some((s, v)) if *s == g.stripe => v.push(g),
            _ => out.push((g.stripe, vec![g])),
        }
    }
    out
}

/// A read-modify-write that met unreadable sectors names a block of the
/// stripe it read, maybe outside the write: the write's own first block is
/// the one to name.
fn medium_within(r: BlockResult<()>, lba: u64, blocks: u64) -> BlockResult<()> {
    match r {
        Err(BlockError::Medium { lba: at }) if at < lba || at >= lba + blocks => {
            Err(BlockError::Medium { lba })
        }
        r => r,
    }
}

#[async_trait]
impl Volume for Pool {
    fn geometry(&self) -> Geometry {
        self.inner.geometry()
    }

    /// A redundant pool's read runs to its end even if its caller drops it
    /// (`block::detach`): a read that meets a medium error rewrites the block
    /// (RAID 5/6: reconstructed; mirrors: from the good copy) under the
    /// stripe's lock. Dropped there, the lock went while the member still had
    /// the repair write, a later write of the stripe could land first, and the
    /// repair's older data over it.
    async fn read(&self, lba: u64, blocks: u32) -> BlockResult<Bytes> {
        self.inner.geometry().check_range(lba, blocks as u64)?;
        if self.inner.layout.scheme() == Scheme::Striped {
            // nothing to repair: a dropped RAID 0 read leaves nothing behind
            return self.inner.read_range(lba, blocks).await;
        }
        // lost blocks are refused; the record is looked at again after the
        // read, since a rebuild records lost blocks before it writes their
        // stand-in values (see `lost.rs`)
        self.inner
            .read_checked(lba, blocks as u64, || {
                let inner = Arc::clone(&self.inner);
                block::detach::detached(async move { inner.read_range(lba, blocks).await })
            })
            .await
    }

    async fn write(&self, lba: u64, data: Bytes, fua: bool) -> BlockResult<()> {
        let inner = &self.inner;
        let blocks = inner.geometry().blocks_in(data.len())?;
        inner.geometry().check_range(lba, blocks)?;
        if blocks == 0 {
            return Ok(());
        }
        if inner.layout.scheme() == Scheme::Striped {
            let _fg = FgGuard::new(&inner.fg_inflight);
            inner.note_write_arrival();
            let segs = inner.segments(lba, blocks);
            return inner.write_striped(&segs, &data, fua).await;
        }
        // A redundant update runs to its end once started, even if its caller
        // gives up: dropped between its member writes it would leave mirror
        // copies that answer reads differently, or a stripe whose parity no
        // longer matches its data (and a later reconstruction wrong).
        let inner = Arc::clone(inner);
        let r = block::detach::detached(async move {
            let _fg = FgGuard::new(&inner.fg_inflight);
            inner.note_write_arrival();
            let scheme = inner.layout.scheme();
            let groups = by_stripe(inner.segments(lba, blocks));
            let (inner, data) = (&inner, &data);
            let write_groups = || async {
                let futs: Vec<BoxFut<'_, BlockResult<()>>> = groups
                    .iter()
                    .map(|(s, g)| -> BoxFut<'_, BlockResult<()>> {
                        if scheme == Scheme::Mirror {
                            Box::pin(inner.write_mirror_stripe(*s, g, data, fua))
                        } else {
                            Box::pin(inner.write_parity_group(*s, g, data, fua, lba, blocks))
                        }
                    })
                    .collect();
                join_all(futs).await
            };
            let results = write_groups().await;
            // a read-modify-write that met unreadable sectors beyond the
            // redundancy (a degraded pool's survivor): the rows of those
            // stripes that cannot be decided are given up as a rebuild gives
            // them up, and the write is done again (see `lost.rs`)
            let unreadable: Vec<u64> = groups
                .iter()
                .zip(&results)
                .filter(|(_, r)| matches!(r, Err(BlockError::Medium { .. })))
                .map(|((s, _), _)| *s)
                .collect();
            if scheme != Scheme::Mirror
                && !unreadable.is_empty()
                && results
                    .iter()
                    .all(|r| matches!(r, Ok(()) | Err(BlockError::Medium { .. })))
            {
                if inner.give_up_rows(&unreadable).await.is_none() {
                    return Err(BlockError::Medium { lba });
                }
                for r in write_groups().await {
                    r?;
                }
            } else {
                for r in results {
                    r?;
                }
            }
            // (a member it skipped must be failed on disk first)
            inner.failures_durable().await?;
            inner.lost_written(lba, blocks).await
        })
        .await;
        medium_within(r, lba, blocks)
    }

    /// Grows the pool while it serves: see [`Pool::grow_to`].
    async fn grow(&self, block_count: u64) -> BlockResult<()> {
        if block_count < self.inner.geometry().block_count {
            return Err(BlockError::NotSupported("shrinking a pool"));
        }
        self.inner
            .grow_to(block_count)
            .await
            .map_err(crate::grow::grow_error)
    }

    /// Makes every acknowledged write durable: the members' caches are
    /// flushed (whole-stripe writes, and the in-place writes done so far). A
    /// journaled update acknowledged before its in-place writes is durable
    /// already (its record was written with FUA, and replay redoes it), so a
    /// flush does not wait for those writes; `shutdown` and checkpoints do.
    async fn flush(&self) -> BlockResult<()> {
        let _fg = FgGuard::new(&self.inner.fg_inflight);
        self.inner.flush_members().await?;
        self.inner.failures_durable().await
    }

    /// Discard passes through to the members when they are all thin (the range
    /// then reads as zeroes): whole stripes are discarded on every member (parity
    /// of zeroes is zeroes, journaled like a write), partial stripes of parity levels
    /// are written with zeroes. On a pool with thick members discard is ignored.
    async fn discard(&self, lba: u64, blocks: u64) -> BlockResult<()> {
        let inner = &self.inner;
        inner.geometry().check_range(lba, blocks)?;
        if !inner.geometry().thin || blocks == 0 {
            return Ok(());
        }
        // as a write: once started, to its end (see `write`)
        let inner = Arc::clone(inner);
        let r = block::detach::detached(async move {
            let _fg = FgGuard::new(&inner.fg_inflight);
            for (s, segs) in by_stripe(inner.segments(lba, blocks)) {
                match inner.discard_stripe(s, &segs).await {
                    // a partial stripe written with zeroes met unreadable
                    // sectors beyond the redundancy: as a write does
                    Err(BlockError::Medium { .. })
                        if inner.layout.scheme() != Scheme::Mirror
                            && inner.give_up_rows(&[s]).await.is_some() =>
                    {
                        inner.discard_stripe(s, &segs).await?
                    }
                    r => r?,
                }
            }
            inner.failures_durable().await?;
            // the range reads as zeroes now, lost blocks included
            inner.lost_written(lba, blocks).await
        })
        .await;
        medium_within(r, lba, blocks)
    }
}
