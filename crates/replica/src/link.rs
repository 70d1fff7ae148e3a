//! One sync connection to the partner: framed messages, requests matched to their
//! answers by id, and heartbeats that keep a lease.
//!
//! Lease: every `heartbeat_interval` a node sends a Ping and, when the Pong
//! comes back, may go on serving until *the Ping's send time* plus the peer
//! timeout. The partner may assume this node has stopped serving once the peer
//! timeout has passed since it *received* that Ping (which is later than its
//! sending), so the two views never overlap: a node that goes on alone starts
//! only after the other's lease has run out. Pings and Pongs have a queue of
//! their own, which the writer empties before the data queue: a lease does not
//! lapse behind a full queue of writes or resync copies (a resync source, like
//! any leader, serves only with its lease).

use crate::secure::{SecureReader, SecureStream, SecureWriter};
use bytes::{Bytes, BytesMut};
use parking_lot::Mutex;
use replica_proto::{decode, encode, Message, OpResult};
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, oneshot, watch};

/// Messages queued for the writer at most.
const OUT_QUEUE_MESSAGES_MAX: usize = 256;
/// Heartbeat messages queued for the writer at most (sent first).
const BEATS_QUEUED_MAX: usize = 16;
/// Requests this node has in flight to the partner at most; the partner
/// refuses a peer with more than [`HANDLED_IN_FLIGHT_MAX`], which is larger, so
/// an honest node never reaches it.
pub(crate) const REQUESTS_IN_FLIGHT_MAX: usize = 2048;
/// The partner's requests this node handles at once at most; a partner that
/// sends more is dropped (it does not keep the bound above).
pub(crate) const HANDLED_IN_FLIGHT_MAX: usize = 4096;
/// The link went down before the answer came.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LinkLost;

/// A framed stream used during the handshake, before the link's tasks start:
/// replication messages over an authenticated channel (`secure.rs`).
pub(crate) struct Framed {
    pub stream: SecureStream,
    pub buf: BytesMut,
}

impl Framed {
    pub fn new(stream: SecureStream) -> Framed {
        Framed {
            stream,
            buf: BytesMut::with_capacity(64 << 10),
        }
    }

    /// Reads the next message; an error or EOF ends the connection.
    pub async fn recv(&mut self) -> std::io::Result<Message> {
        loop {
            match decode(&mut self.buf) {
                Ok(Some(m)) => return Ok(m),
                Ok(None) => {}
                Err(e) => {
                    return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, e));
                }
            }
            if self.stream.reader.read_buf(&mut self.buf).await? == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
        }
    }

    /// Sends one message.
    pub async fn send(&mut self, m: &Message) -> std::io::Result<()> {
        let mut out = BytesMut::new();
        encode(m, &mut out);
        self.stream.writer.write_all(&out).await
    }
}

/// The answer to a request: `Done` for block operations, `ScsiReply` for SCSI requests.
enum Answer {
    Op(OpResult),
    Scsi(Bytes),
    Data(Bytes),
}

struct Pending {
    waiting: HashMap<u64, oneshot::Sender<Answer>>,
    closed: bool,
}

struct Heartbeat {
    /// Pings sent and not yet answered: (seq, send time).
    sent: VecDeque<(u64, Instant)>,
    next_seq: u64,
    /// This node may serve until then (as far as this link is concerned).
    lease_until: Instant,
    /// Last time any message came from the partner.
    last_recv: Instant,
    /// Last time a Ping came from the partner.
    last_ping_recv: Instant,
}

/// A live connection to the partner.
pub(crate) struct Link {
    out: mpsc::Sender<Message>,
    /// Heartbeats (Ping, Pong), which the writer sends before anything queued
    /// on `out`: a lease never lapses behind a full data queue.
    beats: mpsc::Sender<Message>,
    /// Permits for requests in flight to the partner.
    requests: tokio::sync::Semaphore,
    pending: Mutex<Pending>,
    next_id: AtomicU64,
    hb: Mutex<Heartbeat>,
    closed_tx: watch::Sender<bool>,
    /// Why the partner detached its copy, if it said so before the link closed.
    detached: Mutex<Option<String>>,
    /// Set by a [`Message::Refused`] from the partner.
    refused: Mutex<Option<String>>,
    /// What this node must tell the partner before the link goes, however
    /// it goes (see [`Link::say_last`]); taken once sent.
    last_words: Mutex<Option<Message>>,
    /// The partner's address (for status and logs).
    pub peer: String,
    peer_timeout: Duration,
}

