//! WRITE ATOMIC(16) through the target, over a volume with atomic writes and over
//! one without.

use super::*;
use block::AtomicWrites;

fn atomic_target() -> ScsiTarget {
    let data = Arc::new(MemVolume::new(BS as u32, BLOCKS));
    let records = Arc::new(MemVolume::new(
        BS as u32,
        AtomicWrites::records_bytes(BS as u32) / BS as u64,
    ));
    target_with(Arc::new(AtomicWrites::new(data, records, 1).unwrap()))
}

fn wa16(lba: u64, blocks: u16, flags: u8, boundary: u16) -> [u8; 16] {
    let mut c = [0u8; 16];
    c[0] = 0x9c;
    c[1] = flags;
    c[2..10].copy_from_slice(&lba.to_be_bytes());
    c[10..12].copy_from_slice(&boundary.to_be_bytes());
    c[12..14].copy_from_slice(&blocks.to_be_bytes());
    c
}

fn block_limits_cdb() -> [u8; 6] {
    [0x12, 0x01, 0xb0, 0x00, 0xff, 0x00]
}

/// REPORT SUPPORTED OPERATION CODES for one opcode: its SUPPORT field.
async fn support_of(t: &ScsiTarget, n: &ItNexus, opcode: u8) -> u8 {
    let r = run(
        t,
        n,
        &[0xa3, 0x0c, 0x01, opcode, 0, 0, 0, 0, 0x10, 0, 0, 0],
        &[],
    )
    .await;
    assert_eq!(r.status, status::GOOD);
    r.data_in[1] & 0x07
}

#[tokio::test]
async fn write_atomic_writes_and_is_advertised() {
    let t = atomic_target();
    let n = ready(&t, "01", 1).await;
    let r = run(&t, &n, &block_limits_cdb(), &[]).await;
    assert_eq!(r.status, status::GOOD);
    let max = u32::from_be_bytes([r.data_in[44], r.data_in[45], r.data_in[46], r.data_in[47]]);
    assert_eq!(max, 2048, "1 MiB of 512-byte blocks");
    // alignment, granularity and boundary fields: none
    assert!(r.data_in[48..64].iter().all(|&b| b == 0));
    assert_eq!(support_of(&t, &n, 0x9c).await, 0x03);

    let data = vec![0x5a; 8 * BS];
    let r = run(&t, &n, &wa16(16, 8, 0x08, 0), &data).await;
    assert_eq!(r.status, status::GOOD);
    let r = run(&t, &n, &rw10(0x28, 16, 8), &[]).await;
    assert_eq!(&r.data_in[..], &data[..]);
    // zero blocks: nothing to do
    let r = run(&t, &n, &wa16(0, 0, 0, 0), &[]).await;
    assert_eq!(r.status, status::GOOD);
}

#[tokio::test]
async fn write_atomic_refusals() {
    let t = atomic_target();
    let n = ready(&t, "01", 1).await;
    let one = vec![1u8; BS];
    // WRPROTECT without protection information, a nonzero ATOMIC BOUNDARY, more
    // than the atomic limit: INVALID FIELD IN CDB
    for cdb in [wa16(0, 1, 0x20, 0), wa16(0, 1, 0, 1)] {
        let r = run(&t, &n, &cdb, &one).await;
        assert_eq!(sense_of(&r), (key::ILLEGAL_REQUEST, 0x24, 0x00));
    }
    let big = vec![0u8; 1025 * BS];
    let t2 = target_with(Arc::new(
        AtomicWrites::new(
            Arc::new(MemVolume::new(BS as u32, 4096)),
            Arc::new(MemVolume::new(
                BS as u32,
                AtomicWrites::records_bytes(BS as u32) / BS as u64,
            )),
            1,
        )
        .unwrap(),
    ));
    let n2 = ready(&t2, "02", 1).await;
    let r = run(&t2, &n2, &wa16(0, 2049, 0, 0), &vec![0u8; 2049 * BS]).await;
    assert_eq!(sense_of(&r), (key::ILLEGAL_REQUEST, 0x24, 0x00));
    let r = run(&t2, &n2, &wa16(0, 1025, 0, 0), &big).await;
    assert_eq!(r.status, status::GOOD, "within 1 MiB");
    // beyond the end, even with zero blocks
    for cdb in [
        wa16(BLOCKS - 1, 2, 0, 0),
        wa16(BLOCKS + 1, 0, 0, 0),
        wa16(u64::MAX, 1, 0, 0),
    ] {
        let r = run(&t, &n, &cdb, &one).await;
        assert_eq!(sense_of(&r), (key::ILLEGAL_REQUEST, 0x21, 0x00));
    }
    // less Data-Out than the CDB asks for: nothing is written
    let r = run(&t, &n, &wa16(0, 2, 0, 0), &one).await;
    assert_eq!(r.status, status::CHECK_CONDITION);
    let r = run(&t, &n, &rw10(0x28, 0, 1), &[]).await;
    assert!(r.data_in.iter().all(|&b| b == 0));
}

#[tokio::test]
async fn without_atomic_writes_the_command_is_unknown() {
    let t = target();
    let n = ready(&t, "01", 1).await;
    let r = run(&t, &n, &wa16(0, 1, 0, 0), &vec![1u8; BS]).await;
    assert_eq!(sense_of(&r), (key::ILLEGAL_REQUEST, 0x20, 0x00));
    let r = run(&t, &n, &block_limits_cdb(), &[]).await;
    assert!(r.data_in[44..64].iter().all(|&b| b == 0));
    assert_eq!(support_of(&t, &n, 0x9c).await, 0x01);
}
