//! Server-side limits and policies beyond the endpoint's protocol parameters.

use cobalt_proto::blockwise::uploads::UploadLimits;
use cobalt_proto::observe::relations::ConPolicy;
use cobalt_proto::settings::{check, within, ConfigError, Param};
use std::time::Duration;

/// Bounds and policies of the server role. `Default` gives the documented defaults.
///
/// Bounds on what peers can make the server hold follow one convention: a peer over
/// its own budget gets 4.29 Too Many Requests (RFC 8516), a server-wide bound gets
/// 5.03 Service Unavailable, both with Max-Age [`ServerLimits::refusal_max_age`], and
/// near a server-wide bound only the peers holding at least what is still free are
/// refused, so the others keep being served.
///
/// The allowed values are those of [`ServerLimits::params`]; it is the `[limits]`
/// section of a configuration file.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerLimits {
    /// Observe relations over all resources, shards and connections of a server;
    /// near it, registrations from addresses that hold at least what is still free
    /// get 5.03. Default 100,000.
    pub max_observers: usize,
    /// Observe relations one client IP address may hold (over UDP, DTLS, TCP, TLS and
    /// WebSockets together); beyond it a registration gets 4.29. Default 1,000.
    pub max_observers_per_ip: usize,
    /// Every this many notifications one is confirmable, to learn whether the observer
    /// is still there (RFC 7641 §4.5). Default 20.
    pub observe_con_every: u32,
    /// A confirmable notification at least this often. Default 24 h.
    #[serde(with = "cobalt_proto::settings::duration")]
    pub observe_con_interval: Duration,
    /// Least time between two notifications to one observer over UDP; changes in
    /// between are coalesced into one notification of the latest state when it has
    /// passed (RFC 7641 §4.5.1 suggests one per round trip). Default 0: no pacing
    /// beyond holding notifications while a confirmable one is unacknowledged.
    #[serde(with = "cobalt_proto::settings::duration")]
    pub observe_min_interval: Duration,
    /// Observers a UDP shard notifies per turn of its loop before it reads its socket
    /// again. Default 256.
    pub observe_batch: usize,
    /// Largest request body reassembled from Block1 blocks; larger uploads get 4.13
    /// with Size1. Default 1 MiB.
    pub max_body: usize,
    /// Block1 uploads in progress per shard (UDP) or listener (TCP, TLS, WebSockets);
    /// near it, peers holding at least what is still free get 5.03. Default 1,000.
    pub max_uploads: usize,
    /// Uploads in progress one client IP address may hold in a shard or listener;
    /// beyond it 4.29. Default 32.
    pub max_uploads_per_ip: usize,
    /// Uploads in progress one client address and port may hold in a shard or
    /// listener; beyond it 4.29. Default 4.
    pub max_uploads_per_peer: usize,
    /// Bytes that the uploads in progress (and the large answers kept for their Block2
    /// follow-ups) of one shard or listener may hold together; near it, peers holding
    /// at least what is still free get 5.03. Default 64 MiB.
    pub max_upload_memory: usize,
    /// Bytes the uploads in progress and kept answers of one client IP address may
    /// hold in a shard or listener; beyond it 4.29. At least `max_body`. Default 4 MiB.
    pub max_upload_memory_per_ip: usize,
    /// An upload that receives no block for this long is dropped (its next block gets
    /// 4.08), on a timer of its own. Default 60 s.
    #[serde(with = "cobalt_proto::settings::duration")]
    pub upload_idle_timeout: Duration,
    /// Max-Age (seconds) of the 4.29 and 5.03 answers given when one of the bounds
    /// above is reached. Default 10.
    pub refusal_max_age: u32,
    /// Block size exponent for responses (0–6: 16–1024 bytes). Default 6.
    pub block_szx: u8,
}

impl Default for ServerLimits {
    fn default() -> Self {
        // The upload bounds' defaults are the upload table's own.
        let uploads = UploadLimits::default();
        let con = ConPolicy::default();
        ServerLimits {
            max_observers: 100_000,
            max_observers_per_ip: 1000,
            observe_con_every: con.every,
            observe_con_interval: con.interval,
            observe_min_interval: Duration::ZERO,
            observe_batch: 256,
            max_body: uploads.max_body,
            max_uploads: uploads.max_uploads,
            max_uploads_per_ip: uploads.max_uploads_per_ip,
            max_uploads_per_peer: uploads.max_uploads_per_peer,
            max_upload_memory: uploads.max_upload_memory,
            max_upload_memory_per_ip: uploads.max_upload_memory_per_ip,
            upload_idle_timeout: uploads.upload_idle_timeout,
            refusal_max_age: uploads.refusal_max_age,
            block_szx: 6,
        }
    }
}

