//! [`FileVolume`]: the `block::Volume` over a regular file or a block device.

use crate::buf::{AlignedBuf, ReadBuf, WriteBuf};
use crate::engine::{IoEngine, Op};
use crate::mapping::Mapping;
use crate::open::{self, Backing};
use crate::options::{Engine, FileOptions};
use crate::stats::{bump, Counters, FileStats};
use crate::sys::{self, IoFail, NoWait};
use async_trait::async_trait;
use block::{BlockError, BlockResult, Bytes, Extent, ExtentState, Geometry, PipePayload, Volume};
use std::fmt;
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

/// A failed data sync, remembered (see `FileVolume::sync_lost`).
#[derive(Debug)]
struct SyncLatch {
    lost: AtomicBool,
    path: PathBuf,
    /// A descriptor of the same file used for nothing but this: Linux
    /// reports a writeback error once per open file, so a failure that a
    /// forced write took as its own (out of space) may have been earlier
    /// writes' lost writeback, whose one report on the volume's descriptor
    /// it used up; this one still sees it (review of 2026-12-06: the next
    /// flush succeeded over the lost data). Buffered volumes only.
    watch: Option<std::fs::File>,
    /// The data syncs running now, by number (see [`SyncLatch::settle`]).
    running: parking_lot::Mutex<std::collections::BTreeSet<u64>>,
    next: AtomicU64,
    ended: tokio::sync::Notify,
}

impl SyncLatch {
    fn new(path: PathBuf, watch: Option<std::fs::File>) -> SyncLatch {
        SyncLatch {
            lost: AtomicBool::new(false),
            path,
            watch,
            running: parking_lot::Mutex::new(std::collections::BTreeSet::new()),
            next: AtomicU64::new(0),
            ended: tokio::sync::Notify::new(),
        }
    }

    fn begin(&self) -> u64 {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        self.running.lock().insert(id);
        id
    }

    /// Sync `id` ended (its failure, if any, already set).
    fn end(&self, id: u64) {
        self.running.lock().remove(&id);
        self.ended.notify_waiters();
    }

    /// After sync `id` succeeded: waits for the syncs running beside it to
    /// end, then tells whether one failed. Linux reports a writeback error once
    /// per open file, to whichever sync looks first: a sync that overlapped
    /// this one may have taken the report of writes this one covers, and ended
    /// (or not yet) with it while this one returned 0 (review of 2026-12-06:
    /// of two flushes at once, one succeeded over lost data).
    async fn settle(&self, id: u64) -> bool {
        let beside: Vec<u64> = self
            .running
            .lock()
            .iter()
            .copied()
            .filter(|&o| o != id)
            .collect();
        loop {
            let ended = self.ended.notified();
            {
                let running = self.running.lock();
                if beside.iter().all(|o| !running.contains(o)) {
                    break;
                }
            }
            ended.await;
        }
        self.lost.load(Ordering::Acquire)
    }

    fn set(&self, op: &'static str, errno: i32) {
        if !self.lost.swap(true, Ordering::AcqRel) {
            tracing::error!(path = %self.path.display(), op, errno,
                "a data sync failed: writes and flushes to this volume fail from now on");
        }
    }
}

/// Most extents one `block_status` call returns (it may cover less than asked).
const BLOCK_STATUS_EXTENTS_MAX: usize = 1024;
/// Size of the zero buffer used where the kernel cannot zero a range itself.
const ZERO_CHUNK_BYTES: usize = 1 << 20;
/// Largest transfer tried inline with RWF_NOWAIT (a page-cache copy of 1 MiB holds
/// an async worker for well under a millisecond).
const NOWAIT_BYTES_MAX: usize = 1 << 20;

/// The detail this crate puts inside `BlockError::Io`: which operation failed, at
/// which block, with which errno (recover it with `get_ref()` + `downcast_ref`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DiskIoError {
    /// The operation: "read", "write", "flush", "discard", "write_zeroes", "block_status".
    pub op: &'static str,
    /// First block of the failed range (0 for flush).
    pub lba: u64,
    /// The Linux errno.
    pub errno: i32,
}

impl fmt::Display for DiskIoError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} at lba {}: {}",
            self.op,
            self.lba,
            io::Error::from_raw_os_error(self.errno)
        )
    }
}

impl std::error::Error for DiskIoError {}

fn os_error(op: &'static str, lba: u64, errno: i32) -> BlockError {
    if matches!(errno, libc::ENOSPC | libc::EDQUOT) {
        return BlockError::NoSpace { lba };
    }
    let kind = io::Error::from_raw_os_error(errno).kind();
    BlockError::Io(io::Error::new(kind, DiskIoError { op, lba, errno }))
}

fn io_error(op: &'static str, lba: u64, e: io::Error) -> BlockError {
    match e.raw_os_error() {
        Some(errno) => os_error(op, lba, errno),
        None => BlockError::Io(e),
    }
}

/// Errnos that mean the medium failed (as opposed to a resource or usage error).
fn is_media_errno(errno: i32) -> bool {
    matches!(
        errno,
        libc::EIO | libc::ENODATA | libc::EILSEQ | libc::EBADMSG | libc::EREMOTEIO
    )
}

/// Reads bound for a socket at least this long are views of a file in memory
/// (below, a copy costs about what the hole check and the view's upkeep do).
const MAPPED_READ_BYTES_MIN: u64 = 64 * 1024;

