//! One application-facing surface over both kinds of CoAP transport: a [`Session`]
//! sends requests, answers the peer's, notifies observers and reports what happened
//! as [`SessionEvent`]s, whether it is the datagram [`Endpoint`] (UDP, DTLS) or a
//! node's RFC 8323 stream connections ([`stream::StreamEndpoint`], TCP, TLS,
//! WebSockets). Application code written against it runs over either.
//!
//! Requests and responses are [`Message`]s: over a stream the type and message ID are
//! dropped (RFC 8323 §3.2) and received messages read as confirmable ones with ID 0.
//! What only one kind of transport has (an unmatched RST, a peer's CSM, a Pong) comes
//! through as it is: [`SessionEvent::Endpoint`], [`SessionEvent::Connection`].

pub mod stream;

use crate::blockwise::{slice_asked, BlockSize};
use crate::endpoint::{Endpoint, Event, ExchangeId, RequestError, RequestId, UnknownExchange};
use crate::message::{BlockValue, Message, Token};
use crate::observe::encoded::EncodedNotification;
use crate::tcp_connection::{CloseReason, SendError, TcpEvent};
use std::fmt;
use std::net::SocketAddr;
use std::time::Instant;

/// A request received from a peer, until it is answered ([`Session::respond`]).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Inbound {
    /// On the datagram endpoint.
    Datagram(ExchangeId),
    /// On the connection to `peer`, under the request's token.
    Stream {
        /// The peer.
        peer: SocketAddr,
        /// The request's token.
        token: Token,
    },
}

/// A request sent with [`Session::request`]; its responses (every notification, for an
/// observation) come under this id.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Outbound {
    /// On the datagram endpoint.
    Datagram(RequestId),
    /// On the connection to `peer`, under the request's token.
    Stream {
        /// The peer.
        peer: SocketAddr,
        /// The request's token.
        token: Token,
    },
}

/// Why a request ended without (further) response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// No acknowledgement or no response in time (datagram).
    Timeout {
        /// Retransmissions sent before giving up.
        retransmissions: u32,
    },
    /// The peer rejected it with RST (datagram).
    Reset,
    /// Its connection closed (stream).
    Closed(CloseReason),
}

/// What a [`Session`] tells the application.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SessionEvent {
    /// A new request (never a duplicate); answer it with [`Session::respond`].
    Request {
        /// Pass this to `respond`.
        id: Inbound,
        /// Who sent it.
        peer: SocketAddr,
        /// The request.
        request: Message,
    },
    /// A response to one of our requests (for an observation, one per notification).
    Response {
        /// The request it answers.
        id: Outbound,
        /// The response.
        response: Message,
    },
    /// One of our requests ended without (further) response.
    Failed {
        /// The request.
        id: Outbound,
        /// The server it was sent to.
        peer: SocketAddr,
        /// Why.
        reason: Failure,
    },
    /// Another event of the datagram endpoint ([`Event::UnmatchedReset`],
    /// [`Event::ResponseFailed`], [`Event::Unverified`]).
    Endpoint(Event),
    /// Another event of the connection to `peer` ([`TcpEvent::PeerSettings`],
    /// [`TcpEvent::Pong`], [`TcpEvent::ReleaseReceived`], [`TcpEvent::Closed`], which
    /// follows the `Failed` of the requests it left outstanding).
    Connection {
        /// The peer.
        peer: SocketAddr,
        /// The event.
        event: TcpEvent,
    },
}

impl From<Event> for SessionEvent {
    fn from(event: Event) -> SessionEvent {
        match event {
            Event::Request { id, peer, request } => SessionEvent::Request {
                id: Inbound::Datagram(id),
                peer,
                request,
            },
            Event::Response { id, response } => SessionEvent::Response {
                id: Outbound::Datagram(id),
                response,
            },
            Event::Timeout {
                id,
                peer,
                retransmissions,
            } => SessionEvent::Failed {
                id: Outbound::Datagram(id),
                peer,
                reason: Failure::Timeout { retransmissions },
            },
            Event::Reset { id, peer } => SessionEvent::Failed {
                id: Outbound::Datagram(id),
                peer,
                reason: Failure::Reset,
            },
            other => SessionEvent::Endpoint(other),
        }
    }
}

