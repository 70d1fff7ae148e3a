//! RAID 10: a stripe over two-way mirror pairs (positions 2i and 2i+1 mirror each other).

use super::{Layout, Scheme};
use crate::RaidLevel;

/// Stripe of mirrors ("near 2" layout): data chunk `d` lives on positions `2d` and `2d+1`.
#[derive(Debug)]
pub struct Raid10 {
    /// Number of members (even).
    pub members: usize,
}

impl Layout for Raid10 {
    fn level(&self) -> RaidLevel {
        RaidLevel::Raid10
    }
    fn member_count(&self) -> usize {
        self.members
    }
    fn data_chunks(&self) -> usize {
        self.members / 2
    }
    /// Guaranteed tolerance is one member; one member of every pair may fail.
    fn redundancy(&self) -> usize {
        1
    }
    fn scheme(&self) -> Scheme {
        Scheme::Mirror
    }
    fn data_positions(&self, _stripe: u64, index: usize) -> Vec<usize> {
        vec![2 * index, 2 * index + 1]
    }
    fn cycle_stripes(&self) -> u64 {
        1
    }
}
