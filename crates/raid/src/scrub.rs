//! Scrub: read every stripe, check mirrors and parity, repair what redundancy can
//! decide.
//!
//! Policy:
//! - mirrors: the primary copy (first position of the chunk) is authoritative; a
//!   copy that differs is rewritten from it (without checksums, a mirror cannot tell
//!   which copy is right; the primary is the one reads prefer while resyncing).
//! - RAID 5 / F1: data is authoritative; a parity block that disagrees is rewritten.
//! - RAID 6: per block, the P and Q syndromes locate a single bad member: only P
//!   bad -> rewrite P; only Q bad -> rewrite Q; both bad and consistent with data
//!   column z -> correct column z; anything else is counted unrepairable and left.
//! - a block that cannot be read (medium error) is rebuilt from redundancy and
//!   rewritten; rows where unreadable blocks exceed the redundancy are given
//!   up as a rebuild gives them up (`lost.rs`: the blocks recorded lost,
//!   stand-ins that keep the row's parity right), counted as read errors
//!   that could not be repaired.
//!
//! Stripes with a missing or rebuilding member, and stripes the initial resync has
//! not reached, are skipped (counted).

use crate::background::{progress, Pacer};
use crate::gf::{self, Syndrome};
use crate::layout::Scheme;
use crate::pool::{Inner, Pool, View};
use crate::status::ScrubReport;
use crate::util::{join_all, BoxFut};
use crate::{RaidError, RaidResult};
use block::{BlockError, BlockResult, Bytes};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

impl Pool {
    /// Starts a scrub in the background; progress shows in `status().scrub`, the
    /// report in `status().last_scrub` and in the task's result.
    pub fn scrub(&self) -> tokio::task::JoinHandle<RaidResult<ScrubReport>> {
        let inner = self.inner.clone();
        tokio::spawn(async move { inner.scrub_run().await })
    }
}

impl Inner {
    async fn scrub_run(self: Arc<Self>) -> RaidResult<ScrubReport> {
        if self.scrub_running.swap(true, Ordering::SeqCst) {
            return Err(RaidError::Config("a scrub is already running".into()));
        }
        let r = self.scrub_all().await;
        self.scrub_running.store(false, Ordering::SeqCst);
        let mut st = self.state.lock();
        st.scrub = None;
        if let Ok(rep) = &r {
            st.last_scrub = Some(rep.clone());
        }
        r
    }

    async fn scrub_all(&self) -> RaidResult<ScrubReport> {
        let n = self.layout.positions();
        let mut rep = ScrubReport {
            bad_blocks_by_position: vec![0; self.layout.member_count()],
            ..Default::default()
        };
        let stripe_bytes = self.cb * self.bs * n as u64;
        let total = self.stripes() * stripe_bytes;
        let started = Instant::now();
        let mut pacer = Pacer::new();
        let mut done = 0u64;
        for s in 0..self.stripes() {
            if self.closed.load(Ordering::SeqCst) {
                break;
            }
            self.throttle(&mut pacer, done).await;
            let mut undecided = false;
            {
                let _g = self.lock_for(s).write().await;
                let view = self
                    .view()
                    .map_err(|e| RaidError::PoolFailed(e.to_string()))?;
                if self.is_uninit(s) || (0..n).any(|p| view.readable(p, s).is_none()) {
                    rep.stripes_skipped += 1;
                } else {
                    match self.scrub_stripe(s, &view, &mut rep).await {
                        Ok(()) => rep.stripes_checked += 1,
                        // unreadable sectors the redundancy cannot rebuild
                        Err(BlockError::Medium { .. }) => undecided = true,
                        Err(e) => {
                            tracing::warn!(pool = %self.name, stripe = s, error = %e, "scrub skipped stripe");
                            rep.stripes_skipped += 1;
                        }
                    }
                }
            }
            if undecided {
                // given up as a rebuild gives them up (outside the stripe's
                // lock: see `give_up_rows`), so that the row's parity is right
                // again and the next member loss rebuilds its other blocks
                // (not if a member went meanwhile: the scrub skips stripes
                // without one, a rebuild will decide)
                let whole = self
                    .view()
                    .is_ok_and(|v| (0..n).all(|p| v.readable(p, s).is_some()));
                let given = if whole {
                    self.give_up_rows(&[s]).await
                } else {
                    None
                };
                if let Some(given) = given {
                    rep.stripes_checked += 1;
                    rep.read_errors += given.repaired + given.given_up;
                    rep.repaired += given.repaired;
                    rep.unrepairable += given.lost;
                    for (a, b) in rep.bad_blocks_by_position.iter_mut().zip(given.by_member) {
                        *a += b;
                    }
                } else {
                    rep.stripes_skipped += 1;
                }
            }
            done += stripe_bytes;
            self.state.lock().scrub = Some(progress(started, done, total));
        }
        Ok(rep)
    }

