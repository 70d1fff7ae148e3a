//! EXTENDED COPY between LUs of different targets of one node (VAAI full copy
//! between datastores on LUNs of two targets): a copy sent to one target reaches
//! another target's LU only where its initiator could log in to that target
//! with what its session proved (the other target's ACL and CHAP) and that
//! target's masking shows it the LU; a reserved LU of another target answers
//! RESERVATION CONFLICT. Every refusal leaves the destination untouched.

use crate::common;
use common::scsi::{self, naa, past_uas as cmd};
use common::*;
use initiator::{LoginOptions, Session};

const BS: u64 = 512;
/// Blocks copied: 1 MiB.
const BLOCKS: u64 = 2048;
const INI: &str = "iqn.2026-12.test:host";
const OTHER: &str = "iqn.2026-12.test:other";
const ALICE: (&str, &str) = ("alice", "secret-of-alice-1");

fn iqn(t: &str) -> String {
    format!("iqn.2026-12.org.freesan:{t}")
}

/// Targets a..f, one 4 MiB file LUN each: a (CHAP alice), b (the same CHAP),
/// c (alice with another secret), d (an ACL without INI), e (a host group
/// without INI), f (open).
fn config(dir: &std::path::Path) -> std::path::PathBuf {
    let mut s = config_head(dir, 0);
    let alice = format!(
        "chap = {{ user = \"{}\", secret = \"{}\" }}\n",
        ALICE.0, ALICE.1
    );
    for (t, extra) in [
        ("a", alice.clone()),
        ("b", alice.clone()),
        (
            "c",
            "chap = { user = \"alice\", secret = \"another-secret-2\" }\n".to_string(),
        ),
        ("d", format!("allowed_initiators = [\"{OTHER}\"]\n")),
        ("e", String::new()),
        ("f", String::new()),
    ] {
        s += &format!("[[target]]\niqn = \"{}\"\n{extra}", iqn(t));
        s += &format!(
            "[[target.lun]]\npath = \"{}/{t}.img\"\nsize = \"4M\"\n",
            dir.display()
        );
        if t == "e" {
            s += &format!(
                "[[target.host_group]]\nname = \"g\"\ninitiators = [\"{OTHER}\"]\nluns = [{{ lun = 0 }}]\n"
            );
        }
    }
    let path = dir.join("node.toml");
    std::fs::write(&path, s).unwrap();
    path
}

/// A session of `who` to `target`. Every session has the same ISID, as
/// open-iscsi gives one interface's sessions to every target: so a session to
/// one target has the same initiator port and relative port id as a session of
/// the same initiator to another, and only the copy's own rule for another
/// target's reservations (not the nexus check) tells them apart.
async fn login(node: &Node, who: &str, target: &str, chap: Option<(&str, &str)>) -> Session {
    let mut o = LoginOptions::new(who, &iqn(target));
    o.isid = [0x80, 0x12, 0x34, 0x56, 0x78, 0x9a];
    o.chap = chap.map(|(u, s)| (u.to_string(), s.to_string()));
    Session::login(node.portals[0].parse().unwrap(), &o)
        .await
        .unwrap_or_else(|e| panic!("login of {who} to {target}: {e}"))
}

/// Block `b` of a LU filled with `tag`: every block different.
fn block(tag: u64, b: u64) -> Vec<u8> {
    (tag << 32 | b).to_be_bytes().repeat(BS as usize / 8)
}

async fn fill(s: &Session, tag: u64) {
    let data: Vec<u8> = (0..BLOCKS).flat_map(|b| block(tag, b)).collect();
    let mut c = [0u8; 16];
    c[0] = 0x8a;
    c[10..14].copy_from_slice(&(BLOCKS as u32).to_be_bytes());
    assert_eq!(cmd(s, 0, &c, data, 0).await.status, 0);
}

