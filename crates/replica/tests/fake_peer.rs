//! A partner that holds the cluster keys but breaks the protocol (a buggy or
//! compromised node), speaking the real wire format over the real
//! authenticated channel: every message must fit the receiving node's role on
//! that link, or the link closes and nothing is written or acknowledged.
//! - resync data sent to the node that leads (it used to be written: corruption);
//! - a "leader" that ends a resync at once and acknowledges a forwarded write
//!   without having it applied on the follower (it used to be acknowledged to
//!   the client with the data on neither copy: silent loss);
//! - a copy's end sent on a link the node no longer follows (after it detached
//!   its failed copy): taken, it would drop what the node keeps to undo that
//!   copy, which its put-back must still find.

use block::{Bytes, MemVolume, Volume, VolumeRef};
use replica::secure::{ClusterKeys, Member, Purpose, SecureReader, SecureWriter};
use replica::{Mode, ReplicaConfig, ReplicatedVolume, Role, SyncListener, SyncSinks};
use replica_proto::{decode, encode, hello_flags, Generations, Message, OpResult};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;

const BLOCKS: u64 = 2048;

fn keys() -> Vec<Arc<ClusterKeys>> {
    ClusterKeys::generate("fake")
        .unwrap()
        .into_iter()
        .map(Arc::new)
        .collect()
}

fn cfg(node: u8, dir: &Path, peer: Vec<SocketAddr>, keys: Arc<ClusterKeys>) -> ReplicaConfig {
    ReplicaConfig {
        name: "vol".into(),
        cluster: "fake".into(),
        node_id: node,
        preferred_node: 1,
        peer_sync: peer,
        witness: None,
        mode: Mode::ActiveActive,
        region_bytes: 64 << 10,
        heartbeat_interval_ms: 50,
        peer_timeout_ms: 400,
        io_wait_ms: 2000,
        state_dir: dir.join(format!("node{node}")),
        keys,
        buffers: block::BufferBudget::unlimited(),
    }
}

/// The misbehaving partner's end of the link: answers pings by itself, hands
/// every other message over.
struct Fake {
    out: mpsc::Sender<Message>,
    incoming: mpsc::Receiver<Message>,
    /// The link's tasks (writer, reader, pings): aborted, the link is cut.
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

async fn recv(r: &mut SecureReader, buf: &mut bytes::BytesMut) -> Option<Message> {
    loop {
        match decode(buf) {
            Ok(Some(m)) => return Some(m),
            Ok(None) => {}
            Err(_) => return None,
        }
        if r.read_buf(buf).await.ok()? == 0 {
            return None;
        }
    }
}

impl Fake {
    /// Runs the handshake as node `me` with a consistent copy of generation
    /// `gens`, then the link's pumps.
    async fn start(r: SecureReader, w: SecureWriter, me: u8, gens: Generations) -> (Fake, Message) {
        Fake::start_sized(r, w, me, gens, BLOCKS).await
    }

    /// [`Fake::start`] with a copy of `block_count` blocks.
    async fn start_sized(
        r: SecureReader,
        w: SecureWriter,
        me: u8,
        gens: Generations,
        block_count: u64,
    ) -> (Fake, Message) {
        Fake::start_as(r, w, me, gens, block_count, true).await
    }

    /// [`Fake::start_sized`], the copy consistent or (`consistent` false) an
    /// unfinished resync target.
    async fn start_as(
        r: SecureReader,
        w: SecureWriter,
        me: u8,
        gens: Generations,
        block_count: u64,
        consistent: bool,
    ) -> (Fake, Message) {
        let flags = if consistent {
            hello_flags::CONSISTENT
        } else {
            0
        };
        Fake::start_held(r, w, me, gens, block_count, flags, async {}).await
    }

