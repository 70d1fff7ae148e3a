//! The pool: membership, superblocks, create/assemble, failure handling, status.
//! The data path lives in `io.rs`, rebuild and resync in `background.rs`, scrub in
//! `scrub.rs`.

use crate::journal::{self, Journal};
use crate::layout::{layout_for, survives, Layout, Scheme};
use crate::status::{
    MemberState, MemberStatus, PoolState, PoolStatus, Progress, ScrubReport, SpareStatus,
};
use crate::superblock::{self, MemberRecord, Superblock, SUPERBLOCK_REGION_BYTES};
use crate::util::{align_up, join_all, new_uuid, uuid_tag, BoxFut};
use crate::{default_journal_bytes, PoolConfig, RaidError, RaidResult};
use block::{BlockError, BlockResult, Bytes, Geometry, VolumeRef};
use parking_lot::Mutex;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

/// A member volume handed to `create`, `assemble`, `replace_member` or `add_spare`.
#[derive(Clone)]
pub struct Member {
    /// Path or label, shown in status.
    pub name: String,
    /// The volume.
    pub volume: VolumeRef,
}

impl Member {
    /// A member from a name and a volume.
    pub fn new(name: impl Into<String>, volume: VolumeRef) -> Self {
        Member {
            name: name.into(),
            volume,
        }
    }
}

/// A member attached to the pool, with its counters.
pub(crate) struct MemberHandle {
    pub name: String,
    pub uuid: String,
    pub volume: VolumeRef,
    pub reads: AtomicU64,
    pub writes: AtomicU64,
    pub errors: AtomicU64,
    pub read_bytes: AtomicU64,
    pub written_bytes: AtomicU64,
    pub inflight: AtomicU64,
    /// Queue depth over time (`status().members[i].inflight_us`, `busy_us`).
    pub depth: crate::meter::DepthMeter,
    /// Data-area lba just past the last read dispatched to it (where its head
    /// will be): mirrors send a read that continues there to the same copy.
    pub head: AtomicU64,
    /// Where its writes are, for keeping whole-stripe streams in order.
    pub order: crate::order::WriteOrder,
    /// Both superblock slots list lost blocks (written since it joined):
    /// a superblock listing some then goes to its own slot only.
    pub lost_both_slots: AtomicBool,
    /// Its disk was let go on a command timeout (`keep.rs`): the pool fails
    /// it once its request returns, and counts it gone meanwhile.
    pub given_up: AtomicBool,
}

impl MemberHandle {
    pub(crate) fn new(m: Member, uuid: String) -> Arc<Self> {
        Arc::new(MemberHandle {
            name: m.name,
            uuid,
            volume: m.volume,
            reads: AtomicU64::new(0),
            writes: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            read_bytes: AtomicU64::new(0),
            written_bytes: AtomicU64::new(0),
            inflight: AtomicU64::new(0),
            depth: Default::default(),
            head: AtomicU64::new(u64::MAX),
            order: Default::default(),
            lost_both_slots: AtomicBool::new(false),
            given_up: AtomicBool::new(false),
        })
    }
}

/// One position.
pub(crate) struct Slot {
    pub uuid: String,
    pub member: Option<Arc<MemberHandle>>,
    pub state: MemberState,
    pub rebuild_cp_stripes: u64,
    /// What the superblocks may say of `rebuild_cp_stripes`: the checkpoint as
    /// it stood before the last flush of the members. The stripes rebuilt
    /// since sit in the member's volatile cache until the next flush, and a
    /// superblock written meanwhile for another reason (a whole-stripe write's
    /// intent region, a member failure, a spare added, a rate change) must not
    /// make the member trusted over them after a power loss.
    pub durable_cp_stripes: u64,
}

/// Mutable pool state (under a short parking_lot lock; never held across await).
pub(crate) struct State {
    pub slots: Vec<Slot>,
    pub spares: Vec<Arc<MemberHandle>>,
    pub generation: u64,
    pub events: u64,
    pub resync_cursor: Option<u64>,
    /// What the superblocks may say of `resync_cursor` (see
    /// [`Slot::durable_cp_stripes`]).
    pub resync_durable: u64,
    pub journal_checkpoint_seq: u64,
    pub clean: bool,
    pub rebuild: Option<Progress>,
    pub rebuild_stalled: Option<crate::status::RebuildStall>,
    pub resync: Option<Progress>,
    pub scrub: Option<Progress>,
    pub last_scrub: Option<ScrubReport>,
    pub rebuild_rate_mb_s: u32,
    /// Write-intent regions with whole-stripe writes (see `fullstripe.rs`).
    pub intent: BTreeMap<u64, crate::fullstripe::Region>,
    /// Bumped whenever the set of dirty regions changes.
    pub intent_seq: u64,
    /// Regions dirty at an unclean assemble, waiting for their parity resync.
    pub resync_regions: BTreeSet<u64>,
    /// Pool blocks a rebuild could not recover (see `lost.rs`).
    pub lost: crate::lost::Lost,
    /// The stripe the rebuild may give up rows of, and the generation then:
    /// every journal record was checkpointed after its first failed try, and
    /// no member failed or joined since (see `lost.rs`).
    pub salvage_ready: Option<(u64, u64)>,
}

impl State {
    /// The rebuild is over (done, or its target or the pool failed): no
    /// progress and no stall to show.
    pub(crate) fn rebuild_over(&mut self) {
        self.rebuild = None;
        self.rebuild_stalled = None;
        self.salvage_ready = None;
    }

    /// The rebuild may give up rows of stripe `s` now (see `lost.rs`).
    pub(crate) fn may_salvage(&self, s: u64) -> bool {
        self.salvage_ready == Some((s, self.generation))
    }
}

/// A member as one grid position sees it: the handle, and the data-area lba where
/// the position's area starts (non-zero only for the second half of a RAID 10
/// far member). The member I/O helpers add `base` to the grid lba.
#[derive(Clone, Copy)]
pub(crate) struct At<'a> {
    pub h: &'a Arc<MemberHandle>,
    pub base: u64,
}

impl std::ops::Deref for At<'_> {
    type Target = Arc<MemberHandle>;
    fn deref(&self) -> &Arc<MemberHandle> {
        self.h
    }
}

/// Which members an operation on one stripe may use (a snapshot), per grid
/// position (see [`crate::layout`]: positions `0..members` are the members
/// themselves; RAID 10 far has a second position per member).
#[derive(Clone)]
pub(crate) struct View {
    /// Per position: the handle when writable, and the stripe below which it is readable.
    pub slots: Vec<Option<(Arc<MemberHandle>, u64)>>,
    /// Blocks of one area of a member's data area (`stripes * chunk`).
    pub area_blocks: u64,
    /// Number of members (the first `members` positions).
    pub members: usize,
}

impl View {
    /// Data-area lba where position `pos`'s area starts (positions are
    /// area-major, see [`crate::layout::Layout::areas`]).
    pub fn base(&self, pos: usize) -> u64 {
        (pos / self.members) as u64 * self.area_blocks
    }
    /// The member at `pos` if it holds valid data for `stripe`.
    pub fn readable(&self, pos: usize, stripe: u64) -> Option<At<'_>> {
        match &self.slots[pos] {
            Some((h, below)) if stripe < *below => Some(At {
                h,
                base: self.base(pos),
            }),
            _ => None,
        }
    }
    /// The member at `pos` if it should receive writes.
    pub fn writable(&self, pos: usize) -> Option<At<'_>> {
        self.slots[pos].as_ref().map(|(h, _)| At {
            h,
            base: self.base(pos),
        })
    }
    /// Every attached member once: (member position, handle).
    pub fn member_handles(&self) -> Vec<(usize, Arc<MemberHandle>)> {
        self.slots[..self.members]
            .iter()
            .enumerate()
            .filter_map(|(i, s)| s.as_ref().map(|(h, _)| (i, h.clone())))
            .collect()
    }
}

/// The records a scan of one journal ring found above the checkpoint, and
/// whether sectors of the ring could not be read (read as no record).
type RingScan = (Vec<journal::Record>, bool);

/// Everything shared by the pool handle, its data path and its background tasks.
pub(crate) struct Inner {
    pub name: String,
    pub uuid: String,
    pub pool_tag: u64,
    pub layout: Box<dyn Layout>,
    pub chunk_bytes: u32,
    pub bs: u64,
    pub cb: u64,
    /// Rows of the grid (stripes per member area); grows (see `grow.rs`).
    pub stripes: AtomicU64,
    pub data_offset_blocks: u64,
    pub journal_offset_blocks: u64,
    pub journal_blocks: u64,
    pub journal: Option<Journal>,
    /// The geometry but for the block count (see [`Inner::geometry`]).
    pub geometry_base: Geometry,
    /// Blocks the pool exposes; grows atomically once a grow is durable.
    pub block_count: AtomicU64,
    /// Blocks the superblocks record (set with `stripes` when a grow commits,
    /// just before `block_count`).
    pub sb_blocks: AtomicU64,
    /// Serializes grows.
    pub grow_lock: tokio::sync::Mutex<()>,
    pub state: Mutex<State>,
    pub sb_lock: tokio::sync::Mutex<()>,
    pub locks: Vec<Arc<tokio::sync::RwLock<()>>>,
    /// Stripes whose journaled update was acknowledged while its in-place writes
    /// still run (at most one per stripe: it holds the stripe's lock); a read of
    /// such a stripe waits for its lock.
    pub applying: Mutex<std::collections::HashSet<u64>>,
    /// Bytes (in KiB) of in-place writes that may run after their
    /// acknowledgement (see `commit.rs`, "Early acknowledgement").
    pub apply_budget: Arc<tokio::sync::Semaphore>,
    /// Acknowledge journaled updates once their record is durable (default);
    /// off: only after the in-place writes too (for measurements).
    pub early_ack: AtomicBool,
    /// Acknowledge a partial update of a healthy stripe once its new data is
    /// journaled, before its reads (default; see `commit.rs`, "Data first").
    pub data_first: AtomicBool,
    /// Data-first updates acknowledged and not yet in place (see
    /// `commit::DATA_FIRST_BACKLOG`).
    pub data_first_backlog: Arc<tokio::sync::Semaphore>,
    /// Members a journal batch goes to beyond its copy set (see `commit.rs`,
    /// "A spare copy").
    pub journal_spares: std::sync::atomic::AtomicUsize,
    /// Spare copies whether or not the members reorder (`SpareWhen::Always`).
    pub spare_always: AtomicBool,
    /// Completing records ride the next group commit (`Pool::set_completions_ride`).
    pub completions_ride: AtomicBool,
    /// Whether the members reorder their queues now (see `spares_now`).
    pub spare_verdict: parking_lot::Mutex<crate::commit::SpareVerdict>,
    /// A background checkpoint is running (see `commit.rs`, `checkpoint_ahead`).
    pub checkpoint_running: AtomicBool,
    pub fg_inflight: AtomicU64,
    pub wake: Arc<tokio::sync::Notify>,
    pub closed: AtomicBool,
    pub scrub_running: AtomicBool,
    /// Stripes per write-intent region.
    pub region_stripes: u64,
    /// Highest `intent_seq` the superblocks on disk reflect.
    pub durable_intent_seq: AtomicU64,
    /// The latest generation an acknowledgement must find on disk (one that
    /// records a member's failure), and the newest generation the
    /// superblocks hold: a write is acknowledged only once the failures of
    /// the members it skipped are on disk (see [`Inner::failures_durable`]).
    pub needed_gen: AtomicU64,
    pub durable_gen: AtomicU64,
    /// The `intent_seq` an acknowledgement must find on disk (a rebuild's
    /// end checkpoint: `advance_rebuild`); compared with `durable_intent_seq`.
    pub needed_intent: AtomicU64,
    pub gather: Mutex<crate::fullstripe::Gather>,
    /// Test-only: whole-stripe writes skip the write intent.
    pub intent_off: bool,
    /// Whole-stripe writes go through the stripe journal too (see
    /// [`Pool::set_journal_whole_stripes`]).
    pub journal_whole: AtomicBool,
    /// The journal devices the configuration names (see
    /// [`Pool::set_journal_devices_configured`]).
    pub journal_configured: Mutex<Vec<String>>,
    pub full_writes: AtomicU64,
    /// Stripes written whole without FUA since the members' last flush, each
    /// with the flush count then (see [`Inner::flush_members`]): a partial
    /// update of one flushes first (`write_parity_locked`).
    pub unflushed_whole: Mutex<std::collections::HashMap<u64, u64>>,
    /// Member flushes started.
    pub flushes_started: AtomicU64,
    pub partial_writes: AtomicU64,
    pub gather_timeouts: AtomicU64,
    /// Of those, the gathers that ended because their stream had moved on.
    pub gather_passed: AtomicU64,
    /// Time base of `last_write_ns`.
    pub epoch: std::time::Instant,
    pub last_write_ns: AtomicU64,
    /// EWMA of member write latency, ns.
    pub write_ewma_ns: AtomicU64,
    /// Foreground stripe writes (whole or partial) in progress.
    pub stripe_writes: AtomicU64,
    /// Counters of partial-stripe updates and the journal (`status().write_path`).
    pub wp: crate::commit::WriteCounters,
    /// Test-only: stripe updates skip the journal (see
    /// [`Pool::unsafe_set_journal_bypass`]).
    pub journal_bypass: AtomicBool,
    /// The journal devices (none, one, or a mirrored pair), when the ring is
    /// there instead of on the members.
    pub journal_devs: Vec<crate::jdev::JournalDev>,
    /// Some lost blocks are recorded (`State::lost` is not empty): reads
    /// check the record only then.
    pub lost_any: AtomicBool,
    /// Bumped whenever the record of lost blocks changes (see `Pool::read`).
    pub lost_epoch: AtomicU64,
    /// Unit tests: run by a group commit's leader after it took its batch and
    /// before it reserves ring space (with whether the batch carries a
    /// completing record), to let another task in exactly there.
    #[cfg(test)]
    pub before_reserve: Mutex<Option<crate::commit::BeforeReserve>>,
    /// Unit tests: signalled when a journaled update is about to wait for its
    /// share of the apply budget.
    #[cfg(test)]
    pub budget_wait: tokio::sync::Notify,
}

