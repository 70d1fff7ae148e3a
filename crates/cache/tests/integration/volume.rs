//! The cache volume against an oracle, across modes, crashes and device failures.

use async_trait::async_trait;
use block::{
    BlockResult, Bytes, CrashSimVolume, FaultVolume, Geometry, MemVolume, Volume, VolumeRef,
};
use cache::{CacheConfig, CacheDevice, CacheMode, CacheVolume};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Semaphore;

const BACKING_BYTES: u64 = 8 << 20;
const BLOCK: u32 = 16 * 1024;

pub(crate) struct Rng(pub(crate) u64);
impl Rng {
    pub(crate) fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn cfg(mode: CacheMode) -> CacheConfig {
    CacheConfig {
        mode,
        block_bytes: BLOCK,
        // small enough that the workload evicts
        size_bytes: Some(1 << 20),
        // the random workloads below issue up to 384K requests in a 2 MiB hot region:
        // only a long run counts as a stream
        seq_cutoff_bytes: 4 << 20,
        ..CacheConfig::default()
    }
}

fn devices(vols: &[VolumeRef]) -> Vec<CacheDevice> {
    vols.iter()
        .enumerate()
        .map(|(i, v)| CacheDevice {
            name: format!("ssd{i}"),
            volume: v.clone(),
        })
        .collect()
}

/// Replaces cache device `index` of `vol` with `volume`, named `name`.
async fn replace(vol: &CacheVolume, index: usize, name: &str, volume: VolumeRef) {
    vol.replace_device(
        index,
        CacheDevice {
            name: name.into(),
            volume,
        },
    )
    .await
    .unwrap();
}

/// Polls `vol`'s status (every 20 ms, at most `secs` seconds) until `done`
/// holds; `what` says what never happened otherwise.
async fn status_until(
    vol: &CacheVolume,
    secs: u64,
    what: &str,
    done: impl Fn(&cache::CacheStatus) -> bool,
) {
    tokio::time::timeout(Duration::from_secs(secs), async {
        while !done(&vol.status()) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{what}"));
}

/// Distinct seeds give distinct patterns (`seed | 1` made 2 and 3 alike).
fn pattern(seed: u64, len: usize) -> Bytes {
    let mut r = Rng(seed.wrapping_mul(2) | 1);
    Bytes::from((0..len).map(|_| r.next() as u8).collect::<Vec<u8>>())
}

/// Random reads, writes (aligned and not), discards and flushes; every read must
/// match the oracle. Returns the number of reads checked.
async fn exercise(vol: &dyn Volume, oracle: &MemVolume, seed: u64, ops: usize) -> usize {
    let g = vol.geometry();
    let bs = g.block_size_bytes as u64;
    let blocks = g.block_count;
    let mut rng = Rng(seed);
    let mut reads = 0;
    for i in 0..ops {
        // most I/O within a hot quarter, some anywhere, some long sequential runs
        let lba = match rng.below(10) {
            0..=5 => rng.below(blocks / 4),
            6..=8 => rng.below(blocks),
            _ => (i as u64 * 64) % blocks,
        };
        let max = (blocks - lba).min(96);
        let n = 1 + rng.below(max);
        match rng.below(10) {
            0..=4 => {
                let got = vol.read(lba, n as u32).await.unwrap();
                let want = oracle.read(lba, n as u32).await.unwrap();
                assert!(got == want, "read {lba}+{n} differs (op {i})");
                reads += 1;
            }
            5..=8 => {
                let data = pattern(rng.next(), (n * bs) as usize);
                let fua = rng.below(4) == 0;
                vol.write(lba, data.clone(), fua).await.unwrap();
                oracle.write(lba, data, false).await.unwrap();
            }
            _ => {
                vol.flush().await.unwrap();
            }
        }
    }
    reads
}

/// `n` 4K writes at random blocks of the first quarter of the volume,
/// through `vol` and to `oracle`.
async fn small_writes(vol: &dyn Volume, oracle: &MemVolume, rng: &mut Rng, n: usize) {
    for _ in 0..n {
        let lba = rng.below(BACKING_BYTES / 4096 / 4);
        let data = pattern(rng.next(), 4096);
        vol.write(lba, data.clone(), false).await.unwrap();
        oracle.write(lba, data, false).await.unwrap();
    }
}

async fn verify_all(vol: &dyn Volume, oracle: &MemVolume) {
    let g = vol.geometry();
    let step = 128u64;
    let mut lba = 0;
    while lba < g.block_count {
        let n = step.min(g.block_count - lba) as u32;
        let got = vol.read(lba, n).await.unwrap();
        let want = oracle.read(lba, n).await.unwrap();
        assert!(got == want, "block range {lba}+{n} differs");
        lba += n as u64;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_mode_reads_back_what_was_written() {
    for bs in [512u32, 4096] {
        for mode in [
            CacheMode::ReadOnly,
            CacheMode::WriteThrough,
            CacheMode::WriteAround,
            CacheMode::WriteBack,
        ] {
            let blocks = BACKING_BYTES / bs as u64;
            let backing: VolumeRef = Arc::new(MemVolume::new(bs, blocks));
            let n = if mode == CacheMode::WriteBack { 2 } else { 3 };
            let ssds: Vec<VolumeRef> = (0..n)
                .map(|_| Arc::new(MemVolume::new(4096, 1 << 10)) as VolumeRef)
                .collect();
            let oracle = MemVolume::new(bs, blocks);
            let vol = CacheVolume::open("t", backing.clone(), devices(&ssds), cfg(mode))
                .await
                .unwrap();
            let reads = exercise(&vol, &oracle, 42 + bs as u64, 3000).await;
            assert!(reads > 1000);
            let st = vol.status();
            assert!(st.read_hits > 0, "{mode}: no read hit at all");
            assert!(st.cached_blocks > 0);
            verify_all(&vol, &oracle).await;
            // everything reaches the backing volume after a drain
            vol.drain().await.unwrap();
            assert_eq!(vol.status().dirty_blocks, 0);
            verify_all(backing.as_ref(), &oracle).await;
            if mode == CacheMode::WriteBack {
                assert!(vol.status().destaged_bytes > 0);
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_back_survives_power_loss_of_both_ssds() {
    let backing = Arc::new(CrashSimVolume::new(4096, BACKING_BYTES / 4096));
    let ssds: Vec<Arc<CrashSimVolume>> = (0..2)
        .map(|_| Arc::new(CrashSimVolume::new(4096, 1 << 10)))
        .collect();
    let ssd_refs: Vec<VolumeRef> = ssds.iter().map(|s| s.clone() as VolumeRef).collect();
    let oracle = MemVolume::new(4096, BACKING_BYTES / 4096);
    let mut c = cfg(CacheMode::WriteBack);
    // keep most data dirty in the cache
    c.dirty_low_percent = 90;
    c.dirty_high_percent = 95;
    for round in 0..4u64 {
        let vol = CacheVolume::open("t", backing.clone(), devices(&ssd_refs), c.clone())
            .await
            .unwrap();
        if round > 0 {
            // what was acknowledged before the crash is all there
            verify_all(&vol, &oracle).await;
        }
        let mut rng = Rng(round + 7);
        // bursts of writes until some are dirty in the cache when the power goes
        // (an idle destage may drain a burst on a loaded machine); bounded in count
        for burst in 0..10 {
            for _ in 0..400 {
                let lba = rng.below(BACKING_BYTES / 4096 / 4);
                let n = 1 + rng.below(8);
                let data = pattern(rng.next(), (n * 4096) as usize);
                vol.write(lba, data.clone(), false).await.unwrap();
                oracle.write(lba, data, false).await.unwrap();
            }
            if vol.status().dirty_blocks > 0 {
                break;
            }
            assert!(burst < 9, "round {round}: nothing dirty after 10 bursts");
        }
        // the backing volume has a volatile cache, which the cache volume reports:
        // writes that went straight to it are durable after a flush. The flush does
        // not touch the SSDs: what is dirty there must already be durable.
        vol.flush().await.unwrap();
        // power loss: nothing volatile survives anywhere, no clean shutdown, and
        // no task of the old volume writes after it (dropping only asks them to
        // stop: one still inside a poll on the other worker would carry on)
        vol.halt().await;
        drop(vol);
        for s in &ssds {
            s.crash();
        }
        backing.crash();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn losing_one_mirror_ssd_loses_nothing_and_goes_write_through() {
    let backing: VolumeRef = Arc::new(MemVolume::new(4096, BACKING_BYTES / 4096));
    let faulty = [fault_ssd(), fault_ssd()];
    let refs: Vec<VolumeRef> = faulty.iter().map(|f| f.clone() as VolumeRef).collect();
    let oracle = MemVolume::new(4096, BACKING_BYTES / 4096);
    let mut c = cfg(CacheMode::WriteBack);
    c.dirty_low_percent = 90;
    c.dirty_high_percent = 95;
    let vol = CacheVolume::open("t", backing.clone(), devices(&refs), c)
        .await
        .unwrap();
    exercise(&vol, &oracle, 9, 800).await;
    assert!(vol.status().dirty_blocks > 0);
    // the first SSD dies under I/O
    faulty[0].plan().lock().dead = true;
    exercise(&vol, &oracle, 10, 1500).await;
    let st = vol.status();
    assert!(st.state.starts_with("degraded"), "{}", st.state);
    assert_eq!(st.devices[0].state, "failed");
    verify_all(&vol, &oracle).await;
    // the survivor destages everything on its own
    status_until(&vol, 30, "destage from the survivor", |s| {
        s.dirty_blocks == 0
    })
    .await;
    verify_all(backing.as_ref(), &oracle).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_backing_volume_keeps_dirty_data_and_reports_it() {
    let fault = Arc::new(FaultVolume::new(Arc::new(MemVolume::new(
        4096,
        BACKING_BYTES / 4096,
    ))));
    let ssds: Vec<VolumeRef> = (0..2)
        .map(|_| Arc::new(MemVolume::new(4096, 1 << 10)) as VolumeRef)
        .collect();
    let oracle = MemVolume::new(4096, BACKING_BYTES / 4096);
    let mut c = cfg(CacheMode::WriteBack);
    c.dirty_low_percent = 0;
    let vol = CacheVolume::open("t", fault.clone(), devices(&ssds), c)
        .await
        .unwrap();
    #[allow(clippy::single_range_in_vec_init)]
    let everything = vec![0..u64::MAX];
    fault.plan().lock().bad_write_blocks = everything;
    for i in 0..20u64 {
        let data = pattern(i, 8192);
        vol.write(i * 2, data.clone(), false).await.unwrap();
        oracle.write(i * 2, data, false).await.unwrap();
    }
    status_until(&vol, 20, "destage errors are reported", |s| {
        s.destage_errors > 0
    })
    .await;
    let st = vol.status();
    assert!(st.dirty_blocks > 0, "dirty data must stay");
    for i in 0..20u64 {
        assert!(vol.read(i * 2, 2).await.unwrap() == oracle.read(i * 2, 2).await.unwrap());
    }
    // the disk comes back: everything lands
    fault.plan().lock().bad_write_blocks.clear();
    tokio::time::timeout(Duration::from_secs(30), vol.drain())
        .await
        .unwrap()
        .unwrap();
    for i in 0..20u64 {
        assert!(fault.read(i * 2, 2).await.unwrap() == oracle.read(i * 2, 2).await.unwrap());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clean_restart_keeps_a_read_cache_warm_and_a_crash_starts_it_empty() {
    let backing: VolumeRef = Arc::new(MemVolume::new(4096, BACKING_BYTES / 4096));
    let ssds: Vec<VolumeRef> = (0..2)
        .map(|_| Arc::new(MemVolume::new(4096, 1 << 10)) as VolumeRef)
        .collect();
    let oracle = MemVolume::new(4096, BACKING_BYTES / 4096);
    let c = cfg(CacheMode::ReadOnly);
    let vol = CacheVolume::open("t", backing.clone(), devices(&ssds), c.clone())
        .await
        .unwrap();
    exercise(&vol, &oracle, 3, 1000).await;
    let before = vol.status();
    assert!(before.cached_blocks > 10 && before.valid_bytes > 0);
    vol.shutdown().await.unwrap();
    drop(vol);
    let vol = CacheVolume::open("t", backing.clone(), devices(&ssds), c.clone())
        .await
        .unwrap();
    let after = vol.status();
    assert_eq!(
        after.valid_bytes, before.valid_bytes,
        "warm after a clean restart"
    );
    assert!(after.cached_blocks > 10);
    verify_all(&vol, &oracle).await;
    assert!(vol.status().read_hits > 0);
    // a crash (no shutdown): a read cache cannot trust its map and starts empty
    vol.halt().await;
    drop(vol);
    let vol = CacheVolume::open("t", backing.clone(), devices(&ssds), c)
        .await
        .unwrap();
    assert_eq!(vol.status().cached_blocks, 0);
    verify_all(&vol, &oracle).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sequential_streams_bypass_the_cache() {
    let backing: VolumeRef = Arc::new(MemVolume::new(4096, BACKING_BYTES / 4096));
    let ssds: Vec<VolumeRef> = vec![Arc::new(MemVolume::new(4096, 1 << 10))];
    let mut c = cfg(CacheMode::ReadOnly);
    c.seq_cutoff_bytes = 256 * 1024;
    let vol = CacheVolume::open("t", backing, devices(&ssds), c)
        .await
        .unwrap();
    for i in 0..64u64 {
        vol.read(i * 16, 16).await.unwrap();
    }
    let st = vol.status();
    // the first 256K of the stream go through the cache, the rest bypass
    assert_eq!(st.bypassed_reads, 64 - 4, "{st:?}");
    assert!(st.fills <= 4 * 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dirty_cache_refuses_another_shape() {
    dirty_cache_refuses_another_shape(false).await;
}

/// A clean stop of a write-back cache keeps its dirty blocks on the SSDs (it
/// writes the whole table and does not destage): a new shape must be refused
/// then too. It used to be asked only after an unclean stop, so the cache
/// started empty and erased the acknowledged dirty data.
#[tokio::test]
async fn a_cleanly_stopped_dirty_cache_refuses_another_shape() {
    dirty_cache_refuses_another_shape(true).await;
}

/// A memory backing volume, two memory SSDs, and a write-back configuration
/// that destages only at 90% dirty.
fn write_back_on_two_ssds() -> (VolumeRef, Vec<VolumeRef>, CacheConfig) {
    let backing: VolumeRef = Arc::new(MemVolume::new(4096, BACKING_BYTES / 4096));
    let ssds: Vec<VolumeRef> = (0..2)
        .map(|_| Arc::new(MemVolume::new(4096, 1 << 10)) as VolumeRef)
        .collect();
    (backing, ssds, dirty_kept())
}

/// A write-back cache over `backing` on `ssds` that destages only at 90%
/// dirty, opened; with its configuration, to open it again.
async fn open_dirty_kept(backing: &VolumeRef, ssds: &[VolumeRef]) -> (CacheVolume, CacheConfig) {
    let c = dirty_kept();
    let vol = CacheVolume::open("t", backing.clone(), devices(ssds), c.clone())
        .await
        .unwrap();
    (vol, c)
}

/// A memory backing volume behind a fault layer.
fn faulty_backing() -> Arc<FaultVolume> {
    Arc::new(FaultVolume::new(Arc::new(MemVolume::new(
        4096,
        BACKING_BYTES / 4096,
    ))))
}

/// A write-back configuration that destages only at 90% dirty.
fn dirty_kept() -> CacheConfig {
    let mut c = cfg(CacheMode::WriteBack);
    c.dirty_low_percent = 90;
    c.dirty_high_percent = 95;
    c
}

/// [`write_back_on_two_ssds`] with a backing id, opened.
async fn named_write_back(id: u128) -> (VolumeRef, Vec<VolumeRef>, CacheConfig, CacheVolume) {
    let (backing, ssds, mut c) = write_back_on_two_ssds();
    c.backing_id = id;
    let vol = CacheVolume::open("t", backing.clone(), devices(&ssds), c.clone())
        .await
        .unwrap();
    (backing, ssds, c, vol)
}

/// Dirty data written, the cache stopped (cleanly or not); opened with
/// another block size it refuses, and opened as it was it has the data.
async fn dirty_cache_refuses_another_shape(clean_stop: bool) {
    let (backing, ssds, c) = write_back_on_two_ssds();
    let vol = CacheVolume::open("t", backing.clone(), devices(&ssds), c.clone())
        .await
        .unwrap();
    vol.write(0, pattern(1, 4096), false).await.unwrap();
    if clean_stop {
        vol.shutdown().await.unwrap();
        assert!(vol.status().dirty_blocks > 0, "the stop destaged");
    }
    drop(vol);
    let mut other = c.clone();
    other.block_bytes = 64 * 1024;
    assert!(
        CacheVolume::open("t", backing.clone(), devices(&ssds), other)
            .await
            .is_err(),
        "opened under another shape over dirty data"
    );
    let vol = CacheVolume::open("t", backing, devices(&ssds), c)
        .await
        .unwrap();
    assert_eq!(vol.read(0, 1).await.unwrap(), pattern(1, 4096));
}

/// A write-back cache holding dirty data, pointed (its devices unchanged) at
/// another volume of the same size, as a configuration naming another pool
/// does: it refuses to open, and destages nothing into that volume, until it
/// is pointed back, where its data is all there.
#[tokio::test]
async fn a_dirty_cache_pointed_at_another_volume_refuses_to_open() {
    let (backing, ssds, c, vol) = named_write_back(0xa11ce).await;
    vol.write(0, pattern(1, 4096), false).await.unwrap();
    drop(vol); // a crash: the dirty block stays on the SSDs
    let other: VolumeRef = Arc::new(MemVolume::new(4096, BACKING_BYTES / 4096));
    let mut elsewhere = c.clone();
    elsewhere.backing_id = 0xb0b;
    let e = CacheVolume::open("t", other.clone(), devices(&ssds), elsewhere)
        .await
        .err()
        .expect("opened over another volume's dirty data");
    assert!(format!("{e}").contains("another backing volume"), "{e}");
    assert_eq!(other.read(0, 1).await.unwrap(), vec![0u8; 4096]);
    let vol = CacheVolume::open("t", backing.clone(), devices(&ssds), c)
        .await
        .unwrap();
    assert_eq!(vol.status().dirty_blocks, 1);
    assert_eq!(vol.read(0, 1).await.unwrap(), pattern(1, 4096));
}

/// The backing volume was served without the cache since its table was
/// written (`table_stale`, from freesan's record of fronts): a clean table
/// starts empty (its blocks may be older than the volume), and dirty data
/// refuses the open (destaged, it would overwrite newer writes), leaving the
/// volume as it is.
#[tokio::test]
async fn a_stale_table_starts_empty_and_stale_dirty_data_refuses_to_open() {
    let (backing, ssds, c, vol) = named_write_back(0xa11ce).await;
    vol.write(0, pattern(1, 4096), false).await.unwrap();
    drop(vol); // a crash: the dirty block stays on the SSDs
    backing.write(0, pattern(2, 4096), true).await.unwrap(); // written without it
    let stale = CacheConfig {
        table_stale: true,
        ..c.clone()
    };
    let e = CacheVolume::open("t", backing.clone(), devices(&ssds), stale.clone())
        .await
        .err()
        .expect("opened with dirty data older than the volume");
    assert!(format!("{e}").contains("served without this cache"), "{e}");
    assert_eq!(backing.read(0, 1).await.unwrap(), pattern(2, 4096));
    // clean (destaged and stopped), then the volume written without it
    let vol = CacheVolume::open("t", backing.clone(), devices(&ssds), c.clone())
        .await
        .unwrap();
    vol.write(0, pattern(3, 4096), false).await.unwrap();
    vol.drain().await.unwrap();
    assert_eq!(vol.status().dirty_blocks, 0);
    assert!(vol.status().cached_blocks > 0);
    vol.shutdown().await.unwrap();
    backing.write(0, pattern(4, 4096), true).await.unwrap();
    let vol = CacheVolume::open("t", backing.clone(), devices(&ssds), stale)
        .await
        .unwrap();
    assert_eq!(vol.status().cached_blocks, 0);
    assert_eq!(vol.read(0, 1).await.unwrap(), pattern(4, 4096));
}

/// A write-back cache in front of `backing` on two new SSDs, opened and
/// stopped cleanly `cycles` times (each start and stop writes its superblocks
/// at a higher generation), then, if `dirty`, written and crashed: its second
/// SSD, to be put in another cache's place.
async fn used_ssd(backing: VolumeRef, backing_id: u128, cycles: usize, dirty: bool) -> VolumeRef {
    let (_, ssds, mut c) = write_back_on_two_ssds();
    c.backing_id = backing_id;
    for _ in 0..cycles {
        let vol = CacheVolume::open("used", backing.clone(), devices(&ssds), c.clone())
            .await
            .unwrap();
        vol.shutdown().await.unwrap();
    }
    if dirty {
        let vol = CacheVolume::open("used", backing.clone(), devices(&ssds), c.clone())
            .await
            .unwrap();
        vol.write(8, pattern(9, 4096), false).await.unwrap();
        drop(vol);
    }
    ssds[1].clone()
}

/// The first 64 KiB of `v` (superblocks and the start of the table).
async fn head(v: &VolumeRef) -> Bytes {
    v.read(0, 16).await.unwrap()
}

/// A mirror half swapped, while the node was down, for a used SSD of another
/// cache whose superblock is at a higher generation: the half that holds the
/// dirty data keeps its table (it used to lose to the other cache's newer
/// copy, which either started the cache empty or failed the half).
/// - used SSD of a cache of another volume, no dirty data: the cache starts
///   degraded with every acknowledged write;
/// - the same with dirty data (that volume's acknowledged writes): refused,
///   the device untouched;
/// - used SSD of another cache of this volume, no dirty data: as the first;
/// - the same with dirty data: either could hold the only copy of
///   acknowledged writes: refused, the devices untouched.
#[tokio::test]
async fn a_used_ssd_swapped_in_while_down_never_outranks_the_half_holding_the_data() {
    let (backing, ssds, c, vol) = named_write_back(0xa11ce).await;
    vol.write(0, pattern(1, 4096), false).await.unwrap();
    drop(vol); // a crash: the dirty block's only copies are on the SSDs

    let other: VolumeRef = Arc::new(MemVolume::new(4096, BACKING_BYTES / 4096));
    for (volume, id, why) in [
        (&other, 0xb0b, "another volume"),
        (&backing, 0xa11ce, "this volume"),
    ] {
        let used = used_ssd(volume.clone(), id, 4, false).await;
        let swapped = devices(&[ssds[0].clone(), used]);
        let vol = CacheVolume::open("t", backing.clone(), swapped, c.clone())
            .await
            .unwrap_or_else(|e| panic!("{why}: {e}"));
        let st = vol.status();
        assert_eq!(st.dirty_blocks, 1, "{why}: the dirty block was dropped");
        assert_eq!(
            st.devices[1].state, "failed",
            "{why}: the other cache's SSD was taken"
        );
        assert_eq!(vol.read(0, 1).await.unwrap(), pattern(1, 4096));
        drop(vol);

        let used = used_ssd(volume.clone(), id, 4, true).await;
        let before = (head(&ssds[0]).await, head(&used).await);
        let e = CacheVolume::open(
            "t",
            backing.clone(),
            devices(&[ssds[0].clone(), used.clone()]),
            c.clone(),
        )
        .await
        .err()
        .unwrap_or_else(|| panic!("{why}: took one of two caches holding dirty data"));
        let said = if id == 0xb0b {
            "another backing volume"
        } else {
            "two different caches"
        };
        assert!(format!("{e}").contains(said), "{why}: {e}");
        assert!(
            (head(&ssds[0]).await, head(&used).await) == before,
            "{why}: a refused start wrote to the devices"
        );
    }
    // the original halves still open with the data (the second half, failed
    // by the first start above, is left out)
    let vol = CacheVolume::open("t", backing.clone(), devices(&ssds), c)
        .await
        .unwrap();
    assert_eq!(vol.status().dirty_blocks, 1);
    assert_eq!(vol.read(0, 1).await.unwrap(), pattern(1, 4096));
    assert_eq!(
        other.read(8, 1).await.unwrap(),
        vec![0u8; 4096],
        "destaged into another volume"
    );
}

/// A write-back mirror stopped cleanly with nothing dirty, one half swapped
/// for a blank SSD and the block size changed while down: it starts empty,
/// with the blank half failed, so it runs write-through until that half is
/// replaced (it used to take writes back on one copy, its state "ok").
#[tokio::test]
async fn a_mirror_starting_empty_with_a_half_missing_runs_write_through() {
    let (backing, ssds, c) = write_back_on_two_ssds();
    let vol = CacheVolume::open("t", backing.clone(), devices(&ssds), c.clone())
        .await
        .unwrap();
    vol.shutdown().await.unwrap();
    drop(vol);
    let blank: VolumeRef = Arc::new(MemVolume::new(4096, 1 << 10));
    let mut reshaped = c.clone();
    reshaped.block_bytes = 2 * BLOCK;
    let vol = CacheVolume::open(
        "t",
        backing.clone(),
        devices(&[ssds[0].clone(), blank]),
        reshaped,
    )
    .await
    .unwrap();
    let st = vol.status();
    assert_eq!(st.devices[1].state, "failed", "{st:?}");
    assert!(st.state.starts_with("degraded"), "{st:?}");
    vol.write(0, pattern(1, 4096), false).await.unwrap();
    assert_eq!(vol.status().dirty_blocks, 0, "written back on one copy");
    assert_eq!(backing.read(0, 1).await.unwrap(), pattern(1, 4096));
}

/// A used SSD whose superblock records no backing volume (written before
/// backing ids) holding dirty data, swapped in for a half of a cache that
/// names this volume and holds none: it may be another volume's data, and
/// the start is refused rather than destage it here.
#[tokio::test]
async fn dirty_data_of_a_cache_recording_no_volume_beside_this_volumes_cache_is_refused() {
    let (backing, ssds, c, vol) = named_write_back(0xa11ce).await;
    vol.shutdown().await.unwrap();
    drop(vol);
    let elsewhere: VolumeRef = Arc::new(MemVolume::new(4096, BACKING_BYTES / 4096));
    let legacy = used_ssd(elsewhere, 0, 1, true).await;
    let e = CacheVolume::open("t", backing.clone(), devices(&[ssds[0].clone(), legacy]), c)
        .await
        .err()
        .expect("took the dirty data of a cache recording no volume");
    assert!(format!("{e}").contains("records no backing volume"), "{e}");
    assert_eq!(backing.read(8, 1).await.unwrap(), vec![0u8; 4096]);
}

/// A striped read-only cache with one device swapped, while down, for a
/// device of another warm cache of the same volume: neither table is trusted
/// (the newer need not be the last one in front of the volume) and the cache
/// starts empty, serving the volume's data.
#[tokio::test]
async fn two_read_caches_of_one_volume_on_the_devices_start_empty() {
    // 32 cache blocks, on both devices
    const SPAN: usize = 32 * BLOCK as usize;
    let backing: VolumeRef = Arc::new(MemVolume::new(4096, BACKING_BYTES / 4096));
    backing.write(0, pattern(2, SPAN), false).await.unwrap();
    let mut c = cfg(CacheMode::ReadOnly);
    c.backing_id = 0xa11ce;
    let warm = |ssds: Vec<VolumeRef>, cycles: usize| {
        let (backing, c) = (backing.clone(), c.clone());
        async move {
            for _ in 0..cycles {
                let vol = CacheVolume::open("t", backing.clone(), devices(&ssds), c.clone())
                    .await
                    .unwrap();
                for _ in 0..3 {
                    vol.read(0, (SPAN / 4096) as u32).await.unwrap();
                }
                vol.shutdown().await.unwrap();
            }
            ssds
        }
    };
    let two = || -> Vec<VolumeRef> {
        (0..2)
            .map(|_| Arc::new(MemVolume::new(4096, 1 << 10)) as VolumeRef)
            .collect()
    };
    let mine = warm(two(), 1).await;
    let theirs = warm(two(), 4).await;
    // the volume changes behind the second cache's back
    backing.write(0, pattern(4, SPAN), false).await.unwrap();
    let vol = CacheVolume::open(
        "t",
        backing.clone(),
        devices(&[mine[0].clone(), theirs[1].clone()]),
        c,
    )
    .await
    .unwrap();
    assert_eq!(vol.status().cached_blocks, 0);
    let want = pattern(4, SPAN);
    let per_block = BLOCK as usize / 4096;
    for b in 0..SPAN / BLOCK as usize {
        let lba = (b * per_block) as u64;
        let got = vol.read(lba, per_block as u32).await.unwrap();
        let at = b * BLOCK as usize;
        assert!(
            got[..] == want[at..at + BLOCK as usize],
            "cache block {b}: stale data served"
        );
    }
}

/// A warm read-only cache, cleanly stopped, opened in front of another volume
/// of the same size starts empty: it serves that volume's data, not the
/// blocks it cached of the first.
#[tokio::test]
async fn a_warm_cache_in_front_of_another_volume_starts_empty() {
    let backing: VolumeRef = Arc::new(MemVolume::new(4096, BACKING_BYTES / 4096));
    backing.write(0, pattern(2, 4096), false).await.unwrap();
    let ssds: Vec<VolumeRef> = vec![Arc::new(MemVolume::new(4096, 1 << 10))];
    let mut c = cfg(CacheMode::ReadOnly);
    c.backing_id = 0xa11ce;
    let vol = CacheVolume::open("t", backing.clone(), devices(&ssds), c.clone())
        .await
        .unwrap();
    for _ in 0..3 {
        assert_eq!(vol.read(0, 1).await.unwrap(), pattern(2, 4096));
    }
    vol.shutdown().await.unwrap();
    drop(vol);
    // the same volume: warm
    let vol = CacheVolume::open("t", backing.clone(), devices(&ssds), c.clone())
        .await
        .unwrap();
    assert!(vol.status().cached_blocks > 0, "the control: not warm");
    vol.shutdown().await.unwrap();
    drop(vol);
    let other: VolumeRef = Arc::new(MemVolume::new(4096, BACKING_BYTES / 4096));
    other.write(0, pattern(4, 4096), false).await.unwrap();
    c.backing_id = 0xb0b;
    let vol = CacheVolume::open("t", other, devices(&ssds), c)
        .await
        .unwrap();
    assert_eq!(vol.status().cached_blocks, 0);
    assert_eq!(vol.read(0, 1).await.unwrap(), pattern(4, 4096));
}

/// A write-back cache whose superblocks are all damaged (the magic there,
/// the checksums wrong), or cannot be read, is not formatted at the next
/// start: formatting would write an empty table over the one that holds its
/// dirty, acknowledged data. The start fails and the devices are left as
/// they were. (Before, every superblock that did not decode counted as a
/// blank device, and the cache was formatted anew.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cache_whose_superblocks_do_not_read_is_not_formatted() {
    let (backing, ssds, c) = write_back_on_two_ssds();
    let vol = CacheVolume::open("t", backing.clone(), devices(&ssds), c.clone())
        .await
        .unwrap();
    vol.write(0, pattern(1, 8192), false).await.unwrap();
    assert!(vol.status().dirty_blocks > 0);
    vol.halt().await;
    drop(vol);
    // both 4 KiB copies on both devices: one byte past the magic flipped
    for s in &ssds {
        let mut head = s.read(0, 2).await.unwrap().to_vec();
        head[100] ^= 0xff;
        head[4096 + 100] ^= 0xff;
        s.write(0, Bytes::from(head), true).await.unwrap();
    }
    let before: Vec<Bytes> = all_blocks(&ssds).await;
    let e = match CacheVolume::open("t", backing.clone(), devices(&ssds), c.clone()).await {
        Ok(_) => panic!("a cache with damaged superblocks was formatted"),
        Err(e) => e.to_string(),
    };
    assert!(e.contains("refusing to format"), "{e}");
    assert_eq!(all_blocks(&ssds).await, before, "the devices were written");
    // the same when the superblocks cannot be read at all
    let faulty: Vec<VolumeRef> = ssds
        .iter()
        .map(|s| {
            let f = Arc::new(block::FaultVolume::new(s.clone()));
            f.plan().lock().bad_read_blocks.push(0..2);
            f as VolumeRef
        })
        .collect();
    let e = match CacheVolume::open("t", backing, devices(&faulty), c).await {
        Ok(_) => panic!("a cache whose superblocks cannot be read was formatted"),
        Err(e) => e.to_string(),
    };
    assert!(e.contains("unreadable"), "{e}");
    assert_eq!(all_blocks(&ssds).await, before, "the devices were written");
}

/// Every block of every device, for comparing before and after.
async fn all_blocks(vols: &[VolumeRef]) -> Vec<Bytes> {
    let mut out = Vec::new();
    for v in vols {
        let blocks = v.geometry().block_count;
        out.push(v.read(0, blocks as u32).await.unwrap());
    }
    out
}

/// A clean stop cut by a crash between the two devices' superblock writes
/// (the second device's never lands): the second device is one generation
/// behind but holds everything, so the next start uses both halves. It used
/// to be failed as "not part of this cache", leaving the mirror degraded
/// (write-through) until a healthy SSD was replaced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_between_the_superblock_writes_keeps_both_mirror_halves() {
    let (backing, ssds, c) = write_back_on_two_ssds();
    let held = Arc::new(block::HoldVolume::new(ssds[1].clone()));
    let devs = devices(&[ssds[0].clone(), held.clone() as VolumeRef]);
    let vol = Arc::new(
        CacheVolume::open("t", backing.clone(), devs, c.clone())
            .await
            .unwrap(),
    );
    vol.write(0, pattern(1, 8192), false).await.unwrap();
    // the superblock copies are the first 8 KiB of each device
    held.writes.hold_below(2);
    let stopping = tokio::spawn({
        let vol = vol.clone();
        async move { vol.shutdown().await }
    });
    tokio::time::timeout(Duration::from_secs(10), held.writes.arrivals(1))
        .await
        .expect("the second device's superblock write never came");
    // the crash: the held write never reaches the device
    stopping.abort();
    let _ = stopping.await;
    drop(vol);
    let vol = CacheVolume::open("t", backing, devices(&ssds), c)
        .await
        .unwrap();
    let st = vol.status();
    assert!(!st.state.starts_with("degraded"), "{st:?}");
    assert!(st.dirty_blocks > 0, "{st:?}");
    assert_eq!(vol.read(0, 2).await.unwrap(), pattern(1, 8192));
}

/// A failed mirror half is replaced by a used SSD that still carries another
/// cache's superblock at a higher generation, and the node crashes while the
/// fill runs. The next start must be this cache's (the survivor's dirty data
/// served, the half-filled device left out), not the other cache's: the
/// newest superblock wins, and the replacement's used to be it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_used_ssd_replacing_a_mirror_half_never_brings_back_its_old_cache() {
    // the used SSD: another cache's half, at a high generation
    let (other_backing, used, c) = write_back_on_two_ssds();
    for i in 0..4u64 {
        let vol = CacheVolume::open("old", other_backing.clone(), devices(&used), c.clone())
            .await
            .unwrap();
        vol.write(0, pattern(100 + i, 4096), false).await.unwrap();
        vol.shutdown().await.unwrap();
    }
    let (backing, ssds, c) = write_back_on_two_ssds();
    let vol = CacheVolume::open("t", backing.clone(), devices(&ssds), c.clone())
        .await
        .unwrap();
    vol.write(0, pattern(1, 4096), false).await.unwrap();
    vol.fail_device(1).await.unwrap();
    // the fill's frame writes (past the superblocks and the table) wait
    let held = Arc::new(block::HoldVolume::new(used[0].clone()));
    held.writes.hold_range(4, u64::MAX);
    replace(&vol, 1, "used", held.clone() as VolumeRef).await;
    tokio::time::timeout(Duration::from_secs(10), held.writes.arrivals(1))
        .await
        .expect("the fill never wrote");
    drop(vol); // the crash
    let vol = CacheVolume::open(
        "t",
        backing,
        devices(&[ssds[0].clone(), used[0].clone()]),
        c,
    )
    .await
    .unwrap();
    // (the degraded cache destaged its dirty block to the backing meanwhile;
    // the other cache's table holds that block dirty with its own data)
    assert_eq!(vol.read(0, 1).await.unwrap(), pattern(1, 4096));
    let st = vol.status();
    assert_eq!(st.devices[1].state, "failed", "{st:?}");
}

/// A mirror half fails on a read (no write follows, so its failure is not yet
/// on the survivor's superblock) and is replaced; the fill ends, and the node
/// crashes before anything else is written. A start that finds the old half
/// again (the new device not recorded) must leave it out: it missed what was
/// written since. The fill's end used to leave it exactly one generation
/// behind with no failure recorded, which a start takes for a half that only
/// missed the last superblock write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replaced_half_found_again_at_the_next_start_is_left_out() {
    let (backing, ssds, c) = write_back_on_two_ssds();
    let old = Arc::new(FaultVolume::new(ssds[1].clone()));
    let vol = CacheVolume::open(
        "t",
        backing.clone(),
        devices(&[ssds[0].clone(), old.clone() as VolumeRef]),
        c.clone(),
    )
    .await
    .unwrap();
    // two clean frames (filled by reads: no dirty data, so no destage
    // writes the table once the half has failed), so that one of the reads
    // below goes to the old half
    backing.write(0, pattern(1, 4096), false).await.unwrap();
    backing.write(4, pattern(2, 4096), false).await.unwrap();
    for lba in [0, 4] {
        vol.read(lba, 1).await.unwrap();
    }
    assert_eq!(vol.status().cached_blocks, 2);
    old.plan().lock().dead = true;
    assert_eq!(vol.read(0, 1).await.unwrap(), pattern(1, 4096));
    assert_eq!(vol.read(4, 1).await.unwrap(), pattern(2, 4096));
    assert_eq!(vol.status().devices[1].state, "failed");
    let new: VolumeRef = Arc::new(MemVolume::new(4096, 1 << 10));
    replace(&vol, 1, "new", new.clone() as VolumeRef).await;
    status_until(&vol, 20, "the fill never ended", |s| s.state == "ok").await;
    vol.halt().await;
    drop(vol); // the crash
    let vol = CacheVolume::open(
        "t",
        backing,
        devices(&[ssds[0].clone(), ssds[1].clone()]),
        c,
    )
    .await
    .unwrap();
    let st = vol.status();
    assert_eq!(st.devices[1].state, "failed", "{st:?}");
}

/// A write-back mirror on two fault-injecting memory SSDs over a written
/// backing volume, the first sector of its first 16 KiB cache block written
/// (dirty); `at`: that sector's block on the SSDs.
async fn one_dirty_sector_on_faulty_halves() -> (VolumeRef, Vec<Arc<FaultVolume>>, CacheVolume, u64)
{
    let backing: VolumeRef = Arc::new(MemVolume::new(4096, BACKING_BYTES / 4096));
    one_dirty_sector_on_faulty_halves_over(backing).await
}

/// Two mirror halves of 4 MiB, each behind a fault layer (the halves' stores
/// too, to look at what each holds).
fn faulty_halves() -> (Vec<Arc<MemVolume>>, Vec<Arc<FaultVolume>>) {
    let mems: Vec<Arc<MemVolume>> = (0..2)
        .map(|_| Arc::new(MemVolume::new(4096, 1 << 10)))
        .collect();
    let faulty = mems
        .iter()
        .map(|m| Arc::new(FaultVolume::new(m.clone() as VolumeRef)))
        .collect();
    (mems, faulty)
}

/// [`one_dirty_sector_on_faulty_halves`] in front of `backing`.
async fn one_dirty_sector_on_faulty_halves_over(
    backing: VolumeRef,
) -> (VolumeRef, Vec<Arc<FaultVolume>>, CacheVolume, u64) {
    backing.write(0, pattern(9, 16384), false).await.unwrap();
    let (mems, faulty) = faulty_halves();
    let refs: Vec<VolumeRef> = faulty.iter().map(|f| f.clone() as VolumeRef).collect();
    let (_, _, c) = write_back_on_two_ssds();
    let vol = CacheVolume::open("t", backing.clone(), devices(&refs), c)
        .await
        .unwrap();
    // the first sector of a 16 KiB cache block, dirty
    vol.write(0, pattern(1, 4096), false).await.unwrap();
    let at = block_holding(&mems[0], &pattern(1, 4096)).await;
    (backing, faulty, vol, at)
}

/// Reads the rest of the block `one_dirty_sector_on_faulty_halves` wrote to
/// (blocks 1-3): a fill of the frame, which must happen, read the backing's
/// data and leave every device in service.
async fn filled_with_every_device_in_service(vol: &CacheVolume, backing: &VolumeRef) {
    let fills = vol.status().fills;
    assert_eq!(
        vol.read(1, 3).await.unwrap(),
        backing.read(1, 3).await.unwrap()
    );
    let st = vol.status();
    assert!(st.fills > fills, "no fill: {st:?}");
    assert!(st.devices.iter().all(|d| d.state == "ok"), "{st:?}");
}

/// A fill of a block whose frame holds a dirty sector writes only the sectors
/// the frame lacks: the dirty one, acknowledged data whose only copies are on
/// the SSDs, is never rewritten in place (a power cut in the middle of that
/// write could tear it). Seen by making every write to its place fail: the
/// whole-frame write of a fill used to fail there and fail both SSDs.
#[tokio::test]
async fn a_fill_never_rewrites_the_sectors_a_frame_holds() {
    let (backing, faulty, vol, at) = one_dirty_sector_on_faulty_halves().await;
    for f in &faulty {
        f.plan().lock().bad_write_blocks = std::iter::once(at..at + 1).collect();
    }
    filled_with_every_device_in_service(&vol, &backing).await;
    assert_eq!(vol.read(0, 4).await.unwrap()[..4096], pattern(1, 4096)[..]);
    assert_eq!(
        vol.read(1, 3).await.unwrap(),
        backing.read(1, 3).await.unwrap()
    );
}

/// A fill reads from the SSDs only the sectors the frame holds: a latent
/// read error in a sector the frame never wrote costs nothing. Before
/// (review of 2026-12-06) the fill read the whole frame, the error failed
/// both halves of the mirror one after the other, and the read of a block
/// with a dirty sector failed.
#[tokio::test]
async fn a_fill_reads_only_the_sectors_a_frame_holds() {
    let (backing, faulty, vol, at) = one_dirty_sector_on_faulty_halves().await;
    // the frame's third sector, never written, cannot be read on either half
    for f in &faulty {
        f.plan().lock().bad_read_blocks = std::iter::once(at + 2..at + 3).collect();
    }
    filled_with_every_device_in_service(&vol, &backing).await;
    assert_eq!(vol.read(0, 1).await.unwrap(), pattern(1, 4096));
}

/// A write-back mirror on two memory SSDs whose halves disagree after a
/// crash: block 0's first sector, dirty, holds version 1 on the first half
/// and a newer, unacknowledged version 2 on the second (a write in flight at
/// the crash reached one half only). `at`: that sector's block on the SSDs.
struct Uneven {
    backing: VolumeRef,
    mems: Vec<Arc<MemVolume>>,
    refs: Vec<VolumeRef>,
    cfg: CacheConfig,
    at: u64,
}

async fn uneven_after_a_crash() -> Uneven {
    let backing: VolumeRef = Arc::new(MemVolume::new(4096, BACKING_BYTES / 4096));
    let mems: Vec<Arc<MemVolume>> = (0..2)
        .map(|_| Arc::new(MemVolume::new(4096, 1 << 10)))
        .collect();
    let refs: Vec<VolumeRef> = mems.iter().map(|m| m.clone() as VolumeRef).collect();
    let (_, _, cfg) = write_back_on_two_ssds();
    let vol = CacheVolume::open("t", backing.clone(), devices(&refs), cfg.clone())
        .await
        .unwrap();
    vol.write(0, pattern(1, 4096), false).await.unwrap();
    vol.halt().await;
    drop(vol); // the crash
    let at = block_holding(&mems[0], &pattern(1, 4096)).await;
    mems[1].write(at, pattern(2, 4096), false).await.unwrap();
    Uneven {
        backing,
        mems,
        refs,
        cfg,
        at,
    }
}

/// The block of `ssd` that holds `data`.
async fn block_holding(ssd: &MemVolume, data: &[u8]) -> u64 {
    let image = ssd
        .read(0, (ssd.geometry().block_count) as u32)
        .await
        .unwrap();
    image
        .chunks(4096)
        .position(|b| b == data)
        .expect("the sector is on the SSD") as u64
}

/// Waits (at most 10 s) until both halves hold the same data at block `at`.
async fn halves_agree(mems: &[Arc<MemVolume>], at: u64, what: &str) {
    tokio::time::timeout(Duration::from_secs(10), async {
        while mems[0].read(at, 1).await.unwrap() != mems[1].read(at, 1).await.unwrap() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("the halves never came to agree {what}"));
}

/// After an unclean stop, the mirror halves may differ on a dirty sector (a
/// write in flight at the crash, not acknowledged, reached one half only).
/// The start makes them agree, so the data a read returns does not change
/// when the half it was read from fails later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_an_unclean_stop_the_mirror_halves_agree_on_dirty_sectors() {
    let Uneven {
        backing,
        mems,
        refs,
        cfg,
        at,
    } = uneven_after_a_crash().await;
    let vol = CacheVolume::open("t", backing, devices(&refs), cfg)
        .await
        .unwrap();
    halves_agree(&mems, at, "after the start").await;
    let before = vol.read(0, 1).await.unwrap();
    // the half the reads use kept its version: the first had version 1
    let used = if before == pattern(1, 4096) {
        0
    } else {
        assert_eq!(before, pattern(2, 4096));
        1
    };
    // losing it changes nothing
    vol.fail_device(used).await.unwrap();
    assert_eq!(vol.read(0, 1).await.unwrap(), before);
}

/// A clean stop that comes while the halves are still being made to agree
/// (after an unclean stop) leaves the table marked not clean, so the next
/// start makes them agree: a clean table used to end that for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clean_stop_before_the_halves_agree_leaves_it_to_the_next_start() {
    let Uneven {
        backing,
        mems,
        refs,
        cfg: c,
        at,
    } = uneven_after_a_crash().await;
    // the frames' writes (past the first MiB: superblocks and table) held
    let held: Vec<Arc<block::HoldVolume>> = mems
        .iter()
        .map(|m| Arc::new(block::HoldVolume::new(m.clone() as VolumeRef)))
        .collect();
    for h in &held {
        h.writes.hold_range(256, u64::MAX);
    }
    let hrefs: Vec<VolumeRef> = held.iter().map(|h| h.clone() as VolumeRef).collect();
    // and the backing volume's, so no destage cleans the block meanwhile
    let held_backing = Arc::new(block::HoldVolume::new(backing.clone()));
    held_backing.writes.hold();
    let vol = CacheVolume::open(
        "t",
        held_backing.clone() as VolumeRef,
        devices(&hrefs),
        c.clone(),
    )
    .await
    .unwrap();
    tokio::time::timeout(Duration::from_secs(10), async {
        while held.iter().all(|h| h.writes.last_arrival() < 256) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("the copy between the halves never started");
    vol.shutdown().await.unwrap();
    drop(vol);
    assert_ne!(
        mems[0].read(at, 1).await.unwrap(),
        mems[1].read(at, 1).await.unwrap()
    );
    let _vol = CacheVolume::open("t", backing, devices(&refs), c)
        .await
        .unwrap();
    halves_agree(&mems, at, "after the clean stop").await;
}

/// A write-back mirror over two fault-injecting SSDs, a cache big enough that a
/// fill runs alongside I/O, data written (much of it dirty), then SSD 0 dead.
struct Degraded {
    backing: VolumeRef,
    faulty: [Arc<FaultVolume>; 2],
    oracle: MemVolume,
    cfg: CacheConfig,
    vol: CacheVolume,
}

async fn degraded_write_back_mirror(seed: u64) -> Degraded {
    let backing: VolumeRef = Arc::new(MemVolume::new(4096, BACKING_BYTES / 4096));
    let faulty = [fault_ssd(), fault_ssd()];
    let refs: Vec<VolumeRef> = faulty.iter().map(|f| f.clone() as VolumeRef).collect();
    let oracle = MemVolume::new(4096, BACKING_BYTES / 4096);
    let mut c = cfg(CacheMode::WriteBack);
    c.dirty_low_percent = 90;
    c.dirty_high_percent = 95;
    c.size_bytes = Some(3 << 20);
    let vol = CacheVolume::open("t", backing.clone(), devices(&refs), c.clone())
        .await
        .unwrap();
    exercise(&vol, &oracle, seed, 800).await;
    faulty[0].plan().lock().dead = true;
    exercise(&vol, &oracle, seed + 1, 300).await;
    assert!(vol.status().state.starts_with("degraded"));
    Degraded {
        backing,
        faulty,
        oracle,
        cfg: c,
        vol,
    }
}

fn fault_ssd() -> Arc<FaultVolume> {
    Arc::new(FaultVolume::new(Arc::new(MemVolume::new(4096, 1 << 10))))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replaced_mirror_device_is_filled_while_serving_and_the_cache_stays_warm() {
    let Degraded {
        backing,
        faulty,
        oracle,
        cfg: c,
        vol,
    } = degraded_write_back_mirror(21).await;
    let new = fault_ssd();
    let small = CacheDevice {
        name: "tiny".into(),
        volume: Arc::new(MemVolume::new(4096, 8)),
    };
    assert!(
        vol.replace_device(0, small).await.is_err(),
        "a too small device"
    );
    assert!(
        vol.replace_device(
            1,
            CacheDevice {
                name: "x".into(),
                volume: new.clone()
            }
        )
        .await
        .is_err(),
        "the live half was replaced"
    );
    replace(&vol, 0, "ssd9", new.clone() as VolumeRef).await;
    exercise(&vol, &oracle, 23, 1500).await;
    status_until(&vol, 30, "the mirror never became complete again", |s| {
        s.state == "ok"
    })
    .await;
    let st = vol.status();
    assert_eq!(st.devices[0].name, "ssd9");
    assert_eq!(st.devices[0].state, "ok");
    assert!(st.cached_blocks > 0, "the cache went cold");
    exercise(&vol, &oracle, 24, 500).await;
    // a restart finds both halves and stays warm
    vol.shutdown().await.unwrap();
    drop(vol);
    let both: Vec<VolumeRef> = vec![new.clone(), faulty[1].clone()];
    let vol = CacheVolume::open("t", backing.clone(), devices(&both), c)
        .await
        .unwrap();
    assert_eq!(vol.status().state, "ok");
    assert!(vol.status().cached_blocks > 0, "cold after the restart");
    verify_all(&vol, &oracle).await;
    // the new device alone holds every cached block, dirty ones included
    assert!(vol.status().dirty_blocks > 0, "nothing dirty to prove it");
    faulty[1].plan().lock().dead = true;
    exercise(&vol, &oracle, 25, 500).await;
    verify_all(&vol, &oracle).await;
    assert!(vol.status().read_hits > 0);
}

/// Writes that meet a resilver under way (to frames it has copied, to frames
/// it has not reached, to the one it is copying) reach the replacement: once
/// the resilver ends, the replacement alone serves every block, dirty ones
/// included, without a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_that_meet_a_resilver_reach_the_replacement() {
    let Degraded {
        faulty,
        oracle,
        vol,
        ..
    } = degraded_write_back_mirror(41).await;
    // a slow replacement while the host writes: the resilver is certainly
    // still under way when the writes end
    let slow = Arc::new(block::DelayVolume::new(
        Arc::new(MemVolume::new(4096, 1 << 10)),
        Duration::ZERO,
        Duration::from_millis(20),
    ));
    replace(&vol, 0, "ssd9", slow.clone()).await;
    exercise(&vol, &oracle, 43, 200).await;
    let st = vol.status();
    assert!(
        st.devices[0].state.starts_with("resilvering"),
        "the resilver ended before the writes did: they met nothing ({:?})",
        st.devices[0]
    );
    slow.set_delays(Duration::ZERO, Duration::ZERO);
    status_until(&vol, 30, "the resilver never ended", |s| s.state == "ok").await;
    // (degraded, the cache wrote through: what it holds is clean, and read
    // from the frames, not the backing)
    assert!(vol.status().cached_blocks > 0, "nothing cached to prove it");
    // the survivor dies: the replacement alone holds the cache
    faulty[1].plan().lock().dead = true;
    let hits = vol.status().read_hits;
    verify_all(&vol, &oracle).await;
    assert!(
        vol.status().read_hits > hits,
        "no read came from the replacement"
    );
    exercise(&vol, &oracle, 44, 200).await;
}

/// The command timeout the node gives every disk (`disk::TimedDisk`), short.
const HUNG_LIMIT: Duration = Duration::from_millis(200);

/// Puts a replacement in place of `vol`'s failed half 0, behind the command
/// timeout when `timed`, slowed (20 ms a write) so that its resilver is
/// under way for a while; once the resilver has copied something, the
/// replacement stops answering. Its fault plan.
async fn hang_mid_resilver(vol: &CacheVolume, timed: bool) -> Arc<FaultVolume> {
    let slow = Arc::new(block::DelayVolume::new(
        Arc::new(MemVolume::new(4096, 1 << 10)),
        Duration::ZERO,
        Duration::from_millis(20),
    ));
    let hangs = Arc::new(FaultVolume::new(slow));
    let v: VolumeRef = if timed {
        Arc::new(disk::TimedDisk::with_timeout(
            hangs.clone(),
            "ssd9",
            HUNG_LIMIT,
        ))
    } else {
        hangs.clone()
    };
    replace(vol, 0, "ssd9", v).await;
    status_until(
        vol,
        30,
        "the resilver copied nothing",
        resilvering_past_the_start,
    )
    .await;
    hangs.plan().lock().hung = true;
    hangs
}

/// Whether the replacement's resilver has copied something and goes on.
fn resilvering_past_the_start(s: &cache::CacheStatus) -> bool {
    s.devices[0].state.starts_with("resilvering") && s.devices[0].state != "resilvering 0%"
}

/// A replacement that stops answering in the middle of its resilver, behind
/// the command timeout: the resilver gives it up at the timeout, the cache
/// goes on degraded on the survivor (host I/O answers, every block reads
/// back), and a second replacement then makes the mirror whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replacement_that_stops_answering_during_its_resilver_is_given_up() {
    let Degraded {
        faulty,
        oracle,
        vol,
        ..
    } = degraded_write_back_mirror(51).await;
    hang_mid_resilver(&vol, true).await;
    // host I/O meets the hung half (writes to frames the resilver passed go
    // to both halves; the frame being copied is locked) and must answer
    tokio::time::timeout(Duration::from_secs(30), async {
        exercise(&vol, &oracle, 53, 200).await;
        verify_all(&vol, &oracle).await;
    })
    .await
    .expect("the cache waited with its hung replacement");
    status_until(&vol, 30, "the hung replacement was not given up", |s| {
        s.devices[0].state == "failed"
    })
    .await;
    let st = vol.status();
    assert!(st.state.starts_with("degraded"), "{}", st.state);
    assert_eq!(st.devices[1].state, "ok");
    verify_all(&vol, &oracle).await;
    // a replacement that answers makes the mirror whole again
    let good: VolumeRef = Arc::new(MemVolume::new(4096, 1 << 10));
    replace(&vol, 0, "ssd10", good).await;
    status_until(&vol, 30, "the second resilver never ended", |s| {
        s.state == "ok"
    })
    .await;
    faulty[1].plan().lock().dead = true;
    verify_all(&vol, &oracle).await;
}

/// The control: without the command timeout, a resilver whose replacement
/// hangs never ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_command_timeout_a_hung_replacement_holds_its_resilver() {
    let Degraded { vol, .. } = degraded_write_back_mirror(55).await;
    hang_mid_resilver(&vol, false).await;
    // ten timeouts' worth of waiting for what must not happen
    let gave_up = tokio::time::timeout(HUNG_LIMIT * 10, async {
        while vol.status().devices[0].state != "failed" {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(gave_up.is_err(), "the resilver ended without a timeout");
    assert!(vol.status().devices[0].state.starts_with("resilvering"));
    vol.halt().await;
}

/// A live mirror half that stops answering, behind the command timeout: it is
/// failed at the timeout, and the cache goes on, degraded, on its partner,
/// without losing a written block.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mirror_half_that_stops_answering_is_failed_and_the_cache_goes_on() {
    // (the partner's timeout long: a loaded machine must not fail it too)
    let (vol, oracle, faulty, _) =
        timed_mirror_with_dirty_data([HUNG_LIMIT, HUNG_LIMIT * 50], 57).await;
    assert!(vol.status().dirty_bytes > 0, "nothing dirty to keep");
    faulty[0].plan().lock().hung = true;
    tokio::time::timeout(Duration::from_secs(30), async {
        exercise(&vol, &oracle, 58, 300).await;
        verify_all(&vol, &oracle).await;
    })
    .await
    .expect("the cache waited with its hung half");
    let st = vol.status();
    assert_eq!(st.devices[0].state, "failed", "{st:?}");
    assert_eq!(st.devices[1].state, "ok", "{st:?}");
    assert!(st.state.starts_with("degraded"), "{}", st.state);
}

/// A write-back cache over two timed halves: the cache, its oracle, the
/// halves' fault plans and their timed disks.
type TimedMirror = (
    CacheVolume,
    MemVolume,
    [Arc<FaultVolume>; 2],
    Vec<Arc<disk::TimedDisk>>,
);

/// Both halves of a write-back mirror, each behind a command timeout
/// (`limits`), and the cache over them (dirty data stays: destage only past
/// 90% dirty), worked on and left with dirty blocks (`seed`); its oracle.
async fn timed_mirror_with_dirty_data(limits: [Duration; 2], seed: u64) -> TimedMirror {
    let backing: VolumeRef = Arc::new(MemVolume::new(4096, BACKING_BYTES / 4096));
    timed_mirror_over(backing, limits, seed).await
}

/// [`timed_mirror_with_dirty_data`] over `backing`.
async fn timed_mirror_over(backing: VolumeRef, limits: [Duration; 2], seed: u64) -> TimedMirror {
    let faulty = [fault_ssd(), fault_ssd()];
    let timed: Vec<_> = faulty
        .iter()
        .enumerate()
        .map(|(i, f)| {
            let v = f.clone() as VolumeRef;
            Arc::new(disk::TimedDisk::with_timeout(
                v,
                &format!("ssd{i}"),
                limits[i],
            ))
        })
        .collect();
    let halves: Vec<VolumeRef> = timed.iter().map(|t| t.clone() as VolumeRef).collect();
    let vol = CacheVolume::open("t", backing, devices(&halves), mostly_dirty())
        .await
        .unwrap();
    let oracle = MemVolume::new(4096, BACKING_BYTES / 4096);
    exercise(&vol, &oracle, seed, 400).await;
    dirty(&vol, &oracle, 40, seed * 10).await;
    (vol, oracle, faulty, timed)
}

/// A write-back cache's settings that keep dirty data (destage only past
/// 90% dirty).
fn mostly_dirty() -> CacheConfig {
    let mut c = cfg(CacheMode::WriteBack);
    c.dirty_low_percent = 90;
    c.dirty_high_percent = 95;
    c
}

/// The node stops (no shutdown) with dirty data on both halves of a
/// write-back mirror, and starts again while both halves are stalled (one
/// controller resetting) for three command timeouts: each one's keeper
/// finds the other silent too and waits, so the open goes on once they
/// answer, with the dirty data. Before, each half was given up at its
/// timeout while the cache opened.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_that_meets_a_stall_both_halves_share_waits_it_out() {
    let backing: VolumeRef = Arc::new(MemVolume::new(4096, BACKING_BYTES / 4096));
    let (vol, oracle, faulty, timed) =
        timed_mirror_over(backing.clone(), [HUNG_LIMIT; 2], 65).await;
    // (an idle destage under a loaded machine may have written it all
    // back meanwhile: dirty some more, a bounded number of times)
    for again in 0..8u64 {
        if vol.status().dirty_bytes > 0 {
            break;
        }
        dirty(&vol, &oracle, 40 + 8 * again, 650 + 2 * again).await;
    }
    assert!(vol.status().dirty_bytes > 0, "nothing dirty to keep");
    vol.halt().await;
    drop(vol);
    for f in &faulty {
        f.set_hung(true);
    }
    let halves: Vec<VolumeRef> = timed.iter().map(|t| t.clone() as VolumeRef).collect();
    let open = tokio::spawn(CacheVolume::open(
        "t",
        backing,
        devices(&halves),
        mostly_dirty(),
    ));
    until_held(&timed, 3).await;
    for f in &faulty {
        f.set_hung(false);
    }
    let vol = tokio::time::timeout(Duration::from_secs(30), open)
        .await
        .expect("the open never ended")
        .unwrap()
        .unwrap_or_else(|e| {
            let t: Vec<_> = timed.iter().map(|t| t.timing()).collect();
            panic!("open: {e}: {t:?}")
        });
    let st = vol.status();
    assert_eq!(st.state, "ok", "{st:?}");
    for t in &timed {
        let t = t.timing();
        assert_eq!((t.timeouts, t.failed.as_deref()), (0, None), "{t:?}");
    }
    verify_all(&vol, &oracle).await;
}

/// Writes a pattern over 8 blocks at `lba` (to the oracle too), twice (the
/// admission takes a block at its second miss): dirty in a write-back
/// cache until the destage finds it (after 100 ms idle).
async fn dirty(vol: &CacheVolume, oracle: &MemVolume, lba: u64, seed: u64) {
    for s in [seed, seed + 1] {
        let d = pattern(s, 8 * 4096);
        vol.write(lba, d.clone(), false).await.unwrap();
        oracle.write(lba, d, false).await.unwrap();
    }
}

/// Waits until some disk of `disks` has waited out a command timeout for
/// its keeper (30 s at most), then lets the stall go on `n` - 1 timeouts.
async fn until_held(disks: &[Arc<disk::TimedDisk>], n: u32) {
    let t = std::time::Instant::now();
    while !disks.iter().any(|d| d.timing().held >= 1) {
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "no disk held {n} times: {:?}",
            disks.iter().map(|d| d.timing()).collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    tokio::time::sleep(HUNG_LIMIT * (n - 1)).await;
}

/// Both halves of a write-back mirror stop answering at once (one
/// controller resetting) for several command timeouts, with dirty data on
/// them: each one's keeper finds its partner silent too and waits, so the
/// writes in flight answer when the stall ends, and the mirror is whole.
/// Failed one after the other, the halves took the dirty data with them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stall_both_mirror_halves_share_is_waited_out() {
    shared_stall_is_waited_out(61, FaultVolume::set_hung).await;
}

/// The same for a stall that holds writes only (a frozen file system under
/// both device files still answers reads): the keeper asks the partner a
/// write, not a read, so it sees the stall shared. Asked a read, the
/// partner answered and the first half to time out was failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_stall_both_mirror_halves_share_is_waited_out() {
    shared_stall_is_waited_out(71, FaultVolume::set_writes_hung).await;
}

/// Both halves stall (`stall` set on each, then cleared) for three command
/// timeouts under a workload: nothing is failed, every block reads back.
async fn shared_stall_is_waited_out(seed: u64, stall_with: fn(&FaultVolume, bool)) {
    let (vol, oracle, faulty, timed) = timed_mirror_with_dirty_data([HUNG_LIMIT; 2], seed).await;
    for f in &faulty {
        stall_with(f, true);
    }
    assert!(vol.status().dirty_bytes > 0, "nothing dirty to keep");
    let stall = async {
        until_held(&timed, 3).await;
        for f in &faulty {
            stall_with(f, false);
        }
    };
    tokio::join!(exercise(&vol, &oracle, seed + 1, 100), stall);
    verify_all(&vol, &oracle).await;
    let st = vol.status();
    assert_eq!(st.state, "ok", "{st:?}");
    for t in &timed {
        let t = t.timing();
        assert_eq!((t.timeouts, t.failed.as_deref()), (0, None), "{t:?}");
    }
}

/// The survivor of a write-back mirror holds the only copy of the dirty
/// data until the destage has written it back: when it stops answering it
/// is waited for, not failed, and every block reads back once it answers
/// again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_last_copy_of_dirty_data_is_waited_for() {
    let (vol, oracle, faulty, timed) = timed_mirror_with_dirty_data([HUNG_LIMIT; 2], 63).await;
    // half 0 dies and half 1 stalls: the destage (at once, degraded) and
    // the reads below find the dirty data on half 1 alone
    faulty[0].plan().lock().dead = true;
    faulty[1].set_hung(true);
    assert!(vol.status().dirty_bytes > 0, "nothing dirty left to keep");
    let stall = async {
        until_held(&timed[1..], 3).await;
        assert!(vol.status().dirty_bytes > 0, "nothing dirty left to keep");
        faulty[1].set_hung(false);
    };
    tokio::join!(verify_all(&vol, &oracle), stall);
    let st = vol.status();
    assert_eq!(st.devices[0].state, "failed", "{st:?}");
    assert_eq!(st.devices[1].state, "ok", "{st:?}");
    let t = timed[1].timing();
    assert_eq!((t.timeouts, t.failed.as_deref()), (0, None), "{t:?}");
    verify_all(&vol, &oracle).await;
}

/// A crash while a replaced mirror half is being filled: the half-filled device is
/// not trusted at restart (it never got this cache's superblock), so the cache
/// comes back on the survivor alone and every acknowledged block reads back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_during_the_fill_leaves_the_new_device_untrusted() {
    let Degraded {
        backing,
        faulty,
        oracle,
        cfg: c,
        vol,
    } = degraded_write_back_mirror(31).await;
    // the new device is slow: the fill is certainly under way when the node dies
    let new_store: VolumeRef = Arc::new(MemVolume::new(4096, 1 << 10));
    let slow: VolumeRef = Arc::new(block::DelayVolume::new(
        new_store.clone(),
        Duration::from_millis(1),
        Duration::from_millis(20),
    ));
    replace(&vol, 0, "ssd9", slow).await;
    exercise(&vol, &oracle, 33, 200).await;
    let st = vol.status();
    assert!(
        st.devices[0].state.starts_with("resilvering"),
        "{:?}",
        st.devices[0]
    );
    // the node dies: no shutdown, the fill stops where it is
    vol.halt().await;
    drop(vol);
    let both: Vec<VolumeRef> = vec![new_store, faulty[1].clone()];
    let vol = CacheVolume::open("t", backing.clone(), devices(&both), c)
        .await
        .unwrap();
    let st = vol.status();
    assert_eq!(
        st.devices[0].state, "failed",
        "a half-filled device was trusted"
    );
    assert!(st.state.starts_with("degraded"), "{}", st.state);
    verify_all(&vol, &oracle).await;
}

/// Growing a cached volume while it holds dirty data: the old data stays, the new
/// space reads zeroes and takes writes, and a restart (clean or after a crash cut a
/// grow short, leaving the backing volume larger than the cache's superblocks say)
/// keeps the write-back cache's dirty data.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cached_volume_grows_and_keeps_its_dirty_data() {
    let blocks = BACKING_BYTES / 4096;
    let backing: VolumeRef = Arc::new(MemVolume::new(4096, blocks));
    let ssds: Vec<VolumeRef> = (0..2)
        .map(|_| Arc::new(MemVolume::new(4096, 1 << 10)) as VolumeRef)
        .collect();
    // destaging only after 100 ms without a request, so that the last write
    // before the crash is certainly still dirty
    let mut c = cfg(CacheMode::WriteBack);
    c.dirty_low_percent = 100;
    c.dirty_high_percent = 100;
    let vol = CacheVolume::open("t", backing.clone(), devices(&ssds), c.clone())
        .await
        .unwrap();
    let oracle = MemVolume::new(4096, blocks * 2);
    exercise(&vol, &oracle, 11, 500).await;

    assert!(vol.grow(blocks - 1).await.is_err(), "no shrinking");
    vol.grow(blocks * 2).await.unwrap();
    assert_eq!(vol.geometry().block_count, blocks * 2);
    assert_eq!(backing.geometry().block_count, blocks * 2);
    let tail = vol.read(blocks, 4).await.unwrap();
    assert!(tail.iter().all(|&b| b == 0), "new space reads zeroes");
    // the whole grown volume is exercised: the oracle's extra half matches it
    exercise(&vol, &oracle, 12, 500).await;
    let data = pattern(5, 8192);
    vol.write(blocks * 2 - 2, data.clone(), false)
        .await
        .unwrap();
    oracle.write(blocks * 2 - 2, data, false).await.unwrap();
    verify_all(&vol, &oracle).await;

    // a write, then at once a crash (no shutdown): that write is only in the
    // cache (the backing volume does not have it); then the backing volume grown
    // behind the cache's back, as a grow cut short would leave it
    let last = pattern(6, 4 * 4096);
    vol.write(3, last.clone(), false).await.unwrap();
    oracle.write(3, last.clone(), false).await.unwrap();
    vol.halt().await;
    drop(vol);
    assert_ne!(
        backing.read(3, 4).await.unwrap(),
        last,
        "the last write was destaged before the crash: nothing dirty to keep"
    );
    backing.grow(blocks * 3).await.unwrap();
    // the cache reopens over it (a cache holding dirty data refuses a backing of
    // another shape) and still holds that write
    let vol = CacheVolume::open("t", backing.clone(), devices(&ssds), c.clone())
        .await
        .unwrap();
    assert_eq!(vol.geometry().block_count, blocks * 3);
    oracle.grow(blocks * 3).await.unwrap();
    verify_all(&vol, &oracle).await;
    vol.shutdown().await.unwrap();
}

/// A device of a striped cache that failed while writes went around it holds
/// stale frames: after a clean restart with it back, its table is not read
/// (its superblock is older than the cache's), so the cache holds no more than
/// it did at the shutdown, and what it serves matches the oracle.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_back_from_failure_brings_back_nothing_it_held_before() {
    let backing: VolumeRef = Arc::new(MemVolume::new(4096, BACKING_BYTES / 4096));
    let faulty = [fault_ssd(), fault_ssd()];
    let refs: Vec<VolumeRef> = faulty.iter().map(|f| f.clone() as VolumeRef).collect();
    let oracle = MemVolume::new(4096, BACKING_BYTES / 4096);
    let c = cfg(CacheMode::ReadOnly);
    let vol = CacheVolume::open("t", backing.clone(), devices(&refs), c.clone())
        .await
        .unwrap();
    exercise(&vol, &oracle, 21, 1000).await;
    vol.shutdown().await.unwrap();
    drop(vol);
    let vol = CacheVolume::open("t", backing.clone(), devices(&refs), c.clone())
        .await
        .unwrap();
    assert!(vol.status().cached_blocks > 10, "warm");
    // the first device dies; the writes that follow, over every block, do not
    // reach its frames
    faulty[0].plan().lock().dead = true;
    exercise(&vol, &oracle, 22, 500).await;
    let chunk = 64 << 10;
    for (i, at) in (0..BACKING_BYTES).step_by(chunk).enumerate() {
        let d = pattern(1000 + i as u64, chunk);
        vol.write(at / 4096, d.clone(), false).await.unwrap();
        oracle.write(at / 4096, d, false).await.unwrap();
    }
    verify_all(&vol, &oracle).await;
    let held = vol.status().cached_blocks;
    vol.shutdown().await.unwrap();
    drop(vol);
    // it comes back for the next start: the cache holds at most what it held
    // when it shut down (the returned device's old table is not read back)
    faulty[0].plan().lock().dead = false;
    let vol = CacheVolume::open("t", backing.clone(), devices(&refs), c)
        .await
        .unwrap();
    let now = vol.status().cached_blocks;
    assert!(
        now <= held,
        "{now} blocks after the restart, {held} before it"
    );
    verify_all(&vol, &oracle).await;
}

/// A mirrored write-back cache stopped with dirty data (no clean shutdown)
/// whose table page is damaged on one SSD reads that page from the other:
/// every acknowledged write reads back. Before, the table was read from the
/// first SSD only, the damaged page skipped with a warning, and its dirty
/// blocks served from the older backing volume.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_page_damaged_on_one_mirror_is_read_from_the_other() {
    let (backing, ssds, c) = write_back_on_two_ssds();
    let oracle = MemVolume::new(4096, BACKING_BYTES / 4096);
    let vol = CacheVolume::open("t", backing.clone(), devices(&ssds), c.clone())
        .await
        .unwrap();
    small_writes(&vol, &oracle, &mut Rng(11), 40).await;
    assert!(vol.status().dirty_blocks > 0, "nothing dirty in the cache");
    vol.halt().await;
    drop(vol);
    // both copies of the first (and only) table page of the first SSD are
    // garbage (4096-byte blocks: the table starts at block 2, one page a copy)
    for copy in [2, 3] {
        ssds[0]
            .write(copy, Bytes::from(vec![0x5a; 4096]), false)
            .await
            .unwrap();
    }
    let vol = CacheVolume::open("t", backing.clone(), devices(&ssds), c)
        .await
        .unwrap();
    verify_all(&vol, &oracle).await;
}

/// A cleanly stopped write-back cache keeps its dirty records on the SSDs:
/// a table page damaged on every copy may have held some, so the cache
/// refuses to start rather than serve the older backing data in their place
/// (it used to refuse only after an unclean stop).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cleanly_stopped_cache_whose_table_page_is_lost_refuses_to_start() {
    let (backing, ssds, c) = write_back_on_two_ssds();
    let vol = CacheVolume::open("t", backing.clone(), devices(&ssds), c.clone())
        .await
        .unwrap();
    vol.write(0, pattern(7, 4096), false).await.unwrap();
    vol.shutdown().await.unwrap();
    assert!(vol.status().dirty_blocks > 0, "the stop destaged");
    drop(vol);
    // both copies of the only table page are garbage on both SSDs
    for ssd in &ssds {
        for copy in [2, 3] {
            ssd.write(copy, Bytes::from(vec![0x5a; 4096]), false)
                .await
                .unwrap();
        }
    }
    let opened = CacheVolume::open("t", backing.clone(), devices(&ssds), c).await;
    assert!(
        opened.is_err(),
        "a cache that may have lost dirty records started"
    );
}

/// A discard of dirty sectors whose backing flush fails leaves the SSD's
/// record saying "dirty": memory must say so too. Before, the frame was freed
/// while its record still named the block; reused by a read of another
/// block and restarted, the cache served that other block's data as the
/// discarded block's dirty data (and would have destaged it there).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_discard_whose_flush_fails_never_frees_a_frame_its_record_still_names() {
    let backing = faulty_backing();
    let plan = backing.plan();
    let ssds: Vec<VolumeRef> = (0..2)
        .map(|_| Arc::new(MemVolume::new(4096, 1 << 10)) as VolumeRef)
        .collect();
    let backing_ref = backing.clone() as VolumeRef;
    let (vol, c) = open_dirty_kept(&backing_ref, &ssds).await;
    let per_block = (BLOCK / 4096) as u64;
    let a = pattern(77, BLOCK as usize);
    vol.write(0, a.clone(), false).await.unwrap();
    // every other block holds its own pattern on the backing
    let blocks = BACKING_BYTES / BLOCK as u64;
    for b in 1..blocks {
        backing
            .write(b * per_block, pattern(1000 + b, BLOCK as usize), false)
            .await
            .unwrap();
    }
    plan.lock().fail_flush = true;
    assert!(
        vol.discard(0, per_block).await.is_err(),
        "the discard's flush failed: it is not done"
    );
    plan.lock().fail_flush = false;
    // reads of every other block cycle the cache's frames
    for b in 1..blocks {
        vol.read(b * per_block, per_block as u32).await.unwrap();
    }
    vol.halt().await;
    drop(vol);
    let vol = CacheVolume::open("t", backing_ref, devices(&ssds), c)
        .await
        .unwrap();
    let got = vol.read(0, per_block as u32).await.unwrap();
    let zeros = vec![0u8; BLOCK as usize];
    assert!(
        got == a || got[..] == zeros[..],
        "the discarded block reads neither its data nor zeros (another block's data?)"
    );
}

/// A mirror half that reads but no longer takes writes (a worn SSD gone
/// read-only) at open: the cache opens on its survivor, degraded, and keeps
/// every dirty block. Before, the table written at open failed on that half
/// and the open failed with it: the node could not start, and the dirty data
/// on the healthy half was out of reach.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mirror_half_refusing_writes_at_open_leaves_the_cache_degraded_not_down() {
    let backing = Arc::new(MemVolume::new(4096, BACKING_BYTES / 4096));
    let worn = Arc::new(FaultVolume::new(Arc::new(MemVolume::new(4096, 1 << 10))));
    let ssds: Vec<VolumeRef> = vec![
        Arc::new(MemVolume::new(4096, 1 << 10)) as VolumeRef,
        worn.clone() as VolumeRef,
    ];
    let oracle = MemVolume::new(4096, BACKING_BYTES / 4096);
    let mut c = cfg(CacheMode::WriteBack);
    c.dirty_low_percent = 90;
    c.dirty_high_percent = 95;
    let vol = CacheVolume::open("t", backing.clone(), devices(&ssds), c.clone())
        .await
        .unwrap();
    small_writes(&vol, &oracle, &mut Rng(5), 30).await;
    assert!(vol.status().dirty_blocks > 0, "nothing dirty in the cache");
    vol.halt().await;
    drop(vol);
    worn.plan().lock().bad_write_blocks = std::iter::once(0..u64::MAX).collect();
    let vol = CacheVolume::open("t", backing.clone(), devices(&ssds), c)
        .await
        .expect("the cache opens on its healthy half");
    let state = vol.status().state;
    assert!(state.starts_with("degraded"), "state: {state}");
    verify_all(&vol, &oracle).await;
}

/// A read that fills a frame and is dropped while the fill's SSD write is
/// under way (an aborted command, a client gone) holds the block until that
/// write has landed: a write to the block in between would otherwise land
/// first, be acknowledged, and be overwritten on the SSD by the fill's older
/// copy, which later reads return (in write-back, the destage then copies it
/// to the backing too).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_fill_does_not_land_over_a_later_write() {
    let old = pattern(71, BLOCK as usize);
    let backing: VolumeRef = Arc::new(MemVolume::new(512, BACKING_BYTES / 512));
    backing.write(0, old.clone(), false).await.unwrap();
    // an SSD that, like a real one, does not take back a write once issued
    let ssd = Arc::new(block::HoldVolume::queued(Arc::new(MemVolume::new(
        512,
        4 << 10,
    ))));
    let vol = Arc::new(
        CacheVolume::open(
            "t",
            backing.clone(),
            devices(&[ssd.clone() as VolumeRef]),
            cfg(CacheMode::WriteThrough),
        )
        .await
        .unwrap(),
    );
    let blocks = BLOCK / 512;
    // the read misses and fills the frame: its SSD write is held
    ssd.writes.hold();
    let read = {
        let vol = vol.clone();
        tokio::spawn(async move { vol.read(0, blocks).await })
    };
    tokio::time::timeout(Duration::from_secs(10), ssd.writes.arrivals(1))
        .await
        .expect("the read filled no frame");
    // from now on only the fill (its first block) is held
    let fill_at = ssd.writes.last_arrival();
    ssd.writes.hold_range(fill_at, fill_at + 1);
    read.abort();
    assert!(read.await.unwrap_err().is_cancelled());
    // a write to the middle of the block: not the fill's first block on the SSD
    let new = pattern(72, 4096);
    let write = {
        let (vol, new) = (vol.clone(), new.clone());
        tokio::spawn(async move { vol.write(16, new, false).await })
    };
    // it must wait for the fill (which holds the block); given 2 s, a write
    // that does not has landed and been acknowledged by then
    let mut write = write;
    let early = tokio::time::timeout(Duration::from_secs(2), &mut write).await;
    ssd.writes.open();
    match early {
        Ok(r) => r.unwrap().unwrap(),
        Err(_) => write.await.unwrap().unwrap(),
    }
    // the fill has ended, one way or the other
    tokio::time::timeout(Duration::from_secs(10), ssd.writes.endings(1))
        .await
        .expect("the fill never ended");
    let mut want = old.to_vec();
    want[8192..8192 + 4096].copy_from_slice(&new);
    assert!(
        vol.read(0, blocks).await.unwrap() == want,
        "the dropped fill's older copy landed over the acknowledged write"
    );
}

/// A 512-byte-block SSD on which, once armed, the next FUA write of a table
/// page (4 KiB between the superblocks and the frames at 1 MiB) that changes
/// a sector past its first is torn as a power cut tears it: the first sector
/// (the page's header and checksum) lands, the others keep their old bytes,
/// and the write never completes. Each tear adds a permit to `tore`.
struct Tearing {
    inner: Arc<MemVolume>,
    armed: AtomicBool,
    tore: Arc<Semaphore>,
    /// Tears a write without FUA too (a full table write flushes after it).
    unforced: bool,
}

#[async_trait]
impl Volume for Tearing {
    fn geometry(&self) -> Geometry {
        self.inner.geometry()
    }
    async fn read(&self, lba: u64, blocks: u32) -> BlockResult<Bytes> {
        self.inner.read(lba, blocks).await
    }
    async fn write(&self, lba: u64, data: Bytes, fua: bool) -> BlockResult<()> {
        let at = lba * 512;
        if (fua || self.unforced) && data.len() == 4096 && (8192..1 << 20).contains(&at) {
            let old = self.inner.read(lba, 8).await?;
            if old[512..] != data[512..] && self.armed.swap(false, Ordering::SeqCst) {
                self.inner.write(lba, data.slice(..512), true).await?;
                self.tore.add_permits(1);
                std::future::pending::<()>().await;
            }
        }
        self.inner.write(lba, data, fua).await
    }
    async fn flush(&self) -> BlockResult<()> {
        self.inner.flush().await
    }
    async fn discard(&self, lba: u64, blocks: u64) -> BlockResult<()> {
        self.inner.discard(lba, blocks).await
    }
}

/// The torn write's block (never acknowledged) holds either version.
async fn either_version(vol: &CacheVolume, oracle: &MemVolume, lba: u64, torn: &Bytes) {
    let got = vol.read(lba, 1).await.unwrap();
    let old = oracle.read(lba, 1).await.unwrap();
    assert!(
        got == old || got == *torn,
        "the torn write's block holds neither version"
    );
}

/// Acknowledged dirty data (one 4K write into each of 40 cache blocks of
/// `vol`, also in `oracle`), then `arm`, then writes into further blocks
/// until `tears` tears are counted in `tore`: the torn write (never
/// acknowledged, aborted) and its data.
async fn write_until_torn(
    vol: &Arc<CacheVolume>,
    oracle: &MemVolume,
    tore: &Semaphore,
    tears: u32,
    arm: impl FnOnce(),
) -> (u64, Bytes) {
    let per_block = BLOCK as u64 / 4096;
    for i in 0..40u64 {
        let data = pattern(i + 1, 4096);
        vol.write(i * per_block, data.clone(), false).await.unwrap();
        oracle.write(i * per_block, data, false).await.unwrap();
    }
    arm();
    for i in 40..100u64 {
        let (lba, data) = (i * per_block, pattern(i + 1, 4096));
        let mut w = tokio::spawn({
            let (vol, data) = (vol.clone(), data.clone());
            async move { vol.write(lba, data, false).await }
        });
        tokio::select! {
            r = &mut w => {
                r.unwrap().unwrap();
                oracle.write(lba, data, false).await.unwrap();
            }
            p = tore.acquire_many(tears) => {
                p.unwrap().forget();
                w.abort();
                let _ = w.await;
                return (lba, data);
            }
        }
    }
    panic!("no table page write was torn");
}

/// A power cut tears the table page write of a write-back cache on both
/// mirror halves at once (SSDs of 512-byte blocks; both halves take the
/// write together). The page's other copy holds its last durable version:
/// the cache starts and every acknowledged write reads back. With one copy
/// per page the cache refused to start ("damaged on every copy"), its dirty
/// records out of reach.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_page_torn_on_both_mirror_halves_leaves_its_other_copy() {
    let backing: VolumeRef = Arc::new(MemVolume::new(4096, BACKING_BYTES / 4096));
    let tore = Arc::new(Semaphore::new(0));
    let mems: Vec<Arc<MemVolume>> = (0..2)
        .map(|_| Arc::new(MemVolume::new(512, 8 << 10)))
        .collect();
    let ssds: Vec<Arc<Tearing>> = mems
        .iter()
        .map(|m| {
            Arc::new(Tearing {
                inner: m.clone(),
                armed: AtomicBool::new(false),
                tore: tore.clone(),
                unforced: false,
            })
        })
        .collect();
    let refs: Vec<VolumeRef> = ssds.iter().map(|s| s.clone() as VolumeRef).collect();
    let mut c = cfg(CacheMode::WriteBack);
    c.dirty_low_percent = 90;
    c.dirty_high_percent = 95;
    c.size_bytes = Some(2 << 20);
    let oracle = MemVolume::new(4096, BACKING_BYTES / 4096);
    let vol = Arc::new(
        CacheVolume::open("t", backing.clone(), devices(&refs), c.clone())
            .await
            .unwrap(),
    );
    // acknowledged dirty data, then writes until one's table write tears on
    // both halves
    let (torn_lba, torn_data) = write_until_torn(&vol, &oracle, &tore, 2, || {
        for s in &ssds {
            s.armed.store(true, Ordering::SeqCst);
        }
    })
    .await;
    assert!(vol.status().dirty_blocks >= 40, "the writes were destaged");
    // the power is gone: no clean stop
    vol.halt().await;
    drop(vol);
    let plain: Vec<VolumeRef> = mems.iter().map(|m| m.clone() as VolumeRef).collect();
    let vol = CacheVolume::open("t", backing.clone(), devices(&plain), c)
        .await
        .expect("the cache refused to start over a page torn on both halves");
    // the torn write was never acknowledged: either version of its block
    either_version(&vol, &oracle, torn_lba, &torn_data).await;
    verify_all(&vol, &oracle).await;
    assert!(vol.status().dirty_blocks >= 40, "dirty blocks lost");
}

/// Three faults in a row on a write-back cache's mirror: a power cut tears a
/// table page write on one half only (the other half took it); at the next
/// start, the full table write tears again on that half (a second power
/// cut); then the other half fails. The torn half's page must still have a
/// valid copy: the full write's first step goes to its torn slot, not over
/// its one valid copy (the version before). Until 2026-12-05 the full write
/// numbered both halves alike, its first step overwrote that copy, and the
/// cache refused to start ("damaged on every copy"), its dirty data lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_page_torn_on_one_half_is_never_overwritten_at_its_last_copy() {
    let backing: VolumeRef = Arc::new(MemVolume::new(4096, BACKING_BYTES / 4096));
    let tore = Arc::new(Semaphore::new(0));
    let mems: Vec<Arc<MemVolume>> = (0..2)
        .map(|_| Arc::new(MemVolume::new(512, 8 << 10)))
        .collect();
    let tearing = |m: &Arc<MemVolume>, unforced: bool| {
        Arc::new(Tearing {
            inner: m.clone(),
            armed: AtomicBool::new(false),
            tore: tore.clone(),
            unforced,
        })
    };
    let first = tearing(&mems[0], false);
    let refs: Vec<VolumeRef> = vec![first.clone(), mems[1].clone()];
    let mut c = cfg(CacheMode::WriteBack);
    c.dirty_low_percent = 90;
    c.dirty_high_percent = 95;
    c.size_bytes = Some(2 << 20); // 128 frames: one table page
    let oracle = MemVolume::new(4096, BACKING_BYTES / 4096);
    let vol = Arc::new(
        CacheVolume::open("t", backing.clone(), devices(&refs), c.clone())
            .await
            .unwrap(),
    );
    let per_block = BLOCK as u64 / 4096;
    // the first cut: a page write tears on half 0 only
    let (torn_lba, torn_data) = write_until_torn(&vol, &oracle, &tore, 1, || {
        first.armed.store(true, Ordering::SeqCst)
    })
    .await;
    vol.halt().await;
    drop(vol);
    // the second cut, during the next start's full table write on half 0
    // (half 0 is written first); half 1 is gone by the third start
    let second = tearing(&mems[0], true);
    second.armed.store(true, Ordering::SeqCst);
    let refs: Vec<VolumeRef> = vec![second.clone(), mems[1].clone()];
    let opening = tokio::spawn({
        let (backing, c) = (backing.clone(), c.clone());
        async move { CacheVolume::open("t", backing, devices(&refs), c).await }
    });
    tokio::time::timeout(Duration::from_secs(20), tore.acquire())
        .await
        .expect("the start's table write was never torn")
        .unwrap()
        .forget();
    opening.abort();
    let _ = opening.await;
    // the acknowledged data is on the cache only: the backing alone lacks it
    let mut on_backing = 0;
    for i in 0..40u64 {
        let b = backing.read(i * per_block, 1).await.unwrap();
        on_backing += usize::from(b == oracle.read(i * per_block, 1).await.unwrap());
    }
    assert!(on_backing < 40, "destaged: the test proves nothing");
    let dead = Arc::new(block::FaultVolume::new(mems[1].clone()));
    dead.plan().lock().dead = true;
    let refs: Vec<VolumeRef> = vec![mems[0].clone(), dead.clone()];
    let vol = CacheVolume::open("t", backing.clone(), devices(&refs), c)
        .await
        .expect("the half left lost its table page to the start's write");
    either_version(&vol, &oracle, torn_lba, &torn_data).await;
    // (degraded, the cache destages what it holds: its reads still serve it)
    verify_all(&vol, &oracle).await;
}

/// Both superblock copies of `ssd` (4096-byte blocks) rewritten as a version
/// before table slots wrote them: no two-copies flag in the mode byte (byte
/// 24, 0x10), checksum redone.
async fn as_written_before_slots(ssd: &VolumeRef) {
    for copy in 0..2 {
        let mut b = ssd.read(copy, 1).await.unwrap().to_vec();
        assert_eq!(&b[0..8], b"FSNCACH1", "no superblock copy {copy}");
        assert_eq!(b[24] & 0x10, 0x10, "not marked as two copies");
        b[24] &= !0x10;
        let crc = crc32c::crc32c(&b[..4092]);
        b[4092..].copy_from_slice(&crc.to_le_bytes());
        ssd.write(copy, Bytes::from(b), true).await.unwrap();
    }
}

/// A write-back cache made before the table had two copies, whose second
/// copy fits before its frames (a table under 0.5 MiB: 21,760 frames), gets
/// one in place at its next start: its dirty data stays, the second copy is
/// written (block 3 here), and the superblocks say so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cache_made_before_table_slots_gets_a_second_copy_in_place() {
    let (backing, ssds, c) = write_back_on_two_ssds();
    let oracle = MemVolume::new(4096, BACKING_BYTES / 4096);
    let vol = CacheVolume::open("t", backing.clone(), devices(&ssds), c.clone())
        .await
        .unwrap();
    let mut rng = Rng(23);
    small_writes(&vol, &oracle, &mut rng, 40).await;
    // a clean stop writes the table whole; as an earlier version leaves it,
    // the one page is at block 2 and block 3 is not the table's
    vol.shutdown().await.unwrap();
    drop(vol);
    for ssd in &ssds {
        as_written_before_slots(ssd).await;
        ssd.write(3, Bytes::from(vec![0x77; 4096]), true)
            .await
            .unwrap();
    }
    let vol = CacheVolume::open("t", backing.clone(), devices(&ssds), c.clone())
        .await
        .unwrap();
    assert!(vol.status().dirty_blocks > 0, "the dirty data is gone");
    small_writes(&vol, &oracle, &mut rng, 40).await;
    vol.halt().await;
    drop(vol);
    for ssd in &ssds {
        let second = ssd.read(3, 1).await.unwrap();
        assert!(
            second.iter().any(|&b| b != 0x77),
            "no second table copy was written"
        );
        // both copies: a version before slots must find no unmarked one
        let sb = ssd.read(0, 2).await.unwrap();
        assert!(
            sb[24] & 0x10 != 0 && sb[4096 + 24] & 0x10 != 0,
            "the superblock copies do not both say two copies"
        );
    }
    let vol = CacheVolume::open("t", backing.clone(), devices(&ssds), c)
        .await
        .unwrap();
    verify_all(&vol, &oracle).await;
}

