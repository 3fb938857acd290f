//! Congestion state per peer: bounded in number, forgotten when idle.
//!
//! Every peer a confirmable message goes to gets a [`Controller`] the first time, up to
//! `max_peers`. At the bound, a new peer's exchanges run on a fresh controller that is
//! not kept (the algorithm's initial behaviour, as for a peer never seen), so a flood
//! of addresses can neither grow memory nor evict the state of peers already known.
//! State unused for `lifetime` (at least 255 s, draft-ietf-core-cocoa-03 §4.3; its last
//! use is kept to the second, rounded up, so up to a second longer) and not
//! in use by an exchange is dropped by [`PeerTable::expire`], and treated as gone if
//! found before a sweep.

use super::fasor::Fasor;
use super::non::{NonDecision, NonPacer};
use super::{Algorithm, Attempt, Controller, ControllerFactory, Params, SharedFactory};
use crate::message::Token;
use hashbrown::HashMap;
use rand::RngCore;
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// Least time congestion state outlives its last use.
pub const MIN_LIFETIME: Duration = Duration::from_secs(255);
/// NON notifications held back for one peer by the NON rate; beyond it the oldest is
/// dropped (as the network might have dropped it).
pub const MAX_HELD_PER_PEER: usize = 8;
/// Bytes of held NON notifications over all peers; beyond it new ones are dropped.
pub const MAX_HELD_BYTES: usize = 1 << 20;

/// Counters of the congestion layer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CongestionStats {
    /// Exchanges run on throw-away state because the table was full.
    pub overflow: u64,
    /// NON notifications sent as CON: to keep 2 of every 16 confirmable, or because
    /// there was no room to hold them back.
    pub non_upgraded: u64,
    /// NON notifications held back by the NON rate.
    pub non_delayed: u64,
    /// Held NON notifications replaced by a newer one for the same token.
    pub non_superseded: u64,
}

/// What [`PeerTable::hold`] did with a NON notification.
#[derive(Debug, PartialEq, Eq)]
pub enum Hold {
    /// Held (or replacing the one held for its token); with the time to call
    /// [`PeerTable::release_held`] when no release was pending for the peer yet.
    Held(Option<Instant>),
    /// No room to hold it: send these bytes as a confirmable message.
    NoRoom(Vec<u8>),
}

/// A peer's controller: FASOR's 32 bytes (the endpoint's default algorithm, and
/// FASOR-K) inline, any other algorithm in an allocation of its own. A client keeps
/// one for each of the thousands of devices it observes.
#[derive(Debug)]
enum PeerController {
    Fasor(Fasor),
    Boxed(Box<dyn Controller>),
}

impl PeerController {
    /// A fresh controller from `factory` for a peer first seen at `now`.
    fn build(factory: &dyn ControllerFactory, params: Params, now: Instant) -> PeerController {
        match factory.algorithm() {
            Some(Algorithm::Fasor) => PeerController::Fasor(Fasor::new(params)),
            Some(Algorithm::FasorK) => PeerController::Fasor(Fasor::with_retention(params)),
            _ => PeerController::Boxed(factory.build(params, now)),
        }
    }

    fn get(&mut self) -> &mut dyn Controller {
        match self {
            PeerController::Fasor(f) => f,
            PeerController::Boxed(b) => b.as_mut(),
        }
    }
}

#[derive(Debug)]
struct Entry {
    ctl: PeerController,
    /// Confirmable messages to this peer awaiting an answer.
    in_flight: u32,
    /// When it was last used, in whole seconds after the table's epoch, rounded up
    /// (so it lives at most a second longer than its lifetime, never less): a client
    /// may keep state for thousands of peers, and an `Instant` takes 16 bytes.
    last_used: u32,
    /// The pacing of messages outside exchanges (NON notifications), made with the
    /// first one: a peer that is only ever a client's server (e.g. each of the
    /// thousands of devices a mashup observes) never needs it.
    non: Option<Box<NonState>>,
}

