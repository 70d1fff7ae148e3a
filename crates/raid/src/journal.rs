//! The stripe journal that closes the RAID 5/6 write hole.
//!
//! Every stripe update of a parity pool (data and parity member writes, or a
//! whole-stripe discard) is first written as one record, with FUA, to the journal
//! region of `redundancy + 1` members; only then are the members updated in place.
//! After a crash, `assemble` replays every record newer than the persisted
//! checkpoint onto the members present, in sequence order, which makes every
//! interrupted stripe consistent again (and re-applies acknowledged writes a
//! volatile member cache lost). See docs/0002-raid.md.
//!
//! Record format (little endian, starts on a block boundary of the ring):
//!
//! ```text
//! 0   8  magic "FSRJRNL1"
//! 8   8  pool tag (hash of the pool uuid)
//! 16  8  sequence number
//! 24  4  entry count
//! 28  4  header blocks
//! 32  4  total blocks (header + payload)
//! 36  4  crc32c of the whole record with this field zeroed
//! 40  8  link: 0 for a record that is a whole stripe update; `LINK_DATA_FIRST`
//!        for a data-first record (the new data of an update acknowledged
//!        before its parity was computed: replayed by recomputing the parity,
//!        unless a record completes it); `LINK_COMPLETES | seq` for the whole
//!        update (data and parity) completing the data-first record `seq`
//! 48  .. entries, 16 bytes each: position u16, kind u8 (0 write, 1 discard),
//!        pad u8, member lba u64 (data-area relative), blocks u32
//! then   payload: the data of every write entry, in entry order, from the next
//!        block boundary
//! ```
//!
//! The ring is shared by all members: a record occupies the same ring offsets on
//! each member that holds a copy. Space is reused only after a checkpoint (all
//! members flushed, checkpoint sequence persisted in the superblocks) covers every
//! record in it, so a record newer than the checkpoint is never overwritten.

use std::collections::{BTreeSet, VecDeque};

const MAGIC: &[u8; 8] = b"FSRJRNL1";
const HEADER_FIXED: usize = 48;
const ENTRY_BYTES: usize = 16;
/// A checkpoint taken to make room frees at least this fraction of the ring.
pub(crate) const RECLAIM_PARTS: u64 = 4;
/// Most entries one record may hold.
pub(crate) const MAX_ENTRIES: usize = 1024;
/// Header link of a data-first record (see the format above).
pub(crate) const LINK_DATA_FIRST: u64 = 1;
/// Header link bit of a record completing a data-first record (whose sequence
/// number is the rest of the link).
pub(crate) const LINK_COMPLETES: u64 = 1 << 63;

/// One member operation inside a record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Entry {
    pub position: u16,
    pub discard: bool,
    pub member_lba: u64,
    pub blocks: u32,
}

/// A decoded record.
#[derive(Debug, Clone)]
pub(crate) struct Record {
    pub seq: u64,
    /// 0, `LINK_DATA_FIRST`, or `LINK_COMPLETES | seq` (see the format above).
    pub link: u64,
    /// First ring block of the record (set by `scan`).
    pub at: u64,
    /// Blocks the record occupies.
    pub blocks: u64,
    pub entries: Vec<Entry>,
    /// Payload of each entry (empty for discards).
    pub payloads: Vec<Vec<u8>>,
}

impl Record {
    /// A data-first record: the data of an update whose parity comes later.
    pub fn is_data_first(&self) -> bool {
        self.link == LINK_DATA_FIRST
    }

    /// The data-first record this one completes, if any.
    pub fn completes(&self) -> Option<u64> {
        (self.link & LINK_COMPLETES != 0).then_some(self.link & !LINK_COMPLETES)
    }
}

fn header_blocks(n: usize, bs: usize) -> usize {
    (HEADER_FIXED + n * ENTRY_BYTES).div_ceil(bs)
}

/// Blocks a record with these entries occupies.
pub(crate) fn record_blocks(entries: &[Entry], bs: usize) -> u64 {
    header_blocks(entries.len(), bs) as u64
        + entries
            .iter()
            .filter(|e| !e.discard)
            .map(|e| e.blocks as u64)
            .sum::<u64>()
}

