//! The stripe journal on a journal device (an SSD) instead of the members: the
//! write hole stays closed (a crash with writes in flight, then member loss),
//! assemble insists on the right device, and a device that dies hands the journal
//! back to the members without losing an acknowledged write.

use crate::common;

use block::{BlockResult, Bytes, CrashSimVolume, MemVolume, Volume, VolumeRef};
use common::*;
use raid::{Member, Pool, RaidLevel};
use std::sync::Arc;

const DEV_BLOCKS: u64 = (1 << 20) / BS as u64;

async fn join(futs: Vec<block::BoxFut<'_, BlockResult<()>>>) -> Vec<BlockResult<()>> {
    block::join_all(futs).await
}

fn sims(n: usize) -> Vec<Arc<CrashSimVolume>> {
    (0..n)
        .map(|_| Arc::new(CrashSimVolume::new(BS, MEMBER_BLOCKS)))
        .collect()
}

fn as_members(sims: &[Arc<CrashSimVolume>], skip: &[usize]) -> Vec<Member> {
    sims.iter()
        .enumerate()
        .filter(|(i, _)| !skip.contains(i))
        .map(|(i, s)| Member::new(format!("m{i}"), s.clone() as VolumeRef))
        .collect()
}

/// Fills the pool, flushes, then runs `writes` partial-stripe writes at once and
/// records them in `oracle`.
async fn fill_then_write(pool: &Pool, oracle: &MemVolume, seed: u64) {
    let total = pool.geometry().block_count;
    let mut at = 0;
    while at < total {
        let c = 64.min(total - at);
        let d = pattern(seed + at, c);
        pool.write(at, d.clone(), false).await.unwrap();
        oracle.write(at, d, false).await.unwrap();
        at += c;
    }
    pool.flush().await.unwrap();
    // and in place (a flush does not wait for that)
    pool.wait_applied().await;
    let slot = total / 16;
    let writes: Vec<(u64, Bytes)> = (0..16u64)
        .map(|w| (w * slot + 5, pattern(seed * 7 + w, 1 + w % 5)))
        .collect();
    let futs: Vec<block::BoxFut<'_, BlockResult<()>>> = writes
        .iter()
        .map(|(lba, d)| -> block::BoxFut<'_, BlockResult<()>> {
            Box::pin(pool.write(*lba, d.clone(), false))
        })
        .collect();
    for r in join(futs).await {
        r.unwrap();
    }
    for (lba, d) in writes {
        oracle.write(lba, d, false).await.unwrap();
    }
}

/// The pool's journal devices: name, and whether it failed.
fn journal_devices(pool: &Pool) -> Vec<(String, bool)> {
    pool.status()
        .journal_devices
        .iter()
        .map(|d| (d.name.clone(), d.failed))
        .collect()
}

async fn wrong_blocks(pool: &Pool, oracle: &MemVolume) -> u64 {
    let mut wrong = 0;
    for lba in 0..pool.geometry().block_count {
        if pool.read(lba, 1).await.unwrap() != oracle.read(lba, 1).await.unwrap() {
            wrong += 1;
        }
    }
    wrong
}

