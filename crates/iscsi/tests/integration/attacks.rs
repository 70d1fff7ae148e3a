//! Attacks on the login surface, each against the real target over TCP: floods of
//! idle sockets and discovery sessions from another address while a multipath
//! initiator logs in and does verified I/O; repeated wrong CHAP secrets; another
//! initiator trying to reinstate a session it does not own.

use crate::common;

use block::{Bytes, MemVolume, Volume};
use common::*;
use iscsi::Limits;
use iscsi_proto::pdu::{DataOut, InitiatorPdu, LoginRequest, NopOut};
use iscsi_proto::target::TargetPdu;
use iscsi_proto::text::encode_text;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::net::{TcpSocket, TcpStream};

/// The attacker's address: another loopback address than the initiator's.
const ATTACKER: &str = "127.0.0.5";

fn login_request(isid: [u8; 6]) -> InitiatorPdu {
    InitiatorPdu::Login(LoginRequest {
        transit: true,
        cont: false,
        csg: 1,
        nsg: 3,
        version_max: 0,
        version_min: 0,
        isid,
        tsih: 0,
        itt: 1,
        cid: 0,
        cmd_sn: 1,
        exp_stat_sn: 0,
    })
}

/// Raises the soft open-file limit towards `want` (as far as the hard limit allows).
fn raise_nofile(want: u64) {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: plain syscalls on a valid, owned struct.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) == 0 && r.rlim_cur < want {
            r.rlim_cur = want.min(r.rlim_max);
            libc::setrlimit(libc::RLIMIT_NOFILE, &r);
        }
    }
}

/// A TCP connection to `to` from the attacker's address; None if it failed.
async fn connect_from(from: &str, to: SocketAddr) -> Option<TcpStream> {
    let s = TcpSocket::new_v4().ok()?;
    s.bind(format!("{from}:0").parse().ok()?).ok()?;
    tokio::time::timeout(Duration::from_secs(2), s.connect(to))
        .await
        .ok()?
        .ok()
}

/// Logs in a discovery session from `from`; the open client when it succeeded.
async fn discovery_from(from: &str, to: SocketAddr, n: u32) -> Option<Client> {
    let sock = connect_from(from, to).await?;
    let mut c = Client::from_stream(sock, [0x80, 0, 0, 0, (n >> 8) as u8, n as u8]);
    let req = login_request(c.isid);
    let text = encode_text(&[
        ("InitiatorName", "iqn.2026-01.org.evil:flood"),
        ("SessionType", "Discovery"),
    ]);
    c.send_checked(&req, &text).await.ok()?;
    let p = tokio::time::timeout(Duration::from_secs(2), c.recv())
        .await
        .ok()??;
    match p.pdu {
        TargetPdu::LoginResponse(r) if r.status_class == 0 => Some(c),
        _ => None,
    }
}

