//! Lost blocks: pool blocks whose data a rebuild could not recover.
//!
//! A rebuild reads every survivor of a stripe to compute what the member it
//! rebuilds should hold. Where a survivor has an unreadable sector and the pool
//! has no redundancy left to stand in for it (RAID 5 or a two-way mirror with one
//! member being rebuilt, RAID 6 with two), the blocks at that row are gone. The
//! rebuild used to stop at that stripe for good, retrying it with a back-off:
//! the pool never became redundant again for the rest of its blocks, for the
//! sake of a few it could not save.
//!
//! Now, as md does with its bad-block log, the rebuild goes on (after one
//! retry) and records those pool blocks as lost:
//! - Only the rows that cannot be read are given up (the stripe is read again
//!   row by row); every other row of the stripe is rebuilt as usual.
//! - At a lost row, the members that can be read keep what they hold. The
//!   unknown data chunks are given values that keep the row's parity right
//!   (zeroes, and for as many as the parity still readable decides, what that
//!   parity makes them); unknown parity is computed from them. Mirrors get
//!   zeroes on every copy. The rebuilt member gets its part, and the sector that
//!   could not be read is written (a disk remaps a bad sector on write). As the
//!   readable members are not changed, a journal record replayed after a crash
//!   writes what they already hold.
//! - The lost pool blocks are recorded in the superblocks (`lost_blocks`,
//!   written before any of those writes) and shown in the pool's status.
//! - A read that touches a lost block fails with a medium error at the first
//!   such block (SCSI: UNRECOVERED READ ERROR with that LBA), as a disk answers
//!   for a sector it cannot read, never with the stand-in values.
//! - A write (or a discard that zeroes) over a lost block makes it good again:
//!   the record is updated in the superblocks before the write is acknowledged.
//!
//! A rebuild records at most [`LOST_RANGES_MAX`] ranges (adjacent blocks merge
//! into one); one that would need more is held at its stripe as before, and
//! says so. Writes inside ranges split them up to [`LOST_RANGES_KEPT_MAX`].

use crate::io::{MemberOp, OpKind, Seg};
use crate::layout::Scheme;
use crate::pool::{Inner, View};
use crate::superblock::{LOST_RANGES_KEPT_MAX, LOST_RANGES_MAX};
use crate::util::{join_all, BoxFut};
use block::{BlockError, BlockResult, Bytes};
use std::collections::BTreeMap;
use std::sync::atomic::Ordering;

/// The lost pool blocks, as ranges `first -> end` (exclusive), apart.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Lost {
    ranges: BTreeMap<u64, u64>,
}

impl Lost {
    /// From the superblock's `[first, count]` records (validated there).
    pub fn from_records(records: &[[u64; 2]]) -> Self {
        let mut l = Lost::default();
        for &[first, count] in records {
            l.ranges.insert(first, first + count);
        }
        l
    }

    /// The superblock's records.
    pub fn records(&self) -> Vec<[u64; 2]> {
        self.ranges.iter().map(|(&a, &b)| [a, b - a]).collect()
    }

    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    /// Blocks recorded lost.
    pub fn blocks(&self) -> u64 {
        self.ranges.iter().map(|(a, b)| b - a).sum()
    }

    /// The first lost block of `[lba, lba + blocks)`.
    pub fn first_in(&self, lba: u64, blocks: u64) -> Option<u64> {
        if blocks == 0 {
            return None;
        }
        let end = lba.saturating_add(blocks);
        // the range starting at or before lba, then any starting inside
        if let Some((_, &e)) = self.ranges.range(..=lba).next_back() {
            if e > lba {
                return Some(lba);
            }
        }
        self.ranges.range(lba..end).next().map(|(&a, _)| a)
    }

    /// Records `[lba, lba + blocks)` lost, merging with the ranges it touches;
    /// false (and nothing changed) when that would make more than `max` ranges.
    pub fn add(&mut self, lba: u64, blocks: u64, max: usize) -> bool {
        if blocks == 0 {
            return true;
        }
        let (mut a, mut b) = (lba, lba + blocks);
        let touching: Vec<(u64, u64)> = self
            .ranges
            .range(..=b)
            .rev()
            .take_while(|(_, &e)| e >= a)
            .map(|(&s, &e)| (s, e))
            .collect();
        if touching.is_empty() && self.ranges.len() >= max {
            return false;
        }
        for (s, e) in touching {
            self.ranges.remove(&s);
            a = a.min(s);
            b = b.max(e);
        }
        self.ranges.insert(a, b);
        true
    }