#[tokio::test]
async fn acknowledged_writes_survive_a_crash_and_member_loss_with_the_journal_on_a_device() {
    for (level, n, lose) in [
        (RaidLevel::Raid5, 4, vec![2]),
        (RaidLevel::Raid6, 5, vec![0, 3]),
    ] {
        let ms = sims(n);
        let dev = Arc::new(CrashSimVolume::new(BS, DEV_BLOCKS));
        let pool = Pool::create_with_journal_device(
            config(level),
            as_members(&ms, &[]),
            vec![],
            Some(Member::new("ssd", dev.clone() as VolumeRef)),
        )
        .await
        .unwrap();
        pool.wait_idle().await;
        let oracle = MemVolume::new(BS, pool.geometry().block_count);
        fill_then_write(&pool, &oracle, 11).await;
        let st = pool.status();
        assert!(st.write_path.journal_records >= 16);
        let members_journal_writes: u64 = st.members.iter().map(|m| m.writes).sum();
        assert!(members_journal_writes > 0);
        // the power goes: the members lose their volatile caches (the unflushed
        // in-place writes of the acknowledged partial writes)
        drop(pool);
        for s in &ms {
            s.crash();
        }
        dev.crash();
        // without the device the pool is refused
        assert!(Pool::assemble(as_members(&ms, &lose), false).await.is_err());
        // so is a device whose ring cannot be read (its records are the only
        // copy: assembling without them would store a checkpoint past them)
        let unreadable = Arc::new(block::FaultVolume::new(dev.clone() as VolumeRef));
        let ring = (64 << 10) / BS as u64..DEV_BLOCKS;
        unreadable.plan().lock().bad_read_blocks = Vec::from([ring]);
        let r = Pool::assemble_with_journal_device(
            as_members(&ms, &lose),
            false,
            Some(Member::new("ssd", unreadable as VolumeRef)),
        )
        .await;
        assert!(r.is_err(), "assembled over an unreadable journal device");
        let pool = Pool::assemble_with_journal_device(
            as_members(&ms, &lose),
            false,
            Some(Member::new("ssd", dev.clone() as VolumeRef)),
        )
        .await
        .expect("assemble with the device");
        assert_eq!(wrong_blocks(&pool, &oracle).await, 0, "{level:?}");
        assert!(pool.status().journal_device.is_some());
    }
}

#[tokio::test]
async fn records_go_to_the_device_not_the_members() {
    let ms: Vec<TestMember> = (0..4).map(|_| member(MEMBER_BLOCKS)).collect();
    let dev = member(DEV_BLOCKS);
    let pool = Pool::create_with_journal_device(
        config(RaidLevel::Raid5),
        ms.iter()
            .enumerate()
            .map(|(i, m)| m.as_member(&format!("m{i}")))
            .collect(),
        vec![],
        Some(dev.as_member("ssd")),
    )
    .await
    .unwrap();
    pool.wait_idle().await;
    let before: Vec<u64> = pool.status().members.iter().map(|m| m.writes).collect();
    pool.write(3, pattern(1, 2), false).await.unwrap();
    // the in-place writes may end after the acknowledgement
    pool.wait_applied().await;
    let after: Vec<u64> = pool.status().members.iter().map(|m| m.writes).collect();
    // one read-modify-write: the data and the parity member, one write each
    let added: u64 = after.iter().zip(&before).map(|(a, b)| a - b).sum();
    assert_eq!(added, 2);
    assert_eq!(pool.status().write_path.journal_ring_writes, 1);
}

#[tokio::test]
async fn a_failed_journal_device_hands_the_journal_back_to_the_members() {
    let ms = sims(4);
    let dev = member(DEV_BLOCKS);
    let pool = Pool::create_with_journal_device(
        config(RaidLevel::Raid5),
        as_members(&ms, &[]),
        vec![],
        Some(dev.as_member("ssd")),
    )
    .await
    .unwrap();
    pool.wait_idle().await;
    let oracle = MemVolume::new(BS, pool.geometry().block_count);
    fill_then_write(&pool, &oracle, 21).await;
    dev.plan.lock().dead = true;
    // writes go on, journaled on the members
    fill_then_write(&pool, &oracle, 31).await;
    let st = pool.status();
    assert!(st.journal_device.as_ref().is_some_and(|d| d.failed));
    drop(pool);
    for s in &ms {
        s.crash();
    }
    // the superblocks no longer name the device; one member lost on top
    let pool = Pool::assemble(as_members(&ms, &[1]), false)
        .await
        .expect("assemble without the dead device");
    assert_eq!(wrong_blocks(&pool, &oracle).await, 0);
}

#[tokio::test]
async fn assemble_refuses_a_foreign_journal_device_and_forces_without_one() {
    let ms = sims(4);
    let dev = Arc::new(CrashSimVolume::new(BS, DEV_BLOCKS));
    let pool = Pool::create_with_journal_device(
        config(RaidLevel::Raid5),
        as_members(&ms, &[]),
        vec![],
        Some(Member::new("ssd", dev.clone() as VolumeRef)),
    )
    .await
    .unwrap();
    pool.shutdown().await.unwrap();
    drop(pool);
    let other = Arc::new(CrashSimVolume::new(BS, DEV_BLOCKS));
    assert!(Pool::assemble_with_journal_device(
        as_members(&ms, &[]),
        false,
        Some(Member::new("other", other as VolumeRef)),
    )
    .await
    .is_err());
    assert!(Pool::assemble(as_members(&ms, &[]), false).await.is_err());
    let pool = Pool::assemble(as_members(&ms, &[]), true)
        .await
        .expect("forced without the device");
    assert!(pool.status().journal_device.is_none());
}

