//! A volume with a volatile write cache that can "lose power": the way tests prove
//! that the layers above really flush (or FUA) before they acknowledge.

use crate::{BlockResult, Bytes, Extent, Geometry, MemVolume, Volume};
use async_trait::async_trait;
use parking_lot::Mutex;
use std::collections::BTreeMap;

/// Writes land in a volatile cache (kept per block) until `flush` or a FUA write
/// moves them to stable storage; [`CrashSimVolume::crash`] drops the cache, as a
/// power loss would. Reads see the cache first.
pub struct CrashSimVolume {
    stable: MemVolume,
    cache: Mutex<BTreeMap<u64, Bytes>>,
    geometry: Geometry,
}

impl CrashSimVolume {
    /// A thin volume of `block_count` blocks with a volatile write cache.
    pub fn new(block_size_bytes: u32, block_count: u64) -> Self {
        let stable = MemVolume::new(block_size_bytes, block_count);
        let mut geometry = stable.geometry();
        geometry.volatile_cache = true;
        CrashSimVolume {
            stable,
            cache: Mutex::new(BTreeMap::new()),
            geometry,
        }
    }

    /// Power loss: every write not yet flushed is gone.
    pub fn crash(&self) {
        self.cache.lock().clear();
    }

    /// Blocks written but not yet durable.
    pub fn volatile_blocks(&self) -> usize {
        self.cache.lock().len()
    }

    async fn destage(&self) -> BlockResult<()> {
        let dirty = std::mem::take(&mut *self.cache.lock());
        for (lba, data) in dirty {
            self.stable.write(lba, data, true).await?;
        }
        Ok(())
    }
}

#[async_trait]
impl Volume for CrashSimVolume {
    fn geometry(&self) -> Geometry {
        self.geometry
    }

    async fn read(&self, lba: u64, blocks: u32) -> BlockResult<Bytes> {
        let base = self.stable.read(lba, blocks).await?;
        let cache = self.cache.lock();
        if cache.range(lba..lba + blocks as u64).next().is_none() {
            return Ok(base);
        }
        let bs = self.geometry.block_size_bytes as usize;
        let mut out = base.to_vec();
        for (l, d) in cache.range(lba..lba + blocks as u64) {
            let off = (*l - lba) as usize * bs;
            out[off..off + bs].copy_from_slice(d);
        }
        Ok(Bytes::from(out))
    }

    async fn write(&self, lba: u64, data: Bytes, fua: bool) -> BlockResult<()> {
        let blocks = self.geometry.blocks_in(data.len())?;
        self.geometry.check_range(lba, blocks)?;
        let bs = self.geometry.block_size_bytes as usize;
        if fua {
            {
                let mut cache = self.cache.lock();
                for i in 0..blocks {
                    cache.remove(&(lba + i));
                }
            }
            return self.stable.write(lba, data, true).await;
        }
        let mut cache = self.cache.lock();
        for i in 0..blocks as usize {
            cache.insert(lba + i as u64, data.slice(i * bs..(i + 1) * bs));
        }
        Ok(())
    }

    async fn flush(&self) -> BlockResult<()> {
        self.destage().await
    }

    async fn discard(&self, lba: u64, blocks: u64) -> BlockResult<()> {
        self.geometry.check_range(lba, blocks)?;
        // a discard is ordered after earlier cached writes to the range
        {
            let mut cache = self.cache.lock();
            let keys: Vec<u64> = cache.range(lba..lba + blocks).map(|(k, _)| *k).collect();
            for k in keys {
                cache.remove(&k);
            }
        }
        self.stable.discard(lba, blocks).await
    }

    async fn block_status(&self, lba: u64, blocks: u64) -> BlockResult<Vec<Extent>> {
        self.stable.block_status(lba, blocks).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn unflushed_writes_are_lost_and_flushed_ones_kept() {
        let v = CrashSimVolume::new(512, 64);
        v.write(0, Bytes::from(vec![1u8; 512]), false)
            .await
            .unwrap();
        v.flush().await.unwrap();
        v.write(1, Bytes::from(vec![2u8; 512]), false)
            .await
            .unwrap();
        v.write(2, Bytes::from(vec![3u8; 512]), true).await.unwrap();
        assert_eq!(v.read(1, 1).await.unwrap()[0], 2);
        v.crash();
        assert_eq!(v.read(0, 1).await.unwrap()[0], 1);
        assert_eq!(
            v.read(1, 1).await.unwrap()[0],
            0,
            "unflushed write survived a crash"
        );
        assert_eq!(v.read(2, 1).await.unwrap()[0], 3, "FUA write lost");
    }
}
