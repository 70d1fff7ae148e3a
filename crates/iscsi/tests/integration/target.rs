//! End-to-end tests: a real Server on loopback driven by a raw initiator.

use crate::common;

use common::*;
use iscsi::{Auth, Limits};
use iscsi_proto::frame::encode_frame;
use iscsi_proto::pdu::*;
use iscsi_proto::target::{reject_reason, tmf_response, TargetPdu};
use iscsi_proto::text::{encode_text, parse_text};
use iscsi_proto::RESERVED_TAG;
use std::sync::Arc;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn login_none_commands_nop_and_logout() {
    let fx = start(Limits::default()).await;
    let mut c = Client::connect(fx.addrs[0]).await;
    let (r, kv) = c
        .login_step(
            0,
            1,
            true,
            &[
                ("InitiatorName", INI),
                ("TargetName", OPEN),
                ("AuthMethod", "None"),
            ],
        )
        .await;
    assert_eq!((r.status_class, r.status_detail), (0, 0));
    assert_eq!(get(&kv, "TargetPortalGroupTag"), Some("1"));
    let (r, kv) = c
        .login_step(
            1,
            3,
            true,
            &[
                ("HeaderDigest", "CRC32C,None"),
                ("DataDigest", "CRC32C,None"),
                ("MaxRecvDataSegmentLength", "8192"),
            ],
        )
        .await;
    assert!(r.transit && r.nsg == 3 && r.tsih != 0);
    assert_eq!(get(&kv, "TargetAlias"), Some("open"));
    c.after_login(&kv);
    assert!(c.hd && c.dd);

    // TEST UNIT READY: whatever the status, it is a SCSI Response for our ITT.
    let cmd = c.command(&[0x00; 6], false, false, 0, true);
    let itt = match cmd {
        InitiatorPdu::ScsiCommand(s) => s.itt,
        _ => unreachable!(),
    };
    c.send(&cmd, false, &[]).await;
    let p = c.recv_skip_pings().await.expect("response");
    match p.pdu {
        TargetPdu::ScsiResponse(s) => assert_eq!(s.itt, itt),
        other => panic!("{other:?}"),
    }
    assert_eq!(p.seq.exp_cmd_sn, c.cmd_sn);
    assert!(iscsi_proto::sn_le(c.cmd_sn, p.seq.max_cmd_sn));

    // INQUIRY: Data-In (phase collapsed) or a SCSI Response.
    let cmd = c.command(&[0x12, 0, 0, 0, 96, 0], true, false, 96, true);
    c.send(&cmd, false, &[]).await;
    loop {
        let p = c.recv_skip_pings().await.expect("inquiry answer");
        match p.pdu {
            TargetPdu::DataIn(d) if d.status.is_none() => continue,
            TargetPdu::DataIn(_) | TargetPdu::ScsiResponse(_) => break,
            other => panic!("{other:?}"),
        }
    }

    // NOP-Out ping with data is echoed.
    let p = c.nop(b"hello, target").await.expect("nop-in");
    assert!(matches!(p.pdu, TargetPdu::NopIn(n) if n.ttt == RESERVED_TAG));
    assert_eq!(&p.data[..], b"hello, target");

    // Logout closes the session.
    let itt = c.next_itt();
    let lo = InitiatorPdu::Logout(LogoutRequest {
        reason: 0,
        itt,
        cid: 0,
        cmd_sn: c.cmd_sn,
        exp_stat_sn: c.exp_stat_sn,
    });
    c.send(&lo, true, &[]).await;
    let p = c.recv_skip_pings().await.expect("logout response");
    assert!(matches!(p.pdu, TargetPdu::LogoutResponse(l) if l.response == 0 && l.itt == itt));
    assert!(c.recv().await.is_none(), "closed after logout");
    fx.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discovery_lists_targets_on_both_portals() {
    let fx = start(Limits::default()).await;
    let mut c = Client::connect(fx.addrs[1]).await;
    assert_eq!(c.login_discovery_as(INI).await, (0, 0));
    let kv = send_targets(&mut c, "All").await;
    let names: Vec<&str> = kv
        .iter()
        .filter(|(k, _)| k == "TargetName")
        .map(|(_, v)| v.as_str())
        .collect();
    assert_eq!(names, vec![OPEN, SECURE], "the ACL hides the third target");
    let addrs: Vec<&str> = kv
        .iter()
        .filter(|(k, _)| k == "TargetAddress")
        .map(|(_, v)| v.as_str())
        .collect();
    let a1 = format!("127.0.0.1:{},1", fx.addrs[0].port());
    let a2 = format!("127.0.0.2:{},2", fx.addrs[1].port());
    assert_eq!(
        addrs,
        vec![a1.as_str(), a2.as_str(), a1.as_str(), a2.as_str()]
    );

    // SendTargets=<iqn> lists only that target; SCSI commands are refused here.
    let kv = send_targets(&mut c, SECURE).await;
    assert_eq!(kv.iter().filter(|(k, _)| k == "TargetName").count(), 1);
    assert_eq!(get(&kv, "TargetName"), Some(SECURE));
    let cmd = c.command(&[0; 6], false, false, 0, true);
    c.send(&cmd, false, &[]).await;
    let p = c.recv_skip_pings().await.unwrap();
    assert!(matches!(p.pdu, TargetPdu::Reject(_)));
    // the refused command's CmdSN is taken: the next request is in the
    // window (review of 2026-12-06: dropped, and every later one with it)
    let kv = tokio::time::timeout(Duration::from_secs(10), send_targets(&mut c, SECURE))
        .await
        .expect("the discovery session answers nothing after a refused command");
    assert_eq!(get(&kv, "TargetName"), Some(SECURE));
    fx.shutdown().await;
}

/// A discovery session's SendTargets=`value`: the answer's keys.
async fn send_targets(c: &mut Client, value: &str) -> Vec<(String, String)> {
    text_answer(c, &[("SendTargets", value)]).await
}

/// The answer's keys to a Text request of `pairs` (the answer in one PDU).
async fn text_answer(c: &mut Client, pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    let itt = c.next_itt();
    let t = InitiatorPdu::Text(TextRequest {
        final_bit: true,
        cont: false,
        lun: 0,
        itt,
        ttt: RESERVED_TAG,
        cmd_sn: c.cmd_sn,
        exp_stat_sn: c.exp_stat_sn,
    });
    c.send(&t, false, &encode_text(pairs)).await;
    c.cmd_sn += 1;
    let p = c.recv_skip_pings().await.expect("text response");
    assert!(matches!(p.pdu, TargetPdu::TextResponse(r) if r.final_bit && r.itt == itt));
    parse_text(&p.data).unwrap()
}

/// A Text request naming SendTargets many times is answered with the list
/// once. (Before, each of up to 128 repeats added the whole list: with
/// immediate requests left unread, a connection without credentials held
/// 128 times the list per request queued.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn send_targets_repeated_in_one_request_is_answered_once() {
    let fx = start(Limits::default()).await;
    let mut c = Client::connect(fx.addrs[0]).await;
    assert_eq!(c.login_discovery_as(INI).await, (0, 0));
    let pairs = vec![("SendTargets", "All"); 128];
    let kv = text_answer(&mut c, &pairs).await;
    let names = kv.iter().filter(|(k, _)| k == "TargetName").count();
    assert_eq!(names, 2, "{kv:?}");
    fx.shutdown().await;
}

/// Names are case-insensitive in discovery too: an initiator sending its name
/// in other letters than its ACL entry sees its target, by SendTargets=All
/// and by the target's name in capitals. (Before, SendTargets=<name> compared
/// the target's name exactly and found nothing; an ACL entry written in
/// capitals, compared exactly with the folded name, hid its target from
/// SendTargets=All: that case has no test here.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discovery_matches_names_whatever_their_letters() {
    let fx = start(Limits::default()).await;
    let mut c = Client::connect(fx.addrs[0]).await;
    let shouting = "IQN.2026-01.ORG.TEST:SOMEONE-ELSE";
    assert_eq!(c.login_discovery_as(shouting).await, (0, 0));
    let kv = send_targets(&mut c, "All").await;
    assert!(
        kv.iter().any(|(k, v)| k == "TargetName" && v == HIDDEN),
        "{kv:?}"
    );
    let kv = send_targets(&mut c, &HIDDEN.to_uppercase()).await;
    assert_eq!(get(&kv, "TargetName"), Some(HIDDEN));
    fx.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chap_mutual_chap_and_refusals() {
    let fx = start(Limits::default()).await;
    // CHAP + mutual CHAP.
    let mut c = Client::connect(fx.addrs[0]).await;
    let challenge = [0x5au8; 16];
    let (st, kv) = c
        .login_chap(SECURE, "alice", "alice-secret-12", Some(&challenge))
        .await;
    assert_eq!(st, (0, 0));
    assert_eq!(get(&kv, "CHAP_N"), Some("target"));
    let r = iscsi_proto::chap::decode_binary(get(&kv, "CHAP_R").unwrap()).unwrap();
    assert_eq!(
        r,
        iscsi_proto::chap::response(77, b"target-secret-12", &challenge)
    );
    assert!(c.nop(b"x").await.is_some());

    // One-way CHAP on a second connection (different ISID).
    let mut c2 = Client::connect_isid(fx.addrs[1], [0x80, 0, 0, 0, 0, 2]).await;
    let (st, _) = c2
        .login_chap(SECURE, "alice", "alice-secret-12", None)
        .await;
    assert_eq!(st, (0, 0));

    // Wrong password.
    let mut bad = Client::connect_isid(fx.addrs[0], [0x80, 0, 0, 0, 0, 3]).await;
    let (st, _) = bad
        .login_chap(SECURE, "alice", "not-the-password", None)
        .await;
    assert_eq!(st, (2, 1));
    assert!(bad.recv().await.is_none(), "closed after failure");

    // Skipping authentication.
    let mut skip = Client::connect_isid(fx.addrs[0], [0x80, 0, 0, 0, 0, 4]).await;
    assert_eq!(skip.login_simple(SECURE, &[]).await, (2, 1));

    // ACL and unknown target.
    let mut acl = Client::connect_isid(fx.addrs[0], [0x80, 0, 0, 0, 0, 5]).await;
    assert_eq!(acl.login_simple(HIDDEN, &[]).await, (2, 2));
    let mut nf = Client::connect_isid(fx.addrs[0], [0x80, 0, 0, 0, 0, 6]).await;
    assert_eq!(
        nf.login_simple("iqn.2026-01.org.freesan:nope", &[]).await,
        (2, 3)
    );

    // The authenticated sessions still work.
    assert!(c.nop(b"still here").await.is_some());
    assert!(c2.nop(b"me too").await.is_some());
    fx.shutdown().await;
}

