//! Unit tests of the reservation state machine, its wire formats and persistence.

use super::*;
use crate::sense::codes;

const REGISTER: u8 = wire::SA_REGISTER;
const RESERVE: u8 = wire::SA_RESERVE;
const RELEASE: u8 = wire::SA_RELEASE;
const CLEAR: u8 = wire::SA_CLEAR;
const PREEMPT: u8 = wire::SA_PREEMPT;
const PREEMPT_AND_ABORT: u8 = wire::SA_PREEMPT_AND_ABORT;
const REGISTER_AND_IGNORE: u8 = wire::SA_REGISTER_AND_IGNORE;
const REGISTER_AND_MOVE: u8 = wire::SA_REGISTER_AND_MOVE;

const WE: u8 = 1;
const EA: u8 = 3;
const WERO: u8 = 5;
const EARO: u8 = 6;
const WEAR: u8 = 7;
const EAAR: u8 = 8;
const ALL_TYPES: [u8; 6] = [WE, EA, WERO, EARO, WEAR, EAAR];

const ALL_TG_PT: u8 = 0x04;
const SPEC_I_PT: u8 = 0x08;
const APTPL: u8 = 0x01;

const READ10: [u8; 10] = [0x28, 0, 0, 0, 0, 1, 0, 0, 1, 0];
const WRITE10: [u8; 10] = [0x2a, 0, 0, 0, 0, 1, 0, 0, 1, 0];
const INQUIRY: [u8; 6] = [0x12, 0, 0, 0, 0xff, 0];
const TUR: [u8; 6] = [0; 6];
const MODE_SENSE6: [u8; 6] = [0x1a, 0, 0x3f, 0, 0xff, 0];
const SYNC_CACHE10: [u8; 10] = [0x35, 0, 0, 0, 0, 0, 0, 0, 0, 0];

fn port_name(name: &str, isid: u64) -> String {
    format!("iqn.2007-10.com.example:{name},i,0x{isid:012x}")
}

fn nx(name: &str, isid: u64, port: u16) -> ItNexus {
    ItNexus {
        initiator_name: Arc::from(format!("iqn.2007-10.com.example:{name}")),
        initiator_port: Arc::from(port_name(name, isid)),
        relative_port_id: port,
        chap_user: None,
    }
}

fn ports() -> Vec<TargetPort> {
    (1..=2)
        .map(|id| TargetPort {
            relative_id: id,
            group_id: id,
            name: format!("iqn.2026-11.org.freesan:t1,t,0x{id:04x}"),
        })
        .collect()
}

fn prout_cdb(sa: u8, type_code: u8, param_len: u32) -> Vec<u8> {
    let mut cdb = vec![0x5f, sa, type_code, 0, 0, 0, 0, 0, 0, 0];
    cdb[5..9].copy_from_slice(&param_len.to_be_bytes());
    cdb
}

fn basic(rk: u64, sark: u64, flags: u8) -> Vec<u8> {
    let mut p = vec![0u8; 24];
    p[0..8].copy_from_slice(&rk.to_be_bytes());
    p[8..16].copy_from_slice(&sark.to_be_bytes());
    p[20] = flags;
    p
}

fn tid(port: &str) -> Vec<u8> {
    wire::encode_transport_id(port)
}

fn mem() -> Reservations {
    Reservations::load(None).expect("in-memory state")
}

/// Sends a PR OUT with a basic parameter list.
fn out(
    r: &Reservations,
    n: &ItNexus,
    sa: u8,
    type_code: u8,
    rk: u64,
    sark: u64,
    flags: u8,
) -> Result<Vec<PendingUa>, PrError> {
    let p = basic(rk, sark, flags);
    r.persistent_reserve_out(n, &prout_cdb(sa, type_code, 24), &p, &ports())
}

fn register(r: &Reservations, n: &ItNexus, key: u64) {
    out(r, n, REGISTER_AND_IGNORE, 0, 0, key, 0).expect("register");
}

fn prin(r: &Reservations, n: &ItNexus, sa: u8) -> Result<Bytes, PrError> {
    r.persistent_reserve_in(n, &[0x5e, sa, 0, 0, 0, 0, 0, 0xff, 0xff, 0])
}

fn read_keys(r: &Reservations) -> (u32, Vec<u64>) {
    let d = prin(r, &nx("probe", 9, 1), 0).expect("read keys");
    let gen = u32::from_be_bytes(d[0..4].try_into().unwrap());
    let len = u32::from_be_bytes(d[4..8].try_into().unwrap()) as usize;
    assert_eq!(d.len(), 8 + len);
    let keys = d[8..]
        .chunks(8)
        .map(|c| u64::from_be_bytes(c.try_into().unwrap()))
        .collect();
    (gen, keys)
}

fn read_reservation(r: &Reservations) -> Option<(u64, u8)> {
    let d = prin(r, &nx("probe", 9, 1), 1).expect("read reservation");
    match u32::from_be_bytes(d[4..8].try_into().unwrap()) {
        0 => None,
        16 => Some((u64::from_be_bytes(d[8..16].try_into().unwrap()), d[21])),
        n => panic!("bad additional length {n}"),
    }
}

fn conflict<T: std::fmt::Debug>(r: Result<T, PrError>) {
    assert_eq!(r.unwrap_err(), PrError::Conflict);
}

fn check_err<T: std::fmt::Debug>(r: Result<T, PrError>, want: Sense) {
    match r {
        Err(PrError::Check(s)) => {
            assert_eq!((s.key, s.asc, s.ascq), (want.key, want.asc, want.ascq))
        }
        other => panic!("expected {want:?}, got {other:?}"),
    }
}

fn uas_for(uas: &[PendingUa], n: &ItNexus) -> Vec<Sense> {
    uas.iter()
        .filter(|u| {
            *u.initiator_port == *n.initiator_port && u.relative_port_id == Some(n.relative_port_id)
        })
        .map(|u| u.sense)
        .collect()
}

fn temp_state_file(tag: &str) -> PathBuf {
    temp_dir(tag).join("lun0.json")
}

/// A fresh folder for one test's state files.
pub(crate) fn temp_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "freesan-pr-{tag}-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos())
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

// ---------------------------------------------------------------- REGISTER

