//! One CoAP-over-TCP connection (RFC 8323), sans-IO.
//!
//! [`TcpConnection`] is fed the bytes read from a stream ([`TcpConnection::handle_bytes`])
//! and the passing of time ([`TcpConnection::handle_timeout`]); it yields bytes to write
//! ([`TcpConnection::poll_transmit`]) and [`TcpEvent`]s ([`TcpConnection::poll_event`]).
//! It owns no socket and reads no clock, so two instances can be wired together in a test.
//!
//! What it does:
//! * sends its CSM as the first message (RFC 8323 §5.3) and requires the peer's CSM to be
//!   the peer's first message, aborting the connection otherwise (§5.3.1);
//! * tracks the peer's Max-Message-Size (1152 until its CSM says otherwise) and BERT
//!   support, and refuses to send messages larger than the peer accepts;
//! * matches responses to requests by token; observe registrations stay matched until
//!   cancelled, and a GET with Observe=1 ([`TcpConnection::request`] with the
//!   observation's token) deregisters with that same token;
//! * serves the peer's observations (RFC 7641 over RFC 8323 §7): a success response
//!   carrying Observe keeps the request's token registered, and
//!   [`TcpConnection::notify`] sends further notifications with it until one is an error
//!   or lacks Observe, or the peer sends a new request with that token;
//! * answers Ping with Pong, echoing the token; a Ping with Custody is answered (with
//!   Custody) once every request received before it has been answered (§5.4.1);
//! * closes on Abort; after the peer's Release it sends no new requests, waits for the
//!   responses to those outstanding, then closes (§5.5);
//! * defends itself: a peer that never completes its CSM, trickles a frame slowly
//!   (slowloris) or stays idle is aborted, frames above the local Max-Message-Size are
//!   refused from their header, and requests beyond a concurrency bound are answered
//!   5.03 without reaching the application.
//!
//! The same state machine serves CoAP over WebSockets (RFC 8323 §4, `coap+ws://`):
//! [`TcpConnection::websocket`] makes a connection whose messages are framed for
//! WebSockets (no Len field, RFC 8323 §4.4). Each call to
//! [`TcpConnection::handle_ws_message`] takes the payload of one binary WebSocket
//! message, and each [`TcpConnection::poll_transmit`] returns the payload of one; the
//! WebSocket layer (handshake, masking, frame size limit) is the caller's.
//!
//! ```
//! use cobalt_proto::tcp_connection::{TcpConfig, TcpConnection, TcpEvent};
//! use cobalt_proto::message::{Code, TcpMessage};
//! use std::time::Instant;
//!
//! let now = Instant::now();
//! let mut client = TcpConnection::new(TcpConfig::default(), now);
//! let mut server = TcpConnection::new(TcpConfig::default(), now);
//! let mut get = TcpMessage::new(Code::GET);
//! get.options.set_uri_path("hello");
//! let token = client.request(now, get).unwrap();
//! while let Some(bytes) = client.poll_transmit() {
//!     server.handle_bytes(now, &bytes);
//! }
//! // First the client's settings (its CSM), then the request.
//! assert!(matches!(server.poll_event(), Some(TcpEvent::PeerSettings { .. })));
//! let Some(TcpEvent::Request { token: t, .. }) = server.poll_event() else { panic!() };
//! let mut reply = TcpMessage::new(Code::CONTENT);
//! reply.payload = b"hi".to_vec();
//! server.respond(now, t, reply).unwrap();
//! while let Some(bytes) = server.poll_transmit() {
//!     client.handle_bytes(now, &bytes);
//! }
//! assert!(matches!(client.poll_event(), Some(TcpEvent::PeerSettings { .. })));
//! assert!(matches!(client.poll_event(), Some(TcpEvent::Response { token: r, .. }) if r == token));
//! ```

use crate::message::option::number;
use crate::message::tcp::{
    decode_tcp, decode_ws, encode_tcp, encode_ws, signal_code, Signal, SignalError, TcpDecodeError,
    TcpMessage, DEFAULT_MAX_MESSAGE_SIZE,
};
use crate::message::{Code, Token, DEFAULT_MAX_TOKEN_LEN, MAX_TOKEN_LEN};
use crate::settings::{within, Param, Settings};
use std::collections::{BTreeSet, HashMap, HashSet, VecDeque};
use std::fmt;
use std::time::{Duration, Instant};

