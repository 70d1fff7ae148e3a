//! Tests of the codec: round trips of arbitrary messages, partial and back-to-back
//! frames, every error variant from hand-made frames, and arbitrary input.

use super::*;
use proptest::collection::vec;
use proptest::prelude::*;
use proptest::sample::Index;

// ---------------------------------------------------------------- strategies

/// Payloads of up to `max` bytes.
fn payload(max: usize) -> impl Strategy<Value = Bytes> {
    vec(any::<u8>(), 0..=max).prop_map(Bytes::from)
}

/// Names within [`NAME_BYTES_MAX`] bytes: ASCII up to the limit, or any printable
/// characters (at most 4 bytes each, so 63 of them fit).
fn name() -> impl Strategy<Value = String> {
    prop_oneof!["[a-zA-Z0-9._-]{0,255}", "\\PC{0,63}"]
}

/// Refusal reasons within [`crate::REASON_BYTES_MAX`] bytes (longer than a name).
fn reason() -> impl Strategy<Value = String> {
    prop_oneof!["[ -~]{0,1024}", "\\PC{0,256}"]
}

fn gens() -> impl Strategy<Value = Generations> {
    (any::<u64>(), any::<u64>()).prop_map(|(current, synced)| Generations { current, synced })
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (any::<u64>(), any::<bool>(), payload(4096)).prop_map(|(lba, fua, data)| Op::Write {
            lba,
            fua,
            data
        }),
        (any::<u64>(), any::<u64>(), any::<bool>()).prop_map(|(lba, blocks, may_unmap)| {
            Op::WriteZeroes {
                lba,
                blocks,
                may_unmap,
            }
        }),
        (any::<u64>(), any::<u64>()).prop_map(|(lba, blocks)| Op::Discard { lba, blocks }),
        Just(Op::Flush),
        any::<u64>().prop_map(|block_count| Op::Grow { block_count }),
        (any::<u64>(), any::<u64>(), any::<bool>(), payload(4096)).prop_map(
            |(copy, lba, fua, data)| Op::CopyWrite {
                copy,
                lba,
                fua,
                data
            }
        ),
        (
            any::<u64>(),
            any::<bool>(),
            (0usize..=2048).prop_flat_map(|n| (vec(any::<u8>(), n), vec(any::<u8>(), n)))
        )
            .prop_map(|(lba, fua, (compare, data))| Op::CompareAndWrite {
                lba,
                fua,
                compare: compare.into(),
                data: data.into(),
            }),
    ]
}

fn op_result() -> impl Strategy<Value = OpResult> {
    prop_oneof![
        Just(OpResult::Ok),
        any::<u32>().prop_map(|offset| OpResult::Miscompare { offset }),
        (any::<u8>(), any::<u64>()).prop_map(|(code, lba)| OpResult::Error { code, lba }),
    ]
}

