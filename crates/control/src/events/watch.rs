//! Where events come from: a task that polls the layers' typed status once a
//! second (pools, caches, replicated volumes, iSCSI authentication counters)
//! and emits one event per state transition, tasks that follow each SCSI
//! target's LU events (thin provisioning), and a daily look at the node's TLS
//! certificates.
//!
//! What it does not do: sit in the data path. What is already wrong at the
//! first poll (a pool member that failed while the node was down, a cache in
//! write-through) is said once then, as a transition would have been; a
//! healthy start says nothing.
//!
//! Invariant: edge-triggered: a condition that lasts yields one event when it
//! begins (and, for some, one when it ends), never one per poll.

use super::log::EventLog;
use super::{EventKind as K, NewEvent, Severity as S};
use crate::cluster::Cluster;
use crate::pools::Pools;
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How often the layers' states are compared.
const POLL: Duration = Duration::from_secs(1);
/// How often the certificates are looked at (also at start).
const CERT_CHECK: Duration = Duration::from_secs(24 * 3600);
/// A certificate this close to its end is reported.
const CERT_WARN_DAYS: i64 = 30;

/// What the watcher looks at.
pub struct Sources {
    /// The node's pools and caches.
    pub pools: Arc<Pools>,
    /// The node's side of its HA pair, if any.
    pub cluster: Option<Arc<Cluster>>,
    /// The SCSI targets (iqn, target), for their LU events.
    pub targets: Vec<(String, Arc<scsi::ScsiTarget>)>,
    /// The iSCSI server's failed-authentication counters.
    pub auth: Option<Arc<iscsi::AuthStats>>,
    /// TLS certificate files (PEM) whose expiry is watched; missing ones skipped.
    pub certificates: Vec<PathBuf>,
}

/// The node's TLS certificates: the API's serving certificate, and NBD's
/// certificate and authority (made at first start unless configured).
pub fn certificate_files(cfg: &crate::config::Config) -> Vec<PathBuf> {
    let mut v = vec![api::tls::serving_cert_file(&cfg.data_dir)];
    if let Some(n) = &cfg.nbd {
        let dir = cfg.data_dir.join("nbd");
        v.push(
            n.tls_cert
                .clone()
                .unwrap_or_else(|| dir.join("server-cert.pem")),
        );
        v.push(dir.join("ca-cert.pem"));
    }
    v
}

/// Starts the watcher tasks; they run as long as the runtime does.
pub fn start(log: Arc<EventLog>, src: Sources) {
    for (iqn, t) in &src.targets {
        follow(&log, iqn, t);
    }
    let certs = src.certificates.clone();
    let l = log.clone();
    tokio::spawn(async move {
        let mut reported = BTreeSet::new();
        let mut tick = tokio::time::interval(CERT_CHECK);
        loop {
            tick.tick().await;
            // file reads and the log's fsync: on the blocking pool
            let (l, certs) = (l.clone(), certs.clone());
            let r = tokio::task::spawn_blocking(move || {
                check_certificates(&l, &certs, &mut reported);
                reported
            });
            match r.await {
                Ok(r) => reported = r,
                Err(e) => {
                    tracing::warn!("certificate check failed: {e}");
                    return;
                }
            }
        }
    });
    tokio::spawn(async move {
        let mut st = State::default();
        let mut tick = tokio::time::interval(POLL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            for e in st.poll(&src) {
                log.record(e).await;
            }
        }
    });
}

/// Records target `iqn`'s LU events (thin provisioning thresholds, out of
/// space) in `log` from now on (also for targets a reload adds).
pub(crate) fn follow(log: &Arc<EventLog>, iqn: &str, t: &scsi::ScsiTarget) {
    tokio::spawn(follow_target(
        log.clone(),
        iqn.to_string(),
        t.subscribe_events(),
    ));
}

async fn follow_target(
    log: Arc<EventLog>,
    iqn: String,
    mut rx: tokio::sync::broadcast::Receiver<scsi::LuEvent>,
) {
    use tokio::sync::broadcast::error::RecvError;
    loop {
        let e = match rx.recv().await {
            Ok(e) => e,
            Err(RecvError::Lagged(n)) => {
                tracing::warn!(target = %iqn, "{n} LU events missed");
                continue;
            }
            Err(RecvError::Closed) => return,
        };
        let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
        let ev = match e {
            scsi::LuEvent::ThinThresholdReached {
                lun,
                mapped_bytes,
                threshold_bytes,
                available_bytes,
            } => NewEvent::new(
                S::Warning,
                K::ThinThresholdReached,
                format!("{iqn}/lun{lun}"),
                format!(
                    "thin LUN {lun} of {iqn} uses {:.2} GiB, over its threshold of {:.2} GiB; \
                     {:.2} GiB left on its backing store",
                    gib(mapped_bytes),
                    gib(threshold_bytes),
                    gib(available_bytes)
                ),
            ),
            scsi::LuEvent::ThinOutOfSpace { lun, mapped_bytes } => NewEvent::new(
                S::Critical,
                K::ThinOutOfSpace,
                format!("{iqn}/lun{lun}"),
                format!(
                    "thin LUN {lun} of {iqn} is out of space ({:.2} GiB used): writes fail",
                    gib(mapped_bytes)
                ),
            ),
        };
        log.record(ev).await;
    }
}

