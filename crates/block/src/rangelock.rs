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
//! is cheaper than any tree. Waiters queue in arrival order: a request never
//! overtakes an earlier waiter it conflicts with (a shared one waits behind an
//! exclusive one on its range), so a stream of shared holders cannot starve an
//! exclusive waiter (an atomic write behind a busy range, an unaligned NBD write).

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
    /// Requests waiting, oldest first (their ids grow with arrival).
    waiting: Vec<Held>,
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
    /// Waits until `[start_lba, end_lba)` can be held in `mode` and no earlier
    /// waiter it conflicts with is still waiting, then holds it.
    pub async fn lock(&self, start_lba: u64, end_lba: u64, mode: LockMode) -> RangeGuard<'_> {
        let conflicts = |h: &Held| {
            h.start_lba < end_lba
                && start_lba < h.end_lba
                && (mode == LockMode::Exclusive || h.mode == LockMode::Exclusive)
        };
        let mut queued = Queued {
            locks: self,
            id: None,
        };
        loop {
            let notified = self.released.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let mut t = self.table.lock();
                let mine = queued.id;
                let blocked = t.held.iter().any(conflicts)
                    || t.waiting
                        .iter()
                        .any(|w| mine.is_none_or(|m| w.id < m) && conflicts(w));
                if !blocked {
                    if let Some(m) = mine {
                        t.waiting.retain(|w| w.id != m);
                        queued.id = None;
                    }
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
                if mine.is_none() {
                    let id = t.next_id;
                    t.next_id += 1;
                    t.waiting.push(Held {
                        id,
                        start_lba,
                        end_lba,
                        mode,
                    });
                    queued.id = Some(id);
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

/// A request's place in the queue; given up (and the others woken) when the
/// request is dropped while waiting.
struct Queued<'a> {
    locks: &'a RangeLocks,
    id: Option<u64>,
}

impl Drop for Queued<'_> {
    fn drop(&mut self) {
        if let Some(id) = self.id {
            self.locks.table.lock().waiting.retain(|w| w.id != id);
            self.locks.released.notify_waiters();
        }
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

    /// A shared request does not overtake an exclusive one waiting on its
    /// range (else a stream of shared holders starves it); a waiter that gives
    /// up lets those behind it go.
    #[tokio::test]
    async fn waiters_are_not_overtaken_by_what_conflicts_with_them() {
        use crate::poll_once;
        let l = RangeLocks::default();
        let a = l.lock(0, 10, LockMode::Shared).await;
        let mut w = Box::pin(l.lock(0, 10, LockMode::Exclusive));
        assert!(
            !poll_once(&mut w),
            "the exclusive waits for the shared holder"
        );
        // a shared request on its range queues behind it
        let mut b = Box::pin(l.lock(5, 6, LockMode::Shared));
        assert!(
            !poll_once(&mut b),
            "a shared request overtook the exclusive waiter"
        );
        // elsewhere, nothing waits
        drop(l.lock(20, 30, LockMode::Shared).await);
        drop(a);
        let held = crate::poll_now(&mut w).expect("the exclusive goes first");
        assert!(!poll_once(&mut b));
        drop(held);
        assert!(poll_once(&mut b));
        drop(b);
        drop(w);
        // a waiter dropped while queued lets the next one through
        let a = l.lock(0, 10, LockMode::Shared).await;
        let mut w = Box::pin(l.lock(0, 10, LockMode::Exclusive));
        assert!(!poll_once(&mut w));
        let mut b = Box::pin(l.lock(5, 6, LockMode::Shared));
        assert!(!poll_once(&mut b));
        drop(w);
        assert!(
            poll_once(&mut b),
            "the queue forgot the waiter that gave up"
        );
        drop(b);
        drop(a);
        assert_eq!(l.held_count(), 0);
        assert!(l.table.lock().waiting.is_empty());
    }

    #[tokio::test]
    async fn disjoint_exclusive_ranges_do_not_wait() {
        let l = RangeLocks::default();
        let _a = l.lock(0, 1, LockMode::Exclusive).await;
        let _b = l.lock(1, 2, LockMode::Exclusive).await;
        assert_eq!(l.held_count(), 2);
    }
}
