//! The client's requests and observations in flight on one transport, written once
//! against [`Session`]: the datagram driver (UDP, DTLS; `runtime::driver`) and a
//! client's connection task (TCP, TLS, WebSockets; `transport::tcp`) both run an
//! [`Exchanges`]. It carries out the [`Command`]s that concern requests, maps the
//! callers' keys to the session's [`Outbound`] ids, and hands each response,
//! notification and failure to the caller waiting for it.
//!
//! An observation ends when its caller goes away: over a datagram transport the
//! relation is forgotten and the next notification is refused with RST (RFC 7641
//! §3.6, reactive); a stream has no RST, so the client sends the deregistering GET
//! (Observe=1, the relation's token) without waiting for its answer. A notification
//! that finds the observer's channel full is dropped (the next one brings the
//! current state). A request with Q-Block2 (RFC 9177) and a stream for its answers
//! stays registered the same way while Q-Block2 blocks arrive (the body's other
//! blocks come under its token), until the caller has the body and cancels.

use crate::runtime::command::{Command, ReplyTo};
use crate::runtime::notifications::TrySendError;
use crate::Error;
use cobalt_proto::blockwise::qblock::Q_BLOCK2;
use cobalt_proto::endpoint::RequestId;
use cobalt_proto::message::{opt, Message, Token};
use cobalt_proto::session::{Failure, Outbound, Session, SessionError, SessionEvent};
use cobalt_proto::tcp_connection::CloseReason;
use hashbrown::{DefaultHashBuilder, HashMap, HashTable};
use std::hash::BuildHasher;
use std::net::SocketAddr;
use std::time::Instant;

/// How a transport words its errors: a request the session refused, and one whose
/// connection closed.
pub(crate) trait ExchangeErrors {
    /// The error of a request (`what`) to `peer` that the session refused.
    fn refused(&self, peer: SocketAddr, what: &str, error: SessionError) -> Error;

    /// The error of a request to `peer` whose connection closed.
    fn closed(&self, peer: SocketAddr, reason: CloseReason) -> Error;

    /// The error of a request to `peer` that ended without (further) response.
    fn failed(&self, peer: SocketAddr, reason: Failure) -> Error {
        match reason {
            Failure::Timeout { retransmissions } => Error::Timeout {
                peer,
                retransmissions,
            },
            Failure::Reset => Error::Reset(peer),
            Failure::Closed(reason) => self.closed(peer, reason),
        }
    }
}

/// One request of ours in flight, or one observation. Its server is not kept here:
/// a stream's id names it, the datagram endpoint knows it ([`Session::peer_of`])
/// while the request is active, and names it in the request's failure; a client may
/// hold an observation per server for thousands of servers.
#[derive(Debug)]
struct Pending {
    /// The session's id for it.
    id: SessionId,
    reply: ReplyTo,
}

/// The session's id of a request ([`Outbound`]): 16 bytes a request, where the
/// id itself takes 56.
#[derive(Debug)]
enum SessionId {
    /// [`Outbound::Datagram`].
    Datagram(RequestId),
    /// [`Outbound::Stream`], with what ends an observation. Boxed: a client of many
    /// servers' observations holds them over datagrams, whose id is a number.
    Stream(Box<StreamRequest>),
}

/// A request over a stream, as [`SessionId::Stream`] keeps it.
#[derive(Debug)]
struct StreamRequest {
    peer: SocketAddr,
    token: Token,
    /// For an observation, the GET with Observe=1 that ends it at the server (a
    /// datagram transport ends it with RST: nothing kept).
    deregister: Option<Message>,
}

impl SessionId {
    /// `id`; an observation over a stream ends with `deregister`.
    fn of(id: Outbound, deregister: Option<Message>) -> SessionId {
        match id {
            Outbound::Datagram(id) => SessionId::Datagram(id),
            Outbound::Stream { peer, token } => SessionId::Stream(Box::new(StreamRequest {
                peer,
                token,
                deregister,
            })),
        }
    }

    /// The session's id of the request.
    fn outbound(&self) -> Outbound {
        match self {
            SessionId::Datagram(id) => Outbound::Datagram(*id),
            SessionId::Stream(request) => Outbound::Stream {
                peer: request.peer,
                token: request.token.clone(),
            },
        }
    }

    /// What ends the observation at the server, if it is one over a stream.
    fn into_deregister(self) -> Option<Message> {
        match self {
            SessionId::Datagram(_) => None,
            SessionId::Stream(request) => request.deregister,
        }
    }
}

impl Pending {
    /// The session's id for it.
    fn outbound(&self) -> Outbound {
        self.id.outbound()
    }

