//! TLS under CoAP over TCP and WebSockets (RFC 8323 §8.2: `coaps+tcp://`,
//! `coaps+ws://`), through OpenSSL (`tokio-openssl`), with the credentials DTLS uses:
//! certificates ([`X509Credentials`]) and pre-shared keys ([`PskStore`] on the server,
//! [`ClientPsk`] on the client).
//!
//! * TLS 1.2 and 1.3. Pre-shared keys work with both (TLS 1.2 PSK suites; in TLS 1.3
//!   OpenSSL turns the same key into an external PSK for `TLS_AES_128_GCM_SHA256`).
//! * ALPN: `coaps+tcp` offers and selects `coap` (RFC 8323 §8.2); `coaps+ws` offers
//!   `http/1.1`. A client that offers no ALPN, or other protocols only, is still served.
//! * A server with a CA requires a client certificate that chains to it; a client
//!   checks the server's certificate against its CA and the URI's host (or IP
//!   address). A client without credentials trusts the system's CA store, like curl.
//!   A PSK client never accepts a certificate it cannot verify instead of the key.
//! * The server's handshake must finish within
//!   [`TcpServerLimits::handshake_timeout`](super::limits::TcpServerLimits::handshake_timeout);
//!   failures and timeouts are counted in the listener's metrics.

#[cfg(feature = "openssl")]
use super::credentials::{
    expect_peer_name, load_x509, set_psk_client, set_psk_server, ClientCredentials, ClientPsk,
    PskStore, X509Credentials,
};
#[cfg(feature = "openssl")]
use super::dtls::describe;
use cobalt_proto::tcp_connection::Framing;
#[cfg(feature = "openssl")]
use openssl::{
    error::ErrorStack,
    ssl::{
        select_next_proto, AlpnError, Ssl, SslContext, SslContextBuilder, SslMethod, SslMode,
        SslOptions, SslVerifyMode, SslVersion,
    },
};
use std::io;
use std::net::SocketAddr;
#[cfg(feature = "openssl")]
use std::{pin::Pin, sync::Arc};
#[cfg(feature = "openssl")]
use tokio::io::{AsyncRead, AsyncWrite};
#[cfg(feature = "openssl")]
use tokio_openssl::SslStream;

/// A TLS stream over `S` (a TCP stream), as [`TlsAcceptor::accept`] and
/// [`TlsConnector::connect`] return it.
#[cfg(feature = "openssl")]
pub type TlsStream<S> = SslStream<S>;

#[cfg(not(feature = "openssl"))]
mod unavailable;
#[cfg(not(feature = "openssl"))]
pub(crate) use unavailable::peer_credential;
#[cfg(not(feature = "openssl"))]
pub use unavailable::{TlsAcceptor, TlsConnector, TlsStream};

/// Cipher suites for TLS 1.2: ECDHE with AES-GCM or ChaCha20 for certificates, and the
/// PSK suites of RFC 7925/8323 peers (plain and ECDHE). TLS 1.3 uses OpenSSL's defaults.
pub const TLS12_CIPHERS: &str = "ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-ECDSA-AES256-GCM-SHA384:\
ECDHE-RSA-AES128-GCM-SHA256:ECDHE-RSA-AES256-GCM-SHA384:ECDHE-ECDSA-CHACHA20-POLY1305:\
ECDHE-RSA-CHACHA20-POLY1305:ECDHE-ECDSA-AES128-CCM8:ECDHE-ECDSA-AES128-CCM:\
ECDHE-PSK-AES128-CBC-SHA256:PSK-AES128-GCM-SHA256:PSK-AES256-GCM-SHA384:PSK-AES128-CCM8:\
PSK-AES128-CCM:PSK-CHACHA20-POLY1305";

/// The application protocol a TLS connection carries, offered and selected by ALPN.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Alpn {
    /// `coap` (RFC 8323 §8.2): CoAP over TLS.
    Coap,
    /// `http/1.1`: the HTTP upgrade of CoAP over secure WebSockets.
    Http11,
}

