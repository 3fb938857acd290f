//! Server configuration: one TOML file, environment variables and command-line overrides.
//!
//! Every setting has a built-in default, so no file is needed. Sources are applied in
//! this order, each overriding the ones before:
//!
//! 1. built-in defaults ([`Config::default`], printed by [`Config::default_toml`]);
//! 2. the TOML file ([`ConfigLoader::file`]);
//! 3. environment variables `COBALT_<SECTION>_<KEY>`, e.g. `COBALT_ENDPOINT_ACK_TIMEOUT=3s`
//!    ([`ConfigLoader::env`]);
//! 4. command-line overrides `section.key=value` ([`ConfigLoader::set`]).
//!
//! Unknown keys are refused naming the key, and so are values outside their range
//! (naming the key and the allowed range), before anything starts.
//!
//! Durations are strings with a unit — `"1500ms"`, `"2s"`, `"5m"`, `"24h"`, combinations
//! such as `"1m30s"` — or a plain number of seconds (`2`, `0.5`).
//!
//! ```
//! use cobalt::config::Config;
//!
//! let config = Config::loader()
//!     .toml("[endpoint]\nack_timeout = \"3s\"\n", "example.toml")?
//!     .set("server.port", "5684", "--set")?
//!     .build()?;
//! assert_eq!(config.endpoint.ack_timeout, std::time::Duration::from_secs(3));
//! assert_eq!(config.server.port, 5684);
//! # Ok::<(), cobalt::config::ConfigError>(())
//! ```

use crate::server::ServerLimits;
use crate::transport::dtls::DtlsConfig;
use crate::transport::limits::TcpServerLimits;
use cobalt_proto::congestion::Algorithm;
use cobalt_proto::endpoint::EndpointConfig;
use cobalt_proto::tcp_connection::TcpConfig;
use serde::{Deserialize, Serialize};
use std::fmt::Write as _;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::path::Path;
use std::time::Duration;

/// The whole configuration of a server. `Default` gives the built-in defaults.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Protocol parameters (RFC 7252 §4.8) and state bounds of the endpoint.
    pub endpoint: EndpointSection,
    /// Server-role limits: observers, uploads, block size.
    pub limits: LimitsSection,
    /// Shards, receive batching and socket buffers.
    pub runtime: RuntimeSection,
    /// Where to listen.
    pub server: ServerSection,
    /// CoAP over TCP, TLS and WebSockets: connection limits and timers.
    pub connections: ConnectionsSection,
    /// CoAP over DTLS: session and handshake budgets, timers.
    pub dtls: DtlsSection,
    /// Logging.
    pub log: LogSection,
}

/// `[endpoint]`: the fields of [`EndpointConfig`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EndpointSection {
    /// ACK_TIMEOUT.
    #[serde(with = "duration")]
    pub ack_timeout: Duration,
    /// ACK_RANDOM_FACTOR.
    pub ack_random_factor: f64,
    /// MAX_RETRANSMIT.
    pub max_retransmit: u32,
    /// NSTART.
    pub nstart: usize,
    /// MAX_LATENCY.
    #[serde(with = "duration")]
    pub max_latency: Duration,
    /// PROCESSING_DELAY.
    #[serde(with = "duration")]
    pub processing_delay: Duration,
    /// Delay before a slow handler's request gets an empty ACK.
    #[serde(with = "duration")]
    pub separate_ack_delay: Duration,
    /// Client wait for NON or separate responses; `None` (`"auto"`) derives it.
    #[serde(with = "auto_duration")]
    pub response_timeout: Option<Duration>,
    /// Messages remembered per peer for deduplication.
    pub dedup_per_peer: usize,
    /// Bytes the deduplication store may hold.
    pub max_dedup_bytes: usize,
    /// Bound on requests being handled at once.
    pub max_server_exchanges: usize,
    /// Bound on requests in progress per peer (IP and port).
    pub max_exchanges_per_peer: usize,
    /// Bound on requests in progress per IP address.
    pub max_exchanges_per_ip: usize,
    /// Bound on outstanding client requests.
    pub max_client_exchanges: usize,
    /// Token length in bytes.
    pub token_len: usize,
    /// Keep no answers of safe requests for duplicates.
    pub dedup_rerun_safe: bool,
    /// Max-Age (s) on 5.03 and 4.29 answers.
    pub overload_max_age: u32,
    /// Amplification limit for unverified peers (RFC 9175); 0: off.
    pub amplification_factor: usize,
    /// How long a verified address stays verified.
    #[serde(with = "duration")]
    pub verified_lifetime: Duration,
    /// Verified addresses remembered.
    pub max_verified_peers: usize,
    /// Address verifications in progress.
    pub max_address_probes: usize,
    /// Retransmission-timeout algorithm (`default`, `cocoa`, `cocoa-strong`, `fasor`, `fasor-k`, `karn`).
    #[serde(with = "algorithm")]
    pub congestion_control: Algorithm,
    /// Bound on peers with congestion state.
    pub max_congestion_peers: usize,
}

impl Default for EndpointSection {
    fn default() -> Self {
        EndpointSection::from(&EndpointConfig::default())
    }
}

impl From<&EndpointConfig> for EndpointSection {
    fn from(c: &EndpointConfig) -> Self {
        EndpointSection {
            ack_timeout: c.ack_timeout,
            ack_random_factor: c.ack_random_factor,
            max_retransmit: c.max_retransmit,
            nstart: c.nstart,
            max_latency: c.max_latency,
            processing_delay: c.processing_delay,
            separate_ack_delay: c.separate_ack_delay,
            response_timeout: c.response_timeout,
            dedup_per_peer: c.dedup_per_peer,
            max_dedup_bytes: c.max_dedup_bytes,
            max_server_exchanges: c.max_server_exchanges,
            max_exchanges_per_peer: c.max_exchanges_per_peer,
            max_exchanges_per_ip: c.max_exchanges_per_ip,
            max_client_exchanges: c.max_client_exchanges,
            token_len: c.token_len,
            dedup_rerun_safe: c.dedup_rerun_safe,
            overload_max_age: c.overload_max_age,
            amplification_factor: c.amplification_factor,
            verified_lifetime: c.verified_lifetime,
            max_verified_peers: c.max_verified_peers,
            max_address_probes: c.max_address_probes,
            congestion_control: c.congestion_control,
            max_congestion_peers: c.max_congestion_peers,
        }
    }
}

