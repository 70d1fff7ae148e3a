//! Collecting the Data-Out of a write: immediate data, unsolicited Data-Out up to
//! FirstBurstLength, then R2T sequences (at most MaxOutstandingR2T, each at most
//! MaxBurstLength), with DataSN, offset and length checks. Pure state, no I/O.

use crate::exec::CmdInfo;
use block::BufferPermit;
use bytes::{Bytes, BytesMut};
use iscsi_proto::pdu::DataOut;
use iscsi_proto::target::R2t;
use iscsi_proto::RESERVED_TAG;

/// What is wrong with a Data-Out PDU (ERL 0: the connection is closed after a Reject).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum DataOutError {
    /// Offset or length outside what was solicited.
    #[error("data outside the solicited range (offset {offset_bytes}, {len_bytes} bytes)")]
    OutOfRange { offset_bytes: u32, len_bytes: u32 },
    /// The TTT names no outstanding R2T (and is not the unsolicited tag).
    #[error("unknown target transfer tag {0:#x}")]
    UnknownTtt(u32),
    /// DataSN out of sequence.
    #[error("DataSN {got}, expected {want}")]
    DataSn { got: u32, want: u32 },
    /// Unsolicited data when InitialR2T=Yes or after the first burst.
    #[error("unsolicited data not allowed")]
    Unsolicited,
    /// A sequence ended (F bit) before all its data arrived.
    #[error("sequence ended early")]
    EarlyFinal,
}

#[derive(Debug, Clone, Copy)]
struct Seq {
    ttt: u32,
    next_off: u32,
    end_off: u32,
    data_sn: u32,
}

/// Data-Out bytes that count as a write's progress (see
/// [`WriteTask::progressed`]): at the Data-Out wait of a few seconds, a
/// write must come faster than a few KiB/s.
pub(crate) const PROGRESS_BYTES_MIN: u32 = 64 << 10;

/// A write command waiting for its data.
#[derive(Debug)]
pub(crate) struct WriteTask {
    pub info: CmdInfo,
    buf: BytesMut,
    received_bytes: u32,
    unsolicited: Option<Seq>,
    r2ts: Vec<Seq>,
    next_r2t_off: u32,
    /// The node budget held for `buf` (and the command's Data-In, if any).
    permit: BufferPermit,
    /// When it was created or last took Data-Out bytes.
    progress: std::time::Instant,
    /// When it was created: over its whole life its data must come at
    /// [`block::PEER_RATE_MIN`] at least (see [`WriteTask::waiting_for`]).
    created: std::time::Instant,
    /// Bytes received since `progress` was last set.
    unmarked_bytes: u32,
    /// The session's write-abort generation when it arrived
    /// (`Session::write_aborted`).
    pub abort_gen: u64,
}

/// Negotiated values that shape the transfer.
#[derive(Debug, Clone, Copy)]
pub(crate) struct BurstLimits {
    pub first_burst_bytes: u32,
    pub max_burst_bytes: u32,
    pub max_outstanding_r2t: u32,
    pub initial_r2t: bool,
}

impl WriteTask {
    /// Starts collecting for `info` (a write with `edtl_bytes > 0`) with `immediate`
    /// data already received; `unsolicited_follows` is the command's F bit cleared.
    pub(crate) fn new(
        info: CmdInfo,
        immediate: &[u8],
        unsolicited_follows: bool,
        lim: &BurstLimits,
    ) -> Result<Self, DataOutError> {
        let edtl = info.edtl_bytes;
        let imm = immediate.len() as u32;
        if imm > edtl || imm > lim.first_burst_bytes {
            return Err(DataOutError::OutOfRange {
                offset_bytes: 0,
                len_bytes: imm,
            });
        }
        if unsolicited_follows && lim.initial_r2t {
            return Err(DataOutError::Unsolicited);
        }
        let mut buf = BytesMut::zeroed(edtl as usize);
        buf[..immediate.len()].copy_from_slice(immediate);
        let unsolicited_end = if unsolicited_follows {
            lim.first_burst_bytes.min(edtl)
        } else {
            imm
        };
        let unsolicited = (unsolicited_follows && unsolicited_end > imm).then_some(Seq {
            ttt: RESERVED_TAG,
            next_off: imm,
            end_off: unsolicited_end,
            data_sn: 0,
        });
        Ok(WriteTask {
            info,
            buf,
            received_bytes: imm,
            unsolicited,
            r2ts: Vec::new(),
            next_r2t_off: unsolicited_end,
            permit: BufferPermit::empty(),
            progress: std::time::Instant::now(),
            created: std::time::Instant::now(),
            unmarked_bytes: 0,
            abort_gen: 0,
        })
    }

