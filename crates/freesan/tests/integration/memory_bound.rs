//! The node-wide bound on buffered data (`[limits] buffer_memory_max`), with a
//! real node: clients that queue deep runs of large reads over iSCSI and NBD and
//! never read the answers make the node stop reading from them (TCP pushes back)
//! instead of growing. The node's resident memory stays under its baseline plus
//! the bound plus a stated slack while they are stuck, `freesan status` shows the
//! budget full and readers waiting, and a legitimate client does verified I/O
//! once they are gone, or, over iSCSI, while they still hold their sockets
//! (a connection that takes none of its data for `nop_in_timeout_ms` is dropped
//! and gives its buffers back).
//!
//! `FREESAN_TEST_BUFFER_MEMORY_MAX=1T` configures the node of the first test
//! with no effective bound (the test still holds it to 64 MiB): it then grows
//! by about the whole 1.5 GiB the clients ask for and the test fails.

use crate::common;
use block::Volume;
use common::*;
use serde_json::Value;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;
/// The bound the first test sets and holds the node to.
const BOUND_BYTES: u64 = 64 * MIB;
/// Memory the node may use beyond its baseline and the bound while clients are
/// stuck: every iSCSI connection's 512 KiB receive buffer, tasks and queues of
/// a few hundred waiting requests, and the allocator's free lists (freed 1 MiB
/// buffers stay in the heap of the thread that freed them).
const SLACK_BYTES: u64 = 64 * MIB;
/// Size of every stuck read.
const READ_BYTES: u32 = 1 << 20;

/// `data_dir`, API, one portal, NBD, a sparse 256 MiB file as LUN 0 (its data
/// lives in the page cache, not in the node's resident memory), and `limits`.
fn config(dir: &Path, limits: &str) -> PathBuf {
    let s = format!(
        "data_dir = \"{d}/data\"\n[api]\naddress = \"127.0.0.1:0\"\n[[portal]]\naddress = \"127.0.0.1:0\"\n\
         [nbd]\naddress = \"127.0.0.1:0\"\n[limits]\n{limits}\n\
         [[target]]\niqn = \"{IQN}\"\n[[target.lun]]\npath = \"{d}/lun0.img\"\nsize = \"256M\"\n",
        d = dir.display()
    );
    let path = dir.join("node.toml");
    std::fs::write(&path, s).unwrap();
    path
}

/// A node started with [`config`]`(dir, limits)`: the node, its process id,
/// and its API address with its data directory (for `freesan status`).
fn started(dir: &Path, limits: &str) -> (Node, u32, (String, PathBuf)) {
    let cfg = config(dir, limits);
    let node = start_config(dir, &cfg);
    let pid = node.child.as_ref().unwrap().id();
    let api = (node.api.clone().expect("api address"), dir.join("data"));
    (node, pid, api)
}

/// A `kB` field of /proc/PID/status, in bytes.
fn proc_status_bytes(pid: u32, field: &str) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("node process gone");
    s.lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"))
        * 1024
}

fn rss(pid: u32) -> u64 {
    proc_status_bytes(pid, "VmRSS:")
}

fn peak_rss(pid: u32) -> u64 {
    proc_status_bytes(pid, "VmHWM:")
}

/// The node's `buffer_memory` status, as `freesan status --json` shows it
/// (`api` is the node's API address and its data folder, whose token is used).
fn buffers(api: &(String, PathBuf)) -> Value {
    let data = api.1.to_str().expect("utf-8 path");
    let (ok, out) = freesan(&["status", "--api", &api.0, "--data-dir", data, "--json"]);
    assert!(ok, "freesan status: {out}");
    let v: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    v["buffer_memory"].clone()
}

fn n(v: &Value, k: &str) -> u64 {
    v[k].as_u64()
        .unwrap_or_else(|| panic!("no {k} in buffer status {v}"))
}

