//! The witness: a tiny service on a third host that breaks ties when the two
//! nodes lose each other.
//!
//! Per replicated volume (named `cluster:volume`) it keeps one *survivor
//! grant*: a node that lost its partner
//! claims it and may go on alone only if the witness names it as holder. The
//! grant stays with its holder until the holder releases it, which it does only
//! once the pair is back in sync; so a node whose copy fell behind can never
//! obtain it, even if the holder dies later. Grants are persisted (a witness
//! restart must not forget who holds the newer data).
//!
//! Every request carries a number that rises with each request its node makes
//! for the grant; the witness refuses one not above the last it took from that
//! node. A request the node gave up on (its answer was late) may still reach
//! the witness after the node's next one: a release arriving after the same
//! node's later claim would otherwise drop a grant that node now serves by,
//! and the other node could take it too. The numbers are kept in memory only:
//! a restarted witness has no connection left that could deliver an old one.
//!
//! Trust: every connection is authenticated (`secure.rs`, purpose `witness`):
//! only node 1 or node 2 of the witness's cluster gets through, and a node may
//! claim or release a grant only for itself. Grant names are bounded in length
//! and number, idle connections time out, connections in their handshake are
//! bounded in total and per source (the busiest source's oldest gives way to a
//! newcomer: `block::admission`; authenticated ones are the nodes'), and the
//! state file is durable (file and folder fsynced).

use crate::link::Framed;
use crate::secure::{ClusterKeys, Member, Purpose};
use block::admission::{AdmissionBudget, AdmissionSlot};
use parking_lot::Mutex;
use replica_proto::Message;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::net::{TcpListener, TcpStream};

/// Time allowed for one witness exchange (handshake included).
const WITNESS_TIMEOUT: Duration = Duration::from_millis(2000);
/// A witness connection with no request for this long is closed.
const IDLE_TIMEOUT: Duration = Duration::from_secs(10);
/// Grants the witness keeps at most (one per replicated volume of its pair).
const GRANTS_MAX: usize = 4096;
/// Longest grant name (`cluster:volume`).
const GRANT_NAME_BYTES_MAX: usize = 512;
/// Witness connections in their handshake at once, in total and from one
/// address (past them, a newcomer takes the place of the oldest of the busiest
/// source: `block::admission`).
const CONNECTIONS_MAX: usize = 64;
const CONNECTIONS_PER_SOURCE_MAX: usize = 8;

/// The witness service.
pub struct WitnessServer {
    listener: TcpListener,
    state_file: PathBuf,
    grants: Arc<Mutex<Grants>>,
    keys: Arc<ClusterKeys>,
}

/// The witness's state: each grant's holder (persisted) and the last request
/// number taken from each node for each grant, with when (memory only).
#[derive(Default)]
struct Grants {
    holders: BTreeMap<String, u8>,
    seqs: BTreeMap<(String, u8), (u64, Instant)>,
}

/// Request numbers kept at most (two nodes per grant).
const SEQS_MAX: usize = 2 * GRANTS_MAX;
/// A request number older than this may be forgotten to make room: a request
/// the node gave up on is read from its connection long before (a connection
/// has 5 s for its handshake and 10 s between requests).
const SEQ_FORGET_AFTER: Duration = Duration::from_secs(60);

impl WitnessServer {
    /// Binds the service; grants are kept in `state_file`; `keys` are the
    /// witness's own of its cluster.
    pub async fn bind(
        addr: SocketAddr,
        state_file: PathBuf,
        keys: Arc<ClusterKeys>,
    ) -> std::io::Result<WitnessServer> {
        if keys.me() != Member::Witness {
            return Err(std::io::Error::other(format!(
                "the key file is {}'s, not the witness's",
                keys.me().name()
            )));
        }
        let holders = match std::fs::read(&state_file) {
            Ok(b) => serde_json::from_slice(&b).map_err(std::io::Error::other)?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => BTreeMap::new(),
            Err(e) => return Err(e),
        };
        Ok(WitnessServer {
            listener: TcpListener::bind(addr).await?,
            state_file,
            grants: Arc::new(Mutex::new(Grants {
                holders,
                seqs: BTreeMap::new(),
            })),
            keys,
        })
    }

    /// The bound address.
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Serves until `stop` completes.
    pub async fn run(self, stop: impl std::future::Future<Output = ()>) {
        tokio::pin!(stop);
        let open = AdmissionBudget::new(CONNECTIONS_PER_SOURCE_MAX, CONNECTIONS_MAX);
        // one line a second for connections that fail, with a count
        let refusals = Arc::new(block::admission::LogGate::new(Duration::from_secs(1)));
        let mut accept_errors = 0u32;
        loop {
            let (stream, from) = tokio::select! {
                r = self.listener.accept() => match r {
                    Ok(x) => x,
                    Err(e) => {
                        // out of descriptors and the like: back off, do not spin
                        accept_errors = (accept_errors + 1).min(8);
                        tracing::warn!("witness accept: {e}");
                        tokio::time::sleep(Duration::from_millis(10 << accept_errors)).await;
                        continue;
                    }
                },
                _ = &mut stop => return,
            };
            accept_errors = 0;
            let slot = open.admit(from.ip());
            let grants = self.grants.clone();
            let file = self.state_file.clone();
            let keys = self.keys.clone();
            let refusals = refusals.clone();
            tokio::spawn(async move {
                if let Err(e) = serve(stream, &keys, slot, grants, file).await {
                    if let Some(left_out) = refusals.allow() {
                        tracing::info!(%from, left_out, "witness connection: {e}");
                    }
                }
            });
        }
    }
}

