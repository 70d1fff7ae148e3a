//! Destaging while the host keeps writing: the blocks of a batch take writes again
//! while their old copy goes to the backing volume, and nothing newer is ever
//! overwritten there by that older copy.

use async_trait::async_trait;
use block::{BlockResult, Bytes, Geometry, MemVolume, Volume, VolumeRef};
use cache::{CacheConfig, CacheDevice, CacheMode, CacheVolume};
use parking_lot::Mutex;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{Notify, Semaphore};

use crate::volume::Rng;

const BACKING_BLOCKS: u64 = 2048; // 8 MiB of 4K blocks
const BLOCK: u32 = 16 * 1024;

/// A backing volume whose writes can be held: a held write is logged as it
/// arrives and lands only once released. Discards are logged when they land.
struct Held {
    inner: MemVolume,
    hold: Mutex<bool>,
    release: Semaphore,
    arrived: Notify,
    /// ("write" | "discard", lba) in the order they reached the volume below.
    log: Mutex<Vec<(&'static str, u64)>>,
    /// Optimal I/O size reported, in 4K blocks (a RAID's stripe), if any.
    stripe_blocks: u32,
    /// Lengths of the writes that landed, in 4K blocks.
    lengths: Mutex<Vec<u64>>,
    /// Writes held so far.
    held: std::sync::atomic::AtomicUsize,
}

impl Held {
    fn new() -> Arc<Held> {
        Held::striped(0)
    }

    fn striped(stripe_blocks: u32) -> Arc<Held> {
        Arc::new(Held {
            stripe_blocks,
            lengths: Mutex::new(Vec::new()),
            held: Default::default(),
            inner: MemVolume::new(4096, BACKING_BLOCKS),
            hold: Mutex::new(false),
            release: Semaphore::new(0),
            arrived: Notify::new(),
            log: Mutex::new(Vec::new()),
        })
    }

    /// Writes covering `lba` that landed, in order, with the discards.
    fn landed(&self, lba: u64) -> Vec<&'static str> {
        self.log
            .lock()
            .iter()
            .filter(|(_, l)| *l == lba)
            .map(|(k, _)| *k)
            .collect()
    }
}

#[async_trait]
impl Volume for Held {
    fn geometry(&self) -> Geometry {
        let g = self.inner.geometry();
        if self.stripe_blocks == 0 {
            return g;
        }
        Geometry {
            optimal_io_blocks: self.stripe_blocks,
            max_io_blocks: g.max_io_blocks.max(self.stripe_blocks),
            ..g
        }
    }
    async fn read(&self, lba: u64, blocks: u32) -> BlockResult<Bytes> {
        self.inner.read(lba, blocks).await
    }
    async fn write(&self, lba: u64, data: Bytes, fua: bool) -> BlockResult<()> {
        if *self.hold.lock() {
            self.held.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            self.arrived.notify_waiters();
            self.release.acquire().await.unwrap().forget();
        }
        let blocks = data.len() as u64 / 4096;
        self.inner.write(lba, data, fua).await?;
        self.lengths.lock().push(blocks);
        let mut log = self.log.lock();
        for b in lba..lba + blocks {
            log.push(("write", b));
        }
        Ok(())
    }
    async fn flush(&self) -> BlockResult<()> {
        self.inner.flush().await
    }
    async fn discard(&self, lba: u64, blocks: u64) -> BlockResult<()> {
        self.inner.discard(lba, blocks).await?;
        let mut log = self.log.lock();
        for b in lba..lba + blocks {
            log.push(("discard", b));
        }
        Ok(())
    }
}

fn fill(byte: u8) -> Bytes {
    Bytes::from(vec![byte; 4096])
}

async fn open(backing: Arc<Held>) -> CacheVolume {
    open_with(backing, 0, 1 << 20).await
}

async fn open_with(backing: Arc<Held>, low: u8, size: u64) -> CacheVolume {
    open_on(backing, low, size).await
}

/// A write-back cache of `size` bytes on two memory SSDs in front of
/// `backing`, destaging from `low` percent dirty.
async fn open_on(backing: VolumeRef, low: u8, size: u64) -> CacheVolume {
    let cfg = CacheConfig {
        mode: CacheMode::WriteBack,
        block_bytes: BLOCK,
        size_bytes: Some(size),
        // 0: destage whatever is dirty, at once
        dirty_low_percent: low,
        dirty_high_percent: low.max(60),
        ..CacheConfig::default()
    };
    let ssds: Vec<CacheDevice> = (0..2)
        .map(|i| CacheDevice {
            name: format!("ssd{i}"),
            volume: Arc::new(MemVolume::new(4096, (size + (1 << 20)) / 4096)) as VolumeRef,
        })
        .collect();
    CacheVolume::open("t", backing, ssds, cfg).await.unwrap()
}

