//! Congestion state per peer: bounded in number, forgotten when idle.
//!
//! Every peer a confirmable message goes to gets a [`PeerCongestion`] the first time,
//! up to `max_peers` peers. It is kept where the caller keeps everything else of the
//! peer (the endpoint's entry for the peer: one lookup of the address per datagram
//! reaches all of it), behind the [`States`] trait; [`Congestion`] holds what is shared
//! (the algorithm, the bound and how many peers have state, the held NON bytes, the
//! counters). At the bound, a new peer's exchanges run on a fresh controller that is
//! not kept (the algorithm's initial behaviour, as for a peer never seen), so a flood
//! of addresses can neither grow memory nor evict the state of peers already known.
//! State unused for `lifetime` (at least 255 s, draft-ietf-core-cocoa-03 §4.3; its last
//! use is kept to the second, rounded up, so up to a second longer) and not in use by
//! an exchange is dropped by [`Congestion::expire`], and treated as gone if found
//! before a sweep.

use super::fasor::Fasor;
use super::non::{NonDecision, NonPacer};
use super::{Algorithm, Attempt, Controller, ControllerFactory, Params, SharedFactory};
use crate::message::Token;
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
    /// Exchanges run on throw-away state because `max_peers` peers had state.
    pub overflow: u64,
    /// NON notifications sent as CON: to keep 2 of every 16 confirmable, or because
    /// there was no room to hold them back.
    pub non_upgraded: u64,
    /// NON notifications held back by the NON rate.
    pub non_delayed: u64,
    /// Held NON notifications replaced by a newer one for the same token.
    pub non_superseded: u64,
}

/// What [`Congestion::hold`] did with a NON notification.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Hold {
    /// Held (or replacing the one held for its token); with the time to call
    /// `release_held` when no release was pending for the peer yet.
    Held(Option<Instant>),
    /// No room to hold it: send these bytes as a confirmable message.
    NoRoom(Vec<u8>),
}

/// Where the peers' [`PeerCongestion`] are kept: one place per peer (the endpoint's
/// entry for it), each `None` while its peer has no state.
pub(crate) trait States {
    /// `peer`'s place, if it has one (else it runs on throw-away state).
    fn place(&mut self, peer: SocketAddr) -> Option<&mut Option<PeerCongestion>>;

    /// Runs `f` on every peer's place.
    fn for_each_place(&mut self, f: impl FnMut(&mut Option<PeerCongestion>));
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

/// One peer's congestion state: its controller, its confirmable messages in flight,
/// its last use, and the pacing of its NON notifications.
#[derive(Debug)]
pub(crate) struct PeerCongestion {
    ctl: PeerController,
    /// The pacing of messages outside exchanges (NON notifications), made with the
    /// first one: a peer that is only ever a client's server (e.g. each of the
    /// thousands of devices a mashup observes) never needs it.
    non: Option<Box<NonState>>,
    /// Confirmable messages to this peer awaiting an answer.
    in_flight: u32,
    /// When it was last used, in whole seconds after [`Congestion`]'s epoch, rounded
    /// up (so it lives at most a second longer than its lifetime, never less): a
    /// client may keep state for thousands of peers, and an `Instant` takes 16 bytes.
    last_used: u32,
}

/// What a peer that gets messages outside exchanges needs besides its controller.
#[derive(Debug, Default)]
struct NonState {
    pacer: NonPacer,
    held: VecDeque<(Token, Vec<u8>)>,
    /// A release timer is armed for the held messages.
    release_armed: bool,
}

impl PeerCongestion {
    /// NON notifications held back for the peer.
    fn held(&self) -> usize {
        self.non.as_ref().map_or(0, |n| n.held.len())
    }

    /// Bytes of the NON notifications held back for the peer.
    fn held_bytes(&self) -> usize {
        self.non
            .as_ref()
            .map_or(0, |n| n.held.iter().map(|(_, b)| b.len()).sum())
    }

    /// The peer's NON pacing, made on first use.
    fn non(&mut self) -> &mut NonState {
        self.non.get_or_insert_with(Box::default)
    }

