//! One connection in full feature phase: the reader loop and PDU dispatch.
//!
//! The node budget of buffered bytes (`block::BufferBudget`). Every SCSI command
//! with data takes, once, before its buffer exists, a permit for all of its
//! bytes: Expected Data Transfer Length for a read (the Data-In it may queue for
//! the initiator) or for a write (its Data-Out buffer), both for a bidirectional
//! one. The reader takes it itself, so while it waits nothing more is read from
//! the socket and TCP pushes back on the initiator; nothing queues up meanwhile.
//! A write gives its bytes back once executed, a read once its last Data-In is
//! written (the writer drops the permit after the batch is on the wire).
//!
//! Why waiting cannot deadlock: a permit is given back by the LU finishing a
//! command (which never waits for the budget) and by the writer draining the
//! socket (which only needs the initiator to read), except for one kind: a write
//! still collecting Data-Out, whose data can only come through this connection's
//! reader. So a reader with such writes pending never waits: if the bytes are not
//! free at once the command is answered TASK SET FULL (the initiator retries;
//! counted as a refusal). A reader that waits thus holds nothing that its own
//! progress would release, and every permit it waits for is released without any
//! waiting reader's help. Each command acquires once (clamped to the whole
//! budget, so a command larger than the budget runs alone), never a second time
//! while holding the first. A client that neither reads its answers nor lets us
//! read its requests (a single thread writing requests into a full socket) gets
//! stuck against any bounded server; real initiators read and write at once.
//! One that stops reading altogether is dropped after `nop_in_timeout_ms` without
//! progress (`block::StallTimeout` on the writer), which gives its permits back.
//!
//! The bytes come from the session's share of the node's budget first
//! (`Session::buffers`, `[limits] session_buffer_max`), then from its source
//! address's share (`source_buffer_max`), then from the node's, so one
//! session holds at most its share, one host at most its own, and a session
//! that reads its answers slowly holds back only itself and its host. The
//! same reasoning holds at each share's level: its permits are released by
//! the same two events, and another connection (or session) collecting
//! Data-Out is read by its own reader, which never waits.

use crate::dataout::{BurstLimits, WriteTask};
use crate::exec::{check_condition, send_response, spawn_command, CmdInfo, ConnOut};
use crate::login_phase::{login, ConnError};
use crate::server::Ctx;
use crate::session::Session;
use crate::writer::{run_writer, OutPdu};
use block::{BufferPermit, StallTimeout};
use bytes::{BufMut, Bytes, BytesMut};
use iscsi_proto::frame::{Frame, FrameError, FrameLimits};
use iscsi_proto::login::{Negotiated, SessionType};
use iscsi_proto::pdu::{opcode, DataOut, LogoutRequest, NopOut, ScsiCommand, TextRequest, BHS_LEN};
use iscsi_proto::recv::{RecvBuf, OWN_BYTES_MIN};
use iscsi_proto::target::{reject_reason, LogoutResponse, NopIn, Reject, TargetPdu, TextResponse};
use iscsi_proto::text::{parse_text, push_pair, TextAccumulator};
use iscsi_proto::{InitiatorPdu, ProtoError, RESERVED_TAG};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;
use tokio::sync::mpsc;

/// ... and during the login (its PDUs carry at most 8 KiB of data; a read
/// takes up to 64 KiB of room): a peer that has not authenticated makes this
/// node hold no more than that.
const LOGIN_READ_BUF_BYTES: usize = 16 * 1024;
/// Commands beyond the CmdSN window (immediate ones) tolerated per session.
const IMMEDIATE_EXTRA_TASKS: usize = 16;

/// The answer to a command the task set (or a buffer budget) has no room for.
fn task_set_full() -> scsi::Response {
    scsi::Response {
        status: scsi::status::TASK_SET_FULL,
        sense: None,
        data_in: Bytes::new(),
        transfer_len_bytes: 0,
    }
}

/// What to do after a PDU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Flow {
    Continue,
    /// Stop reading; let queued PDUs go out, then close.
    Close,
}

