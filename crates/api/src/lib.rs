//! The management API of a freesan node: REST with JSON bodies over the control
//! plane. The CLI (and later the web console) go through it.
//!
//! What it does not do: any data-path work, or decide anything itself; every
//! request is answered by the node's [`Control`] implementation. It listens on
//! loopback unless the configuration says otherwise.
//!
//! Key invariant: no handler runs before the [`guard`] has checked the Host and
//! Origin headers and verified a bearer token ([`tokens`]) whose role allows the
//! method; every changing request an authenticated caller makes is written to the
//! [`audit`] log. Connections are bounded in total and per source ([`server`]).
//!
//! `GET /metrics` answers the node's metrics in the OpenMetrics text format
//! (docs/metrics.md), behind the same token check (a read-only token is enough).
//!
//! Routes (all under `/api/v1`; `GET /api/v1/openapi.json` describes them all,
//! generated from the handlers themselves):
//! - `GET  /status` — the node: version, portals, targets, LUNs, pools.
//! - `GET  /audit?limit=N` — the last N (default 100, at most 1000) audit entries.
//! - `GET  /pools` — every pool's status; `GET /pools/{name}` — one.
//! - `POST /pools/{name}/scrub` — start a scrub.
//! - `POST /pools/{name}/spares` `{"disk": NAME}` — add a configured disk as a spare.
//! - `POST /pools/{name}/replace` `{"position": N, "disk": NAME}` — replace a member.
//! - `POST /pools/{name}/fail` `{"position": N, "force": false}` — mark a member failed
//!   (administrative); refused (409) beyond the redundancy the pool has left
//!   unless `force` is true.
//! - `POST /pools/{name}/rebuild-rate` `{"mb_s": N}` — cap rebuild, resync and scrub
//!   at N MB/s (0 = uncapped); takes effect at once and persists in the pool.
//! - `GET  /history?window=SECS` — the node's rates once a second over the last
//!   SECS (default 300, 1 to 3600): `{"interval_s": 1, "node": [S], "luns":
//!   {"TARGET/LUN": [S]}, "paths": {"INITIATOR@PORTAL": [S]}, "portals": {"PORTAL":
//!   [S]}, "caches": {"NAME": [C]}}`, oldest first; S = `{t, read_iops, write_iops,
//!   read_mbs, write_mbs, latency_us}`, C = `{t, read_hit_pct, write_hit_pct,
//!   dirty_bytes, destage_mbs, occupancy_pct}`, t in Unix milliseconds.
//! - `GET  /bench` — the standard patterns and the last 20 benchmark jobs;
//!   `POST /bench` `{"target", "lun", "pattern", "secs": 1..=60}` — run one with
//!   `freesan bench`'s engine in the node through its first portal (load on
//!   production; a writing pattern needs `"overwrite": true`): 202 `{"id": N}`,
//!   409 while another runs.
//! - `GET  /disks` — every disk: model, size_bytes, state, errors, read and write
//!   latency, pool and role (member, spare, free...). `POST /disks/reopen`
//!   `{"name"}` takes a disk that stopped answering back once the device has
//!   answered every request sent to it (409 before, or while a LUN, cache,
//!   spare or journal still has it): it becomes free.
//! - `GET  /targets` — every target: portals, LUNs, CHAP user (never a secret),
//!   ACL, sessions. `POST /targets/{name}/chap` `{"user", "secret"}` (or
//!   `{"user": null}`) and `POST /targets/{name}/acl` `{"initiators": [...]}` —
//!   applied to new logins and kept across restarts.
//!
//! Errors come back as `{"error": "..."}` with 400 (bad request), 404 (no such pool)
//! or 409 (refused in the current state).

pub mod audit;
pub mod console;
pub mod guard;
pub mod server;
pub mod tls;
pub mod tokens;

pub use guard::ApiLimits;

use async_trait::async_trait;
use axum::extract::rejection::JsonRejection;
use axum::extract::{DefaultBodyLimit, Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{json, Value};
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

/// An administrative action on a replicated volume.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub enum ReplicaAction {
    /// Throw this node's copy away (split brain): the partner copies its data here.
    Discard,
    /// Keep this node's copy, which is not consistent (both copies discarded):
    /// it becomes the source, the partner is copied from it.
    Keep,
}

/// An administrative action on an SSD cache.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub enum CacheAction {
    /// Put the cache (created afresh on its devices) in front of its LUNs.
    Attach,
    /// Destage its dirty data and move its LUNs to the backing.
    Detach,
    /// Mark device `device` (its position) failed, as pulling it would; refused
    /// (409) when it is the last healthy device of a write-back cache (its dirty
    /// data would be lost) unless `force`.
    Fail {
        /// Device position.
        device: usize,
        /// Fail it even when that loses data not yet on the backing volume.
        force: bool,
    },
    /// Put the configured disk `disk` in place of failed device `device`.
    Replace {
        /// Device position.
        device: usize,
        /// Name of a `[[disk]]` not in use.
        disk: String,
    },
}

/// An administrative action on a pool.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(tag = "action", rename_all = "snake_case")]
pub enum PoolAction {
    /// Start a scrub.
    Scrub,
    /// Add the configured disk `disk` as a spare.
    AddSpare {
        /// Name of a `[[disk]]` not in use.
        disk: String,
    },
    /// Replace the member at `position` with the configured disk `disk`.
    Replace {
        /// Member position.
        position: usize,
        /// Name of a `[[disk]]` not in use.
        disk: String,
    },
    /// Mark the member at `position` failed; refused when the pool would be left
    /// with less redundancy than it needs to serve its data, unless `force`.
    Fail {
        /// Member position.
        position: usize,
        /// Fail it even beyond the redundancy the pool has left.
        #[serde(default)]
        force: bool,
    },
    /// Cap rebuild, resync and scrub at `mb_s` MB/s (0 = uncapped).
    SetRebuildRate {
        /// The cap in MB/s; 0 removes it.
        mb_s: u32,
    },
}

/// `POST /api/v1/bench`: run a standard pattern against a LUN of this node.
#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BenchRequest {
    /// Target IQN.
    pub target: String,
    /// LUN number.
    pub lun: u64,
    /// One of the standard patterns (`GET /api/v1/bench` lists them).
    pub pattern: String,
    /// Measured seconds, 1 to 60.
    pub secs: u32,
    /// Must be true for a pattern that writes: it overwrites the LUN's data.
    #[serde(default)]
    pub overwrite: bool,
}

/// A change of who may log in to a target (Debug without the secret).
#[derive(Clone, PartialEq, Eq)]
pub enum TargetAccess {
    /// CHAP (user, secret); None: CHAP off.
    Chap(Option<(String, String)>),
    /// The initiators that may log in; empty: any.
    Acl(Vec<String>),
}

