//! A write whose caller goes away (an aborted SCSI command drops its future)
//! still ends on every member: a mirror half left without it would answer
//! reads with the old data while the other half answers with the new. (Member
//! requests run on the members' own queues, so this holds without a task per
//! pool write; the test keeps it so.)

use crate::common::*;
use block::{HoldVolume, MemVolume, Volume, VolumeRef};
use raid::{Member, Pool, RaidLevel};
use std::sync::Arc;
use std::time::Duration;

/// The block indexes in `hay` (of `BS`-byte blocks) where `needle` starts.
fn find(hay: &[u8], needle: &[u8]) -> Vec<usize> {
    hay.chunks(BS as usize)
        .enumerate()
        .filter(|(_, b)| *b == &needle[..BS as usize])
        .map(|(i, _)| i)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mirror_write_whose_caller_is_aborted_reaches_both_halves() {
    let mems: Vec<Arc<MemVolume>> = (0..2)
        .map(|_| Arc::new(MemVolume::new(BS, MEMBER_BLOCKS)))
        .collect();
    let holds: Vec<Arc<HoldVolume>> = mems
        .iter()
        .map(|m| Arc::new(HoldVolume::new(m.clone() as VolumeRef)))
        .collect();
    let pool = Arc::new(
        Pool::create(
            config(RaidLevel::Raid1),
            holds
                .iter()
                .enumerate()
                .map(|(i, h)| Member::new(format!("m{i}"), h.clone() as VolumeRef))
                .collect(),
            vec![],
        )
        .await
        .expect("create"),
    );
    // an update acknowledged once its record is durable finishes on a task of
    // its own already; this one is applied before its acknowledgement, as when
    // a copy of its record could not be written
    pool.set_early_ack(false);
    let data = pattern(41, 8);
    // both halves hold their writes; the first lets it through, the second
    // still holds it when the caller is aborted
    for h in &holds {
        h.writes.hold();
    }
    let w = {
        let pool = pool.clone();
        let data = data.clone();
        tokio::spawn(async move { pool.write(100, data, false).await })
    };
    // first the pool's record of the update (a journal write on each half),
    // then the data: the second half takes its record and holds the data
    holds[0].writes.arrivals(1).await;
    holds[1].writes.arrivals(1).await;
    holds[0].writes.open();
    holds[1].writes.release(1);
    holds[1].writes.arrivals(2).await;
    // (the update's record may carry the data too: every place it is found)
    let mut at = Vec::new();
    for _ in 0..500 {
        let first = mems[0].read(0, MEMBER_BLOCKS as u32).await.unwrap();
        at = find(&first, &data);
        if !at.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(!at.is_empty(), "the first half never got the write");
    let before = mems[1].read(0, MEMBER_BLOCKS as u32).await.unwrap();
    assert!(
        find(&before, &data).is_empty(),
        "the second half had the write before the abort"
    );
    w.abort();
    let _ = w.await;
    holds[1].writes.open();
    // the second half gets it too (bounded wait for the write still under way)
    let mut same = false;
    for _ in 0..500 {
        let second = mems[1].read(0, MEMBER_BLOCKS as u32).await.unwrap();
        if at
            .iter()
            .all(|&i| second[i * BS as usize..(i + 8) * BS as usize] == data[..])
        {
            same = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        same,
        "the mirror halves differ at member blocks {at:?}: the aborted write reached one only"
    );
    pool.shutdown().await.unwrap();
}
