//! Property tests: every encoder's output decodes back to what was encoded, and
//! the decoders never panic on arbitrary bytes.

use bytes::BytesMut;
use iscsi_proto::frame::{decode_frame, encode_frame, FrameLimits};
use iscsi_proto::pdu::*;
use iscsi_proto::target::*;
use iscsi_proto::text::{encode_text, parse_text};
use proptest::prelude::*;

fn initiator_pdu() -> impl Strategy<Value = InitiatorPdu> {
    let u = any::<u32>;
    prop_oneof![
        (any::<u64>(), u(), u(), u(), u()).prop_map(|(lun, itt, ttt, cmd_sn, exp_stat_sn)| {
            InitiatorPdu::NopOut(NopOut {
                lun,
                itt,
                ttt,
                cmd_sn,
                exp_stat_sn,
            })
        }),
        (
            any::<bool>(),
            any::<bool>(),
            any::<bool>(),
            0u8..8,
            any::<u64>(),
            u(),
            u(),
            u(),
            u(),
            any::<[u8; 16]>()
        )
            .prop_map(
                |(final_bit, read, write, attr, lun, itt, edtl_bytes, cmd_sn, exp_stat_sn, cdb)| {
                    InitiatorPdu::ScsiCommand(ScsiCommand {
                        final_bit,
                        read,
                        write,
                        attr,
                        lun,
                        itt,
                        edtl_bytes,
                        cmd_sn,
                        exp_stat_sn,
                        cdb,
                    })
                }
            ),
        (0u8..0x80, any::<u64>(), u(), u(), u(), u(), u(), u()).prop_map(
            |(function, lun, itt, rtt, cmd_sn, exp_stat_sn, ref_cmd_sn, exp_data_sn)| {
                InitiatorPdu::TaskMgmt(TaskMgmtRequest {
                    function,
                    lun,
                    itt,
                    rtt,
                    cmd_sn,
                    exp_stat_sn,
                    ref_cmd_sn,
                    exp_data_sn,
                })
            }
        ),
        (
            any::<bool>(),
            any::<bool>(),
            0u8..4,
            0u8..4,
            any::<u8>(),
            any::<u8>(),
            any::<[u8; 6]>(),
            any::<u16>(),
            u(),
            any::<u16>(),
            u(),
            u()
        )
            .prop_map(
                |(
                    transit,
                    cont,
                    csg,
                    nsg,
                    version_max,
                    version_min,
                    isid,
                    tsih,
                    itt,
                    cid,
                    cmd_sn,
                    exp_stat_sn,
                )| {
                    InitiatorPdu::Login(LoginRequest {
                        transit,
                        cont,
                        csg,
                        nsg,
                        version_max,
                        version_min,
                        isid,
                        tsih,
                        itt,
                        cid,
                        cmd_sn,
                        exp_stat_sn,
                    })
                }
            ),
        (
            any::<bool>(),
            any::<bool>(),
            any::<u64>(),
            u(),
            u(),
            u(),
            u()
        )
            .prop_map(|(final_bit, cont, lun, itt, ttt, cmd_sn, exp_stat_sn)| {
                InitiatorPdu::Text(TextRequest {
                    final_bit,
                    cont,
                    lun,
                    itt,
                    ttt,
                    cmd_sn,
                    exp_stat_sn,
                })
            }),
        (any::<bool>(), any::<u64>(), u(), u(), u(), u(), u()).prop_map(
            |(final_bit, lun, itt, ttt, exp_stat_sn, data_sn, buffer_offset_bytes)| {
                InitiatorPdu::DataOut(DataOut {
                    final_bit,
                    lun,
                    itt,
                    ttt,
                    exp_stat_sn,
                    data_sn,
                    buffer_offset_bytes,
                })
            }
        ),
        (0u8..0x80, u(), any::<u16>(), u(), u()).prop_map(
            |(reason, itt, cid, cmd_sn, exp_stat_sn)| {
                InitiatorPdu::Logout(LogoutRequest {
                    reason,
                    itt,
                    cid,
                    cmd_sn,
                    exp_stat_sn,
                })
            }
        ),
        (0u8..16, any::<u64>(), u(), u(), u(), u(), u()).prop_map(
            |(snack_type, lun, itt, ttt, exp_stat_sn, beg_run, run_length)| {
                InitiatorPdu::Snack(SnackRequest {
                    snack_type,
                    lun,
                    itt,
                    ttt,
                    exp_stat_sn,
                    beg_run,
                    run_length,
                })
            }
        ),
    ]
}