    /// The peer's address changed (a DTLS session moved by its Connection ID) and
    /// this state goes with it: no release timer is armed for the new address.
    /// Returns whether NON notifications are held: then `release_held` must be
    /// called for the new address.
    pub(crate) fn moved(&mut self) -> bool {
        if let Some(n) = self.non.as_deref_mut() {
            n.release_armed = false;
        }
        self.held() > 0
    }
}

/// What the congestion states of all peers share, and their bound. See the
/// [module documentation](self).
#[derive(Debug)]
pub(crate) struct Congestion {
    factory: SharedFactory,
    params: Params,
    max_peers: usize,
    lifetime: Duration,
    /// Peers with state (a `Some` in their place).
    peers: usize,
    /// What states' `last_used` counts from: the first use.
    epoch: Option<Instant>,
    held_bytes: usize,
    /// When every state was last swept for expired ones at the bound (at most once
    /// per second).
    last_full_sweep: Option<Instant>,
    stats: CongestionStats,
}

impl Congestion {
    /// No peer with state yet; controllers come from `factory`. State lives at least
    /// `lifetime` (raised to `MIN_LIFETIME`, 255 s,) after its last use.
    pub(crate) fn new(
        factory: SharedFactory,
        params: Params,
        max_peers: usize,
        lifetime: Duration,
    ) -> Congestion {
        Congestion {
            factory,
            params,
            max_peers,
            lifetime: lifetime.max(MIN_LIFETIME),
            peers: 0,
            epoch: None,
            held_bytes: 0,
            last_full_sweep: None,
            stats: CongestionStats::default(),
        }
    }

    /// Uses `factory` for peers from now on and forgets what was learnt so far.
    pub(crate) fn set_factory(&mut self, factory: SharedFactory, states: &mut impl States) {
        self.factory = factory;
        let Some(epoch) = self.epoch else {
            return;
        };
        let (factory, params) = (self.factory.as_ref(), self.params);
        states.for_each_place(|place| {
            if let Some(s) = place {
                let last_used = epoch + Duration::from_secs(u64::from(s.last_used));
                s.ctl = PeerController::build(factory, params, last_used);
            }
        });
    }

    /// Peers with state.
    pub(crate) fn len(&self) -> usize {
        self.peers
    }

    /// Counters.
    pub(crate) fn stats(&self) -> CongestionStats {
        self.stats
    }

    /// `now` as a state's `last_used`: whole seconds after the epoch (set by the
    /// first call), rounded up.
    fn secs(&mut self, now: Instant) -> u32 {
        let epoch = *self.epoch.get_or_insert(now);
        let d = now.saturating_duration_since(epoch);
        let secs = d.as_secs() + u64::from(d.subsec_nanos() > 0);
        u32::try_from(secs).unwrap_or(u32::MAX)
    }

    /// Whether `s` is unused for the lifetime at `now`, and not in use.
    fn stale(&self, s: &PeerCongestion, now: Instant) -> bool {
        let last_used = self
            .epoch
            .map_or(now, |t| t + Duration::from_secs(u64::from(s.last_used)));
        s.in_flight == 0 && s.held() == 0 && now >= last_used + self.lifetime
    }

    /// Drops the state in `place` if it is unused for the lifetime and not in use;
    /// returns whether the peer still has state (it keeps its entry for it).
    pub(crate) fn expire(&mut self, now: Instant, place: &mut Option<PeerCongestion>) -> bool {
        match place {
            Some(s) if self.stale(s, now) => {
                *place = None;
                self.peers -= 1;
                false
            }
            Some(_) => true,
            None => false,
        }
    }

    /// Drops the state in `place` whatever it holds: its peer is gone (its address
    /// belongs to another now).
    pub(crate) fn forget(&mut self, place: &mut Option<PeerCongestion>) {
        if let Some(s) = place.take() {
            self.held_bytes -= s.held_bytes();
            self.peers -= 1;
        }
    }

