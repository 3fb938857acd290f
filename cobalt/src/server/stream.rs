//! What the connections of one CoAP-over-TCP or -WebSocket listener (RFC 8323) share:
//! the resources, the limits, the Block1 uploads (one set of budgets for the
//! listener) and the largest BERT block. Each connection runs its own
//! [`ConnectionRole`](super::role::ConnectionRole) made from it.

use super::layer::Front;
use super::routes::Routes;
use super::upload_table::SharedUploads;
use super::ServerLimits;

/// What one listener's connections share.
pub(crate) struct StreamShared {
    /// The resources.
    pub routes: Routes,
    /// Observers, uploads, block size.
    pub limits: ServerLimits,
    /// Uploads in progress and kept answers of all connections: one set of budgets
    /// (`limits.uploads.max_uploads`, `max_upload_memory`, per address) for the
    /// listener, however many connections it has. Idle ones expire on a timer task.
    pub uploads: SharedUploads,
    /// Largest BERT block sent, in bytes.
    pub max_bert_block: usize,
    /// The server's layers and the transport.
    pub front: Front,
}

impl StreamShared {
    /// The shared state of a listener whose connections announce BERT when `bert`.
    pub(crate) fn new(
        routes: Routes,
        limits: ServerLimits,
        bert: bool,
        max_bert_block: usize,
        front: Front,
    ) -> StreamShared {
        let uploads = routes
            .budgets()
            .uploads(limits.uploads.clone())
            .with_bert(bert);
        StreamShared {
            routes,
            limits,
            uploads: SharedUploads::new(uploads),
            max_bert_block,
            front,
        }
    }
}
