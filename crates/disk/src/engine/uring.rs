//! The io_uring engine: one thread owns the ring; callers hand it work through a
//! bounded queue and wait on a oneshot for the completion.
//!
//! Wake-up: the ring thread keeps a read of an eventfd pending in the ring, so one
//! `io_uring_enter(GETEVENTS)` sleeps until either an I/O or the eventfd completes.
//! A caller writes the eventfd only when the ring thread announced it is about to
//! sleep (`sleeping` flag); while the thread is busy, callers just push and go, and
//! the thread picks everything up as one batch that it submits with a single enter
//! (which also waits for the next completion). At 32 in flight that makes well under
//! one syscall per I/O on the caller side and one enter per batch on the ring side.
//!
//! Invariant: a request's buffer is owned by the ring thread from the moment it is
//! queued until its completion has been reaped; the thread exits only when nothing
//! is in flight, so the kernel never writes into freed memory.

use super::{advance, engine_gone, IoDone, Op, CHUNK_BYTES_MAX};
use crate::sys::IoFail;
use block::BlockResult;
use io_uring::{opcode, squeue, types, IoUring, Probe};
use parking_lot::Mutex;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use tokio::sync::{oneshot, Semaphore};

/// user_data of the pending eventfd read.
const WAKE_USER_DATA: u64 = u64::MAX;

struct Request {
    op: Op,
    done: oneshot::Sender<IoDone>,
}

/// State shared by callers and the ring thread.
struct Shared {
    /// Requests not yet taken by the ring thread; at most `queue_depth_max` long
    /// because every request holds a permit.
    queue: Mutex<Vec<Request>>,
    /// The ring thread is (about to be) asleep in io_uring_enter: write the eventfd.
    sleeping: AtomicBool,
    /// Set by drop: finish what is in flight, then exit.
    shutdown: AtomicBool,
    /// The ring thread failed; new requests are refused.
    dead: AtomicBool,
    /// One permit per request queued or in flight.
    permits: Semaphore,
    /// The permits there are.
    permits_max: usize,
    eventfd: OwnedFd,
    file: Arc<File>,
}