/// A drain (as a detach runs it) returns only once the clean records of the
/// last destage batch are on the SSDs: the batch marks its blocks clean in
/// memory before it writes those records, and a drain that returned then let
/// the detach move the LUN to the backing volume while the SSDs still said
/// dirty; a power cut there brought the old dirty record back at the next
/// start, and its destage wrote the old data over what the host wrote to the
/// backing volume since (review of 2026-12-06).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_ends_only_once_the_clean_records_are_durable() {
    let (backing, ssds, c) = write_back_on_two_ssds();
    let held: Vec<Arc<block::HoldVolume>> = ssds
        .iter()
        .map(|s| Arc::new(block::HoldVolume::new(s.clone())))
        .collect();
    let hrefs: Vec<VolumeRef> = held.iter().map(|h| h.clone() as VolumeRef).collect();
    let vol = Arc::new(
        CacheVolume::open("t", backing.clone(), devices(&hrefs), c)
            .await
            .unwrap(),
    );
    let data = pattern(5, 64 << 10);
    vol.write(0, data.clone(), false).await.unwrap();
    assert!(vol.status().dirty_blocks > 0);
    // the table's page writes (past the two superblock blocks, before the
    // frames) wait
    for h in &held {
        h.writes.hold_range(2, 256);
    }
    // a first drain starts the destage, whose clean records wait
    let first = tokio::spawn({
        let vol = vol.clone();
        async move { vol.drain().await }
    });
    tokio::time::timeout(Duration::from_secs(10), held[0].writes.arrivals(1))
        .await
        .expect("the destage writes its clean records");
    assert_eq!(backing.read(0, 16).await.unwrap(), data);
    assert_eq!(vol.status().dirty_blocks, 0, "clean in memory already");
    // a drain that starts now (a detach's) must wait for them too
    let mut drain = tokio::spawn({
        let vol = vol.clone();
        async move { vol.drain().await }
    });
    assert!(
        tokio::time::timeout(Duration::from_millis(300), &mut drain)
            .await
            .is_err(),
        "the drain ended before the clean records were durable"
    );
    for h in &held {
        h.writes.open();
    }
    for d in [first, drain] {
        tokio::time::timeout(Duration::from_secs(20), d)
            .await
            .expect("the drain ends")
            .unwrap()
            .unwrap();
    }
    assert_eq!(vol.status().dirty_blocks, 0);
}

