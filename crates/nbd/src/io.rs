//! Socket helpers shared by the server and the client: filling a receive buffer to
//! a bound, and writing a batch of slices with vectored writes.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use std::io::{self, IoSlice};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// Smallest read issued when the buffer must grow, so headers arrive in batches.
pub(crate) const READ_CHUNK_BYTES: usize = 256 * 1024;

/// Most slices handed to one `writev`.
const IOV_MAX: usize = 512;

/// Reads until `buf` holds at least `n` bytes. Returns `Ok(false)` on a clean end of
/// stream (nothing buffered), `UnexpectedEof` if the peer stopped mid-message.
pub(crate) async fn fill<R: AsyncRead + Unpin>(
    rd: &mut R,
    buf: &mut BytesMut,
    n: usize,
) -> io::Result<bool> {
    fill_within(rd, buf, n, None).await
}

/// [`fill`], each read failing with `TimedOut` after `stall` without a byte.
async fn fill_within<R: AsyncRead + Unpin>(
    rd: &mut R,
    buf: &mut BytesMut,
    n: usize,
    stall: Option<std::time::Duration>,
) -> io::Result<bool> {
    while buf.len() < n {
        let want = n - buf.len();
        if buf.capacity() - buf.len() < want {
            buf.reserve(want.max(READ_CHUNK_BYTES));
        }
        if read_within(rd, buf, stall).await? == 0 {
            if buf.is_empty() {
                return Ok(false);
            }
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
    }
    Ok(true)
}

/// Payloads at least this long that are not yet all buffered are read into a
/// buffer of their own (see [`take_payload`]).
pub(crate) const OWN_BUFFER_BYTES: usize = 64 * 1024;

/// Reads until `buf` holds `n` bytes, never reading past them: whatever follows
/// stays in the socket. Same results as [`fill`].
pub(crate) async fn fill_exact<R: AsyncRead + Unpin>(
    rd: &mut R,
    buf: &mut BytesMut,
    n: usize,
) -> io::Result<bool> {
    if buf.capacity() < n {
        buf.reserve(n - buf.len());
    }
    while buf.len() < n {
        let want = n - buf.len();
        if rd.read_buf(&mut (&mut *buf).limit(want)).await? == 0 {
            if buf.is_empty() {
                return Ok(false);
            }
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
    }
    Ok(true)
}

/// The first `n` bytes of `buf`, taken out of it. One shorter than
/// [`OWN_BUFFER_BYTES`] is copied: a slice would keep the whole shared
/// receive buffer (up to [`READ_CHUNK_BYTES`] and more) alive while its
/// write runs, while the node's buffer budget counts only its length (review
/// of 2026-12-06: 1-byte writes each kept a 256 KiB buffer); longer ones keep
/// at most a few times their length.
fn split_payload(buf: &mut BytesMut, n: usize) -> Bytes {
    if n < OWN_BUFFER_BYTES {
        let b = Bytes::copy_from_slice(&buf[..n]);
        buf.advance(n);
        b
    } else {
        buf.split_to(n).freeze()
    }
}

/// Takes the next `n` bytes of the stream: from `buf` when they are all there,
/// else from `buf` and then `rd`. A payload of [`OWN_BUFFER_BYTES`] or more is
/// read into a buffer of its own, so that growing the shared receive buffer
/// never copies it (the bytes already buffered are copied once). Its reads
/// may take up to `ahead_bytes` past its end (the header that follows it, when
/// the peer already sent it): those are left in `buf`, so that the next header
/// costs no read of its own, and they are the only bytes past the payload ever
/// read (never the start of a next large payload, which would then be copied
/// out of `buf`). `Ok(None)`: the stream ended first.
/// Every read fails with `TimedOut` once `stall` passes without a byte.
pub(crate) async fn take_payload<R: AsyncRead + Unpin>(
    rd: &mut R,
    buf: &mut BytesMut,
    n: usize,
    ahead_bytes: usize,
    stall: std::time::Duration,
) -> io::Result<Option<Bytes>> {
    if buf.len() >= n {
        return Ok(Some(split_payload(buf, n)));
    }
    if n < OWN_BUFFER_BYTES {
        let full = fill_within(rd, buf, n, Some(stall)).await?;
        return Ok(full.then(|| split_payload(buf, n)));
    }
    let end = n.saturating_add(ahead_bytes);
    let mut own = BytesMut::with_capacity(end);
    own.extend_from_slice(buf);
    buf.clear();
    while own.len() < n {
        let want = end - own.len();
        if read_within(rd, &mut (&mut own).limit(want), Some(stall)).await? == 0 {
            if own.is_empty() {
                return Ok(None);
            }
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
    }
    // what was read past the payload (at most `ahead_bytes`) goes back to `buf`
    buf.extend_from_slice(&own[n..]);
    own.truncate(n);
    Ok(Some(own.freeze()))
}

/// What [`splice_payload`] ended with.
pub(crate) enum Spliced {
    /// The whole payload is in the pipe.
    Done,
    /// The stream ended first.
    Eof,
    /// The pipe ran out of room (the payload arrived in more, smaller socket
    /// fragments than it has slots): what it held is back in `buf`, and the
    /// rest is to be read the ordinary way.
    Spilled,
}

/// Moves the next `n` bytes of the stream into `pipe`: those already in
/// `buf` (fewer than `n`: the caller checks) by a copy, the rest straight
/// from the socket `sock` by `splice`, without passing through a buffer.
/// Every wait for the socket fails with `TimedOut` once `stall` passes
/// without a byte, as [`take_payload`]'s reads do.
pub(crate) async fn splice_payload(
    sock: &tokio::net::TcpStream,
    buf: &mut BytesMut,
    n: usize,
    pipe: &mut block::PipePayload,
    stall: std::time::Duration,
) -> io::Result<Spliced> {
    use std::os::fd::AsRawFd;
    pipe.push(buf)?;
    buf.clear();
    let fd = sock.as_raw_fd();
    while pipe.len() < n {
        let want = n - pipe.len();
        match sock.try_io(tokio::io::Interest::READABLE, || pipe.fill_from(fd, want)) {
            Ok(0) => return Ok(Spliced::Eof),
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                if block::readable_bytes(fd) > 0 {
                    // Bytes came in since the splice found none, or the pipe
                    // cannot take them. They are in the socket now, so a
                    // splice that still moves nothing means the pipe is out
                    // of room (this one bypasses tokio's readiness, which the
                    // failed one cleared).
                    match pipe.fill_from(fd, want) {
                        Ok(0) => return Ok(Spliced::Eof),
                        Ok(_) => continue,
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                            buf.extend_from_slice(&pipe.take_bytes()?);
                            return Ok(Spliced::Spilled);
                        }
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                        Err(e) => return Err(e),
                    }
                }
                match tokio::time::timeout(stall, sock.readable()).await {
                    Ok(r) => r?,
                    Err(_) => {
                        return Err(io::Error::new(
                            io::ErrorKind::TimedOut,
                            "no payload bytes for the stall time",
                        ))
                    }
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(Spliced::Done)
}

/// One read into `buf`; with a `stall`, failing with `TimedOut` after it
/// without a byte.
async fn read_within<R: AsyncRead + Unpin, B: BufMut>(
    rd: &mut R,
    buf: &mut B,
    stall: Option<std::time::Duration>,
) -> io::Result<usize> {
    let Some(stall) = stall else {
        return rd.read_buf(buf).await;
    };
    match tokio::time::timeout(stall, rd.read_buf(buf)).await {
        Ok(r) => r,
        Err(_) => Err(io::Error::new(
            io::ErrorKind::TimedOut,
            "no payload bytes for the stall time",
        )),
    }
}

/// Writes every slice of `parts`, in order, with as few `writev` calls as the
/// socket allows.
pub(crate) async fn write_all_vectored<W: AsyncWrite + Unpin>(
    sock: &mut W,
    parts: &[&[u8]],
) -> io::Result<()> {
    let mut idx = 0usize;
    let mut off = 0usize;
    let mut slices: Vec<IoSlice<'_>> = Vec::with_capacity(parts.len().min(IOV_MAX));
    while idx < parts.len() {
        if parts[idx].len() == off {
            idx += 1;
            off = 0;
            continue;
        }
        slices.clear();
        slices.push(IoSlice::new(&parts[idx][off..]));
        slices.extend(
            parts[idx + 1..]
                .iter()
                .filter(|p| !p.is_empty())
                .take(IOV_MAX - 1)
                .map(|p| IoSlice::new(p)),
        );
        let mut n = sock.write_vectored(&slices).await?;
        if n == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        while n > 0 && idx < parts.len() {
            let left = parts[idx].len() - off;
            if n >= left {
                n -= left;
                idx += 1;
                off = 0;
            } else {
                off += n;
                n = 0;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A connected pair of sockets on loopback.
    async fn pair() -> (tokio::net::TcpStream, tokio::net::TcpStream) {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let tx = tokio::net::TcpStream::connect(l.local_addr().unwrap())
            .await
            .unwrap();
        let (rx, _) = l.accept().await.unwrap();
        (tx, rx)
    }

    /// A payload whose bytes the pipe has no room for while the socket holds
    /// them is given back: what the pipe held returns to the buffer, in
    /// order, and the rest stays in the socket for an ordinary read.
    #[tokio::test]
    async fn a_pipe_out_of_room_gives_its_payload_back() {
        let (mut tx, rx) = pair().await;
        let cap = block::PIPE_CAPACITY_BYTES;
        let head: Vec<u8> = (0..cap - 100).map(|i| (i % 253) as u8).collect();
        let tail = vec![7u8; 6000];
        tx.write_all(&tail).await.unwrap();
        while block::readable_bytes(std::os::fd::AsRawFd::as_raw_fd(&rx)) < tail.len() {
            rx.readable().await.unwrap();
        }
        let mut buf = BytesMut::from(&head[..]);
        let mut pipe = block::PipePayload::new().unwrap();
        let n = head.len() + tail.len();
        let stall = std::time::Duration::from_secs(10);
        let r = splice_payload(&rx, &mut buf, n, &mut pipe, stall).await;
        assert!(matches!(r, Ok(Spliced::Spilled)));
        assert!(pipe.is_empty());
        assert_eq!(buf.len(), head.len());
        assert!(buf[..] == head[..]);
        let mut rx = rx;
        let rest = take_payload(&mut rx, &mut buf, n, 0, stall)
            .await
            .unwrap()
            .unwrap();
        assert!(rest[..head.len()] == head[..] && rest[head.len()..] == tail[..]);
    }

    /// A payload spliced while its bytes trickle in arrives whole; a stream
    /// ending in the middle of one says so; a peer silent for the stall time
    /// fails the read.
    #[tokio::test]
    async fn a_payload_is_spliced_as_it_arrives() {
        let (mut tx, rx) = pair().await;
        let payload: Vec<u8> = (0..200_000u32).map(|i| (i % 249) as u8).collect();
        let mut buf = BytesMut::from(&payload[..500]);
        let sender = {
            let p = payload.clone();
            tokio::spawn(async move {
                for piece in p[500..].chunks(7000) {
                    tx.write_all(piece).await.unwrap();
                    tokio::task::yield_now().await;
                }
                tx
            })
        };
        let mut pipe = block::PipePayload::new().unwrap();
        let stall = std::time::Duration::from_secs(10);
        let r = splice_payload(&rx, &mut buf, payload.len(), &mut pipe, stall).await;
        assert!(matches!(r, Ok(Spliced::Done)));
        assert!(buf.is_empty());
        assert!(pipe.take_bytes().unwrap()[..] == payload[..]);

        let mut tx = sender.await.unwrap();
        tx.write_all(&payload[..100]).await.unwrap();
        let short = std::time::Duration::from_millis(50);
        let r = splice_payload(&rx, &mut buf, 1000, &mut pipe, short).await;
        assert_eq!(r.err().map(|e| e.kind()), Some(io::ErrorKind::TimedOut));
        drop(tx);
        let r = splice_payload(&rx, &mut buf, 1000, &mut pipe, stall).await;
        assert!(matches!(r, Ok(Spliced::Eof)));
    }

    #[tokio::test]
    async fn vectored_write_survives_short_writes() {
        // A tiny duplex forces partial writes.
        let (mut a, mut b) = tokio::io::duplex(7);
        let parts: Vec<Vec<u8>> = (0..50u8).map(|i| vec![i; (i as usize) % 5]).collect();
        let expect: Vec<u8> = parts.concat();
        let reader = tokio::spawn(async move {
            let mut v = Vec::new();
            b.read_to_end(&mut v).await.unwrap();
            v
        });
        let refs: Vec<&[u8]> = parts.iter().map(|p| &p[..]).collect();
        write_all_vectored(&mut a, &refs).await.unwrap();
        drop(a);
        assert_eq!(reader.await.unwrap(), expect);
    }

    const STALL: std::time::Duration = std::time::Duration::from_secs(30);

    #[tokio::test]
    async fn a_payload_that_stops_coming_times_out() {
        for n in [100, OWN_BUFFER_BYTES + 100] {
            let (mut a, mut b) = tokio::io::duplex(1 << 20);
            a.write_all(&vec![7u8; n - 10]).await.unwrap();
            let mut buf = BytesMut::new();
            let stall = std::time::Duration::from_millis(50);
            let e = take_payload(&mut b, &mut buf, n, 0, stall)
                .await
                .unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::TimedOut, "{n} bytes");
            drop(a);
        }
    }

    /// A small payload does not share the receive buffer's allocation (it
    /// would keep all of it alive while counted at its own length).
    #[tokio::test]
    async fn a_small_payload_is_not_a_slice_of_the_receive_buffer() {
        let (mut a, mut b) = tokio::io::duplex(1 << 20);
        a.write_all(&[5u8; 300]).await.unwrap();
        let mut buf = BytesMut::new();
        assert!(fill(&mut b, &mut buf, 100).await.unwrap());
        let (base, cap) = (buf.as_ptr() as usize, buf.capacity());
        for n in [1, 10, 100] {
            let got = take_payload(&mut b, &mut buf, n, 0, STALL)
                .await
                .unwrap()
                .unwrap();
            assert_eq!(&got[..], &vec![5u8; n][..]);
            assert!(
                !(base..base + cap).contains(&(got.as_ptr() as usize)),
                "a {n}-byte payload is a slice of the {cap}-byte receive buffer"
            );
        }
    }

    #[tokio::test]
    async fn large_payload_is_read_to_its_end_only() {
        let (mut a, mut b) = tokio::io::duplex(4096);
        let n = OWN_BUFFER_BYTES + 1000;
        let data: Vec<u8> = (0..n + 3).map(|i| (i % 251) as u8).collect();
        let sent = data.clone();
        let writer = tokio::spawn(async move { a.write_all(&sent).await.unwrap() });
        let mut buf = BytesMut::new();
        assert!(fill(&mut b, &mut buf, 10).await.unwrap());
        let got = take_payload(&mut b, &mut buf, n, 0, STALL)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(&got[..], &data[..n]);
        // nothing past the payload was read; the rest follows exactly
        assert!(buf.is_empty());
        assert!(fill_exact(&mut b, &mut buf, 3).await.unwrap());
        assert_eq!(&buf[..], &data[n..]);
        writer.await.unwrap();
        // with read-ahead: at most `ahead` bytes past the payload, left in
        // `buf`, and the stream goes on right after them
        let (mut a, mut b) = tokio::io::duplex(1 << 20);
        let ahead = 28;
        let data: Vec<u8> = (0..2 * n + 100).map(|i| (i % 253) as u8).collect();
        a.write_all(&data).await.unwrap();
        let mut buf = BytesMut::new();
        let got = take_payload(&mut b, &mut buf, n, ahead, STALL)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(&got[..], &data[..n]);
        assert_eq!(&buf[..], &data[n..n + ahead]);
        assert_eq!(got.len(), n, "the payload holds nothing past its end");
        buf.clear();
        let next = take_payload(&mut b, &mut buf, n, ahead, STALL)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(&next[..], &data[n + ahead..2 * n + ahead]);
        assert_eq!(&buf[..], &data[2 * n + ahead..2 * n + 2 * ahead]);
        // the stream ending right after the payload is no error
        let (mut a, mut b) = tokio::io::duplex(1 << 20);
        a.write_all(&data[..n]).await.unwrap();
        drop(a);
        let mut buf = BytesMut::new();
        let got = take_payload(&mut b, &mut buf, n, ahead, STALL)
            .await
            .unwrap()
            .unwrap();
        assert_eq!((got.len(), buf.len()), (n, 0));
        // small payloads come from the shared buffer, the stream ending mid-way fails
        let (mut a, mut b) = tokio::io::duplex(64);
        a.write_all(b"0123456789").await.unwrap();
        drop(a);
        let mut buf = BytesMut::new();
        assert_eq!(
            &take_payload(&mut b, &mut buf, 4, 28, STALL)
                .await
                .unwrap()
                .unwrap()[..],
            b"0123"
        );
        let e = take_payload(&mut b, &mut buf, OWN_BUFFER_BYTES, 28, STALL)
            .await
            .unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
    }

    #[tokio::test]
    async fn fill_reports_clean_and_unclean_eof() {
        let (mut a, mut b) = tokio::io::duplex(64);
        a.write_all(b"abc").await.unwrap();
        drop(a);
        let mut buf = BytesMut::new();
        assert!(fill(&mut b, &mut buf, 2).await.unwrap());
        let e = fill(&mut b, &mut buf, 5).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
        let mut empty = BytesMut::new();
        assert!(!fill(&mut b, &mut empty, 1).await.unwrap());
    }
}
