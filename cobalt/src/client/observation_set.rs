//! Many observations read by one reader: an [`ObservationSet`] keeps each member's
//! relation (what an [`Observation`](super::Observation) keeps) in a slot of its own
//! and takes every member's notifications from one shared queue, tagged with the
//! member's slot, so that a client of thousands of servers needs no task, no boxed
//! future and no queue per observation. One timer serves every member's Max-Age
//! deadline (a heap of deadlines, re-checked lazily).

use super::observe::{Completion, Relation, Step};
use super::RequestBuilder;
use crate::runtime::notifications;
use crate::server::Response;
use crate::{Error, Result};
use cobalt_proto::blockwise::qblock::Q_BLOCK2;
use cobalt_proto::message::Message;
use futures_util::stream::FuturesUnordered;
use futures_util::StreamExt;
use hashbrown::{DefaultHashBuilder, HashTable};
use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::future::Future;
use std::hash::{BuildHasher, Hash};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::time::{Instant, Sleep};

/// Notifications the set's shared queue holds for a reader that lags, by default
/// (see [`ObservationSet::with_buffer`]).
pub const SET_BUFFERED_NOTIFICATIONS: usize = 4096;

/// A completion of a notification that came in Block2 blocks, with its member's tag.
type Completing = Pin<Box<dyn Future<Output = (u64, Result<Response>)> + Send>>;

/// Observations of many resources read through one queue, each named by the caller's
/// key `K` (e.g. a device's name or an index).
///
/// For a client that observes many servers at once (a mashup of thousands of
/// devices): the set holds each member's relation in a slot of its own (a few hundred
/// bytes) and takes every member's notifications from one shared queue, so it needs
/// no task, no boxed future and no queue per observation. A member behaves as an
/// [`Observation`](super::Observation) does — freshness (RFC 7641 §3.4), registering
/// again after Max-Age plus a grace of silence (at most
/// [`MAX_REREGISTRATIONS`](super::MAX_REREGISTRATIONS) times in a row), Echo
/// challenges, the client's layers, notifications in Block2 blocks completed — and
/// [`ObservationSet::next`] yields for each member what its
/// [`Observation::next`](super::Observation::next) would: notifications, an error,
/// and `None` once it has ended, after which the member is no longer in the set.
///
/// Differences from an [`Observation`](super::Observation):
/// - The queue and its bound ([`SET_BUFFERED_NOTIFICATIONS`]) are shared: when the
///   reader lags behind by that many notifications, newer ones are dropped for every
///   member (the next one brings the current state, RFC 7641 §1.3).
/// - Q-Block2 is not asked for ([`RequestBuilder::q_block`] is refused); a
///   notification in Q-Block2 blocks ends its member with
///   [`Error::BadResponseOption`].
/// - Over TCP and WebSockets a lost connection is noticed by the error it reports
///   (then the member registers again once, as an observation does) or else by the
///   Max-Age silence.
/// - While the set is empty, `next` waits (add members between two calls).
///
/// Dropping the set, or [`ObservationSet::remove`], ends the relations as dropping
/// an observation does (over UDP the next notification is answered with RST).
///
/// ```no_run
/// # async fn demo() -> cobalt::Result<()> {
/// let client = cobalt::Client::new();
/// let mut set = cobalt::ObservationSet::new(&client);
/// for (i, host) in ["192.0.2.1", "192.0.2.2"].iter().enumerate() {
///     set.observe(i, &format!("coap://{host}/temperature")).await?;
/// }
/// while let Some((device, note)) = set.next().await {
///     match note {
///         Some(Ok(response)) => println!("{device}: {}", response.text_payload()),
///         Some(Err(e)) => println!("{device} failed: {e}"),
///         None => println!("{device} is no longer observed"),
///     }
/// }
/// # Ok(()) }
/// ```
pub struct ObservationSet<K> {
    client: super::Client,
    /// Every member's notifications, tagged with [`tag`] of its slot and
    /// registration.
    queue: notifications::Receiver<Result<Message>>,
    /// Keeps the queue open while the set has no member (it never sends).
    _open: notifications::Sender<Result<Message>>,
    slots: Vec<Slot<K>>,
    /// Slots without a member.
    free: Vec<u32>,
    /// The members' slots by their keys: an index that holds only the slot, whose
    /// member has the key (a map with its own copy of each key took 24 bytes a
    /// bucket for an `Arc<str>` key, this 4).
    by_key: HashTable<u32>,
    hasher: DefaultHashBuilder,
    /// What the deadlines count from ([`Ticks`]).
    epoch: Instant,
    /// Members' deadlines as they were when pushed, with their slot and
    /// generation: an entry whose member has a later deadline now is pushed again
    /// with it when it comes up; one of an earlier registration is dropped.
    deadlines: BinaryHeap<Reverse<(Ticks, u32, u32)>>,
    /// Wakes the reader at the earliest deadline.
    timer: Pin<Box<Sleep>>,
    timer_at: Option<Instant>,
    /// Notifications being completed block by block.
    completing: FuturesUnordered<Completing>,
    /// Members that ended with their last item, to be announced with `None`.
    ended: VecDeque<K>,
    /// The last member's registration, encoded: the next member's, when it has the
    /// same bytes (the same resource of another server), shares them.
    last_request: Option<Arc<[u8]>>,
}

