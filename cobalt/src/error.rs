//! Errors that reach the application, each saying what happened.

use cobalt_proto::message::DecodeError;
use cobalt_proto::uri::UriError;
use std::io;
use std::time::Duration;

/// Everything that can go wrong with a request or a server.
///
/// `Debug` writes the same message as `Display`, so that a `main` returning
/// [`Result`] prints `Error: <what happened and what to try>` rather than the enum's
/// fields; match on the variants to tell the cases apart.
#[derive(thiserror::Error)]
pub enum Error {
    /// The URI could not be parsed or uses an unsupported scheme.
    #[error(transparent)]
    BadUri(#[from] UriError),
    /// The host name did not resolve.
    #[error("could not resolve host '{host}': {reason}")]
    Resolve {
        /// The host.
        host: String,
        /// Why.
        reason: String,
    },
    /// No ACK or response arrived after the retransmissions.
    #[error("no response from {peer} after {retransmissions} retransmissions (server down or unreachable?)")]
    Timeout {
        /// Who was asked.
        peer: std::net::SocketAddr,
        /// How many retransmissions were sent.
        retransmissions: u32,
    },
    /// The caller's deadline passed before a response arrived.
    #[error(
        "no response within {0:?}: is the server running and reachable? (-v shows the messages)"
    )]
    Deadline(Duration),
    /// Nothing receives at the peer's address: the network reported it (ICMP port,
    /// host or network unreachable), so the request ended at once instead of timing out.
    #[error("{peer}: {reason}")]
    Unreachable {
        /// Who was asked.
        peer: std::net::SocketAddr,
        /// What the network said, e.g. "port not open (ICMP port unreachable): ...".
        reason: String,
    },
    /// The peer rejected the request with RST.
    #[error("request rejected by {0} with RST (it could not process the message)")]
    Reset(std::net::SocketAddr),
    /// A block-wise transfer could not be completed.
    #[error("block-wise transfer failed: {0}")]
    BlockTransfer(String),
    /// Too many requests are outstanding in this client.
    #[error("too many outstanding requests in this client; wait for some to finish")]
    TooManyRequests,
    /// A received message could not be decoded.
    #[error("malformed message: {0}")]
    Malformed(#[from] DecodeError),
    /// The transport is not available in this build or for this call.
    #[error("{0}")]
    Unsupported(String),
    /// A `coap+tcp` connection could not be used: it closed (Release, Abort, the peer
    /// went away) with the request outstanding, or the message exceeds the peer's
    /// Max-Message-Size.
    #[error("{0}")]
    Connection(String),
    /// The DTLS handshake for a `coaps://` request failed.
    #[error("DTLS handshake with {peer} failed: {reason}")]
    Dtls {
        /// The server.
        peer: std::net::SocketAddr,
        /// Why (OpenSSL's reason, with a hint).
        reason: String,
    },
    /// The TLS handshake for a `coaps+tcp://` or `coaps+ws://` request failed.
    #[error("TLS handshake with {peer} failed: {reason}")]
    Tls {
        /// The server.
        peer: std::net::SocketAddr,
        /// Why (OpenSSL's reason, with a hint).
        reason: String,
    },
    /// An observation fell silent and registering again did not bring a notification
    /// back ([`Observation::max_reregistrations`](crate::Observation::max_reregistrations)).
    #[error("no notification from {peer} after registering again {attempts} times: the server went away or no longer serves the resource")]
    ObservationLost {
        /// The server.
        peer: std::net::SocketAddr,
        /// Re-registrations tried.
        attempts: u32,
    },
    /// The endpoint shut down while the request was outstanding.
    #[error("the endpoint was shut down")]
    Shutdown,
    /// An invalid configuration value.
    #[error(transparent)]
    Config(#[from] cobalt_proto::endpoint::ConfigError),
    /// A socket error.
    #[error("I/O error: {0}")]
    Io(#[from] io::Error),
}

impl std::fmt::Debug for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(self, f)
    }
}

/// Result with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