#[tokio::test]
async fn without_its_journal_device_a_crashed_pool_loses_acknowledged_writes() {
    // the control of the crash test above: forced to assemble without the device,
    // the records of the acknowledged writes the crash took from the members'
    // volatile caches are not replayed
    let ms = sims(4);
    let dev = Arc::new(CrashSimVolume::new(BS, DEV_BLOCKS));
    let pool = Pool::create_with_journal_device(
        config(RaidLevel::Raid5),
        as_members(&ms, &[]),
        vec![],
        Some(Member::new("ssd", dev.clone() as VolumeRef)),
    )
    .await
    .unwrap();
    pool.wait_idle().await;
    let oracle = MemVolume::new(BS, pool.geometry().block_count);
    fill_then_write(&pool, &oracle, 41).await;
    drop(pool);
    for s in &ms {
        s.crash();
    }
    let pool = Pool::assemble(as_members(&ms, &[]), true).await.unwrap();
    assert!(wrong_blocks(&pool, &oracle).await > 0);
}

/// A mirrored pair of journal devices: every group commit goes to both, so a
/// crash with acknowledged writes still only in the members' volatile caches,
/// then the loss of either device and of `redundancy` members, loses nothing.
#[tokio::test]
async fn a_mirrored_journal_survives_a_crash_and_the_loss_of_either_device() {
    for (level, n, lose) in [
        (RaidLevel::Raid5, 4, vec![2]),
        (RaidLevel::Raid6, 5, vec![0, 3]),
    ] {
        for keep in [0usize, 1] {
            let ms = sims(n);
            let devs = [
                Arc::new(CrashSimVolume::new(BS, DEV_BLOCKS)),
                Arc::new(CrashSimVolume::new(BS, DEV_BLOCKS)),
            ];
            let dev_member =
                |i: usize| Member::new(format!("ssd{i}"), devs[i].clone() as VolumeRef);
            let pool = Pool::create_with_journal_devices(
                config(level),
                as_members(&ms, &[]),
                vec![],
                vec![dev_member(0), dev_member(1)],
            )
            .await
            .unwrap();
            pool.wait_idle().await;
            let oracle = MemVolume::new(BS, pool.geometry().block_count);
            fill_then_write(&pool, &oracle, 51 + keep as u64).await;
            let st = pool.status();
            assert_eq!(st.journal_devices.len(), 2);
            assert!(st.journal_devices.iter().all(|d| !d.failed));
            // each batch went to both devices
            let w = &st.write_path;
            assert!(w.journal_records >= 16);
            assert_eq!(w.journal_ring_writes, 2 * w.journal_batches);
            drop(pool);
            for s in &ms {
                s.crash();
            }
            for d in &devs {
                d.crash();
            }
            // without any device the pool is refused
            assert!(Pool::assemble(as_members(&ms, &lose), false).await.is_err());
            let pool = Pool::assemble_with_journal_devices(
                as_members(&ms, &lose),
                false,
                vec![dev_member(keep)],
            )
            .await
            .expect("assemble with one device of the pair");
            assert_eq!(
                wrong_blocks(&pool, &oracle).await,
                0,
                "{level:?} with only device {keep}"
            );
            assert_eq!(pool.status().journal_devices.len(), 1);
        }
    }
}

