//! The cache crate's integration tests, one module per area, in one test binary
//! (compiled and linked once, not once per file).

mod advisor;
mod advisor_trace;
mod default_beats_lru;
mod destage;
mod invariants;
mod volume;