/// A block volume backed by a regular file or a block device.
///
/// Reads, writes and flushes go through the I/O engine (io_uring or threads);
/// discard, write-zeroes and block status are rarer and run as blocking calls on
/// tokio's blocking pool.
pub struct FileVolume {
    file: Arc<File>,
    path: PathBuf,
    backing: Backing,
    /// The geometry at open; the block count is `block_count` (it grows).
    geometry: Geometry,
    block_count: AtomicU64,
    /// Serialises [`Volume::grow`].
    growing: tokio::sync::Mutex<()>,
    engine: Arc<IoEngine>,
    direct: bool,
    mem_align_bytes: usize,
    read_only: bool,
    sync_writes: bool,
    punch_unsupported: AtomicBool,
    /// The file system refused RWF_NOWAIT reads / writes: skip the inline attempt.
    nowait_read_unsupported: AtomicBool,
    nowait_write_unsupported: AtomicBool,
    /// Inline RWF_NOWAIT attempts are allowed (FileOptions::nowait_inline).
    nowait_enabled: bool,
    /// The file lives on tmpfs: its pages are memory, so inline transfers are plain
    /// synchronous calls (tmpfs refuses RWF_NOWAIT reads, and io_uring would hand
    /// each of them to a kernel worker thread).
    memory_backed: bool,
    /// The mapping views of reads bound for a socket come from (a file in
    /// memory only; made at the first such read, again when the volume
    /// grew past it), and whether mapping failed (then reads are copied).
    mapping: parking_lot::Mutex<Option<Arc<Mapping>>>,
    mapping_failed: AtomicBool,
    zero_range_unsupported: AtomicBool,
    /// The block device failed a discard as unsupported: discards are hints
    /// ignored from then on.
    discard_unsupported: AtomicBool,
    /// A data sync (a flush, or a forced write) failed. Linux reports a
    /// writeback error once per open file and may drop the dirty pages it could
    /// not write, so a later sync would succeed over data already lost: from then
    /// on writes and flushes fail (reads go on) until the volume is opened again.
    /// Set where the sync's result arrives, even if its caller has gone (see
    /// [`FileVolume::run_syncing`]).
    sync_lost: Arc<SyncLatch>,
    zeroes: OnceLock<Bytes>,
    counters: Counters,
    /// The exclusive claim on a block device or file opened for writing,
    /// released when the volume and every sync or forced write that outlived
    /// it are gone (`open::claim_file`). A device's discards and write
    /// zeroes go through it:
    /// issued through an open without the claim, they can only invalidate
    /// the range's cached pages, which the kernel refuses (EBUSY) while one
    /// is dirty; through the claim it drops them (review of 2026-12-06).
    claim: Option<Arc<File>>,
    /// The block device's logical block size: discards and zeroing ioctls
    /// are sent for the part of a range aligned to it (see `aligned_middle`).
    device_block_bytes: u64,
    /// Blocking calls that change the file (discards, zeroing, size
    /// changes) still running, their callers gone or not: the volume's drop
    /// waits for them, as the engine's does for its writes.
    blocking_calls: Arc<crate::engine::Running>,
    /// Tests: where each blocking task waits before it runs its call.
    #[cfg(test)]
    test_gate: Option<Arc<crate::engine::tests_gate::Gate>>,
}

impl Drop for FileVolume {
    fn drop(&mut self) {
        self.blocking_calls.wait_none();
    }
}

impl fmt::Debug for FileVolume {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FileVolume")
            .field("path", &self.path)
            .field("geometry", &self.geometry())
            .field("engine", &self.engine.kind())
            .field("direct", &self.direct)
            .field("read_only", &self.read_only)
            .finish()
    }
}

/// Whether a failed BLKDISCARD or BLKZEROOUT may have got past the kernel's
/// first checks (a descriptor not open for writing, a read-only device),
/// after which the kernel has dropped the range's cached pages, dirty ones
/// too (see `discard`). EINVAL counts: the kernel checks 512-byte alignment
/// before the drop but the device's own block size after it (review of
/// 2026-12-06: a zeroing of 512-byte blocks on a 4096-byte device failed
/// with EINVAL after dropping a dirty page, and the range read back older
/// data than was last written); ranges are aligned before they are sent, so
/// it is a safeguard.
fn after_page_drop(e: &std::io::Error) -> bool {
    !matches!(e.raw_os_error(), Some(libc::EBADF | libc::EPERM))
}

/// The part of the byte range `off..off + len` aligned to `align` (a power
/// of two), as (offset, length); length 0 when no whole aligned block lies
/// inside it.
fn aligned_middle(off: u64, len: u64, align: u64) -> (u64, u64) {
    let start = off.next_multiple_of(align);
    let end = (off + len) / align * align;
    (start, end.saturating_sub(start))
}

impl FileVolume {
    /// Opens (or, with `create_size_bytes`, creates) the file or block device at
    /// `path` and starts its I/O engine.
    pub fn open(path: &Path, opts: &FileOptions) -> Result<FileVolume, BlockError> {
        let opened = open::open(path, opts)?;
        let file = Arc::new(opened.file);
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let engine = IoEngine::start(opts.engine, file.clone(), opts.queue_depth_max, &name)?;
        tracing::info!(
            path = %path.display(),
            engine = ?engine.kind(),
            direct = opened.direct,
            block_size_bytes = opened.geometry.block_size_bytes,
            block_count = opened.geometry.block_count,
            read_only = opts.read_only,
            sync_writes = opts.sync_writes,
            "opened disk volume"
        );
        let memory_backed = opened.backing == Backing::File && sys::is_tmpfs(file.as_raw_fd());
        Ok(FileVolume {
            file,
            path: path.to_path_buf(),
            backing: opened.backing,
            geometry: opened.geometry,
            block_count: AtomicU64::new(opened.geometry.block_count),
            growing: tokio::sync::Mutex::new(()),
            engine: Arc::new(engine),
            direct: opened.direct,
            mem_align_bytes: opened.mem_align_bytes,
            read_only: opts.read_only,
            sync_writes: opts.sync_writes,
            punch_unsupported: AtomicBool::new(false),
            nowait_read_unsupported: AtomicBool::new(false),
            nowait_write_unsupported: AtomicBool::new(false),
            nowait_enabled: opts.nowait_inline,
            memory_backed,
            mapping: parking_lot::Mutex::new(None),
            mapping_failed: AtomicBool::new(false),
            zero_range_unsupported: AtomicBool::new(false),
            // (a device that takes none is refused by the kernel before it
            // touches the cache; one that takes them and fails one has
            // dropped its cached pages: see discard)
            discard_unsupported: AtomicBool::new(opened.discard_unsupported),
            sync_lost: Arc::new(SyncLatch::new(
                path.to_path_buf(),
                // (opened with the volume: it sees writeback errors from now)
                (!opened.direct && !opts.read_only)
                    .then(|| std::fs::File::open(path).ok())
                    .flatten(),
            )),
            zeroes: OnceLock::new(),
            counters: Counters::default(),
            claim: opened.claim.map(Arc::new),
            device_block_bytes: opened.device_block_bytes,
            blocking_calls: Arc::default(),
            #[cfg(test)]
            test_gate: None,
        })
    }

