//! Copy offload requests an initiator sends: EXTENDED COPY (LID1) with one
//! identification CSCD descriptor per LU, named by its NAA, and block-to-block
//! segment descriptors (what ESXi's VAAI full copy puts on the wire); and
//! Windows' ODX token copy (POPULATE TOKEN, RECEIVE ROD TOKEN INFORMATION,
//! WRITE USING TOKEN). Used by the tests and benches that drive freesan's copy
//! engine.

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

/// POPULATE TOKEN (0x10) or WRITE USING TOKEN (0x11) with list id `list` and a
/// parameter list of `len` bytes.
pub fn token_cdb(sa: u8, list: u32, len: usize) -> Vec<u8> {
    let mut c = vec![0u8; 16];
    c[0] = 0x83;
    c[1] = sa;
    c[6..10].copy_from_slice(&list.to_be_bytes());
    c[10..14].copy_from_slice(&(len as u32).to_be_bytes());
    c
}

/// One block device range descriptor.
pub fn range(lba: u64, blocks: u32) -> Vec<u8> {
    let mut d = vec![0u8; 16];
    d[0..8].copy_from_slice(&lba.to_be_bytes());
    d[8..12].copy_from_slice(&blocks.to_be_bytes());
    d
}

/// POPULATE TOKEN of `lba..lba + blocks`: (CDB, parameter list).
pub fn populate_token(lba: u64, blocks: u32, list: u32) -> (Vec<u8>, Vec<u8>) {
    let mut p = vec![0u8; 16];
    p[0..2].copy_from_slice(&(14u16 + 16).to_be_bytes());
    p[15] = 16;
    p.extend_from_slice(&range(lba, blocks));
    (token_cdb(0x10, list, p.len()), p)
}

/// RECEIVE ROD TOKEN INFORMATION of list id `list`.
pub fn receive_rod_token_information(list: u32) -> Vec<u8> {
    let mut c = vec![0u8; 16];
    c[0] = 0x84;
    c[1] = 0x07;
    c[2..6].copy_from_slice(&list.to_be_bytes());
    c[10..14].copy_from_slice(&1024u32.to_be_bytes());
    c
}

/// The ROD token in a RECEIVE ROD TOKEN INFORMATION answer.
pub fn token_of(data_in: &[u8]) -> Vec<u8> {
    let at = 32 + data_in[13] as usize + 6;
    data_in[at..at + 512].to_vec()
}

/// WRITE USING TOKEN of `token` onto `lba..lba + blocks`: (CDB, parameter list).
pub fn write_using_token(token: &[u8], lba: u64, blocks: u32, list: u32) -> (Vec<u8>, Vec<u8>) {
    let mut p = vec![0u8; 536];
    p[0..2].copy_from_slice(&(534u16 + 16).to_be_bytes());
    p[16..528].copy_from_slice(token);
    p[535] = 16;
    p.extend_from_slice(&range(lba, blocks));
    (token_cdb(0x11, list, p.len()), p)
}
