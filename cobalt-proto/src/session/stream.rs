//! A node's RFC 8323 connections, one per peer address, as one [`Session`]: the
//! stream counterpart of the datagram [`Endpoint`](crate::endpoint::Endpoint).
//!
//! Sans-IO like the rest: the caller opens the streams [`StreamEndpoint`] asks for
//! ([`StreamTransmit::Connect`]), hands over accepted ones ([`StreamEndpoint::accept`]),
//! feeds what it reads ([`StreamEndpoint::handle_bytes`], [`StreamEndpoint::handle_eof`])
//! and the passing of time, and writes and closes what it is told to
//! ([`StreamEndpoint::poll_transmit`]). A connection that closes is forgotten once its
//! last bytes and events are out, so an idle node holds nothing.

use super::{
    BlockLimits, Failure, Inbound, Observation, Outbound, Session, SessionError, SessionEvent,
};
use crate::blockwise::{slice_asked, BlockSize};
use crate::message::{opt, BlockValue, Message, TcpMessage};
use crate::tcp_connection::{TcpConfig, TcpConnection, TcpEvent};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::{BTreeMap, VecDeque};
use std::net::SocketAddr;
use std::time::Instant;

/// What a [`StreamEndpoint`] wants done with its streams, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StreamTransmit {
    /// Open a stream to this peer (a request needs a connection).
    Connect(SocketAddr),
    /// Write these bytes to the stream of this peer.
    Data(SocketAddr, Vec<u8>),
    /// Close the stream of this peer once what was written before is out.
    Close(SocketAddr),
}

/// A node's stream connections by peer address. See the [module documentation](self).
#[derive(Debug)]
pub struct StreamEndpoint {
    config: TcpConfig,
    rng: StdRng,
    conns: BTreeMap<SocketAddr, Connection>,
    out: VecDeque<StreamTransmit>,
    events: VecDeque<SessionEvent>,
}

impl StreamEndpoint {
    /// No connections yet; new ones use `config`, and their tokens follow from `seed`.
    pub fn new(config: TcpConfig, seed: u64) -> StreamEndpoint {
        StreamEndpoint {
            config,
            rng: StdRng::seed_from_u64(seed),
            conns: BTreeMap::new(),
            out: VecDeque::new(),
            events: VecDeque::new(),
        }
    }

    /// The configuration of new connections.
    pub fn config(&self) -> &TcpConfig {
        &self.config
    }

    /// Open connections.
    pub fn connections(&self) -> usize {
        self.conns.len()
    }

    /// The connection to `peer`, to look at it.
    pub fn connection(&self, peer: SocketAddr) -> Option<&TcpConnection> {
        self.conns.get(&peer).map(Connection::connection)
    }

    /// The connection to `peer`, for what only a connection does (Ping, Release,
    /// Abort); what it then sends or reports comes out of the next poll.
    pub fn connection_mut(&mut self, peer: SocketAddr) -> Option<&mut TcpConnection> {
        self.conns.get_mut(&peer).map(Connection::connection_mut)
    }

    /// The connection to `peer`, opened (and [`StreamTransmit::Connect`] queued) if
    /// there is none.
    pub fn connect(&mut self, now: Instant, peer: SocketAddr) -> &mut TcpConnection {
        self.opened(now, peer).connection_mut()
    }

    /// The session of the connection to `peer`, opened as [`StreamEndpoint::connect`]
    /// opens it.
    fn opened(&mut self, now: Instant, peer: SocketAddr) -> &mut Connection {
        if !self.conns.contains_key(&peer) {
            self.out.push_back(StreamTransmit::Connect(peer));
        }
        let (config, rng) = (&self.config, &mut self.rng);
        self.conns.entry(peer).or_insert_with(|| {
            let conn = TcpConnection::with_token_seed(config.clone(), now, rng.random());
            Connection::new(peer, conn)
        })
    }

    /// A stream from `peer` was accepted. An earlier connection from the same address
    /// ends as if its stream had closed. (How many streams to accept is the caller's
    /// to bound.)
    pub fn accept(&mut self, now: Instant, peer: SocketAddr) {
        let conn = TcpConnection::with_token_seed(self.config.clone(), now, self.rng.random());
        if let Some(mut old) = self.conns.insert(peer, Connection::new(peer, conn)) {
            // Its stream is gone: only its events remain to report.
            old.connection_mut().handle_eof();
            self.events.extend(std::iter::from_fn(|| old.poll_event()));
        }
    }

