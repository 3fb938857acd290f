//! UDP sockets for shards: every shard of a server binds its own socket to the same
//! address with `SO_REUSEPORT`, so the kernel spreads peers over shards by 4-tuple hash.

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
    let mut sockets = Vec::with_capacity(count);
    let mut addr = addr;
    for _ in 0..count.max(1) {
        let s = new_socket(addr, count > 1, buffers)?;
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
    fn shards_share_one_port() {
        let socks = bind_shard_sockets("127.0.0.1:0".parse().unwrap(), 3).unwrap();
        let ports: Vec<u16> = socks
            .iter()
            .map(|s| s.local_addr().unwrap().port())
            .collect();
        assert!(ports.iter().all(|p| *p == ports[0] && *p != 0), "{ports:?}");
    }
}
