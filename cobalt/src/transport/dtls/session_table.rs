//! The OpenSSL DTLS backend: the session table of a shard (one `SSL` per peer over an
//! in-memory channel that keeps datagram boundaries), the stateless cookie exchange
//! and the session and handshake budgets.

use self::records::ServerRecords;
use super::alerts::{plaintext_alert, DECRYPT_ERROR, INTERNAL_ERROR};
use super::held::Held;
use super::unanswered::Unanswered;
use super::{DtlsBackend, DtlsConfig, DtlsEvent, DtlsStats};
use crate::transport::credentials::{
    expect_peer_name, load_x509, set_psk_client, set_psk_server, ClientCredentials, ClientPsk,
    PskStore, X509Credentials,
};
use crate::transport::identity::{credential_of, Credential};
use crate::transport::per_ip::IpCounts;
use cobalt_proto::address::AddressPrefix;
use cobalt_proto::endpoint::Transmit;
use foreign_types::ForeignTypeRef;
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
// foldhash (hashbrown's default), as the endpoint's per-peer tables: the session lookup is on
// every record's path, where SipHash cost more than the rest of the lookup.
use hashbrown::HashMap;
use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

/// A datagram-preserving in-memory channel between OpenSSL and the table: each
/// `read` returns one whole received datagram, each `write` is one datagram to send.
#[derive(Debug, Default)]
struct Channel {
    incoming: Option<Vec<u8>>,
    outgoing: Vec<Vec<u8>>,
}

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

/// What protects a session's records.
enum Link {
    /// OpenSSL: during the handshake, and after it where [`ServerRecords`] cannot
    /// take over (a client, a suite other than CCM_8, a resumed session).
    Ssl(SslStream<Channel>),
    /// An established server session with a CCM_8 suite, without its `SSL`.
    Records(Box<ServerRecords>),
}

