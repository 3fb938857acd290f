//! CoAP over DTLS 1.2 (RFC 7252 §9, `coaps://`): a sans-IO table of DTLS sessions,
//! one per peer, between a shard's socket and its [`Endpoint`](cobalt_proto::endpoint::Endpoint).
//!
//! - Records come in through [`DtlsBackend::handle_datagram`], which returns the
//!   decrypted CoAP datagrams for the endpoint; what the endpoint sends goes through
//!   [`DtlsBackend::encrypt`]. Records to send (handshake flights, alerts, application
//!   data) wait in [`DtlsBackend::poll_transmit`].
//! - Handshake retransmission runs on [`DtlsBackend::poll_timeout`] and
//!   [`DtlsBackend::handle_timeout`]; a handshake that does not finish within
//!   [`DtlsConfig::handshake_timeout`] is dropped.
//! - A server keeps no state for a peer until it has answered a ClientHello with a
//!   HelloVerifyRequest and the peer has returned the cookie (stateless cookie
//!   exchange, RFC 6347 §4.2.1). The cookie is an HMAC-SHA256 of the peer's address
//!   under a per-table random secret.
//! - At most [`DtlsConfig::max_sessions`] sessions are kept; a new one evicts the one
//!   that was heard from least recently.
//!
//! [`OpensslDtls`] implements [`DtlsBackend`] with OpenSSL (libssl): each session's
//! handshake runs on an `SSL` over an in-memory channel that keeps datagram
//! boundaries. Once a server session with a CCM_8 suite is established, the table
//! frees its `SSL` (about 60 KiB) and protects its records itself (about 2 KiB a
//! session, and fewer copies per record); other sessions keep OpenSSL's record
//! layer. Cipher suites: `TLS_PSK_WITH_AES_128_CCM_8` (the one
//! RFC 7252 mandates), `TLS_PSK_WITH_AES_128_GCM_SHA256`, and for certificates
//! `TLS_ECDHE_ECDSA_WITH_AES_128_CCM_8` / `..._GCM_SHA256`.
//!
//! OpenSSL has no DTLS Connection ID (RFC 9146; openssl#18724), so with it a peer
//! whose address changes (NAT rebinding) needs a new handshake. `MbedtlsDtls`
//! (cargo feature `mbedtls`, module `mbedtls`) is a second backend, on Mbed TLS 3.6,
//! with the Connection ID.
//!
//! The credentials it uses are in [`credentials`](super::credentials), shared with TLS.

use super::identity::Credential;
use cobalt_proto::endpoint::Transmit;
use cobalt_proto::settings::{within, Param, Settings};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

#[cfg(any(feature = "openssl", feature = "mbedtls"))]
mod alerts;
mod cid_steering;
pub(crate) use cid_steering::steer_cid_records;
#[cfg(any(feature = "openssl", feature = "mbedtls"))]
mod held;
#[cfg(feature = "mbedtls")]
pub mod mbedtls;
pub(crate) mod select;
#[cfg(any(feature = "openssl", feature = "mbedtls"))]
mod unanswered;
#[cfg(feature = "mbedtls")]
pub use self::mbedtls::{MbedtlsDtls, MbedtlsSetupError};
#[cfg(feature = "openssl")]
mod session_table;
#[cfg(feature = "openssl")]
pub(crate) use self::session_table::describe;
#[cfg(feature = "openssl")]
pub use self::session_table::OpensslDtls;

/// The default port of `coaps` (RFC 7252 §12.7).
pub const DEFAULT_PORT: u16 = 5684;

/// The cipher suites offered and accepted (OpenSSL names). `@SECLEVEL=0` keeps the
/// CCM_8 suites, which OpenSSL 3.1 and later put below the default security level.
pub const CIPHERS: &str = "PSK-AES128-CCM8:PSK-AES128-GCM-SHA256:\
ECDHE-ECDSA-AES128-CCM8:ECDHE-ECDSA-AES128-GCM-SHA256:@SECLEVEL=0";

