//! The one exchange path of the client, for every scheme: a [`Route`] is the server
//! and the transport that carries requests to it — the client's datagram driver
//! (`coap`, `coaps`) or a pooled connection (`coap+tcp`, `coaps+tcp`, `coap+ws`,
//! `coaps+ws`) — and both take the same [`Command`]s and answer through the same
//! exchange table (`runtime::exchanges`). Echo retry (RFC 9175), Block1 uploads and
//! Block2 downloads (RFC 7959, BERT over connections) are written once over it, and
//! every message of it passes the client's layers ([`Layer::on_send`],
//! [`Layer::on_receive`]).
//!
//! [`Layer::on_send`]: crate::server::Layer::on_send
//! [`Layer::on_receive`]: crate::server::Layer::on_receive

use super::blockwise::{fetch_rest_via, upload_via};
use super::hooks::{ClientLayers, Exchange};
use crate::runtime::command::{Command, ReplyTo};
use crate::runtime::notifications;
use crate::server::Response;
use crate::transport::tcp::{TcpPool, DEFAULT_RESPONSE_TIMEOUT};
use crate::{Error, Result};
use cobalt_proto::blockwise::{BlockSize, MAX_UDP_SZX};
use cobalt_proto::message::{opt, Code, Message};
use cobalt_proto::uri::Scheme;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};

/// The callers' names for their requests, unique in the process (so in every
/// transport's exchange table).
static NEXT_KEY: AtomicU64 = AtomicU64::new(1);

fn next_key() -> u64 {
    NEXT_KEY.fetch_add(1, Ordering::Relaxed)
}

/// The transport of a [`Route`].
#[derive(Debug, Clone)]
enum Via {
    /// The client's datagram driver for the server's address family (with DTLS when
    /// the client handle has credentials for it).
    Driver(mpsc::UnboundedSender<Command>),
    /// The pooled connection to the server; `host` is the URI's host, named in the
    /// WebSocket upgrade request's `Host` header.
    Pool {
        /// The pool of the URI's scheme (and credentials).
        pool: Arc<TcpPool>,
        /// The URI's host (shared: a route is cloned into every observation).
        host: Arc<str>,
    },
}

/// A server and the transport that carries requests to it. See the
/// [module documentation](self).
#[derive(Debug, Clone)]
pub(crate) struct Route {
    peer: SocketAddr,
    via: Via,
    /// The URI's scheme.
    scheme: Scheme,
    /// The client's layers (none: nothing more per message).
    layers: ClientLayers,
}

impl Route {
    /// Requests to `peer` over `scheme` through a client's datagram driver (its
    /// `commands`), passing `layers` (with the options they declare).
    pub(crate) fn datagram(
        commands: mpsc::UnboundedSender<Command>,
        peer: SocketAddr,
        scheme: Scheme,
        layers: ClientLayers,
    ) -> Route {
        Route {
            peer,
            via: Via::Driver(commands),
            scheme,
            layers,
        }
    }

    /// Requests to `peer` (named `host` in the URI) over `scheme` on a connection of
    /// `pool`, passing `layers` (with the options they declare).
    pub(crate) fn stream(
        peer: SocketAddr,
        pool: Arc<TcpPool>,
        host: String,
        scheme: Scheme,
        layers: ClientLayers,
    ) -> Route {
        Route {
            peer,
            via: Via::Pool {
                pool,
                host: host.into(),
            },
            scheme,
            layers,
        }
    }

    /// The server.
    pub(crate) fn peer(&self) -> SocketAddr {
        self.peer
    }

    /// Whether requests go over a connection (which delivers in order, and can be
    /// lost and opened again) rather than datagrams.
    pub(crate) fn is_stream(&self) -> bool {
        matches!(self.via, Via::Pool { .. })
    }

    /// How long a request may take when the caller sets no timeout: over a connection
    /// there are no retransmissions to end it, so only this ends a stalled server's.
    pub(crate) fn default_timeout(&self) -> Option<Duration> {
        self.is_stream().then_some(DEFAULT_RESPONSE_TIMEOUT)
    }

