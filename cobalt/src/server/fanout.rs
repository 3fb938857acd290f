//! The observers held by one server role (a datagram shard's, or one stream
//! connection's) and their notifications: changes become rounds of notifications,
//! worked off a bounded amount at a time so that the driver goes on reading however
//! many observers a resource has.
//!
//! - **Coalescing.** A change starts a *round* over the resource's observers; changes
//!   that arrive during a round are merged into one next round. Each notification is
//!   produced from the state current when it is produced, so observers skip states
//!   that were overtaken (RFC 7641 §4.5 allows it) and every observer ends with the
//!   latest one. An observer that already got a state at least as new as the one a
//!   round was started for is skipped.
//! - **Produced once.** Within a round the GET handler runs once per group of
//!   observers whose registrations asked the same (method, options apart from token,
//!   Observe, Block2, Size2 and Echo, and payload: see [`notification_key`]); its answer
//!   is sent to each of them. A handler that asks for the peer's address
//!   ([`Request::peer`](super::Request::peer)) is taken to answer differently per
//!   observer and runs for each one.
//! - **Encoded once.** Where no layer sees notifications per observer and the
//!   registration asked for no block size, a group's answer is also encoded once per
//!   round, Observe number included ([`EncodedNotification`]); each of its observers'
//!   datagrams is that encoding behind its own header (CON or NON, message ID) and
//!   token, byte for byte what encoding the whole notification for it gives.
//! - **Bounded work.** [`FanOut::step`] visits at most a given number of observers;
//!   the driver's loop calls it between reads.
//! - **Pacing per observer.** While an observer's last confirmable notification is
//!   unacknowledged it gets nothing new: it is *owed* the current state, which it gets
//!   once the ACK has come (produced then, so it is the newest state — RFC 7641
//!   §4.5.2). The same when `observe_min_interval` has not passed since its last
//!   notification. An observer that never acknowledges costs nothing after its
//!   confirmable notification times out, which ends the relation.
//! - **Q-Block2 observers.** An observer that registered with Q-Block2 gets a
//!   notification longer than one block as a Q-Block2 set (RFC 9177 §4.4): block 0
//!   (with the M bit, Observe, ETag and Size2) is the notification, and the role's
//!   Q-Block2 sender sends the rest ([`FanOut::take_qblock2_sets`]).
//! - **Verified observers only.** A registration from an address that has not proved
//!   it receives there (RFC 9175 §2.4; the address may be forged) holds no relation and
//!   no place in the budget: it waits, bounded, beside the exchange that answers it
//!   ([`FanOut::await_verification`]) and becomes a relation when the endpoint has sent
//!   that answer ([`FanOut::verified`]), or is forgotten when it could not.

use super::budget::{ObserverBudget, Refusal};
use super::intake::QBlock2Ask;
use super::layer::{Layers, ObserverExtras};
use super::limits::ServerLimits;
use super::observe::Observable;
use super::request::Response;
use crate::changes::{ChangeInbox, Ending, PendingChange};
use cobalt_proto::blockwise::qblock::{qblock2_block, qblock2_count, qblock2_etag, Q_BLOCK2};
use cobalt_proto::blockwise::uploads::upload_key;
use cobalt_proto::endpoint::ExchangeId;
use cobalt_proto::message::{codec, opt, option::encode_uint, BlockValue, Code, Message, Token};
use cobalt_proto::observe::encoded::EncodedNotification;
use cobalt_proto::observe::relations::{Relation, RelationKey, Relations};
use cobalt_proto::session::{BlockLimits, Observation, Session};
use cobalt_proto::uri::Scheme;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Instant;

/// Where a fan-out that does not hear of every resource's changes (a stream
/// connection's) subscribes its inbox while it holds relations of a resource.
pub(crate) struct Subscriber {
    /// Unique among subscribers.
    pub id: u64,
    /// The observer (for change filters).
    pub peer: SocketAddr,
    /// Where the changes go.
    pub inbox: Arc<ChangeInbox>,
}

/// Observers visited per resource before the next resource with a round gets a turn.
const SLICE: usize = 64;

/// Registrations waiting for their address to be verified, per fan-out (the
/// endpoint bounds the verifications themselves; this bounds what waits here).
const MAX_AWAITING: usize = 4096;

/// A registration whose answer waits for its peer's address to be verified.
struct Awaiting {
    observable: Observable,
    request: Message,
    since: Instant,
    version: u64,
    /// What the observer proved and the layers attached, kept for the relation.
    extras: Option<ObserverExtras>,
}

/// Options that do not change what a GET handler answers to a registration: the
/// observation itself, the block asked for (every observer gets the first block of the
/// same representation) and the address check.
const NOT_KEY: [u16; 4] = [opt::OBSERVE, opt::BLOCK2, opt::SIZE2, opt::ECHO];

/// What identifies the answer a registering request gets from a handler that does
/// not look at the peer: the method, the options other than [`NOT_KEY`] (URI, Accept,
/// ETag, queries, ...) and the payload.
pub(crate) fn notification_key(request: &Message) -> Vec<u8> {
    let mut k = vec![request.code.0];
    for o in request.options.iter() {
        if NOT_KEY.contains(&o.number) {
            continue;
        }
        k.extend_from_slice(&o.number.to_be_bytes());
        k.extend_from_slice(&(o.value.len() as u32).to_be_bytes());
        k.extend_from_slice(o.value);
    }
    k.push(0xff);
    k.extend_from_slice(&request.payload);
    k
}

