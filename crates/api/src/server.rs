//! The API's accept loop: HTTP/1.1 over TCP with bounded connections, a header
//! read timeout that also ends idle kept-alive connections, and a longest
//! connection lifetime; TLS (rustls) when configured, its handshake bounded by
//! the header read timeout.
//!
//! Two bounds, each in total and per source address: connections that have
//! not yet made a request with a valid token (in their TLS handshake, idle, or
//! answered without one) take places in a [`block::admission::AdmissionBudget`],
//! where a newer one takes the place of an older one; a connection whose
//! request passes the gate leaves it for a place among the authenticated
//! connections, which is never taken back ([`ConnAdmission::authenticated`]).
//! So clients without a token that open connections and hold them cannot keep
//! the holders of one out.

use crate::guard::{ApiLimits, Peer};
use axum::Router;
use block::admission::{AdmissionSlot, PerSource, SourceSlot};
use hyper_util::rt::{TokioIo, TokioTimer};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// One connection's place: among those not yet authenticated (`slot`, which a
/// newer connection may take), then, from its first request that passes the
/// gate, among the authenticated ones (held until it closes).
pub struct ConnAdmission {
    slot: AdmissionSlot,
    authenticated: std::sync::Mutex<Option<(OwnedSemaphorePermit, SourceSlot)>>,
    total: Arc<Semaphore>,
    per_source: Arc<PerSource>,
    peer: std::net::SocketAddr,
}

impl ConnAdmission {
    /// Called by the gate for a request with a valid token: moves the
    /// connection among the authenticated ones if it is not there yet. False
    /// when their bounds are reached (the request is refused and the
    /// connection closed).
    pub fn authenticated(&self) -> bool {
        let mut held = self.authenticated.lock().unwrap_or_else(|e| e.into_inner());
        if held.is_some() {
            return true;
        }
        let Ok(permit) = self.total.clone().try_acquire_owned() else {
            return false;
        };
        let Some(slot) = self.per_source.take(self.peer.ip()) else {
            return false;
        };
        // its place may have gone to a newer connection meanwhile: then it
        // is to close (`serve_conn` sees the eviction), not be served; taken
        // last, so that a refusal above leaves it counted where it was
        if !self.slot.settle() {
            return false;
        }
        *held = Some((permit, slot));
        true
    }
}

/// Serves HTTP/1.1 on one connection until it ends, its lifetime is over, or
/// `stop` asks (then it is given 5 s to finish its request).
async fn serve_conn<I>(
    io: I,
    admission: Arc<ConnAdmission>,
    router: Router,
    limits: ApiLimits,
    mut stop: tokio::sync::watch::Receiver<bool>,
) where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let peer = admission.peer;
    let adm = admission.clone();
    let svc = hyper::service::service_fn(move |mut req: hyper::Request<_>| {
        req.extensions_mut().insert(Peer(peer));
        // a connection that sent a request is taken back after idle ones
        adm.slot.mark_active();
        req.extensions_mut().insert(adm.clone());
        let mut r = router.clone();
        async move {
            use tower_service::Service;
            r.call(req.map(axum::body::Body::new)).await
        }
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(Duration::from_millis(limits.header_read_timeout_ms))
        .max_buf_size(64 * 1024);
    let conn = builder.serve_connection(TokioIo::new(io), svc);
    tokio::pin!(conn);
    let lifetime = tokio::time::sleep(Duration::from_millis(limits.connection_lifetime_ms));
    tokio::pin!(lifetime);
    tokio::select! {
        _ = &mut conn => return,
        _ = &mut lifetime => return,
        // its place went to a newer connection before it authenticated
        _ = admission.slot.evicted() => return,
        _ = stop.wait_for(|s| *s) => conn.as_mut().graceful_shutdown(),
    }
    let _ = tokio::time::timeout(Duration::from_secs(5), conn).await;
}

/// Serves `router` on `listener` (over TLS when `tls` is given) until `shutdown`
/// completes; connections still open then are given up to 5 s to finish their
/// request.
pub async fn serve(
    listener: tokio::net::TcpListener,
    router: Router,
    limits: ApiLimits,
    tls: Option<Arc<rustls::ServerConfig>>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let tls = tls.map(tokio_rustls::TlsAcceptor::from);
    let total = Arc::new(Semaphore::new(limits.connections_max.max(1)));
    let per_source = PerSource::new(limits.connections_per_source_max);
    let pending = block::admission::AdmissionBudget::new(
        limits.connections_per_source_max,
        limits.connections_max,
    );
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    tokio::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            _ = &mut shutdown => break,
            a = listener.accept() => match a {
                Ok(a) => a,
                Err(e) => {
                    // EMFILE and the like: back off instead of spinning
                    tracing::warn!("API accept: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let admission = Arc::new(ConnAdmission {
            slot: pending.admit(peer.ip()),
            authenticated: std::sync::Mutex::new(None),
            total: total.clone(),
            per_source: per_source.clone(),
            peer,
        });
        let _ = stream.set_nodelay(true);
        let router = router.clone();
        let stop = stop_rx.clone();
        let tls = tls.clone();
        tokio::spawn(async move {
            match tls {
                None => serve_conn(stream, admission, router, limits, stop).await,
                Some(acceptor) => {
                    let handshake = tokio::select! {
                        h = tokio::time::timeout(
                            Duration::from_millis(limits.header_read_timeout_ms),
                            acceptor.accept(stream),
                        ) => h,
                        _ = admission.slot.evicted() => return,
                    };
                    match handshake {
                        Ok(Ok(s)) => serve_conn(s, admission, router, limits, stop).await,
                        Ok(Err(e)) => tracing::debug!("API TLS handshake with {peer}: {e}"),
                        Err(_) => tracing::debug!("API TLS handshake with {peer}: timed out"),
                    }
                }
            }
        });
    }
    stop_tx.send_replace(true);
    // wait (bounded) for the connections to finish
    let _ = tokio::time::timeout(
        Duration::from_secs(6),
        total.acquire_many(limits.connections_max.max(1) as u32),
    )
    .await;
    Ok(())
}
