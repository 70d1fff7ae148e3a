//! TLS for the API (rustls with the ring provider): the node's certificate from
//! the configuration or one made at first start (rcgen, self-signed, key 0600 in
//! `DATA_DIR/api`), and the client side for the CLI, which trusts exactly one
//! certificate: the node's own, pinned from the node's data directory (or a copy
//! of it), not any authority.
//!
//! What it does not do: implement any cryptography; rustls does the protocol and
//! ring the primitives.

use crate::tokens::{private_dir, write_private_atomic, TokenError};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub use rustls;

/// Where the node keeps a certificate it made itself.
pub fn generated_cert_file(data_dir: &Path) -> PathBuf {
    crate::tokens::api_dir(data_dir).join("tls-cert.pem")
}

/// Where the node keeps the key of a certificate it made itself (0600).
pub fn generated_key_file(data_dir: &Path) -> PathBuf {
    crate::tokens::api_dir(data_dir).join("tls-key.pem")
}

/// The certificate the node serves right now, copied for local clients to pin;
/// present only while the node's API speaks TLS.
pub fn serving_cert_file(data_dir: &Path) -> PathBuf {
    crate::tokens::api_dir(data_dir).join("serving-cert.pem")
}

/// Why TLS could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file could not be read or written.
    #[error(transparent)]
    File(#[from] TokenError),
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
    Generate(String),
    /// rustls refused the certificate and key.
    #[error("TLS: {0}")]
    Rustls(rustls::Error),
}

// (the wrapped error's text is in the variant's own, so it is not also given
// as the source: an error chain printed whole said it twice)
impl From<rustls::Error> for TlsError {
    fn from(e: rustls::Error) -> TlsError {
        TlsError::Rustls(e)
    }
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Makes a self-signed certificate for `names` (DNS names or IP literals) in
/// `data_dir` unless one is there; returns (certificate, key) paths.
pub fn ensure_generated(data_dir: &Path, names: &[String]) -> Result<(PathBuf, PathBuf), TlsError> {
    let cert = generated_cert_file(data_dir);
    let key = generated_key_file(data_dir);
    if cert.exists() && key.exists() {
        return Ok((cert, key));
    }
    private_dir(&crate::tokens::api_dir(data_dir))?;
    let mut all: Vec<String> = vec!["localhost".into(), "127.0.0.1".into(), "::1".into()];
    for n in names {
        if !all.contains(n) {
            all.push(n.clone());
        }
    }
    let ck =
        rcgen::generate_simple_self_signed(all).map_err(|e| TlsError::Generate(e.to_string()))?;
    write_private_atomic(&key, ck.key_pair.serialize_pem().as_bytes())?;
    write_private_atomic(&cert, ck.cert.pem().as_bytes())?;
    Ok((cert, key))
}

/// Reads every certificate of a PEM file.
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

/// The server side: `cert` (PEM chain) and `key` (PEM private key).
pub fn server_config(cert: &Path, key: &Path) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let certs = read_certs(cert)?;
    let key = PrivateKeyDer::from_pem_file(key).map_err(|e| TlsError::Pem {
        path: key.to_path_buf(),
        msg: e.to_string(),
    })?;
    let mut cfg = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(certs, key)?;
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(cfg))
}

/// Trusts exactly one end-entity certificate, whatever name it carries; the
/// handshake's signatures are still checked by the provider.
#[derive(Debug)]
struct Pinned {
    cert: CertificateDer<'static>,
    provider: Arc<rustls::crypto::CryptoProvider>,
}

impl ServerCertVerifier for Pinned {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        if end_entity.as_ref() == self.cert.as_ref() {
            Ok(ServerCertVerified::assertion())
        } else {
            Err(rustls::Error::InvalidCertificate(
                rustls::CertificateError::ApplicationVerificationFailure,
            ))
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// The client side for a node whose certificate (the first of the PEM file
/// `pinned`) is trusted, and nothing else.
pub fn pinned_client_config(pinned: &Path) -> Result<Arc<rustls::ClientConfig>, TlsError> {
    let cert = read_certs(pinned)?.swap_remove(0);
    let provider = provider();
    let verifier = Arc::new(Pinned {
        cert,
        provider: provider.clone(),
    });
    let mut cfg = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .dangerous() // only the verifier is replaced: it pins one certificate
        .with_custom_certificate_verifier(verifier)
        .with_no_client_auth();
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(cfg))
}
