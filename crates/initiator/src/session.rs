//! One TCP connection = one session (ERL 0): login over the socket, then a reader
//! task and a writer task around the pure [`Core`].

use crate::core::{Core, CoreParams, RxEffects, ScsiResult, SubmitError};
use crate::frame::{
    decode_target_frame, peek_frame, put_data_trailer, put_header, put_pdu, OutPdu, TargetFrame,
    EXP_STAT_SN_OFFSET,
};
use crate::login::{LoginOptions, LoginParams, LoginStateMachine, LoginStep};
use crate::InitiatorError;
use bytes::{Buf, Bytes, BytesMut};
use iscsi_proto::frame::FrameLimits;
use iscsi_proto::pdu::BHS_LEN;
use iscsi_proto::target::TargetPdu;
use parking_lot::Mutex;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio::sync::Notify;
use tokio::task::JoinHandle;

/// Data segments at most this long are copied into the writer's batch buffer;
/// longer ones are written from their own buffer.
const INLINE_DATA_BYTES_MAX: usize = 16 * 1024;
/// The writer flushes its batch buffer when it grows past this.
const WRITE_BATCH_BYTES_MAX: usize = 256 * 1024;
/// Initial receive buffer.
const READ_BUFFER_BYTES: usize = 512 * 1024;

/// A socket used step by step before the reader and writer tasks exist
/// (login, discovery).
pub(crate) struct RawConn {
    pub sock: TcpStream,
    buf: BytesMut,
    pub limits: FrameLimits,
}

impl RawConn {
    pub async fn connect(addr: SocketAddr) -> Result<RawConn, InitiatorError> {
        let sock = TcpStream::connect(addr).await?;
        sock.set_nodelay(true)?;
        Ok(RawConn {
            sock,
            buf: BytesMut::with_capacity(64 * 1024),
            limits: FrameLimits {
                header_digest: false,
                data_digest: false,
                max_data_segment_bytes: 64 * 1024,
                max_ahs_bytes: 1020,
            },
        })
    }

    pub async fn send(
        &mut self,
        header: &[u8; BHS_LEN],
        data: &[u8],
    ) -> Result<(), InitiatorError> {
        let mut out = BytesMut::with_capacity(BHS_LEN + data.len() + 12);
        let pdu = OutPdu {
            header: *header,
            ahs: Vec::new(),
            data: Bytes::copy_from_slice(data),
        };
        put_pdu(
            &mut out,
            &pdu,
            self.limits.header_digest,
            self.limits.data_digest,
        );
        self.sock.write_all(&out).await?;
        Ok(())
    }

    pub async fn recv(&mut self) -> Result<TargetFrame, InitiatorError> {
        loop {
            if let Some(f) = decode_target_frame(&mut self.buf, &self.limits)? {
                return Ok(f);
            }
            if self.sock.read_buf(&mut self.buf).await? == 0 {
                return Err(InitiatorError::ConnectionLost(
                    "target closed the connection".into(),
                ));
            }
        }
    }

    /// Runs a whole login on this connection.
    pub async fn login(
        &mut self,
        opts: &LoginOptions,
        discovery: bool,
    ) -> Result<LoginParams, InitiatorError> {
        let mut sm = LoginStateMachine::new(opts, discovery);
        let mut step = sm.start();
        loop {
            match step {
                LoginStep::Done(p) => {
                    self.limits.header_digest = p.header_digest;
                    self.limits.data_digest = p.data_digest;
                    self.limits.max_data_segment_bytes = p.recv_data_segment_bytes_max;
                    return Ok(p);
                }
                LoginStep::Send { header, data } => {
                    self.send(&header, &data).await?;
                    let f = self.recv().await?;
                    let TargetPdu::LoginResponse(r) = f.pdu else {
                        return Err(InitiatorError::Protocol(format!(
                            "expected a Login Response, got {:?}",
                            f.pdu
                        )));
                    };
                    step = sm.on_response(&r, &f.seq, &f.data)?;
                }
            }
        }
    }
}

struct Inner {
    core: Mutex<Core>,
    /// Woken when MaxCmdSN moves or the session closes.
    window: Notify,
    /// Woken when PDUs were queued or the session closes.
    outbox: Notify,
    closed: AtomicBool,
    addr: SocketAddr,
    params: LoginParams,
    command_timeout: Duration,
    tasks: Mutex<Vec<JoinHandle<()>>>,
}

impl Inner {
    fn close(&self, err: InitiatorError) {
        if self.closed.swap(true, Ordering::AcqRel) {
            return;
        }
        tracing::debug!(addr = %self.addr, error = %err, "session closed");
        self.core.lock().fail_all(err);
        self.window.notify_waiters();
        self.outbox.notify_one();
        for t in self.tasks.lock().iter() {
            t.abort();
        }
    }
}

/// Closes the session when the last [`Session`] handle goes away.
struct Guard {
    inner: Arc<Inner>,
}

impl Drop for Guard {
    fn drop(&mut self) {
        self.inner
            .close(InitiatorError::ConnectionLost("session dropped".into()));
    }
}

