//! The fan-out on a sans-IO endpoint with explicit time: coalescing, sharing, bounded
//! work per step, pacing, and the memory and budget coming back.

use super::*;
use crate::metrics::LimitCounters;
use crate::server::layer::ObserverExtras;
use cobalt_proto::congestion::Algorithm;
use cobalt_proto::endpoint::{Endpoint, EndpointConfig, Event};
use cobalt_proto::message::{codec, MessageType, Token};
use cobalt_proto::observe::relations::ConPolicy;
use std::cell::Cell;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::time::Duration;

/// A GET handler over a shared state: answers "s<state>" (with the Accept value when
/// there is one); reads the peer when `per_peer`; is left pending when `defer`.
struct Handler {
    state: Rc<Cell<u32>>,
    runs: usize,
    per_peer: bool,
    defer: bool,
    pending: Vec<Production>,
}

impl Handler {
    fn new(state: &Rc<Cell<u32>>) -> Handler {
        Handler {
            state: state.clone(),
            runs: 0,
            per_peer: false,
            defer: false,
            pending: Vec::new(),
        }
    }

    fn answer(&self, request: &Message) -> Response {
        let accept = request
            .options
            .accept()
            .map_or(String::new(), |a| format!("/{a}"));
        Response::content(format!("s{}{accept}", self.state.get()))
    }
}

impl Producer for Handler {
    fn produce(
        &mut self,
        _peer: SocketAddr,
        request: Message,
        _extras: Option<&ObserverExtras>,
        production: Production,
    ) -> Option<(Response, Production)> {
        self.runs += 1;
        if self.per_peer {
            production.peer_read.store(true, Ordering::Relaxed);
        }
        if self.defer {
            self.pending.push(production);
            return None;
        }
        Some((self.answer(&request), production))
    }
}

fn peer(i: u32) -> SocketAddr {
    SocketAddr::from(([10, (i >> 16) as u8, (i >> 8) as u8, i as u8], 5683))
}

fn key(i: u32) -> RelationKey {
    (peer(i), Token::new(&i.to_be_bytes()).unwrap())
}

fn registration(accept: Option<u16>) -> Message {
    let mut m = Message::new(MessageType::Confirmable, Code::GET, 1);
    m.options.set_uri_path("/state");
    m.options.set_uint(opt::OBSERVE, 0);
    if let Some(a) = accept {
        m.options.set_uint(opt::ACCEPT, u32::from(a));
    }
    m
}

struct Setup {
    fan: FanOut,
    ep: Endpoint,
    obs: Observable,
    inbox: Arc<crate::changes::ChangeInbox>,
    budget: Arc<ObserverBudget>,
    now: Instant,
}

fn setup(limits: ServerLimits, observers: u32, accept: impl Fn(u32) -> Option<u16>) -> Setup {
    let now = Instant::now();
    let obs = Observable::new();
    let inbox = Arc::new(crate::changes::ChangeInbox::default());
    obs.attach(vec![inbox.clone()]);
    let budget = Arc::new(ObserverBudget::new(Arc::new(LimitCounters::default())));
    let blocks = BlockLimits {
        szx: limits.block_szx,
        max_bert_block: 0,
    };
    let mut fan = FanOut::new(vec![obs.clone()], None, budget.clone(), limits, blocks);
    for i in 0..observers {
        let req = registration(accept(i));
        fan.register(&obs, key(i), req, now, 0).unwrap();
    }
    Setup {
        fan,
        // Address validation and the NON rate of the peer's congestion control
        // (CoCoA §5) are the endpoint's, and tested there: these observers count as
        // verified, and RFC 7252's timers (no RTO estimate) send every NON at once, so
        // what these tests see is the fan-out's own policy.
        ep: Endpoint::new(
            EndpointConfig {
                amplification_factor: 0,
                congestion_control: Algorithm::Default,
                ..EndpointConfig::default()
            },
            now,
        ),
        obs,
        inbox,
        budget,
        now,
    }
}

/// What the observers got: per peer, the notifications (type, payload); and the last
/// Observe number and message ID each got.
#[derive(Default)]
struct Seen {
    got: HashMap<SocketAddr, Vec<(MessageType, String)>>,
    last: HashMap<SocketAddr, (u32, u16)>,
}

