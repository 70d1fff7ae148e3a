//! Windows ODX: the ROD token copy of SBC-3 (POPULATE TOKEN, WRITE USING TOKEN) and
//! SPC-4 (RECEIVE ROD TOKEN INFORMATION), on the machinery of [`crate::copy`]: its
//! chunk engine, access checks, concurrency bound and held statuses.
//!
//! POPULATE TOKEN on an LU creates a 512-byte ROD token that stands for up to
//! [`RANGES_MAX`] ranges of that LU; the initiator fetches it with RECEIVE ROD
//! TOKEN INFORMATION (same I_T nexus, same list identifier) and hands it to WRITE
//! USING TOKEN on any LU of this target that the writing nexus sees, which copies the
//! token's data (from a block offset into it) into its own ranges.
//!
//! ROD types: "access upon reference" (0001_0000h) only, the type POPULATE TOKEN
//! makes when the initiator leaves the choice to the copy manager (RTV=0): the data
//! is read when WRITE USING TOKEN runs, so writes to the source after POPULATE TOKEN
//! show in the copy. The node has no snapshots, so no point-in-time type is offered
//! (asking for one: INVALID FIELD IN PARAMETER LIST). WRITE USING TOKEN also takes
//! the block device zero ROD token (FFFF_0001h), which writes zeroes. A WRITE
//! USING TOKEN whose destination ranges overlap, or (on the token's own LU) one
//! of whose pieces would read blocks another piece writes, is refused (INVALID
//! FIELD IN PARAMETER LIST): run piece by piece it would copy new data. Not
//! done: a write to a token's source ranges does not revoke the token (the
//! access-upon-reference type lets the copy see it).
//!
//! Tokens are unforgeable and tamper-evident: each carries a 64-bit identifier and a
//! 256-bit nonce from the operating system's random source, and the target keeps
//! every live token it made in a bounded registry ([`TOKENS_MAX`]); a presented token
//! must equal the registered one byte for byte (compared in constant time). A token
//! whose identifier is not registered is TOKEN UNKNOWN; one that differs from the
//! registered bytes is TOKEN CORRUPT. A token ends (and is remembered, in a bounded
//! list, so the initiator learns why) when it has not been used for its inactivity
//! timeout or lived [`LIFETIME_MAX_S`] (TOKEN EXPIRED), when WRITE USING TOKEN set
//! DEL_TKN (TOKEN DELETED), when the registry is full and it is the least recently
//! used of the tokens already written with, or, with none written with, the least
//! recently used of an initiator holding more than its fair share while the one
//! asking holds less (TOKEN CANCELLED: a new token takes its place), and when its source LU is removed, shrinks, or gets a
//! logical unit or target reset (TOKEN REVOKED). I_T nexus loss does not end a
//! token: tokens are meant to pass between hosts.

use crate::cdb::{param_u16, param_u32, param_u64, Cdb};
use crate::copy::{
    self, check_access, copy_blocks, Copies, CopyLus, CopyRun, Finish, ListId, Source, Status,
    Through,
};
use crate::lu::{CmdResult, Done, Fail, LogicalUnit};
use crate::rw::check_range;
use crate::sense::{codes, Sense};
use crate::{status, ItNexus};
use parking_lot::{Mutex, RwLock};
use rand::RngCore;
use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

/// POPULATE TOKEN (83h).
pub(crate) const SA_POPULATE_TOKEN: u8 = 0x10;
/// WRITE USING TOKEN (83h).
pub(crate) const SA_WRITE_USING_TOKEN: u8 = 0x11;
/// RECEIVE ROD TOKEN INFORMATION (84h).
pub(crate) const SA_RECEIVE_ROD_TOKEN_INFORMATION: u8 = 0x07;

/// Bytes of a ROD token.
pub(crate) const TOKEN_LEN: usize = 512;
/// ROD type "access upon reference".
pub(crate) const ROD_ACCESS_UPON_REFERENCE: u32 = 0x0001_0000;
/// ROD type of the block device zero ROD token.
pub(crate) const ROD_BLOCK_ZERO: u32 = 0xffff_0001;
/// The ROD TOKEN LENGTH field of a 512-byte token.
const TOKEN_BODY_LEN: u16 = (TOKEN_LEN - 8) as u16;

/// Most block device range descriptors in one POPULATE TOKEN or WRITE USING TOKEN.
pub(crate) const RANGES_MAX: u16 = 64;
/// Most bytes one token represents, and one WRITE USING TOKEN writes.
pub(crate) const TOKEN_BYTES_MAX: u64 = 256 << 20;
/// The transfer size we prefer per command.
pub(crate) const OPTIMAL_BYTES: u64 = 64 << 20;
/// Live tokens per target.
pub(crate) const TOKENS_MAX: usize = 128;
/// Live ROD tokens one initiator may hold of a target's [`TOKENS_MAX`]: one
/// host copying cannot take every token and send the others' copies through
/// their hosts.
pub(crate) const TOKENS_PER_INITIATOR_MAX: usize = TOKENS_MAX / 2;
/// Ended tokens remembered per target (to tell expired, deleted and revoked apart).
const ENDED_MAX: usize = 256;
/// Inactivity timeout when POPULATE TOKEN gives 0, in seconds.
pub(crate) const INACTIVITY_DEFAULT_S: u32 = 60;
/// Largest inactivity timeout POPULATE TOKEN may ask for, in seconds.
pub(crate) const INACTIVITY_MAX_S: u32 = 600;
/// Longest a token lives, used or not, in seconds.
pub(crate) const LIFETIME_MAX_S: u32 = 3600;

/// RECEIVE ROD TOKEN INFORMATION: COPY OPERATION STATUS values.
const OP_DONE_OK: u8 = 0x01;
const OP_DONE_ERR: u8 = 0x02;
const OP_DONE_RESIDUAL: u8 = 0x04;
const OP_IN_PROGRESS: u8 = 0x10;
/// TRANSFER COUNT UNITS: logical blocks.
const UNITS_BLOCKS: u8 = 0xf1;

