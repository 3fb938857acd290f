//! Networks for the simulator: what happens to a datagram between two nodes.
//!
//! - [`LossyNet`]: every datagram independently lost, duplicated and delayed by a
//!   uniform random time (which reorders them): the hostile network of the protocol
//!   property tests.
//! - [`Bottleneck`]: nodes on two sides of one constrained [link](super::link) (the
//!   devices, and the fixed hosts listed by address): everything from the devices
//!   shares the uplink, everything to them the downlink, with IP and UDP headers
//!   counted.

use super::link::{Direction, Fate, LinkConfig, Nanos, Outcome};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashSet};
use std::net::{IpAddr, SocketAddr};

/// A datagram on the simulated network.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Datagram {
    /// Sender.
    pub from: SocketAddr,
    /// Receiver.
    pub to: SocketAddr,
    /// When it was sent (nanoseconds of virtual time).
    pub sent: Nanos,
    /// The UDP payload.
    pub bytes: Vec<u8>,
}

/// What became of a datagram: delivered (to be handed to its receiver) or dropped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetEvent {
    /// When it was delivered or dropped.
    pub at: Nanos,
    /// The datagram.
    pub datagram: Datagram,
    /// Its fate.
    pub fate: Fate,
}

/// A network the simulator sends datagrams through.
pub trait Network {
    /// `datagram` leaves its sender at `now` (not before any earlier call).
    fn send(&mut self, now: Nanos, datagram: Datagram);
    /// When something happens next, if anything is in flight.
    fn next_event(&self) -> Option<Nanos>;
    /// Everything that happened up to `now`, in time order, into `out`.
    fn poll(&mut self, now: Nanos, out: &mut Vec<NetEvent>);
}

/// How hostile a [`LossyNet`] is.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LossyConfig {
    /// Probability that a copy is lost.
    pub loss: f64,
    /// Probability that a datagram is sent twice (each copy then lost or delayed on its own).
    pub duplicate: f64,
    /// Copies are delayed uniformly by 1 ms to this many milliseconds.
    pub max_delay_ms: u64,
}

/// Independent loss, duplication and random delay (so reordering) per datagram.
#[derive(Debug)]
pub struct LossyNet {
    cfg: LossyConfig,
    rng: StdRng,
    seq: u64,
    in_flight: BinaryHeap<Reverse<(Nanos, u64, Datagram)>>,
    dropped: Vec<NetEvent>,
}

impl PartialOrd for Datagram {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Datagram {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.sent, self.from, self.to, &self.bytes).cmp(&(
            other.sent,
            other.from,
            other.to,
            &other.bytes,
        ))
    }
}

impl LossyNet {
    /// A lossy network whose randomness follows from `seed`.
    pub fn new(cfg: LossyConfig, seed: u64) -> LossyNet {
        LossyNet {
            cfg,
            rng: StdRng::seed_from_u64(seed),
            seq: 0,
            in_flight: BinaryHeap::new(),
            dropped: Vec::new(),
        }
    }
}

impl Network for LossyNet {
    fn send(&mut self, now: Nanos, datagram: Datagram) {
        let copies = if self.rng.random_bool(self.cfg.duplicate) {
            2
        } else {
            1
        };
        for _ in 0..copies {
            if self.rng.random_bool(self.cfg.loss) {
                self.dropped.push(NetEvent {
                    at: now,
                    datagram: datagram.clone(),
                    fate: Fate::DroppedLoss,
                });
                continue;
            }
            let delay = self.rng.random_range(1..=self.cfg.max_delay_ms.max(1)) * 1_000_000;
            self.seq += 1;
            self.in_flight
                .push(Reverse((now + delay, self.seq, datagram.clone())));
        }
    }

    fn next_event(&self) -> Option<Nanos> {
        let drop = self.dropped.first().map(|d| d.at);
        let fly = self.in_flight.peek().map(|Reverse((t, ..))| *t);
        [drop, fly].into_iter().flatten().min()
    }

    fn poll(&mut self, now: Nanos, out: &mut Vec<NetEvent>) {
        let mut due = std::mem::take(&mut self.dropped);
        while matches!(self.in_flight.peek(), Some(Reverse((t, ..))) if *t <= now) {
            let Some(Reverse((at, _, datagram))) = self.in_flight.pop() else {
                break;
            };
            due.push(NetEvent {
                at,
                datagram,
                fate: Fate::Delivered,
            });
        }
        due.sort_by_key(|e| e.at);
        out.append(&mut due);
    }
}

/// Bytes of the IPv4 and UDP headers added to each datagram on a [`Bottleneck`].
pub const UDP_IPV4_HEADERS: usize = 28;

/// Devices and fixed hosts on either side of one constrained link.
#[derive(Debug)]
pub struct Bottleneck {
    hosts: HashSet<IpAddr>,
    headers: usize,
    up: Direction<Datagram>,
    down: Direction<Datagram>,
    outcomes: Vec<Outcome<Datagram>>,
    /// Datagrams between nodes on the same side (delivered at once).
    local: Vec<NetEvent>,
}