impl std::ops::Deref for Seen {
    type Target = HashMap<SocketAddr, Vec<(MessageType, String)>>;

    fn deref(&self) -> &Self::Target {
        &self.got
    }
}

impl Seen {
    fn new() -> Seen {
        Seen::default()
    }
}

/// Takes what the endpoint sends, checking that each observer's notifications have
/// rising Observe numbers (so that a client takes each for newer than the last);
/// a retransmission repeats its number.
fn drain(ep: &mut Endpoint, seen: &mut Seen) -> usize {
    let mut n = 0;
    while let Some(t) = ep.poll_transmit() {
        let m = codec::decode(&t.bytes).unwrap();
        if let Some(seq) = m.options.observe() {
            let prev = seen.last.insert(t.peer, (seq, m.mid));
            assert!(
                prev.is_none_or(|(p, mid)| seq > p || mid == m.mid),
                "{}: {prev:?} then {seq}",
                t.peer
            );
        }
        seen.got
            .entry(t.peer)
            .or_default()
            .push((m.mtype, String::from_utf8_lossy(&m.payload).into_owned()));
        n += 1;
    }
    n
}

impl Setup {
    fn change(&mut self) {
        self.obs.changed();
        self.fan.on_changes(self.inbox.take());
    }

    /// Steps until there is no work, returning the largest number of datagrams one
    /// step produced.
    fn run(&mut self, h: &mut Handler, budget: usize, seen: &mut Seen) -> usize {
        let mut most = 0;
        while self.fan.has_work() {
            self.fan.step(&mut self.ep, h, self.now, budget);
            most = most.max(drain(&mut self.ep, seen));
        }
        most
    }
}

fn non_con() -> ServerLimits {
    ServerLimits {
        con: ConPolicy {
            every: 1_000_000,
            ..ConPolicy::default()
        },
        ..ServerLimits::default()
    }
}

#[test]
fn a_burst_skips_states_and_every_observer_ends_with_the_latest() {
    let mut s = setup(non_con(), 1000, |_| None);
    let state = Rc::new(Cell::new(0));
    let mut h = Handler::new(&state);
    let mut seen = Seen::new();
    // 100 changes come in while the shard works a step of 64 at a time.
    for v in 1..=100 {
        state.set(v);
        s.change();
        s.fan.step(&mut s.ep, &mut h, s.now, 64);
        drain(&mut s.ep, &mut seen);
    }
    s.run(&mut h, 64, &mut seen);
    assert_eq!(seen.len(), 1000);
    let total: usize = seen.values().map(Vec::len).sum();
    for got in seen.values() {
        assert_eq!(
            got.last().unwrap().1,
            "s100",
            "every observer ends with the latest"
        );
    }
    // 1000 observers × 100 states would be 100,000 notifications.
    assert!(total < 10_000, "{total} notifications: states are skipped");
    // One handler run per round, not per observer.
    assert!(h.runs <= 20, "{} handler runs", h.runs);
    assert_eq!(s.fan.stats().productions, h.runs as u64);
    assert_eq!(s.fan.backlog(), 0);
}

#[test]
fn work_per_step_is_bounded_however_many_observers() {
    let mut s = setup(non_con(), 10_000, |_| None);
    let state = Rc::new(Cell::new(1));
    let mut h = Handler::new(&state);
    s.change();
    assert_eq!(s.fan.backlog(), 10_000);
    let mut seen = Seen::new();
    let mut steps = 0;
    while s.fan.has_work() {
        s.fan.step(&mut s.ep, &mut h, s.now, 256);
        assert!(drain(&mut s.ep, &mut seen) <= 256);
        steps += 1;
    }
    assert!(steps >= 10_000 / 256, "{steps} steps");
    assert_eq!(seen.len(), 10_000);
    assert_eq!(h.runs, 1, "the handler ran once for 10,000 observers");
}