struct Slot<K> {
    /// Bumped at every registration in this slot: what an earlier one queued is stale.
    generation: u32,
    /// When the member registers again if nothing arrives before (in the room the
    /// slot has beside its generation).
    deadline: Ticks,
    /// Boxed: the slots grow by doubling, and room for a member in each spare slot
    /// would cost more than the box.
    member: Option<Box<Member<K>>>,
}

struct Member<K> {
    key: K,
    relation: Relation,
}

/// A time as whole seconds since the set's epoch, rounded up (a deadline never
/// comes early, and at most a second late, for a wait of Max-Age plus some
/// seconds): 4 bytes where an `Instant` takes 16, in every slot and in every entry
/// of the deadlines' heap.
type Ticks = u32;

/// The queue tag of slot `slot`'s registration `generation`.
fn tag(slot: u32, generation: u32) -> u64 {
    (u64::from(slot) << 32) | u64::from(generation)
}

/// The slot and generation of a queue tag.
fn untag(tag: u64) -> (u32, u32) {
    ((tag >> 32) as u32, tag as u32)
}

impl<K> std::fmt::Debug for ObservationSet<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ObservationSet")
            .field("members", &self.by_key.len())
            .field("queue", &self.queue)
            .finish()
    }
}

impl<K: Hash + Eq + Clone> ObservationSet<K> {
    /// An empty set whose observations go through `client` (and its clones' sockets).
    pub fn new(client: &super::Client) -> ObservationSet<K> {
        ObservationSet::with_buffer(client, SET_BUFFERED_NOTIFICATIONS)
    }

    /// An empty set whose shared queue holds at most `notifications` for a reader
    /// that lags (at least 1).
    pub fn with_buffer(client: &super::Client, notifications: usize) -> ObservationSet<K> {
        let (open, queue) = notifications::queue(notifications);
        ObservationSet {
            client: client.clone(),
            queue,
            _open: open,
            slots: Vec::new(),
            free: Vec::new(),
            by_key: HashTable::new(),
            hasher: DefaultHashBuilder::default(),
            epoch: Instant::now(),
            deadlines: BinaryHeap::new(),
            timer: Box::pin(tokio::time::sleep_until(Instant::now())),
            timer_at: None,
            completing: FuturesUnordered::new(),
            ended: VecDeque::new(),
            last_request: None,
        }
    }

    /// Members now.
    pub fn len(&self) -> usize {
        self.by_key.len()
    }

    /// True without members.
    pub fn is_empty(&self) -> bool {
        self.by_key.is_empty()
    }

    /// Whether `key` names a member.
    pub fn contains(&self, key: &K) -> bool {
        self.slot_of(key).is_some()
    }

    /// The members' keys, in no particular order.
    pub fn keys(&self) -> impl Iterator<Item = &K> {
        self.slots
            .iter()
            .filter_map(|entry| entry.member.as_ref().map(|member| &member.key))
    }

