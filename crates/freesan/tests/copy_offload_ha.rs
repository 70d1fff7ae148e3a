//! Copy offload at scale, through the layers that must keep it durable: 1 GiB copied
//! inside node 1 of an HA pair on loopback, from a LUN on a RAID 5 pool behind a
//! write-back SSD cache (local to node 1) onto a replicated LUN (both nodes), with
//! EXTENDED COPY (VMware's full copy) into the first GiB of the replicated LUN and
//! with ODX tokens (POPULATE TOKEN, WRITE USING TOKEN: Windows' offloaded copy)
//! into the second.
//!
//! - Both copies read back identical to the source through node 2, whose copy of
//!   the replicated LUN only ever got the data through replication.
//! - Node 1 is killed (SIGKILL) in the middle of the ODX copy: after it returns and
//!   the pair is in sync again, every destination block is either as it was
//!   (zeroes) or as the source has it, the same through either node; the source
//!   LUN lost nothing; the host's retry (with new tokens: they lived in the killed
//!   node) completes the copy; the two copies of the replicated LUN are
//!   byte-identical. (`tests/xcopy.rs` kills a node in the middle of an EXTENDED
//!   COPY onto the cached RAID 5 LUN.)

mod common;

use common::{freesan, IQN};
use serde_json::Value;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

const BS: u64 = 512;
/// Blocks of one GiB.
const GIB: u64 = 1 << 21;
/// Blocks an EXTENDED COPY segment descriptor carries (16-bit count).
const SEGMENT_BLOCKS: u64 = 32768;
/// Blocks one EXTENDED COPY command copies (16 segments).
const XCOPY_BLOCKS: u64 = 16 * SEGMENT_BLOCKS;
/// Blocks written or read per command.
const IO_BLOCKS: u64 = 2048;
const CLUSTER: &str = "copyha";

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Block `b` of the source: every block different, never zero.
fn block(b: u64) -> Vec<u8> {
    (0x5eed_0000_0000_0000u64 | b)
        .to_be_bytes()
        .repeat(BS as usize / 8)
}

struct Pair {
    dir: tempfile::TempDir,
    sync: [u16; 2],
    nodes: [Option<common::Node>; 2],
}

impl Pair {
    fn new() -> Pair {
        let dir = tempfile::tempdir().unwrap();
        let (ok, out) = freesan(&[
            "cluster",
            "init",
            "--name",
            CLUSTER,
            "--out",
            dir.path().join("keys").to_str().unwrap(),
        ]);
        assert!(ok, "cluster init: {out}");
        let mut p = Pair {
            dir,
            sync: [free_port(), free_port()],
            nodes: [None, None],
        };
        for k in 1..=2 {
            p.start(k);
        }
        p
    }

    fn node_dir(&self, k: usize) -> PathBuf {
        self.dir.path().join(format!("n{k}"))
    }

    /// Node `k`'s config: LUN 0 replicated (2 GiB file); node 1 also serves LUN 1,
    /// a RAID 5 pool of four file disks behind a write-back cache on two SSD files.
    fn config(&self, k: usize) -> PathBuf {
        let d = self.node_dir(k);
        std::fs::create_dir_all(&d).unwrap();
        let mut local = String::new();
        if k == 1 {
            for i in 0..4 {
                local += &format!(
                    "[[disk]]\nname = \"d{i}\"\nsize = \"400M\"\npath = \"{}/d{i}.img\"\n",
                    d.display()
                );
            }
            for i in 0..2 {
                local += &format!(
                    "[[disk]]\nname = \"ssd{i}\"\nsize = \"64M\"\npath = \"{}/ssd{i}.img\"\n",
                    d.display()
                );
            }
            local += "[[pool]]\nname = \"p\"\nlevel = \"raid5\"\nchunk = \"64K\"\n\
                      members = [\"d0\", \"d1\", \"d2\", \"d3\"]\n";
            local += "[[cache]]\nname = \"c\"\npool = \"p\"\nmode = \"write-back\"\n\
                      devices = [\"ssd0\", \"ssd1\"]\nsize = \"48M\"\nblock_size = \"64K\"\n";
        }
        let mut cfg = format!(
            r#"data_dir = "{d}/data"
[api]
address = "127.0.0.1:0"
[[portal]]
address = "127.0.0.1:0"
allow_without_chap = true
[cluster]
name = "{CLUSTER}"
node_id = {k}
preferred_node = 1
sync = ["127.0.0.1:{s}"]
peer_sync = ["127.0.0.1:{ps}"]
heartbeat_interval_ms = 100
peer_timeout_ms = 800
client_heartbeats = false
key_file = "{keys}/node{k}.key"
{local}[[target]]
iqn = "{IQN}"
[[target.lun]]
path = "{d}/lun0.img"
size = "2G"
replicated = true
"#,
            d = d.display(),
            s = self.sync[k - 1],
            ps = self.sync[2 - k],
            keys = self.dir.path().join("keys").display(),
        );
        if k == 1 {
            cfg += "[[target.lun]]\ncache = \"c\"\n";
        }
        let p = d.join("node.toml");
        std::fs::write(&p, cfg).unwrap();
        p
    }

