//! CHAP (RFC 1994) as iSCSI uses it (RFC 7143 section 12.1.3): MD5 (CHAP_A=5) and
//! SHA-256 (CHAP_A=7, from the IANA CHAP algorithm registry), binary values in hex
//! (`0x...`) or base64 (`0b...`). The digests are RustCrypto's `md-5` and `sha2`.

use crate::ProtoError;
use md5::{Digest, Md5};
use sha2::Sha256;

/// CHAP_A value of MD5.
pub const CHAP_ALGORITHM_MD5: u32 = 5;
/// CHAP_A value of SHA-256.
pub const CHAP_ALGORITHM_SHA256: u32 = 7;
/// Length of the challenges this target sends with MD5.
pub const CHALLENGE_LEN_BYTES: usize = 16;
/// Longest challenge accepted from an initiator (RFC 7143 allows 1024 bytes).
pub const CHALLENGE_LEN_MAX_BYTES: usize = 1024;

/// A CHAP digest algorithm this target speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChapAlgorithm {
    /// MD5, CHAP_A=5: the RFC 7143 baseline every initiator has.
    Md5,
    /// SHA-256, CHAP_A=7.
    Sha256,
}

impl ChapAlgorithm {
    /// The CHAP_A number.
    pub fn code(self) -> u32 {
        match self {
            ChapAlgorithm::Md5 => CHAP_ALGORITHM_MD5,
            ChapAlgorithm::Sha256 => CHAP_ALGORITHM_SHA256,
        }
    }

    /// The algorithm with CHAP_A number `code`, if supported.
    pub fn from_code(code: u64) -> Option<ChapAlgorithm> {
        match code {
            5 => Some(ChapAlgorithm::Md5),
            7 => Some(ChapAlgorithm::Sha256),
            _ => None,
        }
    }

    /// Picks from an initiator's CHAP_A list (`7,5`): SHA-256 whenever it is
    /// offered, else MD5; None when neither is. Unknown or malformed entries are
    /// skipped; at most the first 64 entries are looked at.
    pub fn choose(offer: &str) -> Option<ChapAlgorithm> {
        let mut best = None;
        for a in offer.split(',').take(64) {
            match parse_number(a).ok().and_then(ChapAlgorithm::from_code) {
                Some(ChapAlgorithm::Sha256) => return Some(ChapAlgorithm::Sha256),
                Some(ChapAlgorithm::Md5) => best = Some(ChapAlgorithm::Md5),
                None => {}
            }
        }
        best
    }

    /// Length of a response (the digest) in bytes.
    pub fn digest_len_bytes(self) -> usize {
        match self {
            ChapAlgorithm::Md5 => 16,
            ChapAlgorithm::Sha256 => 32,
        }
    }

    /// Length of the challenges this target sends: as long as the digest.
    pub fn challenge_len_bytes(self) -> usize {
        self.digest_len_bytes()
    }

    /// The CHAP response: H(identifier || secret || challenge).
    pub fn response(self, id: u8, secret: &[u8], challenge: &[u8]) -> Vec<u8> {
        match self {
            ChapAlgorithm::Md5 => response(id, secret, challenge).to_vec(),
            ChapAlgorithm::Sha256 => {
                let mut h = Sha256::new();
                h.update([id]);
                h.update(secret);
                h.update(challenge);
                h.finalize().to_vec()
            }
        }
    }
}

/// The MD5 CHAP response: MD5(identifier || secret || challenge).
pub fn response(id: u8, secret: &[u8], challenge: &[u8]) -> [u8; 16] {
    let mut h = Md5::new();
    h.update([id]);
    h.update(secret);
    h.update(challenge);
    h.finalize().into()
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
        assert_eq!(ChapAlgorithm::choose("8,6,5"), Some(ChapAlgorithm::Md5));
        assert_eq!(ChapAlgorithm::choose("0x7"), Some(ChapAlgorithm::Sha256));
        assert_eq!(ChapAlgorithm::choose("6,x,"), None);
        assert_eq!(ChapAlgorithm::Sha256.challenge_len_bytes(), 32);
    }
}
