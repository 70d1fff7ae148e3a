//! First in, first out: one list, blocks enter at the head and leave from the
//! tail; a hit changes nothing. The simplest baseline. 22 bytes per block (8 key, 8 links, 6 index).

super::table::list_policy! {
    /// First-in-first-out eviction over at most `capacity` blocks.
    pub struct Fifo;
    name: "fifo",
    new_doc: "An empty FIFO cache of `capacity` blocks; all memory is allocated here.",
    hit_moves_to_head: false,
}
