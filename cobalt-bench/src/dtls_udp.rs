//! `coaps://` on the shared engine ([`crate::engine`]), with the I/O of `coap://`
//! ([`crate::client`]): each virtual client has its own connected UDP socket and one
//! DTLS session (the library's sans-IO [`OpensslDtls`], which does every record's
//! cryptography), and each thread moves all its clients' records with io_uring (one
//! system call per loop) or epoll, exactly as the `coap://` generator moves its
//! datagrams. So a `coaps://` and a `coap://` run differ only by the records'
//! protection, and a server's CPU per request compares like with like.
//!
//! The handshakes (cookie exchange included) run during set-up, all of a thread's
//! at once. The CoAP side is the `coap://` one ([`Coap`]): the same requests,
//! matching and acknowledgements, the plaintext going through the client's session
//! on its way out and in. A session that ends (an alert, close_notify) counts as an
//! error, and the client's next request starts a new handshake (carried by the
//! records that come back; its flights are not retransmitted, so a lost one leaves
//! that client's requests to time out). `--new-session` runs use the `session`
//! module instead. `--cc` retransmissions are not offered over DTLS.

use crate::client::{open_sockets, send_now, Coap, Io, Udp};
use crate::engine::{self, Exchanges, Generator, StepShared};
use crate::poll::Received;
use crate::stats::Recorder;
use crate::StepError;
use cobalt::transport::credentials::ClientCredentials;
use cobalt::transport::dtls::{DtlsBackend, DtlsConfig, DtlsEvent, OpensslDtls};
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::{AsRawFd, RawFd};
use std::time::{Duration, Instant};

/// Set-up (all the thread's handshakes) gets at least this long.
const MIN_SETUP_TIME: Duration = Duration::from_secs(10);

/// Runs one thread's share (`clients` virtual clients, numbered from `first_client`)
/// of a `coaps://` step on the engine, authenticating with `auth`, over `io`, with at
/// most `in_flight` handshakes under way at once during set-up (the server's budget
/// per address, see [`crate::session::HANDSHAKES_IN_FLIGHT`]). A handshake that fails
/// is the server's (or the network's) doing.
pub(crate) fn run_thread(
    shared: &StepShared,
    auth: &ClientCredentials,
    (first_client, clients): (usize, usize),
    seed: u64,
    (interval_ns, in_flight): (Option<u64>, usize),
    io: Io,
) -> Result<Recorder, StepError> {
    let mut refused = None;
    let run = engine::run_thread(shared, interval_ns, || {
        let socks = open_sockets(shared.target, clients)?;
        let fds: Vec<RawFd> = socks.iter().map(|s| s.as_raw_fd()).collect();
        let limit = Duration::from_nanos(shared.timeout_ns).max(MIN_SETUP_TIME);
        let deadline = Instant::now() + limit;
        let mut sessions = handshakes(shared.target, auth, &fds, in_flight, deadline)
            .inspect_err(|e| refused = Some(StepError::network(e.clone())))?;
        let coap = Coap::new(shared, fds.clone(), first_client, seed);
        // The size of a request's record, for io_uring's send slots: one request
        // protected (its sequence number is skipped; DTLS allows gaps).
        let record_len = sessions.first_mut().map_or(0, |s| {
            s.encrypt(Instant::now(), shared.target, &shared.template);
            s.poll_transmit().map_or(0, |t| t.bytes.len())
        });
        let udp = Udp::open(io, fds.clone(), record_len)?;
        Ok(DtlsClients {
            udp,
            coap,
            sessions,
            fds,
            target: shared.target,
            plain: Vec::new(),
            heard: Vec::new(),
            _socks: socks,
        })
    });
    match (run, refused) {
        (Err(_), Some(refused)) => Err(refused),
        (run, _) => run.map_err(StepError::from),
    }
}