/// Settings of one connection. `Default` gives the documented defaults; the allowed
/// values are those of [`TcpConfig::params`]. With the feature `serde` the server-side
/// ones read and write a configuration file (`block_wise_transfer` as `bert`, the
/// optional durations as 0 for none); the client-side ones keep their defaults there.
#[derive(Debug, Clone, PartialEq)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize, serde::Deserialize),
    serde(deny_unknown_fields, default)
)]
pub struct TcpConfig {
    /// Largest message this side accepts; announced in the CSM. Frames up to this size
    /// plus a framing header (14 bytes) are accepted, larger ones abort the connection
    /// from their header alone. Default 1 MiB + 1 KiB.
    pub max_message_size: u32,
    /// Announce Block-Wise-Transfer, i.e. BERT support (RFC 8323 §6), in the CSM.
    /// Default `true` (libcoap 4.3 and aiocoap 0.4 announce and handle it too).
    #[cfg_attr(feature = "serde", serde(rename = "bert"))]
    pub block_wise_transfer: bool,
    /// How long the peer has to deliver its CSM after the connection starts; then the
    /// connection is aborted. Default 10 s.
    #[cfg_attr(feature = "serde", serde(with = "crate::settings::duration"))]
    pub csm_timeout: Duration,
    /// How long a frame may take from its first byte to its last; a slower peer is
    /// aborted (slowloris defence). Default 30 s.
    #[cfg_attr(feature = "serde", serde(with = "crate::settings::duration"))]
    pub frame_timeout: Duration,
    /// Close (with Release) a connection on which no complete message has been received
    /// and no request or response sent for this long while nothing is outstanding. Default 5 min; `None`: never.
    #[cfg_attr(feature = "serde", serde(with = "crate::settings::zero_is_none"))]
    pub idle_timeout: Option<Duration>,
    /// Requests from the peer being handled at once; beyond it new requests are
    /// answered 5.03 directly. Default 256.
    pub max_inbound_requests: usize,
    /// Requests (and observations) of ours outstanding at once; [`TcpConnection::request`]
    /// fails beyond it. Default 256.
    #[cfg_attr(feature = "serde", serde(skip))]
    pub max_outbound_requests: usize,
    /// Keep-alive (RFC 8323 §5.4): while requests or observations are outstanding and
    /// nothing has been received for this long, send a Ping; if nothing arrives for as
    /// long again, the peer is gone (a dead host, a NAT that dropped the mapping) and
    /// the connection closes with [`CloseReason::KeepaliveTimeout`], failing what was
    /// outstanding instead of waiting forever. Default 30 s; `None`: no pings.
    #[cfg_attr(feature = "serde", serde(with = "crate::settings::zero_is_none"))]
    pub keepalive: Option<Duration>,
    /// Length in bytes of the tokens of requests this side sends: 1 to 8 (default 4;
    /// other values are taken as the nearest). Short tokens save bytes on slow links;
    /// with 1 or 2 bytes at most 255 or 65,535 requests are outstanding at once.
    #[cfg_attr(feature = "serde", serde(skip))]
    pub token_len: usize,
    /// Longest token accepted, in bytes (RFC 8974 extended tokens; default
    /// [`DEFAULT_MAX_TOKEN_LEN`], 8 to 65,804), announced as Extended-Token-Length in the
    /// CSM. A request with a longer token is answered 4.00 Bad Request.
    pub max_token_len: usize,
    /// Critical options the application handles beyond the known ones (a server's
    /// layers declare them): requests carrying them are not answered 4.02 Bad Option.
    #[cfg_attr(feature = "serde", serde(skip))]
    pub handled_options: crate::message::option::HandledOptions,
}

impl Default for TcpConfig {
    fn default() -> Self {
        TcpConfig {
            max_message_size: (1 << 20) + 1024,
            block_wise_transfer: true,
            csm_timeout: Duration::from_secs(10),
            frame_timeout: Duration::from_secs(30),
            idle_timeout: Some(Duration::from_secs(300)),
            max_inbound_requests: 256,
            max_outbound_requests: 256,
            token_len: 4,
            max_token_len: DEFAULT_MAX_TOKEN_LEN,
            keepalive: Some(Duration::from_secs(30)),
            handled_options: Default::default(),
        }
    }
}

impl Settings for TcpConfig {
    /// The server-side parameters with what they do and the values allowed, by their
    /// configuration keys.
    fn params(&self) -> Vec<Param> {
        let secs = Duration::from_secs;
        vec![
            Param::new("max_message_size", "Largest message accepted, in bytes (announced as Max-Message-Size in the CSM); larger frames end the connection.", "1152 to 67108864", (1152..=64 << 20).contains(&self.max_message_size)),
            Param::new("bert", "Announce BERT (RFC 8323 §6): block-wise transfers of many 1024-byte blocks per message with peers that announce it too.", "true or false", true),
            Param::new("csm_timeout", "Time the peer has to send its CSM after connecting.", "1s to 600s", within(self.csm_timeout, secs(1), secs(600))),
            Param::new("frame_timeout", "Time a message may take from its first byte to its last (slowloris defence).", "1s to 600s", within(self.frame_timeout, secs(1), secs(600))),
            Param::new("idle_timeout", "Release a connection with nothing outstanding after this long; 0: never.", "0s to 30d", self.idle_timeout.is_none_or(|d| d <= secs(30 * 86_400))),
            Param::new("keepalive", "Ping a silent peer while requests or observations are outstanding after this long, and close if nothing answers for as long again; 0: no pings.", "0s to 24h", self.keepalive.is_none_or(|d| d <= secs(86_400))),
            Param::new("max_inbound_requests", "Requests of one connection handled at once; beyond it 5.03.", "1 to 65536", (1..=65_536).contains(&self.max_inbound_requests)),
            Param::new("max_token_len", "Longest token accepted (RFC 8974 extended tokens), announced in the CSM; a request with a longer one gets 4.00 Bad Request.", "8 to 65804", (8..=MAX_TOKEN_LEN).contains(&self.max_token_len)),
        ]
    }
}

/// How messages are delimited on the connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// A byte stream with length-prefixed frames (RFC 8323 §3, `coap+tcp`).
    Stream,
    /// One CoAP message per binary WebSocket message (RFC 8323 §4, `coap+ws`).
    WebSocket,
}

impl Framing {
    /// Size of `msg` in this framing, framing header included: what counts against a
    /// Max-Message-Size.
    pub fn frame_len(self, msg: &TcpMessage) -> usize {
        match self {
            Framing::Stream => msg.tcp_frame_len(),
            Framing::WebSocket => msg.ws_frame_len(),
        }
    }

