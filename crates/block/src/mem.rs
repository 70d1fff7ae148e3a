//! A sparse in-memory volume: the test oracle and the fastest backend for experiments.

use crate::{BlockResult, Bytes, BytesMut, Extent, ExtentState, Geometry, Volume};
use async_trait::async_trait;
use parking_lot::RwLock;
use std::collections::BTreeMap;

const CHUNK_BYTES: usize = 64 * 1024;

/// A thin volume held in memory in 64 KiB chunks; never-written chunks read as zeroes.
pub struct MemVolume {
    geometry: Geometry,
    /// The block count (it grows: [`Volume::grow`]).
    block_count: std::sync::atomic::AtomicU64,
    chunks: RwLock<BTreeMap<u64, Box<[u8]>>>,
}

impl MemVolume {
    /// A zero-filled thin volume of `block_count` blocks of `block_size_bytes`.
    pub fn new(block_size_bytes: u32, block_count: u64) -> Self {
        assert!(block_size_bytes.is_power_of_two() && block_size_bytes as usize <= CHUNK_BYTES);
        MemVolume {
            geometry: Geometry {
                block_size_bytes,
                block_count,
                thin: true,
                volatile_cache: false,
                optimal_io_blocks: 1,
                max_io_blocks: (8 << 20) / block_size_bytes,
            },
            block_count: std::sync::atomic::AtomicU64::new(block_count),
            chunks: RwLock::new(BTreeMap::new()),
        }
    }

    /// Like [`MemVolume::new`], with every chunk allocated and its pages touched
    /// up front, so the first write of a block costs no page fault (as on a real
    /// disk) and benchmarks measure what they mean to. Reports itself thick.
    pub fn new_thick(block_size_bytes: u32, block_count: u64) -> Self {
        let mut v = MemVolume::new(block_size_bytes, block_count);
        v.geometry.thin = false;
        let bytes = block_count * block_size_bytes as u64;
        let n = bytes.div_ceil(CHUNK_BYTES as u64);
        {
            let mut chunks = v.chunks.write();
            for idx in 0..n {
                let mut c = vec![0u8; CHUNK_BYTES].into_boxed_slice();
                // the allocator may hand out untouched zero pages: write them now
                std::hint::black_box(&mut c);
                c.fill(0);
                chunks.insert(idx, c);
            }
        }
        v
    }

    /// Bytes of memory held by written chunks.
    pub fn allocated_bytes(&self) -> usize {
        self.chunks.read().len() * CHUNK_BYTES
    }

    fn copy_out(&self, offset: u64, out: &mut [u8]) {
        let chunks = self.chunks.read();
        let mut pos = 0usize;
        while pos < out.len() {
            let abs = offset + pos as u64;
            let idx = abs / CHUNK_BYTES as u64;
            let within = (abs % CHUNK_BYTES as u64) as usize;
            let n = (CHUNK_BYTES - within).min(out.len() - pos);
            match chunks.get(&idx) {
                Some(c) => out[pos..pos + n].copy_from_slice(&c[within..within + n]),
                None => out[pos..pos + n].fill(0),
            }
            pos += n;
        }
    }

    fn copy_in(&self, offset: u64, data: &[u8]) {
        let mut chunks = self.chunks.write();
        let mut pos = 0usize;
        while pos < data.len() {
            let abs = offset + pos as u64;
            let idx = abs / CHUNK_BYTES as u64;
            let within = (abs % CHUNK_BYTES as u64) as usize;
            let n = (CHUNK_BYTES - within).min(data.len() - pos);
            let c = chunks
                .entry(idx)
                .or_insert_with(|| vec![0u8; CHUNK_BYTES].into_boxed_slice());
            c[within..within + n].copy_from_slice(&data[pos..pos + n]);
            pos += n;
        }
    }

    fn zero_range(&self, offset: u64, len: u64) {
        let mut chunks = self.chunks.write();
        let mut pos = 0u64;
        while pos < len {
            let abs = offset + pos;
            let idx = abs / CHUNK_BYTES as u64;
            let within = (abs % CHUNK_BYTES as u64) as usize;
            let n = ((CHUNK_BYTES - within) as u64).min(len - pos) as usize;
            if within == 0 && n == CHUNK_BYTES {
                chunks.remove(&idx);
            } else if let Some(c) = chunks.get_mut(&idx) {
                c[within..within + n].fill(0);
            }
            pos += n as u64;
        }
    }
}

#[async_trait]
impl Volume for MemVolume {
    fn geometry(&self) -> Geometry {
        Geometry {
            block_count: self.block_count.load(std::sync::atomic::Ordering::Acquire),
            ..self.geometry
        }
    }

