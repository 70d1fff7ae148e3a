//! CHAP (RFC 1994) as iSCSI uses it (RFC 7143 section 12.1.3): MD5 (CHAP_A=5),
//! and from the IANA CHAP algorithm registry SHA-1 (6), SHA-256 (7) and
//! SHA3-256 (8), binary values in hex (`0x...`) or base64 (`0b...`). The
//! digests are RustCrypto's `md-5`, `sha1`, `sha2` and `sha3`.

use crate::ProtoError;
use md5::{Digest, Md5};
use sha1::Sha1;
use sha2::Sha256;
use sha3::Sha3_256;

/// CHAP_A value of MD5.
pub const CHAP_ALGORITHM_MD5: u32 = 5;
/// CHAP_A value of SHA-1.
pub const CHAP_ALGORITHM_SHA1: u32 = 6;
/// CHAP_A value of SHA-256.
pub const CHAP_ALGORITHM_SHA256: u32 = 7;
/// CHAP_A value of SHA3-256.
pub const CHAP_ALGORITHM_SHA3_256: u32 = 8;
/// Length of an MD5 challenge (each algorithm's challenges are as long as
/// its digest: [`ChapAlgorithm::challenge_len_bytes`]).
pub const CHALLENGE_LEN_BYTES: usize = 16;
/// Longest challenge accepted from an initiator (RFC 7143 allows 1024 bytes).
pub const CHALLENGE_LEN_MAX_BYTES: usize = 1024;

/// A CHAP digest algorithm this target speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChapAlgorithm {
    /// MD5, CHAP_A=5: the RFC 7143 baseline every initiator has.
    Md5,
    /// SHA-1, CHAP_A=6.
    Sha1,
    /// SHA-256, CHAP_A=7.
    Sha256,
    /// SHA3-256, CHAP_A=8 (first in the list open-iscsi's iscsid.conf suggests).
    Sha3_256,
}

impl ChapAlgorithm {
    /// Every algorithm this target speaks, weakest first (the order
    /// [`Self::choose`] prefers them in).
    pub const ALL: [ChapAlgorithm; 4] = [
        ChapAlgorithm::Md5,
        ChapAlgorithm::Sha1,
        ChapAlgorithm::Sha256,
        ChapAlgorithm::Sha3_256,
    ];

    /// The CHAP_A number.
    pub fn code(self) -> u32 {
        match self {
            ChapAlgorithm::Md5 => CHAP_ALGORITHM_MD5,
            ChapAlgorithm::Sha1 => CHAP_ALGORITHM_SHA1,
            ChapAlgorithm::Sha256 => CHAP_ALGORITHM_SHA256,
            ChapAlgorithm::Sha3_256 => CHAP_ALGORITHM_SHA3_256,
        }
    }

    /// The algorithm with CHAP_A number `code`, if supported.
    pub fn from_code(code: u64) -> Option<ChapAlgorithm> {
        match code {
            5 => Some(ChapAlgorithm::Md5),
            6 => Some(ChapAlgorithm::Sha1),
            7 => Some(ChapAlgorithm::Sha256),
            8 => Some(ChapAlgorithm::Sha3_256),
            _ => None,
        }
    }

    /// MD5 and SHA-1: what `chap_md5 = false` refuses (a man in the middle
    /// could strip the stronger ones from an offer).
    pub fn is_weak(self) -> bool {
        matches!(self, ChapAlgorithm::Md5 | ChapAlgorithm::Sha1)
    }

    /// Picks from an initiator's CHAP_A list (`8,7,6,5`) the strongest it
    /// offers, whatever the order: SHA3-256, SHA-256, SHA-1, then MD5; None
    /// when it offers none of them. Unknown or malformed entries are skipped;
    /// at most the first 64 entries are looked at. RFC 7143 6.2.1 has a
    /// target answer a list with the first value it supports (LIO does): the
    /// strongest is chosen instead, on purpose, so that an initiator listing
    /// MD5 first for the sake of old targets still gets a stronger digest
    /// here; the answer is always one of the initiator's values.
    pub fn choose(offer: &str) -> Option<ChapAlgorithm> {
        offer
            .split(',')
            .take(64)
            .filter_map(|a| parse_number(a).ok().and_then(ChapAlgorithm::from_code))
            .max_by_key(|a| a.rank())
    }

    /// The order of preference: [`Self::ALL`]'s.
    fn rank(self) -> usize {
        Self::ALL.iter().position(|&a| a == self).unwrap_or(0)
    }

    /// Length of a response (the digest) in bytes.
    pub fn digest_len_bytes(self) -> usize {
        match self {
            ChapAlgorithm::Md5 => 16,
            ChapAlgorithm::Sha1 => 20,
            ChapAlgorithm::Sha256 | ChapAlgorithm::Sha3_256 => 32,
        }
    }

