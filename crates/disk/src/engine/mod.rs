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

/// How many blocking tasks an owner (an engine, a volume) started are still
/// running: its drop waits for them, so what they change lands before the
/// file is closed (and perhaps opened again, or handed to another owner),
/// not over what is written after.
#[derive(Default)]
pub(crate) struct Running {
    count: std::sync::Mutex<usize>,
    none: std::sync::Condvar,
}

impl Running {
    /// Counts one task until the guard is dropped (also if the task panics).
    pub(crate) fn start(self: &Arc<Self>) -> RunningGuard {
        *self.count.lock().unwrap_or_else(|p| p.into_inner()) += 1;
        RunningGuard(self.clone())
    }

    /// How many run now.
    pub(crate) fn count(&self) -> u64 {
        *self.count.lock().unwrap_or_else(|p| p.into_inner()) as u64
    }

    /// Waits until no task runs ([`wait_beside_the_runtime`]; not at all
    /// when none runs, the common case, which then hands no worker's tasks
    /// elsewhere).
    pub(crate) fn wait_none(&self) {
        if *self.count.lock().unwrap_or_else(|p| p.into_inner()) == 0 {
            return;
        }
        wait_beside_the_runtime(|| {
            let mut n = self.count.lock().unwrap_or_else(|p| p.into_inner());
            while *n > 0 {
                n = self.none.wait(n).unwrap_or_else(|p| p.into_inner());
            }
        });
    }
}

/// One running task of a [`Running`].
pub(crate) struct RunningGuard(Arc<Running>);

impl Drop for RunningGuard {
    fn drop(&mut self) {
        let mut n = self.0.count.lock().unwrap_or_else(|p| p.into_inner());
        *n -= 1;
        if *n == 0 {
            self.0.none.notify_all();
        }
    }
}

/// Runs `wait` (a wait for the kernel or a thread: an engine's or a volume's
/// drop) so that it does not hold up other tasks: on a worker of a
/// multi-threaded tokio runtime, its other tasks move to another worker
/// while this one waits (`block_in_place`); before, the drop of a volume
/// whose disk hung stopped the tasks queued on that worker, and on a runtime
/// of one worker the task that would have ended the wait. Elsewhere (a plain
/// thread, a blocking task, a current-thread runtime, where nothing can
/// take the tasks) it just waits.
pub(crate) fn wait_beside_the_runtime(wait: impl FnOnce()) {
    use tokio::runtime::{Handle, RuntimeFlavor};
    let multi =
        Handle::try_current().is_ok_and(|h| h.runtime_flavor() == RuntimeFlavor::MultiThread);
    // (never while a panic unwinds: a second panic would abort)
    if !multi || std::thread::panicking() {
        return wait();
    }
    // block_in_place refuses, before it runs anything, a thread that is in
    // the runtime without being one of its workers or its block_on (a
    // LocalSet's): then the wait is plain, as elsewhere
    let mut wait = Some(wait);
    let tried = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        tokio::task::block_in_place(|| {
            if let Some(w) = wait.take() {
                w()
            }
        })
    }));
    match (tried, wait) {
        (Ok(()), _) => {}
        (Err(_), Some(w)) => w(),
        (Err(p), None) => std::panic::resume_unwind(p),
    }
}

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

    /// Operations handed to the kernel (queued for it) that it has not
    /// answered, their callers gone or not.
    pub(crate) fn at_kernel(&self) -> u64 {
        match self {
            IoEngine::Uring(e) => e.at_kernel(),
            IoEngine::Threads(e) => e.at_kernel(),
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

#[cfg(test)]
pub(crate) mod tests_gate {
    use std::sync::{Condvar, Mutex};

    /// A multi-threaded runtime of one worker: a task that holds it up holds
    /// up every other.
    pub(crate) fn one_worker_runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap()
    }

    /// Holds each task that reaches it until [`Gate::open`].
    #[derive(Default)]
    pub(crate) struct Gate {
        state: Mutex<(usize, bool)>,
        changed: Condvar,
    }

    impl Gate {
        pub(crate) fn pass(&self) {
            let mut s = self.state.lock().unwrap();
            s.0 += 1;
            self.changed.notify_all();
            while !s.1 {
                s = self.changed.wait(s).unwrap();
            }
        }

        pub(crate) fn arrived(&self, n: usize) {
            let mut s = self.state.lock().unwrap();
            while s.0 < n {
                s = self.changed.wait(s).unwrap();
            }
        }

        pub(crate) fn open(&self) {
            self.state.lock().unwrap().1 = true;
            self.changed.notify_all();
        }
    }
}
