//! Batched UDP I/O: `recvmmsg`/`sendmmsg` move up to [`BATCH`] datagrams per system
//! call (Linux). Elsewhere the same API falls back to one datagram per call.

use socket2::SockAddr;
use std::io;
use std::net::SocketAddr;
use std::os::fd::RawFd;

/// Datagrams per system call.
pub const BATCH: usize = 64;
/// Bytes per receive slot. A longer datagram is reported truncated (CoAP over UDP
/// messages should fit a path MTU; RFC 7252 §4.6 recommends 1152 bytes).
pub const SLOT: usize = 4096;

/// Receive buffers for one batch.
pub struct RecvBatch {
    data: Vec<u8>,
    lens: [usize; BATCH],
    addrs: [Option<SocketAddr>; BATCH],
    truncated: [bool; BATCH],
}

impl Default for RecvBatch {
    fn default() -> Self {
        RecvBatch {
            data: vec![0; SLOT * BATCH],
            lens: [0; BATCH],
            addrs: [None; BATCH],
            truncated: [false; BATCH],
        }
    }
}

impl RecvBatch {
    /// Datagram `i` of the last batch: sender, bytes, and whether it was cut at [`SLOT`].
    pub fn get(&self, i: usize) -> Option<(SocketAddr, &[u8], bool)> {
        let addr = self.addrs.get(i).copied().flatten()?;
        let len = self.lens[i].min(SLOT);
        Some((
            addr,
            &self.data[i * SLOT..i * SLOT + len],
            self.truncated[i],
        ))
    }
}

/// Receives up to [`BATCH`] datagrams without blocking; returns how many.
#[cfg(target_os = "linux")]
pub fn recv_batch(fd: RawFd, batch: &mut RecvBatch) -> io::Result<usize> {
    recv_with_flags(fd, batch, libc::MSG_DONTWAIT)
}

/// Receives up to [`BATCH`] datagrams, waiting (up to the socket's read timeout) for
/// the first and taking what else is already there.
#[cfg(target_os = "linux")]
pub fn recv_batch_blocking(fd: RawFd, batch: &mut RecvBatch) -> io::Result<usize> {
    recv_with_flags(fd, batch, libc::MSG_WAITFORONE)
}

#[cfg(target_os = "linux")]
fn recv_with_flags(fd: RawFd, batch: &mut RecvBatch, flags: i32) -> io::Result<usize> {
    // SAFETY: every pointer handed to the kernel points into `batch.data` or into the
    // local arrays, all of which outlive the call; lengths match the allocations.
    unsafe {
        let mut storage: [libc::sockaddr_storage; BATCH] = std::mem::zeroed();
        let mut iov: [libc::iovec; BATCH] = std::mem::zeroed();
        let mut hdrs: [libc::mmsghdr; BATCH] = std::mem::zeroed();
        let base = batch.data.as_mut_ptr();
        for i in 0..BATCH {
            iov[i].iov_base = base.add(i * SLOT).cast();
            iov[i].iov_len = SLOT;
            hdrs[i].msg_hdr.msg_name = (&mut storage[i] as *mut libc::sockaddr_storage).cast();
            hdrs[i].msg_hdr.msg_namelen = std::mem::size_of::<libc::sockaddr_storage>() as u32;
            hdrs[i].msg_hdr.msg_iov = &mut iov[i];
            hdrs[i].msg_hdr.msg_iovlen = 1;
        }
        let n = libc::recvmmsg(
            fd,
            hdrs.as_mut_ptr(),
            BATCH as u32,
            flags,
            std::ptr::null_mut(),
        );
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        let n = n as usize;
        for i in 0..n {
            batch.addrs[i] = socket_addr(&storage[i]);
            batch.lens[i] = hdrs[i].msg_len as usize;
            batch.truncated[i] = hdrs[i].msg_hdr.msg_flags & libc::MSG_TRUNC != 0;
        }
        Ok(n)
    }
}

/// The sender's address from what the kernel wrote.
#[cfg(target_os = "linux")]
pub(crate) fn socket_addr(s: &libc::sockaddr_storage) -> Option<SocketAddr> {
    use std::net::{Ipv4Addr, Ipv6Addr, SocketAddrV4, SocketAddrV6};
    match i32::from(s.ss_family) {
        libc::AF_INET => {
            // SAFETY: the family says the storage holds a sockaddr_in.
            let a = unsafe { &*(s as *const libc::sockaddr_storage).cast::<libc::sockaddr_in>() };
            let ip = Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr));
            Some(SocketAddr::V4(SocketAddrV4::new(
                ip,
                u16::from_be(a.sin_port),
            )))
        }
        libc::AF_INET6 => {
            // SAFETY: the family says the storage holds a sockaddr_in6.
            let a = unsafe { &*(s as *const libc::sockaddr_storage).cast::<libc::sockaddr_in6>() };
            let ip = Ipv6Addr::from(a.sin6_addr.s6_addr);
            Some(SocketAddr::V6(SocketAddrV6::new(
                ip,
                u16::from_be(a.sin6_port),
                a.sin6_flowinfo,
                a.sin6_scope_id,
            )))
        }
        _ => None,
    }
}

