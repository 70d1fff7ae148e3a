//! Portals and the accept loop; clean shutdown; live replacement of the target
//! table and of the portals ([`Reloader`]).
//!
//! Invariant of the target table: a target keeps its index for the life of the
//! server (sessions, the registry and task-abort hooks name targets by index), so
//! a reload may change a target's authentication and ACLs and append targets, but
//! never removes, reorders or swaps the SCSI device of one.
//!
//! Invariant of the portals: a portal keeps its TPGT while it is served; once
//! [`Reloader::set_portals`] returns, a removed portal accepts nothing more and
//! every session that logged in through it (normal or discovery) is closing, and
//! a session whose login completes through it after that is closed at once.

use crate::auth_limit::{AuthLimiter, AuthLimits};
use crate::config::{Auth, Limits, Portal, ServerConfig, TargetSpec};
use crate::session::{Caps, Registry, Session};
use block::admission::AdmissionBudget;
use iscsi_proto::login::{
    ChapCredentials, InitiatorChap, LoginConfig, OperationalLimits, TargetAuth,
};
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;

/// Accepted connections waiting to be served.
const ACCEPT_QUEUE: usize = 64;

/// A connection accepted on a portal.
type Accepted = (TcpStream, SocketAddr, Portal);

/// One portal's accept task.
struct Acceptor {
    /// The address it was asked to listen on (port 0 before binding).
    configured: SocketAddr,
    portal: Portal,
    task: tokio::task::JoinHandle<()>,
}

/// The portals' listeners: bound before [`Server::run`] starts them, then one
/// accept task each.
#[derive(Default)]
struct Listening {
    /// Where accept tasks hand connections to; set while `run` serves.
    tx: Option<mpsc::Sender<Accepted>>,
    /// Bound, not yet accepting (before `run`): (configured address, listener, portal).
    waiting: Vec<(SocketAddr, TcpListener, Portal)>,
    /// Accepting.
    running: Vec<Acceptor>,
}

fn spawn_acceptor(
    l: TcpListener,
    portal: Portal,
    tx: mpsc::Sender<Accepted>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            match l.accept().await {
                Ok((s, peer)) => {
                    if tx.send((s, peer, portal)).await.is_err() {
                        return;
                    }
                }
                Err(e) => {
                    tracing::warn!(portal = %portal.addr, error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    })
}

/// The targets and the login configuration derived from them, replaced together
/// (a login sees either the old or the new table, never a mix).
pub(crate) struct Tables {
    pub targets: Vec<TargetSpec>,
    pub login_cfg: Arc<LoginConfig>,
}

/// What every connection task shares.
pub(crate) struct Ctx {
    /// Read at each login and discovery; replaced by [`Reloader::replace`].
    tables: parking_lot::RwLock<Arc<Tables>>,
    /// Portals with the addresses actually bound (port 0 resolved), in order;
    /// replaced by [`Reloader::set_portals`].
    portals: parking_lot::RwLock<Arc<Vec<Portal>>>,
    /// Their listeners and accept tasks.
    listening: parking_lot::Mutex<Listening>,
    /// Portal changes one at a time.
    portal_change: tokio::sync::Mutex<()>,
    /// The HA partner's portals (advertised, not bound).
    pub partner_portals: Vec<Portal>,
    pub limits: Limits,
    pub registry: Registry,
    pub shutdown: watch::Receiver<bool>,
    pub logins: Arc<AdmissionBudget>,
    pub auth_limit: AuthLimiter,
    /// The node's budget of buffered data bytes.
    pub buffers: block::BufferBudget,
    /// One line a second, with a count of those left out, for logins refused
    /// (other than by a failed authentication, which counts toward its
    /// source's lockout and is logged every time), aborted or timed out: a
    /// peer reconnecting in a loop wrote one each (review of 2026-12-06).
    pub refusals_log: block::admission::LogGate,
}

/// One session as metrics show it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionInfo {
    /// The initiator's name (empty for a discovery session that gave none).
    pub initiator: String,
    /// The target's name; empty for a discovery session.
    pub target: String,
    /// The portal the session logged in through (`address:port`), or its TPGT
    /// when no portal of this node carries it.
    pub portal: String,
    /// A discovery session (SendTargets only).
    pub discovery: bool,
    /// Commands executing now.
    pub commands_running: usize,
    /// Of those, commands aborted (a task management function, PREEMPT AND
    /// ABORT) whose medium changes are still ending: the abort is answered once
    /// they have.
    pub commands_aborting: usize,
    /// The session's ISID, 12 hex digits (empty for a discovery session).
    pub isid: String,
    /// The session's TSIH.
    pub tsih: u16,
    /// Tells this session apart from every other the server ever had (a TSIH
    /// may be reused).
    pub id: u64,
    /// Read and write commands it finished since login.
    pub io: crate::session::SessionIoStats,
    /// Bytes of the node's buffer budget it holds now (read data waiting for
    /// the initiator, Data-Out waiting to be applied), at most its share.
    pub buffered_bytes: u64,
}

