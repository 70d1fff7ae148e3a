//! Thin, safe wrappers over the Linux calls the disk crate needs beyond std:
//! block-device ioctls, fallocate, SEEK_DATA/SEEK_HOLE, statx direct-I/O alignment,
//! and full-length pread/pwrite loops used by the thread engine.

use std::io;
use std::os::fd::RawFd;

// <linux/fs.h> ioctl numbers (same on x86_64 and aarch64).
const BLKGETSIZE64: libc::c_ulong = 0x8008_1272;
const BLKDISCARD: libc::c_ulong = 0x1277;
const BLKZEROOUT: libc::c_ulong = 0x127f;

/// A failed data transfer: the errno (0 = the file ended early) and the byte
/// offset where it happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct IoFail {
    pub(crate) errno: i32,
    pub(crate) offset: u64,
}

fn errno() -> i32 {
    io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EIO)
}

fn cvt(ret: libc::c_int) -> io::Result<()> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Size of a block device in bytes.
pub(crate) fn blk_size_bytes(fd: RawFd) -> io::Result<u64> {
    let mut size: u64 = 0;
    // SAFETY: BLKGETSIZE64 writes one u64 through the pointer.
    cvt(unsafe { libc::ioctl(fd, BLKGETSIZE64 as _, &mut size as *mut u64) })?;
    Ok(size)
}

/// Logical sector size of a block device.
pub(crate) fn blk_logical_block_bytes(fd: RawFd) -> io::Result<u32> {
    let mut size: libc::c_int = 0;
    // SAFETY: BLKSSZGET writes one int through the pointer.
    cvt(unsafe { libc::ioctl(fd, libc::BLKSSZGET as _, &mut size as *mut libc::c_int) })?;
    Ok(size.max(0) as u32)
}

fn blk_range_ioctl(fd: RawFd, request: libc::c_ulong, offset: u64, len: u64) -> io::Result<()> {
    let range: [u64; 2] = [offset, len];
    // SAFETY: the ioctl reads two u64 through the pointer.
    cvt(unsafe { libc::ioctl(fd, request as _, range.as_ptr()) })
}

/// Whether the block device behind `file` takes discards, as its queue says
/// (`discard_max_bytes`, a partition's in its disk's queue); None when sysfs
/// does not tell.
pub(crate) fn blk_discard_supported(file: &std::fs::File) -> Option<bool> {
    use std::os::unix::fs::MetadataExt;
    let rdev = file.metadata().ok()?.rdev();
    let dev = std::path::PathBuf::from(format!(
        "/sys/dev/block/{}:{}",
        libc::major(rdev),
        libc::minor(rdev)
    ));
    let read = |p: std::path::PathBuf| std::fs::read_to_string(p).ok();
    let text = read(dev.join("queue/discard_max_bytes"))
        .or_else(|| read(dev.join("../queue/discard_max_bytes")))?;
    Some(text.trim().parse::<u64>().ok()? > 0)
}

/// BLKDISCARD over a byte range of a block device.
pub(crate) fn blk_discard(fd: RawFd, offset: u64, len: u64) -> io::Result<()> {
    blk_range_ioctl(fd, BLKDISCARD, offset, len)
}

/// BLKZEROOUT over a byte range of a block device (reads back zero afterwards).
pub(crate) fn blk_zeroout(fd: RawFd, offset: u64, len: u64) -> io::Result<()> {
    blk_range_ioctl(fd, BLKZEROOUT, offset, len)
}

/// fallocate(2), retried on EINTR.
pub(crate) fn fallocate(fd: RawFd, mode: libc::c_int, offset: u64, len: u64) -> io::Result<()> {
    loop {
        // SAFETY: plain syscall on a descriptor we own.
        let r = unsafe { libc::fallocate(fd, mode, offset as libc::off_t, len as libc::off_t) };
        if r == 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EINTR) {
            return Err(e);
        }
    }
}

