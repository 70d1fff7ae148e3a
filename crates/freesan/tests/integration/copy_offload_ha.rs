//! Copy offload at scale, through the layers that must keep it durable: 1 GiB copied
//! inside node 1 of an HA pair on loopback, from a LUN on a RAID 5 pool behind a
//! write-back SSD cache (local to node 1) onto a replicated LUN (both nodes), with
//! EXTENDED COPY (VMware's full copy) into the first GiB of the replicated LUN and
//! with ODX tokens (POPULATE TOKEN, WRITE USING TOKEN: Windows' offloaded copy)
//! into the second.
//!
//! - Both copies read back identical to the source through node 2, whose copy of
//!   the replicated LUN only ever got the data through replication.
//! - Node 1 is killed (SIGKILL) in the middle of the ODX copy, while node 2 keeps
//!   what the copy overwrote there (its status shows the open copy). Node 2 (not
//!   preferred, no witness) stops; when node 1 returns, node 2 undoes the
//!   unanswered command and resynchronises node 1 from its copy. So once the pair
//!   is in sync again each token's range is either all copied (its command
//!   was answered) or all as it was (zeroes), the same through either node; the
//!   source LUN lost nothing; the host's retry (with new tokens: they lived in the
//!   killed node) completes the copy; the two copies of the replicated LUN are
//!   byte-identical. (`tests/xcopy.rs` kills a node in the middle of an EXTENDED
//!   COPY onto the cached RAID 5 LUN.)

use crate::common;
use common::pair::LoopbackPair;

use common::scsi::{self, naa, past_uas as cmd};
use common::{freesan, IQN};
use serde_json::Value;
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

/// Block `b` of the source: every block different, never zero.
fn block(b: u64) -> Vec<u8> {
    (0x5eed_0000_0000_0000u64 | b)
        .to_be_bytes()
        .repeat(BS as usize / 8)
}

struct Pair {
    p: LoopbackPair,
    nodes: [Option<common::Node>; 2],
}

impl Pair {
    fn new() -> Pair {
        let mut p = Pair {
            p: LoopbackPair::new(CLUSTER),
            nodes: [None, None],
        };
        for k in 1..=2 {
            p.start(k);
        }
        p
    }

    fn node_dir(&self, k: usize) -> PathBuf {
        self.p.node_dir(k)
    }

    /// Node `k`'s config: LUN 0 replicated (2 GiB file); node 1 also serves LUN 1,
    /// a RAID 5 pool of four file disks behind a write-back cache on two SSD files.
    fn config(&self, k: usize) -> PathBuf {
        let d = self.node_dir(k);
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
        let mut cfg = self
            .p
            .head(k, self.p.sync[2 - k], "allow_without_chap = true\n");
        cfg += &local;
        cfg += &format!(
            "[[target]]\niqn = \"{IQN}\"\n[[target.lun]]\npath = \"{}/lun0.img\"\n\
             size = \"2G\"\nreplicated = true\n",
            d.display()
        );
        if k == 1 {
            cfg += "[[target.lun]]\ncache = \"c\"\n";
        }
        self.p.write_config(k, &cfg)
    }

    fn start(&mut self, k: usize) {
        let cfg = self.config(k);
        self.nodes[k - 1] = Some(self.p.start_config(k, &cfg, "serve.log"));
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
        let mut opts = initiator::LoginOptions::new(&format!("iqn.2026-11.test:{name}"), IQN);
        // one command copies 256 MiB through RAID 5, a cache and the sync link:
        // on this shared 2-core machine that may take longer than the default 15 s
        opts.command_timeout_ms = 180_000;
        let s = initiator::Session::login(addr, &opts).await.expect("login");
        Arc::new(s)
    }
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
    let per = classify_ranges(s, lun, at).await;
    per.iter().fold((0, 0), |(c, o), (pc, po)| (c + pc, o + po))
}

