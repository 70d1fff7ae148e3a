//! End-to-end data verification: self-describing records, the generation map, the
//! state file, and the read-back pass used by crash tests.
//!
//! # Design
//! **Records.** With [`crate::Workload::verify`] every *logical block* of the volume
//! (512 or 4096 bytes: the unit a device writes atomically) that the run writes is one
//! record:
//!
//! ```text
//! 0..4    magic "FSBV"
//! 4..8    map id    (random per verification map: tells our records from stale ones)
//! 8..16   LBA       (the volume LBA this record was written to)
//! 16..20  generation of the I/O block (1, 2, 3, ... per block)
//! 20..24  writer id (worker << 16 | slot)
//! 24..28  CRC32C of bytes 0..24 and 28..end
//! 28..end pseudo-random fill derived from (LBA, generation)
//! ```
//!
//! **Map.** [`VerifyMap`] keeps one `u32` per *I/O block* of the region (the workload's
//! block size: 4 bytes per 4 KiB = 0.1% of the region): the last acknowledged
//! generation. All records of one I/O block share its generation. A write that failed
//! is remembered in a small side table as "issued but not acknowledged": after it, the
//! block may hold either generation. A busy bitmap (1 bit per block) claims a block for
//! the one in-flight I/O that touches it, so two I/Os of a run never overlap.
//!
//! **Checks.** A read of block `b` issued when `acked[b] = a` and completed when the
//! newest issued generation is `n` accepts, in every record: valid CRC, our map id, the
//! right LBA, and `a <= generation <= n`. Failures are classified as [`VerifyKind`]:
//! corruption (bad CRC or garbage), misplaced write (a valid record of another LBA), lost
//! write (an older generation, zeroes, or someone else's record where we acknowledged
//! ours), and a generation from the future. Blocks never written under this map are not
//! checked; [`prefill`] writes every block once so that read-only patterns are checked
//! too.
//!
//! **Persistence.** [`VerifyState`] is the map frozen into a file (`--verify-state`):
//! a fixed header, the generations, the failed-write table and a CRC32C, written
//! atomically (temporary file, fsync, rename). The run writes it at the end with
//! `complete = true`, and optionally as periodic checkpoints with `complete = false`
//! during the run, so that a crash of the *benchmark* process still leaves a usable
//! file: a checkpoint is a lower bound (every acknowledged generation in it is
//! acknowledged), so its check enforces `generation >= acked` only. A crash of the
//! *server* is handled by the complete file: the run sees I/O errors, records the
//! failed writes as uncertain, and writes the map at the end; [`verify_pass`] after the
//! restart then checks every acknowledged block.

use crate::{BenchError, Region};
use block::{Bytes, VolumeRef};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::fmt;
use std::io::Write;
use std::path::Path;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

/// Bytes of record header at the start of every logical block.
pub const RECORD_HEADER_BYTES: usize = 28;
const RECORD_MAGIC: u32 = u32::from_le_bytes(*b"FSBV");
const STATE_MAGIC: &[u8; 8] = b"FSBVMAP1";
const STATE_VERSION: u32 = 1;
const STATE_HEADER_BYTES: usize = 56;
/// Most failures a [`VerifyReport`] keeps in detail (all are counted).
pub const FAILURES_KEPT_MAX: usize = 64;

/// The kind of a verification failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum VerifyKind {
    /// The record's checksum does not match (bit flip, torn sector, garbage).
    Corrupt,
    /// A valid record written for another LBA was read here.
    Misplaced,
    /// An older generation (or zeroes, or a stale record) came back where a newer one
    /// was acknowledged.
    LostWrite,
    /// A generation newer than any issued for this block.
    FutureGeneration,
    /// The read itself failed (only in [`verify_pass`]).
    ReadError,
}

