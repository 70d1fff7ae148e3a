//! One accepted connection: the handshake, then the transmission reader that
//! decodes requests and spawns each on its own task.

use super::exec::{self, ExportState, ReplyData};
use super::writer::{run_writer, Reply};
use super::Ctx;
use crate::io::fill;
use crate::proto::{
    decode_request, encode_simple_reply, errno, Command, NegotiateError, Progress, Request,
    ServerNegotiator, SimpleReply, REQUEST_BYTES,
};
use bytes::{Buf, BytesMut};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};

/// Why the transmission phase ended.
#[derive(Debug)]
enum End {
    /// `NBD_CMD_DISC`.
    Disconnect,
    /// The client closed the socket between requests.
    Eof,
    /// Read error or mid-message end of stream.
    Io(std::io::Error),
    /// A protocol violation; the connection is closed after in-flight requests.
    Violation(&'static str),
    /// The server is shutting down.
    Shutdown,
    /// The export was removed.
    ExportGone,
}

/// Serves one accepted TCP connection from greeting to close.
pub(crate) async fn serve(ctx: Arc<Ctx>, mut sock: TcpStream, peer: SocketAddr) {
    if let Err(e) = sock.set_nodelay(true) {
        tracing::warn!(%peer, error = %e, "TCP_NODELAY failed");
    }
    let mut buf = BytesMut::new();
    let mut shutdown = ctx.shutdown.clone();
    let timeout = Duration::from_millis(ctx.limits.handshake_timeout_ms);
    let picked = tokio::select! {
        r = tokio::time::timeout(timeout, handshake(&ctx, &mut sock, &mut buf, peer)) => r,
        _ = shutdown.wait_for(|s| *s) => return,
    };
    let export = match picked {
        Ok(Ok(Some(e))) => e,
        Ok(Ok(None)) => return,
        Ok(Err(e)) => {
            tracing::debug!(%peer, error = %e, "handshake I/O failed");
            return;
        }
        Err(_) => {
            tracing::warn!(%peer, "NBD handshake timed out");
            return;
        }
    };
    let (name, export) = export;
    tracing::info!(%peer, export = %name, "NBD client connected");
    let (rd, wr) = sock.into_split();
    transmission(ctx, export, rd, wr, buf, peer).await;
}

/// Option haggling over the exports served when it starts. `Ok(Some(_))`: serve
/// that export (name, state); `Ok(None)`: close quietly.
async fn handshake(
    ctx: &Ctx,
    sock: &mut TcpStream,
    buf: &mut BytesMut,
    peer: SocketAddr,
) -> std::io::Result<Option<(String, Arc<ExportState>)>> {
    let snap = ctx.snapshot();
    let mut neg = ServerNegotiator::new(
        &snap.infos,
        snap.default_export,
        ctx.limits.option_bytes_max,
    );
    sock.write_all(&neg.greeting()).await?;
    let mut out = BytesMut::new();
    loop {
        let r = neg.advance(buf, &mut out);
        if !out.is_empty() {
            sock.write_all(&out).await?;
            out.clear();
        }
        match r {
            Ok(Progress::NeedInput) => {
                let want = buf.len() + 1;
                if !fill(sock, buf, want).await? {
                    return Ok(None);
                }
            }
            Ok(Progress::Abort) => return Ok(None),
            // This server does not offer TLS yet (TlsPolicy::Off): never reached.
            Ok(Progress::StartTls) => return Ok(None),
            Ok(Progress::Transmission { export_index }) => {
                let (Some(info), Some(state)) =
                    (snap.infos.get(export_index), snap.states.get(export_index))
                else {
                    return Ok(None);
                };
                return Ok(Some((info.name.clone(), state.clone())));
            }
            Err(NegotiateError::UnknownExport(name)) => {
                tracing::warn!(%peer, export = %name, "NBD client asked for an unknown export");
                return Ok(None);
            }
            Err(e) => {
                tracing::warn!(%peer, error = %e, "NBD handshake refused");
                return Ok(None);
            }
        }
    }
}

/// What every request task of a connection shares.
struct Conn {
    export: Arc<ExportState>,
    tx: mpsc::Sender<Reply>,
    slots: Arc<Semaphore>,
    budget: Arc<Semaphore>,
    request_bytes_max: u32,
    peer: SocketAddr,
}

async fn transmission<R, W>(
    ctx: Arc<Ctx>,
    export: Arc<ExportState>,
    mut rd: R,
    wr: W,
    mut buf: BytesMut,
    peer: SocketAddr,
) where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let limits = &ctx.limits;
    let mut gone = export.gone.subscribe();
    let slots_max = limits.requests_in_flight_max.max(1);
    // Every queued reply holds a slot, so the channel never holds more than that.
    let (tx, rx) = mpsc::channel(slots_max);
    let writer = tokio::spawn(run_writer(wr, rx));
    let conn = Conn {
        export,
        tx,
        slots: Arc::new(Semaphore::new(slots_max)),
        budget: Arc::new(Semaphore::new(limits.in_flight_bytes_max)),
        request_bytes_max: limits.request_bytes_max,
        peer,
    };
    let mut shutdown = ctx.shutdown.clone();
    let end = tokio::select! {
        e = conn.read_loop(&mut rd, &mut buf) => e,
        _ = shutdown.wait_for(|s| *s) => End::Shutdown,
        _ = gone.wait_for(|g| *g) => End::ExportGone,
    };
    match &end {
        End::Disconnect | End::Eof | End::Shutdown | End::ExportGone => {
            tracing::info!(%peer, reason = ?end, "NBD connection closing")
        }
        End::Io(e) => tracing::info!(%peer, error = %e, "NBD connection lost"),
        End::Violation(why) => tracing::warn!(%peer, why, "NBD protocol violation; closing"),
    }
    // Let in-flight requests finish and their replies go out, then close.
    let drain = Duration::from_millis(limits.drain_timeout_ms);
    let all = u32::try_from(slots_max).unwrap_or(u32::MAX);
    if tokio::time::timeout(drain, conn.slots.acquire_many(all))
        .await
        .is_err()
    {
        tracing::warn!(%peer, "NBD requests did not finish in time");
    }
    drop(conn);
    drop(rd);
    let mut writer = writer;
    if tokio::time::timeout(Duration::from_secs(2), &mut writer)
        .await
        .is_err()
    {
        writer.abort();
    }
}

