//! Heartbeats on every sync link at once, apart from the connection in use.
//!
//! The replication connection runs over one sync link at a time and keeps its
//! own lease (see `link.rs`). This monitor pings the partner over *each*
//! configured sync link with small UDP datagrams (a `Ping` frame of the
//! replication codec, answered by a `Pong`), so that a dead standby link is
//! seen before it is needed, the dialer picks a link that answers, and the
//! status shows every link's state and round-trip time.
//!
//! Datagrams are authenticated (HMAC-SHA256 under a key derived from the
//! cluster secret, over the datagram and the link it belongs to: which
//! monitor, sync or client network, and which link of it) and name their
//! sender; a Ping carries a fresh random nonce that its Pong must echo, so a
//! spoofed, replayed or reflected datagram never marks a link up, nor one
//! bounced off another of the partner's sockets. Pings are answered only
//! when they come from the link's configured peer address and carry a
//! sequence number above the last one answered (they start from the clock at
//! each start, so a restarted partner is answered at once; after three peer
//! timeouts without a fresh Ping, any is taken again, for a partner whose
//! clock went back): a Ping captured and replayed is not answered and uses
//! none of the answers' budget (review of 2026-12-06: one replayed Ping at
//! 200/s used it all, and the partner marked the link down). Answers are
//! rate-limited per socket.

use hmac::{Hmac, Mac};
use parking_lot::Mutex;
use serde::Serialize;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::net::UdpSocket;

/// Largest heartbeat datagram.
const DATAGRAM_BYTES_MAX: usize = 64;
/// Heartbeat datagram: magic, kind, sender node, seq, nonce, HMAC tag.
const MAGIC: &[u8; 4] = b"FSH1";
const KIND_PING: u8 = 1;
const KIND_PONG: u8 = 2;
const NONCE_BYTES: usize = 16;
const TAG_BYTES: usize = 32;
const BODY_BYTES: usize = 4 + 1 + 1 + 8 + NONCE_BYTES;
/// Length of every heartbeat datagram.
pub const DATAGRAM_BYTES: usize = BODY_BYTES + TAG_BYTES;
/// Pings answered per socket per second at most.
const ANSWERS_PER_SECOND_MAX: u32 = 200;

/// What a node needs to sign and check heartbeats.
#[derive(Clone)]
pub struct HeartbeatAuth {
    key: [u8; 32],
    me: u8,
    /// The link the datagrams belong to (see [`HeartbeatAuth::for_link`]).
    link: Vec<u8>,
}

impl HeartbeatAuth {
    /// Heartbeats of node `keys.me()`, keyed from the cluster secret.
    pub fn new(keys: &crate::secure::ClusterKeys) -> HeartbeatAuth {
        HeartbeatAuth {
            key: keys.heartbeat_key(),
            me: keys.me().node_id(),
            link: Vec::new(),
        }
    }

    /// The heartbeats of link `index` of the `purpose` monitor (`"sync"` or
    /// `"client"`): the tag covers both, so a datagram of one link does not
    /// verify on another.
    pub fn for_link(&self, purpose: &str, index: usize) -> HeartbeatAuth {
        let mut link = purpose.as_bytes().to_vec();
        link.push(0);
        link.extend_from_slice(&(index as u64).to_be_bytes());
        HeartbeatAuth {
            link,
            ..self.clone()
        }
    }

    fn partner(&self) -> u8 {
        3u8.saturating_sub(self.me)
    }

    fn mac(&self) -> Hmac<sha2::Sha256> {
        let mut m = <Hmac<sha2::Sha256> as Mac>::new_from_slice(&self.key)
            .expect("HMAC takes any key length");
        m.update(&(self.link.len() as u64).to_be_bytes());
        m.update(&self.link);
        m
    }

    /// A signed datagram.
    pub fn seal(&self, kind: u8, seq: u64, nonce: &[u8; NONCE_BYTES]) -> [u8; DATAGRAM_BYTES] {
        let mut d = [0u8; DATAGRAM_BYTES];
        d[..4].copy_from_slice(MAGIC);
        d[4] = kind;
        d[5] = self.me;
        d[6..14].copy_from_slice(&seq.to_be_bytes());
        d[14..BODY_BYTES].copy_from_slice(nonce);
        let mut m = self.mac();
        m.update(&d[..BODY_BYTES]);
        d[BODY_BYTES..].copy_from_slice(&m.finalize().into_bytes());
        d
    }

