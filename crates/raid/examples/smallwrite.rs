//! Small random writes on parity pools of simulated HDDs (issue 18): what the
//! stripe journal costs against the unprotected read-modify-write and against the
//! arithmetic limit of the disks. In-process, no network: a `Pool` over
//! `disk::sim::SimDisk` HDD members (data in memory), driven by `qd` tasks.
//!
//! Run through `bench/raid-smallwrite` (which builds it with `--profile ci`), or:
//!
//! ```text
//! cargo run --profile ci -p raid --example smallwrite -- [--secs 5] [--ncq on|off|both]
//!     [--only raid5|raid6] [--qd 32] [--member-mib 2048] [--pattern 4kw|8kw|8kmix]
//!     [--spare-copies N] [--journal-mib N] [--ride on|off]
//! ```
//!
//! `--ride off` writes the records completing data-first updates into the slots
//! set aside behind their batch (`Pool::set_completions_ride(false)`) instead of
//! with the next group commit (the default).
//!
//! `--journal-mib` sets the stripe journal's ring (`PoolConfig::journal_bytes`;
//! default: the pool's own choice, 256 MiB on members of 2 GiB or more, as on
//! any real disk; 64 MiB on members of 512 MiB to 2 GiB) on the members and on
//! the simulated SSD, which is made large enough to hold it.
//!
//! `--member-mib` (default 2048) sizes the members: their data lives in memory
//! as it is written (thin), so their size costs nothing until written. Real
//! HDDs hold thousands of times more; 2 GiB is the smallest member that gets
//! the ring a real disk gets.
//!
//! `--spare-copies` sets `Pool::set_journal_spare_copies` (default: the
//! pool's, 3) for every run of the pools journaling on their members.
//!
//! For each pool (RAID 5 of 10, RAID 6 of 6) and NCQ setting it prints, for 4K
//! random writes, 8K random writes and 8K random 67% read / 33% write at `qd` in
//! flight: IOPS with the journal as shipped (on the members, acknowledged once
//! the record is durable), the same acknowledged only after the in-place writes
//! too ("late ack", the behaviour before; `Pool::set_early_ack`), with the journal
//! bypassed (the unprotected read-modify-write; a test-only switch), with the
//! journal on a simulated SATA SSD (`Pool::create_with_journal_device`; a second
//! pool), the arithmetic limit from one
//! member disk's measured random IOPS at the same depth (n disks x IOPS / member
//! I/Os per operation: 4 per RAID 5 small write, 6 per RAID 6, 1 per read), and the
//! ratios. Next to that limit ("limit", one disk at `qd` in flight) it prints the
//! deepest queue the workload itself can give a member ("QD": `qd` requests, each
//! with at most one member I/O in flight when a read and `redundancy + 1` when a
//! small write, whose writes need what its reads returned, over the members) and
//! the arithmetic limit from one disk's IOPS at that depth ("limit@QD"; the HDD
//! model run in virtual time, interpolated between whole depths). For patterns
//! with reads it then prints their ceiling: the most any pool of these disks
//! could do at `qd` in flight, since each read waits in a member's queue like
//! every other request (the model serves the nearest first, whatever it is),
//! even with writes acknowledged at no cost and no journal (Little's law;
//! the formula is at `ceiling` below). Then, per run,
//! how deep the members' queues really ran and how busy they were (pool status
//! `members[].inflight_us` and `busy_us`), the member I/Os per operation, and the
//! member IOPS against one disk at the same depth (the "sim" column: the worst of
//! a row's runs; well under 100% means the machine was short of CPU and the
//! simulated disks fired late, so the row is low for that reason); and where the
//! time of a partial-stripe write went (pool status `write_path`, gather
//! timeouts). Last, what a start costs with the pool's ring: the pool is
//! assembled again after its runs (assemble reads every member's ring to find
//! the records to replay), against one disk reading one ring's bytes alone.

