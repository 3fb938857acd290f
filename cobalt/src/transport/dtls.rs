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
//! [`OpensslDtls`] implements [`DtlsBackend`] with OpenSSL (libssl): each session is an
//! `SSL` over an in-memory channel that keeps datagram boundaries, so OpenSSL does
//! all the record protection. Cipher suites: `TLS_PSK_WITH_AES_128_CCM_8` (the one
//! RFC 7252 mandates), `TLS_PSK_WITH_AES_128_GCM_SHA256`, and for certificates
//! `TLS_ECDHE_ECDSA_WITH_AES_128_CCM_8` / `..._GCM_SHA256`.
//!
//! Not available: the DTLS Connection ID (RFC 9146) — OpenSSL has no support for it
//! (openssl#18724), so a peer whose address changes (NAT rebinding) needs a new
//! handshake.
//!
//! # PSK key files
//!
//! [`PskStore::parse`] and [`PskStore::load`] read one `identity:key` per line:
//!
//! ```text
//! # comments and blank lines are ignored
//! sensor-17:0x000102030405060708090a0b0c0d0e0f   # 0x then hex digits: raw key bytes
//! Client_identity:secretPSK                      # anything else: the text's bytes
//! ```
//!
//! The identity ends at the first `:` (so it cannot contain one) and leading/trailing
//! spaces around both parts are trimmed; a `#` after whitespace starts a comment.
//! Identities are at most 128 bytes, keys 1 to 64 bytes.

#[cfg(feature = "openssl")]
use super::per_ip::IpCounts;
use cobalt_proto::endpoint::Transmit;
#[cfg(feature = "openssl")]
use foreign_types::ForeignTypeRef;
#[cfg(feature = "openssl")]
use openssl::{
    error::ErrorStack,
    hash::MessageDigest,
    pkey::{PKey, Private},
    sign::Signer,
    ssl::{
        ErrorCode, Ssl, SslContext, SslContextBuilder, SslMethod, SslMode, SslOptions, SslRef,
        SslStream, SslVersion,
    },
};
use std::collections::HashMap;
#[cfg(feature = "openssl")]
use std::collections::VecDeque;
#[cfg(feature = "openssl")]
use std::io::{self, Read, Write};
use std::net::SocketAddr;
use std::path::Path;
#[cfg(feature = "openssl")]
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

/// The default port of `coaps` (RFC 7252 §12.7).
pub const DEFAULT_PORT: u16 = 5684;

/// The cipher suites offered and accepted (OpenSSL names). `@SECLEVEL=0` keeps the
/// CCM_8 suites, which OpenSSL 3.1 and later put below the default security level.
pub const CIPHERS: &str = "PSK-AES128-CCM8:PSK-AES128-GCM-SHA256:\
ECDHE-ECDSA-AES128-CCM8:ECDHE-ECDSA-AES128-GCM-SHA256:@SECLEVEL=0";

/// Longest PSK identity accepted.
pub const MAX_IDENTITY: usize = 128;
/// Longest PSK accepted.
pub const MAX_KEY: usize = 64;

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
/// - When [`DtlsConfig::max_sessions`] sessions are established, a new session takes
///   the place of the one heard from least recently if that one has been silent for
///   [`DtlsConfig::stale_after`]; otherwise a session whose peer authenticated (a
///   pre-shared key, or a client certificate the server verified) may take the place
///   of an anonymous one (a certificate-only server's clients); otherwise the new
///   session is refused with a fatal `internal_error` alert. So a flood of handshakes,
///   or of anonymous sessions, never pushes out peers that authenticated and are active.
///
/// A client (which only has the sessions it opened) evicts the least recently used
/// session when it has `max_sessions`, and starts a new handshake when a datagram has
/// been retransmitted [`DtlsConfig::rehandshake_after_resends`] times without a word
/// back: the server may have lost the session (restart, eviction), and DTLS 1.2 has
/// no way to say so.
#[derive(Debug, Clone)]
pub struct DtlsConfig {
    /// Established sessions kept at most (per table: per shard on a server). Default
    /// 10 000.
    pub max_sessions: usize,
    /// Server: handshakes in progress (after the cookie exchange) kept at most per
    /// table. Default 256 (about 13 MB of OpenSSL state).
    pub max_handshakes: usize,
    /// Server: handshakes in progress kept at most per source address (IPv4 address,
    /// or IPv6 /64). Default 32.
    pub max_handshakes_per_ip: usize,
    /// Server: an established session silent for this long may be replaced by a new
    /// one when the table is full (default 30 min, like Californium's stale
    /// connection threshold).
    pub stale_after: Duration,
    /// Client: when the same datagram (a CoAP retransmission) is sent this many times
    /// again with nothing heard from the server since its first sending, the server
    /// is presumed to have lost the session, and a new handshake carries it (default
    /// 2: a confirmable request's second retransmission, 6 to 9 s after the request
    /// with the RFC 7252 defaults; the first may be an ordinary loss).
    pub rehandshake_after_resends: u32,
    /// A handshake not finished within this is dropped (default 20 s).
    pub handshake_timeout: Duration,
    /// The largest datagram OpenSSL builds for handshake flights (default 1400).
    pub mtu: u32,
    /// CoAP datagrams a client queues per peer while its handshake runs (default 16;
    /// the oldest is dropped beyond).
    pub max_pending: usize,
    /// The OpenSSL cipher list (default [`CIPHERS`]).
    pub ciphers: String,
    /// An established session not heard from for this long is dropped; the peer
    /// handshakes again when it comes back (default 1 h).
    pub idle_timeout: Duration,
}

impl Default for DtlsConfig {
    fn default() -> Self {
        DtlsConfig {
            max_sessions: 10_000,
            max_handshakes: 256,
            max_handshakes_per_ip: 32,
            stale_after: Duration::from_secs(30 * 60),
            rehandshake_after_resends: 2,
            handshake_timeout: Duration::from_secs(20),
            mtu: 1400,
            max_pending: 16,
            ciphers: CIPHERS.to_string(),
            idle_timeout: Duration::from_secs(3600),
        }
    }
}

/// Pre-shared keys of a server, by identity.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct PskStore {
    keys: HashMap<Vec<u8>, Vec<u8>>,
}

impl std::fmt::Debug for PskStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PskStore")
            .field("identities", &self.keys.len())
            .finish()
    }
}

impl PskStore {
    /// An empty store.
    pub fn new() -> PskStore {
        PskStore::default()
    }

    /// Adds (or replaces) the key of `identity`.
    pub fn insert(&mut self, identity: impl Into<Vec<u8>>, key: impl Into<Vec<u8>>) {
        self.keys.insert(identity.into(), key.into());
    }

    /// Adds a key, builder style.
    pub fn with(mut self, identity: impl Into<Vec<u8>>, key: impl Into<Vec<u8>>) -> PskStore {
        self.insert(identity, key);
        self
    }