impl Bottleneck {
    /// The link `cfg` between every node whose IP address is in `hosts` (the fixed
    /// side) and every other node; datagrams count `headers` more bytes
    /// ([`UDP_IPV4_HEADERS`] for the congestion study). Randomness follows from `seed`.
    pub fn new(
        cfg: LinkConfig,
        hosts: impl IntoIterator<Item = IpAddr>,
        headers: usize,
        seed: u64,
    ) -> Bottleneck {
        Bottleneck {
            hosts: hosts.into_iter().collect(),
            headers,
            up: Direction::new(cfg.up, seed.wrapping_mul(2).wrapping_add(1)),
            down: Direction::new(cfg.down, seed.wrapping_mul(2).wrapping_add(2)),
            outcomes: Vec::new(),
            local: Vec::new(),
        }
    }

    /// The uplink (devices to hosts).
    pub fn up(&mut self) -> &mut Direction<Datagram> {
        &mut self.up
    }

    /// The downlink (hosts to devices).
    pub fn down(&mut self) -> &mut Direction<Datagram> {
        &mut self.down
    }
}

impl Network for Bottleneck {
    fn send(&mut self, now: Nanos, datagram: Datagram) {
        let from_host = self.hosts.contains(&datagram.from.ip());
        let to_host = self.hosts.contains(&datagram.to.ip());
        let len = datagram.bytes.len() + self.headers;
        match (from_host, to_host) {
            (false, true) => self.up.send(now, len, datagram, &mut self.outcomes),
            (true, false) => self.down.send(now, len, datagram, &mut self.outcomes),
            _ => self.local.push(NetEvent {
                at: now,
                datagram,
                fate: Fate::Delivered,
            }),
        }
    }

    fn next_event(&self) -> Option<Nanos> {
        [
            self.up.next_event(),
            self.down.next_event(),
            self.outcomes.iter().map(|o| o.at).min(),
            self.local.first().map(|l| l.at),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    fn poll(&mut self, now: Nanos, out: &mut Vec<NetEvent>) {
        self.up.advance(now, &mut self.outcomes);
        self.down.advance(now, &mut self.outcomes);
        out.append(&mut self.local);
        self.outcomes.sort_by_key(|o| o.at);
        out.extend(self.outcomes.drain(..).map(|o| NetEvent {
            at: o.at,
            datagram: o.packet,
            fate: o.fate,
        }));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::link::LossModel;

    fn dg(from: &str, to: &str, len: usize) -> Datagram {
        Datagram {
            from: from.parse().unwrap(),
            to: to.parse().unwrap(),
            sent: 0,
            bytes: vec![0; len],
        }
    }

    #[test]
    fn bottleneck_routes_by_side_and_counts_headers() {
        let cfg = LinkConfig::paper(2500, LossModel::None);
        let host: SocketAddr = "10.0.2.1:5683".parse().unwrap();
        let mut net = Bottleneck::new(cfg, [host.ip()], UDP_IPV4_HEADERS, 1);
        // 72 B of CoAP + 28 B of headers = 100 B: 13.33 ms at 60 kbit/s, 200 ms, 10–20 ms.
        net.send(0, dg("10.0.1.2:40000", "10.0.2.1:5683", 72));
        let mut out = Vec::new();
        net.poll(u64::MAX / 2, &mut out);
        assert_eq!(out.len(), 1);
        let at = out[0].at;
        assert!((223_333_333..=233_333_333).contains(&at), "{at}");
        // 100 B down: 10–20 ms, then 26.67 ms at 30 kbit/s, then 400 ms.
        net.send(at, dg("10.0.2.1:5683", "10.0.1.2:40000", 72));
        out.clear();
        net.poll(u64::MAX / 2, &mut out);
        let down = out[0].at - at;
        assert!((436_666_666..=446_666_666).contains(&down), "{down}");
        // Larger than the MTU of 296 with headers: dropped.
        net.send(at, dg("10.0.1.2:40000", "10.0.2.1:5683", 269));
        out.clear();
        net.poll(u64::MAX / 2, &mut out);
        assert_eq!(out[0].fate, Fate::DroppedMtu);
    }

    #[test]
    fn lossy_net_reports_drops_and_delivers_the_rest_in_time_order() {
        let cfg = LossyConfig {
            loss: 0.3,
            duplicate: 0.2,
            max_delay_ms: 50,
        };
        let mut net = LossyNet::new(cfg, 9);
        for i in 0..1000 {
            net.send(i * 1_000_000, dg("10.0.0.1:1", "10.0.0.2:2", 10));
        }
        let mut out = Vec::new();
        net.poll(u64::MAX, &mut out);
        let lost = out.iter().filter(|e| e.fate == Fate::DroppedLoss).count();
        assert!((250..=400).contains(&lost), "{lost}");
        let delivered: Vec<Nanos> = out
            .iter()
            .filter(|e| e.fate == Fate::Delivered)
            .map(|e| e.at)
            .collect();
        assert!(delivered.windows(2).all(|w| w[0] <= w[1]));
        assert!(
            delivered.len() + lost > 1000,
            "some datagrams were duplicated"
        );
    }
}
