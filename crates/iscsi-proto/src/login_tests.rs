use super::*;
use crate::text::{encode_text, parse_text};
use rand::SeedableRng;

const INI: &str = "iqn.2026-01.org.test:ini";
const TGT: &str = "iqn.2026-01.org.freesan:t1";
const SECURE: &str = "iqn.2026-01.org.freesan:secure";
const PER_INI: &str = "iqn.2026-01.org.freesan:per-initiator";
const INI2: &str = "iqn.2026-01.org.test:ini2";
const INI3: &str = "iqn.2026-01.org.test:ini3";

fn creds(u: &str, s: &str) -> ChapCredentials {
    ChapCredentials {
        user: u.into(),
        secret: s.into(),
    }
}

fn config() -> Arc<LoginConfig> {
    Arc::new(LoginConfig {
        targets: vec![
            TargetAuth {
                name: TGT.into(),
                alias: Some("first".into()),
                ..TargetAuth::default()
            },
            TargetAuth {
                name: SECURE.into(),
                alias: None,
                chap: Some(creds("alice", "alicesecret1")),
                mutual: Some(creds("target", "targetsecret")),
                allowed_initiators: vec![INI.into(), INI2.into(), INI3.into()],
                chap_initiators: vec![InitiatorChap {
                    initiator: INI2.into(),
                    creds: creds("bob", "bobsecret-12"),
                }],
                refuse_md5: false,
            },
            TargetAuth {
                name: PER_INI.into(),
                chap_initiators: vec![InitiatorChap {
                    initiator: INI2.into(),
                    creds: creds("bob", "bobsecret-12"),
                }],
                ..TargetAuth::default()
            },
        ],
        discovery_chap: None,
        discovery_mutual: None,
        discovery_refuse_md5: false,
        limits: OperationalLimits::default(),
    })
}

fn negotiator() -> LoginNegotiator {
    LoginNegotiator::with_rng(config(), 7, Box::new(rand::rngs::StdRng::seed_from_u64(1)))
}

fn req(csg: u8, nsg: u8, transit: bool) -> LoginRequest {
    LoginRequest {
        transit,
        cont: false,
        csg,
        nsg,
        version_max: 0,
        version_min: 0,
        isid: [0x80, 0, 0, 1, 2, 3],
        tsih: 0,
        itt: 1,
        cid: 0,
        cmd_sn: 10,
        exp_stat_sn: 100,
    }
}

fn keys(step: &LoginStep) -> Vec<(String, String)> {
    parse_text(&step.data).unwrap()
}

fn get<'a>(kv: &'a [(String, String)], k: &str) -> Option<&'a str> {
    kv.iter().find(|(x, _)| x == k).map(|(_, v)| v.as_str())
}

fn failed(step: &LoginStep) -> Option<u16> {
    match step.outcome {
        LoginOutcome::Failed(s) => {
            assert_eq!(
                ((step.header.status_class as u16) << 8) | step.header.status_detail as u16,
                s
            );
            Some(s)
        }
        _ => None,
    }
}