#[test]
fn register_read_keys_and_unregister() {
    let r = mem();
    let a = nx("a", 1, 1);
    let (gen0, keys) = read_keys(&r);
    assert!(keys.is_empty());
    out(&r, &a, REGISTER, 0, 0, 0xabc, 0).unwrap();
    assert_eq!(read_keys(&r), (gen0 + 1, vec![0xabc]));
    // Re-registering with the wrong key conflicts (libiscsi prout_reregister_key_fails).
    conflict(out(&r, &a, REGISTER, 0, 0, 0xabd, 0));
    // Key change with the right key.
    out(&r, &a, REGISTER, 0, 0xabc, 0xdef, 0).unwrap();
    assert_eq!(read_keys(&r), (gen0 + 2, vec![0xdef]));
    // Unregister.
    out(&r, &a, REGISTER, 0, 0xdef, 0, 0).unwrap();
    assert_eq!(read_keys(&r), (gen0 + 3, vec![]));
    assert_eq!(r.registration_count(), 0);
}

#[test]
fn register_from_unregistered_nexus_needs_zero_key() {
    let r = mem();
    let a = nx("a", 1, 1);
    conflict(out(&r, &a, REGISTER, 0, 5, 6, 0));
    // REGISTER AND IGNORE EXISTING KEY ignores the reservation key.
    out(&r, &a, REGISTER_AND_IGNORE, 0, 5, 6, 0).unwrap();
    out(&r, &a, REGISTER_AND_IGNORE, 0, 99, 7, 0).unwrap();
    assert_eq!(read_keys(&r).1, vec![7]);
    out(&r, &a, REGISTER_AND_IGNORE, 0, 99, 0, 0).unwrap();
    assert!(read_keys(&r).1.is_empty());
    // Unregistered, SARK 0: GOOD, nothing registered.
    out(&r, &a, REGISTER, 0, 0, 0, 0).unwrap();
    assert!(read_keys(&r).1.is_empty());
}

#[test]
fn same_initiator_through_two_ports_is_two_nexuses() {
    let r = mem();
    register(&r, &nx("a", 1, 1), 1);
    register(&r, &nx("a", 1, 2), 2);
    register(&r, &nx("a", 2, 1), 3);
    assert_eq!(read_keys(&r).1, vec![1, 2, 3]);
}

#[test]
fn all_tg_pt_registers_on_every_port_and_unregisters_as_a_group() {
    let r = mem();
    let a1 = nx("a", 1, 1);
    let a2 = nx("a", 1, 2);
    out(&r, &a1, REGISTER, 0, 0, 0x11, ALL_TG_PT).unwrap();
    assert_eq!(read_keys(&r).1, vec![0x11, 0x11]);
    // The nexus through port 2 is registered without having sent anything.
    out(&r, &a2, RESERVE, WE, 0x11, 0, 0).unwrap();
    assert_eq!(read_reservation(&r), Some((0x11, WE)));
    out(&r, &a2, RELEASE, WE, 0x11, 0, 0).unwrap();
    // A key change through one port changes the group.
    out(&r, &a2, REGISTER, 0, 0x11, 0x22, 0).unwrap();
    assert_eq!(read_keys(&r).1, vec![0x22, 0x22]);
    out(&r, &a1, REGISTER, 0, 0x22, 0, 0).unwrap();
    assert!(read_keys(&r).1.is_empty());
}

#[test]
fn spec_i_pt_registers_listed_initiator_ports() {
    let r = mem();
    let a = nx("a", 1, 1);
    let b = nx("b", 2, 1);
    let c = nx("c", 3, 1);
    let mut p = basic(0, 0x77, SPEC_I_PT);
    let mut list = tid(&b.initiator_port);
    list.extend(tid(&c.initiator_port));
    p.extend_from_slice(&(list.len() as u32).to_be_bytes());
    p.extend_from_slice(&list);
    let cdb = prout_cdb(REGISTER, 0, p.len() as u32);
    r.persistent_reserve_out(&a, &cdb, &p, &ports()).unwrap();
    assert_eq!(read_keys(&r).1, vec![0x77; 3]);
    // b is registered through port 1 with key 0x77 and may reserve.
    out(&r, &b, RESERVE, EA, 0x77, 0, 0).unwrap();
    // A registered nexus may not use SPEC_I_PT (with the right key; with a wrong
    // one it is a conflict first).
    conflict(r.persistent_reserve_out(&a, &cdb, &p, &ports()));
    p[0..8].copy_from_slice(&0x77u64.to_be_bytes());
    check_err(
        r.persistent_reserve_out(&a, &cdb, &p, &ports()),
        codes::INVALID_FIELD_IN_CDB,
    );
    // Listing an already registered nexus fails and registers nothing.
    let d = nx("d", 4, 1);
    let mut p2 = basic(0, 0x88, SPEC_I_PT);
    let list = tid(&b.initiator_port);
    p2.extend_from_slice(&(list.len() as u32).to_be_bytes());
    p2.extend_from_slice(&list);
    let cdb2 = prout_cdb(REGISTER, 0, p2.len() as u32);
    check_err(
        r.persistent_reserve_out(&d, &cdb2, &p2, &ports()),
        codes::INVALID_FIELD_IN_PARAM,
    );
    assert_eq!(r.registration_count(), 3);
    // SPEC_I_PT with REGISTER AND IGNORE EXISTING KEY is invalid.
    let cdb3 = prout_cdb(REGISTER_AND_IGNORE, 0, p2.len() as u32);
    check_err(
        r.persistent_reserve_out(&d, &cdb3, &p2, &ports()),
        codes::INVALID_FIELD_IN_PARAM,
    );
}

/// A SPEC_I_PT list naming more initiator ports than can ever be registered
/// is refused (INSUFFICIENT REGISTRATION RESOURCES) without being parsed
/// whole, and registers nothing; one that fits still registers every port.
#[test]
fn a_spec_i_pt_list_longer_than_the_registrations_is_refused() {
    let r = mem();
    let a = nx("a", 1, 1);
    let list_of = |n: usize| {
        let mut list = Vec::new();
        for i in 0..n {
            list.extend(tid(&format!("iqn.2026-12.org.flood,i,0x{i:012x}")));
        }
        list
    };
    let mut p = basic(0, 0x77, SPEC_I_PT);
    let list = list_of(200_000);
    p.extend_from_slice(&(list.len() as u32).to_be_bytes());
    p.extend_from_slice(&list);
    let cdb = prout_cdb(REGISTER, 0, p.len() as u32);
    let started = std::time::Instant::now();
    check_err(
        r.persistent_reserve_out(&a, &cdb, &p, &ports()),
        codes::INSUFFICIENT_REGISTRATION_RESOURCES,
    );
    eprintln!("refused in {:?}", started.elapsed());
    assert_eq!(r.registration_count(), 0);
    let mut p = basic(0, 0x77, SPEC_I_PT);
    let list = list_of(100);
    p.extend_from_slice(&(list.len() as u32).to_be_bytes());
    p.extend_from_slice(&list);
    let cdb = prout_cdb(REGISTER, 0, p.len() as u32);
    r.persistent_reserve_out(&a, &cdb, &p, &ports()).unwrap();
    assert_eq!(r.registration_count(), 101);
}

