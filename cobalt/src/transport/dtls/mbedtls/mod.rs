//! The Mbed TLS DTLS backend ([`MbedtlsDtls`]): DTLS 1.2 with the Connection ID of
//! RFC 9146, which OpenSSL lacks.
//!
//! A server grants each client a CID of [`CidConfig::len`] bytes, whose first bytes
//! are [`CidConfig::node_id`] (so that a balancer in front of a cluster can route
//! by it) and the rest random. Records of content type 25 (`tls12_cid`) are routed
//! to their session by that CID before the source address is looked at. When such a
//! record comes from another address than the session's, the session moves there
//! only if the record is authentic and not a replay (`mbedtls_ssl_check_record`)
//! and newer than every record the session has accepted (RFC 9146 §6); anything
//! else is dropped and the session stays where it was.
//!
//! **The endpoint's view.** A session is known by the address it is at now. When it
//! moves, [`DtlsBackend::poll_address_update`] reports the move once, before the
//! CoAP datagrams of the record that moved it are handed on: the runtime moves the
//! endpoint's and the server's state of the peer (exchanges, deduplication, observe
//! relations, per-peer and per-address budgets) to the new address, and the old
//! address holds nothing of it any more. Only an authentic, newer record moves a
//! session, so only such a record moves that state.
//!
//! Cipher suites: `TLS_PSK_WITH_AES_128_CCM_8` (RFC 7252's mandatory one) and, for a
//! server with a certificate (an EC P-256 key), `TLS_ECDHE_ECDSA_WITH_AES_128_CCM_8`.
//! A server given a CA (`X509Credentials::ca_pem`) requires a client certificate
//! that chains to it and is within its validity dates (checked by a callback
//! against the system clock: this build of Mbed TLS has none), and the
//! certificate's subject is the session's credential; without a CA its certificate
//! clients are anonymous. A client authenticates with a pre-shared key, or with a
//! certificate ([`MbedtlsDtls::client_with`]), verifying the server's certificate
//! in the same way (chain, dates, and the server's name or IP address).
//!
//! Budgets: at most [`DtlsConfig::max_handshakes`] handshakes (and
//! [`DtlsConfig::max_handshakes_per_ip`] per address) after the cookie exchange,
//! the oldest giving way; at most [`DtlsConfig::max_sessions_per_ip`] established
//! sessions per address, its least recently heard-from giving way; at most
//! [`DtlsConfig::max_sessions`] established sessions: a new one takes the place of the
//! least recently heard-from if that one has been silent for
//! [`DtlsConfig::stale_after`], else a session that proved a key may take the place of
//! an anonymous one (a certificate client's), else the new session is refused
//! (close_notify). So a flood of anonymous sessions never pushes out active peers.

mod aes_ni;
mod ffi;

use self::ffi::{Config, Context, Handshake, MbedError, Read};
use super::alerts::{plaintext_alert, HANDSHAKE_FAILURE};
use super::held::Held;
use super::unanswered::Unanswered;
use super::{AddressUpdate, CidConfig, DtlsBackend, DtlsConfig, DtlsEvent, DtlsStats};
use crate::transport::credentials::{ClientCredentials, ClientPsk, PskStore, X509Credentials};
use crate::transport::identity::Credential;
use crate::transport::per_ip::IpCounts;
use cobalt_proto::address::AddressPrefix;
use cobalt_proto::endpoint::Transmit;
use hashbrown::{HashMap, HashSet};
use rand::RngCore;
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Why an Mbed TLS table could not be made.
#[derive(Debug, thiserror::Error)]
pub enum MbedtlsSetupError {
    /// The CID settings are out of range.
    #[error("DTLS Connection ID: {0}")]
    Cid(String),
    /// Mbed TLS refused the configuration.
    #[error("cannot set up Mbed TLS: {0}")]
    Mbedtls(String),
}

