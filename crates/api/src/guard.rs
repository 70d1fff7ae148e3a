//! The gate every API request passes before a handler sees it, in this order:
//! 1. `Host` must name this API: an IP literal, `localhost`, or a name listed in
//!    `[api] hosts` (else 421): a page whose name was re-pointed at this address
//!    (DNS rebinding) carries its own name.
//! 2. An `Origin`, when sent, must be the API's own (`http://` + the Host) (else
//!    403): browsers send it on cross-site requests.
//! 3. `Authorization: Bearer TOKEN` must name a stored token (else 401, the same
//!    answer for a missing, malformed, unknown or revoked token).
//! 4. A read-only token may only `GET` (else 403).
//! 5. Any other method needs `Content-Type: application/json` (else 415), body or
//!    not: an HTML form cannot send that type across sites without a CORS
//!    preflight, which this API never grants.
//! 6. The body is read (at most [`BODY_BYTES_MAX`], within [`ApiLimits::body_read_timeout_ms`]);
//!    the request runs; every changing request is written to the audit log.

use crate::audit::{summarize, AuditEntry, AuditLog};
use crate::tokens::{Caller, Role, TokenStore};
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The largest request body accepted (bigger: 413).
pub const BODY_BYTES_MAX: usize = 64 * 1024;

/// Bounds on connections and requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ApiLimits {
    /// Connections that made a request with a valid token, in total; the
    /// request that would pass it is answered 503 and its connection closed.
    /// As many again may wait for their first such request (in their TLS
    /// handshake, idle, or answered without a token): a newer one takes the
    /// place of the oldest of the source holding the most
    /// (`crate::server::ConnAdmission`).
    pub connections_max: usize,
    /// The same two bounds per source address (a newer connection not yet
    /// authenticated takes the place of its own source's oldest).
    pub connections_per_source_max: usize,
    /// Time a client has to send a request's headers (also the idle time of a
    /// kept-alive connection).
    pub header_read_timeout_ms: u64,
    /// Time a client has to send a request's body.
    pub body_read_timeout_ms: u64,
    /// Longest life of one connection.
    pub connection_lifetime_ms: u64,
}

impl Default for ApiLimits {
    fn default() -> Self {
        ApiLimits {
            connections_max: 64,
            connections_per_source_max: 16,
            header_read_timeout_ms: 10_000,
            body_read_timeout_ms: 10_000,
            connection_lifetime_ms: 600_000,
        }
    }
}

/// The caller's address, put in each request by the accept loop.
#[derive(Debug, Clone, Copy)]
pub struct Peer(pub SocketAddr);

/// What the gate checks against.
pub struct Gate {
    /// The tokens accepted.
    pub tokens: TokenStore,
    /// Where changing requests are recorded.
    pub audit: AuditLog,
    /// Host names (lower case, no port) accepted besides IP literals and `localhost`.
    pub hosts: Vec<String>,
    /// The URL scheme clients use (`http` or `https`), for the Origin check.
    pub scheme: &'static str,
    /// Bounds.
    pub limits: ApiLimits,
    /// Changes running (each on a task of its own, to its end): a stopping
    /// server waits for them (see [`Gate::changes_done`]).
    pub changes: Changes,
    /// One line a second for refused requests (no token, a bad Host or
    /// Origin), with the count of those left out: a client reconnecting in a
    /// loop would otherwise write thousands a second.
    pub refusals_log: block::admission::LogGate,
}

impl Gate {
    /// Appends `e` to the audit log, off the runtime's threads (a write and an
    /// fsync under the log's lock: on them, a stream of refused requests from
    /// a read-only token stalled the iSCSI and NBD tasks sharing them; review
    /// of 2026-12-06).
    async fn record(self: &Arc<Self>, e: AuditEntry) {
        let g = self.clone();
        let r = tokio::task::spawn_blocking(move || g.audit.append(&e)).await;
        let failed = match r {
            Ok(r) => r.err(),
            Err(e) => Some(std::io::Error::other(e)),
        };
        if let Some(e) = failed {
            tracing::error!("audit log {}: {e}", self.audit.path().display());
        }
    }

    /// A refused request's log line, at most one a second.
    fn refused_line(&self, what: std::fmt::Arguments<'_>) {
        if let Some(left_out) = self.refusals_log.allow() {
            if left_out > 0 {
                tracing::warn!("API: {what} ({left_out} more refused since the last line)");
            } else {
                tracing::warn!("API: {what}");
            }
        }
    }
}

/// The changes running, counted; once the server stops, new ones are refused.
/// At most as many run at once as the server takes connections: a change runs
/// to its end on a task of its own even when its client goes away, so without
/// a bound of their own a client that hangs up and asks again could start
/// them without end.
/// Each running change holds one of the slots, so the changes still running
/// are the slots not free.
pub struct Changes {
    stopping: std::sync::atomic::AtomicBool,
    slots: Arc<tokio::sync::Semaphore>,
    max: u32,
}

