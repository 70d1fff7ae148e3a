use super::*;
use iscsi_proto::pdu::{parse_bhs, BHS_LEN};
use iscsi_proto::target::{DataIn, NopIn, R2t, Reject, ScsiResponse, SeqNumbers};

fn params(immediate: bool, initial_r2t: bool) -> CoreParams {
    CoreParams {
        send_segment_bytes_max: 4096,
        first_burst_bytes: 8192,
        immediate_data: immediate,
        initial_r2t,
    }
}

fn seq(stat_sn: u32, exp: u32, max: u32) -> SeqNumbers {
    SeqNumbers {
        stat_sn,
        exp_cmd_sn: exp,
        max_cmd_sn: max,
    }
}

fn feed(
    core: &mut Core,
    pdu: TargetPdu,
    s: SeqNumbers,
    data: &[u8],
) -> Result<RxEffects, InitiatorError> {
    let mut raw = [0u8; BHS_LEN];
    let f = frame_of(pdu, s, &mut raw, data);
    let mut fx = RxEffects::default();
    core.on_pdu(&f, &mut fx).map(|_| fx)
}

fn outbox(core: &mut Core) -> Vec<OutPdu> {
    let mut v = Vec::new();
    core.drain_outbox(&mut v);
    v
}

fn data_in(itt: u32, off: u32, status: Option<u8>, residual: Residual) -> TargetPdu {
    TargetPdu::DataIn(DataIn {
        final_bit: status.is_some(),
        ack: false,
        status,
        residual,
        lun: 0,
        itt,
        ttt: RESERVED_TAG,
        data_sn: 0,
        buffer_offset_bytes: off,
    })
}

#[test]
fn data_in_out_of_order_and_collapsed_status() {
    let mut c = Core::new(params(true, false), 1, 1, 10, 1);
    let (itt, mut rx) = c.submit(0, &[0x88; 16], Bytes::new(), 8192).unwrap();
    let cmd = outbox(&mut c);
    assert_eq!(cmd.len(), 1);
    let bhs = parse_bhs(&cmd[0].header).unwrap();
    let iscsi_proto::InitiatorPdu::ScsiCommand(sc) = bhs.pdu else {
        panic!()
    };
    assert!(sc.read && !sc.write && sc.final_bit);
    assert_eq!((sc.edtl_bytes, sc.cmd_sn, sc.itt), (8192, 1, itt));
    feed(
        &mut c,
        data_in(itt, 4096, None, Residual::None),
        seq(0, 2, 10),
        &[2u8; 4096],
    )
    .unwrap();
    assert!(rx.try_recv().is_err());
    feed(
        &mut c,
        data_in(itt, 0, Some(0), Residual::None),
        seq(5, 2, 10),
        &[1u8; 4096],
    )
    .unwrap();
    let r = rx.try_recv().unwrap().unwrap();
    assert_eq!(r.status, 0);
    assert_eq!(&r.data_in[..4096], &[1u8; 4096][..]);
    assert_eq!(&r.data_in[4096..], &[2u8; 4096][..]);
    assert_eq!(c.exp_stat_sn(), 6);
    assert_eq!(c.tasks_in_flight(), 0);
}

#[test]
fn underflow_and_sense_in_response() {
    let mut c = Core::new(params(true, false), 1, 1, 10, 1);
    let (itt, mut rx) = c
        .submit(0, &[0x12, 0, 0, 0, 255, 0], Bytes::new(), 255)
        .unwrap();
    feed(
        &mut c,
        data_in(itt, 0, None, Residual::None),
        seq(0, 2, 10),
        &[9u8; 36],
    )
    .unwrap();
    let sense =
        iscsi_proto::target::sense_segment(&[0x70, 0, 5, 0, 0, 0, 0, 10, 0, 0, 0, 0, 0x24, 0]);
    let rsp = TargetPdu::ScsiResponse(ScsiResponse {
        itt,
        response: 0,
        status: 2,
        residual: Residual::Underflow(219),
        bidi_residual: Residual::None,
        exp_data_sn: 1,
    });
    feed(&mut c, rsp, seq(7, 2, 10), &sense).unwrap();
    let r = rx.try_recv().unwrap().unwrap();
    assert_eq!(r.status, 2);
    assert_eq!(r.data_in.len(), 36);
    assert_eq!(r.residual, Residual::Underflow(219));
    assert_eq!(r.sense.as_deref().map(|s| s[12]), Some(0x24));
}