const PT_HEADER_LEN: usize = 16;
const WUT_HEADER_LEN: usize = 536;
const RANGE_LEN: usize = 16;

/// A time source for token expiry: the time since an arbitrary origin, never going
/// back. Tests inject their own.
pub(crate) trait Clock: Send + Sync {
    fn now(&self) -> Duration;
}

struct Monotonic(Instant);

impl Clock for Monotonic {
    fn now(&self) -> Duration {
        self.0.elapsed()
    }
}

/// A clock that moves only when told to.
#[cfg(test)]
#[derive(Default)]
pub(crate) struct ManualClock(std::sync::atomic::AtomicU64);

#[cfg(test)]
impl ManualClock {
    pub fn advance(&self, d: Duration) {
        self.0.fetch_add(d.as_millis() as u64, Ordering::Relaxed);
    }
}

#[cfg(test)]
impl Clock for ManualClock {
    fn now(&self) -> Duration {
        Duration::from_millis(self.0.load(Ordering::Relaxed))
    }
}

/// One block device range descriptor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Range {
    pub lba: u64,
    pub blocks: u32,
}

/// A parsed POPULATE TOKEN parameter list.
#[derive(Debug, PartialEq, Eq)]
struct PopulateList {
    /// Inactivity timeout in seconds (0: the default).
    inactivity_s: u32,
    /// The ROD type asked for (RTV=1), None when the copy manager chooses.
    rod_type: Option<u32>,
    ranges: Vec<Range>,
}

/// A parsed WRITE USING TOKEN parameter list.
#[derive(Debug, PartialEq, Eq)]
struct WriteList {
    del_tkn: bool,
    /// OFFSET INTO ROD, in blocks.
    offset: u64,
    token: Box<[u8; TOKEN_LEN]>,
    ranges: Vec<Range>,
}

fn param_error(byte: usize) -> Sense {
    codes::INVALID_FIELD_IN_PARAM.with_field(false, byte as u16, None)
}

/// The block device range descriptors of `p`: `len` bytes at `at` (the length field
/// is at `len_at`).
fn parse_ranges(p: &[u8], len_at: usize, at: usize) -> Result<Vec<Range>, Sense> {
    let len = param_u16(p, len_at) as usize;
    if len == 0 || !len.is_multiple_of(RANGE_LEN) {
        return Err(param_error(len_at));
    }
    if len / RANGE_LEN > RANGES_MAX as usize {
        return Err(codes::TOO_MANY_SEGMENT_DESCRIPTORS);
    }
    let area = p.get(at..at + len).ok_or(codes::PARAM_LIST_LENGTH_ERROR)?;
    Ok(area
        .chunks_exact(RANGE_LEN)
        .map(|d| Range {
            lba: param_u64(d, 0),
            blocks: param_u32(d, 8),
        })
        .collect())
}

/// The DATA LENGTH field (bytes 0-1) counts the bytes after it; the list must hold them.
fn check_data_len(p: &[u8]) -> Result<(), Sense> {
    if param_u16(p, 0) as usize + 2 > p.len() {
        return Err(codes::PARAM_LIST_LENGTH_ERROR);
    }
    Ok(())
}

/// POPULATE TOKEN parameter list, byte 2: the ROD TYPE field is valid (bit 0
/// is IMMED).
const PT_RTV: u8 = 0x02;
/// WRITE USING TOKEN parameter list, byte 2: delete the token once used (bit 0
/// is IMMED).
const WUT_DEL_TKN: u8 = 0x02;

/// Parses a POPULATE TOKEN parameter list (SBC-3 5.x).
fn parse_populate(p: &[u8]) -> Result<PopulateList, Sense> {
    if p.len() < PT_HEADER_LEN {
        return Err(codes::PARAM_LIST_LENGTH_ERROR);
    }
    check_data_len(p)?;
    // Byte 2: IMMED (bit 0) is honoured by completing at once (nothing is copied);
    // RTV (bit 1) says the ROD TYPE field is valid. (Until 2026-12-04 read from
    // bit 0: a point-in-time ROD type asked with RTV went unseen and the client
    // got an access-upon-reference token, thinking it held a snapshot.)
    let rtv = p[2] & PT_RTV != 0;
    Ok(PopulateList {
        inactivity_s: param_u32(p, 4),
        rod_type: rtv.then(|| param_u32(p, 8)),
        ranges: parse_ranges(p, 14, PT_HEADER_LEN)?,
    })
}

/// Parses a WRITE USING TOKEN parameter list.
fn parse_write(p: &[u8]) -> Result<WriteList, Sense> {
    if p.len() < WUT_HEADER_LEN {
        return Err(codes::PARAM_LIST_LENGTH_ERROR);
    }
    check_data_len(p)?;
    let mut token = Box::new([0u8; TOKEN_LEN]);
    token.copy_from_slice(&p[16..16 + TOKEN_LEN]);
    Ok(WriteList {
        del_tkn: p[2] & WUT_DEL_TKN != 0,
        offset: param_u64(p, 8),
        token,
        ranges: parse_ranges(p, 534, WUT_HEADER_LEN)?,
    })
}

/// Sum of the ranges' blocks.
fn total_blocks(ranges: &[Range]) -> u64 {
    ranges.iter().map(|r| u64::from(r.blocks)).sum()
}

/// Checks ranges against `lu`'s capacity and the transfer bound (`list_len_at`: the
/// range list length field, for the field pointer).
fn check_ranges(lu: &LogicalUnit, ranges: &[Range], list_len_at: usize) -> Result<(), Sense> {
    let geo = lu.geometry();
    for r in ranges {
        check_range(&geo, r.lba, u64::from(r.blocks)).map_err(|_| codes::LBA_OUT_OF_RANGE)?;
    }
    if total_blocks(ranges) * u64::from(geo.block_size_bytes) > TOKEN_BYTES_MAX {
        return Err(param_error(list_len_at));
    }
    Ok(())
}

