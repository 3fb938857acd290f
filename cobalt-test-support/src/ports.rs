//! Loopback ports free at the time of asking. Another process may take one before
//! the test uses it, which is why peers are started with retries
//! ([`crate::peers::PeerServer::start`]).

use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, UdpSocket};

/// 127.0.0.1.
pub const V4: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);
/// ::1.
pub const V6: IpAddr = IpAddr::V6(std::net::Ipv6Addr::LOCALHOST);

/// A UDP port free on `ip` just now.
pub fn free_udp_port(ip: IpAddr) -> u16 {
    let sock = UdpSocket::bind(SocketAddr::new(ip, 0)).expect("bind an ephemeral UDP port");
    sock.local_addr().expect("local address").port()
}

/// A TCP port free on `ip` just now.
pub fn free_tcp_port(ip: IpAddr) -> u16 {
    let sock = TcpListener::bind(SocketAddr::new(ip, 0)).expect("bind an ephemeral TCP port");
    sock.local_addr().expect("local address").port()
}

/// Whether `port` on `ip` is free for UDP and for TCP just now.
pub fn is_free(ip: IpAddr, port: u16) -> bool {
    let addr = SocketAddr::new(ip, port);
    UdpSocket::bind(addr).is_ok() && TcpListener::bind(addr).is_ok()
}

/// A port `p` such that `p + o` is free for UDP and TCP on `ip` for every `o` in
/// `offsets` (peers that listen on several ports derived from one, e.g. libcoap's
/// coaps on `p + 1`, aiocoap's WebSocket server on `p + 3000`).
pub fn free_ports(ip: IpAddr, offsets: &[u16]) -> u16 {
    let span = offsets.iter().copied().max().unwrap_or(0);
    for _ in 0..100 {
        let p = free_udp_port(ip);
        if p.checked_add(span).is_some() && offsets.iter().all(|&o| is_free(ip, p + o)) {
            return p;
        }
    }
    panic!("no port p on {ip} with p + {offsets:?} free");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn free_ports_leave_every_offset_bindable() {
        let p = free_ports(V4, &[0, 1, 3000]);
        for o in [0, 1, 3000] {
            assert!(UdpSocket::bind((V4, p + o)).is_ok(), "{}", p + o);
            assert!(TcpListener::bind((V4, p + o)).is_ok(), "{}", p + o);
        }
    }

    #[test]
    fn a_taken_port_is_not_free() {
        let held = UdpSocket::bind((V4, 0)).unwrap();
        assert!(!is_free(V4, held.local_addr().unwrap().port()));
        let held = TcpListener::bind((V4, 0)).unwrap();
        assert!(!is_free(V4, held.local_addr().unwrap().port()));
        assert_ne!(free_tcp_port(V4), 0);
    }
}
