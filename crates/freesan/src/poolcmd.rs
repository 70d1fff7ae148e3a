//! `freesan pool ...`: pool management through a running node's management API
//! (create, status, scrub, add spare, replace member, fail member, rebuild rate).

use anyhow::{bail, Context, Result};
use serde_json::Value;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// Where the node's API listens (`[api] address` or `serve --api`) and the token
/// to show it (see `apicmd` for where it is found when not given).
#[derive(clap::Args, Debug, Clone)]
pub struct ApiArg {
    /// The node's management API address.
    #[arg(
        long,
        value_name = "ADDR:PORT",
        default_value = "127.0.0.1:8260",
        global = true
    )]
    pub api: SocketAddr,
    /// The API token (else --token-file, $FREESAN_API_TOKEN, the node's
    /// DATA_DIR/api/cli-token). Other users of the host see a command line
    /// (`ps`): it is overwritten there once read, but shows until then;
    /// prefer --token-file or the environment.
    #[arg(long, value_name = "TOKEN", global = true)]
    pub token: Option<String>,
    /// A file holding the API token (its first line), which no command line shows.
    #[arg(long = "token-file", value_name = "FILE", global = true)]
    pub token_file: Option<std::path::PathBuf>,
    /// The node's data directory, whose api/cli-token is sent (default: that of
    /// the node serving --api on this host, else ./freesan-data).
    #[arg(long = "data-dir", value_name = "DIR", global = true)]
    pub data_dir: Option<std::path::PathBuf>,
    /// Speak TLS and trust only this certificate (PEM; the node's
    /// DATA_DIR/api/serving-cert.pem). Default: the data directory's, when the
    /// node serves TLS.
    #[arg(long = "tls-cert", value_name = "PEM", global = true)]
    pub tls_cert: Option<std::path::PathBuf>,
}

/// `freesan pool` subcommands.
#[derive(clap::Subcommand, Debug, Clone)]
pub enum PoolCmd {
    /// Create a pool on free disks (`freesan disk list`); usable at once, made
    /// consistent in the background; kept across restarts.
    Create {
        /// Pool name.
        name: String,
        /// raid0, raid1, raid5, raid6, raid10, raid10-far or raidf1.
        #[arg(long)]
        level: String,
        /// Member disks, in order (comma-separated or repeated).
        #[arg(long = "member", value_delimiter = ',', required = true)]
        members: Vec<String>,
        /// Hot spares (comma-separated or repeated).
        #[arg(long = "spare", value_delimiter = ',')]
        spares: Vec<String>,
        /// Chunk size (default 128K).
        #[arg(long)]
        chunk: Option<String>,
        /// Cap on rebuild, resync and scrub in MB/s (0 = uncapped).
        #[arg(long)]
        rebuild_rate: Option<u32>,
    },
    /// Status of every pool, or of one: state, members, rebuild and scrub progress.
    Status {
        /// Pool name.
        name: Option<String>,
        /// Print the raw JSON.
        #[arg(long)]
        json: bool,
    },
    /// Start a scrub (check and repair parity and mirrors).
    Scrub {
        /// Pool name.
        name: String,
    },
    /// Add a configured `[[disk]]` as a hot spare.
    AddSpare {
        /// Pool name.
        name: String,
        /// Disk name.
        disk: String,
    },
    /// Replace the member at POSITION with a configured `[[disk]]`; the rebuild starts.
    Replace {
        /// Pool name.
        name: String,
        /// Member position (see `pool status`).
        position: usize,
        /// Disk name.
        disk: String,
    },
    /// Mark the member at POSITION failed (e.g. before pulling it); refused when
    /// the pool has no redundancy left for it, unless --force.
    Fail {
        /// Pool name.
        name: String,
        /// Member position.
        position: usize,
        /// Fail it even if the pool then loses data.
        #[arg(long)]
        force: bool,
    },
    /// Cap rebuild, resync and scrub at MB_S MB/s (0 = uncapped); applies at once.
    RebuildRate {
        /// Pool name.
        name: String,
        /// The cap in MB/s; 0 removes it.
        mb_s: u32,
    },
}

/// Writes `request` and reads the answer until the node closes (at most 16 MiB).
fn exchange<S: Read + Write>(s: &mut S, request: &[u8]) -> std::io::Result<Vec<u8>> {
    s.write_all(request)?;
    s.flush()?;
    let mut raw = Vec::new();
    match s.take(16 << 20).read_to_end(&mut raw) {
        Ok(_) => Ok(raw),
        // a peer that closes without TLS close_notify after a whole answer
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof && !raw.is_empty() => Ok(raw),
        Err(e) => Err(e),
    }
}