/// The datagram endpoint's own event, back from the session's view; `Err` gives back
/// an event of a stream session.
impl TryFrom<SessionEvent> for Event {
    type Error = SessionEvent;

    fn try_from(event: SessionEvent) -> Result<Event, SessionEvent> {
        Ok(match event {
            SessionEvent::Request {
                id: Inbound::Datagram(id),
                peer,
                request,
            } => Event::Request { id, peer, request },
            SessionEvent::Response {
                id: Outbound::Datagram(id),
                response,
            } => Event::Response { id, response },
            SessionEvent::Failed {
                id: Outbound::Datagram(id),
                peer,
                reason: Failure::Timeout { retransmissions },
            } => Event::Timeout {
                id,
                peer,
                retransmissions,
            },
            SessionEvent::Failed {
                id: Outbound::Datagram(id),
                peer,
                reason: Failure::Reset,
            } => Event::Reset { id, peer },
            SessionEvent::Endpoint(event) => event,
            other => return Err(other),
        })
    }
}

/// The server's side of an observation: where its notifications go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Observation {
    peer: SocketAddr,
    token: Token,
    /// The datagram endpoint's last notification (a confirmable one is replaced by
    /// the next, RFC 7641 §4.5.2).
    last: Option<(ExchangeId, u16)>,
}

impl Observation {
    /// The observation that `request` (from `peer`, carrying Observe=0) registers once
    /// it is answered with a success response carrying Observe.
    pub fn new(peer: SocketAddr, request: &Message) -> Observation {
        Observation {
            peer,
            token: request.token.clone(),
            last: None,
        }
    }

    /// The observation of `token` by `peer` whose last notification (on the datagram
    /// endpoint) was `last`: for callers that keep their relations in their own table.
    pub fn resume(peer: SocketAddr, token: Token, last: Option<(ExchangeId, u16)>) -> Observation {
        Observation { peer, token, last }
    }

    /// The observer.
    pub fn peer(&self) -> SocketAddr {
        self.peer
    }

    /// The token its notifications carry.
    pub fn token(&self) -> &Token {
        &self.token
    }

    /// The datagram exchange and message ID of its last notification (none over a
    /// stream).
    pub fn last(&self) -> Option<(ExchangeId, u16)> {
        self.last
    }
}

/// How large the blocks of a sliced response may be ([`Session::slice`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockLimits {
    /// The largest block size exponent to send (0 to 6: 16 to 1024 bytes).
    pub szx: u8,
    /// The largest BERT block in bytes, over a connection whose both ends announced
    /// Block-Wise-Transfer (RFC 8323 §6).
    pub max_bert_block: usize,
}

/// Why a [`Session`] could not do what it was asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SessionError {
    /// The datagram endpoint refused the request.
    Request(RequestError),
    /// The datagram exchange is not (or no longer) awaiting a response.
    UnknownExchange(ExchangeId),
    /// The connection refused the message.
    Send(SendError),
    /// No connection to this peer (it closed, or never was).
    NotConnected(SocketAddr),
    /// The id belongs to the other kind of session.
    WrongSession,
    /// The peer's address is not verified yet (RFC 9175 §2.4): nothing more may go
    /// to it now.
    Unverified(SocketAddr),
}

impl fmt::Display for SessionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SessionError::Request(e) => write!(f, "{e}"),
            SessionError::UnknownExchange(id) => write!(f, "{}", UnknownExchange(*id)),
            SessionError::Send(e) => write!(f, "{e}"),
            SessionError::NotConnected(peer) => write!(f, "no connection to {peer}"),
            SessionError::WrongSession => write!(f, "the id belongs to another kind of session"),
            SessionError::Unverified(peer) => {
                write!(
                    f,
                    "{peer} has not proved its address yet; try again once it has"
                )
            }
        }
    }
}

impl std::error::Error for SessionError {}

