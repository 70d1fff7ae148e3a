//! The node's metrics in the OpenMetrics text format (`GET /metrics`), made with
//! `prometheus-client` from what the layers already expose: per-LU command
//! counters of the SCSI targets, iSCSI sessions and portals, NBD exports, pool,
//! member (disk), cache and replica status, the node's buffer budget and the
//! process itself. docs/metrics.md lists every family.
//!
//! What it does not do: keep any state or touch the data path. Everything is read
//! at scrape time (a [`Collector`]); the data path only bumps its own atomics.
//!
//! Key invariant: label values come from configured or bounded sets (targets,
//! LUNs, pools and their members, caches, replicated volumes and their links,
//! portals, sessions up to `sessions_max`), never from request data, so the
//! number of series stays bounded.

use crate::cluster::Cluster;
use crate::node::NodeControl;
use crate::pools::Pools;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;
use serde_json::Value;
use std::fmt::Error;
use std::sync::Arc;

mod families;
mod process;

/// The content type of OpenMetrics text.
pub const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
/// The content type of the Prometheus text format 0.0.4 (for clients that do not
/// ask for OpenMetrics, such as `promtool check metrics` or `curl`).
pub const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// OpenMetrics text as the Prometheus text format 0.0.4: counter families are
/// named with their `_total` suffix, `# UNIT` and `# EOF` lines go.
pub fn to_prometheus_text(open: &str) -> String {
    let counters: std::collections::HashSet<&str> = open
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE ")?.strip_suffix(" counter"))
        .collect();
    let mut out = String::with_capacity(open.len());
    for line in open.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        let meta = ["# HELP ", "# TYPE "]
            .into_iter()
            .find_map(|p| Some((p, line.strip_prefix(p)?)));
        match meta {
            Some((p, rest)) => {
                let (name, tail) = rest.split_once(' ').unwrap_or((rest, ""));
                if counters.contains(name) {
                    out.push_str(&format!("{p}{name}_total {tail}"));
                } else {
                    out.push_str(line);
                }
            }
            None => out.push_str(line),
        }
        out.push('\n');
    }
    out
}