/// Every [`Message`] variant, with payloads of up to 4 KiB.
fn message() -> impl Strategy<Value = Message> {
    prop_oneof![
        (
            any::<u8>(),
            name(),
            any::<u32>(),
            any::<u64>(),
            any::<u32>(),
            gens(),
            any::<u32>()
        )
            .prop_map(
                |(node_id, volume, block_size_bytes, block_count, region_bytes, gens, flags)| {
                    Message::Hello {
                        node_id,
                        volume,
                        block_size_bytes,
                        block_count,
                        region_bytes,
                        gens,
                        flags,
                    }
                }
            ),
        (any::<u64>(), payload(4096))
            .prop_map(|(first_region, bits)| Message::Bitmap { first_region, bits }),
        Just(Message::BitmapDone),
        (any::<u64>(), op()).prop_map(|(id, op)| Message::Apply { id, op }),
        (any::<u64>(), op()).prop_map(|(id, op)| Message::Forward { id, op }),
        (any::<u64>(), any::<u64>())
            .prop_map(|(id, forward_id)| Message::ApplyForwarded { id, forward_id }),
        (any::<u64>(), any::<u64>(), payload(4096))
            .prop_map(|(id, lba, data)| Message::ResyncData { id, lba, data }),
        (any::<u64>(), gens()).prop_map(|(id, gens)| Message::ResyncDone { id, gens }),
        (any::<u64>(), op_result()).prop_map(|(id, result)| Message::Done { id, result }),
        (any::<u64>(), payload(4096)).prop_map(|(id, data)| Message::ScsiRequest { id, data }),
        (any::<u64>(), payload(4096)).prop_map(|(id, data)| Message::ScsiReply { id, data }),
        name().prop_map(|reason| Message::Detach { reason }),
        reason().prop_map(|reason| Message::Refused { reason }),
        (any::<u64>(), any::<u64>()).prop_map(|(id, copy)| Message::CopyEnd { id, copy }),
        (any::<u64>(), any::<u64>(), any::<u64>()).prop_map(|(id, lba, blocks)| Message::Repair {
            id,
            lba,
            blocks
        }),
        (any::<u64>(), any::<u64>(), any::<u64>())
            .prop_map(|(id, lba, blocks)| Message::ReadCopy { id, lba, blocks }),
        (any::<u64>(), payload(4096)).prop_map(|(id, data)| Message::CopyData { id, data }),
        (any::<u64>(), any::<u64>(), payload(4096))
            .prop_map(|(id, lba, data)| Message::RepairData { id, lba, data }),
        any::<u64>().prop_map(|seq| Message::Ping { seq }),
        any::<u64>().prop_map(|seq| Message::Pong { seq }),
        (name(), any::<u8>(), any::<u64>()).prop_map(|(cluster, node_id, seq)| {
            Message::WitnessClaim {
                cluster,
                node_id,
                seq,
            }
        }),
        (name(), any::<u8>(), any::<u64>()).prop_map(|(cluster, node_id, seq)| {
            Message::WitnessRelease {
                cluster,
                node_id,
                seq,
            }
        }),
        any::<u8>().prop_map(|holder| Message::WitnessAnswer { holder }),
    ]
}

// ---------------------------------------------------------------- helpers

/// One message of every variant (and every op and result).
fn samples() -> Vec<Message> {
    let data = Bytes::from((0..=255u8).cycle().take(1024).collect::<Vec<_>>());
    let mut v = vec![
        Message::Hello {
            node_id: 1,
            volume: "vol-é".into(),
            block_size_bytes: 4096,
            block_count: 1 << 30,
            region_bytes: 1 << 20,
            gens: Generations {
                current: 7,
                synced: 5,
            },
            flags: crate::hello_flags::CONSISTENT | crate::hello_flags::SURVIVOR,
        },
        Message::Bitmap {
            first_region: 42,
            bits: Bytes::from_static(&[0xa5, 0x01]),
        },
        Message::BitmapDone,
        Message::ApplyForwarded {
            id: 9,
            forward_id: 3,
        },
        Message::ResyncData {
            id: 10,
            lba: 8,
            data: data.clone(),
        },
        Message::ResyncDone {
            id: 11,
            gens: Generations {
                current: 8,
                synced: 8,
            },
        },
        Message::ScsiRequest {
            id: 12,
            data: Bytes::from_static(b"reservations"),
        },
        Message::ScsiReply {
            id: 13,
            data: Bytes::from_static(b"answer"),
        },
        Message::Detach {
            reason: "write fault at lba 7".into(),
        },
        Message::Refused {
            reason: "r".repeat(crate::REASON_BYTES_MAX),
        },
        Message::CopyEnd { id: 14, copy: 3 },
        Message::Repair {
            id: 15,
            lba: 8,
            blocks: 2,
        },
        Message::ReadCopy {
            id: 16,
            lba: u64::MAX,
            blocks: 1,
        },
        Message::CopyData {
            id: 16,
            data: Bytes::from_static(b"blocks"),
        },
        Message::RepairData {
            id: 17,
            lba: 8,
            data: Bytes::from_static(b"repaired"),
        },
        Message::Ping { seq: 1 },
        Message::Pong { seq: u64::MAX },
        Message::WitnessClaim {
            cluster: "c".repeat(NAME_BYTES_MAX),
            node_id: 2,
            seq: u64::MAX,
        },
        Message::WitnessRelease {
            cluster: String::new(),
            node_id: 1,
            seq: 7,
        },
        Message::WitnessAnswer { holder: 0 },
    ];
    let ops = [
        Op::Write {
            lba: 1,
            fua: true,
            data: data.clone(),
        },
        Op::WriteZeroes {
            lba: 2,
            blocks: 3,
            may_unmap: true,
        },
        Op::Discard { lba: 4, blocks: 5 },
        Op::Flush,
        Op::Grow { block_count: 7 },
        Op::CopyWrite {
            copy: 5,
            lba: 9,
            fua: true,
            data: data.slice(..512),
        },
        Op::CompareAndWrite {
            lba: 6,
            fua: false,
            compare: data.slice(..512),
            data: data.slice(512..),
        },
    ];
    for (i, op) in ops.into_iter().enumerate() {
        v.push(Message::Apply {
            id: i as u64,
            op: op.clone(),
        });
        v.push(Message::Forward { id: i as u64, op });
    }
    for result in [
        OpResult::Ok,
        OpResult::Miscompare { offset: 17 },
        OpResult::Error {
            code: crate::error_codes::MEDIUM,
            lba: 99,
        },
    ] {
        v.push(Message::Done { id: 13, result });
    }
    v
}

