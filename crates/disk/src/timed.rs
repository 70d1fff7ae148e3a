//! [`TimedDisk`]: a disk as its pool or cache sees it, timed. Every read and
//! write is counted with its latency (one `Instant` per operation, relaxed
//! atomic adds, like the SCSI layer's per-LU counters); everything else is
//! forwarded unchanged.
//!
//! **A disk that stops answering is failed.** With a command timeout
//! ([`TimedDisk::with_timeout`]), a read or write that has no answer within
//! it (a flush: [`FLUSH_TIMEOUT_FACTOR`] times it; a discard or zeroing: it
//! plus its size at [`ZEROING_BYTES_PER_S`]) fails with a `TimedOut` i/o
//! error, and from then on every request fails at once (a flush or discard
//! still waiting too; a read or write still waiting at its own deadline):
//! the disk is taken as failed until the node opens it again. A pool fails such a member
//! and a cache such a device, as on any other device error, and go on
//! without it (degraded), where before every request that touched the disk
//! waited as long as the disk did, and with it the initiators, whose own
//! command timeouts (30 s on Linux) then escalate to resets and lost
//! sessions. That is what a hardware RAID controller does with a disk past
//! its command timeout.
//!
//! **Unless its pool cannot do without it.** Before it gives itself up,
//! the disk asks its keeper ([`block::Keeper`], set by the pool it serves):
//! a pool member whose loss would fail the pool (its last redundancy), or
//! whose siblings have stopped answering too (a stall they share: a
//! controller resetting, a path failing over), is waited for one more
//! command timeout at a time, up to [`KEEP_TIMEOUT_FACTOR`] - 1 past the
//! request's own limit; the stall's end then costs nothing, where failing
//! the members one after the other would have failed the pool. Past that
//! the disk is taken as dead.
//!
//! Time the process itself did not run (stopped, its virtual machine paused,
//! the machine starving it) is not held against the disk: a stall clock
//! ([`StallClock`]) moves each deadline by the stall within its wait, or a
//! node woken after such a stop would time out every request in flight and
//! fail every disk at once.
//!
//! The request that timed out is not cancelled at the device: the I/O
//! engine keeps its buffer until the kernel answers, so a write may still
//! land later. Nothing relies on what the disk holds after that: no later
//! request is taken, so no later acknowledged write can be put under it, and
//! a pool or cache that failed the disk rebuilds or resilvers whatever it
//! puts back on it.
//!
//! A failed disk is taken back on request ([`TimedDisk::reinstated`], the
//! API's `POST /disks/reopen`), once no request made before waits for it
//! and the device has answered every one it was handed.
//!
//! What it does not do: change any request; take a disk back on its own
//! when it answers again; time a request that
//! blocks the thread that makes it (an inline page-cache write, tried with
//! RWF_NOWAIT, that still waits for a frozen file system).

use async_trait::async_trait;
use block::{
    BlockError, BlockResult, Bytes, Extent, Geometry, Keeper, Provisioning, Unanswered, Volume,
    VolumeRef,
};
use std::future::Future;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::Poll;
use std::time::{Duration, Instant};

/// A request a keeper holds on to (see [`block::Keeper`]) is given up after
/// this many command timeouts less one past its own limit (a read's: this
/// many in all) all the same, the disk with it: a stall that long is taken
/// as a disk that died, and the initiators get an answer.
pub const KEEP_TIMEOUT_FACTOR: u32 = 10;

/// A disk's command timeout when its configuration names none: below the
/// 30 s after which Linux initiators abort a command and begin resetting,
/// so a pool or cache gives up a hung disk and answers before they do.
pub const IO_TIMEOUT_DEFAULT: Duration = Duration::from_secs(20);

/// A flush may take this many command timeouts: it writes back whatever the
/// device's (or a buffered file's page) cache holds, which on an HDD can
/// take minutes. A disk that stopped answering is usually found by a read
/// or write first, which ends the flush with it.
pub const FLUSH_TIMEOUT_FACTOR: u32 = 10;

/// A discard or zeroing may take the command timeout plus its size at this
/// rate (10 MB/s: an SMR disk zeroing, a thin file punching holes).
pub const ZEROING_BYTES_PER_S: u64 = 10_000_000;

/// A snapshot of a disk's read and write counters since it was opened.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DiskTiming {
    /// Reads finished (good or not).
    pub reads: u64,
    /// Writes finished (good or not).
    pub writes: u64,
    /// Reads that failed.
    pub read_errors: u64,
    /// Writes that failed.
    pub write_errors: u64,
    /// Sum of the reads' latencies, in nanoseconds (a page-cache hit takes
    /// less than a microsecond).
    pub read_latency_sum_ns: u64,
    /// Sum of the writes' latencies, in nanoseconds.
    pub write_latency_sum_ns: u64,
    /// Requests that had no answer within the command timeout (counted in
    /// the errors as well; a flush's in none of the others).
    pub timeouts: u64,
    /// Times a request past its command timeout was waited for one more
    /// timeout because the disk's keeper (its pool) could not do without it.
    pub held: u64,
    /// Requests waiting past their command timeout now (a stall goes on).
    pub holding: u64,
    /// Requests the device was handed and has not answered, their callers
    /// still waiting or gone (past a timeout, a request is dropped here but
    /// stays at the device): see [`block::Volume::requests_at_device`].
    pub in_flight: u64,
    /// Why the disk is taken as failed (it stopped answering), if it is.
    pub failed: Option<String>,
}