    /// Payload bytes one block of `msg` may carry within `max_message_size`: what is
    /// left after its framing, token and options, counting a Block option
    /// (`block_option`: Block1 or Block2) and a Size option (`size_option`: Size1 or
    /// Size2) of the largest values, and the growth of the length field.
    pub fn block_room(
        self,
        max_message_size: u32,
        msg: &TcpMessage,
        block_option: u16,
        size_option: u16,
    ) -> usize {
        let mut head = TcpMessage {
            code: msg.code,
            token: msg.token.clone(),
            options: msg.options.clone(),
            payload: Vec::new(),
        };
        head.options.set_uint(block_option, u32::MAX >> 8);
        head.options.set_uint(size_option, u32::MAX);
        // The payload marker, and up to four more bytes of extended length.
        (max_message_size as usize).saturating_sub(self.frame_len(&head) + 5)
    }
}

/// Why a connection closed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CloseReason {
    /// This side sent Abort because the peer broke the protocol (the diagnostic says how).
    LocalAbort(String),
    /// The peer sent no complete CSM within [`TcpConfig::csm_timeout`].
    CsmTimeout,
    /// A frame took longer than [`TcpConfig::frame_timeout`] to arrive.
    FrameTimeout,
    /// Nothing happened for [`TcpConfig::idle_timeout`]; this side sent Release.
    IdleTimeout,
    /// The peer answered nothing, not even a keep-alive Ping ([`TcpConfig::keepalive`]).
    KeepaliveTimeout,
    /// This side sent Release ([`TcpConnection::release`]).
    LocalRelease,
    /// The peer sent Abort.
    PeerAbort {
        /// The CSM option the peer objected to.
        bad_csm_option: Option<u16>,
        /// Its diagnostic text.
        diagnostic: String,
    },
    /// The peer sent Release.
    PeerRelease {
        /// Where the peer suggests reconnecting.
        alternative_addresses: Vec<String>,
        /// Seconds to wait before reconnecting.
        hold_off: Option<u32>,
        /// Its diagnostic text.
        diagnostic: String,
    },
    /// The peer closed the stream ([`TcpConnection::handle_eof`]).
    PeerClosed,
}

impl fmt::Display for CloseReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CloseReason::LocalAbort(d) => write!(f, "aborted by us: {d}"),
            CloseReason::CsmTimeout => write!(f, "peer sent no CSM in time"),
            CloseReason::FrameTimeout => write!(f, "peer too slow to complete a message"),
            CloseReason::IdleTimeout => write!(f, "idle"),
            CloseReason::KeepaliveTimeout => write!(f, "peer did not answer a keep-alive Ping"),
            CloseReason::LocalRelease => write!(f, "released by us"),
            CloseReason::PeerAbort {
                bad_csm_option,
                diagnostic,
            } => {
                write!(f, "aborted by peer: {diagnostic}")?;
                if let Some(o) = bad_csm_option {
                    write!(f, " (bad CSM option {o})")?;
                }
                Ok(())
            }
            CloseReason::PeerRelease { diagnostic, .. } => {
                write!(f, "released by peer: {diagnostic}")
            }
            CloseReason::PeerClosed => write!(f, "peer closed the connection"),
        }
    }
}

/// Something the application should know about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TcpEvent {
    /// The peer's CSM arrived (first, or an update).
    PeerSettings {
        /// Largest message the peer accepts.
        max_message_size: u32,
        /// The peer supports BERT.
        block_wise_transfer: bool,
        /// Longest token the peer accepts (its Extended-Token-Length, 8 without one).
        max_token_len: usize,
    },
    /// A request from the peer; answer with [`TcpConnection::respond`].
    Request {
        /// Its token (the handle for the answer).
        token: Token,
        /// The request.
        message: TcpMessage,
    },
    /// A response to one of our requests (for an observation, one per notification).
    Response {
        /// The token [`TcpConnection::request`] returned.
        token: Token,
        /// The response.
        message: TcpMessage,
    },
    /// The peer sent Release: no new requests can be sent on this connection (open
    /// another one); responses to outstanding requests are still delivered, then
    /// `Closed` follows.
    ReleaseReceived {
        /// Where the peer suggests reconnecting.
        alternative_addresses: Vec<String>,
        /// Seconds to wait before reconnecting.
        hold_off: Option<u32>,
    },
    /// A Pong answering our [`TcpConnection::ping`].
    Pong {
        /// The Ping's token.
        token: Token,
    },
    /// The connection is closed: write out what [`TcpConnection::poll_transmit`] still
    /// yields, then close the stream. Outstanding requests will get no response.
    Closed {
        /// Why.
        reason: CloseReason,
        /// Tokens of our requests that were still outstanding.
        outstanding: Vec<Token>,
    },
}

/// Why a message could not be sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SendError {
    /// The connection is closed, or the peer has released it.
    Closed,
    /// The encoded message is larger than the peer's Max-Message-Size.
    TooLarge {
        /// Encoded size.
        size: usize,
        /// The peer's limit.
        limit: u32,
    },
    /// [`TcpConfig::max_outbound_requests`] requests are already outstanding.
    TooManyRequests,
    /// The code is not a request (for `request`) or not a response (for `respond`).
    WrongCode(Code),
    /// No request from the peer with this token awaits a response (for `respond`), or
    /// no observation of the peer's is registered with it (for `notify`).
    UnknownToken(Token),
    /// The request's token is longer than the peer accepts (its CSM's
    /// Extended-Token-Length, 8 when it announced none) or than `max_token_len`.
    TokenTooLong {
        /// The token's length.
        len: usize,
        /// The longest token allowed.
        limit: usize,
    },
}

impl fmt::Display for SendError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SendError::Closed => write!(f, "connection closed"),
            SendError::TooLarge { size, limit } => write!(
                f,
                "message of {size} bytes exceeds the peer's Max-Message-Size {limit}"
            ),
            SendError::TooManyRequests => write!(f, "too many outstanding requests"),
            SendError::WrongCode(c) => write!(f, "code {c:?} not allowed here"),
            SendError::UnknownToken(t) => write!(f, "no pending request with token {t}"),
            SendError::TokenTooLong { len, limit } => write!(
                f,
                "token of {len} bytes is longer than the {limit} the peer or this side accepts"
            ),
        }
    }
}

