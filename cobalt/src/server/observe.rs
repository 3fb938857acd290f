//! Server-side observe (RFC 7641): the [`Observable`] handle a resource's owner calls
//! `changed()` on, and the per-shard registry of observation relations.
//!
//! A change reaches the UDP shards through their command queues, and the CoAP over
//! TCP / WebSocket connections that hold relations of the resource through their
//! [`ChangeInbox`]: a connection subscribes while it has at least one relation of the
//! resource and unsubscribes when the last one ends or the connection closes. An inbox
//! coalesces changes per resource (notifications are produced from the current state,
//! so only the latest change matters), so a slow connection holds at most one pending
//! entry per observed resource, however often the resource changes.

use crate::runtime::driver::Command;
use cobalt_proto::endpoint::ExchangeId;
use cobalt_proto::message::{Message, Token};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;
use tokio::sync::{mpsc, Notify};

use cobalt_proto::observe::SEQ_MASK;

static NEXT_OBSERVABLE: AtomicU64 = AtomicU64::new(1);

/// Chooses which observers a notification goes to.
pub type ObserverFilter = Arc<dyn Fn(SocketAddr) -> bool + Send + Sync>;

/// What a change asks the shards to do.
#[derive(Clone)]
pub(crate) struct Change {
    /// The observable that changed.
    pub observable: u64,
    /// Only observers for which this returns true are notified (all when `None`).
    pub filter: Option<ObserverFilter>,
    /// Send as CON even if the policy would send NON.
    pub confirmable: bool,
    /// The resource is gone: send 4.04 and end every relation.
    pub deleted: bool,
}

/// A handle to an observable resource. Attach it with
/// [`MethodRouter::observable`](super::MethodRouter::observable); call
/// [`Observable::changed`] whenever the resource's state changes and every observer
/// gets a notification produced by the resource's GET handler.
///
/// The sequence number is taken from one counter per resource, so notifications are
/// ordered by the resource, whichever shard sends them (thesis §5.4).
#[derive(Clone)]
pub struct Observable {
    inner: Arc<Inner>,
}

struct Inner {
    id: u64,
    seq: AtomicU32,
    observers: AtomicUsize,
    shards: OnceLock<Vec<mpsc::UnboundedSender<Command>>>,
    /// Stream connections with relations of this resource: by connection id, the
    /// peer (for filters) and the connection's inbox.
    streams: Mutex<HashMap<u64, (SocketAddr, Arc<ChangeInbox>)>>,
}

/// Changes waiting for one stream connection (`coap+tcp`, `coap+ws`): per observable,
/// whether it was deleted. Bounded by the number of resources the connection observes.
#[derive(Debug, Default)]
pub(crate) struct ChangeInbox {
    pending: Mutex<HashMap<u64, bool>>,
    wake: Notify,
}

impl ChangeInbox {
    /// Records a change of `observable` (deletion wins over a later change) and wakes
    /// the connection.
    fn post(&self, observable: u64, deleted: bool) {
        let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        *pending.entry(observable).or_insert(false) |= deleted;
        drop(pending);
        self.wake.notify_one();
    }

    /// Takes the pending changes: (observable, deleted).
    pub(crate) fn take(&self) -> Vec<(u64, bool)> {
        let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        pending.drain().collect()
    }

    /// Resolves when a change has been posted since the last call resolved.
    pub(crate) async fn changed(&self) {
        self.wake.notified().await
    }
}

impl std::fmt::Debug for Observable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Observable")
            .field("id", &self.inner.id)
            .field("observers", &self.observer_count())
            .finish()
    }
}

impl Default for Observable {
    fn default() -> Self {
        Observable::new()
    }
}

impl Observable {
    /// A new handle, not yet attached to a resource.
    pub fn new() -> Observable {
        Observable {
            inner: Arc::new(Inner {
                id: NEXT_OBSERVABLE.fetch_add(1, Ordering::Relaxed),
                seq: AtomicU32::new(2),
                observers: AtomicUsize::new(0),
                shards: OnceLock::new(),
                streams: Mutex::new(HashMap::new()),
            }),
        }
    }

    /// The resource changed: notify every observer (NON mostly, CON as the policy says).
    pub fn changed(&self) {
        self.broadcast(None, false, false);
    }

    /// The resource changed: notify every observer with a confirmable notification.
    pub fn changed_confirmable(&self) {
        self.broadcast(None, true, false);
    }

