//! Address validation against amplification (RFC 9175 §2.4).
//!
//! A datagram's source address can be forged, so a server that answers a small request
//! with a large response can be made to flood a victim. Until a peer's address is
//! verified, the endpoint therefore sends in answer to a request at most
//! [`EndpointConfig::amplification_factor`] times the request's bytes, and nothing
//! unasked: no notification, no retransmission beyond that allowance.
//!
//! What does not fit waits ("is parked") while the endpoint verifies the address with
//! one round trip that every CoAP implementation answers: an empty confirmable message
//! (a CoAP ping, RFC 7252 §4.3) with a fresh message ID, which the peer must reject with
//! an RST carrying that ID. The ping is four bytes; it is retransmitted with binary
//! backoff like any confirmable message, as often as the request's allowance pays for
//! (after what the fallback below needs), at most MAX_RETRANSMIT times. The request is
//! not acknowledged meanwhile (its retransmissions are ignored), so when the RST comes
//! back the answer still goes out piggybacked on the ACK, in full, as if nothing had
//! happened but one round trip — some clients (libcoap 4.3.1) cannot take a block-wise
//! answer as a separate response. The address then stays verified for
//! [`EndpointConfig::verified_lifetime`]; every
//! ACK or RST for a confirmable message of ours, and every valid Echo option (RFC 9175:
//! stateless, a timestamp and a keyed hash), proves the address again.
//!
//! If no RST comes, a parked answer to a safe request becomes 4.01 Unauthorized with an
//! Echo option (RFC 9175 §2.4), which the client may repeat to prove its address; one
//! to any other request has had its effect, so its code and options go out without the
//! payload; each only if the request leaves room for it. A parked notification is
//! dropped. Either way the application hears [`Event::Unverified`] so it can end an
//! observation. The answer to an observe registration always waits for the address to
//! be verified, and the application hears [`Event::Verified`] when it goes out: only
//! then does the observation hold a place (an unverified, possibly forged, address
//! holds nothing beyond the exchange that answers it). A forger who tries to guess the ping's message ID has a few tries per
//! ping (further RSTs end the verification), and a peer whose verification failed is not
//! pinged again for 30 s.
//!
//! Everything here is bounded: verified addresses ([`EndpointConfig::max_verified_peers`]),
//! verifications in progress ([`EndpointConfig::max_address_probes`]), eight parked
//! messages per peer (a newer notification replaces an older one with the same token:
//! the latest state wins, RFC 7641 §4.5.2).

use super::*;
use crate::tables::shrink_when_sparse;
use std::hash::{BuildHasher, RandomState};

/// Time after a failed verification before the peer is pinged again.
const PROBE_BACKOFF: Duration = Duration::from_secs(30);
/// RSTs with a wrong message ID from a peer being verified that end the verification.
const PROBE_MISSES: u8 = 3;
/// Messages waiting for one peer's verification.
const MAX_PARKED: usize = 8;
/// How long an Echo value is accepted, in seconds.
const ECHO_LIFETIME_SECS: u32 = 60;
/// Bytes of an Echo value: four of time, eight of keyed hash.
const ECHO_LEN: usize = 12;

/// A message waiting for its peer's address to be verified.
#[derive(Debug)]
pub(super) enum Parked {
    /// The response to a request.
    Response(ParkedResponse),
    /// A notification of an observation, with its message ID already assigned.
    Notification {
        id: ExchangeId,
        token: Token,
        message: Message,
        confirmable: bool,
        replaces: Option<(ExchangeId, u16)>,
    },
}

/// A response waiting for its peer's address to be verified.
#[derive(Debug)]
pub(super) struct ParkedResponse {
    pub(super) id: ExchangeId,
    pub(super) token: Token,
    /// The request's message ID and type.
    pub(super) mid: u16,
    pub(super) con: bool,
    /// An empty ACK has been sent: the answer will be a separate response.
    pub(super) acked: bool,
    /// GET or FETCH: may be answered 4.01 with Echo and asked again.
    pub(super) safe: bool,
    /// Keep the answer for duplicates of the request (see [`ServerExchange`]).
    pub(super) remember: bool,
    /// The request registers an observation ([`Event::Verified`] when it goes out).
    pub(super) registration: bool,
    pub(super) message: Message,
    /// Bytes the request still allows to send (pings, an empty ACK, and the answer if
    /// verification fails).
    pub(super) allowance: usize,
}

impl ParkedResponse {
    /// What a duplicate of the request gets once it has been acknowledged (or, for NON,
    /// answered) other than by a piggybacked response.
    fn after_empty_ack(&self) -> Finished<'static> {
        match (self.remember, self.con) {
            (false, _) => Finished::Forget,
            (true, false) => Finished::Silent,
            (true, true) => Finished::EmptyAck,
        }
    }
}