    /// Forgets `[lba, lba + blocks)` (written since); true if anything was
    /// recorded there. A range the write falls inside is split in two unless
    /// that would make more than `max` ranges: it is then kept whole (its
    /// written blocks stay recorded lost: refused, never served wrong).
    pub fn remove(&mut self, lba: u64, blocks: u64, max: usize) -> bool {
        if blocks == 0 {
            return false;
        }
        let end = lba.saturating_add(blocks);
        let hit: Vec<(u64, u64)> = self
            .ranges
            .range(..end)
            .rev()
            .take_while(|(_, &e)| e > lba)
            .map(|(&s, &e)| (s, e))
            .collect();
        let mut changed = false;
        for &(s, e) in &hit {
            if s < lba && e > end && self.ranges.len() >= max {
                tracing::warn!(
                    first = s,
                    end = e,
                    lba,
                    blocks,
                    "lost-block record full: a write inside a lost range leaves it recorded whole"
                );
                continue;
            }
            changed = true;
            self.ranges.remove(&s);
            if s < lba {
                self.ranges.insert(s, lba);
            }
            if e > end {
                self.ranges.insert(end, e);
            }
        }
        changed
    }
}

/// What [`Inner::salvage_stripe`] made of a stripe.
pub(crate) struct Salvaged {
    /// The full-chunk images of the positions asked for.
    pub images: Vec<Vec<u8>>,
    /// Unreadable sectors of other positions written again in rows that
    /// could be decided.
    pub repaired: u64,
    /// Unreadable sectors written with stand-ins in rows given up.
    pub given_up: u64,
    /// Pool blocks newly recorded lost.
    pub lost: u64,
    /// Per member: its sectors written again (repaired or given up).
    pub by_member: Vec<u64>,
}

/// What a salvage of one row decided.
struct Row {
    /// Per grid position in the stripe: the row's new content, where it must be
    /// written (the rebuilt positions and the unreadable ones).
    writes: Vec<(usize, Vec<u8>)>,
    /// Data chunks of the stripe whose block at this row is lost.
    lost: Vec<usize>,
    /// Parity levels: every data chunk's block at this row as decided (read,
    /// reconstructed or a stand-in).
    data: Vec<Vec<u8>>,
}

impl Inner {
    /// The first lost block of a pool range, if any.
    pub fn lost_in(&self, lba: u64, blocks: u64) -> Option<u64> {
        if !self.lost_any.load(Ordering::SeqCst) {
            return None;
        }
        self.state.lock().lost.first_in(lba, blocks)
    }