    /// The key of `identity`.
    pub fn get(&self, identity: &[u8]) -> Option<&[u8]> {
        self.keys.get(identity).map(Vec::as_slice)
    }

    /// Number of identities.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// Whether the store has no identity.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// Parses `identity:key` lines (see the [module docs](self) for the format).
    pub fn parse(text: &str) -> Result<PskStore, String> {
        let mut store = PskStore::new();
        for (n, raw) in text.lines().enumerate() {
            let line = strip_comment(raw).trim();
            if line.is_empty() {
                continue;
            }
            let (identity, key) = line
                .split_once(':')
                .ok_or_else(|| format!("line {}: expected identity:key", n + 1))?;
            let (identity, key) = (identity.trim(), key.trim());
            let key = parse_key(key).map_err(|e| format!("line {}: {e}", n + 1))?;
            if identity.is_empty() || identity.len() > MAX_IDENTITY {
                return Err(format!(
                    "line {}: the identity must be 1 to {MAX_IDENTITY} bytes",
                    n + 1
                ));
            }
            store.insert(identity.as_bytes(), key);
        }
        Ok(store)
    }

    /// Reads a key file (see [`PskStore::parse`]).
    pub fn load(path: impl AsRef<Path>) -> Result<PskStore, String> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read PSK file {}: {e}", path.display()))?;
        PskStore::parse(&text).map_err(|e| format!("PSK file {}: {e}", path.display()))
    }
}

fn strip_comment(line: &str) -> &str {
    if line.trim_start().starts_with('#') {
        return "";
    }
    match line.find(" #").or_else(|| line.find("\t#")) {
        Some(i) => &line[..i],
        None => line,
    }
}

/// A key as written in a key file or on the command line: `0x` and hex digits for
/// raw bytes, otherwise the text's bytes.
pub fn parse_key(key: &str) -> Result<Vec<u8>, String> {
    let bytes = match key.strip_prefix("0x").or_else(|| key.strip_prefix("0X")) {
        Some(hex) => decode_hex(hex)?,
        None => key.as_bytes().to_vec(),
    };
    if bytes.is_empty() || bytes.len() > MAX_KEY {
        return Err(format!("the key must be 1 to {MAX_KEY} bytes"));
    }
    Ok(bytes)
}

fn decode_hex(hex: &str) -> Result<Vec<u8>, String> {
    if !hex.len().is_multiple_of(2) {
        return Err("odd number of hex digits in the key".into());
    }
    (0..hex.len())
        .step_by(2)
        .map(|i| {
            hex.get(i..i + 2)
                .and_then(|d| u8::from_str_radix(d, 16).ok())
                .ok_or_else(|| format!("'{hex}' is not hexadecimal"))
        })
        .collect()
}

/// A client's pre-shared key.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct ClientPsk {
    /// The identity sent to the server.
    pub identity: Vec<u8>,
    /// The key.
    pub key: Vec<u8>,
}

impl std::fmt::Debug for ClientPsk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientPsk")
            .field("identity", &String::from_utf8_lossy(&self.identity))
            .field("key", &"<redacted>")
            .finish()
    }
}

impl ClientPsk {
    /// A PSK from an identity and key bytes.
    pub fn new(identity: impl Into<Vec<u8>>, key: impl Into<Vec<u8>>) -> ClientPsk {
        ClientPsk {
            identity: identity.into(),
            key: key.into(),
        }
    }
}

/// X.509 credentials in PEM: this side's certificate (chain) and key, and the CA
/// certificates the peer's certificate must chain to.
///
/// A server with `ca_pem` requires a client certificate; a client verifies the
/// server's certificate against `ca_pem` and checks that it names `server_name` (or,
/// without one, the server's IP address).
#[derive(Clone, Default, PartialEq, Eq, Hash)]
pub struct X509Credentials {
    /// This side's certificate, then any intermediates (PEM). Optional for a client.
    pub cert_chain_pem: Vec<u8>,
    /// The private key of the certificate (PEM; EC P-256 for the ECDHE-ECDSA suites).
    pub key_pem: Vec<u8>,
    /// Trusted CA certificates for the peer's certificate (PEM).
    pub ca_pem: Option<Vec<u8>>,
    /// The name the server's certificate must carry (client side); without it the
    /// server's IP address must be in its subjectAltName.
    pub server_name: Option<String>,
}

impl std::fmt::Debug for X509Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("X509Credentials")
            .field("cert_chain_pem", &self.cert_chain_pem.len())
            .field("key_pem", &"<redacted>")
            .field("ca", &self.ca_pem.is_some())
            .field("server_name", &self.server_name)
            .finish()
    }
}

/// How a client authenticates a DTLS session.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum DtlsClientAuth {
    /// A pre-shared key.
    Psk(ClientPsk),
    /// Certificates.
    X509(X509Credentials),
}

#[cfg(feature = "openssl")]
/// Loads this side's certificate chain and key, and the CA store for the peer's
/// certificate, into a context (DTLS or TLS).
pub(crate) fn load_x509(
    b: &mut SslContextBuilder,
    creds: &X509Credentials,
) -> Result<(), ErrorStack> {
    if !creds.cert_chain_pem.is_empty() {
        let mut chain = openssl::x509::X509::stack_from_pem(&creds.cert_chain_pem)?.into_iter();
        if let Some(leaf) = chain.next() {
            b.set_certificate(&leaf)?;
        }
        for extra in chain {
            b.add_extra_chain_cert(extra)?;
        }
        let key = PKey::private_key_from_pem(&creds.key_pem)?;
        b.set_private_key(&key)?;
        b.check_private_key()?;
    }
    if let Some(ca) = &creds.ca_pem {
        let mut store = openssl::x509::store::X509StoreBuilder::new()?;
        for cert in openssl::x509::X509::stack_from_pem(ca)? {
            store.add_cert(cert)?;
        }
        b.set_verify_cert_store(store.build())?;
    }
    Ok(())
}

/// Checks that certificate credentials can serve this table's suites: the DTLS
/// certificate suites are ECDHE-ECDSA only ([`CIPHERS`]), so the key must be an EC key
/// on P-256. The error names the key found and says what to use instead, so a server
/// refuses such a certificate at start rather than failing every handshake.
#[cfg(feature = "openssl")]
pub fn check_certificate(creds: &X509Credentials) -> Result<(), String> {
    use openssl::nid::Nid;
    use openssl::pkey::Id;
    let key = PKey::private_key_from_pem(&creds.key_pem)
        .map_err(|e| format!("the private key does not parse as PEM: {e}"))?;
    let found = match key.id() {
        Id::EC => match key.ec_key().ok().and_then(|k| k.group().curve_name()) {
            Some(Nid::X9_62_PRIME256V1) => return Ok(()),
            Some(nid) => format!(
                "an EC key on {}",
                nid.short_name().unwrap_or("another curve")
            ),
            None => "an EC key on an unnamed curve".into(),
        },
        Id::RSA => format!("an RSA key ({} bits)", key.bits()),
        Id::ED25519 => "an Ed25519 key".into(),
        _ => "a key of another type".into(),
    };
    Err(format!(
        "it has {found}, but the DTLS certificate suites (ECDHE-ECDSA with AES-128-CCM8 or \
         -GCM) need an EC key on P-256: make one with `openssl ecparam -name prime256v1 \
         -genkey -noout -out server.key` and a certificate for it"
    ))
}