/// [`classify`] for each ODX token's range (`TOKEN_BLOCKS`) in turn.
async fn classify_ranges(s: &Arc<initiator::Session>, lun: u64, at: u64) -> Vec<(u64, u64)> {
    let mut per = vec![(0u64, 0u64); (GIB / TOKEN_BLOCKS) as usize];
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
            let range = &mut per[(b / TOKEN_BLOCKS) as usize];
            if have == &block(b)[..] {
                range.0 += 1;
            } else if have == &zero[..] {
                range.1 += 1;
            } else {
                panic!(
                    "block {} of LUN {lun} is neither the source's nor the old content",
                    at + b
                );
            }
        }
    }
    per
}

/// EXTENDED COPY of `XCOPY_BLOCKS` blocks from `first` of the source LU to `at +
/// first` of the destination LU, list id `list`.
fn xcopy(src: [u8; 16], dst: [u8; 16], first: u64, at: u64, list: u8) -> (Vec<u8>, Vec<u8>) {
    let segments: Vec<(u64, u64, u16)> = (0..XCOPY_BLOCKS / SEGMENT_BLOCKS)
        .map(|k| first + k * SEGMENT_BLOCKS)
        .map(|from| (from, at + from, SEGMENT_BLOCKS as u16))
        .collect();
    scsi::xcopy(src, dst, BS as u32, &segments, list)
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

/// POPULATE TOKEN over `first..first + TOKEN_BLOCKS` of LUN 1, and the token
/// (RECEIVE ROD TOKEN INFORMATION); None when a command failed.
async fn populate(s: &initiator::Session, first: u64, list: u32) -> Option<Vec<u8>> {
    let (c, p) = scsi::populate_token(first, TOKEN_BLOCKS as u32, list);
    let r = s.command(1, &c, bytes::Bytes::from(p), 0).await.ok()?;
    if r.status != 0 {
        return None;
    }
    let c = scsi::receive_rod_token_information(list);
    let r = s.command(1, &c, bytes::Bytes::new(), 1024).await.ok()?;
    (r.status == 0 && r.data_in[5] == 0x01).then(|| scsi::token_of(&r.data_in))
}

/// WRITE USING TOKEN of `token` onto LUN 0 at `lba`; its status (None: no answer).
async fn write_using(s: &initiator::Session, token: &[u8], lba: u64, list: u32) -> Option<u8> {
    let (c, p) = scsi::write_using_token(token, lba, TOKEN_BLOCKS as u32, list);
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
    // node 2 keeps what the unfinished copy overwrote there
    let open = pair.status(2).map(|s| s["partner_copies_open"].clone());
    assert_eq!(open, Some(Value::from(1)), "node 2 keeps the copy's undo");
    let api = pair.node(2).api.clone().expect("node 2's API");
    let text = common::scrape_metrics(&api, &pair.node_dir(2).join("data"));
    let gauge = common::metric_sample(&text, "freesan_replica_partner_copies_open{", "lun0");
    assert_eq!(gauge, 1.0, "the metric shows it too");
    pair.nodes[0].as_mut().unwrap().kill9();
    assert!(!copying.await.unwrap(), "the copy ended before the kill");
    drop((s1, s2));
    pair.start(1);
    pair.wait_in_sync();
    let s1 = pair.session(1, "copy4").await;
    let s2 = pair.session(2, "copy5").await;
    // the unanswered command was undone (by node 2, the resync source when node
    // 1 returned): each token's range is done (its command was answered) or as
    // it was, through both nodes
    let ranges = classify_ranges(&s1, 0, GIB).await;
    assert_eq!(classify_ranges(&s2, 0, GIB).await, ranges);
    eprintln!("after the kill, (copied, old) blocks per range: {ranges:?}");
    let done = ranges
        .iter()
        .take_while(|r| **r == (TOKEN_BLOCKS, 0))
        .count();
    assert!(
        ranges[done..].iter().all(|r| *r == (0, TOKEN_BLOCKS)),
        "a range is half copied: {ranges:?}"
    );
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
