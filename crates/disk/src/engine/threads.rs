//! The fallback engine: positional pread/pwrite/fdatasync on tokio's blocking
//! thread pool, at most `queue_depth_max` at once (the way tgt's rdwr backend works).

use super::{engine_gone, IoDone, Op};
use crate::sys;
use block::BlockResult;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::sync::Arc;
use tokio::sync::Semaphore;

/// Runs each operation as one blocking task.
pub(crate) struct ThreadEngine {
    file: Arc<File>,
    permits: Arc<Semaphore>,
}

impl ThreadEngine {
    pub(crate) fn new(file: Arc<File>, queue_depth_max: u32) -> ThreadEngine {
        ThreadEngine {
            file,
            permits: Arc::new(Semaphore::new(queue_depth_max as usize)),
        }
    }

    pub(crate) async fn run(&self, mut op: Op) -> BlockResult<IoDone> {
        let permit = self
            .permits
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| engine_gone())?;
        let file = self.file.clone();
        let task = tokio::task::spawn_blocking(move || {
            let res = run_blocking(file.as_raw_fd(), &mut op);
            drop(permit);
            IoDone { op, res }
        });
        task.await.map_err(|_| engine_gone())
    }
}

fn run_blocking(fd: i32, op: &mut Op) -> Result<(), sys::IoFail> {
    match op {
        Op::Read { buf, offset, done } => {
            let len = buf.len();
            // SAFETY: the buffer owns `len` writable bytes.
            let res = unsafe {
                sys::pread_full(
                    fd,
                    buf.as_mut_ptr().add(*done),
                    len - *done,
                    *offset + *done as u64,
                )
            };
            if res.is_ok() {
                *done = len;
            }
            res
        }
        Op::Write {
            buf,
            offset,
            done,
            dsync,
        } => {
            let data = &buf.as_slice()[*done..];
            let res = sys::pwrite_full(fd, data, *offset + *done as u64, *dsync);
            if res.is_ok() {
                *done = buf.as_slice().len();
            }
            res
        }
        Op::Sync => sys::fdatasync(fd),
    }
}
