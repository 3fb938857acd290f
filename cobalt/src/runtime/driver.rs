//! One shard: a thread with a current-thread tokio runtime that owns a UDP socket and
//! an [`Endpoint`]. Datagrams go socket → endpoint → inline handler → endpoint →
//! socket without changing threads; only handlers that are not ready on their first
//! poll become tasks (on the same thread), whose responses come back via a queue.

use crate::server::tree::ResourceTree;
use crate::server::{Request, Response};
use crate::Error;
use cobalt_proto::blockwise::{Block1Assembler, Block1Outcome, KEY_OPTIONS};
use cobalt_proto::endpoint::{Endpoint, EndpointConfig, Event, ExchangeId, RequestId};
use cobalt_proto::message::{opt, BlockValue, Code, Message};
use futures_util::FutureExt;
use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};
use tokio::net::UdpSocket;
use tokio::sync::{mpsc, oneshot};

/// Where the result of a client request goes.
pub(crate) enum ReplyTo {
    /// A single response.
    Once(oneshot::Sender<Result<Message, Error>>),
    /// Every response (observe notifications) until cancelled.
    Stream(mpsc::UnboundedSender<Result<Message, Error>>),
}

/// What the application asks of a shard.
pub(crate) enum Command {
    /// Send a request; `key` lets the caller cancel it.
    Request {
        key: u64,
        peer: SocketAddr,
        message: Message,
        reply: ReplyTo,
    },
    /// Forget a request (timeout in the caller, dropped observation).
    Cancel { key: u64 },
    /// Stop: answer what is in progress (up to the grace period), then exit.
    Shutdown { grace: Duration },
}

/// Largest UDP payload.
const MAX_DATAGRAM: usize = 65_535;
/// Datagrams read per wake-up before other work gets a turn.
const RECV_BATCH: usize = 64;
/// Largest request body a server shard reassembles from Block1 blocks.
const MAX_UPLOAD: usize = 1 << 20;
/// Block1 uploads in progress per shard.
const MAX_UPLOADS: usize = 256;
/// An upload without a new block for this long is dropped (EXCHANGE_LIFETIME).
const UPLOAD_LIFETIME: Duration = Duration::from_secs(247);

/// Sees every datagram a driver sends (`true`) or receives (`false`); for `cobalt -v`.
pub type Tracer = Arc<dyn Fn(bool, SocketAddr, &[u8]) + Send + Sync>;

pub(crate) struct Driver {
    tracer: Option<Tracer>,
    socket: UdpSocket,
    endpoint: Endpoint,
    tree: Option<Arc<ResourceTree>>,
    commands: mpsc::UnboundedReceiver<Command>,
    late_tx: mpsc::UnboundedSender<(ExchangeId, Response, BlockContext)>,
    late_rx: mpsc::UnboundedReceiver<(ExchangeId, Response, BlockContext)>,
    waiting: HashMap<RequestId, (u64, SocketAddr, ReplyTo)>,
    keys: HashMap<u64, RequestId>,
    draining: Option<Instant>,
    buf: Vec<u8>,
    uploads: Block1Assembler,
}

impl Driver {
    pub(crate) fn new(
        socket: UdpSocket,
        config: EndpointConfig,
        tree: Option<Arc<ResourceTree>>,
        commands: mpsc::UnboundedReceiver<Command>,
    ) -> Driver {
        let (late_tx, late_rx) = mpsc::unbounded_channel();
        Driver {
            tracer: None,
            socket,
            endpoint: Endpoint::new(config, Instant::now()),
            tree,
            commands,
            late_tx,
            late_rx,
            waiting: HashMap::new(),
            keys: HashMap::new(),
            draining: None,
            buf: vec![0; MAX_DATAGRAM],
            uploads: Block1Assembler::new(MAX_UPLOAD, MAX_UPLOADS, UPLOAD_LIFETIME),
        }
    }

