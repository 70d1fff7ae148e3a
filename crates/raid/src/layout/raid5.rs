//! RAID 5, left-symmetric (md's default): parity rotates backwards one position per
//! stripe and data chunks follow the parity chunk, wrapping around.

use super::{Layout, Scheme};
use crate::RaidLevel;

/// Single parity with even rotation.
#[derive(Debug)]
pub struct Raid5 {
    /// Number of members.
    pub members: usize,
}

impl Layout for Raid5 {
    fn level(&self) -> RaidLevel {
        RaidLevel::Raid5
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
        vec![(n - 1 - stripe % n) as usize]
    }
}
