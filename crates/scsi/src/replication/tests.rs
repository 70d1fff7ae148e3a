//! Two [`ScsiTarget`]s over separate memory volumes joined by an in-process
//! [`PrReplication`]: node A orders PR changes, node B forwards its PR OUTs to A
//! (through `execute_pr_out_here`) and A pushes every new state to B (through
//! `install_pr_state`).

use crate::pr::tests::temp_dir;
use crate::sense::key;
use crate::*;
use async_trait::async_trait;
use block::MemVolume;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{OnceLock, Weak};
use tokio::sync::Notify;

const IQN: &str = "iqn.2026-11.org.freesan:ha";
const LUN: u64 = 0;

const REGISTER: u8 = 0x00;
const RESERVE: u8 = 0x01;
const RELEASE: u8 = 0x02;
const CLEAR: u8 = 0x03;
const PREEMPT: u8 = 0x04;
const REGISTER_AND_IGNORE: u8 = 0x06;
const REGISTER_AND_MOVE: u8 = 0x07;

const WE: u8 = 1;
const EA: u8 = 3;
const WERO: u8 = 5;

const ALL_TG_PT: u8 = 0x04;
const APTPL: u8 = 0x01;

const TUR: [u8; 6] = [0; 6];
const READ10: [u8; 10] = [0x28, 0, 0, 0, 0, 0, 0, 0, 1, 0];
const WRITE10: [u8; 10] = [0x2a, 0, 0, 0, 0, 0, 0, 0, 1, 0];

/// The in-process link between the two nodes.
struct Link {
    leader: bool,
    partner: OnceLock<Weak<ScsiTarget>>,
    fail_push: AtomicBool,
    /// Varies how long a push takes, so that unordered pushes would overtake each other.
    pushes: AtomicUsize,
    /// Holds the next push until `release` is notified (`held` tells it started).
    hold: AtomicBool,
    held: Notify,
    release: Notify,
}

impl Link {
    fn new(leader: bool) -> Arc<Link> {
        Arc::new(Link {
            leader,
            partner: OnceLock::new(),
            fail_push: AtomicBool::new(false),
            pushes: AtomicUsize::new(0),
            hold: AtomicBool::new(false),
            held: Notify::new(),
            release: Notify::new(),
        })
    }

    fn partner(&self) -> Option<Arc<ScsiTarget>> {
        self.partner.get().and_then(Weak::upgrade)
    }

    /// For a request the leader runs: None on the leader (run it here), else
    /// the leader (after a yield, as a link would take), or an error if gone.
    async fn leader_to_ask(&self) -> Option<Result<Arc<ScsiTarget>, String>> {
        if self.leader {
            return None;
        }
        let Some(partner) = self.partner() else {
            return Some(Err("the leader is gone".into()));
        };
        tokio::task::yield_now().await;
        Some(Ok(partner))
    }
}

#[async_trait]
impl PrReplication for Link {
    async fn forward_out(
        &self,
        lun: u64,
        nexus: &ItNexus,
        cdb: &Bytes,
        data: &Bytes,
    ) -> Option<Response> {
        if self.leader {
            return None;
        }
        let partner = self.partner()?;
        tokio::task::yield_now().await;
        Some(
            partner
                .execute_pr_out_here(lun, nexus, cdb.clone(), data.clone())
                .await,
        )
    }

    async fn push_state(&self, lun: u64, state: Bytes) -> Result<(), String> {
        if self.fail_push.load(Ordering::Relaxed) {
            return Err("link down".into());
        }
        if self.hold.swap(false, Ordering::AcqRel) {
            self.held.notify_one();
            self.release.notified().await;
        }
        let Some(partner) = self.partner() else {
            return Ok(()); // alone
        };
        for _ in 0..self.pushes.fetch_add(1, Ordering::Relaxed) % 7 {
            tokio::task::yield_now().await;
        }
        partner
            .install_pr_state(lun, &state)
            .await
            .map_err(|e| e.to_string())
    }

    async fn forward_spc2_end(
        &self,
        lun: u64,
        holder: Option<&pr::NexusId>,
    ) -> Option<Result<(), String>> {
        match self.leader_to_ask().await? {
            Ok(partner) => Some(partner.end_spc2_here(lun, holder).await),
            Err(e) => Some(Err(e)),
        }
    }

    async fn reset_elsewhere(&self, lun: u64, kind: crate::ResetKind) -> Result<(), String> {
        let Some(partner) = self.partner() else {
            return Ok(()); // alone
        };
        tokio::task::yield_now().await;
        partner.reset_from_partner(lun, kind).await
    }

    async fn forward_set_tpg(
        &self,
        lun: u64,
        nexus: &ItNexus,
        changes: &[(u16, AluaState)],
    ) -> Option<Result<(), String>> {
        let origin = (&*nexus.initiator_port, nexus.relative_port_id);
        match self.leader_to_ask().await? {
            Ok(partner) => Some(
                partner
                    .set_target_port_groups_here(lun, origin, changes)
                    .await,
            ),
            Err(e) => Some(Err(e)),
        }
    }

    async fn push_alua_state(
        &self,
        lun: u64,
        origin: Option<&ItNexus>,
        states: &[(u16, AluaState)],
    ) -> Result<(), String> {
        if self.fail_push.load(Ordering::Relaxed) {
            return Err("link down".into());
        }
        if self.hold.swap(false, Ordering::AcqRel) {
            self.held.notify_one();
            self.release.notified().await;
        }
        let Some(partner) = self.partner() else {
            return Ok(()); // alone
        };
        for _ in 0..self.pushes.fetch_add(1, Ordering::Relaxed) % 7 {
            tokio::task::yield_now().await;
        }
        let origin = origin.map(|n| (&*n.initiator_port, n.relative_port_id));
        partner
            .install_alua_state(lun, origin, states)
            .map_err(|e| e.to_string())
    }
}

fn lun_config(state_file: Option<PathBuf>) -> LunConfig {
    LunConfig {
        naa: [0x60, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15],
        serial: "FSHA01".into(),
        vendor: "FREESAN".into(),
        product: "VIRTUAL DISK".into(),
        revision: "0001".into(),
        read_only: false,
        state_file,
        physical_block_exponent: 0,
        sanitize_rate_bytes_per_s: 0,
    }
}

/// One node as `freesan serve` builds it in a cluster: its own ports (group
/// `node`) plus both nodes' port groups; node 1 has ports 1-2, node 2 ports 3-4.
fn node_config(node: u16, state_file: Option<PathBuf>) -> TargetConfig {
    let own: [u16; 2] = if node == 1 { [1, 2] } else { [3, 4] };
    TargetConfig {
        name: IQN.into(),
        ports: own
            .iter()
            .map(|&id| TargetPort {
                relative_id: id,
                group_id: node,
                name: format!("{IQN},t,0x{id:04x}"),
            })
            .collect(),
        port_groups: vec![
            PortGroup {
                id: 1,
                state: AluaState::ActiveOptimized,
                relative_port_ids: vec![1, 2],
            },
            PortGroup {
                id: 2,
                state: AluaState::ActiveOptimized,
                relative_port_ids: vec![3, 4],
            },
        ],
        luns: vec![(
            LUN,
            lun_config(state_file),
            Arc::new(MemVolume::new(512, 64)),
        )],
    }
}

fn node(n: u16, state_file: Option<PathBuf>) -> Arc<ScsiTarget> {
    Arc::new(ScsiTarget::new(node_config(n, state_file)).unwrap())
}

/// Node A (leader, ports 1-2) and node B (follower, ports 3-4), linked.
fn pair_with(files: Option<(PathBuf, PathBuf)>) -> (Arc<ScsiTarget>, Arc<ScsiTarget>, Arc<Link>) {
    let (fa, fb) = files.map_or((None, None), |(a, b)| (Some(a), Some(b)));
    let a = node(1, fa);
    let b = node(2, fb);
    let (la, lb) = (Link::new(true), Link::new(false));
    la.partner.set(Arc::downgrade(&b)).ok().unwrap();
    lb.partner.set(Arc::downgrade(&a)).ok().unwrap();
    assert!(a.set_pr_replication(LUN, la.clone()));
    assert!(b.set_pr_replication(LUN, lb));
    assert!(!a.set_pr_replication(7, Link::new(true)));
    (a, b, la)
}