/// 500 idle TCP connections and 300 discovery sessions from another address do
/// not keep a multipath initiator from logging in through both portals, nor
/// disturb its I/O, which is checked block by block. On the code before login
/// budgets, the idle sockets held every login slot for the whole login timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_socket_and_discovery_flood_does_not_block_a_multipath_initiator() {
    logs();
    raise_nofile(8192);
    const BLOCKS: u64 = 8192;
    let vol: block::VolumeRef = Arc::new(MemVolume::new(512, BLOCKS));
    let fx = start_with(Limits::default(), Some(vol)).await;
    let addrs = fx.addrs.clone();
    let t0 = Instant::now();

    // 500 idle sockets, alternating portals, held open by the attacker.
    let mut idle = Vec::new();
    for i in 0..500 {
        if let Some(s) = connect_from(ATTACKER, addrs[i % 2]).await {
            idle.push(s);
        }
    }
    // 300 discovery sessions, kept open.
    let mut disc = Vec::new();
    let mut disc_ok = 0;
    for i in 0..300u32 {
        if let Some(c) = discovery_from(ATTACKER, addrs[i as usize % 2], i).await {
            disc_ok += 1;
            disc.push(c);
        }
    }
    eprintln!(
        "flood: {} idle sockets, {disc_ok} discovery logins accepted, in {:?}",
        idle.len(),
        t0.elapsed()
    );
    assert!(idle.len() >= 450, "the attacker could open its sockets");

    // The attacker goes on opening idle sockets while the initiator works
    // (bounded: 400 more, at most 20 s).
    let flood_addrs = addrs.clone();
    let flood = tokio::spawn(async move {
        let end = Instant::now() + Duration::from_secs(20);
        let mut held = Vec::new();
        for i in 0..400 {
            if Instant::now() > end {
                break;
            }
            if let Some(s) = connect_from(ATTACKER, flood_addrs[i % 2]).await {
                held.push(s);
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        held.len()
    });

    let url = format!("iscsi://{}/{OPEN}/0", addrs[0]);
    let opts = initiator::OpenOptions {
        initiator_name: INI.into(),
        login_timeout_ms: 10_000,
        ..initiator::OpenOptions::default()
    };
    let mp = initiator::open_multipath(&url, &opts)
        .await
        .expect("the initiator logs in despite the flood");
    assert_eq!(mp.path_count(), 2, "a path through each portal");

    // Verified I/O on both paths for a while: write, read back, compare.
    let mut pattern = 0u8;
    let mut ios = 0u64;
    let end = Instant::now() + Duration::from_secs(3);
    while Instant::now() < end && ios < 20_000 {
        pattern = pattern.wrapping_add(1);
        let lba = (ios * 37) % (BLOCKS - 16);
        let data = Bytes::from(vec![pattern; 8 * 512]);
        mp.write(lba, data.clone(), false)
            .await
            .expect("write during the flood");
        let got = mp.read(lba, 8).await.expect("read during the flood");
        assert_eq!(got, data, "block {lba} reads back what was written");
        ios += 2;
    }
    let stats = mp.path_stats();
    eprintln!("verified I/O: {ios} commands; paths {stats:?}");
    assert_eq!(mp.path_count(), 2, "no path lost during the flood");
    let held = flood.await.unwrap();
    eprintln!("flood during I/O: {held} more sockets");
    mp.logout().await;
    drop((idle, disc));
    fx.shutdown().await;
}

/// Wrong CHAP secrets from one address: each is refused and logged with the
/// address and initiator name; after three the address is locked out (its next
/// connection is closed before login, even with the right secret) while another
/// address logs in; when the lockout ends the right secret works again. On the
/// code before the limiter every attempt got its Login Response and could guess on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_chap_secrets_are_rate_limited_per_source_and_logged() {
    let logs = logs();
    let limits = Limits {
        auth_failures_per_source_max: 3,
        auth_lockout_ms: 1_500,
        ..Limits::default()
    };
    let fx = start(limits).await;
    let addr = fx.addrs[0];
    for i in 0..3u8 {
        let sock = connect_from(ATTACKER, addr).await.expect("connect");
        let mut c = Client::from_stream(sock, [0x80, 0, 0, 0, 9, i]);
        let (st, _) = c.login_chap(SECURE, "alice", "guess-number-0", None).await;
        assert_eq!(st, (2, 1), "attempt {i}: authentication failure");
    }
    // Locked out: closed before any Login Response, even with the right secret.
    let sock = connect_from(ATTACKER, addr).await.expect("connect");
    let mut c = Client::from_stream(sock, [0x80, 0, 0, 0, 9, 9]);
    let _ = c
        .send_checked(
            &login_request(c.isid),
            &encode_text(&[("InitiatorName", INI)]),
        )
        .await;
    assert!(
        tokio::time::timeout(Duration::from_secs(3), c.recv())
            .await
            .expect("closed at once")
            .is_none(),
        "a locked-out source gets no Login Response"
    );
    // Another address is not affected.
    let mut good = Client::connect_isid(addr, [0x80, 0, 0, 0, 8, 1]).await;
    let (st, _) = good
        .login_chap(SECURE, "alice", "alice-secret-12", None)
        .await;
    assert_eq!(st, (0, 0));
    assert!(good.nop(b"fine").await.is_some());
    // Logged with the address, the initiator name and the CHAP name.
    let failed = logs.lines_with(&["authentication failed", "127.0.0.5", INI, "alice"]);
    assert!(failed.len() >= 3, "each failure logged: {failed:?}");
    assert!(!logs
        .lines_with(&["locked out", "127.0.0.5", INI])
        .is_empty());
    // The lockout ends.
    tokio::time::sleep(Duration::from_millis(1_700)).await;
    let sock = connect_from(ATTACKER, addr).await.expect("connect");
    let mut c = Client::from_stream(sock, [0x80, 0, 0, 0, 9, 10]);
    let (st, _) = c.login_chap(SECURE, "alice", "alice-secret-12", None).await;
    assert_eq!(st, (0, 0), "the right secret works after the lockout");
    fx.shutdown().await;
}