    /// Counters of what was issued to the kernel since open.
    pub fn stats(&self) -> FileStats {
        self.counters.snapshot()
    }

    /// The engine in use: `Engine::IoUring` or `Engine::Threads` (never `Auto`).
    pub fn engine(&self) -> Engine {
        self.engine.kind()
    }

    /// True when I/O bypasses the page cache (O_DIRECT).
    pub fn is_direct(&self) -> bool {
        self.direct
    }

    /// True when the backing store is a block device rather than a file.
    pub fn is_block_device(&self) -> bool {
        self.backing == Backing::BlockDevice
    }

    /// The path the volume was opened from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn bs(&self) -> u64 {
        self.geometry.block_size_bytes as u64
    }

    fn check_writable(&self) -> BlockResult<()> {
        if self.read_only {
            Err(BlockError::ReadOnly)
        } else {
            self.check_synced()
        }
    }

    /// Fails once a data sync has failed (see `sync_lost`).
    fn check_synced(&self) -> BlockResult<()> {
        if self.sync_lost.lost.load(Ordering::Acquire) {
            return Err(BlockError::Io(std::io::Error::other(format!(
                "{}: an earlier data sync failed; what it covered may be lost, so writes and flushes fail until the volume is opened again",
                self.path.display()
            ))));
        }
        Ok(())
    }

    /// Runs a data sync (a flush, or a forced write of a buffered file) and
    /// latches its failure where the result arrives: the kernel reports a
    /// writeback error once, so a caller that gave up (an aborted SYNCHRONIZE
    /// CACHE drops its future) must not take the only report with it, or the
    /// next flush would succeed over lost data. `own_failure` tells a failure
    /// that is the op's own (a forced write out of space), not a lost sync.
    async fn run_syncing(
        &self,
        op: Op,
        what: &'static str,
        own_failure: fn(i32) -> bool,
    ) -> BlockResult<crate::engine::IoDone> {
        let (engine, latch) = (self.engine.clone(), self.sync_lost.clone());
        let path = self.path.clone();
        // the device or file stays claimed while the op runs, even past the
        // volume's drop: no new owner writes under it meanwhile (review of
        // 2026-12-06; files since 2026-12-07)
        let claim = self.claim.clone();
        block::detach::detached(async move {
            let done = Self::syncing(&engine, &latch, &path, op, what, own_failure).await;
            // the engine first: the last reference to it waits, when dropped,
            // for every write it started, and the claim holds until then
            drop(engine);
            drop(claim);
            done
        })
        .await
    }

    /// The body of [`Self::run_syncing`].
    async fn syncing(
        engine: &IoEngine,
        latch: &Arc<SyncLatch>,
        path: &Path,
        op: Op,
        what: &'static str,
        own_failure: fn(i32) -> bool,
    ) -> BlockResult<crate::engine::IoDone> {
        let id = latch.begin();
        let done = match engine.run(op).await {
            Ok(d) => d,
            Err(e) => {
                latch.end(id);
                return Err(e);
            }
        };
        if let Err(f) = &done.res {
            if !own_failure(f.errno) {
                latch.set(what, f.errno);
            } else {
                // the op's own, unless the watching descriptor has an
                // error to report: then earlier writes were lost too
                let l = latch.clone();
                let lost = tokio::task::spawn_blocking(move || {
                    l.watch.as_ref().is_some_and(|w| w.sync_data().is_err())
                })
                .await
                .unwrap_or(true);
                if lost {
                    latch.set(what, f.errno);
                }
            }
        }
        latch.end(id);
        if done.res.is_ok() && latch.settle(id).await {
            return Err(BlockError::Io(std::io::Error::other(format!(
                "{}: a data sync running beside this one failed; what both covered may be lost",
                path.display()
            ))));
        }
        Ok(done)
    }

    /// With `sync_writes` the geometry says there is no volatile cache, but
    /// O_DSYNC covers only the data path: what the kernel changes otherwise
    /// (a punched hole, a zeroed range, BLKDISCARD, BLKZEROOUT) is synced
    /// before it is acknowledged (review of 2026-12-06: it was not; the
    /// fronts flush after such a command, other users need not).
    async fn synced_change(&self) -> BlockResult<()> {
        if !self.sync_writes {
            return Ok(());
        }
        bump(&self.counters.flushes, 1);
        let done = self.run_syncing(Op::Sync, "flush", |_| false).await?;
        done.res.map_err(|f| self.fail("flush", f))
    }

    fn check_transfer(&self, blocks: u64) -> BlockResult<()> {
        if blocks > self.geometry.max_io_blocks as u64 {
            return Err(BlockError::NotSupported(
                "transfer larger than max_io_blocks",
            ));
        }
        Ok(())
    }

    fn fail(&self, op: &'static str, f: IoFail) -> BlockError {
        bump(&self.counters.errors, 1);
        let lba = f.offset / self.bs();
        let err = match (f.errno, op) {
            // The file ended before the volume did: someone truncated it.
            (0, _) => BlockError::Medium { lba },
            (e, "read") if is_media_errno(e) => BlockError::Medium { lba },
            (e, "write") if is_media_errno(e) => BlockError::WriteFault { lba },
            (e, op) => os_error(op, lba, e),
        };
        tracing::warn!(path = %self.path.display(), op, lba, errno = f.errno, "disk I/O failed");
        err
    }

    /// Writes `data` at byte `offset` through the engine.
    async fn write_at(&self, data: Bytes, offset: u64, dsync: bool) -> BlockResult<()> {
        let mut moved = 0;
        // Not with `sync_writes`: on its O_DSYNC descriptor the inline call is
        // a data sync too, and its failure (taken here as "try the engine")
        // would use up the kernel's one report of a lost writeback, so that
        // the engine's retry and every later flush succeeded over lost data.
        if !dsync
            && !self.sync_writes
            && self.nowait_fits(data.len(), &self.nowait_write_unsupported)
        {
            match sys::pwrite_inline(self.file.as_raw_fd(), &data, offset, !self.memory_backed) {
                NoWait::Moved(n) if n == data.len() => return Ok(()),
                NoWait::Moved(n) => moved = n,
                NoWait::Unsupported => self.nowait_write_unsupported.store(true, Ordering::Relaxed),
                NoWait::WouldBlock | NoWait::Failed => {}
            }
        }
        let buf = WriteBuf::new(data, self.mem_align_bytes);
        let op = Op::Write {
            buf,
            offset,
            done: moved,
            dsync,
        };
        let done = if dsync || self.sync_writes {
            // a forced write that failed may have failed on the writeback of
            // earlier writes (the fd's error is reported once) or, direct, on
            // the device cache flush it carries, which loses the earlier
            // writes the device had acknowledged as a failed flush does (they
            // went around the latch until the review of 2026-12-06, and the
            // next flush succeeded over them); running out of space is the
            // write's own failure, not a lost sync
            self.run_syncing(op, "write", |e| matches!(e, libc::ENOSPC | libc::EDQUOT))
                .await?
        } else {
            self.engine.run(op).await?
        };
        done.res.map_err(|f| self.fail("write", f))
    }

    /// Whether to try a transfer inline with RWF_NOWAIT first: only on buffered files
    /// (page-cache hits then cost no thread hop at all), only for transfers small
    /// enough not to hold an async worker long, and only while the file system
    /// supports it.
    fn nowait_fits(&self, len: usize, unsupported: &AtomicBool) -> bool {
        !self.direct
            && len <= NOWAIT_BYTES_MAX
            && self.nowait_enabled
            && !unsupported.load(Ordering::Relaxed)
    }

    /// A buffered file on tmpfs: its pages are memory the process may map
    /// and splice into.
    fn in_memory_file(&self) -> bool {
        self.memory_backed && self.backing == Backing::File && !self.direct
    }

    /// The checks of a write of `len_bytes` at `lba` (writable, whole blocks,
    /// in range, not too long), and its count; false when it writes nothing.
    fn admit_write(&self, lba: u64, len_bytes: usize) -> BlockResult<bool> {
        self.check_writable()?;
        let blocks = self.geometry().blocks_in(len_bytes)?;
        self.geometry().check_range(lba, blocks)?;
        self.check_transfer(blocks)?;
        if blocks == 0 {
            return Ok(false);
        }
        bump(&self.counters.writes, 1);
        bump(&self.counters.bytes_written, len_bytes as u64);
        Ok(true)
    }

    /// `len` bytes at byte `offset` as a view of the file's pages, if the
    /// file is in memory and every page of the range is there (a view
    /// faulting on a hole of a tmpfs file would allocate it: the file would
    /// fill up; a page swapped out is read the ordinary way too).
    fn mapped_view(&self, offset: u64, len: u64) -> Option<Bytes> {
        if !self.in_memory_file() || self.mapping_failed.load(Ordering::Relaxed) {
            return None;
        }
        let end = offset.checked_add(len)?;
        let fd = self.file.as_raw_fd();
        let mut m = self.mapping.lock();
        let map = match &*m {
            Some(map) if map.len() as u64 >= end => map.clone(),
            _ => {
                let size = self.block_count.load(Ordering::Acquire) * self.bs();
                let map = usize::try_from(size)
                    .map_err(std::io::Error::other)
                    .and_then(|size| Mapping::new(fd, size));
                match map {
                    Ok(map) if map.len() as u64 >= end => {
                        *m = Some(map.clone());
                        map
                    }
                    Ok(_) => return None,
                    Err(e) => {
                        tracing::info!(path = %self.path.display(), error = %e, "the file cannot be mapped; reads for sockets are copied");
                        self.mapping_failed.store(true, Ordering::Relaxed);
                        return None;
                    }
                }
            }
        };
        drop(m);
        // (mincore, not SEEK_HOLE: on tmpfs that walks on to the next hole,
        // the end of a full file)
        if !map.resident(offset as usize, len as usize) {
            return None;
        }
        Some(map.view(offset as usize, len as usize))
    }

    /// Writes zeroes over blocks with ordinary writes.
    async fn zero_fill(&self, lba: u64, blocks: u64) -> BlockResult<()> {
        let zeroes = self
            .zeroes
            .get_or_init(|| Bytes::from_owner(AlignedBuf::zeroed(ZERO_CHUNK_BYTES)))
            .clone();
        let chunk_blocks = ZERO_CHUNK_BYTES as u64 / self.bs();
        let mut done = 0;
        while done < blocks {
            let n = (blocks - done).min(chunk_blocks);
            let data = zeroes.slice(..(n * self.bs()) as usize);
            self.write_at(data, (lba + done) * self.bs(), false).await?;
            done += n;
        }
        Ok(())
    }

    /// Runs a blocking call on the file off the async threads.
    async fn blocking<T, F>(&self, f: F) -> BlockResult<T>
    where
        T: Send + 'static,
        F: FnOnce(&File) -> T + Send + 'static,
    {
        self.blocking_on(self.file.clone(), f).await
    }

    /// [`Self::blocking`] with the device's exclusive claim (for BLKDISCARD and
    /// BLKZEROOUT; the volume's file where there is none). Not for files:
    /// their claim is open for reading only.
    async fn blocking_claimed<T, F>(&self, f: F) -> BlockResult<T>
    where
        T: Send + 'static,
        F: FnOnce(&File) -> T + Send + 'static,
    {
        let file = self.claim.clone().unwrap_or_else(|| self.file.clone());
        self.blocking_on(file, f).await
    }

    async fn blocking_on<T, F>(&self, file: Arc<File>, f: F) -> BlockResult<T>
    where
        T: Send + 'static,
        F: FnOnce(&File) -> T + Send + 'static,
    {
        self.spawn_blocking(move || f(&file))
            .await
            .map_err(|_| BlockError::Unavailable("disk blocking task failed".into()))
    }

    /// A blocking task the volume's drop waits for.
    fn spawn_blocking<T, F>(&self, f: F) -> tokio::task::JoinHandle<T>
    where
        T: Send + 'static,
        F: FnOnce() -> T + Send + 'static,
    {
        let running = self.blocking_calls.start();
        #[cfg(test)]
        let gate = self.test_gate.clone();
        tokio::task::spawn_blocking(move || {
            let _running = running;
            #[cfg(test)]
            if let Some(g) = gate {
                g.pass();
            }
            f()
        })
    }

    /// Punches a hole (file) and reports whether the file system could.
    async fn punch(&self, op: &'static str, lba: u64, blocks: u64) -> BlockResult<bool> {
        if self.punch_unsupported.load(Ordering::Relaxed) {
            return Ok(false);
        }
        let (off, len) = (lba * self.bs(), blocks * self.bs());
        let mode = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
        match self
            .blocking(move |f| sys::fallocate(f.as_raw_fd(), mode, off, len))
            .await?
        {
            Ok(()) => Ok(true),
            Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP) => {
                self.punch_unsupported.store(true, Ordering::Relaxed);
                tracing::info!(path = %self.path.display(), "file system cannot punch holes; discard writes zeroes");
                Ok(false)
            }
            Err(e) => {
                bump(&self.counters.errors, 1);
                Err(io_error(op, lba, e))
            }
        }
    }

    /// Zeroes a file range keeping it allocated (ZERO_RANGE, or punch + allocate);
    /// reports whether the file system could.
    async fn zero_range_allocated(&self, lba: u64, blocks: u64) -> BlockResult<bool> {
        if self.zero_range_unsupported.load(Ordering::Relaxed) {
            return Ok(false);
        }
        let (off, len) = (lba * self.bs(), blocks * self.bs());
        let res = self
            .blocking(move |f| {
                let fd = f.as_raw_fd();
                let keep = libc::FALLOC_FL_KEEP_SIZE;
                match sys::fallocate(fd, libc::FALLOC_FL_ZERO_RANGE | keep, off, len) {
                    Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP) => {
                        // tmpfs and others: deallocate, then allocate again (zeroed).
                        sys::fallocate(fd, libc::FALLOC_FL_PUNCH_HOLE | keep, off, len)?;
                        sys::fallocate(fd, keep, off, len)
                    }
                    other => other,
                }
            })
            .await?;
        match res {
            Ok(()) => Ok(true),
            Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP) => {
                self.zero_range_unsupported.store(true, Ordering::Relaxed);
                Ok(false)
            }
            Err(e) => {
                bump(&self.counters.errors, 1);
                Err(io_error("write_zeroes", lba, e))
            }
        }
    }

    fn file_block_status(file: &File, bs: u64, lba: u64, blocks: u64) -> io::Result<Vec<Extent>> {
        let fd = file.as_raw_fd();
        let end = (lba + blocks) * bs;
        let mut pos = lba * bs;
        let mut out: Vec<Extent> = Vec::new();
        let mut push = |from: u64, to: u64, state: ExtentState| {
            let (l, n) = (from / bs, (to - from) / bs);
            match out.last_mut() {
                Some(e) if e.state == state && e.lba + e.blocks == l => e.blocks += n,
                _ => out.push(Extent {
                    lba: l,
                    blocks: n,
                    state,
                }),
            }
        };
        let mut pieces = 0;
        while pos < end && pieces < BLOCK_STATUS_EXTENTS_MAX {
            pieces += 1;
            let data_at = match sys::seek(fd, pos, libc::SEEK_DATA) {
                Ok(d) => d.unwrap_or(end).min(end),
                // No SEEK_DATA support: report the rest as mapped.
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => pos,
                Err(e) => return Err(e),
            };
            let hole_end = data_at / bs * bs;
            if hole_end > pos {
                push(pos, hole_end, ExtentState::Deallocated);
                pos = hole_end;
            }
            if pos >= end {
                break;
            }
            let hole_at = match sys::seek(fd, data_at, libc::SEEK_HOLE) {
                Ok(h) => h.unwrap_or(end),
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => end,
                Err(e) => return Err(e),
            };
            let mapped_end = hole_at
                .div_ceil(bs)
                .saturating_mul(bs)
                .min(end)
                .max(pos + bs);
            push(pos, mapped_end, ExtentState::Mapped);
            pos = mapped_end;
        }
        Ok(out)
    }
}