/// Serves one accepted TCP connection from login to close.
pub(crate) async fn serve(
    ctx: Arc<Ctx>,
    mut sock: TcpStream,
    peer: SocketAddr,
    portal: crate::Portal,
) {
    if let Err(e) = sock.set_nodelay(true) {
        tracing::warn!(%peer, error = %e, "TCP_NODELAY failed");
    }
    let local = sock.local_addr().unwrap_or(portal.addr);
    if let Some(left) = ctx.auth_limit.locked(peer.ip()) {
        ctx.auth_limit.log_refused(peer.ip(), left);
        return;
    }
    let slot = ctx.logins.admit(peer.ip());
    let mut buf = BytesMut::with_capacity(LOGIN_READ_BUF_BYTES);
    let login_timeout = Duration::from_millis(ctx.limits.login_timeout_ms);
    let mut shutdown = ctx.shutdown.clone();
    let res = tokio::select! {
        r = tokio::time::timeout(login_timeout, login(&ctx, &mut sock, &mut buf, portal.tpgt, peer, &slot)) => r,
        _ = shutdown.wait_for(|s| *s) => return,
        // Logged (rate-limited) by the budget.
        _ = slot.evicted() => return,
    };
    drop(slot);
    let (neg, registered) = match res {
        Ok(Ok(x)) => x,
        Ok(Err(ConnError::LoginFailed {
            status: st,
            auth,
            initiator,
            chap_name,
        })) => {
            let initiator = initiator.as_deref().unwrap_or("-");
            let chap_user = chap_name.as_deref().unwrap_or("-");
            // an authentication failure always (each counts toward its
            // source's lockout, which bounds them), the rest one line a
            // second with a count of those left out
            if let Some(f) = auth {
                tracing::warn!(
                    %peer,
                    initiator,
                    chap_user,
                    failures = f.failures,
                    "login refused: authentication failed"
                );
                if f.locked_now {
                    tracing::warn!(
                        source = %peer.ip(),
                        initiator,
                        lockout_ms = ctx.limits.auth_lockout_ms,
                        "too many failed authentications: source locked out"
                    );
                }
            } else if let Some(left_out) = ctx.refusals_log.allow() {
                tracing::warn!(%peer, initiator, status = format_args!("{st:#06x}"), left_out, "login refused");
            }
            return;
        }
        Ok(Err(ConnError::Eof)) => return,
        Ok(Err(ConnError::FirstPduTimeout)) => {
            tracing::debug!(%peer, "no Login Request in time; closed");
            return;
        }
        Ok(Err(e)) => {
            if let Some(left_out) = ctx.refusals_log.allow() {
                tracing::warn!(%peer, error = %e, left_out, "login aborted");
            }
            return;
        }
        Err(_) => {
            if let Some(left_out) = ctx.refusals_log.allow() {
                tracing::warn!(%peer, left_out, "login timed out");
            }
            return;
        }
    };
    let session = registered.session.clone();
    tracing::info!(
        %peer,
        initiator = %neg.initiator_name,
        tsih = session.tsih,
        discovery = (neg.session_type == SessionType::Discovery),
        "login complete"
    );
    // registered before this look: a portal removed after it finds the session
    // in the registry (server.rs, Reloader::set_portals)
    if !ctx.serves_portal(portal.tpgt) {
        tracing::info!(%peer, portal = %portal.addr, tsih = session.tsih, "the portal was removed during the login; closing the session");
        session.kill.send_replace(true);
    }
    // the same for the access settings (Reloader::replace)
    if !ctx.still_admits(&session) {
        tracing::warn!(%peer, initiator = %neg.initiator_name, tsih = session.tsih,
            "the access settings changed during the login and no longer admit it; closing the session");
        session.kill.send_replace(true);
    }
    full_feature(ctx, sock, buf, neg, registered, local, peer).await;
}

async fn full_feature(
    ctx: Arc<Ctx>,
    sock: TcpStream,
    buf: BytesMut,
    neg: Negotiated,
    registered: crate::login_phase::Registered,
    local: SocketAddr,
    peer: SocketAddr,
) {
    let session = registered.session.clone();
    let (rd, wr) = sock.into_split();
    let (tx, rx) = mpsc::channel(ctx.limits.writer_queue_pdus.max(8));
    // a client that takes none of its data for this long is dropped, and the
    // buffers queued for it go back to the node budget
    let stall = match ctx.limits.nop_in_timeout_ms {
        0 => Duration::MAX,
        ms => Duration::from_millis(ms),
    };
    let writer = tokio::spawn({
        let (window, stat_sn) = (session.window.clone(), neg.next_stat_sn);
        let (hd, dd) = (neg.header_digest, neg.data_digest);
        async move {
            let r = run_writer(
                StallTimeout::new(wr, stall),
                rx,
                window,
                stat_sn,
                hd,
                dd,
                stall,
            )
            .await;
            match &r {
                Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {
                    tracing::warn!(%peer, error = %e, "initiator stopped reading; dropping the connection")
                }
                Err(e) => tracing::debug!(%peer, error = %e, "write failed"),
                Ok(()) => {}
            }
            r
        }
    });
    let out = Arc::new(ConnOut {
        tx,
        send_segment_bytes_max: neg.send_data_segment_bytes_max,
        max_burst_bytes: neg.max_burst_bytes,
    });
    let mut conn = Conn {
        burst: BurstLimits {
            first_burst_bytes: neg.first_burst_bytes,
            max_burst_bytes: neg.max_burst_bytes,
            max_outstanding_r2t: neg.max_outstanding_r2t,
            initial_r2t: neg.initial_r2t,
        },
        frame_limits: FrameLimits {
            header_digest: neg.header_digest,
            data_digest: neg.data_digest,
            max_data_segment_bytes: neg.recv_data_segment_bytes_max,
            max_ahs_bytes: 256,
        },
        discovery: neg.session_type == SessionType::Discovery,
        ctx: ctx.clone(),
        session: session.clone(),
        out,
        neg,
        local,
        peer,
        writes: HashMap::new(),
        buffered_bytes: 0,
        text: TextAccumulator::new(),
        text_pending: None,
        next_tag: 0,
        pdu_log: block::admission::LogGate::new(Duration::from_secs(1)),
        ping: None,
        stopping: false,
        echoes: block::BufferBudget::new(ECHO_BYTES_MAX),
        tmf_waiters: Arc::new(tokio::sync::Semaphore::new(TMF_WAITERS_MAX)),
    };
    let why = conn.read_loop(rd, buf).await;
    tracing::info!(peer = %conn.peer, tsih = session.tsih, reason = ?why, "connection closing");
    // Commands still receiving data can never complete now.
    for (_, w) in conn.writes.drain() {
        if w.info.holds_slot {
            session.window.release();
        }
    }
    let drain = Duration::from_millis(ctx.limits.drain_timeout_ms);
    // Commands the LU is executing finish first (their answers go nowhere once
    // the writer is gone, so they end at once after the LU): aborting one drops
    // its node budget while the disk may still own its buffer, and a burst of
    // connections closing would then let new reads take bytes that are still
    // in use.
    session.drain(drain).await;
    let itts = session.abort_where(|_| true);
    session
        .wait_all_gone(&itts, drain, "the connection's end")
        .await;
    drop(conn);
    let mut writer = writer;
    if tokio::time::timeout(Duration::from_secs(2), &mut writer)
        .await
        .is_err()
    {
        writer.abort();
    }
    // the nexus's state (SPC-2 reservation, unit attentions, medium removal)
    // goes with it, unless a session that reinstated it owns it now: that
    // login already ended it (login_phase), and a late end here would clear
    // what the new session has set since
    if let (Some(scsi), Some(nexus)) = (&session.scsi, &session.nexus) {
        if !ctx.registry.has_live_successor(&session) {
            scsi.nexus_lost(nexus).await;
        }
    }
    // out of the registry, and ended
    drop(registered);
}

