//! The closed-loop load generator: one epoll loop per OS thread over that thread's share of
//! the virtual clients, each client with its own non-blocking, connected UDP socket.
//!
//! A client has at most one request in flight; nothing is ever retransmitted. In the
//! closed loop (the default) it sends the next request as soon as the previous one is
//! answered, reset, rejected as garbage, or timed out. In the open loop (`--rate`) each
//! thread has a schedule of intended send times; a due request goes out on an idle
//! client, or waits for one, and its latency is measured from its intended time, so a
//! slow server cannot hide its queueing delay (no coordinated omission). Responses are matched by MID (piggybacked ACK, RST) and token
//! (separate response); anything else on the socket is a stray or duplicate and ignored.

use crate::pacing::Pacing;
use crate::stats::{AnswerCode, Recorder};
use crate::sys::{errno, interrupted, now_ns};
use cobalt_proto::congestion::{Attempt, Controller, Params};
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Instant;

/// Byte offset of the eight-byte token in the request template.
pub(crate) const TOKEN_AT: usize = 4;
/// Token length used for every request.
pub(crate) const TOKEN_LEN: usize = 8;
/// Events fetched per `epoll_wait`.
const MAX_EVENTS: usize = 512;
/// Longest a thread sleeps in `epoll_wait` before re-checking the clock and Ctrl-C.
const MAX_WAIT_MS: u64 = 100;

/// What every thread of one step shares.
pub struct StepShared {
    /// Server address.
    pub target: SocketAddr,
    /// The encoded request: version/type/TKL=8, code, MID 0, an 8-byte token, options
    /// and payload. Each send patches in the MID and token.
    pub template: Vec<u8>,
    /// A request unanswered for this long counts as lost.
    pub timeout_ns: u64,
    /// `--cc`: retransmit on this algorithm's timers (one controller per client).
    pub cc: Option<cobalt_proto::congestion::Algorithm>,
    /// Threads that finished setting up their sockets (successfully or not).
    pub ready: AtomicUsize,
    /// Set by the coordinator once `measure_start_ns` and `end_ns` are published.
    pub go: AtomicBool,
    /// Start of the measured window (absolute `now_ns`), after the warm-up.
    pub measure_start_ns: AtomicU64,
    /// End of the step (absolute `now_ns`).
    pub end_ns: AtomicU64,
    /// Set by a thread whose setup failed, so that the others stop at once.
    pub abort: AtomicBool,
    /// Completed (2.xx) requests so far (warm-up included), for progress output.
    pub progress: AtomicU64,
    /// Other answers (4.xx, 5.xx, ...) so far, for progress output.
    pub progress_other: AtomicU64,
    /// Set to end the step early (besides Ctrl-C), e.g. when a coordinator goes away.
    pub stop: std::sync::Arc<AtomicBool>,
}

impl StepShared {
    /// True when the step must end now: Ctrl-C or an explicit stop.
    #[inline]
    pub fn stopping(&self) -> bool {
        interrupted() || self.stop.load(Ordering::Relaxed)
    }
}

/// Runs one thread's share (`clients` virtual clients) of a step: opens the sockets,
/// reports `ready`, waits for `go`, then runs the epoll loop until the step ends.
///
/// `interval_ns` selects the open loop: one request every `interval_ns` nanoseconds
/// from this thread.
pub fn run_thread(
    shared: &StepShared,
    clients: usize,
    seed: u64,
    interval_ns: Option<u64>,
) -> Result<Recorder, String> {
    let setup = Worker::new(shared, clients, seed, interval_ns);
    if setup.is_err() {
        shared.abort.store(true, Ordering::SeqCst);
    }
    shared.ready.fetch_add(1, Ordering::SeqCst);
    while !shared.go.load(Ordering::SeqCst) {
        std::thread::sleep(std::time::Duration::from_micros(200));
    }
    let mut worker = setup?;
    worker.run();
    Ok(worker.rec)
}

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

/// One virtual client.
struct Client {
    sock: UdpSocket,
    /// `--cc` state.
    retx: Option<Retransmit>,
    mid: u16,
    token: [u8; TOKEN_LEN],
    sent_at: u64,
    /// When the request was meant to be sent: `sent_at` in the closed loop, its slot in
    /// the schedule in the open loop. Latency is measured from here.
    intended: u64,
    outstanding: bool,
}

/// The epoll file descriptor, closed on drop.
struct Epoll(i32);

