//! The families of the data path and the control plane's objects: LUNs, iSCSI
//! sessions and portals, NBD exports, pools and their members, caches, replicated
//! volumes with their links and witness.

use super::{counters, gauges, labels, num, stateset, with, Labels, NodeCollector};
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::metrics::MetricType;
use scsi::stats::LATENCY_BUCKETS_US;
use scsi::Direction;
use serde_json::Value;
use std::fmt::Error;

type Samples = Vec<(Labels, f64)>;

const POOL_STATES: [&str; 5] = ["optimal", "degraded", "rebuilding", "resyncing", "failed"];
const MEMBER_STATES: [&str; 4] = ["active", "rebuilding", "failed", "spare"];
const REPLICA_ROLES: [&str; 6] = ["deciding", "down", "solo", "leader", "follower", "target"];
const REPLICA_STATES: [&str; 4] = ["in-sync", "resyncing", "degraded", "down"];

impl NodeCollector {
    /// Per LUN: commands, bytes and errors by direction, latency, in flight.
    pub(super) fn luns(&self, e: &mut DescriptorEncoder) -> Result<(), Error> {
        let mut cmds = Samples::new();
        let mut bytes = Samples::new();
        let mut errors = Samples::new();
        let mut flight = Samples::new();
        let mut size = Samples::new();
        let mut hist = Vec::new();
        for (iqn, t) in &self.targets {
            for (lun, s) in t.lun_stats() {
                let lun_s = lun.to_string();
                let base = labels([("target", iqn), ("lun", &lun_s)]);
                for d in [Direction::Read, Direction::Write, Direction::Other] {
                    let st = s.dir(d);
                    let l = with(&base, ("direction", d.as_str()));
                    cmds.push((l.clone(), st.commands as f64));
                    errors.push((l.clone(), st.errors as f64));
                    if d != Direction::Other {
                        bytes.push((l.clone(), st.bytes as f64));
                    }
                    hist.push((l, *st));
                }
                flight.push((base.clone(), s.in_flight as f64));
                if let Some(b) = t.lun_size_bytes(lun) {
                    size.push((base, b as f64));
                }
            }
        }
        counters(
            e,
            "freesan_lun_commands",
            "SCSI commands a LUN finished, by direction (read, write, other).",
            &cmds,
        )?;
        counters(
            e,
            "freesan_lun_bytes",
            "Data bytes a LUN's successful commands moved, by direction.",
            &bytes,
        )?;
        counters(
            e,
            "freesan_lun_errors",
            "Commands a LUN answered with CHECK CONDITION or RESERVATION CONFLICT.",
            &errors,
        )?;
        gauges(
            e,
            "freesan_lun_commands_in_flight",
            "Commands a LUN is executing now.",
            &flight,
        )?;
        gauges(e, "freesan_lun_size_bytes", "Size of a LUN.", &size)?;
        if !hist.is_empty() {
            let mut enc = e.encode_descriptor(
                "freesan_lun_command_latency_seconds",
                "Time from a command's arrival at the LUN to its answer, by direction.",
                None,
                MetricType::Histogram,
            )?;
            for (l, st) in &hist {
                let mut buckets = [(0.0, 0u64); LATENCY_BUCKETS_US.len() + 1];
                for (i, b) in buckets.iter_mut().enumerate() {
                    let bound = LATENCY_BUCKETS_US
                        .get(i)
                        .map_or(f64::MAX, |&us| us as f64 / 1e6);
                    *b = (bound, st.latency_buckets[i]);
                }
                let count: u64 = st.latency_buckets.iter().sum();
                enc.encode_family(l)?.encode_histogram::<Labels>(
                    st.latency_sum_us as f64 / 1e6,
                    count,
                    &buckets,
                    None,
                )?;
            }
        }
        Ok(())
    }

