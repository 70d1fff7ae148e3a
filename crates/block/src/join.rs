//! Joining borrowed futures concurrently without spawning tasks (layers fan one
//! request out to several volumes below and wait for all of them).

use std::future::Future;
use std::pin::Pin;
use std::task::Poll;

/// A boxed future that may borrow.
pub type BoxFut<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Runs every future to completion concurrently and returns the outputs in order.
pub async fn join_all<'a, T: Send + 'a>(futs: Vec<BoxFut<'a, T>>) -> Vec<T> {
    let mut futs = futs;
    let mut out: Vec<Option<T>> = (0..futs.len()).map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (i, f) in futs.iter_mut().enumerate() {
            if out[i].is_none() {
                match f.as_mut().poll(cx) {
                    Poll::Ready(v) => out[i] = Some(v),
                    Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            Poll::Pending
        } else {
            Poll::Ready(())
        }
    })
    .await;
    out.into_iter().flatten().collect()
}

/// Polls `fut` once, here, with a waker that does nothing: its output when it
/// finished. A future that did not may be polled again later with a real waker
/// (as [`poll_once`] explains).
pub fn poll_now<T, F: Future<Output = T> + ?Sized>(fut: &mut Pin<Box<F>>) -> Option<T> {
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    match fut.as_mut().poll(&mut cx) {
        std::task::Poll::Ready(v) => Some(v),
        std::task::Poll::Pending => None,
    }
}

/// Polls `fut` once, here, with a waker that does nothing; true when it finished.
///
/// For work that must start in the caller's order before it goes on in its own
/// task: a tokio worker runs the task it spawned last first, so tasks spawned in
/// a row start out of order. Spawn the future afterwards if this returns false;
/// the task polls it again (registering its real waker) before anything is lost.
pub fn poll_once<F: Future + ?Sized>(fut: &mut Pin<Box<F>>) -> bool {
    poll_now(fut).is_some()
}
