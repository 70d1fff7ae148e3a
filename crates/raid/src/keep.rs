//! What a member's disk asks the pool before it gives itself up on a
//! command timeout ([`block::Keeper`]; the disk side is `disk::TimedDisk`).
//!
//! A member that stopped answering is failed, as on any device error, when
//! the pool can do without it: its loss leaves every stripe readable, and at
//! least one other member still answers (a read of one of its blocks, at a
//! place of its own, within half the timeout). It is waited for instead,
//! one more timeout at a time, when:
//! - **it holds the pool's last redundancy**: failing it fails the pool,
//!   every initiator's request with it, where waiting loses nothing if the
//!   disk answers again. md keeps its last member the same way.
//! - **no other member answers either**: a stall they share (a controller
//!   resetting, the path to every disk failing over, a file system under
//!   every disk file frozen). Failed one after the other, the members would
//!   have taken the pool down with them; waited for, the stall's end costs
//!   nothing.
//!
//! The disk gives up after `disk::KEEP_TIMEOUT_FACTOR` timeouts all the
//! same: a disk silent that long is taken as dead.

use crate::pool::{Inner, MemberHandle};
use crate::MemberState;
use async_trait::async_trait;
use block::{Keeper, VolumeRef};
use std::sync::{Arc, Weak};
use std::time::Duration;

/// The keeper of one member (or spare) of a pool.
struct MemberKeeper {
    pool: Weak<Inner>,
    member: Weak<MemberHandle>,
}

/// What losing a member would cost.
enum Loss {
    /// It serves at no position (a spare, a member failed already).
    Nothing,
    /// The pool: its last redundancy.
    Pool,
    /// Redundancy only; these other members hold the rest.
    Redundancy(Vec<VolumeRef>),
}

impl Inner {
    /// Gives every member and spare's disk this pool as its keeper (again:
    /// after a member or spare joined).
    pub(crate) fn keep_members(self: &Arc<Self>) {
        let st = self.state.lock();
        let handles = st.slots.iter().filter_map(|s| s.member.as_ref());
        for h in handles.chain(&st.spares) {
            h.volume.keep_with(Arc::new(MemberKeeper {
                pool: Arc::downgrade(self),
                member: Arc::downgrade(h),
            }));
        }
    }

    /// What losing member `h` would cost now.
    fn loss_of(&self, h: &Arc<MemberHandle>) -> Loss {
        let st = self.state.lock();
        let serving = |s: &crate::pool::Slot| s.state != MemberState::Failed;
        let Some(pos) = st
            .slots
            .iter()
            .position(|s| serving(s) && s.member.as_ref().is_some_and(|m| Arc::ptr_eq(m, h)))
        else {
            return Loss::Nothing;
        };
        let mut missing = Inner::missing(&st, self.stripes());
        missing[pos] = true;
        if !crate::layout::survives(self.layout.as_ref(), &missing) {
            return Loss::Pool;
        }
        let others = st
            .slots
            .iter()
            .enumerate()
            .filter(|&(i, s)| i != pos && serving(s))
            .filter_map(|(_, s)| s.member.as_ref().map(|m| m.volume.clone()))
            .collect();
        Loss::Redundancy(others)
    }
}

#[async_trait]
impl Keeper for MemberKeeper {
    async fn may_give_up(&self, limit: Duration) -> bool {
        let (Some(pool), Some(h)) = (self.pool.upgrade(), self.member.upgrade()) else {
            return true;
        };
        match pool.loss_of(&h) {
            Loss::Nothing => true,
            Loss::Pool => {
                tracing::warn!(pool = %pool.name, member = %h.name,
                    "member has stopped answering, but holds the pool's last \
                     redundancy: waited for, not failed");
                false
            }
            Loss::Redundancy(others) => {
                drop(pool);
                let alone = block::any_answers(others, limit / 2).await;
                if !alone {
                    tracing::warn!(member = %h.name,
                        "member has stopped answering, and so have all the \
                         others: a stall they share, waited for");
                }
                alone
            }
        }
    }
}
