//! Per-frame sector bitmaps packed at `sectors_per_block` bits per frame (a power of
//! two up to 64, so a frame's bits never straddle a word).

pub(crate) struct FrameBits {
    words: Vec<u64>,
    spb: u32,
}

impl FrameBits {
    pub(crate) fn new(frames: usize, spb: u32) -> Self {
        debug_assert!(spb.is_power_of_two() && spb <= 64);
        Self {
            words: vec![0; (frames * spb as usize).div_ceil(64)],
            spb,
        }
    }

    fn mask(&self) -> u64 {
        if self.spb == 64 {
            u64::MAX
        } else {
            (1u64 << self.spb) - 1
        }
    }

    #[inline]
    pub(crate) fn get(&self, frame: u32) -> u64 {
        let bit = frame as u64 * self.spb as u64;
        (self.words[(bit / 64) as usize] >> (bit % 64)) & self.mask()
    }

    #[inline]
    pub(crate) fn set(&mut self, frame: u32, value: u64) {
        let bit = frame as u64 * self.spb as u64;
        let m = self.mask();
        let w = &mut self.words[(bit / 64) as usize];
        *w = (*w & !(m << (bit % 64))) | ((value & m) << (bit % 64));
    }

    pub(crate) fn memory_bytes(&self) -> usize {
        self.words.capacity() * 8
    }
}

/// The bitmap of sectors `[first, first + count)` of a block.
#[inline]
pub(crate) fn range_mask(first: u32, count: u32) -> u64 {
    if count >= 64 {
        u64::MAX
    } else {
        ((1u64 << count) - 1) << first
    }
}

/// The one run from the first set bit of `mask` to its last, as (first, count);
/// none for an empty mask. One read of a frame's sectors in use spans the
/// sectors between them too, never those before the first or after the last.
pub(crate) fn hull(mask: u64) -> Option<(u32, u32)> {
    (mask != 0).then(|| {
        let first = mask.trailing_zeros();
        (first, 64 - mask.leading_zeros() - first)
    })
}

/// The runs of set bits of `mask`, lowest first, as (first bit, length).
pub(crate) fn runs(mask: u64) -> impl Iterator<Item = (u32, u32)> {
    let mut m = mask;
    std::iter::from_fn(move || {
        if m == 0 {
            return None;
        }
        let first = m.trailing_zeros();
        let n = (!(m >> first)).trailing_zeros();
        m &= !range_mask(first, n);
        Some((first, n))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hull_spans_first_to_last_set_bit() {
        assert_eq!(hull(0), None);
        assert_eq!(hull(0b1011_0110), Some((1, 7)));
        assert_eq!(hull(u64::MAX), Some((0, 64)));
        assert_eq!(hull(1 << 63), Some((63, 1)));
    }

    #[test]
    fn runs_of_set_bits() {
        assert_eq!(runs(0).count(), 0);
        assert_eq!(
            runs(0b1011_0110).collect::<Vec<_>>(),
            vec![(1, 2), (4, 2), (7, 1)]
        );
        assert_eq!(runs(u64::MAX).collect::<Vec<_>>(), vec![(0, 64)]);
        assert_eq!(runs(1 << 63).collect::<Vec<_>>(), vec![(63, 1)]);
    }

    #[test]
    fn frames_do_not_disturb_each_other() {
        for spb in [1u32, 2, 16, 32, 64] {
            let mut b = FrameBits::new(10, spb);
            for f in 0..10 {
                b.set(f, u64::MAX - f as u64);
            }
            for f in 0..10 {
                let m = if spb == 64 { u64::MAX } else { (1 << spb) - 1 };
                assert_eq!(b.get(f), (u64::MAX - f as u64) & m);
            }
        }
        assert_eq!(range_mask(2, 3), 0b11100);
        assert_eq!(range_mask(0, 64), u64::MAX);
    }
}
