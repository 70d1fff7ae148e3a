//! The NBD server: configuration, the accept loop and clean shutdown.
//!
//! Every export is a [`VolumeRef`]. The advertised transmission flags are
//! `HAS_FLAGS | SEND_FLUSH | SEND_FUA | SEND_TRIM | SEND_WRITE_ZEROES |
//! CAN_MULTI_CONN` (plus `READ_ONLY`, without FUA/TRIM/WRITE_ZEROES, for read-only
//! exports). `CAN_MULTI_CONN` is safe because every connection to an export uses
//! the same volume object and the server keeps no cache of its own: a reply is
//! sent only after the volume completed the write, and `Volume::flush` makes every
//! completed write durable whichever connection issued it, which is exactly the
//! guarantee the flag promises.
//!
//! Block sizes are advertised as minimum 1 (any byte range is served, unaligned
//! ones by covering reads and read-modify-write), preferred the volume block size,
//! maximum [`NbdLimits::request_bytes_max`].

mod access;
mod conn;
mod exec;
mod writer;

use crate::proto::{tflag, BlockSizes, ExportInfo, STRING_BYTES_MAX};
pub use access::IpRange;
use block::admission::{AdmissionBudget, PerSource};
use block::VolumeRef;
use exec::ExportState;
pub use exec::ExportStats;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};
use tokio::task::JoinSet;

/// One named export.
#[derive(Clone)]
pub struct NbdExport {
    /// Name clients ask for (`lun0`, `lun1`, ...); unique, at most 4096 bytes.
    pub name: String,
    /// Free text shown by `nbdinfo` and in `NBD_OPT_LIST`.
    pub description: String,
    /// The volume served.
    pub volume: VolumeRef,
    /// Refuse writes, trims and zeroing with EPERM and advertise `READ_ONLY`.
    pub read_only: bool,
    /// Asked before every read (`false`) and every write, trim or zeroing
    /// (`true`): a refusal is answered EPERM and nothing reaches the volume.
    /// freesan holds NBD clients here to the LUN's SCSI reservations.
    pub access: Option<Arc<dyn ExportAccess>>,
}

/// Who decides, request by request, whether an export may be read or written
/// now (see [`NbdExport::access`]).
pub trait ExportAccess: Send + Sync {
    /// Whether a read (`write` false) or a change may run now.
    fn allows(&self, write: bool) -> bool;

    /// Whether the export exists for NBD clients at all now: one that does
    /// not is neither listed (`NBD_OPT_LIST`) nor opened, as if absent (LUN
    /// masking hides a LUN from clients no host group names; NBD clients
    /// name none).
    fn visible(&self) -> bool {
        true
    }

    /// The lock that orders the volume's changes on this node across its
    /// frontends (freesan's: the SCSI LU's write order). An NBD change holds
    /// it shared, and a read-modify-write of partial blocks exclusively, so
    /// that no write another frontend acknowledged is undone by the write-back
    /// of a block read before it, and no change lands inside a COMPARE AND
    /// WRITE. None: NBD is the volume's only writer here.
    fn write_order(&self) -> Option<Arc<tokio::sync::RwLock<()>>> {
        None
    }
}

impl std::fmt::Debug for NbdExport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NbdExport")
            .field("name", &self.name)
            .field("description", &self.description)
            .field("geometry", &self.volume.geometry())
            .field("read_only", &self.read_only)
            .finish()
    }
}

/// Bounds that keep one client from exhausting the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NbdLimits {
    /// Requests executing or waiting for their reply, per connection; the reader
    /// stops reading when they are all taken.
    pub requests_in_flight_max: usize,
    /// Largest READ or WRITE payload (advertised as the maximum block size).
    /// Longer reads get EINVAL; longer writes get EINVAL and a close.
    pub request_bytes_max: u32,
    /// READ/WRITE payload bytes held per connection at once (at least
    /// `request_bytes_max`).
    pub in_flight_bytes_max: usize,
    /// Longest option data accepted during the handshake.
    pub option_bytes_max: usize,
    /// Time allowed from accept to the end of option haggling.
    pub handshake_timeout_ms: u64,
    /// Connections served at once (past their handshake); more are closed
    /// when their handshake ends.
    pub connections_max: usize,
    /// Connections served at once from one client address.
    pub connections_per_source_max: usize,
    /// Connections still in their handshake (greeting, option haggling, TLS),
    /// in all: one more takes the place of one of the source holding the
    /// most (`block::admission::AdmissionBudget`), so clients that connect
    /// and stay silent cannot keep others out; served connections are never
    /// taken back.
    pub handshakes_max: usize,
    /// Connections still in their handshake from one client address: one
    /// more takes the place of that address's oldest.
    pub handshakes_per_source_max: usize,
    /// Time in-flight requests get to finish when a connection ends (the
    /// connection still counts against the bounds until they have).
    pub drain_timeout_ms: u64,
    /// A WRITE payload that makes no progress for this long closes the
    /// connection: it holds its bytes of the node's buffer budget meanwhile.
    pub payload_stall_ms: u64,
}

