//! freesan's iSCSI initiator (RFC 7143, error recovery level 0) with multipath.
//!
//! What it does:
//! - parses `iscsi://[user[%password]@]HOST[:PORT]/IQN/LUN` URLs ([`parse_iscsi_url`]);
//! - logs in (no authentication or CHAP MD5, one-way or mutual), negotiates the
//!   operational keys and runs one TCP connection per session in full feature
//!   phase ([`Session`]): CmdSN window, ITT allocation, immediate and unsolicited
//!   data, R2T-solicited Data-Out, Data-In assembly, NOP answers, Async logout;
//! - discovers targets and their portals with SendTargets ([`discover`]);
//! - exposes one LUN of a session as a [`block::Volume`] ([`IscsiLun`]) and groups
//!   the same LUN seen through several portals into one volume ([`Multipath`]),
//!   with round-robin or failover-only path selection, path failure detection,
//!   I/O retry on a healthy path, path events and background reconnection;
//! - [`open_url`] ties it together for the benchmark and tests.
//!
//! What it does not do: error recovery levels 1 and 2 (no SNACK, no task
//! reassignment), several connections per session, bidirectional commands, task
//! management beyond closing the session of a timed-out command.
//!
//! Key invariant: nothing a target sends can panic the initiator. Every malformed
//! or unexpected PDU ends in a typed [`InitiatorError`] for the commands it
//! concerns, and a protocol violation closes the connection and fails every
//! command in flight on it (which multipath turns into a retry on another path).
//!
//! Per session there are exactly two tasks: the reader (decodes frames and
//! dispatches them into the session core under a short lock) and the writer (drains
//! the core's outbox and writes whole batches with one system call where it can).
//! Callers never touch the socket: `command` queues its PDUs in CmdSN order under
//! the same lock that assigns the CmdSN, then waits on a oneshot for its result.

mod core;
mod discovery;
mod error;
mod frame;
pub mod fuzzing;
mod login;
mod lun;
mod multipath;
pub mod offload;
mod open;
mod scsi_cmd;
mod session;
mod url;

pub use crate::core::ScsiResult;
pub use discovery::{discover, parse_send_targets, DiscoveredTarget};
pub use error::InitiatorError;
pub use frame::{decode_target_frame, TargetFrame};
pub use login::random_isid;
pub use login::{LoginOptions, LoginParams, LoginStateMachine, LoginStep};
pub use lun::{IscsiLun, LunOptions};
pub use multipath::{Multipath, MultipathOptions, PathEvent, PathEventKind, PathPolicy, PathStats};
pub use open::{open_multipath, open_url, OpenOptions};
pub use scsi_cmd::{parse_sense, Sense};
pub use session::Session;
pub use url::{parse_iscsi_url, IscsiUrl, UrlError};

/// Default iSCSI TCP port.
pub const ISCSI_PORT_DEFAULT: u16 = 3260;
