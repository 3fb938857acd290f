//! The CoAP endpoint as a sans-IO state machine.
//!
//! An [`Endpoint`] owns every piece of protocol state for the peers it talks to:
//! exchanges in both roles, deduplication, message IDs, retransmissions and NSTART
//! queues. It never touches a socket or a clock. Feed it what happened —
//! [`Endpoint::handle_datagram`], [`Endpoint::handle_timeout`], [`Endpoint::request`],
//! [`Endpoint::respond`] — with an explicit `now`, then drain what it wants done:
//! [`Endpoint::poll_transmit`], [`Endpoint::poll_event`], [`Endpoint::poll_timeout`].
//!
//! ```
//! use cobalt_proto::endpoint::{Endpoint, EndpointConfig, Event};
//! use cobalt_proto::message::{Code, Message, MessageType};
//! use std::time::Instant;
//!
//! let now = Instant::now();
//! let mut client = Endpoint::new(EndpointConfig::default(), now);
//! let mut server = Endpoint::new(EndpointConfig::default(), now);
//! let (c_addr, s_addr) = ("127.0.0.1:40000".parse().unwrap(), "127.0.0.1:5683".parse().unwrap());
//!
//! let mut get = Message::new(MessageType::Confirmable, Code::GET, 0);
//! get.options.set_uri_path("/hello");
//! let req = client.request(now, s_addr, get).unwrap();
//! let tx = client.poll_transmit().unwrap();
//! server.handle_datagram(now, c_addr, &tx.bytes);
//! let Some(Event::Request { id, request, .. }) = server.poll_event() else { panic!() };
//! assert_eq!(request.options.uri_path_string(), "/hello");
//! let mut resp = Message::new(MessageType::Acknowledgement, Code::CONTENT, 0);
//! resp.payload = b"world".to_vec();
//! server.respond(now, id, resp).unwrap();
//! let tx = server.poll_transmit().unwrap();
//! client.handle_datagram(now, s_addr, &tx.bytes);
//! match client.poll_event() {
//!     Some(Event::Response { id, response }) if id == req => assert_eq!(response.payload, b"world"),
//!     other => panic!("{other:?}"),
//! }
//! ```

mod admission;
mod client;
mod config;
pub mod dedup;
mod ids;
mod moves;
mod pacing;
mod peers;
mod reliability;
mod server;
mod spare;
mod timers;
mod token_index;
mod validation;

pub use crate::settings::ConfigError;
pub use config::EndpointConfig;
pub use ids::{ExchangeId, RequestId};

use crate::congestion::{Attempt, Congestion};
#[cfg(test)]
use crate::message::DEFAULT_MAX_TOKEN_LEN;
use crate::message::{codec, opt, Code, Message, MessageType, Token};
use crate::tables::{shrink_when_sparse, Table};
use admission::Admission;
use dedup::{DedupEntry, DedupLimits, DedupStore, Finished};
use hashbrown::HashMap;
use ids::ById;
use peers::{Peer, PeerEntries, PeerSlot};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use spare::Spare;
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use timers::{Timer, TimerQueue};
use token_index::{Addressed, TokenIndex};

/// The answer to a confirmable request that cannot even be queued (overload): an ACK
/// with 5.03 Service Unavailable and Max-Age, built from the raw datagram without an
/// endpoint. `None` for anything that is not a decodable CON request.
pub fn overload_reply(datagram: &[u8], max_age: u32) -> Option<Vec<u8>> {
    let h = codec::peek_header(datagram)?;
    if h.mtype != MessageType::Confirmable || !h.code.is_request() {
        return None;
    }
    let (token, _) = codec::read_token(datagram).ok()?;
    let mut resp = Message::new(
        MessageType::Acknowledgement,
        Code::SERVICE_UNAVAILABLE,
        h.mid,
    );
    resp.token = token;
    resp.options.set_uint(opt::MAX_AGE, max_age);
    Some(codec::encode(&resp))
}

/// A datagram to send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transmit {
    /// Destination.
    pub peer: SocketAddr,
    /// Encoded message.
    pub bytes: Vec<u8>,
}

