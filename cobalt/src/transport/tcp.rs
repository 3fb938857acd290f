//! CoAP over TCP and WebSockets (RFC 8323), client side: the pool of connections,
//! one per origin, each a task that drives the sans-IO `TcpConnection` of
//! `cobalt-proto` over a `Link` (a tokio [`TcpStream`], TLS over
//! one, or a WebSocket from [`super::ws`]) and hands responses and notifications to
//! the requests waiting for them. The server's listeners run the same connection
//! machine (`server::listener`).

use super::link::{flush, handle_input, sleep_until, Input, Link, TcpLink};
use super::tls::{HandshakeError, TlsConnector};
use crate::error::{ConnectionError, ConnectionErrorKind};
use crate::runtime::command::{Command, PeerSettings};
use crate::runtime::exchanges::{ExchangeErrors, Exchanges};
use crate::trace::StreamTracer;
use crate::{Error, Result};
use cobalt_proto::blockwise::{BlockSize, MAX_UDP_SZX};
use cobalt_proto::message::{decode_tcp, decode_ws, opt, Message, Signal, TcpMessage};
use cobalt_proto::session::stream::Connection;
use cobalt_proto::session::{Session, SessionError, SessionEvent};
use cobalt_proto::tcp_connection::{CloseReason, Framing, TcpConfig, TcpConnection, TcpEvent};
use cobalt_proto::uri::Scheme;
use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

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
    conns: Mutex<HashMap<SocketAddr, Opened>>,
    /// Shows the connections' messages (`cobalt -v`); shared with the client.
    tracer: TracerSlot,
}

/// A pooled connection: its task's command queue, and the task.
struct Opened {
    commands: mpsc::UnboundedSender<Command>,
    task: JoinHandle<()>,
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

    /// The URI scheme of this pool's connections.
    pub(crate) fn scheme(&self) -> Scheme {
        scheme(self.framing, self.tls.is_some())
    }

    /// The error of a command that a connection to `peer` closed before carrying out.
    pub(crate) fn closed_before_send(&self, peer: SocketAddr) -> Error {
        Error::Connection(ConnectionError {
            scheme: self.scheme(),
            peer,
            kind: ConnectionErrorKind::ClosedBeforeSend,
        })
    }