    /// iSCSI sessions (by initiator, target, portal) and sessions per portal.
    pub(super) fn iscsi(&self, e: &mut DescriptorEncoder) -> Result<(), Error> {
        let Some(s) = &self.sessions else {
            return Ok(());
        };
        let list = s.list();
        let mut by_key: std::collections::BTreeMap<(String, String, String), (u64, u64)> =
            Default::default();
        let mut discovery = 0u64;
        let mut per_portal: std::collections::BTreeMap<String, u64> =
            s.portals().iter().map(|p| (p.to_string(), 0)).collect();
        for x in &list {
            if x.discovery {
                discovery += 1;
                continue;
            }
            let k = (x.initiator.clone(), x.target.clone(), x.portal.clone());
            let v = by_key.entry(k).or_default();
            v.0 += 1;
            v.1 += x.commands_running as u64;
            *per_portal.entry(x.portal.clone()).or_default() += 1;
        }
        let mut sessions = Samples::new();
        let mut running = Samples::new();
        for ((i, t, p), (n, r)) in &by_key {
            let l = labels([
                ("initiator", i),
                ("target", t),
                ("portal", p),
                ("state", "logged_in"),
            ]);
            sessions.push((l.clone(), *n as f64));
            running.push((l, *r as f64));
        }
        gauges(
            e,
            "freesan_iscsi_sessions",
            "iSCSI sessions in full feature phase, by initiator name, target and portal.",
            &sessions,
        )?;
        gauges(
            e,
            "freesan_iscsi_session_commands_in_flight",
            "Commands the iSCSI sessions of an initiator, target and portal are executing.",
            &running,
        )?;
        gauges(
            e,
            "freesan_iscsi_discovery_sessions",
            "iSCSI discovery sessions open now.",
            &[(Labels::new(), discovery as f64)],
        )?;
        let portals: Samples = per_portal
            .iter()
            .map(|(p, n)| (labels([("portal", p)]), *n as f64))
            .collect();
        gauges(
            e,
            "freesan_iscsi_portal_sessions",
            "iSCSI sessions (not discovery) logged in through a portal.",
            &portals,
        )
    }

    /// NBD exports: size and read-only.
    pub(super) fn nbd(&self, e: &mut DescriptorEncoder) -> Result<(), Error> {
        let Some(n) = &self.nbd else {
            return Ok(());
        };
        let mut size = Samples::new();
        let mut ro = Samples::new();
        for (name, bytes, read_only) in n.list() {
            let l = labels([("export", &name)]);
            size.push((l.clone(), bytes as f64));
            ro.push((l, f64::from(u8::from(read_only))));
        }
        gauges(
            e,
            "freesan_nbd_export_size_bytes",
            "Size of an NBD export.",
            &size,
        )?;
        gauges(
            e,
            "freesan_nbd_export_read_only",
            "1 when an NBD export refuses writes.",
            &ro,
        )?;
        let mut ops = Samples::new();
        let mut bytes = Samples::new();
        let mut errors = Samples::new();
        for (name, st) in n.stats() {
            for (dir, count, moved) in [
                ("read", st.reads, Some(st.read_bytes)),
                ("write", st.writes, Some(st.write_bytes)),
                ("other", st.others, None),
            ] {
                let l = labels([("export", name.as_str()), ("direction", dir)]);
                ops.push((l.clone(), count as f64));
                if let Some(b) = moved {
                    bytes.push((l, b as f64));
                }
            }
            errors.push((labels([("export", &name)]), st.errors as f64));
        }
        counters(
            e,
            "freesan_nbd_export_operations",
            "NBD requests an export answered without error (direction: read, write, other).",
            &ops,
        )?;
        counters(
            e,
            "freesan_nbd_export_bytes",
            "Bytes NBD reads returned and writes wrote through an export.",
            &bytes,
        )?;
        counters(
            e,
            "freesan_nbd_export_errors",
            "NBD requests an export answered with an error.",
            &errors,
        )
    }