    fn start(&mut self, k: usize) {
        let cfg = self.config(k);
        self.nodes[k - 1] = Some(common::Node::start(
            &[],
            &["--config".into(), cfg.display().to_string()],
            &self.node_dir(k).join("serve.log"),
        ));
    }

    fn node(&self, k: usize) -> &common::Node {
        self.nodes[k - 1].as_ref().expect("node running")
    }

    fn status(&self, k: usize) -> Option<Value> {
        let api = self.node(k).api.as_deref()?;
        let (ok, out) = freesan(&["replica", "status", "--api", api, "--json"]);
        if !ok {
            return None;
        }
        let v: Value = serde_json::from_str(&out).ok()?;
        Some(v[0].clone())
    }

    fn wait_in_sync(&self) {
        for k in 1..=2 {
            let deadline = Instant::now() + Duration::from_secs(180);
            loop {
                let s = self.status(k);
                if s.as_ref().is_some_and(|s| s["state"] == "in-sync") {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "node {k} not in sync: {s:?}\n{}",
                    std::fs::read_to_string(&self.node(k).log).unwrap_or_default()
                );
                std::thread::sleep(Duration::from_millis(200));
            }
        }
    }

    async fn session(&self, k: usize, name: &str) -> Arc<initiator::Session> {
        let addr = self.node(k).portals[0].parse().unwrap();
        let s = initiator::Session::login(
            addr,
            &initiator::LoginOptions::new(&format!("iqn.2026-11.test:{name}"), IQN),
        )
        .await
        .expect("login");
        Arc::new(s)
    }
}

async fn cmd(
    s: &initiator::Session,
    lun: u64,
    cdb: &[u8],
    out: Vec<u8>,
    din: u32,
) -> initiator::ScsiResult {
    // the first commands of a nexus meet unit attentions; a node whose replica is
    // still deciding answers NOT READY for a moment
    for _ in 0..200 {
        let r = s
            .command(lun, cdb, bytes::Bytes::from(out.clone()), din)
            .await
            .expect("command");
        let key = (r.status == 2)
            .then(|| r.sense.as_deref().and_then(initiator::parse_sense))
            .flatten()
            .map(|x| x.key);
        match key {
            Some(6) => continue,
            Some(2) => tokio::time::sleep(Duration::from_millis(50)).await,
            _ => return r,
        }
    }
    panic!("unit attentions or NOT READY without end");
}

fn rw16(op: u8, lba: u64, blocks: u64) -> [u8; 16] {
    let mut c = [0u8; 16];
    c[0] = op;
    c[2..10].copy_from_slice(&lba.to_be_bytes());
    c[10..14].copy_from_slice(&(blocks as u32).to_be_bytes());
    c
}

/// Writes the source pattern over blocks 0..GIB of `lun`, 8 commands in flight.
async fn write_source(s: &Arc<initiator::Session>, lun: u64) {
    let mut set = tokio::task::JoinSet::new();
    for first in (0..GIB).step_by(IO_BLOCKS as usize) {
        if set.len() >= 8 {
            set.join_next().await.unwrap().unwrap();
        }
        let s = s.clone();
        set.spawn(async move {
            let data: Vec<u8> = (first..first + IO_BLOCKS).flat_map(block).collect();
            let r = cmd(&s, lun, &rw16(0x8a, first, IO_BLOCKS), data, 0).await;
            assert_eq!(r.status, 0, "write at {first}: {:?}", r.sense);
        });
    }
    while let Some(r) = set.join_next().await {
        r.unwrap();
    }
}

