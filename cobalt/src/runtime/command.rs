//! What the application asks of a transport ([`Command`]) — a shard's driver (UDP,
//! DTLS) or a client's connection task (TCP, TLS, WebSockets) alike — and where the
//! answers to its requests go ([`ReplyTo`]).

use crate::runtime::notifications;
use crate::{Error, Result};
use cobalt_proto::message::Message;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::sync::oneshot;

/// Where the result of a client request goes.
#[derive(Debug)]
pub(crate) enum ReplyTo {
    /// A single response.
    Once(oneshot::Sender<Result<Message>>),
    /// Every response (observe notifications) until cancelled. Bounded: when the
    /// observer does not keep up, newer notifications are dropped (an observer only
    /// needs the latest state eventually, RFC 7641 §1.3), so memory stays bounded.
    Stream(notifications::Sender<Result<Message>>),
}

impl ReplyTo {
    /// Hands `result` over: the one response, or one more item of the stream (dropped
    /// when the stream is full or closed).
    pub(crate) fn send(self, result: Result<Message>) {
        match self {
            ReplyTo::Once(tx) => {
                let _ = tx.send(result);
            }
            ReplyTo::Stream(tx) => {
                let _ = tx.try_send(result);
            }
        }
    }
}

/// The settings a stream peer announced in its CSM.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PeerSettings {
    /// Largest message the peer accepts.
    pub max_message_size: u32,
    /// BERT may be used: both ends announced Block-Wise-Transfer.
    pub bert: bool,
}

/// What the application asks of a transport.
#[derive(Debug)]
pub(crate) enum Command {
    /// Send a request; `key` lets the caller cancel it. A request with Observe=0 and a
    /// [`ReplyTo::Stream`] is an observation: every notification goes there.
    Request {
        /// The caller's name for it.
        key: u64,
        /// The server.
        peer: SocketAddr,
        /// The request.
        message: Message,
        /// Where its response (or notifications) go.
        reply: ReplyTo,
    },
    /// Forget a request (timeout in the caller, dropped observation). An observation
    /// over a stream, which has no RST to refuse the next notification with, is ended
    /// at the server by a GET with Observe=1 (RFC 7641 §3.6) whose answer nobody waits for.
    Cancel {
        /// Which request.
        key: u64,
    },
    /// End observation `key` proactively: send `message` (a GET with Observe=1) with
    /// the relation's token (RFC 7641 §3.6); its answer goes to `reply`, and `key`
    /// names it from then on. If the relation has already ended, `message` goes out as
    /// a plain request.
    Deregister {
        /// Which observation.
        key: u64,
        /// The server.
        peer: SocketAddr,
        /// The deregistering GET.
        message: Message,
        /// Where its answer goes.
        reply: ReplyTo,
    },
    /// Report the peer's settings (a connection does, once its CSM has arrived; a
    /// datagram transport has none to report).
    Settings {
        /// Where they go.
        reply: oneshot::Sender<Result<PeerSettings>>,
    },
    /// Publish the shard's counters and state sizes now: a metrics reader asked
    /// ([`crate::metrics::ShardMetrics`]); a transport without them ignores it.
    PublishMetrics,
    /// Stop: answer what is in progress (up to the grace period; a client's requests
    /// fail at once with [`Error::Shutdown`]), end the transport's sessions (DTLS
    /// close_notify, a connection's Release and close), then exit.
    Shutdown {
        /// How long a server's handlers in progress may still answer.
        grace: Duration,
    },
}

impl Command {
    /// Tells whoever waits for this command that it failed.
    pub(crate) fn fail(self, error: Error) {
        match self {
            Command::Request { reply, .. } | Command::Deregister { reply, .. } => {
                reply.send(Err(error))
            }
            Command::Settings { reply } => {
                let _ = reply.send(Err(error));
            }
            Command::Cancel { .. } | Command::PublishMetrics | Command::Shutdown { .. } => {}
        }
    }
}
