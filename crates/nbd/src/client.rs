//! An NBD client over one TCP connection that is itself a [`Volume`], so the
//! built-in benchmark (and tests) can drive any NBD server at high queue depth.
//!
//! Handshake: fixed newstyle with `NBD_OPT_GO` asking for `NBD_INFO_BLOCK_SIZE`,
//! falling back to `NBD_OPT_EXPORT_NAME` when the server does not know GO.
//! Structured replies are never requested (the server offers them; this client
//! does not need them), so every reply it gets is a simple reply.
//!
//! Transmission: callers register a slot (cookie = slot index + generation) in a
//! small slab and hand the encoded header and the write data `Bytes` to one writer
//! task, which batches them into vectored writes; one reader task matches reply
//! cookies to slots and completes each through a oneshot channel, slicing READ
//! data out of its receive buffer without another copy. Requests in flight are
//! bounded by a semaphore.
//!
//! Geometry: the block size is the server's preferred block size when it is a
//! power of two between 512 and 64 KiB that divides the export size, else 512
//! (the size is rounded down to whole blocks); the largest I/O is the advertised
//! maximum payload (32 MiB when none is advertised).

use crate::io::{fill, write_all_vectored};
use crate::proto::{
    cflag, cmdflag, decode_export_name_reply, decode_info, decode_option_reply_header,
    decode_server_greeting, decode_simple_reply, encode_client_flags, encode_option,
    encode_request, errno, hflag, info, opt, rep, tflag, BlockSizes, ClientOption, Command, Info,
    InfoRequest, Request, EXPORT_NAME_ZEROES_BYTES, GREETING_BYTES, OPTION_REPLY_HEADER_BYTES,
    REQUEST_BYTES, SIMPLE_REPLY_BYTES,
};
use async_trait::async_trait;
use block::{BlockError, BlockResult, Bytes, BytesMut, Geometry, Volume};
use bytes::Buf;
use parking_lot::Mutex;
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpStream, ToSocketAddrs};
use tokio::sync::{mpsc, oneshot, Semaphore};
use tokio::task::JoinHandle;

/// The IANA port of NBD.
pub const NBD_DEFAULT_PORT: u16 = 10809;
/// Requests one client keeps in flight at most.
pub const CLIENT_REQUESTS_IN_FLIGHT_MAX: usize = 256;
/// Largest payload used when the server advertises no maximum (the spec's default).
const DEFAULT_PAYLOAD_MAX_BYTES: u32 = 32 << 20;
/// Longest option reply data the client accepts during the handshake.
const OPTION_REPLY_DATA_MAX_BYTES: u32 = 64 << 10;
/// Most replies to one option before the client gives up.
const OPTION_REPLIES_MAX: usize = 64;
/// Most requests the writer task writes in one batch.
const BATCH_REQUESTS_MAX: usize = 64;

/// Splits `nbd://HOST[:PORT][/EXPORT]` into (`host:port`, export). The port
/// defaults to 10809, the export to the empty (default) name; IPv6 hosts are
/// written in brackets; `%XX` escapes in the export are decoded.
pub fn parse_nbd_url(url: &str) -> Option<(String, String)> {
    let rest = url
        .strip_prefix("nbd://")
        .or_else(|| url.strip_prefix("nbd+tcp://"))?;
    let rest = rest.split(['?', '#']).next().unwrap_or("");
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i + 1..]),
        None => (rest, ""),
    };
    if authority.is_empty() || authority.contains('@') {
        return None;
    }
    let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
        let end = v6.find(']')?;
        let host = &authority[..end + 2];
        match &v6[end + 1..] {
            "" => (host, None),
            p => (host, Some(p.strip_prefix(':')?)),
        }
    } else {
        match authority.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (authority, None),
        }
    };
    if host.is_empty() || (host.contains(':') && !host.starts_with('[')) {
        return None;
    }
    let port: u16 = match port {
        None => NBD_DEFAULT_PORT,
        Some(p) => p.parse().ok()?,
    };
    Some((format!("{host}:{port}"), percent_decode(path)?))
}

fn percent_decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = std::str::from_utf8(b.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// What the handshake learned about the export.
#[derive(Debug, Clone, Copy)]
struct ExportDesc {
    size_bytes: u64,
    transmission_flags: u16,
    block_sizes: Option<BlockSizes>,
}

fn proto_err(e: impl std::fmt::Display) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("NBD handshake: {e}"))
}