/// What a notification being produced elsewhere (on an executor) belongs to; it comes
/// back with the handler's answer to [`FanOut::produced`].
#[derive(Debug)]
pub(crate) struct Production {
    observable: u64,
    round: u64,
    /// The group of observers that may share the answer.
    group: Vec<u8>,
    /// The observer it was produced for, and whether that one's must be confirmable.
    key: RelationKey,
    con: bool,
    /// The state's version and sequence number when the handler was started.
    stamp: Stamp,
    /// Set if the handler asked for the peer's address.
    pub(crate) peer_read: Arc<AtomicBool>,
}

/// Runs GET handlers for notifications: the shard, which knows the tree and the
/// executors.
pub(crate) trait Producer {
    /// Runs the GET handler on `request` from `peer` (with what was kept of its
    /// registration beyond the message, `extras`); the answer if it is ready at
    /// once (after which `production.peer_read` says whether it read the peer),
    /// otherwise `None`: it will come back to [`FanOut::produced`] with `production`.
    fn produce(
        &mut self,
        peer: SocketAddr,
        request: Message,
        extras: Option<&ObserverExtras>,
        production: Production,
    ) -> Option<(Response, Production)>;
}

/// Which state a notification shows: the resource's shard-local version and the
/// Observe sequence number, both taken when its handler started (the state it read is
/// at least that new). A notification keeps the number of its production, however
/// late it is sent, so an observer never takes an older state for a newer one.
#[derive(Debug, Clone, Copy)]
struct Stamp {
    version: u64,
    seq: u32,
}

/// An answer shared by a group within a round.
enum Produced {
    /// Being produced; these observers wait for it.
    Running(Vec<(RelationKey, bool)>),
    /// Produced: the answer (without Observe) and the state it shows, and once an
    /// observer needed it, the notification encoded for every observer that may share
    /// the encoding (see [`shares_encoding`]).
    Ready(Response, Stamp, Option<Arc<EncodedNotification>>),
    /// The handler read the peer: every observer gets its own.
    PerObserver,
}

/// One pass over (some of) a resource's observers.
struct Round {
    id: u64,
    /// Observers that got a version at least this new are skipped.
    version: u64,
    /// To visit: observer, confirmable asked, and whether it is owed (retried).
    queue: VecDeque<(RelationKey, bool, bool)>,
    produced: HashMap<Vec<u8>, Produced>,
    /// Productions under way.
    running: usize,
    /// Changes that came during the round: another full round follows.
    next: Option<PendingChange>,
}

/// An owed observer waiting for its pacing interval.
#[derive(PartialEq, Eq, PartialOrd, Ord)]
struct Due(Instant, u64);

/// Counters of the fan-out, for the metrics.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FanOutStats {
    /// GET handler runs that produced notifications.
    pub productions: u64,
    /// Notifications held back (an unacknowledged CON, or pacing) and sent later with
    /// the state then current.
    pub deferred: u64,
    /// Observe registrations refused (4.29 or 5.03).
    pub refused: u64,
    /// Answers encoded once for every observer of their group in a round.
    pub encoded: u64,
}

/// An observer of an ended resource, still to be told the code that ends its relation
/// (4.04 for a deleted resource).
struct Farewell {
    key: RelationKey,
    /// Its last notification (replaced if unacknowledged).
    last: Option<(ExchangeId, u16)>,
    code: Code,
}

/// The observers of one shard and the notifications on their way to them.
pub(crate) struct FanOut {
    relations: Relations<ExchangeId>,
    observables: HashMap<u64, Observable>,
    /// Subscribed to the observables with relations here; `None`: every observable
    /// posts its changes here anyway (a datagram shard's inbox).
    subscriber: Option<Subscriber>,
    budget: Arc<ObserverBudget>,
    limits: ServerLimits,
    blocks: BlockLimits,
    /// Changes taken per observable (the shard-local version of its state).
    versions: HashMap<u64, u64>,
    rounds: HashMap<u64, Round>,
    /// Observables with a round, in turn order.
    turn: VecDeque<u64>,
    /// Owed observers waiting for the ACK of their last CON, by address.
    blocked: HashMap<SocketAddr, Vec<cobalt_proto::message::Token>>,
    /// Owed observers waiting for their pacing interval.
    paced: BinaryHeap<Reverse<Due>>,
    paced_keys: HashMap<u64, RelationKey>,
    /// Observers of ended resources still to be told so.
    farewells: VecDeque<Farewell>,
    /// Registrations from addresses not yet verified: no relation, no budget.
    awaiting: HashMap<RelationKey, Awaiting>,
    next_id: u64,
    stats: FanOutStats,
    /// The server's layers, which see each notification per observer.
    layers: Layers,
    /// The transport (for the observers' identities).
    scheme: Scheme,
    /// Notifications sent as Q-Block2 sets whose blocks after the first are still
    /// to go (taken by the role in the same step: [`FanOut::take_qblock2_sets`]).
    qblock2_sets: Vec<QBlock2Notification>,
    /// What observers proved and what layers attached to their registrations, for
    /// those that have any (DTLS and TLS peers, layered servers).
    extras: HashMap<RelationKey, ObserverExtras>,
    /// One copy of each registration the relations hold, by its encoding without
    /// token and message ID: observers that registered alike share it.
    registrations: HashMap<Vec<u8>, Arc<Message>>,
}