    /// [`Fake::start_as`] with the hello's `flags` (but for `PREFERRED`, set
    /// for node 1, and `REPAIR`, set as a partner of this version does),
    /// awaiting `hold` once the node has judged its copy and sent its half of
    /// the handshake, before this side's bitmap ends it.
    async fn start_held(
        r: SecureReader,
        w: SecureWriter,
        me: u8,
        gens: Generations,
        block_count: u64,
        flags: u32,
        hold: impl std::future::Future<Output = ()>,
    ) -> (Fake, Message) {
        let (mut r, mut w, mut buf, hello) =
            handshake_held(r, w, me, gens, block_count, flags, hold).await;
        let (out_tx, mut out_rx) = mpsc::channel::<Message>(64);
        let (in_tx, in_rx) = mpsc::channel(1024);
        let writer = tokio::spawn(async move {
            while let Some(m) = out_rx.recv().await {
                let mut b = bytes::BytesMut::new();
                encode(&m, &mut b);
                if w.write_all(&b).await.is_err() {
                    return;
                }
            }
        });
        let pong = out_tx.clone();
        let reader = tokio::spawn(async move {
            while let Some(m) = recv(&mut r, &mut buf).await {
                match m {
                    Message::Ping { seq } => {
                        let _ = pong.send(Message::Pong { seq }).await;
                    }
                    Message::Pong { .. } => {}
                    other => {
                        if in_tx.send(other).await.is_err() {
                            return;
                        }
                    }
                }
            }
            // the node closed the link: the channel ends
        });
        // keep the node's lease on us alive
        let ping = out_tx.clone();
        let pinger = tokio::spawn(async move {
            for seq in 1.. {
                if ping.send(Message::Ping { seq }).await.is_err() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        });
        (
            Fake {
                out: out_tx,
                incoming: in_rx,
                tasks: vec![writer, reader, pinger],
            },
            hello,
        )
    }

    /// Cuts the link (the node sees it closed).
    fn close(&self) {
        for t in &self.tasks {
            t.abort();
        }
    }

    async fn send(&self, m: Message) {
        let _ = self.out.send(m).await;
    }

    /// The next message from the node, or None once it closed the link.
    async fn next(&mut self) -> Option<Message> {
        tokio::time::timeout(Duration::from_secs(20), self.incoming.recv())
            .await
            .expect("the node neither spoke nor closed the link")
    }
}

/// The fake's half of the handshake, as [`Fake::start_held`] says; returns
/// the stream (with what was read past the handshake) and the node's hello.
async fn handshake_held(
    mut r: SecureReader,
    mut w: SecureWriter,
    me: u8,
    gens: Generations,
    block_count: u64,
    mut flags: u32,
    hold: impl std::future::Future<Output = ()>,
) -> (SecureReader, SecureWriter, bytes::BytesMut, Message) {
    let mut out = bytes::BytesMut::new();
    if me == 1 {
        flags |= hello_flags::PREFERRED;
    }
    if flags & EARLIER_VERSION != 0 {
        flags &= !EARLIER_VERSION;
    } else {
        flags |= hello_flags::REPAIR;
    }
    encode(
        &Message::Hello {
            node_id: me,
            volume: "vol".into(),
            block_size_bytes: 512,
            block_count,
            region_bytes: 64 << 10,
            gens,
            flags,
        },
        &mut out,
    );
    w.write_all(&out).await.unwrap();
    let mut buf = bytes::BytesMut::new();
    let hello = recv(&mut r, &mut buf).await.expect("the node's hello");
    while !matches!(
        recv(&mut r, &mut buf).await.expect("the node's bitmap"),
        Message::BitmapDone
    ) {}
    hold.await;
    let mut out = bytes::BytesMut::new();
    encode(&Message::BitmapDone, &mut out);
    w.write_all(&out).await.unwrap();
    (r, w, buf, hello)
}

/// A test-only mark in the flags given to [`handshake_held`]: the fake is a
/// partner of a version before repairs (its hello says nothing of
/// `hello_flags::REPAIR`). Not a flag of the protocol; never sent.
const EARLIER_VERSION: u32 = 1 << 31;

/// The fake node 2's listener, and the real node 1 (preferred) over `m1`
/// dialing it.
struct Dialed {
    n1: ReplicatedVolume,
    l: tokio::net::TcpListener,
    k: Vec<Arc<ClusterKeys>>,
}

async fn node1_dialing_a_fake(dir: &Path, m1: VolumeRef) -> Dialed {
    node1_dialing_a_fake_with(dir, m1, |_| {}).await
}

/// [`node1_dialing_a_fake`] with node 1's configuration changed by `change`.
async fn node1_dialing_a_fake_with(
    dir: &Path,
    m1: VolumeRef,
    change: impl FnOnce(&mut ReplicaConfig),
) -> Dialed {
    let k = keys();
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let mut c = cfg(1, dir, vec![addr], k[0].clone());
    change(&mut c);
    let (n1, _sink) = ReplicatedVolume::open(c, m1).unwrap();
    Dialed { n1, l, k }
}

impl Dialed {
    /// The next connection of node 1's whose handshake completes (a dial
    /// the node gave up on while nobody accepted fails its handshake).
    async fn accept(&self) -> replica::secure::SecureStream {
        loop {
            let (s, _) = self.l.accept().await.unwrap();
            if let Ok(st) =
                replica::secure::accept(s, &self.k[1], Purpose::Sync, &[Member::Node1]).await
            {
                return st;
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resync_data_sent_to_the_leader_is_refused_and_not_written() {
    let d = tempfile::tempdir().unwrap();
    // the fake node 2 listens; the real node 1 (preferred) dials it
    let m1: VolumeRef = Arc::new(MemVolume::new(512, BLOCKS));
    m1.write(0, Bytes::from(vec![0x11u8; 512]), false)
        .await
        .unwrap();
    let dialed = node1_dialing_a_fake(d.path(), m1.clone()).await;
    let n1 = &dialed.n1;
    let st = dialed.accept().await;
    let (mut fake, _) = Fake::start(st.reader, st.writer, 2, Generations::default()).await;
    // node 1 leads the resync of the brand-new pair; the fake pushes data at it
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while n1.role() != Role::Leader {
        assert!(tokio::time::Instant::now() < deadline, "{:?}", n1.status());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    fake.send(Message::ResyncData {
        id: 1 << 40,
        lba: 0,
        data: Bytes::from(vec![0xEEu8; 512]),
    })
    .await;
    // the node closes the link rather than answer it
    loop {
        match fake.next().await {
            None => break,
            Some(Message::Done { id, .. }) if id == 1 << 40 => {
                panic!("the leader answered resync data")
            }
            Some(_) => {}
        }
    }
    let b = m1.read(0, 1).await.unwrap();
    assert!(
        b.iter().all(|&x| x == 0x11),
        "the leader's copy was written"
    );
    n1.shutdown().await;
}

/// Node 2 on `volume`, listening, and a fake node 1 that dials it and claims
/// the lead of a brand-new pair: node 2 is its resync target.
async fn target_of_a_fake_leader(dir: &Path, volume: VolumeRef) -> (Arc<ReplicatedVolume>, Fake) {
    let k = keys();
    let (n2, addr) = node2_listening(dir, &k, volume).await;
    let (r, w) = dial_as_node1(addr, &k).await;
    let (fake, _) = Fake::start(r, w, 1, Generations::default()).await;
    assert!(
        n2.wait_until(|s| s.role == Role::Target, Duration::from_secs(20))
            .await,
        "{:?}",
        n2.status()
    );
    (n2, fake)
}

/// Node 2 over `volume`, listening (not preferred, no witness: alone,
/// it stays down), and its address.
async fn node2_listening(
    dir: &Path,
    k: &[Arc<ClusterKeys>],
    volume: VolumeRef,
) -> (Arc<ReplicatedVolume>, SocketAddr) {
    let (n2, sink) = ReplicatedVolume::open(cfg(2, dir, vec![], k[1].clone()), volume).unwrap();
    let sinks = SyncSinks::default();
    sinks.insert("vol", sink);
    let l = SyncListener::bind(&["127.0.0.1:0".parse().unwrap()], sinks, k[1].clone())
        .await
        .unwrap();
    let addr = l.local_addrs()[0];
    l.spawn();
    (Arc::new(n2), addr)
}

/// A connection to `addr` as node 1, its secure handshake done.
async fn dial_as_node1(addr: SocketAddr, k: &[Arc<ClusterKeys>]) -> (SecureReader, SecureWriter) {
    let s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let st = replica::secure::connect(s, &k[0], Member::Node2, Purpose::Sync)
        .await
        .unwrap();
    (st.reader, st.writer)
}

/// [`target_of_a_fake_leader`], and the fake ends the resync at once with
/// `gens` (a legitimate message while node 2 is its target): node 2 now
/// follows it.
async fn follower_of_a_fake_leader(
    dir: &Path,
    volume: VolumeRef,
    gens: Generations,
) -> (Arc<ReplicatedVolume>, Fake) {
    let (n2, mut fake) = target_of_a_fake_leader(dir, volume).await;
    fake.send(Message::ResyncDone { id: 1, gens }).await;
    loop {
        let m = fake
            .next()
            .await
            .expect("node 2 closed the link on ResyncDone");
        if let Message::Done { id: 1, result } = m {
            assert_eq!(result, OpResult::Ok);
            break;
        }
    }
    assert_eq!(n2.role(), Role::Follower);
    (n2, fake)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_acknowledging_a_write_never_applied_here_is_dropped() {
    let d = tempfile::tempdir().unwrap();
    let m2: VolumeRef = Arc::new(MemVolume::new(512, BLOCKS));
    let gens = Generations {
        current: 7,
        synced: 7,
    };
    let (n2, mut fake) = follower_of_a_fake_leader(d.path(), m2.clone(), gens).await;
    // a client writes through node 2, which forwards it to its leader
    let w = {
        let n2 = n2.clone();
        tokio::spawn(async move { n2.write(0, Bytes::from(vec![0x5Au8; 512]), false).await })
    };
    let fid = loop {
        let m = fake.next().await.expect("node 2 never forwarded the write");
        if let Message::Forward { id, .. } = m {
            break id;
        }
    };
    // the fake acknowledges it without asking node 2 to apply it
    fake.send(Message::Done {
        id: fid,
        result: OpResult::Ok,
    })
    .await;
    let r = w.await.unwrap();
    let b = m2.read(0, 1).await.unwrap();
    assert!(
        r.is_err() || b.iter().all(|&x| x == 0x5A),
        "node 2 acknowledged a write its copy does not hold"
    );
    assert!(
        r.is_err(),
        "node 2 acknowledged a write only its partner claims to hold"
    );
    // and the link is gone
    while fake.next().await.is_some() {}
    n2.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_flooding_the_follower_with_requests_is_dropped() {
    let d = tempfile::tempdir().unwrap();
    let mem: VolumeRef = Arc::new(MemVolume::new(512, BLOCKS));
    let slow = Arc::new(block::DelayVolume::new(mem, Duration::ZERO, Duration::ZERO));
    let gens = Generations {
        current: 3,
        synced: 3,
    };
    let (n2, mut fake) = follower_of_a_fake_leader(d.path(), slow.clone(), gens).await;
    // every write now takes a while on node 2, and the leader sends far more of
    // them at once than an honest leader ever has in flight
    slow.set_delays(Duration::ZERO, Duration::from_secs(5));
    let flood = 3 * 4096u64;
    let sender = {
        let out = fake.out.clone();
        tokio::spawn(async move {
            for i in 0..flood {
                let op = replica_proto::Op::Write {
                    lba: i % BLOCKS,
                    fua: false,
                    data: Bytes::from(vec![0xA5u8; 512]),
                };
                if out.send(Message::Apply { id: 100 + i, op }).await.is_err() {
                    return i;
                }
            }
            flood
        })
    };
    // node 2 drops the link instead of taking every request on
    let mut answered = 0u64;
    while let Some(m) = fake.next().await {
        if let Message::Done { id, .. } = m {
            if id >= 100 {
                answered += 1;
            }
        }
    }
    sender.abort();
    assert!(
        answered < flood,
        "node 2 answered all {flood} requests of the flood"
    );
    // and stops following it
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while n2.role() == Role::Follower {
        assert!(
            tokio::time::Instant::now() < deadline,
            "node 2 still follows the flooder: {:?}",
            n2.status()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    n2.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copys_end_on_a_link_the_node_no_longer_follows_closes_it_and_keeps_the_copy() {
    let d = tempfile::tempdir().unwrap();
    let mem: VolumeRef = Arc::new(MemVolume::new(512, BLOCKS));
    let faulty = Arc::new(block::FaultVolume::new(mem.clone()));
    let gens = Generations {
        current: 5,
        synced: 5,
    };
    let (n2, mut fake) = follower_of_a_fake_leader(d.path(), faulty.clone(), gens).await;
    // the leader's copy writes block 0 here: node 2 keeps what it overwrote
    fake.send(Message::Apply {
        id: 10,
        op: replica_proto::Op::CopyWrite {
            copy: 9,
            lba: 0,
            fua: false,
            data: Bytes::from(vec![0xC0u8; 512]),
        },
    })
    .await;
    loop {
        match fake.next().await.expect("node 2 closed the link") {
            Message::Done { id: 10, result } => {
                assert_eq!(result, OpResult::Ok);
                break;
            }
            _ => continue,
        }
    }
    assert_eq!(n2.status().partner_copies_open, 1);
    // node 2's disk dies under the leader's next write: it detaches its copy and
    // stops following, though the link stays open until the partner closes it
    faulty.plan().lock().dead = true;
    fake.send(Message::Apply {
        id: 11,
        op: replica_proto::Op::Write {
            lba: 100,
            fua: false,
            data: Bytes::from(vec![0x11u8; 512]),
        },
    })
    .await;
    loop {
        match fake
            .next()
            .await
            .expect("node 2 closed the link before detaching")
        {
            Message::Detach { .. } => break,
            Message::Done { id: 11, .. } => panic!("node 2 answered a write its copy failed"),
            _ => continue,
        }
    }
    assert_eq!(n2.role(), Role::Down);
    // the copy's end on that stale link is refused: the link closes unanswered
    fake.send(Message::CopyEnd { id: 12, copy: 9 }).await;
    while let Some(m) = fake.next().await {
        assert!(
            !matches!(m, Message::Done { id: 12, .. }),
            "node 2 took a copy's end on a link it no longer follows"
        );
    }
    // and what it keeps of that copy is still there to put back
    assert_eq!(n2.status().partner_copies_open, 1);
    n2.shutdown().await;
}

/// A write the partner asked this node to apply, still on its way to the disk
/// when the link dies, lands before the node goes on alone: never after a
/// client's write to the same blocks that the node, alone, acknowledged. The
/// node here is the preferred one (node 1), following a fake leader (node 2)
/// whose link is then cut. Before, the partner's request ran on in its own
/// task after the session ended, and landed over the client's write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partner_write_in_flight_when_the_link_dies_never_lands_after_the_node_goes_on_alone() {
    let d = tempfile::tempdir().unwrap();
    let mem = Arc::new(MemVolume::new(512, BLOCKS));
    let held = Arc::new(block::HoldVolume::new(mem.clone()));
    let k = keys();
    let (n1, sink) =
        ReplicatedVolume::open(cfg(1, d.path(), vec![], k[0].clone()), held.clone()).unwrap();
    let n1 = Arc::new(n1);
    let sinks = SyncSinks::default();
    sinks.insert("vol", sink);
    let l = SyncListener::bind(&["127.0.0.1:0".parse().unwrap()], sinks, k[0].clone())
        .await
        .unwrap();
    let addr = l.local_addrs()[0];
    l.spawn();
    let s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let st = replica::secure::connect(s, &k[1], Member::Node1, Purpose::Sync)
        .await
        .unwrap();
    let gens = Generations {
        current: 7,
        synced: 7,
    };
    // the fake (node 2) claims the newer copy: it resyncs node 1, then leads
    let (mut fake, _) = Fake::start(st.reader, st.writer, 2, gens).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while n1.role() != Role::Target {
        assert!(tokio::time::Instant::now() < deadline, "{:?}", n1.status());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    fake.send(Message::ResyncDone { id: 1, gens }).await;
    loop {
        match fake
            .next()
            .await
            .expect("node 1 closed the link on ResyncDone")
        {
            Message::Done { id: 1, result } => {
                assert_eq!(result, OpResult::Ok);
                break;
            }
            _ => continue,
        }
    }
    assert_eq!(n1.role(), Role::Follower);
    // the leader has node 1 apply a write to blocks 0-1; it waits at the disk
    held.writes.hold_below(1);
    fake.send(Message::Apply {
        id: 2,
        op: replica_proto::Op::Write {
            lba: 0,
            fua: false,
            data: Bytes::from(vec![0xAA; 1024]),
        },
    })
    .await;
    tokio::time::timeout(Duration::from_secs(10), held.writes.arrivals(1))
        .await
        .expect("the partner's write reached the disk");
    // the link dies; node 1, preferred, goes on alone, and a client writes
    // block 1 through it (writes from block 1 up are not held)
    fake.close();
    let mut w = {
        let n1 = n1.clone();
        tokio::spawn(async move { n1.write(1, Bytes::from(vec![0xBB; 512]), false).await })
    };
    // without the fix the node goes on alone at once and the client's write
    // is acknowledged while the partner's still waits at the disk; with it,
    // the node waits for the partner's write (bounded here)
    // (held 1 s, within the node's 2 s I/O wait: the write can still be
    // served once the partner's lands)
    let first = tokio::time::timeout(Duration::from_secs(1), &mut w).await;
    held.writes.open();
    let (early, w) = match first {
        Ok(r) => (true, r.unwrap()),
        Err(_) => (false, w.await.unwrap()),
    };
    // the partner's write has landed once block 0 holds it
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while mem.read(0, 1).await.unwrap() != vec![0xAA; 512] {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the partner's write never landed"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    match w {
        // acknowledged: it must be what block 1 holds, the partner's older
        // write underneath
        Ok(()) => assert_eq!(
            mem.read(1, 1).await.unwrap(),
            vec![0xBB; 512],
            "the partner's old write landed over an acknowledged one (acknowledged early: {early})"
        ),
        // refused while the node waited (its I/O wait ran out): not
        // acknowledged, nothing to check
        Err(e) => eprintln!("the client's write was refused (early: {early}): {e:?}"),
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while n1.role() != Role::Solo {
        assert!(tokio::time::Instant::now() < deadline, "{:?}", n1.status());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // alone now: a client's write lands after the old one
    n1.write(1, Bytes::from(vec![0xCC; 512]), false)
        .await
        .unwrap();
    assert_eq!(mem.read(1, 1).await.unwrap(), vec![0xCC; 512]);
    n1.shutdown().await;
}

/// The real node 1 (preferred) resyncs a fake node 2 of a brand-new pair; the
/// fake takes the end of the resync (as a real target stores it) but its
/// answer is lost with the link. Node 1 goes on alone; when the fake returns
/// holding the generation it was told, the two copies must join again (node 1
/// copies what it wrote alone), not be judged diverged: the source used to
/// record the new generation only once the answer arrived.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_answer_to_the_end_of_a_resync_leaves_copies_that_join_again() {
    let d = tempfile::tempdir().unwrap();
    let dialed = node1_dialing_a_fake(d.path(), Arc::new(MemVolume::new(512, BLOCKS))).await;
    let st = dialed.accept().await;
    let (mut fake, _) = Fake::start(st.reader, st.writer, 2, Generations::default()).await;
    // the fake takes every block of the full resync, then its end, and the
    // link dies before it answers that
    let gens = take_resync(&mut fake, false).await;
    assert_ne!(gens.current, 0);
    // the fake returns in sync at the generation it was sent
    rejoins_after_losing(&dialed, fake, gens).await;
}

/// The fake's link is cut; node 1 (preferred) goes on alone; the fake comes
/// back consistent at `gens`, and node 1 must resync it (lead) rather than
/// judge the copies impossible to join.
async fn rejoins_after_losing(dialed: &Dialed, fake: Fake, gens: Generations) {
    let n1 = &dialed.n1;
    fake.close();
    goes_on_alone(n1).await;
    let st = dialed.accept().await;
    let (_fake, _) = Fake::start(st.reader, st.writer, 2, gens).await;
    let led = n1
        .wait_until(|s| s.role == Role::Leader, Duration::from_secs(20))
        .await;
    let s = n1.status();
    assert!(led, "the copies were not joined again: {s:?}");
    assert_eq!(s.state, "resyncing", "{s:?}");
    n1.shutdown().await;
}

/// A fake leader ends the resync of the real node 2 and the link dies while
/// node 2 still takes that end (its flush waits at the disk). Node 2 must then
/// decide what to do without its partner (not preferred, no witness: stop),
/// not follow the dead link for ever: the end used to set the follower role
/// after the node had already decided.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_end_of_a_resync_taken_as_the_link_dies_leaves_a_node_that_decides() {
    let d = tempfile::tempdir().unwrap();
    let held = Arc::new(block::HoldVolume::new(Arc::new(MemVolume::new(
        512, BLOCKS,
    ))));
    let (n2, fake) = target_of_a_fake_leader(d.path(), held.clone()).await;
    held.flushes.hold();
    let gens = Generations {
        current: 7,
        synced: 7,
    };
    fake.send(Message::ResyncDone { id: 1, gens }).await;
    tokio::time::timeout(Duration::from_secs(10), held.flushes.arrivals(1))
        .await
        .expect("the end of the resync reached the disk's flush");
    fake.close();
    // the flush goes on once the node has decided without the partner (as
    // before the fix: seen within the bound) or, as now, once the bound shows
    // the node waits for the end of the resync to be taken first
    let early = n2
        .wait_until(|s| s.role != Role::Target, Duration::from_secs(3))
        .await;
    held.flushes.open();
    let decided = n2
        .wait_until(
            |s| s.role == Role::Down && s.generation == "0000000000000007/0000000000000007",
            Duration::from_secs(20),
        )
        .await;
    assert!(
        decided,
        "the node did not decide after taking the end of the resync (it left the target role before: {early}): {:?}",
        n2.status()
    );
    n2.shutdown().await;
}

/// A partner whose hello claims a copy of 2^50 blocks (512 PiB): this node
/// grows its own copy to the partner's size when they differ, and a bitmap
/// for that size would take its memory (or abort it). Refused before anything
/// grows; the node goes on serving its copy as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partner_claiming_a_huge_copy_grows_nothing_here() {
    let d = tempfile::tempdir().unwrap();
    // the fake node 2 listens; the real node 1 (preferred) dials it
    let m1: VolumeRef = Arc::new(MemVolume::new(512, BLOCKS));
    let dialed = node1_dialing_a_fake(d.path(), m1.clone()).await;
    let n1 = &dialed.n1;
    let st = dialed.accept().await;
    let (mut fake, _) =
        Fake::start_sized(st.reader, st.writer, 2, Generations::default(), 1 << 50).await;
    // the node closes the link instead of growing
    while fake.next().await.is_some() {}
    assert_eq!(m1.geometry().block_count, BLOCKS);
    assert_eq!(n1.status().size_bytes, BLOCKS * 512);
    // and goes on alone (preferred, no witness), serving its copy
    goes_on_alone(n1).await;
    n1.write(0, Bytes::from(vec![1u8; 512]), false)
        .await
        .unwrap();
    n1.shutdown().await;
}

/// Node 1 went on alone (a generation of its own) and wrote nothing; the
/// fake node 2 returns at the generation both had. Nothing is copied, so no
/// change reaches node 2 and it stays consistent at its generation; the end
/// of the resync is lost before node 2 takes it. The copies must still join:
/// node 1 ending at a generation of its own left two consistent copies at
/// unrelated generations, which only an operator could join.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_end_of_resync_lost_when_nothing_was_copied_leaves_copies_that_join_again() {
    let d = tempfile::tempdir().unwrap();
    let (alone, both) = (0x1111u64, 0x2222u64);
    std::fs::create_dir_all(d.path().join("node1")).unwrap();
    std::fs::write(
        d.path().join("node1/replica.meta.json"),
        format!(r#"{{"current":{alone},"synced":{both},"consistent":true}}"#),
    )
    .unwrap();
    let dialed = node1_dialing_a_fake(d.path(), Arc::new(MemVolume::new(512, BLOCKS))).await;
    let gens = Generations {
        current: both,
        synced: both,
    };
    let st = dialed.accept().await;
    let (mut fake, _) = Fake::start(st.reader, st.writer, 2, gens).await;
    // no resync data: straight to the end, which is lost with the link
    loop {
        match fake.next().await.expect("node 1 closed the link") {
            Message::ResyncData { .. } => panic!("node 1 copied a region nobody wrote"),
            Message::ResyncDone { .. } => break,
            _ => {}
        }
    }
    // the fake returns as it was, consistent at the generation both had
    rejoins_after_losing(&dialed, fake, gens).await;
}

/// Node 1's state folder is lost (a fresh one, an empty bitmap; being
/// preferred it goes on alone under a generation of its own) while node 2 is
/// an unfinished resync target of a real generation. Resuming from node 1
/// would copy nothing (its bitmap no longer says what the target lacks) and
/// call the target consistent: node 1 must refuse, send no data and say why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_without_state_never_resumes_an_unfinished_target() {
    let d = tempfile::tempdir().unwrap();
    let dialed = node1_dialing_a_fake(d.path(), Arc::new(MemVolume::new(512, BLOCKS))).await;
    let st = dialed.accept().await;
    let gens = Generations {
        current: 7,
        synced: 7,
    };
    let (mut fake, _) = Fake::start_as(st.reader, st.writer, 2, gens, BLOCKS, false).await;
    // nothing of a resync reaches the partner, and node 1 closes the link,
    // saying why (the unfinished side cannot know it otherwise)
    let mut told = None;
    while let Some(m) = fake.next().await {
        assert!(
            !matches!(m, Message::ResyncData { .. } | Message::ResyncDone { .. }),
            "node 1 resumed the resync: {m:?}"
        );
        if let Message::Refused { reason } = m {
            told = Some(reason);
        }
    }
    let told = told.expect("node 1 closed the link without saying why");
    assert!(told.contains("no record of"), "{told}");
    // node 1 (preferred, consistent) goes on alone; the copies are not joined
    let n1 = &dialed.n1;
    let s = n1.status();
    assert_ne!(s.role, Role::Leader, "{s:?}");
    assert_ne!(s.state, "resyncing", "{s:?}");
    n1.shutdown().await;
}

/// Node 1 ends a resync and stores it, the fake (the target) took the
/// copies but misses the end, and node 1 goes on alone under a new
/// generation. The fake returns as the unfinished target it is, at the
/// generation it had when that resync began: node 1 must resume it. (A rule
/// that knew only node 1's current generations refused this pair for good.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_target_that_missed_the_end_is_resumed_after_the_source_went_on_alone() {
    let d = tempfile::tempdir().unwrap();
    let dialed = node1_dialing_a_fake(d.path(), Arc::new(MemVolume::new(512, BLOCKS))).await;
    let n1 = &dialed.n1;
    // a first, full resync that ends: both at generation h
    let st = dialed.accept().await;
    let (mut fake, _) = Fake::start(st.reader, st.writer, 2, Generations::default()).await;
    let h = take_resync(&mut fake, true).await;
    fake.close();
    goes_on_alone(n1).await;
    // node 1 writes alone, then resyncs the fake (back at h), which misses the end
    n1.write(0, Bytes::from(vec![1u8; 512]), false)
        .await
        .unwrap();
    let st = dialed.accept().await;
    let (mut fake, _) = Fake::start(st.reader, st.writer, 2, h).await;
    take_resync(&mut fake, false).await;
    fake.close();
    goes_on_alone(n1).await;
    // the fake returns unfinished at h: node 1 resumes it
    let st = dialed.accept().await;
    let (_fake, _) = Fake::start_as(st.reader, st.writer, 2, h, BLOCKS, false).await;
    let led = n1
        .wait_until(|s| s.role == Role::Leader, Duration::from_secs(20))
        .await;
    let s = n1.status();
    assert!(led, "the unfinished target was not resumed: {s:?}");
    n1.shutdown().await;
}

/// Takes a resync's copies from node 1 and its end, answering the end when
/// `answer` (otherwise the link is to be cut before it is answered); returns
/// the generations the end carried.
async fn take_resync(fake: &mut Fake, answer: bool) -> Generations {
    loop {
        match fake
            .next()
            .await
            .expect("node 1 closed the link during the resync")
        {
            Message::ResyncData { id, .. } => {
                fake.send(Message::Done {
                    id,
                    result: OpResult::Ok,
                })
                .await
            }
            Message::ResyncDone { id, gens } => {
                if answer {
                    fake.send(Message::Done {
                        id,
                        result: OpResult::Ok,
                    })
                    .await;
                }
                return gens;
            }
            _ => {}
        }
    }
}

/// Waits (at most 20 s) for node 1 to go on alone (preferred, no witness).
async fn goes_on_alone(n1: &ReplicatedVolume) {
    reaches(n1, Role::Solo).await;
}

/// Waits (at most 20 s) until `n` has `role`.
async fn reaches(n: &ReplicatedVolume, role: Role) {
    assert!(
        n.wait_until(|s| s.role == role, Duration::from_secs(20))
            .await,
        "{:?}",
        n.status()
    );
}

/// A partner that says no during the handshake to a copy that can serve
/// (node 1: consistent, preferred, no witness): node 1 is not kept down by
/// it (a buggy, newer or hostile partner must not be able to), and goes on
/// alone as when the partner is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_does_not_keep_a_copy_that_can_serve_down() {
    let d = tempfile::tempdir().unwrap();
    let dialed = node1_dialing_a_fake(d.path(), Arc::new(MemVolume::new(512, BLOCKS))).await;
    let mut st = dialed.accept().await;
    let mut out = bytes::BytesMut::new();
    encode(
        &Message::Hello {
            node_id: 2,
            volume: "vol".into(),
            block_size_bytes: 512,
            block_count: BLOCKS,
            region_bytes: 64 << 10,
            gens: Generations {
                current: 9,
                synced: 9,
            },
            flags: hello_flags::CONSISTENT,
        },
        &mut out,
    );
    encode(
        &Message::Refused {
            reason: "split brain: both copies took writes (test)".into(),
        },
        &mut out,
    );
    st.writer.write_all(&out).await.unwrap();
    let n1 = &dialed.n1;
    goes_on_alone(n1).await;
    let s = n1.status();
    assert!(!s.reason.contains("refused to join"), "{s:?}");
    n1.shutdown().await;
}

/// A resync target that has taken changes (its copy unfinished), refused by
/// the source once both handshakes are done (as the consistent side refuses
/// an unfinished target it has no record of): node 2 learns it on the link,
/// shows why and stays down; before, it showed only that it waited.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unfinished_copy_refused_by_its_partner_shows_why() {
    let d = tempfile::tempdir().unwrap();
    let (n2, mut fake) =
        target_of_a_fake_leader(d.path(), Arc::new(MemVolume::new(512, BLOCKS))).await;
    fake.send(Message::ResyncData {
        id: 1,
        lba: 0,
        data: Bytes::from(vec![0xEEu8; 512]),
    })
    .await;
    loop {
        if let Message::Done { id: 1, result } = fake.next().await.expect("node 2 closed the link")
        {
            assert_eq!(result, OpResult::Ok);
            break;
        }
    }
    fake.send(Message::Refused {
        reason: "an unfinished resync target meets a copy with no record of it\u{7} (test)".into(),
    })
    .await;
    let shown = n2
        .wait_until(
            |s| s.reason.contains("refused to join") && s.reason.contains("(test)"),
            Duration::from_secs(20),
        )
        .await;
    let s = n2.status();
    assert!(shown, "{s:?}");
    assert_eq!(s.role, Role::Down, "{s:?}");
    assert!(
        !s.reason.contains('\u{7}'),
        "control characters kept: {s:?}"
    );
    n2.shutdown().await;
}

/// The operator keeps node 2's copy (both copies discarded, the partner met
/// and refused) while a new meeting is judging it. The keep waits for the
/// meeting (and its session), and is judged on the state it left: the
/// partner turned out consistent and a resync wrote here, so the copy is no
/// longer one to keep (deciding, then down and changed in part). Applied in
/// the middle of the handshake, it answered "kept" of a copy the partner then
/// overwrote.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_kept_during_a_handshake_is_judged_once_the_meeting_ends() {
    let d = tempfile::tempdir().unwrap();
    let k = keys();
    let (n2, addr) = node2_listening(d.path(), &k, Arc::new(MemVolume::new(512, BLOCKS))).await;
    assert!(
        n2.wait_until(|s| s.role == Role::Down, Duration::from_secs(20))
            .await
    );
    n2.discard_copy().await.unwrap();
    // a first meeting: the partner's copy is not consistent either
    let (r, w) = dial_as_node1(addr, &k).await;
    let (fake, _) = Fake::start_as(r, w, 1, Generations::default(), BLOCKS, false).await;
    assert!(
        n2.wait_until(
            |s| s.reason.contains("neither copy is consistent"),
            Duration::from_secs(20)
        )
        .await,
        "{:?}",
        n2.status()
    );
    fake.close();
    // the next meeting: node 2 has judged its copy and sent its half when the
    // operator keeps it
    let (r, w) = dial_as_node1(addr, &k).await;
    let (kept_tx, mut kept) = tokio::sync::watch::channel(None);
    let n = n2.clone();
    let mut seen = kept.clone();
    let hold = async move {
        tokio::spawn(async move {
            let _ = kept_tx.send(Some(n.keep_copy().await));
        });
        // taken at once, the keep is done within this bound; it must wait
        let done =
            tokio::time::timeout(Duration::from_secs(2), seen.wait_for(|k| k.is_some())).await;
        assert!(done.is_err(), "the keep did not wait for the meeting");
    };
    let gens = Generations {
        current: 9,
        synced: 9,
    };
    let (mut fake, _) =
        Fake::start_held(r, w, 1, gens, BLOCKS, hello_flags::CONSISTENT, hold).await;
    assert!(
        n2.wait_until(|s| s.role == Role::Target, Duration::from_secs(20))
            .await,
        "{:?}",
        n2.status()
    );
    fake.send(Message::ResyncData {
        id: 1,
        lba: 0,
        data: Bytes::from(vec![0x5Au8; 512]),
    })
    .await;
    loop {
        if let Message::Done { id: 1, result } = fake.next().await.expect("node 2 closed the link")
        {
            assert_eq!(result, OpResult::Ok);
            break;
        }
    }
    fake.close();
    let kept = kept
        .wait_for(|k| k.is_some())
        .await
        .unwrap()
        .clone()
        .unwrap();
    // judged once the session ended: the copy no longer down (deciding), or
    // down and changed by the resync; not a timeout
    let e = kept.expect_err("kept during the meeting");
    assert!(
        e.contains("Deciding") || e.contains("changed by a resync"),
        "{e}"
    );
    assert!(
        n2.wait_until(|s| s.role == Role::Down, Duration::from_secs(20))
            .await
    );
    let s = n2.status();
    assert!(s.partial, "{s:?}");
    let e = n2.keep_copy().await.unwrap_err();
    assert!(e.contains("changed by a resync"), "{e}");
    n2.shutdown().await;
}

/// A partner whose first frame is not a hello (a refusal, resync data): the
/// listener closes the connection, the node's state shows nothing of it, and
/// the next partner to say hello is met as usual.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_frame_that_is_not_a_hello_closes_the_connection_and_changes_nothing() {
    let d = tempfile::tempdir().unwrap();
    let k = keys();
    let m2: VolumeRef = Arc::new(MemVolume::new(512, BLOCKS));
    let (n2, addr) = node2_listening(d.path(), &k, m2.clone()).await;
    assert!(
        n2.wait_until(|s| s.role == Role::Down, Duration::from_secs(20))
            .await
    );
    let before = n2.status();
    for first in [
        Message::Refused {
            reason: "split brain (test)".into(),
        },
        Message::ResyncData {
            id: 1,
            lba: 0,
            data: Bytes::from(vec![0xEEu8; 512]),
        },
    ] {
        let (mut r, mut w) = dial_as_node1(addr, &k).await;
        let mut out = bytes::BytesMut::new();
        encode(&first, &mut out);
        w.write_all(&out).await.unwrap();
        let mut buf = bytes::BytesMut::new();
        let answer = tokio::time::timeout(Duration::from_secs(20), recv(&mut r, &mut buf))
            .await
            .expect("the connection stayed open");
        assert_eq!(answer, None, "answered {first:?}");
        let s = n2.status();
        assert_eq!(
            (s.role, &s.reason, &s.generation),
            (before.role, &before.reason, &before.generation)
        );
    }
    assert_eq!(m2.read(0, 1).await.unwrap(), Bytes::from(vec![0u8; 512]));
    // a partner that says hello is met
    let (r, w) = dial_as_node1(addr, &k).await;
    let (_fake, _) = Fake::start(r, w, 1, Generations::default()).await;
    assert!(
        n2.wait_until(|s| s.role == Role::Target, Duration::from_secs(20))
            .await,
        "{:?}",
        n2.status()
    );
    n2.shutdown().await;
}

/// The next answer (`Done` or `CopyData`) the node gives to request `id`,
/// skipping its other messages; panics if the link closes first.
async fn answer_to(fake: &mut Fake, id: u64) -> Message {
    loop {
        match fake.next().await {
            Some(m @ Message::Done { id: i, .. }) | Some(m @ Message::CopyData { id: i, .. })
                if i == id =>
            {
                return m
            }
            Some(_) => {}
            None => panic!("the node closed the link instead of answering request {id}"),
        }
    }
}

/// Whether `m` is an error answer.
fn refused(m: &Message) -> bool {
    matches!(
        m,
        Message::Done {
            result: OpResult::Error { .. },
            ..
        }
    )
}

/// Repair frames a leader sends its follower out of role or out of bounds are
/// answered with an error and change nothing: a repair asked of the follower
/// (only a leader repairs), blocks for it past the end of the volume or over
/// 8 MiB, a read of its copy over 8 MiB (which would take its memory). The
/// link stays (an error, not a closed link: a `Detach` behind it must still
/// arrive). A read of one block is answered with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repair_frames_out_of_role_or_bounds_are_refused_and_write_nothing() {
    let d = tempfile::tempdir().unwrap();
    let m2: VolumeRef = Arc::new(MemVolume::new(512, BLOCKS));
    m2.write(0, Bytes::from(vec![0x11u8; 512]), false)
        .await
        .unwrap();
    m2.write(BLOCKS - 1, Bytes::from(vec![0x22u8; 512]), false)
        .await
        .unwrap();
    let gens = Generations {
        current: 4,
        synced: 4,
    };
    let (n2, mut fake) = follower_of_a_fake_leader(d.path(), m2.clone(), gens).await;
    fake.send(Message::Repair {
        id: 10,
        lba: 0,
        blocks: 1,
    })
    .await;
    let a = answer_to(&mut fake, 10).await;
    assert_eq!(
        a,
        Message::Done {
            id: 10,
            result: OpResult::Error {
                code: replica_proto::error_codes::UNAVAILABLE,
                lba: 0
            }
        }
    );
    fake.send(Message::RepairData {
        id: 11,
        lba: BLOCKS - 1,
        data: Bytes::from(vec![0xEEu8; 1024]),
    })
    .await;
    assert!(refused(&answer_to(&mut fake, 11).await));
    fake.send(Message::RepairData {
        id: 12,
        lba: 0,
        data: Bytes::from(vec![0xEEu8; (8 << 20) + 512]),
    })
    .await;
    assert!(refused(&answer_to(&mut fake, 12).await));
    fake.send(Message::ReadCopy {
        id: 13,
        lba: 0,
        blocks: 1 << 40,
    })
    .await;
    assert!(refused(&answer_to(&mut fake, 13).await));
    fake.send(Message::ReadCopy {
        id: 14,
        lba: 0,
        blocks: (8 << 20) / 512 + 1,
    })
    .await;
    assert!(refused(&answer_to(&mut fake, 14).await));
    fake.send(Message::ReadCopy {
        id: 15,
        lba: 0,
        blocks: 1,
    })
    .await;
    assert_eq!(
        answer_to(&mut fake, 15).await,
        Message::CopyData {
            id: 15,
            data: Bytes::from(vec![0x11u8; 512])
        }
    );
    assert_eq!(m2.read(0, 1).await.unwrap(), vec![0x11u8; 512]);
    assert_eq!(m2.read(BLOCKS - 1, 1).await.unwrap(), vec![0x22u8; 512]);
    assert_eq!(n2.role(), Role::Follower);
    assert_eq!(n2.status().repaired_blocks, 0);
    n2.shutdown().await;
}

/// A leader that says it repaired blocks the follower cannot read, without
/// sending them, then answers the follower's read of its copy with the wrong
/// number of bytes: the follower's read fails with its own medium error (it
/// serves nothing the leader sent) and it closes the link, as the leader does
/// for such an answer (`Link::read_copy`). Before, it dropped the answer but
/// kept the link (this test then fails when `Fake::next` waits 20 s for a
/// close that never comes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_lying_about_a_repair_serves_nothing_and_loses_the_link() {
    let d = tempfile::tempdir().unwrap();
    let mem: VolumeRef = Arc::new(MemVolume::new(512, BLOCKS));
    let faulty = Arc::new(block::FaultVolume::new(mem.clone()));
    let gens = Generations {
        current: 6,
        synced: 6,
    };
    let (n2, mut fake) = follower_of_a_fake_leader(d.path(), faulty.clone(), gens).await;
    faulty.plan().lock().bad_read_blocks.push(1..2);
    let read = {
        let n2 = n2.clone();
        tokio::spawn(async move { n2.read(0, 4).await })
    };
    let mut asked = 0;
    loop {
        match fake.next().await {
            Some(Message::Repair { id, lba, blocks }) => {
                assert!(lba <= 1 && lba + blocks > 1, "{lba} {blocks}");
                asked += 1;
                fake.send(Message::Done {
                    id,
                    result: OpResult::Ok,
                })
                .await;
            }
            Some(Message::ReadCopy { id, blocks, .. }) => {
                fake.send(Message::CopyData {
                    id,
                    data: Bytes::from(vec![0xEEu8; (blocks as usize + 1) * 512]),
                })
                .await;
            }
            Some(_) => {}
            None => break,
        }
    }
    assert!(asked >= 1);
    assert!(matches!(
        read.await.unwrap(),
        Err(block::BlockError::Medium { lba: 1 })
    ));
    n2.shutdown().await;
}

/// A follower that sends its leader blocks to write as a repair (only a
/// leader repairs its follower), or asks a repair over 8 MiB, is answered with
/// an error and the leader's copy is unchanged. When the leader's own copy
/// cannot read a block, a follower that answers the leader's read with an
/// error leaves the read failing with the leader's medium error (a refusal
/// after one request; "cannot read either" after the range is halved down to
/// the block), and one that answers with the wrong number of bytes has its
/// link closed: in no case is anything written to the leader's copy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_cannot_write_the_leaders_copy_through_a_repair() {
    let d = tempfile::tempdir().unwrap();
    let mem: VolumeRef = Arc::new(MemVolume::new(512, BLOCKS));
    mem.write(0, Bytes::from(vec![0x11u8; 8 * 512]), false)
        .await
        .unwrap();
    let faulty = Arc::new(block::FaultVolume::new(mem.clone()));
    faulty.plan().lock().remap_on_write = true;
    let (dialed, mut fake) =
        leader_in_sync_with_a_fake(d.path(), faulty.clone(), hello_flags::CONSISTENT, |_| {}).await;
    let n1 = &dialed.n1;
    fake.send(Message::RepairData {
        id: 1 << 40,
        lba: 0,
        data: Bytes::from(vec![0xEEu8; 512]),
    })
    .await;
    assert!(refused(&answer_to(&mut fake, 1 << 40).await));
    fake.send(Message::Repair {
        id: (1 << 40) + 1,
        lba: 0,
        blocks: 1 << 40,
    })
    .await;
    assert!(refused(&answer_to(&mut fake, (1 << 40) + 1).await));
    assert_eq!(mem.read(0, 8).await.unwrap(), vec![0x11u8; 8 * 512]);
    // block 5 of the leader's copy cannot be read
    faulty.plan().lock().bad_read_blocks.push(5..6);
    // the follower's answers: it cannot serve now (one request: a refusal
    // is not halved), it cannot read them either (halved: blocks 4 and 5
    // are read again here, block 5 asked alone), the wrong length
    use replica_proto::error_codes::{MEDIUM, UNAVAILABLE};
    for (answer, asks) in [(Some(UNAVAILABLE), 1), (Some(MEDIUM), 2), (None, 1)] {
        let read = n1.read(4, 2);
        tokio::pin!(read);
        let mut asked = Vec::new();
        let r = loop {
            tokio::select! {
                r = &mut read => break r,
                m = fake.next() => match m {
                    Some(Message::ReadCopy { id, lba, blocks }) => {
                        asked.push((lba, blocks));
                        let reply = match answer {
                            Some(code) => Message::Done {
                                id,
                                result: OpResult::Error { code, lba: 5 },
                            },
                            None => Message::CopyData {
                                id,
                                data: Bytes::from(vec![0xEEu8; (blocks as usize + 1) * 512]),
                            },
                        };
                        fake.send(reply).await;
                    }
                    Some(_) => {}
                    None => break read.await,
                },
            }
        };
        assert!(
            matches!(r, Err(block::BlockError::Medium { lba: 5 })),
            "{r:?}"
        );
        assert_eq!(asked.len(), asks, "{answer:?}: {asked:?}");
        assert_eq!(asked[0], (4, 2));
        if asks == 2 {
            assert_eq!(asked[1], (5, 1));
        }
        assert!(!faulty.plan().lock().bad_read_blocks.is_empty(), "written");
        assert_eq!(mem.read(4, 2).await.unwrap(), vec![0x11u8; 2 * 512]);
    }
    // the tampered answer closed the link
    while fake.next().await.is_some() {}
    assert_eq!(n1.status().repaired_blocks, 0);
    n1.shutdown().await;
}

/// Node 1 (preferred) over `m1`, its configuration changed by `change`, in
/// sync as the leader of a fake node 2 whose hello carries `flags` (see
/// [`handshake_held`]; `EARLIER_VERSION` for a partner before repairs).
async fn leader_in_sync_with_a_fake(
    dir: &Path,
    m1: VolumeRef,
    flags: u32,
    change: impl FnOnce(&mut ReplicaConfig),
) -> (Dialed, Fake) {
    let dialed = node1_dialing_a_fake_with(dir, m1, change).await;
    let st = dialed.accept().await;
    let gens = Generations::default();
    let (mut fake, _) =
        Fake::start_held(st.reader, st.writer, 2, gens, BLOCKS, flags, async {}).await;
    take_resync(&mut fake, true).await;
    assert!(
        dialed
            .n1
            .wait_until(|s| s.state == "in-sync", Duration::from_secs(20))
            .await,
        "{:?}",
        dialed.n1.status()
    );
    (dialed, fake)
}

/// Leader `n1`'s read of `blocks` at `lba`, the fake follower answering any
/// `ReadCopy` of its copy with 0xEE blocks: the read's result and the
/// repair requests (`ReadCopy`, `Repair`) it was sent meanwhile.
async fn read_answering_the_partners_part(
    n1: &ReplicatedVolume,
    fake: &mut Fake,
    lba: u64,
    blocks: u32,
) -> (block::BlockResult<Bytes>, Vec<Message>) {
    let read = n1.read(lba, blocks);
    tokio::pin!(read);
    let mut asked = Vec::new();
    let r = loop {
        tokio::select! {
            r = &mut read => break r,
            m = fake.next() => match m {
                Some(m @ (Message::ReadCopy { .. } | Message::Repair { .. })) => {
                    if let Message::ReadCopy { id, blocks, .. } = m {
                        let data = Bytes::from(vec![0xEEu8; blocks as usize * 512]);
                        fake.send(Message::CopyData { id, data }).await;
                    }
                    asked.push(m);
                }
                Some(_) => {}
                None => panic!("the leader closed the link"),
            },
        }
    };
    (r, asked)
}

/// A pinned region (a write there failed on the follower: the copies are
/// known to differ, and either may be the newer) is repaired neither way:
/// the leader's read that cannot read a block there fails with its medium
/// error without reading the follower's copy, and a follower asking the
/// leader to repair it there is refused, sent nothing. Before the pinned
/// check, either would have made the two copies the same with blocks a
/// resync, not a repair, must decide (this test then sees the leader's
/// `ReadCopy`, or its `RepairData`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pinned_region_is_repaired_neither_way() {
    let d = tempfile::tempdir().unwrap();
    let mem: VolumeRef = Arc::new(MemVolume::new(512, BLOCKS));
    let faulty = Arc::new(block::FaultVolume::new(mem.clone()));
    faulty.plan().lock().remap_on_write = true;
    let (dialed, mut fake) =
        leader_in_sync_with_a_fake(d.path(), faulty.clone(), hello_flags::CONSISTENT, |_| {}).await;
    let n1 = &dialed.n1;
    // a write of blocks 4-5 that the follower fails: written here, pinned
    use replica_proto::error_codes::{UNAVAILABLE, WRITE_FAULT};
    let write = n1.write(4, Bytes::from(vec![0x33u8; 2 * 512]), false);
    tokio::pin!(write);
    let written = loop {
        tokio::select! {
            r = &mut write => break r,
            m = fake.next() => match m {
                Some(Message::Apply { id, .. }) => {
                    fake.send(Message::Done {
                        id,
                        result: OpResult::Error { code: WRITE_FAULT, lba: 4 },
                    })
                    .await
                }
                Some(_) => {}
                None => panic!("the leader closed the link"),
            },
        }
    };
    assert!(written.is_err(), "{written:?}");
    assert_eq!(mem.read(4, 2).await.unwrap(), vec![0x33u8; 2 * 512]);
    // the leader's copy cannot read block 5: its read is not repaired from
    // the follower's copy (which would be answered if asked)
    faulty.plan().lock().bad_read_blocks.push(5..6);
    let (r, asked) = read_answering_the_partners_part(n1, &mut fake, 4, 2).await;
    assert!(
        matches!(r, Err(block::BlockError::Medium { lba: 5 })),
        "{r:?}"
    );
    assert!(asked.is_empty(), "the follower's copy was read: {asked:?}");
    assert!(!faulty.plan().lock().bad_read_blocks.is_empty(), "written");
    // the follower asks the leader to repair blocks 4-5 of its copy (the
    // leader's reads again): refused, nothing sent
    faulty.plan().lock().bad_read_blocks.clear();
    let id = 1 << 41;
    fake.send(Message::Repair {
        id,
        lba: 4,
        blocks: 2,
    })
    .await;
    let answer = loop {
        match fake.next().await {
            Some(m @ Message::Done { id: i, .. }) if i == id => break m,
            Some(m @ Message::RepairData { .. }) => panic!("the leader sent a repair: {m:?}"),
            Some(_) => {}
            None => panic!("the leader closed the link"),
        }
    };
    assert_eq!(
        answer,
        Message::Done {
            id,
            result: OpResult::Error {
                code: UNAVAILABLE,
                lba: 0
            }
        }
    );
    assert_eq!(n1.status().repaired_blocks, 0);
    n1.shutdown().await;
}

/// A partner's read of this copy is charged to the node's buffer budget
/// while it is handled, as much as it reads (here the whole 1 MiB volume in
/// one `ReadCopy`, against a budget of 64 KiB that the resync before it
/// never went past): the charge does not wait, so the budget's high water
/// shows it. Fails without the dispatcher's charge of what a `Repair` or
/// `ReadCopy` reads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partners_read_of_this_copy_is_charged_to_the_buffer_budget() {
    let d = tempfile::tempdir().unwrap();
    let budget = block::BufferBudget::new(64 << 10);
    let (dialed, mut fake) = leader_in_sync_with_a_fake(
        d.path(),
        Arc::new(MemVolume::new(512, BLOCKS)),
        hello_flags::CONSISTENT,
        |c| c.buffers = budget.clone(),
    )
    .await;
    let n1 = &dialed.n1;
    let before = budget.status().high_water_bytes;
    assert!(before < BLOCKS * 512, "{before}");
    let id = 1 << 42;
    fake.send(Message::ReadCopy {
        id,
        lba: 0,
        blocks: BLOCKS,
    })
    .await;
    match answer_to(&mut fake, id).await {
        Message::CopyData { data, .. } => assert_eq!(data.len() as u64, BLOCKS * 512),
        m => panic!("{m:?}"),
    }
    let after = budget.status();
    assert!(after.high_water_bytes >= BLOCKS * 512, "{after:?}");
    n1.shutdown().await;
}

