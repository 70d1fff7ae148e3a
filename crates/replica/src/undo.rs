//! What the partner's offloaded copies overwrote on this node, so that a copy
//! whose node is lost mid-way is undone here rather than left half done.
//!
//! A copy (EXTENDED COPY, WRITE USING TOKEN) runs on the node that received its
//! command, and its writes reach both copies of the volume like any other
//! ([`Op::CopyWrite`](replica_proto::Op::CopyWrite)). If that node dies before
//! the copy ends, the partner goes on serving alone with some of the copy's
//! blocks written and others not, and the host sees its command fail. So before
//! this node applies a partner's copy write, it keeps what the blocks held (in
//! `copy.undo` in the replica's state folder; the index in memory). When the
//! partner ends the copy ([`Message::CopyEnd`](replica_proto::Message::CopyEnd),
//! sent before the command is answered) that is let go. When this node goes on
//! alone after losing the partner, every copy still open is put back, newest
//! write first, as a lone write (tracked in the bitmap for the partner's
//! resync), before this node serves: the range is as it was before the copy.
//! When it stops instead, it keeps all this and puts the copies back at the
//! next handshake, before its `Hello`, which then says so (`UNDO`): with the
//! same generation on both nodes it is the resync source (`plan.rs`), so the
//! returning partner's half-done copies are overwritten.
//!
//! - Any other write applied here (the host's, through either node, a copy of
//!   this node's own, or one of the partner's that is not kept) takes its
//!   blocks out of what is kept: a later write is never undone. A copy that
//!   ends does the same for what older copies kept under its own writes: a
//!   finished copy is never undone by one that began before it and was cut
//!   short.
//! - A copy's end may be handled before its last writes (an aborted command's
//!   writes are still on their way when its end is sent): the copies that
//!   ended are remembered ([`ENDED_MAX`]) and their late writes are not kept.
//! - What could not be kept (the file failed, more than [`UNDO_BYTES_MAX`]
//!   would be kept at once, or the copy wrote here while this node was a
//!   resync target, which keeps nothing) marks that copy lost: it is not put
//!   back, its blocks stay as the copy left them (each as it was or as the
//!   source has it), and a warning says so. Space in the file is given back
//!   (holes punched) as kept blocks are let go, so the bound is on what is
//!   kept at once.
//! - Only the partner's loss is covered: the index lives in memory and the file
//!   is not synced, so a restart of this node (a crash of its process included)
//!   loses what was kept, and the file an earlier run left is removed at start.
//!   A copy cut short while both nodes went down is then left as the copy left
//!   it (each block as it was or as the source has it).

use crate::bitmap::DirtyBitmap;
use block::{BlockResult, Bytes, VolumeRef};
use parking_lot::Mutex;
use std::collections::{HashSet, VecDeque};
use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// Most bytes kept at once; a copy that would need more is marked lost.
pub(crate) const UNDO_BYTES_MAX: u64 = 4 << 30;
/// The file never grows past this (space let go is punched out of it, but its
/// end only returns to 0 once nothing is kept); a copy that would need more is
/// marked lost. Where holes cannot be punched, [`UNDO_BYTES_MAX`] bounds it.
const FILE_BYTES_MAX: u64 = 1 << 40;
/// Ended copies remembered, so that their late writes are not kept.
pub(crate) const ENDED_MAX: usize = 4096;

/// Blocks of one kept write, at `off` in the file.
#[derive(Debug, Clone, Copy)]
struct Entry {
    copy: u64,
    /// Order of keeping: put back newest first.
    seq: u64,
    lba: u64,
    blocks: u64,
    off: u64,
}

#[derive(Default)]
struct State {
    file: Option<Arc<File>>,
    /// End of what the file holds.
    end: u64,
    /// Bytes the entries hold.
    live: u64,
    /// Bytes being written for keeps not yet entries.
    pending: u64,
    seq: u64,
    entries: Vec<Entry>,
    /// Copies with something not kept: never put back.
    lost: HashSet<u64>,
    /// Copies that ended, oldest first (at most [`ENDED_MAX`]).
    ended: HashSet<u64>,
    ended_order: VecDeque<u64>,
    /// Keeps writing to the file now: its space is only reused once none is.
    writing: usize,
    /// A put-back reads the file: it is neither truncated nor reused meanwhile.
    putting_back: bool,
    /// Punching holes failed once: the file's end is bounded like what is kept.
    no_punch: bool,
}