impl FanOut {
    /// No observers yet, for the observable resources `observables` (posting their
    /// changes to this fan-out's inbox), or for those `subscriber` subscribes to as
    /// they get observers here. Notifications are sliced to `blocks`.
    pub(crate) fn new(
        observables: Vec<Observable>,
        subscriber: Option<Subscriber>,
        budget: Arc<ObserverBudget>,
        limits: ServerLimits,
        blocks: BlockLimits,
    ) -> FanOut {
        FanOut {
            relations: Relations::default(),
            observables: observables.into_iter().map(|o| (o.id(), o)).collect(),
            subscriber,
            budget,
            limits,
            blocks,
            versions: HashMap::new(),
            rounds: HashMap::new(),
            turn: VecDeque::new(),
            blocked: HashMap::new(),
            paced: BinaryHeap::new(),
            paced_keys: HashMap::new(),
            farewells: VecDeque::new(),
            awaiting: HashMap::new(),
            next_id: 0,
            stats: FanOutStats::default(),
            layers: Layers::default(),
            scheme: Scheme::Coap,
            qblock2_sets: Vec::new(),
            extras: HashMap::new(),
            registrations: HashMap::new(),
        }
    }

    /// Shows each notification to `layers` before it is sent, with the observer's
    /// identity over `scheme`.
    pub(crate) fn with_layers(mut self, layers: Layers, scheme: Scheme) -> FanOut {
        self.layers = layers;
        self.scheme = scheme;
        self
    }

    /// Keeps `extras` for the observer `key` (registered, or waiting for its address
    /// to be verified) until its relation ends.
    pub(crate) fn keep_extras(&mut self, key: RelationKey, extras: ObserverExtras) {
        if self.relations.contains(&key) {
            self.extras.insert(key, extras);
        } else if let Some(a) = self.awaiting.get_mut(&key) {
            a.extras = Some(extras);
        }
    }

    /// Relations held.
    pub(crate) fn len(&self) -> usize {
        self.relations.len()
    }

    /// Counters so far.
    pub(crate) fn stats(&self) -> FanOutStats {
        self.stats
    }

    /// Observers queued in rounds and farewells (a gauge).
    pub(crate) fn backlog(&self) -> usize {
        self.rounds.values().map(|r| r.queue.len()).sum::<usize>() + self.farewells.len()
    }

    /// The current version of `observable`'s state (give it to [`FanOut::register`]
    /// for a registration whose handler starts now).
    pub(crate) fn version(&self, observable: u64) -> u64 {
        self.versions.get(&observable).copied().unwrap_or(0)
    }

    /// Whether a registration with `key` would be admitted now (one with the key of a
    /// relation replaces it, so it always is); a refusal is counted.
    pub(crate) fn check(&mut self, key: &RelationKey) -> Result<(), Refusal> {
        if self.relations.contains(key) {
            return Ok(());
        }
        let l = &self.limits;
        let checked = self
            .budget
            .check(key.0.ip(), l.max_observers_per_ip, l.max_observers);
        self.stats.refused += u64::from(checked.is_err());
        checked
    }

    /// Registers `key` as an observer of `observable` with `request`, having seen
    /// `version`; a relation with the same key is replaced. Refused (and counted) when
    /// the peer's or the server's budget has no room.
    pub(crate) fn register(
        &mut self,
        observable: &Observable,
        key: RelationKey,
        request: Message,
        now: Instant,
        version: u64,
    ) -> Result<(), Refusal> {
        if self
            .relations
            .get(&key)
            .is_some_and(|(owner, _)| owner != observable.id())
        {
            // The token now observes another resource: the old relation ends.
            self.end(&key);
        }
        if !self.relations.contains(&key) {
            let l = &self.limits;
            if let Err(r) = self
                .budget
                .admit(key.0.ip(), l.max_observers_per_ip, l.max_observers)
            {
                self.stats.refused += 1;
                return Err(r);
            }
            observable.observer_added();
        }
        if let Some(sub) = &self.subscriber {
            if !self.relations.observes(observable.id()) {
                observable.subscribe(sub.id, sub.peer, sub.inbox.clone());
            }
        }
        self.observables
            .entry(observable.id())
            .or_insert_with(|| observable.clone());
        let relation = Relation::new(self.shared_registration(request), now, version);
        if let Some((_, replaced)) = self.relations.remove(&key) {
            self.release_registration(replaced.request);
        }
        self.relations.insert(observable.id(), key, relation);
        Ok(())
    }

    /// The copy of `request` kept for every relation registered alike: its token
    /// and message ID are not kept (an observer's token is its key's).
    fn shared_registration(&mut self, mut request: Message) -> Arc<Message> {
        request.token = Token::EMPTY;
        request.mid = 0;
        let encoded = codec::encode(&request);
        self.registrations
            .entry(encoded)
            .or_insert_with(|| Arc::new(request))
            .clone()
    }

    /// A relation that held `request` ended: the shared copy goes when no relation
    /// holds it any more.
    fn release_registration(&mut self, request: Arc<Message>) {
        // Held by the table and by `request`: no relation holds it.
        if Arc::strong_count(&request) == 2 {
            self.registrations.remove(&codec::encode(&request));
            cobalt_proto::tables::shrink_when_sparse(&mut self.registrations);
        }
    }

