//! Reports of finished runs: a plain-text table, JSON, CSV and the one-line summary.

use crate::{BenchError, RunResult};
use serde::{Deserialize, Serialize};
use std::fmt::Write;

/// Where and when a set of results was measured.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReportMeta {
    /// What was measured, e.g. `iscsi://10.0.0.1/iqn.2026-01.org.freesan:lun0/0`.
    pub target: String,
    /// Start of the report, RFC 3339 UTC (`2026-11-21T10:02:46Z`).
    pub date_utc: String,
    /// Host name of the client that ran the benchmark.
    pub host: String,
    /// freesan version of the benchmark.
    pub freesan_version: String,
}

impl ReportMeta {
    /// Metadata for `target` with the current time, this host and this version.
    pub fn new(target: &str) -> Self {
        ReportMeta {
            target: target.to_string(),
            date_utc: rfc3339_utc_now(),
            host: host_name(),
            freesan_version: env!("CARGO_PKG_VERSION").to_string(),
        }
    }
}

/// A JSON report: metadata plus every result in full.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// Where and when.
    pub meta: ReportMeta,
    /// The results, in run order.
    pub results: Vec<RunResult>,
}

impl Report {
    /// Pretty-printed JSON.
    pub fn to_json(&self) -> Result<String, BenchError> {
        Ok(serde_json::to_string_pretty(self)?)
    }

    /// Parses JSON written by [`Report::to_json`].
    pub fn from_json(s: &str) -> Result<Self, BenchError> {
        Ok(serde_json::from_str(s)?)
    }
}

fn host_name() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most buf.len() bytes into buf.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr() as *mut libc::c_char, buf.len()) };
    if rc != 0 {
        return "unknown".to_string();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

/// Current time as RFC 3339 UTC, seconds precision.
fn rfc3339_utc_now() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    rfc3339_utc(secs)
}

