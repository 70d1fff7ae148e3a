//! The disk crate's integration tests, one module per area, in one test binary
//! (compiled and linked once, not once per file).

#[path = "../common/mod.rs"]
mod common;

mod file_volume;
mod oracle;
mod sim_disk;
mod sim_model;
mod stops_answering;