#[test]
fn the_handler_runs_per_request_variant_and_per_observer_when_it_reads_the_peer() {
    // Two Accept values: two productions per change.
    let mut s = setup(non_con(), 100, |i| Some((i % 2) as u16 * 50));
    let state = Rc::new(Cell::new(7));
    let mut h = Handler::new(&state);
    s.change();
    let mut seen = Seen::new();
    s.run(&mut h, 1000, &mut seen);
    assert_eq!(h.runs, 2);
    assert_eq!(seen[&peer(0)].last().unwrap().1, "s7/0");
    assert_eq!(seen[&peer(1)].last().unwrap().1, "s7/50");
    // A handler that reads the peer runs for each observer.
    let mut h = Handler::new(&state);
    h.per_peer = true;
    s.change();
    s.run(&mut h, 1000, &mut seen);
    assert_eq!(h.runs, 100);
}

#[test]
fn a_handler_on_an_executor_runs_once_and_its_answer_reaches_every_waiting_observer() {
    let mut s = setup(non_con(), 300, |_| None);
    let state = Rc::new(Cell::new(3));
    let mut h = Handler::new(&state);
    h.defer = true;
    s.change();
    let mut seen = Seen::new();
    s.run(&mut h, 64, &mut seen);
    assert!(seen.is_empty(), "nothing until the answer comes");
    assert_eq!((h.runs, h.pending.len()), (1, 1));
    let production = h.pending.pop().unwrap();
    s.fan
        .produced(&mut s.ep, s.now, production, Response::content("s3"));
    s.run(&mut h, 64, &mut seen);
    assert_eq!(seen.len(), 300);
    assert!(seen.values().all(|v| v.len() == 1 && v[0].1 == "s3"));
    assert_eq!(h.runs, 1);
}

#[test]
fn an_unacknowledged_con_holds_the_next_notification_which_then_has_the_latest_state() {
    let limits = ServerLimits {
        con: ConPolicy {
            every: 1, // every notification confirmable
            ..ConPolicy::default()
        },
        ..ServerLimits::default()
    };
    let mut s = setup(limits, 2, |_| None);
    let state = Rc::new(Cell::new(1));
    let mut h = Handler::new(&state);
    let mut seen = Seen::new();
    s.change();
    s.run(&mut h, 100, &mut seen);
    let (slow, quick) = (peer(0), peer(1));
    assert_eq!(seen[&slow], [(MessageType::Confirmable, "s1".to_string())]);
    // The quick observer acknowledges each CON; the slow one does not, yet.
    let last_mid = |s: &Setup, i: u32| s.fan.last_mid(&key(i)).expect("sent one");
    for v in 2..=5 {
        let mid = last_mid(&s, 1);
        s.ep.handle_datagram(s.now, quick, &codec::encode(&Message::empty_ack(mid)));
        s.fan.on_heard(&s.ep, quick);
        state.set(v);
        s.change();
        s.run(&mut h, 100, &mut seen);
    }
    assert_eq!(seen[&quick].len(), 5, "the quick observer got every state");
    assert_eq!(
        seen[&slow].len(),
        1,
        "nothing new while its CON is unacknowledged"
    );
    assert_eq!(s.fan.stats().deferred, 1);
    // Its ACK comes: it gets the latest state, once.
    let mid = last_mid(&s, 0);
    s.ep.handle_datagram(s.now, slow, &codec::encode(&Message::empty_ack(mid)));
    s.fan.on_heard(&s.ep, slow);
    s.run(&mut h, 100, &mut seen);
    assert_eq!(seen[&slow].len(), 2);
    assert_eq!(seen[&slow][1], (MessageType::Confirmable, "s5".to_string()));
}

#[test]
fn pacing_holds_notifications_to_the_interval_and_sends_the_latest_when_it_passes() {
    let limits = ServerLimits {
        observe_min_interval: Duration::from_secs(1),
        ..non_con()
    };
    let mut s = setup(limits, 1, |_| None);
    let state = Rc::new(Cell::new(1));
    let mut h = Handler::new(&state);
    let mut seen = Seen::new();
    s.change();
    s.run(&mut h, 10, &mut seen);
    for v in 2..=9 {
        s.now += Duration::from_millis(100);
        state.set(v);
        s.change();
        s.run(&mut h, 10, &mut seen);
    }
    assert_eq!(seen[&peer(0)].len(), 1, "held for the interval");
    let due = s
        .fan
        .poll_timeout()
        .expect("a timer for the held notification");
    assert_eq!(
        due,
        s.now - Duration::from_millis(800) + Duration::from_secs(1)
    );
    s.now = due;
    s.fan.handle_timeout(s.now);
    s.run(&mut h, 10, &mut seen);
    let got = &seen[&peer(0)];
    assert_eq!(got.len(), 2);
    assert_eq!(got[1].1, "s9");
    assert_eq!(s.fan.poll_timeout(), None);
}

