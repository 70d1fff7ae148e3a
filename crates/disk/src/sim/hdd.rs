//! The HDD model: one actuator, square-root seek curve, positional rotational
//! latency, zoned media rate, sequential detection and NCQ.
//!
//! Nominal figures of the defaults (7200 rpm, 0.8/15.5 ms seek, 200..120 MB/s, 0.05
//! ms command overhead) on a device of any size, as [`HddModel::nominal`] computes
//! them: random 4K read about 78 IOPS at QD1 (8.6 ms average seek + 4.17 ms average
//! rotation + 0.05 ms overhead + 0.02 ms transfer) and about 190 IOPS at QD32 with
//! NCQ (shortest positioning time first among 32); sequential 200 MB/s at the
//! start of the device (120 MB/s at the end).

use super::{
    check_non_neg, check_pos, ms_to_ns, xfer_ns, Nominal, SimError, SimModel, SimOp, SimOpKind,
};
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;

/// Parameters of a simulated hard disk; every field has a default (a 7200 rpm
/// nearline SATA disk), so a config names only what it changes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HddParams {
    /// Spindle speed in revolutions per minute.
    pub rpm: u32,
    /// Seek to the next cylinder (includes settle), ms: the shortest real seek.
    pub track_to_track_seek_ms: f64,
    /// Seek across the whole stroke, ms. A seek over a fraction `d` of the stroke
    /// takes `t2t + (full - t2t) * sqrt(d)`; the average over random pairs is
    /// `t2t + (full - t2t) * 8/15`.
    pub full_stroke_seek_ms: f64,
    /// Media rate at the start of the device (outer zone), MB/s.
    pub outer_zone_mb_s: f64,
    /// Media rate at the end of the device (inner zone), MB/s; the rate falls
    /// linearly with the offset in between.
    pub inner_zone_mb_s: f64,
    /// Controller time per non-sequential command, ms.
    pub command_overhead_ms: f64,
    /// Native command queueing: with several requests waiting, serve the one with
    /// the shortest positioning time (seek + rotation) first.
    pub ncq: bool,
    /// How many waiting requests (oldest first) NCQ chooses among.
    pub ncq_depth: u32,
    /// Cost of a cache flush, ms (the disk is write-through, so this is the
    /// command's round trip only).
    pub flush_ms: f64,
    /// Cost of a discard or write-zeroes command, ms.
    pub trim_ms: f64,
}

impl Default for HddParams {
    fn default() -> Self {
        HddParams {
            rpm: 7200,
            track_to_track_seek_ms: 0.8,
            full_stroke_seek_ms: 15.5,
            outer_zone_mb_s: 200.0,
            inner_zone_mb_s: 120.0,
            command_overhead_ms: 0.05,
            ncq: true,
            ncq_depth: 32,
            flush_ms: 0.1,
            trim_ms: 0.1,
        }
    }
}

impl HddParams {
    /// Checks every field's range.
    pub fn validate(&self) -> Result<(), SimError> {
        if self.rpm == 0 {
            return Err(SimError::InvalidParam {
                name: "rpm",
                reason: "must be > 0",
            });
        }
        check_non_neg("track_to_track_seek_ms", self.track_to_track_seek_ms)?;
        check_non_neg("full_stroke_seek_ms", self.full_stroke_seek_ms)?;
        if self.full_stroke_seek_ms < self.track_to_track_seek_ms {
            return Err(SimError::InvalidParam {
                name: "full_stroke_seek_ms",
                reason: "must be >= track_to_track_seek_ms",
            });
        }
        check_pos("outer_zone_mb_s", self.outer_zone_mb_s)?;
        check_pos("inner_zone_mb_s", self.inner_zone_mb_s)?;
        check_non_neg("command_overhead_ms", self.command_overhead_ms)?;
        check_non_neg("flush_ms", self.flush_ms)?;
        check_non_neg("trim_ms", self.trim_ms)?;
        if self.ncq && self.ncq_depth == 0 {
            return Err(SimError::InvalidParam {
                name: "ncq_depth",
                reason: "must be > 0 when ncq is on",
            });
        }
        Ok(())
    }

    /// Average seek time over random pairs of positions, ms.
    pub fn avg_seek_ms(&self) -> f64 {
        self.track_to_track_seek_ms
            + (self.full_stroke_seek_ms - self.track_to_track_seek_ms) * 8.0 / 15.0
    }

