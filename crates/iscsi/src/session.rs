//! Sessions: the state a connection's tasks share, and the server-wide registry
//! (TSIH allocation, reinstatement, cross-session aborts for resets).

use crate::writer::Window;
use parking_lot::Mutex;
use scsi::{ItNexus, ScsiTarget};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{watch, Notify};
use tokio::task::AbortHandle;

/// Identity of a session for reinstatement: initiator name, ISID, target, TPGT.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct SessionKey {
    pub initiator: String,
    pub isid: [u8; 6],
    pub target: usize,
    pub tpgt: u16,
}

/// A command executing in the SCSI layer.
pub(crate) struct Running {
    pub lun: u64,
    pub serial: u64,
    pub abort: AbortHandle,
}

/// What the tasks of one session share.
pub(crate) struct Session {
    pub tsih: u16,
    pub key: Option<SessionKey>,
    /// Index of the target (normal sessions).
    pub target: Option<usize>,
    pub scsi: Option<Arc<ScsiTarget>>,
    pub nexus: Option<ItNexus>,
    pub window: Arc<Window>,
    pub running: Mutex<HashMap<u32, Running>>,
    pub task_done: Notify,
    serial: AtomicU64,
    /// Set to true to make the session close (reinstatement, shutdown, cold reset).
    pub kill: watch::Sender<bool>,
    /// Becomes true once the session has fully ended.
    pub ended: watch::Sender<bool>,
}

impl Session {
    pub(crate) fn new(
        tsih: u16,
        key: Option<SessionKey>,
        target: Option<usize>,
        scsi: Option<Arc<ScsiTarget>>,
        nexus: Option<ItNexus>,
        window: Arc<Window>,
    ) -> Self {
        Session {
            tsih,
            key,
            target,
            scsi,
            nexus,
            window,
            running: Mutex::new(HashMap::new()),
            task_done: Notify::new(),
            serial: AtomicU64::new(1),
            kill: watch::channel(false).0,
            ended: watch::channel(false).0,
        }
    }

    pub(crate) fn next_serial(&self) -> u64 {
        self.serial.fetch_add(1, Ordering::Relaxed)
    }

    /// Removes a finished command (only the entry it created).
    pub(crate) fn finish(&self, itt: u32, serial: u64) {
        let mut r = self.running.lock();
        if r.get(&itt).is_some_and(|e| e.serial == serial) {
            r.remove(&itt);
        }
        drop(r);
        self.task_done.notify_waiters();
    }

    /// Aborts running commands matching `pred` (on their LUN); returns their tags.
    pub(crate) fn abort_where(&self, pred: impl Fn(u64) -> bool) -> Vec<u32> {
        let r = self.running.lock();
        let mut itts = Vec::new();
        for (itt, t) in r.iter() {
            if pred(t.lun) {
                t.abort.abort();
                itts.push(*itt);
            }
        }
        itts
    }

    /// Aborts the running command `itt`; false if it is not running.
    pub(crate) fn abort_where_itt(&self, itt: u32) -> bool {
        match self.running.lock().get(&itt) {
            Some(t) => {
                t.abort.abort();
                true
            }
            None => false,
        }
    }

    /// Waits until none of `itts` is running any more (or the timeout passes).
    pub(crate) async fn wait_gone(&self, itts: &[u32], timeout: Duration) {
        let wait = async {
            loop {
                let notified = self.task_done.notified();
                tokio::pin!(notified);
                notified.as_mut().enable();
                {
                    let r = self.running.lock();
                    if itts.iter().all(|i| !r.contains_key(i)) {
                        return;
                    }
                }
                notified.await;
            }
        };
        let _ = tokio::time::timeout(timeout, wait).await;
    }

    /// Waits until no command is running (or the timeout passes).
    pub(crate) async fn drain(&self, timeout: Duration) {
        let itts: Vec<u32> = self.running.lock().keys().copied().collect();
        self.wait_gone(&itts, timeout).await;
    }
}

/// Every session of the server.
#[derive(Default)]
pub(crate) struct Registry {
    inner: Mutex<RegInner>,
}

#[derive(Default)]
struct RegInner {
    next_tsih: u16,
    sessions: HashMap<u16, Arc<Session>>,
}

