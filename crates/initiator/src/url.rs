//! `iscsi://[user[%password]@]HOST[:PORT]/IQN/LUN` URLs (the libiscsi/QEMU form).

use crate::ISCSI_PORT_DEFAULT;
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};

/// A parsed iSCSI URL.
#[derive(Clone, PartialEq, Eq)]
pub struct IscsiUrl {
    /// Host as written (an IP address or a name; IPv6 without brackets).
    pub host: String,
    /// TCP port (3260 when absent).
    pub port: u16,
    /// Target IQN.
    pub target_iqn: String,
    /// Logical unit number.
    pub lun: u64,
    /// CHAP user name, if any.
    pub user: Option<String>,
    /// CHAP secret, if any.
    pub password: Option<String>,
}

impl std::fmt::Debug for IscsiUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IscsiUrl")
            .field("host", &self.host)
            .field("port", &self.port)
            .field("target_iqn", &self.target_iqn)
            .field("lun", &self.lun)
            .field("user", &self.user)
            .finish_non_exhaustive()
    }
}

/// Why a URL was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UrlError {
    /// The URL does not start with `iscsi://`.
    #[error("not an iscsi:// URL")]
    Scheme,
    /// Host missing or malformed (IPv6 must be in brackets).
    #[error("bad host: {0}")]
    Host(&'static str),
    /// The port is not a number in 1..=65535.
    #[error("bad port")]
    Port,
    /// The target IQN is missing.
    #[error("missing target name")]
    Target,
    /// The LUN is missing or not a number below 16384.
    #[error("bad LUN")]
    Lun,
    /// The host name could not be resolved.
    #[error("cannot resolve host {0}")]
    Resolve(String),
}

impl IscsiUrl {
    /// The portal address; resolves a host name when it is not an IP literal.
    pub fn socket_addr(&self) -> Result<SocketAddr, UrlError> {
        if let Ok(ip) = self.host.parse::<IpAddr>() {
            return Ok(SocketAddr::new(ip, self.port));
        }
        (self.host.as_str(), self.port)
            .to_socket_addrs()
            .ok()
            .and_then(|mut it| it.next())
            .ok_or_else(|| UrlError::Resolve(self.host.clone()))
    }

    /// CHAP credentials from the URL (user and password both present).
    pub fn chap(&self) -> Option<(String, String)> {
        match (&self.user, &self.password) {
            (Some(u), Some(p)) => Some((u.clone(), p.clone())),
            _ => None,
        }
    }
}

/// Parses `iscsi://[user[%password]@]HOST[:PORT]/IQN/LUN`.
pub fn parse_iscsi_url(url: &str) -> Result<IscsiUrl, UrlError> {
    let rest = url
        .strip_prefix("iscsi://")
        .or_else(|| url.strip_prefix("ISCSI://"))
        .ok_or(UrlError::Scheme)?;
    let (authority, path) = rest.split_once('/').ok_or(UrlError::Target)?;
    let (userinfo, hostport) = match authority.rsplit_once('@') {
        Some((u, h)) => (Some(u), h),
        None => (None, authority),
    };
    let (user, password) = match userinfo {
        None => (None, None),
        Some(u) => match u.split_once('%') {
            Some((n, p)) => (Some(n.to_string()), Some(p.to_string())),
            None => (Some(u.to_string()), None),
        },
    };
    let (host, port) = if let Some(v6) = hostport.strip_prefix('[') {
        let (h, after) = v6.split_once(']').ok_or(UrlError::Host("unclosed '['"))?;
        if h.parse::<std::net::Ipv6Addr>().is_err() {
            return Err(UrlError::Host("bad IPv6 address"));
        }
        let port = match after {
            "" => ISCSI_PORT_DEFAULT,
            p => parse_port(p.strip_prefix(':').ok_or(UrlError::Port)?)?,
        };
        (h.to_string(), port)
    } else {
        match hostport.split_once(':') {
            Some((h, p)) => {
                if p.contains(':') {
                    return Err(UrlError::Host("IPv6 address must be in brackets"));
                }
                (h.to_string(), parse_port(p)?)
            }
            None => (hostport.to_string(), ISCSI_PORT_DEFAULT),
        }
    };
    if host.is_empty() {
        return Err(UrlError::Host("empty"));
    }
    let (iqn, lun) = path.rsplit_once('/').ok_or(UrlError::Lun)?;
    if iqn.is_empty() || iqn.contains('/') {
        return Err(UrlError::Target);
    }
    if lun.is_empty() || lun.len() > 5 || !lun.bytes().all(|c| c.is_ascii_digit()) {
        return Err(UrlError::Lun);
    }
    let lun: u64 = lun.parse().map_err(|_| UrlError::Lun)?;
    if lun > 16383 {
        return Err(UrlError::Lun);
    }
    Ok(IscsiUrl {
        host,
        port,
        target_iqn: iqn.to_string(),
        lun,
        user,
        password,
    })
}

