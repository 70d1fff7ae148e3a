//! The one writer task of a connection: stamps sequence numbers, batches queued
//! PDUs and writes them with vectored writes (header, data `Bytes`, padding,
//! digests) without copying data. A PDU may carry the [`BufferPermit`] of the
//! data it ends (the last Data-In of a read): it goes back to the node's budget
//! only once the batch holding it is on the wire.

use block::BufferPermit;
use bytes::Bytes;
use iscsi_proto::digest::{data_digest, header_digest, pad_len, PAD_ZEROES};
use iscsi_proto::target::{SeqNumbers, TargetPdu};
use iscsi_proto::BHS_LEN;
use parking_lot::Mutex;
use std::io::IoSlice;
use std::sync::Arc;
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;

/// Most PDUs written in one batch.
const BATCH_PDUS_MAX: usize = 64;
/// Most data bytes written in one batch.
const BATCH_BYTES_MAX: usize = 4 * 1024 * 1024;

/// One PDU to send.
#[derive(Debug)]
pub(crate) struct OutPdu {
    /// Header; StatSN/ExpCmdSN/MaxCmdSN are stamped by the writer.
    pub pdu: TargetPdu,
    /// Data segment (a view into the response buffer).
    pub data: Bytes,
    /// Budget held by the response buffer, released once this PDU is written.
    pub permit: BufferPermit,
}

impl OutPdu {
    pub(crate) fn new(pdu: TargetPdu, data: Bytes) -> Self {
        OutPdu {
            pdu,
            data,
            permit: BufferPermit::empty(),
        }
    }

    /// A PDU whose writing ends the life of a buffer that `permit` accounts for.
    pub(crate) fn holding(pdu: TargetPdu, data: Bytes, permit: BufferPermit) -> Self {
        OutPdu { pdu, data, permit }
    }
}

/// The CmdSN window of a session, shared by the reader (which advances ExpCmdSN),
/// command tasks (which open the window as they complete) and the writer.
#[derive(Debug)]
pub(crate) struct Window {
    inner: Mutex<WindowState>,
}

#[derive(Debug, Clone, Copy)]
struct WindowState {
    exp_cmd_sn: u32,
    max_cmd_sn: u32,
}

impl Window {
    pub(crate) fn new(exp_cmd_sn: u32, window: u32) -> Self {
        Window {
            inner: Mutex::new(WindowState {
                exp_cmd_sn,
                max_cmd_sn: exp_cmd_sn.wrapping_add(window.max(1)).wrapping_sub(1),
            }),
        }
    }

    /// Current (ExpCmdSN, MaxCmdSN).
    pub(crate) fn get(&self) -> (u32, u32) {
        let s = self.inner.lock();
        (s.exp_cmd_sn, s.max_cmd_sn)
    }

    /// Accepts a non-immediate PDU with `cmd_sn` if it is the next expected one
    /// inside the window. `holds_slot`: the PDU keeps its window slot until
    /// [`Window::release`] (SCSI commands); others open the window at once.
    pub(crate) fn accept(&self, cmd_sn: u32, holds_slot: bool) -> bool {
        let mut s = self.inner.lock();
        if cmd_sn != s.exp_cmd_sn || !iscsi_proto::sn_le(cmd_sn, s.max_cmd_sn) {
            return false;
        }
        s.exp_cmd_sn = s.exp_cmd_sn.wrapping_add(1);
        if !holds_slot {
            s.max_cmd_sn = s.max_cmd_sn.wrapping_add(1);
        }
        true
    }

    /// A command that held a slot is done: open the window by one.
    pub(crate) fn release(&self) {
        let mut s = self.inner.lock();
        s.max_cmd_sn = s.max_cmd_sn.wrapping_add(1);
    }
}

struct Encoded {
    hdr: [u8; BHS_LEN + 4],
    hdr_len: usize,
    data: Bytes,
    pad: usize,
    ddig: [u8; 4],
    ddig_len: usize,
    /// Dropped after the batch is written.
    _permit: BufferPermit,
}