    /// Keeps the registration `key` of `observable` aside while its answer waits for
    /// the peer's address to be verified: it takes no relation and no place in the
    /// budget until [`FanOut::verified`]. Refused like a registration when the budget
    /// would refuse it now, or (5.03) when too many wait already.
    pub(crate) fn await_verification(
        &mut self,
        observable: &Observable,
        key: RelationKey,
        request: Message,
        now: Instant,
        version: u64,
    ) -> Result<(), Refusal> {
        self.check(&key)?;
        if self.awaiting.len() >= MAX_AWAITING && !self.awaiting.contains_key(&key) {
            self.stats.refused += 1;
            return Err(Refusal::ServerBound);
        }
        let awaiting = Awaiting {
            observable: observable.clone(),
            request,
            since: now,
            version,
            extras: None,
        };
        self.awaiting.insert(key, awaiting);
        Ok(())
    }

    /// The answer to the registration `key` went out to its now verified peer: the
    /// relation starts (unless the budget has filled meanwhile; the client then
    /// hears nothing more and registers again when its answer's Max-Age has passed).
    pub(crate) fn verified(&mut self, key: &RelationKey) {
        let Some(a) = self.awaiting.remove(key) else {
            return;
        };
        cobalt_proto::tables::shrink_when_sparse(&mut self.awaiting);
        match self.register(&a.observable, key.clone(), a.request, a.since, a.version) {
            Ok(()) => {
                if let Some(extras) = a.extras {
                    self.extras.insert(key.clone(), extras);
                }
            }
            Err(r) => tracing::debug!(peer = %key.0, ?r, "verified observer refused: budget full"),
        }
    }

    /// Registrations waiting for their address to be verified.
    #[cfg(test)]
    pub(crate) fn awaiting(&self) -> usize {
        self.awaiting.len()
    }

    /// Ends the relation with `key`, if any (or forgets its registration while it
    /// waits for verification).
    pub(crate) fn end(&mut self, key: &RelationKey) {
        // Emptiness first: every plain GET ends its token's relation (the hot path), and
        // hashing the key (SipHash) only to find an empty table costs ~5 % of a request.
        if !self.awaiting.is_empty() && self.awaiting.remove(key).is_some() {
            cobalt_proto::tables::shrink_when_sparse(&mut self.awaiting);
        }
        if let Some((obs, rel)) = self.relations.remove(key) {
            self.release_registration(rel.request);
            self.forget(obs, key);
        }
    }

    /// Forgets what the layers attached to the registration `key`, if anything.
    fn drop_extras(&mut self, key: &RelationKey) {
        if !self.extras.is_empty() && self.extras.remove(key).is_some() {
            cobalt_proto::tables::shrink_when_sparse(&mut self.extras);
        }
    }

    fn forget(&mut self, obs: u64, key: &RelationKey) {
        self.drop_extras(key);
        if let Some(o) = self.observables.get(&obs) {
            o.observer_removed();
        }
        if let Some((sub, o)) = self.subscriber.as_ref().zip(self.observables.get(&obs)) {
            if !self.relations.observes(obs) {
                o.unsubscribe(sub.id);
            }
        }
        self.budget.release(key.0.ip());
        if let Some(tokens) = self.blocked.get_mut(&key.0) {
            tokens.retain(|t| *t != key.1);
            if tokens.is_empty() {
                self.blocked.remove(&key.0);
                cobalt_proto::tables::shrink_when_sparse(&mut self.blocked);
            }
        }
    }

    /// The observer at `from` is at `to` now (a DTLS session moved by its Connection
    /// ID): its relations, and what waits for it, are `to`'s, counted in `to`'s
    /// budget. The relations `to` had belong to an observer that is gone: they end.
    /// A notification being produced or queued in a round for the old address is
    /// skipped; the next change reaches the new one.
    pub(crate) fn move_observer(&mut self, from: SocketAddr, to: SocketAddr) {
        if from == to {
            return;
        }
        for key in self.relations.keys_of_peer(to) {
            self.end(&key);
        }
        let rekey = |key: &mut RelationKey| {
            if key.0 == from {
                key.0 = to;
            }
        };
        for key in self.relations.keys_of_peer(from) {
            let Some((obs, rel)) = self.relations.remove(&key) else {
                continue;
            };
            let moved = (to, key.1.clone());
            self.relations.insert(obs, moved.clone(), rel);
            self.budget.transfer(from.ip(), to.ip());
            if let Some(extras) = self.extras.remove(&key) {
                self.extras.insert(moved, extras);
            }
        }
        if let Some(tokens) = self.blocked.remove(&from) {
            self.blocked.insert(to, tokens);
        }
        self.paced_keys.values_mut().for_each(rekey);
        self.farewells.iter_mut().for_each(|f| rekey(&mut f.key));
        let waiting: Vec<RelationKey> = self
            .awaiting
            .keys()
            .filter(|k| k.0 == from)
            .cloned()
            .collect();
        for key in waiting {
            // Its address is not verified: a registration waiting for that is forgotten.
            self.awaiting.remove(&key);
        }
    }

    /// A confirmable notification was not acknowledged: the relation ends.
    pub(crate) fn on_delivery_failed(&mut self, id: ExchangeId) {
        if let Some(key) = self.relations.by_exchange(id) {
            self.end(&key);
        }
    }

