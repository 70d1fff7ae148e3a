//! The workload engine: workers keeping `queue_depth` I/Os in flight, the sampler, and
//! the accounting that turns completions into a [`RunResult`].
//!
//! Each worker is one tokio task that owns `queue_depth` slots. A slot holds the boxed
//! future the volume returned (the only allocation per I/O, made by the `Volume` trait
//! itself), and the worker polls its slots itself, so a worker's latency histograms and
//! counters are plain locals with no locking. Write data comes from one shared
//! pre-filled buffer (reference-counted, never copied) or, when verifying, from a
//! per-slot buffer that is reused once the volume lets go of it.

use crate::cpu::process_cpu_time;
use crate::result::new_histogram;
use crate::rng::Rng;
use crate::verify::{check_records, fill_records, VerifyMap, VerifySummary};
use crate::{
    BenchError, LatencySummary, ProgressLine, ProgressSample, ProgressSink, Region, RunResult,
    Suite, TimelinePoint, VerifyFailure, Workload,
};
use block::{BlockResult, Bytes, BytesMut, Volume, VolumeRef};
use hdrhistogram::Histogram;
use parking_lot::Mutex;
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};

/// Interval of progress samples, timeline points and checkpoints.
const SAMPLE_INTERVAL_MS: u64 = 1000;
/// Tries to find an unclaimed block before a slot stays idle for a round (verify only).
const CLAIM_TRIES_MAX: u32 = 8;
/// Completions handled before a worker yields to the scheduler (immediate volumes).
const YIELD_EVERY_ROUNDS: u32 = 16;
/// Pause of a worker after a round with an I/O error, so a dead target is not spun on.
const ERROR_BACKOFF_MS: u64 = 1;

/// Optional parts of a run beyond the workload itself.
#[derive(Default, Clone)]
pub struct RunOptions {
    /// Receives a progress sample about once a second, and a last one with `done`.
    pub progress: Option<ProgressSink>,
    /// Verification history to continue (must describe the workload's region); when
    /// `None` and the workload verifies, a fresh map is made.
    pub verify_map: Option<Arc<VerifyMap>>,
    /// Where to save the verification map: at the end of the run (complete) and, with
    /// `checkpoint_interval_secs > 0`, as checkpoints during it.
    pub verify_state_path: Option<PathBuf>,
    /// Seconds between checkpoints of the verification map (0: only at the end).
    pub checkpoint_interval_secs: u32,
}

/// Runs one workload against `volume` and measures it.
///
/// I/O errors of the volume are counted in the result, not returned; an `Err` means the
/// workload could not run at all (invalid spec, state file not writable).
pub async fn run(
    volume: VolumeRef,
    w: &Workload,
    progress: Option<ProgressSink>,
) -> Result<RunResult, BenchError> {
    run_with(
        volume,
        w,
        RunOptions {
            progress,
            ..RunOptions::default()
        },
    )
    .await
}

/// Runs every workload of `suite` in order, with a [`ProgressLine`] on stderr when
/// `show_progress`.
pub async fn run_suite(
    volume: VolumeRef,
    suite: &Suite,
    show_progress: bool,
) -> Result<Vec<RunResult>, BenchError> {
    let mut out = Vec::with_capacity(suite.workloads.len());
    for w in &suite.workloads {
        let progress = show_progress.then(|| ProgressLine::new(&w.name).sink());
        out.push(run(volume.clone(), w, progress).await?);
    }
    Ok(out)
}

#[repr(align(128))]
#[derive(Default)]
struct WorkerCounters {
    ios: AtomicU64,
    bytes: AtomicU64,
}

struct Shared {
    volume: VolumeRef,
    w: Workload,
    region: Region,
    measure_start: Instant,
    measure_end: Instant,
    stop: AtomicBool,
    issued: AtomicU64,
    counters: Box<[WorkerCounters]>,
    verify: Option<Arc<VerifyMap>>,
    verify_failures: AtomicU64,
    first_failure: Mutex<Option<VerifyFailure>>,
    write_template: Bytes,
}