    /// Hands `command` to the transport (opening a connection if needed); `None` when
    /// the transport closed before taking it (a connection's caller may try once more,
    /// and gets a new one).
    fn send(&self, command: Command) -> Option<mpsc::UnboundedSender<Command>> {
        match &self.via {
            Via::Driver(commands) => commands.send(command).ok().map(|()| commands.clone()),
            Via::Pool { pool, host } => pool.send(self.peer, host, command).ok(),
        }
    }

    /// The error of a command the transport closed before carrying out.
    pub(crate) fn closed(&self) -> Error {
        match &self.via {
            Via::Driver(_) => Error::Shutdown,
            Via::Pool { pool, .. } => pool.closed_before_send(self.peer),
        }
    }

    /// One request/response exchange. A 4.01 carrying an Echo option (a server's
    /// amplification check, RFC 9175 §2.4) is answered transparently by repeating the
    /// request once with that Echo value.
    pub(crate) async fn exchange(&self, message: Message) -> Result<Message> {
        let first = self.exchange_once(message.clone()).await?;
        match echo_challenge(&message, &first) {
            Some(retry) => self.exchange_once(retry).await,
            None => Ok(first),
        }
    }

    /// Sends `message` through the layers and waits for its response, which passes
    /// them back.
    async fn exchange_once(&self, mut message: Message) -> Result<Message> {
        let mut sent = self.pass_out(&mut message)?;
        let mut response = self.carry(message).await?;
        self.receive(sent.as_mut(), &mut response)?;
        Ok(response)
    }

    /// Runs the layers' send hooks on `request` in a new exchange: what they keep
    /// for its answers (`None` without layers: nothing is allocated).
    fn pass_out(&self, request: &mut Message) -> Result<Option<Sent>> {
        if self.layers.is_empty() {
            return Ok(None);
        }
        let mut exchange = Exchange::new(self.peer, self.scheme);
        self.layers.send(&mut exchange, request)?;
        Ok(Some(Sent {
            exchange,
            request: request.clone(),
        }))
    }

    /// Rejects an answer that carries a critical option neither the protocol nor a
    /// layer recognizes (RFC 7252 §5.4.1).
    fn check_options(&self, response: &Message) -> Result<()> {
        match response
            .options
            .first_bad_critical_except(self.layers.handled())
        {
            Some(number) => Err(Error::BadResponseOption {
                peer: self.peer,
                number,
            }),
            None => Ok(()),
        }
    }

    /// Checks `response` (an answer or a notification) to the request `sent` (`None`:
    /// no layers) and runs the layers' receive hooks on it.
    pub(crate) fn receive(&self, sent: Option<&mut Sent>, response: &mut Message) -> Result<()> {
        self.check_options(response)?;
        match sent {
            Some(sent) => self
                .layers
                .receive(&mut sent.exchange, &sent.request, response),
            None => Ok(()),
        }
    }

    /// Sends `message` and waits for its response; a transport that closes before
    /// carrying it out (a connection's idle Release, a server restart) gets one more
    /// try on a new one.
    async fn carry(&self, message: Message) -> Result<Message> {
        for _ in 0..2 {
            let key = next_key();
            let (tx, rx) = oneshot::channel();
            let request = Command::Request {
                key,
                peer: self.peer,
                message: message.clone(),
                reply: ReplyTo::Once(tx),
            };
            let Some(commands) = self.send(request) else {
                continue;
            };
            let guard = CancelGuard::new(commands, key);
            let answer = rx.await;
            guard.disarm();
            if let Ok(result) = answer {
                return result;
            }
        }
        Err(self.closed())
    }

    /// Sends `request` (a registration: Observe=0) through the layers, its responses
    /// and notifications going to `answers`, and returns the guard that ends the
    /// relation when dropped, and the registration as it left the layers (`None`
    /// without layers). What arrives has not passed the layers yet
    /// ([`Route::receive`]).
    pub(crate) fn observe(
        &self,
        mut request: Message,
        answers: notifications::Sender<Result<Message>>,
    ) -> Result<(CancelGuard, Option<Sent>)> {
        let sent = self.pass_out(&mut request)?;
        let key = next_key();
        let register = Command::Request {
            key,
            peer: self.peer,
            message: request,
            reply: ReplyTo::Stream(answers),
        };
        let commands = self.send(register).ok_or_else(|| self.closed())?;
        Ok((CancelGuard::new(commands, key), sent))
    }

