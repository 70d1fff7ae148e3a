//! LUN identities: the NAA designator and serial number a LUN shows on every portal,
//! generated once and kept in the data directory so they survive restarts.

use anyhow::{bail, Context, Result};
use rand::RngCore;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// IEEE company id used in generated NAA type 6 designators. It has the
/// locally-administered bit set, so it can collide with no registered vendor.
const COMPANY_ID: u32 = 0x0a_f5_a0;

/// What is persisted per LUN.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct LunIdentity {
    /// NAA designator, 32 hex digits.
    pub naa: String,
    /// Unit serial number.
    pub serial: String,
    /// The data the identity was created for ([`Owner::key`]): only the LUN
    /// serving that data takes it.
    pub path: PathBuf,
}

/// Parses 32 hex digits into a 16-byte NAA designator of type 6.
pub fn parse_naa(s: &str) -> Result<[u8; 16]> {
    let s = s.trim_start_matches("0x");
    if s.len() != 32 || !s.chars().all(|c| c.is_ascii_hexdigit()) {
        bail!("NAA designator {s:?} must be 32 hex digits");
    }
    let mut out = [0u8; 16];
    for (i, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(&s[2 * i..2 * i + 2], 16)?;
    }
    if out[0] >> 4 != 6 {
        bail!("NAA designator {s:?} must be of type 6 (start with 6)");
    }
    Ok(out)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn generate(path: &Path) -> LunIdentity {
    let mut naa = [0u8; 16];
    rand::thread_rng().fill_bytes(&mut naa);
    from_bits(naa, path)
}

/// The identity of a replicated LUN: derived from `key` (cluster, target and LUN
/// number), so both nodes of a pair present the same NAA designator and serial
/// without sharing any file.
pub fn derived(key: &str) -> LunIdentity {
    use md5::Digest;
    let digest = md5::Md5::digest(format!("freesan replicated LUN {key}").as_bytes());
    let mut naa = [0u8; 16];
    naa.copy_from_slice(&digest);
    from_bits(naa, Path::new(key))
}

fn from_bits(mut naa: [u8; 16], path: &Path) -> LunIdentity {
    // NAA 6 | 24-bit company id | 100 bits vendor specific
    naa[0] = 0x60 | ((COMPANY_ID >> 20) & 0x0f) as u8;
    naa[1] = (COMPANY_ID >> 12) as u8;
    naa[2] = (COMPANY_ID >> 4) as u8;
    naa[3] = ((COMPANY_ID & 0x0f) << 4) as u8 | (naa[3] & 0x0f);
    let serial = format!("fs{}", &hex(&naa[8..16]));
    LunIdentity {
        naa: hex(&naa),
        serial,
        path: path.to_path_buf(),
    }
}

/// `name` as a file name: letters, digits, `.` and `-` kept, anything else `_`.
pub fn safe_name(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// The folder of a target's state inside the data directory.
pub fn target_dir(data_dir: &Path, iqn: &str) -> PathBuf {
    data_dir.join("targets").join(safe_name(iqn))
}

/// What a LUN's saved state (its identity, reservations, ALUA states and
/// atomic-write records, all kept under its number) belongs to.
#[derive(Debug, Clone, Copy)]
pub struct Owner<'a> {
    /// The data it serves, as saved in new identity files: the file's path,
    /// `pool NAME` or `disk NAME`; for a LUN through a cache, the cache's
    /// pool or disk (a cache attached, detached or taken out of the
    /// configuration leaves the data where it was).
    pub key: &'a str,
    /// How the LUN names it (`cache NAME` for a LUN through a cache): what
    /// identity files saved before 2026-12-06 hold, accepted too.
    pub shown: &'a str,
}

impl Owner<'_> {
    fn owns(&self, saved: &Path) -> bool {
        let text = saved.to_string_lossy();
        if text.is_empty() || text == self.key || text == self.shown {
            return true;
        }
        // the same file or device by another name (a symlink, /dev/disk/by-id,
        // a relative path)
        match (
            std::fs::canonicalize(saved),
            std::fs::canonicalize(self.key),
        ) {
            (Ok(a), Ok(b)) => a == b,
            _ => false,
        }
    }
}

/// The identities saved in `dir` other than LUN `lun`'s, with their numbers.
fn saved_identities(dir: &Path, lun: u64) -> Vec<(u64, LunIdentity)> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out: Vec<(u64, LunIdentity)> = entries
        .filter_map(|e| {
            let name = e.ok()?.file_name().into_string().ok()?;
            let n: u64 = name
                .strip_prefix("lun")?
                .strip_suffix(".identity.json")?
                .parse()
                .ok()?;
            let id = serde_json::from_slice(&std::fs::read(dir.join(&name)).ok()?).ok()?;
            (n != lun).then_some((n, id))
        })
        .collect();
    out.sort_by_key(|(n, _)| *n);
    out
}

