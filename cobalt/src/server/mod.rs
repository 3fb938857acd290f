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

mod handler;
mod limits;
pub(crate) mod observe;
mod request;
pub(crate) mod shard;
pub(crate) mod tree;
mod upload;

pub use handler::{
    any, delete, fetch, get, ipatch, patch, post, put, BoxFuture, Handler, MethodRouter,
};
pub use limits::ServerLimits;
pub use observe::{Observable, ObserverFilter};
pub use request::{IntoResponse, Request, Response};
pub use tree::{ResourceTree, WELL_KNOWN_CORE};

use crate::runtime::driver::{spawn_driver, Command};
use crate::transport::tcp::{TcpListenerHandle, TcpServerLimits};
use crate::transport::udp::bind_shard_sockets;
use crate::{Error, Result};
use cobalt_proto::endpoint::EndpointConfig;
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
    tcp_addr: Option<SocketAddr>,
    tcp_limits: TcpServerLimits,
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

    /// Number of shards (threads with their own `SO_REUSEPORT` socket); default: one per core.
    pub fn shards(mut self, shards: usize) -> Server {
        self.shards = Some(shards.max(1));
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

    /// Serves over CoAP over TCP only (RFC 8323, `coap+tcp://`), on the current tokio
    /// runtime: one task per connection, handlers run on that task.
    /// [`ServerHandle::local_addr`] is then the TCP address.
    pub async fn bind_tcp(self, addr: impl ToSocketAddrs) -> Result<ServerHandle> {
        let addr = addr
            .to_socket_addrs()?
            .next()
            .ok_or_else(|| Error::Unsupported("bind address resolved to nothing".into()))?;
        let tcp =
            crate::transport::tcp::listen(addr, Arc::new(self.tree), self.limits, self.tcp_limits)
                .await?;
        tracing::info!(local_addr = %tcp.local_addr, "CoAP over TCP server listening");
        Ok(ServerHandle {
            local_addr: tcp.local_addr,
            commands: Vec::new(),
            threads: Vec::new(),
            tcp: Some(tcp),
        })
    }

    /// Binds the UDP address and starts serving.
    pub async fn bind(self, addr: impl ToSocketAddrs) -> Result<ServerHandle> {
        self.config.validate()?;
        let addr = addr
            .to_socket_addrs()?
            .next()
            .ok_or_else(|| Error::Unsupported("bind address resolved to nothing".into()))?;
        let shards = self
            .shards
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
        let sockets = bind_shard_sockets(addr, shards)?;
        let local_addr = sockets[0].local_addr()?;
        let tree = Arc::new(self.tree);
        let mut commands = Vec::new();
        let mut threads = Vec::new();
        for (i, socket) in sockets.into_iter().enumerate() {
            let (tx, handle) = spawn_driver(
                format!("cobalt-shard-{i}"),
                socket,
                self.config.clone(),
                Some((tree.clone(), self.limits.clone())),
                None,
            )?;
            commands.push(tx);
            threads.push(handle);
        }
        for o in tree.observables() {
            o.attach(commands.clone());
        }
        tracing::info!(%local_addr, shards, "CoAP server listening");
        let tcp = match self.tcp_addr {
            Some(addr) => {
                let tcp = crate::transport::tcp::listen(
                    addr,
                    tree.clone(),
                    self.limits.clone(),
                    self.tcp_limits.clone(),
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
        Ok(ServerHandle {
            local_addr,
            commands,
            threads,
            tcp,
        })
    }
}

/// A running server.
#[derive(Debug)]
pub struct ServerHandle {
    local_addr: SocketAddr,
    commands: Vec<mpsc::UnboundedSender<Command>>,
    threads: Vec<std::thread::JoinHandle<()>>,
    tcp: Option<TcpListenerHandle>,
}

impl ServerHandle {
    /// The bound address (with the real port when 0 was asked for).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The CoAP-over-TCP address, when serving over TCP too ([`Server::tcp`],
    /// [`Server::bind_tcp`]).
    pub fn tcp_local_addr(&self) -> Option<SocketAddr> {
        self.tcp.as_ref().map(|t| t.local_addr)
    }

    /// Graceful shutdown: stop reading, let handlers in progress answer for up to
    /// `grace`, then stop every shard (and release every TCP connection).
    pub async fn shutdown(self, grace: Duration) {
        for c in &self.commands {
            let _ = c.send(Command::Shutdown { grace });
        }
        if let Some(tcp) = &self.tcp {
            tcp.shutdown(grace);
        }
        self.wait().await;
    }

    /// Waits until every shard (and the TCP listener) has stopped.
    pub async fn wait(self) {
        if let Some(tcp) = self.tcp {
            tcp.wait().await;
        }
        let threads = self.threads;
        let _ = tokio::task::spawn_blocking(move || {
            for t in threads {
                let _ = t.join();
            }
        })
        .await;
    }
}