/// Lists the sessions of a [`Server`]; empty once the server is gone.
#[derive(Clone)]
pub struct Sessions(std::sync::Weak<Ctx>);

impl Sessions {
    /// The bound address of every portal of this node.
    pub fn portals(&self) -> Vec<SocketAddr> {
        self.0
            .upgrade()
            .map_or_else(Vec::new, |c| c.portals().iter().map(|p| p.addr).collect())
    }

    /// The sessions logged in now, oldest first.
    pub fn list(&self) -> Vec<SessionInfo> {
        let Some(ctx) = self.0.upgrade() else {
            return Vec::new();
        };
        let tables = ctx.tables();
        let portals = ctx.portals();
        ctx.registry
            .snapshot()
            .iter()
            .map(|s| {
                let key = s.key.as_ref();
                let portal = key.map_or_else(String::new, |k| {
                    portals
                        .iter()
                        .find(|p| p.tpgt == k.tpgt)
                        .map_or_else(|| format!("tpgt {}", k.tpgt), |p| p.addr.to_string())
                });
                let (commands_running, commands_aborting) = {
                    let r = s.running.lock();
                    (r.len(), r.values().filter(|t| t.aborted).count())
                };
                SessionInfo {
                    initiator: key.map_or_else(String::new, |k| k.initiator.clone()),
                    target: s
                        .target
                        .and_then(|t| tables.targets.get(t))
                        .map_or_else(String::new, |t| t.iqn.clone()),
                    portal,
                    discovery: s.discovery,
                    commands_running,
                    commands_aborting,
                    isid: key.map_or_else(String::new, |k| {
                        k.isid.iter().map(|b| format!("{b:02x}")).collect()
                    }),
                    tsih: s.tsih,
                    id: s.created(),
                    io: s.io.snapshot(),
                    buffered_bytes: s.buffers.status().held_bytes,
                }
            })
            .collect()
    }
}

/// An iSCSI target server: every portal serves every target.
pub struct Server {
    ctx: Arc<Ctx>,
    shutdown_tx: watch::Sender<bool>,
}

fn creds(c: &Option<crate::ChapSecret>) -> Option<ChapCredentials> {
    c.as_ref().map(|c| ChapCredentials {
        user: c.user.clone(),
        secret: c.secret.clone(),
    })
}

impl Ctx {
    /// The current target table.
    pub(crate) fn tables(&self) -> Arc<Tables> {
        self.tables.read().clone()
    }

    /// This node's portals now.
    pub(crate) fn portals(&self) -> Arc<Vec<Portal>> {
        self.portals.read().clone()
    }

    /// Whether a portal with TPGT `tpgt` is served now.
    pub(crate) fn serves_portal(&self, tpgt: u16) -> bool {
        self.portals.read().iter().any(|p| p.tpgt == tpgt)
    }

    /// Whether `session` would log in again with what it proved at login under
    /// the table in force now: a normal session must pass its target's ACL and,
    /// where the target asks for CHAP, have shown the very credentials it now
    /// asks of this initiator; a discovery session must have shown the
    /// discovery credentials, where discovery asks for them.
    pub(crate) fn still_admits(&self, session: &Session) -> bool {
        let tables = self.tables();
        let proven = session.origin.chap_proven.as_ref();
        if session.discovery {
            return match &tables.login_cfg.discovery_chap {
                None => true,
                Some(asked) => {
                    proven == Some(asked)
                        && !(session.origin.chap_weak && tables.login_cfg.discovery_refuse_md5)
                }
            };
        }
        let (Some(i), Some(nexus)) = (session.target, session.nexus.as_ref()) else {
            return true;
        };
        tables.login_cfg.targets.get(i).is_some_and(|auth| {
            crate::copy_reach::admits(auth, &nexus.initiator_name, proven)
                && !(session.origin.chap_weak && auth.refuse_md5 && auth.chap_required())
        })
    }
}