/// WRITE(10) of one block of `byte` at `lba` (immediate data), then READ(10) of
/// it: the session does real I/O and gets its data back.
async fn write_read(c: &mut Client, lba: u8, byte: u8) {
    // The first command of a new I_T nexus may meet a unit attention: retry once.
    for attempt in 0..2 {
        let cmd = c.command(&[0x2a, 0, 0, 0, 0, lba, 0, 0, 1, 0], false, true, 512, true);
        c.send(&cmd, false, &[byte; 512]).await;
        match c.recv_skip_pings().await.expect("write response").pdu {
            TargetPdu::ScsiResponse(s) if s.status == 2 && attempt == 0 => continue,
            TargetPdu::ScsiResponse(s) => {
                assert_eq!(s.status, 0, "write status");
                break;
            }
            other => panic!("{other:?}"),
        }
    }
    let cmd = c.command(&[0x28, 0, 0, 0, 0, lba, 0, 0, 1, 0], true, false, 512, true);
    c.send(&cmd, false, &[]).await;
    let mut data = Vec::new();
    loop {
        let p = c.recv_skip_pings().await.expect("read data");
        match p.pdu {
            TargetPdu::DataIn(d) => {
                data.extend_from_slice(&p.data);
                if let Some(st) = d.status {
                    assert_eq!(st, 0);
                    break;
                }
            }
            TargetPdu::ScsiResponse(s) => {
                assert_eq!(s.status, 0);
                break;
            }
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(data, vec![byte; 512], "block {lba} reads back");
}

/// Another initiator naming the same InitiatorName and ISID, from another
/// address, cannot reinstate (and so drop) a session: without CHAP nor with the
/// target-wide CHAP secret. Its login is refused and the first session goes on
/// with its I/O. With the initiator's own CHAP secret the same initiator may
/// reinstate from another address. On the code before, every such login closed
/// the existing session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_initiator_cannot_reinstate_a_session() {
    logs();
    let fx = start(Limits::default()).await;
    let addr = fx.addrs[0];
    let isid = [0x80, 0, 0, 0, 0x42, 1];

    // No CHAP: same name and ISID from 127.0.0.5.
    let mut victim = Client::connect_isid(addr, isid).await;
    assert_eq!(victim.login_simple(OPEN, &[]).await, (0, 0));
    write_read(&mut victim, 1, 0xa1).await;
    let sock = connect_from(ATTACKER, addr).await.expect("connect");
    let mut evil = Client::from_stream(sock, isid);
    assert_eq!(evil.login_simple(OPEN, &[]).await, (2, 2), "refused");
    assert!(evil.recv().await.is_none(), "closed after the refusal");
    write_read(&mut victim, 2, 0xa2).await;
    assert!(victim.nop(b"still mine").await.is_some());

    // The target-wide CHAP secret, shared by initiators, is not an identity.
    let isid2 = [0x80, 0, 0, 0, 0x42, 2];
    let mut victim2 = Client::connect_isid(addr, isid2).await;
    let (st, _) = victim2
        .login_chap(SECURE, "alice", "alice-secret-12", None)
        .await;
    assert_eq!(st, (0, 0));
    let sock = connect_from(ATTACKER, addr).await.expect("connect");
    let mut evil2 = Client::from_stream(sock, isid2);
    let (st, _) = evil2
        .login_chap(SECURE, "alice", "alice-secret-12", None)
        .await;
    assert_eq!(st, (2, 2), "refused");
    assert!(victim2.nop(b"still mine too").await.is_some());

    // The session's own address may reinstate it (a real initiator's re-login).
    let mut again = Client::connect_isid(addr, isid).await;
    assert_eq!(again.login_simple(OPEN, &[]).await, (0, 0));
    assert!(victim.recv().await.is_none(), "old session replaced");
    write_read(&mut again, 2, 0xa3).await;

    // Bob's own secret proves Bob from any address.
    let isid3 = [0x80, 0, 0, 0, 0x42, 3];
    let mut bob = Client::connect_isid(addr, isid3).await;
    let (st, _) = bob
        .login_chap_as(BOB, SECURE, "7", "bob", "bob-secret-1234", None)
        .await;
    assert_eq!(st, (0, 0));
    let sock = connect_from(ATTACKER, addr).await.expect("connect");
    let mut bob2 = Client::from_stream(sock, isid3);
    let (st, _) = bob2
        .login_chap_as(BOB, SECURE, "7", "bob", "bob-secret-1234", None)
        .await;
    assert_eq!(st, (0, 0), "same proven identity reinstates");
    assert!(bob.recv().await.is_none());
    assert!(bob2.nop(b"moved").await.is_some());

    let refused = logs().lines_with(&["another identity", "127.0.0.5", INI]);
    assert!(refused.len() >= 2, "refusals logged: {refused:?}");
    fx.shutdown().await;
}

/// A login that goes no further once its session is registered (here: the
/// login timeout ends it while it waits for the session it reinstates to
/// close) leaves no session behind. Before, such a session stayed in the
/// registry for good: no connection served it and nothing removed it, so each
/// one took a session slot (and a TSIH) for the life of the process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_login_cut_short_after_registering_leaves_no_session() {
    // (the capturing subscriber first: the fixture would install its own, and
    // the other tests of this binary read the captured lines)
    logs();
    let held = Arc::new(block::HoldVolume::new(Arc::new(MemVolume::new(512, 8192))));
    let limits = Limits {
        login_timeout_ms: 1_000,
        drain_timeout_ms: 4_000,
        ..Limits::default()
    };
    let fx = start_with(limits, Some(held.clone())).await;
    let isid = [0x80, 0, 0, 0, 0x51, 0x01];
    let mut a = Client::connect_isid(fx.addrs[0], isid).await;
    assert_eq!(a.login_simple(OPEN, &[]).await, (0, 0));
    // (the first command meets the power-on unit attention)
    write_read(&mut a, 2, 0x11).await;
    // A has a write the disk holds: once killed, it takes the drain time to go
    held.writes.hold();
    let cmd = a.command(&[0x2a, 0, 0, 0, 0, 1, 0, 0, 1, 0], false, true, 512, true);
    a.send(&cmd, false, &[0x5a; 512]).await;
    tokio::time::timeout(Duration::from_secs(10), held.writes.arrivals(1))
        .await
        .expect("A's write reached the disk");
    assert_eq!(fx.sessions.list().len(), 1);
    // B reinstates it: registered, then waiting for A to close, past B's login
    // timeout, which ends B's login
    let mut b = Client::connect_isid(fx.addrs[0], isid).await;
    let req = login_request(isid);
    let text = encode_text(&[
        ("InitiatorName", INI),
        ("TargetName", OPEN),
        ("SessionType", "Normal"),
    ]);
    b.send_checked(&req, &text).await.unwrap();
    let got = tokio::time::timeout(Duration::from_secs(10), b.recv())
        .await
        .expect("the login timeout closes B");
    assert!(got.is_none(), "B's login did not complete");
    // the connection is closed after its login future (and B's registration)
    // is gone: only A, still draining, is registered
    let tsihs: Vec<u16> = fx.sessions.list().iter().map(|s| s.tsih).collect();
    assert_eq!(tsihs.len(), 1, "sessions registered: {tsihs:?}");
    held.writes.open();
    drop(a);
    fx.shutdown().await;
}