impl From<&EndpointSection> for EndpointConfig {
    fn from(s: &EndpointSection) -> Self {
        EndpointConfig {
            ack_timeout: s.ack_timeout,
            ack_random_factor: s.ack_random_factor,
            max_retransmit: s.max_retransmit,
            nstart: s.nstart,
            max_latency: s.max_latency,
            processing_delay: s.processing_delay,
            separate_ack_delay: s.separate_ack_delay,
            response_timeout: s.response_timeout,
            dedup_per_peer: s.dedup_per_peer,
            max_dedup_bytes: s.max_dedup_bytes,
            max_server_exchanges: s.max_server_exchanges,
            max_exchanges_per_peer: s.max_exchanges_per_peer,
            max_exchanges_per_ip: s.max_exchanges_per_ip,
            max_client_exchanges: s.max_client_exchanges,
            token_len: s.token_len,
            dedup_rerun_safe: s.dedup_rerun_safe,
            overload_max_age: s.overload_max_age,
            amplification_factor: s.amplification_factor,
            verified_lifetime: s.verified_lifetime,
            max_verified_peers: s.max_verified_peers,
            max_address_probes: s.max_address_probes,
            congestion_control: s.congestion_control,
            max_congestion_peers: s.max_congestion_peers,
        }
    }
}

/// `[limits]`: the fields of [`ServerLimits`] (see there for the defaults).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LimitsSection {
    /// Observe relations over all resources, shards and connections.
    pub max_observers: usize,
    /// Observe relations one client IP address may hold.
    pub max_observers_per_ip: usize,
    /// Every this many notifications one is confirmable.
    pub observe_con_every: u32,
    /// A confirmable notification at least this often.
    #[serde(with = "duration")]
    pub observe_con_interval: Duration,
    /// Least time between two notifications to one observer over UDP.
    #[serde(with = "duration")]
    pub observe_min_interval: Duration,
    /// Observers a UDP shard notifies per turn of its loop.
    pub observe_batch: usize,
    /// Largest request body reassembled from Block1 blocks (bytes).
    pub max_body: usize,
    /// Block1 uploads in progress per shard or listener.
    pub max_uploads: usize,
    /// Uploads in progress one client IP address may hold per shard or listener.
    pub max_uploads_per_ip: usize,
    /// Uploads in progress one client address and port may hold.
    pub max_uploads_per_peer: usize,
    /// Bytes all uploads of one shard or listener may hold together.
    pub max_upload_memory: usize,
    /// Bytes the uploads of one client IP address may hold per shard or listener.
    pub max_upload_memory_per_ip: usize,
    /// An upload with no block for this long is dropped.
    #[serde(with = "duration")]
    pub upload_idle_timeout: Duration,
    /// Max-Age (s) of 4.29 and 5.03 answers when a bound of this section is reached.
    pub refusal_max_age: u32,
    /// Block size exponent of responses (0–6).
    pub block_szx: u8,
}

impl Default for LimitsSection {
    fn default() -> Self {
        LimitsSection::from(&ServerLimits::default())
    }
}

impl From<&ServerLimits> for LimitsSection {
    fn from(l: &ServerLimits) -> Self {
        LimitsSection {
            max_observers: l.max_observers,
            max_observers_per_ip: l.max_observers_per_ip,
            observe_con_every: l.observe_con_every,
            observe_con_interval: l.observe_con_interval,
            observe_min_interval: l.observe_min_interval,
            observe_batch: l.observe_batch,
            max_body: l.max_body,
            max_uploads: l.max_uploads,
            max_uploads_per_ip: l.max_uploads_per_ip,
            max_uploads_per_peer: l.max_uploads_per_peer,
            max_upload_memory: l.max_upload_memory,
            max_upload_memory_per_ip: l.max_upload_memory_per_ip,
            upload_idle_timeout: l.upload_idle_timeout,
            refusal_max_age: l.refusal_max_age,
            block_szx: l.block_szx,
        }
    }
}

impl From<&LimitsSection> for ServerLimits {
    fn from(s: &LimitsSection) -> Self {
        ServerLimits {
            max_observers: s.max_observers,
            max_observers_per_ip: s.max_observers_per_ip,
            observe_con_every: s.observe_con_every,
            observe_con_interval: s.observe_con_interval,
            observe_min_interval: s.observe_min_interval,
            observe_batch: s.observe_batch,
            max_body: s.max_body,
            max_uploads: s.max_uploads,
            max_uploads_per_ip: s.max_uploads_per_ip,
            max_uploads_per_peer: s.max_uploads_per_peer,
            max_upload_memory: s.max_upload_memory,
            max_upload_memory_per_ip: s.max_upload_memory_per_ip,
            upload_idle_timeout: s.upload_idle_timeout,
            refusal_max_age: s.refusal_max_age,
            block_szx: s.block_szx,
        }
    }
}

/// `[connections]`: the [`TcpServerLimits`] of the TCP, TLS and WebSocket listeners.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ConnectionsSection {
    /// Connections served at once per listener.
    pub max_connections: usize,
    /// Connections served at once per source address.
    pub max_connections_per_ip: usize,
    /// TLS handshakes and WebSocket upgrades in progress per source address.
    pub max_handshakes_per_ip: usize,
    /// Largest message accepted (announced in the CSM), in bytes.
    pub max_message_size: u32,
    /// Announce BERT (RFC 8323 §6).
    pub bert: bool,
    /// Largest BERT block sent, in bytes.
    pub max_bert_block: usize,
    /// Time for the peer's CSM.
    #[serde(with = "duration")]
    pub csm_timeout: Duration,
    /// Time for one message to arrive once begun.
    #[serde(with = "duration")]
    pub frame_timeout: Duration,
    /// Release a connection idle this long; 0: never.
    #[serde(with = "duration")]
    pub idle_timeout: Duration,
    /// Keep-alive Ping after this much silence; 0: none.
    #[serde(with = "duration")]
    pub keepalive: Duration,
    /// Time for the TLS handshake and the WebSocket upgrade.
    #[serde(with = "duration")]
    pub handshake_timeout: Duration,
    /// Time a write may block on a peer that does not read.
    #[serde(with = "duration")]
    pub write_timeout: Duration,
    /// Requests of one connection handled at once; beyond it 5.03.
    pub max_inbound_requests: usize,
}

impl Default for ConnectionsSection {
    fn default() -> Self {
        ConnectionsSection::from(&TcpServerLimits::default())
    }
}