    /// Checks a datagram: the partner's, untampered. Returns (kind, seq, nonce).
    /// Pure: fuzzed.
    pub fn open(&self, d: &[u8]) -> Option<(u8, u64, [u8; NONCE_BYTES])> {
        if d.len() != DATAGRAM_BYTES || &d[..4] != MAGIC || d[5] != self.partner() {
            return None;
        }
        let mut m = self.mac();
        m.update(&d[..BODY_BYTES]);
        m.verify_slice(&d[BODY_BYTES..]).ok()?;
        let seq = u64::from_be_bytes(d[6..14].try_into().ok()?);
        let nonce: [u8; NONCE_BYTES] = d[14..BODY_BYTES].try_into().ok()?;
        Some((d[4], seq, nonce))
    }
}

/// State of one sync link as the monitor sees it.
#[derive(Debug, Clone, Serialize)]
pub struct SyncLinkState {
    /// This node's address on the link.
    pub local: String,
    /// The partner's address on the link.
    pub peer: String,
    /// The partner answered within the peer timeout.
    pub up: bool,
    /// Round-trip time of the last answer, in microseconds.
    pub rtt_us: Option<u64>,
}

struct Slot {
    local: SocketAddr,
    peer: SocketAddr,
    /// The datagrams of this link.
    auth: HeartbeatAuth,
    last_answer: Option<Instant>,
    rtt: Option<Duration>,
    sent: Vec<(u64, [u8; NONCE_BYTES], Instant)>,
    /// The partner's last Ping answered: its sequence number, and when.
    last_ping: Option<(u64, Instant)>,
}

/// Pings the partner on every sync link.
pub struct SyncLinkMonitor {
    slots: Mutex<Vec<Slot>>,
    peer_timeout: Duration,
}

impl SyncLinkMonitor {
    /// Binds a UDP socket on each local sync address (the port of the TCP sync
    /// listener) and pings the partner's address of the same link, link `i` of
    /// `local` pairing with link `i` of `peer`. `purpose` names the monitor
    /// (`"sync"`, `"client"`): the partner's must say the same.
    pub async fn start(
        purpose: &str,
        local: &[SocketAddr],
        peer: &[SocketAddr],
        interval: Duration,
        peer_timeout: Duration,
        auth: HeartbeatAuth,
    ) -> std::io::Result<Arc<SyncLinkMonitor>> {
        let mut sockets = Vec::new();
        let mut slots = Vec::new();
        for (i, (l, p)) in local.iter().zip(peer).enumerate() {
            let s = UdpSocket::bind(l).await?;
            slots.push(Slot {
                local: s.local_addr()?,
                peer: *p,
                auth: auth.for_link(purpose, i),
                last_answer: None,
                rtt: None,
                sent: Vec::new(),
                last_ping: None,
            });
            sockets.push(Arc::new(s));
        }
        let m = Arc::new(SyncLinkMonitor {
            slots: Mutex::new(slots),
            peer_timeout,
        });
        for (i, s) in sockets.into_iter().enumerate() {
            tokio::spawn(answer_and_listen(Arc::downgrade(&m), i, s.clone()));
            tokio::spawn(ping(Arc::downgrade(&m), i, s, interval));
        }
        Ok(m)
    }

    /// Every link's state, in configuration order.
    pub fn links(&self) -> Vec<SyncLinkState> {
        let now = Instant::now();
        self.slots
            .lock()
            .iter()
            .map(|s| SyncLinkState {
                local: s.local.to_string(),
                peer: s.peer.to_string(),
                up: s
                    .last_answer
                    .is_some_and(|t| now.duration_since(t) < self.peer_timeout),
                rtt_us: s.rtt.map(|d| d.as_micros() as u64),
            })
            .collect()
    }

    /// Whether link `i` answers.
    pub fn is_up(&self, i: usize) -> bool {
        self.links().get(i).is_some_and(|l| l.up)
    }
}

async fn ping(
    m: std::sync::Weak<SyncLinkMonitor>,
    i: usize,
    s: Arc<UdpSocket>,
    interval: Duration,
) {
    // from the clock: a restarted node's Pings come after its last ones
    let mut seq = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64);
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(m) = m.upgrade() else { return };
        seq += 1;
        let mut nonce = [0u8; NONCE_BYTES];
        rand::RngCore::fill_bytes(&mut rand::thread_rng(), &mut nonce);
        let (peer, out) = {
            let mut slots = m.slots.lock();
            let slot = &mut slots[i];
            slot.sent.push((seq, nonce, Instant::now()));
            if slot.sent.len() > 16 {
                slot.sent.remove(0);
            }
            (slot.peer, slot.auth.seal(KIND_PING, seq, &nonce))
        };
        // an unreachable link is exactly what this measures: errors are expected
        let _ = s.send_to(&out, peer).await;
    }
}

