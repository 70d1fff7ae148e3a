//! copyrate: what a copy offload costs and gains, in process (issue 19). Two LUs
//! of one target on files (`--dir`, default /dev/shm), the source filled, are
//! copied `--mib` at a time three ways, interleaved, `--runs` times:
//! - EXTENDED COPY as ESXi sends it (`--cmd-mib` per command, `--depth` in
//!   flight), recorded beside the destination's state file (`--state-dir`,
//!   default under /var/tmp, where /var/lib/freesan would be) as shipped;
//! - the same commands with the LUs given no state file, so nothing is recorded
//!   and no flush ends a command: the record's cost is the difference;
//! - Windows' ODX the same way: POPULATE TOKEN of the source range, RECEIVE ROD
//!   TOKEN INFORMATION, WRITE USING TOKEN (recorded as shipped);
//! - the copy a host does without offload: READ then WRITE of the same sizes
//!   through the same target (the bytes cross no network here, so this is the
//!   host copy's floor, not what a host would see).
//!
//! With `--dst raid5` the destination is a RAID 5 pool of five simulated 7200
//! rpm HDDs (NCQ on) instead of a file, both LUs of 4 KiB blocks: a clone onto
//! the capacity tier, where the flush that ends a recorded copy reaches disks.
//!
//! The destination is checked against the source after every copy. Prints MB/s
//! per mode (median of the runs) and the record's cost per command.
//!
//! Usage: cargo run --release -p freesan --example copyrate -- [--mib 1024]
//! [--cmd-mib 4] [--depth 1,4] [--runs 3] [--dir /dev/shm] [--state-dir DIR]
//! [--dst file|raid5]
use block::{Bytes, VolumeRef};
use disk::{FileOptions, FileVolume};
use scsi::{Command, ItNexus, LunConfig, ScsiTarget, TargetConfig, TaskAttr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

struct Opts {
    /// The LUs' block size: 512, or 4096 with a pool destination.
    block: u64,
    raid5: bool,
    mib: u64,
    cmd_mib: u64,
    depths: Vec<usize>,
    runs: usize,
    dir: PathBuf,
    state_dir: Option<PathBuf>,
}

fn opts() -> Opts {
    let mut o = Opts {
        block: 512,
        raid5: false,
        mib: 1024,
        cmd_mib: 4,
        depths: vec![1, 4],
        runs: 3,
        dir: PathBuf::from("/dev/shm"),
        state_dir: None,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let v = args
            .next()
            .unwrap_or_else(|| panic!("{a} needs a value (see the file's head)"));
        match a.as_str() {
            "--mib" => o.mib = v.parse().expect("--mib"),
            "--cmd-mib" => o.cmd_mib = v.parse().expect("--cmd-mib"),
            "--depth" => o.depths = v.split(',').map(|d| d.parse().expect("--depth")).collect(),
            "--runs" => o.runs = v.parse().expect("--runs"),
            "--dir" => o.dir = v.into(),
            "--state-dir" => o.state_dir = Some(v.into()),
            "--dst" if v == "raid5" => {
                o.raid5 = true;
                o.block = 4096;
            }
            "--dst" if v == "file" => {}
            _ => panic!("unknown option {a} (see the file's head)"),
        }
    }
    assert!(
        o.cmd_mib >= 1 && o.cmd_mib * (1 << 20) / o.block <= 65535,
        "--cmd-mib: 1 to 31 (one segment descriptor a command)"
    );
    o
}

/// The NAA of LUN `lun` (0: the destination, 1: the source).
fn naa(lun: u8) -> [u8; 16] {
    [0x60, 0x0f, 0x5e, 0xa2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, lun]
}

fn lun(naa_last: u8, state: Option<PathBuf>) -> LunConfig {
    LunConfig {
        naa: naa(naa_last),
        serial: format!("CR{naa_last:04}"),
        vendor: "FREESAN".into(),
        product: "copyrate".into(),
        revision: "0001".into(),
        read_only: false,
        state_file: state,
        physical_block_exponent: 0,
        sanitize_rate_bytes_per_s: 0,
    }
}

fn volume(path: &Path, bytes: u64, block: u64) -> VolumeRef {
    let _ = std::fs::remove_file(path);
    let o = FileOptions {
        create_size_bytes: Some(bytes),
        block_size_bytes: block as u32,
        ..FileOptions::default()
    };
    Arc::new(FileVolume::open(path, &o).expect("the LU's file"))
}

/// A RAID 5 pool of five simulated HDDs (NCQ on) holding at least `bytes`.
async fn raid5(bytes: u64) -> VolumeRef {
    use raid::{Member, Pool, PoolConfig, RaidLevel};
    let cfg: disk::sim::SimDiskConfig = toml::from_str("model = \"hdd\"\nncq = true").unwrap();
    let member_bytes = bytes / 4 + (256 << 20);
    let members = (0..5)
        .map(|i| {
            let store = Arc::new(block::MemVolume::new(4096, member_bytes / 4096)) as VolumeRef;
            let sim = disk::SimDisk::from_config(store, &cfg).expect("a simulated HDD");
            Member::new(format!("m{i}"), Arc::new(sim) as VolumeRef)
        })
        .collect();
    let mut pc = PoolConfig::new("copyrate", RaidLevel::Raid5);
    pc.rebuild_rate_mb_s = 0;
    let pool = Pool::create(pc, members, vec![]).await.expect("the pool");
    pool.wait_idle().await;
    Arc::new(pool)
}

fn command(lun: u64, cdb: &[u8], data: Vec<u8>, data_in: u32) -> Command {
    Command {
        cdb: Bytes::copy_from_slice(cdb),
        lun,
        data_out: data.into(),
        data_in_len_max: data_in,
        attr: TaskAttr::Simple,
    }
}

fn rw16(op: u8, lba: u64, blocks: u32) -> [u8; 16] {
    let mut c = [0u8; 16];
    c[0] = op;
    c[2..10].copy_from_slice(&lba.to_be_bytes());
    c[10..14].copy_from_slice(&blocks.to_be_bytes());
    c
}

#[derive(Clone, Copy, PartialEq)]
enum Mode {
    Recorded,
    Unrecorded,
    Odx,
    Host,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Recorded => "EXTENDED COPY (recorded, as shipped)",
            Mode::Unrecorded => "EXTENDED COPY (no record)",
            Mode::Odx => "ODX token copy (recorded, as shipped)",
            Mode::Host => "host copy (READ + WRITE)",
        }
    }
}

