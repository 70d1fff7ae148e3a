//! [`SimDisk`]: a `block::Volume` that keeps its data on a store volume and answers
//! when its [`SimModel`] says the device would have finished.

use super::timer::scheduler;
use super::{
    HddModel, HddParams, Nominal, SimError, SimModel, SimOp, SimOpKind, SsdModel, SsdParams,
};
use async_trait::async_trait;
use block::{BlockError, BlockResult, Bytes, Extent, Geometry, Volume, VolumeRef};
use parking_lot::{Mutex, RwLock};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};
use tokio::sync::{oneshot, OwnedSemaphorePermit, Semaphore};

/// Where a simulated disk's time comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SimClock {
    /// Real time with microsecond precision: completions are fired by the
    /// process-wide precise scheduler thread.
    #[default]
    Precise,
    /// tokio's clock, and completions fired by tokio timers; `slowdown` tokio
    /// nanoseconds make one model nanosecond. Under a paused test clock
    /// (`start_paused = true`) this is deterministic virtual time; `slowdown: 1000`
    /// turns tokio's 1 ms timer granularity into 1 µs of model time.
    Tokio {
        /// tokio nanoseconds per model nanosecond (>= 1).
        slowdown: u32,
    },
}

/// Which device model a config asks for, with its parameters.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "model", rename_all = "lowercase")]
pub enum SimModelConfig {
    /// A hard disk ([`HddModel`]).
    Hdd(HddParams),
    /// A SATA SSD ([`SsdModel`]).
    Ssd(SsdParams),
}

impl Default for SimModelConfig {
    fn default() -> Self {
        SimModelConfig::Hdd(HddParams::default())
    }
}

impl SimModelConfig {
    /// Builds the model for a device of `capacity_bytes`.
    pub fn build(&self, capacity_bytes: u64) -> Result<Box<dyn SimModel>, SimError> {
        Ok(match self {
            SimModelConfig::Hdd(p) => Box::new(HddModel::new(p.clone(), capacity_bytes)?),
            SimModelConfig::Ssd(p) => Box::new(SsdModel::new(p.clone(), capacity_bytes)?),
        })
    }
}

/// A simulated disk as the config describes it (TOML, e.g.
/// `model = "hdd"`, `rpm = 5400`, `queue_depth_max = 64`); the store is given
/// separately.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SimDiskConfig {
    /// The device model and its parameters.
    #[serde(flatten)]
    pub model: SimModelConfig,
    /// Requests admitted to the device at once; more wait for a slot.
    pub queue_depth_max: u32,
}

impl Default for SimDiskConfig {
    fn default() -> Self {
        SimDiskConfig {
            model: SimModelConfig::default(),
            queue_depth_max: 256,
        }
    }
}

/// Counters of one simulated disk (the RAID F1 work reads per-member write counts).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SimStats {
    /// Reads completed successfully.
    pub reads: u64,
    /// Writes completed successfully.
    pub writes: u64,
    /// Bytes read.
    pub read_bytes: u64,
    /// Bytes written (write-zeroes not included).
    pub written_bytes: u64,
    /// Flushes completed successfully.
    pub flushes: u64,
    /// Discards and write-zeroes completed successfully.
    pub trims: u64,
    /// Requests that returned an error.
    pub errors: u64,
}

#[derive(Default)]
struct Counters {
    reads: AtomicU64,
    writes: AtomicU64,
    read_bytes: AtomicU64,
    written_bytes: AtomicU64,
    flushes: AtomicU64,
    trims: AtomicU64,
    errors: AtomicU64,
}

struct Waiter {
    tx: oneshot::Sender<()>,
    _slot: OwnedSemaphorePermit,
}

struct CoreState {
    model: Box<dyn SimModel>,
    waiters: HashMap<u64, Waiter>,
    next_tag: u64,
    /// Model time of the earliest timer armed and not yet fired.
    armed_ns: Option<u64>,
    done: Vec<u64>,
}

enum TimeBase {
    Precise(Instant),
    Tokio {
        epoch: tokio::time::Instant,
        slowdown: u64,
        handle: tokio::runtime::Handle,
    },
}

/// The model and its waiters, shared with the timer that fires completions.
pub(crate) struct Core {
    state: Mutex<CoreState>,
    time: TimeBase,
    me: Weak<Core>,
}