/// Whether two of the ranges share a block.
fn overlapping(ranges: &[Range]) -> bool {
    let mut v: Vec<(u64, u64)> = ranges
        .iter()
        .filter(|r| r.blocks != 0)
        .map(|r| (r.lba, r.lba + u64::from(r.blocks)))
        .collect();
    v.sort_unstable();
    v.windows(2).any(|w| w[1].0 < w[0].1)
}

/// Whether a piece (source lba, destination lba, blocks) reads blocks another
/// piece writes.
fn pieces_cross(pieces: &[(u64, u64, u64)]) -> bool {
    pieces.iter().enumerate().any(|(i, &(_, d, n))| {
        pieces
            .iter()
            .enumerate()
            .any(|(j, &(s, _, m))| i != j && s < d + n && d < s + m)
    })
}

/// Equality that takes the same time wherever the first difference is.
fn same_bytes(a: &[u8; TOKEN_LEN], b: &[u8; TOKEN_LEN]) -> bool {
    a.iter()
        .zip(b.iter())
        .fold(0u8, |acc, (x, y)| acc | (x ^ y))
        == 0
}

/// Why a token ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ended {
    Expired,
    Deleted,
    Revoked,
    Cancelled,
}

impl Ended {
    fn sense(self) -> Sense {
        match self {
            Ended::Expired => codes::TOKEN_EXPIRED,
            Ended::Deleted => codes::TOKEN_DELETED,
            Ended::Revoked => codes::TOKEN_REVOKED,
            Ended::Cancelled => codes::TOKEN_CANCELLED,
        }
    }
}

/// A live token.
struct Entry {
    id: u64,
    token: Box<[u8; TOKEN_LEN]>,
    /// The source LU (weak: a removed LU is not kept alive by its tokens).
    lu: Weak<LogicalUnit>,
    /// The source's block count and block size when the token was made.
    block_count: u64,
    block_size: u32,
    ranges: Vec<Range>,
    inactivity: Duration,
    created: Duration,
    last_use: Duration,
    /// A WRITE USING TOKEN completed with it: it may be reclaimed for a new
    /// token when the registry is full (see [`Tokens::create`]).
    written: bool,
    /// The initiator that made it (POPULATE TOKEN), for its share.
    owner: Arc<str>,
}

impl Entry {
    fn expired(&self, now: Duration) -> bool {
        now.saturating_sub(self.last_use) > self.inactivity
            || now.saturating_sub(self.created) > Duration::from_secs(LIFETIME_MAX_S.into())
    }
}

struct Gone {
    id: u64,
    token: Box<[u8; TOKEN_LEN]>,
    why: Ended,
}

#[derive(Default)]
struct Registry {
    live: Vec<Entry>,
    ended: VecDeque<Gone>,
    next_id: u64,
}

impl Registry {
    fn end(&mut self, i: usize, why: Ended) {
        let e = self.live.swap_remove(i);
        if self.ended.len() >= ENDED_MAX {
            self.ended.pop_front();
        }
        self.ended.push_back(Gone {
            id: e.id,
            token: e.token,
            why,
        });
    }

    fn end_where(&mut self, why: Ended, pred: impl Fn(&Entry) -> bool) {
        while let Some(i) = self.live.iter().position(&pred) {
            self.end(i, why);
        }
    }
}

/// What a presented token stands for.
enum Resolved {
    Zeros,
    Lu {
        id: u64,
        lu: Weak<LogicalUnit>,
        block_count: u64,
        block_size: u32,
        ranges: Vec<Range>,
    },
}

/// The ROD tokens of one target.
pub(crate) struct Tokens {
    reg: Mutex<Registry>,
    clock: RwLock<Arc<dyn Clock>>,
}

impl Default for Tokens {
    fn default() -> Self {
        // Identifiers start at a random point, so that a token of an earlier run of
        // the node is unknown rather than taken for a new one (their nonces differ
        // anyway: a failed draw here costs only that distinction).
        let mut start = [0u8; 8];
        let _ = rand::rngs::OsRng.try_fill_bytes(&mut start);
        Tokens {
            reg: Mutex::new(Registry {
                next_id: u64::from_be_bytes(start),
                ..Registry::default()
            }),
            clock: RwLock::new(Arc::new(Monotonic(Instant::now()))),
        }
    }
}

impl Tokens {
    /// Replaces the clock (tests).
    #[cfg(test)]
    pub fn set_clock(&self, c: Arc<dyn Clock>) {
        *self.clock.write() = c;
    }

    fn now(&self) -> Duration {
        self.clock.read().now()
    }

    /// Live tokens now (expired ones not yet noticed included).
    #[cfg(test)]
    pub fn live(&self) -> usize {
        self.reg.lock().live.len()
    }

    /// Ends every token whose source is `lu` (removed, reset).
    pub fn revoke_lu(&self, lu: &LogicalUnit) {
        self.reg
            .lock()
            .end_where(Ended::Revoked, |e| std::ptr::eq(e.lu.as_ptr(), lu));
    }

    fn end_id(&self, id: u64, why: Ended) {
        self.reg.lock().end_where(why, |e| e.id == id);
    }

    /// A WRITE USING TOKEN completed with token `id` (not deleting it).
    fn touch(&self, id: u64) {
        let now = self.now();
        if let Some(e) = self.reg.lock().live.iter_mut().find(|e| e.id == id) {
            e.last_use = now;
            e.written = true;
        }
    }

