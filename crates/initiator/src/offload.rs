//! Copy offload requests an initiator sends (what ESXi's VAAI full copy puts on
//! the wire): EXTENDED COPY (LID1) with one identification CSCD descriptor per
//! LU, named by its NAA, and block-to-block segment descriptors. Used by the
//! tests and benches that drive freesan's copy engine.

/// EXTENDED COPY (LID1, list id `list`) from the LU named `src` to the one named
/// `dst`, both of `block_bytes` blocks, one block-to-block segment per (source
/// LBA, destination LBA, blocks): (CDB, parameter list).
pub fn extended_copy(
    src: [u8; 16],
    dst: [u8; 16],
    block_bytes: u32,
    segments: &[(u64, u64, u16)],
    list: u8,
) -> (Vec<u8>, Vec<u8>) {
    let mut cscds = Vec::new();
    for naa in [src, dst] {
        let mut d = [0u8; 32];
        d[0] = 0xe4; // identification descriptor
        d[4] = 0x01; // code set: binary
        d[5] = 0x03; // designator type: NAA
        d[7] = 16;
        d[8..24].copy_from_slice(&naa);
        d[29..32].copy_from_slice(&block_bytes.to_be_bytes()[1..]);
        cscds.extend_from_slice(&d);
    }
    let mut segs = Vec::new();
    for &(from, to, blocks) in segments {
        let mut d = [0u8; 28];
        d[0] = 0x02; // block device to block device
        d[3] = 24;
        d[6..8].copy_from_slice(&1u16.to_be_bytes()); // destination: CSCD 1
        d[10..12].copy_from_slice(&blocks.to_be_bytes());
        d[12..20].copy_from_slice(&from.to_be_bytes());
        d[20..28].copy_from_slice(&to.to_be_bytes());
        segs.extend_from_slice(&d);
    }
    let mut p = vec![0u8; 16];
    p[0] = list;
    p[2..4].copy_from_slice(&(cscds.len() as u16).to_be_bytes());
    p[8..12].copy_from_slice(&(segs.len() as u32).to_be_bytes());
    p.extend_from_slice(&cscds);
    p.extend_from_slice(&segs);
    let mut c = vec![0u8; 16];
    c[0] = 0x83;
    c[10..14].copy_from_slice(&(p.len() as u32).to_be_bytes());
    (c, p)
}