/// Runs one workload with the extra [`RunOptions`].
pub async fn run_with(
    volume: VolumeRef,
    w: &Workload,
    opts: RunOptions,
) -> Result<RunResult, BenchError> {
    let g = volume.geometry();
    let region = w.region(&g)?;
    let verify = if w.verify {
        let map = match opts.verify_map {
            Some(m) => {
                if m.region() != &region {
                    return Err(BenchError::VerifyMapMismatch(format!(
                        "map describes {:?}, workload {:?}",
                        m.region(),
                        region
                    )));
                }
                m
            }
            None => Arc::new(VerifyMap::new(region)),
        };
        Some(map)
    } else {
        None
    };
    let mut template = vec![0u8; w.block_size_bytes as usize];
    Rng::new(w.seed ^ 0x5eed_da7a).fill(&mut template);
    let start = Instant::now();
    let measure_start = start + Duration::from_secs_f64(w.ramp_up_secs);
    let measure_end = measure_start + Duration::from_secs_f64(w.duration_secs);
    let sh = Arc::new(Shared {
        volume,
        w: w.clone(),
        region,
        measure_start,
        measure_end,
        stop: AtomicBool::new(false),
        issued: AtomicU64::new(0),
        counters: (0..w.threads).map(|_| WorkerCounters::default()).collect(),
        verify,
        verify_failures: AtomicU64::new(0),
        first_failure: Mutex::new(None),
        write_template: Bytes::from(template),
    });
    let cpu_at_start = process_cpu_time();
    let cpu_probe = tokio::spawn(async move {
        tokio::time::sleep_until(measure_start.into()).await;
        process_cpu_time()
    });
    let (done_tx, done_rx) = tokio::sync::oneshot::channel::<()>();
    let sampler = tokio::spawn(sampler(
        sh.clone(),
        start,
        opts.progress.clone(),
        opts.verify_state_path.clone(),
        opts.checkpoint_interval_secs,
        done_rx,
    ));
    let workers: Vec<_> = (0..w.threads)
        .map(|t| tokio::spawn(worker(sh.clone(), t)))
        .collect();
    let mut outs = Vec::with_capacity(workers.len());
    let mut join_error = None;
    for h in workers {
        match h.await {
            Ok(o) => outs.push(o),
            Err(e) => join_error = Some(BenchError::Task(e.to_string())),
        }
    }
    let end = Instant::now();
    let cpu_at_end = process_cpu_time();
    let cpu_at_window = if cpu_probe.is_finished() {
        cpu_probe.await.unwrap_or(cpu_at_start)
    } else {
        cpu_probe.abort();
        cpu_at_end
    };
    let _ = done_tx.send(());
    let timeline = sampler.await.map_err(|e| BenchError::Task(e.to_string()))?;
    if let Some(e) = join_error {
        return Err(e);
    }
    if let (Some(map), Some(path)) = (&sh.verify, &opts.verify_state_path) {
        map.snapshot(true).save(path)?;
    }

    let measured = end
        .min(measure_end)
        .saturating_duration_since(measure_start);
    let secs = measured.as_secs_f64();
    let per_sec = |x: f64| if secs > 0.0 { x / secs } else { 0.0 };
    let mut rh = new_histogram();
    let mut wh = new_histogram();
    let mut tot = WorkerOut::new();
    for o in &outs {
        let _ = rh.add(&o.read_hist);
        let _ = wh.add(&o.write_hist);
        tot.merge_counts(o);
    }
    let mut all = rh.clone();
    let _ = all.add(&wh);
    let ios = tot.reads + tot.writes;
    let cpu_us = cpu_at_end.saturating_sub(cpu_at_window).as_secs_f64() * 1e6;
    let verify_summary = sh.verify.as_ref().map(|_| {
        let failures = sh.verify_failures.load(Ordering::Acquire);
        VerifySummary {
            passed: failures == 0,
            reads_checked: tot.reads_checked,
            reads_unwritten: tot.reads_unwritten,
            failures,
            first_failure: sh.first_failure.lock().clone(),
        }
    });
    let result = RunResult {
        name: w.name.clone(),
        spec: w.clone(),
        measured_secs: secs,
        reads: tot.reads,
        writes: tot.writes,
        read_bytes: tot.read_bytes,
        write_bytes: tot.write_bytes,
        iops: per_sec(ios as f64),
        read_iops: per_sec(tot.reads as f64),
        write_iops: per_sec(tot.writes as f64),
        mb_per_sec: per_sec((tot.read_bytes + tot.write_bytes) as f64) / 1e6,
        mib_per_sec: per_sec((tot.read_bytes + tot.write_bytes) as f64) / (1u64 << 20) as f64,
        read_mb_per_sec: per_sec(tot.read_bytes as f64) / 1e6,
        write_mb_per_sec: per_sec(tot.write_bytes as f64) / 1e6,
        latency: LatencySummary::from_histogram_ns(&all),
        read_latency: LatencySummary::from_histogram_ns(&rh),
        write_latency: LatencySummary::from_histogram_ns(&wh),
        cpu_pct_one_core: if secs > 0.0 {
            cpu_us / 1e6 / secs * 100.0
        } else {
            0.0
        },
        cpu_us_per_io: if ios > 0 { cpu_us / ios as f64 } else { 0.0 },
        read_errors: tot.read_errors,
        write_errors: tot.write_errors,
        first_error: outs.iter().find_map(|o| o.first_error.clone()),
        timeline,
        verify: verify_summary,
    };
    if let Some(p) = &opts.progress {
        p(&ProgressSample {
            elapsed_secs: end.duration_since(start).as_secs_f64(),
            iops: result.iops,
            mbps: result.mb_per_sec,
            ramping: false,
            done: true,
        });
    }
    Ok(result)
}

