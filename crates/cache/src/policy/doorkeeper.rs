//! An admission filter: once the cache is full, a missed block is admitted only on
//! its second miss within a window, so blocks read once (the bulk of a scan or of a
//! random read with no re-use) never cost an SSD write nor push out a block that
//! may be re-used. While the cache has free slots every miss is admitted (a free
//! slot costs nothing, and a warm-up pass fills the cache). It wraps any policy;
//! hits and eviction stay the inner policy's. The price is one extra miss for each
//! re-used block that arrives while the cache is full.

use super::ghost::Ghost;
use super::{Access, Policy};

/// Once the inner policy is full, admits a missed block only if it was turned away
/// once before, within about the last `window_keys` blocks turned away; otherwise
/// turns it away ([`Access::Bypassed`]) and remembers it.
pub struct Doorkeeper<P> {
    inner: P,
    seen: Ghost,
}

impl<P: Policy> Doorkeeper<P> {
    /// Wraps `inner`, remembering about as many turned-away blocks as `inner` holds.
    pub fn new(inner: P) -> Self {
        let window_keys = inner.capacity().max(1);
        Self::with_window(inner, window_keys)
    }

    /// Wraps `inner`, remembering about `window_keys` turned-away blocks.
    pub fn with_window(inner: P, window_keys: usize) -> Self {
        Self {
            inner,
            seen: Ghost::new(window_keys.max(1)),
        }
    }

    /// The wrapped policy.
    pub fn inner(&self) -> &P {
        &self.inner
    }
}

impl<P: Policy> Policy for Doorkeeper<P> {
    fn name(&self) -> &'static str {
        match self.inner.name() {
            "lru" => "lru+dk",
            "fifo" => "fifo+dk",
            "sieve" => "sieve+dk",
            "2q" => "2q+dk",
            "s3fifo" => "s3fifo+dk",
            "wtinylfu" => "wtinylfu+dk",
            _ => "doorkeeper",
        }
    }

    fn access(&mut self, key: u64) -> Access {
        if let Some(slot) = self.inner.touch(key) {
            return Access::Hit { slot };
        }
        if self.inner.len() < self.inner.capacity() || self.seen.contains(key) {
            self.inner.access(key)
        } else {
            self.seen.insert(key);
            Access::Bypassed
        }
    }

    fn admit(&mut self, key: u64) -> Access {
        self.inner.admit(key)
    }

    fn touch(&mut self, key: u64) -> Option<u32> {
        self.inner.touch(key)
    }

    fn get(&self, key: u64) -> Option<u32> {
        self.inner.get(key)
    }

    fn remove(&mut self, key: u64) -> Option<u32> {
        self.inner.remove(key)
    }

    fn key_of(&self, slot: u32) -> Option<u64> {
        self.inner.key_of(slot)
    }

    fn set_pinned(&mut self, slot: u32, pinned: bool) {
        self.inner.set_pinned(slot, pinned)
    }

    fn pinned(&self) -> usize {
        self.inner.pinned()
    }

    fn restore(&mut self, entries: &[(u32, u64)]) {
        self.inner.restore(entries)
    }

    fn len(&self) -> usize {
        self.inner.len()
    }

    fn capacity(&self) -> usize {
        self.inner.capacity()
    }

    fn memory_bytes(&self) -> usize {
        self.inner.memory_bytes() + self.seen.memory_bytes()
    }
}
