//! Delivery of events as `[alerts]` says: a JSON POST to every webhook, a mail
//! through the SMTP server; each event at or above `min_severity`.
//!
//! Each destination has its own task and its own bounded queue
//! ([`QUEUE_EVENTS`]): a slow or dead receiver delays only its own deliveries,
//! never the node (an event that finds the queue full is dropped for that
//! destination, with a warning; it stays in the event log). A delivery that
//! fails is tried again after 0.5 s, 1 s, 2 s, ... (at most 30 s apart), at most
//! [`ATTEMPTS_MAX`] times in all.
//!
//! Across restarts: each destination's last event delivered (or given up) is
//! kept in `DATA_DIR/alerts-delivered.json` ([`Cursors`]), written after every
//! delivery; at start, events of the log after it (at most [`QUEUE_EVENTS`],
//! oldest first) are delivered before new ones. So an event recorded just
//! before a crash, or while a receiver was down when the node stopped, still
//! arrives; delivery is at least once (a crash between a receiver's answer and
//! the cursor's write repeats that one event; `seq` tells a receiver so). A
//! destination new to the configuration starts at the log's end.
//!
//! Webhooks with `webhook_secret_file` are signed ([`sign`]): headers
//! [`TIMESTAMP_HEADER`] (Unix seconds, new on every attempt) and
//! [`SIGNATURE_HEADER`] (`sha256=` and the hex HMAC-SHA256, keyed with the
//! secret, of the timestamp, a dot and the body).

use super::{Event, Severity};
use crate::config::{AlertsConfig, SmtpConfig};
use anyhow::{bail, Context, Result};
use hmac::{Hmac, Mac};
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;

/// Header of a signed webhook POST: when it was signed, in Unix seconds.
pub const TIMESTAMP_HEADER: &str = "X-Freesan-Timestamp";
/// Header of a signed webhook POST: `sha256=` and the hex HMAC-SHA256 of
/// `TIMESTAMP.BODY`.
pub const SIGNATURE_HEADER: &str = "X-Freesan-Signature";
/// Fewest bytes a webhook secret may have.
pub const SECRET_MIN_BYTES: usize = 16;

/// Events waiting per destination before new ones are dropped for it.
pub const QUEUE_EVENTS: usize = 256;
/// Tries per event and destination.
pub const ATTEMPTS_MAX: u32 = 6;
/// Time one HTTP request or SMTP conversation may take.
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(10);
const BACKOFF_FIRST: Duration = Duration::from_millis(500);
const BACKOFF_MAX: Duration = Duration::from_secs(30);

/// Checks `[alerts.smtp]`.
pub fn check_smtp(m: &SmtpConfig) -> Result<()> {
    split_server(&m.server)?;
    m.from
        .parse::<lettre::message::Mailbox>()
        .map_err(|e| anyhow::anyhow!("[alerts.smtp] from {:?}: {e}", m.from))?;
    if m.to.is_empty() {
        bail!("[alerts.smtp] to: no recipient");
    }
    for t in &m.to {
        t.parse::<lettre::message::Mailbox>()
            .map_err(|e| anyhow::anyhow!("[alerts.smtp] to {t:?}: {e}"))?;
    }
    if m.username.is_some() != m.password.is_some() {
        bail!("[alerts.smtp] username and password go together");
    }
    if m.username.is_some() && !m.starttls {
        bail!("[alerts.smtp] a password is only sent with starttls = true");
    }
    Ok(())
}

fn split_server(s: &str) -> Result<(String, u16)> {
    let (host, port) = s
        .rsplit_once(':')
        .with_context(|| format!("[alerts.smtp] server {s:?}: expected host:port"))?;
    let port = port
        .parse()
        .with_context(|| format!("[alerts.smtp] server {s:?}: bad port"))?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if host.is_empty() {
        bail!("[alerts.smtp] server {s:?}: no host");
    }
    Ok((host.to_string(), port))
}

