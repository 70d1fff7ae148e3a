//! Shared test helpers: a server over memory volumes and a raw protocol driver.
#![allow(dead_code)]

use block::{MemVolume, VolumeRef};
use bytes::BytesMut;
use nbd::proto::{
    self, decode_export_name_reply, decode_server_greeting, decode_simple_reply, encode_option,
    encode_request, ClientOption, Command, Request, SimpleReply,
};
use nbd::{NbdConfig, NbdExport, NbdLimits, NbdServer};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// A running server and its volumes.
pub struct Running {
    pub addr: SocketAddr,
    pub volumes: Vec<Arc<MemVolume>>,
    /// Adds and removes exports while the server runs.
    pub exports: nbd::NbdExports,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<std::io::Result<()>>>,
}

impl Running {
    /// Tells the server to stop, without waiting for it ([`Running::stop`] waits).
    pub fn begin_stop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
    }

    /// Stops the server and waits for `run` to return.
    pub async fn stop(mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.task.take() {
            tokio::time::timeout(Duration::from_secs(20), t)
                .await
                .expect("server did not stop")
                .expect("server task panicked")
                .expect("server failed");
        }
    }
}

/// Starts a server on 127.0.0.1:0 with one export per (block size, blocks, read-only),
/// named lun0, lun1, ...; lun0 is the default export.
pub async fn start(specs: &[(u32, u64, bool)], limits: NbdLimits) -> Running {
    let volumes: Vec<Arc<MemVolume>> = specs
        .iter()
        .map(|(bs, n, _)| Arc::new(MemVolume::new(*bs, *n)))
        .collect();
    let exports = volumes
        .iter()
        .zip(specs)
        .map(|(v, (_, _, ro))| (v.clone() as VolumeRef, *ro))
        .collect();
    let mut r = start_volumes(exports, limits).await;
    r.volumes = volumes;
    r
}

/// Starts a server over arbitrary volumes (exports lun0, lun1, ...; lun0 default).
pub async fn start_volumes(vols: Vec<(VolumeRef, bool)>, limits: NbdLimits) -> Running {
    let exports = vols
        .into_iter()
        .enumerate()
        .map(|(i, (volume, read_only))| NbdExport {
            name: format!("lun{i}"),
            description: format!("freesan test LUN {i}"),
            volume,
            read_only,
            access: None,
        })
        .collect();
    start_exports(exports, limits).await
}

/// Starts a server over `exports` (the first named `lun0`, the default).
pub async fn start_exports(exports: Vec<NbdExport>, limits: NbdLimits) -> Running {
    let server = NbdServer::bind(NbdConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        exports,
        default_export: Some("lun0".into()),
        limits,
        allowed_clients: nbd::server::IpRange::loopback(),
        tls: None,
    })
    .await
    .expect("bind");
    let addr = server.local_addr();
    let exports = server.exports();
    let (tx, rx) = oneshot::channel::<()>();
    let task = tokio::spawn(server.run(async move {
        let _ = rx.await;
    }));
    Running {
        addr,
        volumes: Vec::new(),
        exports,
        stop: Some(tx),
        task: Some(task),
    }
}

/// Writes one request header (`range`: offset and length in bytes) and payload.
pub async fn send_request(
    sock: &mut TcpStream,
    command: Command,
    flags: u16,
    cookie: u64,
    (off, len): (u64, u32),
    payload: &[u8],
) {
    let h = encode_request(&Request {
        flags,
        command,
        cookie,
        offset_bytes: off,
        length_bytes: len,
    });
    sock.write_all(&h).await.unwrap();
    sock.write_all(payload).await.unwrap();
}

/// A connection speaking raw NBD, for malformed and unaligned requests.
pub struct Raw {
    pub sock: TcpStream,
    pub size_bytes: u64,
    pub flags: u16,
}

impl Raw {
    /// Handshakes with NBD_OPT_EXPORT_NAME (the oldest path) and NO_ZEROES.
    pub async fn connect(addr: SocketAddr, export: &str) -> Raw {
        Raw::try_connect(addr, export)
            .await
            .expect("the server closed the handshake")
    }

    /// [`Raw::connect`]; None when the server closes the connection before
    /// it answers the export's name.
    pub async fn try_connect(addr: SocketAddr, export: &str) -> Option<Raw> {
        let mut sock = TcpStream::connect(addr).await.unwrap();
        sock.set_nodelay(true).unwrap();
        let mut g = [0u8; 18];
        sock.read_exact(&mut g).await.unwrap();
        let hf = decode_server_greeting(&g).unwrap();
        assert_eq!(hf, proto::hflag::FIXED_NEWSTYLE | proto::hflag::NO_ZEROES);
        sock.write_all(&3u32.to_be_bytes()).await.unwrap();
        let mut b = BytesMut::new();
        encode_option(&ClientOption::ExportName(export.into()), &mut b);
        sock.write_all(&b).await.ok()?;
        let mut r = [0u8; 10];
        sock.read_exact(&mut r).await.ok()?;
        let (size_bytes, flags) = decode_export_name_reply(&r).unwrap();
        Some(Raw {
            sock,
            size_bytes,
            flags,
        })
    }

    /// Sends one request header (and payload).
    pub async fn send(
        &mut self,
        command: Command,
        flags: u16,
        cookie: u64,
        off: u64,
        len: u32,
        payload: &[u8],
    ) {
        send_request(&mut self.sock, command, flags, cookie, (off, len), payload).await;
    }

    /// Reads one simple reply header (with a timeout); `None` at end of stream.
    pub async fn reply(&mut self) -> Option<SimpleReply> {
        let mut h = [0u8; 16];
        match tokio::time::timeout(Duration::from_secs(10), self.sock.read_exact(&mut h))
            .await
            .expect("reply timed out")
        {
            Ok(_) => Some(decode_simple_reply(&h).expect("bad reply magic")),
            Err(_) => None,
        }
    }

    /// Reads `n` payload bytes.
    pub async fn data(&mut self, n: usize) -> Vec<u8> {
        let mut v = vec![0u8; n];
        self.sock.read_exact(&mut v).await.unwrap();
        v
    }

    /// Writes and checks the reply.
    pub async fn write(&mut self, off: u64, data: &[u8]) -> u32 {
        self.send(Command::Write, 0, 7, off, data.len() as u32, data)
            .await;
        let r = self.reply().await.expect("closed");
        assert_eq!(r.cookie, 7);
        r.error
    }

    /// Reads; returns the error or the data.
    pub async fn read(&mut self, off: u64, len: u32) -> Result<Vec<u8>, u32> {
        self.send(Command::Read, 0, 8, off, len, &[]).await;
        let r = self.reply().await.expect("closed");
        assert_eq!(r.cookie, 8);
        if r.error != 0 {
            return Err(r.error);
        }
        Ok(self.data(len as usize).await)
    }

    /// True when the server closed the connection (EOF within the timeout, after
    /// at most 64 KiB of other bytes such as a greeting).
    pub async fn closed(&mut self) -> bool {
        let mut b = [0u8; 4096];
        for _ in 0..16 {
            match tokio::time::timeout(Duration::from_secs(10), self.sock.read(&mut b)).await {
                Ok(Ok(0)) | Ok(Err(_)) => return true,
                Ok(Ok(_)) => continue,
                Err(_) => return false,
            }
        }
        false
    }
}

/// Deterministic pseudo-random bytes.
pub fn pattern(seed: u64, n: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}
