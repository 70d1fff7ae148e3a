//! Typed errors of the codec.

/// Everything that can be wrong with bytes from the network.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProtoError {
    /// The opcode is not one an initiator may send.
    #[error("unknown or unsupported initiator opcode {0:#04x}")]
    UnknownOpcode(u8),
    /// Fewer bytes than a structure needs.
    #[error("truncated: need {needed_bytes} bytes, have {have_bytes}")]
    Truncated {
        /// Bytes needed.
        needed_bytes: usize,
        /// Bytes present.
        have_bytes: usize,
    },
    /// The Additional Header Segments are longer than allowed or malformed.
    #[error("bad additional header segment: {0}")]
    BadAhs(&'static str),
    /// The data segment is longer than the negotiated maximum.
    #[error("data segment of {len_bytes} bytes exceeds the maximum of {max_bytes}")]
    DataSegmentTooLong {
        /// Announced length.
        len_bytes: u32,
        /// Negotiated maximum.
        max_bytes: u32,
    },
    /// The header digest does not match.
    #[error("header digest mismatch")]
    HeaderDigest,
    /// The data digest does not match.
    #[error("data digest mismatch")]
    DataDigest,
    /// A field holds a value the protocol forbids.
    #[error("invalid field: {0}")]
    InvalidField(&'static str),
    /// Text parameters are malformed.
    #[error("bad text parameters: {0}")]
    BadText(&'static str),
    /// Text parameters exceed a bound (keys, key length, value length, total size).
    #[error("text parameters exceed a limit: {0}")]
    TextTooLarge(&'static str),
}
