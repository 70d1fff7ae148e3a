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
//! A RAID 0 member is always waited for (the only copy of its stripes); a
//! member of a pool that has failed already is not (nothing is kept). A
//! member let go counts as gone for the next one to ask, before its failure
//! is recorded (that waits for the request's batch), so two members stalled
//! under one write are not both let go beyond the redundancy.
//!
//! The disk gives up after `disk::KEEP_TIMEOUT_FACTOR` timeouts all the
//! same: a disk silent that long is taken as dead.
//!
//! While a pool is being assembled (a node starting), before there is a pool
//! to judge a loss, each candidate member gets an [`AssemblyKeeper`]: only
//! the shared-stall rule applies. A member whose siblings answer is given
//! up, and the assemble goes on without it, as before; one whose siblings
//! are silent too is waited for. Before it, a stall every member shared at
//! start-up failed them one after the other, and the pool came up failed.
//! A sibling is asked a write only once its superblock named it this
//! pool's (the probe block lies in the superblock region); a read before.

use crate::pool::{Inner, MemberHandle};
use crate::MemberState;
use async_trait::async_trait;
use block::{Keeper, Unanswered, VolumeRef};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;

/// The keeper of one member (or spare) of a pool.
struct MemberKeeper {
    pool: Weak<Inner>,
    member: Weak<MemberHandle>,
}

/// What losing a member would cost.
enum Loss {
    /// Nothing more: it serves at no position (a spare, a member failed
    /// already), or the pool cannot serve without it anyway (it has failed).
    Nothing,
    /// The pool: its last redundancy (a RAID 0 member: its only copy).
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

    /// What losing member `h` would cost now. Members already let go on a
    /// timeout count as gone: their failure is recorded only once the
    /// request that timed out returns (a write batch waits for every copy),
    /// and two members stalled under one write would each find the other
    /// still serving and both be let go, beyond the redundancy.
    fn loss_of(&self, h: &Arc<MemberHandle>) -> Loss {
        let st = self.state.lock();
        let serving = |s: &crate::pool::Slot| {
            s.state != MemberState::Failed
                && !s
                    .member
                    .as_ref()
                    .is_some_and(|m| m.given_up.load(Ordering::Acquire))
        };
        let Some(pos) = st
            .slots
            .iter()
            .position(|s| serving(s) && s.member.as_ref().is_some_and(|m| Arc::ptr_eq(m, h)))
        else {
            return Loss::Nothing;
        };
        let mut missing = self.gone(&st);
        if !crate::layout::survives(self.layout.as_ref(), &missing) {
            return Loss::Nothing;
        }
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

    /// Which positions count as gone ([`Inner::missing`]), the members let
    /// go on a timeout as well.
    fn gone(&self, st: &crate::pool::State) -> Vec<bool> {
        let mut missing = Inner::missing(st, self.stripes());
        for (i, s) in st.slots.iter().enumerate() {
            missing[i] |= s
                .member
                .as_ref()
                .is_some_and(|m| m.given_up.load(Ordering::Acquire));
        }
        missing
    }

    /// Lets member `h` go if the pool still survives without it and every
    /// member let go before (checked again: others may have been let go
    /// while its siblings were probed).
    fn let_go(&self, h: &Arc<MemberHandle>) -> bool {
        // (under the lock: two members cannot both pass on the other's
        // place)
        let st = self.state.lock();
        let mut missing = self.gone(&st);
        for (i, s) in st.slots.iter().enumerate() {
            missing[i] |= s.member.as_ref().is_some_and(|m| Arc::ptr_eq(m, h));
        }
        if !crate::layout::survives(self.layout.as_ref(), &missing) {
            return false;
        }
        h.given_up.store(true, Ordering::Release);
        true
    }
}

#[async_trait]
impl Keeper for MemberKeeper {
    async fn may_give_up(&self, limit: Duration, unanswered: Unanswered) -> bool {
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
                let probes = others.into_iter().map(|v| probe(v, unanswered));
                let alone = block::any_answers(probes, limit / 2).await;
                if !alone {
                    tracing::warn!(member = %h.name, ?unanswered,
                        "member has stopped answering, and so have all the \
                         others: a stall they share, waited for");
                    return false;
                }
                pool.let_go(&h)
            }
        }
    }
}

/// The keeper of a candidate member while its pool is assembled (see the
/// module's header); [`Inner::keep_members`] replaces it once the pool is.
/// It holds the other candidates weakly: a failed assemble leaves no
/// cycle of disks keeping each other open.
struct AssemblyKeeper {
    name: String,
    others: Vec<Weak<dyn block::Volume>>,
    /// Whether the others may be asked a write: only once their
    /// superblocks named them this pool's (the probe block is in the
    /// superblock region); a read before.
    writes: bool,
}

#[async_trait]
impl Keeper for AssemblyKeeper {
    async fn may_give_up(&self, limit: Duration, unanswered: Unanswered) -> bool {
        let others: Vec<VolumeRef> = self.others.iter().filter_map(Weak::upgrade).collect();
        if others.is_empty() {
            return true;
        }
        let ask = if self.writes {
            unanswered
        } else {
            Unanswered::Read
        };
        let probes = others.into_iter().map(|v| probe(v, ask));
        let alone = block::any_answers(probes, limit / 2).await;
        if !alone {
            tracing::warn!(member = %self.name, ?unanswered,
                "member has stopped answering while its pool is assembled, and so \
                 have all the others: a stall they share, waited for");
        }
        alone
    }
}

/// Gives each of `members`, the candidates of a pool being assembled, an
/// [`AssemblyKeeper`] that asks the others `writes` or reads only (see
/// [`AssemblyKeeper::writes`]).
pub(crate) fn keep_while_assembling(members: &[&crate::Member], writes: bool) {
    for (i, m) in members.iter().enumerate() {
        let others = members
            .iter()
            .enumerate()
            .filter(|&(j, _)| j != i)
            .map(|(_, o)| Arc::downgrade(&o.volume))
            .collect();
        m.volume.keep_with(Arc::new(AssemblyKeeper {
            name: m.name.clone(),
            others,
            writes,
        }));
    }
}

/// One question to a sibling of a silent member, of the kind the member
/// left unanswered ([`block::probe`]); a write goes to the member's probe
/// block, in the superblock region and never read, so that a stall holding
/// writes only (a frozen file system under disk files, which still answers
/// reads) is seen as shared.
async fn probe(member: VolumeRef, unanswered: Unanswered) -> bool {
    let lba = crate::superblock::probe_lba(member.geometry().block_size_bytes);
    block::probe(member, unanswered, Some(lba)).await
}