fn login_config(targets: &[TargetSpec], discovery_auth: &Auth, l: &Limits) -> LoginConfig {
    LoginConfig {
        targets: targets
            .iter()
            .map(|t| TargetAuth {
                name: t.iqn.clone(),
                alias: t.alias.clone(),
                chap: creds(&t.auth.chap),
                mutual: creds(&t.auth.mutual),
                allowed_initiators: t.allowed_initiators.clone(),
                chap_initiators: t
                    .auth
                    .per_initiator
                    .iter()
                    .map(|(name, c)| InitiatorChap {
                        initiator: name.clone(),
                        creds: ChapCredentials {
                            user: c.user.clone(),
                            secret: c.secret.clone(),
                        },
                    })
                    .collect(),
                refuse_md5: t.auth.refuse_md5,
            })
            .collect(),
        discovery_chap: creds(&discovery_auth.chap),
        discovery_mutual: creds(&discovery_auth.mutual),
        discovery_refuse_md5: discovery_auth.refuse_md5,
        limits: OperationalLimits {
            max_recv_data_segment_bytes: l.max_recv_data_segment_bytes.clamp(512, (1 << 24) - 1),
            max_burst_bytes: l.max_burst_bytes.clamp(512, (1 << 24) - 1),
            first_burst_bytes: l.first_burst_bytes.clamp(512, (1 << 24) - 1),
            max_outstanding_r2t: l.max_outstanding_r2t.max(1),
            initial_r2t: l.initial_r2t,
            immediate_data: l.immediate_data,
            default_time2wait_s: 2,
            default_time2retain_s: 0,
            cmd_window: l.commands_in_flight_per_session_max.max(1),
        },
    }
}

/// Gives target `i`'s device what it asks of the transport: aborting the tasks
/// of preempted nexuses, and which other targets its copies may reach.
fn hook_target(ctx: &Arc<Ctx>, scsi: &scsi::ScsiTarget, i: usize) {
    scsi.set_task_abort(Arc::new(crate::tmf::PreemptAbort {
        ctx: Arc::downgrade(ctx),
        target: i,
    }));
    scsi.set_copy_reach(Arc::new(crate::copy_reach::CopyReach {
        ctx: Arc::downgrade(ctx),
        target: i,
    }));
}

impl Server {
    /// Binds every portal. Fails if any address cannot be bound.
    pub async fn bind(cfg: ServerConfig) -> std::io::Result<Server> {
        let mut waiting = Vec::with_capacity(cfg.portals.len());
        let mut portals = Vec::with_capacity(cfg.portals.len());
        for p in &cfg.portals {
            let (l, bound) = bind_portal(p).await?;
            portals.push(bound);
            waiting.push((p.addr, l, bound));
        }
        let (shutdown_tx, shutdown) = watch::channel(false);
        let ctx = Arc::new(Ctx {
            tables: parking_lot::RwLock::new(Arc::new(Tables {
                login_cfg: Arc::new(login_config(&cfg.targets, &cfg.discovery_auth, &cfg.limits)),
                targets: cfg.targets,
            })),
            portals: parking_lot::RwLock::new(Arc::new(portals)),
            listening: parking_lot::Mutex::new(Listening {
                waiting,
                ..Listening::default()
            }),
            portal_change: tokio::sync::Mutex::new(()),
            refusals_log: block::admission::LogGate::new(Duration::from_secs(1)),
            partner_portals: cfg.partner_portals,
            logins: AdmissionBudget::new(
                cfg.limits.logins_in_progress_per_source_max,
                cfg.limits.logins_in_progress_max,
            ),
            auth_limit: AuthLimiter::new(AuthLimits {
                failures_max: cfg.limits.auth_failures_per_source_max,
                window: Duration::from_millis(cfg.limits.auth_failure_window_ms),
                lockout: Duration::from_millis(cfg.limits.auth_lockout_ms),
                sources_max: cfg.limits.auth_failure_sources_max,
            }),
            registry: Registry::new(Caps {
                sessions_max: cfg.limits.sessions_max,
                discovery_sessions_max: cfg.limits.discovery_sessions_max,
                discovery_sessions_per_source_max: cfg.limits.discovery_sessions_per_source_max,
                sessions_per_source_max: cfg.limits.sessions_per_source_max,
            }),
            limits: cfg.limits,
            shutdown,
            buffers: cfg.buffers,
        });
        for (i, t) in ctx.tables().targets.iter().enumerate() {
            hook_target(&ctx, &t.scsi, i);
        }
        Ok(Server { ctx, shutdown_tx })
    }