#[test]
fn registrations_are_capped() {
    let r = mem();
    for i in 0..REGISTRATIONS_MAX as u64 {
        register(&r, &nx("many", i, 1), i + 1);
    }
    check_err(
        out(&r, &nx("many", 5000, 1), REGISTER, 0, 0, 1, 0),
        codes::INSUFFICIENT_REGISTRATION_RESOURCES,
    );
    assert_eq!(r.registration_count(), REGISTRATIONS_MAX);
    // Key changes of existing registrations still work.
    out(&r, &nx("many", 0, 1), REGISTER, 0, 1, 2, 0).unwrap();
}

// ---------------------------------------------------------------- RESERVE / RELEASE

#[test]
fn reserve_rules() {
    let r = mem();
    let a = nx("a", 1, 1);
    let b = nx("b", 2, 1);
    // Unregistered nexus.
    conflict(out(&r, &a, RESERVE, WE, 0, 0, 0));
    register(&r, &a, 0xa);
    register(&r, &b, 0xb);
    let gen = read_keys(&r).0;
    // Wrong key.
    conflict(out(&r, &a, RESERVE, WE, 0xb, 0, 0));
    // Invalid type and scope.
    for bad in [0u8, 2, 4, 9, 0xf] {
        check_err(
            out(&r, &a, RESERVE, bad, 0xa, 0, 0),
            codes::INVALID_FIELD_IN_CDB,
        );
    }
    check_err(
        out(&r, &a, RESERVE, 0x10 | WE, 0xa, 0, 0),
        codes::INVALID_FIELD_IN_CDB,
    );
    out(&r, &a, RESERVE, EA, 0xa, 0, 0).unwrap();
    assert_eq!(read_reservation(&r), Some((0xa, EA)));
    // Same type again: GOOD; another type: conflict; another nexus: conflict.
    out(&r, &a, RESERVE, EA, 0xa, 0, 0).unwrap();
    conflict(out(&r, &a, RESERVE, WE, 0xa, 0, 0));
    conflict(out(&r, &b, RESERVE, EA, 0xb, 0, 0));
    // RESERVE does not bump the generation.
    assert_eq!(read_keys(&r).0, gen);
}

#[test]
fn all_registrants_reservation_is_held_by_every_registrant() {
    for ty in [WEAR, EAAR] {
        let r = mem();
        let a = nx("a", 1, 1);
        let b = nx("b", 2, 1);
        register(&r, &a, 0xa);
        register(&r, &b, 0xb);
        out(&r, &a, RESERVE, ty, 0xa, 0, 0).unwrap();
        assert_eq!(read_reservation(&r), Some((0, ty)));
        // b holds it too: RESERVE of the same type is GOOD.
        out(&r, &b, RESERVE, ty, 0xb, 0, 0).unwrap();
        // The reservation survives a's unregistration (libiscsi reserve_ownership).
        out(&r, &a, REGISTER, 0, 0xa, 0, 0).unwrap();
        assert_eq!(read_reservation(&r), Some((0, ty)));
        // A newcomer holds it as soon as it registers.
        let c = nx("c", 3, 1);
        register(&r, &c, 0xc);
        assert_eq!(r.check(&c, &WRITE10), Access::Allowed);
        out(&r, &c, REGISTER, 0, 0xc, 0, 0).unwrap();
        // ... and goes with the last registrant.
        out(&r, &b, REGISTER, 0, 0xb, 0, 0).unwrap();
        assert_eq!(read_reservation(&r), None);
    }
}

#[test]
fn holder_unregistering_releases_non_all_registrants_reservations() {
    for ty in [WE, EA, WERO, EARO] {
        let r = mem();
        let a = nx("a", 1, 1);
        let b = nx("b", 2, 1);
        register(&r, &a, 0xa);
        register(&r, &b, 0xb);
        out(&r, &a, RESERVE, ty, 0xa, 0, 0).unwrap();
        let uas = out(&r, &a, REGISTER, 0, 0xa, 0, 0).unwrap();
        assert_eq!(read_reservation(&r), None, "type {ty}");
        let want = if ty == WERO || ty == EARO {
            vec![codes::RESERVATIONS_RELEASED]
        } else {
            vec![]
        };
        assert_eq!(uas_for(&uas, &b), want, "type {ty}");
        assert!(uas_for(&uas, &a).is_empty());
    }
}

#[test]
fn release_rules_and_unit_attentions() {
    for ty in ALL_TYPES {
        let r = mem();
        let a = nx("a", 1, 1);
        let b = nx("b", 2, 1);
        let c = nx("c", 3, 1);
        // Unregistered: conflict, even without a reservation.
        conflict(out(&r, &a, RELEASE, ty, 0, 0, 0));
        register(&r, &a, 0xa);
        register(&r, &b, 0xb);
        // No reservation: GOOD.
        out(&r, &a, RELEASE, ty, 0xa, 0, 0).unwrap();
        out(&r, &a, RESERVE, ty, 0xa, 0, 0).unwrap();
        let gen = read_keys(&r).0;
        // Wrong key: conflict.
        conflict(out(&r, &a, RELEASE, ty, 0xb, 0, 0));
        // Wrong type from the holder: INVALID RELEASE OF PERSISTENT RESERVATION.
        let other = if ty == WE { EA } else { WE };
        check_err(
            out(&r, &a, RELEASE, other, 0xa, 0, 0),
            INVALID_RELEASE_OF_PR,
        );
        if ty != WEAR && ty != EAAR {
            // A registered non-holder's release is a GOOD no-op.
            out(&r, &b, RELEASE, ty, 0xb, 0, 0).unwrap();
            assert!(read_reservation(&r).is_some());
        }
        let c_uas = {
            register(&r, &c, 0xc);
            out(&r, &a, RELEASE, ty, 0xa, 0, 0).unwrap()
        };
        assert_eq!(read_reservation(&r), None);
        assert_eq!(read_keys(&r).0, gen + 1, "only c's registration bumped it");
        let want = if ty == WE || ty == EA {
            vec![]
        } else {
            vec![codes::RESERVATIONS_RELEASED]
        };
        assert_eq!(uas_for(&c_uas, &b), want);
        assert_eq!(uas_for(&c_uas, &c), want);
        assert!(uas_for(&c_uas, &a).is_empty());
    }
}

