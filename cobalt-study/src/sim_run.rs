//! A case in virtual time: the clients' and the server's Cobalt endpoints in the
//! `cobalt-proto` simulator, over the same link model the emulator runs.

use crate::case::{Case, PAYLOAD};
use crate::results::{LinkCounters, RunResult};
use crate::retx::{analyse, Pkt};
use crate::workload::{client_config, plan, Next, UdpClient};
use cobalt_proto::endpoint::{Endpoint, EndpointConfig, Event};
use cobalt_proto::message::{Code, Message, MessageType};
use cobalt_proto::session::SessionEvent;
use cobalt_proto::sim::link::{DirectionStats, Fate};
use cobalt_proto::sim::net::{Bottleneck, UDP_IPV4_HEADERS};
use cobalt_proto::sim::{Application, Ctx, Sim};
use rand::Rng;
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::rc::Rc;
use std::time::{Duration, Instant};

/// The server side's address (as in the emulator).
pub const SERVER: SocketAddr = SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 78, 2, 1)), 5683);
/// The client side's address.
pub const CLIENT_IP: Ipv4Addr = Ipv4Addr::new(10, 78, 1, 2);
/// Longest virtual time a case may take.
pub const HORIZON: Duration = Duration::from_secs(100_000);

/// The server's endpoint settings, in both modes: the defaults without the
/// amplification limit. The paper's server has none, and with it a 7-byte GET could
/// not get its 60-byte answer before one address-verification round trip per client.
pub fn server_config() -> EndpointConfig {
    EndpointConfig {
        amplification_factor: 0,
        ..EndpointConfig::default()
    }
}

/// The answer of the study's resource: 2.05 with a 60-byte payload and no options.
pub fn response() -> Message {
    let mut r = Message::new(MessageType::Acknowledgement, Code::CONTENT, 0);
    r.payload = vec![b'x'; PAYLOAD];
    r
}

struct Server;

impl Application for Server {
    fn on_event(&mut self, ctx: &mut Ctx<'_>, event: SessionEvent) {
        if let SessionEvent::Request { id, .. } = event {
            let now = ctx.now();
            let _ = ctx.session().respond(now, id, response());
        }
    }
}

/// State the clients share with the run.
struct Shared {
    next_port: Cell<u16>,
    /// Client port → client index.
    ports: RefCell<HashMap<u16, usize>>,
    finished: Cell<usize>,
    clients: usize,
    done: RefCell<Vec<Option<UdpClient>>>,
}

struct Client {
    index: usize,
    udp: UdpClient,
    config: EndpointConfig,
    shared: Rc<Shared>,
}

impl Client {
    fn new_port(&self) -> u16 {
        let p = self.shared.next_port.get();
        self.shared.next_port.set(p.wrapping_add(1).max(1024));
        self.shared.ports.borrow_mut().insert(p, self.index);
        p
    }
}

impl Application for Client {
    fn on_event(&mut self, ctx: &mut Ctx<'_>, event: SessionEvent) {
        let now = ctx.now();
        // The clients are datagram nodes: every event is the endpoint's own.
        let Ok(event) = Event::try_from(event) else {
            return;
        };
        match self.udp.on_event(now, ctx.endpoint(), event) {
            Next::Wait => {}
            Next::NewSession => {
                self.udp.retire(ctx.endpoint());
                let port = self.new_port();
                let seed = ctx.rng().random();
                let fresh = Endpoint::with_seed(self.config.clone(), now, seed);
                ctx.rebind(SocketAddr::new(IpAddr::V4(CLIENT_IP), port), fresh);
                self.udp.send(now, ctx.endpoint());
            }
            Next::Finished => {
                self.udp.retire(ctx.endpoint());
                self.shared.done.borrow_mut()[self.index] = Some(self.udp.clone());
                let n = self.shared.finished.get() + 1;
                self.shared.finished.set(n);
                if n == self.shared.clients {
                    ctx.stop();
                }
            }
        }
    }

    fn on_wake(&mut self, ctx: &mut Ctx<'_>) {
        let now = ctx.now();
        self.udp.send(now, ctx.endpoint());
    }
}

fn counters(s: DirectionStats) -> LinkCounters {
    LinkCounters {
        packets: s.packets_in,
        drops_queue: s.drops_queue,
        drops_loss: s.drops_loss,
        peak_queue: s.peak_queue_bytes,
    }
}

