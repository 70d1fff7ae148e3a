//! Handshake messages: greeting, client flags, option requests, option replies and
//! the `NBD_INFO_*` items carried by `NBD_REP_INFO`.

use super::{be16, be32, be64, info, need, opt, ProtoError, EXPORT_NAME_ZEROES_BYTES};
use super::{
    GREETING_BYTES, IHAVEOPT, NBD_MAGIC, OPTION_HEADER_BYTES, OPTION_REPLY_HEADER_BYTES,
    OPTION_REPLY_MAGIC, STRING_BYTES_MAX,
};
use bytes::{BufMut, BytesMut};

/// The server greeting: `NBDMAGIC`, `IHAVEOPT`, handshake flags.
pub fn encode_server_greeting(handshake_flags: u16) -> [u8; GREETING_BYTES] {
    let mut b = [0u8; GREETING_BYTES];
    b[0..8].copy_from_slice(&NBD_MAGIC.to_be_bytes());
    b[8..16].copy_from_slice(&IHAVEOPT.to_be_bytes());
    b[16..18].copy_from_slice(&handshake_flags.to_be_bytes());
    b
}

/// Parses the server greeting and returns its handshake flags. Oldstyle servers
/// (a different second magic) are refused with [`ProtoError::BadMagic`].
pub fn decode_server_greeting(b: &[u8]) -> Result<u16, ProtoError> {
    need(b, GREETING_BYTES)?;
    let m = be64(b, 0);
    if m != NBD_MAGIC {
        return Err(ProtoError::BadMagic {
            got: m,
            expected: NBD_MAGIC,
        });
    }
    let m = be64(b, 8);
    if m != IHAVEOPT {
        return Err(ProtoError::BadMagic {
            got: m,
            expected: IHAVEOPT,
        });
    }
    Ok(be16(b, 16))
}

/// The client's 32-bit flags word.
pub fn encode_client_flags(client_flags: u32) -> [u8; 4] {
    client_flags.to_be_bytes()
}

/// Parses the client's flags word (validation against what the server offered is
/// the negotiator's job).
pub fn decode_client_flags(b: &[u8]) -> Result<u32, ProtoError> {
    need(b, 4)?;
    Ok(be32(b, 0))
}

/// The fixed part of an option request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OptionHeader {
    /// Option type (`opt::*`).
    pub option: u32,
    /// Bytes of option data that follow.
    pub data_len_bytes: u32,
}

/// Parses an option request header (checks the `IHAVEOPT` magic).
pub fn decode_option_header(b: &[u8]) -> Result<OptionHeader, ProtoError> {
    need(b, OPTION_HEADER_BYTES)?;
    let m = be64(b, 0);
    if m != IHAVEOPT {
        return Err(ProtoError::BadMagic {
            got: m,
            expected: IHAVEOPT,
        });
    }
    Ok(OptionHeader {
        option: be32(b, 8),
        data_len_bytes: be32(b, 12),
    })
}

/// What `NBD_OPT_INFO` and `NBD_OPT_GO` carry: an export name and the info items wanted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InfoRequest {
    /// Export name; empty means the default export.
    pub name: String,
    /// `NBD_INFO_*` types the client asks for (the server may send more).
    pub infos: Vec<u16>,
}

/// Most queries one LIST/SET_META_CONTEXT may carry (more: `NBD_REP_ERR_TOO_BIG`).
pub const META_QUERIES_MAX: usize = 16;
/// Longest query string accepted (longer: `NBD_REP_ERR_TOO_BIG`).
pub const META_QUERY_BYTES_MAX: usize = 1024;

/// What `NBD_OPT_LIST_META_CONTEXT` and `NBD_OPT_SET_META_CONTEXT` carry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetaContextRequest {
    /// Export name; empty means the default export.
    pub name: String,
    /// Context queries such as `base:allocation` or `base:`.
    pub queries: Vec<String>,
}