/// Reads blocks `at..at + GIB` of `lun` and classifies each against the source's
/// block `b - at`: (as the source, zeroes). Panics on anything else.
async fn classify(s: &Arc<initiator::Session>, lun: u64, at: u64) -> (u64, u64) {
    let (mut copied, mut old) = (0, 0);
    let zero = vec![0u8; BS as usize];
    for first in (0..GIB).step_by(IO_BLOCKS as usize) {
        let r = cmd(
            s,
            lun,
            &rw16(0x88, at + first, IO_BLOCKS),
            vec![],
            (IO_BLOCKS * BS) as u32,
        )
        .await;
        assert_eq!(r.status, 0, "read at {}: {:?}", at + first, r.sense);
        for (i, have) in r.data_in.chunks(BS as usize).enumerate() {
            let b = first + i as u64;
            if have == &block(b)[..] {
                copied += 1;
            } else if have == &zero[..] {
                old += 1;
            } else {
                panic!(
                    "block {} of LUN {lun} is neither the source's nor the old content",
                    at + b
                );
            }
        }
    }
    (copied, old)
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

/// EXTENDED COPY of `XCOPY_BLOCKS` blocks from `first` of the source LU to `at +
/// first` of the destination LU, list id `list`.
fn xcopy(src: [u8; 16], dst: [u8; 16], first: u64, at: u64, list: u8) -> (Vec<u8>, Vec<u8>) {
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
    for k in 0..XCOPY_BLOCKS / SEGMENT_BLOCKS {
        let from = first + k * SEGMENT_BLOCKS;
        let mut d = [0u8; 28];
        d[0] = 0x02;
        d[3] = 24;
        d[6..8].copy_from_slice(&1u16.to_be_bytes());
        d[10..12].copy_from_slice(&(SEGMENT_BLOCKS as u16).to_be_bytes());
        d[12..20].copy_from_slice(&from.to_be_bytes());
        d[20..28].copy_from_slice(&(at + from).to_be_bytes());
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

/// Copies the source GiB of LUN 1 onto LUN 0 at block `at` with EXTENDED COPY, one
/// command per `XCOPY_BLOCKS` (sent to LUN 0).
async fn copy_xcopy(s: &initiator::Session, src: [u8; 16], dst: [u8; 16], at: u64) {
    for (i, first) in (0..GIB).step_by(XCOPY_BLOCKS as usize).enumerate() {
        let (c, p) = xcopy(src, dst, first, at, i as u8);
        let r = cmd(s, 0, &c, p, 0).await;
        assert_eq!(r.status, 0, "EXTENDED COPY at {first}: {:?}", r.sense);
    }
}

/// Blocks one ODX token represents (the node's 256 MiB bound).
const TOKEN_BLOCKS: u64 = 1 << 19;

/// POPULATE TOKEN (0x10) or WRITE USING TOKEN (0x11) with list id `list`.
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

/// POPULATE TOKEN over `first..first + TOKEN_BLOCKS` of LUN 1, and the token
/// (RECEIVE ROD TOKEN INFORMATION); None when a command failed.
async fn populate(s: &initiator::Session, first: u64, list: u32) -> Option<Vec<u8>> {
    let mut p = vec![0u8; 16];
    p[0..2].copy_from_slice(&(14u16 + 16).to_be_bytes());
    p[15] = 16;
    p.extend_from_slice(&range(first, TOKEN_BLOCKS as u32));
    let c = token_cdb(0x10, list, p.len());
    let r = s.command(1, &c, bytes::Bytes::from(p), 0).await.ok()?;
    if r.status != 0 {
        return None;
    }
    let mut c = vec![0u8; 16];
    c[0] = 0x84;
    c[1] = 0x07;
    c[2..6].copy_from_slice(&list.to_be_bytes());
    c[10..14].copy_from_slice(&1024u32.to_be_bytes());
    let r = s.command(1, &c, bytes::Bytes::new(), 1024).await.ok()?;
    if r.status != 0 || r.data_in[5] != 0x01 {
        return None;
    }
    let at = 32 + r.data_in[13] as usize + 6;
    Some(r.data_in[at..at + 512].to_vec())
}

/// WRITE USING TOKEN of `token` onto LUN 0 at `lba`; its status (None: no answer).
async fn write_using(s: &initiator::Session, token: &[u8], lba: u64, list: u32) -> Option<u8> {
    let mut p = vec![0u8; 536];
    p[0..2].copy_from_slice(&(534u16 + 16).to_be_bytes());
    p[16..528].copy_from_slice(token);
    p[535] = 16;
    p.extend_from_slice(&range(lba, TOKEN_BLOCKS as u32));
    let c = token_cdb(0x11, list, p.len());
    s.command(0, &c, bytes::Bytes::from(p), 0)
        .await
        .ok()
        .map(|r| r.status)
}

/// Copies the source GiB of LUN 1 onto LUN 0 at block `at` with ODX tokens, one
/// token per `TOKEN_BLOCKS`; false when a command failed or went unanswered.
async fn copy_odx(s: &initiator::Session, at: u64, list: u32) -> bool {
    for (i, first) in (0..GIB).step_by(TOKEN_BLOCKS as usize).enumerate() {
        let list = list + 2 * i as u32;
        let Some(token) = populate(s, first, list).await else {
            return false;
        };
        if write_using(s, &token, at + first, list + 1).await != Some(0) {
            return false;
        }
    }
    true
}

fn checksum(path: &Path) -> String {
    let (ok, out) = common::run("sha256sum", &[path.to_str().unwrap()]);
    assert!(ok, "{out}");
    out.split_whitespace().next().unwrap().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gib_copied_from_a_cached_raid5_lun_onto_a_replicated_lun_and_across_a_sigkill() {
    let mut pair = Pair::new();
    pair.wait_in_sync();
    let s1 = pair.session(1, "copy1").await;
    write_source(&s1, 1).await;
    let (src, dst) = (naa(&s1, 1).await, naa(&s1, 0).await);
    assert_ne!(src, dst);

    // EXTENDED COPY into the first GiB: node 2 reads exactly the source there
    let t = Instant::now();
    copy_xcopy(&s1, src, dst, 0).await;
    eprintln!("EXTENDED COPY of 1 GiB: {:.1} s", t.elapsed().as_secs_f64());
    let s2 = pair.session(2, "copy2").await;
    assert_eq!(classify(&s2, 0, 0).await, (GIB, 0), "through node 2");

    // ODX into the second GiB, killed in the middle of the copy
    let copying = {
        let s = pair.session(1, "copy3").await;
        for lun in [0, 1] {
            assert_eq!(cmd(&s, lun, &[0; 6], vec![], 0).await.status, 0);
        }
        tokio::spawn(async move { copy_odx(&s, GIB, 0x100).await })
    };
    // the copy has moved data once the middle of the first token's range reads as
    // the source's, polled through node 2
    let probe = GIB + TOKEN_BLOCKS / 2;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let r = cmd(&s2, 0, &rw16(0x88, probe, 1), vec![], BS as u32).await;
        if r.data_in[..] == block(probe - GIB)[..] {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the copy never reached block {probe}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    pair.nodes[0].as_mut().unwrap().kill9();
    assert!(!copying.await.unwrap(), "the copy ended before the kill");
    drop((s1, s2));
    pair.start(1);
    pair.wait_in_sync();
    let s1 = pair.session(1, "copy4").await;
    let s2 = pair.session(2, "copy5").await;
    // the unanswered commands: any mix of old and new per block, nothing else,
    // the same through both nodes
    let (copied, old) = classify(&s1, 0, GIB).await;
    assert_eq!(classify(&s2, 0, GIB).await, (copied, old));
    eprintln!("after the kill: {copied} blocks copied, {old} old");
    assert!(copied > 0, "the copy had moved data before the kill");
    // the source survived the kill of its node (its cache is write-back)
    let (copied_src, _) = classify(&s1, 1, 0).await;
    assert_eq!(copied_src, GIB, "the source LUN lost data in the kill");
    // the host retries (its tokens died with the node: new ones): the copy completes
    assert!(
        copy_odx(&s1, GIB, 0x200).await,
        "the retried ODX copy failed"
    );
    assert_eq!(
        classify(&s2, 0, GIB).await,
        (GIB, 0),
        "retried, through node 2"
    );
    assert_eq!(
        classify(&s1, 0, 0).await,
        (GIB, 0),
        "the first GiB untouched"
    );
    // the two copies of the replicated LUN are identical
    pair.wait_in_sync();
    let sums = [1, 2].map(|k| checksum(&pair.node_dir(k).join("lun0.img")));
    assert_eq!(sums[0], sums[1], "the copies of the replicated LUN differ");
}
