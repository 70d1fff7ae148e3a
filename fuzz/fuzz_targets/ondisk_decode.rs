//! Arbitrary bytes read back from a disk, decoded as freesan decodes them at
//! start: a RAID member's superblock slot and journal ring, a journal device's
//! header, a cache device's superblock copy and table page. Nothing may panic
//! or take time out of proportion to the input, and what decodes must survive
//! a round trip (the checks are in `raid::fuzzing` and `cache::fuzzing`).
//!
//! The first byte picks the structure; every input is decoded as is and with
//! its checksums repaired, so that the fuzzer reaches the bodies without
//! forging CRC-32Cs. Two more picks edit a valid superblock and a valid ring
//! byte by byte, so that a short run (the test command's) reaches the JSON
//! values check and the records' entries, which random bytes seldom do.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&pick, rest)) = data.split_first() else {
        return;
    };
    match pick % 6 {
        0 => {
            raid::fuzzing::superblock_slot(rest);
            raid::fuzzing::superblock_slot(&raid::fuzzing::superblock_repaired(rest));
            raid::fuzzing::journal_device_header(rest);
            raid::fuzzing::journal_device_header(&raid::fuzzing::journal_device_header_repaired(rest));
        }
        1 => {
            // block size, pool shape (members, chunk) and tag from the input
            let Some((shape, ring)) = rest.split_first_chunk::<4>() else {
                return;
            };
            let bs = 512usize << (shape[0] % 4);
            let members = 2 + (shape[1] % 16) as usize;
            let cb = 1u64 << (shape[2] % 8);
            let tag = u64::from(shape[3]).wrapping_mul(0x9e37_79b9_7f4a_7c15);
            let max = raid::fuzzing::max_record_blocks(members, cb, bs);
            raid::fuzzing::journal_ring(ring, bs, tag, max);
            raid::fuzzing::journal_ring(&raid::fuzzing::journal_repaired(ring, bs, tag), bs, tag, max);
        }
        2 => {
            let copy = &rest[..rest.len().min(4096)];
            cache::fuzzing::superblock_copy(copy);
            cache::fuzzing::superblock_copy(&cache::fuzzing::superblock_repaired(copy));
        }
        4 => {
            // a valid superblock, edited
            let sb = edited(raid::fuzzing::superblock_sample(), rest);
            raid::fuzzing::superblock_slot(&sb);
            raid::fuzzing::superblock_slot(&raid::fuzzing::superblock_repaired(&sb));
        }
        5 => {
            // a valid ring, edited
            let Some((&b, edits)) = rest.split_first() else {
                return;
            };
            let bs = 512usize << (b % 2);
            let tag = 0x5eed;
            let max = raid::fuzzing::max_record_blocks(3, 128, bs);
            let ring = edited(raid::fuzzing::journal_sample(bs, tag), edits);
            raid::fuzzing::journal_ring(&ring, bs, tag, max);
            raid::fuzzing::journal_ring(&raid::fuzzing::journal_repaired(&ring, bs, tag), bs, tag, max);
        }
        _ => {
            let Some((no, page)) = rest.split_first_chunk::<4>() else {
                return;
            };
            let page = &page[..page.len().min(4096)];
            let no = u32::from_le_bytes(*no);
            cache::fuzzing::table_page(no, page);
            cache::fuzzing::table_page(no, &cache::fuzzing::table_page_repaired(page));
        }
    }
});

/// `image` with the edits of `edits` applied: triples of a little-endian
/// `u16` offset (taken modulo the length) and the byte to write there.
fn edited(mut image: Vec<u8>, edits: &[u8]) -> Vec<u8> {
    let len = image.len();
    for e in edits.chunks_exact(3) {
        let at = u16::from_le_bytes([e[0], e[1]]) as usize % len;
        image[at] = e[2];
    }
    image
}
