//! The server: a resource tree served by one or more shards.
//!
//! ```no_run
//! use cobalt::server::{get, post, Request, Server};
//!
//! # async fn demo() -> cobalt::Result<()> {
//! let server = Server::new()
//!     .route("/hello", get(|| async { "hello world" }).rt("greeting"))
//!     .route("/echo", post(|req: Request| async move { req.payload().to_vec() }))
//!     .bind("127.0.0.1:5683")
//!     .await?;
//! println!("listening on {}", server.local_addr());
//! server.wait().await;
//! # Ok(()) }
//! ```

mod budget;
mod executor;
mod fanout;
mod handler;
mod intake;
mod limits;
pub(crate) mod observe;
mod request;
pub(crate) mod shard;
pub(crate) mod stream;
mod stream_observe;
mod tables;
pub(crate) mod tree;
mod upload;
mod validate;

pub use executor::{AsyncPool, Executor, ThreadPool};
pub use handler::{
    any, delete, fetch, get, ipatch, patch, post, put, BoxFuture, BoxedChunkHandler, Handler,
    MethodRouter, UploadChunk,
};
pub use limits::ServerLimits;
pub use observe::{Observable, ObserverFilter};
pub use request::{IntoResponse, Request, Response};
pub use tree::{ResourceTree, WELL_KNOWN_CORE};

use crate::config::Config;
use crate::error::{SetupError, Unsupported};
use crate::metrics::Metrics;
use crate::runtime::driver::{spawn_driver, Command, DriverIo};
use crate::runtime::io::{start_stages, StageCounters, StageThreads, Stages};
use crate::transport::dtls::{DtlsBackend, DtlsConfig, OpensslDtls, PskStore, X509Credentials};
use crate::transport::tcp::{TcpListenerHandle, TcpServerLimits, Transport};
use crate::transport::tls::{Alpn, TlsAcceptor};
use crate::transport::udp::{bind_shard_sockets_with, SocketBuffers};
use crate::{Error, Result};
use cobalt_proto::endpoint::EndpointConfig;
use cobalt_proto::tcp_connection::Framing;
use cobalt_proto::uri::Scheme;
use observe::ChangeInbox;
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;

/// A server under construction: resources and settings, then [`Server::bind`].
#[derive(Debug, Default)]
pub struct Server {
    tree: ResourceTree,
    config: EndpointConfig,
    limits: ServerLimits,
    shards: Option<usize>,
    stages: Option<Stages>,
    stage_counters: Arc<StageCounters>,
    recv_batch: Option<usize>,
    buffers: SocketBuffers,
    tcp_limits: TcpServerLimits,
    psk_keys: Option<Arc<PskStore>>,
    x509: Option<Arc<X509Credentials>>,
    dtls_config: DtlsConfig,
    dtls_addr: Option<SocketAddr>,
    ws_limits: TcpServerLimits,
    /// Connection-oriented listeners to start next to UDP: coap+tcp, coaps+tcp,
    /// coap+ws, coaps+ws.
    streams: Vec<(StreamScheme, SocketAddr)>,
}

/// A connection-oriented way of serving CoAP (RFC 8323).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StreamScheme {
    /// `coap+tcp`.
    Tcp,
    /// `coaps+tcp`.
    Tls,
    /// `coap+ws`.
    Ws,
    /// `coaps+ws`.
    Wss,
}

impl StreamScheme {
    fn framing(self) -> Framing {
        match self {
            StreamScheme::Tcp | StreamScheme::Tls => Framing::Stream,
            StreamScheme::Ws | StreamScheme::Wss => Framing::WebSocket,
        }
    }

    fn secure(self) -> bool {
        matches!(self, StreamScheme::Tls | StreamScheme::Wss)
    }

    /// The URI scheme.
    fn uri_scheme(self) -> Scheme {
        match self {
            StreamScheme::Tcp => Scheme::CoapTcp,
            StreamScheme::Tls => Scheme::CoapsTcp,
            StreamScheme::Ws => Scheme::CoapWs,
            StreamScheme::Wss => Scheme::CoapsWs,
        }
    }

    /// The label of the listener's metrics.
    fn label(self) -> &'static str {
        match self {
            StreamScheme::Tcp => "tcp",
            StreamScheme::Tls => "tls",
            StreamScheme::Ws => "ws",
            StreamScheme::Wss => "wss",
        }
    }
}