async fn read(s: &Session) -> Vec<u8> {
    let mut c = [0u8; 16];
    c[0] = 0x88;
    c[10..14].copy_from_slice(&(BLOCKS as u32).to_be_bytes());
    let r = cmd(s, 0, &c, vec![], (BLOCKS * BS) as u32).await;
    assert_eq!(r.status, 0);
    r.data_in.to_vec()
}

fn filled(tag: u64) -> Vec<u8> {
    (0..BLOCKS).flat_map(|b| block(tag, b)).collect()
}

/// EXTENDED COPY of the first BLOCKS blocks from the LU named `src` onto `dst`,
/// sent on `s` (to its LUN 0): its status and sense (key, ASC, ASCQ).
async fn xcopy(s: &Session, src: [u8; 16], dst: [u8; 16]) -> (u8, Option<(u8, u8, u8)>) {
    let (c, p) = scsi::xcopy(src, dst, BS as u32, &[(0, 0, BLOCKS as u16)], 1);
    let r = cmd(s, 0, &c, p, 0).await;
    let sense = r
        .sense
        .as_deref()
        .and_then(initiator::parse_sense)
        .map(|x| (x.key, x.asc, x.ascq));
    (r.status, sense)
}

const NOT_REACHABLE: (u8, Option<(u8, u8, u8)>) = (2, Some((0x0a, 0x0d, 0x02)));

