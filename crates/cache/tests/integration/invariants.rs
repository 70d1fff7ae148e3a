//! Property tests: random operation sequences keep every policy's invariants,
//! checked against a plain model of what the cache holds.

use cache::{Access, Admission, Lru, Policy, PolicyKind};
use proptest::prelude::*;
use std::collections::{HashMap, VecDeque};

#[derive(Clone, Debug)]
enum Op {
    Access(u64),
    Admit(u64),
    Touch(u64),
    Remove(u64),
}

const KEYS: u64 = 48;

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0..KEYS).prop_map(Op::Access),
        1 => (0..KEYS).prop_map(Op::Admit),
        1 => (0..KEYS).prop_map(Op::Touch),
        1 => (0..KEYS).prop_map(Op::Remove),
    ]
}

/// Applies `ops` to `p`, checking every answer against the model (key -> slot).
fn check(mut p: Box<dyn Policy>, ops: &[Op]) -> Result<(), TestCaseError> {
    let name = p.name();
    let capacity = p.capacity();
    let mut model: HashMap<u64, u32> = HashMap::new();
    for op in ops {
        match *op {
            Op::Access(k) | Op::Admit(k) => {
                let was = model.get(&k).copied();
                let answer = if matches!(op, Op::Access(_)) {
                    p.access(k)
                } else {
                    p.admit(k)
                };
                match answer {
                    Access::Hit { slot } => prop_assert_eq!(was, Some(slot), "{}: hit", name),
                    Access::Inserted { slot, evicted } => {
                        prop_assert_eq!(was, None, "{}: inserted a cached key", name);
                        if let Some(e) = evicted {
                            prop_assert!(e != k);
                            prop_assert!(model.remove(&e).is_some(), "{}: evicted uncached", name);
                        }
                        prop_assert!((slot as usize) < capacity);
                        prop_assert!(
                            model.values().all(|&s| s != slot),
                            "{}: slot {} in use",
                            name,
                            slot
                        );
                        model.insert(k, slot);
                    }
                    Access::Bypassed => {
                        prop_assert_eq!(was, None, "{}: bypassed a cached key", name);
                        prop_assert!(
                            matches!(op, Op::Access(_)) || capacity == 0,
                            "{}: admit() bypassed",
                            name
                        );
                    }
                }
            }
            Op::Touch(k) => prop_assert_eq!(p.touch(k), model.get(&k).copied(), "{}: touch", name),
            Op::Remove(k) => {
                prop_assert_eq!(p.remove(k), model.remove(&k), "{}: remove", name);
                prop_assert!(!p.contains(k));
            }
        }
        prop_assert!(p.len() <= capacity, "{}: over capacity", name);
        prop_assert_eq!(p.len(), model.len(), "{}: len", name);
        for k in 0..KEYS {
            prop_assert_eq!(p.get(k), model.get(&k).copied(), "{}: get({})", name, k);
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn every_policy_keeps_its_invariants(
        capacity in 0usize..20,
        ops in proptest::collection::vec(op(), 1..300),
    ) {
        for kind in PolicyKind::ALL {
            for admission in [Admission::All, Admission::SecondMiss] {
                check(kind.build_with(admission, capacity), &ops)?;
            }
        }
    }

    /// LRU evicts exactly what a reference LRU (a recency-ordered deque) evicts.
    #[test]
    fn lru_matches_reference(
        capacity in 1usize..12,
        keys in proptest::collection::vec(0u64..24, 1..400),
    ) {
        let mut lru = Lru::new(capacity);
        let mut reference: VecDeque<u64> = VecDeque::new(); // front = most recent
        for k in keys {
            let expected = if let Some(i) = reference.iter().position(|&x| x == k) {
                reference.remove(i);
                reference.push_front(k);
                None
            } else {
                reference.push_front(k);
                (reference.len() > capacity).then(|| reference.pop_back()).flatten()
            };
            match lru.access(k) {
                Access::Hit { .. } => prop_assert_eq!(expected, None),
                Access::Inserted { evicted, .. } => prop_assert_eq!(evicted, expected),
                Access::Bypassed => prop_assert!(false, "LRU never bypasses"),
            }
        }
    }
}