/// A decoded option request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClientOption {
    /// `NBD_OPT_EXPORT_NAME`: pick an export and enter transmission.
    ExportName(String),
    /// `NBD_OPT_ABORT`: soft disconnect.
    Abort,
    /// `NBD_OPT_LIST`: list the exports.
    List,
    /// `NBD_OPT_INFO`: describe an export.
    Info(InfoRequest),
    /// `NBD_OPT_GO`: describe an export and enter transmission.
    Go(InfoRequest),
    /// `NBD_OPT_STRUCTURED_REPLY`.
    StructuredReply,
    /// `NBD_OPT_LIST_META_CONTEXT`.
    ListMetaContext(MetaContextRequest),
    /// `NBD_OPT_SET_META_CONTEXT`.
    SetMetaContext(MetaContextRequest),
    /// Any other option; its data has been skipped.
    Unsupported(u32),
}

impl ClientOption {
    /// The option type on the wire.
    pub fn code(&self) -> u32 {
        match self {
            ClientOption::ExportName(_) => opt::EXPORT_NAME,
            ClientOption::Abort => opt::ABORT,
            ClientOption::List => opt::LIST,
            ClientOption::Info(_) => opt::INFO,
            ClientOption::Go(_) => opt::GO,
            ClientOption::StructuredReply => opt::STRUCTURED_REPLY,
            ClientOption::ListMetaContext(_) => opt::LIST_META_CONTEXT,
            ClientOption::SetMetaContext(_) => opt::SET_META_CONTEXT,
            ClientOption::Unsupported(c) => *c,
        }
    }
}

fn string(b: &[u8]) -> Result<String, ProtoError> {
    if b.len() > STRING_BYTES_MAX {
        return Err(ProtoError::InvalidString("longer than 4096 bytes"));
    }
    if b.contains(&0) {
        return Err(ProtoError::InvalidString("contains NUL"));
    }
    String::from_utf8(b.to_vec()).map_err(|_| ProtoError::InvalidString("not UTF-8"))
}

fn info_request(data: &[u8]) -> Result<InfoRequest, ProtoError> {
    if data.len() < 6 {
        return Err(ProtoError::InvalidOption("INFO/GO shorter than 6 bytes"));
    }
    let name_len = be32(data, 0) as usize;
    if name_len > data.len() - 6 {
        return Err(ProtoError::InvalidOption(
            "INFO/GO name longer than the option",
        ));
    }
    let name = string(&data[4..4 + name_len])?;
    let rest = &data[4 + name_len..];
    let count = be16(rest, 0) as usize;
    if rest.len() != 2 + 2 * count {
        return Err(ProtoError::InvalidOption(
            "INFO/GO info count does not match length",
        ));
    }
    let infos = (0..count).map(|i| be16(rest, 2 + 2 * i)).collect();
    Ok(InfoRequest { name, infos })
}

/// Parses LIST/SET_META_CONTEXT data: u32 name length, name, u32 query count,
/// then per query u32 length and string. Every length is checked against what
/// is left of the option before it is used.
fn meta_request(data: &[u8]) -> Result<MetaContextRequest, ProtoError> {
    if data.len() < 8 {
        return Err(ProtoError::InvalidOption(
            "META_CONTEXT shorter than 8 bytes",
        ));
    }
    let name_len = be32(data, 0) as usize;
    if name_len > data.len() - 8 {
        return Err(ProtoError::InvalidOption(
            "META_CONTEXT name longer than the option",
        ));
    }
    let name = string(&data[4..4 + name_len])?;
    let rest = &data[4 + name_len..];
    let count = be32(rest, 0) as usize;
    if count > META_QUERIES_MAX {
        return Err(ProtoError::TooBig("too many META_CONTEXT queries"));
    }
    let mut queries = Vec::with_capacity(count);
    let mut at = 4;
    for _ in 0..count {
        if rest.len() - at < 4 {
            return Err(ProtoError::InvalidOption(
                "META_CONTEXT query count does not match length",
            ));
        }
        let len = be32(rest, at) as usize;
        at += 4;
        if len > META_QUERY_BYTES_MAX {
            return Err(ProtoError::TooBig("META_CONTEXT query too long"));
        }
        if len > rest.len() - at {
            return Err(ProtoError::InvalidOption(
                "META_CONTEXT query longer than the option",
            ));
        }
        queries.push(string(&rest[at..at + len])?);
        at += len;
    }
    if at != rest.len() {
        return Err(ProtoError::InvalidOption(
            "META_CONTEXT has bytes after its queries",
        ));
    }
    Ok(MetaContextRequest { name, queries })
}

