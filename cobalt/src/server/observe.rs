//! Server-side observe (RFC 7641): the [`Observable`] handle a resource's owner calls
//! `changed()` on, and the per-shard registry of observation relations.
//!
//! A change reaches every consumer that may hold relations of the resource through its
//! [`ChangeInbox`]: each UDP shard has one, and each CoAP over TCP / WebSocket
//! connection subscribes one while it has at least one relation of the resource (and
//! unsubscribes when the last one ends or the connection closes). An inbox coalesces
//! changes per resource: notifications are produced from the current state, so only
//! the latest change matters (RFC 7641 §4.5 lets a server skip states), and a consumer
//! that falls behind holds at most one pending entry per observed resource, however
//! often the resource changes.

pub use crate::changes::ObserverFilter;
use crate::changes::{ChangeInbox, PendingChange};
use cobalt_proto::endpoint::ExchangeId;
use cobalt_proto::message::{Message, Token};
use cobalt_proto::tables::shrink_when_sparse;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use cobalt_proto::observe::SEQ_MASK;

static NEXT_OBSERVABLE: AtomicU64 = AtomicU64::new(1);

/// A handle to an observable resource. Attach it with
/// [`MethodRouter::observable`](super::MethodRouter::observable); call
/// [`Observable::changed`] whenever the resource's state changes and every observer
/// gets a notification produced by the resource's GET handler.
///
/// Changes are coalesced: when the resource changes faster than its observers can be
/// notified, states in between are skipped (RFC 7641 §4.5) and every observer ends
/// with a notification of the latest state. Where the GET handler's answer does not
/// depend on who asks, it runs once per change for all observers that asked the same
/// (the same options apart from token, Observe, Block2 and Echo), not once per
/// observer; a handler that calls [`Request::peer`](super::Request::peer) runs for
/// each observer.
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
    /// The inboxes of the UDP (and DTLS) shards.
    shards: OnceLock<Vec<Arc<ChangeInbox>>>,
    /// Stream connections with relations of this resource: by connection id, the
    /// peer (for filters) and the connection's inbox.
    streams: Mutex<HashMap<u64, (SocketAddr, Arc<ChangeInbox>)>>,
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

    /// Sends this resource's changes to the UDP shards' inboxes from now on.
    pub(crate) fn attach(&self, shards: Vec<Arc<ChangeInbox>>) {
        let _ = self.inner.shards.set(shards);
    }

    /// Sends this resource's changes to a stream connection's inbox from now on.
    pub(crate) fn subscribe(&self, conn: u64, peer: SocketAddr, inbox: Arc<ChangeInbox>) {
        self.streams().insert(conn, (peer, inbox));
    }

    /// Stops sending changes to a stream connection.
    pub(crate) fn unsubscribe(&self, conn: u64) {
        let mut streams = self.streams();
        streams.remove(&conn);
        shrink_when_sparse(&mut streams);
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
                inbox.post(
                    self.inner.id,
                    PendingChange {
                        filters: None,
                        confirmable,
                        deleted,
                    },
                );
            }
        }
        let Some(shards) = self.inner.shards.get() else {
            return;
        };
        let change = PendingChange {
            filters: filter.map(|f| vec![f]),
            confirmable,
            deleted,
        };
        for s in shards {
            s.post(self.inner.id, change.clone());
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
    /// When the last confirmable notification went out (or the relation began).
    pub last_con: Instant,
    /// When the last notification went out.
    pub last_sent: Option<Instant>,
    /// Id and MID of the last notification (to match RST and failures, and to hold
    /// the next one while a confirmable one is unacknowledged).
    pub last: Option<(ExchangeId, u16)>,
    /// The resource's change (its shard-local version) that the last notification, or
    /// the registration's answer, showed.
    pub version: u64,
    /// The observer is owed the current state: its last confirmable notification is
    /// unacknowledged, or its pacing interval has not passed. `Some(con)`: the next one
    /// must be confirmable when `con`.
    pub owed: Option<bool>,
}

impl Relation {
    /// A relation registered at `now` by `request`, having seen `version`.
    pub fn new(request: Message, now: Instant, version: u64) -> Relation {
        Relation {
            request,
            since_con: 0,
            last_con: now,
            last_sent: None,
            last: None,
            version,
            owed: None,
        }
    }
}

/// Key of a relation: the observer's address and the token it registered with.
pub(crate) type RelationKey = (SocketAddr, Token);

/// The relations a shard owns, by observable, with the indexes that find one by its
/// key, by its observer's address and by its last notification in constant time. The
/// tables shrink when they empty.
#[derive(Debug, Default)]
pub(crate) struct Relations {
    by_resource: HashMap<u64, HashMap<RelationKey, Relation>>,
    /// Which observable each relation belongs to.
    owner: HashMap<RelationKey, u64>,
    /// The tokens of each observer address.
    by_peer: HashMap<SocketAddr, Vec<Token>>,
    /// The relation of each last notification.
    by_exchange: HashMap<ExchangeId, RelationKey>,
}

