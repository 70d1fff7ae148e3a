//! Executing one transmission request against a volume: validation, byte-to-block
//! translation (covering reads, read-modify-write for unaligned writes), chunking
//! to the volume's largest I/O, block status as `base:allocation` descriptors,
//! and mapping `BlockError` to NBD errors.
//!
//! The node budget of buffered bytes (`block::BufferBudget::node()`): a READ
//! takes a permit for the blocks it reads before reading them, and the permit
//! rides with the reply data until the writer has put it on the wire; waiting
//! for it holds no other permit (the reader, having given this request its
//! connection's slot and bytes, goes on until those run out, then stops reading
//! the socket). A WRITE's payload takes its permit in the connection's reader,
//! before it is read from the socket (the reader waits there when the node's
//! buffers are full), and holds it while it is applied. Both take their bytes
//! from the connection's share of the node's budget first
//! ([`BufferBudget::session_from`], `[limits] session_buffer_max`), then from
//! its address's (`source_buffer_max`), so one connection never holds more
//! than its share, nor one client's connections more than theirs.

use crate::proto::{cmdflag, errno, state, Command, Request};
use block::VolumeRef;
use block::{BlockError, BufferBudget, BufferPermit, Bytes, BytesMut, ExtentState, Geometry};
use block::{LockMode, RangeGuard, RangeLocks};
use bytes::BufMut;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};

/// Data that follows a reply header: nothing, one view of a volume buffer, or
/// several when a read spanned more than one volume I/O; with the node budget
/// its buffers hold (given back when the reply is dropped, after writing).
#[derive(Debug)]
pub(crate) enum ReplyData {
    /// No payload.
    None,
    /// One contiguous payload.
    One { data: Bytes, _permit: BufferPermit },
    /// Payload in pieces, sent back to back.
    Many {
        parts: Vec<Bytes>,
        _permit: BufferPermit,
    },
    /// A `BLOCK_STATUS` chunk payload: context id and descriptors (small and
    /// bounded by [`STATUS_DESCRIPTORS_MAX`], so not charged to the budget).
    Status(Bytes),
}

/// Most descriptors in one `BLOCK_STATUS` reply (the client asks again for the rest).
pub(crate) const STATUS_DESCRIPTORS_MAX: usize = 1024;

impl ReplyData {
    /// Payload length in bytes.
    pub(crate) fn len_bytes(&self) -> usize {
        match self {
            ReplyData::None => 0,
            ReplyData::One { data, .. } => data.len(),
            ReplyData::Many { parts, .. } => parts.iter().map(|b| b.len()).sum(),
            ReplyData::Status(b) => b.len(),
        }
    }
}

/// One export as the request path sees it.
pub(crate) struct ExportState {
    /// The volume behind the export.
    pub volume: VolumeRef,
    /// Writes, trims and zeroing are refused with EPERM.
    pub read_only: bool,
    /// Locks serializing read-modify-write against other writes; shared by every
    /// export of the same volume object.
    pub locks: Arc<RangeLocks>,
    /// Every request holds one permit of this gate while it runs; removing the
    /// export takes them all and closes it, so no request starts afterwards.
    pub gate: Arc<Semaphore>,
    /// Set once the export is removed; connections to it end.
    pub gone: watch::Sender<bool>,
    /// The node's budget of buffered bytes (the one installed when the export
    /// was made).
    pub buffers: BufferBudget,
    /// What clients did with the export (for metrics).
    pub counters: ExportCounters,
    /// Asked before each read and change (see [`super::NbdExport::access`]).
    pub access: Option<Arc<dyn super::ExportAccess>>,
    /// A refusal by `access` was logged, and none allowed since (one line per
    /// spell of refusals, not one per request).
    pub refusing: std::sync::atomic::AtomicBool,
}

/// Requests an export answered, counted with relaxed atomics (a few adds per
/// request, no lock).
#[derive(Debug, Default)]
pub(crate) struct ExportCounters {
    reads: AtomicU64,
    read_bytes: AtomicU64,
    writes: AtomicU64,
    write_bytes: AtomicU64,
    others: AtomicU64,
    errors: AtomicU64,
}

/// What clients did with one export since it was added.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ExportStats {
    /// READ requests answered without error.
    pub reads: u64,
    /// Bytes they returned.
    pub read_bytes: u64,
    /// WRITE requests acknowledged.
    pub writes: u64,
    /// Bytes they wrote.
    pub write_bytes: u64,
    /// Other requests answered without error (flush, trim, write zeroes, block status).
    pub others: u64,
    /// Requests answered with an error.
    pub errors: u64,
}

