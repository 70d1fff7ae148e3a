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
            Err(e) if e.consumed => whole.push(Err(e)),
            Err(e) => {
                whole.push(Err(e));
                break;
            }
        }
    }
    // The same bytes through the connection's read buffer: what the login
    // left over first (up to 1008 bytes, from the flags byte), then reads of
    // sizes taken from the input in turn (1 to 255 bytes, or as much as room
    // allows), sometimes after a read that found nothing (`idle`). Commands
    // with more than 16 bytes of data count as long, and their data must
    // share its allocation with nothing.
    const LONG: usize = 16;
    let leftover = ((flags >> 2) as usize * 16).min(wire.len());
    let mut rb = RecvBuf::with_threshold(BytesMut::from(&wire[..leftover]), LONG);
    let (mut pos, mut turn, mut chunked) = (leftover, 0, Vec::new());
    'read: loop {
        loop {
            match rb.next_frame(&limits) {
                Ok(Some(frame)) => {
                    let long = frame.raw_header[0] & 0x3f == 0x01 && frame.data.len() > LONG;
                    let (raw, data) = (frame.raw_header, frame.data);
                    drop((frame.header_bytes, frame.ahs));
                    assert!(!long || data.is_unique(), "a long command's data shares its buffer");
                    chunked.push(Ok((raw, data)));
                }
                Ok(None) => break,
                Err(e) if e.consumed => chunked.push(Err(e)),
                Err(e) => {
                    chunked.push(Err(e));
                    break 'read;
                }
            }
        }
        if pos == wire.len() {
            break;
        }
        let pick = wire[turn % wire.len()];
        turn += 1;
        if pick & 0x40 != 0 {
            // readable, but the read found nothing
            rb.room(&limits);
            rb.idle();
        }
        let room = rb.room(&limits);
        assert!(room > 0, "no room for a read: it would read as the end");
        let t = rb.target();
        let spare = t.capacity() - t.len();
        let chunk = if pick == 0xff { usize::MAX } else { 1 + pick as usize };
        let n = room.min(spare).min(chunk).min(wire.len() - pos);
        assert!(n > 0, "a read buffer with no spare room");
        t.extend_from_slice(&wire[pos..pos + n]);
        pos += n;
    }
    assert_eq!(whole, chunked, "the read buffer framed the bytes otherwise");
});