    /// Grows; the new blocks read as zeroes.
    async fn grow(&self, block_count: u64) -> BlockResult<()> {
        let now = self.geometry().block_count;
        if block_count < now {
            return Err(crate::BlockError::NotSupported("shrinking a volume"));
        }
        self.block_count
            .fetch_max(block_count, std::sync::atomic::Ordering::AcqRel);
        Ok(())
    }

    /// Shrinks; what lay beyond reads as zeroes if it grows again.
    async fn shrink(&self, block_count: u64) -> BlockResult<()> {
        let now = self.geometry().block_count;
        if block_count > now {
            return Err(crate::BlockError::NotSupported("growing by a shrink"));
        }
        self.block_count
            .store(block_count, std::sync::atomic::Ordering::Release);
        let bs = self.geometry.block_size_bytes as u64;
        self.zero_range(block_count * bs, (now - block_count) * bs);
        Ok(())
    }

    async fn read(&self, lba: u64, blocks: u32) -> BlockResult<Bytes> {
        self.geometry().check_range(lba, blocks as u64)?;
        let bs = self.geometry.block_size_bytes as u64;
        let mut out = BytesMut::zeroed((blocks as u64 * bs) as usize);
        self.copy_out(lba * bs, &mut out);
        Ok(out.freeze())
    }

    async fn write(&self, lba: u64, data: Bytes, _fua: bool) -> BlockResult<()> {
        let blocks = self.geometry().blocks_in(data.len())?;
        self.geometry().check_range(lba, blocks)?;
        self.copy_in(lba * self.geometry.block_size_bytes as u64, &data);
        Ok(())
    }

    async fn flush(&self) -> BlockResult<()> {
        Ok(())
    }

    async fn discard(&self, lba: u64, blocks: u64) -> BlockResult<()> {
        self.geometry().check_range(lba, blocks)?;
        let bs = self.geometry.block_size_bytes as u64;
        self.zero_range(lba * bs, blocks * bs);
        Ok(())
    }

    async fn write_zeroes(&self, lba: u64, blocks: u64, _may_unmap: bool) -> BlockResult<()> {
        self.discard(lba, blocks).await
    }

    async fn block_status(&self, lba: u64, blocks: u64) -> BlockResult<Vec<Extent>> {
        self.geometry().check_range(lba, blocks)?;
        let bs = self.geometry.block_size_bytes as u64;
        let chunk_blocks = CHUNK_BYTES as u64 / bs;
        let chunks = self.chunks.read();
        let mut out: Vec<Extent> = Vec::new();
        let end = lba + blocks;
        let mut cur = lba;
        while cur < end {
            let idx = cur / chunk_blocks;
            let next = ((idx + 1) * chunk_blocks).min(end);
            let state = if chunks.contains_key(&idx) {
                ExtentState::Mapped
            } else {
                ExtentState::Deallocated
            };
            match out.last_mut() {
                Some(e) if e.state == state => e.blocks += next - cur,
                _ => out.push(Extent {
                    lba: cur,
                    blocks: next - cur,
                    state,
                }),
            }
            cur = next;
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn write_read_discard_roundtrip() {
        let v = MemVolume::new(512, 1024);
        let data = Bytes::from(vec![0xabu8; 512 * 200]);
        v.write(100, data.clone(), false).await.unwrap();
        assert_eq!(v.read(100, 200).await.unwrap(), data);
        assert!(v.read(99, 1).await.unwrap().iter().all(|&b| b == 0));
        v.discard(150, 10).await.unwrap();
        let back = v.read(150, 10).await.unwrap();
        assert!(back.iter().all(|&b| b == 0));
        assert_eq!(v.read(160, 1).await.unwrap()[0], 0xab);
        assert!(v.read(1000, 25).await.is_err());
        assert!(v
            .write(0, Bytes::from(vec![0u8; 100]), false)
            .await
            .is_err());
    }

    #[tokio::test]
    async fn block_status_reports_holes() {
        let v = MemVolume::new(512, 1024);
        v.write(256, Bytes::from(vec![1u8; 512]), false)
            .await
            .unwrap();
        let ext = v.block_status(0, 1024).await.unwrap();
        assert_eq!(ext[0].state, ExtentState::Deallocated);
        assert_eq!(ext[0].blocks, 256);
        assert_eq!(ext[1].state, ExtentState::Mapped);
        assert_eq!(ext[1].lba, 256);
        assert_eq!(ext[1].blocks, 128);
    }
}