    /// `peer`'s state, marked used at `now`: made if it has none and fewer than
    /// `max_peers` peers have state (at the bound, after sweeping every state for
    /// expired ones at most once per second), made afresh if it expired unswept.
    /// `None` at the bound.
    fn claim<'s>(
        &mut self,
        now: Instant,
        states: &'s mut impl States,
        peer: SocketAddr,
    ) -> Option<&'s mut PeerCongestion> {
        let claimed = states
            .place(peer)
            .is_some_and(|place| self.claim_place(now, place));
        if !claimed && self.sweep_due(now) {
            states.for_each_place(|place| {
                self.expire(now, place);
            });
            if let Some(place) = states.place(peer) {
                self.claim_place(now, place);
            }
        }
        states.place(peer)?.as_mut()
    }

    /// [`Congestion::claim`] for one place, without the sweep: whether it holds state.
    fn claim_place(&mut self, now: Instant, place: &mut Option<PeerCongestion>) -> bool {
        let stale = place.as_ref().is_some_and(|s| self.stale(s, now));
        if stale {
            *place = None;
            self.peers -= 1;
        }
        if place.is_none() && self.peers >= self.max_peers {
            return false;
        }
        let used = self.secs(now);
        match place {
            Some(s) => s.last_used = used,
            None => {
                *place = Some(PeerCongestion {
                    ctl: PeerController::build(self.factory.as_ref(), self.params, now),
                    non: None,
                    in_flight: 0,
                    last_used: used,
                });
                self.peers += 1;
            }
        }
        true
    }

    /// Whether every state should be swept for expired ones before a new peer is
    /// turned away at the bound: not more than once per second.
    fn sweep_due(&mut self, now: Instant) -> bool {
        let swept_recently = self
            .last_full_sweep
            .is_some_and(|t| now < t + Duration::from_secs(1));
        if !swept_recently {
            self.last_full_sweep = Some(now);
        }
        !swept_recently
    }

    /// Runs `f` on the peer's controller and its count in flight, or on a throw-away
    /// controller at the bound.
    fn with_controller<R>(
        &mut self,
        now: Instant,
        states: &mut impl States,
        peer: SocketAddr,
        f: impl FnOnce(&mut dyn Controller, &mut u32) -> R,
    ) -> R {
        match self.claim(now, states, peer) {
            Some(s) => f(s.ctl.get(), &mut s.in_flight),
            None => {
                self.stats.overflow += 1;
                let mut scratch = PeerController::build(self.factory.as_ref(), self.params, now);
                f(scratch.get(), &mut 0)
            }
        }
    }

    /// A confirmable message leaves for `peer` for the first time: its timing.
    pub(crate) fn begin(
        &mut self,
        now: Instant,
        states: &mut impl States,
        peer: SocketAddr,
        rng: &mut dyn RngCore,
    ) -> Attempt {
        let mut a = self.with_controller(now, states, peer, |ctl, in_flight| {
            let a = ctl.first_timeout(now, *in_flight as usize, rng);
            *in_flight += 1;
            a
        });
        self.apply_floor(&mut a);
        a
    }

    /// The timeout of `attempt` expired: the next timeout, counting the retransmission.
    pub(crate) fn backoff(
        &mut self,
        now: Instant,
        states: &mut impl States,
        peer: SocketAddr,
        attempt: &mut Attempt,
    ) {
        self.with_controller(now, states, peer, |ctl, _| ctl.next_timeout(now, attempt));
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
    pub(crate) fn answered(
        &mut self,
        now: Instant,
        states: &mut impl States,
        peer: SocketAddr,
        attempt: &Attempt,
    ) {
        self.with_controller(now, states, peer, |ctl, in_flight| {
            *in_flight = in_flight.saturating_sub(1);
            ctl.on_answer(now, attempt);
        });
    }

    /// The exchange of `attempt` ended without an answer (given up, cancelled).
    pub(crate) fn abandoned(
        &mut self,
        now: Instant,
        states: &mut impl States,
        peer: SocketAddr,
        attempt: &Attempt,
    ) {
        if let Some(Some(s)) = states.place(peer) {
            s.in_flight = s.in_flight.saturating_sub(1);
            s.ctl.get().on_abandon(now, attempt);
        }
    }

    /// The peer's current overall RTO estimate, if it has state and its algorithm keeps one.
    pub(crate) fn rto(
        &mut self,
        now: Instant,
        states: &mut impl States,
        peer: SocketAddr,
    ) -> Option<Duration> {
        states.place(peer)?.as_mut()?.ctl.get().rto(now)
    }

    /// What to do with a NON of `bytes` bytes outside an exchange (see [`super::non`]).
    /// Algorithms without an RTO estimate always send.
    pub(crate) fn non_decide(
        &mut self,
        now: Instant,
        states: &mut impl States,
        peer: SocketAddr,
        bytes: usize,
    ) -> NonDecision {
        let decision = match self.claim(now, states, peer) {
            Some(s) => match s.ctl.get().rto(now) {
                None => NonDecision::Send,
                Some(rto) => match &s.non {
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
    pub(crate) fn non_record(
        &mut self,
        now: Instant,
        states: &mut impl States,
        peer: SocketAddr,
        confirmable: bool,
    ) {
        if let Some(s) = self.claim(now, states, peer) {
            s.non().pacer.record(now, confirmable);
        }
    }

    /// Holds a NON notification for `token` that may leave at `at` (from
    /// [`Congestion::non_decide`]); one already held for the token is replaced. With no
    /// room to hold it (`MAX_HELD_PER_PEER` other tokens held for the peer,
    /// `MAX_HELD_BYTES` reached, or the peer not remembered) it is handed back to be
    /// sent as a confirmable message: dropping it could leave an observer on a stale
    /// state for good (RFC 7641 §4.5), and a CON waits for its ACK instead of adding
    /// to the NON rate.
    pub(crate) fn hold(
        &mut self,
        now: Instant,
        states: &mut impl States,
        peer: SocketAddr,
        token: Token,
        bytes: Vec<u8>,
        at: Instant,
    ) -> Hold {
        let len = bytes.len();
        let room = MAX_HELD_BYTES.saturating_sub(self.held_bytes);
        let Some(s) = self.claim(now, states, peer) else {
            self.stats.non_upgraded += 1;
            return Hold::NoRoom(bytes);
        };
        let n = s.non();
        if let Some(slot) = n.held.iter_mut().find(|(t, _)| *t == token) {
            let old = std::mem::replace(&mut slot.1, bytes);
            self.held_bytes = self.held_bytes + len - old.len();
            self.stats.non_superseded += 1;
            return Hold::Held(None);
        }
        if len > room || n.held.len() >= MAX_HELD_PER_PEER {
            self.stats.non_upgraded += 1;
            return Hold::NoRoom(bytes);
        }
        n.held.push_back((token, bytes));
        let arm = !std::mem::replace(&mut n.release_armed, true);
        self.held_bytes += len;
        Hold::Held(arm.then_some(at))
    }

    /// The release timer of `peer` fired: the held NON notification that may leave
    /// now (recorded as sent), and when to call again if more are held.
    pub(crate) fn release_held(
        &mut self,
        now: Instant,
        states: &mut impl States,
        peer: SocketAddr,
    ) -> (Option<Vec<u8>>, Option<Instant>) {
        let used = self.secs(now);
        let Some(Some(state)) = states.place(peer) else {
            return (None, None);
        };
        let rto = state.ctl.get().rto(now).unwrap_or_default();
        let Some(n) = state.non.as_deref_mut() else {
            return (None, None);
        };
        n.release_armed = false;
        let mut out = None;
        if let Some((_, front)) = n.held.front() {
            // Held messages passed rule 1 when they were held; only the rate counts.
            if n.pacer
                .rate_allows_at(rto, front.len())
                .is_none_or(|at| at <= now)
            {
                let (_, bytes) = n.held.pop_front().expect("front exists");
                n.pacer.record(now, false);
                state.last_used = used;
                self.held_bytes -= bytes.len();
                out = Some(bytes);
            }
        }
        let next = n.held.front().map(|(_, b)| {
            n.pacer
                .rate_allows_at(rto, b.len())
                .map_or(now, |at| at.max(now))
        });
        n.release_armed = next.is_some();
        (out, next)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::congestion::testing::{ms, Low};
    use crate::congestion::Algorithm;
    use hashbrown::HashMap;
    use std::sync::Arc;

    type Places = HashMap<SocketAddr, Option<PeerCongestion>>;

    impl States for Places {
        fn place(&mut self, peer: SocketAddr) -> Option<&mut Option<PeerCongestion>> {
            Some(self.entry(peer).or_default())
        }
        fn for_each_place(&mut self, f: impl FnMut(&mut Option<PeerCongestion>)) {
            self.values_mut().for_each(f);
        }
    }

    /// The congestion state of the tests' peers, kept by address as the endpoint
    /// keeps it in its peer entries, with the calls the endpoint makes.
    struct Table {
        cc: Congestion,
        places: Places,
    }

    impl Table {
        fn new(factory: SharedFactory, max: usize) -> Table {
            Table {
                cc: Congestion::new(factory, Params::default(), max, Duration::ZERO),
                places: Places::new(),
            }
        }
        fn begin(&mut self, now: Instant, peer: SocketAddr, rng: &mut dyn RngCore) -> Attempt {
            self.cc.begin(now, &mut self.places, peer, rng)
        }
        fn backoff(&mut self, now: Instant, peer: SocketAddr, attempt: &mut Attempt) {
            self.cc.backoff(now, &mut self.places, peer, attempt)
        }
        fn answered(&mut self, now: Instant, peer: SocketAddr, attempt: &Attempt) {
            self.cc.answered(now, &mut self.places, peer, attempt)
        }
        fn rto(&mut self, now: Instant, peer: SocketAddr) -> Option<Duration> {
            self.cc.rto(now, &mut self.places, peer)
        }
        fn non_decide(&mut self, now: Instant, peer: SocketAddr, bytes: usize) -> NonDecision {
            self.cc.non_decide(now, &mut self.places, peer, bytes)
        }
        fn non_record(&mut self, now: Instant, peer: SocketAddr, confirmable: bool) {
            self.cc.non_record(now, &mut self.places, peer, confirmable)
        }
        fn hold(&mut self, now: Instant, peer: SocketAddr, token: Token, bytes: Vec<u8>) -> Hold {
            self.cc.hold(now, &mut self.places, peer, token, bytes, now)
        }
        fn release_held(
            &mut self,
            now: Instant,
            peer: SocketAddr,
        ) -> (Option<Vec<u8>>, Option<Instant>) {
            self.cc.release_held(now, &mut self.places, peer)
        }
        /// The endpoint's sweep: a peer's place goes with its state.
        fn expire(&mut self, now: Instant) {
            self.places.retain(|_, place| self.cc.expire(now, place));
        }
        fn len(&self) -> usize {
            self.cc.len()
        }
        fn stats(&self) -> CongestionStats {
            self.cc.stats()
        }
        fn state(&self, peer: SocketAddr) -> &PeerCongestion {
            self.places[&peer].as_ref().expect("the peer has state")
        }
    }

    fn table(algorithm: Algorithm, max: usize) -> Table {
        Table::new(Arc::new(algorithm), max)
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
        assert!(t.state(peer(1)).non.is_none());
        assert_eq!(
            t.non_decide(t0 + ms(200), peer(1), 10),
            NonDecision::Confirmable,
            "a new peer's first messages are confirmable, as before"
        );
        assert!(t.state(peer(1)).non.is_none(), "deciding stores nothing");
        t.non_record(t0 + ms(200), peer(1), true);
        assert!(t.state(peer(1)).non.is_some());
        assert!(matches!(t.state(peer(1)).ctl, PeerController::Fasor(_)));
        assert!(
            std::mem::size_of::<Option<PeerCongestion>>() <= 48,
            "{}",
            std::mem::size_of::<Option<PeerCongestion>>()
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
        t.expire(t0 + ms(100) + MIN_LIFETIME);
        assert_eq!(
            t.len(),
            5_000,
            "kept to the second after the last use, rounded up"
        );
        t.expire(t0 + ms(1000) + MIN_LIFETIME);
        assert_eq!(t.len(), 0);
        assert!(t.places.is_empty(), "the places go with their state");
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
            match t.hold(t0, peer(1), tok(i % 6), vec![i; 10]) {
                Hold::Held(arm) => arms += usize::from(arm.is_some()),
                Hold::NoRoom(_) => panic!("room for six tokens"),
            }
        }
        // One release timer; six tokens, each later one replacing the one held.
        assert_eq!(arms, 1);
        assert_eq!(t.stats().non_superseded, 14);
        assert_eq!(t.cc.held_bytes, 60);
        // Four more tokens: eight slots, so the last two are handed back for CON.
        for i in 100..102u8 {
            assert_eq!(t.hold(t0, peer(1), tok(i), vec![i; 10]), Hold::Held(None));
        }
        for i in 102..104u8 {
            assert_eq!(
                t.hold(t0, peer(1), tok(i), vec![i; 10]),
                Hold::NoRoom(vec![i; 10])
            );
        }
        assert_eq!(t.stats().non_upgraded, 2);
        assert_eq!(t.cc.held_bytes, 80);
        // The first leaves at once, the next one RTO (2 s) later.
        let (first, next) = t.release_held(t0, peer(1));
        assert!(first.is_some());
        assert_eq!(next, Some(t0 + ms(2000)));
        assert_eq!(
            t.release_held(t0 + ms(10), peer(1)),
            (None, Some(t0 + ms(2000)))
        );
        assert!(t.release_held(t0 + ms(2000), peer(1)).0.is_some());
        assert_eq!(t.cc.held_bytes, 60);
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
        let mut t = Table::new(Arc::new(Fixed), 4);
        let mut a = t.begin(t0, peer(1), &mut Low);
        t.backoff(t0 + ms(2000), peer(1), &mut a);
        t.answered(t0 + ms(3000), peer(1), &a);
        assert!(matches!(t.state(peer(1)).ctl, PeerController::Boxed(_)));
        // Karn keeps the backed-off timer (4 s): FASOR would not.
        assert_eq!(t.rto(t0 + ms(3000), peer(1)), Some(ms(4000)));
        t.cc.set_factory(Arc::new(Algorithm::FasorK), &mut t.places);
        assert!(matches!(t.state(peer(1)).ctl, PeerController::Fasor(_)));
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

    /// A moved state needs its release timer armed again at the new address; a
    /// forgotten one gives back its place under the bound and its held bytes.
    #[test]
    fn a_moved_state_asks_for_a_release_and_a_forgotten_one_gives_its_room_back() {
        let t0 = Instant::now();
        let mut t = table(Algorithm::Cocoa, 1);
        let tok = Token::new(&[1]).unwrap();
        assert_eq!(t.hold(t0, peer(1), tok, vec![0; 10]), Hold::Held(Some(t0)));
        let mut place = t.places.remove(&peer(1)).unwrap();
        assert!(place.as_mut().unwrap().moved());
        t.places.insert(peer(2), place);
        assert!(
            t.release_held(t0, peer(2)).0.is_some(),
            "released at the new address"
        );
        assert_eq!(t.cc.held_bytes, 0);
        let tok = Token::new(&[2]).unwrap();
        assert!(matches!(
            t.hold(t0, peer(2), tok, vec![0; 10]),
            Hold::Held(_)
        ));
        assert_eq!(t.cc.held_bytes, 10);
        // At the bound (one peer): another peer runs on throw-away state ...
        t.begin(t0, peer(3), &mut Low);
        assert_eq!(t.stats().overflow, 1);
        // ... until the peer holding it is gone.
        let mut gone = t.places.remove(&peer(2)).unwrap();
        t.cc.forget(&mut gone);
        assert!(gone.is_none());
        assert_eq!((t.len(), t.cc.held_bytes), (0, 0));
        t.begin(t0, peer(3), &mut Low);
        assert_eq!((t.len(), t.stats().overflow), (1, 1));
    }
}
