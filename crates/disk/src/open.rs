//! Opening the backing file or device: creation, the O_DIRECT decision, size and
//! geometry. Everything here runs once per volume, off the data path.

use crate::buf::DIRECT_ALIGN_BYTES;
use crate::options::{DirectIo, FileOptions};
use crate::sys;
use block::{BlockError, Geometry};
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::Path;

/// Largest transfer in one read or write.
pub(crate) const MAX_IO_BYTES: u64 = 8 << 20;

/// What backs the volume.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Backing {
    File,
    BlockDevice,
}

/// The outcome of opening: the descriptor and everything decided about it.
pub(crate) struct Opened {
    pub(crate) file: File,
    pub(crate) backing: Backing,
    pub(crate) geometry: Geometry,
    pub(crate) direct: bool,
    /// Memory alignment write buffers need (1 = any).
    pub(crate) mem_align_bytes: usize,
    /// The exclusive claim on a block device or file opened for writing (see
    /// [`claim_exclusive`], [`claim_file`]), held as long as the volume.
    pub(crate) claim: Option<File>,
    /// A block device whose queue takes no discards (sysfs
    /// `discard_max_bytes` 0): none is ever sent.
    pub(crate) discard_unsupported: bool,
    /// A block device's logical block size (BLKSSZGET), which BLKDISCARD and
    /// BLKZEROOUT ranges must be aligned to; the volume's block size
    /// otherwise (and for files).
    pub(crate) device_block_bytes: u64,
}

/// Claims the block device behind `file` exclusively, as `mkfs` and `mount`
/// do: an open with `O_EXCL` (which on Linux means "exclusive" for a block
/// device), through `/proc/self/fd`, so it is the device already opened.
/// It fails with `EBUSY` while the device is mounted, held by md, LVM or
/// device-mapper, claimed by another program, or while a partition of it (or
/// the whole disk it is a partition of) is, freesan's own volumes included:
/// a node configured with `/dev/sdb` and `/dev/sdb1`, or with one disk twice,
/// would otherwise write each over the other. While the claim is held, the
/// kernel refuses those to others in turn.
fn claim_exclusive(file: &File, path: &Path) -> Result<File, BlockError> {
    claim_through(Path::new("/proc/self/fd"), file, path)
}

/// [`claim_exclusive`] through the descriptor directory `fds`.
fn claim_through(fds: &Path, file: &File, path: &Path) -> Result<File, BlockError> {
    // (for writing too: the volume's discards go through it)
    let busy =
        |e: &BlockError| matches!(e, BlockError::Io(e) if e.raw_os_error() == Some(libc::EBUSY));
    let claimed = while_busy(|| reopen(fds, file, path, true, libc::O_EXCL), busy);
    claimed.map_err(|e| match e {
        e if busy(&e) => {
            BlockError::Io(io::Error::new(
                io::ErrorKind::ResourceBusy,
                format!(
                    "{} is in use: mounted, part of md, LVM or device-mapper, opened exclusively by another program, or a partition of it (or the disk it is a partition of) is; freesan does not write under them",
                    path.display()
                ),
            ))
        }
        other => other,
    })
}

/// Claims the regular file behind `file`, opened for writing, as the block
/// devices are claimed: an exclusive `flock` on a descriptor of its own
/// (opened again through `fds`), so it holds as long as that descriptor,
/// not as any other. The volume keeps it, and so does every write or sync
/// that outlives the volume's drop (a forced write or a flush whose caller
/// gave up): another of freesan's volumes, in this process or another, cannot
/// open the file for writing until those have landed (review of 2026-12-07:
/// nothing stopped a new owner of a file writing under an old one's forced
/// write still in flight, nor two LUs or nodes configured on one file). A
/// file system that takes no `flock` (some FUSE ones), or a process without
/// `/proc`, gets no claim and a warning. Opened for writing: NFS emulates
/// `flock` with a POSIX lock, whose exclusive kind needs a descriptor that
/// can write (review of 2026-12-07: read-only, the claim silently failed
/// there, where two nodes on one shared file are most likely).
fn claim_file(fds: &Path, file: &File, path: &Path) -> Result<Option<File>, BlockError> {
    let claim = match reopen(fds, file, path, true, 0) {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e,
                "the file cannot be claimed: nothing stops a second writer configured on it");
            return Ok(None);
        }
    };
    let locked = while_busy(
        || {
            // SAFETY: flock on a descriptor this function owns.
            match unsafe { libc::flock(claim.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } {
                0 => Ok(()),
                _ => Err(io::Error::last_os_error()),
            }
        },
        |e| e.raw_os_error() == Some(libc::EWOULDBLOCK),
    );
    let e = match locked {
        Ok(()) => return Ok(Some(claim)),
        Err(e) => e,
    };
    if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
        return Err(BlockError::Io(io::Error::new(
            io::ErrorKind::ResourceBusy,
            format!(
                "{} is in use: open for writing by another of freesan's volumes (in this node or another process), or writes of one just closed are still landing; freesan does not write one file from two places",
                path.display()
            ),
        )));
    }
    tracing::warn!(path = %path.display(), error = %e,
        "the file system refused the claim's flock: the file is not claimed, so nothing stops a second writer configured on it");
    Ok(None)
}