#[test]
fn data_in_beyond_buffer_is_a_protocol_error() {
    let mut c = Core::new(params(true, false), 1, 1, 10, 1);
    let (itt, mut rx) = c.submit(0, &[0x88; 16], Bytes::new(), 4096).unwrap();
    assert!(feed(
        &mut c,
        data_in(itt, 4000, None, Residual::None),
        seq(0, 1, 10),
        &[0u8; 512]
    )
    .is_err());
    assert!(matches!(
        rx.try_recv(),
        Ok(Err(InitiatorError::Protocol(_)))
    ));
    // Unknown tasks are ignored.
    assert!(feed(
        &mut c,
        data_in(777, 0, Some(0), Residual::None),
        seq(0, 1, 10),
        &[0u8; 4]
    )
    .is_ok());
}

fn data_outs(v: &[OutPdu]) -> Vec<(bool, u32, u32, u32, usize)> {
    v.iter()
        .filter_map(|p| match parse_bhs(&p.header).ok()?.pdu {
            iscsi_proto::InitiatorPdu::DataOut(d) => Some((
                d.final_bit,
                d.ttt,
                d.data_sn,
                d.buffer_offset_bytes,
                p.data.len(),
            )),
            _ => None,
        })
        .collect()
}

#[test]
fn immediate_unsolicited_and_r2t_data() {
    let mut c = Core::new(params(true, false), 1, 1, 10, 1);
    let data: Bytes = (0..20000u32).map(|i| i as u8).collect::<Vec<u8>>().into();
    let (itt, mut rx) = c.submit(3, &[0x8a; 16], data.clone(), 0).unwrap();
    let out = outbox(&mut c);
    let bhs = parse_bhs(&out[0].header).unwrap();
    let iscsi_proto::InitiatorPdu::ScsiCommand(sc) = bhs.pdu else {
        panic!()
    };
    assert!(sc.write && !sc.final_bit, "unsolicited Data-Out follows");
    assert_eq!(sc.edtl_bytes, 20000);
    assert_eq!(
        out[0].data.len(),
        4096,
        "immediate data limited by the target segment size"
    );
    assert_eq!(data_outs(&out), vec![(true, RESERVED_TAG, 0, 4096, 4096)]);
    let r2t = TargetPdu::R2t(R2t {
        lun: lun_to_wire(3),
        itt,
        ttt: 0x55,
        r2t_sn: 0,
        buffer_offset_bytes: 8192,
        desired_len_bytes: 11808,
    });
    let fx = feed(&mut c, r2t, seq(0, 2, 10), &[]).unwrap();
    assert!(fx.outbox_pushed);
    let out = outbox(&mut c);
    assert_eq!(
        data_outs(&out),
        vec![
            (false, 0x55, 0, 8192, 4096),
            (false, 0x55, 1, 12288, 4096),
            (true, 0x55, 2, 16384, 3616)
        ]
    );
    assert_eq!(&out[2].data[..], &data[16384..]);
    // An R2T beyond the data is a protocol error and fails the task.
    let bad = TargetPdu::R2t(R2t {
        lun: 0,
        itt,
        ttt: 0x56,
        r2t_sn: 1,
        buffer_offset_bytes: 16384,
        desired_len_bytes: 8192,
    });
    assert!(feed(&mut c, bad, seq(0, 2, 10), &[]).is_err());
    assert!(matches!(
        rx.try_recv(),
        Ok(Err(InitiatorError::Protocol(_)))
    ));
}

#[test]
fn initial_r2t_without_immediate_data() {
    let mut c = Core::new(params(false, true), 1, 1, 10, 1);
    c.submit(0, &[0x8a; 16], Bytes::from(vec![0u8; 10000]), 0)
        .unwrap();
    let out = outbox(&mut c);
    assert_eq!(out.len(), 1);
    assert!(out[0].data.is_empty());
    let iscsi_proto::InitiatorPdu::ScsiCommand(sc) = parse_bhs(&out[0].header).unwrap().pdu else {
        panic!()
    };
    assert!(sc.final_bit);
}

