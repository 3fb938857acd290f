//! FASOR, Fast-Slow RTO (draft-ietf-core-fasor-02).
//!
//! - **FastRTO** is RFC 6298 fed only with unambiguous samples (exchanges answered
//!   without retransmission), initially 2 s (ACK_TIMEOUT), without the 1 s floor, at
//!   most 60 s. The first sample R sets SRTT = R and RTTVAR = R/(2K) with K = 4 (§3.1),
//!   so FastRTO = 1.5 R. Each exchange dithers it to FastRTO + U(SRTT/4, SRTT), with
//!   SRTT = FastRTO/3 before the first sample.
//! - **SlowRTO** = 1.5 × (time from the original transmission to the answer) of the
//!   latest exchange that needed retransmissions; not smoothed (§3.2).
//! - **Three states** (§3.3–3.4) pick the timers of an exchange:
//!   - FAST: FastRTO, 2·FastRTO, 4·FastRTO, ...
//!   - FAST_SLOW_FAST: FastRTO, max(SlowRTO, 2·FastRTO), 2·FastRTO, 4·FastRTO, ...
//!   - SLOW_FAST: SlowRTO, FastRTO, 2·FastRTO, 4·FastRTO, ...
//!
//!   An unambiguous answer returns to FAST; an answer after retransmissions moves
//!   FAST → FAST_SLOW_FAST → SLOW_FAST (which it then keeps).
//!
//! Because SlowRTO carries the time the previous exchange needed, the backed-off
//! timer survives into the next exchange until an unambiguous sample arrives: the
//! retention rule of Karn's algorithm that Default CoAP and CoCoA lack.
//!
//! Not implemented: the optional Rexmit-Cnt option (§4; its number is still TBD) and
//! its Token-based alternative. Every timer is capped at 60 s (the draft's "MAY be
//! upper-bounded by at least 60 seconds"); the state of the exchange's peer is read at
//! each transmission, as in the draft's pseudocode.

use super::{mul, Attempt, Controller, Params, RttEstimator};
use rand::{Rng, RngCore};
use std::time::{Duration, Instant};

/// Upper bound on every timer.
pub const MAX_RTO: Duration = Duration::from_secs(60);
/// SlowRTO is this many times the time an exchange with retransmissions took.
pub const SLOW_RTO_FACTOR: f64 = 1.5;

/// Which backoff series the next exchange uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// The previous exchange was answered without retransmission.
    Fast,
    /// The previous exchange needed retransmissions (after FAST).
    FastSlowFast,
    /// Two or more exchanges in a row needed retransmissions.
    SlowFast,
}

/// FASOR's state for one peer.
#[derive(Debug, Clone)]
pub struct Fasor {
    fast: RttEstimator,
    slow_rto: Duration,
    state: State,
}

impl Fasor {
    /// The controller for one peer.
    pub fn new(params: Params) -> Fasor {
        Fasor {
            fast: RttEstimator::new(params.ack_timeout.min(MAX_RTO), 4.0),
            slow_rto: params.ack_timeout,
            state: State::Fast,
        }
    }

    /// The state the next exchange starts in.
    pub fn state(&self) -> State {
        self.state
    }

    /// The latest SlowRTO.
    pub fn slow_rto(&self) -> Duration {
        self.slow_rto
    }
}

impl Controller for Fasor {
    fn first_timeout(&mut self, now: Instant, _parallel: usize, rng: &mut dyn RngCore) -> Attempt {
        let srtt = self
            .fast
            .smoothed()
            .unwrap_or(self.fast.rto / 3)
            .as_secs_f64();
        let extra = if srtt > 0.0 {
            rng.random_range(srtt / 4.0..srtt)
        } else {
            0.0
        };
        let fast = (self.fast.rto + Duration::from_secs_f64(extra)).min(MAX_RTO);
        let timeout = match self.state {
            State::Fast | State::FastSlowFast => fast,
            State::SlowFast => self.slow_rto.min(MAX_RTO),
        };
        Attempt::new(now, timeout, fast, 1.0)
    }

    fn next_timeout(&mut self, _now: Instant, attempt: &mut Attempt) {
        attempt.retransmissions += 1;
        attempt.timeout = match (self.state, attempt.retransmissions) {
            (State::FastSlowFast, 1) => self.slow_rto.max(attempt.base.saturating_mul(2)),
            (State::SlowFast, 1) => attempt.base,
            _ => {
                attempt.base = attempt.base.saturating_mul(2).min(MAX_RTO);
                attempt.base
            }
        }
        .min(MAX_RTO);
    }