fn persist(file: &std::path::Path, holders: &BTreeMap<String, u8>) -> std::io::Result<()> {
    block::durable::replace_file(
        file,
        &serde_json::to_vec(holders).map_err(std::io::Error::other)?,
    )
}

async fn serve(
    stream: TcpStream,
    keys: &ClusterKeys,
    slot: AdmissionSlot,
    grants: Arc<Mutex<Grants>>,
    file: PathBuf,
) -> std::io::Result<()> {
    let secure = tokio::select! {
        _ = slot.evicted() => return Err(std::io::Error::other(
            "evicted while in its handshake (too many at once)",
        )),
        s = crate::secure::accept(stream, keys, Purpose::Witness, &[Member::Node1, Member::Node2]) => s?,
    };
    // authenticated: a node of this cluster (its requests are bounded in time)
    drop(slot);
    let who = secure.peer.node_id();
    let mut f = Framed::new(secure);
    loop {
        let msg = match tokio::time::timeout(IDLE_TIMEOUT, f.recv()).await {
            Ok(Ok(m)) => m,
            Ok(Err(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
            Ok(Err(e)) => return Err(e),
            Err(_) => return Ok(()),
        };
        let holder = {
            let mut g = grants.lock();
            let (cluster, node, seq, claim) = match &msg {
                Message::WitnessClaim {
                    cluster,
                    node_id,
                    seq,
                } => (cluster, *node_id, *seq, true),
                Message::WitnessRelease {
                    cluster,
                    node_id,
                    seq,
                } => (cluster, *node_id, *seq, false),
                _ => {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::InvalidData,
                        "not a witness request",
                    ))
                }
            };
            if node != who {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::PermissionDenied,
                    format!("node {who} spoke for node {node}"),
                ));
            }
            let prefix = format!("{}:", keys.cluster());
            if !cluster.starts_with(&prefix) || cluster.len() > GRANT_NAME_BYTES_MAX {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::PermissionDenied,
                    format!("grant {cluster:?} is not of cluster {}", keys.cluster()),
                ));
            }
            if claim && !g.holders.contains_key(cluster) && g.holders.len() >= GRANTS_MAX {
                return Err(std::io::Error::other("the witness holds too many grants"));
            }
            let key = (cluster.clone(), node);
            match g.seqs.get(&key) {
                Some(&(last, _)) if seq <= last => {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::PermissionDenied,
                        format!(
                            "node {node}'s request {seq} for {cluster:?} is not above its last ({last}): an old one, refused"
                        ),
                    ))
                }
                None if g.seqs.len() >= SEQS_MAX => {
                    // (volumes come and go: every grant ever asked for left
                    // its numbers here)
                    g.seqs.retain(|_, (_, at)| at.elapsed() < SEQ_FORGET_AFTER);
                    if g.seqs.len() >= SEQS_MAX {
                        return Err(std::io::Error::other("the witness holds too many grants"));
                    }
                }
                _ => {}
            }
            g.seqs.insert(key, (seq, Instant::now()));
            let h = &mut g.holders;
            let cur = h.get(cluster).copied().unwrap_or(0);
            let next = match (claim, cur) {
                (true, 0) => node,
                (false, c) if c == node => 0,
                (_, c) => c,
            };
            if next != cur {
                // stored first, then held: a save that fails changes nothing,
                // so what is answered, held and remembered after a restart agree
                let mut new = h.clone();
                if next == 0 {
                    new.remove(cluster);
                } else {
                    new.insert(cluster.clone(), next);
                }
                persist(&file, &new)?;
                *h = new;
                tracing::info!(cluster, holder = next, "witness grant changed");
            }
            next
        };
        f.send(&Message::WitnessAnswer { holder }).await?;
    }
}

