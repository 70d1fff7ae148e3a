//! Buffers handed to the kernel: read buffers that become `Bytes` without a copy,
//! and write buffers that are either the caller's `Bytes` or an aligned copy of it
//! (O_DIRECT needs memory aligned to the device's direct-I/O alignment).

use bytes::Bytes;
use std::alloc::{self, Layout};
use std::ptr::NonNull;

/// Memory alignment used for O_DIRECT buffers: one page covers every device.
pub(crate) const DIRECT_ALIGN_BYTES: usize = 4096;

/// A heap block aligned to [`DIRECT_ALIGN_BYTES`]; its bytes are uninitialised
/// until the kernel (or a copy) fills them.
///
/// It is a plain allocation one alignment larger than asked, aligned inside,
/// not an aligned allocation: glibc's memalign splits the slack off on both
/// sides, the slivers go to other allocations, and a freed block is then too
/// small for the next aligned request of the same size (which needs the slack
/// again), so every burst of large reads took fresh memory and the heap grew
/// far beyond what was ever in use at once. Plain blocks of one size are
/// reused as they are.
pub(crate) struct AlignedBuf {
    /// The aligned start.
    ptr: NonNull<u8>,
    len: usize,
    /// The allocation, for `dealloc`.
    base: NonNull<u8>,
}

// SAFETY: AlignedBuf owns its allocation exclusively, like a Box<[u8]>.
unsafe impl Send for AlignedBuf {}
// SAFETY: shared access only reads through `as_ref`, like &[u8].
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    fn layout(len: usize) -> Layout {
        // A size that overflows isize cannot be asked for: max_io_blocks bounds len.
        Layout::from_size_align(len.max(1) + DIRECT_ALIGN_BYTES, 16).unwrap_or(Layout::new::<u8>())
    }

    /// Allocates `len` uninitialised bytes.
    fn new_uninit(len: usize) -> AlignedBuf {
        let layout = Self::layout(len);
        // SAFETY: the layout has a non-zero size.
        let raw = unsafe { alloc::alloc(layout) };
        let Some(base) = NonNull::new(raw) else {
            alloc::handle_alloc_error(layout)
        };
        let skip = raw.align_offset(DIRECT_ALIGN_BYTES);
        if skip >= DIRECT_ALIGN_BYTES {
            // align_offset may give up (never for u8 pointers on real targets)
            // SAFETY: allocated just above with this layout.
            unsafe { alloc::dealloc(raw, layout) };
            alloc::handle_alloc_error(layout)
        }
        // SAFETY: skip < DIRECT_ALIGN_BYTES, so [skip, skip + len) lies inside
        // the allocation of len + DIRECT_ALIGN_BYTES bytes; not null as base is not.
        let ptr = unsafe { NonNull::new_unchecked(raw.add(skip)) };
        AlignedBuf { ptr, len, base }
    }

    /// An aligned copy of `data`.
    pub(crate) fn copy_of(data: &[u8]) -> AlignedBuf {
        let buf = Self::new_uninit(data.len());
        // SAFETY: both ranges are valid for data.len() bytes and do not overlap.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), buf.ptr.as_ptr(), data.len()) };
        buf
    }

    /// An aligned block of zeroes.
    pub(crate) fn zeroed(len: usize) -> AlignedBuf {
        let buf = Self::new_uninit(len);
        // SAFETY: the allocation is valid for len bytes.
        unsafe { std::ptr::write_bytes(buf.ptr.as_ptr(), 0, len) };
        buf
    }
}

impl AsRef<[u8]> for AlignedBuf {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: only reachable once every byte was written (see ReadBuf::into_bytes,
        // copy_of and zeroed).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in new_uninit at `base` with the same layout.
        unsafe { alloc::dealloc(self.base.as_ptr(), Self::layout(self.len)) }
    }
}

/// Where a read lands. Buffered reads use a plain `Vec` (turns into `Bytes` with no
/// extra allocation); direct reads an aligned block.
pub(crate) enum ReadBuf {
    Plain(Vec<u8>),
    Aligned(AlignedBuf),
}

impl ReadBuf {
    /// An uninitialised buffer of `len` bytes, aligned when `direct`.
    pub(crate) fn new(len: usize, direct: bool) -> ReadBuf {
        if direct {
            ReadBuf::Aligned(AlignedBuf::new_uninit(len))
        } else {
            ReadBuf::Plain(Vec::with_capacity(len))
        }
    }

    /// Capacity to fill, in bytes.
    pub(crate) fn len(&self) -> usize {
        match self {
            ReadBuf::Plain(v) => v.capacity(),
            ReadBuf::Aligned(a) => a.len,
        }
    }

    /// Start of the buffer, for the kernel to write into.
    pub(crate) fn as_mut_ptr(&mut self) -> *mut u8 {
        match self {
            ReadBuf::Plain(v) => v.as_mut_ptr(),
            ReadBuf::Aligned(a) => a.ptr.as_ptr(),
        }
    }

    /// The filled buffer as `Bytes`.
    ///
    /// # Safety
    /// All `len` bytes must have been written (the read completed in full).
    pub(crate) unsafe fn into_bytes(self, len: usize) -> Bytes {
        match self {
            ReadBuf::Plain(mut v) => {
                // SAFETY: the caller guarantees the first len bytes are initialised.
                unsafe { v.set_len(len) };
                Bytes::from(v)
            }
            ReadBuf::Aligned(a) => Bytes::from_owner(a),
        }
    }
}

/// What a write sends: the caller's bytes when they are usable as they are, else an
/// aligned copy.
pub(crate) enum WriteBuf {
    Shared(Bytes),
    Aligned(AlignedBuf),
}

impl WriteBuf {
    /// Wraps `data`, copying it only when `mem_align_bytes` (a power of two) is
    /// above 1 and the data is not aligned to it.
    pub(crate) fn new(data: Bytes, mem_align_bytes: usize) -> WriteBuf {
        if mem_align_bytes > 1 && (data.as_ptr() as usize) & (mem_align_bytes - 1) != 0 {
            WriteBuf::Aligned(AlignedBuf::copy_of(&data))
        } else {
            WriteBuf::Shared(data)
        }
    }

    /// The bytes to write.
    pub(crate) fn as_slice(&self) -> &[u8] {
        match self {
            WriteBuf::Shared(b) => b,
            WriteBuf::Aligned(a) => a.as_ref(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_buffers_are_aligned() {
        let a = AlignedBuf::zeroed(8192);
        assert_eq!(a.as_ref().as_ptr() as usize % DIRECT_ALIGN_BYTES, 0);
        assert!(a.as_ref().iter().all(|&b| b == 0));
        let mut r = ReadBuf::new(4096, true);
        assert_eq!(r.as_mut_ptr() as usize % DIRECT_ALIGN_BYTES, 0);
        // SAFETY: filled right here.
        let b = unsafe {
            std::ptr::write_bytes(r.as_mut_ptr(), 7, 4096);
            r.into_bytes(4096)
        };
        assert_eq!(b.len(), 4096);
        assert!(b.iter().all(|&x| x == 7));
    }

    #[test]
    fn unaligned_write_data_is_copied() {
        let big = Bytes::from(vec![3u8; 8192 + 1]);
        let odd = big.slice(1..4097);
        let w = WriteBuf::new(odd.clone(), 4096);
        assert!(matches!(w, WriteBuf::Aligned(_)));
        assert_eq!(w.as_slice(), &odd[..]);
        assert_eq!(w.as_slice().as_ptr() as usize % 4096, 0);
        let w = WriteBuf::new(odd, 1);
        assert!(matches!(w, WriteBuf::Shared(_)));
    }
}