    /// Every configured disk's reads and writes as the node issued them: count,
    /// failures and the sum of their latencies (mean latency = rate of the sum
    /// over rate of the count).
    pub(super) fn disk_timings(
        &self,
        e: &mut DescriptorEncoder,
        disks: &[(String, disk::DiskTiming)],
    ) -> Result<(), Error> {
        let mut done = Samples::new();
        let mut failed = Samples::new();
        let mut time = Samples::new();
        let mut timeouts = Samples::new();
        let mut waited = Samples::new();
        for (name, t) in disks {
            timeouts.push((labels([("disk", name.as_str())]), t.timeouts as f64));
            waited.push((labels([("disk", name.as_str())]), t.held as f64));
            for (dir, n, errs, ns) in [
                ("read", t.reads, t.read_errors, t.read_latency_sum_ns),
                ("write", t.writes, t.write_errors, t.write_latency_sum_ns),
            ] {
                let l = labels([("disk", name.as_str()), ("direction", dir)]);
                done.push((l.clone(), n as f64));
                failed.push((l.clone(), errs as f64));
                time.push((l, ns as f64 / 1e9));
            }
        }
        counters(
            e,
            "freesan_disk_io_completed",
            "Reads and writes a disk finished (good or not), timed as the node issued them.",
            &done,
        )?;
        counters(
            e,
            "freesan_disk_io_failed",
            "Reads and writes a disk failed.",
            &failed,
        )?;
        counters(
            e,
            "freesan_disk_io_time_seconds",
            "Sum of the latencies of a disk's reads and writes (divide its rate by the rate of freesan_disk_io_completed_total for the mean).",
            &time,
        )?;
        counters(
            e,
            "freesan_disk_io_timeouts",
            "Requests a disk did not answer within its command timeout (the first fails the disk).",
            &timeouts,
        )?;
        counters(
            e,
            "freesan_disk_io_timeouts_waited",
            "Times a request past a disk's command timeout was waited for one more timeout, \
             its pool or cache unable to do without the disk.",
            &waited,
        )
    }

    /// Pools and their members (disks).
    pub(super) fn pools(&self, e: &mut DescriptorEncoder, pools: &[Value]) -> Result<(), Error> {
        let mut state = Samples::new();
        let mut degraded = Samples::new();
        let mut redundancy = Samples::new();
        let mut usable = Samples::new();
        let mut job_done = Samples::new();
        let mut job_total = Samples::new();
        let mut job_rate = Samples::new();
        let mut found = Samples::new();
        let mut lost = Samples::new();
        let mut disk_state = Samples::new();
        let mut disk_ops = Samples::new();
        let mut disk_bytes = Samples::new();
        let mut disk_errors = Samples::new();
        for p in pools {
            let name = p["name"].as_str().unwrap_or("");
            let base = labels([("pool", name)]);
            stateset(
                &mut state,
                &base,
                &POOL_STATES,
                p["state"].as_str().unwrap_or(""),
            );
            redundancy.push((base.clone(), num(&p["redundancy"])));
            usable.push((base.clone(), num(&p["usable_bytes"])));
            let members = p["members"].as_array().map_or(&[][..], |m| m.as_slice());
            let not_active = members
                .iter()
                .filter(|m| m["state"].as_str() != Some("active"))
                .count();
            degraded.push((base.clone(), not_active as f64));
            lost.push((base.clone(), num(&p["lost_blocks"])));
            for job in ["rebuild", "resync", "scrub"] {
                let j = &p[job];
                let l = with(&base, ("job", job));
                let running = !j.is_null();
                job_done.push((l.clone(), if running { num(&j["done_bytes"]) } else { 0.0 }));
                job_total.push((
                    l.clone(),
                    if running { num(&j["total_bytes"]) } else { 0.0 },
                ));
                job_rate.push((
                    l,
                    if running {
                        num(&j["rate_mb_s"]) * 1e6
                    } else {
                        0.0
                    },
                ));
            }
            let s = &p["last_scrub"];
            for kind in ["mismatches", "repaired", "unrepairable", "read_errors"] {
                found.push((with(&base, ("kind", kind)), num(&s[kind])));
            }
            for m in members {
                let pos = m["position"].as_u64().unwrap_or(0).to_string();
                let l = labels([
                    ("pool", name),
                    ("position", &pos),
                    ("disk", m["name"].as_str().unwrap_or("")),
                ]);
                stateset(
                    &mut disk_state,
                    &l,
                    &MEMBER_STATES,
                    m["state"].as_str().unwrap_or(""),
                );
                let read = with(&l, ("direction", "read"));
                let write = with(&l, ("direction", "write"));
                disk_ops.push((read.clone(), num(&m["reads"])));
                disk_ops.push((write.clone(), num(&m["writes"])));
                disk_bytes.push((read, num(&m["read_bytes"])));
                disk_bytes.push((write, num(&m["written_bytes"])));
                disk_errors.push((l, num(&m["errors"])));
            }
        }
        gauges(
            e,
            "freesan_pool_state",
            "1 for a pool's current state, 0 for the others.",
            &state,
        )?;
        gauges(
            e,
            "freesan_pool_degraded_members",
            "Member positions of a pool that are not active (failed, missing or rebuilding).",
            &degraded,
        )?;
        gauges(
            e,
            "freesan_pool_redundancy_members",
            "Members a pool may lose without losing data.",
            &redundancy,
        )?;
        gauges(
            e,
            "freesan_pool_usable_bytes",
            "Bytes a pool offers.",
            &usable,
        )?;
        gauges(
            e,
            "freesan_pool_job_done_bytes",
            "Bytes a running rebuild, resync or scrub has processed (0 when none runs).",
            &job_done,
        )?;
        gauges(
            e,
            "freesan_pool_job_total_bytes",
            "Bytes a running rebuild, resync or scrub will process (0 when none runs).",
            &job_total,
        )?;
        gauges(
            e,
            "freesan_pool_job_rate_bytes_per_second",
            "Average rate of a running rebuild, resync or scrub since it started.",
            &job_rate,
        )?;
        gauges(
            e,
            "freesan_pool_scrub_found_blocks",
            "What the last finished scrub of a pool found, by kind.",
            &found,
        )?;
        gauges(
            e,
            "freesan_pool_lost_blocks",
            "Pool blocks a rebuild could not recover (unreadable with no redundancy left); reads of them fail until they are written.",
            &lost,
        )?;
        gauges(
            e,
            "freesan_disk_state",
            "1 for a pool member's current state, 0 for the others.",
            &disk_state,
        )?;
        counters(
            e,
            "freesan_disk_operations",
            "Requests a pool issued to a member, by direction.",
            &disk_ops,
        )?;
        counters(
            e,
            "freesan_disk_bytes",
            "Bytes a pool moved to or from a member, by direction.",
            &disk_bytes,
        )?;
        counters(
            e,
            "freesan_disk_errors",
            "I/O errors seen on a pool member.",
            &disk_errors,
        )
    }