impl DiskTiming {
    /// Mean read latency in microseconds (0 with no read).
    pub fn read_latency_us(&self) -> f64 {
        mean(self.read_latency_sum_ns, self.reads) / 1000.0
    }

    /// Mean write latency in microseconds (0 with no write).
    pub fn write_latency_us(&self) -> f64 {
        mean(self.write_latency_sum_ns, self.writes) / 1000.0
    }
}

fn mean(sum: u64, n: u64) -> f64 {
    if n == 0 {
        0.0
    } else {
        sum as f64 / n as f64
    }
}

#[derive(Default)]
struct Dir {
    ops: AtomicU64,
    errors: AtomicU64,
    latency_sum_ns: AtomicU64,
}

impl Dir {
    fn finish(&self, started: Instant, failed: bool) {
        let ns = started.elapsed().as_nanos().min(u64::MAX as u128) as u64;
        self.ops.fetch_add(1, Ordering::Relaxed);
        if failed {
            self.errors.fetch_add(1, Ordering::Relaxed);
        }
        self.latency_sum_ns.fetch_add(ns, Ordering::Relaxed);
    }
}

/// How long this process did not run: a thread that wakes every [`TICK`]
/// and finds more than [`STALL_GAP`] gone since its last tick counts the
/// excess as stalled (the process was stopped by SIGSTOP or a debugger, its
/// virtual machine paused, the machine starved it). A command timeout that
/// runs out forgives the stall time that fell within its wait: a node that
/// wakes after a stop longer than the timeout would otherwise time out every
/// request in flight, the disks' answers not yet read, and fail every disk,
/// a whole pool at once (seen on a node stopped for 3 s with a 1 s timeout:
/// a member failed). A tick that is late right now counts as well, so that
/// the timers that fire first on waking see the stall before the thread
/// has run.
struct StallClock {
    origin: Instant,
    /// When the thread last ticked, in nanoseconds since `origin`.
    last_tick_ns: AtomicU64,
    /// The stall time counted by the ticks so far, in nanoseconds.
    stalled_ns: AtomicU64,
}

/// How often the stall clock's thread wakes.
const TICK: Duration = Duration::from_millis(50);

/// A tick later than this after the previous one means the process stalled.
const STALL_GAP: Duration = Duration::from_millis(250);

impl StallClock {
    /// A clock nothing ticks (a test moves it).
    fn unticked() -> StallClock {
        StallClock {
            origin: Instant::now(),
            last_tick_ns: AtomicU64::new(0),
            stalled_ns: AtomicU64::new(0),
        }
    }

    /// The process's clock, its thread started by the first call.
    fn get() -> &'static StallClock {
        static CLOCK: OnceLock<StallClock> = OnceLock::new();
        CLOCK.get_or_init(|| {
            std::thread::Builder::new()
                .name("freesan-stall-clock".into())
                .spawn(|| {
                    let c = StallClock::get();
                    loop {
                        std::thread::sleep(TICK);
                        c.tick();
                    }
                })
                .expect("spawn the stall clock's thread");
            StallClock::unticked()
        })
    }

    fn now_ns(&self) -> u64 {
        self.origin.elapsed().as_nanos().min(u64::MAX as u128) as u64
    }

    /// What a gap of `gap_ns` since the last tick counts as stalled.
    fn excess(gap_ns: u64) -> u64 {
        if gap_ns > STALL_GAP.as_nanos() as u64 {
            gap_ns - TICK.as_nanos() as u64
        } else {
            0
        }
    }

    fn tick(&self) {
        let now = self.now_ns();
        let last = self.last_tick_ns.load(Ordering::Acquire);
        // the stall first, then the tick (see `stalled`)
        self.stalled_ns
            .fetch_add(Self::excess(now.saturating_sub(last)), Ordering::AcqRel);
        self.last_tick_ns.store(now, Ordering::Release);
    }

    /// The stall time the ticks counted so far.
    fn counted(&self) -> Duration {
        Duration::from_nanos(self.stalled_ns.load(Ordering::Acquire))
    }

    /// The stall time so far, a tick late right now included: never less
    /// than [`StallClock::counted`] just before or after (the tick time is
    /// read first, so a tick in between is counted twice, never not at all).
    fn stalled(&self) -> Duration {
        let last = self.last_tick_ns.load(Ordering::Acquire);
        let counted = self.stalled_ns.load(Ordering::Acquire);
        let overdue = Self::excess(self.now_ns().saturating_sub(last));
        Duration::from_nanos(counted + overdue)
    }
}

