//! Transmission-phase messages: the 28-byte request header, the 16-byte simple
//! reply and the 20-byte structured reply chunk header.

use super::{be16, be32, be64, cmd, need, ProtoError};
use super::{REQUEST_BYTES, REQUEST_MAGIC, SIMPLE_REPLY_BYTES, SIMPLE_REPLY_MAGIC};
use super::{STRUCTURED_REPLY_HEADER_BYTES, STRUCTURED_REPLY_MAGIC};

/// A request type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    /// `NBD_CMD_READ`.
    Read,
    /// `NBD_CMD_WRITE` (`length` payload bytes follow the header).
    Write,
    /// `NBD_CMD_DISC`: no reply; close after in-flight requests.
    Disc,
    /// `NBD_CMD_FLUSH`.
    Flush,
    /// `NBD_CMD_TRIM`.
    Trim,
    /// `NBD_CMD_CACHE` (not advertised).
    Cache,
    /// `NBD_CMD_WRITE_ZEROES`.
    WriteZeroes,
    /// `NBD_CMD_BLOCK_STATUS` (needs structured replies and a metadata context).
    BlockStatus,
    /// Any other type; assumed to carry no payload.
    Unknown(u16),
}

impl Command {
    /// Decodes a type field.
    pub fn from_code(c: u16) -> Command {
        match c {
            cmd::READ => Command::Read,
            cmd::WRITE => Command::Write,
            cmd::DISC => Command::Disc,
            cmd::FLUSH => Command::Flush,
            cmd::TRIM => Command::Trim,
            cmd::CACHE => Command::Cache,
            cmd::WRITE_ZEROES => Command::WriteZeroes,
            cmd::BLOCK_STATUS => Command::BlockStatus,
            other => Command::Unknown(other),
        }
    }

    /// The type field on the wire.
    pub fn code(self) -> u16 {
        match self {
            Command::Read => cmd::READ,
            Command::Write => cmd::WRITE,
            Command::Disc => cmd::DISC,
            Command::Flush => cmd::FLUSH,
            Command::Trim => cmd::TRIM,
            Command::Cache => cmd::CACHE,
            Command::WriteZeroes => cmd::WRITE_ZEROES,
            Command::BlockStatus => cmd::BLOCK_STATUS,
            Command::Unknown(c) => c,
        }
    }
}

/// A request header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    /// Command flags (`cmdflag::*`).
    pub flags: u16,
    /// Request type.
    pub command: Command,
    /// Opaque handle echoed in the reply.
    pub cookie: u64,
    /// Byte offset into the export.
    pub offset_bytes: u64,
    /// Length in bytes (payload length for WRITE, data wanted for READ).
    pub length_bytes: u32,
}

impl Request {
    /// Bytes of payload that follow this header on the wire.
    pub fn payload_bytes(&self) -> u32 {
        if self.command == Command::Write {
            self.length_bytes
        } else {
            0
        }
    }
}

/// Checks that `b` holds at least `len` bytes and starts with the 32-bit `magic`.
fn magic32(b: &[u8], len: usize, magic: u32) -> Result<(), ProtoError> {
    need(b, len)?;
    let m = be32(b, 0);
    if m != magic {
        return Err(ProtoError::BadMagic {
            got: m as u64,
            expected: magic as u64,
        });
    }
    Ok(())
}

/// Parses a request header (checks the magic; any type and flags are accepted here,
/// the server judges them).
pub fn decode_request(b: &[u8]) -> Result<Request, ProtoError> {
    magic32(b, REQUEST_BYTES, REQUEST_MAGIC)?;
    Ok(Request {
        flags: be16(b, 4),
        command: Command::from_code(be16(b, 6)),
        cookie: be64(b, 8),
        offset_bytes: be64(b, 16),
        length_bytes: be32(b, 24),
    })
}

/// Encodes a request header.
pub fn encode_request(r: &Request) -> [u8; REQUEST_BYTES] {
    let mut b = [0u8; REQUEST_BYTES];
    b[0..4].copy_from_slice(&REQUEST_MAGIC.to_be_bytes());
    b[4..6].copy_from_slice(&r.flags.to_be_bytes());
    b[6..8].copy_from_slice(&r.command.code().to_be_bytes());
    b[8..16].copy_from_slice(&r.cookie.to_be_bytes());
    b[16..24].copy_from_slice(&r.offset_bytes.to_be_bytes());
    b[24..28].copy_from_slice(&r.length_bytes.to_be_bytes());
    b
}

/// A simple reply header (READ data, if any, follows it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SimpleReply {
    /// 0 on success, else an `errno::*` value.
    pub error: u32,
    /// The request's cookie.
    pub cookie: u64,
}

/// Encodes a simple reply header.
pub fn encode_simple_reply(r: &SimpleReply) -> [u8; SIMPLE_REPLY_BYTES] {
    let mut b = [0u8; SIMPLE_REPLY_BYTES];
    b[0..4].copy_from_slice(&SIMPLE_REPLY_MAGIC.to_be_bytes());
    b[4..8].copy_from_slice(&r.error.to_be_bytes());
    b[8..16].copy_from_slice(&r.cookie.to_be_bytes());
    b
}