    /// Counters of failed authentications (CHAP) since the server started.
    pub fn auth_stats(&self) -> std::sync::Arc<crate::auth_limit::AuthStats> {
        self.ctx.auth_limit.stats.clone()
    }

    /// A handle that lists the server's sessions while it runs (for metrics).
    pub fn sessions(&self) -> Sessions {
        Sessions(Arc::downgrade(&self.ctx))
    }

    /// A handle that replaces the target table while the server runs.
    pub fn reloader(&self) -> Reloader {
        Reloader {
            ctx: Arc::downgrade(&self.ctx),
        }
    }

    /// The bound address of every portal, in configuration order.
    pub fn local_addrs(&self) -> Vec<SocketAddr> {
        self.ctx.portals().iter().map(|p| p.addr).collect()
    }

    /// Serves until `shutdown` completes; then stops accepting, closes every
    /// session (letting running commands finish within the drain timeout) and
    /// flushes every target's LUNs.
    pub async fn run(self, shutdown: impl Future<Output = ()> + Send) -> std::io::Result<()> {
        let (acc_tx, mut acc_rx) = mpsc::channel::<Accepted>(ACCEPT_QUEUE);
        {
            let mut l = self.ctx.listening.lock();
            for (configured, listener, portal) in std::mem::take(&mut l.waiting) {
                l.running.push(Acceptor {
                    configured,
                    portal,
                    task: spawn_acceptor(listener, portal, acc_tx.clone()),
                });
            }
            l.tx = Some(acc_tx);
        }
        let mut conns = JoinSet::new();
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                _ = &mut shutdown => break,
                acc = acc_rx.recv() => {
                    let Some((sock, peer, portal)) = acc else { break };
                    let ctx = self.ctx.clone();
                    conns.spawn(crate::conn::serve(ctx, sock, peer, portal));
                }
                Some(res) = conns.join_next(), if !conns.is_empty() => {
                    if let Err(e) = res {
                        if e.is_panic() {
                            tracing::error!("connection task panicked: {e}");
                        }
                    }
                }
            }
        }
        tracing::info!("iSCSI target shutting down");
        let stopped = {
            let mut l = self.ctx.listening.lock();
            l.tx = None;
            std::mem::take(&mut l.running)
        };
        for a in stopped {
            a.task.abort();
        }
        drop(acc_rx);
        self.shutdown_tx.send_replace(true);
        let grace =
            Duration::from_millis(self.ctx.limits.drain_timeout_ms) + Duration::from_secs(5);
        if tokio::time::timeout(grace, async { while conns.join_next().await.is_some() {} })
            .await
            .is_err()
        {
            tracing::warn!("sessions did not close in time; aborting them");
            conns.abort_all();
            while conns.join_next().await.is_some() {}
        }
        for t in &self.ctx.tables().targets {
            t.scsi.flush_all().await;
        }
        Ok(())
    }
}

/// Binds `p`'s address; the portal as bound (port 0 resolved).
async fn bind_portal(p: &Portal) -> std::io::Result<(TcpListener, Portal)> {
    let l = TcpListener::bind(p.addr).await?;
    let bound = Portal {
        addr: l.local_addr()?,
        tpgt: p.tpgt,
    };
    Ok((l, bound))
}

/// What [`Reloader::set_portals`] changed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PortalChange {
    /// Portals now served that were not, as bound.
    pub added: Vec<Portal>,
    /// Portals no longer served.
    pub removed: Vec<Portal>,
    /// Sessions closed because they came through a removed portal.
    pub sessions_closed: usize,
}

