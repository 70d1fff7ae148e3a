//! Two published policies the replay compares the default with, simulated on
//! block keys only (they are not selectable in the cache: they have no pinned
//! blocks and no memory bound):
//! - ARC (N. Megiddo and D. S. Modha, FAST '03): a recency list T1 and a
//!   frequency list T2 sharing the cache, with ghosts B1 and B2 of what each
//!   evicted moving the target size of T1;
//! - LIRS (S. Jiang and X. Zhang, SIGMETRICS '02): blocks whose last two
//!   accesses were close (low inter-reference recency) hold most of the cache;
//!   the others get a small share, `hir_percent` of it.
//!
//! Lists are ordered maps from an access stamp to a key: the first entry is the
//! least recent. Slower than intrusive lists, and plain enough to check
//! against the papers.

use std::collections::{BTreeMap, HashMap};

/// Hits and insertions (every miss inserts) over a run.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Counts {
    pub hits: u64,
    pub insertions: u64,
}

/// An LRU-ordered list of keys.
#[derive(Default)]
struct List {
    by_stamp: BTreeMap<u64, u64>,
}

impl List {
    fn len(&self) -> usize {
        self.by_stamp.len()
    }

    fn oldest(&self) -> Option<(u64, u64)> {
        self.by_stamp.iter().next().map(|(&s, &k)| (s, k))
    }

    /// Takes the least recent key off the list.
    fn pop_oldest(&mut self) -> Option<u64> {
        self.by_stamp.pop_first().map(|(_, k)| k)
    }
}

/// Which of ARC's four lists a key is on.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum ArcList {
    T1 = 0,
    T2 = 1,
    B1 = 2,
    B2 = 3,
}

/// ARC over `capacity` blocks.
pub struct Arc {
    c: usize,
    /// Target size of T1.
    p: f64,
    lists: [List; 4],
    on: HashMap<u64, (ArcList, u64)>,
    clock: u64,
}

impl Arc {
    pub fn new(capacity: usize) -> Self {
        Arc {
            c: capacity.max(1),
            p: 0.0,
            lists: Default::default(),
            on: HashMap::new(),
            clock: 0,
        }
    }

    fn len(&self, l: ArcList) -> usize {
        self.lists[l as usize].len()
    }

    /// Blocks cached (T1 and T2).
    pub fn cached(&self) -> usize {
        self.len(ArcList::T1) + self.len(ArcList::T2)
    }

    /// Puts `key` at the most recent end of `l`, off whatever list it was on.
    fn put(&mut self, key: u64, l: ArcList) {
        self.clock += 1;
        if let Some((old, stamp)) = self.on.insert(key, (l, self.clock)) {
            self.lists[old as usize].by_stamp.remove(&stamp);
        }
        self.lists[l as usize].by_stamp.insert(self.clock, key);
    }

    /// Takes the least recent key of `l` off every list.
    fn drop_oldest(&mut self, l: ArcList) -> Option<u64> {
        let key = self.lists[l as usize].pop_oldest()?;
        self.on.remove(&key);
        Some(key)
    }

    /// The paper's REPLACE: evicts T1's or T2's least recent block into its
    /// ghost list, as T1's size stands against its target.
    fn replace(&mut self, hit_in_b2: bool) {
        let t1 = self.len(ArcList::T1) as f64;
        let from_t1 = t1 > 0.0 && (t1 > self.p || (hit_in_b2 && t1 == self.p.floor()))
            || self.len(ArcList::T2) == 0;
        let (from, to) = if from_t1 {
            (ArcList::T1, ArcList::B1)
        } else {
            (ArcList::T2, ArcList::B2)
        };
        if let Some(k) = self.drop_oldest(from) {
            self.put(k, to);
        }
    }