impl Server {
    /// A server with no resources and the RFC 7252 default parameters.
    pub fn new() -> Server {
        Server::default()
    }

    /// Adds a resource at `path`.
    pub fn route(mut self, path: &str, resource: MethodRouter) -> Server {
        self.tree.insert(path, resource);
        self
    }

    /// Runs the handlers of every resource at or below `path` on `executor` (children
    /// inherit the nearest ancestor's choice; the default is inline on the shard).
    pub fn executor(mut self, path: &str, executor: Executor) -> Server {
        self.tree.set_executor(path, executor);
        self
    }

    /// Sets the protocol parameters.
    pub fn config(mut self, config: EndpointConfig) -> Server {
        self.config = config;
        self
    }

    /// Sets the server-role limits (observers, uploads, block size).
    pub fn limits(mut self, limits: ServerLimits) -> Server {
        self.limits = limits;
        self
    }

    /// Single-socket mode (the paper's stage design, for systems without
    /// `SO_REUSEPORT`): one socket, `stages.receivers` receiver threads handing each
    /// datagram to one of `stages.workers` protocol workers by a hash of the peer's
    /// address (so each peer's state stays in one worker), and `stages.senders` sender
    /// threads. Replaces [`Server::shards`].
    pub fn single_socket(mut self, stages: Stages) -> Server {
        self.stages = Some(stages);
        self
    }

    /// Counters of single-socket mode (datagrams refused with 5.03 on full queues).
    pub fn stage_counters(&self) -> Arc<StageCounters> {
        self.stage_counters.clone()
    }

    /// Number of shards (threads with their own `SO_REUSEPORT` socket); default: one per core.
    pub fn shards(mut self, shards: usize) -> Server {
        self.shards = Some(shards.max(1));
        self
    }

    /// Datagrams each shard reads per wake-up before timers and commands get a turn
    /// (default 256; rounded up to whole `recvmmsg` batches of 64).
    pub fn recv_batch(mut self, datagrams: usize) -> Server {
        self.recv_batch = Some(datagrams.max(1));
        self
    }

    /// Socket buffer sizes asked of the kernel (default 4 MiB each; 0 keeps the
    /// kernel's default).
    pub fn socket_buffers(mut self, buffers: SocketBuffers) -> Server {
        self.buffers = buffers;
        self
    }

    /// Applies a [`Config`]: endpoint parameters, limits, runtime settings (shards,
    /// receive batch, socket buffers) and the limits of the TCP, TLS and WebSocket
    /// listeners (`[connections]`). The address to bind is `config.server`:
    /// `server.with_config(&config).bind(config.server.socket_addr())`.
    pub fn with_config(mut self, config: &Config) -> Server {
        self.config = config.endpoint_config();
        self.limits = config.server_limits();
        self.shards = (config.runtime.shards > 0).then_some(config.runtime.shards);
        self.recv_batch = Some(config.runtime.recv_batch.max(1));
        self.buffers = SocketBuffers {
            recv: config.runtime.socket_recv_buffer,
            send: config.runtime.socket_send_buffer,
        };
        self.tcp_limits = config.connection_limits();
        self.ws_limits = config.connection_limits();
        self.dtls_config = config.dtls_config();
        self
    }

    /// Also serves the same resources over CoAP over TCP (RFC 8323, `coap+tcp://`) on
    /// `addr`, bound by [`Server::bind`] next to the UDP socket; see
    /// [`ServerHandle::tcp_local_addr`].
    pub fn tcp(mut self, addr: SocketAddr) -> Server {
        self.streams.push((StreamScheme::Tcp, addr));
        self
    }

    /// Also serves the same resources over CoAP over TLS (RFC 8323 §8.2,
    /// `coaps+tcp://`, usually port 5684) on `addr`, with the credentials of
    /// [`Server::x509`] and/or [`Server::psk`] and the limits of [`Server::tcp_limits`];
    /// see [`ServerHandle::tls_local_addr`].
    pub fn tls(mut self, addr: SocketAddr) -> Server {
        self.streams.push((StreamScheme::Tls, addr));
        self
    }

    /// Also serves the same resources over CoAP over secure WebSockets (`coaps+ws://`,
    /// TLS under [`Server::ws`]'s protocol) on `addr`, with the credentials of
    /// [`Server::x509`] and/or [`Server::psk`] and the limits of [`Server::ws_limits`];
    /// see [`ServerHandle::wss_local_addr`].
    pub fn wss(mut self, addr: SocketAddr) -> Server {
        self.streams.push((StreamScheme::Wss, addr));
        self
    }