/// A sector of one table copy that cannot be read at open (a medium error)
/// costs that copy of that page, not the device: the page is read from its
/// other slot, both halves of the mirror stay in service, every dirty block
/// reads back, and the full table write at open writes the sector again.
/// Before (review of 2026-12-06), the first unreadable table sector failed
/// the whole device, which then started degraded (and a table larger than
/// one read's 256 pages could lose pages that had a good copy).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreadable_table_sector_at_open_costs_its_copy_not_the_device() {
    let (backing, ssds, c) = write_back_on_two_ssds();
    let vol = CacheVolume::open("t", backing.clone(), devices(&ssds), c.clone())
        .await
        .unwrap();
    let data = pattern(9, 256 << 10);
    vol.write(0, data.clone(), false).await.unwrap();
    assert!(vol.status().dirty_blocks > 0);
    vol.halt().await;
    drop(vol);
    // table page 0, slot 0 (the block after the two superblock copies) of
    // the first device cannot be read; the disk remaps it when written
    let faulty = Arc::new(block::FaultVolume::new(ssds[0].clone()));
    {
        let plan = faulty.plan();
        let mut plan = plan.lock();
        plan.remap_on_write = true;
        plan.bad_read_blocks.push(2..3);
    }
    let devs = devices(&[faulty.clone() as VolumeRef, ssds[1].clone()]);
    let vol = CacheVolume::open("t", backing.clone(), devs, c)
        .await
        .expect("open");
    let st = vol.status();
    assert!(
        st.devices.iter().all(|d| d.state == "ok"),
        "{:?}",
        st.devices
    );
    assert!(st.dirty_blocks > 0, "{st:?}");
    assert_eq!(vol.read(0, 64).await.unwrap(), data);
    assert!(
        faulty
            .plan()
            .lock()
            .bad_read_blocks
            .iter()
            .all(|r| r.is_empty()),
        "the unreadable sector was not written again"
    );
    vol.drain().await.unwrap();
    assert_eq!(backing.read(0, 64).await.unwrap(), data);
}

