//! Files holding secrets (keys, CHAP secrets, passwords): one rule for every
//! crate that reads one. Only their owner may read or write them (no mode bit
//! for group or others, `chmod 600`), and their owner is this process's user
//! or root: a secret another user can read is no secret, and one another user
//! can write decides who is trusted.
//!
//! One exception, for a node run as a user of its own (the package's
//! `freesan`): a file root owns may also be read by this process's group
//! (`root:freesan`, `chmod 640`), as Debian gives a service its keys. The
//! service can read it and not rewrite it; the group must be this process's
//! own (its effective group), not root's, and may not write or run it.

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
                "holds secrets and other users may read it (mode {mode:o}): chmod 600 it \
                 (a node run as a user of its own may also read a file of root's that \
                 only its own group reads: chmod 640, chgrp to that group)"
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
    // SAFETY: geteuid and getegid have no preconditions and cannot fail
    let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
    judge_for(meta.mode(), meta.uid(), meta.gid(), uid, gid)
}

/// The rule for a file of `mode`, `owner` and `group`, read by a process of
/// user `uid` and effective group `gid`.
fn judge_for(mode: u32, owner: u32, group: u32, uid: u32, gid: u32) -> Result<(), PrivateError> {
    let mode = mode & 0o777;
    // root's file its reader's own group may read (not root's group)
    let group_read = owner == 0 && gid != 0 && group == gid && mode & 0o070 == 0o040;
    if mode & 0o007 != 0 || (mode & 0o070 != 0 && !group_read) {
        return Err(PrivateError::Exposed(mode));
    }
    if owner != uid && owner != 0 {
        return Err(PrivateError::Foreign(owner));
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

    /// A service run as a user of its own (uid and group 105 here) may read
    /// root's file its group may read, and nothing looser.
    #[test]
    fn roots_file_the_services_group_may_read_is_read() {
        let service = |mode, owner, group| judge_for(mode, owner, group, 105, 105);
        service(0o640, 0, 105).expect("root:freesan 640");
        service(0o600, 105, 105).expect("its own 600");
        service(0o600, 0, 0).expect("root's 600");
        for (mode, owner, group) in [
            (0o660, 0, 105), // the group may write it
            (0o650, 0, 105), // or run it
            (0o644, 0, 105), // everybody reads it
            (0o641, 0, 105),
            (0o640, 0, 100),   // another group reads it
            (0o640, 105, 105), // its own, but the group reads it: 600 is the rule
            (0o640, 7, 105),   // another user's
        ] {
            assert!(
                service(mode, owner, group).is_err(),
                "{mode:o} {owner}:{group}"
            );
        }
        assert!(matches!(
            service(0o640, 7, 105),
            Err(PrivateError::Exposed(0o640))
        ));
        assert!(matches!(
            service(0o600, 7, 105),
            Err(PrivateError::Foreign(7))
        ));
        // a node run as root gets no group exception: root's group is not a
        // service's own
        assert!(judge_for(0o640, 0, 0, 0, 0).is_err());
        assert!(judge_for(0o600, 0, 0, 0, 0).is_ok());
    }
}