/// One bad record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VerifyFailure {
    /// What is wrong.
    pub kind: VerifyKind,
    /// Volume LBA of the bad record.
    pub lba: u64,
    /// I/O block index in the region.
    pub block: u64,
    /// Oldest acceptable generation.
    pub gen_min: u32,
    /// Newest acceptable generation (`u32::MAX` when unknown).
    pub gen_max: u32,
    /// Generation found in the record, if it was a valid record.
    pub found_gen: Option<u32>,
    /// LBA found in the record, if it was a valid record.
    pub found_lba: Option<u64>,
    /// Writer id found in the record, if it was a valid record.
    pub found_writer: Option<u32>,
}

impl fmt::Display for VerifyFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:?} at lba {} (block {}): expected generation {}..={}",
            self.kind, self.lba, self.block, self.gen_min, self.gen_max
        )?;
        if let Some(g) = self.found_gen {
            write!(f, ", found generation {g}")?;
        }
        if let Some(l) = self.found_lba {
            write!(f, " written for lba {l}")?;
        }
        if let Some(w) = self.found_writer {
            write!(f, " by writer {w:#x}")?;
        }
        Ok(())
    }
}

/// Verification outcome of one run (part of [`crate::RunResult`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VerifySummary {
    /// No failure was found.
    pub passed: bool,
    /// Reads whose records were checked.
    pub reads_checked: u64,
    /// Reads of blocks never written under this map (not checkable).
    pub reads_unwritten: u64,
    /// Bad reads found (the run stops issuing I/O at the first).
    pub failures: u64,
    /// The first failure.
    pub first_failure: Option<VerifyFailure>,
}

/// Fills `buf` (one I/O block starting at volume LBA `first_lba`) with records.
pub(crate) fn fill_records(
    buf: &mut [u8],
    record_bytes: usize,
    first_lba: u64,
    map_id: u32,
    gen: u32,
    writer: u32,
) {
    for (i, rec) in buf.chunks_mut(record_bytes).enumerate() {
        let lba = first_lba + i as u64;
        rec[0..4].copy_from_slice(&RECORD_MAGIC.to_le_bytes());
        rec[4..8].copy_from_slice(&map_id.to_le_bytes());
        rec[8..16].copy_from_slice(&lba.to_le_bytes());
        rec[16..20].copy_from_slice(&gen.to_le_bytes());
        rec[20..24].copy_from_slice(&writer.to_le_bytes());
        let mut x = lba.rotate_left(32) ^ gen as u64 ^ ((map_id as u64) << 16);
        for chunk in rec[RECORD_HEADER_BYTES..].chunks_mut(8) {
            let v = crate::rng::splitmix64(&mut x).to_le_bytes();
            chunk.copy_from_slice(&v[..chunk.len()]);
        }
        let crc = record_crc(rec);
        rec[24..28].copy_from_slice(&crc.to_le_bytes());
    }
}

fn record_crc(rec: &[u8]) -> u32 {
    crc32c::crc32c_append(crc32c::crc32c(&rec[0..24]), &rec[28..])
}

fn le_u32(b: &[u8]) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[..4]);
    u32::from_le_bytes(a)
}

fn le_u64(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[..8]);
    u64::from_le_bytes(a)
}