impl Link {
    /// Starts the link's reader, writer and heartbeat tasks over a stream that
    /// finished its handshake. Requests from the partner go to `incoming`.
    /// The first lease counts from `hello_sent`, when this node sent the
    /// first frame of its handshake: the partner, which counts this node's
    /// lease from when its own link starts, started it only after it read
    /// that frame. Counted from this link's start, the lease outlasted what
    /// the partner waits out by the handshake's last step (review of
    /// 2026-12-06).
    pub fn start(
        framed: Framed,
        incoming: mpsc::Sender<Message>,
        heartbeat_interval: Duration,
        peer_timeout: Duration,
        hello_sent: Instant,
    ) -> Arc<Link> {
        let peer = framed.stream.peer_addr.to_string();
        let (rd, wr) = (framed.stream.reader, framed.stream.writer);
        let (out_tx, out_rx) = mpsc::channel(OUT_QUEUE_MESSAGES_MAX);
        let (beats_tx, beats_rx) = mpsc::channel(BEATS_QUEUED_MAX);
        let now = Instant::now();
        let (closed_tx, _) = watch::channel(false);
        let link = Arc::new(Link {
            out: out_tx,
            beats: beats_tx,
            requests: tokio::sync::Semaphore::new(REQUESTS_IN_FLIGHT_MAX),
            pending: Mutex::new(Pending {
                waiting: HashMap::new(),
                closed: false,
            }),
            next_id: AtomicU64::new(1),
            hb: Mutex::new(Heartbeat {
                sent: VecDeque::new(),
                next_seq: 1,
                lease_until: hello_sent + peer_timeout,
                last_recv: now,
                last_ping_recv: now,
            }),
            closed_tx,
            detached: Mutex::new(None),
            refused: Mutex::new(None),
            last_words: Mutex::new(None),
            peer,
            peer_timeout,
        });
        tokio::spawn(reader(link.clone(), rd, framed.buf, incoming));
        tokio::spawn(writer(link.clone(), wr, out_rx, beats_rx));
        tokio::spawn(heartbeat(link.clone(), heartbeat_interval));
        link
    }

    /// Why the partner detached its copy (a [`Message::Detach`] came before the
    /// link closed); then this node may go on alone without a tie-break.
    pub fn partner_detached(&self) -> Option<String> {
        self.detached.lock().clone()
    }

    /// Why the partner refused to join the copies (a [`Message::Refused`]
    /// came before the link closed).
    pub fn partner_refused(&self) -> Option<String> {
        self.refused.lock().clone()
    }

    /// Sends a request built from a fresh id and waits for its answer. A partner
    /// that keeps answering heartbeats but leaves a request unanswered for four
    /// peer timeouts (a hung disk) is dropped like a dead one: the link closes.
    pub async fn request(&self, make: impl FnOnce(u64) -> Message) -> Result<OpResult, LinkLost> {
        match self.exchange(make).await? {
            Answer::Op(r) => Ok(r),
            Answer::Scsi(_) | Answer::Data(_) => Err(self.violation()),
        }
    }

    /// [`Link::request`] for a request whose work may take long on a healthy
    /// partner (a grow: a pool zeroes its new stripes first), waited for up
    /// to `patience` instead of four peer timeouts. A partner that stops
    /// answering heartbeats still closes the link at once.
    pub async fn request_slow(
        &self,
        patience: Duration,
        make: impl FnOnce(u64) -> Message,
    ) -> Result<OpResult, LinkLost> {
        match self.exchange_within(patience, make).await? {
            Answer::Op(r) => Ok(r),
            Answer::Scsi(_) | Answer::Data(_) => Err(self.violation()),
        }
    }

