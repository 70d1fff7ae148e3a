//! Key hashing shared by the index, the ghost filters and the advisor's sampler.

/// A 64-bit finaliser (MurmurHash3 `fmix64`): a bijection that spreads sequential
/// block numbers over the whole 64-bit range, so linear probing and spatial
/// sampling behave as if keys were random.
#[inline]
pub(crate) fn mix64(mut x: u64) -> u64 {
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    x ^= x >> 33;
    x
}

/// Maps a 64-bit hash onto `0..n` without a division (Lemire's multiply-shift).
#[inline]
pub(crate) fn reduce(hash: u64, n: usize) -> usize {
    ((u128::from(hash) * n as u128) >> 64) as usize
}

/// Salts that make the hash families of different users independent of each other.
pub(crate) const SALT_GHOST: u64 = 0x9e37_79b9_7f4a_7c15;
pub(crate) const SALT_SAMPLE: u64 = 0xd1b5_4a32_d192_ed03;
pub(crate) const SALT_SKETCH: u64 = 0x8cb9_2ba7_2f3d_8dd7;
