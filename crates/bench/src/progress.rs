//! Progress reporting: a sample about once a second, and a one-line stderr display.

use std::io::Write;
use std::sync::Arc;

/// One progress sample of a running workload.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ProgressSample {
    /// Seconds since the run started (ramp-up included).
    pub elapsed_secs: f64,
    /// I/O completed per second over the last interval.
    pub iops: f64,
    /// Decimal megabytes (1e6 bytes) per second over the last interval.
    pub mbps: f64,
    /// True while still in ramp-up (not measured).
    pub ramping: bool,
    /// True for the last call of a run (after the workers stopped).
    pub done: bool,
}

/// Receives progress samples; called from the run's sampler task, about once a second.
pub type ProgressSink = Arc<dyn Fn(&ProgressSample) + Send + Sync>;

/// Prints progress on one updating stderr line (`\r`), ended by a newline when done.
#[derive(Debug, Clone)]
pub struct ProgressLine {
    label: String,
}

impl ProgressLine {
    /// A progress line prefixed with `label` (usually the pattern name).
    pub fn new(label: &str) -> Self {
        ProgressLine {
            label: label.to_string(),
        }
    }

    /// The text shown for one sample (without `\r`).
    pub fn format(&self, s: &ProgressSample) -> String {
        format!(
            "{:<14} {:>6.1}s {:>10.0} IOPS {:>9.1} MB/s{}",
            self.label,
            s.elapsed_secs,
            s.iops,
            s.mbps,
            if s.ramping {
                "  (ramp-up)"
            } else {
                "           "
            }
        )
    }

    /// A sink that prints to stderr.
    pub fn sink(&self) -> ProgressSink {
        let me = self.clone();
        let tty = std::io::IsTerminal::is_terminal(&std::io::stderr());
        Arc::new(move |s: &ProgressSample| {
            let mut err = std::io::stderr().lock();
            // On a terminal the line updates in place; in a log, one line per sample.
            let _ = if s.done || !tty {
                writeln!(err, "\r{}", me.format(s))
            } else {
                write!(err, "\r{}", me.format(s))
            };
            let _ = err.flush();
        })
    }
}
