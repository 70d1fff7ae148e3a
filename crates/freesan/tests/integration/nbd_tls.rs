//! NBD over TLS on a real node, driven by qemu-img (Debian's qemu, GnuTLS):
//! `[nbd] tls = "require"` with a certificate and a client CA from the operator,
//! and with the certificate the node makes at first start. qemu-img writes and
//! reads a LUN through `tls-creds-x509`; a plaintext client, a client that
//! trusts another authority, one without a certificate and one with another
//! authority's certificate are refused, with nothing read and the LUN's bytes
//! unchanged. Skips when qemu-img is missing, fails instead under
//! FREESAN_REQUIRE_TOOLS=1.

use crate::common;
use common::*;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

const LUN_BYTES: usize = 16 << 20;

/// A certificate authority of the test and the key it signs with.
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

    fn pem(&self) -> String {
        self.cert.pem()
    }

    /// (certificate, key) PEM of a leaf for a client or a server.
    fn leaf(&self, names: &[&str], client: bool) -> (String, String) {
        let key = rcgen::KeyPair::generate().unwrap();
        let names: Vec<String> = names.iter().map(|s| s.to_string()).collect();
        let mut p = rcgen::CertificateParams::new(names).unwrap();
        p.distinguished_name = rcgen::DistinguishedName::new();
        p.distinguished_name.push(
            rcgen::DnType::CommonName,
            if client { "nbd client" } else { "nbd server" },
        );
        p.extended_key_usages = vec![if client {
            rcgen::ExtendedKeyUsagePurpose::ClientAuth
        } else {
            rcgen::ExtendedKeyUsagePurpose::ServerAuth
        }];
        let cert = p.signed_by(&key, &self.cert, &self.key).unwrap();
        (cert.pem(), key.serialize_pem())
    }
}

/// A qemu `tls-creds-x509` client folder: `ca-cert.pem` (the authorities
/// trusted) and, when given, `client-cert.pem` and `client-key.pem`.
fn creds_dir(
    root: &Path,
    name: &str,
    trusted: &[String],
    id: Option<&(String, String)>,
) -> PathBuf {
    let d = root.join(name);
    std::fs::create_dir_all(&d).unwrap();
    std::fs::write(d.join("ca-cert.pem"), trusted.concat()).unwrap();
    if let Some((c, k)) = id {
        std::fs::write(d.join("client-cert.pem"), c).unwrap();
        std::fs::write(d.join("client-key.pem"), k).unwrap();
    }
    d
}

/// A node with one 16 MiB file LUN and NBD on loopback with `nbd_extra` lines.
fn node_config(dir: &Path, nbd_extra: &str) -> PathBuf {
    let s = format!(
        "data_dir = \"{d}/data\"\n[[portal]]\naddress = \"127.0.0.1:0\"\n\
         [nbd]\naddress = \"127.0.0.1:0\"\n{nbd_extra}\
         [[target]]\niqn = \"{IQN}\"\n[[target.lun]]\npath = \"{d}/lun0.img\"\nsize = \"16M\"\n",
        d = dir.display()
    );
    let path = dir.join("node.toml");
    std::fs::write(&path, s).unwrap();
    path
}

/// The `--image-opts` string of export lun0 at `addr`, with TLS when `tls`.
fn image_opts(addr: &str, tls: bool) -> String {
    let (host, port) = addr.rsplit_once(':').unwrap();
    let mut s =
        format!("driver=nbd,server.type=inet,server.host={host},server.port={port},export=lun0");
    if tls {
        s += ",tls-creds=tls0";
    }
    s
}

/// Runs qemu-img with `args` (at most 60 s); returns (success, output).
fn qemu_img(args: &[String]) -> (bool, String) {
    let mut all = vec!["60".to_string(), "qemu-img".to_string()];
    all.extend_from_slice(args);
    let refs: Vec<&str> = all.iter().map(String::as_str).collect();
    let (ok, out) = run("timeout", &refs);
    eprintln!("$ qemu-img {}\n{out}", args.join(" "));
    (ok, out)
}

/// qemu's `--object` for X.509 client credentials in folder `d`.
fn x509(d: &Path) -> String {
    format!("tls-creds-x509,id=tls0,endpoint=client,dir={}", d.display())
}

fn tls_object(creds: Option<&str>) -> Vec<String> {
    match creds {
        Some(o) => vec!["--object".into(), o.into()],
        None => Vec::new(),
    }
}

/// qemu-img writes the raw image `src` over LUN 0 (with TLS when `creds`
/// names a `tls0` object).
fn qemu_write(addr: &str, creds: Option<&str>, src: &Path) -> (bool, String) {
    let mut a: Vec<String> = vec!["convert".into(), "-n".into(), "-f".into(), "raw".into()];
    a.extend(tls_object(creds));
    a.push(src.display().to_string());
    a.push("--target-image-opts".into());
    a.push(image_opts(addr, creds.is_some()));
    qemu_img(&a)
}

