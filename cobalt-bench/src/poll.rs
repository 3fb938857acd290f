//! The I/O pieces the engine's generators share: an owned epoll set, a wait with a
//! nanosecond timeout, and what a client's socket delivered.

use crate::sys::errno;

/// What one client's socket delivered.
pub(crate) enum Received<'a> {
    /// A datagram (cut at the receive buffer's size).
    Datagram(&'a [u8]),
    /// A socket error (an ICMP error, a send that failed).
    Error,
}

/// An epoll set, closed on drop.
pub(crate) struct Epoll(pub(crate) i32);

impl Epoll {
    /// A new, empty epoll set.
    pub(crate) fn new() -> Result<Epoll, String> {
        // SAFETY: epoll_create1 has no pointer arguments.
        let efd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if efd < 0 {
            return Err(format!(
                "epoll_create1 failed: {}",
                std::io::Error::last_os_error()
            ));
        }
        Ok(Epoll(efd))
    }

    /// Adds (`EPOLL_CTL_ADD`) or changes (`EPOLL_CTL_MOD`) `fd`'s interest: readable
    /// (and errors), and writable when `want_out`; events carry `token`. False when the
    /// kernel refused.
    pub(crate) fn set(&self, op: i32, fd: i32, want_out: bool, token: u64) -> bool {
        let mut ev = libc::epoll_event {
            events: (libc::EPOLLIN | libc::EPOLLERR | if want_out { libc::EPOLLOUT } else { 0 })
                as u32,
            u64: token,
        };
        // SAFETY: both descriptors are open; `ev` is a valid event.
        unsafe { libc::epoll_ctl(self.0, op, fd, &mut ev) == 0 }
    }
}

impl Drop for Epoll {
    fn drop(&mut self) {
        // SAFETY: we own this descriptor and close it once.
        unsafe { libc::close(self.0) };
    }
}

/// `epoll_wait` with a nanosecond timeout: `epoll_pwait2` where the kernel has it
/// (Linux 5.11+), millisecond `epoll_wait` otherwise.
pub(crate) struct Waiter {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    pwait2: bool,
}

impl Waiter {
    pub(crate) fn new() -> Waiter {
        Waiter {
            #[cfg(all(target_os = "linux", target_env = "gnu"))]
            pwait2: true,
        }
    }

    /// Waits up to `timeout_ns`; returns the number of ready events (0 on timeout or
    /// signal).
    pub(crate) fn wait(
        &mut self,
        epfd: i32,
        events: &mut [libc::epoll_event],
        timeout_ns: u64,
    ) -> usize {
        let max = events.len().min(i32::MAX as usize) as i32;
        #[cfg(all(target_os = "linux", target_env = "gnu"))]
        if self.pwait2 {
            let ts = libc::timespec {
                tv_sec: (timeout_ns / 1_000_000_000) as libc::time_t,
                tv_nsec: (timeout_ns % 1_000_000_000) as libc::c_long,
            };
            // SAFETY: `events` has `max` writable entries; `ts` outlives the call; a null
            // sigmask means "do not change it".
            let n = unsafe {
                libc::epoll_pwait2(epfd, events.as_mut_ptr(), max, &ts, std::ptr::null())
            };
            if n >= 0 {
                return n as usize;
            }
            if errno() != libc::ENOSYS {
                return 0;
            }
            self.pwait2 = false;
        }
        let ms = timeout_ns.div_ceil(1_000_000).min(i32::MAX as u64) as i32;
        // SAFETY: `events` has `max` writable entries.
        let n = unsafe { libc::epoll_wait(epfd, events.as_mut_ptr(), max, ms) };
        n.max(0) as usize
    }
}
