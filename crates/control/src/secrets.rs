//! Keeping secrets secret on the node itself: files the node creates are
//! private to its user, and nothing it prints shows a secret.

use anyhow::{Context, Result};
use std::path::Path;

/// Keys whose values are secrets wherever they appear in the configuration.
const SECRET_KEYS: &[&str] = &["secret", "password", "token", "psk", "private_key"];

/// What a masked secret prints as.
pub const MASK: &str = "********";

/// From now on the process creates files 0600 and folders 0700 (images, LUN
/// identities, reservations, replica state, audit and token files, logs of
/// its own), whatever the caller's umask; and the data directory, which holds
/// all of them, is made 0700 if it exists.
pub fn private_files(data_dir: &Path) -> Result<()> {
    // SAFETY: umask only changes the process's file-creation mask.
    unsafe {
        libc::umask(0o077);
    }
    if data_dir.is_dir() {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(data_dir, std::fs::Permissions::from_mode(0o700))
            .with_context(|| format!("making {} private (0700)", data_dir.display()))?;
    }
    Ok(())
}

/// `value` as TOML with every secret replaced by [`MASK`].
pub fn masked_toml<T: serde::Serialize>(value: &T) -> Result<String> {
    let mut v = toml::Value::try_from(value)?;
    mask(&mut v);
    Ok(toml::to_string_pretty(&v)?)
}

fn mask(v: &mut toml::Value) {
    match v {
        toml::Value::Table(t) => {
            for (k, x) in t.iter_mut() {
                let key = k.to_ascii_lowercase();
                if SECRET_KEYS
                    .iter()
                    .any(|s| key == *s || key.ends_with(&format!("_{s}")))
                {
                    if x.is_str() {
                        *x = toml::Value::String(MASK.into());
                    }
                } else {
                    mask(x);
                }
            }
        }
        toml::Value::Array(a) => a.iter_mut().for_each(mask),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_secret_is_masked_and_nothing_else() {
        let v: toml::Value = toml::from_str(
            r#"
            data_dir = "d"
            [[target]]
            iqn = "iqn.x"
            chap = { user = "alice", secret = "secret-of-alice" }
            mutual_chap = { user = "t", secret = "another-secret" }
            [[target.chap_initiator]]
            name = "iqn.i"
            user = "bob"
            secret = "bobs-own-secret"
            [api]
            admin_token = "tok"
            "#,
        )
        .unwrap();
        let out = masked_toml(&v).unwrap();
        for s in [
            "secret-of-alice",
            "another-secret",
            "bobs-own-secret",
            "tok\"",
        ] {
            assert!(!out.contains(s), "{s} shown: {out}");
        }
        for s in ["alice", "bob", "iqn.i", "iqn.x"] {
            assert!(out.contains(s), "{s} hidden: {out}");
        }
        assert_eq!(out.matches(MASK).count(), 4, "{out}");
    }
}