#[cfg(all(test, feature = "openssl"))]
mod certificate_check {
    use super::*;

    #[test]
    fn only_p256_keys_serve_the_dtls_suites() {
        let pki = test_pki::generate("check").unwrap();
        assert_eq!(check_certificate(&pki.server), Ok(()));
        let rsa = openssl::rsa::Rsa::generate(2048).unwrap();
        let rsa = X509Credentials {
            key_pem: PKey::from_rsa(rsa)
                .unwrap()
                .private_key_to_pem_pkcs8()
                .unwrap(),
            ..pki.server.clone()
        };
        let e = check_certificate(&rsa).unwrap_err();
        assert!(
            e.contains("RSA key (2048 bits)") && e.contains("prime256v1"),
            "{e}"
        );
        let group = openssl::ec::EcGroup::from_curve_name(openssl::nid::Nid::SECP384R1).unwrap();
        let p384 = X509Credentials {
            key_pem: PKey::from_ec_key(openssl::ec::EcKey::generate(&group).unwrap())
                .unwrap()
                .private_key_to_pem_pkcs8()
                .unwrap(),
            ..pki.server
        };
        let e = check_certificate(&p384).unwrap_err();
        assert!(e.contains("secp384r1"), "{e}");
        let garbage = X509Credentials {
            key_pem: b"not a key".to_vec(),
            ..p384
        };
        assert!(check_certificate(&garbage)
            .unwrap_err()
            .contains("does not parse"));
    }
}

#[cfg(feature = "openssl")]
/// Makes a (D)TLS server context look pre-shared keys up in `keys` by identity.
pub(crate) fn set_psk_server(b: &mut SslContextBuilder, keys: Arc<PskStore>) {
    b.set_psk_server_callback(move |_ssl, identity, psk| {
        let key = identity.and_then(|id| keys.get(id));
        match key {
            Some(k) if k.len() <= psk.len() => {
                psk[..k.len()].copy_from_slice(k);
                Ok(k.len())
            }
            // Unknown identity: OpenSSL answers with an unknown_psk_identity alert.
            _ => Err(ErrorStack::get()),
        }
    });
}

#[cfg(feature = "openssl")]
/// Makes a (D)TLS client context authenticate with `psk`.
pub(crate) fn set_psk_client(b: &mut SslContextBuilder, psk: ClientPsk) {
    b.set_psk_client_callback(move |_ssl, _hint, identity, key| {
        // The identity is written as a NUL-terminated string.
        if psk.identity.len() >= identity.len() || psk.key.len() > key.len() {
            return Err(ErrorStack::get());
        }
        identity[..psk.identity.len()].copy_from_slice(&psk.identity);
        identity[psk.identity.len()] = 0;
        key[..psk.key.len()].copy_from_slice(&psk.key);
        Ok(psk.key.len())
    });
}

#[cfg(feature = "openssl")]
/// Makes a client session check that the server's certificate names `name` (a host
/// name, also sent as SNI, or an IP address), or without a name the address `peer`.
pub(crate) fn expect_peer_name(
    ssl: &mut SslRef,
    name: Option<&str>,
    peer: SocketAddr,
) -> Result<(), ErrorStack> {
    match name.map(|n| (n, n.parse::<std::net::IpAddr>())) {
        Some((_, Ok(ip))) => ssl.param_mut().set_ip(ip),
        Some((host, Err(_))) => {
            ssl.set_hostname(host)?;
            ssl.param_mut().set_host(host)
        }
        None => ssl.param_mut().set_ip(peer.ip()),
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
}

/// A DTLS implementation as the shard driver uses it: sans-IO, one table of sessions
/// keyed by peer address. See the [module docs](self).
pub trait DtlsBackend: Send {
    /// Handles one received datagram of DTLS records from `peer`; returns the CoAP
    /// datagrams it carried (none during a handshake).
    fn handle_datagram(&mut self, now: Instant, peer: SocketAddr, records: &[u8]) -> Vec<Vec<u8>>;
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
    /// Sessions kept (handshaking or established).
    fn session_count(&self) -> usize;
    /// The counters.
    fn stats(&self) -> DtlsStats;
}

#[cfg(feature = "openssl")]
/// A datagram-preserving in-memory channel between OpenSSL and the table: each
/// `read` returns one whole received datagram, each `write` is one datagram to send.
#[derive(Debug, Default)]
struct Channel {
    incoming: Option<Vec<u8>>,
    outgoing: Vec<Vec<u8>>,
}

#[cfg(feature = "openssl")]
impl Read for Channel {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self.incoming.take() {
            Some(d) => {
                let n = d.len().min(buf.len());
                buf[..n].copy_from_slice(&d[..n]);
                Ok(n)
            }
            None => Err(io::ErrorKind::WouldBlock.into()),
        }
    }
}

