//! One accepted connection: the handshake (with TLS after `NBD_OPT_STARTTLS`
//! when required), then the transmission reader that decodes requests and runs
//! each: to completion right there when the volume needs no wait for it, else
//! on a task of its own. The transmission phase is generic over the stream: a
//! plain socket is split into its own halves (no lock), a TLS stream through
//! `tokio::io::split`.

use super::exec::{self, ExportState, ReplyData};
use super::writer::{run_writer, Reply, ReplyHeader};
use super::{Acceptor, Ctx};
use crate::io::{fill, fill_exact, splice_payload, take_payload, Spliced, OWN_BUFFER_BYTES};
use crate::proto::{
    cmdflag, decode_request, errno, Command, NegotiateError, Progress, Request, ServerNegotiator,
    Session, TlsPolicy, REQUEST_BYTES,
};
use bytes::{Buf, BytesMut};
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::Poll;
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

/// The stream the handshake ended on: the transmission phase runs over it.
enum Stream {
    /// TLS not in use: the socket itself, split without a lock.
    Plain(TcpStream),
    /// After `NBD_OPT_STARTTLS`, with a certificate (rustls).
    Tls(Box<tokio_rustls::server::TlsStream<TcpStream>>),
    /// After `NBD_OPT_STARTTLS`, with a pre-shared key (OpenSSL).
    #[cfg(feature = "psk")]
    Psk(Box<tokio_openssl::SslStream<TcpStream>>),
}

/// A finished handshake: the stream, the export's name and its state, and
/// what the client negotiated (structured replies, metadata context).
type Picked = (Stream, String, Arc<ExportState>, Session);

/// A client's string as a log line may carry it: quoted and escaped (no
/// newline or terminal escape gets through to forge a line), at most 255
/// characters of it.
fn shown(s: &str) -> String {
    let head: String = s.chars().take(255).collect();
    let mut out = format!("{head:?}");
    if head.len() < s.len() {
        out.push_str("...");
    }
    out
}