/// The surviving half fails while a finished resilver writes the whole
/// table: the replaced device, filled and live, holds everything and goes
/// on alone, and the blocks still read back. Before (review of 2026-12-06),
/// the end of the fill marked the replaced device failed too, and the cache
/// had no device left until a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_survivor_lost_at_the_end_of_a_resilver_leaves_the_replaced_device_serving() {
    let (backing, ssds, c) = write_back_on_two_ssds();
    let survivor = Arc::new(FaultVolume::new(ssds[0].clone()));
    let vol = CacheVolume::open(
        "t",
        backing.clone(),
        devices(&[survivor.clone() as VolumeRef, ssds[1].clone()]),
        c,
    )
    .await
    .unwrap();
    let data = pattern(3, 128 << 10);
    vol.write(0, data.clone(), false).await.unwrap();
    vol.fail_device(1).await.unwrap();
    // degraded, the cache destages from the survivor; let it finish
    status_until(&vol, 20, "the degraded cache never destaged", |s| {
        s.dirty_blocks == 0
    })
    .await;
    // the fill's last flush of the new device waits: then the survivor's
    // table can no longer be written, just before the final table write
    let new = Arc::new(block::HoldVolume::new(
        Arc::new(MemVolume::new(4096, 1 << 10)) as VolumeRef,
    ));
    new.flushes.hold();
    replace(&vol, 1, "new", new.clone() as VolumeRef).await;
    tokio::time::timeout(Duration::from_secs(20), new.flushes.arrivals(1))
        .await
        .expect("the fill never flushed the new device");
    survivor.plan().lock().bad_write_blocks.push(2..256);
    new.flushes.open();
    // the replaced device goes live before the final table write, whose
    // failure on the survivor comes after: both are awaited (the state
    // between them was asserted on, a flake under load)
    status_until(
        &vol,
        20,
        "the fill never ended with the survivor failed",
        |s| !s.devices[1].state.starts_with("resilvering") && s.devices[0].state == "failed",
    )
    .await;
    let st = vol.status();
    assert_eq!(
        (st.devices[0].state.as_str(), st.devices[1].state.as_str()),
        ("failed", "ok"),
        "{st:?}"
    );
    assert_eq!(vol.read(0, 32).await.unwrap(), data);
    assert!(
        vol.status().read_hits > 0,
        "the blocks were not served from the cache"
    );
}