fn pair() -> (Arc<ScsiTarget>, Arc<ScsiTarget>) {
    let (a, b, _) = pair_with(None);
    (a, b)
}

fn nexus(initiator: &str, port: u16) -> ItNexus {
    let name = format!("iqn.2007-10.com.example:{initiator}");
    ItNexus {
        initiator_port: Arc::from(format!("{name},i,0x000000000001")),
        initiator_name: Arc::from(name),
        relative_port_id: port,
        chap_user: None,
    }
}

async fn run(t: &ScsiTarget, n: &ItNexus, cdb: &[u8], data: &[u8]) -> Response {
    let cmd = Command {
        cdb: Bytes::copy_from_slice(cdb),
        lun: LUN,
        data_out: Bytes::copy_from_slice(data),
        data_in_len_max: 65536,
        attr: TaskAttr::Simple,
    };
    t.execute(n, cmd).await
}

/// (key, asc, ascq) of a CHECK CONDITION (fixed format).
fn sense_of(r: &Response) -> (u8, u8, u8) {
    assert_eq!(r.status, status::CHECK_CONDITION, "{r:?}");
    let s = r.sense.as_ref().unwrap();
    (s[2] & 0xf, s[12], s[13])
}

/// A nexus on `t` with its POWER ON unit attention consumed.
async fn ready(t: &ScsiTarget, initiator: &str, port: u16) -> ItNexus {
    let n = nexus(initiator, port);
    let r = run(t, &n, &TUR, &[]).await;
    assert_eq!(sense_of(&r), (key::UNIT_ATTENTION, 0x29, 0x00));
    assert_eq!(run(t, &n, &TUR, &[]).await.status, status::GOOD);
    n
}

/// The next unit attention of `n` (consumed), or None when TEST UNIT READY is GOOD.
async fn ua(t: &ScsiTarget, n: &ItNexus) -> Option<(u8, u8)> {
    let r = run(t, n, &TUR, &[]).await;
    if r.status == status::GOOD {
        return None;
    }
    let (k, asc, ascq) = sense_of(&r);
    assert_eq!(k, key::UNIT_ATTENTION);
    Some((asc, ascq))
}

fn prout_cdb(sa: u8, type_code: u8, len: u32) -> [u8; 10] {
    let mut c = [0x5f, sa, type_code, 0, 0, 0, 0, 0, 0, 0];
    c[5..9].copy_from_slice(&len.to_be_bytes());
    c
}

async fn prout(
    t: &ScsiTarget,
    n: &ItNexus,
    sa: u8,
    type_code: u8,
    rk: u64,
    sark: u64,
    flags: u8,
) -> Response {
    let mut p = [0u8; 24];
    p[0..8].copy_from_slice(&rk.to_be_bytes());
    p[8..16].copy_from_slice(&sark.to_be_bytes());
    p[20] = flags;
    run(t, n, &prout_cdb(sa, type_code, 24), &p).await
}

async fn good(t: &ScsiTarget, n: &ItNexus, sa: u8, type_code: u8, rk: u64, sark: u64, f: u8) {
    let r = prout(t, n, sa, type_code, rk, sark, f).await;
    assert_eq!(r.status, status::GOOD, "{r:?}");
}

async fn prin(t: &ScsiTarget, n: &ItNexus, sa: u8) -> Bytes {
    let r = run(t, n, &[0x5e, sa, 0, 0, 0, 0, 0, 0x10, 0, 0], &[]).await;
    assert_eq!(r.status, status::GOOD, "{r:?}");
    r.data_in
}

/// PRgeneration and keys from READ KEYS.
async fn read_keys(t: &ScsiTarget, n: &ItNexus) -> (u32, Vec<u64>) {
    let d = prin(t, n, 0).await;
    let gen = u32::from_be_bytes(d[0..4].try_into().unwrap());
    let keys = d[8..]
        .chunks(8)
        .map(|c| u64::from_be_bytes(c.try_into().unwrap()))
        .collect();
    (gen, keys)
}

/// Relative target port ids of the READ FULL STATUS descriptors.
async fn full_status_ports(t: &ScsiTarget, n: &ItNexus) -> Vec<u16> {
    let d = prin(t, n, 3).await;
    let mut at = 8;
    let mut ports = Vec::new();
    while at + 24 <= d.len() {
        ports.push(u16::from_be_bytes([d[at + 18], d[at + 19]]));
        at += 24 + u32::from_be_bytes(d[at + 20..at + 24].try_into().unwrap()) as usize;
    }
    ports
}

#[tokio::test]
async fn write_exclusive_taken_through_a_is_enforced_on_b() {
    let (a, b) = pair();
    let holder_a = ready(&a, "holder", 1).await;
    good(&a, &holder_a, REGISTER, 0, 0, 0x11, ALL_TG_PT).await;
    good(&a, &holder_a, RESERVE, WE, 0x11, 0, 0).await;
    assert_eq!(a.pr_state(LUN), b.pr_state(LUN));

    let other_b = ready(&b, "other", 3).await;
    let r = run(&b, &other_b, &WRITE10, &[0; 512]).await;
    assert_eq!(r.status, status::RESERVATION_CONFLICT);
    assert_eq!(run(&b, &other_b, &READ10, &[]).await.status, status::GOOD);
    assert_eq!(
        run(&a, &holder_a, &WRITE10, &[0; 512]).await.status,
        status::GOOD
    );
    // The holder of a Write Exclusive reservation is one I_T nexus (SPC-4 5.13.10):
    // the same initiator through B is registered (ALL_TG_PT) but not the holder.
    let holder_via_b = ready(&b, "holder", 3).await;
    let r = run(&b, &holder_via_b, &WRITE10, &[0; 512]).await;
    assert_eq!(r.status, status::RESERVATION_CONFLICT);

    // Reserved again through B's port (the command runs on A): the holder writes
    // through B, everybody else conflicts on both nodes.
    good(&a, &holder_a, RELEASE, WE, 0x11, 0, 0).await;
    good(&b, &holder_via_b, RESERVE, WE, 0x11, 0, 0).await;
    assert_eq!(
        run(&b, &holder_via_b, &WRITE10, &[0; 512]).await.status,
        status::GOOD
    );
    let r = run(&b, &other_b, &WRITE10, &[0; 512]).await;
    assert_eq!(r.status, status::RESERVATION_CONFLICT);
    let r = run(&a, &holder_a, &WRITE10, &[0; 512]).await;
    assert_eq!(r.status, status::RESERVATION_CONFLICT);
    assert_eq!(a.pr_state(LUN), b.pr_state(LUN));
    // WE releases raise no unit attention anywhere.
    for (t, n) in [(&a, &holder_a), (&b, &holder_via_b), (&b, &other_b)] {
        assert_eq!(ua(t, n).await, None);
    }
}

#[tokio::test]
async fn all_tg_pt_registration_through_a_covers_b_ports() {
    let (a, b) = pair();
    let i_a = ready(&a, "init", 2).await;
    good(&a, &i_a, REGISTER, 0, 0, 0x22, ALL_TG_PT).await;
    let i_b = ready(&b, "init", 4).await;
    let mut ports = full_status_ports(&b, &i_b).await;
    ports.sort_unstable();
    assert_eq!(ports, vec![1, 2, 3, 4], "every port of both nodes");
    good(&a, &i_a, RESERVE, WERO, 0x22, 0, 0).await;

    // The same initiator through B's port 4 is a registrant: it may write.
    let r = run(&b, &i_b, &WRITE10, &[0; 512]).await;
    assert_eq!(r.status, status::GOOD);
    let stranger = ready(&b, "stranger", 4).await;
    let r = run(&b, &stranger, &WRITE10, &[0; 512]).await;
    assert_eq!(r.status, status::RESERVATION_CONFLICT);
}

