//! [`TimedDisk`]: a disk as its pool or cache sees it, timed. Every read and
//! write is counted with its latency (one `Instant` per operation, relaxed
//! atomic adds, like the SCSI layer's per-LU counters); everything else is
//! forwarded unchanged.
//!
//! **A disk that stops answering is failed.** With a command timeout
//! ([`TimedDisk::with_timeout`]), a read or write that has no answer within
//! it (a flush: [`FLUSH_TIMEOUT_FACTOR`] times it) fails with a `TimedOut`
//! i/o error, and from then on every request fails at once: the disk is
//! taken as failed until the node opens it again. A pool fails such a member
//! and a cache such a device, as on any other device error, and go on
//! without it (degraded), where before every request that touched the disk
//! waited as long as the disk did, and with it the initiators, whose own
//! command timeouts (30 s on Linux) then escalate to resets and lost
//! sessions. That is what a hardware RAID controller does with a disk past
//! its command timeout.
//!
//! The request that timed out is not cancelled at the device: the I/O
//! engine keeps its buffer until the kernel answers, so a write may still
//! land later. Nothing relies on what the disk holds after that: no later
//! request is taken, so no later acknowledged write can be put under it, and
//! a pool or cache that failed the disk rebuilds or resilvers whatever it
//! puts back on it.
//!
//! What it does not do: change any request, or time discards and zeroing
//! (how long they take depends on their size, and says little about the
//! medium; a failed disk refuses them too).

use async_trait::async_trait;
use block::{BlockError, BlockResult, Bytes, Extent, Geometry, Provisioning, Volume, VolumeRef};
use std::future::Future;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::task::Poll;
use std::time::{Duration, Instant};

/// A disk's command timeout when its configuration names none: below the
/// 30 s after which Linux initiators abort a command and begin resetting,
/// so a pool or cache gives up a hung disk and answers before they do.
pub const IO_TIMEOUT_DEFAULT: Duration = Duration::from_secs(20);

/// A flush may take this many command timeouts: it writes back whatever the
/// device's (or a buffered file's) cache holds.
pub const FLUSH_TIMEOUT_FACTOR: u32 = 3;

/// A snapshot of a disk's read and write counters since it was opened.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
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
    /// Requests that had no answer within the command timeout (counted in
    /// the errors as well; a flush's in none of the others).
    pub timeouts: u64,
    /// Why the disk is taken as failed (it stopped answering), if it is.
    pub failed: Option<String>,
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
    /// The command timeout, if any.
    limit: Option<Duration>,
    /// The name log lines give the disk.
    name: String,
    timeouts: AtomicU64,
    /// Set by the first request that timed out: why the disk is failed.
    failed: OnceLock<String>,
}

impl TimedDisk {
    /// Times `inner`, with no command timeout.
    pub fn new(inner: VolumeRef) -> TimedDisk {
        TimedDisk {
            inner,
            read: Dir::default(),
            write: Dir::default(),
            limit: None,
            name: String::new(),
            timeouts: AtomicU64::new(0),
            failed: OnceLock::new(),
        }
    }

    /// Times `inner` (disk `name`) and fails it when a request has no answer
    /// within `limit` (see the module doc).
    pub fn with_timeout(inner: VolumeRef, name: &str, limit: Duration) -> TimedDisk {
        TimedDisk {
            limit: Some(limit),
            name: name.to_string(),
            ..TimedDisk::new(inner)
        }
    }