/// A partner of a version before repairs (its hello without
/// `hello_flags::REPAIR`) is never sent a repair request it would not know:
/// the leader's read of a block its copy cannot read fails with its medium
/// error, as before repairs, and the follower is asked nothing (an unknown
/// request would be taken for a broken protocol and close the link).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partner_of_an_earlier_version_is_asked_for_no_repair() {
    let d = tempfile::tempdir().unwrap();
    let mem: VolumeRef = Arc::new(MemVolume::new(512, BLOCKS));
    let faulty = Arc::new(block::FaultVolume::new(mem.clone()));
    let (dialed, mut fake) = leader_in_sync_with_a_fake(
        d.path(),
        faulty.clone(),
        hello_flags::CONSISTENT | EARLIER_VERSION,
        |_| {},
    )
    .await;
    let n1 = &dialed.n1;
    faulty.plan().lock().bad_read_blocks.push(5..6);
    let (r, asked) = read_answering_the_partners_part(n1, &mut fake, 4, 2).await;
    assert!(
        matches!(r, Err(block::BlockError::Medium { lba: 5 })),
        "{r:?}"
    );
    assert!(asked.is_empty(), "asked of an earlier version: {asked:?}");
    assert_eq!(n1.status().state, "in-sync");
    n1.shutdown().await;
}

