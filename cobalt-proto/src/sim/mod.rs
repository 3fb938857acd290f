//! A deterministic simulator (feature `sim`), the harness the protocol is tested on:
//! nodes, each a [`Session`] at an address with its own configuration and an optional
//! [`Application`], under a virtual clock. A datagram node runs an [`Endpoint`] whose
//! datagrams cross a [`Network`]; a stream node runs RFC 8323 connections
//! ([`StreamEndpoint`]) over [`stream::Streams`], byte streams that cut writes into
//! random chunks, delay them and coalesce them into reads. Applications see the same
//! [`SessionEvent`]s and call the same [`Session`] on both, so one application runs
//! over either kind of node.
//!
//! Time jumps from one event to the next — a delivery, a timer, an application's
//! wake-up — so hours of protocol run in seconds and every run with the same seed is
//! the same run. Networks: [`net::LossyNet`] (independent loss, duplication, random
//! delay and so reordering) and [`net::Bottleneck`] (devices behind one constrained
//! [`link`] with a rate, a drop-tail byte queue, delays and a Gilbert–Elliott loss
//! process, the link of the congestion study).
//!
//! ```
//! use cobalt_proto::endpoint::EndpointConfig;
//! use cobalt_proto::message::{Code, Message, MessageType};
//! use cobalt_proto::session::{Session, SessionEvent};
//! use cobalt_proto::sim::net::{LossyConfig, LossyNet};
//! use cobalt_proto::sim::{Application, Ctx, Sim};
//! use cobalt_proto::tcp_connection::TcpConfig;
//! use std::time::Duration;
//!
//! /// Answers every request with 2.05 "hi".
//! struct Hi;
//! impl Application for Hi {
//!     fn on_event(&mut self, ctx: &mut Ctx<'_>, event: SessionEvent) {
//!         if let SessionEvent::Request { id, .. } = event {
//!             let mut r = Message::new(MessageType::Acknowledgement, Code::CONTENT, 0);
//!             r.payload = b"hi".to_vec();
//!             let now = ctx.now();
//!             ctx.session().respond(now, id, r).unwrap();
//!         }
//!     }
//! }
//!
//! let net = LossyNet::new(LossyConfig { loss: 0.2, duplicate: 0.1, max_delay_ms: 50 }, 1);
//! let mut sim = Sim::new(net, 1);
//! // A datagram pair and a stream pair.
//! let server = sim.add_node("10.0.0.1:5683".parse().unwrap(), EndpointConfig::default());
//! let client = sim.add_node("10.0.0.2:40000".parse().unwrap(), EndpointConfig::default());
//! let tcp_server = sim.add_stream_node("10.0.1.1:5683".parse().unwrap(), TcpConfig::default());
//! let tcp_client = sim.add_stream_node("10.0.1.2:40000".parse().unwrap(), TcpConfig::default());
//! for (server, client) in [(server, client), (tcp_server, tcp_client)] {
//!     sim.set_app(server, Box::new(Hi));
//!     let (to, now) = (sim.addr(server), sim.now());
//!     let get = Message::new(MessageType::Confirmable, Code::GET, 0);
//!     let id = sim.session(client).request(now, to, get).unwrap();
//!     let horizon = sim.now() + Duration::from_secs(300);
//!     let response = loop {
//!         match sim.session(client).poll_event() {
//!             Some(SessionEvent::Response { id: i, response }) if i == id => break response,
//!             Some(_) => {} // on a stream, first the server's settings (its CSM)
//!             None => {
//!                 sim.step(horizon).expect("the request ends before the horizon");
//!             }
//!         }
//!     };
//!     assert_eq!(response.payload, b"hi");
//! }
//! ```

pub mod link;
pub mod net;
pub mod stream;

use crate::endpoint::{Endpoint, EndpointConfig};
use crate::session::stream::{StreamEndpoint, StreamTransmit};
use crate::session::{Session, SessionEvent};
use crate::tcp_connection::TcpConfig;
use link::Nanos;
use net::{Datagram, NetEvent, Network};
use rand::rngs::StdRng;
use rand::SeedableRng;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use stream::{Read, StreamConfig, Streams};