async fn read_exact_vec(sock: &mut TcpStream, n: usize) -> io::Result<Vec<u8>> {
    let mut v = vec![0u8; n];
    sock.read_exact(&mut v).await?;
    Ok(v)
}

async fn handshake(sock: &mut TcpStream, export: &str) -> io::Result<ExportDesc> {
    let g = read_exact_vec(sock, GREETING_BYTES).await?;
    let hflags = decode_server_greeting(&g).map_err(proto_err)?;
    let fixed = hflags & hflag::FIXED_NEWSTYLE != 0;
    let no_zeroes = hflags & hflag::NO_ZEROES != 0;
    let mut cflags = 0;
    if fixed {
        cflags |= cflag::FIXED_NEWSTYLE;
    }
    if no_zeroes {
        cflags |= cflag::NO_ZEROES;
    }
    sock.write_all(&encode_client_flags(cflags)).await?;
    if fixed {
        if let Some(d) = try_go(sock, export).await? {
            return Ok(d);
        }
    }
    // NBD_OPT_EXPORT_NAME: the server closes the connection if it refuses.
    let mut b = BytesMut::new();
    encode_option(&ClientOption::ExportName(export.to_string()), &mut b);
    sock.write_all(&b).await?;
    let n = 10
        + if no_zeroes {
            0
        } else {
            EXPORT_NAME_ZEROES_BYTES
        };
    let r = read_exact_vec(sock, n).await.map_err(|e| {
        if e.kind() == io::ErrorKind::UnexpectedEof {
            io::Error::new(
                io::ErrorKind::NotFound,
                format!("NBD server closed the connection: no export {export:?}?"),
            )
        } else {
            e
        }
    })?;
    let (size_bytes, transmission_flags) = decode_export_name_reply(&r).map_err(proto_err)?;
    Ok(ExportDesc {
        size_bytes,
        transmission_flags,
        block_sizes: None,
    })
}

/// `NBD_OPT_GO`; `Ok(None)` when the server does not support it.
async fn try_go(sock: &mut TcpStream, export: &str) -> io::Result<Option<ExportDesc>> {
    let mut b = BytesMut::new();
    encode_option(
        &ClientOption::Go(InfoRequest {
            name: export.to_string(),
            infos: vec![info::BLOCK_SIZE],
        }),
        &mut b,
    );
    sock.write_all(&b).await?;
    let mut export_info = None;
    let mut block_sizes = None;
    for _ in 0..OPTION_REPLIES_MAX {
        let h = read_exact_vec(sock, OPTION_REPLY_HEADER_BYTES).await?;
        let h = decode_option_reply_header(&h).map_err(proto_err)?;
        if h.data_len_bytes > OPTION_REPLY_DATA_MAX_BYTES {
            return Err(proto_err("option reply too long"));
        }
        let data = read_exact_vec(sock, h.data_len_bytes as usize).await?;
        if h.option != opt::GO {
            return Err(proto_err(format!(
                "reply to option {} while waiting for GO",
                h.option
            )));
        }
        match h.reply_type {
            rep::INFO => match decode_info(&data).map_err(proto_err)? {
                Info::Export {
                    size_bytes,
                    transmission_flags,
                } => export_info = Some((size_bytes, transmission_flags)),
                Info::BlockSize(s) => block_sizes = Some(s),
                _ => {}
            },
            rep::ACK => {
                let (size_bytes, transmission_flags) = export_info
                    .ok_or_else(|| proto_err("GO acknowledged without NBD_INFO_EXPORT"))?;
                return Ok(Some(ExportDesc {
                    size_bytes,
                    transmission_flags,
                    block_sizes,
                }));
            }
            rep::ERR_UNSUP => return Ok(None),
            t if t & rep::ERR_BIT != 0 => {
                let msg = String::from_utf8_lossy(&data);
                let kind = if t == rep::ERR_UNKNOWN {
                    io::ErrorKind::NotFound
                } else {
                    io::ErrorKind::ConnectionRefused
                };
                return Err(io::Error::new(
                    kind,
                    format!("NBD server refused export {export:?} ({t:#x}): {msg}"),
                ));
            }
            _ => {} // Unknown non-error replies are ignored.
        }
    }
    Err(proto_err("too many replies to NBD_OPT_GO"))
}