struct Session {
    link: Link,
    established: bool,
    started: Instant,
    /// When a record from the peer last arrived.
    last_seen: Instant,
    /// Server: the peer has sent application data (a CoAP message) over the session.
    used: bool,
    pending: Held,
    retransmit_at: Option<Instant>,
    /// Server: the peer proved a credential (a pre-shared key, a verified client
    /// certificate); an anonymous session gives way to an authenticated one.
    authenticated: bool,
    /// Server: what the peer proved (PSK identity, certificate subject), taken once
    /// when the session is established and shared by its requests.
    credential: Option<Arc<Credential>>,
    /// Server: the random of the ClientHello that started the session, to tell a
    /// retransmission or late duplicate of it from a new ClientHello.
    hello_random: Option<[u8; 32]>,
    /// Client: fingerprints of the datagrams sent since the peer was last heard
    /// from, with how often each was sent again (a few; the oldest go first).
    unanswered: Unanswered,
    /// Server: added to the record sequence number of each epoch-0 record the session
    /// sends, so that its first flight starts at the record sequence number of the
    /// ClientHello whose cookie checked out, above those of the HelloVerifyRequests
    /// (see `listen`).
    epoch0_seq_shift: u64,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Role {
    Server,
    Client,
}

// Not bound by openssl-sys: declared here (OpenSSL 1.1.0+ signatures).
extern "C" {
    fn DTLSv1_listen(s: *mut openssl_sys::SSL, client: *mut libc::c_void) -> libc::c_int;
    fn BIO_ADDR_new() -> *mut libc::c_void;
    fn BIO_ADDR_free(a: *mut libc::c_void);
}

const DTLS_CTRL_GET_TIMEOUT: libc::c_int = 73;
const DTLS_CTRL_HANDLE_TIMEOUT: libc::c_int = 74;

/// An owned `BIO_ADDR` for `DTLSv1_listen` to write the (unknown) peer into.
struct BioAddr(*mut libc::c_void);

// SAFETY: the BIO_ADDR is plain memory owned by this value and used from one thread at a time.
unsafe impl Send for BioAddr {}

impl Drop for BioAddr {
    fn drop(&mut self) {
        if !self.0.is_null() {
            // SAFETY: allocated by BIO_ADDR_new, freed once.
            unsafe { BIO_ADDR_free(self.0) }
        }
    }
}

/// The peer of an SSL, for the cookie callbacks.
fn peer_index() -> Option<openssl::ex_data::Index<Ssl, SocketAddr>> {
    static INDEX: OnceLock<Option<openssl::ex_data::Index<Ssl, SocketAddr>>> = OnceLock::new();
    *INDEX.get_or_init(|| Ssl::new_ex_index().ok())
}

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
    /// Server: established sessions per source address.
    sessions_per_ip: IpCounts,
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

impl std::fmt::Debug for OpensslDtls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpensslDtls")
            .field("role", &self.role)
            .field("sessions", &self.sessions.len())
            .field("stats", &self.stats)
            .finish()
    }
}

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
        auth: &ClientCredentials,
        config: DtlsConfig,
    ) -> Result<OpensslDtls, ErrorStack> {
        match auth {
            ClientCredentials::Psk(psk) => OpensslDtls::client(psk.clone(), config),
            ClientCredentials::X509(x) => {
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
            handshakes_per_ip: IpCounts::new(AddressPrefix::default()),
            sessions_per_ip: IpCounts::new(AddressPrefix::default()),
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

    /// Drops established sessions idle for longer than `idle_timeout`, and on a server
    /// those the peer never sent a CoAP message over idle for longer than
    /// `unused_timeout`; runs at most every quarter of the shorter, so the scan stays
    /// cheap.
    fn sweep_idle(&mut self, now: Instant) {
        let idle = self.config.idle_timeout;
        let unused = match self.role {
            Role::Server => self.config.unused_timeout.min(idle),
            Role::Client => idle,
        };
        if self.next_idle_sweep.is_some_and(|at| now < at) {
            return;
        }
        let idle_peers: Vec<(SocketAddr, Duration)> = self
            .sessions
            .iter()
            .filter(|(_, s)| s.established)
            .filter_map(|(p, s)| {
                let limit = if s.used { idle } else { unused };
                (now.saturating_duration_since(s.last_seen) >= limit).then_some((*p, limit))
            })
            .collect();
        self.stats.evicted += idle_peers.len() as u64;
        for (peer, limit) in idle_peers {
            self.end_session(peer, format!("idle for {limit:?}"));
        }
        self.next_idle_sweep = (!self.sessions.is_empty()).then(|| now + unused / 4);
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
            s.pending.push(data, self.config.max_pending);
        }
        self.advance(now, peer, None);
    }

    /// The cipher suite negotiated with `peer` (OpenSSL's name), once established.
    pub fn cipher(&self, peer: SocketAddr) -> Option<&'static str> {
        let s = self.sessions.get(&peer).filter(|s| s.established)?;
        match &s.link {
            Link::Ssl(stream) => stream.ssl().current_cipher().map(|c| c.name()),
            Link::Records(records) => Some(records.cipher()),
        }
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

    /// Moves what `stream` wrote to the transmit queue, adding `epoch0_seq_shift` to
    /// the record sequence numbers of its epoch-0 records.
    fn drain(
        transmits: &mut VecDeque<Transmit>,
        peer: SocketAddr,
        stream: &mut SslStream<Channel>,
        epoch0_seq_shift: u64,
    ) {
        for mut bytes in stream.get_mut().outgoing.drain(..) {
            if epoch0_seq_shift > 0 {
                shift_epoch0_seqs(&mut bytes, epoch0_seq_shift);
            }
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
        Self::drain(&mut self.transmits, peer, listener, 0);
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
        if !self.may_admit(now, peer) {
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
            // OpenSSL 3.2 and later number the flight after DTLSv1_listen from record
            // 1 on, whatever this ClientHello's number (openssl/openssl#32063). Each
            // HelloVerifyRequest carries the number of the ClientHello it answers
            // (RFC 6347 §4.2.1): a client that sent its first ClientHello again (the
            // HelloVerifyRequest was slow or lost) got a second one numbered 1 or
            // more, dropped the ServerHello as a replay of it and waited a second for
            // the server's retransmission. Numbering the flight on from this
            // ClientHello's number (as OpenSSL 1.1 did) keeps the numbers apart: the
            // client's numbers only grow, so every HelloVerifyRequest's is lower.
            s.epoch0_seq_shift = record_seq(records).map_or(0, |seq| seq.saturating_sub(1));
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
                link: Link::Ssl(stream),
                established: false,
                started: now,
                last_seen: now,
                used: false,
                pending: Held::default(),
                retransmit_at: None,
                authenticated: false,
                credential: None,
                hello_random: None,
                unanswered: Unanswered::default(),
                epoch0_seq_shift: 0,
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
        if matches!(s.link, Link::Records(_)) {
            return records.map_or(out, |r| self.open_records(peer, r));
        }
        let Link::Ssl(stream) = &mut s.link else {
            return out;
        };
        if let Some(r) = records {
            stream.get_mut().incoming = Some(r.to_vec());
        }
        let mut failure = None;
        let mut completed = false;
        if !s.established {
            match stream.do_handshake() {
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
                        s.retransmit_at = dtls_timeout(stream.ssl()).map(|d| now + d);
                    }
                }
                Err(e) => failure = Some(describe(&e)),
            }
        }
        if completed && !self.establish(now, peer, records.unwrap_or_default()) {
            return out; // refused: the session is gone
        }
        let Some(s) = self.sessions.get_mut(&peer) else {
            return out;
        };
        let Link::Ssl(stream) = &mut s.link else {
            // ServerRecords took over (and OpenSSL's last flight went out): the
            // datagram that completed the handshake carries no data.
            return out;
        };
        if failure.is_none() && s.established && records.is_some() {
            loop {
                match stream.ssl_read(&mut self.buf) {
                    Ok(n) if n > 0 => {
                        out.push(self.buf[..n].to_vec());
                        s.unanswered.clear();
                        s.used = true;
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
        stream.get_mut().incoming = None;
        Self::drain(&mut self.transmits, peer, stream, s.epoch0_seq_shift);
        if let Some(reason) = failure {
            self.fail(peer, reason);
        }
        out
    }

    /// A datagram for a session whose records [`ServerRecords`] protects.
    fn open_records(&mut self, peer: SocketAddr, datagram: &[u8]) -> Vec<Vec<u8>> {
        let Some(s) = self.sessions.get_mut(&peer) else {
            return Vec::new();
        };
        let Link::Records(layer) = &mut s.link else {
            return Vec::new();
        };
        let opened = layer.open(datagram);
        self.stats.dropped += opened.dropped;
        if opened.flight_again {
            self.transmits
                .extend(layer.last_flight().iter().map(|bytes| Transmit {
                    peer,
                    bytes: bytes.clone(),
                }));
        }
        if !opened.data.is_empty() {
            s.used = true;
        }
        if let Some(reason) = opened.closed {
            self.fail(peer, reason);
        }
        opened.data
    }

    /// Server: hands an established session's records from OpenSSL to
    /// [`ServerRecords`] where it can, after sending what OpenSSL still had to send
    /// (its last flight, which the new layer keeps in case it must go again). The
    /// session's `SSL` is freed then.
    fn take_over(
        transmits: &mut VecDeque<Transmit>,
        peer: SocketAddr,
        s: &mut Session,
        received: &[u8],
    ) {
        let Link::Ssl(stream) = &mut s.link else {
            return;
        };
        stream.get_mut().incoming = None;
        let before = transmits.len();
        Self::drain(transmits, peer, stream, s.epoch0_seq_shift);
        let sent: Vec<Vec<u8>> = transmits.range(before..).map(|t| t.bytes.clone()).collect();
        if let Some(records) = ServerRecords::take_over(stream.ssl(), received, &sent) {
            s.link = Link::Records(Box::new(records));
        }
    }

    /// A handshake completed: the session becomes established (on a server, if the
    /// session budget has room for it, see [`DtlsConfig`]) and sends what waited for
    /// it. Returns `false` when the session was refused (and is gone).
    fn establish(&mut self, now: Instant, peer: SocketAddr, received: &[u8]) -> bool {
        let authenticated = self.role == Role::Server
            && self.sessions.get(&peer).is_some_and(|s| match &s.link {
                Link::Ssl(stream) => is_authenticated(stream.ssl()),
                Link::Records(_) => false,
            });
        if self.role == Role::Server && !self.make_room_for_session(now, peer, authenticated) {
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
        if let (true, Link::Ssl(stream)) = (authenticated, &s.link) {
            s.credential = credential_of(stream.ssl());
        }
        if self.role == Role::Server {
            self.sessions_per_ip.add(peer.ip());
            self.anonymous += usize::from(!authenticated);
        }
        self.stats.handshakes += 1;
        self.events.push_back(DtlsEvent::Connected { peer });
        if self.role == Role::Server {
            Self::take_over(&mut self.transmits, peer, s, received);
        }
        while let (Some(p), Link::Ssl(stream)) = (s.pending.pop(), &mut s.link) {
            if let Err(e) = stream.ssl_write(&p) {
                tracing::debug!(%peer, error = %e, "DTLS write failed");
            }
        }
        true
    }

    /// Server: a handshake completed but every place is held by an active session
    /// that may not be displaced: the new session is closed (close_notify) at once.
    fn refuse_established(&mut self, peer: SocketAddr) {
        self.send_close_notify(peer);
        self.stats.refused += 1;
        self.end_session(
            peer,
            "refused: the session table is full of active sessions".into(),
        );
    }

    /// Queues a close_notify alert for `peer`'s session (which the caller then ends),
    /// so that the peer learns the session is gone instead of finding out by silence.
    fn send_close_notify(&mut self, peer: SocketAddr) {
        if let Some(s) = self.sessions.get_mut(&peer) {
            Self::close_notify(&mut self.transmits, peer, s);
        }
    }

    /// Queues a close_notify alert over session `s` with `peer`.
    fn close_notify(transmits: &mut VecDeque<Transmit>, peer: SocketAddr, s: &mut Session) {
        match &mut s.link {
            Link::Ssl(stream) => {
                let _ = stream.shutdown();
                let _ = ErrorStack::get();
                stream.get_mut().incoming = None;
                Self::drain(transmits, peer, stream, s.epoch0_seq_shift);
            }
            Link::Records(layer) => {
                if let Some(bytes) = layer.close_notify() {
                    transmits.push_back(Transmit { peer, bytes });
                }
            }
        }
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

fn is_retry(e: &openssl::ssl::Error) -> bool {
    e.code() == ErrorCode::WANT_READ || e.code() == ErrorCode::WANT_WRITE
}

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

/// The largest DTLS record sequence number (48 bits).
const MAX_RECORD_SEQ: u64 = (1 << 48) - 1;

/// The record sequence number of the record a datagram starts with.
fn record_seq(records: &[u8]) -> Option<u64> {
    let bytes: [u8; 6] = records.get(5..11)?.try_into().ok()?;
    Some(bytes.iter().fold(0, |seq, b| seq << 8 | u64::from(*b)))
}

/// Adds `shift` to the record sequence number of each epoch-0 (unprotected, so not
/// covered by a MAC) record in `datagram`; a number that would pass the largest one
/// is left as it is.
fn shift_epoch0_seqs(datagram: &mut [u8], shift: u64) {
    let mut at = 0;
    while let Some(header) = datagram.get_mut(at..at + 13) {
        let len = usize::from(u16::from_be_bytes([header[11], header[12]]));
        if header[3..5] == [0, 0] {
            if let Some(seq) = record_seq(header)
                .and_then(|seq| seq.checked_add(shift))
                .filter(|seq| *seq <= MAX_RECORD_SEQ)
            {
                header[5..11].copy_from_slice(&seq.to_be_bytes()[2..]);
            }
        }
        at += 13 + len;
    }
}

/// The client random of the epoch-0 ClientHello a datagram starts with.
fn hello_random(records: &[u8]) -> Option<[u8; 32]> {
    if !is_client_hello(records) {
        return None;
    }
    // Record header (13), handshake header (12), client_version (2), then the random.
    records.get(27..59)?.try_into().ok()
}

/// Whether the peer of a completed server handshake proved a credential: a
/// pre-shared key (PSK suites), or a client certificate that verified.
fn is_authenticated(ssl: &SslRef) -> bool {
    let psk = ssl
        .current_cipher()
        .is_some_and(|c| c.name().contains("PSK"));
    let certificate = ssl.peer_certificate().is_some()
        && ssl.verify_result() == openssl::x509::X509VerifyResult::OK;
    psk || certificate
}

/// Whether a datagram starts with an epoch-0 ClientHello record.
fn is_client_hello(records: &[u8]) -> bool {
    records.len() > 13 && records[0] == 22 && records[3] == 0 && records[4] == 0 && records[13] == 1
}

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
            s.pending.push(plaintext, self.config.max_pending);
            return;
        }
        if self.role == Role::Client && s.unanswered.presumed_lost(plaintext, &self.config) {
            tracing::debug!(%peer, "DTLS session presumed lost by the server; handshaking again");
            self.end_session(
                peer,
                "a datagram retransmitted without an answer: the server may have lost the session; handshaking again".into(),
            );
            self.start_handshake(now, peer, Some(plaintext));
            return;
        }
        match &mut s.link {
            Link::Ssl(stream) => {
                if let Err(e) = stream.ssl_write(plaintext) {
                    tracing::debug!(%peer, error = %e, "DTLS write failed");
                    let _ = ErrorStack::get();
                }
                Self::drain(&mut self.transmits, peer, stream, s.epoch0_seq_shift);
            }
            Link::Records(layer) => match layer.seal(plaintext) {
                Ok(bytes) => self.transmits.push_back(Transmit { peer, bytes }),
                Err(e) => tracing::debug!(%peer, error = e, "DTLS datagram not sent"),
            },
        }
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
                self.sessions.get(*p).is_some_and(|s| {
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
            let Link::Ssl(stream) = &mut s.link else {
                continue; // established (only handshakes are due)
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
                    stream.ssl().as_ptr(),
                    DTLS_CTRL_HANDLE_TIMEOUT,
                    0,
                    std::ptr::null_mut(),
                )
            };
            Self::drain(&mut self.transmits, peer, stream, s.epoch0_seq_shift);
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
                dtls_timeout(stream.ssl()).map(|d| now + d.max(Duration::from_millis(1)));
        }
    }

    fn forget(&mut self, peer: SocketAddr) {
        self.remove_session(peer);
    }

    fn close_all(&mut self) {
        let peers: Vec<SocketAddr> = self.sessions.keys().copied().collect();
        for peer in peers {
            if let Some(s) = self.sessions.get_mut(&peer).filter(|s| s.established) {
                Self::close_notify(&mut self.transmits, peer, s);
            }
            self.end_session(peer, "closed by this end (close_notify)".into());
        }
    }

    fn credential(&self, peer: SocketAddr) -> Option<Arc<Credential>> {
        let s = self.sessions.get(&peer)?;
        s.credential.clone().filter(|_| s.established)
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

mod budget;
mod records;
#[cfg(test)]
mod tests;