use block::{Bytes, MemVolume, Volume, VolumeRef};
use disk::sim::{run_closed_loop, HddModel, HddParams, SimDisk, SplitMix64, SsdParams, Workload};
use raid::{Member, Pool, PoolConfig, PoolStatus, RaidLevel, WritePath};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const BS: u32 = 4096;
/// Below this share of the HDD model's IOPS at their depth, a run's simulated
/// disks lost time to the machine (see the "sim" column).
const SIM_OK: f64 = 0.93;

#[derive(Clone, Copy, PartialEq)]
struct Pattern {
    name: &'static str,
    bs_bytes: u64,
    /// Percent of operations that are reads.
    read_pct: u64,
}

const PATTERNS: [Pattern; 3] = [
    Pattern {
        name: "4K random write",
        bs_bytes: 4096,
        read_pct: 0,
    },
    Pattern {
        name: "8K random write",
        bs_bytes: 8192,
        read_pct: 0,
    },
    Pattern {
        name: "8K random 67/33",
        bs_bytes: 8192,
        read_pct: 67,
    },
];

struct Args {
    secs: u64,
    ramp_secs: u64,
    ncq: Vec<bool>,
    only: Option<String>,
    qd: usize,
    member_mib: u64,
    patterns: Vec<Pattern>,
    spare_copies: Option<usize>,
    journal_mib: Option<u64>,
    ride: bool,
}

fn parse_args() -> Args {
    let mut a = Args {
        secs: 5,
        ramp_secs: 1,
        ncq: vec![true, false],
        only: None,
        qd: 32,
        member_mib: 2048,
        patterns: PATTERNS.to_vec(),
        spare_copies: None,
        journal_mib: None,
        ride: true,
    };
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    let val = |i: usize| -> String {
        argv.get(i + 1).cloned().unwrap_or_else(|| {
            eprintln!("smallwrite: {} needs a value", argv[i]);
            std::process::exit(2)
        })
    };
    while i < argv.len() {
        let num = |s: String| -> u64 {
            s.parse().unwrap_or_else(|_| {
                eprintln!("smallwrite: bad number {s}");
                std::process::exit(2)
            })
        };
        match argv[i].as_str() {
            "--secs" => a.secs = num(val(i)),
            "--ramp" => a.ramp_secs = num(val(i)),
            "--qd" => a.qd = num(val(i)) as usize,
            "--member-mib" => a.member_mib = num(val(i)),
            "--ncq" => {
                a.ncq = match val(i).as_str() {
                    "on" => vec![true],
                    "off" => vec![false],
                    _ => vec![true, false],
                }
            }
            "--only" => a.only = Some(val(i)),
            "--spare-copies" => a.spare_copies = Some(num(val(i)) as usize),
            "--journal-mib" => a.journal_mib = Some(num(val(i))),
            "--ride" => a.ride = val(i) != "off",
            "--pattern" => {
                let p = val(i);
                a.patterns = PATTERNS
                    .iter()
                    .copied()
                    .filter(|x| match p.as_str() {
                        "4kw" => x.bs_bytes == 4096,
                        "8kw" => x.bs_bytes == 8192 && x.read_pct == 0,
                        "8kmix" => x.read_pct > 0,
                        _ => true,
                    })
                    .collect();
            }
            other => {
                eprintln!("smallwrite: unknown argument {other}");
                std::process::exit(2)
            }
        }
        i += 2;
    }
    a
}

fn hdd(member_bytes: u64, ncq: bool) -> Arc<SimDisk> {
    let store = Arc::new(MemVolume::new(BS, member_bytes / BS as u64)) as VolumeRef;
    let params = HddParams {
        ncq,
        ..HddParams::default()
    };
    Arc::new(SimDisk::hdd(store, params).expect("hdd model"))
}

/// The members of a pool over `disks`, named as every pool of this bench names
/// them (assemble finds them by their superblocks, the names are for status).
fn named(disks: &[VolumeRef]) -> Vec<Member> {
    disks
        .iter()
        .enumerate()
        .map(|(i, d)| Member::new(format!("hdd{i}"), d.clone()))
        .collect()
}

