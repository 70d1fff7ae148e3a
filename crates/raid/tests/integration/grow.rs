//! Growing a pool online: every level that can grow, with I/O below the old end
//! in the middle of the grow; the new space reads zeroes, takes writes, keeps
//! parity consistent, survives a member loss and a reassemble; a power cut at
//! every point of a grow reopens the pool at the old or the new size, consistent
//! either way; refusals leave the pool as it was; file-backed members are extended
//! by the grow itself.

use crate::common;

use async_trait::async_trait;
use block::{
    BlockError, BlockResult, Bytes, CrashSimVolume, Extent, Geometry, MemVolume, Volume, VolumeRef,
};
use common::*;
use raid::{Member, Pool, PoolConfig, PoolState, RaidError, RaidLevel};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;

/// Member blocks the tests' pools use at creation (`member_bytes`).
const USED_BLOCKS: u64 = MEMBER_BLOCKS;
/// Member blocks the backing stores have: room for 32 more chunks per member.
const ROOM_BLOCKS: u64 = MEMBER_BLOCKS + 32 * 16;

/// Holds `write_zeroes` on a member until released, so a test can run I/O in the
/// middle of a grow without timing.
struct Gate {
    armed: std::sync::atomic::AtomicBool,
    reached: tokio::sync::Notify,
    release: tokio::sync::Semaphore,
}

/// A member over a larger store that shows `exposed` blocks of it and grows (up
/// to the store's size) like a file-backed member; every write, discard and flush
/// takes one unit of a shared budget when armed (`>= 0`): once it is spent they
/// fail without reaching the store (the power is gone).
struct Growable {
    store: VolumeRef,
    exposed: AtomicU64,
    budget: Arc<AtomicI64>,
    gate: Option<Arc<Gate>>,
    grows: AtomicU64,
}

fn cut_error() -> BlockError {
    BlockError::Io(std::io::Error::other("power cut"))
}

impl Growable {
    fn new(store: VolumeRef, exposed: u64, budget: Arc<AtomicI64>) -> Arc<Self> {
        Arc::new(Growable {
            store,
            exposed: AtomicU64::new(exposed),
            budget,
            gate: None,
            grows: AtomicU64::new(0),
        })
    }
    fn take(&self) -> BlockResult<()> {
        if self.budget.load(Ordering::SeqCst) < 0 {
            return Ok(());
        }
        if self.budget.fetch_sub(1, Ordering::SeqCst) <= 0 {
            self.budget.store(0, Ordering::SeqCst);
            return Err(cut_error());
        }
        Ok(())
    }
    fn check(&self, lba: u64, blocks: u64) -> BlockResult<()> {
        self.geometry().check_range(lba, blocks)
    }
}

