//! A writer that gives up on a peer that takes no bytes for too long.
//!
//! Data queued to a client that stopped reading holds its buffers (and their
//! [`BufferPermit`](crate::BufferPermit)s) for as long as the connection lives.
//! Frontends wrap their socket's write half in a [`StallTimeout`]: a write, flush
//! or shutdown that makes no progress at all for the stall time fails with
//! `TimedOut`, the connection closes and its buffers go back to the node. A slow
//! reader that takes a few bytes now and then is not a stalled one: every byte
//! taken starts the time again.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::AsyncWrite;

/// Slowest a peer may take a batch of data queued for it, in bytes a second,
/// past the stall time: every byte it takes restarts a [`StallTimeout`]'s
/// timer, so a peer taking a few bytes now and then would otherwise hold the
/// buffers of what is queued for it for good (4 MiB: the stall time + 64 s).
pub const PEER_RATE_MIN: usize = 64 * 1024;

/// The minimum rate a connection's writer holds its peer to, over the
/// connection's life: each batch may take the stall time plus its size at
/// [`PEER_RATE_MIN`], less how far behind that rate the peer already is. So a
/// slow moment is forgiven once the peer catches up, but the stall time is a
/// one-off allowance, not one per batch: a peer taking each small batch just
/// within it (a few KiB every 14 s) held the buffers of what was queued for
/// it for hours (review of 2026-12-06; before, every batch was timed alone).
pub struct RateFloor {
    stall: Duration,
    /// How far behind the minimum rate the peer is (0 up to `stall`).
    behind: Duration,
}

impl RateFloor {
    /// A floor with `stall` of allowance; `Duration::MAX` bounds nothing.
    pub fn new(stall: Duration) -> RateFloor {
        RateFloor {
            stall,
            behind: Duration::ZERO,
        }
    }

    /// Runs `send`, the writing of a batch of `bytes`, within the time the
    /// floor allows it; `TimedOut` past that (`peer` names who was too slow).
    pub async fn send<T>(
        &mut self,
        bytes: usize,
        peer: &str,
        send: impl Future<Output = io::Result<T>>,
    ) -> io::Result<T> {
        if self.stall == Duration::MAX {
            return send.await;
        }
        let due =
            Duration::from_micros((bytes as u64).saturating_mul(1_000_000) / PEER_RATE_MIN as u64);
        let limit = (self.stall + due).saturating_sub(self.behind);
        let started = tokio::time::Instant::now();
        match tokio::time::timeout(limit, send).await {
            Ok(r) => {
                let took = started.elapsed();
                self.behind = (self.behind + took).saturating_sub(due).min(self.stall);
                r
            }
            Err(_) => Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("the {peer} took less than {PEER_RATE_MIN} bytes a second of its data"),
            )),
        }
    }
}

/// `W` with a bound on the time a write may make no progress.
pub struct StallTimeout<W> {
    inner: W,
    stall: Duration,
    timer: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl<W> StallTimeout<W> {
    /// Wraps `inner`; writes fail after `stall` without progress.
    pub fn new(inner: W, stall: Duration) -> StallTimeout<W> {
        StallTimeout {
            inner,
            stall,
            timer: None,
        }
    }

    /// The wrapped writer.
    pub fn get_mut(&mut self) -> &mut W {
        &mut self.inner
    }

    /// Maps a poll of the inner writer: progress resets the timer, `Pending`
    /// starts it (once) and fails when it fires.
    fn guard<T>(&mut self, cx: &mut Context<'_>, r: Poll<io::Result<T>>) -> Poll<io::Result<T>> {
        match r {
            Poll::Ready(r) => {
                self.timer = None;
                Poll::Ready(r)
            }
            Poll::Pending => {
                let stall = self.stall;
                let t = self
                    .timer
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep(stall)));
                match t.as_mut().poll(cx) {
                    Poll::Ready(()) => {
                        self.timer = None;
                        Poll::Ready(Err(io::Error::new(
                            io::ErrorKind::TimedOut,
                            format!("the peer took no data for {} ms", stall.as_millis()),
                        )))
                    }
                    Poll::Pending => Poll::Pending,
                }
            }
        }
    }
}

impl<W: AsyncWrite + Unpin> AsyncWrite for StallTimeout<W> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        let r = Pin::new(&mut this.inner).poll_write(cx, buf);
        this.guard(cx, r)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        let r = Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        this.guard(cx, r)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        let r = Pin::new(&mut this.inner).poll_flush(cx);
        this.guard(cx, r)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        let r = Pin::new(&mut this.inner).poll_shutdown(cx);
        this.guard(cx, r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A batch gets the stall time plus its size at the minimum rate, not a
    /// moment more; `Duration::MAX` bounds nothing.
    #[tokio::test(start_paused = true)]
    async fn a_batch_gets_the_stall_time_plus_its_size_at_the_minimum_rate() {
        let stall = Duration::from_secs(1);
        let bytes = 3 * PEER_RATE_MIN;
        let takes = |secs: u64| async move {
            tokio::time::sleep(Duration::from_secs(secs)).await;
            Ok::<_, io::Error>(())
        };
        assert!(RateFloor::new(stall)
            .send(bytes, "peer", takes(3))
            .await
            .is_ok());
        let late = RateFloor::new(stall).send(bytes, "peer", takes(5)).await;
        assert_eq!(late.unwrap_err().kind(), io::ErrorKind::TimedOut);
        assert!(RateFloor::new(Duration::MAX)
            .send(bytes, "peer", takes(1000))
            .await
            .is_ok());
    }

    /// The stall time is allowed once over a connection's batches, not once
    /// each: a peer taking every small batch just within it is dropped at its
    /// second, while one that catches up after a slow moment goes on.
    #[tokio::test(start_paused = true)]
    async fn the_stall_time_is_allowed_once_not_per_batch() {
        let stall = Duration::from_secs(15);
        let takes = |secs: u64| async move {
            tokio::time::sleep(Duration::from_secs(secs)).await;
            Ok::<_, io::Error>(())
        };
        let batch = 32 * 1024; // half a second at the minimum rate
        let mut trickle = RateFloor::new(stall);
        assert!(trickle.send(batch, "peer", takes(14)).await.is_ok());
        let second = trickle.send(batch, "peer", takes(14)).await;
        assert_eq!(second.unwrap_err().kind(), io::ErrorKind::TimedOut);
        // slow once, then at the rate again: forgiven bit by bit
        let mut hiccup = RateFloor::new(stall);
        assert!(hiccup.send(batch, "peer", takes(14)).await.is_ok());
        for _ in 0..100 {
            assert!(hiccup
                .send(4 * PEER_RATE_MIN, "peer", takes(2))
                .await
                .is_ok());
        }
        assert!(hiccup.send(batch, "peer", takes(14)).await.is_ok());
    }

    #[tokio::test(start_paused = true)]
    async fn a_reader_that_stops_fails_the_write_a_slow_one_does_not() {
        let (mut client, server) = tokio::io::duplex(1024);
        let mut w = StallTimeout::new(server, Duration::from_secs(10));
        // a slow reader: 512 bytes every 5 s keeps the writer going
        let reader = tokio::spawn(async move {
            let mut buf = [0u8; 512];
            for _ in 0..8 {
                tokio::time::sleep(Duration::from_secs(5)).await;
                client.read_exact(&mut buf).await.unwrap();
            }
            client // then stops reading
        });
        w.write_all(&[7u8; 1024 + 8 * 512]).await.unwrap();
        let _client = reader.await.unwrap();
        let e = w.write_all(&[1u8; 2048]).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
    }
}