#[async_trait]
impl Volume for FileVolume {
    fn requests_at_device(&self) -> u64 {
        self.engine.at_kernel() + self.blocking_calls.count()
    }

    fn geometry(&self) -> Geometry {
        Geometry {
            block_count: self.block_count.load(Ordering::Acquire),
            ..self.geometry
        }
    }

    fn provisioning(&self) -> Option<block::Provisioning> {
        if self.backing != Backing::File {
            return None;
        }
        let (mapped_bytes, available_bytes) = sys::space_bytes(self.file.as_raw_fd())?;
        Some(block::Provisioning {
            mapped_bytes,
            available_bytes,
        })
    }

    async fn grow(&self, block_count: u64) -> BlockResult<()> {
        let _one = self.growing.lock().await;
        let now = self.block_count.load(Ordering::Acquire);
        if block_count < now {
            return Err(BlockError::NotSupported("shrinking a volume"));
        }
        if block_count == now {
            return Ok(());
        }
        if self.read_only {
            return Err(BlockError::ReadOnly);
        }
        let bytes = block_count
            .checked_mul(self.bs())
            .ok_or(BlockError::OutOfRange {
                lba: block_count,
                blocks: 0,
                block_count: now,
            })?;
        let file = self.file.clone();
        let backing = self.backing;
        self.spawn_blocking(move || -> std::io::Result<()> {
            match backing {
                Backing::File => file.set_len(bytes),
                Backing::BlockDevice => {
                    let have = sys::blk_size_bytes(file.as_raw_fd())?;
                    if have < bytes {
                        return Err(std::io::Error::other(format!(
                            "the block device has {have} bytes, fewer than {bytes}"
                        )));
                    }
                    Ok(())
                }
            }
        })
        .await
        .map_err(|e| BlockError::Io(std::io::Error::other(e)))?
        .map_err(BlockError::Io)?;
        self.block_count.store(block_count, Ordering::Release);
        tracing::info!(path = %self.path.display(), from = now, to = block_count, "volume grown");
        Ok(())
    }