/// The webhook secret in `path`: its content without surrounding white
/// space, at least [`SECRET_MIN_BYTES`] long.
pub fn read_secret(path: &Path) -> Result<Vec<u8>> {
    // checked on the descriptor it is read from
    let text = block::private::read(path)
        .map_err(|e| anyhow::anyhow!("[alerts] webhook_secret_file {}: {e}", path.display()))?;
    let secret = text.trim_ascii().to_vec();
    if secret.len() < SECRET_MIN_BYTES {
        bail!(
            "[alerts] webhook_secret_file {}: the secret has {} bytes, at least {SECRET_MIN_BYTES} are needed",
            path.display(),
            secret.len()
        );
    }
    Ok(secret)
}

/// The value of [`SIGNATURE_HEADER`] for `body` sent at `timestamp`.
pub fn sign(secret: &[u8], timestamp: u64, body: &[u8]) -> String {
    let mut mac = <Hmac<sha2::Sha256> as Mac>::new_from_slice(secret)
        .expect("HMAC accepts keys of any length");
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    format!("sha256={}", hex::encode(mac.finalize().into_bytes()))
}

/// Each destination's last event delivered or given up, kept in
/// `DATA_DIR/alerts-delivered.json` (written whole: temporary file, fsync,
/// rename). A webhook is keyed there by the SHA-256 of its URL, not the URL:
/// a Slack-style URL is its own credential, and the file outlives a webhook
/// removed from the configuration.
pub struct Cursors {
    path: PathBuf,
    map: Mutex<BTreeMap<String, u64>>,
}

