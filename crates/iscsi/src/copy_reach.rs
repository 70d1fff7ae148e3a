//! Which of the node's other targets an EXTENDED COPY received on one target may
//! reach ([`scsi::CopyReach`]): those its initiator could log in to with what its
//! session proved at login. The initiator must pass the other target's ACL, and
//! where that target asks for CHAP, the credentials it would ask of this
//! initiator must be the very ones the session proved (name and secret): a
//! copy never reaches a target whose secret the initiator has not shown it
//! knows. Which of that target's LUs it then sees is the target's own masking.

use crate::server::Ctx;
use iscsi_proto::login::{ChapCredentials, TargetAuth};
use scsi::{ItNexus, ScsiTarget};
use std::sync::{Arc, Weak};

/// The reach of target `target`'s copies.
pub(crate) struct CopyReach {
    pub ctx: Weak<Ctx>,
    pub target: usize,
}

/// Whether a login of `initiator` that proved `proven` (None: no CHAP) would
/// be admitted by a target with `auth`.
pub(crate) fn admits(auth: &TargetAuth, initiator: &str, proven: Option<&ChapCredentials>) -> bool {
    if !auth.allows(initiator) {
        return false;
    }
    if !auth.chap_required() {
        return true;
    }
    match (auth.chap_of(initiator).0, proven) {
        (Some(asked), Some(shown)) => asked == shown,
        _ => false,
    }
}

impl scsi::CopyReach for CopyReach {
    fn targets(&self, nexus: &ItNexus) -> Vec<Arc<ScsiTarget>> {
        let Some(ctx) = self.ctx.upgrade() else {
            return Vec::new();
        };
        // the session the command came on: what it proved at login
        let Some(session) = ctx
            .registry
            .of_target(self.target)
            .into_iter()
            .find(|s| s.nexus.as_ref() == Some(nexus))
        else {
            return Vec::new();
        };
        let proven = session.origin.chap_proven.as_ref();
        let tables = ctx.tables();
        tables
            .targets
            .iter()
            .zip(tables.login_cfg.targets.iter())
            .enumerate()
            .filter(|&(i, (_, auth))| {
                i != self.target && admits(auth, &nexus.initiator_name, proven)
            })
            .map(|(_, (spec, _))| spec.scsi.clone())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use iscsi_proto::login::InitiatorChap;

    const INI: &str = "iqn.2026-12.org.example:host1";

    fn creds(user: &str, secret: &str) -> ChapCredentials {
        ChapCredentials {
            user: user.into(),
            secret: secret.into(),
        }
    }

    fn target(chap: Option<ChapCredentials>, acl: &[&str]) -> TargetAuth {
        TargetAuth {
            name: "iqn.2026-12.org.example:b".into(),
            alias: None,
            chap,
            mutual: None,
            allowed_initiators: acl.iter().map(|s| s.to_string()).collect(),
            chap_initiators: Vec::new(),
            refuse_md5: false,
        }
    }

    #[test]
    fn another_target_is_reached_only_with_what_its_login_would_ask() {
        let alice = creds("alice", "secret-of-alice");
        // open target: anyone its ACL lets in
        assert!(admits(&target(None, &[]), INI, None));
        assert!(admits(&target(None, &[INI]), INI, Some(&alice)));
        assert!(!admits(
            &target(None, &["iqn.2026-12.org.example:other"]),
            INI,
            None
        ));
        // target-wide CHAP: the same name and secret, nothing else
        let b = target(Some(alice.clone()), &[]);
        assert!(admits(&b, INI, Some(&alice)));
        assert!(!admits(&b, INI, None), "no CHAP proved");
        assert!(!admits(&b, INI, Some(&creds("alice", "another-secret"))));
        assert!(!admits(&b, INI, Some(&creds("mallory", "secret-of-alice"))));
        // the ACL still applies with the right secret
        let closed = target(Some(alice.clone()), &["iqn.2026-12.org.example:other"]);
        assert!(!admits(&closed, INI, Some(&alice)));
        // a per-initiator entry wins over the target-wide credentials
        let mut own = target(Some(alice.clone()), &[]);
        let bob = creds("bob", "secret-of-bob-1");
        own.chap_initiators.push(InitiatorChap {
            initiator: INI.into(),
            creds: bob.clone(),
        });
        assert!(admits(&own, INI, Some(&bob)));
        assert!(!admits(&own, INI, Some(&alice)));
        // entries only for others: CHAP is required, and this initiator has none
        let mut others = target(None, &[]);
        others.chap_initiators.push(InitiatorChap {
            initiator: "iqn.2026-12.org.example:other".into(),
            creds: bob.clone(),
        });
        assert!(!admits(&others, INI, Some(&bob)));
        assert!(!admits(&others, INI, None));
    }
}
