//! Helpers shared by the disk integration tests.
#![allow(dead_code)]

use disk::{Engine, FileOptions};
use std::path::Path;

/// Both engines: every behaviour test runs on each.
pub const ENGINES: [Engine; 2] = [Engine::IoUring, Engine::Threads];

/// Options creating a sparse file of `size_bytes` with `engine`.
pub fn create_opts(engine: Engine, size_bytes: u64) -> FileOptions {
    FileOptions {
        create_size_bytes: Some(size_bytes),
        engine,
        ..FileOptions::default()
    }
}

/// Allocated bytes of a file (st_blocks * 512).
pub fn allocated_bytes(path: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path)
        .map(|m| m.blocks() * 512)
        .unwrap_or(0)
}

/// A recognisable pattern for block `lba` with `seed`.
pub fn pattern(lba: u64, blocks: u64, bs: u64, seed: u8) -> Vec<u8> {
    let mut v = Vec::with_capacity((blocks * bs) as usize);
    for b in 0..blocks {
        for i in 0..bs {
            v.push(((lba + b) as u8) ^ (i as u8).wrapping_mul(31) ^ seed);
        }
    }
    v
}

/// Temporary directories to run on: the default temp dir (a disk file system,
/// where Auto picks O_DIRECT) and /dev/shm (tmpfs) when present.
pub fn dirs() -> Vec<tempfile::TempDir> {
    let mut v = vec![tempfile::tempdir().expect("tempdir")];
    if Path::new("/dev/shm").is_dir() {
        if let Ok(d) = tempfile::tempdir_in("/dev/shm") {
            v.push(d);
        }
    }
    v
}