/// Checks the records of I/O block `block` read back as `data`. `gen_min == 0` means
/// "never acknowledged": data that is not our record is then accepted.
pub(crate) fn check_records(
    data: &[u8],
    region: &Region,
    map_id: u32,
    block: u64,
    gen_min: u32,
    gen_max: u32,
) -> Result<(), VerifyFailure> {
    let record_bytes = region.volume_block_bytes as usize;
    let first_lba = region.lba_of(block);
    for (i, rec) in data.chunks(record_bytes).enumerate() {
        let lba = first_lba + i as u64;
        let fail = |kind, found: Option<(u32, u64, u32)>| VerifyFailure {
            kind,
            lba,
            block,
            gen_min,
            gen_max,
            found_gen: found.map(|f| f.0),
            found_lba: found.map(|f| f.1),
            found_writer: found.map(|f| f.2),
        };
        let valid = rec.len() >= RECORD_HEADER_BYTES
            && le_u32(&rec[0..4]) == RECORD_MAGIC
            && le_u32(&rec[24..28]) == record_crc(rec);
        if !valid {
            if gen_min == 0 {
                continue;
            }
            if rec.iter().all(|&b| b == 0) {
                return Err(fail(VerifyKind::LostWrite, None));
            }
            return Err(fail(VerifyKind::Corrupt, None));
        }
        let found = (
            le_u32(&rec[16..20]),
            le_u64(&rec[8..16]),
            le_u32(&rec[20..24]),
        );
        if le_u32(&rec[4..8]) != map_id {
            if gen_min == 0 {
                continue;
            }
            return Err(fail(VerifyKind::LostWrite, Some(found)));
        }
        if found.1 != lba {
            return Err(fail(VerifyKind::Misplaced, Some(found)));
        }
        if found.0 < gen_min {
            return Err(fail(VerifyKind::LostWrite, Some(found)));
        }
        if found.0 > gen_max {
            return Err(fail(VerifyKind::FutureGeneration, Some(found)));
        }
    }
    Ok(())
}

/// The live generation map of a verifying run (see the module docs).
///
/// Share it (`Arc`) between runs to continue one history across patterns, and freeze it
/// with [`VerifyMap::snapshot`] to persist it.
pub struct VerifyMap {
    region: Region,
    map_id: u32,
    upper_bound_known: bool,
    acked: Box<[AtomicU32]>,
    busy: Box<[AtomicU64]>,
    uncertain: Mutex<HashMap<u64, u32>>,
}

impl fmt::Debug for VerifyMap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("VerifyMap")
            .field("region", &self.region)
            .field("map_id", &self.map_id)
            .finish_non_exhaustive()
    }
}

impl VerifyMap {
    /// An empty map (nothing written yet) for `region`, with a fresh random map id.
    pub fn new(region: Region) -> Self {
        let mut seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0)
            ^ (std::process::id() as u64) << 32;
        let map_id = (crate::rng::splitmix64(&mut seed) as u32).max(1);
        Self::build(
            region,
            map_id,
            true,
            vec![0; region.blocks as usize],
            Vec::new(),
        )
    }

    /// A map continuing the history of a saved state.
    pub fn from_state(state: &VerifyState) -> Self {
        Self::build(
            state.region,
            state.map_id,
            state.complete,
            state.acked.clone(),
            state.uncertain.clone(),
        )
    }

    fn build(
        region: Region,
        map_id: u32,
        upper_bound_known: bool,
        acked: Vec<u32>,
        uncertain: Vec<(u64, u32)>,
    ) -> Self {
        VerifyMap {
            region,
            map_id,
            upper_bound_known,
            acked: acked.into_iter().map(AtomicU32::new).collect(),
            busy: (0..region.blocks.div_ceil(64))
                .map(|_| AtomicU64::new(0))
                .collect(),
            uncertain: Mutex::new(uncertain.into_iter().collect()),
        }
    }

    /// The region this map describes.
    pub fn region(&self) -> &Region {
        &self.region
    }

    /// The id stamped into every record written under this map.
    pub fn map_id(&self) -> u32 {
        self.map_id
    }

    /// Claims `block` for one in-flight I/O; false if another holds it.
    pub(crate) fn try_claim(&self, block: u64) -> bool {
        let bit = 1u64 << (block % 64);
        self.busy[(block / 64) as usize].fetch_or(bit, Ordering::AcqRel) & bit == 0
    }

    /// Releases a claim taken with `try_claim`.
    pub(crate) fn release(&self, block: u64) {
        let bit = 1u64 << (block % 64);
        self.busy[(block / 64) as usize].fetch_and(!bit, Ordering::AcqRel);
    }

    /// Last acknowledged generation of `block` (0: never).
    pub fn acked(&self, block: u64) -> u32 {
        self.acked[block as usize].load(Ordering::Acquire)
    }

    /// Newest generation that may be on disk for `block` (`u32::MAX` when unknown).
    pub fn newest(&self, block: u64) -> u32 {
        if !self.upper_bound_known {
            return u32::MAX;
        }
        let a = self.acked(block);
        match self.uncertain.lock().get(&block) {
            Some(&g) => g.max(a),
            None => a,
        }
    }

    /// Generation for the next write of `block` (call only while holding its claim).
    pub(crate) fn next_gen(&self, block: u64) -> u32 {
        let a = self.acked(block);
        let u = self.uncertain.lock().get(&block).copied().unwrap_or(0);
        a.max(u).wrapping_add(1).max(1)
    }

    /// Records that the write of `gen` to `block` was acknowledged.
    pub(crate) fn ack(&self, block: u64, gen: u32) {
        self.acked[block as usize].fetch_max(gen, Ordering::AcqRel);
        let mut u = self.uncertain.lock();
        if u.get(&block).is_some_and(|&g| g <= gen) {
            u.remove(&block);
        }
    }

    /// Records that the write of `gen` to `block` failed: it may or may not be on disk.
    pub(crate) fn write_failed(&self, block: u64, gen: u32) {
        let mut u = self.uncertain.lock();
        let e = u.entry(block).or_insert(gen);
        *e = (*e).max(gen);
    }

    /// Freezes the map. `complete` says no write was in flight (end of run); a snapshot
    /// taken during a run must say false.
    pub fn snapshot(&self, complete: bool) -> VerifyState {
        let mut uncertain: Vec<(u64, u32)> = self
            .uncertain
            .lock()
            .iter()
            .map(|(&b, &g)| (b, g))
            .collect();
        uncertain.sort_unstable();
        VerifyState {
            region: self.region,
            map_id: self.map_id,
            complete: complete && self.upper_bound_known,
            acked: self
                .acked
                .iter()
                .map(|a| a.load(Ordering::Acquire))
                .collect(),
            uncertain,
        }
    }
}