fn encoded(msg: &Message) -> BytesMut {
    let mut b = BytesMut::new();
    encode(msg, &mut b);
    b
}

/// A frame with a valid header (and CRC) around an arbitrary body.
fn frame(kind: u16, body: &[u8]) -> BytesMut {
    let mut b = BytesMut::new();
    b.put_u32(MAGIC);
    b.put_u16(PROTO_VERSION);
    b.put_u16(kind);
    b.put_u32(body.len() as u32);
    b.put_u32(crc32c::crc32c(body));
    b.put_slice(body);
    b
}

fn decode_frame(kind: u16, body: &[u8]) -> Result<Option<Message>, ProtoError> {
    decode(&mut frame(kind, body))
}

/// Decodes frames off `b` until it needs more input or fails; every message must
/// re-encode to the bytes it was decoded from (the encoding is canonical).
fn decode_all(b: &mut BytesMut) -> Result<Vec<Message>, ProtoError> {
    let mut out = Vec::new();
    loop {
        let before = b.clone();
        match decode(b)? {
            None => {
                assert_eq!(*b, before, "Ok(None) consumed input");
                return Ok(out);
            }
            Some(m) => {
                let used = before.len() - b.len();
                assert_eq!(encoded(&m)[..], before[..used]);
                out.push(m);
            }
        }
    }
}

// ---------------------------------------------------------------- unit tests

#[test]
fn frame_layout_matches_the_crate_doc() {
    let b = encoded(&Message::Ping {
        seq: 0x0102_0304_0506_0708,
    });
    assert_eq!(&b[0..4], b"FSRP");
    assert_eq!(&b[4..6], &PROTO_VERSION.to_be_bytes());
    assert_eq!(&b[6..8], &kind::PING.to_be_bytes());
    assert_eq!(&b[8..12], &8u32.to_be_bytes());
    assert_eq!(&b[12..16], &crc32c::crc32c(&b[16..]).to_be_bytes());
    assert_eq!(&b[16..], &[1, 2, 3, 4, 5, 6, 7, 8]);
    assert_eq!(b.len(), FRAME_HEADER_BYTES + 8);
}

#[test]
fn every_sample_round_trips() {
    for m in samples() {
        let mut b = encoded(&m);
        assert_eq!(decode(&mut b), Ok(Some(m)));
        assert!(b.is_empty());
    }
}

#[test]
fn every_strict_prefix_needs_more_input() {
    for m in samples() {
        let whole = encoded(&m);
        for cut in 0..whole.len() {
            let mut b = BytesMut::from(&whole[..cut]);
            assert_eq!(decode(&mut b), Ok(None), "{m:?} cut at {cut}");
            assert_eq!(b[..], whole[..cut], "{m:?} cut at {cut} consumed input");
        }
    }
}

#[test]
fn frames_back_to_back_decode_in_order() {
    let msgs = samples();
    let mut b = BytesMut::new();
    for m in &msgs {
        encode(m, &mut b);
    }
    // Half of a last frame: decoded frames stop before it, and it stays put.
    let tail = encoded(&Message::Ping { seq: 5 });
    b.extend_from_slice(&tail[..10]);
    assert_eq!(decode_all(&mut b), Ok(msgs));
    assert_eq!(b[..], tail[..10]);
    b.extend_from_slice(&tail[10..]);
    assert_eq!(decode(&mut b), Ok(Some(Message::Ping { seq: 5 })));
    assert_eq!(decode(&mut b), Ok(None));
    assert!(b.is_empty());
}

