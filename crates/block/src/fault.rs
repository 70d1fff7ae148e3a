//! A fault-injecting layer: errors, dead devices and torn writes, switched at run time.

use crate::{BlockError, BlockResult, Bytes, Extent, Geometry, Volume, VolumeRef};
use async_trait::async_trait;
use parking_lot::Mutex;
use std::ops::Range;
use std::sync::Arc;

/// What the fault layer does now. Change it through [`FaultVolume::plan`] while I/O runs.
#[derive(Debug, Clone, Default)]
pub struct FaultPlan {
    /// Every operation fails with an I/O error (the device is gone).
    pub dead: bool,
    /// Reads touching these blocks fail with a medium error.
    pub bad_read_blocks: Vec<Range<u64>>,
    /// Writes touching these blocks fail with a write fault.
    pub bad_write_blocks: Vec<Range<u64>>,
    /// The next write is torn: only its first `n` blocks reach the volume below, then
    /// it fails. Cleared after it fires.
    pub tear_next_write_after_blocks: Option<u64>,
    /// Flush fails.
    pub fail_flush: bool,
    /// Writes fail for want of space (a thin file on a full file system).
    pub full: bool,
    /// A write makes the `bad_read_blocks` it covers readable again, as a disk
    /// remaps a sector it is written.
    pub remap_on_write: bool,
    /// The device stopped answering: every operation that starts while this
    /// is set is taken and not answered (before any other fault applies)
    /// until [`FaultVolume::set_hung`] clears it (a stall that ends); cleared
    /// here directly, they are never answered.
    pub hung: bool,
    /// As `hung`, for the operations that change or flush the device only
    /// (writes, flushes, discards, zeroing); reads still answer, as on a
    /// frozen file system under a disk file.
    pub writes_hung: bool,
}

/// Forwards to the volume below unless the current [`FaultPlan`] says otherwise.
pub struct FaultVolume {
    inner: VolumeRef,
    plan: Arc<Mutex<FaultPlan>>,
    /// Woken when [`FaultVolume::set_hung`] ends a stall.
    unhung: tokio::sync::Notify,
}

fn overlaps(ranges: &[Range<u64>], lba: u64, blocks: u64) -> Option<u64> {
    let end = lba + blocks;
    ranges
        .iter()
        .filter(|r| r.start < end && lba < r.end)
        .map(|r| r.start.max(lba))
        .min()
}

fn dead_error() -> BlockError {
    BlockError::Io(std::io::Error::other("injected fault: device is dead"))
}

impl FaultVolume {
    /// Wraps `inner` with an empty plan (no faults).
    pub fn new(inner: VolumeRef) -> Self {
        FaultVolume {
            inner,
            plan: Arc::new(Mutex::new(FaultPlan::default())),
            unhung: tokio::sync::Notify::new(),
        }
    }

    /// The shared plan; lock it to inject or clear faults.
    pub fn plan(&self) -> Arc<Mutex<FaultPlan>> {
        self.plan.clone()
    }

    /// Makes the device stop answering (`true`), or answer again (`false`:
    /// the operations taken meanwhile go on).
    pub fn set_hung(&self, hung: bool) {
        self.plan.lock().hung = hung;
        if !hung {
            self.unhung.notify_waiters();
        }
    }

    /// Makes the device stop answering writes, flushes, discards and
    /// zeroing (`true`), reads still answered, or answer them again
    /// (`false`: the operations taken meanwhile go on).
    pub fn set_writes_hung(&self, hung: bool) {
        self.plan.lock().writes_hung = hung;
        if !hung {
            self.unhung.notify_waiters();
        }
    }

    /// Waits while the plan says the device is hung (for a `change`: its
    /// writes too): until [`FaultVolume::set_hung`] or
    /// [`FaultVolume::set_writes_hung`] clears it, or for ever.
    async fn answers(&self, change: bool) {
        let hung = |p: &FaultPlan| p.hung || (change && p.writes_hung);
        if !hung(&self.plan.lock()) {
            return;
        }
        loop {
            let woken = self.unhung.notified();
            let mut woken = std::pin::pin!(woken);
            woken.as_mut().enable();
            if !hung(&self.plan.lock()) {
                return;
            }
            woken.await;
        }
    }
}

#[async_trait]
impl Volume for FaultVolume {
    fn geometry(&self) -> Geometry {
        self.inner.geometry()
    }
    fn requests_at_device(&self) -> u64 {
        self.inner.requests_at_device()
    }
    fn provisioning(&self) -> Option<crate::Provisioning> {
        self.inner.provisioning()
    }
    async fn grow(&self, block_count: u64) -> BlockResult<()> {
        self.inner.grow(block_count).await
    }

    async fn read(&self, lba: u64, blocks: u32) -> BlockResult<Bytes> {
        self.answers(false).await;
        {
            let p = self.plan.lock();
            if p.dead {
                return Err(dead_error());
            }
            if let Some(bad) = overlaps(&p.bad_read_blocks, lba, blocks as u64) {
                return Err(BlockError::Medium { lba: bad });
            }
        }
        self.inner.read(lba, blocks).await
    }