/// Counts a request waiting past its timeout while it lives.
struct Holding<'a>(&'a AtomicU64);

impl<'a> Holding<'a> {
    fn new(n: &'a AtomicU64) -> Self {
        n.fetch_add(1, Ordering::Relaxed);
        Holding(n)
    }
}

impl Drop for Holding<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Counts a timed request while it lives (its caller waiting for it). Made
/// before the request looks at the disk's state, with a fence that orders
/// the two as [`TimedDisk::reinstated`] orders its look at the state and
/// then the count: so a request either sees the disk failed and is refused,
/// or is seen by the reinstatement, which then waits for it.
struct Live<'a>(&'a AtomicU64);

impl<'a> Live<'a> {
    fn new(n: &'a AtomicU64) -> Self {
        n.fetch_add(1, Ordering::SeqCst);
        std::sync::atomic::fence(Ordering::SeqCst);
        Live(n)
    }
}

impl Drop for Live<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A disk whose reads and writes are timed (see the module doc).
pub struct TimedDisk {
    inner: VolumeRef,
    read: Dir,
    write: Dir,
    /// The command timeout, if any.
    limit: Option<Duration>,
    /// The name log lines give the disk.
    name: String,
    timeouts: AtomicU64,
    held: AtomicU64,
    /// Requests waiting past their timeout now.
    holding: AtomicU64,
    /// When the keeper last said wait (one request asks at a time).
    asked: tokio::sync::Mutex<Option<tokio::time::Instant>>,
    /// Who to ask before the disk gives itself up (its pool).
    keeper: parking_lot::Mutex<Option<Arc<dyn Keeper>>>,
    /// Set by the first request that timed out: why the disk is failed.
    failed: OnceLock<String>,
    /// Woken when the disk is failed: the requests still waiting end then.
    gone: tokio::sync::Notify,
    /// The process's stall clock (a test's own).
    stalls: Option<&'static StallClock>,
    /// Requests inside [`TimedDisk::bounded`] now ([`Live`]).
    live: AtomicU64,
}

impl TimedDisk {
    /// Times `inner`, with no command timeout.
    pub fn new(inner: VolumeRef) -> TimedDisk {
        TimedDisk {
            inner,
            read: Dir::default(),
            write: Dir::default(),
            limit: None,
            name: String::new(),
            timeouts: AtomicU64::new(0),
            held: AtomicU64::new(0),
            holding: AtomicU64::new(0),
            asked: tokio::sync::Mutex::new(None),
            keeper: parking_lot::Mutex::new(None),
            failed: OnceLock::new(),
            gone: tokio::sync::Notify::new(),
            stalls: None,
            live: AtomicU64::new(0),
        }
    }

    /// Times `inner` (disk `name`) and fails it when a request has no answer
    /// within `limit` (see the module doc).
    pub fn with_timeout(inner: VolumeRef, name: &str, limit: Duration) -> TimedDisk {
        TimedDisk {
            limit: Some(limit),
            name: name.to_string(),
            ..TimedDisk::new(inner)
        }
    }

    /// The error of a request refused because the disk is failed.
    fn refused(&self, why: &str) -> BlockError {
        BlockError::Io(io::Error::other(format!(
            "disk {} is taken as failed: {why}",
            self.name
        )))
    }

    /// The time limit of a discard or zeroing of `blocks`: the command
    /// timeout plus the time the blocks take at [`ZEROING_BYTES_PER_S`].
    fn sized_limit(&self, blocks: u64) -> Option<Duration> {
        let bytes = blocks.saturating_mul(self.inner.geometry().block_size_bytes.into());
        self.limit
            .map(|l| l + Duration::from_secs(bytes / ZEROING_BYTES_PER_S))
    }

