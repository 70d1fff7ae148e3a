//! The NBD wire protocol as a pure codec: no I/O, no tasks, no clocks.
//!
//! Everything here turns bytes into typed messages and back, so that the server,
//! the client, the unit tests and the fuzz target share one parser. Decoders take
//! byte slices and never panic, whatever the input; lengths are checked before
//! anything is allocated.
//!
//! Layout (all integers big-endian, as the protocol says):
//! - [`handshake`]: the fixed newstyle greeting, client flags, option requests and
//!   option replies, `NBD_INFO_*` payloads;
//! - [`negotiate`]: the server side of option haggling as a state machine fed
//!   with bytes ([`ServerNegotiator`]);
//! - [`transmission`]: requests (`0x25609513`), simple replies (`0x67446698`)
//!   and structured reply chunks (`0x668e33ef`).

pub mod handshake;
pub mod negotiate;
pub mod transmission;

pub use handshake::{
    decode_client_flags, decode_export_name_reply, decode_info, decode_option_header,
    decode_option_reply_header, decode_server_greeting, encode_client_flags,
    encode_export_name_reply, encode_info, encode_option, encode_option_reply,
    encode_server_greeting, parse_option, BlockSizes, ClientOption, Info, InfoRequest,
    OptionHeader, OptionReplyHeader,
};
pub use handshake::{
    decode_meta_context_reply, MetaContextRequest, META_QUERIES_MAX, META_QUERY_BYTES_MAX,
};
pub use negotiate::{
    ExportInfo, NegotiateError, Progress, ServerNegotiator, Session, TlsPolicy, BASE_ALLOCATION_ID,
    REPLIES_PENDING_MAX,
};
pub use transmission::{
    decode_request, decode_simple_reply, decode_structured_reply_header, encode_request,
    encode_simple_reply, encode_structured_reply_header, Command, Request, SimpleReply,
    StructuredReplyHeader,
};

/// `NBDMAGIC`: first 8 bytes the server sends.
pub const NBD_MAGIC: u64 = 0x4e42_444d_4147_4943;
/// `IHAVEOPT`: second greeting word and the magic of every option request.
pub const IHAVEOPT: u64 = 0x4948_4156_454F_5054;
/// Magic of every option reply.
pub const OPTION_REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
/// Magic of a transmission-phase request.
pub const REQUEST_MAGIC: u32 = 0x2560_9513;
/// Magic of a simple reply.
pub const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
/// Magic of a structured reply chunk (sent once `NBD_OPT_STRUCTURED_REPLY` was acknowledged).
pub const STRUCTURED_REPLY_MAGIC: u32 = 0x668e_33ef;

/// Bytes of the server greeting (magic, IHAVEOPT, handshake flags).
pub const GREETING_BYTES: usize = 18;
/// Bytes of an option request header (magic, option, length).
pub const OPTION_HEADER_BYTES: usize = 16;
/// Bytes of an option reply header (magic, option, type, length).
pub const OPTION_REPLY_HEADER_BYTES: usize = 20;
/// Bytes of a transmission request header.
pub const REQUEST_BYTES: usize = 28;
/// Bytes of a simple reply header.
pub const SIMPLE_REPLY_BYTES: usize = 16;
/// Bytes of a structured reply chunk header (magic, flags, type, cookie, length).
pub const STRUCTURED_REPLY_HEADER_BYTES: usize = 20;
/// The one metadata context this server knows.
pub const BASE_ALLOCATION: &str = "base:allocation";
/// Reserved zero bytes after the `NBD_OPT_EXPORT_NAME` reply unless NO_ZEROES.
pub const EXPORT_NAME_ZEROES_BYTES: usize = 124;
/// Longest string (export name, description) the protocol allows.
pub const STRING_BYTES_MAX: usize = 4096;

/// Handshake flags (server, 16 bits).
pub mod hflag {
    /// The server speaks fixed newstyle.
    pub const FIXED_NEWSTYLE: u16 = 1 << 0;
    /// The server can omit the 124 zero bytes after `NBD_OPT_EXPORT_NAME`.
    pub const NO_ZEROES: u16 = 1 << 1;
}

/// Client flags (32 bits).
pub mod cflag {
    /// The client speaks fixed newstyle.
    pub const FIXED_NEWSTYLE: u32 = 1 << 0;
    /// The client does not want the 124 zero bytes.
    pub const NO_ZEROES: u32 = 1 << 1;
}