/// qemu-img reads LUN 0 into the raw file `out`.
fn qemu_read(addr: &str, creds: Option<&str>, out: &Path) -> (bool, String) {
    let mut a: Vec<String> = vec!["convert".into()];
    a.extend(tls_object(creds));
    a.extend([
        "--image-opts".into(),
        image_opts(addr, creds.is_some()),
        "-O".into(),
        "raw".into(),
        out.display().to_string(),
    ]);
    qemu_img(&a)
}

/// Deterministic data with zeroed holes (so qemu-img also sends WRITE_ZEROES).
fn image(seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut v: Vec<u8> = (0..LUN_BYTES)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    for mib in (0..16).step_by(3) {
        v[mib << 20..(mib + 1) << 20].fill(0);
    }
    v
}

/// The LUN's backing file, as the node wrote it.
fn lun_bytes(dir: &Path) -> Vec<u8> {
    let mut v = std::fs::read(dir.join("lun0.img")).unwrap();
    v.resize(LUN_BYTES, 0);
    v
}

/// Each of `clients` (a name and qemu's credentials object, None: plaintext)
/// tries to overwrite LUN 0 with `evil` and to read it; every try fails and
/// reads nothing. Then a raw plaintext client is refused too.
fn refused_clients_get_nothing(
    root: &Path,
    addr: &str,
    evil: &Path,
    clients: &[(&str, Option<String>)],
) {
    for (what, creds) in clients {
        let (ok, out) = qemu_write(addr, creds.as_deref(), evil);
        assert!(!ok, "qemu-img {what} wrote: {out}");
        let stolen = root.join("stolen.img");
        let _ = std::fs::remove_file(&stolen);
        let (ok, out) = qemu_read(addr, creds.as_deref(), &stolen);
        assert!(!ok, "qemu-img {what} read: {out}");
        let got = std::fs::read(&stolen).unwrap_or_default();
        assert!(got.iter().all(|b| *b == 0), "qemu-img {what} got LUN bytes");
    }
    raw_plaintext_client_is_refused(addr);
}

/// A plaintext client speaking raw NBD: LIST, INFO and GO are answered
/// NBD_REP_ERR_TLS_REQD with no export data; NBD_OPT_EXPORT_NAME closes.
fn raw_plaintext_client_is_refused(addr: &str) {
    const IHAVEOPT: u64 = 0x4948_4156_454F_5054;
    const ERR_TLS_REQD: u32 = (1 << 31) | 5;
    let option = |code: u32, data: &[u8]| {
        let mut b = IHAVEOPT.to_be_bytes().to_vec();
        b.extend_from_slice(&code.to_be_bytes());
        b.extend_from_slice(&(data.len() as u32).to_be_bytes());
        b.extend_from_slice(data);
        b
    };
    let mut go = 4u32.to_be_bytes().to_vec();
    go.extend_from_slice(b"lun0");
    go.extend_from_slice(&0u16.to_be_bytes());
    let connect = || {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut greeting = [0u8; 18];
        s.read_exact(&mut greeting).unwrap();
        s.write_all(&3u32.to_be_bytes()).unwrap();
        s
    };
    let mut s = connect();
    for (code, data) in [(3u32, &[][..]), (6, &go[..]), (7, &go[..])] {
        s.write_all(&option(code, data)).unwrap();
        let mut h = [0u8; 20];
        s.read_exact(&mut h).unwrap();
        let typ = u32::from_be_bytes(h[12..16].try_into().unwrap());
        let len = u32::from_be_bytes(h[16..20].try_into().unwrap());
        assert_eq!(
            typ, ERR_TLS_REQD,
            "option {code} answered {typ:#x} without TLS"
        );
        let mut msg = vec![0u8; len as usize];
        s.read_exact(&mut msg).unwrap();
    }
    let mut s = connect();
    s.write_all(&option(1, b"lun0")).unwrap();
    let mut rest = Vec::new();
    let _ = s.read_to_end(&mut rest);
    assert!(
        rest.is_empty(),
        "EXPORT_NAME without TLS got {} bytes",
        rest.len()
    );
}

