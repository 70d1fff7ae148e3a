//! How a [`crate::FileVolume`] is opened: creation, block size, O_DIRECT, sync
//! writes, the I/O engine; and [`parse_size`] for sizes written by people.

/// Whether to bypass the page cache with `O_DIRECT`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DirectIo {
    /// Use O_DIRECT where it helps: not on tmpfs (it is all page cache there and
    /// O_DIRECT only adds alignment copies), not where the file system refuses it
    /// (EINVAL), and not where the device's direct-I/O alignment is larger than the
    /// volume's block size. Otherwise buffered.
    #[default]
    Auto,
    /// Always go through the page cache.
    Off,
    /// Require O_DIRECT; opening fails when the file system or alignment forbids it.
    On,
}

/// Which I/O engine carries reads, writes and flushes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Engine {
    /// io_uring when the kernel (and any seccomp sandbox) allows it, else threads.
    #[default]
    Auto,
    /// io_uring only; opening fails when it cannot be set up.
    IoUring,
    /// pread/pwrite on tokio's blocking thread pool.
    Threads,
}

/// Options of [`crate::FileVolume::open`].
#[derive(Debug, Clone)]
pub struct FileOptions {
    /// Create the file with this size when it does not exist (sparse unless
    /// `thick`). An existing file is never grown by this: a larger value is logged
    /// and ignored.
    pub create_size_bytes: Option<u64>,
    /// When creating, preallocate the whole file with fallocate.
    pub thick: bool,
    /// Logical block size exposed by the volume: a power of two, 512..=65536.
    pub block_size_bytes: u32,
    /// O_DIRECT policy.
    pub direct: DirectIo,
    /// Open with O_DSYNC: every write is durable when acknowledged and the geometry
    /// reports `volatile_cache = false`.
    pub sync_writes: bool,
    /// Open read-only; every write-type operation fails with `BlockError::ReadOnly`.
    pub read_only: bool,
    /// The I/O engine.
    pub engine: Engine,
    /// Most operations queued or in flight at once; further callers wait.
    pub queue_depth_max: u32,
    /// On buffered files, try each read and write of up to 1 MiB inline with
    /// RWF_NOWAIT first: page-cache hits complete on the calling thread with no
    /// hand-off to the engine; anything that would block goes to the engine.
    pub nowait_inline: bool,
    /// Where the path must lead, every symbolic link resolved: what a check
    /// of the path approved (the API's allowed folders). The open is refused,
    /// before any I/O, when the descriptor it got is another file (a link
    /// swapped between the check and the open).
    pub resolved: Option<std::path::PathBuf>,
}

impl Default for FileOptions {
    fn default() -> Self {
        FileOptions {
            create_size_bytes: None,
            thick: false,
            block_size_bytes: 512,
            direct: DirectIo::Auto,
            sync_writes: false,
            read_only: false,
            engine: Engine::Auto,
            queue_depth_max: 256,
            nowait_inline: true,
            resolved: None,
        }
    }
}

/// Parses a size such as `4096`, `4K`, `512M`, `16GiB`, `1T` or `2 tb`. Units are
/// binary (K = 1024) whether written `K`, `KB` or `KiB`, in any case. Returns
/// `None` for anything else, for fractions and on overflow.
pub fn parse_size(s: &str) -> Option<u64> {
    let s = s.trim();
    let digits_end = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    if digits_end == 0 {
        return None;
    }
    let number: u64 = s[..digits_end].parse().ok()?;
    let unit = s[digits_end..].trim_start().to_ascii_lowercase();
    let shift = match unit.as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        "p" | "pb" | "pib" => 50,
        _ => return None,
    };
    number.checked_mul(1u64 << shift)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("4096"), Some(4096));
        assert_eq!(parse_size("4G"), Some(4 << 30));
        assert_eq!(parse_size("512M"), Some(512 << 20));
        assert_eq!(parse_size("16GiB"), Some(16 << 30));
        assert_eq!(parse_size("1T"), Some(1 << 40));
        assert_eq!(parse_size("8k"), Some(8192));
        assert_eq!(parse_size(" 2 tb "), Some(2 << 40));
        assert_eq!(parse_size("100b"), Some(100));
    }

    #[test]
    fn bad_sizes_refused() {
        for s in [
            "",
            "G",
            "1.5G",
            "-1",
            "4X",
            "4GiBs",
            "99999999999999999999",
            "16777216T",
        ] {
            assert_eq!(parse_size(s), None, "{s:?}");
        }
    }
}
