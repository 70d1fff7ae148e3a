//! The stripe journal's ring size a new parity pool gets: 256 MiB, else 64 MiB,
//! where that is at most an eighth of the smallest member and the journal
//! devices hold it, 16 MiB otherwise, and what `PoolConfig::journal_bytes`
//! says when it is set.
//! It is written in the superblocks, so assemble keeps it.

use block::{MemVolume, VolumeRef};
use raid::{
    default_journal_bytes, Member, Pool, PoolConfig, RaidLevel, DEFAULT_JOURNAL_BYTES,
    LARGEST_JOURNAL_BYTES, LARGE_JOURNAL_BYTES,
};
use std::sync::Arc;

const MIB: u64 = 1 << 20;

fn volumes(n: usize, mib: u64) -> Vec<Arc<MemVolume>> {
    (0..n)
        .map(|_| Arc::new(MemVolume::new(4096, mib * MIB / 4096)))
        .collect()
}

fn members(v: &[Arc<MemVolume>], prefix: &str) -> Vec<Member> {
    v.iter()
        .enumerate()
        .map(|(i, m)| Member::new(format!("{prefix}{i}"), m.clone() as VolumeRef))
        .collect()
}

fn config(level: RaidLevel) -> PoolConfig {
    let mut c = PoolConfig::new("ring", level);
    // thin members: a resync at full speed would fill them in memory
    c.rebuild_rate_mb_s = 1;
    c
}

/// The ring the pool was given, and the same after a reassemble.
async fn ring_of(
    cfg: PoolConfig,
    data: &[Arc<MemVolume>],
    devices: &[Arc<MemVolume>],
) -> (u64, u64) {
    let pool =
        Pool::create_with_journal_devices(cfg, members(data, "m"), vec![], members(devices, "j"))
            .await
            .expect("create");
    let made = pool.status();
    pool.shutdown().await.expect("shutdown");
    drop(pool);
    let again =
        Pool::assemble_with_journal_devices(members(data, "m"), false, members(devices, "j"))
            .await
            .expect("assemble");
    let kept = again.status().journal_bytes;
    again.shutdown().await.expect("shutdown");
    assert_eq!(
        made.usable_bytes,
        again.status().usable_bytes,
        "the data area moved"
    );
    (made.journal_bytes, kept)
}

#[test]
fn the_default_ring_is_large_only_where_the_members_and_devices_hold_it() {
    assert_eq!(default_journal_bytes(512 * MIB, &[]), LARGE_JOURNAL_BYTES);
    assert_eq!(default_journal_bytes(2047 * MIB, &[]), LARGE_JOURNAL_BYTES);
    assert_eq!(
        default_journal_bytes(2048 * MIB, &[]),
        LARGEST_JOURNAL_BYTES
    );
    assert_eq!(default_journal_bytes(4 << 40, &[]), LARGEST_JOURNAL_BYTES);
    assert_eq!(default_journal_bytes(511 * MIB, &[]), DEFAULT_JOURNAL_BYTES);
    assert_eq!(default_journal_bytes(64 * MIB, &[]), DEFAULT_JOURNAL_BYTES);
    // a journal device sized for the small ring keeps working
    assert_eq!(
        default_journal_bytes(4 << 40, &[64 * MIB, 63 * MIB]),
        DEFAULT_JOURNAL_BYTES
    );
    assert_eq!(
        default_journal_bytes(4 << 40, &[64 * MIB, 64 * MIB]),
        LARGE_JOURNAL_BYTES
    );
    assert_eq!(
        default_journal_bytes(4 << 40, &[256 * MIB, 255 * MIB]),
        LARGE_JOURNAL_BYTES
    );
    assert_eq!(
        default_journal_bytes(4 << 40, &[256 * MIB]),
        LARGEST_JOURNAL_BYTES
    );
}

#[tokio::test]
async fn a_new_pool_gets_the_large_ring_on_large_members_and_keeps_its_ring() {
    // RAID 5 of 4 members of 512 MiB: 64 MiB
    let big = volumes(4, 512);
    assert_eq!(
        ring_of(config(RaidLevel::Raid5), &big, &[]).await,
        (LARGE_JOURNAL_BYTES, LARGE_JOURNAL_BYTES)
    );
    // RAID 5 of 3 members of 2 GiB: 256 MiB, read back at assemble (every
    // ring at once, piece by piece)
    let bigger = volumes(3, 2048);
    assert_eq!(
        ring_of(config(RaidLevel::Raid5), &bigger, &[]).await,
        (LARGEST_JOURNAL_BYTES, LARGEST_JOURNAL_BYTES)
    );
    // RAID 6 of 5 members of 256 MiB: 16 MiB (64 would be a quarter of them)
    let small = volumes(5, 256);
    assert_eq!(
        ring_of(config(RaidLevel::Raid6), &small, &[]).await,
        (DEFAULT_JOURNAL_BYTES, DEFAULT_JOURNAL_BYTES)
    );
    // large members, but a journal device of 32 MiB: 16 MiB, on the device
    let big = volumes(4, 512);
    let dev = volumes(1, 32);
    assert_eq!(
        ring_of(config(RaidLevel::Raid5), &big, &dev).await,
        (DEFAULT_JOURNAL_BYTES, DEFAULT_JOURNAL_BYTES)
    );
    // set explicitly, it wins over the default either way
    let mut cfg = config(RaidLevel::Raid5);
    cfg.journal_bytes = Some(32 * MIB);
    let big = volumes(4, 512);
    assert_eq!(ring_of(cfg, &big, &[]).await, (32 * MIB, 32 * MIB));
    // mirror levels have no journal
    let big = volumes(2, 512);
    assert_eq!(ring_of(config(RaidLevel::Raid1), &big, &[]).await, (0, 0));
}
