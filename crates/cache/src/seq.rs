//! Sequential stream detection: a request that continues a stream already longer
//! than the cutoff bypasses the cache (large sequential transfers gain nothing from
//! an SSD in front of striped disks and would flush the hot set) -- unless it would
//! cost hits:
//!
//! - only a request covering whole cache blocks bypasses: a block a stream covers
//!   in part is read again by its next request, which the fill serves from the
//!   SSD (64K requests over 128K blocks would lose half their hits);
//! - streamed data that comes back is cached. Block I/O re-reads what it streamed
//!   (a VM booting again, a file copied then opened, a database reading pages a
//!   bulk load wrote); turning that away costs every hit that follows. The
//!   detector remembers the cache blocks long streams covered (bypassed or not;
//!   about a cache's worth, exactly, over a spatial sample of the blocks), and
//!   - a stream that meets one of them is a second pass over the same data: it
//!     is cached for the rest of its run;
//!   - every access (read or write, streamed or random) to one of them counts as
//!     a re-use. While re-uses per streamed block (decayed over a few trackers'
//!     worth of streamed blocks) stay below [`REUSE_MAX`], long streams bypass;
//!     above it they are cached, and the tracker keeps measuring, so the bypass
//!     comes back when the re-use stops.
//!
//! A scan that is never re-read (a backup, a full-table scan bigger than the
//! cache) shows no re-use and keeps bypassing.

use crate::hash::{mix64, SALT_SAMPLE};
use std::collections::{HashMap, VecDeque};

/// Streams tracked at once (least recently extended replaced first).
const STREAMS: usize = 32;
/// How far from a stream's end (before or after) a request may start and still
/// continue it, in request lengths, at least: requests of one stream issued
/// together arrive reordered by up to the number in flight, so the slack grows to
/// that many requests when more are in flight. Proportional to the request so that
/// small random requests in a small hot region are not taken for a stream.
const SLACK_REQUESTS: u64 = 4;
/// The slack never exceeds this (a 64-deep queue of 256 KiB requests).
const SLACK_MAX_BYTES: u64 = 16 << 20;
/// Long streams bypass while later accesses to streamed blocks number fewer than
/// this per streamed block (see the module doc).
pub(crate) const REUSE_MAX: f64 = 0.05;

#[derive(Clone, Copy, Default)]
struct Stream {
    end: u64,
    run: u64,
    last_use: u64,
    /// The stream met data it bypassed before: it is cached, not bypassed.
    reread: bool,
}

/// Tracks recent sequential streams by byte offset.
pub(crate) struct SeqDetector {
    streams: [Stream; STREAMS],
    cutoff_bytes: u64,
    clock: u64,
    /// Re-use of streamed data (`None`: every long stream bypasses).
    reuse: Option<Reuse>,
    block_bytes: u64,
}

/// The cache blocks long streams covered, and how often they came back.
///
/// Exact, over a spatial sample of the blocks (a block is in the sample when a
/// hash of its number is below the rate, so a sampled block has every access
/// sampled): a Bloom filter's false positives (about 1%) would count as re-use
/// once per access of the rest of the workload, and a busy random workload
/// beside a scan would then switch the scan's bypass off.
struct Reuse {
    /// Sampled iff `mix64(block ^ SALT_SAMPLE) >> 40 < threshold`.
    threshold: u64,
    /// Sampled streamed blocks, oldest first, with the sequence number of their
    /// insertion; `latest` maps a block to its newest sequence number.
    fifo: VecDeque<(u64, u64)>,
    latest: HashMap<u64, u64>,
    capacity: usize,
    seq: u64,
    /// Sampled blocks of long streams remembered, decayed (halved with `reused`
    /// each time it passes `window`).
    streamed: f64,
    /// Accesses to remembered blocks (other than by the stream that covered
    /// them), decayed with `streamed`.
    reused: f64,
    window: f64,
}

/// Share of blocks the re-use tracker samples, and the fewest it remembers.
const REUSE_SAMPLE_RATE: f64 = 1.0 / 32.0;
const REUSE_MIN_SAMPLED: usize = 1024;