/// Why [`Reloader::replace`] refused a new target table (the old one stays).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ReplaceError {
    /// The server has stopped.
    #[error("the iSCSI server has stopped")]
    Stopped,
    /// A target of the running table is missing or not at its index.
    #[error("target {0} cannot be removed or moved while the server runs")]
    Removed(String),
    /// A running target would get another SCSI device (other LUNs).
    #[error("target {0} would change its LUNs; that needs a restart")]
    DeviceChanged(String),
    /// Two targets share a name.
    #[error("target {0} is listed twice")]
    Duplicate(String),
}

/// Replaces the target table of a running [`Server`]: authentication (CHAP,
/// mutual CHAP, per-initiator CHAP), allowed initiators and aliases of running
/// targets, discovery authentication, and targets appended at the end. New
/// logins and discovery see the new table; a session logged in under the old
/// one is closed when the new one would refuse its login (ACL, or CHAP
/// credentials other than those it proved), and keeps running otherwise.
#[derive(Clone)]
pub struct Reloader {
    ctx: std::sync::Weak<Ctx>,
}

impl Reloader {
    /// The running targets, in index order.
    pub fn targets(&self) -> Vec<TargetSpec> {
        self.ctx
            .upgrade()
            .map(|c| c.tables().targets.clone())
            .unwrap_or_default()
    }

    /// Installs `targets` (the running ones first, in their order, with the same
    /// SCSI devices; then any new ones) and `discovery_auth`, then closes every
    /// session the new settings no longer admit (its running commands finish
    /// first, as at a logout). Returns how many it closed.
    pub fn replace(
        &self,
        targets: Vec<TargetSpec>,
        discovery_auth: Auth,
    ) -> Result<usize, ReplaceError> {
        let ctx = self.ctx.upgrade().ok_or(ReplaceError::Stopped)?;
        let mut tables = ctx.tables.write();
        for (i, old) in tables.targets.iter().enumerate() {
            let new = targets
                .get(i)
                .filter(|n| n.iqn == old.iqn)
                .ok_or_else(|| ReplaceError::Removed(old.iqn.clone()))?;
            if !Arc::ptr_eq(&new.scsi, &old.scsi) {
                return Err(ReplaceError::DeviceChanged(old.iqn.clone()));
            }
        }
        for (i, t) in targets.iter().enumerate() {
            if targets[..i].iter().any(|o| o.iqn == t.iqn) {
                return Err(ReplaceError::Duplicate(t.iqn.clone()));
            }
        }
        let first_new = tables.targets.len();
        for (i, t) in targets.iter().enumerate().skip(first_new) {
            hook_target(&ctx, &t.scsi, i);
        }
        let login_cfg = Arc::new(login_config(&targets, &discovery_auth, &ctx.limits));
        *tables = Arc::new(Tables { targets, login_cfg });
        drop(tables);
        // after the table changed: a login registered from now on is judged by
        // conn.rs against the new table, one registered before is here
        let mut revoked = Vec::new();
        for s in ctx.registry.snapshot() {
            // one told to close already (and draining) is not counted again
            if !*s.kill.borrow() && !ctx.still_admits(&s) {
                s.kill.send_replace(true);
                revoked.push(s);
            }
        }
        for s in &revoked {
            tracing::warn!(
                tsih = s.tsih,
                initiator = s.nexus.as_ref().map(|n| &*n.initiator_name).unwrap_or("-"),
                source = %s.origin.source,
                discovery = s.discovery,
                "the new access settings no longer admit this session; closing it"
            );
        }
        Ok(revoked.len())
    }

