//! A read-only shared mapping of a file in memory (tmpfs), from which reads
//! bound for a socket are handed out as views instead of copies
//! ([`block::Volume::read_to_socket`]): the socket's write then copies the
//! file's pages once, where a read into a buffer and the write of that buffer
//! copied them twice.
//!
//! Only the kernel reads a view (a socket write copies from it): a file cut
//! short by someone else under a view turns the copy into an `EFAULT` of that
//! write, which ends that connection; read in user space it would be a
//! `SIGBUS` of the process.

use block::Bytes;
use std::io;
use std::os::fd::RawFd;
use std::sync::Arc;

/// A mapping of the first `len` bytes of a file, unmapped when the last view
/// of it is dropped.
pub(crate) struct Mapping {
    addr: usize,
    len: usize,
}

impl Mapping {
    /// Maps `len` bytes of `fd` from its start, shared and read-only.
    pub(crate) fn new(fd: RawFd, len: usize) -> io::Result<Arc<Mapping>> {
        if len == 0 {
            return Err(io::Error::other("nothing to map"));
        }
        // SAFETY: a new mapping at an address the kernel chooses; it touches
        // no memory of ours.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_SHARED,
                fd,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Arc::new(Mapping {
            addr: p as usize,
            len,
        }))
    }

    /// Bytes mapped.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Whether every page of `len` bytes at `offset` is in memory (`mincore`):
    /// not a hole of the file, not swapped out.
    pub(crate) fn resident(&self, offset: usize, len: usize) -> bool {
        // SAFETY: sysconf takes no pointer.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as usize;
        let start = offset / page * page;
        let Some(end) = offset.checked_add(len).filter(|e| *e <= self.len) else {
            return false;
        };
        let span = end - start;
        let mut present = vec![0u8; span.div_ceil(page)];
        // SAFETY: the range lies within the mapping and starts on a page;
        // `present` has one byte per page of it.
        let r = unsafe {
            libc::mincore(
                (self.addr + start) as *mut libc::c_void,
                span,
                present.as_mut_ptr(),
            )
        };
        r == 0 && present.iter().all(|b| b & 1 == 1)
    }

    /// `len` bytes at `offset` of the file (within the mapping: the caller
    /// checks), keeping the mapping alive as long as they are.
    pub(crate) fn view(self: &Arc<Self>, offset: usize, len: usize) -> Bytes {
        debug_assert!(offset + len <= self.len);
        Bytes::from_owner(View {
            map: self.clone(),
            offset,
            len,
        })
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: `addr..addr + len` is this mapping, and no view of it is
        // left (each holds the Arc).
        unsafe { libc::munmap(self.addr as *mut libc::c_void, self.len) };
    }
}

/// A range of a [`Mapping`].
struct View {
    map: Arc<Mapping>,
    offset: usize,
    len: usize,
}

impl AsRef<[u8]> for View {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: the range lies within the mapping, which lives as long as
        // `self`. Its bytes may change under the slice (the file is written
        // meanwhile) or fault (the file is cut short): views are handed only
        // to the kernel (see the module notes).
        unsafe { std::slice::from_raw_parts((self.map.addr + self.offset) as *const u8, self.len) }
    }
}
