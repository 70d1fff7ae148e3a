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
    /// The backing path the identity was created for (informational).
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

/// Loads the identity of LUN `lun` of target `iqn`, creating and persisting it on first use.
pub fn load_or_create(data_dir: &Path, iqn: &str, lun: u64, backing: &Path) -> Result<LunIdentity> {
    let dir = target_dir(data_dir, iqn);
    let file = dir.join(format!("lun{lun}.identity.json"));
    match std::fs::read(&file) {
        Ok(bytes) => {
            let id: LunIdentity = serde_json::from_slice(&bytes)
                .with_context(|| format!("reading LUN identity {}", file.display()))?;
            parse_naa(&id.naa).with_context(|| format!("in {}", file.display()))?;
            Ok(id)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let id = generate(backing);
            std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
            write_atomic(&file, &serde_json::to_vec_pretty(&id)?)?;
            tracing::info!(target_iqn = iqn, lun, naa = %id.naa, "created LUN identity");
            Ok(id)
        }
        Err(e) => Err(e).with_context(|| format!("reading LUN identity {}", file.display())),
    }
}

/// Writes `bytes` to `path` so that a crash leaves either the old or the new content:
/// write a temporary file, fsync it, rename it over, fsync the folder.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    block::durable::replace_file(path, bytes).with_context(|| format!("writing {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identity_is_stable_across_loads() {
        let dir = tempfile::tempdir().unwrap();
        let a = load_or_create(dir.path(), "iqn.2026-11.x:t", 0, Path::new("/a")).unwrap();
        let b = load_or_create(dir.path(), "iqn.2026-11.x:t", 0, Path::new("/a")).unwrap();
        let c = load_or_create(dir.path(), "iqn.2026-11.x:t", 1, Path::new("/b")).unwrap();
        assert_eq!(a, b);
        assert_ne!(a.naa, c.naa);
        let naa = parse_naa(&a.naa).unwrap();
        assert_eq!(naa[0] >> 4, 6);
    }

    #[test]
    fn naa_parse_rejects_garbage() {
        assert!(parse_naa("6").is_err());
        assert!(parse_naa(&"z".repeat(32)).is_err());
        assert!(parse_naa(&"5".repeat(32)).is_err());
        assert!(parse_naa(&"6".repeat(32)).is_ok());
    }
}
