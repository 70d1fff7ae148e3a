//! The sync listener of a node: accepts the partner's connections on the sync
//! addresses and hands each to the replicated volume its hello names.

use crate::link::Framed;
use crate::secure::{ClusterKeys, Member, Purpose};
use crate::volume::ConnectionSink;
use parking_lot::RwLock;
use replica_proto::Message;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;

/// Sync connections in their handshake at once, from everywhere (past it, a
/// newcomer takes the place of the oldest of the busiest source:
/// `block::admission`).
const HANDSHAKES_MAX: usize = 32;
/// Sync connections in their handshake at once from one address.
const HANDSHAKES_PER_SOURCE_MAX: usize = 4;

/// The replicated volumes a [`SyncListener`] hands connections to, by name;
/// volumes are added and removed while it runs (LUNs created at run time).
#[derive(Clone, Default)]
pub struct SyncSinks {
    map: Arc<RwLock<HashMap<String, ConnectionSink>>>,
}

impl SyncSinks {
    /// Routes connections naming `volume` to `sink` (replacing an earlier one).
    pub fn insert(&self, volume: &str, sink: ConnectionSink) {
        self.map.write().insert(volume.to_string(), sink);
    }

    /// Stops routing connections to `volume`.
    pub fn remove(&self, volume: &str) {
        self.map.write().remove(volume);
    }

    fn get(&self, volume: &str) -> Option<ConnectionSink> {
        self.map.read().get(volume).cloned()
    }
}

/// Accepts sync connections for every replicated volume of this node.
pub struct SyncListener {
    listeners: Vec<TcpListener>,
    sinks: SyncSinks,
    keys: Arc<ClusterKeys>,
}

impl SyncListener {
    /// Binds every sync address; `sinks` maps volume names to their volumes;
    /// only the partner holding its key of `keys`' cluster gets through.
    pub async fn bind(
        addrs: &[SocketAddr],
        sinks: SyncSinks,
        keys: Arc<ClusterKeys>,
    ) -> std::io::Result<SyncListener> {
        let mut listeners = Vec::new();
        for a in addrs {
            listeners.push(TcpListener::bind(a).await?);
        }
        Ok(SyncListener {
            listeners,
            sinks,
            keys,
        })
    }

    /// The bound addresses.
    pub fn local_addrs(&self) -> Vec<SocketAddr> {
        self.listeners
            .iter()
            .filter_map(|l| l.local_addr().ok())
            .collect()
    }

    /// Accepts connections until the tasks are dropped (runs in the background).
    pub fn spawn(self) {
        let partner = match self.keys.me() {
            Member::Node1 => Member::Node2,
            _ => Member::Node1,
        };
        let pending =
            block::admission::AdmissionBudget::new(HANDSHAKES_PER_SOURCE_MAX, HANDSHAKES_MAX);
        // one line a second for refused handshakes, with a count (a stranger
        // reconnecting in a loop wrote one each; review of 2026-12-06)
        let refusals = Arc::new(block::admission::LogGate::new(Duration::from_secs(1)));
        for l in self.listeners {
            let sinks = self.sinks.clone();
            let keys = self.keys.clone();
            let pending = pending.clone();
            let refusals = refusals.clone();
            tokio::spawn(async move {
                loop {
                    let (stream, from) = match l.accept().await {
                        Ok(x) => x,
                        Err(e) => {
                            tracing::warn!("sync accept: {e}");
                            tokio::time::sleep(Duration::from_millis(100)).await;
                            continue;
                        }
                    };
                    let slot = pending.admit(from.ip());
                    let sinks = sinks.clone();
                    let keys = keys.clone();
                    let refusals = refusals.clone();
                    tokio::spawn(async move {
                        let allowed = [partner];
                        let secure = tokio::select! {
                            _ = slot.evicted() => return,
                            s = crate::secure::accept(stream, &keys, Purpose::Sync, &allowed) => s,
                        };
                        let secure = match secure {
                            Ok(s) => s,
                            Err(e) => {
                                if let Some(left_out) = refusals.allow() {
                                    tracing::warn!(%from, left_out, "sync connection refused: {e}");
                                }
                                return;
                            }
                        };
                        // authenticated: the partner's (its hello is bounded in time)
                        drop(slot);
                        let mut f = Framed::new(secure);
                        let hello = match tokio::time::timeout(Duration::from_secs(5), f.recv())
                            .await
                        {
                            Ok(Ok(m @ Message::Hello { .. })) => m,
                            Ok(Ok(_)) => {
                                tracing::warn!(%from, "sync connection without a hello: closed");
                                return;
                            }
                            Ok(Err(e)) => {
                                tracing::warn!(%from, "sync connection: {e}");
                                return;
                            }
                            Err(_) => return,
                        };
                        let Message::Hello { volume, .. } = &hello else {
                            return;
                        };
                        match sinks.get(volume) {
                            Some(s) => s.deliver(f, hello).await,
                            None => {
                                tracing::warn!(%from, volume, "sync connection for an unknown volume: closed")
                            }
                        }
                    });
                }
            });
        }
    }
}
