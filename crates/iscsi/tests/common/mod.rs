//! A tiny raw iSCSI initiator for the integration tests, and a server fixture.
#![allow(dead_code)]

use block::MemVolume;
use bytes::{Bytes, BytesMut};
use iscsi::{Auth, ChapSecret, Limits, Portal, Server, ServerConfig, TargetSpec};
use iscsi_proto::chap;
use iscsi_proto::digest::{data_digest, header_digest, pad_len};
use iscsi_proto::frame::encode_frame;
use iscsi_proto::pdu::*;
use iscsi_proto::target::{parse_target_bhs, SeqNumbers, TargetPdu};
use iscsi_proto::text::{encode_text, parse_text};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

pub const INI: &str = "iqn.2026-01.org.test:initiator";
pub const OPEN: &str = "iqn.2026-01.org.freesan:open";
pub const SECURE: &str = "iqn.2026-01.org.freesan:secure";
pub const HIDDEN: &str = "iqn.2026-01.org.freesan:hidden";
/// An initiator with its own CHAP secret on SECURE (user "bob").
pub const BOB: &str = "iqn.2026-01.org.test:bob";

pub struct Fixture {
    pub addrs: Vec<SocketAddr>,
    /// The server's session registry, as its API lists it.
    pub sessions: iscsi::Sessions,
    /// Replaces the target table while the server runs (a reload).
    pub reloader: iscsi::Reloader,
    pub stop: Option<tokio::sync::oneshot::Sender<()>>,
    pub done: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl Fixture {
    pub async fn shutdown(mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        tokio::time::timeout(Duration::from_secs(20), self.done)
            .await
            .expect("server stops")
            .unwrap()
            .unwrap();
    }
}

/// A test LU's configuration: its NAA ends in `naa_last`, its serial is `serial`.
pub fn lun_config(naa_last: u8, serial: &str) -> scsi::LunConfig {
    scsi::LunConfig {
        naa: [
            0x60, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, naa_last,
        ],
        serial: serial.into(),
        vendor: "FREESAN".into(),
        product: "TEST".into(),
        revision: "0001".into(),
        read_only: false,
        state_file: None,
        physical_block_exponent: 0,
        sanitize_rate_bytes_per_s: 0,
    }
}

pub fn scsi_target(name: &str, vol: Option<block::VolumeRef>) -> Arc<scsi::ScsiTarget> {
    let vol = vol.unwrap_or_else(|| Arc::new(MemVolume::new(512, 8192)));
    let cfg =
        scsi::TargetConfig::one_port_group(name, 2, vec![(0, lun_config(15, "SERIAL0001"), vol)]);
    Arc::new(scsi::ScsiTarget::new(cfg).expect("scsi target"))
}

pub fn secret(user: &str, secret: &str) -> ChapSecret {
    ChapSecret {
        user: user.into(),
        secret: secret.into(),
    }
}

pub async fn start(limits: Limits) -> Fixture {
    start_with(limits, None).await
}

/// Like [`start`], with `lun0` as LUN 0 of the open target.
pub async fn start_with(limits: Limits, lun0: Option<block::VolumeRef>) -> Fixture {
    start_with_scsi(limits, scsi_target(OPEN, lun0)).await
}

/// Like [`start`], with `open` as the open target's SCSI target.
pub async fn start_with_scsi(limits: Limits, open: Arc<scsi::ScsiTarget>) -> Fixture {
    start_with_budget(limits, open, block::BufferBudget::unlimited()).await
}

/// Like [`start_with_scsi`], with `buffers` as the node's buffer budget.
pub async fn start_with_budget(
    limits: Limits,
    open: Arc<scsi::ScsiTarget>,
    buffers: block::BufferBudget,
) -> Fixture {
    let _ = logs();
    let targets = vec![
        TargetSpec {
            iqn: OPEN.into(),
            alias: Some("open".into()),
            scsi: open,
            auth: Auth::default(),
            allowed_initiators: vec![],
        },
        TargetSpec {
            iqn: SECURE.into(),
            alias: None,
            scsi: scsi_target(SECURE, None),
            auth: Auth {
                chap: Some(secret("alice", "alice-secret-12")),
                mutual: Some(secret("target", "target-secret-12")),
                per_initiator: vec![(BOB.into(), secret("bob", "bob-secret-1234"))],
                refuse_md5: false,
            },
            allowed_initiators: vec![],
        },
        TargetSpec {
            iqn: HIDDEN.into(),
            alias: None,
            scsi: scsi_target(HIDDEN, None),
            auth: Auth::default(),
            allowed_initiators: vec!["iqn.2026-01.org.test:someone-else".into()],
        },
    ];
    let cfg = ServerConfig {
        partner_portals: Vec::new(),
        portals: vec![
            Portal {
                addr: "127.0.0.1:0".parse().unwrap(),
                tpgt: 1,
            },
            Portal {
                addr: "127.0.0.2:0".parse().unwrap(),
                tpgt: 2,
            },
        ],
        targets,
        discovery_auth: Auth::default(),
        limits,
        buffers,
    };
    let server = Server::bind(cfg).await.expect("bind");
    let addrs = server.local_addrs();
    let sessions = server.sessions();
    let reloader = server.reloader();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let done = tokio::spawn(server.run(async move {
        let _ = rx.await;
    }));
    Fixture {
        addrs,
        sessions,
        reloader,
        stop: Some(tx),
        done,
    }
}

pub struct Pdu {
    pub pdu: TargetPdu,
    pub seq: SeqNumbers,
    pub data: Bytes,
}

pub struct Client {
    pub sock: TcpStream,
    buf: BytesMut,
    pub cmd_sn: u32,
    pub exp_stat_sn: u32,
    pub itt: u32,
    pub isid: [u8; 6],
    pub hd: bool,
    pub dd: bool,
    /// The CHAP algorithm of the last CHAP login.
    pub chap_algorithm: Option<chap::ChapAlgorithm>,
}

impl Client {
    pub async fn connect(addr: SocketAddr) -> Client {
        Client::connect_isid(addr, [0x80, 0, 0x12, 0x34, 0x56, 0x01]).await
    }