    /// Makes a token for `ranges` of `lu`, for initiator `owner`.
    fn create(
        &self,
        lu: &Arc<LogicalUnit>,
        owner: &Arc<str>,
        ranges: Vec<Range>,
        inactivity: Duration,
    ) -> Result<Box<[u8; TOKEN_LEN]>, Sense> {
        let geo = lu.geometry();
        let mut nonce = [0u8; 32];
        rand::rngs::OsRng.try_fill_bytes(&mut nonce).map_err(|e| {
            tracing::error!(error = %e, "no random bytes for a ROD token");
            codes::INTERNAL_TARGET_FAILURE
        })?;
        let now = self.now();
        let mut reg = self.reg.lock();
        reg.end_where(Ended::Expired, |e| e.expired(now));
        let held_by =
            |reg: &Registry, who: &str| reg.live.iter().filter(|e| *e.owner == *who).count();
        // Full (the initiator's share, or the target's registry): the least
        // recently used token that has already been written with makes room
        // (TOKEN CANCELLED if presented again). Windows copies a large file
        // as one token per 64 MiB and need not delete them, so with its 60 s
        // default a copy faster than about 140 MB/s would otherwise run out
        // of tokens and fall back to moving every byte through the host. A
        // token not yet written with is reclaimed only from an initiator over
        // its fair share: its initiator is about to use it. At its share an
        // initiator reclaims only its own; with the registry full, the token
        // comes from the initiator that holds the most among those with one
        // written with.
        let own_share_full = held_by(&reg, owner) >= TOKENS_PER_INITIATOR_MAX;
        if own_share_full || reg.live.len() >= TOKENS_MAX {
            let most_held = |reg: &Registry, pick: &dyn Fn(&Entry) -> bool| {
                reg.live
                    .iter()
                    .enumerate()
                    .filter(|(_, e)| pick(e))
                    .min_by_key(|(_, e)| (std::cmp::Reverse(held_by(reg, &e.owner)), e.last_use))
                    .map(|(i, _)| i)
            };
            let mut victim = most_held(&reg, &|e: &Entry| {
                e.written && (!own_share_full || *e.owner == **owner)
            });
            if victim.is_none() && !own_share_full {
                // Full of tokens not yet written with (initiator names are
                // only claimed without CHAP: two of them could hold every
                // token for their inactivity time). An initiator under its
                // fair share (the registry over the initiators holding
                // tokens, itself included) takes the least recently used of
                // one over it.
                let mut owners: Vec<&str> = reg.live.iter().map(|e| &*e.owner).collect();
                owners.push(owner);
                owners.sort_unstable();
                owners.dedup();
                let fair = TOKENS_MAX / owners.len();
                if held_by(&reg, owner) < fair {
                    victim = most_held(&reg, &|e: &Entry| held_by(&reg, &e.owner) > fair);
                }
            }
            match victim {
                Some(i) => reg.end(i, Ended::Cancelled),
                None => return Err(codes::INSUFFICIENT_RESOURCES_FOR_ROD_TOKEN),
            }
        }
        let id = reg.next_id;
        reg.next_id = reg.next_id.wrapping_add(1);
        let bytes = total_blocks(&ranges) * u64::from(geo.block_size_bytes);
        let token = Box::new(build_token(id, lu, bytes, &nonce));
        reg.live.push(Entry {
            id,
            token: token.clone(),
            lu: Arc::downgrade(lu),
            block_count: geo.block_count,
            block_size: geo.block_size_bytes,
            ranges,
            inactivity,
            created: now,
            last_use: now,
            written: false,
            owner: owner.clone(),
        });
        Ok(token)
    }

    /// What `t` stands for, or the INVALID TOKEN OPERATION it deserves.
    fn resolve(&self, t: &[u8; TOKEN_LEN]) -> Result<Resolved, Sense> {
        let rod_type = param_u32(t, 0);
        if rod_type != ROD_ACCESS_UPON_REFERENCE && rod_type != ROD_BLOCK_ZERO {
            return Err(codes::TOKEN_UNSUPPORTED_TYPE);
        }
        if param_u16(t, 6) != TOKEN_BODY_LEN {
            return Err(codes::TOKEN_INVALID_LENGTH);
        }
        if rod_type == ROD_BLOCK_ZERO {
            return Ok(Resolved::Zeros);
        }
        let id = param_u64(t, 8);
        let now = self.now();
        let mut reg = self.reg.lock();
        if let Some(i) = reg.live.iter().position(|e| e.id == id) {
            if !same_bytes(&reg.live[i].token, t) {
                return Err(codes::TOKEN_CORRUPT);
            }
            if reg.live[i].expired(now) {
                reg.end(i, Ended::Expired);
                return Err(codes::TOKEN_EXPIRED);
            }
            let e = &mut reg.live[i];
            e.last_use = now;
            return Ok(Resolved::Lu {
                id,
                lu: e.lu.clone(),
                block_count: e.block_count,
                block_size: e.block_size,
                ranges: e.ranges.clone(),
            });
        }
        match reg.ended.iter().find(|g| g.id == id) {
            Some(g) if same_bytes(&g.token, t) => Err(g.why.sense()),
            Some(_) => Err(codes::TOKEN_CORRUPT),
            None => Err(codes::TOKEN_UNKNOWN),
        }
    }
}

/// The 512-byte ROD token (SPC-4 ROD token format): ROD type, length, the copy
/// manager's identifier, the creator LU (an identification CSCD descriptor with its
/// NAA and block size), the bytes represented, then, in the vendor-specific part, the
/// nonce.
fn build_token(id: u64, lu: &LogicalUnit, bytes: u64, nonce: &[u8; 32]) -> [u8; TOKEN_LEN] {
    let mut t = [0u8; TOKEN_LEN];
    t[0..4].copy_from_slice(&ROD_ACCESS_UPON_REFERENCE.to_be_bytes());
    t[6..8].copy_from_slice(&TOKEN_BODY_LEN.to_be_bytes());
    t[8..16].copy_from_slice(&id.to_be_bytes());
    // Creator logical unit descriptor (32 bytes at 16).
    let d = &mut t[16..48];
    d[0] = 0xe4;
    d[4] = 0x01; // binary
    d[5] = 0x03; // LU association, NAA
    d[7] = 16;
    d[8..24].copy_from_slice(&lu.config.naa);
    d[29..32].copy_from_slice(&lu.geometry().block_size_bytes.to_be_bytes()[1..]);
    // NUMBER OF BYTES REPRESENTED (16 bytes at 48).
    t[56..64].copy_from_slice(&bytes.to_be_bytes());
    t[128..160].copy_from_slice(nonce);
    t
}