impl From<&TcpServerLimits> for ConnectionsSection {
    fn from(l: &TcpServerLimits) -> Self {
        let c = &l.connection;
        ConnectionsSection {
            max_connections: l.max_connections,
            max_connections_per_ip: l.max_connections_per_ip,
            max_handshakes_per_ip: l.max_handshakes_per_ip,
            max_message_size: c.max_message_size,
            bert: c.block_wise_transfer,
            max_bert_block: l.max_bert_block,
            csm_timeout: c.csm_timeout,
            frame_timeout: c.frame_timeout,
            idle_timeout: c.idle_timeout.unwrap_or_default(),
            keepalive: c.keepalive.unwrap_or_default(),
            handshake_timeout: l.handshake_timeout,
            write_timeout: l.write_timeout,
            max_inbound_requests: c.max_inbound_requests,
        }
    }
}

impl From<&ConnectionsSection> for TcpServerLimits {
    fn from(s: &ConnectionsSection) -> Self {
        let nonzero = |d: Duration| (!d.is_zero()).then_some(d);
        TcpServerLimits {
            max_connections: s.max_connections,
            max_connections_per_ip: s.max_connections_per_ip,
            max_handshakes_per_ip: s.max_handshakes_per_ip,
            connection: TcpConfig {
                max_message_size: s.max_message_size,
                block_wise_transfer: s.bert,
                csm_timeout: s.csm_timeout,
                frame_timeout: s.frame_timeout,
                idle_timeout: nonzero(s.idle_timeout),
                keepalive: nonzero(s.keepalive),
                max_inbound_requests: s.max_inbound_requests,
                ..TcpConfig::default()
            },
            write_timeout: s.write_timeout,
            handshake_timeout: s.handshake_timeout,
            max_bert_block: s.max_bert_block,
        }
    }
}

/// `[dtls]`: the session table limits of [`DtlsConfig`] (per DTLS shard).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DtlsSection {
    /// Established sessions per shard.
    pub max_sessions: usize,
    /// Handshakes in progress per shard.
    pub max_handshakes: usize,
    /// Handshakes in progress per source address.
    pub max_handshakes_per_ip: usize,
    /// Silence after which a session may be replaced when the table is full.
    #[serde(with = "duration")]
    pub stale_after: Duration,
    /// Time for a handshake.
    #[serde(with = "duration")]
    pub handshake_timeout: Duration,
    /// Silence after which a session is dropped.
    #[serde(with = "duration")]
    pub idle_timeout: Duration,
}

impl Default for DtlsSection {
    fn default() -> Self {
        DtlsSection::from(&DtlsConfig::default())
    }
}

impl From<&DtlsConfig> for DtlsSection {
    fn from(c: &DtlsConfig) -> Self {
        DtlsSection {
            max_sessions: c.max_sessions,
            max_handshakes: c.max_handshakes,
            max_handshakes_per_ip: c.max_handshakes_per_ip,
            stale_after: c.stale_after,
            handshake_timeout: c.handshake_timeout,
            idle_timeout: c.idle_timeout,
        }
    }
}

impl From<&DtlsSection> for DtlsConfig {
    fn from(s: &DtlsSection) -> Self {
        DtlsConfig {
            max_sessions: s.max_sessions,
            max_handshakes: s.max_handshakes,
            max_handshakes_per_ip: s.max_handshakes_per_ip,
            stale_after: s.stale_after,
            handshake_timeout: s.handshake_timeout,
            idle_timeout: s.idle_timeout,
            ..DtlsConfig::default()
        }
    }
}

/// Default datagrams read per wake-up of a shard (4 `recvmmsg` batches of 64).
pub const DEFAULT_RECV_BATCH: usize = 256;
/// Default socket buffer size asked of the kernel (4 MiB; the kernel may cap it).
pub const DEFAULT_SOCKET_BUFFER: usize = 4 << 20;

/// `[runtime]`: threads and sockets.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RuntimeSection {
    /// Shards (threads with their own `SO_REUSEPORT` socket); 0: one per core.
    pub shards: usize,
    /// Datagrams read per wake-up before timers and commands get a turn (rounded up
    /// to whole `recvmmsg` batches of 64).
    pub recv_batch: usize,
    /// `SO_RCVBUF` asked for each shard socket (bytes); 0 keeps the kernel default.
    pub socket_recv_buffer: usize,
    /// `SO_SNDBUF` asked for each shard socket (bytes); 0 keeps the kernel default.
    pub socket_send_buffer: usize,
}

impl Default for RuntimeSection {
    fn default() -> Self {
        RuntimeSection {
            shards: 0,
            recv_batch: DEFAULT_RECV_BATCH,
            socket_recv_buffer: DEFAULT_SOCKET_BUFFER,
            socket_send_buffer: DEFAULT_SOCKET_BUFFER,
        }
    }
}

/// `[server]`: addresses.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerSection {
    /// IP address to listen on (`::` serves IPv4 and IPv6).
    pub bind: IpAddr,
    /// UDP port (0: any free port).
    pub port: u16,
    /// Address of the Prometheus metrics HTTP endpoint (`GET /metrics`); `None`
    /// (`""` in the file) serves none.
    #[serde(with = "optional_addr")]
    pub metrics_addr: Option<SocketAddr>,
}

impl Default for ServerSection {
    fn default() -> Self {
        ServerSection {
            bind: IpAddr::V6(Ipv6Addr::UNSPECIFIED),
            port: 5683,
            metrics_addr: None,
        }
    }
}

impl ServerSection {
    /// The UDP address to bind: `bind` and `port`.
    pub fn socket_addr(&self) -> SocketAddr {
        SocketAddr::new(self.bind, self.port)
    }
}

/// The log levels accepted by `log.level`.
pub const LOG_LEVELS: [&str; 6] = ["off", "error", "warn", "info", "debug", "trace"];

/// `[log]`: logging.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LogSection {
    /// Most verbose level logged to stderr (one of [`LOG_LEVELS`]); `RUST_LOG` wins.
    pub level: String,
}

impl Default for LogSection {
    fn default() -> Self {
        LogSection {
            level: "info".into(),
        }
    }
}

/// Why a configuration was refused. Every variant names the key or the source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConfigError {
    /// The file could not be read.
    Read {
        /// The file.
        path: String,
        /// The operating system's reason.
        reason: String,
    },
    /// Malformed TOML, an unknown key or a value of the wrong type in a file.
    Parse {
        /// Where the text came from (the file name).
        origin: String,
        /// The parser's message (it names the key, with line and column).
        message: String,
    },
    /// An override names a key that does not exist.
    UnknownKey {
        /// The key as `section.key`.
        key: String,
        /// The environment variable or command-line flag it came from.
        origin: String,
    },
    /// An override's value cannot be read as the key's type.
    BadValue {
        /// The key as `section.key`.
        key: String,
        /// The environment variable or command-line flag it came from.
        origin: String,
        /// What is wrong.
        message: String,
    },
    /// A value outside its allowed range.
    OutOfRange {
        /// The key as `section.key`.
        key: String,
        /// The value given.
        value: String,
        /// The allowed range.
        allowed: String,
    },
}

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ConfigError::Read { path, reason } => {
                write!(f, "cannot read configuration file {path}: {reason}")
            }
            ConfigError::Parse { origin, message } => {
                write!(f, "invalid configuration in {origin}: {}", message.trim_end())
            }
            ConfigError::UnknownKey { key, origin } => write!(
                f,
                "unknown configuration key `{key}` (from {origin}); `cobalt serve --print-config` lists them all"
            ),
            ConfigError::BadValue {
                key,
                origin,
                message,
            } => write!(f, "invalid value for `{key}` (from {origin}): {message}"),
            ConfigError::OutOfRange {
                key,
                value,
                allowed,
            } => write!(f, "invalid value for `{key}`: {value}; allowed {allowed}"),
        }
    }
}