/// A label set: (name, value) pairs.
type Labels = Vec<(&'static str, String)>;

/// Writes a gauge family with the given samples (none: the family is left out).
fn gauges(
    e: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    samples: &[(Labels, f64)],
) -> Result<(), Error> {
    write(e, name, help, MetricType::Gauge, samples)
}

/// Writes a counter family with the given samples (none: left out).
fn counters(
    e: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    samples: &[(Labels, f64)],
) -> Result<(), Error> {
    write(e, name, help, MetricType::Counter, samples)
}

fn write(
    e: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    kind: MetricType,
    samples: &[(Labels, f64)],
) -> Result<(), Error> {
    if samples.is_empty() {
        return Ok(());
    }
    let mut enc = e.encode_descriptor(name, help, None, kind)?;
    for (l, v) in samples {
        let mut m = enc.encode_family(l)?;
        match kind {
            MetricType::Counter => m.encode_counter::<Labels, f64, f64>(v, None)?,
            _ => m.encode_gauge(v)?,
        }
    }
    Ok(())
}

/// A label value as the text formats write it: `\\`, `\"` and `\n` escaped
/// (prometheus-client writes values as they are). Names of configured
/// objects and of initiators are checked where they come in; this keeps a
/// value that slipped through from closing its label and forging a sample.
fn label_value(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

/// Labels from pairs.
fn labels<const N: usize>(pairs: [(&'static str, &str); N]) -> Labels {
    pairs.iter().map(|(k, v)| (*k, label_value(v))).collect()
}

/// Appends `extra` to `base`.
fn with(base: &Labels, extra: (&'static str, &str)) -> Labels {
    let mut l = base.clone();
    l.push((extra.0, label_value(extra.1)));
    l
}

fn num(v: &Value) -> f64 {
    v.as_f64().unwrap_or(0.0)
}

/// A state set: one sample per possible state, 1 for the current one.
fn stateset(out: &mut Vec<(Labels, f64)>, base: &Labels, states: &[&str], current: &str) {
    for s in states {
        out.push((with(base, ("state", s)), f64::from(u8::from(*s == current))));
    }
}

/// The collector: handles on the node's parts, read at each scrape.
struct NodeCollector {
    pools: Arc<Pools>,
    cluster: Option<Arc<Cluster>>,
    targets: Vec<(String, Arc<scsi::ScsiTarget>)>,
    nbd: Option<nbd::NbdExports>,
    sessions: Option<iscsi::Sessions>,
}

impl std::fmt::Debug for NodeCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("NodeCollector")
    }
}

impl Collector for NodeCollector {
    fn encode(&self, mut e: DescriptorEncoder) -> Result<(), Error> {
        process::encode(&mut e)?;
        self.luns(&mut e)?;
        self.iscsi(&mut e)?;
        self.nbd(&mut e)?;
        self.pools(&mut e, &self.pools.statuses())?;
        self.disk_timings(&mut e, &self.pools.disk_timings())?;
        self.caches(&mut e, &self.pools.cache_statuses())?;
        let replicas = self
            .cluster
            .as_ref()
            .map_or_else(Vec::new, |c| c.statuses());
        self.replicas(&mut e, &replicas)?;
        Ok(())
    }
}

/// The node's metrics: OpenMetrics text, or the Prometheus text format 0.0.4
/// unless `openmetrics`; with its content type.
pub fn render(node: &NodeControl, openmetrics: bool) -> (&'static str, String) {
    let text = render_openmetrics(node);
    if openmetrics {
        (OPENMETRICS, text)
    } else {
        (PROMETHEUS_TEXT, to_prometheus_text(&text))
    }
}

/// The node's metrics as OpenMetrics text.
fn render_openmetrics(node: &NodeControl) -> String {
    let mut targets: Vec<(String, Arc<scsi::ScsiTarget>)> = node
        .objects
        .targets()
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    targets.sort_by(|a, b| a.0.cmp(&b.0));
    let collector = NodeCollector {
        pools: node.pools.clone(),
        cluster: node.cluster.clone(),
        targets,
        nbd: node.objects.nbd().cloned(),
        sessions: node.iscsi_sessions.clone(),
    };
    let mut reg = Registry::default();
    reg.register_collector(Box::new(collector));
    let mut out = String::new();
    if let Err(err) = prometheus_client::encoding::text::encode(&mut out, &reg) {
        tracing::warn!("metrics: encoding failed: {err}");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One gauge family whose label value carries a quote, a backslash and
    /// a newline.
    #[derive(Debug)]
    struct Hostile;

    impl Collector for Hostile {
        fn encode(&self, mut e: DescriptorEncoder) -> Result<(), Error> {
            let v = "a\"} 1\nforged_metric 1\n# \\";
            gauges(
                &mut e,
                "freesan_t",
                "T.",
                &[(labels([("initiator", v)]), 1.0)],
            )
        }
    }

    /// A label value cannot close its label and add a sample: the page has
    /// one sample line and the value comes back escaped, in both formats.
    /// (Before, the value went out as it was, and a line `forged_metric 1`
    /// followed.)
    #[test]
    fn a_label_value_cannot_forge_a_sample() {
        let mut reg = Registry::default();
        reg.register_collector(Box::new(Hostile));
        let mut open = String::new();
        prometheus_client::encoding::text::encode(&mut open, &reg).unwrap();
        for text in [open.clone(), to_prometheus_text(&open)] {
            let samples: Vec<&str> = text.lines().filter(|l| !l.starts_with('#')).collect();
            assert_eq!(samples.len(), 1, "{text}");
            assert_eq!(
                samples[0], "freesan_t{initiator=\"a\\\"} 1\\nforged_metric 1\\n# \\\\\"} 1.0",
                "{text}"
            );
        }
    }

    #[test]
    fn counters_get_their_total_name_in_the_prometheus_text_format() {
        let open =
            "# HELP a_bytes A.\n# TYPE a_bytes counter\n# UNIT a_bytes bytes\na_bytes_total 1.0\n\
                    # HELP g G.\n# TYPE g gauge\ng 2.0\n# EOF\n";
        assert_eq!(
            super::to_prometheus_text(open),
            "# HELP a_bytes_total A.\n# TYPE a_bytes_total counter\na_bytes_total 1.0\n\
             # HELP g G.\n# TYPE g gauge\ng 2.0\n"
        );
    }
}