    /// Makes room for `additional` more members at once, so that a set told how
    /// many it will hold (e.g. the devices a lookup found) does not grow its tables
    /// by doubling, and leave them up to half empty, as they come.
    pub fn reserve(&mut self, additional: usize) {
        let new_slots = additional.saturating_sub(self.free.len());
        self.slots.reserve(new_slots);
        let (slots, hasher) = (&self.slots, &self.hasher);
        self.by_key
            .reserve(additional, |&slot| hash_of_slot(hasher, slots, slot));
        self.deadlines.reserve(additional);
    }

    /// The slot of member `key`.
    fn slot_of(&self, key: &K) -> Option<u32> {
        let slots = &self.slots;
        self.by_key
            .find(self.hasher.hash_one(key), |&slot| {
                member_of(slots, slot).is_some_and(|member| member.key == *key)
            })
            .copied()
    }

    /// Indexes the member of `slot` by its key.
    fn index(&mut self, slot: u32) {
        let (slots, hasher) = (&self.slots, &self.hasher);
        let hash = hash_of_slot(hasher, slots, slot);
        self.by_key
            .insert_unique(hash, slot, |&slot| hash_of_slot(hasher, slots, slot));
    }

    /// Takes the member of `slot` out of the index (before it leaves its slot).
    fn unindex(&mut self, slot: u32) {
        let hash = hash_of_slot(&self.hasher, &self.slots, slot);
        if let Ok(entry) = self.by_key.find_entry(hash, |&s| s == slot) {
            entry.remove();
        }
    }

    /// `at` in ticks since the epoch, rounded up.
    fn ticks(&self, at: Instant) -> Ticks {
        let since = at.saturating_duration_since(self.epoch);
        let secs = since.as_secs() + u64::from(since.subsec_nanos() != 0);
        Ticks::try_from(secs).unwrap_or(Ticks::MAX)
    }

    /// The instant of `ticks`.
    fn instant(&self, ticks: Ticks) -> Instant {
        self.epoch + Duration::from_secs(u64::from(ticks))
    }

    /// Observes `uri` (a GET with Observe=0) as member `key`, in place of a member
    /// of that key. Fails as [`Client::observe`](super::Client::observe) does (a
    /// bad URI, no credentials for `coaps://`, a name that does not resolve, the
    /// client's bound on requests): then the set is as it was, less a member of
    /// that key.
    pub async fn observe(&mut self, key: K, uri: &str) -> Result<()> {
        let request = self.client.request(cobalt_proto::message::Code::GET, uri);
        self.observe_request(key, request).await
    }

    /// Observes with `request` (its method, options, credentials, ...; Observe=0 is
    /// set) as member `key`, in place of a member of that key. Q-Block
    /// ([`RequestBuilder::q_block`]) is refused: notifications larger than a block
    /// come in Block2 blocks.
    pub async fn observe_request(&mut self, key: K, request: RequestBuilder) -> Result<()> {
        self.remove(&key);
        if request.q_block {
            return Err(Error::Unsupported(crate::error::Unsupported::Argument(
                "an ObservationSet does not ask for Q-Block2 notifications; use \
                 RequestBuilder::observe for one observation with Q-Block"
                    .into(),
            )));
        }
        let (route, message) = request.registration().await?;
        let slot = match self.free.pop() {
            Some(slot) => slot,
            None => {
                let slot = u32::try_from(self.slots.len()).map_err(|_| {
                    Error::Unsupported(crate::error::Unsupported::Argument(
                        "an ObservationSet holds at most 2^32 members".into(),
                    ))
                })?;
                self.slots.push(Slot {
                    generation: 0,
                    deadline: 0,
                    member: None,
                });
                slot
            }
        };
        let entry = &mut self.slots[slot as usize];
        entry.generation = entry.generation.wrapping_add(1);
        let generation = entry.generation;
        let answers = self.queue.sender(tag(slot, generation));
        let relation = match Relation::register(route, message, answers, self.last_request.as_ref())
        {
            Ok(relation) => relation,
            Err(e) => {
                self.free.push(slot);
                return Err(e);
            }
        };
        self.last_request = Some(relation.encoded_request().clone());
        let wait = relation.wait();
        // A `None` still to be announced for an earlier member of this key is not
        // this one's.
        self.ended.retain(|k| *k != key);
        let deadline = self.ticks(Instant::now() + wait);
        let entry = &mut self.slots[slot as usize];
        entry.deadline = deadline;
        entry.member = Some(Box::new(Member { key, relation }));
        self.deadlines.push(Reverse((deadline, slot, generation)));
        self.index(slot);
        Ok(())
    }

