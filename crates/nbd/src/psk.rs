//! TLS with pre-shared keys for the NBD server (`NBD_OPT_STARTTLS`, then a
//! TLS-PSK handshake, as qemu's `tls-creds-psk` and nbdkit's `--tls-psk` do).
//!
//! The key file is qemu's and GnuTLS `psktool`'s `keys.psk`: one `identity:key`
//! per line, the key in hex. It is a secret, so a file that its group or others
//! may read is refused, and keys shorter than 128 bits are refused.
//!
//! rustls has no external PSKs (rustls issue 174), so the handshake itself is
//! OpenSSL's (the `openssl` crate, behind this crate's `psk` feature): TLS 1.3
//! with a PSK and an (EC)DHE exchange, or TLS 1.2 with the (EC)DHE-PSK AEAD
//! suites only, so every session has forward secrecy. No certificate is served:
//! a client that offers no known identity and key fails the handshake. Parsing
//! the key file needs no OpenSSL and is always built.
//!
//! Key invariant: a key is compared only inside the TLS handshake (the client
//! proves it knows the key by finishing the handshake); an unknown identity and
//! a wrong key fail the same way, after which nothing of the NBD session has
//! been revealed.

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};

/// Shortest key accepted, in bytes (128 bits).
pub const KEY_BYTES_MIN: usize = 16;
/// Longest key accepted, in bytes (OpenSSL's PSK buffer holds at least 256).
pub const KEY_BYTES_MAX: usize = 128;
/// Longest identity accepted, in bytes (TLS allows 2^16-1; ours stay short).
pub const IDENTITY_BYTES_MAX: usize = 128;
/// Most identities one key file may hold.
pub const IDENTITIES_MAX: usize = 4096;

/// Why a key file cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum PskError {
    /// The file could not be read.
    #[error("{path}: {source}")]
    File {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        source: std::io::Error,
    },
    /// The file may be read or written by others than its owner, or another
    /// user owns it (`block::private`).
    #[error("{path}: {why}")]
    Exposed {
        /// The file.
        path: PathBuf,
        /// Why it is refused.
        why: String,
    },
    /// A line is not `identity:hexkey`, or the file breaks a bound.
    #[error("{path}: line {line}: {msg}")]
    Syntax {
        /// The file.
        path: PathBuf,
        /// The 1-based line number (0: the file as a whole).
        line: usize,
        /// What is wrong.
        msg: String,
    },
    /// OpenSSL refused the configuration.
    #[cfg(feature = "psk")]
    #[error("OpenSSL: {0}")]
    Openssl(openssl::error::ErrorStack),
}

// (the wrapped error's text is in the variant's own, so it is not also given
// as the source: an error chain printed whole said it twice)
#[cfg(feature = "psk")]
impl From<openssl::error::ErrorStack> for PskError {
    fn from(e: openssl::error::ErrorStack) -> PskError {
        PskError::Openssl(e)
    }
}

/// The identities and keys of one key file. `Debug` shows identities only.
#[derive(Clone, Default)]
pub struct PskKeys {
    keys: HashMap<Vec<u8>, Vec<u8>>,
}

impl fmt::Debug for PskKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut ids: Vec<String> = self
            .keys
            .keys()
            .map(|k| String::from_utf8_lossy(k).into_owned())
            .collect();
        ids.sort();
        f.debug_struct("PskKeys").field("identities", &ids).finish()
    }
}

impl PskKeys {
    /// Parses `identity:hexkey` lines (blank lines are skipped). `path` only
    /// names the file in errors.
    pub fn parse(text: &str, path: &Path) -> Result<PskKeys, PskError> {
        let bad = |line: usize, msg: String| PskError::Syntax {
            path: path.to_path_buf(),
            line,
            msg,
        };
        let mut keys = HashMap::new();
        for (i, raw) in text.lines().enumerate() {
            let n = i + 1;
            let line = raw.trim_end_matches('\r');
            if line.trim().is_empty() {
                continue;
            }
            let Some((id, hex)) = line.rsplit_once(':') else {
                return Err(bad(n, "expected identity:hexkey".into()));
            };
            if id.is_empty() || id.len() > IDENTITY_BYTES_MAX {
                return Err(bad(
                    n,
                    format!("an identity has 1 to {IDENTITY_BYTES_MAX} bytes"),
                ));
            }
            let key = decode_hex(hex.trim()).ok_or_else(|| bad(n, "the key is not hex".into()))?;
            if key.len() < KEY_BYTES_MIN || key.len() > KEY_BYTES_MAX {
                return Err(bad(
                    n,
                    format!(
                        "key of {} bytes; keys have {KEY_BYTES_MIN} to {KEY_BYTES_MAX} \
                         (psktool makes 32)",
                        key.len()
                    ),
                ));
            }
            if keys.insert(id.as_bytes().to_vec(), key).is_some() {
                return Err(bad(n, format!("identity {id:?} appears twice")));
            }
            if keys.len() > IDENTITIES_MAX {
                return Err(bad(n, format!("more than {IDENTITIES_MAX} identities")));
            }
        }
        if keys.is_empty() {
            return Err(bad(0, "no identity:hexkey line".into()));
        }
        Ok(PskKeys { keys })
    }

