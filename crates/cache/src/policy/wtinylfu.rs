//! W-TinyLFU with a dueling window (after Einziger, Friedman and Manes, ACM ToS
//! 2017, and Caffeine; the window's share is chosen by set dueling, below: an
//! ARC-style window moved by ghost hits was measured and lost, see
//! docs/0003-cache.md "Not done yet").
//!
//! - *window*: an LRU every new block enters. A block re-read soon after its first
//!   use (the common case of block I/O: a read after a write, a re-read a few
//!   requests later) is a hit here, with no probation to pay.
//! - *main*: a segmented LRU (*probation*, then *protected*, 80% of main). A block
//!   leaving the window competes with main's next victim: it enters main only if
//!   the frequency sketch has seen it more often, so one-off blocks (scans, the
//!   tail of a skewed workload) stay in the window and leave soon, and cannot push
//!   out blocks with a history.
//! - the window's share adapts by set dueling: four miniature copies of the cache
//!   (windows of 100%, 50%, 20% and 5%) run over a spatial sample of the keys (1%,
//!   at least 768 blocks each) and the real window takes
//!   the share of the one with the most (decayed) hits, once its lead over the
//!   current share is larger than sampling noise (two standard deviations). A
//!   window of 100% *is* LRU
//!   (main is empty, the window's LRU block leaves), so on recency-driven
//!   workloads the cache becomes LRU, and on frequency-driven ones it shrinks the
//!   window and lets the sketch guard main. When the share drops, the window's
//!   oldest blocks move into main one per miss.
//! - *correlated references* (LRU-K's and 2Q's correlated reference period): a
//!   block I/O request touches a cache block several times in a row (a request
//!   covering it, then the next sequential request touching it again). A touch of
//!   one of the last `CORRELATED` distinct blocks does not count in the sketch,
//!   so a burst counts once and frequency means re-use, not request size.
//! - *streams* (spatial locality): when an access continues a stream (one of
//!   those last blocks lies at most `STREAM_GAP` blocks below it), the cached
//!   blocks just above it in the window (`SUCCESSORS`, at most an eighth of the
//!   cache) are refreshed, since a stream re-reading a region reaches them next.
//!   Random accesses rarely pass the gate, so they change nothing. (Drop-behind,
//!   demoting the block a stream has just left, was tried: it helped the
//!   CloudPhysics trace and cost the held-out Tencent sample up to 0.33 points
//!   at 10-20%; see docs/0003-cache.md.)
//!   On the block traces of `examples/traces/main.rs` this is what lifts small caches
//!   (1% of the distinct blocks), where a 100% window (pure LRU) wins the duel,
//!   above LRU; no blocks are inserted that LRU would not insert.
//!
//! Every miss is inserted (an SSD write), so insertions equal misses: a policy
//! that misses less than LRU also writes less. About 25 bytes per block (8 key,
//! 6 index, 8 links, 1 segment, 2 sketch) plus the shadows (4 x 1% of that, at
//! least 4 x 768 blocks' worth, about 80 KB, for caches under 76,800 blocks).

use super::sketch::Sketch;
use super::table::{self, Links, List, Table, TablePolicy};
use super::Policy;
use crate::hash::{mix64, SALT_SAMPLE};

const WINDOW: u8 = 0;
const PROBATION: u8 = 1;
const PROTECTED: u8 = 2;

/// W-TinyLFU eviction with an adaptive window over at most `capacity` blocks.
pub struct WTinyLfu {
    table: Table,
    links: Links,
    lists: [List; 3],
    /// Per slot: the segment it is on.
    segment: Vec<u8>,
    sketch: Sketch,
    /// The window's target size, in blocks.
    window_target: usize,
    /// The shadows that choose the window's share (none in a shadow).
    duel: Option<Box<Duel>>,
    /// The last `CORRELATED` distinct blocks counted (a ring).
    recent: [u64; CORRELATED],
    recent_at: usize,
}

