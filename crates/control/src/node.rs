//! The node as the management API sees it: [`NodeControl`] implements
//! [`api::Control`] over the node's pools and caches ([`crate::pools`]), its HA
//! side ([`crate::cluster`]) and the objects created at run time
//! ([`crate::objects`]), and records in `managed.toml` what a pool or cache
//! action changed so that the next start assembles the same thing.
//!
//! What it does not do: decide anything itself; each request goes to the part
//! that owns the state it touches.

use crate::cluster::Cluster;
use crate::objects::Objects;
use crate::pools::Pools;
use std::sync::Arc;

/// The node as the management API sees it.
pub struct NodeControl {
    /// Pools of the node.
    pub pools: Arc<Pools>,
    /// The node's side of its HA pair, if any.
    pub cluster: Option<Arc<Cluster>>,
    /// Static description of the node (version, portals); its LUNs are listed
    /// as they are now.
    pub summary: serde_json::Value,
    /// Disks, pools and LUNs created at run time (shared with the reloader,
    /// which hands it the targets a reload adds).
    pub objects: Arc<Objects>,
    /// The node's event log.
    pub events: Arc<crate::events::log::EventLog>,
    /// The iSCSI server's sessions (for metrics).
    pub iscsi_sessions: Option<iscsi::Sessions>,
    /// Reloads the configuration (`POST /api/v1/reload`); None: the node was
    /// started without a way to read it again.
    pub reload: Option<Arc<crate::reload::Reloader>>,
    /// The last hour of the node's rates (`GET /api/v1/history`), sampled by
    /// [`NodeControl::start_sampler`].
    pub history: Arc<crate::history::History>,
    /// Benchmark jobs started through the API.
    pub bench: crate::benchjobs::BenchJobs,
}

impl NodeControl {
    /// One reading of the counters the history samples.
    fn reading(&self) -> crate::history::Reading {
        use crate::history::{CacheFigures, Io, PathReading, Reading};
        let mut r = Reading::default();
        for (iqn, t) in self.objects.targets() {
            for (lun, st) in t.lun_stats() {
                let io = Io {
                    reads: st.read.commands,
                    writes: st.write.commands,
                    read_bytes: st.read.bytes,
                    write_bytes: st.write.bytes,
                    latency_sum_us: st.read.latency_sum_us + st.write.latency_sum_us,
                };
                r.luns.push((format!("{iqn}/{lun}"), io));
            }
        }
        if let Some(s) = &self.iscsi_sessions {
            r.portals = s.portals().iter().map(|p| p.to_string()).collect();
            for x in s.list() {
                if x.discovery {
                    continue;
                }
                r.sessions.push(PathReading {
                    id: x.id,
                    initiator: x.initiator,
                    portal: x.portal,
                    io: Io {
                        reads: x.io.reads,
                        writes: x.io.writes,
                        read_bytes: x.io.read_bytes,
                        write_bytes: x.io.write_bytes,
                        latency_sum_us: x.io.latency_sum_us,
                    },
                });
            }
        }
        for c in self.pools.cache_statuses() {
            if let Some(name) = c["name"].as_str() {
                r.caches
                    .push((name.to_string(), CacheFigures::of_status(&c)));
            }
        }
        r
    }

    /// Samples the node's counters into its history once a second for as long as
    /// the node's control plane lives.
    pub fn start_sampler(node: &Arc<NodeControl>) {
        let weak = Arc::downgrade(node);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(std::time::Duration::from_secs(1));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let Some(node) = weak.upgrade() else { return };
                let reading = node.reading();
                node.history.record(reading);
            }
        });
    }
}

#[async_trait::async_trait]
impl api::Control for NodeControl {
    async fn reload(&self) -> Result<serde_json::Value, api::ApiError> {
        let Some(r) = &self.reload else {
            return Err(api::ApiError::NotFound(
                "this node was started without a configuration it can read again".into(),
            ));
        };
        match r.reload().await {
            Ok(report) => {
                serde_json::to_value(report).map_err(|e| api::ApiError::Internal(e.to_string()))
            }
            Err(e) => Err(api::ApiError::BadRequest(format!("reload refused: {e:#}"))),
        }
    }

