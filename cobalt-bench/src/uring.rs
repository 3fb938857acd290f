//! io_uring for the `coap://` generator: every client's socket has one receive standing
//! in the ring at all times, sends are queued as they come, and one `io_uring_enter` per
//! loop submits them all and waits (with a timeout) for completions. A thread then
//! makes one system call per loop instead of a `send` and a `recv` per request.
//!
//! Buffers: a 4 KiB receive slot per client (a longer datagram is cut there, the
//! header and token still classify it) and a send slot of the request's size per
//! client; both stay put while an operation may use them, and the drop waits until the
//! kernel has finished with every one of them.

use crate::poll::Received;
use crate::sys::now_ns;
use io_uring::{opcode, squeue, types, IoUring};
use std::os::fd::RawFd;

/// Bytes of a client's receive slot.
const RSLOT: usize = 4096;
/// Operation kinds in the low bit of `user_data` (the client's index above it).
const RECV: u64 = 0;
const SEND: u64 = 1;
/// Largest submission queue (two operations per client at most).
const MAX_ENTRIES: u32 = 4096;

/// The clients' sockets of one thread, driven through one ring.
pub(crate) struct UringUdp {
    ring: IoUring,
    fds: Vec<RawFd>,
    rbufs: Box<[u8]>,
    sbufs: Box<[u8]>,
    /// Bytes of each send slot (the request's size).
    slen: usize,
    /// A send of the client's slot is in the ring.
    sending: Vec<bool>,
    /// Operations submitted and not yet completed.
    in_flight: usize,
    /// Completions reaped and not yet handled: (`user_data`, result).
    cqes: Vec<(u64, i32)>,
}

impl UringUdp {
    /// A ring over `fds` (connected, non-blocking UDP sockets) sending requests of
    /// `request_len` bytes, with a receive standing on every socket. Fails where the
    /// kernel has no io_uring (or forbids it) or no timeout on waits (before 5.11).
    pub(crate) fn new(fds: Vec<RawFd>, request_len: usize) -> Result<UringUdp, String> {
        let n = fds.len();
        let entries = (2 * n as u32).next_power_of_two().clamp(8, MAX_ENTRIES);
        // Completions are handled when this thread asks for them (no interrupts of its
        // work), which needs the ring to be used by this thread only; older kernels
        // get a plain ring.
        let ring = IoUring::builder()
            .setup_single_issuer()
            .setup_defer_taskrun()
            .build(entries)
            .or_else(|_| IoUring::new(entries))
            .map_err(|e| format!("io_uring is not available here: {e}"))?;
        if !ring.params().is_feature_ext_arg() {
            return Err("io_uring cannot time out a wait on this kernel (before 5.11)".into());
        }
        let mut u = UringUdp {
            ring,
            rbufs: vec![0; n * RSLOT].into_boxed_slice(),
            sbufs: vec![0; n * request_len].into_boxed_slice(),
            slen: request_len,
            sending: vec![false; n],
            in_flight: 0,
            cqes: Vec::new(),
            fds,
        };
        for i in 0..n {
            u.arm_recv(i)?;
        }
        Ok(u)
    }

    /// Queues a receive into client `i`'s slot.
    fn arm_recv(&mut self, i: usize) -> Result<(), String> {
        let buf = self.rbufs[i * RSLOT..(i + 1) * RSLOT].as_mut_ptr();
        let e = opcode::Recv::new(types::Fd(self.fds[i]), buf, RSLOT as u32)
            .build()
            .user_data(((i as u64) << 1) | RECV);
        self.push(e)
    }

    /// Queues `e`, submitting what is queued when the submission queue is full.
    fn push(&mut self, e: squeue::Entry) -> Result<(), String> {
        loop {
            // SAFETY: every entry points into `rbufs` or `sbufs`, which stay allocated
            // and unmoved until the kernel completed it (see `Drop`).
            if unsafe { self.ring.submission().push(&e) }.is_ok() {
                self.in_flight += 1;
                return Ok(());
            }
            match self.ring.submit() {
                Ok(_) => {}
                // The completion queue is full: take its entries, handled at the next
                // wait, and try again.
                Err(err) if err.raw_os_error() == Some(libc::EBUSY) => self.reap(),
                Err(err) if err.raw_os_error() == Some(libc::EINTR) => {}
                Err(err) => return Err(format!("io_uring submission failed: {err}")),
            }
        }
    }

    /// Moves the completions the kernel posted into `cqes`.
    fn reap(&mut self) {
        let cqes = &mut self.cqes;
        cqes.extend(self.ring.completion().map(|c| (c.user_data(), c.result())));
    }

    /// Queues `bytes` (client `i`'s request) for sending; false if it cannot go out.
    /// A client whose previous send is still in the ring, or a request of another
    /// size, sends with a plain system call instead.
    pub(crate) fn send(&mut self, i: usize, bytes: &[u8]) -> bool {
        if self.sending[i] || bytes.len() != self.slen {
            // SAFETY: open socket, valid buffer of that length.
            return unsafe { libc::send(self.fds[i], bytes.as_ptr().cast(), bytes.len(), 0) } >= 0;
        }
        let slot = &mut self.sbufs[i * self.slen..(i + 1) * self.slen];
        slot.copy_from_slice(bytes);
        let e = opcode::Send::new(types::Fd(self.fds[i]), slot.as_ptr(), self.slen as u32)
            .build()
            .user_data(((i as u64) << 1) | SEND);
        let queued = self.push(e).is_ok();
        self.sending[i] = queued;
        queued
    }

