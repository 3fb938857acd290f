//! UDP sockets for shards: every shard of a server binds its own socket to the same
//! address with `SO_REUSEPORT`, so the kernel spreads peers over shards by 4-tuple hash.
//!
//! `SO_REUSEPORT` would also let a second server (of the same user) join the port and
//! take about half its peers. So before the shards bind a fixed port, a probe socket
//! without `SO_REUSEPORT` binds it first: if anything holds the port, the probe gets
//! "address in use" and so does the server, as a TCP listener would. (Two servers
//! started within the microseconds between the probe and the shards' binds can still
//! both succeed; nothing short of a lock outside the socket API closes that window.)

use socket2::{Domain, Protocol, Socket, Type};
use std::io;
use std::net::{SocketAddr, UdpSocket};

/// Binds `count` non-blocking UDP sockets to `addr`, sharing the port via
/// `SO_REUSEPORT` when `count > 1`. With port 0 the first socket's port is reused by the rest.
pub fn bind_shard_sockets(addr: SocketAddr, count: usize) -> io::Result<Vec<UdpSocket>> {
    bind_shard_sockets_with(addr, count, SocketBuffers::default())
}

/// Sizes asked of the kernel for each socket's buffers (it may cap them); 0 keeps the
/// kernel's default.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SocketBuffers {
    /// `SO_RCVBUF` in bytes.
    pub recv: usize,
    /// `SO_SNDBUF` in bytes.
    pub send: usize,
}

impl Default for SocketBuffers {
    /// 4 MiB each: bigger buffers absorb bursts from many clients.
    fn default() -> Self {
        SocketBuffers {
            recv: 4 << 20,
            send: 4 << 20,
        }
    }
}

/// [`bind_shard_sockets`] with the given buffer sizes.
pub fn bind_shard_sockets_with(
    addr: SocketAddr,
    count: usize,
    buffers: SocketBuffers,
) -> io::Result<Vec<UdpSocket>> {
    bind_shard_sockets_sharing(addr, count, buffers, false)
}

/// [`bind_shard_sockets_with`], with `SO_REUSEADDR` on the sockets when `with_groups`
/// so that the server's group sockets (bound to a group address on the same port) can
/// bind beside a wildcard address; the probe (without it) still refuses a port that
/// another process serves.
pub(crate) fn bind_shard_sockets_sharing(
    addr: SocketAddr,
    count: usize,
    buffers: SocketBuffers,
    with_groups: bool,
) -> io::Result<Vec<UdpSocket>> {
    let mut sockets = Vec::with_capacity(count);
    let mut addr = addr;
    if (count > 1 || with_groups) && addr.port() != 0 {
        // Refuse a port another process serves (see the module docs).
        new_socket(addr, false, SocketBuffers { recv: 0, send: 0 })?.bind(&addr.into())?;
    }
    for _ in 0..count.max(1) {
        let s = new_socket(addr, count > 1, buffers)?;
        if with_groups {
            s.set_reuse_address(true)?;
        }
        s.bind(&addr.into())?;
        if addr.port() == 0 {
            addr = s.local_addr()?.as_socket().unwrap_or(addr);
        }
        sockets.push(s.into());
    }
    Ok(sockets)
}

fn new_socket(addr: SocketAddr, reuse_port: bool, buffers: SocketBuffers) -> io::Result<Socket> {
    let s = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))?;
    if addr.is_ipv6() {
        // Serve IPv4-mapped peers too when bound to [::]; explicit v6 addresses are unaffected.
        let _ = s.set_only_v6(false);
    }
    if reuse_port {
        #[cfg(unix)]
        s.set_reuse_port(true)?;
    }
    // Bigger buffers absorb bursts from many clients (best effort; the kernel caps them).
    if buffers.recv > 0 {
        let _ = s.set_recv_buffer_size(buffers.recv);
    }
    if buffers.send > 0 {
        let _ = s.set_send_buffer_size(buffers.send);
    }
    s.set_nonblocking(true)?;
    Ok(s)
}

/// Sets the integer socket option `name` at `level` to `value` (Linux `setsockopt`).
#[cfg(target_os = "linux")]
pub(crate) fn set_int_option(
    socket: &UdpSocket,
    level: libc::c_int,
    name: libc::c_int,
    value: libc::c_int,
) -> io::Result<()> {
    // SAFETY: a c_int is what integer options read, and it holds no pointers.
    unsafe { set_option(socket, level, name, &value) }
}

