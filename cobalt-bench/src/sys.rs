//! Thin wrappers over the libc calls the benchmark needs: the monotonic clock, this
//! process's CPU time, the file-descriptor limit and the Ctrl-C flag.

use std::sync::atomic::{AtomicBool, Ordering};

/// Set by the SIGINT handler; every loop polls it.
static INTERRUPTED: AtomicBool = AtomicBool::new(false);

/// Nanoseconds on the monotonic clock (comparable across threads).
#[inline]
pub fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_MONOTONIC always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// CPU seconds (user and system, all threads) this process has used so far.
pub fn own_cpu_seconds() -> f64 {
    // SAFETY: all-zero is a valid rusage, which getrusage fills in.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `ru` is a valid, writable rusage.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) } != 0 {
        return 0.0;
    }
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    secs(ru.ru_utime) + secs(ru.ru_stime)
}

extern "C" fn on_sigint(_: libc::c_int) {
    INTERRUPTED.store(true, Ordering::Relaxed);
}

/// Installs a SIGINT handler that sets the interrupted flag instead of killing the process.
pub fn install_sigint_handler() {
    // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_sigint as *const () as libc::sighandler_t;
        libc::sigemptyset(&mut sa.sa_mask);
        sa.sa_flags = 0;
        libc::sigaction(libc::SIGINT, &sa, std::ptr::null_mut());
    }
}

/// True once Ctrl-C was pressed.
#[inline]
pub fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::Relaxed)
}

/// Raises the soft RLIMIT_NOFILE to the hard limit; returns the resulting soft limit.
pub fn raise_fd_limit() -> u64 {
    // SAFETY: plain getrlimit/setrlimit on a stack struct.
    unsafe {
        let mut rl = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl) != 0 {
            return 1024;
        }
        if rl.rlim_cur < rl.rlim_max {
            let want = libc::rlimit {
                rlim_cur: rl.rlim_max,
                rlim_max: rl.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &want) == 0 {
                rl.rlim_cur = rl.rlim_max;
            }
        }
        #[allow(clippy::unnecessary_cast)] // rlim_t is not u64 on every target
        let cur = rl.rlim_cur as u64;
        cur
    }
}

/// Number of file descriptors this process has open now.
pub fn open_fds() -> u64 {
    std::fs::read_dir("/proc/self/fd")
        .map(|d| d.count() as u64)
        .unwrap_or(16)
}

/// The last OS error number.
#[inline]
pub fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}
