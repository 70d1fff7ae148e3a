//! Who a disk asks before it gives itself up on a command timeout
//! ([`block::Keeper`], `disk::TimedDisk`), when no pool or cache holds it.
//! A pool (raid `keep.rs`) or a cache (cache `keep.rs`) gives its members
//! and devices keepers of its own when they join; what they replace is:
//! - [`OnlyCopy`], given to every disk the node opens: a disk a LUN serves
//!   directly, or a cache's backing disk, holds the only copy of its data,
//!   so failing it fails every request for good where waiting loses
//!   nothing if it answers again: it is waited for, up to the disk's keep
//!   limit (`disk::KEEP_TIMEOUT_FACTOR` timeouts);
//! - [`UnderReplica`], given to a disk a replicated LUN serves directly:
//!   given up at once while the partner holds a complete copy (the replica
//!   then serves from it), waited for while this node serves alone.

use async_trait::async_trait;
use block::Keeper;
use replica::{ReplicatedVolume, Role};
use std::sync::Weak;
use std::time::Duration;

/// The keeper of a disk that holds the only copy of its data.
pub(crate) struct OnlyCopy;

#[async_trait]
impl Keeper for OnlyCopy {
    async fn may_give_up(&self, _limit: Duration) -> bool {
        false
    }
}

/// The keeper of a disk under a replicated LUN.
pub(crate) struct UnderReplica(pub Weak<ReplicatedVolume>);

/// Whether a replica in `role` (the status's `state` in `state`) can do
/// without its local copy: the partner holds a complete one (in sync), or
/// this node does not serve from it anyway (being resynchronised, down).
pub(crate) fn replica_can_lose_local(role: Role, state: &str) -> bool {
    match role {
        Role::Leader | Role::Follower => state == "in-sync",
        Role::Target | Role::Down => true,
        Role::Solo | Role::Deciding => false,
    }
}

#[async_trait]
impl Keeper for UnderReplica {
    async fn may_give_up(&self, _limit: Duration) -> bool {
        let Some(r) = self.0.upgrade() else {
            return true;
        };
        replica_can_lose_local(r.role(), r.status().state)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_replicas_local_disk_is_given_up_only_while_the_partner_holds_a_copy() {
        assert!(replica_can_lose_local(Role::Leader, "in-sync"));
        assert!(replica_can_lose_local(Role::Follower, "in-sync"));
        // the partner still being filled from this node: the only whole copy
        assert!(!replica_can_lose_local(Role::Leader, "resyncing"));
        assert!(!replica_can_lose_local(Role::Solo, "degraded"));
        assert!(!replica_can_lose_local(Role::Deciding, "deciding"));
        assert!(replica_can_lose_local(Role::Target, "resyncing"));
        assert!(replica_can_lose_local(Role::Down, "down"));
    }
}
