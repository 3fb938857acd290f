//! A deterministic simulator for endpoints (feature `sim`): nodes, each an
//! [`Endpoint`] at an address with its own configuration and an optional
//! [`Application`], exchange datagrams through a [`Network`] under a virtual clock.
//!
//! Time jumps from one event to the next — a delivery, an endpoint timer, an
//! application's wake-up — so hours of protocol run in seconds and every run with the
//! same seed is the same run. Networks: [`net::LossyNet`] (independent loss,
//! duplication, random delay and so reordering) and [`net::Bottleneck`] (devices
//! behind one constrained [`link`] with a rate, a drop-tail byte queue, delays and a
//! Gilbert–Elliott loss process, the link of the congestion study).
//!
//! ```
//! use cobalt_proto::endpoint::{EndpointConfig, Event};
//! use cobalt_proto::message::{Code, Message, MessageType};
//! use cobalt_proto::sim::net::{LossyConfig, LossyNet};
//! use cobalt_proto::sim::{Application, Ctx, Sim};
//! use std::time::Duration;
//!
//! /// Answers every request with 2.05 "hi".
//! struct Echo;
//! impl Application for Echo {
//!     fn on_event(&mut self, ctx: &mut Ctx<'_>, event: Event) {
//!         if let Event::Request { id, .. } = event {
//!             let mut r = Message::new(MessageType::Acknowledgement, Code::CONTENT, 0);
//!             r.payload = b"hi".to_vec();
//!             let now = ctx.now();
//!             ctx.endpoint().respond(now, id, r).unwrap();
//!         }
//!     }
//! }
//!
//! let net = LossyNet::new(LossyConfig { loss: 0.2, duplicate: 0.1, max_delay_ms: 50 }, 1);
//! let mut sim = Sim::new(net, 1);
//! let server = sim.add_node("10.0.0.1:5683".parse().unwrap(), EndpointConfig::default());
//! let client = sim.add_node("10.0.0.2:40000".parse().unwrap(), EndpointConfig::default());
//! sim.set_app(server, Box::new(Echo));
//! let (to, now) = (sim.addr(server), sim.now());
//! let get = Message::new(MessageType::Confirmable, Code::GET, 0);
//! let id = sim.endpoint(client).request(now, to, get).unwrap();
//! let horizon = sim.now() + Duration::from_secs(300);
//! let got = loop {
//!     if let Some(ev) = sim.endpoint(client).poll_event() { break ev; }
//!     sim.step(horizon).expect("the request ends before the horizon");
//! };
//! assert!(matches!(got, Event::Response { id: i, ref response } if i == id && response.payload == b"hi"));
//! ```

pub mod link;
pub mod net;

use crate::endpoint::{Endpoint, EndpointConfig, Event};
use link::Nanos;
use net::{Datagram, NetEvent, Network};
use rand::rngs::StdRng;
use rand::SeedableRng;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// What runs on a node: it sees the node's endpoint events and wakes up when it asks to.
pub trait Application {
    /// The node's endpoint produced `event`.
    fn on_event(&mut self, ctx: &mut Ctx<'_>, event: Event);

    /// The time set with [`Ctx::wake_at`] (or [`Sim::wake`]) has come.
    fn on_wake(&mut self, _ctx: &mut Ctx<'_>) {}
}

/// A node's view of the simulation during an [`Application`] callback.
pub struct Ctx<'a> {
    now: Instant,
    node: usize,
    endpoint: &'a mut Endpoint,
    addr: &'a mut SocketAddr,
    wake: &'a mut Option<Nanos>,
    start: Instant,
    stop: &'a mut bool,
    rng: &'a mut StdRng,
}

impl Ctx<'_> {
    /// The current virtual time.
    pub fn now(&self) -> Instant {
        self.now
    }

    /// This node's index.
    pub fn node(&self) -> usize {
        self.node
    }

    /// This node's endpoint.
    pub fn endpoint(&mut self) -> &mut Endpoint {
        self.endpoint
    }

    /// This node's address.
    pub fn addr(&self) -> SocketAddr {
        *self.addr
    }

    /// Calls [`Application::on_wake`] at `at` (replacing an earlier request).
    pub fn wake_at(&mut self, at: Instant) {
        *self.wake = Some(nanos_since(self.start, at.max(self.now)));
    }

    /// Replaces this node's endpoint and moves it to `addr` (a device that starts over
    /// with a new socket); datagrams still on their way to the old address are lost.
    pub fn rebind(&mut self, addr: SocketAddr, endpoint: Endpoint) {
        *self.addr = addr;
        *self.endpoint = endpoint;
    }

    /// Ends the simulation: [`Sim::step`] returns `None` from now on.
    pub fn stop(&mut self) {
        *self.stop = true;
    }

    /// The simulation's random source (seeded).
    pub fn rng(&mut self) -> &mut StdRng {
        self.rng
    }
}