    /// Asks the partner for blocks of its copy ([`Message::ReadCopy`]):
    /// `Ok(Ok(data))`, or `Ok(Err(result))` with the error it answered. An
    /// answer that is not `blocks` blocks of `block_bytes` breaks the
    /// protocol: the link closes.
    pub async fn read_copy(
        &self,
        lba: u64,
        blocks: u64,
        block_bytes: u64,
    ) -> Result<Result<Bytes, OpResult>, LinkLost> {
        match self
            .exchange(|id| Message::ReadCopy { id, lba, blocks })
            .await?
        {
            Answer::Data(b) if b.len() as u64 == blocks.saturating_mul(block_bytes) => Ok(Ok(b)),
            Answer::Data(b) => {
                self.close(&format!(
                    "the partner answered a read of {blocks} blocks with {} bytes",
                    b.len()
                ));
                Err(LinkLost)
            }
            Answer::Op(r) => Ok(Err(r)),
            Answer::Scsi(_) => Err(self.violation()),
        }
    }

    /// Sends an opaque SCSI request and waits for the partner's reply (with the
    /// same patience as [`Link::request`]).
    pub async fn request_scsi(&self, data: Bytes) -> Result<Bytes, LinkLost> {
        match self
            .exchange(|id| Message::ScsiRequest { id, data })
            .await?
        {
            Answer::Scsi(b) => Ok(b),
            Answer::Op(_) | Answer::Data(_) => Err(self.violation()),
        }
    }

    fn violation(&self) -> LinkLost {
        self.close("the partner answered a request with the wrong kind of reply");
        LinkLost
    }

    async fn exchange(&self, make: impl FnOnce(u64) -> Message) -> Result<Answer, LinkLost> {
        self.exchange_within(self.request_patience(), make).await
    }

    /// How long [`Link::request`] waits for an answer: four peer timeouts.
    pub fn request_patience(&self) -> Duration {
        self.peer_timeout * 4
    }

    async fn exchange_within(
        &self,
        patience: Duration,
        make: impl FnOnce(u64) -> Message,
    ) -> Result<Answer, LinkLost> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        let sent_and_answered = async {
            // answers never need a permit, so waiting here cannot deadlock
            let _permit = self.requests.acquire().await.map_err(|_| LinkLost)?;
            {
                let mut p = self.pending.lock();
                if p.closed {
                    return Err(LinkLost);
                }
                p.waiting.insert(id, tx);
            }
            if self.out.send(make(id)).await.is_err() {
                self.pending.lock().waiting.remove(&id);
                return Err(LinkLost);
            }
            rx.await.map_err(|_| LinkLost)
        };
        match tokio::time::timeout(patience, sent_and_answered).await {
            Ok(r) => r,
            Err(_) => {
                self.close("the partner left a request unanswered too long");
                Err(LinkLost)
            }
        }
    }

    /// Makes `m` the last thing written on the link: queued with
    /// [`Link::send`] as well, it goes in its turn, and if the link is closed
    /// first (by this node's other tasks, which may close it at once as they
    /// see the role this message announces), the writer still writes it
    /// before it shuts the connection. For [`Message::Detach`], set before the
    /// role changes: a partner that never read it took the link's end for a
    /// lost partner, waited out the lease, and without a witness stayed down
    /// if it was not the preferred node (review of 2026-12-06).
    pub fn say_last(&self, m: Message) {
        *self.last_words.lock() = Some(m);
    }

    /// Sends a message that expects no answer (or answers a request).
    pub async fn send(&self, m: Message) -> Result<(), LinkLost> {
        self.out.send(m).await.map_err(|_| LinkLost)
    }

    /// Whether this node's lease from the partner is still valid.
    pub fn lease_valid(&self) -> bool {
        Instant::now() < self.hb.lock().lease_until
    }

    /// When the partner last sent a Ping (its lease on this node ends at most
    /// `peer_timeout` later).
    pub fn last_ping_recv(&self) -> Instant {
        self.hb.lock().last_ping_recv
    }

    /// Closes the link: every request waiting fails with [`LinkLost`].
    pub fn close(&self, why: &str) {
        let waiting = {
            let mut p = self.pending.lock();
            if p.closed {
                return;
            }
            p.closed = true;
            std::mem::take(&mut p.waiting)
        };
        drop(waiting);
        tracing::warn!(peer = %self.peer, why, "sync link closed");
        self.closed_tx.send_replace(true);
    }

    /// Whether the link is closed now.
    pub fn is_closed_now(&self) -> bool {
        self.pending.lock().closed
    }

    /// Waits until the link is closed.
    pub async fn closed(&self) {
        let mut rx = self.closed_tx.subscribe();
        let _ = rx.wait_for(|c| *c).await;
    }
}