#[cfg(feature = "openssl")]
impl Write for Channel {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        // OpenSSL writes a bounded amount per call (one flight, one record).
        if self.outgoing.len() >= 256 {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        self.outgoing.push(buf.to_vec());
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(feature = "openssl")]
struct Session {
    stream: SslStream<Channel>,
    established: bool,
    started: Instant,
    /// When a record from the peer last arrived.
    last_seen: Instant,
    pending: VecDeque<Vec<u8>>,
    retransmit_at: Option<Instant>,
    /// Server: the peer proved a credential (a pre-shared key, a verified client
    /// certificate); an anonymous session gives way to an authenticated one.
    authenticated: bool,
    /// Server: the random of the ClientHello that started the session, to tell a
    /// retransmission or late duplicate of it from a new ClientHello.
    hello_random: Option<[u8; 32]>,
    /// Client: fingerprints of the datagrams sent since the peer was last heard
    /// from, with how often each was sent again (a few; the oldest go first).
    unanswered: VecDeque<(u64, u32)>,
}

#[cfg(feature = "openssl")]
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Role {
    Server,
    Client,
}

// Not bound by openssl-sys: declared here (OpenSSL 1.1.0+ signatures).
#[cfg(feature = "openssl")]
extern "C" {
    fn DTLSv1_listen(s: *mut openssl_sys::SSL, client: *mut libc::c_void) -> libc::c_int;
    fn BIO_ADDR_new() -> *mut libc::c_void;
    fn BIO_ADDR_free(a: *mut libc::c_void);
}

#[cfg(feature = "openssl")]
const DTLS_CTRL_GET_TIMEOUT: libc::c_int = 73;
#[cfg(feature = "openssl")]
const DTLS_CTRL_HANDLE_TIMEOUT: libc::c_int = 74;

#[cfg(feature = "openssl")]
/// An owned `BIO_ADDR` for `DTLSv1_listen` to write the (unknown) peer into.
struct BioAddr(*mut libc::c_void);

// SAFETY: the BIO_ADDR is plain memory owned by this value and used from one thread at a time.
#[cfg(feature = "openssl")]
unsafe impl Send for BioAddr {}

#[cfg(feature = "openssl")]
impl Drop for BioAddr {
    fn drop(&mut self) {
        if !self.0.is_null() {
            // SAFETY: allocated by BIO_ADDR_new, freed once.
            unsafe { BIO_ADDR_free(self.0) }
        }
    }
}

#[cfg(feature = "openssl")]
/// The peer of an SSL, for the cookie callbacks.
fn peer_index() -> Option<openssl::ex_data::Index<Ssl, SocketAddr>> {
    static INDEX: OnceLock<Option<openssl::ex_data::Index<Ssl, SocketAddr>>> = OnceLock::new();
    *INDEX.get_or_init(|| Ssl::new_ex_index().ok())
}

#[cfg(feature = "openssl")]
fn cookie_for(key: &PKey<Private>, peer: &SocketAddr, out: &mut [u8]) -> Result<usize, ErrorStack> {
    let mut signer = Signer::new(MessageDigest::sha256(), key)?;
    match peer {
        SocketAddr::V4(a) => signer.update(&a.ip().octets())?,
        SocketAddr::V6(a) => signer.update(&a.ip().octets())?,
    }
    signer.update(&peer.port().to_be_bytes())?;
    let mac = signer.sign_to_vec()?;
    let n = mac.len().min(out.len()).min(32);
    out[..n].copy_from_slice(&mac[..n]);
    Ok(n)
}

#[cfg(feature = "openssl")]
/// The OpenSSL implementation of [`DtlsBackend`].
pub struct OpensslDtls {
    ctx: SslContext,
    role: Role,
    config: DtlsConfig,
    sessions: HashMap<SocketAddr, Session>,
    /// The sessions whose handshake is in progress, with when it started.
    handshaking: HashMap<SocketAddr, Instant>,
    /// Server: handshakes in progress per source address.
    handshakes_per_ip: IpCounts,
    /// Server: established sessions whose peer did not authenticate.
    anonymous: usize,
    /// Server: no established session can be stale before this (a lower bound from
    /// the last scan, since sessions only get fresher), to scan rarely when full.
    no_stale_before: Option<Instant>,
    listener: Option<SslStream<Channel>>,
    bio_addr: BioAddr,
    transmits: VecDeque<Transmit>,
    events: VecDeque<DtlsEvent>,
    buf: Vec<u8>,
    stats: DtlsStats,
    /// Client with certificates: check the server's certificate for this name, or
    /// (`Some(None)`) for the server's IP address.
    verify_peer_name: Option<Option<String>>,
    /// When idle sessions are looked for next.
    next_idle_sweep: Option<Instant>,
}

#[cfg(feature = "openssl")]
impl std::fmt::Debug for OpensslDtls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpensslDtls")
            .field("role", &self.role)
            .field("sessions", &self.sessions.len())
            .field("stats", &self.stats)
            .finish()
    }
}

#[cfg(feature = "openssl")]
fn base_context(method: SslMethod, ciphers: &str) -> Result<SslContextBuilder, ErrorStack> {
    let mut b = SslContext::builder(method)?;
    b.set_min_proto_version(Some(SslVersion::DTLS1_2))?;
    b.set_max_proto_version(Some(SslVersion::DTLS1_2))?;
    // OpenSSL 3.2 and later (the vendored build) rate the CCM_8 suites, RFC 7252's
    // mandatory ones, at 64 bits, below the default security level: level 0 keeps them
    // for any configured cipher list, which alone decides what is offered.
    b.set_security_level(0);
    b.set_cipher_list(ciphers)?;
    b.set_options(SslOptions::NO_QUERY_MTU | SslOptions::NO_TICKET);
    b.set_mode(SslMode::RELEASE_BUFFERS);
    Ok(b)
}

#[cfg(feature = "openssl")]
impl OpensslDtls {
    /// A server table that accepts the identities in `keys`.
    pub fn server(keys: Arc<PskStore>, config: DtlsConfig) -> Result<OpensslDtls, ErrorStack> {
        OpensslDtls::server_with(Some(keys), None, config)
    }

    /// A server table with pre-shared keys, a certificate, or both (the client's
    /// cipher suites choose). With `x509.ca_pem`, clients must present a certificate
    /// that chains to it.
    pub fn server_with(
        keys: Option<Arc<PskStore>>,
        x509: Option<&X509Credentials>,
        config: DtlsConfig,
    ) -> Result<OpensslDtls, ErrorStack> {
        let mut b = base_context(SslMethod::dtls_server(), &config.ciphers)?;
        if let Some(x) = x509 {
            load_x509(&mut b, x)?;
            if x.ca_pem.is_some() {
                b.set_verify(
                    openssl::ssl::SslVerifyMode::PEER
                        | openssl::ssl::SslVerifyMode::FAIL_IF_NO_PEER_CERT,
                );
            }
        }
        if let Some(keys) = keys {
            set_psk_server(&mut b, keys);
        }
        let mut secret = [0u8; 32];
        openssl::rand::rand_bytes(&mut secret)?;
        let key = PKey::hmac(&secret)?;
        let verify_key = key.clone();
        b.set_cookie_generate_cb(move |ssl, out| {
            let peer = peer_index()
                .and_then(|i| ssl.ex_data(i).copied())
                .ok_or_else(ErrorStack::get)?;
            cookie_for(&key, &peer, out)
        });
        b.set_cookie_verify_cb(move |ssl, cookie| {
            let Some(peer) = peer_index().and_then(|i| ssl.ex_data(i).copied()) else {
                return false;
            };
            let mut expected = [0u8; 32];
            match cookie_for(&verify_key, &peer, &mut expected) {
                Ok(n) => cookie.len() == n && openssl::memcmp::eq(cookie, &expected[..n]),
                Err(_) => false,
            }
        });
        b.set_options(SslOptions::COOKIE_EXCHANGE);
        Ok(OpensslDtls::with_context(b.build(), Role::Server, config))
    }

    /// A client table authenticating with `auth`.
    pub fn client_with(
        auth: &DtlsClientAuth,
        config: DtlsConfig,
    ) -> Result<OpensslDtls, ErrorStack> {
        match auth {
            DtlsClientAuth::Psk(psk) => OpensslDtls::client(psk.clone(), config),
            DtlsClientAuth::X509(x) => {
                let mut b = base_context(SslMethod::dtls_client(), &config.ciphers)?;
                load_x509(&mut b, x)?;
                b.set_verify(openssl::ssl::SslVerifyMode::PEER);
                let mut t = OpensslDtls::with_context(b.build(), Role::Client, config);
                t.verify_peer_name = Some(x.server_name.clone());
                Ok(t)
            }
        }
    }