/// Node 1 (preferred, over a fresh memory copy) and the one connection it
/// made to the fake node 2, whose listener is then gone: once that link is
/// lost, node 1 redials in vain and decides at once (a listener left open
/// takes the dial, and the handshake's timeout holds the decision).
async fn node1_connected_once(dir: &Path) -> (ReplicatedVolume, replica::secure::SecureStream) {
    let dialed = node1_dialing_a_fake(dir, Arc::new(MemVolume::new(512, BLOCKS))).await;
    let st = dialed.accept().await;
    (dialed.n1, st)
}

/// The first lease counts from this node's hello, not from its link's
/// start: the partner counts it from its own link's start, which comes after
/// it read that hello, so a lease counted from here outlasted what the
/// partner waits out before it goes on alone. The fake holds the end of its
/// handshake for longer than the peer timeout (400 ms), then answers
/// nothing: node 1 must serve nothing as leader on that link (its lease ran
/// out before the link began), only once it went on alone. Before (review of
/// 2026-12-06), a read was served at once, as leader, with the partner
/// already free to take over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_lease_counts_from_the_hello_not_from_the_links_start() {
    let d = tempfile::tempdir().unwrap();
    let (n1, st) = node1_connected_once(d.path()).await;
    let (_r, _w, _buf, _) = handshake_held(
        st.reader,
        st.writer,
        2,
        Generations::default(),
        BLOCKS,
        hello_flags::CONSISTENT,
        tokio::time::sleep(Duration::from_millis(1000)),
    )
    .await;
    reaches(&n1, Role::Leader).await;
    n1.read(0, 1).await.expect("the read was never served");
    let s = n1.status();
    assert_eq!(
        s.role,
        Role::Solo,
        "served on a lease the partner may think over: {s:?}"
    );
    n1.shutdown().await;
}

