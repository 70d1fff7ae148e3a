//! raid (being written)
