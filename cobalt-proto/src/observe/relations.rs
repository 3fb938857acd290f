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
use crate::tables::{shrink_when_sparse, ChunkedVec};
use hashbrown::{DefaultHashBuilder, HashMap, HashTable};
use std::hash::{BuildHasher, Hash};
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

/// No slot (the end of an observer's list).
const NIL: u32 = u32::MAX;

/// Slots per chunk of the table's storage (about 150 KB each).
const SLOTS_PER_CHUNK: usize = 1024;

/// A relation where the table keeps it, with its links into the indexes.
#[derive(Debug)]
struct Slot<I> {
    key: RelationKey,
    observable: u64,
    /// Its place in its observable's list.
    pos: u32,
    /// Its neighbours in its observer's list.
    prev: u32,
    next: u32,
    relation: Relation<I>,
}

/// The relations a shard owns, by observable, with the indexes that find one by its
/// key, by its observer's address and by its last notification in constant time. The
/// tables shrink when they empty.
///
/// The relations lie in one dense vector, in chunks (so that it grows without
/// copying); the indexes hold their positions (4 bytes each) rather than copies of
/// their keys, so that a relation takes about 165 bytes: its slot (key, relation,
/// links, 152 bytes) and a few bytes of index.
pub struct Relations<I> {
    slots: ChunkedVec<Slot<I>, SLOTS_PER_CHUNK>,
    /// Slots by key.
    by_key: HashTable<u32>,
    /// Slots by the exchange id of their last notification.
    by_exchange: HashTable<u32>,
    /// The slots of each observable.
    by_resource: HashMap<u64, Vec<u32>>,
    /// The first slot of each observer address (the rest are linked through the slots).
    by_peer: HashMap<SocketAddr, u32>,
    hasher: DefaultHashBuilder,
}

impl<I: std::fmt::Debug> std::fmt::Debug for Relations<I> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Relations")
            .field("len", &self.slots.len())
            .field("observables", &self.by_resource.len())
            .field("observers", &self.by_peer.len())
            .finish()
    }
}

impl<I> Default for Relations<I> {
    fn default() -> Self {
        Relations {
            slots: ChunkedVec::default(),
            by_key: HashTable::new(),
            by_exchange: HashTable::new(),
            by_resource: HashMap::new(),
            by_peer: HashMap::new(),
            hasher: DefaultHashBuilder::default(),
        }
    }
}

/// The hash of the slot at `i` in the key index.
fn by_key_hash<'a, I>(
    slots: &'a ChunkedVec<Slot<I>, SLOTS_PER_CHUNK>,
    hasher: &'a DefaultHashBuilder,
) -> impl Fn(&u32) -> u64 + 'a {
    move |&i| hasher.hash_one(&slots[i as usize].key)
}

/// The hash of the slot at `i` in the exchange index (by its last notification's id).
fn by_exchange_hash<'a, I: Hash>(
    slots: &'a ChunkedVec<Slot<I>, SLOTS_PER_CHUNK>,
    hasher: &'a DefaultHashBuilder,
) -> impl Fn(&u32) -> u64 + 'a {
    move |&i| {
        slots[i as usize]
            .relation
            .last
            .as_ref()
            .map_or(0, |(id, _)| hasher.hash_one(id))
    }
}

/// Shrinks an index of slots the way [`shrink_when_sparse`] shrinks a map.
fn shrink_index(index: &mut HashTable<u32>, hash: impl Fn(&u32) -> u64) {
    let cap = index.capacity();
    if cap > 64 && index.len() * 4 < cap {
        index.shrink_to((index.len() * 2).max(32), hash);
    }
}

impl<I: Copy + Eq + Hash> Relations<I> {
    fn hash_key(&self, key: &RelationKey) -> u64 {
        self.hasher.hash_one(key)
    }

    fn hash_id(&self, id: &I) -> u64 {
        self.hasher.hash_one(id)
    }

    fn slot_of(&self, key: &RelationKey) -> Option<u32> {
        if self.slots.is_empty() {
            return None;
        }
        let slots = &self.slots;
        self.by_key
            .find(self.hash_key(key), |&i| slots[i as usize].key == *key)
            .copied()
    }