#[test]
fn no_auth_login_through_all_stages() {
    let mut n = negotiator();
    let s1 = n.step(
        &req(0, 1, true),
        &encode_text(&[
            ("InitiatorName", INI),
            ("SessionType", "Normal"),
            ("TargetName", TGT),
            ("AuthMethod", "None"),
        ]),
    );
    assert_eq!(s1.outcome, LoginOutcome::Continue);
    assert!(s1.header.transit);
    assert_eq!((s1.header.csg, s1.header.nsg), (0, 1));
    assert_eq!(s1.seq.stat_sn, 100);
    assert_eq!(s1.seq.exp_cmd_sn, 10);
    let kv = keys(&s1);
    assert_eq!(get(&kv, "AuthMethod"), Some("None"));
    assert_eq!(get(&kv, "TargetPortalGroupTag"), Some("7"));
    let s2 = n.step(
        &req(1, 3, true),
        &encode_text(&[
            ("HeaderDigest", "CRC32C,None"),
            ("DataDigest", "None"),
            ("MaxRecvDataSegmentLength", "65536"),
            ("InitialR2T", "No"),
            ("ImmediateData", "Yes"),
            ("MaxBurstLength", "262144"),
            ("FirstBurstLength", "65536"),
            ("X-Unknown", "1"),
        ]),
    );
    assert_eq!(s2.seq.stat_sn, 101);
    let kv = keys(&s2);
    assert_eq!(get(&kv, "HeaderDigest"), Some("CRC32C"));
    assert_eq!(get(&kv, "X-Unknown"), Some("NotUnderstood"));
    assert_eq!(get(&kv, "MaxRecvDataSegmentLength"), Some("262144"));
    assert_eq!(get(&kv, "TargetAlias"), Some("first"));
    let LoginOutcome::Complete(neg) = s2.outcome else {
        panic!("{:?}", s2.outcome)
    };
    assert!(neg.header_digest && !neg.data_digest);
    assert_eq!(neg.send_data_segment_bytes_max, 65536);
    assert_eq!(neg.recv_data_segment_bytes_max, 262_144);
    assert!(!neg.initial_r2t && neg.immediate_data);
    assert_eq!(neg.target_index, Some(0));
    assert_eq!(neg.exp_cmd_sn, 10);
    assert_eq!(neg.next_stat_sn, 102);
    assert_eq!(neg.tpgt, 7);
    // Anything after completion is an error.
    assert_eq!(
        failed(&n.step(&req(3, 3, true), &[])),
        Some(status::INITIATOR_ERROR)
    );
}

#[test]
fn operational_stage_first_and_straight_to_full_feature() {
    let mut n = negotiator();
    let s = n.step(
        &req(1, 3, true),
        &encode_text(&[("InitiatorName", INI), ("TargetName", TGT)]),
    );
    let LoginOutcome::Complete(neg) = s.outcome else {
        panic!()
    };
    assert_eq!(neg.session_type, SessionType::Normal);
    assert_eq!(neg.send_data_segment_bytes_max, 8192);
    let mut n = negotiator();
    let s = n.step(
        &req(0, 3, true),
        &encode_text(&[("InitiatorName", INI), ("TargetName", TGT)]),
    );
    assert!(matches!(s.outcome, LoginOutcome::Complete(_)));
    assert!(get(&keys(&s), "MaxRecvDataSegmentLength").is_some());
}

#[test]
fn identity_errors() {
    let cases: &[(&[(&str, &str)], u16)] = &[
        (&[("TargetName", TGT)], status::MISSING_PARAMETER),
        (&[("InitiatorName", INI)], status::MISSING_PARAMETER),
        (
            &[("InitiatorName", INI), ("TargetName", "iqn.nope")],
            status::NOT_FOUND,
        ),
        (
            &[("InitiatorName", "iqn.other"), ("TargetName", SECURE)],
            status::FORBIDDEN,
        ),
        (
            &[
                ("InitiatorName", "iqn.other"),
                ("TargetName", SECURE),
                ("SessionType", "Normal"),
            ],
            status::FORBIDDEN,
        ),
        (
            &[("SessionType", "Normal"), ("InitiatorName", INI)],
            status::MISSING_PARAMETER,
        ),
        (
            &[("InitiatorName", INI), ("SessionType", "Weird")],
            status::SESSION_TYPE_NOT_SUPPORTED,
        ),
    ];
    for (kv, want) in cases {
        let mut n = negotiator();
        let s = n.step(&req(0, 1, true), &encode_text(kv));
        assert_eq!(failed(&s), Some(*want), "{kv:?}");
    }
}

/// An InitiatorName that is not an iSCSI name is refused before anything
/// else, on discovery too (no credentials needed there): a newline would
/// forge log lines, a quote or brace a metric's label. Before, any UTF-8 up
/// to 223 bytes got in.
#[test]
fn an_initiator_name_that_is_not_an_iscsi_name_is_refused() {
    for bad in [
        "iqn.a\nINFO forged: login complete",
        "iqn.a\r",
        "iqn.a\u{1b}[31m",
        "iqn.a\u{85}",
        "host1",
        "",
    ] {
        for kind in ["Normal", "Discovery"] {
            let mut n = negotiator();
            let kv = [
                ("InitiatorName", bad),
                ("TargetName", TGT),
                ("SessionType", kind),
            ];
            let s = n.step(&req(0, 1, true), &encode_text(&kv));
            assert_eq!(failed(&s), Some(status::INITIATOR_ERROR), "{bad:?} {kind}");
        }
    }
    for good in [
        "iqn.1991-05.com.microsoft:host.example.com",
        "IQN.2026-01.ORG.TEST:HOST_1",
        "iqn.2008-11.org.linux-kvm:my vm+1",
        "eui.02004567a425678d",
        "naa.52004567ba64678d",
    ] {
        assert!(is_iscsi_name(good), "{good}");
    }
}