    /// Whether the session knows it as `id`.
    fn is(&self, id: &Outbound) -> bool {
        match (&self.id, id) {
            (SessionId::Datagram(a), Outbound::Datagram(b)) => a == b,
            (SessionId::Stream(a), Outbound::Stream { peer, token }) => {
                a.peer == *peer && a.token == *token
            }
            _ => false,
        }
    }
}

/// The client's requests and observations in flight on one session. See the
/// [module documentation](self).
#[derive(Debug)]
pub(crate) struct Exchanges<E> {
    /// By the caller's key.
    pending: HashMap<u64, Pending>,
    /// The keys of `pending` by the session's id of each: an index that holds only
    /// the key, whose entry has the id (a client may hold an observation per
    /// server for thousands of servers: a second map keyed by the id, with its own
    /// copy of it, took 56 bytes a slot instead of 8).
    by_id: HashTable<u64>,
    hasher: DefaultHashBuilder,
    errors: E,
}

impl<E: ExchangeErrors> Exchanges<E> {
    /// No exchanges yet; errors are worded by `errors`.
    pub(crate) fn new(errors: E) -> Exchanges<E> {
        Exchanges {
            pending: HashMap::new(),
            by_id: HashTable::new(),
            hasher: DefaultHashBuilder::default(),
            errors,
        }
    }

    /// The key of the request the session knows as `id`.
    fn key_of(&self, id: &Outbound) -> Option<u64> {
        let hash = self.hasher.hash_one(id);
        let pending = &self.pending;
        self.by_id
            .find(hash, |key| pending.get(key).is_some_and(|p| p.is(id)))
            .copied()
    }

    /// Starts keeping `pending` under `key`.
    fn keep(&mut self, key: u64, pending: Pending) {
        if self.take(key).is_some() {
            tracing::debug!(key, "a request key used twice; the first is forgotten");
        }
        let hash = self.hasher.hash_one(pending.outbound());
        self.pending.insert(key, pending);
        let (pending, hasher) = (&self.pending, &self.hasher);
        self.by_id.insert_unique(hash, key, |k| {
            pending.get(k).map_or(0, |p| hasher.hash_one(p.outbound()))
        });
    }

    /// Stops keeping request `key`.
    fn take(&mut self, key: u64) -> Option<Pending> {
        let pending = self.pending.remove(&key)?;
        let hash = self.hasher.hash_one(pending.outbound());
        if let Ok(entry) = self.by_id.find_entry(hash, |k| *k == key) {
            entry.remove();
        }
        Some(pending)
    }

    /// Stops keeping the request the session knows as `id`.
    fn take_id(&mut self, id: &Outbound) -> Option<Pending> {
        let key = self.key_of(id)?;
        self.take(key)
    }