    /// Runs `io` (a `what` at `lba`, of kind `unanswered` for the keeper)
    /// within `limit` (`None`: no timeout);
    /// refuses it at once on a failed disk, and ends it when another request
    /// fails the disk meanwhile.
    async fn bounded<T>(
        &self,
        (what, unanswered): (&str, Unanswered),
        lba: u64,
        limit: Option<Duration>,
        io: impl Future<Output = BlockResult<T>>,
    ) -> BlockResult<T> {
        let Some(limit) = limit else {
            // (a disk without a timeout is never failed)
            return io.await;
        };
        // (counted before the look at the state: see Live)
        let _live = Live::new(&self.live);
        if let Some(why) = self.failed.get() {
            return Err(self.refused(why));
        }
        // a request answered at once (a page-cache hit done inline) needs no
        // timer: polled once first, timed only if it waits
        let mut io = std::pin::pin!(io);
        if let Poll::Ready(r) = std::future::poll_fn(|cx| Poll::Ready(io.as_mut().poll(cx))).await {
            return r;
        }
        // a request allowed longer than the timeout (a flush, a discard) is
        // told when another one fails the disk (registered before the last
        // look, so no failure falls between the two); the others end at
        // their own deadline, within a timeout of the failure, without
        // taking the disk's shared waiter list's lock twice each
        let long = self.limit.is_some_and(|l| limit > l);
        let gone = self.gone.notified();
        let mut gone = std::pin::pin!(gone);
        if long {
            gone.as_mut().enable();
            if let Some(why) = self.failed.get() {
                return Err(self.refused(why));
            }
        }
        // the time this process did not run (stopped, paused, starved) is
        // not the disk's: the deadline moves by what of it fell in the wait
        let clock = self.stalls.unwrap_or_else(StallClock::get);
        let stalled_before = clock.counted();
        let start = tokio::time::Instant::now();
        let mut deadline = start + limit;
        // command timeouts waited for past the limit so far (the keeper's
        // time inside the next)
        let base = self.limit.unwrap_or(limit);
        let mut held = 0;
        let mut holding = None;
        loop {
            tokio::select! {
                biased;
                r = io.as_mut() => return r,
                // (registered for every request once it is held)
                () = gone.as_mut(), if long || held > 0 => {
                    let why = self.failed.get().map_or("", String::as_str);
                    return Err(self.refused(why));
                }
                () = tokio::time::sleep_until(deadline) => {}
            }
            if let Some(why) = self.failed.get() {
                // failed meanwhile by another request
                return Err(self.refused(why));
            }
            let forgiven = clock.stalled().saturating_sub(stalled_before);
            let moved = start + limit + base * held + forgiven;
            if moved > tokio::time::Instant::now() {
                deadline = moved;
                continue;
            }
            // out of time: the keeper (the pool) may not be able to do
            // without the disk; the disk's own answer ends the question. Up
            // to KEEP_TIMEOUT_FACTOR - 1 more command timeouts, whatever
            // the request's own limit (a flush's is longer)
            if held + 1 >= KEEP_TIMEOUT_FACTOR {
                break;
            }
            // (the slow path: every request now ends with the disk's failure)
            gone.as_mut().enable();
            if let Some(why) = self.failed.get() {
                return Err(self.refused(why));
            }
            let give_up = tokio::select! {
                biased;
                r = io.as_mut() => return r,
                () = gone.as_mut() => {
                    let why = self.failed.get().map_or("", String::as_str);
                    return Err(self.refused(why));
                }
                v = self.ask_keeper(base, unanswered) => v,
            };
            if let Some(why) = self.failed.get() {
                return Err(self.refused(why));
            }
            if give_up {
                break;
            }
            held += 1;
            self.held.fetch_add(1, Ordering::Relaxed);
            holding.get_or_insert_with(|| Holding::new(&self.holding));
            deadline = start + limit + base * held + forgiven;
        }
        self.timeouts.fetch_add(1, Ordering::Relaxed);
        let why = format!(
            "a {what} at lba {lba} had no answer in {:.1} s",
            (limit + base * held).as_secs_f64()
        );
        if self.failed.set(why.clone()).is_ok() {
            tracing::error!(disk = %self.name, "disk stopped answering ({why}): \
                taken as failed, every further request to it fails until the \
                node opens it again");
            self.gone.notify_waiters();
        }
        Err(BlockError::Io(io::Error::new(
            io::ErrorKind::TimedOut,
            format!("disk {}: {why}", self.name),
        )))
    }

    /// Whether the disk may be given up now (see [`block::Keeper`]): true
    /// without a keeper. One request asks at a time; a "wait" answer stands
    /// for half a timeout for every request that runs out meanwhile, so a
    /// deep queue on a stalled disk asks (and probes its siblings) once a
    /// round, not once a request.
    async fn ask_keeper(&self, limit: Duration, unanswered: Unanswered) -> bool {
        let Some(keeper) = self.keeper.lock().clone() else {
            return true;
        };
        let mut last_wait = self.asked.lock().await;
        if self.failed.get().is_some() {
            return true;
        }
        if last_wait.is_some_and(|t| t.elapsed() < limit / 2) {
            return false;
        }
        let give_up = keeper.may_give_up(limit, unanswered).await;
        if !give_up {
            *last_wait = Some(tokio::time::Instant::now());
            tracing::warn!(disk = %self.name, "a request has had no answer within the \
                command timeout ({:.1} s): waited for, as its pool or cache cannot do \
                without the disk now", limit.as_secs_f64());
        }
        give_up
    }

