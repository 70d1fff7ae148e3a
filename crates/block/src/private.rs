//! Files holding secrets (keys, CHAP secrets, passwords): one rule for every
//! crate that reads one. Only their owner may read or write them (no mode bit
//! for group or others, `chmod 600`), and their owner is this process's user
//! or root: a secret another user can read is no secret, and one another user
//! can write decides who is trusted.

use std::fmt;
use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// Why a file of secrets is refused.
#[derive(Debug)]
pub enum PrivateError {
    /// It cannot be opened, read or looked at.
    Io(std::io::Error),
    /// Users other than its owner may read or write it (its permission bits).
    Exposed(u32),
    /// Another user owns it (its uid).
    Foreign(u32),
}

impl fmt::Display for PrivateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PrivateError::Io(e) => write!(f, "{e}"),
            PrivateError::Exposed(mode) => write!(
                f,
                "holds secrets and other users may read it (mode {mode:o}): chmod 600 it"
            ),
            PrivateError::Foreign(uid) => write!(
                f,
                "holds secrets and belongs to another user (uid {uid}): chown it to the user freesan runs as"
            ),
        }
    }
}

impl std::error::Error for PrivateError {}

fn judge(meta: &std::fs::Metadata) -> Result<(), PrivateError> {
    let mode = meta.mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(PrivateError::Exposed(mode));
    }
    // SAFETY: geteuid has no preconditions and cannot fail
    let me = unsafe { libc::geteuid() };
    if meta.uid() != me && meta.uid() != 0 {
        return Err(PrivateError::Foreign(meta.uid()));
    }
    Ok(())
}

/// Checks the file at `path` (a file read elsewhere, by a library).
pub fn check(path: &Path) -> Result<(), PrivateError> {
    judge(&std::fs::metadata(path).map_err(PrivateError::Io)?)
}

/// Reads the file at `path` after checking it: the descriptor read is the
/// one checked, so a file swapped between the two is not read.
pub fn read(path: &Path) -> Result<Vec<u8>, PrivateError> {
    let mut f = std::fs::File::open(path).map_err(PrivateError::Io)?;
    judge(&f.metadata().map_err(PrivateError::Io)?)?;
    let mut out = Vec::new();
    f.read_to_end(&mut out).map_err(PrivateError::Io)?;
    Ok(out)
}

/// [`read`] as text.
pub fn read_to_string(path: &Path) -> Result<String, PrivateError> {
    String::from_utf8(read(path)?)
        .map_err(|e| PrivateError::Io(std::io::Error::new(std::io::ErrorKind::InvalidData, e)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn only_a_file_its_owner_alone_may_read_is_read() {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("k");
        std::fs::write(&f, b"secret").unwrap();
        for mode in [0o644, 0o640, 0o604, 0o620, 0o602] {
            std::fs::set_permissions(&f, std::fs::Permissions::from_mode(mode)).unwrap();
            assert!(
                matches!(read(&f), Err(PrivateError::Exposed(m)) if m == mode),
                "{mode:o}"
            );
            assert!(check(&f).is_err());
        }
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(read(&f).unwrap(), b"secret");
        assert_eq!(read_to_string(&f).unwrap(), "secret");
        check(&f).unwrap();
        assert!(matches!(
            read(&d.path().join("none")),
            Err(PrivateError::Io(_))
        ));
        // another user's file, when this process may give it away (root)
        // SAFETY: no preconditions
        if unsafe { libc::geteuid() } == 0 {
            std::os::unix::fs::chown(&f, Some(65534), None).unwrap();
            assert!(matches!(read(&f), Err(PrivateError::Foreign(65534))));
            assert!(check(&f).is_err());
        }
    }
}
