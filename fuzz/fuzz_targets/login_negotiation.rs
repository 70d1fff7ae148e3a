//! Arbitrary bytes split into a sequence of Login Requests fed to the negotiator:
//! it must answer each one (or fail with a status), never panic.
#![no_main]

use iscsi_proto::login::{
    ChapCredentials, InitiatorChap, LoginConfig, LoginNegotiator, LoginOutcome, TargetAuth,
};
use iscsi_proto::pdu::{parse_bhs, InitiatorPdu, BHS_LEN};
use libfuzzer_sys::fuzz_target;
use std::sync::Arc;

fn config() -> Arc<LoginConfig> {
    let creds = |u: &str, s: &str| ChapCredentials { user: u.into(), secret: s.into() };
    Arc::new(LoginConfig {
        targets: vec![
            TargetAuth { name: "iqn.2026-01.org.freesan:open".into(), ..TargetAuth::default() },
            TargetAuth {
                name: "iqn.2026-01.org.freesan:chap".into(),
                alias: Some("chap".into()),
                chap: Some(creds("user", "secretsecret")),
                mutual: Some(creds("target", "targetsecret")),
                allowed_initiators: vec!["iqn.2026-01.org.test:ini".into()],
                chap_initiators: vec![InitiatorChap {
                    initiator: "iqn.2026-01.org.test:ini2".into(),
                    creds: creds("user2", "secretsecret2"),
                }],
                refuse_md5: true,
            },
            // every CHAP algorithm taken (MD5 and SHA-1 reach their
            // challenges here; refused on the target above)
            TargetAuth {
                name: "iqn.2026-01.org.freesan:weak".into(),
                chap: Some(creds("user", "secretsecret")),
                mutual: Some(creds("target", "targetsecret")),
                ..TargetAuth::default()
            },
        ],
        discovery_chap: Some(creds("disc", "discsecret12")),
        discovery_mutual: None,
        discovery_refuse_md5: false,
        limits: Default::default(),
    })
}

fuzz_target!(|data: &[u8]| {
    let mut n = LoginNegotiator::with_seed(config(), 1, 1);
    // Each record: 48-byte header, 2-byte text length, text.
    let mut rest = data;
    while rest.len() >= BHS_LEN + 2 {
        let mut raw = [0u8; BHS_LEN];
        raw.copy_from_slice(&rest[..BHS_LEN]);
        raw[0] = 0x43;
        let len = u16::from_be_bytes([rest[BHS_LEN], rest[BHS_LEN + 1]]) as usize;
        let body = &rest[BHS_LEN + 2..];
        let text = &body[..len.min(body.len())];
        rest = &body[text.len()..];
        let Ok(bhs) = parse_bhs(&raw) else { continue };
        let InitiatorPdu::Login(req) = bhs.pdu else { continue };
        let step = n.step(&req, text);
        match step.outcome {
            LoginOutcome::Continue => {}
            LoginOutcome::Failed(_) | LoginOutcome::Complete(_) => break,
        }
    }
});
