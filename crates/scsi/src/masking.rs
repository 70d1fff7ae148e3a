//! LUN masking: host groups decide which logical units an initiator sees and under
//! which LUN numbers.
//!
//! A target without host groups shows every LU to every initiator it admits, under
//! the LU's own number. Once a target has host groups, an initiator sees only the LUs
//! of its group, numbered as the group maps them, and an initiator in no group sees
//! none: REPORT LUNS lists nothing and every LUN answers LOGICAL UNIT NOT SUPPORTED,
//! as for a LUN that does not exist. Membership is by CHAP name (the identity the
//! initiator proved at login, when CHAP was used) or else by initiator name.
//!
//! Every path that takes a LUN from the initiator translates it here: commands, task
//! management, and the copy targets EXTENDED COPY may reach.

use crate::{ItNexus, ScsiError};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

/// One host group of a target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostGroup {
    /// Name, for logs and the API.
    pub name: String,
    /// Initiator names (IQNs) in the group.
    pub initiators: Vec<String>,
    /// CHAP names in the group (a session whose login proved one of them).
    pub chap_users: Vec<String>,
    /// (LUN number the group sees, the target's LUN), in the order given.
    pub luns: Vec<(u64, u64)>,
}

/// Checks host groups as [`crate::ScsiTarget::set_host_groups`] will (for a
/// configuration checked before anything starts).
pub fn check_host_groups(groups: &[HostGroup]) -> Result<(), ScsiError> {
    Masking::new(groups.to_vec()).map(|_| ())
}

/// What one initiator sees: (its LUN number, the target's LUN), sorted by the first.
pub(crate) type View = Arc<[(u64, u64)]>;

/// The host groups of a target, indexed by member.
#[derive(Default)]
pub(crate) struct Masking {
    groups: Vec<HostGroup>,
    by_initiator: HashMap<String, View>,
    by_chap_user: HashMap<String, View>,
}

impl Masking {
    /// Checks and indexes `groups`: names unique, a member in one group only, LUN
    /// numbers unique within a group and reachable by flat addressing.
    pub fn new(groups: Vec<HostGroup>) -> Result<Masking, ScsiError> {
        let mut m = Masking::default();
        let mut names = HashSet::new();
        for g in &groups {
            if !names.insert(g.name.as_str()) {
                return Err(ScsiError::Config(format!(
                    "host group {} is defined twice",
                    g.name
                )));
            }
            let mut view: Vec<(u64, u64)> = g.luns.clone();
            view.sort_unstable();
            if view.windows(2).any(|w| w[0].0 == w[1].0) {
                return Err(ScsiError::Config(format!(
                    "host group {}: a LUN number is mapped twice",
                    g.name
                )));
            }
            let mut targets: Vec<u64> = view.iter().map(|&(_, t)| t).collect();
            targets.sort_unstable();
            if targets.windows(2).any(|w| w[0] == w[1]) {
                return Err(ScsiError::Config(format!(
                    "host group {}: one LUN is mapped under two numbers",
                    g.name
                )));
            }
            // both numbers: a target's LUNs are within flat addressing too
            if let Some(&(seen, target)) = view
                .iter()
                .find(|&&(seen, target)| seen >= 0x4000 || target >= 0x4000)
            {
                return Err(ScsiError::Config(format!(
                    "host group {}: LUN {} is beyond flat addressing (16383)",
                    g.name,
                    seen.max(target)
                )));
            }
            let view: View = view.into();
            for i in &g.initiators {
                // iSCSI names are case-insensitive (logins give them folded)
                if m.by_initiator
                    .insert(i.to_ascii_lowercase(), view.clone())
                    .is_some()
                {
                    return Err(ScsiError::Config(format!(
                        "initiator {i} is in two host groups"
                    )));
                }
            }
            for u in &g.chap_users {
                if m.by_chap_user.insert(u.clone(), view.clone()).is_some() {
                    return Err(ScsiError::Config(format!(
                        "CHAP name {u} is in two host groups"
                    )));
                }
            }
        }
        m.groups = groups;
        Ok(m)
    }

