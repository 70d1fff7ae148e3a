//! The node's events: everything an operator must know (a disk or cache device
//! failed, a spare was pulled in, a rebuild started or finished, the partner was
//! lost, ...), each with a severity. They are kept in a bounded log that
//! survives restarts ([`log::EventLog`], `DATA_DIR/events.jsonl`), offered to
//! followers (the API's `GET /api/v1/events`), and delivered to webhooks and
//! by mail ([`deliver`]) as `[alerts]` says.
//!
//! Where events come from: [`watch`] polls the layers' typed status once a
//! second and emits one event per state transition (edge-triggered), and
//! follows the SCSI targets' thin provisioning events; it never sits in the
//! data path.
//!
//! What it does not do: decide or repair anything; an event only reports.
//!
//! Invariant: sequence numbers only grow, across restarts too; an event is on
//! disk (appended and fsynced) before anyone is told of it.

pub mod deliver;
pub mod log;
pub mod watch;

use serde::{Deserialize, Serialize};

/// How urgently an operator must act.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, Hash)]
#[serde(rename_all = "snake_case")]
pub enum Severity {
    /// Worth knowing; nothing to do (a rebuild finished, a resync is done).
    Info,
    /// Redundancy or a safety margin is reduced; act soon.
    Warning,
    /// Data is at risk or service is lost; act now.
    Critical,
}

impl Severity {
    /// The name used in the config and in JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            Severity::Info => "info",
            Severity::Warning => "warning",
            Severity::Critical => "critical",
        }
    }
}

impl std::str::FromStr for Severity {
    type Err = String;
    fn from_str(s: &str) -> Result<Severity, String> {
        match s {
            "info" => Ok(Severity::Info),
            "warning" => Ok(Severity::Warning),
            "critical" => Ok(Severity::Critical),
            o => Err(format!(
                "unknown severity {o:?} (info, warning or critical)"
            )),
        }
    }
}

/// What happened (serialised snake_case, e.g. `disk_failed`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Hash)]
#[serde(rename_all = "snake_case")]
pub enum EventKind {
    /// The node started (its event log was opened).
    NodeStarted,
    /// A pool member failed (I/O errors, missing, or failed by request).
    DiskFailed,
    /// A disk did not answer a request within its command timeout and is
    /// taken as failed (whatever holds it: pool, cache, LUN, nothing).
    DiskStoppedAnswering,
    /// A disk had no answer within its command timeout but was waited for,
    /// its pool or cache unable to do without it (see `disk::TimedDisk`).
    DiskStalled,
    /// A pool lost more members than it can and stopped serving.
    PoolFailed,
    /// A hot spare took a failed member's place.
    SparePulledIn,
    /// A rebuild onto a member started.
    RebuildStarted,
    /// A rebuild finished; the pool is redundant again.
    RebuildFinished,
    /// A rebuild cannot read a stripe it needs and retries it.
    RebuildStalled,
    /// A rebuild met unreadable sectors where no redundancy was left and gave
    /// up those pool blocks (reads of them fail until they are written).
    BlocksLost,
    /// A scrub found blocks that disagreed or could not be read.
    ScrubFoundErrors,
    /// An SSD of a cache failed.
    CacheDeviceFailed,
    /// An SSD of a cache answered reads of cached data with unreadable
    /// sectors (it stays in service; the data came from another copy or the
    /// backing volume, or the host's read failed where no copy held it).
    CacheMediaErrors,
    /// A write-back cache fell back to write-through (no mirror left).
    CacheWriteThrough,
    /// A write-back cache lost acknowledged data: a resilver found it
    /// unreadable on the surviving half (reads of it fail until written).
    CacheDataLost,
    /// A cache is healthy again (device replaced, resilvered).
    CacheRecovered,
    /// The HA partner is unreachable; this node serves alone or waits.
    PartnerLost,
    /// The HA partner is back.
    PartnerReturned,
    /// This node's role for a replicated volume changed (failover, takeover).
    RoleChanged,
    /// A resync finished; both copies are the same again.
    ResyncDone,
    /// The two copies took writes apart; joining them was refused.
    SplitBrainRefused,
    /// Who may reach a replicated LUN (initiator ACL, CHAP users, host groups)
    /// differs between the two nodes.
    ReplicaAccessDiffers,
    /// Who may reach a replicated LUN is the same on both nodes again.
    ReplicaAccessAgrees,
    /// A thin LUN's backing store crossed its soft threshold.
    ThinThresholdReached,
    /// A thin LUN's backing store is full; writes fail.
    ThinOutOfSpace,
    /// A source failed iSCSI authentication repeatedly and was locked out.
    LoginFailuresRepeated,
    /// A TLS certificate of the node expires within 30 days (or has expired).
    CertificateExpiring,
}

impl EventKind {
    /// The snake_case name (as in JSON).
    pub fn as_str(self) -> String {
        serde_json::to_value(self)
            .ok()
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default()
    }
}

/// One event of the node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    /// Sequence number: grows by one per event, across restarts.
    pub seq: u64,
    /// When, in milliseconds since the Unix epoch.
    pub time_unix_ms: u64,
    /// When, as RFC 3339 (UTC).
    pub time: String,
    /// How urgent.
    pub severity: Severity,
    /// What happened.
    pub kind: EventKind,
    /// The object concerned: a pool, disk, cache, LUN, replicated volume or file.
    pub object: String,
    /// What an operator reads.
    pub message: String,
}

/// An event before it is numbered and stamped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewEvent {
    /// How urgent.
    pub severity: Severity,
    /// What happened.
    pub kind: EventKind,
    /// The object concerned.
    pub object: String,
    /// What an operator reads.
    pub message: String,
}

impl NewEvent {
    /// An event of `kind` about `object`.
    pub fn new(
        severity: Severity,
        kind: EventKind,
        object: impl Into<String>,
        message: impl Into<String>,
    ) -> NewEvent {
        NewEvent {
            severity,
            kind,
            object: object.into(),
            message: message.into(),
        }
    }
}

/// Checks `[alerts]`: severities, URLs and mail settings.
pub fn check_config(a: &crate::config::AlertsConfig) -> anyhow::Result<()> {
    if let Some(s) = &a.min_severity {
        s.parse::<Severity>()
            .map_err(|e| anyhow::anyhow!("[alerts] min_severity: {e}"))?;
    }
    for u in &a.webhook {
        // named as the logs name it: a URL's path and query may be its credential
        let shown = crate::secrets::url_shown(u);
        let url =
            reqwest::Url::parse(u).map_err(|e| anyhow::anyhow!("[alerts] webhook {shown}: {e}"))?;
        if url.scheme() != "http" && url.scheme() != "https" {
            anyhow::bail!("[alerts] webhook {shown}: only http and https URLs");
        }
    }
    if a.log_events_max == Some(0) {
        anyhow::bail!("[alerts] log_events_max must be at least 1");
    }
    if let Some(m) = &a.smtp {
        deliver::check_smtp(m)?;
    }
    if let Some(p) = &a.webhook_secret_file {
        if a.webhook.is_empty() {
            anyhow::bail!("[alerts] webhook_secret_file without a webhook");
        }
        deliver::read_secret(p)?;
    }
    Ok(())
}
