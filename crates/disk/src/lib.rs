//! Leaf volumes of freesan: [`FileVolume`] serves a regular file or a block device
//! as a `block::Volume`; [`SimDisk`] (module [`sim`]) stores data on another volume
//! and answers with the timing of a modelled 7200 rpm HDD or SATA SSD, in real time,
//! so that RAID and cache experiments on one machine measure something honest.
//!
//! Reads, writes and flushes go through an I/O engine: io_uring on a dedicated
//! thread that owns the ring (callers queue work in a bounded queue and are woken
//! by a oneshot), or, where io_uring cannot be set up, positional pread/pwrite on a
//! bounded set of blocking threads. O_DIRECT is used where it helps (not on tmpfs),
//! FUA is a per-write RWF_DSYNC, flush is fdatasync, discard punches holes (files)
//! or issues BLKDISCARD (devices), block status reads SEEK_DATA/SEEK_HOLE.
//!
//! What it does not do: caching, striping or redundancy (upper layers). It never
//! grows an existing file on its own.
//!
//! Key invariant: a buffer handed to the kernel is owned by the engine until the
//! kernel is done with it, so cancelled callers never free memory under in-flight
//! I/O; and an acknowledged write is as durable as the geometry says (FUA and
//! `sync_writes` really reach the disk, counted in [`FileStats`]).

mod buf;
mod engine;
mod mapping;
mod open;
mod options;
pub mod sim;
mod stats;
mod sys;
mod timed;
mod volume;

pub use options::{parse_size, DirectIo, Engine, FileOptions};
pub use sim::{
    HddModel, HddParams, SimClock, SimDisk, SimDiskConfig, SimModel, SsdModel, SsdParams,
};
pub use stats::FileStats;
pub use timed::{
    DiskTiming, TimedDisk, FLUSH_TIMEOUT_FACTOR, IO_TIMEOUT_DEFAULT, KEEP_TIMEOUT_FACTOR,
};
pub use volume::{DiskIoError, FileVolume};