    /// Says whether the record holds anything, and bumps its epoch when
    /// blocks were `added` (only a record added during a read can have given
    /// it a stand-in: one removed follows the write that made the blocks
    /// good); the caller holds the state lock and has just changed `lost`.
    fn lost_changed(&self, lost: &Lost, added: bool) {
        self.lost_any.store(!lost.is_empty(), Ordering::SeqCst);
        if added {
            self.lost_epoch.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// Reads a pool range, or a medium error at its first lost block. A
    /// record that changes during the read (a rebuild giving up rows, a write
    /// making blocks good) means the read is done again: it might have got a
    /// stand-in value whose record was made and cleared meanwhile.
    pub async fn read_checked<F, Fut>(&self, lba: u64, blocks: u64, read: F) -> BlockResult<Bytes>
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = BlockResult<Bytes>>,
    {
        for _ in 0..4 {
            let epoch = self.lost_epoch.load(Ordering::SeqCst);
            if let Some(lost) = self.lost_in(lba, blocks) {
                return Err(BlockError::Medium { lba: lost });
            }
            let r = read().await;
            if let Some(lost) = self.lost_in(lba, blocks) {
                return Err(BlockError::Medium { lba: lost });
            }
            if self.lost_epoch.load(Ordering::SeqCst) == epoch {
                return r;
            }
        }
        Err(BlockError::Unavailable(format!(
            "pool {}: the record of lost blocks kept changing during a read; try again",
            self.name
        )))
    }

    /// `[lba, lba + blocks)` holds what was just written: lost blocks there
    /// are good again, and the superblocks say so before the caller
    /// acknowledges the write (a crash must not bring the record back over
    /// acknowledged data).
    pub async fn lost_written(&self, lba: u64, blocks: u64) -> BlockResult<()> {
        if !self.lost_any.load(Ordering::SeqCst) {
            return Ok(());
        }
        let changed = {
            let mut st = self.state.lock();
            let changed = st.lost.remove(lba, blocks, LOST_RANGES_KEPT_MAX);
            if changed {
                self.lost_changed(&st.lost, false);
            }
            changed
        };
        if changed {
            tracing::info!(pool = %self.name, lba, blocks, "lost blocks written again: good");
            self.persist().await?;
        }
        Ok(())
    }

    /// Pool block of data chunk `d`'s row `row` in stripe `s`, if the pool
    /// exposes it.
    fn pool_block(&self, s: u64, d: usize, row: u64) -> Option<u64> {
        let k = self.layout.data_chunks() as u64;
        let lba = (s * k + d as u64) * self.cb + row;
        (lba < self.geometry().block_count).then_some(lba)
    }

    /// Stripes whose rows cannot all be decided: a write (or a discard that
    /// writes zeroes) to a parity pool whose read-modify-write met unreadable
    /// sectors where a row has no redundancy left (a degraded pool with a bad
    /// sector on a survivor; not a data-first update, which holds the
    /// stripe's lock and its record), or a scrub that met them. Gives up the rows of
    /// `stripes` that cannot be decided, as a rebuild does
    /// ([`Inner::salvage_stripe`]: every journal record checkpointed first,
    /// the lost blocks recorded, the unreadable sectors written with
    /// stand-ins that keep the row's parity right), so that the write can be
    /// done again and the next member loss rebuilds the rows' other blocks
    /// right; rows that can be decided only have their unreadable sectors
    /// written again. The caller holds no stripe lock (the checkpoint waits
    /// for journal records in flight, whose writers may wait on one). False
    /// None if a stripe could not be given up (the pool failed or is
    /// closing, its members changed meanwhile, the list of lost blocks is
    /// full); else what was written again and recorded lost.
    pub(crate) async fn give_up_rows(&self, stripes: &[u64]) -> Option<Salvaged> {
        let mut all = Salvaged {
            images: Vec::new(),
            repaired: 0,
            given_up: 0,
            lost: 0,
            by_member: vec![0; self.layout.member_count()],
        };
        for &s in stripes {
            if self.is_failed() || self.closed.load(Ordering::SeqCst) {
                return None;
            }
            // (its own checkpoint: the rebuild's slot is left alone)
            let checkpointed = self.checkpoint_for_salvage().await?;
            let _g = self.lock_for(s).write().await;
            let Ok(view) = self.view() else {
                return None;
            };
            match self.salvage_stripe(s, &[], &view, checkpointed).await {
                Ok(done) => {
                    all.repaired += done.repaired;
                    all.given_up += done.given_up;
                    all.lost += done.lost;
                    for (a, b) in all.by_member.iter_mut().zip(done.by_member) {
                        *a += b;
                    }
                }
                Err(e) => {
                    tracing::warn!(pool = %self.name, stripe = s, error = %e,
                        "could not give up the unreadable rows of the stripe");
                    return None;
                }
            }
        }
        Some(all)
    }

    /// The rebuild could not compute stripe `s` for the positions `want`
    /// (the caller holds the stripe's write lock): reads it row by row, gives
    /// up the rows that cannot be decided (see the module's notes), records
    /// their lost blocks durably, writes the unreadable positions, and returns
    /// the full-chunk images of `want`. An error (a member failed, too many
    /// lost ranges) leaves the stripe's data as it was; a record that failed
    /// to reach every superblock stays (those rows could not be read anyway).
    /// The caller has had every journal record checkpointed since the
    /// stripe's first failed try (see `prepare_salvage`).
    pub(crate) async fn salvage_stripe(
        &self,
        s: u64,
        want: &[usize],
        view: &View,
        checkpointed: u64,
    ) -> BlockResult<Salvaged> {
        let bs = self.bs as usize;
        let mut images = vec![vec![0u8; self.cb as usize * bs]; want.len()];
        // (position, row, content, whether the row was given up)
        let mut repairs: Vec<(usize, u64, Vec<u8>, bool)> = Vec::new();
        let mut lost: Vec<(usize, u64)> = Vec::new();
        for row in 0..self.cb {
            let r = self.salvage_row(s, row, want, view).await?;
            let given_up = !r.lost.is_empty();
            for (pos, content) in r.writes {
                match want.iter().position(|&w| w == pos) {
                    Some(i) => images[i][row as usize * bs..][..bs].copy_from_slice(&content),
                    None => repairs.push((pos, row, content, given_up)),
                }
            }
            lost.extend(r.lost.into_iter().map(|d| (d, row)));
        }
        // (blocks past the exposed end, in a grown pool's last stripe, are none)
        let blocks: Vec<u64> = lost
            .iter()
            .filter_map(|&(d, row)| self.pool_block(s, d, row))
            .collect();
        let newly = if lost.is_empty() {
            0
        } else {
            self.record_lost(s, &blocks, Some(checkpointed)).await?
        };
        let (mut repaired, mut given_up) = (0, 0);
        let mut by_member = vec![0u64; self.layout.member_count()];
        for (pos, row, content, row_given_up) in repairs {
            let Some(at) = view.writable(pos) else {
                continue;
            };
            // (forced: a write acknowledged next may rest on a stand-in, its
            // parity computed with it, and a journal record does not carry it)
            match self
                .m_write(at, s * self.cb + row, Bytes::from(content), true)
                .await
            {
                Ok(()) => {
                    by_member[self.layout.member_of(pos)] += 1;
                    if row_given_up {
                        given_up += 1
                    } else {
                        repaired += 1
                    }
                }
                Err(e) => {
                    tracing::warn!(pool = %self.name, position = pos, stripe = s, error = %e,
                        "writing an unreadable sector again failed");
                    self.fail_handle(pos, at.h).await;
                }
            }
        }
        Ok(Salvaged {
            images,
            repaired,
            given_up,
            lost: newly,
            by_member,
        })
    }

    /// Records pool blocks `blocks` of stripe `s` lost (rows given up), in
    /// memory and, before the caller writes any stand-in, in the
    /// superblocks; the blocks newly recorded (a row given up before adds
    /// none, and nothing is written then). With `checkpointed`, refused if
    /// the pool's generation moved past that checkpoint meanwhile (a member
    /// failed or joined during the row reads: its records were not
    /// checkpointed). Refused too when the list would pass
    /// [`LOST_RANGES_MAX`] ranges; nothing changes then.
    async fn record_lost(
        &self,
        s: u64,
        blocks: &[u64],
        checkpointed: Option<u64>,
    ) -> BlockResult<u64> {
        let newly = {
            let mut st = self.state.lock();
            if checkpointed.is_some_and(|g| g != st.generation) {
                return Err(BlockError::Unavailable(format!(
                    "pool {}: stripe {s}: the members changed while its rows were read",
                    self.name
                )));
            }
            if blocks.is_empty() {
                // (rows past a grown pool's exposed end: nothing to record)
                return Ok(0);
            }
            let mut grown = st.lost.clone();
            for &lba in blocks {
                if !grown.add(lba, 1, LOST_RANGES_MAX) {
                    return Err(BlockError::Unavailable(format!(
                        "pool {}: stripe {s} has unreadable blocks beyond the \
                         redundancy, and the list of lost blocks is full \
                         ({LOST_RANGES_MAX} ranges)",
                        self.name
                    )));
                }
            }
            let newly = grown.blocks() - st.lost.blocks();
            if newly > 0 {
                st.lost = grown;
                self.lost_changed(&st.lost, true);
            }
            newly
        };
        tracing::error!(pool = %self.name, stripe = s, ?blocks,
            "unreadable sectors beyond the redundancy; these pool blocks are lost \
             (reads of them fail until they are written again)");
        if newly > 0 {
            self.persist().await?;
        }
        Ok(newly)
    }

    /// A data-first update (`segs` of `data` in stripe `s`) that was
    /// acknowledged already and whose completion cannot read what it needs:
    /// unreadable sectors beyond the redundancy in its rows (the written
    /// block's own old data and another block of its row, say). The caller
    /// holds the stripe's lock and the update's record in flight. Its rows
    /// are given up around it, row by row as a rebuild gives them up, with
    /// the update laid over them: the member writes to do (the update, the
    /// stand-ins of the unreadable blocks it does not cover, the rows'
    /// parity), after the blocks it does not cover whose every copy is
    /// unknown are recorded lost, durably. The caller writes them (forced),
    /// completes the data-first record and takes a checkpoint past it, so
    /// that no older record of the stripe is replayed over the rows after a
    /// crash (none can be taken before: it would wait for that record). An
    /// error leaves the members as they were; a record of lost blocks that
    /// failed to reach every superblock stays (those blocks could not be
    /// read anyway).
    pub(crate) async fn complete_given_up(
        &self,
        s: u64,
        segs: &[Seg],
        data: &Bytes,
    ) -> BlockResult<(Vec<MemberOp>, View)> {
        let view = self.view()?;
        let bs = self.bs as usize;
        let k = self.layout.data_chunks();
        let pp = self.layout.parity_positions(s);
        let r0 = segs.iter().map(|g| g.off).min().unwrap_or(0);
        let r1 = segs.iter().map(|g| g.off + g.blocks).max().unwrap_or(0);
        let rb = (r1 - r0) as usize * bs;
        let mut par = vec![vec![0u8; rb]; pp.len()];
        let mut ops = Vec::new();
        let mut lost = Vec::new();
        for row in r0..r1 {
            let r = self.salvage_row(s, row, &[], &view).await?;
            if r.data.len() != k {
                return Err(BlockError::NotSupported(
                    "giving up rows of a mirror update",
                ));
            }
            let mut cols = r.data;
            let covering = |d: usize| {
                segs.iter()
                    .find(|g| g.d == d && g.off <= row && row < g.off + g.blocks)
            };
            for (d, col) in cols.iter_mut().enumerate() {
                if let Some(g) = covering(d) {
                    let at = g.buf_off + (row - g.off) as usize * bs;
                    col.copy_from_slice(&data[at..at + bs]);
                }
            }
            // stand-ins where the update does not write (parity is redone),
            // on members that are there (assemble journals these writes: a
            // missing member's would add an entry per row)
            for (pos, content) in r.writes {
                let chunk = (0..k).find(|&d| self.layout.data_positions(s, d)[0] == pos);
                if chunk.is_some_and(|d| covering(d).is_none()) && view.writable(pos).is_some() {
                    ops.push(MemberOp {
                        pos,
                        mlba: s * self.cb + row,
                        kind: OpKind::Write(Bytes::from(content)),
                    });
                }
            }
            lost.extend(
                r.lost
                    .into_iter()
                    .filter(|&d| covering(d).is_none())
                    .filter_map(|d| self.pool_block(s, d, row)),
            );
            let refs: Vec<&[u8]> = cols.iter().map(Vec::as_slice).collect();
            let at = (row - r0) as usize * bs;
            let (p, q) = par.split_at_mut(1);
            crate::gf::compute_pq(
                &refs,
                &mut p[0][at..at + bs],
                q.first_mut().map(|q| &mut q[at..at + bs]),
            );
        }
        self.record_lost(s, &lost, None).await?;
        for g in segs {
            ops.push(MemberOp {
                pos: self.layout.data_positions(s, g.d)[0],
                mlba: s * self.cb + g.off,
                kind: OpKind::Write(data.slice(g.buf_off..g.buf_off + g.blocks as usize * bs)),
            });
        }
        for (&pos, buf) in pp.iter().zip(par) {
            ops.push(MemberOp {
                pos,
                mlba: s * self.cb + r0,
                kind: OpKind::Write(Bytes::from(buf)),
            });
        }
        ops.retain(|o| view.writable(o.pos).is_some());
        Ok((ops, view))
    }

    /// One block row of stripe `s`: reads every position outside `want` and
    /// decides what the unknown ones hold.
    async fn salvage_row(&self, s: u64, row: u64, want: &[usize], view: &View) -> BlockResult<Row> {
        let mlba = s * self.cb + row;
        let positions = self.layout.positions();
        let futs: Vec<BoxFut<'_, Option<Vec<u8>>>> = (0..positions)
            .map(|pos| -> BoxFut<'_, Option<Vec<u8>>> {
                Box::pin(async move {
                    if want.contains(&pos) {
                        return None;
                    }
                    let at = view.readable(pos, s)?;
                    match self.m_read(at, mlba, 1).await {
                        Ok(b) => Some(b.to_vec()),
                        Err(e) => {
                            self.member_error(pos, at, &e).await;
                            None
                        }
                    }
                })
            })
            .collect();
        let got: Vec<Option<Vec<u8>>> = join_all(futs).await;
        if self.is_failed() {
            return Err(BlockError::Unavailable(format!(
                "pool {} failed while a stripe's rows were read",
                self.name
            )));
        }
        let bs = self.bs as usize;
        let k = self.layout.data_chunks();
        // a position with content to write: unknown now (rebuilt, or unreadable
        // and still attached)
        let unknown = |pos: usize| got[pos].is_none();
        let mut writes = Vec::new();
        let mut lost = Vec::new();
        let mut data = Vec::new();
        match self.layout.scheme() {
            Scheme::Striped => return Err(BlockError::NotSupported("raid0 has no redundancy")),
            Scheme::Mirror => {
                for d in 0..k {
                    let copies = self.layout.data_positions(s, d);
                    if !copies.iter().any(|&p| unknown(p)) {
                        continue;
                    }
                    let good = copies.iter().find_map(|&p| got[p].clone());
                    if good.is_none() {
                        lost.push(d);
                    }
                    let content = good.unwrap_or_else(|| vec![0u8; bs]);
                    for &p in copies.iter().filter(|&&p| unknown(p)) {
                        writes.push((p, content.clone()));
                    }
                }
            }
            Scheme::Parity { parity_count } => {
                let pp = self.layout.parity_positions(s);
                let mut cols: Vec<Option<Vec<u8>>> = (0..k)
                    .map(|d| got[self.layout.data_positions(s, d)[0]].clone())
                    .collect();
                let p = got[pp[0]].clone();
                let q = pp.get(1).and_then(|&x| got[x].clone());
                let missing: Vec<usize> = (0..k).filter(|&d| cols[d].is_none()).collect();
                let readable_parity = p.is_some() as usize + q.is_some() as usize;
                if missing.len() > readable_parity {
                    // the first ones get zeroes; the rest, what the readable
                    // parity makes them (so it stays right)
                    for &d in &missing[..missing.len() - readable_parity] {
                        cols[d] = Some(vec![0u8; bs]);
                    }
                    lost.extend(missing.iter().copied());
                }
                if !crate::gf::reconstruct(&mut cols, p.as_deref(), q.as_deref(), bs) {
                    return Err(BlockError::Unavailable(format!(
                        "pool {}: stripe {s} row {row} cannot be decided",
                        self.name
                    )));
                }
                let cols: Vec<Vec<u8>> = cols.into_iter().map(Option::unwrap_or_default).collect();
                let refs: Vec<&[u8]> = cols.iter().map(Vec::as_slice).collect();
                let mut np = vec![0u8; bs];
                let mut nq = vec![0u8; if parity_count > 1 { bs } else { 0 }];
                crate::gf::compute_pq(
                    &refs,
                    &mut np,
                    (parity_count > 1).then_some(nq.as_mut_slice()),
                );
                for (d, c) in cols.iter().enumerate() {
                    let pos = self.layout.data_positions(s, d)[0];
                    if unknown(pos) {
                        writes.push((pos, c.clone()));
                    }
                }
                if unknown(pp[0]) {
                    writes.push((pp[0], np));
                }
                if let Some(&qp) = pp.get(1) {
                    if unknown(qp) {
                        writes.push((qp, nq));
                    }
                }
                data = cols;
            }
        }
        Ok(Row { writes, lost, data })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn lost_ranges_merge_split_and_answer_the_first_block() {
        let mut l = Lost::default();
        assert!(l.add(10, 2, 4));
        assert!(l.add(12, 1, 4)); // adjacent: merges
        assert_eq!(l.records(), vec![[10, 3]]);
        assert!(l.add(20, 1, 4));
        assert_eq!(l.first_in(0, 10), None);
        assert_eq!(l.first_in(0, 11), Some(10));
        assert_eq!(l.first_in(11, 100), Some(11));
        assert_eq!(l.first_in(13, 7), None);
        assert_eq!(l.first_in(13, 8), Some(20));
        assert!(l.remove(11, 1, 8));
        assert_eq!(l.records(), vec![[10, 1], [12, 1], [20, 1]]);
        assert!(!l.remove(13, 7, 8));
        assert!(!l.remove(12, 0, 8));
        assert_eq!(l.blocks(), 3);
        // full: a new range is refused, one touching an existing one is not
        assert!(!l.add(30, 1, 3));
        assert!(l.add(21, 1, 3));
        assert_eq!(Lost::from_records(&l.records()), l);
    }

    #[test]
    fn a_write_inside_a_lost_range_splits_it_only_up_to_the_bound() {
        let mut l = Lost::default();
        assert!(l.add(0, 10, 8));
        assert!(l.remove(5, 1, 3));
        assert!(l.remove(2, 1, 3));
        assert_eq!(l.records(), vec![[0, 2], [3, 2], [6, 4]]);
        // a fourth range is one too many: the range stays whole
        assert!(!l.remove(8, 1, 3));
        assert_eq!(l.blocks(), 8);
        // trimming an end needs no new range
        assert!(l.remove(9, 1, 3));
        assert_eq!(l.records(), vec![[0, 2], [3, 2], [6, 3]]);
    }

    /// A read during which the record of lost blocks changes is done again:
    /// a rebuild may have recorded blocks, written their stand-ins, and a
    /// write made them good again, all while the read ran, and the read got
    /// a stand-in. It is answered from the read done after the change.
    #[tokio::test]
    async fn a_read_during_which_the_lost_record_changes_is_done_again() {
        use crate::{Member, Pool, PoolConfig, RaidLevel};
        use block::{MemVolume, VolumeRef};
        use std::sync::atomic::AtomicU32;
        use std::sync::Arc;
        let members: Vec<Member> = (0..3)
            .map(|i| {
                let v = Arc::new(MemVolume::new(4096, 2048)) as VolumeRef;
                Member::new(format!("m{i}"), v)
            })
            .collect();
        let mut cfg = PoolConfig::new("p", RaidLevel::Raid5);
        cfg.chunk_bytes = 8192;
        cfg.journal_bytes = Some(256 * 1024);
        let pool = Pool::create(cfg, members, vec![]).await.unwrap();
        let inner = &pool.inner;
        let calls = AtomicU32::new(0);
        let got = inner
            .read_checked(7, 1, || {
                let n = calls.fetch_add(1, Ordering::SeqCst);
                async move {
                    if n == 0 {
                        // recorded and made good again while this read ran
                        let mut st = inner.state.lock();
                        st.lost.add(7, 1, 8);
                        inner.lost_changed(&st.lost, true);
                        st.lost.remove(7, 1, 8);
                        inner.lost_changed(&st.lost, false);
                        return Ok(Bytes::from_static(b"stand-in"));
                    }
                    Ok(Bytes::from_static(b"written"))
                }
            })
            .await
            .unwrap();
        assert_eq!(&got[..], b"written");
        assert_eq!(calls.load(Ordering::SeqCst), 2);
        // recorded lost: refused before any read
        {
            let mut st = inner.state.lock();
            st.lost.add(7, 1, 8);
            inner.lost_changed(&st.lost, true);
        }
        let r = inner
            .read_checked(6, 4, || async { Ok(Bytes::from_static(b"never")) })
            .await;
        assert!(matches!(r, Err(BlockError::Medium { lba: 7 })), "{r:?}");
    }

    proptest! {
        /// The ranges answer as a set of blocks does, whatever the order of
        /// adds and removes, and stay apart and non-empty.
        #[test]
        fn lost_ranges_behave_as_a_set_of_blocks(
            ops in proptest::collection::vec((any::<bool>(), 0u64..64, 1u64..8), 1..40),
            probe in (0u64..72, 0u64..16),
        ) {
            let mut l = Lost::default();
            let mut set = std::collections::BTreeSet::new();
            for (add, lba, n) in ops {
                if add {
                    prop_assert!(l.add(lba, n, usize::MAX));
                    set.extend(lba..lba + n);
                } else {
                    let had = (lba..lba + n).any(|b| set.contains(&b));
                    prop_assert_eq!(l.remove(lba, n, usize::MAX), had);
                    for b in lba..lba + n {
                        set.remove(&b);
                    }
                }
            }
            prop_assert_eq!(l.blocks(), set.len() as u64);
            let (lba, n) = probe;
            prop_assert_eq!(l.first_in(lba, n), set.range(lba..lba + n).next().copied());
            let r = l.records();
            for w in r.windows(2) {
                prop_assert!(w[0][0] + w[0][1] < w[1][0], "{:?}", r);
            }
            prop_assert!(r.iter().all(|x| x[1] > 0));
        }
    }
}
