//! EXTENDED COPY (VAAI full copy) through a real node: from a file LUN onto a LUN on
//! a RAID 5 pool behind a write-back SSD cache, the bytes identical afterwards; a
//! SIGKILL of the node in the middle of a copy leaves every destination block
//! either as it was or as the source has it (nothing else), and the initiator's
//! retry of the command completes the copy. Windows' ODX (POPULATE TOKEN, RECEIVE
//! ROD TOKEN INFORMATION, WRITE USING TOKEN) between the same two LUNs, and its
//! zero token.

use crate::common;
use common::scsi::{self, naa, past_uas as cmd};
use common::*;
use std::path::Path;

const BS: u64 = 512;
/// Blocks copied: 48 MiB.
const BLOCKS: u64 = 48 << 11;
/// Blocks a segment descriptor carries (16-bit count).
const SEGMENT_BLOCKS: u64 = 16384;

fn config(dir: &Path) -> std::path::PathBuf {
    let mut s = config_head(dir, 4);
    for i in 0..2 {
        s += &format!(
            "[[disk]]\nname = \"ssd{i}\"\nsize = \"40M\"\npath = \"{}/ssd{i}.img\"\n",
            dir.display()
        );
    }
    s += "[[pool]]\nname = \"p\"\nlevel = \"raid5\"\nchunk = \"16K\"\nmembers = [\"d0\", \"d1\", \"d2\", \"d3\"]\n";
    s += "[[cache]]\nname = \"c\"\npool = \"p\"\nmode = \"write-back\"\ndevices = [\"ssd0\", \"ssd1\"]\n\
          size = \"32M\"\nblock_size = \"64K\"\n";
    s += &format!(
        "[[target]]\niqn = \"{IQN}\"\n[[target.lun]]\ncache = \"c\"\n\
         [[target.lun]]\npath = \"{}/src.img\"\nsize = \"64M\"\n",
        dir.display()
    );
    let path = dir.join("node.toml");
    std::fs::write(&path, s).unwrap();
    path
}

/// The content of block `b` of the source (`src` true) or of the destination before
/// the copy: every block different, the two patterns different.
fn block(src: bool, b: u64) -> Vec<u8> {
    let tag = if src {
        0x5eed_0000_0000_0000u64
    } else {
        0xdead_0000_0000_0000
    };
    (tag | b).to_be_bytes().repeat(BS as usize / 8)
}

async fn write(s: &initiator::Session, lun: u64, src: bool) {
    let chunk = 2048u64;
    for first in (0..BLOCKS).step_by(chunk as usize) {
        let data: Vec<u8> = (first..first + chunk).flat_map(|b| block(src, b)).collect();
        let mut c = [0u8; 16];
        c[0] = 0x8a;
        c[2..10].copy_from_slice(&first.to_be_bytes());
        c[10..14].copy_from_slice(&(chunk as u32).to_be_bytes());
        assert_eq!(cmd(s, lun, &c, data, 0).await.status, 0);
    }
}

async fn read_all(s: &initiator::Session, lun: u64) -> Vec<u8> {
    let chunk = 2048u64;
    let mut out = Vec::new();
    for first in (0..BLOCKS).step_by(chunk as usize) {
        let mut c = [0u8; 16];
        c[0] = 0x88;
        c[2..10].copy_from_slice(&first.to_be_bytes());
        c[10..14].copy_from_slice(&(chunk as u32).to_be_bytes());
        let r = cmd(s, lun, &c, vec![], (chunk * BS) as u32).await;
        assert_eq!(r.status, 0);
        out.extend_from_slice(&r.data_in);
    }
    out
}

