//! `freesan api ...`: the management API's tokens and audit log, and how the
//! other API commands (`pool`, `disk`, `lun`, `cache`, `replica`) find the token
//! they send.
//!
//! The token a command sends is, first found: `--token`, `$FREESAN_API_TOKEN`,
//! `--data-dir DIR` (then `DIR/api/cli-token`), the data directory of the node
//! serving the API address on this host (each node notes it in a private runtime
//! folder, see [`control::api_node`]), `./freesan-data/api/cli-token`, then the
//! package's `/var/lib/freesan/api/cli-token` (the service runs as its own user
//! with a private /tmp, so its note is not where root's CLI looks). When the
//! node serves TLS, the CLI trusts only its certificate: `--tls-cert`, else
//! `api/serving-cert.pem` of the data directory the token came from.
//!
//! What it does not do: check tokens (the node does) or send a token anywhere but
//! the API address given.

use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// The default data directory, as `freesan serve` uses it.
pub const DEFAULT_DATA_DIR: &str = "./freesan-data";

/// The data directory of the installed service (`packaging/freesan.toml`).
pub const PACKAGED_DATA_DIR: &str = "/var/lib/freesan";

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

fn token(mut cmd: TokenCmd) -> Result<()> {
    let (TokenCmd::Create { data_dir, .. }
    | TokenCmd::List { data_dir, .. }
    | TokenCmd::Revoke { data_dir, .. }) = &mut cmd;
    *data_dir = act_as_owner_of(data_dir)?;
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

/// Root working on the data directory of a node run as a user of its own
/// (the package's `freesan`) becomes that user for good before touching it,
/// so what it writes there is the node's. Before, `freesan api token create`
/// run by root left a tokens file of root's, mode 0600: the node could no
/// longer read it and accepted no token at all, its CLI's own included.
/// Nothing to do for any other user (the node's folder is 0700: only its
/// owner gets in) or a folder root owns or that does not exist yet.
///
/// Answers the folder's path to use from then on: resolved by root (the
/// user may not be able to search the current folder), so the folder looked
/// at is the one used. The user's groups are its own (its passwd entry and
/// `initgroups`), not the folder's group, which may be root's.
pub(crate) fn act_as_owner_of(data_dir: &Path) -> Result<PathBuf> {
    use std::os::unix::fs::MetadataExt;
    // SAFETY: geteuid only reads the process's credentials.
    if unsafe { libc::geteuid() } != 0 {
        return Ok(data_dir.to_path_buf());
    }
    let Ok(dir) = std::fs::canonicalize(data_dir) else {
        return Ok(data_dir.to_path_buf());
    };
    let uid = std::fs::metadata(&dir)
        .with_context(|| format!("{}", dir.display()))?
        .uid();
    if uid == 0 {
        return Ok(dir);
    }
    let Some((name, gid)) = block::private::user_entry(uid) else {
        bail!(
            "{} belongs to uid {uid}, which has no user entry: not acting for it",
            dir.display()
        );
    };
    if gid == 0 {
        bail!(
            "{} belongs to uid {uid}, whose group is root's: not acting for it",
            dir.display()
        );
    }
    // SAFETY: plain system calls on this process's credentials; `name` is a
    // C string that outlives the call. glibc applies each to every thread of
    // the process. Groups, then the group, then the user: once the user is
    // changed, none could be.
    let failed = unsafe {
        libc::initgroups(name.as_ptr(), gid) != 0
            || libc::setresgid(gid, gid, gid) != 0
            || libc::setresuid(uid, uid, uid) != 0
    };
    if failed {
        bail!(
            "becoming user {uid} (the owner of {}) failed: {}",
            dir.display(),
            std::io::Error::last_os_error()
        );
    }
    Ok(dir)
}

/// What the API commands of this process send and trust (set once in `main`).
struct Credentials {
    token: Option<String>,
    /// The node's certificate to pin; None: plain HTTP.
    pin: Option<PathBuf>,
    /// Who may have accepted a plain connection on loopback before the token
    /// goes to it (see [`check_local_listener`]).
    listeners: Vec<u32>,
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
    if let Some(t) = a.token.as_deref() {
        // `ps` shows the command line to every user of the host
        crate::cmdline::hide_option("--token", t);
    }
    let (token, from) = find_token(a);
    let mut dirs: Vec<PathBuf> = from.into_iter().collect();
    dirs.extend(a.data_dir.clone());
    let _ = CREDENTIALS.set(Credentials {
        token,
        pin: find_pin(a),
        listeners: node_users(&dirs),
    });
}

/// The users a node this CLI talks to may run as: root, this CLI's own user,
/// the owner of the `api/` folder of `dirs` (the data directory the token was
/// read from and `--data-dir`: the node made them), and, for root's CLI, the
/// owner of the package's `/var/lib/freesan`, the user the service runs as
/// (only root can make or give away a folder in a `/var/lib` only root may
/// write), also when the token comes from elsewhere. Not
/// every directory looked in: `./freesan-data` in a folder another user
/// controls would have let that user in (review of 2026-12-07).
fn node_users(dirs: &[PathBuf]) -> Vec<u32> {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    // SAFETY: geteuid only reads the process's credentials.
    let mut users = vec![0, unsafe { libc::geteuid() }];
    for d in dirs {
        if let Ok(m) = std::fs::metadata(d.join("api")) {
            users.push(m.uid());
        }
    }
    // (for root's CLI alone: another user's node on the same port while it
    // is down would be sent that user's token)
    // SAFETY: as above.
    let root = unsafe { libc::geteuid() } == 0;
    let packaged = Path::new(PACKAGED_DATA_DIR);
    let only_root_writes = |p: &Path| {
        std::fs::symlink_metadata(p)
            .is_ok_and(|m| m.is_dir() && m.uid() == 0 && m.permissions().mode() & 0o022 == 0)
    };
    if root && packaged.ancestors().skip(1).all(only_root_writes) {
        if let Some(m) = std::fs::symlink_metadata(packaged)
            .ok()
            .filter(|m| m.is_dir())
        {
            users.push(m.uid());
        }
    }
    users.sort_unstable();
    users.dedup();
    users
}

/// Before a token goes in clear to an address on loopback (no certificate
/// pinned): the socket that accepted `s` must belong to a user the node may
/// run as ([`node_users`]), as `/proc/net/tcp` tells. Any local user can bind
/// the API's port while the node is down; before, the CLI sent it the token
/// (an admin's, or the node's `local-cli` one). The accepted socket is the
/// listener's, so its owner is the listening process's user.
pub(crate) fn check_local_listener(s: &std::net::TcpStream) -> Result<()> {
    let allowed = CREDENTIALS
        .get()
        .map(|c| c.listeners.clone())
        .unwrap_or_default();
    let (me, node) = (s.local_addr()?, s.peer_addr()?);
    let tables: Vec<String> = ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .filter_map(|t| std::fs::read_to_string(t).ok())
        .collect();
    match crate::sockets::owner_of_accepted(&tables, node, me) {
        Some(uid) if allowed.contains(&uid) => Ok(()),
        Some(uid) => bail!(
            "the program that accepted the connection to {node} runs as user {uid}, \
             not as the node may (users {allowed:?}): the token was not sent. Another \
             program holds the API's port (is the node down?); with the node's \
             certificate pinned (--tls-cert, [api] tls = true) the CLI checks the node \
             itself"
        ),
        None => bail!(
            "cannot tell who accepted the connection to {node} (/proc/net/tcp): the \
             token was not sent in clear; pin the node's certificate (--tls-cert, \
             [api] tls = true)"
        ),
    }
}

/// The data directories to look in, in order: `--data-dir`, else the node noted
/// for the API address, then `./freesan-data`.
fn data_dirs(a: &crate::poolcmd::ApiArg) -> Vec<PathBuf> {
    if let Some(d) = &a.data_dir {
        return vec![d.clone()];
    }
    let mut v: Vec<PathBuf> = control::api_node::local_node_data_dir(a.api)
        .into_iter()
        .collect();
    v.push(PathBuf::from(DEFAULT_DATA_DIR));
    v.push(PathBuf::from(PACKAGED_DATA_DIR));
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

/// The token to send, and the data directory it was read from (None: given
/// by the command line, a token file or the environment).
fn find_token(a: &crate::poolcmd::ApiArg) -> (Option<String>, Option<PathBuf>) {
    if let Some(t) = a.token.as_deref().filter(|t| !t.is_empty()) {
        return (Some(t.to_string()), None);
    }
    if let Some(f) = &a.token_file {
        // its first line; a file that cannot be read is said so (the hint
        // for a missing token would send the user back to --token-file)
        let t = match std::fs::read_to_string(f) {
            Ok(t) => t
                .lines()
                .next()
                .map(str::trim)
                .filter(|t| !t.is_empty())
                .map(String::from),
            Err(e) => {
                eprintln!("freesan: --token-file {}: {e}", f.display());
                None
            }
        };
        return (t, None);
    }
    if let Ok(t) = std::env::var("FREESAN_API_TOKEN") {
        if !t.trim().is_empty() {
            return (Some(t.trim().to_string()), None);
        }
    }
    data_dirs(a)
        .into_iter()
        .find_map(|d| read_token_file(&api::tokens::cli_token_file(&d)).map(|t| (Some(t), Some(d))))
        .unwrap_or((None, None))
}

/// Says what to do when the node answered 401.
pub(crate) fn unauthorized_hint() -> Result<()> {
    if token_to_send().is_none() {
        bail!(
            "the node asks for a token and none was found: pass --token-file, set \
             FREESAN_API_TOKEN, or --data-dir of the node (its api/cli-token is read)"
        );
    }
    bail!("the node refused the token (HTTP 401): revoked, or from another node?")
}