    /// This disk, failed when it stopped answering, taken back now that it
    /// answers again: a new `TimedDisk` over the same device, with the same
    /// name, timeout and counters (`timeouts`, `held` and the latencies go
    /// on), not failed and with no keeper (its next role gives it one).
    /// Refused while the disk has not failed; while a request made before
    /// still waits for it; and while the device has not answered every
    /// request it was handed, their callers gone or not
    /// ([`block::Volume::requests_at_device`]): a write among them could
    /// land over what is written from now on. This disk stays failed; the
    /// caller puts the new one in its place.
    pub fn reinstated(&self) -> Result<TimedDisk, String> {
        if self.failed.get().is_none() {
            return Err(format!("disk {} has not failed", self.name));
        }
        // the state first, then the requests still waiting (see Live), then
        // those at the device: a request that stopped waiting was either
        // handed to the device (counted there until it answers) or not
        // (never will be)
        std::sync::atomic::fence(Ordering::SeqCst);
        let n = self.live.load(Ordering::SeqCst) + self.inner.requests_at_device();
        if n > 0 {
            return Err(format!(
                "disk {}: {n} request(s) sent to it before it failed have no answer \
                 from the device yet (a write among them could still land); try \
                 again once the device answers them",
                self.name
            ));
        }
        let copy = |c: &AtomicU64| AtomicU64::new(c.load(Ordering::Relaxed));
        let dir = |d: &Dir| Dir {
            ops: copy(&d.ops),
            errors: copy(&d.errors),
            latency_sum_ns: copy(&d.latency_sum_ns),
        };
        Ok(TimedDisk {
            read: dir(&self.read),
            write: dir(&self.write),
            limit: self.limit,
            name: self.name.clone(),
            timeouts: copy(&self.timeouts),
            held: copy(&self.held),
            stalls: self.stalls,
            ..TimedDisk::new(self.inner.clone())
        })
    }

    /// The counters so far.
    pub fn timing(&self) -> DiskTiming {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        DiskTiming {
            reads: get(&self.read.ops),
            writes: get(&self.write.ops),
            read_errors: get(&self.read.errors),
            write_errors: get(&self.write.errors),
            read_latency_sum_ns: get(&self.read.latency_sum_ns),
            write_latency_sum_ns: get(&self.write.latency_sum_ns),
            timeouts: get(&self.timeouts),
            held: get(&self.held),
            holding: get(&self.holding),
            in_flight: self.inner.requests_at_device(),
            failed: self.failed.get().cloned(),
        }
    }
}

