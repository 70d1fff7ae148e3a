//! Typed errors of the benchmark engine.

use block::BlockError;

/// What stopped a benchmark operation from producing a result.
///
/// I/O errors of the volume under test are *not* here: they are counted in the
/// [`crate::RunResult`]. These are errors of the benchmark itself.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// The workload cannot run on this volume (bad sizes, percentages, alignment).
    #[error("invalid workload field `{field}`: {reason}")]
    InvalidWorkload {
        /// The offending field of [`crate::Workload`].
        field: &'static str,
        /// Why it is rejected.
        reason: String,
    },
    /// The verification map given to a run describes another region or block size.
    #[error("verification map does not match the workload: {0}")]
    VerifyMapMismatch(String),
    /// A verification state file is not in the expected format or is damaged.
    #[error("verification state file: {0}")]
    StateFormat(&'static str),
    /// The volume failed an operation the benchmark cannot do without.
    #[error("volume error: {0}")]
    Block(BlockError),
    /// Reading or writing a local file (state, report) failed.
    #[error("i/o error: {0}")]
    Io(std::io::Error),
    /// A JSON document could not be written or parsed.
    #[error("json: {0}")]
    Json(serde_json::Error),
    /// A CSV document could not be parsed.
    #[error("csv line {line}: {reason}")]
    Csv {
        /// 1-based line number.
        line: usize,
        /// What is wrong with it.
        reason: String,
    },
    /// A worker task panicked or was cancelled.
    #[error("worker task failed: {0}")]
    Task(String),
}

// The wrapped errors' texts are in these variants' own, so none is given as
// the source too: an error chain printed whole (`{:#}`) said each twice.
impl From<BlockError> for BenchError {
    fn from(e: BlockError) -> BenchError {
        BenchError::Block(e)
    }
}

impl From<std::io::Error> for BenchError {
    fn from(e: std::io::Error) -> BenchError {
        BenchError::Io(e)
    }
}

impl From<serde_json::Error> for BenchError {
    fn from(e: serde_json::Error) -> BenchError {
        BenchError::Json(e)
    }
}
