//! S3-FIFO (Yang et al., SOSP '23): three FIFO queues.
//!
//! - *small* (10% of the blocks): every new block enters here, on probation.
//! - *main* (the rest): blocks that were hit while in small, or that come back soon
//!   after being evicted from small (found in the ghost).
//! - *ghost*: keys recently evicted from small, no data (two rotating Bloom filters
//!   remembering about as many keys as main holds, about 1.5 bytes per block).
//!
//! A hit only bumps a 2-bit frequency counter (no list operation). Eviction takes
//! from small while small is at or above its share: a tail block that was hit moves
//! to main with its counter cleared, one that was not is evicted and remembered in
//! the ghost. Eviction from main is FIFO with reinsertion: a tail block with a
//! non-zero counter goes back to the head with the counter decremented.
//!
//! Why it wins for a block cache: most blocks seen once (scans, one-off reads) are
//! gone after a pass through the small queue without disturbing main, so a scan
//! cannot flush the hot set the way it flushes LRU; and frequency survives in main
//! longer than recency does.
//!
//! Layout: both queues only ever pop their oldest block, so they are singly linked
//! (4 bytes per block instead of 8). `remove` therefore cannot unlink a block from
//! the middle of a queue: it drops the key from the index at once (the block is gone
//! for every lookup) and marks the slot dead; the slot is recycled when it reaches
//! the end of its queue, without evicting anything. About 20.5 bytes per block
//! (8 key, 6 index, 4 link, 1 counter, 1.5 ghost).

use super::ghost::Ghost;
use super::index::NIL;
use super::table::{self, Queue, Table, TablePolicy};
use super::Policy;

const FREQ_MASK: u8 = 0b0011;
const FREQ_MAX: u8 = 3;
const IN_MAIN: u8 = 0b0100;
/// Removed by `remove`, still linked in its queue, no longer indexed.
const DEAD: u8 = 0b1000;

/// S3-FIFO eviction over at most `capacity` blocks.
pub struct S3Fifo {
    table: Table,
    next: Vec<u32>,
    small: Queue,
    main: Queue,
    /// Per slot: 2-bit frequency, `IN_MAIN`, `DEAD`.
    meta: Vec<u8>,
    ghost: Ghost,
    small_target: usize,
    /// Dead slots still linked in a queue.
    dead: usize,
}

impl S3Fifo {
    /// An empty S3-FIFO cache of `capacity` blocks with the paper's 10% small queue.
    pub fn new(capacity: usize) -> Self {
        Self::with_small_percent(capacity, 10)
    }

    /// An empty S3-FIFO cache whose small queue takes `small_percent` of the blocks
    /// (at least one block).
    pub fn with_small_percent(capacity: usize, small_percent: usize) -> Self {
        let small_target = (capacity * small_percent.min(100) / 100).max(1);
        let main_keys = capacity.saturating_sub(small_target).max(1);
        Self {
            table: Table::new(capacity),
            next: vec![NIL; capacity],
            small: Queue::new(),
            main: Queue::new(),
            meta: vec![0; capacity],
            ghost: Ghost::new(main_keys),
            small_target,
            dead: 0,
        }
    }

    /// Evicts a block leaving small unused, remembering its key in the ghost.
    fn evict_to_ghost(&mut self, slot: u32) -> u64 {
        let key = self.table.key(slot);
        self.ghost.insert(key);
        self.table.release(slot);
        key
    }

    /// Recycles a dead slot that left its queue.
    fn bury(&mut self, slot: u32) {
        self.table.release_unindexed(slot);
        self.dead -= 1;
    }

    fn evict_small(&mut self) -> Option<u64> {
        let main_target = self.table.capacity() - self.small_target;
        while let Some(slot) = self.small.pop(&self.next) {
            let meta = self.meta[slot as usize];
            if meta & DEAD != 0 {
                self.bury(slot);
                return None;
            }
            if meta & FREQ_MASK > 0 || self.table.is_pinned(slot) {
                self.meta[slot as usize] = IN_MAIN;
                self.main.push(&mut self.next, slot);
                if self.main.len > main_target {
                    return self.evict_main();
                }
            } else {
                return Some(self.evict_to_ghost(slot));
            }
        }
        self.evict_main()
    }