impl std::error::Error for ConfigError {}

/// Documentation of one key: what it does and the values allowed.
struct KeyDoc {
    section: &'static str,
    key: &'static str,
    doc: &'static str,
    allowed: &'static str,
}

const fn k(
    section: &'static str,
    key: &'static str,
    doc: &'static str,
    allowed: &'static str,
) -> KeyDoc {
    KeyDoc {
        section,
        key,
        doc,
        allowed,
    }
}

/// The sections, in file order, with their description.
const SECTIONS: [(&str, &str); 7] = [
    (
        "endpoint",
        "Protocol parameters of RFC 7252 §4.8 and bounds on the endpoint's state.",
    ),
    (
        "limits",
        "Server-role limits: observers, uploads, block size.",
    ),
    ("runtime", "Threads and sockets."),
    ("server", "Where to listen."),
    (
        "connections",
        "CoAP over TCP, TLS and WebSockets (each listener): connection limits and timers.",
    ),
    (
        "dtls",
        "CoAP over DTLS (each shard's session table): session and handshake budgets, timers.",
    ),
    ("log", "Logging to stderr."),
];

/// Every key, in file order. A test checks that this matches the structs exactly.
const KEYS: &[KeyDoc] = &[
    k("endpoint", "ack_timeout", "Initial retransmission timeout of a confirmable message (ACK_TIMEOUT).", "1ms to 600s"),
    k("endpoint", "ack_random_factor", "Randomisation of the initial timeout (ACK_RANDOM_FACTOR).", "1.0 to 10.0"),
    k("endpoint", "max_retransmit", "Retransmissions of a confirmable message before giving up (MAX_RETRANSMIT).", "0 to 20"),
    k("endpoint", "nstart", "Outstanding interactions per peer (NSTART); further requests queue.", "1 to 1024"),
    k("endpoint", "max_latency", "Maximum one-way latency assumed by the lifetimes (MAX_LATENCY).", "0s to 3600s"),
    k("endpoint", "processing_delay", "Time a receiver needs to answer a CON (PROCESSING_DELAY).", "0s to 600s"),
    k("endpoint", "separate_ack_delay", "A handler slower than this gets an empty ACK; its answer follows as a separate response.", "0s to 600s"),
    k("endpoint", "response_timeout", "Client wait for a NON response or a separate response; \"auto\": NON_LIFETIME resp. EXCHANGE_LIFETIME.", "\"auto\" or 1ms to 24h"),
    k("endpoint", "dedup_per_peer", "Messages remembered per peer (IP address and port) for deduplication: its last this many, each for EXCHANGE_LIFETIME. A duplicate older than that is processed again.", "1 to 1024"),
    k("endpoint", "max_dedup_bytes", "Bytes the deduplication store of one shard may hold (answers plus 160 bytes per message); near it the busiest peers keep only their last two messages, at it the oldest go. Nobody is refused for it.", "at least 65536"),
    k("endpoint", "max_server_exchanges", "Requests being handled at once per shard; at the bound an IP address that already has requests in progress gets 5.03 with Max-Age, one with none still gets in (up to an eighth more).", "at least 1"),
    k("endpoint", "max_exchanges_per_peer", "Requests in progress per peer (IP address and port); beyond it 4.29 Too Many Requests with Max-Age.", "at least 1"),
    k("endpoint", "max_exchanges_per_ip", "Requests in progress per IP address, over all its ports; beyond it 4.29 with Max-Age.", "at least 1"),
    k("endpoint", "max_client_exchanges", "Bound on client requests outstanding or queued.", "at least 1"),
    k("endpoint", "token_len", "Length of generated tokens in bytes.", "1 to 8"),
    k("endpoint", "dedup_rerun_safe", "Keep no answers of safe requests (GET, FETCH): a duplicate arriving after the answer runs the handler again (RFC 7252 §4.5); false keeps them like other methods' answers.", "true or false"),
    k("endpoint", "overload_max_age", "Max-Age (seconds) on 5.03 and 4.29 answers given when a bound is reached.", "0 to 4294967295"),
    k("endpoint", "amplification_factor", "Until a peer's address is verified it gets at most this many times the bytes of its request, and no notifications (RFC 9175 §2.4); more waits for one verification round trip (a CoAP ping the peer answers with RST). 0: off. DTLS peers are verified by the handshake.", "0 to 1000"),
    k("endpoint", "verified_lifetime", "How long a verified address stays verified after its last proof (RST to a ping, ACK, valid Echo).", "1s to 24h"),
    k("endpoint", "max_verified_peers", "Verified addresses remembered per shard; beyond it those verified longest ago verify again.", "at least 1"),
    k("endpoint", "max_address_probes", "Address verifications in progress per shard; beyond it an answer that needs one becomes 4.01 with Echo.", "at least 1"),
    k("endpoint", "congestion_control", "Retransmission timeouts of confirmable messages: \"default\" (RFC 7252: 2-3 s, doubled per retransmission), \"cocoa\" (draft-ietf-core-cocoa-03 RTT estimation), \"cocoa-strong\" (CoCoA without ambiguous samples), \"fasor\" (draft-ietf-core-fasor-02), \"fasor-k\" (FASOR keeping the backed-off timer until an unambiguous sample, as TCP does; the default) or \"karn\" (RFC 6298 with Karn's retention). See bench/congestion/ for the study behind the choice.", "default, cocoa, cocoa-strong, fasor, fasor-k, karn"),
    k("endpoint", "max_congestion_peers", "Bound on peers with congestion state (RTO estimates, NON pacing), kept at least 255 s after last use; beyond it new peers run on fresh state that is not kept.", "at least 1"),
    k("limits", "max_observers", "Observe relations over all resources, shards and connections; near it, registrations from addresses holding at least what is still free get 5.03 with Max-Age (others keep registering).", "0 or more"),
    k("limits", "max_observers_per_ip", "Observe relations one client IP address may hold over every transport; beyond it a registration gets 4.29 with Max-Age.", "1 to 100000000"),
    k("limits", "observe_con_every", "Every this many notifications one is confirmable (RFC 7641 §4.5).", "1 to 1000000"),
    k("limits", "observe_con_interval", "A confirmable notification at least this often.", "1s to 30d"),
    k("limits", "observe_min_interval", "Least time between two notifications to one observer over UDP; changes in between are coalesced into one notification of the latest state (RFC 7641 §4.5.1). 0: no pacing beyond holding notifications while a confirmable one is unacknowledged.", "0s to 1h"),
    k("limits", "observe_batch", "Observers a UDP shard notifies per turn of its loop before it reads its socket again.", "1 to 65536"),
    k("limits", "max_body", "Largest request body reassembled from Block1 blocks, in bytes; larger uploads get 4.13.", "1 to 1073741824"),
    k("limits", "max_uploads", "Block1 uploads in progress per shard (UDP) or listener (TCP, TLS, WebSockets); near it, addresses holding at least what is still free get 5.03 with Max-Age, and at it the heaviest address's oldest upload makes room for an address holding less.", "0 or more"),
    k("limits", "max_uploads_per_ip", "Uploads in progress one client IP address may hold per shard or listener; beyond it 4.29 with Max-Age.", "1 to 1000000"),
    k("limits", "max_uploads_per_peer", "Uploads in progress one client address and port may hold per shard or listener; beyond it 4.29 with Max-Age.", "1 to limits.max_uploads_per_ip"),
    k("limits", "max_upload_memory", "Bytes the uploads in progress (and answers kept for their Block2 follow-ups) of one shard or listener may hold together; near it, addresses holding at least what is still free get 5.03 with Max-Age.", "1024 to 68719476736"),
    k("limits", "max_upload_memory_per_ip", "Bytes the uploads in progress of one client IP address may hold per shard or listener; beyond it 4.29 with Max-Age.", "limits.max_body to limits.max_upload_memory"),
    k("limits", "upload_idle_timeout", "An upload that receives no block for this long is dropped, on a timer of its own (looked for every quarter of it); its next block gets 4.08.", "1s to 1h"),
    k("limits", "refusal_max_age", "Max-Age (seconds) of the 4.29 and 5.03 answers given when a bound of this section is reached.", "0 to 86400"),
    k("limits", "block_szx", "Block size exponent of responses: block size 2^(4+szx) bytes.", "0 to 6 (16 to 1024 bytes)"),
    k("runtime", "shards", "Shards: threads with their own SO_REUSEPORT socket; 0: one per core.", "0 to 1024"),
    k("runtime", "recv_batch", "Datagrams read per wake-up of a shard before timers and commands get a turn (rounded up to whole recvmmsg batches of 64).", "1 to 4096"),
    k("runtime", "socket_recv_buffer", "SO_RCVBUF asked for each shard socket, in bytes (the kernel may cap it); 0: kernel default.", "0 to 1073741824"),
    k("runtime", "socket_send_buffer", "SO_SNDBUF asked for each shard socket, in bytes (the kernel may cap it); 0: kernel default.", "0 to 1073741824"),
    k("server", "bind", "IP address to listen on; \"::\" serves IPv4 and IPv6.", "an IPv4 or IPv6 address"),
    k("server", "port", "UDP port; 0: any free port.", "0 to 65535"),
    k("server", "metrics_addr", "Address of the Prometheus endpoint (GET /metrics over HTTP), e.g. \"127.0.0.1:9100\"; \"\": none.", "\"\" or IP:port"),
    k("connections", "max_connections", "Connections served at once per listener; further ones are refused.", "1 to 1000000"),
    k("connections", "max_connections_per_ip", "Connections served at once per listener from one source address (IPv4 address or IPv6 /64); its further ones are refused while other addresses still connect.", "1 to 1000000"),
    k("connections", "max_handshakes_per_ip", "TLS handshakes and WebSocket upgrades in progress per listener from one source address; its further connections are refused until one finishes.", "1 to 1000000"),
    k("connections", "max_message_size", "Largest message accepted, in bytes (announced as Max-Message-Size in the CSM); larger frames end the connection.", "1152 to 67108864"),
    k("connections", "bert", "Announce BERT (RFC 8323 §6): block-wise transfers of many 1024-byte blocks per message with peers that announce it too.", "true or false"),
    k("connections", "max_bert_block", "Largest BERT block sent, in bytes.", "1024 to 67108864"),
    k("connections", "csm_timeout", "Time the peer has to send its CSM after connecting.", "1s to 600s"),
    k("connections", "frame_timeout", "Time a message may take from its first byte to its last (slowloris defence).", "1s to 600s"),
    k("connections", "idle_timeout", "Release a connection with nothing outstanding after this long; 0: never.", "0s to 30d"),
    k("connections", "keepalive", "Ping a silent peer while requests or observations are outstanding after this long, and close if nothing answers for as long again; 0: no pings.", "0s to 24h"),
    k("connections", "handshake_timeout", "Time for the TLS handshake and for the WebSocket upgrade request.", "1s to 600s"),
    k("connections", "write_timeout", "Time a write may block on a peer that does not read before the connection is dropped.", "1s to 600s"),
    k("connections", "max_inbound_requests", "Requests of one connection handled at once; beyond it 5.03.", "1 to 65536"),
    k("dtls", "max_sessions", "Established DTLS sessions per shard. When full, a new session takes the place of one silent for stale_after, or an authenticated peer that of an anonymous one; otherwise it is refused.", "1 to 10000000"),
    k("dtls", "max_handshakes", "DTLS handshakes in progress (after the cookie exchange) per shard; beyond it the oldest handshake of the address with the most gives way. They never displace established sessions.", "1 to 1000000"),
    k("dtls", "max_handshakes_per_ip", "DTLS handshakes in progress per source address (IPv4 address or IPv6 /64); beyond it that address's oldest handshake gives way.", "1 to 1000000"),
    k("dtls", "stale_after", "An established session silent this long may be replaced by a new one when the table is full.", "1s to 30d"),
    k("dtls", "handshake_timeout", "A DTLS handshake not finished within this is dropped.", "1s to 600s"),
    k("dtls", "idle_timeout", "An established session silent this long is dropped (the peer handshakes again).", "1s to 30d"),
    k("log", "level", "Most verbose level logged to stderr; the RUST_LOG variable, when set, wins.", "off, error, warn, info, debug, trace"),
];

