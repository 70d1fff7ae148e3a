//! Encoding and decoding of frames.
//!
//! Every [`Message`] variant has its own frame kind (the `kind` field of the
//! header), and its body is the variant's fields in declaration order, with no
//! padding:
//!
//! ```text
//! kind  variant          body
//! 0x01  Hello            node_id u8, volume str, block_size_bytes u32,
//!                        block_count u64, region_bytes u32,
//!                        gens.current u64, gens.synced u64, flags u32
//! 0x02  Bitmap           first_region u64, bits blob
//! 0x03  BitmapDone       (empty)
//! 0x04  Apply            id u64, op
//! 0x05  Forward          id u64, op
//! 0x06  ApplyForwarded   id u64, forward_id u64
//! 0x07  ResyncData       id u64, lba u64, data blob
//! 0x08  ResyncDone       id u64, gens.current u64, gens.synced u64
//! 0x09  Done             id u64, result
//! 0x0a  ScsiRequest      id u64, data blob
//! 0x0b  ScsiReply        id u64, data blob
//! 0x0c  Detach           reason str
//! 0x0d  CopyEnd          id u64, copy u64
//! 0x0e  Refused          reason text (str, up to REASON_BYTES_MAX bytes)
//! 0x10  Ping             seq u64
//! 0x11  Pong             seq u64
//! 0x12  Repair           id u64, lba u64, blocks u64
//! 0x13  ReadCopy         id u64, lba u64, blocks u64
//! 0x14  CopyData         id u64, data blob
//! 0x15  RepairData       id u64, lba u64, data blob
//! 0x20  WitnessClaim     cluster str, node_id u8, seq u64
//! 0x21  WitnessRelease   cluster str, node_id u8, seq u64
//! 0x22  WitnessAnswer    holder u8
//! ```
//!
//! Field encodings (integers big-endian):
//!
//! ```text
//! blob    u32 length, then that many bytes
//! str     u32 length (<= NAME_BYTES_MAX), then that many bytes of UTF-8
//! bool    u8, 0 or 1 (anything else is malformed)
//! op      u8 tag, then:
//!           0 Write            lba u64, fua bool, data blob
//!           1 WriteZeroes      lba u64, blocks u64, may_unmap bool
//!           2 Discard          lba u64, blocks u64
//!           3 Flush            (nothing)
//!           4 CompareAndWrite  lba u64, fua bool, compare blob, data blob
//!                              (both blobs of the same length)
//!           5 Grow             block_count u64
//!           6 CopyWrite        copy u64, lba u64, fua bool, data blob
//! result  u8 tag, then:
//!           0 Ok               (nothing)
//!           1 Miscompare       offset u32
//!           2 Error            code u8, lba u64
//! ```
//!
//! The encoding is canonical: a frame [`decode`] accepts re-encodes to the very
//! same bytes.

use crate::{
    Generations, Message, Op, OpResult, ProtoError, FRAME_HEADER_BYTES, MAGIC, NAME_BYTES_MAX,
    PAYLOAD_BYTES_MAX, PROTO_VERSION,
};
use bytes::{BufMut, Bytes, BytesMut};

/// Frame kinds (see the table in the module doc).
mod kind {
    pub const HELLO: u16 = 0x01;
    pub const BITMAP: u16 = 0x02;
    pub const BITMAP_DONE: u16 = 0x03;
    pub const APPLY: u16 = 0x04;
    pub const FORWARD: u16 = 0x05;
    pub const APPLY_FORWARDED: u16 = 0x06;
    pub const RESYNC_DATA: u16 = 0x07;
    pub const RESYNC_DONE: u16 = 0x08;
    pub const DONE: u16 = 0x09;
    pub const SCSI_REQUEST: u16 = 0x0a;
    pub const SCSI_REPLY: u16 = 0x0b;
    pub const DETACH: u16 = 0x0c;
    pub const COPY_END: u16 = 0x0d;
    pub const REFUSED: u16 = 0x0e;
    pub const PING: u16 = 0x10;
    pub const PONG: u16 = 0x11;
    pub const REPAIR: u16 = 0x12;
    pub const READ_COPY: u16 = 0x13;
    pub const COPY_DATA: u16 = 0x14;
    pub const REPAIR_DATA: u16 = 0x15;
    pub const WITNESS_CLAIM: u16 = 0x20;
    pub const WITNESS_RELEASE: u16 = 0x21;
    pub const WITNESS_ANSWER: u16 = 0x22;
}

