//! A model of one direction of a constrained link, on an ideal timeline of nanoseconds:
//!
//! ```text
//! arrival ─ MTU check ─ U(a,b) delay ─ drop-tail byte queue ─ transmission at `rate`
//!         ─ loss (Bernoulli or Gilbert–Elliott) ─ propagation delay ─ U(a,b) delay ─ delivery
//! ```
//!
//! Both random delays keep the order of packets (a packet never leaves before the one
//! ahead of it), the queue limit counts the bytes waiting but not the packet being
//! sent, and a lost packet has used its airtime (or, with [`LossPoint::Arrival`], is
//! lost before the queue like netem's). The Gilbert–Elliott process runs on time, not
//! on packets: its good and bad periods follow from the seed alone.
//!
//! The model is pure: [`Direction::send`] and [`Direction::advance`] take the time and
//! return what happened. The `cobalt-proto` simulator drives it in virtual time and
//! the `cobalt-linkem` emulator in real time, so both see the very same link.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::VecDeque;
use std::time::Duration;

/// Nanoseconds on the link's timeline.
pub type Nanos = u64;

fn ns(d: Duration) -> Nanos {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// A two-state (Gilbert–Elliott) loss process driven by time: good and bad periods
/// of exponential length clamped to [min, max], with a loss probability in each.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GilbertElliott {
    /// Mean of the exponential length of a good period.
    pub good_mean: Duration,
    /// Shortest good period (shorter draws are raised to it).
    pub good_min: Duration,
    /// Longest good period (longer draws are cut to it).
    pub good_max: Duration,
    /// Mean of the exponential length of a bad period.
    pub bad_mean: Duration,
    /// Shortest bad period.
    pub bad_min: Duration,
    /// Longest bad period.
    pub bad_max: Duration,
    /// Loss probability in a good period.
    pub p_good: f64,
    /// Loss probability in a bad period.
    pub p_bad: f64,
}

impl GilbertElliott {
    /// The congestion-control paper's medium profile: 0 % / 50 % loss, good 400 ms mean in
    /// [60, 1200] ms, bad 100 ms mean in [30, 300] ms (≈ 10 % overall).
    pub fn medium() -> GilbertElliott {
        GilbertElliott {
            good_mean: Duration::from_millis(400),
            good_min: Duration::from_millis(60),
            good_max: Duration::from_millis(1200),
            bad_mean: Duration::from_millis(100),
            bad_min: Duration::from_millis(30),
            bad_max: Duration::from_millis(300),
            p_good: 0.0,
            p_bad: 0.5,
        }
    }

    /// The congestion-control paper's high profile: 2 % / 80 % loss, same periods (≈ 18 % overall).
    pub fn high() -> GilbertElliott {
        GilbertElliott {
            p_good: 0.02,
            p_bad: 0.8,
            ..GilbertElliott::medium()
        }
    }

    /// The long-run fraction of time in the bad state: `E[bad] / (E[good] + E[bad])`,
    /// with E[clamp(X, a, b)] = a + m·(e^(−a/m) − e^(−b/m)) for X ~ Exp(mean m).
    pub fn bad_fraction(&self) -> f64 {
        let mean = |m: Duration, a: Duration, b: Duration| {
            let (m, a, b) = (m.as_secs_f64(), a.as_secs_f64(), b.as_secs_f64());
            if m <= 0.0 {
                return a;
            }
            a + m * ((-a / m).exp() - (-b / m).exp())
        };
        let g = mean(self.good_mean, self.good_min, self.good_max);
        let b = mean(self.bad_mean, self.bad_min, self.bad_max);
        b / (g + b)
    }

    /// The long-run loss rate of packets sent at random times.
    pub fn expected_loss(&self) -> f64 {
        let f = self.bad_fraction();
        f * self.p_bad + (1.0 - f) * self.p_good
    }
}

/// Which packets are lost.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub enum LossModel {
    /// None (drops come from the queue only).
    #[default]
    None,
    /// Each packet independently with this probability.
    Bernoulli(f64),
    /// By a time-driven two-state process.
    GilbertElliott(GilbertElliott),
}