#[async_trait]
impl Volume for Growable {
    fn geometry(&self) -> Geometry {
        Geometry {
            block_count: self.exposed.load(Ordering::SeqCst),
            ..self.store.geometry()
        }
    }
    async fn read(&self, lba: u64, blocks: u32) -> BlockResult<Bytes> {
        self.check(lba, blocks as u64)?;
        self.store.read(lba, blocks).await
    }
    async fn write(&self, lba: u64, data: Bytes, fua: bool) -> BlockResult<()> {
        self.check(lba, (data.len() / BS as usize) as u64)?;
        tokio::task::yield_now().await;
        self.take()?;
        self.store.write(lba, data, fua).await
    }
    async fn flush(&self) -> BlockResult<()> {
        if self.budget.load(Ordering::SeqCst) == 0 {
            return Err(cut_error());
        }
        self.store.flush().await
    }
    async fn discard(&self, lba: u64, blocks: u64) -> BlockResult<()> {
        self.check(lba, blocks)?;
        self.take()?;
        self.store.discard(lba, blocks).await
    }
    async fn write_zeroes(&self, lba: u64, blocks: u64, may_unmap: bool) -> BlockResult<()> {
        self.check(lba, blocks)?;
        if let Some(g) = &self.gate {
            if g.armed.swap(false, Ordering::SeqCst) {
                g.reached.notify_one();
                let _p = g.release.acquire().await.expect("gate");
            }
        }
        self.take()?;
        // as a thick disk with a volatile cache: zeroes are written (and stay in
        // the cache of a CrashSimVolume until a flush), never unmapped
        let _ = may_unmap;
        let zeroes = Bytes::from(vec![0u8; (blocks * BS as u64) as usize]);
        self.store.write(lba, zeroes, false).await
    }
    async fn block_status(&self, lba: u64, blocks: u64) -> BlockResult<Vec<Extent>> {
        self.store.block_status(lba, blocks).await
    }
    async fn grow(&self, block_count: u64) -> BlockResult<()> {
        if block_count > self.store.geometry().block_count {
            return Err(BlockError::NotSupported("growing past the backing store"));
        }
        self.exposed.fetch_max(block_count, Ordering::SeqCst);
        self.grows.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

fn grow_config(level: RaidLevel) -> PoolConfig {
    let mut c = config(level);
    c.member_bytes = Some(USED_BLOCKS * BS as u64);
    c
}

/// Junk in every store past what the pool uses: the grow must not let it show.
async fn junk_beyond(stores: &[VolumeRef]) {
    for (i, s) in stores.iter().enumerate() {
        let n = s.geometry().block_count - USED_BLOCKS;
        s.write(USED_BLOCKS, pattern(900 + i as u64, n), true)
            .await
            .unwrap();
    }
}

async fn assert_zeroes(pool: &dyn Volume, from: u64, to: u64) {
    let mut at = from;
    while at < to {
        let n = 64u64.min(to - at);
        let got = pool.read(at, n as u32).await.expect("read new space");
        assert!(
            got.iter().all(|&b| b == 0),
            "blocks {at}..{} not zero",
            at + n
        );
        at += n;
    }
}

async fn scrub_clean(pool: &Pool) {
    let rep = pool.scrub().await.unwrap().expect("scrub");
    assert_eq!(
        (rep.mismatches, rep.unrepairable, rep.read_errors),
        (0, 0, 0),
        "{rep:?}"
    );
    assert!(rep.stripes_checked > 0);
}

/// The stripe (in pool blocks) of a pool at `level` of `n` test members.
fn row_blocks(pool: &Pool) -> u64 {
    (CHUNK / BS) as u64 * pool.layout().data_chunks() as u64
}

const LEVELS: [RaidLevel; 6] = [
    RaidLevel::Raid0,
    RaidLevel::Raid1,
    RaidLevel::Raid5,
    RaidLevel::Raid6,
    RaidLevel::Raid10,
    RaidLevel::F1,
];

async fn grow_with_io(level: RaidLevel) {
    let n = members_for(level);
    let unarmed = Arc::new(AtomicI64::new(-1));
    let stores: Vec<VolumeRef> = (0..n)
        .map(|_| Arc::new(MemVolume::new(BS, ROOM_BLOCKS)) as VolumeRef)
        .collect();
    junk_beyond(&stores).await;
    let gate = Arc::new(Gate {
        armed: Default::default(),
        reached: tokio::sync::Notify::new(),
        release: tokio::sync::Semaphore::new(0),
    });
    let vols: Vec<Arc<Growable>> = stores
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let mut g = Growable {
                store: s.clone(),
                exposed: AtomicU64::new(USED_BLOCKS),
                budget: unarmed.clone(),
                gate: None,
                grows: AtomicU64::new(0),
            };
            if i == 0 {
                g.gate = Some(gate.clone());
            }
            Arc::new(g)
        })
        .collect();
    let members = |vols: &[Arc<Growable>]| -> Vec<Member> {
        vols.iter()
            .enumerate()
            .map(|(i, v)| Member::new(format!("m{i}"), v.clone() as VolumeRef))
            .collect()
    };
    let pool = Pool::create(grow_config(level), members(&vols), vec![])
        .await
        .expect("create");
    let old = pool.geometry().block_count;
    let row = row_blocks(&pool);
    // the members were not grown yet: no room
    assert_eq!(pool.max_block_count(), old, "{level:?}");
    // not a whole number of stripes: 20 more stripes and half a chunk
    let new = old + 20 * row + (CHUNK / BS) as u64 / 2;
    let oracle = MemVolume::new(BS, new);
    fill(&pool, &oracle, 7).await;
    pool.wait_idle().await;