/// A partner whose hello says its peer timeout is longer (2 s, against this
/// node's 400 ms) keeps its lease on serving that long after its last ping:
/// once it is lost, node 1 (preferred, no witness) goes on alone only after
/// the longer timeout. Before (review of 2026-12-06), the nodes had to have
/// the same timeout and nothing said so: a survivor with a shorter one took
/// over while the partner still served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_survivor_waits_out_the_partners_longer_peer_timeout() {
    let d = tempfile::tempdir().unwrap();
    let (n1, st) = node1_connected_once(d.path()).await;
    let flags =
        hello_flags::CONSISTENT | hello_flags::SETTINGS | (20 << hello_flags::TIMEOUT_SHIFT); // 20 x 100 ms
    let (fake, _) = Fake::start_held(
        st.reader,
        st.writer,
        2,
        Generations::default(),
        BLOCKS,
        flags,
        async {},
    )
    .await;
    reaches(&n1, Role::Leader).await;
    let cut = std::time::Instant::now();
    fake.close();
    reaches(&n1, Role::Solo).await;
    // its last ping came at most one interval (50 ms) before the cut
    let waited = cut.elapsed();
    assert!(
        waited >= Duration::from_millis(1900),
        "went on alone {waited:?} after losing a partner whose lease lasts 2 s"
    );
    n1.shutdown().await;
}