/// Parses the data of an `NBD_REP_META_CONTEXT` reply (client side): context
/// id and name.
pub fn decode_meta_context_reply(b: &[u8]) -> Result<(u32, String), ProtoError> {
    need(b, 4)?;
    Ok((be32(b, 0), string(&b[4..])?))
}

/// Decodes an option's data. Errors mean "syntactically invalid" (the server answers
/// `NBD_REP_ERR_INVALID`, or `NBD_REP_ERR_TOO_BIG` for [`ProtoError::TooBig`], or
/// closes for `NBD_OPT_EXPORT_NAME`).
pub fn parse_option(option: u32, data: &[u8]) -> Result<ClientOption, ProtoError> {
    match option {
        opt::EXPORT_NAME => Ok(ClientOption::ExportName(string(data)?)),
        opt::ABORT => Ok(ClientOption::Abort),
        opt::LIST if data.is_empty() => Ok(ClientOption::List),
        opt::LIST => Err(ProtoError::InvalidOption("LIST with data")),
        opt::INFO => Ok(ClientOption::Info(info_request(data)?)),
        opt::GO => Ok(ClientOption::Go(info_request(data)?)),
        opt::STRUCTURED_REPLY if data.is_empty() => Ok(ClientOption::StructuredReply),
        opt::STRUCTURED_REPLY => Err(ProtoError::InvalidOption("STRUCTURED_REPLY with data")),
        opt::LIST_META_CONTEXT => Ok(ClientOption::ListMetaContext(meta_request(data)?)),
        opt::SET_META_CONTEXT => Ok(ClientOption::SetMetaContext(meta_request(data)?)),
        other => Ok(ClientOption::Unsupported(other)),
    }
}

/// Encodes an option request (client side). `Unsupported` options go out with no data.
pub fn encode_option(o: &ClientOption, out: &mut BytesMut) {
    let start = out.len();
    out.put_u64(IHAVEOPT);
    out.put_u32(o.code());
    out.put_u32(0);
    match o {
        ClientOption::ExportName(n) => out.put_slice(n.as_bytes()),
        ClientOption::Info(r) | ClientOption::Go(r) => {
            out.put_u32(r.name.len() as u32);
            out.put_slice(r.name.as_bytes());
            out.put_u16(r.infos.len() as u16);
            for i in &r.infos {
                out.put_u16(*i);
            }
        }
        ClientOption::ListMetaContext(r) | ClientOption::SetMetaContext(r) => {
            out.put_u32(r.name.len() as u32);
            out.put_slice(r.name.as_bytes());
            out.put_u32(r.queries.len() as u32);
            for q in &r.queries {
                out.put_u32(q.len() as u32);
                out.put_slice(q.as_bytes());
            }
        }
        _ => {}
    }
    let len = (out.len() - start - OPTION_HEADER_BYTES) as u32;
    out[start + 12..start + 16].copy_from_slice(&len.to_be_bytes());
}

/// The fixed part of an option reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OptionReplyHeader {
    /// The option this answers.
    pub option: u32,
    /// Reply type (`rep::*`).
    pub reply_type: u32,
    /// Bytes of reply data that follow.
    pub data_len_bytes: u32,
}

/// Encodes one option reply with its data.
pub fn encode_option_reply(option: u32, reply_type: u32, data: &[u8], out: &mut BytesMut) {
    out.reserve(OPTION_REPLY_HEADER_BYTES + data.len());
    out.put_u64(OPTION_REPLY_MAGIC);
    out.put_u32(option);
    out.put_u32(reply_type);
    out.put_u32(data.len() as u32);
    out.put_slice(data);
}

/// Parses an option reply header (client side).
pub fn decode_option_reply_header(b: &[u8]) -> Result<OptionReplyHeader, ProtoError> {
    need(b, OPTION_REPLY_HEADER_BYTES)?;
    let m = be64(b, 0);
    if m != OPTION_REPLY_MAGIC {
        return Err(ProtoError::BadMagic {
            got: m,
            expected: OPTION_REPLY_MAGIC,
        });
    }
    Ok(OptionReplyHeader {
        option: be32(b, 8),
        reply_type: be32(b, 12),
        data_len_bytes: be32(b, 16),
    })
}

/// The `NBD_INFO_BLOCK_SIZE` constraints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockSizes {
    /// Smallest request granularity the server accepts, in bytes.
    pub min_bytes: u32,
    /// Granularity that avoids read-modify-write, in bytes.
    pub preferred_bytes: u32,
    /// Largest payload of one request, in bytes.
    pub max_bytes: u32,
}

