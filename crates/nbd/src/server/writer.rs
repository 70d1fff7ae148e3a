//! The one writer task of a connection: batches queued replies and writes headers
//! and read data with vectored writes, without copying the data. A reply's
//! buffers, and the node budget they hold, are dropped once its batch is written;
//! a client that takes no data for [`CLIENT_STALL_MS`] fails the writer, so the
//! replies queued for it go back to the node instead of waiting for it forever.

use super::exec::ReplyData;
use crate::io::write_all_vectored;
use crate::proto::SIMPLE_REPLY_BYTES;
use block::StallTimeout;
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, OwnedSemaphorePermit};

/// Most replies written in one batch.
const BATCH_REPLIES_MAX: usize = 64;
/// Most payload bytes written in one batch.
const BATCH_BYTES_MAX: usize = 4 * 1024 * 1024;
/// Time a client may take none of the data queued for it before the writer
/// gives up (every byte it takes starts the time again).
const CLIENT_STALL_MS: u64 = 30_000;

/// One reply to send.
#[derive(Debug)]
pub(crate) struct Reply {
    /// Encoded simple reply header.
    pub hdr: [u8; SIMPLE_REPLY_BYTES],
    /// READ data (empty for everything else and for errors).
    pub data: ReplyData,
    /// The request's slot and byte budget: released once the reply is on the wire.
    pub _permits: (OwnedSemaphorePermit, Option<OwnedSemaphorePermit>),
}

/// Runs until every sender is gone (then shuts the socket down) or a write fails.
pub(crate) async fn run_writer<W: AsyncWrite + Unpin>(
    sock: W,
    mut rx: mpsc::Receiver<Reply>,
) -> std::io::Result<()> {
    let mut sock = StallTimeout::new(sock, std::time::Duration::from_millis(CLIENT_STALL_MS));
    let mut batch: Vec<Reply> = Vec::with_capacity(BATCH_REPLIES_MAX);
    while let Some(first) = rx.recv().await {
        let mut bytes = first.data.len_bytes();
        batch.push(first);
        while batch.len() < BATCH_REPLIES_MAX && bytes < BATCH_BYTES_MAX {
            match rx.try_recv() {
                Ok(r) => {
                    bytes += r.data.len_bytes();
                    batch.push(r);
                }
                Err(_) => break,
            }
        }
        {
            let mut parts: Vec<&[u8]> = Vec::with_capacity(batch.len() * 2);
            for r in &batch {
                parts.push(&r.hdr);
                match &r.data {
                    ReplyData::None => {}
                    ReplyData::One { data, .. } => parts.push(data),
                    ReplyData::Many { parts: v, .. } => parts.extend(v.iter().map(|b| &b[..])),
                }
            }
            write_all_vectored(&mut sock, &parts).await?;
        }
        // TLS holds records back until flushed (a no-op on a plain socket).
        sock.flush().await?;
        batch.clear();
    }
    sock.flush().await?;
    sock.shutdown().await
}