#[test]
fn payloads_are_slices_of_the_frame() {
    let data = Bytes::from(vec![7u8; 4096]);
    let mut b = encoded(&Message::Apply {
        id: 1,
        op: Op::Write {
            lba: 0,
            fua: false,
            data,
        },
    });
    let range = b.as_ptr_range();
    let Ok(Some(Message::Apply {
        op: Op::Write { data, .. },
        ..
    })) = decode(&mut b)
    else {
        panic!("not decoded");
    };
    assert_eq!(data.len(), 4096);
    assert!(range.contains(&data.as_ptr()), "payload was copied");
}

#[test]
fn encode_truncates_long_names_at_a_char_boundary() {
    let m = Message::WitnessClaim {
        cluster: "é".repeat(200), // 400 bytes
        node_id: 1,
        seq: 3,
    };
    let Ok(Some(Message::WitnessClaim {
        cluster, node_id, ..
    })) = decode(&mut encoded(&m))
    else {
        panic!("not decoded");
    };
    assert_eq!(cluster, "é".repeat(NAME_BYTES_MAX / 2));
    assert_eq!(node_id, 1);
}

#[test]
fn encode_truncates_long_reasons_at_a_char_boundary() {
    let m = Message::Refused {
        reason: format!("x{}", "é".repeat(1000)), // 2001 bytes
    };
    let Ok(Some(Message::Refused { reason })) = decode(&mut encoded(&m)) else {
        panic!("not decoded");
    };
    // 1 + 511 * 2 bytes: the next 'é' would pass the limit
    assert_eq!(reason, format!("x{}", "é".repeat(511)));
    assert!(reason.len() <= crate::REASON_BYTES_MAX);
}

#[test]
fn bad_magic() {
    let mut b = encoded(&Message::Ping { seq: 1 });
    b[0] = b'X';
    assert_eq!(decode(&mut b), Err(ProtoError::BadMagic(0x5853_5250)));
    // Checked as soon as a header is there.
    let mut b = BytesMut::from(&[0u8; FRAME_HEADER_BYTES][..]);
    assert_eq!(decode(&mut b), Err(ProtoError::BadMagic(0)));
}

#[test]
fn other_version() {
    // the version before this one (and the one after)
    for other in [PROTO_VERSION - 1, PROTO_VERSION + 1] {
        let mut b = encoded(&Message::Ping { seq: 1 });
        b[4..6].copy_from_slice(&other.to_be_bytes());
        assert_eq!(decode(&mut b), Err(ProtoError::Version(other)));
    }
}

#[test]
fn too_long_is_seen_from_the_header_alone() {
    let mut b = frame(kind::PING, &[]);
    b[8..12].copy_from_slice(&(PAYLOAD_BYTES_MAX + 1).to_be_bytes());
    assert_eq!(
        decode(&mut b),
        Err(ProtoError::TooLong(PAYLOAD_BYTES_MAX + 1))
    );
    b[8..12].copy_from_slice(&u32::MAX.to_be_bytes());
    assert_eq!(decode(&mut b), Err(ProtoError::TooLong(u32::MAX)));
    // The largest allowed length just waits for its body.
    b[8..12].copy_from_slice(&PAYLOAD_BYTES_MAX.to_be_bytes());
    assert_eq!(decode(&mut b), Ok(None));
    assert_eq!(b.len(), FRAME_HEADER_BYTES);
}

#[test]
fn crc_mismatch() {
    let mut b = encoded(&Message::Ping { seq: 1 });
    let last = b.len() - 1;
    b[last] ^= 0x80;
    assert_eq!(decode(&mut b), Err(ProtoError::Crc));
    let mut b = encoded(&Message::Ping { seq: 1 });
    b[12] ^= 1;
    assert_eq!(decode(&mut b), Err(ProtoError::Crc));
}

#[test]
fn unknown_kind() {
    assert_eq!(decode_frame(0, &[]), Err(ProtoError::Kind(0)));
    assert_eq!(decode_frame(0x99, &[1, 2]), Err(ProtoError::Kind(0x99)));
    assert_eq!(decode_frame(u16::MAX, &[]), Err(ProtoError::Kind(u16::MAX)));
}