#[test]
fn bad_bits_and_wrong_stages() {
    let hello = encode_text(&[("InitiatorName", INI), ("TargetName", TGT)]);
    let mut r = req(0, 1, true);
    r.cont = true;
    assert_eq!(
        failed(&negotiator().step(&r, &hello)),
        Some(status::INITIATOR_ERROR)
    );
    assert_eq!(
        failed(&negotiator().step(&req(0, 2, true), &hello)),
        Some(status::INITIATOR_ERROR)
    );
    assert_eq!(
        failed(&negotiator().step(&req(3, 3, true), &hello)),
        Some(status::INITIATOR_ERROR)
    );
    assert_eq!(
        failed(&negotiator().step(&req(1, 0, true), &hello)),
        Some(status::INITIATOR_ERROR)
    );
    let mut r = req(0, 1, true);
    r.version_min = 1;
    assert_eq!(
        failed(&negotiator().step(&r, &hello)),
        Some(status::UNSUPPORTED_VERSION)
    );
    // Second PDU in the wrong stage.
    let mut n = negotiator();
    let s = n.step(&req(0, 1, false), &hello);
    assert_eq!(s.outcome, LoginOutcome::Continue);
    assert_eq!(
        failed(&n.step(&req(1, 3, true), &[])),
        Some(status::INITIATOR_ERROR)
    );
    // Changing ISID mid-login.
    let mut n = negotiator();
    n.step(&req(0, 1, false), &hello);
    let mut r = req(0, 1, true);
    r.isid[5] = 9;
    assert_eq!(failed(&n.step(&r, &[])), Some(status::INITIATOR_ERROR));
    // Garbage text.
    assert_eq!(
        failed(&negotiator().step(&req(0, 1, true), b"no equals sign\0")),
        Some(status::INITIATOR_ERROR)
    );
}

#[test]
fn continued_text_is_reassembled() {
    let mut n = negotiator();
    let all = encode_text(&[("InitiatorName", INI), ("TargetName", TGT)]);
    let mut r = req(0, 1, false);
    r.cont = true;
    let s = n.step(&r, &all[..10]);
    assert_eq!(s.outcome, LoginOutcome::Continue);
    assert!(s.data.is_empty());
    let s = n.step(&req(0, 1, true), &all[10..]);
    assert_eq!(s.outcome, LoginOutcome::Continue);
    assert!(s.header.transit);
}

fn chap_login(
    n: &mut LoginNegotiator,
    password: &str,
    mutual: Option<(u8, &[u8])>,
) -> (LoginStep, Vec<(String, String)>) {
    chap_login_as(n, INI, SECURE, "5", "alice", password, mutual)
}

/// A CHAP exchange offering the CHAP_A list `offer`; the response is computed
/// with whichever algorithm the target picked.
fn chap_login_as(
    n: &mut LoginNegotiator,
    initiator: &str,
    target: &str,
    offer: &str,
    user: &str,
    password: &str,
    mutual: Option<(u8, &[u8])>,
) -> (LoginStep, Vec<(String, String)>) {
    let s = n.step(
        &req(0, 1, false),
        &encode_text(&[
            ("InitiatorName", initiator),
            ("TargetName", target),
            ("AuthMethod", "CHAP,None"),
        ]),
    );
    assert_eq!(get(&keys(&s), "AuthMethod"), Some("CHAP"));
    let s = n.step(&req(0, 1, false), &encode_text(&[("CHAP_A", offer)]));
    let kv = keys(&s);
    let a = chap::parse_number(get(&kv, "CHAP_A").unwrap()).unwrap();
    let alg = chap::ChapAlgorithm::from_code(a).unwrap();
    let id = chap::parse_number(get(&kv, "CHAP_I").unwrap()).unwrap() as u8;
    let c = chap::decode_binary(get(&kv, "CHAP_C").unwrap()).unwrap();
    assert_eq!(c.len(), alg.challenge_len_bytes());
    let r = chap::encode_hex(&alg.response(id, password.as_bytes(), &c));
    let mut pairs = vec![
        ("CHAP_N".to_string(), user.to_string()),
        ("CHAP_R".into(), r),
    ];
    if let Some((mi, mc)) = mutual {
        pairs.push(("CHAP_I".into(), mi.to_string()));
        pairs.push(("CHAP_C".into(), chap::encode_hex(mc)));
    }
    let s = n.step(&req(0, 1, true), &encode_text(&pairs));
    let kv = keys(&s);
    (s, kv)
}