/// Where in the pipeline the loss process strikes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LossPoint {
    /// After transmission: a lost packet has used its airtime (a radio link).
    #[default]
    AfterTransmission,
    /// On arrival, before the queue (netem's behaviour).
    Arrival,
}

/// One direction of a link.
#[derive(Debug, Clone, PartialEq)]
pub struct DirectionConfig {
    /// Transmission rate in bit/s; 0: infinite (no serialisation time, no queue).
    pub rate_bps: u64,
    /// Propagation delay.
    pub delay: Duration,
    /// Bytes the drop-tail queue holds besides the packet being transmitted.
    pub queue_bytes: usize,
    /// Bytes added to every packet for the rate and the queue (e.g. 14 for an
    /// Ethernet header as netem counts it; 0 counts IP packets as they are).
    pub overhead: usize,
    /// Extra delay U(a, b) before the queue (order kept).
    pub jitter_before: (Duration, Duration),
    /// Extra delay U(a, b) after the propagation delay (order kept).
    pub jitter_after: (Duration, Duration),
    /// The loss process.
    pub loss: LossModel,
    /// Where losses happen.
    pub loss_at: LossPoint,
    /// Larger packets are dropped.
    pub mtu: usize,
}

impl Default for DirectionConfig {
    fn default() -> Self {
        DirectionConfig {
            rate_bps: 0,
            delay: Duration::ZERO,
            queue_bytes: usize::MAX,
            overhead: 0,
            jitter_before: (Duration::ZERO, Duration::ZERO),
            jitter_after: (Duration::ZERO, Duration::ZERO),
            loss: LossModel::None,
            loss_at: LossPoint::AfterTransmission,
            mtu: usize::MAX,
        }
    }
}

/// Both directions of a link between a constrained side (IoT devices) and a fixed host.
#[derive(Debug, Clone, PartialEq)]
pub struct LinkConfig {
    /// From the devices to the fixed host.
    pub up: DirectionConfig,
    /// From the fixed host to the devices.
    pub down: DirectionConfig,
}

/// The buffers of the congestion study, in bytes: about one bandwidth-delay product, and two
/// bufferbloated ones ("infinite").
pub const PAPER_BUFFERS: [usize; 3] = [2_500, 28_200, 1_410_000];

impl LinkConfig {
    /// The congestion-control paper's link: 60 kbit/s and 200 ms up, 30 kbit/s and 400 ms down, MTU
    /// 296, a drop-tail queue of `buffer` bytes in each direction, and the 10–20 ms
    /// rest of the path (after the uplink, before the downlink's queue); `loss` on the
    /// radio link in both directions (independent processes).
    pub fn paper(buffer: usize, loss: LossModel) -> LinkConfig {
        let rest = (Duration::from_millis(10), Duration::from_millis(20));
        let radio = DirectionConfig {
            queue_bytes: buffer,
            loss,
            mtu: 296,
            ..DirectionConfig::default()
        };
        LinkConfig {
            up: DirectionConfig {
                rate_bps: 60_000,
                delay: Duration::from_millis(200),
                jitter_after: rest,
                ..radio.clone()
            },
            down: DirectionConfig {
                rate_bps: 30_000,
                delay: Duration::from_millis(400),
                jitter_before: rest,
                ..radio
            },
        }
    }
}

/// Why a packet did not arrive.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Fate {
    /// It arrived.
    Delivered,
    /// Larger than the MTU.
    DroppedMtu,
    /// The queue was full.
    DroppedQueue,
    /// The loss process took it.
    DroppedLoss,
}

/// What happened to a packet, and when (delivery or drop time).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome<P> {
    /// When it was delivered or dropped.
    pub at: Nanos,
    /// The packet.
    pub packet: P,
    /// Its fate.
    pub fate: Fate,
}

