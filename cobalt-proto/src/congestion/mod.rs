//! Congestion control for confirmable messages over UDP: how long to wait before
//! retransmitting, how to back off, and what to learn from each answer.
//!
//! An algorithm is a [`Controller`]: one instance per peer (the 5-tuple: this endpoint's
//! socket and the peer's address), kept in the endpoint's entry for the peer (for at
//! most [`max_congestion_peers`](crate::endpoint::EndpointConfig::max_congestion_peers)
//! peers) and forgotten when idle. The endpoint asks it for the timeout of each
//! exchange's original transmission ([`Controller::first_timeout`]) and of every
//! retransmission ([`Controller::next_timeout`]), and tells it when an exchange was
//! answered ([`Controller::on_answer`]). Which algorithm runs is chosen per endpoint with
//! [`Algorithm`] (`endpoint.congestion_control` in the configuration, `--cc` on the
//! command line):
//!
//! | algorithm | file | rule |
//! |---|---|---|
//! | [`Algorithm::Default`] | [`default`] | RFC 7252 §4.2: 2–3 s, doubled per retransmission, nothing learnt |
//! | [`Algorithm::Cocoa`] | [`cocoa`] | draft-ietf-core-cocoa-03: strong and weak RTT estimators, variable backoff, aging |
//! | [`Algorithm::CocoaStrong`] | [`cocoa`] | CoCoA without the weak estimator |
//! | [`Algorithm::Fasor`] | [`fasor`] | draft-ietf-core-fasor-02: FastRTO from unambiguous samples, SlowRTO after retransmissions |
//! | [`Algorithm::FasorK`] | [`fasor`] | FASOR-K: FASOR that keeps the backed-off timer (Karn) instead of SlowRTO |
//! | [`Algorithm::Karn`] | [`karn`] | TCP's timer (RFC 6298): unambiguous samples only, a backed-off timer kept for the next exchanges |
//!
//! The endpoint's default is [`Algorithm::Fasor`]
//! ([`EndpointConfig::congestion_control`](crate::endpoint::EndpointConfig::congestion_control)),
//! the published algorithm that did best over every case of the congestion study in
//! virtual time. [`Algorithm::FasorK`], Cobalt's own variant, was the default while it
//! led on the cases it was chosen on; on the held-out workloads it only ties FASOR on
//! the median and has a much heavier tail on lossy links, which constrained devices
//! see most. The numbers and the verdict, generated from the study's results, are in
//! `bench/congestion/README.md` ("Every variant on every virtual case").
//!
//! Non-confirmable messages outside exchanges (NON notifications) follow the rules of
//! CoCoA §5 under every algorithm that keeps an RTO estimate ([`non`]).
//!
//! The traits are public so that an application can bring its own algorithm:
//! implement [`Controller`] and [`ControllerFactory`] and hand the factory to
//! `Endpoint::set_congestion_factory`.

pub mod cocoa;
pub mod default;
pub mod fasor;
pub mod karn;
pub mod non;
mod peers;
mod rtt;

pub use peers::CongestionStats;
pub(crate) use peers::{Congestion, Hold, PeerCongestion, States};
pub use rtt::RttEstimator;

use rand::{Rng, RngCore};
use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The retransmission-timeout algorithms Cobalt ships. `Default` is RFC 7252's (and
/// this type's [`Default`] value); an endpoint runs [`Algorithm::Fasor`] unless
/// configured otherwise (see the [module documentation](self)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Algorithm {
    /// RFC 7252 §4.2: every exchange starts at ACK_TIMEOUT × U(1, ACK_RANDOM_FACTOR) and
    /// doubles it on each retransmission; no RTT estimation.
    #[default]
    Default,
    /// CoCoA (draft-ietf-core-cocoa-03) with its strong and weak estimators.
    Cocoa,
    /// CoCoA using only strong (unambiguous) RTT samples.
    CocoaStrong,
    /// FASOR (draft-ietf-core-fasor-02): Karn-style FastRTO plus SlowRTO after retransmissions.
    Fasor,
    /// FASOR with Karn's retention of the backed-off timer in place of SlowRTO.
    FasorK,
    /// RFC 6298's timer with Karn's algorithm, as TCP runs it.
    Karn,
}

impl Algorithm {
    /// Every algorithm, in the order of the table in the [module documentation](self).
    pub const ALL: [Algorithm; 6] = [
        Algorithm::Default,
        Algorithm::Cocoa,
        Algorithm::CocoaStrong,
        Algorithm::Fasor,
        Algorithm::FasorK,
        Algorithm::Karn,
    ];