/// What a peer that gets messages outside exchanges needs besides its controller.
#[derive(Debug, Default)]
struct NonState {
    pacer: NonPacer,
    held: VecDeque<(Token, Vec<u8>)>,
    /// A release timer is armed for the held messages.
    release_armed: bool,
}

impl Entry {
    /// NON notifications held back for the peer.
    fn held(&self) -> usize {
        self.non.as_ref().map_or(0, |n| n.held.len())
    }

    /// The peer's NON pacing, made on first use.
    fn non(&mut self) -> &mut NonState {
        self.non.get_or_insert_with(Box::default)
    }
}

/// The congestion state of every peer. See the [module documentation](crate::congestion).
#[derive(Debug)]
pub struct PeerTable {
    factory: SharedFactory,
    params: Params,
    max_peers: usize,
    lifetime: Duration,
    peers: HashMap<SocketAddr, Entry>,
    /// What entries' `last_used` counts from: the first use of the table.
    epoch: Option<Instant>,
    held_bytes: usize,
    /// When a full table was last swept for expired entries (at most once per second).
    last_full_sweep: Option<Instant>,
    stats: CongestionStats,
}

impl PeerTable {
    /// An empty table whose controllers come from `factory`. State lives at least
    /// `lifetime` (raised to `MIN_LIFETIME`, 255 s,) after its last use.
    pub fn new(
        factory: SharedFactory,
        params: Params,
        max_peers: usize,
        lifetime: Duration,
    ) -> PeerTable {
        PeerTable {
            factory,
            params,
            max_peers,
            lifetime: lifetime.max(MIN_LIFETIME),
            peers: HashMap::new(),
            epoch: None,
            held_bytes: 0,
            last_full_sweep: None,
            stats: CongestionStats::default(),
        }
    }

    /// Uses `factory` for peers from now on and forgets what was learnt so far.
    pub fn set_factory(&mut self, factory: SharedFactory) {
        self.factory = factory;
        let epoch = self.epoch;
        for e in self.peers.values_mut() {
            let last_used = epoch.map(|t| t + Duration::from_secs(u64::from(e.last_used)));
            if let Some(last_used) = last_used {
                e.ctl = PeerController::build(self.factory.as_ref(), self.params, last_used);
            }
        }
    }

    /// Peers with state.
    pub fn len(&self) -> usize {
        self.peers.len()
    }

    /// True when no peer has state.
    pub fn is_empty(&self) -> bool {
        self.peers.is_empty()
    }

    /// Counters.
    pub fn stats(&self) -> CongestionStats {
        self.stats
    }

    /// `now` as an entry's `last_used`: whole seconds after the epoch (set by the
    /// first call), rounded up.
    fn secs(&mut self, now: Instant) -> u32 {
        let epoch = *self.epoch.get_or_insert(now);
        let d = now.saturating_duration_since(epoch);
        let secs = d.as_secs() + u64::from(d.subsec_nanos() > 0);
        u32::try_from(secs).unwrap_or(u32::MAX)
    }

    /// Whether entry `e` is unused for the lifetime at `now`, and not in use.
    fn stale(&self, e: &Entry, now: Instant) -> bool {
        let last_used = self
            .epoch
            .map_or(now, |t| t + Duration::from_secs(u64::from(e.last_used)));
        e.in_flight == 0 && e.held() == 0 && now >= last_used + self.lifetime
    }

    /// Drops every entry unused for the lifetime and not in use.
    pub fn expire(&mut self, now: Instant) {
        let (epoch, lifetime) = (self.epoch, self.lifetime);
        self.peers.retain(|_, e| {
            let last_used = epoch.map_or(now, |t| t + Duration::from_secs(u64::from(e.last_used)));
            e.in_flight > 0 || e.held() > 0 || now < last_used + lifetime
        });
        // The room a crowd of peers left (e.g. 10,000 devices a mashup stopped
        // observing) comes back with them.
        crate::tables::shrink_when_sparse(&mut self.peers);
    }

