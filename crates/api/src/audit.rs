//! The audit log: one JSON line per changing request an authenticated caller made
//! (who, what, when, result), appended to `DATA_DIR/audit.log` (mode 0600) and
//! synced before the answer leaves. Secrets in request bodies are masked.
//!
//! Requests refused before a token was verified (wrong Host or Origin, no or a
//! wrong token) are not written here, so that nobody without a token can grow the
//! file; they are logged by the node (tracing) instead.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// At most this many bytes of a request body's summary are kept.
pub const BODY_SUMMARY_BYTES_MAX: usize = 1024;
/// `GET /api/v1/audit` reads at most this much of the file's end.
pub const TAIL_BYTES_MAX: u64 = 4 << 20;

/// One audited request.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct AuditEntry {
    /// When the answer was given, milliseconds since the Unix epoch.
    pub time_unix_ms: u64,
    /// The token's name.
    pub who: String,
    /// The token's id.
    pub token_id: String,
    /// The token's role.
    pub role: String,
    /// The caller's address.
    pub source: String,
    /// HTTP method.
    pub method: String,
    /// Request path (with query).
    pub path: String,
    /// The body, JSON with secrets masked, cut to [`BODY_SUMMARY_BYTES_MAX`].
    pub body: Value,
    /// The HTTP status of the answer.
    pub status: u16,
}

/// The audit log file.
pub struct AuditLog {
    path: PathBuf,
    file: Mutex<Option<std::fs::File>>,
    /// Past this size the log moves to `audit.log.1` (the one before is
    /// dropped) and a new one starts: two files at most, so no caller, a
    /// read-only token's refused changes included, can fill the disk with it.
    max_bytes: u64,
}

/// Size at which the audit log rotates ([`AuditLog::max_bytes`]).
pub const ROTATE_BYTES: u64 = 64 << 20;

fn key_is_secret(k: &str) -> bool {
    let k = k.to_ascii_lowercase();
    [
        "secret",
        "password",
        "passwd",
        "token",
        "key",
        "psk",
        "credential",
    ]
    .iter()
    .any(|s| k.contains(s))
}

/// A CHAP setting (`chap`, `chap_users`, `mutual_chap`...): only what is
/// known to be a name stays (the strings of a `..._users` list, and a CHAP
/// object's `user`, `name` or `initiator`); everything else under it is
/// masked, whatever its key. (Masking every such value whole hid the host
/// groups' `chap_users`, which are names.)
fn key_is_chap(k: &str) -> bool {
    k.to_ascii_lowercase().contains("chap")
}

/// A key inside a CHAP setting whose scalar value is a name.
fn key_is_name(k: &str) -> bool {
    matches!(
        k.to_ascii_lowercase().as_str(),
        "user" | "username" | "name" | "initiator"
    )
}

/// `v` with the value of every key that names a secret replaced by `"***"`.
pub fn mask(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .map(|(k, v)| {
                    let v = if key_is_secret(k) {
                        Value::String("***".into())
                    } else if key_is_chap(k) {
                        let names = k.to_ascii_lowercase().ends_with("_users");
                        mask_chap(v, names)
                    } else {
                        mask(v)
                    };
                    (k.clone(), v)
                })
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(mask).collect()),
        other => other.clone(),
    }
}

/// Inside a CHAP setting: the scalars of a list of names (`names`) and the
/// name fields of objects stay, every other scalar is masked.
fn mask_chap(v: &Value, names: bool) -> Value {
    match v {
        Value::Array(a) => Value::Array(a.iter().map(|e| mask_chap(e, names)).collect()),
        Value::Object(m) => Value::Object(
            m.iter()
                .map(|(k, v)| {
                    let scalar = !matches!(v, Value::Object(_) | Value::Array(_));
                    let v = if scalar && key_is_name(k) && !key_is_secret(k) {
                        v.clone()
                    } else {
                        mask_chap(v, false)
                    };
                    (k.clone(), v)
                })
                .collect(),
        ),
        Value::String(_) if names => v.clone(),
        _ => Value::String("***".into()),
    }
}

