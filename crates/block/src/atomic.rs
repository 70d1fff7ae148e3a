//! Atomic writes (SCSI WRITE ATOMIC(16)): a write lands whole or not at all,
//! across a crash, and nothing running at the same time sees part of it.
//!
//! [`AtomicWrites`] wraps the volume a LUN serves (the *data*) and a small second
//! volume (the *record area*, a file beside the LUN's state) cut into
//! [`ATOMIC_SLOTS`] slots. An atomic write:
//! 1. takes its block range exclusively (see "The gate" below): reads and writes
//!    that overlap it wait, and it waits for those already running;
//! 2. takes a sequence number and writes a *record* into a free slot, FUA: a header
//!    (magic, version, block size, sequence, LBA, block count, the volume's key, and
//!    one crc32c over the header and the data) followed by the data, in one write;
//! 3. writes the data in place, FUA;
//! 4. clears the slot's header, FUA; only then is it answered and its range
//!    released.
//!
//! Why that is all or nothing: a crash before the record is durable leaves the
//! blocks as they were (nothing was written in place, and a torn record fails its
//! checksum). From then on the next open replays the record (steps 3 and 4), so the
//! blocks end up holding all of the new data whatever step 3 had done. A record is
//! cleared before its range is released, so a replay can never undo a later write.
//! Sequence numbers are taken under the range lock, so overlapping records replay
//! in the order their writes ran.
//!
//! The gate: plain reads and writes normally take no lock (one counter up and down).
//! While an atomic write is pending they take their range shared in a [`RangeLocks`]
//! table, and the atomic write first waits for the unlocked ones still running to
//! end, then takes its range exclusively.
//!
//! Replay runs before the first operation of any kind (or at [`AtomicWrites::recover`]).
//! What it does not do: atomic writes larger than [`ATOMIC_BYTES_MAX`], or through a
//! volume replicated to a partner node (the record area is this node's).
//!
//! An atomic write runs to its end on a task of its own: a caller that gives up
//! does not leave a record behind (a restart would apply it over later writes) or
//! a slot taken. One whose in-place write (or the clearing of its record) fails is
//! answered with the error and its record is *kept*: the next operation of any
//! kind that overlaps it first applies and clears it (as a restart would), or
//! fails while that cannot be done; so no write answered after it is undone by a
//! replay, and no read sees it half done.

use crate::rangelock::{LockMode, RangeGuard, RangeLocks};
use crate::{BlockError, BlockResult, Bytes, BytesMut, Extent, Geometry, Volume, VolumeRef};
use async_trait::async_trait;
use parking_lot::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use tokio::sync::{Notify, OnceCell, Semaphore};

/// Most bytes one atomic write may carry (256 blocks of 4 KiB, 2048 of 512 bytes).
pub const ATOMIC_BYTES_MAX: u64 = 1 << 20;
/// Atomic writes whose records may be written at once.
pub const ATOMIC_SLOTS: u64 = 4;

const MAGIC: &[u8; 8] = b"FSATOMIC";
const VERSION: u32 = 1;
/// Header bytes covered by the checksum (the checksum follows them).
const HEADER_SUMMED: usize = 44;

/// Blocks of one slot: a header block, then room for the largest write.
fn slot_blocks(block_size: u32) -> u64 {
    1 + ATOMIC_BYTES_MAX / block_size.max(1) as u64
}

/// A record as the record area holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Record {
    seq: u64,
    lba: u64,
    /// Which volume the record is for ([`AtomicWrites::new`]'s `key`).
    key: u64,
    data: Bytes,
}

