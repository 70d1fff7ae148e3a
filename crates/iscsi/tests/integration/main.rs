//! The iscsi crate's integration tests, one module per area, in one test binary
//! (compiled and linked once, not once per file).

#[path = "../common/mod.rs"]
mod common;

mod attacks;
mod target;