/// What the audit log keeps of a request body.
pub fn summarize(body: &[u8]) -> Value {
    if body.is_empty() {
        return Value::Null;
    }
    match serde_json::from_slice::<Value>(body) {
        // every change body is an object; one that is not (an array serde
        // would take for a struct: `["user", "secret"]`) is not kept
        Ok(v) if !v.is_object() => serde_json::json!({ "not_an_object_bytes": body.len() }),
        Ok(v) => {
            let m = mask(&v);
            let text = m.to_string();
            if text.len() <= BODY_SUMMARY_BYTES_MAX {
                m
            } else {
                let mut cut = BODY_SUMMARY_BYTES_MAX;
                while !text.is_char_boundary(cut) {
                    cut -= 1;
                }
                Value::String(format!("{}... ({} bytes)", &text[..cut], text.len()))
            }
        }
        Err(_) => serde_json::json!({ "not_json_bytes": body.len() }),
    }
}

impl AuditLog {
    /// The audit log of the node whose data directory is `data_dir`.
    pub fn open(data_dir: &Path) -> AuditLog {
        Self::with_max(data_dir, ROTATE_BYTES)
    }

    fn with_max(data_dir: &Path, max_bytes: u64) -> AuditLog {
        AuditLog {
            path: data_dir.join("audit.log"),
            file: Mutex::new(None),
            max_bytes,
        }
    }

    /// Where the log is.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Appends `e` and syncs it.
    pub fn append(&self, e: &AuditEntry) -> std::io::Result<()> {
        let mut line = serde_json::to_vec(e).map_err(std::io::Error::other)?;
        line.push(b'\n');
        let mut g = match self.file.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        if g.is_none() {
            *g = Some(
                std::fs::OpenOptions::new()
                    .append(true)
                    .create(true)
                    .mode(0o600)
                    .open(&self.path)?,
            );
        }
        let f = g.as_mut().ok_or_else(|| std::io::Error::other("no file"))?;
        f.write_all(&line)?;
        f.sync_data()?;
        if f.metadata()?.len() >= self.max_bytes {
            let old = self.path.with_extension("log.1");
            std::fs::rename(&self.path, &old)?;
            *g = None;
            // the rename must outlive a crash like the lines it moved
            if let Some(dir) = self.path.parent() {
                std::fs::File::open(dir)?.sync_all()?;
            }
        }
        Ok(())
    }

    /// The last `limit` entries, oldest first (lines that do not parse are skipped).
    pub fn tail(&self, limit: usize) -> std::io::Result<Vec<AuditEntry>> {
        let mut out = Self::tail_of(&self.path, limit)?;
        if out.len() < limit {
            // the rest from before the last rotation
            let mut older = Self::tail_of(&self.path.with_extension("log.1"), limit - out.len())?;
            older.append(&mut out);
            out = older;
        }
        Ok(out)
    }