/// A striped cache (write-through, two SSDs) stopped cleanly.
async fn striped_on_two_faulty_ssds() -> (VolumeRef, Vec<Arc<FaultVolume>>, CacheVolume) {
    let backing: VolumeRef = Arc::new(MemVolume::new(4096, BACKING_BYTES / 4096));
    let ssds: Vec<Arc<FaultVolume>> = (0..2)
        .map(|_| {
            Arc::new(FaultVolume::new(
                Arc::new(MemVolume::new(4096, 1 << 10)) as VolumeRef
            ))
        })
        .collect();
    let refs: Vec<VolumeRef> = ssds.iter().map(|s| s.clone() as VolumeRef).collect();
    let vol = CacheVolume::open(
        "t",
        backing.clone(),
        devices(&refs),
        cfg(CacheMode::WriteThrough),
    )
    .await
    .unwrap();
    (backing, ssds, vol)
}

/// Writes and reads `blocks` cache blocks of `seed`'s pattern from block 0.
async fn fill_blocks(vol: &CacheVolume, seed: u64, blocks: usize) -> Bytes {
    let data = pattern(seed, blocks * BLOCK as usize);
    vol.write(0, data.clone(), false).await.unwrap();
    assert_eq!(vol.read(0, data.len() as u32 / 4096).await.unwrap(), data);
    data
}

