//! The I/O engines: how a read, write or data sync reaches the kernel.
//!
//! Both engines take an owned [`Op`] (which owns its buffer), carry it out in full
//! (continuing short transfers, retrying EINTR/EAGAIN) and hand it back in an
//! [`IoDone`] with the outcome. Ownership of the buffer stays with the engine while
//! the kernel may touch it, so a caller that gives up (drops its future) never
//! frees memory under the kernel.

mod threads;
mod uring;

use crate::buf::{ReadBuf, WriteBuf};
use crate::options::Engine;
use crate::sys::IoFail;
use block::{BlockError, BlockResult};
use std::fs::File;
use std::sync::Arc;

pub(crate) use threads::ThreadEngine;
pub(crate) use uring::UringEngine;

/// One transfer or sync, owning its buffer.
pub(crate) enum Op {
    /// Fill `buf` from byte `offset`; `done` bytes are already in.
    Read {
        buf: ReadBuf,
        offset: u64,
        done: usize,
    },
    /// Write `buf` at byte `offset` (RWF_DSYNC when `dsync`); `done` bytes are out.
    Write {
        buf: WriteBuf,
        offset: u64,
        done: usize,
        dsync: bool,
    },
    /// fdatasync.
    Sync,
}

/// A finished [`Op`] and how it ended.
pub(crate) struct IoDone {
    pub(crate) op: Op,
    pub(crate) res: Result<(), IoFail>,
}

/// Largest length put in one kernel request; longer transfers continue.
pub(crate) const CHUNK_BYTES_MAX: usize = 1 << 30;

/// Either engine behind one face.
pub(crate) enum IoEngine {
    Uring(UringEngine),
    Threads(ThreadEngine),
}

impl IoEngine {
    /// Starts the engine `which` asks for (Auto: io_uring, falling back to threads).
    pub(crate) fn start(
        which: Engine,
        file: Arc<File>,
        queue_depth_max: u32,
        name: &str,
    ) -> BlockResult<IoEngine> {
        let depth = queue_depth_max.clamp(1, 4096);
        match which {
            Engine::Threads => Ok(IoEngine::Threads(ThreadEngine::new(file, depth))),
            Engine::IoUring => Ok(IoEngine::Uring(
                UringEngine::start(file, depth, name).map_err(BlockError::Io)?,
            )),
            Engine::Auto => match UringEngine::start(file.clone(), depth, name) {
                Ok(e) => Ok(IoEngine::Uring(e)),
                Err(err) => {
                    tracing::warn!(
                        volume = name,
                        error = %err,
                        "io_uring unavailable, using the pread/pwrite thread engine"
                    );
                    Ok(IoEngine::Threads(ThreadEngine::new(file, depth)))
                }
            },
        }
    }

    /// Which engine this is.
    pub(crate) fn kind(&self) -> Engine {
        match self {
            IoEngine::Uring(_) => Engine::IoUring,
            IoEngine::Threads(_) => Engine::Threads,
        }
    }

    /// Runs `op` to completion.
    pub(crate) async fn run(&self, op: Op) -> BlockResult<IoDone> {
        match self {
            IoEngine::Uring(e) => e.run(op).await,
            IoEngine::Threads(e) => e.run(op).await,
        }
    }
}

/// Applies one kernel result to `op`: `None` when it must be resubmitted (short
/// transfer, EINTR, EAGAIN), `Some(outcome)` when finished.
pub(crate) fn advance(op: &mut Op, res: i32) -> Option<Result<(), IoFail>> {
    let again = res == -libc::EINTR || res == -libc::EAGAIN;
    match op {
        Op::Read { buf, offset, done } => {
            if again {
                return None;
            }
            let at = *offset + *done as u64;
            if res < 0 {
                return Some(Err(IoFail {
                    errno: -res,
                    offset: at,
                }));
            }
            if res == 0 {
                return Some(Err(IoFail {
                    errno: 0,
                    offset: at,
                }));
            }
            *done += res as usize;
            (*done >= buf.len()).then_some(Ok(()))
        }
        Op::Write {
            buf, offset, done, ..
        } => {
            if again {
                return None;
            }
            let at = *offset + *done as u64;
            if res <= 0 {
                // A zero-length write for a non-empty request is treated as EIO.
                let errno = if res == 0 { libc::EIO } else { -res };
                return Some(Err(IoFail { errno, offset: at }));
            }
            *done += res as usize;
            (*done >= buf.as_slice().len()).then_some(Ok(()))
        }
        Op::Sync => {
            if again {
                return None;
            }
            if res < 0 {
                Some(Err(IoFail {
                    errno: -res,
                    offset: 0,
                }))
            } else {
                Some(Ok(()))
            }
        }
    }
}

fn engine_gone() -> BlockError {
    BlockError::Unavailable("disk I/O engine stopped".into())
}