/// One HTTP/1.1 request with `Connection: close` (over TLS when the node's
/// certificate is pinned, see `apicmd`); returns (status, JSON body).
pub(crate) fn http(
    api: SocketAddr,
    method: &str,
    path: &str,
    body: Option<&Value>,
) -> Result<(u16, Value)> {
    let mut s = TcpStream::connect_timeout(&api, Duration::from_secs(5)).with_context(|| {
        format!("connecting to the management API at {api} (is the node running with [api]?)")
    })?;
    s.set_read_timeout(Some(Duration::from_secs(60)))?;
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    let auth = crate::apicmd::token_to_send()
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: {api}\r\nConnection: close\r\n{auth}Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let tls = crate::apicmd::tls_to_use()?;
    if tls.is_none() && !auth.is_empty() && !api.ip().is_loopback() {
        // the node would refuse plain HTTP there anyway; the token must not
        // cross the network in clear on the way
        bail!(
            "the management API at {api} is not on this host and no certificate is pinned: \
             the token would cross the network in clear; give --tls-cert (the node's \
             DATA_DIR/api/serving-cert.pem) or --data-dir"
        );
    }
    if tls.is_none() && !auth.is_empty() {
        crate::apicmd::check_local_listener(&s)?;
    }
    let raw = match tls {
        None => exchange(&mut s, request.as_bytes())?,
        Some(cfg) => {
            let name = api::tls::rustls::pki_types::ServerName::IpAddress(api.ip().into());
            let conn = api::tls::rustls::ClientConnection::new(cfg, name)?;
            let mut tls = api::tls::rustls::StreamOwned::new(conn, s);
            exchange(&mut tls, request.as_bytes()).with_context(|| {
                format!("TLS with the management API at {api} (the certificate pinned is not the node's?)")
            })?
        }
    };
    let text = String::from_utf8_lossy(&raw);
    let (head, payload) = text.split_once("\r\n\r\n").context(
        "malformed HTTP answer (if the node's API speaks TLS, give --tls-cert or --data-dir)",
    )?;
    let code: u16 = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .context("malformed HTTP status line")?;
    let value = if payload.trim().is_empty() {
        Value::Null
    } else {
        serde_json::from_str(payload).unwrap_or(Value::String(payload.to_string()))
    };
    Ok((code, value))
}

pub(crate) fn ok_or_error(code: u16, v: Value) -> Result<Value> {
    if (200..300).contains(&code) {
        return Ok(v);
    }
    if code == 401 {
        crate::apicmd::unauthorized_hint()?;
    }
    let msg = v
        .get("error")
        .and_then(Value::as_str)
        .map(str::to_string)
        .unwrap_or_else(|| v.to_string());
    bail!("the node refused: {msg} (HTTP {code})")
}

fn bytes(v: &Value) -> String {
    let b = v.as_u64().unwrap_or(0) as f64;
    if b >= (1u64 << 40) as f64 {
        format!("{:.1} TiB", b / (1u64 << 40) as f64)
    } else {
        format!("{:.1} GiB", b / (1u64 << 30) as f64)
    }
}

