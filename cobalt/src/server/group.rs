//! Group communication (RFC 7252 §8, draft-ietf-core-groupcomm-bis): the server joins
//! All-CoAP-Nodes (224.0.1.187, ff02::fd, ff05::fd) on chosen interfaces and answers
//! the requests sent to those groups.
//!
//! Each group has a socket of its own, bound to the group address and the server's
//! port, so a datagram's socket says whether it was sent to a group: the unicast
//! listener's receive path stays as it is (no `IP_PKTINFO` to read per datagram), and
//! the unicast sockets are told not to take group traffic (`IP_MULTICAST_ALL` off,
//! see `exclude_groups`). A group request is NON (a CON one is ignored, RFC 7252
//! §8.1), runs the server's routes, and its answer goes out as NON after a random
//! Leisure (§8.2) from a unicast socket of its own (groupcomm-bis lets an answer come
//! from another port). Error answers (4.xx, 5.xx) and empty 2.05 answers are not sent,
//! unless the request's No-Response option (RFC 7967) asks for them; a No-Response
//! that suppresses a class suppresses it here too.
//!
//! What does not apply to group requests: the server's [`Layer`](super::Layer)s,
//! observe, block-wise transfers and per-resource executors (the handler runs on the
//! group task).

use super::request::{IntoResponse, Request};
use super::routes::Routes;
use crate::response::Response;
use crate::transport::per_ip::IpCounts;
use cobalt_proto::address::AddressPrefix;
use cobalt_proto::message::{codec, opt, Code, Message, MessageType};
use rand::Rng;
use socket2::{Domain, Protocol, Socket, Type};
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6, UdpSocket};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// All-CoAP-Nodes for IPv4 (RFC 7252 §12.8).
pub const ALL_COAP_NODES_V4: Ipv4Addr = Ipv4Addr::new(224, 0, 1, 187);
/// All-CoAP-Nodes, link-local scope (RFC 7252 §12.8).
pub const ALL_COAP_NODES_LINK_V6: Ipv6Addr = Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 0xfd);
/// All-CoAP-Nodes, site-local scope (RFC 7252 §12.8).
pub const ALL_COAP_NODES_SITE_V6: Ipv6Addr = Ipv6Addr::new(0xff05, 0, 0, 0, 0, 0, 0, 0xfd);

/// The RFC 7252 §8.2 Leisure for a group: `S·G/R` with `S` the estimated answer size
/// in bytes, `G` the estimated number of group members and `R` the data rate the
/// answers may take together, in bytes per second (a rate of 0 gives the RFC's
/// DEFAULT_LEISURE of 5 s).
pub fn leisure_for(answer_bytes: u32, group_size: u32, bytes_per_second: u32) -> Duration {
    if bytes_per_second == 0 {
        return Duration::from_secs(5);
    }
    Duration::from_secs_f64(
        f64::from(answer_bytes) * f64::from(group_size) / f64::from(bytes_per_second),
    )
}

/// Which groups a server joins, where, and how it answers them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupConfig {
    /// The interfaces to join on, by name (`eth0`); empty joins on the interface the
    /// kernel picks for the IPv4 group and on none for the link-local IPv6 group.
    pub interfaces: Vec<String>,
    /// Join the IPv6 groups (ff02::fd per interface and ff05::fd) too.
    pub ipv6: bool,
    /// Answers wait a uniformly random time up to this (RFC 7252 §8.2). The default,
    /// 1 s, is [`leisure_for`]`(100, 80, 8000)`: 100-byte answers from 80 members over
    /// 64 kbit/s; the RFC's 5 s assumes a much slower network.
    pub leisure: Duration,
    /// Group requests being served or waiting for their Leisure at once; more are
    /// dropped (a group request may be sent by anyone on the link).
    pub max_pending: usize,
    /// Of those, at most this many from one IP address: a forged source address
    /// gets at most this many answers per Leisure from each member (group answers,
    /// such as discovery, are often larger than the request; this bounds what a
    /// group can be made to send to one victim).
    pub max_pending_per_ip: usize,
}

impl Default for GroupConfig {
    fn default() -> Self {
        GroupConfig {
            interfaces: Vec::new(),
            ipv6: true,
            leisure: leisure_for(100, 80, 8000),
            max_pending: 256,
            max_pending_per_ip: 4,
        }
    }
}