#[test]
fn chap_success_and_failure() {
    let mut n = negotiator();
    let (s, _) = chap_login(&mut n, "alicesecret1", None);
    assert_eq!(s.outcome, LoginOutcome::Continue);
    assert!(s.header.transit);
    let s = n.step(&req(1, 3, true), &[]);
    assert!(matches!(s.outcome, LoginOutcome::Complete(_)));

    let mut n = negotiator();
    let (s, _) = chap_login(&mut n, "wrong-password", None);
    assert_eq!(failed(&s), Some(status::AUTH_FAILURE));
}

#[test]
fn mutual_chap() {
    let mut n = negotiator();
    let my_challenge = [0x42u8; 16];
    let (s, kv) = chap_login(&mut n, "alicesecret1", Some((9, &my_challenge)));
    assert_eq!(s.outcome, LoginOutcome::Continue);
    assert_eq!(get(&kv, "CHAP_N"), Some("target"));
    let r = chap::decode_binary(get(&kv, "CHAP_R").unwrap()).unwrap();
    assert_eq!(r, chap::response(9, b"targetsecret", &my_challenge));
}

#[test]
fn chap_required_cannot_be_skipped() {
    // Offering only None.
    let mut n = negotiator();
    let s = n.step(
        &req(0, 1, true),
        &encode_text(&[
            ("InitiatorName", INI),
            ("TargetName", SECURE),
            ("AuthMethod", "None"),
        ]),
    );
    assert_eq!(failed(&s), Some(status::AUTH_FAILURE));
    // Jumping to the operational stage.
    let mut n = negotiator();
    let s = n.step(
        &req(1, 3, true),
        &encode_text(&[("InitiatorName", INI), ("TargetName", SECURE)]),
    );
    assert_eq!(failed(&s), Some(status::AUTH_FAILURE));
    // Transit without any AuthMethod.
    let mut n = negotiator();
    let s = n.step(
        &req(0, 1, true),
        &encode_text(&[("InitiatorName", INI), ("TargetName", SECURE)]),
    );
    assert_eq!(failed(&s), Some(status::AUTH_FAILURE));
    // CHAP_N before any challenge.
    let mut n = negotiator();
    let s = n.step(
        &req(0, 1, false),
        &encode_text(&[
            ("InitiatorName", INI),
            ("TargetName", SECURE),
            ("CHAP_N", "alice"),
            ("CHAP_R", "0x00"),
        ]),
    );
    assert_eq!(failed(&s), Some(status::INITIATOR_ERROR));
}

#[test]
fn chap_transit_waits_for_the_exchange() {
    let mut n = negotiator();
    let s = n.step(
        &req(0, 1, true),
        &encode_text(&[
            ("InitiatorName", INI),
            ("TargetName", SECURE),
            ("AuthMethod", "CHAP"),
        ]),
    );
    assert_eq!(s.outcome, LoginOutcome::Continue);
    assert!(!s.header.transit);
}

