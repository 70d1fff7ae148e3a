//! A volume whose lower volume can be exchanged while it serves I/O: how a LUN
//! gets an SSD cache attached or detached without the initiator noticing.
//!
//! Every request holds a shared lock on the current volume for its whole duration;
//! [`SwitchVolume::switch`] takes it exclusively, so it waits for the requests in
//! flight on the old volume, and requests that arrive meanwhile wait and then go to
//! the new one. No request ever sees both, which is what keeps a cache coherent: a
//! read that fills the cache from the backing can never race a write that went
//! around it. A write, discard or write-zeroes whose caller drops it keeps its
//! lock until it has ended below (`crate::detach`): the volume below does not
//! take back what it was handed, and a switch must wait for that too.

use crate::{BlockError, BlockResult, Bytes, Extent, Geometry, Volume, VolumeRef};
use async_trait::async_trait;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use tokio::sync::RwLock;

/// A volume that forwards to an exchangeable lower volume.
pub struct SwitchVolume {
    geometry: Geometry,
    /// The block count (it grows: [`Volume::grow`]).
    block_count: AtomicU64,
    current: Arc<RwLock<VolumeRef>>,
    /// One grow at a time (it holds `current` shared, as requests do).
    growing: tokio::sync::Mutex<()>,
}

impl SwitchVolume {
    /// Forwards to `inner` until switched; its geometry is the one reported.
    pub fn new(inner: VolumeRef) -> Self {
        let geometry = inner.geometry();
        SwitchVolume {
            geometry,
            block_count: AtomicU64::new(geometry.block_count),
            current: Arc::new(RwLock::new(inner)),
            growing: tokio::sync::Mutex::new(()),
        }
    }

    /// The volume requests go to now.
    pub async fn current(&self) -> VolumeRef {
        self.current.read().await.clone()
    }

    /// Sends every later request to `next` once the requests in flight have
    /// finished; returns the previous volume. `next` must have the same block size
    /// and block count.
    pub async fn switch(&self, next: VolumeRef) -> BlockResult<VolumeRef> {
        let g = next.geometry();
        let mut cur = self.current.write().await;
        let have = self.geometry();
        if g.block_size_bytes != have.block_size_bytes || g.block_count != have.block_count {
            return Err(BlockError::Unavailable(format!(
                "cannot switch to a volume of {} blocks of {} bytes (this one has {} of {})",
                g.block_count, g.block_size_bytes, have.block_count, have.block_size_bytes
            )));
        }
        Ok(std::mem::replace(&mut *cur, next))
    }
}

#[async_trait]
impl Volume for SwitchVolume {
    fn geometry(&self) -> Geometry {
        Geometry {
            block_count: self.block_count.load(Ordering::Acquire),
            ..self.geometry
        }
    }
    /// The current volume's, unless a switch is under way.
    fn provisioning(&self) -> Option<crate::Provisioning> {
        self.current.try_read().ok()?.provisioning()
    }
    /// Grows the current volume (no switch meanwhile), then reports its size.
    /// Requests go on while it grows: a grow below can take long (a pool
    /// zeroes its new stripes first), and holding `current` exclusively
    /// stopped every read and write of the LUN for all of it (review of
    /// 2026-12-06); the old blocks do not move.
    async fn grow(&self, block_count: u64) -> BlockResult<()> {
        let _one = self.growing.lock().await;
        let cur = self.current.read().await;
        cur.grow(block_count).await?;
        let now = cur.geometry().block_count;
        self.block_count
            .fetch_max(now.min(block_count), Ordering::AcqRel);
        Ok(())
    }
    async fn read(&self, lba: u64, blocks: u32) -> BlockResult<Bytes> {
        self.current.read().await.read(lba, blocks).await
    }
    async fn write(&self, lba: u64, data: Bytes, fua: bool) -> BlockResult<()> {
        let cur = self.current.clone().read_owned().await;
        crate::detach::detached(async move { cur.write(lba, data, fua).await }).await
    }
    async fn flush(&self) -> BlockResult<()> {
        self.current.read().await.flush().await
    }
    async fn discard(&self, lba: u64, blocks: u64) -> BlockResult<()> {
        let cur = self.current.clone().read_owned().await;
        crate::detach::detached(async move { cur.discard(lba, blocks).await }).await
    }
    async fn write_zeroes(&self, lba: u64, blocks: u64, may_unmap: bool) -> BlockResult<()> {
        let cur = self.current.clone().read_owned().await;
        crate::detach::detached(async move { cur.write_zeroes(lba, blocks, may_unmap).await }).await
    }
    async fn block_status(&self, lba: u64, blocks: u64) -> BlockResult<Vec<Extent>> {
        self.current.read().await.block_status(lba, blocks).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{DelayVolume, HoldVolume, MemVolume};
    use std::time::Duration;

    /// A write whose caller gave up while the volume below still had it is
    /// waited for by a switch all the same: the volume below lands it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_switch_waits_for_a_write_its_caller_gave_up() {
        let mem = Arc::new(MemVolume::new(512, 64));
        let held = Arc::new(HoldVolume::queued(mem.clone()));
        let sw = Arc::new(SwitchVolume::new(held.clone()));
        held.writes.hold();
        let data = Bytes::from(vec![7u8; 512]);
        let w = {
            let (sw, data) = (sw.clone(), data.clone());
            tokio::spawn(async move { sw.write(3, data, false).await })
        };
        held.writes.arrivals(1).await;
        w.abort();
        assert!(w.await.unwrap_err().is_cancelled());
        let mut switch = {
            let sw = sw.clone();
            tokio::spawn(async move { sw.switch(Arc::new(MemVolume::new(512, 64))).await })
        };
        // a switch that does not wait returns within the second; one that
        // does waits for the release
        let early = tokio::time::timeout(Duration::from_secs(1), &mut switch).await;
        let landed =
            |m: Arc<MemVolume>| async move { m.read(3, 1).await.unwrap() == vec![7u8; 512] };
        if early.is_ok() {
            assert!(
                landed(mem.clone()).await,
                "the switch went on while the old volume still had a write"
            );
        }
        held.writes.open();
        if early.is_err() {
            switch.await.unwrap().unwrap();
        }
        assert!(landed(mem).await);
    }

