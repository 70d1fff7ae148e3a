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
//! - Any other write applied here (the host's, through either node, or a copy
//!   of this node's own) takes its blocks out of what is kept: a host's later
//!   write is never undone.
//! - What could not be kept (the file failed, or holds [`UNDO_BYTES_MAX`]
//!   already) marks that copy lost: it is not put back, its blocks stay as the
//!   copy left them (each as it was or as the source has it), and a warning says
//!   so.
//! - Only the partner's loss is covered: the index lives in memory and the file
//!   is not synced, so a restart of this node (a crash of its process included)
//!   loses what was kept, and the file an earlier run left is removed at start.
//!   A copy cut short while both nodes went down is then left as the copy left
//!   it (each block as it was or as the source has it).

use crate::bitmap::DirtyBitmap;
use block::{BlockResult, Bytes, VolumeRef};
use parking_lot::Mutex;
use std::collections::HashSet;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// Most bytes kept at once; a copy that would need more is marked lost.
pub(crate) const UNDO_BYTES_MAX: u64 = 4 << 30;

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
    seq: u64,
    entries: Vec<Entry>,
    /// Copies with something not kept: never put back.
    lost: HashSet<u64>,
    /// Keeps writing to the file now: its space is only reused once none is.
    writing: usize,
}

/// See the module doc.
pub(crate) struct CopyUndo {
    path: PathBuf,
    bs: u64,
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

    /// The copies are in sync again: nothing kept, nothing put back pending.
    pub(crate) fn in_sync(&self) {
        self.undone.store(false, Ordering::Release);
        self.clear();
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
        if let Err(why) = self.keep(local, copy, lba, blocks).await {
            let first = self.st.lock().lost.insert(copy);
            if first {
                tracing::warn!(copy, lba, %why, "cannot keep what the partner's copy overwrites: if the partner is lost before the copy ends, its range is left as the copy left it");
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
    ) -> Result<(), String> {
        if self.st.lock().lost.contains(&copy) {
            return Ok(());
        }
        let before = local
            .read(lba, blocks as u32)
            .await
            .map_err(|e| format!("reading the blocks: {e}"))?;
        let len = before.len() as u64;
        let (file, off) = {
            let mut st = self.st.lock();
            if st.end + len > UNDO_BYTES_MAX {
                return Err(format!("{UNDO_BYTES_MAX} bytes kept already"));
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
            st.writing += 1;
            (st.file.clone().expect("opened above"), off)
        };
        let written = tokio::task::spawn_blocking(move || file.write_all_at(&before, off)).await;
        let mut st = self.st.lock();
        st.writing -= 1;
        written
            .map_err(|e| e.to_string())?
            .map_err(|e| format!("{}: {e}", self.path.display()))?;
        st.seq += 1;
        let seq = st.seq;
        st.entries.push(Entry {
            copy,
            seq,
            lba,
            blocks,
            off,
        });
        self.held.store(st.entries.len(), Ordering::Release);
        Ok(())
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
        let end = lba + blocks;
        let bs = self.bs;
        let mut st = self.st.lock();
        let mut out = Vec::with_capacity(st.entries.len());
        for e in st.entries.drain(..) {
            let e_end = e.lba + e.blocks;
            if e_end <= lba || end <= e.lba {
                out.push(e);
                continue;
            }
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
        self.held.store(st.entries.len(), Ordering::Release);
    }

    /// The partner's copy `copy` ended: what it kept is let go.
    pub(crate) fn end(&self, copy: u64) {
        let mut st = self.st.lock();
        st.entries.retain(|e| e.copy != copy);
        st.lost.remove(&copy);
        if st.entries.is_empty() {
            Self::empty(&mut st);
        }
        self.held.store(st.entries.len(), Ordering::Release);
    }

    fn empty(st: &mut State) {
        st.entries.clear();
        st.lost.clear();
        if st.writing == 0 {
            st.end = 0;
            if let Some(f) = &st.file {
                let _ = f.set_len(0);
            }
        }
    }

    /// Lets everything go (the partner's copies need no undoing: this node is
    /// not the one going on, or the pair met again).
    pub(crate) fn clear(&self) {
        let mut st = self.st.lock();
        if !st.entries.is_empty() || !st.lost.is_empty() {
            tracing::info!(
                entries = st.entries.len(),
                "forgetting what the partner's unfinished copies overwrote"
            );
        }
        Self::empty(&mut st);
        self.held.store(0, Ordering::Release);
    }

    /// This node goes on alone: every copy still open is put back, newest write
    /// first, each write marked in `bitmap` (for the partner's resync), then
    /// `local` is flushed. Returns the blocks put back.
    pub(crate) async fn put_back(
        &self,
        local: &VolumeRef,
        bitmap: &DirtyBitmap,
    ) -> Result<u64, String> {
        let _g = self.gate.write().await;
        let (mut entries, lost, file) = {
            let st = self.st.lock();
            (st.entries.clone(), st.lost.clone(), st.file.clone())
        };
        for c in &lost {
            tracing::warn!(copy = c, "the partner's unfinished copy could not be undone: its range stays as the copy left it");
        }
        entries.retain(|e| !lost.contains(&e.copy));
        entries.sort_unstable_by_key(|e| std::cmp::Reverse(e.seq));
        if !entries.is_empty() {
            self.undone.store(true, Ordering::Release);
        }
        let mut blocks = 0;
        if let (Some(file), false) = (file, entries.is_empty()) {
            for e in &entries {
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
        let mut st = self.st.lock();
        Self::empty(&mut st);
        self.held.store(0, Ordering::Release);
        Ok(blocks)
    }
}