/// A logged-in session in full feature phase. Cloning shares the session; dropping
/// the last clone closes the connection.
#[derive(Clone)]
pub struct Session {
    inner: Arc<Inner>,
    _guard: Arc<Guard>,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("addr", &self.inner.addr)
            .field("tsih", &self.inner.params.tsih)
            .field("closed", &self.is_closed())
            .finish()
    }
}

impl Session {
    /// Connects to `addr`, logs in to a normal session and starts the reader and
    /// writer tasks.
    pub async fn login(addr: SocketAddr, opts: &LoginOptions) -> Result<Session, InitiatorError> {
        let t = Duration::from_millis(opts.login_timeout_ms.max(1));
        let (conn, params) = tokio::time::timeout(t, async {
            let mut conn = RawConn::connect(addr).await?;
            let p = conn.login(opts, false).await?;
            Ok::<_, InitiatorError>((conn, p))
        })
        .await
        .map_err(|_| InitiatorError::Timeout(opts.login_timeout_ms))??;
        Ok(Session::start(addr, conn, params, opts.command_timeout_ms))
    }

    fn start(
        addr: SocketAddr,
        conn: RawConn,
        params: LoginParams,
        command_timeout_ms: u64,
    ) -> Session {
        let core = Core::new(
            CoreParams::from(&params),
            params.cmd_sn,
            params.exp_cmd_sn,
            params.max_cmd_sn,
            params.exp_stat_sn,
        );
        let inner = Arc::new(Inner {
            core: Mutex::new(core),
            window: Notify::new(),
            outbox: Notify::new(),
            closed: AtomicBool::new(false),
            addr,
            params: params.clone(),
            command_timeout: Duration::from_millis(command_timeout_ms.max(1)),
            tasks: Mutex::new(Vec::new()),
        });
        let RawConn { sock, buf, limits } = conn;
        let (rd, wr) = sock.into_split();
        let reader = tokio::spawn(reader_task(Arc::downgrade(&inner), rd, buf, limits));
        let writer = tokio::spawn(writer_task(inner.clone(), wr));
        inner.tasks.lock().extend([reader, writer]);
        Session {
            _guard: Arc::new(Guard {
                inner: inner.clone(),
            }),
            inner,
        }
    }

    /// The portal this session is connected to.
    pub fn addr(&self) -> SocketAddr {
        self.inner.addr
    }

    /// What login negotiated.
    pub fn params(&self) -> &LoginParams {
        &self.inner.params
    }

    /// Whether the session is closed (connection lost, logged out, timed out).
    pub fn is_closed(&self) -> bool {
        self.inner.closed.load(Ordering::Acquire)
    }

    /// Why the session closed, if it did.
    pub fn close_reason(&self) -> Option<InitiatorError> {
        self.inner.core.lock().closed().cloned()
    }

    /// Commands in flight now.
    pub fn tasks_in_flight(&self) -> usize {
        self.inner.core.lock().tasks_in_flight()
    }

    /// Closes the connection at once; every command in flight fails.
    pub fn close(&self, reason: &str) {
        self.inner
            .close(InitiatorError::ConnectionLost(reason.to_string()));
    }

    /// Runs one SCSI command: `data_out` to write (empty for none) or
    /// `data_in_len_bytes` to read. Waits while the CmdSN window is closed. A command
    /// without answer within the command timeout closes the session.
    pub async fn command(
        &self,
        lun: u64,
        cdb: &[u8],
        data_out: Bytes,
        data_in_len_bytes: u32,
    ) -> Result<ScsiResult, InitiatorError> {
        let inner = &self.inner;
        let deadline = tokio::time::Instant::now() + inner.command_timeout;
        let (itt, rx) = loop {
            let notified = inner.window.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let res = inner
                .core
                .lock()
                .submit(lun, cdb, data_out.clone(), data_in_len_bytes);
            match res {
                Ok(x) => break x,
                Err(SubmitError::Failed(e)) => return Err(e),
                Err(SubmitError::WindowClosed) => {
                    if tokio::time::timeout_at(deadline, notified).await.is_err() {
                        let e = InitiatorError::Timeout(inner.command_timeout.as_millis() as u64);
                        inner.close(e.clone());
                        return Err(e);
                    }
                }
            }
        };
        inner.outbox.notify_one();
        match tokio::time::timeout_at(deadline, rx).await {
            Ok(Ok(res)) => res,
            Ok(Err(_)) => Err(self
                .close_reason()
                .unwrap_or_else(|| InitiatorError::ConnectionLost("task dropped".into()))),
            Err(_) => {
                let e = InitiatorError::Timeout(inner.command_timeout.as_millis() as u64);
                inner.core.lock().forget(itt);
                tracing::warn!(addr = %inner.addr, itt, "command timed out; closing the session");
                inner.close(e.clone());
                Err(e)
            }
        }
    }

    /// Logs out (close the session) and closes the connection.
    pub async fn logout(&self) -> Result<(), InitiatorError> {
        logout(&self.inner).await
    }
}

