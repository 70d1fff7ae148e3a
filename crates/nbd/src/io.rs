//! Socket helpers shared by the server and the client: filling a receive buffer to
//! a bound, and writing a batch of slices with vectored writes.

use bytes::BytesMut;
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
    while buf.len() < n {
        let want = n - buf.len();
        if buf.capacity() - buf.len() < want {
            buf.reserve(want.max(READ_CHUNK_BYTES));
        }
        if rd.read_buf(buf).await? == 0 {
            if buf.is_empty() {
                return Ok(false);
            }
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
    }
    Ok(true)
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