impl Core {
    fn now_ns(&self) -> u64 {
        match &self.time {
            TimeBase::Precise(epoch) => epoch.elapsed().as_nanos() as u64,
            TimeBase::Tokio {
                epoch, slowdown, ..
            } => (tokio::time::Instant::now() - *epoch).as_nanos() as u64 / slowdown,
        }
    }

    /// Submits `op` and returns the receiver that fires when the model completes it.
    fn submit(&self, op: SimOp, slot: OwnedSemaphorePermit) -> oneshot::Receiver<()> {
        let (tx, rx) = oneshot::channel();
        let mut st = self.state.lock();
        let now = self.now_ns();
        let mut ready = self.collect(&mut st, now);
        let tag = st.next_tag;
        st.next_tag += 1;
        st.model.submit(now, tag, op);
        st.waiters.insert(tag, Waiter { tx, _slot: slot });
        // The new request may complete at once (zero cost).
        ready.extend(self.collect(&mut st, now));
        let arm = Self::rearm(&mut st);
        drop(st);
        Self::wake(ready);
        if let Some(at) = arm {
            self.arm(at);
        }
        rx
    }

    /// Timer callback: runs the model to the present and completes what is done.
    pub(crate) fn fire(&self, at_ns: u64) {
        let mut st = self.state.lock();
        if st.armed_ns == Some(at_ns) {
            st.armed_ns = None;
        }
        let now = self.now_ns().max(at_ns);
        let ready = self.collect(&mut st, now);
        let arm = Self::rearm(&mut st);
        drop(st);
        Self::wake(ready);
        if let Some(at) = arm {
            self.arm(at);
        }
    }

    fn collect(&self, st: &mut CoreState, now: u64) -> Vec<Waiter> {
        let mut done = std::mem::take(&mut st.done);
        done.clear();
        st.model.advance(now, &mut done);
        let ready = done.iter().filter_map(|t| st.waiters.remove(t)).collect();
        st.done = done;
        ready
    }

    /// The model time a new timer must be armed for, if the earliest completion
    /// is earlier than every armed timer.
    fn rearm(st: &mut CoreState) -> Option<u64> {
        let next = st.model.next_event_ns()?;
        if st.armed_ns.is_none_or(|a| next < a) {
            st.armed_ns = Some(next);
            Some(next)
        } else {
            None
        }
    }

    fn wake(ready: Vec<Waiter>) {
        for w in ready {
            // The requester may have gone away (cancelled); its slot is freed here.
            let _ = w.tx.send(());
        }
    }

