//! CRC32C digests and 4-byte padding.
//!
//! iSCSI digests are CRC32C (Castagnoli) sent least significant byte first, the way
//! every deployed initiator does it. The data digest covers the data and its padding.

/// Zero bytes to pad any segment to a 4-byte boundary.
pub const PAD_ZEROES: [u8; 4] = [0; 4];

/// Bytes of padding after a segment of `len_bytes`.
pub fn pad_len(len_bytes: usize) -> usize {
    (4 - (len_bytes & 3)) & 3
}

/// `len_bytes` rounded up to a multiple of 4.
pub fn padded_len(len_bytes: usize) -> usize {
    len_bytes + pad_len(len_bytes)
}

/// CRC32C of the header (BHS + AHS), as the 4 wire bytes.
pub fn header_digest(header: &[u8]) -> [u8; 4] {
    crc32c::crc32c(header).to_le_bytes()
}

/// CRC32C of a data segment followed by its padding, as the 4 wire bytes.
pub fn data_digest(data: &[u8]) -> [u8; 4] {
    let crc = crc32c::crc32c(data);
    let crc = crc32c::crc32c_append(crc, &PAD_ZEROES[..pad_len(data.len())]);
    crc.to_le_bytes()
}

/// CRC32C over several buffers taken as one data segment, plus padding.
pub fn data_digest_parts(parts: &[&[u8]]) -> [u8; 4] {
    let mut crc = 0u32;
    let mut len = 0usize;
    for p in parts {
        crc = crc32c::crc32c_append(crc, p);
        len += p.len();
    }
    crc32c::crc32c_append(crc, &PAD_ZEROES[..pad_len(len)]).to_le_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc_vectors() {
        // RFC 3720 B.4: 32 bytes of zeroes -> CRC 0x8a9136aa (sent aa 36 91 8a).
        assert_eq!(header_digest(&[0u8; 32]), [0xaa, 0x36, 0x91, 0x8a]);
        // 32 bytes of 0xff -> 0x62a8ab43.
        assert_eq!(header_digest(&[0xffu8; 32]), [0x43, 0xab, 0xa8, 0x62]);
    }

    #[test]
    fn padding() {
        assert_eq!(pad_len(0), 0);
        assert_eq!(pad_len(1), 3);
        assert_eq!(pad_len(4), 0);
        assert_eq!(padded_len(5), 8);
        assert_eq!(data_digest(&[1, 2, 3]), data_digest(&[1, 2, 3, 0]));
        assert_eq!(data_digest_parts(&[&[1], &[2, 3]]), data_digest(&[1, 2, 3]));
    }
}
