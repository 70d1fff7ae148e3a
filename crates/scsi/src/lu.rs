//! One logical unit: its volume, identity, mode pages, unit attentions, reservations,
//! media state and the write-ordering lock; plus the internal result types every
//! command handler returns and the mapping of block errors to sense data.

use crate::alua::Alua;
use crate::mode::ModePages;
use crate::pr::Reservations;
use crate::sense::{codes, Sense};
use crate::thin::{Crossing, LuEvent, ThinThreshold};
use crate::ua::{key_of, NexusKey, UaTable};
use crate::{status, ItNexus, LunConfig, PrReplication, Response, ScsiError};
use block::{BlockError, Bytes, Geometry, VolumeRef};
use parking_lot::{Mutex, RwLock};
use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

/// A successful command: Data-In bytes and the transfer length the CDB called for.
#[derive(Debug, Default)]
pub(crate) struct Done {
    pub data_in: Bytes,
    pub transfer_len_bytes: u32,
}

impl Done {
    /// GOOD with no data.
    pub fn empty() -> Done {
        Done::default()
    }

    /// GOOD with parameter data truncated to the allocation length.
    pub fn alloc(mut data: Vec<u8>, alloc_len_bytes: u32) -> Done {
        data.truncate(alloc_len_bytes as usize);
        let n = data.len() as u32;
        Done {
            data_in: Bytes::from(data),
            transfer_len_bytes: n,
        }
    }
}

/// A failed command.
#[derive(Debug)]
pub(crate) enum Fail {
    /// CHECK CONDITION with this sense; the transfer length the CDB called for (for
    /// residuals), 0 when unknown.
    Check(Sense, u32),
    /// RESERVATION CONFLICT.
    Conflict,
    /// Not a failure: the HA partner ran the command and this is its answer, passed
    /// through as it is.
    Forwarded(Response),
}

impl From<Sense> for Fail {
    fn from(s: Sense) -> Fail {
        Fail::Check(s, 0)
    }
}

impl Fail {
    /// Attaches the CDB's transfer length to a CHECK CONDITION.
    pub fn with_len(self, len_bytes: u32) -> Fail {
        match self {
            Fail::Check(s, _) => Fail::Check(s, len_bytes),
            other => other,
        }
    }
}

/// What every handler returns.
pub(crate) type CmdResult = Result<Done, Fail>;

/// Builds the wire response; `descriptor` selects descriptor-format sense.
pub(crate) fn into_response(r: CmdResult, descriptor: bool) -> Response {
    match r {
        Ok(d) => Response {
            status: status::GOOD,
            sense: None,
            data_in: d.data_in,
            transfer_len_bytes: d.transfer_len_bytes,
        },
        Err(Fail::Check(s, len)) => Response {
            status: status::CHECK_CONDITION,
            sense: Some(s.encode(descriptor)),
            data_in: Bytes::new(),
            transfer_len_bytes: len,
        },
        Err(Fail::Conflict) => Response {
            status: status::RESERVATION_CONFLICT,
            sense: None,
            data_in: Bytes::new(),
            transfer_len_bytes: 0,
        },
        Err(Fail::Forwarded(r)) => r,
    }
}

/// Maps a volume error to the sense data the initiator sees; I/O errors are logged.
pub(crate) fn block_error_sense(lun: u64, e: &BlockError) -> Sense {
    match e {
        BlockError::Medium { lba } => codes::UNRECOVERED_READ_ERROR.with_information(*lba),
        BlockError::WriteFault { lba } => codes::WRITE_ERROR.with_information(*lba),
        BlockError::OutOfRange { .. } => codes::LBA_OUT_OF_RANGE,
        BlockError::ReadOnly => codes::WRITE_PROTECTED,
        BlockError::NoSpace { lba } => {
            tracing::warn!(lun, lba, "thin LU out of space: write refused");
            codes::SPACE_ALLOCATION_FAILED.with_information(*lba)
        }
        BlockError::NotSupported(what) => {
            tracing::warn!(lun, what, "volume does not support the operation");
            codes::INVALID_OPCODE
        }
        BlockError::Unavailable(why) => {
            tracing::warn!(lun, why, "volume unavailable");
            // Multipath initiators retry NOT READY / port unavailable on another path.
            codes::PORT_UNAVAILABLE
        }
        BlockError::Misaligned { len_bytes } => {
            tracing::error!(lun, len_bytes, "misaligned buffer reached the volume");
            codes::INTERNAL_TARGET_FAILURE
        }
        BlockError::Io(err) => {
            tracing::error!(lun, %err, "volume i/o error");
            codes::INTERNAL_TARGET_FAILURE
        }
    }
}

