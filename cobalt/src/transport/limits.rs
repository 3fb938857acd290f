//! The limits of the connection-oriented listeners (TCP, TLS, WebSockets).

use cobalt_proto::tcp_connection::TcpConfig;
use std::time::Duration;

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