/// Stripe lock slots (stripe `s` uses slot `s mod STRIPE_LOCKS`). Stripes that
/// share a slot wait for each other for nothing: with early acknowledgement
/// about fifty stripes of a busy HDD pool hold their lock at once (32 requests
/// in flight and the in-place writes behind them), so 1024 slots made about one
/// small write in twenty wait for an unrelated stripe (`bench/raid-smallwrite`,
/// RAID 5 of 10 at 32 in flight with NCQ: lock wait 4-5 ms per update; 1-2 ms
/// with 16,384 slots; 1-2% more IOPS, interleaved runs). 8192 slots cost about
/// half a MiB per pool.
pub(crate) const STRIPE_LOCKS: usize = 8192;

/// A RAID pool: a `block::Volume` over its members. Dropping it stops its
/// background tasks; call [`Pool::shutdown`] first for a clean superblock.
pub struct Pool {
    pub(crate) inner: Arc<Inner>,
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.inner.closed.store(true, Ordering::SeqCst);
        self.inner.wake.notify_one();
    }
}

struct Shape {
    bs: u64,
    cb: u64,
    /// Rows of the grid: stripes per member area.
    stripes: u64,
    /// Areas per member data area (2 for RAID 10 far, else 1).
    areas: u64,
    data_offset_blocks: u64,
    journal_offset_blocks: u64,
    journal_blocks: u64,
    /// Stripes per write-intent region.
    region_stripes: u64,
    /// Blocks the pool exposes when fewer than the stripes hold.
    volume_blocks: Option<u64>,
}

/// One superblock write of [`Inner::persist_locked`]: position (none for a spare),
/// member, content.
type SbTarget = (Option<usize>, Arc<MemberHandle>, Superblock);

impl Pool {
    /// The pool's uuid (32 hex digits), in every member's superblock: what
    /// identifies it whatever its name and members' paths.
    pub fn uuid(&self) -> &str {
        &self.inner.uuid
    }

    /// Creates a pool: writes a superblock on every member and spare and returns at
    /// once. Parity (and mirror copies) are made consistent by a background resync
    /// while the pool serves I/O; until a stripe is resynced, writes to it use
    /// reconstruct-write so every written block is protected from the start.
    pub async fn create(
        config: PoolConfig,
        members: Vec<Member>,
        spares: Vec<Member>,
    ) -> RaidResult<Pool> {
        Self::create_with_journal_devices(config, members, spares, Vec::new()).await
    }

    /// Like [`Pool::create`], with the stripe journal of a parity pool on
    /// `journal_device` (an SSD) instead of the members: each record is written
    /// once there and the members never seek to a ring. The device needs 64 KiB
    /// plus the journal size; its first 64 KiB get a header naming the pool.
    pub async fn create_with_journal_device(
        config: PoolConfig,
        members: Vec<Member>,
        spares: Vec<Member>,
        journal_device: Option<Member>,
    ) -> RaidResult<Pool> {
        let devs = journal_device.into_iter().collect();
        Self::create_with_journal_devices(config, members, spares, devs).await
    }

    /// Like [`Pool::create_with_journal_device`] with up to
    /// [`JOURNAL_DEVICES_MAX`](crate::JOURNAL_DEVICES_MAX) devices: two make a
    /// mirrored pair, each group commit written to both, so a crash together
    /// with the loss of either loses nothing acknowledged (see `jdev.rs`).
    pub async fn create_with_journal_devices(
        config: PoolConfig,
        members: Vec<Member>,
        spares: Vec<Member>,
        journal_devices: Vec<Member>,
    ) -> RaidResult<Pool> {
        let layout = layout_for(config.level, members.len())?;
        let bs = members[0].volume.geometry().block_size_bytes as u64;
        for m in members.iter().chain(&spares) {
            if m.volume.geometry().block_size_bytes as u64 != bs {
                return Err(RaidError::Config(format!(
                    "member {} has a different block size",
                    m.name
                )));
            }
        }
        if config.chunk_bytes == 0
            || !(config.chunk_bytes as u64).is_multiple_of(bs)
            || config.chunk_bytes > crate::CHUNK_BYTES_MAX
        {
            return Err(RaidError::Config(format!(
                "chunk {} is not a multiple of the block size {bs} of at most {} bytes",
                config.chunk_bytes,
                crate::CHUNK_BYTES_MAX
            )));
        }
        let cb = config.chunk_bytes as u64 / bs;
        let parity = matches!(layout.scheme(), Scheme::Parity { .. });
        let mut min_blocks = members
            .iter()
            .map(|m| m.volume.geometry().block_count)
            .min()
            .unwrap_or(0);
        if let Some(b) = config.member_bytes {
            if b / bs > min_blocks {
                return Err(RaidError::Config(format!(
                    "member_bytes {b} is more than the smallest member holds ({} bytes)",
                    min_blocks * bs
                )));
            }
            min_blocks = b / bs;
        }
        let journal_bytes = if parity && !config.unsafe_disable_journal {
            config.journal_bytes.unwrap_or_else(|| {
                let rooms: Vec<u64> = journal_devices
                    .iter()
                    .map(crate::jdev::ring_room_bytes)
                    .collect();
                default_journal_bytes(min_blocks * bs, &rooms)
            })
        } else {
            0
        };
        let journal_blocks = journal_bytes / bs;
        if parity
            && !config.unsafe_disable_journal
            && journal_blocks < journal::min_ring_blocks(layout.member_count(), cb, bs as usize)
        {
            return Err(RaidError::Config(format!(
                "journal of {journal_bytes} bytes holds fewer than two full-stripe records"
            )));
        }
        let journal_offset_blocks = SUPERBLOCK_REGION_BYTES / bs;
        let data_offset_blocks = align_up(
            SUPERBLOCK_REGION_BYTES + journal_bytes,
            SUPERBLOCK_REGION_BYTES,
        ) / bs;
        let areas = layout.areas();
        let stripes = min_blocks.saturating_sub(data_offset_blocks) / cb / areas;
        if stripes == 0 {
            return Err(RaidError::Config(
                "members too small for the reserved region and one chunk".into(),
            ));
        }
        let shape = Shape {
            bs,
            cb,
            stripes,
            areas,
            data_offset_blocks,
            journal_offset_blocks,
            journal_blocks,
            region_stripes: config
                .intent_region_stripes
                .unwrap_or_else(|| default_region_stripes(config.chunk_bytes))
                .max(1),
            volume_blocks: None,
        };
        for s in &spares {
            check_size(&shape, s)?;
        }
        let redundant = layout.scheme() != Scheme::Striped;
        let slots = members
            .into_iter()
            .map(|m| {
                let uuid = new_uuid();
                Slot {
                    uuid: uuid.clone(),
                    member: Some(MemberHandle::new(m, uuid)),
                    state: MemberState::Active,
                    rebuild_cp_stripes: 0,
                    durable_cp_stripes: 0,
                }
            })
            .collect();
        let state = State {
            slots,
            spares: spares
                .into_iter()
                .map(|m| MemberHandle::new(m, new_uuid()))
                .collect(),
            generation: 1,
            events: 0,
            resync_cursor: redundant.then_some(0),
            resync_durable: 0,
            journal_checkpoint_seq: 0,
            clean: false,
            rebuild: None,
            rebuild_stalled: None,
            resync: None,
            scrub: None,
            last_scrub: None,
            rebuild_rate_mb_s: config.rebuild_rate_mb_s,
            intent: BTreeMap::new(),
            intent_seq: 0,
            resync_regions: BTreeSet::new(),
            lost: Default::default(),
            salvage_ready: None,
        };
        let mut inner = Inner::new(
            &config.name,
            new_uuid(),
            layout,
            config.chunk_bytes,
            &shape,
            state,
            1,
        );
        inner.intent_off = config.unsafe_disable_write_intent;
        crate::jdev::attach_new(&mut inner, journal_devices, bs, journal_blocks).await?;
        let pool = Pool {
            inner: Arc::new(inner),
        };
        pool.inner.keep_members();
        pool.inner
            .persist()
            .await
            .map_err(|e| RaidError::PoolFailed(format!("writing superblocks: {e}")))?;
        crate::background::spawn_worker(&pool.inner);
        Ok(pool)
    }

