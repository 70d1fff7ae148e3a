//! The cache's per-block decision: which policy call a read or a write of one cache
//! block makes, and whether it counts as a hit.
//!
//! This is the one place that maps (operation, mode, sequential bypass) to a call on
//! the [`Policy`]; the data path ([`crate::CacheVolume`]), the trace replayer
//! ([`crate::replay`]) and the advisor's miniature caches all go through it, so
//! what they measure is what the cache does, not a copy of it.

use crate::config::CacheMode;
use crate::policy::{Access, Policy};

/// What one access to a cache block asks of the policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Step {
    /// A read the cache may admit: the admission filter and the eviction policy
    /// decide (`Policy::access`). Counts as a hit when the block is cached.
    Access,
    /// A write that must land in the cache (write-back, write-through):
    /// `Policy::admit`, inserted whatever the admission filter thinks.
    Admit,
    /// A write that updates a cached copy but never inserts (read-only mode, a
    /// degraded write-back cache): `Policy::touch`; a hit when cached.
    Update,
    /// A read of a bypassed sequential stream: `Policy::touch` (the block's state
    /// is refreshed, nothing is inserted); a cached block is served from the SSD
    /// (a hit), so a stream over data the cache holds keeps using it.
    Bypass,
    /// A write that drops the cache's copy (write-around, a bypassed write):
    /// `Policy::get`, no state change; a hit when the block was cached.
    Drop,
}

impl Step {
    /// The step of a read: [`Step::Bypass`] for a bypassed stream, else
    /// [`Step::Access`].
    pub fn read(bypass: bool) -> Step {
        if bypass {
            Step::Bypass
        } else {
            Step::Access
        }
    }

    /// The step of a write in `mode`; `writes_back` is false while a write-back
    /// cache is degraded or draining (it then behaves as write-through without
    /// allocation).
    pub fn write(mode: CacheMode, writes_back: bool, bypass: bool) -> Step {
        if bypass {
            return Step::Drop;
        }
        match mode {
            CacheMode::WriteBack if writes_back => Step::Admit,
            CacheMode::WriteThrough => Step::Admit,
            CacheMode::ReadOnly | CacheMode::WriteBack => Step::Update,
            CacheMode::WriteAround => Step::Drop,
        }
    }

    /// Whether the step can put a block into the cache.
    pub fn may_insert(self) -> bool {
        matches!(self, Step::Access | Step::Admit)
    }

    /// Applies the step to `policy` for block `key`. `Hit` means the block is (or,
    /// for [`Step::Drop`], was) cached in that slot; `Inserted` that it was
    /// admitted; `Bypassed` that it is not cached.
    pub fn apply<P: Policy + ?Sized>(self, policy: &mut P, key: u64) -> Access {
        let found = |slot: Option<u32>| match slot {
            Some(slot) => Access::Hit { slot },
            None => Access::Bypassed,
        };
        match self {
            Step::Access => policy.access(key),
            Step::Admit => policy.admit(key),
            Step::Update | Step::Bypass => found(policy.touch(key)),
            Step::Drop => found(policy.get(key)),
        }
    }

    /// Whether `access` (the result of [`Step::apply`]) is counted as a hit by the
    /// cache's statistics (for [`Step::Drop`]: the block was cached).
    pub fn is_hit(self, access: &Access) -> bool {
        access.is_hit()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::{Admission, PolicyKind};

    #[test]
    fn writes_follow_the_mode() {
        assert_eq!(Step::write(CacheMode::WriteBack, true, false), Step::Admit);
        assert_eq!(
            Step::write(CacheMode::WriteBack, false, false),
            Step::Update
        );
        assert_eq!(
            Step::write(CacheMode::WriteThrough, true, false),
            Step::Admit
        );
        assert_eq!(Step::write(CacheMode::ReadOnly, true, false), Step::Update);
        assert_eq!(Step::write(CacheMode::WriteAround, true, false), Step::Drop);
        assert_eq!(Step::write(CacheMode::WriteBack, true, true), Step::Drop);
    }

    #[test]
    fn only_access_and_admit_insert() {
        let mut p = PolicyKind::Lru.build_with(Admission::All, 4);
        assert_eq!(Step::Update.apply(&mut p, 1), Access::Bypassed);
        assert_eq!(Step::Drop.apply(&mut p, 1), Access::Bypassed);
        assert_eq!(Step::Bypass.apply(&mut p, 1), Access::Bypassed);
        assert!(!p.contains(1));
        assert!(matches!(
            Step::Access.apply(&mut p, 1),
            Access::Inserted { .. }
        ));
        let a = Step::Bypass.apply(&mut p, 1);
        assert!(
            Step::Bypass.is_hit(&a),
            "a bypassed read of a cached block hits"
        );
        let a = Step::Update.apply(&mut p, 1);
        assert!(Step::Update.is_hit(&a));
    }
}