    /// An RST that matched no pending CON: it may reject a NON notification.
    pub(crate) fn on_unmatched_reset(&mut self, peer: SocketAddr, mid: u16) {
        if let Some(key) = self.relations.by_peer_mid(peer, mid) {
            self.end(&key);
        }
    }

    /// Takes changes: starts a round for each resource, or merges into the next round
    /// of one that has a round going; an ended resource's observers are removed and
    /// queued for their last notification (none when it ends silently).
    pub(crate) fn on_changes(&mut self, changes: Vec<(u64, PendingChange)>) {
        for (obs, change) in changes {
            *self.versions.entry(obs).or_default() += 1;
            if let Some(ending) = change.ending {
                self.end_all(obs, ending);
                continue;
            }
            match self.rounds.get_mut(&obs) {
                Some(round) => match &mut round.next {
                    Some(next) => next.merge(change),
                    None => round.next = Some(change),
                },
                None => self.start_round(obs, &change),
            }
        }
    }

    fn end_all(&mut self, obs: u64, ending: Ending) {
        if self.rounds.remove(&obs).is_some() {
            self.turn.retain(|o| *o != obs);
        }
        // A registration still waiting for its address check ends with the others,
        // unanswered beyond the answer it already had.
        if !self.awaiting.is_empty() {
            self.awaiting.retain(|_, a| a.observable.id() != obs);
        }
        for (key, rel) in self.relations.take_all(obs) {
            self.release_registration(rel.request);
            self.forget(obs, &key);
            if let Ending::With(code) = ending {
                self.farewells.push_back(Farewell {
                    key,
                    last: rel.last,
                    code,
                });
            }
        }
    }

    /// Starts a full round over the observers `change` selects.
    fn start_round(&mut self, obs: u64, change: &PendingChange) {
        let queue: VecDeque<(RelationKey, bool, bool)> = self
            .relations
            .keys_of(obs, |k| change.selects(k.0))
            .into_iter()
            .map(|k| (k, change.confirmable, false))
            .collect();
        if queue.is_empty() {
            return;
        }
        self.add_round(obs, queue);
    }

    fn add_round(&mut self, obs: u64, queue: VecDeque<(RelationKey, bool, bool)>) {
        self.next_id += 1;
        let round = Round {
            id: self.next_id,
            version: self.version(obs),
            queue,
            produced: HashMap::new(),
            running: 0,
            next: None,
        };
        self.rounds.insert(obs, round);
        self.turn.push_back(obs);
    }

    /// Puts an owed observer back in line for the current state.
    fn retry(&mut self, key: RelationKey) {
        let Some((obs, rel)) = self.relations.get_mut(&key) else {
            return;
        };
        let Some(con) = rel.owed else {
            return;
        };
        match self.rounds.get_mut(&obs) {
            Some(round) => {
                round.queue.push_back((key, con, true));
                self.settle(obs);
            }
            None => self.add_round(obs, VecDeque::from([(key, con, true)])),
        }
    }

    /// Whether notifications are waiting to be worked on (a round in turn has
    /// observers queued, or farewells are due).
    pub(crate) fn has_work(&self) -> bool {
        !self.farewells.is_empty() || !self.turn.is_empty()
    }

    /// The observers of `peer` that wait for an ACK: those whose CON has been
    /// acknowledged get back in line. Call after datagrams from `peer` were handled.
    pub(crate) fn on_heard<S: Session>(&mut self, session: &S, peer: SocketAddr) {
        let Some(tokens) = self.blocked.get(&peer) else {
            return;
        };
        let mut free = Vec::new();
        let mut still = Vec::new();
        for t in tokens {
            let key = (peer, t.clone());
            match self.relations.get_mut(&key) {
                Some((_, rel)) if rel.owed.is_some() => {
                    if session.awaits_ack(&Observation::resume(peer, t.clone(), rel.last)) {
                        still.push(t.clone());
                    } else {
                        free.push(key);
                    }
                }
                _ => {}
            }
        }
        if still.is_empty() {
            self.blocked.remove(&peer);
        } else {
            self.blocked.insert(peer, still);
        }
        for key in free {
            self.retry(key);
        }
    }

    /// When the next paced observer is due.
    pub(crate) fn poll_timeout(&self) -> Option<Instant> {
        self.paced.peek().map(|Reverse(Due(at, _))| *at)
    }

    /// Paced observers that are due get back in line.
    pub(crate) fn handle_timeout(&mut self, now: Instant) {
        while let Some(Reverse(Due(at, id))) = self.paced.peek() {
            if *at > now {
                break;
            }
            let id = *id;
            self.paced.pop();
            if let Some(key) = self.paced_keys.remove(&id) {
                self.retry(key);
            }
        }
        cobalt_proto::tables::shrink_when_sparse(&mut self.paced_keys);
        if self.paced.is_empty() {
            self.paced.shrink_to_fit();
        }
    }