/// Window shares (percent of the cache) the shadows try.
const WINDOW_PERCENTS: [usize; 4] = [100, 50, 20, 5];
/// Shadow caches hold at least this many blocks (by sampling more keys; a cache
/// smaller than this is shadowed whole). Larger shadows judge the window on more
/// hits: with 256, the traces' MSN-FS 5% and P6 20% cells fell below LRU (the
/// shadows kept the wrong share for most of the trace). Not more: the advisor's
/// miniature caches are shadowed whole (their shadows cannot be larger than they
/// are), and with 1024 or more the real cache chose its window so much better
/// than they could on Zipf workloads that the advisor's estimate fell 3.5 points
/// short (`tests/advisor.rs`).
const SHADOW_MIN_BLOCKS: usize = 768;
/// Distinct blocks remembered as the correlated-reference period: a touch of one
/// of them is not counted in the sketch. They also tell whether an access
/// continues a stream.
const CORRELATED: usize = 4;
/// An access continues a stream when a remembered block lies at most this many
/// blocks below it.
const STREAM_GAP: u64 = 64;
/// Cached successors of a stream's block refreshed on each access.
const SUCCESSORS: u64 = 16;
/// ... but at most the cache's capacity over this (a small cache would otherwise
/// be reordered wholesale).
const SUCCESSORS_CACHE_DIVISOR: u64 = 8;
/// Base share of keys the shadows see.
const SHADOW_RATE: f64 = 0.01;
/// After each period (a shadow's worth of sampled accesses) the scores keep this
/// share: they remember about 100 periods. With 0.97 (about 30) the duel on
/// w106 at 20% left the 100% share after a flood that only the small windows
/// survived, and lost what it judged on (0.10 points under LRU); 0.99 stays
/// (+0.04). Over the 36 cells of `examples/traces/main.rs` (2026-12-03) the
/// sum of the lead over LRU rose from +34.94 to +35.41: up at w106 1%, OLTP
/// and P6 20%, P12 10%; down at P12 20% (+0.72 to +0.04), P2 10%,
/// cloudPhysics 10%.
const SCORE_DECAY: f64 = 0.99;
/// The window changes share only when another shadow's score beats the current
/// one's by this many standard deviations of their difference: switching on
/// noise costs hits (on the traces of `examples/traces/main.rs`, without it the
/// cache fell up to 0.3 points below LRU at 1% and 5% sizes; with it those
/// cells tie with LRU).
const SWITCH_SIGMAS: f64 = 2.0;

/// Miniature copies of the cache over a spatial sample of the keys, one per
/// candidate window share, scored on their hits with an exponential decay: the
/// real cache's window follows the best of them.
struct Duel {
    /// Sampled iff `hash >> 40 < threshold` (24-bit fixed point rate).
    threshold: u64,
    shadows: Vec<WTinyLfu>,
    scores: Vec<f64>,
    sampled: u64,
    period: u64,
    best: usize,
}

impl Duel {
    fn new(capacity: usize) -> Option<Self> {
        if capacity < 2 {
            return None;
        }
        let rate = SHADOW_RATE
            .max(SHADOW_MIN_BLOCKS as f64 / capacity as f64)
            .min(1.0);
        let shadow_blocks = ((capacity as f64 * rate).round() as usize).max(1);
        Some(Self {
            threshold: (rate * (1u64 << 24) as f64).ceil() as u64,
            shadows: WINDOW_PERCENTS
                .iter()
                .map(|&pct| WTinyLfu::fixed(shadow_blocks, shadow_blocks * pct / 100))
                .collect(),
            scores: vec![0.0; WINDOW_PERCENTS.len()],
            sampled: 0,
            period: shadow_blocks.max(64) as u64,
            best: 0,
        })
    }

    /// Feeds a sampled access; returns the best window share (percent) when it
    /// changes.
    fn record(&mut self, key: u64) -> Option<usize> {
        if mix64(key ^ SALT_SAMPLE) >> 40 >= self.threshold {
            return None;
        }
        for (shadow, score) in self.shadows.iter_mut().zip(&mut self.scores) {
            if shadow.access(key).is_hit() {
                *score += 1.0;
            }
        }
        self.sampled += 1;
        if !self.sampled.is_multiple_of(self.period) {
            return None;
        }
        // the window moves only to a share whose shadow beat the current one by
        // more than sampling noise (hits are counted events: the difference of
        // two scores has a spread of about the square root of their sum)
        let current = self.scores[self.best];
        let mut best = self.best;
        for (i, &s) in self.scores.iter().enumerate() {
            if s > self.scores[best] && s - current > SWITCH_SIGMAS * (s + current).sqrt() {
                best = i;
            }
        }
        for s in &mut self.scores {
            *s *= SCORE_DECAY;
        }
        (best != self.best).then(|| {
            self.best = best;
            WINDOW_PERCENTS[best]
        })
    }

    fn memory_bytes(&self) -> usize {
        self.shadows.iter().map(|s| s.memory_bytes()).sum::<usize>()
            + self.scores.capacity() * std::mem::size_of::<f64>()
    }
}

