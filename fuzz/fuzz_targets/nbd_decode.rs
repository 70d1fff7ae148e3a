//! Arbitrary bytes fed to every NBD parser of network input: the server's option
//! haggling state machine (in chunks, so partial messages are exercised; it
//! parses structured reply and LIST/SET_META_CONTEXT options too, and what it
//! negotiated must be consistent), the
//! transmission request decoder (with and without TLS required), and the client's decoders for the greeting,
//! option replies, `NBD_INFO_*` items, meta context replies, the EXPORT_NAME
//! answer, simple replies and structured reply chunk headers.
//! Nothing may panic, and the negotiator must never buffer more than one bounded
//! option plus one chunk.
#![no_main]

use block::BytesMut;
use libfuzzer_sys::fuzz_target;
use nbd::proto::{
    decode_export_name_reply, decode_info, decode_meta_context_reply, decode_option_header,
    decode_option_reply_header, decode_request, decode_server_greeting, decode_simple_reply,
    decode_structured_reply_header, parse_option, tflag, BlockSizes, ExportInfo, Progress,
    ServerNegotiator, TlsPolicy, BASE_ALLOCATION_ID, IHAVEOPT, OPTION_HEADER_BYTES, REPLIES_PENDING_MAX,
    REQUEST_BYTES,
};

/// Option data bound used here (small, so the bound is actually hit).
const OPTION_BYTES_MAX: usize = 512;

fn exports() -> Vec<ExportInfo> {
    ["lun0", "lun1", ""]
        .iter()
        .map(|n| ExportInfo {
            name: n.to_string(),
            description: "fuzz".into(),
            size_bytes: 1 << 20,
            transmission_flags: tflag::HAS_FLAGS | tflag::SEND_FLUSH,
            block_sizes: BlockSizes {
                min_bytes: 1,
                preferred_bytes: 4096,
                max_bytes: 32 << 20,
            },
        })
        .collect()
}

fuzz_target!(|data: &[u8]| {
    let Some((&ctl, rest)) = data.split_first() else {
        return;
    };
    let exports = exports();
    // Bit 7 of the control byte: TLS required (STARTTLS is acknowledged and the
    // "TLS handshake" is taken as done, so both sides of the rule are reached).
    let tls = if ctl & 0x80 != 0 {
        TlsPolicy::Require
    } else {
        TlsPolicy::Off
    };
    let mut neg = ServerNegotiator::new(&exports, Some(0), OPTION_BYTES_MAX).with_tls(tls);
    let _ = neg.greeting();
    let mut input = BytesMut::new();
    if ctl & 1 != 0 {
        // A valid prefix (client flags + option magic) lets the fuzzer reach options.
        input.extend_from_slice(&1u32.to_be_bytes());
        input.extend_from_slice(&IHAVEOPT.to_be_bytes());
    }
    let chunk = ((ctl as usize >> 1) & 0x3f) + 1;
    let mut out = BytesMut::new();
    'pieces: for piece in rest.chunks(chunk) {
        input.extend_from_slice(piece);
        // the server at its connection bounds or not, as each piece says
        // (a refused GO, then one served, an EXPORT_NAME refused)
        neg.set_busy(piece.first().is_some_and(|b| b & 1 != 0));
        let mut r = neg.advance(&mut input, &mut out);
        while let Ok(Progress::Flush) = r {
            assert!(out.len() >= REPLIES_PENDING_MAX);
            out.clear();
            r = neg.advance(&mut input, &mut out);
        }
        match r {
            Ok(Progress::Flush) => unreachable!(),
            Ok(Progress::NeedInput) => {
                assert!(input.len() <= OPTION_HEADER_BYTES + OPTION_BYTES_MAX + chunk + 12);
            }
            Ok(Progress::Transmission { export_index }) => {
                assert!(export_index < exports.len());
                let s = neg.session();
                if let Some(id) = s.base_allocation {
                    assert!(s.structured_replies, "a context needs structured replies");
                    assert_eq!(id, BASE_ALLOCATION_ID);
                }
                // What follows is the transmission phase.
                for r in input.chunks(REQUEST_BYTES) {
                    let _ = decode_request(r);
                }
                break 'pieces;
            }
            Ok(Progress::StartTls) => {
                assert!(input.is_empty(), "no plaintext carried into TLS");
                neg.tls_started();
            }
            Ok(Progress::Abort) | Err(_) => break 'pieces,
        }
        out.clear();
    }

    for r in rest.chunks(REQUEST_BYTES) {
        if let Ok(req) = decode_request(r) {
            let _ = req.payload_bytes();
        }
    }
    let _ = decode_simple_reply(rest);
    let _ = decode_structured_reply_header(rest);
    let _ = decode_meta_context_reply(rest);
    let _ = decode_server_greeting(rest);
    let _ = decode_option_reply_header(rest);
    let _ = decode_export_name_reply(rest);
    let _ = decode_info(rest);
    let _ = decode_option_header(rest);
    if rest.len() >= 4 {
        let code = u32::from_be_bytes([rest[0], rest[1], rest[2], rest[3]]) & 0xf;
        let _ = parse_option(code, &rest[4..]);
    }
});