impl std::fmt::Debug for TargetAccess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TargetAccess::Chap(c) => f
                .debug_tuple("Chap")
                .field(&c.as_ref().map(|(user, _)| (user, "***")))
                .finish(),
            TargetAccess::Acl(a) => f.debug_tuple("Acl").field(a).finish(),
        }
    }
}

/// Why the control plane refused a request.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// No such object.
    #[error("{0}")]
    NotFound(String),
    /// The request is malformed or names something unusable.
    #[error("{0}")]
    BadRequest(String),
    /// Refused in the current state.
    #[error("{0}")]
    Conflict(String),
    /// The node failed to carry out an accepted request.
    #[error("{0}")]
    Internal(String),
}

/// Objects the node creates (and lists) at run time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ObjectKind {
    /// A disk (file or simulated device) pools are built from.
    Disk,
    /// A RAID pool.
    Pool,
    /// A LUN of a target.
    Lun,
    /// A host group of a target (LUN masking).
    HostGroup,
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let code = match self {
            ApiError::NotFound(_) => StatusCode::NOT_FOUND,
            ApiError::BadRequest(_) => StatusCode::BAD_REQUEST,
            ApiError::Conflict(_) => StatusCode::CONFLICT,
            ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        };
        (code, Json(json!({ "error": self.to_string() }))).into_response()
    }
}

/// What the node exposes to the API.
#[async_trait]
pub trait Control: Send + Sync + 'static {
    /// The node's status.
    fn status(&self) -> Value;
    /// Every pool's status.
    fn pools(&self) -> Vec<Value>;
    /// One pool's status.
    fn pool(&self, name: &str) -> Option<Value>;
    /// Carries out an action on a pool; answers with the pool's new status.
    async fn pool_action(&self, name: &str, action: PoolAction) -> Result<Value, ApiError>;
    /// The node's metrics for `GET /metrics`: the content type and the text, in
    /// the OpenMetrics format when `openmetrics` (the client accepts it), else in
    /// the Prometheus text format 0.0.4; None (404) by default.
    fn metrics(&self, _openmetrics: bool) -> Option<(&'static str, String)> {
        None
    }
    /// Status of every replicated volume (HA pair); none by default.
    fn replicas(&self) -> Vec<Value> {
        Vec::new()
    }
    /// Carries out an action on a replicated volume; answers with its new status.
    async fn replica_action(&self, name: &str, _action: ReplicaAction) -> Result<Value, ApiError> {
        Err(ApiError::NotFound(format!(
            "no replicated volume named {name}"
        )))
    }
    /// Every SSD cache's status (hit rates, dirty bytes, destage rate, advisor).
    fn caches(&self) -> Vec<Value> {
        Vec::new()
    }
    /// One cache's status.
    fn cache(&self, _name: &str) -> Option<Value> {
        None
    }
    /// Carries out an action on a cache; answers with the cache's new status.
    async fn cache_action(&self, name: &str, _action: CacheAction) -> Result<Value, ApiError> {
        Err(ApiError::NotFound(format!("no cache named {name:?}")))
    }
    /// Grows a LUN (`{"target", "lun", "size"}`) while it serves.
    async fn resize_lun(&self, _body: Value) -> Result<Value, ApiError> {
        Err(ApiError::NotFound("this node cannot resize LUNs".into()))
    }
    /// Takes a disk that stopped answering back (`{"name"}`), now that it
    /// answers again: it becomes free.
    async fn reopen_disk(&self, _body: Value) -> Result<Value, ApiError> {
        Err(ApiError::NotFound(
            "this node cannot take disks back".into(),
        ))
    }
    /// Creates an object described by `body` (the config file's fields as JSON)
    /// while the node runs; answers with its description.
    async fn create(&self, kind: ObjectKind, _body: Value) -> Result<Value, ApiError> {
        Err(ApiError::NotFound(format!(
            "this node cannot create {kind:?} objects"
        )))
    }
    /// Deletes the object `body` names.
    async fn delete(&self, kind: ObjectKind, _body: Value) -> Result<Value, ApiError> {
        Err(ApiError::NotFound(format!(
            "this node cannot delete {kind:?} objects"
        )))
    }
    /// Lists the objects of `kind`.
    async fn list(&self, _kind: ObjectKind) -> Vec<Value> {
        Vec::new()
    }
    /// The node's events with a sequence number above `since`, oldest first, at
    /// most `limit`: `{"last_seq": N, "events": [...]}`. When there is none yet,
    /// waits up to `wait` for one (long poll). A `since` past `last_seq` (a
    /// cursor of an earlier run whose last events never reached the disk, whose
    /// numbers this run gives again) reads every event of this run. None kept
    /// by default.
    async fn events(&self, _since: u64, _limit: usize, _wait: std::time::Duration) -> Value {
        json!({ "last_seq": 0, "events": [] })
    }
    /// Every target: portals, LUNs, CHAP (never a secret), ACL, sessions.
    fn targets(&self) -> Vec<Value> {
        Vec::new()
    }
    /// Changes who may log in to target `name` (applies to new logins, kept
    /// across restarts); answers the target as `targets` shows it.
    async fn target_access(&self, name: &str, _change: TargetAccess) -> Result<Value, ApiError> {
        Err(ApiError::NotFound(format!("no target named {name}")))
    }
    /// The benchmark jobs: `{"patterns": [...], "jobs": [...]}`.
    fn bench_jobs(&self) -> Value {
        json!({ "patterns": [], "jobs": [] })
    }
    /// Starts a benchmark job; answers `{"id": N}`.
    async fn bench_start(&self, _req: BenchRequest) -> Result<Value, ApiError> {
        Err(ApiError::NotFound("this node cannot run benchmarks".into()))
    }
    /// The node's rates over the last `window_secs` seconds (see
    /// `GET /api/v1/history`); none kept by default.
    fn history(&self, _window_secs: usize) -> Value {
        json!({ "interval_s": 1, "node": [], "luns": {}, "paths": {}, "portals": {}, "caches": {} })
    }
    /// Reads the configuration file again and applies what can change live
    /// (targets, CHAP, ACLs); answers what was applied and what needs a restart.
    async fn reload(&self) -> Result<Value, ApiError> {
        Err(ApiError::NotFound("this node cannot reload".into()))
    }
}

#[utoipa::path(post, path = "/api/v1/reload", tag = "node",
    summary = "Read the configuration file again and apply what can change live (targets, CHAP, ACLs, host groups)",
    responses((status = 200, description = "{\"applied\": [...], \"not_applied\": [...]}", body = Value),
        (status = 400, description = "the file is invalid: nothing changed", body = ErrorBody),
        (status = 404, description = "this node cannot reload", body = ErrorBody)))]