impl std::error::Error for SendError {}

/// What one of our outstanding tokens is waiting for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outbound {
    /// One response.
    Request,
    /// Notifications, until one without Observe (RFC 7641).
    Observe,
    /// The answer to a GET with Observe=1 that reuses an observation's token;
    /// notifications still in flight before it are dropped.
    Deregister,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Our CSM is queued; the peer's has not arrived.
    AwaitingCsm,
    Open,
    Closed,
}

/// The state of one RFC 8323 connection; see the [module documentation](self).
#[derive(Debug)]
pub struct TcpConnection {
    config: TcpConfig,
    framing: Framing,
    state: State,
    started: Instant,
    /// Last complete message received or sent.
    last_activity: Instant,
    /// Last complete message received (of any kind).
    last_received: Instant,
    /// When our unanswered keep-alive Ping went out.
    keepalive_sent: Option<Instant>,
    /// When the first byte of the incomplete frame in `inbuf` arrived.
    partial_since: Option<Instant>,
    inbuf: Vec<u8>,
    outbuf: Vec<u8>,
    /// WebSocket framing: whole messages to send, oldest first.
    outmsgs: VecDeque<Vec<u8>>,
    events: VecDeque<TcpEvent>,
    peer_max_message_size: u32,
    /// Longest token the peer accepts (its CSM's Extended-Token-Length, default 8).
    peer_max_token_len: usize,
    peer_bert: bool,
    /// Our outstanding requests by token.
    outbound: HashMap<Token, Outbound>,
    /// Tokens of the peer's observations that we serve (registered by a success
    /// response carrying Observe).
    observed: HashSet<Token>,
    /// Requests of the peer awaiting our response: by token, their arrival numbers.
    inbound: HashMap<Token, VecDeque<u64>>,
    /// Arrival numbers of every request awaiting our response.
    inbound_seqs: BTreeSet<u64>,
    /// Arrival number of the next request or Ping.
    next_seq: u64,
    /// Pongs with Custody owed once the requests before their Ping are answered:
    /// (the Ping's arrival number, its token). At most [`MAX_PINGS`].
    deferred_pongs: VecDeque<(u64, Token)>,
    /// Set once the peer has sent Release: the reason to close with when the last
    /// outstanding request is answered.
    releasing: Option<CloseReason>,
    /// Tokens of our Pings awaiting Pong (at most [`MAX_PINGS`]).
    pings: Vec<Token>,
    next_token: u32,
}

/// The largest framing header: Len/TKL byte, 4-byte extended length, code, 8-byte token.
const MAX_FRAME_HEADER: usize = 14;

/// Pings awaiting Pong that are remembered; older ones are forgotten.
const MAX_PINGS: usize = 8;

impl TcpConnection {
    /// A new connection whose stream has just been established; its CSM is queued at once.
    pub fn new(config: TcpConfig, now: Instant) -> TcpConnection {
        TcpConnection::with_token_seed(config, now, rand::random())
    }

    /// Like [`TcpConnection::new`], with a fixed seed for generated tokens (for tests).
    pub fn with_token_seed(config: TcpConfig, now: Instant, seed: u32) -> TcpConnection {
        TcpConnection::with_framing(config, Framing::Stream, now, seed)
    }

    /// A new CoAP-over-WebSockets connection whose WebSocket handshake has just
    /// completed; its CSM is queued at once. Feed it with
    /// [`TcpConnection::handle_ws_message`]; each [`TcpConnection::poll_transmit`]
    /// yields one binary WebSocket message.
    pub fn websocket(config: TcpConfig, now: Instant) -> TcpConnection {
        TcpConnection::with_framing(config, Framing::WebSocket, now, rand::random())
    }

    /// A new connection with the given framing and a fixed seed for generated tokens.
    pub fn with_framing(
        config: TcpConfig,
        framing: Framing,
        now: Instant,
        seed: u32,
    ) -> TcpConnection {
        let mut c = TcpConnection {
            framing,
            outmsgs: VecDeque::new(),
            state: State::AwaitingCsm,
            started: now,
            last_activity: now,
            last_received: now,
            keepalive_sent: None,
            partial_since: None,
            inbuf: Vec::new(),
            outbuf: Vec::new(),
            events: VecDeque::new(),
            peer_max_message_size: DEFAULT_MAX_MESSAGE_SIZE,
            peer_max_token_len: 8,
            peer_bert: false,
            outbound: HashMap::new(),
            observed: HashSet::new(),
            inbound: HashMap::new(),
            inbound_seqs: BTreeSet::new(),
            next_seq: 0,
            deferred_pongs: VecDeque::new(),
            releasing: None,
            pings: Vec::new(),
            next_token: seed,
            config,
        };
        let csm = Signal::Csm {
            max_message_size: Some(c.config.max_message_size),
            block_wise_transfer: c.config.block_wise_transfer,
            // Announced only beyond RFC 7252's eight bytes, the value assumed without it.
            extended_token_length: (c.config.max_token_len > 8)
                .then(|| c.config.max_token_len.min(MAX_TOKEN_LEN) as u32),
        };
        c.queue(&csm.to_message());
        c
    }

    /// The settings.
    pub fn config(&self) -> &TcpConfig {
        &self.config
    }

    /// How messages are delimited.
    pub fn framing(&self) -> Framing {
        self.framing
    }