/// The address of node `i` by the simulation's convention: node 0, the server, at
/// 10.0.0.1:5683, the others at 10.1.x.y, port 40000 + `i`.
pub fn node_addr(i: usize) -> SocketAddr {
    match i {
        0 => SocketAddr::from(([10, 0, 0, 1], 5683)),
        i => SocketAddr::from((
            [10, 1, (i / 250 % 256) as u8, (i % 250) as u8 + 1],
            40000u16.wrapping_add(i as u16),
        )),
    }
}

fn nanos_since(start: Instant, t: Instant) -> Nanos {
    u64::try_from(t.saturating_duration_since(start).as_nanos()).unwrap_or(u64::MAX)
}

struct Node {
    endpoint: Endpoint,
    addr: SocketAddr,
    app: Option<Box<dyn Application>>,
    app_wake: Option<Nanos>,
    /// The wake-up queued for this node (endpoint timer or application).
    scheduled: Option<Nanos>,
    dirty: bool,
}

/// Sees every datagram's fate.
pub type Observer = Box<dyn FnMut(&NetEvent)>;

/// A simulation. See the [module documentation](self).
pub struct Sim<N: Network> {
    start: Instant,
    now: Nanos,
    net: N,
    nodes: Vec<Node>,
    by_addr: HashMap<SocketAddr, usize>,
    wakeups: BinaryHeap<Reverse<(Nanos, usize)>>,
    dirty: Vec<usize>,
    rng: StdRng,
    observer: Option<Observer>,
    stopped: bool,
    events: Vec<NetEvent>,
}

impl<N: Network> Sim<N> {
    /// An empty simulation over `net` whose own randomness follows from `seed`.
    pub fn new(net: N, seed: u64) -> Sim<N> {
        Sim {
            start: Instant::now(),
            now: 0,
            net,
            nodes: Vec::new(),
            by_addr: HashMap::new(),
            wakeups: BinaryHeap::new(),
            dirty: Vec::new(),
            rng: StdRng::seed_from_u64(seed),
            observer: None,
            stopped: false,
            events: Vec::new(),
        }
    }

    /// The current virtual time.
    pub fn now(&self) -> Instant {
        self.start + Duration::from_nanos(self.now)
    }

    /// Virtual time elapsed since the start.
    pub fn elapsed(&self) -> Duration {
        Duration::from_nanos(self.now)
    }

    /// The simulation's random source.
    pub fn rng(&mut self) -> &mut StdRng {
        &mut self.rng
    }

    /// The network.
    pub fn net(&mut self) -> &mut N {
        &mut self.net
    }

    /// Adds a node at `addr` with a fresh endpoint (seeded from the simulation's
    /// random source); returns its index.
    pub fn add_node(&mut self, addr: SocketAddr, config: EndpointConfig) -> usize {
        let seed = rand::Rng::random(&mut self.rng);
        let endpoint = Endpoint::with_seed(config, self.now(), seed);
        self.add_endpoint(addr, endpoint)
    }

    /// Adds `n` nodes with `config`, each at the address [`node_addr`] gives its index;
    /// returns their indices.
    pub fn add_nodes(&mut self, n: usize, config: &EndpointConfig) -> std::ops::Range<usize> {
        let first = self.nodes.len();
        for i in first..first + n {
            self.add_node(node_addr(i), config.clone());
        }
        first..first + n
    }

    /// Adds a node at `addr` running `endpoint`; returns its index.
    pub fn add_endpoint(&mut self, addr: SocketAddr, endpoint: Endpoint) -> usize {
        let i = self.nodes.len();
        self.nodes.push(Node {
            endpoint,
            addr,
            app: None,
            app_wake: None,
            scheduled: None,
            dirty: false,
        });
        self.by_addr.insert(addr, i);
        self.mark(i);
        i
    }

    /// Nodes so far.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// True before the first node.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// Runs `app` on node `i`: it receives the node's endpoint events from now on
    /// (without an application they stay in the endpoint for the caller).
    pub fn set_app(&mut self, i: usize, app: Box<dyn Application>) {
        self.nodes[i].app = Some(app);
        self.mark(i);
    }

    /// Wakes node `i`'s application at `at`.
    pub fn wake(&mut self, i: usize, at: Instant) {
        self.nodes[i].app_wake = Some(nanos_since(self.start, at.max(self.now())));
        self.mark(i);
    }

    /// Node `i`'s address.
    pub fn addr(&self, i: usize) -> SocketAddr {
        self.nodes[i].addr
    }

    /// Node `i`'s endpoint, to give it commands or read its events; what it sends
    /// goes out at the next [`Sim::step`].
    pub fn endpoint(&mut self, i: usize) -> &mut Endpoint {
        self.mark(i);
        &mut self.nodes[i].endpoint
    }

    /// Node `i`'s endpoint, to look at it.
    pub fn endpoint_ref(&self, i: usize) -> &Endpoint {
        &self.nodes[i].endpoint
    }

    /// Calls `f` with every datagram's fate (delivered or dropped) from now on.
    pub fn observe(&mut self, f: Observer) {
        self.observer = Some(f);
    }

    /// Ends the simulation.
    pub fn stop(&mut self) {
        self.stopped = true;
    }

