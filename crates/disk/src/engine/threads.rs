//! The fallback engine: positional pread/pwrite/fdatasync on tokio's blocking
//! thread pool, at most `queue_depth_max` at once (the way tgt's rdwr backend works).
//!
//! Like the io_uring engine's thread, which is joined once nothing it submitted
//! is in flight, dropping the engine waits for every operation it started,
//! including those whose callers went away: a write given up by its caller
//! still lands, and it must land before the volume is closed (and perhaps
//! opened again, or its file handed to another owner), not over what is
//! written after (review of 2026-12-06).

use super::{engine_gone, IoDone, Op, Running};
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
    running: Arc<Running>,
    /// Tests: where each blocking task waits before it runs its operation.
    #[cfg(test)]
    pub(crate) gate: Option<Arc<super::tests_gate::Gate>>,
}

impl Drop for ThreadEngine {
    fn drop(&mut self) {
        self.running.wait_none();
    }
}

impl ThreadEngine {
    pub(crate) fn new(file: Arc<File>, queue_depth_max: u32) -> ThreadEngine {
        ThreadEngine {
            file,
            permits: Arc::new(Semaphore::new(queue_depth_max as usize)),
            running: Arc::default(),
            #[cfg(test)]
            gate: None,
        }
    }

    /// Operations running in blocking tasks (a caller that drops its
    /// future does not stop its task).
    pub(crate) fn at_kernel(&self) -> u64 {
        self.running.count()
    }

    pub(crate) async fn run(&self, mut op: Op) -> BlockResult<IoDone> {
        let permit = self
            .permits
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| engine_gone())?;
        let file = self.file.clone();
        let running = self.running.start();
        #[cfg(test)]
        let gate = self.gate.clone();
        let task = tokio::task::spawn_blocking(move || {
            let _running = running;
            #[cfg(test)]
            if let Some(g) = gate {
                g.pass();
            }
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

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::buf::WriteBuf;
    use crate::engine::tests_gate::Gate;
    use block::Bytes;
    use std::time::Duration;

    /// A write whose caller went away still lands, and dropping the engine
    /// (closing the volume) waits for it: before, the drop returned at once
    /// and the write landed later, over whatever came after the close. Until
    /// it lands it is counted as at the device (`at_kernel`, which a disk's
    /// take-back waits on), its caller gone.
    #[test]
    fn dropping_the_engine_waits_for_a_write_whose_caller_left() {
        let rt = crate::engine::tests_gate::one_worker_runtime();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("disk");
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .unwrap();
        file.set_len(8192).unwrap();
        let gate = Arc::new(Gate::default());
        let mut engine = ThreadEngine::new(Arc::new(file), 4);
        engine.gate = Some(gate.clone());
        let engine = Arc::new(engine);
        assert_eq!(engine.at_kernel(), 0);

        let caller = engine.clone();
        let write = rt.spawn(async move {
            let buf = WriteBuf::new(Bytes::from(vec![0x5a; 4096]), 1);
            let op = Op::Write {
                buf,
                offset: 4096,
                done: 0,
                dsync: false,
            };
            caller.run(op).await.map(|_| ())
        });
        gate.arrived(1);
        write.abort();
        assert!(rt.block_on(write).is_err(), "the caller was not aborted");
        assert_eq!(
            engine.at_kernel(),
            1,
            "a write whose caller left is not counted while it runs"
        );

        let (closed_tx, closed) = std::sync::mpsc::channel();
        let closer = std::thread::spawn(move || {
            drop(engine);
            closed_tx.send(()).unwrap();
        });
        // (a bound on a wait for something that must not happen)
        let early = closed.recv_timeout(Duration::from_millis(300));
        gate.open();
        closer.join().unwrap();
        assert!(
            early.is_err(),
            "the engine was dropped while a write it started was still to land"
        );
        let data = std::fs::read(&path).unwrap();
        assert!(
            data[4096..].iter().all(|&b| b == 0x5a),
            "the write did not land"
        );
    }
}