    /// Length of the challenges this target sends: as long as the digest.
    pub fn challenge_len_bytes(self) -> usize {
        self.digest_len_bytes()
    }

    /// The CHAP response: H(identifier || secret || challenge).
    pub fn response(self, id: u8, secret: &[u8], challenge: &[u8]) -> Vec<u8> {
        match self {
            ChapAlgorithm::Md5 => digest::<Md5>(id, secret, challenge).to_vec(),
            ChapAlgorithm::Sha1 => digest::<Sha1>(id, secret, challenge).to_vec(),
            ChapAlgorithm::Sha256 => digest::<Sha256>(id, secret, challenge).to_vec(),
            ChapAlgorithm::Sha3_256 => digest::<Sha3_256>(id, secret, challenge).to_vec(),
        }
    }
}

/// H(identifier || secret || challenge) with the digest `D`.
fn digest<D: Digest>(id: u8, secret: &[u8], challenge: &[u8]) -> md5::digest::Output<D> {
    let mut h = D::new();
    h.update([id]);
    h.update(secret);
    h.update(challenge);
    h.finalize()
}

/// The MD5 CHAP response: MD5(identifier || secret || challenge).
pub fn response(id: u8, secret: &[u8], challenge: &[u8]) -> [u8; 16] {
    digest::<Md5>(id, secret, challenge).into()
}

/// Compares two byte strings in time independent of where they differ.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Encodes bytes as an iSCSI hex binary value (`0x` + lowercase hex).
pub fn encode_hex(bytes: &[u8]) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(2 + bytes.len() * 2);
    s.push_str("0x");
    for b in bytes {
        s.push(HEX[(b >> 4) as usize] as char);
        s.push(HEX[(b & 15) as usize] as char);
    }
    s
}

fn hex_val(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    }
}

fn b64_val(c: u8) -> Option<u8> {
    match c {
        b'A'..=b'Z' => Some(c - b'A'),
        b'a'..=b'z' => Some(c - b'a' + 26),
        b'0'..=b'9' => Some(c - b'0' + 52),
        b'+' => Some(62),
        b'/' => Some(63),
        _ => None,
    }
}

/// Decodes an iSCSI binary value: `0x`/`0X` hex (odd digit counts get a leading
/// zero) or `0b`/`0B` base64.
pub fn decode_binary(value: &str) -> Result<Vec<u8>, ProtoError> {
    let v = value.as_bytes();
    if v.len() < 3 || v[0] != b'0' {
        return Err(ProtoError::BadText("binary value without 0x/0b prefix"));
    }
    let body = &v[2..];
    if body.len() > 2 * CHALLENGE_LEN_MAX_BYTES + 4 {
        return Err(ProtoError::TextTooLarge("binary value too long"));
    }
    match v[1] {
        b'x' | b'X' => {
            let mut out = Vec::with_capacity(body.len().div_ceil(2));
            let mut digits = body.iter().copied();
            if body.len() % 2 == 1 {
                out.push(hex_val(body[0]).ok_or(ProtoError::BadText("bad hex digit"))?);
                digits.next();
            }
            while let (Some(h), Some(l)) = (digits.next(), digits.next()) {
                let h = hex_val(h).ok_or(ProtoError::BadText("bad hex digit"))?;
                let l = hex_val(l).ok_or(ProtoError::BadText("bad hex digit"))?;
                out.push(h << 4 | l);
            }
            Ok(out)
        }
        b'b' | b'B' => {
            let trimmed: &[u8] = {
                let mut end = body.len();
                while end > 0 && body[end - 1] == b'=' {
                    end -= 1;
                }
                &body[..end]
            };
            let mut out = Vec::with_capacity(trimmed.len() * 3 / 4 + 1);
            let mut acc = 0u32;
            let mut bits = 0u32;
            for &c in trimmed {
                let x = b64_val(c).ok_or(ProtoError::BadText("bad base64 digit"))?;
                acc = (acc << 6) | x as u32;
                bits += 6;
                if bits >= 8 {
                    bits -= 8;
                    out.push((acc >> bits) as u8);
                    acc &= (1 << bits) - 1;
                }
            }
            Ok(out)
        }
        _ => Err(ProtoError::BadText("binary value without 0x/0b prefix")),
    }
}

