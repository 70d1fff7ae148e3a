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
//! Routes (all under `/api/v1`):
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
//!
//! Errors come back as `{"error": "..."}` with 400 (bad request), 404 (no such pool)
//! or 409 (refused in the current state).

pub mod audit;
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
use axum::routing::{get, post};
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
    /// Reads the configuration file again and applies what can change live
    /// (targets, CHAP, ACLs); answers what was applied and what needs a restart.
    async fn reload(&self) -> Result<Value, ApiError> {
        Err(ApiError::NotFound("this node cannot reload".into()))
    }
}

async fn reload(State(c): State<Ctl>) -> Result<Json<Value>, ApiError> {
    c.reload().await.map(Json)
}

#[derive(Deserialize)]
struct DeviceBody {
    device: usize,
    #[serde(default)]
    force: bool,
}

#[derive(Deserialize)]
struct CacheReplaceBody {
    device: usize,
    disk: String,
}

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

async fn cache_attach(
    State(c): State<Ctl>,
    Path(name): Path<String>,
) -> Result<Json<Value>, ApiError> {
    c.cache_action(&name, CacheAction::Attach).await.map(Json)
}

async fn cache_detach(
    State(c): State<Ctl>,
    Path(name): Path<String>,
) -> Result<Json<Value>, ApiError> {
    c.cache_action(&name, CacheAction::Detach).await.map(Json)
}

async fn replicas(State(c): State<Ctl>) -> Json<Value> {
    Json(Value::Array(c.replicas()))
}

/// Body naming a replicated volume (names hold slashes: cluster/target/lunN).
#[derive(Deserialize)]
struct ReplicaName {
    name: String,
}

async fn replica_discard(
    State(c): State<Ctl>,
    body: Result<Json<ReplicaName>, JsonRejection>,
) -> Result<Json<Value>, ApiError> {
    let Json(b) = body.map_err(|e| ApiError::BadRequest(e.body_text()))?;
    c.replica_action(&b.name, ReplicaAction::Discard)
        .await
        .map(Json)
}

async fn caches(State(c): State<Ctl>) -> Json<Value> {
    Json(Value::Array(c.caches()))
}

async fn cache(State(c): State<Ctl>, Path(name): Path<String>) -> Result<Json<Value>, ApiError> {
    c.cache(&name)
        .map(Json)
        .ok_or_else(|| ApiError::NotFound(format!("no cache named {name:?}")))
}

type Ctl = Arc<dyn Control>;

async fn status(State(c): State<Ctl>) -> Json<Value> {
    Json(c.status())
}

async fn pools(State(c): State<Ctl>) -> Json<Value> {
    Json(Value::Array(c.pools()))
}

async fn pool(State(c): State<Ctl>, Path(name): Path<String>) -> Result<Json<Value>, ApiError> {
    c.pool(&name)
        .map(Json)
        .ok_or_else(|| ApiError::NotFound(format!("no pool named {name:?}")))
}

#[derive(Deserialize)]
struct DiskBody {
    disk: String,
}

#[derive(Deserialize)]
struct ReplaceBody {
    position: usize,
    disk: String,
}

#[derive(Deserialize)]
struct PositionBody {
    position: usize,
    #[serde(default)]
    force: bool,
}

#[derive(Deserialize)]
struct RateBody {
    mb_s: u32,
}

async fn act(c: &Ctl, name: &str, a: PoolAction) -> Result<Json<Value>, ApiError> {
    c.pool_action(name, a).await.map(Json)
}

async fn scrub(State(c): State<Ctl>, Path(name): Path<String>) -> Result<Json<Value>, ApiError> {
    act(&c, &name, PoolAction::Scrub).await
}

async fn spares(
    State(c): State<Ctl>,
    Path(name): Path<String>,
    Json(b): Json<DiskBody>,
) -> Result<Json<Value>, ApiError> {
    act(&c, &name, PoolAction::AddSpare { disk: b.disk }).await
}

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

async fn create_disk(
    State(c): State<Ctl>,
    body: Result<Json<Value>, JsonRejection>,
) -> Result<Json<Value>, ApiError> {
    c.create(ObjectKind::Disk, body_of(body)?).await.map(Json)
}

async fn create_pool(
    State(c): State<Ctl>,
    body: Result<Json<Value>, JsonRejection>,
) -> Result<Json<Value>, ApiError> {
    c.create(ObjectKind::Pool, body_of(body)?).await.map(Json)
}

async fn create_lun(
    State(c): State<Ctl>,
    body: Result<Json<Value>, JsonRejection>,
) -> Result<Json<Value>, ApiError> {
    c.create(ObjectKind::Lun, body_of(body)?).await.map(Json)
}

