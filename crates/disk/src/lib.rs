//! disk (being written)