#[async_trait]
impl Volume for TimedDisk {
    fn geometry(&self) -> Geometry {
        self.inner.geometry()
    }
    async fn read(&self, lba: u64, blocks: u32) -> BlockResult<Bytes> {
        let t = Instant::now();
        let r = self
            .bounded(
                ("read", Unanswered::Read),
                lba,
                self.limit,
                self.inner.read(lba, blocks),
            )
            .await;
        self.read.finish(t, r.is_err());
        r
    }
    async fn write(&self, lba: u64, data: Bytes, fua: bool) -> BlockResult<()> {
        let t = Instant::now();
        let r = self
            .bounded(
                ("write", Unanswered::Write),
                lba,
                self.limit,
                self.inner.write(lba, data, fua),
            )
            .await;
        self.write.finish(t, r.is_err());
        r
    }
    async fn flush(&self) -> BlockResult<()> {
        let limit = self.limit.map(|l| l * FLUSH_TIMEOUT_FACTOR);
        self.bounded(("flush", Unanswered::Flush), 0, limit, self.inner.flush())
            .await
    }
    async fn discard(&self, lba: u64, blocks: u64) -> BlockResult<()> {
        let limit = self.sized_limit(blocks);
        self.bounded(
            ("discard", Unanswered::Write),
            lba,
            limit,
            self.inner.discard(lba, blocks),
        )
        .await
    }
    async fn write_zeroes(&self, lba: u64, blocks: u64, may_unmap: bool) -> BlockResult<()> {
        let io = self.inner.write_zeroes(lba, blocks, may_unmap);
        self.bounded(
            ("zeroing", Unanswered::Write),
            lba,
            self.sized_limit(blocks),
            io,
        )
        .await
    }
    async fn compare_and_write(
        &self,
        lba: u64,
        compare: Bytes,
        data: Bytes,
        fua: bool,
    ) -> BlockResult<Option<usize>> {
        let io = self.inner.compare_and_write(lba, compare, data, fua);
        self.bounded(
            ("compare and write", Unanswered::Write),
            lba,
            self.limit,
            io,
        )
        .await
    }
    async fn block_status(&self, lba: u64, blocks: u64) -> BlockResult<Vec<Extent>> {
        let io = self.inner.block_status(lba, blocks);
        self.bounded(("block status", Unanswered::Read), lba, self.limit, io)
            .await
    }
    fn provisioning(&self) -> Option<Provisioning> {
        self.inner.provisioning()
    }
    async fn grow(&self, block_count: u64) -> BlockResult<()> {
        self.inner.grow(block_count).await
    }
    async fn shrink(&self, block_count: u64) -> BlockResult<()> {
        self.inner.shrink(block_count).await
    }
    fn requests_at_device(&self) -> u64 {
        self.inner.requests_at_device()
    }
    fn keep_with(&self, keeper: Arc<dyn Keeper>) {
        *self.keeper.lock() = Some(keeper);
        // a "wait" of the keeper before stands no more
        if let Ok(mut asked) = self.asked.try_lock() {
            *asked = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[tokio::test]
    async fn counts_reads_and_writes_with_their_errors() {
        let mem = Arc::new(block::MemVolume::new_thick(512, 8));
        let d = TimedDisk::new(mem);
        d.write(0, Bytes::from(vec![1u8; 512]), false)
            .await
            .unwrap();
        d.read(0, 1).await.unwrap();
        assert!(d.read(100, 1).await.is_err());
        let t = d.timing();
        assert_eq!((t.reads, t.read_errors), (2, 1));
        assert_eq!((t.writes, t.write_errors), (1, 0));
        assert_eq!(DiskTiming::default().read_latency_us(), 0.0);
    }

    /// `d` with a stall clock of its own that nothing moves: a late tick of
    /// the process's clock on a loaded machine must not move a deadline here.
    fn unticked(d: TimedDisk) -> TimedDisk {
        TimedDisk {
            stalls: Some(Box::leak(Box::new(StallClock::unticked()))),
            ..d
        }
    }

    /// A disk that takes every request and answers none once its plan says
    /// `hung`, and the memory under it.
    struct Hangs {
        mem: Arc<block::MemVolume>,
        fault: Arc<block::FaultVolume>,
    }

    impl Hangs {
        fn set(&self, hung: bool) {
            self.fault.set_hung(hung);
        }
    }

    fn hangs() -> Hangs {
        let mem = Arc::new(block::MemVolume::new_thick(512, 8));
        let fault = Arc::new(block::FaultVolume::new(mem.clone()));
        Hangs { mem, fault }
    }

    /// A keeper that cannot do without its disk: asked at every timeout,
    /// it says wait.
    #[derive(Default)]
    struct Cannot {
        asked: AtomicU64,
        /// The kinds of request it was asked about, in order.
        kinds: parking_lot::Mutex<Vec<Unanswered>>,
    }

    #[async_trait]
    impl Keeper for Cannot {
        async fn may_give_up(&self, _limit: Duration, unanswered: Unanswered) -> bool {
            self.asked.fetch_add(1, Ordering::Relaxed);
            self.kinds.lock().push(unanswered);
            false
        }
    }

    /// A disk its keeper (its pool) cannot do without is waited for past
    /// the timeout, one timeout at a time: answering again, it is not
    /// failed; silent for good, it is given up after
    /// [`KEEP_TIMEOUT_FACTOR`] timeouts all the same.
    #[tokio::test(start_paused = true)]
    async fn a_disk_its_keeper_cannot_do_without_is_waited_for_up_to_the_keep_limit() {
        let limit = Duration::from_secs(20);
        let h = hangs();
        let d = unticked(TimedDisk::with_timeout(h.fault.clone(), "d0", limit));
        let keeper = Arc::new(Cannot::default());
        d.keep_with(keeper.clone());
        h.set(true);
        let answers_again = async {
            tokio::time::sleep(limit * 7 / 2).await;
            h.set(false);
        };
        let (r, ()) = tokio::join!(d.read(1, 1), answers_again);
        r.expect("the read answered after three and a half timeouts");
        let t = d.timing();
        assert_eq!((t.timeouts, t.held, t.failed), (0, 3, None));
        assert_eq!(keeper.asked.load(Ordering::Relaxed), 3);
        assert_eq!(*keeper.kinds.lock(), [Unanswered::Read; 3]);
        d.write(1, Bytes::from(vec![3u8; 512]), false)
            .await
            .unwrap();

        h.set(true);
        let at = tokio::time::Instant::now();
        let e = d.write(2, Bytes::from(vec![4u8; 512]), false).await;
        assert_eq!(at.elapsed(), limit * KEEP_TIMEOUT_FACTOR, "{e:?}");
        let t = d.timing();
        assert_eq!(
            (t.timeouts, t.held),
            (1, 3 + u64::from(KEEP_TIMEOUT_FACTOR) - 1)
        );
        assert!(t.failed.unwrap().contains("no answer in 200.0 s"));
        // the keeper is told a write went unanswered, to ask its siblings
        // a write in turn
        assert!(keeper.kinds.lock()[3..]
            .iter()
            .all(|k| *k == Unanswered::Write));
        h.set(false);
        assert!(d.read(1, 1).await.is_err(), "failed for good");
    }

    /// A request with no answer fails at the command timeout and fails the
    /// disk: every later request is refused at once, whatever it is.
    #[tokio::test(start_paused = true)]
    async fn a_disk_that_stops_answering_fails_at_the_timeout_and_stays_failed() {
        let limit = Duration::from_secs(20);
        let h = hangs();
        let d = unticked(TimedDisk::with_timeout(h.fault.clone(), "d0", limit));
        // an answering disk is not touched by the timeout
        d.write(1, Bytes::from(vec![7u8; 512]), true).await.unwrap();
        assert_eq!(d.read(1, 1).await.unwrap()[0], 7);
        d.flush().await.unwrap();
        assert_eq!(d.timing().timeouts, 0);

        h.set(true);
        let t = tokio::time::Instant::now();
        let e = d.read(1, 1).await.unwrap_err();
        assert_eq!(t.elapsed(), limit, "the read failed at the timeout");
        let BlockError::Io(io) = &e else {
            panic!("{e}")
        };
        assert_eq!(io.kind(), io::ErrorKind::TimedOut, "{e}");
        let timing = d.timing();
        assert_eq!((timing.timeouts, timing.read_errors), (1, 1));
        assert!(timing.failed.unwrap().contains("read at lba 1"));

        // failed: refused at once, even once the disk answers again
        h.set(false);
        let t = tokio::time::Instant::now();
        for e in [
            d.write(2, Bytes::from(vec![1u8; 512]), false)
                .await
                .unwrap_err(),
            d.read(2, 1).await.unwrap_err(),
            d.flush().await.unwrap_err(),
            d.discard(0, 1).await.unwrap_err(),
        ] {
            assert!(e.to_string().contains("taken as failed"), "{e}");
        }
        assert_eq!(t.elapsed(), Duration::ZERO);
        assert_eq!(h.mem.read(2, 1).await.unwrap()[0], 0, "nothing was written");
        assert_eq!(d.timing().timeouts, 1);
    }

    /// A device that says how many requests it holds (as a file's I/O
    /// engine does), over a hanging one.
    struct Holds {
        inner: Arc<block::FaultVolume>,
        at_device: AtomicU64,
    }

    #[async_trait]
    impl Volume for Holds {
        fn geometry(&self) -> Geometry {
            self.inner.geometry()
        }
        fn requests_at_device(&self) -> u64 {
            self.at_device.load(Ordering::SeqCst)
        }
        async fn read(&self, lba: u64, blocks: u32) -> BlockResult<Bytes> {
            self.inner.read(lba, blocks).await
        }
        async fn write(&self, lba: u64, data: Bytes, fua: bool) -> BlockResult<()> {
            self.inner.write(lba, data, fua).await
        }
        async fn flush(&self) -> BlockResult<()> {
            self.inner.flush().await
        }
        async fn discard(&self, lba: u64, blocks: u64) -> BlockResult<()> {
            self.inner.discard(lba, blocks).await
        }
    }

    /// A disk failed at its timeout is taken back once it answers again,
    /// and not before: while a request made before still waits, or the
    /// device still holds one it was handed (a write that could land over
    /// what the disk takes from then on).
    #[tokio::test(start_paused = true)]
    async fn a_failed_disk_is_taken_back_only_once_the_device_answered_everything() {
        let limit = Duration::from_secs(20);
        let h = hangs();
        let dev = Arc::new(Holds {
            inner: h.fault.clone(),
            at_device: AtomicU64::new(0),
        });
        let d = Arc::new(unticked(TimedDisk::with_timeout(dev.clone(), "d0", limit)));
        let e = d.reinstated().err().unwrap();
        assert!(e.contains("has not failed"), "{e}");
        d.write(1, Bytes::from(vec![5u8; 512]), false)
            .await
            .unwrap();
        h.set(true);
        // a flush waits (its limit is longer) while a write fails the disk
        let flush = tokio::spawn({
            let d = d.clone();
            async move { d.flush().await }
        });
        tokio::task::yield_now().await;
        assert!(d
            .write(2, Bytes::from(vec![6u8; 512]), false)
            .await
            .is_err());
        // the flush still waits (its caller has not had its answer)
        let e = d.reinstated().err().unwrap();
        assert!(e.contains("request(s)"), "{e}");
        // the failure ends it
        assert!(flush.await.unwrap().is_err());
        // the device still holds the write (as an engine does once it was
        // handed one, its caller gone)
        dev.at_device.store(1, Ordering::SeqCst);
        let e = d.reinstated().err().unwrap();
        assert!(e.contains("1 request(s)"), "{e}");
        assert_eq!(d.timing().in_flight, 1);
        dev.at_device.store(0, Ordering::SeqCst);
        h.set(false);
        let back = d.reinstated().expect("taken back");
        let t = back.timing();
        assert_eq!((t.timeouts, t.writes, &t.failed), (1, 2, &None), "{t:?}");
        back.write(2, Bytes::from(vec![7u8; 512]), false)
            .await
            .unwrap();
        assert_eq!(back.read(2, 1).await.unwrap()[0], 7);
        assert!(d.read(2, 1).await.is_err(), "the failed one stays failed");
        // and it times out again as before
        h.set(true);
        assert!(back.read(2, 1).await.is_err());
        assert_eq!(back.timing().timeouts, 2);
    }

    /// A flush may take [`FLUSH_TIMEOUT_FACTOR`] command timeouts; a disk
    /// without a timeout waits as long as the disk does.
    #[tokio::test(start_paused = true)]
    async fn a_flush_gets_its_factor_and_an_untimed_disk_waits() {
        let limit = Duration::from_secs(20);
        let h = hangs();
        h.set(true);
        let d = unticked(TimedDisk::with_timeout(h.fault.clone(), "d0", limit));
        let t = tokio::time::Instant::now();
        let e = d.flush().await.unwrap_err();
        assert_eq!(t.elapsed(), limit * FLUSH_TIMEOUT_FACTOR, "{e}");
        assert!(e.to_string().contains("flush"), "{e}");

        let untimed = TimedDisk::new(h.fault.clone());
        let waited = tokio::time::timeout(Duration::from_secs(3600), untimed.read(0, 1)).await;
        assert!(waited.is_err(), "an untimed disk gave up");
        assert_eq!(untimed.timing().timeouts, 0);
    }

    /// Requests still waiting when another one fails the disk end with it:
    /// a flush (allowed ten timeouts) and a discard (allowed the timeout and
    /// its size's time) waiting on a hung disk fail when a read times out; a
    /// write allowed the timeout alone fails at its own deadline.
    #[tokio::test(start_paused = true)]
    async fn requests_waiting_when_the_disk_fails_end_with_it() {
        let limit = Duration::from_secs(20);
        let h = hangs();
        h.set(true);
        let d = unticked(TimedDisk::with_timeout(h.fault.clone(), "d0", limit));
        let t = tokio::time::Instant::now();
        let flushed = async {
            let r = d.flush().await;
            (r, t.elapsed())
        };
        let discarded = async {
            // 512 GiB: allowed the timeout and 53 s more
            let r = d.discard(0, 1 << 30).await;
            (r, t.elapsed())
        };
        let read = async {
            // a little later than the others
            tokio::time::sleep(Duration::from_secs(1)).await;
            d.read(1, 1).await
        };
        let second = async {
            // sent before the first read fails the disk: it ends at its own
            // deadline, refused, not counted as a timeout of its own
            tokio::time::sleep(Duration::from_secs(5)).await;
            let r = d.write(2, Bytes::from(vec![1u8; 512]), false).await;
            (r, t.elapsed())
        };
        let ((f, tf), (x, tx), r, (w, tw)) = tokio::join!(flushed, discarded, read, second);
        assert!(r.is_err());
        let e = w.unwrap_err();
        assert_eq!(tw, limit + Duration::from_secs(5), "{e}");
        assert!(e.to_string().contains("taken as failed"), "{e}");
        for (e, took) in [(f.unwrap_err(), tf), (x.unwrap_err(), tx)] {
            assert_eq!(took, limit + Duration::from_secs(1), "{e}");
            assert!(e.to_string().contains("taken as failed"), "{e}");
        }
        assert_eq!(d.timing().timeouts, 1);
    }

    /// A request answered after one and a half timeouts, while the process
    /// did not run for a whole timeout of its wait (the stall clock says so),
    /// is taken: the disk had half a timeout of the process's time. Without
    /// the stall, the same request fails the disk at the timeout.
    #[tokio::test(start_paused = true)]
    async fn the_time_the_process_did_not_run_is_not_held_against_the_disk() {
        let limit = Duration::from_secs(20);
        for stalled in [true, false] {
            let clock: &'static StallClock = Box::leak(Box::new(StallClock::unticked()));
            let delay = limit * 3 / 2;
            let mem = Arc::new(block::MemVolume::new_thick(512, 8));
            let slow = Arc::new(block::DelayVolume::new(mem, delay, delay));
            let d = TimedDisk {
                stalls: Some(clock),
                ..TimedDisk::with_timeout(slow, "d0", limit)
            };
            let stall = async {
                if stalled {
                    tokio::time::sleep(limit / 2).await;
                    clock
                        .stalled_ns
                        .fetch_add(limit.as_nanos() as u64, Ordering::AcqRel);
                }
            };
            let t = tokio::time::Instant::now();
            let (r, ()) = tokio::join!(d.read(1, 1), stall);
            if stalled {
                r.unwrap();
                assert_eq!(t.elapsed(), limit * 3 / 2);
                assert_eq!(d.timing().timeouts, 0);
            } else {
                assert!(r.is_err());
                assert_eq!(t.elapsed(), limit);
                assert!(d.timing().failed.is_some());
            }
        }
    }
}
