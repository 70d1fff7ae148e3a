//! RAID F1: RAID 5 whose parity placement is skewed onto one "hot" member so that
//! the members of an all-SSD pool do not wear out at the same time.
//!
//! Placement, over a cycle of `2n - 1` stripes: the first `n` stripes rotate parity
//! over every member exactly like left-symmetric RAID 5; the remaining `n - 1`
//! stripes all put parity on the hot member (the last position, `n - 1`). The hot
//! member therefore holds `n / (2n - 1)` of all parity (4 of 7 stripes with four
//! members) and every other member `1 / (2n - 1)`. Small random writes update one
//! data chunk and the parity chunk, so the hot member takes roughly twice the writes
//! of the others and reaches its endurance limit first; replace it then (the
//! replacement becomes the hot member again, while the others are at different
//! points of their life). Data chunks follow the parity chunk as in RAID 5.

use super::{Layout, Scheme};
use crate::RaidLevel;

/// Single parity, skewed toward the last position.
#[derive(Debug)]
pub struct F1 {
    /// Number of members.
    pub members: usize,
}

impl F1 {
    /// The position that receives the extra parity.
    pub fn hot_position(&self) -> usize {
        self.members - 1
    }
}

impl Layout for F1 {
    fn level(&self) -> RaidLevel {
        RaidLevel::F1
    }
    fn member_count(&self) -> usize {
        self.members
    }
    fn data_chunks(&self) -> usize {
        self.members - 1
    }
    fn redundancy(&self) -> usize {
        1
    }
    fn scheme(&self) -> Scheme {
        Scheme::Parity { parity_count: 1 }
    }
    fn data_positions(&self, stripe: u64, index: usize) -> Vec<usize> {
        let p = self.parity_positions(stripe)[0];
        vec![(p + 1 + index) % self.members]
    }
    fn parity_positions(&self, stripe: u64) -> Vec<usize> {
        let n = self.members as u64;
        let c = stripe % (2 * n - 1);
        if c < n {
            vec![(n - 1 - c) as usize]
        } else {
            vec![self.hot_position()]
        }
    }
    fn cycle_stripes(&self) -> u64 {
        2 * self.members as u64 - 1
    }
}