    /// Size of `msg` on this connection, framing included: what counts against the
    /// peer's Max-Message-Size.
    pub fn frame_len(&self, msg: &TcpMessage) -> usize {
        self.framing.frame_len(msg)
    }

    /// Largest message the peer accepts (1152 until its CSM says otherwise).
    pub fn peer_max_message_size(&self) -> u32 {
        self.peer_max_message_size
    }

    /// The longest token the peer accepts: its CSM's Extended-Token-Length, or 8.
    pub fn peer_max_token_len(&self) -> usize {
        self.peer_max_token_len
    }

    /// Whether the peer announced BERT support.
    pub fn peer_block_wise_transfer(&self) -> bool {
        self.peer_bert
    }

    /// Whether BERT blocks may be sent and received: both ends announced
    /// Block-Wise-Transfer (RFC 8323 §6).
    pub fn bert(&self) -> bool {
        self.peer_bert && self.config.block_wise_transfer
    }

    /// True once the peer's CSM has arrived and until the connection closes.
    pub fn is_established(&self) -> bool {
        self.state == State::Open
    }

    /// True after the peer's Release: no new requests may be sent.
    pub fn is_releasing(&self) -> bool {
        self.releasing.is_some()
    }

    /// True when the connection is closed (after the `Closed` event).
    pub fn is_closed(&self) -> bool {
        self.state == State::Closed
    }

    /// Number of our requests awaiting a response (observations included).
    pub fn outstanding_requests(&self) -> usize {
        self.outbound.len()
    }

    /// Number of the peer's observations this side serves ([`TcpConnection::notify`]).
    pub fn served_observations(&self) -> usize {
        self.observed.len()
    }

    /// Bytes to write to the stream, all queued frames together; with WebSocket
    /// framing, the payload of the next binary WebSocket message to send.
    pub fn poll_transmit(&mut self) -> Option<Vec<u8>> {
        match self.framing {
            Framing::Stream => (!self.outbuf.is_empty()).then(|| std::mem::take(&mut self.outbuf)),
            Framing::WebSocket => self.outmsgs.pop_front(),
        }
    }

    /// The next event.
    pub fn poll_event(&mut self) -> Option<TcpEvent> {
        self.events.pop_front()
    }

    /// When [`TcpConnection::handle_timeout`] should next be called.
    pub fn poll_timeout(&self) -> Option<Instant> {
        if self.state == State::Closed {
            return None;
        }
        let mut t: Option<Instant> = None;
        let mut consider = |at: Instant| t = Some(t.map_or(at, |x| x.min(at)));
        if self.state == State::AwaitingCsm {
            consider(self.started + self.config.csm_timeout);
        }
        if let Some(since) = self.partial_since {
            consider(since + self.config.frame_timeout);
        }
        if let Some(idle) = self.config.idle_timeout {
            if self.is_idle() {
                consider(self.last_activity + idle);
            }
        }
        if let Some(at) = self.keepalive_due() {
            consider(at);
        }
        t
    }

    /// When the next keep-alive step is due: a Ping, or giving up on the peer.
    fn keepalive_due(&self) -> Option<Instant> {
        let interval = self.config.keepalive?;
        if self.state != State::Open || (self.is_idle() && self.keepalive_sent.is_none()) {
            return None;
        }
        Some(self.keepalive_sent.unwrap_or(self.last_received) + interval)
    }

    fn is_idle(&self) -> bool {
        self.outbound.is_empty()
            && self.inbound_seqs.is_empty()
            && self.observed.is_empty()
            && self.partial_since.is_none()
    }

    /// Handles the passing of time: CSM, frame and idle timeouts.
    pub fn handle_timeout(&mut self, now: Instant) {
        if self.state == State::Closed {
            return;
        }
        if self.state == State::AwaitingCsm && now >= self.started + self.config.csm_timeout {
            self.abort_with(None, "no CSM received in time", CloseReason::CsmTimeout);
            return;
        }
        if let Some(since) = self.partial_since {
            if now >= since + self.config.frame_timeout {
                self.abort_with(
                    None,
                    "message not completed in time",
                    CloseReason::FrameTimeout,
                );
                return;
            }
        }
        if let Some(idle) = self.config.idle_timeout {
            if self.is_idle() && now >= self.last_activity + idle {
                self.release_with("idle", CloseReason::IdleTimeout);
                return;
            }
        }
        if self.keepalive_due().is_some_and(|at| now >= at) {
            if self.keepalive_sent.is_some() {
                self.abort_with(
                    None,
                    "no answer to keep-alive Ping",
                    CloseReason::KeepaliveTimeout,
                );
            } else if self.ping(false).is_ok() {
                self.keepalive_sent = Some(now);
            }
        }
    }

    /// The peer closed its side of the stream.
    pub fn handle_eof(&mut self) {
        if self.state != State::Closed {
            let reason = self.releasing.take().unwrap_or(CloseReason::PeerClosed);
            self.close(reason);
        }
    }

    /// Handles the payload of one binary WebSocket message (RFC 8323 §4.4): exactly one
    /// CoAP message. A malformed or oversized one aborts the connection. On a
    /// connection with stream framing the bytes are handled as by
    /// [`TcpConnection::handle_bytes`].
    pub fn handle_ws_message(&mut self, now: Instant, message: &[u8]) {
        if self.framing == Framing::Stream {
            self.handle_bytes(now, message);
            return;
        }
        if self.state == State::Closed {
            return;
        }
        // As for streams, tolerate peers counting the limit without the header.
        let limit = (self.config.max_message_size as usize).saturating_add(MAX_FRAME_HEADER);
        match decode_ws(message, limit) {
            Ok(msg) => {
                self.received(now);
                self.handle_message(msg);
            }
            Err(e) => {
                let diagnostic = match e {
                    TcpDecodeError::TooLarge { .. } => e.to_string(),
                    _ => format!("malformed message: {e}"),
                };
                self.abort(None, &diagnostic);
            }
        }
    }

