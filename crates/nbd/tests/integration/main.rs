//! The nbd crate's integration tests, one module per area, in one test binary
//! (compiled and linked once, not once per file).

#[path = "../common/mod.rs"]
mod common;

mod access;
mod exports;
mod ordering;
mod pipes;
mod real_clients;
mod server_client;
mod structured;
mod tls;