async fn reader(
    link: Arc<Link>,
    mut rd: SecureReader,
    mut buf: BytesMut,
    incoming: mpsc::Sender<Message>,
) {
    let why = loop {
        let msg = match decode(&mut buf) {
            Ok(Some(m)) => m,
            Ok(None) => {
                tokio::select! {
                    r = rd.read_buf(&mut buf) => match r {
                        Ok(0) => break "partner closed the connection".to_string(),
                        Ok(_) => continue,
                        Err(e) => break format!("read: {e}"),
                    },
                    _ = link.closed() => return,
                }
            }
            Err(e) => break format!("bad frame from the partner: {e}"),
        };
        let now = Instant::now();
        link.hb.lock().last_recv = now;
        match msg {
            Message::Done { id, result } => {
                if let Some(tx) = link.pending.lock().waiting.remove(&id) {
                    let _ = tx.send(Answer::Op(result));
                }
            }
            Message::ScsiReply { id, data } => {
                if let Some(tx) = link.pending.lock().waiting.remove(&id) {
                    let _ = tx.send(Answer::Scsi(data));
                }
            }
            Message::CopyData { id, data } => {
                if let Some(tx) = link.pending.lock().waiting.remove(&id) {
                    let _ = tx.send(Answer::Data(data));
                }
            }
            Message::Detach { reason } => {
                // recorded before the link closes, so whoever sees it closed knows
                let reason = shown(&reason);
                *link.detached.lock() = Some(reason.clone());
                break format!("the partner detached its failed copy: {reason}");
            }
            Message::Refused { reason } => {
                let reason = shown(&reason);
                *link.refused.lock() = Some(reason.clone());
                break format!("the partner refused to join the copies: {reason}");
            }
            Message::Ping { seq } => {
                link.hb.lock().last_ping_recv = now;
                // ahead of the data queued for the partner; a full heartbeat
                // queue drops it (the partner's lease is shortened, no more)
                if let Err(mpsc::error::TrySendError::Closed(_)) =
                    link.beats.try_send(Message::Pong { seq })
                {
                    break "writer gone".into();
                }
            }
            Message::Pong { seq } => {
                let mut hb = link.hb.lock();
                while let Some(&(s, at)) = hb.sent.front() {
                    if s > seq {
                        break;
                    }
                    hb.sent.pop_front();
                    if s == seq {
                        let until = at + link.peer_timeout;
                        if until > hb.lease_until {
                            hb.lease_until = until;
                        }
                    }
                }
            }
            other => {
                if incoming.send(other).await.is_err() {
                    break "volume gone".into();
                }
            }
        }
    };
    link.close(&why);
}

