//! Least recently used: one list, a hit moves the block to the head, the tail is
//! evicted. The baseline every other policy is measured against. 22 bytes per block (8 key, 8 links, 6 index).

super::table::list_policy! {
    /// Least-recently-used eviction over at most `capacity` blocks.
    pub struct Lru;
    name: "lru",
    new_doc: "An empty LRU cache of `capacity` blocks; all memory is allocated here.",
    hit_moves_to_head: true,
}