    /// Ends member `key`'s relation (as dropping its observation would) and forgets
    /// it; nothing more is yielded for it. False if it was no member.
    pub fn remove(&mut self, key: &K) -> bool {
        let Some(slot) = self.slot_of(key) else {
            return false;
        };
        self.vacate(slot);
        true
    }

    /// Empties `slot` (its relation ends as it is dropped) and takes its member out
    /// of the index.
    fn vacate(&mut self, slot: u32) -> Option<Member<K>> {
        member_of(&self.slots, slot)?;
        self.unindex(slot);
        let entry = &mut self.slots[slot as usize];
        let member = *entry.member.take()?;
        // Anything still queued or completing for it is stale from now on.
        entry.generation = entry.generation.wrapping_add(1);
        self.free.push(slot);
        Some(member)
    }

    /// The member of `slot` if `generation` is its current registration.
    fn live(&mut self, slot: u32, generation: u32) -> Option<&mut Member<K>> {
        let entry = self.slots.get_mut(slot as usize)?;
        if entry.generation != generation {
            return None;
        }
        entry.member.as_deref_mut()
    }

    /// The next item of any member: a notification or error (`Some`), or `None` once
    /// that member has ended (it has left the set then). Waits while nothing
    /// arrives, and while the set is empty.
    pub async fn next(&mut self) -> Option<(K, Option<Result<Response>>)> {
        Some(std::future::poll_fn(|cx| self.poll_member(cx)).await)
    }

    /// Polls for [`ObservationSet::next`]'s item.
    fn poll_member(&mut self, cx: &mut Context<'_>) -> Poll<(K, Option<Result<Response>>)> {
        loop {
            if let Some(key) = self.ended.pop_front() {
                return Poll::Ready((key, None));
            }
            if let Poll::Ready(Some((tag, answer))) = self.completing.poll_next_unpin(cx) {
                let (slot, generation) = untag(tag);
                if let Some(item) = self.completed(slot, generation, answer) {
                    return Poll::Ready(item);
                }
                continue;
            }
            // Deadlines first: a steady stream of notifications from some members
            // must not keep a silent one from registering again.
            let now = Instant::now();
            if let Some(&Reverse((at, slot, generation))) = self.deadlines.peek() {
                if self.instant(at) <= now {
                    self.deadlines.pop();
                    if let Some(item) = self.deadline(now, at, slot, generation) {
                        return Poll::Ready(item);
                    }
                    continue;
                }
            }
            match self.queue.poll_recv_tagged(cx) {
                Poll::Ready(Some((tag, answer))) => {
                    let (slot, generation) = untag(tag);
                    if let Some(item) = self.arrived(now, slot, generation, Some(Some(answer))) {
                        return Poll::Ready(item);
                    }
                    continue;
                }
                // The set keeps a sender of its own: the queue does not end.
                Poll::Ready(None) | Poll::Pending => {}
            }
            if let Some(&Reverse((at, ..))) = self.deadlines.peek() {
                let at = self.instant(at);
                if self.timer_at != Some(at) {
                    self.timer.as_mut().reset(at);
                    self.timer_at = Some(at);
                }
                if self.timer.as_mut().poll(cx).is_ready() {
                    continue;
                }
            }
            return Poll::Pending;
        }
    }

    /// The deadline `at` of slot `slot`'s registration `generation` came up at `now`.
    fn deadline(
        &mut self,
        now: Instant,
        at: Ticks,
        slot: u32,
        generation: u32,
    ) -> Option<(K, Option<Result<Response>>)> {
        self.live(slot, generation)?;
        let later = self.slots[slot as usize].deadline;
        if later > at {
            // Something arrived since: wait until the member's deadline now.
            self.deadlines.push(Reverse((later, slot, generation)));
            return None;
        }
        self.arrived(now, slot, generation, None)
    }

