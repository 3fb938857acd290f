//! CoAP over TCP (RFC 8323, `coap+tcp://`): the server's listener, one task per
//! accepted connection, and the client's pool of connections, one per origin.
//!
//! Every connection is driven by the sans-IO [`TcpConnection`] of `cobalt-proto`: the
//! tasks here only move bytes between it and a `Link` (a tokio [`TcpStream`] here,
//! a WebSocket in [`super::ws`]), let the server role of the connection
//! (`StreamServer`: handlers, uploads, observe relations) answer requests, and hand
//! responses and notifications to waiting clients. The same loops serve `coap+tcp`
//! and `coap+ws`.

use super::per_ip::{IpBudget, IpPermit};
use super::stream_client::{ClientCommand, Exchanges, PeerSettings, StreamObservation};
use super::tls::{HandshakeError, TlsAcceptor, TlsConnector};
use crate::error::{ConnectionError, ConnectionErrorKind};
use crate::runtime::StreamTracer;
use crate::server::stream::{Handlers, StreamServer, StreamShared};
use crate::server::tree::ResourceTree;
use crate::server::ServerLimits;
use crate::{Error, Result};
use cobalt_proto::blockwise::{BlockSize, MAX_UDP_SZX};
use cobalt_proto::message::{decode_tcp, decode_ws, opt, Message, MessageType, Signal, TcpMessage};
use cobalt_proto::tcp_connection::{CloseReason, Framing, TcpConfig, TcpConnection, TcpEvent};
use cobalt_proto::uri::Scheme;
use futures_util::StreamExt;
use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot, watch, Semaphore};
use tokio::task::JoinSet;

/// Limits of the TCP side of a server. `Default` gives the documented defaults.
#[derive(Debug, Clone, PartialEq)]
pub struct TcpServerLimits {
    /// Connections served at once; further connections are sent an Abort and closed.
    /// Default 1,024.
    pub max_connections: usize,
    /// Connections served at once from one address (IPv4 address, or IPv6 /64; see
    /// [`budget_key`](super::per_ip::budget_key)); its further connections are refused
    /// like those over `max_connections`, while other addresses still connect.
    /// Default 256.
    pub max_connections_per_ip: usize,
    /// TLS handshakes and WebSocket upgrades in progress at once from one address;
    /// its further connections are refused until one finishes. Default 32.
    pub max_handshakes_per_ip: usize,
    /// Per-connection protocol settings: Max-Message-Size, CSM/frame/idle timeouts,
    /// concurrent requests per connection.
    pub connection: TcpConfig,
    /// How long a write may block (a peer that does not read) before the connection is
    /// dropped. Default 30 s.
    pub write_timeout: Duration,
    /// How long the TLS handshake (`coaps+tcp`, `coaps+ws`) and, for WebSockets, the
    /// HTTP upgrade request may each take, from the accepted connection to the end of
    /// its header (slowloris defence). Default 10 s.
    pub handshake_timeout: Duration,
    /// Largest BERT block (RFC 8323 §6) in a response, in bytes (a multiple of 1024 is
    /// used). BERT blocks are sent only to peers that announced Block-Wise-Transfer,
    /// when `connection.block_wise_transfer` announces it too, and only for
    /// representations larger than the peer's Max-Message-Size (or asked for in
    /// blocks); a block is never larger than the peer's Max-Message-Size allows.
    /// Default 64 KiB.
    pub max_bert_block: usize,
}

impl Default for TcpServerLimits {
    fn default() -> Self {
        TcpServerLimits {
            max_connections: 1024,
            max_connections_per_ip: 256,
            max_handshakes_per_ip: 32,
            connection: TcpConfig::default(),
            write_timeout: Duration::from_secs(30),
            handshake_timeout: Duration::from_secs(10),
            max_bert_block: 64 * 1024,
        }
    }
}

/// Size of the buffer each connection reads into.
const READ_CHUNK: usize = 16 * 1024;

/// What a [`Link`] received.
pub(crate) enum Input<'a> {
    /// Bytes from the stream, or the payload of one binary WebSocket message.
    Data(&'a [u8]),
    /// The peer sent a WebSocket message above the size limit (not read).
    TooLarge,
    /// The peer closed the transport, or it failed.
    Closed,
}