    /// Reads and parses a key file that only its owner may read.
    pub fn read(path: &Path) -> Result<PskKeys, PskError> {
        let text = block::private::read_to_string(path).map_err(|e| match e {
            block::private::PrivateError::Io(source) => PskError::File {
                path: path.to_path_buf(),
                source,
            },
            refused => PskError::Exposed {
                path: path.to_path_buf(),
                why: refused.to_string(),
            },
        })?;
        PskKeys::parse(&text, path)
    }

    /// The key of `identity`.
    pub fn get(&self, identity: &[u8]) -> Option<&[u8]> {
        self.keys.get(identity).map(Vec::as_slice)
    }

    /// How many identities there are.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// Whether there are none (never true for a parsed file).
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }
}

fn decode_hex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    let digit = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    s.as_bytes()
        .chunks(2)
        .map(|p| Some(digit(p[0])? << 4 | digit(p[1])?))
        .collect()
}

/// The OpenSSL server context for `keys`: TLS 1.2 or 1.3, PSK with (EC)DHE only,
/// no certificate.
#[cfg(feature = "psk")]
pub fn server_context(keys: PskKeys) -> Result<openssl::ssl::SslContext, PskError> {
    use openssl::ssl::{SslContextBuilder, SslMethod, SslOptions, SslVersion};
    let mut b = SslContextBuilder::new(SslMethod::tls_server())?;
    b.set_min_proto_version(Some(SslVersion::TLS1_2))?;
    // TLS 1.2: forward-secret AEAD PSK suites only (no plain PSK, no CBC).
    b.set_cipher_list(
        "ECDHE-PSK-CHACHA20-POLY1305:DHE-PSK-AES256-GCM-SHA384:\
         DHE-PSK-AES128-GCM-SHA256:DHE-PSK-CHACHA20-POLY1305",
    )?;
    // TLS 1.3: OpenSSL uses the callback below with SHA-256 suites; psk_dhe_ke
    // is preferred by OpenSSL when the client offers it.
    b.set_ciphersuites("TLS_AES_128_GCM_SHA256:TLS_CHACHA20_POLY1305_SHA256")?;
    b.set_options(SslOptions::NO_TICKET | SslOptions::NO_RENEGOTIATION);
    b.set_session_cache_mode(openssl::ssl::SslSessionCacheMode::OFF);
    let index = identity_index()?;
    b.set_psk_server_callback(move |ssl, identity, out| {
        let key = identity.and_then(|id| keys.get(id).map(|k| (id, k)));
        match key {
            Some((id, k)) if k.len() <= out.len() => {
                // OpenSSL keeps no TLS 1.3 identity for SSL_get_psk_identity.
                ssl.set_ex_data(index, String::from_utf8_lossy(id).into_owned());
                out[..k.len()].copy_from_slice(k);
                Ok(k.len())
            }
            // 0: no key for that identity; the handshake fails.
            _ => Ok(0),
        }
    });
    Ok(b.build())
}

/// Where the handshake notes the identity whose key it used.
#[cfg(feature = "psk")]
fn identity_index(
) -> Result<openssl::ex_data::Index<openssl::ssl::Ssl, String>, openssl::error::ErrorStack> {
    static INDEX: std::sync::OnceLock<openssl::ex_data::Index<openssl::ssl::Ssl, String>> =
        std::sync::OnceLock::new();
    if let Some(i) = INDEX.get() {
        return Ok(*i);
    }
    let i = openssl::ssl::Ssl::new_ex_index()?;
    Ok(*INDEX.get_or_init(|| i))
}

/// The identity a finished PSK handshake authenticated.
#[cfg(feature = "psk")]
pub fn identity(ssl: &openssl::ssl::SslRef) -> Option<&str> {
    ssl.ex_data(identity_index().ok()?).map(String::as_str)
}