impl Relations {
    /// Adds a relation, or replaces the one with the same key (of whichever
    /// observable); true if it is new.
    pub fn insert(&mut self, observable: u64, key: RelationKey, relation: Relation) -> bool {
        let new = self.remove(&key).is_none();
        self.by_resource
            .entry(observable)
            .or_default()
            .insert(key, relation);
        self.owner.insert(key, observable);
        self.by_peer.entry(key.0).or_default().push(key.1);
        new
    }

    /// Whether `peer` observes anything here.
    #[cfg(test)]
    pub fn is_observer(&self, peer: SocketAddr) -> bool {
        self.by_peer.contains_key(&peer)
    }

    /// Whether a relation with this key exists.
    pub fn contains(&self, key: &RelationKey) -> bool {
        self.owner.contains_key(key)
    }

    /// Removes a relation wherever it is; returns its observable and the relation.
    pub fn remove(&mut self, key: &RelationKey) -> Option<(u64, Relation)> {
        let obs = self.owner.remove(key)?;
        shrink_when_sparse(&mut self.owner);
        let rels = self.by_resource.get_mut(&obs)?;
        let rel = rels.remove(key)?;
        if rels.is_empty() {
            self.by_resource.remove(&obs);
            shrink_when_sparse(&mut self.by_resource);
        } else {
            shrink_when_sparse(rels);
        }
        self.unindex(key, &rel);
        Some((obs, rel))
    }

    fn unindex(&mut self, key: &RelationKey, rel: &Relation) {
        if let Some(tokens) = self.by_peer.get_mut(&key.0) {
            tokens.retain(|t| *t != key.1);
            if tokens.is_empty() {
                self.by_peer.remove(&key.0);
                shrink_when_sparse(&mut self.by_peer);
            }
        }
        if let Some((id, _)) = rel.last {
            self.by_exchange.remove(&id);
            shrink_when_sparse(&mut self.by_exchange);
        }
    }

    /// The relation with `key` and its observable.
    pub fn get_mut(&mut self, key: &RelationKey) -> Option<(u64, &mut Relation)> {
        let obs = *self.owner.get(key)?;
        let rel = self.by_resource.get_mut(&obs)?.get_mut(key)?;
        Some((obs, rel))
    }

    /// The relation with `key` and its observable.
    #[cfg(test)]
    pub fn get(&self, key: &RelationKey) -> Option<(u64, &Relation)> {
        let obs = *self.owner.get(key)?;
        Some((obs, self.by_resource.get(&obs)?.get(key)?))
    }

    /// Records the last notification sent on a relation.
    pub fn set_last(&mut self, key: &RelationKey, last: (ExchangeId, u16)) {
        let Some((_, rel)) = self.get_mut(key) else {
            return;
        };
        let old = rel.last.replace(last);
        if let Some((id, _)) = old {
            self.by_exchange.remove(&id);
        }
        self.by_exchange.insert(last.0, *key);
    }

    /// The relation whose last notification was the exchange `id`.
    pub fn by_exchange(&self, id: ExchangeId) -> Option<RelationKey> {
        self.by_exchange.get(&id).copied()
    }

    /// The relation of `peer` whose last notification had the message ID `mid`.
    pub fn by_peer_mid(&self, peer: SocketAddr, mid: u16) -> Option<RelationKey> {
        self.by_peer
            .get(&peer)?
            .iter()
            .map(|t| (peer, *t))
            .find(|k| {
                self.owner
                    .get(k)
                    .and_then(|o| self.by_resource.get(o)?.get(k))
                    .is_some_and(|r| r.last.is_some_and(|(_, m)| m == mid))
            })
    }

    /// The keys of one observable's relations that `pick` accepts.
    pub fn keys_of(
        &self,
        observable: u64,
        pick: impl Fn(&RelationKey) -> bool,
    ) -> Vec<RelationKey> {
        self.by_resource
            .get(&observable)
            .map(|m| m.keys().filter(|k| pick(k)).copied().collect())
            .unwrap_or_default()
    }

    /// Removes and returns every relation of one observable.
    pub fn take_all(&mut self, observable: u64) -> Vec<(RelationKey, Relation)> {
        let all = self.by_resource.remove(&observable).unwrap_or_default();
        shrink_when_sparse(&mut self.by_resource);
        let all: Vec<(RelationKey, Relation)> = all.into_iter().collect();
        for (key, rel) in &all {
            self.owner.remove(key);
            self.unindex(key, rel);
        }
        shrink_when_sparse(&mut self.owner);
        all
    }

    /// Number of relations in this shard.
    pub fn len(&self) -> usize {
        self.owner.len()
    }