#[test]
fn qemu_img_over_tls_with_client_certificates_and_refusals() {
    if !have("qemu-img") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    // One site authority signs the server and the clients (qemu's usual layout);
    // another authority signs a stranger's client certificate.
    let site = Ca::new("freesan test site CA");
    let other = Ca::new("another CA");
    let (server_cert, server_key) = site.leaf(&["localhost", "127.0.0.1"], false);
    let pki = root.join("pki");
    std::fs::create_dir_all(&pki).unwrap();
    std::fs::write(pki.join("server-cert.pem"), server_cert).unwrap();
    std::fs::write(pki.join("server-key.pem"), server_key).unwrap();
    make_private(&pki.join("server-key.pem"));
    std::fs::write(pki.join("client-ca.pem"), site.pem()).unwrap();
    let cfg = node_config(
        root,
        "tls = \"require\"\ntls_cert = \"pki/server-cert.pem\"\ntls_key = \"pki/server-key.pem\"\n\
         tls_client_ca = \"pki/client-ca.pem\"\n",
    );
    let mut node = start_config(root, &cfg);
    let addr = node.nbd.clone().expect("nbd address");

    let good_id = site.leaf(&["client.example"], true);
    let good = creds_dir(root, "good", &[site.pem()], Some(&good_id));
    let src = root.join("src.img");
    let data = image(1);
    std::fs::write(&src, &data).unwrap();
    let (ok, out) = qemu_write(&addr, Some(&x509(&good)), &src);
    assert!(ok, "qemu-img could not write over TLS: {out}");
    let back = root.join("back.img");
    let (ok, out) = qemu_read(&addr, Some(&x509(&good)), &back);
    assert!(ok, "qemu-img could not read over TLS: {out}");
    assert!(std::fs::read(&back).unwrap() == data, "read back differs");
    assert!(
        lun_bytes(root) == data,
        "the LUN file differs from what was written"
    );

    // Refused: plaintext, a client trusting another authority, one without a
    // certificate, one with another authority's certificate. Each tries to
    // overwrite the LUN with other data and to read it.
    let stranger_id = other.leaf(&["client.example"], true);
    let wrong_trust = creds_dir(root, "wrong-trust", &[other.pem()], Some(&stranger_id));
    let no_cert = creds_dir(root, "no-cert", &[site.pem()], None);
    // Both authorities trusted, so qemu accepts its own certificate locally.
    // (GnuTLS then withholds it, as the server's request names only the site
    // authority: the server sees no certificate. A client that sends another
    // authority's certificate anyway is refused in crates/nbd/tests/tls.rs.)
    let stranger = creds_dir(
        root,
        "stranger",
        &[site.pem(), other.pem()],
        Some(&stranger_id),
    );
    let evil = root.join("evil.img");
    std::fs::write(&evil, image(2)).unwrap();
    refused_clients_get_nothing(
        root,
        &addr,
        &evil,
        &[
            ("plaintext", None),
            ("trusting another CA", Some(x509(&wrong_trust))),
            ("without a client certificate", Some(x509(&no_cert))),
            ("with another CA's certificate", Some(x509(&stranger))),
        ],
    );
    assert!(lun_bytes(root) == data, "a refused client changed the LUN");
    // The authorised client still reads what it wrote.
    let (ok, out) = qemu_read(&addr, Some(&x509(&good)), &back);
    assert!(ok, "{out}");
    assert!(std::fs::read(&back).unwrap() == data);
    assert!(node.terminate(), "clean stop");
    let log = std::fs::read_to_string(&node.log).unwrap();
    for l in log.lines().filter(|l| l.contains("TLS")) {
        eprintln!("log: {l}");
    }
    assert!(
        log.contains("NBD TLS handshake failed"),
        "refusals are logged"
    );
}

#[test]
fn generated_certificate_serves_qemu_img_and_survives_a_restart() {
    if !have("qemu-img") {
        return;
    }
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let cfg = node_config(root, "tls = \"require\"\n");
    let mut node = start_config(root, &cfg);
    let addr = node.nbd.clone().expect("nbd address");
    let gen = root.join("data").join("nbd");
    for f in ["ca-cert.pem", "server-cert.pem", "server-key.pem"] {
        let mode = std::fs::metadata(gen.join(f)).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "{f}");
    }
    let ca = std::fs::read_to_string(gen.join("ca-cert.pem")).unwrap();
    let log = std::fs::read_to_string(&node.log).unwrap();
    assert!(
        log.contains(&gen.join("ca-cert.pem").display().to_string()),
        "the banner names the CA clients need: {log}"
    );
    let creds = creds_dir(root, "client", std::slice::from_ref(&ca), None);
    let src = root.join("src.img");
    let data = image(3);
    std::fs::write(&src, &data).unwrap();
    let (ok, out) = qemu_write(&addr, Some(&x509(&creds)), &src);
    assert!(ok, "qemu-img could not write with the generated CA: {out}");
    // Plaintext and another authority get nothing.
    let other = creds_dir(root, "other", &[Ca::new("another CA").pem()], None);
    let evil = root.join("evil.img");
    std::fs::write(&evil, image(4)).unwrap();
    assert!(!qemu_write(&addr, None, &evil).0);
    assert!(!qemu_write(&addr, Some(&x509(&other)), &evil).0);
    assert!(node.terminate(), "clean stop");
    assert!(lun_bytes(root) == data);

    // A restart keeps the certificate: the client's copy of the CA still works.
    let mut node = start_config(root, &cfg);
    let addr = node.nbd.clone().expect("nbd address");
    assert_eq!(
        std::fs::read_to_string(gen.join("ca-cert.pem")).unwrap(),
        ca
    );
    let back = root.join("back.img");
    let (ok, out) = qemu_read(&addr, Some(&x509(&creds)), &back);
    assert!(ok, "qemu-img could not read after a restart: {out}");
    assert!(std::fs::read(&back).unwrap() == data);
    assert!(node.terminate(), "clean stop");
}