    /// The resource changed for some observers only: `filter` picks them by address.
    pub fn changed_for(&self, filter: impl Fn(SocketAddr) -> bool + Send + Sync + 'static) {
        self.broadcast(Some(Arc::new(filter)), false, false);
    }

    /// The resource is gone: every observer gets 4.04 Not Found and is removed.
    pub fn deleted(&self) {
        self.broadcast(None, true, true);
    }

    /// Observers registered now, over all shards and stream connections.
    pub fn observer_count(&self) -> usize {
        self.inner.observers.load(Ordering::Relaxed)
    }

    /// The sequence number the next notification will carry.
    pub(crate) fn current_seq(&self) -> u32 {
        self.inner.seq.load(Ordering::Relaxed) & SEQ_MASK
    }

    pub(crate) fn id(&self) -> u64 {
        self.inner.id
    }

    pub(crate) fn attach(&self, shards: Vec<mpsc::UnboundedSender<Command>>) {
        let _ = self.inner.shards.set(shards);
    }

    /// Sends this resource's changes to a stream connection's inbox from now on.
    pub(crate) fn subscribe(&self, conn: u64, peer: SocketAddr, inbox: Arc<ChangeInbox>) {
        self.streams().insert(conn, (peer, inbox));
    }

    /// Stops sending changes to a stream connection.
    pub(crate) fn unsubscribe(&self, conn: u64) {
        self.streams().remove(&conn);
    }

    fn streams(&self) -> std::sync::MutexGuard<'_, HashMap<u64, (SocketAddr, Arc<ChangeInbox>)>> {
        self.inner.streams.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Stream connections subscribed now (for tests).
    #[cfg(test)]
    pub(crate) fn subscribers(&self) -> usize {
        self.streams().len()
    }

    pub(crate) fn observer_added(&self) {
        self.inner.observers.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn observer_removed(&self) {
        let _ = self
            .inner
            .observers
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
    }

    fn broadcast(&self, filter: Option<ObserverFilter>, confirmable: bool, deleted: bool) {
        self.inner.seq.fetch_add(1, Ordering::Relaxed);
        // The filter is the caller's code: run it outside the lock.
        let streams: Vec<(SocketAddr, Arc<ChangeInbox>)> =
            self.streams().values().cloned().collect();
        for (peer, inbox) in streams {
            if filter.as_ref().is_none_or(|f| f(peer)) {
                inbox.post(self.inner.id, deleted);
            }
        }
        let Some(shards) = self.inner.shards.get() else {
            return;
        };
        let change = Change {
            observable: self.inner.id,
            filter,
            confirmable,
            deleted,
        };
        for s in shards {
            let _ = s.send(Command::Notify(change.clone()));
        }
    }
}

/// One observer of one resource.
#[derive(Debug)]
pub(crate) struct Relation {
    /// The registering GET; notifications are the GET handler's answers to it.
    pub request: Message,
    /// Notifications sent since the last confirmable one.
    pub since_con: u32,
    /// When the last confirmable notification went out.
    pub last_con: Instant,
    /// Id and MID of the last notification (to match RST and failures, and to replace
    /// an unacknowledged CON).
    pub last: Option<(ExchangeId, u16)>,
}

/// Key of a relation: the observer's address and the token it registered with.
pub(crate) type RelationKey = (SocketAddr, Token);

/// The relations a shard owns, by observable.
#[derive(Debug, Default)]
pub(crate) struct Relations {
    by_resource: HashMap<u64, HashMap<RelationKey, Relation>>,
    /// Relations per observer address.
    by_peer: HashMap<SocketAddr, usize>,
}

impl Relations {
    /// Adds or replaces a relation; true if it is new.
    pub fn insert(&mut self, observable: u64, key: RelationKey, relation: Relation) -> bool {
        let new = self
            .by_resource
            .entry(observable)
            .or_default()
            .insert(key, relation)
            .is_none();
        if new {
            *self.by_peer.entry(key.0).or_default() += 1;
        }
        new
    }

    fn forget_peer(&mut self, peer: SocketAddr) {
        if let Some(n) = self.by_peer.get_mut(&peer) {
            *n -= 1;
            if *n == 0 {
                self.by_peer.remove(&peer);
            }
        }
    }

    /// Whether `peer` observes anything here.
    #[cfg(test)]
    pub fn is_observer(&self, peer: SocketAddr) -> bool {
        self.by_peer.contains_key(&peer)
    }

