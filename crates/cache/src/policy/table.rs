//! The slot array every policy is built on: the key of each cached block, a free
//! list threaded through the unused slots, the key index; plus intrusive lists over
//! slot numbers (doubly linked [`List`] over [`Links`], singly linked [`Queue`]), a
//! table with all its slots on one list ([`ListTable`], for LRU, FIFO and SIEVE),
//! and the hit/miss/evict flow every policy over a table shares ([`TablePolicy`],
//! [`access`], [`touch`]).
//!
//! A slot number is stable for as long as its key stays cached, so the cache layer
//! uses it directly as the block's frame number on the SSD: the policy's table *is*
//! the block map, with no second structure beside it.

use super::index::{KeyIndex, NIL};
use super::Access;

/// Slots `0..capacity`, each holding a key or on the free list. 8 bytes per slot for
/// keys plus 6 for the index.
pub(crate) struct Table {
    /// The key of each slot in use; for a free slot, the next free slot.
    keys: Vec<u64>,
    index: KeyIndex,
    free_head: u32,
    /// Slots that hold a key, indexed or not (see [`Table::unindex`]).
    occupied: usize,
    capacity: usize,
    /// Slots the cache layer has pinned (dirty or under I/O): never evicted.
    pinned: SlotBits,
    pinned_count: usize,
}

impl Table {
    pub(crate) fn new(capacity: usize) -> Self {
        assert!(
            capacity < NIL as usize,
            "a policy holds fewer than 2^32 - 1 blocks"
        );
        Self {
            keys: Vec::with_capacity(capacity),
            index: KeyIndex::with_entries(capacity),
            free_head: NIL,
            occupied: 0,
            capacity,
            pinned: SlotBits::new(capacity),
            pinned_count: 0,
        }
    }

    /// Whether `slot` is pinned (must not be evicted).
    #[inline]
    pub(crate) fn is_pinned(&self, slot: u32) -> bool {
        self.pinned.get(slot)
    }

    /// Pins or unpins an occupied `slot`.
    pub(crate) fn set_pinned(&mut self, slot: u32, pinned: bool) {
        if (slot as usize) >= self.keys.len() || self.pinned.get(slot) == pinned {
            return;
        }
        self.pinned.set(slot, pinned);
        if pinned {
            self.pinned_count += 1;
        } else {
            self.pinned_count -= 1;
        }
    }

    /// Slots pinned now.
    #[inline]
    pub(crate) fn pinned_count(&self) -> usize {
        self.pinned_count
    }

    /// Fills an empty table with `entries` (slot, key), every other slot free; the
    /// lowest free slot is handed out first afterwards.
    pub(crate) fn restore(&mut self, entries: &[(u32, u64)]) {
        assert_eq!(self.occupied, 0, "restore needs an empty table");
        self.keys.clear();
        self.keys.resize(self.capacity, NIL as u64);
        let mut used = SlotBits::new(self.capacity);
        for &(slot, key) in entries {
            assert!((slot as usize) < self.capacity && !used.get(slot));
            used.set(slot, true);
            self.keys[slot as usize] = key;
            self.index.insert(key, slot);
        }
        self.occupied = entries.len();
        self.free_head = NIL;
        for slot in (0..self.capacity as u32).rev() {
            if !used.get(slot) {
                self.keys[slot as usize] = u64::from(self.free_head);
                self.free_head = slot;
            }
        }
    }

    #[inline]
    pub(crate) fn find(&self, key: u64) -> Option<u32> {
        let keys = &self.keys;
        self.index.find(key, |s| keys[s as usize])
    }

    /// Slots holding a key (including unindexed ones not yet released).
    #[inline]
    pub(crate) fn occupied(&self) -> usize {
        self.occupied
    }

    #[inline]
    pub(crate) fn capacity(&self) -> usize {
        self.capacity
    }

    #[inline]
    pub(crate) fn is_full(&self) -> bool {
        self.occupied >= self.capacity
    }

    #[inline]
    pub(crate) fn key(&self, slot: u32) -> u64 {
        self.keys[slot as usize]
    }

    /// The key cached in `slot`, if the slot holds an indexed key.
    pub(crate) fn key_of(&self, slot: u32) -> Option<u64> {
        let key = *self.keys.get(slot as usize)?;
        (self.find(key) == Some(slot)).then_some(key)
    }