/// Formats seconds since the Unix epoch (civil-from-days, proleptic Gregorian).
pub(crate) fn rfc3339_utc(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + if m <= 2 { 1 } else { 0 };
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

fn verify_text(r: &RunResult) -> String {
    match &r.verify {
        None => "-".to_string(),
        Some(v) if v.passed => "ok".to_string(),
        Some(v) => match &v.first_failure {
            Some(f) => format!("FAILED lba {}", f.lba),
            None => "FAILED".to_string(),
        },
    }
}

/// A plain-text table: one row per result, latencies in microseconds.
pub fn text_table(results: &[RunResult]) -> String {
    let show_verify = results.iter().any(|r| r.verify.is_some());
    let name_w = results
        .iter()
        .map(|r| r.name.len())
        .max()
        .unwrap_or(0)
        .max(7);
    let mut out = String::new();
    let _ = write!(
        out,
        "{:<name_w$} {:>10} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>6} {:>6}",
        "pattern",
        "IOPS",
        "MB/s",
        "avg us",
        "p50 us",
        "p99 us",
        "p99.9 us",
        "max us",
        "CPU%",
        "errors"
    );
    if show_verify {
        out.push_str("  verify");
    }
    out.push('\n');
    for r in results {
        let l = &r.latency;
        let _ = write!(
            out,
            "{:<name_w$} {:>10.0} {:>9.1} {:>9.0} {:>9.0} {:>9.0} {:>9.0} {:>9.0} {:>6.1} {:>6}",
            r.name,
            r.iops,
            r.mb_per_sec,
            l.avg_us,
            l.p50_us,
            l.p99_us,
            l.p999_us,
            l.max_us,
            r.cpu_pct_one_core,
            r.errors()
        );
        if show_verify {
            let _ = write!(out, "  {}", verify_text(r));
        }
        out.push('\n');
    }
    out
}

/// The fixed-format last line of a run; the format is documented in the crate docs.
pub fn summary_line(results: &[RunResult]) -> String {
    if results.is_empty() {
        return "summary: none".to_string();
    }
    let items: Vec<String> = results
        .iter()
        .map(|r| {
            let mut s = format!(
                "{} iops={:.0} mbps={:.1} lat_avg_us={:.0} errors={}",
                r.name,
                r.iops,
                r.mb_per_sec,
                r.latency.avg_us,
                r.errors()
            );
            match &r.verify {
                Some(v) if v.passed => s.push_str(" verify=ok"),
                Some(v) => {
                    let lba = v.first_failure.as_ref().map_or(0, |f| f.lba);
                    let _ = write!(s, " verify=failed lba={lba}");
                }
                None => {}
            }
            s
        })
        .collect();
    format!("summary: {}", items.join(" | "))
}

/// One CSV row: the flat figures of a [`RunResult`] (no timeline, no spec details
/// beyond the pattern's shape).
#[derive(Debug, Clone, PartialEq)]
pub struct CsvRow {
    /// Pattern name.
    pub name: String,
    /// I/O size.
    pub block_size_bytes: u32,
    /// Read percentage.
    pub read_pct: u8,
    /// Random percentage.
    pub random_pct: u8,
    /// Workers.
    pub threads: u32,
    /// I/O in flight per worker.
    pub queue_depth: u32,
    /// Measured window.
    pub measured_secs: f64,
    /// Total IOPS.
    pub iops: f64,
    /// Read IOPS.
    pub read_iops: f64,
    /// Write IOPS.
    pub write_iops: f64,
    /// Decimal MB/s.
    pub mb_per_sec: f64,
    /// MiB/s.
    pub mib_per_sec: f64,
    /// Mean latency.
    pub lat_avg_us: f64,
    /// Median latency.
    pub lat_p50_us: f64,
    /// 99th percentile latency.
    pub lat_p99_us: f64,
    /// 99.9th percentile latency.
    pub lat_p999_us: f64,
    /// Largest latency.
    pub lat_max_us: f64,
    /// Mean read latency.
    pub read_lat_avg_us: f64,
    /// Mean write latency.
    pub write_lat_avg_us: f64,
    /// Client CPU, % of one core.
    pub cpu_pct_one_core: f64,
    /// Client CPU per I/O.
    pub cpu_us_per_io: f64,
    /// Failed reads.
    pub read_errors: u64,
    /// Failed writes.
    pub write_errors: u64,
    /// `""` (not verified), `"ok"` or `"failed"`.
    pub verify: String,
}

const CSV_HEADER: &str = "name,block_size_bytes,read_pct,random_pct,threads,queue_depth,measured_secs,iops,read_iops,write_iops,mb_per_sec,mib_per_sec,lat_avg_us,lat_p50_us,lat_p99_us,lat_p999_us,lat_max_us,read_lat_avg_us,write_lat_avg_us,cpu_pct_one_core,cpu_us_per_io,read_errors,write_errors,verify";

impl From<&RunResult> for CsvRow {
    fn from(r: &RunResult) -> Self {
        CsvRow {
            name: r.name.clone(),
            block_size_bytes: r.spec.block_size_bytes,
            read_pct: r.spec.read_pct,
            random_pct: r.spec.random_pct,
            threads: r.spec.threads,
            queue_depth: r.spec.queue_depth,
            measured_secs: r.measured_secs,
            iops: r.iops,
            read_iops: r.read_iops,
            write_iops: r.write_iops,
            mb_per_sec: r.mb_per_sec,
            mib_per_sec: r.mib_per_sec,
            lat_avg_us: r.latency.avg_us,
            lat_p50_us: r.latency.p50_us,
            lat_p99_us: r.latency.p99_us,
            lat_p999_us: r.latency.p999_us,
            lat_max_us: r.latency.max_us,
            read_lat_avg_us: r.read_latency.avg_us,
            write_lat_avg_us: r.write_latency.avg_us,
            cpu_pct_one_core: r.cpu_pct_one_core,
            cpu_us_per_io: r.cpu_us_per_io,
            read_errors: r.read_errors,
            write_errors: r.write_errors,
            verify: match &r.verify {
                None => String::new(),
                Some(v) if v.passed => "ok".to_string(),
                Some(_) => "failed".to_string(),
            },
        }
    }
}

fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

/// CSV with a header line and one row per result (see [`CsvRow`] for the columns).
pub fn to_csv(results: &[RunResult]) -> String {
    let mut out = String::from(CSV_HEADER);
    out.push('\n');
    for r in results {
        let c = CsvRow::from(r);
        let _ = writeln!(
            out,
            "{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{}",
            csv_field(&c.name),
            c.block_size_bytes,
            c.read_pct,
            c.random_pct,
            c.threads,
            c.queue_depth,
            c.measured_secs,
            c.iops,
            c.read_iops,
            c.write_iops,
            c.mb_per_sec,
            c.mib_per_sec,
            c.lat_avg_us,
            c.lat_p50_us,
            c.lat_p99_us,
            c.lat_p999_us,
            c.lat_max_us,
            c.read_lat_avg_us,
            c.write_lat_avg_us,
            c.cpu_pct_one_core,
            c.cpu_us_per_io,
            c.read_errors,
            c.write_errors,
            csv_field(&c.verify)
        );
    }
    out
}

/// Splits one CSV line into fields (RFC 4180 quoting, no embedded newlines).
fn split_csv_line(line: &str) -> Vec<String> {
    let mut fields = Vec::new();
    let mut cur = String::new();
    let mut quoted = false;
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match (c, quoted) {
            ('"', true) if chars.peek() == Some(&'"') => {
                cur.push('"');
                chars.next();
            }
            ('"', true) => quoted = false,
            ('"', false) if cur.is_empty() => quoted = true,
            (',', false) => fields.push(std::mem::take(&mut cur)),
            (c, _) => cur.push(c),
        }
    }
    fields.push(cur);
    fields
}

