//! Hiding a secret given on the command line from other users of the host.
//!
//! `/proc/PID/cmdline`, which `ps` shows to every user, is read from the
//! process's own argument memory (`arg_start..arg_end` in `/proc/self/stat`).
//! Overwriting the secret there, as the MySQL client does with a password,
//! leaves only the moment between the start and this call for anyone to see
//! it. The memory is read and written with `process_vm_readv`/`writev` on
//! this process, which answer a bad address with an error instead of a fault.

/// Overwrites with `x` the value of option `flag` (`--token`) wherever the
/// command line gives it as `secret` (`--token SECRET` or `--token=SECRET`)
/// in this process's argument memory, and says so on stderr when it could
/// not (a sandbox refusing `process_vm_writev`, no `/proc`): the user then
/// knows the secret stays visible. Returns how many copies were hidden.
pub(crate) fn hide_option(flag: &str, secret: &str) -> usize {
    let n = hide(flag, secret);
    if n == 0 && !secret.is_empty() {
        eprintln!(
            "freesan: warning: {flag} could not be hidden from the command line, which other users of this host see (ps); prefer --token-file or the environment"
        );
    }
    n
}

/// [`hide_option`] without the warning.
fn hide(flag: &str, secret: &str) -> usize {
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
    for at in values_of(&args, flag.as_bytes(), secret) {
        let mut x = vec![b'x'; secret.len()];
        if vm(start + at, &mut x, true) == Some(secret.len()) {
            hidden += 1;
        }
    }
    hidden
}

/// Where in `args` (NUL-separated arguments) option `flag` has the value
/// `secret`, as a separate argument or after `=`; nothing else that happens
/// to hold the same bytes (a port, a path) is touched.
fn values_of(args: &[u8], flag: &[u8], secret: &[u8]) -> Vec<usize> {
    let mut out = Vec::new();
    let mut at = 0;
    let mut previous: &[u8] = &[];
    for arg in args.split(|&b| b == 0) {
        if arg == secret && previous == flag {
            out.push(at);
        } else if arg.len() == flag.len() + 1 + secret.len()
            && arg.starts_with(flag)
            && arg[flag.len()] == b'='
            && arg.ends_with(secret)
        {
            out.push(at + flag.len() + 1);
        }
        previous = arg;
        at += arg.len() + 1;
    }
    out
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

    #[test]
    fn only_the_options_value_is_found() {
        let args = b"freesan\0pool\0--api\x00127.0.0.1:7000\0--token\x007000\0--token=7000\0--token\x0070001\0x\0";
        let at = values_of(args, b"--token", b"7000");
        assert_eq!(at.len(), 2, "{at:?}");
        for i in at {
            assert_eq!(&args[i..i + 4], b"7000");
            assert!(args[..i].ends_with(b"--token\0") || args[..i].ends_with(b"--token="));
        }
        assert!(values_of(args, b"--token", b"7001").is_empty());
    }
}