    /// The peer's entry, created if there is room; `None` at the bound.
    fn entry(&mut self, now: Instant, peer: SocketAddr) -> Option<&mut Entry> {
        let stale = self.peers.get(&peer).is_some_and(|e| self.stale(e, now));
        if stale {
            self.peers.remove(&peer);
        }
        if !self.peers.contains_key(&peer) && self.peers.len() >= self.max_peers {
            let swept_recently = self
                .last_full_sweep
                .is_some_and(|t| now < t + Duration::from_secs(1));
            if swept_recently {
                return None;
            }
            self.last_full_sweep = Some(now);
            self.expire(now);
            if self.peers.len() >= self.max_peers {
                return None;
            }
        }
        let used = self.secs(now);
        let (factory, params) = (&self.factory, self.params);
        let e = self.peers.entry(peer).or_insert_with(|| Entry {
            ctl: PeerController::build(factory.as_ref(), params, now),
            in_flight: 0,
            last_used: used,
            non: None,
        });
        e.last_used = used;
        Some(e)
    }

    /// Runs `f` on the peer's controller, or on a throw-away one at the bound.
    fn with_controller<R>(
        &mut self,
        now: Instant,
        peer: SocketAddr,
        f: impl FnOnce(&mut dyn Controller, &mut u32) -> R,
    ) -> R {
        match self.entry(now, peer) {
            Some(e) => f(e.ctl.get(), &mut e.in_flight),
            None => {
                self.stats.overflow += 1;
                let mut scratch = PeerController::build(self.factory.as_ref(), self.params, now);
                f(scratch.get(), &mut 0)
            }
        }
    }

    /// A confirmable message leaves for `peer` for the first time: its timing.
    pub fn begin(&mut self, now: Instant, peer: SocketAddr, rng: &mut dyn RngCore) -> Attempt {
        let mut a = self.with_controller(now, peer, |ctl, in_flight| {
            let a = ctl.first_timeout(now, *in_flight as usize, rng);
            *in_flight += 1;
            a
        });
        self.apply_floor(&mut a);
        a
    }

    /// The timeout of `attempt` expired: the next timeout, counting the retransmission.
    pub fn backoff(&mut self, now: Instant, peer: SocketAddr, attempt: &mut Attempt) {
        self.with_controller(now, peer, |ctl, _| ctl.next_timeout(now, attempt));
        self.apply_floor(attempt);
    }

    /// No first timeout below ACK_TIMEOUT/4 (0.5 s by default); an exchange whose
    /// first timeout was raised to it keeps to it doubled per retransmission, up to
    /// ACK_TIMEOUT × 4 (8 s, below every algorithm's cap).
    ///
    /// The estimating algorithms learn the network's round trip, not how long the
    /// peer's handler takes: over a LAN or loopback (RTT well under a millisecond)
    /// their RTO would give up on a request after a few milliseconds, while a server
    /// may take up to its separate-ACK delay (1 s in Cobalt) before it answers. The
    /// floor keeps the give-up time after four retransmissions at least
    /// 31 × ACK_TIMEOUT/4 (15.5 s) there. Exchanges that start above the floor run on
    /// their algorithm's timers untouched: on the congestion study's link (RTT 663 ms) the
    /// results are the same with and without it.
    fn apply_floor(&self, attempt: &mut Attempt) {
        let floor = self.params.ack_timeout / 4;
        if attempt.retransmissions == 0 {
            attempt.floored = attempt.timeout < floor;
        }
        if attempt.floored {
            let doubled = floor.saturating_mul(1u32 << attempt.retransmissions.min(4));
            attempt.timeout = attempt.timeout.max(doubled);
        }
    }

    /// The exchange of `attempt` was answered.
    pub fn answered(&mut self, now: Instant, peer: SocketAddr, attempt: &Attempt) {
        self.with_controller(now, peer, |ctl, in_flight| {
            *in_flight = in_flight.saturating_sub(1);
            ctl.on_answer(now, attempt);
        });
    }