    /// Handles bytes read from the stream, in any split: a message may arrive over many
    /// calls and one call may carry many messages. On a connection with WebSocket
    /// framing each call is taken as one whole WebSocket message
    /// ([`TcpConnection::handle_ws_message`]).
    pub fn handle_bytes(&mut self, now: Instant, bytes: &[u8]) {
        if self.framing == Framing::WebSocket {
            self.handle_ws_message(now, bytes);
            return;
        }
        if self.state == State::Closed || bytes.is_empty() {
            return;
        }
        self.inbuf.extend_from_slice(bytes);
        let mut at = 0;
        // Peers may count Max-Message-Size without the framing header: accept that much
        // more (and send no more than the limit, header included).
        let limit = (self.config.max_message_size as usize).saturating_add(MAX_FRAME_HEADER);
        while self.state != State::Closed {
            match decode_tcp(&self.inbuf[at..], limit) {
                Ok(Some((msg, used))) => {
                    at += used;
                    self.received(now);
                    self.handle_message(msg);
                }
                Ok(None) => break,
                Err(e) => {
                    let diagnostic = match e {
                        TcpDecodeError::TooLarge { .. } => e.to_string(),
                        _ => format!("malformed message: {e}"),
                    };
                    self.abort(None, &diagnostic);
                    break;
                }
            }
        }
        if self.state == State::Closed {
            self.inbuf = Vec::new();
            self.partial_since = None;
            return;
        }
        self.inbuf.drain(..at);
        if self.inbuf.is_empty() {
            self.partial_since = None;
        } else if at > 0 || self.partial_since.is_none() {
            // A new incomplete frame began with this read.
            self.partial_since = Some(now);
        }
    }

    /// A complete message arrived: the peer is alive.
    fn received(&mut self, now: Instant) {
        self.last_activity = now;
        self.last_received = now;
        self.keepalive_sent = None;
    }

    fn handle_message(&mut self, msg: TcpMessage) {
        if self.state == State::AwaitingCsm && msg.code != signal_code::CSM {
            self.abort(None, "first message was not a CSM");
            return;
        }
        if msg.code.is_signaling() {
            self.handle_signal(msg);
        } else if msg.code.is_request() {
            self.handle_request(msg);
        } else if msg.code.is_response() {
            // A response with an unknown token (late, or cancelled) is dropped.
            if let Some(&kind) = self.outbound.get(&msg.token) {
                let notification = msg.options.contains(number::OBSERVE);
                match kind {
                    // Sent before the peer saw our deregistration: nobody wants it.
                    Outbound::Deregister if notification => return,
                    Outbound::Observe if notification => {}
                    _ => {
                        self.outbound.remove(&msg.token);
                    }
                }
                self.events.push_back(TcpEvent::Response {
                    token: msg.token.clone(),
                    message: msg,
                });
                self.close_if_released();
            }
        }
        // 0.00 (keepalive) and reserved classes are ignored (RFC 8323 §3.4).
    }

    fn handle_request(&mut self, msg: TcpMessage) {
        let token = msg.token.clone();
        if let Some(bad) = msg
            .options
            .first_bad_critical_except(&self.config.handled_options)
        {
            let mut resp = TcpMessage::new(Code::BAD_OPTION);
            resp.token = token;
            resp.payload = format!("unrecognized critical option {bad}").into_bytes();
            self.queue_checked(resp);
            return;
        }
        if token.len() > self.config.max_token_len {
            // Longer than our CSM announced (RFC 8974 §2.2.1): answered, not handled.
            let mut resp = TcpMessage::new(Code::BAD_REQUEST);
            resp.payload = format!(
                "Token of {} bytes is longer than the {} this server accepts",
                token.len(),
                self.config.max_token_len
            )
            .into_bytes();
            resp.token = token;
            self.queue_checked(resp);
            return;
        }
        if self.inbound_seqs.len() >= self.config.max_inbound_requests {
            let mut resp = TcpMessage::new(Code::SERVICE_UNAVAILABLE);
            resp.token = token;
            resp.options.set_uint(number::MAX_AGE, 1);
            self.queue_checked(resp);
            return;
        }
        // A new request with an observation's token replaces it (RFC 7641 §3.6, §4.1):
        // its own response registers it again or not.
        self.observed.remove(&token);
        let seq = self.next_seq;
        self.next_seq += 1;
        self.inbound
            .entry(token.clone())
            .or_default()
            .push_back(seq);
        self.inbound_seqs.insert(seq);
        self.events.push_back(TcpEvent::Request {
            token,
            message: msg,
        });
    }