    /// A file shrinks: the new size is served first, then the file is cut.
    async fn shrink(&self, block_count: u64) -> BlockResult<()> {
        let _one = self.growing.lock().await;
        let now = self.block_count.load(Ordering::Acquire);
        if block_count > now {
            return Err(BlockError::NotSupported("shrinking to a larger size"));
        }
        if self.read_only {
            return Err(BlockError::ReadOnly);
        }
        if !matches!(self.backing, Backing::File) {
            return Err(BlockError::NotSupported("shrinking a block device"));
        }
        if block_count == 0 {
            return Err(BlockError::NotSupported("shrinking a volume to nothing"));
        }
        self.block_count.store(block_count, Ordering::Release);
        let file = self.file.clone();
        let bytes = block_count * self.bs();
        let latch = self.sync_lost.clone();
        self.spawn_blocking(move || {
            file.set_len(bytes)?;
            // a sync of the volume's descriptor: a failure may be earlier
            // writes' lost writeback, reported once (review of 2026-12-06),
            // and a sync beside it waits for it (`SyncLatch::settle`)
            let id = latch.begin();
            let r = file.sync_all().inspect_err(|e| {
                latch.set("shrink", e.raw_os_error().unwrap_or(libc::EIO));
            });
            latch.end(id);
            r
        })
        .await
        .map_err(|e| BlockError::Io(std::io::Error::other(e)))?
        .map_err(BlockError::Io)?;
        tracing::warn!(path = %self.path.display(), from = now, to = block_count, "volume shrunk");
        Ok(())
    }