// ---------------------------------------------------------------- access table

/// (holder, registered non-holder, unregistered) x (read, write) for one type, as
/// libiscsi's prout_reserve_access tests expect.
#[test]
fn access_rules_for_every_type() {
    // (type, reg_read, reg_write, unreg_read, unreg_write)
    let table = [
        (EA, false, false, false, false),
        (WE, true, false, true, false),
        (EARO, true, true, false, false),
        (WERO, true, true, true, false),
        (EAAR, true, true, false, false),
        (WEAR, true, true, true, false),
    ];
    let verdict = |ok: bool| {
        if ok {
            Access::Allowed
        } else {
            Access::Conflict
        }
    };
    for (ty, reg_read, reg_write, unreg_read, unreg_write) in table {
        let r = mem();
        let a = nx("a", 1, 1);
        let b = nx("b", 2, 1);
        let u = nx("u", 3, 1);
        register(&r, &a, 0xa);
        register(&r, &b, 0xb);
        out(&r, &a, RESERVE, ty, 0xa, 0, 0).unwrap();
        for cdb in [
            &READ10[..],
            &WRITE10,
            &SYNC_CACHE10,
            &MODE_SENSE6,
            &INQUIRY,
            &TUR,
        ] {
            assert_eq!(r.check(&a, cdb), Access::Allowed, "holder, type {ty}");
        }
        assert_eq!(
            r.check(&b, &READ10),
            verdict(reg_read),
            "reg read, type {ty}"
        );
        assert_eq!(
            r.check(&b, &WRITE10),
            verdict(reg_write),
            "reg write, type {ty}"
        );
        assert_eq!(
            r.check(&b, &MODE_SENSE6),
            verdict(reg_read),
            "reg mode sense {ty}"
        );
        assert_eq!(
            r.check(&u, &READ10),
            verdict(unreg_read),
            "unreg read, type {ty}"
        );
        assert_eq!(
            r.check(&u, &WRITE10),
            verdict(unreg_write),
            "unreg write {ty}"
        );
        assert_eq!(
            r.check(&u, &SYNC_CACHE10),
            verdict(unreg_write),
            "unreg sync {ty}"
        );
        // Always allowed.
        let always: [&[u8]; 8] = [
            &INQUIRY,
            &TUR,
            &[0x03, 0, 0, 0, 18, 0],
            &[0xa0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0],
            &[0x5e, 0, 0, 0, 0, 0, 0, 0, 8, 0],
            &[0xa3, 0x0a, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0],
            &[0x9e, 0x10, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 32, 0, 0],
            &[0x25, 0, 0, 0, 0, 0, 0, 0, 0, 0],
        ];
        for cdb in always {
            assert_eq!(r.check(&u, cdb), Access::Allowed, "{:#x} type {ty}", cdb[0]);
        }
        // libiscsi: unregistering b makes it an unregistered nexus.
        out(&r, &b, REGISTER, 0, 0xb, 0, 0).unwrap();
        assert_eq!(
            r.check(&b, &READ10),
            verdict(unreg_read),
            "b unreg read {ty}"
        );
        assert_eq!(
            r.check(&b, &WRITE10),
            verdict(unreg_write),
            "b unreg write {ty}"
        );
    }
}

#[test]
fn no_reservation_means_no_conflict() {
    let r = mem();
    register(&r, &nx("a", 1, 1), 1);
    assert_eq!(r.check(&nx("u", 1, 1), &WRITE10), Access::Allowed);
    assert_eq!(r.check(&nx("u", 1, 1), &[]), Access::Allowed);
}

// ---------------------------------------------------------------- CLEAR / PREEMPT

#[test]
fn clear_removes_everything_and_preempts_others() {
    let r = mem();
    let a = nx("a", 1, 1);
    let b = nx("b", 2, 1);
    conflict(out(&r, &a, CLEAR, 0, 0, 0, 0));
    register(&r, &a, 0xa);
    register(&r, &b, 0xb);
    out(&r, &a, RESERVE, EA, 0xa, 0, 0).unwrap();
    let gen = read_keys(&r).0;
    conflict(out(&r, &a, CLEAR, 0, 0xb, 0, 0));
    // A registered non-holder may clear.
    let uas = out(&r, &b, CLEAR, 0, 0xb, 0, 0).unwrap();
    assert_eq!(read_keys(&r), (gen + 1, vec![]));
    assert_eq!(read_reservation(&r), None);
    assert_eq!(uas_for(&uas, &a), vec![codes::RESERVATIONS_PREEMPTED]);
    assert!(uas_for(&uas, &b).is_empty());
}

#[test]
fn preempt_removes_registrations_without_reservation() {
    // libiscsi test_prout_preempt_rm_reg.
    let r = mem();
    let a = nx("a", 1, 1);
    let b = nx("b", 2, 1);
    register(&r, &a, 0xa);
    register(&r, &b, 0xb);
    let gen = read_keys(&r).0;
    let uas = out(&r, &b, PREEMPT, EA, 0xb, 0xa, 0).unwrap();
    assert_eq!(read_keys(&r), (gen + 1, vec![0xb]));
    assert_eq!(read_reservation(&r), None);
    assert_eq!(uas_for(&uas, &a), vec![codes::REGISTRATIONS_PREEMPTED]);
    // Unknown key: conflict; unregistered sender: conflict; wrong own key: conflict.
    conflict(out(&r, &b, PREEMPT, EA, 0xb, 0x99, 0));
    conflict(out(&r, &a, PREEMPT, EA, 0xa, 0xb, 0));
    conflict(out(&r, &b, PREEMPT, EA, 0xc, 0xb, 0));
    // No reservation and SARK 0: nothing to preempt.
    conflict(out(&r, &b, PREEMPT, 0, 0xb, 0, 0));
}

