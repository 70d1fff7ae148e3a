//! Where a pool's chunks live: one small [`Layout`] per RAID level.
//!
//! Every level uses the same grid: stripe `s` occupies member blocks
//! `[s * chunk, (s + 1) * chunk)` of the data area on every member, and holds
//! `data_chunks()` data chunks; the layout only says which member position holds
//! which data chunk (several positions for mirrors) and which hold parity.

mod f1;
mod raid0;
mod raid1;
mod raid10;
mod raid5;
mod raid6;

pub use f1::F1;
pub use raid0::Raid0;
pub use raid1::Raid1;
pub use raid10::Raid10;
pub use raid5::Raid5;
pub use raid6::Raid6;

use crate::{RaidError, RaidLevel};

/// How a level protects data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scheme {
    /// No redundancy (RAID 0).
    Striped,
    /// Every data chunk has full copies on several members (RAID 1, 10).
    Mirror,
    /// Data chunks plus `parity_count` parity chunks per stripe (RAID 5, 6, F1).
    Parity {
        /// 1 (P) or 2 (P and Q).
        parity_count: usize,
    },
}

/// Placement of chunks for one RAID level.
pub trait Layout: Send + Sync + std::fmt::Debug {
    /// The level this layout implements.
    fn level(&self) -> RaidLevel;
    /// Number of member positions.
    fn member_count(&self) -> usize;
    /// Data chunks per stripe.
    fn data_chunks(&self) -> usize;
    /// Members that may fail (in the worst placement) without losing data.
    fn redundancy(&self) -> usize;
    /// How the level protects data.
    fn scheme(&self) -> Scheme;
    /// Positions holding data chunk `index` of stripe `stripe`; mirrors return every
    /// copy, primary first.
    fn data_positions(&self, stripe: u64, index: usize) -> Vec<usize>;
    /// Parity positions of a stripe, P first then Q; empty for non-parity levels.
    fn parity_positions(&self, _stripe: u64) -> Vec<usize> {
        Vec::new()
    }
    /// Stripes after which the placement repeats.
    fn cycle_stripes(&self) -> u64 {
        self.member_count() as u64
    }
}

/// Builds the layout of `level` over `members` positions.
pub fn layout_for(level: RaidLevel, members: usize) -> Result<Box<dyn Layout>, RaidError> {
    let min = match level {
        RaidLevel::Raid0 => 1,
        RaidLevel::Raid1 => 2,
        RaidLevel::Raid5 | RaidLevel::F1 => 3,
        RaidLevel::Raid6 | RaidLevel::Raid10 => 4,
    };
    if members < min || members > 64 {
        return Err(RaidError::Config(format!(
            "{level:?} needs {min}..=64 members, got {members}"
        )));
    }
    Ok(match level {
        RaidLevel::Raid0 => Box::new(Raid0 { members }),
        RaidLevel::Raid1 => Box::new(Raid1 { members }),
        RaidLevel::Raid5 => Box::new(Raid5 { members }),
        RaidLevel::Raid6 => Box::new(Raid6 { members }),
        RaidLevel::F1 => Box::new(F1 { members }),
        RaidLevel::Raid10 => {
            if !members.is_multiple_of(2) {
                return Err(RaidError::Config(format!(
                    "raid10 needs an even number of members, got {members}"
                )));
            }
            Box::new(Raid10 { members })
        }
    })
}

/// True when every data chunk of every stripe can still be read or reconstructed
/// with the positions flagged in `failed` gone.
pub fn survives(layout: &dyn Layout, failed: &[bool]) -> bool {
    for s in 0..layout.cycle_stripes() {
        match layout.scheme() {
            Scheme::Striped => {
                if failed.iter().any(|&f| f) {
                    return false;
                }
            }
            Scheme::Mirror => {
                for d in 0..layout.data_chunks() {
                    if layout.data_positions(s, d).iter().all(|&p| failed[p]) {
                        return false;
                    }
                }
            }
            Scheme::Parity { parity_count } => {
                if failed.iter().filter(|&&f| f).count() > parity_count {
                    return false;
                }
            }
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_stripe_uses_each_position_once() {
        for level in [
            RaidLevel::Raid0,
            RaidLevel::Raid5,
            RaidLevel::Raid6,
            RaidLevel::Raid10,
            RaidLevel::F1,
        ] {
            for n in 4..9usize {
                if level == RaidLevel::Raid10 && n % 2 == 1 {
                    continue;
                }
                let l = layout_for(level, n).unwrap();
                for s in 0..(3 * n as u64) {
                    let mut seen = vec![false; n];
                    for d in 0..l.data_chunks() {
                        for p in l.data_positions(s, d) {
                            assert!(!seen[p], "{level:?} n={n} s={s}");
                            seen[p] = true;
                        }
                    }
                    for p in l.parity_positions(s) {
                        assert!(!seen[p]);
                        seen[p] = true;
                    }
                    assert!(seen.iter().all(|&x| x), "{level:?} n={n} s={s}");
                }
            }
        }
    }

    #[test]
    fn f1_skews_parity_onto_the_last_member() {
        let n = 4;
        let l = layout_for(RaidLevel::F1, n).unwrap();
        let mut count = vec![0u64; n];
        for s in 0..(2 * n as u64 - 1) * 10 {
            count[l.parity_positions(s)[0]] += 1;
        }
        // hot member: n of every 2n-1 stripes; others: 1 each
        assert_eq!(count[n - 1], 40);
        assert!(count[..n - 1].iter().all(|&c| c == 10));
    }
}