impl Conn {
    async fn read_loop<R: AsyncRead + Unpin>(&self, rd: &mut R, buf: &mut BytesMut) -> End {
        loop {
            match fill(rd, buf, REQUEST_BYTES).await {
                Ok(true) => {}
                Ok(false) => return End::Eof,
                Err(e) => return End::Io(e),
            }
            let req = match decode_request(&buf[..REQUEST_BYTES]) {
                Ok(r) => r,
                Err(e) => {
                    tracing::warn!(peer = %self.peer, error = %e, "bad NBD request header");
                    return End::Violation("bad request magic");
                }
            };
            buf.advance(REQUEST_BYTES);
            let Ok(slot) = self.slots.clone().acquire_owned().await else {
                return End::Violation("closed");
            };
            match req.command {
                Command::Disc => return End::Disconnect,
                Command::Write if req.length_bytes > self.request_bytes_max => {
                    tracing::warn!(peer = %self.peer, length = req.length_bytes,
                        "NBD write longer than the maximum payload; closing");
                    self.reply(&req, errno::EOVERFLOW, (slot, None)).await;
                    return End::Violation("write payload too long");
                }
                Command::Read if req.length_bytes > self.request_bytes_max => {
                    tracing::warn!(peer = %self.peer, length = req.length_bytes,
                        "NBD read longer than the maximum payload");
                    self.reply(&req, errno::EOVERFLOW, (slot, None)).await;
                }
                Command::Read
                | Command::Write
                | Command::Flush
                | Command::Trim
                | Command::WriteZeroes => {
                    let bytes = match req.command {
                        Command::Read | Command::Write => req.length_bytes,
                        _ => 0,
                    };
                    let budget = if bytes > 0 {
                        match self.budget.clone().acquire_many_owned(bytes).await {
                            Ok(p) => Some(p),
                            Err(_) => return End::Violation("closed"),
                        }
                    } else {
                        None
                    };
                    let payload_len = req.payload_bytes() as usize;
                    let payload = if payload_len > 0 {
                        match fill(rd, buf, payload_len).await {
                            Ok(true) => buf.split_to(payload_len).freeze(),
                            Ok(false) => return End::Io(std::io::ErrorKind::UnexpectedEof.into()),
                            Err(e) => return End::Io(e),
                        }
                    } else {
                        block::Bytes::new()
                    };
                    let g = self.export.volume.geometry();
                    if let Err(err) = exec::validate(&req, &g, self.export.read_only) {
                        tracing::warn!(peer = %self.peer, command = ?req.command,
                            offset = req.offset_bytes, length = req.length_bytes,
                            flags = req.flags, error = err, "NBD request refused");
                        self.reply(&req, err, (slot, budget)).await;
                        continue;
                    }
                    let Some(entered) = self.export.enter() else {
                        self.reply(&req, errno::ESHUTDOWN, (slot, budget)).await;
                        return End::ExportGone;
                    };
                    self.spawn(req, payload, (slot, budget), entered);
                }
                Command::Cache | Command::BlockStatus | Command::Unknown(_) => {
                    tracing::warn!(peer = %self.peer, command = req.command.code(),
                        "unsupported NBD command");
                    self.reply(&req, errno::EINVAL, (slot, None)).await;
                }
            }
        }
    }

    /// Queues a reply without data.
    async fn reply(
        &self,
        req: &Request,
        error: u32,
        permits: (OwnedSemaphorePermit, Option<OwnedSemaphorePermit>),
    ) {
        let hdr = encode_simple_reply(&SimpleReply {
            error,
            cookie: req.cookie,
        });
        let _ = self
            .tx
            .send(Reply {
                hdr,
                data: ReplyData::None,
                _permits: permits,
            })
            .await;
    }

    fn spawn(
        &self,
        req: Request,
        payload: block::Bytes,
        permits: (OwnedSemaphorePermit, Option<OwnedSemaphorePermit>),
        entered: OwnedSemaphorePermit,
    ) {
        let export = self.export.clone();
        let tx = self.tx.clone();
        let peer = self.peer;
        tokio::spawn(async move {
            let done = exec::execute(&export, &req, payload).await;
            // The volume is done with this request: the export may be removed.
            drop(entered);
            let (error, data) = match done {
                Ok(d) => (0, d),
                Err(e) => {
                    let err = exec::errno_of(&e, req.command);
                    tracing::warn!(%peer, command = ?req.command, offset = req.offset_bytes,
                        length = req.length_bytes, error = %e, "NBD request failed");
                    (err, ReplyData::None)
                }
            };
            let hdr = encode_simple_reply(&SimpleReply {
                error,
                cookie: req.cookie,
            });
            let _ = tx
                .send(Reply {
                    hdr,
                    data,
                    _permits: permits,
                })
                .await;
        });
    }
}
