//! Arbitrary bytes -> header parse, full PDU framing (with and without digests),
//! AHS and text parsing; and the same bytes through the connection's read
//! buffer (`recv::RecvBuf`, own buffers for long commands, guessed lengths),
//! read in chunks the input picks, which must give the same frames and errors
//! in the same order. Nothing may panic.
#![no_main]

use iscsi_proto::bytes::BytesMut;
use iscsi_proto::frame::{decode_frame, FrameLimits};
use iscsi_proto::recv::RecvBuf;
use iscsi_proto::pdu::{parse_bhs, BHS_LEN};
use iscsi_proto::target::parse_target_bhs;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Some(h) = data.get(..BHS_LEN) {
        let mut raw = [0u8; BHS_LEN];
        raw.copy_from_slice(h);
        let _ = parse_bhs(&raw);
        let _ = parse_target_bhs(&raw);
    }
    let flags = data.first().copied().unwrap_or(0);
    let limits = FrameLimits {
        header_digest: flags & 1 != 0,
        data_digest: flags & 2 != 0,
        max_data_segment_bytes: 64 * 1024,
        max_ahs_bytes: 1020,
    };
    let wire = data.get(1..).unwrap_or(&[]);
    let mut buf = BytesMut::from(wire);
    let mut whole = Vec::new();
    loop {
        match decode_frame(&mut buf, &limits) {
            Ok(Some(frame)) => {
                let _ = iscsi_proto::text::parse_text(&frame.data);
                whole.push(Ok((frame.raw_header, frame.data)));
            }
            Ok(None) => break,
            Err(e) if e.consumed => whole.push(Err(e.error)),
            Err(e) => {
                whole.push(Err(e.error));
                break;
            }
        }
    }
    // read in chunks of 1 to 256 bytes, sizes taken from the input in turn;
    // commands with more than 16 bytes of data count as long
    let mut rb = RecvBuf::with_threshold(BytesMut::new(), 16);
    let (mut pos, mut turn, mut chunked) = (0, 0, Vec::new());
    'read: loop {
        loop {
            match rb.next_frame(&limits) {
                Ok(Some(frame)) => chunked.push(Ok((frame.raw_header, frame.data))),
                Ok(None) => break,
                Err(e) if e.consumed => chunked.push(Err(e.error)),
                Err(e) => {
                    chunked.push(Err(e.error));
                    break 'read;
                }
            }
        }
        if pos == wire.len() {
            break;
        }
        let room = rb.room(&limits);
        assert!(room > 0, "no room for a read: it would read as the end");
        let t = rb.target();
        let spare = t.capacity() - t.len();
        let chunk = 1 + wire[turn % wire.len()] as usize;
        turn += 1;
        let n = room.min(spare).min(chunk).min(wire.len() - pos);
        assert!(n > 0, "a read buffer with no spare room");
        t.extend_from_slice(&wire[pos..pos + n]);
        pos += n;
    }
    assert_eq!(whole, chunked, "the read buffer framed the bytes otherwise");
});
