//! Keeping a stream of whole-stripe writes in order on every member.
//!
//! Whole stripes of a sequential stream become ready slightly out of order: their
//! gathers complete in the order their last piece arrives, and the tasks that
//! write them run on several worker threads. A member that receives chunk `s + 1`
//! before chunk `s` serves `s + 1` first (nothing else is queued), then has to
//! come back for `s`: on a disk that is a lost revolution or more, twice, where
//! the two in order would have cost none. Measured on RAID 5 of 10 simulated HDDs,
//! 7% of member writes arrived behind their predecessor and members spent about
//! as much time positioning as transferring.
//!
//! So a whole-stripe write whose member lba lies a little ahead of where that
//! member's last write ended (within [`WINDOW_CHUNKS`] chunks) waits, briefly, for
//! the writes that fill the gap: each submitted write wakes the one waiting at its
//! end, and a waiter goes ahead anyway after [`MAX_HOLD`]. Writes that start
//! where the last one ended, behind it, or far from it never wait; nor do other
//! kinds of writes, which only move the member's position. "Submitted" means the
//! member's write future has been polled once: a member (a simulated disk, the
//! file engine) queues its request on that first poll.

use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::sync::oneshot;

/// How far ahead (in chunks) of a member's position a whole-stripe write waits
/// for the gap below it to be filled.
pub(crate) const WINDOW_CHUNKS: u64 = 4;
/// A write ending at most this many blocks behind a member's position is a
/// late one of the same stream: it does not move the position back.
const BEHIND_MAX: u64 = 1 << 16;
/// Longest a whole-stripe write waits for its predecessors on a member.
pub(crate) const MAX_HOLD: Duration = Duration::from_millis(5);

/// The write position of one member and the writes waiting for the gap below
/// them.
#[derive(Default)]
pub(crate) struct WriteOrder {
    st: Mutex<OrderState>,
}

#[derive(Default)]
struct OrderState {
    /// Member lba just past the last write submitted.
    next: u64,
    /// Waiting writes by their lba.
    held: BTreeMap<u64, Vec<oneshot::Sender<()>>>,
}

impl WriteOrder {
    /// Waits (up to [`MAX_HOLD`]) until the writes ending at `lba` have been
    /// submitted, if `lba` is less than `window` blocks ahead of the member's
    /// position; returns at once otherwise.
    pub(crate) async fn wait_turn(&self, lba: u64, window: u64) {
        let rx = {
            let mut st = self.st.lock();
            if lba <= st.next || lba - st.next > window {
                return;
            }
            let (tx, rx) = oneshot::channel();
            st.held.entry(lba).or_default().push(tx);
            rx
        };
        let to = tokio::time::timeout(MAX_HOLD, rx).await.is_err();
        if to {
            // gave up: forget the sender (its receiver is gone now)
            let mut st = self.st.lock();
            if let Some(v) = st.held.get_mut(&lba) {
                v.retain(|tx| !tx.is_closed());
                if v.is_empty() {
                    st.held.remove(&lba);
                }
            }
        }
    }

    /// Notes that a write of `[lba, end)` has been submitted: the member's
    /// position moves to `end` and the writes waiting there go ahead.
    pub(crate) fn submitted(&self, end: u64) {
        let mut st = self.st.lock();
        // a write behind the position (a late one) does not move it back
        if end > st.next || st.next - end > BEHIND_MAX {
            st.next = end;
        }
        // the one waiting at `end`, and any the position has passed, go now
        let next = st.next;
        let mut go = st.held.remove(&end).unwrap_or_default();
        while let Some(e) = st.held.first_entry() {
            if *e.key() > next {
                break;
            }
            go.extend(e.remove());
        }
        drop(st);
        for tx in go {
            let _ = tx.send(());
        }
    }

    /// Writes waiting now (tests).
    #[cfg(test)]
    fn waiting(&self) -> usize {
        self.st.lock().held.values().map(Vec::len).sum()
    }
}

/// Polls `inner`, and runs `then` once, right after the first poll.
pub(crate) struct AfterFirstPoll<F, G> {
    inner: F,
    then: Option<G>,
}

impl<F, G> AfterFirstPoll<F, G> {
    pub(crate) fn new(inner: F, then: G) -> Self {
        AfterFirstPoll {
            inner,
            then: Some(then),
        }
    }
}

impl<F: Future + Unpin, G: FnOnce() + Unpin> Future for AfterFirstPoll<F, G> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let r = Pin::new(&mut self.inner).poll(cx);
        if let Some(then) = self.then.take() {
            then();
        }
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[tokio::test]
    async fn a_write_ahead_waits_for_the_gap_and_goes_when_it_is_filled() {
        let o = Arc::new(WriteOrder::default());
        o.submitted(100);
        let o2 = o.clone();
        let ahead = tokio::spawn(async move {
            o2.wait_turn(108, 32).await;
        });
        while o.waiting() == 0 {
            tokio::task::yield_now().await;
        }
        // filling part of the gap does not release it
        o.submitted(104);
        assert_eq!(o.waiting(), 1);
        o.submitted(108);
        ahead.await.unwrap();
        assert_eq!(o.waiting(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiter_goes_ahead_after_the_hold_time() {
        let o = WriteOrder::default();
        o.submitted(100);
        let t0 = tokio::time::Instant::now();
        o.wait_turn(108, 32).await;
        assert!(t0.elapsed() >= MAX_HOLD);
        assert_eq!(o.waiting(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn writes_in_order_behind_or_far_ahead_never_wait() {
        let o = WriteOrder::default();
        o.submitted(100);
        let t0 = tokio::time::Instant::now();
        o.wait_turn(100, 32).await;
        o.wait_turn(50, 32).await;
        o.wait_turn(133, 32).await;
        // the paused clock advances only when something waits on a timer
        assert_eq!(t0.elapsed(), Duration::ZERO);
    }
}