    fn evict_main(&mut self) -> Option<u64> {
        // pinned blocks go round; once a whole lap met only pinned ones, the
        // unpinned block the caller guarantees is in small
        let mut pinned_streak = 0usize;
        loop {
            let slot = self
                .main
                .pop(&self.next)
                .expect("a full cache with an empty small queue has blocks in main");
            let meta = self.meta[slot as usize];
            if meta & DEAD != 0 {
                self.bury(slot);
                return None;
            }
            let freq = meta & FREQ_MASK;
            if self.table.is_pinned(slot) {
                self.main.push(&mut self.next, slot);
                pinned_streak += 1;
                if pinned_streak > self.main.len && self.small.len > 0 {
                    return self.evict_small_past_pinned();
                }
            } else if freq > 0 {
                pinned_streak = 0;
                self.meta[slot as usize] = IN_MAIN | (freq - 1);
                self.main.push(&mut self.next, slot);
            } else {
                let key = self.table.key(slot);
                self.table.release(slot);
                return Some(key);
            }
        }
    }

    /// Eviction when main holds only pinned blocks: pinned blocks in small go round
    /// small; the first unpinned one is evicted (or, if it was hit, moved to main
    /// with its counter cleared, where it is the next unpinned block main meets).
    fn evict_small_past_pinned(&mut self) -> Option<u64> {
        loop {
            let slot = self
                .small
                .pop(&self.next)
                .expect("an unpinned block is in small when main is all pinned");
            let meta = self.meta[slot as usize];
            if meta & DEAD != 0 {
                self.bury(slot);
                return None;
            }
            if self.table.is_pinned(slot) {
                self.small.push(&mut self.next, slot);
            } else if meta & FREQ_MASK > 0 {
                self.meta[slot as usize] = IN_MAIN;
                self.main.push(&mut self.next, slot);
                return self.evict_main();
            } else {
                return Some(self.evict_to_ghost(slot));
            }
        }
    }
}

impl TablePolicy for S3Fifo {
    fn table(&self) -> &Table {
        &self.table
    }

    fn table_mut(&mut self) -> &mut Table {
        &mut self.table
    }

    fn on_hit(&mut self, slot: u32) {
        let m = &mut self.meta[slot as usize];
        if *m & FREQ_MASK < FREQ_MAX {
            *m += 1;
        }
    }

    /// Takes from small while small is at or above its share, else from main; the
    /// slot freed may be a dead one (then no key is evicted).
    fn make_room(&mut self) -> Option<u64> {
        if self.small.len >= self.small_target || self.main.len == 0 {
            self.evict_small()
        } else {
            self.evict_main()
        }
    }

    fn place_restored(&mut self, _key: u64, slot: u32) {
        self.meta[slot as usize] = IN_MAIN;
        self.main.push(&mut self.next, slot);
    }

    fn place(&mut self, key: u64, slot: u32) {
        if self.ghost.contains(key) {
            self.meta[slot as usize] = IN_MAIN;
            self.main.push(&mut self.next, slot);
        } else {
            self.meta[slot as usize] = 0;
            self.small.push(&mut self.next, slot);
        }
    }
}

impl Policy for S3Fifo {
    fn name(&self) -> &'static str {
        "s3fifo"
    }

    table::table_policy_methods!();

    /// Drops `key` at once; its slot is recycled when it reaches the end of its queue
    /// (so the slot returned is the one the key held, not yet reusable).
    fn remove(&mut self, key: u64) -> Option<u32> {
        let slot = self.table.find(key)?;
        self.table.set_pinned(slot, false);
        self.table.unindex(slot);
        self.meta[slot as usize] |= DEAD;
        self.dead += 1;
        Some(slot)
    }

    fn len(&self) -> usize {
        self.table.occupied() - self.dead
    }

    fn memory_bytes(&self) -> usize {
        self.table.memory_bytes()
            + self.next.capacity() * std::mem::size_of::<u32>()
            + self.meta.capacity()
            + self.ghost.memory_bytes()
    }
}