#[cfg(test)]
mod tests {
    use super::*;

    const K32: &str = "0123456789abcdef0123456789ABCDEF0123456789abcdef0123456789abcdef";

    #[test]
    fn parses_psktool_lines_and_refuses_bad_ones() {
        let p = Path::new("keys.psk");
        let k = PskKeys::parse(&format!("qemu:{K32}\n\nalice:{}\r\n", &K32[..32]), p).unwrap();
        assert_eq!(k.len(), 2);
        assert_eq!(k.get(b"qemu").unwrap().len(), 32);
        assert_eq!(k.get(b"qemu").unwrap()[..2], [0x01, 0x23]);
        assert_eq!(k.get(b"alice").unwrap().len(), 16);
        assert!(k.get(b"bob").is_none());
        assert!(!format!("{k:?}").contains("0123"), "Debug hides keys");
        for bad in [
            "",
            "qemu",
            &format!(":{K32}"),
            "qemu:0123",
            &format!("qemu:{}x", &K32[..63]),
            &format!("qemu:{}", &K32[..63]),
            &format!("qemu:{K32}\nqemu:{K32}"),
            &format!("{}:{K32}", "i".repeat(IDENTITY_BYTES_MAX + 1)),
            &format!("qemu:{K32}{K32}{K32}{K32}{K32}"),
        ] {
            assert!(PskKeys::parse(bad, p).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_key_file_others_may_read_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("keys.psk");
        std::fs::write(&f, format!("qemu:{K32}\n")).unwrap();
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(matches!(PskKeys::read(&f), Err(PskError::Exposed { .. })));
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(PskKeys::read(&f).unwrap().len(), 1);
    }

    /// Client handshakes against `server_context` over a socket pair: TLS 1.3
    /// and TLS 1.2 with an (EC)DHE-PSK suite succeed with the right key; plain
    /// PSK suites (no forward secrecy), a wrong key and an unknown identity
    /// fail; the identity that got in is the one noted.
    #[cfg(feature = "psk")]
    #[test]
    fn handshakes_need_the_key_and_forward_secrecy() {
        use openssl::ssl::{Ssl, SslContextBuilder, SslMethod, SslVersion};
        use std::os::unix::net::UnixStream;
        let key = decode_hex(&K32[..32]).unwrap();
        let keys = PskKeys::parse(&format!("alice:{}\n", &K32[..32]), Path::new("k")).unwrap();
        let server = server_context(keys).unwrap();
        let attempt = |id: &'static str, key: Vec<u8>, tls12: Option<&str>| -> Option<String> {
            let (a, b) = UnixStream::pair().unwrap();
            let srv = server.clone();
            let t = std::thread::spawn(move || {
                let ssl = Ssl::new(&srv).unwrap();
                ssl.accept(a)
                    .ok()
                    .and_then(|s| identity(s.ssl()).map(str::to_string))
            });
            let mut c = SslContextBuilder::new(SslMethod::tls_client()).unwrap();
            if let Some(suites) = tls12 {
                c.set_max_proto_version(Some(SslVersion::TLS1_2)).unwrap();
                c.set_cipher_list(suites).unwrap();
            }
            c.set_psk_client_callback(move |_, _, idb, keyb| {
                idb[..id.len()].copy_from_slice(id.as_bytes());
                idb[id.len()] = 0;
                keyb[..key.len()].copy_from_slice(&key);
                Ok(key.len())
            });
            let client_ok = Ssl::new(&c.build()).unwrap().connect(b).is_ok();
            let server_saw = t.join().unwrap();
            assert_eq!(client_ok, server_saw.is_some(), "{id} {tls12:?}");
            server_saw
        };
        assert_eq!(
            attempt("alice", key.clone(), None).as_deref(),
            Some("alice")
        );
        assert_eq!(
            attempt("alice", key.clone(), Some("ECDHE-PSK-CHACHA20-POLY1305")).as_deref(),
            Some("alice")
        );
        assert_eq!(
            attempt(
                "alice",
                key.clone(),
                Some("PSK-AES128-GCM-SHA256:PSK-AES256-GCM-SHA384")
            ),
            None,
            "plain PSK"
        );
        let mut wrong = key.clone();
        wrong[0] ^= 1;
        assert_eq!(attempt("alice", wrong, None), None, "wrong key");
        assert_eq!(attempt("mallory", key, None), None, "unknown identity");
    }
}
