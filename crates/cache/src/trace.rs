//! Deterministic, seeded access traces for evaluating policies and the advisor.
//!
//! Each generator is an endless iterator of cache-block keys in `0..keys`; take as
//! many as needed. The same seed always gives the same trace, on every platform, so
//! tests that compare policies cannot flake.

/// SplitMix64: a small, fast, well-mixed generator (not cryptographic).
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator seeded with `seed`.
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A uniform value in `0..n` (`n > 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }

    /// A uniform value in `[0, 1)`.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

/// A bijection of `0..n` (`x * mul + add mod n`, `mul` coprime to `n`) that scatters
/// popularity ranks over the key space, so hot blocks are not neighbours.
#[derive(Clone, Copy, Debug)]
struct Scatter {
    n: u64,
    mul: u64,
    add: u64,
}

impl Scatter {
    fn new(n: u64, rng: &mut Rng) -> Self {
        fn gcd(mut a: u64, mut b: u64) -> u64 {
            while b != 0 {
                (a, b) = (b, a % b);
            }
            a
        }
        let n = n.max(1);
        let mut mul = 1;
        if n > 2 {
            loop {
                mul = n / 3 + rng.below(n / 3);
                if gcd(mul, n) == 1 {
                    break;
                }
            }
        }
        Self {
            n,
            mul,
            add: rng.below(n),
        }
    }

    fn apply(&self, x: u64) -> u64 {
        ((u128::from(x) * u128::from(self.mul) + u128::from(self.add)) % u128::from(self.n)) as u64
    }
}

/// Zipf(alpha) popularity over `keys` blocks: rank `r` (from 1) is drawn with
/// probability proportional to `r^-alpha`; ranks are scattered over the key space.
/// Holds a table of `keys` f64 (8 bytes per key).
#[derive(Clone, Debug)]
pub struct Zipf {
    cdf: Vec<f64>,
    scatter: Scatter,
    rng: Rng,
}

impl Zipf {
    /// Zipf(`alpha`) over `keys` blocks (`keys > 0`), seeded with `seed`.
    pub fn new(keys: u64, alpha: f64, seed: u64) -> Self {
        assert!(keys > 0, "a Zipf trace needs at least one key");
        let mut rng = Rng::new(seed);
        let scatter = Scatter::new(keys, &mut rng);
        let mut cdf = Vec::with_capacity(keys as usize);
        let mut sum = 0.0;
        for rank in 1..=keys {
            sum += (rank as f64).powf(-alpha);
            cdf.push(sum);
        }
        for c in &mut cdf {
            *c /= sum;
        }
        Self { cdf, scatter, rng }
    }
}

impl Iterator for Zipf {
    type Item = u64;

    fn next(&mut self) -> Option<u64> {
        let u = self.rng.unit();
        let rank = self.cdf.partition_point(|&c| c < u).min(self.cdf.len() - 1);
        Some(self.scatter.apply(rank as u64))
    }
}

/// A hot set hit uniformly at random, interrupted periodically by a full sequential
/// scan of the whole key space (a backup, a table scan, a virus scanner): after every
/// `hot_accesses_between_scans` hot accesses come `keys` accesses `0, 1, ..., keys-1`.
#[derive(Clone, Debug)]
pub struct HotScan {
    keys: u64,
    hot_keys: u64,
    hot_accesses_between_scans: u64,
    scatter: Scatter,
    rng: Rng,
    /// Hot accesses left before the next scan, or, during a scan, `None`.
    hot_left: Option<u64>,
    scan_next: u64,
}

impl HotScan {
    /// `hot_keys` hot blocks among `keys` (both `> 0`), seeded with `seed`; the trace
    /// starts with a hot phase.
    pub fn new(keys: u64, hot_keys: u64, hot_accesses_between_scans: u64, seed: u64) -> Self {
        assert!(keys > 0 && hot_keys > 0 && hot_keys <= keys);
        let mut rng = Rng::new(seed);
        let scatter = Scatter::new(keys, &mut rng);
        Self {
            keys,
            hot_keys,
            hot_accesses_between_scans,
            scatter,
            rng,
            hot_left: Some(hot_accesses_between_scans),
            scan_next: 0,
        }
    }
}

impl Iterator for HotScan {
    type Item = u64;

    fn next(&mut self) -> Option<u64> {
        match self.hot_left {
            Some(0) => {
                self.hot_left = None;
                self.scan_next = 0;
                self.next()
            }
            Some(left) => {
                self.hot_left = Some(left - 1);
                Some(self.scatter.apply(self.rng.below(self.hot_keys)))
            }
            None => {
                let key = self.scan_next;
                self.scan_next += 1;
                if self.scan_next == self.keys {
                    self.hot_left = Some(self.hot_accesses_between_scans);
                }
                Some(key)
            }
        }
    }
}

/// A hot set that moves: `hot_percent`% of accesses go uniformly to `hot_keys`
/// blocks, the rest uniformly to all `keys`; every `phase_accesses` accesses the hot
/// set jumps to a new random place (the working set of a new job, a new day).
#[derive(Clone, Debug)]
pub struct ShiftingHot {
    keys: u64,
    hot_keys: u64,
    hot_percent: u64,
    phase_accesses: u64,
    scatter: Scatter,
    rng: Rng,
    offset: u64,
    phase_left: u64,
}

impl ShiftingHot {
    /// See the type's doc; `keys`, `hot_keys` and `phase_accesses` are `> 0`.
    pub fn new(keys: u64, hot_keys: u64, hot_percent: u64, phase_accesses: u64, seed: u64) -> Self {
        assert!(keys > 0 && hot_keys > 0 && hot_keys <= keys && phase_accesses > 0);
        let mut rng = Rng::new(seed);
        let scatter = Scatter::new(keys, &mut rng);
        let offset = rng.below(keys);
        Self {
            keys,
            hot_keys,
            hot_percent: hot_percent.min(100),
            phase_accesses,
            scatter,
            rng,
            offset,
            phase_left: phase_accesses,
        }
    }
}

impl Iterator for ShiftingHot {
    type Item = u64;

    fn next(&mut self) -> Option<u64> {
        if self.phase_left == 0 {
            self.offset = self.rng.below(self.keys);
            self.phase_left = self.phase_accesses;
        }
        self.phase_left -= 1;
        let rank = if self.rng.below(100) < self.hot_percent {
            (self.offset + self.rng.below(self.hot_keys)) % self.keys
        } else {
            self.rng.below(self.keys)
        };
        Some(self.scatter.apply(rank))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn scatter_is_a_bijection() {
        let mut rng = Rng::new(7);
        for n in [1, 2, 3, 10, 97, 1000] {
            let s = Scatter::new(n, &mut rng);
            let image: HashSet<u64> = (0..n).map(|x| s.apply(x)).collect();
            assert_eq!(image.len() as u64, n);
            assert!(image.iter().all(|&k| k < n));
        }
    }

    #[test]
    fn traces_are_deterministic_and_in_range() {
        let a: Vec<u64> = Zipf::new(1000, 0.9, 1).take(500).collect();
        let b: Vec<u64> = Zipf::new(1000, 0.9, 1).take(500).collect();
        assert_eq!(a, b);
        assert!(a.iter().all(|&k| k < 1000));
        assert!(ShiftingHot::new(1000, 50, 90, 100, 3)
            .take(5000)
            .all(|k| k < 1000));
    }

    #[test]
    fn zipf_top_rank_frequency_matches() {
        // Rank 1 of Zipf(1.0) over 100 keys has probability 1 / H(100) ~ 0.1928.
        let n = 200_000;
        let trace: Vec<u64> = Zipf::new(100, 1.0, 5).take(n).collect();
        let mut counts = [0u32; 100];
        for k in trace {
            counts[k as usize] += 1;
        }
        let top = *counts.iter().max().unwrap() as f64 / n as f64;
        assert!((top - 0.1928).abs() < 0.005, "top frequency {top}");
    }

    #[test]
    fn hot_scan_scans_everything_in_order() {
        let t: Vec<u64> = HotScan::new(10, 2, 5, 9).take(30).collect();
        assert_eq!(&t[5..15], &[0, 1, 2, 3, 4, 5, 6, 7, 8, 9]);
        assert_eq!(&t[20..30], &[0, 1, 2, 3, 4, 5, 6, 7, 8, 9]);
        let hot: HashSet<u64> = t[..5].iter().chain(&t[15..20]).copied().collect();
        assert!(hot.len() <= 2);
    }
}