/// A node with the targets of [`config`] and a session to each, through which
/// target t's LU is filled with tag 0xt: INI to a, b, c (each with the CHAP it
/// asks) and f; OTHER to d and e, which leave INI out.
async fn setup(dir: &std::path::Path) -> (Node, [Session; 6]) {
    let node = start_config(dir, &config(dir));
    let s = [
        login(&node, INI, "a", Some(ALICE)).await,
        login(&node, INI, "b", Some(ALICE)).await,
        login(&node, INI, "c", Some(("alice", "another-secret-2"))).await,
        login(&node, OTHER, "d", None).await,
        login(&node, OTHER, "e", None).await,
        login(&node, INI, "f", None).await,
    ];
    for (s, tag) in s.iter().zip(0xa..) {
        fill(s, tag).await;
    }
    (node, s)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extended_copy_reaches_another_target_only_as_its_login_would() {
    let dir = tempfile::tempdir().unwrap();
    let (_node, [a, b, c, d, e, f]) = setup(dir.path()).await;
    let naas = [
        naa(&a, 0).await,
        naa(&b, 0).await,
        naa(&c, 0).await,
        naa(&d, 0).await,
        naa(&e, 0).await,
        naa(&f, 0).await,
    ];
    let [na, nb, nc, nd, ne, nf] = naas;

    // b asks the same CHAP of INI as a: its LU is reached both ways
    assert_eq!(xcopy(&a, nb, na).await, (0, None), "from b onto a");
    assert_eq!(read(&a).await, filled(0xb));
    fill(&a, 0xa).await;
    assert_eq!(xcopy(&a, na, nb).await, (0, None), "from a onto b");
    assert_eq!(read(&b).await, filled(0xa));

    // c's secret was never shown on a; d's ACL and e's host group leave INI out
    for (what, other) in [("c", nc), ("d", nd), ("e", ne)] {
        assert_eq!(xcopy(&a, other, na).await, NOT_REACHABLE, "from {what}");
        assert_eq!(xcopy(&a, na, other).await, NOT_REACHABLE, "onto {what}");
    }
    assert_eq!(read(&a).await, filled(0xa), "a refused copy wrote to a");
    assert_eq!(read(&c).await, filled(0xc));
    assert_eq!(read(&d).await, filled(0xd));
    assert_eq!(read(&e).await, filled(0xe));

    // f is open; while a session of f reserves its LU, a copy there conflicts
    let reserve6 = [0x16, 0, 0, 0, 0, 0];
    assert_eq!(cmd(&f, 0, &reserve6, vec![], 0).await.status, 0);
    assert_eq!(xcopy(&a, nf, na).await.0, 0x18, "from a reserved LU");
    assert_eq!(xcopy(&a, na, nf).await.0, 0x18, "onto a reserved LU");
    assert_eq!(read(&f).await, filled(0xf));
    let release6 = [0x17, 0, 0, 0, 0, 0];
    assert_eq!(cmd(&f, 0, &release6, vec![], 0).await.status, 0);
    assert_eq!(xcopy(&a, nf, na).await, (0, None), "from f once released");
    assert_eq!(read(&a).await, filled(0xf));

    // from an open target, a CHAP target is not reached (nothing was proved)
    assert_eq!(xcopy(&f, na, nf).await, NOT_REACHABLE, "from f to a");
    assert_eq!(xcopy(&f, nb, nf).await, NOT_REACHABLE, "from f to b");
    assert_eq!(read(&f).await, filled(0xf), "a refused copy wrote to f");
}

/// POPULATE TOKEN over the first BLOCKS blocks of `s`'s LUN 0 (list id `list`):
/// the token.
async fn token(s: &Session, list: u32) -> Vec<u8> {
    let (c, p) = scsi::populate_token(0, BLOCKS as u32, list);
    let r = cmd(s, 0, &c, p, 0).await;
    assert_eq!(r.status, 0, "POPULATE TOKEN: {:?}", r.sense);
    let r = cmd(
        s,
        0,
        &scsi::receive_rod_token_information(list),
        vec![],
        1024,
    )
    .await;
    assert_eq!(r.status, 0);
    scsi::token_of(&r.data_in)
}

/// WRITE USING TOKEN onto the first BLOCKS blocks of `s`'s LUN 0: its status
/// and sense (key, ASC).
async fn write_using(s: &Session, t: &[u8], list: u32) -> (u8, Option<(u8, u8)>) {
    let (c, p) = scsi::write_using_token(t, 0, BLOCKS as u32, list);
    let r = cmd(s, 0, &c, p, 0).await;
    let sense = r
        .sense
        .as_deref()
        .and_then(initiator::parse_sense)
        .map(|x| (x.key, x.asc));
    (r.status, sense)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_odx_token_of_another_target_is_used_only_as_its_login_would_allow() {
    let dir = tempfile::tempdir().unwrap();
    let (_node, [a, b, c, _, _, f]) = setup(dir.path()).await;
    // a has a token of its own too
    let own = token(&a, 1).await;
    let of_b = token(&b, 1).await;
    let of_c = token(&c, 1).await;
    let of_f = token(&f, 1).await;
    assert_ne!(own, of_b);

    // b asks the same CHAP of INI as a: its token writes b's data onto a
    assert_eq!(write_using(&a, &of_b, 2).await, (0, None));
    assert_eq!(read(&a).await, filled(0xb));
    // c's secret was never shown on a: its token is unknown there
    fill(&a, 0xa).await;
    let invalid_token = (2, Some((0x05, 0x23)));
    assert_eq!(write_using(&a, &of_c, 3).await, invalid_token, "c's token");
    assert_eq!(read(&a).await, filled(0xa), "a refused token wrote to a");
    // f's LU reserved by a session of f: its token conflicts until released
    assert_eq!(
        cmd(&f, 0, &[0x16, 0, 0, 0, 0, 0], vec![], 0).await.status,
        0
    );
    assert_eq!(
        write_using(&a, &of_f, 4).await.0,
        0x18,
        "f's token, reserved"
    );
    assert_eq!(read(&a).await, filled(0xa));
    assert_eq!(
        cmd(&f, 0, &[0x17, 0, 0, 0, 0, 0], vec![], 0).await.status,
        0
    );
    assert_eq!(write_using(&a, &of_f, 5).await, (0, None), "f's token");
    assert_eq!(read(&a).await, filled(0xf));
    // from the open target f, a's token (a CHAP target) is unknown
    assert_eq!(
        write_using(&f, &own, 6).await,
        invalid_token,
        "a's token on f"
    );
    assert_eq!(read(&f).await, filled(0xf));
}
