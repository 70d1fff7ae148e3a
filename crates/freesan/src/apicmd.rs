//! `freesan api ...`: the management API's tokens and audit log, and how the
//! other API commands (`pool`, `disk`, `lun`, `cache`, `replica`) find the token
//! they send.
//!
//! The token a command sends is, first found: `--token`, `$FREESAN_API_TOKEN`,
//! `--data-dir DIR` (then `DIR/api/cli-token`), the data directory of the node
//! serving the API address on this host (each node notes it in a private runtime
//! folder, see [`note_local_node`]), `./freesan-data/api/cli-token`. When the
//! node serves TLS, the CLI trusts only its certificate: `--tls-cert`, else
//! `api/serving-cert.pem` of the data directory the token came from.
//!
//! What it does not do: check tokens (the node does) or send a token anywhere but
//! the API address given.

use anyhow::{bail, Context, Result};
use std::net::SocketAddr;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// The default data directory, as `freesan serve` uses it.
pub const DEFAULT_DATA_DIR: &str = "./freesan-data";

/// `freesan api` subcommands.
#[derive(clap::Subcommand, Debug, Clone)]
pub enum ApiCmd {
    /// Make, list and revoke the API's tokens (works whether or not the node runs;
    /// a running node sees the change at once).
    Token {
        #[command(subcommand)]
        cmd: TokenCmd,
    },
    /// The audit log: every change made through the API (who, what, when, result).
    Audit {
        #[command(flatten)]
        api: crate::poolcmd::ApiArg,
        /// How many of the latest entries (at most 1000).
        #[arg(long, default_value_t = 50)]
        limit: usize,
        /// Print the raw JSON.
        #[arg(long)]
        json: bool,
    },
}

/// `freesan api token` subcommands.
#[derive(clap::Subcommand, Debug, Clone)]
pub enum TokenCmd {
    /// Make a token; it is printed once (only its hash is kept).
    Create {
        /// admin (everything) or read-only (GET requests only).
        #[arg(long)]
        role: api::tokens::Role,
        /// A name for people and the audit log (default: ROLE-TIME).
        #[arg(long)]
        name: Option<String>,
        /// The node's data directory.
        #[arg(long, value_name = "DIR", default_value = DEFAULT_DATA_DIR)]
        data_dir: PathBuf,
    },
    /// List the tokens (id, name, role, creation time; never the secrets).
    List {
        /// The node's data directory.
        #[arg(long, value_name = "DIR", default_value = DEFAULT_DATA_DIR)]
        data_dir: PathBuf,
        /// Print the raw JSON.
        #[arg(long)]
        json: bool,
    },
    /// Revoke a token by id or name; the node refuses it from then on.
    Revoke {
        /// The token's id or name (see `token list`).
        token: String,
        /// The node's data directory.
        #[arg(long, value_name = "DIR", default_value = DEFAULT_DATA_DIR)]
        data_dir: PathBuf,
    },
}

fn now_unix_s() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Runs a `freesan api` subcommand.
pub fn run(cmd: ApiCmd) -> Result<()> {
    match cmd {
        ApiCmd::Token { cmd } => token(cmd),
        ApiCmd::Audit { api, limit, json } => {
            use_credentials(&api);
            let path = format!("/api/v1/audit?limit={}", limit.min(1000));
            let (code, v) = crate::poolcmd::http(api.api, "GET", &path, None)?;
            let v = crate::poolcmd::ok_or_error(code, v)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&v)?);
                return Ok(());
            }
            let entries: Vec<api::audit::AuditEntry> =
                serde_json::from_value(v).context("malformed audit answer")?;
            if entries.is_empty() {
                println!("no changes recorded");
            }
            for e in entries {
                println!(
                    "{}  {:<12} {:<9} {} {} {} -> {}",
                    e.time_unix_ms / 1000,
                    e.who,
                    e.role,
                    e.source,
                    e.method,
                    e.path,
                    e.status
                );
                if !e.body.is_null() {
                    println!("    {}", e.body);
                }
            }
            Ok(())
        }
    }
}

fn token(cmd: TokenCmd) -> Result<()> {
    match cmd {
        TokenCmd::Create {
            role,
            name,
            data_dir,
        } => {
            let name = name.unwrap_or_else(|| format!("{}-{}", role.as_str(), now_unix_s()));
            let (rec, token) = api::tokens::create(&data_dir, &name, role)
                .with_context(|| format!("making a token in {}", data_dir.display()))?;
            eprintln!(
                "token {} ({}, {}) made; it is shown once, keep it safe:",
                rec.name,
                rec.role.as_str(),
                rec.id
            );
            println!("{token}");
        }
        TokenCmd::List { data_dir, json } => {
            let list = api::tokens::list(&data_dir)?;
            if json {
                let v: Vec<_> = list
                    .iter()
                    .map(|t| {
                        serde_json::json!({
                            "id": t.id, "name": t.name, "role": t.role.as_str(),
                            "created_unix_s": t.created_unix_s,
                        })
                    })
                    .collect();
                println!("{}", serde_json::to_string_pretty(&v)?);
            } else {
                if list.is_empty() {
                    println!("no tokens in {}", data_dir.display());
                }
                for t in list {
                    println!(
                        "{}  {:<10} {:<24} created {}",
                        t.id,
                        t.role.as_str(),
                        t.name,
                        t.created_unix_s
                    );
                }
            }
        }
        TokenCmd::Revoke { token, data_dir } => {
            let rec = api::tokens::revoke(&data_dir, &token)?;
            println!("revoked {} ({}, {})", rec.name, rec.role.as_str(), rec.id);
        }
    }
    Ok(())
}

