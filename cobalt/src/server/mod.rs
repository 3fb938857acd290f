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

mod echo;
mod executor;
mod handler;
mod intake;
mod limits;
pub(crate) mod observe;
mod request;
pub(crate) mod shard;
pub(crate) mod stream;
mod stream_observe;
pub(crate) mod tree;
mod upload;

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
use crate::metrics::Metrics;
use crate::runtime::driver::{spawn_driver, Command, DriverIo};
use crate::runtime::io::{start_stages, StageCounters, StageThreads, Stages};
use crate::transport::dtls::{DtlsBackend, DtlsConfig, OpensslDtls, PskStore, X509Credentials};
use crate::transport::tcp::{TcpListenerHandle, TcpServerLimits};
use crate::transport::udp::{bind_shard_sockets_with, SocketBuffers};
use crate::{Error, Result};
use cobalt_proto::endpoint::EndpointConfig;
use cobalt_proto::tcp_connection::Framing;
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
    tcp_addr: Option<SocketAddr>,
    tcp_limits: TcpServerLimits,
    dtls_keys: Option<Arc<PskStore>>,
    dtls_x509: Option<Arc<X509Credentials>>,
    dtls_config: DtlsConfig,
    dtls_addr: Option<SocketAddr>,
    ws_addr: Option<SocketAddr>,
    ws_limits: TcpServerLimits,
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

    /// Applies a [`Config`]: endpoint parameters, limits and runtime settings (shards,
    /// receive batch, socket buffers). The address to bind is `config.server`:
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
        self
    }

    /// Also serves the same resources over CoAP over TCP (RFC 8323, `coap+tcp://`) on
    /// `addr`, bound by [`Server::bind`] next to the UDP socket; see
    /// [`ServerHandle::tcp_local_addr`].
    pub fn tcp(mut self, addr: SocketAddr) -> Server {
        self.tcp_addr = Some(addr);
        self
    }

    /// Sets the limits of the TCP side (connections, Max-Message-Size, timeouts).
    pub fn tcp_limits(mut self, limits: TcpServerLimits) -> Server {
        self.tcp_limits = limits;
        self
    }

    /// The pre-shared keys accepted over DTLS (`coaps`), by identity; needed by
    /// [`Server::bind_dtls`] and [`Server::dtls`].
    pub fn dtls_psk(mut self, keys: PskStore) -> Server {
        self.dtls_keys = Some(Arc::new(keys));
        self
    }

    /// The certificate (and, with `ca_pem`, the CA client certificates must chain to)
    /// for DTLS (`coaps`) with the ECDHE-ECDSA suites; may be combined with
    /// [`Server::dtls_psk`].
    pub fn dtls_x509(mut self, credentials: X509Credentials) -> Server {
        self.dtls_x509 = Some(Arc::new(credentials));
        self
    }

    /// Sets the DTLS session limits and timers (sessions per shard, handshake timeout).
    pub fn dtls_config(mut self, config: DtlsConfig) -> Server {
        self.dtls_config = config;
        self
    }

    /// Also serves the same resources over CoAP over DTLS (`coaps://`, usually port
    /// 5684) on `addr`, bound by [`Server::bind`] next to the UDP socket; see
    /// [`ServerHandle::dtls_local_addr`]. Needs [`Server::dtls_psk`] or [`Server::dtls_x509`].
    pub fn dtls(mut self, addr: SocketAddr) -> Server {
        self.dtls_addr = Some(addr);
        self
    }

    /// A DTLS session table for one shard.
    fn dtls_layer(&self) -> Result<Box<dyn DtlsBackend>> {
        if self.dtls_keys.is_none() && self.dtls_x509.is_none() {
            return Err(Error::Unsupported(
                "coaps needs credentials: call Server::dtls_psk or Server::dtls_x509".into(),
            ));
        }
        let layer = OpensslDtls::server_with(
            self.dtls_keys.clone(),
            self.dtls_x509.as_deref(),
            self.dtls_config.clone(),
        )
        .map_err(|e| Error::Unsupported(format!("cannot set up DTLS: {e}")))?;
        Ok(Box::new(layer))
    }

    /// Serves over CoAP over DTLS only (`coaps://`, RFC 7252 §9) with the keys of
    /// [`Server::dtls_psk`]: the same shards as [`Server::bind`], each datagram passing
    /// through the shard's DTLS session table.
    pub async fn bind_dtls(self, addr: impl ToSocketAddrs) -> Result<ServerHandle> {
        self.bind_with(addr, true).await
    }

    /// Also serves the same resources over CoAP over WebSockets (RFC 8323 §4,
    /// `coap+ws://`) on `addr`, bound by [`Server::bind`] next to the UDP socket:
    /// HTTP/1.1 upgrades on `/.well-known/coap` with subprotocol `coap`; see
    /// [`ServerHandle::ws_local_addr`].
    pub fn ws(mut self, addr: SocketAddr) -> Server {
        self.ws_addr = Some(addr);
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
        let addr = addr
            .to_socket_addrs()?
            .next()
            .ok_or_else(|| Error::Unsupported("bind address resolved to nothing".into()))?;
        let ws = crate::transport::tcp::listen(
            addr,
            Arc::new(self.tree),
            self.limits,
            self.ws_limits,
            Framing::WebSocket,
        )
        .await?;
        tracing::info!(local_addr = %ws.local_addr, "CoAP over WebSockets server listening");
        Ok(ServerHandle {
            local_addr: ws.local_addr,
            commands: Vec::new(),
            threads: Vec::new(),
            stage_threads: None,
            metrics: Metrics::new(0),
            tcp: None,
            ws: Some(ws),
            dtls_local_addr: None,
        })
    }

    /// Serves over CoAP over TCP only (RFC 8323, `coap+tcp://`), on the current tokio
    /// runtime: one task per connection, handlers run on that task.
    /// [`ServerHandle::local_addr`] is then the TCP address.
    pub async fn bind_tcp(self, addr: impl ToSocketAddrs) -> Result<ServerHandle> {
        let addr = addr
            .to_socket_addrs()?
            .next()
            .ok_or_else(|| Error::Unsupported("bind address resolved to nothing".into()))?;
        let tcp = crate::transport::tcp::listen(
            addr,
            Arc::new(self.tree),
            self.limits,
            self.tcp_limits,
            Framing::Stream,
        )
        .await?;
        tracing::info!(local_addr = %tcp.local_addr, "CoAP over TCP server listening");
        Ok(ServerHandle {
            local_addr: tcp.local_addr,
            commands: Vec::new(),
            threads: Vec::new(),
            stage_threads: None,
            metrics: Metrics::new(0),
            tcp: Some(tcp),
            dtls_local_addr: None,
            ws: None,
        })
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
            .ok_or_else(|| Error::Unsupported("bind address resolved to nothing".into()))?;
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
        let mut commands = Vec::new();
        let mut threads = Vec::new();
        for (i, io) in ios.into_iter().enumerate() {
            let dtls = if secure {
                Some(self.dtls_layer()?)
            } else {
                None
            };
            let (tx, handle) = spawn_driver(
                format!("cobalt-shard-{i}"),
                io,
                self.config.clone(),
                Some((tree.clone(), self.limits.clone())),
                None,
                self.recv_batch,
                Some(metrics.shards()[i].clone()),
                dtls,
            )?;
            commands.push(tx);
            threads.push(handle);
        }
        let dtls_local_addr = match self.dtls_addr.filter(|_| !secure) {
            Some(addr) => Some(self.spawn_dtls_shards(
                addr,
                shards,
                &tree,
                &mut commands,
                &mut threads,
                &metrics.shards()[metrics.shards().len() - dtls_shards..],
            )?),
            None => None,
        };
        for o in tree.observables() {
            o.attach(commands.clone());
        }
        tracing::info!(%local_addr, workers = commands.len(), staged = stage_threads.is_some(), "CoAP server listening");
        let tcp = match self.tcp_addr {
            Some(addr) => {
                let tcp = crate::transport::tcp::listen(
                    addr,
                    tree.clone(),
                    self.limits.clone(),
                    self.tcp_limits.clone(),
                    Framing::Stream,
                )
                .await;
                match tcp {
                    Ok(tcp) => {
                        tracing::info!(local_addr = %tcp.local_addr, "CoAP over TCP listening");
                        Some(tcp)
                    }
                    Err(e) => {
                        for c in &commands {
                            let _ = c.send(Command::Shutdown {
                                grace: Duration::ZERO,
                            });
                        }
                        return Err(e.into());
                    }
                }
            }
            None => None,
        };
        let ws = match self.ws_addr {
            Some(addr) => {
                let ws = crate::transport::tcp::listen(
                    addr,
                    tree.clone(),
                    self.limits.clone(),
                    self.ws_limits.clone(),
                    Framing::WebSocket,
                )
                .await;
                match ws {
                    Ok(ws) => {
                        tracing::info!(local_addr = %ws.local_addr, "CoAP over WebSockets listening");
                        Some(ws)
                    }
                    Err(e) => {
                        for c in &commands {
                            let _ = c.send(Command::Shutdown {
                                grace: Duration::ZERO,
                            });
                        }
                        if let Some(tcp) = &tcp {
                            tcp.shutdown(Duration::ZERO);
                        }
                        return Err(e.into());
                    }
                }
            }
            None => None,
        };
        Ok(ServerHandle {
            local_addr,
            commands,
            threads,
            stage_threads,
            metrics,
            tcp,
            dtls_local_addr: if secure {
                Some(local_addr)
            } else {
                dtls_local_addr
            },
            ws,
        })
    }

    /// Starts `shards` DTLS shards on `addr` next to the plain ones.
    fn spawn_dtls_shards(
        &self,
        addr: SocketAddr,
        shards: usize,
        tree: &Arc<ResourceTree>,
        commands: &mut Vec<mpsc::UnboundedSender<Command>>,
        threads: &mut Vec<std::thread::JoinHandle<()>>,
        slots: &[Arc<crate::metrics::ShardMetrics>],
    ) -> Result<SocketAddr> {
        let sockets = bind_shard_sockets_with(addr, shards, self.buffers)?;
        let local_addr = sockets[0].local_addr()?;
        for (i, socket) in sockets.into_iter().enumerate() {
            let (tx, handle) = spawn_driver(
                format!("cobalt-dtls-{i}"),
                DriverIo::Owned(socket),
                self.config.clone(),
                Some((tree.clone(), self.limits.clone())),
                None,
                self.recv_batch,
                slots.get(i).cloned(),
                Some(self.dtls_layer()?),
            )?;
            commands.push(tx);
            threads.push(handle);
        }
        tracing::info!(%local_addr, "CoAP over DTLS listening");
        Ok(local_addr)
    }
}

