//! Errors that reach the application, each saying what happened.

use cobalt_proto::message::DecodeError;
use cobalt_proto::uri::{Scheme, UriError};
use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
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
    BlockTransfer(BlockError),
    /// Too many requests are outstanding in this client.
    #[error("too many outstanding requests in this client; wait for some to finish")]
    TooManyRequests,
    /// A received message could not be decoded.
    #[error("malformed message: {0}")]
    Malformed(#[from] DecodeError),
    /// What was asked is not available: in this build, for this scheme, or with these
    /// arguments.
    #[error("{0}")]
    Unsupported(Unsupported),
    /// A `coap+tcp`, `coaps+tcp`, `coap+ws` or `coaps+ws` connection could not be used.
    #[error("{0}")]
    Connection(ConnectionError),
    /// The DTLS handshake for a `coaps://` request failed.
    #[error("DTLS handshake with {peer} failed: {reason}")]
    Dtls {
        /// The server.
        peer: SocketAddr,
        /// What kind of failure, as far as OpenSSL's reason tells.
        kind: HandshakeFailure,
        /// Why (OpenSSL's reason, with a hint).
        reason: String,
    },
    /// The TLS handshake for a `coaps+tcp://` or `coaps+ws://` request failed.
    #[error("TLS handshake with {peer} failed: {reason}")]
    Tls {
        /// The server.
        peer: SocketAddr,
        /// What kind of failure, as far as OpenSSL's reason tells.
        kind: HandshakeFailure,
        /// Why (OpenSSL's reason, with a hint).
        reason: String,
    },
    /// Keys or certificates could not be read or used.
    #[error("{0}")]
    Credentials(#[from] CredentialsError),
    /// An observation fell silent and registering again did not bring a notification
    /// back ([`Observation::max_reregistrations`](crate::Observation::max_reregistrations)).
    #[error("no notification from {peer} after registering again {attempts} times: the server went away or no longer serves the resource")]
    ObservationLost {
        /// The server.
        peer: std::net::SocketAddr,
        /// Re-registrations tried.
        attempts: u32,
    },
    /// A response or notification carries a critical option this client does not
    /// recognize (unknown, malformed or repeated), so it was rejected (RFC 7252
    /// §5.4.1). A client layer that handles the option declares it in
    /// [`Layer::options`](crate::server::Layer::options).
    #[error("the answer from {peer} carries critical option {number}, which this client does not recognize; a client layer that handles it must declare it in Layer::options")]
    BadResponseOption {
        /// The server.
        peer: SocketAddr,
        /// The option's number.
        number: u16,
    },
    /// A client layer refused the request before it went out, or a response or
    /// notification to it ([`Layer::on_send`](crate::server::Layer::on_send),
    /// [`Layer::on_receive`](crate::server::Layer::on_receive)).
    #[error("refused by the client layer {layer}: {reason}")]
    LayerRefused {
        /// The layer's [`name`](crate::server::Layer::name).
        layer: &'static str,
        /// Why, in the layer's words.
        reason: String,
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

/// Why a block-wise transfer (RFC 7959) failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BlockError {
    /// The body needs more blocks than a block number can count.
    TooManyBlocks,
    /// An upload's block was acknowledged with another block number.
    WrongAcknowledgement {
        /// The block sent.
        sent: u32,
        /// The block the server acknowledged.
        acknowledged: u32,
    },
    /// The representation is larger than the client reassembles.
    TooLarge {
        /// The limit in bytes.
        limit: usize,
    },
    /// The server answered a block request with an error.
    Refused {
        /// Its answer.
        code: cobalt_proto::message::Code,
        /// The block asked for.
        block: u32,
    },
    /// The representation changed during the transfer (its ETag differs).
    Changed,
    /// A response that should be one block of a transfer carries no Block2 option.
    MissingBlock2,
    /// A block does not fit the body received so far (size, offset, BERT).
    Invalid {
        /// The block's number.
        block: u32,
        /// What is wrong with it.
        error: cobalt_proto::blockwise::BlockError,
    },
    /// A Q-Block2 block (RFC 9177) does not fit the others (size, final block) or the
    /// body grows past the limit.
    QBlock(cobalt_proto::blockwise::qblock::QBlockError),
    /// A Q-Block2 download (RFC 9177) ended with blocks missing: asked for again
    /// `rounds` times (MAX_RETRANSMIT) without a new block arriving.
    Incomplete {
        /// Blocks still missing (at least 1).
        missing: usize,
        /// Rounds of asking for them.
        rounds: u32,
    },
    /// A Q-Block1 upload (RFC 9177) ended without the server's answer: blocks were
    /// sent again `rounds` times (MAX_RETRANSMIT) without the server taking a new
    /// set.
    UploadIncomplete {
        /// Blocks the server still lacked when it last said so (at least 1).
        missing: usize,
        /// Rounds of sending them again.
        rounds: u32,
    },
}

impl fmt::Display for BlockError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BlockError::TooManyBlocks => write!(f, "the body needs too many blocks"),
            BlockError::WrongAcknowledgement { sent, acknowledged } => write!(
                f,
                "the server acknowledged block {acknowledged} while block {sent} was sent"
            ),
            BlockError::TooLarge { limit } => write!(f, "representation larger than {limit} bytes"),
            BlockError::Refused { code, block } => {
                write!(f, "server answered {code} to block {block}")
            }
            BlockError::Changed => write!(
                f,
                "the representation changed during the transfer (ETag differs)"
            ),
            BlockError::MissingBlock2 => write!(f, "a block response lacks Block2"),
            BlockError::Invalid { block, error } => write!(f, "block {block}: {error}"),
            BlockError::QBlock(e) => write!(f, "{e}"),
            BlockError::Incomplete { missing, rounds } => write!(
                f,
                "Q-Block2 body incomplete: {missing} block(s) still missing after asking {rounds} times (a lossy path: retry, or ask without Q-Block)"
            ),
            BlockError::UploadIncomplete { missing, rounds } => write!(
                f,
                "Q-Block1 upload incomplete: the server still lacks {missing} block(s) after sending them again {rounds} times (a lossy path: retry, or upload without Q-Block)"
            ),
        }
    }
}

