//! Who owns a TCP socket on this host, from the kernel's socket tables
//! (`/proc/net/tcp`, `/proc/net/tcp6`).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// TCP state LISTEN in the tables.
const LISTEN: &str = "0A";

/// The user owning the socket that accepted the connection from `me` to
/// `node`: the accepted socket's own row (local `node`, remote `me`) once a
/// program has accepted it, else the socket listening on `node`'s port (at
/// `node`'s address, or at any: Linux lets no other uid listen beside it)
/// whose queue holds it. A connection accepted from a listener belongs to the
/// listener's user. A connection not yet accepted has no inode, and kernels
/// before 6.17 show its owner as root (review of 2026-12-07: an impostor
/// that waited before `accept` passed as root), so its row is not believed.
/// `tables` are the files' texts.
pub(crate) fn owner_of_accepted(
    tables: &[String],
    node: SocketAddr,
    me: SocketAddr,
) -> Option<u32> {
    let rows: Vec<Row> = tables
        .iter()
        .flat_map(|t| t.lines().skip(1))
        .filter_map(Row::parse)
        .collect();
    let (node, me) = (canonical(node), canonical(me));
    if let Some(r) = rows
        .iter()
        .find(|r| r.local == node && r.remote == me && r.inode != 0)
    {
        return Some(r.uid);
    }
    let listening = |r: &&Row| r.state == LISTEN && r.local.port() == node.port();
    rows.iter()
        .filter(listening)
        .find(|r| r.local.ip() == node.ip())
        .or_else(|| {
            rows.iter()
                .filter(listening)
                .find(|r| r.local.ip().is_unspecified())
        })
        .map(|r| r.uid)
}

/// An IPv4 address seen through a dual-stack socket is that IPv4 address.
fn canonical(a: SocketAddr) -> SocketAddr {
    SocketAddr::new(a.ip().to_canonical(), a.port())
}

struct Row {
    local: SocketAddr,
    remote: SocketAddr,
    state: String,
    uid: u32,
    /// 0 while no program holds it (not yet accepted).
    inode: u64,
}

impl Row {
    /// `sl local remote st tx:rx tr:when retrnsmt uid timeout inode ...`
    fn parse(line: &str) -> Option<Row> {
        let f: Vec<&str> = line.split_whitespace().collect();
        Some(Row {
            local: canonical(address(f.get(1)?)?),
            remote: canonical(address(f.get(2)?)?),
            state: f.get(3)?.to_string(),
            uid: f.get(7)?.parse().ok()?,
            inode: f.get(9)?.parse().ok()?,
        })
    }
}

/// `HEX:PORT`: the address as the kernel stores it, in 32-bit words of the
/// host's byte order (8 hex digits for IPv4, 32 for IPv6), the port in hex.
fn address(field: &str) -> Option<SocketAddr> {
    let (ip, port) = field.split_once(':')?;
    let port = u16::from_str_radix(port, 16).ok()?;
    let word = |i: usize| -> Option<[u8; 4]> {
        let w = u32::from_str_radix(ip.get(i * 8..i * 8 + 8)?, 16).ok()?;
        Some(w.to_ne_bytes())
    };
    let ip = match ip.len() {
        8 => IpAddr::V4(Ipv4Addr::from(word(0)?)),
        32 => {
            let mut b = [0u8; 16];
            for i in 0..4 {
                b[i * 4..i * 4 + 4].copy_from_slice(&word(i)?);
            }
            IpAddr::V6(Ipv6Addr::from(b))
        }
        _ => return None,
    };
    Some(SocketAddr::new(ip, port))
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEAD: &str = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n";

    fn table(rows: &[&str]) -> String {
        let mut t = HEAD.to_string();
        for r in rows {
            t.push_str(r);
            t.push('\n');
        }
        t
    }

    /// Rows as a little-endian host writes them: 127.0.0.1 is 0100007F.
    #[test]
    fn the_accepted_socket_or_its_listener_names_the_owner() {
        if cfg!(target_endian = "big") {
            return;
        }
        let node: SocketAddr = "127.0.0.1:8260".parse().unwrap();
        let me: SocketAddr = "127.0.0.1:40000".parse().unwrap();
        let v4 = table(&[
            // another program listening on all addresses, another port
            "   0: 00000000:0CBC 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 11 1",
            // the listener
            "   1: 0100007F:2044 00000000:0000 0A 00000000:00000000 00:00000000 00000000    65534        0 12 1",
            // our side of the connection, then the accepted side
            "   2: 0100007F:9C40 0100007F:2044 01 00000000:00000000 00:00000000 00000000     0        0 13 1",
            "   3: 0100007F:2044 0100007F:9C40 01 00000000:00000000 00:00000000 00000000   65534        0 14 1",
        ]);
        assert_eq!(
            owner_of_accepted(std::slice::from_ref(&v4), node, me),
            Some(65534)
        );
        // before the accepted socket exists, its listener
        let early: Vec<&str> = v4.lines().take(3).collect();
        let early = early.join("\n");
        assert_eq!(owner_of_accepted(&[early], node, me), Some(65534));
        // accepted by nobody yet (no inode), shown as root by older kernels:
        // the listener decides
        let queued = v4.replace("   65534        0 14 1", "   0        0 0 1");
        assert!(queued.contains(" 0 1\n") || queued.ends_with(" 0 1"));
        assert_eq!(owner_of_accepted(&[queued], node, me), Some(65534));
        // a listener on every address of a dual-stack socket, the
        // connection's rows with IPv4-mapped addresses
        let v6 = table(&[
            "   0: 00000000000000000000000000000000:2044 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 21 1",
            "   1: 0000000000000000FFFF00000100007F:2044 0000000000000000FFFF00000100007F:9C40 01 00000000:00000000 00:00000000 00000000  1000        0 22 1",
        ]);
        assert_eq!(
            owner_of_accepted(&[table(&[]), v6.clone()], node, me),
            Some(1000)
        );
        let listener_only: Vec<&str> = v6.lines().take(2).collect();
        assert_eq!(
            owner_of_accepted(&[listener_only.join("\n")], node, me),
            Some(1000)
        );
        // nothing on that port, or tables that do not parse
        let other: SocketAddr = "127.0.0.1:9999".parse().unwrap();
        assert_eq!(owner_of_accepted(&[v4], other, me), None);
        assert_eq!(
            owner_of_accepted(&["garbage\n1: zz:zz".to_string()], node, me),
            None
        );
    }

    /// This host's own tables: a listener made here is found as this
    /// process's user.
    #[test]
    fn a_listener_of_this_process_is_its_users() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let s = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let tables: Vec<String> = ["/proc/net/tcp", "/proc/net/tcp6"]
            .iter()
            .filter_map(|t| std::fs::read_to_string(t).ok())
            .collect();
        // SAFETY: geteuid only reads the process's credentials.
        let me = unsafe { libc::geteuid() };
        assert_eq!(
            owner_of_accepted(&tables, s.peer_addr().unwrap(), s.local_addr().unwrap()),
            Some(me)
        );
    }
}