/// Limits and timers of a session table.
///
/// A server keeps two budgets: handshakes in progress (after the cookie exchange: the
/// peer proved its address, not yet its credentials; about 50 KB each in OpenSSL) and
/// established sessions. A handshake never displaces an established session:
///
/// - When [`DtlsConfig::max_handshakes_per_ip`] handshakes from one address are in
///   progress, its next handshake replaces its oldest one; when
///   [`DtlsConfig::max_handshakes`] are in progress, the oldest handshake of the address
///   with the most gives way. A new ClientHello (epoch 0, valid cookie) from an
///   address with a handshake in progress replaces that handshake (RFC 6347 §4.2.8).
/// - When an address holds [`DtlsConfig::max_sessions_per_ip`] established sessions
///   (the server's budget split between its shards), its new session takes the place of
///   its own session heard from least recently (an anonymous one, if the newcomer did
///   not authenticate).
/// - When [`DtlsConfig::max_sessions`] sessions are established, a new session takes
///   the place of the one heard from least recently if that one has been silent for
///   [`DtlsConfig::stale_after`]; otherwise, when the newcomer's address holds fewer
///   sessions than the address holding the most (by more than one), that of the
///   latter's anonymous sessions heard from least recently; otherwise a session whose
///   peer authenticated (a pre-shared key, or a client certificate the server
///   verified) may take the place of an anonymous one (a certificate-only server's
///   clients); otherwise the new session is refused with a fatal `internal_error`
///   alert. So a flood of handshakes, or of anonymous sessions, never pushes out peers
///   that authenticated and are active, and a few addresses cannot fill the table for
///   everyone else.
///
/// A client (which only has the sessions it opened) evicts the least recently used
/// session when it has `max_sessions`, and starts a new handshake when a datagram has
/// been retransmitted [`DtlsConfig::rehandshake_after_resends`] times without a word
/// back: the server may have lost the session (restart, eviction), and DTLS 1.2 has
/// no way to say so.
///
/// The allowed values are those of [`DtlsConfig::params`]; the server-side session
/// table limits are the `[dtls]` section of a configuration file.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DtlsConfig {
    /// Established sessions kept at most (per table: per shard on a server). Default
    /// 10 000.
    pub max_sessions: usize,
    /// Server: established sessions kept at most per source address (IPv4 address, or
    /// IPv6 /64) per server, split evenly between the shards' tables (see
    /// [`DtlsConfig::for_shard`]). Default 128: it takes at least 79 addresses to
    /// fill a shard's table. An established CCM_8 session holds about 2 KiB on the
    /// OpenSSL backend and 10 KiB on Mbed TLS; an OpenSSL GCM session about 60 KiB, so
    /// that one address holds at most about 8 MiB of sessions.
    pub max_sessions_per_ip: usize,
    /// Server: handshakes in progress (after the cookie exchange) kept at most per
    /// table. Default 256 (about 13 MB of OpenSSL state).
    pub max_handshakes: usize,
    /// Server: handshakes in progress kept at most per source address (IPv4 address,
    /// or IPv6 prefix of `ipv6_budget_prefix`, /64 by default). Default 32.
    pub max_handshakes_per_ip: usize,
    /// Server: an established session silent for this long may be replaced by a new
    /// one when the table is full (default 30 min, like Californium's stale
    /// connection threshold).
    #[serde(with = "cobalt_proto::settings::duration")]
    pub stale_after: Duration,
    /// Client: when the same datagram (a CoAP retransmission) is sent this many times
    /// again with nothing heard from the server since its first sending, the server
    /// is presumed to have lost the session, and a new handshake carries it (default
    /// 1: a confirmable request's first retransmission, 2 to 3 s after the request
    /// with the RFC 7252 defaults). A node that died or restarted, or a balancer that
    /// sent the record to a node without its session, costs one retransmission, not
    /// two; an ordinary loss of that first sending costs a handshake (a PSK handshake
    /// is four round trips), which is cheaper than the 4 to 6 s more of waiting.
    #[serde(skip)]
    pub rehandshake_after_resends: u32,
    /// A handshake not finished within this is dropped (default 20 s).
    #[serde(with = "cobalt_proto::settings::duration")]
    pub handshake_timeout: Duration,
    /// The largest datagram OpenSSL builds for handshake flights (default 1400).
    #[serde(skip)]
    pub mtu: u32,
    /// CoAP datagrams a client queues per peer while its handshake runs (default 16;
    /// the oldest is dropped beyond).
    #[serde(skip)]
    pub max_pending: usize,
    /// The OpenSSL cipher list (default [`CIPHERS`]).
    #[serde(skip)]
    pub ciphers: String,
    /// An established session not heard from for this long is dropped; the peer
    /// handshakes again when it comes back (default 1 h).
    #[serde(with = "cobalt_proto::settings::duration")]
    pub idle_timeout: Duration,
    /// Server: an established session over which the peer has sent no CoAP message
    /// yet is dropped when silent for this long (default 60 s): a session opened and
    /// abandoned, or held by an attacker, costs its memory for a minute instead of
    /// `idle_timeout`.
    #[serde(with = "cobalt_proto::settings::duration")]
    pub unused_timeout: Duration,
    /// Server: the DTLS implementation of the `coaps` listener (default
    /// [`DtlsBackendKind::Auto`]: OpenSSL, unless [`DtlsConfig::cid_len`] asks for a
    /// Connection ID, which only Mbed TLS has).
    pub backend: DtlsBackendKind,
    /// Server: bytes of the DTLS Connection ID (RFC 9146) granted to each client, 0
    /// for none (the default). Needs the `mbedtls` backend. With several shards, each
    /// shard's CIDs carry its index after the node id, and the listener's sockets
    /// steer a record with a CID to its shard whatever address it comes from (Linux;
    /// see [`CidConfig::for_shard`]); where that cannot be (a CID too short for the
    /// shard byte and two random bytes, the staged single-socket mode), the `coaps`
    /// listener runs on one shard.
    pub cid_len: usize,
    /// Server: the node id every Connection ID starts with, in hex (e.g. `"c0ba"`,
    /// at most `cid_len` bytes; default none), so that a balancer in front of a
    /// cluster can route a record by it. The rest of each CID is random.
    pub cid_node_id: String,
}