#[test]
fn an_observer_that_never_acknowledges_is_dropped_and_its_budget_given_back() {
    let limits = ServerLimits {
        con: ConPolicy {
            every: 1,
            ..ConPolicy::default()
        },
        ..ServerLimits::default()
    };
    let mut s = setup(limits, 3, |_| None);
    assert_eq!(s.obs.observer_count(), 3);
    let state = Rc::new(Cell::new(1));
    let mut h = Handler::new(&state);
    let mut seen = Seen::new();
    s.change();
    s.run(&mut h, 10, &mut seen);
    // Nobody acknowledges: the retransmissions run out (virtual time).
    for _ in 0..200 {
        let Some(t) = s.ep.poll_timeout() else { break };
        s.now = s.now.max(t);
        s.ep.handle_timeout(s.now);
        while let Some(ev) = s.ep.poll_event() {
            if let Event::ResponseFailed { id, .. } = ev {
                s.fan.on_delivery_failed(id);
            }
        }
        drain(&mut s.ep, &mut seen);
    }
    assert_eq!(s.fan.len(), 0);
    assert_eq!(s.obs.observer_count(), 0);
    assert_eq!(s.budget.total(), 0);
}

#[test]
fn a_deleted_resource_tells_its_observers_a_step_at_a_time_and_the_tables_shrink() {
    let mut s = setup(non_con(), 5000, |_| None);
    let peak = s.fan.capacity();
    assert!(peak >= 5000);
    s.obs.deleted();
    s.fan.on_changes(s.inbox.take());
    assert_eq!(s.fan.len(), 0, "relations end at once");
    assert_eq!(s.budget.total(), 0);
    assert!(s.fan.capacity() <= 64, "capacity {}", s.fan.capacity());
    let mut h = Handler::new(&Rc::new(Cell::new(0)));
    let mut seen = Seen::new();
    let most = s.run(&mut h, 500, &mut seen);
    assert!(most <= 500);
    assert_eq!(seen.len(), 5000);
    assert!(seen
        .values()
        .all(|v| v.len() == 1 && v[0].0 == MessageType::Confirmable));
    assert_eq!(h.runs, 0);
}

#[test]
fn ended_observations_get_the_code_given_and_forgotten_ones_get_nothing() {
    let mut s = setup(non_con(), 20, |_| None);
    let mut h = Handler::new(&Rc::new(Cell::new(0)));
    s.obs.end_observations(Code::NOT_ACCEPTABLE);
    s.fan.on_changes(s.inbox.take());
    assert_eq!((s.fan.len(), s.obs.observer_count()), (0, 0));
    assert_eq!(s.budget.total(), 0);
    let mut codes = Vec::new();
    while s.fan.has_work() {
        s.fan.step(&mut s.ep, &mut h, s.now, 100);
        while let Some(t) = s.ep.poll_transmit() {
            let m = codec::decode(&t.bytes).unwrap();
            codes.push((t.peer, m.mtype, m.code));
        }
    }
    assert_eq!(codes.len(), 20, "{codes:?}");
    assert!(codes
        .iter()
        .all(|&(_, t, c)| t == MessageType::Confirmable && c == Code::NOT_ACCEPTABLE));
    // Registered again, then forgotten: the relations and budget go, nothing is sent,
    // and a change after it reaches nobody.
    for i in 0..20 {
        s.fan
            .register(&s.obs, key(i), registration(None), s.now, 0)
            .unwrap();
    }
    assert_eq!(s.obs.observer_count(), 20);
    s.obs.forget_observers();
    s.fan.on_changes(s.inbox.take());
    assert_eq!((s.fan.len(), s.obs.observer_count()), (0, 0));
    assert_eq!(s.budget.total(), 0);
    assert!(!s.fan.has_work());
    s.change();
    let mut seen = Seen::new();
    s.run(&mut h, 100, &mut seen);
    assert!(seen.is_empty(), "sent after forgetting: {:?}", seen.got);
    assert_eq!(h.runs, 0);
    // A new observer after the reboot is notified as usual.
    s.fan
        .register(&s.obs, key(99), registration(None), s.now, 0)
        .unwrap();
    s.change();
    s.run(&mut h, 100, &mut seen);
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[&peer(99)][0].1, "s0");
}

