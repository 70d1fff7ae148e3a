//! Partial-block writes against the volume's other writers: another frontend
//! of this node (the SCSI LU's write order) and the partner node of a
//! replicated volume (COMPARE AND WRITE).

use crate::common::{start_exports, Raw};
use block::{Bytes, HoldVolume, MemVolume, Volume, VolumeRef};
use nbd::{ExportAccess, NbdExport, NbdLimits};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::RwLock;

const BS: usize = 4096;

/// The access of an export whose volume another frontend of the node writes
/// too, ordered by `order`.
struct Ordered(Arc<RwLock<()>>);

impl ExportAccess for Ordered {
    fn allows(&self, _write: bool) -> bool {
        true
    }

    fn write_order(&self) -> Option<Arc<RwLock<()>>> {
        Some(self.0.clone())
    }
}

fn export(volume: VolumeRef, access: Option<Arc<dyn ExportAccess>>) -> NbdExport {
    NbdExport {
        name: "lun0".into(),
        description: String::new(),
        volume,
        read_only: false,
        access,
    }
}

/// While an unaligned NBD write has read its edge block and not yet written
/// it back, the volume's write order is held exclusively: another
/// frontend's write (which holds it shared, as a SCSI WRITE does) cannot land
/// in between and be undone by the write-back. Before (review of
/// 2026-12-06), NBD held only its own range locks: an iSCSI write
/// acknowledged in that window was lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partial_write_holds_the_volumes_write_order_while_it_reads_and_writes_back() {
    let mem = Arc::new(MemVolume::new(BS as u32, 64));
    let held = Arc::new(HoldVolume::new(mem.clone() as VolumeRef));
    let order = Arc::new(RwLock::new(()));
    let srv = start_exports(
        vec![export(
            held.clone() as VolumeRef,
            Some(Arc::new(Ordered(order.clone()))),
        )],
        NbdLimits::default(),
    )
    .await;
    let mut c = Raw::connect(srv.addr, "lun0").await;
    held.reads.hold();
    let write = tokio::spawn(async move { c.write(5 * BS as u64 + 100, &[0x11; 10]).await });
    tokio::time::timeout(Duration::from_secs(10), held.reads.arrivals(1))
        .await
        .expect("the partial write read nothing");
    // the other frontend's write, now
    let other = order.clone().try_read_owned();
    if let Ok(g) = &other {
        let _ = g;
        mem.write(5, Bytes::from(vec![0x22u8; BS]), false)
            .await
            .unwrap();
    }
    held.reads.open();
    assert_eq!(write.await.unwrap(), 0);
    let b = mem.read(5, 1).await.unwrap();
    assert!(
        other.is_err(),
        "another frontend could write while the edge block was read (block now starts {:02x?})",
        &b[..4]
    );
    assert!(b[..100].iter().all(|&x| x == 0) && b[100..110].iter().all(|&x| x == 0x11));
    srv.stop().await;
}

/// The partner's write of an edge block lands between the read and the
/// write-back of an unaligned NBD write (on either of its edges): the
/// write-back is a COMPARE AND WRITE, which reads the block again (the
/// volume's own comparison), finds it changed, and the write starts over, so
/// the partner's bytes around the NBD write survive. Before (review of
/// 2026-12-06), the block as first read was written back over them, with no
/// second read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partial_write_does_not_undo_the_partners_write_of_its_edge_block() {
    for (lba, off, len) in [(5u64, 5 * BS + 100, 10usize), (6, 5 * BS + 100, BS + 50)] {
        let mem = Arc::new(MemVolume::new(BS as u32, 64));
        let held = Arc::new(HoldVolume::new(mem.clone() as VolumeRef));
        held.reads.hold_range(lba, lba + 1);
        let srv = start_exports(vec![export(held.clone(), None)], NbdLimits::default()).await;
        let mut c = Raw::connect(srv.addr, "lun0").await;
        let write = tokio::spawn(async move { c.write(off as u64, &vec![0x11; len]).await });
        let within = |n| tokio::time::timeout(Duration::from_secs(10), held.reads.arrivals(n));
        within(1).await.expect("the edge block was never read");
        held.reads.release(1);
        within(2)
            .await
            .expect("the edge block was written back without being compared");
        // the partner's write, between the read and the write-back
        mem.write(lba, Bytes::from(vec![0x22u8; BS]), false)
            .await
            .unwrap();
        held.reads.open();
        assert_eq!(write.await.unwrap(), 0);
        let b = mem.read(lba, 1).await.unwrap();
        let (from, to) = (
            off.saturating_sub(lba as usize * BS).min(BS),
            (off + len).saturating_sub(lba as usize * BS).min(BS),
        );
        for (i, &x) in b.iter().enumerate() {
            let want = if (from..to).contains(&i) { 0x11 } else { 0x22 };
            assert_eq!(x, want, "block {lba} byte {i}");
        }
        srv.stop().await;
    }
}
