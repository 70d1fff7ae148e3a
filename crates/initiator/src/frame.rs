//! Framing of target PDUs (the codec's `decode_frame` parses initiator headers only)
//! and serialization of outgoing initiator PDUs with digests.

use crate::InitiatorError;
use bytes::{Bytes, BytesMut};
use iscsi_proto::digest::{data_digest, header_digest, pad_len, PAD_ZEROES};
use iscsi_proto::frame::{wire_len, FrameLimits};
use iscsi_proto::pdu::BHS_LEN;
use iscsi_proto::target::{parse_target_bhs, SeqNumbers, TargetPdu};

/// Offset of ExpStatSN in every initiator PDU header; the writer stamps it last.
pub(crate) const EXP_STAT_SN_OFFSET: usize = 28;

/// One complete target PDU, borrowed from the receive buffer.
#[derive(Debug, Clone, Copy)]
pub(crate) struct FrameRef<'a> {
    pub pdu: TargetPdu,
    pub seq: SeqNumbers,
    pub raw_header: &'a [u8; BHS_LEN],
    pub data: &'a [u8],
}

/// One complete target PDU with its data segment (owned; for login, discovery,
/// tests and fuzzing).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetFrame {
    /// The parsed header.
    pub pdu: TargetPdu,
    /// StatSN, ExpCmdSN, MaxCmdSN of the PDU.
    pub seq: SeqNumbers,
    /// The raw 48 header bytes.
    pub raw_header: [u8; BHS_LEN],
    /// The data segment without padding or digest.
    pub data: Bytes,
}

fn proto_err(e: iscsi_proto::frame::FrameError) -> InitiatorError {
    InitiatorError::Proto(e.error)
}

/// Looks at the front of `buf`: `Ok(None)` when more bytes are needed (the second
/// value then tells how many bytes the whole PDU needs, when known), otherwise the
/// frame and its wire length. Digests are checked; nothing is consumed.
pub(crate) fn peek_frame<'a>(
    buf: &'a [u8],
    limits: &FrameLimits,
) -> Result<Result<(FrameRef<'a>, usize), Option<usize>>, InitiatorError> {
    let total = match wire_len(buf, limits).map_err(proto_err)? {
        None => return Ok(Err(None)),
        Some(t) => t,
    };
    if buf.len() < total {
        return Ok(Err(Some(total)));
    }
    let raw: &[u8; BHS_LEN] = buf[..BHS_LEN]
        .try_into()
        .map_err(|_| InitiatorError::Protocol("short header".into()))?;
    let hdr_end = BHS_LEN + raw[4] as usize * 4;
    let mut data_start = hdr_end;
    if limits.header_digest {
        if buf[hdr_end..hdr_end + 4] != header_digest(&buf[..hdr_end]) {
            return Err(InitiatorError::Proto(iscsi_proto::ProtoError::HeaderDigest));
        }
        data_start += 4;
    }
    let (pdu, seq, dl) = parse_target_bhs(raw)?;
    let dl = dl as usize;
    let data = &buf[data_start..data_start + dl];
    if limits.data_digest && dl > 0 {
        let d = data_start + dl + pad_len(dl);
        if buf[d..d + 4] != data_digest(data) {
            return Err(InitiatorError::Proto(iscsi_proto::ProtoError::DataDigest));
        }
    }
    Ok(Ok((
        FrameRef {
            pdu,
            seq,
            raw_header: raw,
            data,
        },
        total,
    )))
}

/// Splits one complete target PDU off the front of `buf`; `Ok(None)` means more
/// bytes are needed. Any error means the stream cannot be trusted any more.
pub fn decode_target_frame(
    buf: &mut BytesMut,
    limits: &FrameLimits,
) -> Result<Option<TargetFrame>, InitiatorError> {
    let (frame, total) = match peek_frame(buf, limits)? {
        Err(_) => return Ok(None),
        Ok((f, total)) => (
            TargetFrame {
                pdu: f.pdu,
                seq: f.seq,
                raw_header: *f.raw_header,
                data: Bytes::copy_from_slice(f.data),
            },
            total,
        ),
    };
    let _ = buf.split_to(total);
    Ok(Some(frame))
}

/// An initiator PDU waiting in the outbox. ExpStatSN is stamped by the writer.
#[derive(Debug, Clone)]
pub(crate) struct OutPdu {
    pub header: [u8; BHS_LEN],
    /// Additional header segments (extended CDB); empty almost always.
    pub ahs: Vec<u8>,
    pub data: Bytes,
}

/// Appends header (+AHS) and its digest.
pub(crate) fn put_header(out: &mut BytesMut, pdu: &OutPdu, hd: bool) {
    let start = out.len();
    out.extend_from_slice(&pdu.header);
    out.extend_from_slice(&pdu.ahs);
    if hd {
        let d = header_digest(&out[start..]);
        out.extend_from_slice(&d);
    }
}

/// Appends padding and data digest of a data segment already written.
pub(crate) fn put_data_trailer(out: &mut BytesMut, data: &[u8], dd: bool) {
    out.extend_from_slice(&PAD_ZEROES[..pad_len(data.len())]);
    if dd && !data.is_empty() {
        out.extend_from_slice(&data_digest(data));
    }
}

/// Serializes a whole PDU into `out`.
pub(crate) fn put_pdu(out: &mut BytesMut, pdu: &OutPdu, hd: bool, dd: bool) {
    put_header(out, pdu, hd);
    out.extend_from_slice(&pdu.data);
    put_data_trailer(out, &pdu.data, dd);
}

#[cfg(test)]
mod tests {
    use super::*;
    use iscsi_proto::target::NopIn;

    #[test]
    fn roundtrip_with_digests() {
        let limits = FrameLimits {
            header_digest: true,
            data_digest: true,
            max_data_segment_bytes: 1024,
            max_ahs_bytes: 0,
        };
        let h = TargetPdu::NopIn(NopIn {
            lun: 0,
            itt: 5,
            ttt: 0xffff_ffff,
        })
        .encode(&SeqNumbers::default(), 3);
        let wire = iscsi_proto::frame::encode_frame(&h, &[], b"abc", true, true);
        let mut buf = BytesMut::from(&wire[..wire.len() - 2]);
        assert!(decode_target_frame(&mut buf, &limits).unwrap().is_none());
        buf.extend_from_slice(&wire[wire.len() - 2..]);
        let f = decode_target_frame(&mut buf, &limits).unwrap().unwrap();
        assert_eq!(&f.data[..], b"abc");
        assert!(buf.is_empty());
        let mut bad = wire.clone();
        bad[50] ^= 1;
        assert!(decode_target_frame(&mut BytesMut::from(&bad[..]), &limits).is_err());
        let mut bad = wire.clone();
        bad[52] ^= 1;
        assert!(decode_target_frame(&mut BytesMut::from(&bad[..]), &limits).is_err());
    }
}