    /// A client table that authenticates with `psk` to every server it talks to.
    pub fn client(psk: ClientPsk, config: DtlsConfig) -> Result<OpensslDtls, ErrorStack> {
        let mut b = base_context(SslMethod::dtls_client(), &config.ciphers)?;
        set_psk_client(&mut b, psk);
        Ok(OpensslDtls::with_context(b.build(), Role::Client, config))
    }

    fn with_context(ctx: SslContext, role: Role, config: DtlsConfig) -> OpensslDtls {
        OpensslDtls {
            ctx,
            role,
            config,
            sessions: HashMap::new(),
            handshaking: HashMap::new(),
            handshakes_per_ip: IpCounts::new(),
            anonymous: 0,
            no_stale_before: None,
            listener: None,
            // SAFETY: plain allocation; a null result is checked before use.
            bio_addr: BioAddr(unsafe { BIO_ADDR_new() }),
            transmits: VecDeque::new(),
            events: VecDeque::new(),
            buf: vec![0; 16 * 1024 + 512],
            stats: DtlsStats::default(),
            verify_peer_name: None,
            next_idle_sweep: None,
        }
    }

    /// Drops established sessions idle for longer than `idle_timeout`; runs at most
    /// every quarter of it, so the scan stays cheap.
    fn sweep_idle(&mut self, now: Instant) {
        let idle = self.config.idle_timeout;
        if self.next_idle_sweep.is_some_and(|at| now < at) {
            return;
        }
        let idle_peers: Vec<SocketAddr> = self
            .sessions
            .iter()
            .filter(|(_, s)| s.established && now.saturating_duration_since(s.last_seen) >= idle)
            .map(|(p, _)| *p)
            .collect();
        self.stats.evicted += idle_peers.len() as u64;
        for peer in idle_peers {
            self.end_session(peer, format!("idle for {idle:?}"));
        }
        self.next_idle_sweep = (!self.sessions.is_empty()).then(|| now + idle / 4);
    }

    /// Client: starts a handshake with `peer` without sending data, so that the session
    /// is ready before the first datagram (e.g. a load generator sets up its sessions
    /// before measuring). Does nothing when a session with `peer` exists, or on a
    /// server. Progress is reported as for [`DtlsBackend::encrypt`]: the flight waits in
    /// [`DtlsBackend::poll_transmit`], then [`DtlsEvent::Connected`] or
    /// [`DtlsEvent::HandshakeFailed`] follows.
    pub fn connect(&mut self, now: Instant, peer: SocketAddr) {
        if self.role == Role::Client && !self.sessions.contains_key(&peer) {
            self.start_handshake(now, peer, None);
        }
    }

    /// Opens a client session with `peer`, queues `first` (if any) until it is
    /// established, and sends the ClientHello.
    fn start_handshake(&mut self, now: Instant, peer: SocketAddr, first: Option<&[u8]>) {
        let stream = match self.new_stream(Some(peer)) {
            Ok(s) => s,
            Err(e) => {
                self.events.push_back(DtlsEvent::HandshakeFailed {
                    peer,
                    reason: format!("cannot start: {e}"),
                });
                return;
            }
        };
        self.open_session(now, peer, stream);
        if let (Some(s), Some(data)) = (self.sessions.get_mut(&peer), first) {
            s.pending.push_back(data.to_vec());
        }
        self.advance(now, peer, None);
    }