#[test]
fn preempt_takes_over_the_reservation() {
    let r = mem();
    let a = nx("a", 1, 1);
    let b = nx("b", 2, 1);
    let c = nx("c", 3, 1);
    register(&r, &a, 0xa);
    register(&r, &b, 0xb);
    register(&r, &c, 0xc);
    out(&r, &a, RESERVE, WE, 0xa, 0, 0).unwrap();
    // SARK 0 against a non-all-registrants reservation.
    check_err(
        out(&r, &b, PREEMPT, WE, 0xb, 0, 0),
        codes::INVALID_FIELD_IN_PARAM,
    );
    // Invalid type when taking the reservation.
    check_err(
        out(&r, &b, PREEMPT, 2, 0xb, 0xa, 0),
        codes::INVALID_FIELD_IN_CDB,
    );
    // b preempts a with a different type: a loses its registration, c is told the
    // reservation went.
    let uas = out(&r, &b, PREEMPT, EARO, 0xb, 0xa, 0).unwrap();
    assert_eq!(read_reservation(&r), Some((0xb, EARO)));
    assert_eq!(read_keys(&r).1, vec![0xb, 0xc]);
    assert_eq!(uas_for(&uas, &a), vec![codes::REGISTRATIONS_PREEMPTED]);
    assert_eq!(uas_for(&uas, &c), vec![codes::RESERVATIONS_RELEASED]);
    assert!(uas_for(&uas, &b).is_empty());
    assert_eq!(r.check(&a, &READ10), Access::Conflict);
    // Preempting a non-holder's key leaves the reservation alone.
    let uas = out(&r, &b, PREEMPT, EARO, 0xb, 0xc, 0).unwrap();
    assert_eq!(read_reservation(&r), Some((0xb, EARO)));
    assert_eq!(uas_for(&uas, &c), vec![codes::REGISTRATIONS_PREEMPTED]);
    // The holder may preempt itself to change the type; nobody else to tell.
    let uas = out(&r, &b, PREEMPT, EA, 0xb, 0xb, 0).unwrap();
    assert_eq!(read_reservation(&r), Some((0xb, EA)));
    assert!(uas.is_empty());
    assert_eq!(read_keys(&r).1, vec![0xb]);
}

#[test]
fn preempt_all_registrants_with_zero_key() {
    let r = mem();
    let a = nx("a", 1, 1);
    let b = nx("b", 2, 1);
    let c = nx("c", 3, 1);
    for (n, k) in [(&a, 0xa), (&b, 0xb), (&c, 0xc)] {
        register(&r, n, k);
    }
    out(&r, &a, RESERVE, WEAR, 0xa, 0, 0).unwrap();
    // A non-zero SARK only removes that registration.
    let uas = out(&r, &b, PREEMPT, WEAR, 0xb, 0xc, 0).unwrap();
    assert_eq!(uas_for(&uas, &c), vec![codes::REGISTRATIONS_PREEMPTED]);
    assert_eq!(read_reservation(&r), Some((0, WEAR)));
    // SARK 0: every other registration goes; b holds a new reservation.
    let uas = out(&r, &b, PREEMPT, EA, 0xb, 0, 0).unwrap();
    assert_eq!(uas_for(&uas, &a), vec![codes::REGISTRATIONS_PREEMPTED]);
    assert_eq!(read_keys(&r).1, vec![0xb]);
    assert_eq!(read_reservation(&r), Some((0xb, EA)));
}

#[test]
fn preempt_and_abort_names_the_preempted_nexuses() {
    let r = mem();
    let a = nx("a", 1, 1);
    let a2 = nx("a", 1, 2);
    let b = nx("b", 2, 1);
    out(&r, &a, REGISTER, 0, 0, 0xa, ALL_TG_PT).unwrap();
    register(&r, &b, 0xb);
    out(&r, &a, RESERVE, WE, 0xa, 0, 0).unwrap();
    let p = basic(0xb, 0xa, 0);
    let o = r
        .persistent_reserve_out_detailed(&b, &prout_cdb(PREEMPT_AND_ABORT, WE, 24), &p, &ports())
        .unwrap();
    assert_eq!(
        o.abort_tasks_of,
        vec![NexusId::of(&a), NexusId::of(&a2)],
        "both I_T nexuses of a"
    );
    assert_eq!(
        uas_for(&o.unit_attentions, &a),
        vec![codes::REGISTRATIONS_PREEMPTED]
    );
    assert_eq!(
        uas_for(&o.unit_attentions, &a2),
        vec![codes::REGISTRATIONS_PREEMPTED]
    );
    assert_eq!(read_reservation(&r), Some((0xb, WE)));
    // Plain PREEMPT aborts nothing.
    register(&r, &a, 0xa);
    let o = r
        .persistent_reserve_out_detailed(&b, &prout_cdb(PREEMPT, WE, 24), &p, &ports())
        .unwrap();
    assert!(o.abort_tasks_of.is_empty());
}

// ---------------------------------------------------------------- REGISTER AND MOVE

fn move_params(rk: u64, sark: u64, unreg: bool, rel: u16, dest: &str) -> Vec<u8> {
    let t = tid(dest);
    let mut p = vec![0u8; 24];
    p[0..8].copy_from_slice(&rk.to_be_bytes());
    p[8..16].copy_from_slice(&sark.to_be_bytes());
    p[17] = if unreg { 0x02 } else { 0 };
    p[18..20].copy_from_slice(&rel.to_be_bytes());
    p[20..24].copy_from_slice(&(t.len() as u32).to_be_bytes());
    p.extend_from_slice(&t);
    p
}

fn register_and_move(r: &Reservations, n: &ItNexus, p: &[u8]) -> Result<Vec<PendingUa>, PrError> {
    r.persistent_reserve_out(
        n,
        &prout_cdb(REGISTER_AND_MOVE, 0, p.len() as u32),
        p,
        &ports(),
    )
}