    /// The capacity of the largest index (for tests of memory coming back).
    #[cfg(test)]
    pub fn capacity(&self) -> usize {
        self.owner.capacity().max(self.by_peer.capacity())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::changes::MAX_FILTERS;
    use cobalt_proto::message::{Code, MessageType};

    fn rel() -> Relation {
        Relation::new(
            Message::new(MessageType::Confirmable, Code::GET, 1),
            Instant::now(),
            0,
        )
    }

    #[test]
    fn insert_replace_remove_and_find() {
        let mut r = Relations::default();
        let key = ("127.0.0.1:1".parse().unwrap(), Token::new(&[1]).unwrap());
        assert!(r.insert(7, key, rel()));
        assert!(!r.insert(7, key, rel()), "same token re-registers");
        assert_eq!(r.len(), 1);
        assert!(r.is_observer(key.0));
        let other = (key.0, Token::new(&[2]).unwrap());
        assert!(r.insert(8, other, rel()));
        r.set_last(&other, (ExchangeId(5), 42));
        assert_eq!(r.by_exchange(ExchangeId(5)), Some(other));
        assert_eq!(r.by_peer_mid(key.0, 42), Some(other));
        assert_eq!(r.by_peer_mid(key.0, 43), None);
        assert_eq!(r.remove(&key).map(|(o, _)| o), Some(7));
        assert!(r.remove(&key).is_none());
        assert!(r.is_observer(key.0), "still observes 8");
        assert_eq!(r.keys_of(8, |_| true), [other]);
        assert_eq!(r.take_all(8).len(), 1);
        assert!(!r.is_observer(key.0));
        assert_eq!(r.by_exchange(ExchangeId(5)), None);
        assert_eq!(r.len(), 0);
        // A token moved to another resource leaves the first.
        assert!(r.insert(7, key, rel()));
        assert!(!r.insert(8, key, rel()));
        assert!(r.keys_of(7, |_| true).is_empty());
        assert_eq!(r.get_mut(&key).map(|(o, _)| o), Some(8));
    }

    #[test]
    fn the_tables_give_memory_back_when_they_empty() {
        let mut r = Relations::default();
        let keys: Vec<RelationKey> = (0..20_000u32)
            .map(|i| {
                let peer = SocketAddr::from(([10, 0, (i >> 8) as u8, i as u8], 5683));
                (peer, Token::new(&i.to_be_bytes()).unwrap())
            })
            .collect();
        for (i, k) in keys.iter().enumerate() {
            r.insert(1, *k, rel());
            r.set_last(k, (ExchangeId(i as u64), 1));
        }
        assert!(r.capacity() >= 20_000);
        for k in &keys {
            r.remove(k);
        }
        assert_eq!(r.len(), 0);
        assert!(
            r.capacity() <= 64,
            "capacity {} after the flood",
            r.capacity()
        );
    }

    fn taken(inbox: &ChangeInbox) -> Vec<(u64, bool)> {
        inbox
            .take()
            .into_iter()
            .map(|(o, c)| (o, c.deleted))
            .collect()
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
        assert_eq!(taken(&a), [(o.id(), false)], "100 changes, one entry");
        assert_eq!(taken(&b), [(o.id(), false)]);
        o.changed_for(|peer| peer.ip().is_loopback());
        assert!(b.take().is_empty(), "filtered out");
        o.deleted();
        o.changed();
        assert_eq!(taken(&a), [(o.id(), true)], "deletion is not overwritten");
        assert_eq!(taken(&b), [(o.id(), true)]);
        o.unsubscribe(1);
        o.unsubscribe(2);
        assert_eq!(o.subscribers(), 0);
        o.changed();
        assert!(a.take().is_empty() && b.take().is_empty());
    }

    #[test]
    fn shard_inboxes_merge_filters_until_there_are_too_many() {
        let o = Observable::new();
        let shard = Arc::new(ChangeInbox::default());
        o.attach(vec![shard.clone()]);
        let near: SocketAddr = "127.0.0.1:1".parse().unwrap();
        let far: SocketAddr = "192.0.2.1:1".parse().unwrap();
        o.changed_for(move |p| p == near);
        o.changed_for(move |p| p == near);
        let [(id, change)] = <[_; 1]>::try_from(shard.take()).unwrap();
        assert_eq!(id, o.id());
        assert!(change.selects(near) && !change.selects(far), "{change:?}");
        assert!(!change.confirmable);
        o.changed_for(move |p| p == near);
        o.changed_confirmable();
        let [(_, change)] = <[_; 1]>::try_from(shard.take()).unwrap();
        assert!(change.selects(far), "an unfiltered change selects all");
        assert!(change.confirmable);
        for _ in 0..=MAX_FILTERS {
            o.changed_for(move |p| p == near);
        }
        let [(_, change)] = <[_; 1]>::try_from(shard.take()).unwrap();
        assert!(change.selects(far), "too many filters: all observers");
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