/// Serves one accepted TCP connection from greeting to close.
/// `slot`: its place among the connections in their handshake, given back
/// when the handshake ends; taken back for a newer connection meanwhile, it
/// closes this one.
pub(crate) async fn serve(
    ctx: Arc<Ctx>,
    sock: TcpStream,
    peer: SocketAddr,
    slot: block::admission::AdmissionSlot,
) {
    if let Err(e) = sock.set_nodelay(true) {
        tracing::warn!(%peer, error = %e, "TCP_NODELAY failed");
    }
    let mut buf = BytesMut::new();
    let mut shutdown = ctx.shutdown.clone();
    let timeout = Duration::from_millis(ctx.limits.handshake_timeout_ms);
    let picked = tokio::select! {
        r = tokio::time::timeout(timeout, handshake(&ctx, sock, &mut buf, (peer, &slot))) => r,
        _ = shutdown.wait_for(|s| *s) => return,
        _ = slot.evicted() => {
            tracing::debug!(%peer, "NBD handshake closed: its place went to a newer connection");
            return;
        }
    };
    drop(slot);
    let (stream, name, export, session) = match picked {
        Ok(Ok(Some(p))) => p,
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
    // counted among the connections served until the end of this function
    let Some(_served) = ctx.admit_served(peer) else {
        return;
    };
    match stream {
        Stream::Plain(sock) => {
            tracing::info!(%peer, export = %name, "NBD client connected");
            let (rd, wr) = sock.into_split();
            transmission(ctx, (export, session), rd, wr, buf, peer).await;
        }
        Stream::Tls(tls) => {
            let client_cert = tls.get_ref().1.peer_certificates().is_some();
            tracing::info!(%peer, export = %name, client_cert, "NBD client connected over TLS");
            let (rd, wr) = tokio::io::split(*tls);
            transmission(ctx, (export, session), rd, wr, buf, peer).await;
        }
        #[cfg(feature = "psk")]
        Stream::Psk(tls) => {
            let identity = crate::psk::identity(tls.ssl()).unwrap_or_default();
            let version = tls.ssl().version_str();
            tracing::info!(%peer, export = %name, %identity, version,
                "NBD client connected over TLS-PSK");
            let (rd, wr) = tokio::io::split(*tls);
            transmission(ctx, (export, session), rd, wr, buf, peer).await;
        }
    }
}

/// What one round of option haggling ended with.
enum Step {
    /// Serve `exports[i]` of the snapshot.
    Export(usize),
    /// STARTTLS was acknowledged: run the TLS handshake.
    StartTls,
    /// Close quietly.
    Close,
}

/// The greeting, option haggling and, when TLS is required, the TLS handshake
/// after `NBD_OPT_STARTTLS` and the haggling that continues inside it.
/// `Ok(Some(_))`: serve that export over that stream; `Ok(None)`: close quietly.
async fn handshake(
    ctx: &Ctx,
    mut sock: TcpStream,
    buf: &mut BytesMut,
    (peer, slot): (SocketAddr, &block::admission::AdmissionSlot),
) -> std::io::Result<Option<Picked>> {
    let snap = ctx.snapshot();
    let policy = match ctx.tls {
        Some(_) => TlsPolicy::Require,
        None => TlsPolicy::Off,
    };
    let mut neg = ServerNegotiator::new(
        &snap.infos,
        snap.default_export,
        ctx.limits.option_bytes_max,
    )
    .with_tls(policy);
    sock.write_all(&neg.greeting()).await?;
    let pick = |i: usize| {
        let (Some(info), Some(state)) = (snap.infos.get(i), snap.states.get(i)) else {
            return None;
        };
        Some((info.name.clone(), state.clone()))
    };
    match haggle(&mut neg, &mut sock, buf, (ctx, peer, slot)).await? {
        Step::Export(i) => {
            let session = neg.session();
            return Ok(pick(i).map(|(n, s)| (Stream::Plain(sock), n, s, session)));
        }
        Step::Close => return Ok(None),
        Step::StartTls => {}
    }
    let Some(acceptor) = &ctx.tls else {
        return Ok(None);
    };
    match acceptor {
        Acceptor::X509(a) => match a.accept(sock).await {
            Ok(tls) => {
                let wrap = |t| Stream::Tls(Box::new(t));
                after_tls(neg, tls, buf, (ctx, peer, slot), pick, wrap).await
            }
            Err(e) => {
                tracing::warn!(%peer, error = %e, "NBD TLS handshake failed");
                Ok(None)
            }
        },
        #[cfg(feature = "psk")]
        Acceptor::Psk(c) => match accept_psk(c, sock).await {
            Ok(tls) => {
                let wrap = |t| Stream::Psk(Box::new(t));
                after_tls(neg, tls, buf, (ctx, peer, slot), pick, wrap).await
            }
            Err(e) => {
                tracing::warn!(%peer, error = %e,
                    "NBD TLS-PSK handshake failed (unknown identity, wrong key or no PSK offered)");
                Ok(None)
            }
        },
    }
}

/// The haggling that continues inside TLS, until an export is picked.
async fn after_tls<S: AsyncRead + AsyncWrite + Unpin>(
    mut neg: ServerNegotiator<'_>,
    mut tls: S,
    buf: &mut BytesMut,
    (ctx, peer, slot): (&Ctx, SocketAddr, &block::admission::AdmissionSlot),
    pick: impl Fn(usize) -> Option<(String, Arc<ExportState>)>,
    wrap: impl FnOnce(S) -> Stream,
) -> std::io::Result<Option<Picked>> {
    neg.tls_started();
    match haggle(&mut neg, &mut tls, buf, (ctx, peer, slot)).await? {
        Step::Export(i) => {
            let session = neg.session();
            Ok(pick(i).map(|(n, s)| (wrap(tls), n, s, session)))
        }
        // A second STARTTLS is answered NBD_REP_ERR_INVALID by the negotiator.
        Step::StartTls | Step::Close => Ok(None),
    }
}

/// The server side of a TLS-PSK handshake on `sock`.
#[cfg(feature = "psk")]
async fn accept_psk(
    ctx: &openssl::ssl::SslContext,
    sock: TcpStream,
) -> Result<tokio_openssl::SslStream<TcpStream>, String> {
    let ssl = openssl::ssl::Ssl::new(ctx).map_err(|e| e.to_string())?;
    let mut s = tokio_openssl::SslStream::new(ssl, sock).map_err(|e| e.to_string())?;
    std::pin::Pin::new(&mut s)
        .accept()
        .await
        .map_err(|e| e.to_string())?;
    Ok(s)
}

/// Feeds the negotiator what `sock` delivers and writes its answers until it
/// picks an export, asks for TLS or ends. The choice of an export is refused
/// while the connections served are at their bounds. A connection whose
/// option was answered is no longer idle: when the handshakes' places run
/// out, silent connections give theirs first (`slot`).
async fn haggle<S: AsyncRead + AsyncWrite + Unpin>(
    neg: &mut ServerNegotiator<'_>,
    sock: &mut S,
    buf: &mut BytesMut,
    (ctx, peer, slot): (&Ctx, SocketAddr, &block::admission::AdmissionSlot),
) -> std::io::Result<Step> {
    let mut out = BytesMut::new();
    loop {
        neg.set_busy(!ctx.served_has_room(peer));
        let refused = neg.busy_refusals();
        let r = neg.advance(buf, &mut out);
        if neg.busy_refusals() > refused {
            if let Some(held_back) = ctx.served_refusals.allow() {
                tracing::warn!(%peer, held_back, "NBD_OPT_GO refused: too many NBD connections served");
            }
        }
        if !out.is_empty() {
            slot.mark_active();
            sock.write_all(&out).await?;
            // TLS holds records back until flushed; plain TCP flushes at once.
            sock.flush().await?;
            out.clear();
        }
        match r {
            Ok(Progress::NeedInput) => {
                let want = buf.len() + 1;
                if !fill(sock, buf, want).await? {
                    return Ok(Step::Close);
                }
            }
            Ok(Progress::Flush) => {} // sent above; the input holds more
            Ok(Progress::Abort) => return Ok(Step::Close),
            Ok(Progress::StartTls) => return Ok(Step::StartTls),
            Ok(Progress::Transmission { export_index }) => return Ok(Step::Export(export_index)),
            Err(NegotiateError::Busy) => {
                if let Some(held_back) = ctx.served_refusals.allow() {
                    tracing::warn!(%peer, held_back, "NBD_OPT_EXPORT_NAME refused: too many NBD connections served");
                }
                return Ok(Step::Close);
            }
            Err(NegotiateError::UnknownExport(name)) => {
                tracing::warn!(%peer, export = %shown(&name), "NBD client asked for an unknown export");
                return Ok(Step::Close);
            }
            Err(e) => {
                tracing::warn!(%peer, error = %e, "NBD handshake refused");
                return Ok(Step::Close);
            }
        }
    }
}

/// Longest request run on the reader when the volume completes it at once.
const INLINE_BYTES_MAX: usize = 64 * 1024;

/// A request's work, from the volume call to the queued reply.
type Work = std::pin::Pin<Box<dyn Future<Output = ()> + Send>>;

/// What every request task of a connection shares.
struct Conn {
    export: Arc<ExportState>,
    tx: mpsc::Sender<Reply>,
    /// Writes go to the connection's executor task, so that copying their payload
    /// into the volume runs beside the reader taking in the next ones.
    exec_tx: mpsc::UnboundedSender<Work>,
    slots: Arc<Semaphore>,
    budget: Arc<Semaphore>,
    /// This connection's share of the node's budget of buffered bytes (a
    /// session of the export's from the peer's address, `[limits]
    /// session_buffer_max` and `source_buffer_max`): its READ data and WRITE
    /// payloads take their bytes from it, then from the node's.
    buffers: block::BufferBudget,
    request_bytes_max: u32,
    payload_stall_ms: u64,
    peer: SocketAddr,
    session: Session,
    /// Pipes that hold large write payloads between the socket and the file.
    pipes: Arc<PipePool>,
    /// Replies go to a plain socket: READ data may be a view of the volume's
    /// pages, which only the kernel reads ([`block::Volume::read_to_socket`]);
    /// under TLS it is encrypted in this process.
    plain: bool,
}

/// Most pipes one connection holds at a time (each two descriptors and up to
/// a payload's pages); the writes beyond are read into buffers.
const PIPES_PER_CONNECTION_MAX: usize = 8;

/// A connection's pipes for large write payloads ([`block::PipePayload`]):
/// taken by the reader, given back empty when the write is done.
#[derive(Default)]
struct PipePool {
    free: parking_lot::Mutex<Vec<block::PipePayload>>,
    /// Pipes out of the pool or in it.
    live: AtomicUsize,
    /// The system refused a pipe (descriptors or pipe pages ran out): none
    /// is asked for again on this connection.
    refused: AtomicBool,
}

impl PipePool {
    /// An empty pipe, if one can be had.
    fn take(self: &Arc<Self>) -> Option<PooledPipe> {
        if let Some(p) = self.free.lock().pop() {
            return Some(PooledPipe {
                pipe: Some(p),
                pool: self.clone(),
            });
        }
        if self.refused.load(Ordering::Relaxed)
            || self.live.load(Ordering::Relaxed) >= PIPES_PER_CONNECTION_MAX
        {
            return None;
        }
        match block::PipePayload::new() {
            Ok(p) => {
                self.live.fetch_add(1, Ordering::Relaxed);
                Some(PooledPipe {
                    pipe: Some(p),
                    pool: self.clone(),
                })
            }
            Err(e) => {
                tracing::info!(error = %e, "no pipe for NBD write payloads; they are read into buffers");
                self.refused.store(true, Ordering::Relaxed);
                None
            }
        }
    }
}

/// A pipe out of its connection's pool; back into it when dropped empty
/// (closed when it still holds bytes: they are a failed write's).
struct PooledPipe {
    pipe: Option<block::PipePayload>,
    pool: Arc<PipePool>,
}

impl PooledPipe {
    fn get(&mut self) -> &mut block::PipePayload {
        self.pipe
            .as_mut()
            .expect("a pooled pipe is there until dropped")
    }
}

impl Drop for PooledPipe {
    fn drop(&mut self) {
        let Some(p) = self.pipe.take() else { return };
        if p.is_empty() {
            self.pool.free.lock().push(p);
        } else {
            self.pool.live.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

/// A WRITE's payload: in a buffer, or in a pipe it was spliced into.
enum Payload {
    Bytes(block::Bytes),
    Pipe(PooledPipe),
}

/// The TCP socket under a connection's reading half, when payloads can be
/// spliced out of it: a plain connection's; none under TLS (its bytes must be
/// decrypted first).
pub(crate) trait SpliceFrom {
    fn socket(&self) -> Option<&TcpStream> {
        None
    }
}

impl SpliceFrom for tokio::net::tcp::OwnedReadHalf {
    fn socket(&self) -> Option<&TcpStream> {
        Some(self.as_ref())
    }
}

impl<T> SpliceFrom for tokio::io::ReadHalf<T> {}

async fn transmission<R, W>(
    ctx: Arc<Ctx>,
    (export, session): (Arc<ExportState>, Session),
    mut rd: R,
    wr: W,
    mut buf: BytesMut,
    peer: SocketAddr,
) where
    R: AsyncRead + SpliceFrom + Unpin,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let limits = &ctx.limits;
    let mut gone = export.gone.subscribe();
    let slots_max = limits.requests_in_flight_max.max(1);
    // Every queued reply holds a slot, so the channel never holds more than that.
    let (tx, rx) = mpsc::channel(slots_max);
    let slots = Arc::new(Semaphore::new(slots_max));
    let held = slots.clone();
    let in_flight = move || slots_max.saturating_sub(held.available_permits());
    // the writer ends before the reader only when a write fails (the client
    // stopped taking replies): then the connection ends too. Over TLS the
    // reader's half keeps the stream open, so without it the connection
    // would go on running requests whose replies nobody sends (review of
    // 2026-12-06)
    let (writer_ended, mut writer_end) = tokio::sync::oneshot::channel::<()>();
    let writer = tokio::spawn(async move {
        let r = run_writer(wr, rx, in_flight).await;
        let _ = writer_ended.send(());
        r
    });
    let (exec_tx, exec_rx) = mpsc::unbounded_channel();
    let executor = tokio::spawn(run_executor(exec_rx));
    // a share of the node's buffers for this connection, within its address's
    let buffers = export.buffers.session_from(peer.ip());
    let conn = Conn {
        export,
        tx,
        exec_tx,
        slots,
        budget: Arc::new(Semaphore::new(limits.in_flight_bytes_max)),
        buffers,
        request_bytes_max: limits.request_bytes_max,
        payload_stall_ms: limits.payload_stall_ms,
        peer,
        session,
        pipes: Arc::default(),
        plain: rd.socket().is_some(),
    };
    let mut shutdown = ctx.shutdown.clone();
    let end = tokio::select! {
        e = conn.read_loop(&mut rd, &mut buf) => e,
        _ = shutdown.wait_for(|s| *s) => End::Shutdown,
        _ = gone.wait_for(|g| *g) => End::ExportGone,
        _ = &mut writer_end => End::Io(std::io::Error::other("the replies could not be sent")),
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
    let mut writer = writer;
    if tokio::time::timeout(drain, conn.slots.acquire_many(all))
        .await
        .is_err()
    {
        // the client is let go (the socket closes), but the connection still
        // counts against the bounds (its caller holds them) until the volume
        // has finished every request it took: a client cannot pile up
        // requests on a slow volume by reconnecting
        tracing::warn!(%peer, "NBD requests did not finish in time; closing, the requests still run");
        writer.abort();
        drop(rd);
        let _ = conn.slots.acquire_many(all).await;
        drop(conn);
        let _ = executor.await;
        return;
    }
    drop(conn);
    let _ = executor.await;
    drop(rd);
    if tokio::time::timeout(Duration::from_secs(2), &mut writer)
        .await
        .is_err()
    {
        writer.abort();
    }
}

impl Conn {
    /// Whether a WRITE's payload of `len` bytes, of which `buffered` are
    /// read already, is to be spliced into a pipe: a large one not yet read,
    /// for a volume that takes pipes, whole blocks in one volume write, not
    /// forced (a FUA write goes the way a buffer goes).
    fn pipe_wanted(&self, req: &Request, len: usize, buffered: usize) -> bool {
        if req.command != Command::Write
            || self.export.read_only
            || len < OWN_BUFFER_BYTES
            || buffered >= len
            || !block::PipePayload::fits(len)
            || req.flags & cmdflag::FUA != 0
            || !self.export.volume.takes_pipes()
        {
            return false;
        }
        let g = self.export.volume.geometry();
        let bs = u64::from(g.block_size_bytes.max(1));
        req.offset_bytes.is_multiple_of(bs)
            && (len as u64).is_multiple_of(bs)
            && len as u64 / bs <= u64::from(g.max_io_blocks)
    }

    async fn read_loop<R: AsyncRead + SpliceFrom + Unpin>(
        &self,
        rd: &mut R,
        buf: &mut BytesMut,
    ) -> End {
        let mut exact_header = false;
        let stall = Duration::from_millis(self.payload_stall_ms);
        loop {
            let header = if exact_header {
                fill_exact(rd, buf, REQUEST_BYTES).await
            } else {
                fill(rd, buf, REQUEST_BYTES).await
            };
            match header {
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
                    // (EOVERFLOW only answers a READ when DF is offered: it is not)
                    self.reply(&req, errno::EINVAL, (slot, None)).await;
                    return End::Violation("write payload too long");
                }
                Command::Read if req.length_bytes > self.request_bytes_max => {
                    tracing::warn!(peer = %self.peer, length = req.length_bytes,
                        "NBD read longer than the maximum payload");
                    self.reply(&req, errno::EINVAL, (slot, None)).await;
                }
                Command::BlockStatus if self.session.base_allocation.is_none() => {
                    tracing::warn!(peer = %self.peer,
                        "NBD block status without a negotiated metadata context");
                    self.reply(&req, errno::EINVAL, (slot, None)).await;
                }
                Command::Read
                | Command::Write
                | Command::Flush
                | Command::Trim
                | Command::WriteZeroes
                | Command::BlockStatus => {
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
                    // a WRITE's payload takes its bytes (the connection's share of the
                    // node's budget, then the node's) before it is read from the
                    // socket: when either is used up the reader
                    // waits here and TCP pushes back on the client
                    // WRITE ZEROES carries no payload, but a volume without a
                    // zeroing of its own writes it from a buffer of up to 1 MiB
                    // (block::Volume::write_zeroes): the node's budget holds that
                    let held_bytes = match req.command {
                        Command::WriteZeroes => (req.length_bytes as usize).min(1 << 20),
                        _ => payload_len,
                    };
                    let held = (held_bytes > 0).then(|| self.buffers.acquire(held_bytes as u64));
                    let held = match held {
                        Some(h) => Some(h.await),
                        None => None,
                    };
                    let mut piped = None;
                    if self.pipe_wanted(&req, payload_len, buf.len()) {
                        if let (Some(sock), Some(mut pipe)) = (rd.socket(), self.pipes.take()) {
                            match splice_payload(sock, buf, payload_len, pipe.get(), stall).await {
                                Ok(Spliced::Done) => piped = Some(Payload::Pipe(pipe)),
                                Ok(Spliced::Eof) => {
                                    return End::Io(std::io::ErrorKind::UnexpectedEof.into())
                                }
                                Ok(Spliced::Spilled) => {}
                                Err(e) => return End::Io(e),
                            }
                        }
                    }
                    let payload = match piped {
                        Some(p) => p,
                        None if payload_len > 0 => {
                            match take_payload(rd, buf, payload_len, REQUEST_BYTES, stall).await {
                                Ok(Some(p)) => Payload::Bytes(p),
                                Ok(None) => {
                                    return End::Io(std::io::ErrorKind::UnexpectedEof.into())
                                }
                                Err(e) => return End::Io(e),
                            }
                        }
                        None => Payload::Bytes(block::Bytes::new()),
                    };
                    // After a large payload the next header is read alone (if
                    // the payload's own reads did not already take it): a batch
                    // read would take the start of the next large payload into
                    // the shared buffer, to be copied out of it again.
                    exact_header = payload_len >= OWN_BUFFER_BYTES;
                    let g = self.export.volume.geometry();
                    if let Err(err) = exec::validate(&req, &g, self.export.read_only) {
                        tracing::warn!(peer = %self.peer, command = ?req.command,
                            offset = req.offset_bytes, length = req.length_bytes,
                            flags = req.flags, error = err, "NBD request refused");
                        self.reply(&req, err, (slot, budget)).await;
                        continue;
                    }
                    if !self.export.allows(&req, self.peer) {
                        self.reply(&req, errno::EPERM, (slot, budget)).await;
                        continue;
                    }
                    let Some(entered) = self.export.enter() else {
                        self.reply(&req, errno::ESHUTDOWN, (slot, budget)).await;
                        return End::ExportGone;
                    };
                    self.run(req, (payload, held), (slot, budget), entered)
                        .await;
                }
                Command::Cache | Command::Unknown(_) => {
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
        self.export
            .counters
            .count(req.command, req.length_bytes, error == 0);
        let hdr = ReplyHeader::new(
            self.session.structured_replies,
            req,
            error,
            &ReplyData::None,
        );
        let _ = self
            .tx
            .send(Reply {
                hdr,
                data: ReplyData::None,
                _permits: permits,
            })
            .await;
    }

    /// Runs one request: a write goes to the connection's executor (see below);
    /// any other small one is polled once right here, on the reader, so that a
    /// request the volume completes without waiting (a page-cache or tmpfs
    /// transfer done inline) costs no task and no hand-off to another worker; a
    /// large read, or one that must wait, continues on a task of its own, so the
    /// reader goes on reading meanwhile. Either way the reply is queued only
    /// once the volume has finished with the request.
    async fn run(
        &self,
        req: Request,
        (payload, held): (Payload, Option<block::BufferPermit>),
        permits: (OwnedSemaphorePermit, Option<OwnedSemaphorePermit>),
        entered: OwnedSemaphorePermit,
    ) {
        let export = self.export.clone();
        let buffers = self.buffers.clone();
        let tx = self.tx.clone();
        let peer = self.peer;
        let session = self.session;
        let plain = self.plain;
        let task = Box::pin(async move {
            let done = match payload {
                Payload::Bytes(payload) => {
                    let context = session.base_allocation;
                    let held = (held, context);
                    exec::execute_held(&export, &buffers, &req, payload, held, plain).await
                }
                Payload::Pipe(mut pipe) => {
                    exec::write_piped(&export, &req, pipe.get(), (held, &buffers)).await
                }
            };
            export
                .counters
                .count(req.command, req.length_bytes, done.is_ok());
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
            let hdr = ReplyHeader::new(session.structured_replies, &req, error, &data);
            let _ = tx
                .send(Reply {
                    hdr,
                    data,
                    _permits: permits,
                })
                .await;
        });
        // Writes go to the connection's executor: their copy into the volume
        // overlaps the reader taking in the next payload, and they do not contend
        // with each other for the file (a tmpfs or page-cache write holds the
        // inode lock: parallel ones only spin on it). One that must wait (an
        // engine I/O) continues on its own task, so those still overlap.
        if req.command == Command::Write {
            // the executor takes it; it only fails once the connection ends
            let _ = self.exec_tx.send(task);
            return;
        }
        // A large read goes to its own task at once: copying it takes long
        // enough that the reader should be free to take in the next request.
        if req.length_bytes as usize > INLINE_BYTES_MAX {
            tokio::spawn(task);
            return;
        }
        run_inline(task).await;
    }
}

/// Polls `task` once where it is; if it must wait, it continues on a task of its
/// own (whatever it waits on wakes the task it is polled from next).
async fn run_inline(mut task: Work) {
    let finished = std::future::poll_fn(|cx| Poll::Ready(task.as_mut().poll(cx).is_ready())).await;
    if !finished {
        tokio::spawn(task);
    }
}

/// Runs a connection's writes in order of arrival, each to completion when the
/// volume completes it at once, beside the reader.
async fn run_executor(mut rx: mpsc::UnboundedReceiver<Work>) {
    while let Some(task) = rx.recv().await {
        run_inline(task).await;
    }
}

#[cfg(test)]
mod tests {
    /// An unknown export's name is logged on one line, escaped and cut.
    #[test]
    fn a_client_string_cannot_forge_a_log_line() {
        let s = super::shown("x\nWARN forged\r\u{1b}[31m");
        assert!(!s.contains(['\n', '\r', '\u{1b}']), "{s}");
        assert!(s.starts_with('"') && s.contains("forged"), "{s}");
        let long = "a".repeat(4096);
        assert_eq!(super::shown(&long).len(), 255 + 2 + 3);
    }
}