    /// Makes `portals` (addresses as configured, with their TPGTs, in order) the
    /// server's portals while it runs: new ones are bound and accept at once;
    /// removed ones stop accepting, and every session that came through one of
    /// them is told to close (its running commands finish first, as at a
    /// logout); the others, and the sessions through them, are untouched. A
    /// portal is the same when its address and TPGT are. Fails, and nothing
    /// changes, when two portals share an address or a TPGT or a new address
    /// cannot be bound (an address that stays must keep its TPGT: the old
    /// listener still holds it).
    pub async fn set_portals(&self, portals: &[Portal]) -> Result<PortalChange, PortalError> {
        let ctx = self.ctx.upgrade().ok_or(PortalError::Stopped)?;
        let _one = ctx.portal_change.lock().await;
        for (i, p) in portals.iter().enumerate() {
            if portals[..i]
                .iter()
                .any(|o| o.addr == p.addr || o.tpgt == p.tpgt)
            {
                return Err(PortalError::Duplicate(*p));
            }
        }
        let same = |configured: SocketAddr, p: &Portal, n: &Portal| {
            configured == n.addr && p.tpgt == n.tpgt
        };
        let current: Vec<(SocketAddr, Portal)> = {
            let l = ctx.listening.lock();
            l.running
                .iter()
                .map(|a| (a.configured, a.portal))
                .chain(l.waiting.iter().map(|(c, _, p)| (*c, *p)))
                .collect()
        };
        // the new ones are bound first: a failure changes nothing
        let mut bound = Vec::new();
        for n in portals {
            if current.iter().any(|(c, p)| same(*c, p, n)) {
                continue;
            }
            let (l, b) = bind_portal(n).await.map_err(|source| PortalError::Bind {
                addr: n.addr,
                source,
            })?;
            bound.push((n.addr, l, b));
        }
        let mut change = PortalChange::default();
        let stopped = {
            let mut l = ctx.listening.lock();
            let keep = |c: SocketAddr, p: &Portal| portals.iter().any(|n| same(c, p, n));
            let (kept, gone): (Vec<Acceptor>, Vec<Acceptor>) = std::mem::take(&mut l.running)
                .into_iter()
                .partition(|a| keep(a.configured, &a.portal));
            l.running = kept;
            let waiting = std::mem::take(&mut l.waiting);
            for (c, listener, p) in waiting {
                if keep(c, &p) {
                    l.waiting.push((c, listener, p));
                } else {
                    change.removed.push(p);
                }
            }
            change.removed.extend(gone.iter().map(|a| a.portal));
            for (configured, listener, portal) in bound {
                change.added.push(portal);
                match l.tx.clone() {
                    Some(tx) => l.running.push(Acceptor {
                        configured,
                        portal,
                        task: spawn_acceptor(listener, portal, tx),
                    }),
                    None => l.waiting.push((configured, listener, portal)),
                }
            }
            // in the order asked for
            let now: Vec<Portal> = portals
                .iter()
                .filter_map(|n| {
                    l.running
                        .iter()
                        .map(|a| (a.configured, a.portal))
                        .chain(l.waiting.iter().map(|(c, _, p)| (*c, *p)))
                        .find(|(c, p)| same(*c, p, n))
                        .map(|(_, p)| p)
                })
                .collect();
            *ctx.portals.write() = Arc::new(now);
            gone
        };
        // a removed portal's listener is closed once its task is gone
        for a in stopped {
            a.task.abort();
            let _ = a.task.await;
        }
        // after the table changed: a login that completes through a removed
        // portal from now on sees it gone (conn.rs), one registered before is here
        for s in ctx.registry.snapshot() {
            if change.removed.iter().any(|p| p.tpgt == s.origin.tpgt) {
                s.kill.send_replace(true);
                change.sessions_closed += 1;
            }
        }
        for p in &change.added {
            tracing::info!(portal = %p.addr, tpgt = p.tpgt, "portal added");
        }
        for p in &change.removed {
            tracing::info!(portal = %p.addr, tpgt = p.tpgt, "portal removed");
        }
        if change.sessions_closed > 0 {
            tracing::info!(
                sessions = change.sessions_closed,
                "sessions through removed portals closing"
            );
        }
        Ok(change)
    }
}

/// Why [`Reloader::set_portals`] refused (the portals stay as they were).
#[derive(Debug, thiserror::Error)]
pub enum PortalError {
    /// The server has stopped.
    #[error("the iSCSI server has stopped")]
    Stopped,
    /// Two portals share an address or a TPGT.
    #[error("portal {} (TPGT {}) shares its address or TPGT with another", .0.addr, .0.tpgt)]
    Duplicate(Portal),
    /// A new portal's address could not be bound.
    #[error("binding portal {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
}
