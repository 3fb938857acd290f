//! CoAP over TCP (RFC 8323, `coap+tcp://`): the server's listener, one task per
//! accepted connection, and the client's pool of connections, one per origin.
//!
//! Every connection is driven by the sans-IO [`TcpConnection`] of `cobalt-proto`: the
//! tasks here only move bytes between it and a tokio [`TcpStream`], run the request
//! handlers of the [`ResourceTree`] and hand responses to waiting clients.

use crate::server::tree::ResourceTree;
use crate::server::{Request, Response, ServerLimits};
use crate::{Error, Result};
use cobalt_proto::blockwise::slice_response;
use cobalt_proto::message::{Code, Message, MessageType, TcpMessage, Token};
use cobalt_proto::tcp_connection::{CloseReason, TcpConfig, TcpConnection, TcpEvent};
use futures_util::stream::FuturesUnordered;
use futures_util::{FutureExt, StreamExt};
use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot, watch, Semaphore};
use tokio::task::JoinSet;

/// Limits of the TCP side of a server. `Default` gives the documented defaults.
#[derive(Debug, Clone, PartialEq)]
pub struct TcpServerLimits {
    /// Connections served at once; further connections are sent an Abort and closed.
    /// Default 1,024.
    pub max_connections: usize,
    /// Per-connection protocol settings: Max-Message-Size, CSM/frame/idle timeouts,
    /// concurrent requests per connection.
    pub connection: TcpConfig,
    /// How long a write may block (a peer that does not read) before the connection is
    /// dropped. Default 30 s.
    pub write_timeout: Duration,
}

impl Default for TcpServerLimits {
    fn default() -> Self {
        TcpServerLimits {
            max_connections: 1024,
            connection: TcpConfig::default(),
            write_timeout: Duration::from_secs(30),
        }
    }
}

/// Size of the buffer each connection reads into.
const READ_CHUNK: usize = 16 * 1024;

/// A running TCP listener of a server.
#[derive(Debug)]
pub(crate) struct TcpListenerHandle {
    pub(crate) local_addr: SocketAddr,
    shutdown: watch::Sender<Option<Duration>>,
    task: tokio::task::JoinHandle<()>,
}

impl TcpListenerHandle {
    /// Stops accepting; connections finish their handlers for up to `grace`, then
    /// send Release and close.
    pub(crate) fn shutdown(&self, grace: Duration) {
        let _ = self.shutdown.send(Some(grace));
    }

    /// Waits until the listener and all its connections have stopped.
    pub(crate) async fn wait(self) {
        let _ = self.task.await;
    }
}

/// Binds `addr` and serves `tree` over `coap+tcp` on the current tokio runtime.
pub(crate) async fn listen(
    addr: SocketAddr,
    tree: Arc<ResourceTree>,
    limits: ServerLimits,
    tcp: TcpServerLimits,
) -> std::io::Result<TcpListenerHandle> {
    let listener = TcpListener::bind(addr).await?;
    let local_addr = listener.local_addr()?;
    let (shutdown, mut stop) = watch::channel(None);
    let task = tokio::spawn(async move {
        let permits = Arc::new(Semaphore::new(tcp.max_connections.max(1)));
        let mut conns = JoinSet::new();
        loop {
            tokio::select! {
                accepted = listener.accept() => {
                    let (stream, peer) = match accepted {
                        Ok(x) => x,
                        Err(e) => {
                            // EMFILE and the like: back off instead of spinning.
                            tracing::warn!(error = %e, "TCP accept failed");
                            tokio::time::sleep(Duration::from_millis(50)).await;
                            continue;
                        }
                    };
                    let Ok(permit) = permits.clone().try_acquire_owned() else {
                        refuse(stream, &tcp.connection);
                        continue;
                    };
                    let _ = stream.set_nodelay(true);
                    let conn = ServerConn {
                        peer,
                        tree: tree.clone(),
                        limits: limits.clone(),
                        tcp: tcp.clone(),
                        stop: stop.clone(),
                    };
                    conns.spawn(async move {
                        conn.run(stream).await;
                        drop(permit);
                    });
                }
                Some(_) = conns.join_next(), if !conns.is_empty() => {}
                _ = stop.changed() => break,
            }
        }
        drop(listener);
        while conns.join_next().await.is_some() {}
    });
    Ok(TcpListenerHandle {
        local_addr,
        shutdown,
        task,
    })
}

