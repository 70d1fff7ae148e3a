//! What disks and LUNs created through the management API may use: paths only
//! under the folders (or exactly the devices) `[api] allowed_paths` lists
//! (default: the data directory), never a backing path or NAA designator that
//! something else already uses, and no memory disk larger than the memory the
//! node has available.
//!
//! What it does not do: limit the configuration file, whose author is trusted.

use crate::config::{Config, DiskConfig, LunConfig};
use api::ApiError;
use std::path::{Component, Path, PathBuf};

/// The folders and devices API-created objects may use (resolved, no symlinks).
#[derive(Debug, Clone)]
pub(crate) struct Allowed {
    roots: Vec<PathBuf>,
    /// The data directory (resolved): the node's own files in it are never a
    /// backing path.
    data_dir: Option<PathBuf>,
}

/// What the node keeps at the top of its data directory: its state, tokens,
/// audit trail and configuration. A LUN or disk there would let the block
/// protocols rewrite them.
const NODE_OWNED: &[&str] = &[
    "api",
    "audit.log",
    "audit.log.1",
    "events.jsonl",
    "alerts-delivered.json",
    "hook.key",
    "managed.toml",
    crate::fronts::FILE,
    "nbd",
    "targets",
    "replicas",
];

/// Whether `name`, at the top of the data directory, is the node's: one of
/// [`NODE_OWNED`], or one of them with the suffixes the node writes: the
/// node saves a file by writing `NAME.tmp` and renaming it over `NAME`, and
/// rotates `NAME.1` (a LUN created on `managed.toml.tmp` became
/// `managed.toml` at the next save, its contents the host's to read and
/// write; review of 2026-12-06). Other names that begin the same way
/// (`nbd.img`) are not the node's.
fn node_owned(name: &std::ffi::OsStr) -> bool {
    let name = name.as_encoded_bytes();
    NODE_OWNED.iter().any(|n| {
        name.strip_prefix(n.as_bytes()).is_some_and(|rest| {
            rest.is_empty()
                || rest == b".tmp"
                || rest
                    .strip_prefix(b".")
                    .is_some_and(|d| !d.is_empty() && d.iter().all(u8::is_ascii_digit))
        })
    })
}

/// `p` with symlinks resolved as far as it exists, the rest appended; None when
/// a `..` remains or nothing of it exists.
pub(crate) fn resolve(p: &Path) -> Option<PathBuf> {
    let abs = std::path::absolute(p).ok()?;
    let mut existing = abs.as_path();
    let mut rest: Vec<&std::ffi::OsStr> = Vec::new();
    loop {
        if let Ok(c) = existing.canonicalize() {
            let mut out = c;
            for part in rest.iter().rev() {
                out.push(part);
            }
            return Some(out);
        }
        let name = existing.file_name()?;
        if name == ".." {
            return None;
        }
        rest.push(name);
        existing = existing.parent()?;
    }
}

fn refused(msg: String) -> ApiError {
    ApiError::Conflict(msg)
}

impl Allowed {
    /// The rules of `cfg`: `[api] allowed_paths`, or the data directory.
    pub fn new(cfg: &Config) -> Allowed {
        let listed = cfg
            .api
            .as_ref()
            .map(|a| a.allowed_paths.clone())
            .unwrap_or_default();
        let listed = if listed.is_empty() {
            vec![cfg.data_dir.clone()]
        } else {
            listed
        };
        Allowed {
            roots: listed.iter().filter_map(|p| resolve(p)).collect(),
            data_dir: resolve(&cfg.data_dir),
        }
    }