/// Acquires that waited at any level: the node's, a source's, a session's.
fn all_waits(b: &Value) -> u64 {
    n(b, "waits") + n(b, "source_waits") + n(b, "session_waits")
}

fn mib(b: u64) -> f64 {
    b as f64 / MIB as f64
}

fn put_u32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_be_bytes());
}

fn get_u32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes(b[at..at + 4].try_into().unwrap())
}

/// An iSCSI session of our own making (no initiator library): it logs in, then
/// only writes.
struct RawIscsi {
    sock: TcpStream,
    cmd_sn: u32,
    exp_stat_sn: u32,
    itt: u32,
}

impl RawIscsi {
    /// Logs in to the harness target from `source` in one operational-stage
    /// step.
    fn login(source: &str, addr: &str, n: u8) -> RawIscsi {
        let mut sock = connect_from(source, addr);
        sock.set_nodelay(true).unwrap();
        sock.set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        let text = format!(
            "InitiatorName=iqn.2026-01.org.test:stuck{n}\0TargetName={IQN}\0SessionType=Normal\0\
             HeaderDigest=None\0DataDigest=None\0MaxRecvDataSegmentLength=262144\0\
             ImmediateData=Yes\0InitialR2T=No\0MaxBurstLength=1048576\0FirstBurstLength=262144\0"
        );
        let mut h = [0u8; 48];
        h[0] = 0x40 | 0x03; // immediate Login Request
        h[1] = 0x80 | (1 << 2) | 3; // transit from operational to full feature
        h[5..8].copy_from_slice(&(text.len() as u32).to_be_bytes()[1..]);
        h[8..14].copy_from_slice(&[0x80, 0x00, 0x00, 0x77, 0x00, n]); // ISID, one per session
        put_u32(&mut h, 16, 1); // ITT
        put_u32(&mut h, 24, 1); // CmdSN
        let mut wire = h.to_vec();
        wire.extend_from_slice(text.as_bytes());
        wire.resize(wire.len().div_ceil(4) * 4, 0);
        sock.write_all(&wire).unwrap();
        let (r, _) = Self::recv(&mut sock);
        assert_eq!(r[0] & 0x3f, 0x23, "not a login response");
        assert_eq!((r[36], r[37]), (0, 0), "login refused");
        RawIscsi {
            sock,
            cmd_sn: get_u32(&r, 28),
            exp_stat_sn: get_u32(&r, 24).wrapping_add(1),
            itt: 0x100,
        }
    }

    /// One PDU: header and data segment.
    fn recv(sock: &mut TcpStream) -> ([u8; 48], Vec<u8>) {
        let mut h = [0u8; 48];
        sock.read_exact(&mut h).expect("PDU header");
        let len = u32::from_be_bytes([0, h[5], h[6], h[7]]) as usize;
        let mut data = vec![0u8; len.div_ceil(4) * 4];
        sock.read_exact(&mut data).expect("PDU data");
        data.truncate(len);
        (h, data)
    }

    /// A SCSI command PDU reading `edtl` bytes with `cdb`.
    fn read_command(&mut self, cdb: &[u8], edtl: u32) -> [u8; 48] {
        let mut h = [0u8; 48];
        h[0] = 0x01;
        h[1] = 0x80 | 0x40 | 0x01; // final, read, simple
        self.itt += 1;
        put_u32(&mut h, 16, self.itt);
        put_u32(&mut h, 20, edtl);
        put_u32(&mut h, 24, self.cmd_sn);
        put_u32(&mut h, 28, self.exp_stat_sn);
        h[32..32 + cdb.len()].copy_from_slice(cdb);
        self.cmd_sn = self.cmd_sn.wrapping_add(1);
        h
    }