    /// `len` Data-Out bytes came. The write makes progress (its wait for
    /// Data-Out starts again) once [`PROGRESS_BYTES_MIN`] came since the last
    /// time (a complete write is done with): empty or tiny PDUs trickled in
    /// do not keep a write, and the node's budget it holds, alive. An
    /// initiator that negotiated bursts of a few hundred bytes over a long
    /// round trip needs 64 KiB within the wait all the same.
    pub(crate) fn progressed(&mut self, len: u32) {
        self.unmarked_bytes = self.unmarked_bytes.saturating_add(len);
        if self.unmarked_bytes >= PROGRESS_BYTES_MIN {
            self.unmarked_bytes = 0;
            self.progress = std::time::Instant::now();
        }
    }

    /// How long it has waited for Data-Out: since the last [`PROGRESS_BYTES_MIN`]
    /// came, or how far its data is behind [`block::PEER_RATE_MIN`] since it
    /// was created, whichever is longer. The second bounds a write fed 64 KiB
    /// just within each wait (at a default wait of 15 s, 4 KiB/s: a 16 MiB
    /// write held its share of the node's budget for an hour; review of
    /// 2026-12-06), as the writers' [`block::RateFloor`] bounds reads.
    pub(crate) fn waiting_for(&self, now: std::time::Instant) -> std::time::Duration {
        let since_progress = now.saturating_duration_since(self.progress);
        let earned = std::time::Duration::from_micros(
            u64::from(self.received_bytes).saturating_mul(1_000_000) / block::PEER_RATE_MIN as u64,
        );
        let behind = now
            .saturating_duration_since(self.created)
            .saturating_sub(earned);
        since_progress.max(behind)
    }

    /// Keeps `permit` (the node budget taken for this command) with the buffer.
    pub(crate) fn with_permit(mut self, permit: BufferPermit) -> Self {
        self.permit = permit;
        self
    }

    /// Buffer bytes this task holds.
    pub(crate) fn buffered_bytes(&self) -> usize {
        self.buf.len()
    }

    /// All data has arrived.
    pub(crate) fn complete(&self) -> bool {
        self.received_bytes == self.info.edtl_bytes
    }

    /// The collected data (call once complete) and the budget it holds.
    pub(crate) fn into_data(self) -> (Bytes, BufferPermit) {
        (self.buf.freeze(), self.permit)
    }

    /// R2Ts to send now (up to MaxOutstandingR2T outstanding); `next_ttt` hands out tags.
    pub(crate) fn issue_r2ts(
        &mut self,
        lim: &BurstLimits,
        mut next_ttt: impl FnMut() -> u32,
    ) -> Vec<R2t> {
        let mut out = Vec::new();
        let edtl = self.info.edtl_bytes;
        while (self.r2ts.len() as u32) < lim.max_outstanding_r2t.max(1) && self.next_r2t_off < edtl
        {
            let len = (edtl - self.next_r2t_off).min(lim.max_burst_bytes.max(512));
            let ttt = next_ttt();
            self.r2ts.push(Seq {
                ttt,
                next_off: self.next_r2t_off,
                end_off: self.next_r2t_off + len,
                data_sn: 0,
            });
            out.push(R2t {
                lun: self.info.lun_raw,
                itt: self.info.itt,
                ttt,
                // (R2TSNs count from 0: the next is the number sent)
                r2t_sn: self.info.r2ts_sent,
                buffer_offset_bytes: self.next_r2t_off,
                desired_len_bytes: len,
            });
            // counted in whatever answers the write (its response, an error)
            self.info.r2ts_sent = self.info.r2ts_sent.wrapping_add(1);
            self.next_r2t_off += len;
        }
        out
    }