/// What a connection-oriented transport reported.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectionError {
    /// The scheme of the connection (`coap+tcp`, `coaps+ws`, ...).
    pub scheme: Scheme,
    /// The server.
    pub peer: SocketAddr,
    /// What happened.
    pub kind: ConnectionErrorKind,
}

/// What happened to a connection; see [`ConnectionError`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConnectionErrorKind {
    /// It closed before the request (or observation) could be handed to it, twice.
    ClosedBeforeSend,
    /// It closed with the request outstanding (Release, Abort, the peer went away, a
    /// timeout): the reason in words, and whether the server's CSM had arrived.
    Closed {
        /// Why, in words.
        reason: String,
        /// The server's CSM never came (over plain TCP, what a TLS port does).
        before_csm: bool,
    },
    /// The message could not be sent on it (e.g. larger than the peer's
    /// Max-Message-Size), in words.
    Refused(String),
}

impl fmt::Display for ConnectionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (scheme, peer) = (self.scheme.as_str(), self.peer);
        match &self.kind {
            ConnectionErrorKind::ClosedBeforeSend => write!(
                f,
                "{scheme} connection to {peer} closed before the request could be sent"
            ),
            ConnectionErrorKind::Closed { reason, before_csm } => {
                let hint = if *before_csm && self.scheme == Scheme::CoapTcp {
                    " before sending its CSM (is it a TLS port? then use coaps+tcp://)"
                } else {
                    ""
                };
                write!(f, "{scheme} connection to {peer} closed: {reason}{hint}")
            }
            ConnectionErrorKind::Refused(what) => {
                write!(f, "{scheme} connection to {peer}: {what}")
            }
        }
    }
}

/// Why a DTLS or TLS handshake failed, as far as OpenSSL's reason tells.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum HandshakeFailure {
    /// The server does not know the PSK identity.
    UnknownIdentity,
    /// The pre-shared keys differ.
    KeysDiffer,
    /// The certificate does not chain to a trusted CA, names another host, or expired.
    UntrustedCertificate,
    /// The server requires a client certificate and got none.
    ClientCertificateRequired,
    /// The server refused a new session (its table is full).
    SessionRefused,
    /// No cipher suite or credentials in common.
    NoSharedCipher,
    /// The peer does not speak TLS at all on that port.
    NotTls,
    /// Anything else (the reason says what).
    Other,
}

impl HandshakeFailure {
    /// The kind of failure OpenSSL's `reason` text describes.
    pub fn from_reason(reason: &str) -> HandshakeFailure {
        let r = reason;
        if r.contains("unknown psk identity") {
            HandshakeFailure::UnknownIdentity
        } else if r.contains("decrypt error") || r.contains("bad record mac") {
            HandshakeFailure::KeysDiffer
        } else if r.contains("certificate verify failed")
            || r.contains("unknown ca")
            || r.contains("certificate has expired")
        {
            HandshakeFailure::UntrustedCertificate
        } else if r.contains("peer did not return a certificate") {
            HandshakeFailure::ClientCertificateRequired
        } else if r.contains("internal error") {
            HandshakeFailure::SessionRefused
        } else if r.contains("no shared cipher") || r.contains("handshake failure") {
            HandshakeFailure::NoSharedCipher
        } else if r.contains("wrong version number") || r.contains("packet length too long") {
            HandshakeFailure::NotTls
        } else {
            HandshakeFailure::Other
        }
    }