impl From<MbedError> for MbedtlsSetupError {
    fn from(e: MbedError) -> Self {
        MbedtlsSetupError::Mbedtls(e.to_string())
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    Server,
    Client,
}

type SessionId = u64;

/// Moves kept for [`DtlsBackend::poll_address_update`] at most: the runtime takes
/// each one after the datagram that made it.
const MAX_UNREPORTED_MOVES: usize = 64;

struct Session {
    ctx: Context,
    /// Where the peer is now: records go there, and the endpoint knows it by it.
    addr: SocketAddr,
    /// Server: the CID granted to the peer (routes type-25 records).
    own_cid: Option<Box<[u8]>>,
    established: bool,
    started: Instant,
    last_seen: Instant,
    /// Server: the peer has sent application data over the session.
    used: bool,
    /// Client: datagrams waiting for the handshake.
    pending: Held,
    /// Client: what went out since the server was last heard from.
    unanswered: Unanswered,
    /// Server: the random of the ClientHello that started the session, to tell a
    /// retransmission or late copy of it from a new ClientHello.
    hello_random: Option<[u8; 32]>,
    /// Epoch and sequence number (`epoch << 48 | seq`) of the newest CID record
    /// accepted: an address update needs a newer one (RFC 9146 §6).
    newest_record: u64,
    credential: Option<Arc<Credential>>,
}

impl Session {
    /// The peer proved a pre-shared key or a certificate.
    fn authenticated(&self) -> bool {
        self.credential.is_some()
    }
}

/// The Mbed TLS implementation of [`DtlsBackend`], with the DTLS Connection ID.
/// See the [module docs](self).
pub struct MbedtlsDtls {
    role: Role,
    config: DtlsConfig,
    /// Server: the CID granted to clients (`None`: no CID).
    cid: Option<CidConfig>,
    sessions: HashMap<SessionId, Session>,
    by_addr: HashMap<SocketAddr, SessionId>,
    by_cid: HashMap<Box<[u8]>, SessionId>,
    next_id: SessionId,
    /// Server: the context that answers ClientHellos until one brings a valid cookie
    /// (then it becomes that session's, and a new one listens).
    listener: Option<Context>,
    handshakes_per_ip: IpCounts,
    sessions_per_ip: IpCounts,
    /// The sessions whose handshake is in progress (the timers only look at these).
    handshaking: HashSet<SessionId>,
    transmits: VecDeque<Transmit>,
    events: VecDeque<DtlsEvent>,
    /// Server: sessions moved and not yet reported by `poll_address_update` (at most
    /// [`MAX_UNREPORTED_MOVES`]).
    moves: VecDeque<AddressUpdate>,
    stats: DtlsStats,
    next_idle_sweep: Option<Instant>,
    /// Client with a certificate: check the server's certificate for this name, or
    /// (`Some(None)`) for the server's IP address.
    verify_server_name: Option<Option<String>>,
    // Last: the contexts above point into it, so it goes after them.
    tls: Arc<Config>,
}

impl std::fmt::Debug for MbedtlsDtls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MbedtlsDtls")
            .field("role", &self.role)
            .field("cid", &self.cid)
            .field("sessions", &self.sessions.len())
            .field("stats", &self.stats)
            .finish()
    }
}

/// The record header of DTLS 1.2 (content type, version, epoch, sequence number,
/// length) before a CID.
const HEADER: usize = 13;
/// The content type of a record with a CID (RFC 9146 §4).
const TLS12_CID: u8 = 25;

impl MbedtlsDtls {
    /// A server table accepting the identities in `keys`, granting a CID as `cid`
    /// says (`None`: no CID, as the OpenSSL backend).
    pub fn server(
        keys: Arc<PskStore>,
        cid: Option<CidConfig>,
        config: DtlsConfig,
    ) -> Result<MbedtlsDtls, MbedtlsSetupError> {
        MbedtlsDtls::server_with(Some(keys), None, cid, config)
    }

    /// A server table with pre-shared keys, a certificate (`x509`'s chain and key;
    /// an EC P-256 key for the ECDHE-ECDSA suite), or both. With `x509.ca_pem`, a
    /// client of the certificate suite must present a certificate that chains to it
    /// (and is within its validity dates by the system clock).
    pub fn server_with(
        keys: Option<Arc<PskStore>>,
        x509: Option<&X509Credentials>,
        cid: Option<CidConfig>,
        config: DtlsConfig,
    ) -> Result<MbedtlsDtls, MbedtlsSetupError> {
        if keys.is_none() && x509.is_none() {
            return Err(MbedtlsSetupError::Mbedtls(
                "a DTLS server needs pre-shared keys or a certificate".into(),
            ));
        }
        if let Some(c) = &cid {
            if !(1..=32).contains(&c.len) {
                return Err(MbedtlsSetupError::Cid(format!(
                    "length {} is out of range: use 1 to 32 bytes (6 is usual)",
                    c.len
                )));
            }
            if c.node_id.len() > c.len {
                return Err(MbedtlsSetupError::Cid(format!(
                    "the node id ({} bytes) does not fit in a {}-byte CID",
                    c.node_id.len(),
                    c.len
                )));
            }
        }
        let cid_len = cid.as_ref().map_or(0, |c| c.len);
        let cert = x509.map(|x| (x.cert_chain_pem.as_slice(), x.key_pem.as_slice()));
        let client_ca = x509.and_then(|x| x.ca_pem.as_deref());
        let tls = Config::server(keys, cert, client_ca, cid_len, config.handshake_timeout)
            .map_err(|e| {
                MbedtlsSetupError::Mbedtls(format!(
                    "{e} (is the certificate and key PEM, with an EC P-256 key?)"
                ))
            })?;
        Ok(MbedtlsDtls::with(Role::Server, tls, cid, config))
    }

