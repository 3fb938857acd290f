//! The client's requests by server and token, as an index into the exchange table:
//! a slot holds only the request's id, and the peer and token it is found by are read
//! from the exchange (which has them anyway). A client observing thousands of
//! servers holds one entry per observation here for as long as it observes; a map
//! with its own copy of the peer and token took 56 bytes a slot instead of 8.
//!
//! Invariant: every id in the index names an exchange of the table it is used with,
//! whose peer and token are those it was inserted with.

use super::ids::{ById, RequestId};
use crate::message::Token;
use crate::tables::KEEP;
use hashbrown::{DefaultHashBuilder, HashTable};
use std::hash::BuildHasher;
use std::net::SocketAddr;

/// An exchange of the table the index points into: to whom, under which token.
pub(super) trait Addressed {
    /// The server.
    fn peer(&self) -> &SocketAddr;
    /// The request's token.
    fn token(&self) -> &Token;
}

/// The exchange table the index points into.
pub(super) type Exchanges<V> = ById<RequestId, V>;

/// See the [module documentation](self).
#[derive(Debug, Default)]
pub(super) struct TokenIndex {
    table: HashTable<RequestId>,
    hasher: DefaultHashBuilder,
}

impl TokenIndex {
    fn hash(&self, peer: &SocketAddr, token: &Token) -> u64 {
        self.hasher.hash_one((peer, token))
    }

    /// The request to `peer` with `token`.
    pub(super) fn get(
        &self,
        exchanges: &Exchanges<impl Addressed>,
        peer: &SocketAddr,
        token: &Token,
    ) -> Option<RequestId> {
        let hash = self.hash(peer, token);
        self.table
            .find(hash, |id| {
                exchanges
                    .get(id)
                    .is_some_and(|ex| ex.peer() == peer && ex.token() == token)
            })
            .copied()
    }

    /// Whether a request to `peer` uses `token`.
    pub(super) fn contains(
        &self,
        exchanges: &Exchanges<impl Addressed>,
        peer: &SocketAddr,
        token: &Token,
    ) -> bool {
        self.get(exchanges, peer, token).is_some()
    }

    /// Indexes `id`, which `exchanges` holds already (with its peer and token).
    pub(super) fn insert(&mut self, exchanges: &Exchanges<impl Addressed>, id: RequestId) {
        let Some(ex) = exchanges.get(&id) else {
            return;
        };
        let hash = self.hash(ex.peer(), ex.token());
        let hasher = &self.hasher;
        self.table.insert_unique(hash, id, |other| {
            exchanges
                .get(other)
                .map_or(0, |ex| hasher.hash_one((ex.peer(), ex.token())))
        });
    }

    /// Forgets `id`, a request to `peer` with `token`.
    pub(super) fn remove(&mut self, id: RequestId, peer: &SocketAddr, token: &Token) {
        let hash = self.hash(peer, token);
        if let Ok(entry) = self.table.find_entry(hash, |other| *other == id) {
            entry.remove();
        }
    }

    /// Requests indexed.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.table.len()
    }

    /// Slots it can hold without growing.
    #[cfg(test)]
    pub(super) fn capacity(&self) -> usize {
        self.table.capacity()
    }

    /// Gives memory back once the index is sparse (see [`crate::tables`]).
    pub(super) fn shrink_when_sparse(&mut self, exchanges: &Exchanges<impl Addressed>) {
        let cap = self.table.capacity();
        if cap > KEEP && self.table.len() * 4 < cap {
            let hasher = &self.hasher;
            self.table
                .shrink_to((self.table.len() * 2).max(KEEP / 2), |id| {
                    exchanges
                        .get(id)
                        .map_or(0, |ex| hasher.hash_one((ex.peer(), ex.token())))
                });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Exchange {
        peer: SocketAddr,
        token: Token,
    }

    impl Addressed for Exchange {
        fn peer(&self) -> &SocketAddr {
            &self.peer
        }
        fn token(&self) -> &Token {
            &self.token
        }
    }

    fn exchange(peer: SocketAddr, token: u16) -> Exchange {
        Exchange {
            peer,
            token: Token::new(&token.to_be_bytes()).unwrap(),
        }
    }

    /// Found by peer and token through growth and removals, and small: an id a slot.
    #[test]
    fn requests_are_found_by_peer_and_token_through_growth_and_removal() {
        let (a, b): (SocketAddr, SocketAddr) = (
            "127.0.0.1:1".parse().unwrap(),
            "127.0.0.2:1".parse().unwrap(),
        );
        let mut exchanges = Exchanges::default();
        let mut index = TokenIndex::default();
        for i in 0..1000u16 {
            for (n, peer) in [(0u64, a), (1, b)] {
                let id = RequestId(u64::from(i) * 2 + n);
                exchanges.insert(id, exchange(peer, i));
                index.insert(&exchanges, id);
            }
        }
        assert_eq!(index.len(), 2000);
        let t = |i: u16| Token::new(&i.to_be_bytes()).unwrap();
        assert_eq!(index.get(&exchanges, &a, &t(7)), Some(RequestId(14)));
        assert_eq!(index.get(&exchanges, &b, &t(7)), Some(RequestId(15)));
        assert_eq!(index.get(&exchanges, &a, &t(1000)), None);
        for i in 0..1980u64 {
            let ex = exchanges.remove(&RequestId(i)).unwrap();
            index.remove(RequestId(i), &ex.peer, &ex.token);
        }
        index.shrink_when_sparse(&exchanges);
        assert!(index.capacity() < 2000, "{}", index.capacity());
        assert!(!index.contains(&exchanges, &a, &t(7)));
        assert_eq!(index.get(&exchanges, &a, &t(995)), Some(RequestId(1990)));
        assert_eq!(index.get(&exchanges, &b, &t(995)), Some(RequestId(1991)));
        assert_eq!(std::mem::size_of::<RequestId>(), 8);
    }
}
