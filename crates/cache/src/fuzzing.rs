//! Entry points for the fuzz target of what disks hold (`fuzz/fuzz_targets/
//! ondisk_decode.rs`, feature `fuzzing`): a cache device's superblock copy and
//! its table pages, decoded as opening the cache decodes them. Each checks
//! what the decoder promises and panics when it breaks.

use crate::ssd::{decode_page, encode_page, Superblock, PAGE_BYTES, RECORDS_PER_PAGE};

/// One superblock copy: decoding never panics, and what decodes survives an
/// encode/decode round trip.
pub fn superblock_copy(buf: &[u8]) {
    if let Some(sb) = Superblock::decode(buf) {
        assert_eq!(Superblock::decode(&sb.encode()), Some(sb));
    }
}

/// `buf` (at least a copy long) with its checksum set to match.
pub fn superblock_repaired(buf: &[u8]) -> Vec<u8> {
    let mut v = buf.to_vec();
    if v.len() >= 4096 {
        let crc = crc32c::crc32c(&v[..4092]);
        v[4092..4096].copy_from_slice(&crc.to_le_bytes());
    }
    v
}

/// One table page read as page `page_no`: decoding never panics, a page
/// decodes to a whole page of records, and those encode to the same bytes.
pub fn table_page(page_no: u32, buf: &[u8]) {
    if let Some((seq, recs)) = decode_page(page_no, buf) {
        assert_eq!(recs.len(), RECORDS_PER_PAGE);
        let again = encode_page(page_no, seq, &recs);
        // header, records and version: the whole page
        assert_eq!(&again[..], &buf[..PAGE_BYTES as usize]);
        assert_eq!(decode_page(page_no, &again), Some((seq, recs)));
    }
}

/// `buf` (at least a page long) with its checksum set to match.
pub fn table_page_repaired(buf: &[u8]) -> Vec<u8> {
    let mut v = buf.to_vec();
    if v.len() >= PAGE_BYTES as usize {
        let crc = crc32c::crc32c(&v[8..]) ^ crc32c::crc32c(&v[0..4]);
        v[4..8].copy_from_slice(&crc.to_le_bytes());
    }
    v
}
