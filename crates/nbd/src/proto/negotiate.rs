//! The server side of the fixed newstyle handshake as a pure state machine.
//!
//! The connection code writes [`ServerNegotiator::greeting`], then feeds every
//! byte it reads to [`ServerNegotiator::advance`] and writes whatever the machine
//! put in `out`, until the machine says [`Progress::Transmission`] or
//! [`Progress::Abort`], or fails. Because it does no I/O it is unit tested and
//! fuzzed with plain byte strings.
//!
//! Policy: options longer than the configured bound are answered with
//! `NBD_REP_ERR_TOO_BIG` and the connection is closed (their data is never
//! buffered); structured replies are acknowledged, and the one metadata
//! context `base:allocation` can be listed and (after structured replies) set;
//! what was negotiated is read with [`ServerNegotiator::session`]. Extended
//! headers and every unknown option get `NBD_REP_ERR_UNSUP`, as does STARTTLS
//! under [`TlsPolicy::Off`] (under [`TlsPolicy::Require`] see its rule; the TLS
//! handshake discards what was negotiated before it); a bounded number of
//! options is allowed.

use super::handshake::{
    decode_client_flags, decode_option_header, encode_export_name_reply, encode_info,
    encode_option_reply, encode_server_greeting, parse_option, BlockSizes, ClientOption, Info,
    InfoRequest, MetaContextRequest,
};
use super::OPTION_HEADER_BYTES;
use super::{cflag, hflag, info, rep, ProtoError, BASE_ALLOCATION, GREETING_BYTES};
use bytes::{Buf, BufMut, BytesMut};

/// Most options one connection may send before it is closed, beyond
/// [`OPTIONS_PER_EXPORT`] for each export the server has.
pub const OPTIONS_PER_CONNECTION_MAX: u32 = 256;
/// Options allowed per export on top of [`OPTIONS_PER_CONNECTION_MAX`]:
/// `nbdinfo --list` and `qemu-nbd --list` ask NBD_OPT_INFO and
/// NBD_OPT_LIST_META_CONTEXT for every export on one connection (review of
/// 2026-12-06: with about 127 exports the fixed 256 cut them off mid-list).
pub const OPTIONS_PER_EXPORT: u32 = 4;
/// Replies [`ServerNegotiator::advance`] lets pile up before it asks for them
/// to be sent ([`Progress::Flush`]).
pub const REPLIES_PENDING_MAX: usize = 64 * 1024;

/// The context id this server gives `base:allocation`.
pub const BASE_ALLOCATION_ID: u32 = 1;

/// What the transmission phase of a connection may use, as negotiated.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Session {
    /// Replies are structured reply chunks.
    pub structured_replies: bool,
    /// The context id of `base:allocation` when it was selected for the
    /// export being served (`NBD_CMD_BLOCK_STATUS` is refused otherwise).
    pub base_allocation: Option<u32>,
}

/// What the negotiator tells a client about one export.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportInfo {
    /// Export name as clients ask for it.
    pub name: String,
    /// Free text shown by `nbdinfo` and `NBD_OPT_LIST`.
    pub description: String,
    /// Size in bytes.
    pub size_bytes: u64,
    /// Transmission flags (`tflag::*`).
    pub transmission_flags: u16,
    /// Block size constraints sent as `NBD_INFO_BLOCK_SIZE`.
    pub block_sizes: BlockSizes,
}

/// What the caller does after [`ServerNegotiator::advance`] (always after writing `out`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Progress {
    /// Read more bytes and call again.
    NeedInput,
    /// Send the replies so far, then call again before reading: the input
    /// holds more options, and their replies wait until these are taken (a
    /// client piling up options while reading nothing holds at most
    /// [`REPLIES_PENDING_MAX`] of replies, not one export list per option).
    Flush,
    /// The client aborted (`NBD_OPT_ABORT`): close the connection.
    Abort,
    /// `NBD_OPT_STARTTLS` was acknowledged: run the TLS handshake as server on
    /// the same socket, call [`ServerNegotiator::tls_started`], and go on feeding
    /// bytes read through TLS (the input buffer is empty: plaintext sent after
    /// STARTTLS is refused).
    StartTls,
    /// Option haggling is over: serve `exports[export_index]`. Bytes left in the
    /// input buffer already belong to the transmission phase.
    Transmission {
        /// Index into the export slice given to the negotiator.
        export_index: usize,
    },
}

/// Why negotiation failed; the caller writes `out` (it may hold an error reply)
/// and closes the connection.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NegotiateError {
    /// The client set flags the server did not offer.
    #[error("unknown client flags {0:#x}")]
    BadClientFlags(u32),
    /// A header was malformed (bad `IHAVEOPT` magic).
    #[error("malformed option: {0}")]
    Proto(ProtoError),
    /// An option carried more data than the server accepts.
    #[error("option {option} carries {data_len_bytes} bytes (limit {limit_bytes})")]
    OptionTooLong {
        /// The option type.
        option: u32,
        /// Its announced data length.
        data_len_bytes: u32,
        /// The configured bound.
        limit_bytes: usize,
    },
    /// `NBD_OPT_EXPORT_NAME` named an export that does not exist (no error reply
    /// is possible for that option).
    #[error("unknown export {0:?} requested with NBD_OPT_EXPORT_NAME")]
    UnknownExport(String),
    /// `NBD_OPT_EXPORT_NAME` carried a name that is not a valid string.
    #[error("invalid export name: {0}")]
    InvalidExportName(ProtoError),
    /// More than [`OPTIONS_PER_CONNECTION_MAX`] options.
    #[error("too many options")]
    TooManyOptions,
    /// TLS is required and the client chose an export with
    /// `NBD_OPT_EXPORT_NAME` before it (no error reply is possible).
    #[error("NBD_OPT_EXPORT_NAME before TLS while TLS is required")]
    TlsRequired,
    /// Bytes followed `NBD_OPT_STARTTLS` before the server acknowledged it
    /// (plaintext that could be injected into the TLS session).
    #[error("data sent after NBD_OPT_STARTTLS before its reply")]
    DataAfterStartTls,
    /// `advance` was called after negotiation ended.
    #[error("negotiation already finished")]
    Finished,
    /// The server serves as many connections as it may (see
    /// [`ServerNegotiator::set_busy`]) and the client chose an export with
    /// `NBD_OPT_EXPORT_NAME` (no error reply is possible).
    #[error("the server serves as many connections as it may")]
    Busy,
}