fn parse_port(p: &str) -> Result<u16, UrlError> {
    if p.is_empty() || p.len() > 5 || !p.bytes().all(|c| c.is_ascii_digit()) {
        return Err(UrlError::Port);
    }
    match p.parse::<u16>() {
        Ok(0) | Err(_) => Err(UrlError::Port),
        Ok(n) => Ok(n),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn full_and_minimal() {
        let u =
            parse_iscsi_url("iscsi://alice%s3cret@10.0.0.1:3261/iqn.2026-01.org.x:t/3").unwrap();
        assert_eq!(u.host, "10.0.0.1");
        assert_eq!(u.port, 3261);
        assert_eq!(u.target_iqn, "iqn.2026-01.org.x:t");
        assert_eq!(u.lun, 3);
        assert_eq!(u.chap(), Some(("alice".into(), "s3cret".into())));
        assert_eq!(u.socket_addr().unwrap(), "10.0.0.1:3261".parse().unwrap());
        let u = parse_iscsi_url("iscsi://host.example/iqn.a:b/0").unwrap();
        assert_eq!((u.host.as_str(), u.port, u.lun), ("host.example", 3260, 0));
        assert_eq!(u.user, None);
        let u = parse_iscsi_url("iscsi://bob@h/iqn.a:b/1").unwrap();
        assert_eq!(u.user.as_deref(), Some("bob"));
        assert_eq!(u.chap(), None);
    }

    #[test]
    fn ipv6() {
        let u = parse_iscsi_url("iscsi://[::1]:3262/iqn.a:b/0").unwrap();
        assert_eq!(u.host, "::1");
        assert_eq!(u.socket_addr().unwrap(), "[::1]:3262".parse().unwrap());
        let u = parse_iscsi_url("iscsi://[fe80::1]/iqn.a:b/2").unwrap();
        assert_eq!(u.port, 3260);
        assert_eq!(
            parse_iscsi_url("iscsi://::1/iqn.a:b/0"),
            Err(UrlError::Host("IPv6 address must be in brackets"))
        );
        assert!(parse_iscsi_url("iscsi://[::1/iqn.a:b/0").is_err());
        assert!(parse_iscsi_url("iscsi://[zz]/iqn.a:b/0").is_err());
    }

    #[test]
    fn errors() {
        assert_eq!(parse_iscsi_url("nbd://h/iqn/0"), Err(UrlError::Scheme));
        assert_eq!(parse_iscsi_url("iscsi://h"), Err(UrlError::Target));
        assert_eq!(parse_iscsi_url("iscsi://h/iqn.a:b"), Err(UrlError::Lun));
        assert_eq!(parse_iscsi_url("iscsi://h/iqn.a:b/x"), Err(UrlError::Lun));
        assert_eq!(
            parse_iscsi_url("iscsi://h/iqn.a:b/99999"),
            Err(UrlError::Lun)
        );
        assert_eq!(parse_iscsi_url("iscsi://h//0"), Err(UrlError::Target));
        assert_eq!(
            parse_iscsi_url("iscsi://h:0/iqn.a:b/0"),
            Err(UrlError::Port)
        );
        assert_eq!(
            parse_iscsi_url("iscsi://h:99999/iqn.a:b/0"),
            Err(UrlError::Port)
        );
        assert_eq!(
            parse_iscsi_url("iscsi://:5/iqn.a:b/0"),
            Err(UrlError::Host("empty"))
        );
    }
}