    /// The name used in configuration files and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Algorithm::Default => "default",
            Algorithm::Cocoa => "cocoa",
            Algorithm::CocoaStrong => "cocoa-strong",
            Algorithm::Fasor => "fasor",
            Algorithm::FasorK => "fasor-k",
            Algorithm::Karn => "karn",
        }
    }

    /// A new controller of this algorithm for one peer.
    pub fn controller(self, params: Params, now: Instant) -> Box<dyn Controller> {
        match self {
            Algorithm::Default => Box::new(default::DefaultRto::new(params)),
            Algorithm::Cocoa => Box::new(cocoa::Cocoa::new(params, now, true)),
            Algorithm::CocoaStrong => Box::new(cocoa::Cocoa::new(params, now, false)),
            Algorithm::Fasor => Box::new(fasor::Fasor::new(params)),
            Algorithm::FasorK => Box::new(fasor::Fasor::with_retention(params)),
            Algorithm::Karn => Box::new(karn::Karn::new(params)),
        }
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A name that is not one of [`Algorithm::ALL`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownAlgorithm(pub String);

impl fmt::Display for UnknownAlgorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "unknown congestion control `{}`: use default, cocoa, cocoa-strong, fasor, fasor-k or karn",
            self.0
        )
    }
}

impl std::error::Error for UnknownAlgorithm {}

impl FromStr for Algorithm {
    type Err = UnknownAlgorithm;

    fn from_str(s: &str) -> Result<Algorithm, UnknownAlgorithm> {
        Algorithm::ALL
            .into_iter()
            .find(|a| a.name().eq_ignore_ascii_case(s.trim()))
            .ok_or_else(|| UnknownAlgorithm(s.to_string()))
    }
}

/// An algorithm is written by its [name](Algorithm::name).
#[cfg(feature = "serde")]
impl serde::Serialize for Algorithm {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

/// An algorithm is read from its [name](Algorithm::name).
#[cfg(feature = "serde")]
impl<'de> serde::Deserialize<'de> for Algorithm {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Algorithm, D::Error> {
        let name = String::deserialize(d)?;
        name.parse().map_err(serde::de::Error::custom)
    }
}

/// The endpoint's transmission parameters an algorithm may use (RFC 7252 §4.8).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Params {
    /// ACK_TIMEOUT: the initial RTO of every algorithm (2 s by default).
    pub ack_timeout: Duration,
    /// ACK_RANDOM_FACTOR: dithering of the timeouts of Default CoAP and CoCoA (1.5).
    pub ack_random_factor: f64,
}

impl Default for Params {
    fn default() -> Self {
        Params {
            ack_timeout: Duration::from_secs(2),
            ack_random_factor: 1.5,
        }
    }
}

impl Params {
    /// A dithering factor uniform in [1, ACK_RANDOM_FACTOR).
    pub fn dither(&self, rng: &mut dyn RngCore) -> f64 {
        if self.ack_random_factor > 1.0 {
            rng.random_range(1.0..self.ack_random_factor)
        } else {
            1.0
        }
    }
}

/// The timing of one confirmable message's transmissions, kept by the endpoint with
/// the message and handed to the peer's [`Controller`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Attempt {
    /// When the original transmission left (RTT samples are timed from it).
    pub first_sent: Instant,
    /// Retransmissions sent so far.
    pub retransmissions: u32,
    /// The timeout armed after the latest transmission.
    pub timeout: Duration,
    /// The algorithm's own per-exchange value: the undithered RTO that the next
    /// backoff starts from (Default CoAP and CoCoA) or the FastRTO backoff series
    /// timer (FASOR).
    pub base: Duration,
    /// The dithering factor drawn for this exchange (1 where an algorithm dithers
    /// differently or not at all).
    pub dither: f64,
    /// The first timeout was raised to the floor of ACK_TIMEOUT/4: the exchange's
    /// later timeouts keep to the doubled floor as well.
    pub floored: bool,
}

impl Attempt {
    /// An attempt starting at `now` whose first timeout is `timeout`.
    pub fn new(now: Instant, timeout: Duration, base: Duration, dither: f64) -> Attempt {
        Attempt {
            first_sent: now,
            retransmissions: 0,
            timeout,
            base,
            dither,
            floored: false,
        }
    }

    /// Time from the original transmission to `now`: the RTT sample of an answer.
    pub fn elapsed(&self, now: Instant) -> Duration {
        now.saturating_duration_since(self.first_sent)
    }
}