// (the wrapped error's text is in the variant's own, so it is not also given
// as the source: an error chain printed whole said it twice)
impl From<ProtoError> for NegotiateError {
    fn from(e: ProtoError) -> NegotiateError {
        NegotiateError::Proto(e)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    ClientFlags,
    Options,
    Done,
}

/// The server side of option haggling over a fixed set of exports.
#[derive(Debug)]
pub struct ServerNegotiator<'a> {
    exports: &'a [ExportInfo],
    default_export: Option<usize>,
    option_bytes_max: usize,
    state: State,
    no_zeroes: bool,
    options_seen: u32,
    tls: TlsPolicy,
    tls_active: bool,
    structured: bool,
    /// The export `base:allocation` was set for by the last SET_META_CONTEXT.
    meta_export: Option<usize>,
    /// The export haggling ended with.
    picked: Option<usize>,
    /// Whether choosing an export is refused now (see [`Self::set_busy`]).
    busy: bool,
    /// `NBD_OPT_GO`s refused for it.
    busy_refusals: u32,
}

/// What the TLS rule made of an option.
enum Gate {
    /// Not a TLS matter: handle the option as usual.
    Pass,
    /// Answered already (error reply); read the next option.
    Answered,
    /// Haggling pauses or ends here.
    End(Progress),
}

/// Whether the server offers TLS (`NBD_OPT_STARTTLS`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlsPolicy {
    /// No TLS: STARTTLS is answered `NBD_REP_ERR_UNSUP`.
    Off,
    /// TLS required: before it, every option but STARTTLS and ABORT is answered
    /// `NBD_REP_ERR_TLS_REQD`, and `NBD_OPT_EXPORT_NAME` closes the connection.
    Require,
}

impl<'a> ServerNegotiator<'a> {
    /// A negotiator over `exports`; an empty export name selects `default_export`;
    /// option data longer than `option_bytes_max` ends the connection.
    pub fn new(
        exports: &'a [ExportInfo],
        default_export: Option<usize>,
        option_bytes_max: usize,
    ) -> Self {
        ServerNegotiator {
            exports,
            default_export: default_export.filter(|i| *i < exports.len()),
            option_bytes_max,
            state: State::ClientFlags,
            no_zeroes: false,
            options_seen: 0,
            tls: TlsPolicy::Off,
            tls_active: false,
            structured: false,
            meta_export: None,
            picked: None,
            busy: false,
            busy_refusals: 0,
        }
    }

    /// Whether the server serves as many connections as it may now: an
    /// `NBD_OPT_GO` is then answered `NBD_REP_ERR_POLICY` (the client may try
    /// again later, on this connection or another), and `NBD_OPT_EXPORT_NAME`
    /// ends haggling with [`NegotiateError::Busy`]. Set before each
    /// [`Self::advance`].
    pub fn set_busy(&mut self, busy: bool) {
        self.busy = busy;
    }

    /// `NBD_OPT_GO`s answered `NBD_REP_ERR_POLICY` because the server was busy.
    pub fn busy_refusals(&self) -> u32 {
        self.busy_refusals
    }

    /// Options this connection may send (see [`OPTIONS_PER_EXPORT`]).
    fn options_max(&self) -> u32 {
        let per_export = u32::try_from(self.exports.len())
            .unwrap_or(u32::MAX)
            .saturating_mul(OPTIONS_PER_EXPORT);
        OPTIONS_PER_CONNECTION_MAX.saturating_add(per_export)
    }

    /// The same negotiator with TLS policy `tls`.
    pub fn with_tls(mut self, tls: TlsPolicy) -> Self {
        self.tls = tls;
        self
    }

    /// The TLS handshake that followed [`Progress::StartTls`] succeeded: options
    /// are now accepted (through TLS).
    pub fn tls_started(&mut self) {
        self.tls_active = true;
        // Nothing negotiated in plaintext carries over into TLS.
        self.structured = false;
        self.meta_export = None;
        if self.state == State::Done {
            self.state = State::Options;
        }
    }

    /// What was negotiated for the transmission phase (after
    /// [`Progress::Transmission`]). A context set for another export than the
    /// one picked is dropped.
    pub fn session(&self) -> Session {
        let meta = self.meta_export.is_some() && self.meta_export == self.picked;
        Session {
            structured_replies: self.structured,
            base_allocation: (meta && self.structured).then_some(BASE_ALLOCATION_ID),
        }
    }

    /// The 18-byte greeting to send first (fixed newstyle, no zeroes).
    pub fn greeting(&self) -> [u8; GREETING_BYTES] {
        encode_server_greeting(hflag::FIXED_NEWSTYLE | hflag::NO_ZEROES)
    }

    fn lookup(&self, name: &str) -> Option<usize> {
        if name.is_empty() {
            return self.default_export;
        }
        self.exports.iter().position(|e| e.name == name)
    }

    /// Consumes every complete message in `input`, appending replies to `out`.
    pub fn advance(
        &mut self,
        input: &mut BytesMut,
        out: &mut BytesMut,
    ) -> Result<Progress, NegotiateError> {
        loop {
            match self.state {
                State::Done => return Err(NegotiateError::Finished),
                State::ClientFlags => {
                    if input.len() < 4 {
                        return Ok(Progress::NeedInput);
                    }
                    let f = decode_client_flags(input)?;
                    input.advance(4);
                    let known = cflag::FIXED_NEWSTYLE | cflag::NO_ZEROES;
                    if f & !known != 0 {
                        self.state = State::Done;
                        return Err(NegotiateError::BadClientFlags(f));
                    }
                    self.no_zeroes = f & cflag::NO_ZEROES != 0;
                    self.state = State::Options;
                }
                State::Options => {
                    if input.len() < OPTION_HEADER_BYTES {
                        return Ok(Progress::NeedInput);
                    }
                    if out.len() >= REPLIES_PENDING_MAX {
                        return Ok(Progress::Flush);
                    }
                    let h = match decode_option_header(input) {
                        Ok(h) => h,
                        Err(e) => {
                            self.state = State::Done;
                            return Err(e.into());
                        }
                    };
                    if h.data_len_bytes as usize > self.option_bytes_max {
                        self.state = State::Done;
                        encode_option_reply(
                            h.option,
                            rep::ERR_TOO_BIG,
                            b"option data too long",
                            out,
                        );
                        return Err(NegotiateError::OptionTooLong {
                            option: h.option,
                            data_len_bytes: h.data_len_bytes,
                            limit_bytes: self.option_bytes_max,
                        });
                    }
                    let total = OPTION_HEADER_BYTES + h.data_len_bytes as usize;
                    if input.len() < total {
                        input.reserve(total - input.len());
                        return Ok(Progress::NeedInput);
                    }
                    self.options_seen += 1;
                    if self.options_seen > self.options_max() {
                        self.state = State::Done;
                        return Err(NegotiateError::TooManyOptions);
                    }
                    input.advance(OPTION_HEADER_BYTES);
                    let data = input.split_to(h.data_len_bytes as usize);
                    match self.tls_gate(&data, h.option, input, out)? {
                        Gate::End(p) => return Ok(p),
                        Gate::Answered => continue,
                        Gate::Pass => {}
                    }
                    if let Some(p) = self.option(h.option, &data, out)? {
                        self.state = State::Done;
                        return Ok(p);
                    }
                }
            }
        }
    }