    /// A client on an already connected socket (e.g. bound to another source).
    pub fn from_stream(sock: TcpStream, isid: [u8; 6]) -> Client {
        let _ = sock.set_nodelay(true);
        Client {
            sock,
            buf: BytesMut::new(),
            cmd_sn: 1,
            exp_stat_sn: 0,
            itt: 0x100,
            isid,
            hd: false,
            dd: false,
            chap_algorithm: None,
        }
    }

    /// Like [`Client::send`] without digests, returning write errors instead of
    /// panicking (the target may have closed the connection).
    pub async fn send_checked(&mut self, pdu: &InitiatorPdu, data: &[u8]) -> std::io::Result<()> {
        let h = encode_initiator_bhs(pdu, true, 0, data.len() as u32);
        let wire = encode_frame(&h, &[], data, false, false);
        self.sock.write_all(&wire).await
    }

    pub async fn connect_isid(addr: SocketAddr, isid: [u8; 6]) -> Client {
        let sock = TcpStream::connect(addr).await.expect("connect");
        sock.set_nodelay(true).unwrap();
        Client {
            sock,
            buf: BytesMut::new(),
            cmd_sn: 1,
            exp_stat_sn: 0,
            itt: 0x100,
            isid,
            hd: false,
            dd: false,
            chap_algorithm: None,
        }
    }

    pub fn next_itt(&mut self) -> u32 {
        self.itt += 1;
        self.itt
    }

    pub async fn send_raw(&mut self, bytes: &[u8]) {
        self.sock.write_all(bytes).await.expect("write");
    }

    pub async fn send(&mut self, pdu: &InitiatorPdu, immediate: bool, data: &[u8]) {
        let h = encode_initiator_bhs(pdu, immediate, 0, data.len() as u32);
        let wire = encode_frame(&h, &[], data, self.hd, self.dd);
        self.send_raw(&wire).await;
    }

    async fn fill(&mut self, n: usize) -> bool {
        while self.buf.len() < n {
            match tokio::time::timeout(Duration::from_secs(10), self.sock.read_buf(&mut self.buf))
                .await
            {
                Ok(Ok(0)) | Ok(Err(_)) => return false,
                Ok(Ok(_)) => {}
                Err(_) => panic!("timed out waiting for a PDU"),
            }
        }
        true
    }

