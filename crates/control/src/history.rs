//! The node's recent performance history for `GET /api/v1/history`: once a
//! second a sampler reads the counters the layers already keep (per-LU command
//! counters of the SCSI targets, per-session read/write counters of the iSCSI
//! server, the caches' hit, dirty and destage figures) and turns their change
//! since the last second into rates, kept for the last hour.
//!
//! What it does not do: count anything on the data path itself (it only reads
//! the counters the metrics read too), or keep anything across a restart.
//!
//! Key invariant: memory is bounded. Every series is a ring of at most
//! [`WINDOW_SECS_MAX`] samples allocated once when the series appears; series
//! are keyed by configured objects (LUNs, portals, caches) or by live sessions
//! (paths, at most [`PATH_SERIES_MAX`]), and a series with no sample in the last
//! hour is dropped.

use parking_lot::Mutex;
use serde_json::{json, Map, Value};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// Samples kept per series: one hour at one a second.
pub const WINDOW_SECS_MAX: usize = 3600;
/// Window `GET /api/v1/history` answers without `window=`.
pub const WINDOW_SECS_DEFAULT: usize = 300;
/// Most path series (initiator and portal) kept at once.
pub const PATH_SERIES_MAX: usize = 1024;

/// Cumulative read/write counters of one object.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Io {
    pub reads: u64,
    pub writes: u64,
    pub read_bytes: u64,
    pub write_bytes: u64,
    pub latency_sum_us: u64,
}

impl Io {
    /// What happened since `prev`; counters that went back (the object was made
    /// anew) count from zero.
    fn since(self, prev: Io) -> Io {
        if self.reads < prev.reads
            || self.writes < prev.writes
            || self.read_bytes < prev.read_bytes
            || self.write_bytes < prev.write_bytes
            || self.latency_sum_us < prev.latency_sum_us
        {
            return self;
        }
        Io {
            reads: self.reads - prev.reads,
            writes: self.writes - prev.writes,
            read_bytes: self.read_bytes - prev.read_bytes,
            write_bytes: self.write_bytes - prev.write_bytes,
            latency_sum_us: self.latency_sum_us - prev.latency_sum_us,
        }
    }

    fn add(&mut self, o: Io) {
        self.reads += o.reads;
        self.writes += o.writes;
        self.read_bytes += o.read_bytes;
        self.write_bytes += o.write_bytes;
        self.latency_sum_us += o.latency_sum_us;
    }

    /// The rates of this change over `dt` seconds, at `t_ms`.
    fn sample(self, t_ms: u64, dt: f64) -> IoSample {
        let ops = self.reads + self.writes;
        IoSample {
            t_ms,
            read_iops: (self.reads as f64 / dt) as f32,
            write_iops: (self.writes as f64 / dt) as f32,
            read_mbs: (self.read_bytes as f64 / dt / 1e6) as f32,
            write_mbs: (self.write_bytes as f64 / dt / 1e6) as f32,
            latency_us: if ops == 0 {
                0.0
            } else {
                (self.latency_sum_us as f64 / ops as f64) as f32
            },
        }
    }
}

/// Cumulative figures of one cache.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct CacheFigures {
    pub read_hits: u64,
    pub read_misses: u64,
    pub write_hits: u64,
    pub write_misses: u64,
    pub destaged_bytes: u64,
    pub dirty_bytes: u64,
    pub occupancy_pct: f64,
}

impl CacheFigures {
    /// Reads a cache's status as `GET /api/v1/caches` shows it (a detached cache
    /// has none of the counters: zeroes).
    pub(crate) fn of_status(s: &Value) -> CacheFigures {
        let n = |k: &str| s[k].as_u64().unwrap_or(0);
        CacheFigures {
            read_hits: n("read_hits"),
            read_misses: n("read_misses"),
            write_hits: n("write_hits"),
            write_misses: n("write_misses"),
            destaged_bytes: n("destaged_bytes"),
            dirty_bytes: n("dirty_bytes"),
            occupancy_pct: s["occupancy_percent"].as_f64().unwrap_or(0.0),
        }
    }

