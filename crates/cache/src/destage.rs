//! Destaging: writes dirty blocks back to the backing volume, in address order,
//! coalesced, paced by watermarks.
//!
//! - Below the low watermark of dirty frames, a batch runs only while the volume is
//!   idle (no request for 100 ms).
//! - Between the watermarks, batches run while foreground I/O is in flight too, but
//!   each is followed by a rest as long as it took (foreground keeps about half of
//!   the backing volume's time).
//! - Above the high watermark, when the mirror is degraded, while draining for a
//!   detach, or when the mode no longer writes back, batches run back to back.
//!
//! A batch takes the dirty frames with the lowest block numbers from a cursor on
//! (an elevator sweep over the volume), up to `destage_batch_bytes`. They come
//! from a [`Sweep`]: one scan of the frames finds the next batches' worth (4,
//! going round the end of the volume to its start), in chunks of frames with
//! the state lock taken per chunk, so no batch holds the lock for a scan of
//! every frame (8 M of them in a 1 TiB cache of 128 KiB
//! blocks; every batch used to scan and sort them all under the lock). Runs of
//! consecutive wholly valid blocks go out as one write each (up to 1 MiB), so a
//! striped pool below sees long writes; a block only partly valid writes its dirty
//! sector runs. The blocks are locked against writers (readers go on) only while
//! their data is read from the frames; while it goes to the backing volume they
//! take writes again, and the sectors written meanwhile stay dirty. Whatever else
//! writes the backing copy of those blocks (write-through, discard) waits for the
//! batch. The backing volume is flushed, and only then are the frames marked clean,
//! their records made durable and their pins released.

use crate::bits::{range_mask, runs};
use crate::config::CacheMode;
use crate::ssd::{RECORDS_PER_PAGE, SECTOR_BYTES};
use crate::stats::Counters;
use crate::volume::Inner;
use block::{join_all, BlockError, BlockResult, BoxFut, Bytes, BytesMut};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

const IDLE_AFTER: Duration = Duration::from_millis(100);
/// The same destage failure is logged again after this long.
const LOG_AGAIN_AFTER: Duration = Duration::from_secs(60);
const RUN_MAX_BYTES: u64 = 1 << 20;

/// Samples the counters once a second for the "recent" figures.
pub(crate) async fn tick(inner: Arc<Inner>) {
    let mut iv = tokio::time::interval(Duration::from_secs(1));
    loop {
        iv.tick().await;
        let s = inner.counters.snapshot();
        inner.window.lock().push(Instant::now(), s);
    }
}