/// lseek with SEEK_DATA or SEEK_HOLE; `None` when there is no such position before
/// the end of the file (ENXIO).
pub(crate) fn seek(fd: RawFd, offset: u64, whence: libc::c_int) -> io::Result<Option<u64>> {
    // SAFETY: plain syscall; the file offset it moves is never used (all I/O is
    // positional).
    let r = unsafe { libc::lseek(fd, offset as libc::off_t, whence) };
    if r < 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::ENXIO) {
            return Ok(None);
        }
        return Err(e);
    }
    Ok(Some(r as u64))
}

/// Direct-I/O alignment of an open file as (memory, offset) in bytes, when the
/// kernel and file system report it (statx STATX_DIOALIGN, Linux 6.1+). (0, 0)
/// means the file does not support direct I/O.
pub(crate) fn dio_align(fd: RawFd) -> Option<(u32, u32)> {
    // SAFETY: statx fills the zeroed struct; the empty path with AT_EMPTY_PATH
    // refers to fd itself.
    unsafe {
        let mut stx: libc::statx = std::mem::zeroed();
        let r = libc::statx(
            fd,
            c"".as_ptr(),
            libc::AT_EMPTY_PATH,
            libc::STATX_DIOALIGN,
            &mut stx,
        );
        if r != 0 || stx.stx_mask & libc::STATX_DIOALIGN == 0 {
            return None;
        }
        Some((stx.stx_dio_mem_align, stx.stx_dio_offset_align))
    }
}

/// True when the file lives on tmpfs (all page cache; O_DIRECT buys nothing).
#[allow(clippy::unnecessary_cast)] // f_type's width differs between targets
pub(crate) fn is_tmpfs(fd: RawFd) -> bool {
    // SAFETY: fstatfs fills the zeroed struct.
    unsafe {
        let mut st: libc::statfs = std::mem::zeroed();
        libc::fstatfs(fd, &mut st) == 0 && st.f_type as i64 == libc::TMPFS_MAGIC as i64
    }
}

/// Bytes the file `fd` has allocated and bytes its file system can still give to
/// an unprivileged writer: fstat and fstatfs, no I/O.
pub(crate) fn space_bytes(fd: RawFd) -> Option<(u64, u64)> {
    // SAFETY: fstat and fstatfs fill the zeroed structs.
    unsafe {
        let mut st: libc::stat = std::mem::zeroed();
        let mut fs: libc::statfs = std::mem::zeroed();
        if libc::fstat(fd, &mut st) != 0 || libc::fstatfs(fd, &mut fs) != 0 {
            return None;
        }
        let mapped = (st.st_blocks as u64).saturating_mul(512);
        let available = (fs.f_bavail as u64).saturating_mul(fs.f_bsize as u64);
        Some((mapped, available))
    }
}

/// Reads exactly `len` bytes at `offset` into `ptr`, continuing short reads and
/// retrying EINTR/EAGAIN.
///
/// # Safety
/// `ptr` must be valid for writes of `len` bytes.
pub(crate) unsafe fn pread_full(
    fd: RawFd,
    ptr: *mut u8,
    len: usize,
    offset: u64,
) -> Result<(), IoFail> {
    let mut done = 0usize;
    while done < len {
        let at = offset + done as u64;
        // SAFETY: within the caller's buffer.
        let r = unsafe { libc::pread64(fd, ptr.add(done).cast(), len - done, at as libc::off64_t) };
        if r < 0 {
            let e = errno();
            if e == libc::EINTR || e == libc::EAGAIN {
                continue;
            }
            return Err(IoFail {
                errno: e,
                offset: at,
            });
        }
        if r == 0 {
            return Err(IoFail {
                errno: 0,
                offset: at,
            });
        }
        done += r as usize;
    }
    Ok(())
}