impl Shared {
    fn wake(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live u64 to our eventfd. A failure (only
        // possible on counter overflow) leaves a wake-up already pending.
        let _ = unsafe {
            libc::write(
                self.eventfd.as_raw_fd(),
                (&one as *const u64).cast(),
                std::mem::size_of::<u64>(),
            )
        };
    }
}

/// Handle to the ring thread.
pub(crate) struct UringEngine {
    shared: Arc<Shared>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl UringEngine {
    /// Sets up the ring (on its own thread, so that it may be single-issuer) and
    /// returns once it is ready, or the reason it cannot be.
    pub(crate) fn start(
        file: Arc<File>,
        queue_depth_max: u32,
        name: &str,
    ) -> io::Result<UringEngine> {
        // SAFETY: plain syscall; the descriptor is owned right after.
        let efd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
        if efd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: efd is a fresh descriptor nobody else owns.
        let eventfd = unsafe { OwnedFd::from_raw_fd(efd) };
        let shared = Arc::new(Shared {
            queue: Mutex::new(Vec::with_capacity(queue_depth_max as usize)),
            sleeping: AtomicBool::new(false),
            shutdown: AtomicBool::new(false),
            dead: AtomicBool::new(false),
            permits: Semaphore::new(queue_depth_max as usize),
            permits_max: queue_depth_max as usize,
            eventfd,
            file,
        });
        let (ready_tx, ready_rx) = std::sync::mpsc::sync_channel::<io::Result<()>>(1);
        let thread_shared = shared.clone();
        let thread_name: String = format!("uring-{name}").chars().take(15).collect();
        let thread =
            std::thread::Builder::new()
                .name(thread_name)
                .spawn(move || {
                    match setup_ring(queue_depth_max, thread_shared.file.as_raw_fd()) {
                        Ok((ring, fixed)) => {
                            let _ = ready_tx.send(Ok(()));
                            RingThread::new(ring, fixed, thread_shared, queue_depth_max as usize)
                                .run();
                        }
                        Err(e) => {
                            let _ = ready_tx.send(Err(e));
                        }
                    }
                })?;
        match ready_rx.recv() {
            Ok(Ok(())) => Ok(UringEngine {
                shared,
                thread: Some(thread),
            }),
            Ok(Err(e)) => {
                let _ = thread.join();
                Err(e)
            }
            Err(_) => {
                let _ = thread.join();
                Err(io::Error::other("io_uring thread died during setup"))
            }
        }
    }

    /// Requests queued for the ring or in flight in it (each holds a
    /// permit until its completion is reaped, its caller gone or not).
    pub(crate) fn at_kernel(&self) -> u64 {
        let s = &*self.shared;
        s.permits_max.saturating_sub(s.permits.available_permits()) as u64
    }

    /// Queues `op` and waits for its completion.
    pub(crate) async fn run(&self, op: Op) -> BlockResult<IoDone> {
        let shared = &*self.shared;
        let permit = shared.permits.acquire().await.map_err(|_| engine_gone())?;
        if shared.dead.load(Ordering::Acquire) {
            return Err(engine_gone());
        }
        // The ring thread gives the permit back when the request completes.
        permit.forget();
        let (tx, rx) = oneshot::channel();
        {
            // `dead` is set under this lock (`die`): a request is either
            // queued before the ring thread takes the queue to fail it, or
            // sees the engine dead here. Checked only before the lock, one
            // queued just after `die` took the queue was never answered and
            // its caller waited for ever (review of 2026-12-06).
            let mut q = shared.queue.lock();
            if shared.dead.load(Ordering::Acquire) {
                return Err(engine_gone());
            }
            q.push(Request { op, done: tx });
        }
        if shared.sleeping.swap(false, Ordering::SeqCst) {
            shared.wake();
        }
        rx.await.map_err(|_| engine_gone())
    }
}

impl Drop for UringEngine {
    fn drop(&mut self) {
        self.shared.shutdown.store(true, Ordering::SeqCst);
        self.shared.wake();
        if let Some(t) = self.thread.take() {
            super::wait_beside_the_runtime(|| {
                let _ = t.join();
            });
        }
    }
}

fn setup_ring(queue_depth_max: u32, fd: RawFd) -> io::Result<(IoUring, bool)> {
    let entries = (queue_depth_max + 1).next_power_of_two();
    // Newest flags first; older kernels refuse them with EINVAL.
    let ring = IoUring::builder()
        .setup_single_issuer()
        .setup_coop_taskrun()
        .setup_defer_taskrun()
        .build(entries)
        .or_else(|_| IoUring::builder().setup_coop_taskrun().build(entries))
        .or_else(|_| IoUring::new(entries))?;
    let mut probe = Probe::new();
    ring.submitter().register_probe(&mut probe)?;
    for code in [opcode::Read::CODE, opcode::Write::CODE, opcode::Fsync::CODE] {
        if !probe.is_supported(code) {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                format!("io_uring lacks opcode {code}"),
            ));
        }
    }
    let fixed = ring.submitter().register_files(&[fd]).is_ok();
    Ok((ring, fixed))
}

/// The state only the ring thread touches.
struct RingThread {
    ring: IoUring,
    shared: Arc<Shared>,
    fd: RawFd,
    fixed: bool,
    /// In-flight requests by user_data.
    slots: Vec<Option<Request>>,
    free: Vec<usize>,
    in_flight: usize,
    /// Taken from the shared queue, not yet in the ring.
    incoming: Vec<Request>,
    /// Slots whose op must be (re)submitted.
    to_submit: Vec<usize>,
    /// Target of the pending eventfd read (boxed: the kernel holds its address).
    wake_buf: Box<u64>,
    wake_armed: bool,
}

