//! Serde status types: what `Pool::status()` reports and the CLI/API print.

use crate::RaidLevel;
use serde::{Deserialize, Serialize};

/// Overall state of a pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PoolState {
    /// Every member active, redundancy complete.
    Optimal,
    /// Some member failed or missing; data served from redundancy.
    Degraded,
    /// A member is being rebuilt.
    Rebuilding,
    /// The initial (or post-crash mirror) resync is still running.
    Resyncing,
    /// More members lost than the level tolerates: I/O is answered with errors.
    Failed,
}

/// State of a member position (stored in the superblocks).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MemberState {
    /// In sync; serves reads and writes.
    Active,
    /// Receives every write; reads only below its rebuild checkpoint.
    Rebuilding,
    /// Failed, missing or administratively removed; no I/O.
    Failed,
    /// A hot spare waiting for a failure.
    Spare,
}

/// One member position in a status report.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MemberStatus {
    /// Position in the pool.
    pub position: usize,
    /// Member name (path or label); "missing" when no volume is attached.
    pub name: String,
    /// Member uuid (32 hex digits).
    pub uuid: String,
    /// Position state.
    pub state: MemberState,
    /// For a rebuilding member: bytes of its data area already rebuilt.
    pub rebuilt_bytes: u64,
    /// I/O errors seen on this member.
    pub errors: u64,
    /// Read requests issued to this member.
    pub reads: u64,
    /// Write requests issued to this member (journal, data, parity, superblock).
    pub writes: u64,
    /// Bytes read from this member.
    pub read_bytes: u64,
    /// Bytes written to this member.
    pub written_bytes: u64,
    /// Requests the pool had outstanding on this member, integrated over time
    /// (request-µs): its change over an interval divided by the interval is the
    /// member's mean queue depth as the pool issued it.
    #[serde(default)]
    pub inflight_us: u64,
    /// Time this member had at least one request of the pool outstanding, µs
    /// (divided into the change of `inflight_us`: the mean depth while busy).
    #[serde(default)]
    pub busy_us: u64,
    /// Requests of the pool this member completed.
    #[serde(default)]
    pub completed: u64,
    /// Of them, those it completed while one issued before them was still
    /// outstanding: a member that reorders its queue (NCQ) has many, a FIFO
    /// one none (see `Pool::set_journal_spare_copies`).
    #[serde(default)]
    pub reordered: u64,
}

/// A hot spare in a status report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SpareStatus {
    /// Spare name.
    pub name: String,
    /// Spare uuid.
    pub uuid: String,
}

/// Progress of a background job (rebuild, resync, scrub).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct Progress {
    /// Bytes processed so far.
    pub done_bytes: u64,
    /// Bytes the job will process in total.
    pub total_bytes: u64,
    /// Average rate since the job started.
    pub rate_mb_s: f64,
    /// Estimated seconds to completion at the current rate.
    pub eta_secs: Option<u64>,
}

/// A rebuild that cannot read a stripe it needs (an unreadable sector on a
/// member it reads from): it retries that stripe, backing off, and stays
/// there until the read succeeds (there is no bad-block list to skip it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct RebuildStall {
    /// The stripe the rebuild is held at.
    pub stripe: u64,
    /// The last read error.
    pub error: String,
    /// Failed attempts at that stripe so far.
    pub attempts: u64,
}

/// What a scrub found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct ScrubReport {
    /// Stripes compared, or (unreadable chunks that could not be rebuilt
    /// whole) read row by row and repaired or given up.
    pub stripes_checked: u64,
    /// Stripes skipped because a member was missing or rebuilding.
    pub stripes_skipped: u64,
    /// Blocks whose redundancy disagreed with the data.
    pub mismatches: u64,
    /// Mismatched or unreadable blocks rewritten.
    pub repaired: u64,
    /// Mismatches redundancy could not decide (left as they were), and
    /// unreadable blocks it could not rebuild (given up: the pool's lost
    /// blocks).
    pub unrepairable: u64,
    /// Unreadable chunks (medium errors) rebuilt from redundancy; where a
    /// stripe was taken row by row, unreadable sectors written again
    /// (rebuilt, or stand-ins in rows given up).
    pub read_errors: u64,
    /// Per position: blocks found bad on that member (RAID 6 location, mirror copy
    /// or parity rewritten).
    pub bad_blocks_by_position: Vec<u64>,
}