fn encode(block_size: u32, r: &Record) -> Bytes {
    let bs = block_size as usize;
    let mut out = BytesMut::zeroed(bs + r.data.len());
    out[0..8].copy_from_slice(MAGIC);
    out[8..12].copy_from_slice(&VERSION.to_le_bytes());
    out[12..16].copy_from_slice(&block_size.to_le_bytes());
    out[16..24].copy_from_slice(&r.seq.to_le_bytes());
    out[24..32].copy_from_slice(&r.lba.to_le_bytes());
    let blocks = (r.data.len() / bs) as u32;
    out[32..36].copy_from_slice(&blocks.to_le_bytes());
    out[36..44].copy_from_slice(&r.key.to_le_bytes());
    let crc = crc32c::crc32c_append(crc32c::crc32c(&out[..HEADER_SUMMED]), &r.data);
    out[44..48].copy_from_slice(&crc.to_le_bytes());
    out[bs..].copy_from_slice(&r.data);
    out.freeze()
}

/// The block count a header names, if it is one of ours for this block size.
fn header_blocks(block_size: u32, h: &[u8]) -> Option<u32> {
    if h.len() < 48 || &h[0..8] != MAGIC {
        return None;
    }
    let u32_at = |i: usize| u32::from_le_bytes([h[i], h[i + 1], h[i + 2], h[i + 3]]);
    if u32_at(8) != VERSION || u32_at(12) != block_size {
        return None;
    }
    Some(u32_at(32))
}

/// The record in `header` + `data`, if its checksum holds.
fn decode(block_size: u32, header: &[u8], data: Bytes) -> Option<Record> {
    let blocks = header_blocks(block_size, header)?;
    if data.len() != blocks as usize * block_size as usize {
        return None;
    }
    let u64_at = |i: usize| {
        let mut b = [0u8; 8];
        b.copy_from_slice(&header[i..i + 8]);
        u64::from_le_bytes(b)
    };
    let want = u32::from_le_bytes([header[44], header[45], header[46], header[47]]);
    let crc = crc32c::crc32c_append(crc32c::crc32c(&header[..HEADER_SUMMED]), &data);
    (crc == want).then(|| Record {
        seq: u64_at(16),
        lba: u64_at(24),
        key: u64_at(36),
        data,
    })
}

/// Plain operations' side of the gate (see the module notes).
struct Gate {
    /// Atomic writes waiting for or holding their range.
    pending: AtomicUsize,
    /// Plain operations running without a range lock.
    unlocked: AtomicUsize,
    /// Woken when an unlocked operation ends while an atomic write is pending.
    drained: Notify,
    locks: RangeLocks,
}

/// Counts an unlocked plain operation until dropped.
struct Unlocked<'a>(&'a Gate);

impl Drop for Unlocked<'_> {
    fn drop(&mut self) {
        self.0.unlocked.fetch_sub(1, Ordering::SeqCst);
        if self.0.pending.load(Ordering::SeqCst) > 0 {
            self.0.drained.notify_waiters();
        }
    }
}

/// Counts a read bound for a socket for as long as its bytes live
/// ([`Volume::read_to_socket`]).
struct HeldView(std::sync::Arc<Inner>);

impl Drop for HeldView {
    fn drop(&mut self) {
        self.0.views.fetch_sub(1, Ordering::SeqCst);
        if self.0.views_off.load(Ordering::SeqCst) {
            self.0.views_gone.notify_waiters();
        }
    }
}

/// A read's bytes with the count they hold.
struct HeldBytes {
    data: Bytes,
    _held: HeldView,
}

impl AsRef<[u8]> for HeldBytes {
    fn as_ref(&self) -> &[u8] {
        &self.data
    }
}

/// Counts a pending atomic write until dropped.
struct Pending<'a>(&'a Gate);

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        self.0.pending.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Gate {
    /// Admits a plain operation over `[lba, lba + blocks)`: unlocked while no
    /// atomic write is pending, else with its range held shared.
    async fn admit(&self, lba: u64, blocks: u64) -> Admitted<'_> {
        self.unlocked.fetch_add(1, Ordering::SeqCst);
        let fast = Unlocked(self);
        if self.pending.load(Ordering::SeqCst) == 0 {
            return Admitted::Unlocked(fast);
        }
        drop(fast);
        Admitted::Locked(
            self.locks
                .lock(lba, lba.saturating_add(blocks), LockMode::Shared)
                .await,
        )
    }
}