    /// A client table authenticating with `psk`; with `cid`, it asks each server for
    /// a Connection ID, so that its session survives a change of its own address.
    pub fn client(
        psk: &ClientPsk,
        cid: bool,
        config: DtlsConfig,
    ) -> Result<MbedtlsDtls, MbedtlsSetupError> {
        MbedtlsDtls::client_with(&ClientCredentials::Psk(psk.clone()), cid, config)
    }

    /// A client table authenticating with `auth`: a pre-shared key, or (the
    /// ECDHE-ECDSA suite) a certificate and key (EC P-256; none: no client
    /// certificate) with the CA the server's certificate must chain to, for
    /// `auth.server_name` (without one, the server's IP address). With `cid`, as
    /// [`MbedtlsDtls::client`].
    pub fn client_with(
        auth: &ClientCredentials,
        cid: bool,
        config: DtlsConfig,
    ) -> Result<MbedtlsDtls, MbedtlsSetupError> {
        let timeout = config.handshake_timeout;
        let (tls, server_name) = match auth {
            ClientCredentials::Psk(psk) => (Config::client(psk, cid, timeout)?, None),
            ClientCredentials::X509(x) => {
                let ca = x.ca_pem.as_deref().ok_or_else(|| {
                    MbedtlsSetupError::Mbedtls(
                        "a certificate client needs the CA that the server's certificate \
                         chains to"
                            .into(),
                    )
                })?;
                let own = (!x.cert_chain_pem.is_empty())
                    .then_some((x.cert_chain_pem.as_slice(), x.key_pem.as_slice()));
                let tls = Config::client_x509(own, ca, cid, timeout).map_err(|e| {
                    MbedtlsSetupError::Mbedtls(format!(
                        "{e} (are the certificate, key and CA PEM, with an EC P-256 key?)"
                    ))
                })?;
                (tls, Some(x.server_name.clone()))
            }
        };
        let cid = cid.then(|| CidConfig {
            len: 0,
            node_id: Vec::new(),
        });
        let mut table = MbedtlsDtls::with(Role::Client, tls, cid, config);
        table.verify_server_name = server_name;
        Ok(table)
    }

    fn with(role: Role, tls: Config, cid: Option<CidConfig>, config: DtlsConfig) -> MbedtlsDtls {
        MbedtlsDtls {
            role,
            config,
            cid,
            sessions: HashMap::new(),
            by_addr: HashMap::new(),
            by_cid: HashMap::new(),
            next_id: 0,
            listener: None,
            handshakes_per_ip: IpCounts::new(AddressPrefix::default()),
            sessions_per_ip: IpCounts::new(AddressPrefix::default()),
            handshaking: HashSet::new(),
            transmits: VecDeque::new(),
            moves: VecDeque::new(),
            events: VecDeque::new(),
            stats: DtlsStats::default(),
            next_idle_sweep: None,
            verify_server_name: None,
            tls: Arc::new(tls),
        }
    }

    /// The CID the server granted the peer at `peer`,
    /// once established with a CID.
    pub fn cid_of(&self, peer: SocketAddr) -> Option<&[u8]> {
        let id = self.by_addr.get(&peer)?;
        self.sessions.get(id)?.own_cid.as_deref()
    }

    /// Client: whether the session with `peer` uses a CID (the server granted one).
    pub fn uses_cid(&mut self, peer: SocketAddr) -> bool {
        let Some(id) = self.by_addr.get(&peer) else {
            return false;
        };
        let role = self.role;
        self.sessions.get_mut(id).is_some_and(|s| {
            s.established
                && match role {
                    Role::Client => s.ctx.peer_cid().is_some_and(|c| !c.is_empty()),
                    Role::Server => s.own_cid.is_some(),
                }
        })
    }

    /// The cipher suite negotiated with `peer`, once established.
    pub fn cipher(&self, peer: SocketAddr) -> Option<String> {
        let id = self.by_addr.get(&peer)?;
        let s = self.sessions.get(id).filter(|s| s.established)?;
        s.ctx.ciphersuite()
    }

    /// Client: starts a handshake with `peer` without sending data (nothing if a
    /// session exists, or on a server).
    pub fn connect(&mut self, now: Instant, peer: SocketAddr) {
        if self.role == Role::Client && !self.by_addr.contains_key(&peer) {
            self.start_handshake(now, peer, None);
        }
    }

