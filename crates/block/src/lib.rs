//! The block contract of freesan.
//!
//! Every layer of the data path (disk, raid, cache, replica, lun) is a [`Volume`]
//! stacked on volumes, the way SPDK stacks bdevs: one async trait with read, write
//! (optionally FUA), flush, discard, write-zeroes, block status and geometry.
//!
//! This crate also holds the small volumes every other crate tests with:
//! [`MemVolume`] (a sparse in-memory volume that doubles as the oracle in property
//! tests), [`Passthru`] (the template for a layer), [`DelayVolume`] (adds latency) and
//! [`FaultVolume`] (injects errors and torn writes on demand). And what every
//! frontend shares about buffers: [`BufferBudget`], the node's one bound on
//! buffered data bytes, and [`StallTimeout`], which gives up on a peer that
//! stopped taking the data queued for it.
//!
//! What it does not do: any real I/O to files or devices (that is `disk`), any
//! protocol work (that is the frontends).
//!
//! Key invariant: a `write` (or `discard`/`write_zeroes`) that returned `Ok` is
//! visible to every later `read`; it is durable across a crash only after a
//! successful `flush`, or at once if it was issued with `fua = true` or the volume's
//! geometry says `volatile_cache == false`.

pub mod admission;
mod atomic;
mod budget;
mod crashsim;
mod delay;
pub mod detach;
pub mod durable;
mod error;
mod fault;
mod hold;
pub mod inflight;
mod join;
mod mem;
mod passthru;
mod pipe;
pub mod private;
mod rangelock;
mod stall;
mod switch;

pub use atomic::{AtomicWrites, ATOMIC_BYTES_MAX, ATOMIC_SLOTS};
pub use budget::{
    default_session_bytes, default_source_bytes, BufferBudget, BufferPermit, BufferStatus,
    SESSION_BYTES_MIN,
};
pub use bytes::{Bytes, BytesMut};
pub use crashsim::CrashSimVolume;
pub use delay::DelayVolume;
pub use error::BlockError;
pub use fault::{CutVolume, FaultPlan, FaultVolume};
pub use hold::{Hold, HoldVolume};
pub use join::{join_all, poll_now, poll_once, BoxFut};
pub use mem::MemVolume;
pub use passthru::Passthru;
pub use pipe::{readable_bytes, PipePayload, PIPE_CAPACITY_BYTES};
pub use rangelock::{LockMode, RangeGuard, RangeLocks};
pub use stall::{RateFloor, StallTimeout, PEER_RATE_MIN};
pub use switch::SwitchVolume;

use async_trait::async_trait;
use std::sync::Arc;

/// Result type of every volume operation.
pub type BlockResult<T> = Result<T, BlockError>;

/// Shape and capabilities of a volume.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    /// Logical block size in bytes (512 or 4096).
    pub block_size_bytes: u32,
    /// Number of logical blocks.
    pub block_count: u64,
    /// The volume is thin provisioned: `discard` frees space and the range reads
    /// back as zeroes afterwards.
    pub thin: bool,
    /// The volume holds written data in a volatile cache until `flush`; when
    /// false, every acknowledged write is already durable.
    pub volatile_cache: bool,
    /// Preferred I/O granularity in blocks (stripe chunk, cache block, ...).
    pub optimal_io_blocks: u32,
    /// Largest single read or write the volume accepts, in blocks.
    pub max_io_blocks: u32,
}

impl Geometry {
    /// Total capacity in bytes.
    pub fn size_bytes(&self) -> u64 {
        self.block_count * self.block_size_bytes as u64
    }

    /// Checks that `[lba, lba + blocks)` lies inside the volume.
    pub fn check_range(&self, lba: u64, blocks: u64) -> BlockResult<()> {
        match lba.checked_add(blocks) {
            Some(end) if end <= self.block_count => Ok(()),
            _ => Err(BlockError::OutOfRange {
                lba,
                blocks,
                block_count: self.block_count,
            }),
        }
    }

    /// Checks that a buffer length is a whole number of blocks and returns that number.
    pub fn blocks_in(&self, len_bytes: usize) -> BlockResult<u64> {
        let bs = self.block_size_bytes as usize;
        if !len_bytes.is_multiple_of(bs) {
            return Err(BlockError::Misaligned { len_bytes });
        }
        Ok((len_bytes / bs) as u64)
    }
}

