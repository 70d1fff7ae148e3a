//! Admission of connections not yet authenticated, shared by the sync listener
//! and the witness: bounded in total and per source address, and when the
//! total is reached a newcomer takes the place of the oldest connection still
//! in its handshake from the source holding the most. Refusing newcomers
//! instead let a client with a few source addresses hold every slot with
//! connections that never finish their handshake (renewing each as it timed
//! out), and the partner or a node asking the witness never got in. Now such a
//! client must open connections faster than a real handshake completes (about
//! a round trip), from sources each holding no fewer than the real peer's.

use parking_lot::Mutex;
use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::Arc;
use tokio::task::AbortHandle;

/// The connections admitted and not yet let go.
pub(crate) struct Admission {
    total_max: usize,
    per_source_max: usize,
    state: Arc<Mutex<State>>,
}

#[derive(Default)]
struct State {
    next_id: u64,
    /// By admission order: source, and the task to abort if the connection
    /// is evicted (None once authenticated, or before its task is known).
    open: BTreeMap<u64, (IpAddr, Option<AbortHandle>)>,
    by_source: HashMap<IpAddr, usize>,
}

impl State {
    fn remove(&mut self, id: u64) -> Option<Option<AbortHandle>> {
        let (ip, task) = self.open.remove(&id)?;
        if let Some(n) = self.by_source.get_mut(&ip) {
            *n -= 1;
            if *n == 0 {
                self.by_source.remove(&ip);
            }
        }
        Some(task)
    }

    /// The oldest connection still in its handshake among those whose source
    /// holds the most, if that is more than `floor`.
    fn victim(&self, floor: usize) -> Option<u64> {
        let mut best: Option<(usize, u64)> = None;
        for (id, (ip, task)) in &self.open {
            if task.is_none() {
                continue;
            }
            let n = self.by_source.get(ip).copied().unwrap_or(0);
            if n > floor && best.is_none_or(|(m, _)| n > m) {
                best = Some((n, *id));
            }
        }
        best.map(|(_, id)| id)
    }
}

/// One admitted connection; its place is given back when dropped.
pub(crate) struct Ticket {
    id: u64,
    state: Arc<Mutex<State>>,
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.state.lock().remove(self.id);
    }
}

impl Ticket {
    /// Serves the connection on a task of its own, which is aborted if the
    /// connection is evicted before [`Ticket::authenticated`].
    pub fn spawn<F, Fut>(self, serve: F)
    where
        F: FnOnce(Ticket) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = ()> + Send + 'static,
    {
        // (the task gets its ticket once the ticket knows the task)
        let (go, admitted) = tokio::sync::oneshot::channel::<Ticket>();
        let task = tokio::spawn(async move {
            if let Ok(t) = admitted.await {
                serve(t).await
            }
        });
        self.serving(task.abort_handle());
        let _ = go.send(self);
    }

    /// The task serving the connection: aborted if the connection is evicted
    /// before [`Ticket::authenticated`].
    fn serving(&self, task: AbortHandle) {
        if let Some(e) = self.state.lock().open.get_mut(&self.id) {
            e.1 = Some(task);
        }
    }

    /// The peer proved who it is: never evicted from now on (it still counts).
    pub fn authenticated(&self) {
        if let Some(e) = self.state.lock().open.get_mut(&self.id) {
            e.1 = None;
        }
    }
}

impl Admission {
    pub fn new(total_max: usize, per_source_max: usize) -> Admission {
        Admission {
            total_max,
            per_source_max,
            state: Arc::default(),
        }
    }

    /// Admits a connection from `ip`: None if its source is at its bound, or
    /// if every place is taken by authenticated connections or by sources
    /// holding no more than this one would. Otherwise the oldest connection in
    /// its handshake from the source holding the most is aborted to make room.
    pub fn admit(&self, ip: IpAddr) -> Option<Ticket> {
        let (id, evicted) = {
            let mut s = self.state.lock();
            let mine = s.by_source.get(&ip).copied().unwrap_or(0);
            if mine >= self.per_source_max {
                return None;
            }
            let mut evicted = None;
            if s.open.len() >= self.total_max {
                // only from a source holding more than this one does now
                let victim = s.victim(mine)?;
                evicted = s.remove(victim).flatten();
            }
            let id = s.next_id;
            s.next_id += 1;
            s.open.insert(id, (ip, None));
            *s.by_source.entry(ip).or_insert(0) += 1;
            (id, evicted)
        };
        if let Some(task) = evicted {
            tracing::warn!(%ip, "connections in their handshake at the bound: the oldest from the busiest source was closed");
            task.abort();
        }
        Some(Ticket {
            id,
            state: self.state.clone(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(n: u8) -> IpAddr {
        IpAddr::from([127, 0, 0, n])
    }

    #[tokio::test]
    async fn a_newcomer_takes_the_place_of_the_oldest_handshake_of_the_busiest_source() {
        let a = Admission::new(4, 2);
        let pending = || tokio::spawn(std::future::pending::<()>());
        // two sources fill every place with handshakes that never end
        let mut held = Vec::new();
        for n in [2, 2, 3, 3] {
            let t = a.admit(ip(n)).unwrap();
            let task = pending();
            t.serving(task.abort_handle());
            held.push((t, task));
        }
        // a source at its bound is refused
        assert!(a.admit(ip(2)).is_none());
        // a newcomer evicts the oldest of the busiest (source 2's first)
        let newcomer = a.admit(ip(9)).unwrap();
        let (_, first) = &mut held[0];
        assert!(first.await.unwrap_err().is_cancelled());
        // the same newcomer again: source 3 now holds the most
        let again = a.admit(ip(9)).unwrap();
        assert!((&mut held[2].1).await.unwrap_err().is_cancelled());
        // a fresh source: sources 2 and 3 hold one each (source 9's two are
        // not in a handshake any task of theirs can be evicted from), so the
        // older of those goes
        let third = a.admit(ip(10)).unwrap();
        assert!((&mut held[1].1).await.unwrap_err().is_cancelled());
        assert!(!held[3].1.is_finished());
        // a fourth takes the last handshake's place; a fifth finds none
        let fourth = a.admit(ip(11)).unwrap();
        assert!((&mut held[3].1).await.unwrap_err().is_cancelled());
        assert!(a.admit(ip(12)).is_none(), "nothing left to evict");
        drop(fourth);
        drop((newcomer, again, third));
    }

    #[tokio::test]
    async fn authenticated_connections_are_never_evicted() {
        let a = Admission::new(2, 2);
        let t1 = a.admit(ip(2)).unwrap();
        let task = tokio::spawn(std::future::pending::<()>());
        t1.serving(task.abort_handle());
        t1.authenticated();
        let t2 = a.admit(ip(2)).unwrap();
        t2.authenticated();
        assert!(
            a.admit(ip(3)).is_none(),
            "full of authenticated connections"
        );
        assert!(!task.is_finished());
        drop(t1);
        assert!(a.admit(ip(3)).is_some(), "a place given back is free again");
        drop(t2);
        task.abort();
    }
}