/// Tags of an [`Op`].
mod op_tag {
    pub const WRITE: u8 = 0;
    pub const WRITE_ZEROES: u8 = 1;
    pub const DISCARD: u8 = 2;
    pub const FLUSH: u8 = 3;
    pub const COMPARE_AND_WRITE: u8 = 4;
    pub const GROW: u8 = 5;
    pub const COPY_WRITE: u8 = 6;
}

/// Tags of an [`OpResult`].
mod result_tag {
    pub const OK: u8 = 0;
    pub const MISCOMPARE: u8 = 1;
    pub const ERROR: u8 = 2;
}

/// Appends the frame of `msg` to `out`.
///
/// Callers keep names within [`NAME_BYTES_MAX`] bytes and bodies within
/// [`PAYLOAD_BYTES_MAX`]; encode never panics when they do not: a longer name is
/// truncated (at a character boundary), and a body too long is still written, with
/// its length saturated to `u32::MAX` if need be, so the peer rejects it with
/// [`ProtoError::TooLong`].
pub fn encode(msg: &Message, out: &mut BytesMut) {
    let start = out.len();
    out.reserve(FRAME_HEADER_BYTES + body_size_hint(msg));
    out.put_u32(MAGIC);
    out.put_u16(PROTO_VERSION);
    out.put_u16(0); // kind, patched below
    out.put_u32(0); // length, patched below
    out.put_u32(0); // crc, patched below
    let kind = put_body(msg, out);
    let body = &out[start + FRAME_HEADER_BYTES..];
    let len = u32::try_from(body.len()).unwrap_or(u32::MAX);
    let crc = crc32c::crc32c(body);
    out[start + 6..start + 8].copy_from_slice(&kind.to_be_bytes());
    out[start + 8..start + 12].copy_from_slice(&len.to_be_bytes());
    out[start + 12..start + 16].copy_from_slice(&crc.to_be_bytes());
}

/// Takes one whole frame off the front of `buf` and decodes it; `Ok(None)` when
/// `buf` does not hold a whole frame yet (nothing is consumed then).
///
/// On success exactly the frame is consumed, and the data payloads of the message
/// are slices of it (no copy). Checks, in order: magic, version, length (from the
/// header alone, before the body arrives), CRC, kind, then the body, strictly.
/// After an error the stream is unusable and how much of `buf` was consumed is
/// unspecified.
pub fn decode(buf: &mut BytesMut) -> Result<Option<Message>, ProtoError> {
    if buf.len() < FRAME_HEADER_BYTES {
        return Ok(None);
    }
    let magic = be_u32(&buf[0..4]);
    if magic != MAGIC {
        return Err(ProtoError::BadMagic(magic));
    }
    let version = be_u16(&buf[4..6]);
    if version != PROTO_VERSION {
        return Err(ProtoError::Version(version));
    }
    let kind = be_u16(&buf[6..8]);
    let len = be_u32(&buf[8..12]);
    if len > PAYLOAD_BYTES_MAX {
        return Err(ProtoError::TooLong(len));
    }
    let crc = be_u32(&buf[12..16]);
    // `len` is at most PAYLOAD_BYTES_MAX, so this fits any usize of 32 bits or more.
    let frame_len = FRAME_HEADER_BYTES + len as usize;
    let Some(body) = buf.get(FRAME_HEADER_BYTES..frame_len) else {
        return Ok(None);
    };
    if crc32c::crc32c(body) != crc {
        return Err(ProtoError::Crc);
    }
    if !is_known_kind(kind) {
        return Err(ProtoError::Kind(kind));
    }
    let body = buf.split_to(frame_len).freeze().slice(FRAME_HEADER_BYTES..);
    parse_body(kind, body).map(Some)
}

fn be_u16(b: &[u8]) -> u16 {
    let mut a = [0; 2];
    a.copy_from_slice(b);
    u16::from_be_bytes(a)
}

fn be_u32(b: &[u8]) -> u32 {
    let mut a = [0; 4];
    a.copy_from_slice(b);
    u32::from_be_bytes(a)
}