    fn mark(&mut self, i: usize) {
        if !self.nodes[i].dirty {
            self.nodes[i].dirty = true;
            self.dirty.push(i);
        }
    }

    /// Puts what the touched nodes want to send on the network and schedules their
    /// next wake-ups.
    fn flush(&mut self) {
        let now = self.now;
        for i in std::mem::take(&mut self.dirty) {
            let node = &mut self.nodes[i];
            node.dirty = false;
            while let Some(tx) = node.endpoint.poll_transmit() {
                self.net.send(
                    now,
                    Datagram {
                        from: node.addr,
                        to: tx.peer,
                        sent: now,
                        bytes: tx.bytes,
                    },
                );
            }
            let timer = node
                .endpoint
                .poll_timeout()
                .map(|t| nanos_since(self.start, t).max(now));
            let next = [timer, node.app_wake].into_iter().flatten().min();
            if next.is_some() && next != node.scheduled {
                node.scheduled = next;
                if let Some(t) = next {
                    self.wakeups.push(Reverse((t, i)));
                }
            }
        }
    }

    fn next_wakeup(&mut self) -> Option<Nanos> {
        while let Some(Reverse((t, i))) = self.wakeups.peek().copied() {
            if self.nodes[i].scheduled == Some(t) {
                return Some(t);
            }
            self.wakeups.pop();
        }
        None
    }

    /// Runs node `i`'s application callback `f`, if it has an application.
    fn with_app(&mut self, i: usize, f: impl FnOnce(&mut dyn Application, &mut Ctx<'_>)) {
        let Some(mut app) = self.nodes[i].app.take() else {
            return;
        };
        let now = self.now();
        let node = &mut self.nodes[i];
        let old_addr = node.addr;
        let mut ctx = Ctx {
            now,
            node: i,
            endpoint: &mut node.endpoint,
            addr: &mut node.addr,
            wake: &mut node.app_wake,
            start: self.start,
            stop: &mut self.stopped,
            rng: &mut self.rng,
        };
        f(app.as_mut(), &mut ctx);
        node.app = Some(app);
        if node.addr != old_addr {
            self.by_addr.remove(&old_addr);
            self.by_addr.insert(node.addr, i);
        }
        self.mark(i);
    }

    /// Hands every pending endpoint event of the touched nodes to their applications.
    fn dispatch(&mut self) {
        let mut k = 0;
        while k < self.dirty.len() {
            let i = self.dirty[k];
            k += 1;
            if self.nodes[i].app.is_none() {
                continue;
            }
            while let Some(ev) = self.nodes[i].endpoint.poll_event() {
                self.with_app(i, |app, ctx| app.on_event(ctx, ev));
            }
        }
    }

    /// Advances to the next moment something happens (not after `horizon`), delivers
    /// and fires everything due then, and returns that moment; `None` when nothing is
    /// left before the horizon or an application stopped the simulation.
    pub fn step(&mut self, horizon: Instant) -> Option<Instant> {
        self.dispatch();
        self.flush();
        if self.stopped {
            return None;
        }
        let next = [self.net.next_event(), self.next_wakeup()]
            .into_iter()
            .flatten()
            .min()?;
        if next > nanos_since(self.start, horizon) {
            return None;
        }
        self.now = self.now.max(next);
        let now = self.now();
        let mut events = std::mem::take(&mut self.events);
        self.net.poll(self.now, &mut events);
        for ev in events.drain(..) {
            if let Some(observer) = &mut self.observer {
                observer(&ev);
            }
            if ev.fate != link::Fate::Delivered {
                continue;
            }
            if let Some(&i) = self.by_addr.get(&ev.datagram.to) {
                self.nodes[i]
                    .endpoint
                    .handle_datagram(now, ev.datagram.from, &ev.datagram.bytes);
                self.mark(i);
            }
        }
        self.events = events;
        while let Some(Reverse((t, i))) = self.wakeups.peek().copied() {
            if t > self.now {
                break;
            }
            self.wakeups.pop();
            if self.nodes[i].scheduled != Some(t) {
                continue;
            }
            self.nodes[i].scheduled = None;
            self.nodes[i].endpoint.handle_timeout(now);
            self.mark(i);
            if self.nodes[i].app_wake.is_some_and(|w| w <= self.now) {
                self.nodes[i].app_wake = None;
                self.with_app(i, |app, ctx| app.on_wake(ctx));
            }
        }
        self.dispatch();
        self.flush();
        Some(now)
    }

    /// Steps until `done` holds (checked before every step), nothing is left before
    /// `horizon` or an application stops the simulation; returns whether `done` held.
    pub fn run_until(&mut self, horizon: Instant, mut done: impl FnMut(&mut Self) -> bool) -> bool {
        loop {
            if done(self) {
                return true;
            }
            if self.step(horizon).is_none() {
                return false;
            }
        }
    }

    /// Steps until nothing is left before `horizon` or an application stops the
    /// simulation; returns the time reached.
    pub fn run(&mut self, horizon: Instant) -> Instant {
        while self.step(horizon).is_some() {}
        self.now()
    }
}

#[cfg(test)]
mod tests;
