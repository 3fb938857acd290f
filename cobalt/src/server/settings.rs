//! Everything a server runs with apart from its resources and listeners, in one value:
//! what [`Server::with_config`](super::Server::with_config) applies. The configuration
//! file (`crate::config`) is read into it with `Config::server_settings`; a program
//! without a file builds it directly.

use super::limits::ServerLimits;
use crate::transport::dtls::DtlsConfig;
use crate::transport::limits::TcpServerLimits;
use crate::transport::udp::SocketBuffers;
use cobalt_proto::endpoint::EndpointConfig;

/// The settings of a server: protocol parameters, limits, runtime and listener
/// settings. `Default` gives the built-in defaults (those of [`Server::new`]).
///
/// [`Server::new`]: super::Server::new
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ServerSettings {
    /// Protocol parameters (RFC 7252 §4.8), state bounds of the endpoint, and how
    /// every per-address budget counts IPv6 peers (`ipv6_budget_prefix`).
    pub endpoint: EndpointConfig,
    /// Server-role limits: observers, uploads, block size.
    pub limits: ServerLimits,
    /// Shards (threads with their own `SO_REUSEPORT` socket); `None`: one per core.
    pub shards: Option<usize>,
    /// Datagrams read per wake-up of a shard before timers and commands get a turn;
    /// `None`: the driver's default.
    pub recv_batch: Option<usize>,
    /// Socket buffer sizes asked of the kernel for each shard socket.
    pub socket_buffers: SocketBuffers,
    /// Limits and timers of the TCP, TLS and WebSocket listeners.
    pub connections: TcpServerLimits,
    /// DTLS session and handshake budgets and timers (per DTLS shard).
    pub dtls: DtlsConfig,
}