/// Samples the workers' counters once a second: progress, timeline, checkpoints.
async fn sampler(
    sh: Arc<Shared>,
    start: Instant,
    progress: Option<ProgressSink>,
    state_path: Option<PathBuf>,
    checkpoint_interval_secs: u32,
    mut done: tokio::sync::oneshot::Receiver<()>,
) -> Vec<TimelinePoint> {
    let mut timeline = Vec::new();
    let mut tick = tokio::time::interval_at(
        (start + Duration::from_millis(SAMPLE_INTERVAL_MS)).into(),
        Duration::from_millis(SAMPLE_INTERVAL_MS),
    );
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let (mut last_ios, mut last_bytes, mut last_at) = (0u64, 0u64, start);
    let mut ticks = 0u64;
    loop {
        tokio::select! {
            _ = &mut done => break,
            _ = tick.tick() => {}
        }
        ticks += 1;
        let now = Instant::now();
        let ios: u64 = sh
            .counters
            .iter()
            .map(|c| c.ios.load(Ordering::Relaxed))
            .sum();
        let bytes: u64 = sh
            .counters
            .iter()
            .map(|c| c.bytes.load(Ordering::Relaxed))
            .sum();
        let dt = now.duration_since(last_at).as_secs_f64().max(1e-9);
        let point = TimelinePoint {
            elapsed_secs: now.duration_since(start).as_secs_f64(),
            iops: (ios - last_ios) as f64 / dt,
            mbps: (bytes - last_bytes) as f64 / dt / 1e6,
            ramping: now < sh.measure_start,
        };
        (last_ios, last_bytes, last_at) = (ios, bytes, now);
        if let Some(p) = &progress {
            p(&ProgressSample {
                elapsed_secs: point.elapsed_secs,
                iops: point.iops,
                mbps: point.mbps,
                ramping: point.ramping,
                done: false,
            });
        }
        timeline.push(point);
        if let (Some(map), Some(path)) = (&sh.verify, &state_path) {
            if checkpoint_interval_secs > 0 && ticks.is_multiple_of(checkpoint_interval_secs as u64)
            {
                let (map, path) = (map.clone(), path.clone());
                let saved =
                    tokio::task::spawn_blocking(move || map.snapshot(false).save(&path)).await;
                if let Ok(Err(e)) = saved {
                    tracing::warn!("verification checkpoint failed: {e}");
                }
            }
        }
    }
    timeline
}

type ReadFut<'a> = Pin<Box<dyn Future<Output = BlockResult<Bytes>> + Send + 'a>>;
type WriteFut<'a> = Pin<Box<dyn Future<Output = BlockResult<()>> + Send + 'a>>;

enum InFlight<'a> {
    Read(ReadFut<'a>),
    Write(WriteFut<'a>),
}

enum Outcome {
    Read(BlockResult<Bytes>),
    Write(BlockResult<()>),
}

struct Slot<'a> {
    io: Option<InFlight<'a>>,
    block: u64,
    /// Generation written (writes) or acknowledged when issued (reads).
    gen: u32,
    claimed: bool,
    issued_at: Instant,
    /// Our handle on the data handed to the volume, to take the buffer back.
    write_data: Option<Bytes>,
    spare: Option<BytesMut>,
}

struct WorkerOut {
    read_hist: Histogram<u64>,
    write_hist: Histogram<u64>,
    reads: u64,
    writes: u64,
    read_bytes: u64,
    write_bytes: u64,
    read_errors: u64,
    write_errors: u64,
    first_error: Option<String>,
    reads_checked: u64,
    reads_unwritten: u64,
}

impl WorkerOut {
    fn new() -> Self {
        WorkerOut {
            read_hist: new_histogram(),
            write_hist: new_histogram(),
            reads: 0,
            writes: 0,
            read_bytes: 0,
            write_bytes: 0,
            read_errors: 0,
            write_errors: 0,
            first_error: None,
            reads_checked: 0,
            reads_unwritten: 0,
        }
    }