/// A handshake that fails after the partner read this node's hello (its own
/// hello never arrives here, as when the path fails one way): the partner may
/// have finished its side and serve, on a lease counted from its hello, sent
/// at most when the handshake failed. Node 1 (preferred, no witness, peer
/// timeout 3 s) goes on alone only once that lease is over. Before (review
/// of 2026-12-06), it decided from the last ping of an older meeting (none
/// here) and went on alone 0.3 s after the failure.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handshake_failing_after_the_partner_read_the_hello_waits_out_its_lease() {
    let d = tempfile::tempdir().unwrap();
    let dialed = node1_dialing_a_fake_with(d.path(), Arc::new(MemVolume::new(512, BLOCKS)), |c| {
        c.peer_timeout_ms = 3000
    })
    .await;
    // one connection taken, its hello read, nothing answered; no other
    let st = dialed.accept().await;
    let Dialed { n1, l, .. } = dialed;
    drop(l);
    let (mut r, _w) = (st.reader, st.writer);
    let mut buf = bytes::BytesMut::new();
    let first = recv(&mut r, &mut buf).await;
    assert!(matches!(first, Some(Message::Hello { .. })), "{first:?}");
    let read_at = std::time::Instant::now();
    reaches(&n1, Role::Solo).await;
    // the handshake fails 5 s after the hello; the lease lasts 3 s from then
    let waited = read_at.elapsed();
    assert!(
        waited >= Duration::from_millis(7800),
        "went on alone {waited:?} after a hello the partner may have answered by serving"
    );
    n1.shutdown().await;
}