impl WTinyLfu {
    /// An empty cache of `capacity` blocks, its window starting at all of it (LRU).
    pub fn new(capacity: usize) -> Self {
        let mut p = Self::fixed(capacity, capacity * WINDOW_PERCENTS[0] / 100);
        p.duel = Duel::new(capacity).map(Box::new);
        p
    }

    /// A cache whose window keeps `window_blocks` (no adaptation).
    fn fixed(capacity: usize, window_blocks: usize) -> Self {
        Self {
            table: Table::new(capacity),
            links: Links::new(capacity),
            lists: [List::new(); 3],
            segment: vec![WINDOW; capacity],
            sketch: Sketch::new(capacity),
            window_target: window_blocks.min(capacity),
            duel: None,
            recent: [u64::MAX; CORRELATED],
            recent_at: 0,
        }
    }

    /// The window's target share now, in blocks.
    pub fn window_target(&self) -> usize {
        self.window_target
    }

    /// Counts an access in the sketch (once per correlated burst) and lets the
    /// shadows see it.
    fn observe(&mut self, key: u64) {
        if !self.recent.contains(&key) {
            self.sketch.increment(key);
            self.recent[self.recent_at] = key;
            self.recent_at = (self.recent_at + 1) % CORRELATED;
        }
        if let Some(duel) = self.duel.as_mut() {
            if let Some(pct) = duel.record(key) {
                self.window_target = self.table.capacity() * pct / 100;
            }
        }
    }

    /// Whether an access to `key` continues a stream: one of the last distinct
    /// blocks lies at most `STREAM_GAP` blocks below it.
    fn continues_stream(&self, key: u64) -> bool {
        self.recent
            .iter()
            .any(|&r| r != key && key.wrapping_sub(r) <= STREAM_GAP)
    }

    /// On a stream's access to `key` (in `slot`): refreshes its cached successors
    /// in the window, keeping `key` the most recent.
    fn refresh_successors(&mut self, key: u64, slot: u32) {
        let n = SUCCESSORS.min(self.table.capacity() as u64 / SUCCESSORS_CACHE_DIVISOR);
        if n == 0 || !self.continues_stream(key) {
            return;
        }
        let mut moved = false;
        for j in 1..=n {
            if let Some(s) = self.table.find(key.wrapping_add(j)) {
                if self.segment[s as usize] == WINDOW {
                    self.lists[WINDOW as usize].move_to_head(&mut self.links, s);
                    moved = true;
                }
            }
        }
        if moved {
            let seg = self.segment[slot as usize];
            self.lists[seg as usize].move_to_head(&mut self.links, slot);
        }
    }

    fn protected_target(&self) -> usize {
        (self.table.capacity() - self.window_target) * 4 / 5
    }

    fn move_to(&mut self, slot: u32, to: u8) {
        let from = self.segment[slot as usize];
        self.lists[from as usize].unlink(&mut self.links, slot);
        self.lists[to as usize].push_head(&mut self.links, slot);
        self.segment[slot as usize] = to;
    }

    /// The least recent unpinned block of `segment` (pinned ones met at the tail
    /// go back to its head).
    fn unpinned_tail(&mut self, segment: u8) -> Option<u32> {
        let list = &mut self.lists[segment as usize];
        for _ in 0..list.len {
            let slot = list.tail()?;
            if !self.table.is_pinned(slot) {
                return Some(slot);
            }
            list.move_to_head(&mut self.links, slot);
        }
        None
    }

    fn main_victim(&mut self) -> Option<u32> {
        self.unpinned_tail(PROBATION)
            .or_else(|| self.unpinned_tail(PROTECTED))
    }

    fn evict(&mut self, slot: u32) -> u64 {
        let seg = self.segment[slot as usize];
        self.lists[seg as usize].unlink(&mut self.links, slot);
        let key = self.table.key(slot);
        self.table.release(slot);
        key
    }

    /// Keeps protected within its share by demoting its least recent block.
    fn balance_protected(&mut self) {
        if self.lists[PROTECTED as usize].len > self.protected_target() {
            if let Some(slot) = self.lists[PROTECTED as usize].tail() {
                self.move_to(slot, PROBATION);
            }
        }
    }
}

impl TablePolicy for WTinyLfu {
    fn table(&self) -> &Table {
        &self.table
    }

    fn table_mut(&mut self) -> &mut Table {
        &mut self.table
    }

    fn on_hit(&mut self, slot: u32) {
        let key = self.table.key(slot);
        self.observe(key);
        match self.segment[slot as usize] {
            WINDOW => self.lists[WINDOW as usize].move_to_head(&mut self.links, slot),
            PROBATION => {
                self.move_to(slot, PROTECTED);
                self.balance_protected();
            }
            _ => self.lists[PROTECTED as usize].move_to_head(&mut self.links, slot),
        }
        self.refresh_successors(key, slot);
    }