/// A running server.
#[derive(Debug)]
pub struct ServerHandle {
    local_addr: SocketAddr,
    commands: Vec<mpsc::UnboundedSender<Command>>,
    threads: Vec<std::thread::JoinHandle<()>>,
    stage_threads: Option<StageThreads>,
    metrics: Metrics,
    tcp: Option<TcpListenerHandle>,
    dtls_local_addr: Option<SocketAddr>,
    ws: Option<TcpListenerHandle>,
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
        let mut m = self.metrics.clone();
        if let Some(t) = &self.tcp {
            m = m.with_transport("tcp", t.counters.clone());
        }
        if let Some(w) = &self.ws {
            m = m.with_transport("ws", w.counters.clone());
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
        self.tcp.as_ref().map(|t| t.local_addr)
    }

    /// The CoAP-over-DTLS (`coaps`) address, when serving over DTLS
    /// ([`Server::dtls`], [`Server::bind_dtls`]).
    pub fn dtls_local_addr(&self) -> Option<SocketAddr> {
        self.dtls_local_addr
    }

    /// The CoAP-over-WebSockets address, when serving over WebSockets too
    /// ([`Server::ws`], [`Server::bind_ws`]).
    pub fn ws_local_addr(&self) -> Option<SocketAddr> {
        self.ws.as_ref().map(|w| w.local_addr)
    }

    /// Graceful shutdown: stop reading, let handlers in progress answer for up to
    /// `grace`, then stop every shard (and release every TCP connection).
    pub async fn shutdown(self, grace: Duration) {
        tracing::info!(local_addr = %self.local_addr, ?grace, "CoAP server shutting down");
        for c in &self.commands {
            let _ = c.send(Command::Shutdown { grace });
        }
        if let Some(tcp) = &self.tcp {
            tcp.shutdown(grace);
        }
        if let Some(ws) = &self.ws {
            ws.shutdown(grace);
        }
        let local_addr = self.local_addr;
        self.wait().await;
        tracing::info!(%local_addr, "CoAP server stopped");
    }

    /// Waits until every shard (and the TCP listener) has stopped.
    pub async fn wait(self) {
        if let Some(tcp) = self.tcp {
            tcp.wait().await;
        }
        if let Some(ws) = self.ws {
            ws.wait().await;
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