/// Sets the socket option `name` at `level` to the bytes of `value` (Linux
/// `setsockopt`, with `value`'s size as the option's length).
///
/// # Safety
///
/// `value` must be of the type the option `name` expects, and every pointer it holds
/// must be valid for the kernel to read during the call.
#[cfg(target_os = "linux")]
pub(crate) unsafe fn set_option<T>(
    socket: &UdpSocket,
    level: libc::c_int,
    name: libc::c_int,
    value: &T,
) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: a valid socket, and `value` readable for its size (the caller vouches
    // for its type and what it points to).
    let r = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            level,
            name,
            (value as *const T).cast(),
            std::mem::size_of::<T>() as libc::socklen_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Asks the kernel to report ICMP errors (port, host or network unreachable) for the
/// datagrams this socket sends (Linux: `IP_RECVERR`, and `IPV6_RECVERR` on an IPv6
/// socket), so that a client learns at once that nothing listens instead of waiting
/// for its timeout. Read them with [`take_errors`]. Elsewhere this does nothing.
pub(crate) fn report_unreachable(socket: &UdpSocket) -> io::Result<()> {
    #[cfg(target_os = "linux")]
    {
        let set = |level, name| set_int_option(socket, level, name, 1);
        if socket.local_addr()?.is_ipv6() {
            set(libc::SOL_IPV6, libc::IPV6_RECVERR)?;
            // IPv4 peers of a dual-stack socket (best effort).
            let _ = set(libc::SOL_IP, libc::IP_RECVERR);
        } else {
            set(libc::SOL_IP, libc::IP_RECVERR)?;
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = socket;
    Ok(())
}

/// Whether `e` is what a socket with [`report_unreachable`] returns from a send or
/// receive when an ICMP error is pending: the details are then in [`take_errors`].
pub(crate) fn is_unreachable(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::ECONNREFUSED | libc::EHOSTUNREACH | libc::ENETUNREACH | libc::EHOSTDOWN)
    )
}

/// What an unreachable error means, for a person.
pub(crate) fn describe_unreachable(e: &io::Error) -> String {
    match e.raw_os_error() {
        Some(libc::ECONNREFUSED) => {
            "port not open (ICMP port unreachable): is the server running, and on this port?".into()
        }
        Some(libc::EHOSTUNREACH | libc::EHOSTDOWN) => {
            "host unreachable (ICMP): is the address right, and the host up?".into()
        }
        Some(libc::ENETUNREACH) => {
            "network unreachable (ICMP): check the address and routes".into()
        }
        _ => e.to_string(),
    }
}

/// Reads the socket's error queue (see [`report_unreachable`]), adding each
/// destination's unreachable error to `out`. Returns `WouldBlock` once the queue is
/// empty, so that inside `try_io` the socket's error readiness is cleared.
#[cfg(target_os = "linux")]
pub(crate) fn take_errors(
    fd: std::os::fd::RawFd,
    out: &mut Vec<(SocketAddr, io::Error)>,
) -> io::Result<()> {
    /// Errors read per call at most, so that a flood of ICMP cannot hold the caller.
    const MAX_ERRORS: usize = 64;
    for _ in 0..MAX_ERRORS {
        // SAFETY: every pointer in `msg` points at a live local buffer of the stated
        // length; the kernel writes at most that much.
        let (name, errno) = unsafe {
            let mut name: libc::sockaddr_storage = std::mem::zeroed();
            let mut data = [0u8; 64];
            let mut control = [0u64; 32];
            let mut iov = libc::iovec {
                iov_base: data.as_mut_ptr().cast(),
                iov_len: data.len(),
            };
            let mut msg: libc::msghdr = std::mem::zeroed();
            msg.msg_name = (&mut name as *mut libc::sockaddr_storage).cast();
            msg.msg_namelen = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
            msg.msg_iov = &mut iov;
            msg.msg_iovlen = 1;
            msg.msg_control = control.as_mut_ptr().cast();
            msg.msg_controllen = std::mem::size_of_val(&control) as _;
            if libc::recvmsg(fd, &mut msg, libc::MSG_ERRQUEUE | libc::MSG_DONTWAIT) < 0 {
                return Err(io::Error::last_os_error());
            }
            let mut errno = None;
            let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
            while !cmsg.is_null() {
                let c = &*cmsg;
                let extended = (c.cmsg_level == libc::SOL_IP && c.cmsg_type == libc::IP_RECVERR)
                    || (c.cmsg_level == libc::SOL_IPV6 && c.cmsg_type == libc::IPV6_RECVERR);
                if extended {
                    let ee = libc::CMSG_DATA(cmsg)
                        .cast::<libc::sock_extended_err>()
                        .read_unaligned();
                    errno = Some(ee.ee_errno as i32);
                }
                cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
            }
            (name, errno)
        };
        let (Some(peer), Some(errno)) = (super::mmsg::socket_addr(&name), errno) else {
            continue;
        };
        let e = io::Error::from_raw_os_error(errno);
        // Only "nothing receives there" ends requests; e.g. EMSGSIZE (a smaller path
        // MTU) does not.
        if is_unreachable(&e) {
            out.push((peer, e));
        }
    }
    Ok(())
}

/// Error queues are read on Linux only.
#[cfg(not(target_os = "linux"))]
pub(crate) fn take_errors(
    _fd: std::os::fd::RawFd,
    _out: &mut Vec<(SocketAddr, io::Error)>,
) -> io::Result<()> {
    Err(io::ErrorKind::WouldBlock.into())
}

/// The unspecified address of the same family as `peer`, port 0: where a client binds.
pub fn any_for(peer: &SocketAddr) -> SocketAddr {
    match peer {
        SocketAddr::V4(_) => "0.0.0.0:0".parse().expect("literal"),
        SocketAddr::V6(_) => "[::]:0".parse().expect("literal"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_served_port_is_refused_but_shards_share_theirs() {
        for shards in [1, 3] {
            let first = bind_shard_sockets("127.0.0.1:0".parse().unwrap(), 2).unwrap();
            let taken = first[0].local_addr().unwrap();
            let e = bind_shard_sockets(taken, shards).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::AddrInUse, "{shards} shards: {e}");
            // A dual-stack wildcard bind on the same port is refused too.
            let any: SocketAddr = format!("[::]:{}", taken.port()).parse().unwrap();
            if let Err(e) = bind_shard_sockets(any, shards) {
                assert_eq!(e.kind(), io::ErrorKind::AddrInUse, "{e}");
            } else {
                panic!("[::]:{} bound beside 127.0.0.1", taken.port());
            }
            drop(first);
            // Free again: a fixed port binds with all its shards.
            let socks = bind_shard_sockets(taken, 3).unwrap();
            assert!(socks.iter().all(|s| s.local_addr().unwrap() == taken));
        }
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn an_icmp_port_unreachable_is_reported_with_its_destination() {
        use std::os::fd::AsRawFd;
        for (any, closed) in [("127.0.0.1:0", "127.0.0.1:0"), ("[::]:0", "127.0.0.1:0")] {
            let closed_port = UdpSocket::bind(closed).unwrap().local_addr().unwrap();
            let client = bind_shard_sockets(any.parse().unwrap(), 1)
                .unwrap()
                .remove(0);
            report_unreachable(&client).unwrap();
            let to = match client.local_addr().unwrap() {
                SocketAddr::V6(_) => format!("[::ffff:127.0.0.1]:{}", closed_port.port()),
                SocketAddr::V4(_) => closed_port.to_string(),
            };
            let to: SocketAddr = to.parse().unwrap();
            client.send_to(b"x", to).unwrap();
            // The ICMP error arrives asynchronously: wait for it with a deadline.
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
            let mut errors = Vec::new();
            while errors.is_empty() && std::time::Instant::now() < deadline {
                let e = take_errors(client.as_raw_fd(), &mut errors).unwrap_err();
                assert_eq!(e.kind(), io::ErrorKind::WouldBlock);
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            assert_eq!(errors.len(), 1, "{any}: {errors:?}");
            assert_eq!(errors[0].0, to);
            assert!(is_unreachable(&errors[0].1));
            assert!(describe_unreachable(&errors[0].1).starts_with("port not open"));
        }
    }

    #[test]
    fn shards_share_one_port() {
        let socks = bind_shard_sockets("127.0.0.1:0".parse().unwrap(), 3).unwrap();
        let ports: Vec<u16> = socks
            .iter()
            .map(|s| s.local_addr().unwrap().port())
            .collect();
        assert!(ports.iter().all(|p| *p == ports[0] && *p != 0), "{ports:?}");
    }
}