/// Counters of one direction.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DirectionStats {
    /// Packets offered.
    pub packets_in: u64,
    /// Bytes offered (without `overhead`).
    pub bytes_in: u64,
    /// Packets delivered.
    pub packets_out: u64,
    /// Bytes delivered.
    pub bytes_out: u64,
    /// Packets dropped for their size.
    pub drops_mtu: u64,
    /// Packets dropped by the full queue.
    pub drops_queue: u64,
    /// Packets dropped by the loss process.
    pub drops_loss: u64,
    /// Most bytes (with `overhead`) ever waiting in the queue.
    pub peak_queue_bytes: u64,
    /// Time the Gilbert–Elliott process spent in the bad state so far.
    pub bad_ns: u64,
    /// Time the Gilbert–Elliott process has run so far.
    pub ge_ns: u64,
}

/// The Gilbert–Elliott process's state.
#[derive(Debug, Clone)]
struct GeState {
    model: GilbertElliott,
    rng: StdRng,
    bad: bool,
    since: Nanos,
    until: Nanos,
}

impl GeState {
    fn new(model: GilbertElliott, seed: u64) -> GeState {
        let mut s = GeState {
            model,
            rng: StdRng::seed_from_u64(seed),
            bad: false,
            since: 0,
            until: 0,
        };
        s.until = s.sojourn();
        s
    }

    fn sojourn(&mut self) -> Nanos {
        let m = &self.model;
        let (mean, min, max) = if self.bad {
            (m.bad_mean, m.bad_min, m.bad_max)
        } else {
            (m.good_mean, m.good_min, m.good_max)
        };
        let u: f64 = self.rng.random();
        let x = -mean.as_secs_f64() * (1.0 - u).ln();
        let x = x.clamp(min.as_secs_f64(), max.as_secs_f64().max(min.as_secs_f64()));
        ns(Duration::from_secs_f64(x)).max(1)
    }

    /// The state at `t` (not earlier than any previous query); counts bad time.
    fn bad_at(&mut self, t: Nanos, stats: &mut DirectionStats) -> bool {
        while t >= self.until {
            if self.bad {
                stats.bad_ns += self.until - self.since;
            }
            self.bad = !self.bad;
            self.since = self.until;
            self.until += self.sojourn();
        }
        self.bad
    }
}

/// One direction of a link in operation. See the [module documentation](self).
#[derive(Debug)]
pub struct Direction<P> {
    cfg: DirectionConfig,
    jitter_rng: StdRng,
    loss_rng: StdRng,
    ge: Option<GeState>,
    /// Packets after the first random delay, waiting to reach the queue: (time, len, packet).
    arriving: VecDeque<(Nanos, usize, P)>,
    last_arrival: Nanos,
    queue: VecDeque<(usize, P)>,
    queue_bytes: usize,
    /// The packet being transmitted: (end of transmission, len, packet).
    sending: Option<(Nanos, usize, P)>,
    /// Packets on their way: (delivery time, len, packet).
    flying: VecDeque<(Nanos, usize, P)>,
    last_delivery: Nanos,
    stats: DirectionStats,
}

