//! freesan's integration tests: real `freesan` processes driven by real clients,
//! one module per area. They are one test binary (not one per file) so the
//! harness in `../common` is compiled and a binary linked once, not once per
//! file. Tests of different areas run side by side (two threads by default), so
//! each test uses ports, folders and namespace prefixes of its own. Run one area
//! with
//! `cargo test --profile ci -p freesan --test integration thin::`.

#[path = "../common/mod.rs"]
mod common;

mod alua_explicit;
mod api_auth;
mod atomic_writes;
mod bench_cli;
mod cache_crash;
mod clients;
mod console;
mod console_api;
mod copy_offload_ha;
mod durability;
mod events;
mod ha;
mod ha_access;
mod host_groups;
mod memory_bound;
mod nbd_exports;
mod nbd_map;
mod nbd_tls;
mod netns_topology;
mod objects;
mod openapi;
mod package;
mod pool_rate;
mod pool_resize;
mod prometheus;
mod raid_crash;
mod reload;
mod resize;
mod sanitize_crash;
mod stops_answering;
mod thin;
mod trust;
mod verify_crash;
mod xcopy;
mod xcopy_targets;