fn is_known_kind(k: u16) -> bool {
    matches!(
        k,
        kind::HELLO
            | kind::BITMAP
            | kind::BITMAP_DONE
            | kind::APPLY
            | kind::FORWARD
            | kind::APPLY_FORWARDED
            | kind::RESYNC_DATA
            | kind::RESYNC_DONE
            | kind::DONE
            | kind::SCSI_REQUEST
            | kind::SCSI_REPLY
            | kind::DETACH
            | kind::REFUSED
            | kind::COPY_END
            | kind::PING
            | kind::PONG
            | kind::REPAIR
            | kind::READ_COPY
            | kind::COPY_DATA
            | kind::REPAIR_DATA
            | kind::WITNESS_CLAIM
            | kind::WITNESS_RELEASE
            | kind::WITNESS_ANSWER
    )
}

// ---------------------------------------------------------------- encoding

/// Bytes of the body of `msg`, near enough to reserve the room up front.
fn body_size_hint(msg: &Message) -> usize {
    let op = |op: &Op| match op {
        Op::Write { data, .. } => 14 + data.len(),
        Op::CopyWrite { data, .. } => 22 + data.len(),
        Op::CompareAndWrite { compare, data, .. } => 18 + compare.len() + data.len(),
        _ => 18,
    };
    match msg {
        Message::Hello { volume, .. } => 41 + volume.len(),
        Message::Bitmap { bits, .. } => 12 + bits.len(),
        Message::Apply { op: o, .. } | Message::Forward { op: o, .. } => 8 + op(o),
        Message::ResyncData { data, .. } | Message::RepairData { data, .. } => 20 + data.len(),
        Message::ScsiRequest { data, .. }
        | Message::ScsiReply { data, .. }
        | Message::CopyData { data, .. } => 12 + data.len(),
        Message::WitnessClaim { cluster, .. } | Message::WitnessRelease { cluster, .. } => {
            13 + cluster.len()
        }
        _ => 24,
    }
}

/// Writes the body of `msg` and returns its kind.
fn put_body(msg: &Message, out: &mut BytesMut) -> u16 {
    match msg {
        Message::Hello {
            node_id,
            volume,
            block_size_bytes,
            block_count,
            region_bytes,
            gens,
            flags,
        } => {
            out.put_u8(*node_id);
            put_str(out, volume);
            out.put_u32(*block_size_bytes);
            out.put_u64(*block_count);
            out.put_u32(*region_bytes);
            put_gens(out, gens);
            out.put_u32(*flags);
            kind::HELLO
        }
        Message::Bitmap { first_region, bits } => {
            out.put_u64(*first_region);
            put_blob(out, bits);
            kind::BITMAP
        }
        Message::BitmapDone => kind::BITMAP_DONE,
        Message::Apply { id, op } => {
            out.put_u64(*id);
            put_op(out, op);
            kind::APPLY
        }
        Message::Forward { id, op } => {
            out.put_u64(*id);
            put_op(out, op);
            kind::FORWARD
        }
        Message::ApplyForwarded { id, forward_id } => {
            out.put_u64(*id);
            out.put_u64(*forward_id);
            kind::APPLY_FORWARDED
        }
        Message::ResyncData { id, lba, data } => {
            out.put_u64(*id);
            out.put_u64(*lba);
            put_blob(out, data);
            kind::RESYNC_DATA
        }
        Message::ResyncDone { id, gens } => {
            out.put_u64(*id);
            put_gens(out, gens);
            kind::RESYNC_DONE
        }
        Message::Done { id, result } => {
            out.put_u64(*id);
            put_result(out, result);
            kind::DONE
        }
        Message::ScsiRequest { id, data } => {
            out.put_u64(*id);
            put_blob(out, data);
            kind::SCSI_REQUEST
        }
        Message::ScsiReply { id, data } => {
            out.put_u64(*id);
            put_blob(out, data);
            kind::SCSI_REPLY
        }
        Message::Detach { reason } => {
            put_str(out, reason);
            kind::DETACH
        }
        Message::Refused { reason } => {
            put_text(out, reason, crate::REASON_BYTES_MAX);
            kind::REFUSED
        }
        Message::CopyEnd { id, copy } => {
            out.put_u64(*id);
            out.put_u64(*copy);
            kind::COPY_END
        }
        Message::Repair { id, lba, blocks } => {
            out.put_u64(*id);
            out.put_u64(*lba);
            out.put_u64(*blocks);
            kind::REPAIR
        }
        Message::ReadCopy { id, lba, blocks } => {
            out.put_u64(*id);
            out.put_u64(*lba);
            out.put_u64(*blocks);
            kind::READ_COPY
        }
        Message::CopyData { id, data } => {
            out.put_u64(*id);
            put_blob(out, data);
            kind::COPY_DATA
        }
        Message::RepairData { id, lba, data } => {
            out.put_u64(*id);
            out.put_u64(*lba);
            put_blob(out, data);
            kind::REPAIR_DATA
        }
        Message::Ping { seq } => {
            out.put_u64(*seq);
            kind::PING
        }
        Message::Pong { seq } => {
            out.put_u64(*seq);
            kind::PONG
        }
        Message::WitnessClaim {
            cluster,
            node_id,
            seq,
        } => {
            put_str(out, cluster);
            out.put_u8(*node_id);
            out.put_u64(*seq);
            kind::WITNESS_CLAIM
        }
        Message::WitnessRelease {
            cluster,
            node_id,
            seq,
        } => {
            put_str(out, cluster);
            out.put_u8(*node_id);
            out.put_u64(*seq);
            kind::WITNESS_RELEASE
        }
        Message::WitnessAnswer { holder } => {
            out.put_u8(*holder);
            kind::WITNESS_ANSWER
        }
    }
}

