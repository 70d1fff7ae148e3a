//! Entry point for the `initiator_rx` fuzz target: the whole receive path of the
//! initiator (login responses, then full feature PDUs) over bytes from nowhere.

use crate::core::{Core, CoreParams, RxEffects};
use crate::frame::{decode_target_frame, OutPdu};
use crate::login::{LoginOptions, LoginStateMachine, LoginStep};
use crate::session::dispatch;
use bytes::{Bytes, BytesMut};
use iscsi_proto::frame::FrameLimits;
use iscsi_proto::target::TargetPdu;
use parking_lot::Mutex;

/// Feeds `data` as the target's side of a connection. The first byte picks
/// options (CHAP, mutual CHAP, digests); then frames are decoded and given to the
/// login state machine until login ends, and the rest to the full feature core with
/// a read, a write and a large write in flight. Must never panic.
pub fn feed_target_bytes(data: &[u8]) {
    let Some((&flags, rest)) = data.split_first() else {
        return;
    };
    let mut opts = LoginOptions::new("iqn.2026-01.org.fuzz:i", "iqn.2026-01.org.fuzz:t");
    if flags & 1 != 0 {
        opts.chap = Some(("user".into(), "secret-secret".into()));
    }
    if flags & 2 != 0 {
        opts.mutual_chap = Some(("target".into(), "target-secret".into()));
    }
    opts.header_digest = flags & 4 != 0;
    opts.data_digest = flags & 8 != 0;
    let mut buf = BytesMut::from(rest);
    let mut limits = FrameLimits {
        header_digest: false,
        data_digest: false,
        max_data_segment_bytes: 64 * 1024,
        max_ahs_bytes: 1020,
    };
    let params = if flags & 16 != 0 {
        // Skip login: exercise the full feature path directly.
        let mut sm = LoginStateMachine::new(&opts, false);
        let _ = sm.start();
        None
    } else {
        let mut sm = LoginStateMachine::new(&opts, flags & 32 != 0);
        let mut step = sm.start();
        loop {
            if let LoginStep::Done(p) = step {
                break Some(p);
            }
            let f = match decode_target_frame(&mut buf, &limits) {
                Ok(Some(f)) => f,
                _ => return,
            };
            let TargetPdu::LoginResponse(r) = f.pdu else {
                return;
            };
            step = match sm.on_response(&r, &f.seq, &f.data) {
                Ok(s) => s,
                Err(_) => return,
            };
        }
    };
    let cp = match &params {
        Some(p) => {
            limits.header_digest = p.header_digest;
            limits.data_digest = p.data_digest;
            limits.max_data_segment_bytes = p.recv_data_segment_bytes_max;
            CoreParams::from(p)
        }
        None => CoreParams {
            send_segment_bytes_max: 8192,
            first_burst_bytes: 65536,
            immediate_data: flags & 64 != 0,
            initial_r2t: flags & 128 != 0,
        },
    };
    let core = Mutex::new(Core::new(cp, 1, 1, 64, 1));
    let mut waiters = Vec::new();
    {
        let mut c = core.lock();
        if let Ok(w) = c.submit(0, &[0x88; 16], Bytes::new(), 65536) {
            waiters.push(w);
        }
        if let Ok(w) = c.submit(0, &[0x8a; 16], Bytes::from(vec![7u8; 4096]), 0) {
            waiters.push(w);
        }
        if let Ok(w) = c.submit(1, &[0x8a; 32], Bytes::from(vec![9u8; 300 * 1024]), 0) {
            waiters.push(w);
        }
    }
    let mut out: Vec<OutPdu> = Vec::new();
    let mut fx = RxEffects::default();
    // Each round consumes at least one frame or stops, so this ends.
    while !buf.is_empty() {
        let before = buf.len();
        let res = dispatch(&core, &mut buf, &limits, &mut fx);
        let mut c = core.lock();
        c.drain_outbox(&mut out);
        out.clear();
        if res.is_err() {
            c.fail_all(crate::InitiatorError::ConnectionLost("fuzz".into()));
            break;
        }
        if buf.len() == before {
            break;
        }
    }
    for (_, mut rx) in waiters {
        let _ = rx.try_recv();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use iscsi_proto::target::{DataIn, LoginResponse, R2t, Residual, SeqNumbers};
    use rand::{Rng, SeedableRng};

    fn pdu(p: TargetPdu, stat_sn: u32, data: &[u8]) -> Vec<u8> {
        let seq = SeqNumbers {
            stat_sn,
            exp_cmd_sn: 1,
            max_cmd_sn: 64,
        };
        iscsi_proto::frame::encode_frame(
            &p.encode(&seq, data.len() as u32),
            &[],
            data,
            false,
            false,
        )
    }

    /// A plausible stream: a login that completes, then Data-In, R2T and status.
    fn valid_stream() -> Vec<u8> {
        let mut s = vec![0u8];
        s.extend(pdu(
            TargetPdu::LoginResponse(LoginResponse {
                transit: true,
                cont: false,
                csg: 1,
                nsg: 3,
                version_max: 0,
                version_active: 0,
                isid: [0; 6],
                tsih: 1,
                itt: 0,
                status_class: 0,
                status_detail: 0,
            }),
            0,
            b"MaxRecvDataSegmentLength=8192\0ImmediateData=Yes\0InitialR2T=No\0",
        ));
        s.extend(pdu(
            TargetPdu::DataIn(DataIn {
                final_bit: true,
                ack: false,
                status: Some(0),
                residual: Residual::None,
                lun: 0,
                itt: 1,
                ttt: 0xffff_ffff,
                data_sn: 0,
                buffer_offset_bytes: 0,
            }),
            1,
            &[5u8; 65536],
        ));
        s.extend(pdu(
            TargetPdu::R2t(R2t {
                lun: 0,
                itt: 3,
                ttt: 9,
                r2t_sn: 0,
                buffer_offset_bytes: 65536,
                desired_len_bytes: 100_000,
            }),
            2,
            &[],
        ));
        s
    }

    #[test]
    fn never_panics_on_garbage_or_mutations() {
        feed_target_bytes(&[]);
        feed_target_bytes(&valid_stream());
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let base = valid_stream();
        for _ in 0..2000 {
            let mut v = base.clone();
            for _ in 0..rng.gen_range(1..8) {
                let i = rng.gen_range(0..v.len());
                v[i] = rng.gen();
            }
            v.truncate(rng.gen_range(1..=v.len()));
            feed_target_bytes(&v);
            let n = rng.gen_range(0..400);
            let junk: Vec<u8> = (0..n).map(|_| rng.gen()).collect();
            feed_target_bytes(&junk);
        }
    }
}
