//! Replay of journal records planted in the rings of a crashed pool: the
//! records a replay found must all be found again by a replay that is cut
//! short, whatever it wrote meanwhile.

use crate::journal::{self, Entry, LINK_DATA_FIRST};
use crate::{Member, Pool, PoolConfig, RaidLevel};
use block::{Bytes, CutVolume as Cut, MemVolume, Volume, VolumeRef};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

const BS: u32 = 4096;
const MEMBER_BLOCKS: u64 = 2048; // 8 MiB

fn members(mems: &[Arc<MemVolume>], budget: &Arc<AtomicI64>) -> Vec<Member> {
    mems.iter()
        .enumerate()
        .map(|(i, m)| {
            let v = Arc::new(Cut {
                inner: m.clone() as VolumeRef,
                budget: budget.clone(),
            }) as VolumeRef;
            Member::new(format!("m{i}"), v)
        })
        .collect()
}

/// What the planted records leave the pool holding.
struct Planted {
    mems: Vec<Arc<MemVolume>>,
    /// Pool block the two whole updates wrote, and its newest data.
    x: u64,
    newest: Vec<u8>,
    /// Pool block the open data-first record wrote, and its data.
    y: u64,
    open: Vec<u8>,
    /// The open record's entry; the checkpoint, pool tag and ring offset.
    y_entry: Entry,
    cp: u64,
    tag: u64,
    ring_at: u64,
}

/// A RAID 5 of 3 that crashed with, above its checkpoint: `W1` (block X = A)
/// in the middle of the ring, `W2` (X = B, newer) at its start (the ring
/// wrapped between them), and an open data-first record `D` (block Y = Z,
/// never completed), or with the entries `bad` gives it instead (from the
/// pool's chunk size).
/// A RAID 5 of 3 (16 KiB chunks, a 2 MiB ring) created on fresh memory
/// members, idle and flushed: the members and the pool's state, the pool
/// itself dropped (as after a crash) for records to be planted.
async fn created(name: &str) -> (Vec<Arc<MemVolume>>, Arc<crate::pool::Inner>) {
    let mems: Vec<Arc<MemVolume>> = (0..3)
        .map(|_| Arc::new(MemVolume::new(BS, MEMBER_BLOCKS)))
        .collect();
    let uncut = Arc::new(AtomicI64::new(-1));
    let mut cfg = PoolConfig::new(name, RaidLevel::Raid5);
    cfg.chunk_bytes = 16 * 1024;
    cfg.journal_bytes = Some(2 << 20);
    cfg.rebuild_rate_mb_s = 0; // unpaced
    let pool = Pool::create(cfg, members(&mems, &uncut), vec![])
        .await
        .expect("create");
    pool.wait_idle().await;
    pool.flush().await.unwrap();
    (mems, pool.inner.clone())
}

/// Writes `records` (ring offset, bytes) into the rings as a group commit
/// writes them: on one copy set, `redundancy + 1` members (the first set,
/// {0, 1}, the one assemble writes its new records to).
async fn plant<R: AsRef<[u8]>>(mems: &[Arc<MemVolume>], ring_at: u64, records: &[(u64, R)]) {
    for m in &mems[..2] {
        for (at, rec) in records {
            m.write(ring_at + at, Bytes::copy_from_slice(rec.as_ref()), true)
                .await
                .unwrap();
        }
    }
}

async fn planted(bad: Option<fn(u64) -> Vec<Entry>>) -> Planted {
    let (mems, inner) = created("replay").await;
    let cp = inner.state.lock().journal_checkpoint_seq;
    let j = inner.journal.as_ref().expect("a parity pool has a journal");
    let (ring_at, tag, bs, cb) = (j.offset_blocks, inner.pool_tag, BS as usize, inner.cb);
    let k = inner.layout.data_chunks() as u64;
    let block = |b: u8| vec![b; bs];
    let (a, b, z) = (block(0xa1), block(0xb2), block(0x5e));
    let x_pos = inner.layout.data_positions(0, 0)[0] as u16;
    let ys = 5u64;
    let y_pos = inner.layout.data_positions(ys, 0)[0] as u16;
    let x_entry = Entry {
        position: x_pos,
        discard: false,
        member_lba: 0,
        blocks: 1,
    };
    let y_entries = match bad {
        Some(f) => f(cb),
        None => vec![Entry {
            position: y_pos,
            discard: false,
            member_lba: ys * cb,
            blocks: 1,
        }],
    };
    let y_first = y_entries[0].clone();
    let y_payloads: Vec<Vec<u8>> = y_entries
        .iter()
        .map(|e| vec![0x5e; e.blocks as usize * bs])
        .collect();
    let y_pay: Vec<&[u8]> = y_payloads.iter().map(|p| &p[..]).collect();
    let records = [
        (
            100u64,
            journal::encode(cp + 2, tag, 0, std::slice::from_ref(&x_entry), &[&a], bs),
        ),
        (0u64, journal::encode(cp + 3, tag, 0, &[x_entry], &[&b], bs)),
        (
            200u64,
            journal::encode(cp + 4, tag, LINK_DATA_FIRST, &y_entries, &y_pay, bs),
        ),
    ];
    plant(&mems, ring_at, &records).await;
    drop(inner);
    Planted {
        mems,
        x: 0,
        newest: b,
        y: ys * k * cb,
        open: z,
        y_entry: y_first,
        cp,
        tag,
        ring_at,
    }
}

