//! How other threads wake a shard that waits in a blocking receive on its socket
//! ([`crate::runtime::io::ShardIo::Lone`]): an empty datagram to that socket.
//!
//! The shard polls its queues (commands, handlers' answers, resource changes) with a
//! [`std::task::Waker`] made from a [`SocketWaker`] before it blocks; whoever then puts
//! something in one of them wakes that waker, which sends the datagram. An empty
//! datagram is no CoAP message: the shard drops it when it comes from the waker's
//! address, and any such datagram (a spoofed one too) only makes the shard look at its
//! queues, so it costs an attacker one wake-up and nothing else.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::Wake;

/// Sends an empty datagram to a shard's socket when the shard is blocked in a receive.
#[derive(Debug)]
pub(crate) struct SocketWaker {
    /// Set by the shard just before it polls its queues and blocks, cleared when it
    /// wakes; a wake finding it set sends the datagram (one per sleep).
    asleep: AtomicBool,
    /// Where the datagram comes from.
    socket: UdpSocket,
    /// `socket`'s address: the source of every wake datagram.
    from: SocketAddr,
    /// The shard's socket.
    to: SocketAddr,
}

impl SocketWaker {
    /// A waker for the shard whose socket is bound to `shard`: it sends from a socket
    /// of its own on the same address (loopback for an unspecified one), port 0.
    pub(crate) fn new(shard: SocketAddr) -> std::io::Result<Arc<SocketWaker>> {
        let ip = match shard.ip() {
            IpAddr::V4(ip) if ip.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
            IpAddr::V6(ip) if ip.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
            ip => ip,
        };
        let to = SocketAddr::new(ip, shard.port());
        let socket = UdpSocket::bind(match to {
            SocketAddr::V4(_) => SocketAddr::new(ip, 0),
            SocketAddr::V6(v6) => {
                SocketAddr::V6(std::net::SocketAddrV6::new(*v6.ip(), 0, 0, v6.scope_id()))
            }
        })?;
        socket.set_nonblocking(true)?;
        let from = socket.local_addr()?;
        Ok(Arc::new(SocketWaker {
            asleep: AtomicBool::new(false),
            socket,
            from,
            to,
        }))
    }

    /// The shard is about to poll its queues and block: a wake from now on sends.
    pub(crate) fn sleeping(&self) {
        self.asleep.store(true, Ordering::SeqCst);
    }

    /// The shard is awake again: wakes need not send until it next sleeps.
    pub(crate) fn awake(&self) {
        self.asleep.store(false, Ordering::SeqCst);
    }

    /// True for a wake datagram: empty, from the waker's socket.
    pub(crate) fn is_wake(&self, peer: SocketAddr, bytes: &[u8]) -> bool {
        bytes.is_empty() && peer == self.from
    }
}

impl Wake for SocketWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        if self.asleep.swap(false, Ordering::SeqCst) {
            // A full send buffer (or any failure) loses this datagram; the shard still
            // wakes at its next timer deadline or datagram.
            if let Err(e) = self.socket.send_to(&[], self.to) {
                tracing::debug!(error = %e, "cannot wake the shard");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_wake_sends_one_empty_datagram_only_while_the_shard_sleeps() {
        let shard = UdpSocket::bind("127.0.0.1:0").unwrap();
        shard
            .set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        let waker = SocketWaker::new(shard.local_addr().unwrap()).unwrap();
        let std_waker = std::task::Waker::from(waker.clone());
        std_waker.wake_by_ref(); // awake: nothing is sent
        waker.sleeping();
        std_waker.wake_by_ref();
        std_waker.wake_by_ref(); // the second wake of one sleep sends nothing
        let mut buf = [0u8; 16];
        let (n, from) = shard.recv_from(&mut buf).unwrap();
        assert!(waker.is_wake(from, &buf[..n]), "{n} bytes from {from}");
        assert!(
            shard.recv_from(&mut buf).is_err(),
            "one datagram per sleep, none while awake"
        );
        assert!(
            !waker.is_wake(from, b"x"),
            "a datagram with bytes is no wake"
        );
    }

    #[test]
    fn a_shard_on_the_unspecified_address_is_woken_over_loopback() {
        let shard = UdpSocket::bind("0.0.0.0:0").unwrap();
        shard
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        let waker = SocketWaker::new(shard.local_addr().unwrap()).unwrap();
        waker.sleeping();
        std::task::Waker::from(waker.clone()).wake();
        let mut buf = [0u8; 16];
        let (n, from) = shard.recv_from(&mut buf).unwrap();
        assert!(waker.is_wake(from, &buf[..n]));
    }
}
