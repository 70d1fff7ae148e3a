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
//! What it does not do: remember undelivered events across a restart (the
//! event log has them; `freesan events --since` shows what a receiver missed).

use super::{Event, Severity};
use crate::config::{AlertsConfig, SmtpConfig};
use anyhow::{bail, Context, Result};
use std::time::Duration;
use tokio::sync::mpsc;

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

/// Starts the delivery tasks for `cfg`, fed from `log`'s followers channel.
/// Nothing is started when no destination is configured.
pub fn start(cfg: &AlertsConfig, log: &super::log::EventLog) -> Result<()> {
    let min: Severity = match &cfg.min_severity {
        Some(s) => s.parse().map_err(|e| anyhow::anyhow!("[alerts]: {e}"))?,
        None => Severity::Warning,
    };
    let mut queues: Vec<(String, mpsc::Sender<Event>)> = Vec::new();
    if !cfg.webhook.is_empty() {
        let client = reqwest::Client::builder()
            .timeout(ATTEMPT_TIMEOUT)
            .user_agent(concat!("freesan/", env!("CARGO_PKG_VERSION")))
            .build()
            .context("[alerts] webhook HTTP client")?;
        for url in &cfg.webhook {
            let (tx, rx) = mpsc::channel(QUEUE_EVENTS);
            tokio::spawn(webhook_task(client.clone(), url.clone(), rx));
            queues.push((format!("webhook {url}"), tx));
        }
    }
    if let Some(m) = &cfg.smtp {
        let mailer = mailer(m)?;
        let (tx, rx) = mpsc::channel(QUEUE_EVENTS);
        tokio::spawn(smtp_task(mailer, m.clone(), rx));
        queues.push((format!("mail via {}", m.server), tx));
    }
    if queues.is_empty() {
        return Ok(());
    }
    let mut rx = log.subscribe();
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

async fn webhook_task(client: reqwest::Client, url: String, mut rx: mpsc::Receiver<Event>) {
    while let Some(e) = rx.recv().await {
        let body = match serde_json::to_vec(&e) {
            Ok(b) => b,
            Err(err) => {
                tracing::error!(seq = e.seq, "alerts: event not encoded: {err}");
                continue;
            }
        };
        for attempt in 1..=ATTEMPTS_MAX {
            back_off(attempt).await;
            let r = client
                .post(&url)
                .header(reqwest::header::CONTENT_TYPE, "application/json")
                .body(body.clone())
                .send()
                .await;
            match r {
                Ok(resp) if resp.status().is_success() => break,
                Ok(resp) => {
                    tracing::warn!(%url, seq = e.seq, attempt, status = %resp.status(), "alerts: webhook refused the event")
                }
                Err(err) => {
                    tracing::warn!(%url, seq = e.seq, attempt, "alerts: webhook not reached: {err}")
                }
            }
            if attempt == ATTEMPTS_MAX {
                tracing::error!(%url, seq = e.seq, "alerts: event given up for this webhook");
            }
        }
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

async fn smtp_task(mailer: Mailer, m: SmtpConfig, mut rx: mpsc::Receiver<Event>) {
    use lettre::AsyncTransport;
    while let Some(e) = rx.recv().await {
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
    }
}
