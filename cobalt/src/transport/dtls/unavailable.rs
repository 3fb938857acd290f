//! DTLS and TLS in a build without the `openssl` feature: the OpenSSL-backed types
//! exist, so that the rest of the crate is the same in every build, but cannot be
//! made — their constructors return [`Unavailable`], which says how to get them.

use super::{DtlsBackend, DtlsConfig, DtlsEvent, DtlsStats};
use crate::transport::credentials::{ClientCredentials, ClientPsk, PskStore, X509Credentials};
use cobalt_proto::endpoint::Transmit;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

/// The error of every DTLS and TLS constructor in a build without OpenSSL.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Unavailable;

impl std::fmt::Display for Unavailable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(
            "this build of cobalt has no DTLS or TLS: rebuild it with the `openssl` feature \
             (on by default; `vendored-openssl` needs no system OpenSSL)",
        )
    }
}

impl std::error::Error for Unavailable {}

impl crate::error::SetupError for Unavailable {
    fn into_error(self, _what: &'static str, scheme: cobalt_proto::uri::Scheme) -> crate::Error {
        crate::Error::Unsupported(crate::error::Unsupported::Feature {
            scheme,
            needs:
                "the `openssl` feature (on by default; `vendored-openssl` needs no system OpenSSL)",
        })
    }
}

/// DTLS through OpenSSL, which this build lacks: it cannot be constructed.
pub struct OpensslDtls(Infallible);

impl std::fmt::Debug for OpensslDtls {
    fn fmt(&self, _: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {}
    }
}

impl OpensslDtls {
    /// Always [`Unavailable`].
    pub fn server(_keys: Arc<PskStore>, _config: DtlsConfig) -> Result<OpensslDtls, Unavailable> {
        Err(Unavailable)
    }

    /// Always [`Unavailable`].
    pub fn server_with(
        _psk: Option<Arc<PskStore>>,
        _x509: Option<&X509Credentials>,
        _config: DtlsConfig,
    ) -> Result<OpensslDtls, Unavailable> {
        Err(Unavailable)
    }

    /// Always [`Unavailable`].
    pub fn client_with(
        _auth: &ClientCredentials,
        _config: DtlsConfig,
    ) -> Result<OpensslDtls, Unavailable> {
        Err(Unavailable)
    }

    /// Always [`Unavailable`].
    pub fn client(_psk: ClientPsk, _config: DtlsConfig) -> Result<OpensslDtls, Unavailable> {
        Err(Unavailable)
    }

    /// Never called: no value exists.
    pub fn connect(&mut self, _now: Instant, _peer: SocketAddr) {
        match self.0 {}
    }

    /// Never called: no value exists.
    pub fn cipher(&self, _peer: SocketAddr) -> Option<&'static str> {
        match self.0 {}
    }

    /// Never called: no value exists.
    pub fn count_ipv6_by(&mut self, _prefix: cobalt_proto::address::AddressPrefix) {
        match self.0 {}
    }
}

impl DtlsBackend for OpensslDtls {
    fn handle_datagram(&mut self, _: Instant, _: SocketAddr, _: &[u8]) -> Vec<Vec<u8>> {
        match self.0 {}
    }
    fn encrypt(&mut self, _: Instant, _: SocketAddr, _: &[u8]) {
        match self.0 {}
    }
    fn poll_transmit(&mut self) -> Option<Transmit> {
        match self.0 {}
    }
    fn poll_event(&mut self) -> Option<DtlsEvent> {
        match self.0 {}
    }
    fn poll_timeout(&self) -> Option<Instant> {
        match self.0 {}
    }
    fn handle_timeout(&mut self, _: Instant) {
        match self.0 {}
    }
    fn forget(&mut self, _: SocketAddr) {
        match self.0 {}
    }
    fn close_all(&mut self) {
        match self.0 {}
    }
    fn credential(
        &self,
        _: SocketAddr,
    ) -> Option<std::sync::Arc<crate::transport::identity::Credential>> {
        match self.0 {}
    }
    fn session_count(&self) -> usize {
        match self.0 {}
    }
    fn stats(&self) -> DtlsStats {
        match self.0 {}
    }
}