/// How long one fresh simulated disk takes to read `bytes` from its start in
/// 1 MiB pieces, one at a time (a ring's read at assemble, alone).
async fn ring_read(member_bytes: u64, ncq: bool, bytes: u64) -> Duration {
    let d = hdd(member_bytes, ncq);
    let piece = (1u64 << 20) / BS as u64;
    let blocks = bytes / BS as u64;
    let t = Instant::now();
    let mut at = 0;
    while at < blocks {
        let n = piece.min(blocks - at);
        d.read(at, n as u32).await.expect("read");
        at += n;
    }
    t.elapsed()
}

/// How deep the members' queues ran during a measured window (from the pool
/// status' `inflight_us` / `busy_us`, averaged over the members).
#[derive(Clone, Copy, Default)]
struct Depth {
    /// Mean requests outstanding per member.
    mean: f64,
    /// Mean requests outstanding per member while it had any.
    busy_mean: f64,
    /// Share of the time a member had any.
    busy: f64,
    /// Requests the pool issued per member per second.
    member_iops: f64,
    /// Share of the members' completions that overtook an earlier request.
    reordered: f64,
}

fn depth(a: &PoolStatus, b: &PoolStatus, took: Duration) -> Depth {
    let us = took.as_micros().max(1) as f64;
    let n = b.members.len().max(1) as f64;
    let (mut inflight, mut busy, mut ios) = (0.0, 0.0, 0.0);
    let (mut done, mut reordered) = (0.0, 0.0);
    for (x, y) in a.members.iter().zip(&b.members) {
        done += y.completed.saturating_sub(x.completed) as f64;
        reordered += y.reordered.saturating_sub(x.reordered) as f64;
        inflight += y.inflight_us.saturating_sub(x.inflight_us) as f64;
        busy += y.busy_us.saturating_sub(x.busy_us) as f64;
        ios += (y.reads + y.writes).saturating_sub(x.reads + x.writes) as f64;
    }
    Depth {
        mean: inflight / n / us,
        busy_mean: inflight / busy.max(1.0),
        busy: busy / n / us,
        member_iops: ios / n / (us / 1e6),
        reordered: reordered / done.max(1.0),
    }
}