    /// One access; true on a hit.
    pub fn access(&mut self, key: u64) -> bool {
        let c = self.c as f64;
        match self.on.get(&key).map(|e| e.0) {
            Some(ArcList::T1 | ArcList::T2) => {
                self.put(key, ArcList::T2);
                return true;
            }
            Some(ArcList::B1) => {
                let step = (self.len(ArcList::B2) as f64 / self.len(ArcList::B1) as f64).max(1.0);
                self.p = (self.p + step).min(c);
                self.replace(false);
                self.put(key, ArcList::T2);
            }
            Some(ArcList::B2) => {
                let step = (self.len(ArcList::B1) as f64 / self.len(ArcList::B2) as f64).max(1.0);
                self.p = (self.p - step).max(0.0);
                self.replace(true);
                self.put(key, ArcList::T2);
            }
            None => {
                let l1 = self.len(ArcList::T1) + self.len(ArcList::B1);
                let all = l1 + self.len(ArcList::T2) + self.len(ArcList::B2);
                if l1 == self.c {
                    if self.len(ArcList::T1) < self.c {
                        self.drop_oldest(ArcList::B1);
                        self.replace(false);
                    } else {
                        self.drop_oldest(ArcList::T1);
                    }
                } else if all >= self.c {
                    if all >= 2 * self.c {
                        self.drop_oldest(ArcList::B2);
                    }
                    if self.cached() >= self.c {
                        self.replace(false);
                    }
                }
                self.put(key, ArcList::T1);
            }
        }
        false
    }
}

/// What LIRS knows of a key.
#[derive(Default, Clone, Copy)]
struct LirsEntry {
    /// Stamp in the stack S, if it is there.
    s: Option<u64>,
    /// Stamp in the queue Q of resident HIR blocks, if it is there.
    q: Option<u64>,
    lir: bool,
    resident: bool,
}

/// LIRS over `capacity` blocks.
pub struct Lirs {
    capacity: usize,
    lir_capacity: usize,
    /// The recency stack: LIR blocks and recently seen HIR ones (resident or
    /// not); its oldest entry is always LIR.
    s: List,
    /// Resident HIR blocks, in eviction order.
    q: List,
    entries: HashMap<u64, LirsEntry>,
    clock: u64,
    lirs: usize,
    resident: usize,
}

impl Lirs {
    pub fn new(capacity: usize, hir_percent: f64) -> Self {
        let capacity = capacity.max(2);
        let hir = ((capacity as f64 * hir_percent / 100.0) as usize).clamp(1, capacity - 1);
        Lirs {
            capacity,
            lir_capacity: capacity - hir,
            s: List::default(),
            q: List::default(),
            entries: HashMap::new(),
            clock: 0,
            lirs: 0,
            resident: 0,
        }
    }

    /// What is known of a key on the stack or the queue.
    fn entry(&mut self, key: u64) -> &mut LirsEntry {
        self.entries
            .get_mut(&key)
            .expect("a key on the stack or the queue has an entry")
    }

    /// Blocks cached.
    #[cfg(test)]
    pub fn cached(&self) -> usize {
        self.resident
    }

    fn stack_on_top(&mut self, key: u64) {
        self.restamp(key, true);
    }

    fn queue_at_end(&mut self, key: u64) {
        self.restamp(key, false);
    }

    /// Moves `key` to the most recent end of the stack or of the queue.
    fn restamp(&mut self, key: u64, stack: bool) {
        self.clock += 1;
        let e = self.entries.entry(key).or_default();
        let (slot, list) = if stack {
            (&mut e.s, &mut self.s)
        } else {
            (&mut e.q, &mut self.q)
        };
        if let Some(old) = slot.replace(self.clock) {
            list.by_stamp.remove(&old);
        }
        list.by_stamp.insert(self.clock, key);
    }

    /// Drops HIR entries from the bottom of the stack until a LIR block is there.
    fn prune(&mut self) {
        while let Some((_, key)) = self.s.oldest() {
            if self.entry(key).lir {
                break;
            }
            self.s.pop_oldest();
            let e = self.entry(key);
            e.s = None;
            if !e.resident {
                self.entries.remove(&key);
            }
        }
    }

    /// The LIR block at the bottom of the stack becomes a resident HIR block.
    fn demote_bottom(&mut self) {
        let key = self.s.pop_oldest().expect("a LIR block was just promoted");
        let e = self.entry(key);
        e.s = None;
        e.lir = false;
        self.lirs -= 1;
        self.queue_at_end(key);
        self.prune();
    }

    /// `key`, stacked or resident, becomes LIR at the top of the stack.
    fn promote(&mut self, key: u64) {
        if let Some(q) = self.entry(key).q.take() {
            self.q.by_stamp.remove(&q);
        }
        let e = self.entry(key);
        e.lir = true;
        e.resident = true;
        self.lirs += 1;
        self.stack_on_top(key);
        self.demote_bottom();
    }