    fn handle_signal(&mut self, msg: TcpMessage) {
        let signal = match Signal::from_message(&msg) {
            Ok(s) => s,
            Err(SignalError::UnknownCode(_)) => return, // ignored
            Err(SignalError::UnknownCriticalOption(n)) if msg.code == signal_code::CSM => {
                self.abort(Some(n), &format!("unsupported critical CSM option {n}"));
                return;
            }
            Err(e) => {
                self.abort(None, &format!("bad signaling message: {e}"));
                return;
            }
        };
        match signal {
            Signal::Csm {
                max_message_size,
                block_wise_transfer,
                extended_token_length,
            } => {
                if let Some(m) = max_message_size {
                    self.peer_max_message_size = m;
                }
                if let Some(len) = extended_token_length {
                    // Below 8 would deny what RFC 7252 grants; beyond the wire maximum
                    // means nothing more.
                    self.peer_max_token_len = (len as usize).clamp(8, MAX_TOKEN_LEN);
                }
                // Block-Wise-Transfer is sticky once announced (RFC 8323 §5.3.2).
                self.peer_bert |= block_wise_transfer;
                if self.state == State::AwaitingCsm {
                    self.state = State::Open;
                }
                self.events.push_back(TcpEvent::PeerSettings {
                    max_token_len: self.peer_max_token_len,
                    max_message_size: self.peer_max_message_size,
                    block_wise_transfer: self.peer_bert,
                });
            }
            Signal::Ping { custody: false } => {
                let mut pong = Signal::Pong { custody: false }.to_message();
                pong.token = msg.token;
                self.queue(&pong);
            }
            Signal::Ping { custody: true } => {
                if self.deferred_pongs.len() >= MAX_PINGS {
                    // Answer the oldest without Custody rather than remember it forever.
                    if let Some((_, token)) = self.deferred_pongs.pop_front() {
                        let mut pong = Signal::Pong { custody: false }.to_message();
                        pong.token = token;
                        self.queue(&pong);
                    }
                }
                self.deferred_pongs.push_back((self.next_seq, msg.token));
                self.next_seq += 1;
                self.send_due_pongs();
            }
            Signal::Pong { .. } => {
                // Only Pongs answering our Pings are reported; others are ignored.
                if let Some(i) = self.pings.iter().position(|t| *t == msg.token) {
                    self.pings.remove(i);
                    self.events.push_back(TcpEvent::Pong { token: msg.token });
                }
            }
            Signal::Release {
                alternative_addresses,
                hold_off,
                diagnostic,
            } => {
                if self.releasing.is_none() {
                    self.events.push_back(TcpEvent::ReleaseReceived {
                        alternative_addresses: alternative_addresses.clone(),
                        hold_off,
                    });
                }
                self.releasing = Some(CloseReason::PeerRelease {
                    alternative_addresses,
                    hold_off,
                    diagnostic,
                });
                self.close_if_released();
            }
            Signal::Abort {
                bad_csm_option,
                diagnostic,
            } => self.close(CloseReason::PeerAbort {
                bad_csm_option,
                diagnostic,
            }),
        }
    }

    /// Sends a request; returns the token its responses will carry. A message without a
    /// token, or with one already in use, gets a fresh one; with Observe=0 the token
    /// stays registered for notifications until [`TcpConnection::cancel`] or a
    /// response without Observe.
    ///
    /// A GET carrying Observe with the token of one of our observations reuses that
    /// token (RFC 7641 §3.6): Observe=0 registers again, Observe=1 deregisters — the
    /// notifications still arriving before its answer are dropped, and its answer
    /// ends the observation.
    pub fn request(&mut self, now: Instant, mut msg: TcpMessage) -> Result<Token, SendError> {
        if self.state == State::Closed || self.releasing.is_some() {
            return Err(SendError::Closed);
        }
        if !msg.code.is_request() {
            return Err(SendError::WrongCode(msg.code));
        }
        let observe = msg.options.get_uint(number::OBSERVE);
        let reuse = msg.code == Code::GET
            && observe.is_some()
            && self.outbound.get(&msg.token) == Some(&Outbound::Observe);
        let token_space = 1usize
            .checked_shl(8 * self.config.token_len.clamp(1, 8) as u32)
            .unwrap_or(usize::MAX);
        let limit = self.config.max_outbound_requests.min(token_space - 1);
        if !reuse && self.outbound.len() >= limit {
            return Err(SendError::TooManyRequests);
        }
        if !reuse && (msg.token.is_empty() || self.outbound.contains_key(&msg.token)) {
            msg.token = self.fresh_token();
        }
        let token_limit = self.peer_max_token_len.min(self.config.max_token_len);
        if msg.token.len() > token_limit {
            return Err(SendError::TokenTooLong {
                len: msg.token.len(),
                limit: token_limit,
            });
        }
        self.check_size(&msg)?;
        let kind = match observe {
            Some(0) => Outbound::Observe,
            Some(1) if reuse => Outbound::Deregister,
            _ => Outbound::Request,
        };
        self.outbound.insert(msg.token.clone(), kind);
        self.last_activity = now;
        self.queue(&msg);
        Ok(msg.token)
    }

    /// Forgets one of our requests or observations; later responses with its token are
    /// ignored. (To deregister an observation at the server, send a GET with Observe=1.)
    pub fn cancel(&mut self, token: Token) {
        self.outbound.remove(&token);
        self.close_if_released();
    }

    fn close_if_released(&mut self) {
        if self.outbound.is_empty() && self.state != State::Closed {
            if let Some(reason) = self.releasing.take() {
                self.close(reason);
            }
        }
    }

    /// Sends the Pongs with Custody whose earlier requests have all been answered.
    fn send_due_pongs(&mut self) {
        let oldest_pending = self.inbound_seqs.first().copied().unwrap_or(u64::MAX);
        while let Some(&(seq, _)) = self.deferred_pongs.front() {
            if seq > oldest_pending {
                break;
            }
            let Some((_, token)) = self.deferred_pongs.pop_front() else {
                break;
            };
            let mut pong = Signal::Pong { custody: true }.to_message();
            pong.token = token;
            self.queue(&pong);
        }
    }

