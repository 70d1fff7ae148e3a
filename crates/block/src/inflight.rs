//! A count of operations in progress that can be awaited down to zero: the
//! writes a replica started alone, which a resync must let finish before it
//! takes its set of regions; the API's changes, which a stopping node lets
//! finish before it stops the volumes.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use tokio::sync::Notify;

/// Operations in progress; cloning the `Arc` shares the count.
#[derive(Default)]
pub struct InFlight {
    count: AtomicUsize,
    zero: Notify,
}

/// One operation counted by [`InFlight::enter`], until dropped.
pub struct Entered(Arc<InFlight>);

impl InFlight {
    /// A count at zero.
    pub fn new() -> Arc<InFlight> {
        Arc::new(InFlight::default())
    }

    /// Counts one more operation until the result is dropped. The count is
    /// sequentially consistent: a caller that enters, then reads a flag a
    /// waiter set before [`InFlight::zero`], is either seen by that waiter or
    /// sees the flag.
    pub fn enter(self: &Arc<Self>) -> Entered {
        self.count.fetch_add(1, Ordering::SeqCst);
        Entered(self.clone())
    }

    /// Operations in progress now.
    pub fn count(&self) -> usize {
        self.count.load(Ordering::SeqCst)
    }

    /// Returns once no operation is in progress.
    pub async fn zero(&self) {
        loop {
            let notified = self.zero.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.count() == 0 {
                return;
            }
            notified.await;
        }
    }
}

impl Drop for Entered {
    fn drop(&mut self) {
        if self.0.count.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0.zero.notify_waiters();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn zero_waits_for_every_operation() {
        let f = InFlight::new();
        f.zero().await; // nothing in progress: at once
        let a = f.enter();
        let b = f.enter();
        assert_eq!(f.count(), 2);
        let waiter = tokio::spawn({
            let f = f.clone();
            async move { f.zero().await }
        });
        drop(a);
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished(), "returned with one in progress");
        drop(b);
        tokio::time::timeout(Duration::from_secs(10), waiter)
            .await
            .expect("never returned")
            .unwrap();
        assert_eq!(f.count(), 0);
    }
}