#[derive(Debug)]
enum End {
    Eof,
    Io,
    /// Logout, protocol violation or reset: closed by us after the last answer.
    Closed,
    Killed,
    Shutdown,
    NopTimeout,
    /// A write waited longer than `nop_in_timeout_ms` for its Data-Out.
    DataOutTimeout,
    /// The writer failed (the initiator stopped taking data, or the socket broke).
    WriterGone,
}

/// What came of asking the node budget for a command's bytes.
enum Budget {
    Held(BufferPermit),
    /// Not free, and waiting could deadlock: answer TASK SET FULL.
    Busy,
    /// The connection ends while waiting.
    Stop,
}

struct PendingText {
    itt: u32,
    ttt: u32,
    rest: Bytes,
}

pub(crate) struct Conn {
    pub(crate) ctx: Arc<Ctx>,
    pub(crate) session: Arc<Session>,
    pub(crate) out: Arc<ConnOut>,
    pub(crate) neg: Negotiated,
    local: SocketAddr,
    pub(crate) peer: SocketAddr,
    pub(crate) discovery: bool,
    burst: BurstLimits,
    frame_limits: FrameLimits,
    pub(crate) writes: HashMap<u32, WriteTask>,
    pub(crate) buffered_bytes: usize,
    text: TextAccumulator,
    text_pending: Option<PendingText>,
    next_tag: u32,
    ping: Option<(u32, Instant)>,
    /// The connection ends: stop reading.
    stopping: bool,
    /// Bytes of NOP-Out data being echoed: immediate NOP-Outs are outside the
    /// CmdSN window, so without this bound a client could queue up to the
    /// writer's whole queue of full-size echoes.
    echoes: block::BufferBudget,
    /// Task management functions waiting for their tasks to end (each on a
    /// task of its own); more wait in the reader.
    pub(crate) tmf_waiters: Arc<tokio::sync::Semaphore>,
    /// Lines about single PDUs of the peer's (`pdu_log!`): one a second.
    pub(crate) pdu_log: block::admission::LogGate,
}

/// A log line about one PDU of the peer's: at most one a second per
/// connection, with how many were held back since the last, so that a peer
/// sending such PDUs at line rate cannot fill the log (review of 2026-12-06:
/// only the refusals before login were held back).
macro_rules! pdu_log {
    ($conn:expr, $level:ident, $($arg:tt)+) => {
        if let Some(held_back) = $conn.pdu_log.allow() {
            tracing::$level!(held_back, $($arg)+);
        }
    };
}
pub(crate) use pdu_log;

/// Most bytes of answers to requests outside the CmdSN window (NOP-In echoes,
/// Text responses) queued per connection.
const ECHO_BYTES_MAX: u64 = 1 << 20;
/// Most task management functions of one connection waiting at once.
const TMF_WAITERS_MAX: usize = 16;