    fn arm(&self, at_ns: u64) {
        match &self.time {
            TimeBase::Precise(epoch) => {
                scheduler().schedule(*epoch + Duration::from_nanos(at_ns), at_ns, self.me.clone())
            }
            TimeBase::Tokio {
                epoch,
                slowdown,
                handle,
            } => {
                let due = *epoch + Duration::from_nanos(at_ns.saturating_mul(*slowdown));
                let me = self.me.clone();
                handle.spawn(async move {
                    tokio::time::sleep_until(due).await;
                    if let Some(core) = me.upgrade() {
                        core.fire(at_ns);
                    }
                });
            }
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct SlowRange {
    lba: u64,
    end_lba: u64,
    extra_ns: u64,
}

/// A simulated disk: data lives on `store`, timing comes from a [`SimModel`].
///
/// Each request is range-checked, handed to the model with its arrival time, run
/// on the store meanwhile, and answered when both the store and the model are done.
/// At most `queue_depth_max` requests are in the model at once (a bounded queue:
/// more callers wait for a slot). The geometry is the store's.
pub struct SimDisk {
    store: VolumeRef,
    geometry: Geometry,
    core: Arc<Core>,
    slots: Arc<Semaphore>,
    failed: AtomicBool,
    slow: RwLock<Vec<SlowRange>>,
    counters: Counters,
    nominal: OnceLockNominal,
}

type OnceLockNominal = std::sync::OnceLock<Nominal>;

impl SimDisk {
    /// A simulated disk over `store` timed by `model` (whose capacity should be the
    /// store's size), admitting `queue_depth_max` requests at once.
    pub fn new(
        store: VolumeRef,
        model: Box<dyn SimModel>,
        clock: SimClock,
        queue_depth_max: u32,
    ) -> Result<SimDisk, SimError> {
        if queue_depth_max == 0 {
            return Err(SimError::InvalidParam {
                name: "queue_depth_max",
                reason: "must be > 0",
            });
        }
        let time = match clock {
            SimClock::Precise => TimeBase::Precise(Instant::now()),
            SimClock::Tokio { slowdown } => TimeBase::Tokio {
                epoch: tokio::time::Instant::now(),
                slowdown: slowdown.max(1) as u64,
                handle: tokio::runtime::Handle::try_current().map_err(|_| SimError::NoRuntime)?,
            },
        };
        let core = Arc::new_cyclic(|me| Core {
            state: Mutex::new(CoreState {
                model,
                waiters: HashMap::new(),
                next_tag: 0,
                armed_ns: None,
                done: Vec::new(),
            }),
            time,
            me: me.clone(),
        });
        Ok(SimDisk {
            geometry: store.geometry(),
            store,
            core,
            slots: Arc::new(Semaphore::new(queue_depth_max as usize)),
            failed: AtomicBool::new(false),
            slow: RwLock::new(Vec::new()),
            counters: Counters::default(),
            nominal: OnceLockNominal::new(),
        })
    }

    /// A simulated disk as `config` describes it, over `store`, in real time.
    pub fn from_config(store: VolumeRef, config: &SimDiskConfig) -> Result<SimDisk, SimError> {
        Self::from_config_with_clock(store, config, SimClock::Precise)
    }

    /// Like [`SimDisk::from_config`] with an explicit clock (tests use tokio's).
    pub fn from_config_with_clock(
        store: VolumeRef,
        config: &SimDiskConfig,
        clock: SimClock,
    ) -> Result<SimDisk, SimError> {
        let model = config.model.build(store.geometry().size_bytes())?;
        SimDisk::new(store, model, clock, config.queue_depth_max)
    }

    /// A simulated HDD over `store` in real time.
    pub fn hdd(store: VolumeRef, params: HddParams) -> Result<SimDisk, SimError> {
        let cfg = SimDiskConfig {
            model: SimModelConfig::Hdd(params),
            ..SimDiskConfig::default()
        };
        Self::from_config(store, &cfg)
    }

    /// A simulated SSD over `store` in real time.
    pub fn ssd(store: VolumeRef, params: SsdParams) -> Result<SimDisk, SimError> {
        let cfg = SimDiskConfig {
            model: SimModelConfig::Ssd(params),
            ..SimDiskConfig::default()
        };
        Self::from_config(store, &cfg)
    }

    /// The store holding the data.
    pub fn store(&self) -> &VolumeRef {
        &self.store
    }

    /// The model's nominal figures (computed once, in virtual time).
    pub fn nominal(&self) -> Nominal {
        *self.nominal.get_or_init(|| {
            let fresh = self.core.state.lock().model.fresh();
            fresh.nominal()
        })
    }

    /// The model's name ("hdd" or "ssd").
    pub fn model_kind(&self) -> &'static str {
        self.core.state.lock().model.kind()
    }

    /// Counters since creation.
    pub fn stats(&self) -> SimStats {
        let c = &self.counters;
        SimStats {
            reads: c.reads.load(Ordering::Relaxed),
            writes: c.writes.load(Ordering::Relaxed),
            read_bytes: c.read_bytes.load(Ordering::Relaxed),
            written_bytes: c.written_bytes.load(Ordering::Relaxed),
            flushes: c.flushes.load(Ordering::Relaxed),
            trims: c.trims.load(Ordering::Relaxed),
            errors: c.errors.load(Ordering::Relaxed),
        }
    }

    /// Fails the disk: every request from now on returns `BlockError::Io`.
    pub fn fail(&self) {
        self.set_failed(true);
    }

    /// Fails (`true`) or revives (`false`) the disk.
    pub fn set_failed(&self, failed: bool) {
        self.failed.store(failed, Ordering::SeqCst);
    }

    /// Whether the disk is failed.
    pub fn is_failed(&self) -> bool {
        self.failed.load(Ordering::SeqCst)
    }

    /// Makes every request touching `[lba, lba + blocks)` take `extra_ms` longer on
    /// the device (a sector being retried); the actuator or die stays busy.
    pub fn add_slow_range(&self, lba: u64, blocks: u64, extra_ms: f64) {
        self.slow.write().push(SlowRange {
            lba,
            end_lba: lba.saturating_add(blocks),
            extra_ns: (extra_ms.max(0.0) * 1e6) as u64,
        });
    }

    /// Removes every slow range.
    pub fn clear_slow_ranges(&self) {
        self.slow.write().clear();
    }

    fn failed_error() -> BlockError {
        BlockError::Io(std::io::Error::other("simulated disk failed"))
    }

    fn extra_ns(&self, lba: u64, blocks: u64) -> u64 {
        let end = lba.saturating_add(blocks);
        self.slow
            .read()
            .iter()
            .filter(|r| r.lba < end && lba < r.end_lba)
            .map(|r| r.extra_ns)
            .sum()
    }

    fn op(&self, kind: SimOpKind, lba: u64, blocks: u64) -> SimOp {
        let bs = self.geometry.block_size_bytes as u64;
        SimOp {
            kind,
            offset_bytes: lba * bs,
            len_bytes: blocks * bs,
            extra_ns: if blocks > 0 {
                self.extra_ns(lba, blocks)
            } else {
                0
            },
        }
    }

    /// Runs `store_io` while the model serves `op`; answers when both are done.
    async fn timed<T, F>(&self, op: SimOp, store_io: F) -> BlockResult<T>
    where
        F: std::future::Future<Output = BlockResult<T>>,
    {
        let res = self.timed_inner(op, store_io).await;
        if res.is_err() {
            self.counters.errors.fetch_add(1, Ordering::Relaxed);
        }
        res
    }

    async fn timed_inner<T, F>(&self, op: SimOp, store_io: F) -> BlockResult<T>
    where
        F: std::future::Future<Output = BlockResult<T>>,
    {
        if self.is_failed() {
            return Err(Self::failed_error());
        }
        let slot = Arc::clone(&self.slots)
            .acquire_owned()
            .await
            .map_err(|_| BlockError::Unavailable("simulated disk closed".into()))?;
        let done = self.core.submit(op, slot);
        let res = store_io.await;
        // An Err here means the core went away: nothing left to wait for.
        let _ = done.await;
        if self.is_failed() {
            return Err(Self::failed_error());
        }
        res
    }
}

#[async_trait]
impl Volume for SimDisk {
    fn geometry(&self) -> Geometry {
        self.geometry
    }
    fn requests_at_device(&self) -> u64 {
        self.store.requests_at_device()
    }

    async fn read(&self, lba: u64, blocks: u32) -> BlockResult<Bytes> {
        self.geometry.check_range(lba, blocks as u64)?;
        let op = self.op(SimOpKind::Read, lba, blocks as u64);
        let data = self.timed(op, self.store.read(lba, blocks)).await?;
        self.counters.reads.fetch_add(1, Ordering::Relaxed);
        self.counters
            .read_bytes
            .fetch_add(data.len() as u64, Ordering::Relaxed);
        Ok(data)
    }

    async fn write(&self, lba: u64, data: Bytes, fua: bool) -> BlockResult<()> {
        let blocks = self.geometry.blocks_in(data.len())?;
        self.geometry.check_range(lba, blocks)?;
        let len = data.len() as u64;
        let op = self.op(SimOpKind::Write { fua }, lba, blocks);
        self.timed(op, self.store.write(lba, data, fua)).await?;
        self.counters.writes.fetch_add(1, Ordering::Relaxed);
        self.counters
            .written_bytes
            .fetch_add(len, Ordering::Relaxed);
        Ok(())
    }

    async fn flush(&self) -> BlockResult<()> {
        let op = self.op(SimOpKind::Flush, 0, 0);
        self.timed(op, self.store.flush()).await?;
        self.counters.flushes.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    async fn discard(&self, lba: u64, blocks: u64) -> BlockResult<()> {
        self.geometry.check_range(lba, blocks)?;
        let op = self.op(SimOpKind::Trim, lba, blocks);
        self.timed(op, self.store.discard(lba, blocks)).await?;
        self.counters.trims.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    async fn write_zeroes(&self, lba: u64, blocks: u64, may_unmap: bool) -> BlockResult<()> {
        self.geometry.check_range(lba, blocks)?;
        let op = self.op(SimOpKind::Trim, lba, blocks);
        self.timed(op, self.store.write_zeroes(lba, blocks, may_unmap))
            .await?;
        self.counters.trims.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    async fn block_status(&self, lba: u64, blocks: u64) -> BlockResult<Vec<Extent>> {
        if self.is_failed() {
            return Err(Self::failed_error());
        }
        self.store.block_status(lba, blocks).await
    }
}