    /// The settings `peer` announced in its CSM (connecting first if needed).
    pub(crate) async fn settings(&self, peer: SocketAddr, host: &str) -> Result<PeerSettings> {
        self.call(peer, host, |reply| Command::Settings { reply })
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
        let whole = TcpMessage::from(request.clone());
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

    /// Hands a command to the pooled connection and waits for its answer. A
    /// connection that closes (idle Release, server restart) before carrying the
    /// command out drops it unanswered; then one fresh connection is tried.
    async fn call<T>(
        &self,
        peer: SocketAddr,
        host: &str,
        command: impl Fn(oneshot::Sender<Result<T>>) -> Command,
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
        Err(self.closed_before_send(peer))
    }

    /// Ends every pooled connection (Release, then TCP FIN, TLS close_notify or
    /// WebSocket close) and waits until they are closed; requests in flight on them
    /// fail with [`Error::Shutdown`]. Later requests open new connections.
    pub(crate) async fn close(&self) {
        let opened: Vec<Opened> = {
            let mut conns = self.conns.lock().unwrap_or_else(|e| e.into_inner());
            conns.drain().map(|(_, o)| o).collect()
        };
        for o in &opened {
            let _ = o.commands.send(Command::Shutdown {
                grace: Duration::ZERO,
            });
        }
        for o in opened {
            let _ = o.task.await;
        }
    }

    /// Hands `command` to the pooled connection to `peer`, opening one if there is
    /// none; returns the connection's command channel, or `Err` when the connection
    /// closed meanwhile (the caller tries again, and gets a new one). A new
    /// connection gets the command before its task starts, so that a connection that
    /// fails at once (a refused TLS handshake) still answers it with the reason.
    pub(crate) fn send(
        &self,
        peer: SocketAddr,
        host: &str,
        command: Command,
    ) -> std::result::Result<mpsc::UnboundedSender<Command>, ()> {
        let mut conns = self.conns.lock().unwrap_or_else(|e| e.into_inner());
        conns.retain(|_, o| !o.commands.is_closed());
        if let Some(o) = conns.get(&peer) {
            let tx = &o.commands;
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
        let task = match self.framing {
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
                tokio::spawn(client_conn(remote, connect, config, rx))
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
                tokio::spawn(client_conn(remote, connect, config, rx))
            }
        };
        conns.insert(
            peer,
            Opened {
                commands: tx.clone(),
                task,
            },
        );
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

/// How a client connection of `scheme` words the errors of its requests.
struct StreamErrors {
    scheme: Scheme,
}

impl ExchangeErrors for StreamErrors {
    fn refused(&self, peer: SocketAddr, what: &str, error: SessionError) -> Error {
        Error::Connection(ConnectionError {
            scheme: self.scheme,
            peer,
            kind: ConnectionErrorKind::Refused(format!("{what}: {error}")),
        })
    }

    fn closed(&self, peer: SocketAddr, reason: CloseReason) -> Error {
        closed_error(self.scheme, peer, &reason, false)
    }
}

/// Connects (`connect`: TCP, and for WebSockets the upgrade) and then serves one
/// client connection until it closes, the pool is dropped or the client closes it
/// ([`Command::Shutdown`]); commands that arrive meanwhile are failed so callers can
/// retry. Its requests are an [`Exchanges`] over the connection's [`Session`].
async fn client_conn<L, C>(
    remote: Remote,
    connect: C,
    config: TcpConfig,
    mut commands: mpsc::UnboundedReceiver<Command>,
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
    let conn = TcpConnection::with_framing(config, L::FRAMING, Instant::now(), rand::random());
    let mut session = Connection::new(peer, conn);
    let mut exchanges = Exchanges::new(StreamErrors { scheme });
    // Commands held back until the server's CSM says how large a message may be.
    let mut deferred: Vec<Command> = Vec::new();
    let mut close_reason = None;
    loop {
        if session.connection().is_established() {
            for cmd in std::mem::take(&mut deferred) {
                carry_out(&mut exchanges, &mut session, cmd);
            }
        }
        if session.connection().is_closed() {
            // The callers told of the close below (an observation registers again at
            // once) must find the pool opening a new connection, not this one's queue.
            commands.close();
        }
        while let Some(event) = session.poll_event() {
            if let SessionEvent::Response { response, .. } = &event {
                if remote.tracer.is_some() {
                    remote.trace(false, &TcpMessage::from(response.clone()));
                }
            }
            let Some(SessionEvent::Connection { event, .. }) =
                exchanges.on_event(&mut session, Instant::now(), event)
            else {
                continue;
            };
            match event {
                TcpEvent::PeerSettings {
                    max_message_size,
                    block_wise_transfer,
                    max_token_len,
                } => {
                    let csm = Signal::Csm {
                        extended_token_length: (max_token_len > 8).then_some(max_token_len as u32),
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
        let conn = session.connection_mut();
        let framing = conn.framing();
        let trace = |bytes: &[u8]| remote.trace_output(framing, bytes);
        if !flush(conn, &mut link, Duration::from_secs(30), trace).await {
            close_reason.get_or_insert(CloseReason::PeerClosed);
            break;
        }
        if conn.is_closed() {
            break;
        }
        let timer = conn.poll_timeout().map(tokio::time::Instant::from_std);
        let (established, releasing) = (conn.is_established(), conn.is_releasing());
        tokio::select! {
            input = link.recv() => handle_input(session.connection_mut(), input),
            cmd = commands.recv(), if !releasing => match cmd {
                None => session.connection_mut().release(),
                // Nothing to release before the CSM: the link just closes.
                Some(Command::Shutdown { .. }) if !established => {
                    for cmd in deferred.drain(..) {
                        cmd.fail(Error::Shutdown);
                    }
                    break;
                }
                Some(cmd) if !established => deferred.push(cmd),
                Some(cmd) => carry_out(&mut exchanges, &mut session, cmd),
            },
            _ = sleep_until(timer) => session.connection_mut().handle_timeout(Instant::now()),
        }
    }
    // Commands not yet carried out are dropped unanswered: their callers retry. The
    // channel is closed first, so that what the callers send next (an observation
    // registering again) opens a new connection.
    commands.close();
    while commands.try_recv().is_ok() {}
    let reason = close_reason.unwrap_or(CloseReason::PeerClosed);
    exchanges.fail_all(&mut session, Instant::now(), |peer| {
        closed_error(scheme, peer, &reason, false)
    });
    for cmd in deferred {
        cmd.fail(closed_error(scheme, peer, &reason, true));
    }
    let _ = tokio::time::timeout(Duration::from_secs(5), link.close()).await;
}

/// Carries out `cmd` on an established client connection. [`Command::Shutdown`]
/// fails every request in flight and releases the connection (RFC 8323 §5.5), which
/// then closes.
fn carry_out(exchanges: &mut Exchanges<StreamErrors>, session: &mut Connection, cmd: Command) {
    let now = Instant::now();
    match exchanges.command(session, now, cmd) {
        None => {}
        Some(Command::Settings { reply }) => {
            let conn = session.connection();
            let _ = reply.send(Ok(PeerSettings {
                max_message_size: conn.peer_max_message_size(),
                bert: conn.bert(),
            }));
        }
        Some(Command::Shutdown { .. }) => {
            exchanges.fail_all(session, now, |_| Error::Shutdown);
            session.connection_mut().release();
        }
        Some(other) => other.fail(Error::Shutdown),
    }
}