    gate.armed.store(true, Ordering::SeqCst);
    let grown = tokio::sync::Notify::new();
    let grow = async {
        let r = pool.grow_to(new).await;
        grown.notify_one();
        r
    };
    let io = async {
        tokio::select! {
            _ = gate.reached.notified() => {}
            _ = grown.notified() => panic!("{level:?}: the grow wrote no zeroes"),
        }
        // the grow is zeroing the new stripes: the pool still has its old size
        // and serves below it
        assert_eq!(pool.geometry().block_count, old);
        assert!(matches!(
            pool.write(old, pattern(1, 1), false).await,
            Err(BlockError::OutOfRange { .. })
        ));
        for i in 0..40u64 {
            let len = 1 + (i * 7) % 40;
            let lba = (i * 7919) % (old - len);
            let d = pattern(100 + i, len);
            pool.write(lba, d.clone(), false).await.unwrap();
            oracle.write(lba, d.clone(), false).await.unwrap();
            assert_eq!(pool.read(lba, len as u32).await.unwrap(), d);
        }
        assert_eq!(pool.geometry().block_count, old);
        gate.release.add_permits(1 << 20);
    };
    let (r, ()) = tokio::join!(grow, io);
    r.unwrap_or_else(|e| panic!("{level:?}: grow: {e}"));
    assert_eq!(pool.geometry().block_count, new, "{level:?}");
    assert!(vols.iter().all(|v| v.grows.load(Ordering::SeqCst) == 1));
    check_all(&pool, &oracle).await;
    assert_zeroes(&pool, old, new).await;
    if level != RaidLevel::Raid0 {
        scrub_clean(&pool).await;
    }
    // the new space takes writes, across the old end too
    let d = pattern(5, new - (old - 10));
    pool.write(old - 10, d.clone(), false).await.unwrap();
    oracle.write(old - 10, d, false).await.unwrap();
    check_all(&pool, &oracle).await;
    assert!(pool.write(new, pattern(1, 1), false).await.is_err());
    if level != RaidLevel::Raid0 {
        scrub_clean(&pool).await;
        // a member lost: the new stripes reconstruct, and rebuild onto a
        // replacement as large as the grown members
        pool.fail_member(0).await.unwrap();
        check_all(&pool, &oracle).await;
        let fresh = Growable::new(
            Arc::new(MemVolume::new(BS, ROOM_BLOCKS)),
            ROOM_BLOCKS,
            unarmed.clone(),
        );
        pool.replace_member(0, Member::new("m0b", fresh.clone() as VolumeRef))
            .await
            .unwrap();
        pool.wait_idle().await;
        assert_eq!(pool.status().state, PoolState::Optimal, "{level:?}");
        check_all(&pool, &oracle).await;
        scrub_clean(&pool).await;
        pool.shutdown().await.unwrap();
        drop(pool);
        let mut ms = members(&vols);
        ms[0] = Member::new("m0b", fresh as VolumeRef);
        let again = Pool::assemble(ms, false).await.expect("reassemble");
        assert_eq!(again.geometry().block_count, new);
        check_all(&again, &oracle).await;
    } else {
        pool.shutdown().await.unwrap();
        drop(pool);
        let again = Pool::assemble(members(&vols), false)
            .await
            .expect("reassemble");
        assert_eq!(again.geometry().block_count, new);
        check_all(&again, &oracle).await;
    }
}

