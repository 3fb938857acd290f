//! The server: a resource tree served over any of the six CoAP transports.
//!
//! ```no_run
//! use cobalt::server::{get, post, Request, Server};
//! use cobalt::Scheme;
//!
//! # async fn demo() -> cobalt::Result<()> {
//! let server = Server::new()
//!     .route("/hello", get(|| async { "hello world" }).rt("greeting"))
//!     .route("/echo", post(|req: Request| async move { req.payload().to_vec() }))
//!     .listen(Scheme::Coap, "127.0.0.1:5683")
//!     .listen(Scheme::CoapTcp, "127.0.0.1:5683")
//!     .start()
//!     .await?;
//! println!("coap+tcp on {:?}", server.local_addr(Scheme::CoapTcp));
//! server.wait().await;
//! # Ok(()) }
//! ```

mod budget;
mod carried;
mod exact;
mod executor;
mod extensions;
pub mod extract;
mod fanout;
pub mod group;
mod handler;
mod handoff;
mod intake;
mod layer;
pub mod layers;
mod limits;
pub(crate) mod observe;
mod pattern;
mod qblock2_send;
mod qblock_wait;
mod request;
pub(crate) mod role;
mod routes;
mod settings;
pub(crate) mod stream;
pub(crate) mod tree;
mod upload_table;
mod validate;

pub use crate::client::{Exchange, Refusal};
pub use crate::transport::identity::{Credential, PeerIdentity};
pub use cobalt_proto::blockwise::uploads::UploadLimits;
pub use cobalt_proto::observe::relations::ConPolicy;
pub use executor::{AsyncPool, Executor, ThreadPool};
pub use extensions::Extensions;
pub use group::GroupConfig;
pub use handler::{
    any, delete, fetch, get, ipatch, patch, post, put, via, BoxedChunkHandler, FromRequest,
    FromRequestParts, Handler, MethodRouter, UploadChunk,
};
pub use layer::{Layer, Observer};
pub use limits::ServerLimits;
pub use observe::{Observable, ObserverFilter};
pub use pattern::InvalidRoute;
pub use request::{BoxFuture, IntoResponse, Request, Response};
pub use routes::{Routes, State};
pub use settings::ServerSettings;
pub use tree::{ResourceTree, WELL_KNOWN_CORE};

use crate::changes::ChangeInbox;
use crate::error::{SetupError, Unsupported};
use crate::metrics::Metrics;
use crate::metrics::TcpCounters;
use crate::runtime::command::Command;
use crate::runtime::driver::{spawn_driver, DriverIo};
use crate::runtime::io::{start_stages, StageCounters, StageThreads, Stages};
use crate::runtime::listener::{self, TcpListenerHandle, Transport};
use crate::runtime::service::{MakeService, ServiceLinks};
use crate::transport::credentials::{PskStore, X509Credentials};
use crate::transport::dtls::{DtlsBackend, DtlsBackendKind, DtlsConfig, OpensslDtls};
use crate::transport::limits::TcpServerLimits;
use crate::transport::tls::{Alpn, TlsAcceptor};
use crate::transport::udp::{bind_shard_sockets_sharing, SocketBuffers};
use crate::{Error, Result};
use cobalt_proto::blockwise::qblock::{Q_BLOCK1, Q_BLOCK2};
use cobalt_proto::endpoint::{Endpoint, EndpointConfig};
use cobalt_proto::settings::Settings;
use cobalt_proto::tcp_connection::Framing;
use cobalt_proto::uri::Scheme;
use layer::Front;
pub(crate) use layer::Layers;
use role::{ConnectionRole, ShardRole};
use routes::StateValue;
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::Arc;
use std::time::Duration;
use stream::StreamShared;
use tokio::sync::mpsc;

