//! NBD over TLS as the protocol defines it, driven by a rustls client speaking raw
//! NBD: before `NBD_OPT_STARTTLS` every option is refused with
//! `NBD_REP_ERR_TLS_REQD` (and `NBD_OPT_EXPORT_NAME` closes); after it, option
//! haggling and the transmission phase run inside TLS. A client that does not
//! trust the server's authority, or (with a client CA) presents no certificate
//! or one from another authority, gets nothing: the volume is unchanged.

use crate::common;

use block::{MemVolume, Volume, VolumeRef};
use bytes::BytesMut;
use common::pattern;
use nbd::proto::{
    self, decode_option_reply_header, decode_server_greeting, decode_simple_reply, encode_option,
    encode_request, opt, rep, ClientOption, Command, InfoRequest, Request,
};
use nbd::tls::rustls;
use nbd::{NbdConfig, NbdExport, NbdLimits, NbdServer};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

const BLOCK: u32 = 4096;
const BLOCKS: u64 = 256;

/// An authority and the key it signs with.
struct Ca {
    cert: rcgen::Certificate,
    key: rcgen::KeyPair,
}

impl Ca {
    fn new(name: &str) -> Ca {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        p.distinguished_name = rcgen::DistinguishedName::new();
        p.distinguished_name.push(rcgen::DnType::CommonName, name);
        p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        p.key_usages = vec![
            rcgen::KeyUsagePurpose::KeyCertSign,
            rcgen::KeyUsagePurpose::CrlSign,
        ];
        Ca {
            cert: p.self_signed(&key).unwrap(),
            key,
        }
    }

    /// A leaf for `names`, for a client or a server.
    fn leaf(&self, names: &[&str], client: bool) -> (String, String) {
        let key = rcgen::KeyPair::generate().unwrap();
        let names: Vec<String> = names.iter().map(|s| s.to_string()).collect();
        let mut p = rcgen::CertificateParams::new(names).unwrap();
        p.distinguished_name = rcgen::DistinguishedName::new();
        p.distinguished_name.push(
            rcgen::DnType::CommonName,
            if client { "client" } else { "server" },
        );
        p.extended_key_usages = vec![if client {
            rcgen::ExtendedKeyUsagePurpose::ClientAuth
        } else {
            rcgen::ExtendedKeyUsagePurpose::ServerAuth
        }];
        let cert = p.signed_by(&key, &self.cert, &self.key).unwrap();
        (cert.pem(), key.serialize_pem())
    }

    fn der(&self) -> CertificateDer<'static> {
        self.cert.der().clone()
    }
}

/// The files a server is configured with.
struct ServerFiles {
    _dir: tempfile::TempDir,
    cert: std::path::PathBuf,
    key: std::path::PathBuf,
    ca: std::path::PathBuf,
}

fn server_files(ca: &Ca, client_ca: &Ca) -> ServerFiles {
    let dir = tempfile::tempdir().unwrap();
    let (cert_pem, key_pem) = ca.leaf(&["localhost", "127.0.0.1"], false);
    let cert = dir.path().join("server-cert.pem");
    let key = dir.path().join("server-key.pem");
    let cap = dir.path().join("client-ca.pem");
    std::fs::write(&cert, cert_pem).unwrap();
    std::fs::write(&key, key_pem).unwrap();
    std::fs::write(&cap, client_ca.cert.pem()).unwrap();
    ServerFiles {
        cert,
        key,
        ca: cap,
        _dir: dir,
    }
}

/// A TLS-required server over one memory volume filled with a pattern.
async fn serve(cert: &Path, key: &Path, client_ca: Option<&Path>) -> (SocketAddr, Arc<MemVolume>) {
    let vol = Arc::new(MemVolume::new(BLOCK, BLOCKS));
    let init = pattern(5, (BLOCK as u64 * BLOCKS) as usize);
    vol.write(0, block::Bytes::from(init), false).await.unwrap();
    let tls = nbd::tls::server_config(cert, key, client_ca).expect("server TLS config");
    let server = NbdServer::bind(NbdConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        exports: vec![NbdExport {
            name: "lun0".into(),
            description: "tls test".into(),
            volume: vol.clone() as VolumeRef,
            read_only: false,
            access: None,
        }],
        default_export: Some("lun0".into()),
        limits: NbdLimits {
            handshake_timeout_ms: 5_000,
            ..NbdLimits::default()
        },
        allowed_clients: nbd::IpRange::loopback(),
        tls: Some(tls.into()),
    })
    .await
    .unwrap();
    let addr = server.local_addr();
    tokio::spawn(server.run(std::future::pending()));
    (addr, vol)
}

