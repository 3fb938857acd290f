//! What the client's task for one CoAP-over-TCP or -WebSocket connection is asked to
//! do ([`ClientCommand`]) and what it remembers meanwhile ([`Exchanges`]): callers
//! waiting for one response, and observations (RFC 7641 over RFC 8323 §7) whose
//! notifications go to an [`Observation`](crate::client::Observation)'s channel.
//!
//! An observation ends at the server when its [`StreamObservation`] is cancelled or
//! dropped: either sends a GET with Observe=1 and the observation's token (there is no
//! Reset over TCP to reject a notification). A notification that finds the
//! observation's channel full is dropped (the next one brings the current state);
//! one that finds the channel closed deregisters the same way.

use crate::error::{ConnectionError, ConnectionErrorKind};
use crate::{Error, Result};
use cobalt_proto::message::option::number;
use cobalt_proto::message::{Message, TcpMessage, Token};
use cobalt_proto::tcp_connection::TcpConnection;
use cobalt_proto::uri::Scheme;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Instant;
use tokio::sync::{mpsc, oneshot};

/// The peer's settings as its CSM announced them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PeerSettings {
    /// Largest message the peer accepts.
    pub max_message_size: u32,
    /// BERT may be used: both ends announced Block-Wise-Transfer.
    pub bert: bool,
}

/// Where one response goes.
pub(crate) type Reply = oneshot::Sender<Result<TcpMessage>>;

/// Where an observation's notifications go.
pub(crate) type Notifications = mpsc::Sender<Result<Message>>;

/// Something for a client connection's task to do.
pub(crate) enum ClientCommand {
    /// Send a request; its response goes to `reply`.
    Request {
        /// The request.
        message: TcpMessage,
        /// Where the response goes.
        reply: Reply,
    },
    /// Register an observation (a GET with Observe=0): every response goes to
    /// `notifications` until one without Observe.
    Observe {
        /// The caller's name for it.
        key: u64,
        /// The registration.
        message: TcpMessage,
        /// Where the responses go.
        notifications: Notifications,
    },
    /// End observation `key`: send `message` (a GET with Observe=1) with its token; the
    /// answer goes to `reply` if there is one. If the observation has already ended,
    /// `message` is sent as a plain request only when there is a `reply`.
    Deregister {
        /// Which observation.
        key: u64,
        /// The deregistering GET.
        message: TcpMessage,
        /// Where its answer goes.
        reply: Option<Reply>,
    },
    /// Report the peer's settings (once its CSM has arrived).
    Settings {
        /// Where they go.
        reply: oneshot::Sender<Result<PeerSettings>>,
    },
}

impl ClientCommand {
    /// Tells whoever waits for this command that it failed.
    pub(crate) fn fail(self, error: Error) {
        match self {
            ClientCommand::Request { reply, .. } => {
                let _ = reply.send(Err(error));
            }
            ClientCommand::Observe { notifications, .. } => {
                let _ = notifications.try_send(Err(error));
            }
            ClientCommand::Deregister { reply, .. } => {
                if let Some(reply) = reply {
                    let _ = reply.send(Err(error));
                }
            }
            ClientCommand::Settings { reply } => {
                let _ = reply.send(Err(error));
            }
        }
    }
}

/// An observation over a pooled connection, as its [`Observation`] holds it: cancel
/// it, or drop it to deregister without waiting for the answer.
///
/// [`Observation`]: crate::client::Observation
#[derive(Debug)]
pub(crate) struct StreamObservation {
    /// The connection's scheme and server, for errors.
    pub(crate) scheme: Scheme,
    pub(crate) peer: SocketAddr,
    pub(crate) commands: mpsc::UnboundedSender<ClientCommand>,
    pub(crate) key: u64,
    /// The GET with Observe=1 that ends it.
    pub(crate) deregister: TcpMessage,
    pub(crate) armed: bool,
}

impl StreamObservation {
    /// Deregisters (GET with Observe=1 and the observation's token) and waits for the
    /// server's answer.
    pub(crate) async fn cancel(mut self) -> Result<Message> {
        self.armed = false;
        let (tx, rx) = oneshot::channel();
        let sent = self.commands.send(ClientCommand::Deregister {
            key: self.key,
            message: self.deregister.clone(),
            reply: Some(tx),
        });
        let closed = || {
            Error::Connection(ConnectionError {
                scheme: self.scheme,
                peer: self.peer,
                kind: ConnectionErrorKind::ClosedBeforeSend,
            })
        };
        sent.map_err(|_| closed())?;
        rx.await.map_err(|_| closed())?.map(Message::from)
    }
}

impl Drop for StreamObservation {
    fn drop(&mut self) {
        if self.armed {
            let _ = self.commands.send(ClientCommand::Deregister {
                key: self.key,
                message: self.deregister.clone(),
                reply: None,
            });
        }
    }
}