/// The volume geometry of an export.
fn geometry_of(d: &ExportDesc) -> Geometry {
    let pick = d
        .block_sizes
        .map(|s| s.preferred_bytes)
        .filter(|p| {
            p.is_power_of_two()
                && (512..=65536).contains(p)
                && d.size_bytes.is_multiple_of(*p as u64)
        })
        .unwrap_or(512);
    let max_payload = d
        .block_sizes
        .map(|s| s.max_bytes)
        .unwrap_or(DEFAULT_PAYLOAD_MAX_BYTES)
        .clamp(pick, DEFAULT_PAYLOAD_MAX_BYTES.max(pick));
    Geometry {
        block_size_bytes: pick,
        block_count: d.size_bytes / pick as u64,
        thin: false,
        volatile_cache: d.transmission_flags & tflag::SEND_FLUSH != 0,
        optimal_io_blocks: 1,
        max_io_blocks: (max_payload / pick).max(1),
    }
}

/// Why a request got no data.
#[derive(Debug, Clone, Copy)]
enum Failure {
    /// The server answered with this NBD error.
    Errno(u32),
    /// The connection is gone.
    Closed,
}

struct Waiter {
    read_len_bytes: u32,
    done: oneshot::Sender<Result<Bytes, Failure>>,
}

#[derive(Default)]
struct Slab {
    slots: Vec<(u32, Option<Waiter>)>,
    free: Vec<u32>,
}

/// State shared by callers and the two tasks.
struct Shared {
    slab: Mutex<Slab>,
    dead: AtomicBool,
}

impl Shared {
    fn register(
        &self,
        read_len_bytes: u32,
    ) -> Option<(u64, oneshot::Receiver<Result<Bytes, Failure>>)> {
        let (tx, rx) = oneshot::channel();
        let mut s = self.slab.lock();
        if self.dead.load(Ordering::Acquire) {
            return None;
        }
        let idx = match s.free.pop() {
            Some(i) => i,
            None => {
                s.slots.push((0, None));
                (s.slots.len() - 1) as u32
            }
        };
        let slot = &mut s.slots[idx as usize];
        slot.0 = slot.0.wrapping_add(1);
        slot.1 = Some(Waiter {
            read_len_bytes,
            done: tx,
        });
        Some((((slot.0 as u64) << 32) | idx as u64, rx))
    }

    fn take(&self, cookie: u64) -> Option<Waiter> {
        let idx = (cookie & 0xffff_ffff) as usize;
        let generation = (cookie >> 32) as u32;
        let mut s = self.slab.lock();
        let slot = s.slots.get_mut(idx)?;
        if slot.0 != generation {
            return None;
        }
        let w = slot.1.take()?;
        s.free.push(idx as u32);
        Some(w)
    }

    fn fail_all(&self) {
        let mut s = self.slab.lock();
        self.dead.store(true, Ordering::Release);
        let mut freed = Vec::new();
        for (i, slot) in s.slots.iter_mut().enumerate() {
            if let Some(w) = slot.1.take() {
                let _ = w.done.send(Err(Failure::Closed));
                freed.push(i as u32);
            }
        }
        s.free.extend(freed);
    }
}

/// One request on its way to the socket.
struct Outgoing {
    hdr: [u8; REQUEST_BYTES],
    data: Bytes,
}

/// An NBD export seen through one TCP connection, usable as a [`Volume`].
pub struct NbdClient {
    shared: Arc<Shared>,
    tx: mpsc::Sender<Outgoing>,
    slots: Semaphore,
    geometry: Geometry,
    desc: ExportDesc,
    reader: JoinHandle<()>,
}

impl std::fmt::Debug for NbdClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NbdClient")
            .field("geometry", &self.geometry)
            .field("desc", &self.desc)
            .finish()
    }
}

impl NbdClient {
    /// Connects, negotiates `export_name` (empty: the server's default export) and
    /// starts the reader and writer tasks. Fails with `NotFound` when the server
    /// has no such export.
    pub async fn connect(addr: impl ToSocketAddrs, export_name: &str) -> io::Result<NbdClient> {
        let mut sock = TcpStream::connect(addr).await?;
        sock.set_nodelay(true)?;
        let desc = handshake(&mut sock, export_name).await?;
        let geometry = geometry_of(&desc);
        let (rd, wr) = sock.into_split();
        let shared = Arc::new(Shared {
            slab: Mutex::new(Slab::default()),
            dead: AtomicBool::new(false),
        });
        let (tx, rx) = mpsc::channel(CLIENT_REQUESTS_IN_FLIGHT_MAX + 1);
        let reader = tokio::spawn(run_reader(rd, shared.clone()));
        tokio::spawn(run_writer(wr, rx, shared.clone()));
        Ok(NbdClient {
            shared,
            tx,
            slots: Semaphore::new(CLIENT_REQUESTS_IN_FLIGHT_MAX),
            geometry,
            desc,
            reader,
        })
    }