/// One `NBD_INFO_*` item.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Info {
    /// `NBD_INFO_EXPORT`: size and transmission flags.
    Export {
        /// Export size in bytes.
        size_bytes: u64,
        /// Transmission flags (`tflag::*`).
        transmission_flags: u16,
    },
    /// `NBD_INFO_NAME`: canonical name.
    Name(String),
    /// `NBD_INFO_DESCRIPTION`: free text for humans.
    Description(String),
    /// `NBD_INFO_BLOCK_SIZE`.
    BlockSize(BlockSizes),
    /// An item type this codec does not know (clients ignore it).
    Unknown(u16),
}

/// Encodes the data of an `NBD_REP_INFO` reply.
pub fn encode_info(i: &Info, out: &mut BytesMut) {
    match i {
        Info::Export {
            size_bytes,
            transmission_flags,
        } => {
            out.put_u16(info::EXPORT);
            out.put_u64(*size_bytes);
            out.put_u16(*transmission_flags);
        }
        Info::Name(n) => {
            out.put_u16(info::NAME);
            out.put_slice(n.as_bytes());
        }
        Info::Description(d) => {
            out.put_u16(info::DESCRIPTION);
            out.put_slice(d.as_bytes());
        }
        Info::BlockSize(s) => {
            out.put_u16(info::BLOCK_SIZE);
            out.put_u32(s.min_bytes);
            out.put_u32(s.preferred_bytes);
            out.put_u32(s.max_bytes);
        }
        Info::Unknown(t) => out.put_u16(*t),
    }
}

/// Decodes the data of an `NBD_REP_INFO` reply (client side).
pub fn decode_info(b: &[u8]) -> Result<Info, ProtoError> {
    need(b, 2)?;
    let body = &b[2..];
    match be16(b, 0) {
        info::EXPORT => {
            if body.len() != 10 {
                return Err(ProtoError::InvalidInfo("EXPORT must be 10 bytes"));
            }
            Ok(Info::Export {
                size_bytes: be64(body, 0),
                transmission_flags: be16(body, 8),
            })
        }
        info::NAME => Ok(Info::Name(string(body)?)),
        info::DESCRIPTION => Ok(Info::Description(string(body)?)),
        info::BLOCK_SIZE => {
            if body.len() != 12 {
                return Err(ProtoError::InvalidInfo("BLOCK_SIZE must be 12 bytes"));
            }
            Ok(Info::BlockSize(BlockSizes {
                min_bytes: be32(body, 0),
                preferred_bytes: be32(body, 4),
                max_bytes: be32(body, 8),
            }))
        }
        t => Ok(Info::Unknown(t)),
    }
}

/// The answer to `NBD_OPT_EXPORT_NAME`: size, flags and (unless NO_ZEROES) 124 zeroes.
pub fn encode_export_name_reply(
    size_bytes: u64,
    transmission_flags: u16,
    no_zeroes: bool,
    out: &mut BytesMut,
) {
    out.put_u64(size_bytes);
    out.put_u16(transmission_flags);
    if !no_zeroes {
        out.put_bytes(0, EXPORT_NAME_ZEROES_BYTES);
    }
}