impl ExportCounters {
    /// Counts one answered request.
    pub(crate) fn count(&self, command: Command, length_bytes: u32, ok: bool) {
        let (n, bytes) = match (ok, command) {
            (false, _) => (&self.errors, None),
            (true, Command::Read) => (&self.reads, Some(&self.read_bytes)),
            (true, Command::Write) => (&self.writes, Some(&self.write_bytes)),
            (true, _) => (&self.others, None),
        };
        n.fetch_add(1, Ordering::Relaxed);
        if let Some(b) = bytes {
            b.fetch_add(u64::from(length_bytes), Ordering::Relaxed);
        }
    }

    pub(crate) fn snapshot(&self) -> ExportStats {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        ExportStats {
            reads: g(&self.reads),
            read_bytes: g(&self.read_bytes),
            writes: g(&self.writes),
            write_bytes: g(&self.write_bytes),
            others: g(&self.others),
            errors: g(&self.errors),
        }
    }
}

/// Permits of an export's gate: far more than requests can be in flight
/// (connections times requests per connection).
const GATE_PERMITS: u32 = 1 << 30;

impl ExportState {
    /// The state of a served export.
    pub(crate) fn new(volume: VolumeRef, read_only: bool, locks: Arc<RangeLocks>) -> Self {
        ExportState {
            volume,
            read_only,
            locks,
            gate: Arc::new(Semaphore::new(GATE_PERMITS as usize)),
            gone: watch::channel(false).0,
            buffers: BufferBudget::node(),
            counters: ExportCounters::default(),
            access: None,
            refusing: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Whether `req` may run now as far as [`Self::access`] is concerned
    /// (flushes and queries of nothing always may).
    pub(crate) fn allows(&self, req: &Request, peer: std::net::SocketAddr) -> bool {
        use std::sync::atomic::Ordering;
        let Some(a) = &self.access else {
            return true;
        };
        let write = match req.command {
            Command::Write | Command::Trim | Command::WriteZeroes => true,
            Command::Read | Command::BlockStatus => false,
            _ => return true,
        };
        if a.allows(write) {
            self.refusing.store(false, Ordering::Relaxed);
            return true;
        }
        if !self.refusing.swap(true, Ordering::Relaxed) {
            tracing::warn!(%peer, command = ?req.command,
                "NBD request refused: the LUN's SCSI reservations or LUN masking keep NBD clients (unregistered initiators, named by no host group) off it; refusals go on unlogged until one is allowed");
        }
        false
    }

    /// A permit to run one request, or `None` once the export is being removed.
    pub(crate) fn enter(&self) -> Option<OwnedSemaphorePermit> {
        self.gate.clone().try_acquire_owned().ok()
    }

    /// Ends the export: connections to it close, new requests are refused, and
    /// this returns once every request that had started has finished. The
    /// semaphore is fair: once the large acquire waits, every permit released goes
    /// to it and `enter` finds none.
    pub(crate) async fn retire(&self) {
        self.gone.send_replace(true);
        if let Ok(all) = self.gate.acquire_many(GATE_PERMITS).await {
            all.forget();
        }
        self.gate.close();
    }
}

/// Checks flags, read-only and range before any I/O. Returns the NBD error to send.
pub(crate) fn validate(req: &Request, g: &Geometry, read_only: bool) -> Result<(), u32> {
    let allowed = match req.command {
        Command::WriteZeroes => cmdflag::FUA | cmdflag::NO_HOLE,
        // FUA is accepted on every command while SEND_FUA is advertised (the
        // protocol says MUST), and means nothing to a query
        Command::BlockStatus => cmdflag::REQ_ONE | cmdflag::FUA,
        _ => cmdflag::FUA,
    };
    if req.flags & !allowed != 0 {
        return Err(errno::EINVAL);
    }
    if req.command == Command::BlockStatus && req.length_bytes == 0 {
        return Err(errno::EINVAL);
    }
    let writes = matches!(
        req.command,
        Command::Write | Command::Trim | Command::WriteZeroes
    );
    if writes && read_only {
        return Err(errno::EPERM);
    }
    if matches!(req.command, Command::Flush) {
        return Ok(());
    }
    let end = req.offset_bytes.checked_add(req.length_bytes as u64);
    match end {
        Some(end) if end <= g.size_bytes() => Ok(()),
        _ if matches!(req.command, Command::Write | Command::WriteZeroes) => Err(errno::ENOSPC),
        _ => Err(errno::EINVAL),
    }
}

/// The NBD error for a volume error.
pub(crate) fn errno_of(e: &BlockError, command: Command) -> u32 {
    match e {
        BlockError::OutOfRange { .. }
            if matches!(command, Command::Write | Command::WriteZeroes) =>
        {
            errno::ENOSPC
        }
        BlockError::OutOfRange { .. } | BlockError::Misaligned { .. } => errno::EINVAL,
        BlockError::NotSupported(_) => errno::EINVAL,
        BlockError::ReadOnly => errno::EPERM,
        BlockError::NoSpace { .. } => errno::ENOSPC,
        BlockError::Medium { .. }
        | BlockError::WriteFault { .. }
        | BlockError::Unavailable(_)
        | BlockError::Io(_) => errno::EIO,
    }
}

/// Byte range translated to blocks.
#[derive(Debug, Clone, Copy)]
struct Span {
    bs: u64,
    first_lba: u64,
    end_lba: u64,
    head_bytes: u64,
    end_bytes: u64,
}

impl Span {
    fn new(g: &Geometry, offset_bytes: u64, len_bytes: u64) -> Span {
        let bs = g.block_size_bytes.max(1) as u64;
        let end_bytes = offset_bytes + len_bytes;
        Span {
            bs,
            first_lba: offset_bytes / bs,
            end_lba: end_bytes.div_ceil(bs),
            head_bytes: offset_bytes % bs,
            end_bytes,
        }
    }

    fn aligned(&self) -> bool {
        self.head_bytes == 0 && !self.partial_tail()
    }

    /// The range ends inside a block.
    fn partial_tail(&self) -> bool {
        !self.end_bytes.is_multiple_of(self.bs)
    }

    fn blocks(&self) -> u64 {
        self.end_lba - self.first_lba
    }
}

fn max_io_blocks(g: &Geometry) -> u64 {
    (g.max_io_blocks.max(1) as u64).min(u32::MAX as u64)
}

/// Runs a validated request. `payload` is the WRITE data (empty otherwise).
#[cfg(test)]
pub(crate) async fn execute(
    ex: &ExportState,
    req: &Request,
    payload: Bytes,
) -> Result<ReplyData, BlockError> {
    execute_held(ex, &ex.buffers, req, payload, (None, None), false).await
}

/// Runs a validated request; `buffers` is the connection's share of the
/// node's budget ([`block::BufferBudget::session_from`] of the export's), which a
/// READ takes its bytes from; `held` is what the WRITE payload took of it
/// before it was read (it is charged here when the caller took none);
/// `context` is the id of `base:allocation` when the client selected it
/// (BLOCK_STATUS is refused without it); with `to_socket` a READ's data
/// goes only to a plain socket's write ([`block::Volume::read_to_socket`]).
pub(crate) async fn execute_held(
    ex: &ExportState,
    buffers: &BufferBudget,
    req: &Request,
    payload: Bytes,
    (held, context): (Option<BufferPermit>, Option<u32>),
    to_socket: bool,
) -> Result<ReplyData, BlockError> {
    let g = ex.volume.geometry();
    let fua = req.flags & cmdflag::FUA != 0;
    let len = req.length_bytes as u64;
    match req.command {
        Command::Flush => ex.volume.flush().await.map(|_| ReplyData::None),
        Command::BlockStatus => match context {
            Some(id) if len > 0 => {
                let one = req.flags & cmdflag::REQ_ONE != 0;
                block_status(ex, &g, (req.offset_bytes, len), one, id).await
            }
            _ => Err(BlockError::NotSupported("block status without a context")),
        },
        _ if len == 0 => Ok(ReplyData::None),
        Command::Read => read(ex, buffers, &g, (req.offset_bytes, len), to_socket).await,
        Command::Write => {
            let _held = held.unwrap_or_else(|| buffers.charge(payload.len() as u64));
            write(ex, &g, req.offset_bytes, payload, fua).await?;
            Ok(ReplyData::None)
        }
        Command::Trim => {
            trim(ex, &g, req.offset_bytes, len).await?;
            if fua {
                ex.volume.flush().await?;
            }
            Ok(ReplyData::None)
        }
        Command::WriteZeroes => {
            let may_unmap = req.flags & cmdflag::NO_HOLE == 0;
            zeroes(ex, &g, req.offset_bytes, len, may_unmap).await?;
            if fua {
                ex.volume.flush().await?;
            }
            Ok(ReplyData::None)
        }
        _ => Err(BlockError::NotSupported("command")),
    }
}

/// Runs a validated WRITE whose payload waits in `pipe` (the reader took it
/// there only for whole blocks in one volume write; a volume resized since
/// gets it from a buffer, as any write).
pub(crate) async fn write_piped(
    ex: &ExportState,
    req: &Request,
    pipe: &mut block::PipePayload,
    (held, buffers): (Option<BufferPermit>, &BufferBudget),
) -> Result<ReplyData, BlockError> {
    let g = ex.volume.geometry();
    let fua = req.flags & cmdflag::FUA != 0;
    let _held = held.unwrap_or_else(|| buffers.charge(pipe.len() as u64));
    let s = Span::new(&g, req.offset_bytes, pipe.len() as u64);
    if !s.aligned() || s.blocks() > max_io_blocks(&g) {
        let data = pipe.take_bytes().map_err(BlockError::Io)?;
        write(ex, &g, req.offset_bytes, data, fua).await?;
        return Ok(ReplyData::None);
    }
    let _held = shared_change(ex, &s).await;
    ex.volume.write_pipe(s.first_lba, pipe, fua).await?;
    Ok(ReplyData::None)
}

/// Reads the blocks covering the range and returns views of the wanted bytes.
async fn read(
    ex: &ExportState,
    buffers: &BufferBudget,
    g: &Geometry,
    (offset, len): (u64, u64),
    to_socket: bool,
) -> Result<ReplyData, BlockError> {
    let s = Span::new(g, offset, len);
    // every block read stays referenced by the reply until it is written
    let permit = buffers.acquire(s.blocks() * s.bs).await;
    let step = max_io_blocks(g);
    let mut parts: Vec<Bytes> = Vec::new();
    let mut lba = s.first_lba;
    while lba < s.end_lba {
        let n = (s.end_lba - lba).min(step);
        let data = if to_socket {
            ex.volume.read_to_socket(lba, n as u32).await?
        } else {
            ex.volume.read(lba, n as u32).await?
        };
        if data.len() as u64 != n * s.bs {
            return Err(BlockError::Io(std::io::Error::other(
                "volume returned a short read",
            )));
        }
        let chunk_start = lba * s.bs;
        let from = offset.saturating_sub(chunk_start) as usize;
        let to = (s.end_bytes.min(chunk_start + n * s.bs) - chunk_start) as usize;
        parts.push(data.slice(from..to));
        lba += n;
    }
    Ok(match parts.len() {
        0 => ReplyData::None,
        1 => ReplyData::One {
            data: parts.pop().unwrap_or_default(),
            _permit: permit,
        },
        _ => ReplyData::Many {
            parts,
            _permit: permit,
        },
    })
}

/// The `base:allocation` descriptors (length, flags) of `len` bytes at
/// `offset`: contiguous from `offset`, never past the request, at most
/// [`STATUS_DESCRIPTORS_MAX`] (one with `one`); adjacent extents of one state
/// are merged. Unallocated blocks are `HOLE | ZERO`, everything else data. A
/// volume that reports nothing usable for the start gets one data descriptor.
pub(crate) fn descriptors(
    extents: &[block::Extent],
    bs: u64,
    (offset, len): (u64, u64),
    one: bool,
) -> Vec<(u32, u32)> {
    let end = offset.saturating_add(len);
    let max = if one { 1 } else { STATUS_DESCRIPTORS_MAX };
    let mut d: Vec<(u32, u32)> = Vec::new();
    let mut pos = offset;
    for e in extents {
        let from = e.lba.saturating_mul(bs);
        let to = e.lba.saturating_add(e.blocks).saturating_mul(bs).min(end);
        if from > pos {
            break; // a gap: report only what is contiguous
        }
        if to <= pos {
            continue;
        }
        let flags = if e.state == ExtentState::Deallocated {
            state::HOLE | state::ZERO
        } else {
            0
        };
        // to - pos <= len <= u32::MAX (the request's length field)
        let n = u32::try_from(to - pos).unwrap_or(u32::MAX);
        let full = d.len() == max;
        match d.last_mut() {
            Some(last) if last.1 == flags => last.0 = last.0.saturating_add(n),
            _ if full => break,
            _ => d.push((n, flags)),
        }
        pos = to;
        if pos >= end {
            break;
        }
    }
    if d.is_empty() {
        d.push((u32::try_from(len).unwrap_or(u32::MAX), 0));
    }
    d
}

/// Answers BLOCK_STATUS from the volume's allocation map.
async fn block_status(
    ex: &ExportState,
    g: &Geometry,
    range: (u64, u64),
    one: bool,
    context: u32,
) -> Result<ReplyData, BlockError> {
    let s = Span::new(g, range.0, range.1);
    let extents = ex.volume.block_status(s.first_lba, s.blocks()).await?;
    let d = descriptors(&extents, s.bs, range, one);
    let mut b = BytesMut::with_capacity(4 + 8 * d.len());
    b.put_u32(context);
    for (n, flags) in d {
        b.put_u32(n);
        b.put_u32(flags);
    }
    Ok(ReplyData::Status(b.freeze()))
}

/// Writes whole blocks from `data` starting at `lba`, in volume-sized pieces.
async fn write_blocks(
    ex: &ExportState,
    g: &Geometry,
    mut lba: u64,
    data: Bytes,
    fua: bool,
) -> Result<(), BlockError> {
    let bs = g.block_size_bytes.max(1) as usize;
    let step_bytes = max_io_blocks(g) as usize * bs;
    let mut pos = 0usize;
    while pos < data.len() {
        let n = (data.len() - pos).min(step_bytes);
        ex.volume.write(lba, data.slice(pos..pos + n), fua).await?;
        lba += (n / bs) as u64;
        pos += n;
    }
    Ok(())
}

/// The volume's write order on this node (see
/// [`super::ExportAccess::write_order`]), held shared by a change and
/// exclusively by a read-modify-write of partial blocks; none without one.
type Ordered = (
    Option<tokio::sync::OwnedRwLockReadGuard<()>>,
    Option<tokio::sync::OwnedRwLockWriteGuard<()>>,
);

/// What a change of whole blocks holds while it runs: its range shared
/// (partial-block read-modify-writes take theirs exclusively) and the
/// volume's write order shared.
async fn shared_change<'a>(ex: &'a ExportState, s: &Span) -> (RangeGuard<'a>, Ordered) {
    let range = ex
        .locks
        .lock(s.first_lba, s.end_lba, LockMode::Shared)
        .await;
    (range, ordered(ex, false).await)
}

async fn ordered(ex: &ExportState, exclusive: bool) -> Ordered {
    let Some(order) = ex.access.as_ref().and_then(|a| a.write_order()) else {
        return (None, None);
    };
    if exclusive {
        (None, Some(order.write_owned().await))
    } else {
        (Some(order.read_owned().await), None)
    }
}

/// Attempts of [`patch_block`] before it gives up on a block that changes
/// under every one.
const PATCH_ATTEMPTS_MAX: usize = 64;

/// Writes `len` bytes at byte `at` of block `lba`: `data`, or zeroes when
/// None, keeping the rest of the block. The block is read, patched and
/// written back by COMPARE AND WRITE, so a change another node made in
/// between (a replicated volume orders such writes across the pair) is read
/// again instead of undone; the caller excludes this node's other writers
/// ([`ordered`], exclusive).
async fn patch_block(
    ex: &ExportState,
    lba: u64,
    at: usize,
    data: Option<&[u8]>,
    len: usize,
    fua: bool,
) -> Result<(), BlockError> {
    for _ in 0..PATCH_ATTEMPTS_MAX {
        let old = ex.volume.read(lba, 1).await?;
        let mut new = BytesMut::from(&old[..]);
        let piece = new.get_mut(at..at + len).ok_or(BlockError::Misaligned {
            len_bytes: old.len(),
        })?;
        match data {
            Some(d) => piece.copy_from_slice(d),
            None => piece.fill(0),
        }
        if ex
            .volume
            .compare_and_write(lba, old, new.freeze(), fua)
            .await?
            .is_none()
        {
            return Ok(());
        }
    }
    Err(BlockError::Unavailable(format!(
        "block {lba} changed under each of {PATCH_ATTEMPTS_MAX} read-modify-writes"
    )))
}

/// Changes `len` bytes at byte `offset`: whole blocks by `whole(lba,
/// blocks, pos)` (`pos`: where they start in the range), partial ones by
/// [`patch_block`] with `data` (zeroes when None) from that position.
async fn change_partial<F, Fut>(
    ex: &ExportState,
    g: &Geometry,
    offset: u64,
    len: u64,
    data: Option<&Bytes>,
    fua: bool,
    mut whole: F,
) -> Result<(), BlockError>
where
    F: FnMut(u64, u64, usize) -> Fut,
    Fut: std::future::Future<Output = Result<(), BlockError>>,
{
    let bs = g.block_size_bytes.max(1) as u64;
    let end = offset + len;
    let mut at = offset;
    while at < end {
        let (lba, within) = (at / bs, at % bs);
        let pos = (at - offset) as usize;
        if within != 0 || end - at < bs {
            let n = (bs - within).min(end - at) as usize;
            let piece = data.map(|d| &d[pos..pos + n]);
            patch_block(ex, lba, within as usize, piece, n, fua).await?;
            at += n as u64;
        } else {
            let blocks = (end - at) / bs;
            whole(lba, blocks, pos).await?;
            at += blocks * bs;
        }
    }
    Ok(())
}

async fn write(
    ex: &ExportState,
    g: &Geometry,
    offset: u64,
    data: Bytes,
    fua: bool,
) -> Result<(), BlockError> {
    let s = Span::new(g, offset, data.len() as u64);
    if s.aligned() {
        let _held = shared_change(ex, &s).await;
        return write_blocks(ex, g, s.first_lba, data, fua).await;
    }
    let _g = ex
        .locks
        .lock(s.first_lba, s.end_lba, LockMode::Exclusive)
        .await;
    let _o = ordered(ex, true).await;
    let bs = s.bs as usize;
    change_partial(
        ex,
        g,
        offset,
        data.len() as u64,
        Some(&data),
        fua,
        |lba, blocks, pos| {
            let d = data.slice(pos..pos + blocks as usize * bs);
            async move { write_blocks(ex, g, lba, d, fua).await }
        },
    )
    .await
}

/// Discards the whole blocks inside the range; partial edge blocks are left alone
/// (TRIM is a hint). A volume that cannot discard ignores the hint.
async fn trim(ex: &ExportState, g: &Geometry, offset: u64, len: u64) -> Result<(), BlockError> {
    let s = Span::new(g, offset, len);
    let start = offset.div_ceil(s.bs);
    let end = s.end_bytes / s.bs;
    if end <= start {
        return Ok(());
    }
    let _g = ex.locks.lock(start, end, LockMode::Shared).await;
    let _o = ordered(ex, false).await;
    match ex.volume.discard(start, end - start).await {
        Err(BlockError::NotSupported(_)) => Ok(()),
        r => r,
    }
}

async fn zeroes(
    ex: &ExportState,
    g: &Geometry,
    offset: u64,
    len: u64,
    may_unmap: bool,
) -> Result<(), BlockError> {
    let s = Span::new(g, offset, len);
    if s.aligned() {
        let _g = ex
            .locks
            .lock(s.first_lba, s.end_lba, LockMode::Shared)
            .await;
        let _o = ordered(ex, false).await;
        return ex
            .volume
            .write_zeroes(s.first_lba, s.blocks(), may_unmap)
            .await;
    }
    let _g = ex
        .locks
        .lock(s.first_lba, s.end_lba, LockMode::Exclusive)
        .await;
    let _o = ordered(ex, true).await;
    // partial head and tail blocks by read-modify-write, whole blocks in between
    change_partial(
        ex,
        g,
        offset,
        len,
        None,
        false,
        |lba, blocks, _| async move { ex.volume.write_zeroes(lba, blocks, may_unmap).await },
    )
    .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use block::{MemVolume, Volume};
    use proptest::prelude::*;

    fn export(bs: u32, blocks: u64) -> (ExportState, Arc<MemVolume>) {
        let m = Arc::new(MemVolume::new(bs, blocks));
        (
            ExportState::new(m.clone(), false, Arc::new(RangeLocks::default())),
            m,
        )
    }

    fn req(command: Command, flags: u16, off: u64, len: u32) -> Request {
        Request {
            flags,
            command,
            cookie: 1,
            offset_bytes: off,
            length_bytes: len,
        }
    }

    fn bytes_of(d: ReplyData) -> Vec<u8> {
        match d {
            ReplyData::None => vec![],
            ReplyData::One { data, .. } => data.to_vec(),
            ReplyData::Many { parts, .. } => parts.concat(),
            ReplyData::Status(b) => b.to_vec(),
        }
    }

    /// (length, flags) pairs of a BLOCK_STATUS payload after its context id.
    fn status_of(d: ReplyData, context: u32) -> Vec<(u32, u32)> {
        let b = bytes_of(d);
        assert_eq!(&b[..4], &context.to_be_bytes());
        b[4..]
            .chunks(8)
            .map(|c| {
                (
                    u32::from_be_bytes([c[0], c[1], c[2], c[3]]),
                    u32::from_be_bytes([c[4], c[5], c[6], c[7]]),
                )
            })
            .collect()
    }

    #[tokio::test]
    async fn block_status_maps_holes_and_clips_to_the_request() {
        const HZ: u32 = state::HOLE | state::ZERO;
        // 512 B blocks, 64 KiB allocation chunks; 1 MiB volume.
        let (ex, m) = export(512, 2048);
        m.write(128, Bytes::from(vec![7u8; 512]), false)
            .await
            .unwrap();
        let bs = |flags, off, len| {
            let r = req(Command::BlockStatus, flags, off, len);
            let ex = &ex;
            async move {
                validate(&r, &ex.volume.geometry(), false)?;
                execute_held(ex, &ex.buffers, &r, Bytes::new(), (None, Some(9)), false)
                    .await
                    .map(|d| status_of(d, 9))
                    .map_err(|e| errno_of(&e, r.command))
            }
        };
        let k64 = 64 << 10;
        assert_eq!(
            bs(0, 0, 1 << 20).await,
            Ok(vec![(k64, HZ), (k64, 0), ((1 << 20) - 2 * k64, HZ)])
        );
        // Unaligned start and end: clipped to the request.
        assert_eq!(bs(0, 100, k64).await, Ok(vec![(k64 - 100, HZ), (100, 0)]));
        assert_eq!(
            bs(cmdflag::REQ_ONE, 100, k64).await,
            Ok(vec![(k64 - 100, HZ)])
        );
        assert_eq!(bs(0, k64 as u64 + 1, 10).await, Ok(vec![(10, 0)]));
        // Zero length, past the end, bad flags, no context.
        assert_eq!(bs(0, 0, 0).await, Err(errno::EINVAL));
        assert_eq!(bs(0, 1 << 20, 1).await, Err(errno::EINVAL));
        assert_eq!(bs(cmdflag::NO_HOLE, 0, 1).await, Err(errno::EINVAL));
        // FUA means nothing to a query but is allowed on every command
        assert_eq!(
            bs(cmdflag::FUA | cmdflag::REQ_ONE, 100, k64).await,
            Ok(vec![(k64 - 100, HZ)])
        );
        let r = req(Command::BlockStatus, 0, 0, 512);
        let e = execute_held(&ex, &ex.buffers, &r, Bytes::new(), (None, None), false)
            .await
            .unwrap_err();
        assert_eq!(errno_of(&e, r.command), errno::EINVAL);
    }

    #[test]
    fn descriptors_are_bounded_contiguous_and_never_past_the_request() {
        use block::Extent;
        let ext = |lba, blocks, mapped: bool| Extent {
            lba,
            blocks,
            state: if mapped {
                ExtentState::Mapped
            } else {
                ExtentState::Deallocated
            },
        };
        // Many alternating extents: capped.
        let many: Vec<Extent> = (0..5000).map(|i| ext(i, 1, i % 2 == 0)).collect();
        let d = descriptors(&many, 512, (0, 5000 * 512), false);
        assert_eq!(d.len(), STATUS_DESCRIPTORS_MAX);
        assert!(d.iter().all(|x| x.0 == 512));
        // Adjacent extents of one state merge; a gap stops the list.
        let d = descriptors(
            &[ext(0, 2, true), ext(2, 2, true), ext(8, 2, false)],
            512,
            (0, 10 * 512),
            false,
        );
        assert_eq!(d, vec![(2048, 0)]);
        // Nothing usable: one data descriptor over the request.
        assert_eq!(descriptors(&[], 512, (7, 99), false), vec![(99, 0)]);
        assert_eq!(
            descriptors(&[ext(5, 1, false)], 512, (0, 512), false),
            vec![(512, 0)]
        );
        // An extent longer than the request is clipped.
        assert_eq!(
            descriptors(&[ext(0, 1 << 40, false)], 512, (1, u32::MAX as u64), true),
            vec![(u32::MAX, state::HOLE | state::ZERO)]
        );
    }

    #[test]
    fn validation_answers() {
        let g = MemVolume::new(512, 8).geometry();
        let ok = |r: Request, ro| validate(&r, &g, ro);
        assert_eq!(ok(req(Command::Read, 0, 0, 4096), false), Ok(()));
        assert_eq!(
            ok(req(Command::Read, 0, 1, 4096), false),
            Err(errno::EINVAL)
        );
        assert_eq!(
            ok(req(Command::Write, 0, 4096, 1), false),
            Err(errno::ENOSPC)
        );
        assert_eq!(
            ok(req(Command::WriteZeroes, 0, u64::MAX, 2), false),
            Err(errno::ENOSPC)
        );
        assert_eq!(
            ok(req(Command::Trim, 0, 4000, 200), false),
            Err(errno::EINVAL)
        );
        assert_eq!(ok(req(Command::Write, 0, 0, 1), true), Err(errno::EPERM));
        assert_eq!(ok(req(Command::Read, 0, 0, 1), true), Ok(()));
        assert_eq!(
            ok(req(Command::Read, cmdflag::NO_HOLE, 0, 1), false),
            Err(errno::EINVAL)
        );
        assert_eq!(
            ok(
                req(Command::WriteZeroes, cmdflag::NO_HOLE | cmdflag::FUA, 0, 1),
                false
            ),
            Ok(())
        );
        assert_eq!(
            ok(req(Command::Write, cmdflag::DF, 0, 1), false),
            Err(errno::EINVAL)
        );
        assert_eq!(ok(req(Command::Flush, 0, 99999, 7), false), Ok(()));
    }

    #[test]
    fn error_mapping() {
        let oor = BlockError::OutOfRange {
            lba: 0,
            blocks: 1,
            block_count: 0,
        };
        assert_eq!(errno_of(&oor, Command::Write), errno::ENOSPC);
        assert_eq!(errno_of(&oor, Command::Read), errno::EINVAL);
        assert_eq!(
            errno_of(&BlockError::ReadOnly, Command::Write),
            errno::EPERM
        );
        assert_eq!(
            errno_of(&BlockError::Medium { lba: 3 }, Command::Read),
            errno::EIO
        );
    }

    #[tokio::test]
    async fn reads_span_several_volume_ios() {
        // 8 MiB max I/O on MemVolume: a 20 MiB read takes three pieces.
        let (ex, m) = export(4096, 8192);
        let data: Vec<u8> = (0..(32u32 << 20)).map(|i| (i % 251) as u8).collect();
        m.write(0, Bytes::from(data.clone()), false).await.unwrap();
        let off = 12345u64;
        let len = 20u32 << 20;
        let r = execute(&ex, &req(Command::Read, 0, off, len), Bytes::new())
            .await
            .unwrap();
        assert!(matches!(r, ReplyData::Many { .. }));
        assert_eq!(
            bytes_of(r),
            &data[off as usize..off as usize + len as usize]
        );
    }

    #[tokio::test]
    async fn a_read_holds_the_node_budget_until_its_reply_is_dropped() {
        let (mut ex, _m) = export(4096, 1024);
        ex.buffers = BufferBudget::new(1 << 20);
        // unaligned: the covering blocks are what the reply keeps alive
        let r = execute(&ex, &req(Command::Read, 0, 100, 600 << 10), Bytes::new())
            .await
            .unwrap();
        assert_eq!(ex.buffers.status().held_bytes, 604 << 10);
        let write = req(Command::Write, 0, 0, 4096);
        execute(&ex, &write, Bytes::from(vec![1u8; 4096]))
            .await
            .unwrap();
        assert_eq!(
            ex.buffers.status().held_bytes,
            604 << 10,
            "a write gives its charge back"
        );
        let read = req(Command::Read, 0, 0, 600 << 10);
        let second = execute(&ex, &read, Bytes::new());
        tokio::pin!(second);
        assert!(
            futures_poll_once(second.as_mut()).is_none(),
            "no room for a second 600 KiB read"
        );
        drop(r);
        let r2 = second.await.unwrap();
        assert_eq!(r2.len_bytes(), 600 << 10);
        assert_eq!(ex.buffers.status().waits, 1);
    }

    fn futures_poll_once<F: std::future::Future + Unpin>(f: F) -> Option<F::Output> {
        let waker = std::task::Waker::noop();
        let mut cx = std::task::Context::from_waker(waker);
        let mut f = f;
        match std::pin::Pin::new(&mut f).poll(&mut cx) {
            std::task::Poll::Ready(v) => Some(v),
            std::task::Poll::Pending => None,
        }
    }

    #[derive(Debug, Clone)]
    enum Op {
        Write(u64, Vec<u8>),
        Zero(u64, u32),
        Read(u64, u32),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (0u64..16000, proptest::collection::vec(any::<u8>(), 1..3000))
                .prop_map(|(o, d)| Op::Write(o, d)),
            (0u64..16000, 1u32..3000).prop_map(|(o, l)| Op::Zero(o, l)),
            (0u64..16000, 0u32..3000).prop_map(|(o, l)| Op::Read(o, l)),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        /// Byte-granular writes, zeroing and reads agree with a flat byte array.
        #[test]
        fn unaligned_ops_match_a_byte_oracle(ops in proptest::collection::vec(op(), 1..24), bs in prop_oneof![Just(512u32), Just(4096u32)]) {
            let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
            rt.block_on(async {
                let size = 20000u64.div_ceil(bs as u64) * bs as u64;
                let (ex, _m) = export(bs, size / bs as u64);
                let mut oracle = vec![0u8; size as usize];
                for o in ops {
                    match o {
                        Op::Write(off, d) => {
                            let end = (off as usize + d.len()).min(size as usize);
                            let d = &d[..end - off as usize];
                            let r = req(Command::Write, 0, off, d.len() as u32);
                            execute(&ex, &r, Bytes::copy_from_slice(d)).await.unwrap();
                            oracle[off as usize..end].copy_from_slice(d);
                        }
                        Op::Zero(off, l) => {
                            let end = (off + l as u64).min(size);
                            let r = req(Command::WriteZeroes, 0, off, (end - off) as u32);
                            execute(&ex, &r, Bytes::new()).await.unwrap();
                            oracle[off as usize..end as usize].fill(0);
                        }
                        Op::Read(off, l) => {
                            let end = (off + l as u64).min(size);
                            let r = req(Command::Read, 0, off, (end - off) as u32);
                            let got = bytes_of(execute(&ex, &r, Bytes::new()).await.unwrap());
                            assert_eq!(&got[..], &oracle[off as usize..end as usize]);
                        }
                    }
                }
            });
        }
    }
}
