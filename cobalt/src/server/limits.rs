//! Server-side limits and policies beyond the endpoint's protocol parameters.

use cobalt_proto::blockwise::uploads::UploadLimits;
use cobalt_proto::observe::relations::ConPolicy;
use cobalt_proto::settings::{Param, Settings};
use std::time::Duration;

/// Bounds and policies of the server role. `Default` gives the documented defaults.
///
/// Bounds on what peers can make the server hold follow one convention: a peer over
/// its own budget gets 4.29 Too Many Requests (RFC 8516), a server-wide bound gets
/// 5.03 Service Unavailable, both with Max-Age [`UploadLimits::refusal_max_age`], and
/// near a server-wide bound only the peers holding at least what is still free are
/// refused, so the others keep being served.
///
/// The allowed values are those of [`ServerLimits::params`]; it is the `[limits]`
/// section of a configuration file, with the keys of [`ConPolicy`] and
/// [`UploadLimits`] among its own.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerLimits {
    /// Observe relations over all resources, shards and connections of a server;
    /// near it, registrations from addresses that hold at least what is still free
    /// get 5.03. Default 100,000.
    pub max_observers: usize,
    /// Observe relations one client IP address (IPv6: one prefix of
    /// `ipv6_budget_prefix`, see [`AddressKey`](cobalt_proto::address::AddressKey))
    /// may hold over UDP, DTLS, TCP, TLS and WebSockets together; beyond it a
    /// registration gets 4.29. Default 1,000.
    pub max_observers_per_ip: usize,
    /// Which notifications are confirmable, to learn whether the observer is still
    /// there (RFC 7641 §4.5): every 20th, and one at least every 24 h by default. A
    /// floor per observation: the endpoint's NON pacing per peer makes more of them
    /// confirmable when many observations of one peer change at once (see
    /// [`cobalt_proto::observe::relations`]).
    #[serde(flatten)]
    pub con: ConPolicy,
    /// Least time between two notifications to one observer over UDP; changes in
    /// between are coalesced into one notification of the latest state when it has
    /// passed (RFC 7641 §4.5.1 suggests one per round trip). Default 0: no pacing
    /// beyond holding notifications while a confirmable one is unacknowledged.
    #[serde(with = "cobalt_proto::settings::duration")]
    pub observe_min_interval: Duration,
    /// Observers a UDP shard notifies per turn of its loop before it reads its socket
    /// again. Default 256.
    pub observe_batch: usize,
    /// The bounds of each shard's or listener's Block1 upload table and the Max-Age of
    /// every refusal (the defaults of [`UploadLimits`]).
    #[serde(flatten)]
    pub uploads: UploadLimits,
    /// Block size exponent for responses (0–6: 16–1024 bytes). Default 6.
    pub block_szx: u8,
}

impl Default for ServerLimits {
    fn default() -> Self {
        ServerLimits {
            max_observers: 100_000,
            max_observers_per_ip: 1000,
            con: ConPolicy::default(),
            observe_min_interval: Duration::ZERO,
            observe_batch: 256,
            uploads: UploadLimits::default(),
            block_szx: 6,
        }
    }
}

impl Settings for ServerLimits {
    /// Every parameter (those of [`ConPolicy::params`] and [`UploadLimits::params`]
    /// among them) with what it does and the values allowed, in file order.
    fn params(&self) -> Vec<Param> {
        let mut params = vec![
            Param::new("max_observers", "Observe relations over all resources, shards and connections; near it, registrations from addresses holding at least what is still free get 5.03 with Max-Age (others keep registering).", "0 or more", true),
            Param::new("max_observers_per_ip", "Observe relations one client IP address (IPv6: prefix of endpoint.ipv6_budget_prefix) may hold over every transport; beyond it a registration gets 4.29 with Max-Age.", "1 to 100000000", (1..=100_000_000).contains(&self.max_observers_per_ip)),
        ];
        params.extend(self.con.params());
        params.extend([
            Param::new("observe_min_interval", "Least time between two notifications to one observer over UDP; changes in between are coalesced into one notification of the latest state (RFC 7641 §4.5.1). 0: no pacing beyond holding notifications while a confirmable one is unacknowledged.", "0s to 1h", self.observe_min_interval <= Duration::from_secs(3600)),
            Param::new("observe_batch", "Observers a UDP shard notifies per turn of its loop before it reads its socket again.", "1 to 65536", (1..=65_536).contains(&self.observe_batch)),
        ]);
        params.extend(self.uploads.params());
        params.push(Param::new(
            "block_szx",
            "Block size exponent of responses: block size 2^(4+szx) bytes.",
            "0 to 6 (16 to 1024 bytes)",
            self.block_szx <= 6,
        ));
        params
    }
}