fn put_op(out: &mut BytesMut, op: &Op) {
    match op {
        Op::Write { lba, fua, data } => {
            out.put_u8(op_tag::WRITE);
            out.put_u64(*lba);
            out.put_u8(u8::from(*fua));
            put_blob(out, data);
        }
        Op::WriteZeroes {
            lba,
            blocks,
            may_unmap,
        } => {
            out.put_u8(op_tag::WRITE_ZEROES);
            out.put_u64(*lba);
            out.put_u64(*blocks);
            out.put_u8(u8::from(*may_unmap));
        }
        Op::Discard { lba, blocks } => {
            out.put_u8(op_tag::DISCARD);
            out.put_u64(*lba);
            out.put_u64(*blocks);
        }
        Op::CopyWrite {
            copy,
            lba,
            fua,
            data,
        } => {
            out.put_u8(op_tag::COPY_WRITE);
            out.put_u64(*copy);
            out.put_u64(*lba);
            out.put_u8(u8::from(*fua));
            put_blob(out, data);
        }
        Op::Flush => out.put_u8(op_tag::FLUSH),
        Op::Grow { block_count } => {
            out.put_u8(op_tag::GROW);
            out.put_u64(*block_count);
        }
        Op::CompareAndWrite {
            lba,
            fua,
            compare,
            data,
        } => {
            out.put_u8(op_tag::COMPARE_AND_WRITE);
            out.put_u64(*lba);
            out.put_u8(u8::from(*fua));
            put_blob(out, compare);
            put_blob(out, data);
        }
    }
}

fn put_result(out: &mut BytesMut, result: &OpResult) {
    match result {
        OpResult::Ok => out.put_u8(result_tag::OK),
        OpResult::Miscompare { offset } => {
            out.put_u8(result_tag::MISCOMPARE);
            out.put_u32(*offset);
        }
        OpResult::Error { code, lba } => {
            out.put_u8(result_tag::ERROR);
            out.put_u8(*code);
            out.put_u64(*lba);
        }
    }
}

fn put_gens(out: &mut BytesMut, gens: &Generations) {
    out.put_u64(gens.current);
    out.put_u64(gens.synced);
}

/// A length-prefixed blob; a length beyond `u32` saturates (the frame is then
/// too long anyway and the peer refuses it).
fn put_blob(out: &mut BytesMut, b: &[u8]) {
    out.put_u32(u32::try_from(b.len()).unwrap_or(u32::MAX));
    out.put_slice(b);
}

/// A length-prefixed name, truncated to [`NAME_BYTES_MAX`] bytes at a character
/// boundary so that it stays valid UTF-8.
fn put_str(out: &mut BytesMut, s: &str) {
    put_text(out, s, NAME_BYTES_MAX)
}

/// A length-prefixed text, truncated to `max` bytes at a character boundary.
fn put_text(out: &mut BytesMut, s: &str, max: usize) {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    put_blob(out, &s.as_bytes()[..end]);
}

// ---------------------------------------------------------------- decoding

/// Strict reader over a body: every failure is `Malformed(what)`.
struct Reader {
    body: Bytes,
    pos: usize,
    what: &'static str,
}

