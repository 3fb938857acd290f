//! The observe relations (RFC 7641 over RFC 8323 §7) of one CoAP-over-TCP or
//! -WebSocket connection.
//!
//! Over a reliable transport a relation is identified by its token alone, and it lives
//! no longer than its connection: [`StreamRelations`] is owned by the connection's
//! task, and dropping it (the connection closed, or its task ended in any other way)
//! removes every relation from the resources' observer counts and unsubscribes the
//! connection's inbox, so nothing is left behind.

use super::budget::{ObserverBudget, Refusal};
use super::limits::ServerLimits;
use super::observe::Observable;
use crate::changes::ChangeInbox;
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
    /// The server's relations per address and in total.
    budget: Arc<ObserverBudget>,
}

impl StreamRelations {
    /// No relations yet, for a connection with `peer`; `gauge` counts the relations of
    /// every connection of the listener, `budget` those of the server.
    pub(crate) fn new(
        peer: SocketAddr,
        gauge: Arc<AtomicU64>,
        budget: Arc<ObserverBudget>,
    ) -> StreamRelations {
        StreamRelations {
            conn: NEXT_CONNECTION.fetch_add(1, Ordering::Relaxed),
            peer,
            inbox: Arc::new(ChangeInbox::default()),
            by_token: HashMap::new(),
            gauge,
            budget,
        }
    }

    /// Where the observed resources post their changes.
    pub(crate) fn inbox(&self) -> Arc<ChangeInbox> {
        self.inbox.clone()
    }

    /// Registers `token` as an observer of `observable`, replacing a relation with the
    /// same token, unless the peer's address holds `max_observers_per_ip` relations
    /// already (4.29) or the server is near `max_observers` and the address holds at
    /// least what is left (5.03).
    pub(crate) fn register(
        &mut self,
        observable: &Observable,
        token: Token,
        request: Message,
        limits: &ServerLimits,
    ) -> Result<(), Refusal> {
        self.end(&token);
        self.budget.admit(
            self.peer.ip(),
            limits.max_observers_per_ip,
            limits.max_observers,
        )?;
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
        Ok(())
    }

    /// Ends the relation with `token`, if any; true if there was one.
    pub(crate) fn end(&mut self, token: &Token) -> bool {
        let Some(rel) = self.by_token.remove(token) else {
            return false;
        };
        cobalt_proto::tables::shrink_when_sparse(&mut self.by_token);
        rel.observable.observer_removed();
        self.gauge.fetch_sub(1, Ordering::Relaxed);
        self.budget.release(self.peer.ip());
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
            self.budget.release(self.peer.ip());
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

    fn limits(per_ip: usize, total: usize) -> ServerLimits {
        ServerLimits {
            max_observers_per_ip: per_ip,
            max_observers: total,
            ..ServerLimits::default()
        }
    }

    fn relations(
        peer: &str,
        gauge: &Arc<AtomicU64>,
        budget: &Arc<ObserverBudget>,
    ) -> StreamRelations {
        StreamRelations::new(peer.parse().unwrap(), gauge.clone(), budget.clone())
    }

    #[test]
    fn counts_and_subscriptions_follow_the_relations() {
        let (a, b) = (Observable::new(), Observable::new());
        let gauge = Arc::new(AtomicU64::new(0));
        let budget = Arc::new(ObserverBudget::default());
        let l = limits(10, 100);
        let mut rels = relations("127.0.0.1:9", &gauge, &budget);
        assert!(rels.register(&a, token(1), get(), &l).is_ok());
        assert!(rels.register(&a, token(2), get(), &l).is_ok());
        assert!(rels.register(&b, token(3), get(), &l).is_ok());
        assert!(
            rels.register(&a, token(2), get(), &l).is_ok(),
            "same token replaces"
        );
        assert_eq!((a.observer_count(), b.observer_count()), (2, 1));
        assert_eq!(gauge.load(Ordering::Relaxed), 3);
        assert_eq!(budget.total(), 3);
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
        assert_eq!(budget.total(), 0, "the budget is given back");
    }

    #[test]
    fn one_address_is_bounded_and_others_are_served() {
        let a = Observable::new();
        let gauge = Arc::new(AtomicU64::new(0));
        let budget = Arc::new(ObserverBudget::default());
        let l = limits(2, 100);
        // Two connections from one address share its budget.
        let mut one = relations("192.0.2.1:9", &gauge, &budget);
        let mut two = relations("192.0.2.1:10", &gauge, &budget);
        assert!(one.register(&a, token(1), get(), &l).is_ok());
        assert!(two.register(&a, token(1), get(), &l).is_ok());
        assert_eq!(
            two.register(&a, token(2), get(), &l),
            Err(Refusal::PeerBudget)
        );
        assert_eq!((a.observer_count(), two.len()), (2, 1));
        // Another address is served.
        let mut other = relations("192.0.2.2:9", &gauge, &budget);
        assert!(other.register(&a, token(1), get(), &l).is_ok());
        // Near the server-wide bound the heavy address is refused first.
        let tight = limits(10, 6);
        assert_eq!(
            one.register(&a, token(3), get(), &tight),
            Err(Refusal::ServerBound)
        );
        assert!(other.register(&a, token(2), get(), &tight).is_ok());
        drop(one);
        assert!(two.register(&a, token(2), get(), &l).is_ok());
    }
}
