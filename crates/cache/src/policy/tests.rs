//! Unit tests of every policy: capacity, hits, removal, slot reuse, eviction order.

use super::*;
use crate::trace::Rng;
use std::collections::HashMap;

fn inserted_evicting(a: Access) -> Option<u64> {
    match a {
        Access::Inserted { evicted, .. } => evicted,
        other => panic!("expected an insertion, got {other:?}"),
    }
}

/// `policy` after an access to each of `keys`, in order.
fn filled<P: Policy>(mut policy: P, keys: impl IntoIterator<Item = u64>) -> P {
    for k in keys {
        policy.access(k);
    }
    policy
}

fn every_policy(capacity: usize) -> Vec<Box<dyn Policy>> {
    let mut all: Vec<Box<dyn Policy>> = PolicyKind::ALL.iter().map(|k| k.build(capacity)).collect();
    all.push(Box::new(Doorkeeper::new(default_policy(capacity))));
    all
}

#[test]
fn capacity_never_exceeded_and_slots_distinct() {
    for mut p in every_policy(64) {
        let mut rng = Rng::new(11);
        let mut slot_of: HashMap<u64, u32> = HashMap::new();
        for _ in 0..20_000 {
            let key = rng.below(300);
            match p.access(key) {
                Access::Hit { slot } => assert_eq!(slot_of.get(&key), Some(&slot), "{}", p.name()),
                Access::Inserted { slot, evicted } => {
                    if let Some(old) = evicted {
                        assert_eq!(
                            slot_of.remove(&old),
                            Some(slot),
                            "{}: victim's slot reused",
                            p.name()
                        );
                    }
                    assert!(slot < 64);
                    assert!(
                        slot_of.values().all(|&s| s != slot),
                        "{}: slot in use",
                        p.name()
                    );
                    slot_of.insert(key, slot);
                }
                Access::Bypassed => assert!(!slot_of.contains_key(&key)),
            }
            assert!(p.len() <= p.capacity(), "{}", p.name());
            assert_eq!(p.len(), slot_of.len(), "{}", p.name());
        }
        assert_eq!(p.len(), 64, "{} fills up", p.name());
    }
}

#[test]
fn hit_after_insert_and_miss_after_remove() {
    for mut p in every_policy(8) {
        let name = p.name();
        let Access::Inserted {
            slot,
            evicted: None,
        } = p.access(5)
        else {
            panic!("{name}: expected an insertion");
        };
        assert_eq!(p.access(5), Access::Hit { slot }, "{name}");
        assert_eq!(p.get(5), Some(slot));
        assert_eq!(p.touch(5), Some(slot));
        assert_eq!(p.remove(5), Some(slot), "{name}");
        assert!(!p.contains(5));
        assert_eq!(p.remove(5), None);
        assert_eq!(p.touch(5), None, "{name}: touch never inserts");
        assert!(p.is_empty());
    }
}

#[test]
fn zero_capacity_bypasses_everything() {
    for kind in PolicyKind::ALL {
        let mut p = kind.build(0);
        assert_eq!(p.access(1), Access::Bypassed);
        assert_eq!(p.access(1), Access::Bypassed);
        assert!(p.is_empty());
    }
}

#[test]
fn capacity_one_works() {
    for mut p in every_policy(1) {
        for k in [1, 2, 2, 1, 3, 3, 3, 1] {
            p.access(k);
            assert!(p.len() <= 1);
        }
    }
}

#[test]
fn lru_evicts_least_recently_used() {
    let mut p = filled(Lru::new(3), [1, 2, 3]);
    assert!(p.access(1).is_hit());
    assert_eq!(inserted_evicting(p.access(4)), Some(2));
    assert_eq!(inserted_evicting(p.access(5)), Some(3));
    assert!(p.touch(1).is_some());
    assert_eq!(inserted_evicting(p.access(6)), Some(4));
}

#[test]
fn fifo_ignores_hits() {
    let mut p = filled(Fifo::new(3), [1, 2, 3]);
    assert!(p.access(1).is_hit());
    assert_eq!(inserted_evicting(p.access(4)), Some(1));
    assert_eq!(inserted_evicting(p.access(5)), Some(2));
}

