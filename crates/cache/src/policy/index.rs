//! An open-addressing hash index from a block key to its slot.
//!
//! Buckets are `u32`: the slot number in the low bits and, in the high bits the slot
//! number does not need, a fingerprint of the key's hash, so most probes that do not
//! match are rejected without reading the key from the slot array (up to 1 TiB of
//! cache at 64 KiB blocks leaves 8 or more fingerprint bits). 1.5 buckets per slot
//! (6 bytes); the keys themselves live once, in the table's key array. Linear
//! probing with backward-shift deletion: no tombstones, so lookups never slow down
//! as entries come and go.

use crate::hash::{mix64, reduce};

/// The empty bucket (and the "no slot" link value everywhere in this module tree).
pub(crate) const NIL: u32 = u32::MAX;

/// Buckets per entry, as a ratio: 3/2 keeps the load factor at or below 2/3.
const BUCKETS_NUM: usize = 3;
const BUCKETS_DEN: usize = 2;

pub(crate) struct KeyIndex {
    buckets: Vec<u32>,
    /// Bits holding the slot number: every slot is below `2^slot_bits - 1`, so a
    /// bucket never equals `NIL`.
    slot_bits: u32,
    slot_mask: u32,
}

impl KeyIndex {
    /// An index able to hold `entries` keys (slots `0..entries`, `entries < 2^32 - 1`)
    /// at a load factor of at most 2/3.
    pub(crate) fn with_entries(entries: usize) -> Self {
        assert!(entries < NIL as usize);
        let n = (entries * BUCKETS_NUM / BUCKETS_DEN).max(entries + 1);
        let slot_bits = (32 - (entries as u32).leading_zeros()).max(1);
        Self {
            buckets: vec![NIL; n],
            slot_bits,
            slot_mask: NIL.checked_shr(32 - slot_bits).unwrap_or(NIL),
        }
    }

    /// The home bucket (from the hash's high bits) and the fingerprint (its low bits,
    /// moved above the slot bits).
    #[inline]
    fn place(&self, key: u64) -> (usize, u32) {
        let h = mix64(key);
        let fingerprint = (h as u32).checked_shl(self.slot_bits).unwrap_or(0);
        (reduce(h, self.buckets.len()), fingerprint)
    }

    #[inline]
    fn step(&self, i: usize) -> usize {
        if i + 1 == self.buckets.len() {
            0
        } else {
            i + 1
        }
    }

    /// The slot holding `key`; `key_of` reads a slot's key from the key array.
    #[inline]
    pub(crate) fn find(&self, key: u64, key_of: impl Fn(u32) -> u64) -> Option<u32> {
        let (mut i, fingerprint) = self.place(key);
        loop {
            let bucket = self.buckets[i];
            if bucket == NIL {
                return None;
            }
            let slot = bucket & self.slot_mask;
            if bucket & !self.slot_mask == fingerprint && key_of(slot) == key {
                return Some(slot);
            }
            i = self.step(i);
        }
    }

    /// Records `slot` for `key`, which the caller guarantees is not indexed yet.
    pub(crate) fn insert(&mut self, key: u64, slot: u32) {
        debug_assert!(slot < self.slot_mask);
        let (mut i, fingerprint) = self.place(key);
        while self.buckets[i] != NIL {
            i = self.step(i);
        }
        self.buckets[i] = slot | fingerprint;
    }

    /// Forgets `slot`, indexed under `key`. Later entries of the probe run are shifted
    /// back so that every entry stays reachable from its home bucket.
    pub(crate) fn remove(&mut self, key: u64, slot: u32, key_of: impl Fn(u32) -> u64) {
        let (mut hole, _) = self.place(key);
        while self.buckets[hole] & self.slot_mask != slot {
            debug_assert_ne!(self.buckets[hole], NIL, "slot {slot} is not indexed");
            hole = self.step(hole);
        }
        let mut j = hole;
        loop {
            j = self.step(j);
            let moving = self.buckets[j];
            if moving == NIL {
                break;
            }
            let (home, _) = self.place(key_of(moving & self.slot_mask));
            // `moving` may fill the hole unless its home lies cyclically in (hole, j].
            let home_in_between = if hole <= j {
                hole < home && home <= j
            } else {
                hole < home || home <= j
            };
            if !home_in_between {
                self.buckets[hole] = moving;
                hole = j;
            }
        }
        self.buckets[hole] = NIL;
    }

    pub(crate) fn memory_bytes(&self) -> usize {
        self.buckets.capacity() * std::mem::size_of::<u32>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::Rng;
    use std::collections::HashMap;

    #[test]
    fn matches_a_hash_map_under_churn() {
        for entries in [1usize, 2, 3, 7, 64, 255, 256, 1000] {
            let mut keys = vec![0u64; entries];
            let mut index = KeyIndex::with_entries(entries);
            let mut model: HashMap<u64, u32> = HashMap::new();
            let mut free: Vec<u32> = (0..entries as u32).collect();
            let mut rng = Rng::new(entries as u64);
            for _ in 0..20_000 {
                // Small key range so keys collide on homes and come back often.
                let key = rng.below(3 * entries as u64 + 3) * 0x1_0000_0001;
                let found = index.find(key, |s| keys[s as usize]);
                assert_eq!(found, model.get(&key).copied());
                match found {
                    Some(slot) => {
                        index.remove(key, slot, |s| keys[s as usize]);
                        model.remove(&key);
                        free.push(slot);
                    }
                    None => {
                        if let Some(slot) = free.pop() {
                            keys[slot as usize] = key;
                            index.insert(key, slot);
                            model.insert(key, slot);
                        }
                    }
                }
            }
            for (&k, &s) in &model {
                assert_eq!(index.find(k, |s| keys[s as usize]), Some(s));
            }
        }
    }
}