    async fn read(&self, lba: u64, blocks: u32) -> BlockResult<Bytes> {
        self.geometry().check_range(lba, blocks as u64)?;
        self.check_transfer(blocks as u64)?;
        if blocks == 0 {
            return Ok(Bytes::new());
        }
        let len = (blocks as u64 * self.bs()) as usize;
        bump(&self.counters.reads, 1);
        bump(&self.counters.bytes_read, len as u64);
        let offset = lba * self.bs();
        let mut buf = ReadBuf::new(len, self.direct);
        let mut moved = 0;
        if self.nowait_fits(len, &self.nowait_read_unsupported) {
            // SAFETY: the buffer owns `len` writable bytes.
            let fd = self.file.as_raw_fd();
            let nowait = !self.memory_backed;
            match unsafe { sys::pread_inline(fd, buf.as_mut_ptr(), len, offset, nowait) } {
                // SAFETY: the kernel filled all `len` bytes.
                NoWait::Moved(n) if n == len => return Ok(unsafe { buf.into_bytes(len) }),
                NoWait::Moved(n) => moved = n,
                NoWait::Unsupported => self.nowait_read_unsupported.store(true, Ordering::Relaxed),
                NoWait::WouldBlock | NoWait::Failed => {}
            }
        }
        let op = Op::Read {
            buf,
            offset,
            done: moved,
        };
        let done = self.engine.run(op).await?;
        match (done.res, done.op) {
            (Ok(()), Op::Read { buf, done, .. }) if done == len => {
                // SAFETY: the engine reports the whole buffer filled.
                Ok(unsafe { buf.into_bytes(len) })
            }
            (Err(f), _) => Err(self.fail("read", f)),
            _ => Err(BlockError::Unavailable(
                "disk engine returned a foreign op".into(),
            )),
        }
    }

    /// A file in memory: a view of its pages (see [`Mapping`]), for reads of
    /// [`MAPPED_READ_BYTES_MIN`] or more; a copy otherwise.
    async fn read_to_socket(&self, lba: u64, blocks: u32) -> BlockResult<Bytes> {
        let len = blocks as u64 * self.bs();
        if len >= MAPPED_READ_BYTES_MIN {
            self.geometry().check_range(lba, blocks as u64)?;
            self.check_transfer(blocks as u64)?;
            if let Some(view) = self.mapped_view(lba * self.bs(), len) {
                bump(&self.counters.reads, 1);
                bump(&self.counters.mapped_reads, 1);
                bump(&self.counters.bytes_read, len);
                return Ok(view);
            }
        }
        self.read(lba, blocks).await
    }

    async fn write(&self, lba: u64, data: Bytes, fua: bool) -> BlockResult<()> {
        if !self.admit_write(lba, data.len())? {
            return Ok(());
        }
        // With O_DSYNC every write is already durable.
        let dsync = fua && !self.sync_writes;
        if dsync {
            bump(&self.counters.fua_writes, 1);
        }
        self.write_at(data, lba * self.bs(), dsync).await
    }

    /// A file in memory (tmpfs), buffered, without O_DSYNC: its writes are
    /// page copies the async thread makes inline anyway, and `splice` makes
    /// the one copy from the pipe's pages into the file's.
    fn takes_pipes(&self) -> bool {
        self.in_memory_file() && !self.sync_writes && !self.read_only && self.nowait_enabled
    }