/// Writes `byte` at `lba` and waits until the destage's backing write of it is
/// held.
async fn write_and_hold_its_destage(vol: &CacheVolume, backing: &Held, lba: u64, byte: u8) {
    *backing.hold.lock() = true;
    let arrived = backing.arrived.notified();
    tokio::pin!(arrived);
    arrived.as_mut().enable();
    vol.write(lba, fill(byte), false).await.unwrap();
    tokio::time::timeout(Duration::from_secs(20), arrived)
        .await
        .expect("the destage writes the block to the backing volume");
    *backing.hold.lock() = false;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_block_written_while_it_is_destaged_takes_the_write_and_keeps_it() {
    let backing = Held::new();
    let vol = open(backing.clone()).await;
    write_and_hold_its_destage(&vol, &backing, 0, 1).await;
    // the destage of the old copy is stuck in the backing volume: a write to the
    // same block (same sector and the next one) does not wait for it
    tokio::time::timeout(Duration::from_secs(10), async {
        vol.write(0, fill(2), false).await.unwrap();
        vol.write(1, fill(3), false).await.unwrap();
    })
    .await
    .expect("a write to a block being destaged is not held behind the destage");
    assert_eq!(vol.read(0, 2).await.unwrap(), [fill(2), fill(3)].concat());
    // the old copy lands; the sectors written since stay dirty and follow it
    backing.release.add_permits(1 << 20);
    tokio::time::timeout(Duration::from_secs(30), vol.drain())
        .await
        .expect("drain")
        .unwrap();
    assert_eq!(
        backing.inner.read(0, 2).await.unwrap(),
        [fill(2), fill(3)].concat(),
        "the backing volume holds the newest data, not the destaged older copy"
    );
    assert_eq!(backing.landed(0), ["write", "write"], "old copy, then new");
    assert_eq!(vol.status().dirty_blocks, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_discard_of_a_block_being_destaged_lands_after_the_old_copy() {
    let backing = Held::new();
    let vol = Arc::new(open(backing.clone()).await);
    write_and_hold_its_destage(&vol, &backing, 8, 7).await;
    let v = vol.clone();
    let mut discard = tokio::spawn(async move { v.discard(8, 4).await });
    // with the old copy still on its way, the discard must not reach the backing
    // volume (it would then be overwritten by that copy): it waits
    assert!(
        tokio::time::timeout(Duration::from_millis(300), &mut discard)
            .await
            .is_err(),
        "the discard ended while the destage still had to write the block"
    );
    backing.release.add_permits(1 << 20);
    tokio::time::timeout(Duration::from_secs(20), discard)
        .await
        .expect("the discard ends once the destage did")
        .unwrap()
        .unwrap();
    assert_eq!(backing.landed(8), ["write", "discard"]);
    assert_eq!(vol.read(8, 1).await.unwrap(), fill(0));
    tokio::time::timeout(Duration::from_secs(30), vol.drain())
        .await
        .expect("drain")
        .unwrap();
    assert_eq!(backing.inner.read(8, 1).await.unwrap(), fill(0));
}

/// A backing "RAID" whose stripe is four 16K cache blocks (16 x 4K), holding data
/// the cache has never seen, and its oracle.
async fn striped_backing() -> (Arc<Held>, MemVolume) {
    let backing = Held::striped(16);
    let oracle = MemVolume::new(4096, BACKING_BLOCKS);
    let mut rng = Rng(0x5eed);
    for lba in (0..BACKING_BLOCKS).step_by(16) {
        let data: Vec<u8> = (0..16 * 4096).map(|_| rng.next() as u8).collect();
        backing
            .inner
            .write(lba, data.clone().into(), false)
            .await
            .unwrap();
        oracle.write(lba, data.into(), false).await.unwrap();
    }
    (backing, oracle)
}

/// 4K writes, two to four in each of `stripes` stripes, in separate cache blocks
/// and sectors, from four writers at once; the oracle gets them too.
async fn scattered_writes(vol: &Arc<CacheVolume>, oracle: &MemVolume, stripes: u64) {
    let mut writers = Vec::new();
    for w in 0..4u64 {
        let vol = vol.clone();
        writers.push(tokio::spawn(async move {
            let mut rng = Rng(w + 11);
            let mut wrote = Vec::new();
            for stripe in (w..stripes).step_by(4) {
                for _ in 0..2 + rng.next() % 3 {
                    let lba = stripe * 16 + rng.next() % 16;
                    let byte = (rng.next() % 250) as u8 + 1;
                    vol.write(lba, fill(byte), false).await.unwrap();
                    wrote.push((lba, byte));
                }
            }
            wrote
        }));
    }
    for w in writers {
        for (lba, byte) in w.await.unwrap() {
            oracle.write(lba, fill(byte), false).await.unwrap();
        }
    }
}

async fn drain_and_compare(vol: &CacheVolume, backing: &Held, oracle: &MemVolume) {
    tokio::time::timeout(Duration::from_secs(60), vol.drain())
        .await
        .expect("drain")
        .unwrap();
    for lba in (0..BACKING_BLOCKS).step_by(64) {
        assert!(
            backing.inner.read(lba, 64).await.unwrap() == oracle.read(lba, 64).await.unwrap(),
            "backing blocks {lba}..{} differ from what was written",
            lba + 64
        );
        assert!(vol.read(lba, 64).await.unwrap() == oracle.read(lba, 64).await.unwrap());
    }
}

/// Waits, as writes arrive held at the backing volume, until `cond` holds.
async fn until_held(backing: &Held, what: &str, cond: impl Fn() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let arrived = backing.arrived.notified();
        tokio::pin!(arrived);
        arrived.as_mut().enable();
        if cond() {
            return;
        }
        tokio::time::timeout_at(deadline, arrived)
            .await
            .unwrap_or_else(|_| panic!("{what}"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn while_writes_find_no_frame_a_stripe_goes_out_as_one_write_of_it() {
    let (backing, oracle) = striped_backing().await;
    // dirty until full: the destage starts when every frame is dirty
    let vol = Arc::new(open_with(backing.clone(), 100, 1 << 20).await);
    let frames = vol.status().frames as u64;
    assert!(frames >= 8 && frames * 4 + 16 < BACKING_BLOCKS);
    *backing.hold.lock() = true;
    // one sector in every frame's block, in a shuffled order (no stream)
    let mut keys: Vec<u64> = (0..frames).collect();
    let mut rng = Rng(7);
    for i in (1..keys.len()).rev() {
        keys.swap(i, (rng.next() % (i as u64 + 1)) as usize);
    }
    for &k in &keys {
        vol.write(k * 4, fill(k as u8 + 1), false).await.unwrap();
        oracle.write(k * 4, fill(k as u8 + 1), false).await.unwrap();
    }
    let st = vol.status();
    assert_eq!((st.dirty_blocks, st.frameless_writes), (frames, 0));
    // the destage takes them and is held at the backing volume
    until_held(
        &backing,
        "the destage never wrote to the backing volume",
        || backing.held.load(std::sync::atomic::Ordering::SeqCst) > 0,
    )
    .await;
    // a write to a block not cached finds every frame dirty or on its way out:
    // it goes to the backing volume itself (and is held there too)
    let v = vol.clone();
    let direct = tokio::spawn(async move { v.write((frames + 4) * 4, fill(0xee), false).await });
    oracle
        .write((frames + 4) * 4, fill(0xee), false)
        .await
        .unwrap();
    until_held(&backing, "the write never found every frame busy", || {
        vol.status().frameless_writes > 0
    })
    .await;
    // two blocks of stripe 0 written again, a sector each, while their old
    // copies are held: two backing writes in one stripe for the next batch
    tokio::time::timeout(Duration::from_secs(10), async {
        for lba in [1, 5] {
            vol.write(lba, fill(0xd0 + lba as u8), false).await.unwrap();
            oracle
                .write(lba, fill(0xd0 + lba as u8), false)
                .await
                .unwrap();
        }
    })
    .await
    .expect("writes to blocks being destaged do not wait for the destage");
    backing.release.add_permits(1 << 20);
    direct.await.unwrap().unwrap();
    drain_and_compare(&vol, &backing, &oracle).await;
    // the batch after the frameless write wrote stripe 0 whole
    let st = vol.status();
    let whole = backing.lengths.lock().iter().filter(|&&n| n == 16).count();
    assert!(
        st.stripe_destages >= 1 && whole as u64 >= st.stripe_destages,
        "{} stripes written whole, {whole} writes of 16 blocks",
        st.stripe_destages
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_that_outrun_the_destage_land_as_written() {
    let (backing, oracle) = striped_backing().await;
    // 64 frames, dirty until full, for writes over 512 blocks: however the
    // destage and the writers interleave, what lands is what was written, and
    // every stripe the destage counts as written whole was one write
    let vol = Arc::new(open_with(backing.clone(), 100, 1 << 20).await);
    scattered_writes(&vol, &oracle, BACKING_BLOCKS / 16).await;
    drain_and_compare(&vol, &backing, &oracle).await;
    let st = vol.status();
    let whole = backing.lengths.lock().iter().filter(|&&n| n == 16).count();
    assert!(
        whole as u64 >= st.stripe_destages,
        "{} stripes written whole, {whole} writes of 16 blocks",
        st.stripe_destages
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_frames_to_spare_the_destage_writes_only_what_is_dirty() {
    let (backing, oracle) = striped_backing().await;
    // room for every block written
    let vol = Arc::new(open_with(backing.clone(), 100, 4 << 20).await);
    scattered_writes(&vol, &oracle, 32).await;
    drain_and_compare(&vol, &backing, &oracle).await;
    let st = vol.status();
    assert_eq!(st.frameless_writes, 0);
    assert_eq!(
        st.stripe_destages, 0,
        "no stripe was read to be written whole"
    );
    // dirty sector runs, none longer than a cache block
    assert!(backing.lengths.lock().iter().all(|&n| n <= 4));
}

/// A detach drains the dirty data first; a backing volume that fails every
/// destage used to keep that drain (and the API call) waiting for ever. It
/// now ends with the backing's error after a few failed batches, the data
/// still dirty in the cache, and drains once the backing works again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_over_a_failing_backing_volume_ends_with_its_error() {
    let mem = Arc::new(MemVolume::new(4096, BACKING_BLOCKS));
    let backing = Arc::new(block::FaultVolume::new(mem.clone()));
    let plan = backing.plan();
    plan.lock().dead = true;
    // (destaging only once the drain asks: 90% dirty before the low mark)
    let vol = open_on(backing, 90, 1 << 20).await;
    vol.write(0, fill(9), false).await.unwrap();
    let r = tokio::time::timeout(Duration::from_secs(60), vol.drain())
        .await
        .expect("a drain over a failing backing volume ended");
    let e = r.expect_err("nothing reached the backing volume");
    assert!(e.to_string().contains("dead"), "{e}");
    assert!(vol.status().dirty_blocks > 0, "the data stays dirty");
    assert_eq!(vol.read(0, 1).await.unwrap(), fill(9));
    vol.undrain();
    plan.lock().dead = false;
    tokio::time::timeout(Duration::from_secs(60), vol.drain())
        .await
        .expect("drain")
        .unwrap();
    assert_eq!(mem.read(0, 1).await.unwrap(), fill(9));
}

/// A drain of more dirty blocks than one scan of the frames keeps (4
/// batches' worth, with batches of one cache block here), written in random
/// order: the destage writes them in block order, sweep after sweep, and all
/// of them (a guard for the sweep that replaced the scan of every frame at
/// every batch; it passes on the old code too).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_larger_than_one_scan_goes_out_in_block_order() {
    let backing = Held::new();
    let oracle = MemVolume::new(4096, BACKING_BLOCKS);
    let cfg = CacheConfig {
        mode: CacheMode::WriteBack,
        block_bytes: BLOCK,
        size_bytes: Some(4 << 20),
        dirty_low_percent: 100,
        dirty_high_percent: 100,
        destage_batch_bytes: BLOCK as u64,
        ..CacheConfig::default()
    };
    let ssds: Vec<CacheDevice> = (0..2)
        .map(|i| CacheDevice {
            name: format!("ssd{i}"),
            volume: Arc::new(MemVolume::new(4096, (5 << 20) / 4096)) as VolumeRef,
        })
        .collect();
    let vol = CacheVolume::open("t", backing.clone(), ssds, cfg)
        .await
        .unwrap();
    // one 4K write in each of 200 cache blocks (of 512), in a random order;
    // a destage that starts meanwhile (the volume idle for 100 ms: a stalled
    // test thread) is held and seen
    *backing.hold.lock() = true;
    let mut blocks: Vec<u64> = (0..BACKING_BLOCKS / 4).collect();
    let mut rng = Rng(7);
    for i in (1..blocks.len()).rev() {
        blocks.swap(i, (rng.next() % (i as u64 + 1)) as usize);
    }
    for (n, &b) in blocks[..200].iter().enumerate() {
        let byte = (n % 250) as u8 + 1;
        vol.write(b * 4, fill(byte), false).await.unwrap();
        oracle.write(b * 4, fill(byte), false).await.unwrap();
    }
    assert_eq!(vol.status().dirty_blocks, 200);
    let early = backing.held.load(std::sync::atomic::Ordering::SeqCst) > 0;
    *backing.hold.lock() = false;
    backing.release.add_permits(1 << 20);
    drain_and_compare(&vol, &backing, &oracle).await;
    let order: Vec<u64> = backing.log.lock().iter().map(|&(_, lba)| lba).collect();
    assert_eq!(order.len(), 200);
    // block order: one sweep from the start of the volume; a second may have
    // begun only if a scan ran during the writes (a stall of 100 ms of the
    // test thread) whose write arrived after the hold ended
    let descents = order.windows(2).filter(|w| w[0] >= w[1]).count();
    if early {
        eprintln!("a destage began before the writes ended: order not checked");
    } else {
        assert!(descents <= 1, "{order:?}");
    }
}
