//! The declarative configuration: one TOML file (or the quick command-line flags, or
//! the embedded default) describing portals, targets, LUNs, CHAP and ACLs.
//!
//! Every field is documented in `docs/config.md`; `examples/` holds complete files.

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

/// The default iSCSI port.
pub const DEFAULT_PORT: u16 = 3260;
/// The target name the quick flags and the embedded default use.
pub const DEFAULT_IQN: &str = "iqn.2026-11.org.freesan:storage";
/// The size of the embedded default LUN.
pub const DEFAULT_LUN_SIZE: &str = "16G";

/// The whole configuration of one node.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Where LUN identities, reservations and other state live; relative paths in
    /// this file are relative to the directory of the config file.
    pub data_dir: PathBuf,
    /// Listening addresses; every portal serves every target.
    #[serde(rename = "portal")]
    pub portals: Vec<PortalConfig>,
    /// Targets and their LUNs.
    #[serde(rename = "target")]
    pub targets: Vec<TargetConfig>,
    /// CHAP for discovery sessions (SendTargets); none by default.
    #[serde(default)]
    pub discovery_chap: Option<Chap>,
    /// Accept CHAP with MD5 or SHA-1 for discovery (`false`: initiators must
    /// offer SHA-256 or SHA3-256; see `[[target]] chap_md5`).
    #[serde(default = "default_true")]
    pub discovery_chap_md5: bool,
    /// Session and transfer limits.
    #[serde(default)]
    pub limits: LimitsConfig,
    /// Serve every LUN over NBD too.
    #[serde(default)]
    pub nbd: Option<NbdConfig>,
    /// The management API (REST + JSON) that `freesan pool ...` talks to.
    #[serde(default)]
    pub api: Option<ApiConfig>,
    /// Disks that pools are built from.
    #[serde(rename = "disk", default)]
    pub disks: Vec<DiskConfig>,
    /// RAID pools over the disks; a LUN serves a pool with `pool = NAME`.
    #[serde(rename = "pool", default)]
    pub pools: Vec<PoolConfig>,
    /// SSD caches in front of pools; a LUN serves a cache with `cache = NAME`.
    #[serde(rename = "cache", default)]
    pub caches: Vec<CacheConfig>,
    /// This node's place in a two-node HA pair; LUNs with `replicated = true`
    /// are kept identical on both nodes.
    #[serde(default)]
    pub cluster: Option<ClusterConfig>,
    /// Where the node's events (disk failed, partner lost, ...) are sent.
    #[serde(default)]
    pub alerts: AlertsConfig,
}

/// `[alerts]`: delivery of the node's events (see `docs/alerts.md`). Every
/// event is kept in `DATA_DIR/events.jsonl` whatever this says.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default)]
#[serde(deny_unknown_fields)]
pub struct AlertsConfig {
    /// URLs every event is POSTed to as JSON (http or https).
    #[serde(default)]
    pub webhook: Vec<String>,
    /// A file holding a shared secret (at least 16 bytes; surrounding white
    /// space is ignored): every webhook POST then carries an HMAC-SHA256 of
    /// its timestamp and body, so a receiver can tell the node's events from
    /// forged, altered or replayed ones (see `docs/alerts.md`).
    #[serde(default)]
    pub webhook_secret_file: Option<PathBuf>,
    /// Mail every event to these addresses.
    #[serde(default)]
    pub smtp: Option<SmtpConfig>,
    /// Least severity delivered: "info", "warning" (default) or "critical".
    #[serde(default)]
    pub min_severity: Option<String>,
    /// Events kept in the log (default 10000).
    #[serde(default)]
    pub log_events_max: Option<usize>,
}

/// `[alerts.smtp]`: the mail server events are sent through (Debug without
/// the password).
#[derive(Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SmtpConfig {
    /// `host:port` of the SMTP server.
    pub server: String,
    /// Sender address.
    pub from: String,
    /// Recipients.
    pub to: Vec<String>,
    /// Upgrade the connection with STARTTLS (required when true; default false:
    /// plain SMTP, for a relay on the same host).
    #[serde(default)]
    pub starttls: bool,
    /// Login name, if the server wants one (with `password`).
    #[serde(default)]
    pub username: Option<String>,
    /// Password for `username`.
    #[serde(default)]
    pub password: Option<String>,
}

impl std::fmt::Debug for SmtpConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SmtpConfig")
            .field("server", &self.server)
            .field("from", &self.from)
            .field("to", &self.to)
            .field("starttls", &self.starttls)
            .field("username", &self.username)
            .field(
                "password",
                &self.password.as_ref().map(|_| crate::secrets::MASK),
            )
            .finish()
    }
}

/// The HA pair this node belongs to.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ClusterConfig {
    /// Name of the pair (the same on both nodes; the witness keeps one grant per
    /// replicated LUN of it).
    pub name: String,
    /// This node: 1 or 2.
    pub node_id: u8,
    /// The node that survives a split when no witness is configured, and leads
    /// when both copies are equal.
    #[serde(default = "default_preferred")]
    pub preferred_node: u8,
    /// This node's sync addresses (the partner connects to them).
    pub sync: Vec<SocketAddr>,
    /// The partner's sync addresses, in order of preference (one per sync link).
    pub peer_sync: Vec<SocketAddr>,
    /// The partner's iSCSI portals, in its `[[portal]]` order: they form the
    /// partner's ALUA port group in REPORT TARGET PORT GROUPS.
    #[serde(default)]
    pub peer_portals: Vec<SocketAddr>,
    /// The witness (`freesan witness`) that breaks ties; without one the
    /// preferred node survives a split.
    #[serde(default)]
    pub witness: Option<SocketAddr>,
    /// Interval between heartbeats on the sync link.
    #[serde(default = "default_heartbeat_ms")]
    pub heartbeat_interval_ms: u64,
    /// Silence after which the partner counts as lost (failover time).
    #[serde(default = "default_peer_timeout_ms")]
    pub peer_timeout_ms: u64,
    /// Bytes tracked by one bit of the dirty bitmap (`64K`).
    #[serde(default)]
    pub region: Option<String>,
    /// Heartbeats with the partner over the client-facing networks too: UDP on
    /// this node's portal addresses to `peer_portals` (portal i with portal i),
    /// shown in `freesan replica status`; a node that stops after losing the sync
    /// links says whether the partner still answers there.
    #[serde(default = "default_true")]
    pub client_heartbeats: bool,
    /// This node's cluster key file (made by `freesan cluster init`): every sync
    /// link, heartbeat and witness exchange is authenticated and encrypted with it.
    pub key_file: PathBuf,
    /// Encrypt the sync links (default). `false` on a dedicated sync network:
    /// records stay authenticated (tampering, replay and forgery are refused)
    /// but travel in the clear. Both nodes must agree.
    #[serde(default = "default_true")]
    pub encrypt: bool,
}

fn default_true() -> bool {
    true
}

fn default_preferred() -> u8 {
    1
}

fn default_heartbeat_ms() -> u64 {
    250
}

fn default_peer_timeout_ms() -> u64 {
    1500
}

/// An SSD cache over a pool (or a disk), on configured disks.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct CacheConfig {
    /// Cache name (LUNs refer to it).
    pub name: String,
    /// The pool it caches.
    #[serde(default)]
    pub pool: Option<String>,
    /// Or a disk it caches.
    #[serde(default)]
    pub disk: Option<String>,
    /// `read-only` (default), `write-through`, `write-around` or `write-back`.
    #[serde(default)]
    pub mode: Option<String>,
    /// Cache devices, by disk name: two for write-back (mirrored), one or more
    /// (striped) for the other modes.
    pub devices: Vec<String>,
    /// Use at most this much of the devices for cached data (`1G`); default all.
    #[serde(default)]
    pub size: Option<String>,
    /// Cache block size (`128K` default; 4K..256K).
    #[serde(default)]
    pub block_size: Option<String>,
    /// Eviction policy: `s3fifo` (default), `lru`, `fifo`, `sieve`, `2q`.
    #[serde(default)]
    pub policy: Option<String>,
    /// Admission: `second-miss` (default) or `all`.
    #[serde(default)]
    pub admission: Option<String>,
    /// Sequential streams longer than this bypass (`4M` default; `0` never).
    #[serde(default)]
    pub sequential_cutoff: Option<String>,
    /// Destage only when idle below this share of dirty blocks (default 10).
    #[serde(default)]
    pub dirty_low_percent: Option<u8>,
    /// Destage at full speed above this share (default 60).
    #[serde(default)]
    pub dirty_high_percent: Option<u8>,
    /// Serve the LUNs that name this cache through it from the start (default);
    /// `false` starts them on the backing (a write-back cache left dirty by a crash
    /// is destaged first) until `freesan cache attach NAME`.
    #[serde(default = "yes")]
    pub attached: bool,
}

/// A disk: a file or block device, or a simulated HDD/SSD whose data lives in a
/// sparse file (so it survives restarts) and whose timing is modelled.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct DiskConfig {
    /// Name pools refer to.
    pub name: String,
    /// The file or block device; for a simulated disk, where its data is kept
    /// (default `DATA_DIR/disks/NAME.img`).
    #[serde(default)]
    pub path: Option<PathBuf>,
    /// Where `path` led (links resolved) when the API's allowed-path check
    /// approved it, for a disk created through the API: its open must reach
    /// that file (a link swapped in between is refused). Never in a file.
    #[serde(skip)]
    pub resolved: Option<PathBuf>,
    /// Size with which a missing file is created (`4G`).
    #[serde(default)]
    pub size: Option<String>,
    /// Simulate a device: `{ model = "hdd" }` or `{ model = "ssd" }` plus any model
    /// parameter (`rpm`, `full_stroke_seek_ms`, `dies`, `read_latency_us`, ...).
    #[serde(default)]
    pub sim: Option<disk::SimDiskConfig>,
    /// Keep the data in memory instead of `path` (needs `size`; allocated and
    /// touched at start; the data is gone when the node stops). For benchmarks of
    /// simulated disks on small machines, where writing every member's data to
    /// files, or faulting in fresh pages, costs more CPU than the experiment.
    #[serde(default)]
    pub memory: bool,
    /// Command timeout in seconds: a read or write with no answer in this
    /// time (a flush: ten times it) fails the disk, so its pool or cache
    /// goes on without it instead of waiting with it (default 20, below the
    /// initiators' 30 s; 0: wait as long as the disk does).
    #[serde(default)]
    pub io_timeout_secs: Option<u32>,
}

impl DiskConfig {
    /// The command timeout (`io_timeout_secs`, default
    /// [`disk::IO_TIMEOUT_DEFAULT`]); `None` for 0 (no timeout).
    pub fn io_timeout(&self) -> Option<std::time::Duration> {
        match self.io_timeout_secs {
            None => Some(disk::IO_TIMEOUT_DEFAULT),
            Some(0) => None,
            Some(s) => Some(std::time::Duration::from_secs(s.into())),
        }
    }
}

/// Largest `[[pool]] journal_mib`: 1 GiB of ring per member.
pub const JOURNAL_MIB_MAX: u64 = 1024;

/// A RAID pool over configured disks.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct PoolConfig {
    /// Pool name (LUNs refer to it).
    pub name: String,
    /// `raid0`, `raid1`, `raid5`, `raid6`, `raid10`, `raid10-far` or `raidf1`.
    pub level: String,
    /// Chunk (strip) size, e.g. `256K`; default chosen by the raid layer.
    #[serde(default)]
    pub chunk: Option<String>,
    /// Member disks, by name, in order.
    pub members: Vec<String>,
    /// Hot spares, by name.
    #[serde(default)]
    pub spares: Vec<String>,
    /// Cap on rebuild and resync throughput in MB/s (foreground I/O keeps priority
    /// below it as well).
    #[serde(default)]
    pub rebuild_rate_mb_s: Option<u32>,
    /// Assemble even if the members' generations disagree (takes the newest set).
    #[serde(default)]
    pub force_assemble: bool,
    /// RAID 5/6: journal whole-stripe writes as well as partial ones. Blocks
    /// under a write in flight at a crash then read as old or new even when a
    /// member is lost before the post-crash resync ends; costs twice the write
    /// traffic for sequential writes. Default off (like md's write-intent bitmap).
    #[serde(default)]
    pub journal_whole_stripes: bool,
    /// RAID 5/6/F1: acknowledge a small write once its new data is journaled,
    /// before the read-modify-write (deeper disk queues: faster small random
    /// writes on NCQ disks). Default: on, except for a pool a `[[cache]]`
    /// sits in front of (its misses are reads that would wait behind the deep
    /// queues). See docs/0002-raid.md, "Data first".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_first: Option<bool>,
    /// RAID 5/6/F1: a `[[disk]]` (an SSD) that holds the stripe journal instead
    /// of the members, as md's write journal does: small writes then wait for
    /// one SSD write instead of a ring write on the HDDs. Given at creation;
    /// the pool then refuses to assemble without it (unless `force_assemble`,
    /// which gives up the records it held). See docs/0002-raid.md.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub journal_device: Option<String>,
    /// A second `[[disk]]` mirroring `journal_device`: every journal write goes
    /// to both, so the loss of either SSD loses no acknowledged write; the pool
    /// assembles with either one (a failed one is left out and named in the
    /// pool's status).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub journal_device_mirror: Option<String>,
    /// RAID 5/6/F1: the stripe journal's ring in MiB, on each member (or on
    /// the journal devices). Given at creation; an existing pool keeps its
    /// own. Default: 64 where that is at most an eighth of the smallest
    /// member and the journal devices hold it (any real disk), else 16 (see
    /// docs/0002-raid.md, "Ring size").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub journal_mib: Option<u64>,
}

