//! A layer that adds a fixed latency to every operation, for tests and experiments.

use crate::{BlockResult, Bytes, Extent, Geometry, Volume, VolumeRef};
use async_trait::async_trait;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Adds a read delay / write delay before forwarding each operation.
pub struct DelayVolume {
    inner: VolumeRef,
    read_delay_ns: AtomicU64,
    write_delay_ns: AtomicU64,
}

impl DelayVolume {
    /// Wraps `inner`, delaying reads and writes (flush and discard count as writes).
    pub fn new(inner: VolumeRef, read_delay: Duration, write_delay: Duration) -> Self {
        let v = DelayVolume {
            inner,
            read_delay_ns: AtomicU64::new(0),
            write_delay_ns: AtomicU64::new(0),
        };
        v.set_delays(read_delay, write_delay);
        v
    }

    /// Changes the delays of operations from now on.
    pub fn set_delays(&self, read_delay: Duration, write_delay: Duration) {
        let ns = |d: Duration| d.as_nanos().min(u64::MAX as u128) as u64;
        self.read_delay_ns.store(ns(read_delay), Ordering::Relaxed);
        self.write_delay_ns
            .store(ns(write_delay), Ordering::Relaxed);
    }

    fn read_delay(&self) -> Duration {
        Duration::from_nanos(self.read_delay_ns.load(Ordering::Relaxed))
    }

    fn write_delay(&self) -> Duration {
        Duration::from_nanos(self.write_delay_ns.load(Ordering::Relaxed))
    }
}

#[async_trait]
impl Volume for DelayVolume {
    fn geometry(&self) -> Geometry {
        self.inner.geometry()
    }
    fn provisioning(&self) -> Option<crate::Provisioning> {
        self.inner.provisioning()
    }
    async fn grow(&self, block_count: u64) -> BlockResult<()> {
        self.inner.grow(block_count).await
    }
    async fn read(&self, lba: u64, blocks: u32) -> BlockResult<Bytes> {
        tokio::time::sleep(self.read_delay()).await;
        self.inner.read(lba, blocks).await
    }
    async fn write(&self, lba: u64, data: Bytes, fua: bool) -> BlockResult<()> {
        tokio::time::sleep(self.write_delay()).await;
        self.inner.write(lba, data, fua).await
    }
    async fn flush(&self) -> BlockResult<()> {
        tokio::time::sleep(self.write_delay()).await;
        self.inner.flush().await
    }
    async fn discard(&self, lba: u64, blocks: u64) -> BlockResult<()> {
        tokio::time::sleep(self.write_delay()).await;
        self.inner.discard(lba, blocks).await
    }
    async fn block_status(&self, lba: u64, blocks: u64) -> BlockResult<Vec<Extent>> {
        self.inner.block_status(lba, blocks).await
    }
}
