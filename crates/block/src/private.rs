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
    /// Root's, readable by this process's group, which is not its user's own
    /// (the group's id): other users are in it.
    SharedGroup(u32),
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
            PrivateError::SharedGroup(gid) => write!(
                f,
                "holds secrets and group {gid} may read it, which other users are in or have as \
                 their own: give the node's user a group of its own, or chmod 600 it"
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
    judge_for(meta.mode(), meta.uid(), meta.gid(), uid, gid, |g| {
        users_own_group(uid, g)
    })
}

/// The rule for a file of `mode`, `owner` and `group`, read by a process of
/// user `uid` and effective group `gid`; `own_group(g)` tells whether group
/// `g` is the user's own (asked only when it matters).
fn judge_for(
    mode: u32,
    owner: u32,
    group: u32,
    uid: u32,
    gid: u32,
    own_group: impl Fn(u32) -> bool,
) -> Result<(), PrivateError> {
    let mode = mode & 0o777;
    // root's file its reader's own group may read (not root's group, not a
    // group other users are in)
    let group_read = mode & 0o070 == 0o040 && owner == 0 && gid != 0 && group == gid;
    if mode & 0o007 != 0 || (mode & 0o070 != 0 && !group_read) {
        return Err(PrivateError::Exposed(mode));
    }
    if group_read && !own_group(group) {
        return Err(PrivateError::SharedGroup(group));
    }
    if owner != uid && owner != 0 {
        return Err(PrivateError::Foreign(owner));
    }
    Ok(())
}

/// User `uid`'s name and primary group, from the user database; None when
/// it has no entry or the lookup fails.
pub fn user_entry(uid: u32) -> Option<(std::ffi::CString, u32)> {
    let mut buf = vec![0u8; 16 << 10];
    // SAFETY: getpwuid_r fills `pw` with pointers into `buf`, which outlives
    // every use of them here; a null result means no entry.
    unsafe {
        let mut pw: libc::passwd = std::mem::zeroed();
        let mut out: *mut libc::passwd = std::ptr::null_mut();
        if libc::getpwuid_r(uid, &mut pw, buf.as_mut_ptr().cast(), buf.len(), &mut out) != 0
            || out.is_null()
        {
            return None;
        }
        Some((std::ffi::CStr::from_ptr(pw.pw_name).to_owned(), pw.pw_gid))
    }
}

/// True when `gid` is user `uid`'s own group: its primary group, of the same
/// name, naming no other member, and no other account of `/etc/passwd` has it
/// as its primary group (a user-private group, as `adduser --system --group`
/// and sysusers make them). A shared group (`users`) is not: every member
/// would read the secret. (Accounts of other name services, LDAP and the
/// like, are not listed there: one of them with this group as its primary
/// one is not seen.) Any lookup that fails answers false: refused.
fn users_own_group(uid: u32, gid: u32) -> bool {
    users_own_group_in(
        uid,
        gid,
        &std::fs::read_to_string("/etc/passwd").unwrap_or_default(),
    )
}

fn users_own_group_in(uid: u32, gid: u32, passwd: &str) -> bool {
    // another local account whose primary group this is
    let shared = passwd.lines().any(|l| {
        let f: Vec<&str> = l.split(':').collect();
        f.len() >= 4
            && f[3].parse::<u32>() == Ok(gid)
            && f[2].parse::<u32>().is_ok_and(|u| u != uid)
    });
    if shared {
        return false;
    }
    use std::ffi::CStr;
    let Some((user, primary)) = user_entry(uid) else {
        return false;
    };
    if primary != gid {
        return false;
    }
    let mut buf = vec![0u8; 64 << 10];
    // SAFETY: getgrgid_r fills `gr` with pointers into `buf`, which outlives
    // every use of them below; gr_mem is a null-terminated array
    // of C strings in `buf`.
    unsafe {
        let mut gr: libc::group = std::mem::zeroed();
        let mut out: *mut libc::group = std::ptr::null_mut();
        if libc::getgrgid_r(gid, &mut gr, buf.as_mut_ptr().cast(), buf.len(), &mut out) != 0
            || out.is_null()
            || CStr::from_ptr(gr.gr_name) != user.as_c_str()
        {
            return false;
        }
        let mut m = gr.gr_mem;
        while !m.is_null() && !(*m).is_null() {
            if CStr::from_ptr(*m) != user.as_c_str() {
                return false;
            }
            m = m.add(1);
        }
    }
    true
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
    /// root's file its own group may read, and nothing looser.
    #[test]
    fn roots_file_the_services_group_may_read_is_read() {
        let own = |g: u32| g == 105;
        let service = |mode, owner, group| judge_for(mode, owner, group, 105, 105, own);
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
        // its effective group, but one other users share (`users`)
        assert!(matches!(
            judge_for(0o640, 0, 100, 105, 100, own),
            Err(PrivateError::SharedGroup(100))
        ));
        // a node run as root gets no group exception: root's group is not a
        // service's own
        assert!(judge_for(0o640, 0, 0, 0, 0, |_| true).is_err());
        assert!(judge_for(0o600, 0, 0, 0, 0, |_| true).is_ok());
    }

    /// What this host's user and group databases say: root's group is root's
    /// own; `users` (100), when it exists, is nobody's own; a uid without an
    /// entry has none.
    #[test]
    fn a_users_own_group_is_its_private_primary_group() {
        assert!(users_own_group(0, 0), "root:root");
        assert!(!users_own_group(0, 100));
        assert!(!users_own_group(4_000_000_000, 0));
    }

    /// Another local account with the group as its primary one shares it.
    #[test]
    fn a_group_another_account_has_as_its_own_is_shared() {
        let passwd = "root:x:0:0:root:/root:/bin/bash\n\
                      svc:x:105:105::/var/lib/svc:/usr/sbin/nologin\n";
        // (the group database is this host's: root's group is root's own)
        assert!(users_own_group_in(0, 0, passwd));
        let sharing = format!("{passwd}other:x:1000:0::/home/other:/bin/sh\n");
        assert!(!users_own_group_in(0, 0, &sharing));
    }
}