impl PoolConfig {
    /// The journal devices configured: `journal_device`, then its mirror.
    pub fn journal_devices(&self) -> Vec<String> {
        self.journal_device
            .iter()
            .chain(self.journal_device_mirror.iter())
            .cloned()
            .collect()
    }
}

/// Where the management API listens and whom it answers. Every request needs a
/// bearer token (`freesan api token create`); see docs/security.md.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ApiConfig {
    /// `IP:PORT`; `freesan pool` uses 127.0.0.1:8260 unless told otherwise.
    pub address: SocketAddr,
    /// Listen on a non-loopback address: off by default.
    #[serde(default)]
    pub allow_remote: bool,
    /// Host names clients may reach the API by (the `Host` header), besides IP
    /// literals and `localhost`; any other name is refused (DNS rebinding).
    #[serde(default)]
    pub hosts: Vec<String>,
    /// Open API connections in total.
    #[serde(default = "default_api_connections_max")]
    pub connections_max: usize,
    /// Open API connections from one source address.
    #[serde(default = "default_api_connections_per_source_max")]
    pub connections_per_source_max: usize,
    /// Time a client has to send a request's headers (and a kept-alive
    /// connection may stay idle).
    #[serde(default = "default_api_header_read_timeout_ms")]
    pub header_read_timeout_ms: u64,
    /// Speak TLS (rustls). Default: on for a non-loopback address, off on
    /// loopback (where only local users can reach it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<bool>,
    /// The certificate chain (PEM) to serve; default: one made at first start
    /// in `DATA_DIR/api/tls-cert.pem`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cert: Option<PathBuf>,
    /// The certificate's private key (PEM); given together with `cert`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<PathBuf>,
    /// Folders (or exact devices) that disks and LUNs created through the API
    /// may use; default: the data directory.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allowed_paths: Vec<PathBuf>,
    /// `IP:PORT` of the web console's own listener: the console's pages without
    /// a token and the same API routes behind the same tokens, TLS and bounds.
    /// None: no console.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub console: Option<SocketAddr>,
}

fn default_api_connections_max() -> usize {
    api::ApiLimits::default().connections_max
}

fn default_api_connections_per_source_max() -> usize {
    api::ApiLimits::default().connections_per_source_max
}

fn default_api_header_read_timeout_ms() -> u64 {
    api::ApiLimits::default().header_read_timeout_ms
}

impl ApiConfig {
    /// The API on `address` (loopback only unless told otherwise) with default bounds.
    pub fn on(address: SocketAddr) -> ApiConfig {
        ApiConfig {
            address,
            allow_remote: false,
            hosts: Vec::new(),
            connections_max: default_api_connections_max(),
            connections_per_source_max: default_api_connections_per_source_max(),
            header_read_timeout_ms: default_api_header_read_timeout_ms(),
            tls: None,
            cert: None,
            key: None,
            allowed_paths: Vec::new(),
            console: None,
        }
    }

    /// Whether the API (and its console) speaks TLS: `tls` if set, else when
    /// either listens off loopback (the console shares the API's TLS setting:
    /// a console reached over the network must not carry logins in clear,
    /// even with the API itself on loopback).
    pub fn tls_enabled(&self) -> bool {
        self.tls.unwrap_or(
            !self.address.ip().is_loopback() || self.console.is_some_and(|c| !c.ip().is_loopback()),
        )
    }

    /// The bounds the API server applies.
    pub fn limits(&self) -> api::ApiLimits {
        api::ApiLimits {
            connections_max: self.connections_max,
            connections_per_source_max: self.connections_per_source_max,
            header_read_timeout_ms: self.header_read_timeout_ms,
            ..api::ApiLimits::default()
        }
    }
}

/// The NBD frontend: every LUN as an export named `lunN` (LUNs of the first target)
/// and `IQN/lunN` (every target); an empty export name means `lun0`. Exports follow
/// LUNs created and deleted at run time.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct NbdConfig {
    /// `IP:PORT` to listen on (NBD's port is 10809).
    pub address: SocketAddr,
    /// Listen on a non-loopback address (then `allowed_clients` must name the
    /// clients): off by default.
    pub allow_remote: bool,
    /// Client addresses or CIDR ranges served (`"10.0.0.0/24"`, `"::1"`); every
    /// other connection is closed at accept. Default: loopback only.
    pub allowed_clients: Vec<String>,
    /// NBD connections served at once.
    pub connections_max: usize,
    /// NBD connections served at once from one client address.
    pub connections_per_source_max: usize,
    /// Time from accept to the end of option haggling (TLS included).
    pub handshake_timeout_ms: u64,
    /// `"require"`: clients must start TLS (`NBD_OPT_STARTTLS`) before anything
    /// else is answered; `"off"`: plaintext only. Default: require on a
    /// non-loopback address, off on loopback.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls: Option<NbdTls>,
    /// The certificate chain (PEM) served with TLS; default: one made at first
    /// start, `DATA_DIR/nbd/server-cert.pem`, signed by `DATA_DIR/nbd/ca-cert.pem`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls_cert: Option<PathBuf>,
    /// The certificate's private key (PEM); given together with `tls_cert`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls_key: Option<PathBuf>,
    /// CA certificates (PEM): when set, every client must present a certificate
    /// signed by one of them (X.509 client authentication).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls_client_ca: Option<PathBuf>,
    /// TLS with pre-shared keys instead of a certificate: a file of
    /// `identity:hexkey` lines (qemu's `keys.psk`, made by GnuTLS `psktool`),
    /// mode 0600. Needs a build with the `nbd-psk` feature (OpenSSL).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls_psk_file: Option<PathBuf>,
}

/// `[nbd] tls`.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum NbdTls {
    /// Plaintext only: `NBD_OPT_STARTTLS` is answered `NBD_REP_ERR_UNSUP`.
    Off,
    /// TLS before anything else (`NBD_REP_ERR_TLS_REQD` until then).
    Require,
}

impl Default for NbdConfig {
    fn default() -> Self {
        let d = nbd::NbdLimits::default();
        NbdConfig {
            address: SocketAddr::from(([127, 0, 0, 1], nbd::NBD_DEFAULT_PORT)),
            allow_remote: false,
            allowed_clients: vec!["127.0.0.0/8".into(), "::1".into()],
            connections_max: d.connections_max,
            connections_per_source_max: d.connections_per_source_max,
            handshake_timeout_ms: d.handshake_timeout_ms,
            tls: None,
            tls_cert: None,
            tls_key: None,
            tls_client_ca: None,
            tls_psk_file: None,
        }
    }
}

impl NbdConfig {
    /// NBD on `address` with the defaults (loopback clients only).
    pub fn on(address: SocketAddr) -> NbdConfig {
        NbdConfig {
            address,
            ..NbdConfig::default()
        }
    }

    /// Whether clients must use TLS: `tls` if set, else on off loopback.
    pub fn tls_required(&self) -> bool {
        match self.tls {
            Some(t) => t == NbdTls::Require,
            None => !self.address.ip().is_loopback(),
        }
    }

    /// The allowed client ranges, parsed.
    pub fn allowed_ranges(&self) -> Result<Vec<nbd::IpRange>> {
        self.allowed_clients
            .iter()
            .map(|s| {
                s.parse()
                    .map_err(|e: String| anyhow::anyhow!("[nbd] allowed_clients: {e}"))
            })
            .collect()
    }

    /// The bounds the NBD server applies.
    pub fn limits(&self) -> nbd::NbdLimits {
        nbd::NbdLimits {
            connections_max: self.connections_max,
            connections_per_source_max: self.connections_per_source_max,
            handshake_timeout_ms: self.handshake_timeout_ms,
            ..nbd::NbdLimits::default()
        }
    }

    /// Checks the section as a start would.
    fn check(&self) -> Result<()> {
        let ranges = self.allowed_ranges()?;
        if !self.address.ip().is_loopback() && !self.allow_remote {
            bail!(
                "NBD address {} is not on loopback: set allow_remote = true and \
                 allowed_clients in [nbd] to serve LUNs there on purpose (see docs/security.md)",
                self.address
            );
        }
        if self.allow_remote && ranges.iter().all(nbd::IpRange::is_loopback) {
            bail!("[nbd] allow_remote = true needs allowed_clients naming the remote clients");
        }
        if self.connections_max == 0
            || self.connections_per_source_max == 0
            || self.handshake_timeout_ms == 0
        {
            bail!("[nbd]: connections_max, connections_per_source_max and handshake_timeout_ms must be above 0");
        }
        if self.tls_cert.is_some() != self.tls_key.is_some() {
            bail!("[nbd]: give tls_cert and tls_key together (or neither, for a generated certificate)");
        }
        if !self.tls_required() && (self.tls_cert.is_some() || self.tls_client_ca.is_some()) {
            bail!("[nbd]: tls_cert, tls_key and tls_client_ca need tls = \"require\"");
        }
        if self.tls_psk_file.is_some() {
            if !self.tls_required() {
                bail!("[nbd]: tls_psk_file needs tls = \"require\"");
            }
            if self.tls_cert.is_some() || self.tls_client_ca.is_some() {
                bail!("[nbd]: tls_psk_file replaces certificates: give it without tls_cert, tls_key and tls_client_ca");
            }
        }
        Ok(())
    }
}

/// One listening address.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct PortalConfig {
    /// `IP:PORT` (IPv6 as `[addr]:port`).
    pub address: SocketAddr,
    /// Serve targets without CHAP on this portal although it is not a loopback
    /// address. Off by default: an open portal on a network is an explicit choice.
    #[serde(default)]
    pub allow_without_chap: bool,
}

/// CHAP credentials (user name and secret, 12 to 16 characters recommended by RFC 7143).
/// Debug shows the name, never the secret (a configuration printed in a log
/// line or an error would carry it).
#[derive(Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Chap {
    /// CHAP name.
    pub user: String,
    /// CHAP secret.
    pub secret: String,
}

impl std::fmt::Debug for Chap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Chap")
            .field("user", &self.user)
            .field("secret", &crate::secrets::MASK)
            .finish()
    }
}

/// The CHAP credentials of one initiator on one target (Debug without the secret).
#[derive(Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ChapInitiator {
    /// The InitiatorName these credentials belong to.
    pub initiator: String,
    /// CHAP name.
    pub user: String,
    /// CHAP secret (12 to 255 characters).
    pub secret: String,
}

impl std::fmt::Debug for ChapInitiator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChapInitiator")
            .field("initiator", &self.initiator)
            .field("user", &self.user)
            .field("secret", &crate::secrets::MASK)
            .finish()
    }
}

/// One iSCSI target.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct TargetConfig {
    /// The target's iSCSI qualified name.
    pub iqn: String,
    /// Optional TargetAlias.
    #[serde(default)]
    pub alias: Option<String>,
    /// Initiators must log in with these credentials (one-way CHAP).
    #[serde(default)]
    pub chap: Option<Chap>,
    /// The target proves itself to initiators with these (mutual CHAP; needs `chap`
    /// or `chap_initiator`).
    #[serde(default)]
    pub mutual_chap: Option<Chap>,
    /// CHAP credentials per initiator name (`[[target.chap_initiator]]`): a listed
    /// initiator must log in with its own, not with `chap`; any entry makes CHAP
    /// required on the target.
    #[serde(
        rename = "chap_initiator",
        default,
        skip_serializing_if = "Vec::is_empty"
    )]
    pub chap_initiators: Vec<ChapInitiator>,
    /// Accept CHAP with MD5 (CHAP_A=5), the only algorithm many initiators
    /// have, and SHA-1 (6). `false`: an initiator must offer SHA-256 or
    /// SHA3-256, so that a man in the middle cannot strip them from the offer
    /// and record a weaker exchange to guess the secret offline.
    #[serde(default = "default_true")]
    pub chap_md5: bool,
    /// Initiator names allowed to log in; empty allows every initiator.
    #[serde(default)]
    pub allowed_initiators: Vec<String>,
    /// LUN masking (`[[target.host_group]]`): with any group, an initiator sees only
    /// its group's LUNs, numbered as the group maps them, and one in no group sees
    /// none. Without groups every admitted initiator sees every LUN.
    #[serde(rename = "host_group", default, skip_serializing_if = "Vec::is_empty")]
    pub host_groups: Vec<HostGroupConfig>,
    /// Logical units, numbered from 0 in order unless `id` is given.
    #[serde(rename = "lun", default)]
    pub luns: Vec<LunConfig>,
}