/// A qemu `tls-creds-psk` client folder holding `keys.psk` with one line.
#[cfg(feature = "nbd-psk")]
fn psk_client(root: &Path, name: &str, identity: &str, key_hex: &str) -> String {
    let d = root.join(name);
    std::fs::create_dir_all(&d).unwrap();
    std::fs::write(d.join("keys.psk"), format!("{identity}:{key_hex}\n")).unwrap();
    format!(
        "tls-creds-psk,id=tls0,endpoint=client,dir={},username={identity}",
        d.display()
    )
}

/// `[nbd] tls_psk_file`: qemu-img with `tls-creds-psk` writes and reads a LUN
/// as one of the file's identities; plaintext, a wrong key, an unknown identity
/// and another identity's name with this key are refused, with nothing read and
/// the LUN unchanged. A key file that others may read stops the node.
#[cfg(feature = "nbd-psk")]
#[test]
fn qemu_img_over_tls_psk_and_refusals() {
    use std::os::unix::fs::PermissionsExt;
    if !have("qemu-img") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let key = |seed: u8| -> String {
        (0..32u8)
            .map(|i| format!("{:02x}", i.wrapping_mul(37) ^ seed))
            .collect()
    };
    let (alice, bob) = (key(1), key(2));
    let keys = root.join("keys.psk");
    std::fs::write(&keys, format!("alice:{alice}\nbob:{bob}\n")).unwrap();
    std::fs::set_permissions(&keys, std::fs::Permissions::from_mode(0o600)).unwrap();
    let cfg = node_config(root, "tls = \"require\"\ntls_psk_file = \"keys.psk\"\n");
    let mut node = start_config(root, &cfg);
    let addr = node.nbd.clone().expect("nbd address");

    let good = psk_client(root, "alice", "alice", &alice);
    let src = root.join("src.img");
    let data = image(5);
    std::fs::write(&src, &data).unwrap();
    let (ok, out) = qemu_write(&addr, Some(&good), &src);
    assert!(ok, "qemu-img could not write over TLS-PSK: {out}");
    let back = root.join("back.img");
    let (ok, out) = qemu_read(&addr, Some(&good), &back);
    assert!(ok, "qemu-img could not read over TLS-PSK: {out}");
    assert!(std::fs::read(&back).unwrap() == data, "read back differs");
    assert!(lun_bytes(root) == data, "the LUN file differs");

    let evil = root.join("evil.img");
    std::fs::write(&evil, image(6)).unwrap();
    refused_clients_get_nothing(
        root,
        &addr,
        &evil,
        &[
            ("plaintext", None),
            (
                "with a wrong key",
                Some(psk_client(root, "wrong", "alice", &key(3))),
            ),
            (
                "with an unknown identity",
                Some(psk_client(root, "mallory", "mallory", &alice)),
            ),
            (
                "naming bob with alice's key",
                Some(psk_client(root, "notbob", "bob", &alice)),
            ),
            (
                "with an X.509 client",
                Some(x509(&creds_dir(
                    root,
                    "x509",
                    &[Ca::new("a CA").pem()],
                    None,
                ))),
            ),
        ],
    );
    assert!(lun_bytes(root) == data, "a refused client changed the LUN");
    let (ok, out) = qemu_read(&addr, Some(&good), &back);
    assert!(ok, "{out}");
    assert!(std::fs::read(&back).unwrap() == data);
    assert!(node.terminate(), "clean stop");
    let log = std::fs::read_to_string(&node.log).unwrap();
    assert!(
        log.contains("NBD TLS-PSK handshake failed"),
        "refusals are logged"
    );
    assert!(
        log.contains("identity=alice"),
        "the identity is logged: {log}"
    );

    // A key file that others may read: the node does not start.
    std::fs::set_permissions(&keys, std::fs::Permissions::from_mode(0o644)).unwrap();
    let (ok, out) = serve_expecting_refusal(&cfg);
    assert!(!ok && out.contains("chmod 600"), "{out}");
}