    /// The exchange of `attempt` ended without an answer (given up, cancelled).
    pub fn abandoned(&mut self, now: Instant, peer: SocketAddr, attempt: &Attempt) {
        if let Some(e) = self.peers.get_mut(&peer) {
            e.in_flight = e.in_flight.saturating_sub(1);
            e.ctl.get().on_abandon(now, attempt);
        }
    }

    /// The peer's current overall RTO estimate, if it has state and its algorithm keeps one.
    pub fn rto(&mut self, now: Instant, peer: SocketAddr) -> Option<Duration> {
        self.peers.get_mut(&peer)?.ctl.get().rto(now)
    }

    /// What to do with a NON of `bytes` bytes outside an exchange (see [`super::non`]).
    /// Algorithms without an RTO estimate always send.
    pub fn non_decide(&mut self, now: Instant, peer: SocketAddr, bytes: usize) -> NonDecision {
        let decision = match self.entry(now, peer) {
            Some(e) => match e.ctl.get().rto(now) {
                None => NonDecision::Send,
                Some(rto) => match &e.non {
                    Some(n) => n.pacer.decide(now, rto, bytes, n.held.len()),
                    None => NonPacer::default().decide(now, rto, bytes, 0),
                },
            },
            // No room to remember the peer: only confirmable messages are safe.
            None => {
                let mut scratch = PeerController::build(self.factory.as_ref(), self.params, now);
                match scratch.get().rto(now) {
                    None => NonDecision::Send,
                    Some(_) => NonDecision::Confirmable,
                }
            }
        };
        match decision {
            NonDecision::Confirmable => self.stats.non_upgraded += 1,
            NonDecision::WaitUntil(_) => self.stats.non_delayed += 1,
            NonDecision::Send => {}
        }
        decision
    }

    /// A message outside an exchange left for `peer`.
    pub fn non_record(&mut self, now: Instant, peer: SocketAddr, confirmable: bool) {
        if let Some(e) = self.entry(now, peer) {
            e.non().pacer.record(now, confirmable);
        }
    }

    /// Holds a NON notification for `token` that may leave at `at` (from
    /// [`PeerTable::non_decide`]); one already held for the token is replaced. With no
    /// room to hold it (`MAX_HELD_PER_PEER` other tokens held for the peer, the
    /// table's byte bound reached, or the peer not remembered) it is handed back to be
    /// sent as a confirmable message: dropping it could leave an observer on a stale
    /// state for good (RFC 7641 §4.5), and a CON waits for its ACK instead of adding
    /// to the NON rate.
    pub fn hold(
        &mut self,
        now: Instant,
        peer: SocketAddr,
        token: Token,
        bytes: Vec<u8>,
        at: Instant,
    ) -> Hold {
        let len = bytes.len();
        let room = MAX_HELD_BYTES.saturating_sub(self.held_bytes);
        let Some(e) = self.entry(now, peer) else {
            self.stats.non_upgraded += 1;
            return Hold::NoRoom(bytes);
        };
        let e = e.non();
        if let Some(slot) = e.held.iter_mut().find(|(t, _)| *t == token) {
            let old = std::mem::replace(&mut slot.1, bytes);
            self.held_bytes = self.held_bytes + len - old.len();
            self.stats.non_superseded += 1;
            return Hold::Held(None);
        }
        if len > room || e.held.len() >= MAX_HELD_PER_PEER {
            self.stats.non_upgraded += 1;
            return Hold::NoRoom(bytes);
        }
        e.held.push_back((token, bytes));
        let arm = !std::mem::replace(&mut e.release_armed, true);
        self.held_bytes += len;
        Hold::Held(arm.then_some(at))
    }

