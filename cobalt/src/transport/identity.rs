//! Who is at the other end of a request: the transport, the address and, over DTLS and
//! TLS, the credential the peer proved in its handshake. The credential is taken from
//! the session once, when its handshake completes, and shared by every request over
//! the session ([`Arc`]); plain CoAP carries none.

use cobalt_proto::uri::Scheme;
use std::net::SocketAddr;
use std::sync::Arc;

/// What a peer proved in its DTLS or TLS handshake.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Credential {
    /// A pre-shared key, under this identity (the key itself is never kept here).
    PskIdentity(Vec<u8>),
    /// A client certificate that verified against the server's CA; its subject's
    /// distinguished name as `CN=...,O=...` (the certificate's order).
    Certificate {
        /// The subject, one `type=value` per entry, joined by commas.
        subject: String,
    },
}

/// The peer of a request or an observation: transport, address and credential.
/// [`Request::identity`](crate::server::Request::identity) returns it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerIdentity {
    scheme: Scheme,
    addr: SocketAddr,
    credential: Option<Arc<Credential>>,
}

impl PeerIdentity {
    /// The identity of `addr` over `scheme`, having proved `credential` (none over
    /// `coap`, `coap+tcp`, `coap+ws`, and over a certificate handshake whose client
    /// sent no certificate).
    pub fn new(scheme: Scheme, addr: SocketAddr, credential: Option<Arc<Credential>>) -> Self {
        PeerIdentity {
            scheme,
            addr,
            credential,
        }
    }

    /// The transport the peer spoke over.
    pub fn scheme(&self) -> Scheme {
        self.scheme
    }

    /// The peer's address (the TCP or UDP source address).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The credential the peer proved, if any.
    pub fn credential(&self) -> Option<&Credential> {
        self.credential.as_deref()
    }

    /// Whether the peer proved a credential (a pre-shared key or a verified client
    /// certificate).
    pub fn is_authenticated(&self) -> bool {
        self.credential.is_some()
    }

    /// The PSK identity the peer's key was found under, if it used a pre-shared key.
    pub fn psk_identity(&self) -> Option<&[u8]> {
        match self.credential.as_deref() {
            Some(Credential::PskIdentity(id)) => Some(id),
            _ => None,
        }
    }

    /// The subject of the peer's verified client certificate, if it sent one.
    pub fn certificate_subject(&self) -> Option<&str> {
        match self.credential.as_deref() {
            Some(Credential::Certificate { subject }) => Some(subject),
            _ => None,
        }
    }
}

/// The credential the peer of a completed handshake proved: its PSK identity when a
/// pre-shared key suite (or a TLS 1.3 external PSK) was used, else the subject of a
/// client certificate that verified.
#[cfg(feature = "openssl")]
pub(crate) fn credential_of(ssl: &openssl::ssl::SslRef) -> Option<Arc<Credential>> {
    let remembered = psk_identity_index().and_then(|i| ssl.ex_data(i));
    if let Some(id) = remembered.map(Vec::as_slice).or_else(|| ssl.psk_identity()) {
        return Some(Arc::new(Credential::PskIdentity(id.to_vec())));
    }
    let cert = ssl.peer_certificate()?;
    if ssl.verify_result() != openssl::x509::X509VerifyResult::OK {
        return None;
    }
    Some(Arc::new(Credential::Certificate {
        subject: subject_of(cert.subject_name()),
    }))
}

/// Where the server's PSK callback leaves the identity whose key it gave: OpenSSL
/// keeps it for (D)TLS 1.2 PSK suites but not for TLS 1.3 external PSKs.
#[cfg(feature = "openssl")]
fn psk_identity_index() -> Option<openssl::ex_data::Index<openssl::ssl::Ssl, Vec<u8>>> {
    static INDEX: std::sync::OnceLock<Option<openssl::ex_data::Index<openssl::ssl::Ssl, Vec<u8>>>> =
        std::sync::OnceLock::new();
    *INDEX.get_or_init(|| openssl::ssl::Ssl::new_ex_index().ok())
}

/// Remembers `identity` as the PSK identity of the handshake on `ssl` (called by the
/// server's PSK callback when it found the identity's key).
#[cfg(feature = "openssl")]
pub(crate) fn remember_psk_identity(ssl: &mut openssl::ssl::SslRef, identity: &[u8]) {
    if let Some(index) = psk_identity_index() {
        ssl.set_ex_data(index, identity.to_vec());
    }
}

/// A distinguished name as `CN=a,O=b` in the certificate's order; values that are not
/// UTF-8 are written with their bytes in hex.
#[cfg(feature = "openssl")]
fn subject_of(name: &openssl::x509::X509NameRef) -> String {
    let mut out = String::new();
    for entry in name.entries() {
        if !out.is_empty() {
            out.push(',');
        }
        let field = entry.object().nid().short_name().unwrap_or("?");
        out.push_str(field);
        out.push('=');
        match entry.data().to_string() {
            Ok(v) => out.push_str(&v),
            Err(_) => {
                for b in entry.data().as_slice() {
                    out.push_str(&format!("{b:02x}"));
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accessors_tell_psk_from_certificate() {
        let addr: SocketAddr = "192.0.2.1:5684".parse().unwrap();
        let psk = PeerIdentity::new(
            Scheme::Coaps,
            addr,
            Some(Arc::new(Credential::PskIdentity(b"dev-1".to_vec()))),
        );
        assert_eq!(psk.psk_identity(), Some(&b"dev-1"[..]));
        assert_eq!(psk.certificate_subject(), None);
        assert!(psk.is_authenticated());
        let cert = PeerIdentity::new(
            Scheme::CoapsTcp,
            addr,
            Some(Arc::new(Credential::Certificate {
                subject: "CN=client".into(),
            })),
        );
        assert_eq!(cert.certificate_subject(), Some("CN=client"));
        assert_eq!(cert.psk_identity(), None);
        let plain = PeerIdentity::new(Scheme::Coap, addr, None);
        assert!(!plain.is_authenticated());
        assert_eq!(plain.scheme(), Scheme::Coap);
        assert_eq!(plain.addr(), addr);
    }
}