/// Whether a copy write's blocks were kept.
enum Kept {
    Yes,
    /// No (the copy is lost or ended): its write is like any other.
    No,
}

/// See the module doc.
pub(crate) struct CopyUndo {
    path: PathBuf,
    bs: u64,
    /// Most bytes kept at once ([`UNDO_BYTES_MAX`]; smaller in tests).
    max_bytes: u64,
    st: Mutex<State>,
    /// Entries held (0: every write skips the bookkeeping).
    held: AtomicUsize,
    /// Copies were put back here since this copy was last in sync with the
    /// partner: it holds every acknowledged write and not those copies' halves,
    /// so it is the one to resynchronise the partner from.
    undone: std::sync::atomic::AtomicBool,
    /// Held shared by each write applied here while something is kept, and
    /// exclusively while putting back, which so waits for writes under way.
    gate: tokio::sync::RwLock<()>,
}

impl CopyUndo {
    /// Keeps in `dir/copy.undo`, for a volume of `bs`-byte blocks.
    pub(crate) fn new(dir: &std::path::Path, bs: u64) -> CopyUndo {
        Self::with_max(dir, bs, UNDO_BYTES_MAX)
    }

    fn with_max(dir: &std::path::Path, bs: u64, max_bytes: u64) -> CopyUndo {
        let path = dir.join("copy.undo");
        match std::fs::remove_file(&path) {
            Ok(()) => {
                tracing::info!(file = %path.display(), "removed what an earlier run kept of the partner's copies")
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => tracing::warn!(file = %path.display(), "cannot remove {e}"),
        }
        CopyUndo {
            path,
            bs,
            max_bytes,
            st: Mutex::new(State::default()),
            held: AtomicUsize::new(0),
            undone: std::sync::atomic::AtomicBool::new(false),
            gate: tokio::sync::RwLock::new(()),
        }
    }

    /// Whether copies were put back since this copy was last in sync.
    pub(crate) fn undone(&self) -> bool {
        self.undone.load(Ordering::Acquire)
    }

    /// The copies came in sync: nothing is kept (a resync target kept nothing,
    /// its source nothing of a target's), nothing put back is pending. Copies
    /// marked lost stay so: one that wrote here while this node was the target
    /// goes on after, and must not be half undone.
    pub(crate) fn in_sync(&self) {
        self.undone.store(false, Ordering::Release);
        let mut st = self.st.lock();
        if !st.entries.is_empty() {
            tracing::info!(
                entries = st.entries.len(),
                "forgetting what the partner's unfinished copies overwrote"
            );
        }
        self.drop_entries(&mut st);
    }

    /// Copies with something kept.
    pub(crate) fn open_copies(&self) -> usize {
        let st = self.st.lock();
        let mut c: Vec<u64> = st.entries.iter().map(|e| e.copy).collect();
        c.sort_unstable();
        c.dedup();
        c.len()
    }

    /// Held while a partner's copy write is kept and applied: putting back
    /// waits for it, and one that starts after can see the role that follows.
    pub(crate) async fn hold(&self) -> tokio::sync::RwLockReadGuard<'_, ()> {
        self.gate.read().await
    }

    /// The partner's copy `copy` wrote here while nothing could be kept (this
    /// node was its resync target): it cannot be undone whole.
    pub(crate) fn not_undoable(&self, copy: u64) {
        self.st.lock().lost.insert(copy);
    }