    /// SSD caches.
    pub(super) fn caches(&self, e: &mut DescriptorEncoder, caches: &[Value]) -> Result<(), Error> {
        let mut hits = Samples::new();
        let mut misses = Samples::new();
        let mut dirty = Samples::new();
        let mut unreadable = Samples::new();
        let mut lost = Samples::new();
        let mut capacity = Samples::new();
        let mut occupancy = Samples::new();
        let mut destaged = Samples::new();
        let mut destage_rate = Samples::new();
        let mut frameless = Samples::new();
        let mut stripes = Samples::new();
        let mut errs = Samples::new();
        let mut media = Samples::new();
        let mut healthy = Samples::new();
        let mut advisor = Samples::new();
        for c in caches {
            let base = labels([("cache", c["name"].as_str().unwrap_or(""))]);
            let attached = c["attached"].as_bool().unwrap_or(false);
            healthy.push((
                base.clone(),
                f64::from(u8::from(attached && c["state"].as_str() == Some("ok"))),
            ));
            if !attached {
                continue;
            }
            for op in ["read", "write"] {
                let l = with(&base, ("op", op));
                hits.push((l.clone(), num(&c[format!("{op}_hits").as_str()])));
                misses.push((l, num(&c[format!("{op}_misses").as_str()])));
            }
            dirty.push((base.clone(), num(&c["dirty_bytes"])));
            unreadable.push((base.clone(), num(&c["unreadable_dirty_bytes"])));
            lost.push((base.clone(), num(&c["lost_dirty_bytes"])));
            capacity.push((base.clone(), num(&c["capacity_bytes"])));
            occupancy.push((base.clone(), num(&c["occupancy_percent"]) / 100.0));
            destaged.push((base.clone(), num(&c["destaged_bytes"])));
            destage_rate.push((base.clone(), num(&c["destage_mb_s"]) * 1e6));
            frameless.push((base.clone(), num(&c["frameless_writes"])));
            stripes.push((base.clone(), num(&c["stripe_destages"])));
            errs.push((with(&base, ("kind", "destage")), num(&c["destage_errors"])));
            errs.push((with(&base, ("kind", "backing")), num(&c["backing_errors"])));
            for d in c["devices"].as_array().into_iter().flatten() {
                let l = with(&base, ("device", d["name"].as_str().unwrap_or("")));
                media.push((l, num(&d["media_errors"])));
            }
            if let Some(b) = c["advisor_bytes_for_90_percent"].as_u64() {
                advisor.push((base, b as f64));
            }
        }
        gauges(
            e,
            "freesan_cache_healthy",
            "1 when a cache is attached and its state is ok.",
            &healthy,
        )?;
        counters(
            e,
            "freesan_cache_hits",
            "Cache-block accesses that found the block cached, by op.",
            &hits,
        )?;
        counters(
            e,
            "freesan_cache_misses",
            "Cache-block accesses that did not, by op.",
            &misses,
        )?;
        gauges(
            e,
            "freesan_cache_dirty_bytes",
            "Bytes held in a cache and not yet on its backing volume.",
            &dirty,
        )?;
        gauges(
            e,
            "freesan_cache_unreadable_dirty_bytes",
            "Of those, bytes no cache device could read: lost unless written again.",
            &unreadable,
        )?;
        gauges(
            e,
            "freesan_cache_lost_dirty_bytes",
            "Of those, bytes lost for good: a mirror's resilver could not read them on the survivor; reads of them fail until they are written.",
            &lost,
        )?;
        gauges(
            e,
            "freesan_cache_capacity_bytes",
            "Bytes of cache.",
            &capacity,
        )?;
        gauges(
            e,
            "freesan_cache_occupancy_ratio",
            "Cached blocks over frames (0..1).",
            &occupancy,
        )?;
        counters(
            e,
            "freesan_cache_destaged_bytes",
            "Bytes a cache wrote back to its backing volume.",
            &destaged,
        )?;
        gauges(
            e,
            "freesan_cache_destage_rate_bytes_per_second",
            "Destage rate over the last 10 seconds.",
            &destage_rate,
        )?;
        counters(
            e,
            "freesan_cache_frameless_writes",
            "Write-back writes sent straight to the backing volume because no frame was free.",
            &frameless,
        )?;
        counters(
            e,
            "freesan_cache_stripe_destages",
            "Whole stripes of the backing volume a cache destaged as one write.",
            &stripes,
        )?;
        counters(
            e,
            "freesan_cache_errors",
            "Errors of the backing volume seen by a cache, by kind.",
            &errs,
        )?;
        counters(
            e,
            "freesan_cache_device_media_errors",
            "Reads of cached data a cache device answered with a medium error (unreadable sectors; the device stays in service).",
            &media,
        )?;
        gauges(
            e,
            "freesan_cache_advisor_bytes_for_90_percent_hits",
            "The advisor's smallest cache size for a 90% hit ratio (absent when none of its sizes gets there).",
            &advisor,
        )
    }