/// What the last poll saw.
#[derive(Default)]
struct State {
    /// Polled at least once (the first poll is the baseline).
    primed: bool,
    pools: BTreeMap<String, raid::PoolStatus>,
    /// Each cache's state line, devices and lost bytes.
    caches: BTreeMap<String, (String, Vec<cache::DeviceStatus>, u64)>,
    /// Caches reported unhealthy and not yet recovered.
    caches_reported: BTreeSet<String>,
    /// Each cache device's count of unreadable sectors when last reported,
    /// and when.
    media_reported: BTreeMap<String, (u64, Instant)>,
    replicas: BTreeMap<String, ReplicaSeen>,
    lockouts: u64,
    /// Disks said to have stopped answering.
    disks_stopped: BTreeSet<String>,
    /// Each disk's count of requests waited for past their timeout at the
    /// last look, and whether its stall was said and goes on.
    disks_held: BTreeMap<String, (u64, bool)>,
}

#[derive(Clone)]
struct ReplicaSeen {
    connected: bool,
    /// The last settled role (not Deciding).
    role: Option<replica::Role>,
    state: &'static str,
    split_brain: bool,
    lost_reported: bool,
    /// Who may reach the LUN differs between the nodes (why).
    access_mismatch: Option<String>,
}

impl State {
    fn poll(&mut self, src: &Sources) -> Vec<NewEvent> {
        let mut out = Vec::new();
        let primed = self.primed;
        // pools
        for p in src.pools.pool_statuses() {
            if let Some(old) = self.pools.get(&p.name) {
                pool_events(old, &p, &mut out);
            } else if !primed {
                standing_pool_events(&p, &mut out);
            }
            self.pools.insert(p.name.clone(), p);
        }
        // disks that stopped answering (failed for good: said once)
        for (name, t) in src.pools.disk_timings() {
            if let Some(e) = disk_stalled(&name, &t, &mut self.disks_held) {
                out.push(e);
            }
            if let Some(e) = disk_stopped_answering(&name, &t, &mut self.disks_stopped) {
                out.push(e);
            }
        }
        // caches
        for c in src.pools.cache_health() {
            let crate::pools::CacheHealth {
                name,
                mode,
                state,
                devices,
                lost_bytes,
            } = c;
            if let Some((old_state, old_devs, _)) = self.caches.get(&name) {
                let seen = (&mut self.media_reported, Instant::now());
                cache_device_events(&name, mode, (old_devs, &devices), seen, &mut out);
                if state.contains("write-through") && !old_state.contains("write-through") {
                    out.push(NewEvent::new(
                        S::Warning,
                        K::CacheWriteThrough,
                        name.clone(),
                        format!("cache {name} fell back to write-through: {state}"),
                    ));
                    self.caches_reported.insert(name.clone());
                }
                if state != "ok" && !state.starts_with("draining") {
                    self.caches_reported.insert(name.clone());
                }
                if state == "ok" && *old_state != "ok" && self.caches_reported.remove(&name) {
                    out.push(NewEvent::new(
                        S::Info,
                        K::CacheRecovered,
                        name.clone(),
                        format!("cache {name} is healthy again"),
                    ));
                }
            }
            if !primed && !self.caches.contains_key(&name) {
                // what already holds at start: said once, as the edges would
                for (i, d) in devices
                    .iter()
                    .enumerate()
                    .filter(|(_, d)| d.state == "failed")
                {
                    out.push(NewEvent::new(
                        if mode == cache::CacheMode::WriteBack {
                            S::Critical
                        } else {
                            S::Warning
                        },
                        K::CacheDeviceFailed,
                        format!("{name}/{}", d.name),
                        format!("cache {name}: device {i} ({}) is failed at start", d.name),
                    ));
                }
                if state.contains("write-through") {
                    out.push(NewEvent::new(
                        S::Warning,
                        K::CacheWriteThrough,
                        name.clone(),
                        format!("cache {name} starts in write-through: {state}"),
                    ));
                }
                if state != "ok" && !state.starts_with("draining") {
                    self.caches_reported.insert(name.clone());
                }
            }
            let old_lost = self.caches.get(&name).map(|c| c.2);
            out.extend(cache_data_lost(&name, old_lost, lost_bytes));
            self.caches.insert(name, (state, devices, lost_bytes));
        }
        // replicated volumes
        if let Some(c) = &src.cluster {
            for r in c.replica_statuses() {
                let settled = !matches!(r.role, replica::Role::Deciding);
                let now = ReplicaSeen {
                    connected: r.peer.is_some(),
                    role: if settled { Some(r.role) } else { None },
                    state: r.state,
                    split_brain: r.reason.contains("split brain"),
                    lost_reported: false,
                    access_mismatch: r.access_mismatch.clone(),
                };
                let old = self.replicas.get(&r.name).cloned().unwrap_or(ReplicaSeen {
                    // first sight: only a mismatch already found is said
                    access_mismatch: None,
                    ..now.clone()
                });
                let name = &r.name;
                match (&old.access_mismatch, &now.access_mismatch) {
                    (None, Some(why)) => out.push(NewEvent::new(
                        S::Warning,
                        K::ReplicaAccessDiffers,
                        name.clone(),
                        format!("{name}: {why}"),
                    )),
                    (Some(_), None) => out.push(NewEvent::new(
                        S::Info,
                        K::ReplicaAccessAgrees,
                        name.clone(),
                        format!("{name}: who may reach the LUN is the same on both nodes again"),
                    )),
                    _ => {}
                }
                if !self.replicas.contains_key(name) {
                    self.replicas.insert(r.name.clone(), now);
                    continue;
                }
                let mut seen = now.clone();
                seen.role = now.role.or(old.role);
                seen.lost_reported = old.lost_reported;
                if old.connected && !now.connected {
                    out.push(NewEvent::new(
                        S::Critical,
                        K::PartnerLost,
                        name.clone(),
                        format!("{name}: lost the HA partner ({})", r.reason),
                    ));
                    seen.lost_reported = true;
                }
                if !old.connected && now.connected && old.lost_reported {
                    out.push(NewEvent::new(
                        S::Info,
                        K::PartnerReturned,
                        name.clone(),
                        format!("{name}: the HA partner is back"),
                    ));
                    seen.lost_reported = false;
                }
                if let (Some(a), Some(b)) = (old.role, now.role) {
                    if a != b {
                        let alone = matches!(b, replica::Role::Solo | replica::Role::Down);
                        out.push(NewEvent::new(
                            if alone { S::Warning } else { S::Info },
                            K::RoleChanged,
                            name.clone(),
                            format!(
                                "{name}: this node's role changed from {} to {} ({})",
                                role_name(a),
                                role_name(b),
                                r.reason
                            ),
                        ));
                    }
                }
                if old.state == "resyncing" && now.state == "in-sync" {
                    out.push(NewEvent::new(
                        S::Info,
                        K::ResyncDone,
                        name.clone(),
                        format!("{name}: resync done; both copies are the same"),
                    ));
                }
                if now.split_brain && !old.split_brain {
                    out.push(NewEvent::new(
                        S::Critical,
                        K::SplitBrainRefused,
                        name.clone(),
                        format!("{name}: joining the copies was refused: {}", r.reason),
                    ));
                }
                self.replicas.insert(r.name.clone(), seen);
            }
        }
        // repeated failed logins
        if let Some(a) = &src.auth {
            let n = a.lockouts_total.load(std::sync::atomic::Ordering::Relaxed);
            if primed && n > self.lockouts {
                let source = a
                    .last_locked_source
                    .lock()
                    .map_or_else(|| "-".to_string(), |s| s.to_string());
                out.push(NewEvent::new(
                    S::Warning,
                    K::LoginFailuresRepeated,
                    source.clone(),
                    format!(
                        "iSCSI logins from {source} failed authentication repeatedly; \
                         the source is locked out for a while ({} lockouts since start)",
                        n
                    ),
                ));
            }
            self.lockouts = n;
        }
        self.primed = true;
        out
    }
}