/// Whether a group request's answer goes out (groupcomm-bis §3.1.2, RFC 7967): with
/// No-Response the option decides (bits 2, 8, 16 suppress 2.xx, 4.xx, 5.xx); without
/// it, errors and an empty 2.05 (nothing useful, e.g. a discovery filter that matched
/// nothing) are suppressed.
pub fn answers_group(answer: &Response, no_response: Option<u32>) -> bool {
    if let Some(bits) = no_response {
        let bit = match answer.code.class() {
            2 => 2,
            4 => 8,
            5 => 16,
            _ => 0,
        };
        return bits & bit == 0;
    }
    match answer.code.class() {
        2 => !(answer.code == Code::CONTENT && answer.payload.is_empty()),
        _ => false,
    }
}

/// When the answer to a group request received at `received` goes out: a uniformly
/// random point of the `leisure` after it (RFC 7252 §8.2).
pub fn answer_at(received: Instant, leisure: Duration, rng: &mut impl Rng) -> Instant {
    let nanos = u64::try_from(leisure.as_nanos()).unwrap_or(u64::MAX);
    received + Duration::from_nanos(rng.random_range(0..=nanos))
}

/// The request in a datagram sent to a group, or `None` when it is not one to serve:
/// undecodable, not a request, or confirmable (RFC 7252 §8.1: a CON to a group is not
/// answered).
pub fn group_request(datagram: &[u8]) -> Option<Message> {
    let message = codec::decode(datagram).ok()?;
    let request = message.code.class() == 0 && message.code != Code::EMPTY;
    (request && message.mtype == MessageType::NonConfirmable).then_some(message)
}

/// The NON answer to `request` carrying `answer`, with message ID `mid`.
fn answer_message(request: &Message, answer: Response, mid: u16) -> Message {
    let mut m = answer.into_message();
    m.mtype = MessageType::NonConfirmable;
    m.mid = mid;
    m.token = request.token.clone();
    m
}

/// Sockets bound to the groups of `config` on `port`, each joined on its interfaces.
pub(crate) fn bind_groups(config: &GroupConfig, port: u16) -> io::Result<Vec<UdpSocket>> {
    let indexes = config
        .interfaces
        .iter()
        .map(|name| interface_index(name))
        .collect::<io::Result<Vec<u32>>>()?;
    let mut sockets = Vec::new();
    let v4 = group_socket(SocketAddr::V4(SocketAddrV4::new(ALL_COAP_NODES_V4, port)))?;
    if indexes.is_empty() {
        v4.join_multicast_v4(&ALL_COAP_NODES_V4, &Ipv4Addr::UNSPECIFIED)
    } else {
        indexes.iter().try_for_each(|&i| {
            v4.join_multicast_v4_n(
                &ALL_COAP_NODES_V4,
                &socket2::InterfaceIndexOrAddress::Index(i),
            )
        })
    }
    .map_err(|e| joining(ALL_COAP_NODES_V4.into(), e))?;
    sockets.push(v4.into());
    if config.ipv6 {
        for &i in &indexes {
            let link = SocketAddrV6::new(ALL_COAP_NODES_LINK_V6, port, 0, i);
            let s = group_socket(SocketAddr::V6(link))?;
            s.join_multicast_v6(&ALL_COAP_NODES_LINK_V6, i)
                .map_err(|e| joining(ALL_COAP_NODES_LINK_V6.into(), e))?;
            sockets.push(s.into());
        }
        let site = group_socket(SocketAddr::V6(SocketAddrV6::new(
            ALL_COAP_NODES_SITE_V6,
            port,
            0,
            0,
        )))?;
        let joins = if indexes.is_empty() { vec![0] } else { indexes };
        joins
            .iter()
            .try_for_each(|&i| site.join_multicast_v6(&ALL_COAP_NODES_SITE_V6, i))
            .map_err(|e| joining(ALL_COAP_NODES_SITE_V6.into(), e))?;
        sockets.push(site.into());
    }
    Ok(sockets)
}

/// An error joining `group`, saying what to check.
fn joining(group: IpAddr, e: io::Error) -> io::Error {
    io::Error::new(
        e.kind(),
        format!("cannot join the group {group}: {e} (does the interface exist, is it up, and has it a route for multicast?)"),
    )
}

