//! Arbitrary bytes fed to the replication/witness frame decoder, as one stream:
//! frames are decoded until one is incomplete or an error comes. Nothing may
//! panic, `Ok(None)` must consume nothing, and every decoded message must survive
//! a re-encode/decode round trip (re-encoding to the very bytes it came from,
//! since the encoding is canonical).
//!
//! The input is decoded twice: as is, then with the CRC of every whole frame
//! repaired, so that the body parsers are reached without the fuzzer having to
//! forge CRC-32Cs.
#![no_main]

use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use replica_proto::scsi::{ScsiAnswer, ScsiMsg};
use replica_proto::{decode, encode, Message, FRAME_HEADER_BYTES, PAYLOAD_BYTES_MAX};

/// Decodes `stream` frame by frame, checking every message on the way.
fn check_stream(stream: &[u8]) {
    let mut buf = BytesMut::from(stream);
    loop {
        let before = buf.len();
        let msg = match decode(&mut buf) {
            Ok(Some(msg)) => msg,
            Ok(None) => {
                assert_eq!(buf.len(), before, "Ok(None) consumed input");
                break;
            }
            Err(_) => break,
        };
        let start = stream.len() - before;
        let end = stream.len() - buf.len();
        let mut again = BytesMut::new();
        encode(&msg, &mut again);
        assert_eq!(&again[..], &stream[start..end], "not canonical: {msg:?}");
        assert_eq!(decode(&mut again), Ok(Some(msg.clone())));
        assert!(again.is_empty());
        // the SCSI payloads inside are parsed by the SCSI glue (forwarded PR OUTs
        // and SET TARGET PORT GROUPS, reservation and explicit ALUA states): they
        // must not panic either, and what parses must survive a round trip
        if let Message::ScsiRequest { data, .. } | Message::ScsiReply { data, .. } = msg {
            scsi_payloads(data);
        }
    }
}

fn scsi_payloads(data: bytes::Bytes) {
    if let Some(m) = ScsiMsg::decode(data.clone()) {
        assert_eq!(ScsiMsg::decode(m.encode()), Some(m));
    }
    if let Some(a) = ScsiAnswer::decode(data) {
        assert_eq!(ScsiAnswer::decode(a.encode()), Some(a));
    }
}

/// `stream` with the CRC field of every whole frame set to its body's CRC-32C.
fn with_crcs_repaired(stream: &[u8]) -> Vec<u8> {
    let mut v = stream.to_vec();
    let mut pos = 0;
    while let Some(header) = v.get(pos..pos + FRAME_HEADER_BYTES) {
        let len = u32::from_be_bytes([header[8], header[9], header[10], header[11]]);
        if len > PAYLOAD_BYTES_MAX {
            break;
        }
        let end = pos + FRAME_HEADER_BYTES + len as usize;
        let Some(body) = v.get(pos + FRAME_HEADER_BYTES..end) else {
            break;
        };
        let crc = crc32c::crc32c(body);
        v[pos + 12..pos + 16].copy_from_slice(&crc.to_be_bytes());
        pos = end;
    }
    v
}

fuzz_target!(|data: &[u8]| {
    scsi_payloads(bytes::Bytes::copy_from_slice(data));
    check_stream(data);
    check_stream(&with_crcs_repaired(data));
});
