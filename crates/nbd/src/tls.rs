//! TLS for the NBD server (`NBD_OPT_STARTTLS`, rustls with the ring provider):
//! the server's certificate and key from PEM files, optionally a client CA whose
//! certificates clients must present (X.509 client authentication, as qemu's
//! `tls-creds-x509,verify-peer=on`), and a certificate authority plus server
//! certificate made at first start when the operator gives none.
//!
//! What it does not do: implement any cryptography (rustls does the protocol,
//! ring the primitives), TLS-PSK (rustls has none: see `crate::psk`, OpenSSL),
//! certificate revocation lists.
//!
//! Key invariant: a generated server key is written only to a file created with
//! mode 0600 and never leaves it; the generated authority's key is not kept at
//! all, so that authority vouches for exactly one server certificate.

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub use rustls;

/// Why TLS could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    File {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        source: std::io::Error,
    },
    /// A PEM file holds no usable certificate or key.
    #[error("{path}: {msg}")]
    Pem {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        msg: String,
    },
    /// Making a certificate failed.
    #[error("making a certificate: {0}")]
    Generate(rcgen::Error),
    /// rustls refused the certificates or key.
    #[error("TLS: {0}")]
    Rustls(rustls::Error),
    /// The client CA file cannot verify client certificates.
    #[error("client CA {path}: {msg}")]
    ClientCa {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        msg: String,
    },
}

// (the wrapped error's text is in the variant's own, so it is not also given
// as the source: an error chain printed whole said it twice)
impl From<rcgen::Error> for TlsError {
    fn from(e: rcgen::Error) -> TlsError {
        TlsError::Generate(e)
    }
}

impl From<rustls::Error> for TlsError {
    fn from(e: rustls::Error) -> TlsError {
        TlsError::Rustls(e)
    }
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Reads every certificate of a PEM file (at least one).
pub fn read_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem = |msg: String| TlsError::Pem {
        path: path.to_path_buf(),
        msg,
    };
    let certs: Vec<_> = CertificateDer::pem_file_iter(path)
        .map_err(|e| pem(e.to_string()))?
        .collect::<Result<_, _>>()
        .map_err(|e| pem(e.to_string()))?;
    if certs.is_empty() {
        return Err(pem("no certificate".into()));
    }
    Ok(certs)
}

/// The server side: `cert` (PEM chain, leaf first), `key` (PEM private key) and,
/// when given, `client_ca` (PEM, one or more CA certificates): then every client
/// must present a certificate that chains to one of them, or the handshake fails.
pub fn server_config(
    cert: &Path,
    key: &Path,
    client_ca: Option<&Path>,
) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let certs = read_certs(cert)?;
    let key_der = PrivateKeyDer::from_pem_file(key).map_err(|e| TlsError::Pem {
        path: key.to_path_buf(),
        msg: e.to_string(),
    })?;
    let builder = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?;
    let builder = match client_ca {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let bad = |msg: String| TlsError::ClientCa {
                path: ca.to_path_buf(),
                msg,
            };
            let mut roots = rustls::RootCertStore::empty();
            for c in read_certs(ca)? {
                roots.add(c).map_err(|e| bad(e.to_string()))?;
            }
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots),
                provider(),
            )
            .build()
            .map_err(|e| bad(e.to_string()))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    Ok(Arc::new(builder.with_single_cert(certs, key_der)?))
}

/// The files of a certificate made by [`ensure_generated`], named as qemu's
/// `tls-creds-x509` expects them in a server's folder.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Generated {
    /// The authority's certificate (`ca-cert.pem`): what clients trust.
    pub ca_cert: PathBuf,
    /// The server's certificate (`server-cert.pem`), signed by the authority.
    pub server_cert: PathBuf,
    /// The server's private key (`server-key.pem`, 0600).
    pub server_key: PathBuf,
}