    /// Export size in bytes as the server announced it.
    pub fn export_size_bytes(&self) -> u64 {
        self.desc.size_bytes
    }

    /// Transmission flags the server announced (`proto::tflag::*`).
    pub fn transmission_flags(&self) -> u16 {
        self.desc.transmission_flags
    }

    /// Block size constraints, if the server sent them.
    pub fn block_sizes(&self) -> Option<BlockSizes> {
        self.desc.block_sizes
    }

    /// Waits for in-flight requests, sends `NBD_CMD_DISC` and closes the connection.
    pub async fn disconnect(self) -> io::Result<()> {
        let all = CLIENT_REQUESTS_IN_FLIGHT_MAX as u32;
        let _all = self
            .slots
            .acquire_many(all)
            .await
            .map_err(io::Error::other)?;
        let hdr = encode_request(&Request {
            flags: 0,
            command: Command::Disc,
            cookie: 0,
            offset_bytes: 0,
            length_bytes: 0,
        });
        let _ = self
            .tx
            .send(Outgoing {
                hdr,
                data: Bytes::new(),
            })
            .await;
        // Dropping `self` closes the sender: the writer flushes the DISC and shuts
        // the socket down.
        Ok(())
    }

    fn has(&self, f: u16) -> bool {
        self.desc.transmission_flags & f != 0
    }

    /// Sends one request and waits for its reply.
    async fn call(
        &self,
        command: Command,
        flags: u16,
        offset_bytes: u64,
        length_bytes: u32,
        data: Bytes,
    ) -> BlockResult<Bytes> {
        let closed = || BlockError::Unavailable("NBD connection closed".into());
        let _slot = self.slots.acquire().await.map_err(|_| closed())?;
        let read_len = if command == Command::Read {
            length_bytes
        } else {
            0
        };
        let (cookie, rx) = self.shared.register(read_len).ok_or_else(closed)?;
        let hdr = encode_request(&Request {
            flags,
            command,
            cookie,
            offset_bytes,
            length_bytes,
        });
        if self.tx.send(Outgoing { hdr, data }).await.is_err() {
            let _ = self.shared.take(cookie);
            return Err(closed());
        }
        match rx.await {
            Ok(Ok(b)) => Ok(b),
            Ok(Err(Failure::Errno(e))) => Err(self.error_of(e, offset_bytes, length_bytes)),
            Ok(Err(Failure::Closed)) | Err(_) => Err(closed()),
        }
    }

    fn error_of(&self, e: u32, offset_bytes: u64, length_bytes: u32) -> BlockError {
        let bs = self.geometry.block_size_bytes as u64;
        match e {
            errno::EPERM => BlockError::ReadOnly,
            errno::ENOSPC => BlockError::OutOfRange {
                lba: offset_bytes / bs,
                blocks: (length_bytes as u64).div_ceil(bs),
                block_count: self.geometry.block_count,
            },
            errno::ESHUTDOWN => BlockError::Unavailable("NBD server shutting down".into()),
            errno::EIO => BlockError::Io(io::Error::other("NBD server reported EIO")),
            other => BlockError::Io(io::Error::other(format!(
                "NBD server reported error {other}"
            ))),
        }
    }

    /// Splits `[lba, lba + blocks)` into pieces of at most `step` blocks.
    fn pieces(lba: u64, blocks: u64, step: u64) -> impl Iterator<Item = (u64, u64)> {
        let step = step.max(1);
        (0..blocks.div_ceil(step)).map(move |i| {
            let start = lba + i * step;
            (start, (blocks - i * step).min(step))
        })
    }

    /// TRIM / WRITE_ZEROES over a range, in pieces that fit the 32-bit length.
    async fn range_cmd(
        &self,
        command: Command,
        flags: u16,
        lba: u64,
        blocks: u64,
    ) -> BlockResult<()> {
        let bs = self.geometry.block_size_bytes as u64;
        let step = (1u64 << 30) / bs;
        for (l, n) in Self::pieces(lba, blocks, step) {
            self.call(command, flags, l * bs, (n * bs) as u32, Bytes::new())
                .await?;
        }
        Ok(())
    }
}

