//! Entry points for the fuzz target of what disks hold (`fuzz/fuzz_targets/
//! ondisk_decode.rs`, feature `fuzzing`): a member's superblock slot and its
//! journal ring, decoded as assemble decodes them. Each checks what the
//! decoder promises and panics when it breaks, which the fuzzer reports.

use crate::journal;
use crate::superblock;

/// One superblock slot image: decoding never panics; what decodes is valid
/// and survives an encode/decode round trip.
pub fn superblock_slot(buf: &[u8]) {
    if let Ok(sb) = superblock::decode(buf) {
        assert!(sb.validate().is_ok(), "decoded but invalid: {sb:?}");
        let img =
            superblock::encode(&sb, sb.block_size_bytes).expect("a decoded superblock encodes");
        assert_eq!(superblock::decode(&img).as_ref(), Ok(&sb));
    }
}

/// The header block of a journal device: parsing never panics, and what
/// parses is written back by `jdev::header` as the same names.
pub fn journal_device_header(buf: &[u8]) {
    if let Some((pool, dev)) = crate::jdev::parse_header(buf) {
        let again = crate::jdev::header(&pool, &dev, 512);
        assert_eq!(crate::jdev::parse_header(&again), Some((pool, dev)));
    }
}

/// `buf` with a journal device header's checksum set to match.
pub fn journal_device_header_repaired(buf: &[u8]) -> Vec<u8> {
    let mut v = buf.to_vec();
    if v.len() >= 92 {
        let crc = crc32c::crc32c(&v[..88]);
        v[88..92].copy_from_slice(&crc.to_le_bytes());
    }
    v
}

/// `buf` with the slot header's checksums set to match, so that the payload
/// (JSON) and the values check are reached.
pub fn superblock_repaired(buf: &[u8]) -> Vec<u8> {
    let mut v = buf.to_vec();
    if v.len() >= 32 {
        let len = u32::from_le_bytes([v[12], v[13], v[14], v[15]]) as usize;
        if let Some(payload) = v.get(32..32usize.saturating_add(len)) {
            let crc = crc32c::crc32c(payload);
            v[16..20].copy_from_slice(&crc.to_le_bytes());
        }
        let hcrc = crc32c::crc32c(&v[0..20]);
        v[20..24].copy_from_slice(&hcrc.to_le_bytes());
    }
    v
}

/// A journal ring image of `bs`-byte blocks of the pool `tag`, records at
/// most `max_blocks` long: scanning never panics, every record found lies
/// inside the ring, within the bounds, after the one before it, and decodes
/// again to itself once re-encoded.
pub fn journal_ring(ring: &[u8], bs: usize, tag: u64, max_blocks: u64) {
    let blocks = (ring.len() / bs) as u64;
    let mut end = 0;
    let whole = journal::scan(ring, bs, tag, max_blocks);
    // assemble's scanner, fed the ring piece by piece, finds the same records
    let piece = bs * (1 + ring.len() % 7);
    let mut scanner = journal::Scanner::new(bs, tag, max_blocks, 0);
    for p in ring[..blocks as usize * bs].chunks(piece) {
        scanner.push(p);
    }
    // (the scanner keeps what is above its checkpoint, 0 here: a record of
    // sequence 0, which no pool writes, is left out of both)
    let key = |v: &[journal::Record]| {
        v.iter()
            .filter(|r| r.seq > 0)
            .map(|r| (r.seq, r.at, r.blocks))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        key(&scanner.finish()),
        key(&whole),
        "piece by piece ({piece} bytes)"
    );
    for r in whole {
        assert!(
            r.at >= end && r.at + r.blocks <= blocks,
            "record outside the ring or overlapping"
        );
        assert!(r.blocks <= max_blocks && r.seq <= journal::SEQ_MAX);
        end = r.at + r.blocks;
        let payloads: Vec<&[u8]> = r.payloads.iter().map(|p| p.as_slice()).collect();
        let img = journal::encode(r.seq, tag, r.link, &r.entries, &payloads, bs);
        assert_eq!(img.len() as u64, r.blocks * bs as u64);
        let (again, len) =
            journal::decode(&img, bs, tag, max_blocks).expect("re-encoded record decodes");
        assert_eq!(len, r.blocks);
        assert_eq!((again.seq, again.link), (r.seq, r.link));
        assert_eq!(again.entries, r.entries);
        assert_eq!(again.payloads, r.payloads);
    }
}

