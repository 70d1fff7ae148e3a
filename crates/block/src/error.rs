//! Typed errors of the block layer; frontends map them to SCSI sense codes or NBD errors.

/// What went wrong with a block operation.
#[derive(Debug, thiserror::Error)]
pub enum BlockError {
    /// The range does not fit inside the volume.
    #[error("range lba {lba} + {blocks} blocks is beyond the end ({block_count} blocks)")]
    OutOfRange {
        /// First block asked for.
        lba: u64,
        /// Number of blocks asked for.
        blocks: u64,
        /// Size of the volume in blocks.
        block_count: u64,
    },
    /// A buffer was not a whole number of blocks.
    #[error("buffer of {len_bytes} bytes is not a whole number of blocks")]
    Misaligned {
        /// The offending length.
        len_bytes: usize,
    },
    /// A read could not return the data of a block (unrecovered read error).
    #[error("unrecovered read error at lba {lba}")]
    Medium {
        /// The first block that could not be read.
        lba: u64,
    },
    /// A write could not be made (the device failed it).
    #[error("write error at lba {lba}")]
    WriteFault {
        /// The first block that could not be written.
        lba: u64,
    },
    /// The backing store has no space left for the blocks being written (a thin
    /// volume's file system or pool ran out); nothing of the failed request is
    /// acknowledged, and what was acknowledged before is kept.
    #[error("no space left to allocate blocks at lba {lba}")]
    NoSpace {
        /// The first block that could not be allocated.
        lba: u64,
    },
    /// The volume is write protected.
    #[error("volume is read-only")]
    ReadOnly,
    /// The operation is not supported by this volume.
    #[error("operation not supported: {0}")]
    NotSupported(&'static str),
    /// The volume is not available (failed, detached, fenced by the cluster).
    #[error("volume unavailable: {0}")]
    Unavailable(String),
    /// An operating system error from the backing file or device. Its text is
    /// in this one's, so it is not also given as the source: a chain printed
    /// whole (`{:#}`) said it twice.
    #[error("i/o error: {0}")]
    Io(std::io::Error),
}

impl From<std::io::Error> for BlockError {
    fn from(e: std::io::Error) -> BlockError {
        BlockError::Io(e)
    }
}

impl BlockError {
    /// True when retrying the same request on a redundant copy may succeed.
    pub fn is_media_error(&self) -> bool {
        matches!(
            self,
            BlockError::Medium { .. } | BlockError::WriteFault { .. } | BlockError::Io(_)
        )
    }
}