impl Default for NbdLimits {
    fn default() -> Self {
        NbdLimits {
            requests_in_flight_max: 64,
            request_bytes_max: 32 << 20,
            in_flight_bytes_max: 128 << 20,
            option_bytes_max: 8 << 10,
            handshake_timeout_ms: 10_000,
            connections_max: 1024,
            connections_per_source_max: 64,
            handshakes_max: 128,
            handshakes_per_source_max: 16,
            drain_timeout_ms: 30_000,
            payload_stall_ms: 30_000,
        }
    }
}

/// What an [`NbdServer`] serves and where.
#[derive(Debug, Clone)]
pub struct NbdConfig {
    /// Address to listen on (port 0 picks a free port; see [`NbdServer::local_addr`]).
    pub listen: SocketAddr,
    /// The exports, by name.
    pub exports: Vec<NbdExport>,
    /// Export served to clients that send an empty name (freesan: `lun0`).
    pub default_export: Option<String>,
    /// Resource bounds.
    pub limits: NbdLimits,
    /// Client addresses served; every other connection is closed at accept
    /// (see [`IpRange::loopback`] for the usual default).
    pub allowed_clients: Vec<IpRange>,
    /// TLS required (`NBD_OPT_STARTTLS` before any other option) with these
    /// credentials; `None`: no TLS, STARTTLS is answered `NBD_REP_ERR_UNSUP`.
    pub tls: Option<ServerTls>,
}

/// The credentials a TLS-requiring server uses.
#[derive(Clone)]
pub enum ServerTls {
    /// A certificate, and optionally a client CA (rustls; see
    /// [`crate::tls::server_config`]).
    X509(Arc<rustls::ServerConfig>),
    /// Pre-shared keys (OpenSSL; see [`crate::psk::server_context`]).
    #[cfg(feature = "psk")]
    Psk(openssl::ssl::SslContext),
}

impl std::fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ServerTls::X509(_) => "ServerTls::X509",
            #[cfg(feature = "psk")]
            ServerTls::Psk(_) => "ServerTls::Psk",
        })
    }
}

impl From<Arc<rustls::ServerConfig>> for ServerTls {
    fn from(c: Arc<rustls::ServerConfig>) -> ServerTls {
        ServerTls::X509(c)
    }
}

/// What accepts a TLS handshake after STARTTLS.
pub(crate) enum Acceptor {
    X509(tokio_rustls::TlsAcceptor),
    #[cfg(feature = "psk")]
    Psk(openssl::ssl::SslContext),
}

impl From<ServerTls> for Acceptor {
    fn from(t: ServerTls) -> Acceptor {
        match t {
            ServerTls::X509(c) => Acceptor::X509(tokio_rustls::TlsAcceptor::from(c)),
            #[cfg(feature = "psk")]
            ServerTls::Psk(c) => Acceptor::Psk(c),
        }
    }
}

/// One export being served.
pub(crate) struct Entry {
    pub name: String,
    pub description: String,
    pub state: Arc<ExportState>,
}

/// The exports served now; changed by [`NbdExports`].
#[derive(Default)]
pub(crate) struct Table {
    pub entries: Vec<Entry>,
    /// Name of the export an empty name selects.
    pub default_export: Option<String>,
}

/// Most exports one server holds.
pub const EXPORTS_MAX: usize = 16_384;

/// What every connection shares.
pub(crate) struct Ctx {
    pub table: parking_lot::RwLock<Table>,
    pub limits: NbdLimits,
    pub allowed_clients: Vec<IpRange>,
    /// TLS required with these credentials.
    pub tls: Option<Acceptor>,
    pub shutdown: watch::Receiver<bool>,
    /// Connections past their handshake, in all and per source.
    pub served: Arc<Semaphore>,
    pub served_per_source: Arc<PerSource>,
    /// Connections closed at the end of their handshake for those bounds.
    pub served_refusals: block::admission::LogGate,
}

