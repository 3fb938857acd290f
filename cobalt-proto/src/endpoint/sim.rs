//! A deterministic network simulator for tests: endpoints exchange datagrams over a
//! network that loses, duplicates, delays and reorders them, under a virtual clock.

use super::{Endpoint, EndpointConfig, Transmit};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// How hostile the network is.
pub(crate) struct NetConfig {
    pub loss: f64,
    pub duplicate: f64,
    pub max_delay_ms: u64,
}

/// A datagram on the simulated wire: (delivery time, sequence, from, to, bytes).
type InFlight = Reverse<(Instant, u64, usize, usize, Vec<u8>)>;

/// Nodes (endpoints with addresses) and the wire between them.
pub(crate) struct Sim {
    pub now: Instant,
    pub rng: StdRng,
    net: NetConfig,
    in_flight: BinaryHeap<InFlight>,
    seq: u64,
    pub nodes: Vec<Endpoint>,
    pub addrs: Vec<SocketAddr>,
}

impl Sim {
    /// Node 0 is at 10.0.0.1:5683 (the server by convention), nodes 1.. at 10.1.0.i.
    pub fn new(seed: u64, net: NetConfig, nodes: usize) -> Sim {
        let start = Instant::now();
        let addrs = (0..nodes)
            .map(|i| match i {
                0 => "10.0.0.1:5683".parse().expect("literal"),
                i => SocketAddr::from((
                    [10, 1, (i / 250) as u8, (i % 250) as u8 + 1],
                    40000 + i as u16,
                )),
            })
            .collect();
        Sim {
            now: start,
            rng: StdRng::seed_from_u64(seed),
            net,
            in_flight: BinaryHeap::new(),
            seq: 0,
            nodes: (0..nodes)
                .map(|i| {
                    Endpoint::with_seed(EndpointConfig::default(), start, seed * 1000 + i as u64)
                })
                .collect(),
            addrs,
        }
    }

    fn send(&mut self, from: usize, tx: Transmit) {
        let Some(to) = self.addrs.iter().position(|a| *a == tx.peer) else {
            return;
        };
        let copies = if self.rng.random_bool(self.net.duplicate) {
            2
        } else {
            1
        };
        for _ in 0..copies {
            if self.rng.random_bool(self.net.loss) {
                continue;
            }
            let delay = Duration::from_millis(self.rng.random_range(1..=self.net.max_delay_ms));
            self.seq += 1;
            self.in_flight.push(Reverse((
                self.now + delay,
                self.seq,
                from,
                to,
                tx.bytes.clone(),
            )));
        }
    }

    /// Puts every node's pending datagrams on the wire.
    pub fn flush_all(&mut self) {
        for n in 0..self.nodes.len() {
            while let Some(tx) = self.nodes[n].poll_transmit() {
                self.send(n, tx);
            }
        }
    }

    /// Moves the clock to the next thing that happens (a delivery, a timer, or the
    /// application's own `wake`), delivers and fires what is due, and returns the new
    /// time; `None` once nothing is left before `horizon`.
    pub fn advance(&mut self, wake: Option<Instant>, horizon: Instant) -> Option<Instant> {
        self.flush_all();
        let net = self.in_flight.peek().map(|Reverse((t, ..))| *t);
        let timers = self.nodes.iter().filter_map(Endpoint::poll_timeout).min();
        let next = [net, timers, wake].into_iter().flatten().min()?;
        if next > horizon {
            return None;
        }
        self.now = next;
        while matches!(self.in_flight.peek(), Some(Reverse((t, ..))) if *t <= next) {
            let Some(Reverse((_, _, from, to, bytes))) = self.in_flight.pop() else {
                break;
            };
            let from_addr = self.addrs[from];
            self.nodes[to].handle_datagram(next, from_addr, &bytes);
        }
        for node in &mut self.nodes {
            node.handle_timeout(next);
        }
        Some(next)
    }
}
