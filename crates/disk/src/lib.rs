//! Leaf volumes of freesan: [`FileVolume`] serves a regular file or a block device
//! as a `block::Volume`.
//!
//! Reads, writes and flushes go through an I/O engine: io_uring on a dedicated
//! thread that owns the ring (callers queue work in a bounded queue and are woken
//! by a oneshot), or, where io_uring cannot be set up, positional pread/pwrite on a
//! bounded set of blocking threads. O_DIRECT is used where it helps (not on tmpfs),
//! FUA is a per-write RWF_DSYNC, flush is fdatasync, discard punches holes (files)
//! or issues BLKDISCARD (devices), block status reads SEEK_DATA/SEEK_HOLE.
//!
//! What it does not do: caching, striping or redundancy (upper layers), and no
//! simulated disks yet. It never grows an existing file on its own.
//!
//! Key invariant: a buffer handed to the kernel is owned by the engine until the
//! kernel is done with it, so cancelled callers never free memory under in-flight
//! I/O; and an acknowledged write is as durable as the geometry says (FUA and
//! `sync_writes` really reach the disk, counted in [`FileStats`]).

mod buf;
mod engine;
mod open;
mod options;
mod stats;
mod sys;
mod volume;

pub use options::{parse_size, DirectIo, Engine, FileOptions};
pub use stats::FileStats;
pub use volume::{DiskIoError, FileVolume};