    /// Works off up to `budget` observers: farewells first, then the rounds in turn.
    pub(crate) fn step<S: Session>(
        &mut self,
        session: &mut S,
        producer: &mut dyn Producer,
        now: Instant,
        budget: usize,
    ) {
        let mut spent = 0;
        while spent < budget {
            let Some(Farewell { key, last, code }) = self.farewells.pop_front() else {
                break;
            };
            let gone = Response::new(code).into_message();
            let mut observation = replacing(session, key, last);
            let _ = session.notify(now, &mut observation, gone, true);
            spent += 1;
        }
        let mut in_turn = 0;
        while spent < budget {
            let Some(&obs) = self.turn.front() else {
                break;
            };
            let item = self.rounds.get_mut(&obs).and_then(|r| r.queue.pop_front());
            match item {
                Some((key, con, retried)) => {
                    spent += 1;
                    in_turn += 1;
                    self.visit(session, producer, now, obs, key, con, retried);
                    if in_turn >= SLICE {
                        in_turn = 0;
                        self.turn.rotate_left(1);
                    }
                }
                None => {
                    in_turn = 0;
                    self.finish_or_park(obs);
                }
            }
        }
    }

    /// A round whose queue is empty leaves the turn; it ends unless something is
    /// being produced for it.
    fn finish_or_park(&mut self, obs: u64) {
        self.turn.pop_front();
        self.settle(obs);
    }

