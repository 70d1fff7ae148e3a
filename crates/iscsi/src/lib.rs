//! freesan's iSCSI target (RFC 7143) on tokio.
//!
//! What it does: listens on portals, runs login (via `iscsi-proto`'s negotiator),
//! discovery (SendTargets) and normal sessions; in full feature phase it keeps the
//! CmdSN window, collects Data-Out (immediate, unsolicited, R2T-solicited) into one
//! buffer, hands each command to [`scsi::ScsiTarget::execute`] on its own task and
//! sends Data-In/status back through one batching writer task per connection; it
//! answers NOP, task management, text, logout and rejects malformed input.
//!
//! What it does not do: SCSI semantics (the `scsi` crate), error recovery levels
//! above 0, multiple connections per session (MaxConnections=1), SNACK.
//!
//! Key invariant: nothing an initiator sends can panic the process, grow memory
//! without bound or disturb another session; every protocol violation ends in a
//! Reject, an iSCSI status or a closed connection, logged with `tracing::warn`.
//!
//! Per connection there are: the reader (the connection's own task: framing,
//! sequencing, Data-Out collection, dispatch), one task per executing SCSI command
//! (and per task management function that waits for aborts), and one writer task
//! that stamps StatSN/ExpCmdSN/MaxCmdSN and writes batches with vectored writes.

mod auth_limit;
mod config;
mod conn;
mod copy_reach;
mod dataout;
mod discovery;
mod exec;
mod login_phase;
mod server;
mod session;
mod tmf;
mod writer;

pub use auth_limit::AuthStats;
pub use config::{Auth, ChapSecret, Limits, Portal, ServerConfig, TargetSpec};
pub use iscsi_proto::login::is_iscsi_name;
pub use server::{
    PortalChange, PortalError, Reloader, ReplaceError, Server, SessionInfo, Sessions,
};
pub use session::SessionIoStats;