    /// Assembles a pool from its members in any order: reads the superblocks,
    /// checks they belong to one pool and one generation (with `force`, takes the
    /// newest generation and rebuilds stale members), comes up degraded when
    /// members are missing within tolerance (or failed, answering I/O with errors,
    /// beyond it), and replays the stripe journal so every interrupted stripe is
    /// consistent before I/O starts.
    pub async fn assemble(members: Vec<Member>, force: bool) -> RaidResult<Pool> {
        Self::assemble_with_journal_devices(members, force, Vec::new()).await
    }

    /// Like [`Pool::assemble`] for a pool created with a journal device: its
    /// records are replayed too. Without the device a pool that has one is
    /// refused unless `force` (then the records it held are not replayed: the
    /// write hole of the last crash is open and writes acknowledged before it
    /// that a member's volatile cache lost are lost).
    pub async fn assemble_with_journal_device(
        members: Vec<Member>,
        force: bool,
        journal_device: Option<Member>,
    ) -> RaidResult<Pool> {
        let devs = journal_device.into_iter().collect();
        Self::assemble_with_journal_devices(members, force, devs).await
    }

    /// Like [`Pool::assemble_with_journal_device`] with every journal device at
    /// hand: either device of a mirrored pair is enough (both are replayed when
    /// both are given).
    pub async fn assemble_with_journal_devices(
        members: Vec<Member>,
        force: bool,
        journal_devices: Vec<Member>,
    ) -> RaidResult<Pool> {
        if members.is_empty() {
            return Err(RaidError::Config("no members".into()));
        }
        // a stall every candidate shares (a node starting under it) is
        // waited out, not failed member by member
        crate::keep::keep_while_assembling(&members.iter().collect::<Vec<_>>(), false);
        let mut found: Vec<(Member, Superblock)> = Vec::new();
        let mut unreadable = None;
        // read together: a stall they share is waited out once, not once
        // per member in turn
        let reads: Vec<BoxFut<'_, Result<Superblock, superblock::NoSuperblock>>> = members
            .iter()
            .map(|m| -> BoxFut<'_, _> { Box::pin(superblock::read_best(&m.volume)) })
            .collect();
        let read = join_all(reads).await;
        for (m, sb) in members.into_iter().zip(read) {
            match sb {
                Ok(sb) => found.push((m, sb)),
                // a disk that fails every read, or stopped answering (its
                // command timeout): left out, as a disk that is not there
                // is; the pool assembles without it if it can (before, the
                // whole assemble was refused)
                Err(superblock::NoSuperblock::Unreadable(reason)) => {
                    tracing::warn!(member = %m.name, error = %reason,
                        "a member's superblock cannot be read: assembling without it");
                    unreadable = Some((m.name, reason));
                }
                Err(superblock::NoSuperblock::Invalid(reason)) => {
                    return Err(RaidError::BadSuperblock {
                        member: m.name.clone(),
                        reason,
                    })
                }
            }
        }
        let Some(first) = found.first() else {
            let (member, reason) = unreadable.unwrap_or_default();
            return Err(RaidError::BadSuperblock { member, reason });
        };
        let pool_uuid = first.1.pool_uuid.clone();
        if let Some((m, _)) = found.iter().find(|(_, sb)| sb.pool_uuid != pool_uuid) {
            return Err(RaidError::ForeignMember {
                member: m.name.clone(),
                pool_uuid,
            });
        }
        // named this pool's: now they may be asked a write (to their probe
        // block) when one of them leaves a write unanswered
        crate::keep::keep_while_assembling(&found.iter().map(|(m, _)| m).collect::<Vec<_>>(), true);
        let newest = found
            .iter()
            .map(|(_, sb)| sb)
            .max_by_key(|sb| (sb.generation, sb.events))
            .cloned()
            .ok_or_else(|| RaidError::Config("no members".into()))?;
        // A stale member the newest superblock no longer names was replaced (a
        // spare took its place, or an operator replaced it): it is out of the
        // pool, whatever the configuration still lists; leave it out (with
        // `force` it may be re-added where it was, below). A stale member the
        // newest superblock names as failed was failed out (errors, gone, or
        // `pool fail`) and missed the writes since: it stays failed and out, and
        // the pool comes up degraded, as it ran before the stop; it rejoins only
        // through a replace or `force` (which rebuilds it).
        // A member behind that the newest superblock still names as active
        // or rebuilding (or as a spare) missed only the last superblock
        // write: a power cut between the members' writes of a new generation
        // (each change of members writes one, sometimes two at once: a
        // failure and the spare that takes its place). No write was
        // acknowledged on the strength of the new generation (a failure is
        // durable before the writes that skip the member are acknowledged,
        // and a member whose superblock write failed is named failed in the
        // next), so it holds all the others do, and takes the newest record.
        // Before, the pool refused to assemble (StaleGeneration), and `force`
        // rebuilt every such member from the start, failing the pool for good.
        let named_live = |sb: &Superblock| {
            newest.spares.contains(&sb.member_uuid)
                || newest
                    .members
                    .iter()
                    .any(|r| r.uuid == sb.member_uuid && r.state != MemberState::Failed)
        };
        // With `force`, a pool that failed can come back without a rebuild of
        // the members whose loss failed it: those the newest superblock names
        // failed whose own superblock is one generation behind, so that the
        // change recorded last is their failure. From the moment a failure is
        // durable the writes that skip the member are acknowledged; but with
        // these gone the pool was beyond what it survives, and nothing was
        // acknowledged after (every I/O of a failed pool is refused). So each
        // holds everything acknowledged on it, as after a transient error (a
        // cable, a controller, a power loss of the shelf), and is taken back
        // as it is (md's forced assembly does the same with its freshest
        // failed members). Members failed earlier missed acknowledged writes
        // and are rebuilt. Only when taking them back makes the pool survive.
        let revived: BTreeSet<String> = if force {
            revivable(
                &newest,
                &found,
                layout_for(newest.level, newest.member_count as usize)?.as_ref(),
            )
        } else {
            BTreeSet::new()
        };
        for (m, _) in found
            .iter()
            .filter(|(_, sb)| revived.contains(&sb.member_uuid))
        {
            tracing::warn!(member = %m.name, "force: member failed by the pool's last change, which failed the pool, taken back as it is (nothing was acknowledged without it)");
        }
        let stale_of = |sb: &Superblock| {
            sb.generation != newest.generation
                && !named_live(sb)
                && !revived.contains(&sb.member_uuid)
        };
        if !force {
            found.retain(|(m, sb)| {
                let stale = stale_of(sb);
                let named = newest.members.iter().find(|r| r.uuid == sb.member_uuid);
                match named {
                    None if stale => {
                        tracing::warn!(member = %m.name, generation = sb.generation,
                            newest = newest.generation,
                            "member was replaced in the pool since; left out of it");
                        false
                    }
                    Some(r) if stale && r.state == MemberState::Failed => {
                        tracing::warn!(member = %m.name, generation = sb.generation,
                            newest = newest.generation,
                            "member was failed out of the pool and is stale; left out of it (replace it, or assemble with force to rebuild it)");
                        false
                    }
                    _ => true,
                }
            });
        }
        for (m, sb) in &found {
            if stale_of(sb) && !force {
                return Err(RaidError::StaleGeneration {
                    member: m.name.clone(),
                    generation: sb.generation,
                    newest: newest.generation,
                });
            }
            // A grow writes the larger size to every member in turn (see grow.rs):
            // after a crash in the middle, members of the newest generation may
            // still say the old, smaller size; the newest superblock's size holds
            // (every member's new region was zeroed and flushed before any
            // superblock said so). A stale member is rebuilt whatever it says.
            let size_ok = sb.stripes <= newest.stripes || sb.generation != newest.generation;
            if sb.level != newest.level
                || sb.chunk_bytes != newest.chunk_bytes
                || sb.member_count != newest.member_count
                || !size_ok
                || sb.data_offset_blocks != newest.data_offset_blocks
            {
                return Err(RaidError::BadSuperblock {
                    member: m.name.clone(),
                    reason: "geometry disagrees with the newest superblock".into(),
                });
            }
        }
        let layout = layout_for(newest.level, newest.member_count as usize)?;
        let bs = newest.block_size_bytes as u64;
        let shape = Shape {
            bs,
            cb: newest.chunk_bytes as u64 / bs,
            stripes: newest.stripes,
            areas: layout.areas(),
            data_offset_blocks: newest.data_offset_blocks,
            journal_offset_blocks: newest.journal_offset_blocks,
            journal_blocks: newest.journal_blocks,
            region_stripes: if newest.intent_region_stripes > 0 {
                newest.intent_region_stripes
            } else {
                default_region_stripes(newest.chunk_bytes)
            },
            volume_blocks: newest.volume_blocks,
        };
        let region_stripes = shape.region_stripes;
        let n = newest.member_count as usize;
        let mut slots: Vec<Slot> = newest
            .members
            .iter()
            .map(|r| Slot {
                uuid: r.uuid.clone(),
                member: None,
                state: r.state,
                rebuild_cp_stripes: r.rebuild_checkpoint_stripes,
                durable_cp_stripes: r.rebuild_checkpoint_stripes,
            })
            .collect();
        let mut spares = Vec::new();
        let mut changed = false;
        let mut taken = vec![false; n];
        // positions a stale member takes back (forced): rebuilt from scratch
        let mut stale_back = Vec::new();
        for (m, sb) in found.iter() {
            check_size(&shape, m)?;
            let stale = stale_of(sb);
            if !stale && sb.generation != newest.generation && !revived.contains(&sb.member_uuid) {
                tracing::warn!(member = %m.name, generation = sb.generation,
                    newest = newest.generation,
                    "member missed the last superblock write (a stop during it); taken as current");
                // written again at the newest generation below
                changed = true;
            }
            let pos = newest
                .members
                .iter()
                .position(|r| r.uuid == sb.member_uuid)
                .or_else(|| {
                    // a stale member that was replaced since: re-add it where it was
                    // if that position is empty now
                    let p = sb.position? as usize;
                    (stale && force && slots[p].state == MemberState::Failed && !taken[p])
                        .then_some(p)
                });
            match pos {
                Some(p) => {
                    if taken[p] {
                        return Err(RaidError::DuplicateMember {
                            member: m.name.clone(),
                            position: p,
                        });
                    }
                    taken[p] = true;
                    let h = MemberHandle::new(m.clone(), sb.member_uuid.clone());
                    let slot = &mut slots[p];
                    slot.uuid = sb.member_uuid.clone();
                    slot.member = Some(h);
                    if stale {
                        slot.state = MemberState::Rebuilding;
                        slot.rebuild_cp_stripes = 0;
                        slot.durable_cp_stripes = 0;
                        changed = true;
                        stale_back.push(p);
                    } else if revived.contains(&sb.member_uuid) {
                        slot.state = MemberState::Active;
                        changed = true;
                    }
                }
                None if newest.spares.contains(&sb.member_uuid) => {
                    spares.push(MemberHandle::new(m.clone(), sb.member_uuid.clone()));
                }
                None if stale && force => {
                    tracing::warn!(member = %m.name, "stale member has no place in the pool; ignored");
                }
                None => {
                    return Err(RaidError::ForeignMember {
                        member: m.name.clone(),
                        pool_uuid,
                    })
                }
            }
        }
        for slot in slots.iter_mut() {
            if slot.member.is_none() && slot.state != MemberState::Failed {
                slot.state = MemberState::Failed;
                changed = true;
            }
        }
        if spares.len() != newest.spares.len() {
            changed = true;
        }
        let checkpoint = found
            .iter()
            .filter(|(_, sb)| sb.generation == newest.generation)
            .map(|(_, sb)| sb.journal_checkpoint_seq)
            .max()
            .unwrap_or(0);
        let mut resync_cursor = newest.resync_cursor_stripes;
        if !newest.clean && layout.scheme() == Scheme::Mirror && newest.intent_region_stripes == 0 {
            // written before write-intent regions: an unclean mirror resyncs fully
            // from the primary copy
            resync_cursor = Some(0);
        }
        let resync_regions: BTreeSet<u64> = if newest.clean || layout.scheme() == Scheme::Striped {
            BTreeSet::new()
        } else {
            newest
                .dirty_regions
                .iter()
                .copied()
                .filter(|&r| r.saturating_mul(region_stripes) < newest.stripes)
                .collect()
        };
        if !resync_regions.is_empty() {
            tracing::info!(pool = %newest.pool_name, regions = resync_regions.len(), "unclean shutdown: resyncing the regions written last");
        }
        let state = State {
            slots,
            spares,
            generation: newest.generation + changed as u64,
            events: found.iter().map(|(_, sb)| sb.events).max().unwrap_or(0),
            resync_cursor,
            resync_durable: resync_cursor.unwrap_or(0),
            journal_checkpoint_seq: checkpoint,
            clean: false,
            rebuild: None,
            rebuild_stalled: None,
            resync: None,
            scrub: None,
            last_scrub: None,
            rebuild_rate_mb_s: newest.rebuild_rate_mb_s,
            intent: BTreeMap::new(),
            intent_seq: 0,
            resync_regions,
            lost: crate::lost::Lost::from_records(&newest.lost_blocks),
            salvage_ready: None,
        };
        let mut inner = Inner::new(
            &newest.pool_name,
            pool_uuid,
            layout,
            newest.chunk_bytes,
            &shape,
            state,
            checkpoint + 1,
        );
        let named: Vec<String> = newest
            .journal_device_uuid
            .iter()
            .chain(newest.journal_device_mirror_uuid.iter())
            .cloned()
            .collect();
        let blank = crate::jdev::attach_existing(
            &mut inner,
            &newest.pool_name,
            &named,
            journal_devices,
            force,
            bs,
        )
        .await?;
        if !inner.is_failed() {
            // A stale member taken back holds journal records of its time,
            // whose sequence numbers were handed out again since it left:
            // scanned with the others, one could stand for a newer,
            // acknowledged record of the same number, or lie above the
            // checkpoint and be replayed over newer data (review of
            // 2026-12-06). Its ring is zeroed before the replay, as a
            // replacement's and a spare's are; failing that, it is failed.
            for p in stale_back {
                let h = inner.state.lock().slots[p].member.clone();
                if let Some(h) = h {
                    if let Err(e) = inner.zero_ring_of(&h.volume).await {
                        tracing::warn!(member = %h.name, error = %e,
                            "the journal ring of a stale member taken back could not be zeroed: member failed");
                        inner.fail_handle(p, &h).await;
                    }
                }
            }
        }
        if !inner.is_failed() {
            inner.replay_journal().await?;
            inner.pull_spares();
            // the replay checkpointed every record: a blank device given in
            // place of a lost twin can join without any copied to it
            crate::jdev::adopt(&mut inner, &newest.pool_name, blank, bs).await?;
        }
        let pool = Pool {
            inner: Arc::new(inner),
        };
        pool.inner.keep_members();
        pool.inner
            .persist()
            .await
            .map_err(|e| RaidError::PoolFailed(format!("writing superblocks: {e}")))?;
        crate::background::spawn_worker(&pool.inner);
        Ok(pool)
    }

    /// Marks a member failed (administratively); a spare, if any, takes its place.
    pub async fn fail_member(&self, position: usize) -> RaidResult<()> {
        let h = {
            let st = self.inner.state.lock();
            let slot = st.slots.get(position).ok_or(RaidError::Position {
                position,
                reason: "no such position".into(),
            })?;
            slot.member.clone()
        };
        if let Some(h) = h {
            self.inner.fail_handle(position, &h).await;
        }
        Ok(())
    }

    /// Puts a new member at a failed position and starts rebuilding it.
    pub async fn replace_member(&self, position: usize, member: Member) -> RaidResult<()> {
        check_size(&self.inner.shape(), &member)?;
        if self.inner.layout.scheme() == Scheme::Striped {
            return Err(RaidError::Position {
                position,
                reason: "raid0 has no redundancy to rebuild from".into(),
            });
        }
        // refused before the disk is touched when the position is not failed
        // (checked again below, under the lock)
        let failed = self
            .inner
            .state
            .lock()
            .slots
            .get(position)
            .is_some_and(|s| s.state == MemberState::Failed);
        if failed {
            self.zero_ring(&member).await?;
        }
        {
            let mut st = self.inner.state.lock();
            // again under the state lock: a grow commits its size under it
            check_size(&self.inner.shape(), &member)?;
            let slot = st.slots.get_mut(position).ok_or(RaidError::Position {
                position,
                reason: "no such position".into(),
            })?;
            if slot.state != MemberState::Failed {
                return Err(RaidError::Position {
                    position,
                    reason: "position is not failed; fail_member it first".into(),
                });
            }
            let uuid = new_uuid();
            slot.uuid = uuid.clone();
            slot.member = Some(MemberHandle::new(member, uuid));
            slot.state = MemberState::Rebuilding;
            slot.rebuild_cp_stripes = 0;
            slot.durable_cp_stripes = 0;
            st.generation += 1;
        }
        self.inner.keep_members();
        self.inner
            .persist()
            .await
            .map_err(|e| RaidError::PoolFailed(e.to_string()))?;
        self.inner.wake.notify_one();
        Ok(())
    }

    /// Zeroes the journal ring of a member about to join (a replacement or a
    /// spare): a disk that was this pool's member before (failed, or left out
    /// of a forced assemble) holds records with its tag, and sequence numbers
    /// after its time are handed out again, so a later replay could take a
    /// stale record of its ring for the new one of the same number.
    async fn zero_ring(&self, member: &Member) -> RaidResult<()> {
        self.inner
            .zero_ring_of(&member.volume)
            .await
            .map_err(|source| RaidError::Member {
                member: member.name.clone(),
                source,
            })
    }

    /// Adds a hot spare; it is pulled in at once if a position is failed.
    pub async fn add_spare(&self, member: Member) -> RaidResult<()> {
        check_size(&self.inner.shape(), &member)?;
        self.zero_ring(&member).await?;
        {
            let mut st = self.inner.state.lock();
            // again under the state lock: a grow commits its size under it
            check_size(&self.inner.shape(), &member)?;
            st.spares.push(MemberHandle::new(member, new_uuid()));
            st.generation += 1;
        }
        self.inner.keep_members();
        self.inner.pull_spares();
        self.inner
            .persist()
            .await
            .map_err(|e| RaidError::PoolFailed(e.to_string()))?;
        self.inner.wake.notify_one();
        Ok(())
    }

    /// Sends whole-stripe writes of a parity pool through the stripe journal as
    /// well (off by default). Without it, a whole-stripe write in flight at a crash
    /// may leave its blocks neither old nor new if a member is lost before the
    /// region's resync completes; with it, they read as old or new in every case,
    /// at the cost of writing every whole stripe twice (journal, then in place).
    /// Not persisted: the configuration sets it at every start.
    pub fn set_journal_whole_stripes(&self, on: bool) {
        self.inner.journal_whole.store(on, Ordering::SeqCst);
    }

    /// The journal devices the configuration names, by name: the status lists
    /// those not serving (`journal_devices_missing`), so an operator hears that a
    /// mirrored journal runs on one device even after the superblocks stopped
    /// naming the lost one. Not persisted: the configuration sets it at every
    /// start.
    pub fn set_journal_devices_configured(&self, names: Vec<String>) {
        *self.inner.journal_configured.lock() = names;
    }

    /// Test-only: stripe updates of a parity pool skip the stripe journal while
    /// `on` (the unprotected read-modify-write, for measuring what the journal
    /// costs; a crash in the meantime reopens the write hole). Not persisted.
    #[doc(hidden)]
    pub fn unsafe_set_journal_bypass(&self, on: bool) {
        self.inner.journal_bypass.store(on, Ordering::SeqCst);
    }

    /// Test and measurement only: `false` acknowledges a journaled update only
    /// after its in-place writes (the behaviour before early acknowledgement, see
    /// `commit.rs`), to measure what early acknowledgement gains. Not persisted.
    #[doc(hidden)]
    pub fn set_early_ack(&self, on: bool) {
        self.inner.early_ack.store(on, Ordering::SeqCst);
    }

    /// Data-first journal records (default on; see `commit.rs`): a partial
    /// update of a healthy stripe is acknowledged once its new data is
    /// journaled, and its reads, parity and in-place writes follow, so the
    /// members' queues run deep. `false` reads first, then journals the whole
    /// update, then acknowledges. Deep queues gain with NCQ disks on a bare
    /// pool and cost behind a write-back cache, whose misses are reads that
    /// wait behind them (docs/0002-raid.md). Not persisted: the owner sets it
    /// at every start.
    pub fn set_data_first(&self, on: bool) {
        self.inner.data_first.store(on, Ordering::SeqCst);
    }

    /// Members a journal batch on the members is written to beyond the
    /// `redundancy + 1` it needs, while the members reorder their queues
    /// (default 3, `JOURNAL_SPARE_COPIES`; see `commit.rs`, "A spare copy"): the batch is durable once
    /// any `redundancy + 1` of its copies are, so a copy stuck behind a deep
    /// NCQ queue does not hold the acknowledgement. Members that answer in
    /// order (FIFO disks) get no spare. 0 writes exactly `redundancy + 1`
    /// copies (for measurements); `SpareWhen::Always` writes the spares also
    /// to members that answer in order. Not persisted.
    pub fn set_journal_spare_copies(&self, n: usize, when: crate::SpareWhen) {
        self.inner.journal_spares.store(n, Ordering::SeqCst);
        self.inner
            .spare_always
            .store(when == crate::SpareWhen::Always, Ordering::SeqCst);
    }

    /// Whether the records completing data-first updates ride the next group
    /// commit beside other records (default on; see `commit.rs`, "Completing
    /// records ride the next group commit"), or each batch's completing
    /// records take a ring write of their own into the slots set aside behind
    /// it (`false`; for measurements and tests). Not persisted.
    pub fn set_completions_ride(&self, on: bool) {
        self.inner.completions_ride.store(on, Ordering::SeqCst);
    }

    /// Changes the rebuild/resync/scrub cap (MB/s, 0 = none) and persists it.
    pub async fn set_rebuild_rate_mb_s(&self, rate_mb_s: u32) -> RaidResult<()> {
        self.inner.state.lock().rebuild_rate_mb_s = rate_mb_s;
        self.inner
            .persist()
            .await
            .map_err(|e| RaidError::PoolFailed(e.to_string()))
    }

    /// Orderly stop: flushes members, checkpoints the journal, marks the
    /// superblocks clean (unless regions a crash left still await their
    /// resync) and stops background tasks. I/O after this still works but
    /// marks the pool unclean again only at the next assemble.
    pub async fn shutdown(&self) -> RaidResult<()> {
        self.inner.closed.store(true, Ordering::SeqCst);
        self.inner.wake.notify_one();
        self.inner
            .checkpoint_all()
            .await
            .map_err(|e| RaidError::PoolFailed(e.to_string()))?;
        {
            // every member is flushed: whole-stripe writes are consistent on
            // disk, except in the regions a crash left that have not been
            // resynced yet: those stay listed, and the pool unclean, so that
            // the next assemble resyncs them (marked clean, it dropped them)
            let mut st = self.inner.state.lock();
            st.clean = st.resync_regions.is_empty();
            st.intent.retain(|_, r| r.inflight > 0);
            st.intent_seq += 1;
        }
        // (with the rebuild checkpoints as they stand now: flushed again first)
        self.inner
            .flush_then_persist()
            .await
            .map_err(|e| RaidError::PoolFailed(e.to_string()))
    }

    /// Waits until every update acknowledged before its in-place writes has
    /// been written in place (a flush does not: their records make them
    /// durable); for tests and tools that count member writes.
    pub async fn wait_applied(&self) {
        self.inner.wait_applied().await;
    }

    /// Waits (polling) until no rebuild or resync is pending; for tests and tools.
    pub async fn wait_idle(&self) {
        loop {
            let busy = {
                let st = self.inner.state.lock();
                st.slots.iter().any(|s| s.state == MemberState::Rebuilding)
                    || st.resync_cursor.is_some()
                    || !st.resync_regions.is_empty()
            };
            if !busy || self.inner.is_failed() {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(2)).await;
        }
    }

    /// The pool's status.
    pub fn status(&self) -> PoolStatus {
        self.inner.status()
    }

    /// The chunk layout of this pool.
    pub fn layout(&self) -> &dyn Layout {
        self.inner.layout.as_ref()
    }

    /// Bytes before the data area on every member (superblocks + journal); member
    /// block `data_offset + x` holds data-area block `x`.
    pub fn data_offset_bytes(&self) -> u64 {
        self.inner.data_offset_blocks * self.inner.bs
    }
}

/// Stripes per write-intent region: 64 MiB of every member.
fn default_region_stripes(chunk_bytes: u32) -> u64 {
    (crate::fullstripe::REGION_MEMBER_BYTES / chunk_bytes.max(1) as u64).max(1)
}

/// With `force`: the members `found` whose loss failed the pool at its last
/// change (see the assembly): named failed by `newest`, their own superblock
/// one generation behind it; empty unless the pool has failed and taking them
/// back makes it survive.
fn revivable(
    newest: &Superblock,
    found: &[(Member, Superblock)],
    layout: &dyn Layout,
) -> BTreeSet<String> {
    let missing = |back: &BTreeSet<String>| -> Vec<bool> {
        newest
            .members
            .iter()
            .map(|r| match r.state {
                MemberState::Active => false,
                MemberState::Rebuilding => r.rebuild_checkpoint_stripes < newest.stripes,
                _ => !back.contains(&r.uuid),
            })
            .collect()
    };
    if survives(layout, &missing(&BTreeSet::new())) {
        return BTreeSet::new();
    }
    let back: BTreeSet<String> = found
        .iter()
        .filter(|(_, sb)| sb.generation.checked_add(1) == Some(newest.generation))
        // and whole when it failed: its own superblock names it active (a
        // member still being rebuilt holds junk past its checkpoint; review
        // of 2026-12-06: a rebuilding spare failed with the member beside it
        // was taken back whole)
        .filter(|(_, sb)| {
            sb.members.iter().any(|r| {
                r.uuid == sb.member_uuid
                    && match r.state {
                        MemberState::Active => true,
                        MemberState::Rebuilding => r.rebuild_checkpoint_stripes >= newest.stripes,
                        _ => false,
                    }
            })
        })
        .filter(|(_, sb)| {
            newest
                .members
                .iter()
                .any(|r| r.uuid == sb.member_uuid && r.state == MemberState::Failed)
        })
        .map(|(_, sb)| sb.member_uuid.clone())
        .collect();
    if back.is_empty() || !survives(layout, &missing(&back)) {
        return BTreeSet::new();
    }
    back
}

fn check_size(shape: &Shape, m: &Member) -> RaidResult<()> {
    let g = m.volume.geometry();
    if g.block_size_bytes as u64 != shape.bs {
        return Err(RaidError::Config(format!(
            "member {} has block size {}, pool uses {}",
            m.name, g.block_size_bytes, shape.bs
        )));
    }
    if g.block_count < shape.data_offset_blocks + shape.areas * shape.stripes * shape.cb {
        return Err(RaidError::Config(format!(
            "member {} is too small ({} blocks)",
            m.name, g.block_count
        )));
    }
    Ok(())
}

impl Inner {
    fn new(
        name: &str,
        uuid: String,
        layout: Box<dyn Layout>,
        chunk_bytes: u32,
        shape: &Shape,
        state: State,
        next_seq: u64,
    ) -> Inner {
        let parity = matches!(layout.scheme(), Scheme::Parity { .. });
        let k = layout.data_chunks() as u64;
        let volatile = state
            .slots
            .iter()
            .filter_map(|s| s.member.as_ref())
            .any(|h| h.volume.geometry().volatile_cache);
        let thin = state
            .slots
            .iter()
            .filter_map(|s| s.member.as_ref())
            .all(|h| h.volume.geometry().thin);
        let block_count = shape.volume_blocks.unwrap_or(shape.stripes * shape.cb * k);
        let lost_any = !state.lost.is_empty();
        let geometry_base = Geometry {
            block_size_bytes: shape.bs as u32,
            block_count,
            thin,
            volatile_cache: volatile,
            optimal_io_blocks: (shape.cb * k).min(u32::MAX as u64) as u32,
            max_io_blocks: ((8u64 << 20) / shape.bs) as u32,
        };
        Inner {
            name: name.to_string(),
            pool_tag: uuid_tag(&uuid),
            uuid,
            layout,
            chunk_bytes,
            bs: shape.bs,
            cb: shape.cb,
            stripes: AtomicU64::new(shape.stripes),
            data_offset_blocks: shape.data_offset_blocks,
            journal_offset_blocks: shape.journal_offset_blocks,
            journal_blocks: shape.journal_blocks,
            journal: (parity && shape.journal_blocks > 0)
                .then(|| Journal::new(shape.journal_offset_blocks, shape.journal_blocks, next_seq)),
            geometry_base,
            block_count: AtomicU64::new(block_count),
            sb_blocks: AtomicU64::new(block_count),
            grow_lock: tokio::sync::Mutex::new(()),
            state: Mutex::new(state),
            sb_lock: tokio::sync::Mutex::new(()),
            locks: (0..STRIPE_LOCKS)
                .map(|_| Arc::new(tokio::sync::RwLock::new(())))
                .collect(),
            applying: Mutex::new(Default::default()),
            apply_budget: Arc::new(tokio::sync::Semaphore::new(
                crate::commit::APPLY_BUDGET_KIB as usize,
            )),
            early_ack: AtomicBool::new(true),
            data_first: AtomicBool::new(true),
            data_first_backlog: Arc::new(tokio::sync::Semaphore::new(
                crate::commit::DATA_FIRST_BACKLOG,
            )),
            journal_spares: std::sync::atomic::AtomicUsize::new(
                crate::commit::JOURNAL_SPARE_COPIES,
            ),
            spare_always: AtomicBool::new(false),
            completions_ride: AtomicBool::new(true),
            spare_verdict: Default::default(),
            checkpoint_running: AtomicBool::new(false),
            fg_inflight: AtomicU64::new(0),
            wake: Arc::new(tokio::sync::Notify::new()),
            closed: AtomicBool::new(false),
            scrub_running: AtomicBool::new(false),
            region_stripes: shape.region_stripes.max(1),
            durable_intent_seq: AtomicU64::new(0),
            needed_gen: AtomicU64::new(0),
            needed_intent: AtomicU64::new(0),
            durable_gen: AtomicU64::new(0),
            gather: Mutex::new(Default::default()),
            intent_off: false,
            journal_whole: AtomicBool::new(false),
            journal_configured: Mutex::new(Vec::new()),
            full_writes: AtomicU64::new(0),
            unflushed_whole: Mutex::new(Default::default()),
            flushes_started: AtomicU64::new(0),
            partial_writes: AtomicU64::new(0),
            gather_timeouts: AtomicU64::new(0),
            gather_passed: AtomicU64::new(0),
            stripe_writes: AtomicU64::new(0),
            epoch: std::time::Instant::now(),
            last_write_ns: AtomicU64::new(0),
            write_ewma_ns: AtomicU64::new(0),
            wp: Default::default(),
            journal_bypass: AtomicBool::new(false),
            journal_devs: Vec::new(),
            lost_any: AtomicBool::new(lost_any),
            lost_epoch: AtomicU64::new(0),
            #[cfg(test)]
            before_reserve: Mutex::new(None),
            #[cfg(test)]
            budget_wait: tokio::sync::Notify::new(),
        }
    }