impl Reader {
    fn bad(&self) -> ProtoError {
        ProtoError::Malformed(self.what)
    }

    /// The next `n` bytes, as a slice of the body (no copy).
    fn take(&mut self, n: usize) -> Result<Bytes, ProtoError> {
        let end = self.pos.checked_add(n).ok_or_else(|| self.bad())?;
        if end > self.body.len() {
            return Err(self.bad());
        }
        let b = self.body.slice(self.pos..end);
        self.pos = end;
        Ok(b)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], ProtoError> {
        let end = self.pos.checked_add(N).ok_or_else(|| self.bad())?;
        let src = self.body.get(self.pos..end).ok_or_else(|| self.bad())?;
        let mut a = [0; N];
        a.copy_from_slice(src);
        self.pos = end;
        Ok(a)
    }

    fn u8(&mut self) -> Result<u8, ProtoError> {
        Ok(self.array::<1>()?[0])
    }

    fn u32(&mut self) -> Result<u32, ProtoError> {
        self.array().map(u32::from_be_bytes)
    }

    fn u64(&mut self) -> Result<u64, ProtoError> {
        self.array().map(u64::from_be_bytes)
    }

    fn bool(&mut self) -> Result<bool, ProtoError> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            _ => Err(self.bad()),
        }
    }

    fn blob(&mut self) -> Result<Bytes, ProtoError> {
        let len = usize::try_from(self.u32()?).map_err(|_| self.bad())?;
        self.take(len)
    }

    fn string(&mut self) -> Result<String, ProtoError> {
        self.text(NAME_BYTES_MAX)
    }

    /// A length-prefixed UTF-8 text of at most `max` bytes.
    fn text(&mut self, max: usize) -> Result<String, ProtoError> {
        let b = self.blob()?;
        if b.len() > max {
            return Err(self.bad());
        }
        std::str::from_utf8(&b)
            .map(str::to_owned)
            .map_err(|_| self.bad())
    }

    fn gens(&mut self) -> Result<Generations, ProtoError> {
        Ok(Generations {
            current: self.u64()?,
            synced: self.u64()?,
        })
    }

    fn op(&mut self) -> Result<Op, ProtoError> {
        match self.u8()? {
            op_tag::WRITE => Ok(Op::Write {
                lba: self.u64()?,
                fua: self.bool()?,
                data: self.blob()?,
            }),
            op_tag::WRITE_ZEROES => Ok(Op::WriteZeroes {
                lba: self.u64()?,
                blocks: self.u64()?,
                may_unmap: self.bool()?,
            }),
            op_tag::DISCARD => Ok(Op::Discard {
                lba: self.u64()?,
                blocks: self.u64()?,
            }),
            op_tag::COPY_WRITE => Ok(Op::CopyWrite {
                copy: self.u64()?,
                lba: self.u64()?,
                fua: self.bool()?,
                data: self.blob()?,
            }),
            op_tag::FLUSH => Ok(Op::Flush),
            op_tag::GROW => Ok(Op::Grow {
                block_count: self.u64()?,
            }),
            op_tag::COMPARE_AND_WRITE => {
                let lba = self.u64()?;
                let fua = self.bool()?;
                let compare = self.blob()?;
                let data = self.blob()?;
                if compare.len() != data.len() {
                    return Err(self.bad());
                }
                Ok(Op::CompareAndWrite {
                    lba,
                    fua,
                    compare,
                    data,
                })
            }
            _ => Err(self.bad()),
        }
    }

    fn result(&mut self) -> Result<OpResult, ProtoError> {
        match self.u8()? {
            result_tag::OK => Ok(OpResult::Ok),
            result_tag::MISCOMPARE => Ok(OpResult::Miscompare {
                offset: self.u32()?,
            }),
            result_tag::ERROR => Ok(OpResult::Error {
                code: self.u8()?,
                lba: self.u64()?,
            }),
            _ => Err(self.bad()),
        }
    }

    /// Ends the body: trailing bytes are malformed.
    fn finish(self, msg: Message) -> Result<Message, ProtoError> {
        if self.pos == self.body.len() {
            Ok(msg)
        } else {
            Err(self.bad())
        }
    }
}

