//! API tokens: random bearer tokens with a role, kept only as SHA-256 hashes in
//! `DATA_DIR/api/tokens.json` (mode 0600, folder 0700, replaced atomically).
//!
//! A token is `fsn_` followed by 64 hex digits (32 random bytes from the OS's
//! generator); it is shown once when created and never stored in plain form here.
//! SHA-256 without salt is enough for secrets of 256 random bits (nothing to guess
//! from a dictionary); every lookup compares against every stored hash in constant
//! time, so timing tells nothing about which hash matched or how much of it.
//!
//! The serving node re-reads the file when its modification time or size changes
//! (checked on each request, at most once per [`RELOAD_CHECK_MS`]), so tokens made
//! or revoked by `freesan api token ...` apply without a restart.

use rand::RngCore;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use subtle::ConstantTimeEq;

/// How often (at most) a lookup looks at the file's modification time.
pub const RELOAD_CHECK_MS: u64 = 250;

/// What a token may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Role {
    /// Everything, reads and changes.
    #[serde(rename = "admin")]
    Admin,
    /// `GET` requests only.
    #[serde(rename = "read-only")]
    ReadOnly,
}

impl Role {
    /// The spelling used in files, the CLI and the audit log.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Admin => "admin",
            Role::ReadOnly => "read-only",
        }
    }
}

impl std::str::FromStr for Role {
    type Err = String;
    fn from_str(s: &str) -> Result<Role, String> {
        match s {
            "admin" => Ok(Role::Admin),
            "read-only" => Ok(Role::ReadOnly),
            _ => Err(format!("unknown role {s:?} (admin or read-only)")),
        }
    }
}

/// One stored token: everything but the secret.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenRecord {
    /// Short random id (8 hex digits), unique in the file; `revoke` takes it.
    pub id: String,
    /// A name for people and the audit log (unique in the file).
    pub name: String,
    /// What it may do.
    pub role: Role,
    /// When it was made, seconds since the Unix epoch.
    pub created_unix_s: u64,
    /// SHA-256 of the whole token string, hex.
    pub sha256: String,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct TokenFile {
    tokens: Vec<TokenRecord>,
}

/// Why a token file operation failed.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    /// Reading or writing the file or its folder.
    #[error("{path}: {source}")]
    Io {
        /// The file or folder.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// The file is not what this code writes.
    #[error("{path}: not a token file: {msg}")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        msg: String,
    },
    /// Name taken, or nothing to revoke.
    #[error("{0}")]
    Refused(String),
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> TokenError + '_ {
    move |source| TokenError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Lower-case hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn sha256_hex(token: &str) -> String {
    hex(&Sha256::digest(token.as_bytes()))
}

/// The folder holding the token file and the CLI's token: `DATA_DIR/api`.
pub fn api_dir(data_dir: &Path) -> PathBuf {
    data_dir.join("api")
}

/// The token file of the node whose data directory is `data_dir`.
pub fn token_file(data_dir: &Path) -> PathBuf {
    api_dir(data_dir).join("tokens.json")
}

/// Where the node keeps an admin token for the CLI on its own host.
pub fn cli_token_file(data_dir: &Path) -> PathBuf {
    api_dir(data_dir).join("cli-token")
}

/// Creates `dir` (and parents) and makes it 0700.
pub fn private_dir(dir: &Path) -> Result<(), TokenError> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(io(dir))?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).map_err(io(dir))
}

/// Writes `bytes` to `path` atomically with mode 0600: a new file beside it,
/// fsync, rename over, fsync of the folder.
pub fn write_private_atomic(path: &Path, bytes: &[u8]) -> Result<(), TokenError> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let tmp = path.with_extension(format!("new.{}", std::process::id()));
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(io(&tmp))?;
    f.write_all(bytes).map_err(io(&tmp))?;
    f.sync_all().map_err(io(&tmp))?;
    drop(f);
    std::fs::rename(&tmp, path).map_err(io(path))?;
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io(dir))
}

/// Holds an exclusive `flock` on `DATA_DIR/api/tokens.lock` while alive, so two
/// `freesan api token` commands (or one and a starting node) never lose an update.
struct FileLock(std::fs::File);

impl FileLock {
    fn take(data_dir: &Path) -> Result<FileLock, TokenError> {
        let dir = api_dir(data_dir);
        private_dir(&dir)?;
        let path = dir.join("tokens.lock");
        let f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(&path)
            .map_err(io(&path))?;
        use std::os::fd::AsRawFd;
        // SAFETY: flock on a descriptor this function owns.
        if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) } != 0 {
            return Err(TokenError::Io {
                path,
                source: std::io::Error::last_os_error(),
            });
        }
        Ok(FileLock(f))
    }
}