    /// What a member's relation does with what arrived (`None`: nothing within its
    /// wait), and the item to yield, if any.
    fn arrived(
        &mut self,
        now: Instant,
        slot: u32,
        generation: u32,
        answer: Option<Option<Result<Message>>>,
    ) -> Option<(K, Option<Result<Response>>)> {
        let member = self.live(slot, generation)?;
        let wait = member.relation.wait();
        let step = member.relation.take(answer, wait);
        match step {
            Step::Wait => {
                self.postpone(now, slot);
                None
            }
            Step::End => {
                let member = self.vacate(slot)?;
                Some((member.key, None))
            }
            Step::Give(answer) => self.give(now, slot, answer),
            Step::Register(_) => self.register_again(now, slot),
            Step::Complete(Completion::Rest(first)) => {
                let route = member.relation.route.clone();
                let request = member.relation.request();
                let tag = tag(slot, generation);
                self.completing.push(Box::pin(async move {
                    let whole = match request {
                        Ok(request) => route.fetch_rest(request, first).await,
                        Err(e) => Err(e),
                    };
                    (tag, whole)
                }));
                self.postpone(now, slot);
                None
            }
            Step::Complete(Completion::QBlocks(..)) => {
                // Not asked for (the set never sends Q-Block2): an option we do not
                // process in this answer (RFC 7252 §5.4.1).
                let peer = member.relation.route.peer();
                let error = member.relation.end(Error::BadResponseOption {
                    peer,
                    number: Q_BLOCK2,
                });
                self.give(now, slot, error)
            }
        }
    }

    /// `answer` for the member of `slot`; a member whose relation has ended leaves
    /// the set, to be announced with `None` next.
    fn give(
        &mut self,
        now: Instant,
        slot: u32,
        answer: Result<Response>,
    ) -> Option<(K, Option<Result<Response>>)> {
        let member = self.slots.get_mut(slot as usize)?.member.as_mut()?;
        if !member.relation.ended() {
            let key = member.key.clone();
            self.postpone(now, slot);
            return Some((key, Some(answer)));
        }
        let member = self.vacate(slot)?;
        self.ended.push_back(member.key.clone());
        Some((member.key, Some(answer)))
    }

    /// A completion of slot `slot`'s registration `generation` ended with `answer`.
    fn completed(
        &mut self,
        slot: u32,
        generation: u32,
        answer: Result<Response>,
    ) -> Option<(K, Option<Result<Response>>)> {
        self.live(slot, generation)?;
        self.give(Instant::now(), slot, answer)
    }

    /// Something arrived at `now` for the member of `slot`: its deadline is its wait
    /// from now. A deadline that moves later is found by the heap's entry when that
    /// comes up; one that moves earlier (a smaller Max-Age) needs an entry of its
    /// own. The heap is built anew from the members when such entries make it
    /// larger than twice their number.
    fn postpone(&mut self, now: Instant, slot: u32) {
        let Some(wait) = member_of(&self.slots, slot).map(|m| m.relation.wait()) else {
            return;
        };
        let deadline = self.ticks(now + wait);
        let Some(entry) = self.slots.get_mut(slot as usize) else {
            return;
        };
        if entry.member.is_none() {
            return;
        }
        let generation = entry.generation;
        let earlier = deadline < entry.deadline;
        entry.deadline = deadline;
        if !earlier {
            return;
        }
        self.deadlines.push(Reverse((deadline, slot, generation)));
        if self.deadlines.len() > 2 * self.by_key.len() + 64 {
            self.deadlines = self
                .slots
                .iter()
                .enumerate()
                .filter_map(|(slot, entry)| {
                    entry.member.as_ref()?;
                    Some(Reverse((entry.deadline, slot as u32, entry.generation)))
                })
                .collect();
        }
    }