/// Allocation state of a run of blocks, as GET LBA STATUS and NBD block status report it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExtentState {
    /// Blocks hold written data.
    Mapped,
    /// Blocks were never written or were discarded; they read as zeroes.
    Deallocated,
}

/// A run of blocks with one allocation state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Extent {
    /// First block of the run.
    pub lba: u64,
    /// Number of blocks in the run.
    pub blocks: u64,
    /// Allocation state of every block in the run.
    pub state: ExtentState,
}

/// Space use of a thin volume ([`Volume::provisioning`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Provisioning {
    /// Bytes of backing store the volume has allocated (mapped blocks).
    pub mapped_bytes: u64,
    /// Bytes its backing store could still allocate to it (free space of the file
    /// system or pool it lives on).
    pub available_bytes: u64,
}

/// A block volume: the one contract of the data path.
///
/// Buffers are owned (`Bytes`) so that implementations may hand them to io_uring or
/// another task without borrowing across an await.
///
/// A caller may drop a request's future at any await (an aborted command). What
/// the request already handed below still lands, so a volume whose one request
/// changes several places (mirror halves, data and parity, an SSD frame filled
/// under a lock, a switch's lock) runs it to its end once started, through
/// [`detach::detached`], and its effect is then the same as if nobody had
/// dropped it. A dropped write's own blocks may hold old or new data, as after
/// any unacknowledged write; nothing else may change.
#[async_trait]
pub trait Volume: Send + Sync + 'static {
    /// Shape and capabilities; constant for the life of the volume unless it is resized.
    fn geometry(&self) -> Geometry;

    /// Reads `blocks` blocks starting at `lba`.
    async fn read(&self, lba: u64, blocks: u32) -> BlockResult<Bytes>;

    /// Reads `blocks` blocks starting at `lba`, for bytes the caller hands
    /// only to the kernel (a plain socket's write), never reads itself: a
    /// volume may answer with a view of its pages instead of a copy (a file
    /// in memory does), whose bytes are those at the time of the socket's
    /// copy, and which a file cut short by someone else turns into a failed
    /// socket write. The default is [`Volume::read`].
    async fn read_to_socket(&self, lba: u64, blocks: u32) -> BlockResult<Bytes> {
        self.read(lba, blocks).await
    }

    /// Writes `data` (a whole number of blocks) at `lba`. With `fua` the data is
    /// durable when this returns.
    async fn write(&self, lba: u64, data: Bytes, fua: bool) -> BlockResult<()>;

    /// Whether [`Volume::write_pipe`] moves a pipe's bytes into the volume
    /// without copying them through a buffer (a buffered file in memory does);
    /// a frontend holds a payload in a pipe only for a volume that does.
    fn takes_pipes(&self) -> bool {
        false
    }

    /// Writes the bytes `pipe` holds (a whole number of blocks) at `lba`, as
    /// [`Volume::write`] would write them from a buffer; the pipe is empty
    /// afterwards unless an error stopped it. The default reads them into a
    /// buffer and writes that.
    async fn write_pipe(&self, lba: u64, pipe: &mut PipePayload, fua: bool) -> BlockResult<()> {
        let data = pipe.take_bytes().map_err(BlockError::Io)?;
        self.write(lba, data, fua).await
    }

    /// Makes every previously acknowledged write durable.
    async fn flush(&self) -> BlockResult<()>;

    /// Discards (unmaps) a range. On a thin volume the range reads as zeroes
    /// afterwards; on a thick one this is a hint and data may remain.
    async fn discard(&self, lba: u64, blocks: u64) -> BlockResult<()>;

    /// Writes zeroes over a range; with `may_unmap` a thin volume may deallocate it.
    async fn write_zeroes(&self, lba: u64, blocks: u64, may_unmap: bool) -> BlockResult<()> {
        let g = self.geometry();
        g.check_range(lba, blocks)?;
        if may_unmap && g.thin {
            return self.discard(lba, blocks).await;
        }
        let chunk_blocks = (1u64 << 20) / g.block_size_bytes as u64;
        let zeroes = Bytes::from(vec![
            0u8;
            (chunk_blocks * g.block_size_bytes as u64) as usize
        ]);
        let mut done = 0u64;
        while done < blocks {
            let n = (blocks - done).min(chunk_blocks);
            let data = zeroes.slice(0..(n * g.block_size_bytes as u64) as usize);
            self.write(lba + done, data, false).await?;
            done += n;
        }
        Ok(())
    }

    /// COMPARE AND WRITE: if the blocks at `lba` equal `compare`, writes `data`
    /// there (both the same whole-block length) and returns `None`; otherwise
    /// writes nothing and returns the byte offset of the first difference.
    ///
    /// The default reads, compares and writes: it is atomic only against writers
    /// the caller excludes itself (the SCSI layer holds its write-order lock).
    /// Volumes whose writes are ordered elsewhere (a replicated volume orders them
    /// on one node of the pair) override it to make it atomic there.
    async fn compare_and_write(
        &self,
        lba: u64,
        compare: Bytes,
        data: Bytes,
        fua: bool,
    ) -> BlockResult<Option<usize>> {
        let g = self.geometry();
        let blocks = g.blocks_in(compare.len())?;
        if data.len() != compare.len() {
            return Err(BlockError::Misaligned {
                len_bytes: data.len(),
            });
        }
        let current = self.read(lba, blocks as u32).await?;
        if let Some(i) = first_difference(&compare, &current) {
            return Ok(Some(i));
        }
        self.write(lba, data, fua).await?;
        Ok(None)
    }

    /// Writes `data` at `lba` for the offloaded copy `copy` (EXTENDED COPY, WRITE
    /// USING TOKEN: a copy the node runs itself, numbered by the caller, unique
    /// in the process). Until [`Volume::copy_end`], a volume whose blocks another
    /// node also serves may keep there what the copy overwrote, so that the copy
    /// is undone rather than left half done if this node is lost (a replicated
    /// volume does). The default is a plain write.
    async fn write_copy(&self, copy: u64, lba: u64, data: Bytes, fua: bool) -> BlockResult<()> {
        let _ = copy;
        self.write(lba, data, fua).await
    }

    /// The copy `copy` has ended, done or failed, and its command is answered
    /// next: what [`Volume::write_copy`] kept for it is let go. Err when that
    /// cannot be confirmed (the copy must then be reported failed). The default
    /// keeps nothing.
    async fn copy_end(&self, copy: u64) -> BlockResult<()> {
        let _ = copy;
        Ok(())
    }

    /// Most blocks one [`Volume::write_atomic`] may carry; 0 (the default) when the
    /// volume has no atomic writes.
    fn atomic_write_max_blocks(&self) -> u32 {
        0
    }

    /// Writes `data` at `lba` all or nothing: after a crash the blocks hold either
    /// all of it or none of it, and no read or write running at the same time sees
    /// part of it. Durable when it returns (as with `fua`). Refused (the default)
    /// by volumes that cannot promise it; see [`AtomicWrites`].
    async fn write_atomic(&self, lba: u64, data: Bytes) -> BlockResult<()> {
        let _ = (lba, data);
        Err(BlockError::NotSupported(
            "atomic writes on this kind of volume",
        ))
    }

    /// Allocation state of the blocks from `lba` on, covering at least one block and
    /// at most `blocks`. The default says everything is mapped.
    async fn block_status(&self, lba: u64, blocks: u64) -> BlockResult<Vec<Extent>> {
        self.geometry().check_range(lba, blocks)?;
        Ok(vec![Extent {
            lba,
            blocks,
            state: ExtentState::Mapped,
        }])
    }

    /// Space use of a thin volume: what it has allocated and what its backing
    /// store could still give it. `None` when the volume does not know or is
    /// fully provisioned (the default). Cheap enough to ask every few megabytes
    /// written; never blocks on I/O.
    fn provisioning(&self) -> Option<Provisioning> {
        None
    }

    /// Grows the volume to `block_count` blocks while it serves (a file is extended;
    /// a block device must have grown already). Refused by volumes that cannot grow
    /// (the default) and for a smaller count: shrinking would cut data off.
    async fn grow(&self, block_count: u64) -> BlockResult<()> {
        let _ = block_count;
        Err(BlockError::NotSupported("growing this kind of volume"))
    }

    /// Names who to ask before this device gives itself up on a command
    /// timeout (see [`Keeper`]): the pool or cache it serves, which knows
    /// whether losing it costs redundancy only or the data. A device without
    /// a timeout ignores it (the default); a later call replaces the keeper.
    fn keep_with(&self, keeper: Arc<dyn Keeper>) {
        let _ = keeper;
    }

    /// Requests handed to the device (the kernel, a disk) that it has not
    /// answered yet, their callers waiting or gone: a caller that drops a
    /// request after that does not take it back from the device, and a
    /// write among them may still land. A device taken back after it stopped
    /// answering waits for none left (`disk::TimedDisk::reinstated`). 0 for
    /// volumes that keep none (memory) or cannot tell; layers over one
    /// device forward it.
    fn requests_at_device(&self) -> u64 {
        0
    }

    /// Shrinks the volume to `block_count` blocks, cutting off what lies beyond.
    /// Only for a volume nobody addresses beyond that point any more (the caller
    /// makes sure: an unmapped LUN). Refused by volumes that cannot shrink (the
    /// default: pools, caches, replicas, block devices).
    async fn shrink(&self, block_count: u64) -> BlockResult<()> {
        let _ = block_count;
        Err(BlockError::NotSupported("shrinking this kind of volume"))
    }
}