impl Reuse {
    /// Tracks about the last `remember_blocks` streamed blocks.
    fn new(remember_blocks: usize) -> Self {
        let remember = remember_blocks.max(REUSE_MIN_SAMPLED);
        let capacity = ((remember as f64 * REUSE_SAMPLE_RATE) as usize)
            .max(REUSE_MIN_SAMPLED)
            .min(remember);
        let rate = capacity as f64 / remember as f64;
        Self {
            threshold: (rate * (1u64 << 24) as f64).ceil() as u64,
            fifo: VecDeque::with_capacity(capacity),
            latest: HashMap::with_capacity(capacity),
            capacity,
            seq: 0,
            streamed: 0.0,
            reused: 0.0,
            window: 2.0 * capacity as f64,
        }
    }

    fn sampled(&self, block: u64) -> bool {
        mix64(block ^ SALT_SAMPLE) >> 40 < self.threshold
    }

    fn contains(&self, block: u64) -> bool {
        self.sampled(block) && self.latest.contains_key(&block)
    }

    /// Remembers a block of a long stream (if sampled).
    fn insert(&mut self, block: u64) {
        if !self.sampled(block) {
            return;
        }
        if self.fifo.len() >= self.capacity {
            if let Some((old, seq)) = self.fifo.pop_front() {
                if self.latest.get(&old) == Some(&seq) {
                    self.latest.remove(&old);
                }
            }
        }
        self.seq += 1;
        self.fifo.push_back((block, self.seq));
        self.latest.insert(block, self.seq);
        self.streamed += 1.0;
        if self.streamed > self.window {
            self.streamed /= 2.0;
            self.reused /= 2.0;
        }
    }

    /// Whether streamed data is re-used too often to bypass it.
    fn high(&self) -> bool {
        self.reused > REUSE_MAX * self.streamed
    }
}

impl SeqDetector {
    /// Streams longer than `cutoff_bytes` bypass; 0 turns detection off. Every
    /// long stream bypasses, re-read or not (the detector before re-read
    /// detection; kept for comparison).
    pub(crate) fn new(cutoff_bytes: u64) -> Self {
        Self {
            streams: [Stream::default(); STREAMS],
            cutoff_bytes,
            clock: 0,
            reuse: None,
            block_bytes: 1,
        }
    }

    /// Like [`SeqDetector::new`], but long streams bypass only while the data
    /// they covered (about the last `remember_blocks` cache blocks of
    /// `block_bytes`) is not re-used, and a stream that re-reads it is cached.
    pub(crate) fn keeping_rereads(
        cutoff_bytes: u64,
        block_bytes: u64,
        remember_blocks: usize,
    ) -> Self {
        Self {
            reuse: Some(Reuse::new(remember_blocks)),
            block_bytes: block_bytes.max(1),
            ..Self::new(cutoff_bytes)
        }
    }