impl TargetConfig {
    /// The LUN numbered `id` (a LUN without an `id` is numbered by its place).
    pub fn lun(&self, id: u64) -> Option<&LunConfig> {
        self.luns
            .iter()
            .enumerate()
            .find(|(i, l)| l.id.unwrap_or(*i as u64) == id)
            .map(|(_, l)| l)
    }
}

/// One host group of a target: who (initiator names, CHAP names) sees which LUNs.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct HostGroupConfig {
    /// Name of the group.
    pub name: String,
    /// Initiator names (IQNs) in the group.
    #[serde(default)]
    pub initiators: Vec<String>,
    /// CHAP names in the group: a session whose login proved one of these names
    /// belongs here whatever initiator name it gives.
    #[serde(default)]
    pub chap_users: Vec<String>,
    /// The LUNs the group sees: `{ lun = 3 }` shows LUN 3 as LUN 3, `{ lun = 3, as =
    /// 0 }` shows it as LUN 0.
    #[serde(default)]
    pub luns: Vec<HostGroupLun>,
}

/// One LUN of a host group.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct HostGroupLun {
    /// The target's LUN.
    pub lun: u64,
    /// The number the group's initiators see it under (default: `lun`).
    #[serde(rename = "as", default, skip_serializing_if = "Option::is_none")]
    pub seen_as: Option<u64>,
}

impl HostGroupConfig {
    /// The group as the SCSI target applies it.
    pub fn to_scsi(&self) -> scsi::HostGroup {
        scsi::HostGroup {
            name: self.name.clone(),
            initiators: self.initiators.clone(),
            chap_users: self.chap_users.clone(),
            luns: self
                .luns
                .iter()
                .map(|l| (l.seen_as.unwrap_or(l.lun), l.lun))
                .collect(),
        }
    }
}

/// One logical unit backed by a file or a block device.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct LunConfig {
    /// LUN number; defaults to the position in the list.
    #[serde(default)]
    pub id: Option<u64>,
    /// Backing file or block device (or give `pool`).
    #[serde(default)]
    pub path: Option<PathBuf>,
    /// Where `path` led (links resolved) when the API's allowed-path check
    /// approved it, for a LUN created through the API: its open must reach
    /// that file (a link swapped in between is refused). Never in a file.
    #[serde(skip)]
    pub resolved: Option<PathBuf>,
    /// Serve the whole usable space of this `[[pool]]` (instead of `path`).
    #[serde(default)]
    pub pool: Option<String>,
    /// Serve one configured `[[disk]]` directly, no RAID (instead of `path`).
    #[serde(default)]
    pub disk: Option<String>,
    /// Serve a configured `[[cache]]` (the pool or disk behind its SSD cache).
    #[serde(default)]
    pub cache: Option<String>,
    /// Size with which a missing file is created (`4G`, `512M`, `16GiB`); required
    /// when the file does not exist.
    #[serde(default)]
    pub size: Option<String>,
    /// Preallocate a newly created file (thick) instead of leaving it sparse (thin).
    #[serde(default)]
    pub thick: bool,
    /// Serve the LUN write protected.
    #[serde(default)]
    pub read_only: bool,
    /// Open with O_DSYNC: every write is durable before it is acknowledged and the
    /// LUN reports no volatile write cache (WCE=0).
    #[serde(default)]
    pub sync_writes: bool,
    /// Logical block size in bytes (512 or 4096).
    #[serde(default = "default_block_size")]
    pub block_size: u32,
    /// NAA designator override (32 hex digits), e.g. to give two HA nodes one identity.
    /// Without it an identity is generated once and kept in the data directory.
    #[serde(default)]
    pub naa: Option<String>,
    /// Serial number override.
    #[serde(default)]
    pub serial: Option<String>,
    /// Replicate this LUN synchronously to the partner of `[cluster]` (which must
    /// configure the same LUN); its identity then derives from the cluster name,
    /// target and LUN number, the same on both nodes.
    #[serde(default)]
    pub replicated: bool,
    /// `active-active` (both nodes serve, the default) or `active-passive`.
    #[serde(default)]
    pub replica_mode: Option<String>,
    /// Thin provisioning soft threshold, in percent (1-100) of the space the LUN
    /// can reach (its size, or less when its file system holds less): crossing it
    /// raises THIN PROVISIONING SOFT THRESHOLD REACHED to the initiators and an
    /// event. Only for thin (sparse file) LUNs.
    #[serde(default)]
    pub thin_threshold_percent: Option<u8>,
    /// Accept SCSI WRITE ATOMIC(16) (Linux's RWF_ATOMIC, databases' torn-page
    /// protection): each such write keeps a record in `lunN.atomic` in the data
    /// directory until it is in place. Not for replicated or read-only LUNs.
    #[serde(default = "default_true")]
    pub atomic_writes: bool,
    /// Physical block size reported to initiators (READ CAPACITY(16)), in bytes: a
    /// power of two, at least the LUN's block size, at most 2^15 blocks. 4096 on
    /// 512-byte blocks makes a "512e" LUN, for backing storage with 4 KiB sectors
    /// (initiators then align partitions and I/O to 4 KiB). Default: the block size.
    #[serde(default)]
    pub physical_block_size: Option<u32>,
    /// SANITIZE OVERWRITE's pace, in MiB a second (0: as fast as the storage
    /// takes it): wiping one LU leaves the pool's bandwidth to the others.
    #[serde(default = "default_sanitize_rate_mib_s")]
    pub sanitize_rate_mib_s: u64,
}

fn default_block_size() -> u32 {
    512
}

/// The largest `sanitize_rate_mib_s` (1 TiB/s: beyond any disk, and far
/// below the 2^63 a TOML integer ends at).
pub const SANITIZE_RATE_MIB_S_MAX: u64 = 1 << 20;

fn default_sanitize_rate_mib_s() -> u64 {
    256
}

/// Limits that bound memory and work per session.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct LimitsConfig {
    /// Normal sessions the node accepts at once (discovery sessions have their own caps).
    pub sessions_max: usize,
    /// Normal sessions from one source address (an IPv6 /64 counts as one).
    pub sessions_per_source_max: usize,
    /// Discovery sessions at once; a new one closes the oldest of the source holding most.
    pub discovery_sessions_max: usize,
    /// Discovery sessions from one source address; a new one closes that source's oldest.
    pub discovery_sessions_per_source_max: usize,
    /// Connections in login at once, apart from sessions; when all are used the
    /// source holding the most gives up its oldest idle one.
    pub logins_in_progress_max: usize,
    /// Connections in login from one source address; a new one replaces that
    /// source's oldest idle one.
    pub logins_in_progress_per_source_max: usize,
    /// A new connection must send its first Login Request within this time.
    pub login_first_pdu_timeout_ms: u64,
    /// Longest whole login phase.
    pub login_timeout_ms: u64,
    /// Failed authentications from one address within `auth_failure_window_ms`
    /// after which that address is locked out.
    pub auth_failures_per_source_max: u32,
    /// Period over which failed authentications are counted.
    pub auth_failure_window_ms: u64,
    /// How long a locked-out address's connections are closed at once.
    pub auth_lockout_ms: u64,
    /// Most addresses whose failures are remembered.
    pub auth_failure_sources_max: usize,
    /// Commands in flight per session (the CmdSN window).
    pub commands_in_flight_per_session_max: u32,
    /// Largest data segment the target accepts in one PDU.
    pub max_recv_data_segment_bytes: u32,
    /// Idle time after which the target pings a connection with NOP-In.
    pub nop_in_interval_ms: u64,
    /// Time without an answer to a ping after which the connection is dropped;
    /// also the longest an iSCSI connection may take none of the data queued
    /// for it before it is dropped (0: never).
    pub nop_in_timeout_ms: u64,
    /// The node's bound on buffered data bytes (`"512M"`, `"2G"`): read data
    /// waiting for slow clients (iSCSI and NBD), iSCSI Data-Out, resync copies
    /// (see docs/security.md "Memory"). A client that would go beyond it is not
    /// read from until bytes come back. Default (unset): 1/8 of the RAM (or
    /// of the cgroup's memory limit when less), at least 64 MiB, at most 2 GiB.
    pub buffer_memory_max: Option<String>,
    /// The most of `buffer_memory_max` one session (an iSCSI session, an NBD
    /// connection) may hold (a size). A session at it waits on its own; the
    /// others go on. Default (unset): an eighth of `buffer_memory_max` (half
    /// of a source's default share), at least 32 MiB (the largest command),
    /// at most `source_buffer_max`.
    pub session_buffer_max: Option<String>,
    /// The most of `buffer_memory_max` the sessions of one source address
    /// hold together (a size, at least `session_buffer_max`). Default (unset):
    /// a quarter of `buffer_memory_max` or `session_buffer_max` if that is
    /// set larger, at least 32 MiB, at most all of it.
    pub source_buffer_max: Option<String>,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        let d = iscsi::Limits::default();
        LimitsConfig {
            sessions_max: d.sessions_max,
            sessions_per_source_max: d.sessions_per_source_max,
            discovery_sessions_max: d.discovery_sessions_max,
            discovery_sessions_per_source_max: d.discovery_sessions_per_source_max,
            logins_in_progress_max: d.logins_in_progress_max,
            logins_in_progress_per_source_max: d.logins_in_progress_per_source_max,
            login_first_pdu_timeout_ms: d.login_first_pdu_timeout_ms,
            login_timeout_ms: d.login_timeout_ms,
            auth_failures_per_source_max: d.auth_failures_per_source_max,
            auth_failure_window_ms: d.auth_failure_window_ms,
            auth_lockout_ms: d.auth_lockout_ms,
            auth_failure_sources_max: d.auth_failure_sources_max,
            commands_in_flight_per_session_max: d.commands_in_flight_per_session_max,
            max_recv_data_segment_bytes: d.max_recv_data_segment_bytes,
            nop_in_interval_ms: d.nop_in_interval_ms,
            nop_in_timeout_ms: d.nop_in_timeout_ms,
            buffer_memory_max: None,
            session_buffer_max: None,
            source_buffer_max: None,
        }
    }
}

/// A size of `[limits]` (`"512M"`, `"2G"`): `default` when unset, else the
/// size given, which must lie `within` (`why` says what that is).
fn size_limit(
    key: &str,
    value: &Option<String>,
    default: u64,
    within: std::ops::RangeInclusive<u64>,
    why: &str,
) -> Result<u64> {
    let Some(s) = value else {
        return Ok(default);
    };
    match disk::parse_size(s) {
        Some(b) if within.contains(&b) => Ok(b),
        Some(_) => bail!("[limits] {key} = {s:?}: {why}"),
        None => bail!("[limits] {key} = {s:?} is not a size (like 512M or 2G)"),
    }
}

/// The default of `[limits] buffer_memory_max`: 1/8 of `ram_bytes`, clamped to
/// 64 MiB..=2 GiB.
pub fn default_buffer_memory_bytes(ram_bytes: u64) -> u64 {
    (ram_bytes / 8).clamp(64 << 20, 2 << 30)
}

/// The memory this process may use in bytes: the machine's RAM, or its
/// cgroup's limit when that is less (a service with `MemoryMax=`, a
/// container), so the default bound is a share of what the node really has
/// rather than of a RAM it would be killed long before filling (0 when it
/// cannot be told).
fn ram_bytes() -> u64 {
    // SAFETY: sysconf only reads system parameters.
    let (pages, page) = unsafe {
        (
            libc::sysconf(libc::_SC_PHYS_PAGES),
            libc::sysconf(libc::_SC_PAGESIZE),
        )
    };
    if pages <= 0 || page <= 0 {
        return 0;
    }
    let ram = (pages as u64).saturating_mul(page as u64);
    let cgroups = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    match cgroup_memory_limit(&cgroups, &mounts) {
        Some(limit) => ram.min(limit),
        None => ram,
    }
}

