//! CPU time of this process (user + system), from getrusage(2).

use std::time::Duration;

/// User plus system CPU time consumed by this process so far.
pub(crate) fn process_cpu_time() -> Duration {
    // SAFETY: getrusage only writes into the struct we hand it.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    let rc = unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    if rc != 0 {
        return Duration::ZERO;
    }
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, (t.tv_usec as u32) * 1000);
    tv(ru.ru_utime) + tv(ru.ru_stime)
}
