//! How a test knows that a server it started is ready: its port is taken, it accepts
//! TCP connections, or it answers a CoAP ping.

use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::time::Duration;

/// A readiness check for a server at an address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ready {
    /// The UDP port is bound (our own bind fails). Sends nothing to the server, so that
    /// e.g. libcoap's `-l` loss pattern applies to the test's own first exchange.
    UdpBound,
    /// A TCP connection is accepted.
    TcpListening,
    /// A CoAP ping (an empty Confirmable message, RFC 7252 §4.3) over UDP is answered
    /// (with a Reset): the server reads and answers CoAP.
    CoapPing,
}

impl Ready {
    /// Checks once; a check that sends something waits at most 200 ms for the answer.
    pub fn check(self, addr: SocketAddr) -> bool {
        match self {
            Ready::UdpBound => UdpSocket::bind(addr).is_err(),
            Ready::TcpListening => {
                TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok()
            }
            Ready::CoapPing => coap_ping(addr, Duration::from_millis(200)),
        }
    }
}

/// Whether a CoAP server at `addr` answers a ping within `wait` with a Reset
/// carrying the ping's message ID.
pub fn coap_ping(addr: SocketAddr, wait: Duration) -> bool {
    let local: SocketAddr = if addr.is_ipv4() {
        "127.0.0.1:0".parse().expect("an address")
    } else {
        "[::1]:0".parse().expect("an address")
    };
    let Ok(sock) = UdpSocket::bind(local) else {
        return false;
    };
    let mid: u16 = std::process::id() as u16 ^ 0x5a5a;
    let [hi, lo] = mid.to_be_bytes();
    // Version 1, Confirmable, no token; code 0.00 (empty).
    if sock.send_to(&[0x40, 0x00, hi, lo], addr).is_err() {
        return false;
    }
    if sock.set_read_timeout(Some(wait)).is_err() {
        return false;
    }
    let mut buf = [0u8; 64];
    // Version 1, Reset (type 3), same message ID.
    matches!(sock.recv_from(&mut buf), Ok((n, from)) if n >= 4 && from == addr
        && buf[0] >> 4 == 0b0111 && buf[2..4] == [hi, lo])
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    #[test]
    fn bound_and_listening_ports_are_ready() {
        let udp = UdpSocket::bind("127.0.0.1:0").unwrap();
        assert!(Ready::UdpBound.check(udp.local_addr().unwrap()));
        let tcp = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = tcp.local_addr().unwrap();
        assert!(Ready::TcpListening.check(addr));
        drop(tcp);
        assert!(!Ready::TcpListening.check(addr));
    }

    /// Answers one ping on `server` with a message of type `mtype` (2 ACK, 3 RST).
    fn answer_once(server: UdpSocket, mtype: u8) -> std::thread::JoinHandle<UdpSocket> {
        std::thread::spawn(move || {
            let mut buf = [0u8; 16];
            let (n, from) = server.recv_from(&mut buf).unwrap();
            assert_eq!((n, buf[0], buf[1]), (4, 0x40, 0x00));
            buf[0] = 0x40 | mtype << 4;
            server.send_to(&buf[..4], from).unwrap();
            server
        })
    }

    #[test]
    fn a_ping_is_answered_only_by_a_reset() {
        let server = UdpSocket::bind("127.0.0.1:0").unwrap();
        let addr = server.local_addr().unwrap();
        let t = answer_once(server, 2);
        assert!(!coap_ping(addr, Duration::from_secs(5)));
        let t = answer_once(t.join().unwrap(), 3);
        assert!(coap_ping(addr, Duration::from_secs(5)));
        t.join().unwrap();
    }
}