#[tokio::test]
async fn grow_every_level_with_io_running() {
    for level in LEVELS {
        grow_with_io(level).await;
    }
}

#[tokio::test]
async fn grow_within_the_last_stripe_then_to_the_members() {
    // members with no room at all, which cannot grow past their store
    let none = Arc::new(AtomicI64::new(-1));
    let full: Vec<Member> = (0..4)
        .map(|i| {
            let v = Growable::new(
                Arc::new(MemVolume::new(BS, MEMBER_BLOCKS)),
                MEMBER_BLOCKS,
                none.clone(),
            );
            Member::new(format!("m{i}"), v as VolumeRef)
        })
        .collect();
    let pool = Pool::create(config(RaidLevel::Raid5), full, vec![])
        .await
        .unwrap();
    let old = pool.geometry().block_count;
    let oracle = MemVolume::new(BS, old);
    fill(&pool, &oracle, 3).await;
    pool.wait_idle().await;
    // growing past them is refused, the pool keeps its size
    let err = pool.grow_to(old + 1).await.unwrap_err();
    assert!(
        matches!(err, RaidError::Config(ref m) if m.contains("m0 holds")),
        "{err}"
    );
    assert_eq!(pool.geometry().block_count, old);
    assert_eq!(pool.max_block_count(), old);
    assert!(pool.grow_to_members().await.is_ok());
    assert_eq!(pool.geometry().block_count, old);
    // the room every member needs for one stripe more
    let need = pool.member_bytes_for(old + row_blocks(&pool)).unwrap();
    assert_eq!(need, pool.data_offset_bytes() + 33 * CHUNK as u64);
    let need = pool.member_bytes_for(old + 1).unwrap();
    assert_eq!(need, pool.data_offset_bytes() + 33 * CHUNK as u64);
    check_all(&pool, &oracle).await;
    drop(pool);

    // into the room of grown members, first to a size inside a new stripe, then
    // to the end of that stripe (no new stripes: its tail is zeroes already)
    let unarmed = Arc::new(AtomicI64::new(-1));
    let vols: Vec<Arc<Growable>> = (0..4)
        .map(|_| {
            Growable::new(
                Arc::new(MemVolume::new(BS, ROOM_BLOCKS)),
                ROOM_BLOCKS,
                unarmed.clone(),
            )
        })
        .collect();
    let ms: Vec<Member> = vols
        .iter()
        .enumerate()
        .map(|(i, v)| Member::new(format!("m{i}"), v.clone() as VolumeRef))
        .collect();
    let pool = Pool::create(grow_config(RaidLevel::Raid5), ms.clone(), vec![])
        .await
        .unwrap();
    let old = pool.geometry().block_count;
    let row = row_blocks(&pool);
    assert_eq!(pool.max_block_count(), old + 32 * row);
    let oracle = MemVolume::new(BS, old + 32 * row);
    fill(&pool, &oracle, 9).await;
    pool.wait_idle().await;
    pool.grow_to(old + 3).await.unwrap();
    assert_eq!(pool.geometry().block_count, old + 3);
    let d = pattern(8, 3);
    pool.write(old, d.clone(), false).await.unwrap();
    oracle.write(old, d, false).await.unwrap();
    pool.grow_to(old + row).await.unwrap();
    assert_eq!(pool.geometry().block_count, old + row);
    check_all(&pool, &oracle).await;
    scrub_clean(&pool).await;
    // every member's room: 32 more stripes
    assert_eq!(pool.grow_to_members().await.unwrap(), old + 32 * row);
    assert_eq!(pool.geometry().block_count, old + 32 * row);
    check_all(&pool, &oracle).await;
    scrub_clean(&pool).await;
    pool.shutdown().await.unwrap();
    drop(pool);
    let pool = Pool::assemble(ms, false).await.unwrap();
    assert_eq!(pool.geometry().block_count, old + 32 * row);
    check_all(&pool, &oracle).await;
}