    /// Bytes read from the stream of `peer` (ignored without a connection to it).
    pub fn handle_bytes(&mut self, now: Instant, peer: SocketAddr, bytes: &[u8]) {
        if let Some(conn) = self.connection_mut(peer) {
            conn.handle_bytes(now, bytes);
        }
    }

    /// The stream of `peer` ended (closed or reset by the peer, or refused).
    pub fn handle_eof(&mut self, peer: SocketAddr) {
        if let Some(conn) = self.connection_mut(peer) {
            conn.handle_eof();
        }
    }

    /// Handles the passing of time on every connection.
    pub fn handle_timeout(&mut self, now: Instant) {
        for conn in self.conns.values_mut().map(Connection::connection_mut) {
            if conn.poll_timeout().is_some_and(|t| t <= now) {
                conn.handle_timeout(now);
            }
        }
    }

    /// When [`StreamEndpoint::handle_timeout`] should next be called.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.conns
            .values()
            .filter_map(|c| c.connection().poll_timeout())
            .min()
    }

    /// What to do with the streams next.
    pub fn poll_transmit(&mut self) -> Option<StreamTransmit> {
        if self.out.is_empty() {
            self.collect();
        }
        self.out.pop_front()
    }

    /// Moves every connection's bytes and events out, and forgets closed connections.
    fn collect(&mut self) {
        let peers: Vec<SocketAddr> = self.conns.keys().copied().collect();
        for peer in peers {
            let Some(mut conn) = self.conns.remove(&peer) else {
                continue;
            };
            self.drain(peer, &mut conn);
            if !conn.connection().is_closed() {
                self.conns.insert(peer, conn);
            }
        }
    }

    /// Moves `conn`'s bytes and events out; a closed one's stream is closed after them.
    fn drain(&mut self, peer: SocketAddr, conn: &mut Connection) {
        while let Some(bytes) = conn.connection_mut().poll_transmit() {
            self.out.push_back(StreamTransmit::Data(peer, bytes));
        }
        self.events.extend(std::iter::from_fn(|| conn.poll_event()));
        if conn.connection().is_closed() {
            self.out.push_back(StreamTransmit::Close(peer));
        }
    }

    fn open(&mut self, peer: SocketAddr) -> Result<&mut Connection, SessionError> {
        self.conns
            .get_mut(&peer)
            .ok_or(SessionError::NotConnected(peer))
    }
}

/// `response` cut for `conn` ([`Session::slice`]): whole when it fits the peer's
/// Max-Message-Size and no block was asked for, else the block asked for of the
/// largest size that fits, BERT when both ends announced it.
fn slice_on(
    conn: &TcpConnection,
    asked: Option<BlockValue>,
    response: Message,
    limits: BlockLimits,
) -> Message {
    let whole = TcpMessage::from(response);
    let limit = conn.peer_max_message_size();
    if asked.is_none() && conn.frame_len(&whole) <= limit as usize {
        return Message::from(whole);
    }
    let room = conn
        .framing()
        .block_room(limit, &whole, opt::BLOCK2, opt::SIZE2);
    let size = BlockSize::fitting(room, conn.bert(), limits.szx, limits.max_bert_block)
        .unwrap_or(BlockSize::Szx(0));
    slice_asked(asked, Message::from(whole), size)
}

/// One connection with a known peer as a [`Session`]: what a driver that runs each
/// connection on its own (a task per accepted stream) gives the application. The
/// caller moves the bytes through [`Connection::connection_mut`] as for any
/// [`TcpConnection`]; requests, responses and notifications go through the session.
#[derive(Debug)]
pub struct Connection {
    peer: SocketAddr,
    conn: TcpConnection,
    events: VecDeque<SessionEvent>,
}

impl Connection {
    /// `conn`, the connection with `peer`.
    pub fn new(peer: SocketAddr, conn: TcpConnection) -> Connection {
        Connection {
            peer,
            conn,
            events: VecDeque::new(),
        }
    }

    /// The peer.
    pub fn peer(&self) -> SocketAddr {
        self.peer
    }

    /// The connection, to look at it.
    pub fn connection(&self) -> &TcpConnection {
        &self.conn
    }

    /// The connection, to move its bytes and for what only a connection does.
    pub fn connection_mut(&mut self) -> &mut TcpConnection {
        &mut self.conn
    }

    fn check(&self, peer: SocketAddr) -> Result<(), SessionError> {
        if peer == self.peer {
            Ok(())
        } else {
            Err(SessionError::NotConnected(peer))
        }
    }
}