fn role_name(r: replica::Role) -> String {
    serde_json::to_value(r)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_else(|| format!("{r:?}"))
}

/// The events between two statuses of one pool.
fn pool_events(old: &raid::PoolStatus, new: &raid::PoolStatus, out: &mut Vec<NewEvent>) {
    use raid::{MemberState as M, PoolState as P};
    let pool = &new.name;
    let old_spares: BTreeSet<&str> = old.spares.iter().map(|s| s.name.as_str()).collect();
    // a fast rebuild may run between two looks: a member replaced by another
    // (a spare) says that its disk failed even if Failed was never seen
    let mut rebuilt_unseen = false;
    for m in &new.members {
        let Some(was) = old.members.iter().find(|o| o.position == m.position) else {
            continue;
        };
        let replaced = was.name != m.name;
        if was.state != M::Failed && (m.state == M::Failed || replaced) {
            out.push(NewEvent::new(
                S::Critical,
                K::DiskFailed,
                was.name.clone(),
                format!(
                    "pool {pool}: member {} ({}) failed; the pool is {}",
                    m.position,
                    was.name,
                    pool_state_name(new.state)
                ),
            ));
        }
        if replaced && old_spares.contains(m.name.as_str()) {
            out.push(NewEvent::new(
                S::Warning,
                K::SparePulledIn,
                m.name.clone(),
                format!(
                    "pool {pool}: hot spare {} took the place of member {} ({})",
                    m.name, m.position, was.name
                ),
            ));
        }
        if m.state == M::Active && (replaced || was.state != M::Active) {
            rebuilt_unseen = true;
        }
    }
    for d in &new.journal_devices {
        let was_serving = old
            .journal_devices
            .iter()
            .any(|o| o.uuid == d.uuid && !o.failed);
        if d.failed && was_serving {
            out.push(journal_device_failed(new, &d.name, "failed"));
        }
    }
    if new.state == P::Failed && old.state != P::Failed {
        out.push(NewEvent::new(
            S::Critical,
            K::PoolFailed,
            pool.clone(),
            format!("pool {pool} lost more members than it can: I/O fails"),
        ));
    }
    let unseen = old.rebuild.is_none() && new.rebuild.is_none() && rebuilt_unseen;
    if (old.rebuild.is_none() && new.rebuild.is_some()) || unseen {
        let total = new.rebuild.as_ref().map_or(0, |p| p.total_bytes);
        out.push(NewEvent::new(
            S::Info,
            K::RebuildStarted,
            pool.clone(),
            format!(
                "pool {pool}: rebuild started ({:.1} GiB to copy)",
                total as f64 / (1u64 << 30) as f64
            ),
        ));
    }
    if (old.rebuild.is_some() && new.rebuild.is_none()) || unseen {
        let ok = new.state != P::Failed
            && !new
                .members
                .iter()
                .any(|m| matches!(m.state, M::Failed | M::Rebuilding));
        out.push(NewEvent::new(
            if ok { S::Info } else { S::Warning },
            K::RebuildFinished,
            pool.clone(),
            if ok {
                format!("pool {pool}: rebuild finished; the pool is redundant again")
            } else {
                format!(
                    "pool {pool}: rebuild ended; the pool is {}",
                    pool_state_name(new.state)
                )
            },
        ));
    }
    // from the second failed try: one failure can be a member failing,
    // which the pool's own events tell
    let held = |p: &raid::PoolStatus| p.rebuild_stalled.clone().filter(|s| s.attempts >= 2);
    if let (None, Some(stall)) = (held(old), held(new)) {
        out.push(NewEvent::new(
            S::Critical,
            K::RebuildStalled,
            pool.clone(),
            format!(
                "pool {pool}: the rebuild cannot go past stripe {} ({}); it retries, and the \
                 pool does not regain its full redundancy until the stripe is read or its \
                 unreadable rows are given up (recorded as lost blocks)",
                stall.stripe, stall.error
            ),
        ));
    }
    if new.lost_blocks > old.lost_blocks {
        out.push(blocks_lost(new, Some(new.lost_blocks - old.lost_blocks)));
    }
    if let Some(r) = &new.last_scrub {
        let bad = r.mismatches + r.read_errors + r.unrepairable;
        if old.last_scrub.as_ref() != Some(r) && bad > 0 {
            out.push(NewEvent::new(
                if r.unrepairable > 0 {
                    S::Critical
                } else {
                    S::Warning
                },
                K::ScrubFoundErrors,
                pool.clone(),
                format!(
                    "pool {pool}: scrub found {} mismatched and {} unreadable blocks; \
                     {} repaired, {} could not be",
                    r.mismatches, r.read_errors, r.repaired, r.unrepairable
                ),
            ));
        }
    }
}