#[test]
fn short_and_long_bodies_are_malformed() {
    assert_eq!(
        decode_frame(kind::PING, &[0; 7]),
        Err(ProtoError::Malformed("Ping"))
    );
    assert_eq!(
        decode_frame(kind::PONG, &[0; 9]),
        Err(ProtoError::Malformed("Pong"))
    );
    assert_eq!(
        decode_frame(kind::BITMAP_DONE, &[0]),
        Err(ProtoError::Malformed("BitmapDone"))
    );
    // Every sample, one byte short or one byte long.
    for m in samples() {
        let b = encoded(&m);
        let k = u16::from_be_bytes([b[6], b[7]]);
        let body = &b[FRAME_HEADER_BYTES..];
        let what = || Err(ProtoError::Malformed(kind_name(k)));
        if let Some((_, short)) = body.split_last() {
            assert_eq!(decode_frame(k, short), what(), "{m:?}");
        }
        let mut long = body.to_vec();
        long.push(0);
        assert_eq!(decode_frame(k, &long), what(), "{m:?}");
    }
}

#[test]
fn blob_longer_than_the_body_is_malformed() {
    let mut body = BytesMut::new();
    body.put_u64(0);
    body.put_u32(u32::MAX);
    body.put_slice(&[1, 2, 3]);
    assert_eq!(
        decode_frame(kind::BITMAP, &body),
        Err(ProtoError::Malformed("Bitmap"))
    );
}

#[test]
fn bools_other_than_0_and_1_are_malformed() {
    let mut body = BytesMut::new();
    body.put_u64(1); // id
    body.put_u8(op_tag::WRITE);
    body.put_u64(0); // lba
    body.put_u8(2); // fua
    body.put_u32(0); // no data
    assert_eq!(
        decode_frame(kind::APPLY, &body),
        Err(ProtoError::Malformed("Apply"))
    );
    body[17] = 1;
    assert!(matches!(
        decode_frame(kind::APPLY, &body),
        Ok(Some(Message::Apply {
            op: Op::Write { fua: true, .. },
            ..
        }))
    ));

    let mut body = BytesMut::new();
    body.put_u64(1);
    body.put_u8(op_tag::WRITE_ZEROES);
    body.put_u64(0);
    body.put_u64(8);
    body.put_u8(0xff); // may_unmap
    assert_eq!(
        decode_frame(kind::FORWARD, &body),
        Err(ProtoError::Malformed("Forward"))
    );
}

#[test]
fn unknown_op_and_result_tags_are_malformed() {
    let mut body = BytesMut::new();
    body.put_u64(1);
    body.put_u8(5);
    assert_eq!(
        decode_frame(kind::APPLY, &body),
        Err(ProtoError::Malformed("Apply"))
    );
    let mut body = BytesMut::new();
    body.put_u64(1);
    body.put_u8(3);
    assert_eq!(
        decode_frame(kind::DONE, &body),
        Err(ProtoError::Malformed("Done"))
    );
}

#[test]
fn compare_and_write_lengths_must_match() {
    let mut body = BytesMut::new();
    body.put_u64(1);
    body.put_u8(op_tag::COMPARE_AND_WRITE);
    body.put_u64(0);
    body.put_u8(0);
    body.put_u32(2);
    body.put_slice(&[1, 2]);
    body.put_u32(1);
    body.put_slice(&[3]);
    assert_eq!(
        decode_frame(kind::FORWARD, &body),
        Err(ProtoError::Malformed("Forward"))
    );
}

/// Body of a claim for a cluster named by raw `name` bytes.
fn claim_body(name: &[u8]) -> BytesMut {
    let mut body = BytesMut::new();
    body.put_u32(name.len() as u32);
    body.put_slice(name);
    body.put_u8(1);
    body.put_u64(9);
    body
}