#[test]
fn sieve_spares_visited_and_keeps_hand_position() {
    let mut p = filled(Sieve::new(3), [1, 2, 3]);
    assert!(p.access(1).is_hit());
    // Hand starts at the tail (1, visited: cleared, skipped) and evicts 2.
    assert_eq!(inserted_evicting(p.access(4)), Some(2));
    // The hand continues from where it stopped (towards the head): 3.
    assert_eq!(inserted_evicting(p.access(5)), Some(3));
    // And on towards the head: 4, newer than the hand's start, unvisited.
    assert_eq!(inserted_evicting(p.access(6)), Some(4));
    // Past the head the hand wraps to the tail: 1, no longer visited, then goes.
    // 5 and 6 visited: the hand clears them, wraps past the head to the tail: 1.
    assert!(p.access(5).is_hit());
    assert!(p.access(6).is_hit());
    assert_eq!(inserted_evicting(p.access(7)), Some(1));
    assert_eq!(inserted_evicting(p.access(8)), Some(5));
}

#[test]
fn sieve_remove_at_hand() {
    let mut p = filled(Sieve::new(3), [1, 2, 3]);
    p.access(1);
    assert_eq!(inserted_evicting(p.access(4)), Some(2)); // hand now at 3
    assert!(p.remove(3).is_some()); // hand moves on to 4
    p.access(7);
    assert_eq!(inserted_evicting(p.access(8)), Some(4));
}

#[test]
fn s3fifo_probation_and_promotion() {
    let mut p = filled(S3Fifo::new(10), 1..=10); // small share: 1 block
    assert!(p.access(1).is_hit());
    // Small holds everything (cold start); 1 was hit so it moves to main, 2 leaves.
    assert_eq!(inserted_evicting(p.access(11)), Some(2));
    assert_eq!(inserted_evicting(p.access(12)), Some(3));
    assert!(p.contains(1));
    // 2 comes back while remembered by the ghost: it goes to main, so the next
    // victims are still the unhit blocks of small.
    assert_eq!(inserted_evicting(p.access(2)), Some(4));
    assert_eq!(inserted_evicting(p.access(13)), Some(5));
    assert!(p.contains(2));
}

#[test]
fn s3fifo_main_reinserts_frequent_blocks() {
    let mut p = S3Fifo::with_small_percent(4, 25); // small 1, main 3
    for k in 1..=4 {
        p.access(k);
        p.access(k);
    }
    // All hit once in small; as new blocks arrive they are promoted to main.
    for k in 100..200 {
        p.access(k);
        if k % 2 == 0 {
            p.access(1); // 1 keeps its frequency up and is never evicted
        }
    }
    assert!(p.contains(1));
}

#[test]
fn scan_resistant_policies_keep_the_hot_set() {
    for kind in [PolicyKind::S3Fifo, PolicyKind::TwoQ] {
        let mut p = kind.build(1000);
        // A hot set of 500 blocks re-used among a stream of one-off blocks.
        let mut cold = 1_000_000;
        for _ in 0..10 {
            for k in 0..500 {
                p.access(k);
                p.access(cold);
                cold += 1;
            }
        }
        for k in 10_000..30_000 {
            p.access(k);
        }
        let kept = (0..500).filter(|&k| p.contains(k)).count();
        assert_eq!(
            kept,
            500,
            "{kind}: a scan flushed {} hot blocks",
            500 - kept
        );
    }
    let mut lru = Lru::new(1000);
    for k in (0..500).chain(10_000..30_000) {
        lru.access(k);
    }
    assert_eq!((0..500).filter(|&k| lru.contains(k)).count(), 0);
}

#[test]
fn two_q_moves_returning_blocks_to_am() {
    let mut p = filled(TwoQ::new(8), 1..=8); // Kin = 2
                                             // A1in holds 8 > Kin: its tail (1) goes to A1out.
    assert_eq!(inserted_evicting(p.access(9)), Some(1));
    // 1 returns (found in A1out) and goes to Am; A1in still over Kin: 2 leaves.
    assert_eq!(inserted_evicting(p.access(1)), Some(2));
    for k in 20..40 {
        p.access(k);
    }
    assert!(
        p.contains(1),
        "a block in Am outlives a stream through A1in"
    );
}