/// Tells a connection over the limit why it is closed, without waiting for it.
fn refuse(stream: TcpStream, config: &TcpConfig) {
    let mut conn = TcpConnection::new(config.clone(), Instant::now());
    conn.abort(None, "too many connections");
    if let Some(bytes) = conn.poll_transmit() {
        let _ = stream.try_write(&bytes);
    }
}

/// A request received over TCP as the resource tree sees it.
fn to_message(m: TcpMessage) -> Message {
    Message {
        mtype: MessageType::Confirmable,
        code: m.code,
        mid: 0,
        token: m.token,
        options: m.options,
        payload: m.payload,
    }
}

fn from_message(m: Message) -> TcpMessage {
    TcpMessage {
        code: m.code,
        token: m.token,
        options: m.options,
        payload: m.payload,
    }
}

type Pending = Pin<Box<dyn Future<Output = (Token, Message, Response)> + Send>>;

struct ServerConn {
    peer: SocketAddr,
    tree: Arc<ResourceTree>,
    limits: ServerLimits,
    tcp: TcpServerLimits,
    stop: watch::Receiver<Option<Duration>>,
}

impl ServerConn {
    async fn run(mut self, mut stream: TcpStream) {
        let mut conn = TcpConnection::new(self.tcp.connection.clone(), Instant::now());
        let mut handlers: FuturesUnordered<Pending> = FuturesUnordered::new();
        let mut buf = vec![0u8; READ_CHUNK];
        let mut drain_until: Option<tokio::time::Instant> = None;
        if self.stop.borrow().is_some() {
            drain_until = Some(tokio::time::Instant::now());
        }
        loop {
            // Events first: they may queue responses.
            while let Some(ev) = conn.poll_event() {
                match ev {
                    TcpEvent::Request { token, message } => {
                        let request = to_message(message);
                        // Kept without payload for Block2 slicing of the answer.
                        let mut head = request.clone();
                        head.payload = Vec::new();
                        match self.tree.dispatch(Request::new(self.peer, request)) {
                            Ok(fut) => handlers.push(Box::pin(async move {
                                let resp = AssertUnwindSafe(fut)
                                    .catch_unwind()
                                    .await
                                    .unwrap_or_else(|_| {
                                        tracing::error!("request handler panicked; answering 5.00");
                                        Response::new(Code::INTERNAL_SERVER_ERROR)
                                    });
                                (token, head, resp)
                            })),
                            Err(resp) => self.answer(&mut conn, token, &head, resp),
                        }
                    }
                    TcpEvent::Closed { reason, .. } => {
                        tracing::debug!(peer = %self.peer, %reason, "TCP connection closed");
                    }
                    _ => {}
                }
            }
            if !self.flush(&mut conn, &mut stream).await || conn.is_closed() {
                break;
            }
            if let Some(until) = drain_until {
                if handlers.is_empty() || tokio::time::Instant::now() >= until {
                    conn.release();
                    let _ = self.flush(&mut conn, &mut stream).await;
                    break;
                }
            }
            let timer = conn
                .poll_timeout()
                .map(tokio::time::Instant::from_std)
                .into_iter()
                .chain(drain_until)
                .min();
            tokio::select! {
                read = stream.read(&mut buf), if drain_until.is_none() => match read {
                    Ok(0) | Err(_) => conn.handle_eof(),
                    Ok(n) => conn.handle_bytes(Instant::now(), &buf[..n]),
                },
                Some((token, head, resp)) = handlers.next(), if !handlers.is_empty() => {
                    self.answer(&mut conn, token, &head, resp);
                }
                _ = sleep_until(timer) => conn.handle_timeout(Instant::now()),
                _ = self.stop.changed(), if drain_until.is_none() => {
                    let grace = self.stop.borrow().unwrap_or_default();
                    drain_until = Some(tokio::time::Instant::now() + grace);
                }
            }
        }
        let _ = stream.shutdown().await;
    }