/// The index of the interface called `name`.
fn interface_index(name: &str) -> io::Result<u32> {
    let c = std::ffi::CString::new(name)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "an interface name has a NUL"))?;
    // SAFETY: a NUL-terminated string.
    let index = unsafe { libc::if_nametoindex(c.as_ptr()) };
    if index == 0 {
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!("no network interface is called {name:?} (see `ip link`)"),
        ));
    }
    Ok(index)
}

/// A non-blocking UDP socket bound to the group address `addr`, sharing it with other
/// servers of the host (`SO_REUSEADDR`: every member gets each group datagram).
fn group_socket(addr: SocketAddr) -> io::Result<Socket> {
    let s = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))?;
    s.set_reuse_address(true)?;
    if addr.is_ipv6() {
        s.set_only_v6(true)?;
    }
    s.set_nonblocking(true)?;
    s.bind(&addr.into()).map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("cannot bind the group socket {addr}: {e}"),
        )
    })?;
    Ok(s)
}

/// Stops a unicast listener's socket from taking datagrams sent to groups that other
/// sockets of the host joined (Linux `IP_MULTICAST_ALL` / `IPV6_MULTICAST_ALL` off):
/// those are the group sockets' to serve. Elsewhere this does nothing.
pub(crate) fn exclude_groups(socket: &UdpSocket) -> io::Result<()> {
    #[cfg(target_os = "linux")]
    {
        let set = |level, name| crate::transport::udp::set_int_option(socket, level, name, 0);
        set(libc::SOL_IP, libc::IP_MULTICAST_ALL)?;
        if socket.local_addr()?.is_ipv6() {
            // IPV6_MULTICAST_ALL (Linux 4.20; older kernels lack it, and their IPv6
            // wildcard sockets may see the IPv6 groups' requests too).
            let _ = set(libc::SOL_IPV6, 29);
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = socket;
    Ok(())
}

/// The running group responder of a server: one task per group socket.
#[derive(Debug)]
pub(crate) struct GroupResponder {
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl GroupResponder {
    /// Serves `routes` on the group sockets, answering from sockets of their own;
    /// pending answers are counted per address key (IPv6 by `prefix`, as every
    /// per-address budget of the server).
    pub(crate) fn start(
        sockets: Vec<UdpSocket>,
        routes: &Routes,
        config: &GroupConfig,
        prefix: AddressPrefix,
    ) -> io::Result<GroupResponder> {
        let pending = Arc::new(Mutex::new(PendingAnswers::new(
            config.max_pending,
            config.max_pending_per_ip,
            prefix,
        )));
        let mut tasks = Vec::new();
        for socket in sockets {
            let v6 = socket.local_addr()?.is_ipv6();
            let unspecified: SocketAddr = if v6 {
                (Ipv6Addr::UNSPECIFIED, 0).into()
            } else {
                (Ipv4Addr::UNSPECIFIED, 0).into()
            };
            let reply = Arc::new(tokio::net::UdpSocket::from_std(
                UdpSocket::bind(unspecified).and_then(|s| {
                    s.set_nonblocking(true)?;
                    Ok(s)
                })?,
            )?);
            let group = tokio::net::UdpSocket::from_std(socket)?;
            let serving = Serving {
                routes: routes.clone(),
                reply,
                leisure: config.leisure,
                pending: pending.clone(),
            };
            tasks.push(tokio::spawn(serving.run(group)));
        }
        Ok(GroupResponder { tasks })
    }

    /// Stops serving the groups (answers still waiting for their Leisure are dropped).
    pub(crate) fn stop(&self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// What one group socket's task serves with.
struct Serving {
    routes: Routes,
    reply: Arc<tokio::net::UdpSocket>,
    leisure: Duration,
    pending: Arc<Mutex<PendingAnswers>>,
}

/// The group requests being served or waiting for their Leisure: how many in all and
/// from each address key (a key is listed only while it has some, so the table holds
/// at most `max` entries).
#[derive(Debug)]
struct PendingAnswers {
    max: usize,
    max_per_ip: usize,
    total: usize,
    per_ip: IpCounts,
}

impl PendingAnswers {
    fn new(max: usize, max_per_ip: usize, prefix: AddressPrefix) -> PendingAnswers {
        PendingAnswers {
            max,
            max_per_ip,
            total: 0,
            per_ip: IpCounts::new(prefix),
        }
    }

    /// Takes a place for a request from `ip`; false when the server or `ip`'s key has
    /// none left.
    fn take(&mut self, ip: IpAddr) -> bool {
        let held = self.per_ip.get(ip) as usize;
        if self.total >= self.max || held >= self.max_per_ip {
            return false;
        }
        self.total += 1;
        self.per_ip.add(ip);
        true
    }

    /// Gives back a place `ip` took.
    fn give_back(&mut self, ip: IpAddr) {
        if self.per_ip.get(ip) > 0 {
            self.per_ip.remove(ip);
            self.total -= 1;
        }
    }
}

/// Gives a pending place back when an answer is sent or dropped.
struct PendingPlace(Arc<Mutex<PendingAnswers>>, IpAddr);

impl Drop for PendingPlace {
    fn drop(&mut self) {
        if let Ok(mut pending) = self.0.lock() {
            pending.give_back(self.1);
        }
    }
}

impl Serving {
    async fn run(self, group: tokio::net::UdpSocket) {
        // A whole UDP datagram: a shorter buffer would cut one into another message.
        let mut buf = vec![0u8; 65536];
        let mut tree = self.routes.serve();
        loop {
            let (n, peer) = match group.recv_from(&mut buf).await {
                Ok(x) => x,
                Err(e) => {
                    tracing::debug!(error = %e, "group socket receive failed");
                    continue;
                }
            };
            let Some(message) = group_request(&buf[..n]) else {
                continue;
            };
            let placed = self.pending.lock().is_ok_and(|mut p| p.take(peer.ip()));
            if !placed {
                tracing::debug!(%peer, "group request dropped: too many pending");
                continue;
            }
            let place = PendingPlace(self.pending.clone(), peer.ip());
            let at = answer_at(Instant::now(), self.leisure, &mut rand::rng());
            tree.refresh();
            let no_response = message.options.get_uint(opt::NO_RESPONSE);
            let mut req = Request::new(peer, message.clone());
            tree.link(&mut req);
            let answer = tree.dispatch(req);
            let reply = self.reply.clone();
            let mid: u16 = rand::rng().random();
            tokio::spawn(async move {
                let _place = place;
                let answer = match answer {
                    Ok(future) => future.await,
                    Err(immediate) => immediate.into_response(),
                };
                if !answers_group(&answer, no_response) {
                    return;
                }
                tokio::time::sleep_until(at.into()).await;
                let bytes = codec::encode(&answer_message(&message, answer, mid));
                if let Err(e) = reply.send_to(&bytes, peer).await {
                    tracing::debug!(%peer, error = %e, "group answer not sent");
                }
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cobalt_proto::message::Token;
    use rand::rngs::StdRng;
    use rand::SeedableRng;

    #[test]
    fn leisure_follows_the_rfc_formula() {
        assert_eq!(leisure_for(100, 80, 8000), Duration::from_secs(1));
        assert_eq!(leisure_for(250, 100, 5000), Duration::from_secs(5));
        assert_eq!(leisure_for(100, 80, 0), Duration::from_secs(5));
        assert_eq!(GroupConfig::default().leisure, Duration::from_secs(1));
    }

    #[test]
    fn answers_wait_within_the_leisure_and_spread_over_it() {
        let now = Instant::now();
        let leisure = Duration::from_secs(2);
        let mut rng = StdRng::seed_from_u64(7);
        let times: Vec<Instant> = (0..200)
            .map(|_| answer_at(now, leisure, &mut rng))
            .collect();
        assert!(times.iter().all(|&t| t >= now && t <= now + leisure));
        assert!(times.iter().any(|&t| t < now + leisure / 4));
        assert!(times.iter().any(|&t| t > now + leisure * 3 / 4));
        assert_eq!(answer_at(now, Duration::ZERO, &mut rng), now);
    }

    #[test]
    fn errors_and_empty_content_are_suppressed_without_no_response() {
        assert!(answers_group(&Response::text("hi"), None));
        assert!(answers_group(&Response::new(Code::CHANGED), None));
        assert!(!answers_group(&Response::new(Code::CONTENT), None));
        assert!(!answers_group(&Response::new(Code::NOT_FOUND), None));
        assert!(!answers_group(
            &Response::new(Code::INTERNAL_SERVER_ERROR),
            None
        ));
    }

    #[test]
    fn no_response_decides_when_given() {
        // 0: interested in every answer, errors included.
        assert!(answers_group(&Response::new(Code::NOT_FOUND), Some(0)));
        assert!(answers_group(&Response::new(Code::CONTENT), Some(0)));
        // 2: no 2.xx.
        assert!(!answers_group(&Response::text("hi"), Some(2)));
        assert!(answers_group(&Response::new(Code::NOT_FOUND), Some(2)));
        // 8 | 16: no errors.
        assert!(!answers_group(&Response::new(Code::NOT_FOUND), Some(24)));
        assert!(!answers_group(
            &Response::new(Code::INTERNAL_SERVER_ERROR),
            Some(24)
        ));
        assert!(answers_group(&Response::text("hi"), Some(24)));
    }

    fn request(mtype: MessageType, code: Code) -> Vec<u8> {
        let mut m = Message::new(mtype, code, 9);
        m.token = Token::new(&[1, 2, 3]).unwrap();
        codec::encode(&m)
    }

    #[test]
    fn only_non_requests_are_served() {
        let served = group_request(&request(MessageType::NonConfirmable, Code::GET)).unwrap();
        assert_eq!(served.token.as_bytes(), &[1, 2, 3]);
        assert!(group_request(&request(MessageType::Confirmable, Code::GET)).is_none());
        assert!(group_request(&request(MessageType::NonConfirmable, Code::CONTENT)).is_none());
        assert!(group_request(&request(MessageType::NonConfirmable, Code::EMPTY)).is_none());
        assert!(group_request(&[0xff, 0x00]).is_none());
    }

    #[test]
    fn the_answer_is_non_with_the_request_token() {
        let req = group_request(&request(MessageType::NonConfirmable, Code::GET)).unwrap();
        let m = answer_message(&req, Response::text("hi"), 77);
        assert_eq!(m.mtype, MessageType::NonConfirmable);
        assert_eq!(m.mid, 77);
        assert_eq!(m.token, req.token);
        assert_eq!(m.payload, b"hi");
    }

    #[test]
    fn pending_answers_are_bounded_per_address_and_in_all() {
        let (a, b, c): (IpAddr, IpAddr, IpAddr) = (
            "10.0.0.1".parse().unwrap(),
            "10.0.0.2".parse().unwrap(),
            "10.0.0.3".parse().unwrap(),
        );
        let mut pending = PendingAnswers::new(3, 2, AddressPrefix::default());
        assert!(pending.take(a));
        assert!(pending.take(a));
        assert!(!pending.take(a), "a third from one address");
        assert!(pending.take(b));
        assert!(!pending.take(c), "a fourth in all");
        pending.give_back(a);
        assert!(pending.take(c));
        pending.give_back(a);
        pending.give_back(b);
        pending.give_back(c);
        assert!(pending.per_ip.is_empty());
        assert_eq!(pending.total, 0);
        // Giving back what was not taken changes nothing.
        pending.give_back(a);
        assert_eq!(pending.total, 0);
        // Addresses of one IPv6 /64 share one key.
        let mut pending = PendingAnswers::new(8, 2, AddressPrefix::default());
        let host = |h: u16| IpAddr::V6(std::net::Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, h));
        assert!(pending.take(host(1)) && pending.take(host(2)));
        assert!(!pending.take(host(3)), "the /64's third");
    }

    #[tokio::test]
    async fn groups_need_a_coap_listener() {
        let e = crate::server::Server::new()
            .join_multicast(GroupConfig::default())
            .listen(crate::Scheme::CoapTcp, "127.0.0.1:0")
            .start()
            .await
            .unwrap_err();
        assert!(e.to_string().contains("needs a coap:// listener"), "{e}");
    }

    #[test]
    fn an_unknown_interface_says_so() {
        let config = GroupConfig {
            interfaces: vec!["cbgr-nonesuch".into()],
            ..GroupConfig::default()
        };
        let e = bind_groups(&config, 0).unwrap_err();
        assert!(e.to_string().contains("cbgr-nonesuch"), "{e}");
    }
}