    /// Ends `obs`'s round if its queue is empty and nothing is being produced for it
    /// (another round starts if changes came meanwhile); a round with a queue is put
    /// in turn.
    fn settle(&mut self, obs: u64) {
        let Some(round) = self.rounds.get_mut(&obs) else {
            return;
        };
        if !round.queue.is_empty() {
            if !self.turn.contains(&obs) {
                self.turn.push_back(obs);
            }
            return;
        }
        if round.running > 0 {
            return; // settled again when a production comes back
        }
        let next = round.next.take();
        self.rounds.remove(&obs);
        self.turn.retain(|o| *o != obs);
        cobalt_proto::tables::shrink_when_sparse(&mut self.rounds);
        if let Some(change) = next {
            self.start_round(obs, &change);
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn visit<S: Session>(
        &mut self,
        session: &mut S,
        producer: &mut dyn Producer,
        now: Instant,
        obs: u64,
        key: RelationKey,
        con: bool,
        retried: bool,
    ) {
        let Some(round) = self.rounds.get(&obs) else {
            return;
        };
        let (round_id, round_version) = (round.id, round.version);
        let stamp = Stamp {
            version: self.version(obs),
            seq: self
                .observables
                .get(&obs)
                .map_or(0, Observable::current_seq),
        };
        let Some((owner, rel)) = self.relations.get_mut(&key) else {
            return;
        };
        if owner != obs {
            return;
        }
        if let Some(owed_con) = &mut rel.owed {
            if !retried {
                // Already in line for the state current when it is let through.
                *owed_con |= con;
                return;
            }
        } else if rel.version >= round_version && !con {
            return; // has this state already
        }
        if self.hold(session, now, &key, con) {
            return;
        }
        let Some((_, rel)) = self.relations.get_mut(&key) else {
            return;
        };
        let con = con || rel.owed.unwrap_or(false);
        let group = notification_key(&rel.request);
        let shares = shares_encoding(&self.layers, &rel.request);
        let round = self.rounds.get_mut(&obs).expect("looked up above");
        match round.produced.get_mut(&group) {
            Some(Produced::Ready(resp, stamp, encoded)) if shares && resp.code.is_success() => {
                let stamp = *stamp;
                let encoded = encoded
                    .get_or_insert_with(|| {
                        self.stats.encoded += 1;
                        Arc::new(encode_once(session, key.0, resp, stamp, self.blocks))
                    })
                    .clone();
                self.deliver(session, now, obs, key, con, Answer::Shared(&encoded), stamp);
                return;
            }
            Some(Produced::Ready(resp, stamp, _)) => {
                let (resp, stamp) = (resp.clone(), *stamp);
                self.deliver(session, now, obs, key, con, Answer::Own(resp), stamp);
                return;
            }
            Some(Produced::Running(waiting)) => {
                waiting.push((key, con));
                return;
            }
            Some(Produced::PerObserver) | None => {}
        }
        let shared = !matches!(round.produced.get(&group), Some(Produced::PerObserver));
        let mut request = Message::clone(&rel.request);
        request.token = key.1.clone();
        request.options.remove(opt::BLOCK2);
        request.options.remove(Q_BLOCK2);
        let production = Production {
            observable: obs,
            round: round_id,
            group: group.clone(),
            key: key.clone(),
            con,
            stamp,
            peer_read: Arc::default(),
        };
        self.stats.productions += 1;
        match producer.produce(key.0, request, self.extras.get(&key), production) {
            Some((resp, production)) => {
                let per_observer = production
                    .peer_read
                    .load(std::sync::atomic::Ordering::Relaxed);
                if shared {
                    let entry = if per_observer {
                        Produced::PerObserver
                    } else {
                        Produced::Ready(resp.clone(), production.stamp, None)
                    };
                    round.produced.insert(group, entry);
                }
                let stamp = production.stamp;
                self.deliver(session, now, obs, key, con, Answer::Own(resp), stamp);
            }
            None => {
                round.running += 1;
                if shared {
                    round.produced.insert(group, Produced::Running(Vec::new()));
                }
            }
        }
    }

    /// Holds the notification for `key` back if its last CON is unacknowledged or its
    /// pacing interval has not passed: it is owed the state then current.
    fn hold<S: Session>(
        &mut self,
        session: &S,
        now: Instant,
        key: &RelationKey,
        con: bool,
    ) -> bool {
        let min_interval = self.limits.observe_min_interval;
        let Some((_, rel)) = self.relations.get_mut(key) else {
            return true;
        };
        let unacked = session.awaits_ack(&Observation::resume(key.0, key.1.clone(), rel.last));
        let due = rel
            .last_sent
            .map(|t| t + min_interval)
            .filter(|due| *due > now);
        if !unacked && due.is_none() {
            return false;
        }
        let newly = rel.owed.is_none();
        rel.owed = Some(rel.owed.unwrap_or(false) | con);
        self.stats.deferred += u64::from(newly);
        if unacked {
            let tokens = self.blocked.entry(key.0).or_default();
            if !tokens.contains(&key.1) {
                tokens.push(key.1.clone());
            }
        } else if let Some(due) = due {
            self.next_id += 1;
            self.paced.push(Reverse(Due(due, self.next_id)));
            self.paced_keys.insert(self.next_id, key.clone());
        }
        true
    }

    /// A notification produced elsewhere came back: it goes to the observer it was
    /// produced for, and the observers that waited for it go back in line (to get it,
    /// or, if the handler read the peer, their own).
    pub(crate) fn produced<S: Session>(
        &mut self,
        session: &mut S,
        now: Instant,
        production: Production,
        response: Response,
    ) {
        let per_observer = production
            .peer_read
            .load(std::sync::atomic::Ordering::Relaxed);
        if let Some(round) = self
            .rounds
            .get_mut(&production.observable)
            .filter(|r| r.id == production.round)
        {
            round.running = round.running.saturating_sub(1);
            let waiting = match round.produced.remove(&production.group) {
                Some(Produced::Running(w)) => w,
                Some(other) => {
                    round.produced.insert(production.group.clone(), other);
                    Vec::new()
                }
                None => Vec::new(),
            };
            let entry = if per_observer {
                Produced::PerObserver
            } else {
                Produced::Ready(response.clone(), production.stamp, None)
            };
            round.produced.insert(production.group.clone(), entry);
            for (key, con) in waiting.into_iter().rev() {
                round.queue.push_front((key, con, false));
            }
            self.settle(production.observable);
        }
        self.deliver(
            session,
            now,
            production.observable,
            production.key,
            production.con,
            Answer::Own(response),
            production.stamp,
        );
    }

    /// Sends `answer` to the observer `key` of `observable` as a notification of
    /// the state `stamp` (nothing if the relation has ended or now observes another
    /// resource).
    #[allow(clippy::too_many_arguments)]
    fn deliver<S: Session>(
        &mut self,
        session: &mut S,
        now: Instant,
        observable: u64,
        key: RelationKey,
        con: bool,
        answer: Answer<'_>,
        stamp: Stamp,
    ) {
        let Some((obs, rel)) = self.relations.get_mut(&key) else {
            return;
        };
        if obs != observable {
            return;
        }
        let l = &self.limits;
        let peer = key.0;
        let success = match &answer {
            Answer::Own(response) => response.code.is_success(),
            Answer::Shared(encoded) => encoded.code().is_success(),
        };
        let con = rel.next_is_confirmable(&l.con, now, con, success);
        // Only an error (which ends the relation) replaces an unacknowledged CON.
        let mut observation = replacing(session, key.clone(), rel.last.filter(|_| !success));
        let sent = match answer {
            Answer::Shared(encoded) => session.notify_encoded(now, &mut observation, encoded, con),
            Answer::Own(mut response) => {
                if success {
                    response.options.set(opt::OBSERVE, encode_uint(stamp.seq));
                }
                if !self.layers.is_empty() {
                    let extras = self.extras.get(&key);
                    let registration = Message {
                        token: key.1.clone(),
                        ..Message::clone(&rel.request)
                    };
                    let layers = &self.layers;
                    layers.notify(
                        self.scheme,
                        key.clone(),
                        &registration,
                        extras,
                        &mut response,
                    );
                }
                // A notification carries the first block, of the size the observer
                // asked for if smaller; the client fetches the rest (RFC 7959 §3.4).
                let first = rel.request.block2().map(|b| BlockValue {
                    num: 0,
                    more: false,
                    ..b
                });
                let full = response.into_message();
                let qblock = qblock2_szx(&rel.request, self.blocks.szx)
                    .filter(|szx| success && qblock2_count(full.payload.len(), *szx) > 1);
                match qblock {
                    Some(szx) => {
                        let (first, rest) =
                            qblock2_notification(&rel.request, &key, full, szx, con);
                        let sent = session.notify(now, &mut observation, first, con);
                        if sent.is_ok() && self.qblock2_sets.len() < MAX_QBLOCK2_SETS {
                            self.qblock2_sets.push(rest);
                        }
                        sent
                    }
                    None => {
                        let msg = session.slice(peer, first, full, self.blocks);
                        session.notify(now, &mut observation, msg, con)
                    }
                }
            }
        };
        rel.sent(now, con, stamp.version);
        if let Some(last) = observation.last() {
            self.relations.set_last(&key, last);
        }
        if let Err(e) = sent {
            // Too large for the connection, or the connection is gone: the observer
            // is told (where it can be) and the relation ends.
            tracing::debug!(%peer, error = %e, "notification not sent; ending the relation");
            let failed = Response::new(Code::INTERNAL_SERVER_ERROR).into_message();
            let _ = session.notify(now, &mut observation, failed, con);
            self.end(&key);
        } else if !success {
            // An error notification ends the relation (RFC 7641 §4.2).
            self.end(&key);
        }
    }

    /// The Q-Block2 notifications sent since the last call whose other blocks are
    /// still to go ([`QBlock2Sender::notify_rest`](super::qblock2_send::QBlock2Sender::notify_rest)).
    pub(crate) fn take_qblock2_sets(&mut self) -> Vec<QBlock2Notification> {
        std::mem::take(&mut self.qblock2_sets)
    }

    /// The message ID of the last notification to `key` (for tests).
    #[cfg(test)]
    pub(crate) fn last_mid(&self, key: &RelationKey) -> Option<u16> {
        self.relations.get(key)?.1.last.map(|(_, mid)| mid)
    }

    /// The capacity of the relation tables (for tests of memory coming back).
    #[cfg(test)]
    pub(crate) fn capacity(&self) -> usize {
        self.relations.capacity()
    }
}

/// What [`FanOut::deliver`] sends: an answer of the observer's own, which gets its
/// Observe number, the layers' notification hooks and its block size there, or one
/// encoded once for a group (by [`encode_once`]).
enum Answer<'a> {
    Own(Response),
    Shared(&'a EncodedNotification),
}

/// Whether an observer registered with `registration` may get a notification encoded
/// once for its group: no layer wants to see (and change) each observer's
/// notification, and the registration asked for no block size of its own.
fn shares_encoding(layers: &Layers, registration: &Message) -> bool {
    layers.is_empty() && registration.block2().is_none()
}

/// A group's answer as each of its observers that [`shares_encoding`] gets it: with
/// the Observe number of `stamp`, sliced to the first block where it is too large.
/// The slice of a response for which no block was asked depends only on the
/// transport, not on the peer (`peer` is one of the group's).
fn encode_once<S: Session>(
    session: &S,
    peer: SocketAddr,
    response: &Response,
    stamp: Stamp,
    blocks: BlockLimits,
) -> EncodedNotification {
    let mut response = response.clone();
    response.options.set(opt::OBSERVE, encode_uint(stamp.seq));
    EncodedNotification::new(session.slice(peer, None, response.into_message(), blocks))
}

/// The observation of `key` to notify next: one that replaces `last` where that was
/// confirmable and still waits for its ACK (RFC 7641 §4.5.2).
fn replacing<S: Session>(
    session: &S,
    key: RelationKey,
    last: Option<(ExchangeId, u16)>,
) -> Observation {
    let observation = Observation::resume(key.0, key.1.clone(), last);
    if session.awaits_ack(&observation) {
        observation
    } else {
        Observation::resume(key.0, key.1, None)
    }
}

impl Drop for FanOut {
    /// The relations end with their fan-out (a stream connection closed, a shard
    /// stopped): the resources' observer counts, the budget and the subscriptions
    /// are given back.
    fn drop(&mut self) {
        for obs in self.relations.observed() {
            for (key, _) in self.relations.take_all(obs) {
                self.forget(obs, &key);
            }
        }
    }
}

#[cfg(test)]
#[path = "fanout_tests.rs"]
mod tests;

/// Q-Block2 notifications waiting for their other blocks at most at once (the role
/// takes them in the step that made them; this bounds a step's worth).
const MAX_QBLOCK2_SETS: usize = 4096;

/// A notification sent as a Q-Block2 set (RFC 9177 §4.4): its first block went out as
/// the notification; the other blocks follow like a Q-Block2 answer's.
pub(crate) struct QBlock2Notification {
    /// The observer.
    pub peer: SocketAddr,
    /// How the rest is sent: the registration's token, its answer's key (where the
    /// whole body is kept for the observer's requests for missing blocks), block size
    /// and message type.
    pub ask: QBlock2Ask,
    /// The whole notification, with its Observe number and ETag.
    pub full: Message,
}

/// The block size exponent of the Q-Block2 sets of a relation whose registration
/// asked for Q-Block2 (the role marks it so), at most the server's `max_szx`.
fn qblock2_szx(registration: &Message, max_szx: u8) -> Option<u8> {
    let value = registration.options.get_uint(Q_BLOCK2)?;
    Some(BlockValue::decode(value).map_or(max_szx, |b| b.szx.min(max_szx)))
}

/// Splits a notification `full` of more than one block for the Q-Block2 observer
/// `key`: its first block (Q-Block2 with the M bit, Observe, ETag, Size2) and the rest
/// to send after it.
#[cold]
fn qblock2_notification(
    registration: &Message,
    key: &RelationKey,
    mut full: Message,
    szx: u8,
    con: bool,
) -> (Message, QBlock2Notification) {
    if !full.options.contains(opt::ETAG) {
        full.options.set(opt::ETAG, qblock2_etag(&full));
    }
    let first = qblock2_block(&full, 0, szx).unwrap_or_else(|| full.clone());
    let rest = QBlock2Notification {
        peer: key.0,
        ask: QBlock2Ask {
            asked: vec![BlockValue {
                num: 0,
                more: false,
                szx,
            }],
            szx,
            key: upload_key(registration),
            token: key.1.clone(),
            confirmable: con,
        },
        full,
    };
    (first, rest)
}
