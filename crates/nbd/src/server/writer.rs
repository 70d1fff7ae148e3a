//! The one writer task of a connection: batches queued replies and writes headers
//! and read data with vectored writes, without copying the data. A reply's
//! buffers, and the node budget they hold, are dropped once its batch is written;
//! a client that takes no data for [`CLIENT_STALL_MS`] fails the writer, so the
//! replies queued for it go back to the node instead of waiting for it forever.

use super::exec::ReplyData;
use crate::io::write_all_vectored;
use crate::proto::STRUCTURED_REPLY_HEADER_BYTES;
use crate::proto::{encode_simple_reply, encode_structured_reply_header, rflag, rtype};
use crate::proto::{Command, Request, SimpleReply, StructuredReplyHeader};
use block::StallTimeout;
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, OwnedSemaphorePermit};

/// Most replies written in one batch.
const BATCH_REPLIES_MAX: usize = 64;
/// Most payload bytes written in one batch.
const BATCH_BYTES_MAX: usize = 4 * 1024 * 1024;
/// A batch smaller than this is held back for one scheduler turn while at
/// least [`COALESCE_OTHERS_MIN`] other requests are still running, so their
/// replies, about to be queued, leave in the same write.
const COALESCE_BYTES_MAX: usize = 64 * 1024;
/// Requests still running (besides the batch) that make one more turn worthwhile.
const COALESCE_OTHERS_MIN: usize = 8;
/// Time a client may take none of the data queued for it before the writer
/// gives up (every byte it takes starts the time again).
const CLIENT_STALL_MS: u64 = 30_000;

/// Longest reply header: an `OFFSET_DATA` chunk header with its offset.
const REPLY_HEADER_BYTES_MAX: usize = STRUCTURED_REPLY_HEADER_BYTES + 8;

/// The encoded header of one reply: a simple reply, or the one structured
/// chunk (flagged DONE) that answers a request when structured replies were
/// negotiated, with the fixed part of its payload.
///
/// With structured replies negotiated, a request that succeeded with nothing
/// to return (a write, flush, trim, write zeroes) still gets a simple reply:
/// the protocol allows either for every command but READ (and requires a
/// chunk for any reply with a payload), nbdkit does the same, and a client
/// reads the 16 bytes of a simple reply in one `recv` where libnbd reads a
/// 20-byte chunk header in two. Errors and READs stay structured.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ReplyHeader {
    buf: [u8; REPLY_HEADER_BYTES_MAX],
    len: usize,
}

impl ReplyHeader {
    /// The header of the reply to `req` with `error` (0: success) and `data`.
    pub(crate) fn new(structured: bool, req: &Request, error: u32, data: &ReplyData) -> Self {
        let mut h = ReplyHeader {
            buf: [0; REPLY_HEADER_BYTES_MAX],
            len: 0,
        };
        let plain_success =
            error == 0 && req.command != Command::Read && matches!(data, ReplyData::None);
        if !structured || plain_success {
            let b = encode_simple_reply(&SimpleReply {
                error,
                cookie: req.cookie,
            });
            h.put(&b);
            return h;
        }
        let data_len = u32::try_from(data.len_bytes()).unwrap_or(u32::MAX);
        let chunk = |reply_type, length_bytes| {
            encode_structured_reply_header(&StructuredReplyHeader {
                flags: rflag::DONE,
                reply_type,
                cookie: req.cookie,
                length_bytes,
            })
        };
        if error != 0 {
            // errno, then an empty message
            h.put(&chunk(rtype::ERROR, 6));
            h.put(&error.to_be_bytes());
            h.put(&0u16.to_be_bytes());
        } else if let ReplyData::Status(_) = data {
            h.put(&chunk(rtype::BLOCK_STATUS, data_len));
        } else if req.command == Command::Read && data_len > 0 {
            h.put(&chunk(rtype::OFFSET_DATA, data_len.saturating_add(8)));
            h.put(&req.offset_bytes.to_be_bytes());
        } else {
            h.put(&chunk(rtype::NONE, 0));
        }
        h
    }

    fn put(&mut self, b: &[u8]) {
        self.buf[self.len..self.len + b.len()].copy_from_slice(b);
        self.len += b.len();
    }

    /// The bytes to send.
    pub(crate) fn bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

/// One reply to send.
#[derive(Debug)]
pub(crate) struct Reply {
    /// Encoded reply header.
    pub hdr: ReplyHeader,
    /// READ data (empty for everything else and for errors).
    pub data: ReplyData,
    /// The request's slot and byte budget: released once the reply is on the wire.
    pub _permits: (OwnedSemaphorePermit, Option<OwnedSemaphorePermit>),
}

/// Runs until every sender is gone (then shuts the socket down) or a write fails.
/// `in_flight` counts the connection's requests still holding a slot (running or
/// with a reply queued or in the batch).
pub(crate) async fn run_writer<W: AsyncWrite + Unpin>(
    sock: W,
    mut rx: mpsc::Receiver<Reply>,
    in_flight: impl Fn() -> usize,
) -> std::io::Result<()> {
    let mut sock = StallTimeout::new(sock, std::time::Duration::from_millis(CLIENT_STALL_MS));
    let mut batch: Vec<Reply> = Vec::with_capacity(BATCH_REPLIES_MAX);
    // (a batch must also go out at a minimum rate: every byte taken
    // restarts the stall timer)
    let mut floor = block::RateFloor::new(std::time::Duration::from_millis(CLIENT_STALL_MS));
    while let Some(first) = rx.recv().await {
        let mut bytes = first.data.len_bytes();
        batch.push(first);
        let mut waited = false;
        loop {
            while batch.len() < BATCH_REPLIES_MAX && bytes < BATCH_BYTES_MAX {
                match rx.try_recv() {
                    Ok(r) => {
                        bytes += r.data.len_bytes();
                        batch.push(r);
                    }
                    Err(_) => break,
                }
            }
            // Small replies with many requests still running: one turn lets
            // the executors queue theirs, and one write (one syscall, one TCP
            // segment train) carries them all. Never more than one turn, so a
            // reply waits at most one pass of the scheduler.
            if waited
                || batch.len() >= BATCH_REPLIES_MAX
                || bytes >= COALESCE_BYTES_MAX
                || in_flight().saturating_sub(batch.len()) < COALESCE_OTHERS_MIN
            {
                break;
            }
            waited = true;
            tokio::task::yield_now().await;
        }
        {
            let mut parts: Vec<&[u8]> = Vec::with_capacity(batch.len() * 2);
            for r in &batch {
                parts.push(r.hdr.bytes());
                match &r.data {
                    ReplyData::None => {}
                    ReplyData::One { data, .. } => parts.push(data),
                    ReplyData::Many { parts: v, .. } => parts.extend(v.iter().map(|b| &b[..])),
                    ReplyData::Status(b) => parts.push(b),
                }
            }
            // a batch must also go out at a minimum rate on the whole (every
            // byte taken restarts the stall timer)
            let total: usize = parts.iter().map(|p| p.len()).sum();
            floor
                .send(total, "client", write_all_vectored(&mut sock, &parts))
                .await?;
        }
        // TLS holds records back until flushed (a no-op on a plain socket).
        sock.flush().await?;
        batch.clear();
    }
    sock.flush().await?;
    sock.shutdown().await
}