/// A volume with atomic writes (see the module notes).
pub struct AtomicWrites {
    inner: std::sync::Arc<Inner>,
}

/// An atomic write answered with an error whose record stayed in its slot
/// (its in-place write or the clearing of its record failed): a restart would
/// apply it, so no later operation may touch its blocks before it is applied
/// and cleared here ([`Inner::settle`]).
#[derive(Clone)]
struct Kept {
    slot: usize,
    seq: u64,
    lba: u64,
    data: Bytes,
}

struct Inner {
    data: VolumeRef,
    records: VolumeRef,
    key: u64,
    block_size: u32,
    max_blocks: u32,
    ready: OnceCell<()>,
    gate: Gate,
    /// Free slots (true = free), and one permit per free slot.
    free: Mutex<Vec<bool>>,
    permits: Semaphore,
    next_seq: AtomicU64,
    /// Records kept by failed atomic writes, and how many (read without the lock
    /// on every operation).
    kept: Mutex<Vec<Kept>>,
    kept_count: AtomicUsize,
    /// Reads bound for a socket whose bytes (perhaps views of the pages
    /// below, read when the socket copies them) are still alive.
    views: AtomicUsize,
    /// Set by the first atomic write: from then on reads bound for a socket
    /// are copies, and the views handed out before are waited for once.
    views_off: AtomicBool,
    /// Woken when a view's bytes are dropped once `views_off` is set.
    views_gone: Notify,
}