impl ServerLimits {
    /// When notifications are confirmable.
    pub(crate) fn con_policy(&self) -> ConPolicy {
        ConPolicy {
            every: self.observe_con_every,
            interval: self.observe_con_interval,
        }
    }

    /// The bounds of a shard's or listener's Block1 upload table.
    pub(crate) fn uploads(&self) -> UploadLimits {
        UploadLimits {
            max_body: self.max_body,
            max_uploads: self.max_uploads,
            max_uploads_per_ip: self.max_uploads_per_ip,
            max_uploads_per_peer: self.max_uploads_per_peer,
            max_upload_memory: self.max_upload_memory,
            max_upload_memory_per_ip: self.max_upload_memory_per_ip,
            upload_idle_timeout: self.upload_idle_timeout,
            refusal_max_age: self.refusal_max_age,
        }
    }

    /// Checks every value; the error names the key and the allowed range.
    pub fn validate(&self) -> Result<(), ConfigError> {
        check(&self.params())
    }

    /// Every parameter with what it does and the values allowed, in file order.
    pub fn params(&self) -> Vec<Param> {
        let secs = Duration::from_secs;
        vec![
            Param::new("max_observers", "Observe relations over all resources, shards and connections; near it, registrations from addresses holding at least what is still free get 5.03 with Max-Age (others keep registering).", "0 or more", true),
            Param::new("max_observers_per_ip", "Observe relations one client IP address may hold over every transport; beyond it a registration gets 4.29 with Max-Age.", "1 to 100000000", (1..=100_000_000).contains(&self.max_observers_per_ip)),
            Param::new("observe_con_every", "Every this many notifications one is confirmable (RFC 7641 §4.5).", "1 to 1000000", (1..=1_000_000).contains(&self.observe_con_every)),
            Param::new("observe_con_interval", "A confirmable notification at least this often.", "1s to 30d", within(self.observe_con_interval, secs(1), secs(30 * 86_400))),
            Param::new("observe_min_interval", "Least time between two notifications to one observer over UDP; changes in between are coalesced into one notification of the latest state (RFC 7641 §4.5.1). 0: no pacing beyond holding notifications while a confirmable one is unacknowledged.", "0s to 1h", self.observe_min_interval <= secs(3600)),
            Param::new("observe_batch", "Observers a UDP shard notifies per turn of its loop before it reads its socket again.", "1 to 65536", (1..=65_536).contains(&self.observe_batch)),
            Param::new("max_body", "Largest request body reassembled from Block1 blocks, in bytes; larger uploads get 4.13.", "1 to 1073741824", (1..=1 << 30).contains(&self.max_body)),
            Param::new("max_uploads", "Block1 uploads in progress per shard (UDP) or listener (TCP, TLS, WebSockets); near it, addresses holding at least what is still free get 5.03 with Max-Age, and at it the heaviest address's oldest upload makes room for an address holding less.", "0 or more", true),
            Param::new("max_uploads_per_ip", "Uploads in progress one client IP address may hold per shard or listener; beyond it 4.29 with Max-Age.", "1 to 1000000", (1..=1_000_000).contains(&self.max_uploads_per_ip)),
            Param::new("max_uploads_per_peer", "Uploads in progress one client address and port may hold per shard or listener; beyond it 4.29 with Max-Age.", "1 to limits.max_uploads_per_ip", (1..=self.max_uploads_per_ip).contains(&self.max_uploads_per_peer)),
            Param::new("max_upload_memory", "Bytes the uploads in progress (and answers kept for their Block2 follow-ups) of one shard or listener may hold together; near it, addresses holding at least what is still free get 5.03 with Max-Age.", "1024 to 68719476736", (1024..=64 << 30).contains(&self.max_upload_memory)),
            Param::new("max_upload_memory_per_ip", "Bytes the uploads in progress of one client IP address may hold per shard or listener; beyond it 4.29 with Max-Age.", "limits.max_body to limits.max_upload_memory", (self.max_body..=self.max_upload_memory).contains(&self.max_upload_memory_per_ip)),
            Param::new("upload_idle_timeout", "An upload that receives no block for this long is dropped, on a timer of its own (looked for every quarter of it); its next block gets 4.08.", "1s to 1h", within(self.upload_idle_timeout, secs(1), secs(3600))),
            Param::new("refusal_max_age", "Max-Age (seconds) of the 4.29 and 5.03 answers given when a bound of this section is reached.", "0 to 86400", self.refusal_max_age <= 86_400),
            Param::new("block_szx", "Block size exponent of responses: block size 2^(4+szx) bytes.", "0 to 6 (16 to 1024 bytes)", self.block_szx <= 6),
        ]
    }
}
