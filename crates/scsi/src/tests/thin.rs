//! The thin provisioning soft threshold and out-of-space answers through
//! [`ScsiTarget::execute`], over a memory volume whose space use the test sets.

use super::*;
use block::Provisioning;
use std::sync::atomic::AtomicBool;

/// A thin memory volume that reports the space use the test sets, and refuses
/// writes for want of space when told to.
struct Space {
    inner: MemVolume,
    mapped_bytes: AtomicU64,
    available_bytes: AtomicU64,
    full: AtomicBool,
}

#[async_trait]
impl Volume for Space {
    fn geometry(&self) -> Geometry {
        self.inner.geometry()
    }
    fn provisioning(&self) -> Option<Provisioning> {
        Some(Provisioning {
            mapped_bytes: self.mapped_bytes.load(Ordering::Relaxed),
            available_bytes: self.available_bytes.load(Ordering::Relaxed),
        })
    }
    async fn read(&self, lba: u64, blocks: u32) -> BlockResult<Bytes> {
        self.inner.read(lba, blocks).await
    }
    async fn write(&self, lba: u64, data: Bytes, fua: bool) -> BlockResult<()> {
        if self.full.load(Ordering::Relaxed) {
            return Err(block::BlockError::NoSpace { lba });
        }
        self.inner.write(lba, data, fua).await
    }
    async fn flush(&self) -> BlockResult<()> {
        Ok(())
    }
    async fn discard(&self, lba: u64, blocks: u64) -> BlockResult<()> {
        self.inner.discard(lba, blocks).await
    }
    async fn block_status(&self, lba: u64, blocks: u64) -> BlockResult<Vec<Extent>> {
        self.inner.block_status(lba, blocks).await
    }
}

const LU_BYTES: u64 = BLOCKS * BS as u64;

/// Writes enough (1 MiB, 64 KiB at a time at LBA 0) for a sample to be due.
async fn write_a_sample(t: &ScsiTarget, n: &ItNexus) {
    let chunk = vec![0x5au8; 128 * BS];
    for _ in 0..(crate::THIN_CHECK_BYTES / chunk.len() as u64) {
        let r = run(t, n, &rw10(0x2a, 0, 128), &chunk).await;
        assert_eq!(r.status, status::GOOD);
    }
}

/// The provisioning mode subpage's descriptor: (byte 0, resource, count).
async fn lbp_descriptor(t: &ScsiTarget, n: &ItNexus) -> (u8, u8, u32) {
    let r = run(t, n, &[0x5a, 0x08, 0x1c, 0x02, 0, 0, 0, 0, 255, 0], &[]).await;
    assert_eq!(r.status, status::GOOD);
    let p = &r.data_in[8..];
    assert_eq!((p[0], p[1], u16::from_be_bytes([p[2], p[3]])), (0x5c, 2, 20));
    let d = &p[16..24];
    (d[0], d[1], u32::from_be_bytes([d[4], d[5], d[6], d[7]]))
}