    /// READ CAPACITY(10): the LUN's block size (after the unit attention every
    /// new session's first command gets).
    fn block_size(&mut self) -> u32 {
        for _ in 0..4 {
            let h = self.read_command(&[0x25, 0, 0, 0, 0, 0, 0, 0, 0, 0], 8);
            self.sock.write_all(&h).unwrap();
            loop {
                let (r, data) = Self::recv(&mut self.sock);
                match r[0] & 0x3f {
                    // Data-In carrying the 8 bytes and the status
                    0x25 if data.len() == 8 => {
                        self.exp_stat_sn = get_u32(&r, 24).wrapping_add(1);
                        return get_u32(&data, 4);
                    }
                    // SCSI Response: CHECK CONDITION; ask again
                    0x21 => {
                        self.exp_stat_sn = get_u32(&r, 24).wrapping_add(1);
                        break;
                    }
                    // NOP-In pings and anything else
                    _ => {}
                }
            }
        }
        panic!("READ CAPACITY failed four times");
    }

    /// Queues `count` reads of `READ_BYTES` (READ(10)) and returns without
    /// reading anything back.
    fn queue_reads(&mut self, count: u32, block_size: u32, first_lba: u32) {
        let blocks = READ_BYTES / block_size;
        let mut wire = Vec::with_capacity(48 * count as usize);
        for i in 0..count {
            let lba = first_lba + i * blocks;
            let mut cdb = [0u8; 10];
            cdb[0] = 0x28;
            cdb[2..6].copy_from_slice(&lba.to_be_bytes());
            cdb[7..9].copy_from_slice(&(blocks as u16).to_be_bytes());
            wire.extend_from_slice(&self.read_command(&cdb, READ_BYTES));
        }
        self.sock.write_all(&wire).unwrap();
    }
}

/// A TCP connection to `addr` from the loopback address `source` (the node
/// keys its per-source bounds by address).
fn connect_from(source: &str, addr: &str) -> TcpStream {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()
        .unwrap();
    let s = rt.block_on(async {
        let s = tokio::net::TcpSocket::new_v4().unwrap();
        s.bind(format!("{source}:0").parse().unwrap()).unwrap();
        s.connect(addr.parse().unwrap()).await.expect("connect")
    });
    let s = s.into_std().unwrap();
    s.set_nonblocking(false).unwrap();
    s
}

/// Sessions from `source` logged in with ISID numbers `isids`, each with 64
/// reads of `READ_BYTES` queued that it will never take back.
fn stuck_sessions(source: &str, portal: &str, isids: std::ops::Range<u8>) -> Vec<RawIscsi> {
    let mut stuck: Vec<RawIscsi> = isids.map(|i| RawIscsi::login(source, portal, i)).collect();
    let bs = stuck[0].block_size();
    for s in stuck.iter_mut() {
        s.queue_reads(64, bs, 0);
    }
    stuck
}

/// An NBD connection to `lun0` from `source` that queues `count` reads of
/// `READ_BYTES` and reads nothing back (fixed newstyle, NBD_OPT_EXPORT_NAME).
fn nbd_stuck(source: &str, addr: &str, count: u32) -> TcpStream {
    let mut s = nbd_connect(source, addr);
    let mut wire = Vec::new();
    for i in 0..count as u64 {
        wire.extend_from_slice(&0x2560_9513u32.to_be_bytes());
        wire.extend_from_slice(&0u16.to_be_bytes()); // flags
        wire.extend_from_slice(&0u16.to_be_bytes()); // NBD_CMD_READ
        wire.extend_from_slice(&i.to_be_bytes()); // cookie
        wire.extend_from_slice(&(i * READ_BYTES as u64).to_be_bytes());
        wire.extend_from_slice(&READ_BYTES.to_be_bytes());
    }
    s.write_all(&wire).unwrap();
    s
}

