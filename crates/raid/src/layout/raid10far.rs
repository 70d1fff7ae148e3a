//! RAID 10 "far 2" (as Linux md's `--layout=f2`): every member's data area is cut
//! into two halves. The first halves of all members hold a plain RAID 0 stripe of
//! the data over all `n` members; the second halves hold the second copy of each
//! chunk, shifted to the next member.
//!
//! In the pool's grid this is `2n` *virtual positions*: position `p < n` is the
//! first half of member `p`, position `n + p` the second half of member `p`. Stripe
//! `s` occupies row `s` of every virtual position; data chunk `d` lives on
//! positions `d` (primary, first half of member `d`) and `n + (d + 1) mod n`
//! (second half of member `d + 1`). So reads, sequential or random, come from the
//! first halves of all `n` members (a stream reads `n` members at once; random
//! reads seek over half the stroke), while every write goes to both halves.
//! Any `n >= 2` works; two adjacent members (`m`, `m + 1 mod n`) failing loses
//! the chunks whose copies are on them.

use super::{Layout, Scheme};
use crate::RaidLevel;

/// Stripe of `n` chunks over the first halves, copies shifted by one member in
/// the second halves.
#[derive(Debug)]
pub struct Raid10Far {
    /// Number of (real) members.
    pub members: usize,
}

impl Layout for Raid10Far {
    fn level(&self) -> RaidLevel {
        RaidLevel::Raid10Far
    }
    fn member_count(&self) -> usize {
        self.members
    }
    fn areas(&self) -> u64 {
        2
    }
    fn data_chunks(&self) -> usize {
        self.members
    }
    /// Any one member; two adjacent members lose data.
    fn redundancy(&self) -> usize {
        1
    }
    fn scheme(&self) -> Scheme {
        Scheme::Mirror
    }
    fn data_positions(&self, _stripe: u64, index: usize) -> Vec<usize> {
        vec![index, self.members + (index + 1) % self.members]
    }
    fn cycle_stripes(&self) -> u64 {
        1
    }
}