/// The transport under one connection, as the connection loops see it: a byte stream
/// (`coap+tcp`) or a WebSocket (`coap+ws`).
pub(crate) trait Link: Send {
    /// The framing the [`TcpConnection`] on this transport uses.
    const FRAMING: Framing;
    /// Waits for the next input; cancel-safe.
    fn recv(&mut self) -> impl Future<Output = Input<'_>> + Send;
    /// Writes one output of [`TcpConnection::poll_transmit`].
    fn send(&mut self, data: Vec<u8>) -> impl Future<Output = std::io::Result<()>> + Send;
    /// Closes the transport after the connection's last message.
    fn close(&mut self) -> impl Future<Output = ()> + Send;
}

/// A byte stream a connection runs over: a TCP stream, or TLS over one.
pub(crate) trait Stream: AsyncRead + AsyncWrite + Unpin + Send + 'static {}

impl<S: AsyncRead + AsyncWrite + Unpin + Send + 'static> Stream for S {}

/// A byte stream (plain TCP or TLS) carrying `coap+tcp` frames.
pub(crate) struct TcpLink<S> {
    stream: S,
    buf: Vec<u8>,
}

impl<S: Stream> TcpLink<S> {
    fn new(stream: S) -> TcpLink<S> {
        TcpLink {
            stream,
            buf: vec![0u8; READ_CHUNK],
        }
    }
}

impl<S: Stream> Link for TcpLink<S> {
    const FRAMING: Framing = Framing::Stream;

    async fn recv(&mut self) -> Input<'_> {
        match self.stream.read(&mut self.buf).await {
            Ok(0) | Err(_) => Input::Closed,
            Ok(n) => Input::Data(&self.buf[..n]),
        }
    }

    async fn send(&mut self, data: Vec<u8>) -> std::io::Result<()> {
        self.stream.write_all(&data).await
    }

    async fn close(&mut self) {
        let _ = self.stream.shutdown().await;
    }
}

/// Feeds one [`Input`] to the connection.
fn handle_input(conn: &mut TcpConnection, input: Input<'_>) {
    match input {
        Input::Data(bytes) => conn.handle_bytes(Instant::now(), bytes),
        Input::TooLarge => conn.abort(None, "message exceeds Max-Message-Size"),
        Input::Closed => conn.handle_eof(),
    }
}