/// The destage loop of one cache (runs until the cache stops).
pub(crate) async fn run(inner: Arc<Inner>) {
    let mut sweep = Sweep::default();
    // the last failure logged, and when: the same one is logged again once a
    // minute (a block no device can read fails every pass over it). Tokio's
    // clock, so a test can move it on.
    let mut logged: Option<(String, tokio::time::Instant)> = None;
    let mut frameless = inner.counters.frameless_writes.load(Ordering::Relaxed);
    loop {
        if inner.stopping.load(Ordering::Acquire) {
            return;
        }
        let (dirty, share) = {
            let st = inner.state.lock();
            (
                st.dirty_frames,
                st.dirty_frames as f64 / inner.frames.max(1) as f64,
            )
        };
        if dirty == 0 {
            *inner.destage_failure.lock() = None;
            inner.destage_progress.notify_waiters();
            wait(&inner, Duration::from_secs(1)).await;
            continue;
        }
        let urgent = inner.degraded.load(Ordering::Acquire)
            || inner.drain.load(Ordering::Acquire)
            || inner.mode() != CacheMode::WriteBack
            || share * 100.0 >= inner.cfg.dirty_high_percent as f64;
        let above_low = share * 100.0 > inner.cfg.dirty_low_percent as f64;
        let idle = inner.fg_inflight.load(Ordering::Acquire) == 0
            && inner.fg_last.lock().elapsed() >= IDLE_AFTER;
        if !(urgent || above_low || idle) {
            wait(&inner, IDLE_AFTER).await;
            continue;
        }
        let batch = sweep.next_batch(&inner).await;
        // Whole stripes cost the backing volume less but read more from the
        // SSDs (every clean block of the stripe): worth it while the destage is
        // what limits the cache, i.e. writes found no free frame since the last
        // batch. With every block cached, the SSDs' bandwidth is what the
        // foreground needs (measured: 25% fewer writes with whole stripes).
        let now = inner.counters.frameless_writes.load(Ordering::Relaxed);
        let short = now != frameless;
        frameless = now;
        let t0 = Instant::now();
        let r = destage_batch(&inner, &batch, short).await;
        // A batch that could only leave out data no device can read made no
        // progress: a drain is told why (and gives up after a few); one
        // that wrote the rest did, and is no failure.
        let stuck = match &r {
            Ok(b) if b.left_out > 0 && !b.wrote => Some(format!(
                "{} dirty block(s) hold data no cache device can read (medium errors); \
                 they stay dirty, and reads of them fail, until the host writes them \
                 again",
                b.left_out
            )),
            _ => None,
        };
        let why = match &r {
            Err(e) => Some(e.to_string()),
            Ok(_) => stuck.clone(),
        };
        *inner.destage_failure.lock() = why.clone();
        inner.destage_progress.notify_waiters();
        if let Some(why) = why {
            let again = logged
                .as_ref()
                .is_some_and(|(w, at)| *w == why && at.elapsed() < LOG_AGAIN_AFTER);
            if !again {
                tracing::warn!(cache = %inner.name, "destage failed, dirty data stays in the cache: {why}");
                logged = Some((why, tokio::time::Instant::now()));
            }
            if r.is_err() {
                Counters::add(&inner.counters.destage_errors, 1);
                tokio::time::sleep(Duration::from_secs(1)).await;
            } else {
                // woken early by a drain, which counts these passes
                wait(&inner, Duration::from_secs(1)).await;
            }
            continue;
        }
        if !urgent && inner.fg_inflight.load(Ordering::Acquire) > 0 {
            tokio::time::sleep(t0.elapsed()).await;
        }
    }
}

async fn wait(inner: &Inner, d: Duration) {
    let _ = tokio::time::timeout(d, inner.destage_wake.notified()).await;
}

/// Batches a scan of the frames finds ahead of the cursor. Few: blocks dirtied
/// after a scan join the batches only at the next one, and batches that miss
/// them write fewer whole stripes (`bench/cache-vendor --patterns write
/// --caches none,half`: 64 gave 939 and 761 IOPS where the per-batch scan gave
/// 943-1062; 4 gave 1019 and 983).
const SWEEP_BATCHES: usize = 4;
/// Frames scanned per hold of the state lock.
const SCAN_CHUNK: u32 = 1 << 16;

/// The destage's elevator: the dirty frames ahead of `cursor` (block numbers
/// at or above it) found by the last scan, in block order. A frame cleaned,
/// rewritten or reused after the scan is skipped by the batch (which checks
/// each under the lock); one dirtied behind the cursor, or beyond what the
/// scan kept, is found by a later scan.
#[derive(Default)]
pub(crate) struct Sweep {
    pending: std::collections::VecDeque<(u64, u32)>,
    cursor: u64,
}

impl Sweep {
    /// The next batch: up to `destage_batch_bytes` of dirty frames, the lowest
    /// block numbers from the cursor on, then from the start of the volume
    /// (one scan finds both), sorted by block number.
    pub(crate) async fn next_batch(&mut self, inner: &Inner) -> Vec<(u64, u32)> {
        let max = (inner.cfg.destage_batch_bytes / inner.block_bytes).max(1) as usize;
        if self.pending.is_empty() {
            self.scan(inner, max.saturating_mul(SWEEP_BATCHES)).await;
        }
        let n = max.min(self.pending.len());
        let mut batch: Vec<(u64, u32)> = self.pending.drain(..n).collect();
        if let Some(&(key, _)) = batch.last() {
            self.cursor = key + 1;
        }
        batch.sort_unstable();
        batch
    }