/// Everything `Pool::status()` reports.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PoolStatus {
    /// Pool name.
    pub name: String,
    /// Pool uuid.
    pub uuid: String,
    /// RAID level.
    pub level: RaidLevel,
    /// Chunk size.
    pub chunk_bytes: u32,
    /// Overall state.
    pub state: PoolState,
    /// Raw bytes of the members' data areas.
    pub capacity_bytes: u64,
    /// Bytes the pool offers.
    pub usable_bytes: u64,
    /// Members that may fail without data loss.
    pub redundancy: usize,
    /// Superblock generation (bumped on every membership or state change).
    pub generation: u64,
    /// Member positions.
    pub members: Vec<MemberStatus>,
    /// Hot spares.
    pub spares: Vec<SpareStatus>,
    /// Rebuild progress while a rebuild runs.
    pub rebuild: Option<Progress>,
    /// Set while the rebuild cannot read a stripe it needs.
    #[serde(default)]
    pub rebuild_stalled: Option<RebuildStall>,
    /// Pool blocks a rebuild could not recover (an unreadable sector on a
    /// member it read from, with no redundancy left to stand in): reads of
    /// them fail with a medium error until they are written again.
    #[serde(default)]
    pub lost_blocks: u64,
    /// Where they are: `[first pool block, count]`, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub lost_ranges: Vec<[u64; 2]>,
    /// Initial resync progress while it runs.
    pub resync: Option<Progress>,
    /// Scrub progress while a scrub runs.
    pub scrub: Option<Progress>,
    /// Report of the last finished scrub.
    pub last_scrub: Option<ScrubReport>,
    /// Rebuild/resync/scrub cap in MB/s (0 = none).
    pub rebuild_rate_mb_s: u32,
    /// Stripe updates of a parity pool since it started: whole stripes written
    /// without reads or journal, journaled partial-stripe updates, and gathered
    /// partial writes whose stripe did not fill within the gather window.
    #[serde(default)]
    pub stripe_writes: StripeWrites,
    /// Write-intent regions an unclean shutdown left dirty whose resync has not
    /// finished (their torn whole stripes are not yet protected).
    #[serde(default)]
    pub unsynced_regions: u64,
    /// Dirty write-intent regions, listed in the superblocks or about to be
    /// (whole-stripe or mirror writes went there recently, or a stream is about
    /// to); regions still waiting for their resync are `unsynced_regions`.
    #[serde(default)]
    pub intent_regions: u64,
    /// Whole-stripe writes are journaled too (closes the write hole for writes in
    /// flight at a crash followed by a member loss, at twice the write traffic).
    #[serde(default)]
    pub journal_whole_stripes: bool,
    /// Partial updates of healthy stripes are acknowledged once their new data
    /// is journaled, before their reads (see [`crate::Pool::set_data_first`]).
    #[serde(default)]
    pub data_first: bool,
    /// Size of the stripe journal's ring in bytes: on each member, or on the
    /// journal device when the pool has one; 0 without a journal (mirror and
    /// stripe levels). Fixed when the pool is created.
    #[serde(default)]
    pub journal_bytes: u64,
    /// Where the time of partial-stripe updates goes, and what the stripe journal
    /// writes (counters since the pool started).
    #[serde(default)]
    pub write_path: WritePath,
    /// The journal device holding the stripe journal instead of the members, if
    /// the pool has one (the first of a mirrored pair).
    #[serde(default)]
    pub journal_device: Option<JournalDeviceStatus>,
    /// Every journal device of the pool: none, one, or a mirrored pair (each
    /// group commit goes to every one not failed).
    #[serde(default)]
    pub journal_devices: Vec<JournalDeviceStatus>,
    /// Journal devices the configuration names that the pool does not have at
    /// all (missing at start, or left out): with one of a mirrored pair here,
    /// the journal runs unmirrored. A blank disk given in its place joins at
    /// the next start.
    #[serde(default)]
    pub journal_devices_missing: Vec<String>,
}