/// Runs `attempt` again while it finds the claim taken (`busy`), for up to a
/// second. A claim is let go when the last descriptor of its open is closed,
/// and a child process holds a copy of every descriptor from its fork to its
/// exec: a claim given back just now can still be held for that moment (seen
/// in CI: a partition refused right after its disk was closed), and a write
/// of a volume closed just before may still be landing.
fn while_busy<T, E>(
    mut attempt: impl FnMut() -> Result<T, E>,
    busy: impl Fn(&E) -> bool,
) -> Result<T, E> {
    let mut waits = 0;
    loop {
        match attempt() {
            Err(e) if busy(&e) && waits < 50 => {
                waits += 1;
                // (on a runtime worker, its other tasks move elsewhere
                // meanwhile: one of them may be what holds the claim)
                crate::engine::wait_beside_the_runtime(|| {
                    std::thread::sleep(std::time::Duration::from_millis(20))
                });
            }
            r => return r,
        }
    }
}

/// Opens what `file` is open on again (a description of its own), through
/// the descriptor directory `fds`; a missing directory is said so.
fn reopen(
    fds: &Path,
    file: &File,
    path: &Path,
    write: bool,
    flags: i32,
) -> Result<File, BlockError> {
    let me = fds.join(file.as_raw_fd().to_string());
    OpenOptions::new()
        .read(true)
        .write(write)
        .custom_flags(flags)
        .open(&me)
        .map_err(|e| {
            if e.kind() == io::ErrorKind::NotFound {
                // the descriptor is open: /proc is missing (or belongs to another
                // PID namespace, where /proc/self names nothing)
                BlockError::Io(io::Error::new(
                    io::ErrorKind::NotFound,
                    format!(
                        "cannot claim {} exclusively: {} is missing (is /proc mounted? freesan opens the device or file again through it, so that nothing else writes under it)",
                        path.display(),
                        fds.display()
                    ),
                ))
            } else {
                e.into()
            }
        })
}

/// Refuses `file`, opened as `path`, unless it is `want` (as the descriptor
/// directory `fds` names it: every link resolved).
fn check_reached(fds: &Path, file: &File, path: &Path, want: &Path) -> Result<(), BlockError> {
    let me = fds.join(file.as_raw_fd().to_string());
    let got = std::fs::read_link(&me).map_err(|e| {
        BlockError::Io(io::Error::new(
            e.kind(),
            format!(
                "cannot tell where {} led: {} unreadable ({e}); refused",
                path.display(),
                me.display()
            ),
        ))
    })?;
    if got != want {
        return Err(BlockError::Io(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "{} led to {} when opened, not to {} as approved: it changed after the check (a link or file was replaced): refused",
                path.display(),
                got.display(),
                want.display()
            ),
        )));
    }
    Ok(())
}

fn invalid(msg: String) -> BlockError {
    BlockError::Io(io::Error::new(io::ErrorKind::InvalidInput, msg))
}

/// Creates `path` as a sparse file of `size_bytes`, preallocated when `thick`;
/// where it lands must be `want` when given (nothing is allocated elsewhere).
fn create(
    path: &Path,
    size_bytes: u64,
    thick: bool,
    want: Option<&Path>,
) -> Result<(), BlockError> {
    let file = match OpenOptions::new().write(true).create_new(true).open(path) {
        Ok(f) => f,
        // Someone created it meanwhile: open what is there.
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => return Ok(()),
        Err(e) => return Err(denied_says_who(e, path).into()),
    };
    if let Some(want) = want {
        check_reached(Path::new("/proc/self/fd"), &file, path, want)?;
    }
    file.set_len(size_bytes)?;
    if thick && size_bytes > 0 {
        match sys::fallocate(file.as_raw_fd(), 0, 0, size_bytes) {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP) => {
                tracing::warn!(path = %path.display(), "file system cannot preallocate; the file stays sparse");
            }
            Err(e) => {
                drop(file);
                let _ = std::fs::remove_file(path);
                return Err(e.into());
            }
        }
    }
    file.sync_all()?;
    tracing::info!(path = %path.display(), size_bytes, thick, "created backing file");
    Ok(())
}