/// START STOP UNIT / PREVENT ALLOW MEDIUM REMOVAL state.
#[derive(Default)]
pub(crate) struct MediaState {
    /// Nexuses that sent PREVENT ALLOW MEDIUM REMOVAL with PREVENT=1.
    pub prevent: HashSet<NexusKey>,
}

/// Longest a reset or an LU's removal waits for the changes of its medium
/// in flight (see [`LogicalUnit::copies_stopped`]).
pub(crate) const STOP_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// One logical unit of a [`crate::ScsiTarget`].
pub(crate) struct LogicalUnit {
    /// The LUN number.
    pub lun: u64,
    /// The ALUA states of the target's port groups for this LU (they differ per
    /// LU when each replicated LUN's paths follow its own replication state).
    pub alua: Alua,
    /// Identity and settings.
    pub config: LunConfig,
    /// The data.
    pub volume: VolumeRef,
    /// Mode pages (current values); hot flags are mirrored in the atomics below.
    pub mode: Mutex<ModePages>,
    /// Write cache enabled (caching page WCE).
    pub wce: AtomicBool,
    /// Software write protect (control page SWP).
    pub swp: AtomicBool,
    /// Descriptor-format sense (control page D_SENSE).
    pub d_sense: AtomicBool,
    /// Unit attentions per nexus.
    pub uas: UaTable,
    /// SPC-2 and persistent reservations.
    pub pr: Reservations,
    /// Stopped by START STOP UNIT (media access answers NOT READY).
    pub stopped: AtomicBool,
    /// Medium removal prevention.
    pub media: Mutex<MediaState>,
    /// Block count last reported, to raise CAPACITY DATA HAS CHANGED.
    pub block_count_seen: AtomicU64,
    /// Orders COMPARE AND WRITE / ORWRITE (exclusive) against other writes (shared).
    /// Held by a medium change until it ends, even when its command is aborted
    /// ([`LogicalUnit::change`]).
    pub write_order: Arc<tokio::sync::RwLock<()>>,
    /// HA partner link for persistent reservations; only PERSISTENT RESERVE OUT reads it.
    pub pr_replication: RwLock<Option<Arc<dyn PrReplication>>>,
    /// Runs this node's PERSISTENT RESERVE OUTs one at a time, each together with the
    /// push of its state to the partner.
    pub pr_order: Arc<tokio::sync::Mutex<()>>,
    /// Runs this node's SET TARGET PORT GROUPS one at a time, each together with the
    /// push of the explicit ALUA states to the partner.
    pub alua_order: Arc<tokio::sync::Mutex<()>>,
    /// The thin provisioning soft threshold.
    pub thin: ThinThreshold,
    /// Where operator events go (the target's subscribers).
    pub events: tokio::sync::broadcast::Sender<LuEvent>,
    /// Command counters for metrics (relaxed atomics only).
    pub(crate) counters: crate::stats::LuCounters,
    /// SANITIZE: a running job's progress, failure mode, the resume record.
    pub(crate) sanitize: crate::sanitize::Sanitizer,
    /// Copies onto this LU recorded to be run again after a restart.
    pub(crate) intents: Arc<crate::copy_resume::Intents>,
    /// Chunks a copy onto this LU writes together (`copy::copy_blocks`), as
    /// its last copy learned: 1 while writes complete at once, more once they
    /// wait.
    pub(crate) copy_batch: std::sync::atomic::AtomicUsize,
    /// LOGICAL UNIT RESETs (target resets included) and CLEAR TASK SETs of
    /// the LU so far: a copy running under another LU's command stops at its
    /// next batch once one of the LUs it reads or writes counts one more
    /// than when it started ([`crate::copy::CopyRun`]).
    pub(crate) resets: AtomicU64,
    /// Held shared by a copy batch's writes here (inside the write order),
    /// exclusively for a moment by a reset ([`LogicalUnit::copies_stopped`]):
    /// not the write order itself, which a SANITIZE holds to its end.
    pub(crate) copy_writes: Arc<tokio::sync::RwLock<()>>,
}