#[test]
fn base64_response_and_unsupported_algorithm() {
    let mut n = negotiator();
    n.step(
        &req(0, 1, false),
        &encode_text(&[
            ("InitiatorName", INI),
            ("TargetName", SECURE),
            ("AuthMethod", "CHAP"),
        ]),
    );
    let s = n.step(&req(0, 1, false), &encode_text(&[("CHAP_A", "5")]));
    let kv = keys(&s);
    let id = chap::parse_number(get(&kv, "CHAP_I").unwrap()).unwrap() as u8;
    let c = chap::decode_binary(get(&kv, "CHAP_C").unwrap()).unwrap();
    let r = chap::response(id, b"alicesecret1", &c);
    let b64 = base64(&r);
    let s = n.step(
        &req(0, 1, true),
        &encode_text(&[("CHAP_N", "alice"), ("CHAP_R", &format!("0b{b64}"))]),
    );
    assert_eq!(s.outcome, LoginOutcome::Continue);

    let mut n = negotiator();
    n.step(
        &req(0, 1, false),
        &encode_text(&[
            ("InitiatorName", INI),
            ("TargetName", SECURE),
            ("AuthMethod", "CHAP"),
        ]),
    );
    let s = n.step(&req(0, 1, false), &encode_text(&[("CHAP_A", "9,16")]));
    assert_eq!(failed(&s), Some(status::AUTH_FAILURE));
}

fn complete(n: &mut LoginNegotiator) -> Negotiated {
    let s = n.step(&req(1, 3, true), &[]);
    match s.outcome {
        LoginOutcome::Complete(neg) => *neg,
        other => panic!("{other:?}"),
    }
}

#[test]
fn sha256_preferred_with_mutual_chap() {
    let mut n = negotiator();
    let mine = [0x33u8; 32];
    let (s, kv) = chap_login_as(
        &mut n,
        INI,
        SECURE,
        "5,7",
        "alice",
        "alicesecret1",
        Some((4, &mine)),
    );
    assert_eq!(s.outcome, LoginOutcome::Continue);
    let r = chap::decode_binary(get(&kv, "CHAP_R").unwrap()).unwrap();
    assert_eq!(
        r,
        chap::ChapAlgorithm::Sha256.response(4, b"targetsecret", &mine)
    );
    let neg = complete(&mut n);
    assert_eq!(neg.chap_algorithm, Some(chap::CHAP_ALGORITHM_SHA256));
    assert_eq!(neg.chap_user.as_deref(), Some("alice"));
    assert!(!neg.chap_per_initiator);
    // An MD5 response to a SHA-256 challenge fails.
    let mut n = negotiator();
    n.step(
        &req(0, 1, false),
        &encode_text(&[
            ("InitiatorName", INI),
            ("TargetName", SECURE),
            ("AuthMethod", "CHAP"),
        ]),
    );
    let s = n.step(&req(0, 1, false), &encode_text(&[("CHAP_A", "7")]));
    let kv = keys(&s);
    assert_eq!(get(&kv, "CHAP_A"), Some("7"));
    let id = chap::parse_number(get(&kv, "CHAP_I").unwrap()).unwrap() as u8;
    let c = chap::decode_binary(get(&kv, "CHAP_C").unwrap()).unwrap();
    let r = chap::encode_hex(&chap::response(id, b"alicesecret1", &c));
    let s = n.step(
        &req(0, 1, true),
        &encode_text(&[("CHAP_N", "alice"), ("CHAP_R", &r)]),
    );
    assert_eq!(failed(&s), Some(status::AUTH_FAILURE));
    assert_eq!(n.chap_name(), Some("alice"));
}