/// One observation of ours on the connection.
struct Observer {
    key: u64,
    notifications: Notifications,
    deregister: TcpMessage,
}

/// The requests and observations of one client connection.
pub(crate) struct Exchanges {
    scheme: Scheme,
    peer: SocketAddr,
    waiting: HashMap<Token, Reply>,
    observers: HashMap<Token, Observer>,
    keys: HashMap<u64, Token>,
}

impl Exchanges {
    /// No exchanges yet on a connection of `scheme` to `peer`.
    pub(crate) fn new(scheme: Scheme, peer: SocketAddr) -> Exchanges {
        Exchanges {
            scheme,
            peer,
            waiting: HashMap::new(),
            observers: HashMap::new(),
            keys: HashMap::new(),
        }
    }

    /// The error of a command the connection refused (e.g. a message too large).
    fn refused(&self, what: &str, e: impl std::fmt::Display) -> Error {
        Error::Connection(ConnectionError {
            scheme: self.scheme,
            peer: self.peer,
            kind: ConnectionErrorKind::Refused(format!("{what}: {e}")),
        })
    }

    /// Carries out a command on an established connection.
    pub(crate) fn start(&mut self, conn: &mut TcpConnection, cmd: ClientCommand) {
        // Forget requests whose callers stopped waiting.
        self.waiting.retain(|t, tx| {
            let keep = !tx.is_closed();
            if !keep {
                conn.cancel(*t);
            }
            keep
        });
        match cmd {
            ClientCommand::Request { message, reply } => {
                match conn.request(Instant::now(), message) {
                    Ok(token) => {
                        self.waiting.insert(token, reply);
                    }
                    Err(e) => {
                        let _ = reply.send(Err(self.refused("request", e)));
                    }
                }
            }
            ClientCommand::Observe {
                key,
                message,
                notifications,
            } => {
                let mut deregister = message.clone();
                deregister.options.set_uint(number::OBSERVE, 1);
                match conn.request(Instant::now(), message) {
                    Ok(token) => {
                        self.keys.insert(key, token);
                        self.observers.insert(
                            token,
                            Observer {
                                key,
                                notifications,
                                deregister,
                            },
                        );
                    }
                    Err(e) => {
                        let _ = notifications.try_send(Err(self.refused("observe request", e)));
                    }
                }
            }
            ClientCommand::Deregister {
                key,
                message,
                reply,
            } => {
                let token = self.keys.remove(&key);
                if let Some(t) = token {
                    self.observers.remove(&t);
                }
                if token.is_none() && reply.is_none() {
                    return;
                }
                let mut message = message;
                message.token = token.unwrap_or(Token::EMPTY);
                match (conn.request(Instant::now(), message), reply) {
                    (Ok(t), Some(reply)) => {
                        self.waiting.insert(t, reply);
                    }
                    (Err(e), Some(reply)) => {
                        let _ = reply.send(Err(self.refused("deregistration", e)));
                    }
                    (Ok(_), None) => {}
                    (Err(_), None) => {
                        if let Some(t) = token {
                            conn.cancel(t);
                        }
                    }
                }
            }
            ClientCommand::Settings { reply } => {
                let _ = reply.send(Ok(PeerSettings {
                    max_message_size: conn.peer_max_message_size(),
                    bert: conn.bert(),
                }));
            }
        }
    }

    /// A response (or notification) arrived.
    pub(crate) fn on_response(
        &mut self,
        conn: &mut TcpConnection,
        token: Token,
        message: TcpMessage,
    ) {
        if let Some(tx) = self.waiting.remove(&token) {
            let _ = tx.send(Ok(message));
            return;
        }
        let Some(observer) = self.observers.get(&token) else {
            return; // deregistered, or a late answer nobody waits for
        };
        let last = !message.options.contains(number::OBSERVE);
        match observer.notifications.try_send(Ok(Message::from(message))) {
            Ok(()) => {}
            Err(mpsc::error::TrySendError::Full(_)) => {
                tracing::debug!(%token, "observer not keeping up; notification dropped");
            }
            Err(mpsc::error::TrySendError::Closed(_)) => {
                // The observation was dropped before its deregistration got here.
                if let Some(o) = self.observers.remove(&token) {
                    self.keys.remove(&o.key);
                    if !last {
                        let mut dereg = o.deregister;
                        dereg.token = token;
                        if conn.request(Instant::now(), dereg).is_err() {
                            conn.cancel(token);
                        }
                    }
                }
                return;
            }
        }
        if last {
            if let Some(o) = self.observers.remove(&token) {
                self.keys.remove(&o.key);
            }
        }
    }

    /// The connection closed: every caller and observation learns why.
    pub(crate) fn close(self, error: impl Fn() -> Error) {
        for (_, tx) in self.waiting {
            let _ = tx.send(Err(error()));
        }
        for (_, o) in self.observers {
            let _ = o.notifications.try_send(Err(error()));
        }
    }
}
