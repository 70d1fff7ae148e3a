//! The login phase of a connection: frames in, Login Responses out, until full
//! feature phase or failure. Session registration (TSIH, reinstatement) happens here.

use crate::server::Ctx;
use crate::session::{initiator_port, Origin, RegisterError, Session, SessionKey};
use crate::writer::Window;
use block::admission::AdmissionSlot;
use bytes::BytesMut;
use iscsi_proto::digest::pad_len;
use iscsi_proto::frame::{decode_frame, reserve_for_next, Frame, FrameError, FrameLimits};
use iscsi_proto::login::{
    status, LoginNegotiator, LoginOutcome, LoginStep, Negotiated, SessionType,
};
use iscsi_proto::target::TargetPdu;
use iscsi_proto::InitiatorPdu;
use scsi::ItNexus;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// Why a connection stops.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ConnError {
    #[error("i/o: {0}")]
    Io(std::io::Error),
    #[error("peer closed the connection")]
    Eof,
    #[error("framing: {0:?}")]
    Frame(FrameError),
    #[error("login failed with status {status:#06x}")]
    LoginFailed {
        /// The login status sent.
        status: u16,
        /// An authentication failure, counted against the source before the
        /// answer was sent (so that a peer that never reads it is counted too).
        auth: Option<crate::auth_limit::Failure>,
        /// InitiatorName, if the initiator got as far as sending it.
        initiator: Option<String>,
        /// CHAP_N, if sent.
        chap_name: Option<String>,
    },
    #[error("unexpected PDU during login")]
    NotLogin,
    #[error("no Login Request within the first-PDU timeout")]
    FirstPduTimeout,
}

// (the wrapped error's text is in the variant's own, so it is not also given
// as the source: an error chain printed whole said it twice)
impl From<std::io::Error> for ConnError {
    fn from(e: std::io::Error) -> ConnError {
        ConnError::Io(e)
    }
}

/// Reads one whole PDU (used during login, where nothing else can happen).
pub(crate) async fn read_frame<R: AsyncRead + Unpin>(
    sock: &mut R,
    buf: &mut BytesMut,
    limits: &FrameLimits,
) -> Result<Frame, ConnError> {
    loop {
        match decode_frame(buf, limits) {
            Ok(Some(f)) => return Ok(f),
            Ok(None) => {}
            Err(e) => return Err(ConnError::Frame(e)),
        }
        reserve_for_next(buf, limits);
        if sock.read_buf(buf).await? == 0 {
            return Err(ConnError::Eof);
        }
    }
}

async fn send_step<W: AsyncWrite + Unpin>(sock: &mut W, step: &LoginStep) -> std::io::Result<()> {
    let hdr = TargetPdu::LoginResponse(step.header).encode(&step.seq, step.data.len() as u32);
    let mut wire = Vec::with_capacity(48 + step.data.len() + 3);
    wire.extend_from_slice(&hdr);
    wire.extend_from_slice(&step.data);
    wire.resize(wire.len() + pad_len(step.data.len()), 0);
    sock.write_all(&wire).await
}

fn failed(neg: &LoginNegotiator, status: u16) -> ConnError {
    ConnError::LoginFailed {
        status,
        auth: None,
        initiator: neg.initiator_name().map(str::to_owned),
        chap_name: neg.chap_name().map(str::to_owned),
    }
}

fn to_failure(step: &mut LoginStep, st: u16) {
    step.header.transit = false;
    step.header.nsg = 0;
    step.header.status_class = (st >> 8) as u8;
    step.header.status_detail = st as u8;
    step.data.clear();
    step.outcome = LoginOutcome::Failed(st);
}

/// A session in the registry that this connection must serve: dropped, it
/// leaves the registry and reads as ended (whatever ends the connection: a
/// failed write of the last Login Response, the login timeout, an eviction,
/// the end of full feature phase), so no session outlives its connection.
pub(crate) struct Registered {
    ctx: Arc<Ctx>,
    pub session: Arc<Session>,
}

impl Drop for Registered {
    fn drop(&mut self) {
        self.ctx.registry.remove_session(&self.session);
        self.session.ended.send_replace(true);
    }
}

/// The largest data segment of a login PDU this target takes.
const LOGIN_DATA_SEGMENT_BYTES_MAX: u32 = 8192;

