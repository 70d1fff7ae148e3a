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

/// Refuses a data directory that exists and belongs to another user than the
/// node's: whoever owns it could plant objects (`managed.toml` naming any
/// device), tokens and state in it for the node to act on.
pub fn check_data_dir(data_dir: &Path) -> Result<()> {
    use std::os::unix::fs::MetadataExt;
    let Ok(m) = std::fs::metadata(data_dir) else {
        return Ok(()); // made by the node, 0700
    };
    // SAFETY: geteuid has no preconditions.
    let uid = unsafe { libc::geteuid() };
    if !m.is_dir() {
        anyhow::bail!("the data directory {} is not a folder", data_dir.display());
    }
    if m.uid() != uid && uid == 0 {
        // root by hand on a service's folder (the package's freesan): giving
        // the folder to root would take it from the service
        anyhow::bail!(
            "the data directory {} belongs to uid {}, not to root: run this as that user \
             (`runuser -u USER -- freesan ...`; for the package's service, `systemctl start \
             freesan`), or use another data directory",
            data_dir.display(),
            m.uid()
        );
    }
    if m.uid() != uid {
        anyhow::bail!(
            "the data directory {} belongs to uid {}, not to the node's user (uid {uid}): \
             its owner could plant objects and tokens in it; chown it or use another",
            data_dir.display(),
            m.uid()
        );
    }
    Ok(())
}

/// `value` as TOML with every secret replaced by [`MASK`].
pub fn masked_toml<T: serde::Serialize>(value: &T) -> Result<String> {
    let mut v = toml::Value::try_from(value)?;
    mask(&mut v);
    Ok(toml::to_string_pretty(&v)?)
}

/// Refuses a file holding secrets (`what` names it) that users other than
/// its owner may read or write (mode bits for group or others), or that
/// another user owns, as the NBD PSK file and the cluster key are refused
/// (one rule: `block::private`).
pub fn check_private(path: &std::path::Path, what: &str) -> anyhow::Result<()> {
    block::private::check(path).map_err(|e| anyhow::anyhow!("{what} {}: {e}", path.display()))
}

/// A URL as logs and `config show` print it: scheme and host only. Webhook
/// URLs often carry their credential in the path (Slack-style) or as a user.
pub fn url_shown(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return MASK.into();
    };
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    let host = authority.rsplit('@').next().unwrap_or("");
    let tail = if rest.len() > authority.len() {
        "/..."
    } else {
        ""
    };
    format!("{scheme}://{host}{tail}")
}

fn mask(v: &mut toml::Value) {
    match v {
        toml::Value::Table(t) => {
            for (k, x) in t.iter_mut() {
                let key = k.to_ascii_lowercase();
                if key == "webhook" {
                    let urls = match x {
                        toml::Value::Array(a) => a.iter_mut().collect::<Vec<_>>(),
                        one => vec![one],
                    };
                    for u in urls {
                        if let Some(s) = u.as_str() {
                            *u = toml::Value::String(url_shown(s));
                        }
                    }
                    continue;
                }
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

    #[test]
    fn webhook_urls_are_shown_without_path_or_user() {
        let v: toml::Value = toml::from_str(
            r#"
            [alerts]
            webhook = ["https://hooks.example.com/services/T/B/SECRETPATH", "http://user:pw@10.0.0.1:8080/x?key=SECRETQ"]
            "#,
        )
        .unwrap();
        let out = masked_toml(&v).unwrap();
        for s in ["SECRETPATH", "SECRETQ", "user", "pw@"] {
            assert!(!out.contains(s), "{s} shown: {out}");
        }
        assert!(out.contains("https://hooks.example.com/..."), "{out}");
        assert!(out.contains("http://10.0.0.1:8080/..."), "{out}");
        assert_eq!(url_shown("https://h.example"), "https://h.example");
        assert_eq!(url_shown("not a url"), MASK);
    }
}