/// Option types.
pub mod opt {
    /// Choose an export and enter transmission (no error reply possible).
    pub const EXPORT_NAME: u32 = 1;
    /// Soft disconnect during haggling.
    pub const ABORT: u32 = 2;
    /// List the exports.
    pub const LIST: u32 = 3;
    /// Upgrade to TLS (refused: freesan has no NBD TLS).
    pub const STARTTLS: u32 = 5;
    /// Ask about an export without entering transmission.
    pub const INFO: u32 = 6;
    /// Like INFO, then enter transmission.
    pub const GO: u32 = 7;
    /// Ask for structured replies.
    pub const STRUCTURED_REPLY: u32 = 8;
    /// List metadata contexts (`base:allocation` only).
    pub const LIST_META_CONTEXT: u32 = 9;
    /// Select metadata contexts (needs structured replies first).
    pub const SET_META_CONTEXT: u32 = 10;
    /// Ask for 64-bit extended headers (refused).
    pub const EXTENDED_HEADERS: u32 = 11;
}

/// Option reply types.
pub mod rep {
    /// Option accepted / end of a list.
    pub const ACK: u32 = 1;
    /// One export of `NBD_OPT_LIST`.
    pub const SERVER: u32 = 2;
    /// One `NBD_INFO_*` item of INFO/GO.
    pub const INFO: u32 = 3;
    /// One metadata context of LIST/SET_META_CONTEXT (context id, name).
    pub const META_CONTEXT: u32 = 4;
    /// Bit 31 marks an error reply.
    pub const ERR_BIT: u32 = 1 << 31;
    /// Unknown option.
    pub const ERR_UNSUP: u32 = ERR_BIT | 1;
    /// Known option, forbidden by policy.
    pub const ERR_POLICY: u32 = ERR_BIT | 2;
    /// Syntactically invalid option.
    pub const ERR_INVALID: u32 = ERR_BIT | 3;
    /// Not supported on this platform.
    pub const ERR_PLATFORM: u32 = ERR_BIT | 4;
    /// TLS required first.
    pub const ERR_TLS_REQD: u32 = ERR_BIT | 5;
    /// No such export.
    pub const ERR_UNKNOWN: u32 = ERR_BIT | 6;
    /// The server is shutting down.
    pub const ERR_SHUTDOWN: u32 = ERR_BIT | 7;
    /// The client must ask for block sizes.
    pub const ERR_BLOCK_SIZE_REQD: u32 = ERR_BIT | 8;
    /// The option's payload is too big.
    pub const ERR_TOO_BIG: u32 = ERR_BIT | 9;
}

/// `NBD_INFO_*` item types.
pub mod info {
    /// Size in bytes and transmission flags.
    pub const EXPORT: u16 = 0;
    /// Canonical export name.
    pub const NAME: u16 = 1;
    /// Human-readable description.
    pub const DESCRIPTION: u16 = 2;
    /// Minimum, preferred and maximum block sizes.
    pub const BLOCK_SIZE: u16 = 3;
}

/// Transmission flags (16 bits, sent with the export).
pub mod tflag {
    /// Always set.
    pub const HAS_FLAGS: u16 = 1 << 0;
    /// Writes are refused with EPERM.
    pub const READ_ONLY: u16 = 1 << 1;
    /// `NBD_CMD_FLUSH` is supported.
    pub const SEND_FLUSH: u16 = 1 << 2;
    /// `NBD_CMD_FLAG_FUA` is supported.
    pub const SEND_FUA: u16 = 1 << 3;
    /// The export behaves like a spinning disk.
    pub const ROTATIONAL: u16 = 1 << 4;
    /// `NBD_CMD_TRIM` is supported.
    pub const SEND_TRIM: u16 = 1 << 5;
    /// `NBD_CMD_WRITE_ZEROES` is supported.
    pub const SEND_WRITE_ZEROES: u16 = 1 << 6;
    /// `NBD_CMD_FLAG_DF` is supported (structured replies only; never set here).
    pub const SEND_DF: u16 = 1 << 7;
    /// Several connections may be used at once: flush and FUA on one connection
    /// cover writes completed on every connection.
    pub const CAN_MULTI_CONN: u16 = 1 << 8;
}

/// Command types.
pub mod cmd {
    /// Read.
    pub const READ: u16 = 0;
    /// Write (payload follows the header).
    pub const WRITE: u16 = 1;
    /// Soft disconnect.
    pub const DISC: u16 = 2;
    /// Flush.
    pub const FLUSH: u16 = 3;
    /// Trim (discard hint).
    pub const TRIM: u16 = 4;
    /// Prefetch (not advertised).
    pub const CACHE: u16 = 5;
    /// Write zeroes.
    pub const WRITE_ZEROES: u16 = 6;
    /// Block status (structured replies and a metadata context only).
    pub const BLOCK_STATUS: u16 = 7;
}

