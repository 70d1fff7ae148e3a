//! What two copies do when they meet: which is the source of the resync, or why
//! they must not be joined automatically. A pure function both nodes evaluate on
//! the same inputs, so they always agree.

use crate::meta::Meta;

/// The outcome of a handshake.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Plan {
    /// This node's copy is the newer one: it resynchronises the partner.
    Source {
        /// Every region must be copied (the partner is brand new).
        full: bool,
    },
    /// The partner's copy is the newer one.
    Target,
}

/// Decides from both copies' metadata. `preferred` breaks the tie between two
/// copies of the same generation (they differ at most in regions both bitmaps
/// name, which the resync copies).
pub fn plan(
    me_node: u8,
    me: Meta,
    peer_node: u8,
    peer: Meta,
    preferred: u8,
    undo: (bool, bool),
) -> Result<Plan, String> {
    let source = |full| Ok(Plan::Source { full });
    match (me.consistent, peer.consistent) {
        (false, false) => {
            return Err("neither copy is consistent (both were interrupted resync targets)".into())
        }
        (true, false) => return resume(me, peer).map(|full| Plan::Source { full }),
        // the consistent side decides whether it can resume this copy (what
        // it recorded, `target_from`, is not on the wire); if it cannot, it
        // closes the link, and this copy stays down
        (false, true) => return Ok(Plan::Target),
        (true, true) => {}
    }
    let newer = |a: Meta, b: Meta| -> Result<bool, String> {
        // a wrote alone since the last sync; b must still hold that sync's data.
        // A brand-new b gets everything, even when a never synced either (a
        // node that started alone on a new copy has `synced` 0 too): its bitmap
        // names only what it wrote alone, and two disks are never assumed equal
        if b.current == 0 {
            Ok(true)
        } else if b.current == a.synced {
            Ok(false)
        } else {
            Err(format!(
                "the copies diverged: generation {:#x} (from {:#x}) against {:#x}",
                a.current, a.synced, b.current
            ))
        }
    };
    match (me.solo(), peer.solo()) {
        (true, true) => Err(format!(
            "split brain: both copies took writes alone (generations {:#x} and {:#x}); \
             discard one node's copy to rejoin",
            me.current, peer.current
        )),
        (true, false) => newer(me, peer).map(|full| Plan::Source { full }),
        (false, true) => newer(peer, me).map(|_| Plan::Target),
        (false, false) if me.current == peer.current => {
            // brand-new pair: copy everything once, never assume two disks equal
            let full = me.current == 0;
            // a node that keeps the other's unfinished copies undoes them as
            // the source (both copies hold every acknowledged write)
            if undo.0 != undo.1 {
                return if undo.0 {
                    source(full)
                } else {
                    Ok(Plan::Target)
                };
            }
            if me_node == preferred || (preferred != peer_node && me_node < peer_node) {
                source(full)
            } else {
                Ok(Plan::Target)
            }
        }
        (false, false) if peer.current == 0 => source(true),
        (false, false) if me.current == 0 => Ok(Plan::Target),
        (false, false) => Err(format!(
            "the copies hold unrelated generations {:#x} and {:#x}",
            me.current, peer.current
        )),
    }
}