/// A target that waits 600 ms for a write's Data-Out, and an initiator
/// (with R2Ts, no immediate data) that sent a 1 MiB write: its ITT.
async fn a_write_waiting_for_data_out() -> (Fixture, Client, u32) {
    a_write_waiting_for_data_out_pinging_every(100).await
}

/// [`a_write_waiting_for_data_out`] with pings every `interval_ms` (0: none).
async fn a_write_waiting_for_data_out_pinging_every(interval_ms: u64) -> (Fixture, Client, u32) {
    a_write_waiting_for_data_out_within(interval_ms, 600).await
}

/// [`a_write_waiting_for_data_out`] with pings every `interval_ms` (0: none),
/// waiting `timeout_ms` for Data-Out.
async fn a_write_waiting_for_data_out_within(
    interval_ms: u64,
    timeout_ms: u64,
) -> (Fixture, Client, u32) {
    let limits = Limits {
        nop_in_interval_ms: interval_ms,
        nop_in_timeout_ms: timeout_ms,
        ..Limits::default()
    };
    let fx = start(limits).await;
    let mut evil = Client::connect(fx.addrs[0]).await;
    let st = evil
        .login_simple(OPEN, &[("InitialR2T", "Yes"), ("ImmediateData", "No")])
        .await;
    assert_eq!(st, (0, 0));
    let cmd = evil.command(
        &[0x2a, 0, 0, 0, 0, 0, 0, 0x08, 0, 0],
        false,
        true,
        1 << 20,
        true,
    );
    let itt = match cmd {
        InitiatorPdu::ScsiCommand(ref c) => c.itt,
        _ => unreachable!(),
    };
    evil.send(&cmd, false, &[]).await;
    (fx, evil, itt)
}