/// The number of the other LUN of `dir` whose saved state `owner` owns.
fn saved_elsewhere(dir: &Path, lun: u64, owner: Owner) -> Option<u64> {
    saved_identities(dir, lun)
        .into_iter()
        .find(|(_, id)| !id.path.as_os_str().is_empty() && owner.owns(&id.path))
        .map(|(n, _)| n)
}

/// Without `id`, a LUN's number is its place in its target's list, so taking
/// a LUN out of the configuration file renumbers the ones after it.
const RENUMBERED: &str = "without `id`, a LUN's number is its place among its target's \
     [[target.lun]], so removing or reordering LUNs in the configuration renumbers the ones after";

/// Loads the identity of LUN `lun` of target `iqn`, creating and persisting it
/// (with `make`) on first use.
///
/// The LUN's state is kept under its number, and the number of a LUN without
/// `id` is its place in the list: a LUN removed from the configuration file
/// would hand its NAA, reservations and atomic-write records (applied at the
/// next start: another LU's data written over this one's) to the LUN after it.
/// So a saved identity is only taken by the LUN whose data it was made for
/// (`owner`), and a LUN whose data already has an identity under another
/// number does not get a new one; either is refused, naming the number to
/// give the LUN as its `id` or the files to move away.
pub fn load_or_create_for(
    data_dir: &Path,
    iqn: &str,
    lun: u64,
    owner: Owner,
    make: impl FnOnce() -> LunIdentity,
) -> Result<LunIdentity> {
    let dir = target_dir(data_dir, iqn);
    let file = dir.join(format!("lun{lun}.identity.json"));
    let files = |n: u64| format!("lun{n}.* in {}", dir.display());
    match std::fs::read(&file) {
        Ok(bytes) => {
            let id: LunIdentity = serde_json::from_slice(&bytes)
                .with_context(|| format!("reading LUN identity {}", file.display()))?;
            parse_naa(&id.naa).with_context(|| format!("in {}", file.display()))?;
            if !owner.owns(&id.path) {
                let what = match saved_elsewhere(&dir, lun, owner) {
                    Some(n) => format!(
                        "the state of {} is saved as LUN {n}: give this LUN `id = {n}`",
                        owner.key
                    ),
                    None => format!(
                        "if {} is gone for good, move {} away; if its data moved to {}, \
                         set \"path\" in {} to {:?}",
                        id.path.display(),
                        files(lun),
                        owner.key,
                        file.display(),
                        owner.key
                    ),
                };
                bail!(
                    "the saved state of LUN {lun} (NAA {}, reservations, atomic-write records) \
                     belongs to {}, not to {}; {RENUMBERED}. Nothing was changed: {what}",
                    id.naa,
                    id.path.display(),
                    owner.key
                );
            }
            if id.path.as_os_str() != owner.key {
                // saved under the old name (`cache NAME`): from now on under the data's
                let moved = LunIdentity {
                    path: PathBuf::from(owner.key),
                    ..id.clone()
                };
                if let Err(e) = write_atomic(&file, &serde_json::to_vec_pretty(&moved)?) {
                    tracing::warn!(error = %format!("{e:#}"), "LUN identity kept under its old backing name");
                }
            }
            Ok(id)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if let Some(n) = saved_elsewhere(&dir, lun, owner) {
                bail!(
                    "the state of {} (NAA, reservations, atomic-write records) is saved as \
                     LUN {n}, not {lun}; {RENUMBERED}. Nothing was changed: give this LUN \
                     `id = {n}`, or, if LUN {n} is gone for good, move {} away",
                    owner.key,
                    files(n)
                );
            }
            let mut id = make();
            id.path = PathBuf::from(owner.key);
            std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
            write_atomic(&file, &serde_json::to_vec_pretty(&id)?)?;
            tracing::info!(target_iqn = iqn, lun, naa = %id.naa, "created LUN identity");
            Ok(id)
        }
        Err(e) => Err(e).with_context(|| format!("reading LUN identity {}", file.display())),
    }
}

/// [`load_or_create_for`] with a new random identity.
pub fn load_or_create(data_dir: &Path, iqn: &str, lun: u64, owner: Owner) -> Result<LunIdentity> {
    load_or_create_for(data_dir, iqn, lun, owner, || generate(Path::new(owner.key)))
}