/// Name of the variant of a (known) kind, for [`ProtoError::Malformed`].
fn kind_name(k: u16) -> &'static str {
    match k {
        kind::HELLO => "Hello",
        kind::BITMAP => "Bitmap",
        kind::BITMAP_DONE => "BitmapDone",
        kind::APPLY => "Apply",
        kind::FORWARD => "Forward",
        kind::APPLY_FORWARDED => "ApplyForwarded",
        kind::RESYNC_DATA => "ResyncData",
        kind::RESYNC_DONE => "ResyncDone",
        kind::DONE => "Done",
        kind::SCSI_REQUEST => "ScsiRequest",
        kind::SCSI_REPLY => "ScsiReply",
        kind::DETACH => "Detach",
        kind::REFUSED => "Refused",
        kind::COPY_END => "CopyEnd",
        kind::PING => "Ping",
        kind::PONG => "Pong",
        kind::REPAIR => "Repair",
        kind::READ_COPY => "ReadCopy",
        kind::COPY_DATA => "CopyData",
        kind::REPAIR_DATA => "RepairData",
        kind::WITNESS_CLAIM => "WitnessClaim",
        kind::WITNESS_RELEASE => "WitnessRelease",
        kind::WITNESS_ANSWER => "WitnessAnswer",
        _ => "unknown",
    }
}

/// Parses the body of a frame of a known `k`ind.
fn parse_body(k: u16, body: Bytes) -> Result<Message, ProtoError> {
    let mut r = Reader {
        body,
        pos: 0,
        what: kind_name(k),
    };
    let msg = match k {
        kind::HELLO => Message::Hello {
            node_id: r.u8()?,
            volume: r.string()?,
            block_size_bytes: r.u32()?,
            block_count: r.u64()?,
            region_bytes: r.u32()?,
            gens: r.gens()?,
            flags: r.u32()?,
        },
        kind::BITMAP => Message::Bitmap {
            first_region: r.u64()?,
            bits: r.blob()?,
        },
        kind::BITMAP_DONE => Message::BitmapDone,
        kind::APPLY => Message::Apply {
            id: r.u64()?,
            op: r.op()?,
        },
        kind::FORWARD => Message::Forward {
            id: r.u64()?,
            op: r.op()?,
        },
        kind::APPLY_FORWARDED => Message::ApplyForwarded {
            id: r.u64()?,
            forward_id: r.u64()?,
        },
        kind::RESYNC_DATA => Message::ResyncData {
            id: r.u64()?,
            lba: r.u64()?,
            data: r.blob()?,
        },
        kind::RESYNC_DONE => Message::ResyncDone {
            id: r.u64()?,
            gens: r.gens()?,
        },
        kind::DONE => Message::Done {
            id: r.u64()?,
            result: r.result()?,
        },
        kind::SCSI_REQUEST => Message::ScsiRequest {
            id: r.u64()?,
            data: r.blob()?,
        },
        kind::SCSI_REPLY => Message::ScsiReply {
            id: r.u64()?,
            data: r.blob()?,
        },
        kind::DETACH => Message::Detach {
            reason: r.string()?,
        },
        kind::REFUSED => Message::Refused {
            reason: r.text(crate::REASON_BYTES_MAX)?,
        },
        kind::COPY_END => Message::CopyEnd {
            id: r.u64()?,
            copy: r.u64()?,
        },
        kind::REPAIR => Message::Repair {
            id: r.u64()?,
            lba: r.u64()?,
            blocks: r.u64()?,
        },
        kind::READ_COPY => Message::ReadCopy {
            id: r.u64()?,
            lba: r.u64()?,
            blocks: r.u64()?,
        },
        kind::COPY_DATA => Message::CopyData {
            id: r.u64()?,
            data: r.blob()?,
        },
        kind::REPAIR_DATA => Message::RepairData {
            id: r.u64()?,
            lba: r.u64()?,
            data: r.blob()?,
        },
        kind::PING => Message::Ping { seq: r.u64()? },
        kind::PONG => Message::Pong { seq: r.u64()? },
        kind::WITNESS_CLAIM => Message::WitnessClaim {
            cluster: r.string()?,
            node_id: r.u8()?,
            seq: r.u64()?,
        },
        kind::WITNESS_RELEASE => Message::WitnessRelease {
            cluster: r.string()?,
            node_id: r.u8()?,
            seq: r.u64()?,
        },
        kind::WITNESS_ANSWER => Message::WitnessAnswer { holder: r.u8()? },
        _ => return Err(ProtoError::Kind(k)),
    };
    r.finish(msg)
}

#[cfg(test)]
mod tests;
