//! The node's side of the management API's set-up: the admin token the local CLI
//! reads (`DATA_DIR/api/cli-token`), the API's TLS credentials (configured, or
//! made at first start) with a copy of the certificate served for local clients
//! to pin, and a note in a private runtime folder that lets the CLI of the same
//! user on the same host find the node's data directory from its API address.
//!
//! What it does not do: check tokens or serve requests (the `api` crate does), or
//! choose what a CLI command sends (the binary's `apicmd` reads these files).

use anyhow::{Context, Result};
use std::net::SocketAddr;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// A private folder of this user for notes between local processes:
/// `$XDG_RUNTIME_DIR/freesan`, else `/tmp/freesan-UID`; created 0700 and used
/// only when owned by this user with no access for others.
fn runtime_dir(create: bool) -> Option<PathBuf> {
    // SAFETY: geteuid has no preconditions.
    let uid = unsafe { libc::geteuid() };
    // another user's runtime folder (root started with that user's
    // environment, `sudo -E`) is not ours: that user could swap what is in it
    let own = |d: &std::ffi::OsStr| {
        std::fs::symlink_metadata(d).is_ok_and(|m| m.is_dir() && m.uid() == uid)
    };
    let dir = match std::env::var_os("XDG_RUNTIME_DIR").filter(|d| own(d)) {
        Some(d) => PathBuf::from(d).join("freesan"),
        None => PathBuf::from(format!("/tmp/freesan-{uid}")),
    };
    if create {
        let _ = std::fs::DirBuilder::new().mode(0o700).create(&dir);
    }
    let m = std::fs::symlink_metadata(&dir).ok()?;
    if !m.is_dir() || m.uid() != uid || m.mode() & 0o077 != 0 {
        if create {
            tracing::warn!(
                "{} is not a private folder of this user: the local CLI will need --data-dir or --token",
                dir.display()
            );
        }
        return None;
    }
    Some(dir)
}

/// The network namespace this process is in (two nodes in two namespaces may
/// use the same API address).
fn netns_id() -> u64 {
    std::fs::metadata("/proc/self/ns/net")
        .map(|m| m.ino())
        .unwrap_or(0)
}

fn note_path(dir: &Path, api: SocketAddr) -> PathBuf {
    let addr = api.to_string().replace([':', '[', ']'], "_");
    dir.join(format!("api-{}-{addr}", netns_id()))
}

/// Notes, for the CLI of this user on this host, that the API at `api` belongs to
/// the node whose data directory is `data_dir` (the note holds only the path;
/// the token stays in `DATA_DIR/api/cli-token`, readable by this user alone).
pub(crate) fn note_local_node(api: SocketAddr, data_dir: &Path) {
    let Some(dir) = runtime_dir(true) else { return };
    let Ok(abs) = std::path::absolute(data_dir) else {
        return;
    };
    let path = note_path(&dir, api);
    // a temporary name of this process's own: `with_extension` would cut the
    // address at its last dot, giving every node the same temporary file
    let mut tmp = path.clone().into_os_string();
    tmp.push(format!(".new.{}", std::process::id()));
    let tmp = PathBuf::from(tmp);
    let write = || -> std::io::Result<()> {
        // never through a link planted under the temporary name
        let _ = std::fs::remove_file(&tmp);
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&tmp)?;
        use std::io::Write;
        f.write_all(abs.as_os_str().as_encoded_bytes())?;
        std::fs::rename(&tmp, &path)
    };
    if let Err(e) = write() {
        tracing::warn!(
            "cannot note the API for the local CLI in {}: {e}",
            path.display()
        );
    }
}

/// Removes the note of [`note_local_node`] if it still names `data_dir`.
pub(crate) fn forget_local_node(api: SocketAddr, data_dir: &Path) {
    let Some(dir) = runtime_dir(false) else {
        return;
    };
    let path = note_path(&dir, api);
    if local_node_data_dir(api).as_deref() == std::path::absolute(data_dir).ok().as_deref() {
        let _ = std::fs::remove_file(path);
    }
}