/// A RAID 5 pool of four crash-simulated members with a mirrored journal
/// whose first device ("doomed") can be made to fail, and its oracle.
async fn mirrored_pool_with_a_doomed_device() -> (
    Vec<Arc<CrashSimVolume>>,
    Arc<CrashSimVolume>,
    Arc<CrashSimVolume>,
    Arc<block::FaultVolume>,
    Pool,
    MemVolume,
) {
    let ms = sims(4);
    let twin = Arc::new(CrashSimVolume::new(BS, DEV_BLOCKS));
    let doomed_sim = Arc::new(CrashSimVolume::new(BS, DEV_BLOCKS));
    let doomed = Arc::new(block::FaultVolume::new(doomed_sim.clone() as VolumeRef));
    let pool = Pool::create_with_journal_devices(
        config(RaidLevel::Raid5),
        as_members(&ms, &[]),
        vec![],
        vec![
            Member::new("doomed", doomed.clone() as VolumeRef),
            Member::new("twin", twin.clone() as VolumeRef),
        ],
    )
    .await
    .unwrap();
    pool.wait_idle().await;
    let oracle = MemVolume::new(BS, pool.geometry().block_count);
    (ms, twin, doomed_sim, doomed, pool, oracle)
}

/// One device of a mirrored pair dies while the pool writes: the journal goes
/// on to its twin alone (not to the members), the superblocks stop naming the
/// dead one, and a crash followed by a member loss, assembled with the twin
/// only, loses nothing acknowledged before or after the death.
#[tokio::test]
async fn a_mirrored_journal_device_that_dies_leaves_every_record_on_its_twin() {
    let (ms, twin, doomed_sim, doomed, pool, oracle) = mirrored_pool_with_a_doomed_device().await;
    let plan = doomed.plan();
    fill_then_write(&pool, &oracle, 61).await;
    plan.lock().dead = true;
    let before = pool.status().write_path;
    // writes go on, journaled on the twin
    fill_then_write(&pool, &oracle, 71).await;
    assert_eq!(
        journal_devices(&pool),
        vec![("doomed".to_string(), true), ("twin".to_string(), false)]
    );
    let st = pool.status();
    // one ring write per batch from then on (the batch that found the doomed
    // device dead went to both): on the members each would take two
    let w = &st.write_path;
    let batches = w.journal_batches - before.journal_batches;
    let ring_writes = w.journal_ring_writes - before.journal_ring_writes;
    assert!(batches > 1);
    assert_eq!(ring_writes, batches + 1);
    assert!(w.journal_records - before.journal_records >= 16);
    drop(pool);
    for s in &ms {
        s.crash();
    }
    twin.crash();
    doomed_sim.crash();
    // the superblocks name only the twin: the doomed device (readable again
    // here) is left out, and the pool assembles with one member lost
    plan.lock().dead = false;
    let pool = Pool::assemble_with_journal_devices(
        as_members(&ms, &[1]),
        false,
        vec![
            Member::new("doomed", doomed.clone() as VolumeRef),
            Member::new("twin", twin.clone() as VolumeRef),
        ],
    )
    .await
    .expect("assemble with the twin");
    assert_eq!(wrong_blocks(&pool, &oracle).await, 0);
    let names: Vec<String> = pool
        .status()
        .journal_devices
        .iter()
        .map(|d| d.name.clone())
        .collect();
    assert_eq!(names, vec!["twin".to_string()]);
}

/// A RAID 5 pool with a mirrored journal whose first device died mid-run, its
/// partial writes acknowledged on the twin alone, then the power lost: the
/// members, the twin and the dead device's image (readable again) as left.
async fn pool_left_with_its_twin(
    seed: u64,
) -> (
    Vec<Arc<CrashSimVolume>>,
    Arc<CrashSimVolume>,
    Arc<block::FaultVolume>,
    MemVolume,
) {
    let (ms, twin, doomed_sim, doomed, pool, oracle) = mirrored_pool_with_a_doomed_device().await;
    let plan = doomed.plan();
    fill_then_write(&pool, &oracle, seed).await;
    plan.lock().dead = true;
    fill_then_write(&pool, &oracle, seed + 1).await;
    drop(pool);
    for s in &ms {
        s.crash();
    }
    twin.crash();
    doomed_sim.crash();
    plan.lock().dead = false;
    (ms, twin, doomed, oracle)
}

