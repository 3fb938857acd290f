//! The `coap://` load generator on the shared engine ([`crate::engine`]): each virtual
//! client has its own non-blocking UDP socket connected to the server, and each thread
//! moves its clients' datagrams either with io_uring (the default where the kernel
//! allows it: every loop hands all pending sends and one standing receive per client to
//! the kernel in one system call, and reaps what completed) or with one epoll set over
//! the sockets and a `send` and a `recv` per request (`--io epoll`, and the fallback).
//!
//! A client has at most one request in flight; nothing is retransmitted unless `--cc`
//! asks for it. Responses are matched by MID (piggybacked ACK, RST) and token (separate
//! response, which is acknowledged); anything else on the socket is a stray or
//! duplicate and ignored.

use crate::engine::{self, Exchanges, Generator, StepShared};
use crate::poll::{Epoll, Received, Waiter};
use crate::stats::{AnswerCode, Recorder};
use crate::sys::{errno, now_ns};
use crate::uring::UringUdp;
use cobalt_proto::congestion::{Attempt, Controller, Params};
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::{AsRawFd, RawFd};
use std::time::Instant;

/// Byte offset of the eight-byte token in the request template.
pub(crate) const TOKEN_AT: usize = 4;
/// Token length used for every request.
pub(crate) const TOKEN_LEN: usize = 8;
/// Events fetched per `epoll_wait`.
const MAX_EVENTS: usize = 512;

/// `--cc`: a client's congestion controller and the timing of its outstanding request.
struct Retransmit {
    ctl: Box<dyn Controller>,
    attempt: Option<Attempt>,
    /// When the running timer expires (`now_ns` clock).
    due: u64,
}

/// Retransmissions of one request under `--cc` (RFC 7252's MAX_RETRANSMIT).
const MAX_RETRANSMIT: u32 = 4;

/// Adapts the worker's splitmix generator to the controllers' random source.
struct SplitMix<'a>(&'a mut u64);

impl rand::RngCore for SplitMix<'_> {
    fn next_u32(&mut self) -> u32 {
        splitmix(self.0) as u32
    }
    fn next_u64(&mut self) -> u64 {
        splitmix(self.0)
    }
    fn fill_bytes(&mut self, dst: &mut [u8]) {
        for chunk in dst.chunks_mut(8) {
            let v = splitmix(self.0).to_ne_bytes();
            chunk.copy_from_slice(&v[..chunk.len()]);
        }
    }
}

/// Next value of a splitmix64 generator: fast and good enough for unpredictable tokens.
#[inline]
pub(crate) fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Turns an OS error while opening sockets into an actionable message.
fn socket_error(e: std::io::Error, opened: usize, wanted: usize) -> String {
    if e.raw_os_error() == Some(libc::EMFILE) || e.raw_os_error() == Some(libc::ENFILE) {
        format!(
            "out of file descriptors after opening {opened} of {wanted} client sockets ({e}); \
             raise the limit with `ulimit -n` (see `ulimit -Hn` for the hard limit)"
        )
    } else {
        format!("cannot open client socket {}: {e}", opened + 1)
    }
}

/// Which I/O the CoAP-over-UDP generator uses (`--io`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Io {
    /// io_uring where the kernel allows it (and a thread has at most
    /// [`AUTO_URING_MAX_CLIENTS`] clients), else epoll.
    #[default]
    Auto,
    /// io_uring: the sends and receives of all of a thread's clients go to the kernel
    /// in one system call per loop; fails where io_uring is unavailable.
    Uring,
    /// One epoll set over the clients' sockets, one `send` and one `recv` per request.
    Epoll,
}

/// With [`Io::Auto`], threads with more clients than this use epoll (io_uring keeps a
/// 4 KiB receive buffer per client).
pub const AUTO_URING_MAX_CLIENTS: usize = 16_384;