    fn make_room(&mut self) -> Option<u64> {
        if self.lists[WINDOW as usize].len > self.window_target {
            // the window shrinks towards its share: its LRU block joins main
            // unopposed (main is under its share), the next one competes below
            if let Some(tail) = self.unpinned_tail(WINDOW) {
                self.move_to(tail, PROBATION);
            }
        }
        let window = self.lists[WINDOW as usize].len;
        if window > 0 && window >= self.window_target {
            if let Some(candidate) = self.unpinned_tail(WINDOW) {
                let Some(victim) = self.main_victim() else {
                    return Some(self.evict(candidate));
                };
                let c = self.sketch.estimate(self.table.key(candidate));
                let v = self.sketch.estimate(self.table.key(victim));
                if c > v {
                    self.move_to(candidate, PROBATION);
                    return Some(self.evict(victim));
                }
                return Some(self.evict(candidate));
            }
        }
        if let Some(victim) = self.main_victim() {
            return Some(self.evict(victim));
        }
        let slot = self
            .unpinned_tail(WINDOW)
            .expect("a full cache with an unpinned block has one in some segment");
        Some(self.evict(slot))
    }

    fn place_restored(&mut self, _key: u64, slot: u32) {
        self.segment[slot as usize] = PROBATION;
        self.lists[PROBATION as usize].push_head(&mut self.links, slot);
    }

    fn place(&mut self, key: u64, slot: u32) {
        self.observe(key);
        self.segment[slot as usize] = WINDOW;
        self.lists[WINDOW as usize].push_head(&mut self.links, slot);
        self.refresh_successors(key, slot);
        // while the cache fills, the window's overflow goes to main unopposed
        if !self.table.is_full() && self.lists[WINDOW as usize].len > self.window_target.max(1) {
            if let Some(tail) = self.lists[WINDOW as usize].tail() {
                self.move_to(tail, PROBATION);
            }
        }
    }
}

impl Policy for WTinyLfu {
    fn name(&self) -> &'static str {
        "wtinylfu"
    }

    table::table_policy_methods!();

    fn remove(&mut self, key: u64) -> Option<u32> {
        let slot = self.table.find(key)?;
        let seg = self.segment[slot as usize];
        self.lists[seg as usize].unlink(&mut self.links, slot);
        self.table.release(slot);
        Some(slot)
    }

    fn len(&self) -> usize {
        self.table.occupied()
    }

    fn memory_bytes(&self) -> usize {
        self.table.memory_bytes()
            + self.links.memory_bytes()
            + self.segment.capacity()
            + self.sketch.memory_bytes()
            + self.duel.as_ref().map_or(0, |d| d.memory_bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::Lru;

    #[test]
    fn a_burst_counts_once_in_the_sketch() {
        let mut p = WTinyLfu::new(1000);
        for _ in 0..10 {
            p.access(7);
        }
        assert_eq!(p.sketch.estimate(7), 1);
        // a re-use after other blocks counts again
        for k in 100..110 {
            p.access(k);
        }
        p.access(7);
        assert_eq!(p.sketch.estimate(7), 2);
    }

    /// A region read once, pushed towards the LRU end, then re-read as a stream
    /// while a random miss per step keeps evicting: LRU evicts each block just
    /// before the stream reaches it; refreshing the stream's successors keeps
    /// the blocks just ahead of it.
    fn rescan(p: &mut dyn Policy) -> u64 {
        for k in 0..32 {
            p.access(k);
        }
        for i in 0..32 {
            p.access(10_000 + 7 * i);
        }
        let mut hits = 0;
        for k in 0..32 {
            hits += u64::from(p.access(k).is_hit());
            p.access(20_000 + 7 * k);
        }
        hits
    }

    #[test]
    fn a_stream_keeps_the_region_ahead_of_it() {
        let lru = rescan(&mut Lru::new(64));
        let w = rescan(&mut WTinyLfu::new(64));
        assert!(w >= lru + 6, "wtinylfu {w} hits, lru {lru}");
    }

    #[test]
    fn random_accesses_do_not_pass_the_stream_gate() {
        let mut p = WTinyLfu::new(64);
        for k in [5_000u64, 900, 77_000, 12] {
            p.access(k);
        }
        assert!(!p.continues_stream(40_000));
        assert!(p.continues_stream(13));
        assert!(p.continues_stream(12 + STREAM_GAP));
        assert!(!p.continues_stream(12 + STREAM_GAP + 1));
    }
}