impl Session for Connection {
    fn request(
        &mut self,
        now: Instant,
        peer: SocketAddr,
        request: Message,
    ) -> Result<Outbound, SessionError> {
        self.check(peer)?;
        let token = self
            .conn
            .request(now, request.into())
            .map_err(SessionError::Send)?;
        Ok(Outbound::Stream { peer, token })
    }

    fn respond(
        &mut self,
        now: Instant,
        id: Inbound,
        response: Message,
    ) -> Result<(), SessionError> {
        let Inbound::Stream { peer, token } = id else {
            return Err(SessionError::WrongSession);
        };
        self.check(peer)?;
        self.conn
            .respond(now, token, response.into())
            .map_err(SessionError::Send)
    }

    fn notify(
        &mut self,
        now: Instant,
        observation: &mut Observation,
        notification: Message,
        _confirmable: bool,
    ) -> Result<(), SessionError> {
        self.check(observation.peer)?;
        self.conn
            .notify(now, observation.token.clone(), notification.into())
            .map_err(SessionError::Send)
    }

    fn cancel(&mut self, _now: Instant, id: Outbound) {
        if let Outbound::Stream { peer, token } = id {
            if peer == self.peer {
                self.conn.cancel(token);
            }
        }
    }

    fn awaits_ack(&self, _observation: &Observation) -> bool {
        false
    }

    fn slice(
        &self,
        _peer: SocketAddr,
        asked: Option<BlockValue>,
        response: Message,
        limits: BlockLimits,
    ) -> Message {
        slice_on(&self.conn, asked, response, limits)
    }

    fn poll_event(&mut self) -> Option<SessionEvent> {
        if self.events.is_empty() {
            let event = self.conn.poll_event()?;
            self.events.extend(session_events(self.peer, event));
        }
        self.events.pop_front()
    }
}

/// The session's view of a connection event.
fn session_events(peer: SocketAddr, event: TcpEvent) -> Vec<SessionEvent> {
    match event {
        TcpEvent::Request { token, message } => vec![SessionEvent::Request {
            id: Inbound::Stream { peer, token },
            peer,
            request: message.into(),
        }],
        TcpEvent::Response { token, message } => vec![SessionEvent::Response {
            id: Outbound::Stream { peer, token },
            response: message.into(),
        }],
        TcpEvent::Closed {
            reason,
            outstanding,
        } => {
            let mut out: Vec<SessionEvent> = outstanding
                .iter()
                .map(|token| SessionEvent::Failed {
                    id: Outbound::Stream {
                        peer,
                        token: token.clone(),
                    },
                    peer,
                    reason: Failure::Closed(reason.clone()),
                })
                .collect();
            out.push(SessionEvent::Connection {
                peer,
                event: TcpEvent::Closed {
                    reason,
                    outstanding,
                },
            });
            out
        }
        event => vec![SessionEvent::Connection { peer, event }],
    }
}

impl Session for StreamEndpoint {
    fn request(
        &mut self,
        now: Instant,
        peer: SocketAddr,
        request: Message,
    ) -> Result<Outbound, SessionError> {
        self.opened(now, peer).request(now, peer, request)
    }

    fn respond(
        &mut self,
        now: Instant,
        id: Inbound,
        response: Message,
    ) -> Result<(), SessionError> {
        let Inbound::Stream { peer, .. } = id else {
            return Err(SessionError::WrongSession);
        };
        self.open(peer)?.respond(now, id, response)
    }

    fn notify(
        &mut self,
        now: Instant,
        observation: &mut Observation,
        notification: Message,
        confirmable: bool,
    ) -> Result<(), SessionError> {
        self.open(observation.peer)?
            .notify(now, observation, notification, confirmable)
    }

    fn cancel(&mut self, now: Instant, id: Outbound) {
        if let Outbound::Stream { peer, .. } = id {
            if let Ok(conn) = self.open(peer) {
                conn.cancel(now, id);
            }
        }
    }

    fn awaits_ack(&self, _observation: &Observation) -> bool {
        false
    }

    fn slice(
        &self,
        peer: SocketAddr,
        asked: Option<BlockValue>,
        response: Message,
        limits: BlockLimits,
    ) -> Message {
        match self.conns.get(&peer) {
            Some(conn) => conn.slice(peer, asked, response, limits),
            None => slice_asked(asked, response, BlockSize::Szx(limits.szx)),
        }
    }

    fn poll_event(&mut self) -> Option<SessionEvent> {
        if self.events.is_empty() {
            self.collect();
        }
        self.events.pop_front()
    }
}