    /// Replicated volumes, their sync links and heartbeats, the witness.
    pub(super) fn replicas(&self, e: &mut DescriptorEncoder, reps: &[Value]) -> Result<(), Error> {
        let mut role = Samples::new();
        let mut state = Samples::new();
        let mut left = Samples::new();
        let mut dirty = Samples::new();
        let mut copies = Samples::new();
        let mut resynced = Samples::new();
        let mut failovers = Samples::new();
        let mut repaired = Samples::new();
        let mut last_failover = Samples::new();
        let mut role_changed = Samples::new();
        let mut witness = Samples::new();
        let mut link_up = Samples::new();
        let mut link_rtt = Samples::new();
        for r in reps {
            let base = labels([("volume", r["name"].as_str().unwrap_or(""))]);
            let mut role_set = Samples::new();
            stateset(
                &mut role_set,
                &base,
                &REPLICA_ROLES,
                r["role"].as_str().unwrap_or(""),
            );
            role.extend(role_set.into_iter().map(|(mut l, v)| {
                if let Some(last) = l.last_mut() {
                    last.0 = "role";
                }
                (l, v)
            }));
            stateset(
                &mut state,
                &base,
                &REPLICA_STATES,
                r["state"].as_str().unwrap_or(""),
            );
            let region = num(&r["region_bytes"]);
            let remaining =
                (num(&r["resync_regions_total"]) - num(&r["resync_regions_done"])).max(0.0);
            left.push((base.clone(), remaining * region));
            dirty.push((base.clone(), num(&r["dirty_regions"]) * region));
            copies.push((base.clone(), num(&r["partner_copies_open"])));
            resynced.push((base.clone(), num(&r["resynced_bytes"])));
            failovers.push((base.clone(), num(&r["failovers"])));
            repaired.push((base.clone(), num(&r["repaired_blocks"])));
            if let Some(ms) = r["last_failover_ms"].as_u64() {
                last_failover.push((base.clone(), ms as f64 / 1e3));
            }
            if let Some(ms) = r["role_changed_ms"].as_u64() {
                role_changed.push((base.clone(), ms as f64 / 1e3));
            }
            if let Some(w) = r["witness_reachable"].as_bool() {
                witness.push((base.clone(), f64::from(u8::from(w))));
            }
            for (kind, key) in [("sync", "sync_links"), ("client", "client_links")] {
                for l in r[key].as_array().map_or(&[][..], |a| a.as_slice()) {
                    let ll = labels([
                        ("volume", r["name"].as_str().unwrap_or("")),
                        ("kind", kind),
                        ("local", l["local"].as_str().unwrap_or("")),
                        ("peer", l["peer"].as_str().unwrap_or("")),
                    ]);
                    link_up.push((
                        ll.clone(),
                        f64::from(u8::from(l["up"].as_bool() == Some(true))),
                    ));
                    if let Some(us) = l["rtt_us"].as_u64() {
                        link_rtt.push((ll, us as f64 / 1e6));
                    }
                }
            }
        }
        gauges(
            e,
            "freesan_replica_role",
            "1 for this node's current role for a replicated volume.",
            &role,
        )?;
        gauges(
            e,
            "freesan_replica_state",
            "1 for a replicated volume's current state.",
            &state,
        )?;
        gauges(
            e,
            "freesan_replica_resync_remaining_bytes",
            "Bytes the running resync of a replicated volume has still to copy.",
            &left,
        )?;
        gauges(
            e,
            "freesan_replica_dirty_bytes",
            "Bytes of regions marked in this node's bitmap (not known to be on the partner).",
            &dirty,
        )?;
        gauges(
            e,
            "freesan_replica_partner_copies_open",
            "The partner's offloaded copies under way whose overwritten blocks this node keeps, to undo them if the partner is lost.",
            &copies,
        )?;
        counters(
            e,
            "freesan_replica_resynced_bytes",
            "Bytes resyncs copied from this node.",
            &resynced,
        )?;
        counters(
            e,
            "freesan_replica_failovers",
            "Times this node went on serving a replicated volume alone after serving it with its partner, since start.",
            &failovers,
        )?;
        counters(
            e,
            "freesan_replica_repaired_blocks",
            "Blocks of this node's copy that it could not read (medium errors) and rewrote from the partner's copy, since start.",
            &repaired,
        )?;
        gauges(
            e,
            "freesan_replica_last_failover_timestamp_seconds",
            "When this node last went on serving a replicated volume alone (Unix time); absent before the first failover.",
            &last_failover,
        )?;
        gauges(
            e,
            "freesan_replica_role_changed_timestamp_seconds",
            "When this node's role for a replicated volume last changed (Unix time); absent before the first change.",
            &role_changed,
        )?;
        gauges(
            e,
            "freesan_replica_witness_reachable",
            "1 when the witness answered the last request.",
            &witness,
        )?;
        gauges(
            e,
            "freesan_replica_link_up",
            "1 when the partner answered heartbeats on a link within the peer timeout (kind: sync or client).",
            &link_up,
        )?;
        gauges(
            e,
            "freesan_replica_link_rtt_seconds",
            "Round-trip time of the last heartbeat answer on a link.",
            &link_rtt,
        )
    }
}