    /// The cipher suite negotiated with `peer` (OpenSSL's name), once established.
    pub fn cipher(&self, peer: SocketAddr) -> Option<&'static str> {
        let s = self.sessions.get(&peer).filter(|s| s.established)?;
        s.stream.ssl().current_cipher().map(|c| c.name())
    }

    fn new_stream(&self, peer: Option<SocketAddr>) -> Result<SslStream<Channel>, ErrorStack> {
        let mut ssl = Ssl::new(&self.ctx)?;
        match peer {
            None => ssl.set_accept_state(),
            Some(peer) => {
                ssl.set_connect_state();
                if let Some(name) = &self.verify_peer_name {
                    expect_peer_name(&mut ssl, name.as_deref(), peer)?;
                }
            }
        }
        ssl.set_mtu(self.config.mtu)?;
        SslStream::new(ssl, Channel::default())
    }

    fn drain(
        transmits: &mut VecDeque<Transmit>,
        peer: SocketAddr,
        stream: &mut SslStream<Channel>,
    ) {
        for bytes in stream.get_mut().outgoing.drain(..) {
            transmits.push_back(Transmit { peer, bytes });
        }
    }

    /// A datagram from a peer without a session (or a new ClientHello from one with
    /// an established session): stateless cookie exchange first.
    fn listen(&mut self, now: Instant, peer: SocketAddr, records: &[u8]) -> Vec<Vec<u8>> {
        if self.bio_addr.0.is_null() {
            return Vec::new();
        }
        if self.listener.is_none() {
            match self.new_stream(None) {
                Ok(s) => self.listener = Some(s),
                Err(e) => {
                    tracing::warn!(error = %e, "cannot create a DTLS listener");
                    return Vec::new();
                }
            }
        }
        let Some(listener) = self.listener.as_mut() else {
            return Vec::new();
        };
        let ptr = listener.ssl().as_ptr();
        if let Some(index) = peer_index() {
            // SAFETY: `ptr` is the listener's live SSL; no other reference to it is in use.
            unsafe { SslRef::from_ptr_mut(ptr) }.set_ex_data(index, peer);
        }
        listener.get_mut().incoming = Some(records.to_vec());
        // SAFETY: a valid SSL with its BIO set, and a valid BIO_ADDR.
        let ret = unsafe { DTLSv1_listen(ptr, self.bio_addr.0) };
        listener.get_mut().incoming = None;
        let before = self.transmits.len();
        Self::drain(&mut self.transmits, peer, listener);
        if self.transmits.len() > before {
            self.stats.hello_verify_sent += 1;
        }
        if ret <= 0 {
            let _ = ErrorStack::get(); // clear the thread's error queue
            if ret < 0 {
                self.listener = None;
            }
            self.stats.dropped += u64::from(self.transmits.len() == before);
            return Vec::new();
        }
        // The cookie came back: from here on the peer has state.
        let Some(stream) = self.listener.take() else {
            return Vec::new();
        };
        if self.sessions.contains_key(&peer) {
            let was_handshake = self.handshaking.contains_key(&peer);
            self.stats.handshakes_displaced += u64::from(was_handshake);
            self.end_session(peer, "the peer started a new handshake".into());
        }
        if !self.may_admit(now) {
            // Every place is held by an active, authenticated session.
            self.stats.refused += 1;
            tracing::debug!(%peer, "DTLS handshake refused: the session table is full");
            self.transmits.push_back(Transmit {
                peer,
                bytes: plaintext_alert(INTERNAL_ERROR),
            });
            return Vec::new();
        }
        self.open_session(now, peer, stream);
        if let Some(s) = self.sessions.get_mut(&peer) {
            s.hello_random = hello_random(records);
        }
        self.advance(now, peer, None)
    }

    /// Adds a session whose handshake is starting, making room for it first.
    fn open_session(&mut self, now: Instant, peer: SocketAddr, stream: SslStream<Channel>) {
        match self.role {
            Role::Server => {
                self.make_room_for_handshake(peer);
                self.handshakes_per_ip.add(peer.ip());
            }
            Role::Client => self.make_room_lru(),
        }
        self.sessions.insert(
            peer,
            Session {
                stream,
                established: false,
                started: now,
                last_seen: now,
                pending: VecDeque::new(),
                retransmit_at: None,
                authenticated: false,
                hello_random: None,
                unanswered: VecDeque::new(),
            },
        );
        self.handshaking.insert(peer, now);
    }

    /// Feeds `records` (if any) to the peer's session and runs it as far as it goes.
    fn advance(&mut self, now: Instant, peer: SocketAddr, records: Option<&[u8]>) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        let Some(s) = self.sessions.get_mut(&peer) else {
            return out;
        };
        s.last_seen = now;
        if let Some(r) = records {
            s.stream.get_mut().incoming = Some(r.to_vec());
        }
        let mut failure = None;
        let mut completed = false;
        if !s.established {
            match s.stream.do_handshake() {
                Ok(()) => completed = true,
                Err(e) if is_retry(&e) => {
                    if self.role == Role::Server && records.is_some_and(finished_in) {
                        // The peer's Finished arrived (after its ChangeCipherSpec) but
                        // the handshake did not complete: OpenSSL silently drops
                        // records it cannot decrypt, which here means the peer used a
                        // different key. Say so instead of letting it time out.
                        self.transmits.push_back(Transmit {
                            peer,
                            bytes: plaintext_alert(DECRYPT_ERROR),
                        });
                        failure = Some(
                            "the peer's Finished could not be decrypted (different PSK for this identity)"
                                .to_string(),
                        );
                    } else {
                        s.retransmit_at = dtls_timeout(s.stream.ssl()).map(|d| now + d);
                    }
                }
                Err(e) => failure = Some(describe(&e)),
            }
        }
        if completed && !self.establish(now, peer) {
            return out; // refused: the session is gone
        }
        let Some(s) = self.sessions.get_mut(&peer) else {
            return out;
        };
        if failure.is_none() && s.established && records.is_some() {
            loop {
                match s.stream.ssl_read(&mut self.buf) {
                    Ok(n) if n > 0 => {
                        out.push(self.buf[..n].to_vec());
                        s.unanswered.clear();
                    }
                    Ok(_) => {}
                    Err(e) if is_retry(&e) => break,
                    Err(e) if e.code() == ErrorCode::ZERO_RETURN => {
                        failure = Some("the peer closed the session".into());
                        break;
                    }
                    Err(e) => {
                        failure = Some(describe(&e));
                        break;
                    }
                }
            }
        }
        s.stream.get_mut().incoming = None;
        Self::drain(&mut self.transmits, peer, &mut s.stream);
        if let Some(reason) = failure {
            self.fail(peer, reason);
        }
        out
    }

    /// A handshake completed: the session becomes established (on a server, if the
    /// session budget has room for it, see [`DtlsConfig`]) and sends what waited for
    /// it. Returns `false` when the session was refused (and is gone).
    fn establish(&mut self, now: Instant, peer: SocketAddr) -> bool {
        let authenticated = self.role == Role::Server
            && self
                .sessions
                .get(&peer)
                .is_some_and(|s| is_authenticated(s.stream.ssl()));
        if self.role == Role::Server && !self.make_room_for_session(now, authenticated) {
            self.refuse_established(peer);
            return false;
        }
        self.forget_handshake(peer);
        let Some(s) = self.sessions.get_mut(&peer) else {
            return false;
        };
        s.established = true;
        s.retransmit_at = None;
        s.authenticated = authenticated;
        if self.role == Role::Server && !authenticated {
            self.anonymous += 1;
        }
        self.stats.handshakes += 1;
        self.events.push_back(DtlsEvent::Connected { peer });
        while let Some(p) = s.pending.pop_front() {
            if let Err(e) = s.stream.ssl_write(&p) {
                tracing::debug!(%peer, error = %e, "DTLS write failed");
            }
        }
        true
    }

    /// Server: a handshake completed but every place is held by an active session
    /// that may not be displaced: the new session is closed (close_notify) at once.
    fn refuse_established(&mut self, peer: SocketAddr) {
        if let Some(s) = self.sessions.get_mut(&peer) {
            let _ = s.stream.shutdown();
            let _ = ErrorStack::get();
            s.stream.get_mut().incoming = None;
            Self::drain(&mut self.transmits, peer, &mut s.stream);
        }
        self.stats.refused += 1;
        self.end_session(
            peer,
            "refused: the session table is full of active sessions".into(),
        );
    }

    fn fail(&mut self, peer: SocketAddr, reason: String) {
        let _ = ErrorStack::get();
        if self.handshaking.contains_key(&peer) {
            self.stats.handshake_failures += 1;
            tracing::debug!(%peer, %reason, "DTLS handshake failed");
        }
        self.end_session(peer, reason);
    }
}

#[cfg(feature = "openssl")]
fn is_retry(e: &openssl::ssl::Error) -> bool {
    e.code() == ErrorCode::WANT_READ || e.code() == ErrorCode::WANT_WRITE
}