    /// Adds a relation, or replaces the one with the same key (of whichever
    /// observable); true if it is new.
    pub fn insert(&mut self, observable: u64, key: RelationKey, relation: Relation<I>) -> bool {
        let new = self.remove(&key).is_none();
        let Ok(at) = u32::try_from(self.slots.len()) else {
            // More relations than positions: the caller's bounds keep far below this.
            return false;
        };
        let list = self.by_resource.entry(observable).or_default();
        let pos = list.len() as u32;
        list.push(at);
        let next = self.by_peer.insert(key.0, at).unwrap_or(NIL);
        if next != NIL {
            self.slots[next as usize].prev = at;
        }
        let hash = self.hash_key(&key);
        let last = relation.last.map(|(id, _)| self.hash_id(&id));
        self.slots.push(Slot {
            key,
            observable,
            pos,
            prev: NIL,
            next,
            relation,
        });
        self.by_key
            .insert_unique(hash, at, by_key_hash(&self.slots, &self.hasher));
        if let Some(h) = last {
            self.by_exchange
                .insert_unique(h, at, by_exchange_hash(&self.slots, &self.hasher));
        }
        new
    }

    /// Whether `peer` observes anything here.
    pub fn is_observer(&self, peer: SocketAddr) -> bool {
        self.by_peer.contains_key(&peer)
    }

    /// Whether a relation with this key exists.
    pub fn contains(&self, key: &RelationKey) -> bool {
        self.slot_of(key).is_some()
    }

    /// Removes a relation wherever it is; returns its observable and the relation.
    pub fn remove(&mut self, key: &RelationKey) -> Option<(u64, Relation<I>)> {
        // Every plain GET ends its token's relation: `slot_of` skips hashing the key
        // when there is no relation at all.
        let at = self.slot_of(key)?;
        let slot = self.remove_slot(at);
        Some((slot.observable, slot.relation))
    }

    /// Takes the slot `at` out of every index and the vector; the last slot moves into
    /// its place and the indexes follow it.
    fn remove_slot(&mut self, at: u32) -> Slot<I> {
        let (key_hash, id_hash) = {
            let s = &self.slots[at as usize];
            (
                self.hash_key(&s.key),
                s.relation.last.map(|(id, _)| self.hash_id(&id)),
            )
        };
        self.by_key
            .find_entry(key_hash, |&i| i == at)
            .map(|e| e.remove())
            .ok();
        if let Some(h) = id_hash {
            self.by_exchange
                .find_entry(h, |&i| i == at)
                .map(|e| e.remove())
                .ok();
        }
        let (observable, pos, prev, next, peer) = {
            let s = &self.slots[at as usize];
            (s.observable, s.pos, s.prev, s.next, s.key.0)
        };
        if let Some(list) = self.by_resource.get_mut(&observable) {
            list.swap_remove(pos as usize);
            if let Some(&moved) = list.get(pos as usize) {
                self.slots[moved as usize].pos = pos;
            }
            if list.is_empty() {
                self.by_resource.remove(&observable);
                shrink_when_sparse(&mut self.by_resource);
            } else {
                shrink_when_sparse(list);
            }
        }
        if prev != NIL {
            self.slots[prev as usize].next = next;
        } else if next != NIL {
            self.by_peer.insert(peer, next);
        } else {
            self.by_peer.remove(&peer);
            shrink_when_sparse(&mut self.by_peer);
        }
        if next != NIL {
            self.slots[next as usize].prev = prev;
        }
        let slot = self.slots.swap_remove(at as usize);
        if (at as usize) < self.slots.len() {
            self.relink(self.slots.len() as u32, at);
        }
        shrink_index(&mut self.by_key, by_key_hash(&self.slots, &self.hasher));
        shrink_index(
            &mut self.by_exchange,
            by_exchange_hash(&self.slots, &self.hasher),
        );
        slot
    }

