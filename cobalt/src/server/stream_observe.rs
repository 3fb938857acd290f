//! The observe relations (RFC 7641 over RFC 8323 §7) of one CoAP-over-TCP or
//! -WebSocket connection.
//!
//! Over a reliable transport a relation is identified by its token alone, and it lives
//! no longer than its connection: [`StreamRelations`] is owned by the connection's
//! task, and dropping it (the connection closed, or its task ended in any other way)
//! removes every relation from the resources' observer counts and unsubscribes the
//! connection's inbox, so nothing is left behind.

use super::observe::{ChangeInbox, Observable};
use cobalt_proto::message::{Message, Token};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

static NEXT_CONNECTION: AtomicU64 = AtomicU64::new(1);

/// One observer on this connection.
#[derive(Debug)]
struct StreamRelation {
    observable: Observable,
    /// The registering GET; notifications are the GET handler's answers to it.
    request: Message,
}

/// The relations of one connection, by token.
#[derive(Debug)]
pub(crate) struct StreamRelations {
    conn: u64,
    peer: SocketAddr,
    inbox: Arc<ChangeInbox>,
    by_token: HashMap<Token, StreamRelation>,
    /// The listener's count of relations, kept equal to the sum of `by_token`'s.
    gauge: Arc<AtomicU64>,
}

impl StreamRelations {
    /// No relations yet, for a connection with `peer`; `gauge` counts the relations of
    /// every connection of the listener.
    pub(crate) fn new(peer: SocketAddr, gauge: Arc<AtomicU64>) -> StreamRelations {
        StreamRelations {
            conn: NEXT_CONNECTION.fetch_add(1, Ordering::Relaxed),
            peer,
            inbox: Arc::new(ChangeInbox::default()),
            by_token: HashMap::new(),
            gauge,
        }
    }

    /// Where the observed resources post their changes.
    pub(crate) fn inbox(&self) -> Arc<ChangeInbox> {
        self.inbox.clone()
    }

    /// Registers `token` as an observer of `observable` unless the resource already
    /// has `max_observers` (then the GET is answered without Observe, RFC 7641 §4.1).
    /// A relation with the same token is replaced.
    pub(crate) fn register(
        &mut self,
        observable: &Observable,
        token: Token,
        request: Message,
        max_observers: usize,
    ) -> bool {
        self.end(&token);
        if observable.observer_count() >= max_observers {
            return false;
        }
        if !self.observes(observable.id()) {
            observable.subscribe(self.conn, self.peer, self.inbox.clone());
        }
        observable.observer_added();
        self.gauge.fetch_add(1, Ordering::Relaxed);
        self.by_token.insert(
            token,
            StreamRelation {
                observable: observable.clone(),
                request,
            },
        );
        true
    }

    /// Ends the relation with `token`, if any; true if there was one.
    pub(crate) fn end(&mut self, token: &Token) -> bool {
        let Some(rel) = self.by_token.remove(token) else {
            return false;
        };
        rel.observable.observer_removed();
        self.gauge.fetch_sub(1, Ordering::Relaxed);
        if !self.observes(rel.observable.id()) {
            rel.observable.unsubscribe(self.conn);
        }
        true
    }

    /// The observable of the relation with `token`, if it is (still) one of
    /// `observable`'s: a notification computed for a relation that has ended or been
    /// replaced meanwhile is not sent.
    pub(crate) fn get(&self, token: &Token, observable: u64) -> Option<&Observable> {
        self.by_token
            .get(token)
            .map(|r| &r.observable)
            .filter(|o| o.id() == observable)
    }

    /// The registering request of the relation with `token`, if it is one of
    /// `observable`'s.
    pub(crate) fn request(&self, token: &Token, observable: u64) -> Option<&Message> {
        self.by_token
            .get(token)
            .filter(|r| r.observable.id() == observable)
            .map(|r| &r.request)
    }

    /// The tokens and registering requests of `observable`'s relations here.
    pub(crate) fn of(&self, observable: u64) -> Vec<(Token, Message)> {
        self.by_token
            .iter()
            .filter(|(_, r)| r.observable.id() == observable)
            .map(|(t, r)| (*t, r.request.clone()))
            .collect()
    }

    /// Number of relations on this connection.
    pub(crate) fn len(&self) -> usize {
        self.by_token.len()
    }

    fn observes(&self, observable: u64) -> bool {
        self.by_token
            .values()
            .any(|r| r.observable.id() == observable)
    }
}

impl Drop for StreamRelations {
    fn drop(&mut self) {
        for (_, rel) in self.by_token.drain() {
            rel.observable.observer_removed();
            self.gauge.fetch_sub(1, Ordering::Relaxed);
            rel.observable.unsubscribe(self.conn);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cobalt_proto::message::{Code, MessageType};

    fn token(b: u8) -> Token {
        Token::new(&[b]).unwrap()
    }

    fn get() -> Message {
        Message::new(MessageType::Confirmable, Code::GET, 0)
    }

    #[test]
    fn counts_and_subscriptions_follow_the_relations() {
        let (a, b) = (Observable::new(), Observable::new());
        let gauge = Arc::new(AtomicU64::new(0));
        let mut rels = StreamRelations::new("127.0.0.1:9".parse().unwrap(), gauge.clone());
        assert!(rels.register(&a, token(1), get(), 10));
        assert!(rels.register(&a, token(2), get(), 10));
        assert!(rels.register(&b, token(3), get(), 10));
        assert!(
            rels.register(&a, token(2), get(), 10),
            "same token replaces"
        );
        assert_eq!((a.observer_count(), b.observer_count()), (2, 1));
        assert_eq!(gauge.load(Ordering::Relaxed), 3);
        assert_eq!((a.subscribers(), b.subscribers()), (1, 1));
        assert_eq!(rels.of(a.id()).len(), 2);
        assert!(rels.get(&token(3), b.id()).is_some());
        assert!(rels.get(&token(3), a.id()).is_none());
        assert!(rels.end(&token(1)));
        assert!(!rels.end(&token(1)));
        assert_eq!(a.subscribers(), 1, "token 2 still observes a");
        assert!(rels.end(&token(2)));
        assert_eq!((a.observer_count(), a.subscribers()), (0, 0));
        assert_eq!(gauge.load(Ordering::Relaxed), 1);
        drop(rels);
        assert_eq!((b.observer_count(), b.subscribers()), (0, 0));
        assert_eq!(gauge.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn max_observers_is_respected() {
        let a = Observable::new();
        let gauge = Arc::new(AtomicU64::new(0));
        let mut one = StreamRelations::new("127.0.0.1:9".parse().unwrap(), gauge.clone());
        let mut two = StreamRelations::new("127.0.0.1:10".parse().unwrap(), gauge);
        assert!(one.register(&a, token(1), get(), 1));
        assert!(!two.register(&a, token(1), get(), 1));
        assert_eq!((a.observer_count(), a.subscribers(), two.len()), (1, 1, 0));
        drop(one);
        assert!(two.register(&a, token(1), get(), 1));
    }
}