/// CHAP_A=7 (SHA-256) is chosen whenever offered, mutual CHAP answers with it;
/// MD5 still works alone; an initiator with its own secret must use it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chap_sha256_preferred_and_per_initiator_secrets() {
    use iscsi_proto::chap::ChapAlgorithm;
    let fx = start(Limits::default()).await;
    let mine = [0x77u8; 32];
    let mut c = Client::connect_isid(fx.addrs[0], [0x80, 0, 0, 0, 7, 1]).await;
    let (st, kv) = c
        .login_chap_as(INI, SECURE, "5,7", "alice", "alice-secret-12", Some(&mine))
        .await;
    assert_eq!(st, (0, 0));
    assert_eq!(c.chap_algorithm, Some(ChapAlgorithm::Sha256));
    let r = iscsi_proto::chap::decode_binary(get(&kv, "CHAP_R").unwrap()).unwrap();
    assert_eq!(
        r,
        ChapAlgorithm::Sha256.response(77, b"target-secret-12", &mine)
    );
    assert!(c.nop(b"sha").await.is_some());
    // MD5 when it is all the initiator offers.
    let mut m = Client::connect_isid(fx.addrs[1], [0x80, 0, 0, 0, 7, 2]).await;
    let (st, _) = m
        .login_chap_as(INI, SECURE, "5", "alice", "alice-secret-12", Some(&mine))
        .await;
    assert_eq!(st, (0, 0));
    assert_eq!(m.chap_algorithm, Some(ChapAlgorithm::Md5));
    // Bob has his own secret: the target-wide one is refused for him.
    let mut b = Client::connect_isid(fx.addrs[0], [0x80, 0, 0, 0, 7, 3]).await;
    let (st, _) = b
        .login_chap_as(BOB, SECURE, "7", "alice", "alice-secret-12", None)
        .await;
    assert_eq!(st, (2, 1));
    let mut b = Client::connect_isid(fx.addrs[0], [0x80, 0, 0, 0, 7, 4]).await;
    let (st, _) = b
        .login_chap_as(BOB, SECURE, "7,5", "bob", "bob-secret-1234", None)
        .await;
    assert_eq!(st, (0, 0));
    assert!(b.nop(b"bob").await.is_some());
    // Nobody else can use Bob's.
    let mut e = Client::connect_isid(fx.addrs[0], [0x80, 0, 0, 0, 7, 5]).await;
    let (st, _) = e
        .login_chap_as(INI, SECURE, "7", "bob", "bob-secret-1234", None)
        .await;
    assert_eq!(st, (2, 1));
    fx.shutdown().await;
}

/// The connection closes (the target may say so first) within 10 s.
async fn closes(c: &mut Client, what: &str) {
    tokio::time::timeout(Duration::from_secs(10), async {
        while c.recv().await.is_some() {}
    })
    .await
    .unwrap_or_else(|_| panic!("{what}: the session was not closed"));
}

/// A reload that takes access away closes the sessions that had it: an
/// initiator the ACL no longer lists, one whose own CHAP secret changed, and a
/// discovery session once discovery asks for CHAP. A session whose login the
/// new table would still accept (the target-wide CHAP it proved is unchanged)
/// keeps running. (Before, every session kept running until it ended: a
/// revoked initiator kept its access.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_closes_the_sessions_the_new_access_settings_refuse() {
    let fx = start(Limits::default()).await;
    let mut open = Client::connect_isid(fx.addrs[0], [0x80, 0, 0, 0, 9, 1]).await;
    assert_eq!(open.login_simple(OPEN, &[]).await, (0, 0));
    let mut bob = Client::connect_isid(fx.addrs[0], [0x80, 0, 0, 0, 9, 2]).await;
    let (st, _) = bob
        .login_chap_as(BOB, SECURE, "7", "bob", "bob-secret-1234", None)
        .await;
    assert_eq!(st, (0, 0));
    let mut alice = Client::connect_isid(fx.addrs[1], [0x80, 0, 0, 0, 9, 3]).await;
    let (st, _) = alice
        .login_chap(SECURE, "alice", "alice-secret-12", None)
        .await;
    assert_eq!(st, (0, 0));
    let mut disc = Client::connect_isid(fx.addrs[0], [0x80, 0, 0, 0, 9, 4]).await;
    assert_eq!(disc.login_discovery_as(INI).await, (0, 0));
    assert!(!send_targets(&mut disc, "All").await.is_empty());

    // a table that changes nothing closes nothing
    let same = fx.reloader.targets();
    assert_eq!(fx.reloader.replace(same, Auth::default()), Ok(0));

    let mut specs = fx.reloader.targets();
    specs[0].allowed_initiators = vec![BOB.into()];
    specs[0].alias = Some("renamed".into());
    specs[1].auth.per_initiator = vec![(BOB.into(), secret("bob", "bob-secret-5678"))];
    let discovery = Auth {
        chap: Some(secret("disc", "disc-secret-12")),
        ..Auth::default()
    };
    assert_eq!(fx.reloader.replace(specs, discovery), Ok(3));
    closes(&mut open, "an initiator the ACL no longer lists").await;
    closes(&mut bob, "an initiator whose CHAP secret changed").await;
    closes(
        &mut disc,
        "a discovery session without the new discovery CHAP",
    )
    .await;
    assert!(
        alice.nop(b"still admitted").await.is_some(),
        "a session the new table still admits was closed"
    );
    // and a new login sees the new table
    let mut again = Client::connect_isid(fx.addrs[0], [0x80, 0, 0, 0, 9, 5]).await;
    assert_eq!(again.login_simple(OPEN, &[]).await, (2, 2));
    fx.shutdown().await;
}