impl Changes {
    /// At most `max` changes at once.
    pub fn new(max: usize) -> Changes {
        let max = u32::try_from(max.max(1)).unwrap_or(u32::MAX).min(1 << 20);
        Changes {
            stopping: Default::default(),
            slots: Arc::new(tokio::sync::Semaphore::new(max as usize)),
            max,
        }
    }
}

/// Why a change was not started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Refused {
    /// As many changes run as the server takes connections: 429, try again.
    Busy,
    /// The node is stopping: 503.
    Stopping,
}

/// One running change, holding its slot until dropped.
type Running = tokio::sync::OwnedSemaphorePermit;

impl Changes {
    /// Takes a slot for a change of `g`'s until the result is dropped; none
    /// free, or the server stopping, refuses it (the slot is taken first, then
    /// the flag checked: a change that finds the server not stopping is
    /// waited for by [`Changes::done`]).
    fn start(g: &Arc<Gate>) -> Result<Running, Refused> {
        use std::sync::atomic::Ordering;
        let slot = g
            .changes
            .slots
            .clone()
            .try_acquire_owned()
            .map_err(|_| Refused::Busy)?;
        if g.changes.stopping.load(Ordering::SeqCst) {
            return Err(Refused::Stopping);
        }
        Ok(slot)
    }

    /// Refuses changes from now on, then waits until none runs, at most
    /// `bound`; false if some still do.
    pub async fn done(&self, bound: Duration) -> bool {
        use std::sync::atomic::Ordering;
        self.stopping.store(true, Ordering::SeqCst);
        // every slot free: no change runs (one that took a slot after the
        // flag was set gives it back at once)
        tokio::time::timeout(bound, self.slots.acquire_many(self.max))
            .await
            .is_ok()
    }
}

fn refuse(code: StatusCode, msg: &str) -> Response {
    (code, Json(json!({ "error": msg }))).into_response()
}

/// A refusal before a token was verified also ends the connection: a caller
/// without a token cannot hold one of the bounded connections open by
/// repeating refused requests on it.
fn closing(mut r: Response) -> Response {
    r.headers_mut().insert(
        header::CONNECTION,
        header::HeaderValue::from_static("close"),
    );
    r
}

fn unauthorized() -> Response {
    let mut r = refuse(
        StatusCode::UNAUTHORIZED,
        "authentication required: Authorization: Bearer TOKEN (see `freesan api token create`)",
    );
    r.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        header::HeaderValue::from_static("Bearer"),
    );
    r
}

/// Splits `host[:port]` (IPv6 in brackets) into the host part, lower case.
fn host_part(authority: &str) -> Option<String> {
    let a = authority.trim();
    if a.is_empty() || a.contains(['/', '@', ' ']) {
        return None;
    }
    let host = if let Some(rest) = a.strip_prefix('[') {
        let (h, after) = rest.split_once(']')?;
        if !(after.is_empty() || after.starts_with(':')) {
            return None;
        }
        h.parse::<std::net::Ipv6Addr>().ok()?;
        return Some(format!("[{}]", h.to_ascii_lowercase()));
    } else {
        match a.rsplit_once(':') {
            Some((h, p)) if p.chars().all(|c| c.is_ascii_digit()) => h,
            Some(_) => return None,
            None => a,
        }
    };
    Some(host.to_ascii_lowercase())
}

impl Gate {
    fn host_allowed(&self, host: &str) -> bool {
        host == "localhost"
            || host.parse::<IpAddr>().is_ok()
            || (host.starts_with('[') && host.ends_with(']'))
            || self.hosts.iter().any(|h| h == host)
    }

    fn check_host_origin(&self, req: &Request) -> Result<(), Box<Response>> {
        let host = req
            .headers()
            .get(header::HOST)
            .and_then(|h| h.to_str().ok())
            .map(str::to_string)
            .or_else(|| req.uri().authority().map(|a| a.to_string()));
        let Some(host) = host else {
            return Err(Box::new(refuse(
                StatusCode::MISDIRECTED_REQUEST,
                "no Host header",
            )));
        };
        match host_part(&host) {
            Some(h) if self.host_allowed(&h) => {}
            _ => {
                return Err(Box::new(refuse(
                    StatusCode::MISDIRECTED_REQUEST,
                    "this API does not answer to that Host (see [api] hosts)",
                )))
            }
        }
        if let Some(origin) = req.headers().get(header::ORIGIN) {
            let own = format!("{}://{}", self.scheme, host.trim());
            let same = origin
                .to_str()
                .map(|o| o.trim_end_matches('/').eq_ignore_ascii_case(&own))
                .unwrap_or(false);
            if !same {
                return Err(Box::new(refuse(
                    StatusCode::FORBIDDEN,
                    "cross-origin requests are refused",
                )));
            }
        }
        Ok(())
    }

