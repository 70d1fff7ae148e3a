//! bench — the freesan load generator: SAN benchmark patterns over any [`block::Volume`],
//! end-to-end data verification, reports (text, JSON, CSV) and charts (SVG, PNG).
//!
//! What it does: runs the fixed patterns storage administrators judge a SAN by
//! ([`Suite::standard`]: 4K random read/write, 8K 67/33 random and sequential, 64K and
//! 256K sequential read and write, 8 threads x 8 outstanding I/O) against a
//! [`block::VolumeRef`] — a local file, an iSCSI LUN of the initiator crate, an NBD
//! export — and reports IOPS, MB/s, latency percentiles and client CPU. With
//! [`Workload::verify`] every written block carries a self-describing record (LBA,
//! generation, writer, CRC32C) that every read checks (see [`verify`]).
//!
//! What it does not do: open URLs or speak any protocol (the binary maps URLs to
//! volumes), or judge whether a figure is good (it prints figures; comparisons against
//! a peer are made by whoever runs it).
//!
//! Key invariant: only I/O completing inside the measured window (after ramp-up, before
//! the deadline) enters the figures; with verification on, no two in-flight I/Os of a
//! run ever touch the same block, so every read has an exact expected generation range
//! and a verification failure is never a false alarm of concurrency.
//!
//! # Summary line
//! The last line a run prints is [`summary_line`]; its format is fixed so external
//! checks can parse it. One item per result, items joined by `" | "`:
//!
//! ```text
//! summary: <name> iops=<int> mbps=<float .1> lat_avg_us=<int> errors=<int>[ verify=ok| verify=failed lba=<int>]
//! ```
//!
//! With more than one result the items are joined by ` | ` (no total: IOPS of
//! different patterns do not add up to anything meaningful), e.g.
//! `summary: 4k-randread iops=123456 mbps=505.7 lat_avg_us=258 errors=0 | 64k-seqread iops=7000 mbps=458.8 lat_avg_us=9100 errors=0`.
//! `mbps` is decimal megabytes (1e6 bytes) per second. With no result the line is
//! `summary: none`.

mod chart;
mod cpu;
mod error;
mod progress;
mod report;
mod result;
mod rng;
mod runner;
pub mod verify;
mod workload;

#[cfg(test)]
mod tests;

pub use chart::{chart, Chart, ChartError};
pub use error::BenchError;
pub use progress::{ProgressLine, ProgressSample, ProgressSink};
pub use report::{csv_from_str, summary_line, text_table, to_csv, CsvRow, Report, ReportMeta};
pub use result::{LatencySummary, RunResult, TimelinePoint};
pub use runner::{run, run_suite, run_with, RunOptions};
pub use verify::{
    prefill, verify_pass, VerifyFailure, VerifyKind, VerifyMap, VerifyReport, VerifyState,
    VerifySummary,
};
pub use workload::{Region, Suite, Workload};
