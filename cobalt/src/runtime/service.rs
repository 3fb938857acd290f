//! What a driver serves: the application side (the server role: resources, uploads,
//! observe relations), seen by the driver as events in and work out. A driver owns the
//! transport and the clock and hands the service its protocol [`Session`]: a datagram
//! shard's driver its socket's [`Endpoint`](cobalt_proto::endpoint::Endpoint), a
//! stream connection's driver its
//! [`Connection`](cobalt_proto::session::stream::Connection). The service is written
//! once against the session surface and runs behind either.

use super::command::Command;
use crate::changes::ChangeInbox;
use crate::metrics::ShardSnapshot;
use crate::transport::identity::Credential;
use cobalt_proto::message::Message;
use cobalt_proto::session::{Inbound, Session, SessionEvent};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::mpsc;

/// The application side of a driver over the session `S`. Every method runs on the
/// driver's thread or task, between its turns of reading and sending.
pub(crate) trait Service<S: Session>: 'static {
    /// Work finished off the driver's loop (a handler that became a task), sent back
    /// through the sender the service was made with and handed to
    /// [`Service::on_completion`].
    type Completion: Send + 'static;

    /// A new request from the session, from `peer`, who proved `credential` in its
    /// DTLS or TLS handshake (if any).
    fn on_request(
        &mut self,
        session: &mut S,
        now: Instant,
        id: Inbound,
        peer: SocketAddr,
        credential: Option<&Arc<Credential>>,
        request: Message,
    );
    /// Work sent back to the driver came back.
    fn on_completion(&mut self, session: &mut S, now: Instant, done: Self::Completion);
    /// Another event of the session that concerns what the service sent (an
    /// undelivered confirmable notification, an RST, a withheld answer).
    fn on_event(&mut self, event: SessionEvent);
    /// Where the application posts changes that the service should act on.
    fn changes(&self) -> Arc<ChangeInbox>;
    /// Takes the changes posted to [`Service::changes`].
    fn take_changes(&mut self);
    /// Whether [`Service::step`] has something to send.
    fn has_work(&self) -> bool;
    /// Sends a bounded amount of the work waiting (one turn of the loop).
    fn step(&mut self, session: &mut S, now: Instant);
    /// Messages from `peers` were handled in the batch just read.
    fn on_heard(&mut self, session: &S, peers: &[SocketAddr]);
    /// The peer at `from` is at `to` now (a DTLS session moved by its Connection ID;
    /// the session has moved its own state already): what the service keeps of it
    /// by address moves too.
    fn on_moved(&mut self, from: SocketAddr, to: SocketAddr) {
        let _ = (from, to);
    }
    /// The next time [`Service::handle_timeout`] has something to do.
    fn poll_timeout(&self) -> Option<Instant>;
    /// Runs what is due at `now`.
    fn handle_timeout(&mut self, now: Instant);
    /// Whether work handed off the loop has still to come back.
    fn busy(&self) -> bool;
    /// Observe relations held (for metrics).
    fn observer_count(&self) -> usize;
    /// Adds the service's counters to the shard's metrics snapshot.
    fn report(&self, snapshot: ShardSnapshot) -> ShardSnapshot;
}

/// What a datagram shard's service is made with, on the shard's thread.
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
pub(crate) type MakeService<S, T> =
    Box<dyn FnOnce(ServiceLinks<<S as Service<T>>::Completion>) -> S + Send>;

/// The service of a client-only driver: there is none (the driver answers requests
/// 4.04 itself).
pub(crate) enum NoService {}

impl<S: Session> Service<S> for NoService {
    type Completion = std::convert::Infallible;

    fn on_request(
        &mut self,
        _: &mut S,
        _: Instant,
        _: Inbound,
        _: SocketAddr,
        _: Option<&Arc<Credential>>,
        _: Message,
    ) {
        match *self {}
    }
    fn on_completion(&mut self, _: &mut S, _: Instant, _: Self::Completion) {
        match *self {}
    }
    fn on_event(&mut self, _: SessionEvent) {
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
    fn step(&mut self, _: &mut S, _: Instant) {
        match *self {}
    }
    fn on_heard(&mut self, _: &S, _: &[SocketAddr]) {
        match *self {}
    }
    fn poll_timeout(&self) -> Option<Instant> {
        match *self {}
    }
    fn handle_timeout(&mut self, _: Instant) {
        match *self {}
    }
    fn busy(&self) -> bool {
        match *self {}
    }
    fn observer_count(&self) -> usize {
        match *self {}
    }
    fn report(&self, _: ShardSnapshot) -> ShardSnapshot {
        match *self {}
    }
}
