//! A layer that adds a fixed latency to every operation, for tests and experiments.

use crate::{BlockResult, Bytes, Extent, Geometry, Volume, VolumeRef};
use async_trait::async_trait;
use std::time::Duration;

/// Adds `read_delay` / `write_delay` before forwarding each operation.
pub struct DelayVolume {
    inner: VolumeRef,
    read_delay: Duration,
    write_delay: Duration,
}

impl DelayVolume {
    /// Wraps `inner`, delaying reads and writes (flush and discard count as writes).
    pub fn new(inner: VolumeRef, read_delay: Duration, write_delay: Duration) -> Self {
        DelayVolume {
            inner,
            read_delay,
            write_delay,
        }
    }
}

#[async_trait]
impl Volume for DelayVolume {
    fn geometry(&self) -> Geometry {
        self.inner.geometry()
    }
    async fn read(&self, lba: u64, blocks: u32) -> BlockResult<Bytes> {
        tokio::time::sleep(self.read_delay).await;
        self.inner.read(lba, blocks).await
    }
    async fn write(&self, lba: u64, data: Bytes, fua: bool) -> BlockResult<()> {
        tokio::time::sleep(self.write_delay).await;
        self.inner.write(lba, data, fua).await
    }
    async fn flush(&self) -> BlockResult<()> {
        tokio::time::sleep(self.write_delay).await;
        self.inner.flush().await
    }
    async fn discard(&self, lba: u64, blocks: u64) -> BlockResult<()> {
        tokio::time::sleep(self.write_delay).await;
        self.inner.discard(lba, blocks).await
    }
    async fn block_status(&self, lba: u64, blocks: u64) -> BlockResult<Vec<Extent>> {
        self.inner.block_status(lba, blocks).await
    }
}
