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
//! (an elevator sweep over the volume), up to `destage_batch_bytes`. Runs of
//! consecutive wholly valid blocks go out as one write each (up to 1 MiB), so a
//! striped pool below sees long writes; a block only partly valid writes its dirty
//! sector runs. The blocks are locked against writers (readers go on), the backing
//! volume is flushed, and only then are the frames marked clean, their records made
//! durable and their pins released.

use crate::bits::range_mask;
use crate::config::CacheMode;
use crate::ssd::{RECORDS_PER_PAGE, SECTOR_BYTES};
use crate::stats::Counters;
use crate::volume::Inner;
use block::{join_all, BlockResult, BoxFut, Bytes, BytesMut};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

const IDLE_AFTER: Duration = Duration::from_millis(100);
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
    let mut cursor = 0u64;
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
        let batch = collect(&inner, &mut cursor);
        let t0 = Instant::now();
        let r = destage_batch(&inner, &batch).await;
        inner.destage_progress.notify_waiters();
        if let Err(e) = r {
            Counters::add(&inner.counters.destage_errors, 1);
            tracing::warn!(cache = %inner.name, "destage failed, dirty data stays in the cache: {e}");
            tokio::time::sleep(Duration::from_secs(1)).await;
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

/// The next dirty frames from `cursor` on, sorted by block number.
fn collect(inner: &Inner, cursor: &mut u64) -> Vec<(u64, u32)> {
    let st = inner.state.lock();
    let mut all: Vec<(u64, u32)> = Vec::with_capacity(st.dirty_frames);
    for slot in 0..inner.frames {
        if st.dirty.get(slot) != 0 {
            if let Some(key) = st.policy.key_of(slot) {
                all.push((key, slot));
            }
        }
    }
    drop(st);
    all.sort_unstable();
    let max = (inner.cfg.destage_batch_bytes / inner.block_bytes).max(1) as usize;
    let start = all.partition_point(|e| e.0 < *cursor);
    let mut batch: Vec<(u64, u32)> = all[start..].iter().take(max).copied().collect();
    if batch.len() < max && start > 0 {
        let more = max - batch.len();
        batch.extend(all[..start].iter().take(more).copied());
        batch.sort_unstable();
    }
    *cursor = match all[start..].get(max) {
        Some(e) => e.0,
        None => 0,
    };
    batch
}

/// One backing write: pieces of frames laid end to end from `off`.
struct Op {
    off: u64,
    parts: Vec<(u32, u64, u64)>,
    slots: Vec<u32>,
}

async fn destage_batch(inner: &Inner, batch: &[(u64, u32)]) -> BlockResult<()> {
    if batch.is_empty() {
        return Ok(());
    }
    let keys: Vec<u64> = batch.iter().map(|e| e.0).collect();
    let _locks = inner.lock_shared(&keys).await;
    // snapshot what is dirty now (writers are locked out until we are done)
    let snap: Vec<(u64, u32, u64, u64)> = {
        let mut st = inner.state.lock();
        batch
            .iter()
            .filter_map(|&(key, slot)| {
                if st.policy.key_of(slot) != Some(key) || st.dirty.get(slot) == 0 {
                    return None;
                }
                st.pin_io(slot);
                Some((key, slot, st.valid.get(slot), st.dirty.get(slot)))
            })
            .collect()
    };
    let ops = plan(inner, &snap);
    let futs: Vec<BoxFut<'_, (Vec<u32>, BlockResult<u64>)>> = ops
        .iter()
        .map(|op| Box::pin(write_op(inner, op)) as BoxFut<'_, _>)
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
    let flushed = inner.backing.flush().await;
    let mut pages = Vec::new();
    {
        let mut st = inner.state.lock();
        for &(_, slot, _, dirty) in &snap {
            if flushed.is_ok() && !failed.contains(&slot) {
                let d = st.dirty.get(slot) & !dirty;
                st.set_dirty(slot, d);
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
        for &(_, slot, _, _) in &snap {
            st.unpin_io(slot);
        }
    }
    Counters::add(&inner.counters.destaged_bytes, bytes);
    flushed?;
    persisted?;
    match first_err {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// Coalesces the snapshot into backing writes.
fn plan(inner: &Inner, snap: &[(u64, u32, u64, u64)]) -> Vec<Op> {
    let bb = inner.block_bytes;
    let mut ops: Vec<Op> = Vec::new();
    let mut run: Option<(u64, Op)> = None; // (next key expected, op)
    for &(key, slot, valid, dirty) in snap {
        let blen = block_len(inner, key);
        let full = range_mask(0, blen.div_ceil(SECTOR_BYTES) as u32);
        if valid & full == full {
            match &mut run {
                Some((next, op)) if *next == key && (key + 1) * bb - op.off <= RUN_MAX_BYTES => {
                    op.parts.push((slot, 0, blen));
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
                            parts: vec![(slot, 0, blen)],
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
        let mut m = dirty;
        while m != 0 {
            let first = m.trailing_zeros() as u64;
            let len_sectors = (!(m >> first)).trailing_zeros() as u64;
            let start = first * SECTOR_BYTES;
            let end = ((first + len_sectors) * SECTOR_BYTES).min(blen);
            ops.push(Op {
                off: key * bb + start,
                parts: vec![(slot, start, end - start)],
                slots: vec![slot],
            });
            m &= !range_mask(first as u32, len_sectors as u32);
        }
    }
    if let Some((_, op)) = run.take() {
        ops.push(op);
    }
    ops
}

fn block_len(inner: &Inner, key: u64) -> u64 {
    (inner.geo().size_bytes() - key * inner.block_bytes).min(inner.block_bytes)
}

async fn write_op(inner: &Inner, op: &Op) -> (Vec<u32>, BlockResult<u64>) {
    let reads: Vec<BoxFut<'_, BlockResult<Bytes>>> = op
        .parts
        .iter()
        .map(|&(slot, off, len)| Box::pin(inner.ssd_read(slot, off, len)) as BoxFut<'_, _>)
        .collect();
    let parts = join_all(reads).await;
    let total: u64 = op.parts.iter().map(|p| p.2).sum();
    let mut buf = BytesMut::with_capacity(total as usize);
    for p in parts {
        match p {
            Ok(b) => buf.extend_from_slice(&b),
            Err(e) => return (op.slots.clone(), Err(e)),
        }
    }
    let r = inner
        .backing
        .write(op.off / inner.bs, buf.freeze(), false)
        .await;
    match r {
        Ok(()) => (op.slots.clone(), Ok(total)),
        Err(e) => {
            Counters::add(&inner.counters.backing_errors, 1);
            (op.slots.clone(), Err(e))
        }
    }
}