impl LogicalUnit {
    /// Builds the LU and loads its persisted reservation state and explicit ALUA
    /// states.
    pub fn new(
        lun: u64,
        config: LunConfig,
        volume: VolumeRef,
        alua: Alua,
        events: tokio::sync::broadcast::Sender<LuEvent>,
    ) -> Result<Self, ScsiError> {
        let pr = Reservations::load(config.state_file.as_deref())?;
        if let Some(f) = &config.state_file {
            alua.load_explicit(&crate::alua::state_path(f))?;
        }
        let geo = volume.geometry();
        if geo.block_size_bytes == 0 || !geo.block_size_bytes.is_power_of_two() {
            return Err(ScsiError::Config(format!(
                "lun {lun}: block size {} is not a power of two",
                geo.block_size_bytes
            )));
        }
        let mode = ModePages::defaults(&geo);
        let sanitize = crate::sanitize::Sanitizer::load(config.state_file.as_deref());
        let intents = crate::copy_resume::Intents::load(config.state_file.as_deref());
        Ok(LogicalUnit {
            lun,
            wce: AtomicBool::new(mode.wce()),
            swp: AtomicBool::new(mode.swp()),
            d_sense: AtomicBool::new(mode.d_sense()),
            mode: Mutex::new(mode),
            config,
            volume,
            uas: UaTable::default(),
            pr,
            stopped: AtomicBool::new(false),
            media: Mutex::new(MediaState::default()),
            block_count_seen: AtomicU64::new(geo.block_count),
            write_order: Arc::new(tokio::sync::RwLock::new(())),
            pr_replication: RwLock::new(None),
            pr_order: Arc::new(tokio::sync::Mutex::new(())),
            alua_order: Arc::new(tokio::sync::Mutex::new(())),
            alua,
            thin: ThinThreshold::new(None),
            events,
            counters: Default::default(),
            sanitize,
            intents,
            copy_batch: std::sync::atomic::AtomicUsize::new(1),
            resets: AtomicU64::new(0),
            copy_writes: Arc::new(tokio::sync::RwLock::new(())),
        })
    }

    /// Current geometry of the volume.
    #[inline]
    pub fn geometry(&self) -> Geometry {
        self.volume.geometry()
    }

    /// Descriptor-format sense in effect.
    #[inline]
    pub fn descriptor_sense(&self) -> bool {
        self.d_sense.load(Ordering::Relaxed)
    }

    /// Writes must be refused (configured read-only or SWP set).
    #[inline]
    pub fn write_protected(&self) -> bool {
        self.config.read_only || self.swp.load(Ordering::Relaxed)
    }

    /// Checks write protection.
    #[inline]
    pub fn check_writable(&self) -> Result<(), Sense> {
        if self.write_protected() {
            Err(codes::WRITE_PROTECTED)
        } else {
            Ok(())
        }
    }

    /// Whether writes must go FUA because the write cache is disabled.
    #[inline]
    pub fn force_fua(&self) -> bool {
        !self.wce.load(Ordering::Relaxed)
    }

    /// Mirrors the mode pages' hot flags into the atomics.
    pub fn sync_mode_flags(&self, m: &ModePages) {
        self.wce.store(m.wce(), Ordering::Relaxed);
        self.swp.store(m.swp(), Ordering::Relaxed);
        self.d_sense.store(m.d_sense(), Ordering::Relaxed);
    }

    /// Runs the medium change `op` makes of the LU's volume under the LU's write
    /// order (shared, or `exclusive` for a read-modify-write), to its end even if
    /// its command is aborted meanwhile, and the order held until then (see
    /// `crate::detach`).
    pub(crate) async fn change<T, Fut>(
        &self,
        exclusive: bool,
        op: impl FnOnce(VolumeRef) -> Fut,
    ) -> T
    where
        Fut: std::future::Future<Output = T> + Send + 'static,
        T: Send + 'static,
    {
        let run = op(self.volume.clone());
        if exclusive {
            let order = self.write_order.clone().write_owned().await;
            block::detach::detached(async move {
                let _order = order;
                run.await
            })
            .await
        } else {
            let order = self.write_order.clone().read_owned().await;
            block::detach::detached(async move {
                let _order = order;
                run.await
            })
            .await
        }
    }

    /// Maps a volume error for this LU.
    pub fn io_error(&self, e: &BlockError) -> Sense {
        block_error_sense(self.lun, e)
    }

    /// A LOGICAL UNIT RESET or target reset: SPC-2 reservations, medium removal
    /// prevention and mode parameters return to their defaults; every nexus gets `ua`.
    pub fn reset(&self, ua: Sense) {
        self.pr.reset();
        self.reset_but_reservations(ua);
    }

