//! Heartbeats on every sync link at once, apart from the connection in use.
//!
//! The replication connection runs over one sync link at a time and keeps its
//! own lease (see `link.rs`). This monitor pings the partner over *each*
//! configured sync link with small UDP datagrams (a `Ping` frame of the
//! replication codec, answered by a `Pong`), so that a dead standby link is
//! seen before it is needed, the dialer picks a link that answers, and the
//! status shows every link's state and round-trip time.

use bytes::BytesMut;
use parking_lot::Mutex;
use replica_proto::{decode, encode, Message};
use serde::Serialize;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::net::UdpSocket;

/// Largest heartbeat datagram.
const DATAGRAM_BYTES_MAX: usize = 64;

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
    last_answer: Option<Instant>,
    rtt: Option<Duration>,
    sent: Vec<(u64, Instant)>,
}

/// Pings the partner on every sync link.
pub struct SyncLinkMonitor {
    slots: Mutex<Vec<Slot>>,
    peer_timeout: Duration,
}

impl SyncLinkMonitor {
    /// Binds a UDP socket on each local sync address (the port of the TCP sync
    /// listener) and pings the partner's address of the same link, link `i` of
    /// `local` pairing with link `i` of `peer`.
    pub async fn start(
        local: &[SocketAddr],
        peer: &[SocketAddr],
        interval: Duration,
        peer_timeout: Duration,
    ) -> std::io::Result<Arc<SyncLinkMonitor>> {
        let mut sockets = Vec::new();
        let mut slots = Vec::new();
        for (l, p) in local.iter().zip(peer) {
            let s = UdpSocket::bind(l).await?;
            slots.push(Slot {
                local: s.local_addr()?,
                peer: *p,
                last_answer: None,
                rtt: None,
                sent: Vec::new(),
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
    let mut seq = 0u64;
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(m) = m.upgrade() else { return };
        seq += 1;
        let peer = {
            let mut slots = m.slots.lock();
            let slot = &mut slots[i];
            slot.sent.push((seq, Instant::now()));
            if slot.sent.len() > 16 {
                slot.sent.remove(0);
            }
            slot.peer
        };
        let mut out = BytesMut::new();
        encode(&Message::Ping { seq }, &mut out);
        // an unreachable link is exactly what this measures: errors are expected
        let _ = s.send_to(&out, peer).await;
    }
}

async fn answer_and_listen(m: std::sync::Weak<SyncLinkMonitor>, i: usize, s: Arc<UdpSocket>) {
    let mut buf = [0u8; DATAGRAM_BYTES_MAX];
    loop {
        let Ok((n, from)) = s.recv_from(&mut buf).await else {
            // ICMP errors of unreachable peers surface here; go on listening
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let Some(m) = m.upgrade() else { return };
        let mut b = BytesMut::from(&buf[..n]);
        match decode(&mut b) {
            Ok(Some(Message::Ping { seq })) => {
                let mut out = BytesMut::new();
                encode(&Message::Pong { seq }, &mut out);
                let _ = s.send_to(&out, from).await;
            }
            Ok(Some(Message::Pong { seq })) => {
                let mut slots = m.slots.lock();
                let slot = &mut slots[i];
                if from != slot.peer {
                    continue;
                }
                if let Some(&(_, at)) = slot.sent.iter().find(|(q, _)| *q == seq) {
                    let now = Instant::now();
                    slot.rtt = Some(now.duration_since(at));
                    slot.last_answer = Some(now);
                }
            }
            _ => tracing::debug!(%from, "stray datagram on a sync heartbeat port"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn links_answering_are_up_and_silent_ones_down() {
        // node A has two links; node B answers on its first only
        let b1 = std::net::UdpSocket::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let dead = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let dead_addr = dead.local_addr().unwrap(); // bound, never answers
        let a = SyncLinkMonitor::start(
            &[
                "127.0.0.1:0".parse().unwrap(),
                "127.0.0.1:0".parse().unwrap(),
            ],
            &[b1, dead_addr],
            Duration::from_millis(20),
            Duration::from_millis(200),
        )
        .await
        .unwrap();
        let a_addr: SocketAddr = a.links()[0].local.parse().unwrap();
        let _b = SyncLinkMonitor::start(
            &[b1],
            &[a_addr],
            Duration::from_millis(20),
            Duration::from_millis(200),
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
}
