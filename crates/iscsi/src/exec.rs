//! Running one SCSI command and sending its Data-In and status.

use crate::session::{Running, Session};
use crate::writer::OutPdu;
use block::BufferPermit;
use bytes::Bytes;
use iscsi_proto::target::{sense_segment, DataIn, Residual, ScsiResponse, TargetPdu};
use iscsi_proto::RESERVED_TAG;
use scsi::{Command, TaskAttr};
use std::sync::Arc;
use tokio::sync::mpsc;

/// How a connection sends: its writer queue and the initiator's limits.
pub(crate) struct ConnOut {
    pub tx: mpsc::Sender<OutPdu>,
    /// The initiator's MaxRecvDataSegmentLength.
    pub send_segment_bytes_max: u32,
    /// MaxBurstLength (Data-In sequences end on its boundaries).
    pub max_burst_bytes: u32,
}

/// A SCSI command ready to execute.
#[derive(Debug, Clone)]
pub(crate) struct CmdInfo {
    pub itt: u32,
    pub lun_raw: u64,
    pub edtl_bytes: u32,
    pub read: bool,
    pub write: bool,
    pub attr: u8,
    pub cdb: Bytes,
    pub bidi_read_len_bytes: Option<u32>,
    /// The command holds a CmdSN window slot (it was not immediate).
    pub holds_slot: bool,
    /// R2Ts sent for its Data-Out: its SCSI Response's ExpDataSN counts them
    /// with its Data-In PDUs (RFC 7143 11.4.8).
    pub r2ts_sent: u32,
}

fn task_attr(a: u8) -> TaskAttr {
    match a {
        2 => TaskAttr::Ordered,
        3 => TaskAttr::HeadOfQueue,
        4 => TaskAttr::Aca,
        _ => TaskAttr::Simple,
    }
}

/// Releases the window slot and the running entry however the task ends
/// (completion, abort, connection loss).
///
/// Shared with the command's medium changes that outlive an abort
/// (`scsi::in_flight`): the command counts as running, and an abort waits, until
/// the last of them has ended.
struct Guard {
    session: Arc<Session>,
    itt: u32,
    serial: u64,
    slot_held: std::sync::atomic::AtomicBool,
}

impl Guard {
    fn release_slot(&self) {
        if self
            .slot_held
            .swap(false, std::sync::atomic::Ordering::AcqRel)
        {
            self.session.window.release();
        }
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        self.release_slot();
        self.session.finish(self.itt, self.serial);
    }
}

/// Starts `info`: registered as running, runs here up to its first wait, then
/// on its own task. `permit` is the node budget the
/// connection took for the command's data (its Data-Out, and the Data-In it may
/// read): the Data-Out part is given back when the command has executed, the
/// Data-In part when its last Data-In PDU is on the wire.
///
/// The first poll happens on the connection's task, so commands reach the LU in
/// the order they arrived. Spawned directly, the last command of every batch the
/// connection reads would overtake the others (a worker runs the task it spawned
/// last first), and a RAID pool would see one request of a sequential stream
/// arrive ahead of its predecessors, and not recognize it as part of the stream.
pub(crate) fn spawn_command(
    session: &Arc<Session>,
    out: &Arc<ConnOut>,
    info: CmdInfo,
    data_out: Bytes,
    permit: BufferPermit,
    write_since: Option<u64>,
) {
    let Some(scsi) = session.scsi.clone() else {
        return;
    };
    let serial = session.next_serial();
    let guard = Arc::new(Guard {
        session: session.clone(),
        itt: info.itt,
        serial,
        slot_held: std::sync::atomic::AtomicBool::new(info.holds_slot),
    });
    let token: scsi::InFlight = guard.clone();
    let out = out.clone();
    let itt = info.itt;
    let lun = iscsi_proto::lun_from_wire(info.lun_raw);
    let started = std::time::Instant::now();
    let data_out_bytes = data_out.len() as u64;
    let mut task = Box::pin(scsi::in_flight(token, async move {
        let guard = guard;
        let Some(nexus) = guard.session.nexus.as_ref() else {
            return;
        };
        let cmd = Command {
            cdb: info.cdb.clone(),
            lun,
            data_out,
            data_in_len_max: match (info.read, info.write) {
                (true, true) => info.bidi_read_len_bytes.unwrap_or(0),
                (true, false) => info.edtl_bytes,
                _ => 0,
            },
            attr: task_attr(info.attr),
        };
        let resp = scsi.execute(nexus, cmd).await;
        // aborted meanwhile: never answered (TAS=0). An abort does not stop a
        // poll under way (the first one, here on the connection's task, or one
        // on another worker as its AbortHandle fires), and that poll may run
        // the command to its end: the answer is all that can still be held back
        if guard.session.aborted(guard.itt, guard.serial) {
            // a unit attention it took was not reported after all
            if scsi.unanswered(nexus, lun, &info.cdb, &resp) {
                tracing::debug!(itt, lun, "unit attention of an aborted command kept");
            }
            return;
        }
        if info.read || info.write {
            let us = started.elapsed().as_micros().min(u64::MAX as u128) as u64;
            let bytes = if info.write {
                data_out_bytes
            } else {
                (resp.data_in.len() as u64).min(info.edtl_bytes as u64)
            };
            guard.session.io.record(info.write, bytes, us);
        }
        send_response(&out, &info, resp, permit, || guard.release_slot()).await;
    }));
    // registered before its first poll: an abort (a TMF, PREEMPT AND ABORT)
    // that arrives while the command is already at the LU finds it
    session.running.lock().insert(
        itt,
        Running {
            lun,
            serial,
            abort: None,
            aborted: false,
        },
    );
    // A write: dropped unexecuted and unanswered if another session's reset
    // or PREEMPT AND ABORT aborted it since it arrived (`write_since`, the
    // abort generation then). Looked at once registered: such an abort bumps
    // the generation before it looks for running tasks, so it either finds
    // this one (and waits for it) or is seen here.
    if write_since.is_some_and(|g| session.write_aborted(lun, g)) {
        tracing::info!(
            itt,
            lun,
            "write aborted by another session before it ran; dropped"
        );
        drop(task);
        return;
    }
    if block::poll_once(&mut task) {
        return;
    }
    let mut running = session.running.lock();
    match running.get_mut(&itt) {
        Some(e) if e.serial == serial && !e.aborted => {
            // spawned under the lock: it cannot finish (and leave the map)
            // before its abort handle is in
            let handle = tokio::spawn(task);
            e.abort = Some(handle.abort_handle());
        }
        _ => {
            // aborted during its first poll: dropped here (its guard takes
            // the entry out, which needs the lock)
            drop(running);
            drop(task);
        }
    }
}