/// The smallest memory limit on the way from the top of each mounted cgroup
/// hierarchy down to this process's cgroup in it: `memory.max` (cgroup v2)
/// or `memory.limit_in_bytes` (v1's memory controller). `proc_cgroup` is
/// `/proc/self/cgroup`, `mountinfo` is `/proc/self/mountinfo`: a mount shows
/// the hierarchy from its root (a container's mount starts at the
/// container's own cgroup), so the process's directory is the mount point
/// joined with its cgroup path less that root, and the walk up stops at the
/// mount point. Before, the path was joined to `/sys/fs/cgroup` and each
/// ancestor tried, which inside a nested container could read a cgroup the
/// process is not in. None: no limit.
fn cgroup_memory_limit(proc_cgroup: &str, mountinfo: &str) -> Option<u64> {
    let mounts: Vec<CgroupMount> = mountinfo.lines().filter_map(CgroupMount::parse).collect();
    let mut least: Option<u64> = None;
    for line in proc_cgroup.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(_), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        let v2 = controllers.is_empty();
        if !v2 && !controllers.split(',').any(|c| c == "memory") {
            continue;
        }
        let file = if v2 {
            "memory.max"
        } else {
            "memory.limit_in_bytes"
        };
        for m in mounts.iter().filter(|m| m.v2 == v2 && (v2 || m.memory)) {
            let Some(below) = m.below_root(path) else {
                continue;
            };
            let mut at = Some(below.as_path());
            while let Some(p) = at {
                let limit = std::fs::read_to_string(m.point.join(p).join(file))
                    .ok()
                    .and_then(|v| v.trim().parse::<u64>().ok())
                    // v1 says "no limit" with a number near 2^63; v2 with "max"
                    .filter(|&v| v < 1 << 60);
                if let Some(l) = limit {
                    least = Some(least.map_or(l, |m| m.min(l)));
                }
                at = p.parent();
            }
        }
    }
    least
}

/// A cgroup file system's mount, from a line of `/proc/self/mountinfo`.
struct CgroupMount {
    /// Where in the hierarchy the mount starts.
    root: PathBuf,
    /// Where it is mounted.
    point: PathBuf,
    /// cgroup2 (else v1's `cgroup`).
    v2: bool,
    /// A v1 mount that holds the memory controller.
    memory: bool,
}

impl CgroupMount {
    fn parse(line: &str) -> Option<Self> {
        // id parent major:minor root point options [optional...] - type source super
        let (left, right) = line.split_once(" - ")?;
        let fields: Vec<&str> = left.split(' ').collect();
        let (root, point) = (fields.get(3)?, fields.get(4)?);
        let mut right = right.split(' ');
        let v2 = match right.next()? {
            "cgroup2" => true,
            "cgroup" => false,
            _ => return None,
        };
        let memory = !v2 && right.nth(1)?.split(',').any(|o| o == "memory");
        Some(Self {
            root: PathBuf::from(unescape_mountinfo(root)),
            point: PathBuf::from(unescape_mountinfo(point)),
            v2,
            memory,
        })
    }

    /// `path` (a cgroup path of `/proc/self/cgroup`) relative to the mount's
    /// root, if the mount shows it.
    /// (A process outside its cgroup namespace's root sees `/../x`: not
    /// below any mount it can read, and never joined to one.)
    fn below_root(&self, path: &str) -> Option<PathBuf> {
        let below = Path::new(path).strip_prefix(&self.root).ok()?;
        below
            .components()
            .all(|c| matches!(c, std::path::Component::Normal(_)))
            .then(|| below.to_path_buf())
    }
}

