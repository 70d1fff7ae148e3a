//! RAID 6: P and Q (Reed-Solomon over GF(2^8)) rotate like left-symmetric RAID 5;
//! Q sits right after P and the data chunks follow Q.

use super::{Layout, Scheme};
use crate::RaidLevel;

/// Double parity with even rotation.
#[derive(Debug)]
pub struct Raid6 {
    /// Number of members.
    pub members: usize,
}

impl Layout for Raid6 {
    fn level(&self) -> RaidLevel {
        RaidLevel::Raid6
    }
    fn member_count(&self) -> usize {
        self.members
    }
    fn data_chunks(&self) -> usize {
        self.members - 2
    }
    fn redundancy(&self) -> usize {
        2
    }
    fn scheme(&self) -> Scheme {
        Scheme::Parity { parity_count: 2 }
    }
    fn data_positions(&self, stripe: u64, index: usize) -> Vec<usize> {
        let p = self.parity_positions(stripe)[0];
        vec![(p + 2 + index) % self.members]
    }
    fn parity_positions(&self, stripe: u64) -> Vec<usize> {
        let n = self.members as u64;
        let p = (n - 1 - stripe % n) as usize;
        vec![p, (p + 1) % self.members]
    }
}