    /// Sends a handler's response, in Block2 blocks if the client asked for blocks or
    /// the whole would exceed the peer's Max-Message-Size.
    fn answer(&self, conn: &mut TcpConnection, token: Token, request: &Message, resp: Response) {
        let mut msg = resp.into_message();
        msg.token = token;
        let whole = from_message(msg.clone());
        let fits = whole.tcp_frame_len() <= conn.peer_max_message_size() as usize;
        let out = if request.block2().is_none() && fits {
            whole
        } else {
            from_message(slice_response(request, msg, self.limits.block_szx))
        };
        if let Err(e) = conn.respond(Instant::now(), token, out) {
            tracing::debug!(peer = %self.peer, error = %e, "cannot send response; answering 5.00");
            let mut err = TcpMessage::new(Code::INTERNAL_SERVER_ERROR);
            err.payload = b"response too large".to_vec();
            let _ = conn.respond(Instant::now(), token, err);
        }
    }

    async fn flush(&self, conn: &mut TcpConnection, stream: &mut TcpStream) -> bool {
        flush(conn, stream, self.tcp.write_timeout).await
    }
}

/// Writes everything the connection has queued; false if the stream failed or the
/// peer did not read for `write_timeout`.
async fn flush(conn: &mut TcpConnection, stream: &mut TcpStream, write_timeout: Duration) -> bool {
    while let Some(bytes) = conn.poll_transmit() {
        match tokio::time::timeout(write_timeout, stream.write_all(&bytes)).await {
            Ok(Ok(())) => {}
            _ => return false,
        }
    }
    true
}

async fn sleep_until(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

// ---------------------------------------------------------------------------------
// Client side

/// How long connecting to a server may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Default wait for a response over TCP when the caller sets no timeout: there are no
/// retransmissions, so only a dead or stalled server makes it expire.
pub(crate) const DEFAULT_RESPONSE_TIMEOUT: Duration = Duration::from_secs(60);

struct ClientCommand {
    message: TcpMessage,
    reply: oneshot::Sender<Result<TcpMessage>>,
}

/// The client's TCP connections, one per server address, each served by a task on the
/// runtime that first needed it.
#[derive(Default)]
pub(crate) struct TcpPool {
    config: TcpConfig,
    conns: Mutex<HashMap<SocketAddr, mpsc::UnboundedSender<ClientCommand>>>,
}

impl std::fmt::Debug for TcpPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let n = self.conns.lock().map_or(0, |c| c.len());
        f.debug_struct("TcpPool").field("connections", &n).finish()
    }
}

impl TcpPool {
    /// Sends `request` to `peer` over the pooled connection (opening one if needed) and
    /// waits for the response.
    pub(crate) async fn request(&self, peer: SocketAddr, request: Message) -> Result<Message> {
        let message = from_message(request);
        // A connection that closes (idle Release, server restart) before writing the
        // request drops it unanswered; then one fresh connection is tried.
        for _ in 0..2 {
            let (tx, rx) = oneshot::channel();
            let cmd = ClientCommand {
                message: message.clone(),
                reply: tx,
            };
            if self.sender(peer).send(cmd).is_err() {
                continue;
            }
            if let Ok(result) = rx.await {
                return result.map(to_message);
            }
        }
        Err(Error::Connection(format!(
            "coap+tcp connection to {peer} closed before the request could be sent"
        )))
    }

    fn sender(&self, peer: SocketAddr) -> mpsc::UnboundedSender<ClientCommand> {
        let mut conns = self.conns.lock().unwrap_or_else(|e| e.into_inner());
        conns.retain(|_, tx| !tx.is_closed());
        if let Some(tx) = conns.get(&peer) {
            return tx.clone();
        }
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(client_conn(peer, self.config.clone(), rx));
        conns.insert(peer, tx.clone());
        tx
    }
}

