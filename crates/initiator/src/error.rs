//! Typed errors of the initiator.

use iscsi_proto::ProtoError;

/// What went wrong talking to a target.
#[derive(Debug, Clone, thiserror::Error)]
pub enum InitiatorError {
    /// Connecting, reading or writing the socket failed.
    #[error("i/o error: {0}")]
    Io(String),
    /// The target sent bytes that break the protocol.
    #[error("protocol error: {0}")]
    Protocol(String),
    /// The codec refused a PDU.
    #[error("malformed PDU: {0}")]
    Proto(ProtoError),
    /// Login ended with a non-zero status class.
    #[error("login failed: status class {class:#04x} detail {detail:#04x}")]
    LoginFailed {
        /// Status class (1 redirect, 2 initiator error, 3 target error).
        class: u8,
        /// Status detail.
        detail: u8,
    },
    /// Authentication could not be carried out or the target failed mutual CHAP.
    #[error("authentication failed: {0}")]
    Auth(&'static str),
    /// The connection is gone; every command in flight on it failed.
    #[error("connection lost: {0}")]
    ConnectionLost(String),
    /// A command got no answer in time (the session is closed as a consequence).
    #[error("command timed out after {0} ms")]
    Timeout(u64),
    /// The target rejected a PDU of this command.
    #[error("command rejected by the target (reason {0:#04x})")]
    Rejected(u8),
    /// The target answered with an iSCSI response other than "command completed".
    #[error("iSCSI response {0:#04x} (target failure)")]
    TargetFailure(u8),
    /// The caller asked for something this initiator does not do.
    #[error("invalid request: {0}")]
    InvalidRequest(&'static str),
    /// A SCSI command needed to open the LUN failed or the LUN never became ready.
    #[error("SCSI error: {0}")]
    Scsi(String),
    /// The paths given to multipath are not the same logical unit.
    #[error("paths disagree on the LUN identity: {0}")]
    IdentityMismatch(String),
    /// The target is not in a SendTargets answer or has no usable portal.
    #[error("target not found: {0}")]
    NotFound(String),
}

// (the wrapped error's text is in the variant's own, so it is not also given
// as the source: an error chain printed whole said it twice)
impl From<ProtoError> for InitiatorError {
    fn from(e: ProtoError) -> InitiatorError {
        InitiatorError::Proto(e)
    }
}

impl From<std::io::Error> for InitiatorError {
    fn from(e: std::io::Error) -> Self {
        InitiatorError::Io(e.to_string())
    }
}

impl InitiatorError {
    /// True when the error says the path (connection, session) is unusable, as
    /// opposed to an answer about this one command.
    pub fn is_transport(&self) -> bool {
        matches!(
            self,
            InitiatorError::Io(_)
                | InitiatorError::Protocol(_)
                | InitiatorError::Proto(_)
                | InitiatorError::ConnectionLost(_)
                | InitiatorError::Timeout(_)
                | InitiatorError::LoginFailed { .. }
                | InitiatorError::Auth(_)
        )
    }
}