impl Drop for FileLock {
    fn drop(&mut self) {
        use std::os::fd::AsRawFd;
        // SAFETY: unlocking the descriptor we locked.
        unsafe {
            libc::flock(self.0.as_raw_fd(), libc::LOCK_UN);
        }
    }
}

fn read_file(path: &Path) -> Result<TokenFile, TokenError> {
    parse_file(path, &read_bytes(path)?)
}

/// The file's bytes; none when it does not exist.
fn read_bytes(path: &Path) -> Result<Vec<u8>, TokenError> {
    match std::fs::read(path) {
        Ok(b) => Ok(b),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(io(path)(e)),
    }
}

fn parse_file(path: &Path, b: &[u8]) -> Result<TokenFile, TokenError> {
    if b.is_empty() {
        return Ok(TokenFile::default());
    }
    serde_json::from_slice(b).map_err(|e| TokenError::Corrupt {
        path: path.to_path_buf(),
        msg: e.to_string(),
    })
}

fn write_file(path: &Path, f: &TokenFile) -> Result<(), TokenError> {
    let mut text = serde_json::to_vec_pretty(f).map_err(|e| TokenError::Corrupt {
        path: path.to_path_buf(),
        msg: e.to_string(),
    })?;
    text.push(b'\n');
    write_private_atomic(path, &text)
}

fn now_unix_s() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Makes a new token for `name` with `role` in the token file of `data_dir`;
/// returns its record and the token itself (shown once; only its hash is kept).
pub fn create(
    data_dir: &Path,
    name: &str,
    role: Role,
) -> Result<(TokenRecord, String), TokenError> {
    if name.is_empty() || name.len() > 64 || name.chars().any(|c| c.is_control()) {
        return Err(TokenError::Refused(
            "a token name is 1-64 printable characters".into(),
        ));
    }
    let _lock = FileLock::take(data_dir)?;
    let path = token_file(data_dir);
    let mut file = read_file(&path)?;
    if file.tokens.iter().any(|t| t.name == name) {
        return Err(TokenError::Refused(format!(
            "a token named {name:?} exists (revoke it first, or pick another --name)"
        )));
    }
    let mut secret = [0u8; 32];
    rand::rngs::OsRng.fill_bytes(&mut secret);
    let token = format!("fsn_{}", hex(&secret));
    let id = loop {
        let mut b = [0u8; 4];
        rand::rngs::OsRng.fill_bytes(&mut b);
        let id = hex(&b);
        if !file.tokens.iter().any(|t| t.id == id) {
            break id;
        }
    };
    let rec = TokenRecord {
        id,
        name: name.to_string(),
        role,
        created_unix_s: now_unix_s(),
        sha256: sha256_hex(&token),
    };
    file.tokens.push(rec.clone());
    write_file(&path, &file)?;
    audit_token(data_dir, "create", &rec);
    Ok((rec, token))
}

/// Records a token made or revoked on this host (`freesan api token ...`, or
/// the node making the CLI's own) in the node's audit log, as the API's
/// changes are: granting a privilege leaves a trace. A failure to write it is
/// logged, not fatal (the token file is already written).
fn audit_token(data_dir: &Path, what: &str, rec: &TokenRecord) {
    let entry = crate::audit::AuditEntry {
        time_unix_ms: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0),
        who: "local".to_string(),
        token_id: rec.id.clone(),
        role: rec.role.as_str().to_string(),
        source: "local".to_string(),
        method: "TOKEN".to_string(),
        path: format!("token {what} {}", rec.name),
        body: serde_json::json!({ "name": rec.name, "role": rec.role.as_str() }),
        status: 200,
    };
    if let Err(e) = crate::audit::AuditLog::open(data_dir).append(&entry) {
        tracing::warn!("audit log in {}: {e}", data_dir.display());
    }
}

/// Every token of `data_dir` (without secrets: none are stored).
pub fn list(data_dir: &Path) -> Result<Vec<TokenRecord>, TokenError> {
    Ok(read_file(&token_file(data_dir))?.tokens)
}

/// Removes the token whose id or name is `which`; answers with its record.
pub fn revoke(data_dir: &Path, which: &str) -> Result<TokenRecord, TokenError> {
    let _lock = FileLock::take(data_dir)?;
    let path = token_file(data_dir);
    let mut file = read_file(&path)?;
    let Some(i) = file
        .tokens
        .iter()
        .position(|t| t.id == which || t.name == which)
    else {
        return Err(TokenError::Refused(format!(
            "no token with id or name {which:?}"
        )));
    };
    let rec = file.tokens.remove(i);
    write_file(&path, &file)?;
    audit_token(data_dir, "revoke", &rec);
    Ok(rec)
}

