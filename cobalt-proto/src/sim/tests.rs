//! Tests of the simulator harness: applications, virtual time, determinism, rebinding.

use super::link::{LinkConfig, LossModel};
use super::net::{Bottleneck, LossyConfig, LossyNet, UDP_IPV4_HEADERS};
use super::*;
use crate::message::{Code, Message, MessageType};
use crate::session::SessionEvent;
use std::cell::RefCell;
use std::rc::Rc;

/// The servers of these tests answer 60 bytes to 7-byte requests: without the
/// amplification limit, which would add an address-verification round trip.
fn server_config() -> EndpointConfig {
    EndpointConfig {
        amplification_factor: 0,
        ..EndpointConfig::default()
    }
}

/// Answers every request with 2.05 and a 60-byte payload.
struct Server;

impl Application for Server {
    fn on_event(&mut self, ctx: &mut Ctx<'_>, event: SessionEvent) {
        if let SessionEvent::Request { id, .. } = event {
            let mut r = Message::new(MessageType::Acknowledgement, Code::CONTENT, 0);
            r.payload = vec![b'x'; 60];
            let now = ctx.now();
            ctx.session().respond(now, id, r).unwrap();
        }
    }
}

/// Sends `left` GETs one after another; records when each ends.
struct Client {
    server: SocketAddr,
    left: usize,
    done: Rc<RefCell<Vec<(usize, Instant)>>>,
    /// Rebind to this address after the first exchange.
    move_to: Option<SocketAddr>,
}

impl Client {
    fn next(&mut self, ctx: &mut Ctx<'_>) {
        if self.left == 0 {
            return;
        }
        self.left -= 1;
        let mut get = Message::new(MessageType::Confirmable, Code::GET, 0);
        get.options.set_uri_path("r");
        let now = ctx.now();
        ctx.session().request(now, self.server, get).unwrap();
    }
}

impl Application for Client {
    fn on_event(&mut self, ctx: &mut Ctx<'_>, event: SessionEvent) {
        if let SessionEvent::Response { response, .. } = event {
            assert_eq!(response.payload.len(), 60);
            self.done.borrow_mut().push((ctx.node(), ctx.now()));
            if let Some(addr) = self.move_to.take() {
                let config = ctx.endpoint().config().clone();
                let fresh = Endpoint::with_seed(config, ctx.now(), 99);
                ctx.rebind(addr, fresh);
            }
            self.next(ctx);
        }
    }

    fn on_wake(&mut self, ctx: &mut Ctx<'_>) {
        self.next(ctx);
    }
}

type Done = Rc<RefCell<Vec<(usize, Instant)>>>;

fn paper_sim(clients: usize, exchanges: usize, seed: u64) -> (Sim<Bottleneck>, Done) {
    let server: SocketAddr = "10.78.2.1:5683".parse().unwrap();
    let net = Bottleneck::new(
        LinkConfig::paper(2500, LossModel::None),
        [server.ip()],
        UDP_IPV4_HEADERS,
        seed,
    );
    let mut sim = Sim::new(net, seed);
    let s = sim.add_node(server, server_config());
    sim.set_app(s, Box::new(Server));
    let done = Rc::new(RefCell::new(Vec::new()));
    for c in 0..clients {
        let addr = SocketAddr::from(([10, 78, 1, 2], 40000 + c as u16));
        let config = EndpointConfig {
            token_len: 1,
            max_retransmit: 20,
            ..EndpointConfig::default()
        };
        let i = sim.add_node(addr, config);
        sim.set_app(
            i,
            Box::new(Client {
                server,
                left: exchanges,
                done: done.clone(),
                move_to: None,
            }),
        );
        let now = sim.now();
        sim.wake(i, now);
    }
    (sim, done)
}