/// Copies the whole region, `depth` commands in flight; returns the seconds.
async fn copy(t: Arc<ScsiTarget>, n: &ItNexus, mode: Mode, o: &Opts, depth: usize) -> f64 {
    let block = o.block;
    let blocks = o.cmd_mib * (1 << 20) / block;
    let commands = o.mib / o.cmd_mib;
    let next = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let start = Instant::now();
    let mut workers = tokio::task::JoinSet::new();
    for w in 0..depth {
        let (t, n, next) = (t.clone(), n.clone(), next.clone());
        workers.spawn(async move {
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if i >= commands {
                    return;
                }
                let lba = i * blocks;
                let r = match mode {
                    Mode::Host => {
                        let r = t
                            .execute(
                                &n,
                                command(1, &rw16(0x88, lba, blocks as u32), vec![], u32::MAX),
                            )
                            .await;
                        assert_eq!(r.status, 0, "READ: {:?}", r.sense);
                        let data = r.data_in.to_vec();
                        t.execute(&n, command(0, &rw16(0x8a, lba, blocks as u32), data, 0))
                            .await
                    }
                    Mode::Odx => {
                        use initiator::offload as o;
                        let list = w as u32 + 1;
                        let (c, p) = o::populate_token(lba, blocks as u32, list);
                        let r = t.execute(&n, command(1, &c, p, 0)).await;
                        assert_eq!(r.status, 0, "POPULATE TOKEN: {:?}", r.sense);
                        let c = o::receive_rod_token_information(list);
                        let r = t.execute(&n, command(1, &c, vec![], 1024)).await;
                        assert_eq!(r.status, 0, "RECEIVE ROD TOKEN INFORMATION: {:?}", r.sense);
                        let token = o::token_of(&r.data_in);
                        let (c, p) = o::write_using_token(&token, lba, blocks as u32, list);
                        t.execute(&n, command(0, &c, p, 0)).await
                    }
                    _ => {
                        let list = (w % 250) as u8;
                        let (c, p) = initiator::offload::extended_copy(
                            naa(1),
                            naa(0),
                            block as u32,
                            &[(lba, lba, blocks as u16)],
                            list,
                        );
                        t.execute(&n, command(0, &c, p, 0)).await
                    }
                };
                assert_eq!(r.status, 0, "{}: {:?}", mode.name(), r.sense);
            }
        });
    }
    while let Some(r) = workers.join_next().await {
        r.expect("a copy worker");
    }
    start.elapsed().as_secs_f64()
}

/// The largest transfer the volume takes, in bytes (at most 16 MiB).
fn chunk_bytes(v: &VolumeRef) -> u64 {
    let g = v.geometry();
    (u64::from(g.max_io_blocks) * u64::from(g.block_size_bytes)).min(16 << 20)
}