/// The event for `added` more lost blocks of pool `p` (None: at start, all
/// of them).
fn blocks_lost(p: &raid::PoolStatus, added: Option<u64>) -> NewEvent {
    let pool = &p.name;
    let what = match added {
        Some(n) => format!("{n} more block(s)"),
        None => "some blocks".to_string(),
    };
    let first: Vec<String> = p
        .lost_ranges
        .iter()
        .take(4)
        .map(|&[a, n]| {
            if n == 1 {
                format!("{a}")
            } else {
                format!("{a}-{}", a + n - 1)
            }
        })
        .collect();
    NewEvent::new(
        S::Critical,
        K::BlocksLost,
        pool.clone(),
        format!(
            "pool {pool}: {what} could not be recovered (unreadable sectors with no \
             redundancy left); {} lost in all, at pool blocks {}{}; reads of them fail \
             until they are written again (restore those blocks from a backup)",
            p.lost_blocks,
            first.join(", "),
            if p.lost_ranges.len() > 4 { ", ..." } else { "" }
        ),
    )
}

/// The event, if any, for cache `name` having lost `lost` bytes of
/// acknowledged data where the last poll saw `old` (`None`: not seen before,
/// at start or just attached: said if any is lost). A mirror's resilver
/// found them unreadable on the survivor (see
/// `cache::CacheStatus::lost_dirty_bytes`).
fn cache_data_lost(name: &str, old: Option<u64>, lost: u64) -> Option<NewEvent> {
    let what = match old {
        Some(o) if lost > o => format!("lost {} more bytes of written data", lost - o),
        None if lost > 0 => "holds written data recorded lost".to_string(),
        _ => return None,
    };
    Some(NewEvent::new(
        S::Critical,
        K::CacheDataLost,
        name.to_string(),
        format!(
            "cache {name} {what} ({lost} bytes in all): no copy of it could be read when the \
             mirror was resilvered; reads of those blocks fail (medium error) until they are \
             written again (restore them from a backup); the log names the blocks"
        ),
    ))
}

/// The event, once per failure, for disk `name` whose timing `t` says it
/// stopped answering (`said`: the disks reported and not taken back since).
fn disk_stopped_answering(
    name: &str,
    t: &disk::DiskTiming,
    said: &mut BTreeSet<String>,
) -> Option<NewEvent> {
    let Some(why) = t.failed.as_ref() else {
        // (taken back: a failure after it is said again)
        said.remove(name);
        return None;
    };
    if !said.insert(name.to_string()) {
        return None;
    }
    Some(NewEvent::new(
        S::Critical,
        K::DiskStoppedAnswering,
        name.to_string(),
        format!(
            "disk {name} stopped answering ({why}): it is taken as failed, every request \
             to it fails until it is taken back (freesan disk reopen, once it answers \
             again) or the node restarts; its pool or cache goes on without it"
        ),
    ))
}

/// The event for disk `name` whose timing `t` says requests to it wait past
/// their command timeout now, or waited since the last look (`seen`: each
/// disk's count of such waits then, and whether its stall was said): once a
/// stall, which ends at a look that finds none waiting and no new wait.
fn disk_stalled(
    name: &str,
    t: &disk::DiskTiming,
    seen: &mut BTreeMap<String, (u64, bool)>,
) -> Option<NewEvent> {
    let (before, said) = seen.get(name).copied().unwrap_or((0, false));
    // (a disk opened again under the name counts from 0)
    let stalled = t.holding > 0 || t.held != before;
    seen.insert(name.to_string(), (t.held, stalled));
    if !stalled || said || t.failed.is_some() {
        return None;
    }
    Some(NewEvent::new(
        S::Critical,
        K::DiskStalled,
        name.to_string(),
        format!(
            "disk {name} has not answered a request within its command timeout, but is \
             waited for instead of failed: what it serves cannot do without it now (it \
             holds the last redundancy or the only copy of unwritten data, or every disk \
             beside it stopped answering too). Requests to it wait until it answers; \
             silent for {} more timeouts, it is failed",
            disk::KEEP_TIMEOUT_FACTOR - 1
        ),
    ))
}