/// Answers the target's ping `ttt` (the connection is alive).
async fn answer_ping(c: &mut Client, ttt: u32) {
    let ans = InitiatorPdu::NopOut(NopOut {
        lun: 0,
        itt: iscsi_proto::RESERVED_TAG,
        ttt,
        cmd_sn: c.cmd_sn,
        exp_stat_sn: c.exp_stat_sn,
    });
    let _ = c.send_checked(&ans, &[]).await;
}

/// Feeds write `itt`'s Data-Out on `c` under the first R2T (answering
/// pings): every `every` (the first at once, or after `every` when
/// `wait_first`), one PDU of each length of `lens`, for at most `rounds_max`
/// rounds; ends when the connection closes or after `within`. Whether it
/// closed, and the rounds sent.
async fn feed_data_out(
    c: &mut Client,
    itt: u32,
    (every, wait_first): (Duration, bool),
    lens: &[usize],
    rounds_max: u32,
    within: Duration,
) -> (bool, u32) {
    let (mut off, mut sn, mut rounds) = (0u32, 0u32, 0u32);
    let closed = tokio::time::timeout(within, async {
        let mut ttt = None;
        let mut tick = tokio::time::interval(every);
        if wait_first {
            tick.tick().await;
        }
        loop {
            tokio::select! {
                p = c.recv() => match p.map(|p| p.pdu) {
                    None => return,
                    Some(TargetPdu::NopIn(n)) if n.ttt != iscsi_proto::RESERVED_TAG => {
                        answer_ping(c, n.ttt).await
                    }
                    Some(TargetPdu::R2t(r)) => { ttt.get_or_insert(r.ttt); }
                    Some(other) => panic!("{other:?}"),
                },
                _ = tick.tick(), if ttt.is_some() && rounds < rounds_max => {
                    for &len in lens {
                        let d = InitiatorPdu::DataOut(DataOut {
                            final_bit: false,
                            lun: 0,
                            itt,
                            ttt: ttt.unwrap(),
                            exp_stat_sn: c.exp_stat_sn,
                            data_sn: sn,
                            buffer_offset_bytes: off,
                        });
                        if c.send_checked(&d, &vec![7u8; len]).await.is_err() {
                            return;
                        }
                        off += len as u32;
                        sn += 1;
                    }
                    rounds += 1;
                }
            }
        }
    })
    .await;
    (closed.is_ok(), rounds)
}

