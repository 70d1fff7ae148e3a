//! Small helpers: joining futures without spawning, uuids, rounding.

pub(crate) use block::{join_all, BoxFut};

/// A random 128-bit identifier as 32 hex digits.
pub(crate) fn new_uuid() -> String {
    format!("{:032x}", rand::random::<u128>())
}

/// The 64-bit tag of a pool uuid (tags journal records).
pub(crate) fn uuid_tag(uuid: &str) -> u64 {
    let hi = crc32c::crc32c(uuid.as_bytes()) as u64;
    let lo = crc32c::crc32c_append(0x5eed, uuid.as_bytes()) as u64;
    (hi << 32) | lo
}

/// Rounds `x` up to a multiple of `to` (`to > 0`).
pub(crate) fn align_up(x: u64, to: u64) -> u64 {
    x.div_ceil(to) * to
}