async fn logout(inner: &Arc<Inner>) -> Result<(), InitiatorError> {
    let rx = inner.core.lock().submit_logout();
    let res = match rx {
        Ok(rx) => {
            inner.outbox.notify_one();
            match tokio::time::timeout(inner.command_timeout, rx).await {
                Ok(Ok(Ok(_))) => Ok(()),
                Ok(Ok(Err(e))) => Err(e),
                Ok(Err(_)) => Err(InitiatorError::ConnectionLost("logout dropped".into())),
                Err(_) => Err(InitiatorError::Timeout(
                    inner.command_timeout.as_millis() as u64
                )),
            }
        }
        Err(e) => Err(e),
    };
    inner.close(InitiatorError::ConnectionLost("logged out".into()));
    res
}

impl Drop for Inner {
    fn drop(&mut self) {
        for t in self.tasks.get_mut().iter() {
            t.abort();
        }
    }
}

async fn reader_task(
    weak: std::sync::Weak<Inner>,
    mut rd: OwnedReadHalf,
    mut buf: BytesMut,
    limits: FrameLimits,
) {
    buf.reserve(READ_BUFFER_BYTES);
    let err = loop {
        let want = match peek_frame(&buf, &limits) {
            Ok(Err(Some(total))) => total,
            _ => 0,
        };
        if buf.capacity() - buf.len() < (want.saturating_sub(buf.len())).max(64 * 1024) {
            buf.reserve(want.max(READ_BUFFER_BYTES));
        }
        match rd.read_buf(&mut buf).await {
            Ok(0) => break InitiatorError::ConnectionLost("target closed the connection".into()),
            Ok(_) => {}
            Err(e) => break InitiatorError::ConnectionLost(e.to_string()),
        }
        let Some(inner) = weak.upgrade() else { return };
        let mut fx = RxEffects::default();
        let res = dispatch(&inner.core, &mut buf, &limits, &mut fx);
        if fx.window_opened {
            inner.window.notify_waiters();
        }
        if fx.outbox_pushed {
            inner.outbox.notify_one();
        }
        if fx.logout_requested {
            let s = inner.clone();
            tokio::spawn(async move {
                tracing::info!(addr = %s.addr, "target requested logout");
                let _ = logout(&s).await;
            });
        }
        if let Err(e) = res {
            break e;
        }
        if fx.logged_out {
            break InitiatorError::ConnectionLost("logged out".into());
        }
    };
    if let Some(inner) = weak.upgrade() {
        inner.close(err);
    }
}

/// Feeds every complete PDU in `buf` to the core under one lock; consumes them.
pub(crate) fn dispatch(
    core: &Mutex<Core>,
    buf: &mut BytesMut,
    limits: &FrameLimits,
    fx: &mut RxEffects,
) -> Result<(), InitiatorError> {
    let mut core = core.lock();
    loop {
        let total = match peek_frame(buf, limits)? {
            Err(_) => return Ok(()),
            Ok((f, total)) => {
                core.on_pdu(&f, fx)?;
                total
            }
        };
        buf.advance(total);
    }
}

async fn writer_task(inner: Arc<Inner>, mut wr: OwnedWriteHalf) {
    let hd = inner.params.header_digest;
    let dd = inner.params.data_digest;
    let mut batch: Vec<OutPdu> = Vec::with_capacity(256);
    let mut out = BytesMut::with_capacity(WRITE_BATCH_BYTES_MAX + 64 * 1024);
    loop {
        inner.outbox.notified().await;
        loop {
            let exp_stat_sn = {
                let mut core = inner.core.lock();
                core.drain_outbox(&mut batch);
                core.exp_stat_sn()
            };
            if inner.closed.load(Ordering::Acquire) {
                let _ = wr.shutdown().await;
                return;
            }
            if batch.is_empty() {
                break;
            }
            if let Err(e) = write_batch(&mut wr, &mut out, &mut batch, exp_stat_sn, hd, dd).await {
                inner.close(InitiatorError::ConnectionLost(e.to_string()));
                return;
            }
        }
    }
}

async fn write_batch(
    wr: &mut OwnedWriteHalf,
    out: &mut BytesMut,
    batch: &mut Vec<OutPdu>,
    exp_stat_sn: u32,
    hd: bool,
    dd: bool,
) -> std::io::Result<()> {
    out.clear();
    for mut pdu in batch.drain(..) {
        pdu.header[EXP_STAT_SN_OFFSET..EXP_STAT_SN_OFFSET + 4]
            .copy_from_slice(&exp_stat_sn.to_be_bytes());
        if pdu.data.len() <= INLINE_DATA_BYTES_MAX {
            put_pdu(out, &pdu, hd, dd);
        } else {
            put_header(out, &pdu, hd);
            wr.write_all(out).await?;
            out.clear();
            wr.write_all(&pdu.data).await?;
            put_data_trailer(out, &pdu.data, dd);
        }
        if out.len() >= WRITE_BATCH_BYTES_MAX {
            wr.write_all(out).await?;
            out.clear();
        }
    }
    if !out.is_empty() {
        wr.write_all(out).await?;
        out.clear();
    }
    Ok(())
}