/// A frozen verification map, as saved to and loaded from a `--verify-state` file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifyState {
    /// The region the generations describe.
    pub region: Region,
    /// Map id stamped into the records.
    pub map_id: u32,
    /// True when saved with no write in flight: the newest generation of every block
    /// is known exactly; false for a checkpoint (lower bounds only).
    pub complete: bool,
    /// Last acknowledged generation per I/O block (0: never written).
    pub acked: Vec<u32>,
    /// Failed writes: (block, newest generation issued), sorted by block.
    pub uncertain: Vec<(u64, u32)>,
}

impl VerifyState {
    /// Number of blocks with an acknowledged generation.
    pub fn written_blocks(&self) -> u64 {
        self.acked.iter().filter(|&&g| g > 0).count() as u64
    }

    /// The binary file image (see the module docs).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(
            STATE_HEADER_BYTES + self.acked.len() * 4 + self.uncertain.len() * 12 + 4,
        );
        out.extend_from_slice(STATE_MAGIC);
        out.extend_from_slice(&STATE_VERSION.to_le_bytes());
        out.extend_from_slice(&(self.complete as u32).to_le_bytes());
        out.extend_from_slice(&self.map_id.to_le_bytes());
        out.extend_from_slice(&self.region.io_block_bytes.to_le_bytes());
        out.extend_from_slice(&self.region.volume_block_bytes.to_le_bytes());
        out.extend_from_slice(&0u32.to_le_bytes());
        out.extend_from_slice(&self.region.offset_bytes.to_le_bytes());
        out.extend_from_slice(&self.region.blocks.to_le_bytes());
        out.extend_from_slice(&(self.uncertain.len() as u64).to_le_bytes());
        for g in &self.acked {
            out.extend_from_slice(&g.to_le_bytes());
        }
        for (b, g) in &self.uncertain {
            out.extend_from_slice(&b.to_le_bytes());
            out.extend_from_slice(&g.to_le_bytes());
        }
        let crc = crc32c::crc32c(&out);
        out.extend_from_slice(&crc.to_le_bytes());
        out
    }

    /// Parses a file image written by [`VerifyState::to_bytes`].
    pub fn from_bytes(b: &[u8]) -> Result<Self, BenchError> {
        if b.len() < STATE_HEADER_BYTES + 4 || &b[0..8] != STATE_MAGIC {
            return Err(BenchError::StateFormat("not a freesan verification state"));
        }
        let (body, crc) = b.split_at(b.len() - 4);
        if crc32c::crc32c(body) != le_u32(crc) {
            return Err(BenchError::StateFormat("checksum mismatch (damaged file)"));
        }
        if le_u32(&b[8..12]) != STATE_VERSION {
            return Err(BenchError::StateFormat("unsupported version"));
        }
        let region = Region {
            io_block_bytes: le_u32(&b[20..24]),
            volume_block_bytes: le_u32(&b[24..28]),
            offset_bytes: le_u64(&b[32..40]),
            blocks: le_u64(&b[40..48]),
        };
        let uncertain_count = le_u64(&b[48..56]);
        let expect =
            (STATE_HEADER_BYTES as u128) + region.blocks as u128 * 4 + uncertain_count as u128 * 12;
        if expect != body.len() as u128
            || region.volume_block_bytes == 0
            || region.io_block_bytes == 0
        {
            return Err(BenchError::StateFormat("length does not match the header"));
        }
        let mut pos = STATE_HEADER_BYTES;
        let acked = (0..region.blocks)
            .map(|_| {
                let g = le_u32(&body[pos..]);
                pos += 4;
                g
            })
            .collect();
        let uncertain = (0..uncertain_count)
            .map(|_| {
                let e = (le_u64(&body[pos..]), le_u32(&body[pos + 8..]));
                pos += 12;
                e
            })
            .collect();
        Ok(VerifyState {
            region,
            map_id: le_u32(&b[16..20]),
            complete: le_u32(&b[12..16]) & 1 == 1,
            acked,
            uncertain,
        })
    }

    /// Writes the state to `path` atomically (temporary file, fsync, rename, fsync dir).
    pub fn save(&self, path: &Path) -> Result<(), BenchError> {
        let mut tmp_name = path.as_os_str().to_owned();
        tmp_name.push(".tmp");
        let tmp = std::path::PathBuf::from(tmp_name);
        {
            let mut f = std::fs::File::create(&tmp)?;
            f.write_all(&self.to_bytes())?;
            f.sync_all()?;
        }
        std::fs::rename(&tmp, path)?;
        if let Some(dir) = path.parent() {
            let dir = if dir.as_os_str().is_empty() {
                Path::new(".")
            } else {
                dir
            };
            if let Ok(d) = std::fs::File::open(dir) {
                let _ = d.sync_all();
            }
        }
        Ok(())
    }

    /// Reads a state saved with [`VerifyState::save`].
    pub fn load(path: &Path) -> Result<Self, BenchError> {
        Self::from_bytes(&std::fs::read(path)?)
    }

    fn gen_range(&self, block: u64, uncertain: &HashMap<u64, u32>) -> (u32, u32) {
        let a = self.acked[block as usize];
        if !self.complete {
            return (a, u32::MAX);
        }
        (a, uncertain.get(&block).map_or(a, |&u| u.max(a)))
    }
}

