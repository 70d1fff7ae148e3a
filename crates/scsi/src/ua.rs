//! Unit attention conditions, queued per I_T nexus for one logical unit.
//!
//! A nexus the logical unit has never seen starts with POWER ON, RESET, OR BUS
//! DEVICE RESET OCCURRED. Queues are bounded ([`UA_QUEUE_DEPTH_MAX`]); a duplicate is
//! not queued twice, and when a queue is full the newest condition is dropped
//! (SAM-5 allows reporting fewer conditions than occurred).
//!
//! The hot path only takes a read lock and loads one atomic flag per command.

use crate::sense::{codes, Sense};
use crate::ItNexus;
use parking_lot::{Mutex, RwLock};
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Most unit attention conditions kept per I_T nexus.
pub const UA_QUEUE_DEPTH_MAX: usize = 16;

/// Most I_T nexuses a logical unit tracks; beyond this, forgotten nexuses simply get
/// POWER ON again when they come back.
pub const NEXUS_COUNT_MAX: usize = 4096;

/// Identifies an I_T nexus: initiator port name and relative target port id.
pub(crate) type NexusKey = (Arc<str>, u16);

pub(crate) fn key_of(nexus: &ItNexus) -> NexusKey {
    (nexus.initiator_port.clone(), nexus.relative_port_id)
}

#[derive(Default)]
struct NexusUa {
    pending: AtomicBool,
    queue: Mutex<VecDeque<Sense>>,
    /// The condition taken last, while the queue had been reset `resets`
    /// times: it goes back to the front if its command is never answered
    /// ([`UaTable::restore`]), unless a reset superseded it meanwhile.
    taken: Mutex<Option<(Sense, u64)>>,
    resets: std::sync::atomic::AtomicU64,
}

impl NexusUa {
    fn with(sense: Sense) -> NexusUa {
        let n = NexusUa::default();
        n.push(sense);
        n
    }

    fn push(&self, sense: Sense) {
        let mut q = self.queue.lock();
        if q.contains(&sense) || q.len() >= UA_QUEUE_DEPTH_MAX {
            return;
        }
        q.push_back(sense);
        self.pending.store(true, Ordering::Release);
    }

    /// Replaces every queued condition with `sense` (a reset supersedes older UAs).
    fn reset_to(&self, sense: Sense) {
        let mut q = self.queue.lock();
        self.resets.fetch_add(1, Ordering::AcqRel);
        q.clear();
        q.push_back(sense);
        self.pending.store(true, Ordering::Release);
    }

    fn pop(&self) -> Option<Sense> {
        let mut q = self.queue.lock();
        let s = q.pop_front();
        if q.is_empty() {
            self.pending.store(false, Ordering::Release);
        }
        if let Some(s) = s {
            *self.taken.lock() = Some((s, self.resets.load(Ordering::Acquire)));
        }
        s
    }

    /// Puts `sense` back at the front if it is the condition taken last and
    /// no reset came since; says whether it did.
    fn restore(&self, sense: Sense) -> bool {
        let mut q = self.queue.lock();
        let mut taken = self.taken.lock();
        if *taken != Some((sense, self.resets.load(Ordering::Acquire))) {
            return false;
        }
        *taken = None;
        if !q.contains(&sense) {
            if q.len() >= UA_QUEUE_DEPTH_MAX {
                q.pop_back();
            }
            q.push_front(sense);
        }
        self.pending.store(true, Ordering::Release);
        true
    }
}

/// Unit attention queues of one logical unit, one per I_T nexus.
#[derive(Default)]
pub(crate) struct UaTable {
    map: RwLock<HashMap<NexusKey, Arc<NexusUa>>>,
}

impl UaTable {
    fn entry(&self, nexus: &ItNexus) -> Arc<NexusUa> {
        if let Some(e) = self.map.read().get(&key_of(nexus)) {
            return e.clone();
        }
        let mut map = self.map.write();
        if map.len() >= NEXUS_COUNT_MAX {
            // Forget an arbitrary nexus; it will see POWER ON again (bounded memory).
            if let Some(k) = map.keys().next().cloned() {
                map.remove(&k);
            }
        }
        map.entry(key_of(nexus))
            .or_insert_with(|| Arc::new(NexusUa::with(codes::POWER_ON_RESET)))
            .clone()
    }