/// Writes a request on an established connection and remembers who waits for it.
fn start_request(
    conn: &mut TcpConnection,
    waiting: &mut HashMap<Token, oneshot::Sender<Result<TcpMessage>>>,
    cmd: ClientCommand,
    peer: SocketAddr,
) {
    // Forget requests whose callers stopped waiting.
    waiting.retain(|t, tx| {
        let keep = !tx.is_closed();
        if !keep {
            conn.cancel(*t);
        }
        keep
    });
    match conn.request(Instant::now(), cmd.message) {
        Ok(token) => {
            waiting.insert(token, cmd.reply);
        }
        Err(e) => {
            let _ = cmd.reply.send(Err(Error::Connection(format!(
                "coap+tcp request to {peer}: {e}"
            ))));
        }
    }
}

fn closed_error(peer: SocketAddr, reason: &CloseReason) -> Error {
    Error::Connection(format!("coap+tcp connection to {peer} closed: {reason}"))
}

/// Connects and then serves one client connection until it closes or the pool is
/// dropped; commands that arrive meanwhile are failed so callers can retry.
async fn client_conn(
    peer: SocketAddr,
    config: TcpConfig,
    mut commands: mpsc::UnboundedReceiver<ClientCommand>,
) {
    let mut stream = match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(peer)).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => {
            let e = Arc::new(e);
            commands.close();
            while let Some(c) = commands.recv().await {
                let _ = c.reply.send(Err(Error::Io(std::io::Error::new(
                    e.kind(),
                    format!("connecting to {peer}: {e}"),
                ))));
            }
            return;
        }
        Err(_) => {
            commands.close();
            while let Some(c) = commands.recv().await {
                let _ = c.reply.send(Err(Error::Io(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("connecting to {peer} timed out"),
                ))));
            }
            return;
        }
    };
    let _ = stream.set_nodelay(true);
    let mut conn = TcpConnection::new(config, Instant::now());
    let mut waiting: HashMap<Token, oneshot::Sender<Result<TcpMessage>>> = HashMap::new();
    // Requests held back until the server's CSM says how large a message may be.
    let mut deferred: Vec<ClientCommand> = Vec::new();
    let mut buf = vec![0u8; READ_CHUNK];
    let mut close_reason = None;
    loop {
        if conn.is_established() {
            for cmd in deferred.drain(..) {
                start_request(&mut conn, &mut waiting, cmd, peer);
            }
        }
        while let Some(ev) = conn.poll_event() {
            match ev {
                TcpEvent::Response { token, message } => {
                    if let Some(tx) = waiting.remove(&token) {
                        let _ = tx.send(Ok(message));
                    }
                }
                TcpEvent::Closed { reason, .. } => close_reason = Some(reason),
                TcpEvent::ReleaseReceived { .. } => {
                    // New requests go to a new connection: closing the channel makes
                    // the pool open one; commands already queued are dropped unanswered,
                    // so their callers retry there.
                    commands.close();
                    while commands.try_recv().is_ok() {}
                }
                _ => {}
            }
        }
        if !flush(&mut conn, &mut stream, Duration::from_secs(30)).await {
            close_reason.get_or_insert(CloseReason::PeerClosed);
            break;
        }
        if conn.is_closed() {
            break;
        }
        let timer = conn.poll_timeout().map(tokio::time::Instant::from_std);
        tokio::select! {
            read = stream.read(&mut buf) => match read {
                Ok(0) | Err(_) => conn.handle_eof(),
                Ok(n) => conn.handle_bytes(Instant::now(), &buf[..n]),
            },
            cmd = commands.recv(), if !conn.is_releasing() => match cmd {
                None => conn.release(),
                Some(cmd) if !conn.is_established() => deferred.push(cmd),
                Some(cmd) => start_request(&mut conn, &mut waiting, cmd, peer),
            },
            _ = sleep_until(timer) => conn.handle_timeout(Instant::now()),
        }
    }
    let reason = close_reason.unwrap_or(CloseReason::PeerClosed);
    for (_, tx) in waiting {
        let _ = tx.send(Err(closed_error(peer, &reason)));
    }
    for cmd in deferred {
        let _ = cmd.reply.send(Err(closed_error(peer, &reason)));
    }
    // Commands not yet written are dropped unanswered: their callers retry.
    commands.close();
    while commands.try_recv().is_ok() {}
    let _ = stream.shutdown().await;
}