/// What applications do with a CoAP transport, datagram or stream alike.
pub trait Session {
    /// Sends `request` to `peer` (over a stream, on the connection to it, opened if
    /// there is none). A request with Observe=0 stays registered and receives every
    /// notification under the returned id until [`Session::cancel`].
    fn request(
        &mut self,
        now: Instant,
        peer: SocketAddr,
        request: Message,
    ) -> Result<Outbound, SessionError>;

    /// Answers the peer's request `id`. A success response carrying Observe to a
    /// request with Observe=0 registers an [`Observation`].
    fn respond(&mut self, now: Instant, id: Inbound, response: Message)
        -> Result<(), SessionError>;

    /// Ends the peer's request `id` without answering it (a Q-Block1 block that does
    /// not complete its set). A stream keeps nothing for an unanswered request.
    fn withhold(&mut self, _now: Instant, _id: Inbound) -> Result<(), SessionError> {
        Ok(())
    }

    /// Acknowledges the peer's confirmable request `id` now (an empty ACK) when its
    /// answer will come later or not at all (a Q-Block1 block kept for a later 4.08):
    /// the client goes on without waiting for the separate-ACK delay. Nothing to do
    /// over a stream, or for a NON request.
    fn acknowledge(&mut self, _id: &Inbound) {}

    /// Sends one more block of an answer already given (a Q-Block2 block after the
    /// first, RFC 9177) with `token` to `peer`, confirmable or not. Only the datagram
    /// endpoint has Q-Block (a stream is reliable and has BERT): elsewhere
    /// [`SessionError::WrongSession`]. An address not yet verified gets nothing:
    /// [`SessionError::Unverified`].
    fn send_block(
        &mut self,
        _now: Instant,
        _peer: SocketAddr,
        _token: Token,
        _block: Message,
        _confirmable: bool,
    ) -> Result<(), SessionError> {
        Err(SessionError::WrongSession)
    }

    /// Sends a notification of `observation`; `confirmable` asks for a confirmable one
    /// where the transport has types (a stream is reliable anyway).
    fn notify(
        &mut self,
        now: Instant,
        observation: &mut Observation,
        notification: Message,
        confirmable: bool,
    ) -> Result<(), SessionError>;

    /// [`Session::notify`] with a notification encoded once for many observers
    /// ([`EncodedNotification`]); what goes out is the same. A datagram endpoint only
    /// writes the header and token in front of the shared encoding; other transports
    /// send the message.
    fn notify_encoded(
        &mut self,
        now: Instant,
        observation: &mut Observation,
        notification: &EncodedNotification,
        confirmable: bool,
    ) -> Result<(), SessionError> {
        let message = notification.message().clone();
        self.notify(now, observation, message, confirmable)
    }

    /// Forgets one of our requests or observations: no more responses or
    /// notifications come for it.
    fn cancel(&mut self, now: Instant, id: Outbound);

    /// The token of one of our requests or observations while it is active (e.g. to
    /// deregister an observation with it, RFC 7641 §3.6).
    fn token_of(&self, id: Outbound) -> Option<Token> {
        match id {
            Outbound::Stream { token, .. } => Some(token),
            Outbound::Datagram(_) => None,
        }
    }

    /// The server of one of our requests or observations while it is active.
    fn peer_of(&self, id: &Outbound) -> Option<SocketAddr> {
        match id {
            Outbound::Stream { peer, .. } => Some(*peer),
            Outbound::Datagram(_) => None,
        }
    }

    /// Whether the last notification of `observation` was confirmable and still waits
    /// for its ACK (never over a stream, which is reliable).
    fn awaits_ack(&self, observation: &Observation) -> bool;

    /// Whether `peer` has proved its address (RFC 9175 §2.4), so that what it
    /// registers may hold state at once. Always over a stream (the handshake proves
    /// it); over datagrams see [`Endpoint::is_verified`]: the answer to a registration
    /// from an unverified peer waits for the proof, and [`Event::Verified`] or
    /// [`Event::Unverified`] says how it ended.
    fn is_verified(&self, _now: Instant, _peer: SocketAddr) -> bool {
        true
    }