/// Why a session could not be registered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RegisterError {
    Full,
}

impl Registry {
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.inner.lock().sessions.len()
    }

    pub(crate) fn contains(&self, tsih: u16) -> bool {
        self.inner.lock().sessions.contains_key(&tsih)
    }

    /// Allocates a TSIH, builds the session with it and registers it. Returns the
    /// new session and the session it reinstates (same key), if any.
    pub(crate) fn register(
        &self,
        sessions_max: usize,
        key: Option<&SessionKey>,
        build: impl FnOnce(u16) -> Session,
    ) -> Result<(Arc<Session>, Option<Arc<Session>>), RegisterError> {
        let mut g = self.inner.lock();
        let old = key.and_then(|k| {
            g.sessions
                .values()
                .find(|s| s.key.as_ref() == Some(k))
                .cloned()
        });
        if old.is_none() && g.sessions.len() >= sessions_max {
            return Err(RegisterError::Full);
        }
        let mut tsih = g.next_tsih;
        loop {
            tsih = tsih.wrapping_add(1);
            if tsih != 0 && !g.sessions.contains_key(&tsih) {
                break;
            }
        }
        g.next_tsih = tsih;
        let s = Arc::new(build(tsih));
        g.sessions.insert(tsih, s.clone());
        Ok((s, old))
    }

    pub(crate) fn remove(&self, tsih: u16) {
        self.inner.lock().sessions.remove(&tsih);
    }

    /// Sessions logged in to target `idx`.
    pub(crate) fn of_target(&self, idx: usize) -> Vec<Arc<Session>> {
        self.inner
            .lock()
            .sessions
            .values()
            .filter(|s| s.target == Some(idx))
            .cloned()
            .collect()
    }
}

/// The SCSI initiator port name of a session: `<name>,i,0x<isid>`.
pub(crate) fn initiator_port(name: &str, isid: &[u8; 6]) -> String {
    let mut v = [0u8; 8];
    v[2..].copy_from_slice(isid);
    format!("{name},i,0x{:012x}", u64::from_be_bytes(v))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn build(tsih: u16, key: Option<SessionKey>) -> Session {
        Session::new(tsih, key, Some(0), None, None, Arc::new(Window::new(1, 8)))
    }

    #[test]
    fn port_name() {
        assert_eq!(
            initiator_port("iqn.a", &[0x80, 0x12, 0x34, 0x56, 0x78, 0x9a]),
            "iqn.a,i,0x80123456789a"
        );
    }

    #[test]
    fn tsih_allocation_and_reinstatement() {
        let reg = Registry::default();
        let key = SessionKey {
            initiator: "iqn.a".into(),
            isid: [1; 6],
            target: 0,
            tpgt: 1,
        };
        let (a, old) = reg
            .register(2, Some(&key), |t| build(t, Some(key.clone())))
            .unwrap();
        assert!(old.is_none());
        assert_ne!(a.tsih, 0);
        let (b, old) = reg
            .register(2, Some(&key), |t| build(t, Some(key.clone())))
            .unwrap();
        assert_eq!(old.map(|o| o.tsih), Some(a.tsih));
        assert_ne!(a.tsih, b.tsih);
        // Registry full for a new key (two entries until the old one ends).
        let other = SessionKey {
            isid: [2; 6],
            ..key.clone()
        };
        assert!(reg.register(2, Some(&other), |t| build(t, None)).is_err());
        reg.remove(a.tsih);
        assert!(reg.register(2, Some(&other), |t| build(t, None)).is_ok());
        assert_eq!(reg.of_target(0).len(), 2);
        assert_eq!(reg.len(), 2);
    }

    #[tokio::test]
    async fn finish_only_removes_own_entry() {
        let s = build(1, None);
        let h = tokio::spawn(async {});
        s.running.lock().insert(
            5,
            Running {
                lun: 0,
                serial: 2,
                abort: h.abort_handle(),
            },
        );
        s.finish(5, 1);
        assert!(s.running.lock().contains_key(&5));
        s.finish(5, 2);
        assert!(s.running.lock().is_empty());
        s.wait_gone(&[5], Duration::from_millis(10)).await;
    }
}
