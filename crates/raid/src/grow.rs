//! Growing a pool online into room its members have beyond what it uses (members
//! that were extended, replaced one by one by larger ones, or a pool created with
//! `member_bytes` smaller than its members).
//!
//! The grid only gains rows: stripe `s` stays where it is on every member (the
//! data area starts at the same offset, nothing sits past it at the members' end),
//! so nothing below the old size moves and I/O to it goes on throughout. A grow:
//!
//! 1. refuses shrinking, a RAID 10 far pool (its second copies start half way
//!    through every member's data area: more rows would move them), and a pool
//!    with a member that is not active (failed, missing or rebuilding);
//! 2. grows members (and spares) that are too small through their own
//!    `Volume::grow` (a file is extended, a block device must have grown), and
//!    refuses if one still cannot hold the new size;
//! 3. writes zeroes over the new rows of every member (bounded steps, paced like a
//!    rebuild) and flushes the members: zero data has zero P and zero Q and equal
//!    mirror copies, so the new stripes are consistent before anyone reads them;
//! 4. under the superblock lock, checks the membership did not change meanwhile,
//!    records the new stripe count and size and writes every superblock (FUA,
//!    alternate slot, as every superblock update);
//! 5. only then publishes the new block count: I/O beyond the old end is refused
//!    until the new size is durable, and sees it at once after.
//!
//! Crash safety: until a superblock says the new size the new rows are unused, so
//! a crash before step 4 leaves the old pool. A crash during step 4 leaves some
//! members saying the new size and others the old one, at the same generation;
//! assemble takes the newest superblock's (larger) size, which is consistent on
//! every member since step 3 finished before any superblock was written, and
//! rewrites the others. The blocks past a size that ends inside a stripe are
//! zeroes and never written, so that stripe stays consistent too.

use crate::background::Pacer;
use crate::pool::{Inner, MemberHandle, Pool};
use crate::status::MemberState;
use crate::util::{join_all, BoxFut};
use crate::{RaidError, RaidResult};
use block::{BlockError, BlockResult};
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Bytes of every member one zeroing step covers (the members in parallel).
const ZERO_STEP_BYTES: u64 = 8 << 20;

impl Inner {
    /// Data blocks of one stripe.
    fn row_blocks(&self) -> u64 {
        self.cb * self.layout.data_chunks() as u64
    }

    /// Member blocks a pool of `stripes` stripes needs.
    fn member_blocks_for(&self, stripes: u64) -> Option<u64> {
        stripes
            .checked_mul(self.cb)?
            .checked_mul(self.layout.areas())?
            .checked_add(self.data_offset_blocks)
    }

    /// The largest size the attached members can hold as they are now.
    pub(crate) fn max_block_count(&self) -> u64 {
        let st = self.state.lock();
        let min = st
            .slots
            .iter()
            .filter_map(|s| s.member.as_ref())
            .map(|h| h.volume.geometry().block_count)
            .min()
            .unwrap_or(0);
        let stripes = min.saturating_sub(self.data_offset_blocks) / self.cb / self.layout.areas();
        let now = self.geometry().block_count;
        if self.layout.areas() != 1 {
            return now;
        }
        stripes
            .max(self.stripes())
            .saturating_mul(self.row_blocks())
            .max(now)
    }

