//! W-TinyLFU with a ghost-guided window (after Einziger, Friedman and Manes,
//! ACM ToS 2017, and Caffeine; the window adapts the way ARC's target does).
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
//!   at least 256 blocks each, as the advisor samples) and the real window takes
//!   the share of the one with the most (decayed) hits, once its lead over the
//!   current share is larger than sampling noise (two standard deviations). A
//!   window of 100% *is* LRU
//!   (main is empty, the window's LRU block leaves), so on recency-driven
//!   workloads the cache becomes LRU, and on frequency-driven ones it shrinks the
//!   window and lets the sketch guard main. When the share drops, the window's
//!   oldest blocks move into main one per miss.
//!
//! Every miss is inserted (an SSD write), so insertions equal misses: a policy
//! that misses less than LRU also writes less. About 25 bytes per block (8 key,
//! 6 index, 8 links, 1 segment, 2 sketch) plus the shadows (4 x 1% of that).

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
}

/// Window shares (percent of the cache) the shadows try.
const WINDOW_PERCENTS: [usize; 4] = [100, 50, 20, 5];
/// Shadow caches hold at least this many blocks (by sampling more keys).
const SHADOW_MIN_BLOCKS: usize = 256;
/// Base share of keys the shadows see.
const SHADOW_RATE: f64 = 0.01;
/// After each period (a shadow's worth of sampled accesses) the scores keep this
/// share: they remember about 30 periods.
const SCORE_DECAY: f64 = 0.97;
/// The window changes share only when another shadow's score beats the current
/// one's by this many standard deviations of their difference: switching on
/// noise costs hits (on the traces of `examples/traces.rs`, without it the
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
        }
    }

    /// The window's target share now, in blocks.
    pub fn window_target(&self) -> usize {
        self.window_target
    }

    /// Counts an access in the sketch and lets the shadows see it.
    fn observe(&mut self, key: u64) {
        self.sketch.increment(key);
        if let Some(duel) = self.duel.as_mut() {
            if let Some(pct) = duel.record(key) {
                self.window_target = self.table.capacity() * pct / 100;
            }
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
