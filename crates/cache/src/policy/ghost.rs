//! A ghost queue of recently evicted keys, kept as two rotating Bloom filters.
//!
//! An exact ghost FIFO costs a key, a queue position and an index bucket per entry
//! (about 14 bytes); this one costs about 13 bits per remembered key. Keys are added
//! to the current generation; when it has taken `generation_keys` keys the older
//! generation is cleared and becomes the current one. A key is therefore remembered
//! for between `generation_keys` and `2 * generation_keys` later insertions (on
//! average `1.5 * generation_keys`), and a key never inserted answers "present" with
//! a probability of about 1-2% (a false positive only promotes a block a little
//! early, it never breaks correctness). Keys cannot be removed.

use crate::hash::{mix64, SALT_GHOST};

/// Bits per key in each generation and hashes per key: about 0.8% false positives
/// per full generation.
const BITS_PER_KEY: usize = 10;
const HASHES: u32 = 7;

pub(crate) struct Ghost {
    /// Two generations of `words_per_generation` words each.
    words: Vec<u64>,
    words_per_generation: usize,
    bits_per_generation: u64,
    generation_keys: usize,
    current: usize,
    current_keys: usize,
}

impl Ghost {
    /// A ghost that remembers about `keys` evictions (between 2/3 and 4/3 of it).
    pub(crate) fn new(keys: usize) -> Self {
        let generation_keys = (keys * 2).div_ceil(3).max(1);
        let words_per_generation = (generation_keys * BITS_PER_KEY).div_ceil(64).max(1);
        let bits_per_generation = (words_per_generation * 64).min(u32::MAX as usize) as u64;
        Self {
            words: vec![0; 2 * words_per_generation],
            words_per_generation,
            bits_per_generation,
            generation_keys,
            current: 0,
            current_keys: 0,
        }
    }

    #[inline]
    fn positions(&self, key: u64) -> impl Iterator<Item = usize> {
        let h = mix64(key ^ SALT_GHOST);
        let h1 = h as u32;
        let h2 = ((h >> 32) as u32) | 1;
        let bits = self.bits_per_generation;
        (0..HASHES)
            .map(move |i| ((u64::from(h1.wrapping_add(i.wrapping_mul(h2))) * bits) >> 32) as usize)
    }

    fn generation_has(&self, generation: usize, key: u64) -> bool {
        let base = generation * self.words_per_generation;
        self.positions(key)
            .all(|bit| self.words[base + bit / 64] & (1 << (bit % 64)) != 0)
    }

    /// Whether `key` was inserted recently (see the module doc for "recently").
    pub(crate) fn contains(&self, key: u64) -> bool {
        self.generation_has(0, key) || self.generation_has(1, key)
    }

    /// Remembers `key`, rotating generations when the current one is full.
    pub(crate) fn insert(&mut self, key: u64) {
        if self.current_keys >= self.generation_keys {
            self.current ^= 1;
            let base = self.current * self.words_per_generation;
            self.words[base..base + self.words_per_generation].fill(0);
            self.current_keys = 0;
        }
        let base = self.current * self.words_per_generation;
        let positions: [usize; HASHES as usize] = {
            let mut p = [0; HASHES as usize];
            for (slot, bit) in p.iter_mut().zip(self.positions(key)) {
                *slot = bit;
            }
            p
        };
        for bit in positions {
            self.words[base + bit / 64] |= 1 << (bit % 64);
        }
        self.current_keys += 1;
    }

    pub(crate) fn memory_bytes(&self) -> usize {
        self.words.capacity() * std::mem::size_of::<u64>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remembers_recent_and_forgets_old() {
        let mut g = Ghost::new(1000);
        for k in 0..1000 {
            g.insert(k);
        }
        // The last generation's worth is always remembered.
        assert!((334..1000).all(|k| g.contains(k)));
        for k in 1000..3000 {
            g.insert(k);
        }
        let old = (0..1000).filter(|&k| g.contains(k)).count();
        assert!(old < 40, "{old} of 1000 forgotten keys still present");
        let never = (1_000_000..1_010_000).filter(|&k| g.contains(k)).count();
        assert!(never < 250, "false positive rate too high: {never} / 10000");
    }
}