/// Writes every block of the map's region once, with records, `queue_depth` writes in
/// flight, acknowledging each in the map: after it, every read of a verifying run is
/// checked (reads of never-written blocks are not). Returns the number of failed
/// writes (those blocks stay "uncertain").
pub async fn prefill(
    volume: VolumeRef,
    map: Arc<VerifyMap>,
    queue_depth: u32,
) -> Result<u64, BenchError> {
    let region = *map.region();
    let g = volume.geometry();
    if region.volume_block_bytes != g.block_size_bytes
        || region.offset_bytes + region.size_bytes() > g.size_bytes()
    {
        return Err(BenchError::VerifyMapMismatch(format!(
            "map describes {region:?}, volume has {} blocks of {} bytes",
            g.block_count, g.block_size_bytes
        )));
    }
    let next = Arc::new(AtomicU64::new(0));
    let mut handles = Vec::new();
    for slot in 0..queue_depth.max(1) {
        let (volume, map, next) = (volume.clone(), map.clone(), next.clone());
        handles.push(tokio::spawn(async move {
            let mut failed = 0u64;
            let mut buf = bytes::BytesMut::new();
            loop {
                let b = next.fetch_add(1, Ordering::Relaxed);
                if b >= region.blocks {
                    break;
                }
                while !map.try_claim(b) {
                    tokio::task::yield_now().await;
                }
                let gen = map.next_gen(b);
                buf.resize(region.io_block_bytes as usize, 0);
                let lba = region.lba_of(b);
                fill_records(
                    &mut buf,
                    region.volume_block_bytes as usize,
                    lba,
                    map.map_id(),
                    gen,
                    0xffff_0000 | slot,
                );
                let data = buf.split().freeze();
                match volume.write(lba, data.clone(), false).await {
                    Ok(()) => map.ack(b, gen),
                    Err(_) => {
                        failed += 1;
                        map.write_failed(b, gen);
                    }
                }
                map.release(b);
                if let Ok(mut back) = data.try_into_mut() {
                    back.clear();
                    buf.unsplit(back);
                }
            }
            failed
        }));
    }
    let mut failed = 0;
    for h in handles {
        failed += h.await.map_err(|e| BenchError::Task(e.to_string()))?;
    }
    Ok(failed)
}

