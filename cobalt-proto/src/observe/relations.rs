//! The observe relations (RFC 7641) a server holds, and the rule that makes some of
//! their notifications confirmable.
//!
//! A relation is keyed by the observer's address and the token it registered with; the
//! table finds one by its key, by its observer's address and by its last notification
//! (an exchange id of the caller's type `I`, and a message ID) in constant time, and
//! gives its memory back as it empties. Notifications go out as NON except every
//! [`ConPolicy::every`]-th, or after [`ConPolicy::interval`] without a CON (RFC 7641
//! §4.5 asks for one at least every 24 hours), so that an observer that went away is
//! found out.
//!
//! The policy is a floor per relation, not the share of confirmable notifications a
//! peer sees. The endpoint's congestion control (CoCoA §5, with every algorithm that
//! estimates an RTO, i.e. all but `default`) counts per peer, as RFC 7641 §4.5.1 asks:
//! NON messages outside exchanges leave to one peer at most once per RTO, up to
//! eight more wait their turn (one per observation, the latest state winning), and
//! the rest go confirmable, so that each is retransmitted with back-off and its
//! observation's next notification waits for the ACK; at least 2 of every 16 such
//! messages to a peer, and the first two to a new peer, are confirmable too. When
//! many observations of one peer change at once most of their notifications are
//! therefore confirmable: 100 of one peer changing together give 91 confirmable
//! notifications of 100 with `observe_con_every` 20. Observations spread over
//! peers, or changes further apart than the RTO, see the policy's share; with
//! `congestion_control = "default"` nothing is paced and the policy alone decides.

use crate::message::{Message, Token};
use crate::settings::{within, Param, Settings};
use crate::tables::shrink_when_sparse;
use std::collections::HashMap;
use std::hash::Hash;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// When notifications are sent confirmable; the allowed values are those of
/// [`ConPolicy::params`]. With the feature `serde` its keys are `observe_con_every`
/// and `observe_con_interval`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize, serde::Deserialize),
    serde(deny_unknown_fields, default)
)]
pub struct ConPolicy {
    /// Every this many notifications of a relation one is confirmable (at least: the
    /// congestion control may make more confirmable, see the [module](self) docs).
    #[cfg_attr(feature = "serde", serde(rename = "observe_con_every"))]
    pub every: u32,
    /// A notification is confirmable when the last confirmable one is this old.
    #[cfg_attr(
        feature = "serde",
        serde(rename = "observe_con_interval", with = "crate::settings::duration")
    )]
    pub interval: Duration,
}

impl Settings for ConPolicy {
    /// Both parameters with what they do and the values allowed.
    fn params(&self) -> Vec<Param> {
        let secs = Duration::from_secs;
        vec![
            Param::new(
                "observe_con_every",
                "Every this many notifications of an observation one is confirmable (RFC 7641 §4.5); at least: the NON pacing per peer (one NON per RTO, CoCoA) sends the notifications it cannot hold confirmable, so many observations of one peer changing at once get mostly confirmable ones.",
                "1 to 1000000",
                (1..=1_000_000).contains(&self.every),
            ),
            Param::new(
                "observe_con_interval",
                "A confirmable notification at least this often.",
                "1s to 30d",
                within(self.interval, secs(1), secs(30 * 86_400)),
            ),
        ]
    }
}

impl Default for ConPolicy {
    /// A CON every 20 notifications, and at least one every 24 hours.
    fn default() -> Self {
        ConPolicy {
            every: 20,
            interval: Duration::from_secs(24 * 3600),
        }
    }
}

/// One observer of one resource.
#[derive(Debug)]
pub struct Relation<I> {
    /// The registering GET; notifications are the GET handler's answers to it. Shared:
    /// a table of many relations keeps one copy of each registration that many
    /// observers sent alike (token and message ID aside).
    pub request: Arc<Message>,
    /// Notifications sent since the last confirmable one.
    pub since_con: u32,
    /// When the last confirmable notification went out (or the relation began).
    pub last_con: Instant,
    /// When the last notification went out.
    pub last_sent: Option<Instant>,
    /// Id and MID of the last notification (to match RST and failures, and to hold
    /// the next one while a confirmable one is unacknowledged).
    pub last: Option<(I, u16)>,
    /// The resource's change (its shard-local version) that the last notification, or
    /// the registration's answer, showed.
    pub version: u64,
    /// The observer is owed the current state: its last confirmable notification is
    /// unacknowledged, or its pacing interval has not passed. `Some(con)`: the next one
    /// must be confirmable when `con`.
    pub owed: Option<bool>,
}