/// Why a confirmable response sent by the server was not acknowledged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeliveryFailure {
    /// No ACK after MAX_RETRANSMIT retransmissions.
    Timeout,
    /// The peer answered with RST.
    Reset,
}

/// What the endpoint tells the application.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// A new request (never a duplicate); answer it with [`Endpoint::respond`].
    Request {
        /// Pass this to `respond`.
        id: ExchangeId,
        /// Who sent it.
        peer: SocketAddr,
        /// The request.
        request: Message,
    },
    /// A response to a request sent with [`Endpoint::request`]. For an observe
    /// registration the same id receives every notification.
    Response {
        /// The request it answers.
        id: RequestId,
        /// The response.
        response: Message,
    },
    /// A request got no ACK after MAX_RETRANSMIT retransmissions, or no response in time.
    Timeout {
        /// The request.
        id: RequestId,
        /// The server it was sent to.
        peer: SocketAddr,
        /// Retransmissions that were sent before giving up.
        retransmissions: u32,
    },
    /// The peer rejected a request with RST.
    Reset {
        /// The request.
        id: RequestId,
        /// The server that rejected it.
        peer: SocketAddr,
    },
    /// An RST that matched no confirmable message of ours; for example a client
    /// rejecting a NON notification (RFC 7641 §3.6), which ends the observation.
    UnmatchedReset {
        /// Who sent it.
        peer: SocketAddr,
        /// Its message ID.
        mid: u16,
    },
    /// A separate (confirmable) response or a confirmable notification could not be delivered.
    ResponseFailed {
        /// The exchange whose response failed.
        id: ExchangeId,
        /// Why.
        reason: DeliveryFailure,
    },
    /// A response or notification waited for its peer's address to be verified
    /// (amplification limit, RFC 9175 §2.4) and the peer never proved it: a response was
    /// replaced by 4.01 with an Echo option, a notification was dropped. An
    /// observation with this token should end.
    Unverified {
        /// The exchange (`respond`) or notification (`notify`) that was not sent.
        id: ExchangeId,
        /// The peer.
        peer: SocketAddr,
        /// The request's or observation's token.
        token: Token,
    },
    /// The answer to an observe registration waited for its peer's address to be
    /// verified (RFC 9175 §2.4), the peer proved it, and the answer went out: the
    /// observation may start holding state now. (Until then an application should
    /// keep no relation for it: the address may be forged.)
    Verified {
        /// The exchange (`respond`) whose answer was sent.
        id: ExchangeId,
        /// The peer, now verified.
        peer: SocketAddr,
        /// The registration's token.
        token: Token,
    },
}

/// Why a request could not be started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestError {
    /// The message is not a request (code 0.01–0.31).
    NotARequest,
    /// `max_client_exchanges` requests are already outstanding or queued.
    TooManyRequests,
    /// The request's token is longer than `max_token_len`.
    TokenTooLong {
        /// The token's length.
        len: usize,
        /// The configured maximum.
        max: usize,
    },
}

impl std::fmt::Display for RequestError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RequestError::NotARequest => write!(f, "message code is not a request method"),
            RequestError::TooManyRequests => write!(f, "too many outstanding requests"),
            RequestError::TokenTooLong { len, max } => write!(
                f,
                "token of {len} bytes is longer than max_token_len ({max}); raise it or use a shorter token"
            ),
        }
    }
}

impl std::error::Error for RequestError {}

/// `respond` was called for an exchange that is not (or no longer) waiting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UnknownExchange(pub ExchangeId);

impl std::fmt::Display for UnknownExchange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "exchange {} is not awaiting a response", self.0 .0)
    }
}

impl std::error::Error for UnknownExchange {}