/// Parses CSV written by [`to_csv`].
pub fn csv_from_str(s: &str) -> Result<Vec<CsvRow>, BenchError> {
    let mut lines = s.lines().enumerate();
    match lines.next() {
        Some((_, h)) if h.trim_end() == CSV_HEADER => {}
        _ => {
            return Err(BenchError::Csv {
                line: 1,
                reason: "missing or unknown header".to_string(),
            })
        }
    }
    let mut rows = Vec::new();
    for (i, line) in lines {
        if line.trim().is_empty() {
            continue;
        }
        let f = split_csv_line(line);
        let line_no = i + 1;
        if f.len() != 24 {
            return Err(BenchError::Csv {
                line: line_no,
                reason: format!("{} fields, expected 24", f.len()),
            });
        }
        fn p<T: std::str::FromStr>(f: &[String], i: usize, line: usize) -> Result<T, BenchError> {
            f[i].parse().map_err(|_| BenchError::Csv {
                line,
                reason: format!("field {} ({:?}) is not a number", i + 1, f[i]),
            })
        }
        rows.push(CsvRow {
            name: f[0].clone(),
            block_size_bytes: p(&f, 1, line_no)?,
            read_pct: p(&f, 2, line_no)?,
            random_pct: p(&f, 3, line_no)?,
            threads: p(&f, 4, line_no)?,
            queue_depth: p(&f, 5, line_no)?,
            measured_secs: p(&f, 6, line_no)?,
            iops: p(&f, 7, line_no)?,
            read_iops: p(&f, 8, line_no)?,
            write_iops: p(&f, 9, line_no)?,
            mb_per_sec: p(&f, 10, line_no)?,
            mib_per_sec: p(&f, 11, line_no)?,
            lat_avg_us: p(&f, 12, line_no)?,
            lat_p50_us: p(&f, 13, line_no)?,
            lat_p99_us: p(&f, 14, line_no)?,
            lat_p999_us: p(&f, 15, line_no)?,
            lat_max_us: p(&f, 16, line_no)?,
            read_lat_avg_us: p(&f, 17, line_no)?,
            write_lat_avg_us: p(&f, 18, line_no)?,
            cpu_pct_one_core: p(&f, 19, line_no)?,
            cpu_us_per_io: p(&f, 20, line_no)?,
            read_errors: p(&f, 21, line_no)?,
            write_errors: p(&f, 22, line_no)?,
            verify: f[23].clone(),
        });
    }
    Ok(rows)
}
