//! 2Q (Johnson and Shasha, VLDB '94, the full version with A1out).
//!
//! - *A1in* (a quarter of the blocks): a FIFO every new block enters; hits there
//!   change nothing (correlated re-references right after a first access don't count).
//! - *Am* (the rest): an LRU of blocks that came back after leaving A1in.
//! - *A1out*: keys recently evicted from A1in (ghost; half the capacity's worth of
//!   keys, two rotating Bloom filters). A miss found there goes straight to Am.
//!
//! When full, a block is taken from A1in's tail (into A1out) while A1in holds more
//! than its quarter, otherwise from Am's tail. About 23 bytes per block.

use super::ghost::Ghost;
use super::table::{self, Links, List, SlotBits, Table, TablePolicy};
use super::Policy;

/// 2Q eviction over at most `capacity` blocks.
pub struct TwoQ {
    table: Table,
    links: Links,
    a1in: List,
    am: List,
    in_am: SlotBits,
    a1out: Ghost,
    kin: usize,
}

impl TwoQ {
    /// An empty 2Q cache of `capacity` blocks with the paper's tuning (Kin = 25%,
    /// Kout = 50% of the capacity).
    pub fn new(capacity: usize) -> Self {
        Self {
            table: Table::new(capacity),
            links: Links::new(capacity),
            a1in: List::new(),
            am: List::new(),
            in_am: SlotBits::new(capacity),
            a1out: Ghost::new((capacity / 2).max(1)),
            kin: (capacity / 4).max(1),
        }
    }
}

impl TablePolicy for TwoQ {
    fn table(&self) -> &Table {
        &self.table
    }

    fn table_mut(&mut self) -> &mut Table {
        &mut self.table
    }

    fn on_hit(&mut self, slot: u32) {
        if self.in_am.get(slot) {
            self.am.move_to_head(&mut self.links, slot);
        }
    }

    fn make_room(&mut self) -> Option<u64> {
        let links = &mut self.links;
        let mut from_a1in = self.a1in.len > self.kin || self.am.len == 0;
        // pinned blocks met at a tail go back to their list's head; after a whole
        // list of them, try the other list (the caller checked one is unpinned)
        let mut tried = 0usize;
        let slot = loop {
            let list = if from_a1in {
                &mut self.a1in
            } else {
                &mut self.am
            };
            if tried >= list.len {
                from_a1in = !from_a1in;
                tried = 0;
                continue;
            }
            let slot = list.tail().expect("a full cache has blocks in A1in or Am");
            if self.table.is_pinned(slot) {
                list.move_to_head(links, slot);
                tried += 1;
                continue;
            }
            list.unlink(links, slot);
            break slot;
        };
        let key = self.table.key(slot);
        if from_a1in {
            self.a1out.insert(key);
        }
        self.table.release(slot);
        Some(key)
    }

    fn place_restored(&mut self, _key: u64, slot: u32) {
        self.in_am.set(slot, true);
        self.am.push_head(&mut self.links, slot);
    }

    fn place(&mut self, key: u64, slot: u32) {
        let to_am = self.a1out.contains(key);
        self.in_am.set(slot, to_am);
        let links = &mut self.links;
        if to_am {
            self.am.push_head(links, slot);
        } else {
            self.a1in.push_head(links, slot);
        }
    }
}

impl Policy for TwoQ {
    fn name(&self) -> &'static str {
        "2q"
    }

    table::table_policy_methods!();

    fn remove(&mut self, key: u64) -> Option<u32> {
        let slot = self.table.find(key)?;
        let links = &mut self.links;
        if self.in_am.get(slot) {
            self.am.unlink(links, slot);
        } else {
            self.a1in.unlink(links, slot);
        }
        self.table.release(slot);
        Some(slot)
    }

    fn len(&self) -> usize {
        self.table.occupied()
    }

    fn memory_bytes(&self) -> usize {
        self.table.memory_bytes()
            + self.links.memory_bytes()
            + self.in_am.memory_bytes()
            + self.a1out.memory_bytes()
    }
}