/// Parses a numeric value (decimal, or `0x` hex) such as CHAP_A or CHAP_I.
pub fn parse_number(value: &str) -> Result<u64, ProtoError> {
    let bad = ProtoError::BadText("bad number");
    if let Some(h) = value
        .strip_prefix("0x")
        .or_else(|| value.strip_prefix("0X"))
    {
        if h.is_empty() || h.len() > 16 {
            return Err(bad);
        }
        u64::from_str_radix(h, 16).map_err(|_| bad)
    } else {
        if value.is_empty() || value.len() > 20 || !value.bytes().all(|c| c.is_ascii_digit()) {
            return Err(bad);
        }
        value.parse::<u64>().map_err(|_| bad)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_and_base64() {
        assert_eq!(decode_binary("0x0aff").unwrap(), vec![0x0a, 0xff]);
        assert_eq!(decode_binary("0xaff").unwrap(), vec![0x0a, 0xff]);
        assert_eq!(decode_binary("0bAQID").unwrap(), vec![1, 2, 3]);
        assert_eq!(decode_binary("0bAQI=").unwrap(), vec![1, 2]);
        assert!(decode_binary("0xzz").is_err());
        assert!(decode_binary("12").is_err());
        assert_eq!(encode_hex(&[0, 0xab]), "0x00ab");
        assert_eq!(decode_binary(&encode_hex(&[7; 20])).unwrap(), vec![7; 20]);
    }

    #[test]
    fn numbers() {
        assert_eq!(parse_number("5").unwrap(), 5);
        assert_eq!(parse_number("0x1f").unwrap(), 31);
        assert!(parse_number("").is_err());
        assert!(parse_number("-1").is_err());
    }

    #[test]
    fn md5_response_matches_rfc1994_definition() {
        let r = response(1, b"secret", &[1, 2, 3]);
        let mut h = Md5::new();
        h.update([1u8, b's', b'e', b'c', b'r', b'e', b't', 1, 2, 3]);
        let want: [u8; 16] = h.finalize().into();
        assert_eq!(r, want);
        assert!(constant_time_eq(&r, &want));
        assert!(!constant_time_eq(&r, &want[..15]));
        assert_eq!(ChapAlgorithm::Md5.response(1, b"secret", &[1, 2, 3]), r);
    }

    #[test]
    fn sha256_response_and_choice() {
        // SHA-256 of the single byte 0x00 (id 0, empty secret and challenge).
        let r = ChapAlgorithm::Sha256.response(0, b"", b"");
        assert_eq!(
            encode_hex(&r),
            "0x6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d"
        );
        assert_eq!(ChapAlgorithm::choose("7,5"), Some(ChapAlgorithm::Sha256));
        assert_eq!(ChapAlgorithm::choose("5,7"), Some(ChapAlgorithm::Sha256));
        assert_eq!(ChapAlgorithm::choose("0x7"), Some(ChapAlgorithm::Sha256));
        assert_eq!(ChapAlgorithm::choose("9,x,"), None);
        assert_eq!(ChapAlgorithm::Sha256.challenge_len_bytes(), 32);
    }

    /// SHA-1 (6) and SHA3-256 (8), known answers from Python's hashlib; the
    /// strongest offered is chosen in any order; MD5 and SHA-1 are the weak
    /// ones.
    #[test]
    fn sha1_and_sha3_responses_and_the_order_of_choice() {
        let hex =
            |a: ChapAlgorithm, id, secret: &[u8], c: &[u8]| encode_hex(&a.response(id, secret, c));
        // (of the single byte 0x00)
        assert_eq!(
            hex(ChapAlgorithm::Sha1, 0, b"", b""),
            "0x5ba93c9db0cff93f52b521d7420e43f6eda2784f"
        );
        assert_eq!(
            hex(ChapAlgorithm::Sha3_256, 0, b"", b""),
            "0x5d53469f20fef4f8eab52b88044ede69c77a6a68a60728609fc4a65ff531e7d0"
        );
        // identifier, secret and challenge, in that order
        assert_eq!(
            hex(ChapAlgorithm::Sha3_256, 9, b"secret", &[1, 2, 3]),
            "0x81ac2519032c7362abcda921d5773e45080334edcb0b5ef22d8eeb47e5ad4e4c"
        );
        for a in ChapAlgorithm::ALL {
            assert_eq!(a.response(1, b"s", b"c").len(), a.digest_len_bytes());
            assert_eq!(ChapAlgorithm::from_code(a.code() as u64), Some(a));
        }
        let choose = ChapAlgorithm::choose;
        assert_eq!(choose("8,7,6,5"), Some(ChapAlgorithm::Sha3_256));
        assert_eq!(choose("5,6,7,8"), Some(ChapAlgorithm::Sha3_256));
        assert_eq!(choose("5,7,6"), Some(ChapAlgorithm::Sha256));
        assert_eq!(choose("6,5"), Some(ChapAlgorithm::Sha1));
        assert_eq!(choose("5"), Some(ChapAlgorithm::Md5));
        assert_eq!(choose("0x8"), Some(ChapAlgorithm::Sha3_256));
        let weak: Vec<_> = ChapAlgorithm::ALL
            .into_iter()
            .filter(|a| a.is_weak())
            .collect();
        assert_eq!(weak, [ChapAlgorithm::Md5, ChapAlgorithm::Sha1]);
    }
}
