//! Who may connect: client address ranges (CIDR).
//!
//! The accept loop checks the peer's address against the allowed ranges before it
//! sends a single byte; a refusal closes the socket at once with a log line (at
//! most one a second, with a count of the ones left out:
//! `block::admission::LogGate`). The connection bounds are in `block::admission`
//! (see `super::NbdLimits`).

use std::net::IpAddr;
use std::str::FromStr;

/// An address range: `10.0.0.0/24`, `::1/128`, or a plain address (a host).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IpRange {
    addr: IpAddr,
    prefix_bits: u8,
}

impl IpRange {
    /// The loopback ranges, `127.0.0.0/8` and `::1/128`: the default.
    pub fn loopback() -> Vec<IpRange> {
        vec![
            IpRange {
                addr: IpAddr::from([127, 0, 0, 0]),
                prefix_bits: 8,
            },
            IpRange {
                addr: IpAddr::from([0u16, 0, 0, 0, 0, 0, 0, 1]),
                prefix_bits: 128,
            },
        ]
    }

    /// True when every address of the range is a loopback address.
    pub fn is_loopback(&self) -> bool {
        let inside = match self.addr {
            IpAddr::V4(_) => self.prefix_bits >= 8,
            IpAddr::V6(_) => self.prefix_bits == 128,
        };
        inside && self.addr.is_loopback()
    }

    /// True when `ip` (IPv4-mapped IPv6 counts as IPv4) lies in the range.
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = canonical(ip);
        match (self.addr, ip) {
            (IpAddr::V4(a), IpAddr::V4(b)) => {
                let mask = u32::MAX
                    .checked_shl(32 - u32::from(self.prefix_bits))
                    .unwrap_or(0);
                u32::from(a) & mask == u32::from(b) & mask
            }
            (IpAddr::V6(a), IpAddr::V6(b)) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.prefix_bits))
                    .unwrap_or(0);
                u128::from(a) & mask == u128::from(b) & mask
            }
            _ => false,
        }
    }
}

/// IPv4-mapped IPv6 addresses (`::ffff:a.b.c.d`) as IPv4.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

impl FromStr for IpRange {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let (a, bits) = match s.split_once('/') {
            Some((a, b)) => (a, Some(b)),
            None => (s, None),
        };
        let addr: IpAddr = a
            .trim()
            .parse()
            .map_err(|_| format!("{s:?} is not an address or CIDR range"))?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix_bits = match bits {
            None => max,
            Some(b) => match b.trim().parse::<u8>() {
                Ok(n) if n <= max => n,
                _ => return Err(format!("{s:?}: prefix length must be 0..={max}")),
            },
        };
        // an IPv4-mapped IPv6 range is matched as the IPv4 range it maps: its
        // prefix counts the 96 mapping bits, so it must cover them (a shorter
        // one would span non-mapped IPv6 addresses too)
        let canon = canonical(addr);
        let prefix_bits = match (addr, canon) {
            (IpAddr::V6(_), IpAddr::V4(_)) => match prefix_bits.checked_sub(96) {
                Some(n) => n,
                None => {
                    return Err(format!(
                        "{s:?}: an IPv4-mapped range needs a prefix length of 96..=128"
                    ))
                }
            },
            _ => prefix_bits,
        };
        Ok(IpRange {
            addr: canon,
            prefix_bits,
        })
    }
}

impl std::fmt::Display for IpRange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix_bits)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_parse_and_match() {
        let r: IpRange = "10.0.0.0/24".parse().unwrap();
        assert!(r.contains("10.0.0.77".parse().unwrap()));
        assert!(r.contains("::ffff:10.0.0.9".parse().unwrap()));
        assert!(!r.contains("10.0.1.1".parse().unwrap()));
        assert!(!r.contains("::1".parse().unwrap()));
        let h: IpRange = "127.0.0.1".parse().unwrap();
        assert!(h.contains("127.0.0.1".parse().unwrap()));
        assert!(!h.contains("127.0.0.2".parse().unwrap()));
        let all: IpRange = "0.0.0.0/0".parse().unwrap();
        assert!(all.contains("192.168.1.1".parse().unwrap()));
        let v6: IpRange = "fd00::/8".parse().unwrap();
        assert!(v6.contains("fd12::1".parse().unwrap()));
        assert!(!v6.contains("fe80::1".parse().unwrap()));
        // IPv4-mapped forms are the IPv4 ranges they map, never wider
        let m: IpRange = "::ffff:10.0.0.5".parse().unwrap();
        assert_eq!(m, "10.0.0.5".parse().unwrap());
        assert!(m.contains("10.0.0.5".parse().unwrap()));
        assert!(!m.contains("10.0.0.6".parse().unwrap()));
        assert!(!m.contains("192.168.1.1".parse().unwrap()));
        let m: IpRange = "::ffff:10.0.0.0/104".parse().unwrap();
        assert_eq!(m, "10.0.0.0/8".parse().unwrap());
        assert!(!m.contains("11.0.0.1".parse().unwrap()));
        for bad in [
            "10.0.0.0/33",
            "10.0.0/8",
            "x",
            "::/129",
            "1.2.3.4/",
            "::ffff:10.0.0.0/95",
        ] {
            assert!(bad.parse::<IpRange>().is_err(), "{bad}");
        }
        let lo = IpRange::loopback();
        assert!(lo.iter().any(|r| r.contains("127.0.0.5".parse().unwrap())));
        assert!(lo.iter().any(|r| r.contains("::1".parse().unwrap())));
        assert!(!lo.iter().any(|r| r.contains("10.1.1.1".parse().unwrap())));
        assert!(lo.iter().all(IpRange::is_loopback));
        assert!(!"0.0.0.0/0".parse::<IpRange>().unwrap().is_loopback());
    }
}