/// mountinfo writes a space, tab, newline and backslash in a path as `\ooo`.
fn unescape_mountinfo(field: &str) -> String {
    let b = field.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let octal = b
            .get(i + 1..i + 4)
            .filter(|d| b[i] == b'\\' && d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match octal {
            Some(d) => {
                let v = d.iter().fold(0u32, |v, c| v * 8 + u32::from(c - b'0'));
                out.push(v as u8);
                i += 4;
            }
            None => {
                out.push(b[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

impl LimitsConfig {
    /// `buffer_memory_max` in bytes (its default when unset).
    pub fn buffer_memory_bytes(&self) -> Result<u64> {
        let default = default_buffer_memory_bytes(ram_bytes());
        let within = 1 << 20..=u64::MAX;
        size_limit(
            "buffer_memory_max",
            &self.buffer_memory_max,
            default,
            within,
            "at least 1M",
        )
    }

    /// `session_buffer_max` and `source_buffer_max` in bytes, given the
    /// node's `buffer_memory_max` in bytes. Unset, the source's share is a
    /// quarter of the node's (or the session's, if that is set larger) and a
    /// session's half of its source's (no larger than a source's that is
    /// set smaller), each at least 32 MiB or all of a smaller node.
    pub fn buffer_shares(&self, node_bytes: u64) -> Result<(u64, u64)> {
        let within = block::SESSION_BYTES_MIN.min(node_bytes)..=node_bytes;
        let why = format!(
            "at least 32M (the largest command; or all of buffer_memory_max when that \
             is less) and at most buffer_memory_max ({node_bytes} bytes)"
        );
        let source = size_limit(
            "source_buffer_max",
            &self.source_buffer_max,
            block::default_source_bytes(node_bytes),
            within.clone(),
            &why,
        )?;
        let session = size_limit(
            "session_buffer_max",
            &self.session_buffer_max,
            block::default_session_bytes(node_bytes).min(source),
            within,
            &why,
        )?;
        match self.source_buffer_max {
            Some(_) if session > source => bail!(
                "[limits] session_buffer_max ({session} bytes) is above source_buffer_max \
                 ({source} bytes): a session's share is part of its source address's"
            ),
            Some(_) => Ok((session, source)),
            None => Ok((session, source.max(session))),
        }
    }

    /// The transport's limits with these values applied.
    pub fn to_iscsi(&self) -> iscsi::Limits {
        iscsi::Limits {
            sessions_max: self.sessions_max,
            sessions_per_source_max: self.sessions_per_source_max,
            discovery_sessions_max: self.discovery_sessions_max,
            discovery_sessions_per_source_max: self.discovery_sessions_per_source_max,
            logins_in_progress_max: self.logins_in_progress_max,
            logins_in_progress_per_source_max: self.logins_in_progress_per_source_max,
            login_first_pdu_timeout_ms: self.login_first_pdu_timeout_ms,
            login_timeout_ms: self.login_timeout_ms,
            auth_failures_per_source_max: self.auth_failures_per_source_max,
            auth_failure_window_ms: self.auth_failure_window_ms,
            auth_lockout_ms: self.auth_lockout_ms,
            auth_failure_sources_max: self.auth_failure_sources_max,
            commands_in_flight_per_session_max: self.commands_in_flight_per_session_max,
            max_recv_data_segment_bytes: self.max_recv_data_segment_bytes,
            nop_in_interval_ms: self.nop_in_interval_ms,
            nop_in_timeout_ms: self.nop_in_timeout_ms,
            ..iscsi::Limits::default()
        }
    }
}

/// The quick command-line flags of `freesan serve`.
#[derive(Debug, Clone, Default)]
pub struct QuickFlags {
    /// `--portal ADDR:PORT`, repeatable.
    pub portals: Vec<SocketAddr>,
    /// `--target IQN`.
    pub target: Option<String>,
    /// `--lun PATH[:SIZE]`, repeatable.
    pub luns: Vec<String>,
    /// `--data-dir DIR`.
    pub data_dir: Option<PathBuf>,
    /// `--nbd ADDR:PORT`.
    pub nbd: Option<SocketAddr>,
    /// `--api ADDR:PORT`.
    pub api: Option<SocketAddr>,
}

impl QuickFlags {
    /// True when no quick flag that defines targets or portals was given.
    pub fn defines_nothing(&self) -> bool {
        self.portals.is_empty() && self.target.is_none() && self.luns.is_empty()
    }
}

/// Splits `PATH[:SIZE]`: the part after the last colon is a size only when it parses as one.
pub fn parse_lun_flag(s: &str) -> (PathBuf, Option<String>) {
    if let Some((path, size)) = s.rsplit_once(':') {
        if !path.is_empty() && disk::parse_size(size).is_some() {
            return (PathBuf::from(path), Some(size.to_string()));
        }
    }
    (PathBuf::from(s), None)
}

impl Config {
    /// The configuration the quick flags describe, on top of the embedded default:
    /// data folder `./freesan-data`, a portal on 127.0.0.1:3260, one target, and one
    /// thin 16 GiB LUN in the data folder when no `--lun` is given.
    pub fn from_quick_flags(flags: &QuickFlags) -> Config {
        let data_dir = flags
            .data_dir
            .clone()
            .unwrap_or_else(|| PathBuf::from("freesan-data"));
        let portals = if flags.portals.is_empty() {
            vec![SocketAddr::from(([127, 0, 0, 1], DEFAULT_PORT))]
        } else {
            flags.portals.clone()
        };
        let luns = if flags.luns.is_empty() {
            vec![LunConfig::file(
                data_dir.join("lun0.img"),
                Some(DEFAULT_LUN_SIZE.into()),
            )]
        } else {
            flags
                .luns
                .iter()
                .map(|s| {
                    let (path, size) = parse_lun_flag(s);
                    LunConfig::file(path, size)
                })
                .collect()
        };
        Config {
            data_dir,
            portals: portals
                .into_iter()
                .map(|address| PortalConfig {
                    address,
                    allow_without_chap: false,
                })
                .collect(),
            targets: vec![TargetConfig {
                iqn: flags.target.clone().unwrap_or_else(|| DEFAULT_IQN.into()),
                alias: None,
                chap: None,
                mutual_chap: None,
                chap_initiators: vec![],
                chap_md5: true,
                allowed_initiators: vec![],
                host_groups: vec![],
                luns,
            }],
            discovery_chap: None,
            discovery_chap_md5: true,
            limits: LimitsConfig::default(),
            nbd: flags.nbd.map(NbdConfig::on),
            api: flags.api.map(ApiConfig::on),
            disks: vec![],
            pools: vec![],
            caches: vec![],
            cluster: None,
            alerts: AlertsConfig::default(),
        }
    }

    /// Whether the file itself holds secrets: CHAP of any kind, the SMTP
    /// password, webhook URLs (a Slack-style one is its own credential).
    pub fn holds_secrets(&self) -> bool {
        !self.alerts.webhook.is_empty()
            || self.discovery_chap.is_some()
            || self.targets.iter().any(|t| {
                t.chap.is_some() || t.mutual_chap.is_some() || !t.chap_initiators.is_empty()
            })
            || self
                .alerts
                .smtp
                .as_ref()
                .is_some_and(|m| m.password.is_some())
    }

    /// Reads and validates a TOML file; relative paths become relative to its
    /// folder. A file that holds secrets must be private to its owner.
    pub fn load(path: &Path) -> Result<Config> {
        let cfg = Config::parse_file(path)?;
        if cfg.holds_secrets() {
            crate::secrets::check_private(path, "the configuration")?;
        }
        Ok(cfg)
    }

    /// The data directory the config file at `path` names (relative to its
    /// folder), its secrets not checked: for root, which may read any file,
    /// to learn whose data directory it is before reading the rest as that
    /// user (`freesan show-config`). Nothing else of the file is used.
    pub fn data_dir_in(path: &Path) -> Result<PathBuf> {
        Ok(Config::parse_file(path)?.data_dir)
    }

    /// Reads a TOML file, relative paths made relative to its folder.
    fn parse_file(path: &Path) -> Result<Config> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading config {}", path.display()))?;
        let mut cfg: Config = toml::from_str(&text).map_err(|e| {
            anyhow::anyhow!(
                "parsing config {}: {}",
                path.display(),
                toml_error(&text, &e)
            )
        })?;
        let base = path.parent().unwrap_or(Path::new("."));
        cfg.rebase(base);
        Ok(cfg)
    }

    fn rebase(&mut self, base: &Path) {
        let fix = |p: &mut PathBuf| {
            if p.is_relative() {
                *p = base.join(&*p);
            }
        };
        fix(&mut self.data_dir);
        if let Some(p) = &mut self.alerts.webhook_secret_file {
            fix(p);
        }
        if let Some(a) = &mut self.api {
            for p in [&mut a.cert, &mut a.key].into_iter().flatten() {
                fix(p);
            }
            a.allowed_paths.iter_mut().for_each(fix);
        }
        if let Some(n) = &mut self.nbd {
            for p in [
                &mut n.tls_cert,
                &mut n.tls_key,
                &mut n.tls_client_ca,
                &mut n.tls_psk_file,
            ]
            .into_iter()
            .flatten()
            {
                fix(p);
            }
        }
        for d in &mut self.disks {
            if let Some(p) = &mut d.path {
                fix(p);
            }
        }
        for t in &mut self.targets {
            for l in &mut t.luns {
                if let Some(p) = &mut l.path {
                    fix(p);
                }
            }
        }
    }

    /// Checks everything that can be checked before opening files or sockets.
    /// Each pool, cache and disk serves one user, and each file one LUN: two
    /// LUNs on one pool, a LUN on a pool a cache fronts (the cache's destage
    /// writes its older data over the LUN's), two caches over one pool or one
    /// file served twice would be two writers over the same blocks, each with
    /// its own locks, reservations and identity.
    pub(crate) fn check_single_users(&self) -> Result<()> {
        let mut claims: Vec<((&str, String), String)> = Vec::new();
        for p in &self.pools {
            for m in p.members.iter().chain(p.spares.iter()) {
                claims.push((("disk", m.clone()), format!("pool {}", p.name)));
            }
        }
        for c in &self.caches {
            let by = format!("cache {}", c.name);
            if let Some(p) = &c.pool {
                claims.push((("pool", p.clone()), by.clone()));
            }
            if let Some(d) = &c.disk {
                claims.push((("disk", d.clone()), by.clone()));
            }
            for d in &c.devices {
                claims.push((("disk", d.clone()), by.clone()));
            }
        }
        // a disk's file or device is its own: a LUN `path` naming it (by
        // any symlink) would write behind the back of the pool, cache or
        // LUN using the disk, or of a cache fronting it (served stale)
        for d in self.disks.iter().filter(|d| !d.memory) {
            let p = d
                .path
                .clone()
                .unwrap_or_else(|| crate::pools::default_disk_path(&self.data_dir, &d.name));
            claims.push((("file", backing_key(&p)), format!("disk {}", d.name)));
        }
        for t in &self.targets {
            for (i, l) in t.luns.iter().enumerate() {
                let by = format!("target {} LUN {}", t.iqn, l.id.unwrap_or(i as u64));
                if let Some(p) = &l.pool {
                    claims.push((("pool", p.clone()), by.clone()));
                }
                if let Some(c) = &l.cache {
                    claims.push((("cache", c.clone()), by.clone()));
                }
                if let Some(d) = &l.disk {
                    claims.push((("disk", d.clone()), by.clone()));
                }
                if let Some(f) = &l.path {
                    claims.push((("file", backing_key(f)), by.clone()));
                }
            }
        }
        let mut seen: std::collections::HashMap<&(&str, String), &String> =
            std::collections::HashMap::new();
        for (what, by) in &claims {
            if let Some(first) = seen.insert(what, by) {
                bail!(
                    "{} {} serves both {first} and {by}: a pool, cache, disk or file \
                     serves one user (two would write over each other's blocks){}",
                    what.0,
                    what.1,
                    if first.starts_with("disk ") && what.0 == "file" {
                        "; to serve a configured disk as a LUN, give disk = \"NAME\""
                    } else {
                        ""
                    }
                );
            }
        }
        Ok(())
    }

    pub fn validate(&self) -> Result<()> {
        crate::events::check_config(&self.alerts)?;
        if self.portals.is_empty() {
            bail!("no portal configured");
        }
        if self.targets.is_empty() {
            bail!("no target configured");
        }
        if let Some(c) = &self.discovery_chap {
            if c.user.is_empty() || c.secret.len() < 12 || c.secret.len() > 255 {
                bail!(
                    "discovery_chap: CHAP user must be set and the secret be 12 to 255 characters"
                );
            }
        }
        // A secret answers in one direction only (RFC 7143 12.1.3), across
        // the node's targets too: a target whose mutual CHAP secret is an
        // initiator's secret elsewhere answers a challenge of that other login,
        // relayed by anyone who may log in to it (found by review, 2026-12-06).
        let initiator_secrets: Vec<(&str, String)> = self
            .discovery_chap
            .iter()
            .map(|c| (c.secret.as_str(), "discovery_chap".to_string()))
            .chain(self.targets.iter().flat_map(|t| {
                t.chap
                    .iter()
                    .map(move |c| (c.secret.as_str(), format!("target {}'s chap", t.iqn)))
                    .chain(t.chap_initiators.iter().map(move |c| {
                        (
                            c.secret.as_str(),
                            format!("target {}'s chap_initiator {}", t.iqn, c.initiator),
                        )
                    }))
            }))
            .collect();
        for t in &self.targets {
            let Some(m) = &t.mutual_chap else { continue };
            if let Some((_, whose)) = initiator_secrets.iter().find(|(s, _)| *s == m.secret) {
                bail!(
                    "target {}: mutual CHAP secret is also {whose} secret: a secret may answer \
                     in one direction only, or one target's answer logs in to another",
                    t.iqn
                );
            }
        }
        let mut iqns = std::collections::HashSet::new();
        let mut naas = std::collections::HashSet::new();
        for t in &self.targets {
            if !(t.iqn.starts_with("iqn.")
                || t.iqn.starts_with("eui.")
                || t.iqn.starts_with("naa."))
                || t.iqn.len() > 223
                || t.iqn.chars().any(|c| c.is_whitespace() || c.is_uppercase())
            {
                bail!("target name {:?} is not a valid iSCSI name (iqn.YYYY-MM.domain:name, lower case)", t.iqn);
            }
            if !iqns.insert(&t.iqn) {
                bail!("target {} is configured twice", t.iqn);
            }
            // a target's state folder is named after it with every character
            // but letters, digits, '.' and '-' made '_': two names that fold
            // together would share LUN identities (NAA, serial), reservations
            // and atomic-write records
            let folder = crate::identity::safe_name(&t.iqn);
            if let Some(o) = self
                .targets
                .iter()
                .find(|o| o.iqn != t.iqn && crate::identity::safe_name(&o.iqn) == folder)
            {
                bail!(
                    "targets {} and {} would share the state folder {folder}: \
                     rename one (they differ only in characters other than letters, digits, '.' and '-')",
                    o.iqn,
                    t.iqn
                );
            }
            for i in &t.allowed_initiators {
                if !iscsi::is_iscsi_name(i) {
                    bail!(
                        "target {}: allowed_initiators: {i:?} is not an iSCSI name (iqn., eui. or naa., \
                         at most 223 bytes, no control character)",
                        t.iqn
                    );
                }
            }
            for g in &t.host_groups {
                if let Some(i) = g.initiators.iter().find(|i| !iscsi::is_iscsi_name(i)) {
                    bail!(
                        "target {}: host group {}: {i:?} is not an iSCSI name (iqn., eui. or naa., \
                         at most 223 bytes, no control character)",
                        t.iqn,
                        g.name
                    );
                }
                if g.name.is_empty()
                    || g.name.len() > 64
                    || !g
                        .name
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
                {
                    bail!(
                        "target {}: host group names are 1-64 letters, digits, '-', '_', '.' ({:?})",
                        t.iqn,
                        g.name
                    );
                }
            }
            let groups: Vec<scsi::HostGroup> = t.host_groups.iter().map(|g| g.to_scsi()).collect();
            scsi::check_host_groups(&groups).with_context(|| format!("target {}", t.iqn))?;
            if t.mutual_chap.is_some() && t.chap.is_none() && t.chap_initiators.is_empty() {
                bail!(
                    "target {}: mutual_chap needs chap or chap_initiator as well",
                    t.iqn
                );
            }
            let mut names = std::collections::HashSet::new();
            for c in &t.chap_initiators {
                if !iscsi::is_iscsi_name(&c.initiator)
                    || !names.insert(c.initiator.to_ascii_lowercase())
                {
                    bail!(
                        "target {}: chap_initiator names must be set, valid and listed once ({:?})",
                        t.iqn,
                        c.initiator
                    );
                }
                if c.user.is_empty() || c.secret.len() < 12 || c.secret.len() > 255 {
                    bail!(
                        "target {}: chap_initiator {}: CHAP user must be set and secrets be 12 to 255 characters",
                        t.iqn,
                        c.initiator
                    );
                }
                if t.mutual_chap.as_ref().is_some_and(|m| m.secret == c.secret) {
                    bail!(
                        "target {}: mutual CHAP secret must differ from chap_initiator {}'s",
                        t.iqn,
                        c.initiator
                    );
                }
            }
            for c in t.chap.iter().chain(t.mutual_chap.iter()) {
                if c.user.is_empty() || c.secret.len() < 12 || c.secret.len() > 255 {
                    bail!(
                        "target {}: CHAP user must be set and secrets be 12 to 255 characters",
                        t.iqn
                    );
                }
            }
            if let (Some(a), Some(b)) = (&t.chap, &t.mutual_chap) {
                if a.secret == b.secret {
                    bail!(
                        "target {}: mutual CHAP secret must differ from the CHAP secret",
                        t.iqn
                    );
                }
            }
            if t.luns.is_empty() {
                bail!("target {} has no LUN", t.iqn);
            }
            let mut ids = std::collections::HashSet::new();
            for (i, l) in t.luns.iter().enumerate() {
                let id = l.id.unwrap_or(i as u64);
                if id >= 16384 {
                    bail!(
                        "target {}: LUN {} is above the flat addressing limit 16383",
                        t.iqn,
                        id
                    );
                }
                if !ids.insert(id) {
                    bail!("target {}: LUN {} is configured twice", t.iqn, id);
                }
                let backings = [
                    l.path.is_some(),
                    l.pool.is_some(),
                    l.disk.is_some(),
                    l.cache.is_some(),
                ];
                if backings.iter().filter(|b| **b).count() != 1 {
                    bail!(
                        "target {} LUN {}: give exactly one of path, pool, disk and cache",
                        t.iqn,
                        id
                    );
                }
                if matches!(l.thin_threshold_percent, Some(p) if p == 0 || p > 100) {
                    bail!(
                        "target {} LUN {}: thin_threshold_percent must be 1 to 100",
                        t.iqn,
                        id
                    );
                }
                if l.thin_threshold_percent.is_some() && (l.path.is_none() || l.thick) {
                    bail!(
                        "target {} LUN {}: thin_threshold_percent is for thin (sparse file) \
                         LUNs: a pool, disk, cache or thick LUN never runs out by itself",
                        t.iqn,
                        id
                    );
                }
                if let Some(p) = l.physical_block_size {
                    if !p.is_power_of_two() || !(512..=1 << 24).contains(&p) {
                        bail!(
                            "target {} LUN {}: physical_block_size must be a power of two \
                             from 512",
                            t.iqn,
                            id
                        );
                    }
                }
                if l.block_size != 512 && l.block_size != 4096 {
                    bail!(
                        "target {} LUN {}: block_size must be 512 or 4096",
                        t.iqn,
                        id
                    );
                }
                if let Some(s) = &l.size {
                    if disk::parse_size(s).is_none() {
                        bail!(
                            "target {} LUN {}: size {:?} is not a size (like 4G)",
                            t.iqn,
                            id,
                            s
                        );
                    }
                }
                if let Some(naa) = &l.naa {
                    let n = crate::identity::parse_naa(naa)
                        .with_context(|| format!("target {} LUN {}", t.iqn, id))?;
                    // two LUNs of one NAA are one disk to multipath
                    if !naas.insert(n) {
                        bail!(
                            "target {} LUN {}: NAA {naa} is given to another LUN too",
                            t.iqn,
                            id
                        );
                    }
                }
                if l.sanitize_rate_mib_s > SANITIZE_RATE_MIB_S_MAX {
                    bail!(
                        "target {} LUN {}: sanitize_rate_mib_s is at most {SANITIZE_RATE_MIB_S_MAX}",
                        t.iqn,
                        id
                    );
                }
                match (&self.cluster, l.replicated) {
                    (None, true) => bail!(
                        "target {} LUN {}: replicated needs a [cluster] section",
                        t.iqn,
                        id
                    ),
                    (Some(c), true) => {
                        let name = crate::cluster::volume_name(&c.name, &t.iqn, id);
                        replica::check_names(&c.name, &name)
                            .map_err(|e| anyhow::anyhow!("target {} LUN {}: {e}", t.iqn, id))?;
                    }
                    _ => {}
                }
                if let Some(m) = &l.replica_mode {
                    if !l.replicated || !matches!(m.as_str(), "active-active" | "active-passive") {
                        bail!("target {} LUN {}: replica_mode is active-active or active-passive (with replicated = true)", t.iqn, id);
                    }
                }
            }
        }
        if let Some(c) = &self.cluster {
            if !matches!(c.node_id, 1 | 2) || !matches!(c.preferred_node, 1 | 2) {
                bail!("cluster: node_id and preferred_node are 1 or 2");
            }
            if c.sync.is_empty() || c.peer_sync.is_empty() {
                bail!("cluster: give this node's sync addresses and the partner's peer_sync");
            }
            if c.key_file.as_os_str().is_empty() {
                bail!("cluster: key_file is required (make the keys with `freesan cluster init`)");
            }
            if c.heartbeat_interval_ms == 0 || c.peer_timeout_ms < 2 * c.heartbeat_interval_ms {
                bail!("cluster: peer_timeout_ms must be at least twice heartbeat_interval_ms");
            }
            if let Some(r) = &c.region {
                match disk::parse_size(r) {
                    Some(b) if (4096..=1 << 30).contains(&b) && b.is_power_of_two() => {}
                    _ => bail!("cluster: region {r:?} must be a power of two from 4K to 1G"),
                }
            }
        }
        let names = self
            .disks
            .iter()
            .map(|d| ("disk", &d.name))
            .chain(self.pools.iter().map(|p| ("pool", &p.name)))
            .chain(self.caches.iter().map(|c| ("cache", &c.name)));
        for (kind, name) in names {
            check_object_name(kind, name)?;
        }
        let mut disk_names = std::collections::HashSet::new();
        for d in &self.disks {
            if !disk_names.insert(d.name.as_str()) {
                bail!("disk {} is configured twice", d.name);
            }
            if d.sim.is_none() && d.path.is_none() {
                bail!("disk {}: a disk that is not simulated needs a path", d.name);
            }
            if let Some(s) = &d.size {
                if disk::parse_size(s).is_none() {
                    bail!("disk {}: size {s:?} is not a size", d.name);
                }
            }
        }
        let mut used = std::collections::HashSet::new();
        let mut pool_names = std::collections::HashSet::new();
        for p in &self.pools {
            if !pool_names.insert(p.name.as_str()) {
                bail!("pool {} is configured twice", p.name);
            }
            for m in p
                .members
                .iter()
                .chain(p.spares.iter())
                .chain(p.journal_device.iter())
                .chain(p.journal_device_mirror.iter())
            {
                if !disk_names.contains(m.as_str()) {
                    bail!("pool {}: no [[disk]] named {m}", p.name);
                }
                if !used.insert(m.as_str()) {
                    bail!("pool {}: disk {m} is used twice", p.name);
                }
            }
            if p.journal_device_mirror.is_some() && p.journal_device.is_none() {
                bail!(
                    "pool {}: journal_device_mirror needs a journal_device",
                    p.name
                );
            }
            if p.journal_device.is_some()
                && !matches!(p.level.as_str(), "raid5" | "raid6" | "raidf1")
            {
                bail!(
                    "pool {}: journal_device needs a parity level (raid5, raid6, raidf1), not {}",
                    p.name,
                    p.level
                );
            }
            if let Some(c) = &p.chunk {
                if disk::parse_size(c).is_none() {
                    bail!("pool {}: chunk {c:?} is not a size", p.name);
                }
            }
            if let Some(m) = p.journal_mib {
                if !matches!(p.level.as_str(), "raid5" | "raid6" | "raidf1") {
                    bail!(
                        "pool {}: journal_mib needs a parity level (raid5, raid6, raidf1), not {}",
                        p.name,
                        p.level
                    );
                }
                if !(1..=JOURNAL_MIB_MAX).contains(&m) {
                    bail!(
                        "pool {}: journal_mib {m} is not between 1 and {JOURNAL_MIB_MAX}",
                        p.name
                    );
                }
            }
        }
        for t in &self.targets {
            for l in &t.luns {
                if let Some(p) = &l.pool {
                    if !pool_names.contains(p.as_str()) {
                        bail!(
                            "target {}: LUN names pool {p}, which is not configured",
                            t.iqn
                        );
                    }
                }
                if let Some(d) = &l.disk {
                    if !disk_names.contains(d.as_str()) {
                        bail!(
                            "target {}: LUN names disk {d}, which is not configured",
                            t.iqn
                        );
                    }
                    if !used.insert(d.as_str()) {
                        bail!("target {}: disk {d} is already used", t.iqn);
                    }
                }
            }
        }
        if let Some(a) = &self.api {
            if !a.address.ip().is_loopback() && !a.allow_remote {
                bail!(
                    "API address {} is not on loopback: set allow_remote = true in [api] \
                     to expose it on purpose (every request needs a token; see docs/security.md)",
                    a.address
                );
            }
            if let Some(c) = a.console {
                if !c.ip().is_loopback() && !a.allow_remote {
                    bail!(
                        "console address {c} is not on loopback: set allow_remote = true in [api] \
                         to expose it on purpose (every API request needs a token; see docs/security.md)"
                    );
                }
                if c == a.address && c.port() != 0 {
                    bail!("[api] console must listen on another address than the API ({c})");
                }
            }
            if a.connections_max == 0
                || a.connections_per_source_max == 0
                || a.header_read_timeout_ms == 0
            {
                bail!("[api]: connections_max, connections_per_source_max and header_read_timeout_ms must be above 0");
            }
            if a.cert.is_some() != a.key.is_some() {
                bail!(
                    "[api]: give cert and key together (or neither, for a generated certificate)"
                );
            }
        }
        if let Some(n) = &self.nbd {
            n.check()?;
        }
        let node_bytes = self.limits.buffer_memory_bytes()?;
        self.limits.buffer_shares(node_bytes)?;
        self.check_single_users()?;
        for p in &self.portals {
            let open = !p.address.ip().is_loopback() && !p.allow_without_chap;
            if open {
                if let Some(t) = self
                    .targets
                    .iter()
                    .find(|t| t.chap.is_none() && t.chap_initiators.is_empty())
                {
                    bail!(
                        "portal {} is not on loopback and target {} has no CHAP: set chap for the target, \
                         or allow_without_chap = true on the portal to serve it openly on purpose",
                        p.address,
                        t.iqn
                    );
                }
            }
        }
        Ok(())
    }
}

impl LunConfig {
    /// A file-backed LUN with defaults.
    pub fn file(path: PathBuf, size: Option<String>) -> LunConfig {
        LunConfig {
            id: None,
            path: Some(path),
            resolved: None,
            pool: None,
            disk: None,
            cache: None,
            size,
            thick: false,
            read_only: false,
            sync_writes: false,
            block_size: default_block_size(),
            naa: None,
            serial: None,
            replicated: false,
            replica_mode: None,
            thin_threshold_percent: None,
            atomic_writes: true,
            physical_block_size: None,
            sanitize_rate_mib_s: default_sanitize_rate_mib_s(),
        }
    }
}

fn yes() -> bool {
    true
}

/// A TOML error without the source line it quotes by default: the line can
/// hold a CHAP secret, and the error reaches the API's caller and the log
/// (`POST /api/v1/reload`).
pub(crate) fn toml_error(text: &str, e: &toml::de::Error) -> String {
    let mut msg = e.message().trim_end().to_string();
    // serde's "invalid type: string \"x\", expected ..." quotes the value too
    if msg.starts_with("invalid ") {
        if let (Some(q), Some(x)) = (msg.find(['`', '"']), msg.rfind(", expected")) {
            if q < x {
                msg = format!("{}{}", msg[..q].trim_end(), &msg[x..]);
            }
        }
    }
    match e.span() {
        Some(span) => {
            let before = text.get(..span.start).unwrap_or(text);
            let line = before.matches('\n').count() + 1;
            let column = before.len() - before.rfind('\n').map_or(0, |i| i + 1) + 1;
            format!("{msg} (line {line}, column {column})")
        }
        None => msg,
    }
}

/// A backing file or device as [`Config::check_single_users`] compares them:
/// absolute, symlinks resolved as far as the path exists.
fn backing_key(p: &Path) -> String {
    crate::allowed::resolve(p)
        .unwrap_or_else(|| p.to_path_buf())
        .display()
        .to_string()
}

/// Disk, pool and cache names: 1-64 letters, digits, '-', '_', '.', starting
/// with a letter or digit. A disk's name is also its file's name when it has no
/// path (`DATA_DIR/disks/NAME.img`), so a name must never reach outside that
/// folder ("/srv/x" or "../x" would), and names land in logs and metrics labels.
fn check_object_name(kind: &str, name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c));
    if !ok {
        bail!("{kind} names are 1-64 letters, digits, '-', '_', '.', starting with a letter or digit ({name:?})");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_disks_command_timeout_defaults_to_twenty_seconds_and_zero_turns_it_off() {
        let disk = |t: &str| -> DiskConfig {
            toml::from_str(&format!("name = \"d\"\n{t}")).expect("parse")
        };
        let secs = std::time::Duration::from_secs;
        assert_eq!(disk("").io_timeout(), Some(secs(20)));
        assert_eq!(disk("io_timeout_secs = 45").io_timeout(), Some(secs(45)));
        assert_eq!(disk("io_timeout_secs = 0").io_timeout(), None);
        assert!(toml::from_str::<DiskConfig>("name = \"d\"\nio_timeout_secs = -1").is_err());
    }

    #[test]
    fn lun_flag_splits_size_only_when_it_is_one() {
        assert_eq!(
            parse_lun_flag("/x/a.img:4G"),
            ("/x/a.img".into(), Some("4G".into()))
        );
        assert_eq!(parse_lun_flag("/x/a.img"), ("/x/a.img".into(), None));
        assert_eq!(parse_lun_flag("/x/a:b.img"), ("/x/a:b.img".into(), None));
    }

    /// A replicated LUN whose volume name would not fit the cluster
    /// protocol's 255 bytes is refused (cut short, it named no volume of the
    /// partner's); its witness grant, longer, is a digest (cut short, the
    /// grants of several LUNs were one).
    #[test]
    fn a_replicated_lun_whose_name_is_too_long_is_refused() {
        let mut c = Config::from_quick_flags(&QuickFlags::default());
        let cluster = "pair-with-a-rather-long-name-for-a-cluster";
        c.cluster = Some(
            toml::from_str(&format!(
                "name = \"{cluster}\"\nnode_id = 1\n\
                 sync = [\"127.0.0.1:3261\"]\npeer_sync = [\"127.0.0.2:3261\"]\n\
                 key_file = \"/k\"\n",
            ))
            .unwrap(),
        );
        c.targets[0].luns[0].replicated = true;
        c.validate().unwrap();
        // "CLUSTER/IQN/lun0" with a 42-byte cluster name: an IQN of 207
        // bytes still fits, 208 does not
        for (len, ok) in [(207usize, true), (208, false)] {
            let iqn = format!("iqn.2026-12.org.freesan:{}", "x".repeat(len - 24));
            assert_eq!(iqn.len(), len);
            c.targets[0].iqn = iqn.clone();
            let r = c.validate();
            assert_eq!(r.is_ok(), ok, "{len}: {r:?}");
            if let Err(e) = r {
                assert!(format!("{e:#}").contains("more than the 255"), "{e:#}");
            }
            // the grants of two LUNs of a long-named target stay two
            let name = |lun| crate::cluster::volume_name(cluster, &iqn, lun);
            let (k0, k1) = (
                replica::witness_key(cluster, &name(0)),
                replica::witness_key(cluster, &name(1)),
            );
            assert!(k0.len() <= 255 && k1.len() <= 255 && k0 != k1, "{k0} {k1}");
        }
    }

    #[test]
    fn embedded_default_is_valid() {
        let c = Config::from_quick_flags(&QuickFlags::default());
        c.validate().unwrap();
        assert_eq!(c.portals[0].address.port(), DEFAULT_PORT);
        assert_eq!(c.targets[0].luns[0].size.as_deref(), Some("16G"));
    }

    #[test]
    fn discovery_chap_needs_a_user_and_a_long_secret() {
        let mut c = Config::from_quick_flags(&QuickFlags::default());
        for (user, secret, ok) in [
            ("disc", "twelve-chars", true),
            ("", "twelve-chars", false),
            ("disc", "short", false),
            ("disc", &*"s".repeat(256), false),
        ] {
            c.discovery_chap = Some(Chap {
                user: user.into(),
                secret: secret.into(),
            });
            assert_eq!(c.validate().is_ok(), ok, "{user:?} {secret:?}");
        }
    }

    /// A target's mutual CHAP secret may not be an initiator's secret of any
    /// target (or discovery's): the target's answer to a relayed challenge
    /// would log in elsewhere.
    #[test]
    fn a_mutual_chap_secret_is_no_initiator_secret_of_another_target() {
        let mut c = Config::from_quick_flags(&QuickFlags::default());
        let mut b = c.targets[0].clone();
        b.iqn = "iqn.2026-12.org.freesan:b".into();
        for l in &mut b.luns {
            l.path = l.path.as_ref().map(|p| p.with_extension("b"));
        }
        c.targets[0].chap = Some(Chap {
            user: "alice".into(),
            secret: "alice-secret-12".into(),
        });
        b.chap = Some(Chap {
            user: "bob".into(),
            secret: "bob-secret-1234".into(),
        });
        b.mutual_chap = Some(Chap {
            user: "target-b".into(),
            secret: "target-b-secret".into(),
        });
        c.targets.push(b);
        c.validate().unwrap();
        for shared in ["alice-secret-12", "discovery-secret"] {
            c.discovery_chap = Some(Chap {
                user: "d".into(),
                secret: "discovery-secret".into(),
            });
            c.targets[1].mutual_chap.as_mut().unwrap().secret = shared.into();
            let e = c.validate().unwrap_err().to_string();
            assert!(e.contains("mutual CHAP secret is also"), "{shared}: {e}");
        }
    }

    #[test]
    fn lun_keys_for_atomic_writes_and_physical_blocks() {
        let mut c = Config::from_quick_flags(&QuickFlags::default());
        let l = &c.targets[0].luns[0];
        assert!(l.atomic_writes, "atomic writes are on by default");
        assert_eq!(l.physical_block_size, None);
        for (p, ok) in [(4096, true), (512, true), (3000, false), (256, false)] {
            c.targets[0].luns[0].physical_block_size = Some(p);
            assert_eq!(c.validate().is_ok(), ok, "physical_block_size {p}");
        }
        let mut l = LunConfig::file("/x".into(), None);
        l.physical_block_size = Some(4096);
        assert_eq!(crate::lun::physical_exponent(512, &l).unwrap(), 3);
        assert_eq!(crate::lun::physical_exponent(4096, &l).unwrap(), 0);
        l.physical_block_size = Some(512);
        assert!(crate::lun::physical_exponent(4096, &l).is_err());
        l.physical_block_size = None;
        assert_eq!(crate::lun::physical_exponent(512, &l).unwrap(), 0);
    }

    #[test]
    fn console_listener_rules() {
        let mut c = Config::from_quick_flags(&QuickFlags::default());
        let mut api = ApiConfig::on("127.0.0.1:8260".parse().unwrap());
        api.console = Some("127.0.0.1:8261".parse().unwrap());
        c.api = Some(api.clone());
        c.validate().unwrap();
        // on the API's own address: refused
        api.console = Some(api.address);
        c.api = Some(api.clone());
        assert!(c.validate().is_err());
        // off loopback only with allow_remote
        api.console = Some("0.0.0.0:8261".parse().unwrap());
        c.api = Some(api.clone());
        assert!(c.validate().is_err());
        api.allow_remote = true;
        c.api = Some(api.clone());
        c.validate().unwrap();
        // a console off loopback speaks TLS, though the API is on loopback
        assert!(api.tls_enabled());
        api.console = Some("127.0.0.1:8261".parse().unwrap());
        assert!(!api.tls_enabled());
    }

    #[test]
    fn open_portal_without_chap_is_refused() {
        let flags = QuickFlags {
            portals: vec!["0.0.0.0:3260".parse().unwrap()],
            ..Default::default()
        };
        let mut c = Config::from_quick_flags(&flags);
        assert!(c.validate().is_err());
        c.portals[0].allow_without_chap = true;
        c.validate().unwrap();
    }

    #[test]
    fn nbd_tls_keys_and_defaults() {
        let base = "data_dir = \"state\"\n[[portal]]\naddress = \"127.0.0.1:3260\"\n\
                    [[target]]\niqn = \"iqn.2026-11.org.freesan:t1\"\n[[target.lun]]\npath = \"l.img\"\n\
                    size = \"1G\"\n[nbd]\n";
        let parse = |extra: &str| -> Result<Config> {
            let mut c: Config = toml::from_str(&format!("{base}{extra}"))?;
            c.rebase(Path::new("/etc/freesan"));
            c.validate()?;
            Ok(c)
        };
        let c = parse("address = \"127.0.0.1:10809\"\n").unwrap();
        assert!(!c.nbd.unwrap().tls_required(), "loopback: off by default");
        let remote = "address = \"10.0.0.5:10809\"\nallow_remote = true\nallowed_clients = [\"10.0.0.0/24\"]\n";
        let c = parse(remote).unwrap();
        assert!(
            c.nbd.unwrap().tls_required(),
            "off loopback: required by default"
        );
        let c = parse(&format!("{remote}tls = \"off\"\n")).unwrap();
        assert!(!c.nbd.unwrap().tls_required());
        let c = parse(
            "tls = \"require\"\ntls_cert = \"pki/c.pem\"\ntls_key = \"pki/k.pem\"\ntls_client_ca = \"/ca.pem\"\n",
        )
        .unwrap();
        let n = c.nbd.unwrap();
        assert!(n.tls_required());
        assert_eq!(n.tls_cert.unwrap(), Path::new("/etc/freesan/pki/c.pem"));
        assert_eq!(n.tls_client_ca.unwrap(), Path::new("/ca.pem"));
        assert!(parse("tls = \"optional\"\n").is_err(), "no optional mode");
        assert!(
            parse("tls = \"require\"\ntls_cert = \"c.pem\"\n").is_err(),
            "key missing"
        );
        assert!(parse("tls = \"off\"\ntls_client_ca = \"ca.pem\"\n").is_err());
        assert!(parse("tls_psk = \"k\"\n").is_err(), "unknown key");
        let n = parse("tls = \"require\"\ntls_psk_file = \"keys.psk\"\n")
            .unwrap()
            .nbd
            .unwrap();
        assert_eq!(n.tls_psk_file.unwrap(), Path::new("/etc/freesan/keys.psk"));
        assert!(
            parse("tls_psk_file = \"keys.psk\"\n").is_err(),
            "PSK needs TLS required"
        );
        assert!(
            parse("tls = \"require\"\ntls_psk_file = \"k.psk\"\ntls_client_ca = \"ca.pem\"\n")
                .is_err(),
            "PSK or certificates, not both"
        );
    }

    #[test]
    fn journal_mib_is_for_parity_pools_and_bounded() {
        let with = |level: &str, mib: &str| {
            let c = format!(
                "data_dir = \"state\"\n[[portal]]\naddress = \"127.0.0.1:3260\"\n\
                 [[disk]]\nname = \"d0\"\npath = \"d0.img\"\n\
                 [[disk]]\nname = \"d1\"\npath = \"d1.img\"\n\
                 [[disk]]\nname = \"d2\"\npath = \"d2.img\"\n\
                 [[pool]]\nname = \"p\"\nlevel = \"{level}\"\n\
                 members = [\"d0\", \"d1\", \"d2\"]\njournal_mib = {mib}\n\
                 [[target]]\niqn = \"iqn.2026-12.org.freesan:t1\"\n\
                 [[target.lun]]\npool = \"p\"\n"
            );
            toml::from_str::<Config>(&c).unwrap().validate()
        };
        with("raid5", "64").unwrap();
        with("raid6", "16").unwrap();
        with("raid5", &JOURNAL_MIB_MAX.to_string()).unwrap();
        assert!(with("raid1", "64").is_err(), "a mirror has no journal");
        assert!(with("raid5", "0").is_err(), "no ring");
        assert!(
            with("raid5", &(JOURNAL_MIB_MAX + 1).to_string()).is_err(),
            "more than the bound"
        );
    }

    #[test]
    fn lun_backing_is_exactly_one_of_path_pool_disk() {
        let base = r#"
data_dir = "state"
[[portal]]
address = "127.0.0.1:3260"
[[disk]]
name = "d0"
path = "d0.img"
[[disk]]
name = "d1"
path = "d1.img"
[[pool]]
name = "p"
level = "raid1"
members = ["d0", "d1"]
[[target]]
iqn = "iqn.2026-11.org.freesan:t1"
[[target.lun]]
"#;
        let ok = |lun: &str| {
            toml::from_str::<Config>(&format!("{base}{lun}"))
                .unwrap()
                .validate()
        };
        ok("pool = \"p\"").unwrap();
        assert!(ok("pool = \"p\"\npath = \"x.img\"").is_err());
        assert!(ok("pool = \"nope\"").is_err());
        assert!(
            ok("disk = \"d0\"").is_err(),
            "a pool member served directly"
        );
        assert!(ok("").is_err());
        // a journal device: a free disk, for parity levels only
        let with = |level: &str, jdev: &str| {
            let b = base.replace("level = \"raid1\"", &format!("level = \"{level}\""));
            let b = b.replace(
                "members = [\"d0\", \"d1\"]\n",
                &format!("members = [\"d0\", \"d1\"]\njournal_device = \"{jdev}\"\n"),
            );
            let b = b.replace(
                "[[pool]]",
                "[[disk]]\nname = \"ssd\"\npath = \"ssd.img\"\n[[pool]]",
            );
            toml::from_str::<Config>(&format!("{b}pool = \"p\""))
                .unwrap()
                .validate()
        };
        with("raid5", "ssd").unwrap();
        assert!(with("raid1", "ssd").is_err(), "not a parity level");
        assert!(with("raid5", "d1").is_err(), "a member");
        assert!(with("raid5", "nope").is_err(), "no such disk");
        // its mirror: another free disk, only beside a journal device
        let mirrored = |jdev: &str, mirror: &str| {
            let b = base.replace("level = \"raid1\"", "level = \"raid5\"");
            let b = b.replace(
                "members = [\"d0\", \"d1\"]\n",
                &format!(
                    "members = [\"d0\", \"d1\"]\n{jdev}journal_device_mirror = \"{mirror}\"\n"
                ),
            );
            let b = b.replace(
                "[[pool]]",
                "[[disk]]\nname = \"ssd\"\npath = \"ssd.img\"\n[[disk]]\nname = \"ssd2\"\npath = \"ssd2.img\"\n[[pool]]",
            );
            toml::from_str::<Config>(&format!("{b}pool = \"p\""))
                .unwrap()
                .validate()
        };
        mirrored("journal_device = \"ssd\"\n", "ssd2").unwrap();
        assert!(mirrored("", "ssd2").is_err(), "a mirror of nothing");
        assert!(
            mirrored("journal_device = \"ssd\"\n", "ssd").is_err(),
            "the journal device itself"
        );
        assert!(
            mirrored("journal_device = \"ssd\"\n", "d0").is_err(),
            "a member"
        );
        // one user per pool, cache and file: a second LUN on the pool, a LUN
        // beside a cache on it, two LUNs on one file
        let second = |extra: &str| {
            toml::from_str::<Config>(&format!(
                "{base}pool = \"p\"\n[[target]]\niqn = \"iqn.2026-11.org.freesan:t2\"\n{extra}"
            ))
            .unwrap()
            .validate()
        };
        let e = second("[[target.lun]]\npool = \"p\"\n").unwrap_err();
        assert!(format!("{e:#}").contains("pool p serves both"), "{e:#}");
        let cached = base.replace(
            "[[target]]",
            "[[cache]]\nname = \"c\"\npool = \"p\"\ndevices = [\"ssd.img\"]\n[[target]]",
        );
        let e = toml::from_str::<Config>(&format!("{cached}pool = \"p\""))
            .unwrap()
            .validate()
            .unwrap_err();
        assert!(format!("{e:#}").contains("cache c"), "{e:#}");
        toml::from_str::<Config>(&format!("{cached}cache = \"c\""))
            .unwrap()
            .validate()
            .unwrap();
        let files = format!(
            "{base}path = \"/tmp/same.img\"\n[[target]]\niqn = \"iqn.2026-11.org.freesan:t4\"\n\
             [[target.lun]]\npath = \"/tmp/same.img\"\n"
        );
        let e = toml::from_str::<Config>(&files)
            .unwrap()
            .validate()
            .unwrap_err();
        assert!(format!("{e:#}").contains("serves both"), "{e:#}");
        // a LUN over a configured disk's file, by its configured name or by a
        // symlink: the pool's member written behind the pool's back
        let e = ok("path = \"d0.img\"").unwrap_err();
        assert!(
            format!("{e:#}").contains("serves both disk d0 and target"),
            "{e:#}"
        );
        let dir = tempfile::tempdir().unwrap();
        let d0 = dir.path().join("d0.img");
        std::fs::write(&d0, b"").unwrap();
        let link = dir.path().join("other-name.img");
        std::os::unix::fs::symlink(&d0, &link).unwrap();
        let linked = base.replace(
            "path = \"d0.img\"",
            &format!("path = {:?}", d0.display().to_string()),
        ) + &format!("path = {:?}\n", link.display().to_string());
        let e = toml::from_str::<Config>(&linked)
            .unwrap()
            .validate()
            .unwrap_err();
        assert!(
            format!("{e:#}").contains("serves both disk d0 and target"),
            "{e:#}"
        );
        // a cache's device that is a pool's member
        let on_member = base.replace(
            "[[target]]",
            "[[cache]]\nname = \"c\"\npool = \"p\"\ndevices = [\"d1\"]\n[[target]]",
        );
        let e = toml::from_str::<Config>(&format!("{on_member}cache = \"c\""))
            .unwrap()
            .validate()
            .unwrap_err();
        assert!(format!("{e:#}").contains("disk d1"), "{e:#}");
        // names that fold into one state folder, and one NAA on two LUNs
        let twins = format!(
            "{base}path = \"/tmp/a.img\"\n[[target]]\niqn = \"iqn.2026-11.org.freesan_t1\"\n\
             [[target.lun]]\npath = \"/tmp/b.img\"\n"
        );
        let e = toml::from_str::<Config>(&twins)
            .unwrap()
            .validate()
            .unwrap_err();
        assert!(format!("{e:#}").contains("share the state folder"), "{e:#}");
        let naa = "naa = \"600140500000000000000000000000aa\"\n";
        let twins = format!(
            "{base}path = \"/tmp/a.img\"\n{naa}[[target.lun]]\npath = \"/tmp/b.img\"\n{naa}"
        );
        let e = toml::from_str::<Config>(&twins)
            .unwrap()
            .validate()
            .unwrap_err();
        assert!(format!("{e:#}").contains("another LUN too"), "{e:#}");
    }

    #[test]
    fn every_example_config_is_valid() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples");
        let mut n = 0;
        for e in std::fs::read_dir(&dir).unwrap() {
            let p = e.unwrap().path();
            if p.extension().is_some_and(|x| x == "toml") {
                // as checked out (0644: the mode check is the next test's)
                let c = Config::parse_file(&p).unwrap_or_else(|e| panic!("{}: {e:#}", p.display()));
                c.validate()
                    .unwrap_or_else(|e| panic!("{}: {e:#}", p.display()));
                n += 1;
            }
        }
        assert!(n > 0, "no example configs found in {}", dir.display());
    }

    /// A configuration that holds secrets (CHAP, the SMTP password) is
    /// refused while other users may read it; one without secrets is not.
    /// Before, a copied example with its CHAP secrets served at 0644.
    #[test]
    fn a_configuration_with_secrets_must_be_private() {
        use std::os::unix::fs::PermissionsExt;
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("node.toml");
        let head = "data_dir = \"/d\"\n[[portal]]\naddress = \"127.0.0.1:3260\"\n[[target]]\niqn = \"iqn.2026-11.org.freesan:t\"\n";
        std::fs::write(&p, head).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
        Config::load(&p).expect("no secret in it: any mode");
        std::fs::write(
            &p,
            format!("{head}chap = {{ user = \"a\", secret = \"secret-of-a-1\" }}\n"),
        )
        .unwrap();
        let e = format!("{:#}", Config::load(&p).unwrap_err());
        assert!(e.contains("chmod 600"), "{e}");
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        Config::load(&p).expect("private: loaded");
    }

    #[test]
    fn a_config_that_does_not_parse_is_reported_without_its_secrets() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("node.toml");
        let head = "[[portal]]\naddress = \"127.0.0.1:3260\"\n[[target]]\niqn = \"iqn.2026-11.org.freesan:t\"\n";
        for bad in [
            // an unterminated string: toml's message quotes the line
            "chap = { user = \"a\", secret = \"hunter2hunter2' }\n",
            // a wrong type: serde's message quotes the value
            "chap = { user = \"a\", secret = 4242424242424 }\n",
        ] {
            std::fs::write(&p, format!("{head}{bad}")).unwrap();
            let e = format!("{:#}", Config::load(&p).unwrap_err());
            assert!(
                !e.contains("hunter2") && !e.contains("4242424242424"),
                "the error quotes a secret: {e}"
            );
            assert!(e.contains("line 5"), "the error says where: {e}");
        }
    }

    #[test]
    fn object_names_stay_inside_the_data_directory() {
        for good in ["hdd0", "ssd-a", "p_1", "c.2"] {
            assert!(check_object_name("disk", good).is_ok(), "{good}");
        }
        let long = "x".repeat(65);
        for bad in [
            "",
            "/srv/x",
            "../x",
            "a/b",
            ".x",
            "-x",
            "a b",
            "a\nb",
            long.as_str(),
        ] {
            assert!(check_object_name("disk", bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn toml_roundtrip_and_unknown_keys() {
        let text = r#"
data_dir = "state"
[[portal]]
address = "127.0.0.1:3260"
[[portal]]
address = "127.0.0.2:3260"
[[target]]
iqn = "iqn.2026-11.org.freesan:t1"
chap = { user = "alice", secret = "secret-of-alice" }
allowed_initiators = ["iqn.1993-08.org.debian:01:abc"]
[[target.lun]]
path = "lun0.img"
size = "1G"
"#;
        let c: Config = toml::from_str(text).unwrap();
        c.validate().unwrap();
        assert_eq!(c.portals.len(), 2);
        assert_eq!(c.targets[0].luns[0].block_size, 512);
        assert!(toml::from_str::<Config>(&text.replace("size =", "sise =")).is_err());
        // Per-initiator CHAP secrets.
        let per = text.replace(
            "[[target.lun]]",
            "[[target.chap_initiator]]\ninitiator = \"iqn.1993-08.org.debian:01:abc\"\nuser = \"abc\"\nsecret = \"secret-of-abc-1\"\n[[target.lun]]",
        );
        let c: Config = toml::from_str(&per).unwrap();
        c.validate().unwrap();
        assert_eq!(c.targets[0].chap_initiators[0].user, "abc");
        let short = per.replace("secret-of-abc-1", "short");
        let bad = toml::from_str::<Config>(&short).unwrap();
        assert!(bad.validate().is_err());
    }

    #[test]
    fn thin_thresholds_are_for_thin_file_luns_and_in_range() {
        let text = "data_dir = \"state\"\n[[portal]]\naddress = \"127.0.0.1:3260\"\n\
                    [[target]]\niqn = \"iqn.2026-11.org.freesan:t1\"\n[[target.lun]]\n\
                    path = \"lun0.img\"\nsize = \"1G\"\n";
        let with = |extra: &str| {
            toml::from_str::<Config>(&format!("{text}{extra}"))
                .unwrap()
                .validate()
        };
        assert!(with("thin_threshold_percent = 80\n").is_ok());
        assert!(with("thin_threshold_percent = 0\n").is_err());
        assert!(with("thin_threshold_percent = 101\n").is_err());
        let thick = with("thin_threshold_percent = 80\nthick = true\n").unwrap_err();
        assert!(
            format!("{thick:#}").contains("thin (sparse file)"),
            "{thick:#}"
        );
    }

    #[test]
    fn buffer_memory_max_is_a_size_with_a_ram_based_default() {
        let mut l = LimitsConfig::default();
        let auto = l.buffer_memory_bytes().unwrap();
        assert!((64 << 20..=2 << 30).contains(&auto), "{auto}");
        assert_eq!(default_buffer_memory_bytes(4 << 30), 512 << 20);
        assert_eq!(default_buffer_memory_bytes(64 << 30), 2 << 30);
        assert_eq!(default_buffer_memory_bytes(256 << 20), 64 << 20);
        let c: LimitsConfig = toml::from_str("buffer_memory_max = \"512M\"").unwrap();
        assert_eq!(c.buffer_memory_bytes().unwrap(), 512 << 20);
        l.buffer_memory_max = Some("lots".into());
        assert!(l.buffer_memory_bytes().is_err());
        l.buffer_memory_max = Some("100K".into());
        assert!(l.buffer_memory_bytes().is_err(), "below 1M");
    }

    #[test]
    fn the_memory_default_heeds_the_cgroup_limit() {
        let host = tempfile::tempdir().unwrap();
        let put = |rel: &str, v: &str| {
            let p = host.path().join(rel);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, v).unwrap();
        };
        let at = |dir: &str| host.path().join(dir).display().to_string();
        let v2_at = |root: &str, point: &str| {
            format!("30 23 0:26 {root} {point} rw,nosuid - cgroup2 cgroup2 rw\n")
        };
        // v2: the smallest on the way down; "max" is none
        put("v2/system.slice/memory.max", "4294967296\n");
        put("v2/system.slice/freesan.service/memory.max", "max\n");
        let v2 = "0::/system.slice/freesan.service\n";
        let mounts = v2_at("/", &at("v2"));
        assert_eq!(cgroup_memory_limit(v2, &mounts), Some(4 << 30));
        put("v2/system.slice/freesan.service/memory.max", "1073741824\n");
        assert_eq!(cgroup_memory_limit(v2, &mounts), Some(1 << 30));
        // no mount of the hierarchy, or one of another file system: no limit
        assert_eq!(cgroup_memory_limit(v2, ""), None);
        let tmpfs = format!("31 23 0:27 / {} rw - tmpfs tmpfs rw\n", at("v2"));
        assert_eq!(cgroup_memory_limit(v2, &tmpfs), None);
        // a container's mount starts at its own cgroup: the process's
        // directory is the mount point, and the walk stops there, not at a
        // directory of the host's tree that happens to share a prefix (the
        // mount below has a kubepods/ of its own with a lower limit)
        put("c1/memory.max", "536870912\n");
        put("c1/kubepods/memory.max", "1048576\n");
        let inside = "0::/kubepods/pod1/c1\n";
        let mounts = v2_at("/kubepods/pod1/c1", &at("c1"));
        assert_eq!(cgroup_memory_limit(inside, &mounts), Some(512 << 20));
        // a process outside the mount's part of the tree reads nothing there,
        // nor one outside its cgroup namespace's root (`..`)
        assert_eq!(cgroup_memory_limit("0::/other\n", &mounts), None);
        let above = v2_at("/", &at("c1/kubepods"));
        assert_eq!(cgroup_memory_limit("0::/../x\n", &above), None);
        // a mount point with a space, escaped as mountinfo writes it
        put("with space/memory.max", "268435456\n");
        let escaped = at("with space").replace(' ', "\\040");
        assert!(escaped.contains("\\040"));
        assert_eq!(
            cgroup_memory_limit("0::/\n", &v2_at("/", &escaped)),
            Some(256 << 20)
        );
        // v1's memory controller; its "no limit" is a number near 2^63
        let v1 = "4:memory:/process_api/x\n3:cpuset:/\n";
        let v1_mounts = format!(
            "35 31 0:32 / {} rw,relatime - cgroup cgroup rw,memory\n\
             34 31 0:31 / {} rw,relatime - cgroup cgroup rw,cpuset\n",
            at("v1mem"),
            at("v1cpuset"),
        );
        put(
            "v1mem/process_api/x/memory.limit_in_bytes",
            "9223372036854771712\n",
        );
        // (a v1 hierarchy without the memory controller is not read)
        put("v1cpuset/memory.limit_in_bytes", "1048576\n");
        assert_eq!(cgroup_memory_limit(v1, &v1_mounts), None);
        put("v1mem/process_api/memory.limit_in_bytes", "2147483648\n");
        assert_eq!(cgroup_memory_limit(v1, &v1_mounts), Some(2 << 30));
        assert_eq!(cgroup_memory_limit("", &v1_mounts), None);
        assert_eq!(cgroup_memory_limit("garbage\n", &v1_mounts), None);
        assert_eq!(cgroup_memory_limit(v1, "garbage\n - \n"), None);
        // this machine's own files parse (whatever they hold)
        let _ = ram_bytes();
        // and the bound's default follows: an eighth of 1 GiB, at least 64 MiB
        assert_eq!(default_buffer_memory_bytes(1 << 30), 128 << 20);
    }

    #[test]
    fn buffer_shares_are_parts_of_the_node_bound() {
        let shares = |toml: &str, node: u64| {
            let c: LimitsConfig = toml::from_str(toml).unwrap();
            c.buffer_shares(node)
        };
        // defaults: a source a quarter, a session half of that, at least 32M
        assert_eq!(shares("", 2 << 30).unwrap(), (256 << 20, 512 << 20));
        assert_eq!(shares("", 64 << 20).unwrap(), (32 << 20, 32 << 20));
        assert_eq!(shares("", 16 << 20).unwrap(), (16 << 20, 16 << 20));
        // one set: the other's default follows it
        let session_1g = "session_buffer_max = \"1G\"";
        assert_eq!(shares(session_1g, 2 << 30).unwrap(), (1 << 30, 1 << 30));
        let source_128m = "source_buffer_max = \"128M\"";
        assert_eq!(
            shares(source_128m, 2 << 30).unwrap(),
            (128 << 20, 128 << 20)
        );
        assert_eq!(
            shares(source_128m, 1 << 30).unwrap(),
            (128 << 20, 128 << 20)
        );
        // both set
        let both = "session_buffer_max = \"64M\"\nsource_buffer_max = \"96M\"";
        assert_eq!(shares(both, 1 << 30).unwrap(), (64 << 20, 96 << 20));
        assert!(shares(both, 80 << 20).is_err(), "above the node's bound");
        let inverted = "session_buffer_max = \"64M\"\nsource_buffer_max = \"48M\"";
        let e = shares(inverted, 1 << 30).unwrap_err();
        assert!(e.to_string().contains("part of its source"), "{e}");
        // bounds of each
        assert!(shares("session_buffer_max = \"100M\"", 64 << 20).is_err());
        assert!(
            shares("session_buffer_max = \"16M\"", 1 << 30).is_err(),
            "below 32M"
        );
        assert!(
            shares("source_buffer_max = \"16M\"", 1 << 30).is_err(),
            "below 32M"
        );
        assert_eq!(
            shares("session_buffer_max = \"16M\"", 16 << 20).unwrap(),
            (16 << 20, 16 << 20),
            "all of a small node"
        );
        assert!(shares("session_buffer_max = \"some\"", 1 << 30).is_err());
    }

    #[test]
    fn debug_output_carries_no_secret() {
        let c: Config = toml::from_str(
            "data_dir = \"/d\"\nportal = []\ndiscovery_chap = { user = \"d\", secret = \"SECRET-DISCOVERY\" }\n\
             [alerts.smtp]\nserver = \"mail:25\"\nfrom = \"a@b\"\nto = [\"c@d\"]\nusername = \"u\"\npassword = \"SECRET-SMTP\"\n\
             [[target]]\niqn = \"iqn.2026-12.org.example:t\"\n\
             chap = { user = \"alice\", secret = \"SECRET-TARGET\" }\n\
             mutual_chap = { user = \"t\", secret = \"SECRET-MUTUAL\" }\n\
             [[target.chap_initiator]]\ninitiator = \"iqn.2026-12.org.example:i\"\nuser = \"bob\"\nsecret = \"SECRET-BOB\"\n",
        )
        .unwrap();
        let shown = format!(
            "{c:?} {:?}",
            api::TargetAccess::Chap(Some(("u".into(), "SECRET-API".into())))
        );
        assert!(!shown.contains("SECRET"), "{shown}");
        assert!(shown.contains("alice") && shown.contains("bob"), "{shown}");
    }
}
