//! Discovery sessions: SendTargets=All and the parsing of its answer.

use crate::login::{random_isid, LoginOptions};
use crate::session::RawConn;
use crate::InitiatorError;
use iscsi_proto::pdu::{encode_initiator_bhs, InitiatorPdu, LogoutRequest, TextRequest};
use iscsi_proto::target::TargetPdu;
use iscsi_proto::text::{parse_text, TextAccumulator};
use iscsi_proto::RESERVED_TAG;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

/// Most Text Response PDUs accepted for one SendTargets answer.
const TEXT_RESPONSES_MAX: u32 = 64;
/// Longest a whole discovery may take.
const DISCOVERY_TIMEOUT_MS: u64 = 10_000;

/// One target of a SendTargets answer: its IQN and its portals with their TPGT.
pub type DiscoveredTarget = (String, Vec<(SocketAddr, u16)>);

/// Parses `addr[:port][,tpgt]` as TargetAddress gives it (IPv6 in brackets).
fn parse_target_address(v: &str) -> Option<(SocketAddr, u16)> {
    let (hostport, tpgt) = match v.rsplit_once(',') {
        Some((h, t)) => (h, t.parse::<u16>().ok()?),
        None => (v, 1),
    };
    let (host, port) = if let Some(rest) = hostport.strip_prefix('[') {
        let (h, after) = rest.split_once(']')?;
        let port = match after.strip_prefix(':') {
            Some(p) => p.parse::<u16>().ok()?,
            None if after.is_empty() => crate::ISCSI_PORT_DEFAULT,
            None => return None,
        };
        (h, port)
    } else {
        match hostport.split_once(':') {
            Some((h, p)) => (h, p.parse::<u16>().ok()?),
            None => (hostport, crate::ISCSI_PORT_DEFAULT),
        }
    };
    let ip: IpAddr = host.parse().ok()?;
    Some((SocketAddr::new(ip, port), tpgt))
}

/// Parses the text of a SendTargets answer. A target with no TargetAddress is
/// reachable through `discovery_portal` (RFC 7143 appendix C); addresses that are
/// not IP literals are skipped.
pub fn parse_send_targets(
    text: &[u8],
    discovery_portal: SocketAddr,
) -> Result<Vec<DiscoveredTarget>, InitiatorError> {
    let kv = parse_text(text)?;
    let mut out: Vec<DiscoveredTarget> = Vec::new();
    for (k, v) in kv {
        match k.as_str() {
            "TargetName" => out.push((v, Vec::new())),
            "TargetAddress" => {
                let Some(last) = out.last_mut() else {
                    return Err(InitiatorError::Protocol(
                        "TargetAddress before TargetName".into(),
                    ));
                };
                match parse_target_address(&v) {
                    Some(a) => {
                        if !last.1.contains(&a) {
                            last.1.push(a)
                        }
                    }
                    None => tracing::warn!(value = %v, "unusable TargetAddress skipped"),
                }
            }
            _ => {}
        }
    }
    for t in &mut out {
        if t.1.is_empty() {
            t.1.push((discovery_portal, 0));
        }
    }
    Ok(out)
}

/// Opens a discovery session on `addr`, asks `SendTargets=All`, logs out and
/// returns every target with its portals.
pub async fn discover(
    addr: SocketAddr,
    initiator_name: &str,
    chap: Option<(String, String)>,
) -> Result<Vec<DiscoveredTarget>, InitiatorError> {
    tokio::time::timeout(
        Duration::from_millis(DISCOVERY_TIMEOUT_MS),
        discover_inner(addr, initiator_name, chap),
    )
    .await
    .map_err(|_| InitiatorError::Timeout(DISCOVERY_TIMEOUT_MS))?
}