/// What runs on a node: it sees the node's session events and wakes up when it asks to.
pub trait Application {
    /// The node's session produced `event`.
    fn on_event(&mut self, ctx: &mut Ctx<'_>, event: SessionEvent);

    /// The time set with [`Ctx::wake_at`] (or [`Sim::wake`]) has come.
    fn on_wake(&mut self, _ctx: &mut Ctx<'_>) {}
}

/// A node's view of the simulation during an [`Application`] callback.
pub struct Ctx<'a> {
    now: Instant,
    node: usize,
    transport: &'a mut Transport,
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

    /// This node's session: its endpoint or its stream connections.
    pub fn session(&mut self) -> &mut dyn Session {
        self.transport.session()
    }

    /// This datagram node's endpoint.
    ///
    /// # Panics
    /// On a stream node.
    pub fn endpoint(&mut self) -> &mut Endpoint {
        self.transport.endpoint()
    }

    /// This stream node's connections.
    ///
    /// # Panics
    /// On a datagram node.
    pub fn stream(&mut self) -> &mut StreamEndpoint {
        self.transport.stream()
    }

    /// This node's address.
    pub fn addr(&self) -> SocketAddr {
        *self.addr
    }

    /// Calls [`Application::on_wake`] at `at` (replacing an earlier request).
    pub fn wake_at(&mut self, at: Instant) {
        *self.wake = Some(nanos_since(self.start, at.max(self.now)));
    }

    /// Replaces this node's endpoint (or stream connections, making it a datagram node)
    /// and moves it to `addr` (a device that starts over with a new socket); datagrams
    /// still on their way to the old address are lost.
    pub fn rebind(&mut self, addr: SocketAddr, endpoint: Endpoint) {
        *self.addr = addr;
        *self.transport = Transport::Datagram(Box::new(endpoint));
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

/// What a node speaks.
enum Transport {
    Datagram(Box<Endpoint>),
    Stream(Box<StreamEndpoint>),
}

impl Transport {
    fn session(&mut self) -> &mut dyn Session {
        match self {
            Transport::Datagram(e) => e.as_mut(),
            Transport::Stream(s) => s.as_mut(),
        }
    }

    fn endpoint(&mut self) -> &mut Endpoint {
        match self {
            Transport::Datagram(e) => e,
            Transport::Stream(_) => panic!("a stream node has no datagram endpoint"),
        }
    }

    fn stream(&mut self) -> &mut StreamEndpoint {
        match self {
            Transport::Stream(s) => s,
            Transport::Datagram(_) => panic!("a datagram node has no stream connections"),
        }
    }

    fn poll_timeout(&self) -> Option<Instant> {
        match self {
            Transport::Datagram(e) => e.poll_timeout(),
            Transport::Stream(s) => s.poll_timeout(),
        }
    }

    fn handle_timeout(&mut self, now: Instant) {
        match self {
            Transport::Datagram(e) => e.handle_timeout(now),
            Transport::Stream(s) => s.handle_timeout(now),
        }
    }
}

struct Node {
    transport: Transport,
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
    streams: Streams,
    reads: Vec<Read>,
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
            streams: Streams::new(StreamConfig::default(), seed ^ 0x5eed_57ea),
            reads: Vec::new(),
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
        self.add_conventional(n, |sim, addr| sim.add_node(addr, config.clone()))
    }

    /// Adds `n` nodes with `add`, at the addresses [`node_addr`] gives their indices.
    fn add_conventional(
        &mut self,
        n: usize,
        mut add: impl FnMut(&mut Self, SocketAddr) -> usize,
    ) -> std::ops::Range<usize> {
        let first = self.nodes.len();
        for i in first..first + n {
            add(self, node_addr(i));
        }
        first..first + n
    }

    /// Adds a node at `addr` running `endpoint`; returns its index.
    pub fn add_endpoint(&mut self, addr: SocketAddr, endpoint: Endpoint) -> usize {
        self.push(addr, Transport::Datagram(Box::new(endpoint)))
    }

    /// Adds a stream node at `addr` whose connections use `config` (a fresh
    /// [`StreamEndpoint`] seeded from the simulation's random source); returns its
    /// index. It connects to and accepts connections from other stream nodes over
    /// [`Sim::streams`].
    pub fn add_stream_node(&mut self, addr: SocketAddr, config: TcpConfig) -> usize {
        let seed = rand::Rng::random(&mut self.rng);
        self.push(
            addr,
            Transport::Stream(Box::new(StreamEndpoint::new(config, seed))),
        )
    }

    /// Adds `n` stream nodes with `config`, each at the address [`node_addr`] gives its
    /// index; returns their indices.
    pub fn add_stream_nodes(&mut self, n: usize, config: &TcpConfig) -> std::ops::Range<usize> {
        self.add_conventional(n, |sim, addr| sim.add_stream_node(addr, config.clone()))
    }

    fn push(&mut self, addr: SocketAddr, transport: Transport) -> usize {
        let i = self.nodes.len();
        self.nodes.push(Node {
            transport,
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

    /// Runs `app` on node `i`: it receives the node's session events from now on
    /// (without an application they stay in the session for the caller).
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

    /// Node `i`'s session, to give it commands or read its events; what it sends goes
    /// out at the next [`Sim::step`].
    pub fn session(&mut self, i: usize) -> &mut dyn Session {
        self.mark(i);
        self.nodes[i].transport.session()
    }

    /// Datagram node `i`'s endpoint, to give it commands or read its events; what it
    /// sends goes out at the next [`Sim::step`].
    ///
    /// # Panics
    /// If node `i` is a stream node.
    pub fn endpoint(&mut self, i: usize) -> &mut Endpoint {
        self.mark(i);
        self.nodes[i].transport.endpoint()
    }

    /// Datagram node `i`'s endpoint, to look at it.
    ///
    /// # Panics
    /// If node `i` is a stream node.
    pub fn endpoint_ref(&self, i: usize) -> &Endpoint {
        match &self.nodes[i].transport {
            Transport::Datagram(e) => e,
            Transport::Stream(_) => panic!("node {i} is a stream node"),
        }
    }

    /// Stream node `i`'s connections, to give them commands or read their events.
    ///
    /// # Panics
    /// If node `i` is a datagram node.
    pub fn stream(&mut self, i: usize) -> &mut StreamEndpoint {
        self.mark(i);
        self.nodes[i].transport.stream()
    }

    /// Stream node `i`'s connections, to look at them.
    ///
    /// # Panics
    /// If node `i` is a datagram node.
    pub fn stream_ref(&self, i: usize) -> &StreamEndpoint {
        match &self.nodes[i].transport {
            Transport::Stream(s) => s,
            Transport::Datagram(_) => panic!("node {i} is a datagram node"),
        }
    }

    /// The byte streams between stream nodes (to change how they cut and delay bytes,
    /// or to reset one).
    pub fn streams(&mut self) -> &mut Streams {
        &mut self.streams
    }

    /// Resets the stream between nodes `a` and `b` now: what is in flight is lost and
    /// both ends read the end of the stream.
    pub fn reset_stream(&mut self, a: usize, b: usize) {
        let (a, b) = (self.nodes[a].addr, self.nodes[b].addr);
        self.streams.reset(self.now, a, b);
    }

    /// Calls `f` with every datagram's fate (delivered or dropped) from now on (the
    /// bytes of streams are not datagrams).
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
        while !self.dirty.is_empty() {
            for i in std::mem::take(&mut self.dirty) {
                self.nodes[i].dirty = false;
                self.transmit(i);
                self.schedule(i);
            }
        }
    }

    /// Puts what node `i` wants sent on the network or its streams.
    fn transmit(&mut self, i: usize) {
        let now = self.now;
        let from = self.nodes[i].addr;
        match &mut self.nodes[i].transport {
            Transport::Datagram(endpoint) => {
                while let Some(tx) = endpoint.poll_transmit() {
                    let bytes = tx.bytes;
                    let (to, sent) = (tx.peer, now);
                    self.net.send(
                        now,
                        Datagram {
                            from,
                            to,
                            sent,
                            bytes,
                        },
                    );
                }
            }
            Transport::Stream(_) => {
                while let Some(tx) = self.nodes[i].transport.stream().poll_transmit() {
                    match tx {
                        StreamTransmit::Connect(to) => self.connect(i, to),
                        StreamTransmit::Data(to, bytes) => {
                            self.streams.write(now, from, to, &bytes)
                        }
                        StreamTransmit::Close(to) => self.streams.close(now, from, to),
                    }
                }
            }
        }
    }

    /// Node `i` connects to `to`: accepted there if it is a stream node, refused
    /// otherwise.
    fn connect(&mut self, i: usize, to: SocketAddr) {
        let from = self.nodes[i].addr;
        let peer = self.by_addr.get(&to).copied();
        match peer {
            Some(j) if matches!(self.nodes[j].transport, Transport::Stream(_)) => {
                self.streams.open(from, to);
                let now = self.now();
                self.nodes[j].transport.stream().accept(now, from);
                self.mark(j);
            }
            _ => self.streams.refuse(self.now, to, from),
        }
    }

    /// Schedules node `i`'s next wake-up: its timer or its application's.
    fn schedule(&mut self, i: usize) {
        let now = self.now;
        let node = &mut self.nodes[i];
        let timer = node
            .transport
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
            transport: &mut node.transport,
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
            while let Some(ev) = self.nodes[i].transport.session().poll_event() {
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
        let next = [
            self.net.next_event(),
            self.streams.next_event(),
            self.next_wakeup(),
        ]
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
                if let Transport::Datagram(endpoint) = &mut self.nodes[i].transport {
                    endpoint.handle_datagram(now, ev.datagram.from, &ev.datagram.bytes);
                    self.mark(i);
                }
            }
        }
        self.events = events;
        let mut reads = std::mem::take(&mut self.reads);
        self.streams.poll(self.now, &mut reads);
        for read in reads.drain(..) {
            if let Some(&i) = self.by_addr.get(&read.to) {
                if let Transport::Stream(s) = &mut self.nodes[i].transport {
                    s.handle_bytes(now, read.from, &read.bytes);
                    if read.eof {
                        s.handle_eof(read.from);
                    }
                    self.mark(i);
                }
            }
        }
        self.reads = reads;
        while let Some(Reverse((t, i))) = self.wakeups.peek().copied() {
            if t > self.now {
                break;
            }
            self.wakeups.pop();
            if self.nodes[i].scheduled != Some(t) {
                continue;
            }
            self.nodes[i].scheduled = None;
            self.nodes[i].transport.handle_timeout(now);
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
