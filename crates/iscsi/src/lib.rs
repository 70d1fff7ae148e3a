//! iscsi (being written)