impl Parked {
    fn id_and_token(&self) -> (ExchangeId, Token) {
        match self {
            Parked::Response(r) => (r.id, r.token.clone()),
            Parked::Notification { id, token, .. } => (*id, token.clone()),
        }
    }
}

/// A verification in progress.
#[derive(Debug)]
struct Probe {
    mid: u16,
    /// Transmissions so far, and how many are allowed.
    sends: u32,
    max_sends: u32,
    misses: u8,
    parked: Vec<Parked>,
}

/// The verification state of one endpoint.
#[derive(Debug)]
pub(super) struct Validation {
    /// Verified addresses and until when.
    verified: HashMap<SocketAddr, Instant>,
    probes: HashMap<SocketAddr, Probe>,
    /// Peers whose verification failed, and when they may be pinged again.
    backoff: HashMap<SocketAddr, Instant>,
    echo_key: RandomState,
}

impl Default for Validation {
    fn default() -> Self {
        Validation {
            verified: HashMap::new(),
            probes: HashMap::new(),
            backoff: HashMap::new(),
            echo_key: RandomState::new(),
        }
    }
}

impl Validation {
    /// Verifications in progress (for tests and metrics).
    pub(super) fn probes(&self) -> usize {
        self.probes.len()
    }

    /// Verified addresses remembered (for tests and metrics).
    pub(super) fn verified_count(&self) -> usize {
        self.verified.len()
    }

    /// Drops what has expired and gives memory back.
    fn sweep(&mut self, now: Instant) {
        self.verified.retain(|_, until| *until > now);
        self.backoff.retain(|_, until| *until > now);
        shrink_when_sparse(&mut self.verified);
        shrink_when_sparse(&mut self.backoff);
        shrink_when_sparse(&mut self.probes);
    }

    fn is_idle(&self) -> bool {
        self.verified.is_empty() && self.probes.is_empty() && self.backoff.is_empty()
    }
}

/// The encoded size of a message.
pub(super) fn encoded_len(m: &Message) -> usize {
    4 + m.token.len() + codec::options_and_payload_len(&m.options, &m.payload)
}

impl Endpoint {
    fn validating(&self) -> bool {
        self.config.amplification_factor > 0
    }

    /// True when `peer` may be sent anything: validation is off or its address is verified.
    pub fn is_verified(&self, now: Instant, peer: SocketAddr) -> bool {
        !self.validating()
            || self
                .validation
                .verified
                .get(&peer)
                .is_some_and(|until| *until > now)
    }

    /// Bytes that may still be sent in answer to a request of `request_len` bytes of
    /// which `sent` have been sent; `None` when there is no limit.
    pub(super) fn allowance(
        &self,
        now: Instant,
        peer: SocketAddr,
        request_len: usize,
        sent: usize,
    ) -> Option<usize> {
        (!self.is_verified(now, peer))
            .then(|| (self.config.amplification_factor * request_len).saturating_sub(sent))
    }

    /// Records a proof that `peer` receives at its address, and sends what waited for it.
    pub(super) fn verified(&mut self, now: Instant, peer: SocketAddr) {
        if !self.validating() {
            return;
        }
        let v = &mut self.validation;
        let until = now + self.config.verified_lifetime;
        if !v.verified.contains_key(&peer) && v.verified.len() >= self.config.max_verified_peers {
            // Forget the addresses verified longest ago (those expiring soonest).
            let keep_after = now + self.config.verified_lifetime / 2;
            v.verified.retain(|_, u| *u > keep_after);
        }
        if v.verified.len() < self.config.max_verified_peers || v.verified.contains_key(&peer) {
            v.verified.insert(peer, until);
        }
        v.backoff.remove(&peer);
        if let Some(probe) = v.probes.remove(&peer) {
            self.stats.addresses_verified += 1;
            for parked in probe.parked {
                self.release(now, peer, parked);
            }
        }
    }