/// A target told to refuse MD5 answers an offer of MD5 alone with an
/// authentication failure and no challenge, still takes SHA-256, and a
/// reload that turns MD5 away closes the sessions that proved with it (not
/// those that proved with SHA-256). Before, MD5 could not be refused: a man in
/// the middle could strip SHA-256 from the offer and record an MD5 exchange.
/// SHA-1 (CHAP_A=6, since 2026-12-07) counts as weak with MD5; SHA3-256 (8)
/// is taken, and chosen over the others whatever the offer's order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_target_that_refuses_md5_takes_only_sha256() {
    use iscsi_proto::chap::ChapAlgorithm;
    let fx = start(Limits::default()).await;
    let mut md5 = Client::connect_isid(fx.addrs[0], [0x80, 0, 0, 0, 10, 1]).await;
    let (st, _) = md5
        .login_chap_as(INI, SECURE, "5", "alice", "alice-secret-12", None)
        .await;
    assert_eq!(st, (0, 0));
    let mut sha = Client::connect_isid(fx.addrs[0], [0x80, 0, 0, 0, 10, 2]).await;
    let (st, _) = sha
        .login_chap_as(INI, SECURE, "7,5", "alice", "alice-secret-12", None)
        .await;
    assert_eq!(st, (0, 0));
    let mut sha1 = Client::connect_isid(fx.addrs[0], [0x80, 0, 0, 0, 10, 5]).await;
    let (st, _) = sha1
        .login_chap_as(INI, SECURE, "5,6", "alice", "alice-secret-12", None)
        .await;
    assert_eq!(st, (0, 0));
    assert_eq!(sha1.chap_algorithm, Some(ChapAlgorithm::Sha1));

    let mut specs = fx.reloader.targets();
    specs[1].auth.refuse_md5 = true;
    assert_eq!(fx.reloader.replace(specs, Auth::default()), Ok(2));
    closes(&mut md5, "a session that proved with MD5").await;
    closes(&mut sha1, "a session that proved with SHA-1").await;
    assert!(sha.nop(b"sha-256").await.is_some());

    // MD5 alone is refused at CHAP_A, before any challenge
    let mut c = Client::connect_isid(fx.addrs[0], [0x80, 0, 0, 0, 10, 3]).await;
    let (r, kv) = c
        .login_step(
            0,
            0,
            false,
            &[
                ("InitiatorName", INI),
                ("TargetName", SECURE),
                ("SessionType", "Normal"),
                ("AuthMethod", "CHAP"),
            ],
        )
        .await;
    assert_eq!((r.status_class, r.status_detail), (0, 0));
    assert_eq!(get(&kv, "AuthMethod"), Some("CHAP"));
    let (r, kv) = c.login_step(0, 0, false, &[("CHAP_A", "6,5")]).await;
    assert_eq!((r.status_class, r.status_detail), (2, 1));
    assert!(get(&kv, "CHAP_C").is_none(), "a weak challenge was sent");
    // SHA-256 still logs in, and SHA3-256, chosen first
    let mut again = Client::connect_isid(fx.addrs[0], [0x80, 0, 0, 0, 10, 4]).await;
    let (st, _) = again
        .login_chap_as(INI, SECURE, "5,7", "alice", "alice-secret-12", None)
        .await;
    assert_eq!(st, (0, 0));
    assert_eq!(again.chap_algorithm, Some(ChapAlgorithm::Sha256));
    let mut sha3 = Client::connect_isid(fx.addrs[0], [0x80, 0, 0, 0, 10, 6]).await;
    let mine = [0x5au8; 32];
    let (st, kv) = sha3
        .login_chap_as(
            INI,
            SECURE,
            "5,6,8,7",
            "alice",
            "alice-secret-12",
            Some(&mine),
        )
        .await;
    assert_eq!(st, (0, 0));
    assert_eq!(sha3.chap_algorithm, Some(ChapAlgorithm::Sha3_256));
    // mutual CHAP answers with it too
    let r = iscsi_proto::chap::decode_binary(get(&kv, "CHAP_R").unwrap()).unwrap();
    assert_eq!(
        r,
        ChapAlgorithm::Sha3_256.response(77, b"target-secret-12", &mine)
    );
    assert!(sha3.nop(b"sha3-256").await.is_some());
    fx.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_pdus() {
    let fx = start(Limits::default()).await;
    let mut good = Client::connect_isid(fx.addrs[0], [0x80, 0, 0, 0, 0, 10]).await;
    assert_eq!(good.login_simple(OPEN, &[]).await, (0, 0));

    // Unknown opcode: Reject with the header, the session goes on.
    let mut c = Client::connect_isid(fx.addrs[0], [0x80, 0, 0, 0, 0, 11]).await;
    assert_eq!(c.login_simple(OPEN, &[]).await, (0, 0));
    let mut h = [0u8; 48];
    h[0] = 0x1d;
    h[16..20].copy_from_slice(&0x1234u32.to_be_bytes());
    c.send_raw(&h).await;
    let p = c.recv_skip_pings().await.expect("reject");
    match p.pdu {
        TargetPdu::Reject(r) => assert_eq!(r.reason, reject_reason::PROTOCOL_ERROR),
        other => panic!("{other:?}"),
    }
    assert_eq!(&p.data[..], &h[..]);
    assert!(c.nop(b"after reject").await.is_some());

    // SNACK at ERL 0: Reject.
    let sn = InitiatorPdu::Snack(SnackRequest {
        snack_type: 1,
        lun: 0,
        itt: RESERVED_TAG,
        ttt: RESERVED_TAG,
        exp_stat_sn: c.exp_stat_sn,
        beg_run: 0,
        run_length: 0,
    });
    c.send(&sn, false, &[]).await;
    assert!(matches!(
        c.recv_skip_pings().await.unwrap().pdu,
        TargetPdu::Reject(_)
    ));

    // Data segment above MaxRecvDataSegmentLength: closed.
    let nop = InitiatorPdu::NopOut(NopOut {
        lun: 0,
        itt: 9,
        ttt: RESERVED_TAG,
        cmd_sn: c.cmd_sn,
        exp_stat_sn: c.exp_stat_sn,
    });
    let hdr = encode_initiator_bhs(&nop, true, 0, 1 << 22);
    c.send_raw(&hdr).await;
    let drained = tokio::time::timeout(std::time::Duration::from_secs(10), async {
        while let Some(p) = c.recv().await {
            assert!(matches!(p.pdu, TargetPdu::Reject(_) | TargetPdu::NopIn(_)));
        }
    })
    .await;
    assert!(
        drained.is_ok(),
        "connection not closed after an oversized data segment"
    );

    // Bad header digest: closed.
    let mut d = Client::connect_isid(fx.addrs[0], [0x80, 0, 0, 0, 0, 12]).await;
    assert_eq!(
        d.login_simple(OPEN, &[("HeaderDigest", "CRC32C")]).await,
        (0, 0)
    );
    assert!(d.hd);
    assert!(d.nop(b"digest ok").await.is_some());
    let nop = InitiatorPdu::NopOut(NopOut {
        lun: 0,
        itt: 77,
        ttt: RESERVED_TAG,
        cmd_sn: d.cmd_sn,
        exp_stat_sn: d.exp_stat_sn,
    });
    let mut wire = iscsi_proto::frame::encode_frame(
        &encode_initiator_bhs(&nop, true, 0, 0),
        &[],
        &[],
        true,
        false,
    );
    wire[49] ^= 0xff;
    d.send_raw(&wire).await;
    assert!(d.recv().await.is_none(), "closed on header digest error");

    // Login PDU in full feature phase: Reject and close.
    let mut e = Client::connect_isid(fx.addrs[0], [0x80, 0, 0, 0, 0, 13]).await;
    assert_eq!(e.login_simple(OPEN, &[]).await, (0, 0));
    let login = InitiatorPdu::Login(LoginRequest {
        transit: true,
        cont: false,
        csg: 1,
        nsg: 3,
        version_max: 0,
        version_min: 0,
        isid: e.isid,
        tsih: 0,
        itt: 1,
        cid: 0,
        cmd_sn: e.cmd_sn,
        exp_stat_sn: e.exp_stat_sn,
    });
    e.send(&login, true, &[]).await;
    assert!(matches!(
        e.recv().await.map(|p| p.pdu),
        Some(TargetPdu::Reject(_))
    ));
    assert!(e.recv().await.is_none());

    // The untouched session keeps working.
    assert_eq!(
        &good.nop(b"unaffected").await.unwrap().data[..],
        b"unaffected"
    );
    fx.shutdown().await;
}

/// Writes whose data all comes as immediate data longer than 64 KiB are read
/// into buffers of their own (iscsi_proto::recv), back to back in one send, with
/// digests, among small PDUs; every byte lands where it was written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_immediate_writes_sent_back_to_back_land_whole() {
    let fx = start(Limits::default()).await;
    let mut c = Client::connect(fx.addrs[0]).await;
    let st = c
        .login_simple(
            OPEN,
            &[
                ("HeaderDigest", "CRC32C"),
                ("DataDigest", "CRC32C"),
                ("InitialR2T", "No"),
                ("ImmediateData", "Yes"),
                ("MaxBurstLength", "262144"),
                ("FirstBurstLength", "262144"),
            ],
        )
        .await;
    assert_eq!(st, (0, 0));
    assert!(c.hd && c.dd);
    // the unit attention a new session starts with
    let mut ready = false;
    for _ in 0..4 {
        ready = scsi(&mut c, &[0, 0, 0, 0, 0, 0], &[], 0).await.0 == 0;
        if ready {
            break;
        }
    }
    assert!(ready, "TEST UNIT READY never succeeded");
    let blocks = 400u32; // 200 KiB a write
    let pattern = |i: u32| -> Vec<u8> {
        (0..blocks as usize * 512)
            .map(|b| (b as u32).wrapping_mul(31).wrapping_add(i * 7) as u8)
            .collect()
    };
    let mut wire = Vec::new();
    let mut itts = Vec::new();
    for i in 0..8u32 {
        let lba = i * blocks;
        let l = lba.to_be_bytes();
        let n = (blocks as u16).to_be_bytes();
        let cdb = [0x2a, 0, l[0], l[1], l[2], l[3], 0, n[0], n[1], 0];
        let cmd = c.command(&cdb, false, true, blocks * 512, true);
        if let InitiatorPdu::ScsiCommand(s) = &cmd {
            itts.push(s.itt);
        }
        let h = encode_initiator_bhs(&cmd, false, 0, blocks * 512);
        wire.extend(encode_frame(&h, &[], &pattern(i), true, true));
        // a small command between some of them (TEST UNIT READY)
        if i % 3 == 1 {
            let tur = c.command(&[0, 0, 0, 0, 0, 0], false, false, 0, true);
            if let InitiatorPdu::ScsiCommand(s) = &tur {
                itts.push(s.itt);
            }
            let h = encode_initiator_bhs(&tur, false, 0, 0);
            wire.extend(encode_frame(&h, &[], &[], true, true));
        }
    }
    c.send_raw(&wire).await;
    let mut answered = Vec::new();
    while answered.len() < itts.len() {
        let p = c.recv_skip_pings().await.expect("response");
        match p.pdu {
            TargetPdu::ScsiResponse(s) => {
                assert_eq!(s.status, 0, "itt {}", s.itt);
                answered.push(s.itt);
            }
            other => panic!("{other:?}"),
        }
    }
    answered.sort_unstable();
    itts.sort_unstable();
    assert_eq!(answered, itts);
    for i in 0..8u32 {
        let l = (i * blocks).to_be_bytes();
        let n = (blocks as u16).to_be_bytes();
        let cdb = [0x28, 0, l[0], l[1], l[2], l[3], 0, n[0], n[1], 0];
        let (st, data) = scsi(&mut c, &cdb, &[], blocks * 512).await;
        assert_eq!(st, 0);
        assert!(data == pattern(i), "write {i} did not land whole");
    }
    fx.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_with_immediate_data_and_r2t() {
    let limits = Limits {
        max_burst_bytes: 16 * 1024,
        ..Limits::default()
    };
    let fx = start(limits).await;
    let mut c = Client::connect(fx.addrs[0]).await;
    let st = c
        .login_simple(
            OPEN,
            &[
                ("InitialR2T", "Yes"),
                ("ImmediateData", "Yes"),
                ("MaxBurstLength", "262144"),
                ("FirstBurstLength", "65536"),
                ("MaxOutstandingR2T", "1"),
            ],
        )
        .await;
    assert_eq!(st, (0, 0));
    let edtl = 40 * 1024u32;
    // WRITE(10) of 80 blocks at LBA 0, 4 KiB immediate, the rest solicited.
    let cmd = c.command(&[0x2a, 0, 0, 0, 0, 0, 0, 0, 80, 0], false, true, edtl, true);
    let itt = match cmd {
        InitiatorPdu::ScsiCommand(s) => s.itt,
        _ => unreachable!(),
    };
    c.send(&cmd, false, &[7u8; 4096]).await;
    let mut got = 4096u32;
    let mut r2ts = 0;
    let exp_data_sn = loop {
        let p = c.recv_skip_pings().await.expect("r2t or response");
        match p.pdu {
            TargetPdu::R2t(r) => {
                r2ts += 1;
                assert_eq!(r.itt, itt);
                assert_eq!(r.buffer_offset_bytes, got);
                assert!(r.desired_len_bytes <= 16 * 1024);
                // Send it in two Data-Out PDUs.
                let half = r.desired_len_bytes / 2;
                for (i, (off, len)) in [
                    (r.buffer_offset_bytes, half),
                    (r.buffer_offset_bytes + half, r.desired_len_bytes - half),
                ]
                .into_iter()
                .enumerate()
                {
                    let d = InitiatorPdu::DataOut(DataOut {
                        final_bit: i == 1,
                        lun: 0,
                        itt,
                        ttt: r.ttt,
                        exp_stat_sn: c.exp_stat_sn,
                        data_sn: i as u32,
                        buffer_offset_bytes: off,
                    });
                    c.send(&d, false, &vec![9u8; len as usize]).await;
                }
                got += r.desired_len_bytes;
            }
            TargetPdu::ScsiResponse(s) => {
                assert_eq!(s.itt, itt);
                break s.exp_data_sn;
            }
            other => panic!("{other:?}"),
        }
    };
    assert_eq!(got, edtl);
    assert_eq!(r2ts, 3);
    // the R2Ts and Data-In PDUs the target sent for the command (RFC 7143
    // 11.4.8): here its three R2Ts
    assert_eq!(exp_data_sn, 3, "ExpDataSN of the SCSI Response");
    fx.shutdown().await;
}