/// Runs one thread's share (`clients` virtual clients, numbered from `first_client`)
/// of a `coap://` step on the shared engine ([`crate::engine::run_thread`]), over `io`.
pub(crate) fn run_thread(
    shared: &StepShared,
    (first_client, clients): (usize, usize),
    seed: u64,
    interval_ns: Option<u64>,
    io: Io,
) -> Result<Recorder, String> {
    engine::run_thread(shared, interval_ns, || {
        let socks = open_sockets(shared.target, clients)?;
        let fds: Vec<RawFd> = socks.iter().map(|s| s.as_raw_fd()).collect();
        let udp = Udp::open(io, fds.clone(), shared.template.len())?;
        let coap = Coap::new(shared, fds, first_client, seed);
        Ok(CoapClients {
            udp,
            coap,
            cc: shared.cc.is_some(),
            _socks: socks,
        })
    })
}

/// Opens `n` non-blocking UDP sockets connected to `target`.
pub(crate) fn open_sockets(target: SocketAddr, n: usize) -> Result<Vec<UdpSocket>, String> {
    let bind: SocketAddr = if target.is_ipv4() {
        "0.0.0.0:0".parse().expect("literal address")
    } else {
        "[::]:0".parse().expect("literal address")
    };
    let mut socks = Vec::with_capacity(n);
    for i in 0..n {
        let sock = UdpSocket::bind(bind).map_err(|e| socket_error(e, i, n))?;
        sock.connect(target)
            .map_err(|e| format!("cannot connect to {target}: {e}"))?;
        sock.set_nonblocking(true)
            .map_err(|e| format!("cannot make socket non-blocking: {e}"))?;
        socks.push(sock);
    }
    Ok(socks)
}

/// One virtual client's CoAP state.
struct Client {
    /// `--cc` state.
    retx: Option<Retransmit>,
    mid: u16,
    token: [u8; TOKEN_LEN],
}

/// The CoAP side of one thread's clients, apart from their I/O.
pub(crate) struct Coap {
    fds: Vec<RawFd>,
    clients: Vec<Client>,
    /// The request template, patched with a client's MID and token before each send.
    sbuf: Vec<u8>,
    /// Where each client writes its number into `sbuf` (see
    /// [`crate::engine::CLIENT_PLACEHOLDER`]).
    client_field: Option<usize>,
    /// The number of this thread's first client.
    first_client: usize,
    rng: u64,
    /// Empty ACKs owed (client, MID), sent after the datagrams of one wait.
    pub(crate) acks: Vec<(usize, u16)>,
    /// RSTs owed to pings (client, MID), sent with the ACKs.
    pub(crate) resets: Vec<(usize, u16)>,
}

impl Coap {
    /// The CoAP state of the clients on the sockets `fds` (numbered from
    /// `first_client`), with MIDs and tokens drawn from `seed`.
    pub(crate) fn new(
        shared: &StepShared,
        fds: Vec<RawFd>,
        first_client: usize,
        seed: u64,
    ) -> Coap {
        let mut rng = seed;
        let clients = fds
            .iter()
            .map(|_| Client {
                retx: shared.cc.map(|a| Retransmit {
                    ctl: a.controller(Params::default(), Instant::now()),
                    attempt: None,
                    due: u64::MAX,
                }),
                mid: splitmix(&mut rng) as u16,
                token: [0; TOKEN_LEN],
            })
            .collect();
        Coap {
            fds,
            clients,
            sbuf: shared.template.clone(),
            client_field: shared.client_field,
            first_client,
            rng,
            acks: Vec::new(),
            resets: Vec::new(),
        }
    }

    /// Gives client `i` a fresh request (next MID, new token); under `--cc` starts
    /// its retransmission timer at `t`.
    pub(crate) fn next_request(&mut self, i: usize, t: u64) {
        let token = splitmix(&mut self.rng).to_ne_bytes();
        let c = &mut self.clients[i];
        c.mid = c.mid.wrapping_add(1);
        c.token = token;
        if let Some(r) = c.retx.as_mut() {
            let a = r
                .ctl
                .first_timeout(Instant::now(), 0, &mut SplitMix(&mut self.rng));
            r.due = t + a.timeout.as_nanos() as u64;
            r.attempt = Some(a);
        }
    }

