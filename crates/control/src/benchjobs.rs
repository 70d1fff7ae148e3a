//! Benchmark jobs the management API starts (`POST /api/v1/bench`): one of
//! `freesan bench`'s standard patterns, run by the bench engine inside the node
//! against one of its own LUNs through the node's first portal (loopback iSCSI,
//! the same path an initiator takes), as load on production.
//!
//! What it does not do: start a second process, or run two jobs at once (a
//! second start while one runs is refused); it keeps the last [`JOBS_KEPT`]
//! jobs, in memory only.
//!
//! Key invariant: a job always ends (done or failed): the whole run is bounded
//! by its length plus a fixed allowance for the login and the ramp-up.

use parking_lot::Mutex;
use serde_json::{json, Value};
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Jobs kept for `GET /api/v1/bench`.
pub const JOBS_KEPT: usize = 20;
/// Longest measured window of a job.
pub const SECS_MAX: u32 = 60;
/// Time a job may take beyond its measured window (login, ramp-up, logout).
const ALLOWANCE: Duration = Duration::from_secs(60);
/// The initiator name the node's own benchmark logs in with.
pub const INITIATOR_NAME: &str = "iqn.2026-01.org.freesan:node-bench";

/// What a job asks for.
#[derive(Debug, Clone)]
pub struct JobRequest {
    /// Target IQN.
    pub target: String,
    /// LUN number.
    pub lun: u64,
    /// A pattern of the standard suite.
    pub pattern: String,
    /// Measured seconds, 1 to [`SECS_MAX`].
    pub secs: u32,
}

#[derive(Debug, Clone)]
enum JobState {
    Running,
    Done(Value),
    Failed(String),
}

#[derive(Debug, Clone)]
struct Job {
    id: u64,
    req: JobRequest,
    state: JobState,
    started_ms: u64,
    finished_ms: Option<u64>,
}

impl Job {
    fn to_json(&self) -> Value {
        let (state, result, error) = match &self.state {
            JobState::Running => ("running", Value::Null, Value::Null),
            JobState::Done(r) => ("done", r.clone(), Value::Null),
            JobState::Failed(e) => ("failed", Value::Null, Value::String(e.clone())),
        };
        json!({
            "id": self.id,
            "target": self.req.target,
            "lun": self.req.lun,
            "pattern": self.req.pattern,
            "secs": self.req.secs,
            "state": state,
            "started_ms": self.started_ms,
            "finished_ms": self.finished_ms,
            "error": error,
            "result": result,
        })
    }
}

#[derive(Default)]
struct Jobs {
    list: VecDeque<Job>,
    next_id: u64,
}

/// The node's benchmark jobs.
#[derive(Default)]
pub struct BenchJobs {
    jobs: Arc<Mutex<Jobs>>,
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Names of the standard patterns.
pub fn patterns() -> Vec<String> {
    bench::Suite::standard()
        .workloads
        .into_iter()
        .map(|w| w.name)
        .collect()
}

/// Whether the standard pattern `name` writes.
pub fn pattern_writes(name: &str) -> bool {
    bench::Suite::standard()
        .get(name)
        .is_some_and(|w| w.read_pct < 100)
}

/// The figures of a finished run the API answers.
fn result_json(r: &bench::RunResult) -> Value {
    json!({
        "iops": r.iops,
        "mbs": r.mb_per_sec,
        "latency_us_mean": r.latency.avg_us,
        "latency_us_p99": r.latency.p99_us,
        "read_iops": r.read_iops,
        "write_iops": r.write_iops,
        "errors": r.errors(),
        "first_error": r.first_error,
        "measured_secs": r.measured_secs,
    })
}

impl BenchJobs {
    /// Every kept job, oldest first, with the patterns known.
    pub fn json(&self) -> Value {
        let j = self.jobs.lock();
        json!({
            "patterns": patterns(),
            "jobs": j.list.iter().map(Job::to_json).collect::<Vec<_>>(),
        })
    }