#[test]
fn register_and_move_hands_the_reservation_over() {
    let r = mem();
    let a = nx("a", 1, 1);
    let b = nx("b", 2, 2);
    let dest = b.initiator_port.to_string();
    register(&r, &a, 0xa);
    // No reservation: a is not the holder.
    conflict(register_and_move(
        &r,
        &a,
        &move_params(0xa, 0xb, false, 2, &dest),
    ));
    out(&r, &a, RESERVE, EA, 0xa, 0, 0).unwrap();
    // Wrong key, zero SARK, unknown port, itself as destination.
    conflict(register_and_move(
        &r,
        &a,
        &move_params(0xb, 0xb, false, 2, &dest),
    ));
    check_err(
        register_and_move(&r, &a, &move_params(0xa, 0, false, 2, &dest)),
        codes::INVALID_FIELD_IN_PARAM,
    );
    check_err(
        register_and_move(&r, &a, &move_params(0xa, 0xb, false, 7, &dest)),
        codes::INVALID_FIELD_IN_PARAM,
    );
    check_err(
        register_and_move(&r, &a, &move_params(0xa, 0xb, false, 1, &a.initiator_port)),
        codes::INVALID_FIELD_IN_PARAM,
    );
    let gen = read_keys(&r).0;
    register_and_move(&r, &a, &move_params(0xa, 0xb, false, 2, &dest)).unwrap();
    assert_eq!(read_keys(&r), (gen + 1, vec![0xa, 0xb]));
    assert_eq!(read_reservation(&r), Some((0xb, EA)));
    assert_eq!(r.check(&b, &WRITE10), Access::Allowed);
    assert_eq!(r.check(&a, &READ10), Access::Conflict);
    // a is no longer the holder.
    conflict(register_and_move(
        &r,
        &a,
        &move_params(0xa, 0xc, false, 1, &dest),
    ));
    // b moves it back to a (already registered: its key becomes the SARK) and
    // unregisters.
    register_and_move(&r, &b, &move_params(0xb, 0xaa, true, 1, &a.initiator_port)).unwrap();
    assert_eq!(read_keys(&r).1, vec![0xaa]);
    assert_eq!(read_reservation(&r), Some((0xaa, EA)));
}

#[test]
fn register_and_move_refuses_all_registrants_and_bad_transport_ids() {
    let r = mem();
    let a = nx("a", 1, 1);
    register(&r, &a, 0xa);
    out(&r, &a, RESERVE, WEAR, 0xa, 0, 0).unwrap();
    let dest = port_name("b", 2);
    conflict(register_and_move(
        &r,
        &a,
        &move_params(0xa, 0xb, false, 1, &dest),
    ));
    out(&r, &a, RELEASE, WEAR, 0xa, 0, 0).unwrap();
    out(&r, &a, RESERVE, WE, 0xa, 0, 0).unwrap();
    // Format 00b (no ISID) and a non-iSCSI protocol are refused.
    let mut p = move_params(0xa, 0xb, false, 1, &dest);
    p[24] = 0x05;
    check_err(register_and_move(&r, &a, &p), codes::INVALID_FIELD_IN_PARAM);
    p[24] = 0x41;
    check_err(register_and_move(&r, &a, &p), codes::INVALID_FIELD_IN_PARAM);
    // Truncated TransportID.
    let mut p = move_params(0xa, 0xb, false, 1, &dest);
    p.truncate(30);
    check_err(
        register_and_move(&r, &a, &p),
        codes::PARAM_LIST_LENGTH_ERROR,
    );
}

// ---------------------------------------------------------------- PR IN

#[test]
fn report_capabilities_bytes() {
    let r = mem();
    let d = prin(&r, &nx("a", 1, 1), 2).unwrap();
    assert_eq!(&d[..], &[0, 8, 0x1c, 0x90, 0xea, 0x01, 0, 0]);
    let path = temp_state_file("caps");
    let r = Reservations::load(Some(&path)).unwrap();
    let d = prin(&r, &nx("a", 1, 1), 2).unwrap();
    assert_eq!((d[2], d[3]), (0x1d, 0x90));
    out(&r, &nx("a", 1, 1), REGISTER, 0, 0, 1, APTPL).unwrap();
    let d = prin(&r, &nx("a", 1, 1), 2).unwrap();
    assert_eq!(d[3], 0x91, "PTPL_A");
    let _ = std::fs::remove_dir_all(path.parent().unwrap());
}

#[test]
fn read_full_status_bytes() {
    let r = mem();
    let a = nx("a", 0x23d000000001, 1);
    let b = nx("b", 2, 2);
    register(&r, &a, 0x1122334455667788);
    register(&r, &b, 0xb);
    out(&r, &a, RESERVE, WERO, 0x1122334455667788, 0, 0).unwrap();
    let d = prin(&r, &a, 3).unwrap();
    let gen = read_keys(&r).0;
    assert_eq!(u32::from_be_bytes(d[0..4].try_into().unwrap()), gen);
    assert_eq!(
        u32::from_be_bytes(d[4..8].try_into().unwrap()) as usize,
        d.len() - 8
    );
    // First descriptor: a, holder.
    let desc = &d[8..];
    assert_eq!(&desc[0..8], &0x1122334455667788u64.to_be_bytes());
    assert_eq!(desc[12], 0x01, "R_HOLDER, ALL_TG_PT=0");
    assert_eq!(desc[13], WERO);
    assert_eq!(&desc[18..20], &[0, 1]);
    let tid_len = u32::from_be_bytes(desc[20..24].try_into().unwrap()) as usize;
    assert_eq!(tid_len % 4, 0);
    let t = &desc[24..24 + tid_len];
    assert_eq!(t[0], 0x45, "iSCSI, format 01b");
    assert_eq!(u16::from_be_bytes([t[2], t[3]]) as usize, tid_len - 4);
    let name = "iqn.2007-10.com.example:a,i,0x23d000000001";
    assert_eq!(&t[4..4 + name.len()], name.as_bytes());
    assert!(t[4 + name.len()..].iter().all(|&b| b == 0));
    assert!(tid_len > 4 + name.len(), "NUL terminated");
    // Second descriptor: b, not a holder.
    let desc = &desc[24 + tid_len..];
    assert_eq!(&desc[0..8], &0xbu64.to_be_bytes());
    assert_eq!((desc[12], desc[13]), (0, 0));
    assert_eq!(&desc[18..20], &[0, 2]);
    let tid_len2 = u32::from_be_bytes(desc[20..24].try_into().unwrap()) as usize;
    assert_eq!(desc.len(), 24 + tid_len2);
    // The TransportID parses back to the port name.
    let (port, used) = wire::parse_transport_id(t, 0).unwrap();
    assert_eq!((port.as_str(), used), (name, tid_len));
}

