//! The web console's listener (`[api] console = "ADDR"`): the console's static
//! files (embedded by the `console-assets` crate) without a token, and the same
//! API routes as the API listener behind the same gate, so the pages call
//! same-origin `/api/v1/...` with `Authorization: Bearer TOKEN`.
//!
//! Every static answer closes its connection (it needs no token) and carries a
//! strict Content-Security-Policy (only this origin's scripts, styles and
//! connections; no inline script; no framing),
//! `X-Frame-Options: DENY`, `X-Content-Type-Options: nosniff` and no referrer.
//! Files whose names carry a content hash are cached for a year; `index.html`
//! is revalidated each time. The gzip copy made at build time is served to
//! clients that accept it.

use axum::body::Body;
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::Router;
use std::sync::Arc;

/// The Content-Security-Policy of every console page.
pub const CSP: &str = "default-src 'self'; script-src 'self'; style-src 'self'; \
img-src 'self' data:; connect-src 'self'; font-src 'self'; object-src 'none'; \
base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// The page served when the binary was built without `console/dist`.
const NOT_BUILT: &str = "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">\
<title>freesan console not built</title></head><body><main><h1>This build of freesan has no console</h1>\
<p>The web console is built from <code>console/</code> in the source tree by \
<code>scripts/build-console</code> (needs node and npm), before cargo embeds it. Run it, \
then build freesan again (<code>cargo build --release</code>).</p>\
<p>The management API answers on this listener as usual under <code>/api/v1/</code>.</p>\
</main></body></html>";

/// The console's router: the API's routes (behind `gate`) and the static files.
pub fn router(control: crate::Ctl, gate: Arc<crate::guard::Gate>) -> Router {
    // the fallback is added after the gate's layer, so static files need no token
    crate::router(control, gate).fallback(static_file)
}

fn secure_headers(h: &mut HeaderMap) {
    // a static answer needs no token, so it does not keep the connection: a
    // client re-requesting a page every few seconds held one of the
    // listener's slots for its whole lifetime, ten minutes, without ever
    // showing a token (review of 2026-12-06)
    h.insert(header::CONNECTION, HeaderValue::from_static("close"));
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
}

fn accepts_gzip(h: &HeaderMap) -> bool {
    h.get_all(header::ACCEPT_ENCODING)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|e| {
            let mut parts = e.split(';');
            let name = parts.next().unwrap_or("").trim();
            let refused = parts.any(|p| {
                p.trim()
                    .strip_prefix("q=")
                    .and_then(|q| q.trim().parse::<f32>().ok())
                    .is_some_and(|q| q <= 0.0)
            });
            name.eq_ignore_ascii_case("gzip") && !refused
        })
}

async fn static_file(method: Method, uri: Uri, headers: HeaderMap) -> Response {
    let path = uri.path();
    if path.starts_with("/api/") || path == "/metrics" {
        let mut r = crate::ApiError::NotFound(format!("no route {path}")).into_response();
        secure_headers(r.headers_mut());
        return r;
    }
    if method != Method::GET && method != Method::HEAD {
        let mut r = (StatusCode::METHOD_NOT_ALLOWED, "only GET").into_response();
        r.headers_mut()
            .insert(header::ALLOW, HeaderValue::from_static("GET, HEAD"));
        secure_headers(r.headers_mut());
        return r;
    }
    let rel = match path.trim_start_matches('/') {
        "" => "index.html",
        p => p,
    };
    let mut r = if !console_assets::built() {
        (
            StatusCode::OK,
            [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
            NOT_BUILT,
        )
            .into_response()
    } else if let Some(a) = console_assets::get(rel) {
        let gz = a.gzip.filter(|_| accepts_gzip(&headers));
        let mut r = Response::new(Body::from(gz.unwrap_or(a.body)));
        let h = r.headers_mut();
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static(a.content_type()),
        );
        if gz.is_some() {
            h.insert(header::CONTENT_ENCODING, HeaderValue::from_static("gzip"));
        }
        if a.gzip.is_some() {
            h.insert(header::VARY, HeaderValue::from_static("Accept-Encoding"));
        }
        h.insert(
            header::CACHE_CONTROL,
            HeaderValue::from_static(if a.immutable() {
                "public, max-age=31536000, immutable"
            } else {
                "no-cache"
            }),
        );
        r
    } else {
        (
            StatusCode::NOT_FOUND,
            [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
            "not found",
        )
            .into_response()
    };
    secure_headers(r.headers_mut());
    if method == Method::HEAD {
        *r.body_mut() = Body::empty();
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gzip_negotiation() {
        let mut h = HeaderMap::new();
        assert!(!accepts_gzip(&h));
        h.insert(
            header::ACCEPT_ENCODING,
            HeaderValue::from_static("gzip, deflate, br"),
        );
        assert!(accepts_gzip(&h));
        h.insert(
            header::ACCEPT_ENCODING,
            HeaderValue::from_static("br;q=1, gzip;q=0"),
        );
        assert!(!accepts_gzip(&h));
        h.insert(
            header::ACCEPT_ENCODING,
            HeaderValue::from_static("identity"),
        );
        assert!(!accepts_gzip(&h));
    }
}