    fn status(&self) -> serde_json::Value {
        let mut s = self.summary.clone();
        // the portals served now (a reload may have changed them)
        if let Some(x) = &self.iscsi_sessions {
            s["portals"] = x.portals().iter().map(|p| p.to_string()).collect();
        }
        s["luns"] = serde_json::Value::Array(self.objects.luns_now());
        s["pools"] = serde_json::Value::Array(self.pools.statuses());
        s["caches"] = serde_json::Value::Array(self.pools.cache_statuses());
        s["replicas"] = serde_json::Value::Array(self.replicas());
        // disks that stopped answering (failed for good, whatever holds them),
        // and those waited for past their timeout now (what they serve
        // cannot do without them: its I/O waits with them)
        let timings = self.pools.disk_timings();
        s["disks_stopped_answering"] = timings
            .iter()
            .filter_map(|(name, t)| {
                let why = t.failed.as_ref()?;
                Some(serde_json::json!({"name": name, "why": why}))
            })
            .collect();
        s["disks_waited_for"] = timings
            .iter()
            .filter(|(_, t)| t.holding > 0 && t.failed.is_none())
            .map(|(name, t)| serde_json::json!({"name": name, "requests": t.holding}))
            .collect();
        // the node's SCSI traffic since start, summed over every LUN (what
        // `freesan status` turns into rates)
        let (mut rb, mut wb, mut ro, mut wo) = (0u64, 0u64, 0u64, 0u64);
        for t in self.objects.targets().values() {
            for (_, st) in t.lun_stats() {
                rb += st.read.bytes;
                wb += st.write.bytes;
                ro += st.read.commands;
                wo += st.write.commands;
            }
        }
        s["io"] = serde_json::json!({
            "read_bytes": rb, "write_bytes": wb, "read_ops": ro, "write_ops": wo,
        });
        let node = block::BufferBudget::node();
        let b = node.status();
        let sources: Vec<serde_json::Value> = node
            .sources_held()
            .into_iter()
            .map(|(a, held)| serde_json::json!({"address": a.to_string(), "held_bytes": held}))
            .collect();
        s["buffer_memory"] = serde_json::json!({
            "max_bytes": b.max_bytes,
            "held_bytes": b.held_bytes,
            "high_water_bytes": b.high_water_bytes,
            "waits": b.waits,
            "refusals": b.refusals,
            "session_max_bytes": b.session_max_bytes,
            "session_waits": b.session_waits,
            "source_max_bytes": b.source_max_bytes,
            "source_waits": b.source_waits,
            "sources": sources,
        });
        s
    }

    fn targets(&self) -> Vec<serde_json::Value> {
        let (sessions, portals) = match &self.iscsi_sessions {
            Some(s) => (
                s.list(),
                s.portals().iter().map(|p| p.to_string()).collect(),
            ),
            None => (Vec::new(), Vec::new()),
        };
        self.objects.targets_now(&sessions, &portals)
    }

    async fn target_access(
        &self,
        name: &str,
        change: api::TargetAccess,
    ) -> Result<serde_json::Value, api::ApiError> {
        let (chap, acl) = match change {
            api::TargetAccess::Chap(c) => (
                Some(c.map(|(user, secret)| crate::config::Chap { user, secret })),
                None,
            ),
            api::TargetAccess::Acl(a) => (None, Some(a)),
        };
        self.objects
            .set_target_access(name, chap, acl, self.reload.as_deref())
            .await?;
        self.targets()
            .into_iter()
            .find(|t| t["name"] == name)
            .ok_or_else(|| api::ApiError::NotFound(format!("no target named {name}")))
    }

    fn bench_jobs(&self) -> serde_json::Value {
        self.bench.json()
    }

    async fn bench_start(
        &self,
        req: api::BenchRequest,
    ) -> Result<serde_json::Value, api::ApiError> {
        let target = self
            .objects
            .targets()
            .get(&req.target)
            .cloned()
            .ok_or_else(|| api::ApiError::NotFound(format!("no target named {:?}", req.target)))?;
        if target.lun_size_bytes(req.lun).is_none() {
            return Err(api::ApiError::NotFound(format!(
                "target {} has no LUN {}",
                req.target, req.lun
            )));
        }
        if crate::benchjobs::pattern_writes(&req.pattern) && !req.overwrite {
            return Err(api::ApiError::BadRequest(format!(
                "pattern {} writes over the LUN's data: ask with \"overwrite\": true",
                req.pattern
            )));
        }
        let portal = self
            .iscsi_sessions
            .as_ref()
            .and_then(|s| s.portals().first().copied())
            .ok_or_else(|| api::ApiError::Conflict("this node serves no iSCSI portal".into()))?;
        let chap = self
            .objects
            .target_config(&req.target)
            .and_then(|t| t.chap)
            .map(|c| (c.user, c.secret));
        let id = self.bench.start(
            crate::benchjobs::JobRequest {
                target: req.target,
                lun: req.lun,
                pattern: req.pattern,
                secs: req.secs,
            },
            portal,
            chap,
        )?;
        Ok(serde_json::json!({ "id": id }))
    }

    fn history(&self, window_secs: usize) -> serde_json::Value {
        self.history.json(window_secs)
    }

    fn metrics(&self, openmetrics: bool) -> Option<(&'static str, String)> {
        Some(crate::metrics::render(self, openmetrics))
    }

    fn replicas(&self) -> Vec<serde_json::Value> {
        self.cluster
            .as_ref()
            .map_or_else(Vec::new, |c| c.statuses())
    }