    async fn write_pipe(&self, lba: u64, pipe: &mut PipePayload, fua: bool) -> BlockResult<()> {
        if fua || !self.takes_pipes() {
            let data = pipe.take_bytes().map_err(BlockError::Io)?;
            return self.write(lba, data, fua).await;
        }
        let len = pipe.len();
        if !self.admit_write(lba, len)? {
            return Ok(());
        }
        bump(&self.counters.spliced_writes, 1);
        let offset = lba * self.bs();
        if let Err(e) = pipe.drain_to(self.file.as_raw_fd(), offset) {
            // what is left goes the ordinary way, which retries through the
            // engine and reports a failure as every write does
            tracing::debug!(path = %self.path.display(), lba, error = %e, "splice into the file failed; writing the rest from a buffer");
            let rest = pipe.take_bytes().map_err(BlockError::Io)?;
            let at = offset + (len - rest.len()) as u64;
            return self.write_at(rest, at, false).await;
        }
        Ok(())
    }

    async fn flush(&self) -> BlockResult<()> {
        if self.read_only {
            return Ok(());
        }
        self.check_synced()?;
        bump(&self.counters.flushes, 1);
        let done = self.run_syncing(Op::Sync, "flush", |_| false).await?;
        done.res.map_err(|f| self.fail("flush", f))
    }

    async fn discard(&self, lba: u64, blocks: u64) -> BlockResult<()> {
        self.check_writable()?;
        self.geometry().check_range(lba, blocks)?;
        if blocks == 0 {
            return Ok(());
        }
        bump(&self.counters.discards, 1);
        match self.backing {
            Backing::File => {
                if !self.punch("discard", lba, blocks).await? {
                    // Keep the thin promise: discarded blocks read as zeroes.
                    self.zero_fill(lba, blocks).await?;
                }
                self.synced_change().await
            }
            Backing::BlockDevice => {
                // the part the device's blocks cover whole (the rest stays
                // as it is: a discard is a hint on a thick volume)
                let (off, len) =
                    aligned_middle(lba * self.bs(), blocks * self.bs(), self.device_block_bytes);
                if self.discard_unsupported.load(Ordering::Relaxed) || len == 0 {
                    // a hint on a thick volume
                    return Ok(());
                }
                let (lba, blocks) = (off / self.bs(), len / self.bs());
                match self
                    .blocking_claimed(move |f| sys::blk_discard(f.as_raw_fd(), off, len))
                    .await?
                {
                    Ok(()) => self.synced_change().await,
                    // Discard is a hint on a thick volume. But a device that
                    // takes the request and fails it (a loop device over a
                    // file system that cannot punch holes) does so after the
                    // kernel dropped the range's cached pages, dirty ones too:
                    // the range would read back older data than was last
                    // written, so this once it is written with zeroes; later
                    // discards are not sent (review of 2026-12-06).
                    // (any failure after the kernel's early checks comes
                    // after that drop: the range is written with zeroes then
                    // too, which a discard allows)
                    Err(e) if after_page_drop(&e) => {
                        if e.raw_os_error() == Some(libc::EOPNOTSUPP) {
                            if !self.discard_unsupported.swap(true, Ordering::Relaxed) {
                                tracing::info!(path = %self.path.display(), "the device refuses discards; they are ignored from now on");
                            }
                        } else {
                            bump(&self.counters.errors, 1);
                            tracing::warn!(path = %self.path.display(), lba, error = %e, "discard failed; the range is written with zeroes");
                        }
                        self.zero_fill(lba, blocks).await?;
                        self.synced_change().await
                    }
                    Err(e) => {
                        bump(&self.counters.errors, 1);
                        Err(io_error("discard", lba, e))
                    }
                }
            }
        }
    }