    fn new_context(&self, now: Instant) -> Result<Context, MbedError> {
        let mtu = u16::try_from(self.config.mtu).unwrap_or(u16::MAX);
        Context::new(&self.tls, now, mtu)
    }

    fn start_handshake(&mut self, now: Instant, peer: SocketAddr, first: Option<&[u8]>) {
        let ctx = self.new_context(now).and_then(|mut ctx| {
            if self.cid.is_some() {
                ctx.enable_cid(&[])?;
            }
            if let Some(name) = &self.verify_server_name {
                let ip = peer.ip().to_string();
                ctx.expect_server_name(name.as_deref().unwrap_or(&ip))?;
            }
            Ok(ctx)
        });
        let ctx = match ctx {
            Ok(c) => c,
            Err(e) => {
                self.events.push_back(DtlsEvent::HandshakeFailed {
                    peer,
                    reason: format!("cannot start: {e}"),
                });
                return;
            }
        };
        self.make_room_lru();
        let id = self.insert(now, peer, ctx, None);
        if let (Some(s), Some(data)) = (self.sessions.get_mut(&id), first) {
            s.pending.push(data, self.config.max_pending);
        }
        self.advance(now, id, None, &mut Vec::new());
    }

    fn insert(
        &mut self,
        now: Instant,
        peer: SocketAddr,
        ctx: Context,
        own_cid: Option<Box<[u8]>>,
    ) -> SessionId {
        let id = self.next_id;
        self.next_id += 1;
        self.sessions.insert(
            id,
            Session {
                ctx,
                addr: peer,
                own_cid: own_cid.clone(),
                established: false,
                started: now,
                last_seen: now,
                used: false,
                pending: Held::default(),
                unanswered: Unanswered::default(),
                hello_random: None,
                newest_record: 0,
                credential: None,
            },
        );
        self.by_addr.insert(peer, id);
        if let Some(cid) = own_cid {
            self.by_cid.insert(cid, id);
        }
        self.handshaking.insert(id);
        if self.role == Role::Server {
            self.handshakes_per_ip.add(peer.ip());
        }
        id
    }

    /// Removes a session and its index entries, without events.
    fn remove(&mut self, id: SessionId) -> Option<Session> {
        let s = self.sessions.remove(&id)?;
        if self.by_addr.get(&s.addr) == Some(&id) {
            self.by_addr.remove(&s.addr);
        }
        if let Some(cid) = &s.own_cid {
            self.by_cid.remove(cid);
        }
        if s.established {
            if self.role == Role::Server {
                self.sessions_per_ip.remove(s.addr.ip());
            }
        } else {
            self.handshaking.remove(&id);
            if self.role == Role::Server {
                self.handshakes_per_ip.remove(s.addr.ip());
            }
        }
        Some(s)
    }

    /// Ends a session with an event (Closed, or HandshakeFailed while handshaking).
    fn end(&mut self, id: SessionId, reason: String) {
        if let Some(s) = self.remove(id) {
            let peer = s.addr;
            self.events.push_back(if s.established {
                DtlsEvent::Closed { peer, reason }
            } else {
                self.stats.handshake_failures += 1;
                DtlsEvent::HandshakeFailed { peer, reason }
            });
        }
    }

    /// Client: makes room for one more session by ending the least recently used.
    fn make_room_lru(&mut self) {
        while self.sessions.len() >= self.config.max_sessions.max(1) {
            let Some(id) = self.least_recent(|_| true) else {
                return;
            };
            self.stats.evicted += 1;
            self.end(id, "evicted: the session table is full".into());
        }
    }

    /// The session heard from least recently among those `keep` selects.
    fn least_recent(&self, keep: impl Fn(&Session) -> bool) -> Option<SessionId> {
        self.sessions
            .iter()
            .filter(|(_, s)| keep(s))
            .min_by_key(|(_, s)| s.last_seen)
            .map(|(id, _)| *id)
    }

    /// A CID for a new server session: the node id, then random bytes, unused here.
    fn fresh_cid(&self) -> Option<Box<[u8]>> {
        let c = self.cid.as_ref()?;
        for _ in 0..8 {
            let mut cid = vec![0u8; c.len];
            cid[..c.node_id.len()].copy_from_slice(&c.node_id);
            rand::rng().fill_bytes(&mut cid[c.node_id.len()..]);
            let cid = cid.into_boxed_slice();
            if !self.by_cid.contains_key(&cid) {
                return Some(cid);
            }
        }
        None
    }

