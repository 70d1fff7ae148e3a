//! Text parameters: `key=value` pairs separated by NUL bytes, and reassembly of
//! text that spans several PDUs (C bit).

use crate::ProtoError;

/// Most keys accepted in one text exchange.
pub const KEYS_MAX: usize = 128;
/// Longest key name (RFC 7143: 63 bytes).
pub const KEY_LEN_MAX: usize = 63;
/// Longest value (binary values such as CHAP_C in hex: 1024 bytes -> 2050 chars;
/// text values up to 255 bytes; SendTargets answers are built, never parsed, here).
pub const VALUE_LEN_MAX: usize = 8192;
/// Most bytes of text reassembled from continued PDUs.
pub const TEXT_BYTES_MAX: usize = 64 * 1024;

/// Parsed `key=value` pairs in arrival order.
pub type TextPairs = Vec<(String, String)>;

fn valid_key(k: &str) -> bool {
    !k.is_empty()
        && k.len() <= KEY_LEN_MAX
        && k.bytes()
            .all(|c| c.is_ascii_alphanumeric() || b".-+@_:".contains(&c))
}

/// Parses a NUL-separated list of `key=value`. A missing final NUL is tolerated,
/// empty entries (double NUL, padding) are skipped.
pub fn parse_text(data: &[u8]) -> Result<TextPairs, ProtoError> {
    if data.len() > TEXT_BYTES_MAX {
        return Err(ProtoError::TextTooLarge(
            "text longer than the reassembly bound",
        ));
    }
    let mut out = Vec::new();
    for entry in data.split(|&b| b == 0) {
        if entry.is_empty() {
            continue;
        }
        if out.len() >= KEYS_MAX {
            return Err(ProtoError::TextTooLarge("too many keys"));
        }
        let eq = entry
            .iter()
            .position(|&b| b == b'=')
            .ok_or(ProtoError::BadText("entry without '='"))?;
        let key =
            std::str::from_utf8(&entry[..eq]).map_err(|_| ProtoError::BadText("key not UTF-8"))?;
        if key.len() > KEY_LEN_MAX {
            return Err(ProtoError::TextTooLarge("key too long"));
        }
        if !valid_key(key) {
            return Err(ProtoError::BadText("invalid key name"));
        }
        let value = &entry[eq + 1..];
        if value.len() > VALUE_LEN_MAX {
            return Err(ProtoError::TextTooLarge("value too long"));
        }
        let value =
            std::str::from_utf8(value).map_err(|_| ProtoError::BadText("value not UTF-8"))?;
        out.push((key.to_string(), value.to_string()));
    }
    Ok(out)
}

/// Appends `key=value\0` to `out`.
pub fn push_pair(out: &mut Vec<u8>, key: &str, value: &str) {
    out.extend_from_slice(key.as_bytes());
    out.push(b'=');
    out.extend_from_slice(value.as_bytes());
    out.push(0);
}

/// Encodes pairs as NUL-terminated `key=value` entries.
pub fn encode_text<K: AsRef<str>, V: AsRef<str>>(pairs: &[(K, V)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (k, v) in pairs {
        push_pair(&mut out, k.as_ref(), v.as_ref());
    }
    out
}

/// Reassembles text that arrives in several PDUs (C bit), within [`TEXT_BYTES_MAX`].
#[derive(Debug, Default, Clone)]
pub struct TextAccumulator {
    buf: Vec<u8>,
}

impl TextAccumulator {
    /// An empty accumulator.
    pub fn new() -> Self {
        TextAccumulator::default()
    }

    /// Adds one PDU's data. With `cont` the text goes on in the next PDU and `None`
    /// is returned; otherwise the complete text is returned and the accumulator is
    /// emptied. A key or value may be split across PDUs.
    pub fn push(&mut self, data: &[u8], cont: bool) -> Result<Option<Vec<u8>>, ProtoError> {
        if self.buf.len() + data.len() > TEXT_BYTES_MAX {
            self.buf.clear();
            return Err(ProtoError::TextTooLarge("continued text above the bound"));
        }
        self.buf.extend_from_slice(data);
        if cont {
            Ok(None)
        } else {
            Ok(Some(std::mem::take(&mut self.buf)))
        }
    }

    /// Whether a continued text is being collected.
    pub fn in_progress(&self) -> bool {
        !self.buf.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_and_encode() {
        let raw = encode_text(&[("InitiatorName", "iqn.x:y"), ("SessionType", "Normal")]);
        assert_eq!(raw, b"InitiatorName=iqn.x:y\0SessionType=Normal\0");
        let p = parse_text(&raw).unwrap();
        assert_eq!(p[0], ("InitiatorName".into(), "iqn.x:y".into()));
        assert_eq!(p.len(), 2);
        assert_eq!(parse_text(b"A=1\0\0B=\0").unwrap().len(), 2);
        assert_eq!(parse_text(b"A=1").unwrap().len(), 1);
    }

    #[test]
    fn bounds() {
        assert!(parse_text(b"novalue\0").is_err());
        assert!(parse_text(b"=x\0").is_err());
        assert!(parse_text(&[b'A', b'=', 0xff, 0]).is_err());
        let long = format!("A={}\0", "x".repeat(VALUE_LEN_MAX + 1));
        assert!(matches!(
            parse_text(long.as_bytes()),
            Err(ProtoError::TextTooLarge(_))
        ));
        let many: String = (0..KEYS_MAX + 1).map(|i| format!("K{i}=1\0")).collect();
        assert!(matches!(
            parse_text(many.as_bytes()),
            Err(ProtoError::TextTooLarge(_))
        ));
        let longkey = format!("{}=1\0", "K".repeat(KEY_LEN_MAX + 1));
        assert!(parse_text(longkey.as_bytes()).is_err());
    }

    #[test]
    fn continuation() {
        let mut acc = TextAccumulator::new();
        assert_eq!(acc.push(b"Initiator", true).unwrap(), None);
        assert!(acc.in_progress());
        let all = acc.push(b"Name=iqn.a\0", false).unwrap().unwrap();
        assert_eq!(parse_text(&all).unwrap()[0].1, "iqn.a");
        let big = vec![b'a'; TEXT_BYTES_MAX];
        assert!(acc.push(&big, true).is_ok());
        assert!(acc.push(b"x", false).is_err());
    }
}