impl RingThread {
    fn new(ring: IoUring, fixed: bool, shared: Arc<Shared>, depth: usize) -> RingThread {
        let fd = shared.file.as_raw_fd();
        RingThread {
            ring,
            fd,
            fixed,
            shared,
            slots: (0..depth).map(|_| None).collect(),
            free: (0..depth).rev().collect(),
            in_flight: 0,
            incoming: Vec::with_capacity(depth),
            to_submit: Vec::with_capacity(depth),
            wake_buf: Box::new(0),
            wake_armed: false,
        }
    }

    fn run(mut self) {
        loop {
            if !self.wake_armed {
                let entry = opcode::Read::new(
                    types::Fd(self.shared.eventfd.as_raw_fd()),
                    (&mut *self.wake_buf as *mut u64).cast(),
                    8,
                )
                .build()
                .user_data(WAKE_USER_DATA);
                if self.push(&entry) {
                    self.wake_armed = true;
                }
            }
            self.take_incoming();
            self.push_pending();
            if self.shared.shutdown.load(Ordering::SeqCst) && self.in_flight == 0 {
                if self.wake_armed {
                    // its eventfd read is still queued: the kernel may write
                    // into the buffer until the ring is torn down, as in `die`
                    // (8 bytes kept for good per engine)
                    std::mem::forget(std::mem::take(&mut self.wake_buf));
                }
                return;
            }
            if let Err(e) = self.enter() {
                tracing::error!(error = %e, "io_uring_enter failed; the volume's engine stops");
                self.die();
                return;
            }
            self.reap();
        }
    }