/// The journal device of a pool in a status report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JournalDeviceStatus {
    /// Device name.
    pub name: String,
    /// Device uuid (in its header and the members' superblocks).
    pub uuid: String,
    /// It failed: the journal goes on on its twin, or on the members when it
    /// was the last.
    pub failed: bool,
}

/// Counters of partial-stripe updates and the stripe journal (parity levels).
/// Totals since start: divide the `_us` fields by `partial_updates` for a mean.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WritePath {
    /// Partial-stripe updates (read-modify-write or reconstruct-write) applied.
    pub partial_updates: u64,
    /// Journal records made durable (one per journaled stripe update).
    pub journal_records: u64,
    /// Group commits: ring writes that carried one or more records to every
    /// journal copy at once.
    pub journal_batches: u64,
    /// Member writes to the journal ring (all FUA): batches x copies, spare
    /// copies included.
    pub journal_ring_writes: u64,
    /// Bytes written to the ring, all copies.
    pub journal_ring_bytes: u64,
    /// Most records one group commit carried.
    pub journal_batch_records_max: u64,
    /// Checkpoints (flush every member, persist the checkpoint sequence) taken to
    /// reuse ring space.
    pub journal_checkpoints: u64,
    /// Time partial updates waited for their stripe's lock, µs (total).
    pub lock_wait_us: u64,
    /// Time reading old data and parity (or the rest of the rows), µs (total).
    pub read_us: u64,
    /// Time from a record's hand-over to the journal until it was durable,
    /// including waiting for the group commit in front of it, µs (total).
    pub journal_us: u64,
    /// Time of the in-place member writes, µs (total).
    pub apply_us: u64,
    /// Updates acknowledged once their journal record was durable, before their
    /// in-place writes finished.
    #[serde(default)]
    pub early_acks: u64,
    /// Checkpoints started ahead of need, in the background, so that group
    /// commits do not wait for one (of `journal_checkpoints`, which counts the
    /// ones a group commit had to wait for).
    #[serde(default)]
    pub journal_checkpoints_ahead: u64,
    /// Updates acknowledged once their new data was journaled, before their
    /// reads, parity and in-place writes (of `early_acks`).
    #[serde(default)]
    pub data_first_acks: u64,
    /// Time data-first updates waited for their completing record to be
    /// durable (after their acknowledgement), µs (total); `journal_us` holds
    /// the wait for their data-first record.
    #[serde(default)]
    pub completion_us: u64,
    /// Copies written beyond a batch's copy set that were among the first
    /// `redundancy + 1` to be durable (the batch was acknowledged sooner
    /// thanks to them; see `Pool::set_journal_spare_copies`).
    #[serde(default)]
    pub journal_spare_wins: u64,
    /// Spare copies written (of `journal_ring_writes`).
    #[serde(default)]
    pub journal_spare_copies: u64,
    /// Completing records of data-first updates written in a later group
    /// commit, with other records (no ring write of their own).
    #[serde(default)]
    pub completions_riding: u64,
    /// Completing records written to the slot set aside for them behind their
    /// data-first record's batch (one ring write per copy for the batch's
    /// completing records).
    #[serde(default)]
    pub completions_in_slots: u64,
}

/// Counters of the parity write path.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct StripeWrites {
    pub full: u64,
    pub partial: u64,
    pub gather_timeouts: u64,
    /// Of the gather timeouts, those that ended early because writes of the
    /// stream had already arrived a few stripes further on.
    #[serde(default)]
    pub gather_passed: u64,
}