async fn reload(State(c): State<Ctl>) -> Result<Json<Value>, ApiError> {
    c.reload().await.map(Json)
}

/// `GET /api/v1/history` query.
#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
struct HistoryQuery {
    /// Seconds of history (default 300, 1 to 3600).
    window: Option<usize>,
}

/// Longest window of `GET /api/v1/history`.
pub const HISTORY_WINDOW_MAX: usize = 3600;

/// Longest a stopping API server waits for the changes still running (a
/// cache detach drains, a pool swaps a member).
pub const CHANGES_AT_STOP_MAX: std::time::Duration = std::time::Duration::from_secs(60);

#[utoipa::path(get, path = "/api/v1/history", tag = "node",
    summary = "The node's rates once a second over the last window seconds: node, per LUN, per path (initiator@portal), per portal, per cache; oldest first",
    params(HistoryQuery),
    responses((status = 200, description = "{\"interval_s\": 1, \"node\": [S], \"luns\": {\"TARGET/LUN\": [S]}, \"paths\": {\"INITIATOR@PORTAL\": [S]}, \"portals\": {\"PORTAL\": [S]}, \"caches\": {\"NAME\": [C]}}; S = {t, read_iops, write_iops, read_mbs, write_mbs, latency_us}, C = {t, read_hit_pct, write_hit_pct, dirty_bytes, destage_mbs, occupancy_pct}", body = Value),
        (status = 400, description = "malformed request", body = ErrorBody)))]
async fn history(
    State(c): State<Ctl>,
    q: Result<Query<HistoryQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    let Query(q) = q.map_err(|e| ApiError::BadRequest(e.body_text()))?;
    let window = q.window.unwrap_or(300);
    if !(1..=HISTORY_WINDOW_MAX).contains(&window) {
        return Err(ApiError::BadRequest(format!(
            "window must be 1 to {HISTORY_WINDOW_MAX} seconds"
        )));
    }
    // built off the async workers (the data path shares them), two at once: a
    // long window over many LUNs and paths is large, and any token may ask
    static AT_ONCE: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(2);
    let _turn = AT_ONCE
        .acquire()
        .await
        .map_err(|e| ApiError::Internal(format!("history: {e}")))?;
    let v = tokio::task::spawn_blocking(move || c.history(window))
        .await
        .map_err(|e| ApiError::Internal(format!("history: {e}")))?;
    Ok(Json(v))
}

#[utoipa::path(get, path = "/api/v1/targets", tag = "targets",
    summary = "Every target: name, portals, LUNs (lun, size_bytes, backing, pool, cache, replicated), chap ({user, mutual} or null; never a secret), acl (allowed initiators, empty = any), sessions (initiator, isid, portals, connections)",
    responses((status = 200, description = "done", body = Vec<Value>)))]
async fn targets(State(c): State<Ctl>) -> Json<Value> {
    Json(Value::Array(c.targets()))
}

/// `POST /api/v1/targets/{name}/chap`.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
struct ChapBody {
    /// CHAP user; null turns CHAP off.
    user: Option<String>,
    /// CHAP secret (12 to 255 characters); with a user only.
    #[serde(default)]
    secret: Option<String>,
}

#[utoipa::path(post, path = "/api/v1/targets/{name}/chap", tag = "targets",
    summary = "Set a target's CHAP user and secret ({\"user\": null} turns CHAP off); applies to new logins and survives a restart",
    params(("name" = String, Path, description = "the target's IQN")),
    request_body = ChapBody,
    responses((status = 200, description = "the target as GET /api/v1/targets shows it", body = Value),
        (status = 400, description = "malformed request or refused by the configuration's checks", body = ErrorBody),
        (status = 404, description = "no such target", body = ErrorBody),
        (status = 409, description = "refused in the current state", body = ErrorBody)))]
async fn target_chap(
    State(c): State<Ctl>,
    Path(name): Path<String>,
    body: Result<Json<ChapBody>, JsonRejection>,
) -> Result<Json<Value>, ApiError> {
    let Json(b) = body.map_err(|e| ApiError::BadRequest(e.body_text()))?;
    let change = match (b.user, b.secret) {
        (Some(u), Some(s)) => TargetAccess::Chap(Some((u, s))),
        (None, None) => TargetAccess::Chap(None),
        (Some(_), None) => return Err(ApiError::BadRequest("a CHAP user needs a secret".into())),
        (None, Some(_)) => {
            return Err(ApiError::BadRequest(
                "a secret without a user: give both, or {\"user\": null} to turn CHAP off".into(),
            ))
        }
    };
    c.target_access(&name, change).await.map(Json)
}

/// `POST /api/v1/targets/{name}/acl`.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
struct AclBody {
    /// Initiator names (IQN or EUI) that may log in; empty: any initiator.
    initiators: Vec<String>,
}

/// Most initiators one ACL may list.
pub const ACL_INITIATORS_MAX: usize = 1024;

#[utoipa::path(post, path = "/api/v1/targets/{name}/acl", tag = "targets",
    summary = "Set the initiators that may log in to a target (empty = any); applies to new logins and survives a restart",
    params(("name" = String, Path, description = "the target's IQN")),
    request_body = AclBody,
    responses((status = 200, description = "the target as GET /api/v1/targets shows it", body = Value),
        (status = 400, description = "malformed request", body = ErrorBody),
        (status = 404, description = "no such target", body = ErrorBody),
        (status = 409, description = "refused in the current state", body = ErrorBody)))]
async fn target_acl(
    State(c): State<Ctl>,
    Path(name): Path<String>,
    body: Result<Json<AclBody>, JsonRejection>,
) -> Result<Json<Value>, ApiError> {
    let Json(b) = body.map_err(|e| ApiError::BadRequest(e.body_text()))?;
    if b.initiators.len() > ACL_INITIATORS_MAX {
        return Err(ApiError::BadRequest(format!(
            "at most {ACL_INITIATORS_MAX} initiators"
        )));
    }
    for i in &b.initiators {
        let l = i.to_ascii_lowercase();
        let ok = (l.starts_with("iqn.") || l.starts_with("eui.") || l.starts_with("naa."))
            && l.len() <= 223
            && !l.chars().any(|ch| ch.is_whitespace() || ch.is_control());
        if !ok {
            return Err(ApiError::BadRequest(format!(
                "{i:?} is not an iSCSI name (iqn., eui. or naa., at most 223 characters)"
            )));
        }
    }
    c.target_access(&name, TargetAccess::Acl(b.initiators))
        .await
        .map(Json)
}