    /// Takes one Data-Out PDU. Returns whether a sequence finished (so more R2Ts may go).
    pub(crate) fn accept(&mut self, d: &DataOut, data: &[u8]) -> Result<bool, DataOutError> {
        let len = data.len() as u32;
        let seq = if d.ttt == RESERVED_TAG {
            self.unsolicited.as_mut().ok_or(DataOutError::Unsolicited)?
        } else {
            self.r2ts
                .iter_mut()
                .find(|s| s.ttt == d.ttt)
                .ok_or(DataOutError::UnknownTtt(d.ttt))?
        };
        let range_err = DataOutError::OutOfRange {
            offset_bytes: d.buffer_offset_bytes,
            len_bytes: len,
        };
        if d.buffer_offset_bytes != seq.next_off {
            return Err(range_err);
        }
        let end = seq.next_off.checked_add(len).ok_or(range_err)?;
        if end > seq.end_off {
            return Err(range_err);
        }
        if d.data_sn != seq.data_sn {
            return Err(DataOutError::DataSn {
                got: d.data_sn,
                want: seq.data_sn,
            });
        }
        let start = seq.next_off as usize;
        self.buf[start..start + data.len()].copy_from_slice(data);
        seq.next_off = end;
        seq.data_sn = seq.data_sn.wrapping_add(1);
        self.received_bytes += len;
        let done = seq.next_off == seq.end_off;
        if d.final_bit && !done {
            return Err(DataOutError::EarlyFinal);
        }
        if done {
            let ttt = seq.ttt;
            if ttt == RESERVED_TAG {
                self.unsolicited = None;
            } else {
                self.r2ts.retain(|s| s.ttt != ttt);
            }
        }
        Ok(done)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(edtl: u32) -> CmdInfo {
        CmdInfo {
            itt: 1,
            lun_raw: 0,
            edtl_bytes: edtl,
            read: false,
            write: true,
            attr: 1,
            cdb: Bytes::new(),
            bidi_read_len_bytes: None,
            holds_slot: true,
            r2ts_sent: 0,
        }
    }

    fn lim() -> BurstLimits {
        BurstLimits {
            first_burst_bytes: 8192,
            max_burst_bytes: 16384,
            max_outstanding_r2t: 2,
            initial_r2t: false,
        }
    }

    fn dout(ttt: u32, data_sn: u32, off: u32, final_bit: bool) -> DataOut {
        DataOut {
            final_bit,
            lun: 0,
            itt: 1,
            ttt,
            exp_stat_sn: 0,
            data_sn,
            buffer_offset_bytes: off,
        }
    }

    #[test]
    fn immediate_unsolicited_then_r2ts() {
        let l = lim();
        let mut t = WriteTask::new(info(64 * 1024), &[1u8; 4096], true, &l).unwrap();
        let mut tag = 100;
        let r = t.issue_r2ts(&l, || {
            tag += 1;
            tag
        });
        assert_eq!(r.len(), 2);
        assert_eq!(
            (r[0].buffer_offset_bytes, r[0].desired_len_bytes),
            (8192, 16384)
        );
        assert_eq!((r[1].buffer_offset_bytes, r[1].r2t_sn), (8192 + 16384, 1));
        assert!(t
            .accept(&dout(RESERVED_TAG, 0, 4096, true), &[2u8; 4096])
            .unwrap());
        assert_eq!(
            t.accept(&dout(RESERVED_TAG, 1, 8192, true), &[0u8; 4]),
            Err(DataOutError::Unsolicited)
        );
        assert!(!t.accept(&dout(101, 0, 8192, false), &[3u8; 8192]).unwrap());
        assert_eq!(
            t.accept(&dout(101, 0, 16384, false), &[3u8; 8192]),
            Err(DataOutError::DataSn { got: 0, want: 1 })
        );
        assert!(t.accept(&dout(101, 1, 16384, true), &[3u8; 8192]).unwrap());
        let more = t.issue_r2ts(&l, || 200);
        assert_eq!(more.len(), 1);
        assert_eq!(more[0].buffer_offset_bytes, 8192 + 2 * 16384);
        assert!(t
            .accept(&dout(102, 0, 8192 + 16384, true), &[4u8; 16384])
            .unwrap());
        assert!(!t.complete());
        assert!(t
            .accept(&dout(200, 0, 8192 + 2 * 16384, true), &[5u8; 16384])
            .unwrap());
        let last = t.issue_r2ts(&l, || 300);
        assert_eq!(
            (last[0].buffer_offset_bytes, last[0].desired_len_bytes),
            (57344, 8192)
        );
        assert_eq!(last[0].r2t_sn, 3);
        assert!(t.accept(&dout(300, 0, 57344, true), &[5u8; 8192]).unwrap());
        assert!(t.complete());
        let (data, _) = t.into_data();
        assert_eq!(data[0], 1);
        assert_eq!(data[4096], 2);
        assert_eq!(data[65535], 5);
    }

    #[test]
    fn bad_input() {
        let l = lim();
        assert!(WriteTask::new(info(100), &[0u8; 200], false, &l).is_err());
        let strict = BurstLimits {
            initial_r2t: true,
            ..l
        };
        assert_eq!(
            WriteTask::new(info(100_000), &[], true, &strict).unwrap_err(),
            DataOutError::Unsolicited
        );
        let mut t = WriteTask::new(info(20_000), &[], false, &l).unwrap();
        let r = t.issue_r2ts(&l, || 9);
        assert_eq!(r[0].desired_len_bytes, 16384);
        assert_eq!(
            t.accept(&dout(9, 0, 4, false), &[0; 4]),
            Err(DataOutError::OutOfRange {
                offset_bytes: 4,
                len_bytes: 4
            })
        );
        assert_eq!(
            t.accept(&dout(8, 0, 0, false), &[0; 4]),
            Err(DataOutError::UnknownTtt(8))
        );
        assert_eq!(
            t.accept(&dout(9, 0, 0, true), &[0; 4]),
            Err(DataOutError::EarlyFinal)
        );
        let mut t = WriteTask::new(info(1000), &[], false, &l).unwrap();
        t.issue_r2ts(&l, || 1);
        assert!(t.accept(&dout(1, 0, 0, true), &[0; 1001]).is_err());
    }
}