    /// The pre-shared keys accepted over DTLS (`coaps`) and TLS (`coaps+tcp`,
    /// `coaps+ws`), by identity.
    pub fn psk(mut self, keys: PskStore) -> Server {
        self.psk_keys = Some(Arc::new(keys));
        self
    }

    /// The certificate (and, with `ca_pem`, the CA that client certificates must chain
    /// to, making them required) for DTLS and TLS; may be combined with [`Server::psk`].
    pub fn x509(mut self, credentials: X509Credentials) -> Server {
        self.x509 = Some(Arc::new(credentials));
        self
    }

    /// Sets the limits of the TCP side (connections, Max-Message-Size, timeouts).
    pub fn tcp_limits(mut self, limits: TcpServerLimits) -> Server {
        self.tcp_limits = limits;
        self
    }

    /// Sets the DTLS session limits and timers (sessions per shard, handshake timeout).
    pub fn dtls_config(mut self, config: DtlsConfig) -> Server {
        self.dtls_config = config;
        self
    }

    /// Also serves the same resources over CoAP over DTLS (`coaps://`, usually port
    /// 5684) on `addr`, bound by [`Server::bind`] next to the UDP socket; see
    /// [`ServerHandle::dtls_local_addr`]. Needs [`Server::psk`] or [`Server::x509`].
    pub fn dtls(mut self, addr: SocketAddr) -> Server {
        self.dtls_addr = Some(addr);
        self
    }

    /// The endpoint configuration of a shard. DTLS peers have proven their address in
    /// the cookie exchange, so the amplification limit does not apply to them.
    fn shard_config(&self, dtls: bool) -> EndpointConfig {
        let mut config = self.config.clone();
        if dtls {
            config.amplification_factor = 0;
        }
        config
    }

    /// Fails, saying that `what` needs them, unless [`Server::psk`] or
    /// [`Server::x509`] gave credentials.
    fn require_credentials(&self, scheme: Scheme) -> Result<()> {
        if self.psk_keys.is_none() && self.x509.is_none() {
            return Err(Error::Unsupported(Unsupported::NoCredentials {
                scheme,
                how: "call Server::psk or Server::x509",
            }));
        }
        Ok(())
    }

    /// A DTLS session table for one shard.
    fn dtls_layer(&self) -> Result<Box<dyn DtlsBackend>> {
        self.require_credentials(Scheme::Coaps)?;
        let layer = OpensslDtls::server_with(
            self.psk_keys.clone(),
            self.x509.as_deref(),
            self.dtls_config.clone(),
        )
        .map_err(|e| e.into_error("DTLS", Scheme::Coaps))?;
        Ok(Box::new(layer))
    }

    /// Serves over CoAP over DTLS only (`coaps://`, RFC 7252 §9) with the keys of
    /// [`Server::psk`] or [`Server::x509`]: the same shards as [`Server::bind`], each datagram passing
    /// through the shard's DTLS session table.
    pub async fn bind_dtls(self, addr: impl ToSocketAddrs) -> Result<ServerHandle> {
        self.bind_with(addr, true).await
    }

    /// Also serves the same resources over CoAP over WebSockets (RFC 8323 §4,
    /// `coap+ws://`) on `addr`, bound by [`Server::bind`] next to the UDP socket:
    /// HTTP/1.1 upgrades on `/.well-known/coap` with subprotocol `coap`; see
    /// [`ServerHandle::ws_local_addr`].
    pub fn ws(mut self, addr: SocketAddr) -> Server {
        self.streams.push((StreamScheme::Ws, addr));
        self
    }

    /// Sets the limits of the WebSocket side (connections, Max-Message-Size, which is
    /// also the WebSocket frame and message size limit, upgrade and idle timeouts).
    pub fn ws_limits(mut self, limits: TcpServerLimits) -> Server {
        self.ws_limits = limits;
        self
    }

    /// Serves over CoAP over WebSockets only (RFC 8323 §4, `coap+ws://`), on the
    /// current tokio runtime: one task per connection, handlers run on that task.
    /// [`ServerHandle::local_addr`] is then the WebSocket (TCP) address.
    pub async fn bind_ws(self, addr: impl ToSocketAddrs) -> Result<ServerHandle> {
        self.bind_stream(StreamScheme::Ws, addr).await
    }