/// A DTLS implementation a server can run its `coaps` listener on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DtlsBackendKind {
    /// Mbed TLS when a Connection ID is asked for, OpenSSL otherwise.
    #[default]
    Auto,
    /// OpenSSL ([`OpensslDtls`]): PSK and certificates, no Connection ID.
    Openssl,
    /// Mbed TLS 3.6 (`MbedtlsDtls`, cargo feature `mbedtls`): the Connection ID;
    /// PSK and/or certificates (ECDHE-ECDSA), client certificates included.
    Mbedtls,
}

impl DtlsBackendKind {
    /// Its name in settings and flags.
    pub fn as_str(self) -> &'static str {
        match self {
            DtlsBackendKind::Auto => "auto",
            DtlsBackendKind::Openssl => "openssl",
            DtlsBackendKind::Mbedtls => "mbedtls",
        }
    }
}

impl std::str::FromStr for DtlsBackendKind {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "auto" => Ok(DtlsBackendKind::Auto),
            "openssl" => Ok(DtlsBackendKind::Openssl),
            "mbedtls" => Ok(DtlsBackendKind::Mbedtls),
            other => Err(format!(
                "unknown DTLS backend {other:?}: use openssl, mbedtls or auto"
            )),
        }
    }
}

/// The Connection ID a server grants: its length and the node id it starts with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CidConfig {
    /// Bytes of the CID a server grants (1 to 32; 6 is usual).
    pub len: usize,
    /// The first bytes of every CID this server grants (at most `len`; the rest is
    /// random), so that a cluster's balancer can route a record by it.
    pub node_id: Vec<u8>,
}

impl Default for CidConfig {
    fn default() -> Self {
        CidConfig {
            len: 6,
            node_id: Vec::new(),
        }
    }
}

/// Random bytes a shard's CID keeps at least beside the node id and the shard byte.
const MIN_RANDOM_CID_BYTES: usize = 2;

impl CidConfig {
    /// The CID that shard `index` of a server grants when every shard holds its own
    /// sessions: the node id, then the shard's index (one byte), then random bytes,
    /// so that the listener steers each record with a CID to the shard that knows
    /// its session (`SO_REUSEPORT` with a BPF program, `cid_steering`). `None` when
    /// the index does not fit a byte or the CID has no room for it beside at least
    /// two random bytes: the server then runs its `coaps` listener on one shard.
    pub fn for_shard(&self, index: usize) -> Option<CidConfig> {
        let shard = u8::try_from(index).ok()?;
        if self.len < self.node_id.len() + 1 + MIN_RANDOM_CID_BYTES {
            return None;
        }
        let mut node_id = self.node_id.clone();
        node_id.push(shard);
        Some(CidConfig {
            len: self.len,
            node_id,
        })
    }
}