#[utoipa::path(get, path = "/api/v1/bench", tag = "bench",
    summary = "The standard patterns and the last 20 benchmark jobs (state running, done or failed; result iops, mbs, latency_us_mean, latency_us_p99)",
    responses((status = 200, description = "{\"patterns\": [...], \"jobs\": [{id, target, lun, pattern, secs, state, started_ms, finished_ms, error, result}]}", body = Value)))]
async fn bench_jobs(State(c): State<Ctl>) -> Json<Value> {
    Json(c.bench_jobs())
}

#[utoipa::path(post, path = "/api/v1/bench", tag = "bench",
    summary = "Run a standard pattern with freesan bench's engine inside the node against one of its LUNs through its first portal: load on production (a writing pattern overwrites the LUN's data and needs overwrite: true)",
    request_body = BenchRequest,
    responses((status = 202, description = "{\"id\": N}", body = Value),
        (status = 400, description = "malformed request, unknown pattern, secs out of 1..=60, or a writing pattern without overwrite", body = ErrorBody),
        (status = 404, description = "no such target or LUN", body = ErrorBody),
        (status = 409, description = "another job is running", body = ErrorBody)))]
async fn bench_start(
    State(c): State<Ctl>,
    body: Result<Json<BenchRequest>, JsonRejection>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let Json(b) = body.map_err(|e| ApiError::BadRequest(e.body_text()))?;
    c.bench_start(b)
        .await
        .map(|v| (StatusCode::ACCEPTED, Json(v)))
}

/// `GET /api/v1/events` query.
#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
struct EventsQuery {
    /// Only events with a sequence number above this (default 0: the oldest kept).
    since: Option<u64>,
    /// At most this many (default 100, 1 to 1000).
    limit: Option<usize>,
    /// With none to give yet, wait up to this long for one (at most 30000).
    wait_ms: Option<u64>,
}

/// Longest wait of `GET /api/v1/events?wait_ms=`.
pub const EVENTS_WAIT_MS_MAX: u64 = 30_000;

#[utoipa::path(get, path = "/api/v1/events", tag = "node",
    summary = "The event log (failures, rebuilds, failovers, thresholds...), oldest first; long poll with wait_ms",
    params(EventsQuery),
    responses((status = 200, description = "{\"last_seq\": N, \"events\": [...]}", body = Value),
        (status = 400, description = "malformed request", body = ErrorBody)))]
async fn events(
    State(c): State<Ctl>,
    q: Result<Query<EventsQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    let Query(q) = q.map_err(|e| ApiError::BadRequest(e.body_text()))?;
    let limit = q.limit.unwrap_or(100).clamp(1, 1000);
    let wait = std::time::Duration::from_millis(q.wait_ms.unwrap_or(0).min(EVENTS_WAIT_MS_MAX));
    Ok(Json(c.events(q.since.unwrap_or(0), limit, wait).await))
}

#[derive(Deserialize, utoipa::ToSchema)]
struct DeviceBody {
    device: usize,
    #[serde(default)]
    force: bool,
}

#[derive(Deserialize, utoipa::ToSchema)]
struct CacheReplaceBody {
    device: usize,
    disk: String,
}

#[utoipa::path(post, path = "/api/v1/caches/{name}/fail", tag = "caches", summary = "Mark a cache device failed (refused for the last healthy device of a write-back cache unless force)", params(("name" = String, Path, description = "the object's name")), request_body = DeviceBody, responses((status = 200, description = "done", body = Value), (status = 400, description = "malformed request", body = ErrorBody), (status = 404, description = "no such object", body = ErrorBody), (status = 409, description = "refused in the current state", body = ErrorBody)))]
async fn cache_fail(
    State(c): State<Ctl>,
    Path(name): Path<String>,
    Json(b): Json<DeviceBody>,
) -> Result<Json<Value>, ApiError> {
    let a = CacheAction::Fail {
        device: b.device,
        force: b.force,
    };
    c.cache_action(&name, a).await.map(Json)
}

#[utoipa::path(post, path = "/api/v1/caches/{name}/replace", tag = "caches", summary = "Put a configured disk in place of a failed cache device", params(("name" = String, Path, description = "the object's name")), request_body = CacheReplaceBody, responses((status = 200, description = "done", body = Value), (status = 400, description = "malformed request", body = ErrorBody), (status = 404, description = "no such object", body = ErrorBody), (status = 409, description = "refused in the current state", body = ErrorBody)))]
async fn cache_replace(
    State(c): State<Ctl>,
    Path(name): Path<String>,
    Json(b): Json<CacheReplaceBody>,
) -> Result<Json<Value>, ApiError> {
    let a = CacheAction::Replace {
        device: b.device,
        disk: b.disk,
    };
    c.cache_action(&name, a).await.map(Json)
}

#[utoipa::path(post, path = "/api/v1/caches/{name}/attach", tag = "caches", summary = "Put the cache in front of its LUNs", params(("name" = String, Path, description = "the object's name")), responses((status = 200, description = "done", body = Value), (status = 400, description = "malformed request", body = ErrorBody), (status = 404, description = "no such object", body = ErrorBody), (status = 409, description = "refused in the current state", body = ErrorBody)))]
async fn cache_attach(
    State(c): State<Ctl>,
    Path(name): Path<String>,
) -> Result<Json<Value>, ApiError> {
    c.cache_action(&name, CacheAction::Attach).await.map(Json)
}

#[utoipa::path(post, path = "/api/v1/caches/{name}/detach", tag = "caches", summary = "Destage the dirty data and move the LUNs to the backing", params(("name" = String, Path, description = "the object's name")), responses((status = 200, description = "done", body = Value), (status = 400, description = "malformed request", body = ErrorBody), (status = 404, description = "no such object", body = ErrorBody), (status = 409, description = "refused in the current state", body = ErrorBody)))]
async fn cache_detach(
    State(c): State<Ctl>,
    Path(name): Path<String>,
) -> Result<Json<Value>, ApiError> {
    c.cache_action(&name, CacheAction::Detach).await.map(Json)
}

#[utoipa::path(get, path = "/api/v1/replicas", tag = "replicas", summary = "Every replicated LUN's HA state", responses((status = 200, description = "done", body = Vec<Value>), (status = 400, description = "malformed request", body = ErrorBody), (status = 404, description = "no such object", body = ErrorBody), (status = 409, description = "refused in the current state", body = ErrorBody)))]
async fn replicas(State(c): State<Ctl>) -> Json<Value> {
    Json(Value::Array(c.replicas()))
}

/// Body naming a replicated volume (names hold slashes: cluster/target/lunN).
#[derive(Deserialize, utoipa::ToSchema)]
struct ReplicaName {
    name: String,
}