impl Drop for NbdClient {
    fn drop(&mut self) {
        // The writer ends by itself once the sender (dropped with `self`) is gone:
        // it flushes what is queued (e.g. NBD_CMD_DISC) and shuts the socket down.
        self.reader.abort();
    }
}

async fn run_reader(mut rd: OwnedReadHalf, shared: Arc<Shared>) {
    let mut buf = BytesMut::new();
    let why = loop {
        match fill(&mut rd, &mut buf, SIMPLE_REPLY_BYTES).await {
            Ok(true) => {}
            Ok(false) => break "server closed the connection".to_string(),
            Err(e) => break format!("read failed: {e}"),
        }
        let r = match decode_simple_reply(&buf[..SIMPLE_REPLY_BYTES]) {
            Ok(r) => r,
            Err(e) => break format!("bad reply: {e}"),
        };
        buf.advance(SIMPLE_REPLY_BYTES);
        let Some(w) = shared.take(r.cookie) else {
            break format!("reply with unknown cookie {:#x}", r.cookie);
        };
        if r.error != 0 {
            let _ = w.done.send(Err(Failure::Errno(r.error)));
            continue;
        }
        let n = w.read_len_bytes as usize;
        let data = if n > 0 {
            match fill(&mut rd, &mut buf, n).await {
                Ok(true) => buf.split_to(n).freeze(),
                Ok(false) => break "server closed the connection mid-reply".to_string(),
                Err(e) => break format!("read failed: {e}"),
            }
        } else {
            Bytes::new()
        };
        let _ = w.done.send(Ok(data));
    };
    if !shared.dead.load(Ordering::Acquire) {
        tracing::warn!(reason = %why, "NBD client connection ended");
    }
    shared.fail_all();
}

async fn run_writer(mut wr: OwnedWriteHalf, mut rx: mpsc::Receiver<Outgoing>, shared: Arc<Shared>) {
    let mut batch: Vec<Outgoing> = Vec::with_capacity(BATCH_REQUESTS_MAX);
    while let Some(first) = rx.recv().await {
        batch.push(first);
        while batch.len() < BATCH_REQUESTS_MAX {
            match rx.try_recv() {
                Ok(o) => batch.push(o),
                Err(_) => break,
            }
        }
        let res = {
            let mut parts: Vec<&[u8]> = Vec::with_capacity(batch.len() * 2);
            for o in &batch {
                parts.push(&o.hdr);
                if !o.data.is_empty() {
                    parts.push(&o.data);
                }
            }
            write_all_vectored(&mut wr, &parts).await
        };
        batch.clear();
        if let Err(e) = res {
            tracing::warn!(error = %e, "NBD client write failed");
            shared.fail_all();
            return;
        }
    }
    let _ = wr.flush().await;
    let _ = wr.shutdown().await;
}

#[async_trait]
impl Volume for NbdClient {
    fn geometry(&self) -> Geometry {
        self.geometry
    }

    async fn read(&self, lba: u64, blocks: u32) -> BlockResult<Bytes> {
        let g = self.geometry;
        g.check_range(lba, blocks as u64)?;
        let bs = g.block_size_bytes as u64;
        if blocks <= g.max_io_blocks {
            return self
                .call(
                    Command::Read,
                    0,
                    lba * bs,
                    (blocks as u64 * bs) as u32,
                    Bytes::new(),
                )
                .await;
        }
        let mut out = BytesMut::with_capacity((blocks as u64 * bs) as usize);
        for (l, n) in Self::pieces(lba, blocks as u64, g.max_io_blocks as u64) {
            let b = self
                .call(Command::Read, 0, l * bs, (n * bs) as u32, Bytes::new())
                .await?;
            out.extend_from_slice(&b);
        }
        Ok(out.freeze())
    }

    async fn write(&self, lba: u64, data: Bytes, fua: bool) -> BlockResult<()> {
        let g = self.geometry;
        let blocks = g.blocks_in(data.len())?;
        g.check_range(lba, blocks)?;
        if self.has(tflag::READ_ONLY) {
            return Err(BlockError::ReadOnly);
        }
        let native_fua = fua && self.has(tflag::SEND_FUA);
        let flags = if native_fua { cmdflag::FUA } else { 0 };
        let bs = g.block_size_bytes as u64;
        for (l, n) in Self::pieces(lba, blocks, g.max_io_blocks as u64) {
            let from = ((l - lba) * bs) as usize;
            let piece = data.slice(from..from + (n * bs) as usize);
            self.call(Command::Write, flags, l * bs, piece.len() as u32, piece)
                .await?;
        }
        if fua && !native_fua {
            self.flush().await?;
        }
        Ok(())
    }