/// A server under construction: resources and settings, then [`Server::bind`].
#[derive(Debug, Default)]
pub struct Server {
    tree: ResourceTree,
    /// What [`State`] hands the handlers.
    state: Option<StateValue>,
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
    ws_limits: TcpServerLimits,
    /// The listeners [`Server::start`] opens, in the order given (an address that did
    /// not resolve is reported by `start`).
    listeners: Vec<(Scheme, std::io::Result<SocketAddr>)>,
    /// The server's layers, outermost first.
    layers: Layers,
    /// The groups the `coap` listener joins ([`Server::join_multicast`]).
    groups: Option<GroupConfig>,
}

/// How a connection-oriented scheme (RFC 8323) frames its messages.
fn stream_framing(scheme: Scheme) -> Framing {
    if scheme.is_websocket() {
        Framing::WebSocket
    } else {
        Framing::Stream
    }
}

/// The `transport` label of a connection-oriented listener's metrics.
fn metric_label(scheme: Scheme) -> &'static str {
    match scheme {
        Scheme::CoapTcp => "tcp",
        Scheme::CoapsTcp => "tls",
        Scheme::CoapWs => "ws",
        Scheme::CoapsWs => "wss",
        Scheme::Coap => "udp",
        Scheme::Coaps => "dtls",
    }
}

/// The first address `addr` resolves to.
fn resolve(addr: impl ToSocketAddrs) -> std::io::Result<SocketAddr> {
    addr.to_socket_addrs()?.next().ok_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "the address resolved to no address",
        )
    })
}

impl Server {
    /// A server with no resources and the RFC 7252 default parameters.
    pub fn new() -> Server {
        Server::default()
    }

    /// Adds a resource at `path`: segments separated by `/`, each literal text, a
    /// parameter `{name}` matching any one segment, or (last) a wildcard `{*name}`
    /// matching the remaining segments, zero or more. Handlers read the parameters with
    /// [`Request::param`] or the [`extract::Path`] argument. Where several routes
    /// match, the one whose segments match best from the left serves: literal before
    /// parameter before wildcard. `/.well-known/core` lists the routes with a literal
    /// path. To change routes while serving, see [`Routes`].
    ///
    /// # Panics
    ///
    /// When `path` is not a valid pattern: braces that are not a whole `{name}`
    /// segment, a wildcard before the last segment, or a name used twice.
    pub fn route(mut self, path: &str, resource: MethodRouter) -> Server {
        self.tree.insert(path, resource);
        self
    }

    /// Puts `layer` around every request, answer and notification of the server (see
    /// [`Layer`]); the first layer given is the outermost. The option numbers the
    /// layer declares ([`Layer::options`]) pass the protocol machines of every
    /// transport.
    pub fn layer<L: Layer>(mut self, layer: L) -> Server {
        self.layers.push(Arc::new(layer));
        self
    }

    /// The front of a listener over `scheme`: the layers and the transport.
    fn front(&self, scheme: Scheme) -> Front {
        Front {
            layers: self.layers.clone(),
            scheme,
        }
    }

    /// Answers the requests that no route matches with `resource` (4.05 for a method
    /// it has no handler for) instead of 4.04 Not Found. A forward proxy is built on it:
    /// its handlers see every request for a path no route has, Proxy-Uri and
    /// Proxy-Scheme included once the server passes those to routing.
    pub fn fallback(mut self, resource: MethodRouter) -> Server {
        self.tree.set_fallback(resource);
        self
    }

    /// Gives the handlers `state`: a handler argument [`State<S>`](State) is a clone of
    /// it. One state per server; a later call replaces it.
    pub fn with_state<S: Clone + Send + Sync + 'static>(mut self, state: S) -> Server {
        self.state = Some(StateValue::new(state));
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

