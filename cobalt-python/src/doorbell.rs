//! The descriptor an event loop watches for its inbox (`loop.add_reader`): readable
//! from `ring` until `clear`. On Linux an eventfd (a counter in the kernel: ringing
//! and clearing it is a system call each and nothing more, about a third of the cost
//! of a byte through a socket), elsewhere a socket pair with a byte in it.

use std::io;
use std::os::fd::{AsRawFd, RawFd};

/// A doorbell: Cobalt's threads ring it, the event loop's thread clears it.
pub struct Doorbell {
    #[cfg(target_os = "linux")]
    counter: std::os::fd::OwnedFd,
    #[cfg(not(target_os = "linux"))]
    reader: std::os::unix::net::UnixStream,
    #[cfg(not(target_os = "linux"))]
    writer: std::os::unix::net::UnixStream,
}

#[cfg(target_os = "linux")]
impl Doorbell {
    /// A doorbell that is not ringing.
    pub fn new() -> io::Result<Doorbell> {
        use std::os::fd::FromRawFd;
        // SAFETY: eventfd takes no pointers; the descriptor it returns is ours.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` is a fresh descriptor that nothing else owns.
        let counter = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) };
        Ok(Doorbell { counter })
    }

    /// Makes the descriptor readable.
    pub fn ring(&self) {
        let one: u64 = 1;
        // SAFETY: writes the 8 bytes of `one`, which outlives the call. It fails
        // only when the counter is full, and then the descriptor is readable anyway.
        unsafe { libc::write(self.counter.as_raw_fd(), (&one as *const u64).cast(), 8) };
    }

    /// Makes the descriptor not readable (until the next `ring`).
    pub fn clear(&self) {
        let mut count: u64 = 0;
        // SAFETY: reads at most 8 bytes into `count`, which outlives the call. When
        // it was not rung the read fails (EAGAIN), and there is nothing to clear.
        unsafe { libc::read(self.counter.as_raw_fd(), (&mut count as *mut u64).cast(), 8) };
    }
}

#[cfg(not(target_os = "linux"))]
impl Doorbell {
    /// A doorbell that is not ringing.
    pub fn new() -> io::Result<Doorbell> {
        let (reader, writer) = std::os::unix::net::UnixStream::pair()?;
        reader.set_nonblocking(true)?;
        writer.set_nonblocking(true)?;
        Ok(Doorbell { reader, writer })
    }

    /// Makes the descriptor readable.
    pub fn ring(&self) {
        use std::io::Write;
        // A full socket buffer means unread rings: it is readable anyway.
        let _ = (&self.writer).write(&[1]);
    }

    /// Makes the descriptor not readable (until the next `ring`).
    pub fn clear(&self) {
        use std::io::Read;
        let mut sink = [0u8; 256];
        loop {
            match (&self.reader).read(&mut sink) {
                Ok(n) if n == sink.len() => continue,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                _ => break,
            }
        }
    }
}

impl Doorbell {
    /// The descriptor to watch.
    pub fn fd(&self) -> RawFd {
        #[cfg(target_os = "linux")]
        return self.counter.as_raw_fd();
        #[cfg(not(target_os = "linux"))]
        return self.reader.as_raw_fd();
    }
}