impl Generated {
    /// The file names in `dir`.
    pub fn in_dir(dir: &Path) -> Generated {
        Generated {
            ca_cert: dir.join("ca-cert.pem"),
            server_cert: dir.join("server-cert.pem"),
            server_key: dir.join("server-key.pem"),
        }
    }
}

/// Makes, unless all three files are in `dir` already, a certificate authority
/// and a server certificate it signs for `localhost`, `127.0.0.1`, `::1` and
/// `names` (DNS names or IP literals). The authority's key is dropped once the
/// server certificate is signed. `dir` is created 0700, the files 0600.
pub fn ensure_generated(dir: &Path, names: &[String]) -> Result<Generated, TlsError> {
    let files = Generated::in_dir(dir);
    if files.ca_cert.exists() && files.server_cert.exists() && files.server_key.exists() {
        return Ok(files);
    }
    let file_err = |path: &Path| {
        let path = path.to_path_buf();
        move |source| TlsError::File { path, source }
    };
    {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(file_err(dir))?;
    }
    let mut all: Vec<String> = vec!["localhost".into(), "127.0.0.1".into(), "::1".into()];
    for n in names {
        if !n.is_empty() && !all.contains(n) {
            all.push(n.clone());
        }
    }
    let ca_key = rcgen::KeyPair::generate()?;
    let mut ca = rcgen::CertificateParams::new(Vec::<String>::new())?;
    ca.distinguished_name = rcgen::DistinguishedName::new();
    ca.distinguished_name.push(
        rcgen::DnType::CommonName,
        "freesan NBD authority (generated)",
    );
    ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca.key_usages = vec![
        rcgen::KeyUsagePurpose::KeyCertSign,
        rcgen::KeyUsagePurpose::CrlSign,
    ];
    let ca_cert = ca.self_signed(&ca_key)?;
    let key = rcgen::KeyPair::generate()?;
    let mut server = rcgen::CertificateParams::new(all)?;
    server.distinguished_name = rcgen::DistinguishedName::new();
    server
        .distinguished_name
        .push(rcgen::DnType::CommonName, "freesan NBD server");
    server.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
    server.use_authority_key_identifier_extension = true;
    let server_cert = server.signed_by(&key, &ca_cert, &ca_key)?;
    drop(ca_key);
    // The authority last: its presence means the set is complete.
    write_private(&files.server_key, key.serialize_pem().as_bytes()).map_err(file_err(dir))?;
    write_private(&files.server_cert, server_cert.pem().as_bytes()).map_err(file_err(dir))?;
    write_private(&files.ca_cert, ca_cert.pem().as_bytes()).map_err(file_err(dir))?;
    Ok(files)
}

/// Writes `data` to `path` through a 0600 temporary file, fsync and rename.
fn write_private(path: &Path, data: &[u8]) -> std::io::Result<()> {
    block::durable::replace_file(path, data)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_files_are_private_reused_and_load() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().join("nbd");
        let g = ensure_generated(&d, &["10.0.0.9".into(), "san.example".into()]).unwrap();
        for f in [&g.ca_cert, &g.server_cert, &g.server_key] {
            let mode = std::fs::metadata(f).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o600, "{}", f.display());
        }
        let dmode = std::fs::metadata(&d).unwrap().permissions().mode() & 0o777;
        assert_eq!(dmode, 0o700);
        let first = std::fs::read(&g.server_cert).unwrap();
        assert_eq!(ensure_generated(&d, &[]).unwrap(), g);
        assert_eq!(std::fs::read(&g.server_cert).unwrap(), first, "reused");
        server_config(&g.server_cert, &g.server_key, None).unwrap();
        // The authority can serve as a client CA file too.
        server_config(&g.server_cert, &g.server_key, Some(&g.ca_cert)).unwrap();
        assert!(server_config(&g.server_key, &g.server_key, None).is_err());
        assert!(server_config(&g.server_cert, &g.server_cert, None).is_err());
    }
}
