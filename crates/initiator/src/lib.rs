//! initiator (being written)