/// Sends the Data-In PDUs and status of a completed command. `release` opens the
/// CmdSN window just before the PDU carrying status is queued. `permit` (the
/// command's share of the node budget) shrinks to the Data-In bytes sent and
/// rides on the last Data-In PDU, so it is held until they are written.
pub(crate) async fn send_response(
    out: &ConnOut,
    info: &CmdInfo,
    mut resp: scsi::Response,
    mut permit: BufferPermit,
    release: impl FnOnce(),
) {
    let read_only_dir = info.read && !info.write;
    let read_limit = if read_only_dir {
        info.edtl_bytes
    } else if info.read {
        info.bidi_read_len_bytes.unwrap_or(0)
    } else {
        0
    };
    let send_len = (resp.data_in.len() as u64).min(read_limit as u64) as u32;
    if (send_len as usize) < resp.data_in.len() {
        // residual overflow: keep only what goes out, not the whole buffer the
        // LU read, so what stays queued is what the permit accounts for
        resp.data_in = Bytes::copy_from_slice(&resp.data_in[..send_len as usize]);
    }
    permit.shrink_to(send_len as u64);
    let mut permit = Some(permit);
    let residual = Residual::of(info.edtl_bytes, resp.transfer_len_bytes);
    let collapse = resp.sense.is_none() && send_len > 0 && read_only_dir;
    let seg_max = out.send_segment_bytes_max.max(512);
    let burst = out.max_burst_bytes.max(512);
    let mut off = 0u32;
    let mut data_sn = 0u32;
    let mut release = Some(release);
    while off < send_len {
        let burst_left = burst - (off % burst);
        let len = (send_len - off).min(seg_max).min(burst_left);
        let last = off + len == send_len;
        let status = (last && collapse).then_some(resp.status);
        if status.is_some() {
            if let Some(r) = release.take() {
                r();
            }
        }
        let pdu = TargetPdu::DataIn(DataIn {
            final_bit: last || (off + len).is_multiple_of(burst),
            ack: false,
            status,
            residual: if status.is_some() {
                residual
            } else {
                Residual::None
            },
            lun: info.lun_raw,
            itt: info.itt,
            ttt: RESERVED_TAG,
            data_sn,
            buffer_offset_bytes: off,
        });
        let data = resp.data_in.slice(off as usize..(off + len) as usize);
        let p = match last {
            true => OutPdu::holding(pdu, data, permit.take().unwrap_or_else(BufferPermit::empty)),
            false => OutPdu::new(pdu, data),
        };
        if out.tx.send(p).await.is_err() {
            return;
        }
        off += len;
        data_sn += 1;
    }
    if collapse {
        return;
    }
    let data = match &resp.sense {
        Some(s) if !s.is_empty() => Bytes::from(sense_segment(s)),
        _ => Bytes::new(),
    };
    let pdu = TargetPdu::ScsiResponse(ScsiResponse {
        itt: info.itt,
        response: 0,
        status: resp.status,
        residual,
        bidi_residual: Residual::None,
        exp_data_sn: data_sn.wrapping_add(info.r2ts_sent),
    });
    if let Some(r) = release.take() {
        r();
    }
    let _ = out.tx.send(OutPdu::new(pdu, data)).await;
}