    fn shape(&self) -> Shape {
        Shape {
            bs: self.bs,
            cb: self.cb,
            stripes: self.stripes(),
            areas: self.layout.areas(),
            data_offset_blocks: self.data_offset_blocks,
            journal_offset_blocks: self.journal_offset_blocks,
            journal_blocks: self.journal_blocks,
            region_stripes: self.region_stripes,
            volume_blocks: self.volume_blocks(),
        }
    }

    /// Rows of the grid: stripes per member area (grows, never shrinks).
    pub fn stripes(&self) -> u64 {
        self.stripes.load(Ordering::SeqCst)
    }

    /// The pool's geometry now (the block count grows when a grow is durable).
    pub fn geometry(&self) -> Geometry {
        Geometry {
            block_count: self.block_count.load(Ordering::SeqCst),
            ..self.geometry_base
        }
    }

    /// Blocks the pool exposes when fewer than its stripes hold (the superblock's
    /// `volume_blocks`), else `None`.
    pub fn volume_blocks(&self) -> Option<u64> {
        let v = self.sb_blocks.load(Ordering::SeqCst);
        (v != self.stripes() * self.cb * self.layout.data_chunks() as u64).then_some(v)
    }

    /// The lock ordering writes (and reconstructing reads) of a stripe.
    pub fn lock_for(&self, stripe: u64) -> &Arc<tokio::sync::RwLock<()>> {
        &self.locks[(stripe % STRIPE_LOCKS as u64) as usize]
    }