#[test]
fn names_must_be_short_utf8() {
    assert_eq!(
        decode_frame(kind::WITNESS_CLAIM, &claim_body(&[0xff, 0xfe])),
        Err(ProtoError::Malformed("WitnessClaim"))
    );
    assert_eq!(
        decode_frame(
            kind::WITNESS_RELEASE,
            &claim_body(&[b'a'; NAME_BYTES_MAX + 1])
        ),
        Err(ProtoError::Malformed("WitnessRelease"))
    );
    assert_eq!(
        decode_frame(kind::WITNESS_CLAIM, &claim_body(&[b'a'; NAME_BYTES_MAX])),
        Ok(Some(Message::WitnessClaim {
            cluster: "a".repeat(NAME_BYTES_MAX),
            node_id: 1,
            seq: 9,
        }))
    );
    // A Hello whose volume name is invalid UTF-8.
    let mut b = encoded(&Message::Hello {
        node_id: 1,
        volume: "ab".into(),
        block_size_bytes: 512,
        block_count: 1,
        region_bytes: 1,
        gens: Generations::default(),
        flags: 0,
    });
    b[FRAME_HEADER_BYTES + 5] = 0xc0;
    let body = b[FRAME_HEADER_BYTES..].to_vec();
    assert_eq!(
        decode_frame(kind::HELLO, &body),
        Err(ProtoError::Malformed("Hello"))
    );
}

// ---------------------------------------------------------------- properties

proptest! {
    #[test]
    fn round_trip(msg in message(), junk in vec(any::<u8>(), 0..32)) {
        let mut b = encoded(&msg);
        let frame_len = b.len();
        prop_assert!(frame_len - FRAME_HEADER_BYTES <= PAYLOAD_BYTES_MAX as usize);
        b.extend_from_slice(&junk);
        prop_assert_eq!(decode(&mut b), Ok(Some(msg)));
        prop_assert_eq!(&b[..], &junk[..]);
    }

    #[test]
    fn two_frames_back_to_back(a in message(), b in message()) {
        let mut buf = encoded(&a);
        encode(&b, &mut buf);
        prop_assert_eq!(decode_all(&mut buf), Ok(vec![a, b]));
        prop_assert!(buf.is_empty());
    }

    #[test]
    fn strict_prefix_needs_more_input(msg in message(), cut in any::<Index>()) {
        let whole = encoded(&msg);
        let cut = cut.index(whole.len());
        let mut b = BytesMut::from(&whole[..cut]);
        prop_assert_eq!(decode(&mut b), Ok(None));
        prop_assert_eq!(&b[..], &whole[..cut]);
    }

    #[test]
    fn flipped_body_bit_is_a_crc_error(msg in message(), at in any::<Index>(), bit in 0u8..8) {
        let mut b = encoded(&msg);
        let body_len = b.len() - FRAME_HEADER_BYTES;
        prop_assume!(body_len > 0);
        b[FRAME_HEADER_BYTES + at.index(body_len)] ^= 1 << bit;
        prop_assert_eq!(decode(&mut b), Err(ProtoError::Crc));
    }

    #[test]
    fn random_bytes_never_panic(data in vec(any::<u8>(), 0..2048)) {
        let _ = decode_all(&mut BytesMut::from(&data[..]));
    }

    #[test]
    fn random_bytes_after_a_good_header_never_panic(
        kind_index in 0u16..40,
        len in any::<u32>(),
        crc in any::<u32>(),
        data in vec(any::<u8>(), 0..256),
    ) {
        let mut b = BytesMut::new();
        b.put_u32(MAGIC);
        b.put_u16(PROTO_VERSION);
        b.put_u16(kind_index);
        b.put_u32(len % 512);
        b.put_u32(crc);
        b.put_slice(&data);
        let _ = decode_all(&mut b);
    }

    /// Random bodies inside valid frames reach the body parsers; whatever they
    /// accept re-encodes to the same bytes (checked in `decode_all`).
    #[test]
    fn random_bodies_never_panic(
        k in prop_oneof![0u16..0x24, any::<u16>()],
        body in vec(any::<u8>(), 0..64),
    ) {
        let mut b = frame(k, &body);
        match decode_all(&mut b) {
            Ok(msgs) => prop_assert!(msgs.len() == 1 && b.is_empty()),
            Err(ProtoError::Kind(e)) => prop_assert!(!is_known_kind(e) && e == k),
            Err(e) => prop_assert_eq!(e, ProtoError::Malformed(kind_name(k))),
        }
    }
}