    async fn write_zeroes(&self, lba: u64, blocks: u64, may_unmap: bool) -> BlockResult<()> {
        self.check_writable()?;
        self.geometry().check_range(lba, blocks)?;
        if blocks == 0 {
            return Ok(());
        }
        bump(&self.counters.write_zeroes, 1);
        let done = match self.backing {
            Backing::File if may_unmap => self.punch("write_zeroes", lba, blocks).await?,
            Backing::File => self.zero_range_allocated(lba, blocks).await?,
            Backing::BlockDevice => {
                // the ioctl for the part the device's blocks cover whole,
                // ordinary writes of zeroes for the ends
                let (off, len) =
                    aligned_middle(lba * self.bs(), blocks * self.bs(), self.device_block_bytes);
                let (mid_lba, mid_blocks) = (off / self.bs(), len / self.bs());
                let head = mid_lba.min(lba + blocks) - lba;
                let tail_lba = (mid_lba + mid_blocks).max(lba + head);
                if head > 0 {
                    self.zero_fill(lba, head).await?;
                }
                if lba + blocks > tail_lba {
                    self.zero_fill(tail_lba, lba + blocks - tail_lba).await?;
                }
                if len == 0 {
                    return self.synced_change().await;
                }
                let zeroed = match self
                    .blocking_claimed(move |f| sys::blk_zeroout(f.as_raw_fd(), off, len))
                    .await?
                {
                    Ok(()) => true,
                    Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP) => false,
                    // after the kernel dropped the range's cached pages (see
                    // discard): the zeroes are written by hand
                    Err(e) if after_page_drop(&e) => {
                        bump(&self.counters.errors, 1);
                        tracing::warn!(path = %self.path.display(), lba = mid_lba, error = %e, "write zeroes failed; the zeroes are written by hand");
                        false
                    }
                    Err(e) => {
                        bump(&self.counters.errors, 1);
                        return Err(io_error("write_zeroes", mid_lba, e));
                    }
                };
                if !zeroed {
                    self.zero_fill(mid_lba, mid_blocks).await?;
                }
                true
            }
        };
        if !done {
            self.zero_fill(lba, blocks).await?;
        }
        self.synced_change().await
    }

    async fn block_status(&self, lba: u64, blocks: u64) -> BlockResult<Vec<Extent>> {
        self.geometry().check_range(lba, blocks)?;
        if blocks == 0 {
            return Ok(Vec::new());
        }
        match self.backing {
            Backing::BlockDevice => Ok(vec![Extent {
                lba,
                blocks,
                state: ExtentState::Mapped,
            }]),
            Backing::File => {
                let bs = self.bs();
                self.blocking(move |f| Self::file_block_status(f, bs, lba, blocks))
                    .await?
                    .map_err(|e| io_error("block_status", lba, e))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::tests_gate::Gate;
    use std::sync::atomic::AtomicBool;
    use std::time::Duration;

    /// A zeroing whose caller went away still lands before the volume's
    /// drop returns, and the drop waits without holding up the runtime's
    /// other tasks: here, on a runtime of one worker, the very task that lets
    /// the zeroing end. Before, the drop returned at once (the zeroing
    /// landed later, over whatever came after the close); with the engines'
    /// wait as it was, it would have stopped that worker for good.
    #[test]
    fn dropping_the_volume_waits_for_a_zeroing_whose_caller_left() {
        let rt = crate::engine::tests_gate::one_worker_runtime();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("disk");
        let opts = FileOptions {
            create_size_bytes: Some(1 << 20),
            block_size_bytes: 4096,
            ..FileOptions::default()
        };
        let mut v = FileVolume::open(&path, &opts).unwrap();
        let gate = Arc::new(Gate::default());
        v.test_gate = Some(gate.clone());
        let v = Arc::new(v);
        let data = Bytes::from(vec![0x5a; 8192]);
        let w = v.clone();
        rt.block_on(async move { w.write(1, data, true).await })
            .unwrap();

        // a punched hole, left by its caller at the blocking call
        let caller = v.clone();
        let zeroing = rt.spawn(async move { caller.write_zeroes(1, 2, true).await });
        gate.arrived(1);
        zeroing.abort();
        assert!(rt.block_on(zeroing).is_err(), "the caller was not aborted");

        // the last reference dropped on the runtime's only worker
        let (started_tx, started) = std::sync::mpsc::channel();
        let returned = Arc::new(AtomicBool::new(false));
        let r = returned.clone();
        let dropping = rt.spawn(async move {
            started_tx.send(()).unwrap();
            drop(v);
            r.store(true, Ordering::SeqCst);
        });
        started.recv().unwrap();
        // spawned once the drop runs on the worker: it runs only if the drop
        // lets the worker's tasks go elsewhere while it waits
        let g = gate.clone();
        let r = returned.clone();
        let (opened_tx, opened) = std::sync::mpsc::channel();
        rt.spawn(async move {
            let early = r.load(Ordering::SeqCst);
            g.open();
            opened_tx.send(early).unwrap();
        });
        // (a bound on a wait for something that must happen; the runtime's
        // timers would stop with its worker)
        let early = opened.recv_timeout(Duration::from_secs(10));
        gate.open();
        rt.block_on(dropping).unwrap();
        let early = early.expect("a task could not run while the volume's drop waited");
        assert!(
            !early,
            "the volume's drop returned while a zeroing it started was still to land"
        );
        let image = std::fs::read(&path).unwrap();
        assert!(
            image[4096..3 * 4096].iter().all(|&b| b == 0),
            "the zeroing did not land"
        );
    }

    /// A file opened for writing is claimed, as a block device is: a second
    /// open of it for writing is refused while the first volume lives, and
    /// also while a forced write whose caller gave up is still to land after
    /// that volume was dropped (before, a new owner of the file could write
    /// under it and the old write land last). Reading it stays open to all.
    #[test]
    fn a_file_stays_claimed_until_a_forced_write_whose_caller_left_lands() {
        let rt = crate::engine::tests_gate::one_worker_runtime();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("disk");
        let opts = FileOptions {
            create_size_bytes: Some(1 << 20),
            block_size_bytes: 4096,
            direct: crate::options::DirectIo::Off,
            engine: Engine::Threads,
            ..FileOptions::default()
        };
        let busy = |what: &str| match FileVolume::open(&path, &opts) {
            Err(BlockError::Io(e)) if e.kind() == std::io::ErrorKind::ResourceBusy => {
                assert!(e.to_string().contains("is in use"), "{e}");
            }
            Err(e) => panic!("{what}: refused for another reason: {e}"),
            Ok(_) => panic!("{what}: a second open for writing went ahead"),
        };
        let mut v = FileVolume::open(&path, &opts).unwrap();
        busy("beside a live volume");
        let read_only = FileOptions {
            read_only: true,
            ..opts.clone()
        };
        drop(FileVolume::open(&path, &read_only).expect("a read-only open refused"));

        let gate = Arc::new(Gate::default());
        match Arc::get_mut(&mut v.engine).expect("the engine is shared") {
            IoEngine::Threads(t) => t.gate = Some(gate.clone()),
            IoEngine::Uring(_) => panic!("not the thread engine asked for"),
        }
        let v = Arc::new(v);
        let claimed = Arc::downgrade(v.claim.as_ref().expect("the file is not claimed"));
        // a forced write, left by its caller in the engine
        let caller = v.clone();
        let data = Bytes::from(vec![0x5a; 4096]);
        let write = rt.spawn(async move { caller.write(3, data, true).await });
        gate.arrived(1);
        write.abort();
        assert!(rt.block_on(write).is_err(), "the caller was not aborted");
        drop(v);
        busy("while a forced write of the dropped volume is in flight");

        gate.open();
        // (a bound on a wait for something that must happen: the write's
        // remainder lets the claim go once it has landed)
        let until = std::time::Instant::now() + Duration::from_secs(10);
        while claimed.strong_count() > 0 {
            assert!(
                std::time::Instant::now() < until,
                "the claim was never let go"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        let image = std::fs::read(&path).unwrap();
        assert!(
            image[3 * 4096..4 * 4096].iter().all(|&b| b == 0x5a),
            "the forced write did not land"
        );
        drop(FileVolume::open(&path, &opts).expect("the file stayed claimed"));
    }
}
