//! The raid crate's integration tests, one module per area, in one test binary
//! (compiled and linked once, not once per file).

#[path = "../common/mod.rs"]
mod common;

mod aborted;
mod early_ack;
mod far;
mod grow;
mod hung;
mod journal_device;
mod oracle;
mod ring_size;
mod scenarios;
mod write_hole;