/// An ABORT TASK of the task `itt` (sent with CmdSN `cmd_sn`) through LUN
/// field `lun`: its own tag and the PDU.
fn abort_task(c: &mut Client, itt: u32, cmd_sn: u32, lun: u64) -> (u32, InitiatorPdu) {
    let tmf_itt = c.next_itt();
    let p = InitiatorPdu::TaskMgmt(TaskMgmtRequest {
        function: 1,
        lun,
        itt: tmf_itt,
        rtt: itt,
        cmd_sn: c.cmd_sn,
        exp_stat_sn: c.exp_stat_sn,
        ref_cmd_sn: cmd_sn,
        exp_data_sn: 0,
    });
    (tmf_itt, p)
}

/// ABORT TASK for a command already answered: "Task does not exist" (RFC 7143
/// 11.5.1: its CmdSN is behind the window), never "Function complete", which
/// would tell the initiator the write it saw succeed was aborted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abort_task_of_an_answered_command_finds_no_task() {
    let fx = start(Limits::default()).await;
    let mut c = Client::connect(fx.addrs[0]).await;
    let st = c
        .login_simple(OPEN, &[("InitialR2T", "No"), ("ImmediateData", "Yes")])
        .await;
    assert_eq!(st, (0, 0));
    // The first command after login gets the power-on unit attention.
    let tur = c.command(&[0, 0, 0, 0, 0, 0], false, false, 0, true);
    c.send(&tur, false, &[]).await;
    c.recv_skip_pings().await.expect("unit attention");
    let cmd = c.command(&[0x2a, 0, 0, 0, 0, 0, 0, 0, 8, 0], false, true, 4096, true);
    let (itt, cmd_sn) = match cmd {
        InitiatorPdu::ScsiCommand(ref s) => (s.itt, s.cmd_sn),
        _ => unreachable!(),
    };
    c.send(&cmd, false, &[5u8; 4096]).await;
    match c.recv_skip_pings().await.expect("response").pdu {
        TargetPdu::ScsiResponse(s) => assert_eq!((s.itt, s.status), (itt, 0)),
        other => panic!("{other:?}"),
    }
    for immediate in [false, true] {
        let (tmf_itt, tmf) = abort_task(&mut c, itt, cmd_sn, 0);
        if !immediate {
            c.cmd_sn += 1;
        }
        c.send(&tmf, immediate, &[]).await;
        match c.recv_skip_pings().await.expect("tmf response").pdu {
            TargetPdu::TaskMgmtResponse(r) => {
                assert_eq!(r.itt, tmf_itt);
                assert_eq!(r.response, tmf_response::NO_TASK, "immediate: {immediate}");
            }
            other => panic!("{other:?}"),
        }
    }
    fx.shutdown().await;
}

/// ABORT TASK names a task by its tag and its LUN: a tag of a task on LUN
/// 0 sent with LUN 1 finds no task, and the write goes on (before, it was
/// dropped and the abort answered "Function complete"); with LUN 0 it is
/// aborted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abort_task_with_another_luns_number_aborts_nothing() {
    let fx = start(Limits::default()).await;
    let mut c = Client::connect(fx.addrs[0]).await;
    assert_eq!(c.login_simple(OPEN, &[]).await, (0, 0));
    let tur = c.command(&[0, 0, 0, 0, 0, 0], false, false, 0, true);
    c.send(&tur, false, &[]).await;
    c.recv_skip_pings().await.expect("unit attention");
    for (lun, want) in [
        (1u64 << 48, tmf_response::NO_TASK),
        (0, tmf_response::COMPLETE),
    ] {
        // a write waiting for its data (InitialR2T=Yes): an R2T comes
        let cmd = c.command(&[0x2a, 0, 0, 0, 0, 0, 0, 0, 8, 0], false, true, 4096, true);
        let (itt, cmd_sn) = match cmd {
            InitiatorPdu::ScsiCommand(ref s) => (s.itt, s.cmd_sn),
            _ => unreachable!(),
        };
        c.send(&cmd, false, &[]).await;
        let r2t = match c.recv_skip_pings().await.expect("r2t").pdu {
            TargetPdu::R2t(r) => r,
            other => panic!("{other:?}"),
        };
        let (tmf_itt, tmf) = abort_task(&mut c, itt, cmd_sn, lun);
        c.send(&tmf, true, &[]).await;
        match c.recv_skip_pings().await.expect("tmf response").pdu {
            TargetPdu::TaskMgmtResponse(r) => {
                assert_eq!((r.itt, r.response), (tmf_itt, want), "LUN field {lun:#x}")
            }
            other => panic!("{other:?}"),
        }
        if want == tmf_response::NO_TASK {
            // the write is still there: its data completes it
            let d = InitiatorPdu::DataOut(DataOut {
                final_bit: true,
                lun: 0,
                itt,
                ttt: r2t.ttt,
                exp_stat_sn: c.exp_stat_sn,
                data_sn: 0,
                buffer_offset_bytes: 0,
            });
            c.send(&d, false, &[3u8; 4096]).await;
            match c.recv_skip_pings().await.expect("response").pdu {
                TargetPdu::ScsiResponse(s) => assert_eq!((s.itt, s.status), (itt, 0)),
                other => panic!("{other:?}"),
            }
        }
    }
    fx.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reinstatement_closes_the_old_session() {
    let fx = start(Limits::default()).await;
    let mut a = Client::connect(fx.addrs[0]).await;
    assert_eq!(a.login_simple(OPEN, &[]).await, (0, 0));
    let mut b = Client::connect(fx.addrs[0]).await;
    assert_eq!(b.login_simple(OPEN, &[]).await, (0, 0));
    assert!(a.recv().await.is_none(), "old session closed");
    assert!(b.nop(b"new").await.is_some());
    // Same ISID through the other portal is a different I_T nexus: both live.
    let mut m = Client::connect(fx.addrs[1]).await;
    assert_eq!(m.login_simple(OPEN, &[]).await, (0, 0));
    assert!(b.nop(b"1").await.is_some() && m.nop(b"2").await.is_some());
    fx.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn target_pings_idle_connections_and_drops_silent_ones() {
    let limits = Limits {
        nop_in_interval_ms: 100,
        nop_in_timeout_ms: 300,
        ..Limits::default()
    };
    let fx = start(limits).await;
    let mut c = Client::connect(fx.addrs[0]).await;
    assert_eq!(c.login_simple(OPEN, &[]).await, (0, 0));
    let p = c.recv().await.expect("ping");
    assert!(matches!(p.pdu, TargetPdu::NopIn(n) if n.ttt != RESERVED_TAG && n.itt == RESERVED_TAG));
    // Never answer: the target hangs up.
    let t0 = std::time::Instant::now();
    while c.recv().await.is_some() {}
    assert!(t0.elapsed() < Duration::from_secs(5));
    fx.shutdown().await;
}

/// `nop_in_timeout_ms` 0 waits for a ping's answer for ever (documented as
/// turning the timeout off): a connection that takes its time answering
/// stays. Before (review of 2026-12-06) it was dropped at the next tick.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ping_timeout_of_zero_never_drops_the_connection() {
    let limits = Limits {
        nop_in_interval_ms: 100,
        nop_in_timeout_ms: 0,
        ..Limits::default()
    };
    let fx = start(limits).await;
    let mut c = Client::connect(fx.addrs[0]).await;
    assert_eq!(c.login_simple(OPEN, &[]).await, (0, 0));
    let p = c.recv().await.expect("ping");
    assert!(matches!(p.pdu, TargetPdu::NopIn(n) if n.ttt != RESERVED_TAG));
    // unanswered for ten of its intervals (nothing to await for "still
    // open": a bounded look), then the connection still answers
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(c.nop(b"late").await.is_some(), "dropped for a slow answer");
    fx.shutdown().await;
}