/// Runs `pattern` over the whole of `vol` at `qd` in flight; IOPS after the ramp,
/// and the members' queue depth in the measured window when `pool` is given.
async fn run(
    vol: Arc<dyn Volume>,
    pool: Option<&Pool>,
    p: Pattern,
    qd: usize,
    ramp: Duration,
    secs: Duration,
) -> (f64, Depth) {
    let g = vol.geometry();
    let op_blocks = p.bs_bytes / g.block_size_bytes as u64;
    let slots = g.block_count / op_blocks;
    let stop = Arc::new(AtomicBool::new(false));
    let counting = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for t in 0..qd {
        let (vol, stop, counting, done) =
            (vol.clone(), stop.clone(), counting.clone(), done.clone());
        tasks.push(tokio::spawn(async move {
            let mut rng = SplitMix64::new(0x5eed + t as u64 * 7919);
            let data = Bytes::from(vec![t as u8 ^ 0xa5; p.bs_bytes as usize]);
            while !stop.load(Ordering::Relaxed) {
                let lba = rng.below(slots) * op_blocks;
                let r = if rng.below(100) < p.read_pct {
                    vol.read(lba, op_blocks as u32).await.map(|_| ())
                } else {
                    vol.write(lba, data.clone(), false).await
                };
                r.expect("i/o");
                if counting.load(Ordering::Relaxed) {
                    done.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    tokio::time::sleep(ramp).await;
    counting.store(true, Ordering::SeqCst);
    let s0 = pool.map(|p| p.status());
    let t0 = Instant::now();
    tokio::time::sleep(secs).await;
    let n = done.load(Ordering::SeqCst);
    let took = t0.elapsed();
    let s1 = pool.map(|p| p.status());
    stop.store(true, Ordering::SeqCst);
    for t in tasks {
        t.await.expect("worker");
    }
    let d = match (s0, s1) {
        (Some(a), Some(b)) => depth(&a, &b, took),
        _ => Depth::default(),
    };
    (n as f64 / took.as_secs_f64(), d)
}

/// One member disk's random IOPS at a mean queue depth `qd` (which may be
/// fractional: interpolated between the two integer depths around it), for
/// requests of `len_bytes` over `span_bytes`, computed by running the HDD model in
/// virtual time (seeded, so free of the machine's noise; `Nominal` does the same).
fn disk_iops_at(ncq: bool, span_bytes: u64, len_bytes: u64, qd: f64) -> f64 {
    let at = |depth: u32| {
        let params = HddParams {
            ncq,
            ..HddParams::default()
        };
        let mut m = HddModel::new(params, span_bytes).expect("hdd model");
        let mut wl = Workload::random_4k(true, depth, 20_000, span_bytes);
        wl.len_bytes = len_bytes;
        run_closed_loop(&mut m, &wl).iops()
    };
    let qd = qd.max(1.0);
    let lo = qd.floor() as u32;
    let f = qd - lo as f64;
    if f == 0.0 {
        at(lo)
    } else {
        at(lo) * (1.0 - f) + at(lo + 1) * f
    }
}

fn delta(a: &WritePath, b: &WritePath) -> WritePath {
    WritePath {
        partial_updates: b.partial_updates - a.partial_updates,
        journal_records: b.journal_records - a.journal_records,
        journal_batches: b.journal_batches - a.journal_batches,
        journal_ring_writes: b.journal_ring_writes - a.journal_ring_writes,
        journal_ring_bytes: b.journal_ring_bytes - a.journal_ring_bytes,
        journal_batch_records_max: b.journal_batch_records_max,
        journal_checkpoints: b.journal_checkpoints - a.journal_checkpoints,
        lock_wait_us: b.lock_wait_us - a.lock_wait_us,
        read_us: b.read_us - a.read_us,
        journal_us: b.journal_us - a.journal_us,
        apply_us: b.apply_us - a.apply_us,
        early_acks: b.early_acks - a.early_acks,
        journal_checkpoints_ahead: b.journal_checkpoints_ahead - a.journal_checkpoints_ahead,
        data_first_acks: b.data_first_acks - a.data_first_acks,
        completion_us: b.completion_us - a.completion_us,
        journal_spare_wins: b.journal_spare_wins - a.journal_spare_wins,
        journal_spare_copies: b.journal_spare_copies - a.journal_spare_copies,
        completions_riding: b.completions_riding - a.completions_riding,
        completions_in_slots: b.completions_in_slots - a.completions_in_slots,
    }
}

fn describe(w: &WritePath) -> String {
    let per = |us: u64| us as f64 / 1000.0 / w.partial_updates.max(1) as f64;
    format!(
        "{} updates ({} data-first), {} records in {} batches ({:.1}/batch, max {}), {} FUA ring writes ({:.2}/update; {} spare copies, {} batches durable thanks to one), completing records {} riding / {} in slots, {} checkpoints waited for, {} ahead; per update ms: lock {:.1} read {:.1} journal {:.1} completing record {:.1} apply {:.1}",
        w.partial_updates,
        w.data_first_acks,
        w.journal_records,
        w.journal_batches,
        w.journal_records as f64 / w.journal_batches.max(1) as f64,
        w.journal_batch_records_max,
        w.journal_ring_writes,
        w.journal_ring_writes as f64 / w.partial_updates.max(1) as f64,
        w.journal_spare_copies,
        w.journal_spare_wins,
        w.completions_riding,
        w.completions_in_slots,
        w.journal_checkpoints,
        w.journal_checkpoints_ahead,
        per(w.lock_wait_us),
        per(w.read_us),
        per(w.journal_us),
        per(w.completion_us),
        per(w.apply_us),
    )
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let a = parse_args();
    let ramp = Duration::from_secs(a.ramp_secs);
    let secs = Duration::from_secs(a.secs);
    let member_bytes = a.member_mib << 20;
    // (label, level, members, member I/Os per small write)
    let pools: Vec<(&str, RaidLevel, usize, f64)> = vec![
        ("RAID 5 of 10", RaidLevel::Raid5, 10, 4.0),
        ("RAID 6 of 6", RaidLevel::Raid6, 6, 6.0),
    ]
    .into_iter()
    .filter(|p| match a.only.as_deref() {
        Some("raid5") => p.1 == RaidLevel::Raid5,
        Some("raid6") => p.1 == RaidLevel::Raid6,
        _ => true,
    })
    .collect();
    println!(
        "raid-smallwrite: simulated 7200 rpm HDDs of {} MiB (data in memory), {} in flight, {} s per figure after {} s ramp, 4 KiB blocks, 128 KiB chunks",
        a.member_mib, a.qd, a.secs, a.ramp_secs
    );
    let mut detail = Vec::new();
    let mut depths = Vec::new();
    let mut ceilings = Vec::new();
    let mut sims_low = false;
    let mut starts = Vec::new();
    for &ncq in &a.ncq {
        // one member alone: the disk figure the arithmetic limit is built from
        let mut one = Vec::new();
        for p in &a.patterns {
            let d = hdd(member_bytes, ncq);
            let (iops, _) = run(d as Arc<dyn Volume>, None, *p, a.qd, ramp, secs).await;
            one.push(iops);
        }
        println!();
        println!("NCQ {}", if ncq { "on" } else { "off" });
        print!("  one disk, 4K random writes in virtual time, IOPS at queue depth");
        for qd in [1, 2, 3, 4, 6, 8, 12, 16, 32] {
            print!(
                " {qd}: {:.0};",
                disk_iops_at(ncq, member_bytes, 4096, qd as f64)
            );
        }
        println!();
        print!("  one disk, {} in flight:", a.qd);
        for (p, iops) in a.patterns.iter().zip(&one) {
            print!("  {} {:.0} IOPS;", p.name, iops);
        }
        println!();
        println!(
            "  {:14} {:17} {:>7} {:>11} {:>8} {:>11} {:>11} {:>6} {:>6} {:>6} {:>7} {:>6} {:>8} {:>7} {:>7} {:>5}",
            "pool",
            "pattern",
            "journal",
            "reads first",
            "late ack",
            "journal off",
            "journal SSD",
            "limit",
            "j/off",
            "j/lim",
            "SSD/off",
            "QD",
            "limit@QD",
            "j/l@QD",
            "off/l@QD",
            "sim"
        );
        let ncq_s = if ncq { "on" } else { "off" };
        for &(label, level, n, write_ios) in &pools {
            let mut figures = Vec::new();
            // the pool as shipped (journal on the members), then the same pool with
            // the journal bypassed; then a pool with its journal on a simulated SSD
            for with_device in [false, true] {
                let disks: Vec<VolumeRef> = (0..n)
                    .map(|_| hdd(member_bytes, ncq) as VolumeRef)
                    .collect();
                let members = named(&disks);
                let dev = with_device.then(|| {
                    let ssd_bytes =
                        (a.journal_mib.unwrap_or(raid::LARGEST_JOURNAL_BYTES >> 20) + 16) << 20;
                    let store = Arc::new(MemVolume::new(BS, ssd_bytes / BS as u64)) as VolumeRef;
                    let ssd = SimDisk::ssd(store, SsdParams::default()).expect("ssd model");
                    Member::new("ssd", Arc::new(ssd) as VolumeRef)
                });
                let mut cfg = PoolConfig::new("bench", level);
                cfg.rebuild_rate_mb_s = 0;
                cfg.journal_bytes = a.journal_mib.map(|m| m << 20);
                let pool = Arc::new(
                    Pool::create_with_journal_device(cfg, members, vec![], dev)
                        .await
                        .expect("create"),
                );
                pool.wait_idle().await;
                if let Some(n) = a.spare_copies {
                    pool.set_journal_spare_copies(n, raid::SpareWhen::Reordering);
                }
                pool.set_completions_ride(a.ride);
                for (i, p) in a.patterns.iter().enumerate() {
                    // (name, journal bypassed, early acknowledgement, data first)
                    let modes: &[(&str, bool, bool, bool)] = if with_device {
                        &[("journal SSD", false, true, true)]
                    } else {
                        &[
                            ("journal", false, true, true),
                            ("reads first", false, true, false),
                            ("late ack", false, false, false),
                            ("journal off", true, true, true),
                        ]
                    };
                    for &(mode, bypass, early, first) in modes {
                        pool.unsafe_set_journal_bypass(bypass);
                        pool.set_early_ack(early);
                        pool.set_data_first(first);
                        let st0 = pool.status();
                        let before = st0.write_path.clone();
                        let (iops, qd) = run(
                            pool.clone() as Arc<dyn Volume>,
                            Some(&pool),
                            *p,
                            a.qd,
                            ramp,
                            secs,
                        )
                        .await;
                        let st1 = pool.status();
                        let after = st1.write_path.clone();
                        let gathered =
                            st1.stripe_writes.gather_timeouts - st0.stripe_writes.gather_timeouts;
                        pool.unsafe_set_journal_bypass(false);
                        pool.set_early_ack(true);
                        pool.set_data_first(true);
                        detail.push(format!(
                            "  NCQ {ncq_s:3} {label:14} {:17} {mode:12} {} gather timeouts; {}",
                            p.name,
                            gathered,
                            describe(&delta(&before, &after))
                        ));
                        if figures.len() <= i {
                            figures.push(Vec::new());
                        }
                        figures[i].push((iops, qd));
                    }
                }
                let ring = pool.status().journal_bytes;
                pool.shutdown().await.expect("shutdown");
                drop(pool);
                if !with_device {
                    // what a start costs with this ring: assemble reads every
                    // member's ring (together) to find the records to replay
                    let t = Instant::now();
                    let again = Pool::assemble(named(&disks), false)
                        .await
                        .expect("assemble");
                    let took = t.elapsed();
                    again.shutdown().await.expect("shutdown");
                    let one = ring_read(member_bytes, ncq, ring).await;
                    starts.push(format!(
                        "  NCQ {ncq_s:3} {label:14} rings of {} MiB on {n} members: assemble {:.2} s; one disk reads one ring alone in {:.2} s ({:.1}x)",
                        ring >> 20,
                        took.as_secs_f64(),
                        one.as_secs_f64(),
                        took.as_secs_f64() / one.as_secs_f64().max(1e-9),
                    ));
                }
            }
            for ((p, disk_iops), f) in a.patterns.iter().zip(&one).zip(&figures) {
                let r = p.read_pct as f64 / 100.0;
                let ios_per_op = r + (1.0 - r) * write_ios;
                let limit = n as f64 * disk_iops / ios_per_op;
                // The deepest queue the workload itself gives a member: each of the
                // `qd` requests has at most one member I/O in flight when it is a
                // read, and `redundancy + 1` when it is a small write (its reads
                // of old data and parity together, then its writes together:
                // the writes need what the reads returned).
                let together = write_ios / 2.0;
                let qd_bound = a.qd as f64 * (r + (1.0 - r) * together) / n as f64;
                let limit_qd =
                    n as f64 * disk_iops_at(ncq, member_bytes, p.bs_bytes, qd_bound) / ios_per_op;
                let (on, first, late, off, dev) = (f[0].0, f[1].0, f[2].0, f[3].0, f[4].0);
                if r > 0.0 {
                    // The ceiling any pool of these disks has when reads wait in
                    // the members' queues like every other request (the HDD
                    // model serves the nearest request first, whatever it is):
                    // at depth d a member serves X(d) IOPS and each request
                    // waits d / X(d) on average (Little's law), so the clients'
                    // `qd` requests, a share r of them reads, complete at most
                    // qd / (r d / X(d)) a second even if writes took no time,
                    // and the members carry at most n X(d) / (member I/Os per
                    // operation). The first falls with d, the second grows: the
                    // best is where they meet, d* = qd (I/Os per op) / (r n),
                    // with the fewest member I/Os a write can take (no journal).
                    let d_star = a.qd as f64 * ios_per_op / (r * n as f64);
                    let ceiling =
                        n as f64 * disk_iops_at(ncq, member_bytes, p.bs_bytes, d_star) / ios_per_op;
                    ceilings.push(format!(
                        "  NCQ {ncq_s:3} {label:14} {:17} ceiling {ceiling:>4.0} IOPS = {:>3.0}% of the limit (members at depth {d_star:.1}); journal {:>3.0}% of the ceiling, journal off {:>3.0}%",
                        p.name,
                        100.0 * ceiling / limit,
                        100.0 * on / ceiling,
                        100.0 * off / ceiling,
                    ));
                }
                // How much of what the HDD model gives at the depth and
                // utilisation the members had they really delivered, worst of
                // the four runs: well under 100% means the simulated disks lost
                // time to a machine short of CPU (their completions fired late),
                // and the row's figures are low for that reason, not the pool's.
                let sim = f
                    .iter()
                    .map(|(_, d)| {
                        let at = disk_iops_at(ncq, member_bytes, p.bs_bytes, d.busy_mean);
                        d.member_iops / (d.busy * at).max(1.0)
                    })
                    .fold(f64::INFINITY, f64::min);
                sims_low |= sim < SIM_OK;
                println!(
                    "  {:14} {:17} {:>7.0} {:>11.0} {:>8.0} {:>11.0} {:>11.0} {:>6.0} {:>5.0}% {:>5.0}% {:>6.0}% {:>6.1} {:>8.0} {:>6.0}% {:>7.0}% {:>4.0}%{}",
                    label,
                    p.name,
                    on,
                    first,
                    late,
                    off,
                    dev,
                    limit,
                    100.0 * on / off,
                    100.0 * on / limit,
                    100.0 * dev / off,
                    qd_bound,
                    limit_qd,
                    100.0 * on / limit_qd,
                    100.0 * off / limit_qd,
                    100.0 * sim,
                    if sim < SIM_OK { " *" } else { "" },
                );
                for (mode, (iops, d)) in [
                    "journal",
                    "reads first",
                    "late ack",
                    "journal off",
                    "journal SSD",
                ]
                .iter()
                .zip(f)
                {
                    let at = disk_iops_at(ncq, member_bytes, p.bs_bytes, d.busy_mean);
                    depths.push(format!(
                        "  NCQ {ncq_s:3} {label:14} {:17} {mode:12} {iops:>4.0} IOPS: members {:>3.0}% busy, queue depth {:>4.1} ({:>4.1} while busy); {:>5.1} member I/Os per operation; each member {:>4.0} IOPS = {:>3.0}% of one disk at that depth while busy ({:.0} IOPS); {:.0}% of completions out of order",
                        p.name,
                        100.0 * d.busy,
                        d.mean,
                        d.busy_mean,
                        n as f64 * d.member_iops / iops.max(1.0),
                        d.member_iops,
                        100.0 * d.member_iops / (d.busy * at).max(1.0),
                        at,
                        100.0 * d.reordered,
                    ));
                }
            }
        }
    }
    if sims_low {
        println!();
        println!(
            "  * sim under {:.0}%: in one of the row's runs the simulated disks delivered less than the HDD model gives at their queue depth (a machine short of CPU fires their completions late); run again on a quieter machine",
            100.0 * SIM_OK
        );
    }
    if !ceilings.is_empty() {
        println!();
        println!("with reads, the most any pool of these disks can do at {} in flight: reads wait in the members' queues like any request (the model has no priorities), so qd / (reads' share x depth / X(depth)) meets n x X(depth) / member I/Os per operation (a write's fewest, no journal) at one depth:", a.qd);
        for c in ceilings {
            println!("{c}");
        }
    }
    println!();
    println!("start-up: the pool (journal on the members) assembled again after its runs and a clean shutdown, against one simulated disk of the same kind reading a ring's bytes in 1 MiB pieces, one at a time:");
    for s in starts {
        println!("{s}");
    }
    println!();
    println!("how deep the members' queues ran (pool status members[].inflight_us, busy_us; one disk at that depth: the HDD model in virtual time):");
    for d in depths {
        println!("{d}");
    }
    println!();
    println!("where a partial-stripe update's time went (pool status write_path, deltas per run):");
    for d in detail {
        println!("{d}");
    }
}
