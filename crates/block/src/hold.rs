//! A layer whose reads or writes wait until a test lets them through, so a test
//! can act at the moment an operation is under way (an event to await, not a
//! delay to sleep through).

use crate::{BlockResult, Bytes, Extent, Geometry, Volume, VolumeRef};
use async_trait::async_trait;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use tokio::sync::{watch, Semaphore};

/// One kind of operation's gate: while it holds, each operation (starting in
/// [`Hold::hold_range`]'s blocks, if set) counts its arrival and waits for a
/// release.
pub struct Hold {
    on: AtomicBool,
    from: AtomicU64,
    below: AtomicU64,
    last: AtomicU64,
    arrived: watch::Sender<usize>,
    ended: watch::Sender<usize>,
    go: Semaphore,
}

impl Hold {
    fn new() -> Hold {
        Hold {
            on: AtomicBool::new(false),
            from: AtomicU64::new(0),
            below: AtomicU64::new(u64::MAX),
            last: AtomicU64::new(u64::MAX),
            arrived: watch::channel(0).0,
            ended: watch::channel(0).0,
            go: Semaphore::new(0),
        }
    }

    /// Operations from now on wait (every one).
    pub fn hold(&self) {
        self.hold_below(u64::MAX);
    }

    /// Operations starting below block `lba` from now on wait.
    pub fn hold_below(&self, lba: u64) {
        self.hold_range(0, lba);
    }

    /// Operations starting at a block in `from..below` from now on wait.
    pub fn hold_range(&self, from: u64, below: u64) {
        self.from.store(from, Ordering::Release);
        self.below.store(below, Ordering::Release);
        self.on.store(true, Ordering::Release);
    }

    /// Lets `n` waiting (or later) operations through.
    pub fn release(&self, n: usize) {
        self.go.add_permits(n);
    }

    /// Stops holding and lets every waiting operation through.
    pub fn open(&self) {
        self.on.store(false, Ordering::Release);
        self.go.add_permits(Semaphore::MAX_PERMITS / 2);
    }

    /// Waits until `n` operations in all have arrived at the gate.
    pub async fn arrivals(&self, n: usize) {
        let mut rx = self.arrived.subscribe();
        let _ = rx.wait_for(|&c| c >= n).await;
    }

    /// Waits until `n` operations in all that were held have ended (done in
    /// the volume below, after their release).
    pub async fn endings(&self, n: usize) {
        let mut rx = self.ended.subscribe();
        let _ = rx.wait_for(|&c| c >= n).await;
    }

    /// The block the latest operation held started at.
    pub fn last_arrival(&self) -> u64 {
        self.last.load(Ordering::Acquire)
    }

    /// Waits at the gate if it holds `lba`; what the gate held then reports
    /// its end to [`Hold::endings`] when the returned token drops.
    async fn pass(&self, lba: u64) -> Option<Ended<'_>> {
        if !self.on.load(Ordering::Acquire)
            || lba < self.from.load(Ordering::Acquire)
            || lba >= self.below.load(Ordering::Acquire)
        {
            return None;
        }
        self.last.store(lba, Ordering::Release);
        self.arrived.send_modify(|c| *c += 1);
        if let Ok(p) = self.go.acquire().await {
            p.forget();
        }
        Some(Ended(self))
    }
}

/// Reports a held operation's end (see [`Hold::endings`]).
struct Ended<'a>(&'a Hold);

impl Drop for Ended<'_> {
    fn drop(&mut self) {
        self.0.ended.send_modify(|c| *c += 1);
    }
}

/// Forwards to the volume below, reads through [`HoldVolume::reads`],
/// writes (write, write zeroes, discard) through [`HoldVolume::writes`] and
/// flushes through [`HoldVolume::flushes`] (as at block 0).
pub struct HoldVolume {
    inner: VolumeRef,
    /// The reads' gate.
    pub reads: Arc<Hold>,
    /// The writes' gate.
    pub writes: Arc<Hold>,
    /// The flushes' gate.
    pub flushes: Arc<Hold>,
    queued: bool,
}