    /// Average rotational latency (half a revolution), ms.
    pub fn avg_rotation_ms(&self) -> f64 {
        30_000.0 / self.rpm as f64
    }

    /// Analytic random-read service time at queue depth 1 for `len_bytes` requests
    /// at the mid-zone rate, ms: overhead + average seek + half a turn + transfer.
    pub fn avg_random_service_ms(&self, len_bytes: u64) -> f64 {
        let mid_mb_s = (self.outer_zone_mb_s + self.inner_zone_mb_s) / 2.0;
        self.command_overhead_ms
            + self.avg_seek_ms()
            + self.avg_rotation_ms()
            + len_bytes as f64 / (mid_mb_s * 1e3)
    }
}

#[derive(Debug, Clone, Copy)]
struct Pending {
    tag: u64,
    arrival_ns: u64,
    op: SimOp,
}

/// A hard disk as a discrete-event machine: one actuator serving one request at a
/// time, the next chosen by NCQ (or FIFO) when the current one completes.
///
/// Positional rotation: the platter angle is `t * rpm / 60` (mod 1); a byte's angle
/// is its offset within its track, the track holding one revolution's worth of
/// bytes at the local zone rate. A request that starts where the previous one ended
/// pays neither seek nor rotation nor command overhead.
#[derive(Debug, Clone)]
pub struct HddModel {
    params: HddParams,
    capacity_bytes: u64,
    rev_ns: f64,
    /// Requests waiting for the actuator, oldest first (bounded by the caller's
    /// queue depth).
    pending: VecDeque<Pending>,
    /// The request on the actuator and its completion time.
    in_service: Option<(u64, u64)>,
    /// Head position (byte offset) after the last media access.
    head_bytes: u64,
    /// End of the last read or write, for sequential detection.
    last_end_bytes: Option<u64>,
    now_ns: u64,
}

impl HddModel {
    /// An idle disk of `capacity_bytes` with `params`.
    pub fn new(params: HddParams, capacity_bytes: u64) -> Result<Self, SimError> {
        params.validate()?;
        if capacity_bytes == 0 {
            return Err(SimError::InvalidParam {
                name: "capacity_bytes",
                reason: "must be > 0",
            });
        }
        Ok(HddModel {
            rev_ns: 60e9 / params.rpm as f64,
            params,
            capacity_bytes,
            pending: VecDeque::new(),
            in_service: None,
            head_bytes: 0,
            last_end_bytes: None,
            now_ns: 0,
        })
    }

    /// The parameters.
    pub fn params(&self) -> &HddParams {
        &self.params
    }

    /// The nominal figures these parameters imply (random 4K IOPS at QD1 and QD32,
    /// sequential MB/s), computed by running a fresh copy in virtual time.
    pub fn nominal(&self) -> Nominal {
        Nominal::of(self)
    }

    /// Media rate at `offset_bytes`, MB/s.
    pub fn zone_mb_s(&self, offset_bytes: u64) -> f64 {
        let frac = (offset_bytes as f64 / self.capacity_bytes as f64).clamp(0.0, 1.0);
        self.params.outer_zone_mb_s
            - (self.params.outer_zone_mb_s - self.params.inner_zone_mb_s) * frac
    }

    /// Bytes in one track (one revolution) at `offset_bytes`.
    pub fn track_bytes(&self, offset_bytes: u64) -> f64 {
        self.zone_mb_s(offset_bytes) * 1e6 * self.rev_ns / 1e9
    }

    /// Seek time in ns from `from_bytes` to `to_bytes`: 0 within one track, else
    /// `t2t + (full - t2t) * sqrt(distance / capacity)`.
    pub fn seek_ns(&self, from_bytes: u64, to_bytes: u64) -> u64 {
        let dist = from_bytes.abs_diff(to_bytes);
        if (dist as f64) < self.track_bytes(to_bytes) {
            return 0;
        }
        let frac = (dist as f64 / self.capacity_bytes as f64).min(1.0);
        let p = &self.params;
        ms_to_ns(
            p.track_to_track_seek_ms
                + (p.full_stroke_seek_ms - p.track_to_track_seek_ms) * frac.sqrt(),
        )
    }

    fn angle_of(&self, offset_bytes: u64) -> f64 {
        let t = offset_bytes as f64 / self.track_bytes(offset_bytes);
        t - t.floor()
    }

