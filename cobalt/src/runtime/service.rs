//! What a driver serves: the application side (the server role: resources, uploads,
//! observe relations), seen by the driver as events in and work out. A datagram
//! shard's driver owns the socket, the endpoint and the clock, and a [`Service`] what
//! the application keeps per shard; a stream connection's driver owns the link and the
//! RFC 8323 connection, and a [`StreamService`] what the application keeps per
//! connection.

use super::command::Command;
use crate::changes::ChangeInbox;
use crate::metrics::ShardSnapshot;
use cobalt_proto::endpoint::{Endpoint, ExchangeId};
use cobalt_proto::message::{Message, TcpMessage, Token};
use cobalt_proto::tcp_connection::TcpConnection;
use futures_util::stream::FuturesUnordered;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::mpsc;

/// The application side of a datagram shard. Every method runs on the shard's thread,
/// between the driver's turns of reading the socket and sending.
pub(crate) trait Service: 'static {
    /// Work finished off the shard's loop (a handler that became a task), sent back
    /// through [`ServiceLinks::done`] and handed to [`Service::on_completion`].
    type Completion: Send + 'static;

    /// A new request from the endpoint.
    fn on_request(
        &mut self,
        ep: &mut Endpoint,
        now: Instant,
        id: ExchangeId,
        peer: SocketAddr,
        request: Message,
    );
    /// Work sent to [`ServiceLinks::done`] came back.
    fn on_completion(&mut self, ep: &mut Endpoint, now: Instant, done: Self::Completion);
    /// Where the application posts changes that the service should act on.
    fn changes(&self) -> Arc<ChangeInbox>;
    /// Takes the changes posted to [`Service::changes`].
    fn take_changes(&mut self);
    /// Whether [`Service::step`] has something to send.
    fn has_work(&self) -> bool;
    /// Sends a bounded amount of the work waiting (one turn of the loop).
    fn step(&mut self, ep: &mut Endpoint, now: Instant);
    /// Datagrams from `peers` were handled in the batch just read.
    fn on_heard(&mut self, ep: &Endpoint, peers: &[SocketAddr]);
    /// The next time [`Service::handle_timeout`] has something to do.
    fn poll_timeout(&self) -> Option<Instant>;
    /// Runs what is due at `now`.
    fn handle_timeout(&mut self, now: Instant);
    /// A confirmable response or notification was not acknowledged.
    fn on_delivery_failed(&mut self, id: ExchangeId);
    /// A peer answered a message the endpoint no longer knows with RST.
    fn on_unmatched_reset(&mut self, peer: SocketAddr, mid: u16);
    /// The endpoint withheld an answer to `peer` for `token`: its address is not verified.
    fn on_unverified(&mut self, peer: SocketAddr, token: Token);
    /// Observe relations held (for metrics).
    fn observer_count(&self) -> usize;
    /// Adds the service's counters to the shard's metrics snapshot.
    fn report(&self, snapshot: ShardSnapshot) -> ShardSnapshot;
}

/// What a service is made with, on its shard's thread.
pub(crate) struct ServiceLinks<C> {
    /// Where work finished off the loop goes back to the shard.
    pub done: mpsc::UnboundedSender<C>,
    /// The shard's own command queue (so that requests its handlers make go out on the
    /// shard's socket and their answers come back to it).
    pub commands: mpsc::UnboundedSender<Command>,
    /// Whether the shard's socket is IPv6.
    pub v6: bool,
}

/// Makes a shard's service on the shard's thread.
pub(crate) type MakeService<S> =
    Box<dyn FnOnce(ServiceLinks<<S as Service>::Completion>) -> S + Send>;

/// The service of a client-only driver: there is none (the driver answers requests
/// 4.04 itself).
pub(crate) enum NoService {}

impl Service for NoService {
    type Completion = std::convert::Infallible;

    fn on_request(
        &mut self,
        _: &mut Endpoint,
        _: Instant,
        _: ExchangeId,
        _: SocketAddr,
        _: Message,
    ) {
        match *self {}
    }
    fn on_completion(&mut self, _: &mut Endpoint, _: Instant, _: Self::Completion) {
        match *self {}
    }
    fn changes(&self) -> Arc<ChangeInbox> {
        match *self {}
    }
    fn take_changes(&mut self) {
        match *self {}
    }
    fn has_work(&self) -> bool {
        match *self {}
    }
    fn step(&mut self, _: &mut Endpoint, _: Instant) {
        match *self {}
    }
    fn on_heard(&mut self, _: &Endpoint, _: &[SocketAddr]) {
        match *self {}
    }
    fn poll_timeout(&self) -> Option<Instant> {
        match *self {}
    }
    fn handle_timeout(&mut self, _: Instant) {
        match *self {}
    }
    fn on_delivery_failed(&mut self, _: ExchangeId) {
        match *self {}
    }
    fn on_unmatched_reset(&mut self, _: SocketAddr, _: u16) {
        match *self {}
    }
    fn on_unverified(&mut self, _: SocketAddr, _: Token) {
        match *self {}
    }
    fn observer_count(&self) -> usize {
        match *self {}
    }
    fn report(&self, _: ShardSnapshot) -> ShardSnapshot {
        match *self {}
    }
}

/// Work a [`StreamService`] started and the connection's driver runs to completion
/// (handlers on the connection's task, or waiting for a pool or thread to finish).
pub(crate) type Work<C> = FuturesUnordered<Pin<Box<dyn Future<Output = C> + Send>>>;

/// The application side of one stream connection (`coap+tcp`, `coap+ws`, with or
/// without TLS). Every method runs on the connection's task; the driver calls
/// [`StreamService::on_changes`] whenever [`StreamService::changes`] wakes, and waits
/// for the [`Work`] to finish before a graceful close.
pub(crate) trait StreamService: Send + 'static {
    /// What a piece of [`Work`] ends with.
    type Completion: Send + 'static;

    /// A request from the peer.
    fn on_request(
        &mut self,
        conn: &mut TcpConnection,
        work: &mut Work<Self::Completion>,
        token: Token,
        message: TcpMessage,
    );
    /// A piece of [`Work`] finished.
    fn on_completion(
        &mut self,
        conn: &mut TcpConnection,
        work: &mut Work<Self::Completion>,
        done: Self::Completion,
    );
    /// Where the application posts changes this connection should act on.
    fn changes(&self) -> Arc<ChangeInbox>;
    /// Acts on the changes posted to [`StreamService::changes`].
    fn on_changes(&mut self, conn: &mut TcpConnection, work: &mut Work<Self::Completion>);
    /// Observe relations held on the connection (for its log line when it closes).
    fn relations(&self) -> usize;
}
