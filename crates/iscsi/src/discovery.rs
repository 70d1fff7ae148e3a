//! SendTargets: which targets an initiator may see and where they are reachable.

use crate::server::Ctx;
use iscsi_proto::text::push_pair;
use std::net::{IpAddr, SocketAddr};

/// `ip:port` as TargetAddress wants it (IPv6 in brackets). An unspecified portal
/// address (0.0.0.0, ::) is replaced by the address the initiator connected to.
pub(crate) fn target_address(portal: SocketAddr, local: SocketAddr, tpgt: u16) -> String {
    let ip = if portal.ip().is_unspecified() {
        local.ip()
    } else {
        portal.ip()
    };
    match ip {
        IpAddr::V4(v4) => format!("{v4}:{},{tpgt}", portal.port()),
        IpAddr::V6(v6) => format!("[{v6}]:{},{tpgt}", portal.port()),
    }
}

/// Builds the SendTargets answer for `value` (`All`, an IQN, or empty for the
/// session's own target). Normal sessions only ever see their own target.
pub(crate) fn send_targets(
    ctx: &Ctx,
    value: &str,
    initiator: &str,
    session_target: Option<usize>,
    local: SocketAddr,
) -> Vec<u8> {
    let tables = ctx.tables();
    let targets = &tables.targets;
    // names compared folded, as the login compares them
    let initiator = iscsi_proto::login::iscsi_name(initiator);
    let visible = |i: &usize| {
        targets.get(*i).is_some_and(|t| {
            t.allowed_initiators.is_empty()
                || t.allowed_initiators
                    .iter()
                    .any(|a| iscsi_proto::login::iscsi_name(a) == initiator)
        })
    };
    let chosen: Vec<usize> = match (value, session_target) {
        ("All", None) => (0..targets.len()).filter(visible).collect(),
        ("All", Some(t)) | ("", Some(t)) => vec![t],
        ("", None) => Vec::new(),
        (iqn, own) => targets
            .iter()
            .position(|t| t.iqn.eq_ignore_ascii_case(iqn))
            .filter(|i| own.is_none_or(|o| o == *i))
            .filter(visible)
            .into_iter()
            .collect(),
    };
    let mut out = Vec::new();
    for i in chosen {
        let Some(t) = targets.get(i) else {
            continue;
        };
        push_pair(&mut out, "TargetName", &t.iqn);
        for p in ctx.portals().iter().chain(&ctx.partner_portals) {
            push_pair(
                &mut out,
                "TargetAddress",
                &target_address(p.addr, local, p.tpgt),
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses() {
        let local: SocketAddr = "10.0.0.5:3260".parse().unwrap();
        assert_eq!(
            target_address("127.0.0.2:3260".parse().unwrap(), local, 2),
            "127.0.0.2:3260,2"
        );
        assert_eq!(
            target_address("0.0.0.0:3261".parse().unwrap(), local, 1),
            "10.0.0.5:3261,1"
        );
        assert_eq!(
            target_address("[::1]:3260".parse().unwrap(), local, 3),
            "[::1]:3260,3"
        );
    }
}