/// Result of a [`verify_pass`].
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct VerifyReport {
    /// I/O blocks read and checked.
    pub blocks_checked: u64,
    /// I/O blocks never written under the map (read, not checked).
    pub blocks_unwritten: u64,
    /// Failed blocks, by kind.
    pub failures_by_kind: Vec<(VerifyKind, u64)>,
    /// The first failures by LBA (at most [`FAILURES_KEPT_MAX`]).
    pub failures: Vec<VerifyFailure>,
    /// Of the failures, those (other than read errors) on blocks a write was in
    /// flight to when the state was saved: their new data was never acknowledged.
    #[serde(default)]
    pub in_flight_failures: u64,
}

impl VerifyReport {
    /// Total failed blocks.
    pub fn failure_count(&self) -> u64 {
        self.failures_by_kind.iter().map(|(_, n)| n).sum()
    }

    /// True when every acknowledged block read back as expected.
    pub fn passed(&self) -> bool {
        self.failure_count() == 0
    }

    /// True when every block read back as expected except, possibly, blocks under
    /// a write in flight at the crash (torn: neither old nor new). The contract of a
    /// store that only promises acknowledged data, not per-block atomicity of
    /// interrupted writes.
    pub fn passed_allowing_torn_in_flight(&self) -> bool {
        self.failure_count() == self.in_flight_failures
    }

    /// Failed blocks of one kind.
    pub fn count_of(&self, kind: VerifyKind) -> u64 {
        self.failures_by_kind
            .iter()
            .filter(|(k, _)| *k == kind)
            .map(|(_, n)| n)
            .sum()
    }

    fn add(&mut self, f: VerifyFailure) {
        match self.failures_by_kind.iter_mut().find(|(k, _)| *k == f.kind) {
            Some((_, n)) => *n += 1,
            None => self.failures_by_kind.push((f.kind, 1)),
        }
        self.failures.push(f);
        if self.failures.len() > 4 * FAILURES_KEPT_MAX {
            self.trim();
        }
    }

    fn trim(&mut self) {
        self.failures.sort_by_key(|f| f.lba);
        self.failures.truncate(FAILURES_KEPT_MAX);
    }
}