/// A write whose Data-Out never comes took the node's budget for all its bytes
/// when it arrived: an initiator that answers every ping but sends no data
/// would hold it for good (a few such sessions starve every other initiator).
/// The connection is dropped once a write has waited `nop_in_timeout_ms` for
/// Data-Out, and the budget goes back. (Before, the pings kept it alive.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_whose_data_out_never_comes_does_not_hold_its_budget() {
    // a 1 MiB write: the target asks for its data, which never comes
    let (fx, mut evil, _) = a_write_waiting_for_data_out().await;
    let mut r2ts = 0;
    let dropped = tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(p) = evil.recv().await {
            match p.pdu {
                // every ping is answered: the connection itself is alive
                TargetPdu::NopIn(n) if n.ttt != iscsi_proto::RESERVED_TAG => {
                    answer_ping(&mut evil, n.ttt).await
                }
                TargetPdu::R2t(_) => r2ts += 1,
                other => panic!("{other:?}"),
            }
        }
    })
    .await;
    assert!(r2ts > 0, "the target asked for the data");
    assert!(
        dropped.is_ok(),
        "the connection stayed although its write's Data-Out never came"
    );
    // and an honest initiator writes
    let mut good = Client::connect(fx.addrs[0]).await;
    assert_eq!(good.login_simple(OPEN, &[]).await, (0, 0));
    write_read(&mut good, 3, 0x5a).await;
    fx.shutdown().await;
}

/// With pings off (`nop_in_interval_ms` 0) a write whose Data-Out never
/// comes is still bounded by `nop_in_timeout_ms`, as documented. Before
/// (review of 2026-12-06) the timer that bounds it ran only with pings on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_pings_a_write_whose_data_out_never_comes_is_still_bounded() {
    let (fx, mut evil, _) = a_write_waiting_for_data_out_pinging_every(0).await;
    let dropped = tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(p) = evil.recv().await {
            match p.pdu {
                TargetPdu::R2t(_) => {}
                other => panic!("{other:?}"),
            }
        }
    })
    .await;
    assert!(
        dropped.is_ok(),
        "the connection stayed although its write's Data-Out never came"
    );
    fx.shutdown().await;
}

/// The same write fed a few bytes at a time, each Data-Out well within the
/// wait (and an empty one beside it): a trickle is not progress, so the
/// connection is dropped as if nothing came. (Before, every Data-Out PDU,
/// even an empty one, started the wait again, and a write could hold its
/// share of the node's budget for ever at a byte every few seconds.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_whose_data_out_trickles_does_not_hold_its_budget() {
    let (fx, mut evil, itt) = a_write_waiting_for_data_out().await;
    // 512 bytes and an empty PDU, every 150 ms
    let every = (Duration::from_millis(150), false);
    let (dropped, rounds) = feed_data_out(
        &mut evil,
        itt,
        every,
        &[512, 0],
        u32::MAX,
        Duration::from_secs(30),
    )
    .await;
    assert!(rounds >= 4, "the trickle was sent ({rounds} rounds)");
    assert!(
        dropped,
        "the connection stayed while its write's data trickled in"
    );
    let mut good = Client::connect(fx.addrs[0]).await;
    assert_eq!(good.login_simple(OPEN, &[]).await, (0, 0));
    write_read(&mut good, 3, 0x5a).await;
    fx.shutdown().await;
}

/// A write fed 64 KiB just within each Data-Out wait (every 1.8 s, the wait
/// 2 s: 36 KiB/s) falls behind the minimum rate of 64 KiB/s over its life,
/// and its connection is dropped once it is a wait behind, after the second
/// 64 KiB. Before (review of 2026-12-06) each 64 KiB started the wait again,
/// and at the default wait a 16 MiB write held its budget for an hour.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_fed_just_within_each_wait_is_still_held_to_the_minimum_rate() {
    let (fx, mut evil, itt) = a_write_waiting_for_data_out_within(100, 2000).await;
    // 64 KiB in eight PDUs every 1.8 s (the first R2T asks for 256 KiB)
    let every = (Duration::from_millis(1800), true);
    let (dropped, chunks) = feed_data_out(
        &mut evil,
        itt,
        every,
        &[8192; 8],
        4,
        Duration::from_secs(60),
    )
    .await;
    assert!(dropped, "the connection stayed");
    assert!(
        chunks <= 3,
        "{chunks} chunks of 64 KiB taken before the drop: each started the wait again"
    );
    fx.shutdown().await;
}

