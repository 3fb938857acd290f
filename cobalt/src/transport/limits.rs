//! The limits of the connection-oriented listeners (TCP, TLS, WebSockets).

use cobalt_proto::settings::{within, Param, Settings};
use cobalt_proto::tcp_connection::TcpConfig;
use std::time::Duration;

/// Limits of the TCP side of a server. `Default` gives the documented defaults; the
/// allowed values are those of [`TcpServerLimits::params`]. It is the `[connections]`
/// section of a configuration file, with the keys of [`TcpConfig`] among its own.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TcpServerLimits {
    /// Connections served at once. When they are all open, a connection from an
    /// address holding fewer than the address holding the most takes the place of that
    /// address's connection heard from least recently (which is sent an Abort, 7.05,
    /// and closed); other connections are sent an Abort and closed. Default 1,024.
    pub max_connections: usize,
    /// Connections served at once from one address (IPv4 address, or IPv6 prefix:
    /// [`AddressKey`](cobalt_proto::address::AddressKey)); its further connections are refused
    /// like those over `max_connections`, while other addresses still connect.
    /// Default 128, an eighth of `max_connections`: at least 8 addresses fit before the
    /// listener is full, and then a new address still gets in by eviction (a load
    /// generator on one address with more connections needs more).
    pub max_connections_per_ip: usize,
    /// TLS handshakes and WebSocket upgrades in progress at once from one address;
    /// its further connections are refused until one finishes. Default 32.
    pub max_handshakes_per_ip: usize,
    /// Per-connection protocol settings: Max-Message-Size, CSM/frame/idle timeouts,
    /// concurrent requests per connection.
    #[serde(flatten)]
    pub connection: TcpConfig,
    /// How long a write may block (a peer that does not read) before the connection is
    /// dropped. Default 30 s.
    #[serde(with = "cobalt_proto::settings::duration")]
    pub write_timeout: Duration,
    /// How long the TLS handshake (`coaps+tcp`, `coaps+ws`) and, for WebSockets, the
    /// HTTP upgrade request may each take, from the accepted connection to the end of
    /// its header (slowloris defence). Default 10 s.
    #[serde(with = "cobalt_proto::settings::duration")]
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
            max_connections_per_ip: 128,
            max_handshakes_per_ip: 32,
            connection: TcpConfig::default(),
            write_timeout: Duration::from_secs(30),
            handshake_timeout: Duration::from_secs(10),
            max_bert_block: 64 * 1024,
        }
    }
}

impl Settings for TcpServerLimits {
    /// Every parameter (those of [`TcpConfig::params`] among them) with what it does
    /// and the values allowed, in file order.
    fn params(&self) -> Vec<Param> {
        let secs = Duration::from_secs;
        let mut params = vec![
            Param::new("max_connections", "Connections served at once per listener; when full, a new address takes the place of the idlest connection of the address holding the most, and other connections are refused.", "1 to 1000000", (1..=1_000_000).contains(&self.max_connections)),
            Param::new("max_connections_per_ip", "Connections served at once per listener from one source address (IPv4 address, or IPv6 prefix of endpoint.ipv6_budget_prefix, /64 by default); its further ones are refused while other addresses still connect.", "1 to 1000000", (1..=1_000_000).contains(&self.max_connections_per_ip)),
            Param::new("max_handshakes_per_ip", "TLS handshakes and WebSocket upgrades in progress per listener from one source address; its further connections are refused until one finishes.", "1 to 1000000", (1..=1_000_000).contains(&self.max_handshakes_per_ip)),
        ];
        params.extend(self.connection.params());
        params.extend([
            Param::new("write_timeout", "Time a write may block on a peer that does not read before the connection is dropped.", "1s to 600s", within(self.write_timeout, secs(1), secs(600))),
            Param::new("handshake_timeout", "Time for the TLS handshake and for the WebSocket upgrade request.", "1s to 600s", within(self.handshake_timeout, secs(1), secs(600))),
            Param::new("max_bert_block", "Largest BERT block sent, in bytes.", "1024 to 67108864", (1024..=64 << 20).contains(&self.max_bert_block)),
        ]);
        params
    }
}
