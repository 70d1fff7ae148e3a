//! Arbitrary bytes -> header parse, full PDU framing (with and without digests),
//! AHS and text parsing. Nothing may panic.
#![no_main]

use iscsi_proto::bytes::BytesMut;
use iscsi_proto::frame::{decode_frame, FrameLimits};
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
    let mut buf = BytesMut::from(data.get(1..).unwrap_or(&[]));
    loop {
        match decode_frame(&mut buf, &limits) {
            Ok(Some(frame)) => {
                let _ = iscsi_proto::text::parse_text(&frame.data);
            }
            Ok(None) => break,
            Err(e) if e.consumed => continue,
            Err(_) => break,
        }
    }
});