/// Cut after every number of member writes an uncut assemble makes: the
/// next assemble still serves the newest data of block X and the open
/// record's data at Y. (Before, the record completing `D` was written over
/// `W2`'s ring space: cut before the checkpoint, the next assemble replayed
/// `W1` alone and X read A, the older write.)
#[tokio::test]
async fn an_assemble_cut_while_completing_data_first_records_loses_no_newer_record() {
    let mut total = None;
    let mut cut = 0i64;
    loop {
        let p = planted(None).await;
        const UNCUT: i64 = 1 << 40;
        let budget = Arc::new(AtomicI64::new(if total.is_none() { UNCUT } else { cut }));
        let first = Pool::assemble(members(&p.mems, &budget), false).await;
        if total.is_none() {
            first.expect("assemble");
            total = Some(UNCUT - budget.load(Ordering::SeqCst));
            continue;
        }
        drop(first);
        let uncut = Arc::new(AtomicI64::new(-1));
        let pool = Pool::assemble(members(&p.mems, &uncut), false)
            .await
            .expect("assemble after the cut");
        assert!(
            pool.read(p.x, 1).await.unwrap()[..] == p.newest[..],
            "cut after {cut} of {total:?} member writes: block X lost its newest write"
        );
        assert!(
            pool.read(p.y, 1).await.unwrap()[..] == p.open[..],
            "cut after {cut} of {total:?} member writes: the data-first write"
        );
        if cut >= total.unwrap() {
            break;
        }
        cut += 1;
    }
}

/// A data-first record whose checksum holds but whose entries do not lie in
/// its first entry's stripe is left out, not followed (before, the second
/// entry's offset in the stripe wrapped below zero, and the sum after it
/// overflowed: a panic, or a write far from the stripe).
#[tokio::test]
async fn a_data_first_record_with_entries_out_of_its_stripe_is_left_out() {
    let across: fn(u64) -> Vec<Entry> = |cb| {
        vec![
            Entry {
                position: 0,
                discard: false,
                member_lba: cb,
                blocks: 1,
            },
            Entry {
                position: 1,
                discard: false,
                member_lba: 0,
                blocks: cb as u32,
            },
        ]
    };
    let p = planted(Some(across)).await;
    let uncut = Arc::new(AtomicI64::new(-1));
    let pool = Pool::assemble(members(&p.mems, &uncut), false)
        .await
        .expect("assemble");
    assert!(pool.read(p.x, 1).await.unwrap()[..] == p.newest[..]);
    assert!(
        pool.read(p.y, 1).await.unwrap()[..] != p.open[..],
        "the record left out wrote nothing"
    );
}

/// A disk that was this pool's member comes back as its replacement (or as a
/// spare): the records its ring still holds are zeroed before it joins, so
/// no later replay can take one of them for a new record of the same number.
#[tokio::test]
async fn a_member_that_joins_again_brings_no_old_records() {
    for as_spare in [false, true] {
        let p = planted(None).await;
        let uncut = Arc::new(AtomicI64::new(-1));
        let pool = Pool::assemble(members(&p.mems, &uncut), false)
            .await
            .expect("assemble");
        let j = pool.inner.journal.as_ref().expect("a journal");
        let (ring_at, ring_blocks) = (j.offset_blocks, j.ring_blocks);
        // member 0 holds the planted records (and the replay's own)
        let ring = p.mems[0].read(ring_at, ring_blocks as u32).await.unwrap();
        assert!(ring.iter().any(|&b| b != 0), "the ring held no record");
        pool.fail_member(0).await.unwrap();
        let back = Member::new("m0-again".to_string(), p.mems[0].clone() as VolumeRef);
        if as_spare {
            pool.add_spare(back).await.unwrap();
        } else {
            pool.replace_member(0, back).await.unwrap();
        }
        let ring = p.mems[0].read(ring_at, ring_blocks as u32).await.unwrap();
        let left = ring.iter().filter(|&&b| b != 0).count();
        // records written since it joined may be there: none of the old ones
        for rec in journal::scan(&ring, BS as usize, pool.inner.pool_tag, u64::MAX) {
            assert!(
                rec.seq > pool.inner.state.lock().journal_checkpoint_seq,
                "an old record (seq {}) is still on the disk that joined again ({left} bytes set)",
                rec.seq
            );
        }
    }
}