/// The data directory of the node noted for `api` (see [`note_local_node`]).
pub fn local_node_data_dir(api: SocketAddr) -> Option<PathBuf> {
    let dir = runtime_dir(false)?;
    let path = note_path(&dir, api);
    let m = std::fs::symlink_metadata(&path).ok()?;
    // SAFETY: geteuid has no preconditions.
    if !m.is_file() || m.uid() != unsafe { libc::geteuid() } {
        return None;
    }
    let text = std::fs::read(&path).ok()?;
    let s = String::from_utf8(text).ok()?;
    Some(PathBuf::from(s))
}

/// Makes sure the node's data directory holds an admin token for the local CLI
/// (`DATA_DIR/api/cli-token`, 0600 in a 0700 folder).
pub(crate) fn prepare_node(data_dir: &Path) -> Result<()> {
    if api::tokens::ensure_cli_token(data_dir)
        .with_context(|| format!("API tokens in {}", data_dir.display()))?
    {
        eprintln!(
            "  made an admin token for the local CLI: {}",
            api::tokens::cli_token_file(data_dir).display()
        );
    }
    Ok(())
}

/// The API's TLS configuration, or None when it speaks plain HTTP. Uses the
/// configured certificate, else one made at first start in the data directory
/// (for `localhost`, loopback, the API's and the console's addresses and `[api]
/// hosts`), and
/// copies the certificate served to `DATA_DIR/api/serving-cert.pem` for local
/// clients to pin (removed when TLS is off).
pub(crate) fn prepare_tls(
    a: &crate::config::ApiConfig,
    data_dir: &Path,
) -> Result<Option<std::sync::Arc<api::tls::rustls::ServerConfig>>> {
    let serving = api::tls::serving_cert_file(data_dir);
    if !a.tls_enabled() {
        match std::fs::remove_file(&serving) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e).with_context(|| format!("removing {}", serving.display())),
        }
        return Ok(None);
    }
    let (cert, key) = match (&a.cert, &a.key) {
        (Some(c), Some(k)) => {
            crate::secrets::check_private(k, "[api] key")?;
            (c.clone(), k.clone())
        }
        _ => {
            let mut names = a.hosts.clone();
            for ip in std::iter::once(a.address.ip()).chain(a.console.map(|c| c.ip())) {
                if !ip.is_unspecified() && !names.contains(&ip.to_string()) {
                    names.push(ip.to_string());
                }
            }
            api::tls::ensure_generated(data_dir, &names)?
        }
    };
    let cfg = api::tls::server_config(&cert, &key)
        .with_context(|| format!("API TLS with {} and {}", cert.display(), key.display()))?;
    let pem = std::fs::read(&cert).with_context(|| format!("reading {}", cert.display()))?;
    api::tokens::write_private_atomic(&serving, &pem)?;
    eprintln!("  api tls:        certificate {}", cert.display());
    Ok(Some(cfg))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nodes_noting_their_apis_at_once_keep_their_own_notes() {
        // ports no test node listens on; each thread notes its own address over
        // and over, as nodes starting together do
        let addrs: Vec<SocketAddr> = (1..=4)
            .map(|p| SocketAddr::from(([127, 0, 0, 1], p)))
            .collect();
        let dirs: Vec<PathBuf> = (1..=4)
            .map(|i| PathBuf::from(format!("/nonexistent/node{i}")))
            .collect();
        std::thread::scope(|s| {
            for (a, d) in addrs.iter().zip(&dirs) {
                s.spawn(move || {
                    for _ in 0..200 {
                        note_local_node(*a, d);
                        assert_eq!(local_node_data_dir(*a).as_deref(), Some(d.as_path()));
                    }
                });
            }
        });
        for (a, d) in addrs.iter().zip(&dirs) {
            forget_local_node(*a, d);
            assert_eq!(local_node_data_dir(*a), None);
        }
    }
}