    /// Starts `req` against `portal` (the node's first portal) with `chap`;
    /// answers the job's id, or why not (another job runs).
    pub fn start(
        &self,
        req: JobRequest,
        portal: SocketAddr,
        chap: Option<(String, String)>,
    ) -> Result<u64, api::ApiError> {
        let Some(mut w) = bench::Suite::standard().get(&req.pattern).cloned() else {
            return Err(api::ApiError::BadRequest(format!(
                "unknown pattern {:?} (known: {})",
                req.pattern,
                patterns().join(", ")
            )));
        };
        if !(1..=SECS_MAX).contains(&req.secs) {
            return Err(api::ApiError::BadRequest(format!(
                "secs must be 1 to {SECS_MAX}"
            )));
        }
        w.duration_secs = f64::from(req.secs);
        w.ramp_up_secs = (w.duration_secs / 5.0).min(2.0);
        let id = {
            let mut j = self.jobs.lock();
            if let Some(r) = j.list.iter().find(|x| matches!(x.state, JobState::Running)) {
                return Err(api::ApiError::Conflict(format!(
                    "benchmark job {} is running",
                    r.id
                )));
            }
            j.next_id += 1;
            let id = j.next_id;
            if j.list.len() == JOBS_KEPT {
                j.list.pop_front();
            }
            j.list.push_back(Job {
                id,
                req: req.clone(),
                state: JobState::Running,
                started_ms: now_ms(),
                finished_ms: None,
            });
            id
        };
        tracing::info!(job = id, target = %req.target, lun = req.lun, pattern = %req.pattern, secs = req.secs, "benchmark job started");
        let jobs = self.jobs.clone();
        let limit = Duration::from_secs(u64::from(req.secs)) + ALLOWANCE;
        tokio::spawn(async move {
            let outcome = match tokio::time::timeout(limit, run(&req, portal, chap, &w)).await {
                Ok(Ok(v)) => JobState::Done(v),
                Ok(Err(e)) => JobState::Failed(e),
                Err(_) => JobState::Failed(format!("did not finish within {} s", limit.as_secs())),
            };
            if let JobState::Failed(e) = &outcome {
                tracing::warn!(job = id, error = %e, "benchmark job failed");
            }
            let mut j = jobs.lock();
            if let Some(job) = j.list.iter_mut().find(|x| x.id == id) {
                job.state = outcome;
                job.finished_ms = Some(now_ms());
            }
        });
        Ok(id)
    }
}

/// Logs in to `portal`, runs `w` on the LUN, logs out.
async fn run(
    req: &JobRequest,
    portal: SocketAddr,
    chap: Option<(String, String)>,
    w: &bench::Workload,
) -> Result<Value, String> {
    // an unspecified listening address is reached on loopback
    let mut addr = portal;
    if addr.ip().is_unspecified() {
        addr.set_ip(match addr {
            SocketAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
            SocketAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
        });
    }
    let host = match addr {
        SocketAddr::V4(a) => a.to_string(),
        SocketAddr::V6(a) => format!("[{}]:{}", a.ip(), a.port()),
    };
    let url = format!("iscsi://{host}/{}/{}", req.target, req.lun);
    let opts = initiator::OpenOptions {
        initiator_name: INITIATOR_NAME.to_string(),
        single_path: true,
        chap,
        ..initiator::OpenOptions::default()
    };
    let mp = Arc::new(
        initiator::open_multipath(&url, &opts)
            .await
            .map_err(|e| format!("logging in to {url}: {e}"))?,
    );
    let r = bench::run_with(
        mp.clone() as block::VolumeRef,
        w,
        bench::RunOptions::default(),
    )
    .await;
    mp.logout().await;
    let r = r.map_err(|e| format!("running {}: {e}", w.name))?;
    if r.iops == 0.0 && r.errors() > 0 {
        return Err(format!(
            "every I/O failed: {}",
            r.first_error.as_deref().unwrap_or("unknown error")
        ));
    }
    Ok(result_json(&r))
}