async fn discover_inner(
    addr: SocketAddr,
    initiator_name: &str,
    chap: Option<(String, String)>,
) -> Result<Vec<DiscoveredTarget>, InitiatorError> {
    let mut opts = LoginOptions::new(initiator_name, "");
    opts.chap = chap;
    opts.isid = random_isid(0xff);
    let mut conn = RawConn::connect(addr).await?;
    let p = conn.login(&opts, true).await?;
    let cmd_sn = p.cmd_sn;
    let mut exp_stat_sn = p.exp_stat_sn;
    let itt = 1;
    let mut ttt = RESERVED_TAG;
    let mut acc = TextAccumulator::new();
    let mut first = true;
    let text = 'outer: {
        for _ in 0..TEXT_RESPONSES_MAX {
            let data: &[u8] = if first { b"SendTargets=All\0" } else { b"" };
            first = false;
            let req = InitiatorPdu::Text(TextRequest {
                final_bit: true,
                cont: false,
                lun: 0,
                itt,
                ttt,
                cmd_sn,
                exp_stat_sn,
            });
            conn.send(
                &encode_initiator_bhs(&req, true, 0, data.len() as u32),
                data,
            )
            .await?;
            let f = loop {
                let f = conn.recv().await?;
                match f.pdu {
                    // Answer target pings; ignore everything else but our answer.
                    TargetPdu::NopIn(n) if n.ttt != RESERVED_TAG => {
                        let nop = InitiatorPdu::NopOut(iscsi_proto::pdu::NopOut {
                            lun: n.lun,
                            itt: RESERVED_TAG,
                            ttt: n.ttt,
                            cmd_sn,
                            exp_stat_sn,
                        });
                        conn.send(&encode_initiator_bhs(&nop, true, 0, 0), &[])
                            .await?;
                    }
                    TargetPdu::TextResponse(_) | TargetPdu::Reject(_) => break f,
                    _ => {}
                }
            };
            if f.pdu.carries_status() {
                exp_stat_sn = f.seq.stat_sn.wrapping_add(1);
            }
            let TargetPdu::TextResponse(r) = f.pdu else {
                return Err(InitiatorError::Rejected(match f.pdu {
                    TargetPdu::Reject(r) => r.reason,
                    _ => 0,
                }));
            };
            if r.itt != itt {
                return Err(InitiatorError::Protocol(
                    "Text Response for another task".into(),
                ));
            }
            let done = r.final_bit && !r.cont;
            if let Some(t) = acc.push(&f.data, r.cont)? {
                if done {
                    break 'outer t;
                }
                // Complete pairs so far but not final: keep them and ask for more.
                acc.push(&t, true)?;
            }
            ttt = r.ttt;
        }
        return Err(InitiatorError::Protocol(
            "SendTargets answer never ended".into(),
        ));
    };
    let targets = parse_send_targets(&text, addr)?;
    let logout = InitiatorPdu::Logout(LogoutRequest {
        reason: 0,
        itt: itt + 1,
        cid: 0,
        cmd_sn,
        exp_stat_sn,
    });
    if conn
        .send(&encode_initiator_bhs(&logout, true, 0, 0), &[])
        .await
        .is_ok()
    {
        let _ = tokio::time::timeout(Duration::from_secs(2), conn.recv()).await;
    }
    Ok(targets)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn send_targets_answer() {
        let portal: SocketAddr = "10.0.0.9:3260".parse().unwrap();
        let text = b"TargetName=iqn.a:one\0TargetAddress=127.0.0.1:3260,1\0TargetAddress=[::1]:3261,2\0\
TargetAddress=127.0.0.1:3260,1\0TargetName=iqn.a:two\0TargetName=iqn.a:three\0TargetAddress=host.example:3260,1\0TargetAddress=10.1.1.1,7\0";
        let t = parse_send_targets(text, portal).unwrap();
        assert_eq!(t.len(), 3);
        assert_eq!(t[0].0, "iqn.a:one");
        assert_eq!(
            t[0].1,
            vec![
                ("127.0.0.1:3260".parse().unwrap(), 1),
                ("[::1]:3261".parse().unwrap(), 2)
            ]
        );
        assert_eq!(t[1].1, vec![(portal, 0)]);
        assert_eq!(t[2].1, vec![("10.1.1.1:3260".parse().unwrap(), 7)]);
        assert!(parse_send_targets(b"TargetAddress=1.2.3.4:3260,1\0", portal).is_err());
        assert!(parse_send_targets(b"", portal).unwrap().is_empty());
    }

    #[test]
    fn target_addresses() {
        assert_eq!(
            parse_target_address("[fe80::1]:3260,3"),
            Some(("[fe80::1]:3260".parse().unwrap(), 3))
        );
        assert_eq!(
            parse_target_address("[::1],2"),
            Some(("[::1]:3260".parse().unwrap(), 2))
        );
        assert_eq!(parse_target_address("1.2.3.4:x,1"), None);
        assert_eq!(parse_target_address("[::1:3260,1"), None);
        assert_eq!(parse_target_address("1.2.3.4:3260,99999"), None);
    }
}