#[tokio::test]
async fn refusals_leave_the_pool_as_it_was() {
    let unarmed = Arc::new(AtomicI64::new(-1));
    let vols = |n: usize, blocks: u64| -> Vec<Arc<Growable>> {
        (0..n)
            .map(|_| {
                Growable::new(
                    Arc::new(MemVolume::new(BS, ROOM_BLOCKS)),
                    blocks,
                    unarmed.clone(),
                )
            })
            .collect()
    };
    let as_members = |v: &[Arc<Growable>]| -> Vec<Member> {
        v.iter()
            .enumerate()
            .map(|(i, v)| Member::new(format!("m{i}"), v.clone() as VolumeRef))
            .collect()
    };
    // member_bytes beyond the members
    let mut c = config(RaidLevel::Raid5);
    c.member_bytes = Some((ROOM_BLOCKS + 1) * BS as u64);
    assert!(matches!(
        Pool::create(c, as_members(&vols(4, ROOM_BLOCKS)), vec![]).await,
        Err(RaidError::Config(_))
    ));

    let v = vols(4, USED_BLOCKS);
    let pool = Pool::create(grow_config(RaidLevel::Raid5), as_members(&v), vec![])
        .await
        .unwrap();
    let old = pool.geometry().block_count;
    // shrinking
    assert!(matches!(
        pool.grow_to(old - 1).await,
        Err(RaidError::Config(m)) if m.contains("shrinking")
    ));
    assert!(matches!(
        pool.grow(old - 1).await,
        Err(BlockError::NotSupported(_))
    ));
    // beyond what a member can become
    let far = old + 1000 * row_blocks(&pool);
    let err = pool.grow(far).await.unwrap_err();
    assert!(err.to_string().contains("past the backing store"), "{err}");
    // a degraded pool
    pool.fail_member(2).await.unwrap();
    assert!(matches!(
        pool.grow_to(old + 1).await,
        Err(RaidError::Position { position: 2, .. })
    ));
    assert_eq!(pool.geometry().block_count, old);
    drop(pool);

    // a spare that cannot hold the new size
    let v = vols(4, USED_BLOCKS);
    let spare = Growable::new(
        Arc::new(MemVolume::new(BS, USED_BLOCKS)),
        USED_BLOCKS,
        unarmed.clone(),
    );
    let pool = Pool::create(
        grow_config(RaidLevel::Raid6),
        as_members(&v),
        vec![Member::new("spare", spare as VolumeRef)],
    )
    .await
    .unwrap();
    let old = pool.geometry().block_count;
    let err = pool.grow_to(old + 1).await.unwrap_err();
    assert!(err.to_string().contains("spare"), "{err}");
    assert_eq!(pool.geometry().block_count, old);
    drop(pool);

    // RAID 10 far
    let v = vols(4, USED_BLOCKS);
    let pool = Pool::create(grow_config(RaidLevel::Raid10Far), as_members(&v), vec![])
        .await
        .unwrap();
    let old = pool.geometry().block_count;
    let err = pool.grow_to(old + 1).await.unwrap_err();
    assert!(err.to_string().contains("far"), "{err}");
    assert_eq!(pool.geometry().block_count, old);
}