    /// Applies the partner's copy write (`copy`, `data` at `lba`) to `local`,
    /// first keeping what the blocks hold. The caller holds [`CopyUndo::hold`].
    pub(crate) async fn write_keeping(
        &self,
        local: &VolumeRef,
        copy: u64,
        lba: u64,
        data: Bytes,
        fua: bool,
    ) -> BlockResult<()> {
        let blocks = data.len() as u64 / self.bs;
        match self.keep(local, copy, lba, blocks).await {
            Ok(Kept::Yes) => {}
            Ok(Kept::No) => self.forget_range(lba, blocks),
            Err(why) => {
                let first = self.st.lock().lost.insert(copy);
                if first {
                    tracing::warn!(copy, lba, %why, "cannot keep what the partner's copy overwrites: if the partner is lost before the copy ends, its range is left as the copy left it");
                }
                self.forget_range(lba, blocks);
            }
        }
        local.write(lba, data, fua).await
    }

    async fn keep(
        &self,
        local: &VolumeRef,
        copy: u64,
        lba: u64,
        blocks: u64,
    ) -> Result<Kept, String> {
        {
            let st = self.st.lock();
            if st.lost.contains(&copy) || st.ended.contains(&copy) {
                return Ok(Kept::No);
            }
        }
        let before = local
            .read(lba, blocks as u32)
            .await
            .map_err(|e| format!("reading the blocks: {e}"))?;
        let len = before.len() as u64;
        let (file, off) = {
            let mut st = self.st.lock();
            if st.live + st.pending + len > self.max_bytes {
                return Err(format!("{} bytes kept already", st.live));
            }
            let file_max = match st.no_punch {
                true => self.max_bytes,
                false => FILE_BYTES_MAX,
            };
            if st.end + len > file_max {
                return Err(format!("the file reached {} bytes", st.end));
            }
            if st.file.is_none() {
                let f = std::fs::OpenOptions::new()
                    .read(true)
                    .write(true)
                    .create(true)
                    .truncate(true)
                    .open(&self.path)
                    .map_err(|e| format!("{}: {e}", self.path.display()))?;
                st.file = Some(Arc::new(f));
            }
            let off = st.end;
            st.end += len;
            st.pending += len;
            st.writing += 1;
            (st.file.clone().expect("opened above"), off)
        };
        let written = tokio::task::spawn_blocking(move || file.write_all_at(&before, off)).await;
        let mut st = self.st.lock();
        st.writing -= 1;
        st.pending -= len;
        let failed = match written {
            Ok(Ok(())) => None,
            Ok(Err(e)) => Some(format!("{}: {e}", self.path.display())),
            Err(e) => Some(e.to_string()),
        };
        // the copy ended (or was marked lost) while its blocks were read: its
        // write is not kept after all
        if failed.is_some() || st.lost.contains(&copy) || st.ended.contains(&copy) {
            self.let_go(&mut st, off, len);
            if st.entries.is_empty() {
                self.drop_entries(&mut st);
            }
            return match failed {
                Some(why) => Err(why),
                None => Ok(Kept::No),
            };
        }
        st.seq += 1;
        st.live += len;
        let seq = st.seq;
        st.entries.push(Entry {
            copy,
            seq,
            lba,
            blocks,
            off,
        });
        self.held.store(st.entries.len(), Ordering::Release);
        Ok(Kept::Yes)
    }

    /// Runs `write` (any other write applied here, over `lba..lba + blocks`),
    /// after taking its blocks out of what is kept.
    pub(crate) async fn write_over<F: std::future::Future<Output = BlockResult<()>>>(
        &self,
        lba: u64,
        blocks: u64,
        write: F,
    ) -> BlockResult<()> {
        if self.held.load(Ordering::Acquire) == 0 {
            return write.await;
        }
        let _g = self.gate.read().await;
        self.forget_range(lba, blocks);
        write.await
    }

    fn forget_range(&self, lba: u64, blocks: u64) {
        let mut st = self.st.lock();
        self.trim(&mut st, lba, blocks, |_| true);
        self.held.store(st.entries.len(), Ordering::Release);
    }