/// What a device that stopped answering asks before it gives itself up
/// (fails every request from then on): whether the volume it serves can do
/// without it. A pool member that holds the pool's last redundancy, or whose
/// siblings have stopped answering as well (a stall they share: a controller
/// resetting, a path failing over), is better waited for: failing it would
/// fail the pool, or cost redundancy the stall's end would have kept.
#[async_trait]
pub trait Keeper: Send + Sync {
    /// A request to the device has had no answer within its command timeout
    /// `limit`. True if the device may be given up now; false to wait one
    /// more `limit` and ask again. May take up to `limit / 2` to find out
    /// (it may ask the device's siblings); the device's own answer ends the
    /// question. `unanswered` is the kind of request that had no answer,
    /// so that siblings are asked the same kind of question: a stall may
    /// hold writes only (a frozen file system under disk files answers
    /// reads from its cache), and siblings answering a read say nothing of
    /// it.
    async fn may_give_up(&self, limit: std::time::Duration, unanswered: Unanswered) -> bool;
}

/// The kind of request a device left unanswered ([`Keeper::may_give_up`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unanswered {
    /// A read, or a question that reads (block status).
    Read,
    /// A write, or a change like one (discard, zeroing, compare and write).
    Write,
    /// A flush: whether writes reach stable storage.
    Flush,
}