    /// No request or observation in flight.
    pub(crate) fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }

    /// Carries out a request command (request, cancel, deregistration); gives back the
    /// others (settings, shutdown) for the transport to carry out.
    pub(crate) fn command<S: Session>(
        &mut self,
        session: &mut S,
        now: Instant,
        command: Command,
    ) -> Option<Command> {
        match command {
            Command::Request {
                key,
                peer,
                message,
                reply,
            } => self.start(session, now, key, peer, message, reply, "request"),
            Command::Cancel { key } => self.cancel(session, now, key),
            Command::Deregister {
                key,
                peer,
                message,
                reply,
            } => self.deregister(session, now, key, peer, message, reply),
            other => return Some(other),
        }
        None
    }

    /// Sends `message` to `peer` under the caller's `key`.
    #[allow(clippy::too_many_arguments)]
    fn start<S: Session>(
        &mut self,
        session: &mut S,
        now: Instant,
        key: u64,
        peer: SocketAddr,
        message: Message,
        reply: ReplyTo,
        what: &str,
    ) {
        let deregister = match &reply {
            ReplyTo::Stream(_) if message.options.observe() == Some(0) => {
                let mut deregister = message.clone();
                deregister.options.set_uint(opt::OBSERVE, 1);
                Some(deregister)
            }
            _ => None,
        };
        match session.request(now, peer, message) {
            Ok(id) => {
                self.keep(
                    key,
                    Pending {
                        id: SessionId::of(id, deregister),
                        reply,
                    },
                );
            }
            Err(e) => reply.send(Err(self.errors.refused(peer, what, e))),
        }
    }

    /// The caller stopped waiting for request `key`.
    fn cancel<S: Session>(&mut self, session: &mut S, now: Instant, key: u64) {
        if let Some(pending) = self.take(key) {
            let id = pending.outbound();
            let deregister = pending.id.into_deregister();
            self.end(session, now, id, deregister);
        }
    }

    /// Forgets request `id`; an observation over a stream is deregistered at the
    /// server with `deregister` (see the [module documentation](self)).
    fn end<S: Session>(
        &mut self,
        session: &mut S,
        now: Instant,
        id: Outbound,
        deregister: Option<Message>,
    ) {
        match (id.clone(), deregister) {
            (Outbound::Stream { peer, token }, Some(mut deregister)) => {
                deregister.token = token;
                if session.request(now, peer, deregister).is_err() {
                    session.cancel(now, id);
                }
            }
            _ => session.cancel(now, id),
        }
    }

    /// Ends observation `key` with `message` (a GET with Observe=1 and the relation's
    /// token); the answer goes to `reply` under the same key. When the relation has
    /// ended already, `message` goes out as a plain request.
    #[allow(clippy::too_many_arguments)]
    fn deregister<S: Session>(
        &mut self,
        session: &mut S,
        now: Instant,
        key: u64,
        peer: SocketAddr,
        mut message: Message,
        reply: ReplyTo,
    ) {
        message.token = Token::EMPTY;
        if let Some(id) = self.take(key).map(|p| p.outbound()) {
            if let Some(token) = session.token_of(id.clone()) {
                message.token = token;
            }
            // A connection matches the GET to its observation by the token (RFC 7641
            // §3.6); the datagram endpoint must forget the relation before the token
            // can go out again.
            if let Outbound::Datagram(_) = id {
                session.cancel(now, id);
            }
        }
        self.start(session, now, key, peer, message, reply, "deregistration");
    }

    /// Takes an event of the session: a response, notification or failure of one of
    /// our requests goes to its caller. Gives back the others.
    pub(crate) fn on_event<S: Session>(
        &mut self,
        session: &mut S,
        now: Instant,
        event: SessionEvent,
    ) -> Option<SessionEvent> {
        match event {
            SessionEvent::Response { id, response } => self.on_response(session, now, id, response),
            SessionEvent::Failed { id, peer, reason } => {
                if let Some(pending) = self.take_id(&id) {
                    let error = self.errors.failed(peer, reason);
                    pending.reply.send(Err(error));
                }
            }
            other => return Some(other),
        }
        None
    }

    /// A response or notification for request `id`.
    fn on_response<S: Session>(
        &mut self,
        session: &mut S,
        now: Instant,
        id: Outbound,
        response: Message,
    ) {
        let Some(key) = self.key_of(&id) else {
            return; // cancelled, or a late answer nobody waits for
        };
        let Some(pending) = self.pending.get(&key) else {
            return;
        };
        let ReplyTo::Stream(notifications) = &pending.reply else {
            if let Some(pending) = self.take(key) {
                pending.reply.send(Ok(response));
            }
            return;
        };
        // A response without Observe (an error, or a server that does not observe)
        // ends the relation; a Q-Block2 block does not: the caller collects the body's
        // blocks until it has them all, then cancels.
        let last = response.options.observe().is_none() && !response.options.contains(Q_BLOCK2);
        match notifications.try_send(Ok(response)) {
            Ok(()) if !last => return,
            Ok(()) => {}
            Err(TrySendError::Full(_)) => {
                tracing::debug!(?id, "observer not keeping up; notification dropped");
                if !last {
                    return;
                }
            }
            Err(TrySendError::Closed(_)) => {
                // The observation was dropped before its cancellation got here.
                if let Some(pending) = self.take(key) {
                    let deregister = pending.id.into_deregister().filter(|_| !last);
                    self.end(session, now, id, deregister);
                }
                return;
            }
        }
        if self.take(key).is_some() {
            session.cancel(now, id);
        }
    }

    /// Ends every request to `peer` with the error `error` makes (an ICMP error, a
    /// failed DTLS handshake).
    pub(crate) fn fail_peer<S: Session>(
        &mut self,
        session: &mut S,
        now: Instant,
        peer: SocketAddr,
        error: impl Fn(SocketAddr) -> Error,
    ) {
        let keys: Vec<u64> = self
            .pending
            .iter()
            .filter(|(_, p)| session.peer_of(&p.outbound()) == Some(peer))
            .map(|(key, _)| *key)
            .collect();
        for key in keys {
            if let Some(pending) = self.take(key) {
                session.cancel(now, pending.outbound());
                pending.reply.send(Err(error(peer)));
            }
        }
    }

    /// Ends every request and observation with the error `error` makes (the
    /// transport stops or its connection closed), forgetting them in `session`.
    pub(crate) fn fail_all<S: Session>(
        &mut self,
        session: &mut S,
        now: Instant,
        error: impl Fn(SocketAddr) -> Error,
    ) {
        self.by_id.clear();
        for (_, pending) in self.pending.drain() {
            let id = pending.outbound();
            // Unknown only for a request the session has just forgotten, whose
            // failure it still holds for us: the error cannot name its server.
            let peer = session
                .peer_of(&id)
                .unwrap_or(SocketAddr::from(([0, 0, 0, 0], 0)));
            session.cancel(now, id);
            pending.reply.send(Err(error(peer)));
        }
    }
}

#[cfg(test)]
mod tests;
