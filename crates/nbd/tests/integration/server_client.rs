//! NbdServer over memory volumes, driven by NbdClient and by raw protocol bytes.

use crate::common;

use block::{Bytes, DelayVolume, MemVolume, Volume};
use common::{pattern, start, start_volumes, Raw};
use nbd::proto::{cmdflag, encode_request, errno, tflag, Command, Request};
use nbd::{NbdClient, NbdLimits};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const MIB: u64 = 1 << 20;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_roundtrip_matches_an_oracle() {
    let srv = start(&[(4096, 4096, false)], NbdLimits::default()).await;
    let c = NbdClient::connect(srv.addr, "lun0").await.unwrap();
    let g = c.geometry();
    assert_eq!(g.block_size_bytes, 4096, "preferred block size used");
    assert_eq!(g.block_count, 4096);
    assert_eq!(c.export_size_bytes(), 16 * MIB);
    let f = c.transmission_flags();
    for want in [
        tflag::HAS_FLAGS,
        tflag::SEND_FLUSH,
        tflag::SEND_FUA,
        tflag::SEND_TRIM,
        tflag::SEND_WRITE_ZEROES,
        tflag::CAN_MULTI_CONN,
    ] {
        assert_ne!(f & want, 0, "flag {want:#x} advertised");
    }
    assert_eq!(f & tflag::READ_ONLY, 0);

    let oracle = MemVolume::new(4096, 4096);
    let mut seed = 1u64;
    for round in 0..200u64 {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let lba = (seed >> 20) % 4000;
        let blocks = 1 + (seed >> 40) % 64;
        let blocks = blocks.min(4096 - lba);
        match round % 5 {
            0 | 1 => {
                let d = Bytes::from(pattern(seed, (blocks * 4096) as usize));
                c.write(lba, d.clone(), round % 2 == 0).await.unwrap();
                oracle.write(lba, d, false).await.unwrap();
            }
            2 => {
                c.write_zeroes(lba, blocks, round % 3 == 0).await.unwrap();
                oracle.write_zeroes(lba, blocks, false).await.unwrap();
            }
            3 => {
                // MemVolume discards read back as zeroes; so does the oracle.
                c.discard(lba, blocks).await.unwrap();
                oracle.discard(lba, blocks).await.unwrap();
            }
            _ => c.flush().await.unwrap(),
        }
        let got = c.read(lba, blocks as u32).await.unwrap();
        let want = oracle.read(lba, blocks as u32).await.unwrap();
        assert_eq!(got, want, "round {round}");
    }
    // Whole-volume comparison, also against the server's own volume.
    let all = c.read(0, 4096).await.unwrap();
    assert_eq!(all, oracle.read(0, 4096).await.unwrap());
    assert_eq!(all, srv.volumes[0].read(0, 4096).await.unwrap());
    // Out of range is refused locally with the block error.
    assert!(c.read(4096, 1).await.is_err());
    c.disconnect().await.unwrap();
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_requests_in_flight_on_one_connection() {
    let srv = start(&[(512, 65536, false)], NbdLimits::default()).await;
    let c = Arc::new(NbdClient::connect(srv.addr, "").await.unwrap());
    assert_eq!(c.geometry().block_size_bytes, 512);
    let mut tasks = Vec::new();
    for i in 0..512u64 {
        let c = c.clone();
        tasks.push(tokio::spawn(async move {
            let d = Bytes::from(pattern(i, 8 * 512));
            c.write(i * 8, d.clone(), false).await.unwrap();
            let back = c.read(i * 8, 8).await.unwrap();
            assert_eq!(back, d);
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    c.flush().await.unwrap();
    for i in (0..512u64).step_by(37) {
        let v = srv.volumes[0].read(i * 8, 8).await.unwrap();
        assert_eq!(&v[..], &pattern(i, 8 * 512)[..]);
    }
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_requests_split_by_the_client() {
    let srv = start(&[(4096, 16384, false)], NbdLimits::default()).await;
    let c = NbdClient::connect(srv.addr, "lun0").await.unwrap();
    assert_eq!(c.block_sizes().unwrap().max_bytes, 32 << 20);
    // 48 MiB: two requests for the client, several volume I/Os for the server.
    let d = Bytes::from(pattern(9, 48 << 20));
    c.write(100, d.clone(), true).await.unwrap();
    assert_eq!(c.read(100, (48 << 20) / 4096).await.unwrap(), d);
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unaligned_byte_ranges_are_served_exactly() {
    let srv = start(&[(4096, 256, false)], NbdLimits::default()).await;
    let mut r = Raw::connect(srv.addr, "lun0").await;
    assert_eq!(r.size_bytes, MIB);
    let mut oracle = vec![0u8; MIB as usize];
    let mut seed = 5u64;
    for i in 0..300u64 {
        seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
        let off = (seed >> 16) % (MIB - 20000);
        let len = 1 + ((seed >> 48) % 12000) as usize;
        match i % 3 {
            0 => {
                let d = pattern(i, len);
                assert_eq!(r.write(off, &d).await, 0);
                oracle[off as usize..off as usize + len].copy_from_slice(&d);
            }
            1 => {
                r.send(
                    Command::WriteZeroes,
                    cmdflag::NO_HOLE,
                    3,
                    off,
                    len as u32,
                    &[],
                )
                .await;
                assert_eq!(r.reply().await.unwrap().error, 0);
                oracle[off as usize..off as usize + len].fill(0);
            }
            _ => {
                let got = r.read(off, len as u32).await.unwrap();
                assert_eq!(got, &oracle[off as usize..off as usize + len]);
            }
        }
    }
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_read_modify_writes_lose_nothing() {
    // Latency between the read and the write of each read-modify-write makes a
    // missing lock visible: two connections write neighbouring bytes of the same
    // blocks at once (through two export names of one volume, as freesan exports
    // `lun0` and `iqn.../lun0`), and an aligned write races them on other blocks.
    let mem = Arc::new(MemVolume::new(4096, 256));
    let slow: block::VolumeRef = Arc::new(DelayVolume::new(
        mem.clone(),
        Duration::from_millis(2),
        Duration::from_millis(2),
    ));
    let srv = start_volumes(
        vec![(slow.clone(), false), (slow, false)],
        NbdLimits::default(),
    )
    .await;
    let mut a = Raw::connect(srv.addr, "lun0").await;
    let mut b = Raw::connect(srv.addr, "lun1").await;
    for k in 0..64u64 {
        let base = 8192 + k * 10;
        a.send(Command::Write, 0, k, base, 5, &[0xAA; 5]).await;
        b.send(Command::Write, 0, k, base + 5, 5, &[0xBB; 5]).await;
    }
    for _ in 0..64 {
        assert_eq!(a.reply().await.unwrap().error, 0);
        assert_eq!(b.reply().await.unwrap().error, 0);
    }
    let got = mem.read(2, 1).await.unwrap();
    for k in 0..64usize {
        assert_eq!(&got[k * 10..k * 10 + 5], &[0xAA; 5], "piece {k} of a");
        assert_eq!(&got[k * 10 + 5..k * 10 + 10], &[0xBB; 5], "piece {k} of b");
    }
    // An unaligned write and an aligned write of the block it patches, at once.
    a.send(Command::Write, 0, 1, 4096 * 5 + 100, 10, &[0x11; 10])
        .await;
    b.send(Command::Write, 0, 2, 4096 * 5, 4096, &[0x22; 4096])
        .await;
    assert_eq!(a.reply().await.unwrap().error, 0);
    assert_eq!(b.reply().await.unwrap().error, 0);
    let blk = mem.read(5, 1).await.unwrap();
    // Either order is fine; a torn mix of both is not.
    let a_last = blk[..100].iter().all(|x| *x == 0x22)
        && blk[100..110].iter().all(|x| *x == 0x11)
        && blk[110..].iter().all(|x| *x == 0x22);
    let b_last = blk.iter().all(|x| *x == 0x22);
    assert!(a_last || b_last, "lost update in block 5");
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_are_answered_and_the_connection_continues() {
    let srv = start(&[(512, 2048, false), (512, 64, true)], NbdLimits::default()).await;
    let mut r = Raw::connect(srv.addr, "").await;
    let size = r.size_bytes;
    // Beyond the end.
    assert_eq!(r.read(size - 512, 1024).await, Err(errno::EINVAL));
    assert_eq!(r.write(size, &[1; 512]).await, errno::ENOSPC);
    r.send(Command::Trim, 0, 1, size, 512, &[]).await;
    assert_eq!(r.reply().await.unwrap().error, errno::EINVAL);
    r.send(Command::Read, 0, 2, u64::MAX - 10, 512, &[]).await;
    assert_eq!(r.reply().await.unwrap().error, errno::EINVAL);
    // Unknown command, unsupported commands and flags.
    r.send(Command::Unknown(77), 0, 3, 0, 0, &[]).await;
    assert_eq!(r.reply().await.unwrap().error, errno::EINVAL);
    r.send(Command::BlockStatus, 0, 4, 0, 512, &[]).await;
    assert_eq!(r.reply().await.unwrap().error, errno::EINVAL);
    r.send(Command::Read, cmdflag::DF, 5, 0, 512, &[]).await;
    assert_eq!(r.reply().await.unwrap().error, errno::EINVAL);
    // A write with a bad flag still has its payload consumed.
    r.send(Command::Write, 0x8000, 6, 0, 512, &[9; 512]).await;
    assert_eq!(r.reply().await.unwrap().error, errno::EINVAL);
    // Read longer than the maximum payload: EINVAL (EOVERFLOW is for DF reads, not offered), no data, connection stays.
    r.send(Command::Read, 0, 7, 0, 64 << 20, &[]).await;
    let rep = r.reply().await.unwrap();
    assert_eq!((rep.cookie, rep.error), (7, errno::EINVAL));
    // Zero-length requests are fine.
    assert_eq!(r.read(0, 0).await, Ok(vec![]));
    // Still working.
    assert_eq!(r.write(512, &[3; 700]).await, 0);
    assert_eq!(r.read(512, 700).await.unwrap(), vec![3; 700]);
    // Read-only export.
    let mut ro = Raw::connect(srv.addr, "lun1").await;
    assert_ne!(ro.flags & tflag::READ_ONLY, 0);
    assert_eq!(ro.flags & tflag::SEND_TRIM, 0);
    assert_eq!(ro.write(0, &[1; 512]).await, errno::EPERM);
    ro.send(Command::WriteZeroes, 0, 1, 0, 512, &[]).await;
    assert_eq!(ro.reply().await.unwrap().error, errno::EPERM);
    assert_eq!(ro.read(0, 512).await.unwrap(), vec![0; 512]);
    let c = NbdClient::connect(srv.addr, "lun1").await.unwrap();
    assert!(matches!(
        c.write(0, Bytes::from(vec![0u8; 512]), false).await,
        Err(block::BlockError::ReadOnly)
    ));
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_input_closes_only_that_connection() {
    let srv = start(&[(512, 2048, false)], NbdLimits::default()).await;
    let mut good = Raw::connect(srv.addr, "lun0").await;
    assert_eq!(good.write(0, &[1; 512]).await, 0);

    // Bad request magic: closed.
    let mut bad = Raw::connect(srv.addr, "lun0").await;
    bad.sock.write_all(&[0x55; 28]).await.unwrap();
    assert!(bad.closed().await, "bad magic closes");

    // Write longer than the maximum payload: EINVAL, then closed.
    let mut huge = Raw::connect(srv.addr, "lun0").await;
    huge.send(Command::Write, 0, 1, 0, u32::MAX, &[0; 4096])
        .await;
    let rep = huge.reply().await.unwrap();
    assert_eq!(rep.error, errno::EINVAL);
    assert!(huge.closed().await);

    // Garbage instead of client flags / options.
    let mut s = tokio::net::TcpStream::connect(srv.addr).await.unwrap();
    s.write_all(&[0xff; 64]).await.unwrap();
    let mut junk = Raw {
        sock: s,
        size_bytes: 0,
        flags: 0,
    };
    assert!(junk.closed().await, "unknown client flags close");

    // Unknown export via EXPORT_NAME: closed; via GO (client): NotFound.
    let e = NbdClient::connect(srv.addr, "nope").await.unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::NotFound, "{e}");

    // Client disappears mid-write payload.
    let mut cut = Raw::connect(srv.addr, "lun0").await;
    cut.send(Command::Write, 0, 1, 0, 4096, &[0; 100]).await;
    drop(cut);

    // The first connection is untouched.
    assert_eq!(good.read(0, 512).await.unwrap(), vec![1; 512]);
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disconnect_answers_in_flight_requests_first() {
    let srv = start(&[(512, 2048, false)], NbdLimits::default()).await;
    let mut r = Raw::connect(srv.addr, "lun0").await;
    for k in 0..32u64 {
        r.send(
            Command::Write,
            cmdflag::FUA,
            k,
            k * 4096,
            4096,
            &pattern(k, 4096),
        )
        .await;
    }
    r.send(Command::Flush, 0, 100, 0, 0, &[]).await;
    r.send(Command::Disc, 0, 101, 0, 0, &[]).await;
    let mut seen = Vec::new();
    while let Some(rep) = r.reply().await {
        assert_eq!(rep.error, 0);
        seen.push(rep.cookie);
    }
    seen.sort_unstable();
    let mut want: Vec<u64> = (0..32).collect();
    want.push(100);
    assert_eq!(seen, want, "every request answered, DISC not");
    for k in 0..32u64 {
        let v = srv.volumes[0].read(k * 8, 8).await.unwrap();
        assert_eq!(&v[..], &pattern(k, 4096)[..]);
    }
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_flight_bound_applies_backpressure() {
    let limits = NbdLimits {
        requests_in_flight_max: 2,
        request_bytes_max: 1 << 20,
        in_flight_bytes_max: 1 << 20,
        ..NbdLimits::default()
    };
    let srv = start(&[(512, 8192, false)], limits).await;
    let c = Arc::new(NbdClient::connect(srv.addr, "lun0").await.unwrap());
    assert_eq!(c.block_sizes().unwrap().max_bytes, 1 << 20);
    let mut tasks = Vec::new();
    for i in 0..64u64 {
        let c = c.clone();
        tasks.push(tokio::spawn(async move {
            let d = Bytes::from(pattern(i, 64 * 1024));
            c.write(i * 128, d.clone(), false).await.unwrap();
            assert_eq!(c.read(i * 128, 128).await.unwrap(), d);
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_closes_clients_and_returns() {
    let srv = start(&[(512, 2048, false)], NbdLimits::default()).await;
    let c = NbdClient::connect(srv.addr, "lun0").await.unwrap();
    c.write(0, Bytes::from(vec![4u8; 512]), false)
        .await
        .unwrap();
    let mut idle = Raw::connect(srv.addr, "lun0").await;
    srv.stop().await;
    assert!(idle.closed().await);
    assert!(c.read(0, 1).await.is_err(), "connection is gone");
}

#[tokio::test]
async fn bad_configs_are_refused() {
    let v: block::VolumeRef = Arc::new(MemVolume::new(512, 8));
    let export = |n: &str| nbd::NbdExport {
        name: n.into(),
        description: String::new(),
        volume: v.clone(),
        read_only: false,
        access: None,
    };
    let cfg = |exports, default_export: Option<&str>| nbd::NbdConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        exports,
        default_export: default_export.map(String::from),
        limits: NbdLimits::default(),
        allowed_clients: nbd::server::IpRange::loopback(),
        tls: None,
    };
    assert!(
        nbd::NbdServer::bind(cfg(vec![export("a"), export("a")], None))
            .await
            .is_err()
    );
    assert!(nbd::NbdServer::bind(cfg(vec![export("a")], Some("b")))
        .await
        .is_err());
    assert!(nbd::NbdServer::bind(cfg(vec![export("a")], Some("a")))
        .await
        .is_ok());
    // a payload limit that leaves a reply chunk's length no room
    let mut huge = cfg(vec![export("a")], None);
    huge.limits.request_bytes_max = u32::MAX;
    huge.limits.in_flight_bytes_max = usize::MAX;
    assert!(nbd::NbdServer::bind(huge).await.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_export_counts_what_its_clients_did() {
    let srv = start(
        &[(4096, 256, false), (4096, 256, true)],
        NbdLimits::default(),
    )
    .await;
    let rw = NbdClient::connect(srv.addr, "lun0").await.unwrap();
    for lba in 0..3 {
        rw.write(lba * 2, Bytes::from(pattern(lba, 8192)), false)
            .await
            .unwrap();
    }
    for lba in 0..5 {
        rw.read(lba, 1).await.unwrap();
    }
    rw.flush().await.unwrap();
    rw.discard(10, 2).await.unwrap();
    // a write to the read-only export (sent raw: the client would refuse it
    // itself) is refused: an error, not a write
    let mut ro = Raw::connect(srv.addr, "lun1").await;
    assert_eq!(ro.write(0, &[1u8; 4096]).await, errno::EPERM);
    assert_eq!(ro.read(0, 8192).await.map(|d| d.len()), Ok(8192));
    let stats: std::collections::HashMap<_, _> = srv.exports.stats().into_iter().collect();
    let s0 = stats["lun0"];
    assert_eq!((s0.writes, s0.write_bytes), (3, 3 * 8192), "{s0:?}");
    assert_eq!((s0.reads, s0.read_bytes), (5, 5 * 4096), "{s0:?}");
    assert_eq!((s0.others, s0.errors), (2, 0), "{s0:?}");
    let s1 = stats["lun1"];
    assert_eq!((s1.writes, s1.errors), (0, 1), "{s1:?}");
    assert_eq!((s1.reads, s1.read_bytes), (1, 8192), "{s1:?}");
    rw.disconnect().await.unwrap();
    drop(ro);
    srv.stop().await;
}

/// Large write payloads back to back with small requests, all sent before any
/// reply is read: the reader takes the header after each large payload in the
/// payload's own read when it is there (read-ahead), and whichever way the
/// stream is cut every request is answered once and every byte lands where it
/// was sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_large_writes_and_small_requests_keep_their_bytes() {
    let srv = start(&[(512, 16384, false)], NbdLimits::default()).await;
    let mut raw = Raw::connect(srv.addr, "lun0").await;
    let big = 192 << 10;
    let mut stream = Vec::new();
    let mut expect = Vec::new();
    for i in 0..24u64 {
        let off = i * big as u64;
        let d = pattern(i, big);
        stream.extend_from_slice(&encode_request(&Request {
            flags: if i % 5 == 0 { cmdflag::FUA } else { 0 },
            command: Command::Write,
            cookie: 1000 + i,
            offset_bytes: off,
            length_bytes: big as u32,
        }));
        stream.extend_from_slice(&d);
        expect.push((off, d));
        // a small unaligned write right behind it (elsewhere: overlapping
        // requests in flight have no order)
        let small = pattern(100 + i, 300);
        let small_off = 24 * big as u64 + i * 1000 + 7;
        stream.extend_from_slice(&encode_request(&Request {
            flags: 0,
            command: Command::Write,
            cookie: 2000 + i,
            offset_bytes: small_off,
            length_bytes: small.len() as u32,
        }));
        stream.extend_from_slice(&small);
        expect.push((small_off, small));
    }
    stream.extend_from_slice(&encode_request(&Request {
        flags: 0,
        command: Command::Flush,
        cookie: 3000,
        offset_bytes: 0,
        length_bytes: 0,
    }));
    // Odd-sized pieces, so that payload ends and headers fall anywhere in a read.
    for piece in stream.chunks(65_521) {
        raw.sock.write_all(piece).await.unwrap();
    }
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..49 {
        let r = raw.reply().await.expect("closed");
        assert_eq!(r.error, 0, "cookie {}", r.cookie);
        assert!(seen.insert(r.cookie), "cookie {} answered twice", r.cookie);
    }
    assert!(seen.contains(&3000));
    for (off, d) in expect {
        assert_eq!(raw.read(off, d.len() as u32).await.unwrap(), d, "at {off}");
    }
    srv.stop().await;
}

/// A WRITE's payload holds the node's buffer budget while it is read: a client
/// that stops sending it mid-way is closed after the stall time, not kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_whose_payload_stops_coming_closes_its_connection() {
    let limits = NbdLimits {
        payload_stall_ms: 300,
        ..NbdLimits::default()
    };
    let srv = start(&[(512, 8192, false)], limits).await;
    for len in [4096u32, 1 << 20] {
        let mut raw = Raw::connect(srv.addr, "lun0").await;
        raw.send(Command::Write, 0, 9, 0, len, &[5u8; 100]).await;
        assert!(
            raw.closed().await,
            "a {len}-byte write stalled and stayed open"
        );
    }
    // the others are served
    let c = NbdClient::connect(srv.addr, "lun0").await.unwrap();
    c.write(0, Bytes::from(vec![1u8; 512]), false)
        .await
        .unwrap();
    assert_eq!(c.read(0, 1).await.unwrap()[0], 1);
    srv.stop().await;
}

/// A connection whose requests outlive the drain time is closed, but it keeps
/// counting against the connection bounds until the volume has finished them:
/// reconnecting cannot pile requests up on a slow volume.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_connection_counts_until_its_requests_finish() {
    let held = Arc::new(block::HoldVolume::new(Arc::new(MemVolume::new(512, 8192))));
    held.reads.hold();
    let limits = NbdLimits {
        connections_per_source_max: 1,
        drain_timeout_ms: 200,
        ..NbdLimits::default()
    };
    let srv = start_volumes(vec![(held.clone(), false)], limits).await;
    let mut first = Raw::connect(srv.addr, "lun0").await;
    first.send(Command::Read, 0, 3, 0, 4096, &[]).await;
    held.reads.arrivals(1).await;
    first.sock.shutdown().await.unwrap();
    // the server gives up on the drain and closes the connection
    assert!(first.closed().await);
    // ... and still counts it: another from this address is refused the
    // export it names (closed: NBD_OPT_EXPORT_NAME has no error reply)
    assert!(
        Raw::try_connect(srv.addr, "lun0").await.is_none(),
        "a second connection was served"
    );
    // once the read is done, the address may connect again
    held.reads.open();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        // served: a READ is answered (the volume reads again)
        let Some(mut s) = Raw::try_connect(srv.addr, "lun0").await else {
            assert!(tokio::time::Instant::now() < deadline, "never served again");
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        let mut read = Vec::new();
        read.extend_from_slice(&0x2560_9513u32.to_be_bytes());
        read.extend_from_slice(&[0, 0, 0, 0]);
        read.extend_from_slice(&9u64.to_be_bytes());
        read.extend_from_slice(&0u64.to_be_bytes());
        read.extend_from_slice(&512u32.to_be_bytes());
        let _ = s.sock.write_all(&read).await;
        let mut b = [0u8; 16];
        let answered = tokio::time::timeout(Duration::from_secs(10), s.sock.read_exact(&mut b))
            .await
            .is_ok_and(|r| r.is_ok());
        if answered {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "never served again");
        tokio::task::yield_now().await;
    }
    srv.stop().await;
}

/// A write still running when the server stops (its connection let go at
/// the drain time) is finished before the server's final flush, which then
/// makes it durable; before (review of 2026-12-06) the flush went first and
/// the write landed after it, on a volume its owner was stopping.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_final_flush_waits_for_writes_still_running() {
    let sim = Arc::new(block::CrashSimVolume::new(512, 8192));
    let held = Arc::new(block::HoldVolume::new(sim.clone()));
    held.writes.hold();
    held.flushes.hold();
    let limits = NbdLimits {
        drain_timeout_ms: 200,
        ..NbdLimits::default()
    };
    let mut srv = start_volumes(vec![(held.clone(), false)], limits).await;
    let mut raw = Raw::connect(srv.addr, "lun0").await;
    raw.send(Command::Write, 0, 1, 5 * 512, 512, &[7u8; 512])
        .await;
    held.writes.arrivals(1).await;
    srv.begin_stop();
    // the connection is let go at the drain time, its write still held
    assert!(raw.closed().await);
    // no flush while the write runs, past the 5 s the server gives its
    // connections' tasks before aborting them (the gate counts arrivals,
    // held or not)
    let early = tokio::time::timeout(Duration::from_secs(7), held.flushes.arrivals(1)).await;
    assert!(early.is_err(), "the final flush went out before the write");
    held.writes.open();
    held.writes.endings(1).await;
    held.flushes.open();
    srv.stop().await;
    sim.crash();
    assert_eq!(
        sim.read(5, 1).await.unwrap(),
        Bytes::from(vec![7u8; 512]),
        "the write that ran past the drain is not durable after the shutdown"
    );
}

/// What FLUSH and FUA promise reaches the volume's stable storage before the
/// reply: a write then FLUSH, a FUA write (whole blocks, and one inside a
/// block: read-modify-write), WRITE_ZEROES and TRIM with FUA; checked by
/// dropping everything the volume had not made durable (a power cut).
/// Before (review of 2026-12-06) nothing checked durability: the memory
/// volume's flush does nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flush_and_fua_are_durable_when_answered() {
    let sim = Arc::new(block::CrashSimVolume::new(512, 8192));
    let srv = start_volumes(
        vec![(sim.clone() as block::VolumeRef, false)],
        NbdLimits::default(),
    )
    .await;
    let c = NbdClient::connect(srv.addr, "lun0").await.unwrap();
    let block = |b: u8| Bytes::from(vec![b; 4096]);
    let mut raw = Raw::connect(srv.addr, "lun0").await;
    // durable data under the zeroing and the trim
    c.write(200, block(3), false).await.unwrap();
    c.write(300, block(4), false).await.unwrap();
    c.flush().await.unwrap();
    raw.send(
        Command::WriteZeroes,
        cmdflag::FUA | cmdflag::NO_HOLE,
        2,
        200 * 512,
        4096,
        &[],
    )
    .await;
    assert_eq!(raw.reply().await.unwrap().error, 0);
    raw.send(Command::Trim, cmdflag::FUA, 3, 300 * 512, 4096, &[])
        .await;
    assert_eq!(raw.reply().await.unwrap().error, 0);
    // a write, then FLUSH (after the FUA commands above, which flush the
    // whole volume)
    c.write(0, block(1), false).await.unwrap();
    c.flush().await.unwrap();
    // FUA writes, whole blocks and inside a block (read-modify-write), last
    c.write(64, block(2), true).await.unwrap();
    raw.send(
        Command::Write,
        cmdflag::FUA,
        1,
        100 * 512 + 100,
        300,
        &[5u8; 300],
    )
    .await;
    assert_eq!(raw.reply().await.unwrap().error, 0);
    // a write that asked for nothing: it may be lost, and is not looked at
    c.write(400, block(6), false).await.unwrap();
    sim.crash();
    assert_eq!(
        sim.read(0, 8).await.unwrap(),
        block(1),
        "written, then FLUSH"
    );
    assert_eq!(sim.read(64, 8).await.unwrap(), block(2), "FUA");
    let b100 = sim.read(100, 1).await.unwrap();
    assert_eq!(&b100[100..400], &[5u8; 300][..], "FUA inside a block");
    assert_eq!(
        sim.read(200, 8).await.unwrap(),
        block(0),
        "WRITE_ZEROES with FUA"
    );
    assert_eq!(sim.read(300, 8).await.unwrap(), block(0), "TRIM with FUA");
    srv.stop().await;
}
