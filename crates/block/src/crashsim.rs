//! A volume with a volatile write cache that can "lose power": the way tests prove
//! that the layers above really flush (or FUA) before they acknowledge.

use crate::{BlockResult, Bytes, Extent, ExtentState, Geometry, MemVolume, Volume};
use async_trait::async_trait;
use parking_lot::Mutex;
use std::collections::BTreeMap;

/// Writes and discards land in a volatile cache (kept per block: the data, or
/// `None` for a discarded block) until `flush` or a FUA write moves them to
/// stable storage; [`CrashSimVolume::crash`] drops the cache, as a power loss
/// would (a discard not yet flushed is lost too: the old data comes back, as
/// on a disk whose UNMAP sits in its volatile cache). Reads see the cache first.
pub struct CrashSimVolume {
    stable: MemVolume,
    cache: Mutex<BTreeMap<u64, Option<Bytes>>>,
    geometry: Geometry,
    /// A discarded block's data.
    zero: Bytes,
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
            zero: Bytes::from(vec![0u8; block_size_bytes as usize]),
        }
    }

    /// Power loss: every write not yet flushed is gone.
    pub fn crash(&self) {
        self.cache.lock().clear();
    }

    /// Blocks written or discarded but not yet durable.
    pub fn volatile_blocks(&self) -> usize {
        self.cache.lock().len()
    }

    async fn destage(&self) -> BlockResult<()> {
        let dirty = std::mem::take(&mut *self.cache.lock());
        // runs of discarded blocks go down as one discard each
        let mut discarding: Option<(u64, u64)> = None;
        for (lba, data) in dirty {
            match (data, &mut discarding) {
                (None, Some((start, n))) if *start + *n == lba => *n += 1,
                (data, run) => {
                    if let Some((start, n)) = run.take() {
                        self.stable.discard(start, n).await?;
                    }
                    match data {
                        Some(d) => self.stable.write(lba, d, true).await?,
                        None => *run = Some((lba, 1)),
                    }
                }
            }
        }
        if let Some((start, n)) = discarding {
            self.stable.discard(start, n).await?;
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
            out[off..off + bs].copy_from_slice(d.as_ref().unwrap_or(&self.zero));
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
            cache.insert(lba + i as u64, Some(data.slice(i * bs..(i + 1) * bs)));
        }
        Ok(())
    }

    async fn flush(&self) -> BlockResult<()> {
        self.destage().await
    }

    async fn discard(&self, lba: u64, blocks: u64) -> BlockResult<()> {
        self.geometry.check_range(lba, blocks)?;
        // volatile like a write, and ordered after earlier cached writes to the range
        let mut cache = self.cache.lock();
        for b in lba..lba + blocks {
            cache.insert(b, None);
        }
        Ok(())
    }

    async fn block_status(&self, lba: u64, blocks: u64) -> BlockResult<Vec<Extent>> {
        let stable = self.stable.block_status(lba, blocks).await?;
        let cache = self.cache.lock();
        let mut out: Vec<Extent> = Vec::new();
        let mut push = |lba: u64, blocks: u64, state: ExtentState| match out.last_mut() {
            Some(e) if e.state == state && e.lba + e.blocks == lba => e.blocks += blocks,
            _ => out.push(Extent { lba, blocks, state }),
        };
        for e in stable {
            let mut at = e.lba;
            for (b, d) in cache.range(e.lba..e.lba + e.blocks) {
                if *b > at {
                    push(at, b - at, e.state);
                }
                let state = match d {
                    Some(_) => ExtentState::Mapped,
                    None => ExtentState::Deallocated,
                };
                push(*b, 1, state);
                at = b + 1;
            }
            if at < e.lba + e.blocks {
                push(at, e.lba + e.blocks - at, e.state);
            }
        }
        Ok(out)
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

    /// A discard is volatile like a write: read as zeroes and reported
    /// deallocated at once, lost at a crash before a flush, kept after one.
    #[tokio::test]
    async fn an_unflushed_discard_is_lost_and_a_flushed_one_kept() {
        let v = CrashSimVolume::new(512, 1024);
        v.write(0, Bytes::from(vec![7u8; 512 * 4]), true)
            .await
            .unwrap();
        v.discard(1, 2).await.unwrap();
        assert_eq!(
            &v.read(0, 4).await.unwrap()[..],
            &[[7u8; 512], [0; 512], [0; 512], [7; 512]].concat()[..]
        );
        let st = v.block_status(0, 4).await.unwrap();
        assert_eq!(
            st[1],
            Extent {
                lba: 1,
                blocks: 2,
                state: ExtentState::Deallocated
            },
            "{st:?}"
        );
        v.crash();
        assert_eq!(
            &v.read(0, 4).await.unwrap()[..],
            &[7u8; 2048][..],
            "unflushed discard survived"
        );
        v.discard(1, 2).await.unwrap();
        v.write(2, Bytes::from(vec![9u8; 512]), false)
            .await
            .unwrap();
        v.flush().await.unwrap();
        v.crash();
        assert_eq!(
            &v.read(0, 4).await.unwrap()[..],
            &[[7u8; 512], [0; 512], [9; 512], [7; 512]].concat()[..]
        );
    }
}