/// A login PDU carrying more than the login phase's 8 KiB of data (RFC 7143:
/// the default MaxRecvDataSegmentLength holds until both sides declared
/// theirs) is not read: the connection closes unanswered, and a peer that
/// has not authenticated never makes the node hold the configured limit
/// (up to 16 MiB) per connection. A login within it still works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_login_pdu_larger_than_the_login_limit_is_not_read() {
    let fx = start(Limits::default()).await;
    let mut evil = Client::connect(fx.addrs[0]).await;
    let req = InitiatorPdu::Login(LoginRequest {
        transit: false,
        cont: false,
        csg: 0,
        nsg: 1,
        version_max: 0,
        version_min: 0,
        isid: [0x80, 0, 0, 0, 0, 9],
        tsih: 0,
        itt: 1,
        cid: 0,
        cmd_sn: 1,
        exp_stat_sn: 0,
    });
    let pad = "x".repeat(8000);
    let text = encode_text(&[
        ("InitiatorName", INI),
        ("TargetName", OPEN),
        ("X-pad-a", &pad),
        ("X-pad-b", &pad),
    ]);
    assert!(text.len() > 8192);
    evil.send(&req, true, &text).await;
    let answer = tokio::time::timeout(Duration::from_secs(20), evil.recv())
        .await
        .expect("the connection stayed open");
    assert!(answer.is_none(), "answered: {:?}", answer.map(|p| p.pdu));
    let mut good = Client::connect(fx.addrs[0]).await;
    assert_eq!(good.login_simple(OPEN, &[]).await, (0, 0));
    fx.shutdown().await;
}

/// A login naming a session (a non-zero TSIH, to add a connection to it) is
/// answered the same whether that session is live or not: before any
/// authentication, the answer told a peer which TSIHs were in use ("too many
/// connections" against "session does not exist").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_login_naming_a_session_does_not_tell_whether_it_is_live() {
    let fx = start(Limits::default()).await;
    let mut good = Client::connect(fx.addrs[0]).await;
    assert_eq!(good.login_simple(OPEN, &[]).await, (0, 0));
    let live = fx.sessions.list()[0].tsih;
    let mut answers = Vec::new();
    for tsih in [live, live.wrapping_add(1000).max(1)] {
        let sock = connect_from(ATTACKER, fx.addrs[0]).await.unwrap();
        let mut evil = Client::from_stream(sock, [0x80, 0, 0, 0, 0, 7]);
        let InitiatorPdu::Login(mut req) = login_request(evil.isid) else {
            unreachable!()
        };
        req.tsih = tsih;
        let text = encode_text(&[("InitiatorName", INI), ("TargetName", OPEN)]);
        evil.send(&InitiatorPdu::Login(req), true, &text).await;
        let answer = tokio::time::timeout(Duration::from_secs(20), evil.recv())
            .await
            .expect("no answer")
            .expect("closed without an answer");
        match answer.pdu {
            TargetPdu::LoginResponse(r) => answers.push((r.status_class, r.status_detail)),
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(
        answers[0], answers[1],
        "a live TSIH told from an unused one"
    );
    assert_eq!(answers[0].0, 2, "refused as an initiator error");
    fx.shutdown().await;
}

/// A logged-in peer sending PDUs the target drops with a log line (commands
/// outside the CmdSN window) at line rate writes one line a second, with the
/// count held back, not one a PDU (review of 2026-12-06: a peer could fill
/// the node's log).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_dropped_pdus_is_not_a_flood_of_log_lines() {
    let logs = logs();
    let fx = start(Limits::default()).await;
    let sock = connect_from(ATTACKER, fx.addrs[0]).await.unwrap();
    let me = sock.local_addr().unwrap().to_string();
    let mut c = Client::from_stream(sock, [0x80, 0, 0, 0, 0, 31]);
    assert_eq!(c.login_simple(OPEN, &[]).await, (0, 0));
    let saved = c.cmd_sn;
    c.cmd_sn = saved.wrapping_add(100_000);
    let bad = c.command(&[0x00; 6], false, false, 0, true);
    c.cmd_sn = saved;
    for _ in 0..2000 {
        c.send(&bad, false, &[]).await;
    }
    // in order after them: once answered, every one was read
    assert!(c.nop(b"after").await.is_some());
    let lines = logs.lines_with(&["CmdSN outside the window", &me]);
    assert!(!lines.is_empty(), "none logged");
    assert!(lines.len() <= 5, "{} lines for 2000 PDUs", lines.len());
    fx.shutdown().await;
}