/// CHECK CONDITION sense (fixed format) for errors the transport answers itself.
pub(crate) fn check_condition(sense_key: u8, asc: u8, ascq: u8) -> scsi::Response {
    let mut sense = vec![0u8; 18];
    sense[0] = 0x70;
    sense[2] = sense_key;
    sense[7] = 10;
    sense[12] = asc;
    sense[13] = ascq;
    scsi::Response {
        status: scsi::status::CHECK_CONDITION,
        sense: Some(Bytes::from(sense)),
        data_in: Bytes::new(),
        transfer_len_bytes: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(edtl: u32) -> CmdInfo {
        CmdInfo {
            itt: 3,
            lun_raw: 0,
            edtl_bytes: edtl,
            read: true,
            write: false,
            attr: 1,
            cdb: Bytes::from_static(&[0x28; 10]),
            bidi_read_len_bytes: None,
            holds_slot: true,
            r2ts_sent: 0,
        }
    }

    async fn collect(edtl: u32, resp: scsi::Response, seg: u32, burst: u32) -> Vec<OutPdu> {
        let (tx, mut rx) = mpsc::channel(64);
        let out = ConnOut {
            tx,
            send_segment_bytes_max: seg,
            max_burst_bytes: burst,
        };
        let mut released = false;
        let budget = block::BufferBudget::new(1 << 20);
        let permit = budget.acquire(edtl as u64).await;
        send_response(&out, &info(edtl), resp, permit, || released = true).await;
        assert!(released);
        drop(out);
        let mut v = Vec::new();
        while let Some(p) = rx.recv().await {
            v.push(p);
        }
        // the data that goes out stays accounted for until the PDUs are written
        let data_in: usize = v
            .iter()
            .filter(|p| matches!(p.pdu, TargetPdu::DataIn(_)))
            .map(|p| p.data.len())
            .sum();
        let held = budget.status().held_bytes;
        assert_eq!(held, (data_in as u64).div_ceil(1024) * 1024);
        v
    }

    #[tokio::test]
    async fn data_in_split_and_collapsed() {
        let resp = scsi::Response {
            status: 0,
            sense: None,
            data_in: Bytes::from(vec![7u8; 10_000]),
            transfer_len_bytes: 10_000,
        };
        let pdus = collect(12_000, resp, 4096, 8192).await;
        assert_eq!(pdus.len(), 3);
        let d: Vec<DataIn> = pdus
            .iter()
            .map(|p| match p.pdu {
                TargetPdu::DataIn(d) => d,
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(d[0].buffer_offset_bytes, 0);
        assert!(!d[0].final_bit);
        assert!(d[1].final_bit, "burst boundary at 8192");
        assert_eq!((d[2].data_sn, d[2].buffer_offset_bytes), (2, 8192));
        assert_eq!(d[2].status, Some(0));
        assert_eq!(d[2].residual, Residual::Underflow(2000));
        assert_eq!(pdus[2].data.len(), 10_000 - 8192);
    }

    #[tokio::test]
    async fn sense_goes_in_a_response_and_overflow_truncates() {
        let pdus = collect(512, check_condition(5, 0x20, 0), 8192, 65536).await;
        assert_eq!(pdus.len(), 1);
        match pdus[0].pdu {
            TargetPdu::ScsiResponse(r) => {
                assert_eq!(r.status, 2);
                assert_eq!(r.residual, Residual::Underflow(512));
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(&pdus[0].data[..2], &[0, 18]);
        let resp = scsi::Response {
            status: 0,
            sense: None,
            data_in: Bytes::from(vec![1u8; 1024]),
            transfer_len_bytes: 1024,
        };
        let pdus = collect(512, resp, 8192, 65536).await;
        assert_eq!(pdus.len(), 1);
        assert_eq!(pdus[0].data.len(), 512);
        match pdus[0].pdu {
            TargetPdu::DataIn(d) => assert_eq!(d.residual, Residual::Overflow(512)),
            other => panic!("{other:?}"),
        }
    }
}