/// Counters for metrics.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stats {
    /// Datagrams fed in.
    pub datagrams_in: u64,
    /// Datagrams handed out.
    pub datagrams_out: u64,
    /// New requests surfaced to the application.
    pub requests: u64,
    /// Duplicate messages recognised by deduplication.
    pub duplicates: u64,
    /// Retransmissions sent.
    pub retransmissions: u64,
    /// Undecodable datagrams.
    pub format_errors: u64,
    /// RSTs sent.
    pub resets_sent: u64,
    /// Requests answered 4.02 Bad Option.
    pub bad_options: u64,
    /// Requests answered 4.00 because their token is longer than `max_token_len`.
    pub long_tokens: u64,
    /// Requests answered 5.03 because the endpoint's total bound on requests in
    /// progress was reached.
    pub overload_rejections: u64,
    /// Requests answered 4.29 because their peer (or its IP address) had too many
    /// requests in progress.
    pub busy_rejections: u64,
    /// Deduplication entries dropped early: from a peer's full window, or oldest-first
    /// at the byte bound.
    pub dedup_evictions: u64,
    /// Answers and notifications held back for an address verification.
    pub parked: u64,
    /// Verification pings sent (first transmissions).
    pub probes_sent: u64,
    /// Addresses verified by a ping's RST while answers waited.
    pub addresses_verified: u64,
    /// Verifications that got no answer.
    pub probes_failed: u64,
    /// Answers and notifications given up for lack of verification (see [`Event::Unverified`]).
    pub unverified: u64,
    /// ACKs, RSTs and responses that matched nothing.
    pub unmatched: u64,
    /// Client requests that timed out.
    pub timeouts: u64,
    /// Times a client request had to wait because all message IDs to its server were
    /// used within EXCHANGE_LIFETIME (more than 65,536 messages, RFC 7252 §4.4).
    pub mid_waits: u64,
    /// Responses and notifications sent with a 2.xx code.
    pub responses_2xx: u64,
    /// Responses and notifications sent with a 4.xx code (including 4.02 Bad Option).
    pub responses_4xx: u64,
    /// Responses and notifications sent with a 5.xx code (including overload 5.03).
    pub responses_5xx: u64,
}

impl Stats {
    /// Counts one response (or notification) sent with `code` by its class.
    fn count_response(&mut self, code: Code) {
        match code.class() {
            2 => self.responses_2xx += 1,
            4 => self.responses_4xx += 1,
            5 => self.responses_5xx += 1,
            _ => {}
        }
    }
}

/// How much state the endpoint holds (for tests and metrics).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StateCounts {
    /// Requests received and not yet answered.
    pub server_exchanges: usize,
    /// Requests sent (or queued) and not finished.
    pub client_exchanges: usize,
    /// Confirmable messages awaiting an ACK.
    pub pending_confirmables: usize,
    /// Deduplication entries (including the requests being handled).
    pub dedup_entries: usize,
    /// Bytes held by the deduplication store (see [`EndpointConfig::max_dedup_bytes`]).
    pub dedup_bytes: usize,
    /// Address verifications in progress.
    pub address_probes: usize,
    /// Verified addresses remembered.
    pub verified_peers: usize,
    /// Peers with per-peer state (MID counter, NSTART queue).
    pub peers: usize,
}

/// `peer`'s entry in `peers` and where it is, made if it has none (see
/// [`new_peer`]), marked used at `now`. A function of the table alone, so that the
/// entry can be held while other parts of the endpoint are used (see `handle_request`).
fn peer_entry<'a>(
    peers: &'a mut PeerEntries,
    rng: &mut StdRng,
    now: Instant,
    peer: SocketAddr,
) -> (PeerSlot, &'a mut Peer) {
    let used = peers.secs(now);
    let (slot, p) = peers.entry(peer, || new_peer(rng, used, peer));
    p.last_used = used;
    (slot, p)
}

/// A new entry for `peer`, used at `used` (see [`PeerEntries::secs`]), its first
/// message ID drawn from `rng`.
fn new_peer(rng: &mut StdRng, used: u32, peer: SocketAddr) -> Peer {
    Peer {
        addr: peer,
        in_progress: peers::InProgress::default(),
        stored: false,
        last_used: used,
        outstanding: 0,
        mid_block_used: 0,
        next_mid: rng.random(),
        congestion: None,
        rare: None,
    }
}

/// The next exchange or request number from `counter`.
fn take_id(counter: &mut u64) -> u64 {
    let id = *counter;
    *counter += 1;
    id
}

