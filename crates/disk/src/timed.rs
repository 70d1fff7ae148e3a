//! [`TimedDisk`]: a disk as its pool or cache sees it, timed. Every read and
//! write is counted with its latency (one `Instant` per operation, relaxed
//! atomic adds, like the SCSI layer's per-LU counters); everything else is
//! forwarded unchanged.
//!
//! What it does not do: change any request, or time flushes, discards and
//! zeroing (their cost says little about the medium).

use async_trait::async_trait;
use block::{BlockResult, Bytes, Extent, Geometry, Provisioning, Volume, VolumeRef};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// A snapshot of a disk's read and write counters since it was opened.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DiskTiming {
    /// Reads finished (good or not).
    pub reads: u64,
    /// Writes finished (good or not).
    pub writes: u64,
    /// Reads that failed.
    pub read_errors: u64,
    /// Writes that failed.
    pub write_errors: u64,
    /// Sum of the reads' latencies, in nanoseconds (a page-cache hit takes
    /// less than a microsecond).
    pub read_latency_sum_ns: u64,
    /// Sum of the writes' latencies, in nanoseconds.
    pub write_latency_sum_ns: u64,
}

impl DiskTiming {
    /// Mean read latency in microseconds (0 with no read).
    pub fn read_latency_us(&self) -> f64 {
        mean(self.read_latency_sum_ns, self.reads) / 1000.0
    }

    /// Mean write latency in microseconds (0 with no write).
    pub fn write_latency_us(&self) -> f64 {
        mean(self.write_latency_sum_ns, self.writes) / 1000.0
    }
}

fn mean(sum: u64, n: u64) -> f64 {
    if n == 0 {
        0.0
    } else {
        sum as f64 / n as f64
    }
}

#[derive(Default)]
struct Dir {
    ops: AtomicU64,
    errors: AtomicU64,
    latency_sum_ns: AtomicU64,
}

impl Dir {
    fn finish(&self, started: Instant, failed: bool) {
        let ns = started.elapsed().as_nanos().min(u64::MAX as u128) as u64;
        self.ops.fetch_add(1, Ordering::Relaxed);
        if failed {
            self.errors.fetch_add(1, Ordering::Relaxed);
        }
        self.latency_sum_ns.fetch_add(ns, Ordering::Relaxed);
    }
}

/// A disk whose reads and writes are timed (see the module doc).
pub struct TimedDisk {
    inner: VolumeRef,
    read: Dir,
    write: Dir,
}

impl TimedDisk {
    /// Times `inner`.
    pub fn new(inner: VolumeRef) -> TimedDisk {
        TimedDisk {
            inner,
            read: Dir::default(),
            write: Dir::default(),
        }
    }

    /// The counters so far.
    pub fn timing(&self) -> DiskTiming {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        DiskTiming {
            reads: get(&self.read.ops),
            writes: get(&self.write.ops),
            read_errors: get(&self.read.errors),
            write_errors: get(&self.write.errors),
            read_latency_sum_ns: get(&self.read.latency_sum_ns),
            write_latency_sum_ns: get(&self.write.latency_sum_ns),
        }
    }
}

#[async_trait]
impl Volume for TimedDisk {
    fn geometry(&self) -> Geometry {
        self.inner.geometry()
    }
    async fn read(&self, lba: u64, blocks: u32) -> BlockResult<Bytes> {
        let t = Instant::now();
        let r = self.inner.read(lba, blocks).await;
        self.read.finish(t, r.is_err());
        r
    }
    async fn write(&self, lba: u64, data: Bytes, fua: bool) -> BlockResult<()> {
        let t = Instant::now();
        let r = self.inner.write(lba, data, fua).await;
        self.write.finish(t, r.is_err());
        r
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
    async fn compare_and_write(
        &self,
        lba: u64,
        compare: Bytes,
        data: Bytes,
        fua: bool,
    ) -> BlockResult<Option<usize>> {
        self.inner.compare_and_write(lba, compare, data, fua).await
    }
    async fn block_status(&self, lba: u64, blocks: u64) -> BlockResult<Vec<Extent>> {
        self.inner.block_status(lba, blocks).await
    }
    fn provisioning(&self) -> Option<Provisioning> {
        self.inner.provisioning()
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
    use std::sync::Arc;

    #[tokio::test]
    async fn counts_reads_and_writes_with_their_errors() {
        let mem = Arc::new(block::MemVolume::new_thick(512, 8));
        let d = TimedDisk::new(mem);
        d.write(0, Bytes::from(vec![1u8; 512]), false)
            .await
            .unwrap();
        d.read(0, 1).await.unwrap();
        assert!(d.read(100, 1).await.is_err());
        let t = d.timing();
        assert_eq!((t.reads, t.read_errors), (2, 1));
        assert_eq!((t.writes, t.write_errors), (1, 0));
        assert_eq!(DiskTiming::default().read_latency_us(), 0.0);
    }
}