    /// Records a request of `len` bytes at byte `offset`, with `inflight` requests
    /// in flight (this one included); true if it should bypass.
    pub(crate) fn observe(&mut self, offset: u64, len: u64, inflight: usize) -> bool {
        if self.cutoff_bytes == 0 {
            return false;
        }
        self.clock += 1;
        let end = offset + len;
        let slack = (len * SLACK_REQUESTS.max(inflight as u64)).min(SLACK_MAX_BYTES);
        // of several candidates (a reordered request may have opened a second one
        // just ahead of the first), continue the longest
        let hit = (0..STREAMS)
            .filter(|&i| {
                let s = &self.streams[i];
                s.run > 0 && offset + slack >= s.end && offset <= s.end + slack
            })
            .max_by_key(|&i| self.streams[i].run);
        let i = match hit {
            Some(i) => i,
            None => {
                let i = (0..STREAMS)
                    .min_by_key(|&i| self.streams[i].last_use)
                    .unwrap_or(0);
                self.streams[i] = Stream {
                    end,
                    run: 0,
                    last_use: self.clock,
                    reread: false,
                };
                i
            }
        };
        let s = &mut self.streams[i];
        // the stream's own blocks so far (it may have bypassed them): not a re-read
        let own_last = (s.run > 0).then(|| (s.end.max(1) - 1) / self.block_bytes);
        s.run += len;
        s.end = s.end.max(end);
        s.last_use = self.clock;
        // only a request that covers whole cache blocks is bypassed: a block it
        // covers in part is read again by the stream's next request, and filling
        // it serves that one from the SSD (a read-ahead; W-TinyLFU keeps such
        // one-off blocks in its window, away from the hot set)
        let whole_blocks =
            offset.is_multiple_of(self.block_bytes) && end.is_multiple_of(self.block_bytes);
        let long = (len >= self.cutoff_bytes || s.run > self.cutoff_bytes) && whole_blocks;
        let Some(reuse) = self.reuse.as_mut() else {
            return long;
        };
        let first = offset / self.block_bytes;
        let last = (end.max(offset + 1) - 1) / self.block_bytes;
        let first_new = own_last.map_or(first, |o| first.max(o + 1));
        let mut met = false;
        for b in first_new..=last {
            if reuse.contains(b) {
                met = true;
                reuse.reused += 1.0;
            }
        }
        if met && s.run > len {
            // a stream (not a lone request) meeting streamed data: a second pass
            s.reread = true;
        }
        if !long {
            return false;
        }
        for b in first_new..=last {
            reuse.insert(b);
        }
        !s.reread && !reuse.high()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_stream_bypasses_and_random_requests_do_not() {
        let mut d = SeqDetector::new(4 << 20);
        let mut bypassed = 0;
        for i in 0..64u64 {
            if d.observe(i * 262144, 262144, 1) {
                bypassed += 1;
            }
        }
        assert_eq!(bypassed, 64 - 16, "the first 4 MiB go through the cache");
        let mut rng = crate::trace::Rng::new(3);
        let mut random_bypassed = 0;
        for _ in 0..100_000 {
            if d.observe(rng.below(1 << 19) * 4096, 4096, 1) {
                random_bypassed += 1;
            }
        }
        assert!(
            random_bypassed < 50,
            "{random_bypassed} random requests bypassed"
        );
        // random requests in a small hot region are not a stream either
        let mut d = SeqDetector::new(256 << 10);
        let hot = (0..20_000)
            .filter(|_| d.observe(rng.below(512) * 4096, 4096, 1))
            .count();
        assert_eq!(hot, 0, "random requests in 2 MiB taken for a stream");
        assert!(
            d.observe(0, 8 << 20, 1),
            "a request past the cutoff bypasses alone"
        );
        assert!(
            !SeqDetector::new(0).observe(0, 1 << 30, 1),
            "0 turns detection off"
        );
    }

    #[test]
    fn a_stream_that_rereads_bypassed_data_is_cached() {
        let mut d = SeqDetector::keeping_rereads(1 << 20, 65536, 4096);
        let pass = |d: &mut SeqDetector| {
            (0..256u64)
                .filter(|i| d.observe(i * 65536, 65536, 1))
                .count()
        };
        assert_eq!(pass(&mut d), 256 - 16, "the first pass bypasses past 1 MiB");
        // the tracker remembers a sample of the blocks (here 1 in 4): the second
        // pass is known as a re-read at its first sampled block past 1 MiB
        let second = pass(&mut d);
        assert!(
            second <= 8,
            "the second pass re-reads: {second} of 256 bypassed"
        );
        // streamed data came back, so for now the next stream is cached too
        let mut region = 1u64;
        let mut fresh = |d: &mut SeqDetector| {
            region += 1;
            (0..256u64)
                .filter(|i| d.observe((region << 32) + i * 65536, 65536, 1))
                .count()
        };
        assert_eq!(fresh(&mut d), 0);
        // and once streams stop coming back, they bypass again
        let back = (0..64).position(|_| fresh(&mut d) == 256 - 16);
        assert!(back.is_some(), "the bypass never came back");
    }

    #[test]
    fn streamed_data_read_back_at_random_stops_the_bypass_and_scans_keep_it() {
        let block = 65536;
        let mut rng = crate::trace::Rng::new(11);
        // streams of 4 MiB in fresh regions, each followed by random 4K reads of
        // what it streamed: the bypass turns itself off
        let mut d = SeqDetector::keeping_rereads(1 << 20, block, 4096);
        let mut late = 0;
        for s in 0..64u64 {
            let base = s << 32;
            let bypassed = (0..64u64)
                .filter(|i| d.observe(base + i * block, block, 1))
                .count();
            if s >= 8 {
                late += bypassed;
            }
            for _ in 0..64 {
                d.observe(base + rng.below(64 * 16) * 4096, 4096, 1);
            }
        }
        assert_eq!(late, 0, "re-used streams still bypassed");
        // the same streams followed by random reads elsewhere: a scan, bypassed
        let mut d = SeqDetector::keeping_rereads(1 << 20, block, 4096);
        let mut late = 0;
        for s in 0..64u64 {
            let bypassed = (0..64u64)
                .filter(|i| d.observe((s << 32) + i * block, block, 1))
                .count();
            if s >= 8 {
                late += bypassed;
            }
            for _ in 0..64 {
                d.observe((1 << 40) + rng.below(1 << 20) * 4096, 4096, 1);
            }
        }
        assert_eq!(late, 56 * (64 - 16), "a scan never read back must bypass");
    }

    #[test]
    fn only_requests_of_whole_cache_blocks_are_bypassed() {
        // 64K requests over 128K blocks: each fill serves the next request
        let mut d = SeqDetector::keeping_rereads(1 << 20, 131072, 4096);
        let bypassed = (0..256u64)
            .filter(|i| d.observe(i * 65536, 65536, 1))
            .count();
        assert_eq!(bypassed, 0);
        // whole-block requests of the same stream length are
        let mut d = SeqDetector::keeping_rereads(1 << 20, 131072, 4096);
        let bypassed = (0..128u64)
            .filter(|i| d.observe(i * 131072, 131072, 1))
            .count();
        assert_eq!(bypassed, 128 - 8);
        // 128K requests 64K off the block boundaries: every block is read twice
        let mut d = SeqDetector::keeping_rereads(1 << 20, 131072, 4096);
        let bypassed = (0..128u64)
            .filter(|i| d.observe(65536 + i * 131072, 131072, 1))
            .count();
        assert_eq!(bypassed, 0);
    }

    #[test]
    fn interleaved_streams_are_each_detected() {
        let mut d = SeqDetector::new(1 << 20);
        let mut last = [false; 4];
        for i in 0..40u64 {
            for (s, l) in last.iter_mut().enumerate() {
                *l = d.observe(((s as u64) << 32) | (i * 65536), 65536, 1);
            }
        }
        assert_eq!(last, [true; 4]);
    }

    #[test]
    fn a_stream_reordered_by_a_deep_queue_is_still_one_stream() {
        // 256 KiB requests, 32 in flight, each window of 32 arriving in a
        // scrambled order (the worst a 32-deep queue can do)
        let mut d = SeqDetector::new(4 << 20);
        let mut rng = crate::trace::Rng::new(7);
        let mut through = 0;
        for w in 0..32u64 {
            let mut idx: Vec<u64> = (0..32).collect();
            for i in (1..idx.len()).rev() {
                idx.swap(i, rng.below(i as u64 + 1) as usize);
            }
            for i in idx {
                if !d.observe((w * 32 + i) * 262144, 262144, 32) {
                    through += 1;
                }
            }
        }
        assert!(
            through <= 32,
            "{through} requests of one 256 MiB stream went through the cache"
        );
        // random 4K requests over 2 GiB at 32 in flight are still not a stream
        let mut d = SeqDetector::new(4 << 20);
        let random = (0..100_000)
            .filter(|_| d.observe(rng.below(1 << 19) * 4096, 4096, 32))
            .count();
        assert!(random < 50, "{random} random requests bypassed");
    }
}