    /// Ends the observation `guard` keeps with `message` (a GET with Observe=1, RFC
    /// 7641 §3.6) and returns the server's answer; both pass the layers.
    pub(crate) async fn deregister(
        &self,
        guard: CancelGuard,
        mut message: Message,
    ) -> Result<Message> {
        let mut sent = self.pass_out(&mut message)?;
        let (tx, rx) = oneshot::channel();
        guard
            .commands
            .as_ref()
            .ok_or_else(|| self.closed())?
            .send(Command::Deregister {
                key: guard.key,
                peer: self.peer,
                message,
                reply: ReplyTo::Once(tx),
            })
            .map_err(|_| self.closed())?;
        // Armed until the answer: dropping this future forgets the deregistration.
        let answer = rx.await;
        guard.disarm();
        let mut answer = answer.map_err(|_| self.closed())??;
        self.receive(sent.as_mut(), &mut answer)?;
        Ok(answer)
    }

    /// Sends `message` and waits for the whole response: a body larger than one block
    /// (of `asked`, an SZX the caller chose, or of the largest size the transport
    /// takes) goes up in Block1 blocks, and a response in Block2 blocks is fetched
    /// block by block (RFC 7959; BERT over connections whose both ends announced it).
    pub(crate) async fn send_whole(&self, message: Message, asked: Option<u8>) -> Result<Response> {
        let (first, rest) = match self.upload_size(&message, asked).await? {
            Some(size) => upload_via(message, size, |req| self.exchange(req)).await?,
            None => (self.exchange(message.clone()).await?, message),
        };
        self.fetch_rest(rest, first).await
    }

    /// The block size to upload `request`'s body in, `None` when it goes whole.
    async fn upload_size(&self, request: &Message, asked: Option<u8>) -> Result<Option<BlockSize>> {
        match &self.via {
            Via::Driver(_) => {
                let size = BlockSize::Szx(asked.unwrap_or(MAX_UDP_SZX));
                Ok((request.payload.len() > size.bytes()).then_some(size))
            }
            Via::Pool { pool, host } => pool.upload_size(self.peer, host, request, asked).await,
        }
    }

    /// Completes a representation whose first block is `first`, asking with `request`
    /// (without Observe) for the following blocks.
    pub(crate) async fn fetch_rest(&self, request: Message, first: Message) -> Result<Response> {
        let bert = match &self.via {
            Via::Driver(_) => false,
            Via::Pool { pool, .. } => pool.config().block_wise_transfer,
        };
        fetch_rest_via(request, first, bert, |req| self.exchange(req)).await
    }
}

/// A request as it left the client's layers, and what they keep for its answers.
#[derive(Debug)]
pub(crate) struct Sent {
    /// What the layers see of the exchange.
    pub exchange: Exchange,
    /// The request as it went out.
    pub request: Message,
}

/// The request to repeat if `response` is an Echo challenge to `request` not yet
/// answered with an Echo.
pub(crate) fn echo_challenge(request: &Message, response: &Message) -> Option<Message> {
    if response.code != Code::UNAUTHORIZED || request.options.contains(opt::ECHO) {
        return None;
    }
    let echo = response.options.get(opt::ECHO)?;
    let mut retry = request.clone();
    retry.options.set(opt::ECHO, echo);
    Some(retry)
}

/// Tells the transport to forget a request (or end an observation) when the caller
/// stops waiting for it: dropped while armed, it sends [`Command::Cancel`].
#[derive(Debug)]
pub(crate) struct CancelGuard {
    /// Where the cancellation goes; `None` once disarmed (16 bytes a guard with
    /// the key, where a flag of its own took 24: every observation holds one).
    commands: Option<mpsc::UnboundedSender<Command>>,
    key: u64,
}

impl CancelGuard {
    /// Guards request `key`, sent on `commands`.
    fn new(commands: mpsc::UnboundedSender<Command>, key: u64) -> CancelGuard {
        CancelGuard {
            commands: Some(commands),
            key,
        }
    }

    /// The request has ended: nothing to cancel.
    fn disarm(mut self) {
        self.commands = None;
    }
}

impl Drop for CancelGuard {
    fn drop(&mut self) {
        if let Some(commands) = &self.commands {
            let _ = commands.send(Command::Cancel { key: self.key });
        }
    }
}