    async fn replica_action(
        &self,
        name: &str,
        action: api::ReplicaAction,
    ) -> Result<serde_json::Value, api::ApiError> {
        let v = self
            .cluster
            .as_ref()
            .and_then(|c| c.volume(name))
            .ok_or_else(|| api::ApiError::NotFound(format!("no replicated volume named {name}")))?;
        match action {
            api::ReplicaAction::Discard => {
                v.discard_copy().await.map_err(api::ApiError::Conflict)?
            }
            api::ReplicaAction::Keep => v.keep_copy().await.map_err(api::ApiError::Conflict)?,
        }
        Ok(serde_json::to_value(v.status()).unwrap_or_default())
    }

    fn pools(&self) -> Vec<serde_json::Value> {
        self.pools.statuses()
    }

    async fn events(
        &self,
        since: u64,
        limit: usize,
        wait: std::time::Duration,
    ) -> serde_json::Value {
        // subscribed before looking, so that an event recorded in between is seen
        let mut rx = self.events.subscribe();
        // (a cursor from a run whose last events were lost reads this run's)
        let since = self.events.cursor(since);
        let mut found = self.events.since(since, limit);
        if found.is_empty() && !wait.is_zero() {
            let deadline = tokio::time::Instant::now() + wait;
            while let Ok(Ok(e)) = tokio::time::timeout_at(deadline, rx.recv()).await {
                if e.seq > since {
                    found = self.events.since(since, limit);
                    break;
                }
            }
        }
        serde_json::json!({
            "last_seq": self.events.last_seq(),
            "events": found,
        })
    }

    fn caches(&self) -> Vec<serde_json::Value> {
        self.pools.cache_statuses()
    }

    fn cache(&self, name: &str) -> Option<serde_json::Value> {
        self.pools.cache_status(name)
    }

    async fn cache_action(
        &self,
        name: &str,
        action: api::CacheAction,
    ) -> Result<serde_json::Value, api::ApiError> {
        let replaced = matches!(action, api::CacheAction::Replace { .. });
        let st = self.pools.cache_act(name, action).await?;
        if replaced {
            let devices = st["devices"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|d| d["name"].as_str().map(str::to_string))
                .collect();
            self.objects.record_cache_devices(name, devices).await?;
        }
        Ok(st)
    }

    fn pool(&self, name: &str) -> Option<serde_json::Value> {
        self.pools.status(name)
    }

    async fn pool_action(
        &self,
        name: &str,
        action: api::PoolAction,
    ) -> Result<serde_json::Value, api::ApiError> {
        let changes_disks = matches!(
            action,
            api::PoolAction::AddSpare { .. } | api::PoolAction::Replace { .. }
        );
        let st = self.pools.act(name, action).await?;
        if changes_disks {
            // the pool is assembled from these disks at the next start
            let names = |k: &str| -> Vec<String> {
                st[k]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|m| m["name"].as_str())
                    .filter(|n| *n != "missing")
                    .map(str::to_string)
                    .collect()
            };
            self.objects
                .record_pool_disks(name, names("members"), names("spares"))
                .await?;
        }
        Ok(st)
    }

    async fn resize_lun(
        &self,
        body: serde_json::Value,
    ) -> Result<serde_json::Value, api::ApiError> {
        self.objects.resize_lun(body).await
    }

    async fn reopen_disk(
        &self,
        body: serde_json::Value,
    ) -> Result<serde_json::Value, api::ApiError> {
        self.objects.reopen_disk(&self.pools, body).await
    }

    async fn create(
        &self,
        kind: api::ObjectKind,
        body: serde_json::Value,
    ) -> Result<serde_json::Value, api::ApiError> {
        let o = &self.objects;
        match kind {
            api::ObjectKind::Disk => o.create_disk(&self.pools, body).await,
            api::ObjectKind::Pool => o.create_pool(&self.pools, body).await,
            api::ObjectKind::Lun => {
                o.create_lun(&self.pools, self.cluster.as_deref(), body)
                    .await
            }
            api::ObjectKind::HostGroup => o.set_host_group(body).await,
        }
    }

    async fn delete(
        &self,
        kind: api::ObjectKind,
        body: serde_json::Value,
    ) -> Result<serde_json::Value, api::ApiError> {
        match kind {
            api::ObjectKind::Lun => {
                self.objects
                    .delete_lun(&self.pools, self.cluster.as_deref(), body)
                    .await
            }
            api::ObjectKind::HostGroup => self.objects.delete_host_group(body).await,
            _ => Err(api::ApiError::BadRequest(format!(
                "{kind:?} objects cannot be deleted at run time"
            ))),
        }
    }

    async fn list(&self, kind: api::ObjectKind) -> Vec<serde_json::Value> {
        match kind {
            api::ObjectKind::Disk => self.objects.disks(&self.pools).await,
            api::ObjectKind::Pool => self.pools.statuses(),
            api::ObjectKind::Lun => self.objects.luns_now(),
            api::ObjectKind::HostGroup => self.objects.host_groups_now(),
        }
    }
}