    /// Registers the member of `slot` again, under a new generation (what the old
    /// registration queued is stale); a failure ends it.
    fn register_again(&mut self, now: Instant, slot: u32) -> Option<(K, Option<Result<Response>>)> {
        let entry = self.slots.get_mut(slot as usize)?;
        entry.generation = entry.generation.wrapping_add(1);
        let generation = entry.generation;
        let member = entry.member.as_mut()?;
        let sender = self.queue.sender(tag(slot, generation));
        match member.relation.reregister(sender) {
            Ok(()) => {
                let deadline = now + member.relation.wait();
                let deadline = self.ticks(deadline);
                self.slots[slot as usize].deadline = deadline;
                self.deadlines.push(Reverse((deadline, slot, generation)));
                None
            }
            Err(e) => {
                let error = member.relation.end(e);
                self.give(now, slot, error)
            }
        }
    }
}

/// The member of `slot`, if any.
fn member_of<K>(slots: &[Slot<K>], slot: u32) -> Option<&Member<K>> {
    slots.get(slot as usize)?.member.as_deref()
}

/// The hash of the key of `slot`'s member (0 for an empty slot, which the index
/// never holds).
fn hash_of_slot<K: Hash>(hasher: &DefaultHashBuilder, slots: &[Slot<K>], slot: u32) -> u64 {
    member_of(slots, slot).map_or(0, |member| hasher.hash_one(&member.key))
}

impl<K: Hash + Eq + Clone + Unpin> futures_core::Stream for ObservationSet<K> {
    type Item = (K, Option<Result<Response>>);