/// Power is cut at every write of a grow (zeroing, flush, superblocks): the pool
/// reassembles at the old size or the new one, with the old data intact, the new
/// space zero, parity consistent and the new stripes reconstructing after a loss.
async fn crash_during_grow(level: RaidLevel) {
    let n = members_for(level);
    let mut saw_old = false;
    let mut saw_new = false;
    for cut in 0i64.. {
        assert!(cut < 200, "{level:?}: grow never completed");
        let budget = Arc::new(AtomicI64::new(-1));
        let sims: Vec<Arc<CrashSimVolume>> = (0..n)
            .map(|_| Arc::new(CrashSimVolume::new(BS, ROOM_BLOCKS)))
            .collect();
        let stores: Vec<VolumeRef> = sims.iter().map(|s| s.clone() as VolumeRef).collect();
        junk_beyond(&stores).await;
        let wrap = |budget: &Arc<AtomicI64>| -> Vec<Member> {
            stores
                .iter()
                .enumerate()
                .map(|(i, s)| {
                    Member::new(
                        format!("m{i}"),
                        Growable::new(s.clone(), ROOM_BLOCKS, budget.clone()) as VolumeRef,
                    )
                })
                .collect()
        };
        // the members have grown already (the grow writes, it does not extend)
        let pool = Pool::create(grow_config(level), wrap(&budget), vec![])
            .await
            .expect("create");
        let old = pool.geometry().block_count;
        let new = old + 7 * row_blocks(&pool) + 3;
        let oracle = MemVolume::new(BS, new);
        fill(&pool, &oracle, 11).await;
        pool.wait_idle().await;
        pool.flush().await.unwrap();
        // and in place (a flush does not wait for that)
        pool.wait_applied().await;
        budget.store(cut, Ordering::SeqCst);
        let r = pool.grow_to(new).await;
        let done = r.is_ok();
        drop(pool);
        for s in &sims {
            s.crash();
        }
        let pool = Pool::assemble(wrap(&Arc::new(AtomicI64::new(-1))), false)
            .await
            .unwrap_or_else(|e| panic!("{level:?} cut {cut}: assemble: {e}"));
        let size = pool.geometry().block_count;
        assert!(size == old || size == new, "{level:?} cut {cut}: {size}");
        if done {
            assert_eq!(size, new, "{level:?} cut {cut}: acknowledged grow lost");
        }
        saw_old |= size == old;
        saw_new |= size == new;
        pool.wait_idle().await;
        check_all(&pool, &oracle).await;
        if size == new {
            assert_zeroes(&pool, old, new).await;
        }
        if level != RaidLevel::Raid0 {
            scrub_clean(&pool).await;
            pool.fail_member(n - 1).await.unwrap();
            check_all(&pool, &oracle).await;
            if size == new {
                assert_zeroes(&pool, old, new).await;
            }
        }
        if done {
            break;
        }
    }
    assert!(saw_old && saw_new, "{level:?}");
}

#[tokio::test]
async fn a_crash_at_any_point_of_a_grow_reopens_at_old_or_new_size() {
    for level in [
        RaidLevel::Raid1,
        RaidLevel::Raid5,
        RaidLevel::Raid6,
        RaidLevel::Raid10,
    ] {
        crash_during_grow(level).await;
    }
}

/// A crash after some members took the new size and before the others did: the
/// members disagree at the same generation, and the newest (larger) size wins.
#[tokio::test]
async fn members_that_missed_the_new_size_are_brought_along() {
    let n = 4;
    let budget = Arc::new(AtomicI64::new(-1));
    let stores: Vec<Arc<MemVolume>> = (0..n)
        .map(|_| Arc::new(MemVolume::new(BS, ROOM_BLOCKS)))
        .collect();
    let vols: Vec<Arc<Growable>> = stores
        .iter()
        .map(|s| Growable::new(s.clone() as VolumeRef, ROOM_BLOCKS, budget.clone()))
        .collect();
    let members = || -> Vec<Member> {
        vols.iter()
            .enumerate()
            .map(|(i, v)| Member::new(format!("m{i}"), v.clone() as VolumeRef))
            .collect()
    };
    let pool = Pool::create(grow_config(RaidLevel::Raid5), members(), vec![])
        .await
        .unwrap();
    let old = pool.geometry().block_count;
    let oracle = MemVolume::new(BS, old + 5 * row_blocks(&pool));
    fill(&pool, &oracle, 2).await;
    pool.wait_idle().await;
    pool.shutdown().await.unwrap();
    // keep the old superblocks of members 2 and 3
    let keep: Vec<Bytes> = {
        let mut v = Vec::new();
        for s in &stores[2..] {
            v.push(s.read(0, 256).await.unwrap());
        }
        v
    };
    let row = row_blocks(&pool);
    let new = old + 5 * row;
    pool.grow_to(new).await.unwrap();
    drop(pool);
    for (s, img) in stores[2..].iter().zip(keep) {
        s.write(0, img, true).await.unwrap();
    }
    let pool = Pool::assemble(members(), false).await.expect("assemble");
    assert_eq!(pool.geometry().block_count, new);
    check_all(&pool, &oracle).await;
    scrub_clean(&pool).await;
    pool.shutdown().await.unwrap();
    drop(pool);
    // and every member says so now
    let stripes = new.div_ceil(row);
    for st in &stores {
        assert_eq!(superblock_stripes(st).await, stripes);
    }
}