/// Encodes a record; `payloads[i]` is the data of `entries[i]` (ignored for discards).
pub(crate) fn encode(
    seq: u64,
    pool_tag: u64,
    link: u64,
    entries: &[Entry],
    payloads: &[&[u8]],
    bs: usize,
) -> Vec<u8> {
    let hb = header_blocks(entries.len(), bs);
    let total = record_blocks(entries, bs) as usize;
    let mut out = vec![0u8; total * bs];
    out[0..8].copy_from_slice(MAGIC);
    out[8..16].copy_from_slice(&pool_tag.to_le_bytes());
    out[16..24].copy_from_slice(&seq.to_le_bytes());
    out[24..28].copy_from_slice(&(entries.len() as u32).to_le_bytes());
    out[28..32].copy_from_slice(&(hb as u32).to_le_bytes());
    out[32..36].copy_from_slice(&(total as u32).to_le_bytes());
    out[40..48].copy_from_slice(&link.to_le_bytes());
    let mut at = HEADER_FIXED;
    let mut pay = hb * bs;
    for (e, p) in entries.iter().zip(payloads) {
        out[at..at + 2].copy_from_slice(&e.position.to_le_bytes());
        out[at + 2] = e.discard as u8;
        out[at + 4..at + 12].copy_from_slice(&e.member_lba.to_le_bytes());
        out[at + 12..at + 16].copy_from_slice(&e.blocks.to_le_bytes());
        at += ENTRY_BYTES;
        if !e.discard {
            out[pay..pay + p.len()].copy_from_slice(p);
            pay += e.blocks as usize * bs;
        }
    }
    let crc = crc32c::crc32c(&out);
    out[36..40].copy_from_slice(&crc.to_le_bytes());
    out
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

/// Most blocks a record of a pool of `members` members with chunks of `cb`
/// blocks can occupy: the most entries, and a chunk's worth of data for every
/// member (a record is one stripe's update). A ring must hold two of them (a
/// pool is refused otherwise), and a scan takes nothing larger for a record.
pub(crate) fn max_record_blocks(members: usize, cb: u64, bs: usize) -> u64 {
    header_blocks(MAX_ENTRIES, bs) as u64 + members as u64 * cb
}

/// The smallest ring a parity pool of `members` members with chunks of `cb`
/// blocks may have: two whole-stripe records (a chunk for every member). A
/// record is written whole into the ring, and a ring holding fewer could not
/// take the next record without overwriting the one before it.
pub(crate) fn min_ring_blocks(members: usize, cb: u64, bs: usize) -> u64 {
    2 * (header_blocks(members, bs) as u64 + members as u64 * cb)
}

/// Sequence numbers a record may carry: the pool hands them out one at a time
/// from 1, so one past half of 2^64 is a damaged or forged record, whose
/// successor would wrap.
pub(crate) const SEQ_MAX: u64 = u64::MAX / 2;

/// Decodes the record at the start of `buf`, returning it and its length in blocks.
/// Anything malformed (including a record of another pool, one with a sequence
/// number past [`SEQ_MAX`], and one longer than `max_blocks`) is `None`.
pub(crate) fn decode(
    buf: &[u8],
    bs: usize,
    pool_tag: u64,
    max_blocks: u64,
) -> Option<(Record, u64)> {
    if buf.get(0..8)? != MAGIC || u64_at(buf, 8)? != pool_tag {
        return None;
    }
    let seq = u64_at(buf, 16)?;
    let link = u64_at(buf, 40)?;
    if seq > SEQ_MAX || (link != 0 && link != LINK_DATA_FIRST && link & LINK_COMPLETES == 0) {
        return None;
    }
    let n = u32_at(buf, 24)? as usize;
    let hb = u32_at(buf, 28)? as usize;
    let total = u32_at(buf, 32)? as usize;
    if n > MAX_ENTRIES || hb != header_blocks(n, bs) || total < hb || total as u64 > max_blocks {
        return None;
    }
    let rec = buf.get(0..total.checked_mul(bs)?)?;
    // the checksum is of the record with its own field zeroed: taken in three
    // pieces, not over a copy (a scan tries every block of the ring)
    let crc = crc32c::crc32c_append(
        crc32c::crc32c_append(crc32c::crc32c(&rec[..36]), &[0; 4]),
        &rec[40..],
    );
    if crc != u32_at(rec, 36)? {
        return None;
    }
    let mut entries = Vec::with_capacity(n);
    let mut payloads = Vec::with_capacity(n);
    let mut pay = hb * bs;
    for i in 0..n {
        let at = HEADER_FIXED + i * ENTRY_BYTES;
        let position = u16::from_le_bytes(rec.get(at..at + 2)?.try_into().ok()?);
        let discard = match *rec.get(at + 2)? {
            0 => false,
            1 => true,
            _ => return None,
        };
        let member_lba = u64_at(rec, at + 4)?;
        let blocks = u32_at(rec, at + 12)?;
        if discard {
            payloads.push(Vec::new());
        } else {
            let len = (blocks as usize).checked_mul(bs)?;
            payloads.push(rec.get(pay..pay.checked_add(len)?)?.to_vec());
            pay += len;
        }
        entries.push(Entry {
            position,
            discard,
            member_lba,
            blocks,
        });
    }
    if pay != total * bs {
        return None;
    }
    Some((
        Record {
            seq,
            link,
            at: 0,
            blocks: total as u64,
            entries,
            payloads,
        },
        total as u64,
    ))
}

/// Every valid record of `pool_tag` in a journal region image, none longer
/// than `max_blocks` ([`max_record_blocks`] of the pool): a damaged ring whose
/// every block starts a header claiming the rest of the ring would otherwise
/// cost a checksum of the whole remainder at every block. The reference for
/// [`Scanner`], which assemble uses (tests and the fuzz target compare them).
#[cfg(any(test, feature = "fuzzing"))]
pub(crate) fn scan(buf: &[u8], bs: usize, pool_tag: u64, max_blocks: u64) -> Vec<Record> {
    let mut out = Vec::new();
    let blocks = buf.len() / bs;
    let mut b = 0usize;
    while b < blocks {
        match decode(&buf[b * bs..], bs, pool_tag, max_blocks) {
            Some((mut rec, len)) => {
                rec.at = b as u64;
                out.push(rec);
                b += len.max(1) as usize;
            }
            None => b += 1,
        }
    }
    out
}

/// [`scan`] over a ring read piece by piece: the records found are the same
/// as a scan of the whole image (those above `keep_above`: a wrapped ring is
/// full of records a checkpoint already covers, which are dropped as they
/// are found), and of the ring itself no more than the largest record and
/// the last piece are held at once.
pub(crate) struct Scanner {
    bs: usize,
    pool_tag: u64,
    max_blocks: u64,
    keep_above: u64,
    /// Bytes from ring block `base` on.
    buf: Vec<u8>,
    base: u64,
    /// The next block of `buf` to try.
    cursor: usize,
    out: Vec<Record>,
}

impl Scanner {
    pub(crate) fn new(bs: usize, pool_tag: u64, max_blocks: u64, keep_above: u64) -> Scanner {
        Scanner {
            bs,
            pool_tag,
            max_blocks,
            keep_above,
            buf: Vec::new(),
            base: 0,
            cursor: 0,
            out: Vec::new(),
        }
    }

    /// The next piece of the ring (whole blocks).
    pub(crate) fn push(&mut self, piece: &[u8]) {
        self.buf.extend_from_slice(piece);
        self.drain(false);
    }

    /// Every record, once the whole ring was pushed.
    pub(crate) fn finish(mut self) -> Vec<Record> {
        self.drain(true);
        self.out
    }

    /// Tries every block that is decided: one with a whole record's worth
    /// of blocks behind it (a record is at most `max_blocks`, and a header
    /// claiming more is no record), or every block at the end.
    fn drain(&mut self, end: bool) {
        let blocks = self.buf.len() / self.bs;
        while self.cursor < blocks
            && (end || (self.cursor as u64).saturating_add(self.max_blocks) <= blocks as u64)
        {
            let at = self.cursor * self.bs;
            match decode(&self.buf[at..], self.bs, self.pool_tag, self.max_blocks) {
                Some((mut rec, len)) => {
                    rec.at = self.base + self.cursor as u64;
                    if rec.seq > self.keep_above {
                        self.out.push(rec);
                    }
                    self.cursor += len.max(1) as usize;
                }
                None => self.cursor += 1,
            }
        }
        let done = self.cursor.min(blocks);
        self.buf.drain(..done * self.bs);
        self.base += done as u64;
        self.cursor -= done;
    }
}

/// Allocation state of the ring (held under an async mutex).
#[derive(Debug, Default)]
pub(crate) struct Alloc {
    /// Next free ring block.
    pub head_blocks: u64,
    /// Sequence number of the next record.
    pub next_seq: u64,
    /// Records not yet covered by a checkpoint: (seq, start block, blocks).
    pub live: VecDeque<(u64, u64, u64)>,
}

impl Alloc {
    /// Where a record of `len` blocks would go, and, when it would overwrite a live
    /// record, the sequence a checkpoint must cover first: the newest live record
    /// in the next `len.max(ring_blocks / RECLAIM_PARTS)` blocks, so that one
    /// checkpoint frees a good part of the ring rather than one record's room
    /// (one checkpoint per record once the ring had wrapped: every member flushed
    /// and every superblock written for each small write).
    pub fn place(&self, len: u64, ring_blocks: u64) -> (u64, Option<u64>) {
        let start = if self.head_blocks + len > ring_blocks {
            0
        } else {
            self.head_blocks
        };
        let end = start + len;
        let overlaps = |s0: u64, e0: u64| {
            self.live
                .iter()
                .filter(move |(_, s, l)| *s < e0 && s0 < s + l)
                .map(|(seq, _, _)| *seq)
        };
        if overlaps(start, end).next().is_none() {
            return (start, None);
        }
        let reclaim_end = (start + len.max(ring_blocks / RECLAIM_PARTS)).min(ring_blocks);
        (start, overlaps(start, reclaim_end.max(end)).max())
    }
}

/// Records whose in-place writes are still running.
#[derive(Debug, Default)]
pub(crate) struct InFlight {
    pub seqs: BTreeSet<u64>,
    /// Stripe -> newest record for it not yet covered by a checkpoint.
    pub stripes: std::collections::HashMap<u64, u64>,
    /// Ring writes still running, by the first sequence number of their batch
    /// (a spare copy may outlive the batch's acknowledgement).
    pub writing: std::collections::BTreeMap<u64, usize>,
}

/// The journal ring of a parity pool.
pub(crate) struct Journal {
    /// Ring size in blocks.
    pub ring_blocks: u64,
    /// Absolute member lba of ring block 0.
    pub offset_blocks: u64,
    pub alloc: tokio::sync::Mutex<Alloc>,
    pub inflight: parking_lot::Mutex<InFlight>,
    pub done: tokio::sync::Notify,
    /// Records waiting for (or in) a group commit (see `commit.rs`).
    pub group: parking_lot::Mutex<crate::commit::Group>,
    /// Signalled when a group commit ends.
    pub group_done: tokio::sync::Notify,
}

impl Journal {
    /// An empty ring whose next record gets `next_seq`.
    pub fn new(offset_blocks: u64, ring_blocks: u64, next_seq: u64) -> Self {
        Journal {
            ring_blocks,
            offset_blocks,
            alloc: tokio::sync::Mutex::new(Alloc {
                head_blocks: 0,
                next_seq,
                live: VecDeque::new(),
            }),
            inflight: parking_lot::Mutex::new(InFlight::default()),
            done: tokio::sync::Notify::new(),
            group: parking_lot::Mutex::new(Default::default()),
            group_done: tokio::sync::Notify::new(),
        }
    }

    /// Remembers that record `seq` updates stripe `s` (until a checkpoint covers it).
    pub fn note_stripe(&self, s: u64, seq: u64) {
        let mut f = self.inflight.lock();
        let e = f.stripes.entry(s).or_insert(seq);
        *e = (*e).max(seq);
    }

    /// True while a record for stripe `s` may still be replayed after a crash.
    pub fn has_live(&self, s: u64) -> bool {
        self.inflight.lock().stripes.contains_key(&s)
    }

    /// Forgets stripes whose records are all covered by checkpoint `upto`.
    pub fn forget_upto(&self, upto: u64) {
        self.inflight.lock().stripes.retain(|_, seq| *seq > upto);
    }

    /// Marks a record's in-place writes finished.
    pub fn complete(&self, seq: u64) {
        self.inflight.lock().seqs.remove(&seq);
        self.done.notify_waiters();
    }

    /// A ring write of the batch starting at record `first` begins.
    pub fn writing_begin(&self, first: u64) {
        *self.inflight.lock().writing.entry(first).or_insert(0) += 1;
    }

    /// A ring write of the batch starting at record `first` ended.
    pub fn writing_end(&self, first: u64) {
        {
            let mut f = self.inflight.lock();
            if let Some(n) = f.writing.get_mut(&first) {
                *n -= 1;
                if *n == 0 {
                    f.writing.remove(&first);
                }
            }
        }
        self.done.notify_waiters();
    }

    /// Waits until no record with sequence `<= upto` is in flight, and no
    /// ring write of a batch with such a record still runs.
    pub async fn wait_done(&self, upto: u64) {
        loop {
            let n = self.done.notified();
            tokio::pin!(n);
            n.as_mut().enable();
            {
                let f = self.inflight.lock();
                if f.seqs.range(..=upto).next().is_none()
                    && f.writing.range(..=upto).next().is_none()
                {
                    return;
                }
            }
            n.await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_checkpoint_to_make_room_frees_a_quarter_of_the_ring() {
        // a full ring of 1-block records; the next one wraps to block 0
        let ring = 64;
        let mut a = Alloc::default();
        for seq in 0..ring {
            a.live.push_back((seq, seq, 1));
        }
        a.head_blocks = ring;
        let (start, blocking) = a.place(1, ring);
        assert_eq!(start, 0);
        // not only record 0: the checkpoint covers the first quarter
        assert_eq!(blocking, Some(ring / 4 - 1));
        while a.live.front().is_some_and(|r| r.0 < ring / 4) {
            a.live.pop_front();
        }
        a.head_blocks = 0;
        for i in 0..ring / 4 {
            let (s, b) = a.place(1, ring);
            assert_eq!((s, b), (i, None), "record {i} fits without a checkpoint");
            a.head_blocks = s + 1;
        }
        assert!(a.place(1, ring).1.is_some());
    }

    /// Random rings of records, garbage, torn copies and headers claiming
    /// too much, scanned whole and piece by piece in pieces of every size:
    /// the same records at the same places.
    #[test]
    fn a_scan_piece_by_piece_finds_what_a_whole_scan_finds() {
        use rand::{Rng, SeedableRng};
        let bs = 512;
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let mut records = 0;
        for round in 0..200 {
            let max = rng.gen_range(2..12u64);
            let mut ring = Vec::new();
            let mut seq = 1;
            while ring.len() < 64 * bs {
                match rng.gen_range(0..5) {
                    0 => ring.extend((0..bs).map(|_| rng.gen::<u8>())),
                    1 => ring.extend(std::iter::repeat_n(0u8, bs)),
                    _ => {
                        let n = rng.gen_range(1..4usize);
                        let entries: Vec<Entry> = (0..n)
                            .map(|i| Entry {
                                position: i as u16,
                                discard: false,
                                member_lba: rng.gen_range(0..100),
                                blocks: rng.gen_range(1..4),
                            })
                            .collect();
                        let data: Vec<Vec<u8>> = entries
                            .iter()
                            .map(|e| vec![rng.gen(); e.blocks as usize * bs])
                            .collect();
                        let pay: Vec<&[u8]> = data.iter().map(|d| d.as_slice()).collect();
                        let mut rec = encode(seq, 42, 0, &entries, &pay, bs);
                        seq += 1;
                        if rng.gen_range(0..4) == 0 {
                            let i = rng.gen_range(0..rec.len());
                            rec[i] ^= 1; // torn
                        }
                        ring.extend(rec);
                    }
                }
            }
            let keep_above = rng.gen_range(0..seq / 2 + 1);
            let whole: Vec<Record> = scan(&ring, bs, 42, max)
                .into_iter()
                .filter(|r| r.seq > keep_above)
                .collect();
            records += whole.len();
            let piece = rng.gen_range(1..20usize) * bs;
            let mut s = Scanner::new(bs, 42, max, keep_above);
            for p in ring.chunks(piece) {
                s.push(p);
            }
            let found = s.finish();
            let key = |v: &[Record]| {
                v.iter()
                    .map(|r| (r.seq, r.at, r.blocks))
                    .collect::<Vec<_>>()
            };
            assert_eq!(key(&found), key(&whole), "round {round}, pieces of {piece}");
        }
        assert!(records > 500, "the rings held records ({records})");
    }

    #[test]
    fn encode_decode_scan() {
        let bs = 512;
        let entries = vec![
            Entry {
                position: 1,
                discard: false,
                member_lba: 77,
                blocks: 2,
            },
            Entry {
                position: 3,
                discard: true,
                member_lba: 0,
                blocks: 64,
            },
            Entry {
                position: 0,
                discard: false,
                member_lba: 5,
                blocks: 1,
            },
        ];
        let a = vec![1u8; 1024];
        let c = vec![3u8; 512];
        let rec = encode(9, 42, 0, &entries, &[&a, &[], &c], bs);
        assert_eq!(rec.len() as u64, record_blocks(&entries, bs) * bs as u64);
        let (r, len) = decode(&rec, bs, 42, u64::MAX).unwrap();
        assert_eq!(len, 4);
        assert_eq!(r.seq, 9);
        assert_eq!(r.entries, entries);
        assert_eq!(r.payloads[0], a);
        assert_eq!(r.payloads[2], c);
        assert!(decode(&rec, bs, 43, u64::MAX).is_none());
        // in a ring image, next to garbage and a torn copy
        let mut ring = vec![0xeeu8; bs * 3];
        ring.extend_from_slice(&rec);
        let mut torn = rec.clone();
        let last = torn.len() - 1;
        torn[last] ^= 1;
        ring.extend_from_slice(&torn);
        let found = scan(&ring, bs, 42, u64::MAX);
        assert_eq!(found.len(), 1);
        assert_eq!((found[0].at, found[0].blocks), (3, 4));
        // the links of a data-first record and of the record completing it
        let df = encode(10, 42, LINK_DATA_FIRST, &entries, &[&a, &[], &c], bs);
        let (r, _) = decode(&df, bs, 42, u64::MAX).unwrap();
        assert!(r.is_data_first() && r.completes().is_none());
        let done = encode(11, 42, LINK_COMPLETES | 10, &entries, &[&a, &[], &c], bs);
        let (r, _) = decode(&done, bs, 42, u64::MAX).unwrap();
        assert_eq!((r.is_data_first(), r.completes()), (false, Some(10)));
        let (r, _) = decode(&rec, bs, 42, u64::MAX).unwrap();
        assert_eq!((r.is_data_first(), r.completes()), (false, None));
        // an unknown link is not a record of this format
        let mut odd = encode(12, 42, 2, &entries, &[&a, &[], &c], bs);
        assert!(decode(&odd, bs, 42, u64::MAX).is_none());
        odd[40] = 0;
        assert!(
            decode(&odd, bs, 42, u64::MAX).is_none(),
            "checksum covers the link"
        );
        // a sequence number whose successor could wrap is no record of a
        // pool, nor is one longer than the pool's largest record
        let past = encode(SEQ_MAX + 1, 42, 0, &entries, &[&a, &[], &c], bs);
        assert!(decode(&past, bs, 42, u64::MAX).is_none());
        let last = encode(SEQ_MAX, 42, 0, &entries, &[&a, &[], &c], bs);
        assert!(decode(&last, bs, 42, u64::MAX).is_some());
        assert!(decode(&rec, bs, 42, 3).is_none());
        assert!(decode(&rec, bs, 42, 4).is_some());
        // truncated buffers never panic
        for cut in 0..rec.len() {
            let _ = decode(&rec[..cut], bs, 42, u64::MAX);
        }
    }
}
