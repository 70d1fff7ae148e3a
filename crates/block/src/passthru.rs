//! The template for a stacking layer: forwards everything to the volume below.

use crate::{BlockResult, Bytes, Extent, Geometry, PipePayload, Volume, VolumeRef};
use async_trait::async_trait;

/// A layer that forwards every operation unchanged; copy it to start a new layer.
pub struct Passthru {
    inner: VolumeRef,
}

impl Passthru {
    /// Wraps `inner`.
    pub fn new(inner: VolumeRef) -> Self {
        Passthru { inner }
    }
}

#[async_trait]
impl Volume for Passthru {
    fn geometry(&self) -> Geometry {
        self.inner.geometry()
    }
    async fn read(&self, lba: u64, blocks: u32) -> BlockResult<Bytes> {
        self.inner.read(lba, blocks).await
    }
    async fn write(&self, lba: u64, data: Bytes, fua: bool) -> BlockResult<()> {
        self.inner.write(lba, data, fua).await
    }
    // (a layer that changes or watches the bytes must not forward these two:
    // a view is read only by the socket, a pipe's bytes only by the kernel)
    async fn read_to_socket(&self, lba: u64, blocks: u32) -> BlockResult<Bytes> {
        self.inner.read_to_socket(lba, blocks).await
    }
    fn takes_pipes(&self) -> bool {
        self.inner.takes_pipes()
    }
    async fn write_pipe(&self, lba: u64, pipe: &mut PipePayload, fua: bool) -> BlockResult<()> {
        self.inner.write_pipe(lba, pipe, fua).await
    }
    async fn flush(&self) -> BlockResult<()> {
        self.inner.flush().await
    }
    async fn discard(&self, lba: u64, blocks: u64) -> BlockResult<()> {
        self.inner.discard(lba, blocks).await
    }
    async fn write_zeroes(&self, lba: u64, blocks: u64, may_unmap: bool) -> BlockResult<()> {
        self.inner.write_zeroes(lba, blocks, may_unmap).await
    }
    async fn block_status(&self, lba: u64, blocks: u64) -> BlockResult<Vec<Extent>> {
        self.inner.block_status(lba, blocks).await
    }
    fn provisioning(&self) -> Option<crate::Provisioning> {
        self.inner.provisioning()
    }
    async fn grow(&self, block_count: u64) -> BlockResult<()> {
        self.inner.grow(block_count).await
    }
}
