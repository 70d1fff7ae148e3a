//! Operation counters of a [`crate::FileVolume`]: cheap relaxed atomics bumped on
//! the data path, read as a [`FileStats`] snapshot for metrics and tests.

use std::sync::atomic::{AtomicU64, Ordering};

/// A snapshot of what a volume has issued to the kernel since it was opened.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FileStats {
    /// Read requests issued.
    pub reads: u64,
    /// Reads answered with a view of the file's pages instead of a copy
    /// (counted among `reads` too).
    pub mapped_reads: u64,
    /// Write requests issued (FUA ones included).
    pub writes: u64,
    /// Writes issued with RWF_DSYNC because the caller asked for FUA.
    pub fua_writes: u64,
    /// Writes whose bytes were spliced from a pipe into the file (counted
    /// among `writes` too).
    pub spliced_writes: u64,
    /// Data syncs (fdatasync / IORING_OP_FSYNC with DATASYNC) issued.
    pub flushes: u64,
    /// Discards issued (hole punches or BLKDISCARD).
    pub discards: u64,
    /// Write-zeroes requests served.
    pub write_zeroes: u64,
    /// Bytes read.
    pub bytes_read: u64,
    /// Bytes written by writes (not counting zeroing).
    pub bytes_written: u64,
    /// Operations that failed with an error from the kernel.
    pub errors: u64,
}

#[derive(Default)]
pub(crate) struct Counters {
    pub(crate) reads: AtomicU64,
    pub(crate) mapped_reads: AtomicU64,
    pub(crate) writes: AtomicU64,
    pub(crate) fua_writes: AtomicU64,
    pub(crate) spliced_writes: AtomicU64,
    pub(crate) flushes: AtomicU64,
    pub(crate) discards: AtomicU64,
    pub(crate) write_zeroes: AtomicU64,
    pub(crate) bytes_read: AtomicU64,
    pub(crate) bytes_written: AtomicU64,
    pub(crate) errors: AtomicU64,
}

/// Adds `n` to a counter.
pub(crate) fn bump(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

impl Counters {
    pub(crate) fn snapshot(&self) -> FileStats {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        FileStats {
            reads: get(&self.reads),
            mapped_reads: get(&self.mapped_reads),
            writes: get(&self.writes),
            fua_writes: get(&self.fua_writes),
            spliced_writes: get(&self.spliced_writes),
            flushes: get(&self.flushes),
            discards: get(&self.discards),
            write_zeroes: get(&self.write_zeroes),
            bytes_read: get(&self.bytes_read),
            bytes_written: get(&self.bytes_written),
            errors: get(&self.errors),
        }
    }
}
