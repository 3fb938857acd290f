//! Server-side limits and policies beyond the endpoint's protocol parameters.

use cobalt_proto::blockwise::uploads::UploadLimits;
use cobalt_proto::observe::relations::ConPolicy;
use std::time::Duration;

/// Bounds and policies of the server role. `Default` gives the documented defaults.
///
/// Bounds on what peers can make the server hold follow one convention: a peer over
/// its own budget gets 4.29 Too Many Requests (RFC 8516), a server-wide bound gets
/// 5.03 Service Unavailable, both with Max-Age [`ServerLimits::refusal_max_age`], and
/// near a server-wide bound only the peers holding at least what is still free are
/// refused, so the others keep being served.
#[derive(Debug, Clone, PartialEq)]
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
    pub observe_con_interval: Duration,
    /// Least time between two notifications to one observer over UDP; changes in
    /// between are coalesced into one notification of the latest state when it has
    /// passed (RFC 7641 §4.5.1 suggests one per round trip). Default 0: no pacing
    /// beyond holding notifications while a confirmable one is unacknowledged.
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
}