/// An RTO algorithm's state for one peer.
pub trait Controller: Send + fmt::Debug {
    /// Starts an exchange at `now`: the timeout of its original transmission. `parallel`
    /// exchanges with this peer are already waiting for their answer.
    fn first_timeout(&mut self, now: Instant, parallel: usize, rng: &mut dyn RngCore) -> Attempt;

    /// The previous timeout expired and a retransmission leaves now: count it in
    /// `attempt.retransmissions` and set `attempt.timeout` (and `base`) for it.
    fn next_timeout(&mut self, now: Instant, attempt: &mut Attempt);

    /// The exchange of `attempt` was answered at `now` (ACK, piggybacked or separate
    /// response, or RST): learn from it.
    fn on_answer(&mut self, now: Instant, attempt: &Attempt);

    /// The exchange of `attempt` ended unanswered (given up or cancelled).
    fn on_abandon(&mut self, _now: Instant, _attempt: &Attempt) {}

    /// The current overall RTO estimate (after aging), or `None` for an algorithm that
    /// keeps none (Default CoAP): non-confirmable messages are then not paced.
    fn rto(&mut self, now: Instant) -> Option<Duration>;
}

/// Builds a peer's [`Controller`]: what `Endpoint::set_congestion_factory` takes to
/// run an algorithm that Cobalt does not ship.
pub trait ControllerFactory: Send + Sync + fmt::Debug {
    /// A fresh controller for a peer seen for the first time (or again after its
    /// state expired).
    fn build(&self, params: Params, now: Instant) -> Box<dyn Controller>;

    /// The algorithm [`build`](ControllerFactory::build) runs, when it is one that
    /// Cobalt ships: each peer's entry then keeps the small state of the default
    /// (FASOR) inline instead of in an allocation of its own. `None` (the default)
    /// for an application's own algorithm.
    fn algorithm(&self) -> Option<Algorithm> {
        None
    }
}

impl ControllerFactory for Algorithm {
    fn build(&self, params: Params, now: Instant) -> Box<dyn Controller> {
        self.controller(params, now)
    }

    fn algorithm(&self) -> Option<Algorithm> {
        Some(*self)
    }
}

/// A shared factory.
pub type SharedFactory = Arc<dyn ControllerFactory>;

/// `d` × `f`, saturating at about 584 years instead of panicking.
pub(crate) fn mul(d: Duration, f: f64) -> Duration {
    Duration::try_from_secs_f64(d.as_secs_f64() * f).unwrap_or(Duration::MAX)
}

#[cfg(test)]
pub(crate) mod testing {
    //! Helpers for hand-computed sequences: a random source that always yields the
    //! same value, so that dithering is known.
    use rand::RngCore;

    /// Yields `u64::MAX / 2`-ish words: `random_range(a..b)` on f64 gives (a+b)/2.
    pub struct Midpoint;

    impl RngCore for Midpoint {
        fn next_u32(&mut self) -> u32 {
            1 << 31
        }
        fn next_u64(&mut self) -> u64 {
            1 << 63
        }
        fn fill_bytes(&mut self, dst: &mut [u8]) {
            dst.fill(0x80);
        }
    }

    /// Yields zero words: `random_range(a..b)` gives `a`.
    pub struct Low;

    impl RngCore for Low {
        fn next_u32(&mut self) -> u32 {
            0
        }
        fn next_u64(&mut self) -> u64 {
            0
        }
        fn fill_bytes(&mut self, dst: &mut [u8]) {
            dst.fill(0);
        }
    }

    /// Milliseconds.
    pub fn ms(v: u64) -> std::time::Duration {
        std::time::Duration::from_millis(v)
    }

    /// Asserts two durations agree to within a microsecond.
    #[track_caller]
    pub fn close(a: std::time::Duration, b: std::time::Duration) {
        let d = a.abs_diff(b);
        assert!(d < std::time::Duration::from_micros(1), "{a:?} != {b:?}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_unknown_names_say_what_is_allowed() {
        for a in Algorithm::ALL {
            assert_eq!(a.name().parse::<Algorithm>(), Ok(a));
            assert_eq!(a.to_string(), a.name());
        }
        assert_eq!("CoCoA".parse::<Algorithm>(), Ok(Algorithm::Cocoa));
        let e = "reno".parse::<Algorithm>().unwrap_err().to_string();
        assert!(e.contains("reno") && e.contains("cocoa-strong"), "{e}");
    }

    #[test]
    fn midpoint_rng_gives_the_middle_of_a_range() {
        let mut r = testing::Midpoint;
        let p = Params::default();
        assert!((p.dither(&mut r) - 1.25).abs() < 1e-9);
        let mut r = testing::Low;
        assert_eq!(p.dither(&mut r), 1.0);
    }
}