/// An open data-first record whose stripe a later record wrote again (its
/// update was written in place without its completing record, or given up)
/// is left out: resolved after the whole updates, it wrote its older data
/// over the later write.
#[tokio::test]
async fn an_open_data_first_record_written_over_later_is_left_out() {
    let p = planted(None).await;
    let later = vec![0x77u8; BS as usize];
    let rec = journal::encode(
        p.cp + 5,
        p.tag,
        0,
        std::slice::from_ref(&p.y_entry),
        &[&later],
        BS as usize,
    );
    for m in &p.mems[..2] {
        m.write(p.ring_at + 300, Bytes::copy_from_slice(&rec), true)
            .await
            .unwrap();
    }
    let uncut = Arc::new(AtomicI64::new(-1));
    let pool = Pool::assemble(members(&p.mems, &uncut), false)
        .await
        .expect("assemble");
    assert!(
        pool.read(p.y, 1).await.unwrap()[..] == later[..],
        "the open record's older data was written over the later write"
    );
    assert!(pool.read(p.x, 1).await.unwrap()[..] == p.newest[..]);
}

/// The records completing open data-first records are placed in the ring's
/// gaps first-fit, from the start again before giving up: a ring full of
/// live records, with a small gap at its start and a gap at its end that
/// just holds the first (large) completing record, takes the second (small)
/// one in the small gap. (Before, the search went on only from the last
/// record placed, and with the oldest open record the first above the
/// checkpoint no checkpoint could free space: the assemble failed for lack
/// of ring space, with space left.)
#[tokio::test]
async fn completing_records_take_a_gap_a_larger_one_passed_over() {
    let (mems, inner) = created("gaps").await;
    let uncut = Arc::new(AtomicI64::new(-1));
    let cp = inner.state.lock().journal_checkpoint_seq;
    let j = inner.journal.as_ref().expect("a parity pool has a journal");
    let (ring_at, ring, tag) = (j.offset_blocks, j.ring_blocks, inner.pool_tag);
    let (bs, cb, k) = (BS as usize, inner.cb, inner.layout.data_chunks() as u64);
    let data_entry = |s: u64, blocks: u32| Entry {
        position: inner.layout.data_positions(s, 0)[0] as u16,
        discard: false,
        member_lba: s * cb,
        blocks,
    };
    let parity_entry = |s: u64, blocks: u32| Entry {
        position: inner.layout.parity_positions(s)[0] as u16,
        discard: false,
        member_lba: s * cb,
        blocks,
    };
    // D1: a whole chunk of stripe 5; D2: one block of stripe 6
    let (d1, d2) = (data_entry(5, cb as u32), data_entry(6, 1));
    let c1 = journal::record_blocks(&[d1.clone(), parity_entry(5, cb as u32)], bs);
    let c2 = journal::record_blocks(&[d2.clone(), parity_entry(6, 1)], bs);
    assert!(c2 < c1, "the second completing record must be the smaller");
    let (p1, p2) = (vec![0xd1u8; cb as usize * bs], vec![0xd2u8; bs]);
    let mut records: Vec<(u64, Vec<u8>)> = Vec::new();
    // gap A: [0, c2); then D1, D2
    let mut at = c2;
    for (seq, e, p) in [(cp + 1, &d1, &p1), (cp + 2, &d2, &p2)] {
        let rec = journal::encode(seq, tag, LINK_DATA_FIRST, std::slice::from_ref(e), &[p], bs);
        let len = (rec.len() / bs) as u64;
        records.push((at, rec));
        at += len;
    }
    // whole records of other stripes up to gap B: [ring - c1, ring)
    let mut left = ring - c1 - at;
    let mut sizes = Vec::new();
    while left > 0 {
        // records of 2..=5 blocks (a header and 1..=4 blocks), none leaving 1
        let n = if left == 6 { 3 } else { left.min(cb + 1) };
        sizes.push(n);
        left -= n;
    }
    let mut fillers = Vec::new();
    for (i, n) in sizes.into_iter().enumerate() {
        let s = 10 + i as u64;
        let e = data_entry(s, (n - 1) as u32);
        let p = vec![(i % 251) as u8 + 1; (n - 1) as usize * bs];
        let rec = journal::encode(
            cp + 3 + i as u64,
            tag,
            0,
            std::slice::from_ref(&e),
            &[&p],
            bs,
        );
        assert_eq!((rec.len() / bs) as u64, n);
        records.push((at, rec));
        fillers.push((s, p));
        at += n;
    }
    assert_eq!(at, ring - c1);
    plant(&mems, ring_at, &records).await;
    drop(inner);
    let pool = Pool::assemble(members(&mems, &uncut), false)
        .await
        .expect("assemble with ring space left in a gap");
    assert!(pool.read(5 * k * cb, cb as u32).await.unwrap()[..] == p1[..]);
    assert!(pool.read(6 * k * cb, 1).await.unwrap()[..] == p2[..]);
    for (s, p) in &fillers {
        let blocks = (p.len() / bs) as u32;
        assert!(pool.read(s * k * cb, blocks).await.unwrap()[..] == p[..]);
    }
}

