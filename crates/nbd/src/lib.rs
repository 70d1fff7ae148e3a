//! nbd (being written)