    async fn scrub_stripe(&self, s: u64, view: &View, rep: &mut ScrubReport) -> BlockResult<()> {
        if self.layout.scheme() == Scheme::Striped {
            return Ok(());
        }
        // grid positions (RAID 10 far: both halves of every member)
        let n = self.layout.positions();
        let member = |p: usize| self.layout.member_of(p);
        let futs: Vec<BoxFut<'_, BlockResult<Bytes>>> = (0..n)
            .map(|p| -> BoxFut<'_, BlockResult<Bytes>> {
                Box::pin(async move {
                    match view.readable(p, s) {
                        Some(h) => self.m_read(h, s * self.cb, self.cb).await,
                        None => Err(BlockError::Unavailable("member gone".into())),
                    }
                })
            })
            .collect();
        let results = join_all(futs).await;
        let mut cols: Vec<Vec<u8>> = Vec::with_capacity(n);
        let mut unreadable = Vec::new();
        for (p, r) in results.into_iter().enumerate() {
            match r {
                Ok(b) => cols.push(b.to_vec()),
                Err(e) => {
                    if let Some(h) = view.readable(p, s) {
                        self.member_error(p, h, &e).await;
                    }
                    if !matches!(e, BlockError::Medium { .. }) {
                        return Err(e);
                    }
                    unreadable.push(p);
                    cols.push(Vec::new());
                }
            }
        }
        if !unreadable.is_empty() {
            // rebuild the unreadable chunks from the others and rewrite them
            let mut v2 = view.clone();
            for &p in &unreadable {
                v2.slots[p] = None;
            }
            // (whole chunks: two members unreadable in different rows fail
            // here too; the caller then goes row by row, `give_up_rows`)
            let imgs = self
                .stripe_image(s, &unreadable, &v2)
                .await
                .map_err(|_| BlockError::Medium { lba: s * self.cb })?;
            for (&p, img) in unreadable.iter().zip(imgs) {
                if let Some(h) = view.writable(p) {
                    self.m_write(h, s * self.cb, Bytes::from(img), false)
                        .await?;
                }
                rep.read_errors += 1;
                rep.repaired += 1;
                rep.bad_blocks_by_position[member(p)] += 1;
            }
            return Ok(());
        }
        let bs = self.bs as usize;
        let k = self.layout.data_chunks();
        let mut dirty = vec![false; n];
        match self.layout.scheme() {
            Scheme::Striped => {}
            Scheme::Mirror => {
                for d in 0..k {
                    let copies = self.layout.data_positions(s, d);
                    let primary = copies[0];
                    for &c in &copies[1..] {
                        for b in 0..self.cb as usize {
                            let r = b * bs..(b + 1) * bs;
                            if cols[c][r.clone()] != cols[primary][r.clone()] {
                                rep.mismatches += 1;
                                rep.repaired += 1;
                                rep.bad_blocks_by_position[member(c)] += 1;
                                let good = cols[primary][r.clone()].to_vec();
                                cols[c][r].copy_from_slice(&good);
                                dirty[c] = true;
                            }
                        }
                    }
                }
            }
            Scheme::Parity { parity_count } => {
                let pp = self.layout.parity_positions(s);
                let dpos: Vec<usize> = (0..k)
                    .map(|d| self.layout.data_positions(s, d)[0])
                    .collect();
                for b in 0..self.cb as usize {
                    let r = b * bs..(b + 1) * bs;
                    let data: Vec<&[u8]> = dpos.iter().map(|&p| &cols[p][r.clone()]).collect();
                    let mut sp = vec![0u8; bs];
                    let mut sq = vec![0u8; if parity_count > 1 { bs } else { 0 }];
                    gf::compute_pq(
                        &data,
                        &mut sp,
                        (parity_count > 1).then_some(sq.as_mut_slice()),
                    );
                    gf::xor_into(&mut sp, &cols[pp[0]][r.clone()]);
                    if parity_count > 1 {
                        gf::xor_into(&mut sq, &cols[pp[1]][r.clone()]);
                    }
                    let verdict = if parity_count > 1 {
                        gf::locate(&sp, &sq, k)
                    } else if sp.iter().any(|&x| x != 0) {
                        Syndrome::BadP
                    } else {
                        Syndrome::Clean
                    };
                    let fix =
                        |col: &mut Vec<u8>, syn: &[u8]| gf::xor_into(&mut col[r.clone()], syn);
                    match verdict {
                        Syndrome::Clean => continue,
                        Syndrome::BadP => {
                            fix(&mut cols[pp[0]], &sp);
                            dirty[pp[0]] = true;
                            rep.bad_blocks_by_position[member(pp[0])] += 1;
                        }
                        Syndrome::BadQ => {
                            fix(&mut cols[pp[1]], &sq);
                            dirty[pp[1]] = true;
                            rep.bad_blocks_by_position[member(pp[1])] += 1;
                        }
                        Syndrome::BadData(z) => {
                            let p = dpos[z];
                            fix(&mut cols[p], &sp);
                            dirty[p] = true;
                            rep.bad_blocks_by_position[member(p)] += 1;
                        }
                        Syndrome::Unlocatable => {
                            rep.mismatches += 1;
                            rep.unrepairable += 1;
                            continue;
                        }
                    }
                    rep.mismatches += 1;
                    rep.repaired += 1;
                }
            }
        }
        for p in 0..n {
            if dirty[p] {
                if let Some(h) = view.writable(p) {
                    tracing::info!(pool = %self.name, position = p, stripe = s, "scrub rewrote chunk");
                    let data = Bytes::from(std::mem::take(&mut cols[p]));
                    if let Err(e) = self.m_write(h, s * self.cb, data, false).await {
                        self.fail_handle(p, &h).await;
                        return Err(e);
                    }
                }
            }
        }
        Ok(())
    }
}