impl Drop for Epoll {
    fn drop(&mut self) {
        // SAFETY: we own this descriptor and close it once.
        unsafe { libc::close(self.0) };
    }
}

struct Worker<'a> {
    shared: &'a StepShared,
    clients: Vec<Client>,
    epoll: Epoll,
    sbuf: Vec<u8>,
    rbuf: Vec<u8>,
    rng: u64,
    rec: Recorder,
    measure_start: u64,
    end: u64,
    /// Closed- or open-loop schedule.
    pacing: Pacing,
}

/// `epoll_wait` with a nanosecond timeout: `epoll_pwait2` where the kernel has it
/// (Linux 5.11+), millisecond `epoll_wait` otherwise.
pub(crate) struct Waiter {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    pwait2: bool,
}

impl Waiter {
    pub(crate) fn new() -> Waiter {
        Waiter {
            #[cfg(all(target_os = "linux", target_env = "gnu"))]
            pwait2: true,
        }
    }

    /// Waits up to `timeout_ns`; returns the number of ready events (0 on timeout or
    /// signal).
    pub(crate) fn wait(
        &mut self,
        epfd: i32,
        events: &mut [libc::epoll_event],
        timeout_ns: u64,
    ) -> usize {
        let max = events.len().min(i32::MAX as usize) as i32;
        #[cfg(all(target_os = "linux", target_env = "gnu"))]
        if self.pwait2 {
            let ts = libc::timespec {
                tv_sec: (timeout_ns / 1_000_000_000) as libc::time_t,
                tv_nsec: (timeout_ns % 1_000_000_000) as libc::c_long,
            };
            // SAFETY: `events` has `max` writable entries; `ts` outlives the call; a null
            // sigmask means "do not change it".
            let n = unsafe {
                libc::epoll_pwait2(epfd, events.as_mut_ptr(), max, &ts, std::ptr::null())
            };
            if n >= 0 {
                return n as usize;
            }
            if errno() != libc::ENOSYS {
                return 0;
            }
            self.pwait2 = false;
        }
        let ms = timeout_ns.div_ceil(1_000_000).min(i32::MAX as u64) as i32;
        // SAFETY: `events` has `max` writable entries.
        let n = unsafe { libc::epoll_wait(epfd, events.as_mut_ptr(), max, ms) };
        n.max(0) as usize
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

impl<'a> Worker<'a> {
    fn new(
        shared: &'a StepShared,
        n: usize,
        seed: u64,
        interval: Option<u64>,
    ) -> Result<Worker<'a>, String> {
        // SAFETY: epoll_create1 has no pointer arguments.
        let efd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if efd < 0 {
            return Err(format!(
                "epoll_create1 failed: {}",
                std::io::Error::last_os_error()
            ));
        }
        let epoll = Epoll(efd);
        let bind: SocketAddr = if shared.target.is_ipv4() {
            "0.0.0.0:0".parse().expect("literal address")
        } else {
            "[::]:0".parse().expect("literal address")
        };
        let mut rng = seed;
        let mut clients = Vec::with_capacity(n);
        for i in 0..n {
            let sock = UdpSocket::bind(bind).map_err(|e| socket_error(e, i, n))?;
            sock.connect(shared.target)
                .map_err(|e| format!("cannot connect to {}: {e}", shared.target))?;
            sock.set_nonblocking(true)
                .map_err(|e| format!("cannot make socket non-blocking: {e}"))?;
            let mut ev = libc::epoll_event {
                events: (libc::EPOLLIN | libc::EPOLLERR) as u32,
                u64: i as u64,
            };
            // SAFETY: both descriptors are open and `ev` is a valid event.
            if unsafe { libc::epoll_ctl(efd, libc::EPOLL_CTL_ADD, sock.as_raw_fd(), &mut ev) } != 0
            {
                return Err(socket_error(std::io::Error::last_os_error(), i, n));
            }
            clients.push(Client {
                sock,
                retx: shared.cc.map(|a| Retransmit {
                    ctl: a.controller(Params::default(), Instant::now()),
                    attempt: None,
                    due: u64::MAX,
                }),
                mid: splitmix(&mut rng) as u16,
                token: [0; TOKEN_LEN],
                sent_at: 0,
                intended: 0,
                outstanding: false,
            });
        }
        Ok(Worker {
            shared,
            clients,
            epoll,
            sbuf: shared.template.clone(),
            rbuf: vec![0; 65536],
            rng,
            rec: Recorder::new(),
            measure_start: 0,
            end: 0,
            pacing: Pacing::new(interval),
        })
    }

    #[inline]
    fn in_window(&self, t: u64) -> bool {
        t >= self.measure_start && t < self.end
    }

    fn run(&mut self) {
        self.measure_start = self.shared.measure_start_ns.load(Ordering::SeqCst);
        self.end = self.shared.end_ns.load(Ordering::SeqCst);
        let timeout = self.shared.timeout_ns;
        // Scan for timeouts often enough to be within 5% of the timeout (1–50 ms).
        let mut scan_every = (timeout / 20).clamp(1_000_000, 50_000_000);
        if self.shared.cc.is_some() {
            // Retransmission timers within 5 ms.
            scan_every = scan_every.min(5_000_000);
        }
        let mut events = vec![libc::epoll_event { events: 0, u64: 0 }; MAX_EVENTS];
        let start = now_ns();
        for i in self.pacing.start(self.clients.len(), start) {
            self.send_request(i, start, start);
        }
        self.dispatch(start);
        let mut next_scan = start + scan_every;
        let (mut reported, mut reported_other) = (0u64, 0u64);
        let (mut done, mut other) = (0u64, 0u64);
        let mut waiter = Waiter::new();
        loop {
            let now = now_ns();
            if now >= self.end || self.shared.stopping() {
                break;
            }
            if now >= next_scan {
                self.expire(now, timeout);
                next_scan = now + scan_every;
            }
            self.dispatch(now);
            let mut wake = next_scan.min(self.end);
            if let Some(due) = self.pacing.wake() {
                wake = wake.min(due);
            }
            let wait_ns = wake.saturating_sub(now).min(MAX_WAIT_MS * 1_000_000);
            let n = waiter.wait(self.epoll.0, &mut events, wait_ns);
            if n == 0 {
                continue; // timeout, or EINTR from Ctrl-C
            }
            let t_rx = now_ns();
            for ev in &events[..n] {
                let idx = ev.u64 as usize;
                if idx >= self.clients.len() {
                    continue;
                }
                match self.on_readable(idx, t_rx) {
                    Some(true) => done += 1,
                    Some(false) => other += 1,
                    None => {}
                }
            }
            if done != reported {
                self.shared
                    .progress
                    .fetch_add(done - reported, Ordering::Relaxed);
                reported = done;
            }
            if other != reported_other {
                self.shared
                    .progress_other
                    .fetch_add(other - reported_other, Ordering::Relaxed);
                reported_other = other;
            }
        }
    }

    /// Open loop: sends every request that is due, as long as there are idle clients.
    fn dispatch(&mut self, now: u64) {
        while let Some((i, due)) = self.pacing.next_due(now) {
            self.send_request(i, now, due);
        }
    }

    /// Called when client `i`'s exchange is over: in the closed loop it sends the next
    /// request at once, in the open loop it waits for the schedule.
    fn finish(&mut self, i: usize, now: u64) {
        self.clients[i].outstanding = false;
        if self.pacing.release(i) {
            self.send_request(i, now, now);
        } else {
            self.dispatch(now);
        }
    }

    /// Counts timed-out requests as lost and starts fresh ones; under `--cc`
    /// retransmits those whose timer expired, until their last timer runs out.
    fn expire(&mut self, now: u64, timeout: u64) {
        for i in 0..self.clients.len() {
            let c = &mut self.clients[i];
            if !c.outstanding {
                continue;
            }
            let timed_out = now.saturating_sub(c.sent_at) >= timeout;
            let mut give_up = timed_out;
            if let Some(r) = c.retx.as_mut().filter(|r| now >= r.due && !timed_out) {
                match r.attempt.as_mut() {
                    Some(a) if a.retransmissions < MAX_RETRANSMIT => {
                        r.ctl.next_timeout(Instant::now(), a);
                        r.due = now + a.timeout.as_nanos() as u64;
                        self.transmit(i);
                    }
                    _ => give_up = true,
                }
            }
            if give_up {
                if self.in_window(now) {
                    self.rec.lost += 1;
                }
                if let Some(r) = self.clients[i].retx.as_mut() {
                    if let Some(a) = r.attempt.take() {
                        r.ctl.on_abandon(Instant::now(), &a);
                    }
                }
                self.finish(i, now);
            }
        }
    }

    /// Under `--cc`, tells client `i`'s controller that its request was answered.
    fn answered(&mut self, i: usize) {
        if let Some(r) = self.clients[i].retx.as_mut() {
            if let Some(a) = r.attempt.take() {
                r.ctl.on_answer(Instant::now(), &a);
            }
        }
    }

    /// Sends client `i`'s current request (its MID and token); false if the socket
    /// refused it.
    fn transmit(&mut self, i: usize) -> bool {
        let c = &self.clients[i];
        self.sbuf[2..4].copy_from_slice(&c.mid.to_be_bytes());
        self.sbuf[TOKEN_AT..TOKEN_AT + TOKEN_LEN].copy_from_slice(&c.token);
        // SAFETY: the socket is open and `sbuf` is a valid buffer of that length.
        let r = unsafe {
            libc::send(
                c.sock.as_raw_fd(),
                self.sbuf.as_ptr().cast(),
                self.sbuf.len(),
                0,
            )
        };
        r >= 0
    }

    /// Sends a fresh request (new MID and token) from client `i`; `intended` is when it
    /// was meant to go out.
    fn send_request(&mut self, i: usize, now: u64, intended: u64) {
        let token = splitmix(&mut self.rng).to_ne_bytes();
        let c = &mut self.clients[i];
        c.mid = c.mid.wrapping_add(1);
        c.token = token;
        let t = now_ns().max(now);
        c.sent_at = t;
        c.intended = intended.min(t);
        c.outstanding = true;
        if let Some(r) = c.retx.as_mut() {
            let a = r
                .ctl
                .first_timeout(Instant::now(), 0, &mut SplitMix(&mut self.rng));
            r.due = t + a.timeout.as_nanos() as u64;
            r.attempt = Some(a);
        }
        let sent = self.transmit(i);
        let counted = self.in_window(t);
        if counted {
            self.rec.sent += 1;
        }
        if !sent && counted {
            // E.g. a pending ICMP error (ECONNREFUSED) or a full buffer: the request is
            // not on the wire and will count as lost at its timeout.
            self.rec.errors += 1;
        }
    }

    /// Sends a 4-byte empty message (ACK) with `mid` on client `i`'s socket.
    fn send_empty_ack(&self, i: usize, mid: u16) {
        let m = mid.to_be_bytes();
        let buf = [0x60u8, 0x00, m[0], m[1]];
        // SAFETY: open socket, 4-byte stack buffer. A failure only means the server
        // retransmits its CON response, which is then a duplicate and ignored.
        unsafe { libc::send(self.clients[i].sock.as_raw_fd(), buf.as_ptr().cast(), 4, 0) };
    }

    /// Reads one datagram (or pending socket error) of client `i`, received at `t_rx`;
    /// when it answered the outstanding request, returns whether with a success (2.xx).
    fn on_readable(&mut self, i: usize, t_rx: u64) -> Option<bool> {
        let fd = self.clients[i].sock.as_raw_fd();
        // SAFETY: `rbuf` is a writable buffer of the given length.
        let n = unsafe { libc::recv(fd, self.rbuf.as_mut_ptr().cast(), self.rbuf.len(), 0) };
        if n < 0 {
            let e = errno();
            if e != libc::EAGAIN
                && e != libc::EWOULDBLOCK
                && e != libc::EINTR
                && self.in_window(t_rx)
            {
                // ICMP unreachable and friends: the request stays outstanding until its
                // timeout, where it counts as lost.
                self.rec.errors += 1;
            }
            return None;
        }
        let c = &self.clients[i];
        match classify(&self.rbuf[..n as usize], c.mid, &c.token, c.outstanding) {
            Reply::Response { ack_mid, code } => {
                if let Some(mid) = ack_mid {
                    self.send_empty_ack(i, mid);
                }
                self.answered(i);
                let code = AnswerCode::Coap(code);
                if self.in_window(t_rx) {
                    let intended = self.clients[i].intended;
                    self.rec.answer(code, t_rx.saturating_sub(intended));
                }
                self.finish(i, t_rx);
                return Some(code.is_success());
            }
            Reply::Reset => {
                self.answered(i);
                if self.in_window(t_rx) {
                    self.rec.resets += 1;
                }
                self.finish(i, t_rx);
            }
            Reply::Garbage => {
                if self.in_window(t_rx) {
                    self.rec.errors += 1;
                }
                if self.clients[i].outstanding {
                    self.finish(i, t_rx);
                }
            }
            Reply::Stray { ack_mid } => {
                if let Some(mid) = ack_mid {
                    self.send_empty_ack(i, mid);
                }
            }
            Reply::Ignore => {}
        }
        None
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