/// What admits an operation through the gate, held while it runs.
enum Admitted<'a> {
    Unlocked(#[allow(dead_code)] Unlocked<'a>),
    Locked(#[allow(dead_code)] RangeGuard<'a>),
}

impl AtomicWrites {
    /// The key [`AtomicWrites::new`] takes for a volume named by `id` (freesan: the
    /// LUN's NAA), folded to 64 bits.
    pub fn key_of(id: &[u8]) -> u64 {
        let mut key = [0u8; 8];
        for (i, b) in id.iter().enumerate() {
            key[i % 8] ^= b;
        }
        u64::from_le_bytes(key)
    }

    /// A record as slot `slot` of the record area holds it, at byte
    /// `slot as u64 * slot_bytes(block_size)`: for tools and for tests that plant
    /// what a crash would have left.
    pub fn record(block_size: u32, seq: u64, lba: u64, key: u64, data: Bytes) -> Bytes {
        encode(
            block_size,
            &Record {
                seq,
                lba,
                key,
                data,
            },
        )
    }

    /// Bytes of one slot of the record area.
    pub fn slot_bytes(block_size: u32) -> u64 {
        slot_blocks(block_size) * block_size as u64
    }

    /// Bytes the record area needs for a data volume of `block_size`-byte blocks.
    pub fn records_bytes(block_size: u32) -> u64 {
        ATOMIC_SLOTS * slot_blocks(block_size) * block_size as u64
    }

    /// Wraps `data`, keeping records in `records`, which must have the data's block
    /// size and at least [`AtomicWrites::records_bytes`]. `key` names the data
    /// volume (freesan uses the LUN's identity): a record written for another key (a
    /// record area left over from a LUN since replaced) is never applied. Replays
    /// nothing yet.
    pub fn new(data: VolumeRef, records: VolumeRef, key: u64) -> BlockResult<AtomicWrites> {
        let g = data.geometry();
        let rg = records.geometry();
        if rg.block_size_bytes != g.block_size_bytes
            || rg.size_bytes() < Self::records_bytes(g.block_size_bytes)
        {
            return Err(BlockError::Unavailable(format!(
                "the atomic-write record area needs {} bytes in blocks of {}; it has {} in blocks of {}",
                Self::records_bytes(g.block_size_bytes),
                g.block_size_bytes,
                rg.size_bytes(),
                rg.block_size_bytes
            )));
        }
        let max_blocks = (ATOMIC_BYTES_MAX / g.block_size_bytes.max(1) as u64)
            .min(g.max_io_blocks.max(1) as u64) as u32;
        Ok(AtomicWrites {
            inner: std::sync::Arc::new(Inner {
                data,
                records,
                key,
                block_size: g.block_size_bytes,
                max_blocks,
                ready: OnceCell::new(),
                gate: Gate {
                    pending: AtomicUsize::new(0),
                    unlocked: AtomicUsize::new(0),
                    drained: Notify::new(),
                    locks: RangeLocks::default(),
                },
                free: Mutex::new(vec![true; ATOMIC_SLOTS as usize]),
                permits: Semaphore::new(ATOMIC_SLOTS as usize),
                next_seq: AtomicU64::new(1),
                kept: Mutex::new(Vec::new()),
                kept_count: AtomicUsize::new(0),
                views: AtomicUsize::new(0),
                views_off: AtomicBool::new(false),
                views_gone: Notify::new(),
            }),
        })
    }

    /// Applies every record a crash left (in sequence order), clears it, and
    /// returns how many there were. Runs once; every operation waits for it.
    pub async fn recover(&self) -> BlockResult<usize> {
        self.inner.recover().await
    }
}

impl Inner {
    fn slot_lba(&self, slot: usize) -> u64 {
        slot as u64 * slot_blocks(self.block_size)
    }

    async fn recover(&self) -> BlockResult<usize> {
        let mut n = 0;
        self.ready
            .get_or_try_init(|| async {
                n = self.replay().await?;
                Ok::<(), BlockError>(())
            })
            .await?;
        Ok(n)
    }

    async fn ready(&self) -> BlockResult<()> {
        if self.ready.initialized() {
            return Ok(());
        }
        self.recover().await.map(|_| ())
    }

    /// Whether a kept record overlaps `[lba, lba + blocks)`.
    fn kept_overlaps(&self, lba: u64, blocks: u64) -> bool {
        if self.kept_count.load(Ordering::SeqCst) == 0 {
            return false;
        }
        let bs = self.block_size.max(1) as u64;
        let end = lba.saturating_add(blocks);
        self.kept.lock().iter().any(|k| {
            let k_end = k.lba + k.data.len() as u64 / bs;
            k.lba < end && lba < k_end
        })
    }

    /// Ends the handing out of views to reads bound for a socket and waits
    /// for those handed out before to be sent (once per volume: later atomic
    /// writes find none). A view is read when the socket copies it, so one
    /// that outlived the start of this write could show part of it.
    async fn close_views(&self) {
        self.views_off.store(true, Ordering::SeqCst);
        loop {
            let gone = self.views_gone.notified();
            tokio::pin!(gone);
            gone.as_mut().enable();
            if self.views.load(Ordering::SeqCst) == 0 {
                break;
            }
            gone.await;
        }
    }

    /// Waits for the unlocked plain operations still running to end, with
    /// `pending` counting the caller (so that no new one starts unlocked).
    async fn drain_unlocked(&self) {
        loop {
            let drained = self.gate.drained.notified();
            tokio::pin!(drained);
            drained.as_mut().enable();
            if self.gate.unlocked.load(Ordering::SeqCst) == 0 {
                break;
            }
            drained.await;
        }
    }

    /// Runs a plain operation over `[lba, lba + blocks)`, after applying the
    /// kept records it would overlap (see [`Kept`]).
    async fn plain<T>(
        self: &std::sync::Arc<Self>,
        lba: u64,
        blocks: u64,
        op: impl std::future::Future<Output = BlockResult<T>>,
    ) -> BlockResult<T> {
        self.ready().await?;
        loop {
            let admitted = self.gate.admit(lba, blocks).await;
            // checked once admitted: a failed atomic write keeps its record before
            // it lets go of its range
            if self.kept_overlaps(lba, blocks) {
                drop(admitted);
                // to its end even if dropped (`crate::detach`), as below
                crate::detach::detached(self.clone().settle()).await?;
                continue;
            }
            let r = op.await;
            drop(admitted);
            return r;
        }
    }

    /// Applies and clears every kept record, in sequence order, each under its
    /// range held exclusively. Fails (the caller with it) while one cannot be.
    async fn settle(self: std::sync::Arc<Self>) -> BlockResult<()> {
        self.gate.pending.fetch_add(1, Ordering::SeqCst);
        let pending = Pending(&self.gate);
        self.drain_unlocked().await;
        let mut kept = self.kept.lock().clone();
        kept.sort_by_key(|k| k.seq);
        let bs = self.block_size as usize;
        for k in kept {
            let blocks = (k.data.len() / bs) as u64;
            let _range = self
                .gate
                .locks
                .lock(k.lba, k.lba + blocks, LockMode::Exclusive)
                .await;
            if !self.kept.lock().iter().any(|x| x.slot == k.slot) {
                continue; // another caller settled it
            }
            self.data.write(k.lba, k.data.clone(), true).await?;
            self.records
                .write(self.slot_lba(k.slot), Bytes::from(vec![0u8; bs]), true)
                .await?;
            tracing::info!(
                slot = k.slot,
                lba = k.lba,
                blocks,
                "a failed atomic write's record was applied and cleared"
            );
            let mut held = self.kept.lock();
            if let Some(i) = held.iter().position(|x| x.slot == k.slot) {
                held.swap_remove(i);
                self.kept_count.fetch_sub(1, Ordering::SeqCst);
                self.free.lock()[k.slot] = true;
                self.permits.add_permits(1);
            }
        }
        drop(pending);
        Ok(())
    }

    async fn replay(&self) -> BlockResult<usize> {
        let bs = self.block_size;
        let g = self.data.geometry();
        let mut found = Vec::new();
        for slot in 0..ATOMIC_SLOTS as usize {
            let at = self.slot_lba(slot);
            let header = self.records.read(at, 1).await?;
            let Some(blocks) = header_blocks(bs, &header) else {
                continue;
            };
            if blocks == 0 || blocks as u64 >= slot_blocks(bs) {
                continue;
            }
            let data = self.records.read(at + 1, blocks).await?;
            match decode(bs, &header, data) {
                Some(r) if r.key != self.key => tracing::warn!(
                    slot,
                    key = r.key,
                    "atomic write record of another volume: not applied"
                ),
                Some(r) if r.lba.saturating_add(blocks as u64) <= g.block_count => {
                    found.push((slot, r))
                }
                Some(r) => tracing::warn!(
                    slot,
                    lba = r.lba,
                    blocks,
                    "atomic write record beyond the end of the volume: not applied"
                ),
                None => {}
            }
        }
        found.sort_by_key(|(_, r)| r.seq);
        let zero = Bytes::from(vec![0u8; bs as usize]);
        for (slot, r) in &found {
            tracing::info!(
                slot,
                seq = r.seq,
                lba = r.lba,
                blocks = r.data.len() / bs as usize,
                "applying an atomic write a crash interrupted"
            );
            self.data.write(r.lba, r.data.clone(), true).await?;
            self.records
                .write(self.slot_lba(*slot), zero.clone(), true)
                .await?;
        }
        let top = found.iter().map(|(_, r)| r.seq).max().unwrap_or(0);
        self.next_seq.store(top + 1, Ordering::SeqCst);
        Ok(found.len())
    }

    async fn atomic(self: std::sync::Arc<Self>, lba: u64, data: Bytes) -> BlockResult<()> {
        let bs = self.block_size as usize;
        if data.is_empty() || !data.len().is_multiple_of(bs) {
            return Err(BlockError::Misaligned {
                len_bytes: data.len(),
            });
        }
        let blocks = (data.len() / bs) as u64;
        self.data.geometry().check_range(lba, blocks)?;
        if blocks > self.max_blocks as u64 {
            return Err(BlockError::NotSupported(
                "an atomic write larger than the volume's atomic limit",
            ));
        }
        self.ready().await?;
        self.close_views().await;
        // every slot may be held by failed writes' kept records, which only
        // an operation over their blocks used to settle: this write waited
        // for a slot for ever, even once the fault had cleared (review of
        // 2026-12-06). With every slot kept (none in flight that would free
        // one), they are settled first (or this write fails with what stops
        // them).
        if self.kept_count.load(Ordering::SeqCst) >= ATOMIC_SLOTS as usize {
            self.clone().settle().await?;
        }
        let permit = self
            .permits
            .acquire()
            .await
            .map_err(|_| BlockError::Unavailable("atomic writes closed".into()))?;
        let slot = {
            let mut f = self.free.lock();
            let Some(i) = f.iter().position(|&x| x) else {
                return Err(BlockError::Unavailable("no atomic write slot".into()));
            };
            f[i] = false;
            i
        };
        let release = |keep: Option<(u64, Bytes)>| match keep {
            Some((seq, data)) => {
                // the slot and its permit stay taken until the record is settled
                permit.forget();
                self.kept.lock().push(Kept {
                    slot,
                    seq,
                    lba,
                    data,
                });
                self.kept_count.fetch_add(1, Ordering::SeqCst);
            }
            None => {
                self.free.lock()[slot] = true;
                drop(permit);
            }
        };
        // the gate: wait for unlocked plain operations, then hold the range
        let (pending, range) = loop {
            self.gate.pending.fetch_add(1, Ordering::SeqCst);
            let pending = Pending(&self.gate);
            self.drain_unlocked().await;
            let range = self
                .gate
                .locks
                .lock(lba, lba + blocks, LockMode::Exclusive)
                .await;
            if !self.kept_overlaps(lba, blocks) {
                break (pending, range);
            }
            drop(range);
            drop(pending);
            if let Err(e) = self.clone().settle().await {
                release(None);
                return Err(e);
            }
        };
        let seq = self.next_seq.fetch_add(1, Ordering::SeqCst);
        let at = self.slot_lba(slot);
        let record = encode(
            self.block_size,
            &Record {
                seq,
                lba,
                key: self.key,
                data: data.clone(),
            },
        );
        if let Err(e) = self.records.write(at, record, true).await {
            // a record that did not land whole fails its checksum at replay; one that
            // did is replayed: both leave the blocks whole, so the slot is reusable
            // only once cleared
            let cleared = self
                .records
                .write(at, Bytes::from(vec![0u8; bs]), true)
                .await
                .is_ok();
            release((!cleared).then_some((seq, data)));
            drop(range);
            drop(pending);
            return Err(e);
        }
        if let Err(e) = self.data.write(lba, data.clone(), true).await {
            tracing::error!(lba, blocks, error = %e, "atomic write failed in place; its record is kept and applied before anything else touches its blocks");
            release(Some((seq, data)));
            drop(range);
            drop(pending);
            return Err(e);
        }
        let cleared = self
            .records
            .write(at, Bytes::from(vec![0u8; bs]), true)
            .await;
        if let Err(e) = cleared {
            // the record still names these blocks: a replay would write the same
            // data again, so it is kept until cleared (see `Kept`)
            tracing::error!(slot, error = %e, "atomic write record could not be cleared");
            release(Some((seq, data)));
            drop(range);
            drop(pending);
            return Err(e);
        }
        drop(range);
        drop(pending);
        release(None);
        Ok(())
    }
}

#[async_trait]
impl Volume for AtomicWrites {
    fn geometry(&self) -> Geometry {
        self.inner.data.geometry()
    }
    async fn read(&self, lba: u64, blocks: u32) -> BlockResult<Bytes> {
        let i = &self.inner;
        i.plain(lba, blocks as u64, i.data.read(lba, blocks)).await
    }
    /// The volume below may answer with a view of its pages, read when the
    /// socket copies them. Until this volume's first atomic write, such reads
    /// are passed down and counted until their bytes are dropped (sent); the
    /// first atomic write turns them off and waits once for those counted
    /// (`Inner::close_views`), so no view shows part of an atomic write. From
    /// then on they are ordinary reads (copies, through the gate). They are
    /// not counted as the gate's plain operations: a client slow to take its
    /// replies would hold up every atomic write, and through the LU's write
    /// order every writer; and a settle waiting for the gate to drain would
    /// wait for views its own caller holds (review of 2026-12-06).
    async fn read_to_socket(&self, lba: u64, blocks: u32) -> BlockResult<Bytes> {
        let i = &self.inner;
        i.ready().await?;
        if i.views_off.load(Ordering::SeqCst) {
            return self.read(lba, blocks).await;
        }
        i.views.fetch_add(1, Ordering::SeqCst);
        let held = HeldView(self.inner.clone());
        // (seen after the count went up: an atomic write that set it
        // waits for this one, or this one sees it)
        if i.views_off.load(Ordering::SeqCst) || i.kept_overlaps(lba, blocks as u64) {
            drop(held);
            return self.read(lba, blocks).await;
        }
        let data = i.data.read_to_socket(lba, blocks).await?;
        Ok(Bytes::from_owner(HeldBytes { data, _held: held }))
    }
    async fn write(&self, lba: u64, data: Bytes, fua: bool) -> BlockResult<()> {
        let i = &self.inner;
        let blocks = (data.len() / i.block_size.max(1) as usize) as u64;
        i.plain(lba, blocks, i.data.write(lba, data, fua)).await
    }
    fn takes_pipes(&self) -> bool {
        self.inner.data.takes_pipes()
    }
    async fn write_pipe(
        &self,
        lba: u64,
        pipe: &mut crate::PipePayload,
        fua: bool,
    ) -> BlockResult<()> {
        let i = &self.inner;
        let blocks = (pipe.len() / i.block_size.max(1) as usize) as u64;
        i.plain(lba, blocks, i.data.write_pipe(lba, pipe, fua))
            .await
    }
    async fn flush(&self) -> BlockResult<()> {
        self.inner.ready().await?;
        self.inner.data.flush().await
    }
    async fn discard(&self, lba: u64, blocks: u64) -> BlockResult<()> {
        let i = &self.inner;
        i.plain(lba, blocks, i.data.discard(lba, blocks)).await
    }
    async fn write_zeroes(&self, lba: u64, blocks: u64, may_unmap: bool) -> BlockResult<()> {
        let i = &self.inner;
        i.plain(lba, blocks, i.data.write_zeroes(lba, blocks, may_unmap))
            .await
    }
    async fn compare_and_write(
        &self,
        lba: u64,
        compare: Bytes,
        data: Bytes,
        fua: bool,
    ) -> BlockResult<Option<usize>> {
        let i = &self.inner;
        let blocks = (data.len() / i.block_size.max(1) as usize) as u64;
        i.plain(
            lba,
            blocks,
            i.data.compare_and_write(lba, compare, data, fua),
        )
        .await
    }
    async fn block_status(&self, lba: u64, blocks: u64) -> BlockResult<Vec<Extent>> {
        self.inner.ready().await?;
        self.inner.data.block_status(lba, blocks).await
    }
    fn provisioning(&self) -> Option<crate::Provisioning> {
        self.inner.data.provisioning()
    }
    async fn grow(&self, block_count: u64) -> BlockResult<()> {
        self.inner.data.grow(block_count).await
    }
    async fn shrink(&self, block_count: u64) -> BlockResult<()> {
        self.inner.data.shrink(block_count).await
    }
    fn atomic_write_max_blocks(&self) -> u32 {
        self.inner.max_blocks
    }
    /// To its end even if its caller gives up (`crate::detach`): stopped
    /// half-way it would leave a record that a restart applies over later
    /// writes, and its slot taken.
    async fn write_atomic(&self, lba: u64, data: Bytes) -> BlockResult<()> {
        crate::detach::detached(self.inner.clone().atomic(lba, data)).await
    }
}

#[cfg(test)]
mod tests;