/// A consistent copy `a` meets an inconsistent one `b` (an unfinished resync
/// target, or a copy discarded by the operator): `a` is the source; whether
/// in full. An interrupted resync leaves the target at the generation it had
/// when the resync began, holding everything the source had then but what
/// the regions still marked in the two bitmaps name: that generation is the
/// source's own (a tie), the one the source last synced from (it wrote
/// alone), or, when the target missed the end of a resync the source
/// completed, the one the source recorded then (`target_from`), whatever the
/// source's generations became since. A copy whose state was lost (its
/// state folder wiped: a fresh meta and an empty bitmap, then perhaps serving
/// alone under a new generation) has none of these, and resuming from it
/// would copy nothing and call the target consistent. So:
/// - `b` holds no generation of its own (brand new when its resync began, or
///   discarded): everything is copied;
/// - `b`'s generation is one of `a`'s three: `a` resumes;
/// - otherwise neither is known to hold all the data (`a` may be a new disk,
///   `b` is partly copied), and the operator decides.
fn resume(a: Meta, b: Meta) -> Result<bool, String> {
    if b.current == 0 {
        Ok(true)
    } else if b.current == a.current || b.current == a.synced || b.current == a.target_from {
        Ok(false)
    } else {
        Err(format!(
            "an unfinished resync target of generation {:#x} meets a copy with no record of \
             it (generation {:#x} from {:#x}: a new copy, or its state folder was lost): \
             neither is known to hold all the data. To copy everything from the consistent \
             copy, discard the unfinished one (`freesan replica discard` on its node)",
            b.current, a.current, a.synced
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(current: u64, synced: u64) -> Meta {
        Meta {
            current,
            synced,
            consistent: true,
            target_from: 0,
            partial: false,
        }
    }

    /// Both nodes reach opposite conclusions (one source, one target) or the same error.
    fn both(a: Meta, b: Meta, preferred: u8) -> Result<Plan, String> {
        both_undo(a, b, preferred, (false, false))
    }

    /// [`both`] with `undo`: (node 1 keeps undo, node 2 keeps undo).
    fn both_undo(a: Meta, b: Meta, preferred: u8, undo: (bool, bool)) -> Result<Plan, String> {
        let pa = plan(1, a, 2, b, preferred, undo);
        let pb = plan(2, b, 1, a, preferred, (undo.1, undo.0));
        match (&pa, &pb) {
            (Ok(Plan::Source { full }), Ok(Plan::Target)) => {
                assert!(*full == matches!(pa, Ok(Plan::Source { full: true })))
            }
            (Ok(Plan::Target), Ok(Plan::Source { .. })) => {}
            (Err(x), Err(y)) => assert_eq!(x.contains("split"), y.contains("split")),
            other => panic!("nodes disagree: {other:?}"),
        }
        pa
    }

    #[test]
    fn the_node_that_wrote_alone_is_the_source() {
        assert_eq!(both(m(9, 5), m(5, 5), 2), Ok(Plan::Source { full: false }));
        assert_eq!(both(m(5, 5), m(9, 5), 1), Ok(Plan::Target));
    }

    #[test]
    fn same_generation_goes_to_the_preferred_node() {
        assert_eq!(both(m(5, 5), m(5, 5), 1), Ok(Plan::Source { full: false }));
        assert_eq!(both(m(5, 5), m(5, 5), 2), Ok(Plan::Target));
    }

    #[test]
    fn same_generation_goes_to_the_node_keeping_the_others_copies() {
        // node 2 keeps node 1's unfinished copies: it is the source even where
        // node 1 is preferred
        assert_eq!(
            both_undo(m(5, 5), m(5, 5), 1, (false, true)),
            Ok(Plan::Target)
        );
        assert_eq!(
            both_undo(m(5, 5), m(5, 5), 2, (true, false)),
            Ok(Plan::Source { full: false })
        );
        // both or neither: the preference
        assert_eq!(
            both_undo(m(5, 5), m(5, 5), 2, (true, true)),
            Ok(Plan::Target)
        );
        // a node that wrote alone stays the source
        assert_eq!(
            both_undo(m(9, 5), m(5, 5), 2, (false, true)),
            Ok(Plan::Source { full: false })
        );
    }

    #[test]
    fn brand_new_copies_get_a_full_sync() {
        assert_eq!(both(m(0, 0), m(0, 0), 1), Ok(Plan::Source { full: true }));
        assert_eq!(both(m(5, 5), m(0, 0), 2), Ok(Plan::Source { full: true }));
        assert_eq!(both(m(9, 5), m(0, 0), 2), Ok(Plan::Source { full: true }));
        // a node that started alone on a new copy and meets its new partner:
        // what it wrote alone is not all it holds
        assert_eq!(both(m(9, 0), m(0, 0), 1), Ok(Plan::Source { full: true }));
        assert_eq!(both(m(0, 0), m(9, 0), 1), Ok(Plan::Target));
    }

    #[test]
    fn an_interrupted_target_is_never_a_source() {
        let mut t = m(5, 5);
        t.consistent = false;
        assert_eq!(both(m(5, 5), t, 2), Ok(Plan::Source { full: false }));
        assert!(both(t, t, 1).is_err());
    }

    /// A node whose state folder was lost (a fresh meta, an empty bitmap)
    /// must not resume a resync it knows nothing of: it would copy nothing and
    /// end with the target called consistent. (The target's side answers
    /// "target" and is left down when the source closes the link.)
    #[test]
    fn a_copy_without_state_never_resumes_an_unfinished_target() {
        let mut t = m(5, 5);
        t.consistent = false;
        for preferred in [1, 2] {
            let e = plan(1, Meta::fresh(), 2, t, preferred, (false, false)).unwrap_err();
            assert!(e.contains("no record of it"), "{e}");
            // the same node after serving alone under a generation of its own
            assert!(plan(1, m(9, 0), 2, t, preferred, (false, false)).is_err());
            // a source that did record the target's generation resumes
            assert_eq!(
                both(m(9, 5), t, preferred),
                Ok(Plan::Source { full: false })
            );
        }
    }

    /// The source stored the end of a resync (the target's generation in
    /// target_from), the target missed it, and the source went on alone:
    /// the target, still unfinished at its old generation, is resumed.
    #[test]
    fn a_target_that_missed_the_end_is_resumed_after_the_source_went_on_alone() {
        let mut t = m(5, 5);
        t.consistent = false;
        let mut s = m(11, 9);
        assert!(plan(1, s, 2, t, 1, (false, false)).is_err());
        s.target_from = 5;
        assert_eq!(both(s, t, 2), Ok(Plan::Source { full: false }));
    }

    /// A discarded copy (or a brand-new one whose first resync was cut) holds
    /// no generation: whatever the other is, it copies everything.
    #[test]
    fn a_discarded_copy_gets_everything() {
        let gone = Meta {
            consistent: false,
            ..Meta::fresh()
        };
        assert_eq!(both(m(5, 5), gone, 2), Ok(Plan::Source { full: true }));
        assert_eq!(both(m(9, 5), gone, 2), Ok(Plan::Source { full: true }));
        assert_eq!(
            both(Meta::fresh(), gone, 2),
            Ok(Plan::Source { full: true })
        );
        assert_eq!(both(gone, m(5, 5), 1), Ok(Plan::Target));
    }

    #[test]
    fn split_brain_and_divergence_are_refused() {
        assert!(both(m(9, 5), m(8, 5), 1)
            .unwrap_err()
            .contains("split brain"));
        assert!(both(m(9, 5), m(7, 7), 1).is_err());
        assert!(both(m(4, 4), m(7, 7), 1).is_err());
    }
}
