//! The process families: CPU time, resident memory, open files (read from
//! `/proc/self`, as the Prometheus client libraries name them), the node's buffer
//! memory bound and build information.

use super::{counters, gauges, labels, Labels};
use prometheus_client::encoding::DescriptorEncoder;
use std::fmt::Error;

/// CPU seconds (user + system) and resident bytes from `/proc/self/stat`.
fn stat() -> Option<(f64, f64)> {
    let s = std::fs::read_to_string("/proc/self/stat").ok()?;
    // fields after the command name (which may hold spaces) in parentheses
    let rest = s.get(s.rfind(')')? + 2..)?;
    let f: Vec<&str> = rest.split_whitespace().collect();
    // rest starts at field 3 (state): utime is field 14, stime 15, rss 24
    let utime: f64 = f.get(11)?.parse().ok()?;
    let stime: f64 = f.get(12)?.parse().ok()?;
    let rss_pages: f64 = f.get(21)?.parse().ok()?;
    // SAFETY: sysconf only reads a constant
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    // SAFETY: as above
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(1) as f64;
    Some(((utime + stime) / ticks, rss_pages * page))
}

fn open_fds() -> Option<f64> {
    Some(std::fs::read_dir("/proc/self/fd").ok()?.count() as f64)
}

fn max_fds() -> Option<f64> {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the struct it is given
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) } != 0 {
        return None;
    }
    Some(r.rlim_cur as f64)
}

/// Writes the process families.
pub(super) fn encode(e: &mut DescriptorEncoder) -> Result<(), Error> {
    let none = Labels::new;
    if let Some((cpu, rss)) = stat() {
        counters(
            e,
            "process_cpu_seconds",
            "User and system CPU time the process has used.",
            &[(none(), cpu)],
        )?;
        gauges(
            e,
            "process_resident_memory_bytes",
            "Resident memory of the process.",
            &[(none(), rss)],
        )?;
    }
    if let Some(n) = open_fds() {
        gauges(
            e,
            "process_open_fds",
            "Open file descriptors.",
            &[(none(), n)],
        )?;
    }
    if let Some(n) = max_fds() {
        gauges(
            e,
            "process_max_fds",
            "The process's limit on open file descriptors.",
            &[(none(), n)],
        )?;
    }
    let b = block::BufferBudget::node().status();
    gauges(
        e,
        "freesan_buffer_memory_max_bytes",
        "The node's bound on buffered data ([limits] buffer_memory_max).",
        &[(none(), b.max_bytes as f64)],
    )?;
    gauges(
        e,
        "freesan_buffer_memory_held_bytes",
        "Buffered data held now under the node's memory bound.",
        &[(none(), b.held_bytes as f64)],
    )?;
    counters(
        e,
        "freesan_buffer_memory_waits",
        "Buffer requests that waited for memory under the bound.",
        &[(none(), b.waits as f64)],
    )?;
    counters(
        e,
        "freesan_buffer_memory_refusals",
        "Buffer requests refused at once (answered busy) under the bound.",
        &[(none(), b.refusals as f64)],
    )?;
    gauges(
        e,
        "freesan_buffer_memory_session_max_bytes",
        "The most of the node's buffered data one session may hold ([limits] session_buffer_max).",
        &[(none(), b.session_max_bytes as f64)],
    )?;
    counters(
        e,
        "freesan_buffer_memory_session_waits",
        "Buffer requests that waited because their session held its whole share.",
        &[(none(), b.session_waits as f64)],
    )?;
    gauges(
        e,
        "freesan_buffer_memory_source_max_bytes",
        "The most of the node's buffered data the sessions of one source address may hold together ([limits] source_buffer_max).",
        &[(none(), b.source_max_bytes as f64)],
    )?;
    counters(
        e,
        "freesan_buffer_memory_source_waits",
        "Buffer requests that waited because their source address held its whole share.",
        &[(none(), b.source_waits as f64)],
    )?;
    gauges(
        e,
        "freesan_build_info",
        "Always 1; the labels say which freesan this is.",
        &[(labels([("version", env!("CARGO_PKG_VERSION"))]), 1.0)],
    )
}