    /// Client `i`'s current request (its MID and token) in `sbuf`.
    pub(crate) fn request(&mut self, i: usize) -> &[u8] {
        let c = &self.clients[i];
        self.sbuf[2..4].copy_from_slice(&c.mid.to_be_bytes());
        self.sbuf[TOKEN_AT..TOKEN_AT + TOKEN_LEN].copy_from_slice(&c.token);
        if let Some(at) = self.client_field {
            engine::write_client_number(&mut self.sbuf[at..], self.first_client + i);
        }
        &self.sbuf
    }

    /// Under `--cc`, tells client `i`'s controller that its request was answered.
    fn answered(&mut self, i: usize) {
        if let Some(r) = self.clients[i].retx.as_mut() {
            if let Some(a) = r.attempt.take() {
                r.ctl.on_answer(Instant::now(), &a);
            }
        }
    }

    /// Handles what client `i`'s socket delivered at `t`.
    pub(crate) fn on_received(&mut self, i: usize, what: Received<'_>, t: u64, ex: &mut Exchanges) {
        let d = match what {
            Received::Datagram(d) => d,
            // ICMP unreachable and friends, or a send that failed: the request stays
            // outstanding until its timeout, where it counts as lost.
            Received::Error => return ex.error(t),
        };
        let Some(c) = self.clients.get(i) else {
            return;
        };
        match classify(d, c.mid, &c.token, ex.outstanding(i)) {
            Reply::Response { ack_mid, code } => {
                if let Some(mid) = ack_mid {
                    self.acks.push((i, mid));
                }
                self.answered(i);
                ex.answered(i, AnswerCode::Coap(code), t);
            }
            Reply::Reset => {
                self.answered(i);
                ex.reset(i, t);
            }
            Reply::Garbage => ex.failed(i, t),
            Reply::Stray { ack_mid } => {
                if let Some(mid) = ack_mid {
                    self.acks.push((i, mid));
                }
            }
            Reply::Ping { mid } => self.resets.push((i, mid)),
            Reply::Ignore => {}
        }
    }

    /// Sends the empty ACKs and the RSTs owed. A failure only means the server
    /// retransmits its CON response (then a duplicate, ignored) or its ping.
    fn send_acks(&mut self) {
        for (i, mid) in self.acks.drain(..) {
            let m = mid.to_be_bytes();
            send_now(self.fds[i], &[0x60u8, 0x00, m[0], m[1]]);
        }
        for (i, mid) in self.resets.drain(..) {
            let m = mid.to_be_bytes();
            send_now(self.fds[i], &[0x70u8, 0x00, m[0], m[1]]);
        }
    }
}

/// One `send` on a connected socket; false if the socket refused it.
pub(crate) fn send_now(fd: RawFd, bytes: &[u8]) -> bool {
    // SAFETY: the socket is open and `bytes` is a valid buffer of that length.
    unsafe { libc::send(fd, bytes.as_ptr().cast(), bytes.len(), 0) >= 0 }
}

/// The I/O of the UDP generator.
pub(crate) enum Udp {
    Epoll(EpollUdp),
    Uring(Box<UringUdp>),
}

impl Udp {
    /// The I/O `io` asks for over the sockets `fds`, sending datagrams of
    /// `send_len` bytes through io_uring (others with a plain `send`).
    pub(crate) fn open(io: Io, fds: Vec<RawFd>, send_len: usize) -> Result<Udp, String> {
        Ok(match io {
            Io::Epoll => Udp::Epoll(EpollUdp::new(fds)?),
            Io::Uring => Udp::Uring(Box::new(UringUdp::new(fds, send_len)?)),
            Io::Auto if fds.len() <= AUTO_URING_MAX_CLIENTS => {
                match UringUdp::new(fds.clone(), send_len) {
                    Ok(u) => Udp::Uring(Box::new(u)),
                    Err(_) => Udp::Epoll(EpollUdp::new(fds)?),
                }
            }
            Io::Auto => Udp::Epoll(EpollUdp::new(fds)?),
        })
    }