    /// Refuses `p` unless it is an allowed device or lies under an allowed folder.
    pub fn check_path(&self, p: &Path) -> Result<PathBuf, ApiError> {
        if p.components().any(|c| c == Component::ParentDir) {
            return Err(refused(format!(
                "{}: paths with .. are not accepted",
                p.display()
            )));
        }
        let r = resolve(p).ok_or_else(|| refused(format!("{}: cannot resolve", p.display())))?;
        let owned = self
            .data_dir
            .as_ref()
            .and_then(|d| r.strip_prefix(d).ok())
            .and_then(|rest| rest.components().next())
            .is_some_and(|c| node_owned(c.as_os_str()));
        if owned {
            return Err(refused(format!(
                "{} is one of the node's own files (in its data directory)",
                p.display()
            )));
        }
        if self.roots.iter().any(|root| r.starts_with(root)) {
            return Ok(r);
        }
        Err(refused(format!(
            "{} is outside the paths the API may use ([api] allowed_paths: {})",
            p.display(),
            self.roots
                .iter()
                .map(|r| r.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        )))
    }
}

/// Every backing path `cfg` uses (disks and LUNs), resolved: a disk without a
/// path (a simulated one, or a file made by the API) keeps its data in
/// `DATA_DIR/disks/NAME.img`, which is as much in use as a configured path.
fn paths_in_use(cfg: &Config) -> Vec<PathBuf> {
    let disks = cfg
        .disks
        .iter()
        .filter(|d| !d.memory)
        .map(|d| match &d.path {
            Some(p) => p.clone(),
            None => crate::pools::default_disk_path(&cfg.data_dir, &d.name),
        });
    let luns = cfg
        .targets
        .iter()
        .flat_map(|t| t.luns.iter())
        .filter_map(|l| l.path.clone());
    disks
        .chain(luns)
        .chain(secret_files(cfg))
        .filter_map(|p| resolve(&p))
        .collect()
}

/// The key, certificate and secret files `cfg` names: never a backing path
/// (a LUN on the cluster key would hand it to whoever reads the LUN).
fn secret_files(cfg: &Config) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = Vec::new();
    v.extend(cfg.alerts.webhook_secret_file.clone());
    v.extend(cfg.cluster.as_ref().map(|c| c.key_file.clone()));
    if let Some(a) = &cfg.api {
        v.extend(a.cert.clone());
        v.extend(a.key.clone());
    }
    if let Some(n) = &cfg.nbd {
        v.extend(n.tls_cert.clone());
        v.extend(n.tls_key.clone());
        v.extend(n.tls_client_ca.clone());
        v.extend(n.tls_psk_file.clone());
    }
    v
}

/// Checks a disk about to be created through the API against `cfg` (the
/// running configuration, without the disk).
/// On success `d.resolved` is where its path leads (the open must reach it).
pub(crate) fn check_disk(
    allowed: &Allowed,
    cfg: &Config,
    d: &mut DiskConfig,
) -> Result<(), ApiError> {
    if cfg.disks.iter().any(|o| o.name == d.name) {
        return Ok(()); // the configuration check refuses it by name
    }
    if let Some(p) = &d.path {
        let r = allowed.check_path(p)?;
        d.resolved = Some(r.clone());
        if paths_in_use(cfg).contains(&r) {
            return Err(refused(format!("{} is already in use", p.display())));
        }
    }
    if !d.memory {
        // a file disk, or a simulated one keeping its data in the data directory
        let p = d
            .path
            .clone()
            .unwrap_or_else(|| crate::pools::default_disk_path(&cfg.data_dir, &d.name));
        if d.path.is_none()
            && paths_in_use(cfg)
                .iter()
                .any(|u| Some(u) == resolve(&p).as_ref())
        {
            return Err(refused(format!("{} is already in use", p.display())));
        }
        check_new_file_size(&p, d.size.as_deref(), false)?;
    }
    if d.memory {
        let size_bytes = d.size.as_deref().and_then(disk::parse_size).unwrap_or(0);
        if let Some(avail) = mem_available_bytes() {
            if size_bytes > avail / 2 {
                return Err(refused(format!(
                    "memory disk {} of {size_bytes} bytes: the node has {avail} bytes available (at most half may go to one disk)",
                    d.name
                )));
            }
        }
    }
    Ok(())
}