fn open_with(path: &Path, opts: &FileOptions, direct: bool) -> io::Result<File> {
    let mut flags = 0;
    if direct {
        flags |= libc::O_DIRECT;
    }
    if opts.sync_writes {
        flags |= libc::O_DSYNC;
    }
    OpenOptions::new()
        .read(true)
        .write(!opts.read_only)
        .custom_flags(flags)
        .open(path)
        .map_err(|e| denied_says_who(e, path))
}

/// A refusal to open, with the user this process runs as and what to do: a
/// node run as its own user (the package's `freesan`) opens only what was
/// given to it, and writes only where its unit lets it.
fn denied_says_who(e: io::Error, path: &Path) -> io::Error {
    if e.raw_os_error() == Some(libc::EROFS) {
        // (the packaged unit's ProtectSystem=strict shows every folder but
        // its data directory read-only)
        return io::Error::new(
            e.kind(),
            format!(
                "{e}: read-only here; for the packaged service, list its folder in \
                 ReadWritePaths= (systemctl edit freesan)"
            ),
        );
    }
    // SAFETY: geteuid has no preconditions and cannot fail
    let uid = unsafe { libc::geteuid() };
    if e.kind() != io::ErrorKind::PermissionDenied || uid == 0 {
        return e;
    }
    let device = std::fs::metadata(path).is_ok_and(|m| m.file_type().is_block_device());
    let how = if device {
        "give the device to that user (a udev rule with OWNER=, see the README's \
         \"Install as a service\")"
    } else {
        "give the file to that user (chown)"
    };
    io::Error::new(
        e.kind(),
        format!("{e}: this node runs as uid {uid}, not root: {how}"),
    )
}

/// The direct-I/O alignment (memory, offset) of `file`: statx when the kernel
/// tells, else the sector size of a device, else one page.
fn dio_alignment(file: &File, backing: Backing) -> (u32, u32) {
    if let Some((mem, off)) = sys::dio_align(file.as_raw_fd()) {
        return (mem, off);
    }
    let page = DIRECT_ALIGN_BYTES as u32;
    match backing {
        Backing::BlockDevice => {
            let sector = sys::blk_logical_block_bytes(file.as_raw_fd()).unwrap_or(page);
            (page, sector)
        }
        Backing::File => (page, page),
    }
}