/// What the API commands of this process send and trust (set once in `main`).
struct Credentials {
    token: Option<String>,
    /// The node's certificate to pin; None: plain HTTP.
    pin: Option<PathBuf>,
}

static CREDENTIALS: OnceLock<Credentials> = OnceLock::new();

/// The token to send, if one was found.
pub(crate) fn token_to_send() -> Option<&'static str> {
    CREDENTIALS.get().and_then(|c| c.token.as_deref())
}

/// The TLS client configuration when the node's certificate is pinned.
pub(crate) fn tls_to_use() -> Result<Option<std::sync::Arc<api::tls::rustls::ClientConfig>>> {
    match CREDENTIALS.get().and_then(|c| c.pin.as_deref()) {
        None => Ok(None),
        Some(p) => Ok(Some(
            api::tls::pinned_client_config(p)
                .with_context(|| format!("the node's certificate {}", p.display()))?,
        )),
    }
}

/// Finds the token and the certificate to pin for the API at `a.api` (see the
/// module header for the order) and keeps them for [`crate::poolcmd::http`].
pub(crate) fn use_credentials(a: &crate::poolcmd::ApiArg) {
    let _ = CREDENTIALS.set(Credentials {
        token: find_token(a),
        pin: find_pin(a),
    });
}

/// The data directories to look in, in order: `--data-dir`, else the node noted
/// for the API address, then `./freesan-data`.
fn data_dirs(a: &crate::poolcmd::ApiArg) -> Vec<PathBuf> {
    if let Some(d) = &a.data_dir {
        return vec![d.clone()];
    }
    let mut v: Vec<PathBuf> = local_node_data_dir(a.api).into_iter().collect();
    v.push(PathBuf::from(DEFAULT_DATA_DIR));
    v
}

fn find_pin(a: &crate::poolcmd::ApiArg) -> Option<PathBuf> {
    if let Some(p) = &a.tls_cert {
        return Some(p.clone());
    }
    // the first data directory that has a token decides
    data_dirs(a)
        .into_iter()
        .find(|d| api::tokens::cli_token_file(d).exists() || a.data_dir.is_some())
        .map(|d| api::tls::serving_cert_file(&d))
        .filter(|p| p.exists())
}

fn read_token_file(p: &Path) -> Option<String> {
    let t = std::fs::read_to_string(p).ok()?;
    let t = t.trim();
    (!t.is_empty()).then(|| t.to_string())
}

fn find_token(a: &crate::poolcmd::ApiArg) -> Option<String> {
    if let Some(t) = a.token.as_deref().filter(|t| !t.is_empty()) {
        return Some(t.to_string());
    }
    if let Ok(t) = std::env::var("FREESAN_API_TOKEN") {
        if !t.trim().is_empty() {
            return Some(t.trim().to_string());
        }
    }
    data_dirs(a)
        .iter()
        .find_map(|d| read_token_file(&api::tokens::cli_token_file(d)))
}

/// A private folder of this user for notes between local processes:
/// `$XDG_RUNTIME_DIR/freesan`, else `/tmp/freesan-UID`; created 0700 and used
/// only when owned by this user with no access for others.
fn runtime_dir(create: bool) -> Option<PathBuf> {
    // SAFETY: geteuid has no preconditions.
    let uid = unsafe { libc::geteuid() };
    let dir = match std::env::var_os("XDG_RUNTIME_DIR").filter(|d| Path::new(d).is_dir()) {
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
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
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
fn local_node_data_dir(api: SocketAddr) -> Option<PathBuf> {
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

/// Says what to do when the node answered 401.
pub(crate) fn unauthorized_hint() -> Result<()> {
    if token_to_send().is_none() {
        bail!(
            "the node asks for a token and none was found: pass --token, set \
             FREESAN_API_TOKEN, or --data-dir of the node (its api/cli-token is read)"
        );
    }
    bail!("the node refused the token (HTTP 401): revoked, or from another node?")
}

/// The API's TLS configuration, or None when it speaks plain HTTP. Uses the
/// configured certificate, else one made at first start in the data directory
/// (for `localhost`, loopback, the listening address and `[api] hosts`), and
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
        (Some(c), Some(k)) => (c.clone(), k.clone()),
        _ => {
            let mut names = a.hosts.clone();
            if !a.address.ip().is_unspecified() {
                names.push(a.address.ip().to_string());
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
