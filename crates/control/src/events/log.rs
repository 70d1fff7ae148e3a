//! The persisted, bounded event log: `DATA_DIR/events.jsonl`, one JSON event a
//! line, appended and fsynced per event (events are rare); the last
//! `events_max` are also kept in memory and answer the API. When the file holds
//! a tenth more than the bound it is rewritten with the last `events_max` only
//! (new file, fsync, rename, fsync the folder), so it never grows without bound.
//!
//! What it does not do: deliver events anywhere (see [`super::deliver`]).
//!
//! Invariant: sequence numbers continue after a restart (the next is one more
//! than the largest in the file); a torn last line (crash mid-append) is skipped.

use super::{Event, NewEvent};
use anyhow::{Context, Result};
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Events kept when `[alerts] log_events_max` is not set.
pub const DEFAULT_EVENTS_MAX: usize = 10_000;

/// Events a follower may fall behind by before it misses some.
const FOLLOW_QUEUE: usize = 1024;

struct State {
    events: VecDeque<Event>,
    next_seq: u64,
    /// Lines in the file now (kept and dropped ones).
    file_lines: usize,
}

/// The node's event log.
pub struct EventLog {
    path: PathBuf,
    events_max: usize,
    state: Mutex<State>,
    tx: tokio::sync::broadcast::Sender<Event>,
    /// The last sequence number in the file when it was opened: numbers above
    /// it are this run's.
    opened_at: u64,
}

/// Milliseconds since the Unix epoch and the RFC 3339 form of now.
fn now() -> (u64, String) {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let ms = t.as_millis() as u64;
    let text = time::OffsetDateTime::from_unix_timestamp_nanos(t.as_nanos() as i128)
        .ok()
        .and_then(|d| {
            d.replace_nanosecond(d.millisecond() as u32 * 1_000_000)
                .ok()
        })
        .and_then(|d| {
            d.format(&time::format_description::well_known::Rfc3339)
                .ok()
        })
        .unwrap_or_default();
    (ms, text)
}

impl EventLog {
    /// Opens (or starts) the log in `data_dir`, keeping at most `events_max` events.
    pub fn open(data_dir: &Path, events_max: usize) -> Result<EventLog> {
        let path = data_dir.join("events.jsonl");
        let events_max = events_max.max(1);
        let mut events = VecDeque::new();
        let mut file_lines = 0;
        let mut last_seq = 0;
        match std::fs::File::open(&path) {
            Ok(f) => {
                // by bytes: a line torn in the middle of a character is not
                // UTF-8, and is skipped like any other unreadable line
                // (read as text, it stopped the node from starting)
                for (i, line) in std::io::BufReader::new(f).split(b'\n').enumerate() {
                    let line = line.with_context(|| format!("reading {}", path.display()))?;
                    file_lines += 1;
                    match serde_json::from_slice::<Event>(&line) {
                        Ok(e) => {
                            last_seq = last_seq.max(e.seq);
                            events.push_back(e);
                            if events.len() > events_max {
                                events.pop_front();
                            }
                        }
                        Err(e) => tracing::warn!(
                            file = %path.display(),
                            line = i + 1,
                            "event log: unreadable line skipped: {e}"
                        ),
                    }
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e).with_context(|| format!("opening {}", path.display())),
        }
        let (tx, _) = tokio::sync::broadcast::channel(FOLLOW_QUEUE);
        let log = EventLog {
            path,
            events_max,
            state: Mutex::new(State {
                events,
                next_seq: last_seq + 1,
                file_lines,
            }),
            tx,
            opened_at: last_seq,
        };
        // a file left over the bound (a smaller bound configured, or a crash
        // before the rewrite) is cut now
        {
            let mut st = log.state.lock();
            if st.file_lines > st.events.len() {
                log.rewrite(&mut st)?;
            }
        }
        Ok(log)
    }

    /// Numbers, stamps and records `e` (appended to the file and fsynced), then
    /// tells the followers. A failing disk does not silence the event: it is
    /// still kept in memory and told (with a warning in the node's log).
    pub fn emit(&self, e: NewEvent) -> Event {
        let (time_unix_ms, time) = now();
        let mut st = self.state.lock();
        let ev = Event {
            seq: st.next_seq,
            time_unix_ms,
            time,
            severity: e.severity,
            kind: e.kind,
            object: e.object,
            message: e.message,
        };
        st.next_seq += 1;
        if let Err(err) = self.append(&ev) {
            tracing::warn!(file = %self.path.display(), "event log: not recorded: {err:#}");
        } else {
            st.file_lines += 1;
        }
        st.events.push_back(ev.clone());
        if st.events.len() > self.events_max {
            st.events.pop_front();
        }
        if st.file_lines > self.events_max + self.events_max / 10 {
            if let Err(err) = self.rewrite(&mut st) {
                tracing::warn!(file = %self.path.display(), "event log: not cut: {err:#}");
            }
        }
        drop(st);
        match ev.severity {
            super::Severity::Critical => {
                tracing::error!(kind = %ev.kind.as_str(), object = %ev.object, "{}", ev.message)
            }
            super::Severity::Warning => {
                tracing::warn!(kind = %ev.kind.as_str(), object = %ev.object, "{}", ev.message)
            }
            super::Severity::Info => {
                tracing::info!(kind = %ev.kind.as_str(), object = %ev.object, "{}", ev.message)
            }
        }
        // no follower is no error
        let _ = self.tx.send(ev.clone());
        ev
    }

    /// [`EventLog::emit`] from async code: the append and its fsync run on the
    /// blocking pool, not on a runtime worker.
    pub async fn record(self: &Arc<Self>, e: NewEvent) {
        let log = self.clone();
        if let Err(err) = tokio::task::spawn_blocking(move || log.emit(e)).await {
            tracing::warn!("event log: recording failed: {err}");
        }
    }

    fn append(&self, e: &Event) -> Result<()> {
        let mut line = serde_json::to_vec(e)?;
        line.push(b'\n');
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.path)?;
        f.write_all(&line)?;
        f.sync_data()?;
        Ok(())
    }