/// Writes exactly `data` at `offset`, with RWF_DSYNC when `dsync`, continuing
/// short writes and retrying EINTR/EAGAIN.
pub(crate) fn pwrite_full(fd: RawFd, data: &[u8], offset: u64, dsync: bool) -> Result<(), IoFail> {
    let mut done = 0usize;
    let mut zero_writes = 0u32;
    while done < data.len() {
        let at = offset + done as u64;
        let rest = &data[done..];
        let r = if dsync {
            let iov = libc::iovec {
                iov_base: rest.as_ptr() as *mut libc::c_void,
                iov_len: rest.len(),
            };
            // SAFETY: one iovec over a live slice.
            unsafe { libc::pwritev2(fd, &iov, 1, at as libc::off_t, libc::RWF_DSYNC) }
        } else {
            // SAFETY: a live slice.
            unsafe { libc::pwrite64(fd, rest.as_ptr().cast(), rest.len(), at as libc::off64_t) }
        };
        if r < 0 {
            let e = errno();
            if e == libc::EINTR || e == libc::EAGAIN {
                continue;
            }
            return Err(IoFail {
                errno: e,
                offset: at,
            });
        }
        if r == 0 {
            zero_writes += 1;
            if zero_writes > 16 {
                return Err(IoFail {
                    errno: libc::EIO,
                    offset: at,
                });
            }
        }
        done += r as usize;
    }
    Ok(())
}

/// fdatasync(2), retried on EINTR.
pub(crate) fn fdatasync(fd: RawFd) -> Result<(), IoFail> {
    loop {
        // SAFETY: plain syscall.
        if unsafe { libc::fdatasync(fd) } == 0 {
            return Ok(());
        }
        let e = errno();
        if e != libc::EINTR {
            return Err(IoFail {
                errno: e,
                offset: 0,
            });
        }
    }
}

/// Outcome of a non-blocking attempt at a buffered transfer.
pub(crate) enum NoWait {
    /// This many bytes moved (possibly fewer than asked: continue elsewhere).
    Moved(usize),
    /// It would block (data not cached, or the write needs allocation or I/O).
    WouldBlock,
    /// The file system does not support RWF_NOWAIT; never try again on this file.
    Unsupported,
    /// A real error: let the engine redo the transfer and report it with context.
    Failed,
}

fn nowait_result(res: isize) -> NoWait {
    if res >= 0 {
        return NoWait::Moved(res as usize);
    }
    match io::Error::last_os_error().raw_os_error().unwrap_or(0) {
        libc::EAGAIN | libc::EINTR => NoWait::WouldBlock,
        libc::EOPNOTSUPP | libc::EINVAL => NoWait::Unsupported,
        _ => NoWait::Failed,
    }
}

/// One inline read: preadv2 with RWF_NOWAIT (reads only what the page cache already
/// holds), or a plain pread when `nowait` is false (memory file systems, which never
/// wait for a device).
///
/// # Safety
/// `ptr` must be valid for `len` writable bytes.
pub(crate) unsafe fn pread_inline(
    fd: RawFd,
    ptr: *mut u8,
    len: usize,
    offset: u64,
    nowait: bool,
) -> NoWait {
    let iov = libc::iovec {
        iov_base: ptr.cast(),
        iov_len: len,
    };
    let flags = if nowait { libc::RWF_NOWAIT } else { 0 };
    nowait_result(libc::preadv2(fd, &iov, 1, offset as i64, flags))
}

/// One inline buffered write: pwritev2 with RWF_NOWAIT (completes only if it needs
/// no blocking), or plain when `nowait` is false (memory file systems).
pub(crate) fn pwrite_inline(fd: RawFd, data: &[u8], offset: u64, nowait: bool) -> NoWait {
    let iov = libc::iovec {
        iov_base: data.as_ptr() as *mut libc::c_void,
        iov_len: data.len(),
    };
    let flags = if nowait { libc::RWF_NOWAIT } else { 0 };
    // SAFETY: the iovec describes `data`, which outlives the call.
    nowait_result(unsafe { libc::pwritev2(fd, &iov, 1, offset as i64, flags) })
}