/// A blank device given at assemble in place of a dead twin joins the pair
/// after the replay's checkpoint, and every record from then on goes to both:
/// a later crash followed by the loss of the old survivor and of a member,
/// assembled with the new device alone, loses nothing acknowledged. A device
/// holding anything else is refused, and the device the pool dropped after its
/// failure is not taken back.
#[tokio::test]
async fn a_blank_device_given_at_assemble_becomes_the_twin_of_the_survivor() {
    let (ms, twin, doomed, oracle) = pool_left_with_its_twin(91).await;
    let dev = |name: &str, v: &Arc<CrashSimVolume>| Member::new(name, v.clone() as VolumeRef);
    // a device that is neither blank nor this pool's is refused
    let junk = Arc::new(CrashSimVolume::new(BS, DEV_BLOCKS));
    junk.write(0, pattern(5, 1), true).await.unwrap();
    assert!(Pool::assemble_with_journal_devices(
        as_members(&ms, &[]),
        false,
        vec![dev("twin", &twin), dev("junk", &junk)],
    )
    .await
    .is_err());
    let fresh = Arc::new(CrashSimVolume::new(BS, DEV_BLOCKS));
    let pool = Pool::assemble_with_journal_devices(
        as_members(&ms, &[]),
        false,
        vec![
            Member::new("doomed", doomed.clone() as VolumeRef),
            dev("twin", &twin),
            dev("fresh", &fresh),
        ],
    )
    .await
    .expect("assemble with the twin and a blank device");
    assert_eq!(wrong_blocks(&pool, &oracle).await, 0);
    assert_eq!(
        journal_devices(&pool),
        vec![("twin".to_string(), false), ("fresh".to_string(), false)]
    );
    let st = pool.status();
    // every batch goes to both again
    let before = st.write_path;
    fill_then_write(&pool, &oracle, 93).await;
    let w = pool.status().write_path;
    let batches = w.journal_batches - before.journal_batches;
    assert!(batches > 0);
    assert_eq!(
        w.journal_ring_writes - before.journal_ring_writes,
        2 * batches
    );
    drop(pool);
    for s in &ms {
        s.crash();
    }
    twin.crash();
    fresh.crash();
    // the old survivor is lost with a member: the new device alone holds the
    // records of the writes the crash took from the members' caches
    let pool = Pool::assemble_with_journal_devices(
        as_members(&ms, &[1]),
        false,
        vec![dev("fresh", &fresh)],
    )
    .await
    .expect("assemble with the new device alone");
    assert_eq!(wrong_blocks(&pool, &oracle).await, 0);
}

/// A blank device too small for the ring is left alone: the pool assembles
/// and serves on its survivor. One whose header write fails while it joins is
/// marked failed and the pool goes on with the survivor; still blank, it joins
/// at the next assemble once it works.
#[tokio::test]
async fn a_blank_device_that_fails_to_join_is_taken_at_the_next_assemble() {
    let (ms, twin, _doomed, oracle) = pool_left_with_its_twin(95).await;
    let small = Arc::new(CrashSimVolume::new(BS, 16));
    let p = Pool::assemble_with_journal_devices(
        as_members(&ms, &[]),
        false,
        vec![
            Member::new("twin", twin.clone() as VolumeRef),
            Member::new("small", small as VolumeRef),
        ],
    )
    .await
    .expect("a too small blank device does not keep the pool from starting");
    assert_eq!(journal_devices(&p), vec![("twin".to_string(), false)]);
    assert_eq!(wrong_blocks(&p, &oracle).await, 0);
    p.shutdown().await.unwrap();
    drop(p);
    let flaky = Arc::new(block::FaultVolume::new(
        Arc::new(CrashSimVolume::new(BS, DEV_BLOCKS)) as VolumeRef,
    ));
    // the header block only: the ring is zeroed, the header write fails
    flaky.plan().lock().bad_write_blocks.push(0..1);
    let mut pool = None;
    for flaky_failed in [true, false] {
        drop(pool.take());
        let p = Pool::assemble_with_journal_devices(
            as_members(&ms, &[]),
            false,
            vec![
                Member::new("twin", twin.clone() as VolumeRef),
                Member::new("flaky", flaky.clone() as VolumeRef),
            ],
        )
        .await
        .expect("assemble with the twin");
        assert_eq!(
            journal_devices(&p),
            vec![
                ("twin".to_string(), false),
                ("flaky".to_string(), flaky_failed)
            ]
        );
        assert_eq!(wrong_blocks(&p, &oracle).await, 0);
        p.shutdown().await.unwrap();
        pool = Some(p);
        // it works again, and is still blank
        flaky.plan().lock().bad_write_blocks.clear();
    }
}