/// Runs until every sender is gone (then shuts the socket down) or a write fails.
pub(crate) async fn run_writer<W: tokio::io::AsyncWrite + Unpin>(
    mut sock: W,
    mut rx: mpsc::Receiver<OutPdu>,
    window: Arc<Window>,
    mut stat_sn: u32,
    header_digest_on: bool,
    data_digest_on: bool,
    stall: std::time::Duration,
) -> std::io::Result<()> {
    let mut batch: Vec<OutPdu> = Vec::with_capacity(BATCH_PDUS_MAX);
    let mut enc: Vec<Encoded> = Vec::with_capacity(BATCH_PDUS_MAX);
    let mut floor = block::RateFloor::new(stall);
    while let Some(first) = rx.recv().await {
        batch.push(first);
        let mut bytes = batch[0].data.len();
        while batch.len() < BATCH_PDUS_MAX && bytes < BATCH_BYTES_MAX {
            match rx.try_recv() {
                Ok(p) => {
                    bytes += p.data.len();
                    batch.push(p);
                }
                Err(_) => break,
            }
        }
        let (exp_cmd_sn, max_cmd_sn) = window.get();
        for p in batch.drain(..) {
            let sn = stat_sn;
            if p.pdu.carries_status() {
                stat_sn = stat_sn.wrapping_add(1);
            }
            let seq = SeqNumbers {
                stat_sn: sn,
                exp_cmd_sn,
                max_cmd_sn,
            };
            let bhs = p.pdu.encode(&seq, p.data.len() as u32);
            let mut hdr = [0u8; BHS_LEN + 4];
            hdr[..BHS_LEN].copy_from_slice(&bhs);
            let mut hdr_len = BHS_LEN;
            if header_digest_on {
                let d = header_digest(&bhs);
                hdr[BHS_LEN..].copy_from_slice(&d);
                hdr_len += 4;
            }
            let (ddig, ddig_len) = if data_digest_on && !p.data.is_empty() {
                (data_digest(&p.data), 4)
            } else {
                ([0; 4], 0)
            };
            enc.push(Encoded {
                hdr,
                hdr_len,
                pad: pad_len(p.data.len()),
                data: p.data,
                ddig,
                ddig_len,
                _permit: p.permit,
            });
        }
        let total: usize = enc
            .iter()
            .map(|e| e.hdr_len + e.data.len() + e.pad + e.ddig_len)
            .sum();
        floor
            .send(total, "initiator", write_all_vectored(&mut sock, &enc))
            .await?;
        enc.clear();
    }
    sock.flush().await?;
    sock.shutdown().await
}