#[cfg(feature = "openssl")]
/// OpenSSL's reasons, with a hint for the common PSK and certificate mistakes.
pub(crate) fn describe(e: &openssl::ssl::Error) -> String {
    let reasons: Vec<String> = e
        .ssl_error()
        .map(|s| {
            s.errors()
                .iter()
                .filter_map(|x| x.reason().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    let text = if reasons.is_empty() {
        e.to_string()
    } else {
        reasons.join("; ")
    };
    let hint = crate::error::HandshakeFailure::from_reason(&text).hint();
    if hint.is_empty() {
        return text;
    }
    format!("{text} ({hint})")
}

#[cfg(feature = "openssl")]
const DECRYPT_ERROR: u8 = 51;
/// The alert a server refusing a new session sends (no alert says "full").
#[cfg(feature = "openssl")]
const INTERNAL_ERROR: u8 = 80;

#[cfg(feature = "openssl")]
/// A fatal alert in epoch 0 (unprotected, as before ChangeCipherSpec). The sequence
/// number is far above any the handshake used so the peer's replay window takes it.
fn plaintext_alert(description: u8) -> Vec<u8> {
    let mut r = vec![21, 0xfe, 0xfd, 0, 0];
    r.extend_from_slice(&[0x00, 0x00, 0xff, 0xff, 0xff, 0xff]); // sequence number
    r.extend_from_slice(&[0, 2, 2, description]); // length, level fatal, description
    r
}

#[cfg(feature = "openssl")]
/// Whether a datagram holds a ChangeCipherSpec followed by a handshake record in a
/// later epoch (the client's Finished).
fn finished_in(records: &[u8]) -> bool {
    let mut rest = records;
    let mut ccs = false;
    while rest.len() >= 13 {
        let (ctype, epoch) = (rest[0], u16::from_be_bytes([rest[3], rest[4]]));
        let len = usize::from(u16::from_be_bytes([rest[11], rest[12]]));
        if ctype == 20 {
            ccs = true;
        } else if ctype == 22 && epoch > 0 && ccs {
            return true;
        }
        rest = rest.get(13 + len..).unwrap_or(&[]);
    }
    false
}

/// Fingerprints of unanswered datagrams a client session remembers.
#[cfg(feature = "openssl")]
const UNANSWERED_KEPT: usize = 8;

/// Client, before sending `plaintext` over an established session: whether the server
/// seems to have lost the session. That is the case when the same datagram (a CoAP
/// retransmission) goes out for the `rehandshake_after_resends`-th time again and
/// nothing has been heard from the server since it first went out. Otherwise counts
/// the datagram.
#[cfg(feature = "openssl")]
fn presumed_lost(s: &mut Session, plaintext: &[u8], config: &DtlsConfig) -> bool {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    plaintext.hash(&mut h);
    let fingerprint = h.finish();
    if let Some((_, resends)) = s.unanswered.iter_mut().find(|(f, _)| *f == fingerprint) {
        *resends += 1;
        return *resends >= config.rehandshake_after_resends.max(1);
    }
    if s.unanswered.len() >= UNANSWERED_KEPT {
        s.unanswered.pop_front();
    }
    s.unanswered.push_back((fingerprint, 0));
    false
}

/// The client random of the epoch-0 ClientHello a datagram starts with.
#[cfg(feature = "openssl")]
fn hello_random(records: &[u8]) -> Option<[u8; 32]> {
    if !is_client_hello(records) {
        return None;
    }
    // Record header (13), handshake header (12), client_version (2), then the random.
    records.get(27..59)?.try_into().ok()
}

/// Whether the peer of a completed server handshake proved a credential: a
/// pre-shared key (PSK suites), or a client certificate that verified.
#[cfg(feature = "openssl")]
fn is_authenticated(ssl: &SslRef) -> bool {
    let psk = ssl
        .current_cipher()
        .is_some_and(|c| c.name().contains("PSK"));
    let certificate = ssl.peer_certificate().is_some()
        && ssl.verify_result() == openssl::x509::X509VerifyResult::OK;
    psk || certificate
}

#[cfg(feature = "openssl")]
/// Whether a datagram starts with an epoch-0 ClientHello record.
fn is_client_hello(records: &[u8]) -> bool {
    records.len() > 13 && records[0] == 22 && records[3] == 0 && records[4] == 0 && records[13] == 1
}

#[cfg(feature = "openssl")]
fn dtls_timeout(ssl: &SslRef) -> Option<Duration> {
    let mut tv = libc::timeval {
        tv_sec: 0,
        tv_usec: 0,
    };
    // SAFETY: DTLSv1_get_timeout writes a struct timeval to the pointer.
    let r = unsafe {
        openssl_sys::SSL_ctrl(
            ssl.as_ptr(),
            DTLS_CTRL_GET_TIMEOUT,
            0,
            (&mut tv as *mut libc::timeval).cast(),
        )
    };
    (r > 0).then(|| {
        Duration::from_secs(tv.tv_sec.max(0) as u64)
            + Duration::from_micros(tv.tv_usec.max(0) as u64)
    })
}

#[cfg(feature = "openssl")]
impl DtlsBackend for OpensslDtls {
    fn handle_datagram(&mut self, now: Instant, peer: SocketAddr, records: &[u8]) -> Vec<Vec<u8>> {
        if records.len() < 13 {
            self.stats.dropped += 1;
            return Vec::new();
        }
        // A ClientHello from a peer with a session starts over (RFC 6347 §4.2.8) once
        // its cookie checks out, unless it is a copy of the hello that started this
        // session (same random): a retransmission for the handshake in progress, a
        // late duplicate for an established session (dropped: it must not restart it).
        let hello =
            (self.role == Role::Server && is_client_hello(records)).then(|| hello_random(records));
        match self.sessions.get(&peer) {
            Some(s) if hello.is_some_and(|r| r == s.hello_random) && s.established => {
                self.stats.dropped += 1;
                Vec::new()
            }
            Some(s) if hello.is_none_or(|r| r == s.hello_random) => {
                self.advance(now, peer, Some(records))
            }
            _ if self.role == Role::Server => self.listen(now, peer, records),
            _ => {
                self.stats.dropped += 1;
                Vec::new()
            }
        }
    }

    fn encrypt(&mut self, now: Instant, peer: SocketAddr, plaintext: &[u8]) {
        if !self.sessions.contains_key(&peer) {
            if self.role == Role::Server {
                self.stats.dropped += 1;
                return;
            }
            self.start_handshake(now, peer, Some(plaintext));
            return;
        }
        let Some(s) = self.sessions.get_mut(&peer) else {
            return;
        };
        if !s.established {
            if s.pending.len() >= self.config.max_pending.max(1) {
                s.pending.pop_front();
            }
            s.pending.push_back(plaintext.to_vec());
            return;
        }
        if self.role == Role::Client && presumed_lost(s, plaintext, &self.config) {
            tracing::debug!(%peer, "DTLS session presumed lost by the server; handshaking again");
            self.end_session(
                peer,
                "a datagram retransmitted without an answer: the server may have lost the session; handshaking again".into(),
            );
            self.start_handshake(now, peer, Some(plaintext));
            return;
        }
        if let Err(e) = s.stream.ssl_write(plaintext) {
            tracing::debug!(%peer, error = %e, "DTLS write failed");
            let _ = ErrorStack::get();
        }
        Self::drain(&mut self.transmits, peer, &mut s.stream);
    }

    fn poll_transmit(&mut self) -> Option<Transmit> {
        self.transmits.pop_front()
    }

    fn poll_event(&mut self) -> Option<DtlsEvent> {
        self.events.pop_front()
    }

    fn poll_timeout(&self) -> Option<Instant> {
        let handshakes = self
            .handshaking
            .keys()
            .filter_map(|p| self.sessions.get(p))
            .map(|s| {
                let limit = s.started + self.config.handshake_timeout;
                s.retransmit_at.map_or(limit, |r| r.min(limit))
            })
            .min();
        let sweep = self.next_idle_sweep.filter(|_| !self.sessions.is_empty());
        [handshakes, sweep].into_iter().flatten().min()
    }

    fn handle_timeout(&mut self, now: Instant) {
        self.sweep_idle(now);
        let due: Vec<SocketAddr> = self
            .handshaking
            .keys()
            .filter(|p| {
                self.sessions.get(p).is_some_and(|s| {
                    now >= s.started + self.config.handshake_timeout
                        || s.retransmit_at.is_some_and(|r| now >= r)
                })
            })
            .copied()
            .collect();
        for peer in due {
            let Some(s) = self.sessions.get_mut(&peer) else {
                continue;
            };
            if now >= s.started + self.config.handshake_timeout {
                let reason = format!(
                    "no answer to complete the handshake within {:?} (is it a DTLS server, and are the PSK identity and key right?)",
                    self.config.handshake_timeout
                );
                self.fail(peer, reason);
                continue;
            }
            // SAFETY: DTLSv1_handle_timeout on a live SSL.
            let r = unsafe {
                openssl_sys::SSL_ctrl(
                    s.stream.ssl().as_ptr(),
                    DTLS_CTRL_HANDLE_TIMEOUT,
                    0,
                    std::ptr::null_mut(),
                )
            };
            Self::drain(&mut self.transmits, peer, &mut s.stream);
            if r < 0 {
                self.fail(
                    peer,
                    "no answer after the handshake's retransmissions".to_string(),
                );
                continue;
            }
            // At least a millisecond, so that a timer OpenSSL does not yet see as
            // expired cannot spin the loop.
            s.retransmit_at =
                dtls_timeout(s.stream.ssl()).map(|d| now + d.max(Duration::from_millis(1)));
        }
    }

    fn forget(&mut self, peer: SocketAddr) {
        self.remove_session(peer);
    }

    fn session_count(&self) -> usize {
        self.sessions.len()
    }

    fn stats(&self) -> DtlsStats {
        DtlsStats {
            sessions: (self.sessions.len() - self.handshaking.len()) as u64,
            handshaking: self.handshaking.len() as u64,
            ..self.stats
        }
    }
}

#[cfg(feature = "openssl")]
/// A throwaway PKI for tests and demos: a CA and EC P-256 certificates it signed,
/// made in memory at run time.
pub mod test_pki {
    use super::X509Credentials;
    use openssl::asn1::Asn1Time;
    use openssl::bn::BigNum;
    use openssl::ec::{EcGroup, EcKey};
    use openssl::error::ErrorStack;
    use openssl::hash::MessageDigest;
    use openssl::nid::Nid;
    use openssl::pkey::{PKey, Private};
    use openssl::x509::extension::{
        BasicConstraints, ExtendedKeyUsage, KeyUsage, SubjectAlternativeName,
    };
    use openssl::x509::{X509NameBuilder, X509};

    /// A CA and the certificates it issued.
    #[derive(Debug, Clone)]
    pub struct TestPki {
        /// The CA certificate (PEM).
        pub ca_pem: Vec<u8>,
        /// A server certificate for `localhost` and 127.0.0.1 / ::1, trusting the CA for
        /// client certificates.
        pub server: X509Credentials,
        /// A client certificate, trusting the CA for the server's.
        pub client: X509Credentials,
    }

    fn ec_key() -> Result<PKey<Private>, ErrorStack> {
        let group = EcGroup::from_curve_name(Nid::X9_62_PRIME256V1)?;
        PKey::from_ec_key(EcKey::generate(&group)?)
    }

    /// Validity of the certificates: from `.0` to `.1` days from now.
    type Days = (i64, i64);

    fn certificate(
        cn: &str,
        key: &PKey<Private>,
        issuer: Option<(&X509, &PKey<Private>)>,
        valid: Days,
    ) -> Result<X509, ErrorStack> {
        let mut name = X509NameBuilder::new()?;
        name.append_entry_by_text("CN", cn)?;
        let name = name.build();
        let mut b = X509::builder()?;
        b.set_version(2)?;
        let mut serial = BigNum::new()?;
        serial.rand(64, openssl::bn::MsbOption::MAYBE_ZERO, false)?;
        let serial = serial.to_asn1_integer()?;
        b.set_serial_number(&serial)?;
        b.set_subject_name(&name)?;
        b.set_issuer_name(issuer.map_or(&name, |(c, _)| c.subject_name()))?;
        b.set_pubkey(key)?;
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() as i64);
        let day = 24 * 3600;
        let from = Asn1Time::from_unix(now + valid.0 * day)?;
        let until = Asn1Time::from_unix(now + valid.1 * day)?;
        b.set_not_before(&from)?;
        b.set_not_after(&until)?;
        match issuer {
            None => {
                b.append_extension(BasicConstraints::new().critical().ca().build()?)?;
                b.append_extension(KeyUsage::new().key_cert_sign().crl_sign().build()?)?;
            }
            Some((ca, _)) => {
                let san = SubjectAlternativeName::new()
                    .dns("localhost")
                    .ip("127.0.0.1")
                    .ip("::1")
                    .build(&b.x509v3_context(Some(ca), None))?;
                b.append_extension(san)?;
                b.append_extension(
                    ExtendedKeyUsage::new()
                        .server_auth()
                        .client_auth()
                        .build()?,
                )?;
            }
        }
        let signer = issuer.map_or(key, |(_, k)| k);
        b.sign(signer, MessageDigest::sha256())?;
        Ok(b.build())
    }

    /// Makes a fresh CA (`cn` names it) with one server and one client certificate,
    /// valid for 30 days.
    pub fn generate(cn: &str) -> Result<TestPki, ErrorStack> {
        generate_valid(cn, (0, 30))
    }

    /// Like [`generate`], but the server and client certificates expired yesterday.
    pub fn generate_expired(cn: &str) -> Result<TestPki, ErrorStack> {
        generate_valid(cn, (-30, -1))
    }

    fn generate_valid(cn: &str, valid: Days) -> Result<TestPki, ErrorStack> {
        let ca_key = ec_key()?;
        let ca = certificate(cn, &ca_key, None, (-1, 30))?;
        let ca_pem = ca.to_pem()?;
        let mut issued = Vec::new();
        for who in ["server", "client"] {
            let key = ec_key()?;
            let cert = certificate(&format!("{cn} {who}"), &key, Some((&ca, &ca_key)), valid)?;
            issued.push(X509Credentials {
                cert_chain_pem: cert.to_pem()?,
                key_pem: key.private_key_to_pem_pkcs8()?,
                ca_pem: Some(ca_pem.clone()),
                server_name: None,
            });
        }
        let client = issued.pop().unwrap_or_default();
        let server = issued.pop().unwrap_or_default();
        Ok(TestPki {
            ca_pem,
            server,
            client,
        })
    }
}

#[cfg(feature = "openssl")]
mod budget;
#[cfg(all(test, feature = "openssl"))]
mod tests;

#[cfg(not(feature = "openssl"))]
mod unavailable;
#[cfg(not(feature = "openssl"))]
pub use unavailable::{OpensslDtls, Unavailable};