/// Parses the first 10 bytes of the `NBD_OPT_EXPORT_NAME` answer: (size, flags).
pub fn decode_export_name_reply(b: &[u8]) -> Result<(u64, u16), ProtoError> {
    need(b, 10)?;
    Ok((be64(b, 0), be16(b, 8)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::rep;

    #[test]
    fn greeting_roundtrip_and_oldstyle_refused() {
        let g = encode_server_greeting(3);
        assert_eq!(&g[..8], b"NBDMAGIC");
        assert_eq!(&g[8..16], b"IHAVEOPT");
        assert_eq!(decode_server_greeting(&g), Ok(3));
        let mut old = g;
        old[8..16].copy_from_slice(&0x0000_4202_8186_1253_u64.to_be_bytes());
        assert!(matches!(
            decode_server_greeting(&old),
            Err(ProtoError::BadMagic { .. })
        ));
        assert!(matches!(
            decode_server_greeting(&g[..17]),
            Err(ProtoError::Truncated { .. })
        ));
    }

    #[test]
    fn go_option_bytes_match_the_spec_layout() {
        let mut b = BytesMut::new();
        encode_option(
            &ClientOption::Go(InfoRequest {
                name: "lun0".into(),
                infos: vec![info::BLOCK_SIZE],
            }),
            &mut b,
        );
        let expect: Vec<u8> = [
            &IHAVEOPT.to_be_bytes()[..],
            &7u32.to_be_bytes(),
            &12u32.to_be_bytes(),
            &4u32.to_be_bytes(),
            b"lun0",
            &1u16.to_be_bytes(),
            &3u16.to_be_bytes(),
        ]
        .concat();
        assert_eq!(&b[..], &expect[..]);
        let h = decode_option_header(&b).unwrap();
        assert_eq!(h.option, opt::GO);
        assert_eq!(h.data_len_bytes, 12);
        assert_eq!(
            parse_option(h.option, &b[16..]).unwrap(),
            ClientOption::Go(InfoRequest {
                name: "lun0".into(),
                infos: vec![3]
            })
        );
    }

    #[test]
    fn bad_info_requests_are_invalid() {
        // Name length beyond the data.
        let mut d = vec![0, 0, 0, 9, b'a'];
        d.extend_from_slice(&[0, 0]);
        assert!(parse_option(opt::GO, &d).is_err());
        // Count says 2, one present.
        let d = [0, 0, 0, 0, 0, 2, 0, 3];
        assert!(parse_option(opt::INFO, &d).is_err());
        // Too short.
        assert!(parse_option(opt::GO, &[0, 0, 0]).is_err());
        // Name not UTF-8.
        let d = [0, 0, 0, 1, 0xff, 0, 0];
        assert!(matches!(
            parse_option(opt::GO, &d),
            Err(ProtoError::InvalidString(_))
        ));
        assert!(parse_option(opt::LIST, b"x").is_err());
        assert_eq!(parse_option(99, b"junk"), Ok(ClientOption::Unsupported(99)));
    }

    #[test]
    fn option_reply_and_info_roundtrip() {
        let mut data = BytesMut::new();
        encode_info(
            &Info::BlockSize(BlockSizes {
                min_bytes: 1,
                preferred_bytes: 4096,
                max_bytes: 32 << 20,
            }),
            &mut data,
        );
        let mut b = BytesMut::new();
        encode_option_reply(opt::GO, rep::INFO, &data, &mut b);
        let h = decode_option_reply_header(&b).unwrap();
        assert_eq!((h.option, h.reply_type, h.data_len_bytes), (7, 3, 14));
        assert_eq!(
            decode_info(&b[20..]).unwrap(),
            Info::BlockSize(BlockSizes {
                min_bytes: 1,
                preferred_bytes: 4096,
                max_bytes: 32 << 20
            })
        );
        assert!(decode_info(&[0, 0, 1]).is_err(), "short EXPORT item");
    }

    proptest::proptest! {
        #[test]
        fn decoders_never_panic(b in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..80), code in 0u32..16) {
            let _ = decode_server_greeting(&b);
            let _ = decode_client_flags(&b);
            let _ = decode_option_header(&b);
            let _ = decode_option_reply_header(&b);
            let _ = decode_info(&b);
            let _ = decode_export_name_reply(&b);
            let _ = parse_option(code, &b);
        }

        #[test]
        fn info_roundtrip(size: u64, flags: u16, min in 0u32..100, pref: u32, max: u32, name in "[ -~]{0,64}") {
            for i in [
                Info::Export { size_bytes: size, transmission_flags: flags },
                Info::Name(name.clone()),
                Info::Description(name.clone()),
                Info::BlockSize(BlockSizes { min_bytes: min, preferred_bytes: pref, max_bytes: max }),
            ] {
                let mut b = BytesMut::new();
                encode_info(&i, &mut b);
                proptest::prop_assert_eq!(decode_info(&b).unwrap(), i);
            }
        }
    }

    #[test]
    fn export_name_reply_zeroes() {
        let mut b = BytesMut::new();
        encode_export_name_reply(1 << 30, 0x0101, false, &mut b);
        assert_eq!(b.len(), 134);
        assert_eq!(decode_export_name_reply(&b), Ok((1 << 30, 0x0101)));
        b.clear();
        encode_export_name_reply(5, 1, true, &mut b);
        assert_eq!(b.len(), 10);
    }
}
