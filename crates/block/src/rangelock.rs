//! Block-range locks shared by every user of a volume (an NBD export's connections,
//! the writes a replicated volume orders).
//!
//! NBD lets clients write at any byte offset; a write that does not cover whole
//! blocks is done as read-modify-write of its edge blocks. Two such writes to
//! different bytes of one block, or an aligned write racing one, would otherwise
//! lose an update. Writes therefore take a lock over their block range: whole-block
//! writes take it *shared* (they never conflict with each other: overlapping writes
//! in flight at once are the client's own race, as the protocol says), and
//! read-modify-writes take it *exclusive*. Reads take no lock.
//!
//! Waiters are woken through one `Notify` whenever any lock is released and
//! re-check; with at most a few hundred requests in flight per export a linear scan
//! is cheaper than any tree. A stream of shared holders can delay an exclusive
//! waiter; unaligned writes are rare, so that is accepted.

use parking_lot::Mutex;
use tokio::sync::Notify;

/// How a range is held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LockMode {
    /// Compatible with other shared holders.
    Shared,
    /// Excludes every overlapping holder.
    Exclusive,
}

#[derive(Debug, Clone, Copy)]
struct Held {
    id: u64,
    start_lba: u64,
    end_lba: u64,
    mode: LockMode,
}

#[derive(Debug, Default)]
struct Table {
    held: Vec<Held>,
    next_id: u64,
}

/// The lock table of one export.
#[derive(Debug, Default)]
pub struct RangeLocks {
    table: Mutex<Table>,
    released: Notify,
}

/// Holds `[start_lba, end_lba)` until dropped.
#[derive(Debug)]
pub struct RangeGuard<'a> {
    locks: &'a RangeLocks,
    id: u64,
}

impl RangeLocks {
    /// Waits until `[start_lba, end_lba)` can be held in `mode`, then holds it.
    pub async fn lock(&self, start_lba: u64, end_lba: u64, mode: LockMode) -> RangeGuard<'_> {
        loop {
            let notified = self.released.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let mut t = self.table.lock();
                let conflict = t.held.iter().any(|h| {
                    h.start_lba < end_lba
                        && start_lba < h.end_lba
                        && (mode == LockMode::Exclusive || h.mode == LockMode::Exclusive)
                });
                if !conflict {
                    let id = t.next_id;
                    t.next_id += 1;
                    t.held.push(Held {
                        id,
                        start_lba,
                        end_lba,
                        mode,
                    });
                    return RangeGuard { locks: self, id };
                }
            }
            notified.await;
        }
    }

    /// Ranges currently held (for tests).
    #[cfg(test)]
    pub fn held_count(&self) -> usize {
        self.table.lock().held.len()
    }
}

impl Drop for RangeGuard<'_> {
    fn drop(&mut self) {
        let mut t = self.locks.table.lock();
        if let Some(i) = t.held.iter().position(|h| h.id == self.id) {
            t.held.swap_remove(i);
        }
        drop(t);
        self.locks.released.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Duration;

    #[tokio::test]
    async fn shared_holders_coexist_exclusive_waits() {
        let l = Arc::new(RangeLocks::default());
        let a = l.lock(0, 10, LockMode::Shared).await;
        let b = l.lock(5, 15, LockMode::Shared).await;
        assert_eq!(l.held_count(), 2);
        // Adjacent to both: does not wait.
        drop(l.lock(15, 20, LockMode::Exclusive).await);
        let l2 = l.clone();
        let waiter = tokio::spawn(async move {
            let _g = l2.lock(8, 9, LockMode::Exclusive).await;
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(
            !waiter.is_finished(),
            "exclusive lock must wait for shared holders"
        );
        drop(a);
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiter.is_finished(), "still overlaps b");
        drop(b);
        tokio::time::timeout(Duration::from_secs(2), waiter)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(l.held_count(), 0);
    }

    #[tokio::test]
    async fn disjoint_exclusive_ranges_do_not_wait() {
        let l = RangeLocks::default();
        let _a = l.lock(0, 1, LockMode::Exclusive).await;
        let _b = l.lock(1, 2, LockMode::Exclusive).await;
        assert_eq!(l.held_count(), 2);
    }
}