    /// Takes `lba..lba + blocks` out of the entries `whose` says (their file
    /// space is let go).
    fn trim(&self, st: &mut State, lba: u64, blocks: u64, whose: impl Fn(&Entry) -> bool) {
        let end = lba.saturating_add(blocks);
        let bs = self.bs;
        let mut out = Vec::with_capacity(st.entries.len());
        let mut gone = Vec::new();
        for e in std::mem::take(&mut st.entries) {
            let e_end = e.lba + e.blocks;
            if e_end <= lba || end <= e.lba || !whose(&e) {
                out.push(e);
                continue;
            }
            let (from, to) = (e.lba.max(lba), e_end.min(end));
            gone.push((e.off + (from - e.lba) * bs, (to - from) * bs));
            if e.lba < lba {
                out.push(Entry {
                    blocks: lba - e.lba,
                    ..e
                });
            }
            if end < e_end {
                out.push(Entry {
                    lba: end,
                    blocks: e_end - end,
                    off: e.off + (end - e.lba) * bs,
                    ..e
                });
            }
        }
        st.entries = out;
        for (off, len) in gone {
            st.live = st.live.saturating_sub(len);
            self.let_go(st, off, len);
        }
        if st.entries.is_empty() {
            self.drop_entries(st);
        }
    }

    /// Gives the file's space at `off..off + len` back (a hole).
    fn let_go(&self, st: &mut State, off: u64, len: u64) {
        let Some(f) = &st.file else { return };
        // (a put-back reads from what it saw kept: nothing is punched meanwhile)
        if st.no_punch || st.putting_back || len == 0 {
            return;
        }
        // SAFETY: fallocate on a file descriptor this struct owns; no memory
        // is passed
        let r = unsafe {
            libc::fallocate(
                f.as_raw_fd(),
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                off as libc::off_t,
                len as libc::off_t,
            )
        };
        if r != 0 {
            tracing::info!(file = %self.path.display(), error = %std::io::Error::last_os_error(),
                "cannot punch holes: the file's space is reused only once nothing is kept");
            st.no_punch = true;
        }
    }

    /// The partner's copy `copy` ended: what it kept is let go, and so is what
    /// older copies kept under its writes (a finished copy stays).
    pub(crate) fn end(&self, copy: u64) {
        let mut st = self.st.lock();
        let mine: Vec<Entry> = st
            .entries
            .iter()
            .filter(|e| e.copy == copy)
            .copied()
            .collect();
        for m in &mine {
            self.trim(&mut st, m.lba, m.blocks, |e| {
                e.copy != copy && e.seq < m.seq
            });
        }
        for m in &mine {
            self.trim(&mut st, m.lba, m.blocks, |e| e.copy == copy);
        }
        st.lost.remove(&copy);
        if st.ended.insert(copy) {
            st.ended_order.push_back(copy);
            if st.ended_order.len() > ENDED_MAX {
                if let Some(old) = st.ended_order.pop_front() {
                    st.ended.remove(&old);
                }
            }
        }
        self.held.store(st.entries.len(), Ordering::Release);
    }

    /// No entries any more: the file's space is reused from its start (unless
    /// it is being written or read).
    fn drop_entries(&self, st: &mut State) {
        st.entries.clear();
        st.live = 0;
        self.held.store(0, Ordering::Release);
        if st.writing == 0 && !st.putting_back {
            st.end = 0;
            if let Some(f) = &st.file {
                let _ = f.set_len(0);
            }
        }
    }

    /// Lets everything go, the copies ended and lost too (the pair met again:
    /// what came before is over).
    pub(crate) fn clear(&self) {
        let mut st = self.st.lock();
        if !st.entries.is_empty() || !st.lost.is_empty() {
            tracing::info!(
                entries = st.entries.len(),
                "forgetting what the partner's unfinished copies overwrote"
            );
        }
        Self::forget_copies(&mut st);
        self.drop_entries(&mut st);
    }

    fn forget_copies(st: &mut State) {
        st.lost.clear();
        st.ended.clear();
        st.ended_order.clear();
    }

    /// This node goes on alone: every copy still open is put back, newest write
    /// first, each write marked in `bitmap` (for the partner's resync), then
    /// `local` is flushed. Returns the blocks put back. Everything kept is let
    /// go, whether it worked or not.
    pub(crate) async fn put_back(
        &self,
        local: &VolumeRef,
        bitmap: &DirtyBitmap,
    ) -> Result<u64, String> {
        let _g = self.gate.write().await;
        let (mut entries, lost, file) = {
            let mut st = self.st.lock();
            st.putting_back = true;
            (st.entries.clone(), st.lost.clone(), st.file.clone())
        };
        let r = self
            .put_back_entries(local, bitmap, &mut entries, &lost, file)
            .await;
        let mut st = self.st.lock();
        st.putting_back = false;
        Self::forget_copies(&mut st);
        self.drop_entries(&mut st);
        r
    }