    /// Next PDU from the target; None when the connection closed.
    pub async fn recv(&mut self) -> Option<Pdu> {
        let hlen = 48 + if self.hd { 4 } else { 0 };
        if !self.fill(hlen).await {
            return None;
        }
        let mut h = [0u8; 48];
        h.copy_from_slice(&self.buf[..48]);
        if self.hd {
            assert_eq!(
                &self.buf[48..52],
                &header_digest(&h),
                "header digest from target"
            );
        }
        let (pdu, seq, dl) = parse_target_bhs(&h).expect("target PDU");
        let dl = dl as usize;
        let total = hlen + dl + pad_len(dl) + if self.dd && dl > 0 { 4 } else { 0 };
        if !self.fill(total).await {
            return None;
        }
        let all = self.buf.split_to(total).freeze();
        let data = all.slice(hlen..hlen + dl);
        if self.dd && dl > 0 {
            let p = hlen + dl + pad_len(dl);
            assert_eq!(
                &all[p..p + 4],
                &data_digest(&data),
                "data digest from target"
            );
        }
        if pdu.carries_status() {
            self.exp_stat_sn = seq.stat_sn.wrapping_add(1);
        }
        Some(Pdu { pdu, seq, data })
    }

    /// Skips unsolicited NOP-In pings (answering them) until another PDU arrives.
    pub async fn recv_skip_pings(&mut self) -> Option<Pdu> {
        loop {
            let p = self.recv().await?;
            if let TargetPdu::NopIn(n) = p.pdu {
                if n.ttt != iscsi_proto::RESERVED_TAG {
                    let ans = InitiatorPdu::NopOut(NopOut {
                        lun: 0,
                        itt: iscsi_proto::RESERVED_TAG,
                        ttt: n.ttt,
                        cmd_sn: self.cmd_sn,
                        exp_stat_sn: self.exp_stat_sn,
                    });
                    self.send(&ans, true, &[]).await;
                    continue;
                }
            }
            return Some(p);
        }
    }

    /// Sends one login request and returns the response header and text.
    pub async fn login_step(
        &mut self,
        csg: u8,
        nsg: u8,
        transit: bool,
        pairs: &[(&str, &str)],
    ) -> (iscsi_proto::target::LoginResponse, Vec<(String, String)>) {
        let req = InitiatorPdu::Login(LoginRequest {
            transit,
            cont: false,
            csg,
            nsg,
            version_max: 0,
            version_min: 0,
            isid: self.isid,
            tsih: 0,
            itt: 1,
            cid: 0,
            cmd_sn: self.cmd_sn,
            exp_stat_sn: self.exp_stat_sn,
        });
        let (hd, dd) = (self.hd, self.dd);
        self.hd = false;
        self.dd = false;
        self.send(&req, true, &encode_text(pairs)).await;
        let p = self.recv().await.expect("login response");
        self.hd = hd;
        self.dd = dd;
        let TargetPdu::LoginResponse(r) = p.pdu else {
            panic!("not a login response: {:?}", p.pdu)
        };
        (r, parse_text(&p.data).expect("login text"))
    }

    /// Login without authentication in one operational-stage PDU.
    pub async fn login_simple(&mut self, target: &str, extra: &[(&str, &str)]) -> (u8, u8) {
        self.login_simple_as(INI, target, extra).await
    }

    /// [`Client::login_simple`] as initiator `initiator`.
    pub async fn login_simple_as(
        &mut self,
        initiator: &str,
        target: &str,
        extra: &[(&str, &str)],
    ) -> (u8, u8) {
        let mut pairs = vec![
            ("InitiatorName", initiator),
            ("TargetName", target),
            ("SessionType", "Normal"),
        ];
        pairs.extend_from_slice(extra);
        let (r, kv) = self.login_step(1, 3, true, &pairs).await;
        self.after_login(&kv);
        (r.status_class, r.status_detail)
    }

    /// Logs in a discovery session as `initiator`, without authentication;
    /// returns the login's status (class, detail).
    pub async fn login_discovery_as(&mut self, initiator: &str) -> (u8, u8) {
        let (r, kv) = self
            .login_step(
                1,
                3,
                true,
                &[("InitiatorName", initiator), ("SessionType", "Discovery")],
            )
            .await;
        self.after_login(&kv);
        (r.status_class, r.status_detail)
    }

    pub fn after_login(&mut self, kv: &[(String, String)]) {
        self.hd = get(kv, "HeaderDigest") == Some("CRC32C");
        self.dd = get(kv, "DataDigest") == Some("CRC32C");
    }

    /// Security stage with CHAP; returns the final status and the text of the last step.
    pub async fn login_chap(
        &mut self,
        target: &str,
        user: &str,
        password: &str,
        mutual: Option<&[u8]>,
    ) -> ((u8, u8), Vec<(String, String)>) {
        self.login_chap_as(INI, target, "5", user, password, mutual)
            .await
    }

