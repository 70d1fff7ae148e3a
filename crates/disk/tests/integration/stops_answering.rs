//! A real disk that stops answering: a file on an ext4 file system (on a loop
//! device) that is frozen (`fsfreeze`), so the kernel takes writes to it and
//! answers none until it is thawed, as a hung device does. Behind the command
//! timeout (`TimedDisk`), the write fails at the timeout and the disk is
//! failed; the engine keeps the request until the kernel answers it, so the
//! volume can be dropped once the file system thaws, and the late write
//! lands then (what the module doc of `timed.rs` says a pool must not rely
//! on, and does not: it failed the disk).

use crate::common::*;
use block::{BlockError, Bytes, Volume, VolumeRef};
use disk::{FileOptions, FileVolume, TimedDisk};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

/// An ext4 file system on a loop device over a 64 MiB file, mounted on a
/// temporary directory, with a 4 MiB file written; thawed and unmounted when
/// dropped. None where loop mounts are not allowed (not root).
struct Freezable {
    dir: tempfile::TempDir,
    mnt: PathBuf,
}

fn run(cmd: &str, args: &[&str], path: &Path) -> bool {
    Command::new(cmd)
        .args(args)
        .arg(path)
        .status()
        .is_ok_and(|s| s.success())
}

impl Freezable {
    fn new() -> Option<Freezable> {
        let dir = tempfile::tempdir().unwrap();
        let img = dir.path().join("fs.img");
        std::fs::File::create(&img)
            .unwrap()
            .set_len(64 << 20)
            .unwrap();
        if !run("mkfs.ext4", &["-q", "-F"], &img) {
            return None;
        }
        let mnt = dir.path().join("mnt");
        std::fs::create_dir(&mnt).unwrap();
        let mounted = Command::new("mount")
            .args(["-o", "loop"])
            .arg(&img)
            .arg(&mnt)
            .status()
            .is_ok_and(|s| s.success());
        if !mounted {
            return None;
        }
        let f = Freezable { dir, mnt };
        std::fs::write(f.file(), vec![0u8; 4 << 20]).unwrap();
        Some(f)
    }

    fn file(&self) -> PathBuf {
        self.mnt.join("disk.img")
    }

    fn freeze(&self) {
        assert!(run("fsfreeze", &["-f"], &self.mnt), "fsfreeze -f");
    }

    fn thaw(&self) {
        // (fails harmlessly when not frozen)
        let _ = Command::new("fsfreeze")
            .arg("-u")
            .arg(&self.mnt)
            .stderr(std::process::Stdio::null())
            .status();
    }
}

impl Drop for Freezable {
    fn drop(&mut self) {
        self.thaw();
        // lazily: a descriptor a failed test left open must not keep it
        let _ = Command::new("umount").arg("-l").arg(&self.mnt).status();
        let _ = &self.dir;
    }
}

/// Thaws its file system when dropped.
struct Thaw<'a>(&'a Freezable);

impl Drop for Thaw<'_> {
    fn drop(&mut self) {
        self.0.thaw();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_the_kernel_never_answers_fails_the_disk_at_the_timeout() {
    for engine in ENGINES {
        let Some(fs) = Freezable::new() else {
            assert!(
                std::env::var("FREESAN_REQUIRE_TOOLS").is_err(),
                "loop mounts and fsfreeze are required (run the tests as root)"
            );
            eprintln!("skipped: no loop mount here (not root?)");
            return;
        };
        let opts = FileOptions {
            engine,
            ..FileOptions::default()
        };
        let file: VolumeRef = Arc::new(FileVolume::open(&fs.file(), &opts).unwrap());
        let bs = file.geometry().block_size_bytes as u64;
        let limit = Duration::from_millis(300);
        let d = TimedDisk::with_timeout(file.clone(), "frozen", limit);
        let new = Bytes::from(pattern(8, 8, bs, 5));
        d.write(8, new.clone(), true).await.unwrap();

        fs.freeze();
        // thawed before `d` and `file` are dropped, should an assertion
        // fail: closing the volume waits for the write the kernel holds
        let _thaw = Thaw(&fs);
        let late = Bytes::from(pattern(16, 8, bs, 6));
        let t = std::time::Instant::now();
        let e = tokio::time::timeout(Duration::from_secs(30), d.write(16, late.clone(), true))
            .await
            .unwrap_or_else(|_| panic!("{engine:?}: the write waited past the timeout"))
            .unwrap_err();
        assert!(t.elapsed() >= limit, "{engine:?}: failed early: {e}");
        let BlockError::Io(io) = &e else {
            panic!("{engine:?}: {e}")
        };
        assert_eq!(io.kind(), std::io::ErrorKind::TimedOut, "{engine:?}: {e}");
        // failed: a read, which the frozen file system would answer, is
        // refused, and nothing more is sent to the file
        let e = d.read(8, 8).await.unwrap_err();
        assert!(e.to_string().contains("taken as failed"), "{engine:?}: {e}");
        assert_eq!(d.timing().timeouts, 1);

        // thawed, the kernel answers the request the engine kept: it lands
        fs.thaw();
        drop(d);
        let landed = tokio::time::timeout(Duration::from_secs(30), async {
            while file.read(16, 8).await.unwrap() != late {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await;
        assert!(landed.is_ok(), "{engine:?}: the late write never landed");
        assert_eq!(file.read(8, 8).await.unwrap(), new, "{engine:?}");
        // and the volume closes (it waits for what its engine still holds)
        drop(file);
    }
}