fn key_doc(section: &str, key: &str) -> Option<&'static KeyDoc> {
    KEYS.iter().find(|d| d.section == section && d.key == key)
}

fn allowed(section: &str, key: &str) -> String {
    key_doc(section, key).map_or_else(String::new, |d| d.allowed.to_string())
}

impl Config {
    /// A loader starting from the built-in defaults.
    pub fn loader() -> ConfigLoader {
        ConfigLoader::default()
    }

    /// Defaults, then the file (if any), then the process's `COBALT_<SECTION>_<KEY>`
    /// environment variables; validated.
    pub fn load(file: Option<&Path>) -> Result<Config, ConfigError> {
        let mut loader = Config::loader();
        if let Some(path) = file {
            loader = loader.file(path)?;
        }
        loader.env_from_process()?.build()
    }

    /// Parses one TOML document over the defaults, and validates it.
    pub fn from_toml(text: &str) -> Result<Config, ConfigError> {
        Config::loader().toml(text, "TOML text")?.build()
    }

    /// The endpoint's protocol parameters.
    pub fn endpoint_config(&self) -> EndpointConfig {
        EndpointConfig::from(&self.endpoint)
    }

    /// The server-role limits.
    pub fn server_limits(&self) -> ServerLimits {
        ServerLimits::from(&self.limits)
    }