/// Makes sure the CLI on this host has an admin token: when
/// `DATA_DIR/api/cli-token` is missing or names a token no longer in the file, a
/// new admin token `local-cli` is made and written there (0600). Returns true
/// when a token was made.
pub fn ensure_cli_token(data_dir: &Path) -> Result<bool, TokenError> {
    let cli = cli_token_file(data_dir);
    if let Ok(t) = std::fs::read_to_string(&cli) {
        let store = TokenStore::open(data_dir);
        if store.verify(t.trim()).is_some() {
            return Ok(false);
        }
    }
    // a stale local-cli entry (its plain copy lost) is replaced
    if list(data_dir)?.iter().any(|t| t.name == "local-cli") {
        revoke(data_dir, "local-cli")?;
    }
    let (_, token) = create(data_dir, "local-cli", Role::Admin)?;
    write_private_atomic(&cli, format!("{token}\n").as_bytes())?;
    Ok(true)
}

/// Who a verified token belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    /// The token's name.
    pub name: String,
    /// The token's id.
    pub id: String,
    /// What it may do.
    pub role: Role,
}

struct Loaded {
    /// (mtime, length) of the file as last read; None when missing.
    /// The SHA-256 of the file's bytes when it was read (it is small, read
    /// at each check): its time and length were compared, and a revoke and
    /// a create that left a file of the same length within one tick of the
    /// clock went unseen, the revoked token still valid (review of
    /// 2026-12-06; the inode is no better: the filesystem hands the freed
    /// one to the next file renamed in).
    stamp: Option<[u8; 32]>,
    checked: Instant,
    tokens: Vec<([u8; 32], Caller)>,
}

/// The tokens a node accepts, re-read from the token file when it changes.
pub struct TokenStore {
    path: PathBuf,
    loaded: Mutex<Loaded>,
}