    /// True when `nexus` has a unit attention to report (a new nexus always has).
    #[inline]
    pub fn pending(&self, nexus: &ItNexus) -> bool {
        match self.map.read().get(&key_of(nexus)) {
            Some(e) => e.pending.load(Ordering::Acquire),
            None => true,
        }
    }

    /// Takes the oldest unit attention of `nexus`, if any.
    pub fn pop(&self, nexus: &ItNexus) -> Option<Sense> {
        self.entry(nexus).pop()
    }

    /// Establishes `sense` on every known nexus except `except`.
    pub fn raise_all(&self, sense: Sense, except: Option<&ItNexus>) {
        let skip = except.map(key_of);
        for (k, e) in self.map.read().iter() {
            if Some(k) != skip.as_ref() {
                e.push(sense);
            }
        }
    }

    /// Establishes `sense` on the nexuses of `initiator_port` (through one port or all).
    pub fn raise_for(&self, initiator_port: &str, relative_port_id: Option<u16>, sense: Sense) {
        for (k, e) in self.map.read().iter() {
            if k.0.eq_ignore_ascii_case(initiator_port)
                && (relative_port_id.is_none() || relative_port_id == Some(k.1))
            {
                e.push(sense);
            }
        }
    }

    /// A reset: every known nexus gets `sense` instead of what it had queued.
    pub fn reset_all(&self, sense: Sense) {
        for e in self.map.read().values() {
            e.reset_to(sense);
        }
    }

    /// Forgets `nexus` (it is gone); if it comes back it starts with POWER ON.
    /// A command that took `sense` (reported it) was never answered (it was
    /// aborted after it ran): the condition was not reported after all, so
    /// it goes back to the front of the nexus's queue (SAM-5: a unit
    /// attention is cleared when reported). Only the condition taken last,
    /// and not once a reset has superseded it. (What was taken last is not
    /// forgotten when its command is answered, to keep the answer's path
    /// free of a lock: a response carrying the same condition without
    /// having taken it, which only a partner's forwarded answer can, and
    /// then aborted, would report it once more.)
    pub fn restore(&self, nexus: &ItNexus, sense: Sense) -> bool {
        match self.map.read().get(&key_of(nexus)) {
            Some(e) => e.restore(sense),
            None => false,
        }
    }

    pub fn forget(&self, nexus: &ItNexus) {
        self.map.write().remove(&key_of(nexus));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nx(port: &str, rel: u16) -> ItNexus {
        ItNexus {
            initiator_name: Arc::from("iqn.i"),
            initiator_port: Arc::from(port),
            relative_port_id: rel,
            chap_user: None,
        }
    }

    #[test]
    fn new_nexus_gets_power_on_then_clears() {
        let t = UaTable::default();
        let a = nx("a", 1);
        assert!(t.pending(&a));
        assert_eq!(t.pop(&a), Some(codes::POWER_ON_RESET));
        assert!(!t.pending(&a));
        assert_eq!(t.pop(&a), None);
    }

    #[test]
    fn raise_skips_origin_and_is_bounded() {
        let t = UaTable::default();
        let (a, b) = (nx("a", 1), nx("b", 1));
        t.pop(&a);
        t.pop(&b);
        t.raise_all(codes::MODE_PARAMETERS_CHANGED, Some(&a));
        assert!(!t.pending(&a));
        assert_eq!(t.pop(&b), Some(codes::MODE_PARAMETERS_CHANGED));
        for asc in 0..100u8 {
            t.raise_for("b", None, Sense::new(6, 0x2a, asc));
        }
        let mut n = 0;
        while t.pop(&b).is_some() {
            n += 1;
        }
        assert_eq!(n, UA_QUEUE_DEPTH_MAX);
    }
}