/// Parses a simple reply header (client side). A structured reply magic is a
/// [`ProtoError::BadMagic`] here (see [`decode_structured_reply_header`]).
pub fn decode_simple_reply(b: &[u8]) -> Result<SimpleReply, ProtoError> {
    magic32(b, SIMPLE_REPLY_BYTES, SIMPLE_REPLY_MAGIC)?;
    Ok(SimpleReply {
        error: be32(b, 4),
        cookie: be64(b, 8),
    })
}

/// The header of one structured reply chunk (its payload follows it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StructuredReplyHeader {
    /// Chunk flags (`rflag::*`).
    pub flags: u16,
    /// Chunk type (`rtype::*`).
    pub reply_type: u16,
    /// The request's cookie.
    pub cookie: u64,
    /// Bytes of payload that follow.
    pub length_bytes: u32,
}

/// Encodes a structured reply chunk header.
pub fn encode_structured_reply_header(
    h: &StructuredReplyHeader,
) -> [u8; STRUCTURED_REPLY_HEADER_BYTES] {
    let mut b = [0u8; STRUCTURED_REPLY_HEADER_BYTES];
    b[0..4].copy_from_slice(&STRUCTURED_REPLY_MAGIC.to_be_bytes());
    b[4..6].copy_from_slice(&h.flags.to_be_bytes());
    b[6..8].copy_from_slice(&h.reply_type.to_be_bytes());
    b[8..16].copy_from_slice(&h.cookie.to_be_bytes());
    b[16..20].copy_from_slice(&h.length_bytes.to_be_bytes());
    b
}

/// Parses a structured reply chunk header (client side; checks the magic).
pub fn decode_structured_reply_header(b: &[u8]) -> Result<StructuredReplyHeader, ProtoError> {
    magic32(b, STRUCTURED_REPLY_HEADER_BYTES, STRUCTURED_REPLY_MAGIC)?;
    Ok(StructuredReplyHeader {
        flags: be16(b, 4),
        reply_type: be16(b, 6),
        cookie: be64(b, 8),
        length_bytes: be32(b, 16),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::cmdflag;
    use proptest::prelude::*;

    #[test]
    fn request_layout_matches_the_spec() {
        let r = Request {
            flags: cmdflag::FUA,
            command: Command::Write,
            cookie: 0x0102_0304_0506_0708,
            offset_bytes: 4096,
            length_bytes: 512,
        };
        let b = encode_request(&r);
        assert_eq!(&b[0..4], &[0x25, 0x60, 0x95, 0x13]);
        assert_eq!(&b[4..8], &[0, 1, 0, 1]);
        assert_eq!(&b[8..16], &[1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(&b[24..28], &[0, 0, 2, 0]);
        assert_eq!(decode_request(&b), Ok(r));
        assert_eq!(r.payload_bytes(), 512);
    }

    #[test]
    fn bad_magic_and_short_input_are_errors() {
        let mut b = encode_request(&Request {
            flags: 0,
            command: Command::Read,
            cookie: 1,
            offset_bytes: 0,
            length_bytes: 1,
        });
        assert!(decode_request(&b[..27]).is_err());
        b[0] ^= 1;
        assert!(matches!(
            decode_request(&b),
            Err(ProtoError::BadMagic { .. })
        ));
        let s = encode_simple_reply(&SimpleReply {
            error: 22,
            cookie: 9,
        });
        assert_eq!(
            decode_simple_reply(&s),
            Ok(SimpleReply {
                error: 22,
                cookie: 9
            })
        );
        let mut st = s;
        st[0..4].copy_from_slice(&crate::proto::STRUCTURED_REPLY_MAGIC.to_be_bytes());
        assert!(decode_simple_reply(&st).is_err());
    }

    proptest! {
        #[test]
        fn request_roundtrip(flags: u16, code: u16, cookie: u64, off: u64, len: u32) {
            let r = Request {
                flags,
                command: Command::from_code(code),
                cookie,
                offset_bytes: off,
                length_bytes: len,
            };
            prop_assert_eq!(decode_request(&encode_request(&r)), Ok(r));
            prop_assert_eq!(r.command.code(), code);
        }

        #[test]
        fn reply_roundtrip(error: u32, cookie: u64) {
            let r = SimpleReply { error, cookie };
            prop_assert_eq!(decode_simple_reply(&encode_simple_reply(&r)), Ok(r));
        }

        #[test]
        fn structured_header_roundtrip(flags: u16, reply_type: u16, cookie: u64, len: u32) {
            let h = StructuredReplyHeader { flags, reply_type, cookie, length_bytes: len };
            let b = encode_structured_reply_header(&h);
            prop_assert_eq!(&b[0..4], &[0x66, 0x8e, 0x33, 0xef]);
            prop_assert_eq!(decode_structured_reply_header(&b), Ok(h));
            prop_assert!(decode_simple_reply(&b).is_err());
        }

        #[test]
        fn decoders_never_panic(b in proptest::collection::vec(any::<u8>(), 0..64)) {
            let _ = decode_request(&b);
            let _ = decode_simple_reply(&b);
            let _ = decode_structured_reply_header(&b);
        }
    }
}