/// Sends datagrams without blocking; returns how many went out (a prefix of `msgs`).
#[cfg(target_os = "linux")]
pub fn send_batch<'a>(
    fd: RawFd,
    msgs: impl IntoIterator<Item = (SocketAddr, &'a [u8])>,
) -> io::Result<usize> {
    // SAFETY: all-zero bytes are valid values of these plain C structs.
    let (mut names, mut iov, mut hdrs): (
        [libc::sockaddr_storage; BATCH],
        [libc::iovec; BATCH],
        [libc::mmsghdr; BATCH],
    ) = unsafe { std::mem::zeroed() };
    let mut n = 0;
    for (addr, bytes) in msgs.into_iter().take(BATCH) {
        let name = SockAddr::from(addr);
        // SAFETY: `name` holds `name.len()` valid bytes of a socket address, which fit
        // a sockaddr_storage; the iovec points at the caller's bytes, alive for the call.
        unsafe {
            std::ptr::copy_nonoverlapping(
                name.as_ptr().cast::<u8>(),
                (&mut names[n] as *mut libc::sockaddr_storage).cast::<u8>(),
                name.len() as usize,
            );
        }
        iov[n].iov_base = bytes.as_ptr() as *mut libc::c_void;
        iov[n].iov_len = bytes.len();
        hdrs[n].msg_hdr.msg_namelen = name.len();
        n += 1;
    }
    for i in 0..n {
        hdrs[i].msg_hdr.msg_name = (&mut names[i] as *mut libc::sockaddr_storage).cast();
        hdrs[i].msg_hdr.msg_iov = &mut iov[i];
        hdrs[i].msg_hdr.msg_iovlen = 1;
    }
    // SAFETY: the headers point at `names` and `iov`, alive for the duration of the
    // call; the kernel only reads them and the bytes.
    let sent = unsafe { libc::sendmmsg(fd, hdrs.as_mut_ptr(), n as u32, libc::MSG_DONTWAIT) };
    if sent < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(sent as usize)
}

#[cfg(not(target_os = "linux"))]
pub fn recv_batch(fd: RawFd, batch: &mut RecvBatch) -> io::Result<usize> {
    let _ = (fd, batch);
    Err(io::Error::new(
        io::ErrorKind::Unsupported,
        "batched I/O needs Linux",
    ))
}

#[cfg(not(target_os = "linux"))]
pub fn recv_batch_blocking(fd: RawFd, batch: &mut RecvBatch) -> io::Result<usize> {
    recv_batch(fd, batch)
}

#[cfg(not(target_os = "linux"))]
pub fn send_batch<'a>(
    fd: RawFd,
    msgs: impl IntoIterator<Item = (SocketAddr, &'a [u8])>,
) -> io::Result<usize> {
    let _ = (fd, msgs.into_iter());
    Err(io::Error::new(
        io::ErrorKind::Unsupported,
        "batched I/O needs Linux",
    ))
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;

    #[test]
    fn batches_go_out_and_come_in() {
        let rx = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let tx = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let to = rx.local_addr().unwrap();
        let payloads: Vec<Vec<u8>> = (0..10u8).map(|i| vec![i; 10 + i as usize]).collect();
        let msgs: Vec<(SocketAddr, &[u8])> = payloads.iter().map(|p| (to, p.as_slice())).collect();
        assert_eq!(
            send_batch(tx.as_raw_fd(), msgs.iter().copied()).unwrap(),
            10
        );
        let big = vec![7u8; SLOT + 100];
        tx.send_to(&big, to).unwrap();
        let mut batch = RecvBatch::default();
        let mut got = Vec::new();
        for _ in 0..100 {
            match recv_batch(rx.as_raw_fd(), &mut batch) {
                Ok(n) => {
                    for i in 0..n {
                        let (from, bytes, trunc) = batch.get(i).unwrap();
                        assert_eq!(from, tx.local_addr().unwrap());
                        got.push((bytes.to_vec(), trunc));
                    }
                    if got.len() == 11 {
                        break;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    std::thread::sleep(std::time::Duration::from_millis(5))
                }
                Err(e) => panic!("{e}"),
            }
        }
        assert_eq!(got.len(), 11);
        for (i, p) in payloads.iter().enumerate() {
            assert_eq!(&got[i].0, p);
            assert!(!got[i].1);
        }
        assert!(got[10].1, "oversized datagram is flagged truncated");
        assert_eq!(got[10].0.len(), SLOT);
    }
}