    fn tail_of(path: &Path, limit: usize) -> std::io::Result<Vec<AuditEntry>> {
        let mut f = match std::fs::File::open(path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(e),
        };
        let len = f.metadata()?.len();
        let start = len.saturating_sub(TAIL_BYTES_MAX);
        f.seek(SeekFrom::Start(start))?;
        // bytes, not text: the window may start inside a character of a
        // line it drops anyway (review of 2026-12-06: read as a string, the
        // whole trail failed, answered 500)
        let mut bytes = Vec::new();
        f.take(TAIL_BYTES_MAX).read_to_end(&mut bytes)?;
        let mut lines: Vec<&[u8]> = bytes.split(|&b| b == b'\n').collect();
        if start > 0 && !lines.is_empty() {
            lines.remove(0); // cut in the middle
        }
        let all: Vec<AuditEntry> = lines
            .iter()
            .filter_map(|l| serde_json::from_slice(l).ok())
            .collect();
        let skip = all.len().saturating_sub(limit);
        Ok(all.into_iter().skip(skip).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_are_masked_and_long_bodies_cut() {
        let v =
            summarize(br#"{"name":"d","chap":{"user":"u","secret":"s3"},"x":[{"api_token":"t"}]}"#);
        let s = v.to_string();
        assert!(!s.contains("s3") && !s.contains("\"t\""), "{s}");
        assert_eq!(v["name"], "d");
        let big = format!("{{\"a\":\"{}\"}}", "x".repeat(5000));
        assert!(summarize(big.as_bytes())
            .as_str()
            .unwrap()
            .ends_with("(5008 bytes)"));
        assert_eq!(summarize(b"a=b")["not_json_bytes"], 3);
    }

    /// CHAP user names (a host group's `chap_users`, the `user` of a CHAP
    /// object) stay readable; secrets and scalar CHAP settings do not.
    #[test]
    fn chap_user_names_stay_and_chap_secrets_go() {
        let v = summarize(
            br#"{"chap_users":["alice","bob"],"chap":{"user":"u","secret":"s3"},
                "mutual_chap":"m:s4","groups":[{"chap_users":["carol"]}]}"#,
        );
        assert_eq!(v["chap_users"], serde_json::json!(["alice", "bob"]));
        assert_eq!(v["chap"]["user"], "u");
        assert_eq!(v["chap"]["secret"], "***");
        assert_eq!(v["mutual_chap"], "***");
        assert_eq!(v["groups"][0]["chap_users"][0], "carol");
        let s = v.to_string();
        assert!(!s.contains("s3") && !s.contains("s4"), "{s}");
        // a CHAP struct written as a list, a secret under another name, a
        // body that is not an object: nothing of them is kept
        let v = summarize(
            br#"{"mutual_chap":["u","hunter2"],"chap":{"user":"u","pass":"hunter3","psk":"p"}}"#,
        );
        let s = v.to_string();
        assert!(!s.contains("hunter") && !s.contains("\"p\""), "{s}");
        assert_eq!(v["chap"]["user"], "u");
        let v = summarize(br#"["alice","hunter4"]"#);
        assert!(!v.to_string().contains("hunter4"), "{v}");
    }

    /// The trail is read when its last 4 MiB start inside a multibyte
    /// character (of a line the window drops). Before (review of
    /// 2026-12-06), the read failed as invalid UTF-8 and the API answered
    /// 500 until later entries moved the cut.
    #[test]
    fn the_tail_reads_when_its_window_starts_inside_a_character() {
        let d = tempfile::tempdir().unwrap();
        let log = AuditLog::with_max(d.path(), 64 << 20);
        let entry = |who: String| AuditEntry {
            time_unix_ms: 1,
            who,
            token_id: "id".into(),
            role: "admin".into(),
            source: "127.0.0.1".into(),
            method: "POST".into(),
            path: "/api/v1/pools".into(),
            body: Value::Null,
            status: 400,
        };
        log.append(&entry("€".repeat(2_000_000))).unwrap();
        // the window's start moves by one byte per entry: three in a row
        // put it at each byte of a three-byte character
        for pad in 0..3 {
            log.append(&entry("x".repeat(pad))).unwrap();
            let got = log.tail(5).unwrap_or_else(|e| panic!("padding {pad}: {e}"));
            assert_eq!(got.last().unwrap().who, "x".repeat(pad));
        }
    }

    #[test]
    fn the_log_rotates_and_keeps_two_files_at_most() {
        let d = tempfile::tempdir().unwrap();
        let log = AuditLog::with_max(d.path(), 2048);
        let e = AuditEntry {
            time_unix_ms: 1,
            who: "reader".into(),
            token_id: "id".into(),
            role: "read-only".into(),
            source: "127.0.0.1".into(),
            method: "POST".into(),
            path: "/api/v1/pools/tank/scrub".into(),
            body: Value::Null,
            status: 403,
        };
        for _ in 0..1000 {
            log.append(&e).unwrap();
        }
        let size = |n: &str| std::fs::metadata(d.path().join(n)).map_or(0, |m| m.len());
        assert!(size("audit.log.1") >= 2048, "never rotated");
        assert!(size("audit.log") < 2048 && size("audit.log.1") < 2048 + 512);
        assert_eq!(std::fs::read_dir(d.path()).unwrap().count(), 2);
        // the newest entries are read, across the rotation too
        assert_eq!(log.tail(5).unwrap().len(), 5);
        let lines =
            |n: &str| std::fs::read_to_string(d.path().join(n)).map_or(0, |t| t.lines().count());
        assert_eq!(
            log.tail(1000).unwrap().len(),
            lines("audit.log") + lines("audit.log.1")
        );
    }
}