async fn volume_unchanged(vol: &MemVolume) -> bool {
    let now = vol.read(0, BLOCKS as u32).await.unwrap();
    now[..] == pattern(5, (BLOCK as u64 * BLOCKS) as usize)[..]
}

fn client_config(
    trust: &[CertificateDer<'static>],
    identity: Option<(String, String)>,
) -> Arc<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    for c in trust {
        roots.add(c.clone()).unwrap();
    }
    let b = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots);
    let cfg = match identity {
        None => b.with_no_client_auth(),
        Some((cert, key)) => {
            let certs = vec![CertificateDer::from_pem_slice(cert.as_bytes()).unwrap()];
            let key =
                PrivateKeyDer::from(PrivatePkcs8KeyDer::from_pem_slice(key.as_bytes()).unwrap());
            b.with_client_auth_cert(certs, key).unwrap()
        }
    };
    Arc::new(cfg)
}

/// Greeting and client flags (FIXED_NEWSTYLE | NO_ZEROES) over plain TCP.
async fn plain(addr: SocketAddr) -> TcpStream {
    let mut s = TcpStream::connect(addr).await.unwrap();
    let mut g = [0u8; 18];
    s.read_exact(&mut g).await.unwrap();
    decode_server_greeting(&g).unwrap();
    s.write_all(&3u32.to_be_bytes()).await.unwrap();
    s
}

async fn send_option<S: AsyncWrite + Unpin>(s: &mut S, o: ClientOption) -> std::io::Result<()> {
    let mut b = BytesMut::new();
    encode_option(&o, &mut b);
    s.write_all(&b).await?;
    s.flush().await
}

/// Reads one option reply: (option, type, data).
async fn option_reply<S: AsyncRead + Unpin>(s: &mut S) -> std::io::Result<(u32, u32, Vec<u8>)> {
    let mut h = [0u8; proto::OPTION_REPLY_HEADER_BYTES];
    tokio::time::timeout(Duration::from_secs(10), s.read_exact(&mut h))
        .await
        .expect("option reply timed out")?;
    let h = decode_option_reply_header(&h).unwrap();
    let mut d = vec![0u8; h.data_len_bytes as usize];
    s.read_exact(&mut d).await?;
    Ok((h.option, h.reply_type, d))
}

/// NBD_OPT_GO for `name`: Ok on ACK, Err(reply type) on an error reply.
async fn go<S: AsyncRead + AsyncWrite + Unpin>(
    s: &mut S,
    name: &str,
) -> std::io::Result<Result<(), u32>> {
    send_option(
        s,
        ClientOption::Go(InfoRequest {
            name: name.into(),
            infos: vec![],
        }),
    )
    .await?;
    loop {
        let (o, t, _) = option_reply(s).await?;
        assert_eq!(o, opt::GO);
        match t {
            rep::INFO => continue,
            rep::ACK => return Ok(Ok(())),
            e => return Ok(Err(e)),
        }
    }
}

/// STARTTLS acknowledged, then the TLS handshake with `cfg`.
async fn starttls(
    addr: SocketAddr,
    cfg: Arc<rustls::ClientConfig>,
) -> std::io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
    let mut s = plain(addr).await;
    send_option(&mut s, ClientOption::Unsupported(opt::STARTTLS)).await?;
    let (o, t, _) = option_reply(&mut s).await?;
    assert_eq!((o, t), (opt::STARTTLS, rep::ACK));
    let name = ServerName::try_from("127.0.0.1").unwrap();
    tokio_rustls::TlsConnector::from(cfg).connect(name, s).await
}

