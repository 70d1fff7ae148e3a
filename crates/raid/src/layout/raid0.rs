//! RAID 0: data chunks striped over all members, no redundancy.

use super::{Layout, Scheme};
use crate::RaidLevel;

/// Plain striping: chunk `d` of every stripe lives on position `d`.
#[derive(Debug)]
pub struct Raid0 {
    /// Number of members.
    pub members: usize,
}

impl Layout for Raid0 {
    fn level(&self) -> RaidLevel {
        RaidLevel::Raid0
    }
    fn member_count(&self) -> usize {
        self.members
    }
    fn data_chunks(&self) -> usize {
        self.members
    }
    fn redundancy(&self) -> usize {
        0
    }
    fn scheme(&self) -> Scheme {
        Scheme::Striped
    }
    fn data_positions(&self, _stripe: u64, index: usize) -> Vec<usize> {
        vec![index]
    }
}