/// A command whose CmdSN lies outside the window is dropped unanswered (RFC 7143
/// 3.2.2.1) while the session goes on; a header announcing a huge AHS closes only
/// that connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cmdsn_outside_window_and_huge_ahs() {
    let fx = start(Limits::default()).await;
    let mut good = Client::connect_isid(fx.addrs[0], [0x80, 0, 0, 0, 0, 20]).await;
    assert_eq!(good.login_simple(OPEN, &[]).await, (0, 0));

    let mut c = Client::connect_isid(fx.addrs[0], [0x80, 0, 0, 0, 0, 21]).await;
    assert_eq!(c.login_simple(OPEN, &[]).await, (0, 0));
    // TEST UNIT READY with a CmdSN far beyond MaxCmdSN
    let saved = c.cmd_sn;
    c.cmd_sn = saved.wrapping_add(100_000);
    let bad = c.command(&[0x00; 6], false, false, 0, true);
    let bad_itt = match &bad {
        InitiatorPdu::ScsiCommand(s) => s.itt,
        _ => unreachable!(),
    };
    c.send(&bad, false, &[]).await;
    // then one with the expected CmdSN: it is answered, the bad one never is
    c.cmd_sn = saved;
    let ok = c.command(&[0x00; 6], false, false, 0, true);
    let ok_itt = match &ok {
        InitiatorPdu::ScsiCommand(s) => s.itt,
        _ => unreachable!(),
    };
    c.send(&ok, false, &[]).await;
    let p = c
        .recv_skip_pings()
        .await
        .expect("answer to the in-window command");
    match p.pdu {
        TargetPdu::ScsiResponse(r) => assert_eq!(r.itt, ok_itt, "out-of-window command answered"),
        other => panic!("{other:?}"),
    }
    assert_eq!(p.seq.exp_cmd_sn, saved.wrapping_add(1));
    let p = c.nop(b"still here").await.expect("nop after out-of-window");
    assert!(
        matches!(p.pdu, TargetPdu::NopIn(_)),
        "unexpected PDU (bad itt {bad_itt}): {:?}",
        p.pdu
    );

    // TotalAHSLength 255 words on a SCSI command: the connection is closed.
    let mut h = [0u8; 48];
    h[0] = 0x01;
    h[1] = 0x80;
    h[4] = 255;
    c.send_raw(&h).await;
    c.send_raw(&vec![0u8; 255 * 4]).await;
    let closed = tokio::time::timeout(std::time::Duration::from_secs(10), async {
        while c.recv().await.is_some() {}
    })
    .await;
    assert!(closed.is_ok(), "connection not closed after a huge AHS");

    assert_eq!(
        &good.nop(b"unaffected").await.unwrap().data[..],
        b"unaffected"
    );
    fx.shutdown().await;
}

/// LUN 0 of the open target: memory that notes the lba of every write as it
/// arrives.
struct Recording {
    inner: block::VolumeRef,
    writes: parking_lot::Mutex<Vec<u64>>,
}

#[async_trait::async_trait]
impl block::Volume for Recording {
    fn geometry(&self) -> block::Geometry {
        self.inner.geometry()
    }
    async fn read(&self, lba: u64, blocks: u32) -> block::BlockResult<bytes::Bytes> {
        self.inner.read(lba, blocks).await
    }
    async fn write(&self, lba: u64, data: bytes::Bytes, fua: bool) -> block::BlockResult<()> {
        self.writes.lock().push(lba);
        self.inner.write(lba, data, fua).await
    }
    async fn flush(&self) -> block::BlockResult<()> {
        self.inner.flush().await
    }
    async fn discard(&self, lba: u64, blocks: u64) -> block::BlockResult<()> {
        self.inner.discard(lba, blocks).await
    }
}

/// Commands reach the LU in the order they arrived on the connection, even when
/// the target reads many at once (spawned one by one, the last of every batch
/// would overtake the others: a runtime worker runs the task it spawned last
/// first). A RAID pool recognizes sequential streams by that order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_reach_the_lu_in_arrival_order() {
    let rec = std::sync::Arc::new(Recording {
        inner: std::sync::Arc::new(block::MemVolume::new(512, 8192)),
        writes: parking_lot::Mutex::new(Vec::new()),
    });
    let fx = start_with(Limits::default(), Some(rec.clone())).await;
    let mut c = Client::connect(fx.addrs[0]).await;
    let st = c.login_simple(OPEN, &[("ImmediateData", "Yes")]).await;
    assert_eq!(st, (0, 0));
    // the unit attention every new nexus gets first
    let mut ready = false;
    for _ in 0..3 {
        let tur = c.command(&[0, 0, 0, 0, 0, 0], false, false, 0, true);
        c.send(&tur, false, &[]).await;
        if let TargetPdu::ScsiResponse(s) = c.recv_skip_pings().await.expect("response").pdu {
            ready = s.status == 0;
        }
        if ready {
            break;
        }
    }
    assert!(ready, "TEST UNIT READY never succeeded");
    let n = 32u32;
    for round in 0..4u32 {
        rec.writes.lock().clear();
        // n one-block WRITE(10)s with their data, sent in one go
        let mut wire = Vec::new();
        for i in 0..n {
            let lba = (round * n + i) * 8;
            let b = lba.to_be_bytes();
            let cdb = [0x2a, 0, b[0], b[1], b[2], b[3], 0, 0, 1, 0];
            let cmd = c.command(&cdb, false, true, 512, true);
            let h = encode_initiator_bhs(&cmd, false, 0, 512);
            wire.extend_from_slice(&iscsi_proto::frame::encode_frame(
                &h,
                &[],
                &[i as u8; 512],
                false,
                false,
            ));
        }
        c.send_raw(&wire).await;
        for _ in 0..n {
            match c.recv_skip_pings().await.expect("response").pdu {
                TargetPdu::ScsiResponse(s) => assert_eq!(s.status, 0),
                other => panic!("{other:?}"),
            }
        }
        let want: Vec<u64> = (0..n).map(|i| ((round * n + i) * 8) as u64).collect();
        assert_eq!(*rec.writes.lock(), want, "round {round}");
    }
    fx.shutdown().await;
}

/// Sends `cdb` (with `data` as immediate data) and returns the SCSI status and
/// any Data-In.
async fn scsi(c: &mut Client, cdb: &[u8], data: &[u8], read_len: u32) -> (u8, Vec<u8>) {
    let edtl = if data.is_empty() {
        read_len
    } else {
        data.len() as u32
    };
    let cmd = c.command(cdb, read_len > 0, !data.is_empty(), edtl, true);
    c.send(&cmd, false, data).await;
    let mut din = Vec::new();
    loop {
        let p = c.recv_skip_pings().await.expect("response");
        match p.pdu {
            TargetPdu::ScsiResponse(s) => return (s.status, din),
            TargetPdu::DataIn(d) => {
                din.extend_from_slice(&p.data);
                if let Some(st) = d.status {
                    return (st, din);
                }
            }
            other => panic!("{other:?}"),
        }
    }
}

/// PERSISTENT RESERVE OUT with service action `sa`, keys `key` and `sa_key`.
async fn pr_out(c: &mut Client, sa: u8, key: u64, sa_key: u64) -> u8 {
    let mut p = [0u8; 24];
    p[..8].copy_from_slice(&key.to_be_bytes());
    p[8..16].copy_from_slice(&sa_key.to_be_bytes());
    scsi(c, &[0x5f, sa, 0, 0, 0, 0, 0, 0, 24, 0], &p, 0).await.0
}

async fn logged_in_ready(addr: std::net::SocketAddr, isid: u8) -> Client {
    let mut c = Client::connect_isid(addr, [0x80, 0, 0, 0, 0, isid]).await;
    let st = c
        .login_simple(OPEN, &[("InitialR2T", "No"), ("ImmediateData", "Yes")])
        .await;
    assert_eq!(st, (0, 0));
    for _ in 0..4 {
        if scsi(&mut c, &[0, 0, 0, 0, 0, 0], &[], 0).await.0 == 0 {
            return c;
        }
    }
    panic!("TEST UNIT READY never succeeded");
}

