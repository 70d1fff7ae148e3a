//! RAID 1: an n-way mirror; one data chunk per stripe, copied on every member.

use super::{Layout, Scheme};
use crate::RaidLevel;

/// N-way mirror: every position holds every block.
#[derive(Debug)]
pub struct Raid1 {
    /// Number of members (copies).
    pub members: usize,
}

impl Layout for Raid1 {
    fn level(&self) -> RaidLevel {
        RaidLevel::Raid1
    }
    fn member_count(&self) -> usize {
        self.members
    }
    fn data_chunks(&self) -> usize {
        1
    }
    fn redundancy(&self) -> usize {
        self.members - 1
    }
    fn scheme(&self) -> Scheme {
        Scheme::Mirror
    }
    fn data_positions(&self, _stripe: u64, _index: usize) -> Vec<usize> {
        (0..self.members).collect()
    }
}