impl<P> Direction<P> {
    /// A direction with nothing in it; every random draw follows from `seed`.
    pub fn new(cfg: DirectionConfig, seed: u64) -> Direction<P> {
        let ge = match cfg.loss {
            LossModel::GilbertElliott(m) => Some(GeState::new(m, seed ^ 0x6765_5f73_7461_7465)),
            _ => None,
        };
        Direction {
            jitter_rng: StdRng::seed_from_u64(seed ^ 0x6a69_7474_6572),
            loss_rng: StdRng::seed_from_u64(seed ^ 0x6c6f_7373),
            ge,
            cfg,
            arriving: VecDeque::new(),
            last_arrival: 0,
            queue: VecDeque::new(),
            queue_bytes: 0,
            sending: None,
            flying: VecDeque::new(),
            last_delivery: 0,
            stats: DirectionStats::default(),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &DirectionConfig {
        &self.cfg
    }

    /// Counters; the Gilbert–Elliott process is run up to `now` (not before the last
    /// event) to account its time.
    pub fn stats(&mut self, now: Nanos) -> DirectionStats {
        if let Some(ge) = &mut self.ge {
            let now = now.max(ge.since);
            ge.bad_at(now, &mut self.stats);
            self.stats.ge_ns = now;
            let open = if ge.bad { now - ge.since } else { 0 };
            let mut s = self.stats;
            s.bad_ns += open;
            return s;
        }
        self.stats
    }

    /// Bytes waiting in the queue now (with overhead).
    pub fn queued_bytes(&self) -> usize {
        self.queue_bytes
    }

    /// True when nothing is in the direction.
    pub fn is_idle(&self) -> bool {
        self.arriving.is_empty()
            && self.queue.is_empty()
            && self.sending.is_none()
            && self.flying.is_empty()
    }

    fn uniform(&mut self, (a, b): (Duration, Duration)) -> Nanos {
        let (a, b) = (ns(a), ns(b));
        if b > a {
            self.jitter_rng.random_range(a..=b)
        } else {
            a
        }
    }

    fn transmission_ns(&self, len: usize) -> Nanos {
        if self.cfg.rate_bps == 0 {
            return 0;
        }
        let bits = (len + self.cfg.overhead) as u128 * 8 * 1_000_000_000;
        u64::try_from(bits / u128::from(self.cfg.rate_bps)).unwrap_or(u64::MAX)
    }

    fn lost(&mut self, t: Nanos) -> bool {
        let p = match self.cfg.loss {
            LossModel::None => return false,
            LossModel::Bernoulli(p) => p,
            LossModel::GilbertElliott(m) => {
                let bad = self
                    .ge
                    .as_mut()
                    .expect("made with the model")
                    .bad_at(t, &mut self.stats);
                if bad {
                    m.p_bad
                } else {
                    m.p_good
                }
            }
        };
        p > 0.0 && self.loss_rng.random::<f64>() < p
    }

    /// A packet of `len` bytes enters the direction at `now` (not before the last
    /// call). Events up to `now` are processed first; drops and deliveries go to `out`.
    pub fn send(&mut self, now: Nanos, len: usize, packet: P, out: &mut Vec<Outcome<P>>) {
        self.advance(now, out);
        self.stats.packets_in += 1;
        self.stats.bytes_in += len as u64;
        if len > self.cfg.mtu {
            self.drop(now, packet, Fate::DroppedMtu, out);
            return;
        }
        let t = (now + self.uniform(self.cfg.jitter_before)).max(self.last_arrival);
        self.last_arrival = t;
        self.arriving.push_back((t, len, packet));
        self.advance(now, out);
    }

    /// When the next event happens (a packet reaches the queue, ends its transmission
    /// or is delivered), if any.
    pub fn next_event(&self) -> Option<Nanos> {
        [
            self.arriving.front().map(|a| a.0),
            self.sending.as_ref().map(|s| s.0),
            self.flying.front().map(|f| f.0),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// Processes every event up to `now` in time order.
    pub fn advance(&mut self, now: Nanos, out: &mut Vec<Outcome<P>>) {
        loop {
            let sent = self.sending.as_ref().map(|s| s.0).filter(|t| *t <= now);
            let arrived = self.arriving.front().map(|a| a.0).filter(|t| *t <= now);
            let landed = self.flying.front().map(|f| f.0).filter(|t| *t <= now);
            // At equal times: deliveries, then the end of a transmission (so that the
            // link is free), then arrivals.
            let next = [landed, sent, arrived].into_iter().flatten().min();
            let Some(t) = next else {
                return;
            };
            if landed == Some(t) {
                let (at, len, packet) = self.flying.pop_front().expect("front exists");
                self.stats.packets_out += 1;
                self.stats.bytes_out += len as u64;
                out.push(Outcome {
                    at,
                    packet,
                    fate: Fate::Delivered,
                });
            } else if sent == Some(t) {
                let (end, len, packet) = self.sending.take().expect("sending exists");
                self.transmitted(end, len, packet, out);
                if let Some((len, packet)) = self.queue.pop_front() {
                    self.queue_bytes -= len + self.cfg.overhead;
                    self.start(end, len, packet);
                }
            } else {
                let (t, len, packet) = self.arriving.pop_front().expect("front exists");
                self.enqueue(t, len, packet, out);
            }
        }
    }

    fn enqueue(&mut self, t: Nanos, len: usize, packet: P, out: &mut Vec<Outcome<P>>) {
        if self.cfg.loss_at == LossPoint::Arrival && self.lost(t) {
            self.drop(t, packet, Fate::DroppedLoss, out);
            return;
        }
        if self.sending.is_none() && self.queue.is_empty() {
            self.start(t, len, packet);
            return;
        }
        let size = len + self.cfg.overhead;
        if self.queue_bytes + size > self.cfg.queue_bytes {
            self.drop(t, packet, Fate::DroppedQueue, out);
            return;
        }
        self.queue_bytes += size;
        self.stats.peak_queue_bytes = self.stats.peak_queue_bytes.max(self.queue_bytes as u64);
        self.queue.push_back((len, packet));
    }

    fn drop(&mut self, at: Nanos, packet: P, fate: Fate, out: &mut Vec<Outcome<P>>) {
        match fate {
            Fate::DroppedMtu => self.stats.drops_mtu += 1,
            Fate::DroppedQueue => self.stats.drops_queue += 1,
            Fate::DroppedLoss => self.stats.drops_loss += 1,
            Fate::Delivered => {}
        }
        out.push(Outcome { at, packet, fate });
    }

    fn start(&mut self, t: Nanos, len: usize, packet: P) {
        let end = t + self.transmission_ns(len);
        self.sending = Some((end, len, packet));
    }

    fn transmitted(&mut self, end: Nanos, len: usize, packet: P, out: &mut Vec<Outcome<P>>) {
        if self.cfg.loss_at == LossPoint::AfterTransmission && self.lost(end) {
            self.drop(end, packet, Fate::DroppedLoss, out);
            return;
        }
        let at = (end + ns(self.cfg.delay) + self.uniform(self.cfg.jitter_after))
            .max(self.last_delivery);
        self.last_delivery = at;
        self.flying.push_back((at, len, packet));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Nanos = 1_000_000;

    fn run<P: Clone>(d: &mut Direction<P>, until: Nanos) -> Vec<Outcome<P>> {
        let mut out = Vec::new();
        d.advance(until, &mut out);
        out
    }

    #[test]
    fn serialises_at_the_rate_then_delays() {
        // 30 kbit/s: 100 bytes take 26.67 ms; then 400 ms of propagation.
        let cfg = DirectionConfig {
            rate_bps: 30_000,
            delay: Duration::from_millis(400),
            ..DirectionConfig::default()
        };
        let mut d = Direction::new(cfg, 1);
        let mut out = Vec::new();
        d.send(0, 100, 'a', &mut out);
        d.send(0, 100, 'b', &mut out);
        assert!(out.is_empty());
        let out = run(&mut d, 10_000 * MS);
        let at: Vec<Nanos> = out.iter().map(|o| o.at).collect();
        assert_eq!(at, [426_666_666, 453_333_332]);
        assert!(out.iter().all(|o| o.fate == Fate::Delivered));
        assert!(d.is_idle());
    }

    #[test]
    fn drop_tail_counts_bytes_waiting_but_not_the_packet_in_service() {
        let cfg = DirectionConfig {
            rate_bps: 8_000,
            queue_bytes: 250,
            ..DirectionConfig::default()
        };
        let mut d = Direction::new(cfg, 1);
        let mut out = Vec::new();
        for i in 0..5 {
            d.send(0, 100, i, &mut out);
        }
        // 0 in service, 1 and 2 queued (200 B), 3 and 4 do not fit in 250 B.
        let dropped: Vec<i32> = out.iter().map(|o| o.packet).collect();
        assert_eq!(dropped, [3, 4]);
        assert!(out.iter().all(|o| o.fate == Fate::DroppedQueue));
        assert_eq!(d.stats(0).peak_queue_bytes, 200);
        let delivered: Vec<Nanos> = run(&mut d, u64::MAX / 2).iter().map(|o| o.at).collect();
        assert_eq!(delivered, [100 * MS, 200 * MS, 300 * MS]);
    }

    #[test]
    fn random_delays_never_reorder() {
        let cfg = DirectionConfig {
            jitter_before: (Duration::from_millis(10), Duration::from_millis(20)),
            jitter_after: (Duration::from_millis(0), Duration::from_millis(50)),
            ..DirectionConfig::default()
        };
        let mut d = Direction::new(cfg, 7);
        let mut out = Vec::new();
        for i in 0..1000u64 {
            d.send(i * MS, 10, i, &mut out);
        }
        out.extend(run(&mut d, u64::MAX / 2));
        let order: Vec<u64> = out.iter().map(|o| o.packet).collect();
        assert_eq!(order, (0..1000).collect::<Vec<_>>());
        assert!(out.windows(2).all(|w| w[0].at <= w[1].at));
        assert!(out.iter().all(|o| o.at >= o.packet * MS + 10 * MS));
    }

    #[test]
    fn mtu_and_arrival_loss_drop_before_the_queue() {
        let cfg = DirectionConfig {
            rate_bps: 8_000,
            mtu: 296,
            loss: LossModel::Bernoulli(1.0),
            loss_at: LossPoint::Arrival,
            ..DirectionConfig::default()
        };
        let mut d = Direction::new(cfg, 1);
        let mut out = Vec::new();
        d.send(0, 297, 0, &mut out);
        d.send(0, 296, 1, &mut out);
        let fates: Vec<Fate> = out.iter().map(|o| o.fate).collect();
        assert_eq!(fates, [Fate::DroppedMtu, Fate::DroppedLoss]);
        assert!(d.is_idle(), "a packet lost on arrival uses no airtime");
    }

    #[test]
    fn the_paper_profiles_lose_10_and_18_percent_over_a_long_run() {
        // Analytically (clamped exponential periods): 10.25 % and 17.99 %.
        assert!((GilbertElliott::medium().expected_loss() - 0.1025).abs() < 0.0005);
        assert!((GilbertElliott::high().expected_loss() - 0.1799).abs() < 0.0005);
        for (model, want) in [
            (GilbertElliott::medium(), 0.1025),
            (GilbertElliott::high(), 0.1799),
        ] {
            let cfg = DirectionConfig {
                loss: LossModel::GilbertElliott(model),
                ..DirectionConfig::default()
            };
            let mut d = Direction::new(cfg, 42);
            let mut out = Vec::new();
            // 200,000 packets, one every 10 ms (2,000 s, ~4,000 good/bad cycles).
            for i in 0..200_000u64 {
                d.send(i * 10 * MS, 10, (), &mut out);
            }
            out.extend(run(&mut d, u64::MAX / 2));
            let lost = out.iter().filter(|o| o.fate == Fate::DroppedLoss).count();
            let rate = lost as f64 / 200_000.0;
            assert!((rate - want).abs() < 0.01, "{rate} vs {want}");
            let s = d.stats(2_000_000 * MS);
            let bad = s.bad_ns as f64 / s.ge_ns as f64;
            assert!((bad - model.bad_fraction()).abs() < 0.01, "{bad}");
        }
    }

    #[test]
    fn the_loss_timeline_depends_on_the_seed_only() {
        let cfg = DirectionConfig {
            loss: LossModel::GilbertElliott(GilbertElliott::high()),
            ..DirectionConfig::default()
        };
        let bad_time = |step: u64| {
            let mut d = Direction::new(cfg.clone(), 5);
            let mut out = Vec::new();
            for i in 0..(100_000 / step) {
                d.send(i * step * MS, 10, (), &mut out);
            }
            d.stats(100_000 * MS).bad_ns
        };
        assert_eq!(bad_time(10), bad_time(37));
    }
}