#[test]
fn the_notification_key_ignores_what_does_not_change_the_answer() {
    let mut a = registration(Some(0));
    let mut b = registration(Some(0));
    a.token = Token::new(&[1]).unwrap();
    b.token = Token::new(&[2, 3]).unwrap();
    b.options.set_uint(opt::BLOCK2, 2);
    b.options.set(opt::ECHO, vec![9; 8]);
    assert_eq!(notification_key(&a), notification_key(&b));
    let c = registration(Some(50));
    assert_ne!(notification_key(&a), notification_key(&c));
    let mut d = registration(Some(0));
    d.options.set(opt::ETAG, vec![1]);
    assert_ne!(notification_key(&a), notification_key(&d));
}

/// Like [`drain`], and the observers acknowledge every confirmable notification (the
/// endpoint turns 2 of every 16 NON notifications into CON under CoCoA §5).
fn drain_and_ack(s: &mut Setup, seen: &mut Seen) {
    let mut acks = Vec::new();
    while let Some(t) = s.ep.poll_transmit() {
        let m = codec::decode(&t.bytes).unwrap();
        if m.mtype == MessageType::Confirmable {
            acks.push((t.peer, m.mid));
        }
        seen.got
            .entry(t.peer)
            .or_default()
            .push((m.mtype, String::from_utf8_lossy(&m.payload).into_owned()));
    }
    for (peer, mid) in acks {
        s.ep.handle_datagram(s.now, peer, &codec::encode(&Message::empty_ack(mid)));
        s.fan.on_heard(&s.ep, peer);
    }
}

#[test]
fn under_the_default_congestion_control_held_nons_still_end_with_the_latest_state() {
    let mut s = setup(non_con(), 100, |_| None);
    // The default algorithm paces NON notifications per peer (CoCoA §5).
    s.ep = Endpoint::new(
        EndpointConfig {
            amplification_factor: 0,
            ..EndpointConfig::default()
        },
        s.now,
    );
    let state = Rc::new(Cell::new(0));
    let mut h = Handler::new(&state);
    let mut seen = Seen::new();
    for v in 1..=20 {
        state.set(v);
        s.change();
        while s.fan.has_work() {
            s.fan.step(&mut s.ep, &mut h, s.now, 64);
            drain_and_ack(&mut s, &mut seen);
        }
    }
    for _ in 0..60 {
        s.now += Duration::from_secs(1);
        s.ep.handle_timeout(s.now);
        s.fan.handle_timeout(s.now);
        while s.fan.has_work() {
            s.fan.step(&mut s.ep, &mut h, s.now, 64);
            drain_and_ack(&mut s, &mut seen);
        }
        drain_and_ack(&mut s, &mut seen);
    }
    assert_eq!(seen.len(), 100);
    for got in seen.values() {
        assert_eq!(
            got.last().unwrap().1,
            "s20",
            "every observer ends with the latest"
        );
        assert!(
            got.len() < 20,
            "held NONs are replaced, not queued: {}",
            got.len()
        );
    }
}