    /// Runs until shut down (server) or until every client handle is gone (client).
    pub(crate) async fn run(mut self) {
        let mut commands_open = true;
        loop {
            self.process_events();
            self.flush().await;
            if let Some(deadline) = self.draining {
                let busy = self.endpoint.state_counts().server_exchanges > 0;
                if !busy || Instant::now() >= deadline {
                    break;
                }
            }
            if !commands_open && self.waiting.is_empty() && self.tree.is_none() {
                break;
            }
            let timeout = self.endpoint.poll_timeout();
            let sleep = async {
                match timeout {
                    Some(t) => tokio::time::sleep_until(t.into()).await,
                    None => std::future::pending().await,
                }
            };
            let drain_deadline = async {
                match self.draining {
                    Some(t) => tokio::time::sleep_until(t.into()).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                r = self.socket.recv_from(&mut self.buf), if self.draining.is_none() => {
                    if let Ok((n, peer)) = r {
                        let now = Instant::now();
                        self.received(now, peer, n);
                        for _ in 1..RECV_BATCH {
                            match self.socket.try_recv_from(&mut self.buf) {
                                Ok((n, peer)) => self.received(now, peer, n),
                                Err(_) => break,
                            }
                        }
                    }
                }
                cmd = self.commands.recv(), if commands_open => match cmd {
                    Some(cmd) => self.command(cmd),
                    None => commands_open = false,
                },
                Some((id, resp, blocks)) = self.late_rx.recv() => {
                    let now = Instant::now();
                    let resp = blocks.finish(&mut self.uploads, now, resp);
                    let _ = self.endpoint.respond(now, id, resp);
                }
                _ = sleep => self.endpoint.handle_timeout(Instant::now()),
                _ = drain_deadline => {}
            }
        }
        for (_, (_, _, reply)) in self.waiting.drain() {
            send_reply(reply, Err(Error::Shutdown));
        }
    }

    fn received(&mut self, now: Instant, peer: SocketAddr, len: usize) {
        if let Some(t) = &self.tracer {
            t(false, peer, &self.buf[..len]);
        }
        self.endpoint.handle_datagram(now, peer, &self.buf[..len]);
    }

    fn command(&mut self, cmd: Command) {
        let now = Instant::now();
        match cmd {
            Command::Request {
                key,
                peer,
                message,
                reply,
            } => match self.endpoint.request(now, peer, message) {
                Ok(id) => {
                    self.keys.insert(key, id);
                    self.waiting.insert(id, (key, peer, reply));
                }
                Err(_) => send_reply(reply, Err(Error::TooManyRequests)),
            },
            Command::Cancel { key } => {
                if let Some(id) = self.keys.remove(&key) {
                    self.waiting.remove(&id);
                    self.endpoint.cancel(now, id);
                }
            }
            Command::Shutdown { grace } => self.draining = Some(now + grace),
        }
    }

    fn process_events(&mut self) {
        while let Some(ev) = self.endpoint.poll_event() {
            match ev {
                Event::Request { id, peer, request } => self.serve(id, peer, request),
                Event::Response { id, response } => self.deliver(id, response),
                Event::Timeout {
                    id,
                    retransmissions,
                } => self.fail(id, |peer| Error::Timeout {
                    peer,
                    retransmissions,
                }),
                Event::Reset { id } => self.fail(id, Error::Reset),
                Event::ResponseFailed { id, reason } => {
                    tracing::debug!(?id, ?reason, "separate response not delivered");
                }
            }
        }
    }

    fn deliver(&mut self, id: RequestId, response: Message) {
        let observing = match self.waiting.get(&id) {
            Some((_, _, ReplyTo::Stream(tx))) => {
                let delivered = tx.send(Ok(response)).is_ok();
                if !delivered {
                    // The observer went away: end the relation.
                    self.endpoint.cancel(Instant::now(), id);
                }
                delivered && self.endpoint.is_request_active(id)
            }
            Some((_, _, ReplyTo::Once(_))) => {
                if let Some((key, _, reply)) = self.waiting.remove(&id) {
                    self.keys.remove(&key);
                    send_reply(reply, Ok(response));
                }
                return;
            }
            None => return,
        };
        if !observing {
            // Final response of a stream (or the receiver is gone): dropping the sender ends it.
            if let Some((key, _, _)) = self.waiting.remove(&id) {
                self.keys.remove(&key);
            }
        }
    }

    fn fail(&mut self, id: RequestId, err: impl FnOnce(SocketAddr) -> Error) {
        if let Some((key, peer, reply)) = self.waiting.remove(&id) {
            self.keys.remove(&key);
            send_reply(reply, Err(err(peer)));
        }
    }

    /// Runs the handler inline; only a handler that is not ready at once becomes a task.
    fn serve(&mut self, id: ExchangeId, peer: SocketAddr, request: Message) {
        let now = Instant::now();
        let Some(tree) = &self.tree else {
            let _ = self
                .endpoint
                .respond(now, id, Response::new(Code::NOT_FOUND).into_message());
            return;
        };
        let (request, block1) = match self.uploads.offer(now, peer, request) {
            Block1Outcome::Complete { request, ack } => (request, ack),
            Block1Outcome::Answer(resp) => {
                let _ = self.endpoint.respond(now, id, resp);
                return;
            }
        };
        let blocks = BlockContext::of(peer, &request, block1);
        let fut = match tree.dispatch(Request::new(peer, request)) {
            Ok(fut) => fut,
            Err(resp) => {
                let resp = blocks.finish(&mut self.uploads, now, resp);
                let _ = self.endpoint.respond(now, id, resp);
                return;
            }
        };
        let mut fut = AssertUnwindSafe(fut).catch_unwind();
        let first = poll_once(&mut fut);
        match first {
            Some(result) => {
                let resp = result.unwrap_or_else(|_| handler_panicked());
                let resp = blocks.finish(&mut self.uploads, now, resp);
                let _ = self.endpoint.respond(now, id, resp);
            }
            None => {
                let late = self.late_tx.clone();
                tokio::spawn(async move {
                    let resp = fut.await.unwrap_or_else(|_| handler_panicked());
                    let _ = late.send((id, resp, blocks));
                });
            }
        }
    }

    async fn flush(&mut self) {
        while let Some(tx) = self.endpoint.poll_transmit() {
            if let Some(t) = &self.tracer {
                t(true, tx.peer, &tx.bytes);
            }
            match self.socket.try_send_to(&tx.bytes, tx.peer) {
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    if let Err(e) = self.socket.send_to(&tx.bytes, tx.peer).await {
                        tracing::debug!(peer = %tx.peer, error = %e, "send failed");
                    }
                }
                Err(e) => tracing::debug!(peer = %tx.peer, error = %e, "send failed"),
            }
        }
    }
}