impl Alpn {
    /// The protocol under `framing`: `coap` for `coaps+tcp`, `http/1.1` (the upgrade)
    /// for `coaps+ws`.
    pub fn for_framing(framing: Framing) -> Alpn {
        match framing {
            Framing::Stream => Alpn::Coap,
            Framing::WebSocket => Alpn::Http11,
        }
    }

    /// The protocol list in ALPN wire format.
    #[cfg(feature = "openssl")]
    fn wire(self) -> &'static [u8] {
        match self {
            Alpn::Coap => b"\x04coap",
            Alpn::Http11 => b"\x08http/1.1",
        }
    }
}

#[cfg(feature = "openssl")]
fn base_context(method: SslMethod) -> Result<SslContextBuilder, ErrorStack> {
    let mut b = SslContext::builder(method)?;
    b.set_min_proto_version(Some(SslVersion::TLS1_2))?;
    b.set_cipher_list(TLS12_CIPHERS)?;
    b.set_options(SslOptions::NO_COMPRESSION | SslOptions::NO_RENEGOTIATION);
    b.set_mode(SslMode::RELEASE_BUFFERS);
    // One read takes every record the kernel has, instead of a header and then a body.
    b.set_read_ahead(true);
    Ok(b)
}

#[cfg(feature = "openssl")]
/// The server's TLS context. Cheap to clone.
#[derive(Clone)]
pub struct TlsAcceptor {
    ctx: SslContext,
}

#[cfg(feature = "openssl")]
impl std::fmt::Debug for TlsAcceptor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TlsAcceptor")
    }
}

#[cfg(feature = "openssl")]
impl TlsAcceptor {
    /// A server context with a certificate, pre-shared keys, or both. With
    /// `x509.ca_pem`, clients must present a certificate that chains to it.
    pub fn new(
        x509: Option<&X509Credentials>,
        keys: Option<Arc<PskStore>>,
        alpn: Alpn,
    ) -> Result<TlsAcceptor, ErrorStack> {
        let mut b = base_context(SslMethod::tls_server())?;
        if let Some(x) = x509 {
            load_x509(&mut b, x)?;
            if x.ca_pem.is_some() {
                b.set_verify(SslVerifyMode::PEER | SslVerifyMode::FAIL_IF_NO_PEER_CERT);
            }
        }
        if let Some(keys) = keys {
            set_psk_server(&mut b, keys);
        }
        b.set_alpn_select_callback(move |_ssl, offered| {
            select_next_proto(alpn.wire(), offered).ok_or(AlpnError::NOACK)
        });
        // Each connection is one long session: no tickets to keep or rotate.
        b.set_options(SslOptions::NO_TICKET);
        b.set_num_tickets(0)?;
        Ok(TlsAcceptor { ctx: b.build() })
    }

    /// Runs the server side of the handshake on an accepted stream.
    pub async fn accept<S>(&self, stream: S) -> io::Result<SslStream<S>>
    where
        S: AsyncRead + AsyncWrite + Unpin,
    {
        let ssl = Ssl::new(&self.ctx).map_err(io::Error::other)?;
        let mut tls = SslStream::new(ssl, stream).map_err(io::Error::other)?;
        Pin::new(&mut tls)
            .accept()
            .await
            .map_err(|e| io::Error::other(describe(&e)))?;
        Ok(tls)
    }
}

#[cfg(feature = "openssl")]
/// The client's TLS context for one set of credentials. Cheap to clone.
#[derive(Clone)]
pub struct TlsConnector {
    ctx: SslContext,
    /// Check the server's certificate against the host or address (not for PSK).
    verify_name: bool,
    /// The name to expect instead of the URI's host.
    server_name: Option<String>,
}

#[cfg(feature = "openssl")]
impl std::fmt::Debug for TlsConnector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsConnector")
            .field("verify_name", &self.verify_name)
            .field("server_name", &self.server_name)
            .finish()
    }
}

