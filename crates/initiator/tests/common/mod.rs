//! A real freesan target in-process for the initiator's integration tests, a
//! counting volume and a fault-injecting TCP proxy.
#![allow(dead_code)]

use async_trait::async_trait;
use block::{BlockResult, Bytes, Geometry, MemVolume, Volume, VolumeRef};
use iscsi::{Auth, ChapSecret, Limits, Portal, Server, ServerConfig, TargetSpec};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;

pub const INI: &str = "iqn.2026-01.org.test:initiator";
pub const OPEN: &str = "iqn.2026-01.org.freesan:open";
pub const SECURE: &str = "iqn.2026-01.org.freesan:secure";
pub const BLOCKS: u64 = 16384;

/// Counts what reaches the volume below the target.
pub struct Counting {
    pub inner: VolumeRef,
    pub flushes: AtomicU64,
    pub fua_writes: AtomicU64,
    pub writes: AtomicU64,
}

#[async_trait]
impl Volume for Counting {
    fn geometry(&self) -> Geometry {
        Geometry {
            volatile_cache: true,
            ..self.inner.geometry()
        }
    }
    async fn read(&self, lba: u64, blocks: u32) -> BlockResult<Bytes> {
        self.inner.read(lba, blocks).await
    }
    async fn write(&self, lba: u64, data: Bytes, fua: bool) -> BlockResult<()> {
        self.writes.fetch_add(1, Ordering::Relaxed);
        if fua {
            self.fua_writes.fetch_add(1, Ordering::Relaxed);
        }
        self.inner.write(lba, data, fua).await
    }
    async fn flush(&self) -> BlockResult<()> {
        self.flushes.fetch_add(1, Ordering::Relaxed);
        self.inner.flush().await
    }
    async fn discard(&self, lba: u64, blocks: u64) -> BlockResult<()> {
        self.inner.discard(lba, blocks).await
    }
    async fn write_zeroes(&self, lba: u64, blocks: u64, may_unmap: bool) -> BlockResult<()> {
        self.inner.write_zeroes(lba, blocks, may_unmap).await
    }
}

fn scsi_target(name: &str, vol: VolumeRef, naa_last: u8) -> Arc<scsi::ScsiTarget> {
    let mut naa = [0x60, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15];
    naa[15] = naa_last;
    let cfg = scsi::TargetConfig::one_port_group(
        name,
        2,
        vec![(
            0,
            scsi::LunConfig {
                naa,
                serial: format!("SERIAL{naa_last:04}"),
                vendor: "FREESAN".into(),
                product: "TEST".into(),
                revision: "0001".into(),
                read_only: false,
                state_file: None,
                physical_block_exponent: 0,
                sanitize_rate_bytes_per_s: 0,
            },
            vol,
        )],
    );
    Arc::new(scsi::ScsiTarget::new(cfg).expect("scsi target"))
}

pub struct Fixture {
    pub addrs: Vec<SocketAddr>,
    pub counting: Arc<Counting>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    done: Option<tokio::task::JoinHandle<std::io::Result<()>>>,
}

impl Fixture {
    pub async fn shutdown(mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(d) = self.done.take() {
            let _ = tokio::time::timeout(Duration::from_secs(20), d).await;
        }
    }
}

pub fn url(addr: SocketAddr, iqn: &str) -> String {
    format!("iscsi://{addr}/{iqn}/0")
}

/// Starts a target with two portals (127.0.0.1, 127.0.0.2) serving OPEN (over a
/// counting MemVolume) and SECURE (CHAP alice / mutual target).
pub async fn start(limits: Limits) -> Fixture {
    let _ = tracing_subscriber::fmt().with_test_writer().try_init();
    let counting = Arc::new(Counting {
        inner: Arc::new(MemVolume::new(512, BLOCKS)),
        flushes: AtomicU64::new(0),
        fua_writes: AtomicU64::new(0),
        writes: AtomicU64::new(0),
    });
    let targets = vec![
        TargetSpec {
            iqn: OPEN.into(),
            alias: Some("open".into()),
            scsi: scsi_target(OPEN, counting.clone(), 1),
            auth: Auth::default(),
            allowed_initiators: vec![],
        },
        TargetSpec {
            iqn: SECURE.into(),
            alias: None,
            scsi: scsi_target(SECURE, Arc::new(MemVolume::new(512, BLOCKS)), 2),
            auth: Auth {
                chap: Some(ChapSecret {
                    user: "alice".into(),
                    secret: "alice-secret-12".into(),
                }),
                mutual: Some(ChapSecret {
                    user: "target".into(),
                    secret: "target-secret-12".into(),
                }),
                ..Auth::default()
            },
            allowed_initiators: vec![],
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
        buffers: block::BufferBudget::unlimited(),
    };
    let server = Server::bind(cfg).await.expect("bind");
    let addrs = server.local_addrs();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let done = tokio::spawn(server.run(async move {
        let _ = rx.await;
    }));
    Fixture {
        addrs,
        counting,
        stop: Some(tx),
        done: Some(done),
    }
}

/// A TCP proxy on 127.0.0.3 in front of `upstream`: `cut()` drops every
/// connection and refuses new ones until `heal()`.
pub struct Proxy {
    pub addr: SocketAddr,
    up: Arc<AtomicBool>,
    conns: Arc<parking_lot::Mutex<JoinSet<()>>>,
    accept: tokio::task::JoinHandle<()>,
}

impl Proxy {
    pub async fn start(upstream: SocketAddr) -> Proxy {
        let l = TcpListener::bind("127.0.0.3:0").await.expect("bind proxy");
        let addr = l.local_addr().unwrap();
        let up = Arc::new(AtomicBool::new(true));
        let conns = Arc::new(parking_lot::Mutex::new(JoinSet::new()));
        let (up2, conns2) = (up.clone(), conns.clone());
        let accept = tokio::spawn(async move {
            loop {
                let Ok((mut c, _)) = l.accept().await else {
                    return;
                };
                if !up2.load(Ordering::Acquire) {
                    drop(c);
                    continue;
                }
                conns2.lock().spawn(async move {
                    let Ok(mut s) = TcpStream::connect(upstream).await else {
                        return;
                    };
                    let _ = s.set_nodelay(true);
                    let _ = c.set_nodelay(true);
                    let _ = tokio::io::copy_bidirectional(&mut c, &mut s).await;
                });
            }
        });
        Proxy {
            addr,
            up,
            conns,
            accept,
        }
    }

    pub fn cut(&self) {
        self.up.store(false, Ordering::Release);
        self.conns.lock().abort_all();
    }

    pub fn heal(&self) {
        self.up.store(true, Ordering::Release);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept.abort();
        self.conns.lock().abort_all();
    }
}
