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