/// A fan-out of one stream connection: subscribed to a resource only while it holds
/// relations of it; everything given back when it is dropped.
#[test]
fn a_subscriber_observes_only_while_it_holds_relations_and_gives_all_back_when_dropped() {
    let now = Instant::now();
    let (a, b) = (Observable::new(), Observable::new());
    let budget = Arc::new(ObserverBudget::new(Arc::new(LimitCounters::default())));
    let limits = ServerLimits {
        max_observers_per_ip: 3,
        ..ServerLimits::default()
    };
    let blocks = BlockLimits {
        szx: 6,
        max_bert_block: 0,
    };
    let inbox = Arc::new(crate::changes::ChangeInbox::default());
    let subscriber = |id| Subscriber {
        id,
        peer: peer(1),
        inbox: inbox.clone(),
    };
    let mut fan = FanOut::new(
        Vec::new(),
        Some(subscriber(1)),
        budget.clone(),
        limits.clone(),
        blocks,
    );
    assert_eq!((a.subscribers(), b.subscribers()), (0, 0));
    fan.register(&a, key(1), registration(None), now, 0)
        .unwrap();
    fan.register(&a, (peer(1), key(2).1), registration(None), now, 0)
        .unwrap();
    fan.register(&b, (peer(1), key(3).1), registration(None), now, 0)
        .unwrap();
    assert_eq!((a.subscribers(), b.subscribers()), (1, 1));
    assert_eq!(
        (a.observer_count(), b.observer_count(), budget.total()),
        (2, 1, 3)
    );
    // The address's budget is full: a fourth relation is refused, another connection
    // of the same address included.
    let mut other = FanOut::new(
        Vec::new(),
        Some(subscriber(2)),
        budget.clone(),
        limits,
        blocks,
    );
    assert_eq!(
        other.register(&b, key(1), registration(None), now, 0),
        Err(Refusal::PeerBudget)
    );
    // The same token observing another resource moves; the last relation of `a` ends
    // its subscription.
    fan.register(&b, key(1), registration(None), now, 0)
        .unwrap();
    assert_eq!((a.observer_count(), b.observer_count()), (1, 2));
    fan.end(&(peer(1), key(2).1));
    assert_eq!((a.subscribers(), a.observer_count()), (0, 0));
    // A change of `b` reaches the subscribed inbox.
    b.changed();
    assert_eq!(inbox.take().len(), 1);
    drop(fan);
    assert_eq!(
        (b.subscribers(), b.observer_count(), budget.total()),
        (0, 0, 0)
    );
    assert!(other
        .register(&b, key(1), registration(None), now, 0)
        .is_ok());
}

/// A layer that leaves notifications as they are, but asks to see each one (so the
/// fan-out takes the path that builds every observer's notification on its own).
struct Watching;

impl crate::server::Layer for Watching {
    fn on_notification(
        &self,
        _observer: &crate::server::layer::Observer<'_>,
        _notification: &mut Response,
    ) {
    }
}

/// The datagrams three changes send to `observers`, the CONs among them acknowledged
/// after each change; every third notification is confirmable by the policy.
fn three_changes(layered: bool, observers: u32) -> (Vec<(SocketAddr, Vec<u8>)>, FanOutStats) {
    let limits = ServerLimits {
        con: ConPolicy {
            every: 3,
            ..ConPolicy::default()
        },
        ..ServerLimits::default()
    };
    let mut s = setup(limits, observers, |i| (i % 2 == 0).then_some(50));
    let config = EndpointConfig {
        amplification_factor: 0,
        congestion_control: Algorithm::Default,
        ..EndpointConfig::default()
    };
    s.ep = Endpoint::with_seed(config, s.now, 7);
    if layered {
        let mut layers = Layers::default();
        layers.push(Arc::new(Watching));
        s.fan = std::mem::replace(
            &mut s.fan,
            FanOut::new(
                Vec::new(),
                None,
                s.budget.clone(),
                ServerLimits::default(),
                BlockLimits {
                    szx: 6,
                    max_bert_block: 0,
                },
            ),
        )
        .with_layers(layers, Scheme::Coap);
    }
    let state = Rc::new(Cell::new(0));
    let mut h = Handler::new(&state);
    let mut sent = Vec::new();
    for _ in 0..3 {
        state.set(state.get() + 1);
        s.now += Duration::from_secs(1);
        s.change();
        while s.fan.has_work() {
            s.fan.step(&mut s.ep, &mut h, s.now, 16);
            while let Some(t) = s.ep.poll_transmit() {
                sent.push((t.peer, t.bytes));
            }
        }
        for (peer, bytes) in &sent {
            let m = codec::decode(bytes).unwrap();
            if m.mtype == MessageType::Confirmable {
                s.ep.handle_datagram(s.now, *peer, &codec::encode(&Message::empty_ack(m.mid)));
                s.fan.on_heard(&s.ep, *peer);
            }
        }
    }
    for i in 0..observers {
        // The last datagram to each observer carries the MID the relation recorded.
        let last = sent.iter().rev().find(|(p, _)| *p == peer(i)).unwrap();
        let m = codec::decode(&last.1).unwrap();
        assert_eq!(s.fan.last_mid(&key(i)), Some(m.mid));
    }
    (sent, s.fan.stats())
}