async fn writer(
    link: Arc<Link>,
    mut wr: SecureWriter,
    mut rx: mpsc::Receiver<Message>,
    mut beats: mpsc::Receiver<Message>,
) {
    let mut out = BytesMut::with_capacity(256 << 10);
    loop {
        let first = tokio::select! {
            biased;
            m = beats.recv() => m,
            m = rx.recv() => m,
            _ = link.closed() => None,
        };
        let Some(first) = first else { break };
        let queue = |m: &Message, out: &mut BytesMut| {
            if matches!(m, Message::Detach { .. }) {
                // (sent in its turn: not again at the end)
                link.last_words.lock().take();
            }
            encode(m, out);
        };
        queue(&first, &mut out);
        while let Ok(m) = beats.try_recv() {
            encode(&m, &mut out);
        }
        while out.len() < (1 << 20) {
            match rx.try_recv() {
                Ok(m) => queue(&m, &mut out),
                Err(_) => break,
            }
        }
        // A partner gone silent without closing the connection (its power
        // lost, a path dropping packets) stops draining it: once the socket's
        // buffers are full, this write waits until the kernel gives up on the
        // connection (about 15 minutes). Meanwhile the queue behind it fills,
        // and the handlers of the partner's requests wait to queue their
        // answers, so the session's end waits for them and the node decides
        // nothing. Once the link is closed, a write gets the peer timeout at
        // most; then the connection is dropped, and with this task the queue:
        // every send waiting on it fails at once (review of 2026-12-06).
        let written = {
            let write = wr.write_all(&out);
            tokio::pin!(write);
            tokio::select! {
                r = &mut write => r,
                _ = link.closed() => {
                    match tokio::time::timeout(link.peer_timeout, &mut write).await {
                        Ok(r) => r,
                        Err(_) => return,
                    }
                }
            }
        };
        if let Err(e) = written {
            link.close(&format!("write: {e}"));
            break;
        }
        out.clear();
    }
    // closed (not broken): what this node had to say last goes out first
    let last = link.last_words.lock().take();
    if let Some(m) = last {
        // (alone: after a failed write, `out` still holds its batch)
        out.clear();
        encode(&m, &mut out);
        let _ = tokio::time::timeout(link.peer_timeout, wr.write_all(&out)).await;
    }
    let _ = tokio::time::timeout(link.peer_timeout, wr.shutdown()).await;
}

async fn heartbeat(link: Arc<Link>, interval: Duration) {
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = link.closed() => return,
        }
        let now = Instant::now();
        let seq = {
            let mut hb = link.hb.lock();
            if now.duration_since(hb.last_recv) > link.peer_timeout {
                drop(hb);
                link.close("partner silent for longer than the peer timeout");
                return;
            }
            let seq = hb.next_seq;
            hb.next_seq += 1;
            hb.sent.push_back((seq, now));
            if hb.sent.len() > 64 {
                hb.sent.pop_front();
            }
            seq
        };
        // never wait behind a full queue: a missed ping only shortens the lease
        if link.beats.try_send(Message::Ping { seq }).is_err() && link.beats.is_closed() {
            return;
        }
    }
}