/// The bytes of a node id written in hex (`"c0ba"`), or why not.
fn parse_node_id(hex: &str) -> Result<Vec<u8>, String> {
    if !hex.len().is_multiple_of(2) || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(format!(
            "cid_node_id {hex:?} is not hex bytes (e.g. \"c0ba\")"
        ));
    }
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).map_err(|e| e.to_string()))
        .collect()
}

impl Default for DtlsConfig {
    fn default() -> Self {
        DtlsConfig {
            max_sessions: 10_000,
            max_sessions_per_ip: 128,
            max_handshakes: 256,
            max_handshakes_per_ip: 32,
            stale_after: Duration::from_secs(30 * 60),
            rehandshake_after_resends: 1,
            handshake_timeout: Duration::from_secs(20),
            mtu: 1400,
            max_pending: 16,
            ciphers: CIPHERS.to_string(),
            idle_timeout: Duration::from_secs(3600),
            unused_timeout: Duration::from_secs(60),
            backend: DtlsBackendKind::Auto,
            cid_len: 0,
            cid_node_id: String::new(),
        }
    }
}

impl DtlsConfig {
    /// The configuration of one of a server's `shards` session tables: the per-address
    /// budget [`max_sessions_per_ip`](DtlsConfig::max_sessions_per_ip), which is the
    /// server's, split evenly (rounded up); the kernel spreads one address's source
    /// ports over the shards.
    pub fn for_shard(&self, shards: usize) -> DtlsConfig {
        // (The CID settings are the server's and apply to every table as they are.)
        DtlsConfig {
            max_sessions_per_ip: self.max_sessions_per_ip.div_ceil(shards.max(1)).max(1),
            ..self.clone()
        }
    }
}

impl DtlsConfig {
    /// The backend a server runs ([`DtlsBackendKind::Openssl`] or
    /// [`DtlsBackendKind::Mbedtls`]): [`DtlsConfig::backend`], with `auto` decided by
    /// whether a Connection ID is asked for.
    pub fn backend_kind(&self) -> DtlsBackendKind {
        match self.backend {
            DtlsBackendKind::Auto if self.cid_len > 0 => DtlsBackendKind::Mbedtls,
            DtlsBackendKind::Auto => DtlsBackendKind::Openssl,
            chosen => chosen,
        }
    }

    /// The Connection ID a server grants (`None` when `cid_len` is 0), or why the
    /// settings do not make one.
    pub fn cid(&self) -> Result<Option<CidConfig>, String> {
        if self.cid_len == 0 {
            return Ok(None);
        }
        let node_id = parse_node_id(&self.cid_node_id)?;
        if !(1..=32).contains(&self.cid_len) || node_id.len() > self.cid_len {
            return Err(format!(
                "cid_len {} must be 1 to 32 and hold cid_node_id ({} bytes)",
                self.cid_len,
                node_id.len()
            ));
        }
        if self.backend_kind() != DtlsBackendKind::Mbedtls {
            return Err(
                "a DTLS Connection ID (cid_len) needs the mbedtls backend: OpenSSL has none".into(),
            );
        }
        Ok(Some(CidConfig {
            len: self.cid_len,
            node_id,
        }))
    }
}

