//! Small helpers: joining futures without spawning, uuids, rounding.

use std::future::Future;
use std::pin::Pin;
use std::task::Poll;

/// A boxed future that may borrow.
pub(crate) type BoxFut<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Runs every future to completion concurrently and returns the outputs in order.
pub(crate) async fn join_all<'a, T: Send + 'a>(futs: Vec<BoxFut<'a, T>>) -> Vec<T> {
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

/// A random 128-bit identifier as 32 hex digits.
pub(crate) fn new_uuid() -> String {
    format!("{:032x}", rand::random::<u128>())
}

/// The 64-bit tag of a pool uuid (tags journal records).
pub(crate) fn uuid_tag(uuid: &str) -> u64 {
    let hi = crc32c::crc32c(uuid.as_bytes()) as u64;
    let lo = crc32c::crc32c_append(0x5eed, uuid.as_bytes()) as u64;
    (hi << 32) | lo
}

/// Rounds `x` up to a multiple of `to` (`to > 0`).
pub(crate) fn align_up(x: u64, to: u64) -> u64 {
    x.div_ceil(to) * to
}