/// A pool as the first look finds it: what is already wrong (a member failed
/// while the node was down, a pool that cannot serve, a rebuild resumed) is said
/// once, so an operator hears of it even though no transition was seen.
fn standing_pool_events(p: &raid::PoolStatus, out: &mut Vec<NewEvent>) {
    use raid::{MemberState as M, PoolState as P};
    let pool = &p.name;
    for m in p.members.iter().filter(|m| m.state == M::Failed) {
        out.push(NewEvent::new(
            S::Critical,
            K::DiskFailed,
            m.name.clone(),
            format!(
                "pool {pool}: member {} ({}) is failed at start; the pool is {}",
                m.position,
                m.name,
                pool_state_name(p.state)
            ),
        ));
    }
    for d in p.journal_devices.iter().filter(|d| d.failed) {
        out.push(journal_device_failed(p, &d.name, "is failed at start"));
    }
    for name in &p.journal_devices_missing {
        out.push(journal_device_failed(
            p,
            name,
            "is not in use at start (missing, or dropped after a failure until wiped)",
        ));
    }
    if p.state == P::Failed {
        out.push(NewEvent::new(
            S::Critical,
            K::PoolFailed,
            pool.clone(),
            format!("pool {pool} starts with more members lost than it can: I/O fails"),
        ));
    }
    if p.lost_blocks > 0 {
        out.push(blocks_lost(p, None));
    }
    if let Some(r) = &p.rebuild {
        out.push(NewEvent::new(
            S::Info,
            K::RebuildStarted,
            pool.clone(),
            format!(
                "pool {pool}: rebuild resumed at start ({:.1} GiB to copy)",
                r.total_bytes.saturating_sub(r.done_bytes) as f64 / (1u64 << 30) as f64
            ),
        ));
    }
}

/// A journal device of pool `p` failed (`how`): where its records go now.
fn journal_device_failed(p: &raid::PoolStatus, device: &str, how: &str) -> NewEvent {
    let serving: Vec<&str> = p
        .journal_devices
        .iter()
        .filter(|d| !d.failed)
        .map(|d| d.name.as_str())
        .collect();
    let now = match serving.as_slice() {
        [] => "the stripe journal is back on the members (slower small writes)".to_string(),
        [one] => format!(
            "the stripe journal goes on unmirrored on {one}; give a blank disk in its place \
             (it joins at the next start)"
        ),
        more => format!("the stripe journal goes on on {}", more.join(" and ")),
    };
    NewEvent::new(
        S::Critical,
        K::DiskFailed,
        device.to_string(),
        format!("pool {}: journal device {device} {how}; {now}", p.name),
    )
}

fn pool_state_name(s: raid::PoolState) -> String {
    serde_json::to_value(s)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_else(|| format!("{s:?}"))
}

/// Reports each certificate (file, serial) within [`CERT_WARN_DAYS`] of its end
/// once per node run.
fn check_certificates(log: &EventLog, files: &[PathBuf], reported: &mut BTreeSet<String>) {
    let now = time::OffsetDateTime::now_utc().unix_timestamp();
    for f in files {
        let Ok(pem) = std::fs::read(f) else { continue };
        let not_after = match first_cert_not_after(&pem) {
            Ok(t) => t,
            Err(e) => {
                tracing::warn!(file = %f.display(), "certificate not read: {e}");
                continue;
            }
        };
        let days = (not_after - now).div_euclid(86_400);
        let key = format!("{}:{not_after}", f.display());
        if days < CERT_WARN_DAYS && reported.insert(key) {
            let expired = not_after <= now;
            log.emit(NewEvent::new(
                if expired { S::Critical } else { S::Warning },
                K::CertificateExpiring,
                f.display().to_string(),
                if expired {
                    format!("the TLS certificate {} has expired", f.display())
                } else {
                    format!("the TLS certificate {} expires in {days} days", f.display())
                },
            ));
        }
    }
}

/// The end of validity (Unix seconds) of the first certificate in a PEM file.
fn first_cert_not_after(pem: &[u8]) -> Result<i64, String> {
    for p in x509_parser::pem::Pem::iter_from_buffer(pem) {
        let p = p.map_err(|e| e.to_string())?;
        if p.label != "CERTIFICATE" {
            continue;
        }
        let c = p.parse_x509().map_err(|e| e.to_string())?;
        return Ok(c.validity().not_after.timestamp());
    }
    Err("no certificate in the file".into())
}

/// How often a cache device whose unreadable sectors keep growing is
/// reported again: a dirty sector no copy can read is met again at every
/// destage pass, and each would be a new event.
const MEDIA_REPORT_EVERY: Duration = Duration::from_secs(3600);

