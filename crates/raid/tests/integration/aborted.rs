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
    // where the data lands in place on each half (a mirror: the same block);
    // the update's record may carry a copy of it elsewhere, on each half's
    // own ring position, which is not compared
    let at = (pool.data_offset_bytes() / BS as u64 + 100) as usize;
    let in_place = |m: &Arc<MemVolume>| {
        let (m, data) = (m.clone(), data.clone());
        async move { m.read(at as u64, 8).await.unwrap() == data }
    };
    let mut first = false;
    for _ in 0..500 {
        if in_place(&mems[0]).await {
            first = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(first, "the first half never got the write");
    assert!(
        !in_place(&mems[1]).await,
        "the second half had the write before the abort"
    );
    w.abort();
    let _ = w.await;
    holds[1].writes.open();
    // the second half gets it too (bounded wait for the write still under way)
    let mut same = false;
    for _ in 0..500 {
        if in_place(&mems[1]).await {
            same = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        same,
        "the mirror halves differ at member block {at}: the aborted write reached one only"
    );
    pool.shutdown().await.unwrap();
}