/// The stripe count in the newest superblock slot of a member.
async fn superblock_stripes(v: &MemVolume) -> u64 {
    let mut best = (0u64, 0u64);
    for slot in 0..2u64 {
        let img = v.read(slot * 128, 128).await.unwrap();
        let len = u32::from_le_bytes(img[12..16].try_into().unwrap()) as usize;
        let sb: serde_json::Value = serde_json::from_slice(&img[32..32 + len]).unwrap();
        let events = sb["events"].as_u64().unwrap();
        if events >= best.0 {
            best = (events, sb["stripes"].as_u64().unwrap());
        }
    }
    best.1
}

/// File-backed members (what `freesan` opens): `Volume::grow` on the pool
/// extends the member files itself, then grows the pool.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn file_members_are_extended_by_the_grow() {
    let dir = tempfile::tempdir().unwrap();
    let open = |i: usize, bytes: u64| -> VolumeRef {
        let opts = disk::FileOptions {
            create_size_bytes: Some(bytes),
            ..disk::FileOptions::default()
        };
        Arc::new(disk::FileVolume::open(&dir.path().join(format!("m{i}.img")), &opts).unwrap())
    };
    let bytes = USED_BLOCKS * BS as u64;
    let vols: Vec<VolumeRef> = (0..4).map(|i| open(i, bytes)).collect();
    let ms: Vec<Member> = vols
        .iter()
        .enumerate()
        .map(|(i, v)| Member::new(format!("m{i}"), v.clone()))
        .collect();
    let pool = Arc::new(
        Pool::create(config(RaidLevel::Raid6), ms, vec![])
            .await
            .unwrap(),
    );
    let old = pool.geometry().block_count;
    let new = old * 2 - 5;
    let oracle = MemVolume::new(BS, new);
    fill(&pool, &oracle, 4).await;
    pool.wait_idle().await;
    let lun: VolumeRef = pool.clone();
    lun.grow(new).await.expect("grow a pool LUN");
    assert_eq!(lun.geometry().block_count, new);
    let need = pool.member_bytes_for(new).unwrap();
    for i in 0..4 {
        let len = std::fs::metadata(dir.path().join(format!("m{i}.img")))
            .unwrap()
            .len();
        assert_eq!(len, need);
    }
    assert_zeroes(lun.as_ref(), old, new).await;
    let d = pattern(77, new - old);
    lun.write(old, d.clone(), false).await.unwrap();
    oracle.write(old, d, false).await.unwrap();
    scrub_clean(&pool).await;
    pool.shutdown().await.unwrap();
    drop(lun);
    drop(pool);
    drop(vols);
    let ms: Vec<Member> = (0..4)
        .map(|i| Member::new(format!("m{i}"), open(i, bytes)))
        .collect();
    let pool = Pool::assemble(ms, false).await.unwrap();
    assert_eq!(pool.geometry().block_count, new);
    check_all(&pool, &oracle).await;
}
