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

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};
pub(crate) use tokio::sync::mpsc::error::TrySendError;

/// A queue of at most `bound` items (at least 1): its sending and receiving ends.
pub(crate) fn queue<T>(bound: usize) -> (Sender<T>, Receiver<T>) {
    let shared = Arc::new(Shared {
        bound: bound.max(1),
        state: Mutex::new(State {
            next: None,
            later: VecDeque::new(),
            waker: None,
            sender_alive: true,
            receiver_alive: true,
        }),
    });
    (Sender(shared.clone()), Receiver(shared))
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
    /// The oldest item, if any (boxed: most queues are empty most of the time).
    next: Option<Box<T>>,
    /// The items after it (no allocation while the reader keeps up).
    later: VecDeque<T>,
    /// The receiver waiting for an item.
    waker: Option<Waker>,
    sender_alive: bool,
    receiver_alive: bool,
}

impl<T> State<T> {
    fn len(&self) -> usize {
        usize::from(self.next.is_some()) + self.later.len()
    }

    fn pop(&mut self) -> Option<T> {
        let item = *self.next.take()?;
        self.next = self.later.pop_front().map(Box::new);
        if self.later.is_empty() && self.later.capacity() > 0 {
            self.later = VecDeque::new(); // caught up: give the room back
        }
        Some(item)
    }
}

/// The sending end (one per queue); dropping it ends the queue once it is read.
pub(crate) struct Sender<T>(Arc<Shared<T>>);

impl<T> Sender<T> {
    /// Queues `item`; gives it back when the queue is full or the receiver is gone.
    pub(crate) fn try_send(&self, item: T) -> Result<(), TrySendError<T>> {
        let waker = {
            let mut state = self.0.lock();
            if !state.receiver_alive {
                return Err(TrySendError::Closed(item));
            }
            if state.len() >= self.0.bound {
                return Err(TrySendError::Full(item));
            }
            if state.next.is_none() {
                state.next = Some(Box::new(item));
            } else {
                state.later.push_back(item);
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
            let mut state = self.0.lock();
            state.sender_alive = false;
            state.waker.take()
        };
        if let Some(waker) = waker {
            waker.wake();
        }
    }
}

impl<T> std::fmt::Debug for Sender<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = self.0.lock();
        f.debug_struct("Sender")
            .field("queued", &state.len())
            .field("bound", &self.0.bound)
            .finish()
    }
}

/// The receiving end (one per queue); dropping it refuses further items.
pub(crate) struct Receiver<T>(Arc<Shared<T>>);

impl<T> Receiver<T> {
    /// The next item; `None` once the sender is gone and every item has been read.
    pub(crate) async fn recv(&mut self) -> Option<T> {
        std::future::poll_fn(|cx| self.poll_recv(cx)).await
    }

    /// The next item if one is queued now.
    #[cfg(test)]
    pub(crate) fn try_recv(&mut self) -> Option<T> {
        self.0.lock().pop()
    }

    fn poll_recv(&mut self, cx: &mut Context<'_>) -> Poll<Option<T>> {
        let mut state = self.0.lock();
        if let Some(item) = state.pop() {
            return Poll::Ready(Some(item));
        }
        if !state.sender_alive {
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
            .field("sender_alive", &state.sender_alive)
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