    /// Positioning time (overhead + seek + rotational wait) in ns of `op` if the
    /// actuator starts on it at `start_ns`; 0 for a sequential continuation.
    pub fn positioning_ns(&self, start_ns: u64, op: &SimOp) -> u64 {
        match op.kind {
            SimOpKind::Read | SimOpKind::Write { .. } => {}
            SimOpKind::Flush | SimOpKind::Trim => return 0,
        }
        if self.last_end_bytes == Some(op.offset_bytes) {
            return 0;
        }
        let overhead = ms_to_ns(self.params.command_overhead_ms);
        let seek = self.seek_ns(self.head_bytes, op.offset_bytes);
        let ready = start_ns + overhead + seek;
        let head_angle = (ready as f64 % self.rev_ns) / self.rev_ns;
        let mut wait = self.angle_of(op.offset_bytes) - head_angle;
        if wait < 0.0 {
            wait += 1.0;
        }
        overhead + seek + (wait * self.rev_ns) as u64
    }

    /// Full service time in ns of `op` started at `start_ns`.
    fn service_ns(&self, start_ns: u64, op: &SimOp) -> u64 {
        let body = match op.kind {
            SimOpKind::Read | SimOpKind::Write { .. } => {
                self.positioning_ns(start_ns, op)
                    + xfer_ns(op.len_bytes, self.zone_mb_s(op.offset_bytes))
            }
            SimOpKind::Flush => ms_to_ns(self.params.flush_ms),
            SimOpKind::Trim => ms_to_ns(self.params.trim_ms),
        };
        body + op.extra_ns
    }

    /// Picks the next request at `t_ns` and puts it on the actuator.
    fn dispatch(&mut self, t_ns: u64) {
        let Some(first) = self.pending.front() else {
            return;
        };
        // Requests that have arrived by t; if none, the earliest arrival.
        let start = t_ns.max(first.arrival_ns);
        let arrived = self
            .pending
            .iter()
            .take_while(|p| p.arrival_ns <= start)
            .count()
            .max(1);
        // A flush is a barrier: nothing behind it is served before it.
        let barrier = self
            .pending
            .iter()
            .position(|p| p.op.kind == SimOpKind::Flush)
            .unwrap_or(usize::MAX);
        let window = if self.params.ncq {
            self.params.ncq_depth as usize
        } else {
            1
        };
        let n = arrived.min(window).min(barrier).max(1);
        let mut best = 0usize;
        let mut best_pos = u64::MAX;
        for (i, p) in self.pending.iter().take(n).enumerate() {
            let pos = self.positioning_ns(start, &p.op);
            if pos < best_pos {
                best_pos = pos;
                best = i;
            }
        }
        let Some(chosen) = self.pending.remove(best) else {
            return;
        };
        let done = start + self.service_ns(start, &chosen.op);
        if let SimOpKind::Read | SimOpKind::Write { .. } = chosen.op.kind {
            self.head_bytes = chosen.op.end_bytes();
            self.last_end_bytes = Some(chosen.op.end_bytes());
        }
        self.in_service = Some((chosen.tag, done));
    }
}

impl SimModel for HddModel {
    fn kind(&self) -> &'static str {
        "hdd"
    }

    fn capacity_bytes(&self) -> u64 {
        self.capacity_bytes
    }

    fn submit(&mut self, now_ns: u64, tag: u64, op: SimOp) {
        self.now_ns = self.now_ns.max(now_ns);
        self.pending.push_back(Pending {
            tag,
            arrival_ns: self.now_ns,
            op,
        });
        if self.in_service.is_none() {
            self.dispatch(self.now_ns);
        }
    }

    fn next_event_ns(&self) -> Option<u64> {
        self.in_service.map(|(_, done)| done)
    }

    fn advance(&mut self, now_ns: u64, done: &mut Vec<u64>) {
        self.now_ns = self.now_ns.max(now_ns);
        while let Some((tag, t)) = self.in_service {
            if t > self.now_ns {
                break;
            }
            done.push(tag);
            self.in_service = None;
            self.dispatch(t);
        }
    }

    fn outstanding(&self) -> usize {
        self.pending.len() + usize::from(self.in_service.is_some())
    }

    fn fresh(&self) -> Box<dyn SimModel> {
        Box::new(HddModel {
            pending: VecDeque::new(),
            in_service: None,
            head_bytes: 0,
            last_end_bytes: None,
            now_ns: 0,
            ..self.clone()
        })
    }
}
