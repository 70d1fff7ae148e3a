use super::*;
use iscsi_proto::login::{ChapCredentials, LoginOutcome};
use iscsi_proto::pdu::parse_bhs;
use iscsi_proto::target::LoginResponse;
use iscsi_proto::text::encode_text;
use iscsi_proto::{LoginConfig, LoginNegotiator, OperationalLimits, TargetAuth};
use std::sync::Arc;

const INI: &str = "iqn.2026-01.org.test:ini";
const TGT: &str = "iqn.2026-01.org.freesan:t";

fn creds(u: &str, s: &str) -> ChapCredentials {
    ChapCredentials {
        user: u.into(),
        secret: s.into(),
    }
}

fn target(chap: bool, mutual: bool, limits: OperationalLimits) -> LoginNegotiator {
    let cfg = LoginConfig {
        targets: vec![TargetAuth {
            name: TGT.into(),
            alias: None,
            chap: chap.then(|| creds("alice", "alice-secret-12")),
            mutual: mutual.then(|| creds("tgt", "target-secret-12")),
            allowed_initiators: vec![],
            ..TargetAuth::default()
        }],
        discovery_chap: None,
        discovery_mutual: None,
        discovery_refuse_md5: false,
        limits,
    };
    LoginNegotiator::new(Arc::new(cfg), 3)
}

/// Runs our state machine against the real target-side negotiator of iscsi-proto.
fn run(opts: &LoginOptions, mut t: LoginNegotiator) -> Result<LoginParams, InitiatorError> {
    let mut sm = LoginStateMachine::new(opts, false);
    let mut step = sm.start();
    for _ in 0..20 {
        let (header, data) = match step {
            LoginStep::Done(p) => return Ok(p),
            LoginStep::Send { header, data } => (header, data),
        };
        let bhs = parse_bhs(&header).unwrap();
        assert!(bhs.immediate);
        let iscsi_proto::InitiatorPdu::Login(req) = bhs.pdu else {
            panic!("not a login request")
        };
        assert_eq!(bhs.data_len_bytes as usize, data.len());
        let mut r = t.step(&req, &data);
        if let LoginOutcome::Complete(_) = r.outcome {
            r.header.tsih = 9;
        }
        step = sm.on_response(&r.header, &r.seq, &r.data)?;
    }
    panic!("login did not end")
}

fn opts() -> LoginOptions {
    LoginOptions::new(INI, TGT)
}

#[test]
fn no_auth_operational_values() {
    let limits = OperationalLimits {
        max_recv_data_segment_bytes: 65536,
        max_burst_bytes: 512 * 1024,
        first_burst_bytes: 128 * 1024,
        ..OperationalLimits::default()
    };
    let p = run(&opts(), target(false, false, limits)).unwrap();
    assert_eq!(p.tsih, 9);
    assert_eq!(p.tpgt, 3);
    assert_eq!(p.send_data_segment_bytes_max, 65536);
    assert_eq!(p.recv_data_segment_bytes_max, 256 * 1024);
    assert_eq!(p.max_burst_bytes, 512 * 1024);
    assert_eq!(p.first_burst_bytes, 128 * 1024);
    assert!(p.immediate_data);
    assert!(!p.initial_r2t);
    assert!(!p.header_digest && !p.data_digest);
    assert!(iscsi_proto::sn_le(p.exp_cmd_sn, p.max_cmd_sn));
}

#[test]
fn digests_and_target_initial_r2t() {
    let mut o = opts();
    o.header_digest = true;
    o.data_digest = true;
    let limits = OperationalLimits {
        initial_r2t: true,
        immediate_data: false,
        ..OperationalLimits::default()
    };
    let p = run(&o, target(false, false, limits)).unwrap();
    assert!(p.header_digest && p.data_digest);
    assert!(p.initial_r2t);
    assert!(!p.immediate_data);
}

#[test]
fn chap_one_way_mutual_and_wrong_secret() {
    let mut o = opts();
    o.chap = Some(("alice".into(), "alice-secret-12".into()));
    run(&o, target(true, false, OperationalLimits::default())).unwrap();
    o.mutual_chap = Some(("tgt".into(), "target-secret-12".into()));
    run(&o, target(true, true, OperationalLimits::default())).unwrap();
    // The target proves itself with another secret than we expect.
    o.mutual_chap = Some(("tgt".into(), "not-the-secret".into()));
    assert!(matches!(
        run(&o, target(true, true, OperationalLimits::default())),
        Err(InitiatorError::Auth(_))
    ));
    let mut o = opts();
    o.chap = Some(("alice".into(), "wrong-secret-99".into()));
    assert!(matches!(
        run(&o, target(true, false, OperationalLimits::default())),
        Err(InitiatorError::LoginFailed {
            class: 2,
            detail: 1
        })
    ));
    // No credentials for a target that requires CHAP.
    assert!(matches!(
        run(&opts(), target(true, false, OperationalLimits::default())),
        Err(InitiatorError::LoginFailed { class: 2, .. })
    ));
    // Credentials offered to a target without authentication: it picks None.
    let mut o = opts();
    o.chap = Some(("alice".into(), "alice-secret-12".into()));
    run(&o, target(false, false, OperationalLimits::default())).unwrap();
}