#[test]
fn notifications_encoded_once_are_byte_for_byte_those_built_per_observer() {
    let (fast, fast_stats) = three_changes(false, 40);
    let (slow, slow_stats) = three_changes(true, 40);
    // Two groups (with and without Accept), one encoding each per change; none when a
    // layer sees every notification.
    assert_eq!(fast_stats.encoded, 6);
    assert_eq!(slow_stats.encoded, 0);
    assert_eq!(fast_stats.productions, slow_stats.productions);
    assert_eq!(fast.len(), 3 * 40);
    // Observers are visited in the order of a hash table and each address's first
    // message ID is random, so compare each observer's datagrams in order, the
    // message ID aside (it is checked against the relation's record above).
    let per_observer = |sent: &[(SocketAddr, Vec<u8>)]| {
        let mut by_peer: HashMap<SocketAddr, Vec<Vec<u8>>> = HashMap::new();
        for (peer, bytes) in sent {
            let mut bytes = bytes.clone();
            bytes[2..4].fill(0);
            by_peer.entry(*peer).or_default().push(bytes);
        }
        by_peer
    };
    assert_eq!(per_observer(&fast), per_observer(&slow));
    // Each observer's: its token, rising Observe numbers, distinct MIDs, NON NON CON.
    for i in 0..40 {
        let mine: Vec<Message> = fast
            .iter()
            .filter(|(p, _)| *p == peer(i))
            .map(|(_, b)| codec::decode(b).unwrap())
            .collect();
        assert_eq!(mine.len(), 3);
        let types: Vec<MessageType> = mine.iter().map(|m| m.mtype).collect();
        use MessageType::{Confirmable as Con, NonConfirmable as Non};
        assert_eq!(types, [Non, Non, Con], "observer {i}");
        let accept = if i % 2 == 0 { "/50" } else { "" };
        for (n, m) in mine.iter().enumerate() {
            assert_eq!(m.token, key(i).1);
            assert_eq!(m.code, Code::CONTENT);
            assert_eq!(m.payload, format!("s{}{accept}", n + 1).into_bytes());
        }
        let seqs: Vec<u32> = mine.iter().map(|m| m.options.observe().unwrap()).collect();
        assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{seqs:?}");
        let mids: std::collections::HashSet<u16> = mine.iter().map(|m| m.mid).collect();
        assert_eq!(mids.len(), 3);
    }
}

#[test]
fn an_observer_that_asked_for_a_block_size_gets_its_own_notification() {
    let mut s = setup(non_con(), 3, |_| None);
    // Observer 1 re-registers asking for 16-byte blocks (Block2 num 0, szx 0).
    let mut small = registration(None);
    small.options.set_uint(opt::BLOCK2, 0);
    s.fan.register(&s.obs, key(1), small, s.now, 0).unwrap();
    let state = Rc::new(Cell::new(7));
    let mut h = Handler::new(&state);
    s.change();
    s.fan.step(&mut s.ep, &mut h, s.now, 16);
    let mut blocks = HashMap::new();
    while let Some(t) = s.ep.poll_transmit() {
        let m = codec::decode(&t.bytes).unwrap();
        assert_eq!(m.payload, b"s7");
        blocks.insert(t.peer, m.block2().map(|b| b.szx));
    }
    assert_eq!(blocks.len(), 3);
    assert_eq!(blocks[&peer(1)], Some(0), "the block size it asked for");
    assert_eq!(blocks[&peer(0)], None);
    assert_eq!(blocks[&peer(2)], None);
    assert_eq!(
        s.fan.stats().encoded,
        1,
        "observers 0 and 2 share one encoding"
    );
}