impl<I> Relation<I> {
    /// Whether the next notification must be confirmable: the resource asked for it
    /// (`asked`), the observer is owed a confirmable one, it is an error (which ends
    /// the relation, `success` false), or `policy` says it is time.
    pub fn next_is_confirmable(
        &self,
        policy: &ConPolicy,
        now: Instant,
        asked: bool,
        success: bool,
    ) -> bool {
        asked
            || self.owed.unwrap_or(false)
            || !success
            || self.since_con + 1 >= policy.every
            || now.duration_since(self.last_con) >= policy.interval
    }

    /// Records a notification sent at `now` (`con`: confirmable) showing the
    /// resource's change `version`.
    pub fn sent(&mut self, now: Instant, con: bool, version: u64) {
        self.owed = None;
        self.version = self.version.max(version);
        self.last_sent = Some(now);
        if con {
            self.since_con = 0;
            self.last_con = now;
        } else {
            self.since_con += 1;
        }
    }

    /// A relation registered at `now` by `request`, having seen `version`.
    pub fn new(request: impl Into<Arc<Message>>, now: Instant, version: u64) -> Relation<I> {
        Relation {
            request: request.into(),
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
pub type RelationKey = (SocketAddr, Token);

/// The relations a shard owns, by observable, with the indexes that find one by its
/// key, by its observer's address and by its last notification in constant time. The
/// tables shrink when they empty.
#[derive(Debug)]
pub struct Relations<I> {
    by_resource: HashMap<u64, HashMap<RelationKey, Relation<I>>>,
    /// Which observable each relation belongs to.
    owner: HashMap<RelationKey, u64>,
    /// The tokens of each observer address.
    by_peer: HashMap<SocketAddr, Vec<Token>>,
    /// The relation of each last notification.
    by_exchange: HashMap<I, RelationKey>,
}

impl<I> Default for Relations<I> {
    fn default() -> Self {
        Relations {
            by_resource: HashMap::new(),
            owner: HashMap::new(),
            by_peer: HashMap::new(),
            by_exchange: HashMap::new(),
        }
    }
}

impl<I: Copy + Eq + Hash> Relations<I> {
    /// Adds a relation, or replaces the one with the same key (of whichever
    /// observable); true if it is new.
    pub fn insert(&mut self, observable: u64, key: RelationKey, relation: Relation<I>) -> bool {
        let new = self.remove(&key).is_none();
        self.by_resource
            .entry(observable)
            .or_default()
            .insert(key.clone(), relation);
        self.by_peer.entry(key.0).or_default().push(key.1.clone());
        self.owner.insert(key, observable);
        new
    }

    /// Whether `peer` observes anything here.
    pub fn is_observer(&self, peer: SocketAddr) -> bool {
        self.by_peer.contains_key(&peer)
    }

    /// Whether a relation with this key exists.
    pub fn contains(&self, key: &RelationKey) -> bool {
        self.owner.contains_key(key)
    }

    /// Removes a relation wherever it is; returns its observable and the relation.
    pub fn remove(&mut self, key: &RelationKey) -> Option<(u64, Relation<I>)> {
        // Every plain GET ends its token's relation: with no relation at all, skip
        // hashing the key.
        if self.owner.is_empty() {
            return None;
        }
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

    fn unindex(&mut self, key: &RelationKey, rel: &Relation<I>) {
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
    pub fn get_mut(&mut self, key: &RelationKey) -> Option<(u64, &mut Relation<I>)> {
        let obs = *self.owner.get(key)?;
        let rel = self.by_resource.get_mut(&obs)?.get_mut(key)?;
        Some((obs, rel))
    }

    /// The relation with `key` and its observable.
    pub fn get(&self, key: &RelationKey) -> Option<(u64, &Relation<I>)> {
        let obs = *self.owner.get(key)?;
        Some((obs, self.by_resource.get(&obs)?.get(key)?))
    }

    /// Records the last notification sent on a relation.
    pub fn set_last(&mut self, key: &RelationKey, last: (I, u16)) {
        let Some((_, rel)) = self.get_mut(key) else {
            return;
        };
        let old = rel.last.replace(last);
        if let Some((id, _)) = old {
            self.by_exchange.remove(&id);
        }
        self.by_exchange.insert(last.0, key.clone());
    }

    /// The relation whose last notification was the exchange `id`.
    pub fn by_exchange(&self, id: I) -> Option<RelationKey> {
        self.by_exchange.get(&id).cloned()
    }

    /// The relation of `peer` whose last notification had the message ID `mid`.
    pub fn by_peer_mid(&self, peer: SocketAddr, mid: u16) -> Option<RelationKey> {
        self.by_peer
            .get(&peer)?
            .iter()
            .map(|t| (peer, t.clone()))
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
            .map(|m| m.keys().filter(|k| pick(k)).cloned().collect())
            .unwrap_or_default()
    }

    /// Removes and returns every relation of one observable.
    pub fn take_all(&mut self, observable: u64) -> Vec<(RelationKey, Relation<I>)> {
        let all = self.by_resource.remove(&observable).unwrap_or_default();
        shrink_when_sparse(&mut self.by_resource);
        let all: Vec<(RelationKey, Relation<I>)> = all.into_iter().collect();
        for (key, rel) in &all {
            self.owner.remove(key);
            self.unindex(key, rel);
        }
        shrink_when_sparse(&mut self.owner);
        all
    }

    /// Whether at least one relation of `observable` is held.
    pub fn observes(&self, observable: u64) -> bool {
        self.by_resource.contains_key(&observable)
    }

    /// The observables with at least one relation held.
    pub fn observed(&self) -> Vec<u64> {
        self.by_resource.keys().copied().collect()
    }

    /// Number of relations in this shard.
    pub fn len(&self) -> usize {
        self.owner.len()
    }

    /// Whether no relation is held.
    pub fn is_empty(&self) -> bool {
        self.owner.is_empty()
    }

    /// The capacity of the largest index (for tests of memory coming back).
    pub fn capacity(&self) -> usize {
        self.owner.capacity().max(self.by_peer.capacity())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::{Code, MessageType};

    /// An exchange id, as the caller's endpoint would give.
    type Id = u64;

    fn rel() -> Relation<Id> {
        Relation::new(
            Message::new(MessageType::Confirmable, Code::GET, 1),
            Instant::now(),
            0,
        )
    }

    #[test]
    fn insert_replace_remove_and_find() {
        let mut r = Relations::<Id>::default();
        let key = ("127.0.0.1:1".parse().unwrap(), Token::new(&[1]).unwrap());
        assert!(r.insert(7, key.clone(), rel()));
        assert!(!r.insert(7, key.clone(), rel()), "same token re-registers");
        assert_eq!(r.len(), 1);
        assert!(r.is_observer(key.0));
        let other = (key.0, Token::new(&[2]).unwrap());
        assert!(r.insert(8, other.clone(), rel()));
        r.set_last(&other, (5, 42));
        assert_eq!(r.by_exchange(5), Some(other.clone()));
        assert_eq!(r.by_peer_mid(key.0, 42), Some(other.clone()));
        assert_eq!(r.by_peer_mid(key.0, 43), None);
        assert_eq!(r.remove(&key).map(|(o, _)| o), Some(7));
        assert!(r.remove(&key).is_none());
        assert!(r.is_observer(key.0), "still observes 8");
        assert_eq!(r.keys_of(8, |_| true), [other]);
        assert_eq!(r.take_all(8).len(), 1);
        assert!(!r.is_observer(key.0));
        assert_eq!(r.by_exchange(5), None);
        assert_eq!(r.len(), 0);
        // A token moved to another resource leaves the first.
        assert!(r.insert(7, key.clone(), rel()));
        assert!(!r.insert(8, key.clone(), rel()));
        assert!(r.keys_of(7, |_| true).is_empty());
        assert_eq!(r.get_mut(&key).map(|(o, _)| o), Some(8));
    }

    #[test]
    fn the_tables_give_memory_back_when_they_empty() {
        let mut r = Relations::<Id>::default();
        let keys: Vec<RelationKey> = (0..20_000u32)
            .map(|i| {
                let peer = SocketAddr::from(([10, 0, (i >> 8) as u8, i as u8], 5683));
                (peer, Token::new(&i.to_be_bytes()).unwrap())
            })
            .collect();
        for (i, k) in keys.iter().enumerate() {
            r.insert(1, k.clone(), rel());
            r.set_last(k, (i as u64, 1));
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

    #[test]
    fn every_nth_notification_and_a_daily_one_are_confirmable() {
        let policy = ConPolicy {
            every: 3,
            interval: Duration::from_secs(100),
        };
        let t = Instant::now();
        let mut r = rel();
        let mut kinds = Vec::new();
        for i in 0..7 {
            let con = r.next_is_confirmable(&policy, t, false, true);
            kinds.push(con);
            r.sent(t, con, i);
        }
        assert_eq!(kinds, [false, false, true, false, false, true, false]);
        assert_eq!(r.version, 6);
        let later = t + Duration::from_secs(100);
        assert!(
            r.next_is_confirmable(&policy, later, false, true),
            "interval"
        );
        assert!(r.next_is_confirmable(&policy, t, true, true), "asked");
        assert!(r.next_is_confirmable(&policy, t, false, false), "an error");
        r.owed = Some(true);
        assert!(r.next_is_confirmable(&policy, t, false, true), "owed a CON");
    }
}