/// The initiator offers every CHAP algorithm, strongest first: a target
/// that refuses the weak ones (MD5, SHA-1: `chap_md5 = false`) takes it,
/// mutual CHAP included (before, it offered MD5 alone and was refused, so
/// `freesan bench` could not log in to such a target).
#[test]
fn chap_with_a_target_that_refuses_md5() {
    let cfg = LoginConfig {
        targets: vec![TargetAuth {
            name: TGT.into(),
            alias: None,
            chap: Some(creds("alice", "alice-secret-12")),
            mutual: Some(creds("tgt", "target-secret-12")),
            allowed_initiators: vec![],
            refuse_md5: true,
            ..TargetAuth::default()
        }],
        discovery_chap: None,
        discovery_mutual: None,
        discovery_refuse_md5: false,
        limits: OperationalLimits::default(),
    };
    let mut o = opts();
    o.chap = Some(("alice".into(), "alice-secret-12".into()));
    o.mutual_chap = Some(("tgt".into(), "target-secret-12".into()));
    run(&o, LoginNegotiator::new(Arc::new(cfg.clone()), 3)).unwrap();
    o.mutual_chap = Some(("tgt".into(), "not-the-secret".into()));
    assert!(matches!(
        run(&o, LoginNegotiator::new(Arc::new(cfg), 3)),
        Err(InitiatorError::Auth(_))
    ));
}

fn resp(transit: bool, cont: bool, csg: u8, nsg: u8) -> LoginResponse {
    LoginResponse {
        transit,
        cont,
        csg,
        nsg,
        version_max: 0,
        version_active: 0,
        isid: [0; 6],
        tsih: 0,
        itt: 0,
        status_class: 0,
        status_detail: 0,
    }
}

fn seq(stat_sn: u32) -> SeqNumbers {
    SeqNumbers {
        stat_sn,
        exp_cmd_sn: 1,
        max_cmd_sn: 32,
    }
}

#[test]
fn scripted_continuation_and_not_ready() {
    let mut sm = LoginStateMachine::new(&opts(), false);
    let LoginStep::Send { data, .. } = sm.start() else {
        panic!()
    };
    let text = String::from_utf8(data).unwrap();
    assert!(text.contains("InitialR2T=No\0") && text.contains("ImmediateData=Yes\0"));
    assert!(text.contains("TargetName=iqn.2026-01.org.freesan:t\0"));
    // The target splits its answer over two PDUs (C bit), then does not transit.
    let part1 = b"HeaderDigest=None\0MaxRecvDataSeg";
    let s = sm
        .on_response(&resp(false, true, 1, 0), &seq(40), part1)
        .unwrap();
    let LoginStep::Send { header, data } = s else {
        panic!()
    };
    assert!(data.is_empty());
    assert_eq!(u32::from_be_bytes(header[28..32].try_into().unwrap()), 41);
    let part2 = encode_text(&[("mentLength", "4096")]);
    let s = sm
        .on_response(
            &resp(false, false, 1, 0),
            &seq(41),
            &[&part2[..], b"InitialR2T=Yes\0"].concat(),
        )
        .unwrap();
    assert!(matches!(s, LoginStep::Send { .. }));
    let mut last = resp(true, false, 1, 3);
    last.tsih = 4;
    let LoginStep::Done(p) = sm.on_response(&last, &seq(42), b"").unwrap() else {
        panic!("login should be complete")
    };
    assert_eq!(p.send_data_segment_bytes_max, 4096);
    assert!(p.initial_r2t);
    assert_eq!(p.exp_stat_sn, 43);
    assert_eq!((p.exp_cmd_sn, p.max_cmd_sn), (1, 32));
}

#[test]
fn scripted_failures() {
    let mut sm = LoginStateMachine::new(&opts(), false);
    sm.start();
    let mut r = resp(false, false, 1, 0);
    r.status_class = 2;
    r.status_detail = 3;
    assert!(matches!(
        sm.on_response(&r, &seq(1), b""),
        Err(InitiatorError::LoginFailed {
            class: 2,
            detail: 3
        })
    ));
    let mut sm = LoginStateMachine::new(&opts(), false);
    sm.start();
    assert!(sm
        .on_response(&resp(false, false, 1, 0), &seq(1), b"garbage")
        .is_err());
    let mut sm = LoginStateMachine::new(&opts(), false);
    sm.start();
    assert!(sm
        .on_response(&resp(true, false, 1, 3), &seq(1), b"ErrorRecoveryLevel=2\0")
        .is_err());
    // Final response without TSIH.
    let mut sm = LoginStateMachine::new(&opts(), false);
    sm.start();
    assert!(sm
        .on_response(&resp(true, false, 1, 3), &seq(1), b"")
        .is_err());
    // A target that never transits is cut off.
    let mut sm = LoginStateMachine::new(&opts(), false);
    sm.start();
    let mut n = 0;
    while sm
        .on_response(&resp(false, false, 1, 0), &seq(n), b"")
        .is_ok()
    {
        n += 1;
        assert!(n < 100);
    }
}