    fn sample(self, prev: CacheFigures, t_ms: u64, dt: f64) -> CacheSample {
        let d = |a: u64, b: u64| if a >= b { a - b } else { a };
        let pct = |hits: u64, misses: u64| {
            if hits + misses == 0 {
                0.0
            } else {
                (hits as f64 * 100.0 / (hits + misses) as f64) as f32
            }
        };
        CacheSample {
            t_ms,
            read_hit_pct: pct(
                d(self.read_hits, prev.read_hits),
                d(self.read_misses, prev.read_misses),
            ),
            write_hit_pct: pct(
                d(self.write_hits, prev.write_hits),
                d(self.write_misses, prev.write_misses),
            ),
            dirty_bytes: self.dirty_bytes,
            destage_mbs: (d(self.destaged_bytes, prev.destaged_bytes) as f64 / dt / 1e6) as f32,
            occupancy_pct: self.occupancy_pct as f32,
        }
    }
}

/// One session as the sampler reads it.
#[derive(Debug, Clone)]
pub(crate) struct PathReading {
    /// Tells the session apart from every other (see `iscsi::SessionInfo::id`).
    pub id: u64,
    pub initiator: String,
    pub portal: String,
    pub io: Io,
}

/// Everything the sampler reads in one second.
#[derive(Debug, Clone, Default)]
pub(crate) struct Reading {
    /// Per LUN, keyed `TARGET/LUN`.
    pub luns: Vec<(String, Io)>,
    /// Every iSCSI session (not discovery).
    pub sessions: Vec<PathReading>,
    /// Every portal of the node.
    pub portals: Vec<String>,
    /// Per cache.
    pub caches: Vec<(String, CacheFigures)>,
}

#[derive(Debug, Clone, Copy)]
struct IoSample {
    t_ms: u64,
    read_iops: f32,
    write_iops: f32,
    read_mbs: f32,
    write_mbs: f32,
    latency_us: f32,
}

#[derive(Debug, Clone, Copy)]
struct CacheSample {
    t_ms: u64,
    read_hit_pct: f32,
    write_hit_pct: f32,
    dirty_bytes: u64,
    destage_mbs: f32,
    occupancy_pct: f32,
}

trait Stamped {
    fn t_ms(&self) -> u64;
    fn to_json(&self) -> Value;
}

/// Rounds a rate for the answer (two decimals are plenty for a chart).
fn r2(v: f32) -> f64 {
    (f64::from(v) * 100.0).round() / 100.0
}

impl Stamped for IoSample {
    fn t_ms(&self) -> u64 {
        self.t_ms
    }
    fn to_json(&self) -> Value {
        json!({
            "t": self.t_ms,
            "read_iops": r2(self.read_iops),
            "write_iops": r2(self.write_iops),
            "read_mbs": r2(self.read_mbs),
            "write_mbs": r2(self.write_mbs),
            "latency_us": r2(self.latency_us),
        })
    }
}

impl Stamped for CacheSample {
    fn t_ms(&self) -> u64 {
        self.t_ms
    }
    fn to_json(&self) -> Value {
        json!({
            "t": self.t_ms,
            "read_hit_pct": r2(self.read_hit_pct),
            "write_hit_pct": r2(self.write_hit_pct),
            "dirty_bytes": self.dirty_bytes,
            "destage_mbs": r2(self.destage_mbs),
            "occupancy_pct": r2(self.occupancy_pct),
        })
    }
}

/// A series: at most [`WINDOW_SECS_MAX`] samples, allocated once.
struct Ring<T>(VecDeque<T>);

impl<T: Stamped> Ring<T> {
    fn new() -> Ring<T> {
        Ring(VecDeque::with_capacity(WINDOW_SECS_MAX))
    }

    fn push(&mut self, s: T) {
        if self.0.len() == WINDOW_SECS_MAX {
            self.0.pop_front();
        }
        self.0.push_back(s);
    }

    fn newest_ms(&self) -> u64 {
        self.0.back().map_or(0, Stamped::t_ms)
    }

    fn since(&self, from_ms: u64) -> Value {
        let start = self.0.partition_point(|s| s.t_ms() < from_ms);
        Value::Array(self.0.range(start..).map(Stamped::to_json).collect())
    }
}

fn series_json<T: Stamped>(m: &BTreeMap<String, Ring<T>>, from_ms: u64) -> Value {
    let mut out = Map::new();
    for (k, r) in m {
        let v = r.since(from_ms);
        if v.as_array().is_some_and(|a| !a.is_empty()) {
            out.insert(k.clone(), v);
        }
    }
    Value::Object(out)
}