    /// Submits what is queued and, when there is nothing to reap, sleeps until a
    /// completion (an I/O or the eventfd) arrives.
    fn enter(&mut self) -> io::Result<()> {
        let have_cqes = !self.ring.completion().is_empty();
        let want = if have_cqes {
            0
        } else {
            self.shared.sleeping.store(true, Ordering::SeqCst);
            let more = !self.shared.queue.lock().is_empty();
            if more || self.shared.shutdown.load(Ordering::SeqCst) && self.in_flight == 0 {
                self.shared.sleeping.store(false, Ordering::SeqCst);
                0
            } else {
                1
            }
        };
        if want == 0 && self.ring.submission().is_empty() && have_cqes {
            return Ok(());
        }
        let r = self.ring.submit_and_wait(want);
        self.shared.sleeping.store(false, Ordering::SeqCst);
        match r {
            Ok(_) => Ok(()),
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::EINTR) | Some(libc::EBUSY) | Some(libc::EAGAIN)
                ) =>
            {
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    fn take_incoming(&mut self) {
        {
            let mut q = self.shared.queue.lock();
            if q.is_empty() {
                return;
            }
            std::mem::swap(&mut *q, &mut self.incoming);
        }
        for req in self.incoming.drain(..) {
            // Permits bound the requests to the number of slots.
            match self.free.pop() {
                Some(idx) => {
                    self.slots[idx] = Some(req);
                    self.in_flight += 1;
                    self.to_submit.push(idx);
                }
                None => {
                    tracing::error!("io_uring engine: more requests than slots");
                    self.shared.permits.add_permits(1);
                }
            }
        }
    }

    /// Pushes an entry, making room by submitting when the SQ is full.
    fn push(&mut self, entry: &squeue::Entry) -> bool {
        for _ in 0..2 {
            // SAFETY: every buffer an entry points at is owned by a slot (or
            // wake_buf) and stays put until its completion is reaped.
            if unsafe { self.ring.submission().push(entry) }.is_ok() {
                return true;
            }
            if self.ring.submit().is_err() {
                return false;
            }
        }
        false
    }

    fn push_pending(&mut self) {
        let mut i = 0;
        while i < self.to_submit.len() {
            let idx = self.to_submit[i];
            let (fd, fixed) = (self.fd, self.fixed);
            let entry = match self.slots[idx].as_mut() {
                Some(req) => entry_for(fd, fixed, &mut req.op).user_data(idx as u64),
                None => {
                    i += 1;
                    continue;
                }
            };
            if !self.push(&entry) {
                // Keep the rest for the next round.
                self.to_submit.drain(..i);
                return;
            }
            i += 1;
        }
        self.to_submit.clear();
    }
}

/// The SQE that continues `op` from where it stands.
fn entry_for(fd: RawFd, fixed: bool, op: &mut Op) -> squeue::Entry {
    match op {
        Op::Read { buf, offset, done } => {
            let len = (buf.len() - *done).min(CHUNK_BYTES_MAX) as u32;
            // SAFETY: done < len of the buffer.
            let ptr = unsafe { buf.as_mut_ptr().add(*done) };
            let at = *offset + *done as u64;
            if fixed {
                opcode::Read::new(types::Fixed(0), ptr, len)
                    .offset(at)
                    .build()
            } else {
                opcode::Read::new(types::Fd(fd), ptr, len)
                    .offset(at)
                    .build()
            }
        }
        Op::Write {
            buf,
            offset,
            done,
            dsync,
        } => {
            let rest = &buf.as_slice()[*done..];
            let len = rest.len().min(CHUNK_BYTES_MAX) as u32;
            let at = *offset + *done as u64;
            let flags = if *dsync { libc::RWF_DSYNC } else { 0 };
            if fixed {
                opcode::Write::new(types::Fixed(0), rest.as_ptr(), len)
                    .offset(at)
                    .rw_flags(flags)
                    .build()
            } else {
                opcode::Write::new(types::Fd(fd), rest.as_ptr(), len)
                    .offset(at)
                    .rw_flags(flags)
                    .build()
            }
        }
        Op::Sync => {
            if fixed {
                opcode::Fsync::new(types::Fixed(0))
                    .flags(types::FsyncFlags::DATASYNC)
                    .build()
            } else {
                opcode::Fsync::new(types::Fd(fd))
                    .flags(types::FsyncFlags::DATASYNC)
                    .build()
            }
        }
    }
}

impl RingThread {
    fn reap(&mut self) {
        let mut cq = self.ring.completion();
        cq.sync();
        for cqe in &mut cq {
            let ud = cqe.user_data();
            if ud == WAKE_USER_DATA {
                self.wake_armed = false;
                continue;
            }
            let idx = ud as usize;
            let Some(req) = self.slots.get_mut(idx).and_then(|s| s.as_mut()) else {
                continue;
            };
            match advance(&mut req.op, cqe.result()) {
                None => self.to_submit.push(idx),
                Some(res) => {
                    if let Some(req) = self.slots[idx].take() {
                        self.free.push(idx);
                        self.in_flight -= 1;
                        self.shared.permits.add_permits(1);
                        let _ = req.done.send(IoDone { op: req.op, res });
                    }
                }
            }
        }
    }

    /// The ring is unusable: refuse new work, fail what is queued, and leak what the
    /// kernel may still write into rather than free it.
    fn die(mut self) {
        let queued: Vec<Request> = {
            let mut q = self.shared.queue.lock();
            self.shared.dead.store(true, Ordering::SeqCst);
            std::mem::take(&mut *q)
        };
        self.shared.permits.close();
        for req in queued.into_iter().chain(self.incoming.drain(..)) {
            let _ = req.done.send(IoDone {
                op: req.op,
                res: Err(IoFail {
                    errno: libc::EIO,
                    offset: 0,
                }),
            });
        }
        for slot in self.slots.iter_mut() {
            if let Some(Request { op, done }) = slot.take() {
                // The kernel may still write into op's buffer: never free it. The
                // dropped sender tells the caller the engine is gone.
                std::mem::forget(op);
                drop(done);
            }
        }
        std::mem::forget(std::mem::take(&mut self.wake_buf));
    }
}