    /// Server: an epoch-0 ClientHello. The listener answers it with a
    /// HelloVerifyRequest unless it carries a valid cookie; then the listener's
    /// context becomes the new session's.
    fn listen(&mut self, now: Instant, peer: SocketAddr, records: &[u8]) {
        let mut listener = match self.listener.take() {
            Some(l) => l,
            None => match self.new_context(now) {
                Ok(l) => l,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot create a DTLS listener");
                    return;
                }
            },
        };
        let own_cid = self.fresh_cid();
        let prepared = listener.reset().and_then(|()| {
            listener.set_transport_id(peer)?;
            match &own_cid {
                Some(cid) => listener.enable_cid(cid),
                None => Ok(()),
            }
        });
        if let Err(e) = prepared {
            tracing::debug!(%peer, error = %e, "DTLS listener reset failed");
            self.stats.dropped += 1;
            return; // the listener is dropped; a new one is made next time
        }
        match listener.handshake(now, Some(records)) {
            Handshake::HelloVerifySent => {
                self.transmits.extend(
                    listener
                        .take_outgoing()
                        .map(|bytes| Transmit { peer, bytes }),
                );
                self.stats.hello_verify_sent += 1;
                self.listener = Some(listener);
            }
            Handshake::InProgress | Handshake::Done if !listener.has_outgoing() => {
                // Nothing answered: Mbed TLS dropped the record (or kept a fragment).
                // No state for an address that has not returned a cookie.
                self.stats.dropped += 1;
                self.listener = Some(listener);
            }
            Handshake::InProgress | Handshake::Done => {
                // The cookie checked out (the ServerHello flight is out): the peer
                // has state from here on.
                if let Some(&old) = self.by_addr.get(&peer) {
                    let was_handshake = self.sessions.get(&old).is_some_and(|s| !s.established);
                    self.stats.handshakes_displaced += u64::from(was_handshake);
                    self.end(old, "the peer started a new handshake".into());
                }
                self.make_room_for_handshake(peer);
                let id = self.insert(now, peer, listener, own_cid);
                if let Some(s) = self.sessions.get_mut(&id) {
                    s.hello_random = hello_random(records);
                    self.transmits
                        .extend(s.ctx.take_outgoing().map(|bytes| Transmit { peer, bytes }));
                }
            }
            Handshake::Failed(e) => {
                tracing::debug!(%peer, error = %e, "ClientHello refused");
                self.transmits.extend(
                    listener
                        .take_outgoing()
                        .map(|bytes| Transmit { peer, bytes }),
                );
                self.stats.dropped += 1;
                self.listener = Some(listener);
            }
        }
    }

    /// Server: keeps handshakes in progress within their budgets before one more.
    fn make_room_for_handshake(&mut self, peer: SocketAddr) {
        let per_ip = self.config.max_handshakes_per_ip.max(1) as u32;
        while self.handshakes_per_ip.get(peer.ip()) >= per_ip {
            let key = self.handshakes_per_ip.key(peer.ip());
            let Some(id) =
                self.oldest_handshake(|s| self.handshakes_per_ip.key(s.addr.ip()) == key)
            else {
                break;
            };
            self.stats.handshakes_displaced += 1;
            self.end(
                id,
                "displaced by a newer handshake from the same address".into(),
            );
        }
        while self.handshaking.len() >= self.config.max_handshakes.max(1) {
            let Some(id) = self.oldest_handshake(|_| true) else {
                break;
            };
            self.stats.handshakes_displaced += 1;
            self.end(id, "displaced: too many handshakes in progress".into());
        }
    }

    fn oldest_handshake(&self, keep: impl Fn(&Session) -> bool) -> Option<SessionId> {
        self.handshaking
            .iter()
            .filter_map(|id| Some((*id, self.sessions.get(id)?)))
            .filter(|(_, s)| keep(s))
            .min_by_key(|(_, s)| s.started)
            .map(|(id, _)| id)
    }

    /// Server: keeps established sessions within their budgets before one more from
    /// `ip` (see the module docs). Returns `false` when the newcomer must be refused.
    fn make_room_for_session(
        &mut self,
        now: Instant,
        ip: std::net::IpAddr,
        authenticated: bool,
    ) -> bool {
        let per_ip = self.config.max_sessions_per_ip.max(1) as u32;
        while self.sessions_per_ip.get(ip) >= per_ip {
            let key = self.sessions_per_ip.key(ip);
            let Some(id) = self
                .least_recent(|s| s.established && self.sessions_per_ip.key(s.addr.ip()) == key)
            else {
                break;
            };
            self.stats.evicted += 1;
            self.end(id, "evicted: its address holds too many sessions".into());
        }
        let established = self.sessions.len() - self.handshaking.len();
        if established < self.config.max_sessions.max(1) {
            return true;
        }
        let stale_after = self.config.stale_after;
        let victim = self
            .least_recent(|s| s.established)
            .filter(|id| {
                self.sessions
                    .get(id)
                    .is_some_and(|s| now.saturating_duration_since(s.last_seen) >= stale_after)
            })
            .or_else(|| {
                authenticated
                    .then(|| self.least_recent(|s| s.established && !s.authenticated()))
                    .flatten()
            });
        match victim {
            Some(id) => {
                self.stats.evicted += 1;
                self.end(id, "evicted: the session table is full".into());
                true
            }
            None => false,
        }
    }

    /// Runs session `id` with `records` (if any) and collects its application data.
    fn advance(
        &mut self,
        now: Instant,
        id: SessionId,
        records: Option<&[u8]>,
        out: &mut Vec<Vec<u8>>,
    ) {
        let Some(s) = self.sessions.get_mut(&id) else {
            return;
        };
        if records.is_some() {
            s.last_seen = now;
        }
        let mut failure = None;
        let mut completed = false;
        // Server: Mbed TLS ends some handshakes without an alert (a client sent no
        // certificate where one is required); one is sent then, so that the client
        // fails at once instead of at its handshake timeout.
        let mut alert = None;
        if !s.established {
            match s.ctx.handshake(now, records) {
                Handshake::Done => completed = true,
                Handshake::InProgress => {}
                Handshake::HelloVerifySent => {
                    failure = Some("unexpected HelloVerifyRequest".into())
                }
                Handshake::Failed(e) => {
                    if self.role == Role::Server && !s.ctx.has_outgoing() {
                        alert = Some(plaintext_alert(HANDSHAKE_FAILURE));
                    }
                    failure = Some(e.to_string())
                }
            }
        } else if let Some(r) = records {
            let before = out.len();
            match s.ctx.read(now, r, out) {
                Read::Nothing => {}
                Read::Closed => failure = Some("the peer closed the session".to_string()),
                Read::Failed(e) => failure = Some(e.to_string()),
            }
            if out.len() > before {
                s.used = true;
                s.unanswered.clear();
                if let Some(seq) = cid_record_seq(r) {
                    s.newest_record = s.newest_record.max(seq);
                }
            }
        }
        let addr = s.addr;
        self.transmits.extend(
            s.ctx
                .take_outgoing()
                .chain(alert)
                .map(|bytes| Transmit { peer: addr, bytes }),
        );
        if let Some(reason) = failure {
            self.end(id, reason);
            return;
        }
        if completed {
            self.establish(now, id);
        }
    }

    /// A handshake completed: the session is established and sends what waited.
    fn establish(&mut self, now: Instant, id: SessionId) {
        if self.role == Role::Server {
            let Some((ip, authenticated)) = self
                .sessions
                .get(&id)
                .map(|s| (s.addr.ip(), proved(&s.ctx).is_some()))
            else {
                return;
            };
            if !self.make_room_for_session(now, ip, authenticated) {
                self.refuse(id);
                return;
            }
        }
        let Some(s) = self.sessions.get_mut(&id) else {
            return;
        };
        s.established = true;
        s.last_seen = now;
        if self.role == Role::Server {
            s.credential = proved(&s.ctx).map(Arc::new);
        }
        if self.role == Role::Client && self.cid.is_some() {
            // The server did not grant a CID: the session works, without one.
            if s.ctx.peer_cid().is_none_or(|c| c.is_empty()) {
                tracing::debug!(peer = %s.addr, "the DTLS server granted no Connection ID");
            }
        }
        let addr = s.addr;
        let mut failure = None;
        while let Some(p) = s.pending.pop() {
            if let Err(e) = s.ctx.write(&p) {
                failure = Some(e);
                break;
            }
        }
        self.transmits.extend(
            s.ctx
                .take_outgoing()
                .map(|bytes| Transmit { peer: addr, bytes }),
        );
        self.handshaking.remove(&id);
        if self.role == Role::Server {
            self.handshakes_per_ip.remove(addr.ip());
            self.sessions_per_ip.add(addr.ip());
        }
        self.stats.handshakes += 1;
        self.events.push_back(DtlsEvent::Connected { peer: addr });
        if let Some(e) = failure {
            tracing::debug!(peer = %addr, error = %e, "DTLS write failed");
        }
    }

    /// Server: a handshake completed but every place is held by an active session
    /// that may not be displaced: the new session is closed (close_notify) at once.
    fn refuse(&mut self, id: SessionId) {
        if let Some(s) = self.sessions.get_mut(&id) {
            s.ctx.close_notify();
            let addr = s.addr;
            self.transmits.extend(
                s.ctx
                    .take_outgoing()
                    .map(|bytes| Transmit { peer: addr, bytes }),
            );
        }
        self.stats.refused += 1;
        self.end(
            id,
            "refused: the session table is full of active sessions".into(),
        );
    }

    /// Server: a record with a CID from `peer`. If its session is elsewhere, the
    /// session moves to `peer` only for an authentic, newer record (RFC 9146 §6).
    /// Returns the session to feed the datagram to.
    fn route_by_cid(&mut self, peer: SocketAddr, records: &[u8]) -> Option<SessionId> {
        let len = self.cid.as_ref()?.len;
        let cid = records.get(HEADER - 2..HEADER - 2 + len)?;
        let id = *self.by_cid.get(cid)?;
        let s = self.sessions.get(&id)?;
        if s.addr == peer {
            return Some(id);
        }
        if !s.established {
            return None;
        }
        let seq = cid_record_seq(records)?;
        if seq <= s.newest_record {
            tracing::debug!(from = %peer, session = %s.addr, "DTLS CID record not newer: the session stays");
            self.stats.address_updates_refused += 1;
            return None;
        }
        if let Err(e) = s.ctx.check_record(records) {
            tracing::debug!(from = %peer, session = %s.addr, error = %e, "DTLS CID record refused: the session stays");
            self.stats.address_updates_refused += 1;
            return None;
        }
        let old = s.addr;
        // The new address is the peer's now; a session still registered there is gone
        // (the NAT gave its port to this peer).
        if let Some(&other) = self.by_addr.get(&peer) {
            self.end(
                other,
                format!("its address {peer} now belongs to another session"),
            );
        }
        let s = self.sessions.get_mut(&id)?;
        s.addr = peer;
        self.by_addr.remove(&old);
        self.by_addr.insert(peer, id);
        self.sessions_per_ip.remove(old.ip());
        self.sessions_per_ip.add(peer.ip());
        self.stats.address_updates += 1;
        if self.moves.len() >= MAX_UNREPORTED_MOVES {
            self.moves.pop_front(); // a caller that never asks (the runtime asks each time)
        }
        self.moves.push_back(AddressUpdate {
            from: old,
            to: peer,
        });
        tracing::debug!(from = %old, to = %peer, "DTLS session moved (authentic, newer CID record)");
        Some(id)
    }

    fn sweep_idle(&mut self, now: Instant) {
        if self.next_idle_sweep.is_some_and(|at| now < at) {
            return;
        }
        let idle = self.config.idle_timeout;
        let unused = match self.role {
            Role::Server => self.config.unused_timeout.min(idle),
            Role::Client => idle,
        };
        let stale: Vec<(SessionId, Duration)> = self
            .sessions
            .iter()
            .filter(|(_, s)| s.established)
            .filter_map(|(id, s)| {
                let limit = if s.used { idle } else { unused };
                (now.saturating_duration_since(s.last_seen) >= limit).then_some((*id, limit))
            })
            .collect();
        self.stats.evicted += stale.len() as u64;
        for (id, limit) in stale {
            self.end(id, format!("idle for {limit:?}"));
        }
        self.next_idle_sweep = (!self.sessions.is_empty()).then(|| now + unused / 4);
    }
}