    /// See [`Pool::grow_to`].
    pub(crate) async fn grow_to(&self, block_count: u64) -> RaidResult<()> {
        let _one = self.grow_lock.lock().await;
        let now = self.geometry().block_count;
        if block_count < now {
            return Err(RaidError::Config(format!(
                "pool {} has {now} blocks: shrinking it to {block_count} would cut data off",
                self.name
            )));
        }
        if block_count == now {
            return Ok(());
        }
        if self.layout.areas() != 1 {
            return Err(RaidError::Config(format!(
                "pool {}: a RAID 10 far pool cannot grow (its second copies start half way \
                 through every member; more stripes would move them)",
                self.name
            )));
        }
        if self.is_failed() {
            return Err(RaidError::PoolFailed(format!(
                "pool {} has failed: it cannot grow",
                self.name
            )));
        }
        let old = self.stripes();
        let new = block_count.div_ceil(self.row_blocks()).max(old);
        let need = self
            .member_blocks_for(new)
            .filter(|n| n.checked_mul(self.bs).is_some())
            .ok_or_else(|| {
                RaidError::Config(format!("{block_count} blocks is beyond any member size"))
            })?;
        let (members, spares) = self.grow_members_snapshot()?;
        for h in members.iter().map(|(_, h)| h).chain(spares.iter()) {
            ensure_room(h, need).await?;
        }
        if new > old {
            tracing::info!(pool = %self.name, from_stripes = old, to_stripes = new, "growing: zeroing the new stripes");
            self.zero_rows(&members, old, new).await?;
        }
        let _sb = self.sb_lock.lock().await;
        {
            let st = self.state.lock();
            for (i, h) in &members {
                let sl = &st.slots[*i];
                if sl.state != MemberState::Active
                    || !sl.member.as_ref().is_some_and(|m| Arc::ptr_eq(m, h))
                {
                    return Err(RaidError::Position {
                        position: *i,
                        reason: format!(
                            "member {} changed while pool {} was growing; it keeps {now} blocks",
                            h.name, self.name
                        ),
                    });
                }
            }
            // a spare added meanwhile must hold the new size too
            if let Some(sp) = st
                .spares
                .iter()
                .find(|sp| sp.volume.geometry().block_count < need)
            {
                return Err(RaidError::Config(format!(
                    "spare {} was added while pool {} was growing and cannot hold the new \
                     size; the pool keeps {now} blocks",
                    sp.name, self.name
                )));
            }
            // under the state lock: `replace_member` and `add_spare` check a
            // newcomer's size under it too, so none slips in at the old size
            self.stripes.store(new, Ordering::SeqCst);
            self.sb_blocks.store(block_count, Ordering::SeqCst);
        }
        self.persist_locked()
            .await
            .map_err(|e| RaidError::PoolFailed(format!("writing the grown size: {e}")))?;
        self.block_count.store(block_count, Ordering::SeqCst);
        tracing::info!(pool = %self.name, from = now, to = block_count, "pool grown");
        Ok(())
    }

    /// The attached members (every position must be active) and the spares.
    #[allow(clippy::type_complexity)]
    fn grow_members_snapshot(
        &self,
    ) -> RaidResult<(Vec<(usize, Arc<MemberHandle>)>, Vec<Arc<MemberHandle>>)> {
        let st = self.state.lock();
        let mut members = Vec::with_capacity(st.slots.len());
        for (i, sl) in st.slots.iter().enumerate() {
            match (&sl.member, sl.state) {
                (Some(h), MemberState::Active) => members.push((i, h.clone())),
                (_, state) => {
                    return Err(RaidError::Position {
                        position: i,
                        reason: format!(
                            "is {state:?}: pool {} grows only with every member active \
                             (replace the member and let the rebuild finish first)",
                            self.name
                        ),
                    })
                }
            }
        }
        Ok((members, st.spares.clone()))
    }

    /// Writes zeroes over stripes `old..new` of every member and flushes them.
    async fn zero_rows(
        &self,
        members: &[(usize, Arc<MemberHandle>)],
        old: u64,
        new: u64,
    ) -> RaidResult<()> {
        let step = (ZERO_STEP_BYTES / self.bs).max(self.cb);
        let end = self.data_offset_blocks + new * self.cb;
        let mut at = self.data_offset_blocks + old * self.cb;
        let mut pacer = Pacer::new();
        let mut done = 0u64;
        while at < end {
            let n = step.min(end - at);
            let futs: Vec<BoxFut<'_, BlockResult<()>>> = members
                .iter()
                .map(|(_, h)| -> BoxFut<'_, BlockResult<()>> {
                    Box::pin(async move {
                        let thin = h.volume.geometry().thin;
                        h.writes.fetch_add(1, Ordering::Relaxed);
                        h.volume.write_zeroes(at, n, thin).await
                    })
                })
                .collect();
            for ((_, h), r) in members.iter().zip(join_all(futs).await) {
                r.map_err(|e| zero_error(h, e))?;
            }
            at += n;
            done += n * self.bs * members.len() as u64;
            self.throttle(&mut pacer, done).await;
        }
        let futs: Vec<BoxFut<'_, BlockResult<()>>> = members
            .iter()
            .map(|(_, h)| -> BoxFut<'_, BlockResult<()>> { Box::pin(h.volume.flush()) })
            .collect();
        for ((_, h), r) in members.iter().zip(join_all(futs).await) {
            r.map_err(|e| zero_error(h, e))?;
        }
        Ok(())
    }
}

