//! The table of upstream observations and, for each, who listens: the latest
//! answer in a watch channel (event streams and waiting requests), the addresses of
//! the CoAP observers and the front's [`Observable`] to change for them. What runs an
//! observation against its origin is `observe`'s.

use crate::cache::CacheKey;
use cobalt::server::Observable;
use cobalt::Response;
use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::atomic::{AtomicBool, AtomicU32};
use std::sync::{Arc, Mutex};
use tokio::sync::watch;

/// Notifications in a row that no CoAP observer was sent before the observation ends.
const UNSERVED_LIMIT: u32 = 3;

/// One upstream observation and who listens to it.
pub(crate) struct Shared {
    /// The latest answer (`None` until the first).
    latest: watch::Sender<Option<Response>>,
    /// Addresses of the CoAP observers of this target (bounded; beyond the bound every
    /// observer of the front is told of each change).
    peers: Arc<Mutex<HashSet<SocketAddr>>>,
    overflow: AtomicBool,
    /// The CoAP front's observable, once a CoAP observer joined.
    observable: Mutex<Option<Observable>>,
    /// Whether a CoAP observer was sent the latest notification.
    served: AtomicBool,
    unserved: AtomicU32,
}

impl Shared {
    /// A receiver of the latest answer and every later one.
    pub(crate) fn subscribe(&self) -> watch::Receiver<Option<Response>> {
        self.latest.subscribe()
    }

    /// The latest answer, for a CoAP observer (marks the observation as listened to).
    pub(crate) fn latest_for_coap(&self) -> Option<Response> {
        self.served.store(true, Relaxed);
        self.latest.borrow().clone()
    }

    /// A new observation with no answer yet and nobody listening.
    pub(crate) fn new() -> Shared {
        Shared {
            latest: watch::channel(None).0,
            peers: Arc::default(),
            overflow: AtomicBool::new(false),
            observable: Mutex::new(None),
            served: AtomicBool::new(false),
            unserved: AtomicU32::new(0),
        }
    }

    /// Counts whether a CoAP observer was sent the latest answer, before the next
    /// one is published.
    pub(crate) fn count_served(&self) {
        if self.served.swap(false, Relaxed) {
            self.unserved.store(0, Relaxed);
        } else {
            self.unserved.fetch_add(1, Relaxed);
        }
    }

    /// Remembers the CoAP observer `peer` (up to `bound` of them) and the front's
    /// `observable` that notifies it.
    pub(crate) fn add_peer(&self, peer: SocketAddr, observable: &Observable, bound: usize) {
        let mut slot = self.observable.lock().unwrap_or_else(|p| p.into_inner());
        slot.get_or_insert_with(|| observable.clone());
        drop(slot);
        let mut peers = self.peers.lock().unwrap_or_else(|p| p.into_inner());
        if peers.len() < bound {
            peers.insert(peer);
        } else if !peers.contains(&peer) {
            self.overflow.store(true, Relaxed);
        }
    }

    /// Makes `response` the latest answer and tells every listener.
    pub(crate) fn publish(&self, response: Response) {
        self.latest.send_replace(Some(response));
        let observable = self
            .observable
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        if let Some(observable) = observable {
            if self.overflow.load(Relaxed) {
                observable.changed();
            } else {
                let peers = self.peers.clone();
                observable.changed_for(move |p| {
                    peers.lock().unwrap_or_else(|e| e.into_inner()).contains(&p)
                });
            }
        }
    }

    /// Whether anybody may still listen: an event stream (or a waiting request), or
    /// CoAP observers that were sent one of the last notifications.
    pub(crate) fn listened(&self) -> bool {
        let coap_observers = self
            .observable
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .map_or(0, Observable::observer_count);
        listening(
            self.latest.receiver_count(),
            coap_observers,
            self.unserved.load(Relaxed),
        )
    }
}

/// Whether an observation with `receivers` (event streams, waiting requests),
/// `coap_observers` on the front, and `unserved` notifications in a row that no CoAP
/// observer was sent, is still listened to.
fn listening(receivers: usize, coap_observers: usize, unserved: u32) -> bool {
    receivers > 0 || (coap_observers > 0 && unserved < UNSERVED_LIMIT)
}

/// The upstream observations of one proxy, by cache key.
#[derive(Default)]
pub(crate) struct Observations {
    open: Mutex<HashMap<CacheKey, Arc<Shared>>>,
}

impl Observations {
    pub(crate) fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<CacheKey, Arc<Shared>>> {
        self.open.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Upstream observations open now.
    pub(crate) fn len(&self) -> usize {
        self.lock().len()
    }

    /// Takes `shared` out of the table (if it is still the one under `key`).
    pub(crate) fn remove(&self, key: &CacheKey, shared: &Arc<Shared>) {
        let mut open = self.lock();
        if open.get(key).is_some_and(|s| Arc::ptr_eq(s, shared)) {
            open.remove(key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_latest_answer_reaches_receivers_and_counts_as_listening() {
        let shared = Shared::new();
        assert!(!shared.listened(), "nobody yet");
        let rx = shared.subscribe();
        assert!(shared.listened(), "an event stream listens");
        shared.publish(Response::content("1"));
        assert_eq!(
            rx.borrow().as_ref().map(|r| r.payload.clone()),
            Some(b"1".to_vec())
        );
        drop(rx);
        assert!(!shared.listened());
    }

    #[test]
    fn coap_observers_listen_until_three_notifications_go_unserved() {
        assert!(listening(0, 5, 2));
        assert!(!listening(0, 5, 3));
        assert!(!listening(0, 0, 0), "the front has no observers at all");
        assert!(
            listening(1, 0, 9),
            "an event stream listens whatever CoAP does"
        );
        let shared = Shared::new();
        for expected in 1..=2 {
            shared.count_served();
            assert_eq!(shared.unserved.load(Relaxed), expected);
        }
        assert_eq!(
            shared.latest_for_coap(),
            None,
            "read by a CoAP observer: served"
        );
        shared.count_served();
        assert_eq!(shared.unserved.load(Relaxed), 0);
    }

    #[test]
    fn observers_beyond_the_bound_are_not_remembered_one_by_one() {
        let shared = Shared::new();
        let observable = Observable::new();
        for port in 1..=3 {
            shared.add_peer(SocketAddr::from(([127, 0, 0, 1], port)), &observable, 2);
        }
        assert_eq!(shared.peers.lock().unwrap().len(), 2);
        assert!(
            shared.overflow.load(Relaxed),
            "changes then go to every observer"
        );
    }
}