    /// Sends `bytes` from client `i` (socket `fd`); false if it did not go out.
    pub(crate) fn send(&mut self, i: usize, fd: RawFd, bytes: &[u8]) -> bool {
        match self {
            Udp::Epoll(_) => send_now(fd, bytes),
            Udp::Uring(u) => u.send(i, bytes),
        }
    }

    /// Waits up to `wait_ns` and hands what the sockets delivered to `on`.
    pub(crate) fn wait(
        &mut self,
        wait_ns: u64,
        on: impl FnMut(usize, Received<'_>, u64),
    ) -> Result<(), String> {
        match self {
            Udp::Epoll(e) => e.wait(wait_ns, on),
            Udp::Uring(u) => u.wait(wait_ns, on)?,
        }
        Ok(())
    }
}

/// One epoll set over the clients' sockets; one `recv` per readable socket.
pub(crate) struct EpollUdp {
    fds: Vec<RawFd>,
    epoll: Epoll,
    waiter: Waiter,
    events: Vec<libc::epoll_event>,
    rbuf: Vec<u8>,
}

impl EpollUdp {
    fn new(fds: Vec<RawFd>) -> Result<EpollUdp, String> {
        let epoll = Epoll::new()?;
        for (i, &fd) in fds.iter().enumerate() {
            if !epoll.set(libc::EPOLL_CTL_ADD, fd, false, i as u64) {
                return Err(socket_error(std::io::Error::last_os_error(), i, fds.len()));
            }
        }
        Ok(EpollUdp {
            fds,
            epoll,
            waiter: Waiter::new(),
            events: vec![libc::epoll_event { events: 0, u64: 0 }; MAX_EVENTS],
            rbuf: vec![0; 65536],
        })
    }

    fn wait(&mut self, wait_ns: u64, mut on: impl FnMut(usize, Received<'_>, u64)) {
        let n = self.waiter.wait(self.epoll.0, &mut self.events, wait_ns);
        if n == 0 {
            return; // timeout, or EINTR from Ctrl-C
        }
        let t = now_ns();
        for k in 0..n {
            let i = self.events[k].u64 as usize;
            let Some(&fd) = self.fds.get(i) else {
                continue;
            };
            // SAFETY: `rbuf` is a writable buffer of the given length.
            let r = unsafe { libc::recv(fd, self.rbuf.as_mut_ptr().cast(), self.rbuf.len(), 0) };
            if r >= 0 {
                on(i, Received::Datagram(&self.rbuf[..r as usize]), t);
            } else if !matches!(errno(), libc::EAGAIN | libc::EINTR) {
                on(i, Received::Error, t);
            }
        }
    }
}

/// The CoAP-over-UDP clients of one thread: their CoAP state and their I/O.
struct CoapClients {
    udp: Udp,
    coap: Coap,
    cc: bool,
    /// The sockets, closed last (after the I/O that uses their descriptors).
    _socks: Vec<UdpSocket>,
}

impl CoapClients {
    /// Sends client `i`'s current request; false if it did not go out.
    fn transmit(&mut self, i: usize) -> bool {
        let fd = self.coap.fds[i];
        let bytes = self.coap.request(i);
        self.udp.send(i, fd, bytes)
    }
}

impl Generator for CoapClients {
    fn clients(&self) -> usize {
        self.coap.clients.len()
    }

    /// Sends a fresh request (new MID and token) from client `i`.
    fn start(&mut self, i: usize, t: u64) -> Result<bool, String> {
        self.coap.next_request(i, t);
        // E.g. a pending ICMP error (ECONNREFUSED) or a full buffer: the request is
        // not on the wire and will count as lost at its timeout.
        Ok(self.transmit(i))
    }

