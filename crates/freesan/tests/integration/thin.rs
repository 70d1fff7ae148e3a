//! A thin LUN on a small file system (a 24 MiB tmpfs under a 64 MiB sparse file)
//! with a soft threshold at 50%: an initiator writing it sequentially is told
//! THIN PROVISIONING SOFT THRESHOLD REACHED (a unit attention) before it runs out,
//! then gets DATA PROTECT / SPACE ALLOCATION FAILED WRITE PROTECT (27/07), not an
//! internal target failure; every acknowledged write reads back, after a SIGKILL
//! and restart too; and space freed by UNMAP can be written again.
//!
//! Mounting the tmpfs needs root (the test command runs as root); elsewhere the
//! test is skipped unless FREESAN_REQUIRE_TOOLS is set.

use crate::common;
use common::scsi::condition;
use common::*;
use initiator::{LoginOptions, ScsiResult, Session};
use std::path::{Path, PathBuf};
use std::process::Command;

const MIB: u64 = 1 << 20;
const CHUNK_BYTES: u64 = 256 * 1024;
const BS: u64 = 512;

/// A tmpfs of `size_mib` mounted for the test, unmounted when dropped.
struct SmallFs(PathBuf);

impl SmallFs {
    fn mount(at: &Path, size_mib: u64) -> Option<SmallFs> {
        std::fs::create_dir_all(at).unwrap();
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size_mib}m")])
            .arg("freesan-thin-test")
            .arg(at)
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        if !ok {
            assert!(
                std::env::var("FREESAN_REQUIRE_TOOLS").is_err(),
                "mounting a tmpfs failed (the test command runs as root)"
            );
            eprintln!("skipping: cannot mount a tmpfs (not root?)");
            return None;
        }
        Some(SmallFs(at.to_path_buf()))
    }
}

impl Drop for SmallFs {
    fn drop(&mut self) {
        let ok = Command::new("umount")
            .arg(&self.0)
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        if !ok {
            // still busy (a process not yet reaped): detach it now, gone when freed
            let _ = Command::new("umount").arg("-l").arg(&self.0).status();
        }
    }
}

fn rw16(opcode: u8, lba: u64, blocks: u32) -> [u8; 16] {
    let mut c = [0u8; 16];
    c[0] = opcode;
    c[2..10].copy_from_slice(&lba.to_be_bytes());
    c[10..14].copy_from_slice(&blocks.to_be_bytes());
    c
}

/// The content of chunk `i`: its number in every byte, then a marker.
fn chunk(i: u64) -> Vec<u8> {
    let mut v = vec![(i % 251) as u8 + 1; CHUNK_BYTES as usize];
    v[..8].copy_from_slice(&i.to_be_bytes());
    v
}

async fn write_chunk(s: &Session, i: u64) -> ScsiResult {
    let blocks = (CHUNK_BYTES / BS) as u32;
    s.command(
        0,
        &rw16(0x8a, i * CHUNK_BYTES / BS, blocks),
        bytes::Bytes::from(chunk(i)),
        0,
    )
    .await
    .expect("write")
}

fn sense_key(r: &ScsiResult) -> u8 {
    r.sense
        .as_deref()
        .and_then(initiator::parse_sense)
        .expect("sense")
        .key
}

async fn login(node: &Node) -> Session {
    let addr = node.portals[0].parse().unwrap();
    let s = Session::login(addr, &LoginOptions::new("iqn.2026-11.test:thin", IQN))
        .await
        .expect("login");
    for _ in 0..4 {
        let r = s.command(0, &[0; 6], bytes::Bytes::new(), 0).await.unwrap();
        if r.status == 0 {
            break;
        }
    }
    s
}