/// Reads back the whole region of `state` and checks every block written under it:
/// the check a crash test runs after restarting the server.
///
/// Reads are issued in chunks of up to 1 MiB, four at a time. A read error counts as a
/// [`VerifyKind::ReadError`] failure for each block of the chunk that was written.
pub async fn verify_pass(
    volume: VolumeRef,
    state: &VerifyState,
) -> Result<VerifyReport, BenchError> {
    const WORKERS: u64 = 4;
    const CHUNK_BYTES_MAX: u64 = 1 << 20;
    let g = volume.geometry();
    let region = state.region;
    if region.volume_block_bytes != g.block_size_bytes
        || region.offset_bytes + region.size_bytes() > g.size_bytes()
        || !region
            .io_block_bytes
            .is_multiple_of(region.volume_block_bytes)
        || state.acked.len() as u64 != region.blocks
    {
        return Err(BenchError::VerifyMapMismatch(format!(
            "state describes {region:?}, volume has {} blocks of {} bytes",
            g.block_count, g.block_size_bytes
        )));
    }
    let max_io_bytes =
        (g.max_io_blocks.max(1) as u64 * g.block_size_bytes as u64).min(CHUNK_BYTES_MAX);
    let chunk_blocks = (max_io_bytes / region.io_block_bytes as u64).max(1);
    let chunks = region.blocks.div_ceil(chunk_blocks);
    let shared = Arc::new((
        state.clone(),
        state
            .uncertain
            .iter()
            .copied()
            .collect::<HashMap<u64, u32>>(),
    ));
    let next = Arc::new(AtomicU64::new(0));
    let mut handles = Vec::new();
    for _ in 0..WORKERS {
        let (volume, shared, next) = (volume.clone(), shared.clone(), next.clone());
        handles.push(tokio::spawn(async move {
            let (state, uncertain) = &*shared;
            let mut rep = VerifyReport::default();
            loop {
                let c = next.fetch_add(1, Ordering::Relaxed);
                if c >= chunks {
                    break;
                }
                let first = c * chunk_blocks;
                let n = chunk_blocks.min(region.blocks - first);
                let lbas = (n * region.lbas_per_block() as u64) as u32;
                let want_bytes = (n * region.io_block_bytes as u64) as usize;
                let data: Option<Bytes> = volume
                    .read(region.lba_of(first), lbas)
                    .await
                    .ok()
                    .filter(|d| d.len() == want_bytes);
                for b in first..first + n {
                    let (lo, hi) = state.gen_range(b, uncertain);
                    if lo == 0 && hi == 0 {
                        rep.blocks_unwritten += 1;
                        continue;
                    }
                    rep.blocks_checked += 1;
                    let Some(data) = &data else {
                        rep.add(VerifyFailure {
                            kind: VerifyKind::ReadError,
                            lba: region.lba_of(b),
                            block: b,
                            gen_min: lo,
                            gen_max: hi,
                            found_gen: None,
                            found_lba: None,
                            found_writer: None,
                        });
                        continue;
                    };
                    let off = ((b - first) * region.io_block_bytes as u64) as usize;
                    let rec = &data[off..off + region.io_block_bytes as usize];
                    if let Err(f) = check_records(rec, &region, state.map_id, b, lo, hi) {
                        if state.complete && lo < hi {
                            rep.in_flight_failures += 1;
                        }
                        rep.add(f);
                    }
                }
            }
            rep
        }));
    }
    let mut total = VerifyReport::default();
    for h in handles {
        let rep = h.await.map_err(|e| BenchError::Task(e.to_string()))?;
        total.blocks_checked += rep.blocks_checked;
        total.blocks_unwritten += rep.blocks_unwritten;
        total.in_flight_failures += rep.in_flight_failures;
        for (k, n) in rep.failures_by_kind {
            match total.failures_by_kind.iter_mut().find(|(tk, _)| *tk == k) {
                Some((_, t)) => *t += n,
                None => total.failures_by_kind.push((k, n)),
            }
        }
        total.failures.extend(rep.failures);
    }
    total.trim();
    Ok(total)
}