    /// Takes a free slot for `key` (not cached yet, table not full). The most recently
    /// released slot is reused first, so a miss that evicts reuses the victim's slot.
    pub(crate) fn insert(&mut self, key: u64) -> u32 {
        debug_assert!(!self.is_full());
        debug_assert!(self.find(key).is_none());
        let slot = if self.free_head != NIL {
            let slot = self.free_head;
            self.free_head = self.keys[slot as usize] as u32;
            self.keys[slot as usize] = key;
            slot
        } else {
            self.keys.push(key);
            (self.keys.len() - 1) as u32
        };
        self.index.insert(key, slot);
        self.occupied += 1;
        slot
    }

    /// Removes `slot` from the index only: lookups no longer find its key, but the
    /// slot stays occupied until [`Table::release_unindexed`].
    pub(crate) fn unindex(&mut self, slot: u32) {
        let keys = &self.keys;
        self.index
            .remove(keys[slot as usize], slot, |s| keys[s as usize]);
    }

    /// Returns an unindexed `slot` to the free list.
    pub(crate) fn release_unindexed(&mut self, slot: u32) {
        self.set_pinned(slot, false);
        self.keys[slot as usize] = u64::from(self.free_head);
        self.free_head = slot;
        self.occupied -= 1;
    }

    /// Forgets `slot`'s key and returns the slot to the free list.
    pub(crate) fn release(&mut self, slot: u32) {
        self.unindex(slot);
        self.release_unindexed(slot);
    }

    /// Heap bytes held (allocated capacity, not just the used part).
    pub(crate) fn memory_bytes(&self) -> usize {
        self.keys.capacity() * std::mem::size_of::<u64>()
            + self.index.memory_bytes()
            + self.pinned.memory_bytes()
    }
}

/// What a policy over one [`Table`] adds to it. The flow they share is [`touch`] and
/// [`access`]: look the key up, on a hit update the policy's state; on a miss make
/// room if the table is full, take a slot and file it in the policy's queues.
pub(crate) trait TablePolicy {
    fn table(&self) -> &Table;

    fn table_mut(&mut self) -> &mut Table;

    /// Updates the policy's state for a hit on `slot`.
    fn on_hit(&mut self, slot: u32);

    /// Frees one slot of the full table; returns the key evicted, if the slot freed
    /// held one.
    fn make_room(&mut self) -> Option<u64>;

    /// Files `slot`, just taken for `key`, in the policy's queues.
    fn place(&mut self, key: u64, slot: u32);

    /// Files `slot`, restored for `key` from a saved map, in the policy's queues
    /// (by default as a new block).
    fn place_restored(&mut self, key: u64, slot: u32) {
        self.place(key, slot);
    }
}

/// [`Policy::restore`](super::Policy::restore) of a [`TablePolicy`].
pub(crate) fn restore<P: TablePolicy>(policy: &mut P, entries: &[(u32, u64)]) {
    policy.table_mut().restore(entries);
    for &(slot, key) in entries {
        policy.place_restored(key, slot);
    }
}

/// [`Policy::touch`](super::Policy::touch) of a [`TablePolicy`].
#[inline]
pub(crate) fn touch<P: TablePolicy>(policy: &mut P, key: u64) -> Option<u32> {
    let slot = policy.table().find(key)?;
    policy.on_hit(slot);
    Some(slot)
}

/// [`Policy::access`](super::Policy::access) of a [`TablePolicy`]: every miss is
/// inserted, evicting one block when the table is full (a zero-capacity table
/// bypasses everything).
#[inline]
pub(crate) fn access<P: TablePolicy>(policy: &mut P, key: u64) -> Access {
    if let Some(slot) = touch(policy, key) {
        return Access::Hit { slot };
    }
    let table = policy.table();
    if table.capacity() == 0 {
        return Access::Bypassed;
    }
    let evicted = if table.is_full() {
        if table.pinned_count() >= table.occupied() {
            // every block is pinned: nothing can leave, so nothing can enter
            return Access::Bypassed;
        }
        policy.make_room()
    } else {
        None
    };
    let slot = policy.table_mut().insert(key);
    policy.place(key, slot);
    Access::Inserted { slot, evicted }
}

/// Two links per slot for doubly linked [`List`]s (8 bytes per slot). `prev` points
/// towards a list's head (newer end), `next` towards its tail (older end).
pub(crate) struct Links {
    prev: Vec<u32>,
    next: Vec<u32>,
}

impl Links {
    pub(crate) fn new(slots: usize) -> Self {
        Self {
            prev: vec![NIL; slots],
            next: vec![NIL; slots],
        }
    }

