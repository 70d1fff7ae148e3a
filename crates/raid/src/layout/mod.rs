//! Where a pool's chunks live: one small [`Layout`] per RAID level.
//!
//! Every level uses the same grid: stripe `s` occupies member blocks
//! `[s * chunk, (s + 1) * chunk)` of the data area on every member, and holds
//! `data_chunks()` data chunks; the layout only says which member position holds
//! which data chunk (several positions for mirrors) and which hold parity.
//!
//! The grid runs over *positions*. For every level but RAID 10 far a position is a
//! member; RAID 10 far splits each member's data area into two *areas* (halves)
//! and has `2n` virtual positions, position `p` being area [`Layout::area_of`]`(p)`
//! of member [`Layout::member_of`]`(p)`. Positions `0..n` are always area 0 of
//! members `0..n`. Member state (failed, rebuilding, spares, superblocks) is per
//! member; the data path maps positions to (member, area) when it does I/O.

mod f1;
mod raid0;
mod raid1;
mod raid10;
mod raid10far;
mod raid5;
mod raid6;

pub use f1::F1;
pub use raid0::Raid0;
pub use raid1::Raid1;
pub use raid10::Raid10;
pub use raid10far::Raid10Far;
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
    /// Number of members.
    fn member_count(&self) -> usize;
    /// Areas each member's data area is split into; each area holds `stripes` rows
    /// (2 for RAID 10 far, else 1). Grid positions are numbered area-major:
    /// position `a * member_count() + m` is area `a` of member `m`.
    fn areas(&self) -> u64 {
        1
    }
    /// Number of grid positions (`member_count()` times `areas()`).
    fn positions(&self) -> usize {
        self.member_count() * self.areas() as usize
    }
    /// The member holding position `pos` (identity for `pos < member_count()`).
    fn member_of(&self, pos: usize) -> usize {
        pos % self.member_count()
    }
    /// Which area of its member's data area position `pos` is.
    fn area_of(&self, pos: usize) -> u64 {
        (pos / self.member_count()) as u64
    }
    /// The positions a member holds (one per area).
    fn positions_of(&self, member: usize) -> Vec<usize> {
        (0..self.positions())
            .filter(|&p| self.member_of(p) == member)
            .collect()
    }
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
        RaidLevel::Raid1 | RaidLevel::Raid10Far => 2,
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
        RaidLevel::Raid10Far => Box::new(Raid10Far { members }),
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
/// with the members flagged in `failed` gone.
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
                    if layout
                        .data_positions(s, d)
                        .iter()
                        .all(|&p| failed[layout.member_of(p)])
                    {
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
            RaidLevel::Raid10Far,
            RaidLevel::F1,
        ] {
            for n in 2..9usize {
                let Ok(l) = layout_for(level, n) else {
                    continue;
                };
                for s in 0..(3 * n as u64) {
                    let mut seen = vec![false; l.positions()];
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

    #[test]
    fn raid10_far_places_copies_on_different_members() {
        assert!(layout_for(RaidLevel::Raid10Far, 1).is_err());
        for n in 2..=9usize {
            let l = layout_for(RaidLevel::Raid10Far, n).unwrap();
            assert_eq!(l.positions(), 2 * n);
            assert_eq!(l.areas(), 2);
            assert_eq!(l.data_chunks(), n);
            assert_eq!(l.redundancy(), 1);
            let mut per_member = vec![0usize; n];
            for d in 0..n {
                let c = l.data_positions(0, d);
                assert_eq!(c.len(), 2);
                // primary: first half of member d (a plain stripe over all members)
                assert_eq!((l.member_of(c[0]), l.area_of(c[0])), (d, 0));
                // copy: second half of the next member
                assert_eq!((l.member_of(c[1]), l.area_of(c[1])), ((d + 1) % n, 1));
                assert_ne!(l.member_of(c[0]), l.member_of(c[1]));
                for p in c {
                    per_member[l.member_of(p)] += 1;
                }
            }
            // every member holds two chunks of every stripe, one per half
            assert!(per_member.iter().all(|&c| c == 2), "n={n}");
            for m in 0..n {
                assert_eq!(l.positions_of(m), vec![m, n + m]);
            }
        }
    }

    #[test]
    fn raid10_far_survives_any_one_member_but_not_two_adjacent() {
        for n in 2..=8usize {
            let l = layout_for(RaidLevel::Raid10Far, n).unwrap();
            assert!(survives(l.as_ref(), &vec![false; n]));
            for a in 0..n {
                let mut f = vec![false; n];
                f[a] = true;
                assert!(survives(l.as_ref(), &f), "n={n} lost {a}");
                for b in 0..n {
                    if b == a {
                        continue;
                    }
                    let mut f2 = f.clone();
                    f2[b] = true;
                    let adjacent = (a + 1) % n == b || (b + 1) % n == a;
                    assert_eq!(
                        survives(l.as_ref(), &f2),
                        !adjacent,
                        "n={n} lost {a} and {b}"
                    );
                }
            }
        }
        // near layout for comparison: one per pair may fail
        let near = layout_for(RaidLevel::Raid10, 4).unwrap();
        assert!(survives(near.as_ref(), &[true, false, true, false]));
        assert!(!survives(near.as_ref(), &[true, true, false, false]));
    }
}