/// Structured reply chunk flags.
pub mod rflag {
    /// The last chunk of the reply.
    pub const DONE: u16 = 1 << 0;
}

/// Structured reply chunk types.
pub mod rtype {
    /// No payload (a successful command without data).
    pub const NONE: u16 = 0;
    /// Offset (u64) then data.
    pub const OFFSET_DATA: u16 = 1;
    /// Offset (u64) and length (u32) of a run of zeroes.
    pub const OFFSET_HOLE: u16 = 2;
    /// Context id (u32) then (length u32, flags u32) descriptors.
    pub const BLOCK_STATUS: u16 = 5;
    /// Bit 15 marks an error chunk.
    pub const ERR_BIT: u16 = 1 << 15;
    /// Error (u32), message length (u16), message.
    pub const ERROR: u16 = ERR_BIT | 1;
    /// Like ERROR, with the offset (u64) of the failure after the message.
    pub const ERROR_OFFSET: u16 = ERR_BIT | 2;
}

/// Flags of a `base:allocation` block status descriptor.
pub mod state {
    /// Not allocated.
    pub const HOLE: u32 = 1 << 0;
    /// Reads as zeroes.
    pub const ZERO: u32 = 1 << 1;
}

/// Command flags (16 bits, per request).
pub mod cmdflag {
    /// Force unit access.
    pub const FUA: u16 = 1 << 0;
    /// WRITE_ZEROES must not punch a hole.
    pub const NO_HOLE: u16 = 1 << 1;
    /// Don't fragment (structured READ replies).
    pub const DF: u16 = 1 << 2;
    /// One extent only (BLOCK_STATUS).
    pub const REQ_ONE: u16 = 1 << 3;
    /// Fail fast if zeroing is slow.
    pub const FAST_ZERO: u16 = 1 << 4;
}

/// Error values of the reply `error` field.
pub mod errno {
    /// Operation not permitted (writes to a read-only export).
    pub const EPERM: u32 = 1;
    /// Input/output error.
    pub const EIO: u32 = 5;
    /// Out of memory (avoided).
    pub const ENOMEM: u32 = 12;
    /// Invalid argument (bad command, flag or range).
    pub const EINVAL: u32 = 22;
    /// No space (write beyond the end).
    pub const ENOSPC: u32 = 28;
    /// Value too large (request longer than the maximum payload).
    pub const EOVERFLOW: u32 = 75;
    /// Operation not supported.
    pub const ENOTSUP: u32 = 95;
    /// The server is shutting down.
    pub const ESHUTDOWN: u32 = 108;
}

/// A malformed message; decoders return this instead of panicking.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProtoError {
    /// A magic number was wrong.
    #[error("bad magic {got:#x} (expected {expected:#x})")]
    BadMagic {
        /// What arrived.
        got: u64,
        /// What the protocol requires here.
        expected: u64,
    },
    /// Fewer bytes than the message needs.
    #[error("message truncated: need {need_bytes} bytes, have {have_bytes}")]
    Truncated {
        /// Bytes the message needs.
        need_bytes: usize,
        /// Bytes available.
        have_bytes: usize,
    },
    /// An option payload is syntactically invalid.
    #[error("invalid option payload: {0}")]
    InvalidOption(&'static str),
    /// A count or length is beyond what this side accepts (`NBD_REP_ERR_TOO_BIG`).
    #[error("too big: {0}")]
    TooBig(&'static str),
    /// A string was not UTF-8 or too long.
    #[error("invalid string: {0}")]
    InvalidString(&'static str),
    /// An info item is malformed.
    #[error("invalid info item: {0}")]
    InvalidInfo(&'static str),
    /// The server greeting lacks fixed newstyle.
    #[error("server does not speak fixed newstyle (handshake flags {0:#x})")]
    NotFixedNewstyle(u16),
}

/// Reads a big-endian u16 at `at`; the caller has checked the length.
pub(crate) fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

/// Reads a big-endian u32 at `at`; the caller has checked the length.
pub(crate) fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// Reads a big-endian u64 at `at`; the caller has checked the length.
pub(crate) fn be64(b: &[u8], at: usize) -> u64 {
    let mut x = [0u8; 8];
    x.copy_from_slice(&b[at..at + 8]);
    u64::from_be_bytes(x)
}

/// Fails with [`ProtoError::Truncated`] unless `b` holds at least `need` bytes.
pub(crate) fn need(b: &[u8], need_bytes: usize) -> Result<(), ProtoError> {
    if b.len() < need_bytes {
        return Err(ProtoError::Truncated {
            need_bytes,
            have_bytes: b.len(),
        });
    }
    Ok(())
}