/// True if any of `probes` (one question to each of a silent device's
/// siblings) answers true within `within`: what a [`Keeper`] asks to tell a
/// device that stopped answering alone from a stall they share. The
/// questions still out at the end are dropped.
pub async fn any_answers<F>(
    probes: impl IntoIterator<Item = F>,
    within: std::time::Duration,
) -> bool
where
    F: std::future::Future<Output = bool> + Send + 'static,
{
    let mut out = tokio::task::JoinSet::new();
    for p in probes {
        out.spawn(p);
    }
    let first = async {
        while let Some(answered) = out.join_next().await {
            if matches!(answered, Ok(true)) {
                return true;
            }
        }
        false
    };
    tokio::time::timeout(within, first).await.unwrap_or(false)
}

/// A probe for [`any_answers`]: one question to `device`, of the kind a
/// silent sibling left `unanswered`. A read: one block at a random place,
/// so that a cache above the device (a disk file's page cache) is unlikely
/// to answer for it. A write or flush: a block of zeroes written (with FUA
/// for a flush) at `spare_lba`, a block the device's owner never reads;
/// without one, a read all the same.
pub async fn probe(device: VolumeRef, unanswered: Unanswered, spare_lba: Option<u64>) -> bool {
    match (unanswered, spare_lba) {
        (Unanswered::Read, _) | (_, None) => {
            let lba = rand::random::<u64>() % device.geometry().block_count.max(1);
            device.read(lba, 1).await.is_ok()
        }
        (Unanswered::Write | Unanswered::Flush, Some(lba)) => {
            let zeroes = Bytes::from(vec![0u8; device.geometry().block_size_bytes as usize]);
            let fua = unanswered == Unanswered::Flush;
            device.write(lba, zeroes, fua).await.is_ok()
        }
    }
}

/// Byte offset of the first difference between two buffers over their common
/// length; `None` when that much is equal.
pub fn first_difference(a: &[u8], b: &[u8]) -> Option<usize> {
    a.iter().zip(b).position(|(x, y)| x != y)
}

/// A shared, dynamically typed volume: how layers hold the volumes below them.
pub type VolumeRef = Arc<dyn Volume>;