    /// STARTTLS and the TLS-required rule, before any option is looked at.
    fn tls_gate(
        &mut self,
        data: &[u8],
        code: u32,
        input: &BytesMut,
        out: &mut BytesMut,
    ) -> Result<Gate, NegotiateError> {
        use super::opt;
        let before_tls = self.tls == TlsPolicy::Require && !self.tls_active;
        match code {
            opt::STARTTLS if self.tls == TlsPolicy::Off => Ok(Gate::Pass),
            opt::STARTTLS if self.tls_active => {
                encode_option_reply(code, rep::ERR_INVALID, b"TLS already active", out);
                Ok(Gate::Answered)
            }
            opt::STARTTLS if !data.is_empty() => {
                // (the spec: STARTTLS carries no data)
                encode_option_reply(code, rep::ERR_INVALID, b"STARTTLS takes no data", out);
                Ok(Gate::Answered)
            }
            opt::STARTTLS => {
                if !input.is_empty() {
                    self.state = State::Done;
                    return Err(NegotiateError::DataAfterStartTls);
                }
                encode_option_reply(code, rep::ACK, &[], out);
                self.state = State::Done;
                Ok(Gate::End(Progress::StartTls))
            }
            opt::ABORT => Ok(Gate::Pass),
            opt::EXPORT_NAME if before_tls => {
                self.state = State::Done;
                Err(NegotiateError::TlsRequired)
            }
            _ if before_tls => {
                encode_option_reply(code, rep::ERR_TLS_REQD, b"TLS required", out);
                Ok(Gate::Answered)
            }
            _ => Ok(Gate::Pass),
        }
    }

    /// Handles one option; `Some` ends haggling.
    fn option(
        &mut self,
        code: u32,
        data: &[u8],
        out: &mut BytesMut,
    ) -> Result<Option<Progress>, NegotiateError> {
        let o = match parse_option(code, data) {
            Ok(o) => o,
            Err(e) if code == super::opt::EXPORT_NAME => {
                self.state = State::Done;
                return Err(NegotiateError::InvalidExportName(e));
            }
            Err(e) => {
                tracing::debug!(option = code, error = %e, "invalid option");
                let t = match e {
                    ProtoError::TooBig(_) => rep::ERR_TOO_BIG,
                    _ => rep::ERR_INVALID,
                };
                if code == super::opt::SET_META_CONTEXT {
                    self.meta_export = None;
                }
                encode_option_reply(code, t, e.to_string().as_bytes(), out);
                return Ok(None);
            }
        };
        match o {
            ClientOption::ExportName(name) => {
                let Some(i) = self.lookup(&name) else {
                    self.state = State::Done;
                    return Err(NegotiateError::UnknownExport(name));
                };
                if self.busy {
                    self.state = State::Done;
                    return Err(NegotiateError::Busy);
                }
                let e = &self.exports[i];
                encode_export_name_reply(e.size_bytes, e.transmission_flags, self.no_zeroes, out);
                self.picked = Some(i);
                Ok(Some(Progress::Transmission { export_index: i }))
            }
            ClientOption::Abort => {
                encode_option_reply(code, rep::ACK, &[], out);
                Ok(Some(Progress::Abort))
            }
            ClientOption::List => {
                for e in self.exports {
                    let mut d = BytesMut::with_capacity(4 + e.name.len() + e.description.len());
                    d.put_u32(e.name.len() as u32);
                    d.put_slice(e.name.as_bytes());
                    d.put_slice(e.description.as_bytes());
                    encode_option_reply(code, rep::SERVER, &d, out);
                }
                encode_option_reply(code, rep::ACK, &[], out);
                Ok(None)
            }
            ClientOption::Info(r) => {
                self.info(code, &r, out);
                Ok(None)
            }
            ClientOption::Go(_) if self.busy => {
                self.busy_refusals += 1;
                encode_option_reply(
                    code,
                    rep::ERR_POLICY,
                    b"too many connections; try again later",
                    out,
                );
                Ok(None)
            }
            ClientOption::Go(r) => {
                self.picked = self.info(code, &r, out);
                Ok(self
                    .picked
                    .map(|export_index| Progress::Transmission { export_index }))
            }
            ClientOption::StructuredReply => {
                self.structured = true;
                encode_option_reply(code, rep::ACK, &[], out);
                Ok(None)
            }
            ClientOption::ListMetaContext(r) => {
                self.meta_context(code, &r, false, out);
                Ok(None)
            }
            ClientOption::SetMetaContext(r) => {
                // A SET replaces what an earlier one selected, even when it fails.
                self.meta_export = None;
                if !self.structured {
                    encode_option_reply(
                        code,
                        rep::ERR_INVALID,
                        b"structured replies not negotiated",
                        out,
                    );
                } else {
                    self.meta_context(code, &r, true, out);
                }
                Ok(None)
            }
            ClientOption::Unsupported(_) => {
                encode_option_reply(code, rep::ERR_UNSUP, b"option not supported", out);
                Ok(None)
            }
        }
    }

    /// Answers LIST/SET_META_CONTEXT: `base:allocation` when asked for (for LIST
    /// also by an empty query list or the namespace `base:`), unknown contexts
    /// left out, then ACK; SET remembers the selection.
    fn meta_context(&mut self, code: u32, r: &MetaContextRequest, set: bool, out: &mut BytesMut) {
        let Some(i) = self.lookup(&r.name) else {
            let msg = format!("no export named {:?}", r.name);
            encode_option_reply(code, rep::ERR_UNKNOWN, msg.as_bytes(), out);
            return;
        };
        let wanted = (!set && r.queries.is_empty())
            || r.queries
                .iter()
                .any(|q| q == BASE_ALLOCATION || (!set && q == "base:"));
        if wanted {
            let mut d = BytesMut::with_capacity(4 + BASE_ALLOCATION.len());
            d.put_u32(BASE_ALLOCATION_ID);
            d.put_slice(BASE_ALLOCATION.as_bytes());
            encode_option_reply(code, rep::META_CONTEXT, &d, out);
            if set {
                self.meta_export = Some(i);
            }
        }
        encode_option_reply(code, rep::ACK, &[], out);
    }