impl Conn {
    async fn read_loop(&mut self, mut rd: tokio::net::tcp::OwnedReadHalf, buf: BytesMut) -> End {
        let mut recv = RecvBuf::new(buf);
        let mut kill = self.session.kill.subscribe();
        let mut shutdown = self.ctx.shutdown.clone();
        let interval_ms = self.ctx.limits.nop_in_interval_ms;
        let timeout_ms = self.ctx.limits.nop_in_timeout_ms;
        // the tick pings (interval) and bounds the wait for Data-Out (timeout):
        // either setting alone runs it (pings off used to turn the Data-Out
        // bound off too; review of 2026-12-06)
        let ticking = interval_ms > 0 || timeout_ms > 0;
        let period = match interval_ms {
            0 => Duration::from_millis((timeout_ms / 2).max(50)),
            i => Duration::from_millis((i / 2).max(50)),
        };
        let mut tick = tokio::time::interval(period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last_rx = Instant::now();
        loop {
            loop {
                match recv.next_frame(&self.frame_limits) {
                    Ok(Some(frame)) => {
                        if self.handle(frame).await == Flow::Close {
                            return End::Closed;
                        }
                    }
                    Ok(None) => break,
                    Err(e) => {
                        if self.frame_error(e).await == Flow::Close {
                            return End::Closed;
                        }
                    }
                }
            }
            enum Ev {
                Read(std::io::Result<usize>),
                Tick,
                Killed,
                Shutdown,
                WriterGone,
            }
            // After a long write the next read goes to a buffer made on a
            // guess (iscsi_proto::recv): made only once the socket is
            // readable, and let go if the read finds nothing, so that a
            // connection waiting for its next PDU does not hold it. Other
            // reads go straight to the socket (waiting for readiness first
            // cost 4K reads at 32 in flight about a third of their IOPS).
            let guessing = recv.guesses_next();
            let limits = self.frame_limits;
            let room = if guessing { 0 } else { recv.room(&limits) };
            let read = async {
                if !guessing {
                    return rd.read_buf(&mut recv.target().limit(room)).await;
                }
                rd.readable().await?;
                let room = recv.room(&limits);
                let r = rd.try_read_buf(&mut recv.target().limit(room));
                if r.as_ref()
                    .is_err_and(|e| e.kind() == std::io::ErrorKind::WouldBlock)
                {
                    recv.idle();
                }
                r
            };
            let ev = tokio::select! {
                r = read => Ev::Read(r),
                _ = tick.tick(), if ticking => Ev::Tick,
                _ = kill.wait_for(|k| *k) => Ev::Killed,
                _ = shutdown.wait_for(|s| *s) => Ev::Shutdown,
                _ = self.out.tx.closed() => Ev::WriterGone,
            };
            match ev {
                Ev::Read(Ok(0)) => return End::Eof,
                Ev::Read(Ok(_)) => last_rx = Instant::now(),
                Ev::Read(Err(e)) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Ev::Read(Err(e)) => {
                    tracing::warn!(peer = %self.peer, error = %e, "read failed");
                    return End::Io;
                }
                Ev::Tick => {
                    if let Some(end) = self.nop_tick(last_rx).await {
                        return end;
                    }
                }
                Ev::Killed => return End::Killed,
                Ev::Shutdown => return End::Shutdown,
                Ev::WriterGone => return End::WriterGone,
            }
        }
    }

    async fn nop_tick(&mut self, last_rx: Instant) -> Option<End> {
        let now = Instant::now();
        // A write whose Data-Out does not come holds its share of the node's
        // budget (taken for all its bytes when it arrived): an initiator that
        // answers pings but sends no data would keep it for good.
        let timeout_ms = self.ctx.limits.nop_in_timeout_ms;
        if timeout_ms > 0 {
            let limit = Duration::from_millis(timeout_ms);
            if let Some((itt, w)) = self
                .writes
                .iter()
                .find(|(_, w)| w.waiting_for(now) >= limit)
            {
                tracing::warn!(peer = %self.peer, itt, lun = iscsi_proto::lun_from_wire(w.info.lun_raw),
                    expected_bytes = w.info.edtl_bytes, timeout_ms,
                    "no Data-Out for a pending write within the time limit; dropping connection");
                return Some(End::DataOutTimeout);
            }
        }
        let interval_ms = self.ctx.limits.nop_in_interval_ms;
        match self.ping {
            // (a timeout of 0 waits for the answer for ever, as documented;
            // it dropped the connection at the next tick)
            Some((_, sent))
                if timeout_ms > 0
                    && now.duration_since(sent) >= Duration::from_millis(timeout_ms)
                    && now.duration_since(last_rx) >= now.duration_since(sent) =>
            {
                tracing::warn!(peer = %self.peer, "no answer to NOP-In ping; dropping connection");
                return Some(End::NopTimeout);
            }
            None if interval_ms > 0
                && now.duration_since(last_rx) >= Duration::from_millis(interval_ms) =>
            {
                let ttt = self.tag();
                self.ping = Some((ttt, now));
                let pdu = TargetPdu::NopIn(NopIn {
                    lun: 0,
                    itt: RESERVED_TAG,
                    ttt,
                });
                self.send(pdu, Bytes::new()).await;
            }
            _ => {}
        }
        None
    }

    /// A fresh target transfer tag (never the reserved value).
    pub(crate) fn tag(&mut self) -> u32 {
        self.next_tag = self.next_tag.wrapping_add(1);
        if self.next_tag == RESERVED_TAG {
            self.next_tag = 1;
        }
        self.next_tag
    }

    pub(crate) async fn send(&self, pdu: TargetPdu, data: Bytes) {
        let _ = self.out.tx.send(OutPdu::new(pdu, data)).await;
    }

    pub(crate) async fn reject(&self, reason: u8, header: &[u8]) {
        let pdu = TargetPdu::Reject(Reject { reason, data_sn: 0 });
        self.send(
            pdu,
            Bytes::copy_from_slice(&header[..header.len().min(BHS_LEN)]),
        )
        .await;
    }

    /// Window check for a non-immediate PDU; false means drop it silently.
    fn in_window(&self, immediate: bool, cmd_sn: u32, holds_slot: bool) -> bool {
        if immediate || self.session.window.accept(cmd_sn, holds_slot) {
            return true;
        }
        let (exp, max) = self.session.window.get();
        pdu_log!(self, warn, peer = %self.peer, cmd_sn, exp, max, "CmdSN outside the window; PDU dropped");
        false
    }

    async fn frame_error(&mut self, e: FrameError) -> Flow {
        pdu_log!(self, warn, peer = %self.peer, error = %e.error, consumed = e.consumed, "bad PDU");
        let hdr = e.raw_header.unwrap_or([0; BHS_LEN]);
        match e.error {
            ProtoError::HeaderDigest => Flow::Close,
            ProtoError::DataDigest => {
                self.reject(reject_reason::DATA_DIGEST, &hdr).await;
                // ERL 0 cannot recover the lost data of a command.
                let op = hdr[0] & 0x3f;
                if op == opcode::DATA_OUT || op == opcode::SCSI_COMMAND {
                    Flow::Close
                } else {
                    self.consume_rejected_cmd_sn(&hdr);
                    Flow::Continue
                }
            }
            ProtoError::UnknownOpcode(_) => {
                self.reject(reject_reason::PROTOCOL_ERROR, &hdr).await;
                Flow::Continue
            }
            ProtoError::DataSegmentTooLong { .. } => {
                self.reject(reject_reason::PROTOCOL_ERROR, &hdr).await;
                Flow::Close
            }
            _ if e.consumed => {
                self.reject(reject_reason::INVALID_FIELD, &hdr).await;
                self.consume_rejected_cmd_sn(&hdr);
                Flow::Continue
            }
            _ => Flow::Close,
        }
    }

    /// A non-immediate PDU that carries a CmdSN, rejected before it could be
    /// decoded, still takes its CmdSN when it is the next one expected: left
    /// unused, the window would wait for it for good and silently drop every
    /// later command of the session (the initiator's commands would time out
    /// one after another).
    pub(crate) fn consume_rejected_cmd_sn(&self, hdr: &[u8; BHS_LEN]) {
        let op = hdr[0] & 0x3f;
        let carries_cmd_sn = matches!(
            op,
            opcode::NOP_OUT
                | opcode::SCSI_COMMAND
                | opcode::TASK_MGMT_REQUEST
                | opcode::TEXT_REQUEST
                | opcode::LOGOUT_REQUEST
        );
        if !carries_cmd_sn || hdr[0] & 0x40 != 0 {
            return;
        }
        let cmd_sn = u32::from_be_bytes([hdr[24], hdr[25], hdr[26], hdr[27]]);
        if self.session.window.accept(cmd_sn, false) {
            pdu_log!(self, info, peer = %self.peer, cmd_sn, "the rejected PDU's CmdSN is taken");
        }
    }

    async fn handle(&mut self, f: Frame) -> Flow {
        let imm = f.bhs.immediate;
        match f.bhs.pdu {
            InitiatorPdu::ScsiCommand(c) => self.on_command(&f, c, imm).await,
            InitiatorPdu::DataOut(d) => self.on_data_out(&f, d).await,
            InitiatorPdu::NopOut(n) => self.on_nop(&f, n, imm).await,
            InitiatorPdu::TaskMgmt(t) => crate::tmf::on_tmf(self, &f, t, imm).await,
            InitiatorPdu::Text(t) => self.on_text(&f, t, imm).await,
            InitiatorPdu::Logout(l) => self.on_logout(l, imm).await,
            InitiatorPdu::Snack(_) => {
                pdu_log!(self, warn, peer = %self.peer, "SNACK at ErrorRecoveryLevel 0");
                self.reject(reject_reason::PROTOCOL_ERROR, &f.raw_header)
                    .await;
                Flow::Continue
            }
            InitiatorPdu::Login(_) => {
                pdu_log!(self, warn, peer = %self.peer, "Login PDU in full feature phase");
                self.reject(reject_reason::PROTOCOL_ERROR, &f.raw_header)
                    .await;
                Flow::Close
            }
        }
    }

    /// Rejects the command PDU `raw_header` (never executed) with `reason`,
    /// giving back the CmdSN window slot it held.
    async fn reject_command(&mut self, info: &CmdInfo, reason: u8, raw_header: &[u8]) {
        if info.holds_slot {
            self.session.window.release();
        }
        self.reject(reason, raw_header).await;
    }

    async fn respond_now(&self, info: &CmdInfo, resp: scsi::Response) {
        let window = self.session.window.clone();
        let holds = info.holds_slot;
        send_response(&self.out, info, resp, BufferPermit::empty(), move || {
            if holds {
                window.release()
            }
        })
        .await;
    }

    async fn on_command(&mut self, f: &Frame, c: ScsiCommand, imm: bool) -> Flow {
        if self.discovery {
            pdu_log!(self, warn, peer = %self.peer, "SCSI command in a discovery session");
            self.reject(reject_reason::PROTOCOL_ERROR, &f.raw_header)
                .await;
            // (its CmdSN taken: the session's next requests stay in the
            // window; review of 2026-12-06)
            self.consume_rejected_cmd_sn(&f.raw_header);
            return Flow::Continue;
        }
        if !self.in_window(imm, c.cmd_sn, true) {
            return Flow::Continue;
        }
        // a reset or PREEMPT AND ABORT of another session from here on
        // aborts this command if it is a write, however long it then waits
        // for its data or for the node's buffer budget (review of 2026-12-06:
        // taken after the budget wait, a write that waited through a reset
        // ran after the reset was answered)
        let abort_gen = self.session.write_abort_gen();
        // copied: a view would hold the whole read buffer for as long as the
        // command lives (a write waiting for its Data-Out), each such buffer
        // then replaced by a new one, none of it charged to the node's budget
        // (review of 2026-12-06)
        let cdb = match &f.ahs.extended_cdb {
            None => Bytes::copy_from_slice(&f.header_bytes[32..48]),
            Some(ext) => {
                let mut v = BytesMut::with_capacity(16 + ext.len());
                v.extend_from_slice(&f.header_bytes[32..48]);
                v.extend_from_slice(ext);
                v.freeze()
            }
        };
        let info = CmdInfo {
            itt: c.itt,
            lun_raw: c.lun,
            edtl_bytes: c.edtl_bytes,
            read: c.read,
            write: c.write,
            attr: c.attr,
            cdb,
            bidi_read_len_bytes: f.ahs.bidi_read_len_bytes,
            holds_slot: !imm,
            r2ts_sent: 0,
        };
        // a tag in use first: a TASK SET FULL answered under that tag would
        // complete the live task for the initiator (review of 2026-12-06)
        if self.writes.contains_key(&c.itt) || self.session.running.lock().contains_key(&c.itt) {
            pdu_log!(self, warn, peer = %self.peer, itt = c.itt, "initiator task tag already in use");
            self.reject_command(&info, reject_reason::TASK_IN_PROGRESS, &f.raw_header)
                .await;
            return Flow::Continue;
        }
        let window = self.ctx.limits.commands_in_flight_per_session_max as usize;
        let tasks = self.session.running.lock().len() + self.writes.len();
        if tasks >= window + IMMEDIATE_EXTRA_TASKS {
            pdu_log!(self, warn, peer = %self.peer, tasks, "task set full");
            self.respond_now(&info, task_set_full()).await;
            return Flow::Continue;
        }
        let bad_data = (!c.write && !f.data.is_empty())
            || (!self.neg.immediate_data && !f.data.is_empty())
            || f.data.len() as u64 > c.edtl_bytes as u64;
        if bad_data {
            pdu_log!(self, warn, peer = %self.peer, itt = c.itt, "unexpected immediate data");
            self.reject_command(&info, reject_reason::PROTOCOL_ERROR, &f.raw_header)
                .await;
            return Flow::Continue;
        }
        // what the command may send back: its Data-In, within the largest
        // transfer (a larger one cannot be made of the LU's data; asked of the
        // node budget whole, a read of 4 GiB would wait for all of it, and
        // every other command behind it)
        let bidi_read = u64::from(info.bidi_read_len_bytes.unwrap_or(0));
        let max_transfer = u64::from(self.ctx.limits.max_transfer_bytes);
        if !c.write || c.edtl_bytes == 0 {
            let read_bytes = if c.read { c.edtl_bytes as u64 } else { 0 } + bidi_read;
            let Some(permit) = self
                .budget_or_answer(&info, read_bytes.min(max_transfer))
                .await
            else {
                return self.after_budget_refused(&info);
            };
            spawn_command(&self.session, &self.out, info, Bytes::new(), permit, None);
            return Flow::Continue;
        }
        if c.edtl_bytes > self.ctx.limits.max_transfer_bytes {
            pdu_log!(self, warn, peer = %self.peer, edtl = c.edtl_bytes, "transfer above max_transfer_bytes");
            // ILLEGAL REQUEST / INVALID FIELD IN CDB; stray Data-Out for it is dropped.
            self.respond_now(&info, check_condition(0x05, 0x24, 0x00))
                .await;
            return Flow::Continue;
        }
        // the Data-Out buffer, plus the Data-In of a bidirectional command
        let data_bytes = c.edtl_bytes as u64 + bidi_read.min(max_transfer);
        if f.data.len() == c.edtl_bytes as usize {
            let Some(permit) = self.budget_or_answer(&info, data_bytes).await else {
                return self.after_budget_refused(&info);
            };
            // small immediate data is copied out of the read buffer, for the
            // same reason as the CDB; larger data has a buffer of its own
            // (iscsi_proto::recv)
            let data = if f.data.len() <= OWN_BYTES_MIN {
                Bytes::copy_from_slice(&f.data)
            } else {
                f.data.clone()
            };
            spawn_command(
                &self.session,
                &self.out,
                info,
                data,
                permit,
                Some(abort_gen),
            );
            return Flow::Continue;
        }
        let edtl = c.edtl_bytes as usize;
        if self.buffered_bytes + edtl > self.ctx.limits.data_out_buffered_bytes_max_per_session {
            pdu_log!(self, warn, peer = %self.peer, "Data-Out buffer budget exhausted; TASK SET FULL");
            self.respond_now(&info, task_set_full()).await;
            return Flow::Continue;
        }
        let Some(permit) = self.budget_or_answer(&info, data_bytes).await else {
            return self.after_budget_refused(&info);
        };
        let mut task = match WriteTask::new(info.clone(), &f.data, !c.final_bit, &self.burst) {
            Ok(mut t) => {
                t.abort_gen = abort_gen;
                t.with_permit(permit)
            }
            Err(e) => {
                pdu_log!(self, warn, peer = %self.peer, itt = c.itt, error = %e, "bad write command");
                self.reject_command(&info, reject_reason::PROTOCOL_ERROR, &f.raw_header)
                    .await;
                return Flow::Close;
            }
        };
        self.buffered_bytes += task.buffered_bytes();
        let mut tag = self.next_tag;
        let r2ts = task.issue_r2ts(&self.burst, || {
            tag = tag.wrapping_add(1);
            if tag == RESERVED_TAG {
                tag = 1;
            }
            tag
        });
        self.next_tag = tag;
        self.writes.insert(c.itt, task);
        for r in r2ts {
            self.send(TargetPdu::R2t(r), Bytes::new()).await;
        }
        Flow::Continue
    }

    /// The buffer budget for `bytes` of a command, from the session's share of
    /// the node's, then the node's (see the module notes): waits
    /// for it, reading nothing meanwhile, unless this connection is collecting
    /// Data-Out for earlier writes (then busy at once). `None` when the command
    /// was answered TASK SET FULL or the connection is ending
    /// ([`Conn::after_budget_refused`] tells which).
    async fn budget_or_answer(&mut self, info: &CmdInfo, bytes: u64) -> Option<BufferPermit> {
        match self.budget_for(bytes).await {
            Budget::Held(p) => Some(p),
            Budget::Busy => {
                tracing::debug!(peer = %self.peer, itt = info.itt, "buffer budget exhausted (session share or node); TASK SET FULL");
                self.respond_now(info, task_set_full()).await;
                None
            }
            Budget::Stop => {
                self.stopping = true;
                None
            }
        }
    }

    /// What the reader does after [`Conn::budget_or_answer`] gave no permit.
    fn after_budget_refused(&mut self, info: &CmdInfo) -> Flow {
        if !self.stopping {
            return Flow::Continue;
        }
        if info.holds_slot {
            self.session.window.release();
        }
        Flow::Close
    }

    async fn budget_for(&self, bytes: u64) -> Budget {
        // the session's share of the node's budget, then the node's
        let budget = &self.session.buffers;
        if let Some(p) = budget.try_acquire(bytes) {
            return Budget::Held(p);
        }
        if !self.writes.is_empty() {
            budget.count_refusal();
            return Budget::Busy;
        }
        let mut kill = self.session.kill.subscribe();
        let mut shutdown = self.ctx.shutdown.clone();
        // an ending connection stops rather than taking bytes it cannot use
        tokio::select! {
            biased;
            _ = kill.wait_for(|k| *k) => Budget::Stop,
            _ = shutdown.wait_for(|s| *s) => Budget::Stop,
            _ = self.out.tx.closed() => Budget::Stop,
            p = budget.acquire(bytes) => Budget::Held(p),
        }
    }

    async fn on_data_out(&mut self, f: &Frame, d: DataOut) -> Flow {
        let Some(task) = self.writes.get_mut(&d.itt) else {
            pdu_log!(self, warn, peer = %self.peer, itt = d.itt, "Data-Out for no pending write; dropped");
            return Flow::Continue;
        };
        let accepted = task.accept(&d, &f.data);
        if accepted.is_ok() {
            task.progressed(f.data.len() as u32);
        }
        match accepted {
            Err(e) => {
                // ERL 0 allows dropping the session, but failing only this command keeps
                // the initiator's other I/O (and its negotiated parameters) alive: the
                // PDU is rejected, the command ends with ABORTED COMMAND / DATA PHASE
                // ERROR and nothing of it is written; later Data-Out for it is dropped.
                pdu_log!(self, warn, peer = %self.peer, itt = d.itt, error = %e, "bad Data-Out; command failed");
                self.reject(reject_reason::PROTOCOL_ERROR, &f.raw_header)
                    .await;
                if let Some(t) = self.writes.remove(&d.itt) {
                    self.buffered_bytes -= t.buffered_bytes();
                    let info = t.info.clone();
                    self.respond_now(&info, check_condition(0x0b, 0x4b, 0x00))
                        .await;
                }
                Flow::Continue
            }
            Ok(seq_done) => {
                if task.complete() {
                    if let Some(t) = self.writes.remove(&d.itt) {
                        self.buffered_bytes -= t.buffered_bytes();
                        let info = t.info.clone();
                        let lun = iscsi_proto::lun_from_wire(info.lun_raw);
                        if self.session.write_aborted(lun, t.abort_gen) {
                            // a reset or PREEMPT AND ABORT from another session
                            // aborted it while its data came: never executed,
                            // never answered
                            pdu_log!(self, info, peer = %self.peer, itt = info.itt, lun,
                                "write aborted while collecting Data-Out; dropped");
                            if info.holds_slot {
                                self.session.window.release();
                            }
                            return Flow::Continue;
                        }
                        let since = Some(t.abort_gen);
                        let (data, permit) = t.into_data();
                        spawn_command(&self.session, &self.out, info, data, permit, since);
                    }
                } else if seq_done {
                    let mut tag = self.next_tag;
                    let r2ts = task.issue_r2ts(&self.burst, || {
                        tag = tag.wrapping_add(1);
                        if tag == RESERVED_TAG {
                            tag = 1;
                        }
                        tag
                    });
                    self.next_tag = tag;
                    for r in r2ts {
                        self.send(TargetPdu::R2t(r), Bytes::new()).await;
                    }
                }
                Flow::Continue
            }
        }
    }

    async fn on_nop(&mut self, f: &Frame, n: NopOut, imm: bool) -> Flow {
        if n.itt == RESERVED_TAG {
            // The answer to our ping (or a pointless NOP); never answered.
            if self.ping.is_some_and(|(ttt, _)| ttt == n.ttt) {
                self.ping = None;
            }
            return Flow::Continue;
        }
        if !self.in_window(imm, n.cmd_sn, false) {
            return Flow::Continue;
        }
        let max = self.out.send_segment_bytes_max as usize;
        // copied: a view would keep the whole read buffer while the echo
        // waits for the client to read (iscsi_proto::recv)
        let data = Bytes::copy_from_slice(&f.data[..f.data.len().min(max)]);
        let pdu = TargetPdu::NopIn(NopIn {
            lun: n.lun,
            itt: n.itt,
            ttt: RESERVED_TAG,
        });
        self.send_bounded(pdu, data).await
    }

    /// Queues the answer to a request the CmdSN window may not bound (an
    /// immediate NOP-Out or Text request), its bytes held against the
    /// connection's bound on such answers ([`ECHO_BYTES_MAX`]): waits, reading
    /// nothing, while earlier ones are still queued (they go out as the client
    /// reads, whatever this reader does).
    async fn send_bounded(&mut self, pdu: TargetPdu, data: Bytes) -> Flow {
        let mut kill = self.session.kill.subscribe();
        let mut shutdown = self.ctx.shutdown.clone();
        let permit = tokio::select! {
            biased;
            _ = kill.wait_for(|k| *k) => return Flow::Close,
            _ = shutdown.wait_for(|s| *s) => return Flow::Close,
            _ = self.out.tx.closed() => return Flow::Close,
            p = self.echoes.acquire(data.len() as u64) => p,
        };
        let _ = self.out.tx.send(OutPdu::holding(pdu, data, permit)).await;
        Flow::Continue
    }

    async fn on_text(&mut self, f: &Frame, t: TextRequest, imm: bool) -> Flow {
        if !self.in_window(imm, t.cmd_sn, false) {
            return Flow::Continue;
        }
        if t.ttt != RESERVED_TAG {
            match self.text_pending.take() {
                Some(p) if p.ttt == t.ttt && p.itt == t.itt => {
                    return self.send_text_chunk(t.itt, t.lun, p.rest).await;
                }
                _ => {
                    pdu_log!(self, warn, peer = %self.peer, ttt = t.ttt, "Text continuation with an unknown TTT");
                    self.reject(reject_reason::INVALID_FIELD, &f.raw_header)
                        .await;
                }
            }
            return Flow::Continue;
        }
        self.text_pending = None;
        let text = match self.text.push(&f.data, t.cont) {
            Err(e) => {
                pdu_log!(self, warn, peer = %self.peer, error = %e, "text request too large");
                self.reject(reject_reason::PROTOCOL_ERROR, &f.raw_header)
                    .await;
                return Flow::Continue;
            }
            Ok(None) => {
                let pdu = TargetPdu::TextResponse(TextResponse {
                    final_bit: false,
                    cont: false,
                    lun: t.lun,
                    itt: t.itt,
                    ttt: RESERVED_TAG,
                });
                self.send(pdu, Bytes::new()).await;
                return Flow::Continue;
            }
            Ok(Some(text)) => text,
        };
        let pairs = match parse_text(&text) {
            Ok(p) => p,
            Err(e) => {
                pdu_log!(self, warn, peer = %self.peer, error = %e, "bad text request");
                self.reject(reject_reason::PROTOCOL_ERROR, &f.raw_header)
                    .await;
                return Flow::Continue;
            }
        };
        let mut answer = Vec::new();
        let mut listed = false;
        for (k, v) in &pairs {
            if k == "SendTargets" {
                // once a request: a key is not sent twice (RFC 7143 6.1), and
                // each repeat made the answer a whole list longer (128 keys
                // a request, the answers of immediate requests queued unread)
                if std::mem::replace(&mut listed, true) {
                    continue;
                }
                answer.extend_from_slice(&crate::discovery::send_targets(
                    &self.ctx,
                    v,
                    &self.neg.initiator_name,
                    self.session.target,
                    self.local,
                ));
            } else {
                push_pair(&mut answer, k, "NotUnderstood");
            }
        }
        self.send_text_chunk(t.itt, t.lun, Bytes::from(answer))
            .await
    }

    async fn send_text_chunk(&mut self, itt: u32, lun: u64, all: Bytes) -> Flow {
        let max = self.out.send_segment_bytes_max.max(512) as usize;
        let (now, rest) = if all.len() > max {
            // (copied: a slice queued would keep the whole answer alive)
            (Bytes::copy_from_slice(&all[..max]), Some(all.slice(max..)))
        } else {
            (all, None)
        };
        let ttt = match rest {
            Some(rest) => {
                let ttt = self.tag();
                self.text_pending = Some(PendingText { itt, ttt, rest });
                ttt
            }
            None => RESERVED_TAG,
        };
        let pdu = TargetPdu::TextResponse(TextResponse {
            final_bit: ttt == RESERVED_TAG,
            cont: ttt != RESERVED_TAG,
            lun,
            itt,
            ttt,
        });
        self.send_bounded(pdu, now).await
    }

    async fn on_logout(&mut self, l: LogoutRequest, imm: bool) -> Flow {
        if !self.in_window(imm, l.cmd_sn, false) {
            return Flow::Continue;
        }
        let response = match l.reason {
            0 => 0,
            1 if l.cid == self.neg.cid => 0,
            1 => 1,
            _ => 2,
        };
        if response == 0 {
            for (_, w) in self.writes.drain() {
                if w.info.holds_slot {
                    self.session.window.release();
                }
            }
            self.buffered_bytes = 0;
            let drain = Duration::from_millis(self.ctx.limits.drain_timeout_ms);
            self.session.drain(drain).await;
            let itts = self.session.abort_where(|_| true);
            self.session.wait_all_gone(&itts, drain, "a logout").await;
        }
        let pdu = TargetPdu::LogoutResponse(LogoutResponse {
            response,
            itt: l.itt,
            time2wait_s: self.neg.default_time2wait_s.min(u16::MAX as u32) as u16,
            time2retain_s: self.neg.default_time2retain_s.min(u16::MAX as u32) as u16,
        });
        self.send(pdu, Bytes::new()).await;
        if response == 0 {
            tracing::info!(peer = %self.peer, tsih = self.session.tsih, "logout");
            Flow::Close
        } else {
            Flow::Continue
        }
    }
}