/// Pushes `s` on the series `key` of `m`, creating it unless `m` already holds
/// `max` series.
fn push<T: Stamped>(m: &mut BTreeMap<String, Ring<T>>, key: &str, s: T, max: usize) {
    if let Some(r) = m.get_mut(key) {
        r.push(s);
    } else if m.len() < max {
        let mut r = Ring::new();
        r.push(s);
        m.insert(key.to_string(), r);
    }
}

#[derive(Default)]
struct State {
    node: Option<Ring<IoSample>>,
    luns: BTreeMap<String, Ring<IoSample>>,
    paths: BTreeMap<String, Ring<IoSample>>,
    portals: BTreeMap<String, Ring<IoSample>>,
    caches: BTreeMap<String, Ring<CacheSample>>,
    prev_luns: HashMap<String, Io>,
    prev_sessions: HashMap<u64, Io>,
    prev_caches: HashMap<String, CacheFigures>,
    last: Option<Instant>,
}

/// Bound on the LUN, portal and cache series (they follow the configuration;
/// this only guards against a runaway).
const OBJECT_SERIES_MAX: usize = 4096;

/// The node's performance history.
#[derive(Default)]
pub struct History {
    state: Mutex<State>,
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl History {
    /// Takes one second's reading: the change since the previous one, as rates
    /// over the time that passed, becomes the newest sample of every series.
    pub(crate) fn record(&self, r: Reading) {
        self.record_at(r, Instant::now(), now_ms());
    }

    fn record_at(&self, r: Reading, now: Instant, t_ms: u64) {
        let mut guard = self.state.lock();
        let st = &mut *guard;
        let dt = st
            .last
            .map_or(1.0, |l| now.duration_since(l).as_secs_f64())
            .max(0.001);
        st.last = Some(now);
        let mut node = Io::default();
        let mut prev_luns = HashMap::with_capacity(r.luns.len());
        for (k, io) in &r.luns {
            let d = io.since(st.prev_luns.get(k).copied().unwrap_or_default());
            node.add(d);
            push(&mut st.luns, k, d.sample(t_ms, dt), OBJECT_SERIES_MAX);
            prev_luns.insert(k.clone(), *io);
        }
        st.prev_luns = prev_luns;
        st.node
            .get_or_insert_with(Ring::new)
            .push(node.sample(t_ms, dt));
        let mut paths: BTreeMap<String, Io> = BTreeMap::new();
        let mut portals: BTreeMap<String, Io> = r
            .portals
            .iter()
            .map(|p| (p.clone(), Io::default()))
            .collect();
        let mut prev_sessions = HashMap::with_capacity(r.sessions.len());
        for s in &r.sessions {
            let d =
                s.io.since(st.prev_sessions.get(&s.id).copied().unwrap_or_default());
            prev_sessions.insert(s.id, s.io);
            paths
                .entry(format!("{}@{}", s.initiator, s.portal))
                .or_default()
                .add(d);
            portals.entry(s.portal.clone()).or_default().add(d);
        }
        st.prev_sessions = prev_sessions;
        for (k, d) in paths {
            push(&mut st.paths, &k, d.sample(t_ms, dt), PATH_SERIES_MAX);
        }
        for (k, d) in portals {
            push(&mut st.portals, &k, d.sample(t_ms, dt), OBJECT_SERIES_MAX);
        }
        let mut prev_caches = HashMap::with_capacity(r.caches.len());
        for (k, f) in &r.caches {
            let prev = st.prev_caches.get(k).copied().unwrap_or_default();
            push(
                &mut st.caches,
                k,
                f.sample(prev, t_ms, dt),
                OBJECT_SERIES_MAX,
            );
            prev_caches.insert(k.clone(), *f);
        }
        st.prev_caches = prev_caches;
        // series of objects gone for a whole window
        let horizon = t_ms.saturating_sub(WINDOW_SECS_MAX as u64 * 1000);
        st.luns.retain(|_, r| r.newest_ms() >= horizon);
        st.paths.retain(|_, r| r.newest_ms() >= horizon);
        st.portals.retain(|_, r| r.newest_ms() >= horizon);
        st.caches.retain(|_, r| r.newest_ms() >= horizon);
    }

    /// The samples of the last `window_secs` (at most [`WINDOW_SECS_MAX`]), oldest
    /// first, as `GET /api/v1/history` answers them.
    pub fn json(&self, window_secs: usize) -> Value {
        self.json_at(window_secs, now_ms())
    }

    fn json_at(&self, window_secs: usize, t_ms: u64) -> Value {
        let window = window_secs.min(WINDOW_SECS_MAX) as u64;
        // a sample stamped within the window (one second of slack for the tick)
        let from = t_ms.saturating_sub(window * 1000 + 999);
        let st = self.state.lock();
        json!({
            "interval_s": 1,
            "window_s": window,
            "node": st.node.as_ref().map_or(Value::Array(Vec::new()), |r| r.since(from)),
            "luns": series_json(&st.luns, from),
            "paths": series_json(&st.paths, from),
            "portals": series_json(&st.portals, from),
            "caches": series_json(&st.caches, from),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn io(reads: u64, read_bytes: u64, lat: u64) -> Io {
        Io {
            reads,
            read_bytes,
            latency_sum_us: lat,
            ..Io::default()
        }
    }

    fn reading(lun: Io, session: Io) -> Reading {
        Reading {
            luns: vec![("t/0".into(), lun)],
            sessions: vec![PathReading {
                id: 7,
                initiator: "iqn.i".into(),
                portal: "127.0.0.1:3260".into(),
                io: session,
            }],
            portals: vec!["127.0.0.1:3260".into(), "127.0.0.1:3261".into()],
            caches: vec![],
        }
    }

    #[test]
    fn rates_are_changes_over_the_time_that_passed() {
        let h = History::default();
        let t0 = Instant::now();
        h.record_at(reading(io(0, 0, 0), io(0, 0, 0)), t0, 1_000_000);
        h.record_at(
            reading(io(100, 409_600, 5_000), io(40, 163_840, 2_000)),
            t0 + Duration::from_secs(2),
            1_002_000,
        );
        let v = h.json_at(300, 1_002_000);
        let lun = &v["luns"]["t/0"];
        assert_eq!(lun.as_array().unwrap().len(), 2);
        assert_eq!(lun[1]["read_iops"], 50.0);
        assert_eq!(lun[1]["latency_us"], 50.0);
        assert_eq!(lun[1]["t"], 1_002_000);
        assert_eq!(v["node"][1]["read_iops"], 50.0);
        assert_eq!(v["paths"]["iqn.i@127.0.0.1:3260"][1]["read_iops"], 20.0);
        assert_eq!(v["portals"]["127.0.0.1:3260"][1]["read_mbs"], 0.08);
        // a portal with no session has a series of zeroes
        assert_eq!(v["portals"]["127.0.0.1:3261"][1]["read_iops"], 0.0);
        // no command: latency 0
        assert_eq!(lun[0]["latency_us"], 0.0);
    }

    #[test]
    fn rings_stay_bounded_and_windows_cut_old_samples() {
        let h = History::default();
        let t0 = Instant::now();
        for i in 0..(WINDOW_SECS_MAX as u64 + 10) {
            h.record_at(
                reading(io(i, 0, 0), io(i, 0, 0)),
                t0 + Duration::from_secs(i),
                i * 1000,
            );
        }
        let last = (WINDOW_SECS_MAX as u64 + 9) * 1000;
        let st = h.state.lock();
        assert_eq!(st.luns["t/0"].0.len(), WINDOW_SECS_MAX);
        assert_eq!(st.luns["t/0"].0.capacity(), WINDOW_SECS_MAX);
        drop(st);
        let v = h.json_at(10, last);
        let n = v["node"].as_array().unwrap();
        assert!((10..=11).contains(&n.len()), "{}", n.len());
        assert!(n
            .windows(2)
            .all(|w| w[0]["t"].as_u64() < w[1]["t"].as_u64()));
        assert_eq!(
            h.json_at(99_999, last)["node"].as_array().unwrap().len(),
            WINDOW_SECS_MAX
        );
    }

    #[test]
    fn a_session_made_anew_counts_from_zero() {
        assert_eq!(io(5, 10, 1).since(io(9, 20, 3)), io(5, 10, 1));
    }

    #[test]
    fn cache_hit_rates_are_per_second() {
        let a = CacheFigures {
            read_hits: 10,
            read_misses: 10,
            ..CacheFigures::default()
        };
        let b = CacheFigures {
            read_hits: 40,
            read_misses: 20,
            destaged_bytes: 2_000_000,
            dirty_bytes: 5,
            ..CacheFigures::default()
        };
        let s = b.sample(a, 1, 2.0);
        assert_eq!(s.read_hit_pct, 75.0);
        assert_eq!(s.write_hit_pct, 0.0);
        assert_eq!(s.destage_mbs, 1.0);
        assert_eq!(s.dirty_bytes, 5);
    }
}