/// An NBD connection to `lun0` sending `count` writes of `READ_BYTES` from a
/// thread of its own (the node may stop reading them), reading nothing back.
fn nbd_writer(addr: &str, count: u32) -> TcpStream {
    let s = nbd_connect("127.0.0.1", addr);
    let mut w = s.try_clone().unwrap();
    std::thread::spawn(move || {
        for i in 0..count as u64 {
            let mut h = Vec::new();
            h.extend_from_slice(&0x2560_9513u32.to_be_bytes());
            h.extend_from_slice(&0u16.to_be_bytes()); // flags
            h.extend_from_slice(&1u16.to_be_bytes()); // NBD_CMD_WRITE
            h.extend_from_slice(&(1000 + i).to_be_bytes()); // cookie
            h.extend_from_slice(&(i * READ_BYTES as u64).to_be_bytes());
            h.extend_from_slice(&READ_BYTES.to_be_bytes());
            h.extend(std::iter::repeat_n(0xC3u8, READ_BYTES as usize));
            // the connection is closed by the test: the thread ends
            if w.write_all(&h).is_err() {
                return;
            }
        }
    });
    s
}

/// The NBD handshake to `lun0` from `source` (fixed newstyle,
/// NBD_OPT_EXPORT_NAME).
fn nbd_connect(source: &str, addr: &str) -> TcpStream {
    let mut s = connect_from(source, addr);
    s.set_nodelay(true).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut greeting = [0u8; 18];
    s.read_exact(&mut greeting).unwrap();
    assert_eq!(&greeting[..16], b"NBDMAGICIHAVEOPT");
    let no_zeroes = greeting[17] & 2 != 0;
    let client_flags: u32 = 1 | if no_zeroes { 2 } else { 0 };
    let mut w = client_flags.to_be_bytes().to_vec();
    w.extend_from_slice(b"IHAVEOPT");
    w.extend_from_slice(&1u32.to_be_bytes()); // NBD_OPT_EXPORT_NAME
    w.extend_from_slice(&4u32.to_be_bytes());
    w.extend_from_slice(b"lun0");
    s.write_all(&w).unwrap();
    let mut info = vec![0u8; 10 + if no_zeroes { 0 } else { 124 }];
    s.read_exact(&mut info).expect("export info");
    s
}