    /// The limits of the TCP, TLS and WebSocket listeners.
    pub fn connection_limits(&self) -> TcpServerLimits {
        TcpServerLimits::from(&self.connections)
    }

    /// The session table limits of the DTLS shards.
    pub fn dtls_config(&self) -> DtlsConfig {
        DtlsConfig::from(&self.dtls)
    }

    /// Checks every value; the error names the key, the value and the allowed range.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if let Err(e) = self.endpoint_config().validate() {
            return Err(self.out_of_range("endpoint", e.key));
        }
        let l = &self.limits;
        let r = &self.runtime;
        let c = &self.connections;
        let d = &self.dtls;
        let secs = |d: Duration, min: u64, max: u64| {
            d >= Duration::from_secs(min) && d <= Duration::from_secs(max)
        };
        let checks: &[(bool, &str, &str)] = &[
            (
                (1..=1_000_000).contains(&l.observe_con_every),
                "limits",
                "observe_con_every",
            ),
            (
                l.observe_con_interval >= Duration::from_secs(1)
                    && l.observe_con_interval <= Duration::from_secs(30 * 86_400),
                "limits",
                "observe_con_interval",
            ),
            (
                (1..=100_000_000).contains(&l.max_observers_per_ip),
                "limits",
                "max_observers_per_ip",
            ),
            (
                l.observe_min_interval <= Duration::from_secs(3600),
                "limits",
                "observe_min_interval",
            ),
            (
                (1..=65_536).contains(&l.observe_batch),
                "limits",
                "observe_batch",
            ),
            ((1..=1 << 30).contains(&l.max_body), "limits", "max_body"),
            (
                (1..=1_000_000).contains(&l.max_uploads_per_ip),
                "limits",
                "max_uploads_per_ip",
            ),
            (
                (1..=l.max_uploads_per_ip).contains(&l.max_uploads_per_peer),
                "limits",
                "max_uploads_per_peer",
            ),
            (
                (1024..=64 << 30).contains(&l.max_upload_memory),
                "limits",
                "max_upload_memory",
            ),
            (
                (l.max_body..=l.max_upload_memory).contains(&l.max_upload_memory_per_ip),
                "limits",
                "max_upload_memory_per_ip",
            ),
            (
                secs(l.upload_idle_timeout, 1, 3600),
                "limits",
                "upload_idle_timeout",
            ),
            (l.refusal_max_age <= 86_400, "limits", "refusal_max_age"),
            (l.block_szx <= 6, "limits", "block_szx"),
            (r.shards <= 1024, "runtime", "shards"),
            ((1..=4096).contains(&r.recv_batch), "runtime", "recv_batch"),
            (
                r.socket_recv_buffer <= 1 << 30,
                "runtime",
                "socket_recv_buffer",
            ),
            (
                r.socket_send_buffer <= 1 << 30,
                "runtime",
                "socket_send_buffer",
            ),
            (
                (1..=1_000_000).contains(&c.max_connections),
                "connections",
                "max_connections",
            ),
            (
                (1..=1_000_000).contains(&c.max_connections_per_ip),
                "connections",
                "max_connections_per_ip",
            ),
            (
                (1..=1_000_000).contains(&c.max_handshakes_per_ip),
                "connections",
                "max_handshakes_per_ip",
            ),
            (
                (1152..=64 << 20).contains(&c.max_message_size),
                "connections",
                "max_message_size",
            ),
            (
                (1024..=64 << 20).contains(&c.max_bert_block),
                "connections",
                "max_bert_block",
            ),
            (secs(c.csm_timeout, 1, 600), "connections", "csm_timeout"),
            (
                secs(c.frame_timeout, 1, 600),
                "connections",
                "frame_timeout",
            ),
            (
                c.idle_timeout <= Duration::from_secs(30 * 86_400),
                "connections",
                "idle_timeout",
            ),
            (
                c.keepalive <= Duration::from_secs(86_400),
                "connections",
                "keepalive",
            ),
            (
                secs(c.handshake_timeout, 1, 600),
                "connections",
                "handshake_timeout",
            ),
            (
                secs(c.write_timeout, 1, 600),
                "connections",
                "write_timeout",
            ),
            (
                (1..=65_536).contains(&c.max_inbound_requests),
                "connections",
                "max_inbound_requests",
            ),
            (
                (1..=10_000_000).contains(&d.max_sessions),
                "dtls",
                "max_sessions",
            ),
            (
                (1..=1_000_000).contains(&d.max_handshakes),
                "dtls",
                "max_handshakes",
            ),
            (
                (1..=1_000_000).contains(&d.max_handshakes_per_ip),
                "dtls",
                "max_handshakes_per_ip",
            ),
            (secs(d.stale_after, 1, 30 * 86_400), "dtls", "stale_after"),
            (
                secs(d.handshake_timeout, 1, 600),
                "dtls",
                "handshake_timeout",
            ),
            (secs(d.idle_timeout, 1, 30 * 86_400), "dtls", "idle_timeout"),
            (
                LOG_LEVELS.contains(&self.log.level.as_str()),
                "log",
                "level",
            ),
        ];
        for (ok, section, key) in checks {
            if !ok {
                return Err(self.out_of_range(section, key));
            }
        }
        Ok(())
    }

    fn out_of_range(&self, section: &str, key: &str) -> ConfigError {
        let value = self
            .to_table()
            .get(section)
            .and_then(|s| s.get(key))
            .map_or_else(String::new, toml::Value::to_string);
        ConfigError::OutOfRange {
            key: format!("{section}.{key}"),
            value,
            allowed: allowed(section, key),
        }
    }

    fn to_table(&self) -> toml::Table {
        toml::Table::try_from(self).expect("the configuration serializes to TOML")
    }

    /// The configuration as a TOML file: every key with a comment saying what it
    /// does, its default and its allowed values. Parses back to `self`.
    pub fn to_toml(&self) -> String {
        let table = self.to_table();
        let defaults = Config::default().to_table();
        let mut out = String::new();
        out.push_str(
            "# Cobalt server configuration (cobalt serve --config FILE).\n\
             #\n\
             # Every key is optional; a missing key keeps its default. Precedence, lowest first:\n\
             # built-in defaults < this file < environment variables COBALT_<SECTION>_<KEY>\n\
             # (e.g. COBALT_ENDPOINT_ACK_TIMEOUT=3s) < command-line flags (--set section.key=value,\n\
             # --bind, --port, --shards, --metrics, --log-level).\n\
             #\n\
             # Durations: a string with units (\"1500ms\", \"2s\", \"5m\", \"24h\", \"1m30s\";\n\
             # units ns, us, ms, s, m, h, d) or a number of seconds (2, 0.5).\n\
             # Unknown keys and values out of range are refused at start.\n",
        );
        for (section, about) in SECTIONS {
            let _ = write!(out, "\n# {about}\n[{section}]\n");
            for d in KEYS.iter().filter(|d| d.section == section) {
                let value = &table[section][d.key];
                let default = &defaults[section][d.key];
                out.push('\n');
                for line in wrap(d.doc, 88) {
                    let _ = writeln!(out, "# {line}");
                }
                let _ = write!(
                    out,
                    "# default: {default}; allowed: {}\n{} = {value}\n",
                    d.allowed, d.key
                );
            }
        }
        out
    }

    /// The built-in defaults as a commented TOML file (see [`Config::to_toml`]).
    pub fn default_toml() -> String {
        Config::default().to_toml()
    }
}