    /// Answers INFO/GO; returns the export index on success.
    fn info(&self, code: u32, r: &InfoRequest, out: &mut BytesMut) -> Option<usize> {
        let Some(i) = self.lookup(&r.name) else {
            let msg = if r.name.is_empty() {
                "no default export".to_string()
            } else {
                format!("no export named {:?}", r.name)
            };
            encode_option_reply(code, rep::ERR_UNKNOWN, msg.as_bytes(), out);
            return None;
        };
        let e = &self.exports[i];
        let mut d = BytesMut::with_capacity(64);
        let mut item = |it: Info, out: &mut BytesMut| {
            d.clear();
            encode_info(&it, &mut d);
            encode_option_reply(code, rep::INFO, &d, out);
        };
        item(
            Info::Export {
                size_bytes: e.size_bytes,
                transmission_flags: e.transmission_flags,
            },
            out,
        );
        if r.infos.contains(&info::NAME) {
            item(Info::Name(e.name.clone()), out);
        }
        if r.infos.contains(&info::DESCRIPTION) && !e.description.is_empty() {
            item(Info::Description(e.description.clone()), out);
        }
        // Sent even when not asked for: the minimum is 1, so no client is bound by it.
        item(Info::BlockSize(e.block_sizes), out);
        encode_option_reply(code, rep::ACK, &[], out);
        Some(i)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::handshake::{decode_info, decode_option_reply_header, encode_option};
    use crate::proto::{
        opt, tflag, META_QUERIES_MAX, META_QUERY_BYTES_MAX, OPTION_REPLY_HEADER_BYTES,
    };
    use proptest::prelude::*;

    fn exports() -> Vec<ExportInfo> {
        ["lun0", "lun1"]
            .iter()
            .enumerate()
            .map(|(i, n)| ExportInfo {
                name: n.to_string(),
                description: format!("disk {i}"),
                size_bytes: (i as u64 + 1) << 20,
                transmission_flags: tflag::HAS_FLAGS | tflag::SEND_FLUSH,
                block_sizes: BlockSizes {
                    min_bytes: 1,
                    preferred_bytes: 4096,
                    max_bytes: 32 << 20,
                },
            })
            .collect()
    }

    /// One option reply: (option, reply type, data).
    type Replied = (u32, u32, Vec<u8>);

    /// Splits `out` into (option, reply type, data) triples.
    fn replies(mut out: &[u8]) -> Vec<(u32, u32, Vec<u8>)> {
        let mut v = Vec::new();
        while !out.is_empty() {
            let h = decode_option_reply_header(out).unwrap();
            let end = OPTION_REPLY_HEADER_BYTES + h.data_len_bytes as usize;
            v.push((
                h.option,
                h.reply_type,
                out[OPTION_REPLY_HEADER_BYTES..end].to_vec(),
            ));
            out = &out[end..];
        }
        v
    }

    fn opt_bytes(o: ClientOption) -> BytesMut {
        let mut b = BytesMut::new();
        encode_option(&o, &mut b);
        b
    }

    #[test]
    fn go_with_default_export_enters_transmission() {
        let ex = exports();
        let mut n = ServerNegotiator::new(&ex, Some(0), 4096);
        let mut input = BytesMut::from(&3u32.to_be_bytes()[..]);
        let mut out = BytesMut::new();
        assert_eq!(n.advance(&mut input, &mut out), Ok(Progress::NeedInput));
        input.extend_from_slice(&opt_bytes(ClientOption::StructuredReply));
        input.extend_from_slice(&opt_bytes(ClientOption::Go(InfoRequest {
            name: String::new(),
            infos: vec![info::NAME, info::DESCRIPTION],
        })));
        input.extend_from_slice(b"tail");
        let p = n.advance(&mut input, &mut out).unwrap();
        assert_eq!(p, Progress::Transmission { export_index: 0 });
        assert_eq!(&input[..], b"tail", "transmission bytes are left alone");
        let r = replies(&out);
        assert_eq!(r[0].1, rep::ACK, "structured replies are accepted");
        assert_eq!(r[1].1, rep::INFO);
        assert_eq!(
            decode_info(&r[1].2).unwrap(),
            Info::Export {
                size_bytes: 1 << 20,
                transmission_flags: tflag::HAS_FLAGS | tflag::SEND_FLUSH
            }
        );
        assert_eq!(decode_info(&r[2].2).unwrap(), Info::Name("lun0".into()));
        assert_eq!(
            decode_info(&r[3].2).unwrap(),
            Info::Description("disk 0".into())
        );
        assert!(matches!(decode_info(&r[4].2).unwrap(), Info::BlockSize(_)));
        assert_eq!((r[5].0, r[5].1), (opt::GO, rep::ACK));
        assert_eq!(
            n.advance(&mut input, &mut out),
            Err(NegotiateError::Finished)
        );
    }

    /// While the server is busy, GO is refused with NBD_REP_ERR_POLICY and
    /// haggling goes on (a GO once it is not is served); EXPORT_NAME ends it.
    #[test]
    fn a_busy_server_refuses_the_choice_of_an_export() {
        let ex = exports();
        let go = || {
            opt_bytes(ClientOption::Go(InfoRequest {
                name: "lun1".into(),
                infos: vec![],
            }))
        };
        let mut n = ServerNegotiator::new(&ex, Some(0), 4096);
        let mut input = BytesMut::from(&3u32.to_be_bytes()[..]);
        input.extend_from_slice(&go());
        let mut out = BytesMut::new();
        n.set_busy(true);
        assert_eq!(n.advance(&mut input, &mut out), Ok(Progress::NeedInput));
        assert_eq!(
            replies(&out),
            vec![(
                opt::GO,
                rep::ERR_POLICY,
                b"too many connections; try again later".to_vec()
            )]
        );
        assert_eq!(n.busy_refusals(), 1);
        n.set_busy(false);
        input.extend_from_slice(&go());
        assert_eq!(
            n.advance(&mut input, &mut BytesMut::new()),
            Ok(Progress::Transmission { export_index: 1 })
        );
        let mut n = ServerNegotiator::new(&ex, Some(0), 4096);
        let mut input = BytesMut::from(&3u32.to_be_bytes()[..]);
        input.extend_from_slice(&opt_bytes(ClientOption::ExportName("lun0".into())));
        n.set_busy(true);
        assert_eq!(
            n.advance(&mut input, &mut BytesMut::new()),
            Err(NegotiateError::Busy)
        );
        // busy or not, TLS comes first where it is required
        let mut n = ServerNegotiator::new(&ex, Some(0), 4096).with_tls(TlsPolicy::Require);
        n.set_busy(true);
        let mut input = BytesMut::from(&1u32.to_be_bytes()[..]);
        input.extend_from_slice(&go());
        let mut out = BytesMut::new();
        assert_eq!(n.advance(&mut input, &mut out), Ok(Progress::NeedInput));
        assert_eq!(replies(&out)[0].1, rep::ERR_TLS_REQD);
        input.extend_from_slice(&opt_bytes(ClientOption::ExportName("lun0".into())));
        assert_eq!(
            n.advance(&mut input, &mut BytesMut::new()),
            Err(NegotiateError::TlsRequired)
        );
    }

    #[test]
    fn tls_required_refuses_options_until_starttls() {
        let ex = exports();
        let mut n = ServerNegotiator::new(&ex, Some(0), 4096).with_tls(TlsPolicy::Require);
        let mut input = BytesMut::from(&1u32.to_be_bytes()[..]);
        input.extend_from_slice(&opt_bytes(ClientOption::List));
        input.extend_from_slice(&opt_bytes(ClientOption::Go(InfoRequest {
            name: "lun0".into(),
            infos: vec![],
        })));
        input.extend_from_slice(&opt_bytes(ClientOption::Unsupported(opt::STARTTLS)));
        let mut out = BytesMut::new();
        assert_eq!(n.advance(&mut input, &mut out), Ok(Progress::StartTls));
        let r = replies(&out);
        let types: Vec<u32> = r.iter().map(|x| x.1).collect();
        assert_eq!(types, vec![rep::ERR_TLS_REQD, rep::ERR_TLS_REQD, rep::ACK]);
        // Through TLS now: options work, a second STARTTLS is invalid.
        n.tls_started();
        out.clear();
        input.extend_from_slice(&opt_bytes(ClientOption::Unsupported(opt::STARTTLS)));
        input.extend_from_slice(&opt_bytes(ClientOption::ExportName("lun1".into())));
        let p = n.advance(&mut input, &mut out).unwrap();
        assert_eq!(p, Progress::Transmission { export_index: 1 });
        assert_eq!(replies(&out[..out.len() - 134])[0].1, rep::ERR_INVALID);

        // EXPORT_NAME before TLS closes; plaintext after STARTTLS closes.
        let mut n = ServerNegotiator::new(&ex, Some(0), 4096).with_tls(TlsPolicy::Require);
        let mut input = BytesMut::from(&1u32.to_be_bytes()[..]);
        input.extend_from_slice(&opt_bytes(ClientOption::ExportName("lun0".into())));
        assert_eq!(
            n.advance(&mut input, &mut BytesMut::new()),
            Err(NegotiateError::TlsRequired)
        );
        let mut n = ServerNegotiator::new(&ex, Some(0), 4096).with_tls(TlsPolicy::Require);
        let mut input = BytesMut::from(&1u32.to_be_bytes()[..]);
        input.extend_from_slice(&opt_bytes(ClientOption::Unsupported(opt::STARTTLS)));
        input.extend_from_slice(b"injected");
        assert_eq!(
            n.advance(&mut input, &mut BytesMut::new()),
            Err(NegotiateError::DataAfterStartTls)
        );
    }

    #[test]
    fn list_info_unknown_then_export_name() {
        let ex = exports();
        let mut n = ServerNegotiator::new(&ex, None, 4096);
        let mut input = BytesMut::from(&1u32.to_be_bytes()[..]);
        input.extend_from_slice(&opt_bytes(ClientOption::List));
        input.extend_from_slice(&opt_bytes(ClientOption::Info(InfoRequest {
            name: "nope".into(),
            infos: vec![],
        })));
        input.extend_from_slice(&opt_bytes(ClientOption::Unsupported(opt::STARTTLS)));
        input.extend_from_slice(&opt_bytes(ClientOption::Info(InfoRequest {
            name: String::new(),
            infos: vec![],
        })));
        input.extend_from_slice(&opt_bytes(ClientOption::ExportName("lun1".into())));
        let mut out = BytesMut::new();
        let p = n.advance(&mut input, &mut out).unwrap();
        assert_eq!(p, Progress::Transmission { export_index: 1 });
        // Not NO_ZEROES: 10 bytes + 124 zeroes at the end.
        let tail = out.split_off(out.len() - 134);
        assert_eq!(&tail[..8], &(2u64 << 20).to_be_bytes());
        let r = replies(&out);
        let types: Vec<u32> = r.iter().map(|x| x.1).collect();
        assert_eq!(
            types,
            vec![
                rep::SERVER,
                rep::SERVER,
                rep::ACK,
                rep::ERR_UNKNOWN,
                rep::ERR_UNSUP,
                rep::ERR_UNKNOWN
            ]
        );
        assert_eq!(&r[1].2[..8], b"\0\0\0\x04lun1");
    }

    /// A client listing every export's details on one connection, as
    /// `nbdinfo --list` does (INFO and LIST_META_CONTEXT for each), is
    /// answered to the end on a server of 300 exports. (Before, the 257th
    /// option closed the connection.)
    #[test]
    fn listing_the_details_of_every_export_is_answered_to_the_end() {
        let names: Vec<String> = (0..300).map(|i| format!("lun{i}")).collect();
        let ex: Vec<ExportInfo> = names
            .iter()
            .map(|n| ExportInfo {
                name: n.clone(),
                ..exports()[0].clone()
            })
            .collect();
        let mut n = ServerNegotiator::new(&ex, None, 4096);
        let mut input = BytesMut::from(&1u32.to_be_bytes()[..]);
        input.extend_from_slice(&opt_bytes(ClientOption::List));
        for name in &names {
            for _ in 0..2 {
                input.extend_from_slice(&opt_bytes(ClientOption::Info(InfoRequest {
                    name: name.clone(),
                    infos: vec![],
                })));
            }
        }
        input.extend_from_slice(&opt_bytes(ClientOption::Abort));
        let mut out = BytesMut::new();
        let mut acks = 0;
        loop {
            match n.advance(&mut input, &mut out) {
                Ok(Progress::Flush) => {
                    acks += replies(&out).iter().filter(|r| r.1 == rep::ACK).count();
                    out.clear();
                }
                Ok(_) => break,
                Err(e) => panic!("cut off after {acks} answers: {e}"),
            }
        }
        acks += replies(&out).iter().filter(|r| r.1 == rep::ACK).count();
        // (LIST, two INFOs an export, ABORT)
        assert_eq!(acks, 2 + 2 * names.len(), "every option answered once");
    }

    #[test]
    fn options_piled_up_unread_hold_a_bounded_reply() {
        // 2,000 exports: one LIST answer is over 100 KiB
        let names: Vec<String> = (0..2000)
            .map(|i| format!("export-{i:04}-{}", "x".repeat(40)))
            .collect();
        let ex: Vec<ExportInfo> = names
            .iter()
            .map(|n| ExportInfo {
                name: n.clone(),
                description: String::new(),
                size_bytes: 1 << 20,
                transmission_flags: tflag::HAS_FLAGS,
                block_sizes: BlockSizes {
                    min_bytes: 1,
                    preferred_bytes: 4096,
                    max_bytes: 32 << 20,
                },
            })
            .collect();
        let mut n = ServerNegotiator::new(&ex, None, 4096);
        let mut input = BytesMut::from(&1u32.to_be_bytes()[..]);
        for _ in 0..200 {
            input.extend_from_slice(&opt_bytes(ClientOption::List));
        }
        let one_list = {
            let mut m = ServerNegotiator::new(&ex, None, 4096);
            let mut i = BytesMut::from(&1u32.to_be_bytes()[..]);
            i.extend_from_slice(&opt_bytes(ClientOption::List));
            let mut o = BytesMut::new();
            m.advance(&mut i, &mut o).unwrap();
            o.len()
        };
        // each call stops once the replies pending reach the bound (one
        // answer may cross it); every option is answered in the end
        let mut out = BytesMut::new();
        let mut lists = 0;
        loop {
            let p = n.advance(&mut input, &mut out).unwrap();
            assert!(
                out.len() < REPLIES_PENDING_MAX + one_list,
                "{} bytes pending",
                out.len()
            );
            lists += replies(&out).iter().filter(|r| r.1 == rep::ACK).count();
            out.clear();
            match p {
                Progress::Flush => continue,
                Progress::NeedInput => break,
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(lists, 200);
    }

    #[test]
    fn violations_close() {
        let ex = exports();
        let mut out = BytesMut::new();
        let mut n = ServerNegotiator::new(&ex, None, 4096);
        let mut input = BytesMut::from(&4u32.to_be_bytes()[..]);
        assert_eq!(
            n.advance(&mut input, &mut out),
            Err(NegotiateError::BadClientFlags(4))
        );

        let mut n = ServerNegotiator::new(&ex, None, 4096);
        let mut input = BytesMut::from(&1u32.to_be_bytes()[..]);
        input.extend_from_slice(&[0u8; 16]);
        assert!(matches!(
            n.advance(&mut input, &mut out),
            Err(NegotiateError::Proto(ProtoError::BadMagic { .. }))
        ));

        let mut n = ServerNegotiator::new(&ex, None, 4096);
        let mut input = BytesMut::from(&1u32.to_be_bytes()[..]);
        let mut big = opt_bytes(ClientOption::List);
        big[12..16].copy_from_slice(&u32::MAX.to_be_bytes());
        input.extend_from_slice(&big);
        out.clear();
        assert!(matches!(
            n.advance(&mut input, &mut out),
            Err(NegotiateError::OptionTooLong { .. })
        ));
        assert_eq!(replies(&out)[0].1, rep::ERR_TOO_BIG);

        let mut n = ServerNegotiator::new(&ex, None, 4096);
        let mut input = BytesMut::from(&1u32.to_be_bytes()[..]);
        input.extend_from_slice(&opt_bytes(ClientOption::ExportName("zz".into())));
        assert!(matches!(
            n.advance(&mut input, &mut out),
            Err(NegotiateError::UnknownExport(_))
        ));

        let mut n = ServerNegotiator::new(&ex, None, 4096);
        let mut input = BytesMut::from(&1u32.to_be_bytes()[..]);
        for _ in 0..=OPTIONS_PER_CONNECTION_MAX + OPTIONS_PER_EXPORT * ex.len() as u32 {
            input.extend_from_slice(&opt_bytes(ClientOption::List));
        }
        assert_eq!(
            n.advance(&mut input, &mut out),
            Err(NegotiateError::TooManyOptions)
        );
    }

    /// An option with arbitrary data.
    fn raw_opt(code: u32, data: &[u8]) -> BytesMut {
        let mut b = BytesMut::new();
        b.put_u64(crate::proto::IHAVEOPT);
        b.put_u32(code);
        b.put_u32(data.len() as u32);
        b.put_slice(data);
        b
    }

    fn meta(name: &str, queries: &[&str]) -> MetaContextRequest {
        MetaContextRequest {
            name: name.into(),
            queries: queries.iter().map(|q| q.to_string()).collect(),
        }
    }

    /// A negotiator past the client flags, fed `opts`; returns the progress
    /// and the (option, type, data) replies.
    fn haggle(
        n: &mut ServerNegotiator<'_>,
        opts: &[BytesMut],
    ) -> (Result<Progress, NegotiateError>, Vec<Replied>) {
        let mut input = BytesMut::new();
        for o in opts {
            input.extend_from_slice(o);
        }
        let mut out = BytesMut::new();
        let p = n.advance(&mut input, &mut out);
        // Option replies, up to an EXPORT_NAME answer (which has no magic).
        let mut at = 0;
        while let Ok(h) = decode_option_reply_header(&out[at..]) {
            at += OPTION_REPLY_HEADER_BYTES + h.data_len_bytes as usize;
        }
        (p, replies(&out[..at]))
    }

    /// STARTTLS with data is invalid (the spec: it carries none), not
    /// acknowledged; TLS is still required after it, and a STARTTLS without
    /// data then starts it. Before (review of 2026-12-06), the data was
    /// dropped and TLS started.
    #[test]
    fn starttls_with_data_is_invalid() {
        let ex = exports();
        let mut n = ServerNegotiator::new(&ex, Some(0), 4096).with_tls(TlsPolicy::Require);
        let (p, r) = haggle(
            &mut n,
            &[
                BytesMut::from(&1u32.to_be_bytes()[..]),
                raw_opt(opt::STARTTLS, b"abcd"),
                raw_opt(opt::LIST, b""),
                raw_opt(opt::STARTTLS, b""),
            ],
        );
        let types: Vec<u32> = r.iter().map(|x| x.1).collect();
        assert_eq!(types, vec![rep::ERR_INVALID, rep::ERR_TLS_REQD, rep::ACK]);
        assert_eq!(p, Ok(Progress::StartTls));
    }

    fn base_allocation_reply() -> Vec<u8> {
        let mut d = BASE_ALLOCATION_ID.to_be_bytes().to_vec();
        d.extend_from_slice(BASE_ALLOCATION.as_bytes());
        d
    }

    #[test]
    fn structured_replies_and_base_allocation_are_negotiated() {
        let ex = exports();
        let mut n = ServerNegotiator::new(&ex, Some(0), 4096);
        let go = opt_bytes(ClientOption::Go(InfoRequest {
            name: "lun0".into(),
            infos: vec![],
        }));
        let (p, r) = haggle(
            &mut n,
            &[
                BytesMut::from(&1u32.to_be_bytes()[..]),
                raw_opt(opt::STRUCTURED_REPLY, b"x"),
                opt_bytes(ClientOption::SetMetaContext(meta(
                    "lun0",
                    &[BASE_ALLOCATION],
                ))),
                opt_bytes(ClientOption::StructuredReply),
                opt_bytes(ClientOption::ListMetaContext(meta("", &[]))),
                opt_bytes(ClientOption::ListMetaContext(meta("lun0", &["base:"]))),
                opt_bytes(ClientOption::ListMetaContext(meta(
                    "lun0",
                    &["qemu:dirty-bitmap:b0", "other:thing"],
                ))),
                opt_bytes(ClientOption::SetMetaContext(meta(
                    "lun0",
                    &["nope:x", BASE_ALLOCATION],
                ))),
                go.clone(),
            ],
        );
        assert_eq!(p, Ok(Progress::Transmission { export_index: 0 }));
        let ba = base_allocation_reply();
        let got: Vec<(u32, u32)> = r.iter().map(|x| (x.0, x.1)).collect();
        use opt::{LIST_META_CONTEXT as L, SET_META_CONTEXT as S, STRUCTURED_REPLY as SR};
        assert_eq!(
            &got[..11],
            &[
                (SR, rep::ERR_INVALID),
                (S, rep::ERR_INVALID),
                (SR, rep::ACK),
                (L, rep::META_CONTEXT),
                (L, rep::ACK),
                (L, rep::META_CONTEXT),
                (L, rep::ACK),
                (L, rep::ACK),
                (S, rep::META_CONTEXT),
                (S, rep::ACK),
                (opt::GO, rep::INFO),
            ]
        );
        assert_eq!(r[3].2, ba);
        assert_eq!(r[8].2, ba);
        assert_eq!(
            crate::proto::decode_meta_context_reply(&r[8].2),
            Ok((BASE_ALLOCATION_ID, BASE_ALLOCATION.to_string()))
        );
        assert_eq!(
            n.session(),
            Session {
                structured_replies: true,
                base_allocation: Some(BASE_ALLOCATION_ID)
            }
        );

        // Without any of it: simple replies, no context.
        let mut n = ServerNegotiator::new(&ex, Some(0), 4096);
        let (p, _) = haggle(&mut n, &[BytesMut::from(&1u32.to_be_bytes()[..]), go]);
        assert!(matches!(p, Ok(Progress::Transmission { .. })));
        assert_eq!(n.session(), Session::default());
    }

    #[test]
    fn meta_context_for_another_export_or_replaced_is_dropped() {
        let ex = exports();
        let flags = BytesMut::from(&1u32.to_be_bytes()[..]);
        let sr = opt_bytes(ClientOption::StructuredReply);
        // Set for lun1, then GO lun0: no context.
        let mut n = ServerNegotiator::new(&ex, Some(0), 4096);
        let (p, _) = haggle(
            &mut n,
            &[
                flags.clone(),
                sr.clone(),
                opt_bytes(ClientOption::SetMetaContext(meta(
                    "lun1",
                    &[BASE_ALLOCATION],
                ))),
                opt_bytes(ClientOption::ExportName("lun0".into())),
            ],
        );
        assert_eq!(p, Ok(Progress::Transmission { export_index: 0 }));
        assert_eq!(n.session().base_allocation, None);
        assert!(n.session().structured_replies);
        // Set, then a SET with no queries (selects nothing), or an invalid SET.
        for second in [
            opt_bytes(ClientOption::SetMetaContext(meta("lun0", &[]))),
            raw_opt(opt::SET_META_CONTEXT, &[0, 0, 0, 9]),
            opt_bytes(ClientOption::SetMetaContext(meta(
                "nope",
                &[BASE_ALLOCATION],
            ))),
        ] {
            let mut n = ServerNegotiator::new(&ex, Some(0), 4096);
            let (p, r) = haggle(
                &mut n,
                &[
                    flags.clone(),
                    sr.clone(),
                    opt_bytes(ClientOption::SetMetaContext(meta("", &[BASE_ALLOCATION]))),
                    second,
                    opt_bytes(ClientOption::ExportName("lun0".into())),
                ],
            );
            assert_eq!(p, Ok(Progress::Transmission { export_index: 0 }));
            assert_eq!(r[1].1, rep::META_CONTEXT);
            assert_eq!(n.session().base_allocation, None, "replies {r:?}");
        }
    }

    #[test]
    fn meta_context_lengths_are_checked() {
        let ex = exports();
        let with_queries = |name: &[u8], count: u32, queries: &[&[u8]]| {
            let mut d = Vec::new();
            d.extend_from_slice(&(name.len() as u32).to_be_bytes());
            d.extend_from_slice(name);
            d.extend_from_slice(&count.to_be_bytes());
            for q in queries {
                d.extend_from_slice(&(q.len() as u32).to_be_bytes());
                d.extend_from_slice(q);
            }
            d
        };
        let long = vec![b'a'; META_QUERY_BYTES_MAX + 1];
        let many: Vec<&[u8]> = vec![b"base:allocation"; META_QUERIES_MAX + 1];
        let mut name_past_end = with_queries(b"lun0", 0, &[]);
        name_past_end[3] = 200;
        let mut query_past_end = with_queries(b"lun0", 1, &[b"base:allocation"]);
        let at = query_past_end.len() - 15 - 1;
        query_past_end[at] = 16;
        let mut trailing = with_queries(b"lun0", 1, &[b"base:allocation"]);
        trailing.push(0);
        let cases: Vec<(Vec<u8>, u32)> = vec![
            (vec![], rep::ERR_INVALID),
            (vec![0, 0, 0, 0, 0, 0, 0], rep::ERR_INVALID),
            (name_past_end, rep::ERR_INVALID),
            (
                with_queries(b"lun0", 2, &[b"base:allocation"]),
                rep::ERR_INVALID,
            ),
            (with_queries(b"lun0", u32::MAX, &[]), rep::ERR_TOO_BIG),
            (
                with_queries(b"lun0", many.len() as u32, &many),
                rep::ERR_TOO_BIG,
            ),
            (with_queries(b"lun0", 1, &[&long]), rep::ERR_TOO_BIG),
            (query_past_end, rep::ERR_INVALID),
            (trailing, rep::ERR_INVALID),
            (with_queries(b"lun0", 1, &[b"base:\xff"]), rep::ERR_INVALID),
            (with_queries(b"lun0", 1, &[b"bad\0nul"]), rep::ERR_INVALID),
            (
                with_queries(b"lun9", 1, &[b"base:allocation"]),
                rep::ERR_UNKNOWN,
            ),
            (
                with_queries(b"lun0", 1, &[b"base:allocation"]),
                rep::META_CONTEXT,
            ),
        ];
        for (data, want) in cases {
            for code in [opt::LIST_META_CONTEXT, opt::SET_META_CONTEXT] {
                let mut n = ServerNegotiator::new(&ex, Some(0), 4096);
                let (p, r) = haggle(
                    &mut n,
                    &[
                        BytesMut::from(&1u32.to_be_bytes()[..]),
                        opt_bytes(ClientOption::StructuredReply),
                        raw_opt(code, &data),
                    ],
                );
                assert_eq!(p, Ok(Progress::NeedInput));
                assert_eq!((r[1].0, r[1].1), (code, want), "data {data:?}");
            }
        }
    }

    #[test]
    fn meta_context_options_need_tls_first_and_reset_by_it() {
        let ex = exports();
        let mut n = ServerNegotiator::new(&ex, Some(0), 4096).with_tls(TlsPolicy::Require);
        let (p, r) = haggle(
            &mut n,
            &[
                BytesMut::from(&1u32.to_be_bytes()[..]),
                opt_bytes(ClientOption::StructuredReply),
                opt_bytes(ClientOption::ListMetaContext(meta("lun0", &[]))),
                opt_bytes(ClientOption::SetMetaContext(meta(
                    "lun0",
                    &[BASE_ALLOCATION],
                ))),
                opt_bytes(ClientOption::Unsupported(opt::STARTTLS)),
            ],
        );
        assert_eq!(p, Ok(Progress::StartTls));
        let types: Vec<u32> = r.iter().map(|x| x.1).collect();
        assert_eq!(
            types,
            vec![
                rep::ERR_TLS_REQD,
                rep::ERR_TLS_REQD,
                rep::ERR_TLS_REQD,
                rep::ACK
            ]
        );
        n.tls_started();
        assert_eq!(n.session(), Session::default());
        // Inside TLS: SET still needs structured replies negotiated inside TLS.
        let (p, r) = haggle(
            &mut n,
            &[
                opt_bytes(ClientOption::SetMetaContext(meta(
                    "lun0",
                    &[BASE_ALLOCATION],
                ))),
                opt_bytes(ClientOption::StructuredReply),
                opt_bytes(ClientOption::SetMetaContext(meta(
                    "lun0",
                    &[BASE_ALLOCATION],
                ))),
                opt_bytes(ClientOption::ExportName("lun0".into())),
            ],
        );
        assert_eq!(p, Ok(Progress::Transmission { export_index: 0 }));
        assert_eq!(r[0].1, rep::ERR_INVALID);
        assert_eq!(r[1].1, rep::ACK);
        assert_eq!(r[2].1, rep::META_CONTEXT);
        assert_eq!(n.session().base_allocation, Some(BASE_ALLOCATION_ID));

        // Plain negotiator state set before a STARTTLS does not survive it.
        let mut n = ServerNegotiator::new(&ex, Some(0), 4096);
        let _ = haggle(
            &mut n,
            &[
                BytesMut::from(&1u32.to_be_bytes()[..]),
                opt_bytes(ClientOption::StructuredReply),
                opt_bytes(ClientOption::SetMetaContext(meta(
                    "lun0",
                    &[BASE_ALLOCATION],
                ))),
            ],
        );
        n.tls_started();
        let (p, _) = haggle(
            &mut n,
            &[opt_bytes(ClientOption::ExportName("lun0".into()))],
        );
        assert!(matches!(p, Ok(Progress::Transmission { .. })));
        assert_eq!(n.session(), Session::default());
    }

    #[test]
    fn abort_is_acked() {
        let ex = exports();
        let mut n = ServerNegotiator::new(&ex, None, 4096);
        let mut input = BytesMut::from(&1u32.to_be_bytes()[..]);
        input.extend_from_slice(&opt_bytes(ClientOption::Abort));
        let mut out = BytesMut::new();
        assert_eq!(n.advance(&mut input, &mut out), Ok(Progress::Abort));
        assert_eq!(replies(&out), vec![(opt::ABORT, rep::ACK, vec![])]);
    }

    proptest! {
        #[test]
        fn never_panics_on_arbitrary_bytes(
            chunks in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..64), 0..8),
            prefix_ok: bool,
        ) {
            let ex = exports();
            let mut n = ServerNegotiator::new(&ex, Some(0), 64);
            let mut input = BytesMut::new();
            if prefix_ok {
                input.extend_from_slice(&1u32.to_be_bytes());
                input.extend_from_slice(&crate::proto::IHAVEOPT.to_be_bytes());
            }
            let mut out = BytesMut::new();
            for c in chunks {
                input.extend_from_slice(&c);
                match n.advance(&mut input, &mut out) {
                    Ok(Progress::NeedInput) => {}
                    _ => break,
                }
                prop_assert!(input.len() < 64 + 16 + 64 * 8 + 16);
            }
        }

        #[test]
        fn option_roundtrip(name in "[a-z0-9]{0,40}", infos in proptest::collection::vec(any::<u16>(), 0..8)) {
            let r = InfoRequest { name: name.clone(), infos };
            for o in [ClientOption::Go(r.clone()), ClientOption::Info(r.clone()), ClientOption::ExportName(name.clone())] {
                let b = opt_bytes(o.clone());
                let h = decode_option_header(&b).unwrap();
                prop_assert_eq!(h.data_len_bytes as usize, b.len() - 16);
                prop_assert_eq!(parse_option(h.option, &b[16..]).unwrap(), o);
            }
        }
    }
}
