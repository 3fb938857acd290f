//! Server-side limits and policies beyond the endpoint's protocol parameters.

use std::time::Duration;

/// Bounds and policies of the server role. `Default` gives the documented defaults.
#[derive(Debug, Clone, PartialEq)]
pub struct ServerLimits {
    /// Observers over all resources and shards; beyond it a GET with Observe=0 is
    /// answered normally, without Observe, so the client knows it is not registered
    /// (RFC 7641 §4.1). Default 100,000.
    pub max_observers: usize,
    /// Every this many notifications one is confirmable, to learn whether the observer
    /// is still there (RFC 7641 §4.5). Default 20.
    pub observe_con_every: u32,
    /// A confirmable notification at least this often. Default 24 h.
    pub observe_con_interval: Duration,
    /// Largest request body reassembled from Block1 blocks; larger uploads get 4.13
    /// with Size1. Default 1 MiB.
    pub max_body: usize,
    /// Block1 uploads in progress per shard; beyond it 5.03. Default 1,000.
    pub max_uploads: usize,
    /// Bytes that the uploads in progress (and the large answers kept for their Block2
    /// follow-ups) of one shard may hold together; beyond it new blocks get 5.03.
    /// Default 64 MiB.
    pub max_upload_memory: usize,
    /// Block size exponent for responses (0–6: 16–1024 bytes). Default 6.
    pub block_szx: u8,
}

impl Default for ServerLimits {
    fn default() -> Self {
        ServerLimits {
            max_observers: 100_000,
            observe_con_every: 20,
            observe_con_interval: Duration::from_secs(24 * 3600),
            max_body: 1 << 20,
            max_uploads: 1000,
            max_upload_memory: 64 << 20,
            block_szx: 6,
        }
    }
}
