//! Hiding a secret given on the command line from other users of the host.
//!
//! `/proc/PID/cmdline`, which `ps` shows to every user, is read from the
//! process's own argument memory (`arg_start..arg_end` in `/proc/self/stat`).
//! Overwriting the secret there, as the MySQL client does with a password,
//! leaves only the moment between the start and this call for anyone to see
//! it. The memory is read and written with `process_vm_readv`/`writev` on
//! this process, which answer a bad address with an error instead of a fault.

/// Overwrites every copy of `secret` in this process's argument memory with
/// `x`; returns how many were hidden (0 also when that memory cannot be
/// found).
pub(crate) fn hide(secret: &str) -> usize {
    let secret = secret.as_bytes();
    if secret.is_empty() {
        return 0;
    }
    let Some((start, end)) = std::fs::read_to_string("/proc/self/stat")
        .ok()
        .as_deref()
        .and_then(arg_range)
    else {
        return 0;
    };
    // (arguments are at most a few hundred KiB: ARG_MAX bounds them)
    let len = end.saturating_sub(start).min(4 << 20);
    let mut args = vec![0u8; len];
    if vm(start, &mut args, false) != Some(len) {
        return 0;
    }
    let mut hidden = 0;
    let mut at = 0;
    while let Some(i) = find(&args[at..], secret) {
        let mut x = vec![b'x'; secret.len()];
        if vm(start + at + i, &mut x, true) == Some(secret.len()) {
            hidden += 1;
        }
        at += i + secret.len();
    }
    hidden
}

/// `arg_start` and `arg_end`, fields 48 and 49 of `/proc/self/stat` (after
/// the command name in parentheses, which may hold spaces).
fn arg_range(stat: &str) -> Option<(usize, usize)> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // rest starts at field 3
    let start = fields.get(48 - 3)?.parse().ok()?;
    let end = fields.get(49 - 3)?.parse().ok()?;
    (start > 0 && end > start).then_some((start, end))
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// Reads (or writes) `buf.len()` bytes at `addr` of this process's memory.
fn vm(addr: usize, buf: &mut [u8], write: bool) -> Option<usize> {
    let local = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    let remote = libc::iovec {
        iov_base: addr as *mut libc::c_void,
        iov_len: buf.len(),
    };
    // SAFETY: the local iovec is `buf`, valid for its length; the kernel
    // checks the remote range and answers EFAULT rather than faulting.
    let n = unsafe {
        let pid = libc::getpid();
        if write {
            libc::process_vm_writev(pid, &local, 1, &remote, 1, 0)
        } else {
            libc::process_vm_readv(pid, &local, 1, &remote, 1, 0)
        }
    };
    usize::try_from(n).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_argument_range_is_read_past_a_name_with_spaces() {
        let mut fields: Vec<String> = (3..=52).map(|n| n.to_string()).collect();
        fields[48 - 3] = "140000".into();
        fields[49 - 3] = "140100".into();
        let stat = format!("12 (a (b) c) {}", fields.join(" "));
        assert_eq!(arg_range(&stat), Some((140000, 140100)));
        assert_eq!(arg_range("12 (x) S 1"), None);
        assert_eq!(arg_range("garbage"), None);
    }

    /// This test binary's own arguments: a copy of one of them, hidden,
    /// no longer shows in /proc/self/cmdline (the others do).
    #[test]
    fn a_secret_in_the_arguments_no_longer_shows() {
        let cmdline = std::fs::read("/proc/self/cmdline").unwrap();
        // the program's path, as the first argument: unique enough here
        let first = String::from_utf8_lossy(cmdline.split(|&b| b == 0).next().unwrap()).to_string();
        let name = first.rsplit('/').next().unwrap().to_string();
        assert!(hide(&name) >= 1, "{first}");
        let after = std::fs::read("/proc/self/cmdline").unwrap();
        assert!(find(&after, name.as_bytes()).is_none());
        assert_eq!(after.len(), cmdline.len());
        assert_eq!(hide(""), 0);
    }
}
