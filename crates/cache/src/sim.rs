//! Running a trace through a policy and counting what happened.

use crate::policy::{Access, Policy};

/// Counts of one simulation run (after its warm-up).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SimStats {
    /// Accesses counted.
    pub accesses: u64,
    /// Of which hits.
    pub hits: u64,
    /// Of which misses that inserted the block (each is an SSD write in a real cache).
    pub insertions: u64,
}

impl SimStats {
    /// Hits over accesses (0 when nothing was counted).
    pub fn hit_ratio(&self) -> f64 {
        ratio(self.hits, self.accesses)
    }

    /// Insertions over accesses: the SSD write load the policy causes per access.
    pub fn insertion_ratio(&self) -> f64 {
        ratio(self.insertions, self.accesses)
    }
}

fn ratio(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 / whole as f64
    }
}

/// Feeds every key of `trace` to `policy`; the first `warmup_accesses` accesses fill
/// the cache without being counted.
pub fn simulate<P: Policy + ?Sized>(
    policy: &mut P,
    trace: impl IntoIterator<Item = u64>,
    warmup_accesses: usize,
) -> SimStats {
    let mut stats = SimStats::default();
    for (i, key) in trace.into_iter().enumerate() {
        let access = policy.access(key);
        if i < warmup_accesses {
            continue;
        }
        stats.accesses += 1;
        match access {
            Access::Hit { .. } => stats.hits += 1,
            Access::Inserted { .. } => stats.insertions += 1,
            Access::Bypassed => {}
        }
    }
    stats
}