async fn write_all_vectored<W: tokio::io::AsyncWrite + Unpin>(
    sock: &mut W,
    enc: &[Encoded],
) -> std::io::Result<()> {
    let mut parts: Vec<&[u8]> = Vec::with_capacity(enc.len() * 4);
    for e in enc {
        parts.push(&e.hdr[..e.hdr_len]);
        if !e.data.is_empty() {
            parts.push(&e.data);
        }
        if e.pad > 0 {
            parts.push(&PAD_ZEROES[..e.pad]);
        }
        if e.ddig_len > 0 {
            parts.push(&e.ddig[..e.ddig_len]);
        }
    }
    let mut idx = 0usize;
    let mut off = 0usize;
    while idx < parts.len() {
        let slices: Vec<IoSlice<'_>> = std::iter::once(IoSlice::new(&parts[idx][off..]))
            .chain(parts[idx + 1..].iter().map(|p| IoSlice::new(p)))
            .take(512)
            .collect();
        let mut n = sock.write_vectored(&slices).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        while n > 0 && idx < parts.len() {
            let left = parts[idx].len() - off;
            if n >= left {
                n -= left;
                idx += 1;
                off = 0;
            } else {
                off += n;
                n = 0;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use iscsi_proto::target::{parse_target_bhs, NopIn};

    #[test]
    fn window_accepts_in_order_only() {
        let w = Window::new(10, 4);
        assert_eq!(w.get(), (10, 13));
        assert!(!w.accept(11, true));
        assert!(w.accept(10, true));
        assert_eq!(w.get(), (11, 13));
        assert!(w.accept(11, false));
        assert_eq!(w.get(), (12, 14));
        assert!(w.accept(12, true) && w.accept(13, true) && w.accept(14, true));
        assert!(!w.accept(15, true), "window closed");
        w.release();
        assert!(w.accept(15, true));
    }

    /// A reader taking its data a little at a time, often enough that no stall
    /// timer fires, still has to take each batch at block::PEER_RATE_MIN past the
    /// stall time, or the writer gives up (and the connection with it). At the
    /// minimum rate it goes through. (Time is paused: tokio moves it on when
    /// every task waits, so the reading pace is exact.)
    #[tokio::test(start_paused = true)]
    async fn a_reader_below_the_minimum_rate_is_given_up() {
        async fn run(read_bytes: usize) -> std::io::Result<()> {
            let (tx, rx) = mpsc::channel(64);
            let window = Arc::new(Window::new(5, 8));
            let (mut client, server) = tokio::io::duplex(8 * 1024);
            let stall = std::time::Duration::from_secs(1);
            let h = tokio::spawn(run_writer(server, rx, window, 100, false, false, stall));
            // 32 PDUs of 16 KiB: one batch of 512 KiB, 9 s allowed
            for _ in 0..32 {
                let pdu = TargetPdu::NopIn(NopIn {
                    lun: 0,
                    itt: 1,
                    ttt: iscsi_proto::RESERVED_TAG,
                });
                tx.send(OutPdu::new(pdu, Bytes::from(vec![0u8; 16 * 1024])))
                    .await
                    .unwrap();
            }
            drop(tx);
            // `read_bytes` every 100 ms
            let reader = tokio::spawn(async move {
                let mut buf = vec![0u8; read_bytes];
                loop {
                    match tokio::io::AsyncReadExt::read(&mut client, &mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(_) => tokio::time::sleep(std::time::Duration::from_millis(100)).await,
                    }
                }
            });
            let r = h.await.unwrap();
            reader.abort();
            r
        }
        // 20 KiB/s: 26 s for the batch
        let slow = run(2 * 1024).await;
        assert_eq!(
            slow.map_err(|e| e.kind()),
            Err(std::io::ErrorKind::TimedOut),
            "a reader at 20 KiB/s kept its batch"
        );
        // 80 KiB/s: 6.5 s
        run(8 * 1024).await.unwrap();
    }

    #[tokio::test]
    async fn writer_stamps_and_pads() {
        let (tx, rx) = mpsc::channel(8);
        let window = Arc::new(Window::new(5, 8));
        let (client, server) = tokio::io::duplex(1 << 16);
        let h = tokio::spawn(run_writer(
            server,
            rx,
            window,
            100,
            true,
            true,
            std::time::Duration::MAX,
        ));
        for ttt in [0xffff_ffffu32, 7] {
            tx.send(OutPdu::new(
                TargetPdu::NopIn(NopIn {
                    lun: 0,
                    itt: 1,
                    ttt,
                }),
                Bytes::from_static(b"abc"),
            ))
            .await
            .unwrap();
        }
        drop(tx);
        h.await.unwrap().unwrap();
        let mut out = Vec::new();
        let mut client = client;
        tokio::io::AsyncReadExt::read_to_end(&mut client, &mut out)
            .await
            .unwrap();
        assert_eq!(out.len(), 2 * (48 + 4 + 4 + 4));
        let mut h1 = [0u8; 48];
        h1.copy_from_slice(&out[..48]);
        let (_, s1, dl) = parse_target_bhs(&h1).unwrap();
        assert_eq!(
            (s1.stat_sn, s1.exp_cmd_sn, s1.max_cmd_sn, dl),
            (100, 5, 12, 3)
        );
        h1.copy_from_slice(&out[60..108]);
        let (_, s2, _) = parse_target_bhs(&h1).unwrap();
        assert_eq!(
            s2.stat_sn, 101,
            "a ping carries the next StatSN without using it"
        );
    }
}
