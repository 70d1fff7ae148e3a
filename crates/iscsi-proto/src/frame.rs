//! Whole-PDU framing: header, AHS, data segment, padding and digests.
//!
//! [`decode_frame`] takes bytes as they arrive from a socket in a `BytesMut` and
//! splits off one complete PDU at a time without copying its data segment.

use crate::digest::{data_digest, header_digest, pad_len};
use crate::pdu::{parse_bhs, raw_data_len_bytes, Bhs, BHS_LEN};
use crate::ProtoError;
use bytes::{Buf, Bytes, BytesMut};

/// AHS type: extended CDB.
pub const AHS_EXTENDED_CDB: u8 = 1;
/// AHS type: bidirectional expected read-data length.
pub const AHS_BIDI_READ_LEN: u8 = 2;

/// What the receiver accepts on this connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameLimits {
    /// HeaderDigest=CRC32C was negotiated.
    pub header_digest: bool,
    /// DataDigest=CRC32C was negotiated.
    pub data_digest: bool,
    /// The receiver's MaxRecvDataSegmentLength.
    pub max_data_segment_bytes: u32,
    /// The largest total AHS accepted (at most 1020 by the format).
    pub max_ahs_bytes: usize,
}

impl Default for FrameLimits {
    fn default() -> Self {
        FrameLimits {
            header_digest: false,
            data_digest: false,
            max_data_segment_bytes: 8192,
            max_ahs_bytes: 256,
        }
    }
}

/// Additional Header Segments of a PDU.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Ahs {
    /// CDB bytes beyond the first 16 (extended CDB AHS).
    pub extended_cdb: Option<Bytes>,
    /// Expected read-data length of a bidirectional command.
    pub bidi_read_len_bytes: Option<u32>,
}

/// One complete initiator PDU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    /// The parsed header.
    pub bhs: Bhs,
    /// The raw 48 header bytes (for Reject, which echoes them).
    pub raw_header: [u8; BHS_LEN],
    /// The same 48 bytes as a view into the read buffer (CDB slices without copying).
    pub header_bytes: Bytes,
    /// Parsed AHS.
    pub ahs: Ahs,
    /// The data segment without padding or digest (a view into the read buffer).
    pub data: Bytes,
}

/// A framing failure, with what is needed to answer it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FrameError {
    /// What went wrong.
    pub error: ProtoError,
    /// The offending raw header, when one was read.
    pub raw_header: Option<[u8; BHS_LEN]>,
    /// The PDU was consumed from the buffer, so the stream is still in sync and the
    /// connection may go on after a Reject; when false it must be closed.
    pub consumed: bool,
}

impl FrameError {
    fn fatal(error: ProtoError, raw_header: Option<[u8; BHS_LEN]>) -> Self {
        FrameError {
            error,
            raw_header,
            consumed: false,
        }
    }
}

/// Total wire length of the PDU whose header starts `buf`, or `None` if fewer than
/// 48 bytes are present. Checks the announced lengths against `limits`.
pub fn wire_len(buf: &[u8], limits: &FrameLimits) -> Result<Option<usize>, FrameError> {
    let Some(hdr) = buf.get(..BHS_LEN) else {
        return Ok(None);
    };
    let mut raw = [0u8; BHS_LEN];
    raw.copy_from_slice(hdr);
    let ahs_len = raw[4] as usize * 4;
    if ahs_len > limits.max_ahs_bytes {
        return Err(FrameError::fatal(
            ProtoError::BadAhs("total AHS length above the limit"),
            Some(raw),
        ));
    }
    let data_len = raw_data_len_bytes(&raw);
    if data_len > limits.max_data_segment_bytes {
        return Err(FrameError::fatal(
            ProtoError::DataSegmentTooLong {
                len_bytes: data_len,
                max_bytes: limits.max_data_segment_bytes,
            },
            Some(raw),
        ));
    }
    let data_len = data_len as usize;
    let mut total = BHS_LEN + ahs_len + data_len + pad_len(data_len);
    if limits.header_digest {
        total += 4;
    }
    if limits.data_digest && data_len > 0 {
        total += 4;
    }
    Ok(Some(total))
}

/// Smallest read attempted into a read buffer.
pub const READ_CHUNK_BYTES: usize = 64 * 1024;

/// Makes room in `buf` for at least the rest of the PDU being received.
pub fn reserve_for_next(buf: &mut BytesMut, limits: &FrameLimits) {
    let need = match wire_len(buf, limits) {
        Ok(Some(total)) => total.saturating_sub(buf.len()),
        _ => 0,
    };
    buf.reserve(need.max(READ_CHUNK_BYTES));
}