impl Ctx {
    /// Whether a connection from `peer` whose handshake ends now would be
    /// served ([`Ctx::admit_served`] decides, after it): when not, the
    /// choice of an export is refused (`NBD_REP_ERR_POLICY` to a GO) rather
    /// than answered and the connection then closed.
    pub(crate) fn served_has_room(&self, peer: SocketAddr) -> bool {
        self.served.available_permits() > 0 && self.served_per_source.has_room(peer.ip())
    }

    /// A place among the connections served for one from `peer` whose
    /// handshake ended; None (logged, at most once a second) when the bounds
    /// are reached.
    pub(crate) fn admit_served(
        &self,
        peer: SocketAddr,
    ) -> Option<(
        tokio::sync::OwnedSemaphorePermit,
        block::admission::SourceSlot,
    )> {
        let permit = self.served.clone().try_acquire_owned().ok();
        let slot = self.served_per_source.take(peer.ip());
        match (permit, slot) {
            (Some(p), Some(s)) => Some((p, s)),
            (p, _) => {
                let why = match p {
                    None => "too many NBD connections",
                    Some(_) => "too many NBD connections from this address",
                };
                if let Some(held_back) = self.served_refusals.allow() {
                    tracing::warn!(%peer, why, held_back, "NBD connection closed after its handshake");
                }
                None
            }
        }
    }
}

/// What one handshake sees: the exports at its start.
pub(crate) struct Snapshot {
    pub states: Vec<Arc<ExportState>>,
    pub infos: Vec<ExportInfo>,
    pub default_export: Option<usize>,
}

impl Ctx {
    /// The handshake's view of every export, with the current geometry.
    pub(crate) fn snapshot(&self) -> Snapshot {
        let t = self.table.read();
        // exports hidden from NBD clients now (see ExportAccess::visible)
        let shown: Vec<&Entry> = t
            .entries
            .iter()
            .filter(|e| e.state.access.as_ref().is_none_or(|a| a.visible()))
            .collect();
        let infos = shown
            .iter()
            .map(|e| {
                let g = e.state.volume.geometry();
                let preferred = g.block_size_bytes.max(512).next_power_of_two();
                ExportInfo {
                    name: e.name.clone(),
                    description: e.description.clone(),
                    size_bytes: g.size_bytes(),
                    transmission_flags: transmission_flags(e.state.read_only),
                    block_sizes: BlockSizes {
                        min_bytes: 1,
                        preferred_bytes: preferred,
                        max_bytes: self.limits.request_bytes_max.max(preferred),
                    },
                }
            })
            .collect();
        Snapshot {
            states: shown.iter().map(|e| e.state.clone()).collect(),
            infos,
            default_export: t
                .default_export
                .as_ref()
                .and_then(|d| shown.iter().position(|e| &e.name == d)),
        }
    }
}

/// Checks an export's name and description.
fn check_export(e: &NbdExport) -> io::Result<()> {
    if e.name.len() > STRING_BYTES_MAX || e.name.contains('\0') {
        return Err(invalid(format!(
            "export name {:?} is not a valid NBD string",
            e.name
        )));
    }
    if e.description.len() > STRING_BYTES_MAX || e.description.contains('\0') {
        return Err(invalid(format!(
            "description of {:?} is not a valid NBD string",
            e.name
        )));
    }
    Ok(())
}

impl Table {
    /// Adds `e`, sharing the range locks of any export of the same volume object.
    fn add(&mut self, e: NbdExport) -> io::Result<()> {
        check_export(&e)?;
        if self.entries.iter().any(|o| o.name == e.name) {
            return Err(invalid(format!("export name {:?} used twice", e.name)));
        }
        if self.entries.len() >= EXPORTS_MAX {
            return Err(invalid(format!("more than {EXPORTS_MAX} exports")));
        }
        // One lock table per volume object: a volume exported under two names
        // (`lun0` and `iqn.../lun0`) must serialize read-modify-write across both.
        let locks = self
            .entries
            .iter()
            .find(|o| same_object(&o.state.volume, &e.volume))
            .map(|o| o.state.locks.clone())
            .unwrap_or_default();
        self.entries.push(Entry {
            name: e.name,
            description: e.description,
            state: Arc::new(ExportState {
                access: e.access,
                ..ExportState::new(e.volume, e.read_only, locks)
            }),
        });
        Ok(())
    }
}

