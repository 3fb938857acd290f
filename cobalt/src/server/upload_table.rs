//! Where a server role keeps its Block1 uploads: a datagram shard owns its
//! [`Uploads`]; the connections of a stream listener share one (one set of budgets per
//! listener, however many connections it has), each through a [`ConnectionUploads`]
//! that forgets its peer's uploads when the connection ends.

use cobalt_proto::blockwise::uploads::{UploadStats, Uploads};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

/// An upload table as the server role uses it.
pub(crate) trait UploadTable: 'static {
    /// Runs `f` on the table.
    fn with<R>(&mut self, f: impl FnOnce(&mut Uploads) -> R) -> R;
    /// When an idle upload next expires, if the role has to expire them.
    fn poll_timeout(&self) -> Option<Instant>;
    /// Drops the uploads idle at `now`.
    fn expire(&mut self, now: Instant);
    /// Uploads held and their bytes (for metrics).
    fn stats(&self) -> UploadStats;
    /// When `peer`'s Q-Block1 upload `key` is due to ask for its missing blocks.
    fn qblock1_due(&self, peer: SocketAddr, key: &[u8]) -> Option<Instant>;
}

impl UploadTable for Uploads {
    fn with<R>(&mut self, f: impl FnOnce(&mut Uploads) -> R) -> R {
        f(self)
    }

    fn poll_timeout(&self) -> Option<Instant> {
        Uploads::poll_timeout(self)
    }

    fn expire(&mut self, now: Instant) {
        Uploads::expire(self, now)
    }

    fn stats(&self) -> UploadStats {
        Uploads::stats(self)
    }

    fn qblock1_due(&self, peer: SocketAddr, key: &[u8]) -> Option<Instant> {
        Uploads::qblock1_due(self, peer, key)
    }
}

/// The uploads of a listener's connections; idle ones expire on a timer task of the
/// runtime it was made on, until the table is dropped.
#[derive(Clone)]
pub(crate) struct SharedUploads(Arc<Mutex<Uploads>>);

impl SharedUploads {
    /// Shares `uploads`, expiring them on the current tokio runtime (if any).
    pub(crate) fn new(uploads: Uploads) -> SharedUploads {
        let shared = Arc::new(Mutex::new(uploads));
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(expire(Arc::downgrade(&shared)));
        }
        SharedUploads(shared)
    }

    /// The view of the connection with `peer`.
    pub(crate) fn for_peer(&self, peer: SocketAddr) -> ConnectionUploads {
        ConnectionUploads {
            shared: self.clone(),
            peer,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Uploads> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Drops the listener's idle uploads on their timer, until the listener is gone.
async fn expire(uploads: Weak<Mutex<Uploads>>) {
    loop {
        let next = {
            let Some(uploads) = uploads.upgrade() else {
                return;
            };
            let mut u = uploads.lock().unwrap_or_else(|e| e.into_inner());
            u.expire(Instant::now());
            u.poll_timeout()
        };
        // Nothing held: look again in a second (the timer starts with the first upload).
        let wake = next.unwrap_or_else(|| Instant::now() + Duration::from_secs(1));
        tokio::time::sleep_until(wake.into()).await;
    }
}

/// One connection's view of its listener's uploads.
pub(crate) struct ConnectionUploads {
    shared: SharedUploads,
    peer: SocketAddr,
}

impl UploadTable for ConnectionUploads {
    fn with<R>(&mut self, f: impl FnOnce(&mut Uploads) -> R) -> R {
        f(&mut self.shared.lock())
    }

    /// The listener's timer task expires them.
    fn poll_timeout(&self) -> Option<Instant> {
        None
    }

    fn expire(&mut self, _now: Instant) {}

    fn stats(&self) -> UploadStats {
        self.shared.lock().stats()
    }

    /// Q-Block is for datagram transports: a connection's requests never carry it
    /// past the connection's option check.
    fn qblock1_due(&self, _peer: SocketAddr, _key: &[u8]) -> Option<Instant> {
        None
    }
}

impl Drop for ConnectionUploads {
    /// The connection is gone: its unfinished uploads and kept answers too.
    fn drop(&mut self) {
        self.shared.lock().forget_peer(self.peer);
    }
}
