//! iscsi-proto (being written)