/// Splits one complete PDU off the front of `buf`. `Ok(None)` means more bytes are
/// needed (the caller may reserve [`wire_len`] bytes before reading).
pub fn decode_frame(buf: &mut BytesMut, limits: &FrameLimits) -> Result<Option<Frame>, FrameError> {
    let Some(total) = wire_len(buf, limits)? else {
        return Ok(None);
    };
    if buf.len() < total {
        return Ok(None);
    }
    let mut raw = [0u8; BHS_LEN];
    raw.copy_from_slice(&buf[..BHS_LEN]);
    let ahs_len = raw[4] as usize * 4;
    let hdr_end = BHS_LEN + ahs_len;
    if limits.header_digest {
        let got = [
            buf[hdr_end],
            buf[hdr_end + 1],
            buf[hdr_end + 2],
            buf[hdr_end + 3],
        ];
        if got != header_digest(&buf[..hdr_end]) {
            return Err(FrameError::fatal(ProtoError::HeaderDigest, Some(raw)));
        }
    }
    let data_start = hdr_end + if limits.header_digest { 4 } else { 0 };
    let data_len = raw_data_len_bytes(&raw) as usize;
    let mut pdu = buf.split_to(total).freeze();
    let ahs_bytes = pdu.slice(BHS_LEN..hdr_end);
    let header_bytes = pdu.slice(..BHS_LEN);
    if limits.data_digest && data_len > 0 {
        let padded = data_len + pad_len(data_len);
        let d = &pdu[data_start + padded..data_start + padded + 4];
        if d != data_digest(&pdu[data_start..data_start + data_len]) {
            return Err(FrameError {
                error: ProtoError::DataDigest,
                raw_header: Some(raw),
                consumed: true,
            });
        }
    }
    pdu.advance(data_start);
    pdu.truncate(data_len);
    let consumed_err = |error| FrameError {
        error,
        raw_header: Some(raw),
        consumed: true,
    };
    let bhs = parse_bhs(&raw).map_err(consumed_err)?;
    let ahs = parse_ahs(ahs_bytes).map_err(consumed_err)?;
    Ok(Some(Frame {
        bhs,
        raw_header: raw,
        header_bytes,
        ahs,
        data: pdu,
    }))
}

/// Parses the AHS area (a sequence of type-length-value segments, each padded to 4).
pub fn parse_ahs(mut bytes: Bytes) -> Result<Ahs, ProtoError> {
    let mut ahs = Ahs::default();
    while !bytes.is_empty() {
        if bytes.len() < 4 {
            return Err(ProtoError::BadAhs("truncated AHS header"));
        }
        let len = u16::from_be_bytes([bytes[0], bytes[1]]) as usize;
        let ty = bytes[2];
        // AHSLength counts the specific field including its leading reserved byte.
        let seg = 3 + len;
        let seg_padded = seg + pad_len(seg);
        if len == 0 || bytes.len() < seg {
            return Err(ProtoError::BadAhs("AHS length beyond the header"));
        }
        match ty {
            AHS_EXTENDED_CDB => {
                if ahs.extended_cdb.is_some() {
                    return Err(ProtoError::BadAhs("two extended CDB AHS"));
                }
                ahs.extended_cdb = Some(bytes.slice(4..seg));
            }
            AHS_BIDI_READ_LEN => {
                if len != 5 {
                    return Err(ProtoError::BadAhs("bidirectional read length AHS size"));
                }
                ahs.bidi_read_len_bytes =
                    Some(u32::from_be_bytes([bytes[4], bytes[5], bytes[6], bytes[7]]));
            }
            _ => return Err(ProtoError::BadAhs("unknown AHS type")),
        }
        bytes.advance(seg_padded.min(bytes.len()));
    }
    Ok(ahs)
}

/// Encodes AHS segments (for initiators and tests).
pub fn encode_ahs(ahs: &Ahs) -> Vec<u8> {
    let mut out = Vec::new();
    if let Some(cdb) = &ahs.extended_cdb {
        let len = cdb.len() + 1;
        out.extend_from_slice(&(len as u16).to_be_bytes());
        out.push(AHS_EXTENDED_CDB);
        out.push(0);
        out.extend_from_slice(cdb);
        out.resize(out.len() + pad_len(3 + len), 0);
    }
    if let Some(n) = ahs.bidi_read_len_bytes {
        out.extend_from_slice(&[0, 5, AHS_BIDI_READ_LEN, 0]);
        out.extend_from_slice(&n.to_be_bytes());
    }
    out
}

