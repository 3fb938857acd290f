//! The queue an observation's notifications wait in, between the transport that
//! receives them (one sender: the exchange table) and the observation that reads
//! them (one receiver). Bounded: a notification that finds it full is refused (the
//! next one brings the current state, RFC 7641 §1.3).
//!
//! Sized for many idle observations: tokio's `mpsc` channel allocates a block of 32
//! slots (some 4 KB of messages) when it is made, whatever its bound; this queue
//! allocates room for a notification only while one waits (the first in a box of its
//! own: an idle observation, which is what a client of many servers holds most of,
//! keeps no room for a message), for more only while its reader lags, and gives that
//! room back once it has caught up.
//!
//! One queue may also serve many observations ([`Receiver::sender`]): each sender
//! tags what it queues, so that one reader (a client's
//! [`ObservationSet`](crate::client::ObservationSet)) tells them apart without a
//! queue, a task or a waker per observation. The bound is then shared.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};
pub(crate) use tokio::sync::mpsc::error::TrySendError;

/// A queue of at most `bound` items (at least 1): its sending and receiving ends
/// (the sender's items are tagged 0).
pub(crate) fn queue<T>(bound: usize) -> (Sender<T>, Receiver<T>) {
    let shared = Arc::new(Shared {
        bound: bound.max(1),
        state: Mutex::new(State {
            next: None,
            later: VecDeque::new(),
            waker: None,
            senders: 1,
            receiver_alive: true,
        }),
    });
    (
        Sender {
            shared: shared.clone(),
            tag: 0,
        },
        Receiver(shared),
    )
}

struct Shared<T> {
    bound: usize,
    state: Mutex<State<T>>,
}

impl<T> Shared<T> {
    fn lock(&self) -> MutexGuard<'_, State<T>> {
        // Nothing panics while holding the lock; a poisoned one holds consistent data.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

struct State<T> {
    /// The oldest item and its sender's tag, if any (boxed: most queues are empty
    /// most of the time).
    next: Option<Box<(u64, T)>>,
    /// The items after it (no allocation while the reader keeps up).
    later: VecDeque<(u64, T)>,
    /// The receiver waiting for an item.
    waker: Option<Waker>,
    /// Senders alive: the queue ends when the last one is gone.
    senders: u32,
    receiver_alive: bool,
}

impl<T> State<T> {
    fn len(&self) -> usize {
        usize::from(self.next.is_some()) + self.later.len()
    }

    fn pop(&mut self) -> Option<(u64, T)> {
        let item = *self.next.take()?;
        self.next = self.later.pop_front().map(Box::new);
        if self.later.is_empty() && self.later.capacity() > 0 {
            self.later = VecDeque::new(); // caught up: give the room back
        }
        Some(item)
    }
}

/// A sending end; the queue ends once the last one is gone and every item is read.
pub(crate) struct Sender<T> {
    shared: Arc<Shared<T>>,
    /// Given to the receiver with each item of this sender.
    tag: u64,
}

impl<T> Sender<T> {
    /// Queues `item`; gives it back when the queue is full or the receiver is gone.
    pub(crate) fn try_send(&self, item: T) -> Result<(), TrySendError<T>> {
        let waker = {
            let mut state = self.shared.lock();
            if !state.receiver_alive {
                return Err(TrySendError::Closed(item));
            }
            if state.len() >= self.shared.bound {
                return Err(TrySendError::Full(item));
            }
            if state.next.is_none() {
                state.next = Some(Box::new((self.tag, item)));
            } else {
                state.later.push_back((self.tag, item));
            }
            state.waker.take()
        };
        if let Some(waker) = waker {
            waker.wake();
        }
        Ok(())
    }
}

impl<T> Drop for Sender<T> {
    fn drop(&mut self) {
        let waker = {
            let mut state = self.shared.lock();
            state.senders -= 1;
            if state.senders > 0 {
                return;
            }
            state.waker.take()
        };
        if let Some(waker) = waker {
            waker.wake();
        }
    }
}

impl<T> std::fmt::Debug for Sender<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = self.shared.lock();
        f.debug_struct("Sender")
            .field("tag", &self.tag)
            .field("queued", &state.len())
            .field("bound", &self.shared.bound)
            .finish()
    }
}

/// The receiving end (one per queue); dropping it refuses further items.
pub(crate) struct Receiver<T>(Arc<Shared<T>>);

impl<T> Receiver<T> {
    /// Another sending end of this queue, whose items come tagged `tag`.
    pub(crate) fn sender(&self, tag: u64) -> Sender<T> {
        self.0.lock().senders += 1;
        Sender {
            shared: self.0.clone(),
            tag,
        }
    }

    /// The next item; `None` once every sender is gone and every item has been read.
    pub(crate) async fn recv(&mut self) -> Option<T> {
        std::future::poll_fn(|cx| self.poll_recv_tagged(cx).map(|o| o.map(|(_, item)| item))).await
    }