/// Refuses a file about to be created at `p` (when nothing is there yet) that
/// its filesystem could not hold: a thick file is written out now, so it must
/// fit in the free space; a sparse one may grow to its size later, which a
/// filesystem smaller than that can never hold.
fn check_new_file_size(p: &Path, size: Option<&str>, thick: bool) -> Result<(), ApiError> {
    if p.exists() {
        return Ok(());
    }
    let size_bytes = size.and_then(disk::parse_size).unwrap_or(0);
    let Some((free, total)) = fs_bytes(p) else {
        return Ok(());
    };
    if thick && size_bytes > free {
        return Err(refused(format!(
            "{}: a thick file of {size_bytes} bytes does not fit in the {free} bytes free there",
            p.display()
        )));
    }
    if !thick && size_bytes > total {
        return Err(refused(format!(
            "{}: a sparse file of {size_bytes} bytes could never be filled on a filesystem of {total} bytes",
            p.display()
        )));
    }
    Ok(())
}

/// Checks a LUN about to be created through the API against `cfg` (the
/// running configuration, without the LUN).
/// On success `l.resolved` is where its path leads (the open must reach it).
pub(crate) fn check_lun(
    allowed: &Allowed,
    cfg: &Config,
    l: &mut LunConfig,
) -> Result<(), ApiError> {
    if let Some(p) = &l.path {
        let r = allowed.check_path(p)?;
        l.resolved = Some(r.clone());
        if paths_in_use(cfg).contains(&r) {
            return Err(refused(format!("{} is already in use", p.display())));
        }
    }
    if let Some(p) = &l.path {
        check_new_file_size(p, l.size.as_deref(), l.thick)?;
    }
    if let Some(naa) = &l.naa {
        let configured = cfg
            .targets
            .iter()
            .flat_map(|t| t.luns.iter())
            .filter_map(|o| o.naa.clone());
        let taken = configured.chain(generated_naas(cfg)).any(|o| {
            o.trim_start_matches("0x")
                .eq_ignore_ascii_case(naa.trim_start_matches("0x"))
        });
        if taken {
            return Err(refused(format!("NAA {naa} is already in use")));
        }
    }
    Ok(())
}

/// Checks growing LUN `id` of target `iqn` from `from` to `to` bytes against the
/// bounds its creation had: a file LUN no larger than its filesystem could ever
/// hold, a LUN on a memory disk growing by at most half the memory available.
pub(crate) fn check_growth(
    cfg: &Config,
    iqn: &str,
    id: u64,
    from: u64,
    to: u64,
) -> Result<(), ApiError> {
    let Some(t) = cfg.targets.iter().find(|t| t.iqn == iqn) else {
        return Ok(());
    };
    let lun = t.lun(id);
    let Some(l) = lun else { return Ok(()) };
    if let Some(p) = &l.path {
        if let Some((_, total)) = fs_bytes(p) {
            if to > total {
                return Err(refused(format!(
                    "{}: {to} bytes could never be held by its filesystem of {total} bytes",
                    p.display()
                )));
            }
        }
    }
    let on_memory = l
        .disk
        .as_deref()
        .and_then(|d| cfg.disks.iter().find(|x| x.name == d))
        .is_some_and(|d| d.memory);
    if on_memory {
        if let Some(avail) = mem_available_bytes() {
            if to.saturating_sub(from) > avail / 2 {
                return Err(refused(format!(
                    "growing by {} bytes: the node has {avail} bytes available (at most half may go to one disk)",
                    to - from
                )));
            }
        }
    }
    Ok(())
}

/// The NAAs the node generated for its LUNs that name none in the config (kept
/// in the data directory, see [`crate::identity`]).
fn generated_naas(cfg: &Config) -> Vec<String> {
    let mut out = Vec::new();
    for t in &cfg.targets {
        let dir = crate::identity::target_dir(&cfg.data_dir, &t.iqn);
        for (i, l) in t.luns.iter().enumerate() {
            let file = dir.join(format!("lun{}.identity.json", l.id.unwrap_or(i as u64)));
            let Ok(bytes) = std::fs::read(&file) else {
                continue;
            };
            if let Ok(id) = serde_json::from_slice::<crate::identity::LunIdentity>(&bytes) {
                out.push(id.naa);
            }
        }
    }
    out
}

