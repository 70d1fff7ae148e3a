//! EXTENDED COPY (VAAI full copy) through a real node: from a file LUN onto a LUN on
//! a RAID 5 pool behind a write-back SSD cache, the bytes identical afterwards; a
//! SIGKILL of the node in the middle of a copy leaves every destination block
//! either as it was or as the source has it (nothing else), and the initiator's
//! retry of the command completes the copy. Windows' ODX (POPULATE TOKEN, RECEIVE
//! ROD TOKEN INFORMATION, WRITE USING TOKEN) between the same two LUNs, and its
//! zero token.

mod common;
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

async fn session(node: &Node) -> initiator::Session {
    let addr = node.portals[0].parse().unwrap();
    initiator::Session::login(
        addr,
        &initiator::LoginOptions::new("iqn.2026-11.test:xcopy", IQN),
    )
    .await
    .expect("login")
}

async fn cmd(
    s: &initiator::Session,
    lun: u64,
    cdb: &[u8],
    out: Vec<u8>,
    din: u32,
) -> initiator::ScsiResult {
    // the first commands of a nexus meet unit attentions
    for _ in 0..4 {
        let r = s
            .command(lun, cdb, bytes::Bytes::from(out.clone()), din)
            .await
            .expect("command");
        let ua = r.status == 2
            && r.sense
                .as_deref()
                .and_then(initiator::parse_sense)
                .is_some_and(|x| x.key == 6);
        if !ua {
            return r;
        }
    }
    panic!("unit attentions without end");
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

/// The LU's NAA designator (VPD 0x83).
async fn naa(s: &initiator::Session, lun: u64) -> [u8; 16] {
    let r = cmd(s, lun, &[0x12, 1, 0x83, 1, 0, 0], vec![], 256).await;
    assert_eq!(r.status, 0);
    let d = &r.data_in[4..];
    assert_eq!(
        (d[1] & 0x0f, d[3]),
        (3, 16),
        "the first designator is the NAA"
    );
    d[4..20].try_into().unwrap()
}

/// EXTENDED COPY of the first BLOCKS blocks of LUN 1 onto LUN 0, with list id
/// `list` held for RECEIVE COPY RESULTS.
fn xcopy(src: [u8; 16], dst: [u8; 16], list: u8) -> (Vec<u8>, Vec<u8>) {
    let mut cscds = Vec::new();
    for naa in [src, dst] {
        let mut d = [0u8; 32];
        d[0] = 0xe4;
        d[4] = 0x01;
        d[5] = 0x03;
        d[7] = 16;
        d[8..24].copy_from_slice(&naa);
        d[30] = (BS >> 8) as u8;
        cscds.extend_from_slice(&d);
    }
    let mut segs = Vec::new();
    for first in (0..BLOCKS).step_by(SEGMENT_BLOCKS as usize) {
        let mut d = [0u8; 28];
        d[0] = 0x02;
        d[3] = 24;
        d[6..8].copy_from_slice(&1u16.to_be_bytes());
        d[10..12].copy_from_slice(&(SEGMENT_BLOCKS as u16).to_be_bytes());
        d[12..20].copy_from_slice(&first.to_be_bytes());
        d[20..28].copy_from_slice(&first.to_be_bytes());
        segs.extend_from_slice(&d);
    }
    let mut p = vec![0u8; 16];
    p[0] = list;
    p[2..4].copy_from_slice(&(cscds.len() as u16).to_be_bytes());
    p[8..12].copy_from_slice(&(segs.len() as u32).to_be_bytes());
    p.extend_from_slice(&cscds);
    p.extend_from_slice(&segs);
    let mut c = vec![0u8; 16];
    c[0] = 0x83;
    c[10..14].copy_from_slice(&(p.len() as u32).to_be_bytes());
    (c, p)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extended_copy_onto_a_cached_raid5_lun_and_across_a_sigkill() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path());
    let mut node = start_config(dir.path(), &cfg);
    let s = session(&node).await;
    write(&s, 1, true).await;
    write(&s, 0, false).await;
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
    let copying = {
        let s2 = session(&node).await;
        // a new nexus meets its unit attention first
        assert_eq!(cmd(&s2, 0, &[0; 6], vec![], 0).await.status, 0);
        tokio::spawn(async move {
            let _ = s2.command(0, &c, bytes::Bytes::from(p), 0).await;
        })
    };
    // wait for the copy to have moved some data (its first block reads as the
    // source's), polling the destination
    let mut progressed = false;
    for _ in 0..400 {
        let mut c = [0u8; 16];
        c[0] = 0x88;
        c[13] = 1;
        let r = cmd(&s, 0, &c, vec![], BS as u32).await;
        if r.data_in[..] == block(true, 0)[..] {
            progressed = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    assert!(progressed, "the copy never started");
    node.kill9();
    let _ = copying.await;
    drop(s);

    let node = start_config(dir.path(), &cfg);
    let s = session(&node).await;
    let got = read_all(&s, 0).await;
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
    // The command was never answered: any mix of the two is allowed, nothing else.
    eprintln!("after the kill: {copied} blocks copied, {old} old");
    // The initiator retries the command: the copy completes.
    let (c, p) = xcopy(src, dst, 3);
    assert_eq!(cmd(&s, 0, &c, p, 0).await.status, 0);
    assert!(
        read_all(&s, 0).await == want,
        "the retried copy differs from the source"
    );
}

/// POPULATE TOKEN (0x10) or WRITE USING TOKEN (0x11) with `list`.
fn token_cdb(sa: u8, list: u32, len: usize) -> Vec<u8> {
    let mut c = vec![0u8; 16];
    c[0] = 0x83;
    c[1] = sa;
    c[6..10].copy_from_slice(&list.to_be_bytes());
    c[10..14].copy_from_slice(&(len as u32).to_be_bytes());
    c
}

/// One block device range descriptor.
fn range(lba: u64, blocks: u32) -> Vec<u8> {
    let mut d = vec![0u8; 16];
    d[0..8].copy_from_slice(&lba.to_be_bytes());
    d[8..12].copy_from_slice(&blocks.to_be_bytes());
    d
}

/// WRITE USING TOKEN of `token` onto `lba..lba + blocks`.
fn write_using_token(token: &[u8], lba: u64, blocks: u32, list: u32) -> (Vec<u8>, Vec<u8>) {
    let mut p = vec![0u8; 536];
    p[0..2].copy_from_slice(&(534u16 + 16).to_be_bytes());
    p[16..528].copy_from_slice(token);
    p[535] = 16;
    p.extend_from_slice(&range(lba, blocks));
    (token_cdb(0x11, list, p.len()), p)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn odx_token_copy_onto_a_cached_raid5_lun() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path());
    let node = start_config(dir.path(), &cfg);
    let s = session(&node).await;
    write(&s, 1, true).await;
    write(&s, 0, false).await;
    // The Third-party Copy VPD page starts with the Block Device ROD Token Limits.
    let r = cmd(&s, 0, &[0x12, 1, 0x8f, 4, 0, 0], vec![], 1024).await;
    assert_eq!(r.status, 0);
    assert_eq!(&r.data_in[4..8], &[0, 0, 0, 0x20]);

    // POPULATE TOKEN on the source, the token through RECEIVE ROD TOKEN INFORMATION.
    let mut p = vec![0u8; 16];
    p[0..2].copy_from_slice(&(14u16 + 16).to_be_bytes());
    p[15] = 16;
    p.extend_from_slice(&range(0, BLOCKS as u32));
    let r = cmd(&s, 1, &token_cdb(0x10, 7, p.len()), p, 0).await;
    assert_eq!(r.status, 0, "POPULATE TOKEN: {:?}", r.sense);
    let mut c = vec![0u8; 16];
    c[0] = 0x84;
    c[1] = 0x07;
    c[2..6].copy_from_slice(&7u32.to_be_bytes());
    c[10..14].copy_from_slice(&1024u32.to_be_bytes());
    let r = cmd(&s, 1, &c, vec![], 1024).await;
    assert_eq!(r.status, 0);
    assert_eq!(r.data_in[5], 0x01, "completed");
    let at = 32 + r.data_in[13] as usize + 6;
    let token = r.data_in[at..at + 512].to_vec();

    // WRITE USING TOKEN onto the cached RAID 5 LUN: it then reads as the source.
    let (c, p) = write_using_token(&token, 0, BLOCKS as u32, 8);
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
    let (c, p) = write_using_token(&zero, 100, 5000, 9);
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
    let (c, p) = write_using_token(&bad, 0, 8, 10);
    let r = cmd(&s, 0, &c, p, 0).await;
    let sense = r.sense.as_deref().and_then(initiator::parse_sense).unwrap();
    assert_eq!((sense.key, sense.asc, sense.ascq), (5, 0x23, 0x05));
}