    /// The caller whose bearer token `authorization` carries; with `now`,
    /// judged against the token file as it is this moment.
    fn caller(&self, authorization: Option<&header::HeaderValue>, now: bool) -> Option<Caller> {
        let v = authorization?.to_str().ok()?;
        let (scheme, token) = v.trim().split_once(' ')?;
        if !scheme.eq_ignore_ascii_case("bearer") {
            return None;
        }
        if now {
            self.tokens.verify_now(token.trim())
        } else {
            self.tokens.verify(token.trim())
        }
    }
}

fn is_json(req: &Request) -> bool {
    req.headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|t| t.trim().eq_ignore_ascii_case("application/json"))
}

fn now_unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// The gate as axum middleware (see the module header for the order of checks).
pub async fn gate(State(g): State<Arc<Gate>>, req: Request, next: Next) -> Response {
    let source = req
        .extensions()
        .get::<Peer>()
        .map(|p| p.0.to_string())
        .unwrap_or_else(|| "?".into());
    if let Err(r) = g.check_host_origin(&req) {
        g.refused_line(format_args!(
            "refused {} {} from {source}: {}",
            req.method(),
            req.uri().path(),
            r.status()
        ));
        return closing(*r);
    }
    let authorization = req.headers().get(header::AUTHORIZATION).cloned();
    let Some(caller) = g.caller(authorization.as_ref(), false) else {
        g.refused_line(format_args!(
            "no valid token on {} {} from {source}",
            req.method(),
            req.uri().path()
        ));
        return closing(unauthorized());
    };
    // the connection is now among the authenticated ones, which are never
    // taken back for a newer connection (absent when the router is called
    // without the accept loop, as in some tests)
    let admitted = req
        .extensions()
        .get::<Arc<crate::server::ConnAdmission>>()
        .is_none_or(|a| a.authenticated());
    if !admitted {
        g.refused_line(format_args!(
            "too many authenticated API connections: {} {} from {source} refused",
            req.method(),
            req.uri().path()
        ));
        return closing(
            (
                StatusCode::SERVICE_UNAVAILABLE,
                "too many API connections; retry later",
            )
                .into_response(),
        );
    }
    let mut req = req;
    // handlers may ask who is calling (GET /api/v1/whoami)
    req.extensions_mut().insert(caller.clone());
    let reads = req.method() == Method::GET || req.method() == Method::HEAD;
    if reads {
        let started = std::time::Instant::now();
        // (a reference-counted copy, for the log line should it come)
        let uri = req.uri().clone();
        let answer = next.run(req).await;
        // A read that waited (an event long poll) answers only a token still
        // valid: one revoked while it waited gets nothing of what it waited for.
        if started.elapsed() >= Duration::from_millis(crate::tokens::RELOAD_CHECK_MS)
            && g.caller(authorization.as_ref(), true).is_none()
        {
            tracing::warn!(
                "API: the token of GET {} from {source} was revoked while it waited",
                uri.path()
            );
            return closing(unauthorized());
        }
        return answer;
    }
    let method = req.method().to_string();
    let path = req
        .uri()
        .path_and_query()
        .map(|p| p.as_str().to_string())
        .unwrap_or_default();
    // A change runs on a task of its own, to its end and its audit entry: when
    // the client goes away mid-request, hyper drops this future, and a change
    // already applied (a pool member swapped, a cache draining) would otherwise
    // stop half-way, unrecorded in managed.toml and missing from the audit log.
    // (counted from before the task starts: a server stopping now waits;
    // one that has stopped takes no more)
    // a read-only token's change is refused (and recorded) before it takes a
    // change slot: a stream of them kept admins out (429)
    if caller.role != Role::Admin {
        let r = refuse(StatusCode::FORBIDDEN, "this token is read-only");
        let entry = audit_entry(&caller, source, method, path, serde_json::Value::Null, &r);
        g.record(entry).await;
        return r;
    }
    let running = match Changes::start(&g) {
        Ok(r) => r,
        Err(Refused::Stopping) => {
            return refuse(StatusCode::SERVICE_UNAVAILABLE, "the node is stopping")
        }
        Err(Refused::Busy) => {
            let mut r = refuse(
                StatusCode::TOO_MANY_REQUESTS,
                "too many changes are running; try again",
            );
            r.headers_mut()
                .insert(header::RETRY_AFTER, header::HeaderValue::from_static("1"));
            return r;
        }
    };
    let task = tokio::spawn(async move {
        let r = change(g, caller, source, method, path, req, next).await;
        drop(running);
        r
    });
    match task.await {
        Ok(r) => r,
        Err(e) => {
            tracing::error!("API: a request's task ended early: {e}");
            refuse(StatusCode::INTERNAL_SERVER_ERROR, "the request failed")
        }
    }
}