/// Records how a ROD token command ended in its held status.
fn record(status: &Status, r: &Result<(), Fail>) {
    let failure = match r {
        Ok(()) => return,
        Err(Fail::Check(s, _)) => (status::CHECK_CONDITION, Some(*s)),
        Err(Fail::Conflict) => (status::RESERVATION_CONFLICT, None),
        Err(Fail::Forwarded(resp)) => (resp.status, None),
    };
    status.detail.lock().failure = Some(failure);
}

/// The Arc of `lu` among `lus`.
fn arc_of(lu: &LogicalUnit, lus: &[Arc<LogicalUnit>]) -> Option<Arc<LogicalUnit>> {
    lus.iter().find(|l| std::ptr::eq(l.as_ref(), lu)).cloned()
}

/// POPULATE TOKEN received through `lu`, whose ranges the token will stand for.
pub(crate) async fn populate_token(
    copies: &Copies,
    lu: &LogicalUnit,
    lus: &[Arc<LogicalUnit>],
    nexus: &ItNexus,
    cdb: &Cdb,
    data_out: &[u8],
) -> CmdResult {
    let list_id = cdb.u32_at(6);
    let Some(p) = crate::copy::param_list(cdb, data_out) else {
        return Ok(Done::empty());
    };
    let list = parse_populate(p)?;
    match list.rod_type {
        None | Some(ROD_ACCESS_UPON_REFERENCE) => {}
        Some(_) => return Err(param_error(8).into()),
    }
    let inactivity = match list.inactivity_s {
        0 => INACTIVITY_DEFAULT_S,
        s if s > INACTIVITY_MAX_S => return Err(param_error(4).into()),
        s => s,
    };
    let status = copies.start(nexus, ListId::Lid4(list_id))?;
    {
        let mut d = status.detail.lock();
        d.service_action = SA_POPULATE_TOKEN;
        d.block_size = lu.geometry().block_size_bytes;
    }
    let mut finish = Finish {
        status: Some(&status),
        ok: false,
    };
    let r = (|| -> Result<(), Fail> {
        check_access(lu, nexus, false, false)?;
        check_ranges(lu, &list.ranges, 14)?;
        let arc = arc_of(lu, lus).ok_or(codes::COPY_TARGET_NOT_REACHABLE)?;
        let blocks = total_blocks(&list.ranges);
        let ranges = list.ranges.into_iter().filter(|r| r.blocks != 0).collect();
        let token = copies.tokens.create(
            &arc,
            &nexus.initiator_name,
            ranges,
            Duration::from_secs(inactivity.into()),
        )?;
        let bs = u64::from(lu.geometry().block_size_bytes);
        status.bytes.store(blocks * bs, Ordering::Relaxed);
        status.detail.lock().token = Some(token);
        Ok(())
    })();
    record(&status, &r);
    finish.ok = r.is_ok();
    drop(finish);
    r.map(|()| Done::empty())
}

/// WRITE USING TOKEN received through `dst`.
pub(crate) async fn write_using_token(
    copies: &Copies,
    dst: &LogicalUnit,
    lus: &CopyLus<'_>,
    nexus: &ItNexus,
    cdb: &Cdb,
    data_out: &[u8],
) -> CmdResult {
    let list_id = cdb.u32_at(6);
    let Some(p) = crate::copy::param_list(cdb, data_out) else {
        return Ok(Done::empty());
    };
    let list = parse_write(p)?;
    // registered before waiting for a slot (as EXTENDED COPY)
    let status = copies.start(nexus, ListId::Lid4(list_id))?;
    {
        let mut d = status.detail.lock();
        d.service_action = SA_WRITE_USING_TOKEN;
        d.block_size = dst.geometry().block_size_bytes;
    }
    let mut finish = Finish {
        status: Some(&status),
        ok: false,
    };
    let _slot = copies.slot(nexus).await?;
    let r = write_token_data(copies, dst, lus, nexus, &list, &status).await;
    record(&status, &r);
    finish.ok = r.is_ok();
    drop(finish);
    r.map(|()| Done::empty())
}

/// What a token presented to this target stands for: its own tokens first;
/// one it does not know (or whose identifier one of its own has: identifiers
/// are per target) is looked for among the tokens of the other targets the
/// copy may reach ([`crate::CopyReach`]). The store that knew it, and whether
/// it is another target's.
fn resolve_token<'a>(
    copies: &'a Copies,
    lus: &'a CopyLus<'a>,
    token: &[u8; TOKEN_LEN],
) -> Result<(Resolved, &'a Tokens, bool), Sense> {
    let unknown = |e: &Sense| *e == codes::TOKEN_UNKNOWN || *e == codes::TOKEN_CORRUPT;
    let first = match copies.tokens.resolve(token) {
        Ok(r) => return Ok((r, &copies.tokens, false)),
        Err(e) if unknown(&e) => e,
        Err(e) => return Err(e),
    };
    for t in &lus.reached {
        let tokens = &t.copies().tokens;
        match tokens.resolve(token) {
            Ok(r) => return Ok((r, tokens, true)),
            Err(e) if unknown(&e) => continue,
            Err(e) => return Err(e),
        }
    }
    Err(first)
}