#[test]
fn one_client_on_the_papers_link_takes_fifty_round_trips() {
    let (mut sim, done) = paper_sim(1, 50, 1);
    sim.run(sim.now() + Duration::from_secs(3600));
    assert_eq!(done.borrow().len(), 50);
    // 35 B up (CoAP header 4, token 1, Uri-Path 2, IPv4 and UDP 28) and 94 B down
    // (4, 1, payload marker 1, payload 60, 28): 4.67 ms + 25.07 ms on the wire, 600 ms
    // of propagation, 2 × U(10, 20) ms.
    let last = done.borrow().last().unwrap().1;
    let fct = last.duration_since(sim.start).as_secs_f64();
    assert!((50.0 * 0.6497..=50.0 * 0.6697).contains(&fct), "{fct}");
    assert_eq!(sim.endpoint_ref(1).stats().retransmissions, 0);
}

#[test]
fn the_same_seed_gives_the_same_run() {
    let trace = |seed: u64| {
        let (mut sim, done) = paper_sim(30, 5, seed);
        sim.run(sim.now() + Duration::from_secs(3600));
        let start = sim.start;
        let v: Vec<(usize, Duration)> = done
            .borrow()
            .iter()
            .map(|(n, t)| (*n, t.duration_since(start)))
            .collect();
        v
    };
    let a = trace(3);
    assert_eq!(a.len(), 150);
    assert_eq!(a, trace(3));
    assert_ne!(a, trace(4));
}

#[test]
fn thirty_clients_congest_the_downlink_and_all_finish() {
    let (mut sim, done) = paper_sim(30, 20, 5);
    let drops = Rc::new(RefCell::new(0usize));
    let seen = drops.clone();
    sim.observe(Box::new(move |ev| {
        if ev.fate != link::Fate::Delivered {
            *seen.borrow_mut() += 1;
        }
    }));
    sim.run(sim.now() + Duration::from_secs(3600));
    assert_eq!(done.borrow().len(), 600);
    // 600 responses of 94 B need at least 15 s of the 30 kbit/s downlink.
    let last = done.borrow().iter().map(|d| d.1).max().unwrap();
    assert!(last.duration_since(sim.start) > Duration::from_secs(15));
    let s = sim.net().down().stats(0);
    assert!(s.peak_queue_bytes <= 2500);
    assert_eq!(
        *drops.borrow() as u64,
        s.drops_queue + sim.net().up().stats(0).drops_queue
    );
}

#[test]
fn a_rebound_node_talks_from_its_new_address() {
    let net = LossyNet::new(
        LossyConfig {
            loss: 0.0,
            duplicate: 0.0,
            max_delay_ms: 5,
        },
        1,
    );
    let mut sim = Sim::new(net, 1);
    let server: SocketAddr = "10.0.0.1:5683".parse().unwrap();
    let s = sim.add_node(server, server_config());
    sim.set_app(s, Box::new(Server));
    let done = Rc::new(RefCell::new(Vec::new()));
    let c = sim.add_node("10.0.0.2:40000".parse().unwrap(), EndpointConfig::default());
    let moved: SocketAddr = "10.0.0.2:40001".parse().unwrap();
    sim.set_app(
        c,
        Box::new(Client {
            server,
            left: 3,
            done: done.clone(),
            move_to: Some(moved),
        }),
    );
    let now = sim.now();
    sim.wake(c, now);
    sim.run(now + Duration::from_secs(60));
    assert_eq!(done.borrow().len(), 3);
    assert_eq!(sim.addr(c), moved);
    // The server saw two peers: the old and the new address.
    assert_eq!(sim.endpoint_ref(s).state_counts().peers, 2);
}

#[test]
fn an_application_can_stop_the_simulation() {
    struct Stopper;
    impl Application for Stopper {
        fn on_event(&mut self, _: &mut Ctx<'_>, _: SessionEvent) {}
        fn on_wake(&mut self, ctx: &mut Ctx<'_>) {
            ctx.stop();
        }
    }
    let net = LossyNet::new(
        LossyConfig {
            loss: 0.0,
            duplicate: 0.0,
            max_delay_ms: 1,
        },
        1,
    );
    let mut sim = Sim::new(net, 1);
    let n = sim.add_node("10.0.0.1:1".parse().unwrap(), EndpointConfig::default());
    sim.set_app(n, Box::new(Stopper));
    let at = sim.now() + Duration::from_secs(7);
    sim.wake(n, at);
    let end = sim.run(at + Duration::from_secs(100));
    assert_eq!(end, at);
    assert!(sim.step(at + Duration::from_secs(100)).is_none());
}