/// Serializes a whole PDU: header (+AHS), optional header digest, data, padding,
/// optional data digest. Used by tests, fuzzers and simple initiators; the target's
/// writer builds vectored writes instead.
pub fn encode_frame(
    header: &[u8; BHS_LEN],
    ahs: &[u8],
    data: &[u8],
    header_digest_on: bool,
    data_digest_on: bool,
) -> Vec<u8> {
    let mut out = Vec::with_capacity(BHS_LEN + ahs.len() + data.len() + 12);
    out.extend_from_slice(header);
    out.extend_from_slice(ahs);
    if header_digest_on {
        let d = header_digest(&out);
        out.extend_from_slice(&d);
    }
    out.extend_from_slice(data);
    out.resize(out.len() + pad_len(data.len()), 0);
    if data_digest_on && !data.is_empty() {
        out.extend_from_slice(&data_digest(data));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pdu::{encode_initiator_bhs, InitiatorPdu, NopOut, ScsiCommand};

    fn nop(data_len: u32) -> [u8; BHS_LEN] {
        encode_initiator_bhs(
            &InitiatorPdu::NopOut(NopOut {
                lun: 0,
                itt: 7,
                ttt: 0xffff_ffff,
                cmd_sn: 1,
                exp_stat_sn: 1,
            }),
            true,
            0,
            data_len,
        )
    }

    #[test]
    fn frame_with_digests_and_padding() {
        let limits = FrameLimits {
            header_digest: true,
            data_digest: true,
            ..FrameLimits::default()
        };
        let wire = encode_frame(&nop(5), &[], b"hello", true, true);
        assert_eq!(wire.len(), 48 + 4 + 8 + 4);
        let mut buf = BytesMut::from(&wire[..wire.len() - 1]);
        assert!(decode_frame(&mut buf, &limits).unwrap().is_none());
        buf.extend_from_slice(&wire[wire.len() - 1..]);
        let f = decode_frame(&mut buf, &limits).unwrap().unwrap();
        assert_eq!(&f.data[..], b"hello");
        assert!(buf.is_empty());
    }

    #[test]
    fn digest_errors() {
        let limits = FrameLimits {
            header_digest: true,
            data_digest: true,
            ..FrameLimits::default()
        };
        let mut wire = encode_frame(&nop(4), &[], b"abcd", true, true);
        wire[20] ^= 1;
        let e = decode_frame(&mut BytesMut::from(&wire[..]), &limits).unwrap_err();
        assert_eq!(e.error, ProtoError::HeaderDigest);
        assert!(!e.consumed);
        let mut wire = encode_frame(&nop(4), &[], b"abcd", true, true);
        wire[53] ^= 1;
        let mut buf = BytesMut::from(&wire[..]);
        let e = decode_frame(&mut buf, &limits).unwrap_err();
        assert_eq!(e.error, ProtoError::DataDigest);
        assert!(e.consumed && buf.is_empty());
    }

    #[test]
    fn oversized_segment_and_unknown_opcode() {
        let limits = FrameLimits::default();
        let mut buf = BytesMut::from(&nop(9000)[..]);
        let e = decode_frame(&mut buf, &limits).unwrap_err();
        assert!(matches!(e.error, ProtoError::DataSegmentTooLong { .. }));
        let mut h = nop(0);
        h[0] = 0x1e;
        let mut buf = BytesMut::from(&h[..]);
        let e = decode_frame(&mut buf, &limits).unwrap_err();
        assert_eq!(e.error, ProtoError::UnknownOpcode(0x1e));
        assert!(e.consumed);
    }

    #[test]
    fn ahs_roundtrip() {
        let ahs = Ahs {
            extended_cdb: Some(Bytes::from_static(&[9u8; 16])),
            bidi_read_len_bytes: Some(4096),
        };
        let raw = encode_ahs(&ahs);
        assert_eq!(raw.len() % 4, 0);
        let cmd = InitiatorPdu::ScsiCommand(ScsiCommand {
            final_bit: true,
            read: true,
            write: false,
            attr: 1,
            lun: 0,
            itt: 1,
            edtl_bytes: 0,
            cmd_sn: 1,
            exp_stat_sn: 0,
            cdb: [0; 16],
        });
        let h = encode_initiator_bhs(&cmd, false, raw.len(), 0);
        let wire = encode_frame(&h, &raw, &[], false, false);
        let f = decode_frame(&mut BytesMut::from(&wire[..]), &FrameLimits::default())
            .unwrap()
            .unwrap();
        assert_eq!(f.ahs, ahs);
        assert!(parse_ahs(Bytes::from_static(&[0, 9, 1, 0])).is_err());
        assert!(parse_ahs(Bytes::from_static(&[0, 1, 7, 0])).is_err());
    }
}