    /// The next item if one is queued now.
    #[cfg(test)]
    pub(crate) fn try_recv(&mut self) -> Option<T> {
        self.0.lock().pop().map(|(_, item)| item)
    }

    /// The next item with its sender's tag; `None` once every sender is gone and
    /// every item has been read.
    pub(crate) fn poll_recv_tagged(&mut self, cx: &mut Context<'_>) -> Poll<Option<(u64, T)>> {
        let mut state = self.0.lock();
        if let Some(item) = state.pop() {
            return Poll::Ready(Some(item));
        }
        if state.senders == 0 {
            return Poll::Ready(None);
        }
        match &mut state.waker {
            Some(waker) if waker.will_wake(cx.waker()) => {}
            slot => *slot = Some(cx.waker().clone()),
        }
        Poll::Pending
    }
}

impl<T> Drop for Receiver<T> {
    fn drop(&mut self) {
        let (next, later) = {
            let mut state = self.0.lock();
            state.receiver_alive = false;
            state.waker = None;
            (state.next.take(), std::mem::take(&mut state.later))
        };
        drop((next, later)); // outside the lock
    }
}

impl<T> std::fmt::Debug for Receiver<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = self.0.lock();
        f.debug_struct("Receiver")
            .field("queued", &state.len())
            .field("senders", &state.senders)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn items_arrive_in_order_up_to_the_bound() {
        let (tx, mut rx) = queue::<u32>(3);
        for i in 0..3 {
            tx.try_send(i).unwrap();
        }
        assert!(matches!(tx.try_send(3), Err(TrySendError::Full(3))));
        assert_eq!(rx.recv().await, Some(0));
        tx.try_send(4).unwrap();
        for want in [1, 2, 4] {
            assert_eq!(rx.recv().await, Some(want));
        }
        drop(tx);
        assert_eq!(rx.recv().await, None, "the sender is gone and all was read");
    }

    #[tokio::test]
    async fn a_caught_up_reader_leaves_no_room_allocated() {
        let (tx, mut rx) = queue::<u32>(64);
        tx.try_send(1).unwrap();
        assert_eq!(rx.0.lock().later.capacity(), 0, "one item stays in place");
        for i in 2..10 {
            tx.try_send(i).unwrap();
        }
        assert!(rx.0.lock().later.capacity() >= 8);
        for want in 1..10 {
            assert_eq!(rx.recv().await, Some(want));
        }
        assert_eq!(rx.0.lock().later.capacity(), 0);
    }

    /// A client observing 10,000 servers holds 10,000 queues, nearly all empty: an
    /// empty one keeps no room for an item (a notification is some 130 bytes).
    #[test]
    fn an_empty_queue_holds_no_room_for_an_item() {
        assert!(std::mem::size_of::<State<[u8; 256]>>() <= 64);
        let (tx, mut rx) = queue::<[u8; 256]>(4);
        tx.try_send([7; 256]).unwrap();
        assert_eq!(rx.try_recv(), Some([7; 256]));
        assert!(rx.0.lock().next.is_none());
    }

    #[tokio::test]
    async fn a_waiting_reader_is_woken_by_an_item_and_by_the_end() {
        let (tx, mut rx) = queue::<u32>(1);
        let reading = tokio::spawn(async move {
            let first = rx.recv().await;
            let end = rx.recv().await;
            (first, end)
        });
        tokio::task::yield_now().await;
        tx.try_send(7).unwrap();
        tokio::task::yield_now().await;
        drop(tx);
        assert_eq!(reading.await.unwrap(), (Some(7), None));
    }

    #[tokio::test]
    async fn tagged_senders_share_the_queue_and_its_end() {
        let (first, mut rx) = queue::<u32>(3);
        let second = rx.sender(7);
        first.try_send(1).unwrap();
        second.try_send(2).unwrap();
        second.try_send(3).unwrap();
        assert!(
            matches!(first.try_send(4), Err(TrySendError::Full(4))),
            "the bound is shared"
        );
        let mut got = Vec::new();
        for _ in 0..3 {
            got.push(std::future::poll_fn(|cx| rx.poll_recv_tagged(cx)).await);
        }
        assert_eq!(got, [Some((0, 1)), Some((7, 2)), Some((7, 3))]);
        drop(first);
        second.try_send(5).unwrap();
        assert_eq!(rx.recv().await, Some(5), "one sender left keeps it open");
        drop(second);
        assert_eq!(rx.recv().await, None);
    }

    #[test]
    fn a_gone_receiver_refuses_items_and_drops_what_waited() {
        let (tx, rx) = queue::<Arc<()>>(2);
        let item = Arc::new(());
        tx.try_send(item.clone()).unwrap();
        drop(rx);
        assert_eq!(Arc::strong_count(&item), 1, "the queued item was dropped");
        assert!(matches!(tx.try_send(item), Err(TrySendError::Closed(_))));
    }
}
