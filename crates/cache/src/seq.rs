//! Sequential stream detection: a request that continues a stream already longer
//! than the cutoff bypasses the cache (large sequential transfers gain nothing from
//! an SSD in front of striped disks and would flush the hot set) -- unless the
//! stream is re-reading data: the cache blocks a bypass sent past the cache are
//! remembered (a ghost filter of about a cache's worth of blocks), and a stream
//! that meets one of them is data coming back, so it goes through the cache for
//! the rest of its run. Block I/O re-reads what it streamed (a VM booting again,
//! a file copied then opened); turning that away costs every hit that follows.

use crate::policy::ghost::Ghost;

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
    /// Cache blocks recently bypassed (`None`: every long stream bypasses).
    bypassed: Option<Ghost>,
    block_bytes: u64,
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
            bypassed: None,
            block_bytes: 1,
        }
    }

    /// Like [`SeqDetector::new`], but a stream that re-reads any of the last
    /// `remember_blocks` cache blocks (of `block_bytes`) it bypassed is cached.
    pub(crate) fn keeping_rereads(
        cutoff_bytes: u64,
        block_bytes: u64,
        remember_blocks: usize,
    ) -> Self {
        Self {
            bypassed: Some(Ghost::new(remember_blocks.max(1024))),
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
        let long = len >= self.cutoff_bytes || s.run > self.cutoff_bytes;
        let Some(ghost) = self.bypassed.as_mut() else {
            return long;
        };
        let first = offset / self.block_bytes;
        let last = (end.max(offset + 1) - 1) / self.block_bytes;
        let first_new = own_last.map_or(first, |o| first.max(o + 1));
        if !s.reread && (first_new..=last).any(|b| ghost.contains(b)) {
            s.reread = true;
        }
        if !long || s.reread {
            return false;
        }
        for b in first..=last {
            ghost.insert(b);
        }
        true
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
        let second = pass(&mut d);
        assert!(
            second <= 4,
            "the second pass re-reads: {second} of 256 bypassed"
        );
        // a new region is not a re-read: it bypasses again
        let fresh = (0..256u64)
            .filter(|i| d.observe((1 << 32) + i * 65536, 65536, 1))
            .count();
        assert_eq!(fresh, 256 - 16);
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