#[cfg(feature = "openssl")]
impl TlsConnector {
    /// A client context: with `auth` a pre-shared key or certificates (a CA to verify
    /// the server with, and optionally a client certificate); without it, the server's
    /// certificate is verified against the system's trusted CAs.
    pub fn new(auth: Option<&ClientCredentials>, alpn: Alpn) -> Result<TlsConnector, ErrorStack> {
        let mut b = base_context(SslMethod::tls_client())?;
        b.set_alpn_protos(alpn.wire())?;
        let mut server_name = None;
        let verify_name = match auth {
            Some(ClientCredentials::Psk(psk)) => {
                set_psk_client(&mut b, ClientPsk::clone(psk));
                // An empty trust store: a server that answers with a certificate
                // instead of using the key fails verification.
                b.set_verify_cert_store(openssl::x509::store::X509StoreBuilder::new()?.build())?;
                false
            }
            Some(ClientCredentials::X509(x)) => {
                server_name.clone_from(&x.server_name);
                load_x509(&mut b, x)?;
                if x.ca_pem.is_none() {
                    b.set_default_verify_paths()?;
                }
                true
            }
            None => {
                b.set_default_verify_paths()?;
                true
            }
        };
        b.set_verify(SslVerifyMode::PEER);
        Ok(TlsConnector {
            ctx: b.build(),
            verify_name,
            server_name,
        })
    }

    /// Runs the client side of the handshake on a connected stream; the server's
    /// certificate must name `host` (a host name, also sent as SNI, or an IP address),
    /// or the credentials' `server_name` when they have one.
    pub async fn connect<S>(
        &self,
        stream: S,
        host: &str,
        peer: SocketAddr,
    ) -> io::Result<SslStream<S>>
    where
        S: AsyncRead + AsyncWrite + Unpin,
    {
        let mut ssl = Ssl::new(&self.ctx).map_err(io::Error::other)?;
        if self.verify_name {
            let name = self
                .server_name
                .as_deref()
                .unwrap_or(host)
                .trim_start_matches('[')
                .trim_end_matches(']');
            expect_peer_name(&mut ssl, Some(name), peer).map_err(io::Error::other)?;
        }
        let mut tls = SslStream::new(ssl, stream).map_err(io::Error::other)?;
        if let Err(e) = Pin::new(&mut tls).connect().await {
            let mut reason = describe(&e);
            // Which check failed (expired, self-signed, wrong host, ...).
            let verify = tls.ssl().verify_result();
            if verify != openssl::x509::X509VerifyResult::OK {
                reason = format!("{reason}; {}", verify.error_string());
            }
            return Err(io::Error::new(
                io::ErrorKind::ConnectionRefused,
                HandshakeError { peer, reason },
            ));
        }
        Ok(tls)
    }
}

/// A failed client handshake, carried inside an `io::Error` until it becomes
/// [`crate::Error::Tls`].
#[derive(Debug)]
pub(crate) struct HandshakeError {
    peer: SocketAddr,
    reason: String,
}

impl std::fmt::Display for HandshakeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "TLS handshake with {} failed: {}",
            self.peer, self.reason
        )
    }
}

impl std::error::Error for HandshakeError {}

impl HandshakeError {
    /// The error to report for a failed connection attempt: [`crate::Error::Tls`] for a
    /// failed handshake, [`crate::Error::Io`] otherwise.
    pub(crate) fn classify(e: &io::Error) -> crate::Error {
        match e.get_ref().and_then(|x| x.downcast_ref::<HandshakeError>()) {
            Some(h) => crate::Error::Tls {
                peer: h.peer,
                kind: crate::error::HandshakeFailure::from_reason(&h.reason),
                reason: h.reason.clone(),
            },
            None => crate::Error::Io(io::Error::new(e.kind(), e.to_string())),
        }
    }
}

#[cfg(feature = "openssl")]
/// The cipher suite and ALPN protocol a connection agreed on, for logs and tests.
pub fn negotiated<S>(stream: &SslStream<S>) -> (Option<&'static str>, Option<Vec<u8>>) {
    let ssl = stream.ssl();
    (
        ssl.current_cipher().map(|c| c.name()),
        ssl.selected_alpn_protocol().map(<[u8]>::to_vec),
    )
}

/// What the client of an accepted connection proved in its handshake: its PSK identity
/// or the subject of its verified certificate (taken once per connection).
#[cfg(feature = "openssl")]
pub(crate) fn peer_credential<S>(
    stream: &SslStream<S>,
) -> Option<Arc<super::identity::Credential>> {
    super::identity::credential_of(stream.ssl())
}