#[test]
fn per_initiator_secrets() {
    // A listed initiator logs in with its own credentials...
    let mut n = negotiator();
    let (s, _) = chap_login_as(&mut n, INI2, SECURE, "5", "bob", "bobsecret-12", None);
    assert_eq!(s.outcome, LoginOutcome::Continue);
    let neg = complete(&mut n);
    assert_eq!(neg.chap_user.as_deref(), Some("bob"));
    assert!(neg.chap_per_initiator);
    assert_eq!(neg.chap_algorithm, Some(chap::CHAP_ALGORITHM_MD5));
    // ...and not with the target-wide ones.
    let mut n = negotiator();
    let (s, _) = chap_login_as(&mut n, INI2, SECURE, "5", "alice", "alicesecret1", None);
    assert_eq!(failed(&s), Some(status::AUTH_FAILURE));
    // An unlisted initiator uses the target-wide credentials, not another's.
    let mut n = negotiator();
    let (s, _) = chap_login_as(&mut n, INI3, SECURE, "7", "bob", "bobsecret-12", None);
    assert_eq!(failed(&s), Some(status::AUTH_FAILURE));
    let mut n = negotiator();
    let (s, _) = chap_login_as(&mut n, INI3, SECURE, "7", "alice", "alicesecret1", None);
    assert_eq!(s.outcome, LoginOutcome::Continue);
    // A target with only per-initiator entries requires CHAP and refuses others.
    let mut n = negotiator();
    let (s, _) = chap_login_as(&mut n, INI, PER_INI, "7", "bob", "bobsecret-12", None);
    assert_eq!(failed(&s), Some(status::AUTH_FAILURE));
    let mut n = negotiator();
    let s = n.step(
        &req(1, 3, true),
        &encode_text(&[("InitiatorName", INI), ("TargetName", PER_INI)]),
    );
    assert_eq!(failed(&s), Some(status::AUTH_FAILURE));
    let mut n = negotiator();
    let (s, _) = chap_login_as(&mut n, INI2, PER_INI, "7", "bob", "bobsecret-12", None);
    assert_eq!(s.outcome, LoginOutcome::Continue);
    assert!(complete(&mut n).chap_per_initiator);
}

/// iSCSI names are case-insensitive: an initiator's name in other letters is
/// that initiator (its own CHAP entry applies, not the target-wide one), and
/// the session carries the folded name, so no layer below tells them apart.
#[test]
fn an_initiator_name_in_capitals_is_the_same_initiator() {
    let shouting = INI2.to_uppercase();
    // its own entry's credentials, not the target-wide ones
    let mut n = negotiator();
    let (s, _) = chap_login_as(
        &mut n,
        &shouting,
        SECURE,
        "5",
        "alice",
        "alicesecret1",
        None,
    );
    assert_eq!(failed(&s), Some(status::AUTH_FAILURE));
    let mut n = negotiator();
    let (s, _) = chap_login_as(&mut n, &shouting, SECURE, "5", "bob", "bobsecret-12", None);
    assert_eq!(s.outcome, LoginOutcome::Continue);
    let neg = complete(&mut n);
    assert_eq!(neg.initiator_name, INI2);
    assert!(neg.chap_per_initiator);
    // the ACL and the target's name, whatever their letters
    let mut n = negotiator();
    let (s, _) = chap_login_as(
        &mut n,
        &INI.to_uppercase(),
        &SECURE.to_uppercase(),
        "5",
        "alice",
        "alicesecret1",
        None,
    );
    assert_eq!(s.outcome, LoginOutcome::Continue);
    assert_eq!(complete(&mut n).initiator_name, INI);
}

fn base64(b: &[u8]) -> String {
    const T: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut s = String::new();
    for ch in b.chunks(3) {
        let n = (ch[0] as u32) << 16
            | (*ch.get(1).unwrap_or(&0) as u32) << 8
            | *ch.get(2).unwrap_or(&0) as u32;
        for i in 0..4 {
            if i <= ch.len() {
                s.push(T[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                s.push('=');
            }
        }
    }
    s
}

#[test]
fn discovery_session() {
    let mut n = negotiator();
    let s = n.step(
        &req(0, 1, true),
        &encode_text(&[("InitiatorName", "iqn.any"), ("SessionType", "Discovery")]),
    );
    assert_eq!(s.outcome, LoginOutcome::Continue);
    let s = n.step(
        &req(1, 3, true),
        &encode_text(&[("MaxBurstLength", "262144"), ("HeaderDigest", "None")]),
    );
    assert_eq!(get(&keys(&s), "MaxBurstLength"), Some("Irrelevant"));
    let LoginOutcome::Complete(neg) = s.outcome else {
        panic!()
    };
    assert_eq!(neg.session_type, SessionType::Discovery);
    assert_eq!(neg.target_index, None);
}

#[test]
fn refuse_answers_with_status() {
    let mut n = negotiator();
    let s = n.refuse(&req(0, 1, true), status::OUT_OF_RESOURCES);
    assert_eq!(failed(&s), Some(status::OUT_OF_RESOURCES));
    assert_eq!(s.seq.stat_sn, 100);
}