fn zero_error(h: &MemberHandle, e: BlockError) -> RaidError {
    h.errors.fetch_add(1, Ordering::Relaxed);
    RaidError::Member {
        member: h.name.clone(),
        source: BlockError::Unavailable(format!(
            "zeroing the new stripes failed ({e}); the pool keeps its size"
        )),
    }
}

/// Grows `h` to `need` blocks if it has fewer (its own `Volume::grow`).
async fn ensure_room(h: &MemberHandle, need: u64) -> RaidResult<()> {
    let have = h.volume.geometry().block_count;
    if have >= need {
        return Ok(());
    }
    let too_small = |why: String| {
        RaidError::Config(format!(
            "member {} holds {have} blocks, the grown pool needs {need} on every member \
             and spare: {why}",
            h.name
        ))
    };
    h.volume
        .grow(need)
        .await
        .map_err(|e| too_small(format!("growing it failed: {e}")))?;
    let got = h.volume.geometry().block_count;
    if got < need {
        return Err(too_small(format!("it grew to {got} blocks only")));
    }
    Ok(())
}

impl Pool {
    /// Grows the pool to `block_count` blocks while it serves (what
    /// `Volume::grow` does; this returns the reason of a refusal in full).
    ///
    /// Members and spares with fewer blocks than the new size needs are grown
    /// through their own `Volume::grow` first (a file-backed member is extended; a
    /// block device must have grown already). The new stripes are zeroed on every
    /// member, then the new size is written to every superblock and becomes
    /// visible at once; a crash at any point reassembles the pool at the old or the
    /// new size, consistent either way. `block_count` need not be a whole number of
    /// stripes. Refused: shrinking, RAID 10 far, a pool with a member that is not
    /// active, a member that cannot hold the new size.
    pub async fn grow_to(&self, block_count: u64) -> RaidResult<()> {
        self.inner.grow_to(block_count).await
    }

    /// The largest size (blocks) the pool can grow to without growing its
    /// members: whole stripes in the room of the smallest member now (the current
    /// size when there is none, or for RAID 10 far).
    pub fn max_block_count(&self) -> u64 {
        self.inner.max_block_count()
    }

    /// Grows the pool into all the room its members have now (after they were
    /// grown or replaced by larger ones); returns the new size in blocks.
    pub async fn grow_to_members(&self) -> RaidResult<u64> {
        let target = self.inner.max_block_count();
        self.inner.grow_to(target).await?;
        Ok(target)
    }

    /// Bytes every member (and spare) must hold for the pool to have
    /// `block_count` blocks; `None` when no member size could.
    pub fn member_bytes_for(&self, block_count: u64) -> Option<u64> {
        let stripes = block_count.div_ceil(self.inner.row_blocks());
        self.inner
            .member_blocks_for(stripes)?
            .checked_mul(self.inner.bs)
    }
}

/// The `Volume::grow` error for a refused or failed grow.
pub(crate) fn grow_error(e: RaidError) -> BlockError {
    match e {
        RaidError::Config(m) => {
            BlockError::Io(std::io::Error::new(std::io::ErrorKind::InvalidInput, m))
        }
        RaidError::Member { member, source } => {
            BlockError::Unavailable(format!("member {member}: {source}"))
        }
        e => BlockError::Unavailable(e.to_string()),
    }
}