/// What the client of a server session's completed handshake proved: a pre-shared
/// key, or a certificate (which verified, or the handshake would have failed).
fn proved(ctx: &Context) -> Option<Credential> {
    if let Some(identity) = ctx.psk_identity() {
        return Some(Credential::PskIdentity(identity.to_vec()));
    }
    ctx.peer_subject()
        .map(|subject| Credential::Certificate { subject })
}

/// `epoch << 48 | sequence number` of a datagram's first record, if it has a CID.
fn cid_record_seq(records: &[u8]) -> Option<u64> {
    if *records.first()? != TLS12_CID {
        return None;
    }
    let b = records.get(3..11)?;
    Some(b.iter().fold(0u64, |acc, x| acc << 8 | u64::from(*x)))
}

/// The client random of the epoch-0 ClientHello a datagram starts with.
fn hello_random(records: &[u8]) -> Option<[u8; 32]> {
    if !is_client_hello(records) {
        return None;
    }
    // Record header (13), handshake header (12), client_version (2), then the random.
    records.get(27..59)?.try_into().ok()
}

/// Whether a datagram starts with an epoch-0 ClientHello record.
fn is_client_hello(records: &[u8]) -> bool {
    records.len() > HEADER
        && records[0] == 22
        && records[3] == 0
        && records[4] == 0
        && records[HEADER] == 1
}