    /// What a person should check, in words (empty for [`HandshakeFailure::Other`]).
    pub fn hint(self) -> &'static str {
        match self {
            HandshakeFailure::UnknownIdentity => "the server does not know this PSK identity",
            HandshakeFailure::KeysDiffer => "the keys differ: wrong PSK?",
            HandshakeFailure::UntrustedCertificate => {
                "the certificate does not chain to a trusted CA, or names another host"
            }
            HandshakeFailure::ClientCertificateRequired => {
                "this server requires a client certificate"
            }
            HandshakeFailure::SessionRefused => {
                "the server refused a new session: it may hold as many as it keeps"
            }
            HandshakeFailure::NoSharedCipher => "no common cipher suite or credentials",
            HandshakeFailure::NotTls => {
                "the server does not speak TLS on this port: use coap+tcp:// or coap+ws:// there"
            }
            HandshakeFailure::Other => "",
        }
    }
}

/// What is not available; see [`Error::Unsupported`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unsupported {
    /// The scheme needs a cargo feature this build lacks (`coaps://` and the TLS
    /// schemes need `vendored-openssl` or `openssl`).
    Feature {
        /// The scheme asked for.
        scheme: Scheme,
        /// What to build with, e.g. "the `openssl` feature".
        needs: &'static str,
    },
    /// A secure scheme was asked for without keys or certificates.
    NoCredentials {
        /// The scheme.
        scheme: Scheme,
        /// Where to give them, in words (flags or library calls).
        how: &'static str,
    },
    /// The call does not work with this scheme (e.g. a datagram call with `coap+tcp`).
    Scheme {
        /// The scheme.
        scheme: Scheme,
        /// What was asked, in words.
        what: &'static str,
    },
    /// An argument out of its range, in words (e.g. a block size of 100).
    Argument(String),
}

impl fmt::Display for Unsupported {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Unsupported::Feature { scheme, needs } => write!(
                f,
                "{}:// is not available in this build: build with {needs}",
                scheme.as_str()
            ),
            Unsupported::NoCredentials { scheme, how } => write!(
                f,
                "{}:// needs a pre-shared key or certificates: {how}",
                scheme.as_str()
            ),
            Unsupported::Scheme { scheme, what } => {
                write!(f, "{}:// {what}", scheme.as_str())
            }
            Unsupported::Argument(what) => write!(f, "{what}"),
        }
    }
}

/// Keys or certificates that could not be read or used.
#[derive(Debug)]
pub enum CredentialsError {
    /// The file could not be read.
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// A line of a PSK key file is malformed.
    PskLine {
        /// The file, when read from one.
        path: Option<PathBuf>,
        /// The line number, from 1.
        line: usize,
        /// What is wrong with it.
        reason: String,
    },
    /// OpenSSL refused the keys or certificates (e.g. a key that does not match its
    /// certificate): the DTLS or TLS context could not be set up.
    Rejected {
        /// `"DTLS"` or `"TLS"`.
        what: &'static str,
        /// OpenSSL's reason.
        reason: String,
    },
}

impl fmt::Display for CredentialsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CredentialsError::Read { path, source } => {
                write!(f, "cannot read {}: {source}", path.display())
            }
            CredentialsError::PskLine { path, line, reason } => match path {
                Some(p) => write!(f, "PSK file {}: line {line}: {reason}", p.display()),
                None => write!(f, "line {line}: {reason}"),
            },
            CredentialsError::Rejected { what, reason } => {
                write!(f, "cannot set up {what}: {reason}")
            }
        }
    }
}

impl std::error::Error for CredentialsError {}

/// What setting up a DTLS or TLS context can fail with: OpenSSL refusing the
/// credentials, or (in a build without OpenSSL) the feature being absent.
pub(crate) trait SetupError: fmt::Display {
    /// The [`Error`] for a `what` (`"DTLS"` or `"TLS"`) context for `scheme`.
    fn into_error(self, what: &'static str, scheme: Scheme) -> Error;
}

#[cfg(feature = "openssl")]
impl SetupError for openssl::error::ErrorStack {
    fn into_error(self, what: &'static str, _scheme: Scheme) -> Error {
        Error::Credentials(CredentialsError::Rejected {
            what,
            reason: self.to_string(),
        })
    }
}