    /// CHAP login as `initiator` offering the CHAP_A list `offer`; the response
    /// uses the algorithm the target chose (its CHAP_A is in the returned text
    /// of the first step only, so it is checked here: it must be one we offered).
    pub async fn login_chap_as(
        &mut self,
        initiator: &str,
        target: &str,
        offer: &str,
        user: &str,
        password: &str,
        mutual: Option<&[u8]>,
    ) -> ((u8, u8), Vec<(String, String)>) {
        let (r, kv) = self
            .login_step(
                0,
                1,
                false,
                &[
                    ("InitiatorName", initiator),
                    ("TargetName", target),
                    ("AuthMethod", "CHAP,None"),
                ],
            )
            .await;
        assert_eq!((r.status_class, r.status_detail), (0, 0));
        assert_eq!(get(&kv, "AuthMethod"), Some("CHAP"));
        let (_, kv) = self.login_step(0, 1, false, &[("CHAP_A", offer)]).await;
        let a = get(&kv, "CHAP_A").expect("CHAP_A answered");
        assert!(offer.split(',').any(|o| o == a), "chose {a} from {offer}");
        let alg = chap::ChapAlgorithm::from_code(chap::parse_number(a).unwrap()).unwrap();
        self.chap_algorithm = Some(alg);
        let id = chap::parse_number(get(&kv, "CHAP_I").unwrap()).unwrap() as u8;
        let c = chap::decode_binary(get(&kv, "CHAP_C").unwrap()).unwrap();
        let resp = chap::encode_hex(&alg.response(id, password.as_bytes(), &c));
        let mut pairs = vec![
            ("CHAP_N".to_string(), user.to_string()),
            ("CHAP_R".to_string(), resp),
        ];
        if let Some(mc) = mutual {
            pairs.push(("CHAP_I".into(), "77".into()));
            pairs.push(("CHAP_C".into(), chap::encode_hex(mc)));
        }
        let refs: Vec<(&str, &str)> = pairs
            .iter()
            .map(|(a, b)| (a.as_str(), b.as_str()))
            .collect();
        let (r, kv) = self.login_step(0, 1, true, &refs).await;
        if (r.status_class, r.status_detail) != (0, 0) {
            return ((r.status_class, r.status_detail), kv);
        }
        let (r2, _) = self.login_step(1, 3, true, &[]).await;
        ((r2.status_class, r2.status_detail), kv)
    }

    pub async fn nop(&mut self, payload: &[u8]) -> Option<Pdu> {
        let itt = self.next_itt();
        let p = InitiatorPdu::NopOut(NopOut {
            lun: 0,
            itt,
            ttt: iscsi_proto::RESERVED_TAG,
            cmd_sn: self.cmd_sn,
            exp_stat_sn: self.exp_stat_sn,
        });
        self.send(&p, true, payload).await;
        self.recv_skip_pings().await
    }

    pub fn command(
        &mut self,
        cdb: &[u8],
        read: bool,
        write: bool,
        edtl: u32,
        final_bit: bool,
    ) -> InitiatorPdu {
        let mut c = [0u8; 16];
        c[..cdb.len()].copy_from_slice(cdb);
        let itt = self.next_itt();
        let p = InitiatorPdu::ScsiCommand(ScsiCommand {
            final_bit,
            read,
            write,
            attr: 1,
            lun: 0,
            itt,
            edtl_bytes: edtl,
            cmd_sn: self.cmd_sn,
            exp_stat_sn: self.exp_stat_sn,
            cdb: c,
        });
        self.cmd_sn += 1;
        p
    }
}

pub fn get<'a>(kv: &'a [(String, String)], k: &str) -> Option<&'a str> {
    kv.iter().find(|(x, _)| x == k).map(|(_, v)| v.as_str())
}

/// Log lines of every test in this binary (without colours), for checking what
/// the target logged.
#[derive(Clone)]
pub struct Capture(Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Capture {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Installs the capturing subscriber (first call in the binary; every target
/// the tests start calls it, so no other subscriber can come first) and returns
/// it.
pub fn logs() -> Capture {
    static LOGS: std::sync::OnceLock<Capture> = std::sync::OnceLock::new();
    LOGS.get_or_init(|| {
        let c = Capture(Arc::default());
        let w = c.clone();
        let _ = tracing_subscriber::fmt()
            .with_ansi(false)
            .with_writer(move || w.clone())
            .try_init();
        c
    })
    .clone()
}

impl Capture {
    /// Log lines containing every one of `words`.
    pub fn lines_with(&self, words: &[&str]) -> Vec<String> {
        let all = String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned();
        all.lines()
            .filter(|l| words.iter().all(|w| l.contains(w)))
            .map(str::to_owned)
            .collect()
    }
}