/// Runs a UDP case in virtual time.
pub fn run(case: &Case, seed: u64) -> RunResult {
    let wall = Instant::now();
    let variant = case.variant;
    assert!(
        variant.algorithm().is_some(),
        "virtual time runs UDP variants only"
    );
    let net = Bottleneck::new(case.link(), [SERVER.ip()], UDP_IPV4_HEADERS, seed);
    let mut sim = Sim::new(net, seed);
    let server = sim.add_node(SERVER, server_config());
    sim.set_app(server, Box::new(Server));
    let shared = Rc::new(Shared {
        next_port: Cell::new(20_000),
        ports: RefCell::new(HashMap::new()),
        finished: Cell::new(0),
        clients: case.clients,
        done: RefCell::new(vec![None; case.clients]),
    });
    let pkts = Rc::new(RefCell::new(Vec::new()));
    let seen = pkts.clone();
    sim.observe(Box::new(move |ev| {
        let d = &ev.datagram;
        let up = d.to == SERVER;
        let port = if up { d.from.port() } else { d.to.port() };
        let coap = (d.bytes.len() >= 4 && d.bytes[0] >> 6 == 1).then(|| {
            (
                (d.bytes[0] >> 4) & 3,
                u16::from_be_bytes([d.bytes[2], d.bytes[3]]),
            )
        });
        seen.borrow_mut().push(Pkt {
            sent: d.sent,
            up,
            delivered: ev.fate == Fate::Delivered,
            port,
            coap,
            tcp: None,
        });
    }));
    let config = client_config(variant);
    for i in 0..case.clients {
        let client_seed = seed ^ (i as u64).wrapping_mul(0x9e37_79b9);
        let app = Client {
            index: i,
            udp: UdpClient::new(SERVER, plan(case.workload, client_seed)),
            config: config.clone(),
            shared: shared.clone(),
        };
        let port = app.new_port();
        let node = sim.add_node(SocketAddr::new(IpAddr::V4(CLIENT_IP), port), config.clone());
        sim.set_app(node, Box::new(app));
        let now = sim.now();
        sim.wake(node, now);
    }
    let start = sim.now();
    sim.run(start + HORIZON);
    let span = sim.elapsed().as_secs_f64();
    let done = shared.done.borrow();
    let fct: Vec<f64> = done
        .iter()
        .flatten()
        .filter_map(|c| c.fct())
        .map(|d| d.as_secs_f64())
        .collect();
    let mut unnecessary = vec![0u64; case.clients];
    let ports = shared.ports.borrow();
    for (port, r) in analyse(pkts.take()) {
        if let Some(&i) = ports.get(&port) {
            unnecessary[i] += r.unnecessary;
        }
    }
    let now_ns = sim.elapsed().as_nanos() as u64;
    let up = counters(sim.net().up().stats(now_ns));
    let down = counters(sim.net().down().stats(now_ns));
    RunResult {
        case: *case,
        key: case.key(),
        seed,
        unfinished: case.clients - fct.len(),
        fct,
        retransmissions: done
            .iter()
            .map(|c| c.as_ref().map_or(0, |c| c.retransmissions))
            .collect(),
        unnecessary,
        handshake_retransmissions: Vec::new(),
        failures: done.iter().flatten().map(|c| c.failures).sum(),
        up,
        down,
        wall_s: wall.elapsed().as_secs_f64(),
        span_s: span,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::case::{Loss, Mode, Variant, Workload};

    fn case(workload: Workload, clients: usize, variant: Variant) -> Case {
        Case {
            mode: Mode::Virtual,
            workload,
            clients,
            buffer: 2500,
            loss: Loss::None,
            variant,
            rep: 0,
        }
    }

    #[test]
    fn one_client_takes_fifty_round_trips_of_the_papers_link() {
        for workload in [Workload::Continuous, Workload::Random] {
            let r = run(&case(workload, 1, Variant::Default), 1);
            assert_eq!(r.fct.len(), 1);
            // 50 × (600 + 30 + 4.67 + 25.07 ms) = 32.99 s, paper 33.003 s.
            assert!((r.fct[0] - 32.99).abs() < 0.3, "{r:?}");
            assert_eq!(r.retransmissions, [0]);
        }
    }

    #[test]
    fn fifty_clients_share_the_downlink() {
        let r = run(&case(Workload::Continuous, 50, Variant::Fasor), 3);
        assert_eq!((r.fct.len(), r.unfinished), (50, 0));
        // 2,500 responses of 94 B take 62.7 s of the 30 kbit/s downlink.
        let median = {
            let mut f = r.fct.clone();
            f.sort_by(f64::total_cmp);
            f[25]
        };
        assert!((55.0..75.0).contains(&median), "{median}");
        assert!(r.down.peak_queue <= 2500);
    }
}