async fn answer_and_listen(m: std::sync::Weak<SyncLinkMonitor>, i: usize, s: Arc<UdpSocket>) {
    let mut buf = [0u8; DATAGRAM_BYTES_MAX];
    let (mut second, mut answered) = (Instant::now(), 0u32);
    // the link's peer and key never change once started
    let Some((auth, peer)) = m.upgrade().map(|m| {
        let slots = m.slots.lock();
        (slots[i].auth.clone(), slots[i].peer)
    }) else {
        return;
    };
    loop {
        let Ok((n, from)) = s.recv_from(&mut buf).await else {
            // ICMP errors of unreachable peers surface here; go on listening
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        // only the partner's address is heard, before any lock or HMAC: a
        // flood from elsewhere (the client network's heartbeats share the
        // portals, which every initiator reaches) costs a comparison each
        // (review of 2026-12-06)
        if from != peer {
            continue;
        }
        let Some(m) = m.upgrade() else { return };
        match auth.open(&buf[..n]) {
            Some((KIND_PING, seq, nonce)) => {
                let out = {
                    let mut slots = m.slots.lock();
                    let slot = &mut slots[i];
                    let now = Instant::now();
                    let fresh = match slot.last_ping {
                        None => true,
                        Some((last, at)) => {
                            seq > last || now.duration_since(at) >= 3 * m.peer_timeout
                        }
                    };
                    if !fresh {
                        continue;
                    }
                    if second.elapsed() >= Duration::from_secs(1) {
                        (second, answered) = (Instant::now(), 0);
                    }
                    answered += 1;
                    if answered > ANSWERS_PER_SECOND_MAX {
                        continue;
                    }
                    slot.last_ping = Some((seq, now));
                    slot.auth.seal(KIND_PONG, seq, &nonce)
                };
                let _ = s.send_to(&out, from).await;
            }
            Some((KIND_PONG, seq, nonce)) => {
                let mut slots = m.slots.lock();
                let slot = &mut slots[i];
                // only the answer to a ping of ours, by its nonce, counts
                if let Some(k) = slot
                    .sent
                    .iter()
                    .position(|(q, nn, _)| *q == seq && *nn == nonce)
                {
                    let (_, _, at) = slot.sent.remove(k);
                    let now = Instant::now();
                    slot.rtt = Some(now.duration_since(at));
                    slot.last_answer = Some(now);
                }
            }
            _ => {
                tracing::debug!(%from, "unauthenticated datagram on a sync heartbeat port: ignored")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::secure::ClusterKeys;

    #[tokio::test]
    async fn links_answering_are_up_and_silent_ones_down() {
        let keys = ClusterKeys::generate("c").unwrap();
        // node A has two links; node B answers on its first only
        // B's address stays taken until B binds it: freed at once, it was
        // handed to one of A's sockets now and then (CI: AddrInUse)
        let b1_held = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let b1 = b1_held.local_addr().unwrap();
        let dead = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let dead_addr = dead.local_addr().unwrap(); // bound, never answers
        let a = SyncLinkMonitor::start(
            "sync",
            &[
                "127.0.0.1:0".parse().unwrap(),
                "127.0.0.1:0".parse().unwrap(),
            ],
            &[b1, dead_addr],
            Duration::from_millis(20),
            Duration::from_millis(200),
            HeartbeatAuth::new(&keys[0]),
        )
        .await
        .unwrap();
        let a_addr: SocketAddr = a.links()[0].local.parse().unwrap();
        drop(b1_held);
        let _b = SyncLinkMonitor::start(
            "sync",
            &[b1],
            &[a_addr],
            Duration::from_millis(20),
            Duration::from_millis(200),
            HeartbeatAuth::new(&keys[1]),
        )
        .await
        .unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while !a.is_up(0) {
            assert!(
                Instant::now() < deadline,
                "link 0 never came up: {:?}",
                a.links()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(!a.is_up(1), "a silent link counts as up: {:?}", a.links());
        assert!(a.links()[0].rtt_us.is_some());
        drop(dead);
    }

    /// An attacker at the partner's address answers every ping: with other
    /// keys, with the old unauthenticated Pong, by replaying a real pong of an
    /// earlier ping, or by reflecting the node's own ping. The link never
    /// counts as up.
    #[tokio::test]
    async fn spoofed_replayed_and_reflected_heartbeats_never_count() {
        let keys = ClusterKeys::generate("c").unwrap();
        let strangers = ClusterKeys::generate("c").unwrap();
        let fake = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let a = SyncLinkMonitor::start(
            "sync",
            &["127.0.0.1:0".parse().unwrap()],
            &[fake.local_addr().unwrap()],
            Duration::from_millis(10),
            Duration::from_millis(500),
            HeartbeatAuth::new(&keys[0]),
        )
        .await
        .unwrap();
        let wrong = HeartbeatAuth::new(&strangers[1]).for_link("sync", 0);
        let right = HeartbeatAuth::new(&keys[1]).for_link("sync", 0);
        // a real pong of an old ping, captured earlier
        let old = right.seal(KIND_PONG, 1, &[9u8; NONCE_BYTES]);
        let mut buf = [0u8; 128];
        let mut pings = 0;
        let deadline = Instant::now() + Duration::from_secs(1);
        while Instant::now() < deadline {
            let Ok(Ok((n, from))) =
                tokio::time::timeout(Duration::from_millis(100), fake.recv_from(&mut buf)).await
            else {
                continue;
            };
            pings += 1;
            let seq = u64::from_be_bytes(buf[6..14].try_into().unwrap());
            let mut nonce = [0u8; NONCE_BYTES];
            nonce.copy_from_slice(&buf[14..BODY_BYTES]);
            // the same nonce and seq, under the wrong key
            fake.send_to(&wrong.seal(KIND_PONG, seq, &nonce), from)
                .await
                .unwrap();
            // the codec's plain Pong, as before authentication
            let mut plain = bytes::BytesMut::new();
            replica_proto::encode(&replica_proto::Message::Pong { seq }, &mut plain);
            fake.send_to(&plain, from).await.unwrap();
            // a replayed genuine pong with an old nonce, and the ping reflected
            fake.send_to(&old, from).await.unwrap();
            fake.send_to(&buf[..n], from).await.unwrap();
            assert!(!a.is_up(0), "forged heartbeat accepted: {:?}", a.links());
        }
        assert!(pings > 10, "the monitor sent only {pings} pings");
        assert!(!a.is_up(0), "forged heartbeat accepted: {:?}", a.links());
        // the genuine answer does count (the test would pass vacuously otherwise)
        let Ok((_, from)) = fake.recv_from(&mut buf).await else {
            panic!("no ping")
        };
        let seq = u64::from_be_bytes(buf[6..14].try_into().unwrap());
        let mut nonce = [0u8; NONCE_BYTES];
        nonce.copy_from_slice(&buf[14..BODY_BYTES]);
        fake.send_to(&right.seal(KIND_PONG, seq, &nonce), from)
            .await
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        while !a.is_up(0) {
            assert!(Instant::now() < deadline, "genuine pong not counted");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// The node answers a Ping only from the link's peer address, only for
    /// that link, and only once: a captured Ping replayed (to use up the
    /// answers' budget, or to reflect its Pong), one sent from elsewhere and
    /// one of another link (the client network's, or link 1) get nothing.
    #[tokio::test]
    async fn replayed_misrouted_and_foreign_pings_are_not_answered() {
        let keys = ClusterKeys::generate("c").unwrap();
        let peer = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let elsewhere = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let b = SyncLinkMonitor::start(
            "sync",
            &["127.0.0.1:0".parse().unwrap()],
            &[peer.local_addr().unwrap()],
            Duration::from_millis(50),
            Duration::from_millis(500),
            HeartbeatAuth::new(&keys[1]),
        )
        .await
        .unwrap();
        let b_addr: SocketAddr = b.links()[0].local.parse().unwrap();
        let a = HeartbeatAuth::new(&keys[0]);
        let answered = |from, ping| pong_to(from, ping, b_addr);
        let sync0 = a.for_link("sync", 0);
        let ping = sync0.seal(KIND_PING, 1000, &[1u8; NONCE_BYTES]);
        assert!(answered(&peer, ping).await, "a genuine Ping got no answer");
        assert!(!answered(&peer, ping).await, "a replayed Ping was answered");
        let later = sync0.seal(KIND_PING, 1001, &[2u8; NONCE_BYTES]);
        assert!(
            !answered(&elsewhere, later).await,
            "a Ping from another address was answered"
        );
        for other in [a.for_link("client", 0), a.for_link("sync", 1), a.clone()] {
            let p = other.seal(KIND_PING, 1002, &[3u8; NONCE_BYTES]);
            assert!(
                !answered(&peer, p).await,
                "another link's Ping was answered"
            );
        }
        assert!(answered(&peer, later).await, "a fresh Ping got no answer");
    }

    /// Sends `ping` from `from` to `to`; whether its Pong comes within a bound
    /// (a wait for what must not come is bounded).
    async fn pong_to(
        from: &tokio::net::UdpSocket,
        ping: [u8; DATAGRAM_BYTES],
        to: SocketAddr,
    ) -> bool {
        from.send_to(&ping, to).await.unwrap();
        let mut buf = [0u8; 128];
        let end = Instant::now() + Duration::from_millis(300);
        while let Some(left) = end.checked_duration_since(Instant::now()) {
            let Ok(Ok((n, _))) = tokio::time::timeout(left, from.recv_from(&mut buf)).await else {
                return false;
            };
            // (the node's own Pings come here too)
            if n == DATAGRAM_BYTES
                && buf[4] == KIND_PONG
                && buf[14..BODY_BYTES] == ping[14..BODY_BYTES]
            {
                return true;
            }
        }
        false
    }
}