fn residual() -> impl Strategy<Value = Residual> {
    prop_oneof![
        Just(Residual::None),
        (1u32..).prop_map(Residual::Underflow),
        (1u32..).prop_map(Residual::Overflow),
    ]
}

fn target_pdu() -> impl Strategy<Value = TargetPdu> {
    let u = any::<u32>;
    prop_oneof![
        (any::<u64>(), u(), u()).prop_map(|(lun, itt, ttt)| TargetPdu::NopIn(NopIn {
            lun,
            itt,
            ttt
        })),
        (u(), any::<u8>(), any::<u8>(), residual(), residual(), u()).prop_map(
            |(itt, response, status, residual, bidi_residual, exp_data_sn)| {
                TargetPdu::ScsiResponse(ScsiResponse {
                    itt,
                    response,
                    status,
                    residual,
                    bidi_residual,
                    exp_data_sn,
                })
            }
        ),
        (any::<u8>(), u()).prop_map(|(response, itt)| TargetPdu::TaskMgmtResponse(
            TaskMgmtResponse { response, itt }
        )),
        (
            any::<bool>(),
            any::<bool>(),
            0u8..4,
            0u8..4,
            any::<[u8; 6]>(),
            any::<u16>(),
            u(),
            any::<u8>(),
            any::<u8>()
        )
            .prop_map(
                |(transit, cont, csg, nsg, isid, tsih, itt, status_class, status_detail)| {
                    TargetPdu::LoginResponse(LoginResponse {
                        transit,
                        cont,
                        csg,
                        nsg,
                        version_max: 0,
                        version_active: 0,
                        isid,
                        tsih,
                        itt,
                        status_class,
                        status_detail,
                    })
                }
            ),
        (any::<bool>(), any::<bool>(), any::<u64>(), u(), u()).prop_map(
            |(final_bit, cont, lun, itt, ttt)| {
                TargetPdu::TextResponse(TextResponse {
                    final_bit,
                    cont,
                    lun,
                    itt,
                    ttt,
                })
            }
        ),
        (
            any::<bool>(),
            any::<bool>(),
            proptest::option::of(any::<u8>()),
            residual(),
            any::<u64>(),
            u(),
            u(),
            u(),
            u()
        )
            .prop_map(
                |(
                    final_bit,
                    ack,
                    status,
                    residual,
                    lun,
                    itt,
                    ttt,
                    data_sn,
                    buffer_offset_bytes,
                )| {
                    TargetPdu::DataIn(DataIn {
                        final_bit: final_bit || status.is_some(),
                        ack,
                        status,
                        residual: if status.is_some() {
                            residual
                        } else {
                            Residual::None
                        },
                        lun,
                        itt,
                        ttt,
                        data_sn,
                        buffer_offset_bytes,
                    })
                }
            ),
        (any::<u8>(), u(), any::<u16>(), any::<u16>()).prop_map(
            |(response, itt, time2wait_s, time2retain_s)| {
                TargetPdu::LogoutResponse(LogoutResponse {
                    response,
                    itt,
                    time2wait_s,
                    time2retain_s,
                })
            }
        ),
        (any::<u64>(), u(), u(), u(), u(), u()).prop_map(
            |(lun, itt, ttt, r2t_sn, buffer_offset_bytes, desired_len_bytes)| {
                TargetPdu::R2t(R2t {
                    lun,
                    itt,
                    ttt,
                    r2t_sn,
                    buffer_offset_bytes,
                    desired_len_bytes,
                })
            }
        ),
        (
            any::<u64>(),
            any::<u8>(),
            any::<u8>(),
            any::<u16>(),
            any::<u16>(),
            any::<u16>()
        )
            .prop_map(|(lun, event, vcode, param1, param2, param3)| {
                TargetPdu::AsyncMessage(AsyncMessage {
                    lun,
                    event,
                    vcode,
                    param1,
                    param2,
                    param3,
                })
            }),
        (any::<u8>(), u())
            .prop_map(|(reason, data_sn)| TargetPdu::Reject(Reject { reason, data_sn })),
    ]
}