/// What changed on the devices of cache `name` between two polls (`old`,
/// `new`): a device that failed, and one whose count of unreadable sectors
/// grew past what was last reported (again after [`MEDIA_REPORT_EVERY`] at
/// the earliest, a growth within it included; `reported`: the count and time
/// of each device's last report, and the time now).
fn cache_device_events(
    name: &str,
    mode: cache::CacheMode,
    (old_devs, devices): (&[cache::DeviceStatus], &[cache::DeviceStatus]),
    (reported, now): (&mut BTreeMap<String, (u64, Instant)>, Instant),
    out: &mut Vec<NewEvent>,
) {
    for (i, d) in devices.iter().enumerate() {
        let object = format!("{name}/{}", d.name);
        let last = reported.get(&object).copied();
        if last.is_some_and(|(n, _)| d.media_errors < n) {
            // another device of that name (a replacement): its own count
            reported.remove(&object);
        }
        let (baseline, quiet) = match reported.get(&object) {
            Some(&(n, t)) => (n, now.saturating_duration_since(t) < MEDIA_REPORT_EVERY),
            None => (old_devs.get(i).map_or(0, |d| d.media_errors), false),
        };
        if d.media_errors > baseline && !quiet {
            reported.insert(object.clone(), (d.media_errors, now));
            out.push(NewEvent::new(
                S::Warning,
                K::CacheMediaErrors,
                object,
                format!(
                    "cache {name}: device {i} ({}) answered {} read(s) of cached data with unreadable sectors since the start; it stays in service: clean data came from the backing volume, mirrored data from the other half (and was written again), dirty data no copy held failed the host's read and stays dirty; replace the device if the count keeps rising (said again within the hour at most)",
                    d.name,
                    d.media_errors
                ),
            ));
        }
        let was = old_devs.get(i).map(|d| d.state.as_str());
        if d.state == "failed" && was != Some("failed") {
            let wb = mode == cache::CacheMode::WriteBack;
            out.push(NewEvent::new(
                if wb { S::Critical } else { S::Warning },
                K::CacheDeviceFailed,
                format!("{name}/{}", d.name),
                format!(
                    "cache {name}: device {i} ({}) failed{}",
                    d.name,
                    if wb {
                        "; the write-back cache has lost its mirror"
                    } else {
                        ""
                    }
                ),
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{
        cache_data_lost, cache_device_events, disk_stalled, disk_stopped_answering, pool_events,
        standing_pool_events, K, S,
    };

    #[test]
    fn a_disk_waited_for_past_its_timeout_is_said_once_a_stall() {
        let mut said = std::collections::BTreeMap::new();
        let t = |holding, held| disk::DiskTiming {
            holding,
            held,
            ..Default::default()
        };
        assert!(disk_stalled("d1", &t(0, 0), &mut said).is_none());
        let e = disk_stalled("d1", &t(1, 1), &mut said).expect("said");
        assert_eq!((e.kind, e.severity), (K::DiskStalled, S::Critical));
        // the same stall goes on: not said again, waits counted or not
        assert!(disk_stalled("d1", &t(3, 4), &mut said).is_none());
        assert!(disk_stalled("d1", &t(1, 4), &mut said).is_none());
        // a look with none waiting and no new wait ends it; the next is said
        assert!(disk_stalled("d1", &t(0, 5), &mut said).is_none());
        assert!(disk_stalled("d1", &t(0, 5), &mut said).is_none());
        assert!(disk_stalled("d1", &t(2, 6), &mut said).is_some());
        // a stall begun and ended between two looks is said too
        assert!(disk_stalled("d1", &t(0, 6), &mut said).is_none());
        assert!(disk_stalled("d1", &t(0, 6), &mut said).is_none());
        assert!(disk_stalled("d1", &t(0, 8), &mut said).is_some());
        assert!(disk_stalled("d2", &t(1, 1), &mut said).is_some());
        // given up: said as stopped answering instead
        let failed = disk::DiskTiming {
            holding: 1,
            failed: Some("x".into()),
            ..Default::default()
        };
        assert!(disk_stalled("d3", &failed, &mut said).is_none());
    }

    #[test]
    fn a_disk_that_stopped_answering_is_said_once() {
        let mut said = std::collections::BTreeSet::new();
        let ok = disk::DiskTiming::default();
        assert!(disk_stopped_answering("d1", &ok, &mut said).is_none());
        let hung = disk::DiskTiming {
            timeouts: 1,
            failed: Some("a write at lba 8 had no answer in 20.0 s".into()),
            ..Default::default()
        };
        let e = disk_stopped_answering("d1", &hung, &mut said).expect("said");
        assert_eq!((e.kind, e.severity), (K::DiskStoppedAnswering, S::Critical));
        assert!(e.message.contains("lba 8"), "{}", e.message);
        assert!(disk_stopped_answering("d1", &hung, &mut said).is_none());
        assert!(disk_stopped_answering("d2", &hung, &mut said).is_some());
        // taken back (freesan disk reopen), then failed again: said again
        assert!(disk_stopped_answering("d1", &ok, &mut said).is_none());
        assert!(disk_stopped_answering("d1", &hung, &mut said).is_some());
    }

    #[test]
    fn cache_data_lost_is_said_when_it_grows_and_when_first_seen() {
        let said =
            |old, new| cache_data_lost("c", old, new).map(|e| (e.kind, e.severity, e.message));
        assert!(said(None, 0).is_none());
        assert!(said(Some(4096), 4096).is_none());
        // written again: less lost, nothing to say
        assert!(said(Some(8192), 4096).is_none());
        let (k, s, m) = said(None, 4096).unwrap();
        assert_eq!((k, s), (K::CacheDataLost, S::Critical));
        assert!(
            m.contains("recorded lost") && m.contains("4096 bytes in all"),
            "{m}"
        );
        let (k, _, m) = said(Some(4096), 12288).unwrap();
        assert_eq!(k, K::CacheDataLost);
        assert!(
            m.contains("8192 more") && m.contains("12288 bytes in all"),
            "{m}"
        );
    }

    #[test]
    fn a_cache_device_whose_unreadable_sectors_grow_is_reported_each_time() {
        let dev = |state: &str, media_errors: u64| cache::DeviceStatus {
            name: "ssd0".into(),
            state: state.into(),
            media_errors,
        };
        let t0 = std::time::Instant::now();
        let mut reported = std::collections::BTreeMap::new();
        let mut events = |old: &[cache::DeviceStatus], new: &[cache::DeviceStatus], at: u64| {
            let mut out = Vec::new();
            let now = t0 + std::time::Duration::from_secs(at);
            let mode = cache::CacheMode::WriteBack;
            cache_device_events("c", mode, (old, new), (&mut reported, now), &mut out);
            out.into_iter()
                .map(|e| (e.kind, e.severity, e.object))
                .collect::<Vec<_>>()
        };
        let warned = vec![(K::CacheMediaErrors, S::Warning, "c/ssd0".to_string())];
        assert_eq!(events(&[dev("ok", 0)], &[dev("ok", 0)], 0), vec![]);
        assert_eq!(events(&[dev("ok", 0)], &[dev("ok", 2)], 0), warned);
        assert_eq!(events(&[dev("ok", 2)], &[dev("ok", 2)], 10), vec![]);
        // growing again within the hour: not said again (a destage meeting
        // an unreadable dirty sector at every pass would say it every poll)
        assert_eq!(events(&[dev("ok", 2)], &[dev("ok", 3)], 60), vec![]);
        // said after it, though the count stopped growing meanwhile
        assert_eq!(events(&[dev("ok", 3)], &[dev("ok", 3)], 3601), warned);
        assert_eq!(events(&[dev("ok", 3)], &[dev("ok", 3)], 9000), vec![]);
        // a replacement starts its own count: nothing to say
        assert_eq!(events(&[dev("ok", 3)], &[dev("ok", 0)], 9000), vec![]);
        assert_eq!(events(&[dev("ok", 0)], &[dev("ok", 1)], 9001), warned);
        assert_eq!(
            events(&[dev("ok", 0)], &[dev("failed", 0)], 9000),
            vec![(K::CacheDeviceFailed, S::Critical, "c/ssd0".to_string())]
        );
    }

    fn member(pos: usize, name: &str, state: &str) -> serde_json::Value {
        serde_json::json!({"position": pos, "name": name, "uuid": "0", "state": state,
            "rebuilt_bytes": 0, "errors": 0, "reads": 0, "writes": 0,
            "read_bytes": 0, "written_bytes": 0})
    }

    fn pool(
        state: &str,
        members: Vec<serde_json::Value>,
        spares: &[&str],
        rebuild: bool,
    ) -> raid::PoolStatus {
        let spares: Vec<_> = spares
            .iter()
            .map(|s| serde_json::json!({"name": s, "uuid": "0"}))
            .collect();
        let rebuild = rebuild
            .then(|| serde_json::json!({"done_bytes": 0, "total_bytes": 1, "rate_mb_s": 0.0}));
        serde_json::from_value(
            serde_json::json!({"name": "p", "uuid": "0", "level": "raid1",
            "chunk_bytes": 65536, "state": state, "capacity_bytes": 0, "usable_bytes": 0,
            "redundancy": 1, "generation": 1, "members": members, "spares": spares,
            "rebuild": rebuild, "rebuild_rate_mb_s": 0}),
        )
        .unwrap()
    }

    fn kinds(old: &raid::PoolStatus, new: &raid::PoolStatus) -> Vec<(K, S, String)> {
        let mut out = Vec::new();
        pool_events(old, new, &mut out);
        out.into_iter()
            .map(|e| (e.kind, e.severity, e.object))
            .collect()
    }

    #[test]
    fn what_is_wrong_at_start_is_said_once_and_a_healthy_start_says_nothing() {
        let start = |p: &raid::PoolStatus| {
            let mut out = Vec::new();
            standing_pool_events(p, &mut out);
            out.into_iter()
                .map(|e| (e.kind, e.severity, e.object))
                .collect::<Vec<_>>()
        };
        let healthy = pool(
            "optimal",
            vec![member(0, "d0", "active"), member(1, "d1", "active")],
            &["d2"],
            false,
        );
        assert_eq!(start(&healthy), vec![]);
        // blocks recorded lost before the start: said once
        let mut lost_before = healthy.clone();
        lost_before.lost_blocks = 3;
        lost_before.lost_ranges = vec![[4096, 2], [9000, 1]];
        assert_eq!(
            start(&lost_before),
            vec![(K::BlocksLost, S::Critical, "p".into())]
        );
        let degraded = pool(
            "degraded",
            vec![member(0, "d0", "failed"), member(1, "d1", "active")],
            &[],
            false,
        );
        assert_eq!(
            start(&degraded),
            vec![(K::DiskFailed, S::Critical, "d0".into())]
        );
        let resumed = pool(
            "rebuilding",
            vec![member(0, "d2", "rebuilding"), member(1, "d1", "active")],
            &[],
            true,
        );
        assert_eq!(
            start(&resumed),
            vec![(K::RebuildStarted, S::Info, "p".into())]
        );
        let lost = pool(
            "failed",
            vec![member(0, "d0", "failed"), member(1, "d1", "failed")],
            &[],
            false,
        );
        assert_eq!(
            start(&lost),
            vec![
                (K::DiskFailed, S::Critical, "d0".into()),
                (K::DiskFailed, S::Critical, "d1".into()),
                (K::PoolFailed, S::Critical, "p".into())
            ]
        );
    }

    #[test]
    fn pool_transitions_yield_one_event_each_even_when_fast() {
        let healthy = pool(
            "optimal",
            vec![member(0, "d0", "active"), member(1, "d1", "active")],
            &["d2"],
            false,
        );
        // seen step by step
        let failed = pool(
            "degraded",
            vec![member(0, "d0", "failed"), member(1, "d1", "active")],
            &["d2"],
            false,
        );
        let rebuilding = pool(
            "rebuilding",
            vec![member(0, "d2", "rebuilding"), member(1, "d1", "active")],
            &[],
            true,
        );
        let done = pool(
            "optimal",
            vec![member(0, "d2", "active"), member(1, "d1", "active")],
            &[],
            false,
        );
        assert_eq!(
            kinds(&healthy, &failed),
            vec![(K::DiskFailed, S::Critical, "d0".into())]
        );
        assert_eq!(kinds(&failed, &failed), vec![]);
        assert_eq!(
            kinds(&failed, &rebuilding),
            vec![
                (K::SparePulledIn, S::Warning, "d2".into()),
                (K::RebuildStarted, S::Info, "p".into())
            ]
        );
        assert_eq!(
            kinds(&rebuilding, &done),
            vec![(K::RebuildFinished, S::Info, "p".into())]
        );
        // all of it between two looks
        assert_eq!(
            kinds(&healthy, &done),
            vec![
                (K::DiskFailed, S::Critical, "d0".into()),
                (K::SparePulledIn, S::Warning, "d2".into()),
                (K::RebuildStarted, S::Info, "p".into()),
                (K::RebuildFinished, S::Info, "p".into()),
            ]
        );
        assert_eq!(kinds(&done, &done), vec![]);
        // held at a stripe it cannot read: said once, when it starts
        let mut stalled = rebuilding.clone();
        stalled.rebuild_stalled = Some(raid::RebuildStall {
            stripe: 7,
            error: "medium error".into(),
            attempts: 1,
        });
        // one failed try is not a stall yet (a member failing makes one)
        assert_eq!(kinds(&rebuilding, &stalled), vec![]);
        stalled.rebuild_stalled.as_mut().unwrap().attempts = 2;
        assert_eq!(
            kinds(&rebuilding, &stalled),
            vec![(K::RebuildStalled, S::Critical, "p".into())]
        );
        let mut again = stalled.clone();
        again.rebuild_stalled.as_mut().unwrap().attempts = 9;
        assert_eq!(kinds(&stalled, &again), vec![]);
        assert_eq!(kinds(&again, &rebuilding), vec![]);
        // blocks given up: said when more are lost, not when some are written
        let mut lost = rebuilding.clone();
        lost.lost_blocks = 2;
        lost.lost_ranges = vec![[96, 1], [160, 1]];
        assert_eq!(
            kinds(&rebuilding, &lost),
            vec![(K::BlocksLost, S::Critical, "p".into())]
        );
        let mut said = Vec::new();
        pool_events(&rebuilding, &lost, &mut said);
        let said = &said[0].message;
        assert_eq!(
            said,
            "pool p: 2 more block(s) could not be recovered (unreadable sectors with no \
             redundancy left); 2 lost in all, at pool blocks 96, 160; reads of them fail \
             until they are written again (restore those blocks from a backup)"
        );
        let mut fewer = lost.clone();
        fewer.lost_blocks = 1;
        fewer.lost_ranges = vec![[160, 1]];
        assert_eq!(kinds(&lost, &fewer), vec![]);
        assert_eq!(kinds(&lost, &lost), vec![]);
    }

    #[test]
    fn a_journal_device_that_fails_is_said_once_with_where_the_journal_goes() {
        let with = |failed: [bool; 2]| {
            let mut p = pool(
                "optimal",
                vec![member(0, "d0", "active"), member(1, "d1", "active")],
                &[],
                false,
            );
            p.journal_devices = ["ssd0", "ssd1"]
                .iter()
                .zip(failed)
                .map(|(n, failed)| raid::JournalDeviceStatus {
                    name: n.to_string(),
                    uuid: format!("u-{n}"),
                    failed,
                })
                .collect();
            p
        };
        let both = with([false, false]);
        let one = with([true, false]);
        let none = with([true, true]);
        let events = |old: &raid::PoolStatus, new: &raid::PoolStatus| {
            let mut out = Vec::new();
            pool_events(old, new, &mut out);
            out
        };
        let e = events(&both, &one);
        assert_eq!(e.len(), 1);
        assert_eq!((e[0].kind, e[0].severity), (K::DiskFailed, S::Critical));
        assert_eq!(e[0].object, "ssd0");
        assert!(
            e[0].message.contains("unmirrored on ssd1"),
            "{}",
            e[0].message
        );
        assert!(events(&one, &one).is_empty());
        let e = events(&one, &none);
        assert_eq!(e.len(), 1);
        assert_eq!(e[0].object, "ssd1");
        assert!(
            e[0].message.contains("back on the members"),
            "{}",
            e[0].message
        );
        // both between two looks
        assert_eq!(kinds(&both, &none).len(), 2);
        // at start: a device shown failed (it could not join) is said once
        let mut out = Vec::new();
        standing_pool_events(&one, &mut out);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].object, "ssd0");
        let mut out = Vec::new();
        standing_pool_events(&both, &mut out);
        assert!(out.is_empty());
        // the configuration names a device the pool does not have
        let mut lost = with([false, false]);
        lost.journal_devices.remove(0);
        lost.journal_devices_missing = vec!["ssd0".into()];
        let mut out = Vec::new();
        standing_pool_events(&lost, &mut out);
        assert_eq!(out.len(), 1);
        assert_eq!(
            (out[0].kind, out[0].object.as_str()),
            (K::DiskFailed, "ssd0")
        );
        assert!(
            out[0].message.contains("not in use at start")
                && out[0].message.contains("unmirrored on ssd1"),
            "{}",
            out[0].message
        );
    }

    #[test]
    fn reads_a_certificate_end() {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(vec!["x".into()]).unwrap();
        params.not_after = rcgen::date_time_ymd(2030, 1, 2);
        let cert = params.self_signed(&key).unwrap();
        let t = super::first_cert_not_after(cert.pem().as_bytes()).unwrap();
        assert_eq!(t, 1_893_542_400);
        assert!(super::first_cert_not_after(b"junk").is_err());
    }
}