/// A request that may change something: the role and body checks, the handler
/// and the audit entry, whatever the outcome.
async fn change(
    g: Arc<Gate>,
    caller: Caller,
    source: String,
    method: String,
    path: String,
    req: Request,
    next: Next,
) -> Response {
    let (parts, body) = req.into_parts();
    let (body_summary, response) = if !is_json(&Request::from_parts(parts.clone(), Body::empty())) {
        let r = refuse(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "requests that change something need Content-Type: application/json",
        );
        (serde_json::Value::Null, r)
    } else {
        let read = tokio::time::timeout(
            Duration::from_millis(g.limits.body_read_timeout_ms),
            axum::body::to_bytes(body, BODY_BYTES_MAX),
        )
        .await;
        match read {
            Err(_) => {
                let r = refuse(StatusCode::REQUEST_TIMEOUT, "request body too slow");
                (serde_json::Value::Null, r)
            }
            Ok(Err(_)) => {
                let r = refuse(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    &format!("request body larger than {BODY_BYTES_MAX} bytes"),
                );
                (serde_json::Value::Null, r)
            }
            Ok(Ok(bytes)) => {
                let summary = summarize(&bytes);
                // on a task of its own, so that a handler that panics still
                // leaves its audit entry (a 500): the change may have gone
                // half-way, and the log must say it was asked for
                let run = tokio::spawn(next.run(Request::from_parts(parts, Body::from(bytes))));
                let r = match run.await {
                    Ok(r) => r,
                    Err(e) => {
                        tracing::error!(%path, "API: the handler failed: {e}");
                        refuse(StatusCode::INTERNAL_SERVER_ERROR, "the request failed")
                    }
                };
                (summary, r)
            }
        }
    };
    let entry = audit_entry(&caller, source, method, path, body_summary, &response);
    g.record(entry).await;
    response
}

/// The audit log's entry for a changing request and its answer.
fn audit_entry(
    caller: &Caller,
    source: String,
    method: String,
    path: String,
    body: serde_json::Value,
    answer: &Response,
) -> AuditEntry {
    AuditEntry {
        time_unix_ms: now_unix_ms(),
        who: caller.name.clone(),
        token_id: caller.id.clone(),
        role: caller.role.as_str().to_string(),
        source,
        method,
        path,
        body,
        status: answer.status().as_u16(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_stopping_server_waits_for_running_changes_and_takes_no_new_one() {
        let d = tempfile::tempdir().unwrap();
        let g = crate::ApiOptions {
            data_dir: d.path().to_path_buf(),
            hosts: vec![],
            limits: ApiLimits::default(),
            tls: None,
        }
        .gate();
        let running = Changes::start(&g).unwrap_or_else(|e| panic!("not stopping yet: {e:?}"));
        let g2 = g.clone();
        let stop = tokio::spawn(async move { g2.changes.done(Duration::from_secs(30)).await });
        // (the stop refuses new changes before it waits)
        while !g.changes.stopping.load(std::sync::atomic::Ordering::SeqCst) {
            tokio::task::yield_now().await;
        }
        assert!(Changes::start(&g).is_err(), "a change began after the stop");
        assert!(!stop.is_finished(), "the stop did not wait for the change");
        drop(running);
        assert!(stop.await.unwrap(), "the stop waited past the change's end");
    }

    /// No more changes run at once than the server takes connections: a
    /// change outlives its client, so hanging up and asking again must not
    /// start them without end.
    #[tokio::test]
    async fn changes_at_once_are_bounded_by_the_connections() {
        let d = tempfile::tempdir().unwrap();
        let g = crate::ApiOptions {
            data_dir: d.path().to_path_buf(),
            hosts: vec![],
            limits: ApiLimits {
                connections_max: 3,
                ..ApiLimits::default()
            },
            tls: None,
        }
        .gate();
        let running: Vec<_> = (0..3)
            .map(|_| Changes::start(&g).unwrap_or_else(|e| panic!("{e:?}")))
            .collect();
        assert_eq!(Changes::start(&g).err(), Some(Refused::Busy));
        drop(running);
        assert!(Changes::start(&g).is_ok());
    }

    #[test]
    fn host_parts() {
        assert_eq!(host_part("127.0.0.1:8260").as_deref(), Some("127.0.0.1"));
        assert_eq!(host_part("LocalHost").as_deref(), Some("localhost"));
        assert_eq!(host_part("[::1]:80").as_deref(), Some("[::1]"));
        assert_eq!(
            host_part("evil.example:8260").as_deref(),
            Some("evil.example")
        );
        assert_eq!(host_part("a@b"), None);
        assert_eq!(host_part("x:y"), None);
        assert_eq!(host_part("[zz]:1"), None);
    }
}
