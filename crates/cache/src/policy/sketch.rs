//! A frequency sketch: how often each key was seen recently, approximately.
//!
//! Count-min over four rows of 4-bit counters (saturating at 15), indexed by
//! independent hashes of the key; the estimate is the smallest of the four. After
//! `sample` increments every counter is halved, so the sketch describes the last
//! few cache-fulls of accesses and old popularity fades (TinyLFU's reset, Einziger
//! et al., ACM ToS 2017). About 2 bytes per cache block.

use crate::hash::{mix64, SALT_SKETCH};

const ROWS: usize = 4;
const MASK_LOW: u64 = 0x7777_7777_7777_7777;

pub(crate) struct Sketch {
    /// `ROWS` rows of `width` counters, 16 counters per word.
    words: Vec<u64>,
    width_mask: u64,
    words_per_row: usize,
    increments: usize,
    sample: usize,
}

impl Sketch {
    /// A sketch for a cache of `capacity` blocks (width: `capacity` rounded up to a
    /// power of two, at least 64; halving after `10 * capacity` increments).
    pub(crate) fn new(capacity: usize) -> Self {
        let width = capacity.max(64).next_power_of_two();
        let words_per_row = width / 16;
        Self {
            words: vec![0; ROWS * words_per_row],
            width_mask: width as u64 - 1,
            words_per_row,
            increments: 0,
            sample: capacity.max(64) * 10,
        }
    }

    #[inline]
    fn positions(&self, key: u64) -> [(usize, u32); ROWS] {
        let h = mix64(key ^ SALT_SKETCH);
        let (h1, h2) = (h, (h >> 32) | 1);
        let mut out = [(0, 0); ROWS];
        for (row, o) in out.iter_mut().enumerate() {
            let c = h1
                .wrapping_add((row as u64).wrapping_mul(h2))
                .rotate_left(17 * row as u32)
                & self.width_mask;
            let word = row * self.words_per_row + (c / 16) as usize;
            *o = (word, ((c % 16) * 4) as u32);
        }
        out
    }

    /// The estimated count of `key` (0..=15).
    pub(crate) fn estimate(&self, key: u64) -> u8 {
        self.positions(key)
            .iter()
            .map(|&(w, shift)| ((self.words[w] >> shift) & 0xf) as u8)
            .min()
            .unwrap_or(0)
    }

    /// Counts one access to `key`.
    pub(crate) fn increment(&mut self, key: u64) {
        for (w, shift) in self.positions(key) {
            if (self.words[w] >> shift) & 0xf < 15 {
                self.words[w] += 1 << shift;
            }
        }
        self.increments += 1;
        if self.increments >= self.sample {
            self.increments = 0;
            for w in &mut self.words {
                *w = (*w >> 1) & MASK_LOW;
            }
        }
    }

    pub(crate) fn memory_bytes(&self) -> usize {
        self.words.capacity() * std::mem::size_of::<u64>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_saturate_and_fade() {
        let mut s = Sketch::new(1000);
        for _ in 0..5 {
            s.increment(42);
        }
        assert!(s.estimate(42) >= 5);
        assert!(s.estimate(43) <= 1);
        for _ in 0..100 {
            s.increment(7);
        }
        assert_eq!(s.estimate(7), 15);
        // enough other accesses to halve twice
        for k in 0..20_000u64 {
            s.increment(1_000_000 + k);
        }
        assert!(s.estimate(7) <= 7, "{}", s.estimate(7));
    }
}