    /// True when more members are gone than the level tolerates. A member
    /// still being rebuilt counts as gone: it lacks the stripes above its
    /// checkpoint, so with it and one more member gone those stripes have too
    /// few complete members (a RAID 1 whose only complete copy fails during a
    /// rebuild has failed; it used to go on, acknowledging writes above the
    /// checkpoint that no read could return).
    pub fn is_failed(&self) -> bool {
        let missing = Self::missing(&self.state.lock(), self.stripes());
        !survives(self.layout.as_ref(), &missing)
    }

    /// Which positions count as gone (see [`Inner::is_failed`]).
    pub(crate) fn missing(st: &State, stripes: u64) -> Vec<bool> {
        st.slots
            .iter()
            .map(|s| match s.state {
                MemberState::Active => false,
                MemberState::Rebuilding => s.rebuild_cp_stripes < stripes,
                _ => true,
            })
            .collect()
    }

    /// A snapshot of which members may be read and written; an error when the pool
    /// has failed.
    pub fn view(&self) -> BlockResult<View> {
        if self.is_failed() {
            return Err(BlockError::Unavailable(format!(
                "pool {} has failed: too many members lost",
                self.name
            )));
        }
        let st = self.state.lock();
        let l = self.layout.as_ref();
        Ok(View {
            slots: (0..l.positions())
                .map(|p| {
                    let s = &st.slots[l.member_of(p)];
                    match (&s.member, s.state) {
                        (Some(h), MemberState::Active) => Some((h.clone(), u64::MAX)),
                        (Some(h), MemberState::Rebuilding) => {
                            Some((h.clone(), s.rebuild_cp_stripes))
                        }
                        _ => None,
                    }
                })
                .collect(),
            area_blocks: self.stripes() * self.cb,
            members: l.member_count(),
        })
    }