    /// Replaces the file by the events in memory (the last `events_max`).
    fn rewrite(&self, st: &mut State) -> Result<()> {
        let mut buf = Vec::new();
        for e in &st.events {
            serde_json::to_writer(&mut buf, e)?;
            buf.push(b'\n');
        }
        block::durable::replace_file(&self.path, &buf)?;
        st.file_lines = st.events.len();
        Ok(())
    }

    /// Up to `limit` events with a sequence number above `since`, oldest first.
    pub fn since(&self, since: u64, limit: usize) -> Vec<Event> {
        let st = self.state.lock();
        st.events
            .iter()
            .filter(|e| e.seq > since)
            .take(limit)
            .cloned()
            .collect()
    }

    /// Where a reader whose cursor is at `since` reads on from. A cursor past
    /// the last event can only come from an earlier run whose last events never
    /// reached the file (the disk failing, or the file removed): this run
    /// numbered its events again from the file's last, so such a reader kept
    /// its cursor would miss them. It reads every event of this run instead.
    pub fn cursor(&self, since: u64) -> u64 {
        if since >= self.state.lock().next_seq {
            self.opened_at
        } else {
            since
        }
    }

    /// The sequence number of the last event (0: none yet).
    pub fn last_seq(&self) -> u64 {
        self.state.lock().next_seq - 1
    }

    /// Every event from now on, as it is recorded (a follower more than 1024
    /// events behind misses some and is told so by the channel).
    pub fn subscribe(&self) -> tokio::sync::broadcast::Receiver<Event> {
        self.tx.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::{EventKind, Severity};

    fn ev(i: usize) -> NewEvent {
        NewEvent::new(
            Severity::Warning,
            EventKind::DiskFailed,
            format!("d{i}"),
            "failed",
        )
    }

    #[test]
    fn survives_reopen_and_stays_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let log = EventLog::open(dir.path(), 10).unwrap();
        for i in 0..25 {
            assert_eq!(log.emit(ev(i)).seq, i as u64 + 1);
        }
        assert_eq!(log.since(0, 100).len(), 10);
        drop(log);
        let text = std::fs::read_to_string(dir.path().join("events.jsonl")).unwrap();
        assert!(
            text.lines().count() <= 11,
            "file bounded: {}",
            text.lines().count()
        );
        // a torn last line, as a crash mid-append leaves it
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(dir.path().join("events.jsonl"))
            .unwrap();
        // (torn inside a character: not UTF-8 either)
        f.write_all(b"{\"seq\":26,\"object\":\"\xc3").unwrap();
        drop(f);
        let log = EventLog::open(dir.path(), 10).unwrap();
        let kept = log.since(0, 100);
        assert_eq!(kept.len(), 10);
        assert_eq!(kept.last().unwrap().seq, 25);
        assert_eq!(kept.last().unwrap().object, "d24");
        assert_eq!(log.emit(ev(99)).seq, 26);
        assert_eq!(log.since(25, 100).len(), 1);
    }

    /// Events whose append failed are numbered and told, but the next run
    /// numbers on from the file's last: a reader whose cursor passed the file's
    /// end reads this run's events, not only those above its cursor.
    #[test]
    fn a_reader_past_the_end_after_lost_appends_reads_the_new_runs_events() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("events.jsonl");
        let log = EventLog::open(dir.path(), 100).unwrap();
        for i in 0..3 {
            log.emit(ev(i));
        }
        // the file cannot be appended to: events 4 and 5 are told, not kept
        std::fs::rename(&file, dir.path().join("kept")).unwrap();
        std::fs::create_dir(&file).unwrap();
        assert_eq!(log.emit(ev(3)).seq, 4);
        assert_eq!(log.emit(ev(4)).seq, 5);
        let reader = log.last_seq();
        assert_eq!(log.cursor(reader), 5);
        drop(log);
        std::fs::remove_dir(&file).unwrap();
        std::fs::rename(dir.path().join("kept"), &file).unwrap();
        let log = EventLog::open(dir.path(), 100).unwrap();
        assert_eq!(log.emit(ev(5)).seq, 4);
        let seen = log.since(log.cursor(reader), 100);
        assert_eq!(seen.len(), 1, "{seen:?}");
        assert_eq!(seen[0].object, "d5");
        // a reader within the log reads on from its cursor
        assert_eq!(log.cursor(3), 3);
        assert_eq!(log.cursor(4), 4);
    }
}