/// Splits `text` into lines of at most `width` characters at spaces.
fn wrap(text: &str, width: usize) -> Vec<String> {
    let mut lines = Vec::new();
    let mut line = String::new();
    for word in text.split(' ') {
        if !line.is_empty() && line.chars().count() + 1 + word.chars().count() > width {
            lines.push(std::mem::take(&mut line));
        }
        if !line.is_empty() {
            line.push(' ');
        }
        line.push_str(word);
    }
    lines.push(line);
    lines
}

/// Builds a [`Config`] from defaults and overriding sources; see the
/// [module documentation](self) for the order.
#[derive(Debug, Clone, Default)]
pub struct ConfigLoader {
    table: toml::Table,
}

impl ConfigLoader {
    /// Reads a TOML file over what is there.
    pub fn file(self, path: &Path) -> Result<ConfigLoader, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError::Read {
            path: path.display().to_string(),
            reason: e.to_string(),
        })?;
        self.toml(&text, &path.display().to_string())
    }

    /// Applies a TOML document over what is there; `origin` names it in errors.
    pub fn toml(mut self, text: &str, origin: &str) -> Result<ConfigLoader, ConfigError> {
        let parse_error = |e: toml::de::Error| ConfigError::Parse {
            origin: origin.to_string(),
            message: e.to_string(),
        };
        // Deserializing the text itself reports unknown keys and wrong types with
        // their line and column.
        toml::from_str::<Config>(text).map_err(parse_error)?;
        let doc: toml::Table = text.parse().map_err(parse_error)?;
        for (section, values) in doc {
            if let toml::Value::Table(values) = values {
                let target = self.section(&section);
                for (key, value) in values {
                    target.insert(key, value);
                }
            }
        }
        Ok(self)
    }

    fn section(&mut self, section: &str) -> &mut toml::Table {
        let entry = self
            .table
            .entry(section.to_string())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        if !entry.is_table() {
            *entry = toml::Value::Table(toml::Table::new());
        }
        entry.as_table_mut().expect("made a table above")
    }

    /// Applies the variables named `COBALT_<SECTION>_<KEY>` (case-insensitive after
    /// the prefix), where SECTION is one of `endpoint`, `limits`, `runtime`, `server`,
    /// `connections`, `dtls`, `log`. Other variables are ignored; an unknown KEY in a known section is an error.
    pub fn env(
        mut self,
        vars: impl IntoIterator<Item = (String, String)>,
    ) -> Result<ConfigLoader, ConfigError> {
        let mut vars: Vec<(String, String)> = vars.into_iter().collect();
        vars.sort();
        for (name, value) in vars {
            let Some(rest) = name.strip_prefix("COBALT_") else {
                continue;
            };
            let rest = rest.to_ascii_lowercase();
            let Some((section, key)) = rest.split_once('_') else {
                continue;
            };
            if SECTIONS.iter().any(|(s, _)| *s == section) {
                self = self.set(&format!("{section}.{key}"), &value, &name)?;
            }
        }
        Ok(self)
    }

    /// [`ConfigLoader::env`] with this process's environment.
    pub fn env_from_process(self) -> Result<ConfigLoader, ConfigError> {
        let vars = std::env::vars_os()
            .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)));
        self.env(vars)
    }

    /// Sets `key` (`section.key`) from its text form: numbers and booleans as written,
    /// strings without quotes (quotes are allowed). `origin` names the source in errors.
    pub fn set(
        mut self,
        key: &str,
        value: &str,
        origin: &str,
    ) -> Result<ConfigLoader, ConfigError> {
        let unknown = || ConfigError::UnknownKey {
            key: key.to_string(),
            origin: origin.to_string(),
        };
        let (section, name) = key.split_once('.').ok_or_else(unknown)?;
        key_doc(section, name).ok_or_else(unknown)?;
        let defaults = Config::default().to_table();
        let bad = |message: String| ConfigError::BadValue {
            key: key.to_string(),
            origin: origin.to_string(),
            message,
        };
        let text = value.trim();
        let unquoted = text
            .strip_prefix('"')
            .and_then(|t| t.strip_suffix('"'))
            .unwrap_or(text);
        let parsed = match &defaults[section][name] {
            toml::Value::Integer(_) => toml::Value::Integer(
                text.parse()
                    .map_err(|_| bad(format!("`{value}` is not an integer")))?,
            ),
            toml::Value::Float(_) => toml::Value::Float(
                text.parse()
                    .map_err(|_| bad(format!("`{value}` is not a number")))?,
            ),
            toml::Value::Boolean(_) => toml::Value::Boolean(
                text.parse()
                    .map_err(|_| bad(format!("`{value}` is not true or false")))?,
            ),
            _ => toml::Value::String(unquoted.to_string()),
        };
        // Check the value alone, so that a type error names this key and source.
        let mut alone = toml::Table::new();
        let mut inner = toml::Table::new();
        inner.insert(name.to_string(), parsed.clone());
        alone.insert(section.to_string(), toml::Value::Table(inner));
        toml::Value::Table(alone)
            .try_into::<Config>()
            .map_err(|e| bad(e.to_string().trim_end().to_string()))?;
        self.section(section).insert(name.to_string(), parsed);
        Ok(self)
    }

    /// Applies `section.key=value` (the form of `--set`).
    pub fn set_arg(self, arg: &str, origin: &str) -> Result<ConfigLoader, ConfigError> {
        let Some((key, value)) = arg.split_once('=') else {
            return Err(ConfigError::BadValue {
                key: arg.to_string(),
                origin: origin.to_string(),
                message: "expected section.key=value".into(),
            });
        };
        self.set(key.trim(), value, origin)
    }

    /// The configuration, validated.
    pub fn build(self) -> Result<Config, ConfigError> {
        let config: Config =
            toml::Value::Table(self.table)
                .try_into()
                .map_err(|e| ConfigError::Parse {
                    origin: "the merged configuration".into(),
                    message: e.to_string(),
                })?;
        config.validate()?;
        Ok(config)
    }
}

