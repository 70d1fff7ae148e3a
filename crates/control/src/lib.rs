//! The control plane of a freesan node: the declarative configuration
//! ([`config`]) and the objects created at run time ([`managed`]), the node's
//! wiring from them ([`serve`]: disks, pools, caches, LUNs, targets, portals,
//! NBD, the HA pair and the management API), and the actions the management API
//! asks for (creating and deleting disks, pools, LUNs and host groups; pool,
//! cache and replica actions) through its implementation of [`api::Control`].
//!
//! What it does not do: parse the command line, install signal handlers or
//! start the runtime (the `freesan` binary does, and calls [`serve::run`]); any
//! data-path work (the layers below do it; this crate reads their counters and
//! states and calls their actions, never the other way round); speak HTTP (the
//! `api` crate does).
//!
//! Key invariant: what the node runs and what it will start with again stay the
//! same. A change made at run time is checked against the whole configuration as
//! the next start will see it, brought up, and only then recorded in
//! `DATA_DIR/managed.toml` (replaced atomically and durably); the operator's
//! config file is never rewritten.
//!
//! Modules, from the bottom up (each imports only modules before it here):
//! `identity`, [`config`], [`events`], [`secrets`], [`managed`], `fronts`, `allowed`, `nbdtls`,
//! [`api_node`], `pools`, `cluster`, `ha_scsi`, `lun`, `objects`, `node`, `metrics`,
//! [`serve`].

// What disks and LUNs created through the API may use (paths, devices, sizes).
mod allowed;
pub mod api_node;
// Benchmark jobs the API runs with the bench engine against the node's own LUNs.
pub mod benchjobs;
// The node's side of an HA pair: replicated volumes, sync listener, ALUA.
mod cluster;
pub mod config;
pub mod events;
// Which cache fronts which volume, kept in the data directory.
mod fronts;
// The last hour of the node's rates, sampled once a second.
pub mod history;
// Persistent reservations and explicit ALUA states across an HA pair.
mod ha_scsi;
// LUN identities (NAA designator, serial), kept in the data directory.
mod identity;
// Who a disk no pool or cache holds asks before a timeout fails it.
mod keep;
// Opening one LUN: its volume, identity, SCSI settings and NBD exports.
mod lun;
pub mod managed;
// The node's metrics in the OpenMetrics text format (`GET /metrics`).
mod metrics;
// NBD TLS credentials (certificates made at first start, or pre-shared keys).
mod nbdtls;
// [`api::Control`] for the node: the management API's requests.
mod node;
// Creating and deleting disks, pools, LUNs and host groups at run time.
mod objects;
// Disks, RAID pools and SSD caches of the node, and their actions.
mod pools;
pub mod reload;
pub mod secrets;
pub mod serve;
// Targets as the node serves them: built at start and by reloads.
mod targets;