/// A member left out of an assemble (not found at a start) and taken back,
/// stale, by a forced one brings no record of its ring into that
/// assemble's replay: the pool handed the sequence numbers of its time out
/// again, and a stale record above the checkpoint, replayed, wrote old data
/// over a newer acknowledged write (review of 2026-12-06). Its ring is
/// zeroed before the replay, as a replacement's is.
#[tokio::test]
async fn a_stale_member_taken_back_by_force_brings_no_old_records() {
    let (mems, inner) = created("stale").await;
    let (ring_at, tag) = {
        let j = inner.journal.as_ref().expect("a parity pool has a journal");
        (j.offset_blocks, inner.pool_tag)
    };
    let x_entry = Entry {
        position: inner.layout.data_positions(0, 0)[0] as u16,
        discard: false,
        member_lba: 0,
        blocks: 1,
    };
    drop(inner);
    let uncut = Arc::new(AtomicI64::new(-1));
    // a start without the third member: it is failed, the pool goes on and
    // takes a newer write of block 0
    let pool = Pool::assemble(members(&mems[..2], &uncut), false)
        .await
        .expect("assemble without the third member");
    let newer = vec![0x4eu8; BS as usize];
    pool.write(0, Bytes::from(newer.clone()), true)
        .await
        .unwrap();
    pool.wait_idle().await;
    pool.flush().await.unwrap();
    let cp = pool.inner.state.lock().journal_checkpoint_seq;
    pool.shutdown().await.unwrap();
    drop(pool);
    // the third member's ring holds an old record of block 0 with a number
    // above the checkpoint (as one of its time could: numbers are handed out
    // again after an assemble; the stop moves the checkpoint a little)
    let old = vec![0x01u8; BS as usize];
    let rec = journal::encode(cp + 100, tag, 0, &[x_entry], &[&old], BS as usize);
    mems[2]
        .write(ring_at, Bytes::copy_from_slice(&rec), true)
        .await
        .unwrap();
    let pool = Pool::assemble(members(&mems, &uncut), true)
        .await
        .expect("forced assemble with the stale member");
    assert!(
        pool.read(0, 1).await.unwrap()[..] == newer[..],
        "a stale record was replayed over the newer write"
    );
    let ring = mems[2]
        .read(
            ring_at,
            pool.inner.journal.as_ref().unwrap().ring_blocks as u32,
        )
        .await
        .unwrap();
    assert!(
        journal::scan(&ring, BS as usize, tag, cp).is_empty(),
        "the stale member's ring kept its old record"
    );
}

/// A member's ring with a sector it cannot read still gives up its other
/// records: with the other copy of the records lost with its member, they
/// are the only copy of acknowledged writes. Before (review of 2026-12-06)
/// one unreadable sector anywhere in the ring dropped the whole ring.
#[tokio::test]
async fn a_ring_with_an_unreadable_sector_still_gives_its_other_records() {
    let p = planted(None).await;
    // the records lie at ring blocks 0, 100 and 200 of members 0 and 1;
    // member 1 is gone, and member 0 cannot read block 500 of its ring
    let faulty = Arc::new(block::FaultVolume::new(p.mems[0].clone() as VolumeRef));
    faulty.plan().lock().bad_read_blocks =
        std::iter::once(p.ring_at + 500..p.ring_at + 501).collect();
    let found = vec![
        Member::new("m0".to_string(), faulty.clone() as VolumeRef),
        Member::new("m2".to_string(), p.mems[2].clone() as VolumeRef),
    ];
    let pool = Pool::assemble(found, false).await.expect("assemble");
    assert!(
        pool.read(p.x, 1).await.unwrap()[..] == p.newest[..],
        "the newest write of block X, recorded on the ring, was lost"
    );
}