    fn on_answer(&mut self, now: Instant, attempt: &Attempt) {
        let sample = attempt.elapsed(now);
        if attempt.retransmissions == 0 {
            self.fast.sample(sample, 1.0 / 8.0);
            self.fast.rto = self.fast.rto.min(MAX_RTO);
            self.state = State::Fast;
        } else {
            self.slow_rto = mul(sample, SLOW_RTO_FACTOR);
            self.state = match self.state {
                State::Fast => State::FastSlowFast,
                State::FastSlowFast | State::SlowFast => State::SlowFast,
            };
        }
    }

    fn rto(&mut self, _now: Instant) -> Option<Duration> {
        Some(self.fast.rto)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::congestion::testing::{close, ms, Low, Midpoint};

    fn series(c: &mut Fasor, n: usize, rng: &mut dyn RngCore) -> Vec<Duration> {
        let t0 = Instant::now();
        let mut a = c.first_timeout(t0, 0, rng);
        let mut v = vec![a.timeout];
        for _ in 1..n {
            c.next_timeout(t0, &mut a);
            v.push(a.timeout);
        }
        v
    }

    fn check(got: &[Duration], want_ms: &[f64]) {
        assert_eq!(got.len(), want_ms.len());
        for (g, w) in got.iter().zip(want_ms) {
            close(*g, Duration::from_secs_f64(w / 1000.0));
        }
    }

    fn answered(c: &mut Fasor, rexmits: u32, rtt: Duration) {
        let t0 = Instant::now();
        let mut a = Attempt::new(t0, ms(1), ms(1), 1.0);
        a.retransmissions = rexmits;
        c.on_answer(t0 + rtt, &a);
    }

    #[test]
    fn initial_rto_is_dithered_by_a_third_of_itself() {
        let mut c = Fasor::new(Params::default());
        // 2 s + U(1/6 s, 2/3 s): the low end, doubling to the 60 s cap.
        let low = 2000.0 + 1000.0 / 6.0;
        check(
            &series(&mut c, 7, &mut Low),
            &[
                low,
                2.0 * low,
                4.0 * low,
                8.0 * low,
                16.0 * low,
                60_000.0,
                60_000.0,
            ],
        );
        // The middle of the range: 2 s + 5/12 s.
        check(&series(&mut c, 1, &mut Midpoint), &[2000.0 + 5000.0 / 12.0]);
    }

    #[test]
    fn the_three_states_follow_the_drafts_state_machine() {
        let mut c = Fasor::new(Params::default());
        // First unambiguous sample 0.8 s: SRTT 0.8, RTTVAR 0.1, FastRTO 1.2 s; dithered
        // by U(0.2, 0.8) s, 1.4 s at the low end.
        answered(&mut c, 0, ms(800));
        assert_eq!(c.state(), State::Fast);
        check(&series(&mut c, 3, &mut Low), &[1400.0, 2800.0, 5600.0]);
        // Answered 3 s after the original, after one retransmission: SlowRTO 4.5 s.
        answered(&mut c, 1, ms(3000));
        assert_eq!(c.state(), State::FastSlowFast);
        close(c.slow_rto(), ms(4500));
        check(
            &series(&mut c, 5, &mut Low),
            &[1400.0, 4500.0, 2800.0, 5600.0, 11_200.0],
        );
        // Retransmissions again: SlowRTO 1.5 × 7 s, and SLOW_FAST starts with it.
        answered(&mut c, 2, ms(7000));
        assert_eq!(c.state(), State::SlowFast);
        check(
            &series(&mut c, 4, &mut Low),
            &[10_500.0, 1400.0, 2800.0, 5600.0],
        );
        answered(&mut c, 1, ms(2000));
        assert_eq!(c.state(), State::SlowFast);
        check(&series(&mut c, 1, &mut Low), &[3000.0]);
        // An unambiguous 1 s sample returns to FAST: RTTVAR 0.75·0.1 + 0.25·0.2 =
        // 0.125, SRTT 0.825, FastRTO 0.825 + 0.5 = 1.325 s.
        answered(&mut c, 0, ms(1000));
        assert_eq!(c.state(), State::Fast);
        close(c.rto(Instant::now()).unwrap(), ms(1325));
    }

    #[test]
    fn in_fast_slow_fast_a_short_slow_rto_never_undercuts_the_backoff() {
        let mut c = Fasor::new(Params::default());
        answered(&mut c, 0, ms(800));
        answered(&mut c, 1, ms(1000));
        // SlowRTO 1.5 s < 2 × 1.4 s.
        check(&series(&mut c, 3, &mut Low), &[1400.0, 2800.0, 2800.0]);
    }

    #[test]
    fn timers_are_capped_at_60_s() {
        let mut c = Fasor::new(Params::default());
        answered(&mut c, 1, ms(50_000));
        answered(&mut c, 1, ms(50_000));
        assert_eq!(c.state(), State::SlowFast);
        check(&series(&mut c, 1, &mut Low), &[60_000.0]);
    }
}