    /// `response` as it goes to `peer`: whole when it fits and no block was `asked`
    /// for, else the block asked for (or the first) of the largest size the transport
    /// and `limits` allow (RFC 7959 §2.2; BERT over a stream, RFC 8323 §6).
    fn slice(
        &self,
        peer: SocketAddr,
        asked: Option<BlockValue>,
        response: Message,
        limits: BlockLimits,
    ) -> Message;

    /// The next event.
    fn poll_event(&mut self) -> Option<SessionEvent>;
}

impl Session for Endpoint {
    fn request(
        &mut self,
        now: Instant,
        peer: SocketAddr,
        request: Message,
    ) -> Result<Outbound, SessionError> {
        Endpoint::request(self, now, peer, request)
            .map(Outbound::Datagram)
            .map_err(SessionError::Request)
    }

    fn respond(
        &mut self,
        now: Instant,
        id: Inbound,
        response: Message,
    ) -> Result<(), SessionError> {
        let Inbound::Datagram(id) = id else {
            return Err(SessionError::WrongSession);
        };
        Endpoint::respond(self, now, id, response).map_err(|e| SessionError::UnknownExchange(e.0))
    }

    fn withhold(&mut self, now: Instant, id: Inbound) -> Result<(), SessionError> {
        let Inbound::Datagram(id) = id else {
            return Err(SessionError::WrongSession);
        };
        Endpoint::withhold(self, now, id).map_err(|e| SessionError::UnknownExchange(e.0))
    }

    fn acknowledge(&mut self, id: &Inbound) {
        if let Inbound::Datagram(id) = id {
            Endpoint::accept_separately(self, *id);
        }
    }

    fn send_block(
        &mut self,
        now: Instant,
        peer: SocketAddr,
        token: Token,
        block: Message,
        confirmable: bool,
    ) -> Result<(), SessionError> {
        if Endpoint::send_block(self, now, peer, token, block, confirmable) {
            Ok(())
        } else {
            Err(SessionError::Unverified(peer))
        }
    }

    fn notify(
        &mut self,
        now: Instant,
        observation: &mut Observation,
        notification: Message,
        confirmable: bool,
    ) -> Result<(), SessionError> {
        let sent = Endpoint::notify(
            self,
            now,
            observation.peer,
            observation.token.clone(),
            notification,
            confirmable,
            observation.last,
        );
        observation.last = Some(sent);
        Ok(())
    }

    fn notify_encoded(
        &mut self,
        now: Instant,
        observation: &mut Observation,
        notification: &EncodedNotification,
        confirmable: bool,
    ) -> Result<(), SessionError> {
        let sent = Endpoint::notify_encoded(
            self,
            now,
            observation.peer,
            observation.token.clone(),
            notification,
            confirmable,
            observation.last,
        );
        observation.last = Some(sent);
        Ok(())
    }

    fn cancel(&mut self, now: Instant, id: Outbound) {
        if let Outbound::Datagram(id) = id {
            Endpoint::cancel(self, now, id);
        }
    }

    fn token_of(&self, id: Outbound) -> Option<Token> {
        match id {
            Outbound::Datagram(id) => self.request_token(id),
            Outbound::Stream { .. } => None,
        }
    }

    fn peer_of(&self, id: &Outbound) -> Option<SocketAddr> {
        match id {
            Outbound::Datagram(id) => self.request_peer(*id),
            Outbound::Stream { .. } => None,
        }
    }

    fn awaits_ack(&self, observation: &Observation) -> bool {
        observation
            .last
            .is_some_and(|(_, mid)| self.is_unacknowledged(observation.peer, mid))
    }

    fn is_verified(&self, now: Instant, peer: SocketAddr) -> bool {
        Endpoint::is_verified(self, now, peer)
    }

    fn slice(
        &self,
        _peer: SocketAddr,
        asked: Option<BlockValue>,
        response: Message,
        limits: BlockLimits,
    ) -> Message {
        slice_asked(asked, response, BlockSize::Szx(limits.szx))
    }

    fn poll_event(&mut self) -> Option<SessionEvent> {
        Endpoint::poll_event(self).map(SessionEvent::from)
    }
}

#[cfg(test)]
mod sim_tests;
#[cfg(test)]
mod tests;