    fn merge_counts(&mut self, o: &WorkerOut) {
        self.reads += o.reads;
        self.writes += o.writes;
        self.read_bytes += o.read_bytes;
        self.write_bytes += o.write_bytes;
        self.read_errors += o.read_errors;
        self.write_errors += o.write_errors;
        self.reads_checked += o.reads_checked;
        self.reads_unwritten += o.reads_unwritten;
    }
}

/// Where one worker's next I/O goes.
struct Picker {
    rng: Rng,
    slice_start: u64,
    slice_len: u64,
    cursor: u64,
}

impl Picker {
    fn new(w: &Workload, region: &Region, t: u32) -> Self {
        let n = w.threads as u64;
        let slice_start = t as u64 * region.blocks / n;
        let slice_end = (t as u64 + 1) * region.blocks / n;
        Picker {
            rng: Rng::new(w.seed.wrapping_add(t as u64)),
            slice_start: slice_start.min(region.blocks - 1),
            slice_len: slice_end.saturating_sub(slice_start).max(1),
            cursor: 0,
        }
    }

    /// (is_read, block)
    fn next(&mut self, w: &Workload, region: &Region) -> (bool, u64) {
        let is_read = self.rng.below(100) < w.read_pct as u64;
        let random = self.rng.below(100) < w.random_pct as u64;
        let block = if random {
            self.rng.below(region.blocks)
        } else {
            let b = self.slice_start + self.cursor;
            self.cursor = (self.cursor + 1) % self.slice_len;
            b.min(region.blocks - 1)
        };
        (is_read, block)
    }
}