#[derive(Debug)]
struct ServerExchange {
    peer: SocketAddr,
    /// Where the peer's entry was when the request came: the answer finds it there
    /// (if it is still there) without a second lookup.
    slot: PeerSlot,
    mid: u16,
    token: Token,
    con: bool,
    acked: bool,
    /// Keep the answer for duplicates after responding (false: a safe request re-run).
    remember: bool,
    /// GET or FETCH: running it again changes nothing.
    safe: bool,
    /// A GET or FETCH with Observe=0: its answer starts notifications.
    registration: bool,
    /// Bytes of the request, for the amplification limit.
    request_len: usize,
    /// Bytes sent for this exchange so far (empty ACKs).
    sent: usize,
    /// The request's No-Response option (RFC 7967): response classes not to send.
    no_response: u8,
}

/// Where a request stands. Only the step: a client may hold many observations, each
/// long past the queue and its deadlines, so what a step needs lives elsewhere (the
/// queued message in [`Endpoint::queued`], the response's deadline in its timer).
/// The steps only go forward, so a request waits for its response once at most and
/// has at most one [`Timer::ClientDeadline`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ClientState {
    /// Waiting in the peer's NSTART queue, its message in [`Endpoint::queued`].
    Queued,
    /// CON sent, no ACK yet.
    AwaitingAck,
    /// ACK received or NON sent; waiting for the response until its
    /// [`Timer::ClientDeadline`].
    AwaitingResponse,
    /// Observe registration confirmed; notifications keep coming.
    Observing,
}

#[derive(Debug)]
struct ClientExchange {
    peer: SocketAddr,
    token: Token,
    mid: u16,
    state: ClientState,
    counted: bool,
    observe: bool,
    /// Asked with Q-Block2 (RFC 9177): further blocks of the answer come under its
    /// token, so it stays registered after a Q-Block2 response until cancelled.
    qblock2: bool,
    /// A Q-Block1 block (RFC 9177) with the M bit: over CON the server only
    /// acknowledges it (the answer comes for the body's last block), so its empty
    /// ACK ends the exchange and is handed over as its answer.
    qblock1_more: bool,
}