/// A striped cache with one SSD dead at start opens on the other, its state
/// saying so, and serves what the volume holds. Before (review of
/// 2026-12-06), the dead device failed the table write of the open and the
/// open failed: a read cache's dead SSD stopped the node's start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_striped_cache_opens_without_its_dead_device() {
    let (backing, ssds, vol) = striped_on_two_faulty_ssds().await;
    let data = fill_blocks(&vol, 5, 16).await;
    assert!(vol.status().cached_blocks > 0);
    vol.shutdown().await.unwrap();
    drop(vol);
    ssds[1].plan().lock().dead = true;
    let vol = reopen_striped(&backing, &ssds).await;
    let st = vol.status();
    assert_eq!(st.devices[0].state, "ok", "{st:?}");
    assert_eq!(st.devices[1].state, "failed", "{st:?}");
    assert!(st.state.starts_with("degraded: 1 of 2"), "{}", st.state);
    assert_eq!(vol.read(0, data.len() as u32 / 4096).await.unwrap(), data);
    let new = fill_blocks(&vol, 6, 16).await;
    assert_eq!(backing.read(0, new.len() as u32 / 4096).await.unwrap(), new);
    // and the device left caches them
    let hits = vol.status().read_hits;
    assert_eq!(vol.read(0, new.len() as u32 / 4096).await.unwrap(), new);
    assert!(vol.status().read_hits > hits, "{:?}", vol.status());
    vol.shutdown().await.unwrap();
}

/// Opens the striped cache of [`striped_on_two_faulty_ssds`] again.
async fn reopen_striped(backing: &VolumeRef, ssds: &[Arc<FaultVolume>]) -> CacheVolume {
    let refs: Vec<VolumeRef> = ssds.iter().map(|s| s.clone() as VolumeRef).collect();
    CacheVolume::open(
        "t",
        backing.clone(),
        devices(&refs),
        cfg(CacheMode::WriteThrough),
    )
    .await
    .expect("the open failed on the dead device")
}

/// The device that failed in an earlier run is the one left at the next
/// start. It failed at that run's open, so it still holds the clean table
/// of the stop before, and the blocks were written around it since: that
/// table must not be served (the device that could say so is dead); the
/// cache starts empty on it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_striped_cache_left_with_its_stale_device_starts_empty() {
    let (backing, ssds, vol) = striped_on_two_faulty_ssds().await;
    let old = fill_blocks(&vol, 7, 16).await;
    vol.shutdown().await.unwrap();
    drop(vol);
    // the second device takes no write at the next open: failed there
    ssds[1].plan().lock().bad_write_blocks.push(0..u64::MAX);
    let vol = reopen_striped(&backing, &ssds).await;
    assert_eq!(vol.status().devices[1].state, "failed");
    assert_eq!(vol.read(0, old.len() as u32 / 4096).await.unwrap(), old);
    // written around the failed device (and to the backing)
    let new = fill_blocks(&vol, 8, 16).await;
    vol.shutdown().await.unwrap();
    drop(vol);
    ssds[1].plan().lock().bad_write_blocks.clear();
    ssds[0].plan().lock().dead = true;
    let vol = reopen_striped(&backing, &ssds).await;
    let st = vol.status();
    assert_eq!(st.devices[0].state, "failed", "{st:?}");
    assert_eq!(st.cached_blocks, 0, "{st:?}");
    assert_eq!(vol.read(0, new.len() as u32 / 4096).await.unwrap(), new);
    vol.shutdown().await.unwrap();
}