/// Sends a TEST UNIT READY and checks that the next answer on `c` is its
/// response (none for a command aborted before it); returns its status.
async fn next_answer_is_a_tur(c: &mut Client) -> u8 {
    let tur = c.command(&[0, 0, 0, 0, 0, 0], false, false, 0, true);
    let tur_itt = match tur {
        InitiatorPdu::ScsiCommand(ref s) => s.itt,
        _ => unreachable!(),
    };
    c.send(&tur, false, &[]).await;
    match c.recv_skip_pings().await.expect("TUR answer").pdu {
        TargetPdu::ScsiResponse(s) => {
            assert_eq!(s.itt, tur_itt, "another command's answer came first");
            s.status
        }
        other => panic!("{other:?}"),
    }
}

/// PREEMPT AND ABORT aborts the preempted nexus' commands on the LU before it
/// answers: a write of the preempted initiator already at the volume is not
/// answered, and ends before the PREEMPT AND ABORT is answered (it cannot be taken
/// back from a disk; answered earlier, a write the preempting initiator sends next
/// could land before it). PREEMPT alone (the control) lets the same write finish
/// and be answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn preempt_and_abort_aborts_the_preempted_nexus_tasks() {
    // LUN 0: writes below LBA 64 wait at a gate until the test lets them go
    let gated = std::sync::Arc::new(block::HoldVolume::new(std::sync::Arc::new(
        block::MemVolume::new(512, 8192),
    )));
    gated.writes.hold_below(64);
    let fx = start_with(Limits::default(), Some(gated.clone())).await;
    let (ka, kb) = (0xaaaa_u64, 0xbbbb_u64);
    let mut a = logged_in_ready(fx.addrs[0], 1).await;
    let mut b = logged_in_ready(fx.addrs[1], 2).await;
    assert_eq!(pr_out(&mut b, 0x00, 0, kb).await, 0, "register B");
    for (round, (sa, lba, fill)) in [(0x04u8, 8u8, 0x11u8), (0x05, 16, 0x22)]
        .into_iter()
        .enumerate()
    {
        assert_eq!(pr_out(&mut a, 0x00, 0, ka).await, 0, "register A");
        // A's write waits at the volume's gate.
        let cmd = a.command(
            &[0x2a, 0, 0, 0, 0, lba, 0, 0, 8, 0],
            false,
            true,
            4096,
            true,
        );
        let itt = match cmd {
            InitiatorPdu::ScsiCommand(ref s) => s.itt,
            _ => unreachable!(),
        };
        a.send(&cmd, false, &[fill; 4096]).await;
        tokio::time::timeout(Duration::from_secs(20), gated.writes.arrivals(round + 1))
            .await
            .expect("the write never reached the volume");
        if sa == 0x04 {
            assert_eq!(pr_out(&mut b, sa, kb, ka).await, 0, "preempt");
            gated.writes.release(1);
            // PREEMPT alone: the held write goes on and is answered.
            match a.recv_skip_pings().await.expect("write answer").pdu {
                TargetPdu::ScsiResponse(s) => assert_eq!((s.itt, s.status), (itt, 0)),
                other => panic!("{other:?}"),
            }
        } else {
            // PREEMPT AND ABORT waits for the write it aborted
            let preempt = tokio::spawn(async move {
                let st = pr_out(&mut b, sa, kb, ka).await;
                (b, st)
            });
            // the write is aborted before it is let go (released when only
            // the unit attention was raised, it may end, and be answered,
            // before the abort reaches it), and no TUR below is sent while the
            // abort runs (one it catches is never answered)
            aborting(&fx, 1).await;
            // A's registration is gone once A's commands get the unit attention
            // of the preemption (raised before its tasks are aborted)
            let mut attention = false;
            for _ in 0..10_000 {
                if scsi(&mut a, &[0, 0, 0, 0, 0, 0], &[], 0).await.0 == 2 {
                    attention = true;
                    break;
                }
            }
            assert!(attention, "A never saw the preemption");
            assert!(!preempt.is_finished(), "answered while the write was held");
            gated.writes.release(1);
            let (back, st) = preempt.await.unwrap();
            b = back;
            assert_eq!(st, 0, "preempt and abort");
        }
        let (st, data) = scsi(&mut b, &[0x28, 0, 0, 0, 0, lba, 0, 0, 8, 0], &[], 4096).await;
        assert_eq!(st, 0);
        assert!(
            data.iter().all(|&x| x == fill),
            "the write (aborted or not) landed before the preemption was answered"
        );
        if sa == 0x04 {
            // A's next answer is its TEST UNIT READY's: the unit attention of
            // the preemption
            let (st, _) = scsi(&mut a, &[0, 0, 0, 0, 0, 0], &[], 0).await;
            assert_eq!(st, 2);
        }
        // no answer ever comes for the aborted write: A's next one is its TUR's
        next_answer_is_a_tur(&mut a).await;
        for _ in 0..4 {
            if scsi(&mut a, &[0, 0, 0, 0, 0, 0], &[], 0).await.0 == 0 {
                break;
            }
        }
    }
    fx.shutdown().await;
}

/// A LOGICAL UNIT RESET that came through the HA partner aborts this node's
/// tasks on the LU and is taken (answered to the partner) only once they are
/// gone: a write already at the volume is not answered, and ends before the
/// reset does. Before (2026-12-06), the partner's reset raised its unit
/// attention here and left the tasks running.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_through_the_partner_aborts_the_tasks_on_the_lu() {
    let gated = Arc::new(block::HoldVolume::new(Arc::new(block::MemVolume::new(
        512, 8192,
    ))));
    gated.writes.hold_below(64);
    let fx = start_with(Limits::default(), Some(gated.clone())).await;
    let mut a = logged_in_ready(fx.addrs[0], 1).await;
    let cmd = a.command(&[0x2a, 0, 0, 0, 0, 8, 0, 0, 8, 0], false, true, 4096, true);
    a.send(&cmd, false, &[0x33; 4096]).await;
    tokio::time::timeout(Duration::from_secs(20), gated.writes.arrivals(1))
        .await
        .expect("the write never reached the volume");
    let target = fx.reloader.targets()[0].scsi.clone();
    let reset = tokio::spawn(async move {
        target
            .reset_from_partner(0, scsi::ResetKind::LogicalUnit)
            .await
    });
    aborting(&fx, 1).await;
    assert!(
        !reset.is_finished(),
        "taken while the aborted write was held"
    );
    gated.writes.release(1);
    let taken = tokio::time::timeout(Duration::from_secs(20), reset)
        .await
        .expect("the reset never ended")
        .unwrap();
    assert_eq!(taken, Ok(()));
    // no answer for the aborted write: the next is the TEST UNIT READY's,
    // with the reset's unit attention
    assert_eq!(next_answer_is_a_tur(&mut a).await, 2);
    fx.shutdown().await;
}