/// EXTENDED COPY of the first BLOCKS blocks of LUN 1 onto LUN 0, with list id
/// `list` held for RECEIVE COPY RESULTS.
fn xcopy(src: [u8; 16], dst: [u8; 16], list: u8) -> (Vec<u8>, Vec<u8>) {
    let segments: Vec<(u64, u64, u16)> = (0..BLOCKS)
        .step_by(SEGMENT_BLOCKS as usize)
        .map(|first| (first, first, SEGMENT_BLOCKS as u16))
        .collect();
    scsi::xcopy(src, dst, BS as u32, &segments, list)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extended_copy_onto_a_cached_raid5_lun_and_across_a_sigkill() {
    let dir = tempfile::tempdir().unwrap();
    let (cfg, node, s) = node_with_data(dir.path()).await;
    let (src, dst) = (naa(&s, 1).await, naa(&s, 0).await);
    assert_ne!(src, dst);

    // A whole copy: the destination then reads as the source.
    let (c, p) = xcopy(src, dst, 1);
    let r = cmd(&s, 0, &c, p, 0).await;
    assert_eq!(r.status, 0, "EXTENDED COPY: {:?}", r.sense);
    let want = read_all(&s, 1).await;
    assert!(
        read_all(&s, 0).await == want,
        "the copy differs from the source"
    );

    // Again from the old content, killed in the middle.
    write(&s, 0, false).await;
    let (c, p) = xcopy(src, dst, 2);
    kill_mid_copy(node, &s, &c, p).await;
    drop(s);
    let node = start_config(dir.path(), &cfg);
    let s = node.login("iqn.2026-11.test:xcopy").await;
    finished_at_start(&s, &want, dir.path()).await;
    // The initiator retries the command: the copy completes.
    let (c, p) = xcopy(src, dst, 3);
    assert_eq!(cmd(&s, 0, &c, p, 0).await.status, 0);
    assert!(
        read_all(&s, 0).await == want,
        "the retried copy differs from the source"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn odx_token_copy_onto_a_cached_raid5_lun() {
    let dir = tempfile::tempdir().unwrap();
    let (_cfg, _node, s) = node_with_data(dir.path()).await;
    // The Third-party Copy VPD page starts with the Block Device ROD Token Limits.
    let r = cmd(&s, 0, &[0x12, 1, 0x8f, 4, 0, 0], vec![], 1024).await;
    assert_eq!(r.status, 0);
    assert_eq!(&r.data_in[4..8], &[0, 0, 0, 0x20]);

    // POPULATE TOKEN on the source, the token through RECEIVE ROD TOKEN INFORMATION.
    let token = source_token(&s).await;

    // WRITE USING TOKEN onto the cached RAID 5 LUN: it then reads as the source.
    let (c, p) = scsi::write_using_token(&token, 0, BLOCKS as u32, 8);
    let r = cmd(&s, 0, &c, p, 0).await;
    assert_eq!(r.status, 0, "WRITE USING TOKEN: {:?}", r.sense);
    let want = read_all(&s, 1).await;
    assert!(
        read_all(&s, 0).await == want,
        "the token copy differs from the source"
    );

    // The zero token zeroes a range.
    let mut zero = vec![0u8; 512];
    zero[0..4].copy_from_slice(&0xffff_0001u32.to_be_bytes());
    zero[6..8].copy_from_slice(&0x01f8u16.to_be_bytes());
    let (c, p) = scsi::write_using_token(&zero, 100, 5000, 9);
    assert_eq!(cmd(&s, 0, &c, p, 0).await.status, 0);
    let got = read_all(&s, 0).await;
    for b in 0..BLOCKS {
        let have = &got[(b * BS) as usize..((b + 1) * BS) as usize];
        if (100..5100).contains(&b) {
            assert!(have.iter().all(|&x| x == 0), "block {b} is not zero");
        } else {
            assert_eq!(have, &block(true, b)[..], "block {b}");
        }
    }
    // A token changed by one bit is refused (INVALID TOKEN OPERATION, TOKEN CORRUPT).
    let mut bad = token.clone();
    bad[200] ^= 1;
    let (c, p) = scsi::write_using_token(&bad, 0, 8, 10);
    let r = cmd(&s, 0, &c, p, 0).await;
    let sense = r.sense.as_deref().and_then(initiator::parse_sense).unwrap();
    assert_eq!((sense.key, sense.asc, sense.ascq), (5, 0x23, 0x05));
}

/// The copies recorded in the record files (`lunN.copy.slots`) under `dir`:
/// what a restart would run again.
fn records_under(dir: &Path) -> usize {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| {
            let p = e.path();
            let name = p.to_string_lossy().into_owned();
            if p.is_dir() {
                records_under(&p)
            } else if let Some(stem) = name.strip_suffix(".copy.slots") {
                ::scsi::copy_records(Path::new(&format!("{stem}.pr.json")))
            } else {
                0
            }
        })
        .sum()
}

/// Sends copy command `c` (parameters `p`) to LUN 0 from a second session,
/// waits until it moved data (the destination's first block reads as the
/// source's), then SIGKILLs the node.
async fn kill_mid_copy(mut node: common::Node, s: &initiator::Session, c: &[u8], p: Vec<u8>) {
    let copying = {
        let s2 = node.login("iqn.2026-11.test:xcopy").await;
        // a new nexus meets its unit attention first
        assert_eq!(cmd(&s2, 0, &[0; 6], vec![], 0).await.status, 0);
        let c = c.to_vec();
        tokio::spawn(async move {
            let _ = s2.command(0, &c, bytes::Bytes::from(p), 0).await;
        })
    };
    let mut progressed = false;
    for _ in 0..400 {
        let mut c = [0u8; 16];
        c[0] = 0x88;
        c[13] = 1;
        let r = cmd(s, 0, &c, vec![], BS as u32).await;
        if r.data_in[..] == block(true, 0)[..] {
            progressed = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    assert!(progressed, "the copy never started");
    node.kill9();
    let _ = copying.await;
}

/// After a restart: the copy running at the kill was recorded before its first
/// block moved, so the node runs it again at start and LUN 0 answers NOT READY
/// until it is done; it then reads as `want`, and no record is left.
async fn finished_at_start(s: &initiator::Session, want: &[u8], dir: &Path) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    loop {
        let r = s
            .command(0, &[0u8; 6], bytes::Bytes::new(), 0)
            .await
            .expect("TEST UNIT READY");
        if r.status == 0 {
            break;
        }
        let sense = r.sense.as_deref().and_then(initiator::parse_sense);
        let key = sense.as_ref().map(|x| x.key);
        assert!(
            matches!(key, Some(2) | Some(6)),
            "TEST UNIT READY after the restart: {sense:?}"
        );
        assert!(
            std::time::Instant::now() < deadline,
            "the interrupted copy never finished"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let got = read_all(s, 0).await;
    let (mut copied, mut old) = (0u64, 0u64);
    for b in 0..BLOCKS {
        let have = &got[(b * BS) as usize..((b + 1) * BS) as usize];
        if have == &block(true, b)[..] {
            copied += 1;
        } else if have == &block(false, b)[..] {
            old += 1;
        } else {
            panic!("block {b} is neither the source's nor the old content after the kill");
        }
    }
    eprintln!("after the kill and the restart: {copied} blocks copied, {old} old");
    assert!(
        got == want,
        "the copy running at the kill was not finished at start ({old} blocks old)"
    );
    assert!(
        records_under(dir) == 0,
        "the copy's record is left behind once it finished"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_odx_copy_killed_mid_way_is_finished_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let (cfg, node, s) = node_with_data(dir.path()).await;
    let want = read_all(&s, 1).await;
    let token = source_token(&s).await;
    let (c, p) = scsi::write_using_token(&token, 0, BLOCKS as u32, 8);
    kill_mid_copy(node, &s, &c, p).await;
    drop(s);
    let node = start_config(dir.path(), &cfg);
    let s = node.login("iqn.2026-11.test:xcopy").await;
    finished_at_start(&s, &want, dir.path()).await;
}

/// A node on `config` with the source (LUN 1) and the destination's old content
/// (LUN 0) written, and a session to it.
async fn node_with_data(dir: &Path) -> (std::path::PathBuf, common::Node, initiator::Session) {
    let cfg = config(dir);
    let node = start_config(dir, &cfg);
    let s = node.login("iqn.2026-11.test:xcopy").await;
    write(&s, 1, true).await;
    write(&s, 0, false).await;
    (cfg, node, s)
}

/// POPULATE TOKEN over the whole source, the token through RECEIVE ROD TOKEN
/// INFORMATION.
async fn source_token(s: &initiator::Session) -> Vec<u8> {
    let (c, p) = scsi::populate_token(0, BLOCKS as u32, 7);
    let r = cmd(s, 1, &c, p, 0).await;
    assert_eq!(r.status, 0, "POPULATE TOKEN: {:?}", r.sense);
    let r = cmd(s, 1, &scsi::receive_rod_token_information(7), vec![], 1024).await;
    assert_eq!(r.status, 0);
    assert_eq!(r.data_in[5], 0x01, "completed");
    scsi::token_of(&r.data_in)
}