    /// Serves over CoAP over TCP only (RFC 8323, `coap+tcp://`), on the current tokio
    /// runtime: one task per connection, handlers run on that task.
    /// [`ServerHandle::local_addr`] is then the TCP address.
    pub async fn bind_tcp(self, addr: impl ToSocketAddrs) -> Result<ServerHandle> {
        self.bind_stream(StreamScheme::Tcp, addr).await
    }

    /// Serves over CoAP over TLS only (RFC 8323 §8.2, `coaps+tcp://`), like
    /// [`Server::bind_tcp`] with TLS; needs [`Server::x509`] or [`Server::psk`].
    pub async fn bind_tls(self, addr: impl ToSocketAddrs) -> Result<ServerHandle> {
        self.bind_stream(StreamScheme::Tls, addr).await
    }

    /// Serves over CoAP over secure WebSockets only (`coaps+ws://`), like
    /// [`Server::bind_ws`] with TLS; needs [`Server::x509`] or [`Server::psk`].
    pub async fn bind_wss(self, addr: impl ToSocketAddrs) -> Result<ServerHandle> {
        self.bind_stream(StreamScheme::Wss, addr).await
    }

    async fn bind_stream(
        mut self,
        scheme: StreamScheme,
        addr: impl ToSocketAddrs,
    ) -> Result<ServerHandle> {
        let addr = addr
            .to_socket_addrs()?
            .next()
            .ok_or_else(|| Error::Resolve {
                host: "the bind address".into(),
                reason: "it resolved to no address".into(),
            })?;
        self.streams = vec![(scheme, addr)];
        let tree = Arc::new(std::mem::take(&mut self.tree));
        let streams = self.start_streams(&tree).await?;
        Ok(ServerHandle {
            local_addr: streams[0].1.local_addr,
            limit_counters: tree.budgets().counters.clone(),
            commands: Vec::new(),
            threads: Vec::new(),
            stage_threads: None,
            metrics: Metrics::new(0),
            streams,
            dtls_local_addr: None,
        })
    }

    /// Starts the connection-oriented listeners; on failure stops those already started.
    async fn start_streams(
        &self,
        tree: &Arc<ResourceTree>,
    ) -> Result<Vec<(StreamScheme, TcpListenerHandle)>> {
        let mut started: Vec<(StreamScheme, TcpListenerHandle)> = Vec::new();
        for &(scheme, addr) in &self.streams {
            match self.start_stream(scheme, addr, tree).await {
                Ok(l) => started.push((scheme, l)),
                Err(e) => {
                    for (_, l) in &started {
                        l.shutdown(Duration::ZERO);
                    }
                    return Err(e);
                }
            }
        }
        Ok(started)
    }

    async fn start_stream(
        &self,
        scheme: StreamScheme,
        addr: SocketAddr,
        tree: &Arc<ResourceTree>,
    ) -> Result<TcpListenerHandle> {
        let tls = if scheme.secure() {
            let uri_scheme = scheme.uri_scheme();
            self.require_credentials(uri_scheme)?;
            let alpn = Alpn::for_framing(scheme.framing());
            let acceptor = TlsAcceptor::new(self.x509.as_deref(), self.psk_keys.clone(), alpn)
                .map_err(|e| e.into_error("TLS", uri_scheme))?;
            Some(acceptor)
        } else {
            None
        };
        let limits = match scheme.framing() {
            Framing::Stream => self.tcp_limits.clone(),
            Framing::WebSocket => self.ws_limits.clone(),
        };
        let transport = Transport {
            framing: scheme.framing(),
            tls,
        };
        let name = transport.scheme();
        let listener = crate::transport::tcp::listen(
            addr,
            tree.clone(),
            self.limits.clone(),
            limits,
            transport,
        )
        .await
        .map_err(|e| {
            Error::Io(std::io::Error::new(
                e.kind(),
                format!("cannot listen for {name} on {addr}: {e}"),
            ))
        })?;
        tracing::info!(local_addr = %listener.local_addr, scheme = %name, "CoAP listening");
        Ok(listener)
    }

    /// Binds the UDP address and starts serving.
    pub async fn bind(self, addr: impl ToSocketAddrs) -> Result<ServerHandle> {
        self.bind_with(addr, false).await
    }