async fn worker(sh: Arc<Shared>, t: u32) -> WorkerOut {
    let volume = sh.volume.clone();
    let vol: &dyn Volume = &*volume;
    let w = &sh.w;
    let region = sh.region;
    let qd = w.queue_depth as usize;
    let io_bytes = w.block_size_bytes as usize;
    let lbas = region.lbas_per_block();
    let counters = &sh.counters[t as usize];
    let mut out = WorkerOut::new();
    let mut picker = Picker::new(w, &region, t);
    let now = Instant::now();
    let mut slots: Vec<Slot<'_>> = (0..qd)
        .map(|_| Slot {
            io: None,
            block: 0,
            gen: 0,
            claimed: false,
            issued_at: now,
            write_data: None,
            spare: None,
        })
        .collect();
    let mut done: Vec<(usize, Outcome)> = Vec::with_capacity(qd);
    let mut rounds = 0u32;
    loop {
        let stopping = sh.stop.load(Ordering::Relaxed) || Instant::now() >= sh.measure_end;
        if !stopping {
            for (i, slot) in slots.iter_mut().enumerate() {
                if slot.io.is_some() {
                    continue;
                }
                if let Some(max) = w.io_count_max {
                    if sh.issued.fetch_add(1, Ordering::Relaxed) >= max {
                        sh.stop.store(true, Ordering::Relaxed);
                        break;
                    }
                }
                let mut pick = None;
                for _ in 0..CLAIM_TRIES_MAX {
                    let (is_read, block) = picker.next(w, &region);
                    match &sh.verify {
                        Some(map) if !map.try_claim(block) => continue,
                        _ => {
                            pick = Some((is_read, block));
                            break;
                        }
                    }
                }
                let Some((is_read, block)) = pick else {
                    if w.io_count_max.is_some() {
                        sh.issued.fetch_sub(1, Ordering::Relaxed);
                    }
                    continue;
                };
                slot.block = block;
                slot.claimed = sh.verify.is_some();
                let lba = region.lba_of(block);
                if is_read {
                    slot.gen = sh.verify.as_ref().map_or(0, |m| m.acked(block));
                    slot.issued_at = Instant::now();
                    slot.io = Some(InFlight::Read(vol.read(lba, lbas)));
                } else {
                    let data = match &sh.verify {
                        Some(map) => {
                            let gen = map.next_gen(block);
                            slot.gen = gen;
                            let mut buf = slot.spare.take().unwrap_or_default();
                            buf.resize(io_bytes, 0);
                            let writer = (t << 16) | (i as u32 & 0xffff);
                            fill_records(
                                &mut buf,
                                region.volume_block_bytes as usize,
                                lba,
                                map.map_id(),
                                gen,
                                writer,
                            );
                            let data = buf.freeze();
                            slot.write_data = Some(data.clone());
                            data
                        }
                        None => sh.write_template.clone(),
                    };
                    slot.issued_at = Instant::now();
                    slot.io = Some(InFlight::Write(vol.write(lba, data, w.fua)));
                }
            }
        }
        if slots.iter().all(|s| s.io.is_none()) {
            if stopping || sh.stop.load(Ordering::Relaxed) {
                break;
            }
            // Every pick was claimed by other workers (tiny region): let them finish.
            tokio::task::yield_now().await;
            continue;
        }
        done.clear();
        std::future::poll_fn(|cx| {
            for (i, slot) in slots.iter_mut().enumerate() {
                let ready = match &mut slot.io {
                    None => None,
                    Some(InFlight::Read(f)) => match f.as_mut().poll(cx) {
                        Poll::Ready(r) => Some(Outcome::Read(r)),
                        Poll::Pending => None,
                    },
                    Some(InFlight::Write(f)) => match f.as_mut().poll(cx) {
                        Poll::Ready(r) => Some(Outcome::Write(r)),
                        Poll::Pending => None,
                    },
                };
                if let Some(r) = ready {
                    slot.io = None;
                    done.push((i, r));
                }
            }
            if done.is_empty() {
                Poll::Pending
            } else {
                Poll::Ready(())
            }
        })
        .await;
        let now = Instant::now();
        let in_window = now >= sh.measure_start && now < sh.measure_end;
        let mut had_error = false;
        for (i, outcome) in done.drain(..) {
            let slot = &mut slots[i];
            let lat_ns = now
                .duration_since(slot.issued_at)
                .as_nanos()
                .min(u64::MAX as u128) as u64;
            match outcome {
                Outcome::Read(Ok(data)) if data.len() == io_bytes => {
                    counters.ios.fetch_add(1, Ordering::Relaxed);
                    counters.bytes.fetch_add(io_bytes as u64, Ordering::Relaxed);
                    if in_window {
                        out.read_hist.saturating_record(lat_ns.max(1));
                        out.reads += 1;
                        out.read_bytes += io_bytes as u64;
                    }
                    if let Some(map) = &sh.verify {
                        let gen_max = map.newest(slot.block);
                        if slot.gen == 0 && gen_max == 0 {
                            out.reads_unwritten += 1;
                        } else {
                            out.reads_checked += 1;
                            if let Err(f) = check_records(
                                &data,
                                &region,
                                map.map_id(),
                                slot.block,
                                slot.gen,
                                gen_max,
                            ) {
                                if sh.verify_failures.fetch_add(1, Ordering::AcqRel) == 0 {
                                    tracing::error!("verification failed: {f}");
                                }
                                sh.first_failure.lock().get_or_insert(f);
                                sh.stop.store(true, Ordering::Relaxed);
                            }
                        }
                    }
                }
                Outcome::Read(Ok(data)) => {
                    had_error = true;
                    out.read_errors += 1;
                    out.first_error.get_or_insert_with(|| {
                        format!(
                            "read at lba {} returned {} bytes, expected {io_bytes}",
                            region.lba_of(slot.block),
                            data.len()
                        )
                    });
                }
                Outcome::Read(Err(e)) => {
                    had_error = true;
                    out.read_errors += 1;
                    out.first_error.get_or_insert_with(|| {
                        format!("read at lba {}: {e}", region.lba_of(slot.block))
                    });
                }
                Outcome::Write(Ok(())) => {
                    counters.ios.fetch_add(1, Ordering::Relaxed);
                    counters.bytes.fetch_add(io_bytes as u64, Ordering::Relaxed);
                    if in_window {
                        out.write_hist.saturating_record(lat_ns.max(1));
                        out.writes += 1;
                        out.write_bytes += io_bytes as u64;
                    }
                    if let Some(map) = &sh.verify {
                        map.ack(slot.block, slot.gen);
                    }
                }
                Outcome::Write(Err(e)) => {
                    had_error = true;
                    out.write_errors += 1;
                    out.first_error.get_or_insert_with(|| {
                        format!("write at lba {}: {e}", region.lba_of(slot.block))
                    });
                    if let Some(map) = &sh.verify {
                        map.write_failed(slot.block, slot.gen);
                    }
                }
            }
            if slot.claimed {
                if let Some(map) = &sh.verify {
                    map.release(slot.block);
                }
                slot.claimed = false;
            }
            if let Some(data) = slot.write_data.take() {
                if let Ok(buf) = data.try_into_mut() {
                    slot.spare = Some(buf);
                }
            }
        }
        if had_error {
            tokio::time::sleep(Duration::from_millis(ERROR_BACKOFF_MS)).await;
        }
        rounds = rounds.wrapping_add(1);
        if rounds.is_multiple_of(YIELD_EVERY_ROUNDS) {
            tokio::task::yield_now().await;
        }
    }
    out
}