/// Runs login to completion. On success the session is registered (an older
/// session with the same identity has been closed) and full feature phase may begin.
pub(crate) async fn login<S: AsyncRead + AsyncWrite + Unpin>(
    ctx: &Arc<Ctx>,
    sock: &mut S,
    buf: &mut BytesMut,
    tpgt: u16,
    peer: SocketAddr,
    slot: &AdmissionSlot,
) -> Result<(Negotiated, Registered), ConnError> {
    // the table of this login's start: a reload meanwhile applies to later logins
    let tables = ctx.tables();
    let mut neg = LoginNegotiator::new(tables.login_cfg.clone(), tpgt);
    let limits = FrameLimits {
        // the login phase's own limit (RFC 7143 13.12: 8192 until both sides
        // declared theirs): no unauthenticated peer makes this node hold more
        max_data_segment_bytes: LOGIN_DATA_SEGMENT_BYTES_MAX,
        max_ahs_bytes: 0,
        ..FrameLimits::default()
    };
    let mut first = true;
    loop {
        let frame = if first {
            let first_pdu = Duration::from_millis(ctx.limits.login_first_pdu_timeout_ms);
            let f = tokio::time::timeout(first_pdu, read_frame(sock, buf, &limits))
                .await
                .map_err(|_| ConnError::FirstPduTimeout)??;
            slot.mark_active();
            f
        } else {
            read_frame(sock, buf, &limits).await?
        };
        let InitiatorPdu::Login(req) = frame.bhs.pdu else {
            return Err(ConnError::NotLogin);
        };
        let mut step = if first && req.tsih != 0 {
            // MaxConnections=1: no connection can join a session, whichever
            // its TSIH names. One answer for all: told apart ("session does
            // not exist" for the others), the answers let a peer that never
            // authenticated find which sessions are live
            neg.refuse(&req, status::TOO_MANY_CONNECTIONS)
        } else {
            neg.step(&req, &frame.data)
        };
        first = false;
        match step.outcome.clone() {
            LoginOutcome::Continue => send_step(sock, &step).await?,
            LoginOutcome::Failed(st) => {
                let mut err = failed(&neg, st);
                if st == status::AUTH_FAILURE {
                    if let ConnError::LoginFailed { auth, .. } = &mut err {
                        *auth = Some(ctx.auth_limit.failed(peer.ip()));
                    }
                }
                // the failure is counted whether or not the answer gets out
                if send_step(sock, &step).await.is_ok() {
                    let _ = sock.flush().await;
                }
                return Err(err);
            }
            LoginOutcome::Complete(n) => {
                let registered = match register(ctx, &tables.targets, &n, peer).await {
                    Ok(r) => r,
                    Err(st) => {
                        to_failure(&mut step, st);
                        send_step(sock, &step).await?;
                        return Err(failed(&neg, st));
                    }
                };
                step.header.tsih = registered.session.tsih;
                send_step(sock, &step).await?;
                return Ok((*n, registered));
            }
        }
    }
}

async fn register(
    ctx: &Arc<Ctx>,
    targets: &[crate::TargetSpec],
    n: &Negotiated,
    peer: SocketAddr,
) -> Result<Registered, u16> {
    let window = Arc::new(Window::new(
        n.exp_cmd_sn,
        ctx.limits.commands_in_flight_per_session_max,
    ));
    let (key, scsi, nexus) = match (n.session_type, n.target_index) {
        (SessionType::Normal, Some(t)) => {
            let spec = targets.get(t).ok_or(status::NOT_FOUND)?;
            let key = SessionKey {
                initiator: n.initiator_name.clone(),
                isid: n.isid,
                target: t,
                tpgt: n.tpgt,
            };
            let nexus = ItNexus {
                initiator_name: Arc::from(n.initiator_name.as_str()),
                initiator_port: Arc::from(initiator_port(&n.initiator_name, &n.isid).as_str()),
                relative_port_id: n.tpgt,
                chap_user: n.chap_user.as_deref().map(Arc::from),
            };
            (Some(key), Some(spec.scsi.clone()), Some(nexus))
        }
        (SessionType::Normal, None) => return Err(status::MISSING_PARAMETER),
        (SessionType::Discovery, _) => (None, None, None),
    };
    let target = key.as_ref().map(|k| k.target);
    let origin = Origin {
        source: peer.ip(),
        chap_user: n.chap_user.clone(),
        chap_per_initiator: n.chap_per_initiator,
        chap_proven: n.chap_proven.clone(),
        // (a code it does not know counts as weak: it cannot happen)
        chap_weak: n.chap_algorithm.is_some_and(|a| {
            iscsi_proto::chap::ChapAlgorithm::from_code(a.into())
                .is_none_or(iscsi_proto::chap::ChapAlgorithm::is_weak)
        }),
        tpgt: n.tpgt,
    };
    let (session, old) = ctx
        .registry
        .register(key.as_ref(), &origin.clone(), |tsih| {
            Session::new(tsih, key.clone(), target, scsi, nexus, window, origin)
                .with_buffers(&ctx.buffers)
        })
        .map_err(|e| match e {
            RegisterError::Full => status::OUT_OF_RESOURCES,
            RegisterError::NotSameIdentity(holder) => {
                tracing::warn!(
                    %peer,
                    initiator = %n.initiator_name,
                    chap_user = n.chap_user.as_deref().unwrap_or("-"),
                    session_from = %holder,
                    "login refused: it would reinstate a session of another identity (kept)"
                );
                status::FORBIDDEN
            }
        })?;
    // from here the session leaves the registry if this login goes no further
    // (the wait below included)
    let registered = Registered {
        ctx: ctx.clone(),
        session,
    };
    if let Some(old) = old {
        tracing::info!(
            initiator = %n.initiator_name,
            old_tsih = old.tsih,
            new_tsih = registered.session.tsih,
            "session reinstatement: closing the old session"
        );
        let mut ended = old.ended.subscribe();
        let _ = old.kill.send_replace(true);
        // the old session ends once its commands have (a write at a stalled
        // disk included, `Session::wait_all_gone`): the new one serves
        // nothing before, or that write could land over its first ones
        // (review of 2026-12-06: it went on after the drain time; the login
        // timeout bounds this wait)
        let wait = Duration::from_millis(ctx.limits.drain_timeout_ms) + Duration::from_secs(2);
        while tokio::time::timeout(wait, ended.wait_for(|e| *e))
            .await
            .is_err()
        {
            tracing::warn!(
                old_tsih = old.tsih,
                "the reinstated session has not ended yet: its commands are still at the volume"
            );
        }
        // the reinstatement is the old nexus's loss, done before the new
        // session's first command (the old session's own end leaves it to us)
        if let (Some(scsi), Some(nexus)) = (&old.scsi, &old.nexus) {
            scsi.nexus_lost(nexus).await;
        }
    }
    Ok(registered)
}