/// What a response needs from its request to be cut into Block2 blocks (and, after a
/// Block1 upload, to acknowledge the last block and keep the whole response).
struct BlockContext {
    peer: SocketAddr,
    request: Message,
    /// The last Block1 block of an upload, acknowledged in the response (RFC 7959 §2.3).
    block1: Option<BlockValue>,
}

impl BlockContext {
    fn of(peer: SocketAddr, request: &Message, block1: Option<BlockValue>) -> BlockContext {
        // Only Block2 matters, and after an upload the options that identify it; keep
        // the copy small.
        let mut m = Message::new(request.mtype, request.code, request.mid);
        for o in request.options.iter() {
            let upload_key = block1.is_some() && KEY_OPTIONS.contains(&o.number);
            if o.number == opt::BLOCK2 || upload_key {
                m.options.push(o.number, o.value.clone());
            }
        }
        BlockContext {
            peer,
            request: m,
            block1,
        }
    }

    fn finish(&self, uploads: &mut Block1Assembler, now: Instant, response: Response) -> Message {
        uploads.finish(
            now,
            self.peer,
            &self.request,
            self.block1,
            response.into_message(),
        )
    }
}

fn handler_panicked() -> Response {
    tracing::error!("request handler panicked; answering 5.00");
    Response::new(Code::INTERNAL_SERVER_ERROR)
}

fn send_reply(reply: ReplyTo, result: Result<Message, Error>) {
    match reply {
        ReplyTo::Once(tx) => {
            let _ = tx.send(result);
        }
        ReplyTo::Stream(tx) => {
            let _ = tx.send(result);
        }
    }
}

/// Polls a future once with a no-op waker; `None` if it is not ready.
fn poll_once<F: Future + Unpin>(fut: &mut F) -> Option<F::Output> {
    let waker = std::task::Waker::noop();
    let mut cx = std::task::Context::from_waker(waker);
    match std::pin::Pin::new(fut).poll(&mut cx) {
        Poll::Ready(v) => Some(v),
        Poll::Pending => None,
    }
}

/// Starts a driver on its own thread with a current-thread runtime.
pub(crate) fn spawn_driver(
    name: String,
    socket: std::net::UdpSocket,
    config: EndpointConfig,
    tree: Option<Arc<ResourceTree>>,
    tracer: Option<Tracer>,
) -> std::io::Result<(mpsc::UnboundedSender<Command>, std::thread::JoinHandle<()>)> {
    let (tx, rx) = mpsc::unbounded_channel();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let handle = std::thread::Builder::new().name(name).spawn(move || {
        rt.block_on(async move {
            match UdpSocket::from_std(socket) {
                Ok(socket) => {
                    let mut driver = Driver::new(socket, config, tree, rx);
                    driver.tracer = tracer;
                    driver.run().await
                }
                Err(e) => tracing::error!(error = %e, "cannot register socket"),
            }
        })
    })?;
    Ok((tx, handle))
}