    async fn bind_with(mut self, addr: impl ToSocketAddrs, secure: bool) -> Result<ServerHandle> {
        self.config.validate()?;
        let addr = addr
            .to_socket_addrs()?
            .next()
            .ok_or_else(|| Error::Resolve {
                host: "the bind address".into(),
                reason: "it resolved to no address".into(),
            })?;
        let shards = self
            .shards
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
        let (ios, local_addr, stage_threads) = match self.stages {
            None => {
                let sockets = bind_shard_sockets_with(addr, shards, self.buffers)?;
                let local_addr = sockets[0].local_addr()?;
                (
                    sockets.into_iter().map(DriverIo::Owned).collect::<Vec<_>>(),
                    local_addr,
                    None,
                )
            }
            Some(stages) => {
                let socket = bind_shard_sockets_with(addr, 1, self.buffers)?.remove(0);
                let local_addr = socket.local_addr()?;
                let (ios, threads) = start_stages(socket, stages, self.stage_counters.clone())?;
                let ios = ios
                    .into_iter()
                    .map(|io| DriverIo::Staged(io, local_addr))
                    .collect();
                (ios, local_addr, Some(threads))
            }
        };
        // DTLS shards next to plain ones publish into the slots after the plain shards'.
        let dtls_shards = if self.dtls_addr.is_some() && !secure {
            shards
        } else {
            0
        };
        let mut metrics = Metrics::new(ios.len() + dtls_shards);
        if stage_threads.is_some() {
            metrics = metrics.with_stages(self.stage_counters.clone());
        }
        let tree = Arc::new(std::mem::take(&mut self.tree));
        let mut started = Started::default();
        for (i, io) in ios.into_iter().enumerate() {
            let dtls = if secure {
                Some(self.dtls_layer()?)
            } else {
                None
            };
            let slot = metrics.shards()[i].clone();
            let name = format!("cobalt-shard-{i}");
            self.spawn_shard(name, io, &tree, secure, Some(slot), dtls, &mut started)?;
        }
        let dtls_local_addr = match self.dtls_addr.filter(|_| !secure) {
            Some(addr) => Some(self.spawn_dtls_shards(
                addr,
                shards,
                &tree,
                &mut started,
                &metrics.shards()[metrics.shards().len() - dtls_shards..],
            )?),
            None => None,
        };
        for o in tree.observables() {
            o.attach(started.inboxes.clone());
        }
        let Started {
            commands, threads, ..
        } = started;
        tracing::info!(%local_addr, workers = commands.len(), staged = stage_threads.is_some(), "CoAP server listening");
        let streams = match self.start_streams(&tree).await {
            Ok(streams) => streams,
            Err(e) => {
                for c in &commands {
                    let _ = c.send(Command::Shutdown {
                        grace: Duration::ZERO,
                    });
                }
                return Err(e);
            }
        };
        Ok(ServerHandle {
            local_addr,
            limit_counters: tree.budgets().counters.clone(),
            commands,
            threads,
            stage_threads,
            metrics,
            streams,
            dtls_local_addr: if secure {
                Some(local_addr)
            } else {
                dtls_local_addr
            },
        })
    }

    /// Starts `shards` DTLS shards on `addr` next to the plain ones.
    fn spawn_dtls_shards(
        &self,
        addr: SocketAddr,
        shards: usize,
        tree: &Arc<ResourceTree>,
        started: &mut Started,
        slots: &[Arc<crate::metrics::ShardMetrics>],
    ) -> Result<SocketAddr> {
        let sockets = bind_shard_sockets_with(addr, shards, self.buffers)?;
        let local_addr = sockets[0].local_addr()?;
        for (i, socket) in sockets.into_iter().enumerate() {
            let io = DriverIo::Owned(socket);
            let dtls = Some(self.dtls_layer()?);
            let name = format!("cobalt-dtls-{i}");
            self.spawn_shard(name, io, tree, true, slots.get(i).cloned(), dtls, started)?;
        }
        tracing::info!(%local_addr, "CoAP over DTLS listening");
        Ok(local_addr)
    }

    /// Starts one server shard (with its changes inbox) on its own thread.
    #[allow(clippy::too_many_arguments)]
    fn spawn_shard(
        &self,
        name: String,
        io: DriverIo,
        tree: &Arc<ResourceTree>,
        dtls_peers: bool,
        slot: Option<Arc<crate::metrics::ShardMetrics>>,
        dtls: Option<Box<dyn DtlsBackend>>,
        started: &mut Started,
    ) -> Result<()> {
        let inbox = Arc::new(ChangeInbox::default());
        let (tx, handle) = spawn_driver(
            name,
            io,
            self.shard_config(dtls_peers),
            Some((tree.clone(), self.limits.clone(), inbox.clone())),
            None,
            self.recv_batch,
            slot,
            dtls,
        )?;
        started.commands.push(tx);
        started.inboxes.push(inbox);
        started.threads.push(handle);
        Ok(())
    }
}