    /// The slot one step towards the head (newer) of `slot`'s list.
    #[inline]
    pub(crate) fn newer(&self, slot: u32) -> u32 {
        self.prev[slot as usize]
    }

    pub(crate) fn memory_bytes(&self) -> usize {
        (self.prev.capacity() + self.next.capacity()) * std::mem::size_of::<u32>()
    }
}

/// An intrusive doubly-linked list of slots: head is the newest end, tail the oldest.
#[derive(Clone, Copy, Debug)]
pub(crate) struct List {
    pub(crate) head: u32,
    pub(crate) tail: u32,
    pub(crate) len: usize,
}

impl List {
    pub(crate) const fn new() -> Self {
        Self {
            head: NIL,
            tail: NIL,
            len: 0,
        }
    }

    pub(crate) fn push_head(&mut self, links: &mut Links, slot: u32) {
        let old_head = self.head;
        links.prev[slot as usize] = NIL;
        links.next[slot as usize] = old_head;
        if old_head == NIL {
            self.tail = slot;
        } else {
            links.prev[old_head as usize] = slot;
        }
        self.head = slot;
        self.len += 1;
    }

    pub(crate) fn unlink(&mut self, links: &mut Links, slot: u32) {
        let prev = links.prev[slot as usize];
        let next = links.next[slot as usize];
        if prev == NIL {
            self.head = next;
        } else {
            links.next[prev as usize] = next;
        }
        if next == NIL {
            self.tail = prev;
        } else {
            links.prev[next as usize] = prev;
        }
        self.len -= 1;
    }

    pub(crate) fn move_to_head(&mut self, links: &mut Links, slot: u32) {
        if self.head != slot {
            self.unlink(links, slot);
            self.push_head(links, slot);
        }
    }

    /// The oldest slot, if any.
    #[inline]
    pub(crate) fn tail(&self) -> Option<u32> {
        (self.tail != NIL).then_some(self.tail)
    }
}

/// An intrusive singly-linked FIFO of slots over a shared `next` array (4 bytes per
/// slot): push at the newest end, pop at the oldest. No removal from the middle.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Queue {
    oldest: u32,
    newest: u32,
    pub(crate) len: usize,
}

impl Queue {
    pub(crate) const fn new() -> Self {
        Self {
            oldest: NIL,
            newest: NIL,
            len: 0,
        }
    }

    pub(crate) fn push(&mut self, next: &mut [u32], slot: u32) {
        next[slot as usize] = NIL;
        if self.newest == NIL {
            self.oldest = slot;
        } else {
            next[self.newest as usize] = slot;
        }
        self.newest = slot;
        self.len += 1;
    }

    pub(crate) fn pop(&mut self, next: &[u32]) -> Option<u32> {
        if self.oldest == NIL {
            return None;
        }
        let slot = self.oldest;
        self.oldest = next[slot as usize];
        if self.oldest == NIL {
            self.newest = NIL;
        }
        self.len -= 1;
        Some(slot)
    }
}

/// A [`Table`] whose occupied slots all sit on one [`List`], newest at the head: the
/// layout of LRU, FIFO and SIEVE. 22 bytes per slot (8 key, 8 links, 6 index).
pub(crate) struct ListTable {
    pub(crate) table: Table,
    pub(crate) links: Links,
    pub(crate) list: List,
}

impl ListTable {
    pub(crate) fn new(capacity: usize) -> Self {
        Self {
            table: Table::new(capacity),
            links: Links::new(capacity),
            list: List::new(),
        }
    }

    /// Links `slot`, just taken, at the head of the list.
    pub(crate) fn push_head(&mut self, slot: u32) {
        self.list.push_head(&mut self.links, slot);
    }

    /// Unlinks `slot` and returns it to the free list; returns the key it held.
    pub(crate) fn free(&mut self, slot: u32) -> u64 {
        self.list.unlink(&mut self.links, slot);
        let key = self.table.key(slot);
        self.table.release(slot);
        key
    }

    /// Evicts the oldest unpinned slot (pinned ones met at the tail move to the
    /// head); returns its key. The caller checked that an unpinned slot exists.
    pub(crate) fn evict_tail(&mut self) -> Option<u64> {
        loop {
            let victim = self.list.tail()?;
            if !self.table.is_pinned(victim) {
                return Some(self.free(victim));
            }
            self.list.move_to_head(&mut self.links, victim);
        }
    }