#[utoipa::path(post, path = "/api/v1/replicas/discard", tag = "replicas", summary = "Throw this node's copy away (split brain): the partner copies its data here", request_body = ReplicaName, responses((status = 200, description = "done", body = Value), (status = 400, description = "malformed request", body = ErrorBody), (status = 404, description = "no such object", body = ErrorBody), (status = 409, description = "refused in the current state", body = ErrorBody)))]
async fn replica_discard(
    State(c): State<Ctl>,
    body: Result<Json<ReplicaName>, JsonRejection>,
) -> Result<Json<Value>, ApiError> {
    let Json(b) = body.map_err(|e| ApiError::BadRequest(e.body_text()))?;
    c.replica_action(&b.name, ReplicaAction::Discard)
        .await
        .map(Json)
}

#[utoipa::path(post, path = "/api/v1/replicas/keep", tag = "replicas", summary = "Keep this node's copy, which is not consistent (both copies were discarded): it becomes the source and may serve alone", request_body = ReplicaName, responses((status = 200, description = "done", body = Value), (status = 400, description = "malformed request", body = ErrorBody), (status = 404, description = "no such object", body = ErrorBody), (status = 409, description = "refused in the current state", body = ErrorBody)))]
async fn replica_keep(
    State(c): State<Ctl>,
    body: Result<Json<ReplicaName>, JsonRejection>,
) -> Result<Json<Value>, ApiError> {
    let Json(b) = body.map_err(|e| ApiError::BadRequest(e.body_text()))?;
    c.replica_action(&b.name, ReplicaAction::Keep)
        .await
        .map(Json)
}

#[utoipa::path(get, path = "/api/v1/caches", tag = "caches", summary = "Every SSD cache: hit rates, dirty data, destage, advisor", responses((status = 200, description = "done", body = Vec<Value>), (status = 400, description = "malformed request", body = ErrorBody), (status = 404, description = "no such object", body = ErrorBody), (status = 409, description = "refused in the current state", body = ErrorBody)))]
async fn caches(State(c): State<Ctl>) -> Json<Value> {
    Json(Value::Array(c.caches()))
}

#[utoipa::path(get, path = "/api/v1/caches/{name}", tag = "caches", summary = "One SSD cache", params(("name" = String, Path, description = "the object's name")), responses((status = 200, description = "done", body = Value), (status = 400, description = "malformed request", body = ErrorBody), (status = 404, description = "no such object", body = ErrorBody), (status = 409, description = "refused in the current state", body = ErrorBody)))]
async fn cache(State(c): State<Ctl>, Path(name): Path<String>) -> Result<Json<Value>, ApiError> {
    c.cache(&name)
        .map(Json)
        .ok_or_else(|| ApiError::NotFound(format!("no cache named {name:?}")))
}

type Ctl = Arc<dyn Control>;

#[utoipa::path(get, path = "/metrics", tag = "node",
    summary = "The node's metrics in the Prometheus text format, or OpenMetrics when accepted (docs/metrics.md)",
    responses((status = 200, description = "the metrics", content_type = "text/plain", body = String),
        (status = 404, description = "this node has no metrics", body = ErrorBody)))]
async fn metrics(State(c): State<Ctl>, headers: axum::http::HeaderMap) -> Response {
    let openmetrics = headers
        .get_all(axum::http::header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.contains("application/openmetrics-text"));
    // built off the async workers: a scrape reads /proc and every layer's status
    let body = tokio::task::spawn_blocking(move || c.metrics(openmetrics)).await;
    match body {
        Ok(Some((content_type, text))) => {
            ([(axum::http::header::CONTENT_TYPE, content_type)], text).into_response()
        }
        Ok(None) => ApiError::NotFound("this node has no metrics".into()).into_response(),
        Err(e) => ApiError::Internal(format!("metrics: {e}")).into_response(),
    }
}

#[utoipa::path(get, path = "/api/v1/status", tag = "node", summary = "The node: version, portals, targets, LUNs, pools, memory", responses((status = 200, description = "done", body = Value), (status = 400, description = "malformed request", body = ErrorBody), (status = 404, description = "no such object", body = ErrorBody), (status = 409, description = "refused in the current state", body = ErrorBody)))]
async fn status(State(c): State<Ctl>) -> Json<Value> {
    Json(c.status())
}

#[utoipa::path(get, path = "/api/v1/pools", tag = "pools", summary = "Every pool's status", responses((status = 200, description = "done", body = Vec<Value>), (status = 400, description = "malformed request", body = ErrorBody), (status = 404, description = "no such object", body = ErrorBody), (status = 409, description = "refused in the current state", body = ErrorBody)))]
async fn pools(State(c): State<Ctl>) -> Json<Value> {
    Json(Value::Array(c.pools()))
}

#[utoipa::path(get, path = "/api/v1/pools/{name}", tag = "pools", summary = "One pool's status", params(("name" = String, Path, description = "the object's name")), responses((status = 200, description = "done", body = Value), (status = 400, description = "malformed request", body = ErrorBody), (status = 404, description = "no such object", body = ErrorBody), (status = 409, description = "refused in the current state", body = ErrorBody)))]
async fn pool(State(c): State<Ctl>, Path(name): Path<String>) -> Result<Json<Value>, ApiError> {
    c.pool(&name)
        .map(Json)
        .ok_or_else(|| ApiError::NotFound(format!("no pool named {name:?}")))
}

#[derive(Deserialize, utoipa::ToSchema)]
struct DiskBody {
    disk: String,
}

#[derive(Deserialize, utoipa::ToSchema)]
struct ReplaceBody {
    position: usize,
    disk: String,
}

#[derive(Deserialize, utoipa::ToSchema)]
struct PositionBody {
    position: usize,
    #[serde(default)]
    force: bool,
}

#[derive(Deserialize, utoipa::ToSchema)]
struct RateBody {
    mb_s: u32,
}

async fn act(c: &Ctl, name: &str, a: PoolAction) -> Result<Json<Value>, ApiError> {
    c.pool_action(name, a).await.map(Json)
}

#[utoipa::path(post, path = "/api/v1/pools/{name}/scrub", tag = "pools", summary = "Start a scrub", params(("name" = String, Path, description = "the object's name")), responses((status = 200, description = "done", body = Value), (status = 400, description = "malformed request", body = ErrorBody), (status = 404, description = "no such object", body = ErrorBody), (status = 409, description = "refused in the current state", body = ErrorBody)))]
async fn scrub(State(c): State<Ctl>, Path(name): Path<String>) -> Result<Json<Value>, ApiError> {
    act(&c, &name, PoolAction::Scrub).await
}