async fn request<S: AsyncRead + AsyncWrite + Unpin>(
    s: &mut S,
    command: Command,
    off: u64,
    len: u32,
    payload: &[u8],
) -> std::io::Result<u32> {
    let h = encode_request(&Request {
        flags: 0,
        command,
        cookie: 9,
        offset_bytes: off,
        length_bytes: len,
    });
    s.write_all(&h).await?;
    s.write_all(payload).await?;
    s.flush().await?;
    let mut r = [0u8; proto::SIMPLE_REPLY_BYTES];
    tokio::time::timeout(Duration::from_secs(10), s.read_exact(&mut r))
        .await
        .expect("reply timed out")?;
    let r = decode_simple_reply(&r).unwrap();
    assert_eq!(r.cookie, 9);
    Ok(r.error)
}

/// Tries a whole session with `cfg`: STARTTLS, GO lun0 and a write of zeroes
/// over the first 64 KiB. Ok(()) only when the write was acknowledged.
async fn try_write(addr: SocketAddr, cfg: Arc<rustls::ClientConfig>) -> Result<(), String> {
    let r = session_write(addr, cfg).await;
    eprintln!("session: {r:?}");
    r
}

async fn session_write(addr: SocketAddr, cfg: Arc<rustls::ClientConfig>) -> Result<(), String> {
    let mut t = starttls(addr, cfg)
        .await
        .map_err(|e| format!("handshake: {e}"))?;
    match go(&mut t, "lun0").await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => return Err(format!("GO refused {e:#x}")),
        Err(e) => return Err(format!("GO: {e}")),
    }
    match request(&mut t, Command::Write, 0, 65536, &[0u8; 65536]).await {
        Ok(0) => Ok(()),
        Ok(e) => Err(format!("write error {e}")),
        Err(e) => Err(format!("write: {e}")),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_required_serves_only_inside_tls() {
    let ca = Ca::new("test CA");
    let f = server_files(&ca, &ca);
    let (addr, vol) = serve(&f.cert, &f.key, None).await;

    // Plaintext: every option refused with TLS_REQD, nothing served.
    let mut s = plain(addr).await;
    send_option(&mut s, ClientOption::List).await.unwrap();
    assert_eq!(option_reply(&mut s).await.unwrap().1, rep::ERR_TLS_REQD);
    assert_eq!(go(&mut s, "lun0").await.unwrap(), Err(rep::ERR_TLS_REQD));
    send_option(&mut s, ClientOption::StructuredReply)
        .await
        .unwrap();
    assert_eq!(option_reply(&mut s).await.unwrap().1, rep::ERR_TLS_REQD);
    // A write request sent as if transmission had begun: bad option magic, closed.
    let h = encode_request(&Request {
        flags: 0,
        command: Command::Write,
        cookie: 1,
        offset_bytes: 0,
        length_bytes: 4096,
    });
    let _ = s.write_all(&h).await;
    let _ = s.write_all(&[0u8; 4096]).await;
    let mut b = [0u8; 64];
    assert!(matches!(
        tokio::time::timeout(Duration::from_secs(10), s.read(&mut b)).await,
        Ok(Ok(0)) | Ok(Err(_))
    ));
    // EXPORT_NAME before TLS: closed without the export's size and flags.
    let mut s = plain(addr).await;
    send_option(&mut s, ClientOption::ExportName("lun0".into()))
        .await
        .unwrap();
    let mut b = [0u8; 64];
    assert!(matches!(
        tokio::time::timeout(Duration::from_secs(10), s.read(&mut b)).await,
        Ok(Ok(0)) | Ok(Err(_))
    ));
    // Plaintext right behind STARTTLS (injection): closed.
    let mut s = plain(addr).await;
    let mut both = BytesMut::new();
    encode_option(&ClientOption::Unsupported(opt::STARTTLS), &mut both);
    encode_option(
        &ClientOption::Go(InfoRequest {
            name: "lun0".into(),
            infos: vec![],
        }),
        &mut both,
    );
    s.write_all(&both).await.unwrap();
    let mut rest = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut rest)).await;
    assert!(rest.is_empty(), "no answer to plaintext behind STARTTLS");
    assert!(volume_unchanged(&vol).await);

    // Inside TLS: options, a second STARTTLS refused, then reads and writes.
    let cfg = client_config(&[ca.der()], None);
    let mut t = starttls(addr, cfg).await.expect("TLS handshake");
    send_option(&mut t, ClientOption::Unsupported(opt::STARTTLS))
        .await
        .unwrap();
    assert_eq!(option_reply(&mut t).await.unwrap().1, rep::ERR_INVALID);
    send_option(&mut t, ClientOption::List).await.unwrap();
    assert_eq!(option_reply(&mut t).await.unwrap().1, rep::SERVER);
    assert_eq!(option_reply(&mut t).await.unwrap().1, rep::ACK);
    assert_eq!(go(&mut t, "lun0").await.unwrap(), Ok(()));
    let data = pattern(77, 512 << 10);
    assert_eq!(
        request(&mut t, Command::Write, 8192, data.len() as u32, &data)
            .await
            .unwrap(),
        0
    );
    assert_eq!(
        request(&mut t, Command::Read, 8192, data.len() as u32, &[])
            .await
            .unwrap(),
        0
    );
    let mut back = vec![0u8; data.len()];
    t.read_exact(&mut back).await.unwrap();
    assert!(back == data, "read back over TLS");
    assert_eq!(request(&mut t, Command::Flush, 0, 0, &[]).await.unwrap(), 0);
    let on_volume = vol
        .read(2, (data.len() / BLOCK as usize) as u32)
        .await
        .unwrap();
    assert!(on_volume[..] == data[..], "the write reached the volume");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn untrusted_server_and_wrong_client_certificates_get_nothing() {
    let ca = Ca::new("server CA");
    let clients = Ca::new("client CA");
    let other = Ca::new("another CA");
    let f = server_files(&ca, &clients);
    let (addr, vol) = serve(&f.cert, &f.key, Some(&f.ca)).await;

    // A client that trusts another authority: its handshake fails.
    let good_id = clients.leaf(&["client.example"], true);
    let r = try_write(addr, client_config(&[other.der()], Some(good_id.clone()))).await;
    assert!(r.is_err(), "client trusting another CA was served");
    // No client certificate, or one from another authority: refused by the server.
    let r = try_write(addr, client_config(&[ca.der()], None)).await;
    assert!(r.is_err(), "client without a certificate was served");
    let r = try_write(
        addr,
        client_config(&[ca.der()], Some(other.leaf(&["client.example"], true))),
    )
    .await;
    assert!(
        r.is_err(),
        "client with another CA's certificate was served"
    );
    // A server certificate presented as a client certificate is not a client's.
    let r = try_write(
        addr,
        client_config(&[ca.der()], Some(clients.leaf(&["client.example"], false))),
    )
    .await;
    assert!(
        r.is_err(),
        "a server-only certificate was accepted from a client"
    );
    assert!(
        volume_unchanged(&vol).await,
        "a refused client changed the volume"
    );

    // The client with a certificate from the client CA is served.
    try_write(addr, client_config(&[ca.der()], Some(good_id)))
        .await
        .expect("the authorised client is served");
    assert!(!volume_unchanged(&vol).await);
    assert!(vol.read(0, 16).await.unwrap().iter().all(|b| *b == 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn generated_certificate_serves_clients_trusting_its_authority() {
    let dir = tempfile::tempdir().unwrap();
    let g = nbd::tls::ensure_generated(&dir.path().join("nbd"), &[]).unwrap();
    let (addr, vol) = serve(&g.server_cert, &g.server_key, None).await;
    let ca = nbd::tls::read_certs(&g.ca_cert).unwrap();
    try_write(addr, client_config(&ca, None))
        .await
        .expect("served with the generated authority");
    // A client trusting some other authority fails.
    let other = Ca::new("another CA");
    assert!(try_write(addr, client_config(&[other.der()], None))
        .await
        .is_err());
    assert!(vol.read(0, 16).await.unwrap().iter().all(|b| *b == 0));
}
