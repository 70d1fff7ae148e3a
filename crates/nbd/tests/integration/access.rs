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

/// Whether a connection from `source` that goes through a whole handshake
/// (`NBD_OPT_EXPORT_NAME`) is served: a READ sent after it is answered.
/// Returns the connection, to hold it open.
async fn served_from(source: &str, to: SocketAddr) -> (bool, TcpStream) {
    use tokio::io::AsyncWriteExt;
    let mut s = connect_from(source, to).await;
    if !greeted(&mut s).await {
        return (false, s);
    }
    // client flags: fixed newstyle, no zeroes; then the export by name
    let mut hs = vec![0, 0, 0, 3];
    hs.extend_from_slice(&0x4948_4156_454F_5054u64.to_be_bytes());
    hs.extend_from_slice(&1u32.to_be_bytes());
    hs.extend_from_slice(&4u32.to_be_bytes());
    hs.extend_from_slice(b"lun0");
    // a READ of 512 bytes at 0
    hs.extend_from_slice(&0x2560_9513u32.to_be_bytes());
    hs.extend_from_slice(&[0, 0, 0, 0]);
    hs.extend_from_slice(&7u64.to_be_bytes());
    hs.extend_from_slice(&0u64.to_be_bytes());
    hs.extend_from_slice(&512u32.to_be_bytes());
    if s.write_all(&hs).await.is_err() {
        return (false, s);
    }
    // the export's size and flags, then the reply and its data
    let mut answer = [0u8; 10 + 16 + 512];
    let ok = matches!(
        tokio::time::timeout(Duration::from_secs(5), s.read_exact(&mut answer)).await,
        Ok(Ok(_))
    ) && answer[10..14] == 0x6744_6698u32.to_be_bytes();
    (ok, s)
}

/// The type of the last reply to an `NBD_OPT_GO` for "lun0" from `source`
/// (0 when the connection closed first).
async fn go_reply_from(source: &str, to: SocketAddr) -> u32 {
    use tokio::io::AsyncWriteExt;
    let mut s = connect_from(source, to).await;
    if !greeted(&mut s).await {
        return 0;
    }
    let mut hs = vec![0, 0, 0, 3];
    hs.extend_from_slice(&0x4948_4156_454F_5054u64.to_be_bytes());
    hs.extend_from_slice(&7u32.to_be_bytes());
    hs.extend_from_slice(&10u32.to_be_bytes());
    hs.extend_from_slice(&4u32.to_be_bytes());
    hs.extend_from_slice(b"lun0");
    hs.extend_from_slice(&0u16.to_be_bytes());
    if s.write_all(&hs).await.is_err() {
        return 0;
    }
    // replies until the last one (an ACK or an error)
    loop {
        let mut h = [0u8; 20];
        let got = tokio::time::timeout(Duration::from_secs(5), s.read_exact(&mut h)).await;
        if !matches!(got, Ok(Ok(_))) {
            return 0;
        }
        let kind = u32::from_be_bytes(h[12..16].try_into().unwrap());
        let len = u32::from_be_bytes(h[16..20].try_into().unwrap()) as usize;
        let mut data = vec![0u8; len];
        if s.read_exact(&mut data).await.is_err() {
            return 0;
        }
        if kind != 3 {
            // not NBD_REP_INFO
            return kind;
        }
    }
}

/// True when the server has closed `s` (it reads the end of the stream).
async fn closed(s: &mut TcpStream) -> bool {
    let mut b = [0u8; 64];
    loop {
        match tokio::time::timeout(Duration::from_secs(5), s.read(&mut b)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            Ok(Ok(_)) => continue,
            Err(_) => return false,
        }
    }
}

#[tokio::test]
async fn served_connections_are_bounded_per_source_and_in_total() {
    let limits = NbdLimits {
        connections_per_source_max: 2,
        connections_max: 3,
        ..NbdLimits::default()
    };
    let addr = serve(&["127.0.0.0/8"], limits).await;
    let mut held = Vec::new();
    for _ in 0..2 {
        let (ok, s) = served_from("127.0.0.3", addr).await;
        assert!(ok);
        held.push(s);
    }
    let (third, _s) = served_from("127.0.0.3", addr).await;
    assert!(!third, "a third from one source is closed");
    // one that chooses its export with NBD_OPT_GO is told why
    assert_eq!(
        go_reply_from("127.0.0.3", addr).await,
        0x8000_0002,
        "NBD_REP_ERR_POLICY"
    );
    let (other, _o) = served_from("127.0.0.4", addr).await;
    assert!(other, "another source still gets in");
    let (over, _v) = served_from("127.0.0.5", addr).await;
    assert!(!over, "the total bound holds");
    drop(held);
    // the server sees the two ends when it reads them: retry until it has
    let back = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            if served_from("127.0.0.3", addr).await.0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert!(back.is_ok(), "slots come back when connections end");
    // (a GO served: the one answer that is not an error)
    assert_eq!(go_reply_from("127.0.0.6", addr).await, 1, "NBD_REP_ACK");
}