#[utoipa::path(post, path = "/api/v1/pools/{name}/spares", tag = "pools", summary = "Add a configured disk as a spare", params(("name" = String, Path, description = "the object's name")), request_body = DiskBody, responses((status = 200, description = "done", body = Value), (status = 400, description = "malformed request", body = ErrorBody), (status = 404, description = "no such object", body = ErrorBody), (status = 409, description = "refused in the current state", body = ErrorBody)))]
async fn spares(
    State(c): State<Ctl>,
    Path(name): Path<String>,
    Json(b): Json<DiskBody>,
) -> Result<Json<Value>, ApiError> {
    act(&c, &name, PoolAction::AddSpare { disk: b.disk }).await
}

#[utoipa::path(post, path = "/api/v1/pools/{name}/replace", tag = "pools", summary = "Replace a member with a configured disk", params(("name" = String, Path, description = "the object's name")), request_body = ReplaceBody, responses((status = 200, description = "done", body = Value), (status = 400, description = "malformed request", body = ErrorBody), (status = 404, description = "no such object", body = ErrorBody), (status = 409, description = "refused in the current state", body = ErrorBody)))]
async fn replace(
    State(c): State<Ctl>,
    Path(name): Path<String>,
    Json(b): Json<ReplaceBody>,
) -> Result<Json<Value>, ApiError> {
    let a = PoolAction::Replace {
        position: b.position,
        disk: b.disk,
    };
    act(&c, &name, a).await
}

#[utoipa::path(post, path = "/api/v1/pools/{name}/fail", tag = "pools", summary = "Mark a member failed (refused beyond the redundancy left unless force)", params(("name" = String, Path, description = "the object's name")), request_body = PositionBody, responses((status = 200, description = "done", body = Value), (status = 400, description = "malformed request", body = ErrorBody), (status = 404, description = "no such object", body = ErrorBody), (status = 409, description = "refused in the current state", body = ErrorBody)))]
async fn fail(
    State(c): State<Ctl>,
    Path(name): Path<String>,
    Json(b): Json<PositionBody>,
) -> Result<Json<Value>, ApiError> {
    act(
        &c,
        &name,
        PoolAction::Fail {
            position: b.position,
            force: b.force,
        },
    )
    .await
}

#[utoipa::path(post, path = "/api/v1/pools/{name}/rebuild-rate", tag = "pools", summary = "Cap rebuild, resync and scrub at N MB/s (0 = uncapped)", params(("name" = String, Path, description = "the object's name")), request_body = RateBody, responses((status = 200, description = "done", body = Value), (status = 400, description = "malformed request", body = ErrorBody), (status = 404, description = "no such object", body = ErrorBody), (status = 409, description = "refused in the current state", body = ErrorBody)))]
async fn rebuild_rate(
    State(c): State<Ctl>,
    Path(name): Path<String>,
    body: Result<Json<RateBody>, JsonRejection>,
) -> Result<Json<Value>, ApiError> {
    let b = body.map_err(|e| {
        ApiError::BadRequest(format!(
            "expected a JSON body {{\"mb_s\": N}}, N a whole number of MB/s (0 = uncapped): {}",
            e.body_text()
        ))
    })?;
    act(&c, &name, PoolAction::SetRebuildRate { mb_s: b.mb_s }).await
}

fn body_of(body: Result<Json<Value>, JsonRejection>) -> Result<Value, ApiError> {
    body.map(|Json(v)| v)
        .map_err(|e| ApiError::BadRequest(e.body_text()))
}

#[utoipa::path(post, path = "/api/v1/disks", tag = "disks", summary = "Create a disk (the config file's [[disk]] fields as JSON)", request_body = Value, responses((status = 200, description = "done", body = Value), (status = 400, description = "malformed request", body = ErrorBody), (status = 404, description = "no such object", body = ErrorBody), (status = 409, description = "refused in the current state", body = ErrorBody)))]
async fn create_disk(
    State(c): State<Ctl>,
    body: Result<Json<Value>, JsonRejection>,
) -> Result<Json<Value>, ApiError> {
    c.create(ObjectKind::Disk, body_of(body)?).await.map(Json)
}

#[utoipa::path(post, path = "/api/v1/disks/reopen", tag = "disks", summary = "Take a disk that stopped answering back, once it answers again ({\"name\"}): it becomes free, for its pool's replace or add-spare", request_body = Value, responses((status = 200, description = "done", body = Value), (status = 400, description = "malformed request", body = ErrorBody), (status = 404, description = "no such object", body = ErrorBody), (status = 409, description = "refused in the current state", body = ErrorBody)))]
async fn reopen_disk(
    State(c): State<Ctl>,
    body: Result<Json<Value>, JsonRejection>,
) -> Result<Json<Value>, ApiError> {
    c.reopen_disk(body_of(body)?).await.map(Json)
}

#[utoipa::path(post, path = "/api/v1/pools", tag = "pools", summary = "Create a RAID pool (the config file's [[pool]] fields as JSON)", request_body = Value, responses((status = 200, description = "done", body = Value), (status = 400, description = "malformed request", body = ErrorBody), (status = 404, description = "no such object", body = ErrorBody), (status = 409, description = "refused in the current state", body = ErrorBody)))]
async fn create_pool(
    State(c): State<Ctl>,
    body: Result<Json<Value>, JsonRejection>,
) -> Result<Json<Value>, ApiError> {
    c.create(ObjectKind::Pool, body_of(body)?).await.map(Json)
}

#[utoipa::path(post, path = "/api/v1/luns", tag = "luns", summary = "Create a LUN ({\"target\", and the config file's [[target.lun]] fields})", request_body = Value, responses((status = 200, description = "done", body = Value), (status = 400, description = "malformed request", body = ErrorBody), (status = 404, description = "no such object", body = ErrorBody), (status = 409, description = "refused in the current state", body = ErrorBody)))]
async fn create_lun(
    State(c): State<Ctl>,
    body: Result<Json<Value>, JsonRejection>,
) -> Result<Json<Value>, ApiError> {
    c.create(ObjectKind::Lun, body_of(body)?).await.map(Json)
}

#[utoipa::path(post, path = "/api/v1/luns/delete", tag = "luns", summary = "Delete a LUN ({\"target\", \"lun\"})", request_body = Value, responses((status = 200, description = "done", body = Value), (status = 400, description = "malformed request", body = ErrorBody), (status = 404, description = "no such object", body = ErrorBody), (status = 409, description = "refused in the current state", body = ErrorBody)))]
async fn delete_lun(
    State(c): State<Ctl>,
    body: Result<Json<Value>, JsonRejection>,
) -> Result<Json<Value>, ApiError> {
    c.delete(ObjectKind::Lun, body_of(body)?).await.map(Json)
}