/// Bytes free (for unprivileged users) and in all on the filesystem that would hold `p`.
fn fs_bytes(p: &Path) -> Option<(u64, u64)> {
    use std::os::unix::ffi::OsStrExt;
    let mut dir = std::path::absolute(p).ok()?;
    while !dir.exists() {
        dir = dir.parent()?.to_path_buf();
    }
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    // SAFETY: statvfs writes into the zeroed struct we own; c is a valid C string.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return None;
    }
    let unit = st.f_frsize as u64;
    Some((st.f_bavail as u64 * unit, st.f_blocks as u64 * unit))
}

/// `MemAvailable` of /proc/meminfo.
fn mem_available_bytes() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_outside_the_allowed_folders_and_dotdot_are_refused() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(d.path().join("data/sub")).unwrap();
        let a = Allowed {
            roots: vec![resolve(&d.path().join("data")).unwrap()],
            data_dir: resolve(&d.path().join("data")),
        };
        assert!(a.check_path(&d.path().join("data/x.img")).is_ok());
        assert!(a.check_path(&d.path().join("data/sub/new/y.img")).is_ok());
        assert!(a.check_path(&d.path().join("data/../x.img")).is_err());
        assert!(a.check_path(Path::new("/dev/sda")).is_err());
        assert!(a.check_path(Path::new("/etc/shadow")).is_err());
        // a symlink inside pointing outside is followed and refused
        std::os::unix::fs::symlink("/etc", d.path().join("data/link")).unwrap();
        assert!(a.check_path(&d.path().join("data/link/shadow")).is_err());
        // the node's own files in its data directory are never backing paths
        for own in [
            "audit.log",
            "managed.toml",
            "managed.toml.tmp",
            "cache-fronts.toml.tmp",
            "events.jsonl.tmp",
            "audit.log.2",
            "cache-fronts.toml",
            "api/tokens.json",
            "targets/t/lun0.pr.json",
        ] {
            assert!(
                a.check_path(&d.path().join("data").join(own)).is_err(),
                "{own}"
            );
        }
        assert!(a.check_path(&d.path().join("data/disks/d0.img")).is_ok());
        // names that only begin like the node's are not its
        for other in [
            "apiary.img",
            "managed.tomlx",
            "nbd.img",
            "targets.old",
            "audit.log.x",
        ] {
            assert!(
                a.check_path(&d.path().join("data").join(other)).is_ok(),
                "{other}"
            );
        }
    }

    /// The key and secret files the configuration names are in use: a LUN on
    /// the cluster key (kept in the data directory) would hand it to any host.
    #[test]
    fn a_lun_on_a_configured_key_file_is_refused() {
        let d = tempfile::tempdir().unwrap();
        let mut cfg = Config::from_quick_flags(&crate::config::QuickFlags::default());
        cfg.data_dir = d.path().to_path_buf();
        let key = d.path().join("cluster.key");
        std::fs::write(&key, "k").unwrap();
        cfg.cluster = Some(
            toml::from_str(&format!(
                "name = \"c\"\nnode_id = 1\nsync = [\"127.0.0.1:3261\"]\n\
                 peer_sync = [\"127.0.0.2:3261\"]\nkey_file = {:?}\n",
                key.display().to_string()
            ))
            .unwrap(),
        );
        let allowed = Allowed::new(&cfg);
        let mut l = LunConfig::file(key.clone(), Some("1M".into()));
        let e = check_lun(&allowed, &cfg, &mut l).unwrap_err();
        assert!(format!("{e:?}").contains("in use"), "{e:?}");
        let mut l = LunConfig::file(d.path().join("other.img"), Some("1M".into()));
        check_lun(&allowed, &cfg, &mut l).unwrap();
    }
}