    /// Points every index that held the slot at `from` to `to`, where it now lies.
    fn relink(&mut self, from: u32, to: u32) {
        let (key_hash, id_hash, observable, pos, prev, next, peer) = {
            let s = &self.slots[to as usize];
            (
                self.hash_key(&s.key),
                s.relation.last.map(|(id, _)| self.hash_id(&id)),
                s.observable,
                s.pos,
                s.prev,
                s.next,
                s.key.0,
            )
        };
        if let Some(i) = self.by_key.find_mut(key_hash, |&i| i == from) {
            *i = to;
        }
        if let Some(h) = id_hash {
            if let Some(i) = self.by_exchange.find_mut(h, |&i| i == from) {
                *i = to;
            }
        }
        if let Some(list) = self.by_resource.get_mut(&observable) {
            list[pos as usize] = to;
        }
        if prev != NIL {
            self.slots[prev as usize].next = to;
        } else {
            self.by_peer.insert(peer, to);
        }
        if next != NIL {
            self.slots[next as usize].prev = to;
        }
    }

    /// The relation with `key` and its observable.
    pub fn get_mut(&mut self, key: &RelationKey) -> Option<(u64, &mut Relation<I>)> {
        let at = self.slot_of(key)?;
        let slot = &mut self.slots[at as usize];
        Some((slot.observable, &mut slot.relation))
    }

    /// The relation with `key` and its observable.
    pub fn get(&self, key: &RelationKey) -> Option<(u64, &Relation<I>)> {
        let slot = &self.slots[self.slot_of(key)? as usize];
        Some((slot.observable, &slot.relation))
    }

    /// Records the last notification sent on a relation (the only way to change
    /// [`Relation::last`] of a relation in the table: the index follows it).
    pub fn set_last(&mut self, key: &RelationKey, last: (I, u16)) {
        let Some(at) = self.slot_of(key) else {
            return;
        };
        if let Some((old, _)) = self.slots[at as usize].relation.last {
            let h = self.hash_id(&old);
            self.by_exchange
                .find_entry(h, |&i| i == at)
                .map(|e| e.remove())
                .ok();
        }
        self.slots[at as usize].relation.last = Some(last);
        let h = self.hash_id(&last.0);
        self.by_exchange
            .insert_unique(h, at, by_exchange_hash(&self.slots, &self.hasher));
    }

    /// The relation whose last notification was the exchange `id`.
    pub fn by_exchange(&self, id: I) -> Option<RelationKey> {
        let slots = &self.slots;
        let at = self.by_exchange.find(self.hash_id(&id), |&i| {
            slots[i as usize]
                .relation
                .last
                .is_some_and(|(last, _)| last == id)
        })?;
        Some(self.slots[*at as usize].key.clone())
    }

    /// The relation of `peer` whose last notification had the message ID `mid`.
    pub fn by_peer_mid(&self, peer: SocketAddr, mid: u16) -> Option<RelationKey> {
        let mut at = *self.by_peer.get(&peer)?;
        while at != NIL {
            let slot = &self.slots[at as usize];
            if slot.relation.last.is_some_and(|(_, m)| m == mid) {
                return Some(slot.key.clone());
            }
            at = slot.next;
        }
        None
    }

    /// The keys of the relations of the observer at `peer`.
    pub fn keys_of_peer(&self, peer: SocketAddr) -> Vec<RelationKey> {
        let mut keys = Vec::new();
        let mut at = self.by_peer.get(&peer).copied().unwrap_or(NIL);
        while at != NIL {
            let slot = &self.slots[at as usize];
            keys.push(slot.key.clone());
            at = slot.next;
        }
        keys
    }