async fn write_token_data(
    copies: &Copies,
    dst: &LogicalUnit,
    lus: &CopyLus<'_>,
    nexus: &ItNexus,
    list: &WriteList,
    status: &Status,
) -> Result<(), Fail> {
    check_access(dst, nexus, true, false)?;
    // (from here: a reset of the destination stops the copy)
    let run = CopyRun::new();
    run.watch(dst);
    check_ranges(dst, &list.ranges, 534)?;
    if overlapping(&list.ranges) {
        return Err(param_error(WUT_HEADER_LEN).into());
    }
    let (resolved, tokens, foreign) = resolve_token(copies, lus, &list.token)?;
    let (id, src, ranges) = match resolved {
        Resolved::Zeros => {
            let pieces: Vec<_> = list
                .ranges
                .iter()
                .map(|r| (crate::copy_resume::From::Zeros, r.lba, u64::from(r.blocks)))
                .collect();
            let recorded = crate::copy_resume::Recorded::start(dst, &pieces, true).await?;
            for r in &list.ranges {
                let through = Through {
                    nexus,
                    src_foreign: false,
                    dst_foreign: false,
                    sees: lus.sees,
                };
                copy_blocks(
                    &run,
                    Source::Zeros,
                    dst,
                    r.lba,
                    u64::from(r.blocks),
                    status,
                    Some(through),
                )
                .await?;
                status.segments.fetch_add(1, Ordering::Relaxed);
            }
            recorded.done().await?;
            return run.end().await;
        }
        Resolved::Lu {
            id,
            lu,
            block_count,
            block_size,
            ranges,
        } => {
            let Some(src) = lu.upgrade() else {
                tokens.end_id(id, Ended::Revoked);
                return Err(codes::TOKEN_REVOKED.into());
            };
            let g = src.geometry();
            if g.block_count < block_count || g.block_size_bytes != block_size {
                tokens.end_id(id, Ended::Revoked);
                return Err(codes::TOKEN_REVOKED.into());
            }
            let seen = if foreign { &lus.foreign } else { &lus.own };
            if arc_of(&src, seen).is_none() {
                return Err(codes::COPY_TARGET_NOT_REACHABLE.into());
            }
            (id, src, ranges)
        }
    };
    check_access(&src, nexus, false, foreign)?;
    run.watch(&src);
    let available = total_blocks(&ranges);
    if list.offset >= available && total_blocks(&list.ranges) > 0 {
        return Err(param_error(8).into());
    }
    // Walk the token's ranges from the offset while filling the destination
    // ranges: the pieces (source lba, destination lba, blocks), and after how
    // many of them each destination range is complete, worked out before any
    // block moves so that the copy can be recorded whole (crate::copy_resume).
    let mut pieces: Vec<(u64, u64, u64)> = Vec::new();
    let mut range_ends: Vec<usize> = Vec::new();
    let mut src_pieces = ranges.iter().map(|r| (r.lba, u64::from(r.blocks)));
    let mut skip = list.offset;
    let mut cur: Option<(u64, u64)> = None;
    'dst: for r in &list.ranges {
        let mut lba = r.lba;
        let mut left = u64::from(r.blocks);
        while left > 0 {
            let (s_lba, s_left) = match cur.take() {
                Some(c) => c,
                None => loop {
                    let Some((l, n)) = src_pieces.next() else {
                        status.detail.lock().residual = true;
                        break 'dst;
                    };
                    if skip >= n {
                        skip -= n;
                        continue;
                    }
                    let piece = (l + skip, n - skip);
                    skip = 0;
                    break piece;
                },
            };
            let n = left.min(s_left);
            pieces.push((s_lba, lba, n));
            if n < s_left {
                cur = Some((s_lba + n, s_left - n));
            }
            lba += n;
            left -= n;
        }
        range_ends.push(pieces.len());
    }
    // on one LU, no piece may read what another writes: run one after the
    // other, a later piece would read an earlier one's new data instead of the
    // token's (within a piece the engine copies as memmove does). Refused as
    // the overlapping destination ranges above are.
    if std::ptr::eq(Arc::as_ptr(&src), dst) && pieces_cross(&pieces) {
        return Err(param_error(WUT_HEADER_LEN).into());
    }
    let plan: Vec<_> = pieces
        .iter()
        .map(|&(s, d, n)| (crate::copy_resume::From::Lu(&src, s), d, n))
        .collect();
    let recorded = crate::copy_resume::Recorded::start(dst, &plan, !foreign).await?;
    // a destination range counts once its last piece is written
    let ended = |k: usize| range_ends.iter().filter(|&&e| e == k).count() as u16;
    status.segments.fetch_add(ended(0), Ordering::Relaxed);
    for (i, &(s_lba, lba, n)) in pieces.iter().enumerate() {
        let through = Through {
            nexus,
            src_foreign: foreign,
            dst_foreign: false,
            sees: lus.sees,
        };
        copy_blocks(
            &run,
            Source::Lu(&src, s_lba),
            dst,
            lba,
            n,
            status,
            Some(through),
        )
        .await?;
        status.segments.fetch_add(ended(i + 1), Ordering::Relaxed);
    }
    recorded.done().await?;
    run.end().await?;
    if list.del_tkn {
        tokens.end_id(id, Ended::Deleted);
    } else {
        tokens.touch(id);
    }
    Ok(())
}

/// RECEIVE ROD TOKEN INFORMATION: the held status of the POPULATE TOKEN or WRITE
/// USING TOKEN with this list identifier from this I_T nexus, with the token.
pub(crate) fn receive_rod_token_information(
    copies: &Copies,
    lu: &LogicalUnit,
    nexus: &ItNexus,
    cdb: &Cdb,
) -> CmdResult {
    let alloc_len = cdb.u32_at(10);
    let Some(s) = copies.find(nexus, ListId::Lid4(cdb.u32_at(2))) else {
        return Err(cdb.invalid(2, None).into());
    };
    let state = s.state.load(Ordering::Acquire);
    let detail = s.detail.lock();
    let op_status = match state {
        copy::IN_PROGRESS => OP_IN_PROGRESS,
        copy::DONE_OK if detail.residual => OP_DONE_RESIDUAL,
        copy::DONE_OK => OP_DONE_OK,
        _ => OP_DONE_ERR,
    };
    let (completion, sense) = match detail.failure {
        Some((st, sense)) => (st, sense.map(|s| s.encode(lu.descriptor_sense()))),
        // Ended with errors but nothing recorded: its command was aborted.
        None if op_status == OP_DONE_ERR => (status::TASK_ABORTED, None),
        None => (status::GOOD, None),
    };
    let sense = sense.unwrap_or_default();
    let mut d = vec![0u8; 32];
    d[4] = detail.service_action;
    d[5] = op_status;
    d[12] = completion;
    d[13] = sense.len() as u8; // LENGTH OF THE SENSE DATA FIELD
    d[14] = sense.len() as u8; // SENSE DATA LENGTH
    d[15] = UNITS_BLOCKS;
    let bs = u64::from(detail.block_size.max(1));
    d[16..24].copy_from_slice(&(s.bytes.load(Ordering::Relaxed) / bs).to_be_bytes());
    d[24..26].copy_from_slice(&s.segments.load(Ordering::Relaxed).to_be_bytes());
    d.extend_from_slice(&sense);
    match (&detail.token, state) {
        (Some(t), copy::DONE_OK) => {
            // ROD TOKEN DESCRIPTORS LENGTH, then one descriptor: 2 reserved bytes and
            // the token.
            d.extend_from_slice(&((TOKEN_LEN + 2) as u32).to_be_bytes());
            d.extend_from_slice(&[0, 0]);
            d.extend_from_slice(&t[..]);
        }
        _ => d.extend_from_slice(&0u32.to_be_bytes()),
    }
    let avail = (d.len() - 4) as u32;
    d[0..4].copy_from_slice(&avail.to_be_bytes());
    Ok(Done::alloc(d, alloc_len))
}

