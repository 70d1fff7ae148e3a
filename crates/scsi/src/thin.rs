//! Thin provisioning soft threshold (SBC-4 logical block provisioning thresholds).
//!
//! A thin LU with a configured threshold percentage watches how much of its
//! backing store it has allocated. The threshold is a share of what the LU can
//! actually get: its capacity, or less when its file system or pool holds less
//! (allocated plus still available). So it is reached before the store runs out,
//! whether the LU is larger than its file system or not.
//!
//! Crossing it upwards establishes THIN PROVISIONING SOFT THRESHOLD REACHED (a
//! unit attention) on every I_T nexus, once per crossing, logs it and tells the
//! target's event subscribers; falling back below (after UNMAP) re-arms it. The
//! use is sampled after every [`CHECK_BYTES`] written (an fstat and an fstatfs,
//! no I/O) and after every UNMAP or failed allocation, so the hot path only adds
//! to one atomic counter.
//!
//! What the initiator reads: the LBP VPD page's THRESHOLD EXPONENT, and in the
//! logical block provisioning mode page (1Ch/02h) one enabled soft threshold
//! descriptor, armed on increase, on the used LBA mapping resource, whose count
//! (in threshold sets of 2^exponent blocks) is the current effective threshold.

use crate::sense::codes;
use block::{Geometry, Provisioning};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};

/// Bytes written between two samples of the LU's space use.
pub const CHECK_BYTES: u64 = 1 << 20;

/// Something an operator must hear about a logical unit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LuEvent {
    /// The LU's allocated space crossed its soft threshold upwards.
    ThinThresholdReached {
        /// The LUN.
        lun: u64,
        /// Bytes allocated.
        mapped_bytes: u64,
        /// Bytes the threshold stands at.
        threshold_bytes: u64,
        /// Bytes the backing store could still give.
        available_bytes: u64,
    },
    /// A write could not get space: the LU's backing store is full.
    ThinOutOfSpace {
        /// The LUN.
        lun: u64,
        /// Bytes allocated.
        mapped_bytes: u64,
    },
}

/// The soft threshold state of one LU.
pub(crate) struct ThinThreshold {
    /// Configured share of the reachable space, in percent (1..=100); 0: off.
    percent: AtomicU8,
    /// The threshold was crossed and not yet re-armed.
    reached: AtomicBool,
    /// Bytes written since the last sample.
    pending_bytes: AtomicU64,
    /// Out-of-space was reported since the use last fell (one event per episode).
    out_of_space: AtomicBool,
}

/// What a sample found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Crossing {
    /// Nothing changed.
    None,
    /// The use went over the threshold.
    Up {
        mapped_bytes: u64,
        threshold_bytes: u64,
        available_bytes: u64,
    },
    /// The use fell back below it (re-armed).
    Down,
}

impl ThinThreshold {
    /// A threshold at `percent` of the reachable space (None or 0: no threshold).
    pub fn new(percent: Option<u8>) -> ThinThreshold {
        ThinThreshold {
            percent: AtomicU8::new(percent.unwrap_or(0).min(100)),
            reached: AtomicBool::new(false),
            pending_bytes: AtomicU64::new(0),
            out_of_space: AtomicBool::new(false),
        }
    }

    fn percent(&self) -> Option<u8> {
        Some(self.percent.load(Ordering::Relaxed)).filter(|p| *p > 0)
    }

    /// The configured percentage, if any.
    pub fn get(&self) -> Option<u8> {
        self.percent()
    }

    /// Sets (or with None or 0 clears) the threshold; it is re-armed.
    pub fn set(&self, percent: Option<u8>) {
        self.percent
            .store(percent.unwrap_or(0).min(100), Ordering::Relaxed);
        self.reached.store(false, Ordering::Relaxed);
        self.pending_bytes.store(CHECK_BYTES, Ordering::Relaxed);
    }

    /// The LBP VPD THRESHOLD EXPONENT for `geo`: the smallest power of two of
    /// blocks per threshold set (at least 2: zero would say the LU has no
    /// thresholds) that lets a 32-bit count cover the whole LU.
    pub fn exponent(geo: &Geometry) -> u8 {
        let mut e = 1u8;
        while e < 63 && (geo.block_count >> e) > u32::MAX as u64 {
            e += 1;
        }
        e
    }

    /// The threshold in bytes for the current space use `p` of an LU of `geo`.
    pub fn threshold_bytes(&self, geo: &Geometry, p: &Provisioning) -> Option<u64> {
        let pct = self.percent()? as u128;
        let reachable = geo
            .size_bytes()
            .min(p.mapped_bytes.saturating_add(p.available_bytes));
        Some((reachable as u128 * pct / 100) as u64)
    }