    /// Whether any host group is defined (else nothing is masked).
    pub fn active(&self) -> bool {
        !self.groups.is_empty()
    }

    /// The groups as given.
    pub fn groups(&self) -> &[HostGroup] {
        &self.groups
    }

    /// What `nexus` sees; empty when it is in no group.
    pub fn view(&self, nexus: &ItNexus) -> View {
        nexus
            .chap_user
            .as_deref()
            .and_then(|u| self.by_chap_user.get(u))
            // logins give names folded; a name from elsewhere is folded here
            .or_else(|| self.by_initiator.get(&*nexus.initiator_name))
            .or_else(|| {
                let folded = nexus.initiator_name.to_ascii_lowercase();
                (*folded != *nexus.initiator_name)
                    .then(|| self.by_initiator.get(&folded))
                    .flatten()
            })
            .cloned()
            .unwrap_or_else(|| Arc::from(Vec::new()))
    }
}

/// The target's LUN behind the number `seen` in `view`.
pub(crate) fn to_target(view: &[(u64, u64)], seen: u64) -> Option<u64> {
    view.binary_search_by_key(&seen, |&(s, _)| s)
        .ok()
        .map(|i| view[i].1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nexus(name: &str, chap: Option<&str>) -> ItNexus {
        ItNexus {
            initiator_name: Arc::from(name),
            initiator_port: Arc::from(format!("{name},i,0x1").as_str()),
            relative_port_id: 1,
            chap_user: chap.map(Arc::from),
        }
    }

    fn group(name: &str, initiators: &[&str], users: &[&str], luns: &[(u64, u64)]) -> HostGroup {
        HostGroup {
            name: name.into(),
            initiators: initiators.iter().map(|s| s.to_string()).collect(),
            chap_users: users.iter().map(|s| s.to_string()).collect(),
            luns: luns.to_vec(),
        }
    }

    #[test]
    fn members_see_their_groups_luns_and_strangers_see_none() {
        let m = Masking::new(vec![
            group("a", &["iqn.a"], &[], &[(1, 7), (0, 3)]),
            group("b", &["iqn.b"], &["bob"], &[(0, 7)]),
        ])
        .unwrap();
        let a = m.view(&nexus("iqn.a", None));
        assert_eq!(&a[..], &[(0, 3), (1, 7)]);
        assert_eq!(to_target(&a, 1), Some(7));
        assert_eq!(to_target(&a, 2), None);
        // The CHAP name decides before the initiator name.
        assert_eq!(&m.view(&nexus("iqn.a", Some("bob")))[..], &[(0, 7)]);
        assert!(m.view(&nexus("iqn.c", None)).is_empty());
    }

    #[test]
    fn initiator_names_match_whatever_their_letters() {
        let m = Masking::new(vec![group("a", &["IQN.X:Alice"], &[], &[(0, 3)])]).unwrap();
        assert_eq!(&m.view(&nexus("iqn.x:alice", None))[..], &[(0, 3)]);
        assert_eq!(&m.view(&nexus("IQN.X:ALICE", None))[..], &[(0, 3)]);
        // one initiator in two groups, by two spellings
        assert!(Masking::new(vec![
            group("a", &["iqn.x:alice"], &[], &[]),
            group("b", &["IQN.X:ALICE"], &[], &[]),
        ])
        .is_err());
    }

    #[test]
    fn inconsistent_groups_are_refused() {
        for groups in [
            vec![group("a", &[], &[], &[]), group("a", &[], &[], &[])],
            vec![group("a", &[], &[], &[(0, 1), (0, 2)])],
            vec![group("a", &[], &[], &[(0, 1), (1, 1)])],
            vec![group("a", &[], &[], &[(0x4000, 1)])],
            vec![group("a", &["i"], &[], &[]), group("b", &["i"], &[], &[])],
            vec![group("a", &[], &["u"], &[]), group("b", &[], &["u"], &[])],
        ] {
            assert!(Masking::new(groups).is_err());
        }
    }
}