    async fn put_back_entries(
        &self,
        local: &VolumeRef,
        bitmap: &DirtyBitmap,
        entries: &mut Vec<Entry>,
        lost: &HashSet<u64>,
        file: Option<Arc<File>>,
    ) -> Result<u64, String> {
        for c in lost {
            tracing::warn!(copy = c, "the partner's unfinished copy could not be undone: its range stays as the copy left it");
        }
        entries.retain(|e| !lost.contains(&e.copy));
        entries.sort_unstable_by_key(|e| std::cmp::Reverse(e.seq));
        if !entries.is_empty() {
            self.undone.store(true, Ordering::Release);
        }
        let mut blocks = 0;
        if let (Some(file), false) = (file, entries.is_empty()) {
            for e in entries.iter() {
                let (f, len, off) = (file.clone(), (e.blocks * self.bs) as usize, e.off);
                let data = tokio::task::spawn_blocking(move || {
                    let mut b = vec![0u8; len];
                    f.read_exact_at(&mut b, off).map(|()| b)
                })
                .await
                .map_err(|e| e.to_string())?
                .map_err(|e| format!("{}: {e}", self.path.display()))?;
                let _hold = bitmap
                    .begin_write(e.lba, e.blocks)
                    .await
                    .map_err(|e| format!("bitmap: {e}"))?;
                local
                    .write(e.lba, Bytes::from(data), false)
                    .await
                    .map_err(|err| format!("writing lba {}: {err}", e.lba))?;
                blocks += e.blocks;
            }
            local.flush().await.map_err(|e| format!("flush: {e}"))?;
        }
        Ok(blocks)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use block::MemVolume;

    const BS: u64 = 512;

    struct Fixture {
        _dir: tempfile::TempDir,
        undo: CopyUndo,
        local: VolumeRef,
        bitmap: DirtyBitmap,
    }

    fn fixture(max_bytes: u64) -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let bitmap = DirtyBitmap::open(&dir.path().join("bm"), 1000, BS as u32, 65536).unwrap();
        Fixture {
            undo: CopyUndo::with_max(dir.path(), BS, max_bytes),
            local: Arc::new(MemVolume::new(BS as u32, 1000)),
            bitmap,
            _dir: dir,
        }
    }

    fn fill(byte: u8, blocks: u64) -> Bytes {
        Bytes::from(vec![byte; (blocks * BS) as usize])
    }

    impl Fixture {
        async fn copy_write(&self, copy: u64, lba: u64, byte: u8, blocks: u64) {
            let _g = self.undo.hold().await;
            self.undo
                .write_keeping(&self.local, copy, lba, fill(byte, blocks), false)
                .await
                .unwrap();
        }

        /// The first byte of each block of `lba..lba + blocks`.
        async fn bytes(&self, lba: u64, blocks: u64) -> Vec<u8> {
            let b = self.local.read(lba, blocks as u32).await.unwrap();
            b.chunks(BS as usize).map(|c| c[0]).collect()
        }

        async fn put_back(&self) -> u64 {
            self.undo.put_back(&self.local, &self.bitmap).await.unwrap()
        }
    }

    #[tokio::test]
    async fn copies_cut_short_are_put_back_newest_first() {
        let f = fixture(UNDO_BYTES_MAX);
        f.local.write(0, fill(1, 4), false).await.unwrap();
        f.copy_write(1, 0, 0xA, 4).await;
        f.copy_write(2, 2, 0xB, 4).await;
        assert_eq!(f.undo.open_copies(), 2);
        assert_eq!(f.put_back().await, 8);
        assert_eq!(f.bytes(0, 6).await, [1, 1, 1, 1, 0, 0]);
        assert_eq!(f.undo.open_copies(), 0);
    }