/// The shards started so far: their command queues, changes inboxes and threads.
#[derive(Default)]
struct Started {
    commands: Vec<mpsc::UnboundedSender<Command>>,
    inboxes: Vec<Arc<ChangeInbox>>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

/// A running server.
#[derive(Debug)]
pub struct ServerHandle {
    local_addr: SocketAddr,
    /// Refusals and dropped uploads over every shard and listener.
    limit_counters: Arc<crate::metrics::LimitCounters>,
    commands: Vec<mpsc::UnboundedSender<Command>>,
    threads: Vec<std::thread::JoinHandle<()>>,
    stage_threads: Option<StageThreads>,
    metrics: Metrics,
    streams: Vec<(StreamScheme, TcpListenerHandle)>,
    dtls_local_addr: Option<SocketAddr>,
}

impl std::fmt::Debug for StageThreads {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("StageThreads")
    }
}

impl ServerHandle {
    /// The shards' counters, updated after every batch a shard processes; serve them
    /// with [`crate::metrics::serve_metrics`].
    pub fn metrics(&self) -> Metrics {
        let mut m = self
            .metrics
            .clone()
            .with_limits(self.limit_counters.clone());
        for (scheme, l) in &self.streams {
            m = m.with_transport(scheme.label(), l.counters.clone());
        }
        m
    }

    /// The bound address (with the real port when 0 was asked for).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The CoAP-over-TCP address, when serving over TCP too ([`Server::tcp`],
    /// [`Server::bind_tcp`]).
    pub fn tcp_local_addr(&self) -> Option<SocketAddr> {
        self.stream_addr(StreamScheme::Tcp)
    }

    /// The CoAP-over-TLS (`coaps+tcp`) address, when serving over TLS too
    /// ([`Server::tls`], [`Server::bind_tls`]).
    pub fn tls_local_addr(&self) -> Option<SocketAddr> {
        self.stream_addr(StreamScheme::Tls)
    }

    /// The CoAP-over-secure-WebSockets (`coaps+ws`) address ([`Server::wss`],
    /// [`Server::bind_wss`]).
    pub fn wss_local_addr(&self) -> Option<SocketAddr> {
        self.stream_addr(StreamScheme::Wss)
    }

    fn stream_addr(&self, scheme: StreamScheme) -> Option<SocketAddr> {
        self.streams
            .iter()
            .find(|(s, _)| *s == scheme)
            .map(|(_, l)| l.local_addr)
    }

    /// The CoAP-over-DTLS (`coaps`) address, when serving over DTLS
    /// ([`Server::dtls`], [`Server::bind_dtls`]).
    pub fn dtls_local_addr(&self) -> Option<SocketAddr> {
        self.dtls_local_addr
    }

    /// The CoAP-over-WebSockets address, when serving over WebSockets too
    /// ([`Server::ws`], [`Server::bind_ws`]).
    pub fn ws_local_addr(&self) -> Option<SocketAddr> {
        self.stream_addr(StreamScheme::Ws)
    }

    /// Graceful shutdown: stop reading, let handlers in progress answer for up to
    /// `grace`, then stop every shard (and release every TCP connection).
    pub async fn shutdown(self, grace: Duration) {
        tracing::info!(local_addr = %self.local_addr, ?grace, "CoAP server shutting down");
        for c in &self.commands {
            let _ = c.send(Command::Shutdown { grace });
        }
        for (_, l) in &self.streams {
            l.shutdown(grace);
        }
        let local_addr = self.local_addr;
        self.wait().await;
        tracing::info!(%local_addr, "CoAP server stopped");
    }

    /// Waits until every shard (and the TCP listener) has stopped.
    pub async fn wait(self) {
        for (_, l) in self.streams {
            l.wait().await;
        }
        let (threads, stages) = (self.threads, self.stage_threads);
        let _ = tokio::task::spawn_blocking(move || {
            for t in threads {
                let _ = t.join();
            }
            if let Some(s) = stages {
                s.stop();
            }
        })
        .await;
    }
}