proptest! {
    #[test]
    fn initiator_header_roundtrip(pdu in initiator_pdu(), imm in any::<bool>(), dl in 0u32..0x0100_0000) {
        let raw = encode_initiator_bhs(&pdu, imm, 0, dl);
        let bhs = parse_bhs(&raw).unwrap();
        prop_assert_eq!(bhs.pdu, pdu);
        prop_assert_eq!(bhs.data_len_bytes, dl);
        // Login always sets the I bit on the wire in practice; the parser reports what it saw.
        prop_assert_eq!(bhs.immediate, imm);
    }

    #[test]
    fn target_header_roundtrip(pdu in target_pdu(), s in any::<u32>(), e in any::<u32>(), m in any::<u32>(), dl in 0u32..0x0100_0000) {
        let seq = SeqNumbers { stat_sn: s, exp_cmd_sn: e, max_cmd_sn: m };
        let raw = pdu.encode(&seq, dl);
        let (back, seq_back, dl_back) = parse_target_bhs(&raw).unwrap();
        prop_assert_eq!(back, pdu);
        prop_assert_eq!(dl_back, dl);
        prop_assert_eq!(seq_back.exp_cmd_sn, e);
        prop_assert_eq!(seq_back.max_cmd_sn, m);
        if let TargetPdu::DataIn(d) = pdu {
            if d.status.is_some() { prop_assert_eq!(seq_back.stat_sn, s); }
        } else {
            prop_assert_eq!(seq_back.stat_sn, s);
        }
    }

    #[test]
    fn frame_roundtrip(pdu in initiator_pdu(), data in proptest::collection::vec(any::<u8>(), 0..2000), hd in any::<bool>(), dd in any::<bool>()) {
        let raw = encode_initiator_bhs(&pdu, false, 0, data.len() as u32);
        let wire = encode_frame(&raw, &[], &data, hd, dd);
        let limits = FrameLimits { header_digest: hd, data_digest: dd, ..FrameLimits::default() };
        let mut buf = BytesMut::from(&wire[..]);
        let f = decode_frame(&mut buf, &limits).unwrap().unwrap();
        prop_assert_eq!(f.bhs.pdu, pdu);
        prop_assert_eq!(&f.data[..], &data[..]);
        prop_assert!(buf.is_empty());
    }

    #[test]
    fn text_roundtrip(pairs in proptest::collection::vec(("[A-Za-z][A-Za-z0-9.]{0,20}", "[ -~&&[^=]]{0,40}"), 0..20)) {
        let raw = encode_text(&pairs);
        let back = parse_text(&raw).unwrap();
        let want: Vec<(String, String)> = pairs.into_iter().collect();
        prop_assert_eq!(back, want);
    }

    #[test]
    fn decoders_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..600), hd in any::<bool>(), dd in any::<bool>()) {
        let limits = FrameLimits { header_digest: hd, data_digest: dd, ..FrameLimits::default() };
        let mut buf = BytesMut::from(&bytes[..]);
        while let Ok(Some(_)) = decode_frame(&mut buf, &limits) {}
        let _ = parse_text(&bytes);
    }
}