#[utoipa::path(post, path = "/api/v1/luns/resize", tag = "luns", summary = "Grow a LUN while it serves ({\"target\", \"lun\", \"size\"})", request_body = Value, responses((status = 200, description = "done", body = Value), (status = 400, description = "malformed request", body = ErrorBody), (status = 404, description = "no such object", body = ErrorBody), (status = 409, description = "refused in the current state", body = ErrorBody)))]
async fn resize_lun(
    State(c): State<Ctl>,
    body: Result<Json<Value>, JsonRejection>,
) -> Result<Json<Value>, ApiError> {
    c.resize_lun(body_of(body)?).await.map(Json)
}

#[utoipa::path(post, path = "/api/v1/host-groups", tag = "luns", summary = "Create or replace a host group", request_body = Value, responses((status = 200, description = "done", body = Value), (status = 400, description = "malformed request", body = ErrorBody), (status = 404, description = "no such object", body = ErrorBody), (status = 409, description = "refused in the current state", body = ErrorBody)))]
async fn set_host_group(
    State(c): State<Ctl>,
    body: Result<Json<Value>, JsonRejection>,
) -> Result<Json<Value>, ApiError> {
    c.create(ObjectKind::HostGroup, body_of(body)?)
        .await
        .map(Json)
}

#[utoipa::path(post, path = "/api/v1/host-groups/delete", tag = "luns", summary = "Delete a host group", request_body = Value, responses((status = 200, description = "done", body = Value), (status = 400, description = "malformed request", body = ErrorBody), (status = 404, description = "no such object", body = ErrorBody), (status = 409, description = "refused in the current state", body = ErrorBody)))]
async fn delete_host_group(
    State(c): State<Ctl>,
    body: Result<Json<Value>, JsonRejection>,
) -> Result<Json<Value>, ApiError> {
    c.delete(ObjectKind::HostGroup, body_of(body)?)
        .await
        .map(Json)
}

#[utoipa::path(get, path = "/api/v1/host-groups", tag = "luns", summary = "Every host group (LUN masking)", responses((status = 200, description = "done", body = Vec<Value>), (status = 400, description = "malformed request", body = ErrorBody), (status = 404, description = "no such object", body = ErrorBody), (status = 409, description = "refused in the current state", body = ErrorBody)))]
async fn host_groups(State(c): State<Ctl>) -> Json<Value> {
    Json(Value::Array(c.list(ObjectKind::HostGroup).await))
}

#[utoipa::path(get, path = "/api/v1/disks", tag = "disks", summary = "Every disk", responses((status = 200, description = "done", body = Vec<Value>), (status = 400, description = "malformed request", body = ErrorBody), (status = 404, description = "no such object", body = ErrorBody), (status = 409, description = "refused in the current state", body = ErrorBody)))]
async fn disks(State(c): State<Ctl>) -> Json<Value> {
    Json(Value::Array(c.list(ObjectKind::Disk).await))
}

#[utoipa::path(get, path = "/api/v1/luns", tag = "luns", summary = "Every LUN of every target", responses((status = 200, description = "done", body = Vec<Value>), (status = 400, description = "malformed request", body = ErrorBody), (status = 404, description = "no such object", body = ErrorBody), (status = 409, description = "refused in the current state", body = ErrorBody)))]
async fn luns(State(c): State<Ctl>) -> Json<Value> {
    Json(Value::Array(c.list(ObjectKind::Lun).await))
}

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
struct AuditQuery {
    /// How many of the newest entries (default 100, at most 1000).
    limit: Option<usize>,
}

/// The error body every refusal carries.
#[derive(utoipa::ToSchema)]
#[allow(dead_code)] // a schema only: errors are built by `ApiError`'s IntoResponse
struct ErrorBody {
    /// What went wrong.
    error: String,
}

/// Answers `GET /api/v1/audit`: the router's state is the control plane, so the
/// gate (which holds the log) travels as an extension.
#[utoipa::path(get, path = "/api/v1/audit", tag = "node",
    summary = "The newest entries of the audit log (every changing request)",
    params(AuditQuery),
    responses((status = 200, description = "done", body = Vec<Value>),
        (status = 400, description = "malformed request", body = ErrorBody)))]
async fn audit(
    axum::Extension(gate): axum::Extension<Arc<guard::Gate>>,
    q: Result<Query<AuditQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    let Query(q) = q.map_err(|e| ApiError::BadRequest(e.body_text()))?;
    let limit = q.limit.unwrap_or(100).min(1000);
    // (file reads: off the runtime's threads, which also run the data path)
    let entries = tokio::task::spawn_blocking(move || gate.audit.tail(limit))
        .await
        .map_err(|e| ApiError::Internal(format!("audit log: {e}")))?
        .map_err(|e| ApiError::Internal(format!("audit log: {e}")))?;
    serde_json::to_value(entries)
        .map(Json)
        .map_err(|e| ApiError::Internal(e.to_string()))
}

/// Who is calling: `{"name", "role"}` of the token the request carries (the
/// console shows no action buttons to a read-only token).
#[utoipa::path(get, path = "/api/v1/whoami", tag = "node",
    summary = "The calling token's name and role (admin or read-only)",
    responses((status = 200, description = "{\"name\": N, \"role\": \"admin\"|\"read-only\"}", body = Value)))]
async fn whoami(caller: Option<axum::Extension<tokens::Caller>>) -> Result<Json<Value>, ApiError> {
    let axum::Extension(c) =
        caller.ok_or_else(|| ApiError::Internal("no caller on an authenticated request".into()))?;
    Ok(Json(json!({ "name": c.name, "role": c.role.as_str() })))
}

/// The API's description: title, version, the bearer-token scheme every route
/// requires; the paths come from the routes themselves ([`router`]).
#[derive(utoipa::OpenApi)]
#[openapi(
    info(title = "freesan management API",
        description = "A freesan node's control plane: pools, disks, LUNs, host groups, caches, HA replicas, audit. Every request carries a bearer token (`freesan api token create`); read-only tokens may only GET."),
    modifiers(&BearerAuth),
    security(("bearer" = [])),
)]
struct ApiDoc;

/// Adds the bearer token security scheme.
struct BearerAuth;

impl utoipa::Modify for BearerAuth {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::security::{Http, HttpAuthScheme, SecurityScheme};
        let c = doc.components.get_or_insert_with(Default::default);
        c.add_security_scheme(
            "bearer",
            SecurityScheme::Http(Http::new(HttpAuthScheme::Bearer)),
        );
    }
}

/// `GET /api/v1/openapi.json`: this document.
#[utoipa::path(get, path = "/api/v1/openapi.json", tag = "node",
    summary = "This API's OpenAPI 3 description",
    responses((status = 200, description = "the OpenAPI document", body = Value)))]
async fn openapi_json(
    axum::Extension(doc): axum::Extension<Arc<utoipa::openapi::OpenApi>>,
) -> Json<utoipa::openapi::OpenApi> {
    Json((*doc).clone())
}