    /// Runs `io` (a `what` at `lba`) within the command timeout times
    /// `factor` (0: untimed); refuses it at once on a failed disk.
    async fn bounded<T>(
        &self,
        what: &str,
        lba: u64,
        factor: u32,
        io: impl Future<Output = BlockResult<T>>,
    ) -> BlockResult<T> {
        if let Some(why) = self.failed.get() {
            return Err(BlockError::Io(io::Error::other(format!(
                "disk {} is taken as failed: {why}",
                self.name
            ))));
        }
        // factor 0: refused when failed, never timed
        let Some(limit) = self.limit.filter(|_| factor > 0) else {
            return io.await;
        };
        let limit = limit * factor;
        // a request answered at once (a page-cache hit done inline) needs no
        // timer: polled once first, timed only if it waits
        let mut io = std::pin::pin!(io);
        if let Poll::Ready(r) = std::future::poll_fn(|cx| Poll::Ready(io.as_mut().poll(cx))).await {
            return r;
        }
        match tokio::time::timeout(limit, io).await {
            Ok(r) => r,
            Err(_) => {
                self.timeouts.fetch_add(1, Ordering::Relaxed);
                let why = format!(
                    "a {what} at lba {lba} had no answer in {:.1} s",
                    limit.as_secs_f64()
                );
                if self.failed.set(why.clone()).is_ok() {
                    tracing::error!(disk = %self.name, "disk stopped answering ({why}): \
                        taken as failed, every further request to it fails until the \
                        node opens it again");
                }
                Err(BlockError::Io(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("disk {}: {why}", self.name),
                )))
            }
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
            timeouts: get(&self.timeouts),
            failed: self.failed.get().cloned(),
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
        let r = self
            .bounded("read", lba, 1, self.inner.read(lba, blocks))
            .await;
        self.read.finish(t, r.is_err());
        r
    }
    async fn write(&self, lba: u64, data: Bytes, fua: bool) -> BlockResult<()> {
        let t = Instant::now();
        let r = self
            .bounded("write", lba, 1, self.inner.write(lba, data, fua))
            .await;
        self.write.finish(t, r.is_err());
        r
    }
    async fn flush(&self) -> BlockResult<()> {
        self.bounded("flush", 0, FLUSH_TIMEOUT_FACTOR, self.inner.flush())
            .await
    }
    async fn discard(&self, lba: u64, blocks: u64) -> BlockResult<()> {
        self.bounded("discard", lba, 0, self.inner.discard(lba, blocks))
            .await
    }
    async fn write_zeroes(&self, lba: u64, blocks: u64, may_unmap: bool) -> BlockResult<()> {
        let io = self.inner.write_zeroes(lba, blocks, may_unmap);
        self.bounded("zeroing", lba, 0, io).await
    }
    async fn compare_and_write(
        &self,
        lba: u64,
        compare: Bytes,
        data: Bytes,
        fua: bool,
    ) -> BlockResult<Option<usize>> {
        let io = self.inner.compare_and_write(lba, compare, data, fua);
        self.bounded("compare and write", lba, 1, io).await
    }
    async fn block_status(&self, lba: u64, blocks: u64) -> BlockResult<Vec<Extent>> {
        let io = self.inner.block_status(lba, blocks);
        self.bounded("block status", lba, 1, io).await
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

    /// A disk that takes every request and answers none once `hang` is set.
    struct Hangs {
        mem: block::MemVolume,
        hang: std::sync::atomic::AtomicBool,
    }

    impl Hangs {
        async fn maybe(&self) {
            if self.hang.load(Ordering::Relaxed) {
                std::future::pending::<()>().await;
            }
        }
    }

    #[async_trait]
    impl Volume for Hangs {
        fn geometry(&self) -> Geometry {
            self.mem.geometry()
        }
        async fn read(&self, lba: u64, blocks: u32) -> BlockResult<Bytes> {
            self.maybe().await;
            self.mem.read(lba, blocks).await
        }
        async fn write(&self, lba: u64, data: Bytes, fua: bool) -> BlockResult<()> {
            self.maybe().await;
            self.mem.write(lba, data, fua).await
        }
        async fn flush(&self) -> BlockResult<()> {
            self.maybe().await;
            self.mem.flush().await
        }
        async fn discard(&self, lba: u64, blocks: u64) -> BlockResult<()> {
            self.maybe().await;
            self.mem.discard(lba, blocks).await
        }
    }

    fn hangs() -> Arc<Hangs> {
        Arc::new(Hangs {
            mem: block::MemVolume::new_thick(512, 8),
            hang: false.into(),
        })
    }

    /// A request with no answer fails at the command timeout and fails the
    /// disk: every later request is refused at once, whatever it is.
    #[tokio::test(start_paused = true)]
    async fn a_disk_that_stops_answering_fails_at_the_timeout_and_stays_failed() {
        let limit = Duration::from_secs(20);
        let h = hangs();
        let d = TimedDisk::with_timeout(h.clone(), "d0", limit);
        // an answering disk is not touched by the timeout
        d.write(1, Bytes::from(vec![7u8; 512]), true).await.unwrap();
        assert_eq!(d.read(1, 1).await.unwrap()[0], 7);
        d.flush().await.unwrap();
        assert_eq!(d.timing().timeouts, 0);

        h.hang.store(true, Ordering::Relaxed);
        let t = tokio::time::Instant::now();
        let e = d.read(1, 1).await.unwrap_err();
        assert_eq!(t.elapsed(), limit, "the read failed at the timeout");
        let BlockError::Io(io) = &e else {
            panic!("{e}")
        };
        assert_eq!(io.kind(), io::ErrorKind::TimedOut, "{e}");
        let timing = d.timing();
        assert_eq!((timing.timeouts, timing.read_errors), (1, 1));
        assert!(timing.failed.unwrap().contains("read at lba 1"));

        // failed: refused at once, even once the disk answers again
        h.hang.store(false, Ordering::Relaxed);
        let t = tokio::time::Instant::now();
        for e in [
            d.write(2, Bytes::from(vec![1u8; 512]), false)
                .await
                .unwrap_err(),
            d.read(2, 1).await.unwrap_err(),
            d.flush().await.unwrap_err(),
            d.discard(0, 1).await.unwrap_err(),
        ] {
            assert!(e.to_string().contains("taken as failed"), "{e}");
        }
        assert_eq!(t.elapsed(), Duration::ZERO);
        assert_eq!(h.mem.read(2, 1).await.unwrap()[0], 0, "nothing was written");
        assert_eq!(d.timing().timeouts, 1);
    }

    /// A flush may take three command timeouts; a disk without a timeout
    /// waits as long as the disk does.
    #[tokio::test(start_paused = true)]
    async fn a_flush_gets_three_timeouts_and_an_untimed_disk_waits() {
        let limit = Duration::from_secs(20);
        let h = hangs();
        h.hang.store(true, Ordering::Relaxed);
        let d = TimedDisk::with_timeout(h.clone(), "d0", limit);
        let t = tokio::time::Instant::now();
        let e = d.flush().await.unwrap_err();
        assert_eq!(t.elapsed(), limit * FLUSH_TIMEOUT_FACTOR, "{e}");
        assert!(e.to_string().contains("flush"), "{e}");

        let untimed = TimedDisk::new(h.clone());
        let waited = tokio::time::timeout(Duration::from_secs(3600), untimed.read(0, 1)).await;
        assert!(waited.is_err(), "an untimed disk gave up");
        assert_eq!(untimed.timing().timeouts, 0);
    }
}
