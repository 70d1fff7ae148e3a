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

use crate::link::Framed;
use parking_lot::Mutex;
use replica_proto::Message;
use std::collections::BTreeMap;
use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};

/// Time allowed for one witness exchange.
const WITNESS_TIMEOUT: Duration = Duration::from_millis(800);

/// The witness service.
pub struct WitnessServer {
    listener: TcpListener,
    state_file: PathBuf,
    holders: Arc<Mutex<BTreeMap<String, u8>>>,
}

impl WitnessServer {
    /// Binds the service; grants are kept in `state_file`.
    pub async fn bind(addr: SocketAddr, state_file: PathBuf) -> std::io::Result<WitnessServer> {
        let holders = match std::fs::read(&state_file) {
            Ok(b) => serde_json::from_slice(&b).map_err(std::io::Error::other)?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => BTreeMap::new(),
            Err(e) => return Err(e),
        };
        Ok(WitnessServer {
            listener: TcpListener::bind(addr).await?,
            state_file,
            holders: Arc::new(Mutex::new(holders)),
        })
    }

    /// The bound address.
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Serves until `stop` completes.
    pub async fn run(self, stop: impl std::future::Future<Output = ()>) {
        tokio::pin!(stop);
        loop {
            let (stream, from) = tokio::select! {
                r = self.listener.accept() => match r {
                    Ok(x) => x,
                    Err(e) => {
                        tracing::warn!("witness accept: {e}");
                        continue;
                    }
                },
                _ = &mut stop => return,
            };
            let holders = self.holders.clone();
            let file = self.state_file.clone();
            tokio::spawn(async move {
                if let Err(e) = serve(stream, holders, file).await {
                    tracing::debug!(%from, "witness connection: {e}");
                }
            });
        }
    }
}

fn persist(file: &std::path::Path, holders: &BTreeMap<String, u8>) -> std::io::Result<()> {
    let tmp = file.with_extension("new");
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(&serde_json::to_vec(holders).map_err(std::io::Error::other)?)?;
    f.sync_all()?;
    std::fs::rename(&tmp, file)
}

async fn serve(
    stream: TcpStream,
    holders: Arc<Mutex<BTreeMap<String, u8>>>,
    file: PathBuf,
) -> std::io::Result<()> {
    let mut f = Framed::new(stream);
    loop {
        let msg = f.recv().await?;
        let holder = {
            let mut h = holders.lock();
            let (cluster, node, claim) = match &msg {
                Message::WitnessClaim { cluster, node_id } => (cluster, *node_id, true),
                Message::WitnessRelease { cluster, node_id } => (cluster, *node_id, false),
                _ => {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::InvalidData,
                        "not a witness request",
                    ))
                }
            };
            let cur = h.get(cluster).copied().unwrap_or(0);
            let next = match (claim, cur) {
                (true, 0) => node,
                (false, c) if c == node => 0,
                (_, c) => c,
            };
            if next != cur {
                if next == 0 {
                    h.remove(cluster);
                } else {
                    h.insert(cluster.clone(), next);
                }
                persist(&file, &h)?;
                tracing::info!(cluster, holder = next, "witness grant changed");
            }
            next
        };
        f.send(&Message::WitnessAnswer { holder }).await?;
    }
}

/// Asks the witness; returns the holder after the request (0: none).
pub async fn ask(addr: SocketAddr, msg: Message) -> std::io::Result<u8> {
    let exchange = async {
        let mut f = Framed::new(TcpStream::connect(addr).await?);
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

    #[tokio::test]
    async fn one_holder_until_it_releases_and_restarts_remember() {
        let d = tempfile::tempdir().unwrap();
        let file = d.path().join("w.json");
        let w = WitnessServer::bind("127.0.0.1:0".parse().unwrap(), file.clone())
            .await
            .unwrap();
        let addr = w.local_addr().unwrap();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let t = tokio::spawn(w.run(async {
            let _ = rx.await;
        }));
        let claim = |n| Message::WitnessClaim {
            cluster: "c".into(),
            node_id: n,
        };
        assert_eq!(ask(addr, claim(2)).await.unwrap(), 2);
        assert_eq!(
            ask(addr, claim(1)).await.unwrap(),
            2,
            "second claimant refused"
        );
        assert_eq!(
            ask(addr, claim(2)).await.unwrap(),
            2,
            "holder may claim again"
        );
        let release = |n| Message::WitnessRelease {
            cluster: "c".into(),
            node_id: n,
        };
        assert_eq!(
            ask(addr, release(1)).await.unwrap(),
            2,
            "only the holder releases"
        );
        tx.send(()).unwrap();
        t.await.unwrap();
        // a restarted witness remembers the holder
        let w = WitnessServer::bind("127.0.0.1:0".parse().unwrap(), file)
            .await
            .unwrap();
        let addr = w.local_addr().unwrap();
        tokio::spawn(w.run(std::future::pending()));
        assert_eq!(ask(addr, claim(1)).await.unwrap(), 2);
        assert_eq!(ask(addr, release(2)).await.unwrap(), 0);
        assert_eq!(ask(addr, claim(1)).await.unwrap(), 1);
    }
}