    /// Removes a relation wherever it is; returns the observable it belonged to.
    pub fn remove(&mut self, key: &RelationKey) -> Option<u64> {
        let mut found = None;
        for (obs, rels) in self.by_resource.iter_mut() {
            if rels.remove(key).is_some() {
                found = Some(*obs);
                break;
            }
        }
        if let Some(obs) = found {
            self.forget_peer(key.0);
            if self.by_resource.get(&obs).is_some_and(HashMap::is_empty) {
                self.by_resource.remove(&obs);
            }
        }
        found
    }

    /// Finds the relation whose last notification matches.
    pub fn find_by_last(
        &self,
        pred: impl Fn(&RelationKey, (ExchangeId, u16)) -> bool,
    ) -> Option<RelationKey> {
        self.by_resource
            .values()
            .flat_map(|m| m.iter())
            .find(|(k, r)| r.last.is_some_and(|l| pred(k, l)))
            .map(|(k, _)| *k)
    }

    /// The relations of one observable.
    pub fn of(&mut self, observable: u64) -> Option<&mut HashMap<RelationKey, Relation>> {
        self.by_resource.get_mut(&observable)
    }

    /// Removes and returns every relation of one observable.
    pub fn take_all(&mut self, observable: u64) -> HashMap<RelationKey, Relation> {
        let all = self.by_resource.remove(&observable).unwrap_or_default();
        for key in all.keys() {
            self.forget_peer(key.0);
        }
        all
    }

    /// Number of relations in this shard.
    pub fn len(&self) -> usize {
        self.by_resource.values().map(HashMap::len).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cobalt_proto::message::{Code, MessageType};

    fn rel() -> Relation {
        Relation {
            request: Message::new(MessageType::Confirmable, Code::GET, 1),
            since_con: 0,
            last_con: Instant::now(),
            last: None,
        }
    }

    #[test]
    fn insert_replace_remove() {
        let mut r = Relations::default();
        let key = ("127.0.0.1:1".parse().unwrap(), Token::new(&[1]).unwrap());
        assert!(r.insert(7, key, rel()));
        assert!(!r.insert(7, key, rel()), "same token re-registers");
        assert_eq!(r.len(), 1);
        assert!(r.is_observer(key.0));
        let other = (key.0, Token::new(&[2]).unwrap());
        assert!(r.insert(8, other, rel()));
        assert_eq!(r.remove(&key), Some(7));
        assert_eq!(r.remove(&key), None);
        assert!(r.is_observer(key.0), "still observes 8");
        assert_eq!(r.take_all(8).len(), 1);
        assert!(!r.is_observer(key.0));
        assert_eq!(r.len(), 0);
    }

    #[tokio::test]
    async fn changes_reach_subscribed_inboxes_coalesced_and_filtered() {
        let o = Observable::new();
        let near: SocketAddr = "127.0.0.1:1".parse().unwrap();
        let far: SocketAddr = "192.0.2.1:1".parse().unwrap();
        let (a, b) = (
            Arc::new(ChangeInbox::default()),
            Arc::new(ChangeInbox::default()),
        );
        o.subscribe(1, near, a.clone());
        o.subscribe(2, far, b.clone());
        for _ in 0..100 {
            o.changed();
        }
        o.changed_for(|peer| peer.ip().is_loopback());
        a.changed().await;
        assert_eq!(a.take(), [(o.id(), false)], "100 changes, one entry");
        assert_eq!(b.take(), [(o.id(), false)]);
        o.changed_for(|peer| peer.ip().is_loopback());
        assert!(b.take().is_empty(), "filtered out");
        o.deleted();
        o.changed();
        assert_eq!(a.take(), [(o.id(), true)], "deletion is not overwritten");
        assert_eq!(b.take(), [(o.id(), true)]);
        o.unsubscribe(1);
        o.unsubscribe(2);
        assert_eq!(o.subscribers(), 0);
        o.changed();
        assert!(a.take().is_empty() && b.take().is_empty());
    }

    #[test]
    fn sequence_numbers_advance_and_wrap_in_24_bits() {
        let o = Observable::new();
        let a = o.current_seq();
        o.changed();
        assert_eq!(o.current_seq(), (a + 1) & SEQ_MASK);
        o.inner.seq.store(SEQ_MASK, Ordering::Relaxed);
        o.changed();
        assert_eq!(o.current_seq(), 0);
    }
}