    /// Holds a message until `peer` is verified, pinging it if no verification is under way.
    pub(super) fn park(&mut self, now: Instant, peer: SocketAddr, mut parked: Parked) {
        if !self.validation.probes.contains_key(&peer) {
            // Pings are paid from the request's allowance, after what the answer takes
            // if verification fails. A notification has no request: the relation's
            // registration was verified once already.
            let most = 1 + self.config.max_retransmit;
            let reserve = self
                .fallback(now, peer, &parked)
                .map_or(0, |m| encoded_len(&m));
            let sends = match &mut parked {
                Parked::Response(r) => {
                    let room = r.allowance.checked_sub(reserve).unwrap_or(r.allowance);
                    let sends = (room / 4).min(most as usize);
                    r.allowance -= 4 * sends;
                    sends as u32
                }
                Parked::Notification { .. } => most,
            };
            if !self.start_probe(now, peer, sends) {
                self.fail(now, peer, parked);
                return;
            }
        }
        let Some(probe) = self.validation.probes.get_mut(&peer) else {
            return;
        };
        let parked = match parked {
            Parked::Notification { token, message, .. }
                if probe
                    .parked
                    .iter()
                    .any(|p| matches!(p, Parked::Response(r) if r.token == token)) =>
            {
                // The registration's answer still waits: it goes out with this newer
                // state instead (it is the first notification, RFC 7641 §4.1), so the
                // client gets one answer, not an old one and a new one at once (some
                // clients are still fetching the old one's blocks when the new arrives).
                for p in &mut probe.parked {
                    if let Parked::Response(r) = p {
                        if r.token == token {
                            r.message = message;
                            break;
                        }
                    }
                }
                self.stats.parked += 1;
                return;
            }
            Parked::Notification { ref token, .. } => {
                // The latest state wins: a newer notification replaces an older one.
                probe
                    .parked
                    .retain(|p| !matches!(p, Parked::Notification { token: t, .. } if t == token));
                parked
            }
            parked => parked,
        };
        if probe.parked.len() >= MAX_PARKED {
            self.fail(now, peer, parked);
            return;
        }
        self.stats.parked += 1;
        probe.parked.push(parked);
    }

    /// Sends a ping to `peer`, to be sent at most `max_sends` times; false if none may
    /// be sent now (no allowance, bound, back-off).
    fn start_probe(&mut self, now: Instant, peer: SocketAddr, max_sends: u32) -> bool {
        let v = &self.validation;
        if max_sends == 0
            || v.backoff.get(&peer).is_some_and(|until| *until > now)
            || v.probes.len() >= self.config.max_address_probes
        {
            return false;
        }
        let mid = self.alloc_mid(now, peer);
        self.validation.probes.insert(
            peer,
            Probe {
                mid,
                sends: 1,
                max_sends,
                misses: 0,
                parked: Vec::new(),
            },
        );
        self.stats.probes_sent += 1;
        self.send_ping(now, peer, mid, self.config.ack_timeout);
        true
    }

    fn send_ping(&mut self, now: Instant, peer: SocketAddr, mid: u16, wait: Duration) {
        let ping = Message::new(MessageType::Confirmable, Code::EMPTY, mid);
        self.transmit_message(peer, &ping);
        self.timers.arm(now + wait, Timer::Probe(peer, mid));
        self.arm_housekeeping(now);
    }

    /// The ping's timer: send it once more, or give up.
    pub(super) fn on_probe_timer(&mut self, now: Instant, peer: SocketAddr, mid: u16) {
        let Some(probe) = self.validation.probes.get_mut(&peer) else {
            return;
        };
        if probe.mid != mid {
            return;
        }
        if probe.sends < probe.max_sends {
            // Binary backoff, as for any confirmable message (§4.2).
            let wait = self.config.ack_timeout * (1 << probe.sends.min(20));
            probe.sends += 1;
            self.send_ping(now, peer, mid, wait);
            return;
        }
        self.fail_probe(now, peer);
    }

    /// An RST arrived; true if it answered our ping (and verified its sender).
    pub(super) fn probe_answered(&mut self, now: Instant, peer: SocketAddr, mid: u16) -> bool {
        match self.validation.probes.get_mut(&peer) {
            Some(p) if p.mid == mid => {
                self.verified(now, peer);
                true
            }
            Some(p) => {
                p.misses += 1;
                if p.misses >= PROBE_MISSES {
                    self.fail_probe(now, peer);
                }
                false
            }
            None => false,
        }
    }

    fn fail_probe(&mut self, now: Instant, peer: SocketAddr) {
        let Some(probe) = self.validation.probes.remove(&peer) else {
            return;
        };
        self.stats.probes_failed += 1;
        self.validation.backoff.insert(peer, now + PROBE_BACKOFF);
        for parked in probe.parked {
            self.fail(now, peer, parked);
        }
    }

    /// Sends a parked message now that its peer is verified.
    fn release(&mut self, now: Instant, peer: SocketAddr, parked: Parked) {
        match parked {
            Parked::Response(r) => {
                self.stats.count_response(r.message.code);
                let (id, token, registration) = (r.id, r.token.clone(), r.registration);
                self.send_parked_response(now, peer, r, None);
                if registration {
                    self.events.push_back(Event::Verified { id, peer, token });
                }
            }
            Parked::Notification {
                id,
                message,
                confirmable,
                replaces,
                ..
            } => self.send_notification(now, peer, id, message, confirmable, replaces),
        }
    }