/// A running TCP listener of a server.
#[derive(Debug)]
pub(crate) struct TcpListenerHandle {
    pub(crate) local_addr: SocketAddr,
    pub(crate) counters: Arc<TcpCounters>,
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

/// What a TCP or WebSocket listener has seen, for the metrics exporter.
#[derive(Debug, Default)]
pub struct TcpCounters {
    /// Connections accepted.
    pub accepted: AtomicU64,
    /// Connections refused because `max_connections` were open.
    pub refused: AtomicU64,
    /// Connections refused because their address held `max_connections_per_ip`
    /// connections or `max_handshakes_per_ip` handshakes.
    pub refused_per_ip: AtomicU64,
    /// Connections open now (a gauge).
    pub open: AtomicU64,
    /// Connections aborted by this side for a protocol error (bad or missing CSM,
    /// oversized frame, malformed message).
    pub protocol_errors: AtomicU64,
    /// Connections closed because the TLS handshake, the CSM or a frame took too long,
    /// or the peer answered no keep-alive Ping (slow, silent or vanished peers).
    pub timeouts: AtomicU64,
    /// Connections released for being idle.
    pub idle_closed: AtomicU64,
    /// TLS handshakes that failed (wrong key, untrusted certificate, not TLS) and
    /// WebSocket upgrades refused or abandoned.
    pub handshake_failures: AtomicU64,
    /// Observe relations held on the listener's connections now (a gauge).
    pub observers: Arc<AtomicU64>,
}

impl TcpCounters {
    fn count_close(&self, reason: &CloseReason) {
        let counter = match reason {
            CloseReason::LocalAbort(_) => &self.protocol_errors,
            CloseReason::CsmTimeout | CloseReason::FrameTimeout | CloseReason::KeepaliveTimeout => {
                &self.timeouts
            }
            CloseReason::IdleTimeout => &self.idle_closed,
            _ => return,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

/// What a listener serves: the framing, and whether TLS runs under it.
#[derive(Debug, Clone)]
pub(crate) struct Transport {
    /// Stream framing (`coap+tcp`) or WebSocket messages (`coap+ws`).
    pub framing: Framing,
    /// TLS under the framing (`coaps+tcp`, `coaps+ws`).
    pub tls: Option<TlsAcceptor>,
}

impl Transport {
    /// The URI scheme served.
    pub(crate) fn scheme(&self) -> Scheme {
        scheme(self.framing, self.tls.is_some())
    }
}

/// Binds `addr` and serves `tree` over `coap+tcp` (stream framing) or `coap+ws`
/// (WebSocket framing, after an HTTP upgrade), with TLS under either when
/// `transport.tls` is set, on the current tokio runtime.
pub(crate) async fn listen(
    addr: SocketAddr,
    tree: Arc<ResourceTree>,
    limits: ServerLimits,
    tcp: TcpServerLimits,
    transport: Transport,
) -> std::io::Result<TcpListenerHandle> {
    let framing = transport.framing;
    let listener = TcpListener::bind(addr).await?;
    let local_addr = listener.local_addr()?;
    let (shutdown, mut stop) = watch::channel(None);
    let shared = Arc::new(StreamShared::new(
        tree,
        limits,
        tcp.connection.block_wise_transfer,
        tcp.max_bert_block,
    ));
    let counters = Arc::new(TcpCounters {
        observers: shared.observers.clone(),
        ..TcpCounters::default()
    });
    let seen = counters.clone();
    let task = tokio::spawn(async move {
        let permits = Arc::new(Semaphore::new(tcp.max_connections.max(1)));
        let per_ip = IpBudget::new(tcp.max_connections_per_ip.max(1));
        let handshakes_per_ip = IpBudget::new(tcp.max_handshakes_per_ip.max(1));
        // TLS handshakes and WebSocket upgrades come before CoAP.
        let handshaking = transport.tls.is_some() || framing == Framing::WebSocket;
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
                    let _ = stream.set_nodelay(true);
                    let ip_permits = per_ip.try_acquire(peer.ip()).and_then(|conn| {
                        if !handshaking {
                            return Some((conn, None));
                        }
                        handshakes_per_ip.try_acquire(peer.ip()).map(|h| (conn, Some(h)))
                    });
                    let Some((ip_permit, handshake)) = ip_permits else {
                        seen.refused_per_ip.fetch_add(1, Ordering::Relaxed);
                        tracing::debug!(%peer, "connection refused: too many from this address");
                        refuse_connection(stream, &transport, &tcp, "too many connections from this address");
                        continue;
                    };
                    let Ok(permit) = permits.clone().try_acquire_owned() else {
                        seen.refused.fetch_add(1, Ordering::Relaxed);
                        refuse_connection(stream, &transport, &tcp, "too many connections");
                        continue;
                    };
                    seen.accepted.fetch_add(1, Ordering::Relaxed);
                    seen.open.fetch_add(1, Ordering::Relaxed);
                    let conn = ServerConn {
                        counters: seen.clone(),
                        peer,
                        shared: shared.clone(),
                        tcp: tcp.clone(),
                        stop: stop.clone(),
                        handshake,
                    };
                    let tls = transport.tls.clone();
                    let counters = seen.clone();
                    conns.spawn(async move {
                        conn.serve(stream, framing, tls).await;
                        counters.open.fetch_sub(1, Ordering::Relaxed);
                        drop((permit, ip_permit));
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
        counters,
        shutdown,
        task,
    })
}

/// Closes a connection over a limit, saying why where the transport can say anything:
/// an Abort over TCP, a 503 over WebSockets; over TLS nothing can be said before a
/// handshake.
fn refuse_connection(
    stream: TcpStream,
    transport: &Transport,
    tcp: &TcpServerLimits,
    why: &'static str,
) {
    match (transport.framing, &transport.tls) {
        (_, Some(_)) => {}
        (Framing::Stream, None) => refuse(stream, &tcp.connection, why),
        (Framing::WebSocket, None) => super::ws::refuse(stream, why),
    }
}

/// Tells a connection over the limit why it is closed, without waiting for it.
fn refuse(stream: TcpStream, config: &TcpConfig, why: &str) {
    let mut conn = TcpConnection::new(config.clone(), Instant::now());
    conn.abort(None, why);
    if let Some(bytes) = conn.poll_transmit() {
        let _ = stream.try_write(&bytes);
    }
}

/// A message received over TCP or WebSockets as the resource tree and the UDP client
/// code see it (a confirmable message without a message ID).
pub(crate) fn to_message(m: TcpMessage) -> Message {
    Message {
        mtype: MessageType::Confirmable,
        code: m.code,
        mid: 0,
        token: m.token,
        options: m.options,
        payload: m.payload,
    }
}

/// The message to send over TCP or WebSockets (type and message ID dropped).
pub(crate) fn from_message(m: Message) -> TcpMessage {
    TcpMessage {
        code: m.code,
        token: m.token,
        options: m.options,
        payload: m.payload,
    }
}

struct ServerConn {
    counters: Arc<TcpCounters>,
    peer: SocketAddr,
    shared: Arc<StreamShared>,
    tcp: TcpServerLimits,
    stop: watch::Receiver<Option<Duration>>,
    /// The address's place among handshakes in progress (TLS, WebSocket upgrade),
    /// given back once the connection speaks CoAP.
    handshake: Option<IpPermit>,
}

impl ServerConn {
    /// Runs the TLS handshake (if any) and the WebSocket upgrade (if any), then the
    /// connection.
    async fn serve(mut self, stream: TcpStream, framing: Framing, tls: Option<TlsAcceptor>) {
        let Some(tls) = tls else {
            return self.serve_over(stream, framing).await;
        };
        match tokio::time::timeout(self.tcp.handshake_timeout, tls.accept(stream)).await {
            Ok(Ok(stream)) => {
                if framing == Framing::Stream {
                    self.handshake = None;
                }
                self.serve_over(stream, framing).await
            }
            Ok(Err(e)) => {
                self.counters
                    .handshake_failures
                    .fetch_add(1, Ordering::Relaxed);
                tracing::debug!(peer = %self.peer, error = %e, "TLS handshake failed");
            }
            Err(_) => {
                self.counters.timeouts.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(peer = %self.peer, "TLS handshake not completed in time");
            }
        }
    }

    async fn serve_over<S: Stream>(mut self, stream: S, framing: Framing) {
        match framing {
            Framing::Stream => self.run(TcpLink::new(stream)).await,
            Framing::WebSocket => match super::ws::accept(stream, self.peer, &self.tcp).await {
                Some(link) => {
                    self.handshake = None;
                    self.run(link).await
                }
                None => {
                    self.counters
                        .handshake_failures
                        .fetch_add(1, Ordering::Relaxed);
                }
            },
        }
    }

    async fn run<L: Link>(mut self, mut link: L) {
        let mut conn = TcpConnection::with_framing(
            self.tcp.connection.clone(),
            L::FRAMING,
            Instant::now(),
            rand::random(),
        );
        let mut server = StreamServer::new(self.shared.clone(), self.peer);
        let changes = server.inbox();
        let mut handlers = Handlers::new();
        let mut drain_until: Option<tokio::time::Instant> = None;
        if self.stop.borrow().is_some() {
            drain_until = Some(tokio::time::Instant::now());
        }
        loop {
            // Events first: they may queue responses.
            while let Some(ev) = conn.poll_event() {
                match ev {
                    TcpEvent::Request { token, message } => {
                        server.on_request(&mut conn, &mut handlers, token, message)
                    }
                    TcpEvent::Closed { reason, .. } => {
                        self.counters.count_close(&reason);
                        tracing::debug!(peer = %self.peer, %reason, framing = ?L::FRAMING, relations = server.relations(), "connection closed");
                    }
                    _ => {}
                }
            }
            if !conn.is_closed() {
                server.on_changes(&mut conn, &mut handlers);
            }
            if !flush(&mut conn, &mut link, self.tcp.write_timeout, None).await || conn.is_closed()
            {
                break;
            }
            if let Some(until) = drain_until {
                if handlers.is_empty() || tokio::time::Instant::now() >= until {
                    conn.release();
                    let _ = flush(&mut conn, &mut link, self.tcp.write_timeout, None).await;
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
                input = link.recv(), if drain_until.is_none() => handle_input(&mut conn, input),
                Some(done) = handlers.next(), if !handlers.is_empty() => {
                    server.on_done(&mut conn, &mut handlers, done);
                }
                _ = changes.changed() => {}
                _ = sleep_until(timer) => conn.handle_timeout(Instant::now()),
                _ = self.stop.changed(), if drain_until.is_none() => {
                    let grace = self.stop.borrow().unwrap_or_default();
                    drain_until = Some(tokio::time::Instant::now() + grace);
                }
            }
        }
        // Dropping the server role ends the connection's relations and uploads.
        drop(server);
        let _ = tokio::time::timeout(self.tcp.write_timeout, link.close()).await;
    }
}

/// Writes everything the connection has queued (showing it to the tracer of
/// `traced`); false if the transport failed or the peer did not read for
/// `write_timeout`.
async fn flush<L: Link>(
    conn: &mut TcpConnection,
    link: &mut L,
    write_timeout: Duration,
    traced: Option<&Remote>,
) -> bool {
    while let Some(bytes) = conn.poll_transmit() {
        if let Some(remote) = traced {
            remote.trace_output(conn.framing(), &bytes);
        }
        match tokio::time::timeout(write_timeout, link.send(bytes)).await {
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

/// The client's connections of one transport (`coap+tcp` or `coap+ws`), one per
/// server address, each served by a task on the runtime that first needed it.
pub(crate) struct TcpPool {
    config: Mutex<TcpConfig>,
    framing: Framing,
    /// TLS under the framing (`coaps+tcp`, `coaps+ws`).
    tls: Option<TlsConnector>,
    conns: Mutex<HashMap<SocketAddr, mpsc::UnboundedSender<ClientCommand>>>,
    next_key: AtomicU64,
    /// Shows the connections' messages (`cobalt -v`); shared with the client.
    tracer: TracerSlot,
}

/// Where a client keeps its [`StreamTracer`], read when a connection opens.
pub(crate) type TracerSlot = Arc<Mutex<Option<StreamTracer>>>;

/// Who a client connection talks to, and who watches its messages.
struct Remote {
    peer: SocketAddr,
    scheme: Scheme,
    tracer: Option<StreamTracer>,
}

impl Remote {
    /// Shows `message`, sent (`true`) or received, to the tracer.
    fn trace(&self, sent: bool, message: &TcpMessage) {
        if let Some(t) = &self.tracer {
            t(sent, self.peer, message);
        }
    }

    /// Shows the messages in one output of [`TcpConnection::poll_transmit`].
    fn trace_output(&self, framing: Framing, bytes: &[u8]) {
        if self.tracer.is_none() {
            return;
        }
        match framing {
            Framing::WebSocket => {
                if let Ok(m) = decode_ws(bytes, usize::MAX) {
                    self.trace(true, &m);
                }
            }
            Framing::Stream => {
                let mut at = 0;
                while let Ok(Some((m, used))) = decode_tcp(&bytes[at..], usize::MAX) {
                    self.trace(true, &m);
                    at += used;
                }
            }
        }
    }
}

impl Default for TcpPool {
    fn default() -> Self {
        TcpPool::new(Framing::Stream)
    }
}

impl std::fmt::Debug for TcpPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let n = self.conns.lock().map_or(0, |c| c.len());
        f.debug_struct("TcpPool")
            .field("framing", &self.framing)
            .field("tls", &self.tls.is_some())
            .field("connections", &n)
            .finish()
    }
}

impl TcpPool {
    /// An empty pool whose connections use `framing`: [`Framing::Stream`] for
    /// `coap+tcp`, [`Framing::WebSocket`] for `coap+ws`.
    pub(crate) fn new(framing: Framing) -> TcpPool {
        TcpPool {
            config: Mutex::new(TcpConfig::default()),
            framing,
            tls: None,
            conns: Mutex::new(HashMap::new()),
            next_key: AtomicU64::new(1),
            tracer: TracerSlot::default(),
        }
    }

    /// An empty pool whose connections run TLS (`tls`) under `framing`:
    /// `coaps+tcp` or `coaps+ws`.
    pub(crate) fn secure(framing: Framing, tls: TlsConnector) -> TcpPool {
        TcpPool {
            tls: Some(tls),
            ..TcpPool::new(framing)
        }
    }

    /// This pool, showing the messages of the connections it opens to the tracer in
    /// `slot` (if one is set then).
    pub(crate) fn traced(mut self, slot: TracerSlot) -> TcpPool {
        self.tracer = slot;
        self
    }

    /// The settings of the connections opened from now on.
    pub(crate) fn config(&self) -> TcpConfig {
        self.config
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Changes the settings of the connections opened from now on.
    pub(crate) fn set_config(&self, config: TcpConfig) {
        *self.config.lock().unwrap_or_else(|e| e.into_inner()) = config;
    }

    fn scheme(&self) -> Scheme {
        scheme(self.framing, self.tls.is_some())
    }

    /// Sends `request` to `peer` over the pooled connection (opening one if needed) and
    /// waits for the response. `host` is the URI's host, named in the WebSocket
    /// upgrade request's `Host` header.
    pub(crate) async fn request(
        &self,
        peer: SocketAddr,
        host: &str,
        request: Message,
    ) -> Result<Message> {
        let message = from_message(request);
        self.call(peer, host, |reply| ClientCommand::Request {
            message: message.clone(),
            reply,
        })
        .await
        .map(to_message)
    }

    /// The settings `peer` announced in its CSM (connecting first if needed).
    pub(crate) async fn settings(&self, peer: SocketAddr, host: &str) -> Result<PeerSettings> {
        self.call(peer, host, |reply| ClientCommand::Settings { reply })
            .await
    }

    /// The block size to upload `request`'s body in: `None` when the whole request
    /// fits in one message the server accepts (its CSM's Max-Message-Size), else the
    /// largest blocks that fit — BERT when both ends announced it. `asked` (an SZX the
    /// caller chose) is used whenever the body is larger than one such block.
    pub(crate) async fn upload_size(
        &self,
        peer: SocketAddr,
        host: &str,
        request: &Message,
        asked: Option<u8>,
    ) -> Result<Option<BlockSize>> {
        if let Some(szx) = asked {
            let size = BlockSize::Szx(szx);
            return Ok((request.payload.len() > size.bytes()).then_some(size));
        }
        if request.payload.is_empty() {
            return Ok(None);
        }
        let settings = self.settings(peer, host).await?;
        let whole = from_message(request.clone());
        if self.framing.frame_len(&whole) <= settings.max_message_size as usize {
            return Ok(None);
        }
        let room =
            self.framing
                .block_room(settings.max_message_size, &whole, opt::BLOCK1, opt::SIZE1);
        Ok(Some(
            BlockSize::fitting(room, settings.bert, MAX_UDP_SZX, usize::MAX)
                .unwrap_or(BlockSize::Szx(0)),
        ))
    }

    /// Registers an observation (`request` carries Observe=0) over the pooled
    /// connection: its notifications arrive on the returned channel.
    pub(crate) fn observe(
        &self,
        peer: SocketAddr,
        host: &str,
        request: Message,
        buffered: usize,
    ) -> Result<(mpsc::Receiver<Result<Message>>, StreamObservation)> {
        let message = from_message(request);
        let key = self.next_key.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = mpsc::channel(buffered);
        let mut deregister = message.clone();
        deregister.options.set_uint(opt::OBSERVE, 1);
        let commands = self
            .send(
                peer,
                host,
                ClientCommand::Observe {
                    key,
                    message,
                    notifications: tx,
                },
            )
            .map_err(|_| {
                Error::Connection(ConnectionError {
                    scheme: self.scheme(),
                    peer,
                    kind: ConnectionErrorKind::ClosedBeforeSend,
                })
            })?;
        Ok((
            rx,
            StreamObservation {
                scheme: self.scheme(),
                peer,
                commands,
                key,
                deregister,
                armed: true,
            },
        ))
    }

    /// Hands a command to the pooled connection and waits for its answer. A
    /// connection that closes (idle Release, server restart) before carrying the
    /// command out drops it unanswered; then one fresh connection is tried.
    async fn call<T>(
        &self,
        peer: SocketAddr,
        host: &str,
        command: impl Fn(oneshot::Sender<Result<T>>) -> ClientCommand,
    ) -> Result<T> {
        for _ in 0..2 {
            let (tx, rx) = oneshot::channel();
            if self.send(peer, host, command(tx)).is_err() {
                continue;
            }
            if let Ok(result) = rx.await {
                return result;
            }
        }
        Err(Error::Connection(ConnectionError {
            scheme: self.scheme(),
            peer,
            kind: ConnectionErrorKind::ClosedBeforeSend,
        }))
    }

    /// Hands `command` to the pooled connection to `peer`, opening one if there is
    /// none; returns the connection's command channel, or `Err` when the connection
    /// closed meanwhile (the caller tries again, and gets a new one). A new
    /// connection gets the command before its task starts, so that a connection that
    /// fails at once (a refused TLS handshake) still answers it with the reason.
    fn send(
        &self,
        peer: SocketAddr,
        host: &str,
        command: ClientCommand,
    ) -> std::result::Result<mpsc::UnboundedSender<ClientCommand>, ()> {
        let mut conns = self.conns.lock().unwrap_or_else(|e| e.into_inner());
        conns.retain(|_, tx| !tx.is_closed());
        if let Some(tx) = conns.get(&peer) {
            return tx.send(command).map(|()| tx.clone()).map_err(|_| ());
        }
        let (tx, rx) = mpsc::unbounded_channel();
        let _ = tx.send(command);
        let config = self.config();
        let host = host.to_string();
        let tls = self.tls.clone();
        let scheme = self.scheme();
        let remote = Remote {
            peer,
            scheme,
            tracer: self
                .tracer
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone(),
        };
        match self.framing {
            Framing::Stream => {
                let connect = async move {
                    let stream = connect_tcp(peer, scheme).await?;
                    Ok(match tls {
                        None => Either::Plain(TcpLink::new(stream)),
                        Some(tls) => {
                            Either::Tls(TcpLink::new(tls.connect(stream, &host, peer).await?))
                        }
                    })
                };
                tokio::spawn(client_conn(remote, connect, config, rx));
            }
            Framing::WebSocket => {
                let ws_config = config.clone();
                let connect = async move {
                    let (config, stream) = (ws_config, connect_tcp(peer, scheme).await?);
                    Ok(match tls {
                        None => Either::Plain(
                            super::ws::connect(stream, peer, &host, &config, false).await?,
                        ),
                        Some(tls) => {
                            let stream = tls.connect(stream, &host, peer).await?;
                            Either::Tls(
                                super::ws::connect(stream, peer, &host, &config, true).await?,
                            )
                        }
                    })
                };
                tokio::spawn(client_conn(remote, connect, config, rx));
            }
        }
        conns.insert(peer, tx.clone());
        Ok(tx)
    }
}

/// Opens the TCP connection under a client connection.
async fn connect_tcp(peer: SocketAddr, scheme: Scheme) -> std::io::Result<TcpStream> {
    let stream = TcpStream::connect(peer).await.map_err(|e| {
        std::io::Error::new(
            e.kind(),
            format!("{scheme} connection to {peer} failed: {e}"),
        )
    })?;
    let _ = stream.set_nodelay(true);
    Ok(stream)
}

/// A link over plain TCP or over TLS, chosen at run time.
pub(crate) enum Either<A, B> {
    /// Over plain TCP.
    Plain(A),
    /// Over TLS.
    Tls(B),
}

impl<A: Link, B: Link> Link for Either<A, B> {
    const FRAMING: Framing = A::FRAMING;

    async fn recv(&mut self) -> Input<'_> {
        match self {
            Either::Plain(l) => l.recv().await,
            Either::Tls(l) => l.recv().await,
        }
    }

    async fn send(&mut self, data: Vec<u8>) -> std::io::Result<()> {
        match self {
            Either::Plain(l) => l.send(data).await,
            Either::Tls(l) => l.send(data).await,
        }
    }

    async fn close(&mut self) {
        match self {
            Either::Plain(l) => l.close().await,
            Either::Tls(l) => l.close().await,
        }
    }
}

/// The URI scheme of a framing, with or without TLS, for messages.
fn scheme(framing: Framing, tls: bool) -> Scheme {
    match (framing, tls) {
        (Framing::Stream, false) => Scheme::CoapTcp,
        (Framing::Stream, true) => Scheme::CoapsTcp,
        (Framing::WebSocket, false) => Scheme::CoapWs,
        (Framing::WebSocket, true) => Scheme::CoapsWs,
    }
}

/// The error of requests on a connection that closed; `before_csm` when the server's
/// CSM never came, which over plain TCP is what a TLS port does.
fn closed_error(scheme: Scheme, peer: SocketAddr, reason: &CloseReason, before_csm: bool) -> Error {
    Error::Connection(ConnectionError {
        scheme,
        peer,
        kind: ConnectionErrorKind::Closed {
            reason: reason.to_string(),
            before_csm: before_csm && *reason == CloseReason::PeerClosed,
        },
    })
}

/// Connects (`connect`: TCP, and for WebSockets the upgrade) and then serves one
/// client connection until it closes or the pool is dropped; commands that arrive
/// meanwhile are failed so callers can retry.
async fn client_conn<L, C>(
    remote: Remote,
    connect: C,
    config: TcpConfig,
    mut commands: mpsc::UnboundedReceiver<ClientCommand>,
) where
    L: Link,
    C: Future<Output = std::io::Result<L>>,
{
    let (peer, scheme) = (remote.peer, remote.scheme);
    let connected = tokio::time::timeout(CONNECT_TIMEOUT, connect)
        .await
        .unwrap_or_else(|_| {
            Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!(
                    "{scheme} connection to {peer} not established within {}s",
                    CONNECT_TIMEOUT.as_secs()
                ),
            ))
        });
    let mut link = match connected {
        Ok(link) => link,
        Err(e) => {
            commands.close();
            while let Some(c) = commands.recv().await {
                c.fail(HandshakeError::classify(&e));
            }
            return;
        }
    };
    let mut conn = TcpConnection::with_framing(config, L::FRAMING, Instant::now(), rand::random());
    let mut exchanges = Exchanges::new(scheme, peer);
    // Commands held back until the server's CSM says how large a message may be.
    let mut deferred: Vec<ClientCommand> = Vec::new();
    let mut close_reason = None;
    loop {
        if conn.is_established() {
            for cmd in deferred.drain(..) {
                exchanges.start(&mut conn, cmd);
            }
        }
        while let Some(ev) = conn.poll_event() {
            match ev {
                TcpEvent::Response { token, message } => {
                    remote.trace(false, &message);
                    exchanges.on_response(&mut conn, token, message)
                }
                TcpEvent::PeerSettings {
                    max_message_size,
                    block_wise_transfer,
                } => {
                    let csm = Signal::Csm {
                        max_message_size: Some(max_message_size),
                        block_wise_transfer,
                    };
                    remote.trace(false, &csm.to_message());
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
        if !flush(&mut conn, &mut link, Duration::from_secs(30), Some(&remote)).await {
            close_reason.get_or_insert(CloseReason::PeerClosed);
            break;
        }
        if conn.is_closed() {
            break;
        }
        let timer = conn.poll_timeout().map(tokio::time::Instant::from_std);
        tokio::select! {
            input = link.recv() => handle_input(&mut conn, input),
            cmd = commands.recv(), if !conn.is_releasing() => match cmd {
                None => conn.release(),
                Some(cmd) if !conn.is_established() => deferred.push(cmd),
                Some(cmd) => exchanges.start(&mut conn, cmd),
            },
            _ = sleep_until(timer) => conn.handle_timeout(Instant::now()),
        }
    }
    // Commands not yet carried out are dropped unanswered: their callers retry. The
    // channel is closed first, so that what the callers send next (an observation
    // registering again) opens a new connection.
    commands.close();
    while commands.try_recv().is_ok() {}
    let reason = close_reason.unwrap_or(CloseReason::PeerClosed);
    exchanges.close(|| closed_error(scheme, peer, &reason, false));
    for cmd in deferred {
        cmd.fail(closed_error(scheme, peer, &reason, true));
    }
    let _ = tokio::time::timeout(Duration::from_secs(5), link.close()).await;
}