#[test]
fn read_full_status_marks_every_all_registrants_holder() {
    let r = mem();
    let a = nx("a", 1, 1);
    let b = nx("b", 2, 1);
    register(&r, &a, 0xa);
    register(&r, &b, 0xb);
    out(&r, &a, RESERVE, EAAR, 0xa, 0, 0).unwrap();
    let d = prin(&r, &a, 3).unwrap();
    let mut at = 8;
    let mut seen = 0;
    while at < d.len() {
        assert_eq!((d[at + 12], d[at + 13]), (1, EAAR));
        at += 24 + u32::from_be_bytes(d[at + 20..at + 24].try_into().unwrap()) as usize;
        seen += 1;
    }
    assert_eq!(seen, 2);
}

#[test]
fn prin_service_action_range() {
    let r = mem();
    let a = nx("a", 1, 1);
    for sa in 0..4 {
        prin(&r, &a, sa).unwrap();
    }
    for sa in 4..0x20 {
        check_err(prin(&r, &a, sa), codes::INVALID_FIELD_IN_CDB);
    }
    check_err(
        r.persistent_reserve_in(&a, &[0x5e]),
        codes::INVALID_FIELD_IN_CDB,
    );
}

// ---------------------------------------------------------------- parameter lists

#[test]
fn parameter_list_length_errors() {
    let r = mem();
    let a = nx("a", 1, 1);
    register(&r, &a, 0xa);
    for sa in [
        REGISTER,
        RESERVE,
        RELEASE,
        CLEAR,
        PREEMPT,
        PREEMPT_AND_ABORT,
        REGISTER_AND_IGNORE,
    ] {
        for len in [0u32, 8, 23, 25, 32] {
            let p = vec![0u8; len as usize];
            check_err(
                r.persistent_reserve_out(&a, &prout_cdb(sa, WE, len), &p, &ports()),
                codes::PARAM_LIST_LENGTH_ERROR,
            );
        }
        // Fewer bytes arrived than the CDB announces.
        check_err(
            r.persistent_reserve_out(&a, &prout_cdb(sa, WE, 24), &[0u8; 20], &ports()),
            codes::PARAM_LIST_LENGTH_ERROR,
        );
    }
    check_err(
        r.persistent_reserve_out(
            &a,
            &prout_cdb(REGISTER_AND_MOVE, WE, 20),
            &[0u8; 20],
            &ports(),
        ),
        codes::PARAM_LIST_LENGTH_ERROR,
    );
    // SPEC_I_PT list longer than the parameter list.
    let mut p = basic(0, 1, SPEC_I_PT);
    p.extend_from_slice(&100u32.to_be_bytes());
    check_err(
        r.persistent_reserve_out(&nx("n", 1, 1), &prout_cdb(REGISTER, 0, 28), &p, &ports()),
        codes::PARAM_LIST_LENGTH_ERROR,
    );
    // Nothing changed.
    assert_eq!(read_keys(&r).1, vec![0xa]);
}

#[test]
fn invalid_cdbs() {
    let r = mem();
    let a = nx("a", 1, 1);
    let p = basic(0, 1, 0);
    for sa in 8..0x20 {
        check_err(
            r.persistent_reserve_out(&a, &prout_cdb(sa, 0, 24), &p, &ports()),
            codes::INVALID_FIELD_IN_CDB,
        );
    }
    check_err(
        r.persistent_reserve_out(&a, &[0x5f, 0], &p, &ports()),
        codes::INVALID_FIELD_IN_CDB,
    );
    // APTPL without a state file is not supported (PTPL_C=0).
    check_err(
        out(&r, &a, REGISTER, 0, 0, 1, APTPL),
        codes::INVALID_FIELD_IN_PARAM,
    );
}

// ---------------------------------------------------------------- SPC-2

#[test]
fn spc2_reserve_release() {
    // libiscsi test_reserve6_2initiators.
    let r = mem();
    let a = nx("a", 1, 1);
    let b = nx("b", 2, 1);
    r.reserve(&a).unwrap();
    r.reserve(&a).unwrap();
    conflict(r.reserve(&b));
    r.release(&b).unwrap(); // no-op
    assert_eq!(r.check(&a, &MODE_SENSE6), Access::Allowed);
    assert_eq!(r.check(&b, &MODE_SENSE6), Access::Conflict);
    assert_eq!(r.check(&b, &READ10), Access::Conflict);
    assert_eq!(r.check(&b, &INQUIRY), Access::Allowed);
    assert_eq!(r.check(&b, &[0x17, 0, 0, 0, 0, 0]), Access::Allowed);
    assert_eq!(
        r.check(&b, &[0x5e, 0, 0, 0, 0, 0, 0, 0, 8, 0]),
        Access::Conflict
    );
    // Same initiator through another port is another nexus.
    assert_eq!(r.check(&nx("a", 1, 2), &READ10), Access::Conflict);
    conflict(out(&r, &b, REGISTER, 0, 0, 1, 0));
    conflict(r.reserve(&b));
    r.release(&a).unwrap();
    r.reserve(&b).unwrap();
    r.release(&b).unwrap();
    assert_eq!(r.check(&a, &WRITE10), Access::Allowed);
}

#[test]
fn spc2_reservation_goes_with_nexus_loss_and_reset() {
    let r = mem();
    let a = nx("a", 1, 1);
    let b = nx("b", 2, 1);
    r.reserve(&a).unwrap();
    r.nexus_lost(&b);
    conflict(r.reserve(&b));
    r.nexus_lost(&a);
    r.reserve(&b).unwrap();
    r.reset();
    r.reserve(&a).unwrap();
}

#[test]
fn spc2_commands_under_persistent_reservations() {
    let r = mem();
    let a = nx("a", 1, 1);
    let b = nx("b", 2, 1);
    let u = nx("u", 3, 1);
    register(&r, &a, 0xa);
    // Registrations but no reservation: RESERVE/RELEASE conflict (SPC-2 5.5.1).
    conflict(r.reserve(&u));
    conflict(r.release(&u));
    register(&r, &b, 0xb);
    out(&r, &a, RESERVE, WE, 0xa, 0, 0).unwrap();
    // Holder: GOOD, nothing changes (SPC-4 5.13.3).
    r.reserve(&a).unwrap();
    r.release(&a).unwrap();
    assert_eq!(read_reservation(&r), Some((0xa, WE)));
    // Registered non-holder of a WE reservation, unregistered: conflict.
    conflict(r.reserve(&b));
    conflict(r.reserve(&u));
    out(&r, &a, RELEASE, WE, 0xa, 0, 0).unwrap();
    out(&r, &a, RESERVE, WERO, 0xa, 0, 0).unwrap();
    // Registrant of a registrants-only reservation: GOOD no-op.
    r.reserve(&b).unwrap();
    r.release(&b).unwrap();
    assert_eq!(read_reservation(&r), Some((0xa, WERO)));
    assert_eq!(r.check(&u, &WRITE10), Access::Conflict);
    // All gone: SPC-2 again.
    out(&r, &a, CLEAR, 0, 0xa, 0, 0).unwrap();
    r.reserve(&u).unwrap();
    r.release(&u).unwrap();
}