    async fn write(&self, lba: u64, data: Bytes, fua: bool) -> BlockResult<()> {
        self.answers(true).await;
        let blocks = self.geometry().blocks_in(data.len())?;
        let tear = {
            let mut p = self.plan.lock();
            if p.dead {
                return Err(dead_error());
            }
            if let Some(bad) = overlaps(&p.bad_write_blocks, lba, blocks) {
                return Err(BlockError::WriteFault { lba: bad });
            }
            if p.full {
                return Err(BlockError::NoSpace { lba });
            }
            p.tear_next_write_after_blocks.take()
        };
        if let Some(keep) = tear {
            let keep = keep.min(blocks);
            if keep > 0 {
                let bs = self.geometry().block_size_bytes as usize;
                self.inner
                    .write(lba, data.slice(0..keep as usize * bs), fua)
                    .await?;
            }
            return Err(BlockError::WriteFault { lba: lba + keep });
        }
        self.inner.write(lba, data, fua).await?;
        let mut p = self.plan.lock();
        if p.remap_on_write {
            let end = lba + blocks;
            p.bad_read_blocks = std::mem::take(&mut p.bad_read_blocks)
                .into_iter()
                .flat_map(|r| [r.start..r.end.min(lba), r.start.max(end)..r.end])
                .filter(|r| r.start < r.end)
                .collect();
        }
        Ok(())
    }

    async fn flush(&self) -> BlockResult<()> {
        self.answers(true).await;
        {
            let p = self.plan.lock();
            if p.dead || p.fail_flush {
                return Err(dead_error());
            }
        }
        self.inner.flush().await
    }

    async fn discard(&self, lba: u64, blocks: u64) -> BlockResult<()> {
        self.answers(true).await;
        {
            // (a discard changes the blocks as a write does: review of
            // 2026-12-06, it went through blocks that refuse writes)
            let p = self.plan.lock();
            if p.dead {
                return Err(dead_error());
            }
            if let Some(bad) = overlaps(&p.bad_write_blocks, lba, blocks) {
                return Err(BlockError::WriteFault { lba: bad });
            }
        }
        self.inner.discard(lba, blocks).await
    }

    async fn write_zeroes(&self, lba: u64, blocks: u64, may_unmap: bool) -> BlockResult<()> {
        self.answers(true).await;
        {
            let p = self.plan.lock();
            if p.dead {
                return Err(dead_error());
            }
            if let Some(bad) = overlaps(&p.bad_write_blocks, lba, blocks) {
                return Err(BlockError::WriteFault { lba: bad });
            }
        }
        self.inner.write_zeroes(lba, blocks, may_unmap).await
    }

    async fn block_status(&self, lba: u64, blocks: u64) -> BlockResult<Vec<Extent>> {
        self.answers(false).await;
        if self.plan.lock().dead {
            return Err(dead_error());
        }
        self.inner.block_status(lba, blocks).await
    }
}

/// A power cut after a number of writes: writes (and discards) pass through
/// until a budget shared by several volumes runs out, then every write and
/// flush fails without reaching the volume below. A negative budget: not
/// armed. Crash tests cut after every number of member writes an uncut run
/// makes (its count is what the budget lost).
pub struct CutVolume {
    /// The volume below.
    pub inner: VolumeRef,
    /// Writes left, shared by every volume of the machine that loses power.
    pub budget: Arc<std::sync::atomic::AtomicI64>,
}

fn cut_error() -> BlockError {
    BlockError::Io(std::io::Error::other("power cut"))
}

impl CutVolume {
    fn take(&self) -> BlockResult<()> {
        use std::sync::atomic::Ordering;
        if self.budget.load(Ordering::SeqCst) < 0 {
            return Ok(()); // unarmed
        }
        if self.budget.fetch_sub(1, Ordering::SeqCst) <= 0 {
            self.budget.store(0, Ordering::SeqCst);
            return Err(cut_error());
        }
        Ok(())
    }
}

#[async_trait]
impl Volume for CutVolume {
    fn geometry(&self) -> Geometry {
        self.inner.geometry()
    }
    async fn read(&self, lba: u64, blocks: u32) -> BlockResult<Bytes> {
        self.inner.read(lba, blocks).await
    }
    async fn write(&self, lba: u64, data: Bytes, fua: bool) -> BlockResult<()> {
        // let concurrent writers run (and queue behind this write, as behind a
        // real disk)
        tokio::task::yield_now().await;
        self.take()?;
        self.inner.write(lba, data, fua).await
    }
    async fn flush(&self) -> BlockResult<()> {
        if self.budget.load(std::sync::atomic::Ordering::SeqCst) == 0 {
            return Err(cut_error());
        }
        self.inner.flush().await
    }
    async fn discard(&self, lba: u64, blocks: u64) -> BlockResult<()> {
        self.take()?;
        self.inner.discard(lba, blocks).await
    }
    async fn block_status(&self, lba: u64, blocks: u64) -> BlockResult<Vec<Extent>> {
        self.inner.block_status(lba, blocks).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MemVolume;

    #[tokio::test]
    async fn torn_write_keeps_only_prefix() {
        let mem = Arc::new(MemVolume::new(512, 64));
        let f = FaultVolume::new(mem.clone());
        f.plan().lock().tear_next_write_after_blocks = Some(2);
        let err = f.write(0, Bytes::from(vec![7u8; 512 * 4]), false).await;
        assert!(matches!(err, Err(BlockError::WriteFault { lba: 2 })));
        let back = mem.read(0, 4).await.unwrap();
        assert!(back[..1024].iter().all(|&b| b == 7));
        assert!(back[1024..].iter().all(|&b| b == 0));
        // the tear fires once
        f.write(0, Bytes::from(vec![9u8; 512 * 4]), false)
            .await
            .unwrap();
        assert!(mem.read(0, 4).await.unwrap().iter().all(|&b| b == 9));
    }

    #[tokio::test]
    async fn bad_ranges_and_dead_device() {
        let mem = Arc::new(MemVolume::new(512, 64));
        let f = FaultVolume::new(mem);
        f.plan().lock().bad_read_blocks.push(10..12);
        assert!(matches!(
            f.read(8, 4).await,
            Err(BlockError::Medium { lba: 10 })
        ));
        assert!(f.read(0, 10).await.is_ok());
        f.plan().lock().dead = true;
        assert!(f.read(0, 1).await.is_err());
        assert!(f.flush().await.is_err());
    }
}