impl Addressed for ClientExchange {
    fn peer(&self) -> &SocketAddr {
        &self.peer
    }
    fn token(&self) -> &Token {
        &self.token
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Owner {
    Client(RequestId),
    Server(ExchangeId),
}

#[derive(Debug)]
struct PendingCon {
    bytes: Vec<u8>,
    owner: Owner,
    /// Its transmissions' timing, kept for the peer's congestion controller.
    attempt: Attempt,
    next_at: Instant,
    /// Bytes its retransmissions may still take (to an unverified peer); `None`: no limit.
    budget: Option<usize>,
}

/// The sans-IO CoAP endpoint. See the [module documentation](self).
#[derive(Debug)]
pub struct Endpoint {
    /// Reference point for the per-peer message-ID clock.
    epoch: Instant,
    config: EndpointConfig,
    rng: StdRng,
    dedup: DedupStore,
    /// Retransmission timeouts and NON pacing: what the peers' states (in their
    /// entries) share.
    congestion: Congestion,
    admission: Admission,
    validation: validation::Validation,
    peers: PeerEntries,
    server: ById<ExchangeId, ServerExchange>,
    clients: ById<RequestId, ClientExchange>,
    /// The messages of the client's requests in [`ClientState::Queued`] (none for a
    /// client that sends each server one request at a time).
    queued: ById<RequestId, Message>,
    /// The client's requests by server and token.
    tokens: TokenIndex,
    pending: HashMap<(SocketAddr, u16), PendingCon>,
    timers: TimerQueue,
    housekeeping_armed: bool,
    transmits: VecDeque<Transmit>,
    /// Buffers of sent datagrams given back for later ones.
    spare: Spare,
    events: VecDeque<Event>,
    next_id: u64,
    stats: Stats,
}

impl Endpoint {
    /// A new endpoint with an unpredictable random source for MIDs and tokens.
    pub fn new(config: EndpointConfig, now: Instant) -> Endpoint {
        Endpoint::with_rng(config, now, StdRng::from_os_rng())
    }

    /// A new endpoint whose randomness comes from `seed` (deterministic tests only:
    /// tokens must be unpredictable on a real network).
    pub fn with_seed(config: EndpointConfig, now: Instant, seed: u64) -> Endpoint {
        Endpoint::with_rng(config, now, StdRng::seed_from_u64(seed))
    }

    fn with_rng(config: EndpointConfig, now: Instant, rng: StdRng) -> Endpoint {
        let dedup = DedupStore::new(DedupLimits {
            lifetime: config.exchange_lifetime(),
            per_peer: config.dedup_per_peer,
            max_bytes: config.max_dedup_bytes,
        });
        let congestion = config.congestion_table();
        Endpoint {
            epoch: now,
            congestion,
            config,
            rng,
            dedup,
            admission: Admission::default(),
            validation: validation::Validation::default(),
            peers: PeerEntries::new(now),
            server: ById::default(),
            clients: ById::default(),
            queued: ById::default(),
            tokens: TokenIndex::default(),
            pending: HashMap::new(),
            timers: TimerQueue::default(),
            housekeeping_armed: false,
            transmits: VecDeque::new(),
            spare: Spare::default(),
            events: VecDeque::new(),
            next_id: 1,
            stats: Stats::default(),
        }
    }

    /// The configuration in force.
    pub fn config(&self) -> &EndpointConfig {
        &self.config
    }

    /// Counters since creation.
    pub fn stats(&self) -> Stats {
        let d = self.dedup.stats();
        Stats {
            dedup_evictions: d.evicted_window + d.evicted_bytes,
            ..self.stats.clone()
        }
    }

    /// How much state is held.
    pub fn state_counts(&self) -> StateCounts {
        StateCounts {
            server_exchanges: self.server.len(),
            client_exchanges: self.clients.len(),
            pending_confirmables: self.pending.len(),
            dedup_entries: self.dedup.len() + self.server.len(),
            dedup_bytes: self.dedup.bytes(),
            address_probes: self.validation.probes(),
            verified_peers: self.validation.verified_count(),
            peers: self.peers.len(),
        }
    }

    /// The next datagram to send.
    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        self.transmits.pop_front()
    }

    /// Gives back the bytes of a [`Transmit`] once sent, for a later datagram to be
    /// encoded into instead of a new allocation (optional; at most 64 buffers of up to
    /// 2 KiB are kept).
    pub fn recycle(&mut self, bytes: Vec<u8>) {
        self.spare.give(bytes);
    }

    /// The next event for the application.
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// When [`Endpoint::handle_timeout`] should be called next, if ever.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.timers.next()
    }

    // ---------------------------------------------------------------- input

    /// Starts loading what the endpoint keeps of `peer` into the CPU's cache, without
    /// waiting for it. A caller holding a batch of received datagrams calls this for
    /// each before handling the first: with thousands of peers their entries are
    /// rarely cached, and their loads then overlap instead of stalling each datagram
    /// in turn. Changes nothing; skipping it changes nothing but speed.
    #[inline]
    pub fn prefetch_peer(&self, peer: SocketAddr) {
        self.peers.prefetch(peer);
    }

    /// Processes one received datagram.
    pub fn handle_datagram(&mut self, now: Instant, peer: SocketAddr, bytes: &[u8]) {
        self.stats.datagrams_in += 1;
        let msg = match codec::decode(bytes) {
            Ok(m) => m,
            Err(_) => {
                self.stats.format_errors += 1;
                // §4.2/§4.3: a CON with a message format error is rejected with RST.
                if let Some(h) = codec::peek_header(bytes) {
                    if h.mtype == MessageType::Confirmable {
                        self.send_reset(peer, h.mid);
                    }
                }
                return;
            }
        };
        match (msg.mtype, msg.code.class()) {
            (MessageType::Confirmable, _) if msg.code.is_empty() => {
                // CoAP ping (§4.3): answer with RST.
                self.send_reset(peer, msg.mid)
            }
            (MessageType::Acknowledgement, _) if msg.code.is_empty() => {
                self.handle_ack(now, peer, msg.mid, None)
            }
            (MessageType::Reset, _) => self.handle_reset(now, peer, msg.mid),
            (MessageType::Confirmable | MessageType::NonConfirmable, 0) if msg.is_request() => {
                self.handle_request(now, peer, msg, bytes.len())
            }
            (MessageType::Acknowledgement, 2..=5) => {
                let mid = msg.mid;
                self.handle_ack(now, peer, mid, Some(msg))
            }
            (MessageType::Confirmable | MessageType::NonConfirmable, 2..=5) => {
                self.handle_separate_response(now, peer, msg)
            }
            (MessageType::Confirmable, _) => {
                // Reserved code class we cannot process: reject (§4.2).
                self.send_reset(peer, msg.mid)
            }
            _ => self.stats.unmatched += 1,
        }
    }