    /// The mode page descriptor's THRESHOLD COUNT: the threshold in threshold sets.
    pub fn count(&self, geo: &Geometry, p: Option<&Provisioning>) -> u32 {
        let bytes = match p {
            Some(p) => self.threshold_bytes(geo, p),
            None => self
                .percent()
                .map(|pct| (geo.size_bytes() as u128 * pct as u128 / 100) as u64),
        };
        let Some(bytes) = bytes else {
            return 0;
        };
        let set_bytes = (geo.block_size_bytes as u64) << Self::exponent(geo);
        u32::try_from(bytes / set_bytes.max(1)).unwrap_or(u32::MAX)
    }

    /// Counts `bytes` written; true when a sample is due.
    #[inline]
    pub fn note_written(&self, bytes: u64) -> bool {
        if self.percent.load(Ordering::Relaxed) == 0 {
            return false;
        }
        let before = self.pending_bytes.fetch_add(bytes, Ordering::Relaxed);
        before + bytes >= CHECK_BYTES
    }

    /// Compares the use `p` with the threshold and flips the state on a crossing.
    pub fn sample(&self, geo: &Geometry, p: &Provisioning) -> Crossing {
        self.pending_bytes.store(0, Ordering::Relaxed);
        let Some(threshold) = self.threshold_bytes(geo, p) else {
            return Crossing::None;
        };
        if p.mapped_bytes >= threshold {
            if !self.reached.swap(true, Ordering::AcqRel) {
                return Crossing::Up {
                    mapped_bytes: p.mapped_bytes,
                    threshold_bytes: threshold,
                    available_bytes: p.available_bytes,
                };
            }
        } else if self.reached.swap(false, Ordering::AcqRel) {
            self.out_of_space.store(false, Ordering::Relaxed);
            return Crossing::Down;
        }
        Crossing::None
    }

    /// After a LOGICAL UNIT RESET (which drops queued unit attentions): a use
    /// still over the threshold is reported again at the next sample, due at the
    /// next write.
    pub fn rearm(&self) {
        self.reached.store(false, Ordering::Relaxed);
        self.pending_bytes.store(CHECK_BYTES, Ordering::Relaxed);
    }

    /// A write found no space; true the first time since the use last fell.
    pub fn ran_out(&self) -> bool {
        !self.out_of_space.swap(true, Ordering::AcqRel)
    }
}

/// The unit attention a crossing establishes: its INFORMATION is the offset of
/// the descriptor that fired in the provisioning mode subpage.
pub(crate) const REACHED: crate::sense::Sense =
    codes::THIN_SOFT_THRESHOLD_REACHED.with_information(crate::mode::LBP_DESCRIPTOR_OFFSET);

#[cfg(test)]
mod tests {
    use super::*;

    fn geo(blocks: u64) -> Geometry {
        Geometry {
            block_size_bytes: 512,
            block_count: blocks,
            thin: true,
            volatile_cache: false,
            optimal_io_blocks: 8,
            max_io_blocks: 2048,
        }
    }

    #[test]
    fn crossing_is_reported_once_and_rearms() {
        let t = ThinThreshold::new(Some(50));
        let g = geo(2048); // 1 MiB
        let p = |m| Provisioning {
            mapped_bytes: m,
            available_bytes: 10 << 20,
        };
        assert_eq!(t.sample(&g, &p(100 << 10)), Crossing::None);
        assert!(matches!(t.sample(&g, &p(600 << 10)), Crossing::Up { .. }));
        assert_eq!(t.sample(&g, &p(700 << 10)), Crossing::None);
        assert_eq!(t.sample(&g, &p(10 << 10)), Crossing::Down);
        assert!(matches!(t.sample(&g, &p(512 << 10)), Crossing::Up { threshold_bytes, .. } if threshold_bytes == 512 << 10));
    }

    #[test]
    fn a_small_file_system_lowers_the_threshold() {
        let t = ThinThreshold::new(Some(80));
        let g = geo(1 << 21); // 1 GiB LU on a file system with 100 MiB in all
        let p = Provisioning {
            mapped_bytes: 81 << 20,
            available_bytes: 19 << 20,
        };
        assert_eq!(t.threshold_bytes(&g, &p), Some(80 << 20));
        assert!(matches!(t.sample(&g, &p), Crossing::Up { .. }));
        assert_eq!(t.count(&g, Some(&p)), (80 << 20) / 1024, "sets of two blocks");
    }

    #[test]
    fn exponent_keeps_the_count_in_32_bits() {
        assert_eq!(ThinThreshold::exponent(&geo(1 << 20)), 1, "0 would mean no thresholds");
        assert_eq!(ThinThreshold::exponent(&geo(1 << 40)), 9);
        let t = ThinThreshold::new(Some(100));
        assert!(t.count(&geo(1 << 40), None) <= u32::MAX);
        assert!(!ThinThreshold::new(None).note_written(1 << 30));
        assert!(ThinThreshold::new(Some(10)).note_written(CHECK_BYTES));
    }
}
