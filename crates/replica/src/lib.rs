//! Two-node synchronous replication: a [`ReplicatedVolume`] keeps this node's
//! copy of a volume identical to the partner's, over sync links, with the
//! failure handling of an HA pair (heartbeats and leases, a witness, a persistent
//! dirty bitmap, incremental resync, generations).
//!
//! What it does not do: SCSI (the LUN above it asks [`ReplicatedVolume::port_states`]
//! what its ALUA groups should say) or the wire format (`replica-proto`).
//!
//! Key invariants: a write is acknowledged only when both copies hold it, or when
//! this node serves alone with the survivor grant and the change is in its
//! persistent bitmap; overlapping writes are applied in the same order on both
//! copies (the leader orders them under a range lock held until both applied);
//! at most one node serves once the nodes lose each other (leases, then the
//! witness or the preference decides). See docs/0004-replication.md.

mod bitmap;
mod link;
mod listener;
mod meta;
mod monitor;
mod plan;
pub mod secure;
mod session;
mod undo;
mod volume;
pub mod witness;

pub use listener::{SyncListener, SyncSinks};
pub use meta::Meta;
pub use monitor::{
    HeartbeatAuth, SyncLinkMonitor, SyncLinkState, DATAGRAM_BYTES as HEARTBEAT_DATAGRAM_BYTES,
};
pub use plan::{plan, Plan};
pub use volume::{
    check_names, witness_key, ConnectionSink, Mode, PathState, PortStates, ReplicaConfig,
    ReplicaStatus, ReplicatedVolume, Role, ScsiPeer,
};