/// Parses a duration: `"2s"`, `"1500ms"`, `"1m30s"`, `"0.5s"` or a plain number of
/// seconds (`"2"`). Units: `ns`, `us`, `ms`, `s`, `m`, `h`, `d`.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    if text.is_empty() {
        return Err("empty duration".into());
    }
    if let Ok(secs) = text.parse::<f64>() {
        return secs_to_duration(secs);
    }
    let mut total = Duration::ZERO;
    let mut rest = text;
    while !rest.is_empty() {
        let number_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let unit_len = rest[number_len..]
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len() - number_len);
        let (number, unit) = (&rest[..number_len], rest[number_len..][..unit_len].trim());
        let bad =
            || format!("`{text}` is not a duration (examples: \"2s\", \"1500ms\", \"1m30s\")");
        let n: f64 = number.parse().map_err(|_| bad())?;
        let scale = match unit {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            "d" => 86_400.0,
            _ => return Err(bad()),
        };
        total += secs_to_duration(n * scale)?;
        rest = &rest[number_len + unit_len..];
    }
    Ok(total)
}

fn secs_to_duration(secs: f64) -> Result<Duration, String> {
    Duration::try_from_secs_f64(secs).map_err(|_| format!("{secs} s is not a valid duration"))
}

/// Writes a duration in the largest unit (up to hours) that keeps it exact: `"2s"`,
/// `"1500ms"`, `"24h"`.
pub fn format_duration(d: Duration) -> String {
    let nanos = d.as_nanos();
    if nanos == 0 {
        return "0s".into();
    }
    const UNITS: [(u128, &str); 6] = [
        (3_600_000_000_000, "h"),
        (60_000_000_000, "m"),
        (1_000_000_000, "s"),
        (1_000_000, "ms"),
        (1_000, "us"),
        (1, "ns"),
    ];
    for (size, unit) in UNITS {
        if nanos.is_multiple_of(size) {
            return format!("{}{unit}", nanos / size);
        }
    }
    unreachable!("every duration is a whole number of nanoseconds")
}

/// Serde for a [`Duration`] as a human string (or a number of seconds when reading).
mod duration {
    use super::{format_duration, parse_duration};
    use serde::{de, Deserializer, Serializer};
    use std::time::Duration;

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&format_duration(*d))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        d.deserialize_any(Visitor)
    }

    struct Visitor;

    impl de::Visitor<'_> for Visitor {
        type Value = Duration;

        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a duration such as \"2s\" or \"1500ms\", or a number of seconds")
        }

        fn visit_str<E: de::Error>(self, v: &str) -> Result<Duration, E> {
            parse_duration(v).map_err(E::custom)
        }

        fn visit_i64<E: de::Error>(self, v: i64) -> Result<Duration, E> {
            u64::try_from(v)
                .map(Duration::from_secs)
                .map_err(|_| E::custom("a duration cannot be negative"))
        }

        fn visit_u64<E: de::Error>(self, v: u64) -> Result<Duration, E> {
            Ok(Duration::from_secs(v))
        }

        fn visit_f64<E: de::Error>(self, v: f64) -> Result<Duration, E> {
            super::secs_to_duration(v).map_err(E::custom)
        }
    }
}

/// Serde for an optional [`Duration`]: `"auto"` is `None`.
mod auto_duration {
    use serde::{Deserialize, Deserializer, Serializer};
    use std::time::Duration;

    pub fn serialize<S: Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
        match d {
            Some(d) => super::duration::serialize(d, s),
            None => s.serialize_str("auto"),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Auto(String),
            Secs(f64),
        }
        match Raw::deserialize(d)? {
            Raw::Auto(s) if s == "auto" => Ok(None),
            Raw::Auto(s) => super::parse_duration(&s)
                .map(Some)
                .map_err(serde::de::Error::custom),
            Raw::Secs(v) => super::secs_to_duration(v)
                .map(Some)
                .map_err(serde::de::Error::custom),
        }
    }
}

/// Serde for a congestion-control [`Algorithm`] by name.
mod algorithm {
    use cobalt_proto::congestion::Algorithm;
    use serde::{de, Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(a: &Algorithm, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(a.name())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Algorithm, D::Error> {
        String::deserialize(d)?
            .parse()
            .map_err(|e: cobalt_proto::congestion::UnknownAlgorithm| de::Error::custom(e))
    }
}

/// Serde for an optional socket address: `""` is `None`.
mod optional_addr {
    use serde::{de, Deserialize, Deserializer, Serializer};
    use std::net::SocketAddr;

    pub fn serialize<S: Serializer>(a: &Option<SocketAddr>, s: S) -> Result<S::Ok, S::Error> {
        match a {
            Some(a) => s.serialize_str(&a.to_string()),
            None => s.serialize_str(""),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<SocketAddr>, D::Error> {
        let s = String::deserialize(d)?;
        if s.trim().is_empty() {
            return Ok(None);
        }
        s.trim().parse().map(Some).map_err(|_| {
            de::Error::custom(format!(
                "`{s}` is not an IP:port address (e.g. \"127.0.0.1:9100\" or \"[::1]:9100\")"
            ))
        })
    }
}

#[cfg(test)]
mod tests;