#[tokio::test]
async fn soft_threshold_raises_one_unit_attention_per_crossing_and_an_event() {
    let vol = Arc::new(Space {
        inner: MemVolume::new(BS as u32, BLOCKS),
        mapped_bytes: AtomicU64::new(0),
        available_bytes: AtomicU64::new(10 << 20),
        full: AtomicBool::new(false),
    });
    let t = target_with(vol.clone());
    let mut events = t.subscribe_events();
    let a = ready(&t, "1", 1).await;
    let b = ready(&t, "2", 2).await;

    // VPD B2h: thresholds supported (nonzero exponent), thin.
    let r = run(&t, &a, &[0x12, 1, 0xb2, 0, 255, 0], &[]).await;
    let exponent = r.data_in[4];
    assert!(exponent >= 1);
    assert_eq!(r.data_in[6] & 0x07, 0x02, "PROVISIONING TYPE thin");
    let set_bytes = (BS as u64) << exponent;
    // LBPERE is set in the read-write error recovery page.
    let r = run(&t, &a, &[0x1a, 0x08, 0x01, 0, 255, 0], &[]).await;
    assert_eq!(r.data_in[4 + 7] & 0x80, 0x80, "LBPERE");

    // No threshold yet: the descriptor is there, not enabled.
    assert_eq!(lbp_descriptor(&t, &a).await, (0x01, 0x02, 0));
    assert!(t.set_thin_threshold(0, Some(50)));
    assert_eq!(t.thin_threshold(0), Some(50));
    let want_count = (LU_BYTES / 2 / set_bytes) as u32;
    assert_eq!(lbp_descriptor(&t, &a).await, (0x81, 0x02, want_count));

    // Below the threshold: nothing.
    vol.mapped_bytes.store(LU_BYTES / 4, Ordering::Relaxed);
    write_a_sample(&t, &a).await;
    assert_eq!(run(&t, &b, &[0, 0, 0, 0, 0, 0], &[]).await.status, 0);

    // Over it: every nexus, the writer's too, gets the unit attention once,
    // with the descriptor's offset as INFORMATION; subscribers get the event.
    vol.mapped_bytes.store(LU_BYTES * 3 / 4, Ordering::Relaxed);
    write_a_sample(&t, &a).await;
    for n in [&a, &b] {
        let r = run(&t, n, &[0, 0, 0, 0, 0, 0], &[]).await;
        assert_eq!(sense_of(&r), (key::UNIT_ATTENTION, 0x38, 0x07));
        assert_eq!(info_of(&r), 16);
        assert_eq!(run(&t, n, &[0, 0, 0, 0, 0, 0], &[]).await.status, 0);
    }
    match events.try_recv() {
        Ok(LuEvent::ThinThresholdReached {
            lun: 0,
            mapped_bytes,
            threshold_bytes,
            ..
        }) => assert_eq!((mapped_bytes, threshold_bytes), (LU_BYTES * 3 / 4, LU_BYTES / 2)),
        other => panic!("expected the threshold event, got {other:?}"),
    }
    // Still over it: not again.
    write_a_sample(&t, &a).await;
    assert_eq!(run(&t, &b, &[0, 0, 0, 0, 0, 0], &[]).await.status, 0);
    assert!(events.try_recv().is_err());

    // UNMAP brings it below (re-armed, sampled at once); over again: again.
    vol.mapped_bytes.store(0, Ordering::Relaxed);
    let mut unmap = vec![0u8, 22, 0, 16];
    unmap.extend_from_slice(&[0; 4]);
    unmap.extend_from_slice(&0u64.to_be_bytes());
    unmap.extend_from_slice(&8u32.to_be_bytes());
    unmap.extend_from_slice(&[0; 4]);
    let r = run(&t, &a, &[0x42, 0, 0, 0, 0, 0, 0, 0, 24, 0], &unmap).await;
    assert_eq!(r.status, 0);
    vol.mapped_bytes.store(LU_BYTES, Ordering::Relaxed);
    write_a_sample(&t, &a).await;
    let r = run(&t, &b, &[0, 0, 0, 0, 0, 0], &[]).await;
    assert_eq!(sense_of(&r), (key::UNIT_ATTENTION, 0x38, 0x07));
    assert!(matches!(
        events.try_recv(),
        Ok(LuEvent::ThinThresholdReached { .. })
    ));

    // Out of space: DATA PROTECT, SPACE ALLOCATION FAILED WRITE PROTECT (not an
    // internal target failure, no WP in the mode header), and one event.
    vol.full.store(true, Ordering::Relaxed);
    for _ in 0..3 {
        let r = run(&t, &b, &rw10(0x2a, 8, 1), &[1u8; BS]).await;
        assert_eq!(sense_of(&r), (key::DATA_PROTECT, 0x27, 0x07));
    }
    let r = run(&t, &b, &[0x1a, 0, 0x0a, 0, 255, 0], &[]).await;
    assert_eq!(r.data_in[2] & 0x80, 0, "no WP bit for a full thin LU");
    assert!(matches!(
        events.try_recv(),
        Ok(LuEvent::ThinOutOfSpace { lun: 0, .. })
    ));
    assert!(events.try_recv().is_err(), "one out-of-space event");
}

#[tokio::test]
async fn the_provisioning_subpage_is_restated_not_changed_by_mode_select() {
    let t = target_with(Arc::new(MemVolume::new(BS as u32, BLOCKS)));
    let a = ready(&t, "1", 1).await;
    assert!(t.set_thin_threshold(0, Some(80)));
    // All pages and subpages: the subpage follows the informational exceptions page.
    let r = run(&t, &a, &[0x5a, 0x08, 0x3f, 0xff, 0, 0, 0, 0x10, 0, 0], &[]).await;
    assert_eq!(r.status, 0);
    let all = &r.data_in[8..];
    assert!(all.windows(2).any(|w| w == [0x5c, 0x02]), "subpage listed");
    let r = run(&t, &a, &[0x5a, 0x08, 0x3f, 0x00, 0, 0, 0, 0x10, 0, 0], &[]).await;
    assert!(!r.data_in[8..].windows(2).any(|w| w == [0x5c, 0x02]));
    // Changeable values: nothing.
    let r = run(&t, &a, &[0x5a, 0x08, 0x5c, 0x02, 0, 0, 0, 255, 0, 0], &[]).await;
    assert!(r.data_in[8 + 4..].iter().all(|b| *b == 0));
    // Restated as read: accepted. A different count: refused, pointing at it.
    let r = run(&t, &a, &[0x5a, 0x08, 0x1c, 0x02, 0, 0, 0, 255, 0, 0], &[]).await;
    let mut list = vec![0u8; 8];
    list.extend_from_slice(&r.data_in[8..]);
    let len = list.len() as u8;
    let r = run(&t, &a, &[0x55, 0x10, 0, 0, 0, 0, 0, 0, len, 0], &list).await;
    assert_eq!(r.status, 0);
    list[8 + 23] ^= 1;
    let r = run(&t, &a, &[0x55, 0x10, 0, 0, 0, 0, 0, 0, len, 0], &list).await;
    assert_eq!(sense_of(&r), (ILLEGAL, 0x26, 0));
    // A thick LU has no such subpage.
    let thick = target_with(Arc::new(MemVolume::new_thick(BS as u32, BLOCKS)));
    let a = ready(&thick, "1", 1).await;
    let r = run(&thick, &a, &[0x5a, 0x08, 0x1c, 0x02, 0, 0, 0, 255, 0, 0], &[]).await;
    assert_eq!(sense_of(&r), (ILLEGAL, 0x24, 0));
}