    /// True while stripe `s` has not been made consistent by the initial resync.
    pub fn is_uninit(&self, s: u64) -> bool {
        let st = self.state.lock();
        st.resync_cursor.is_some_and(|c| s >= c)
            || (!st.resync_regions.is_empty()
                && st.resync_regions.contains(&(s / self.region_stripes)))
    }

    /// Replaces failed positions with hot spares (state rebuilding); the caller persists.
    pub fn pull_spares(&self) -> bool {
        if self.layout.scheme() == Scheme::Striped {
            return false;
        }
        let mut st = self.state.lock();
        let mut pulled = false;
        for i in 0..st.slots.len() {
            if st.slots[i].state == MemberState::Failed {
                let Some(sp) = st.spares.pop() else { break };
                tracing::info!(pool = %self.name, position = i, spare = %sp.name, "hot spare pulled in");
                let slot = &mut st.slots[i];
                slot.uuid = sp.uuid.clone();
                slot.member = Some(sp);
                slot.state = MemberState::Rebuilding;
                slot.rebuild_cp_stripes = 0;
                slot.durable_cp_stripes = 0;
                pulled = true;
            }
        }
        if pulled {
            st.generation += 1;
            drop(st);
            self.wake.notify_one();
        }
        pulled
    }

    /// Marks the member `h` at `pos` (a member position, or a grid position that
    /// maps to it) failed (if it is still there), pulls a spare, and persists the
    /// new generation on the survivors.
    pub async fn fail_handle(&self, pos: usize, h: &Arc<MemberHandle>) {
        let pos = self.layout.member_of(pos);
        {
            let mut st = self.state.lock();
            let Some(slot) = st.slots.get_mut(pos) else {
                return;
            };
            let same = slot.member.as_ref().is_some_and(|m| Arc::ptr_eq(m, h));
            if !same || slot.state == MemberState::Failed {
                return;
            }
            tracing::warn!(pool = %self.name, position = pos, member = %h.name, "member failed");
            slot.state = MemberState::Failed;
            st.generation += 1;
            self.needed_gen.fetch_max(st.generation, Ordering::SeqCst);
            if !st.resync_regions.is_empty() && self.layout.scheme() != Scheme::Striped {
                tracing::warn!(
                    pool = %self.name,
                    regions = st.resync_regions.len(),
                    "member lost before the post-crash resync finished: blocks under \
                     whole-stripe writes in flight at the crash may read as neither old \
                     nor new in these regions (acknowledged data is intact)"
                );
            }
        }
        self.pull_spares();
        if let Err(e) = self.persist().await {
            tracing::error!(pool = %self.name, error = %e, "could not persist member failure");
        }
    }

    fn superblock_for(&self, st: &State, position: Option<u32>, uuid: &str) -> Superblock {
        Superblock {
            pool_uuid: self.uuid.clone(),
            pool_name: self.name.clone(),
            level: self.layout.level(),
            chunk_bytes: self.chunk_bytes,
            block_size_bytes: self.bs as u32,
            member_count: st.slots.len() as u32,
            position,
            member_uuid: uuid.to_string(),
            members: st
                .slots
                .iter()
                .map(|s| MemberRecord {
                    uuid: s.uuid.clone(),
                    state: s.state,
                    rebuild_checkpoint_stripes: s.rebuild_cp_stripes.min(s.durable_cp_stripes),
                })
                .collect(),
            spares: st.spares.iter().map(|s| s.uuid.clone()).collect(),
            generation: st.generation,
            events: st.events,
            data_offset_blocks: self.data_offset_blocks,
            stripes: self.stripes(),
            journal_offset_blocks: self.journal_offset_blocks,
            journal_blocks: self.journal_blocks,
            journal_checkpoint_seq: st.journal_checkpoint_seq,
            resync_cursor_stripes: st.resync_cursor.map(|c| c.min(st.resync_durable)),
            clean: st.clean,
            rebuild_rate_mb_s: st.rebuild_rate_mb_s,
            intent_region_stripes: self.region_stripes,
            dirty_regions: Inner::dirty_regions(st),
            journal_device_uuid: self.journal_devices().first().map(|d| d.h.uuid.clone()),
            journal_device_mirror_uuid: self.journal_devices().get(1).map(|d| d.h.uuid.clone()),
            volume_blocks: self.volume_blocks(),
            lost_blocks: st.lost.records(),
        }
    }

    /// Writes the current state to the superblock of every attached member and
    /// spare (FUA). A member whose superblock write fails is failed in turn; an
    /// error means no member could be written or the pool has failed.
    pub async fn persist(&self) -> BlockResult<()> {
        let _g = self.sb_lock.lock().await;
        self.persist_locked().await
    }

    /// Returns once every member failure known so far is recorded in the
    /// superblocks (persisting them if no one has yet). A write that skipped a
    /// failed member is acknowledged only after this: acknowledged before, a
    /// crash could bring that member back as active with the write missing
    /// (its superblock still saying so), and reads or the resync after the
    /// crash take its stale blocks. The failure's own caller persists it, but
    /// later writes did not wait for that, nor did anyone persist it if that
    /// caller was dropped while waiting for the superblock lock.
    pub async fn failures_durable(&self) -> BlockResult<()> {
        let (want, want_intent) = (
            self.needed_gen.load(Ordering::SeqCst),
            self.needed_intent.load(Ordering::SeqCst),
        );
        let on_disk = || {
            self.durable_gen.load(Ordering::SeqCst) >= want
                && self.durable_intent_seq.load(Ordering::SeqCst) >= want_intent
        };
        if on_disk() {
            return Ok(());
        }
        let _g = self.sb_lock.lock().await;
        if on_disk() {
            return Ok(());
        }
        self.persist_locked().await
    }

    /// [`Inner::persist`] for a caller holding `sb_lock`.
    pub async fn persist_locked(&self) -> BlockResult<()> {
        loop {
            let (targets, intent_seq, generation): (Vec<SbTarget>, u64, u64) = {
                let mut st = self.state.lock();
                st.events += 1;
                let mut t = Vec::new();
                for (i, s) in st.slots.iter().enumerate() {
                    if let (Some(h), MemberState::Active | MemberState::Rebuilding) =
                        (&s.member, s.state)
                    {
                        t.push((
                            Some(i),
                            h.clone(),
                            self.superblock_for(&st, Some(i as u32), &h.uuid),
                        ));
                    }
                }
                for sp in &st.spares {
                    t.push((None, sp.clone(), self.superblock_for(&st, None, &sp.uuid)));
                }
                (t, st.intent_seq, st.generation)
            };
            if targets.is_empty() {
                return Err(BlockError::Unavailable(
                    "no member left to hold a superblock".into(),
                ));
            }
            let futs: Vec<BoxFut<'_, BlockResult<u64>>> = targets
                .iter()
                .map(|(_, h, sb)| -> BoxFut<'_, BlockResult<u64>> {
                    Box::pin(async move {
                        let r = superblock::write(
                            &h.volume,
                            sb,
                            h.lost_both_slots.load(Ordering::SeqCst),
                        )
                        .await;
                        h.writes.fetch_add(1, Ordering::Relaxed);
                        if let Ok(n) = &r {
                            h.written_bytes.fetch_add(*n, Ordering::Relaxed);
                        }
                        r
                    })
                })
                .collect();
            let results = join_all(futs).await;
            let mut any_failed = false;
            for ((_, h, sb), r) in targets.iter().zip(&results) {
                if r.is_ok() {
                    h.lost_both_slots
                        .store(!sb.lost_blocks.is_empty(), Ordering::SeqCst);
                }
            }
            {
                let mut st = self.state.lock();
                for ((pos, h, _), r) in targets.iter().zip(&results) {
                    if r.is_err() {
                        h.errors.fetch_add(1, Ordering::Relaxed);
                        any_failed = true;
                        match pos {
                            Some(p) => {
                                let slot = &mut st.slots[*p];
                                if slot.member.as_ref().is_some_and(|m| Arc::ptr_eq(m, h)) {
                                    slot.state = MemberState::Failed;
                                }
                            }
                            None => st.spares.retain(|s| !Arc::ptr_eq(s, h)),
                        }
                        st.generation += 1;
                        self.needed_gen.fetch_max(st.generation, Ordering::SeqCst);
                    }
                }
            }
            if any_failed {
                // a member failed here, by a superblock write (a write
                // intent's, say: the first write a mirror sends a disk
                // that stopped answering), is failed as anywhere else: a
                // hot spare takes its place (persisted by the next turn)
                self.pull_spares();
            }
            if !any_failed {
                self.durable_intent_seq
                    .fetch_max(intent_seq, Ordering::SeqCst);
                self.durable_gen.fetch_max(generation, Ordering::SeqCst);
                return Ok(());
            }
            if self.is_failed() {
                return Err(BlockError::Unavailable(format!(
                    "pool {} failed while writing superblocks",
                    self.name
                )));
            }
        }
    }