/// A command rejected for a malformed header (an unknown AHS type) takes its
/// CmdSN: the session goes on. (Before, the window waited for that CmdSN for
/// good and silently dropped every later command of the session.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_rejected_for_its_header_does_not_stall_the_session() {
    let fx = start(Limits::default()).await;
    let mut c = Client::connect(fx.addrs[0]).await;
    assert_eq!(c.login_simple(OPEN, &[]).await, (0, 0));
    write_read(&mut c, 1, 0x11).await;
    // a TEST UNIT READY with an AHS of an unknown type, not immediate
    let bad = c.command(&[0, 0, 0, 0, 0, 0], false, false, 0, true);
    let ahs = [0u8, 1, 0x7f, 0];
    let h = iscsi_proto::pdu::encode_initiator_bhs(&bad, false, ahs.len(), 0);
    c.send_raw(&iscsi_proto::frame::encode_frame(
        &h,
        &ahs,
        &[],
        false,
        false,
    ))
    .await;
    match c.recv_skip_pings().await.expect("reject").pdu {
        TargetPdu::Reject(_) => {}
        other => panic!("{other:?}"),
    }
    // the next commands, with the next CmdSNs, are answered
    let answered = tokio::time::timeout(Duration::from_secs(20), write_read(&mut c, 2, 0x22)).await;
    assert!(
        answered.is_ok(),
        "the session stalled after the rejected command"
    );
    fx.shutdown().await;
}

/// Pings with data (immediate NOP-Outs: outside the CmdSN window) whose echoes
/// the client never reads: the target stops reading once a bounded amount of
/// echoes is queued (1 MiB a connection, plus what the sockets hold). (Before,
/// the writer's whole queue of 1024 full-size echoes, 256 MiB a connection,
/// could be made to wait outside the node's budget.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn echoes_of_pings_nobody_reads_stay_bounded() {
    use tokio::io::AsyncWriteExt;
    let fx = start(Limits::default()).await;
    let mut c = Client::connect(fx.addrs[0]).await;
    let st = c
        .login_simple(OPEN, &[("MaxRecvDataSegmentLength", "262144")])
        .await;
    assert_eq!(st, (0, 0));
    let payload = vec![0x5a; 256 * 1024];
    let cap = 128usize << 20;
    let mut sent = 0usize;
    while sent < cap {
        let nop = InitiatorPdu::NopOut(NopOut {
            lun: 0,
            itt: c.next_itt(),
            ttt: iscsi_proto::RESERVED_TAG,
            cmd_sn: c.cmd_sn,
            exp_stat_sn: c.exp_stat_sn,
        });
        let h = iscsi_proto::pdu::encode_initiator_bhs(&nop, true, 0, payload.len() as u32);
        let wire = iscsi_proto::frame::encode_frame(&h, &[], &payload, false, false);
        // the target stopped taking them (or dropped the connection)
        match tokio::time::timeout(Duration::from_secs(2), c.sock.write_all(&wire)).await {
            Ok(Ok(())) => sent += payload.len(),
            Ok(Err(_)) | Err(_) => break,
        }
    }
    assert!(
        sent < 48 << 20,
        "{} MiB of pings taken in while none of their echoes was read",
        sent >> 20
    );
    fx.shutdown().await;
}