impl HoldVolume {
    /// Wraps `inner`, holding nothing yet. An operation whose caller drops it
    /// is gone, held or not.
    pub fn new(inner: VolumeRef) -> Self {
        HoldVolume {
            inner,
            reads: Arc::new(Hold::new()),
            writes: Arc::new(Hold::new()),
            flushes: Arc::new(Hold::new()),
            queued: false,
        }
    }

    /// As [`HoldVolume::new`], but an operation, once issued, goes on to its
    /// end (through the gate when released) even if its caller drops it, as a
    /// request handed to a disk's queue or an io_uring does.
    pub fn queued(inner: VolumeRef) -> Self {
        HoldVolume {
            queued: true,
            ..HoldVolume::new(inner)
        }
    }

    /// Runs `op` on the volume below once `gate` lets block `lba` through.
    async fn through<T, F, Fut>(&self, gate: &Arc<Hold>, lba: u64, op: F) -> T
    where
        T: Send + 'static,
        F: FnOnce(VolumeRef) -> Fut + Send + 'static,
        Fut: Future<Output = T> + Send + 'static,
    {
        let (gate, inner) = (gate.clone(), self.inner.clone());
        let run = async move {
            let _end = gate.pass(lba).await;
            op(inner).await
        };
        if self.queued {
            // on a task of its own, as a device's queue: it carries nothing
            // of its caller's (no transport in-flight token, unlike
            // `crate::detach`)
            tokio::spawn(run).await.expect("a held operation panicked")
        } else {
            run.await
        }
    }
}

#[async_trait]
impl Volume for HoldVolume {
    fn geometry(&self) -> Geometry {
        self.inner.geometry()
    }
    async fn read(&self, lba: u64, blocks: u32) -> BlockResult<Bytes> {
        self.through(&self.reads, lba, move |v| async move {
            v.read(lba, blocks).await
        })
        .await
    }
    async fn write(&self, lba: u64, data: Bytes, fua: bool) -> BlockResult<()> {
        self.through(&self.writes, lba, move |v| async move {
            v.write(lba, data, fua).await
        })
        .await
    }
    async fn flush(&self) -> BlockResult<()> {
        self.through(&self.flushes, 0, |v| async move { v.flush().await })
            .await
    }
    async fn discard(&self, lba: u64, blocks: u64) -> BlockResult<()> {
        self.through(&self.writes, lba, move |v| async move {
            v.discard(lba, blocks).await
        })
        .await
    }
    async fn write_zeroes(&self, lba: u64, blocks: u64, may_unmap: bool) -> BlockResult<()> {
        self.through(&self.writes, lba, move |v| async move {
            v.write_zeroes(lba, blocks, may_unmap).await
        })
        .await
    }
    async fn block_status(&self, lba: u64, blocks: u64) -> BlockResult<Vec<Extent>> {
        self.inner.block_status(lba, blocks).await
    }
    async fn grow(&self, block_count: u64) -> BlockResult<()> {
        self.inner.grow(block_count).await
    }
    async fn shrink(&self, block_count: u64) -> BlockResult<()> {
        self.inner.shrink(block_count).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MemVolume;
    use std::sync::Arc;

    #[tokio::test]
    async fn a_held_write_lands_only_once_released() {
        let mem: VolumeRef = Arc::new(MemVolume::new(512, 100));
        let v = Arc::new(HoldVolume::new(mem.clone()));
        v.writes.hold_below(50);
        // above the gate's block: not held
        v.write(60, Bytes::from(vec![6u8; 512]), false)
            .await
            .unwrap();
        let w = {
            let v = v.clone();
            tokio::spawn(async move { v.write(1, Bytes::from(vec![1u8; 512]), false).await })
        };
        v.writes.arrivals(1).await;
        assert_eq!(mem.read(1, 1).await.unwrap()[0], 0);
        v.writes.release(1);
        w.await.unwrap().unwrap();
        assert_eq!(mem.read(1, 1).await.unwrap()[0], 1);
        v.writes.open();
        v.write(2, Bytes::from(vec![2u8; 512]), false)
            .await
            .unwrap();
    }
}