impl Settings for DtlsConfig {
    /// The server's session table limits with what they do and the values allowed,
    /// in file order.
    fn params(&self) -> Vec<Param> {
        let secs = Duration::from_secs;
        vec![
            Param::new("max_sessions", "Established DTLS sessions per shard. When full, a new session takes the place of one silent for stale_after, or an authenticated peer that of an anonymous one; otherwise it is refused.", "1 to 10000000", (1..=10_000_000).contains(&self.max_sessions)),
            Param::new("max_sessions_per_ip", "Established DTLS sessions per source address (IPv4 address or IPv6 /64) per server, split evenly between the shards; beyond it that address's least recently heard-from session gives way.", "1 to 10000000", (1..=10_000_000).contains(&self.max_sessions_per_ip)),
            Param::new("max_handshakes", "DTLS handshakes in progress (after the cookie exchange) per shard; beyond it the oldest handshake of the address with the most gives way. They never displace established sessions.", "1 to 1000000", (1..=1_000_000).contains(&self.max_handshakes)),
            Param::new("max_handshakes_per_ip", "DTLS handshakes in progress per source address (IPv4 address, or IPv6 prefix of endpoint.ipv6_budget_prefix, /64 by default); beyond it that address's oldest handshake gives way.", "1 to 1000000", (1..=1_000_000).contains(&self.max_handshakes_per_ip)),
            Param::new("stale_after", "An established session silent this long may be replaced by a new one when the table is full.", "1s to 30d", within(self.stale_after, secs(1), secs(30 * 86_400))),
            Param::new("handshake_timeout", "A DTLS handshake not finished within this is dropped.", "1s to 600s", within(self.handshake_timeout, secs(1), secs(600))),
            Param::new("idle_timeout", "An established session silent this long is dropped (the peer handshakes again).", "1s to 30d", within(self.idle_timeout, secs(1), secs(30 * 86_400))),
            Param::new("unused_timeout", "An established session over which the peer has sent no CoAP message yet is dropped when silent this long.", "1s to 30d", within(self.unused_timeout, secs(1), secs(30 * 86_400))),
            Param::new("backend", "The DTLS implementation: openssl (PSK and certificates), mbedtls (the Connection ID; PSK and/or a certificate, with client certificates against a CA), or auto (mbedtls when cid_len is set, openssl otherwise).", "auto, openssl or mbedtls", true),
            Param::new("cid_len", "Bytes of the DTLS Connection ID (RFC 9146) granted to each client, 0 for none; needs the mbedtls backend. Each shard's CIDs carry its index after cid_node_id, by which records reach their shard from any address (Linux; else, or without room for that byte and two random ones, the coaps listener runs on one shard).", "0 to 32 (6 is usual), with the mbedtls backend", self.cid().is_ok()),
            Param::new("cid_node_id", "The node id (hex) every Connection ID starts with, so that a cluster's balancer can route by it.", "hex, at most cid_len bytes", parse_node_id(&self.cid_node_id).is_ok()),
        ]
    }
}

/// What happened to a session, for the driver.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DtlsEvent {
    /// The handshake with `peer` completed.
    Connected {
        /// The peer.
        peer: SocketAddr,
    },
    /// The handshake with `peer` failed; its session is gone.
    HandshakeFailed {
        /// The peer.
        peer: SocketAddr,
        /// Why, in words (OpenSSL's reason and a hint).
        reason: String,
    },
    /// An established session ended (close_notify, fatal alert, eviction).
    Closed {
        /// The peer.
        peer: SocketAddr,
        /// Why.
        reason: String,
    },
}

/// A session that moved to a new peer address (see
/// [`DtlsBackend::poll_address_update`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AddressUpdate {
    /// Where the peer was: the address its state was kept under until now.
    pub from: SocketAddr,
    /// Where it is now.
    pub to: SocketAddr,
}

/// Counters of a session table, and its sizes now.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DtlsStats {
    /// HelloVerifyRequests sent (cookie exchanges started).
    pub hello_verify_sent: u64,
    /// Handshakes completed.
    pub handshakes: u64,
    /// Handshakes that failed or timed out.
    pub handshake_failures: u64,
    /// Sessions evicted to make room, or dropped for being idle.
    pub evicted: u64,
    /// Handshakes in progress dropped to stay within the handshake budgets (or
    /// replaced by a new ClientHello from the same address).
    pub handshakes_displaced: u64,
    /// New sessions refused because the table was full of active sessions.
    pub refused: u64,
    /// Records that could not be used (no session, decryption failure, garbage).
    pub dropped: u64,
    /// Established sessions now (a gauge).
    pub sessions: u64,
    /// Handshakes in progress now (a gauge).
    pub handshaking: u64,
    /// Sessions moved to a new peer address by an authentic, newer record with a
    /// Connection ID (RFC 9146 §6; Mbed TLS backend).
    pub address_updates: u64,
    /// Records with a known Connection ID from another address that did not move
    /// their session (not authentic, replayed, or older than the newest accepted).
    pub address_updates_refused: u64,
}