/// A write through a degraded write-back cache (one mirror half failed) over
/// a dirty block, whose SSD write fails on the other half too (a shared
/// controller's reset): the write fails, and so does its retry while the
/// SSDs are gone; at the next start the block reads its last acknowledged
/// data. (Before, the retry found the block clean in memory, went to the
/// backing and was acknowledged, and at the next start the record of the old
/// dirty data brought it back over the acknowledged write.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_write_after_both_halves_failed_under_it_is_not_lost_at_the_next_start() {
    let backing = faulty_backing();
    // the destage never cleans anything: the block stays dirty
    backing.plan().lock().fail_flush = true;
    let faulty: Vec<Arc<FaultVolume>> = (0..2)
        .map(|_| Arc::new(FaultVolume::new(Arc::new(MemVolume::new(4096, 1 << 10)))))
        .collect();
    let ssds: Vec<VolumeRef> = faulty.iter().map(|f| f.clone() as VolumeRef).collect();
    let backing_ref = backing.clone() as VolumeRef;
    let (vol, c) = open_dirty_kept(&backing_ref, &ssds).await;
    let per_block = (BLOCK / 4096) as u64;
    let old = pattern(1, BLOCK as usize);
    vol.write(0, old.clone(), false).await.unwrap();
    vol.fail_device(0).await.unwrap();
    faulty[1].plan().lock().dead = true;
    let new = pattern(2, BLOCK as usize);
    assert!(vol.write(0, new.clone(), false).await.is_err());
    let retried = vol.write(0, new.clone(), false).await;
    vol.halt().await;
    drop(vol);
    faulty[1].plan().lock().dead = false;
    let vol = CacheVolume::open("t", backing_ref, devices(&ssds), c)
        .await
        .unwrap();
    let got = vol.read(0, per_block as u32).await.unwrap();
    assert!(
        retried.is_err() || got == new,
        "an acknowledged write was lost"
    );
    assert!(
        retried.is_err(),
        "the retry was acknowledged while the SSDs were gone"
    );
    assert!(
        got == old,
        "the block does not read its last acknowledged data"
    );
}

/// A request that reaches the cache after it stopped is refused: the map the
/// stop wrote is what the next start trusts. Before (review of 2026-12-06) a
/// read after `shutdown` filled a frame behind a map already written clean,
/// and a write-back write after it was acknowledged and never destaged.
#[tokio::test]
async fn a_stopped_cache_refuses_requests() {
    let (backing, ssds, c) = write_back_on_two_ssds();
    let vol = CacheVolume::open("t", backing.clone(), devices(&ssds), c.clone())
        .await
        .unwrap();
    vol.write(0, pattern(1, 4096), false).await.unwrap();
    vol.shutdown().await.unwrap();
    let unavailable = |r: BlockResult<()>| matches!(r, Err(block::BlockError::Unavailable(_)));
    assert!(unavailable(vol.read(8, 4).await.map(|_| ())), "a read");
    assert!(
        unavailable(vol.write(8, pattern(2, 4096), false).await),
        "a write"
    );
    assert!(unavailable(vol.discard(0, 1).await), "a discard");
    let blocks = vol.geometry().block_count;
    assert!(unavailable(vol.grow(blocks + 4).await), "a grow");
    drop(vol);
    // what the cache acknowledged before its stop is all there is
    let vol = CacheVolume::open("t", backing.clone(), devices(&ssds), c)
        .await
        .unwrap();
    assert_eq!(vol.read(0, 1).await.unwrap(), pattern(1, 4096));
    assert_eq!(
        vol.read(8, 1).await.unwrap(),
        backing.read(8, 1).await.unwrap()
    );
    assert_eq!(vol.status().dirty_bytes, 4096);
}

/// Makes block `at` of every SSD in `faulty` unreadable until written.
fn unreadable_until_written(faulty: &[Arc<FaultVolume>], at: u64) {
    for f in faulty {
        let plan = f.plan();
        let mut p = plan.lock();
        p.bad_read_blocks = std::iter::once(at..at + 1).collect();
        p.remap_on_write = true;
    }
}

fn media_errors(vol: &CacheVolume) -> Vec<u64> {
    vol.status()
        .devices
        .iter()
        .map(|d| d.media_errors)
        .collect()
}

/// An unreadable sector on one half of a write-back mirror costs that sector,
/// not the half: the data comes from the other half, which is written over
/// the unreadable copy, and the mirror stays whole. Before (review of
/// 2026-12-06) the read failed the half and the cache ran degraded,
/// write-through, for one latent sector error.
#[tokio::test]
async fn an_unreadable_sector_on_one_mirror_half_is_read_from_the_other_and_written_again() {
    let (_backing, faulty, vol, at) = one_dirty_sector_on_faulty_halves().await;
    // the first frame is read from the first half first
    unreadable_until_written(&faulty[..1], at);
    assert_eq!(vol.read(0, 1).await.unwrap(), pattern(1, 4096));
    let st = vol.status();
    assert!(st.devices.iter().all(|d| d.state == "ok"), "{st:?}");
    assert_eq!(media_errors(&vol), vec![1, 0]);
    assert!(
        faulty[0].plan().lock().bad_read_blocks.is_empty(),
        "the unreadable copy was written again"
    );
    // the second half alone now fails there: the first half's copy serves
    unreadable_until_written(&faulty[1..], at);
    assert_eq!(vol.read(0, 1).await.unwrap(), pattern(1, 4096));
    assert_eq!(vol.status().mode, "write-back");
}

/// The copy written over one half's unreadable sector (from the other half)
/// and a host write of the same block do not cross: the write waits for the
/// read that found the error, and with it for the copy. Crossed, the older
/// copy lands over the host's new data on that half alone, and the halves
/// answer the block differently (the other half's loss would then serve the
/// old data).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_write_waits_for_the_copy_written_over_an_unreadable_sector() {
    let backing: VolumeRef = Arc::new(MemVolume::new(4096, BACKING_BYTES / 4096));
    let (mems, faulty) = faulty_halves();
    let gated = Arc::new(block::HoldVolume::new(faulty[0].clone()));
    let refs: Vec<VolumeRef> = vec![gated.clone(), faulty[1].clone()];
    let (_, _, c) = write_back_on_two_ssds();
    let vol = Arc::new(
        CacheVolume::open("t", backing.clone(), devices(&refs), c)
            .await
            .unwrap(),
    );
    vol.write(0, pattern(1, 4096), false).await.unwrap();
    let at = block_holding(&mems[0], &pattern(1, 4096)).await;
    // the first frame is read from the first half first: it fails there,
    // reads from the second, and the copy written back to the first is held
    unreadable_until_written(&faulty[..1], at);
    gated.writes.hold_range(at, at + 1);
    let reader = tokio::spawn({
        let vol = vol.clone();
        async move { vol.read(0, 1).await }
    });
    gated.writes.arrivals(1).await;
    // later writes pass the gate; the held copy stays held
    gated.writes.hold_range(0, 0);
    let mut writer = tokio::spawn({
        let vol = vol.clone();
        async move { vol.write(0, pattern(2, 4096), false).await }
    });
    // (no event says "waiting for the lock": a bounded wait for what must
    // not happen; it cannot fail a correct cache)
    assert!(
        tokio::time::timeout(Duration::from_millis(300), &mut writer)
            .await
            .is_err(),
        "the host write ended while the copy over the unreadable sector was held"
    );
    gated.writes.release(1);
    assert_eq!(reader.await.unwrap().unwrap(), pattern(1, 4096));
    writer.await.unwrap().unwrap();
    // each half alone answers the host's data
    assert_eq!(mems[0].read(at, 1).await.unwrap(), pattern(2, 4096));
    faulty[1].plan().lock().dead = true;
    assert_eq!(vol.read(0, 1).await.unwrap(), pattern(2, 4096));
    assert!(vol.status().devices[0].state == "ok", "{:?}", vol.status());
}

/// A mirror half whose unreadable sectors keep coming is taken out once it
/// has met more than 20 of them lately (md's default for a member's
/// corrected read errors): the cache goes write-through on the other half,
/// its data intact, and says so. The survivor, the last copy, is never
/// failed for them: its unreadable dirty sectors are medium errors for
/// their block, and it serves the rest.
#[tokio::test]
async fn a_mirror_half_that_keeps_answering_medium_errors_is_taken_out() {
    let (_backing, faulty, vol, at) = one_dirty_sector_on_faulty_halves().await;
    // 30 more dirty blocks, for the survivor below
    for k in 1..=30u64 {
        vol.write(4 * k, pattern(100 + k, 4096), false)
            .await
            .unwrap();
    }
    for met in 1..=21u64 {
        assert_eq!(
            vol.status().devices[0].state,
            "ok",
            "after {} errors",
            met - 1
        );
        // the first frame is read from the first half first
        unreadable_until_written(&faulty[..1], at);
        assert_eq!(vol.read(0, 1).await.unwrap(), pattern(1, 4096));
        assert_eq!(media_errors(&vol)[0], met);
    }
    let st = vol.status();
    assert_ne!(st.devices[0].state, "ok", "{st:?}");
    assert_eq!(st.devices[1].state, "ok", "{st:?}");
    assert!(st.state.starts_with("degraded"), "{st:?}");
    // the rest of the cache serves from the survivor, whose unreadable
    // sectors never fail it: the 30 dirty blocks' sectors, unreadable on it,
    // each read by the host (a host's retries of one are answered from the
    // cache's record of it, without reading the survivor again)
    let mut bad = Vec::new();
    for k in 1..=30u64 {
        let on = block_on_volume(&*faulty[1], &pattern(100 + k, 4096)).await;
        bad.push(on..on + 1);
    }
    {
        let plan = faulty[1].plan();
        let mut p = plan.lock();
        p.bad_read_blocks = bad;
        p.remap_on_write = false;
    }
    let before = media_errors(&vol)[1];
    for k in 1..=30u64 {
        for _ in 0..2 {
            match vol.read(4 * k, 1).await {
                Err(block::BlockError::Medium { lba }) => assert_eq!(lba, 4 * k),
                other => panic!("block {}: {:?}", 4 * k, other.map(|b| b.len())),
            }
        }
    }
    assert_eq!(vol.status().devices[1].state, "ok");
    let met = media_errors(&vol)[1] - before;
    assert!(met >= 30, "the survivor met {met} unreadable sectors");
    vol.write(8, pattern(3, 4096), false).await.unwrap();
    assert_eq!(vol.read(8, 1).await.unwrap(), pattern(3, 4096));
}

/// Dirty data no copy can read is a medium error at the host's block, for
/// that block only: the devices stay in service, the rest of the cache
/// serves and takes writes back, and a write over the block makes it
/// readable again. Before (review of 2026-12-06) the read failed both
/// halves, and every dirty block of the cache was lost with them.
#[tokio::test]
async fn dirty_data_no_copy_can_read_is_a_medium_error_for_that_block_alone() {
    let (backing, faulty, vol, at) = one_dirty_sector_on_faulty_halves().await;
    vol.write(40, pattern(5, 4096), false).await.unwrap();
    unreadable_until_written(&faulty, at);
    match vol.read(0, 2).await {
        Err(block::BlockError::Medium { lba }) => {
            assert_eq!(lba, 0, "the host's block (the SSD's is {at})")
        }
        other => panic!("{:?}", other.map(|b| b.len())),
    }
    let st = vol.status();
    assert!(st.devices.iter().all(|d| d.state == "ok"), "{st:?}");
    assert_eq!(st.mode, "write-back");
    // recorded by that read: the host's retries read no copy again
    assert_eq!(st.unreadable_dirty_bytes, 4096, "{st:?}");
    let errors = media_errors(&vol);
    for _ in 0..3 {
        assert!(matches!(
            vol.read(0, 2).await,
            Err(block::BlockError::Medium { lba: 0 })
        ));
    }
    assert_eq!(media_errors(&vol), errors, "read again");
    assert_eq!(vol.read(40, 1).await.unwrap(), pattern(5, 4096));
    // the block's clean sectors still read (from the backing volume)
    assert_eq!(
        vol.read(2, 2).await.unwrap(),
        backing.read(2, 2).await.unwrap()
    );
    vol.write(0, pattern(6, 4096), false).await.unwrap();
    assert_eq!(vol.read(0, 1).await.unwrap(), pattern(6, 4096));
    assert_eq!(vol.status().dirty_bytes, 2 * 4096);
    // the host's block, not the SSD's, inside a frame past the first: block
    // 6 is the third sector of cache block 1
    vol.write(6, pattern(8, 4096), false).await.unwrap();
    let at6 = block_on_volume(&*faulty[0], &pattern(8, 4096)).await;
    unreadable_until_written(&faulty, at6);
    match vol.read(4, 4).await {
        Err(block::BlockError::Medium { lba }) => assert_eq!(lba, 6, "(the SSD's is {at6})"),
        other => panic!("{:?}", other.map(|b| b.len())),
    }
}

/// The block of volume `v` that holds `data`.
async fn block_on_volume(v: &dyn Volume, data: &[u8]) -> u64 {
    let image = v.read(0, v.geometry().block_count as u32).await.unwrap();
    image
        .chunks(4096)
        .position(|b| b == data)
        .expect("the sector is on the SSD") as u64
}

/// A clean sector the destage cannot read costs nothing: the frame forgets
/// its clean sectors and the next pass writes the dirty ones alone. Before
/// (review of 2026-12-06) the whole block's write failed at every pass, and
/// a drain (a detach) could never finish.
#[tokio::test]
async fn the_destage_goes_around_a_clean_sector_it_cannot_read() {
    let (backing, faulty, vol, at) = one_dirty_sector_on_faulty_halves().await;
    filled_with_every_device_in_service(&vol, &backing).await;
    // the frame's third sector, clean, unreadable on both halves
    for f in &faulty {
        f.plan().lock().bad_read_blocks = std::iter::once(at + 2..at + 3).collect();
    }
    tokio::time::timeout(Duration::from_secs(30), vol.drain())
        .await
        .expect("the drain ended")
        .expect("the drain finished");
    assert_eq!(vol.status().dirty_bytes, 0);
    assert_eq!(backing.read(0, 1).await.unwrap(), pattern(1, 4096));
    assert!(media_errors(&vol).iter().sum::<u64>() > 0);
}

/// Dirty data no cache device can read costs only itself at the destage:
/// the pass that meets it finds which sectors they are, and the next ones
/// write every other dirty block of its run and leave those sectors dirty,
/// reading them no more; a drain says why it cannot end, and ends once the
/// host has written them again. Before, a wholly dirty block with one such
/// sector failed the backing write of its whole run (up to 1 MiB of
/// neighbours) at every pass, and every pass read it again on both halves,
/// counting medium errors until one half was taken out.
#[tokio::test]
async fn the_destage_goes_around_dirty_data_no_copy_can_read() {
    let (backing, faulty, vol, at) = one_dirty_sector_on_faulty_halves().await;
    // block 0 wholly dirty, and three neighbours (cache blocks 1-3) with it:
    // one run of 64 KiB
    vol.write(1, pattern(2, 3 * 4096), false).await.unwrap();
    vol.write(4, pattern(3, 12 * 4096), false).await.unwrap();
    unreadable_until_written(&faulty, at);
    let err = tokio::time::timeout(Duration::from_secs(60), vol.drain())
        .await
        .expect("the drain gave up instead of waiting for good")
        .expect_err("a drain cannot end with data no device can read");
    assert!(
        err.to_string().contains("no cache device can read"),
        "{err}"
    );
    // everything else reached the backing volume; the unreadable sector did not
    assert_eq!(backing.read(1, 3).await.unwrap(), pattern(2, 3 * 4096));
    assert_eq!(backing.read(4, 12).await.unwrap(), pattern(3, 12 * 4096));
    assert_eq!(backing.read(0, 1).await.unwrap(), pattern(9, 16384)[..4096]);
    let st = vol.status();
    assert_eq!(
        (st.dirty_bytes, st.unreadable_dirty_bytes),
        (4096, 4096),
        "{st:?}"
    );
    assert!(st.devices.iter().all(|d| d.state == "ok"), "{st:?}");
    // more passes over it read it no more
    let errors = media_errors(&vol);
    assert!(errors.iter().all(|&e| e > 0), "{errors:?}");
    vol.drain().await.expect_err("still unreadable");
    assert_eq!(media_errors(&vol), errors, "read again");
    // so do the host's reads: a medium error at the sector, as a disk answers
    // for a pending sector, and the rest of the block is read as ever
    for (lba, n) in [(0, 1), (0, 4), (0, 16)] {
        match vol.read(lba, n).await {
            Err(block::BlockError::Medium { lba: 0 }) => {}
            r => panic!("read {lba}+{n}: {r:?}"),
        }
    }
    assert_eq!(vol.read(1, 3).await.unwrap(), pattern(2, 3 * 4096));
    assert_eq!(media_errors(&vol), errors, "read again by the host");
    assert!(vol.status().devices.iter().all(|d| d.state == "ok"));
    // written again by the host: readable, destaged, and the drain ends
    vol.write(0, pattern(6, 4096), false).await.unwrap();
    assert_eq!(vol.status().unreadable_dirty_bytes, 0);
    tokio::time::timeout(Duration::from_secs(60), vol.drain())
        .await
        .expect("the drain ended")
        .expect("the drain finished");
    assert_eq!(backing.read(0, 1).await.unwrap(), pattern(6, 4096));
    assert_eq!(vol.status().dirty_bytes, 0);
}

