//! The API's accept loop: HTTP/1.1 over TCP with bounded connections (in total
//! and per source address), a header read timeout that also ends idle kept-alive
//! connections, and a longest connection lifetime; TLS (rustls) when configured,
//! its handshake bounded by the header read timeout.

use crate::guard::{ApiLimits, Peer};
use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Semaphore;

/// Serves HTTP/1.1 on one connection until it ends, its lifetime is over, or
/// `stop` asks (then it is given 5 s to finish its request).
async fn serve_conn<I>(
    io: I,
    peer: std::net::SocketAddr,
    router: Router,
    limits: ApiLimits,
    mut stop: tokio::sync::watch::Receiver<bool>,
) where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let svc = hyper::service::service_fn(move |mut req: hyper::Request<_>| {
        req.extensions_mut().insert(Peer(peer));
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
    let per_source = block::admission::PerSource::new(limits.connections_per_source_max);
    // one line a second for refused connections, with a count
    let refusals = block::admission::LogGate::new(Duration::from_secs(1));
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    tokio::pin!(shutdown);
    loop {
        let permit = tokio::select! {
            _ = &mut shutdown => break,
            p = total.clone().acquire_owned() => match p {
                Ok(p) => p,
                Err(_) => break,
            },
        };
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
        let Some(slot) = per_source.take(peer.ip()) else {
            if let Some(left_out) = refusals.allow() {
                tracing::warn!(left_out, "API: too many connections from {}", peer.ip());
            }
            drop(stream);
            continue;
        };
        let _ = stream.set_nodelay(true);
        let router = router.clone();
        let stop = stop_rx.clone();
        let tls = tls.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let _slot = slot;
            match tls {
                None => serve_conn(stream, peer, router, limits, stop).await,
                Some(acceptor) => {
                    let handshake = tokio::time::timeout(
                        Duration::from_millis(limits.header_read_timeout_ms),
                        acceptor.accept(stream),
                    )
                    .await;
                    match handshake {
                        Ok(Ok(s)) => serve_conn(s, peer, router, limits, stop).await,
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