#[test]
fn cmd_sn_window() {
    let mut c = Core::new(params(true, false), 1, 1, 2, 1);
    c.submit(0, &[0; 6], Bytes::new(), 0).unwrap();
    c.submit(0, &[0; 6], Bytes::new(), 0).unwrap();
    assert!(matches!(
        c.submit(0, &[0; 6], Bytes::new(), 0),
        Err(SubmitError::WindowClosed)
    ));
    // A window that is not valid (MaxCmdSN < ExpCmdSN - 1) is ignored.
    let nop = TargetPdu::NopIn(NopIn {
        lun: 0,
        itt: 99,
        ttt: RESERVED_TAG,
    });
    assert!(!feed(&mut c, nop, seq(0, 10, 3), &[]).unwrap().window_opened);
    assert!(feed(&mut c, nop, seq(0, 3, 3), &[]).unwrap().window_opened);
    let (_, _rx) = c.submit(0, &[0; 6], Bytes::new(), 0).unwrap();
    assert!(matches!(
        c.submit(0, &[0; 6], Bytes::new(), 0),
        Err(SubmitError::WindowClosed)
    ));
}

#[test]
fn nop_ping_reject_async_and_close() {
    let mut c = Core::new(params(true, false), 1, 1, 10, 1);
    let (itt, mut rx) = c.submit(0, &[0; 6], Bytes::new(), 0).unwrap();
    outbox(&mut c);
    let ping = TargetPdu::NopIn(NopIn {
        lun: 0,
        itt: RESERVED_TAG,
        ttt: 0x1234,
    });
    assert!(
        feed(&mut c, ping, seq(3, 1, 10), &[])
            .unwrap()
            .outbox_pushed
    );
    let out = outbox(&mut c);
    let b = parse_bhs(&out[0].header).unwrap();
    assert!(b.immediate);
    assert!(
        matches!(b.pdu, iscsi_proto::InitiatorPdu::NopOut(n) if n.ttt == 0x1234 && n.itt == RESERVED_TAG)
    );
    let mut rejected = [0u8; 48];
    rejected[16..20].copy_from_slice(&itt.to_be_bytes());
    let rej = TargetPdu::Reject(Reject {
        reason: 9,
        data_sn: 0,
    });
    feed(&mut c, rej, seq(4, 1, 10), &rejected).unwrap();
    assert!(matches!(
        rx.try_recv(),
        Ok(Err(InitiatorError::Rejected(9)))
    ));
    let logout = TargetPdu::AsyncMessage(iscsi_proto::target::AsyncMessage {
        lun: 0,
        event: iscsi_proto::target::async_event::LOGOUT_REQUEST,
        vcode: 0,
        param1: 0,
        param2: 0,
        param3: 0,
    });
    assert!(
        feed(&mut c, logout, seq(5, 1, 10), &[])
            .unwrap()
            .logout_requested
    );
    let (_, mut rx) = c.submit(0, &[0; 6], Bytes::new(), 0).unwrap();
    c.fail_all(InitiatorError::ConnectionLost("test".into()));
    assert!(matches!(
        rx.try_recv(),
        Ok(Err(InitiatorError::ConnectionLost(_)))
    ));
    assert!(matches!(
        c.submit(0, &[0; 6], Bytes::new(), 0),
        Err(SubmitError::Failed(_))
    ));
}

#[test]
fn long_cdb_goes_in_ahs() {
    let mut c = Core::new(params(true, false), 1, 1, 10, 1);
    c.submit(0, &[0x7f; 32], Bytes::new(), 0).unwrap();
    let out = outbox(&mut c);
    assert_eq!(out[0].header[4] as usize * 4, out[0].ahs.len());
    assert_eq!(out[0].ahs.len(), 20);
    assert!(c.submit(0, &[], Bytes::new(), 0).is_err());
}