    /// [`LogicalUnit::reset`] but for the SPC-2 reservation: for a reset that
    /// reached the LU through the HA partner, which ends the reservation on
    /// both nodes in order with the reservation commands (ended here too, it
    /// could end one taken since).
    pub(crate) fn reset_but_reservations(&self, ua: Sense) {
        self.resets.fetch_add(1, Ordering::AcqRel);
        self.media.lock().prevent.clear();
        self.stopped.store(false, Ordering::Relaxed);
        let defaults = ModePages::defaults(&self.geometry());
        self.sync_mode_flags(&defaults);
        *self.mode.lock() = defaults;
        self.uas.reset_all(ua);
        self.thin.rearm();
    }

    /// After a reset of the LU (counted in `resets`): returns once no copy
    /// batch that began before it still writes here. A batch checks the count
    /// holding `copy_writes` shared, so once that was held exclusively for a
    /// moment, every later batch sees the reset and stops (review of
    /// 2026-12-06: an EXTENDED COPY sent to another LU went on writing this
    /// one after its reset was answered).
    ///
    /// Bounded by [`STOP_WAIT`]: a batch at a disk that stalls longer is left
    /// to land (logged), rather than hold the reset's answer, and with it the
    /// connection's task management, for ever; every later batch stops.
    pub async fn copies_stopped(&self) {
        if tokio::time::timeout(STOP_WAIT, self.copy_writes.write())
            .await
            .is_err()
        {
            tracing::warn!(
                lun = self.lun,
                "a copy's writes in flight to this logical unit did not end within the wait: \
                 they may land after the reset is answered (later batches stop)"
            );
        }
    }

    /// Waits (at most [`STOP_WAIT`]) until no change of the medium is in
    /// flight: the write order held exclusively for a moment.
    pub async fn changes_stopped(&self) -> bool {
        tokio::time::timeout(STOP_WAIT, self.write_order.write())
            .await
            .is_ok()
    }

    /// The nexus is gone: its reservations (SPC-2), prevention and UAs are dropped.
    /// True if it held the SPC-2 reservation.
    pub fn nexus_lost(&self, nexus: &ItNexus) -> bool {
        let held = self.pr.nexus_lost(nexus);
        self.media.lock().prevent.remove(&key_of(nexus));
        self.uas.forget(nexus);
        held
    }

    /// After a write-type command: counts `bytes` written and, when a sample of
    /// the space use is due (or `force`: an UNMAP, a failed allocation), compares
    /// it with the soft threshold; a crossing establishes the unit attention on
    /// every nexus and tells the subscribers. `no_space`: the command failed for
    /// want of space.
    pub fn thin_written(&self, bytes: u64, force: bool, no_space: bool) {
        if !self.thin.note_written(bytes) && !force && !no_space {
            return;
        }
        let geo = self.geometry();
        let Some(p) = self.volume.provisioning() else {
            return;
        };
        if no_space && self.thin.ran_out() {
            tracing::error!(
                lun = self.lun,
                mapped_bytes = p.mapped_bytes,
                available_bytes = p.available_bytes,
                "thin LU out of space: writes are refused"
            );
            let _ = self.events.send(LuEvent::ThinOutOfSpace {
                lun: self.lun,
                mapped_bytes: p.mapped_bytes,
            });
        }
        if self.thin.get().is_none() {
            return;
        }
        match self.thin.sample(&geo, &p) {
            Crossing::Up {
                mapped_bytes,
                threshold_bytes,
                available_bytes,
            } => {
                tracing::warn!(
                    lun = self.lun,
                    mapped_bytes,
                    threshold_bytes,
                    available_bytes,
                    "thin provisioning soft threshold reached"
                );
                self.uas.raise_all(crate::thin::REACHED, None);
                let _ = self.events.send(LuEvent::ThinThresholdReached {
                    lun: self.lun,
                    mapped_bytes,
                    threshold_bytes,
                    available_bytes,
                });
            }
            Crossing::Down => {
                tracing::info!(
                    lun = self.lun,
                    mapped_bytes = p.mapped_bytes,
                    "thin LU back below its soft threshold (re-armed)"
                );
            }
            Crossing::None => {}
        }
    }

    /// Raises CAPACITY DATA HAS CHANGED if the volume was resized since last seen.
    #[inline]
    pub fn check_capacity(&self, geo: &Geometry) {
        let seen = self.block_count_seen.load(Ordering::Relaxed);
        if seen != geo.block_count
            && self
                .block_count_seen
                .compare_exchange(seen, geo.block_count, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
        {
            tracing::info!(
                lun = self.lun,
                from = seen,
                to = geo.block_count,
                "capacity changed"
            );
            self.uas.raise_all(codes::CAPACITY_DATA_CHANGED, None);
        }
    }
}