#[tokio::test]
async fn all_tg_pt_and_register_and_move_know_the_partner_ports_without_replication() {
    let t = node(1, None);
    let n = ready(&t, "solo", 1).await;
    good(&t, &n, REGISTER, 0, 0, 0x5, ALL_TG_PT).await;
    assert_eq!(full_status_ports(&t, &n).await, vec![1, 2, 3, 4]);
    good(&t, &n, RESERVE, WE, 0x5, 0, 0).await;
    // REGISTER AND MOVE to an initiator on the partner's port 3.
    let dest = nexus("dest", 3);
    let tid = {
        // iSCSI TransportID, initiator port format: NUL-terminated, padded to 4 bytes.
        let mut t = vec![0x45, 0, 0, 0];
        t.extend_from_slice(dest.initiator_port.as_bytes());
        t.push(0);
        while t.len() % 4 != 0 {
            t.push(0);
        }
        let len = (t.len() - 4) as u16;
        t[2..4].copy_from_slice(&len.to_be_bytes());
        t
    };
    let mut p = vec![0u8; 24];
    p[0..8].copy_from_slice(&0x5u64.to_be_bytes());
    p[8..16].copy_from_slice(&0x6u64.to_be_bytes());
    p[18..20].copy_from_slice(&3u16.to_be_bytes());
    p[20..24].copy_from_slice(&(tid.len() as u32).to_be_bytes());
    p.extend_from_slice(&tid);
    let cdb = prout_cdb(REGISTER_AND_MOVE, WE, p.len() as u32);
    let r = run(&t, &n, &cdb, &p).await;
    assert_eq!(r.status, status::GOOD, "{r:?}");
    let d = prin(&t, &n, 1).await;
    assert_eq!(u64::from_be_bytes(d[8..16].try_into().unwrap()), 0x6);
}

#[tokio::test]
async fn register_through_b_then_preempt_through_a() {
    let (a, b) = pair();
    let vb = ready(&b, "victim", 3).await;
    let bystander = ready(&b, "bystander", 4).await;
    good(&b, &vb, REGISTER, 0, 0, 0xb, 0).await;
    let pa = ready(&a, "preempter", 1).await;
    good(&a, &pa, REGISTER, 0, 0, 0xa, 0).await;
    let both = read_keys(&a, &pa).await;
    assert_eq!(both.1, vec![0xb, 0xa]);
    assert_eq!(read_keys(&b, &vb).await, both);

    good(&a, &pa, PREEMPT, 0, 0xa, 0xb, 0).await;
    let after = read_keys(&a, &pa).await;
    assert_eq!(after, (both.0 + 1, vec![0xa]));
    assert_eq!(read_keys(&b, &bystander).await, after);
    // Only the preempted nexus hears of it, once.
    assert_eq!(ua(&b, &vb).await, Some((0x2a, 0x05)));
    assert_eq!(ua(&b, &vb).await, None);
    assert_eq!(ua(&b, &bystander).await, None);
    assert_eq!(ua(&a, &pa).await, None);
    // Its key is gone on B too: it cannot use it any more.
    let r = prout(&b, &vb, REGISTER, 0, 0xb, 0xc, 0).await;
    assert_eq!(r.status, status::RESERVATION_CONFLICT);
}

#[tokio::test]
async fn the_sender_of_a_forwarded_command_gets_no_unit_attention_of_its_own() {
    let (a, b) = pair();
    let b1 = ready(&b, "b1", 3).await;
    let b2 = ready(&b, "b2", 4).await;
    let a1 = ready(&a, "a1", 2).await;
    good(&b, &b1, REGISTER_AND_IGNORE, 0, 0, 0x1, 0).await;
    good(&b, &b2, REGISTER_AND_IGNORE, 0, 0, 0x2, 0).await;
    good(&a, &a1, REGISTER_AND_IGNORE, 0, 0, 0x3, 0).await;
    good(&b, &b1, RESERVE, WERO, 0x1, 0, 0).await;
    // A Registrants Only release tells the other registrants, not the releaser.
    good(&b, &b1, RELEASE, WERO, 0x1, 0, 0).await;
    assert_eq!(ua(&b, &b1).await, None);
    assert_eq!(ua(&b, &b2).await, Some((0x2a, 0x04)));
    assert_eq!(ua(&a, &a1).await, Some((0x2a, 0x04)));
    // CLEAR removes every registration; the others hear RESERVATIONS PREEMPTED.
    good(&b, &b1, CLEAR, 0, 0x1, 0, 0).await;
    assert_eq!(ua(&b, &b1).await, None);
    assert_eq!(ua(&b, &b2).await, Some((0x2a, 0x03)));
    assert_eq!(ua(&a, &a1).await, Some((0x2a, 0x03)));
    assert_eq!(read_keys(&a, &a1).await.1, Vec::<u64>::new());
    assert_eq!(a.pr_state(LUN), b.pr_state(LUN));
}

#[tokio::test]
async fn read_keys_and_reservation_are_the_same_through_either_node() {
    let (a, b) = pair();
    let x = ready(&a, "x", 1).await;
    let y = ready(&b, "y", 3).await;
    good(&a, &x, REGISTER, 0, 0, 0x1234, 0).await;
    good(&b, &y, REGISTER, 0, 0, 0x5678, ALL_TG_PT).await;
    good(&b, &y, RESERVE, EA, 0x5678, 0, 0).await;
    good(&a, &x, REGISTER, 0, 0x1234, 0x4321, 0).await;
    let keys_a = prin(&a, &x, 0).await;
    let keys_b = prin(&b, &y, 0).await;
    assert_eq!(keys_a, keys_b);
    // x's key, then y's on every port of both nodes (ALL_TG_PT); RESERVE keeps the
    // generation.
    assert_eq!(
        read_keys(&b, &y).await,
        (3, vec![0x4321, 0x5678, 0x5678, 0x5678, 0x5678])
    );
    assert_eq!(prin(&a, &x, 1).await, prin(&b, &y, 1).await);
    assert_eq!(prin(&a, &x, 3).await, prin(&b, &y, 3).await);
}