async fn delete_lun(
    State(c): State<Ctl>,
    body: Result<Json<Value>, JsonRejection>,
) -> Result<Json<Value>, ApiError> {
    c.delete(ObjectKind::Lun, body_of(body)?).await.map(Json)
}

async fn resize_lun(
    State(c): State<Ctl>,
    body: Result<Json<Value>, JsonRejection>,
) -> Result<Json<Value>, ApiError> {
    c.resize_lun(body_of(body)?).await.map(Json)
}

async fn set_host_group(
    State(c): State<Ctl>,
    body: Result<Json<Value>, JsonRejection>,
) -> Result<Json<Value>, ApiError> {
    c.create(ObjectKind::HostGroup, body_of(body)?)
        .await
        .map(Json)
}

async fn delete_host_group(
    State(c): State<Ctl>,
    body: Result<Json<Value>, JsonRejection>,
) -> Result<Json<Value>, ApiError> {
    c.delete(ObjectKind::HostGroup, body_of(body)?)
        .await
        .map(Json)
}

async fn host_groups(State(c): State<Ctl>) -> Json<Value> {
    Json(Value::Array(c.list(ObjectKind::HostGroup).await))
}

async fn disks(State(c): State<Ctl>) -> Json<Value> {
    Json(Value::Array(c.list(ObjectKind::Disk).await))
}

async fn luns(State(c): State<Ctl>) -> Json<Value> {
    Json(Value::Array(c.list(ObjectKind::Lun).await))
}

#[derive(Deserialize)]
struct AuditQuery {
    limit: Option<usize>,
}

/// Answers `GET /api/v1/audit`: the router's state is the control plane, so the
/// log travels in a closure.
fn audit_route(gate: Arc<guard::Gate>) -> axum::routing::MethodRouter<Ctl> {
    get(
        move |q: Result<Query<AuditQuery>, axum::extract::rejection::QueryRejection>| {
            let gate = gate.clone();
            async move {
                let Query(q) = q.map_err(|e| ApiError::BadRequest(e.body_text()))?;
                let limit = q.limit.unwrap_or(100).min(1000);
                let entries = gate
                    .audit
                    .tail(limit)
                    .map_err(|e| ApiError::Internal(format!("audit log: {e}")))?;
                serde_json::to_value(entries)
                    .map(Json)
                    .map_err(|e| ApiError::Internal(e.to_string()))
            }
        },
    )
}

/// The API's routes over `control`, behind `gate` (tokens, roles, Host and
/// Origin checks, body limit, audit log).
pub fn router(control: Ctl, gate: Arc<guard::Gate>) -> Router {
    Router::new()
        .route("/api/v1/status", get(status))
        .route("/api/v1/reload", post(reload))
        .route("/api/v1/audit", audit_route(gate.clone()))
        .route("/api/v1/pools", get(pools).post(create_pool))
        .route("/api/v1/disks", get(disks).post(create_disk))
        .route("/api/v1/luns", get(luns).post(create_lun))
        .route("/api/v1/luns/delete", post(delete_lun))
        .route("/api/v1/luns/resize", post(resize_lun))
        .route("/api/v1/host-groups", get(host_groups).post(set_host_group))
        .route("/api/v1/host-groups/delete", post(delete_host_group))
        .route("/api/v1/pools/{name}", get(pool))
        .route("/api/v1/pools/{name}/scrub", post(scrub))
        .route("/api/v1/pools/{name}/spares", post(spares))
        .route("/api/v1/pools/{name}/replace", post(replace))
        .route("/api/v1/pools/{name}/fail", post(fail))
        .route("/api/v1/pools/{name}/rebuild-rate", post(rebuild_rate))
        .route("/api/v1/replicas", get(replicas))
        .route("/api/v1/replicas/discard", post(replica_discard))
        .route("/api/v1/caches", get(caches))
        .route("/api/v1/caches/{name}", get(cache))
        .route("/api/v1/caches/{name}/fail", post(cache_fail))
        .route("/api/v1/caches/{name}/replace", post(cache_replace))
        .route("/api/v1/caches/{name}/attach", post(cache_attach))
        .route("/api/v1/caches/{name}/detach", post(cache_detach))
        .with_state(control)
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
        })
    }
}

/// A bound API listener.
pub struct ApiServer {
    listener: tokio::net::TcpListener,
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
            control,
            options,
        })
    }

    /// The address actually bound.
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Serves until `shutdown` completes.
    pub async fn run(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> std::io::Result<()> {
        let gate = self.options.gate();
        let router = router(self.control, gate);
        let tls = self.options.tls.clone();
        server::serve(self.listener, router, self.options.limits, tls, shutdown).await
    }
}

#[cfg(test)]
mod tests;