#[test]
fn relations_registered_alike_share_one_copy_of_the_registration_until_the_last_ends() {
    let mut s = setup(non_con(), 100, |i| (i % 2 == 0).then_some(50));
    assert_eq!(s.fan.registrations.len(), 2, "with and without Accept");
    let (_, a) = s.fan.relations.get(&key(0)).unwrap();
    let (_, b) = s.fan.relations.get(&key(2)).unwrap();
    assert!(Arc::ptr_eq(&a.request, &b.request));
    assert_eq!(a.request.token, Token::EMPTY, "the token is the key's");
    // Observer 0 re-registers differently: a third copy; the old one is still held.
    s.fan
        .register(&s.obs, key(0), registration(Some(40)), s.now, 0)
        .unwrap();
    assert_eq!(s.fan.registrations.len(), 3);
    for i in (1..100).step_by(2) {
        s.fan.end(&key(i));
    }
    assert_eq!(
        s.fan.registrations.len(),
        2,
        "no relation without Accept is left"
    );
    s.fan.end(&key(0));
    assert_eq!(s.fan.registrations.len(), 1);
    for i in (2..100).step_by(2) {
        s.fan.end(&key(i));
    }
    assert!(s.fan.registrations.is_empty());
}

/// A layer that records the token of each registration it is shown.
struct Tokens(std::sync::Mutex<Vec<(Token, Token)>>);

impl crate::server::Layer for Tokens {
    fn on_notification(
        &self,
        observer: &crate::server::layer::Observer<'_>,
        _notification: &mut Response,
    ) {
        let seen = (observer.token(), observer.registration().token.clone());
        self.0.lock().unwrap().push(seen);
    }
}

#[test]
fn layers_see_each_registration_with_its_own_token() {
    let mut s = setup(non_con(), 3, |_| None);
    let tokens = Arc::new(Tokens(std::sync::Mutex::new(Vec::new())));
    let mut layers = Layers::default();
    layers.push(tokens.clone());
    let blocks = BlockLimits {
        szx: 6,
        max_bert_block: 0,
    };
    let bare = FanOut::new(Vec::new(), None, s.budget.clone(), non_con(), blocks);
    s.fan = std::mem::replace(&mut s.fan, bare).with_layers(layers, Scheme::Coap);
    let state = Rc::new(Cell::new(1));
    let mut h = Handler::new(&state);
    s.change();
    s.run(&mut h, 16, &mut Seen::new());
    let mut seen = tokens.0.lock().unwrap().clone();
    seen.sort_by_key(|(t, _)| t.as_bytes().to_vec());
    let expected: Vec<(Token, Token)> = (0..3).map(|i| (key(i).1, key(i).1)).collect();
    assert_eq!(seen, expected);
}

#[test]
fn an_observer_verified_after_registering_keeps_what_it_proved_and_what_layers_attached() {
    let mut s = setup(ServerLimits::default(), 0, |_| None);
    let credential = Arc::new(crate::transport::identity::Credential::PskIdentity(
        b"sensor-7".to_vec(),
    ));
    let extras =
        ObserverExtras::of_credential(Some(&credential)).expect("a credential makes extras");
    s.fan
        .await_verification(&s.obs, key(1), registration(None), s.now, 0)
        .unwrap();
    s.fan.keep_extras(key(1), extras);
    assert!(
        s.fan.extras.is_empty(),
        "nothing is kept outside the waiting entry"
    );
    s.fan.verified(&key(1));
    assert_eq!(s.fan.len(), 1);
    let kept = s
        .fan
        .extras
        .get(&key(1))
        .expect("the relation keeps its extras");
    assert_eq!(kept.credential.as_deref(), Some(&*credential));
}

/// What the layers attached to a registration from an address not yet verified
/// stays with it when it becomes a relation (an OSCORE layer needs it to protect the
/// notifications), and goes when the registration is forgotten instead.
#[test]
fn extras_of_a_registration_awaiting_verification_follow_it() {
    let mut s = setup(ServerLimits::default(), 0, |_| None);
    let mut extensions = crate::server::Extensions::new();
    extensions.insert(7u32);
    let extras = ObserverExtras {
        credential: None,
        extensions,
    };
    for verified in [true, false] {
        let obs = s.obs.clone();
        s.fan
            .await_verification(&obs, key(1), registration(None), s.now, 0)
            .unwrap();
        s.fan.keep_extras(key(1), extras.clone());
        if verified {
            s.fan.verified(&key(1));
            assert_eq!(s.fan.len(), 1);
            let kept = s.fan.extras.get(&key(1)).unwrap();
            assert_eq!(kept.extensions.get::<u32>(), Some(&7));
        }
        s.fan.end(&key(1));
        assert!(s.fan.extras.is_empty(), "verified: {verified}");
    }
}