/// Writes distinct blocks at several places at once, flushes, reads them back.
async fn verified_io(vol: &dyn Volume, seed: u8) {
    let bs = vol.geometry().block_size_bytes as u64;
    let chunk = 256 * 1024u64;
    let data = |i: u64| -> block::Bytes {
        (0..chunk)
            .map(|j| (j as u8).wrapping_mul(31) ^ (i as u8).wrapping_add(seed))
            .collect::<Vec<u8>>()
            .into()
    };
    let lba = |i: u64| i * 7 * MIB / bs;
    let writes: Vec<block::BoxFut<'_, block::BlockResult<()>>> = (0..16)
        .map(|i| Box::pin(vol.write(lba(i), data(i), false)) as block::BoxFut<'_, _>)
        .collect();
    for w in block::join_all(writes).await {
        w.expect("write");
    }
    vol.flush().await.expect("flush");
    let reads: Vec<block::BoxFut<'_, block::BlockResult<block::Bytes>>> = (0..16)
        .map(|i| Box::pin(vol.read(lba(i), (chunk / bs) as u32)) as block::BoxFut<'_, _>)
        .collect();
    for (i, r) in block::join_all(reads).await.into_iter().enumerate() {
        assert_eq!(r.expect("read"), data(i as u64), "chunk {i} reads back");
    }
}

fn iscsi_verified_io(rt: &tokio::runtime::Runtime, url: &str, seed: u8) {
    rt.block_on(async {
        let opts = initiator::OpenOptions {
            single_path: true,
            command_timeout_ms: 60_000,
            ..Default::default()
        };
        let vol = initiator::open_url(url, &opts).await.expect("iSCSI login");
        verified_io(vol.as_ref(), seed).await;
    });
}

fn nbd_verified_io(rt: &tokio::runtime::Runtime, addr: &str, seed: u8) {
    rt.block_on(async {
        let c = nbd::NbdClient::connect(addr, "lun0").await.expect("NBD");
        verified_io(&c, seed).await;
    });
}

/// Polls the node until `done(status)`; fails when `grew(rss)` first or after a minute.
fn wait_for(
    api: &(String, PathBuf),
    pid: u32,
    what: &str,
    done: impl Fn(&Value) -> bool,
    grew: impl Fn(u64) -> bool,
) -> Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let b = buffers(api);
        if done(&b) {
            return b;
        }
        let now = rss(pid);
        assert!(
            !grew(now),
            "{what}: the node grew to {:.0} MiB resident instead; buffers {b}",
            mib(now)
        );
        assert!(
            Instant::now() < deadline,
            "{what}: not within a minute; buffers {b}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn clients_that_stop_reading_cannot_grow_the_node_past_its_bound() {
    let bound = std::env::var("FREESAN_TEST_BUFFER_MEMORY_MAX").unwrap_or_else(|_| "64M".into());
    let configured = disk::parse_size(&bound).expect("a size");
    let dir = tempfile::tempdir().unwrap();
    // stuck clients are not dropped during the test (nop_in_timeout_ms); they
    // come from eight addresses, whose shares (a quarter of the bound each by
    // default) together ask for twice the bound: the node's bound is the one
    // that holds
    let limits = format!("buffer_memory_max = \"{bound}\"\nnop_in_timeout_ms = 600000");
    let (node, pid, api) = started(dir.path(), &limits);
    let nbd_addr = node.nbd.clone().expect("nbd address");
    let portal = node.portals[0].clone();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let url = node.url(0, 0);

    // warm up both frontends, then the baseline
    iscsi_verified_io(&rt, &url, 1);
    nbd_verified_io(&rt, &nbd_addr, 2);
    let b = buffers(&api);
    assert_eq!(n(&b, "max_bytes"), configured.min(4 << 40));
    let base = rss(pid);

    // 8 iSCSI sessions x 128 reads of 1 MiB and 8 NBD connections x 64 reads of
    // 1 MiB: 1.5 GiB asked for, none of it read; one of each from 127.0.0.2-9
    let source = |i: usize| format!("127.0.0.{}", 2 + i);
    let mut sessions = Vec::new();
    for i in 0..8u8 {
        sessions.push(RawIscsi::login(&source(i.into()), &portal, i));
    }
    let bs = sessions[0].block_size();
    for (i, s) in sessions.iter_mut().enumerate() {
        s.queue_reads(128, bs, (i as u32 % 2) * 128 * (READ_BYTES / bs));
    }
    let mut nbds = Vec::new();
    for i in 0..8 {
        nbds.push(nbd_stuck(&source(i), &nbd_addr, 64));
    }
    let limit = base + BOUND_BYTES + SLACK_BYTES;
    let full = wait_for(
        &api,
        pid,
        "the budget full with readers waiting",
        |b| n(b, "waits") > 0 && n(b, "held_bytes") + MIB >= n(b, "max_bytes"),
        |now| now > limit,
    );
    let (now, peak) = (rss(pid), peak_rss(pid));
    eprintln!(
        "stuck: resident {:.0} MiB, peak {:.0} MiB, baseline {:.0} MiB, bound {:.0} MiB; buffers {full}",
        mib(now),
        mib(peak),
        mib(base),
        mib(configured)
    );
    assert!(
        peak <= limit,
        "peak resident {:.0} MiB above baseline {:.0} + bound {:.0} + slack {:.0} MiB",
        mib(peak),
        mib(base),
        mib(BOUND_BYTES),
        mib(SLACK_BYTES)
    );
    assert_eq!(
        n(&full, "high_water_bytes"),
        n(&full, "max_bytes"),
        "never above the bound"
    );
    // writers arriving now (from 127.0.0.1, whose share is free): their
    // payloads wait for the node's budget before they are read from the
    // socket (they used to be read and counted beyond the bound)
    let waits = n(&full, "waits");
    let mut writers = Vec::new();
    for _ in 0..4 {
        writers.push(nbd_writer(&nbd_addr, 16));
    }
    let full = wait_for(
        &api,
        pid,
        "the writers waiting for the budget",
        |b| n(b, "waits") >= waits + 4,
        |now| now > limit,
    );
    assert_eq!(
        n(&full, "high_water_bytes"),
        n(&full, "max_bytes"),
        "write payloads taken beyond the bound: {full}"
    );
    assert!(
        peak_rss(pid) <= limit,
        "peak resident above the bound with writers"
    );

    // the stuck clients go away: every byte comes back, and verified I/O works
    drop(sessions);
    drop(nbds);
    for w in &writers {
        let _ = w.shutdown(std::net::Shutdown::Both);
    }
    drop(writers);
    wait_for(
        &api,
        pid,
        "every buffer given back",
        |b| n(b, "held_bytes") == 0,
        |now| now > limit,
    );
    iscsi_verified_io(&rt, &url, 3);
    nbd_verified_io(&rt, &nbd_addr, 4);
    let after = peak_rss(pid);
    eprintln!(
        "after: resident {:.0} MiB, peak {:.0} MiB; buffers {}",
        mib(rss(pid)),
        mib(after),
        buffers(&api)
    );
    assert!(
        after <= limit,
        "no growth afterwards either: peak {:.0} MiB",
        mib(after)
    );
}

#[test]
fn an_initiator_that_stops_reading_is_dropped_and_others_go_on() {
    let dir = tempfile::tempdir().unwrap();
    let (node, pid, api) = started(
        dir.path(),
        "buffer_memory_max = \"16M\"\nnop_in_timeout_ms = 2000",
    );
    let portal = node.portals[0].clone();
    let rt = tokio::runtime::Runtime::new().unwrap();

    // four sessions x 64 reads of 1 MiB, never read, sockets kept open
    let mut stuck = stuck_sessions("127.0.0.1", &portal, 40..44);
    wait_for(
        &api,
        pid,
        "the budget full with readers waiting",
        |b| all_waits(b) > 0 && n(b, "held_bytes") + MIB >= n(b, "max_bytes"),
        |_| false,
    );
    // a legitimate initiator, while the stuck ones still hold their sockets:
    // its commands wait for the budget until the stuck connections are dropped
    iscsi_verified_io(&rt, &node.url(0, 0), 5);
    let log = std::fs::read_to_string(&node.log).unwrap();
    assert!(
        log.contains("initiator stopped reading; dropping the connection"),
        "the stuck initiators were not dropped: {log}"
    );
    // the stuck sockets were closed by the node
    for s in stuck.iter_mut() {
        s.sock
            .set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        let mut sink = vec![0u8; 1 << 20];
        loop {
            match s.sock.read(&mut sink) {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
        }
    }
    wait_for(
        &api,
        pid,
        "every buffer given back",
        |b| n(b, "held_bytes") == 0,
        |_| false,
    );
}

/// `[limits] session_buffer_max` and `source_buffer_max`: clients that queue
/// far more reads than they take back, and keep their sockets (nothing drops
/// them here), each hold at most their session's share of the node's budget,
/// and the sessions of one address (iSCSI or NBD) at most that address's
/// share together; the rest stays free, so a legitimate initiator and NBD
/// client do verified I/O at once, and none of their requests waits for the
/// node's budget. Without the source's share, one host with several sessions
/// held a share per session.
#[test]
fn sessions_and_sources_that_stop_reading_hold_only_their_shares() {
    const SHARE: u64 = 32 * MIB;
    const SOURCE: u64 = 48 * MIB;
    let dir = tempfile::tempdir().unwrap();
    let (node, pid, api) = started(
        dir.path(),
        "buffer_memory_max = \"192M\"\nsession_buffer_max = \"32M\"\n\
         source_buffer_max = \"48M\"\nnop_in_timeout_ms = 600000",
    );
    let nbd_addr = node.nbd.clone().expect("nbd address");
    let portal = node.portals[0].clone();
    let rt = tokio::runtime::Runtime::new().unwrap();

    // each client asks for 64 MiB of reads and reads none of it:
    // 127.0.0.2 an iSCSI session and an NBD connection, 127.0.0.3 two iSCSI
    // sessions (their address's share binds), 127.0.0.4 one iSCSI session
    // (its session's share binds)
    let mut stuck = stuck_sessions("127.0.0.2", &portal, 60..61);
    let nbd = nbd_stuck("127.0.0.2", &nbd_addr, 64);
    stuck.extend(stuck_sessions("127.0.0.3", &portal, 61..63));
    stuck.extend(stuck_sessions("127.0.0.4", &portal, 63..64));
    let full = wait_for(
        &api,
        pid,
        "every client at its share",
        |b| {
            n(b, "source_waits") >= 2
                && n(b, "session_waits") >= 1
                && n(b, "held_bytes") == 2 * SOURCE + SHARE
        },
        |_| false,
    );
    eprintln!("stuck: buffers {full}");
    assert_eq!(n(&full, "session_max_bytes"), SHARE);
    assert_eq!(n(&full, "source_max_bytes"), SOURCE);
    assert_eq!(n(&full, "waits"), 0, "nobody waited for the node's budget");
    assert_eq!(
        n(&full, "high_water_bytes"),
        2 * SOURCE + SHARE,
        "a client held more than its share: {full}"
    );
    let by_source: Vec<(String, u64)> = full["sources"]
        .as_array()
        .expect("sources")
        .iter()
        .map(|s| {
            (
                s["address"].as_str().unwrap().to_string(),
                n(s, "held_bytes"),
            )
        })
        .filter(|(_, held)| *held > 0)
        .collect();
    let want = [
        ("127.0.0.2", SOURCE),
        ("127.0.0.3", SOURCE),
        ("127.0.0.4", SHARE),
    ];
    let want: Vec<(String, u64)> = want.iter().map(|(a, b)| (a.to_string(), *b)).collect();
    assert_eq!(by_source, want, "{full}");
    // each iSCSI session says what it holds: at most its share, and the two
    // of 127.0.0.3 the address's share together
    let token = make_token(&api.1, "read-only", "sessions");
    let auth = format!("Authorization: Bearer {token}");
    let (code, body) = http(&api.0, "GET", "/api/v1/targets", &[&auth], "");
    assert_eq!(code, 200, "{body}");
    let targets: Value = serde_json::from_str(&body).unwrap();
    let held = |who: &str| -> u64 {
        let sessions = targets[0]["sessions"].as_array().expect("sessions");
        let s = sessions
            .iter()
            .find(|s| s["initiator"].as_str() == Some(who))
            .unwrap_or_else(|| panic!("no session of {who}: {targets}"));
        let b = n(s, "buffered_bytes");
        assert!(
            b <= SHARE,
            "{who} holds more than a session's share: {targets}"
        );
        b
    };
    let stuck_name = |i: u8| format!("iqn.2026-01.org.test:stuck{i}");
    assert_eq!(
        held(&stuck_name(61)) + held(&stuck_name(62)),
        SOURCE,
        "{targets}"
    );
    assert_eq!(held(&stuck_name(63)), SHARE, "{targets}");
    // 127.0.0.2's session and NBD connection split 48 MiB: the NBD connection
    // holds the rest, at most its share
    assert!(held(&stuck_name(60)) >= SOURCE - SHARE, "{targets}");

    // the others go on while the stuck clients still hold their sockets
    iscsi_verified_io(&rt, &node.url(0, 0), 7);
    nbd_verified_io(&rt, &nbd_addr, 8);
    let after = buffers(&api);
    assert_eq!(n(&after, "waits"), 0, "legitimate I/O waited: {after}");
    assert_eq!(n(&after, "held_bytes"), 2 * SOURCE + SHARE, "{after}");

    drop(stuck);
    drop(nbd);
    wait_for(
        &api,
        pid,
        "every buffer given back",
        |b| n(b, "held_bytes") == 0,
        |_| false,
    );
}