    /// Sends a parked response, or the `instead` message in its place: piggybacked on
    /// the ACK while the request is not acknowledged, else as a separate response
    /// (confirmable when verified, NON otherwise).
    fn send_parked_response(
        &mut self,
        now: Instant,
        peer: SocketAddr,
        r: ParkedResponse,
        instead: Option<Message>,
    ) {
        let verified = instead.is_none();
        let mut m = instead.unwrap_or(r.message);
        m.token = r.token;
        let key = (peer, r.mid);
        if r.con && !r.acked {
            m.mtype = MessageType::Acknowledgement;
            m.mid = r.mid;
            let bytes = self.encode(&m);
            let how = if r.remember {
                Finished::Reply(&bytes)
            } else {
                Finished::Forget
            };
            self.finish_message(now, key, how);
            self.transmit(peer, bytes);
            return;
        }
        m.mid = self.alloc_mid(now, peer);
        if r.con && verified {
            m.mtype = MessageType::Confirmable;
            let bytes = self.encode(&m);
            self.send_confirmable(now, peer, m.mid, bytes, Owner::Server(r.id));
        } else {
            m.mtype = MessageType::NonConfirmable;
            self.transmit_message(peer, &m);
        }
    }

    /// What goes out instead of a parked response if its peer is not verified: for a
    /// safe request 4.01 with Echo (RFC 9175 §2.4: the client may ask again with the
    /// Echo value, which verifies it); for any other the handler has had its effect,
    /// so the response's code and options, without the payload. Nothing for a
    /// notification.
    fn fallback(&self, now: Instant, peer: SocketAddr, parked: &Parked) -> Option<Message> {
        let Parked::Response(r) = parked else {
            return None;
        };
        let mut m = if r.safe {
            let mut m = Message::new(MessageType::NonConfirmable, Code::UNAUTHORIZED, 0);
            m.options.set(opt::ECHO, self.echo_value(now, peer));
            m
        } else {
            let mut m = Message::new(MessageType::NonConfirmable, r.message.code, 0);
            m.options = r.message.options.clone();
            m
        };
        m.token = r.token.clone();
        Some(m)
    }

    /// Gives up on a parked message: its [fallback](Self::fallback) goes out if the
    /// request leaves room for it, and the application is told.
    fn fail(&mut self, now: Instant, peer: SocketAddr, parked: Parked) {
        let (id, token) = parked.id_and_token();
        let instead = self.fallback(now, peer, &parked);
        if let (Parked::Response(r), Some(m)) = (parked, instead) {
            if encoded_len(&m) <= r.allowance {
                self.stats.count_response(m.code);
                self.send_parked_response(now, peer, r, Some(m));
            } else {
                // Nothing fits: the request is forgotten (a safe one may be asked again).
                let how = if r.con && r.acked {
                    r.after_empty_ack()
                } else {
                    Finished::Forget
                };
                self.finish_message(now, (peer, r.mid), how);
            }
        }
        self.stats.unverified += 1;
        self.events.push_back(Event::Unverified { id, peer, token });
    }

    fn echo_secs(&self, now: Instant) -> u32 {
        now.saturating_duration_since(self.epoch)
            .as_secs()
            .min(u64::from(u32::MAX)) as u32
    }

    fn echo_mac(&self, peer: SocketAddr, secs: u32) -> u64 {
        self.validation.echo_key.hash_one((peer, secs))
    }

    /// A fresh Echo value for `peer` (RFC 9175): the time and a keyed hash of peer and time.
    pub(super) fn echo_value(&self, now: Instant, peer: SocketAddr) -> Vec<u8> {
        let secs = self.echo_secs(now);
        let mut v = Vec::with_capacity(ECHO_LEN);
        v.extend_from_slice(&secs.to_be_bytes());
        v.extend_from_slice(&self.echo_mac(peer, secs).to_be_bytes());
        v
    }

    /// Verifies `peer` if `echo` is a value this endpoint gave it less than a minute ago.
    pub(super) fn check_echo(&mut self, now: Instant, peer: SocketAddr, echo: &[u8]) {
        if !self.validating() || echo.len() != ECHO_LEN {
            return;
        }
        let secs = u32::from_be_bytes([echo[0], echo[1], echo[2], echo[3]]);
        let mut mac = [0u8; 8];
        mac.copy_from_slice(&echo[4..]);
        let age = self.echo_secs(now).checked_sub(secs);
        if age.is_some_and(|a| a <= ECHO_LIFETIME_SECS)
            && u64::from_be_bytes(mac) == self.echo_mac(peer, secs)
        {
            self.verified(now, peer);
        }
    }

    /// Housekeeping of the verification state; true while any is left.
    pub(super) fn sweep_validation(&mut self, now: Instant) -> bool {
        self.validation.sweep(now);
        !self.validation.is_idle()
    }
}