/// Asks the witness; returns the holder after the request (0: none).
pub async fn ask(addr: SocketAddr, keys: &ClusterKeys, msg: Message) -> std::io::Result<u8> {
    let exchange = async {
        let s = TcpStream::connect(addr).await?;
        let mut f =
            Framed::new(crate::secure::connect(s, keys, Member::Witness, Purpose::Witness).await?);
        f.send(&msg).await?;
        match f.recv().await? {
            Message::WitnessAnswer { holder } => Ok(holder),
            _ => Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "unexpected witness answer",
            )),
        }
    };
    tokio::time::timeout(WITNESS_TIMEOUT, exchange)
        .await
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::TimedOut))?
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn start(file: PathBuf, keys: &Arc<ClusterKeys>) -> SocketAddr {
        let w = WitnessServer::bind("127.0.0.1:0".parse().unwrap(), file, keys.clone())
            .await
            .unwrap();
        let addr = w.local_addr().unwrap();
        tokio::spawn(w.run(std::future::pending()));
        addr
    }

    /// Fresh keys of cluster `c`: node 1, node 2, the witness.
    fn cluster_keys() -> Vec<Arc<ClusterKeys>> {
        ClusterKeys::generate("c")
            .unwrap()
            .into_iter()
            .map(Arc::new)
            .collect()
    }

    /// Request numbers rising across the tests (each node's must rise).
    fn next() -> u64 {
        static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    }

    fn claim(n: u8) -> Message {
        Message::WitnessClaim {
            cluster: "c:v".into(),
            node_id: n,
            seq: next(),
        }
    }

    fn release(n: u8) -> Message {
        Message::WitnessRelease {
            cluster: "c:v".into(),
            node_id: n,
            seq: next(),
        }
    }

    #[tokio::test]
    async fn one_holder_until_it_releases_and_restarts_remember() {
        let d = tempfile::tempdir().unwrap();
        let file = d.path().join("w.json");
        let keys = cluster_keys();
        let (n1, n2) = (&keys[0], &keys[1]);
        let addr = start(file.clone(), &keys[2]).await;
        assert_eq!(ask(addr, n2, claim(2)).await.unwrap(), 2);
        assert_eq!(
            ask(addr, n1, claim(1)).await.unwrap(),
            2,
            "second claimant refused"
        );
        assert_eq!(
            ask(addr, n2, claim(2)).await.unwrap(),
            2,
            "holder may claim again"
        );
        assert_eq!(
            ask(addr, n1, release(1)).await.unwrap(),
            2,
            "only the holder releases"
        );
        // a restarted witness remembers the holder
        let addr = start(file, &keys[2]).await;
        assert_eq!(ask(addr, n1, claim(1)).await.unwrap(), 2);
        assert_eq!(ask(addr, n2, release(2)).await.unwrap(), 0);
        assert_eq!(ask(addr, n1, claim(1)).await.unwrap(), 1);
    }

    #[tokio::test]
    async fn a_request_older_than_the_nodes_last_is_refused() {
        let d = tempfile::tempdir().unwrap();
        let keys = cluster_keys();
        let (n1, n2) = (&keys[0], &keys[1]);
        let addr = start(d.path().join("w.json"), &keys[2]).await;
        // node 2 gave up on a release (late answer), then claimed: the
        // release, arriving now, must not drop the grant node 2 serves by
        let late = release(2);
        assert_eq!(ask(addr, n2, claim(2)).await.unwrap(), 2);
        assert!(ask(addr, n2, late.clone()).await.is_err());
        assert!(ask(addr, n2, late).await.is_err(), "the same number again");
        assert_eq!(ask(addr, n1, claim(1)).await.unwrap(), 2);
        // node 1's requests are numbered apart from node 2's: its older one
        // is refused after its newer one
        let (a, b) = (claim(1), claim(1));
        assert_eq!(ask(addr, n1, b).await.unwrap(), 2);
        assert!(ask(addr, n1, a).await.is_err());
        assert_eq!(ask(addr, n2, release(2)).await.unwrap(), 0);
    }

    #[tokio::test]
    async fn a_node_speaks_only_for_itself_and_strangers_not_at_all() {
        let d = tempfile::tempdir().unwrap();
        let file = d.path().join("w.json");
        let keys = cluster_keys();
        let addr = start(file.clone(), &keys[2]).await;
        assert_eq!(ask(addr, &keys[1], claim(2)).await.unwrap(), 2);
        // node 1 releasing node 2's grant in node 2's name: refused, unchanged
        assert!(ask(addr, &keys[0], release(2)).await.is_err());
        // node 1 claiming a grant of another cluster: refused
        let other = Message::WitnessClaim {
            cluster: "other:v".into(),
            node_id: 1,
            seq: next(),
        };
        assert!(ask(addr, &keys[0], other).await.is_err());
        // another cluster's node 2 (same cluster name, other keys): refused
        let strangers = cluster_keys();
        assert!(ask(addr, &strangers[1], release(2)).await.is_err());
        // a plain client with no keys at all gets nothing back
        {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            let mut s = TcpStream::connect(addr).await.unwrap();
            let mut b = bytes::BytesMut::new();
            replica_proto::encode(&release(2), &mut b);
            s.write_all(&b).await.unwrap();
            let mut got = Vec::new();
            let _ = tokio::time::timeout(Duration::from_secs(6), s.read_to_end(&mut got)).await;
            assert!(got.is_empty(), "answered a plain client: {got:?}");
        }
        // the grant is still node 2's, in memory and on disk
        assert_eq!(ask(addr, &keys[1], claim(2)).await.unwrap(), 2);
        let on_disk: BTreeMap<String, u8> =
            serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
        assert_eq!(on_disk.get("c:v"), Some(&2));
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(
            std::fs::metadata(&file).unwrap().permissions().mode() & 0o777,
            0o600
        );
    }
}