impl Cursors {
    /// The cursors kept in `data_dir` (none when the file is missing; an
    /// unreadable file is logged and counts as none).
    pub fn open(data_dir: &Path) -> Cursors {
        let path = data_dir.join("alerts-delivered.json");
        let map: BTreeMap<String, u64> = match std::fs::read(&path) {
            Ok(b) => serde_json::from_slice(&b).unwrap_or_else(|e| {
                tracing::warn!(file = %path.display(), "alerts: delivery cursors unreadable, starting at the log's end: {e}");
                BTreeMap::new()
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => BTreeMap::new(),
            Err(e) => {
                tracing::warn!(file = %path.display(), "alerts: delivery cursors unreadable, starting at the log's end: {e}");
                BTreeMap::new()
            }
        };
        // keys written by an earlier version carry the URL: hashed, and
        // the file written again at once, so the URLs leave the disk
        let plain = map.keys().any(|k| Self::key(k) != *k);
        let map: BTreeMap<String, u64> = map.into_iter().map(|(k, v)| (Self::key(&k), v)).collect();
        let c = Cursors {
            path,
            map: Mutex::new(map),
        };
        if plain {
            let map = c.map.lock();
            if let Err(e) = c.write(&map) {
                tracing::warn!(file = %c.path.display(), "alerts: delivery cursors not rewritten: {e:#}");
            }
        }
        c
    }

    /// The key of destination `dest` in the file: a webhook's URL hashed
    /// (a key already hashed stays as it is).
    fn key(dest: &str) -> String {
        use sha2::Digest;
        match dest.strip_prefix("webhook ") {
            Some(url) if !url.starts_with("sha256:") => {
                format!(
                    "webhook sha256:{}",
                    hex::encode(sha2::Sha256::digest(url.as_bytes()))
                )
            }
            _ => dest.to_string(),
        }
    }

    /// The last event handled for `dest`.
    pub fn get(&self, dest: &str) -> Option<u64> {
        self.map.lock().get(&Self::key(dest)).copied()
    }

    /// Records that `dest` is done with every event up to `seq`. A failing
    /// write is logged (the event may then be delivered again after a restart).
    pub fn set(&self, dest: &str, seq: u64) {
        let mut map = self.map.lock();
        map.insert(Self::key(dest), seq);
        if let Err(e) = self.write(&map) {
            tracing::warn!(file = %self.path.display(), "alerts: delivery cursor not saved: {e:#}");
        }
    }

    fn write(&self, map: &BTreeMap<String, u64>) -> Result<()> {
        block::durable::replace_file(&self.path, &serde_json::to_vec(map)?)?;
        Ok(())
    }
}

/// One destination's delivery task: what it is called and where its cursor
/// stands.
struct Dest {
    name: String,
    cursors: Arc<Cursors>,
    /// Events up to this one are done (delivered, given up, or older than the
    /// destination).
    done: u64,
}

impl Dest {
    /// True when `e` is new to this destination (the start-up backlog and the
    /// live feed may both hold it).
    fn is_new(&self, e: &Event) -> bool {
        e.seq > self.done
    }

    fn finished(&mut self, e: &Event) {
        self.done = e.seq;
        self.cursors.set(&self.name, e.seq);
    }
}

/// A destination's name as the logs show it: a webhook by its scheme and
/// host only.
fn shown_destination(name: &str) -> String {
    match name.strip_prefix("webhook ") {
        Some(u) => format!("webhook {}", crate::secrets::url_shown(u)),
        None => name.to_string(),
    }
}

/// What a destination whose cursor is at `done` has yet to get from `log`:
/// the events after it at or above `min`, oldest first, at most
/// [`QUEUE_EVENTS`] (the rest are logged as left in the event log only).
fn backlog(log: &super::log::EventLog, name: &str, done: u64, min: Severity) -> Vec<Event> {
    let mut b: Vec<Event> = log
        .since(done, usize::MAX)
        .into_iter()
        .filter(|e| e.severity >= min)
        .collect();
    if b.len() > QUEUE_EVENTS {
        tracing::warn!(
            "alerts: {name}: {} undelivered events from before the start; the oldest {QUEUE_EVENTS} are sent, the rest are in the event log only",
            b.len()
        );
        b.truncate(QUEUE_EVENTS);
    }
    b
}

/// Starts the delivery tasks for `cfg`, fed first with what `log` holds after
/// each destination's cursor in `data_dir`, then from `log`'s followers
/// channel. Nothing is started when no destination is configured.
pub fn start(cfg: &AlertsConfig, log: &super::log::EventLog, data_dir: &Path) -> Result<()> {
    let min: Severity = match &cfg.min_severity {
        Some(s) => s.parse().map_err(|e| anyhow::anyhow!("[alerts]: {e}"))?,
        None => Severity::Warning,
    };
    let secret = match &cfg.webhook_secret_file {
        Some(p) => Some(Arc::new(read_secret(p)?)),
        None => None,
    };
    // subscribed before the backlog is read: an event recorded in between is
    // in both, and each task skips what it has done
    let mut rx = log.subscribe();
    let cursors = Arc::new(Cursors::open(data_dir));
    let last = log.last_seq();
    let dest = |name: String| {
        // how the logs name it: a webhook URL's path may be its credential
        let shown = shown_destination(&name);
        let done = match cursors.get(&name) {
            // a cursor past the log's end: the log was started again (its file
            // removed or lost), its numbers restart at 1; kept, it would skip
            // every event, critical ones too, until the numbers passed it
            Some(c) if c > last => {
                tracing::warn!(
                    destination = %shown,
                    cursor = c,
                    last,
                    "alerts: delivery cursor past the end of the event log (the log was started again): delivering from its end"
                );
                cursors.set(&name, last);
                last
            }
            Some(c) => c,
            None => {
                // new here: the log's past is not for it, even after a crash
                cursors.set(&name, last);
                last
            }
        };
        let (tx, rx) = mpsc::channel(QUEUE_EVENTS);
        for e in backlog(log, &shown, done, min) {
            let _ = tx.try_send(e);
        }
        let d = Dest {
            name: name.clone(),
            cursors: cursors.clone(),
            done,
        };
        (shown, tx, rx, d)
    };
    let mut queues: Vec<(String, mpsc::Sender<Event>)> = Vec::new();
    if !cfg.webhook.is_empty() {
        let client = reqwest::Client::builder()
            .timeout(ATTEMPT_TIMEOUT)
            // never followed: a redirect would send the signed event (and
            // the URL, as Referer) wherever the answer points, internal
            // addresses and plain http included; a 3xx is a failed attempt
            // (review of 2026-12-06: reqwest follows ten by default)
            .redirect(reqwest::redirect::Policy::none())
            .referer(false)
            .user_agent(concat!("freesan/", env!("CARGO_PKG_VERSION")))
            .build()
            .context("[alerts] webhook HTTP client")?;
        for url in &cfg.webhook {
            let (name, tx, rx, d) = dest(format!("webhook {url}"));
            tokio::spawn(webhook_task(
                client.clone(),
                url.clone(),
                secret.clone(),
                rx,
                d,
            ));
            queues.push((name, tx));
        }
    }
    if let Some(m) = &cfg.smtp {
        let mailer = mailer(m)?;
        let (name, tx, rx, d) = dest(format!("mail via {}", m.server));
        tokio::spawn(smtp_task(mailer, m.clone(), rx, d));
        queues.push((name, tx));
    }
    if queues.is_empty() {
        return Ok(());
    }
    tokio::spawn(async move {
        loop {
            let e = match rx.recv().await {
                Ok(e) => e,
                Err(tokio::sync::broadcast::error::RecvError::Lagged(n)) => {
                    tracing::warn!("alerts: {n} events not delivered (too many at once)");
                    continue;
                }
                Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
            };
            if e.severity < min {
                continue;
            }
            for (name, q) in &queues {
                if q.try_send(e.clone()).is_err() {
                    tracing::warn!(
                        seq = e.seq,
                        "alerts: {name} is behind; event not delivered there"
                    );
                }
            }
        }
    });
    Ok(())
}

/// Waits before try `attempt` (1-based; none before the first).
async fn back_off(attempt: u32) {
    if attempt > 1 {
        let d = BACKOFF_FIRST.saturating_mul(1 << (attempt - 2).min(16));
        tokio::time::sleep(d.min(BACKOFF_MAX)).await;
    }
}

async fn webhook_task(
    client: reqwest::Client,
    url: String,
    secret: Option<Arc<Vec<u8>>>,
    mut rx: mpsc::Receiver<Event>,
    mut dest: Dest,
) {
    while let Some(e) = rx.recv().await {
        if !dest.is_new(&e) {
            continue;
        }
        let body = match serde_json::to_vec(&e) {
            Ok(b) => b,
            Err(err) => {
                tracing::error!(seq = e.seq, "alerts: event not encoded: {err}");
                continue;
            }
        };
        for attempt in 1..=ATTEMPTS_MAX {
            back_off(attempt).await;
            let mut req = client
                .post(&url)
                .header(reqwest::header::CONTENT_TYPE, "application/json");
            if let Some(secret) = &secret {
                let now = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap_or_default()
                    .as_secs();
                req = req
                    .header(TIMESTAMP_HEADER, now.to_string())
                    .header(SIGNATURE_HEADER, sign(secret, now, &body));
            }
            let r = req.body(body.clone()).send().await;
            // logged without the URL's path and user: webhook URLs often carry
            // their credential there (reqwest's error would quote it whole)
            let shown = crate::secrets::url_shown(&url);
            match r {
                Ok(resp) if resp.status().is_success() => break,
                Ok(resp) => {
                    tracing::warn!(url = %shown, seq = e.seq, attempt, status = %resp.status(), "alerts: webhook refused the event")
                }
                Err(err) => {
                    let err = err.without_url();
                    tracing::warn!(url = %shown, seq = e.seq, attempt, "alerts: webhook not reached: {err}")
                }
            }
            if attempt == ATTEMPTS_MAX {
                tracing::error!(url = %shown, seq = e.seq, "alerts: event given up for this webhook");
            }
        }
        dest.finished(&e);
    }
}

type Mailer = lettre::AsyncSmtpTransport<lettre::Tokio1Executor>;

fn mailer(m: &SmtpConfig) -> Result<Mailer> {
    let (host, port) = split_server(&m.server)?;
    let b = if m.starttls {
        Mailer::starttls_relay(&host).context("[alerts.smtp] STARTTLS")?
    } else {
        Mailer::builder_dangerous(&host)
    };
    let mut b = b.port(port).timeout(Some(ATTEMPT_TIMEOUT));
    if let (Some(u), Some(p)) = (&m.username, &m.password) {
        b = b.credentials(lettre::transport::smtp::authentication::Credentials::new(
            u.clone(),
            p.clone(),
        ));
    }
    Ok(b.build())
}

/// The mail for event `e`: the subject says what and how bad, the body is the
/// message and the event as JSON.
pub fn message(m: &SmtpConfig, e: &Event) -> Result<lettre::Message> {
    let mut b = lettre::Message::builder()
        .from(m.from.parse()?)
        .subject(format!(
            "[freesan {}] {} {}: {}",
            e.severity.as_str(),
            e.kind.as_str(),
            e.object,
            e.message
        ));
    for t in &m.to {
        b = b.to(t.parse()?);
    }
    let body = format!(
        "{}\n\n{}\n",
        e.message,
        serde_json::to_string_pretty(e).unwrap_or_default()
    );
    Ok(b.body(body)?)
}

async fn smtp_task(mailer: Mailer, m: SmtpConfig, mut rx: mpsc::Receiver<Event>, mut dest: Dest) {
    use lettre::AsyncTransport;
    while let Some(e) = rx.recv().await {
        if !dest.is_new(&e) {
            continue;
        }
        let msg = match message(&m, &e) {
            Ok(msg) => msg,
            Err(err) => {
                tracing::error!(seq = e.seq, "alerts: mail not built: {err:#}");
                continue;
            }
        };
        for attempt in 1..=ATTEMPTS_MAX {
            back_off(attempt).await;
            match mailer.send(msg.clone()).await {
                Ok(_) => break,
                Err(err) => {
                    tracing::warn!(server = %m.server, seq = e.seq, attempt, "alerts: mail not sent: {err}")
                }
            }
            if attempt == ATTEMPTS_MAX {
                tracing::error!(server = %m.server, seq = e.seq, "alerts: event given up for mail");
            }
        }
        dest.finished(&e);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::{EventKind, NewEvent};

    /// A webhook URL's path (Slack-style, its credential) is in no message:
    /// neither the config check's (which reload answers and start prints)
    /// nor the delivery's log lines. Before, both printed the whole URL.
    #[test]
    fn a_webhook_url_is_shown_by_its_host_only() {
        for bad in [
            "hooks.example.com/x/SECRETPATH",
            "ftp://hooks.example.com/x/SECRETPATH",
        ] {
            let a = crate::config::AlertsConfig {
                webhook: vec![bad.into()],
                ..Default::default()
            };
            let err = format!("{:#}", crate::events::check_config(&a).unwrap_err());
            assert!(!err.contains("SECRETPATH"), "{err}");
        }
        let shown = shown_destination("webhook https://hooks.example.com/x/SECRETPATH?k=v");
        assert_eq!(shown, "webhook https://hooks.example.com/...");
        assert_eq!(
            shown_destination("mail via smtp.example.com"),
            "mail via smtp.example.com"
        );
    }

    #[test]
    fn the_signature_is_hmac_sha256_of_timestamp_dot_body() {
        // computed independently with Python's hmac module
        assert_eq!(
            sign(b"0123456789abcdef0123", 1_700_000_000, br#"{"seq":1}"#),
            "sha256=497235f4b973c0d0b5be795c35486ed0a915f0a89c0cbd4c186c992dfbf8d85c"
        );
        let a = sign(b"0123456789abcdef0123", 1_700_000_000, br#"{"seq":2}"#);
        let b = sign(b"0123456789abcdef0123", 1_700_000_001, br#"{"seq":1}"#);
        let c = sign(b"0123456789abcdef012X", 1_700_000_000, br#"{"seq":1}"#);
        assert_ne!(a, b);
        assert_ne!(a, c);
        assert_ne!(b, c);
    }

    #[test]
    fn a_short_or_missing_secret_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("hook.key");
        assert!(read_secret(&p).is_err());
        use std::os::unix::fs::PermissionsExt;
        std::fs::write(&p, "  short secret \n").unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        let e = read_secret(&p).unwrap_err().to_string();
        assert!(e.contains("12 bytes"), "{e}");
        std::fs::write(&p, " 0123456789abcdef \n").unwrap();
        assert_eq!(read_secret(&p).unwrap(), b"0123456789abcdef");
        // readable by others: refused (before, any mode was read)
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = read_secret(&p).unwrap_err().to_string();
        assert!(e.contains("chmod 600"), "{e}");
    }

    #[test]
    fn cursors_survive_reopening_and_a_torn_file_counts_as_none() {
        let dir = tempfile::tempdir().unwrap();
        let c = Cursors::open(dir.path());
        assert_eq!(c.get("webhook http://a/"), None);
        c.set("webhook http://a/", 7);
        c.set("mail via m:25", 3);
        c.set("webhook http://a/", 9);
        let c = Cursors::open(dir.path());
        assert_eq!(c.get("webhook http://a/"), Some(9));
        assert_eq!(c.get("mail via m:25"), Some(3));
        std::fs::write(dir.path().join("alerts-delivered.json"), b"{\"webhook").unwrap();
        assert_eq!(Cursors::open(dir.path()).get("webhook http://a/"), None);
    }

    /// A webhook's URL (its own credential, Slack-style) is never written to
    /// the cursor file, and one an earlier version wrote there is replaced
    /// by its hash when the file is opened.
    #[test]
    fn the_cursor_file_holds_no_webhook_url() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("alerts-delivered.json");
        let hook = "webhook https://hooks.example.com/services/T0/B0/s3cr3tTOKEN";
        let c = Cursors::open(dir.path());
        c.set(hook, 4);
        let text = std::fs::read_to_string(&file).unwrap();
        assert!(
            !text.contains("s3cr3tTOKEN") && !text.contains("hooks.example"),
            "{text}"
        );
        assert_eq!(Cursors::open(dir.path()).get(hook), Some(4));
        // written by an earlier version, URL and all
        std::fs::write(&file, format!("{{\"{hook}\":11,\"mail via m:25\":2}}")).unwrap();
        let c = Cursors::open(dir.path());
        let text = std::fs::read_to_string(&file).unwrap();
        assert!(!text.contains("s3cr3tTOKEN"), "{text}");
        assert_eq!(c.get(hook), Some(11));
        assert_eq!(c.get("mail via m:25"), Some(2));
    }

    #[test]
    fn the_backlog_is_what_follows_the_cursor_at_or_above_the_severity() {
        let dir = tempfile::tempdir().unwrap();
        let log = crate::events::log::EventLog::open(dir.path(), 1000).unwrap();
        let sevs = [Severity::Warning, Severity::Info, Severity::Critical];
        for i in 0..QUEUE_EVENTS + 30 {
            log.emit(NewEvent::new(
                sevs[i % 3],
                EventKind::DiskFailed,
                format!("d{i}"),
                "x",
            ));
        }
        let seqs = |b: Vec<Event>| b.iter().map(|e| e.seq).collect::<Vec<_>>();
        assert_eq!(
            seqs(backlog(&log, "t", 0, Severity::Warning))[..4],
            [1, 3, 4, 6]
        );
        assert_eq!(seqs(backlog(&log, "t", 3, Severity::Critical))[..2], [6, 9]);
        let last = log.last_seq();
        assert!(backlog(&log, "t", last, Severity::Info).is_empty());
        assert_eq!(
            seqs(backlog(&log, "t", last - 2, Severity::Info)),
            [last - 1, last]
        );
        // bounded by the queue, oldest first
        let all = backlog(&log, "t", 0, Severity::Info);
        assert_eq!(all.len(), QUEUE_EVENTS);
        assert_eq!(all[0].seq, 1);
    }

    /// Reads one HTTP request on a connection of `l` and answers `answer`.
    async fn answer_one(l: &tokio::net::TcpListener, answer: &str) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (mut c, _) = l.accept().await.unwrap();
        let mut got = Vec::new();
        let mut buf = [0u8; 4096];
        while !got.windows(4).any(|w| w == b"\r\n\r\n") {
            match c.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
        let _ = c.write_all(answer.as_bytes()).await;
    }

    /// A webhook that answers with a redirect is not followed: the event
    /// (signed, with the URL as Referer) goes nowhere else, and the answer
    /// counts as a failed attempt, tried again. Before (review of
    /// 2026-12-06), reqwest followed it, to internal addresses too.
    #[tokio::test]
    async fn a_webhooks_redirect_is_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let log = crate::events::log::EventLog::open(dir.path(), 100).unwrap();
        let hook = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let elsewhere = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let redirect = format!(
            "HTTP/1.1 307 Temporary Redirect\r\nLocation: http://{}/internal\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
            elsewhere.local_addr().unwrap()
        );
        let cfg = AlertsConfig {
            webhook: vec![format!("http://{}/hook", hook.local_addr().unwrap())],
            ..AlertsConfig::default()
        };
        start(&cfg, &log, dir.path()).unwrap();
        log.emit(NewEvent::new(
            Severity::Critical,
            EventKind::DiskFailed,
            "d0",
            "x",
        ));
        // the first attempt is redirected; the second comes to the hook again
        tokio::time::timeout(Duration::from_secs(20), async {
            answer_one(&hook, &redirect).await;
            answer_one(&hook, &redirect).await;
        })
        .await
        .expect("the redirect was not taken as a failed attempt");
        assert!(
            tokio::time::timeout(Duration::from_millis(100), elsewhere.accept())
                .await
                .is_err(),
            "the event was sent where the redirect pointed"
        );
    }

    /// A destination without a cursor starts at the log's end, and that is
    /// written down at once (a crash before its first delivery must not make
    /// the next start send it the log's past); one with a cursor keeps it.
    #[tokio::test]
    async fn a_new_destination_starts_at_the_end_of_the_log() {
        let dir = tempfile::tempdir().unwrap();
        let log = crate::events::log::EventLog::open(dir.path(), 100).unwrap();
        for i in 0..3 {
            log.emit(NewEvent::new(
                Severity::Critical,
                EventKind::DiskFailed,
                format!("d{i}"),
                "x",
            ));
        }
        Cursors::open(dir.path()).set("webhook http://127.0.0.1:9/old", 1);
        let cfg = AlertsConfig {
            webhook: vec![
                "http://127.0.0.1:9/old".into(),
                "http://127.0.0.1:9/new".into(),
            ],
            ..AlertsConfig::default()
        };
        start(&cfg, &log, dir.path()).unwrap();
        let c = Cursors::open(dir.path());
        assert_eq!(c.get("webhook http://127.0.0.1:9/new"), Some(3));
        // the one with a cursor keeps it until it delivers something
        assert_eq!(c.get("webhook http://127.0.0.1:9/old"), Some(1));
    }
}
