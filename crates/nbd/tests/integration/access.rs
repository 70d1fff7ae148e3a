//! Who may connect: addresses outside `allowed_clients` are closed before the
//! greeting, connections are bounded per source address and in total, and a
//! client that never finishes the handshake is closed after the timeout.

use block::{MemVolume, VolumeRef};
use nbd::{IpRange, NbdConfig, NbdExport, NbdLimits, NbdServer};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::AsyncReadExt;
use tokio::net::{TcpSocket, TcpStream};

async fn serve(allowed: &[&str], limits: NbdLimits) -> SocketAddr {
    let volume: VolumeRef = Arc::new(MemVolume::new(512, 64));
    let server = NbdServer::bind(NbdConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        exports: vec![NbdExport {
            name: "lun0".into(),
            description: String::new(),
            volume,
            read_only: false,
            access: None,
        }],
        default_export: Some("lun0".into()),
        limits,
        allowed_clients: allowed.iter().map(|a| a.parse().unwrap()).collect(),
        tls: None,
    })
    .await
    .unwrap();
    let addr = server.local_addr();
    tokio::spawn(server.run(std::future::pending()));
    addr
}

/// A TCP connection from `source` (a loopback address) to `to`.
async fn connect_from(source: &str, to: SocketAddr) -> TcpStream {
    let s = TcpSocket::new_v4().unwrap();
    s.bind(format!("{source}:0").parse().unwrap()).unwrap();
    s.connect(to).await.unwrap()
}

/// True when the server sends its 18-byte greeting (false: closed first).
async fn greeted(s: &mut TcpStream) -> bool {
    let mut g = [0u8; 18];
    matches!(
        tokio::time::timeout(Duration::from_secs(5), s.read_exact(&mut g)).await,
        Ok(Ok(_))
    )
}

#[tokio::test]
async fn clients_outside_the_allowed_ranges_are_closed_at_accept() {
    let addr = serve(&["127.0.0.2", "10.0.0.0/24"], NbdLimits::default()).await;
    let mut from_1 = connect_from("127.0.0.1", addr).await;
    assert!(!greeted(&mut from_1).await, "127.0.0.1 is not allowed");
    let mut from_2 = connect_from("127.0.0.2", addr).await;
    assert!(greeted(&mut from_2).await, "127.0.0.2 is allowed");
    assert!(nbd::NbdClient::connect(addr, "lun0").await.is_err());
    let lo = serve(&["127.0.0.0/8"], NbdLimits::default()).await;
    assert!(nbd::NbdClient::connect(lo, "lun0").await.is_ok());
    assert!(IpRange::loopback()
        .iter()
        .any(|r| r.contains("127.0.0.1".parse().unwrap())));
}

#[tokio::test]
async fn connections_are_bounded_per_source_and_in_total() {
    let limits = NbdLimits {
        connections_per_source_max: 2,
        connections_max: 3,
        ..NbdLimits::default()
    };
    let addr = serve(&["127.0.0.0/8"], limits).await;
    let mut held = Vec::new();
    for _ in 0..2 {
        let mut s = connect_from("127.0.0.3", addr).await;
        assert!(greeted(&mut s).await);
        held.push(s);
    }
    let mut third = connect_from("127.0.0.3", addr).await;
    assert!(
        !greeted(&mut third).await,
        "a third from one source is closed"
    );
    let mut other = connect_from("127.0.0.4", addr).await;
    assert!(greeted(&mut other).await, "another source still gets in");
    let mut over = connect_from("127.0.0.5", addr).await;
    assert!(!greeted(&mut over).await, "the total bound holds");
    drop(held);
    // the server sees the two ends when it reads them: retry until it has
    let back = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            let mut again = connect_from("127.0.0.3", addr).await;
            if greeted(&mut again).await {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert!(back.is_ok(), "slots come back when connections end");
}

#[tokio::test]
async fn a_silent_client_is_closed_after_the_handshake_timeout() {
    let limits = NbdLimits {
        handshake_timeout_ms: 300,
        ..NbdLimits::default()
    };
    let addr = serve(&["127.0.0.1"], limits).await;
    let mut s = connect_from("127.0.0.1", addr).await;
    assert!(greeted(&mut s).await);
    let t0 = Instant::now();
    let mut rest = Vec::new();
    let n = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut rest))
        .await
        .expect("closed within 5 s")
        .unwrap_or(0);
    assert_eq!(n, 0);
    assert!(t0.elapsed() >= Duration::from_millis(250));
}