/// A record of dirty sectors no copy could read is tried again once
/// `UNREADABLE_RETRY_AFTER` (ten minutes) has passed, since the error may have
/// been passing: when the sectors read again, the destage writes them out and
/// a drain ends, with no host write needed. Until then the destage leaves
/// them out and reads them no more, readable or not.
#[tokio::test]
async fn dirty_sectors_that_read_again_are_destaged_after_the_retry_time() {
    let under = Arc::new(FaultVolume::new(Arc::new(MemVolume::new(
        4096,
        BACKING_BYTES / 4096,
    ))));
    let (backing, faulty, vol, at) = one_dirty_sector_on_faulty_halves_over(under.clone()).await;
    unreadable_until_written(&faulty, at);
    vol.drain()
        .await
        .expect_err("a drain cannot end with data no device can read");
    assert_eq!(vol.status().unreadable_dirty_bytes, 4096);
    let errors = media_errors(&vol);
    assert!(errors.iter().all(|&e| e > 0), "{errors:?}");
    // the error passes: the sector reads again on both halves
    for f in &faulty {
        f.plan().lock().bad_read_blocks.clear();
    }
    // before the retry time the record holds: left out, not read; and a pass
    // that only leaves data out writes nothing, so it flushes nothing (a
    // flush would fail here) and is no destage error
    under.plan().lock().fail_flush = true;
    let destage_errors = vol.status().destage_errors;
    let err = vol.drain().await.expect_err("tried again before its time");
    assert!(
        err.to_string().contains("no cache device can read"),
        "{err}"
    );
    assert_eq!(
        vol.status().destage_errors,
        destage_errors,
        "a flush was sent"
    );
    assert_eq!(vol.status().unreadable_dirty_bytes, 4096);
    under.plan().lock().fail_flush = false;
    assert_eq!(backing.read(0, 1).await.unwrap(), pattern(9, 16384)[..4096]);
    // ten minutes on (tokio's clock, which the record keeps its time by)
    tokio::time::pause();
    tokio::time::advance(Duration::from_secs(601)).await;
    tokio::time::resume();
    tokio::time::timeout(Duration::from_secs(60), vol.drain())
        .await
        .expect("the drain ended")
        .expect("the drain finished once the sector read again");
    assert_eq!(backing.read(0, 1).await.unwrap(), pattern(1, 4096));
    let st = vol.status();
    assert_eq!(
        (st.dirty_bytes, st.unreadable_dirty_bytes),
        (0, 0),
        "{st:?}"
    );
    assert_eq!(media_errors(&vol), errors, "a read failed again");
    assert!(st.devices.iter().all(|d| d.state == "ok"), "{st:?}");
}

/// Log lines of this thread's tasks, kept to be read back.
#[derive(Clone, Default)]
struct Logs(Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Logs {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Logs {
    fn count(&self, what: &str) -> usize {
        String::from_utf8_lossy(&self.0.lock().unwrap())
            .lines()
            .filter(|l| l.contains(what))
            .count()
    }
}

/// A destage that fails the same way at every pass (once a second: here the
/// backing refuses the write) says so in the log once a minute, not at every
/// pass, while every failed pass is counted.
#[tokio::test]
async fn a_destage_failing_at_every_pass_is_logged_once_a_minute() {
    // (the runtime runs its tasks on this thread: they log here)
    let logs = Logs::default();
    let w = logs.clone();
    let _logging = tracing::subscriber::set_default(
        tracing_subscriber::fmt()
            .with_ansi(false)
            .with_writer(move || w.clone())
            .finish(),
    );
    let under = Arc::new(FaultVolume::new(Arc::new(MemVolume::new(
        4096,
        BACKING_BYTES / 4096,
    ))));
    let (_backing, _faulty, vol, _) = one_dirty_sector_on_faulty_halves_over(under.clone()).await;
    under.plan().lock().bad_write_blocks = std::iter::once(0..BACKING_BYTES / 4096).collect();
    assert_eq!(vol.status().dirty_bytes, 4096, "destaged already");
    const FAILED: &str = "destage failed";
    // (tokio's clock, paused: it moves on whenever every task waits)
    tokio::time::pause();
    let errors = vol.status().destage_errors;
    tokio::time::sleep(Duration::from_secs(30)).await;
    let passes = vol.status().destage_errors - errors;
    assert!(passes >= 10, "{passes} failed passes in 30 s");
    assert_eq!(logs.count(FAILED), 1, "{passes} failed passes");
    tokio::time::sleep(Duration::from_secs(35)).await;
    assert_eq!(logs.count(FAILED), 2, "one minute on");
    // the backing takes writes again: the destage ends, nothing more logged
    under.plan().lock().bad_write_blocks.clear();
    tokio::time::timeout(Duration::from_secs(60), vol.drain())
        .await
        .expect("the drain ended")
        .expect("the drain finished");
    tokio::time::sleep(Duration::from_secs(120)).await;
    assert_eq!(logs.count(FAILED), 2);
    assert_eq!(vol.status().dirty_bytes, 0);
}

/// An unreadable clean sector is read from the backing volume; the frame
/// forgets the clean sectors it held, and the next read fills them, which
/// writes the unreadable sector again (a disk remaps a sector it is written).
#[tokio::test]
async fn an_unreadable_clean_sector_is_read_from_the_backing_and_filled_again() {
    let backing: VolumeRef = Arc::new(MemVolume::new(4096, BACKING_BYTES / 4096));
    backing.write(32, pattern(7, 16384), false).await.unwrap();
    let mem = Arc::new(MemVolume::new(4096, 1 << 10));
    let faulty = Arc::new(FaultVolume::new(mem.clone() as VolumeRef));
    let vol = CacheVolume::open(
        "t",
        backing.clone(),
        devices(&[faulty.clone() as VolumeRef]),
        cfg(CacheMode::ReadOnly),
    )
    .await
    .unwrap();
    let want = backing.read(32, 4).await.unwrap();
    // admitted on a second miss at most: read until it is a hit
    for _ in 0..3 {
        assert_eq!(vol.read(32, 4).await.unwrap(), want);
    }
    let hits = vol.status().read_hits;
    assert_eq!(vol.read(32, 4).await.unwrap(), want);
    assert!(vol.status().read_hits > hits, "cached: {:?}", vol.status());
    let at = block_holding(&mem, &want[4096..8192]).await;
    unreadable_until_written(std::slice::from_ref(&faulty), at);
    assert_eq!(vol.read(32, 4).await.unwrap(), want);
    assert_eq!(media_errors(&vol), vec![1]);
    assert_eq!(vol.status().devices[0].state, "ok");
    // the next read fills the frame again, writing the unreadable sector
    assert_eq!(vol.read(32, 4).await.unwrap(), want);
    assert!(
        faulty.plan().lock().bad_read_blocks.is_empty(),
        "written again"
    );
    let hits = vol.status().read_hits;
    assert_eq!(vol.read(32, 4).await.unwrap(), want);
    assert!(vol.status().read_hits > hits);
    assert_eq!(media_errors(&vol), vec![1]);
}

/// A resilver that meets a clean sector the survivor cannot read leaves it
/// out (the frame forgets it: the backing has it) and completes. Before
/// (review of 2026-12-06) the survivor failed, and with it every dirty
/// block of the cache, the replacement not yet live.
#[tokio::test]
async fn a_resilver_goes_around_a_clean_sector_the_survivor_cannot_read() {
    let (backing, faulty, vol, _) = one_dirty_sector_on_faulty_halves().await;
    // a clean block cached (blocks 4-7: cache block 1)
    backing.write(4, pattern(11, 16384), false).await.unwrap();
    let want = backing.read(4, 4).await.unwrap();
    let hits = vol.status().read_hits;
    for _ in 0..3 {
        assert_eq!(vol.read(4, 4).await.unwrap(), want);
    }
    assert!(vol.status().read_hits > hits, "not cached");
    let at = block_on_volume(&*faulty[1], &want[8192..12288]).await;
    // the first half dies (a write finds it), the survivor cannot read
    // the clean block's third sector
    faulty[0].plan().lock().dead = true;
    vol.write(40, pattern(12, 4096), false).await.unwrap();
    assert_eq!(vol.status().devices[0].state, "failed");
    faulty[1].plan().lock().bad_read_blocks = std::iter::once(at..at + 1).collect();
    replace(&vol, 0, "new", fault_ssd() as VolumeRef).await;
    status_until(&vol, 30, "the mirror never became whole again", |s| {
        s.state == "ok"
    })
    .await;
    let st = vol.status();
    assert!(st.devices.iter().all(|d| d.state == "ok"), "{st:?}");
    assert_eq!(media_errors(&vol), vec![0, 1], "the sector was met");
    assert_eq!(vol.read(4, 4).await.unwrap(), want);
    assert_eq!(vol.read(0, 1).await.unwrap(), pattern(1, 4096));
}

/// [`one_dirty_sector_on_faulty_halves`] over a volume of 512-byte host
/// blocks (so a write can be smaller than the cache's sector), the first
/// half dead and failed (a write of host blocks 320-327 found it), the
/// survivor unable to read the dirty sector (host blocks 0-7): the destage
/// from the survivor that follows cannot write it out either.
async fn a_survivor_that_cannot_read_its_dirty_sector(
) -> (VolumeRef, Vec<Arc<FaultVolume>>, CacheVolume) {
    let backing: VolumeRef = Arc::new(MemVolume::new(512, BACKING_BYTES / 512));
    let (backing, faulty, vol, at) = one_dirty_sector_on_faulty_halves_over(backing).await;
    faulty[1].plan().lock().bad_read_blocks = std::iter::once(at..at + 1).collect();
    faulty[0].plan().lock().dead = true;
    vol.write(320, pattern(12, 4096), false).await.unwrap();
    assert_eq!(vol.status().devices[0].state, "failed");
    (backing, faulty, vol)
}

/// A resilver cut short after it made a sector lost (the replacement refuses
/// the next frame's data) leaves the survivor's record of it durable and
/// both of the survivor's superblock copies flagged before that record: a
/// version before lost sectors refuses the table, and a restart still
/// answers the sector with a medium error.
#[tokio::test]
async fn a_resilver_cut_short_after_making_a_sector_lost_leaves_it_recorded() {
    let (backing, faulty, vol) = a_survivor_that_cannot_read_its_dirty_sector().await;
    // the replacement takes its superblocks (wiped at the replace) and
    // refuses every other write: the first frame it must be written fails it
    let new = fault_ssd();
    new.plan().lock().bad_write_blocks = std::iter::once(2..1 << 10).collect();
    replace(&vol, 0, "new", new.clone() as VolumeRef).await;
    status_until(&vol, 30, "the replacement was not given up", |s| {
        s.devices[0].state == "failed"
    })
    .await;
    let st = vol.status();
    assert_eq!(
        st.lost_dirty_bytes, 4096,
        "block 0's frame not reached first: {st:?}"
    );
    assert_eq!(lost_sector_flags(&faulty[1]).await, (true, true));
    // a crash, and the survivor alone: the record was on it
    vol.halt().await;
    drop(vol);
    let vol = CacheVolume::open(
        "t",
        backing.clone(),
        devices(&[fault_ssd(), faulty[1].clone()]),
        dirty_kept(),
    )
    .await
    .unwrap();
    let st = vol.status();
    assert_eq!(st.lost_dirty_bytes, 4096, "{st:?}");
    assert!(matches!(
        vol.read(0, 8).await,
        Err(block::BlockError::Medium { lba: 0 })
    ));
}

/// Whether every superblock copy of `ssd` (4 KiB blocks) says its table may
/// hold lost sectors (the mode byte's flag 0x20; a copy never written, all
/// zeroes, says nothing), and whether the newest does.
async fn lost_sector_flags(ssd: &FaultVolume) -> (bool, bool) {
    let b = ssd.read(0, 2).await.unwrap();
    let copy = |i: usize| &b[i * 4096..(i + 1) * 4096];
    let written = |i: usize| &copy(i)[0..8] == b"FSNCACH1";
    let flag = |i: usize| copy(i)[24] & 0x20 != 0;
    let generation = |i: usize| u64::from_le_bytes(copy(i)[16..24].try_into().unwrap());
    let newest = usize::from(written(1) && generation(1) > generation(0));
    let every = (0..2).all(|i| !written(i) || flag(i));
    (every, flag(newest))
}

/// Dirty data the survivor cannot read does not keep the mirror without
/// redundancy: the resilver copies around it and records it lost (dirty and
/// not valid in the table, so a restart keeps it, both superblock copies
/// flagged first so that a version before lost sectors refuses the table).
/// Reads of it are medium errors without reading the SSDs, a fill of its
/// block leaves it alone, a write smaller than its sector fails as a read
/// does, and a host write of the whole sector makes it good again. Until
/// 2026-12-07 the replacement was given up and the cache ran write-through,
/// without redundancy, until the host wrote the block.
#[tokio::test]
async fn a_resilver_copies_around_dirty_data_the_survivor_cannot_read_which_stays_lost() {
    let (backing, faulty, vol) = a_survivor_that_cannot_read_its_dirty_sector().await;
    let new = fault_ssd();
    replace(&vol, 0, "new", new.clone() as VolumeRef).await;
    status_until(&vol, 30, "the mirror never became whole again", |s| {
        s.state == "ok"
    })
    .await;
    let st = vol.status();
    assert!(st.devices.iter().all(|d| d.state == "ok"), "{st:?}");
    assert_eq!(
        (st.lost_dirty_bytes, st.unreadable_dirty_bytes),
        (4096, 4096),
        "{st:?}"
    );
    assert_eq!(lost_sector_flags(&new).await, (true, true));
    assert_eq!(lost_sector_flags(&faulty[1]).await, (true, true));
    let met = media_errors(&vol);
    let medium = |r: block::BlockResult<Bytes>| match r {
        Err(block::BlockError::Medium { lba }) => Some(lba),
        _ => None,
    };
    assert_eq!(medium(vol.read(0, 8).await), Some(0));
    assert_eq!(medium(vol.read(2, 1).await), Some(2));
    assert_eq!(media_errors(&vol), met, "the lost sector was read");
    // a write of part of the sector cannot be merged with what it held
    assert!(matches!(
        vol.write(1, pattern(5, 512), false).await,
        Err(block::BlockError::Medium { lba: 1 })
    ));
    assert_eq!(medium(vol.read(0, 1).await), Some(0));
    // a crash, and the cache opened again: the sector is still lost
    vol.halt().await;
    drop(vol);
    let ssds: Vec<VolumeRef> = vec![new.clone(), faulty[1].clone()];
    let vol = CacheVolume::open("t", backing.clone(), devices(&ssds), dirty_kept())
        .await
        .unwrap();
    let st = vol.status();
    assert_eq!(st.lost_dirty_bytes, 4096, "{st:?}");
    assert_eq!(medium(vol.read(0, 8).await), Some(0));
    assert_eq!(media_errors(&vol), vec![0, 0], "the lost sector was read");
    // the rest of the block is filled from the backing, the lost sector not
    // (the destage's record of unreadable sectors, in memory, is gone)
    let fills = vol.status().fills;
    assert_eq!(
        vol.read(8, 24).await.unwrap(),
        backing.read(8, 24).await.unwrap()
    );
    assert!(vol.status().fills > fills, "no fill");
    assert_eq!(
        medium(vol.read(0, 8).await),
        Some(0),
        "filled from the backing"
    );
    // a drain (as a detach asks) cannot end: the destage leaves it out, and
    // the backing keeps its older data rather than what the frame holds
    let e = vol.drain().await.unwrap_err().to_string();
    assert!(e.contains("no cache device can read"), "{e}");
    assert_eq!(
        backing.read(0, 8).await.unwrap(),
        pattern(9, 16384).slice(0..4096)
    );
    assert_eq!(medium(vol.read(0, 8).await), Some(0));
    // a clean stop and a new open: still lost
    vol.shutdown().await.unwrap();
    drop(vol);
    let vol = CacheVolume::open("t", backing.clone(), devices(&ssds), dirty_kept())
        .await
        .unwrap();
    assert_eq!(vol.status().lost_dirty_bytes, 4096);
    assert_eq!(medium(vol.read(0, 8).await), Some(0));
    assert_eq!(media_errors(&vol), vec![0, 0], "the lost sector was read");
    // written whole by the host (by a write that ends in the next sector,
    // which is read around it), it is good again; a clean stop then clears
    // the newest superblock's flag
    faulty[1].plan().lock().remap_on_write = true;
    vol.write(0, pattern(3, 4608), false).await.unwrap();
    assert_eq!(vol.read(0, 9).await.unwrap(), pattern(3, 4608));
    // (the rest of the sector it ends in is what it was)
    assert_eq!(
        vol.read(9, 7).await.unwrap(),
        pattern(9, 16384).slice(4608..8192)
    );
    let st = vol.status();
    assert_eq!(st.lost_dirty_bytes, 0, "{st:?}");
    // (both sectors it touched dirty: written back, not through)
    assert!(st.dirty_bytes >= 8192, "{st:?}");
    vol.shutdown().await.unwrap();
    assert!(!lost_sector_flags(&new).await.1, "the flag stays");
    let vol = CacheVolume::open("t", backing.clone(), devices(&ssds), dirty_kept())
        .await
        .unwrap();
    assert_eq!(vol.read(0, 9).await.unwrap(), pattern(3, 4608));
    assert_eq!(vol.read(320, 8).await.unwrap(), pattern(12, 4096));
}
