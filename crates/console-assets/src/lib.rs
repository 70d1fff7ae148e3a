//! freesan's web console, embedded: the files of `console/dist` (built from
//! `console/` by `scripts/build-console`) as a static table, each with its
//! gzip-compressed copy when the build made one.
//!
//! What it does not do: serve anything (the API crate does), or build the
//! console (node does, before cargo). A build without `console/dist` has an
//! empty table: [`built`] is false and the server answers a page saying how to
//! build the console.

/// One embedded file.
#[derive(Debug, Clone, Copy)]
pub struct Asset {
    /// Its path under dist, without a leading slash (`index.html`, `app-XXXX.js`).
    pub path: &'static str,
    /// Its bytes.
    pub body: &'static [u8],
    /// The same bytes gzip-compressed, when the build made them.
    pub gzip: Option<&'static [u8]>,
}

impl Asset {
    /// The Content-Type its extension calls for.
    pub fn content_type(&self) -> &'static str {
        content_type(self.path)
    }

    /// Whether its name carries a content hash (`name-HASH.ext`, as esbuild
    /// writes them): such a file never changes and may be cached for long.
    pub fn immutable(&self) -> bool {
        let stem = self.path.rsplit('/').next().unwrap_or(self.path);
        let stem = stem.split('.').next().unwrap_or(stem);
        stem.rsplit_once('-')
            .is_some_and(|(_, h)| h.len() >= 8 && h.bytes().all(|b| b.is_ascii_alphanumeric()))
    }
}

type Entry = (&'static str, &'static [u8], Option<&'static [u8]>);

static ASSETS: &[Entry] = include!(concat!(env!("OUT_DIR"), "/assets.rs"));

/// Whether this binary was built with the console (`console/dist` existed).
pub fn built() -> bool {
    ASSETS.iter().any(|(p, _, _)| *p == "index.html")
}

/// The embedded file at `path` (no leading slash), if any.
pub fn get(path: &str) -> Option<Asset> {
    ASSETS
        .iter()
        .find(|(p, _, _)| *p == path)
        .map(|&(path, body, gzip)| Asset { path, body, gzip })
}

/// Every embedded file.
pub fn all() -> impl Iterator<Item = Asset> {
    ASSETS
        .iter()
        .map(|&(path, body, gzip)| Asset { path, body, gzip })
}

/// The Content-Type for a file name's extension.
pub fn content_type(path: &str) -> &'static str {
    match path.rsplit_once('.').map(|(_, e)| e) {
        Some("html") => "text/html; charset=utf-8",
        Some("js") | Some("mjs") => "text/javascript; charset=utf-8",
        Some("css") => "text/css; charset=utf-8",
        Some("svg") => "image/svg+xml",
        Some("png") => "image/png",
        Some("ico") => "image/x-icon",
        Some("json") => "application/json",
        Some("txt") => "text/plain; charset=utf-8",
        _ => "application/octet-stream",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashed_names_are_immutable() {
        let a = |path| Asset {
            path,
            body: b"",
            gzip: None,
        };
        assert!(a("app-5GZ3KQ7A.js").immutable());
        assert!(a("assets/app-5GZ3KQ7A.css").immutable());
        assert!(!a("index.html").immutable());
        assert!(!a("freesan-console.js").immutable());
        assert_eq!(content_type("x/app.js"), "text/javascript; charset=utf-8");
        assert_eq!(content_type("noext"), "application/octet-stream");
    }
}