    #[tokio::test]
    async fn a_switch_waits_for_requests_in_flight_and_later_ones_go_to_the_new_volume() {
        let slow: VolumeRef = Arc::new(DelayVolume::new(
            Arc::new(MemVolume::new(512, 64)),
            Duration::from_millis(50),
            Duration::from_millis(50),
        ));
        let other: VolumeRef = Arc::new(MemVolume::new(512, 64));
        let sw = Arc::new(SwitchVolume::new(slow.clone()));
        let w = {
            let sw = sw.clone();
            tokio::spawn(async move { sw.write(0, Bytes::from(vec![1u8; 512]), false).await })
        };
        // the write holds the old volume: the switch completes only after it
        tokio::task::yield_now().await;
        let old = sw.switch(other.clone()).await.unwrap();
        assert!(
            w.is_finished(),
            "switch returned before the write in flight ended"
        );
        w.await.unwrap().unwrap();
        assert!(Arc::ptr_eq(&old, &slow));
        assert_eq!(&slow.read(0, 1).await.unwrap()[..], &[1u8; 512][..]);
        sw.write(1, Bytes::from(vec![2u8; 512]), false)
            .await
            .unwrap();
        assert_eq!(&other.read(1, 1).await.unwrap()[..], &[2u8; 512][..]);
        assert_eq!(&slow.read(1, 1).await.unwrap()[..], &[0u8; 512][..]);
        // a volume of another shape is refused
        let small: VolumeRef = Arc::new(MemVolume::new(512, 32));
        assert!(sw.switch(small).await.is_err());
    }

    #[tokio::test]
    async fn growing_grows_the_current_volume_and_a_switch_needs_the_new_size() {
        let a: VolumeRef = Arc::new(MemVolume::new(512, 64));
        let sw = SwitchVolume::new(a.clone());
        sw.grow(128).await.unwrap();
        assert_eq!(sw.geometry().block_count, 128);
        assert_eq!(a.geometry().block_count, 128);
        sw.write(127, Bytes::from(vec![3u8; 512]), false)
            .await
            .unwrap();
        let small: VolumeRef = Arc::new(MemVolume::new(512, 64));
        assert!(sw.switch(small).await.is_err(), "a volume of the old size");
        let big: VolumeRef = Arc::new(MemVolume::new(512, 128));
        sw.switch(big).await.unwrap();
        assert!(sw.grow(32).await.is_err(), "no shrinking");
    }

    /// A volume whose grow waits until `go` lets it end.
    struct SlowGrow {
        inner: MemVolume,
        started: tokio::sync::Notify,
        go: tokio::sync::Notify,
    }

    #[async_trait]
    impl Volume for SlowGrow {
        fn geometry(&self) -> Geometry {
            self.inner.geometry()
        }
        async fn grow(&self, block_count: u64) -> BlockResult<()> {
            self.started.notify_one();
            self.go.notified().await;
            self.inner.grow(block_count).await
        }
        async fn read(&self, lba: u64, blocks: u32) -> BlockResult<Bytes> {
            self.inner.read(lba, blocks).await
        }
        async fn write(&self, lba: u64, data: Bytes, fua: bool) -> BlockResult<()> {
            self.inner.write(lba, data, fua).await
        }
        async fn flush(&self) -> BlockResult<()> {
            Ok(())
        }
        async fn discard(&self, lba: u64, blocks: u64) -> BlockResult<()> {
            self.inner.discard(lba, blocks).await
        }
    }

    /// Reads and writes go on while the volume below grows (a pool zeroing
    /// its new stripes can take minutes); the new size shows once it has
    /// grown. Before (review of 2026-12-06) the grow held every request.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn requests_go_on_while_the_volume_below_grows() {
        let below = Arc::new(SlowGrow {
            inner: MemVolume::new(512, 64),
            started: tokio::sync::Notify::new(),
            go: tokio::sync::Notify::new(),
        });
        let sw = Arc::new(SwitchVolume::new(below.clone()));
        let grow = {
            let sw = sw.clone();
            tokio::spawn(async move { sw.grow(128).await })
        };
        below.started.notified().await;
        // (a time bound only to fail instead of hanging)
        let io = tokio::time::timeout(Duration::from_secs(20), async {
            sw.write(3, Bytes::from(vec![5u8; 512]), false)
                .await
                .unwrap();
            sw.read(3, 1).await.unwrap()
        })
        .await
        .expect("requests waited for the grow below");
        assert_eq!(&io[..], &[5u8; 512][..]);
        assert_eq!(
            sw.geometry().block_count,
            64,
            "grown before the volume below"
        );
        below.go.notify_one();
        grow.await.unwrap().unwrap();
        assert_eq!(sw.geometry().block_count, 128);
    }
}