    /// The keys of one observable's relations that `pick` accepts.
    pub fn keys_of(
        &self,
        observable: u64,
        pick: impl Fn(&RelationKey) -> bool,
    ) -> Vec<RelationKey> {
        self.by_resource
            .get(&observable)
            .map(|list| {
                list.iter()
                    .map(|&i| &self.slots[i as usize].key)
                    .filter(|k| pick(k))
                    .cloned()
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Removes and returns every relation of one observable.
    pub fn take_all(&mut self, observable: u64) -> Vec<(RelationKey, Relation<I>)> {
        let mut at = self
            .by_resource
            .get(&observable)
            .cloned()
            .unwrap_or_default();
        // Highest first: a slot moved into a freed place then always comes from above
        // every slot still to take.
        at.sort_unstable_by(|a, b| b.cmp(a));
        at.into_iter()
            .map(|i| {
                let slot = self.remove_slot(i);
                (slot.key, slot.relation)
            })
            .collect()
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
        self.slots.len()
    }

    /// Whether no relation is held.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// The capacity of the largest index or of the slots' storage (for tests of memory
    /// coming back).
    pub fn capacity(&self) -> usize {
        self.slots
            .capacity()
            .max(self.by_key.capacity())
            .max(self.by_peer.capacity())
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

    /// Random inserts, replacements, removals, `set_last` and `take_all` against a
    /// plain model: every index answers as the model says after each step.
    #[test]
    fn the_indexes_agree_with_a_model_under_random_operations() {
        use std::collections::HashMap as Model;
        let mut r = Relations::<Id>::default();
        let mut model: Model<RelationKey, (u64, Option<(Id, u16)>)> = Model::new();
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        let mut exchange = 0;
        for _ in 0..20_000 {
            let peer = SocketAddr::from(([10, 0, 0, next(8) as u8], 5683));
            let key = (peer, Token::new(&[next(6) as u8]).unwrap());
            match next(10) {
                0..=3 => {
                    let obs = next(3);
                    let new = r.insert(obs, key.clone(), rel());
                    assert_eq!(new, model.insert(key, (obs, None)).is_none());
                }
                4..=5 => {
                    let got = r.remove(&key).map(|(o, rel)| (o, rel.last));
                    assert_eq!(got, model.remove(&key));
                }
                6..=7 => {
                    exchange += 1;
                    let last = (exchange, next(4) as u16);
                    r.set_last(&key, last);
                    if let Some(m) = model.get_mut(&key) {
                        m.1 = Some(last);
                    }
                }
                8 => {
                    if next(20) == 0 {
                        let obs = next(3);
                        let mut got: Vec<_> = r.take_all(obs).into_iter().map(|(k, _)| k).collect();
                        let mut want: Vec<_> = model
                            .iter()
                            .filter(|(_, v)| v.0 == obs)
                            .map(|(k, _)| k.clone())
                            .collect();
                        model.retain(|_, v| v.0 != obs);
                        got.sort_by_key(|k| (k.0, k.1.as_bytes().to_vec()));
                        want.sort_by_key(|k| (k.0, k.1.as_bytes().to_vec()));
                        assert_eq!(got, want);
                    }
                }
                _ => {
                    for (k, (obs, last)) in &model {
                        assert_eq!(r.get(k).map(|(o, rel)| (o, rel.last)), Some((*obs, *last)));
                        if let Some((id, mid)) = last {
                            assert_eq!(r.by_exchange(*id).as_ref(), Some(k));
                            let found = r.by_peer_mid(k.0, *mid).unwrap();
                            assert_eq!(r.get(&found).unwrap().1.last.unwrap().1, *mid);
                        }
                    }
                    for obs in 0..3 {
                        let mut got = r.keys_of(obs, |_| true);
                        got.sort_by_key(|k| (k.0, k.1.as_bytes().to_vec()));
                        let mut want: Vec<_> = model
                            .iter()
                            .filter(|(_, v)| v.0 == obs)
                            .map(|(k, _)| k.clone())
                            .collect();
                        want.sort_by_key(|k| (k.0, k.1.as_bytes().to_vec()));
                        assert_eq!(got, want, "observable {obs}");
                        assert_eq!(r.observes(obs), !want.is_empty());
                    }
                    for p in 0..8u8 {
                        let peer = SocketAddr::from(([10, 0, 0, p], 5683));
                        assert_eq!(r.is_observer(peer), model.keys().any(|k| k.0 == peer));
                    }
                }
            }
            assert_eq!(r.len(), model.len());
        }
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
