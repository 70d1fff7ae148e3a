//! Running `freesan serve` as a service: systemd notifications (READY=1 after the
//! banner, RELOADING=1/READY=1 around a reload, STOPPING=1, WATCHDOG=1 at half of
//! WATCHDOG_USEC), SIGHUP as a reload request, and the log format (text or JSON
//! lines for collectors).
//!
//! What it does not do: anything when the process was not started by systemd
//! (no NOTIFY_SOCKET: every notification is a no-op), or the reload itself
//! ([`control::reload`]).

use anyhow::Result;
use control::config::Config;
use control::reload::{Lifecycle, LoadConfig};
use control::serve;
use std::sync::Arc;

/// How log lines are written to stderr.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines (colours on a terminal).
    Text,
    /// One JSON object per line (timestamp, level, target, fields).
    Json,
}

/// Installs the global log subscriber: `format`, else `FREESAN_LOG_FORMAT`
/// (`json` or `text`), else text; the filter comes from `RUST_LOG` (default info).
pub fn init_logs(format: Option<LogFormat>) {
    let format = format.unwrap_or_else(|| match std::env::var("FREESAN_LOG_FORMAT") {
        Ok(v) if v.eq_ignore_ascii_case("json") => LogFormat::Json,
        _ => LogFormat::Text,
    });
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Text => builder
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .init(),
    }
}

fn notify(state: &[sd_notify::NotifyState]) {
    if let Err(e) = sd_notify::notify(false, state) {
        tracing::warn!("sd_notify: {e}");
    }
}

/// Tells systemd of the node's lifecycle (a no-op without NOTIFY_SOCKET).
fn lifecycle(l: Lifecycle) {
    use sd_notify::NotifyState as N;
    match l {
        Lifecycle::Ready | Lifecycle::Reloaded => notify(&[N::Ready, N::Status("serving")]),
        Lifecycle::Reloading => notify(&[N::Reloading, N::Status("reloading")]),
        Lifecycle::Stopping => notify(&[N::Stopping, N::Status("stopping")]),
    }
}

/// Pings systemd's watchdog at half its period, from a task of the node's
/// runtime (so a runtime that stops running tasks stops the pings).
fn spawn_watchdog() {
    let mut usec = 0u64;
    if !sd_notify::watchdog_enabled(false, &mut usec) || usec == 0 {
        return;
    }
    let period = std::time::Duration::from_micros(usec / 2);
    tracing::info!(
        period_ms = period.as_millis() as u64,
        "systemd watchdog enabled"
    );
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(period);
        loop {
            tick.tick().await;
            notify(&[sd_notify::NotifyState::Watchdog]);
        }
    });
}

/// Sends one reload request per SIGHUP (a request already waiting absorbs
/// further signals: the reload reads the file when it runs).
fn sighup_requests() -> Option<tokio::sync::mpsc::Receiver<()>> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut hup = match signal(SignalKind::hangup()) {
        Ok(h) => h,
        Err(e) => {
            tracing::error!("cannot watch SIGHUP (no reload on signal): {e}");
            return None;
        }
    };
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    tokio::spawn(async move {
        while hup.recv().await.is_some() {
            tracing::info!("SIGHUP: reloading the configuration");
            if let Err(tokio::sync::mpsc::error::TrySendError::Closed(_)) = tx.try_send(()) {
                return;
            }
        }
    });
    Some(rx)
}

/// Serves `cfg` until `stop_signal` ends; reloads with `load` on SIGHUP and
/// `POST /api/v1/reload`.
pub async fn serve<S, F>(cfg: Config, load: LoadConfig, stop_signal: S) -> Result<()>
where
    S: FnOnce() -> F,
    F: std::future::Future<Output = ()>,
{
    spawn_watchdog();
    let hooks = serve::Hooks {
        load_config: Some(load),
        reload_requests: sighup_requests(),
        lifecycle: Some(Arc::new(lifecycle)),
    };
    serve::run_with(cfg, stop_signal, hooks).await
}
