//! TLS in a build without the `openssl` feature: the types exist, so that the rest of
//! the crate is the same in every build, but cannot be made — their constructors return
//! [`Unavailable`].

use super::Alpn;
use crate::transport::credentials::{ClientCredentials, PskStore, X509Credentials};
use crate::transport::dtls::Unavailable;
use std::convert::Infallible;
use std::io;
use std::marker::PhantomData;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// The server's TLS context, which this build cannot make.
#[derive(Clone)]
pub struct TlsAcceptor(Infallible);

impl std::fmt::Debug for TlsAcceptor {
    fn fmt(&self, _: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {}
    }
}

impl TlsAcceptor {
    /// Always [`Unavailable`].
    pub fn new(
        _x509: Option<&X509Credentials>,
        _keys: Option<Arc<PskStore>>,
        _alpn: Alpn,
    ) -> Result<TlsAcceptor, Unavailable> {
        Err(Unavailable)
    }

    /// Never called: no value exists.
    pub async fn accept<S>(&self, _stream: S) -> io::Result<TlsStream<S>> {
        match self.0 {}
    }
}

/// The client's TLS context, which this build cannot make.
#[derive(Clone)]
pub struct TlsConnector(Infallible);

impl std::fmt::Debug for TlsConnector {
    fn fmt(&self, _: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {}
    }
}

impl TlsConnector {
    /// Always [`Unavailable`].
    pub fn new(
        _auth: Option<&ClientCredentials>,
        _alpn: Alpn,
    ) -> Result<TlsConnector, Unavailable> {
        Err(Unavailable)
    }

    /// Never called: no value exists.
    pub async fn connect<S>(
        &self,
        _stream: S,
        _host: &str,
        _peer: SocketAddr,
    ) -> io::Result<TlsStream<S>> {
        match self.0 {}
    }
}

/// A TLS stream, which this build cannot make.
pub struct TlsStream<S>(Infallible, PhantomData<S>);

impl<S> AsyncRead for TlsStream<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
        _: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.0 {}
    }
}

impl<S> AsyncWrite for TlsStream<S> {
    fn poll_write(self: Pin<&mut Self>, _: &mut Context<'_>, _: &[u8]) -> Poll<io::Result<usize>> {
        match self.0 {}
    }
    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.0 {}
    }
    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.0 {}
    }
}

/// Without OpenSSL there is no TLS stream, so no credential.
pub(crate) fn peer_credential<S>(
    stream: &TlsStream<S>,
) -> Option<std::sync::Arc<crate::transport::identity::Credential>> {
    match stream.0 {}
}
