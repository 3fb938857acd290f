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

/// Receive buffers for one batch, with the kernel's message headers built once: a
/// receive only resets what the kernel wrote into the headers it filled, instead of
/// building (and zeroing) [`BATCH`] headers and socket addresses on every call.
pub struct RecvBatch {
    data: Vec<u8>,
    lens: [usize; BATCH],
    addrs: [Option<SocketAddr>; BATCH],
    truncated: [bool; BATCH],
    #[cfg(target_os = "linux")]
    headers: Box<RecvHeaders>,
}

/// The `recvmmsg` headers of a [`RecvBatch`]: each points at its own address slot and
/// iovec in this (boxed, so never moving) value, and the iovec at its slot of the
/// batch's data (a vector never resized, so its bytes never move either).
#[cfg(target_os = "linux")]
struct RecvHeaders {
    storage: [libc::sockaddr_storage; BATCH],
    iov: [libc::iovec; BATCH],
    hdrs: [libc::mmsghdr; BATCH],
}

// SAFETY: the raw pointers in `headers` point only into memory the batch owns (its
// boxed headers and its data vector), so moving the batch to another thread moves what
// they point at with it; nothing is shared.
#[cfg(target_os = "linux")]
unsafe impl Send for RecvBatch {}

#[cfg(target_os = "linux")]
const NAME_LEN: u32 = std::mem::size_of::<libc::sockaddr_storage>() as u32;

impl Default for RecvBatch {
    fn default() -> Self {
        let mut batch = RecvBatch {
            data: vec![0; SLOT * BATCH],
            lens: [0; BATCH],
            addrs: [None; BATCH],
            truncated: [false; BATCH],
            // SAFETY: all-zero bytes are valid values of these plain C structs.
            #[cfg(target_os = "linux")]
            headers: Box::new(unsafe { std::mem::zeroed() }),
        };
        #[cfg(target_os = "linux")]
        {
            let base = batch.data.as_mut_ptr();
            let h = &mut *batch.headers;
            for i in 0..BATCH {
                // SAFETY: slot `i` lies inside `data` (SLOT * BATCH bytes).
                h.iov[i].iov_base = unsafe { base.add(i * SLOT) }.cast();
                h.iov[i].iov_len = SLOT;
                h.hdrs[i].msg_hdr.msg_name = std::ptr::addr_of_mut!(h.storage[i]).cast();
                h.hdrs[i].msg_hdr.msg_namelen = NAME_LEN;
                h.hdrs[i].msg_hdr.msg_iov = std::ptr::addr_of_mut!(h.iov[i]);
                h.hdrs[i].msg_hdr.msg_iovlen = 1;
            }
        }
        batch
    }
}

impl RecvBatch {
    /// The senders of the first `n` datagrams of the last batch (`None` where the
    /// kernel gave no address it could read).
    pub fn senders(&self, n: usize) -> &[Option<SocketAddr>] {
        &self.addrs[..n.min(BATCH)]
    }

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

/// True for the errors of a blocking receive that only mean nothing came: its timeout
/// ran out, or a signal interrupted it.
pub fn nothing_received(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut | io::ErrorKind::Interrupted
    )
}

#[cfg(target_os = "linux")]
fn recv_with_flags(fd: RawFd, batch: &mut RecvBatch, flags: i32) -> io::Result<usize> {
    let h = &mut *batch.headers;
    // SAFETY: every header points into `batch` (see `RecvHeaders`), which outlives the
    // call; the iovec lengths match the data slots.
    let n = unsafe {
        libc::recvmmsg(
            fd,
            h.hdrs.as_mut_ptr(),
            BATCH as u32,
            flags,
            std::ptr::null_mut(),
        )
    };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    let n = n as usize;
    for i in 0..n {
        let hdr = &mut h.hdrs[i];
        batch.addrs[i] = socket_addr(&h.storage[i]);
        batch.lens[i] = hdr.msg_len as usize;
        batch.truncated[i] = hdr.msg_hdr.msg_flags & libc::MSG_TRUNC != 0;
        // The kernel wrote the address's length and the flags; the next receive needs
        // the full address room again.
        hdr.msg_hdr.msg_namelen = NAME_LEN;
        hdr.msg_hdr.msg_flags = 0;
    }
    Ok(n)
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
    use std::mem::MaybeUninit;
    // Only the headers, addresses and iovecs of the datagrams sent are written (zeroing
    // all BATCH of them on every call cost more than the rest of a small send).
    let mut names = [const { MaybeUninit::<libc::sockaddr_storage>::uninit() }; BATCH];
    let mut iov = [const { MaybeUninit::<libc::iovec>::uninit() }; BATCH];
    let mut hdrs = [const { MaybeUninit::<libc::mmsghdr>::uninit() }; BATCH];
    let mut n = 0;
    for (addr, bytes) in msgs.into_iter().take(BATCH) {
        let name = SockAddr::from(addr);
        // SAFETY: `name` holds `name.len()` valid bytes of a socket address, which fit
        // a sockaddr_storage; the kernel reads only `msg_namelen` of them.
        unsafe {
            std::ptr::copy_nonoverlapping(
                name.as_ptr().cast::<u8>(),
                names[n].as_mut_ptr().cast::<u8>(),
                name.len() as usize,
            );
        }
        let vec = iov[n].write(libc::iovec {
            iov_base: bytes.as_ptr() as *mut libc::c_void,
            iov_len: bytes.len(),
        });
        // SAFETY: all-zero bytes are a valid mmsghdr (null pointers, zero lengths).
        let mut hdr: libc::mmsghdr = unsafe { std::mem::zeroed() };
        hdr.msg_hdr.msg_name = names[n].as_mut_ptr().cast();
        hdr.msg_hdr.msg_namelen = name.len();
        hdr.msg_hdr.msg_iov = vec;
        hdr.msg_hdr.msg_iovlen = 1;
        hdrs[n].write(hdr);
        n += 1;
    }
    // SAFETY: the first `n` headers are initialised and point at `names` and `iov`,
    // alive for the duration of the call; the kernel only reads them and the bytes.
    let sent = unsafe {
        libc::sendmmsg(
            fd,
            hdrs.as_mut_ptr().cast::<libc::mmsghdr>(),
            n as u32,
            libc::MSG_DONTWAIT,
        )
    };
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

    #[test]
    fn a_batch_reused_for_many_receives_reports_each_sender() {
        let rx = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let to = rx.local_addr().unwrap();
        let senders: Vec<_> = (0..3)
            .map(|_| std::net::UdpSocket::bind("127.0.0.1:0").unwrap())
            .collect();
        let mut batch = RecvBatch::default();
        for round in 0..5u8 {
            for (i, s) in senders.iter().enumerate() {
                s.send_to(&[round, i as u8], to).unwrap();
            }
            let mut got = Vec::new();
            while got.len() < senders.len() {
                match recv_batch(rx.as_raw_fd(), &mut batch) {
                    Ok(n) => (0..n).for_each(|i| {
                        let (from, bytes, trunc) = batch.get(i).unwrap();
                        got.push((from, bytes.to_vec(), trunc));
                    }),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        std::thread::sleep(std::time::Duration::from_millis(1))
                    }
                    Err(e) => panic!("{e}"),
                }
            }
            for (i, s) in senders.iter().enumerate() {
                assert!(
                    got.contains(&(s.local_addr().unwrap(), vec![round, i as u8], false)),
                    "round {round}: sender {i} missing from {got:?}"
                );
            }
        }
    }
}