/// Waits until `n` commands are aborted and still ending, all sessions together.
async fn aborting(fx: &Fixture, n: usize) {
    for _ in 0..20_000 {
        let now: usize = fx.sessions.list().iter().map(|s| s.commands_aborting).sum();
        if now == n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    panic!("never {n} commands aborting");
}

/// An ABORT TASK is answered only once the write it aborts, already handed to
/// the volume, has ended: a disk engine does not take back a request it was
/// given, and answered earlier, the initiator's next write to the same blocks
/// could land first and then be overwritten by the aborted one. (Before, the
/// command's future was dropped and the abort answered at once.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abort_is_answered_once_the_write_it_aborts_has_ended() {
    let gated = Arc::new(block::HoldVolume::new(Arc::new(block::MemVolume::new(
        512, 8192,
    ))));
    let fx = start_with(Limits::default(), Some(gated.clone())).await;
    let mut a = logged_in_ready(fx.addrs[0], 1).await;
    gated.writes.hold();
    let cmd = a.command(&[0x2a, 0, 0, 0, 0, 8, 0, 0, 8, 0], false, true, 4096, true);
    let (itt, cmd_sn) = match cmd {
        InitiatorPdu::ScsiCommand(ref s) => (s.itt, s.cmd_sn),
        _ => unreachable!(),
    };
    a.send(&cmd, false, &[0x11; 4096]).await;
    tokio::time::timeout(Duration::from_secs(20), gated.writes.arrivals(1))
        .await
        .expect("the write never reached the volume");
    let tmf_itt = a.next_itt();
    let tmf = InitiatorPdu::TaskMgmt(TaskMgmtRequest {
        function: 1,
        lun: 0,
        itt: tmf_itt,
        rtt: itt,
        cmd_sn: a.cmd_sn,
        exp_stat_sn: a.exp_stat_sn,
        ref_cmd_sn: cmd_sn,
        exp_data_sn: 0,
    });
    a.send(&tmf, true, &[]).await;
    aborting(&fx, 1).await;
    // While the write is held nothing may be answered (the drain time, 5 s, is
    // longer than this window; without the wait the answer came at once).
    if let Ok(p) = tokio::time::timeout(Duration::from_secs(1), a.recv_skip_pings()).await {
        panic!(
            "answered while the aborted write was under way: {:?}",
            p.map(|p| p.pdu)
        );
    }
    gated.writes.open();
    match a.recv_skip_pings().await.expect("tmf response").pdu {
        TargetPdu::TaskMgmtResponse(r) => {
            assert_eq!((r.itt, r.response), (tmf_itt, tmf_response::COMPLETE))
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(fx.sessions.list()[0].commands_aborting, 0);
    // it ended before the answer (landed, not answered): the next write lands
    // after it
    let (st, data) = scsi(&mut a, &[0x28, 0, 0, 0, 0, 8, 0, 0, 8, 0], &[], 4096).await;
    assert_eq!((st, data), (0, vec![0x11; 4096]));
    let (st, _) = scsi(&mut a, &[0x2a, 0, 0, 0, 0, 8, 0, 0, 8, 0], &[0x22; 4096], 0).await;
    assert_eq!(st, 0);
    let (st, data) = scsi(&mut a, &[0x28, 0, 0, 0, 0, 8, 0, 0, 8, 0], &[], 4096).await;
    assert_eq!((st, data), (0, vec![0x22; 4096]));
    fx.shutdown().await;
}

/// A normal login as `initiator` (its own ISID) to the open target, with the
/// power-on unit attention of LUNs `luns` taken.
async fn login_as(addr: std::net::SocketAddr, initiator: &str, isid: u8, luns: &[u64]) -> Client {
    let mut c = Client::connect_isid(addr, [0x80, 0, 0, 0, 0x61, isid]).await;
    assert_eq!(c.login_simple_as(initiator, OPEN, &[]).await, (0, 0));
    for &lun in luns {
        let mut tur = c.command(&[0, 0, 0, 0, 0, 0], false, false, 0, true);
        if let InitiatorPdu::ScsiCommand(ref mut s) = tur {
            s.lun = iscsi_proto::lun_to_wire(lun);
        }
        c.send(&tur, false, &[]).await;
        c.recv_skip_pings().await.expect("unit attention");
    }
    c
}

/// Task management `function` on LUN 0, immediate; its response.
async fn task_management(c: &mut Client, function: u8) -> u8 {
    let itt = c.next_itt();
    let tmf = InitiatorPdu::TaskMgmt(TaskMgmtRequest {
        function,
        lun: 0,
        itt,
        rtt: iscsi_proto::RESERVED_TAG,
        cmd_sn: c.cmd_sn,
        exp_stat_sn: c.exp_stat_sn,
        ref_cmd_sn: 0,
        exp_data_sn: 0,
    });
    c.send(&tmf, true, &[]).await;
    match c.recv_skip_pings().await.expect("tmf response").pdu {
        TargetPdu::TaskMgmtResponse(r) => {
            assert_eq!(r.itt, itt);
            r.response
        }
        other => panic!("{other:?}"),
    }
}

/// A host group of `initiators` seeing `luns` (its number, the target's).
fn host_group(name: &str, initiators: &[&str], luns: &[(u64, u64)]) -> scsi::HostGroup {
    scsi::HostGroup {
        name: name.into(),
        initiators: initiators.iter().map(|i| i.to_string()).collect(),
        chap_users: vec![],
        luns: luns.to_vec(),
    }
}

/// With LUN masking each initiator numbers the LUs its own way: a LOGICAL UNIT
/// RESET aborts the tasks of every session on the LU reset, each found by the
/// number its session gives that LU, and none on another LU that happens to
/// carry the same number elsewhere. (Before, the reset's LUN number was
/// compared with every session's own numbers: another initiator's write to the
/// LU reset went on, and its commands on an unrelated LU were aborted.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lun_reset_aborts_the_tasks_on_that_lu_as_each_initiator_numbers_it() {
    const X: &str = "iqn.2026-01.org.test:x";
    const Y: &str = "iqn.2026-01.org.test:y";
    let held = Arc::new(block::HoldVolume::new(Arc::new(block::MemVolume::new(
        512, 8192,
    ))));
    let open = scsi_target(OPEN, Some(held.clone()));
    let cfg1 = lun_config(0xee, "SERIAL0002");
    open.add_lun(1, cfg1, Arc::new(block::MemVolume::new(512, 8192)), None)
        .unwrap();
    // X sees the held LU as its LUN 0; Y sees the other LU as its 0 and the
    // held one as its 1
    open.set_host_groups(vec![
        host_group("x", &[X], &[(0, 0)]),
        host_group("y", &[Y], &[(0, 1), (1, 0)]),
    ])
    .unwrap();
    let fx = start_with_scsi(Limits::default(), open).await;
    let mut x = login_as(fx.addrs[0], X, 1, &[0]).await;
    let mut y = login_as(fx.addrs[0], Y, 2, &[0, 1]).await;
    // Y writes to the held LU (its LUN 1): the write waits at the disk
    held.writes.hold();
    let mut w = y.command(&[0x2a, 0, 0, 0, 0, 7, 0, 0, 1, 0], false, true, 512, true);
    if let InitiatorPdu::ScsiCommand(ref mut s) = w {
        s.lun = iscsi_proto::lun_to_wire(1);
    }
    y.send(&w, false, &[0xee; 512]).await;
    tokio::time::timeout(Duration::from_secs(10), held.writes.arrivals(1))
        .await
        .expect("Y's write reached the disk");
    // X resets its LUN 0: the held LU
    let tmf_itt = x.next_itt();
    let tmf = InitiatorPdu::TaskMgmt(TaskMgmtRequest {
        function: 5,
        lun: 0,
        itt: tmf_itt,
        rtt: iscsi_proto::RESERVED_TAG,
        cmd_sn: x.cmd_sn,
        exp_stat_sn: x.exp_stat_sn,
        ref_cmd_sn: 0,
        exp_data_sn: 0,
    });
    x.send(&tmf, true, &[]).await;
    // Y's write is aborted; being at the disk, it ends before the reset is
    // answered
    aborting(&fx, 1).await;
    held.writes.open();
    match x.recv_skip_pings().await.expect("tmf response").pdu {
        TargetPdu::TaskMgmtResponse(r) => {
            assert_eq!((r.itt, r.response), (tmf_itt, tmf_response::COMPLETE))
        }
        other => panic!("{other:?}"),
    }
    let mut got = None;
    for _ in 0..2 {
        let mut r = y.command(&[0x28, 0, 0, 0, 0, 7, 0, 0, 1, 0], true, false, 512, true);
        if let InitiatorPdu::ScsiCommand(ref mut s) = r {
            s.lun = iscsi_proto::lun_to_wire(1);
        }
        y.send(&r, false, &[]).await;
        let mut data = Vec::new();
        let status = loop {
            let p = y.recv_skip_pings().await.expect("read answer");
            match p.pdu {
                TargetPdu::DataIn(d) => {
                    data.extend_from_slice(&p.data);
                    if let Some(st) = d.status {
                        break st;
                    }
                }
                TargetPdu::ScsiResponse(s) => break s.status,
                // the aborted write is never answered
                other => panic!("{other:?}"),
            }
        };
        if status == 0 {
            got = Some(data);
            break;
        }
    }
    assert_eq!(
        got.expect("read"),
        vec![0xeeu8; 512],
        "the aborted write, at the disk when aborted, ended before the reset's answer"
    );
    fx.shutdown().await;
}

/// With host groups, a TARGET WARM or COLD RESET reaches only what its
/// initiator sees: another host's LU keeps its write in progress, is not
/// reset (no unit attention for its initiator, its SPC-2 reservation kept),
/// and on a cold reset that host's session stays. (Before, any initiator of
/// the target reset every LU, dropping every host's reservations and tokens,
/// and a cold reset closed every session of the target.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_target_reset_reaches_only_the_lus_its_initiator_sees() {
    const X: &str = "iqn.2026-01.org.test:x";
    const Y: &str = "iqn.2026-01.org.test:y";
    const Z: &str = "iqn.2026-01.org.test:z";
    let held = Arc::new(block::HoldVolume::new(Arc::new(block::MemVolume::new(
        512, 8192,
    ))));
    let open = scsi_target(OPEN, Some(Arc::new(block::MemVolume::new(512, 8192))));
    open.add_lun(1, lun_config(0xee, "SERIAL0002"), held.clone(), None)
        .unwrap();
    // X sees LU 0; Y and Z see LU 1, the held one, as their LUN 0
    open.set_host_groups(vec![
        host_group("x", &[X], &[(0, 0)]),
        host_group("yz", &[Y, Z], &[(0, 1)]),
    ])
    .unwrap();
    let fx = start_with_scsi(Limits::default(), open).await;
    let mut y = login_as(fx.addrs[0], Y, 2, &[0]).await;
    let mut z = login_as(fx.addrs[0], Z, 3, &[0]).await;
    // Y reserves its LU (SPC-2 RESERVE(6)): Z's reads conflict
    assert_eq!(scsi(&mut y, &[0x16, 0, 0, 0, 0, 0], &[], 0).await.0, 0);
    let read = [0x28, 0, 0, 0, 0, 7, 0, 0, 1, 0];
    assert_eq!(scsi(&mut z, &read, &[], 512).await.0, 0x18);
    // Y's write waits at the disk
    held.writes.hold();
    let w = y.command(&[0x2a, 0, 0, 0, 0, 7, 0, 0, 1, 0], false, true, 512, true);
    y.send(&w, false, &[0xee; 512]).await;
    tokio::time::timeout(Duration::from_secs(10), held.writes.arrivals(1))
        .await
        .expect("Y's write reached the disk");
    for function in [6u8, 7] {
        // X, which sees only LU 0, resets the target (warm, then cold)
        let mut x = login_as(fx.addrs[0], X, 1, &[0]).await;
        assert_eq!(
            task_management(&mut x, function).await,
            tmf_response::COMPLETE
        );
        if function == 6 {
            // Y's write was not aborted: it completes once the disk goes on
            held.writes.open();
            let answer = tokio::time::timeout(Duration::from_secs(20), y.recv_skip_pings())
                .await
                .expect("Y's write was aborted: never answered");
            match answer.expect("the write's answer").pdu {
                TargetPdu::ScsiResponse(r) => assert_eq!(r.status, 0),
                other => panic!("{other:?}"),
            }
        }
        // Y's LU was not reset: no unit attention, the reservation holds
        assert_eq!(
            scsi(&mut y, &[0, 0, 0, 0, 0, 0], &[], 0).await.0,
            0,
            "function {function}: Y's LU was reset"
        );
        assert_eq!(scsi(&mut z, &read, &[], 512).await.0, 0x18);
    }
    fx.shutdown().await;
}