    /// One access; true on a hit.
    pub fn access(&mut self, key: u64) -> bool {
        let e = self.entries.get(&key).copied();
        if let Some(e) = e.filter(|e| e.resident) {
            if e.lir {
                self.stack_on_top(key);
                self.prune();
            } else if e.s.is_some() {
                // re-used within the stack's reach: its recency beats the
                // bottom LIR block's
                self.promote(key);
            } else {
                self.stack_on_top(key);
                self.queue_at_end(key);
            }
            return true;
        }
        if self.resident >= self.capacity {
            let victim = self
                .q
                .pop_oldest()
                .expect("a full cache has resident HIR blocks");
            let v = self.entry(victim);
            v.q = None;
            v.resident = false;
            if v.s.is_none() {
                self.entries.remove(&victim);
            }
            self.resident -= 1;
        }
        self.resident += 1;
        let stacked = e.is_some_and(|e| e.s.is_some());
        if self.lirs < self.lir_capacity {
            let e = self.entries.entry(key).or_default();
            e.lir = true;
            e.resident = true;
            self.lirs += 1;
            self.stack_on_top(key);
        } else if stacked {
            self.promote(key);
        } else {
            self.entries.entry(key).or_default().resident = true;
            self.stack_on_top(key);
            self.queue_at_end(key);
        }
        false
    }
}

/// Runs `keys` through `access`; every miss inserts.
pub fn count(keys: &[u64], mut access: impl FnMut(u64) -> bool) -> Counts {
    let hits = keys.iter().filter(|&&k| access(k)).count() as u64;
    Counts {
        hits,
        insertions: keys.len() as u64 - hits,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A hot set read twice, then a long scan of new blocks with the hot set
    /// read again between every few of them.
    fn hot_and_scan(hot: u64, scan: u64) -> Vec<u64> {
        let mut keys: Vec<u64> = (0..hot).chain(0..hot).collect();
        for i in 0..scan {
            keys.push(1_000_000 + i);
            if i % 4 == 3 {
                keys.push((i / 4) % hot);
            }
        }
        keys
    }

    fn lru_hits(keys: &[u64], cap: usize) -> u64 {
        let mut p = cache::policy::PolicyKind::Lru.build(cap);
        cache::sim::simulate(&mut p, keys.iter().copied(), 0).hits
    }

    #[test]
    fn arc_keeps_a_hot_set_through_a_scan_lru_loses() {
        let keys = hot_and_scan(50, 4000);
        let mut a = Arc::new(100);
        let arc = count(&keys, |k| a.access(k)).hits;
        let lru = lru_hits(&keys, 100);
        // after the first pass over the hot set, ARC hits nearly every hot read
        assert!(arc > 50 + 900, "arc {arc}");
        assert!(arc > lru + 500, "arc {arc} lru {lru}");
        assert!(a.cached() <= 100);
    }

    #[test]
    fn lirs_holds_most_of_a_loop_larger_than_the_cache() {
        let cap = 100;
        let keys: Vec<u64> = (0..20).flat_map(|_| 0..cap as u64 + 1).collect();
        let mut l = Lirs::new(cap, 10.0);
        let lirs = count(&keys, |k| l.access(k)).hits;
        assert_eq!(
            lru_hits(&keys, cap),
            0,
            "LRU thrashes on a loop one block too long"
        );
        // from the second pass on, the LIR blocks (90) hit every time
        assert!(lirs >= 19 * 89, "lirs {lirs}");
        assert!(l.cached() <= cap);
    }

    #[test]
    fn neither_beats_the_optimum_nor_overfills() {
        let mut x = 12345u64;
        let keys: Vec<u64> = (0..20_000)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                // skewed: low keys far more often
                (x % 997) * (x % 997) / 997
            })
            .collect();
        for cap in [10, 50, 200] {
            let opt = cache::replay::belady(&keys, cap).hits;
            let mut a = Arc::new(cap);
            let mut l = Lirs::new(cap, 10.0);
            let mut arc = 0;
            let mut lirs = 0;
            for &k in &keys {
                arc += a.access(k) as u64;
                lirs += l.access(k) as u64;
                assert!(a.cached() <= cap && l.cached() <= cap);
            }
            assert!(
                arc <= opt && lirs <= opt,
                "cap {cap}: arc {arc} lirs {lirs} opt {opt}"
            );
            assert!(arc > 0 && lirs > 0);
        }
    }
}