/// Writes `bytes` to `path` so that a crash leaves either the old or the new content:
/// write a temporary file, fsync it, rename it over, fsync the folder.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    block::durable::replace_file(path, bytes).with_context(|| format!("writing {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn on(key: &str) -> Owner<'_> {
        Owner { key, shown: key }
    }

    #[test]
    fn identity_is_stable_across_loads() {
        let dir = tempfile::tempdir().unwrap();
        let a = load_or_create(dir.path(), "iqn.2026-11.x:t", 0, on("/a")).unwrap();
        let b = load_or_create(dir.path(), "iqn.2026-11.x:t", 0, on("/a")).unwrap();
        let c = load_or_create(dir.path(), "iqn.2026-11.x:t", 1, on("/b")).unwrap();
        assert_eq!(a, b);
        assert_ne!(a.naa, c.naa);
        let naa = parse_naa(&a.naa).unwrap();
        assert_eq!(naa[0] >> 4, 6);
    }

    /// A saved identity is taken only by the data it was made for: a LUN
    /// renumbered by an edit of the configuration is refused (naming the number
    /// its data's state is under), as is a LUN whose data has an identity under
    /// another number; a LUN now through a cache keeps its identity, as does
    /// one saved under the cache's name before the check.
    #[test]
    fn a_saved_identity_is_only_taken_by_the_data_it_was_made_for() {
        let dir = tempfile::tempdir().unwrap();
        let t = "iqn.2026-11.x:t";
        let a = load_or_create(dir.path(), t, 0, on("/a")).unwrap();
        let b = load_or_create(dir.path(), t, 1, on("/b")).unwrap();
        // /a taken out of the list: /b becomes LUN 0
        let e = format!(
            "{:#}",
            load_or_create(dir.path(), t, 0, on("/b")).unwrap_err()
        );
        assert!(e.contains("belongs to /a") && e.contains("`id = 1`"), "{e}");
        // /b given a number of its own (no file there yet)
        let e = format!(
            "{:#}",
            load_or_create(dir.path(), t, 7, on("/b")).unwrap_err()
        );
        assert!(
            e.contains("saved as LUN 1") && e.contains("`id = 1`"),
            "{e}"
        );
        // a LUN on other data at 0: what to move or edit
        let e = format!(
            "{:#}",
            load_or_create(dir.path(), t, 0, on("/c")).unwrap_err()
        );
        assert!(
            e.contains("move lun0.*") && e.contains("set \"path\""),
            "{e}"
        );
        // nothing was changed by the refusals
        assert_eq!(load_or_create(dir.path(), t, 0, on("/a")).unwrap(), a);
        assert_eq!(load_or_create(dir.path(), t, 1, on("/b")).unwrap(), b);
        // a pool's LUN put behind a cache, and an identity saved under the
        // cache's name (as before the check): both kept, the second re-saved
        let p = load_or_create(dir.path(), t, 2, on("pool p")).unwrap();
        let cached = Owner {
            key: "pool p",
            shown: "cache c",
        };
        assert_eq!(load_or_create(dir.path(), t, 2, cached).unwrap(), p);
        let old = LunIdentity {
            path: "cache d".into(),
            ..generate(Path::new("x"))
        };
        let file = target_dir(dir.path(), t).join("lun3.identity.json");
        write_atomic(&file, &serde_json::to_vec(&old).unwrap()).unwrap();
        let through = Owner {
            key: "disk d",
            shown: "cache d",
        };
        assert_eq!(
            load_or_create(dir.path(), t, 3, through).unwrap().naa,
            old.naa
        );
        assert_eq!(
            load_or_create(dir.path(), t, 3, on("disk d")).unwrap().naa,
            old.naa
        );
        // the same file by another name
        let file = dir.path().join("e.img");
        std::fs::write(&file, b"").unwrap();
        let link = dir.path().join("e-link.img");
        std::os::unix::fs::symlink(&file, &link).unwrap();
        let e = load_or_create(dir.path(), t, 4, on(file.to_str().unwrap())).unwrap();
        assert_eq!(
            load_or_create(dir.path(), t, 4, on(link.to_str().unwrap())).unwrap(),
            e
        );
    }

    #[test]
    fn naa_parse_rejects_garbage() {
        assert!(parse_naa("6").is_err());
        assert!(parse_naa(&"z".repeat(32)).is_err());
        assert!(parse_naa(&"5".repeat(32)).is_err());
        assert!(parse_naa(&"6".repeat(32)).is_ok());
    }
}