    #[tokio::test]
    async fn a_finished_copy_is_not_undone_by_an_older_one_cut_short() {
        let f = fixture(UNDO_BYTES_MAX);
        f.local.write(0, fill(1, 4), false).await.unwrap();
        f.copy_write(1, 0, 0xA, 4).await;
        // a later copy writes over half of it and ends
        f.copy_write(2, 2, 0xB, 2).await;
        f.undo.end(2);
        assert_eq!(f.undo.open_copies(), 1);
        f.put_back().await;
        // the first copy is undone where the finished one did not write after it
        assert_eq!(f.bytes(0, 4).await, [1, 1, 0xB, 0xB]);
    }

    #[tokio::test]
    async fn a_copys_write_kept_after_its_end_is_not_kept() {
        let f = fixture(UNDO_BYTES_MAX);
        f.copy_write(1, 0, 0xA, 2).await;
        // copy 2 ended before its last write was handled here (aborted)
        f.undo.end(2);
        f.copy_write(2, 1, 0xB, 2).await;
        assert_eq!(f.undo.open_copies(), 1);
        f.put_back().await;
        // copy 1 is undone, except where copy 2's late write landed after it
        assert_eq!(f.bytes(0, 3).await, [0, 0xB, 0xB]);
    }

    #[tokio::test]
    async fn a_copy_that_ends_while_its_write_is_being_kept_keeps_nothing() {
        let mut f = fixture(UNDO_BYTES_MAX);
        let held = Arc::new(block::HoldVolume::new(f.local.clone()));
        held.reads.hold();
        f.local = held.clone();
        let f = Arc::new(f);
        let w = {
            let f = f.clone();
            tokio::spawn(async move { f.copy_write(5, 0, 0xF, 2).await })
        };
        // the write reads what it overwrites when the copy's end arrives
        held.reads.arrivals(1).await;
        f.undo.end(5);
        held.reads.open();
        w.await.unwrap();
        assert_eq!(f.undo.open_copies(), 0);
        assert_eq!(f.put_back().await, 0);
        assert_eq!(f.bytes(0, 2).await, [0xF, 0xF]);
    }

    #[tokio::test]
    async fn a_copy_that_wrote_while_nothing_was_kept_is_never_put_back() {
        let f = fixture(UNDO_BYTES_MAX);
        // written while this node was a resync target, then in sync
        f.undo.not_undoable(3);
        f.undo.in_sync();
        f.copy_write(3, 0, 0xC, 2).await;
        assert_eq!(f.undo.open_copies(), 0);
        assert_eq!(f.put_back().await, 0);
        assert_eq!(f.bytes(0, 2).await, [0xC, 0xC]);
    }

    #[tokio::test]
    async fn a_write_over_kept_blocks_is_never_undone() {
        let f = fixture(UNDO_BYTES_MAX);
        f.copy_write(1, 0, 0xA, 4).await;
        let w = f.local.write(1, fill(0xE, 2), false);
        f.undo.write_over(1, 2, w).await.unwrap();
        f.put_back().await;
        assert_eq!(f.bytes(0, 4).await, [0, 0xE, 0xE, 0]);
    }

    #[tokio::test]
    async fn the_bound_is_on_what_is_kept_at_once() {
        // room for 4 blocks kept at once
        let f = fixture(4 * BS);
        f.copy_write(1, 0, 0xA, 2).await;
        f.copy_write(2, 10, 0xB, 2).await;
        f.undo.end(1);
        // 6 blocks kept in all, 4 at once: copy 3 is kept
        f.copy_write(3, 20, 0xC, 2).await;
        assert_eq!(f.undo.open_copies(), 2);
        // a fifth block at once is not: copy 4 is lost
        f.copy_write(4, 30, 0xD, 1).await;
        assert_eq!(f.undo.open_copies(), 2);
        assert_eq!(f.put_back().await, 4);
        assert_eq!(f.bytes(10, 2).await, [0, 0]);
        assert_eq!(f.bytes(20, 2).await, [0, 0]);
        assert_eq!(f.bytes(30, 1).await, [0xD]);
    }
}