impl DtlsBackend for MbedtlsDtls {
    fn handle_datagram(&mut self, now: Instant, peer: SocketAddr, records: &[u8]) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        if records.len() < HEADER {
            self.stats.dropped += 1;
            return out;
        }
        let id = if self.role == Role::Server && records[0] == TLS12_CID {
            self.route_by_cid(peer, records)
        } else if self.role == Role::Server && is_client_hello(records) {
            // A copy of the ClientHello that started the session (same random) goes
            // to its handshake, or is dropped once established (it must not restart
            // the session); a new one starts over after the cookie exchange (RFC 6347
            // §4.2.8).
            let random = hello_random(records);
            let session = self.by_addr.get(&peer).copied();
            match session.and_then(|id| self.sessions.get(&id).map(|s| (id, s))) {
                Some((id, s)) if random.is_some() && s.hello_random == random => {
                    (!s.established).then_some(id)
                }
                _ => {
                    self.listen(now, peer, records);
                    return out;
                }
            }
        } else {
            self.by_addr.get(&peer).copied()
        };
        match id {
            Some(id) => self.advance(now, id, Some(records), &mut out),
            None => self.stats.dropped += 1,
        }
        out
    }

    fn poll_address_update(&mut self) -> Option<AddressUpdate> {
        self.moves.pop_front()
    }

    fn encrypt(&mut self, now: Instant, peer: SocketAddr, plaintext: &[u8]) {
        let Some(&id) = self.by_addr.get(&peer) else {
            if self.role == Role::Server {
                self.stats.dropped += 1;
            } else {
                self.start_handshake(now, peer, Some(plaintext));
            }
            return;
        };
        let Some(s) = self.sessions.get_mut(&id) else {
            return;
        };
        if !s.established {
            s.pending.push(plaintext, self.config.max_pending);
            return;
        }
        if self.role == Role::Client && s.unanswered.presumed_lost(plaintext, &self.config) {
            tracing::debug!(%peer, "DTLS session presumed lost by the server; handshaking again");
            self.end(
                id,
                "a datagram retransmitted without an answer: the server may have lost the session; handshaking again".into(),
            );
            self.start_handshake(now, peer, Some(plaintext));
            return;
        }
        if let Err(e) = s.ctx.write(plaintext) {
            tracing::debug!(%peer, error = %e, "DTLS write failed");
        }
        let addr = s.addr;
        self.transmits.extend(
            s.ctx
                .take_outgoing()
                .map(|bytes| Transmit { peer: addr, bytes }),
        );
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
            .iter()
            .filter_map(|id| self.sessions.get(id))
            .map(|s| {
                let limit = s.started + self.config.handshake_timeout;
                s.ctx.retransmit_at().map_or(limit, |r| r.min(limit))
            })
            .min();
        let sweep = self.next_idle_sweep.filter(|_| !self.sessions.is_empty());
        [handshakes, sweep].into_iter().flatten().min()
    }

    fn handle_timeout(&mut self, now: Instant) {
        self.sweep_idle(now);
        let due: Vec<SessionId> = self
            .handshaking
            .iter()
            .filter(|id| {
                self.sessions.get(*id).is_some_and(|s| {
                    now >= s.started + self.config.handshake_timeout
                        || s.ctx.retransmit_at().is_some_and(|r| now >= r)
                })
            })
            .copied()
            .collect();
        for id in due {
            let Some(s) = self.sessions.get(&id) else {
                continue;
            };
            if now >= s.started + self.config.handshake_timeout {
                let reason = format!(
                    "no answer to complete the handshake within {:?} (is it a DTLS server, and are the PSK identity and key right?)",
                    self.config.handshake_timeout
                );
                self.end(id, reason);
                continue;
            }
            self.advance(now, id, None, &mut Vec::new());
        }
    }

    fn forget(&mut self, peer: SocketAddr) {
        if let Some(&id) = self.by_addr.get(&peer) {
            self.remove(id);
        }
    }

    fn close_all(&mut self) {
        let ids: Vec<SessionId> = self.sessions.keys().copied().collect();
        for id in ids {
            if let Some(s) = self.sessions.get_mut(&id).filter(|s| s.established) {
                s.ctx.close_notify();
                let addr = s.addr;
                self.transmits.extend(
                    s.ctx
                        .take_outgoing()
                        .map(|bytes| Transmit { peer: addr, bytes }),
                );
            }
            self.end(id, "closed by this end (close_notify)".into());
        }
    }

    fn credential(&self, peer: SocketAddr) -> Option<Arc<Credential>> {
        let id = self.by_addr.get(&peer)?;
        let s = self.sessions.get(id).filter(|s| s.established)?;
        s.credential.clone()
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

#[cfg(test)]
mod tests;