    /// Applies [`ServerSettings`]: endpoint parameters, limits, runtime settings
    /// (shards, receive batch, socket buffers), the limits of the TCP, TLS and
    /// WebSocket listeners and the DTLS budgets. A configuration file gives them with
    /// `Config::server_settings`, and the address to serve with its `[server]` section:
    /// `server.with_config(&config.server_settings()).bind(config.server.socket_addr())`.
    pub fn with_config(mut self, settings: &ServerSettings) -> Server {
        self.config = settings.endpoint.clone();
        self.limits = settings.limits.clone();
        self.shards = settings.shards.filter(|n| *n > 0);
        self.recv_batch = settings.recv_batch.map(|n| n.max(1));
        self.buffers = settings.socket_buffers;
        self.tcp_limits = settings.connections.clone();
        self.ws_limits = settings.connections.clone();
        self.dtls_config = settings.dtls.clone();
        self
    }

    /// Serves the resources over `scheme` on `addr` once [`Server::start`] runs; call
    /// it once per scheme. The transports:
    ///
    /// - [`Scheme::Coap`]: UDP (RFC 7252), one `SO_REUSEPORT` socket per shard (or
    ///   [`Server::single_socket`]).
    /// - [`Scheme::Coaps`]: DTLS 1.2 (RFC 7252 §9) on as many shards, with the keys of
    ///   [`Server::psk`] and/or [`Server::x509`] and the limits of [`Server::dtls_config`].
    /// - [`Scheme::CoapTcp`] and [`Scheme::CoapsTcp`]: TCP and TLS (RFC 8323, TLS as in
    ///   §8.2, ALPN `coap`), limits from [`Server::tcp_limits`].
    /// - [`Scheme::CoapWs`] and [`Scheme::CoapsWs`]: WebSockets (RFC 8323 §4, upgrades on
    ///   `/.well-known/coap` with subprotocol `coap`), limits from [`Server::ws_limits`].
    ///
    /// The connection-oriented schemes run on the current tokio runtime, one task per
    /// connection; the handlers of every scheme run on their resource's executor.
    pub fn listen(mut self, scheme: Scheme, addr: impl ToSocketAddrs) -> Server {
        self.listeners.push((scheme, resolve(addr)));
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

    /// The endpoint configuration of a shard. DTLS peers have proven their address in
    /// the cookie exchange, so the amplification limit does not apply to them.
    fn shard_config(&self, dtls: bool) -> EndpointConfig {
        let mut config = self.config.clone();
        if dtls {
            config.amplification_factor = 0;
        }
        // Q-Block1 is reassembled by the role's upload table, Q-Block2 answered as
        // Block2 (RFC 9177; see the intake).
        config.handled_options = self.layers.handled_options().with(Q_BLOCK1).with(Q_BLOCK2);
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

    /// A DTLS session table for one of `shards` shards, on the backend the DTLS
    /// settings choose; with `steered`, the shard's index, which its Connection IDs
    /// carry (see [`CidConfig::for_shard`](crate::transport::dtls::CidConfig::for_shard)).
    fn dtls_layer(&self, shards: usize, steered: Option<usize>) -> Result<Box<dyn DtlsBackend>> {
        self.require_credentials(Scheme::Coaps)?;
        let cid = self
            .dtls_config
            .cid()
            .map_err(|e| Error::Unsupported(Unsupported::Argument(e)))?;
        let cid = match (cid, steered) {
            (Some(c), Some(index)) => Some(c.for_shard(index).ok_or_else(|| {
                Error::Unsupported(Unsupported::Argument(format!(
                    "shard {index}: the Connection ID has no room for a shard byte"
                )))
            })?),
            (cid, _) => cid,
        };
        if self.dtls_config.backend_kind() == DtlsBackendKind::Mbedtls {
            return crate::transport::dtls::select::mbedtls_server(
                self.psk_keys.clone(),
                self.x509.as_deref(),
                cid,
                self.dtls_config.for_shard(shards),
            );
        }
        let mut layer = OpensslDtls::server_with(
            self.psk_keys.clone(),
            self.x509.as_deref(),
            self.dtls_config.for_shard(shards),
        )
        .map_err(|e| e.into_error("DTLS", Scheme::Coaps))?;
        layer.count_ipv6_by(self.config.ipv6_budget_prefix);
        Ok(Box::new(layer))
    }

    /// Sets the limits of the WebSocket side (connections, Max-Message-Size, which is
    /// also the WebSocket frame and message size limit, upgrade and idle timeouts).
    pub fn ws_limits(mut self, limits: TcpServerLimits) -> Server {
        self.ws_limits = limits;
        self
    }

    /// Starts the connection-oriented listeners; on failure stops those already started.
    async fn start_streams(
        &self,
        streams: &[(Scheme, SocketAddr)],
        routes: &Routes,
    ) -> Result<Vec<(Scheme, TcpListenerHandle)>> {
        let mut started: Vec<(Scheme, TcpListenerHandle)> = Vec::new();
        for &(scheme, addr) in streams {
            match self.start_stream(scheme, addr, routes).await {
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
        scheme: Scheme,
        addr: SocketAddr,
        routes: &Routes,
    ) -> Result<TcpListenerHandle> {
        let framing = stream_framing(scheme);
        let tls = if scheme.is_secure() {
            self.require_credentials(scheme)?;
            let alpn = Alpn::for_framing(framing);
            let acceptor = TlsAcceptor::new(self.x509.as_deref(), self.psk_keys.clone(), alpn)
                .map_err(|e| e.into_error("TLS", scheme))?;
            Some(acceptor)
        } else {
            None
        };
        let mut limits = match framing {
            Framing::Stream => self.tcp_limits.clone(),
            Framing::WebSocket => self.ws_limits.clone(),
        };
        let front = self.front(scheme);
        limits.connection.handled_options = front.layers.handled_options();
        let transport = Transport {
            framing,
            tls,
            address_prefix: self.config.ipv6_budget_prefix,
        };
        let shared = Arc::new(StreamShared::new(
            routes.clone(),
            self.limits.clone(),
            limits.connection.block_wise_transfer,
            limits.max_bert_block,
            front,
        ));
        let counters = Arc::new(TcpCounters::default());
        let make = move |peer, done| ConnectionRole::for_connection(&shared, peer, done);
        let listener = listener::listen(addr, make, limits, transport, counters)
            .await
            .map_err(|e| {
                Error::Io(std::io::Error::new(
                    e.kind(),
                    format!("cannot listen for {scheme} on {addr}: {e}"),
                ))
            })?;
        tracing::info!(local_addr = %listener.local_addr, %scheme, "CoAP listening");
        Ok(listener)
    }

    /// Joins All-CoAP-Nodes (224.0.1.187, and ff02::fd and ff05::fd unless
    /// `groups.ipv6` is off) on `groups.interfaces` with the `coap` listener's port,
    /// and answers the requests sent there as RFC 7252 §8 and groupcomm-bis say: NON
    /// only, after a random Leisure, errors and empty answers suppressed unless the
    /// request's No-Response asks for them (see [`group`]). [`Server::start`] fails
    /// when there is no `coap` listener or a group cannot be joined.
    pub fn join_multicast(mut self, groups: GroupConfig) -> Server {
        self.groups = Some(groups);
        self
    }

    /// Serves over UDP (`coap://`) on `addr`, next to the listeners given with
    /// [`Server::listen`], and starts: `server.listen(Scheme::Coap, addr).start()`.
    pub async fn bind(self, addr: impl ToSocketAddrs) -> Result<ServerHandle> {
        self.listen(Scheme::Coap, addr).start().await
    }

    /// Opens every listener given with [`Server::listen`] and starts serving. Fails,
    /// saying which, when none was given, a scheme was given twice, an address does not
    /// resolve or cannot be bound, or a secure scheme has no credentials; nothing is
    /// left running then.
    pub async fn start(mut self) -> Result<ServerHandle> {
        self.config.validate()?;
        let listeners = self.resolved_listeners()?;
        let (datagram, streams): (Vec<_>, Vec<_>) =
            listeners.into_iter().partition(|(s, _)| s.is_datagram());
        let bound = self.bind_datagram(&datagram)?;
        let group_sockets = match self.bind_groups(&bound) {
            Ok(sockets) => sockets,
            Err(e) => {
                if let Some(threads) = bound.stage_threads {
                    threads.stop();
                }
                return Err(e);
            }
        };
        let stage_threads = bound.stage_threads;
        let mut metrics = Metrics::new(bound.sockets.iter().map(|b| b.ios.len()).sum());
        if stage_threads.is_some() {
            metrics = metrics.with_stages(self.stage_counters.clone());
        }
        let routes = Routes::new(std::mem::take(&mut self.tree), self.state.take());
        routes
            .budgets()
            .count_ipv6_by(self.config.ipv6_budget_prefix);
        // Handlers' requests go out on their shard's socket only where the answers
        // come back to that shard: with one shard per listener. With several, the
        // kernel (SO_REUSEPORT) or the staged receivers hand an answer to the shard
        // its peer hashes to, which does not know the exchange; those shards' handlers
        // share one client with a socket of its own instead (its configuration was
        // validated above; its socket is bound on first use).
        let handler_client = bound
            .sockets
            .iter()
            .any(|socket| socket.ios.len() > 1)
            .then(|| crate::Client::with_config_unchecked(self.config.clone()));
        let mut started = Started::default();
        let mut listening = Vec::new();
        let mut slots = metrics.shards().iter().cloned();
        for socket in bound.sockets {
            let secure = socket.scheme == Scheme::Coaps;
            let prefix = if secure {
                "cobalt-dtls"
            } else {
                "cobalt-shard"
            };
            let several = socket.ios.len() > 1;
            for (i, (io, dtls)) in socket.ios.into_iter().zip(socket.layers).enumerate() {
                let name = format!("{prefix}-{i}");
                let slot = slots.next();
                let shared = handler_client.clone().filter(|_| several);
                if let Err(e) =
                    self.spawn_shard(name, io, &routes, secure, slot, dtls, shared, &mut started)
                {
                    started.stop();
                    return Err(e);
                }
            }
            tracing::info!(local_addr = %socket.local_addr, scheme = %socket.scheme, shards = started.commands.len(), "CoAP listening");
            listening.push((socket.scheme, socket.local_addr));
        }
        routes.attach_shards(started.inboxes.clone());
        let groups = match (&self.groups, group_sockets.is_empty()) {
            (Some(config), false) => {
                match group::GroupResponder::start(
                    group_sockets,
                    &routes,
                    config,
                    self.config.ipv6_budget_prefix,
                ) {
                    Ok(responder) => Some(responder),
                    Err(e) => {
                        started.stop();
                        return Err(e.into());
                    }
                }
            }
            _ => None,
        };
        let streams = match self.start_streams(&streams, &routes).await {
            Ok(streams) => streams,
            Err(e) => {
                started.stop();
                return Err(e);
            }
        };
        let Started {
            commands, threads, ..
        } = started;
        Ok(ServerHandle {
            datagram: listening,
            limit_counters: routes.budgets().counters.clone(),
            routes,
            commands,
            threads,
            stage_threads,
            metrics,
            streams,
            groups,
        })
    }

    /// The group sockets of [`Server::join_multicast`] on the `coap` listener's port
    /// (none without it).
    fn bind_groups(&self, bound: &BoundDatagram) -> Result<Vec<std::net::UdpSocket>> {
        let Some(config) = &self.groups else {
            return Ok(Vec::new());
        };
        let port = bound
            .sockets
            .iter()
            .find(|s| s.scheme == Scheme::Coap)
            .map(|s| s.local_addr.port())
            .ok_or_else(|| {
                Error::Unsupported(Unsupported::Argument(
                    "Server::join_multicast needs a coap:// listener (groups are never \
                     served over DTLS): add Server::listen(Scheme::Coap, address)"
                        .into(),
                ))
            })?;
        group::bind_groups(config, port).map_err(Error::Io)
    }

    /// The listeners with their addresses, or why they cannot all be opened.
    fn resolved_listeners(&mut self) -> Result<Vec<(Scheme, SocketAddr)>> {
        let mut resolved: Vec<(Scheme, SocketAddr)> = Vec::new();
        for (scheme, addr) in std::mem::take(&mut self.listeners) {
            if resolved.iter().any(|(s, _)| *s == scheme) {
                return Err(Error::Unsupported(Unsupported::Argument(format!(
                    "{scheme} is listed twice: give Server::listen one address per scheme"
                ))));
            }
            let addr = addr.map_err(|e| Error::Resolve {
                host: format!("the {scheme} address"),
                reason: e.to_string(),
            })?;
            if scheme.is_secure() {
                self.require_credentials(scheme)?;
            }
            resolved.push((scheme, addr));
        }
        if resolved.is_empty() {
            return Err(Error::Unsupported(Unsupported::Argument(
                "the server has nothing to listen on: call Server::listen(scheme, address) \
                 or Server::bind(address)"
                    .into(),
            )));
        }
        Ok(resolved)
    }

    /// Binds the datagram listeners' sockets (the first in single-socket mode when
    /// [`Server::single_socket`] asked for it) and makes each DTLS shard's session
    /// table, so that nothing starts when one of them fails.
    fn bind_datagram(&self, listeners: &[(Scheme, SocketAddr)]) -> Result<BoundDatagram> {
        let shards = self
            .shards
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
        let mut bound = BoundDatagram::default();
        for (k, &(scheme, addr)) in listeners.iter().enumerate() {
            let staged = self.stages.filter(|_| k == 0);
            // With a DTLS Connection ID a client's records from a new address may
            // reach any shard's socket: they are steered to their shard by a byte of
            // the CID where it has room for one (outside the staged mode), else one
            // shard holds every session.
            let cid = scheme == Scheme::Coaps && self.dtls_config.cid_len > 0;
            let shards = if cid && !self.cid_steerable(shards, staged.is_some()) {
                1
            } else {
                shards
            };
            match self.bind_socket(scheme, addr, shards, staged, &mut bound.stage_threads) {
                Ok(socket) => bound.sockets.push(socket),
                Err(e) => {
                    if let Some(threads) = bound.stage_threads.take() {
                        threads.stop();
                    }
                    return Err(e);
                }
            }
        }
        Ok(bound)
    }

    /// Whether records with a Connection ID can be steered to their shard (see
    /// [`Server::bind_datagram`]).
    fn cid_steerable(&self, shards: usize, staged: bool) -> bool {
        let cid = self.dtls_config.cid().ok().flatten();
        cfg!(target_os = "linux")
            && !staged
            && shards > 1
            && cid.is_some_and(|c| c.for_shard(shards - 1).is_some())
    }

    /// Binds one datagram listener: a socket per shard, or one socket behind the
    /// `staged` receiver and sender threads (kept in `stage_threads`).
    fn bind_socket(
        &self,
        scheme: Scheme,
        addr: SocketAddr,
        shards: usize,
        staged: Option<Stages>,
        stage_threads: &mut Option<StageThreads>,
    ) -> Result<BoundSocket> {
        let sharing = self.groups.is_some() && scheme == Scheme::Coap;
        // Several shards on a coaps listener with a Connection ID: bind_datagram
        // checked that its records can be steered by the CID's shard byte.
        let steered = scheme == Scheme::Coaps
            && self.dtls_config.cid_len > 0
            && staged.is_none()
            && shards > 1;
        let (ios, local_addr) = match staged {
            None => {
                let sockets = bind_shard_sockets_sharing(addr, shards, self.buffers, sharing)?;
                self.exclude_groups(scheme, &sockets)?;
                if steered {
                    let node_id_len = self.dtls_config.cid_node_id.len() / 2;
                    crate::transport::dtls::steer_cid_records(&sockets[0], node_id_len).map_err(
                        |e| {
                            Error::Io(std::io::Error::new(
                                e.kind(),
                                format!(
                                    "cannot steer DTLS Connection ID records to their shards \
                                     ({e}): run the coaps listener on one shard (--shards 1)"
                                ),
                            ))
                        },
                    )?;
                }
                let local_addr = sockets[0].local_addr()?;
                // A socket alone on its port (and not decrypting DTLS) can be waited
                // on in a blocking receive and woken by a datagram sent to its address;
                // with several, the kernel could hand that datagram to another shard.
                let lone = sockets.len() == 1 && !sharing && scheme == Scheme::Coap;
                let ios = sockets
                    .into_iter()
                    .map(|s| {
                        if lone {
                            DriverIo::Lone(s)
                        } else {
                            DriverIo::Owned(s)
                        }
                    })
                    .collect();
                (ios, local_addr)
            }
            Some(stages) => {
                let socket = bind_shard_sockets_sharing(addr, 1, self.buffers, sharing)?.remove(0);
                self.exclude_groups(scheme, std::slice::from_ref(&socket))?;
                let local_addr = socket.local_addr()?;
                let (ios, threads) = start_stages(socket, stages, self.stage_counters.clone())?;
                *stage_threads = Some(threads);
                let ios: Vec<DriverIo> = ios
                    .into_iter()
                    .map(|io| DriverIo::Staged(io, local_addr))
                    .collect();
                (ios, local_addr)
            }
        };
        let layers = (0..ios.len())
            .map(|index| {
                (scheme == Scheme::Coaps)
                    .then(|| self.dtls_layer(ios.len(), steered.then_some(index)))
                    .transpose()
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(BoundSocket {
            scheme,
            local_addr,
            ios,
            layers,
        })
    }

    /// With [`Server::join_multicast`], keeps group datagrams off the `coap`
    /// listener's unicast sockets (the group sockets serve them).
    fn exclude_groups(&self, scheme: Scheme, sockets: &[std::net::UdpSocket]) -> Result<()> {
        if self.groups.is_some() && scheme == Scheme::Coap {
            sockets.iter().try_for_each(group::exclude_groups)?;
        }
        Ok(())
    }

    /// Starts one server shard (with its changes inbox) on its own thread; its
    /// handlers' client is `handler_client`, or one over the shard's own socket.
    #[allow(clippy::too_many_arguments)]
    fn spawn_shard(
        &self,
        name: String,
        io: DriverIo,
        routes: &Routes,
        dtls_peers: bool,
        slot: Option<Arc<crate::metrics::ShardMetrics>>,
        dtls: Option<Box<dyn DtlsBackend>>,
        handler_client: Option<crate::Client>,
        started: &mut Started,
    ) -> Result<()> {
        let inbox = Arc::new(ChangeInbox::default());
        let config = self.shard_config(dtls_peers);
        let (tree, limits, changes) = (routes.serve(), self.limits.clone(), inbox.clone());
        let front = self.front(if dtls_peers {
            Scheme::Coaps
        } else {
            Scheme::Coap
        });
        let client_config = config.clone();
        let make: MakeService<ShardRole, Endpoint> = Box::new(move |links: ServiceLinks<_>| {
            let client = handler_client.unwrap_or_else(|| {
                crate::Client::for_shard(links.commands, links.v6, client_config)
            });
            ShardRole::for_shard(tree, limits, changes, links.done, Some(client), front)
        });
        let (tx, handle) = spawn_driver(
            name,
            io,
            config,
            Some(make),
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

/// The datagram listeners' sockets, bound but not yet served.
#[derive(Default)]
struct BoundDatagram {
    sockets: Vec<BoundSocket>,
    stage_threads: Option<StageThreads>,
}

/// One datagram listener: a socket per shard (or the staged workers' queues) and, for
/// DTLS, each shard's session table.
struct BoundSocket {
    scheme: Scheme,
    local_addr: SocketAddr,
    ios: Vec<DriverIo>,
    layers: Vec<Option<Box<dyn DtlsBackend>>>,
}

/// The shards started so far: their command queues, changes inboxes and threads.
#[derive(Default)]
struct Started {
    commands: Vec<mpsc::UnboundedSender<Command>>,
    inboxes: Vec<Arc<ChangeInbox>>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Started {
    /// Stops the shards started so far (when a later listener fails to start).
    fn stop(&self) {
        for c in &self.commands {
            let _ = c.send(Command::Shutdown {
                grace: Duration::ZERO,
            });
        }
    }
}

/// A running server.
#[derive(Debug)]
pub struct ServerHandle {
    /// The datagram listeners (`coap`, `coaps`) with their bound addresses.
    datagram: Vec<(Scheme, SocketAddr)>,
    /// Refusals and dropped uploads over every shard and listener.
    limit_counters: Arc<crate::metrics::LimitCounters>,
    commands: Vec<mpsc::UnboundedSender<Command>>,
    threads: Vec<std::thread::JoinHandle<()>>,
    stage_threads: Option<StageThreads>,
    metrics: Metrics,
    streams: Vec<(Scheme, TcpListenerHandle)>,
    routes: Routes,
    /// The group responder of [`Server::join_multicast`].
    groups: Option<group::GroupResponder>,
}

impl std::fmt::Debug for StageThreads {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("StageThreads")
    }
}

impl ServerHandle {
    /// The server's routes, to add and remove resources while it serves.
    pub fn routes(&self) -> Routes {
        self.routes.clone()
    }

    /// The shards' counters, published by each shard when read (see
    /// [`Metrics::snapshot`]); serve them with [`crate::metrics::serve_metrics`].
    pub fn metrics(&self) -> Metrics {
        let mut m = self
            .metrics
            .clone()
            .with_limits(self.limit_counters.clone());
        for (scheme, l) in &self.streams {
            m = m.with_transport(metric_label(*scheme), l.counters.clone());
        }
        m
    }

    /// The address `scheme` is served on (with the real port when 0 was asked for), or
    /// `None` when the server does not listen on `scheme`.
    pub fn local_addr(&self, scheme: Scheme) -> Option<SocketAddr> {
        self.listeners().find(|(s, _)| *s == scheme).map(|(_, a)| a)
    }

    /// Every scheme served, with its address, in the order [`Server::listen`] gave them
    /// (datagram schemes first).
    pub fn listeners(&self) -> impl Iterator<Item = (Scheme, SocketAddr)> + '_ {
        let streams = self.streams.iter().map(|(s, l)| (*s, l.local_addr));
        self.datagram.iter().copied().chain(streams)
    }

    /// Graceful shutdown: stop reading, let handlers in progress answer for up to
    /// `grace`, then stop every shard (and release every TCP connection). A datagram
    /// request still unanswered when `grace` ends gets 5.03 "shutting down" (as a
    /// separate response if it had its empty ACK), so no client waits for an answer
    /// that will not come; over TCP, TLS and WebSockets the connection's Release
    /// (RFC 8323 §5.5) ends the requests still open.
    pub async fn shutdown(self, grace: Duration) {
        let local_addr = self.listeners().next().map(|(_, a)| a);
        tracing::info!(?local_addr, ?grace, "CoAP server shutting down");
        for c in &self.commands {
            let _ = c.send(Command::Shutdown { grace });
        }
        for (_, l) in &self.streams {
            l.shutdown(grace);
        }
        if let Some(groups) = &self.groups {
            groups.stop();
        }
        self.wait().await;
        tracing::info!(?local_addr, "CoAP server stopped");
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