    /// Drops `key` if it is cached; returns the slot it held.
    pub(crate) fn remove(&mut self, key: u64) -> Option<u32> {
        let slot = self.table.find(key)?;
        self.free(slot);
        Some(slot)
    }

    pub(crate) fn memory_bytes(&self) -> usize {
        self.table.memory_bytes() + self.links.memory_bytes()
    }
}

/// The [`Policy`](super::Policy) methods every [`TablePolicy`] answers the same way
/// (`access`, `touch`, `get`, `capacity`), for use inside its `impl Policy` block.
macro_rules! table_policy_methods {
    () => {
        fn access(&mut self, key: u64) -> $crate::policy::Access {
            $crate::policy::table::access(self, key)
        }

        fn touch(&mut self, key: u64) -> Option<u32> {
            $crate::policy::table::touch(self, key)
        }

        fn get(&self, key: u64) -> Option<u32> {
            $crate::policy::table::TablePolicy::table(self).find(key)
        }

        fn capacity(&self) -> usize {
            $crate::policy::table::TablePolicy::table(self).capacity()
        }

        fn key_of(&self, slot: u32) -> Option<u64> {
            $crate::policy::table::TablePolicy::table(self).key_of(slot)
        }

        fn set_pinned(&mut self, slot: u32, pinned: bool) {
            $crate::policy::table::TablePolicy::table_mut(self).set_pinned(slot, pinned)
        }

        fn pinned(&self) -> usize {
            $crate::policy::table::TablePolicy::table(self).pinned_count()
        }

        fn restore(&mut self, entries: &[(u32, u64)]) {
            $crate::policy::table::restore(self, entries)
        }
    };
}
pub(crate) use table_policy_methods;

/// Defines a public policy over one [`ListTable`] that admits every miss and evicts
/// the list's tail: LRU and FIFO, which differ only in whether a hit moves the block
/// to the head. Written once here so the two cannot drift apart.
macro_rules! list_policy {
    (
        $(#[$attr:meta])*
        pub struct $ty:ident;
        name: $name:literal,
        new_doc: $new_doc:literal,
        hit_moves_to_head: $move_to_head:literal $(,)?
    ) => {
        $(#[$attr])*
        pub struct $ty {
            slots: $crate::policy::table::ListTable,
        }

        impl $ty {
            #[doc = $new_doc]
            pub fn new(capacity: usize) -> Self {
                Self {
                    slots: $crate::policy::table::ListTable::new(capacity),
                }
            }
        }

        impl $crate::policy::table::TablePolicy for $ty {
            fn table(&self) -> &$crate::policy::table::Table {
                &self.slots.table
            }

            fn table_mut(&mut self) -> &mut $crate::policy::table::Table {
                &mut self.slots.table
            }

            fn on_hit(&mut self, slot: u32) {
                if $move_to_head {
                    let slots = &mut self.slots;
                    slots.list.move_to_head(&mut slots.links, slot);
                }
            }

            fn make_room(&mut self) -> Option<u64> {
                self.slots.evict_tail()
            }

            fn place(&mut self, _key: u64, slot: u32) {
                self.slots.push_head(slot);
            }
        }

        impl $crate::policy::Policy for $ty {
            fn name(&self) -> &'static str {
                $name
            }

            $crate::policy::table::table_policy_methods!();

            fn remove(&mut self, key: u64) -> Option<u32> {
                self.slots.remove(key)
            }

            fn len(&self) -> usize {
                self.slots.table.occupied()
            }

            fn memory_bytes(&self) -> usize {
                self.slots.memory_bytes()
            }
        }
    };
}
pub(crate) use list_policy;

/// One bit per slot (SIEVE's visited bit, 2Q's queue tag).
pub(crate) struct SlotBits {
    words: Vec<u64>,
}

impl SlotBits {
    pub(crate) fn new(slots: usize) -> Self {
        Self {
            words: vec![0; slots.div_ceil(64)],
        }
    }

    #[inline]
    pub(crate) fn get(&self, slot: u32) -> bool {
        self.words[slot as usize / 64] & (1 << (slot % 64)) != 0
    }

    #[inline]
    pub(crate) fn set(&mut self, slot: u32, value: bool) {
        let word = &mut self.words[slot as usize / 64];
        if value {
            *word |= 1 << (slot % 64);
        } else {
            *word &= !(1 << (slot % 64));
        }
    }

    pub(crate) fn memory_bytes(&self) -> usize {
        self.words.capacity() * std::mem::size_of::<u64>()
    }
}