    /// Under `--cc`, retransmits when client `i`'s timer expired, until its last
    /// timer runs out.
    fn tick(&mut self, i: usize, now: u64) -> bool {
        let Some(r) = self.coap.clients[i].retx.as_mut().filter(|r| now >= r.due) else {
            return false;
        };
        match r.attempt.as_mut() {
            Some(a) if a.retransmissions < MAX_RETRANSMIT => {
                r.ctl.next_timeout(Instant::now(), a);
                r.due = now + a.timeout.as_nanos() as u64;
                self.transmit(i);
                false
            }
            _ => true,
        }
    }

    fn lost(&mut self, i: usize) {
        if let Some(r) = self.coap.clients[i].retx.as_mut() {
            if let Some(a) = r.attempt.take() {
                r.ctl.on_abandon(Instant::now(), &a);
            }
        }
    }

    fn poll(&mut self, wait_ns: u64, ex: &mut Exchanges) -> Result<(), String> {
        let coap = &mut self.coap;
        self.udp
            .wait(wait_ns, |i, what, t| coap.on_received(i, what, t, ex))?;
        coap.send_acks();
        Ok(())
    }

    /// Retransmission timers within 5 ms under `--cc`.
    fn scan_every(&self, timeout_ns: u64) -> u64 {
        let every = (timeout_ns / 20).clamp(1_000_000, 50_000_000);
        if self.cc {
            every.min(5_000_000)
        } else {
            every
        }
    }
}

/// What a datagram means to the client that received it.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Reply {
    /// The response to the outstanding request, with its `code`; `ack_mid` is set for
    /// a CON (separate) response, which must be acknowledged.
    Response { ack_mid: Option<u16>, code: u8 },
    /// An RST for the outstanding request.
    Reset,
    /// Not a CoAP message.
    Garbage,
    /// A well-formed message for an earlier request (late, duplicate, or unknown token);
    /// CON ones are still acknowledged so that the server stops retransmitting.
    Stray { ack_mid: Option<u16> },
    /// A CoAP ping (an empty CON, RFC 7252 §4.3), e.g. a server verifying the client's
    /// address before a large answer (RFC 9175 §2.4): answered with RST.
    Ping { mid: u16 },
    /// Nothing to do (e.g. the empty ACK before a separate response).
    Ignore,
}

/// Classifies a datagram for a client whose last request had `mid` and `token` (and is
/// still unanswered when `outstanding`), without allocating and without trusting it.
pub(crate) fn classify(d: &[u8], mid: u16, token: &[u8], outstanding: bool) -> Reply {
    if d.len() < 4 || d[0] >> 6 != 1 {
        return Reply::Garbage;
    }
    let tkl = (d[0] & 0x0f) as usize;
    if tkl > 8 || d.len() < 4 + tkl {
        return Reply::Garbage;
    }
    let mtype = (d[0] >> 4) & 0b11;
    let code = d[1];
    let their_mid = u16::from_be_bytes([d[2], d[3]]);
    let is_response = code >> 5 >= 2;
    let token_ok = outstanding && &d[4..4 + tkl] == token;
    match mtype {
        0 if code == 0 => Reply::Ping { mid: their_mid },
        // ACK
        2 if their_mid == mid && outstanding => {
            if code == 0 {
                Reply::Ignore // empty ACK: a separate response follows
            } else if is_response && token_ok {
                Reply::Response {
                    ack_mid: None,
                    code,
                }
            } else {
                Reply::Stray { ack_mid: None }
            }
        }
        // RST
        3 if their_mid == mid && outstanding => Reply::Reset,
        // CON or NON response (separate response, or the answer to a NON request)
        0 | 1 if is_response => {
            let ack_mid = (mtype == 0).then_some(their_mid);
            if token_ok {
                Reply::Response { ack_mid, code }
            } else {
                Reply::Stray { ack_mid }
            }
        }
        _ => Reply::Stray { ack_mid: None },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a client expects: the MID and token of its last request, and whether it is
    /// still unanswered.
    struct Client {
        mid: u16,
        token: [u8; 8],
        outstanding: bool,
    }

    fn client(mid: u16, token: [u8; 8], outstanding: bool) -> Client {
        Client {
            mid,
            token,
            outstanding,
        }
    }

    fn classify(d: &[u8], c: &Client) -> Reply {
        super::classify(d, c.mid, &c.token, c.outstanding)
    }

    fn msg(t: u8, code: u8, mid: u16, token: &[u8]) -> Vec<u8> {
        let mut v = vec![0x40 | (t << 4) | token.len() as u8, code];
        v.extend_from_slice(&mid.to_be_bytes());
        v.extend_from_slice(token);
        v.extend_from_slice(&[0xff, b'h', b'i']);
        v
    }

    #[test]
    fn matching_rules() {
        let tok = [1, 2, 3, 4, 5, 6, 7, 8];
        let c = client(77, tok, true);
        // A ping (empty CON) from the server: answered with RST, whatever is outstanding.
        assert_eq!(
            classify(&[0x40, 0, 0x12, 0x34], &c),
            Reply::Ping { mid: 0x1234 }
        );
        // Piggybacked ACK 2.05 with same MID and token.
        assert_eq!(
            classify(&msg(2, 0x45, 77, &tok), &c),
            Reply::Response {
                ack_mid: None,
                code: 0x45
            }
        );
        // An error answer is a response too (counted by its code, not as completed).
        assert_eq!(
            classify(&msg(2, 0xa3, 77, &tok), &c),
            Reply::Response {
                ack_mid: None,
                code: 0xa3
            }
        );
        // ACK with the right MID but another token: stray.
        assert_eq!(
            classify(&msg(2, 0x45, 77, &[9; 8]), &c),
            Reply::Stray { ack_mid: None }
        );
        // ACK for an older MID: stray.
        assert_eq!(
            classify(&msg(2, 0x45, 76, &tok), &c),
            Reply::Stray { ack_mid: None }
        );
        // Empty ACK, then a CON separate response which must be acknowledged.
        assert_eq!(classify(&[0x60, 0, 0, 77], &c), Reply::Ignore);
        assert_eq!(
            classify(&msg(0, 0x45, 999, &tok), &c),
            Reply::Response {
                ack_mid: Some(999),
                code: 0x45
            }
        );
        // NON response to a NON request.
        assert_eq!(
            classify(&msg(1, 0x45, 5, &tok), &c),
            Reply::Response {
                ack_mid: None,
                code: 0x45
            }
        );
        // RST.
        assert_eq!(classify(&[0x70, 0, 0, 77], &c), Reply::Reset);
        assert_eq!(
            classify(&[0x70, 0, 0, 78], &c),
            Reply::Stray { ack_mid: None }
        );
        // Duplicate after completion.
        let done = client(77, tok, false);
        assert_eq!(
            classify(&msg(2, 0x45, 77, &tok), &done),
            Reply::Stray { ack_mid: None }
        );
        assert_eq!(
            classify(&msg(0, 0x45, 3, &tok), &done),
            Reply::Stray { ack_mid: Some(3) }
        );
    }

    #[test]
    fn garbage_is_recognised() {
        let c = client(1, [0; 8], true);
        for g in [
            &[][..],
            &[0x40, 0x45],
            &[0x80, 0x45, 0, 1],
            &[0x49, 0x45, 0, 1],
            &[0x48, 0x45, 0, 1, 0],
        ] {
            assert_eq!(classify(g, &c), Reply::Garbage, "{g:?}");
        }
    }

    #[test]
    fn splitmix_tokens_differ() {
        let mut s = 42;
        let a = splitmix(&mut s);
        let b = splitmix(&mut s);
        assert_ne!(a, b);
    }
}