fn parse_hash(s: &str) -> Option<[u8; 32]> {
    if s.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(s.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

impl TokenStore {
    /// The store of the node whose data directory is `data_dir` (read lazily).
    pub fn open(data_dir: &Path) -> TokenStore {
        TokenStore {
            path: token_file(data_dir),
            loaded: Mutex::new(Loaded {
                stamp: None,
                checked: Instant::now() - Duration::from_secs(3600),
                tokens: Vec::new(),
            }),
        }
    }

    fn refresh(&self, l: &mut Loaded, force: bool) {
        if !force && l.checked.elapsed() < Duration::from_millis(RELOAD_CHECK_MS) {
            return;
        }
        l.checked = Instant::now();
        let bytes = read_bytes(&self.path);
        let stamp = bytes
            .as_ref()
            .ok()
            .map(|b| <[u8; 32]>::from(Sha256::digest(b)));
        if stamp == l.stamp && stamp.is_some() {
            return;
        }
        match bytes.and_then(|b| parse_file(&self.path, &b)) {
            Ok(f) => {
                l.tokens = f
                    .tokens
                    .into_iter()
                    .filter_map(|t| {
                        let h = parse_hash(&t.sha256)?;
                        Some((
                            h,
                            Caller {
                                name: t.name,
                                id: t.id,
                                role: t.role,
                            },
                        ))
                    })
                    .collect();
                l.stamp = stamp;
            }
            Err(e @ TokenError::Corrupt { .. }) => {
                // A half-written file cannot be seen (it is renamed into
                // place): this one was edited by hand or damaged. Keeping the
                // tokens loaded before would keep one the edit meant to remove,
                // so none is accepted until the file reads again (logged once
                // per change of the file).
                if !l.tokens.is_empty() || l.stamp != stamp {
                    tracing::error!(
                        "API tokens file unreadable, no token is accepted until it is fixed: {e}"
                    );
                }
                l.tokens.clear();
                l.stamp = stamp;
            }
            Err(e) => {
                // A read that failed (out of descriptors, an I/O error): none
                // is accepted now, and the file is read again at the next
                // check rather than when it next changes.
                tracing::warn!("API tokens file not read, no token is accepted until it is: {e}");
                l.tokens.clear();
                l.stamp = None;
            }
        }
    }

    /// The caller a presented token belongs to, or None. Every stored hash is
    /// compared (in constant time) whatever matches.
    pub fn verify(&self, presented: &str) -> Option<Caller> {
        self.verify_with(presented, false)
    }

    /// [`TokenStore::verify`] against the file as it is now (a stat, and a
    /// read if it changed), not as it was up to [`RELOAD_CHECK_MS`] ago: for
    /// an answer that waited (a long poll), so that a token revoked meanwhile
    /// gets nothing.
    pub fn verify_now(&self, presented: &str) -> Option<Caller> {
        self.verify_with(presented, true)
    }

    fn verify_with(&self, presented: &str, now: bool) -> Option<Caller> {
        let digest: [u8; 32] = Sha256::digest(presented.as_bytes()).into();
        let mut l = match self.loaded.lock() {
            Ok(l) => l,
            Err(p) => p.into_inner(),
        };
        self.refresh(&mut l, now);
        let find = |l: &Loaded| {
            let mut found = None;
            for (h, c) in &l.tokens {
                if bool::from(h.ct_eq(&digest)) {
                    found = Some(c.clone());
                }
            }
            found
        };
        if let Some(c) = find(&l) {
            return Some(c);
        }
        // a token made a moment ago may be newer than the last check: one more
        // look at the file's stamp (a stat; it is read again only if it changed)
        let before = l.stamp;
        self.refresh(&mut l, true);
        if l.stamp == before {
            return None;
        }
        find(&l)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_hashed_verified_listed_and_revoked() {
        let d = tempfile::tempdir().unwrap();
        let store = TokenStore::open(d.path());
        assert!(store.verify("fsn_nothing").is_none());
        let (rec, tok) = create(d.path(), "ops", Role::ReadOnly).unwrap();
        assert!(tok.starts_with("fsn_") && tok.len() == 68);
        let text = std::fs::read_to_string(token_file(d.path())).unwrap();
        assert!(!text.contains(&tok[4..]), "the plain token was stored");
        let mode = std::fs::metadata(token_file(d.path()))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        let c = store
            .verify(&tok)
            .expect("a new token is seen without restart");
        assert_eq!((c.name.as_str(), c.role), ("ops", Role::ReadOnly));
        assert!(store.verify(&format!("{tok}x")).is_none());
        assert!(create(d.path(), "ops", Role::Admin).is_err());
        assert_eq!(list(d.path()).unwrap(), vec![rec.clone()]);
        revoke(d.path(), &rec.id).unwrap();
        std::thread::sleep(Duration::from_millis(RELOAD_CHECK_MS + 50));
        assert!(store.verify(&tok).is_none(), "a revoked token still works");
    }

    /// A token file that no longer reads (a hand edit that broke the JSON)
    /// admits no token, not the ones loaded before: the edit may have been
    /// the removal of one. Once it reads again, its tokens work.
    #[test]
    fn a_token_file_that_does_not_read_admits_no_token() {
        let d = tempfile::tempdir().unwrap();
        let store = TokenStore::open(d.path());
        let (_, tok) = create(d.path(), "ops", Role::Admin).unwrap();
        assert!(store.verify(&tok).is_some());
        let good = std::fs::read(token_file(d.path())).unwrap();
        std::fs::write(token_file(d.path()), &good[..good.len() / 2]).unwrap();
        std::thread::sleep(Duration::from_millis(RELOAD_CHECK_MS + 50));
        assert!(
            store.verify(&tok).is_none(),
            "a token was accepted from a file that does not read"
        );
        std::fs::write(token_file(d.path()), &good).unwrap();
        std::thread::sleep(Duration::from_millis(RELOAD_CHECK_MS + 50));
        assert!(store.verify(&tok).is_some(), "the mended file is not read");
    }

    /// A revoke and a create that leave a file of the same length with the
    /// same modification time (one tick of a coarse clock) are still seen:
    /// the file is a new one (renamed over). Before (review of 2026-12-06),
    /// only the time and length were compared, and the revoked token kept
    /// working.
    #[test]
    fn a_change_within_one_clock_tick_is_seen() {
        let d = tempfile::tempdir().unwrap();
        let store = TokenStore::open(d.path());
        let (rec, old) = create(d.path(), "ops", Role::Admin).unwrap();
        assert!(store.verify_now(&old).is_some());
        let path = token_file(d.path());
        let before = std::fs::metadata(&path).unwrap();
        revoke(d.path(), &rec.id).unwrap();
        let (_, new) = create(d.path(), "ops", Role::Admin).unwrap();
        let after = std::fs::metadata(&path).unwrap();
        assert_eq!(
            after.len(),
            before.len(),
            "the test needs files of one length"
        );
        std::fs::File::options()
            .write(true)
            .open(&path)
            .unwrap()
            .set_modified(before.modified().unwrap())
            .unwrap();
        assert!(
            store.verify_now(&old).is_none(),
            "a revoked token still works"
        );
        assert!(store.verify_now(&new).is_some());
    }

    #[test]
    fn the_cli_token_is_made_once_and_remade_when_revoked() {
        let d = tempfile::tempdir().unwrap();
        assert!(ensure_cli_token(d.path()).unwrap());
        assert!(!ensure_cli_token(d.path()).unwrap());
        let t = std::fs::read_to_string(cli_token_file(d.path())).unwrap();
        let c = TokenStore::open(d.path()).verify(t.trim()).unwrap();
        assert_eq!(c.role, Role::Admin);
        revoke(d.path(), "local-cli").unwrap();
        assert!(ensure_cli_token(d.path()).unwrap());
        assert_eq!(list(d.path()).unwrap().len(), 1);
    }
}
