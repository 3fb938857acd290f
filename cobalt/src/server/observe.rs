//! Server-side observe (RFC 7641): the [`Observable`] handle a resource's owner calls
//! `changed()` on. The relations themselves and the rule for confirmable notifications
//! are `cobalt_proto::observe::relations`'s.
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
use crate::changes::{ChangeInbox, Ending, PendingChange};
use cobalt_proto::message::Code;
use cobalt_proto::tables::shrink_when_sparse;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

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
        self.broadcast(None, false, None);
    }

    /// The resource changed: notify every observer with a confirmable notification.
    pub fn changed_confirmable(&self) {
        self.broadcast(None, true, None);
    }

    /// The resource changed for some observers only: `filter` picks them by address.
    pub fn changed_for(&self, filter: impl Fn(SocketAddr) -> bool + Send + Sync + 'static) {
        self.broadcast(Some(Arc::new(filter)), false, None);
    }

    /// The resource is gone: every observer gets 4.04 Not Found and is removed.
    pub fn deleted(&self) {
        self.end_observations(Code::NOT_FOUND);
    }

    /// Every observer gets a last, confirmable notification with `code` and is removed:
    /// the resource can no longer be served as the observers registered for it, e.g.
    /// 4.06 Not Acceptable when its Content-Format changed. `code` should be a 4.xx or
    /// 5.xx (RFC 7641 §4.2); the notification has no payload. Observers that register
    /// afterwards are not affected.
    pub fn end_observations(&self, code: Code) {
        self.broadcast(None, true, Some(Ending::With(code)));
    }

    /// Every observer is removed without being sent anything, over every shard and
    /// stream connection, as if the server had rebooted: an observer notices when the
    /// Max-Age of its last notification runs out, and registers again. Observers that
    /// register afterwards are not affected.
    pub fn forget_observers(&self) {
        self.broadcast(None, false, Some(Ending::Silently));
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
        shrink_when_sparse(&mut *streams);
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

    fn broadcast(&self, filter: Option<ObserverFilter>, confirmable: bool, ending: Option<Ending>) {
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
                        ending,
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
            ending,
        };
        for s in shards {
            s.post(self.inner.id, change.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::changes::MAX_FILTERS;

    fn taken(inbox: &ChangeInbox) -> Vec<(u64, bool)> {
        inbox
            .take()
            .into_iter()
            .map(|(o, c)| (o, c.ending == Some(Ending::With(Code::NOT_FOUND))))
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
    fn endings_reach_every_inbox_and_the_first_one_sticks() {
        let o = Observable::new();
        let shard = Arc::new(ChangeInbox::default());
        o.attach(vec![shard.clone()]);
        let stream = Arc::new(ChangeInbox::default());
        o.subscribe(1, "127.0.0.1:1".parse().unwrap(), stream.clone());
        o.forget_observers();
        o.end_observations(Code::NOT_ACCEPTABLE);
        o.changed();
        for inbox in [&shard, &stream] {
            let [(id, change)] = <[_; 1]>::try_from(inbox.take()).unwrap();
            assert_eq!(id, o.id());
            assert_eq!(change.ending, Some(Ending::Silently), "{change:?}");
        }
        o.end_observations(Code::NOT_ACCEPTABLE);
        let [(_, change)] = <[_; 1]>::try_from(shard.take()).unwrap();
        assert_eq!(change.ending, Some(Ending::With(Code::NOT_ACCEPTABLE)));
        assert!(change.confirmable, "the last notification is confirmable");
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