/// `ring` with every block that starts with the record magic given the pool
/// `tag` and, where its length fits, a matching checksum: the entries and
/// payloads are reached without the fuzzer forging CRC-32Cs.
pub fn journal_repaired(ring: &[u8], bs: usize, tag: u64) -> Vec<u8> {
    let mut v = ring.to_vec();
    let blocks = v.len() / bs;
    // from the end: a header inside a longer record is repaired before the
    // checksum of the record around it is taken
    for b in (0..blocks).rev() {
        let at = b * bs;
        if v.len() < at + 48 || &v[at..at + 8] != b"FSRJRNL1" {
            continue;
        }
        v[at + 8..at + 16].copy_from_slice(&tag.to_le_bytes());
        let total = u32::from_le_bytes([v[at + 32], v[at + 33], v[at + 34], v[at + 35]]) as usize;
        let Some(end) = total.checked_mul(bs).and_then(|n| n.checked_add(at)) else {
            continue;
        };
        if total == 0 || end > v.len() {
            continue;
        }
        v[at + 36..at + 40].fill(0);
        let crc = crc32c::crc32c(&v[at..end]);
        v[at + 36..at + 40].copy_from_slice(&crc.to_le_bytes());
    }
    v
}

/// The bound a pool of `members` members with chunks of `cb` blocks puts on
/// a record ([`journal::max_record_blocks`]).
pub fn max_record_blocks(members: usize, cb: u64, bs: usize) -> u64 {
    journal::max_record_blocks(members, cb, bs)
}

/// A valid slot image (RAID 5 of 3, 512-byte blocks) for the fuzz target to
/// edit: random bytes rarely make JSON a superblock, edits of one do.
pub fn superblock_sample() -> Vec<u8> {
    let sb = superblock::Superblock {
        spares: vec!["ef".repeat(16)],
        volume_blocks: Some(2500),
        ..superblock::sample_superblock()
    };
    superblock::encode(&sb, 512).expect("the sample encodes")
}

/// A valid ring of `bs`-byte blocks for the pool `tag` for the fuzz target to
/// edit: a whole update, a data-first record and the record completing it,
/// with a discard, behind a block of zeroes.
pub fn journal_sample(bs: usize, tag: u64) -> Vec<u8> {
    let e = |position: u16, discard: bool, member_lba: u64, blocks: u32| journal::Entry {
        position,
        discard,
        member_lba,
        blocks,
    };
    let one = vec![0x5au8; bs];
    let two = vec![0xa5u8; 2 * bs];
    let mut ring = vec![0u8; bs];
    let whole = [e(0, false, 8, 1), e(2, false, 8, 1)];
    ring.extend(journal::encode(7, tag, 0, &whole, &[&one, &one], bs));
    let df = [e(1, false, 16, 2)];
    ring.extend(journal::encode(
        8,
        tag,
        journal::LINK_DATA_FIRST,
        &df,
        &[&two],
        bs,
    ));
    let done = [e(1, false, 16, 2), e(0, false, 16, 2), e(2, true, 0, 64)];
    ring.extend(journal::encode(
        9,
        tag,
        journal::LINK_COMPLETES | 8,
        &done,
        &[&two, &two, &[]],
        bs,
    ));
    ring
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The samples the fuzz target edits are what they stand for: a
    /// superblock that decodes, a ring of three records.
    #[test]
    fn the_samples_decode() {
        let img = superblock_sample();
        assert!(superblock::decode(&img).is_ok());
        superblock_slot(&img);
        for bs in [512, 1024] {
            let ring = journal_sample(bs, 7);
            let max = max_record_blocks(3, 128, bs);
            let found = journal::scan(&ring, bs, 7, max);
            assert_eq!(found.iter().map(|r| r.seq).collect::<Vec<_>>(), [7, 8, 9]);
            journal_ring(&ring, bs, 7, max);
            // repairing a valid ring changes nothing
            assert_eq!(journal_repaired(&ring, bs, 7), ring);
        }
    }
}