/// A handle that adds and removes exports while the server runs (cheap to clone).
#[derive(Clone)]
pub struct NbdExports {
    ctx: Arc<Ctx>,
}

impl std::fmt::Debug for NbdExports {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.names()).finish()
    }
}

impl NbdExports {
    /// Serves `e` to every client that connects from now on.
    pub fn add(&self, e: NbdExport) -> io::Result<()> {
        let name = e.name.clone();
        self.ctx.table.write().add(e)?;
        tracing::info!(export = %name, "NBD export added");
        Ok(())
    }

    /// Removes export `name`: new clients no longer see it, connected clients
    /// are disconnected (a request that races the removal is answered
    /// `ESHUTDOWN`), and this returns only once every request that had started
    /// on it has finished, so nothing reaches the volume through NBD afterwards.
    /// Returns false when there was no such export.
    pub async fn remove(&self, name: &str) -> bool {
        let entry = {
            let mut t = self.ctx.table.write();
            match t.entries.iter().position(|e| e.name == name) {
                Some(i) => t.entries.remove(i),
                None => return false,
            }
        };
        entry.state.retire().await;
        tracing::info!(export = %name, "NBD export removed");
        true
    }

    /// The exports served now, in order: name, size in bytes, read-only.
    pub fn list(&self) -> Vec<(String, u64, bool)> {
        self.ctx
            .table
            .read()
            .entries
            .iter()
            .map(|e| {
                (
                    e.name.clone(),
                    e.state.volume.geometry().size_bytes(),
                    e.state.read_only,
                )
            })
            .collect()
    }

    /// What clients did with each export served now, in order.
    pub fn stats(&self) -> Vec<(String, ExportStats)> {
        self.ctx
            .table
            .read()
            .entries
            .iter()
            .map(|e| (e.name.clone(), e.state.counters.snapshot()))
            .collect()
    }

    /// The names served now, in order.
    pub fn names(&self) -> Vec<String> {
        self.ctx
            .table
            .read()
            .entries
            .iter()
            .map(|e| e.name.clone())
            .collect()
    }
}

/// The transmission flags of an export.
pub fn transmission_flags(read_only: bool) -> u16 {
    let base = tflag::HAS_FLAGS | tflag::SEND_FLUSH | tflag::CAN_MULTI_CONN;
    if read_only {
        base | tflag::READ_ONLY
    } else {
        base | tflag::SEND_FUA | tflag::SEND_TRIM | tflag::SEND_WRITE_ZEROES
    }
}

/// An NBD server bound to its listening socket.
pub struct NbdServer {
    listener: TcpListener,
    local_addr: SocketAddr,
    ctx: Arc<Ctx>,
    shutdown_tx: watch::Sender<bool>,
}

fn invalid(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, msg)
}

fn check_config(cfg: &NbdConfig) -> io::Result<Table> {
    let l = &cfg.limits;
    if l.requests_in_flight_max == 0 || l.request_bytes_max < 4096 {
        return Err(invalid("NBD limits too small".into()));
    }
    // a structured reply's chunk carries its data and 8 bytes more in a u32
    if l.request_bytes_max > u32::MAX - 64 {
        return Err(invalid(format!(
            "NBD request_bytes_max {} leaves no room for a reply chunk's header",
            l.request_bytes_max
        )));
    }
    if l.in_flight_bytes_max < l.request_bytes_max as usize {
        return Err(invalid(
            "in_flight_bytes_max must be at least request_bytes_max".into(),
        ));
    }
    let mut table = Table::default();
    for e in &cfg.exports {
        table.add(e.clone())?;
    }
    if let Some(d) = &cfg.default_export {
        if !table.entries.iter().any(|e| &e.name == d) {
            return Err(invalid(format!("default export {d:?} does not exist")));
        }
    }
    table.default_export = cfg.default_export.clone();
    Ok(table)
}

/// True when two volume handles point at the same object (data pointers only:
/// vtable pointers of one type may differ between codegen units).
fn same_object(a: &VolumeRef, b: &VolumeRef) -> bool {
    std::ptr::eq(Arc::as_ptr(a) as *const (), Arc::as_ptr(b) as *const ())
}

/// How long a stopping server waits, after closing its connections, for the
/// requests they left running before its final flush of the volumes (on top
/// of the drain time: `freesan.service` gives the whole stop 2 minutes).
const STOPPED_REQUESTS_WAIT: Duration = Duration::from_secs(30);