    /// As [`ObservationSet::next`]; the stream never ends.
    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.poll_member(cx).map(Some)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::{get, Observable};
    use crate::{Client, Scheme, Server, ServerHandle};
    use cobalt_proto::message::Code;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    /// A server of `/a` and `/b`, each observable, answering its change count.
    async fn server(a: &Observable, b: &Observable) -> (ServerHandle, Arc<AtomicU32>) {
        let count = Arc::new(AtomicU32::new(0));
        let route = |obs: &Observable, name: &'static str| {
            let count = count.clone();
            get(move || {
                let n = count.load(Ordering::Relaxed);
                async move { format!("{name}{n}") }
            })
            .observable(obs)
        };
        let srv = Server::new()
            .route("/a", route(a, "a"))
            .route("/b", route(b, "b"))
            .shards(1)
            .bind("127.0.0.1:0")
            .await
            .unwrap();
        (srv, count)
    }

    async fn next_of(
        set: &mut ObservationSet<&'static str>,
    ) -> (&'static str, Option<Result<Response>>) {
        tokio::time::timeout(Duration::from_secs(10), set.next())
            .await
            .expect("an item within 10 s")
            .expect("a set always has a next item")
    }

    #[tokio::test]
    async fn each_member_gets_its_own_notifications_until_it_ends_or_is_removed() {
        let (a, b) = (Observable::new(), Observable::new());
        let (srv, count) = server(&a, &b).await;
        let base = format!("coap://{}", srv.local_addr(Scheme::Coap).unwrap());
        let client = Client::new();
        let mut set = ObservationSet::new(&client);
        set.observe("a", &format!("{base}/a")).await.unwrap();
        set.observe("b", &format!("{base}/b")).await.unwrap();
        assert_eq!(set.len(), 2);
        let mut firsts = Vec::new();
        for _ in 0..2 {
            let (key, note) = next_of(&mut set).await;
            firsts.push((key, note.unwrap().unwrap().text_payload()));
        }
        firsts.sort();
        assert_eq!(firsts, [("a", "a0".to_string()), ("b", "b0".to_string())]);

        count.store(1, Ordering::Relaxed);
        a.changed();
        let (key, note) = next_of(&mut set).await;
        assert_eq!(
            (key, note.unwrap().unwrap().text_payload()),
            ("a", "a1".into())
        );

        assert!(set.remove(&"b") && !set.contains(&"b") && !set.remove(&"b"));
        b.changed(); // answered with RST: nothing for "b" comes out
        count.store(2, Ordering::Relaxed);
        a.changed();
        let (key, note) = next_of(&mut set).await;
        assert_eq!(
            (key, note.unwrap().unwrap().text_payload()),
            ("a", "a2".into())
        );

        a.deleted();
        let (key, note) = next_of(&mut set).await;
        assert_eq!((key, note.unwrap().unwrap().code), ("a", Code::NOT_FOUND));
        assert!(set.is_empty(), "the relation ended with the 4.04");
        assert!(matches!(next_of(&mut set).await, ("a", None)));
        srv.shutdown(Duration::from_secs(1)).await;
    }

    #[tokio::test]
    async fn a_bad_uri_or_a_q_block_request_adds_no_member() {
        let client = Client::new();
        let mut set = ObservationSet::new(&client);
        assert!(set.observe(1, "http://example.com/x").await.is_err());
        let q = client.request(Code::GET, "coap://127.0.0.1:9/x").q_block();
        assert!(matches!(
            set.observe_request(2, q).await,
            Err(Error::Unsupported(_))
        ));
        assert!(set.is_empty() && set.free.is_empty() && set.slots.is_empty());
    }

    /// A server that answers every registration once (Max-Age 1 s) and then falls
    /// silent: the member registers again after Max-Age plus the grace, and what
    /// comes of the new registration is yielded.
    #[tokio::test]
    async fn a_silent_member_registers_again() {
        use cobalt_proto::message::{decode, encode, opt, MessageType};
        let sock = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        sock.set_read_timeout(Some(Duration::from_secs(15)))
            .unwrap();
        let addr = sock.local_addr().unwrap();
        let server = std::thread::spawn(move || {
            let mut registrations = 0;
            let mut buf = [0u8; 1500];
            while registrations < 2 {
                let Ok((n, from)) = sock.recv_from(&mut buf) else {
                    break;
                };
                let Ok(req) = decode(&buf[..n]) else { continue };
                if req.options.observe() != Some(0) {
                    continue;
                }
                registrations += 1;
                let mut resp = Message::new(MessageType::Acknowledgement, Code::CONTENT, req.mid);
                resp.token = req.token;
                resp.options.set_uint(opt::OBSERVE, 7);
                resp.options.set_uint(opt::MAX_AGE, 1);
                resp.payload = format!("registration {registrations}").into_bytes();
                sock.send_to(&encode(&resp), from).unwrap();
            }
            registrations
        });
        let client = Client::new();
        let mut set = ObservationSet::new(&client);
        set.observe("x", &format!("coap://{addr}/x")).await.unwrap();
        let (_, first) = next_of(&mut set).await;
        assert_eq!(first.unwrap().unwrap().text_payload(), "registration 1");
        let (key, second) = next_of(&mut set).await;
        assert_eq!(key, "x");
        assert_eq!(second.unwrap().unwrap().text_payload(), "registration 2");
        assert_eq!(server.join().unwrap(), 2);
        assert!(set.contains(&"x"));
    }

    #[test]
    fn tags_name_a_slot_and_its_registration() {
        for (slot, generation) in [(0, 0), (1, 2), (u32::MAX, u32::MAX), (7, u32::MAX)] {
            assert_eq!(untag(tag(slot, generation)), (slot, generation));
        }
        assert_ne!(tag(1, 2), tag(2, 1));
    }

    /// What a member costs the set, beyond the key: a slot and its relation in a
    /// box (a notification's room is taken only while one waits in the shared
    /// queue). The slots grow by doubling: an empty one is small.
    #[test]
    fn a_member_holds_little() {
        assert!(std::mem::size_of::<Slot<u32>>() <= 16);
        let member = std::mem::size_of::<Member<u32>>();
        assert!(member <= 160, "{member}");
    }

    /// A member is what a client of thousands of servers pays per observation: its
    /// route shares the client's layers and a stream's host (one pointer each).
    /// At 160 bytes its box takes an allocator's size class of 160 (jemalloc;
    /// glibc: a chunk of 176), where 184 bytes took 192.
    #[test]
    fn a_member_stays_small() {
        let size = std::mem::size_of::<Member<std::sync::Arc<str>>>();
        assert!(size <= 160, "a member grew to {size} bytes");
    }

    #[tokio::test]
    async fn ticks_never_come_early() {
        let client = Client::new();
        let set: ObservationSet<u32> = ObservationSet::new(&client);
        let at = set.epoch + Duration::from_millis(1500);
        assert_eq!(set.ticks(at), 2);
        assert!(set.instant(set.ticks(at)) >= at);
        assert_eq!(set.ticks(set.epoch + Duration::from_secs(3)), 3);
        assert_eq!(set.ticks(set.epoch), 0);
    }
}
