//! Where registrations survive a restart: the [`RegistrationStore`] trait, an
//! in-memory store for tests ([`MemoryStore`]) and the embedded default on redb
//! ([`RedbStore`](crate::RedbStore)).
//!
//! The directory keeps every registration in memory and writes each change through
//! to its store before answering; on start it loads them all back. Expiry times are
//! stored as wall-clock seconds, so a restarted directory expires them on schedule.
//! A store is keyed by the registration id; a shared store (Redis, for a cluster)
//! implements the same three operations.

use crate::error::StoreError;
use crate::registration::Registration;
use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Mutex;

/// What a store operation returns: a boxed future, so that the trait stays usable
/// as `dyn RegistrationStore` and a store may do its I/O asynchronously.
pub type StoreFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, StoreError>> + Send + 'a>>;

/// Durable storage of registrations.
pub trait RegistrationStore: Send + Sync + 'static {
    /// Every stored registration (expired ones included; the directory expires them).
    fn load(&self) -> StoreFuture<'_, Vec<Registration>>;
    /// Stores `registration`, replacing the one with the same id.
    fn put(&self, registration: Registration) -> StoreFuture<'_, ()>;
    /// Deletes the registrations with these ids (unknown ids are ignored).
    fn remove(&self, ids: Vec<u64>) -> StoreFuture<'_, ()>;
}

/// A store in memory: nothing survives the process. For tests, and for a directory
/// that is meant to forget.
#[derive(Debug, Default)]
pub struct MemoryStore {
    registrations: Mutex<BTreeMap<u64, Registration>>,
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> MemoryStore {
        MemoryStore::default()
    }

    fn map(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, Registration>> {
        self.registrations
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl RegistrationStore for MemoryStore {
    fn load(&self) -> StoreFuture<'_, Vec<Registration>> {
        let all = self.map().values().cloned().collect();
        Box::pin(async move { Ok(all) })
    }

    fn put(&self, registration: Registration) -> StoreFuture<'_, ()> {
        self.map().insert(registration.id, registration);
        Box::pin(async { Ok(()) })
    }

    fn remove(&self, ids: Vec<u64>) -> StoreFuture<'_, ()> {
        let mut map = self.map();
        for id in ids {
            map.remove(&id);
        }
        Box::pin(async { Ok(()) })
    }
}
