//! `[nbd] tls`: the node's NBD TLS configuration from the configured certificate
//! and key, or from a certificate authority and server certificate made at first
//! start in `DATA_DIR/nbd/` (laid out as qemu's `tls-creds-x509` expects a
//! server folder: `ca-cert.pem`, `server-cert.pem`, `server-key.pem`); the
//! authority's certificate is what clients put in their own `ca-cert.pem`.

use crate::config::NbdConfig;
use anyhow::{Context, Result};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

/// Where a generated NBD certificate lives.
pub(crate) fn generated_dir(data_dir: &Path) -> PathBuf {
    data_dir.join("nbd")
}

/// The host's name, when it has one worth putting in a certificate.
fn hostname() -> Option<String> {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for its length; the result is NUL-terminated
    // or the call fails.
    let r = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if r != 0 {
        return None;
    }
    let end = buf.iter().position(|b| *b == 0)?;
    let name = std::str::from_utf8(&buf[..end]).ok()?.to_string();
    (!name.is_empty() && name != "localhost").then_some(name)
}

/// The TLS credentials NBD requires clients to use, or None for plaintext
/// (with a warning when that plaintext is on a network address).
pub(crate) fn prepare(n: &NbdConfig, data_dir: &Path) -> Result<Option<nbd::ServerTls>> {
    if !n.tls_required() {
        if !n.address.ip().is_loopback() {
            tracing::warn!(address = %n.address,
                "[nbd] tls = \"off\" on a network address: LUN data crosses the network in the clear");
            eprintln!(
                "  WARNING: NBD on {} without TLS: data in the clear (see docs/security.md)",
                n.address
            );
        }
        return Ok(None);
    }
    if let Some(file) = &n.tls_psk_file {
        return prepare_psk(file).map(Some);
    }
    let (cert, key, generated_ca) = match (&n.tls_cert, &n.tls_key) {
        (Some(c), Some(k)) => {
            crate::secrets::check_private(k, "[nbd] tls_key")?;
            (c.clone(), k.clone(), None)
        }
        _ => {
            let mut names = Vec::new();
            if !n.address.ip().is_unspecified() {
                names.push(n.address.ip().to_string());
            }
            names.extend(hostname());
            let dir = generated_dir(data_dir);
            let g = nbd::tls::ensure_generated(&dir, &names)
                .with_context(|| format!("making the NBD certificate in {}", dir.display()))?;
            (g.server_cert, g.server_key, Some(g.ca_cert))
        }
    };
    let cfg = nbd::tls::server_config(&cert, &key, n.tls_client_ca.as_deref())
        .with_context(|| format!("NBD TLS with {} and {}", cert.display(), key.display()))?;
    eprintln!("  nbd tls:        required, certificate {}", cert.display());
    if let Some(ca) = generated_ca {
        eprintln!(
            "  nbd tls ca:     {} (clients trust it: copy it to their ca-cert.pem)",
            ca.display()
        );
    }
    match &n.tls_client_ca {
        Some(ca) => eprintln!(
            "  nbd client ca:  {} (client certificates required)",
            ca.display()
        ),
        None => eprintln!("  nbd client ca:  none (any client that trusts the server may connect)"),
    }
    Ok(Some(nbd::ServerTls::X509(cfg)))
}

/// TLS-PSK from `[nbd] tls_psk_file`, in a build that has it.
#[cfg(feature = "nbd-psk")]
fn prepare_psk(file: &Path) -> Result<nbd::ServerTls> {
    let keys = nbd::psk::PskKeys::read(file)?;
    let n = keys.len();
    let ctx = nbd::psk::server_context(keys).context("NBD TLS-PSK")?;
    eprintln!(
        "  nbd tls:        required, pre-shared keys from {} ({n} identities)",
        file.display()
    );
    Ok(nbd::ServerTls::Psk(ctx))
}

/// A build without OpenSSL cannot serve TLS-PSK: say how to get one.
#[cfg(not(feature = "nbd-psk"))]
fn prepare_psk(file: &Path) -> Result<nbd::ServerTls> {
    // Check the file anyway, so its mistakes show up first.
    nbd::psk::PskKeys::read(file)?;
    anyhow::bail!(
        "[nbd] tls_psk_file = {}: this freesan was built without TLS-PSK; build it with \
         `cargo build --release --features nbd-psk` (needs Debian's libssl-dev and pkg-config), \
         or use a certificate (tls_cert, tls_key) instead",
        file.display()
    )
}

/// The URL `nbdinfo` and `nbdcopy` (libnbd) take for LUN `lun`: `nbds://` with
/// the folder holding the authority's `ca-cert.pem` when TLS is required, or
/// with the key file when it is TLS-PSK.
pub(crate) fn client_url(n: &NbdConfig, data_dir: &Path, addr: SocketAddr, lun: u64) -> String {
    if !n.tls_required() {
        return format!("nbd://{addr}/lun{lun}");
    }
    if let Some(f) = &n.tls_psk_file {
        return format!(
            "nbds://IDENTITY@{addr}/lun{lun}?tls-psk-file={}",
            f.display()
        );
    }
    let dir = match &n.tls_cert {
        Some(_) => "DIR_WITH_CA_CERT_PEM".to_string(),
        None => generated_dir(data_dir).display().to_string(),
    };
    format!("nbds://{addr}/lun{lun}?tls-certificates={dir}")
}
