//! Changes of observable resources on their way to the consumers that notify
//! observers: a UDP shard, or a CoAP over TCP / WebSocket connection. An observable
//! resource posts into every consumer's [`ChangeInbox`]; the consumer's driver wakes up
//! and takes what is pending. This is the small surface between the resource side
//! (`server::observe`) and the drivers (`runtime`): neither imports the other for it.

use cobalt_proto::message::Code;
use futures_util::task::AtomicWaker;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

/// Chooses which observers a notification goes to.
pub type ObserverFilter = Arc<dyn Fn(SocketAddr) -> bool + Send + Sync>;

/// Different filters kept for one pending change; beyond it every observer is
/// notified (a notification shows the current state, so an extra one is harmless).
pub(crate) const MAX_FILTERS: usize = 16;

/// How every relation of a resource ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ending {
    /// Each observer gets a last, confirmable notification with this code (an error:
    /// RFC 7641 §4.2 ends a relation with a notification that is not 2.xx).
    With(Code),
    /// Nothing is sent: the observers notice when the last notification's Max-Age
    /// runs out, as after a reboot of the server.
    Silently,
}

/// The changes of one resource not yet taken by a consumer, merged.
#[derive(Clone, Default)]
pub(crate) struct PendingChange {
    /// Observers to notify: those any of these filters accepts; `None`: all.
    pub filters: Option<Vec<ObserverFilter>>,
    /// Send as CON even if the policy would send NON.
    pub confirmable: bool,
    /// Every relation ends (after the notifications of changes before it were
    /// superseded: a notification shows the current state).
    pub ending: Option<Ending>,
}

impl std::fmt::Debug for PendingChange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PendingChange")
            .field("filters", &self.filters.as_ref().map(Vec::len))
            .field("confirmable", &self.confirmable)
            .field("ending", &self.ending)
            .finish()
    }
}

impl PendingChange {
    /// Adds a later change: the first ending and CON stick, filters add up.
    pub fn merge(&mut self, later: PendingChange) {
        self.ending = self.ending.or(later.ending);
        self.confirmable |= later.confirmable;
        self.filters = match (self.filters.take(), later.filters) {
            (Some(mut mine), Some(theirs)) => {
                for f in theirs {
                    if !mine.iter().any(|m| Arc::ptr_eq(m, &f)) {
                        mine.push(f);
                    }
                }
                (mine.len() <= MAX_FILTERS).then_some(mine)
            }
            _ => None,
        };
    }

    /// Whether the observer at `peer` is to be notified.
    pub fn selects(&self, peer: SocketAddr) -> bool {
        self.filters
            .as_ref()
            .is_none_or(|fs| fs.iter().any(|f| f(peer)))
    }
}

/// Changes waiting for one consumer (a UDP shard, or a `coap+tcp` / `coap+ws`
/// connection), merged per observable. Bounded by the number of observable resources.
#[derive(Debug, Default)]
pub(crate) struct ChangeInbox {
    pending: Mutex<HashMap<u64, PendingChange>>,
    /// Whether a change was posted since [`ChangeInbox::changed`] last resolved.
    posted: AtomicBool,
    /// The consumer's task while it waits. Each inbox has one consumer (a shard's
    /// driver, or a connection's task), which registers it before every wait: with one
    /// consumer an atomic waker does what a `Notify` would, without a notified future
    /// (and its waiter list's lock) made and dropped for each wait.
    waker: AtomicWaker,
}

impl ChangeInbox {
    /// Records a change of `observable` (merged with one not yet taken) and wakes the
    /// consumer.
    pub(crate) fn post(&self, observable: u64, change: PendingChange) {
        let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        match pending.entry(observable) {
            std::collections::hash_map::Entry::Occupied(mut e) => e.get_mut().merge(change),
            std::collections::hash_map::Entry::Vacant(e) => {
                e.insert(change);
            }
        }
        drop(pending);
        self.posted.store(true, Ordering::Release);
        self.waker.wake();
    }

    /// Takes the pending changes.
    pub(crate) fn take(&self) -> Vec<(u64, PendingChange)> {
        let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        pending.drain().collect()
    }

    /// Resolves when a change has been posted since the last call resolved (for its
    /// one consumer).
    pub(crate) async fn changed(&self) {
        std::future::poll_fn(|cx| self.poll_changed(cx)).await
    }

    /// Ready when a change has been posted since this was last ready; otherwise wakes
    /// the task of `cx` at the next post.
    fn poll_changed(&self, cx: &mut Context<'_>) -> Poll<()> {
        if self.posted.swap(false, Ordering::AcqRel) {
            return Poll::Ready(());
        }
        self.waker.register(cx.waker());
        // A post between the check and the registration woke nobody: look again.
        if self.posted.swap(false, Ordering::AcqRel) {
            return Poll::Ready(());
        }
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::task::{Wake, Waker};

    /// Counts its wakes.
    #[derive(Default)]
    struct Wakes(AtomicUsize);

    impl Wake for Wakes {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn a_post_is_seen_once_and_wakes_a_waiting_consumer() {
        let inbox = ChangeInbox::default();
        let wakes = Arc::new(Wakes::default());
        let waker = Waker::from(wakes.clone());
        let mut cx = Context::from_waker(&waker);
        assert!(inbox.poll_changed(&mut cx).is_pending(), "nothing posted");
        inbox.post(7, PendingChange::default());
        assert_eq!(
            wakes.0.load(Ordering::SeqCst),
            1,
            "the waiting consumer woken"
        );
        assert!(inbox.poll_changed(&mut cx).is_ready());
        assert!(inbox.poll_changed(&mut cx).is_pending(), "seen once");
        // Posts while the consumer is busy are seen at its next wait, as one.
        inbox.post(7, PendingChange::default());
        inbox.post(8, PendingChange::default());
        assert!(inbox.poll_changed(&mut cx).is_ready());
        assert!(inbox.poll_changed(&mut cx).is_pending());
        assert_eq!(inbox.take().len(), 2);
    }
}