/// Most blocks one token stands for on `lu`.
fn token_blocks_max(lu: &LogicalUnit) -> u64 {
    TOKEN_BYTES_MAX / u64::from(lu.geometry().block_size_bytes.max(1))
}

/// The Block Device ROD Token Limits descriptor (0000h, SBC-3).
pub(crate) fn rod_limits_descriptor(out: &mut Vec<u8>, lu: &LogicalUnit) {
    let mut body = vec![0u8; 32];
    body[6..8].copy_from_slice(&RANGES_MAX.to_be_bytes());
    body[8..12].copy_from_slice(&INACTIVITY_MAX_S.to_be_bytes());
    body[12..16].copy_from_slice(&INACTIVITY_DEFAULT_S.to_be_bytes());
    body[16..24].copy_from_slice(&token_blocks_max(lu).to_be_bytes());
    let optimal = OPTIMAL_BYTES / u64::from(lu.geometry().block_size_bytes.max(1));
    body[24..32].copy_from_slice(&optimal.to_be_bytes());
    copy::tpc_descriptor(out, 0x0000, body);
}

/// The ROD Token Features (0106h) and Supported ROD Types (0108h) descriptors.
pub(crate) fn rod_descriptors(out: &mut Vec<u8>, lu: &LogicalUnit) {
    // ROD Token Features: no remote tokens; lifetimes; one block device features
    // descriptor.
    let mut body = vec![0u8; 44 + 64];
    body[12..16].copy_from_slice(&1u32.to_be_bytes()); // MINIMUM TOKEN LIFETIME
    body[16..20].copy_from_slice(&LIFETIME_MAX_S.to_be_bytes());
    body[20..24].copy_from_slice(&INACTIVITY_MAX_S.to_be_bytes());
    body[42..44].copy_from_slice(&64u16.to_be_bytes());
    let f = &mut body[44..];
    f[0] = 0x00; // direct access block device
    f[2..4].copy_from_slice(&60u16.to_be_bytes());
    let bs = u64::from(lu.geometry().block_size_bytes);
    f[6..8].copy_from_slice(&1u16.to_be_bytes()); // OPTIMAL BLOCK ROD LENGTH GRANULARITY
    f[8..16].copy_from_slice(&TOKEN_BYTES_MAX.to_be_bytes()); // MAXIMUM BYTES IN BLOCK ROD
    f[16..24].copy_from_slice(&OPTIMAL_BYTES.to_be_bytes());
    f[24..32].copy_from_slice(&(copy::CHUNK_BYTES.max(bs)).to_be_bytes());
    f[32..40].copy_from_slice(&(copy::CHUNK_BYTES.max(bs)).to_be_bytes());
    copy::tpc_descriptor(out, 0x0106, body);
    // Supported ROD Types: access upon reference (in and out), block device zero
    // (in only).
    let types: [(u32, u8); 2] = [(ROD_ACCESS_UPON_REFERENCE, 0x03), (ROD_BLOCK_ZERO, 0x02)];
    let mut body = vec![0u8; 4];
    body[2..4].copy_from_slice(&((types.len() * 8) as u16).to_be_bytes());
    for (t, flags) in types {
        body.extend_from_slice(&t.to_be_bytes());
        body.extend_from_slice(&[flags, 0, 0, 0]);
    }
    copy::tpc_descriptor(out, 0x0108, body);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ranges(rs: &[(u64, u32)]) -> Vec<u8> {
        let mut v = Vec::new();
        for &(lba, n) in rs {
            let mut d = [0u8; RANGE_LEN];
            d[0..8].copy_from_slice(&lba.to_be_bytes());
            d[8..12].copy_from_slice(&n.to_be_bytes());
            v.extend_from_slice(&d);
        }
        v
    }

    fn populate(rtv: Option<u32>, timeout: u32, rs: &[(u64, u32)]) -> Vec<u8> {
        let r = ranges(rs);
        let mut p = vec![0u8; PT_HEADER_LEN];
        p[0..2].copy_from_slice(&((PT_HEADER_LEN - 2 + r.len()) as u16).to_be_bytes());
        if let Some(t) = rtv {
            p[2] = PT_RTV;
            p[8..12].copy_from_slice(&t.to_be_bytes());
        }
        p[4..8].copy_from_slice(&timeout.to_be_bytes());
        p[14..16].copy_from_slice(&(r.len() as u16).to_be_bytes());
        p.extend_from_slice(&r);
        p
    }

    fn write(offset: u64, token: &[u8; TOKEN_LEN], rs: &[(u64, u32)]) -> Vec<u8> {
        let r = ranges(rs);
        let mut p = vec![0u8; WUT_HEADER_LEN];
        p[0..2].copy_from_slice(&((WUT_HEADER_LEN - 2 + r.len()) as u16).to_be_bytes());
        p[2] = WUT_DEL_TKN;
        p[8..16].copy_from_slice(&offset.to_be_bytes());
        p[16..528].copy_from_slice(token);
        p[534..536].copy_from_slice(&(r.len() as u16).to_be_bytes());
        p.extend_from_slice(&r);
        p
    }

    /// Byte 2's bits as SBC-3 numbers them: IMMED is bit 0 in both lists; RTV
    /// and DEL_TKN are bit 1.
    #[test]
    fn immed_is_bit_0_and_rtv_and_del_tkn_bit_1() {
        let mut p = populate(Some(0x0080_0000), 30, &[(8, 16)]);
        assert_eq!(parse_populate(&p).unwrap().rod_type, Some(0x0080_0000));
        p[2] = 0x01; // IMMED only: the ROD TYPE field is not valid
        assert_eq!(parse_populate(&p).unwrap().rod_type, None);
        let mut w = write(0, &[7u8; TOKEN_LEN], &[(0, 8)]);
        assert!(parse_write(&w).unwrap().del_tkn);
        w[2] = 0x01; // IMMED only
        assert!(!parse_write(&w).unwrap().del_tkn);
    }

    #[test]
    fn parses_populate_token_lists() {
        let l = parse_populate(&populate(None, 30, &[(8, 16), (100, 1)])).unwrap();
        assert_eq!(l.inactivity_s, 30);
        assert_eq!(l.rod_type, None);
        assert_eq!(
            l.ranges,
            vec![
                Range { lba: 8, blocks: 16 },
                Range {
                    lba: 100,
                    blocks: 1
                }
            ]
        );
        let l = parse_populate(&populate(Some(ROD_ACCESS_UPON_REFERENCE), 0, &[(0, 1)])).unwrap();
        assert_eq!(l.rod_type, Some(ROD_ACCESS_UPON_REFERENCE));
    }

    #[test]
    fn refuses_bad_populate_token_lists() {
        let good = populate(None, 0, &[(0, 1), (5, 5)]);
        // Truncated: in the header, in the descriptors, against DATA LENGTH.
        for cut in [PT_HEADER_LEN - 1, good.len() - 1] {
            assert_eq!(
                parse_populate(&good[..cut]),
                Err(codes::PARAM_LIST_LENGTH_ERROR)
            );
        }
        // No ranges, a list length that is not a multiple of 16.
        let mut p = populate(None, 0, &[]);
        assert_eq!(parse_populate(&p), Err(param_error(14)));
        p[14..16].copy_from_slice(&8u16.to_be_bytes());
        p.extend_from_slice(&[0; 8]);
        assert_eq!(parse_populate(&p), Err(param_error(14)));
        // One range too many.
        let many: Vec<(u64, u32)> = (0..=RANGES_MAX as u64).map(|i| (i, 1)).collect();
        assert_eq!(
            parse_populate(&populate(None, 0, &many)),
            Err(codes::TOO_MANY_SEGMENT_DESCRIPTORS)
        );
        let ok: Vec<(u64, u32)> = (0..RANGES_MAX as u64).map(|i| (i, 1)).collect();
        assert_eq!(
            parse_populate(&populate(None, 0, &ok))
                .unwrap()
                .ranges
                .len(),
            64
        );
    }

    #[test]
    fn parses_and_refuses_write_using_token_lists() {
        let mut token = [0u8; TOKEN_LEN];
        token[0..4].copy_from_slice(&ROD_BLOCK_ZERO.to_be_bytes());
        token[511] = 0x77;
        let p = write(3, &token, &[(10, 2)]);
        let l = parse_write(&p).unwrap();
        assert!(l.del_tkn);
        assert_eq!(l.offset, 3);
        assert_eq!(*l.token, token);
        assert_eq!(l.ranges, vec![Range { lba: 10, blocks: 2 }]);
        for cut in [0, 17, WUT_HEADER_LEN - 1, p.len() - 1] {
            assert_eq!(parse_write(&p[..cut]), Err(codes::PARAM_LIST_LENGTH_ERROR));
        }
        let many: Vec<(u64, u32)> = (0..=RANGES_MAX as u64).map(|i| (i, 1)).collect();
        assert_eq!(
            parse_write(&write(0, &token, &many)),
            Err(codes::TOO_MANY_SEGMENT_DESCRIPTORS)
        );
        assert_eq!(parse_write(&write(0, &token, &[])), Err(param_error(534)));
    }

    mod props {
        use super::*;
        use proptest::prelude::*;

        proptest! {
            /// Any bytes: an answer, never a panic.
            #[test]
            fn arbitrary_lists_never_panic(p in prop::collection::vec(any::<u8>(), 0..1200)) {
                let _ = parse_populate(&p);
                let _ = parse_write(&p);
            }

            /// Well-formed lists give back what they carry, cut ones a length error.
            #[test]
            fn well_formed_lists_round_trip(
                rs in prop::collection::vec((any::<u64>(), any::<u32>()), 1..=RANGES_MAX as usize),
                offset in any::<u64>(),
                fill in any::<u8>(),
                cut in 1usize..16,
            ) {
                let want: Vec<Range> =
                    rs.iter().map(|&(lba, blocks)| Range { lba, blocks }).collect();
                let p = populate(None, 7, &rs);
                prop_assert_eq!(&parse_populate(&p).unwrap().ranges, &want);
                prop_assert_eq!(
                    parse_populate(&p[..p.len() - cut]),
                    Err(codes::PARAM_LIST_LENGTH_ERROR)
                );
                let token = [fill; TOKEN_LEN];
                let p = write(offset, &token, &rs);
                let l = parse_write(&p).unwrap();
                prop_assert_eq!(l.offset, offset);
                prop_assert_eq!(&l.ranges, &want);
                prop_assert_eq!(*l.token, token);
                prop_assert_eq!(
                    parse_write(&p[..p.len() - cut]),
                    Err(codes::PARAM_LIST_LENGTH_ERROR)
                );
            }
        }
    }

    #[test]
    fn overlap_and_constant_time_equality() {
        let r = |lba, blocks| Range { lba, blocks };
        assert!(!overlapping(&[r(0, 4), r(4, 4), r(100, 0), r(2, 0)]));
        assert!(overlapping(&[r(10, 4), r(0, 11)]));
        let a = [1u8; TOKEN_LEN];
        let mut b = a;
        assert!(same_bytes(&a, &b));
        b[300] ^= 1;
        assert!(!same_bytes(&a, &b));
    }
}