/// Opens the backing store as `opts` say.
pub(crate) fn open(path: &Path, opts: &FileOptions) -> Result<Opened, BlockError> {
    let bs = opts.block_size_bytes;
    if !bs.is_power_of_two() || !(512..=65536).contains(&bs) {
        return Err(invalid(format!(
            "block size {bs} is not a power of two in 512..=65536"
        )));
    }
    match std::fs::metadata(path) {
        Ok(meta) => {
            if let Some(want) = opts.create_size_bytes {
                if meta.is_file() && want > meta.len() {
                    tracing::warn!(
                        path = %path.display(),
                        size_bytes = meta.len(),
                        create_size_bytes = want,
                        "existing file is smaller than the size asked for; not growing it"
                    );
                }
            }
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => match opts.create_size_bytes {
            Some(size) if !opts.read_only => {
                create(path, size, opts.thick, opts.resolved.as_deref())?
            }
            _ => return Err(e.into()),
        },
        Err(e) => return Err(e.into()),
    }

    let reached = |f: &File| match &opts.resolved {
        Some(want) => check_reached(Path::new("/proc/self/fd"), f, path, want),
        None => Ok(()),
    };
    let mut file = open_with(path, opts, opts.direct == DirectIo::On)?;
    reached(&file)?;
    let meta = file.metadata()?;
    let backing = if meta.file_type().is_block_device() {
        Backing::BlockDevice
    } else if meta.is_file() {
        Backing::File
    } else {
        return Err(BlockError::NotSupported(
            "backing store is neither a regular file nor a block device",
        ));
    };

    // The O_DIRECT decision.
    let (dio_mem, dio_off) = dio_alignment(&file, backing);
    let dio_fits = dio_off.is_power_of_two() && bs & (dio_off - 1) == 0;
    let direct = match opts.direct {
        DirectIo::Off => false,
        DirectIo::On => {
            if !dio_fits {
                return Err(invalid(format!(
                    "O_DIRECT needs {dio_off}-byte aligned offsets, larger than the {bs}-byte blocks"
                )));
            }
            true
        }
        DirectIo::Auto => {
            if backing == Backing::File && sys::is_tmpfs(file.as_raw_fd()) {
                false
            } else if !dio_fits {
                tracing::info!(path = %path.display(), dio_offset_align = dio_off, block_size_bytes = bs,
                    "direct I/O alignment does not fit the block size; using the page cache");
                false
            } else {
                match open_with(path, opts, true) {
                    Ok(f) => {
                        reached(&f)?;
                        file = f;
                        true
                    }
                    Err(e) if e.raw_os_error() == Some(libc::EINVAL) => false,
                    Err(e) => return Err(e.into()),
                }
            }
        }
    };

    let size_bytes = match backing {
        Backing::BlockDevice => sys::blk_size_bytes(file.as_raw_fd())?,
        Backing::File => meta.len(),
    };
    let block_count = size_bytes / bs as u64;
    if block_count == 0 {
        return Err(invalid(format!(
            "{} holds {size_bytes} bytes, less than one {bs}-byte block",
            path.display()
        )));
    }
    if size_bytes % bs as u64 != 0 {
        tracing::warn!(path = %path.display(), size_bytes, block_size_bytes = bs,
            "size is not a whole number of blocks; the tail is not exposed");
    }
    let preferred = (meta.blksize() as u32).clamp(bs, 1 << 20);
    let geometry = Geometry {
        block_size_bytes: bs,
        block_count,
        // Holes in a file read as zero (and discard falls back to writing zeroes
        // where holes cannot be punched); BLKDISCARD guarantees nothing.
        thin: backing == Backing::File,
        volatile_cache: !opts.sync_writes,
        optimal_io_blocks: (preferred / bs).max(1),
        max_io_blocks: (MAX_IO_BYTES / bs as u64) as u32,
    };
    let mem_align_bytes = if direct {
        (dio_mem as usize)
            .clamp(1, DIRECT_ALIGN_BYTES)
            .next_power_of_two()
    } else {
        1
    };
    let claim = match backing {
        _ if opts.read_only => None,
        Backing::BlockDevice => Some(claim_exclusive(&file, path)?),
        Backing::File => claim_file(Path::new("/proc/self/fd"), &file, path)?,
    };
    let discard_unsupported =
        backing == Backing::BlockDevice && crate::sys::blk_discard_supported(&file) == Some(false);
    let device_block_bytes = match backing {
        Backing::BlockDevice => crate::sys::blk_logical_block_bytes(file.as_raw_fd())
            .map(u64::from)
            .unwrap_or(bs as u64)
            .max(bs as u64),
        Backing::File => bs as u64,
    };
    Ok(Opened {
        file,
        backing,
        geometry,
        direct,
        mem_align_bytes,
        claim,
        discard_unsupported,
        device_block_bytes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Without /proc the claim says what is missing, not a bare "No such file
    /// or directory".
    #[test]
    fn a_claim_without_proc_says_so() {
        let dir = tempfile::tempdir().unwrap();
        let f = File::open(dir.path()).unwrap();
        let gone = dir.path().join("no-proc");
        let Err(e) = claim_through(&gone, &f, Path::new("/dev/sdz")) else {
            panic!("a claim through a missing directory succeeded");
        };
        let text = e.to_string();
        assert!(text.contains("is /proc mounted?"), "{text}");
        assert!(text.contains("/dev/sdz"), "{text}");
    }

    /// An open that must reach a checked file is refused when its path leads
    /// elsewhere (a link swapped after the check), and goes ahead when it
    /// leads there, through links or not.
    #[test]
    fn an_open_that_leads_elsewhere_than_checked_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let real = dir.path().canonicalize().unwrap();
        let (a, b) = (real.join("a.img"), real.join("b.img"));
        for f in [&a, &b] {
            std::fs::write(f, vec![0u8; 8192]).unwrap();
        }
        let link = real.join("lun.img");
        std::os::unix::fs::symlink(&a, &link).unwrap();
        let opts = |want: &Path| FileOptions {
            resolved: Some(want.to_path_buf()),
            ..FileOptions::default()
        };
        assert!(open(&link, &opts(&a)).is_ok(), "the checked file refused");
        assert!(open(&a, &opts(&a)).is_ok(), "the checked file refused");
        // the link now leads to another file than the one checked
        std::fs::remove_file(&link).unwrap();
        std::os::unix::fs::symlink(&b, &link).unwrap();
        let Err(e) = open(&link, &opts(&a)) else {
            panic!("an open through a swapped link went ahead");
        };
        let text = e.to_string();
        assert!(text.contains("changed after the check"), "{text}");
        // a file created through a folder link swapped since the check is
        // refused before it is sized (nothing allocated where it landed)
        let (x, y) = (real.join("x"), real.join("y"));
        for d in [&x, &y] {
            std::fs::create_dir(d).unwrap();
        }
        let folder = real.join("folder");
        std::os::unix::fs::symlink(&x, &folder).unwrap();
        let new = FileOptions {
            create_size_bytes: Some(1 << 20),
            ..opts(&y.join("new.img"))
        };
        assert!(open(&folder.join("new.img"), &new).is_err());
        assert_eq!(std::fs::metadata(x.join("new.img")).unwrap().len(), 0);
    }
}