#[test]
fn doorkeeper_admits_on_second_miss() {
    let mut p = Doorkeeper::new(Lru::new(4));
    for k in 1..=4 {
        assert!(
            matches!(p.access(k), Access::Inserted { evicted: None, .. }),
            "free slots admit"
        );
    }
    assert_eq!(p.access(5), Access::Bypassed);
    assert_eq!(inserted_evicting(p.access(5)), Some(1));
    assert!(p.access(5).is_hit());
    assert!(p.inner().contains(5));
    assert_eq!(
        inserted_evicting(p.admit(6)),
        Some(2),
        "admit() skips the filter"
    );
    assert_eq!(p.touch(7), None);
    assert_eq!(
        p.access(7),
        Access::Bypassed,
        "touch() does not count as a miss"
    );
    assert_eq!(p.name(), "lru+dk");
}

#[test]
fn policy_names_parse() {
    for kind in PolicyKind::ALL {
        assert_eq!(kind.name().parse::<PolicyKind>(), Ok(kind));
        assert_eq!(kind.build(4).name(), kind.name());
    }
    assert_eq!("S3-FIFO".parse::<PolicyKind>(), Ok(PolicyKind::S3Fifo));
    assert!("arc".parse::<PolicyKind>().is_err());
}

#[test]
fn memory_is_allocated_up_front() {
    for kind in PolicyKind::ALL {
        let mut p = kind.build(10_000);
        let before = p.memory_bytes();
        for k in 0..50_000 {
            p.access(k % 20_000);
        }
        assert_eq!(p.memory_bytes(), before, "{kind}");
        // per block, at a size where W-TinyLFU's shadows are at their base rate
        // (1% each; below 76,800 blocks they keep a floor of 4 x 768 blocks,
        // about 80 KB, whatever the cache's size)
        let big = kind.build(76_800);
        let per_block = big.memory_bytes() as f64 / 76_800.0;
        assert!(per_block < 30.0, "{kind}: {per_block:.1} bytes per block");
    }
}

#[test]
fn pinned_blocks_are_never_evicted() {
    for mut p in every_policy(32) {
        let name = p.name();
        let mut rng = Rng::new(5);
        let mut pinned: HashMap<u64, u32> = HashMap::new();
        for i in 0..20_000u64 {
            let key = rng.below(200);
            let slot = match p.admit(key) {
                Access::Hit { slot } | Access::Inserted { slot, .. } => slot,
                Access::Bypassed => {
                    assert_eq!(pinned.len(), 32, "{name}: bypassed with room");
                    continue;
                }
            };
            if let Access::Inserted {
                evicted: Some(old), ..
            } = p.access(key)
            {
                panic!("{name}: a hit evicted {old}");
            }
            // pin up to 24 blocks, unpin some now and then
            if pinned.len() < 24 && i % 3 == 0 {
                p.set_pinned(slot, true);
                pinned.insert(key, slot);
            } else if i % 7 == 0 {
                if let Some(&k) = pinned.keys().next() {
                    let s = pinned.remove(&k).unwrap();
                    p.set_pinned(s, false);
                }
            }
            for (&k, &s) in &pinned {
                assert_eq!(p.get(k), Some(s), "{name}: pinned block {k} left");
            }
            assert_eq!(p.pinned(), pinned.len(), "{name}");
        }
        // pin everything: nothing can enter
        let mut p2 = p;
        for k in 1000..1032u64 {
            if let Access::Inserted { slot, .. } = p2.admit(k) {
                p2.set_pinned(slot, true);
            }
        }
        let before = p2.len();
        if p2.pinned() == p2.capacity() {
            assert_eq!(p2.admit(5000), Access::Bypassed, "{name}");
            assert_eq!(p2.len(), before);
        }
    }
}

#[test]
fn restore_puts_every_block_back_in_its_slot() {
    for kind in PolicyKind::ALL {
        for admission in [Admission::All, Admission::SecondMiss] {
            let mut p = kind.build_with(admission, 16);
            let saved: Vec<(u32, u64)> = vec![(3, 30), (0, 7), (15, 99), (8, 1)];
            p.restore(&saved);
            let name = p.name();
            assert_eq!(p.len(), 4, "{name}");
            for &(slot, key) in &saved {
                assert_eq!(p.get(key), Some(slot), "{name}");
            }
            // the free slots are handed out, and the restored blocks stay findable
            let mut slots: Vec<u32> = saved.iter().map(|e| e.0).collect();
            for k in 100..112u64 {
                match p.admit(k) {
                    Access::Inserted {
                        slot,
                        evicted: None,
                    } => slots.push(slot),
                    other => panic!("{name}: {other:?}"),
                }
            }
            slots.sort_unstable();
            slots.dedup();
            assert_eq!(slots.len(), 16, "{name}: every slot used once");
        }
    }
}