impl NbdServer {
    /// Checks the configuration and binds the listening socket.
    pub async fn bind(cfg: NbdConfig) -> io::Result<NbdServer> {
        let table = check_config(&cfg)?;
        let listener = TcpListener::bind(cfg.listen).await?;
        let local_addr = listener.local_addr()?;
        let (shutdown_tx, shutdown) = watch::channel(false);
        let ctx = Arc::new(Ctx {
            table: parking_lot::RwLock::new(table),
            limits: cfg.limits,
            allowed_clients: cfg.allowed_clients.clone(),
            tls: cfg.tls.clone().map(Acceptor::from),
            shutdown,
            served: Arc::new(Semaphore::new(cfg.limits.connections_max.max(1))),
            served_per_source: PerSource::new(cfg.limits.connections_per_source_max),
            served_refusals: block::admission::LogGate::new(Duration::from_secs(1)),
        });
        Ok(NbdServer {
            listener,
            local_addr,
            ctx,
            shutdown_tx,
        })
    }

    /// The handle that adds and removes exports while the server runs.
    pub fn exports(&self) -> NbdExports {
        NbdExports {
            ctx: self.ctx.clone(),
        }
    }

    /// The bound address (port 0 resolved).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Serves until `shutdown` completes; then stops accepting, lets every
    /// connection finish its in-flight requests (within the drain timeout), closes
    /// them, waits for the requests still running (at most
    /// [`STOPPED_REQUESTS_WAIT`]) and flushes every export's volume.
    pub async fn run(self, shutdown: impl Future<Output = ()> + Send) -> io::Result<()> {
        // connections in their handshake: a newer one takes the place of an
        // older one when the bounds are reached (see `NbdLimits`); past it,
        // `Ctx::admit_served` bounds them
        let handshakes = AdmissionBudget::new(
            self.ctx.limits.handshakes_per_source_max,
            self.ctx.limits.handshakes_max,
        );
        let refusals = block::admission::LogGate::new(Duration::from_secs(1));
        let mut conns = JoinSet::new();
        tracing::info!(addr = %self.local_addr, exports = ?self.exports().names(),
            tls_required = self.ctx.tls.is_some(), "NBD server listening");
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                _ = &mut shutdown => break,
                acc = self.listener.accept() => match acc {
                    Ok((sock, peer)) => {
                        if !self.ctx.allowed_clients.iter().any(|r| r.contains(peer.ip())) {
                            if let Some(held_back) = refusals.allow() {
                                tracing::warn!(%peer, why = "address not in [nbd] allowed_clients",
                                    held_back, "NBD connection refused");
                            }
                            drop(sock);
                            continue;
                        }
                        let slot = handshakes.admit(peer.ip());
                        let ctx = self.ctx.clone();
                        conns.spawn(conn::serve(ctx, sock, peer, slot));
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "NBD accept failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                },
                Some(res) = conns.join_next(), if !conns.is_empty() => {
                    if let Err(e) = res {
                        if e.is_panic() {
                            tracing::error!("NBD connection task panicked: {e}");
                        }
                    }
                }
            }
        }
        tracing::info!("NBD server shutting down");
        drop(self.listener);
        self.shutdown_tx.send_replace(true);
        let grace =
            Duration::from_millis(self.ctx.limits.drain_timeout_ms) + Duration::from_secs(5);
        if tokio::time::timeout(grace, async { while conns.join_next().await.is_some() {} })
            .await
            .is_err()
        {
            tracing::warn!("NBD connections did not close in time; aborting them");
            conns.abort_all();
            while conns.join_next().await.is_some() {}
        }
        let served: Vec<(String, Arc<ExportState>)> = {
            let t = self.ctx.table.read();
            t.entries
                .iter()
                .map(|e| (e.name.clone(), e.state.clone()))
                .collect()
        };
        // a request whose connection was let go (its task aborted after the
        // drain time) may still run on a task of its own: the final flush
        // waits for it, or a write nobody was answered for could land after
        // it, on a volume its owner then stops (review of 2026-12-06)
        let deadline = tokio::time::Instant::now() + STOPPED_REQUESTS_WAIT;
        for (name, state) in &served {
            if tokio::time::timeout_at(deadline, state.retire())
                .await
                .is_err()
            {
                tracing::warn!(export = %name,
                    "NBD requests still running at shutdown: the final flush goes ahead without them");
            }
        }
        for (name, state) in served {
            if let Err(err) = state.volume.flush().await {
                tracing::warn!(export = %name, error = %err, "flush at NBD shutdown failed");
            }
        }
        Ok(())
    }
}