    /// Submits what is queued, waits up to `wait_ns` for at least one completion, and
    /// hands every datagram and error to `on` (client, what, when); receives are
    /// queued again. An error of the ring itself ends the run.
    pub(crate) fn wait(
        &mut self,
        wait_ns: u64,
        mut on: impl FnMut(usize, Received<'_>, u64),
    ) -> Result<(), String> {
        if self.cqes.is_empty() {
            let ts = types::Timespec::new()
                .sec(wait_ns / 1_000_000_000)
                .nsec((wait_ns % 1_000_000_000) as u32);
            let args = types::SubmitArgs::new().timespec(&ts);
            match self.ring.submitter().submit_with_args(1, &args) {
                Ok(_) => {}
                Err(e)
                    if matches!(
                        e.raw_os_error(),
                        Some(libc::ETIME | libc::EINTR | libc::EBUSY | libc::EAGAIN)
                    ) => {}
                Err(e) => return Err(format!("io_uring wait failed: {e}")),
            }
        }
        self.reap();
        let t = now_ns();
        let mut cqes = std::mem::take(&mut self.cqes);
        for &(user_data, res) in &cqes {
            self.in_flight -= 1;
            let i = (user_data >> 1) as usize;
            if i >= self.fds.len() {
                continue;
            }
            if user_data & 1 == SEND {
                self.sending[i] = false;
                if res < 0 {
                    on(i, Received::Error, t);
                }
                continue;
            }
            if res >= 0 {
                let len = (res as usize).min(RSLOT);
                on(i, Received::Datagram(&self.rbufs[i * RSLOT..][..len]), t);
            } else {
                on(i, Received::Error, t);
                if !matches!(
                    -res,
                    libc::ECONNREFUSED
                        | libc::EHOSTUNREACH
                        | libc::ENETUNREACH
                        | libc::EINTR
                        | libc::EAGAIN
                        | libc::ENOBUFS
                        | libc::ENOMEM
                ) {
                    continue; // the socket itself is broken: no more receives on it
                }
            }
            self.arm_recv(i)?;
        }
        cqes.clear();
        if self.cqes.is_empty() {
            self.cqes = cqes;
        }
        Ok(())
    }
}

impl Drop for UringUdp {
    /// Ends the receives standing on the sockets (shutting down their reading side
    /// wakes them) and waits until the kernel completed every operation that points
    /// into the buffers; should that take over a second, the buffers are leaked
    /// rather than freed under the kernel.
    fn drop(&mut self) {
        for &fd in &self.fds {
            // SAFETY: plain shutdown of a socket this thread still has open.
            unsafe { libc::shutdown(fd, libc::SHUT_RD) };
        }
        let deadline = now_ns() + 1_000_000_000;
        while self.in_flight > 0 && now_ns() < deadline {
            let ts = types::Timespec::new().nsec(10_000_000);
            let args = types::SubmitArgs::new().timespec(&ts);
            let _ = self.ring.submitter().submit_with_args(1, &args);
            let done = self.ring.completion().count();
            self.in_flight = self.in_flight.saturating_sub(done);
        }
        if self.in_flight > 0 {
            std::mem::forget(std::mem::take(&mut self.rbufs));
            std::mem::forget(std::mem::take(&mut self.sbufs));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::UdpSocket;
    use std::os::fd::AsRawFd;

    #[test]
    fn sends_and_receives_through_the_ring() {
        let server = UdpSocket::bind("127.0.0.1:0").unwrap();
        let socks: Vec<UdpSocket> = (0..3)
            .map(|_| {
                let s = UdpSocket::bind("127.0.0.1:0").unwrap();
                s.connect(server.local_addr().unwrap()).unwrap();
                s.set_nonblocking(true).unwrap();
                s
            })
            .collect();
        let fds = socks.iter().map(|s| s.as_raw_fd()).collect();
        let mut u = match UringUdp::new(fds, 4) {
            Ok(u) => u,
            // No io_uring in this sandbox: the epoll path covers the generator.
            Err(e) => return eprintln!("skipped: {e}"),
        };
        for i in 0..3u8 {
            assert!(u.send(usize::from(i), &[i; 4]));
        }
        u.wait(0, |_, _, _| {}).unwrap();
        let mut buf = [0u8; 16];
        for _ in 0..3 {
            let (n, from) = server.recv_from(&mut buf).unwrap();
            assert_eq!(n, 4);
            let i = socks
                .iter()
                .position(|s| s.local_addr().unwrap() == from)
                .unwrap();
            assert_eq!(buf[..4], [i as u8; 4]);
            // Answer with a datagram longer than the slot: it arrives cut at RSLOT.
            server.send_to(&vec![i as u8; RSLOT + 10], from).unwrap();
        }
        let mut got = Vec::new();
        while got.len() < 3 {
            u.wait(1_000_000_000, |i, what, _| {
                if let Received::Datagram(d) = what {
                    got.push((i, d.len(), d[0]));
                }
            })
            .unwrap();
        }
        got.sort();
        assert_eq!(got, vec![(0, RSLOT, 0), (1, RSLOT, 1), (2, RSLOT, 2)]);
    }
}