    /// What was learnt of `from` (its controller, confirmable messages in flight, held
    /// NON notifications) belongs to `to` from now on (a peer whose address changed:
    /// a DTLS session moved by its Connection ID); what `to` had is dropped. Returns
    /// whether NON notifications are held for `to`: then no release timer is armed
    /// for it, and [`PeerTable::release_held`] must be called for `to`.
    pub fn move_peer(&mut self, from: SocketAddr, to: SocketAddr) -> bool {
        if from == to {
            return false;
        }
        if let Some(old) = self.peers.remove(&to) {
            self.held_bytes -= old
                .non
                .as_ref()
                .map_or(0, |n| n.held.iter().map(|(_, b)| b.len()).sum::<usize>());
        }
        let Some(mut entry) = self.peers.remove(&from) else {
            return false;
        };
        let held = entry.held() > 0;
        if let Some(n) = entry.non.as_deref_mut() {
            n.release_armed = false;
        }
        self.peers.insert(to, entry);
        held
    }

    /// The release timer of `peer` fired: the held NON notification that may leave
    /// now (recorded as sent), and when to call again if more are held.
    pub fn release_held(
        &mut self,
        now: Instant,
        peer: SocketAddr,
    ) -> (Option<Vec<u8>>, Option<Instant>) {
        let used = self.secs(now);
        let Some(entry) = self.peers.get_mut(&peer) else {
            return (None, None);
        };
        let rto = entry.ctl.get().rto(now).unwrap_or_default();
        let Some(e) = entry.non.as_deref_mut() else {
            return (None, None);
        };
        e.release_armed = false;
        let mut out = None;
        if let Some((_, front)) = e.held.front() {
            // Held messages passed rule 1 when they were held; only the rate counts.
            if e.pacer
                .rate_allows_at(rto, front.len())
                .is_none_or(|at| at <= now)
            {
                let (_, bytes) = e.held.pop_front().expect("front exists");
                e.pacer.record(now, false);
                entry.last_used = used;
                self.held_bytes -= bytes.len();
                out = Some(bytes);
            }
        }
        let next = e.held.front().map(|(_, b)| {
            e.pacer
                .rate_allows_at(rto, b.len())
                .map_or(now, |at| at.max(now))
        });
        e.release_armed = next.is_some();
        (out, next)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::congestion::testing::{ms, Low};
    use crate::congestion::Algorithm;
    use std::sync::Arc;

    fn table(algorithm: Algorithm, max: usize) -> PeerTable {
        PeerTable::new(Arc::new(algorithm), Params::default(), max, Duration::ZERO)
    }

    fn peer(i: u16) -> SocketAddr {
        SocketAddr::from(([10, 0, (i >> 8) as u8, i as u8], 5683))
    }

    #[test]
    fn state_is_kept_per_peer_and_expires_after_255_s_unless_in_use() {
        let t0 = Instant::now();
        let mut t = table(Algorithm::Cocoa, 10);
        let a = t.begin(t0, peer(1), &mut Low);
        t.answered(t0 + ms(500), peer(1), &a);
        let learnt = t.rto(t0, peer(1)).unwrap();
        assert!(learnt < ms(2000), "{learnt:?}");
        assert_eq!(t.rto(t0, peer(2)), None);
        // An exchange in flight keeps the entry however long it takes.
        let b = t.begin(t0 + ms(1000), peer(3), &mut Low);
        t.expire(t0 + ms(1000) + MIN_LIFETIME);
        assert_eq!(t.len(), 1);
        assert!(t.rto(t0, peer(3)).is_some());
        t.answered(t0 + ms(300_000), peer(3), &b);
        t.expire(t0 + ms(300_000));
        assert_eq!(t.len(), 1);
        // Before a sweep, an expired entry is treated as new.
        t.begin(t0 + ms(300_000) + MIN_LIFETIME, peer(3), &mut Low);
        assert_eq!(t.rto(t0, peer(3)), Some(ms(2000)));
    }

    /// A client keeps congestion state for each server it observes (for 255 s after
    /// the registration): without NON pacing, which only a peer that gets messages
    /// outside exchanges needs, the entry is small.
    #[test]
    fn a_peer_with_only_exchanges_keeps_no_non_pacing() {
        let t0 = Instant::now();
        let mut t = table(Algorithm::Fasor, 4);
        let a = t.begin(t0, peer(1), &mut Low);
        t.answered(t0 + ms(100), peer(1), &a);
        assert!(t.peers[&peer(1)].non.is_none());
        assert_eq!(
            t.non_decide(t0 + ms(200), peer(1), 10),
            NonDecision::Confirmable,
            "a new peer's first messages are confirmable, as before"
        );
        assert!(t.peers[&peer(1)].non.is_none(), "deciding stores nothing");
        t.non_record(t0 + ms(200), peer(1), true);
        assert!(t.peers[&peer(1)].non.is_some());
        assert!(matches!(t.peers[&peer(1)].ctl, PeerController::Fasor(_)));
        assert!(
            std::mem::size_of::<Entry>() <= 48,
            "{}",
            std::mem::size_of::<Entry>()
        );
    }

    /// The room of a crowd of peers comes back when their state expires, and FASOR's
    /// state of each is small.
    #[test]
    fn expired_peers_give_the_table_room_back() {
        let t0 = Instant::now();
        let mut t = table(Algorithm::Fasor, 10_000);
        for i in 0..5_000 {
            let a = t.begin(t0, peer(i), &mut Low);
            t.answered(t0 + ms(100), peer(i), &a);
        }
        assert!(t.peers.capacity() >= 5_000);
        t.expire(t0 + ms(100) + MIN_LIFETIME);
        assert_eq!(
            t.len(),
            5_000,
            "kept to the second after the last use, rounded up"
        );
        t.expire(t0 + ms(1000) + MIN_LIFETIME);
        assert!(t.is_empty());
        assert!(
            t.peers.capacity() <= crate::tables::KEEP,
            "{}",
            t.peers.capacity()
        );
        let fasor = std::mem::size_of::<PeerController>();
        assert!(fasor <= 32, "FASOR's state per peer grew to {fasor} bytes");
    }

    #[test]
    fn a_full_table_keeps_known_peers_and_serves_new_ones_without_storing() {
        let t0 = Instant::now();
        let mut t = table(Algorithm::Fasor, 4);
        let a = t.begin(t0, peer(1), &mut Low);
        t.answered(t0 + ms(100), peer(1), &a);
        let learnt = t.rto(t0, peer(1));
        for i in 100..1100 {
            // An address flood: each gets a normal first exchange.
            let mut a = t.begin(t0 + ms(200), peer(i), &mut Low);
            assert!(a.timeout >= ms(2000));
            t.backoff(t0 + ms(2400), peer(i), &mut a);
            assert_eq!(a.retransmissions, 1);
        }
        assert_eq!(t.len(), 4);
        assert_eq!(t.rto(t0, peer(1)), learnt);
        assert!(t.stats().overflow >= 996);
        // Once the flood's entries expire they make room again (their last use is
        // kept to the second, rounded up).
        let later = t0 + ms(1000) + MIN_LIFETIME;
        t.begin(later, peer(2000), &mut Low);
        assert!(t.rto(later, peer(2000)).is_some());
    }

    #[test]
    fn a_sub_millisecond_round_trip_never_shortens_a_timeout_below_the_floor() {
        let t0 = Instant::now();
        for algorithm in [
            Algorithm::FasorK,
            Algorithm::Fasor,
            Algorithm::Cocoa,
            Algorithm::Karn,
        ] {
            let mut t = table(algorithm, 4);
            // Ten exchanges answered in 100 µs each: the estimate is far below 1 ms.
            let mut now = t0;
            for _ in 0..10 {
                let a = t.begin(now, peer(1), &mut Low);
                now += Duration::from_micros(100);
                t.answered(now, peer(1), &a);
            }
            assert!(
                t.rto(now, peer(1)).unwrap() < ms(10),
                "{algorithm:?} learnt the RTT"
            );
            let mut a = t.begin(now, peer(1), &mut Low);
            assert!(a.timeout >= ms(500), "{algorithm:?}: {:?}", a.timeout);
            let mut span = a.timeout;
            for k in 1..=4u32 {
                t.backoff(now + span, peer(1), &mut a);
                assert!(
                    a.timeout >= ms(500) * (1 << k),
                    "{algorithm:?} #{k}: {:?}",
                    a.timeout
                );
                span += a.timeout;
            }
            assert!(
                span >= Duration::from_millis(15_500),
                "{algorithm:?} gives up after {span:?}"
            );
        }
    }

    #[test]
    fn held_non_notifications_are_bounded_and_superseded_per_token() {
        let t0 = Instant::now();
        let mut t = table(Algorithm::Cocoa, 4);
        let tok = |i: u8| Token::new(&[i]).unwrap();
        let mut arms = 0;
        for i in 0..20u8 {
            match t.hold(t0, peer(1), tok(i % 6), vec![i; 10], t0) {
                Hold::Held(arm) => arms += usize::from(arm.is_some()),
                Hold::NoRoom(_) => panic!("room for six tokens"),
            }
        }
        // One release timer; six tokens, each later one replacing the one held.
        assert_eq!(arms, 1);
        assert_eq!(t.stats().non_superseded, 14);
        assert_eq!(t.held_bytes, 60);
        // Four more tokens: eight slots, so the last two are handed back for CON.
        for i in 100..102u8 {
            assert_eq!(
                t.hold(t0, peer(1), tok(i), vec![i; 10], t0),
                Hold::Held(None)
            );
        }
        for i in 102..104u8 {
            assert_eq!(
                t.hold(t0, peer(1), tok(i), vec![i; 10], t0),
                Hold::NoRoom(vec![i; 10])
            );
        }
        assert_eq!(t.stats().non_upgraded, 2);
        assert_eq!(t.held_bytes, 80);
        // The first leaves at once, the next one RTO (2 s) later.
        let (first, next) = t.release_held(t0, peer(1));
        assert!(first.is_some());
        assert_eq!(next, Some(t0 + ms(2000)));
        assert_eq!(
            t.release_held(t0 + ms(10), peer(1)),
            (None, Some(t0 + ms(2000)))
        );
        assert!(t.release_held(t0 + ms(2000), peer(1)).0.is_some());
        assert_eq!(t.held_bytes, 60);
        // Held messages keep the entry alive.
        t.expire(t0 + ms(1_000_000));
        assert_eq!(t.len(), 1);
    }

    /// An application's own algorithm runs boxed, with the same bookkeeping as the
    /// built-in ones: the factory's controller is the one that learns.
    #[test]
    fn a_custom_factory_runs_its_own_controllers() {
        #[derive(Debug)]
        struct Fixed;
        impl ControllerFactory for Fixed {
            fn build(&self, params: Params, _now: Instant) -> Box<dyn Controller> {
                Box::new(super::super::karn::Karn::new(params))
            }
        }
        let t0 = Instant::now();
        let mut t = PeerTable::new(Arc::new(Fixed), Params::default(), 4, Duration::ZERO);
        let mut a = t.begin(t0, peer(1), &mut Low);
        t.backoff(t0 + ms(2000), peer(1), &mut a);
        t.answered(t0 + ms(3000), peer(1), &a);
        assert!(matches!(t.peers[&peer(1)].ctl, PeerController::Boxed(_)));
        // Karn keeps the backed-off timer (4 s): FASOR would not.
        assert_eq!(t.rto(t0 + ms(3000), peer(1)), Some(ms(4000)));
        t.set_factory(Arc::new(Algorithm::FasorK));
        assert!(matches!(t.peers[&peer(1)].ctl, PeerController::Fasor(_)));
        assert_eq!(t.rto(t0 + ms(3000), peer(1)), Some(ms(2000)));
    }

    #[test]
    fn default_coap_sends_non_unpaced() {
        let t0 = Instant::now();
        let mut t = table(Algorithm::Default, 4);
        for _ in 0..20 {
            assert_eq!(t.non_decide(t0, peer(1), 50), NonDecision::Send);
            t.non_record(t0, peer(1), false);
        }
        let mut t = table(Algorithm::Fasor, 4);
        assert_eq!(t.non_decide(t0, peer(1), 50), NonDecision::Confirmable);
    }
}
