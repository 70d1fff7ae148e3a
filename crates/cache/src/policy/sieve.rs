//! SIEVE (Zhang et al., NSDI '24): a FIFO list with one visited bit per block and a
//! hand. New blocks enter at the head; a hit only sets the visited bit (no list
//! operation, which is what makes it cheap). To evict, the hand walks from where it
//! last stopped towards the head, clearing visited bits, and evicts the first
//! unvisited block it meets; survivors stay where they are, so old popular blocks
//! sink to the tail end and new blocks are judged quickly. About 22 bytes per block.

use super::index::NIL;
use super::table::{self, ListTable, SlotBits, Table, TablePolicy};
use super::Policy;

/// SIEVE eviction over at most `capacity` blocks.
pub struct Sieve {
    slots: ListTable,
    visited: SlotBits,
    /// The next candidate for eviction; `NIL` means start again from the tail.
    hand: u32,
}

impl Sieve {
    /// An empty SIEVE cache of `capacity` blocks; all memory is allocated here.
    pub fn new(capacity: usize) -> Self {
        Self {
            slots: ListTable::new(capacity),
            visited: SlotBits::new(capacity),
            hand: NIL,
        }
    }
}

impl TablePolicy for Sieve {
    fn table(&self) -> &Table {
        &self.slots.table
    }

    fn table_mut(&mut self) -> &mut Table {
        &mut self.slots.table
    }

    fn on_hit(&mut self, slot: u32) {
        self.visited.set(slot, true);
    }

    fn make_room(&mut self) -> Option<u64> {
        let slots = &mut self.slots;
        let mut slot = if self.hand != NIL {
            self.hand
        } else {
            slots.list.tail()?
        };
        while self.visited.get(slot) || slots.table.is_pinned(slot) {
            self.visited.set(slot, false);
            slot = slots.links.newer(slot);
            if slot == NIL {
                slot = slots.list.tail;
            }
        }
        self.hand = slots.links.newer(slot);
        Some(slots.free(slot))
    }

    fn place(&mut self, _key: u64, slot: u32) {
        self.visited.set(slot, false);
        self.slots.push_head(slot);
    }
}

impl Policy for Sieve {
    fn name(&self) -> &'static str {
        "sieve"
    }

    table::table_policy_methods!();

    fn remove(&mut self, key: u64) -> Option<u32> {
        let slot = self.slots.table.find(key)?;
        if self.hand == slot {
            self.hand = self.slots.links.newer(slot);
        }
        self.slots.free(slot);
        Some(slot)
    }

    fn len(&self) -> usize {
        self.slots.table.occupied()
    }

    fn memory_bytes(&self) -> usize {
        self.slots.memory_bytes() + self.visited.memory_bytes()
    }
}