    /// A datagram longer than the receive buffer arrived and was cut to `prefix`.
    /// A confirmable request gets 4.13 Request Entity Too Large with Size1 = `limit`
    /// (RFC 7252 §5.9.2.9); anything else is dropped.
    pub fn handle_oversized(&mut self, peer: SocketAddr, prefix: &[u8], limit: usize) {
        self.stats.datagrams_in += 1;
        self.stats.format_errors += 1;
        let Some(h) = codec::peek_header(prefix) else {
            return;
        };
        if h.mtype != MessageType::Confirmable || !h.code.is_request() {
            return;
        }
        let token = codec::read_token(prefix).map_or(Token::EMPTY, |(token, _)| token);
        let mut resp = Message::new(
            MessageType::Acknowledgement,
            Code::REQUEST_ENTITY_TOO_LARGE,
            h.mid,
        );
        resp.token = token;
        resp.options.set_uint(opt::SIZE1, limit as u32);
        self.stats.count_response(resp.code);
        self.transmit_message(peer, &resp);
    }

    /// Fires every timer due at `now`.
    pub fn handle_timeout(&mut self, now: Instant) {
        while let Some((at, timer)) = self.timers.pop_due(now) {
            match timer {
                Timer::Retransmit(peer, mid) => self.on_retransmit_timer(now, at, peer, mid),
                Timer::SeparateAck(id) => self.ack_in_progress(id, false),
                Timer::Probe(peer, mid) => self.on_probe_timer(now, peer, mid),
                Timer::ClientDeadline(id) => self.on_client_deadline(now, id),
                Timer::Housekeeping => self.housekeeping(now),
                Timer::MidsFree(peer) => self.pump_peer(now, peer),
                Timer::NonPacer(peer) => self.release_held_non(now, peer),
            }
        }
    }

    // ---------------------------------------------------------------- plumbing

    fn transmit(&mut self, peer: SocketAddr, bytes: Vec<u8>) {
        self.stats.datagrams_out += 1;
        self.transmits.push_back(Transmit { peer, bytes });
    }

    /// `msg` encoded into a spare buffer, if there is one.
    fn encode(&mut self, msg: &Message) -> Vec<u8> {
        self.spare.encode(msg)
    }

    fn transmit_message(&mut self, peer: SocketAddr, msg: &Message) {
        let bytes = self.encode(msg);
        self.transmit(peer, bytes);
    }

    fn send_reset(&mut self, peer: SocketAddr, mid: u16) {
        self.stats.resets_sent += 1;
        self.transmit_message(peer, &Message::reset(mid));
    }

    fn alloc_id(&mut self) -> u64 {
        take_id(&mut self.next_id)
    }

    /// The peer's entry, made if it has none, marked used at `now`.
    fn touch_peer(&mut self, now: Instant, peer: SocketAddr) -> &mut Peer {
        self.arm_housekeeping(now);
        peer_entry(&mut self.peers, &mut self.rng, now, peer).1
    }

    /// Records how the message `key` was handled: a request of the peer's is no longer
    /// in progress, and what a duplicate gets is remembered (see [`Finished`]).
    fn finish_message(&mut self, now: Instant, key: (SocketAddr, u16), how: Finished<'_>) {
        self.finish_message_at(now, key, PeerSlot::UNKNOWN, how);
    }