/// Reads chunk `i` back and compares it.
async fn assert_chunk(s: &Session, i: u64, what: &str) {
    let blocks = (CHUNK_BYTES / BS) as u32;
    let r = s
        .command(
            0,
            &rw16(0x88, i * CHUNK_BYTES / BS, blocks),
            bytes::Bytes::new(),
            CHUNK_BYTES as u32,
        )
        .await
        .expect("read");
    assert_eq!(r.status, 0, "{what}: reading chunk {i}");
    assert!(
        r.data_in[..] == chunk(i)[..],
        "{what}: acknowledged chunk {i} does not read back"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thin_lun_warns_at_its_threshold_then_refuses_writes_without_losing_any() {
    let dir = tempfile::tempdir().unwrap();
    let fs_dir = dir.path().join("fs");
    let Some(_fs) = SmallFs::mount(&fs_dir, 24) else {
        return;
    };
    let cfg = dir.path().join("node.toml");
    std::fs::write(
        &cfg,
        format!(
            "data_dir = \"{d}/data\"\n[api]\naddress = \"127.0.0.1:0\"\n\
             [[portal]]\naddress = \"127.0.0.1:0\"\n[[target]]\niqn = \"{IQN}\"\n\
             [[target.lun]]\npath = \"{f}/lun0.img\"\nsize = \"64M\"\n\
             thin_threshold_percent = 50\n",
            d = dir.path().display(),
            f = fs_dir.display()
        ),
    )
    .unwrap();
    let mut node = start_config(dir.path(), &cfg);
    let s = login(&node).await;

    // The LBP VPD page says thresholds are supported; the mode subpage holds the
    // enabled soft threshold.
    let r = s
        .command(0, &[0x12, 1, 0xb2, 0, 64, 0], bytes::Bytes::new(), 64)
        .await
        .unwrap();
    assert!(r.data_in[4] >= 1, "THRESHOLD EXPONENT");
    let r = s
        .command(
            0,
            &[0x5a, 0x08, 0x1c, 0x02, 0, 0, 0, 0, 64, 0],
            bytes::Bytes::new(),
            64,
        )
        .await
        .unwrap();
    assert_eq!(r.status, 0);
    assert_eq!(&r.data_in[8..10], &[0x5c, 0x02]);
    assert_eq!(r.data_in[8 + 16] & 0x80, 0x80, "threshold enabled");

    // Sequential writes until the file system is full.
    let lun_chunks = 64 * MIB / CHUNK_BYTES;
    let mut acked = Vec::new();
    let mut warned_at = None;
    let mut full_at = None;
    let mut i = 0;
    while i < lun_chunks {
        let r = write_chunk(&s, i).await;
        match condition(&r) {
            None => {
                acked.push(i);
                i += 1;
            }
            Some((0x38, 0x07)) => {
                assert_eq!(sense_key(&r), 6, "the soft threshold is a unit attention");
                assert!(warned_at.is_none(), "one unit attention per crossing");
                warned_at = Some(i); // the command was not run: again
            }
            Some((0x27, 0x07)) => {
                assert_eq!(sense_key(&r), 7, "DATA PROTECT");
                full_at = Some(i);
                break;
            }
            other => panic!("chunk {i}: unexpected answer {other:?}"),
        }
    }
    let warned_at = warned_at.expect("no THIN PROVISIONING SOFT THRESHOLD REACHED");
    let full_at = full_at.expect("a 64 MiB LUN on a 24 MiB file system never ran out");
    eprintln!(
        "threshold reported before chunk {warned_at} ({} MiB), out of space at chunk {full_at} ({} MiB)",
        warned_at * CHUNK_BYTES / MIB,
        full_at * CHUNK_BYTES / MIB
    );
    // 50% of what the LUN can reach (the 24 MiB file system): about 12 MiB
    // written, well before the file system is full.
    assert!(
        warned_at * CHUNK_BYTES >= 10 * MIB && warned_at * CHUNK_BYTES <= 14 * MIB,
        "threshold at chunk {warned_at}"
    );
    assert!(warned_at < full_at);
    // Still refused, and the header does not claim write protection.
    let r = write_chunk(&s, full_at).await;
    assert_eq!(condition(&r), Some((0x27, 0x07)));
    let r = s
        .command(0, &[0x1a, 0, 0x0a, 0, 64, 0], bytes::Bytes::new(), 64)
        .await
        .unwrap();
    assert_eq!(r.data_in[2] & 0x80, 0, "no WP bit");

    for &c in &acked {
        assert_chunk(&s, c, "after running out").await;
    }
    // (awaited: the node logs from its own threads, and CI once read the
    // log before the out-of-space line landed)
    let log = dir.path().join("serve.log");
    await_log(&log, "thin provisioning soft threshold reached");
    await_log(&log, "thin LU out of space");

    // SIGKILL and restart: every acknowledged chunk is still there.
    drop(s);
    node.kill9();
    let node = start_config(dir.path(), &cfg);
    let s = login(&node).await;
    for &c in &acked {
        assert_chunk(&s, c, "after SIGKILL and restart").await;
    }

    // UNMAP of the first 4 MiB gives the space back: the refused chunk is
    // written now.
    let blocks = (4 * MIB / BS) as u32;
    let mut list = vec![0u8, 22, 0, 16, 0, 0, 0, 0];
    list.extend_from_slice(&0u64.to_be_bytes());
    list.extend_from_slice(&blocks.to_be_bytes());
    list.extend_from_slice(&[0; 4]);
    let r = s
        .command(
            0,
            &[0x42, 0, 0, 0, 0, 0, 0, 0, 24, 0],
            bytes::Bytes::from(list),
            0,
        )
        .await
        .unwrap();
    assert_eq!(r.status, 0, "UNMAP");
    // (the use is still over the threshold after the restart: the first command
    // after the sample may meet the unit attention again)
    let mut r = write_chunk(&s, full_at).await;
    if condition(&r) == Some((0x38, 0x07)) {
        r = write_chunk(&s, full_at).await;
    }
    assert_eq!(condition(&r), None, "writable again after UNMAP");
    assert_chunk(&s, full_at, "after UNMAP").await;
}