/// Clients that connect and stay silent take the places of handshakes in
/// progress, never of connections served, and a newer connection takes the
/// place of one of theirs: an attacker holding every handshake place from a
/// few addresses keeps no one out. Before (review of 2026-12-06) the
/// connection bounds were first come, first served, and idle sockets held
/// open up to the total kept every other client out for the handshake
/// timeout, again and again.
#[tokio::test]
async fn silent_connections_give_their_places_to_newer_ones() {
    let limits = NbdLimits {
        handshakes_per_source_max: 2,
        handshakes_max: 4,
        ..NbdLimits::default()
    };
    let addr = serve(&["127.0.0.0/8"], limits).await;
    // a served connection first: never taken back
    let (ok, mut client) = served_from("127.0.0.2", addr).await;
    assert!(ok);
    // one source past its share: its oldest silent connection goes
    let mut first = connect_from("127.0.0.3", addr).await;
    assert!(greeted(&mut first).await);
    let mut second = connect_from("127.0.0.3", addr).await;
    assert!(greeted(&mut second).await);
    let mut third = connect_from("127.0.0.3", addr).await;
    assert!(greeted(&mut third).await, "a newer connection gets in");
    assert!(
        closed(&mut first).await,
        "the oldest of the source is closed"
    );
    // silent connections from more addresses fill every place, again and again
    let mut flood = Vec::new();
    for round in 0..3 {
        for a in 4..8 {
            let mut s = connect_from(&format!("127.0.0.{a}"), addr).await;
            assert!(greeted(&mut s).await, "round {round}, 127.0.0.{a}");
            flood.push(s);
        }
    }
    // a new client still gets in and is served, and so is the first one
    let (ok, _new) = served_from("127.0.0.9", addr).await;
    assert!(
        ok,
        "a client is served while silent connections fill the places"
    );
    use tokio::io::AsyncWriteExt;
    let mut read = Vec::new();
    read.extend_from_slice(&0x2560_9513u32.to_be_bytes());
    read.extend_from_slice(&[0, 0, 0, 0]);
    read.extend_from_slice(&8u64.to_be_bytes());
    read.extend_from_slice(&0u64.to_be_bytes());
    read.extend_from_slice(&512u32.to_be_bytes());
    client.write_all(&read).await.unwrap();
    let mut reply = [0u8; 16 + 512];
    tokio::time::timeout(Duration::from_secs(5), client.read_exact(&mut reply))
        .await
        .expect("the served connection answers")
        .expect("the served connection is open");
    assert_eq!(reply[..4], 0x6744_6698u32.to_be_bytes());
}

/// Whether one 20-byte option reply arrives on `s`.
async fn one_ack(s: &mut TcpStream) -> bool {
    let mut r = [0u8; 20];
    tokio::time::timeout(Duration::from_secs(5), s.read_exact(&mut r))
        .await
        .is_ok_and(|r| r.is_ok())
}

/// A connection haggling (an option sent and answered) keeps its place when
/// a newer one needs a place of its source: the silent one gives its place
/// first, though it is newer. Before (2026-12-06), the oldest went, busy or
/// not, so a flood of silent connections cut handshakes in the middle.
#[tokio::test]
async fn a_haggling_connection_keeps_its_place_over_a_silent_one() {
    use tokio::io::AsyncWriteExt;
    let limits = NbdLimits {
        handshakes_per_source_max: 2,
        handshakes_max: 4,
        ..NbdLimits::default()
    };
    let addr = serve(&["127.0.0.0/8"], limits).await;
    // NBD_OPT_STRUCTURED_REPLY: answered with one 20-byte NBD_REP_ACK
    let option = |first: bool| {
        let mut o = if first { vec![0, 0, 0, 3] } else { Vec::new() };
        o.extend_from_slice(&0x4948_4156_454F_5054u64.to_be_bytes());
        o.extend_from_slice(&8u32.to_be_bytes());
        o.extend_from_slice(&0u32.to_be_bytes());
        o
    };
    let mut busy = connect_from("127.0.0.3", addr).await;
    assert!(greeted(&mut busy).await);
    busy.write_all(&option(true)).await.unwrap();
    assert!(one_ack(&mut busy).await);
    let mut silent = connect_from("127.0.0.3", addr).await;
    assert!(greeted(&mut silent).await);
    let mut newer = connect_from("127.0.0.3", addr).await;
    assert!(greeted(&mut newer).await, "a newer connection gets in");
    assert!(closed(&mut silent).await, "the silent one gave its place");
    busy.write_all(&option(false)).await.unwrap();
    assert!(one_ack(&mut busy).await, "the haggling one was closed");
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