async fn same(a: &VolumeRef, b: &VolumeRef, bytes: u64) -> bool {
    let chunk = chunk_bytes(a).min(chunk_bytes(b));
    let bs = u64::from(a.geometry().block_size_bytes);
    let mut at = 0;
    while at < bytes {
        let n = chunk.min(bytes - at);
        let (x, y) = (
            a.read(at / bs, (n / bs) as u32).await.expect("read"),
            b.read(at / bs, (n / bs) as u32).await.expect("read"),
        );
        if x != y {
            return false;
        }
        at += n;
    }
    true
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let o = opts();
    let bytes = o.mib << 20;
    let tmp = tempfile::Builder::new()
        .prefix("copyrate-")
        .tempdir_in(o.state_dir.clone().unwrap_or_else(|| "/var/tmp".into()))
        .expect("the state directory");
    let (dst_path, src_path) = (
        o.dir.join("copyrate-dst.img"),
        o.dir.join("copyrate-src.img"),
    );
    let src = volume(&src_path, bytes, o.block);
    let dst = if o.raid5 {
        raid5(bytes).await
    } else {
        volume(&dst_path, bytes, o.block)
    };
    // the source: every 4 KiB different, so a misplaced block shows
    let chunk = chunk_bytes(&src);
    for at in (0..bytes).step_by(chunk as usize) {
        let data: Vec<u8> = (0..chunk.min(bytes - at) / 8)
            .flat_map(|i| ((at / 4096) ^ (i * 8 / 4096) ^ 0x5eed).to_le_bytes())
            .collect();
        src.write(at / o.block, data.into(), false)
            .await
            .expect("fill");
    }
    let target = |state: bool| {
        let f = |name: &str| state.then(|| tmp.path().join(name));
        Arc::new(
            ScsiTarget::new(TargetConfig::one_port_group(
                "iqn.2026-12.org.freesan:copyrate",
                1,
                vec![
                    (0, lun(0, f("lun0.pr.json")), dst.clone()),
                    (1, lun(1, f("lun1.pr.json")), src.clone()),
                ],
            ))
            .expect("the target"),
        )
    };
    let n = ItNexus {
        initiator_name: Arc::from("iqn.2026-12.test:copyrate"),
        initiator_port: Arc::from("iqn.2026-12.test:copyrate,i,0x000000000001"),
        relative_port_id: 1,
        chap_user: None,
    };
    println!(
        "copyrate: {} MiB between two LUs ({}), {} MiB a command, records in {}, {} runs",
        o.mib,
        if o.raid5 {
            format!(
                "a file in {} onto RAID 5 of 5 simulated HDDs",
                o.dir.display()
            )
        } else {
            format!("files in {}", o.dir.display())
        },
        o.cmd_mib,
        tmp.path().display(),
        o.runs
    );
    let modes = [Mode::Recorded, Mode::Unrecorded, Mode::Odx, Mode::Host];
    for &depth in &o.depths {
        let mut secs: Vec<Vec<f64>> = vec![Vec::new(); modes.len()];
        for _ in 0..o.runs {
            for (m, &mode) in modes.iter().enumerate() {
                // a fresh target each time: its POWER ON unit attention first
                let t = target(mode != Mode::Unrecorded);
                for l in 0..2 {
                    t.execute(&n, command(l, &[0u8; 6], vec![], 0)).await;
                }
                // the destination starts different from the source each time
                dst.write(
                    0,
                    vec![0u8; chunk_bytes(&dst).min(bytes) as usize].into(),
                    false,
                )
                .await
                .expect("reset");
                secs[m].push(copy(t, &n, mode, &o, depth).await);
                assert!(
                    same(&src, &dst, bytes).await,
                    "{}: the destination differs from the source",
                    mode.name()
                );
            }
        }
        let commands = (o.mib / o.cmd_mib) as f64;
        let med: Vec<f64> = secs.into_iter().map(median).collect();
        println!("depth {depth}:");
        for (m, mode) in modes.iter().enumerate() {
            println!(
                "  {:40} {:8.0} MB/s  ({:.3} s, {:.2} ms a command)",
                mode.name(),
                bytes as f64 / 1e6 / med[m],
                med[m],
                med[m] * 1e3 / commands * depth as f64
            );
        }
        println!(
            "  recorded / no record {:.2}; the record's cost: {:.2} ms a command; recorded / host copy {:.2}; ODX / host copy {:.2}",
            med[1] / med[0],
            (med[0] - med[1]) * 1e3 / commands * depth as f64,
            med[3] / med[0],
            med[3] / med[2]
        );
    }
    let _ = std::fs::remove_file(&dst_path);
    let _ = std::fs::remove_file(&src_path);
}
