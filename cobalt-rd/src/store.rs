//! Where registrations survive a restart: the [`RegistrationStore`] trait, an
//! in-memory store for tests ([`MemoryStore`]) and the embedded default on redb
//! ([`RedbStore`](crate::RedbStore)).
//!
//! The directory keeps every registration in memory and writes each change through
//! to its store before answering; on start it loads them all back. Expiry times are
//! stored as wall-clock seconds, so a restarted directory expires them on schedule.
//! A store is keyed by the registration id.
//!
//! A store shared by several directories (a cluster on
//! [`RedisStore`](crate::RedisStore)) also numbers new registrations
//! ([`RegistrationStore::allocate_id`]), refuses a write made from a stale view
//! ([`RegistrationStore::put_checked`]: the (ep, d) already taken by another node,
//! the registration removed meanwhile, a budget spent cluster-wide), expires only
//! what has run out in the store itself ([`RegistrationStore::remove_expired`]), and
//! tells each directory what the others changed ([`RegistrationStore::subscribe`]).
//! The defaults of those four methods are right for a store with one directory.

use crate::error::StoreError;
use crate::registration::Registration;
use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Mutex;

/// What a store operation returns: a boxed future, so that the trait stays usable
/// as `dyn RegistrationStore` and a store may do its I/O asynchronously.
pub type StoreFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, StoreError>> + Send + 'a>>;

/// How a directory means a write: as a new registration (under budgets that the
/// store checks again, cluster-wide) or as a change of one it holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Write {
    /// A registration with a new id and an (ep, d) nobody holds.
    New {
        /// Most registrations one peer address budget may hold.
        max_per_peer: usize,
        /// Most registrations in the whole directory.
        max_total: usize,
    },
    /// A new version of a registration that is stored under its id.
    Replace,
}

/// What a checked write did.
#[derive(Debug, Clone, PartialEq)]
pub enum Written {
    /// It is stored.
    Stored,
    /// Nothing was written: the directory's view was stale. It holds what the store
    /// holds now: the registration with that (ep, d) (for [`Write::New`]) or with
    /// that id (for [`Write::Replace`]), `None` if there is none.
    Stale(Option<Registration>),
    /// Nothing was written: the peer's budget is spent in the shared store.
    PeerFull,
    /// Nothing was written: the shared store holds its most registrations.
    Full,
}

/// A change that some directory (this one included) made to a shared store.
#[derive(Debug, Clone, PartialEq)]
pub enum StoreChange {
    /// The registration as it is stored now.
    Stored(Registration),
    /// The registration with this id is gone.
    Removed(u64),
    /// Changes may have been missed (the connection was lost): load everything again.
    Resync,
    /// The connection to the store is lost (why, in words): until the next `Resync`
    /// this node's copy may be stale and its writes fail.
    Lost(String),
}

/// Durable storage of registrations.
pub trait RegistrationStore: Send + Sync + 'static {
    /// Every stored registration (expired ones included; the directory expires them).
    fn load(&self) -> StoreFuture<'_, Vec<Registration>>;
    /// Stores `registration`, replacing the one with the same id.
    fn put(&self, registration: Registration) -> StoreFuture<'_, ()>;
    /// Deletes the registrations with these ids (unknown ids are ignored).
    fn remove(&self, ids: Vec<u64>) -> StoreFuture<'_, ()>;

    /// An id for a new registration, unique among every directory sharing the
    /// store; `None` (the default) lets the directory number them itself.
    fn allocate_id(&self) -> StoreFuture<'_, Option<u64>> {
        Box::pin(async { Ok(None) })
    }

    /// Stores `registration` if `write` still holds in the store; the default (one
    /// directory, whose view is never stale) is [`RegistrationStore::put`].
    fn put_checked(&self, registration: Registration, write: Write) -> StoreFuture<'_, Written> {
        let _ = write;
        let put = self.put(registration);
        Box::pin(async move { put.await.map(|()| Written::Stored) })
    }

    /// Removes those of `candidates` (the directory's expired registrations) whose
    /// stored expiry is at or before `now`, and returns their ids; the default
    /// removes them all.
    fn remove_expired(&self, candidates: Vec<u64>, now: u64) -> StoreFuture<'_, Vec<u64>> {
        let _ = now;
        let remove = self.remove(candidates.clone());
        Box::pin(async move { remove.await.map(|()| candidates) })
    }

    /// The changes that directories make to a shared store, starting with a
    /// [`StoreChange::Resync`]; `None` (the default) for a store only this
    /// directory writes. Call it once.
    fn subscribe(&self) -> Option<tokio::sync::mpsc::Receiver<StoreChange>> {
        None
    }
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