/// A DTLS implementation as the shard driver uses it: sans-IO, one table of sessions
/// keyed by peer address. See the [module docs](self).
pub trait DtlsBackend: Send {
    /// Handles one received datagram of DTLS records from `peer`; returns the CoAP
    /// datagrams it carried (none during a handshake).
    fn handle_datagram(&mut self, now: Instant, peer: SocketAddr, records: &[u8]) -> Vec<Vec<u8>>;
    /// The session that the last [`DtlsBackend::handle_datagram`] moved to a new
    /// address, if it moved one (an authentic, newer record with its Connection ID
    /// from another address, RFC 9146 §6), reported once. Before the CoAP datagrams
    /// of that call are handed on, the caller moves what it keeps of the peer from
    /// [`AddressUpdate::from`] to [`AddressUpdate::to`]
    /// ([`Endpoint::move_peer`](cobalt_proto::endpoint::Endpoint::move_peer)): the
    /// session is known by its new address from then on. Backends without a
    /// Connection ID never move a session.
    fn poll_address_update(&mut self) -> Option<AddressUpdate> {
        None
    }
    /// Protects one CoAP datagram for `peer`. A client starts a handshake if it has no
    /// session and queues the datagram until it completes; a server drops datagrams
    /// for peers it has no session with.
    fn encrypt(&mut self, now: Instant, peer: SocketAddr, plaintext: &[u8]);
    /// The next datagram of records to send.
    fn poll_transmit(&mut self) -> Option<Transmit>;
    /// The next session event.
    fn poll_event(&mut self) -> Option<DtlsEvent>;
    /// When [`DtlsBackend::handle_timeout`] must run next.
    fn poll_timeout(&self) -> Option<Instant>;
    /// Retransmits handshake flights and drops handshakes that took too long.
    fn handle_timeout(&mut self, now: Instant);
    /// Drops the session with `peer` (e.g. after a request over it timed out: the
    /// server may have lost it), so that the next datagram starts a new handshake.
    fn forget(&mut self, peer: SocketAddr);
    /// Ends every session: an established one with close_notify (queued for
    /// [`DtlsBackend::poll_transmit`]), so that the peer can forget it at once; a
    /// handshake in progress silently.
    fn close_all(&mut self);
    /// What the peer of the established session with `peer` proved in its handshake
    /// (a server's view: PSK identity or verified certificate subject), if anything.
    fn credential(&self, peer: SocketAddr) -> Option<std::sync::Arc<Credential>>;
    /// Sessions kept (handshaking or established).
    fn session_count(&self) -> usize;
    /// The counters.
    fn stats(&self) -> DtlsStats;
}

#[cfg(not(feature = "openssl"))]
mod unavailable;
#[cfg(not(feature = "openssl"))]
pub use unavailable::{OpensslDtls, Unavailable};

#[cfg(test)]
mod cid_settings_tests {
    use super::*;

    fn with(cid_len: usize, node_id: &str, backend: DtlsBackendKind) -> DtlsConfig {
        DtlsConfig {
            cid_len,
            cid_node_id: node_id.into(),
            backend,
            ..DtlsConfig::default()
        }
    }

    #[test]
    fn a_cid_chooses_mbedtls_unless_a_backend_is_named() {
        assert_eq!(
            DtlsConfig::default().backend_kind(),
            DtlsBackendKind::Openssl
        );
        assert_eq!(DtlsConfig::default().cid(), Ok(None));
        let auto = with(6, "c0ba", DtlsBackendKind::Auto);
        assert_eq!(auto.backend_kind(), DtlsBackendKind::Mbedtls);
        assert_eq!(
            auto.cid(),
            Ok(Some(CidConfig {
                len: 6,
                node_id: vec![0xc0, 0xba]
            }))
        );
        assert!(auto.validate().is_ok());
    }

    #[test]
    fn cid_settings_that_cannot_work_are_refused_with_the_reason() {
        let openssl = with(6, "", DtlsBackendKind::Openssl);
        assert!(openssl.cid().unwrap_err().contains("mbedtls"));
        assert!(openssl.validate().is_err());
        assert!(with(6, "c0b", DtlsBackendKind::Auto)
            .cid()
            .unwrap_err()
            .contains("hex"));
        assert!(with(6, "zz", DtlsBackendKind::Auto).validate().is_err());
        assert!(
            with(1, "c0ba", DtlsBackendKind::Auto).cid().is_err(),
            "node id longer than the CID"
        );
        assert!(with(33, "", DtlsBackendKind::Auto).cid().is_err());
    }

    #[test]
    fn backend_names_parse_and_print_alike() {
        for kind in [
            DtlsBackendKind::Auto,
            DtlsBackendKind::Openssl,
            DtlsBackendKind::Mbedtls,
        ] {
            assert_eq!(kind.as_str().parse::<DtlsBackendKind>(), Ok(kind));
        }
        assert!("wolfssl"
            .parse::<DtlsBackendKind>()
            .unwrap_err()
            .contains("openssl, mbedtls or auto"));
    }
}