/// A write of another session still collecting its Data-Out when a LOGICAL
/// UNIT RESET is answered is aborted too: when its data then comes it is never
/// executed nor answered. (Before, only the resetting connection's own pending
/// writes were dropped: once the other initiator's next command had taken the
/// reset's unit attention, its old write landed after the reset.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lun_reset_aborts_another_sessions_write_still_waiting_for_data() {
    let fx = start(Limits::default()).await;
    let mut x = logged_in_ready(fx.addrs[0], 1).await;
    let mut y = Client::connect_isid(fx.addrs[0], [0x80, 0, 0, 0, 0, 2]).await;
    let st = y
        .login_simple(OPEN, &[("InitialR2T", "Yes"), ("ImmediateData", "No")])
        .await;
    assert_eq!(st, (0, 0));
    for _ in 0..4 {
        if scsi(&mut y, &[0, 0, 0, 0, 0, 0], &[], 0).await.0 == 0 {
            break;
        }
    }
    // Y's write of block 9: the target asks for its data
    let w = y.command(&[0x2a, 0, 0, 0, 0, 9, 0, 0, 1, 0], false, true, 512, true);
    let itt = match w {
        InitiatorPdu::ScsiCommand(ref s) => s.itt,
        _ => unreachable!(),
    };
    y.send(&w, false, &[]).await;
    let r2t = match y.recv_skip_pings().await.expect("R2T").pdu {
        TargetPdu::R2t(r) => r,
        other => panic!("{other:?}"),
    };
    // X resets the LU
    assert_eq!(task_management(&mut x, 5).await, tmf_response::COMPLETE);
    // Y's next command takes the reset's unit attention...
    let (st, _) = scsi(&mut y, &[0, 0, 0, 0, 0, 0], &[], 0).await;
    assert_eq!(st, 2, "the reset's unit attention");
    // ...then the old write's data comes
    let d = InitiatorPdu::DataOut(DataOut {
        final_bit: true,
        lun: 0,
        itt,
        ttt: r2t.ttt,
        exp_stat_sn: y.exp_stat_sn,
        data_sn: 0,
        buffer_offset_bytes: 0,
    });
    y.send(&d, false, &[0xdd; 512]).await;
    // Y's next answer is its TEST UNIT READY's, not the write's
    next_answer_is_a_turs(&mut y, "the aborted write was executed and answered").await;
    assert_eq!(
        read_block_9(&mut x).await,
        vec![0u8; 512],
        "the aborted write landed"
    );
    fx.shutdown().await;
}

/// Sends a TEST UNIT READY on `c` and checks that the next answer is its
/// (`why`: what an answer to something else would mean).
async fn next_answer_is_a_turs(c: &mut Client, why: &str) {
    let tur = c.command(&[0, 0, 0, 0, 0, 0], false, false, 0, true);
    let tur_itt = match tur {
        InitiatorPdu::ScsiCommand(ref s) => s.itt,
        _ => unreachable!(),
    };
    c.send(&tur, false, &[]).await;
    match c.recv_skip_pings().await.expect("TUR answer").pdu {
        TargetPdu::ScsiResponse(s) => assert_eq!(s.itt, tur_itt, "{why}"),
        other => panic!("{other:?}"),
    }
}

/// Block 9 of LUN 0 as `c` reads it (past unit attentions).
async fn read_block_9(c: &mut Client) -> Vec<u8> {
    for _ in 0..4 {
        let (st, d) = scsi(c, &[0x28, 0, 0, 0, 0, 9, 0, 0, 1, 0], &[], 512).await;
        if st == 0 {
            return d;
        }
    }
    panic!("block 9 never read");
}

/// A write the volume still holds past the drain time keeps a TARGET RESET
/// from being answered COMPLETE (it is REJECTED: the initiator escalates) and
/// keeps a logout unanswered until the write has ended. Before (review of
/// 2026-12-06), both went on after the drain time as if the write had
/// ended: answered, the initiator writes the same blocks anew, and the old
/// write, finished later by the disk, lands over them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_or_logout_does_not_go_on_past_an_aborted_write_at_the_volume() {
    let gated = Arc::new(block::HoldVolume::new(Arc::new(block::MemVolume::new(
        512, 8192,
    ))));
    gated.writes.hold_below(64);
    let limits = Limits {
        drain_timeout_ms: 300,
        ..Limits::default()
    };
    let fx = start_with(limits, Some(gated.clone())).await;
    let mut a = logged_in_ready(fx.addrs[0], 1).await;
    let cmd = a.command(&[0x2a, 0, 0, 0, 0, 8, 0, 0, 8, 0], false, true, 4096, true);
    a.send(&cmd, false, &[0x11; 4096]).await;
    tokio::time::timeout(Duration::from_secs(20), gated.writes.arrivals(1))
        .await
        .expect("the write never reached the volume");
    assert_eq!(
        task_management(&mut a, 6).await,
        tmf_response::REJECTED,
        "a target reset answered with an aborted write still at the volume"
    );
    let itt = a.next_itt();
    let lo = InitiatorPdu::Logout(LogoutRequest {
        reason: 0,
        itt,
        cid: 0,
        cmd_sn: a.cmd_sn,
        exp_stat_sn: a.exp_stat_sn,
    });
    a.send(&lo, true, &[]).await;
    let logout = tokio::spawn(async move {
        let p = a.recv_skip_pings().await.expect("logout response");
        matches!(p.pdu, TargetPdu::LogoutResponse(l) if l.response == 0 && l.itt == itt)
    });
    // given 1.5 s (five drain times), a logout that does not wait has answered
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(
        !logout.is_finished(),
        "the logout was answered while the write was at the volume"
    );
    gated.writes.open();
    assert!(tokio::time::timeout(Duration::from_secs(20), logout)
        .await
        .expect("the logout was never answered")
        .unwrap());
    fx.shutdown().await;
}

/// A write that arrived before another session's LUN RESET, and waited
/// through it for the node's buffer budget, is aborted by it: never
/// executed, never answered. Before (review of 2026-12-06), its abort
/// generation was taken after the wait, so it ran after the reset was
/// answered, over whatever the resetting host wrote next.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_waiting_for_the_buffer_budget_through_a_reset_is_aborted() {
    let budget = block::BufferBudget::new(8192);
    let fx = start_with_budget(Limits::default(), scsi_target(OPEN, None), budget.clone()).await;
    let mut x = logged_in_ready(fx.addrs[0], 1).await;
    // W takes the whole budget with a write whose data it never sends
    let mut w = Client::connect_isid(fx.addrs[0], [0x80, 0, 0, 0, 0, 3]).await;
    let st = w
        .login_simple(OPEN, &[("InitialR2T", "Yes"), ("ImmediateData", "No")])
        .await;
    assert_eq!(st, (0, 0));
    for _ in 0..4 {
        if scsi(&mut w, &[0, 0, 0, 0, 0, 0], &[], 0).await.0 == 0 {
            break;
        }
    }
    let big = w.command(
        &[0x2a, 0, 0, 0, 0, 100, 0, 0, 16, 0],
        false,
        true,
        8192,
        true,
    );
    w.send(&big, false, &[]).await;
    match w.recv_skip_pings().await.expect("R2T").pdu {
        TargetPdu::R2t(_) => {}
        other => panic!("{other:?}"),
    }
    // Y's write of block 9 waits for the budget
    let mut y = logged_in_ready(fx.addrs[0], 2).await;
    let cmd = y.command(&[0x2a, 0, 0, 0, 0, 9, 0, 0, 1, 0], false, true, 512, true);
    y.send(&cmd, false, &[0xdd; 512]).await;
    tokio::time::timeout(Duration::from_secs(20), async {
        // (W and Y come from one address: Y waits at their source's share,
        // which is the whole of this small budget)
        while {
            let s = budget.status();
            s.waits + s.source_waits + s.session_waits
        } == 0
        {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("Y's write never waited for the budget");
    // X resets the LU (nothing of Y's runs yet: answered at once)
    assert_eq!(task_management(&mut x, 5).await, tmf_response::COMPLETE);
    // W goes: its budget comes back, and Y's write gets it
    drop(w);
    // Y's next answer is its TEST UNIT READY's (the reset's unit attention),
    // not the write's
    next_answer_is_a_turs(
        &mut y,
        "the write that waited through the reset was executed and answered",
    )
    .await;
    let data = read_block_9(&mut x).await;
    assert!(data.iter().all(|&b| b == 0), "the aborted write landed");
    fx.shutdown().await;
}