/// Prints one pool's status for people.
fn print_pool(p: &Value) {
    let s = |k: &str| {
        p.get(k)
            .map(|v| {
                v.as_str()
                    .map(str::to_string)
                    .unwrap_or_else(|| v.to_string())
            })
            .unwrap_or_default()
    };
    println!(
        "pool {}  {}  {}  chunk {}  state {}",
        s("name"),
        s("level"),
        s("uuid"),
        p.get("chunk_bytes")
            .and_then(Value::as_u64)
            .map(|c| format!("{}K", c / 1024))
            .unwrap_or_default(),
        s("state")
    );
    println!(
        "  capacity {}  usable {}  survives {} failed member(s)  rebuild rate {}",
        bytes(&p["capacity_bytes"]),
        bytes(&p["usable_bytes"]),
        s("redundancy"),
        match p.get("rebuild_rate_mb_s").and_then(Value::as_u64) {
            Some(0) => "uncapped".to_string(),
            Some(r) => format!("{r} MB/s"),
            None => "?".to_string(),
        }
    );
    if let Some(members) = p.get("members").and_then(Value::as_array) {
        for m in members {
            println!(
                "  [{}] {:<12} {:<40} errors {} reads {} writes {}",
                m["position"],
                m["state"].as_str().unwrap_or("?"),
                m["name"].as_str().unwrap_or("?"),
                m["errors"],
                m["reads"],
                m["writes"]
            );
        }
    }
    if let Some(spares) = p.get("spares").and_then(Value::as_array) {
        for sp in spares {
            println!(
                "  spare {}",
                sp.as_str()
                    .map(str::to_string)
                    .unwrap_or_else(|| sp.to_string())
            );
        }
    }
    for key in ["rebuild", "resync", "scrub"] {
        if let Some(v) = p.get(key).filter(|v| !v.is_null()) {
            println!("  {key}: {v}");
        }
    }
    if let Some(n) = p
        .get("lost_blocks")
        .and_then(Value::as_u64)
        .filter(|&n| n > 0)
    {
        let all = p
            .get("lost_ranges")
            .and_then(Value::as_array)
            .map_or(&[][..], |a| a.as_slice());
        let mut ranges: Vec<String> = all
            .iter()
            .take(8)
            .map(|r| {
                let (a, c) = (r[0].as_u64().unwrap_or(0), r[1].as_u64().unwrap_or(0));
                if c == 1 {
                    format!("{a}")
                } else {
                    format!("{a}-{}", a + c - 1)
                }
            })
            .collect();
        if all.len() > 8 {
            ranges.push(format!("... ({} ranges in all)", all.len()));
        }
        println!(
            "  LOST BLOCKS: {n} (unreadable during a rebuild with no redundancy left; reads fail \
             until written): {}",
            ranges.join(", ")
        );
    }
    if let Some(v) = p.get("rebuild_stalled").filter(|v| !v.is_null()) {
        println!(
            "  REBUILD STALLED at stripe {}: {} ({} attempts; retrying)",
            v.get("stripe").and_then(Value::as_u64).unwrap_or(0),
            v.get("error").and_then(Value::as_str).unwrap_or("?"),
            v.get("attempts").and_then(Value::as_u64).unwrap_or(0)
        );
    }
}

/// Runs a `freesan pool` subcommand against the API at `api`.
pub fn run(api: SocketAddr, cmd: PoolCmd) -> Result<()> {
    match cmd {
        PoolCmd::Create {
            name,
            level,
            members,
            spares,
            chunk,
            rebuild_rate,
        } => {
            let body = serde_json::json!({
                "name": name, "level": level, "members": members, "spares": spares,
                "chunk": chunk, "rebuild_rate_mb_s": rebuild_rate,
            });
            let (code, v) = http(api, "POST", "/api/v1/pools", Some(&body))?;
            print_pool(&ok_or_error(code, v)?);
        }
        PoolCmd::Status { name, json } => {
            let path = match &name {
                Some(n) => format!("/api/v1/pools/{n}"),
                None => "/api/v1/pools".into(),
            };
            let (code, v) = http(api, "GET", &path, None)?;
            let v = ok_or_error(code, v)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&v)?);
            } else if let Some(list) = v.as_array() {
                if list.is_empty() {
                    println!("no pools");
                }
                list.iter().for_each(print_pool);
            } else {
                print_pool(&v);
            }
        }
        PoolCmd::Scrub { name } => {
            let (code, v) = http(api, "POST", &format!("/api/v1/pools/{name}/scrub"), None)?;
            print_pool(&ok_or_error(code, v)?);
        }
        PoolCmd::AddSpare { name, disk } => {
            let body = serde_json::json!({ "disk": disk });
            let (code, v) = http(
                api,
                "POST",
                &format!("/api/v1/pools/{name}/spares"),
                Some(&body),
            )?;
            print_pool(&ok_or_error(code, v)?);
        }
        PoolCmd::Replace {
            name,
            position,
            disk,
        } => {
            let body = serde_json::json!({ "position": position, "disk": disk });
            let (code, v) = http(
                api,
                "POST",
                &format!("/api/v1/pools/{name}/replace"),
                Some(&body),
            )?;
            print_pool(&ok_or_error(code, v)?);
        }
        PoolCmd::Fail {
            name,
            position,
            force,
        } => {
            let body = serde_json::json!({ "position": position, "force": force });
            let (code, v) = http(
                api,
                "POST",
                &format!("/api/v1/pools/{name}/fail"),
                Some(&body),
            )?;
            print_pool(&ok_or_error(code, v)?);
        }
        PoolCmd::RebuildRate { name, mb_s } => {
            let body = serde_json::json!({ "mb_s": mb_s });
            let (code, v) = http(
                api,
                "POST",
                &format!("/api/v1/pools/{name}/rebuild-rate"),
                Some(&body),
            )?;
            print_pool(&ok_or_error(code, v)?);
        }
    }
    Ok(())
}