/// The routes and their OpenAPI description, built from the same handlers: a
/// route cannot be served without being described.
fn routes() -> (Router<Ctl>, utoipa::openapi::OpenApi) {
    use utoipa::OpenApi;
    use utoipa_axum::{router::OpenApiRouter, routes};
    OpenApiRouter::with_openapi(ApiDoc::openapi())
        .routes(routes!(metrics))
        .routes(routes!(status))
        .routes(routes!(whoami))
        .routes(routes!(reload))
        .routes(routes!(audit))
        .routes(routes!(events))
        .routes(routes!(history))
        .routes(routes!(bench_jobs, bench_start))
        .routes(routes!(targets))
        .routes(routes!(target_chap))
        .routes(routes!(target_acl))
        .routes(routes!(openapi_json))
        .routes(routes!(pools, create_pool))
        .routes(routes!(disks, create_disk))
        .routes(routes!(reopen_disk))
        .routes(routes!(luns, create_lun))
        .routes(routes!(delete_lun))
        .routes(routes!(resize_lun))
        .routes(routes!(host_groups, set_host_group))
        .routes(routes!(delete_host_group))
        .routes(routes!(pool))
        .routes(routes!(scrub))
        .routes(routes!(spares))
        .routes(routes!(replace))
        .routes(routes!(fail))
        .routes(routes!(rebuild_rate))
        .routes(routes!(replicas))
        .routes(routes!(replica_discard))
        .routes(routes!(replica_keep))
        .routes(routes!(caches))
        .routes(routes!(cache))
        .routes(routes!(cache_fail))
        .routes(routes!(cache_replace))
        .routes(routes!(cache_attach))
        .routes(routes!(cache_detach))
        .split_for_parts()
}

/// The API's OpenAPI 3 document (what `GET /api/v1/openapi.json` serves).
pub fn openapi() -> utoipa::openapi::OpenApi {
    routes().1
}

/// The API's routes over `control`, behind `gate` (tokens, roles, Host and
/// Origin checks, body limit, audit log).
pub fn router(control: Ctl, gate: Arc<guard::Gate>) -> Router {
    let (routes, doc) = routes();
    routes
        .with_state(control)
        .layer(axum::Extension(Arc::new(doc)))
        .layer(axum::Extension(gate.clone()))
        .layer(DefaultBodyLimit::max(guard::BODY_BYTES_MAX))
        .layer(axum::middleware::from_fn_with_state(gate, guard::gate))
}

/// How the API decides who may call it.
#[derive(Debug, Clone)]
pub struct ApiOptions {
    /// The node's data directory: tokens in `api/tokens.json`, the audit log in
    /// `audit.log`.
    pub data_dir: std::path::PathBuf,
    /// Host names clients may use besides IP literals and `localhost`.
    pub hosts: Vec<String>,
    /// Bounds on connections and requests.
    pub limits: ApiLimits,
    /// Speak TLS with this configuration (see [`tls::server_config`]); None:
    /// plain HTTP.
    pub tls: Option<Arc<tls::rustls::ServerConfig>>,
}

impl ApiOptions {
    /// The gate these options describe.
    pub fn gate(&self) -> Arc<guard::Gate> {
        Arc::new(guard::Gate {
            tokens: tokens::TokenStore::open(&self.data_dir),
            audit: audit::AuditLog::open(&self.data_dir),
            hosts: self
                .hosts
                .iter()
                .map(|h| h.trim().to_ascii_lowercase())
                .collect(),
            scheme: if self.tls.is_some() { "https" } else { "http" },
            limits: self.limits,
            changes: guard::Changes::new(self.limits.connections_max),
            refusals_log: block::admission::LogGate::new(std::time::Duration::from_secs(1)),
        })
    }
}

/// A bound API listener.
pub struct ApiServer {
    listener: tokio::net::TcpListener,
    /// The web console's listener ([`console`]), when configured.
    console: Option<tokio::net::TcpListener>,
    control: Ctl,
    options: ApiOptions,
}

impl ApiServer {
    /// Binds `addr`.
    pub async fn bind(
        addr: SocketAddr,
        control: Ctl,
        options: ApiOptions,
    ) -> std::io::Result<ApiServer> {
        let listener = tokio::net::TcpListener::bind(addr).await?;
        Ok(ApiServer {
            listener,
            console: None,
            control,
            options,
        })
    }

    /// The address actually bound.
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Also serves the web console on `addr`: the console's files, and the same
    /// routes behind the same gate (tokens, TLS, bounds, audit log).
    pub async fn bind_console(&mut self, addr: SocketAddr) -> std::io::Result<()> {
        self.console = Some(tokio::net::TcpListener::bind(addr).await?);
        Ok(())
    }

    /// The console's address actually bound, if it has one.
    pub fn console_addr(&self) -> Option<std::io::Result<SocketAddr>> {
        self.console.as_ref().map(|l| l.local_addr())
    }

    /// Serves until `shutdown` completes, then waits (at most
    /// [`CHANGES_AT_STOP_MAX`]) for the changes still running.
    pub async fn run(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> std::io::Result<()> {
        let gate = self.options.gate();
        let result = self.serve(gate.clone(), shutdown).await;
        // changes under way end first (each is a task of its own, which the
        // process's exit would cut half-way, unrecorded)
        if !gate.changes.done(CHANGES_AT_STOP_MAX).await {
            tracing::warn!(
                "API: changes still running {}s after the stop; going on without them",
                CHANGES_AT_STOP_MAX.as_secs()
            );
        }
        result
    }

    /// [`ApiServer::run`] but for the wait for the changes under way.
    async fn serve(
        self,
        gate: Arc<guard::Gate>,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> std::io::Result<()> {
        let tls = self.options.tls.clone();
        let limits = self.options.limits;
        let Some(console) = self.console else {
            let router = router(self.control, gate);
            return server::serve(self.listener, router, limits, tls, shutdown).await;
        };
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        let stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
            let _ = rx.wait_for(|s| *s).await;
        };
        let console_router = console::router(self.control.clone(), gate.clone());
        let console_task = tokio::spawn(server::serve(
            console,
            console_router,
            limits,
            tls.clone(),
            stopped(stop_rx.clone()),
        ));
        let api = server::serve(
            self.listener,
            router(self.control, gate),
            limits,
            tls,
            stopped(stop_rx),
        );
        let relay = async move {
            shutdown.await;
            stop_tx.send_replace(true);
        };
        let (api_result, ()) = tokio::join!(api, relay);
        let console_result = console_task
            .await
            .map_err(|e| std::io::Error::other(format!("console task: {e}")))?;
        api_result.and(console_result)
    }
}

#[cfg(test)]
mod tests;