    /// Keeps the `keep` dirty frames nearest ahead of the cursor, going round
    /// the end of the volume to its start, in that order. The lock is taken
    /// per chunk of frames, handed over fairly to whoever waits for it, and
    /// the task yields between chunks.
    async fn scan(&mut self, inner: &Inner, keep: usize) {
        let dirty = inner.state.lock().dirty_frames;
        // a max-heap of the nearest `keep` found so far: (distance from the
        // cursor, going round, block number, frame)
        let mut found: std::collections::BinaryHeap<(u64, u64, u32)> =
            std::collections::BinaryHeap::with_capacity(keep.min(dirty).saturating_add(1));
        let mut from = 0u32;
        while from < inner.frames {
            let to = from.saturating_add(SCAN_CHUNK).min(inner.frames);
            {
                let st = inner.state.lock();
                for slot in from..to {
                    if st.dirty.get(slot) == 0 {
                        continue;
                    }
                    let Some(key) = st.policy.key_of(slot) else {
                        continue;
                    };
                    let d = key.wrapping_sub(self.cursor);
                    if found.len() < keep {
                        found.push((d, key, slot));
                    } else if found.peek().is_some_and(|&(top, _, _)| d < top) {
                        found.pop();
                        found.push((d, key, slot));
                    }
                }
                parking_lot::MutexGuard::unlock_fair(st);
            }
            from = to;
            if from < inner.frames {
                tokio::task::yield_now().await;
            }
        }
        self.pending = found
            .into_sorted_vec()
            .into_iter()
            .map(|(_, key, slot)| (key, slot))
            .collect();
    }
}

/// One backing write of `len` bytes at `off`: pieces of frames `(slot, offset in
/// the frame, length, offset in the write)`. Where they leave gaps (a whole
/// stripe, see [`whole_stripes`]) the backing volume's own data fills them.
struct Op {
    off: u64,
    len: u64,
    parts: Vec<(u32, u64, u64, u64)>,
    slots: Vec<u32>,
}

/// A stripe with at least this many backing writes in a batch goes out as one
/// write of the whole stripe (its gaps read from the backing volume first), while
/// writes find no free frame.
const STRIPE_MIN_WRITES: usize = 2;
/// Largest stripe written whole.
const STRIPE_MAX_BYTES: u64 = 16 << 20;

/// Cache blocks per stripe of the backing volume (its optimal I/O size), when a
/// stripe holds more than one and a whole number of them.
fn stripe_blocks(inner: &Inner) -> Option<u64> {
    let g = inner.backing.geometry();
    let bs = g.block_size_bytes as u64;
    let sb = g.optimal_io_blocks as u64 * bs;
    let bb = inner.block_bytes;
    (sb > bb
        && sb.is_multiple_of(bb)
        && sb <= STRIPE_MAX_BYTES
        && sb <= g.max_io_blocks as u64 * bs)
        .then_some(sb / bb)
}

/// Backing writes a frame needs on its own: one for a wholly valid block, one
/// per dirty sector run for the rest.
fn writes_of(inner: &Inner, key: u64, valid: u64, dirty: u64) -> usize {
    let full = range_mask(0, block_len(inner, key).div_ceil(SECTOR_BYTES) as u32);
    if valid & full == full {
        1
    } else {
        // runs start where a dirty sector follows a clean one
        (dirty & !(dirty << 1)).count_ones() as usize
    }
}

/// The stripes of the backing volume (numbered in units of `per` cache blocks)
/// where the batch's frames would need [`STRIPE_MIN_WRITES`] or more writes: on
/// a parity RAID each is a read-modify-write and a journal record, so one write
/// of the whole stripe (reading what the cache does not hold) costs the backing
/// volume less time.
fn whole_stripes(inner: &Inner, batch: &[(u64, u32)], per: u64) -> Vec<u64> {
    let st = inner.state.lock();
    let mut writes: std::collections::BTreeMap<u64, usize> = Default::default();
    for &(key, slot) in batch {
        if st.policy.key_of(slot) == Some(key) {
            let n = writes_of(inner, key, st.valid.get(slot), st.dirty.get(slot));
            *writes.entry(key / per).or_default() += n;
        }
    }
    writes
        .into_iter()
        .filter(|&(_, n)| n >= STRIPE_MIN_WRITES)
        .map(|(s, _)| s)
        .collect()
}