/// Sends a PR OUT again as long as it only reports a unit attention (what an
/// initiator does).
async fn prout_until_done(
    t: &ScsiTarget,
    n: &ItNexus,
    sa: u8,
    type_code: u8,
    rk: u64,
    sark: u64,
) -> Response {
    loop {
        let r = prout(t, n, sa, type_code, rk, sark, 0).await;
        if r.status == status::CHECK_CONDITION && sense_of(&r).0 == key::UNIT_ATTENTION {
            continue;
        }
        return r;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_pr_outs_through_both_nodes_converge() {
    let (a, b) = pair();
    let mut tasks = Vec::new();
    for i in 0..16u64 {
        let (t, port) = if i % 2 == 0 {
            (a.clone(), 1 + (i as u16 / 2) % 2)
        } else {
            (b.clone(), 3 + (i as u16 / 2) % 2)
        };
        let n = ready(&t, &format!("c{i}"), port).await;
        tasks.push(tokio::spawn(async move {
            let key = 0x100 + i;
            let r = prout_until_done(&t, &n, REGISTER, 0, 0, key).await;
            assert_eq!(r.status, status::GOOD, "{r:?}");
            let r = prout_until_done(&t, &n, RESERVE, WE, key, 0).await;
            assert!(matches!(
                r.status,
                status::GOOD | status::RESERVATION_CONFLICT
            ));
            let r = prout_until_done(&t, &n, REGISTER, 0, key, key + 0x1000).await;
            assert_eq!(r.status, status::GOOD, "{r:?}");
            if i % 4 == 1 || i % 4 == 2 {
                let r = prout_until_done(&t, &n, REGISTER, 0, key + 0x1000, 0).await;
                assert_eq!(r.status, status::GOOD, "{r:?}");
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let state = a.pr_state(LUN).unwrap();
    assert_eq!(Some(&state), b.pr_state(LUN).as_ref());
    let probe_a = nexus("probe", 1);
    let probe_b = nexus("probe", 3);
    run(&a, &probe_a, &TUR, &[]).await;
    run(&b, &probe_b, &TUR, &[]).await;
    let (gen, mut keys) = read_keys(&a, &probe_a).await;
    assert_eq!(read_keys(&b, &probe_b).await, (gen, keys.clone()));
    assert_eq!(gen, 16 * 2 + 8, "every REGISTER ran exactly once");
    keys.sort_unstable();
    let want: Vec<u64> = (0..16u64)
        .filter(|i| !(i % 4 == 1 || i % 4 == 2))
        .map(|i| 0x1100 + i)
        .collect();
    assert_eq!(keys, want);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pr_out_waits_for_the_push_of_the_previous_one() {
    let (a, b, la) = pair_with(None);
    let x = ready(&a, "x", 1).await;
    let y = ready(&a, "y", 2).await;
    la.hold.store(true, Ordering::Release);
    let first = {
        let a = a.clone();
        tokio::spawn(async move { prout(&a, &x, REGISTER, 0, 0, 0x1, 0).await })
    };
    la.held.notified().await;
    let second = {
        let a = a.clone();
        tokio::spawn(async move { prout(&a, &y, REGISTER, 0, 0, 0x2, 0).await })
    };
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    assert!(
        !second.is_finished(),
        "ran while the previous push was pending"
    );
    la.release.notify_one();
    assert_eq!(first.await.unwrap().status, status::GOOD);
    assert_eq!(second.await.unwrap().status, status::GOOD);
    assert_eq!(
        a.pr_state(LUN),
        b.pr_state(LUN),
        "the older state came last"
    );
}

/// Whether `arrived` holds within 5 s: a push whose command was dropped ends
/// on its own, with nothing of its own to await.
async fn pushed(arrived: impl Fn() -> bool) -> bool {
    for _ in 0..500 {
        if arrived() {
            return true;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    false
}

/// Runs `command` on its own task until its push to the partner starts, drops
/// it there (aborted), then lets the push go on.
async fn dropped_during_its_push(
    link: &Link,
    command: impl std::future::Future<Output = Response> + Send + 'static,
) {
    link.hold.store(true, Ordering::Release);
    let cmd = tokio::spawn(command);
    link.held.notified().await;
    cmd.abort();
    assert!(cmd.await.unwrap_err().is_cancelled());
    link.release.notify_one();
}

/// A PR OUT whose command is dropped (aborted, its connection lost) while its
/// new state is pushed still brings the partner up to date: the change is made
/// here, and a retry would change nothing, so push nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pr_out_dropped_during_its_push_still_reaches_the_partner() {
    let (a, b, la) = pair_with(None);
    let x = ready(&a, "x", 1).await;
    let a2 = a.clone();
    dropped_during_its_push(
        &la,
        async move { prout(&a2, &x, REGISTER, 0, 0, 0x1, 0).await },
    )
    .await;
    assert!(
        pushed(|| a.pr_state(LUN) == b.pr_state(LUN)).await,
        "the partner never got the registration"
    );
    let m = ready(&b, "m", 3).await;
    assert_eq!(read_keys(&b, &m).await.1, vec![0x1]);
}

#[tokio::test]
async fn failed_push_answers_internal_target_failure_and_keeps_the_change() {
    let (a, b, la) = pair_with(None);
    la.fail_push.store(true, Ordering::Relaxed);
    let n = ready(&a, "n", 1).await;
    let r = prout(&a, &n, REGISTER, 0, 0, 0x9, 0).await;
    assert_eq!(sense_of(&r), (key::HARDWARE_ERROR, 0x44, 0x00));
    assert_eq!(read_keys(&a, &n).await, (1, vec![0x9]));
    let m = ready(&b, "m", 3).await;
    assert_eq!(read_keys(&b, &m).await, (0, vec![]));
    // The next change carries the whole state.
    la.fail_push.store(false, Ordering::Relaxed);
    good(&a, &n, REGISTER, 0, 0x9, 0xa, 0).await;
    assert_eq!(read_keys(&b, &m).await, (2, vec![0xa]));
    // A forwarded command whose push fails reports the same through the follower.
    la.fail_push.store(true, Ordering::Relaxed);
    let r = prout(&b, &m, REGISTER, 0, 0, 0xb, 0).await;
    assert_eq!(sense_of(&r), (key::HARDWARE_ERROR, 0x44, 0x00));
    assert_eq!(read_keys(&a, &n).await, (3, vec![0xa, 0xb]));
    assert_eq!(read_keys(&b, &m).await, (2, vec![0xa]));
    // The link is back: a snapshot push brings B up to date; m's new registration
    // is not a unit attention.
    assert!(a.push_pr_state(LUN).await.is_err(), "still down");
    la.fail_push.store(false, Ordering::Relaxed);
    a.push_pr_state(LUN).await.unwrap();
    assert_eq!(a.pr_state(LUN), b.pr_state(LUN));
    assert_eq!(ua(&b, &m).await, None);
    assert!(a.push_pr_state(9).await.is_err());
    assert!(
        node(1, None).push_pr_state(LUN).await.is_err(),
        "no replication"
    );
}

/// Consumes every pending unit attention of `nexuses` on `t`.
async fn drain<const N: usize>(t: &ScsiTarget, nexuses: [&ItNexus; N]) {
    for n in nexuses {
        while ua(t, n).await.is_some() {}
    }
}

#[tokio::test]
async fn snapshot_install_derives_unit_attentions_from_the_difference() {
    // Node C builds the states; node B installs snapshots of them.
    let c = node(2, None);
    let b = node(2, None);
    let (c1, c2, c3) = (
        ready(&c, "c1", 3).await,
        ready(&c, "c2", 3).await,
        ready(&c, "c3", 4).await,
    );
    let (b1, b2, b3) = (
        ready(&b, "c1", 3).await,
        ready(&b, "c2", 3).await,
        ready(&b, "c3", 4).await,
    );
    good(&c, &c1, REGISTER, 0, 0, 0x1, 0).await;
    good(&c, &c2, REGISTER, 0, 0, 0x2, 0).await;
    good(&c, &c1, RESERVE, WERO, 0x1, 0, 0).await;
    let s1 = c.pr_state(LUN).unwrap();
    b.install_pr_state(LUN, &s1).await.unwrap();
    assert_eq!(b.pr_state(LUN).unwrap(), s1);
    // New registrations and a new reservation: no unit attention.
    for n in [&b1, &b2, &b3] {
        assert_eq!(ua(&b, n).await, None);
    }
    let r = run(&b, &b3, &WRITE10, &[0; 512]).await;
    assert_eq!(r.status, status::RESERVATION_CONFLICT);
    assert_eq!(run(&b, &b2, &WRITE10, &[0; 512]).await.status, status::GOOD);
    // The same state again: nothing.
    b.install_pr_state(LUN, &s1).await.unwrap();
    assert_eq!(ua(&b, &b2).await, None);

    // Registrants Only released: surviving registrants but the old holder hear it.
    good(&c, &c1, RELEASE, WERO, 0x1, 0, 0).await;
    drain(&c, [&c1, &c2, &c3]).await;
    b.install_pr_state(LUN, &c.pr_state(LUN).unwrap())
        .await
        .unwrap();
    assert_eq!(ua(&b, &b1).await, None);
    assert_eq!(ua(&b, &b2).await, Some((0x2a, 0x04)));
    assert_eq!(ua(&b, &b3).await, None, "not a registrant");

    // Preempted with a type change: the preempted registration hears REGISTRATIONS
    // PREEMPTED, the new holder nothing, c3 (registered now) RESERVATIONS RELEASED.
    good(&c, &c1, RESERVE, WE, 0x1, 0, 0).await;
    good(&c, &c3, REGISTER, 0, 0, 0x3, 0).await;
    b.install_pr_state(LUN, &c.pr_state(LUN).unwrap())
        .await
        .unwrap();
    for n in [&b1, &b2, &b3] {
        assert_eq!(ua(&b, n).await, None);
    }
    good(&c, &c2, PREEMPT, EA, 0x2, 0x1, 0).await;
    drain(&c, [&c1, &c2, &c3]).await;
    b.install_pr_state(LUN, &c.pr_state(LUN).unwrap())
        .await
        .unwrap();
    assert_eq!(ua(&b, &b1).await, Some((0x2a, 0x05)));
    assert_eq!(ua(&b, &b2).await, None);
    assert_eq!(ua(&b, &b3).await, Some((0x2a, 0x04)));
    assert_eq!(b.pr_state(LUN), c.pr_state(LUN));

    // Write Exclusive released by its holder: no unit attention (SPC-4 5.13.11.2.2).
    good(&c, &c2, RELEASE, EA, 0x2, 0, 0).await;
    drain(&c, [&c1, &c2, &c3]).await;
    good(&c, &c2, RESERVE, WE, 0x2, 0, 0).await;
    b.install_pr_state(LUN, &c.pr_state(LUN).unwrap())
        .await
        .unwrap();
    assert_eq!(ua(&b, &b3).await, Some((0x2a, 0x04)), "EA gone");
    good(&c, &c2, RELEASE, WE, 0x2, 0, 0).await;
    b.install_pr_state(LUN, &c.pr_state(LUN).unwrap())
        .await
        .unwrap();
    assert_eq!(ua(&b, &b3).await, None);

    // Nobody registered any more (a CLEAR): RESERVATIONS PREEMPTED for everybody.
    good(&c, &c2, CLEAR, 0, 0x2, 0, 0).await;
    b.install_pr_state(LUN, &c.pr_state(LUN).unwrap())
        .await
        .unwrap();
    assert_eq!(ua(&b, &b2).await, Some((0x2a, 0x03)));
    assert_eq!(ua(&b, &b3).await, Some((0x2a, 0x03)));
    assert_eq!(ua(&b, &b1).await, None, "preempted before");
}

#[tokio::test]
async fn installed_aptpl_state_is_persisted_like_a_local_change() {
    let (da, db) = (temp_dir("a"), temp_dir("b"));
    let (fa, fb) = (da.join("lun0.pr.json"), db.join("lun0.pr.json"));
    let (a, b, _) = pair_with(Some((fa.clone(), fb.clone())));
    let n = ready(&b, "n", 3).await;
    good(&b, &n, REGISTER, 0, 0, 0x77, APTPL).await;
    good(&b, &n, RESERVE, WE, 0x77, 0, 0).await;
    assert!(fa.exists() && fb.exists());
    let reloaded = ScsiTarget::new(node_config(2, Some(fb.clone()))).unwrap();
    assert_eq!(reloaded.pr_state(LUN), b.pr_state(LUN));
    assert_eq!(a.pr_state(LUN), b.pr_state(LUN));
    // APTPL turned off removes the file on both nodes.
    good(&b, &n, REGISTER, 0, 0x77, 0x77, 0).await;
    assert!(!fa.exists() && !fb.exists());
    let _ = std::fs::remove_dir_all(da);
    let _ = std::fs::remove_dir_all(db);
}

#[tokio::test]
async fn bad_input_to_the_replication_entry_points() {
    let (a, b) = pair();
    let n = ready(&b, "n", 3).await;
    let r = a
        .execute_pr_out_here(LUN, &n, Bytes::copy_from_slice(&TUR), Bytes::new())
        .await;
    assert_eq!(sense_of(&r), (key::ILLEGAL_REQUEST, 0x20, 0x00));
    let r = a
        .execute_pr_out_here(
            9,
            &n,
            Bytes::copy_from_slice(&prout_cdb(0, 0, 0)),
            Bytes::new(),
        )
        .await;
    assert_eq!(sense_of(&r), (key::ILLEGAL_REQUEST, 0x25, 0x00));
    assert!(matches!(
        b.install_pr_state(LUN, b"{not json").await,
        Err(ScsiError::PrState(_))
    ));
    assert!(matches!(
        b.install_pr_state(9, &a.pr_state(LUN).unwrap()).await,
        Err(ScsiError::Config(_))
    ));
    assert_eq!(b.pr_state(9), None);
    // A short parameter list is refused by the leader, as it would be locally.
    let r = run(&b, &n, &prout_cdb(REGISTER, 0, 24), &[0; 8]).await;
    assert_eq!(r.status, status::CHECK_CONDITION);
}

/// Records what [`TaskAbort`] was asked to abort on one node.
#[derive(Default)]
struct AbortLog(parking_lot::Mutex<Vec<(u64, Vec<String>)>>);

#[async_trait]
impl TaskAbort for AbortLog {
    async fn abort_tasks(&self, target_lun: u64, victims: &[pr::NexusId]) {
        let mut names: Vec<String> = victims
            .iter()
            .map(|v| format!("{}@{}", v.initiator_port, v.relative_port_id))
            .collect();
        names.sort();
        self.0.lock().push((target_lun, names));
    }

    async fn abort_lu_tasks(&self, target_lun: u64) -> bool {
        self.0.lock().push((target_lun, vec!["every nexus".into()]));
        true
    }
}

fn named(n: &ItNexus) -> String {
    format!("{}@{}", n.initiator_port, n.relative_port_id)
}

#[tokio::test]
async fn preempt_and_abort_aborts_the_victims_tasks_on_both_nodes() {
    const PREEMPT_AND_ABORT: u8 = 0x05;
    let (a, b) = pair();
    let (log_a, log_b) = (Arc::new(AbortLog::default()), Arc::new(AbortLog::default()));
    a.set_task_abort(log_a.clone());
    b.set_task_abort(log_b.clone());
    // The victim registered through both nodes (one nexus each); the preempter
    // sends PREEMPT AND ABORT through B, the follower, so the leader runs it for B.
    let va = ready(&a, "victim", 1).await;
    let vb = ready(&b, "victim", 3).await;
    let pb = ready(&b, "preempter", 4).await;
    good(&a, &va, REGISTER, 0, 0, 0xb, 0).await;
    good(&b, &vb, REGISTER, 0, 0, 0xb, 0).await;
    good(&b, &pb, REGISTER, 0, 0, 0xa, 0).await;
    good(&a, &va, RESERVE, WE, 0xb, 0, 0).await;
    assert!(log_a.0.lock().is_empty() && log_b.0.lock().is_empty());

    good(&b, &pb, PREEMPT_AND_ABORT, WE, 0xa, 0xb, 0).await;
    let victims = {
        let mut v = vec![named(&va), named(&vb)];
        v.sort();
        v
    };
    // Each node was asked to abort both victim nexuses' tasks on the LU, before the
    // command answered; the sender's own nexus is never among them.
    assert_eq!(*log_a.0.lock(), vec![(LUN, victims.clone())]);
    assert_eq!(*log_b.0.lock(), vec![(LUN, victims)]);
    assert_eq!(read_keys(&b, &pb).await.1, vec![0xa]);

    assert_eq!(ua(&a, &va).await, Some((0x2a, 0x05)));
    assert_eq!(ua(&b, &vb).await, Some((0x2a, 0x05)));

    // A plain PREEMPT aborts nothing: neither node is asked.
    good(&a, &va, REGISTER, 0, 0, 0xc, 0).await;
    good(&b, &pb, PREEMPT, WE, 0xa, 0xc, 0).await;
    assert_eq!(ua(&a, &va).await, Some((0x2a, 0x05)));
    assert_eq!(log_a.0.lock().len(), 1);
    assert_eq!(log_b.0.lock().len(), 1);

    // A nexus preempting its own key (held by another nexus too, on the other node)
    // aborts that other nexus' tasks on both nodes, never its own (its registration
    // goes too, as for any nexus holding the preempted key).
    good(&a, &va, REGISTER, 0, 0, 0xd, 0).await;
    good(&b, &vb, REGISTER, 0, 0, 0xd, 0).await;
    good(&a, &va, PREEMPT_AND_ABORT, WE, 0xd, 0xd, 0).await;
    assert_eq!(
        log_a.0.lock().last().cloned(),
        Some((LUN, vec![named(&vb)]))
    );
    assert_eq!(
        log_b.0.lock().last().cloned(),
        Some((LUN, vec![named(&vb)]))
    );
    assert_eq!(
        read_keys(&b, &pb).await.1,
        vec![0xa],
        "every 0xd registration went"
    );
}

// ---------------------------------------------------------------- explicit ALUA

/// SET TARGET PORT GROUPS with (state code, group) descriptors.
async fn stpg(t: &ScsiTarget, n: &ItNexus, descs: &[(u8, u16)]) -> Response {
    let mut p = vec![0u8; 4];
    for &(state, group) in descs {
        p.extend_from_slice(&[state, 0]);
        p.extend_from_slice(&group.to_be_bytes());
    }
    let mut c = [0xa4, 0x0a, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
    c[6..10].copy_from_slice(&(p.len() as u32).to_be_bytes());
    run(t, n, &c, &p).await
}

/// Access state codes of groups 1 and 2 from REPORT TARGET PORT GROUPS.
async fn rtpg(t: &ScsiTarget, n: &ItNexus) -> [u8; 2] {
    let r = run(t, n, &[0xa3, 0x0a, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0], &[]).await;
    assert_eq!(r.status, status::GOOD, "{r:?}");
    // two groups of two ports each: 16-byte descriptors
    [r.data_in[4] & 0x0f, r.data_in[20] & 0x0f]
}

#[tokio::test]
async fn set_target_port_groups_through_either_node_reaches_both() {
    let (a, b) = pair();
    let na = ready(&a, "a", 1).await;
    let nb = ready(&b, "b", 3).await;
    let nb2 = ready(&b, "c", 4).await;
    // through the follower: forwarded, applied on the leader, installed back
    let r = stpg(&b, &nb, &[(1, 2)]).await;
    assert_eq!(r.status, status::GOOD, "{r:?}");
    for t in [&a, &b] {
        assert_eq!(
            t.lun_explicit_alua(LUN).unwrap(),
            vec![(2, AluaState::ActiveNonOptimized)]
        );
    }
    // the sender alone is spared the unit attention, on both nodes
    assert_eq!(ua(&b, &nb).await, None);
    assert_eq!(ua(&b, &nb2).await, Some((0x2a, 0x06)));
    assert_eq!(ua(&a, &na).await, Some((0x2a, 0x06)));
    assert_eq!(rtpg(&a, &na).await, [0, 1]);
    assert_eq!(rtpg(&b, &nb).await, [0, 1]);
    // through the leader
    let r = stpg(&a, &na, &[(2, 1)]).await;
    assert_eq!(r.status, status::GOOD, "{r:?}");
    // (an RTPG is GOOD only without a pending unit attention)
    assert_eq!(rtpg(&a, &na).await, [2, 1]);
    assert_eq!(ua(&b, &nb).await, Some((0x2a, 0x06)));
    assert_eq!(rtpg(&b, &nb).await, [2, 1]);
    // node 1's ports are standby now, on both nodes' view of the LU
    let r = run(&a, &na, &READ10, &[]).await;
    assert_eq!(sense_of(&r), (key::NOT_READY, 0x04, 0x0b));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_set_target_port_groups_through_both_nodes_converge() {
    let (a, b) = pair();
    let na = ready(&a, "a", 1).await;
    let nb = ready(&b, "b", 3).await;
    let mut tasks = Vec::new();
    for i in 0..40u8 {
        let (t, n) = if i % 2 == 0 {
            (a.clone(), na.clone())
        } else {
            (b.clone(), nb.clone())
        };
        tasks.push(tokio::spawn(async move {
            let r = stpg(&t, &n, &[(i % 3, 1 + u16::from(i % 2))]).await;
            // a unit attention of the other node's change may come first
            if r.status != status::GOOD {
                assert_eq!(sense_of(&r).0, key::UNIT_ATTENTION, "{r:?}");
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(a.lun_explicit_alua(LUN), b.lun_explicit_alua(LUN));
}

#[tokio::test]
async fn failed_alua_push_answers_hardware_error_and_keeps_the_change() {
    let (a, b, la) = pair_with(None);
    let na = ready(&a, "a", 1).await;
    la.fail_push.store(true, Ordering::Relaxed);
    let r = stpg(&a, &na, &[(3, 2)]).await;
    assert_eq!(sense_of(&r), (key::HARDWARE_ERROR, 0x44, 0x00));
    assert_eq!(
        a.lun_explicit_alua(LUN).unwrap(),
        vec![(2, AluaState::Unavailable)]
    );
    assert!(b.lun_explicit_alua(LUN).unwrap().is_empty());
    // the partner gets the whole state when it rejoins (the resync source pushes it)
    la.fail_push.store(false, Ordering::Relaxed);
    a.push_alua_state(LUN).await.unwrap();
    assert_eq!(
        b.lun_explicit_alua(LUN).unwrap(),
        vec![(2, AluaState::Unavailable)]
    );
    let nb = nexus("b", 3);
    assert_eq!(ua(&b, &nb).await, Some((0x29, 0x00)));
    assert_eq!(rtpg(&b, &nb).await, [0, 3]);
    // a snapshot replaces: groups it does not name lose their explicit state
    b.install_alua_state(LUN, None, &[]).unwrap();
    assert_eq!(ua(&b, &nb).await, Some((0x2a, 0x06)));
    assert_eq!(rtpg(&b, &nb).await, [0, 0]);
}

#[tokio::test]
async fn a_follower_without_its_leader_refuses_set_target_port_groups() {
    let b = node(2, None);
    let lb = Link::new(false); // its partner never set: the leader is gone
    assert!(b.set_pr_replication(LUN, lb));
    let nb = ready(&b, "b", 3).await;
    let r = stpg(&b, &nb, &[(2, 1)]).await;
    assert_eq!(sense_of(&r), (key::NOT_READY, 0x04, 0x0c));
    assert!(b.lun_explicit_alua(LUN).unwrap().is_empty());
}

#[tokio::test]
async fn explicit_states_installed_from_the_partner_are_persisted() {
    let (da, db) = (temp_dir("alua-a"), temp_dir("alua-b"));
    let (fa, fb) = (da.join("lun0.pr.json"), db.join("lun0.pr.json"));
    let (a, b, _) = pair_with(Some((fa.clone(), fb.clone())));
    let nb = ready(&b, "b", 3).await;
    assert_eq!(stpg(&b, &nb, &[(2, 2)]).await.status, status::GOOD);
    drop((a, b));
    // both nodes restarted: each loads its own copy
    for f in [fa, fb] {
        let t = ScsiTarget::new(node_config(1, Some(f))).unwrap();
        assert_eq!(
            t.lun_explicit_alua(LUN).unwrap(),
            vec![(2, AluaState::Standby)]
        );
    }
    let _ = std::fs::remove_dir_all(da);
    let _ = std::fs::remove_dir_all(db);
}

/// A SET TARGET PORT GROUPS whose command is dropped while its states are
/// pushed still brings the partner up to date (a retry here would change
/// nothing, so push nothing).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_set_target_port_groups_dropped_during_its_push_still_reaches_the_partner() {
    let (a, b, la) = pair_with(None);
    let na = ready(&a, "a", 1).await;
    let a2 = a.clone();
    dropped_during_its_push(&la, async move { stpg(&a2, &na, &[(1, 2)]).await }).await;
    let want = vec![(2, AluaState::ActiveNonOptimized)];
    assert_eq!(a.lun_explicit_alua(LUN).unwrap(), want);
    assert!(
        pushed(|| b.lun_explicit_alua(LUN).unwrap() == want).await,
        "the partner never got the new port states"
    );
}

#[tokio::test]
async fn a_forwarded_set_target_port_groups_heals_a_stale_follower() {
    let (a, b, la) = pair_with(None);
    let na = ready(&a, "a", 1).await;
    la.fail_push.store(true, Ordering::Relaxed);
    assert_eq!(
        stpg(&a, &na, &[(1, 2)]).await.status,
        status::CHECK_CONDITION
    );
    la.fail_push.store(false, Ordering::Relaxed);
    assert!(
        b.lun_explicit_alua(LUN).unwrap().is_empty(),
        "b missed the push"
    );
    // the same state again through b: nothing changes on a, but b gets a's state
    let nb = ready(&b, "b", 3).await;
    assert_eq!(stpg(&b, &nb, &[(1, 2)]).await.status, status::GOOD);
    assert_eq!(
        b.lun_explicit_alua(LUN).unwrap(),
        vec![(2, AluaState::ActiveNonOptimized)]
    );
    assert_eq!(rtpg(&b, &nb).await, [0, 1]);
}

/// ORWRITE is refused on an LU replicated to a partner (its read and write are
/// ordered against this node's writes only) and not reported supported there;
/// an LU of its own still takes it.
#[tokio::test]
async fn orwrite_is_not_offered_on_a_replicated_lu() {
    let (a, _b) = pair();
    let n = ready(&a, "host", 1).await;
    let mut orw = [0u8; 16];
    orw[0] = 0x8b;
    orw[13] = 1;
    let r = run(&a, &n, &orw, &[0x0f; 512]).await;
    assert_eq!(sense_of(&r), (key::ILLEGAL_REQUEST, 0x20, 0x00));
    // REPORT SUPPORTED OPERATION CODES, one command: ORWRITE(16) not supported
    let rsoc = [0xa3, 0x0c, 0x01, 0x8b, 0, 0, 0, 0, 0x10, 0, 0, 0];
    let r = run(&a, &n, &rsoc, &[]).await;
    assert_eq!(r.status, status::GOOD);
    assert_eq!(r.data_in[1] & 0x07, 0x01, "not supported");
    // alone (no partner): taken
    let lone = node(3, None);
    let n = ready(&lone, "host", 1).await;
    assert_eq!(
        run(&lone, &n, &orw, &[0x0f; 512]).await.status,
        status::GOOD
    );
}

/// A follower that cannot persist a pushed state (APTPL, its state file in a
/// folder that cannot exist) installs it all the same and says so: the
/// commands are answered HARDWARE ERROR, but a PREEMPT AND ABORT still fences
/// the preempted initiator on both nodes. (Before, the follower kept the old
/// state, the retried PREEMPT found nothing to do and pushed nothing, and the
/// preempted initiator went on writing through the follower.)
#[tokio::test]
async fn a_state_the_follower_cannot_persist_is_installed_there_all_the_same() {
    let (da, db) = (temp_dir("unsaved-a"), temp_dir("unsaved-b"));
    let (a, b, _) = pair_with(Some((da.join("lun0.pr.json"), db.join("lun0.pr.json"))));
    // b's folder becomes a file: nothing can be saved in it
    std::fs::remove_dir_all(&db).unwrap();
    std::fs::write(&db, b"").unwrap();
    let n = ready(&a, "n", 1).await;
    let m = ready(&b, "m", 3).await;
    let unsaved = |r: Response| assert_eq!(sense_of(&r), (key::HARDWARE_ERROR, 0x44, 0x00));
    unsaved(prout(&a, &n, REGISTER, 0, 0, 1, APTPL).await);
    unsaved(prout(&b, &m, REGISTER, 0, 0, 2, APTPL).await);
    unsaved(prout(&a, &n, RESERVE, WERO, 1, 0, 0).await);
    assert_eq!(run(&b, &m, &WRITE10, &[0; 512]).await.status, status::GOOD);
    unsaved(prout(&a, &n, 0x05, WERO, 1, 2, 0).await);
    // m's registration is gone on both nodes: its writes through b conflict
    // (after the unit attention the preemption owes it)
    let mut r = run(&b, &m, &WRITE10, &[0; 512]).await;
    if r.status == status::CHECK_CONDITION {
        assert_eq!(sense_of(&r), (key::UNIT_ATTENTION, 0x2a, 0x05));
        r = run(&b, &m, &WRITE10, &[0; 512]).await;
    }
    assert_eq!(r.status, status::RESERVATION_CONFLICT, "{r:?}");
    assert_eq!(read_keys(&b, &m).await.1, vec![1]);
}

/// A follower that cannot save pushed explicit ALUA states (its file a
/// folder) applies them all the same: the command is answered HARDWARE
/// ERROR, but both nodes report and enforce the same states. (Before, the
/// follower kept its old states, and a retry through the leader, which found
/// nothing left to change, answered GOOD and pushed nothing.)
#[tokio::test]
async fn explicit_states_the_follower_cannot_save_are_applied_there_all_the_same() {
    let (da, db) = (temp_dir("alua-unsaved-a"), temp_dir("alua-unsaved-b"));
    let (a, b, _) = pair_with(Some((da.join("lun0.pr.json"), db.join("lun0.pr.json"))));
    std::fs::create_dir(db.join("lun0.alua.json")).unwrap();
    let na = ready(&a, "a", 1).await;
    let r = stpg(&a, &na, &[(2, 2)]).await;
    assert_eq!(sense_of(&r).0, key::HARDWARE_ERROR, "{r:?}");
    assert_eq!(
        b.lun_explicit_alua(LUN).unwrap(),
        a.lun_explicit_alua(LUN).unwrap(),
        "the nodes report different port states"
    );
    let _ = std::fs::remove_dir_all(da);
    let _ = std::fs::remove_dir_all(db);
}

const RESERVE6: [u8; 6] = [0x16, 0, 0, 0, 0, 0];
const RELEASE6: [u8; 6] = [0x17, 0, 0, 0, 0, 0];

/// Runs `cdb` from `n` on `t` and returns its status.
async fn status_of(t: &ScsiTarget, n: &ItNexus, cdb: &[u8]) -> u8 {
    let data: &[u8] = if cdb == WRITE10 { &[0; 512] } else { &[] };
    run(t, n, cdb, data).await.status
}

/// An SPC-2 reservation (RESERVE(6)) taken through one node's port holds on
/// both nodes: another host, through the other node, can neither write nor
/// reserve; taken through the follower (forwarded to the leader) the same.
/// Before, each node kept its own, so a second host reserved the LU through
/// the other node and both wrote.
#[tokio::test]
async fn an_spc2_reservation_taken_through_one_node_holds_on_both() {
    let (a, b) = pair();
    let holder = ready(&a, "holder", 1).await;
    let other = ready(&b, "other", 3).await;
    let holder_b = ready(&b, "holder", 3).await;
    assert_eq!(status_of(&a, &holder, &RESERVE6).await, status::GOOD);
    assert_eq!(a.pr_state(LUN), b.pr_state(LUN));
    for cdb in [&WRITE10[..], &RESERVE6[..], &READ10[..]] {
        let s = status_of(&b, &other, cdb).await;
        assert_eq!(s, status::RESERVATION_CONFLICT, "{cdb:02x?} through B");
    }
    // an SPC-2 reservation belongs to one I_T nexus: the holder through B too
    let s = status_of(&b, &holder_b, &WRITE10).await;
    assert_eq!(s, status::RESERVATION_CONFLICT);
    assert_eq!(status_of(&a, &holder, &WRITE10).await, status::GOOD);

    // released through A: free on B
    assert_eq!(status_of(&a, &holder, &RELEASE6).await, status::GOOD);
    assert_eq!(status_of(&b, &other, &WRITE10).await, status::GOOD);
    // taken through B (run on A): A's hosts conflict
    assert_eq!(status_of(&b, &other, &RESERVE6).await, status::GOOD);
    assert_eq!(a.pr_state(LUN), b.pr_state(LUN));
    let s = status_of(&a, &holder, &WRITE10).await;
    assert_eq!(s, status::RESERVATION_CONFLICT);
    assert_eq!(status_of(&b, &other, &WRITE10).await, status::GOOD);
    // a RELEASE from a nexus that holds nothing changes nothing anywhere
    assert_eq!(status_of(&a, &holder, &RELEASE6).await, status::GOOD);
    let s = status_of(&a, &holder, &WRITE10).await;
    assert_eq!(s, status::RESERVATION_CONFLICT);
    assert_eq!(status_of(&b, &other, &RELEASE6).await, status::GOOD);
    assert_eq!(status_of(&a, &holder, &WRITE10).await, status::GOOD);
    assert_eq!(a.pr_state(LUN), b.pr_state(LUN));
}

/// An SPC-2 reservation ends on both nodes when its holder's I_T nexus is
/// lost or the LU is reset, whichever node the loss or the reset reached,
/// before the loss or the reset returns: the follower has the leader end it,
/// the leader pushes its state.
#[tokio::test]
async fn an_spc2_reservation_ends_on_both_nodes_with_its_holder_or_a_reset() {
    let (a, b) = pair();
    let na = ready(&a, "a", 1).await;
    let nb = ready(&b, "b", 3).await;

    // the holder's nexus lost on the follower
    assert_eq!(status_of(&b, &nb, &RESERVE6).await, status::GOOD);
    assert_eq!(
        status_of(&a, &na, &WRITE10).await,
        status::RESERVATION_CONFLICT
    );
    b.nexus_lost(&nb).await;
    assert_eq!(status_of(&a, &na, &WRITE10).await, status::GOOD);
    assert_eq!(a.pr_state(LUN), b.pr_state(LUN));

    // the holder's nexus lost on the leader
    let nb = ready(&b, "b", 3).await;
    let other = ready(&a, "other", 2).await;
    assert_eq!(status_of(&a, &na, &RESERVE6).await, status::GOOD);
    assert_eq!(
        status_of(&b, &nb, &WRITE10).await,
        status::RESERVATION_CONFLICT
    );
    a.nexus_lost(&na).await;
    assert_eq!(status_of(&b, &nb, &WRITE10).await, status::GOOD);

    // a LOGICAL UNIT RESET through the follower ends the leader's holder's too
    let na = ready(&a, "a", 1).await;
    assert_eq!(status_of(&a, &na, &RESERVE6).await, status::GOOD);
    assert!(b.lun_reset(&nb, LUN).await);
    assert_eq!(a.pr_state(LUN), b.pr_state(LUN));
    // (the reset's unit attention reaches the leader's nexuses too)
    assert_eq!(ua(&a, &other).await, Some((0x29, 0x03)));
    assert_eq!(status_of(&a, &other, &WRITE10).await, status::GOOD);
}

/// A follower whose copy missed a push (the command was answered HARDWARE
/// ERROR, the leader kept the change) is put right by the holder's RESERVE
/// again, though it changes nothing on the leader; and a reset through that
/// follower, whose copy names no holder, still ends the leader's.
#[tokio::test]
async fn a_follower_that_missed_an_spc2_push_is_put_right() {
    let (a, b, la) = pair_with(None);
    let holder = ready(&a, "holder", 1).await;
    let other = ready(&b, "other", 3).await;
    la.fail_push.store(true, Ordering::Relaxed);
    let r = run(&a, &holder, &RESERVE6, &[]).await;
    assert_eq!(sense_of(&r).0, key::HARDWARE_ERROR, "{r:?}");
    la.fail_push.store(false, Ordering::Relaxed);
    assert_eq!(
        status_of(&b, &other, &WRITE10).await,
        status::GOOD,
        "(the drift)"
    );
    assert_eq!(status_of(&a, &holder, &RESERVE6).await, status::GOOD);
    assert_eq!(a.pr_state(LUN), b.pr_state(LUN));
    assert_eq!(
        status_of(&b, &other, &WRITE10).await,
        status::RESERVATION_CONFLICT
    );

    // drift again (the leader holds, the follower's copy names nobody), then
    // a reset through the follower
    assert_eq!(status_of(&a, &holder, &RELEASE6).await, status::GOOD);
    la.fail_push.store(true, Ordering::Relaxed);
    let r = run(&a, &holder, &RESERVE6, &[]).await;
    assert_eq!(sense_of(&r).0, key::HARDWARE_ERROR, "{r:?}");
    la.fail_push.store(false, Ordering::Relaxed);
    assert_ne!(a.pr_state(LUN), b.pr_state(LUN));
    assert!(b.lun_reset(&other, LUN).await);
    assert_eq!(a.pr_state(LUN), b.pr_state(LUN));
    let again = ready(&a, "again", 2).await;
    assert_eq!(status_of(&a, &again, &RESERVE6).await, status::GOOD);
}

/// A reset through either node reaches the initiators of the other: each of
/// its nexuses of the LU gets the reset's unit attention (an initiator that
/// reaches the LU through both nodes learns of it on every path), whichever
/// node leads. Before (review of 2026-12-06) only the nexuses of the node
/// the reset came through got it.
#[tokio::test]
async fn a_reset_through_one_node_raises_its_unit_attention_on_both() {
    let (a, b) = pair();
    let (log_a, log_b) = (Arc::new(AbortLog::default()), Arc::new(AbortLog::default()));
    a.set_task_abort(log_a.clone());
    b.set_task_abort(log_b.clone());
    let na = ready(&a, "a", 1).await;
    let nb = ready(&b, "b", 3).await;
    // a LOGICAL UNIT RESET through the follower
    assert!(b.lun_reset(&nb, LUN).await);
    // the partner aborted its tasks on the LU (the node the reset came
    // through aborts its own in the transport, before the reset)
    assert_eq!(
        *log_a.0.lock(),
        vec![(LUN, vec!["every nexus".to_string()])]
    );
    assert!(log_b.0.lock().is_empty());
    assert_eq!(ua(&b, &nb).await, Some((0x29, 0x03)));
    assert_eq!(
        ua(&a, &na).await,
        Some((0x29, 0x03)),
        "the leader's initiator"
    );
    assert_eq!(ua(&a, &na).await, None);
    // through the leader
    assert!(a.lun_reset(&na, LUN).await);
    assert_eq!(ua(&a, &na).await, Some((0x29, 0x03)));
    assert_eq!(
        ua(&b, &nb).await,
        Some((0x29, 0x03)),
        "the follower's initiator"
    );
    assert_eq!(log_b.0.lock().len(), 1, "the follower aborted its tasks");
    // a target reset: its own unit attention on both
    a.target_reset(&na).await;
    assert_eq!(ua(&a, &na).await, Some((0x29, 0x00)));
    assert_eq!(ua(&b, &nb).await, Some((0x29, 0x00)));
    assert_eq!(ua(&b, &nb).await, None);
    assert_eq!(log_b.0.lock().len(), 2);
}

/// Aborts running tasks on the partner like [`AbortLog`], but some never end.
struct StuckAbort;

#[async_trait]
impl TaskAbort for StuckAbort {
    async fn abort_tasks(&self, _: u64, _: &[pr::NexusId]) {}

    async fn abort_lu_tasks(&self, _: u64) -> bool {
        false
    }
}

/// A reset through one node whose partner cannot end its tasks on the LU is
/// not taken there: the partner's initiators get no unit attention for a
/// reset whose aborted tasks may still change the medium.
#[tokio::test]
async fn a_partner_whose_tasks_do_not_end_takes_no_reset() {
    let (a, b) = pair();
    a.set_task_abort(Arc::new(StuckAbort));
    let na = ready(&a, "a", 1).await;
    let nb = ready(&b, "b", 3).await;
    assert!(b.lun_reset(&nb, LUN).await);
    assert_eq!(ua(&b, &nb).await, Some((0x29, 0x03)));
    assert_eq!(ua(&a, &na).await, None);
}