// ---------------------------------------------------------------- APTPL

#[test]
fn aptpl_persists_and_loads_back() {
    let path = temp_state_file("aptpl");
    let a = nx("a", 1, 1);
    let b = nx("b", 2, 2);
    {
        let r = Reservations::load(Some(&path)).unwrap();
        register(&r, &a, 0xa);
        assert!(!path.exists(), "APTPL off: nothing written");
        out(&r, &b, REGISTER, 0, 0, 0xb, APTPL).unwrap();
        assert!(path.exists());
        out(&r, &a, RESERVE, EARO, 0xa, 0, 0).unwrap();
    }
    let gen;
    {
        let r = Reservations::load(Some(&path)).unwrap();
        gen = read_keys(&r).0;
        assert_eq!(read_keys(&r).1, vec![0xa, 0xb]);
        assert_eq!(read_reservation(&r), Some((0xa, EARO)));
        assert_eq!(prin(&r, &a, 2).unwrap()[3] & 1, 1, "PTPL_A");
        assert_eq!(r.check(&a, &WRITE10), Access::Allowed);
        assert_eq!(r.check(&b, &WRITE10), Access::Allowed);
        assert_eq!(r.check(&nx("u", 1, 1), &READ10), Access::Conflict);
        // Any change is persisted while APTPL is on.
        out(&r, &a, RELEASE, EARO, 0xa, 0, 0).unwrap();
    }
    {
        let r = Reservations::load(Some(&path)).unwrap();
        assert_eq!(read_reservation(&r), None);
        assert_eq!(read_keys(&r).0, gen);
        // APTPL=0 removes the file.
        out(&r, &a, REGISTER, 0, 0xa, 0xa, 0).unwrap();
        assert!(!path.exists());
    }
    let r = Reservations::load(Some(&path)).unwrap();
    assert_eq!(read_keys(&r), (0, vec![]));
    let _ = std::fs::remove_dir_all(path.parent().unwrap());
}

#[test]
fn corrupt_state_file_is_a_typed_error() {
    let path = temp_state_file("corrupt");
    std::fs::write(&path, b"{not json").unwrap();
    assert!(matches!(
        Reservations::load(Some(&path)),
        Err(ScsiError::State { .. })
    ));
    // A reservation held by an unregistered nexus is refused too.
    std::fs::write(
        &path,
        br#"{"version":1,"generation":3,"aptpl":true,"registrations":[],
            "reservation":{"type_code":1,"holder_initiator_port":"x,i,0x000000000001",
            "holder_relative_port_id":1}}"#,
    )
    .unwrap();
    assert!(Reservations::load(Some(&path)).is_err());
    let _ = std::fs::remove_dir_all(path.parent().unwrap());
}

// ---------------------------------------------------------------- robustness

mod fuzz {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        /// No CDB or parameter list panics, and the state stays consistent: at most
        /// the cap of registrations, and a reservation only with its holder registered.
        #[test]
        fn random_commands_never_panic(
            ops in proptest::collection::vec(
                (0u8..4, any::<u8>(), any::<u8>(), 0u8..3,
                 proptest::collection::vec(any::<u8>(), 0..80), any::<bool>()),
                1..24)
        ) {
            let r = mem();
            let nexuses = [nx("a", 1, 1), nx("b", 2, 1), nx("a", 1, 2)];
            for (kind, b1, b2, who, mut params, plausible) in ops {
                let n = &nexuses[who as usize];
                if plausible && params.len() >= 24 {
                    // Keys from a small set so that the state machine gets exercised.
                    let (k0, k8) = (u64::from(params[0] % 3), u64::from(params[8] % 3));
                    params[0..8].copy_from_slice(&k0.to_be_bytes());
                    params[8..16].copy_from_slice(&k8.to_be_bytes());
                    params.truncate(24);
                }
                match kind {
                    0 => {
                        let mut cdb = prout_cdb(b1 & 0x0f, b2, params.len() as u32);
                        if !plausible {
                            cdb[5..9].copy_from_slice(&u32::from(b2).to_be_bytes());
                        }
                        let _ = r.persistent_reserve_out_detailed(n, &cdb, &params, &ports());
                    }
                    1 => {
                        let _ = r.persistent_reserve_in(n, &[0x5e, b1, b2, 0, 0, 0, 0, 0, 8, 0]);
                    }
                    2 => {
                        let _ = r.check(n, &params);
                    }
                    _ => {
                        let _ = if b1 & 1 == 0 { r.reserve(n) } else { r.release(n) };
                    }
                }
                let g = r.inner.lock();
                prop_assert!(g.pr.registrations.len() <= REGISTRATIONS_MAX);
                prop_assert!(g.pr.registrations.iter().all(|x| x.key != 0));
                if let Some(res) = &g.pr.reservation {
                    match &res.holder {
                        None => prop_assert!(!g.pr.registrations.is_empty()),
                        Some(h) => prop_assert!(g.pr.find_id(h).is_some()),
                    }
                }
            }
        }

        /// The parameter-list parsers survive any bytes.
        #[test]
        fn parsers_never_panic(sa in 0u8..8, len in any::<u32>(), params in proptest::collection::vec(any::<u8>(), 0..300)) {
            let mut cdb = prout_cdb(sa, 1, len);
            let _ = wire::ProutCdb::parse(&cdb).map(|c| {
                let _ = wire::parse_basic(&c, &params);
                let _ = wire::parse_move(&c, &params);
            });
            cdb[5..9].copy_from_slice(&(params.len() as u32).to_be_bytes());
            if let Ok(c) = wire::ProutCdb::parse(&cdb) {
                let _ = wire::parse_basic(&c, &params);
                let _ = wire::parse_move(&c, &params);
            }
            let _ = wire::parse_transport_id(&params, 0);
            let _ = access::classify(&params);
        }
    }
}
