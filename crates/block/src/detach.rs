//! Medium changes that finish once started, even when their caller gives up.
//!
//! An aborted command's future is dropped (a task management function, PREEMPT
//! AND ABORT, a reset). Dropping it does not stop what it handed to the layers
//! below: a write queued in a disk engine, an io_uring request, a RAID member
//! write still land, after the abort was answered, where the initiator's next
//! write to the same blocks may already have landed (and the older data then
//! overwrites it). Worse, the guards the command held (its share of the LU's
//! write order, which a PREEMPT AND ABORT and a COMPARE AND WRITE wait on) were
//! released when the future was dropped.
//!
//! The same holds inside a volume: a mirror write dropped between its halves
//! leaves copies that answer reads differently, a parity update dropped
//! between its data and parity writes leaves a stripe whose parity is wrong.
//!
//! [`detached`] wraps such a medium change, together with the guards it runs
//! under. Polled to its end it costs nothing more; dropped before its end,
//! what is left of it moves to a task of its own, carrying the transport's
//! in-flight token ([`in_flight`]) until it ends, so the transport does not
//! count the command gone (and answer the abort) while it still writes.
//! Layers nest: an outer remainder carries the inner ones along with it.

use std::any::Any;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

/// What a transport hands in to learn when an aborted command's medium changes
/// have ended: dropped when the last of them ends.
pub type InFlight = Arc<dyn Any + Send + Sync>;

tokio::task_local! {
    static IN_FLIGHT: InFlight;
}

/// Runs `command` (a command's execution) with `token` as its in-flight token:
/// a medium change of it that outlives an abort holds a clone of `token` until it
/// ends.
pub async fn in_flight<F: Future>(token: InFlight, command: F) -> F::Output {
    IN_FLIGHT.scope(token, command).await
}

/// A medium change that runs to its end once polled (see the module notes).
pub struct Detached<F: Future + Send + 'static>
where
    F::Output: Send,
{
    op: Option<Pin<Box<F>>>,
}

/// Wraps `op` (which owns the guards it runs under).
pub fn detached<F>(op: F) -> Detached<F>
where
    F: Future + Send + 'static,
    F::Output: Send,
{
    Detached {
        op: Some(Box::pin(op)),
    }
}

impl<F> Future for Detached<F>
where
    F: Future + Send + 'static,
    F::Output: Send,
{
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.get_mut();
        let Some(op) = this.op.as_mut() else {
            // never polled again after it returned Ready (Future's contract)
            return Poll::Pending;
        };
        match op.as_mut().poll(cx) {
            Poll::Ready(v) => {
                this.op = None;
                Poll::Ready(v)
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<F> Drop for Detached<F>
where
    F: Future + Send + 'static,
    F::Output: Send,
{
    fn drop(&mut self) {
        let Some(op) = self.op.take() else {
            return;
        };
        // (tokio sets the task-local while it drops the scoped future)
        let token = IN_FLIGHT.try_with(Arc::clone).ok();
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                rt.spawn(async move {
                    let _token = token;
                    op.await;
                });
            }
            // the runtime is going away with everything on it
            Err(_) => drop(op),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use tokio::sync::Notify;

    /// An op dropped half-way still runs to its end, and the in-flight token
    /// stays alive until it does.
    #[tokio::test]
    async fn a_dropped_op_runs_on_and_holds_the_token_until_it_ends() {
        let go = Arc::new(Notify::new());
        let done = Arc::new(AtomicBool::new(false));
        let token: InFlight = Arc::new(());
        let weak = Arc::downgrade(&token);
        let started = Arc::new(Notify::new());
        let cmd = {
            let (go, done, started) = (go.clone(), done.clone(), started.clone());
            tokio::spawn(in_flight(token, async move {
                detached(async move {
                    started.notify_one();
                    go.notified().await;
                    done.store(true, Ordering::SeqCst);
                })
                .await
            }))
        };
        started.notified().await;
        cmd.abort();
        assert!(cmd.await.unwrap_err().is_cancelled());
        assert!(!done.load(Ordering::SeqCst));
        assert!(weak.upgrade().is_some(), "the token went with the command");
        go.notify_one();
        while weak.upgrade().is_some() {
            tokio::task::yield_now().await;
        }
        assert!(done.load(Ordering::SeqCst), "the op did not run to its end");
    }
}