    async fn flush(&self) -> BlockResult<()> {
        if !self.has(tflag::SEND_FLUSH) {
            return Ok(());
        }
        self.call(Command::Flush, 0, 0, 0, Bytes::new())
            .await
            .map(|_| ())
    }

    async fn discard(&self, lba: u64, blocks: u64) -> BlockResult<()> {
        self.geometry.check_range(lba, blocks)?;
        if self.has(tflag::READ_ONLY) {
            return Err(BlockError::ReadOnly);
        }
        if !self.has(tflag::SEND_TRIM) {
            return Ok(()); // A hint the server cannot take.
        }
        self.range_cmd(Command::Trim, 0, lba, blocks).await
    }

    async fn write_zeroes(&self, lba: u64, blocks: u64, may_unmap: bool) -> BlockResult<()> {
        let g = self.geometry;
        g.check_range(lba, blocks)?;
        if self.has(tflag::READ_ONLY) {
            return Err(BlockError::ReadOnly);
        }
        if self.has(tflag::SEND_WRITE_ZEROES) {
            let flags = if may_unmap { 0 } else { cmdflag::NO_HOLE };
            return self
                .range_cmd(Command::WriteZeroes, flags, lba, blocks)
                .await;
        }
        let bs = g.block_size_bytes as u64;
        let step = (g.max_io_blocks as u64).min((1 << 20) / bs).max(1);
        let zeroes = Bytes::from(vec![0u8; (step * bs) as usize]);
        for (l, n) in Self::pieces(lba, blocks, step) {
            self.write(l, zeroes.slice(..(n * bs) as usize), false)
                .await?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        let p = |u: &str| parse_nbd_url(u);
        assert_eq!(
            p("nbd://127.0.0.1:10900/lun0"),
            Some(("127.0.0.1:10900".into(), "lun0".into()))
        );
        assert_eq!(
            p("nbd://host/lun1"),
            Some(("host:10809".into(), "lun1".into()))
        );
        assert_eq!(p("nbd://host"), Some(("host:10809".into(), String::new())));
        assert_eq!(
            p("nbd://[::1]:77/a%20b"),
            Some(("[::1]:77".into(), "a b".into()))
        );
        assert_eq!(p("nbd://[::1]/x"), Some(("[::1]:10809".into(), "x".into())));
        assert_eq!(p("nbd://h:1/e?tls=off"), Some(("h:1".into(), "e".into())));
        assert_eq!(p("iscsi://h/x"), None);
        assert_eq!(p("nbd://:10809/x"), None);
        assert_eq!(p("nbd://h:notaport/x"), None);
        assert_eq!(p("nbd://h:99999/x"), None);
        assert_eq!(p("nbd://h/%zz"), None);
    }

    #[test]
    fn geometry_choice() {
        let d = |size_bytes, bsz: Option<(u32, u32, u32)>| ExportDesc {
            size_bytes,
            transmission_flags: tflag::HAS_FLAGS | tflag::SEND_FLUSH,
            block_sizes: bsz.map(|(min_bytes, preferred_bytes, max_bytes)| BlockSizes {
                min_bytes,
                preferred_bytes,
                max_bytes,
            }),
        };
        let g = geometry_of(&d(1 << 20, None));
        assert_eq!(
            (g.block_size_bytes, g.block_count, g.max_io_blocks),
            (512, 2048, 65536)
        );
        assert!(g.volatile_cache);
        let g = geometry_of(&d(1 << 20, Some((1, 4096, 1 << 20))));
        assert_eq!(
            (g.block_size_bytes, g.block_count, g.max_io_blocks),
            (4096, 256, 256)
        );
        // Preferred size does not divide the export: fall back to 512.
        let g = geometry_of(&d(4096 + 512, Some((1, 4096, u32::MAX))));
        assert_eq!((g.block_size_bytes, g.block_count), (512, 9));
        assert_eq!(g.max_io_blocks, 65536, "capped at 32 MiB");
    }

    #[test]
    fn pieces_cover_the_range() {
        let v: Vec<_> = NbdClient::pieces(10, 7, 3).collect();
        assert_eq!(v, vec![(10, 3), (13, 3), (16, 1)]);
        assert_eq!(NbdClient::pieces(0, 0, 3).count(), 0);
    }
}