/// What a batch that did not fail did.
#[derive(Default)]
struct Batch {
    /// Frames whose dirty sectors no device could read, left out.
    left_out: usize,
    /// Whether it wrote anything to the backing volume.
    wrote: bool,
}

async fn destage_batch(inner: &Inner, batch: &[(u64, u32)], stripes: bool) -> BlockResult<Batch> {
    if batch.is_empty() {
        return Ok(Batch::default());
    }
    let per = stripe_blocks(inner).filter(|_| stripes);
    let whole = per.map_or(Vec::new(), |per| whole_stripes(inner, batch, per));
    let last = inner.geo().size_bytes().div_ceil(inner.block_bytes);
    let stripe_keys = |s: u64, per: u64| s * per..((s + 1) * per).min(last);
    let mut keys: Vec<u64> = batch.iter().map(|e| e.0).collect();
    if let Some(per) = per {
        // every block of a stripe written whole: its gaps come from the backing
        // volume, so no writer may change them until the stripe is written
        for &s in &whole {
            keys.extend(stripe_keys(s, per));
        }
        keys.sort_unstable();
        keys.dedup();
    }
    let locks = inner.lock_shared(&keys).await;
    // snapshot what is dirty now, and its data, with writers locked out;
    // dirty sectors no device could read are left out (and stay dirty)
    let mut unreadable = 0;
    let snap: Vec<(u64, u32, u64, u64)> = {
        let mut st = inner.state.lock();
        batch
            .iter()
            .filter_map(|&(key, slot)| {
                if st.policy.key_of(slot) != Some(key) || st.dirty.get(slot) == 0 {
                    return None;
                }
                // (and lost ones: the frame holds nothing of them)
                let bad = st.unreadable_now(slot) | st.lost(slot);
                unreadable += usize::from(bad != 0);
                let dirty = st.dirty.get(slot) & !bad;
                if dirty == 0 {
                    return None;
                }
                st.pin_io(slot);
                st.destaging.insert(slot, 0);
                Some((key, slot, st.valid.get(slot) & !bad, dirty))
            })
            .collect()
    };
    // the clean blocks the cache holds in stripes written whole are read from
    // their frames rather than the backing volume (pinned while they are read)
    let mut clean: Vec<(u64, u32, u64, u64)> = Vec::new();
    if let Some(per) = per {
        let mut st = inner.state.lock();
        for &s in &whole {
            for key in stripe_keys(s, per) {
                let Some(slot) = st.policy.get(key) else {
                    continue;
                };
                if st.dirty.get(slot) != 0 || st.valid.get(slot) == 0 || inner.frame_lost(slot) {
                    continue;
                }
                st.pin_io(slot);
                clean.push((key, slot, st.valid.get(slot), 0));
            }
        }
    }
    let mut items = [snap.as_slice(), clean.as_slice()].concat();
    items.sort_unstable();
    let ops = plan(inner, &items, per.map(|per| (per, whole.as_slice())));
    Counters::add(&inner.counters.stripe_destages, whole.len() as u64);
    let reads: Vec<BoxFut<'_, BlockResult<Bytes>>> = ops
        .iter()
        .map(|op| Box::pin(read_op(inner, op)) as BoxFut<'_, _>)
        .collect();
    let data = join_all(reads).await;
    if !clean.is_empty() {
        let mut st = inner.state.lock();
        for &(_, slot, _, _) in &clean {
            st.unpin_io(slot);
        }
    }
    // Writers may go on once the data is in memory: a block written again while
    // its old copy goes to the backing volume keeps the sectors written again
    // dirty. Anything else that writes the backing copy waits for the batch.
    let _out = inner.lock_backing_shared(&keys).await;
    drop(locks);
    let futs: Vec<BoxFut<'_, (Vec<u32>, BlockResult<u64>)>> = ops
        .iter()
        .zip(data)
        .map(|(op, d)| Box::pin(write_op(inner, op, d)) as BoxFut<'_, _>)
        .collect();
    let results = join_all(futs).await;
    let mut failed = std::collections::HashSet::new();
    let mut bytes = 0;
    let mut first_err = None;
    for (slots, r) in results {
        match r {
            Ok(n) => bytes += n,
            Err(e) => {
                failed.extend(slots);
                first_err.get_or_insert(e);
            }
        }
    }
    // (a batch that only left data out has nothing to make durable)
    let flushed = match ops.is_empty() {
        true => Ok(()),
        false => inner.backing.flush().await,
    };
    let mut pages = Vec::new();
    let mut cleaned = Vec::new();
    {
        let mut st = inner.state.lock();
        for &(_, slot, _, dirty) in &snap {
            let again = st.destaging.remove(&slot).unwrap_or(0);
            if flushed.is_ok() && !failed.contains(&slot) {
                let clean = dirty & !again;
                let d = st.dirty.get(slot) & !clean;
                st.set_dirty(slot, d);
                cleaned.push((slot, clean));
                pages.push(slot / RECORDS_PER_PAGE as u32);
            }
        }
    }
    pages.sort_unstable();
    pages.dedup();
    // records say "clean" durably before the frames may be reused
    let persisted = inner.persist_pages(&pages).await;
    {
        let mut st = inner.state.lock();
        if persisted.is_err() {
            // the SSDs still say dirty: so does memory again (the backing
            // copy is durable, so a later destage only writes it again),
            // or a host write to the block, taken for clean, would go around
            // the cache and the old record come back at the next start
            for &(slot, clean) in &cleaned {
                let d = st.dirty.get(slot) | clean;
                st.set_dirty(slot, d);
            }
        }
        for &(_, slot, _, _) in &snap {
            st.unpin_io(slot);
        }
    }
    Counters::add(&inner.counters.destaged_bytes, bytes);
    flushed?;
    persisted?;
    match first_err {
        Some(e) => Err(e),
        // the rest went out; those left out stay dirty
        None => Ok(Batch {
            left_out: unreadable,
            wrote: bytes > 0,
        }),
    }
}

/// Coalesces the snapshot into backing writes; with `stripes` = (cache blocks
/// per stripe, stripes written whole), the frames of those stripes go out as
/// one write each.
fn plan(inner: &Inner, snap: &[(u64, u32, u64, u64)], stripes: Option<(u64, &[u64])>) -> Vec<Op> {
    let bb = inner.block_bytes;
    let mut ops: Vec<Op> = Vec::new();
    let mut run: Option<(u64, Op)> = None; // (next key expected, op)
    let mut whole: Option<(u64, Op)> = None; // (stripe, op)
    for &(key, slot, valid, dirty) in snap {
        let blen = block_len(inner, key);
        if let Some((per, list)) = stripes {
            let stripe = key / per;
            if list.binary_search(&stripe).is_ok() {
                if let Some((_, op)) = run.take() {
                    ops.push(op);
                }
                if whole.as_ref().is_some_and(|(s, _)| *s != stripe) {
                    ops.push(whole.take().unwrap().1);
                }
                let (_, op) = whole.get_or_insert_with(|| {
                    let off = stripe * per * bb;
                    let len = (per * bb).min(inner.geo().size_bytes() - off);
                    (
                        stripe,
                        Op {
                            off,
                            len,
                            parts: Vec::new(),
                            slots: Vec::new(),
                        },
                    )
                });
                // every valid sector of the frame: the dirty ones are newer than
                // the backing copy, the clean ones equal to it
                let m = valid & range_mask(0, blen.div_ceil(SECTOR_BYTES) as u32);
                for (first, n) in runs(m) {
                    let start = first as u64 * SECTOR_BYTES;
                    let end = ((first + n) as u64 * SECTOR_BYTES).min(blen);
                    op.parts
                        .push((slot, start, end - start, key * bb + start - op.off));
                }
                op.slots.push(slot);
                continue;
            }
        }
        if let Some((_, op)) = whole.take() {
            ops.push(op);
        }
        let full = range_mask(0, blen.div_ceil(SECTOR_BYTES) as u32);
        if valid & full == full {
            match &mut run {
                Some((next, op)) if *next == key && (key + 1) * bb - op.off <= RUN_MAX_BYTES => {
                    op.parts.push((slot, 0, blen, op.len));
                    op.len += blen;
                    op.slots.push(slot);
                    *next = key + 1;
                }
                _ => {
                    if let Some((_, op)) = run.take() {
                        ops.push(op);
                    }
                    run = Some((
                        key + 1,
                        Op {
                            off: key * bb,
                            len: blen,
                            parts: vec![(slot, 0, blen, 0)],
                            slots: vec![slot],
                        },
                    ));
                }
            }
            continue;
        }
        if let Some((_, op)) = run.take() {
            ops.push(op);
        }
        // dirty sector runs of a partly valid block
        for (first, len_sectors) in runs(dirty) {
            let start = first as u64 * SECTOR_BYTES;
            let end = ((first + len_sectors) as u64 * SECTOR_BYTES).min(blen);
            ops.push(Op {
                off: key * bb + start,
                len: end - start,
                parts: vec![(slot, start, end - start, 0)],
                slots: vec![slot],
            });
        }
    }
    if let Some((_, op)) = run.take() {
        ops.push(op);
    }
    if let Some((_, op)) = whole.take() {
        ops.push(op);
    }
    ops
}

fn block_len(inner: &Inner, key: u64) -> u64 {
    (inner.geo().size_bytes() - key * inner.block_bytes).min(inner.block_bytes)
}

/// The data of one backing write: read from the frames, over the backing
/// volume's own data where the frames leave gaps.
async fn read_op(inner: &Inner, op: &Op) -> BlockResult<Bytes> {
    let reads: Vec<BoxFut<'_, BlockResult<Bytes>>> = op
        .parts
        .iter()
        .map(|&(slot, off, len, _)| Box::pin(inner.ssd_read(slot, off, len)) as BoxFut<'_, _>)
        .collect();
    let covered: u64 = op.parts.iter().map(|p| p.2).sum();
    let (parts, under) = if covered < op.len {
        let under = inner
            .backing
            .read(op.off / inner.bs, (op.len / inner.bs) as u32);
        let (parts, under) = tokio::join!(join_all(reads), under);
        (parts, Some(under?))
    } else {
        (join_all(reads).await, None)
    };
    let mut buf = match under {
        Some(b) => BytesMut::from(&b[..]),
        None => BytesMut::zeroed(op.len as usize),
    };
    // Every frame with unreadable sectors forgets its clean ones (the
    // backing's), so the next pass reads only the dirty ones (and writes a
    // stripe's gaps from the backing): otherwise one unreadable clean sector
    // failed this write, and every later one, for good (review of
    // 2026-12-06). All of them at once, not one a pass. Dirty sectors no
    // copy can read are recorded, and the next passes leave them out, so
    // the rest of the run goes out and they are not read again until the
    // host writes them (`Inner::unreadable_found`).
    for (p, &(slot, off, len, _)) in parts.iter().zip(op.parts.iter()) {
        if let Err(BlockError::Medium { .. }) = p {
            inner.unreadable_found(slot, off, len).await;
        }
    }
    for (p, &(_, _, len, at)) in parts.into_iter().zip(op.parts.iter()) {
        buf[at as usize..(at + len) as usize].copy_from_slice(&p?);
    }
    Ok(buf.freeze())
}

async fn write_op(
    inner: &Inner,
    op: &Op,
    data: BlockResult<Bytes>,
) -> (Vec<u32>, BlockResult<u64>) {
    let data = match data {
        Ok(d) => d,
        Err(e) => return (op.slots.clone(), Err(e)),
    };
    let total = data.len() as u64;
    let r = inner.backing.write(op.off / inner.bs, data, false).await;
    match r {
        Ok(()) => (op.slots.clone(), Ok(total)),
        Err(e) => {
            Counters::add(&inner.counters.backing_errors, 1);
            (op.slots.clone(), Err(e))
        }
    }
}