/// A reason the partner sent, as this node shows it (status, log, events):
/// without control characters, which would rewrite a terminal or split a log
/// line.
pub(crate) fn shown(reason: &str) -> String {
    reason.chars().filter(|c| !c.is_control()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::secure::{self, ClusterKeys, Member, Purpose};
    use tokio::net::TcpSocket;

    /// Two ends of an authenticated sync connection (node 1's, node 2's).
    async fn pair() -> (SecureStream, SecureStream) {
        pair_buffered(None).await
    }

    /// [`pair`], with the kernel's buffers for node 1's sending and node 2's
    /// receiving fixed at `bytes` if given (not grown as the connection goes).
    async fn pair_buffered(bytes: Option<u32>) -> (SecureStream, SecureStream) {
        let mut keys = ClusterKeys::generate("t").unwrap();
        let ls = TcpSocket::new_v4().unwrap();
        if let Some(b) = bytes {
            ls.set_recv_buffer_size(b).unwrap();
        }
        ls.bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let l = ls.listen(8).unwrap();
        let addr = l.local_addr().unwrap();
        let k2 = keys.remove(1);
        let acc = tokio::spawn(async move {
            let (s, _) = l.accept().await.unwrap();
            secure::accept(s, &k2, Purpose::Sync, &[Member::Node1])
                .await
                .unwrap()
        });
        let cs = TcpSocket::new_v4().unwrap();
        if let Some(b) = bytes {
            cs.set_send_buffer_size(b).unwrap();
        }
        let s = cs.connect(addr).await.unwrap();
        let a = secure::connect(s, &keys[0], Member::Node2, Purpose::Sync)
            .await
            .unwrap();
        (a, acc.await.unwrap())
    }

    /// A link over `a` (heartbeats every 50 ms, peer timeout 2 s), the
    /// partner's requests dropped.
    fn started(a: SecureStream) -> Arc<Link> {
        let (tx, _rx) = mpsc::channel(8);
        Link::start(
            Framed::new(a),
            tx,
            Duration::from_millis(50),
            Duration::from_secs(2),
            Instant::now(),
        )
    }

    /// A link closed before any of its tasks (or the session) waits on it
    /// reads as closed to whoever waits later. Before (found 2026-12-06), the
    /// close was sent to no receiver and so not kept: the writer and the
    /// session waited forever, and a later close (the heartbeat's) returned
    /// early as already closed, leaving the node's session loop stuck.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_link_closed_at_once_reads_as_closed_to_later_waiters() {
        let (a, _b) = pair().await;
        let link = started(a);
        link.close("at once");
        tokio::time::timeout(Duration::from_secs(10), link.closed())
            .await
            .expect("the closed link never read as closed");
    }

    /// A Detach said last reaches the partner even when another task closes
    /// the link before it is queued (the detach sets the role first, and a
    /// message of the partner handled meanwhile closes the link as not
    /// fitting it). Before (review of 2026-12-06), the writer dropped
    /// everything at the close, and the partner saw a lost link.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn what_is_said_last_reaches_the_partner_whoever_closes_the_link() {
        let (a, b) = pair().await;
        let link = started(a);
        link.say_last(Message::Detach {
            reason: "disk".into(),
        });
        link.close("a message that did not fit the role");
        let mut f = Framed::new(b);
        let got = tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                match f.recv().await {
                    Ok(Message::Detach { reason }) => return Some(reason),
                    Ok(_) => continue,
                    Err(_) => return None,
                }
            }
        })
        .await
        .expect("the link neither said it nor closed");
        assert_eq!(got.as_deref(), Some("disk"));
    }

    /// Heartbeats go out ahead of a full data queue, and renew the lease
    /// while it stays full. The partner reads nothing (and the socket
    /// buffers are small), so the writer gets stuck in a write while the
    /// data queue holds its 256 resync copies; then the partner Pings, and
    /// this node Pings too. When the partner reads, the Pong and the Ping
    /// both come before every copy queued before them, and the Pong the
    /// partner sends back renews the lease from that Ping. With one queue
    /// for all, the heartbeats were dropped for the full queue, or waited
    /// behind it if the writer took the data first.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn heartbeats_go_out_ahead_of_a_full_data_queue() {
        const INTERVAL: Duration = Duration::from_millis(250);
        const PEER_TIMEOUT: Duration = Duration::from_secs(60);
        let (a, b) = pair_buffered(Some(64 << 10)).await;
        let (tx, mut incoming) = mpsc::channel(8);
        let link = Link::start(Framed::new(a), tx, INTERVAL, PEER_TIMEOUT, Instant::now());
        let mut f = Framed::new(b);
        let copy = Bytes::from(vec![0x5a; 32 << 10]);
        // The partner's request, which the link passes on to `incoming`: seen
        // there, the link's reader has handled all the partner sent before.
        async fn handled(f: &mut Framed, incoming: &mut mpsc::Receiver<Message>, id: u64) {
            let marker = Message::ScsiRequest {
                id,
                data: Bytes::new(),
            };
            f.send(&marker).await.unwrap();
            match tokio::time::timeout(Duration::from_secs(10), incoming.recv()).await {
                Ok(Some(Message::ScsiRequest { id: got, .. })) if got == id => {}
                other => panic!("the link's reader did not pass on marker {id}: {other:?}"),
            }
        }

        // Fill the data queue; the partner Pings; then this node Pings. If
        // the writer took no copy meanwhile (over a heartbeat interval at
        // least: the queue is still full, and only this test fills it), it
        // was stuck writing all along, and both heartbeats were queued behind
        // the 256 copies, with nothing taken for its next write yet; if it
        // took some, again.
        let mut next_copy = 0u64;
        let mut attempt = 0;
        let (pong_seq, ping_seq, ping_sent_at) = loop {
            attempt += 1;
            assert!(attempt <= 40, "the writer never got stuck");
            loop {
                let m = Message::ResyncData {
                    id: next_copy,
                    lba: 0,
                    data: copy.clone(),
                };
                match link.out.try_send(m) {
                    Ok(()) => next_copy += 1,
                    Err(mpsc::error::TrySendError::Full(_)) => break,
                    Err(e) => panic!("the data queue closed: {e}"),
                }
            }
            let pong_seq = 1_000_000 + attempt;
            f.send(&Message::Ping { seq: pong_seq }).await.unwrap();
            handled(&mut f, &mut incoming, pong_seq).await;
            // Ping `n` has been queued (or dropped) once the next is numbered
            let n = link.hb.lock().next_seq;
            let sent_at = tokio::time::timeout(Duration::from_secs(10), async {
                loop {
                    {
                        let hb = link.hb.lock();
                        if hb.next_seq > n + 1 {
                            let sent = hb.sent.iter().find(|(s, _)| *s == n);
                            break sent.expect("Ping n forgotten").1;
                        }
                    }
                    tokio::time::sleep(INTERVAL / 5).await;
                }
            })
            .await
            .expect("no Ping made within 10 s");
            if link.out.capacity() == 0 {
                break (pong_seq, n, sent_at);
            }
        };
        assert!(
            link.beats.capacity() > 0,
            "test setup: the heartbeat queue filled up (too slow a machine for the interval)"
        );
        let last_copy = next_copy - 1;
        let first_queued = next_copy - OUT_QUEUE_MESSAGES_MAX as u64;

        // The partner reads now, and answers this node's Ping. For each
        // heartbeat: the last copy read before it (None: none).
        let mut pong_after: Option<Option<u64>> = None;
        let mut ping_after: Option<Option<u64>> = None;
        let mut copy_read: Option<u64> = None;
        tokio::time::timeout(Duration::from_secs(60), async {
            loop {
                match f.recv().await.unwrap() {
                    Message::ResyncData { id, .. } => {
                        copy_read = Some(id);
                        if id == last_copy {
                            break;
                        }
                    }
                    Message::Pong { seq } if seq == pong_seq => pong_after = Some(copy_read),
                    Message::Ping { seq } if seq == ping_seq => {
                        ping_after = Some(copy_read);
                        f.send(&Message::Pong { seq }).await.unwrap();
                    }
                    _ => {}
                }
            }
        })
        .await
        .expect("the partner did not read the copies within 60 s");
        let said = |after: Option<Option<u64>>| match after {
            None => format!("was not read before the last copy, {last_copy}"),
            Some(None) => "was read before any copy".into(),
            Some(Some(c)) => format!("was read after copy {c}"),
        };
        let ahead = |after: Option<Option<u64>>| match after {
            Some(Some(c)) => c < first_queued,
            Some(None) => true,
            None => false,
        };
        let mut late = Vec::new();
        if !ahead(pong_after) {
            late.push(format!(
                "the Pong to the partner's Ping {pong_seq} {}",
                said(pong_after)
            ));
        }
        if !ahead(ping_after) {
            late.push(format!("this node's Ping {ping_seq} {}", said(ping_after)));
        }
        assert!(
            late.is_empty(),
            "copies {first_queued}..={last_copy} were queued before the heartbeats, but {}",
            late.join("; ")
        );
        // the partner's answer to that Ping renews the lease from its sending
        handled(&mut f, &mut incoming, 1).await;
        assert_eq!(
            link.hb.lock().lease_until,
            ping_sent_at + PEER_TIMEOUT,
            "the Pong to Ping {ping_seq} did not renew the lease from that Ping's sending"
        );
        assert!(link.lease_valid() && !link.is_closed_now());
    }
}