    /// [`Endpoint::finish_message`] for a peer whose entry was found at `slot` (kept
    /// by the request's exchange): the answer needs no second lookup of its peer.
    fn finish_message_at(
        &mut self,
        now: Instant,
        key: (SocketAddr, u16),
        slot: PeerSlot,
        how: Finished<'_>,
    ) {
        let remembers = !matches!(how, Finished::Forget);
        let used = if remembers { self.peers.secs(now) } else { 0 };
        let p = if remembers {
            // The entry outlives what the store keeps of it (both last the exchange
            // lifetime from now), so its `stored` mark is never lost early.
            self.arm_housekeeping(now);
            let rng = &mut self.rng;
            self.peers
                .entry_at(slot, key.0, || new_peer(rng, used, key.0))
        } else {
            self.peers.get_at_mut(slot, key.0)
        };
        if let Some(p) = p {
            if remembers {
                p.last_used = used;
            }
            p.in_progress.remove(key.1);
            p.stored |= remembers;
        }
        self.dedup.finish(now, key, how);
    }

    fn alloc_mid(&mut self, now: Instant, peer: SocketAddr) -> u16 {
        let used = self.epoch_secs(now);
        self.touch_peer(now, peer).take_mid(used)
    }

    /// Whole seconds since the endpoint's epoch, rounded up, plus one (0 means never).
    fn epoch_secs(&self, now: Instant) -> u32 {
        peers::epoch_secs(self.epoch, now)
    }

    /// When the next message ID to `peer` may be used, if not now: entering a block of
    /// IDs whose last use is less than EXCHANGE_LIFETIME ago would reuse an ID too
    /// early (more than 65,536 messages to one peer within the lifetime).
    fn mid_blocked_until(&self, now: Instant, peer: SocketAddr) -> Option<Instant> {
        let used = self.peers.get(&peer)?.next_block_last_used();
        if used == 0 {
            return None;
        }
        let free_at =
            self.epoch + Duration::from_secs(u64::from(used)) + self.config.exchange_lifetime();
        (free_at > now).then_some(free_at)
    }

    fn arm_housekeeping(&mut self, now: Instant) {
        if !self.housekeeping_armed {
            self.housekeeping_armed = true;
            let at = now + self.config.exchange_lifetime() / 4;
            self.timers.arm(at, Timer::Housekeeping);
        }
    }

    /// Entries the tables can hold, used or not (for tests of memory coming back).
    #[cfg(test)]
    fn table_capacity(&self) -> usize {
        self.peers.capacity()
            + self.server.capacity()
            + self.clients.capacity()
            + self.queued.capacity()
            + self.tokens.capacity()
            + self.pending.capacity()
            + self.transmits.capacity()
            + self.events.capacity()
            + self.timers.capacity()
    }

    fn housekeeping(&mut self, now: Instant) {
        self.housekeeping_armed = false;
        self.dedup.expire(now);
        self.admission.shrink();
        let validating = self.sweep_validation(now);
        let lifetime = self.config.exchange_lifetime();
        let busy: std::collections::HashSet<SocketAddr> = self
            .server
            .values()
            .map(|e| e.peer)
            .chain(self.clients.values().map(|e| e.peer))
            .chain(self.pending.keys().map(|(p, _)| *p))
            .collect();
        // An entry lives as long as the longer of its two reasons: its own use and
        // its congestion state.
        let expired = self.peers.last_used_expired(lifetime, now);
        let congestion = &mut self.congestion;
        self.peers.retain(|p| {
            let congestion_kept = congestion.expire(now, &mut p.congestion);
            congestion_kept || p.last_used > expired || busy.contains(&p.addr)
        });
        // What a burst left behind (e.g. the exchanges of 100,000 confirmable
        // notifications): the tables give their memory back once they are sparse.
        shrink_when_sparse(&mut self.peers);
        shrink_when_sparse(&mut self.server);
        shrink_when_sparse(&mut self.clients);
        shrink_when_sparse(&mut self.queued);
        self.tokens.shrink_when_sparse(&self.clients);
        shrink_when_sparse(&mut self.pending);
        shrink_when_sparse(&mut self.transmits);
        shrink_when_sparse(&mut self.events);
        self.timers.shrink();
        if !self.peers.is_empty() || !self.dedup.is_empty() || validating {
            self.arm_housekeeping(now);
        }
    }
}

#[cfg(test)]
mod attack_tests;
#[cfg(test)]
mod sim_block_observe_tests;
#[cfg(test)]
mod sim_tests;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod token_tests;