/// One DTLS client table (of one session) per socket in `fds`, each handshaken with
/// `target` before `deadline`, `in_flight` at a time.
fn handshakes(
    target: SocketAddr,
    auth: &ClientCredentials,
    fds: &[RawFd],
    in_flight: usize,
    deadline: Instant,
) -> Result<Vec<OpensslDtls>, String> {
    let config = DtlsConfig {
        max_sessions: 1,
        handshake_timeout: deadline.saturating_duration_since(Instant::now()),
        ..DtlsConfig::default()
    };
    let mut sessions = Vec::with_capacity(fds.len());
    for _ in fds {
        let s = OpensslDtls::client_with(auth, config.clone())
            .map_err(|e| format!("cannot set up DTLS with these credentials: {e}"))?;
        sessions.push(s);
    }
    let mut connected = vec![false; fds.len()];
    let mut started = 0;
    let mut buf = vec![0u8; 65536];
    loop {
        let under_way = started - connected.iter().filter(|c| **c).count();
        for s in sessions
            .iter_mut()
            .skip(started)
            .take(in_flight.max(1).saturating_sub(under_way))
        {
            s.connect(Instant::now(), target);
            started += 1;
        }
        let mut waiting = Vec::new();
        for (i, s) in sessions.iter_mut().enumerate().take(started) {
            while let Some(t) = s.poll_transmit() {
                send_now(fds[i], &t.bytes);
            }
            while let Some(ev) = s.poll_event() {
                match ev {
                    DtlsEvent::Connected { .. } => connected[i] = true,
                    DtlsEvent::HandshakeFailed { reason, .. }
                    | DtlsEvent::Closed { reason, .. } => {
                        return Err(format!("DTLS handshake with {target} failed: {reason}"))
                    }
                }
            }
            if !connected[i] {
                waiting.push(i);
            }
        }
        if waiting.is_empty() && started == sessions.len() {
            return Ok(sessions);
        }
        if waiting.is_empty() {
            continue; // start the next ones
        }
        let now = Instant::now();
        if now >= deadline {
            return Err(format!(
                "{} of {} DTLS handshakes with {target} unfinished before the set-up \
                 deadline: is a coaps:// server listening there, and does it know this PSK \
                 identity or certificate?",
                waiting.len(),
                fds.len()
            ));
        }
        let next = waiting
            .iter()
            .filter_map(|&i| sessions[i].poll_timeout())
            .min()
            .map_or(deadline, |t| t.min(deadline));
        let wait_ms = next
            .saturating_duration_since(now)
            .as_millis()
            .clamp(1, 100) as i32;
        let mut pollfds: Vec<libc::pollfd> = waiting
            .iter()
            .map(|&i| libc::pollfd {
                fd: fds[i],
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
        // SAFETY: `pollfds` is a valid array of that many entries.
        unsafe { libc::poll(pollfds.as_mut_ptr(), pollfds.len() as libc::nfds_t, wait_ms) };
        let now = Instant::now();
        for (k, &i) in waiting.iter().enumerate() {
            if pollfds[k].revents != 0 {
                loop {
                    // SAFETY: `buf` is a writable buffer of the given length.
                    let r = unsafe {
                        libc::recv(
                            fds[i],
                            buf.as_mut_ptr().cast(),
                            buf.len(),
                            libc::MSG_DONTWAIT,
                        )
                    };
                    if r < 0 {
                        break;
                    }
                    sessions[i].handle_datagram(now, target, &buf[..r as usize]);
                }
            }
            if sessions[i].poll_timeout().is_some_and(|t| t <= now) {
                sessions[i].handle_timeout(now);
            }
        }
    }
}

/// The `coaps://` clients of one thread: their CoAP state, sessions and I/O.
struct DtlsClients {
    udp: Udp,
    coap: Coap,
    sessions: Vec<OpensslDtls>,
    fds: Vec<RawFd>,
    target: SocketAddr,
    /// Datagrams decrypted from one record datagram (reused).
    plain: Vec<Vec<u8>>,
    /// Clients that received records in the last wait (their sessions may have
    /// records to send back).
    heard: Vec<usize>,
    /// The sockets, closed last (after the I/O that uses their descriptors).
    _socks: Vec<UdpSocket>,
}

impl DtlsClients {
    /// Sends the records client `i`'s session has queued; false if one did not go out.
    fn flush(&mut self, i: usize) -> bool {
        let mut sent = true;
        while let Some(t) = self.sessions[i].poll_transmit() {
            sent &= self.udp.send(i, self.fds[i], &t.bytes);
        }
        sent
    }

    /// Protects and sends the empty ACKs and RSTs the CoAP side owes.
    fn send_acks(&mut self) {
        let now = Instant::now();
        let owed: Vec<(usize, [u8; 4])> = self
            .coap
            .acks
            .drain(..)
            .map(|(i, mid)| (i, 0x60u8, mid))
            .chain(self.coap.resets.drain(..).map(|(i, mid)| (i, 0x70u8, mid)))
            .map(|(i, first, mid)| {
                let m = mid.to_be_bytes();
                (i, [first, 0x00, m[0], m[1]])
            })
            .collect();
        for (i, message) in owed {
            self.sessions[i].encrypt(now, self.target, &message);
            // A failure only means the server retransmits (then a duplicate, ignored).
            self.flush(i);
        }
    }
}

impl Generator for DtlsClients {
    fn clients(&self) -> usize {
        self.sessions.len()
    }

    /// Protects and sends a fresh request (new MID and token) from client `i`.
    fn start(&mut self, i: usize, t: u64) -> Result<bool, String> {
        self.coap.next_request(i, t);
        let request = self.coap.request(i);
        self.sessions[i].encrypt(Instant::now(), self.target, request);
        Ok(self.flush(i))
    }

    fn lost(&mut self, _i: usize) {}

    fn poll(&mut self, wait_ns: u64, ex: &mut Exchanges) -> Result<(), String> {
        let (coap, sessions, plain, heard, target) = (
            &mut self.coap,
            &mut self.sessions,
            &mut self.plain,
            &mut self.heard,
            self.target,
        );
        self.udp.wait(wait_ns, |i, what, t| {
            let Received::Datagram(records) = what else {
                return coap.on_received(i, what, t, ex);
            };
            let Some(session) = sessions.get_mut(i) else {
                return;
            };
            plain.extend(session.handle_datagram(Instant::now(), target, records));
            heard.push(i);
            for d in plain.drain(..) {
                coap.on_received(i, Received::Datagram(&d), t, ex);
            }
            while let Some(ev) = session.poll_event() {
                if !matches!(ev, DtlsEvent::Connected { .. }) {
                    // Closed by an alert or close_notify: its next requests go nowhere.
                    ex.error(t);
                }
            }
        })?;
        self.send_acks();
        // Records the sessions answered on their own (a resent Finished, alerts).
        let mut heard = std::mem::take(&mut self.heard);
        for i in heard.drain(..) {
            self.flush(i);
        }
        self.heard = heard;
        Ok(())
    }
}