    /// Flushes every writable member; a member that fails the flush is failed.
    pub async fn flush_members(&self) -> BlockResult<()> {
        // whole-stripe writes that ended before this flush began are durable
        // once it has (a failed member is failed below: the others hold them)
        let started = self.flushes_started.fetch_add(1, Ordering::AcqRel);
        let view = self.view()?;
        let handles = view.member_handles();
        let futs: Vec<BoxFut<'_, BlockResult<()>>> = handles
            .iter()
            .map(|(_, h)| -> BoxFut<'_, BlockResult<()>> { Box::pin(h.volume.flush()) })
            .collect();
        let results = join_all(futs).await;
        for ((i, h), r) in handles.iter().zip(results) {
            if r.is_err() {
                h.errors.fetch_add(1, Ordering::Relaxed);
                self.fail_handle(*i, h).await;
            }
        }
        (self.unflushed_whole.lock()).retain(|_, &mut at| at > started);
        self.view().map(|_| ())
    }

    /// Checkpoints every completed journal record (flush + persist).
    pub async fn checkpoint_all(&self) -> BlockResult<()> {
        let Some(j) = &self.journal else {
            return self.flush_members().await;
        };
        let mut a = j.alloc.lock().await;
        let upto = a.next_seq.saturating_sub(1);
        self.checkpoint(upto).await?;
        a.live.clear();
        a.head_blocks = 0;
        Ok(())
    }

    /// Makes every record `<= upto` durable in place and persists `upto` as the
    /// journal checkpoint. The caller frees the ring space of those records
    /// afterwards (under the alloc lock); checkpoints may run concurrently (the
    /// persisted sequence only grows, and only records already in place are
    /// covered).
    pub async fn checkpoint(&self, upto: u64) -> BlockResult<()> {
        if let Some(j) = &self.journal {
            self.refuse_riding(upto);
            j.wait_done(upto).await;
        }
        self.flush_members().await?;
        {
            let mut st = self.state.lock();
            st.journal_checkpoint_seq = st.journal_checkpoint_seq.max(upto);
        }
        self.persist().await?;
        if let Some(j) = &self.journal {
            j.forget_upto(upto);
        }
        Ok(())
    }

    /// Replays journal records newer than the checkpoint (assemble, parity levels).
    async fn replay_journal(&self) -> RaidResult<()> {
        let Some(j) = &self.journal else {
            return Ok(());
        };
        let checkpoint = self.state.lock().journal_checkpoint_seq;
        let view = self
            .view()
            .map_err(|e| RaidError::PoolFailed(e.to_string()))?;
        let mut records = BTreeMap::new();
        let step_blocks = ((1u64 << 20) / self.bs).max(1);
        // a superblock claiming a ring larger than any the pool makes is
        // refused, not read
        const RING_BYTES_MAX: u64 = 4 << 30;
        if j.ring_blocks.saturating_mul(self.bs) > RING_BYTES_MAX {
            return Err(RaidError::PoolFailed(format!(
                "the superblock's journal ring of {} blocks is larger than any pool makes",
                j.ring_blocks
            )));
        }
        // (member ring or not: the journal device's ring is the only copy of
        // its records)
        let mut rings: Vec<(Arc<MemberHandle>, u64, Option<usize>)> = view
            .member_handles()
            .into_iter()
            .map(|(i, h)| (h, j.offset_blocks, Some(i)))
            .collect();
        for d in self.journal_devices() {
            rings.push((d.h.clone(), d.ring_offset_blocks, None));
        }
        let (mut jdev_errors, mut jdev_read) = (Vec::new(), 0usize);
        let mut unread: Vec<(usize, Arc<MemberHandle>)> = Vec::new();
        // The rings are read together, and scanned piece by piece as they
        // are read (`journal::Scanner`: the same records as a scan of the
        // whole image, only those above the checkpoint kept): one ring after
        // the other, a start read 10 x 256 MiB from HDDs in turn, and held
        // each ring whole in memory. A scanner holds up to the largest record
        // and a piece, so as many rings go together as keep that under
        // `SCAN_BYTES_MAX` (every ring at once for the usual chunks).
        const SCAN_BYTES_MAX: u64 = 256 << 20;
        let (bs, pool_tag, ring_blocks) = (self.bs as usize, self.pool_tag, j.ring_blocks);
        let max_rec = journal::max_record_blocks(self.layout.member_count(), self.cb, bs);
        let per_ring = (max_rec + 2 * step_blocks).saturating_mul(self.bs);
        let together = (SCAN_BYTES_MAX / per_ring.max(1)).max(1) as usize;
        let mut results = Vec::with_capacity(rings.len());
        for group in rings.chunks(together) {
            // (with whether sectors of the ring could not be read)
            let reads: Vec<BoxFut<'_, BlockResult<RingScan>>> = group
                .iter()
                .map(|(h, ring_at, _)| {
                    let (h, ring_at) = (h.clone(), *ring_at);
                    Box::pin(async move {
                        let mut scanner = journal::Scanner::new(bs, pool_tag, max_rec, checkpoint);
                        let mut at = 0u64;
                        let mut holes = false;
                        while at < ring_blocks {
                            let n = step_blocks.min(ring_blocks - at);
                            match h.volume.read(ring_at + at, n as u32).await {
                                Ok(b) => scanner.push(&b),
                                // A sector that cannot be read costs the
                                // records on it, not the ring: read again
                                // block by block, an unreadable one as zeroes
                                // (no record), so that the records elsewhere
                                // on it, maybe the only copy left of an
                                // acknowledged write, are replayed (review
                                // of 2026-12-06: the whole ring was dropped).
                                Err(BlockError::Medium { .. }) => {
                                    let mut piece = Vec::with_capacity(n as usize * bs);
                                    for k in 0..n {
                                        match h.volume.read(ring_at + at + k, 1).await {
                                            Ok(b) => piece.extend_from_slice(&b),
                                            Err(BlockError::Medium { .. }) => {
                                                holes = true;
                                                piece.resize(piece.len() + bs, 0);
                                            }
                                            Err(e) => return Err(e),
                                        }
                                    }
                                    scanner.push(&piece);
                                }
                                Err(e) => return Err(e),
                            }
                            at += n;
                        }
                        Ok((scanner.finish(), holes))
                    }) as BoxFut<'_, _>
                })
                .collect();
            results.extend(join_all(reads).await);
        }
        for ((h, _, member), result) in rings.into_iter().zip(results) {
            // a journal device's ring is the only copy of its records: one
            // with sectors it cannot read counts as unreadable (below)
            let result = match result {
                Ok((_, true)) if member.is_none() => Err(BlockError::Unavailable(
                    "sectors of its journal ring cannot be read".into(),
                )),
                r => r,
            };
            let found = match result {
                Ok((found, holes)) => {
                    if holes {
                        tracing::warn!(ring = %h.name,
                            "journal ring partly unreadable: the records elsewhere on it are replayed");
                        // zeroed after the replay, as an unreadable ring
                        if let Some(i) = member {
                            unread.push((i, h.clone()));
                        }
                    }
                    found
                }
                Err(e) => {
                    if member.is_some() {
                        tracing::warn!(member = %h.name, error = %e, "journal unreadable on member");
                    } else {
                        tracing::warn!(device = %h.name, error = %e, "journal device unreadable");
                        jdev_errors.push(format!("{}: {e}", h.name));
                    }
                    // A member whose ring cannot be read may hold records this
                    // replay does not see, with sequence numbers it will hand out
                    // again: a later replay would take such a stale record for the
                    // new one of the same number. Its ring is zeroed once this
                    // replay is checkpointed (the member is failed only if that
                    // fails: one bad sector in the ring is no reason to lose it).
                    if let Some(i) = member {
                        unread.push((i, h.clone()));
                    }
                    continue;
                }
            };
            if member.is_none() {
                jdev_read += 1;
            }
            // (in ring order, as before: a sequence number found twice keeps
            // the copy of the last ring)
            for rec in found {
                if rec.seq > checkpoint {
                    records.insert(rec.seq, rec);
                }
            }
        }
        // the journal devices' rings are the only copy of their records: with
        // none readable, replaying without them (and storing the checkpoint
        // after) would lose them for good; refused, so that a later assemble,
        // or a forced one that gives them up, decides
        if !jdev_errors.is_empty() && jdev_read == 0 {
            return Err(RaidError::PoolFailed(format!(
                "the journal device is unreadable ({}): its records cannot be replayed",
                jdev_errors.join("; ")
            )));
        }
        let mut max_seq = records.keys().next_back().copied().unwrap_or(checkpoint);
        if !records.is_empty() {
            tracing::info!(pool = %self.name, records = records.len(), "replaying stripe journal");
        }
        // Whole updates in sequence order; a data-first record only when no
        // record completes it (then nothing of its update was written in
        // place), after them: see `resolve_data_first`.
        let completed: std::collections::HashSet<u64> =
            records.values().filter_map(|r| r.completes()).collect();
        // An open data-first record with a later record of its stripe was
        // written in place, or given up, before that later update took the
        // stripe (its stripe's lock is held until then, and the normal path
        // writes its completing record first): resolved after the whole
        // updates, it would write its older data over theirs.
        let stripe_of = |e: &journal::Entry| e.member_lba / self.cb;
        // the newest record of every stripe (one pass: the records are in
        // sequence order)
        let mut newest: std::collections::HashMap<u64, u64> = std::collections::HashMap::new();
        for r in records.values() {
            for e in &r.entries {
                newest.insert(stripe_of(e), r.seq);
            }
        }
        let superseded = |rec: &journal::Record| {
            rec.entries
                .first()
                .map(stripe_of)
                .and_then(|s| newest.get(&s))
                .is_some_and(|&last| last > rec.seq)
        };
        let mut open = Vec::new();
        for rec in records.values() {
            if rec.is_data_first() {
                if completed.contains(&rec.seq) {
                    continue;
                }
                if superseded(rec) {
                    tracing::warn!(pool = %self.name, seq = rec.seq,
                        "a data-first journal record without its completing record, its stripe written again later: left out");
                    continue;
                }
                open.push(rec);
                continue;
            }
            self.replay_entries(&view, &rec.entries, &rec.payloads)
                .await;
        }
        if !open.is_empty() {
            let live: Vec<(u64, u64, u64)> = records
                .values()
                .map(|r| (r.seq, r.at, r.at + r.blocks))
                .collect();
            max_seq = self
                .resolve_data_first(&open, &live, checkpoint, max_seq)
                .await
                .map_err(|e| RaidError::PoolFailed(e.to_string()))?;
        }
        {
            let mut a = j.alloc.lock().await;
            a.next_seq = max_seq + 1;
            a.head_blocks = 0;
            a.live.clear();
        }
        self.checkpoint(max_seq)
            .await
            .map_err(|e| RaidError::PoolFailed(e.to_string()))?;
        for (i, h) in unread {
            if let Err(e) = self.zero_ring_of(&h.volume).await {
                tracing::warn!(member = %h.name, error = %e,
                    "its unreadable journal ring could not be zeroed either: member failed");
                self.fail_handle(i, &h).await;
            }
        }
        Ok(())
    }

    /// Zeroes the journal ring on `vol` (a member's) and flushes it.
    pub(crate) async fn zero_ring_of(&self, vol: &VolumeRef) -> BlockResult<()> {
        let Some(j) = &self.journal else {
            return Ok(());
        };
        let bs = self.bs;
        let step = ((1u64 << 20) / bs).max(1);
        let zeros = Bytes::from(vec![0u8; (step * bs) as usize]);
        let mut at = 0;
        while at < j.ring_blocks {
            let n = step.min(j.ring_blocks - at);
            vol.write(
                j.offset_blocks + at,
                zeros.slice(..(n * bs) as usize),
                false,
            )
            .await?;
            at += n;
        }
        vol.flush().await
    }

    /// Writes the entries of a replayed record in place (members that fail
    /// are failed).
    async fn replay_entries(&self, view: &View, entries: &[journal::Entry], payloads: &[Vec<u8>]) {
        for (e, p) in entries.iter().zip(payloads) {
            let pos = e.position as usize;
            if pos >= view.slots.len()
                || e.member_lba.saturating_add(e.blocks as u64) > self.stripes() * self.cb
            {
                continue;
            }
            let Some(h) = view.writable(pos) else {
                continue;
            };
            let lba = self.data_offset_blocks + e.member_lba;
            let r = if e.discard {
                // (reads as zeroes on a thick member too: see `m_op`)
                h.volume.write_zeroes(lba, e.blocks as u64, true).await
            } else {
                h.volume.write(lba, Bytes::copy_from_slice(p), false).await
            };
            if r.is_err() {
                self.fail_handle(pos, &h).await;
            }
        }
    }

    /// Replays the data-first records no record completes (their updates were
    /// acknowledged before their parity was known, and nothing of them was
    /// written in place): like the update would have, each computes its
    /// stripe's parity from the new data and the rest of the stripe (read, or
    /// reconstructed where a member is missing: the stripe is consistent, since
    /// its in-place writes never started), writes the whole update as a record
    /// completing it, and only then in place.
    ///
    /// The new records never take the ring space of a record the next
    /// assemble would replay (`live`: sequence, ring extent, of every record
    /// above `checkpoint`): a crash in the middle must find every record this
    /// assemble found, or it would replay an older record over a newer one it
    /// lost (the whole updates replayed are in place, but so are the older
    /// updates of the same blocks, and those records would be replayed again).
    /// When that leaves no room, the checkpoint first moves up to just before
    /// the oldest open data-first record (everything older is replayed and
    /// flushed), freeing the space of those records. A crash in the middle
    /// finds either the data-first record alone again, or it and its
    /// completing record. A record whose rows hold unreadable sectors beyond
    /// the redundancy has them given up around it, as the update does
    /// (`complete_given_up`). Returns the last sequence number used.
    async fn resolve_data_first(
        &self,
        open: &[&journal::Record],
        live: &[(u64, u64, u64)],
        checkpoint: u64,
        max_seq: u64,
    ) -> BlockResult<u64> {
        let j = self.journal.as_ref().expect("a journal");
        self.flush_members().await?;
        let bs = self.bs as usize;
        let k = self.layout.data_chunks();
        let mut checkpoint = checkpoint;
        // ring extents no new record may take: the live records', then also
        // the new records'
        let live_above = |cp: u64| -> Vec<(u64, u64)> {
            live.iter()
                .filter(|&&(seq, _, _)| seq > cp)
                .map(|&(_, a, b)| (a, b))
                .collect()
        };
        let mut keep = live_above(checkpoint);
        let mut written: Vec<(u64, u64)> = Vec::new();
        let mut head = 0u64;
        let mut seq = max_seq;
        tracing::info!(pool = %self.name, records = open.len(), "completing data-first journal records");
        for rec in open {
            let view = self.view()?;
            let Some(first) = rec.entries.first() else {
                continue;
            };
            let s = first.member_lba / self.cb;
            let mut segs = Vec::new();
            let mut data = Vec::new();
            for (e, p) in rec.entries.iter().zip(&rec.payloads) {
                let d =
                    (0..k).find(|&d| self.layout.data_positions(s, d)[0] == e.position as usize);
                // every entry must lie in the first one's stripe (the record
                // passed its checksum, but is read from a disk)
                let off = e.member_lba.checked_sub(s * self.cb).unwrap_or(u64::MAX);
                let Some(d) = d.filter(|_| {
                    !e.discard
                        && s < self.stripes()
                        && off
                            .checked_add(e.blocks as u64)
                            .is_some_and(|end| end <= self.cb)
                        && p.len() == e.blocks as usize * bs
                }) else {
                    tracing::error!(pool = %self.name, seq = rec.seq, "a data-first journal record does not fit this pool; left out");
                    segs.clear();
                    break;
                };
                segs.push(crate::io::Seg {
                    stripe: s,
                    d,
                    off,
                    blocks: e.blocks as u64,
                    buf_off: data.len(),
                });
                data.extend_from_slice(p);
            }
            if segs.is_empty() {
                continue;
            }
            let data = Bytes::from(data);
            let r0 = segs.iter().map(|g| g.off).min().unwrap_or(0);
            let r1 = segs.iter().map(|g| g.off + g.blocks).max().unwrap_or(0);
            let ops = match self.rcw(s, &segs, &data, r0, r1, &view).await {
                Ok(ops) => ops,
                // unreadable sectors beyond the redundancy in its rows (the
                // update met them before the crash, or meets them now): its
                // rows are given up around it, as the update does
                // (`complete_given_up`; the lost blocks recorded before the
                // completing record holds the stand-ins)
                Err(BlockError::Medium { .. }) => {
                    tracing::warn!(pool = %self.name, seq = rec.seq, stripe = s,
                        "a data-first journal record meets unreadable sectors beyond the redundancy: its rows are given up around it");
                    self.complete_given_up(s, &segs, &data).await?.0
                }
                Err(e) => return Err(e),
            };
            let (entries, payloads) = self.record_of(&ops);
            if entries.len() > journal::MAX_ENTRIES {
                // (stand-ins on more rows than a record holds: a record
                // replay would not decode must never be written)
                return Err(crate::io::unavailable(format!(
                    "pool {}: the record completing data-first record {} would have {} entries",
                    self.name,
                    rec.seq,
                    entries.len()
                )));
            }
            seq += 1;
            let pay: Vec<&[u8]> = payloads.iter().map(|b| b.as_ref()).collect();
            let bytes = journal::encode(
                seq,
                self.pool_tag,
                journal::LINK_COMPLETES | rec.seq,
                &entries,
                &pay,
                bs,
            );
            let len = (bytes.len() / bs) as u64;
            // the next ring space that holds no record a replay needs: after
            // the last one written, else the first from the ring's start (a
            // large record may have passed over a gap a smaller one fits),
            // else after a checkpoint
            let mut from_start = head == 0;
            loop {
                while let Some(&(a, b)) = keep.iter().find(|&&(a, b)| a < head + len && head < b) {
                    debug_assert!(b > a);
                    head = b;
                }
                if head + len <= j.ring_blocks {
                    break;
                }
                if !from_start {
                    from_start = true;
                    head = 0;
                    continue;
                }
                // `open` is in sequence order, and every open record before
                // this one is completed in place by now
                let cp = rec.seq.saturating_sub(1);
                if cp <= checkpoint {
                    return Err(crate::io::unavailable(format!(
                        "pool {}: no ring space to complete the data-first journal records",
                        self.name
                    )));
                }
                // every record before this open one is replayed (the
                // checkpoint flushes the members first): a checkpoint there
                // frees their space (the new records written so far stay
                // kept: their sequences are above)
                self.checkpoint(cp).await?;
                checkpoint = cp;
                keep = live_above(checkpoint);
                keep.extend(written.iter().copied());
                head = 0;
            }
            let bytes = Bytes::from(bytes);
            let mut held = 0;
            let devs = self.journal_devices();
            if devs.is_empty() {
                for p in self.journal_copies(&view, 0) {
                    if let Some(h) = view.writable(p) {
                        match h
                            .volume
                            .write(j.offset_blocks + head, bytes.clone(), true)
                            .await
                        {
                            Ok(()) => held += 1,
                            Err(_) => self.fail_handle(p, &h).await,
                        }
                    }
                }
            } else {
                for d in devs {
                    if d.h
                        .volume
                        .write(d.ring_offset_blocks + head, bytes.clone(), true)
                        .await
                        .is_ok()
                    {
                        held += 1;
                    } else {
                        d.failed.store(true, Ordering::SeqCst);
                    }
                }
            }
            if held == 0 {
                return Err(crate::io::unavailable(format!(
                    "pool {}: the record completing data-first record {} could not be written",
                    self.name, rec.seq
                )));
            }
            keep.push((head, head + len));
            written.push((head, head + len));
            head += len;
            let payloads: Vec<Vec<u8>> = payloads.iter().map(|b| b.to_vec()).collect();
            self.replay_entries(&view, &entries, &payloads).await;
        }
        Ok(seq)
    }

    fn status(&self) -> PoolStatus {
        let journal_devices: Vec<crate::status::JournalDeviceStatus> = self
            .journal_devs
            .iter()
            .map(|d| crate::status::JournalDeviceStatus {
                name: d.h.name.clone(),
                uuid: d.h.uuid.clone(),
                failed: d.failed.load(Ordering::Relaxed),
            })
            .collect();
        let failed = self.is_failed();
        let st = self.state.lock();
        let data_bytes = self.layout.areas() * self.stripes() * self.cb * self.bs;
        let members = st
            .slots
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let load = |f: fn(&MemberHandle) -> &AtomicU64| {
                    s.member
                        .as_ref()
                        .map_or(0, |h| f(h).load(Ordering::Relaxed))
                };
                let depth = s
                    .member
                    .as_ref()
                    .map(|h| h.depth.snapshot())
                    .unwrap_or_default();
                MemberStatus {
                    position: i,
                    name: s
                        .member
                        .as_ref()
                        .map_or_else(|| "missing".to_string(), |h| h.name.clone()),
                    uuid: s.uuid.clone(),
                    state: s.state,
                    rebuilt_bytes: match s.state {
                        MemberState::Rebuilding => {
                            self.layout.areas() * s.rebuild_cp_stripes * self.cb * self.bs
                        }
                        MemberState::Active => data_bytes,
                        _ => 0,
                    },
                    errors: load(|h| &h.errors),
                    reads: load(|h| &h.reads),
                    writes: load(|h| &h.writes),
                    read_bytes: load(|h| &h.read_bytes),
                    written_bytes: load(|h| &h.written_bytes),
                    inflight_us: depth.inflight_us,
                    busy_us: depth.busy_us,
                    completed: depth.completed,
                    reordered: depth.reordered,
                }
            })
            .collect::<Vec<_>>();
        let state = if failed {
            PoolState::Failed
        } else if members.iter().any(|m| m.state == MemberState::Rebuilding) {
            PoolState::Rebuilding
        } else if members.iter().any(|m| m.state == MemberState::Failed) {
            PoolState::Degraded
        } else if st.resync_cursor.is_some() || !st.resync_regions.is_empty() {
            PoolState::Resyncing
        } else {
            PoolState::Optimal
        };
        PoolStatus {
            name: self.name.clone(),
            uuid: self.uuid.clone(),
            level: self.layout.level(),
            chunk_bytes: self.chunk_bytes,
            state,
            capacity_bytes: data_bytes * self.layout.member_count() as u64,
            usable_bytes: self.geometry().size_bytes(),
            redundancy: self.layout.redundancy(),
            generation: st.generation,
            members,
            spares: st
                .spares
                .iter()
                .map(|s| SpareStatus {
                    name: s.name.clone(),
                    uuid: s.uuid.clone(),
                })
                .collect(),
            rebuild: st.rebuild.clone(),
            rebuild_stalled: st.rebuild_stalled.clone(),
            lost_blocks: st.lost.blocks(),
            lost_ranges: st.lost.records(),
            resync: st.resync.clone(),
            scrub: st.scrub.clone(),
            last_scrub: st.last_scrub.clone(),
            rebuild_rate_mb_s: st.rebuild_rate_mb_s,
            journal_bytes: self.journal_blocks * self.bs,
            stripe_writes: crate::status::StripeWrites {
                full: self.full_writes.load(Ordering::Relaxed),
                partial: self.partial_writes.load(Ordering::Relaxed),
                gather_timeouts: self.gather_timeouts.load(Ordering::Relaxed),
                gather_passed: self.gather_passed.load(Ordering::Relaxed),
            },
            unsynced_regions: st.resync_regions.len() as u64,
            intent_regions: st.intent.len() as u64,
            journal_whole_stripes: self.journal_whole.load(Ordering::Relaxed),
            data_first: self.data_first.load(Ordering::Relaxed),
            write_path: self.wp.snapshot(),
            journal_device: journal_devices.first().cloned(),
            journal_devices_missing: self
                .journal_configured
                .lock()
                .iter()
                .filter(|n| !journal_devices.iter().any(|d| d.name == **n))
                .cloned()
                .collect(),
            journal_devices,
        }
    }
}