    /// Answers the peer's request with this token.
    /// A response larger than the peer's Max-Message-Size is refused and the request
    /// stays pending, so that a smaller (error) response can be sent instead.
    /// A success response carrying Observe registers the token as an observation of
    /// the peer's: further notifications go out with [`TcpConnection::notify`].
    pub fn respond(
        &mut self,
        now: Instant,
        token: Token,
        msg: TcpMessage,
    ) -> Result<(), SendError> {
        let msg = self.outgoing_response(token.clone(), msg)?;
        let Some(seqs) = self.inbound.get_mut(&token) else {
            return Err(SendError::UnknownToken(token));
        };
        let seq = seqs.pop_front();
        if seqs.is_empty() {
            self.inbound.remove(&token);
        }
        if let Some(seq) = seq {
            self.inbound_seqs.remove(&seq);
        }
        if msg.code.is_success() && msg.options.contains(number::OBSERVE) {
            self.observed.insert(token);
        }
        self.last_activity = now;
        self.queue(&msg);
        self.send_due_pongs();
        Ok(())
    }

    /// Sends a notification for the peer's observation with this token (one that a
    /// success response carrying Observe registered, see [`TcpConnection::respond`]).
    /// A notification that is not a success or lacks Observe is the last one: the
    /// observation ends (RFC 7641 §4.2). Notifications are not requests of the peer,
    /// so they do not count for Custody Pongs (RFC 8323 §5.4.1).
    pub fn notify(&mut self, now: Instant, token: Token, msg: TcpMessage) -> Result<(), SendError> {
        let msg = self.outgoing_response(token.clone(), msg)?;
        if !self.observed.contains(&token) {
            return Err(SendError::UnknownToken(token));
        }
        if !(msg.code.is_success() && msg.options.contains(number::OBSERVE)) {
            self.observed.remove(&token);
        }
        self.last_activity = now;
        self.queue(&msg);
        Ok(())
    }

    /// Sends a Ping; the Pong arrives as [`TcpEvent::Pong`] with the returned token.
    pub fn ping(&mut self, custody: bool) -> Result<Token, SendError> {
        if self.state == State::Closed {
            return Err(SendError::Closed);
        }
        let mut m = Signal::Ping { custody }.to_message();
        m.token = self.fresh_token();
        if self.pings.len() >= MAX_PINGS {
            self.pings.remove(0);
        }
        self.pings.push(m.token.clone());
        self.queue(&m);
        Ok(m.token)
    }

    /// Closes gracefully: queues Release and emits `Closed { LocalRelease }`.
    pub fn release(&mut self) {
        if self.state != State::Closed {
            self.release_with("", CloseReason::LocalRelease);
        }
    }

    /// Closes because of an error of the application's own: queues Abort.
    pub fn abort(&mut self, bad_csm_option: Option<u16>, diagnostic: &str) {
        if self.state != State::Closed {
            self.abort_with(
                bad_csm_option,
                diagnostic,
                CloseReason::LocalAbort(diagnostic.to_string()),
            );
        }
    }

    fn abort_with(&mut self, bad_csm_option: Option<u16>, diagnostic: &str, reason: CloseReason) {
        let m = Signal::Abort {
            bad_csm_option,
            diagnostic: diagnostic.to_string(),
        }
        .to_message();
        self.queue_checked(m);
        self.close(reason);
    }

    fn release_with(&mut self, diagnostic: &str, reason: CloseReason) {
        let m = Signal::Release {
            alternative_addresses: Vec::new(),
            hold_off: None,
            diagnostic: diagnostic.to_string(),
        }
        .to_message();
        self.queue_checked(m);
        self.close(reason);
    }

    fn close(&mut self, reason: CloseReason) {
        self.state = State::Closed;
        let outstanding = self.outbound.drain().map(|(t, _)| t).collect();
        self.observed.clear();
        self.inbound.clear();
        self.inbound_seqs.clear();
        self.deferred_pongs.clear();
        self.releasing = None;
        self.events.push_back(TcpEvent::Closed {
            reason,
            outstanding,
        });
    }

    /// A response or notification for the peer, with `token`, if it may be sent: the
    /// connection is open, the code is a response code, and it fits the peer's limit.
    fn outgoing_response(
        &self,
        token: Token,
        mut msg: TcpMessage,
    ) -> Result<TcpMessage, SendError> {
        if self.state == State::Closed {
            return Err(SendError::Closed);
        }
        if !msg.code.is_response() {
            return Err(SendError::WrongCode(msg.code));
        }
        msg.token = token;
        self.check_size(&msg)?;
        Ok(msg)
    }

    fn check_size(&self, msg: &TcpMessage) -> Result<(), SendError> {
        let size = self.frame_len(msg);
        if size > self.peer_max_message_size as usize {
            return Err(SendError::TooLarge {
                size,
                limit: self.peer_max_message_size,
            });
        }
        Ok(())
    }

    /// Queues a message generated by the connection itself, trimming its diagnostic
    /// payload if it would exceed the peer's limit.
    fn queue_checked(&mut self, mut msg: TcpMessage) {
        if self.check_size(&msg).is_err() {
            msg.payload.clear();
        }
        self.queue(&msg);
    }

    fn queue(&mut self, msg: &TcpMessage) {
        match self.framing {
            Framing::Stream => encode_tcp(msg, &mut self.outbuf),
            Framing::WebSocket => {
                let mut out = Vec::new();
                encode_ws(msg, &mut out);
                self.outmsgs.push_back(out);
            }
        }
    }

    fn fresh_token(&mut self) -> Token {
        loop {
            self.next_token = self.next_token.wrapping_add(1);
            let len = self.config.token_len.clamp(1, 8);
            let wide = u64::from(self.next_token).to_be_bytes();
            let t = Token::new(&wide[8 - len..]).unwrap_or(Token::EMPTY);
            if !self.outbound.contains_key(&t) {
                return t;
            }
        }
    }
}

#[cfg(test)]
mod sim_tests;
#[cfg(test)]
mod tests;
