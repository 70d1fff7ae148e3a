//! Who a disk asks before it gives itself up on a command timeout
//! ([`block::Keeper`], `disk::TimedDisk`), when no pool or cache holds it.
//! A pool (raid `keep.rs`) or a cache (cache `keep.rs`) gives its members
//! and devices keepers of its own once they serve it, and while the pool
//! is assembled or the cache opened too (waited for then only in a stall
//! they all share). A disk the node opens has none otherwise (it is given
//! up at its timeout: a journal device is given up to the members), until
//! it takes one of these roles:
//! - [`OnlyCopy`]: a disk a LUN serves directly, or a cache's backing disk,
//!   holds the only copy of its data, so failing it fails every request for
//!   good where waiting loses nothing if it answers again: it is waited for,
//!   up to the disk's keep limit (`disk::KEEP_TIMEOUT_FACTOR`);
//! - [`UnderReplica`], a disk a replicated LUN serves directly: given up
//!   while this node leads with the partner attached and in sync (the
//!   replica then serves from it), waited for otherwise;
//! - [`GiveUp`], a disk a deleted LUN gave back.

use async_trait::async_trait;
use block::{Keeper, Unanswered};
use replica::{ReplicatedVolume, Role};
use std::sync::Weak;
use std::time::Duration;

/// The keeper of a disk that holds the only copy of its data.
pub(crate) struct OnlyCopy;

#[async_trait]
impl Keeper for OnlyCopy {
    async fn may_give_up(&self, _limit: Duration, _unanswered: Unanswered) -> bool {
        false
    }
}

/// The keeper of a disk nothing needs: given up at its timeout.
pub(crate) struct GiveUp;

#[async_trait]
impl Keeper for GiveUp {
    async fn may_give_up(&self, _limit: Duration, _unanswered: Unanswered) -> bool {
        true
    }
}

/// The keeper of a disk under a replicated LUN.
pub(crate) struct UnderReplica(pub Weak<ReplicatedVolume>);

/// Whether a replica in `role` (the status's `state` in `state`, the
/// partner attached or not) can do without its local copy: it leads, and
/// the partner, attached, holds a complete copy; or this node does not
/// serve from it anyway (being resynchronised, down). A follower waits: it
/// cannot tell a link just lost from one that holds, and its failed write
/// could not be detached without the leader.
pub(crate) fn replica_can_lose_local(role: Role, state: &str, attached: bool) -> bool {
    match role {
        Role::Leader => state == "in-sync" && attached,
        Role::Target | Role::Down => true,
        Role::Follower | Role::Solo | Role::Deciding => false,
    }
}

#[async_trait]
impl Keeper for UnderReplica {
    async fn may_give_up(&self, _limit: Duration, _unanswered: Unanswered) -> bool {
        let Some(r) = self.0.upgrade() else {
            return false;
        };
        replica_can_lose_local(r.role(), r.status().state, r.partner_attached())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_replicas_local_disk_is_given_up_only_while_the_partner_holds_a_copy() {
        assert!(replica_can_lose_local(Role::Leader, "in-sync", true));
        // the link just lost, the role not yet moved
        assert!(!replica_can_lose_local(Role::Leader, "in-sync", false));
        assert!(!replica_can_lose_local(Role::Follower, "in-sync", true));
        // the partner still being filled from this node: the only whole copy
        assert!(!replica_can_lose_local(Role::Leader, "resyncing", true));
        assert!(!replica_can_lose_local(Role::Solo, "degraded", false));
        assert!(!replica_can_lose_local(Role::Deciding, "deciding", false));
        assert!(replica_can_lose_local(Role::Target, "resyncing", true));
        assert!(replica_can_lose_local(Role::Down, "down", false));
    }
}
