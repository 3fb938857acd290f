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
//!
//! # FASOR-K
//!
//! [`Fasor::with_retention`] (`fasor-k`) is Cobalt's variant: the same FastRTO, states
//! and probing, but where FASOR waits SlowRTO once and then falls back to the FastRTO
//! series, FASOR-K keeps the backed-off timer that ended the last exchange with
//! retransmissions (K) and backs off from it, as Karn's algorithm does in TCP, until an
//! unambiguous sample arrives:
//!
//! - FAST: FastRTO, 2·FastRTO, 4·FastRTO, ...
//! - FAST_SLOW_FAST: a probe at FastRTO (a random loss is repaired at once), then 2K,
//!   4K, ... (a failed probe points at congestion: keep backing off);
//! - SLOW_FAST: K, 2K, 4K, ... (an exchange given up also leads here).
//!
//! Timers are capped at 120 s (Linux TCP's largest RTO). In the congestion study this
//! takes the heavily congested cases it was chosen on, where FASOR alone gains little
//! over Default CoAP, but over every case in virtual time it only ties FASOR on the
//! median and, on the lossy links, has a much heavier tail: a backed-off timer kept
//! after random losses delays the exchanges that follow. So FASOR, not FASOR-K, is the
//! endpoint's default (the verdict in `bench/congestion/README.md`).

use super::{mul, Attempt, Controller, Params};
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

/// Upper bound on every timer of FASOR-K (Linux TCP's 120 s).
pub const MAX_RTO_KARN: Duration = Duration::from_secs(120);

/// FASOR's state for one peer: 32 bytes, kept inline in the peer table (a client
/// keeps it for each of the thousands of devices it observes).
///
/// FastRTO's SRTT and RTTVAR are kept as the RFC 6298 estimator computes them, so
/// FastRTO is exact; SlowRTO and FASOR-K's retained timer are kept in whole
/// microseconds, rounded up (never shorter than computed, at most 1 µs longer).
#[derive(Debug, Clone, Copy)]
pub struct Fasor {
    /// FastRTO's smoothed RTT in seconds (RFC 6298, K = 4); meaningful once `sampled`.
    srtt: f64,
    /// FastRTO's RTT variation in seconds; meaningful once `sampled`.
    rttvar: f64,
    /// FastRTO before the first unambiguous sample (ACK_TIMEOUT, at most 60 s), µs.
    initial_us: u32,
    /// The latest SlowRTO, µs.
    slow_rto_us: u32,
    /// FASOR-K: the backed-off timer that ended the last exchange with
    /// retransmissions, µs (at least 1); 0 for none.
    retained_us: u32,
    state: State,
    /// FASOR-K (capped at `MAX_RTO_KARN`) rather than FASOR (`MAX_RTO`).
    karn: bool,
    /// An unambiguous sample was taken: FastRTO comes from `srtt` and `rttvar`.
    sampled: bool,
}

/// FastRTO's variance multiplier K (RFC 6298).
const FAST_K: f64 = 4.0;

/// `d` in whole microseconds, rounded up, saturating at about 71 minutes (far above
/// every cap on a timer).
fn micros(d: Duration) -> u32 {
    let us = d.as_nanos().div_ceil(1000);
    u32::try_from(us).unwrap_or(u32::MAX)
}

fn from_micros(us: u32) -> Duration {
    Duration::from_micros(u64::from(us))
}

impl Fasor {
    /// The controller for one peer, as the draft specifies it.
    pub fn new(params: Params) -> Fasor {
        Fasor {
            srtt: 0.0,
            rttvar: 0.0,
            initial_us: micros(params.ack_timeout.min(MAX_RTO)),
            slow_rto_us: micros(params.ack_timeout),
            retained_us: 0,
            state: State::Fast,
            karn: false,
            sampled: false,
        }
    }

    /// FASOR-K for one peer: FASOR with Karn's retention in place of SlowRTO (see
    /// the [module documentation](self)).
    pub fn with_retention(params: Params) -> Fasor {
        Fasor {
            karn: true,
            ..Fasor::new(params)
        }
    }

    /// FASOR-K: the backed-off timer kept for the next exchanges, if any.
    pub fn retained(&self) -> Option<Duration> {
        (self.retained_us > 0).then(|| from_micros(self.retained_us))
    }

    /// The state the next exchange starts in.
    pub fn state(&self) -> State {
        self.state
    }

    /// The latest SlowRTO.
    pub fn slow_rto(&self) -> Duration {
        from_micros(self.slow_rto_us)
    }

    /// The current FastRTO.
    fn fast_rto(&self) -> Duration {
        if self.sampled {
            super::rtt::estimate(self.srtt, self.rttvar, FAST_K).min(self.cap())
        } else {
            from_micros(self.initial_us)
        }
    }

    /// Keeps `timer` as FASOR-K's retained timer.
    fn retain(&mut self, timer: Duration) {
        self.retained_us = micros(timer).max(1);
    }

    /// The upper bound on every timer (a function of the variant, not a field: the
    /// state of each of thousands of peers stays small).
    fn cap(&self) -> Duration {
        if self.karn {
            MAX_RTO_KARN
        } else {
            MAX_RTO
        }
    }
}

impl Controller for Fasor {
    fn first_timeout(&mut self, now: Instant, _parallel: usize, rng: &mut dyn RngCore) -> Attempt {
        let fast_rto = self.fast_rto();
        let srtt = if self.sampled {
            Duration::from_secs_f64(self.srtt)
        } else {
            fast_rto / 3
        }
        .as_secs_f64();
        let extra = if srtt > 0.0 {
            rng.random_range(srtt / 4.0..srtt)
        } else {
            0.0
        };
        let fast = (fast_rto + Duration::from_secs_f64(extra)).min(self.cap());
        match (self.state, self.retained()) {
            (State::Fast | State::FastSlowFast, _) => Attempt::new(now, fast, fast, 1.0),
            // FASOR-K: the retained backed-off timer, and backing off from it.
            (State::SlowFast, Some(k)) if self.karn => {
                let k = k.min(self.cap());
                Attempt::new(now, k, k, 1.0)
            }
            (State::SlowFast, _) => Attempt::new(now, self.slow_rto().min(self.cap()), fast, 1.0),
        }
    }

    fn next_timeout(&mut self, _now: Instant, attempt: &mut Attempt) {
        attempt.retransmissions += 1;
        let cap = self.cap();
        attempt.timeout = match (self.state, attempt.retransmissions, self.karn) {
            // The probe at FastRTO failed: congestion is likely; FASOR-K continues
            // from the retained backed-off timer, FASOR waits SlowRTO once.
            (State::FastSlowFast, 1, true) => {
                let k = self.retained().unwrap_or(attempt.base);
                attempt.base = k.saturating_mul(2).min(cap);
                attempt.base
            }
            (State::FastSlowFast, 1, false) => self.slow_rto().max(attempt.base.saturating_mul(2)),
            (State::SlowFast, 1, false) => attempt.base,
            _ => {
                attempt.base = attempt.base.saturating_mul(2).min(cap);
                attempt.base
            }
        }
        .min(cap);
    }

    fn on_answer(&mut self, now: Instant, attempt: &Attempt) {
        let sample = attempt.elapsed(now);
        if attempt.retransmissions == 0 {
            (self.srtt, self.rttvar) =
                super::rtt::smooth(self.srtt, self.rttvar, !self.sampled, sample, 1.0 / 8.0);
            self.sampled = true;
            self.state = State::Fast;
            self.retained_us = 0;
        } else {
            self.slow_rto_us = micros(mul(sample, SLOW_RTO_FACTOR));
            self.retain(attempt.timeout);
            self.state = match self.state {
                State::Fast => State::FastSlowFast,
                State::FastSlowFast | State::SlowFast => State::SlowFast,
            };
        }
    }

    fn on_abandon(&mut self, _now: Instant, attempt: &Attempt) {
        if self.karn {
            // Nothing came back at all: keep the last timer and skip the probe.
            self.retain(attempt.timeout);
            self.state = State::SlowFast;
        }
    }

    fn rto(&mut self, _now: Instant) -> Option<Duration> {
        Some(self.fast_rto())
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
    fn fasor_k_backs_off_from_the_retained_timer_until_an_unambiguous_sample() {
        let mut c = Fasor::with_retention(Params::default());
        // FastRTO 1.2 s (1.4 s dithered at the low end), as in the FASOR test.
        answered(&mut c, 0, ms(800));
        check(&series(&mut c, 3, &mut Low), &[1400.0, 2800.0, 5600.0]);
        assert_eq!(c.retained(), None);
        // Answered while the second timer (2.8 s) ran: K = 2.8 s.
        let t0 = Instant::now();
        let mut a = c.first_timeout(t0, 0, &mut Low);
        c.next_timeout(t0, &mut a);
        c.on_answer(t0 + ms(3000), &a);
        assert_eq!(c.state(), State::FastSlowFast);
        close(c.retained().unwrap(), ms(2800));
        // Probe at FastRTO, then 2K, 4K, ... (FASOR: max(SlowRTO, 2F), 2F, 4F).
        check(
            &series(&mut c, 4, &mut Low),
            &[1400.0, 5600.0, 11_200.0, 22_400.0],
        );
        // The probe failed and 5.6 s ended the exchange: SLOW_FAST starts at K = 5.6 s.
        let mut b = c.first_timeout(t0, 0, &mut Low);
        c.next_timeout(t0, &mut b);
        c.on_answer(t0 + ms(6000), &b);
        assert_eq!(c.state(), State::SlowFast);
        check(
            &series(&mut c, 4, &mut Low),
            &[5600.0, 11_200.0, 22_400.0, 44_800.0],
        );
        // An unambiguous sample returns to FAST and forgets K.
        answered(&mut c, 0, ms(800));
        assert_eq!((c.state(), c.retained()), (State::Fast, None));
        // A given-up exchange skips the probe; timers stop at 120 s.
        let mut d = c.first_timeout(t0, 0, &mut Low);
        for _ in 0..10 {
            c.next_timeout(t0, &mut d);
        }
        close(d.timeout, ms(120_000));
        c.on_abandon(t0, &d);
        assert_eq!(c.state(), State::SlowFast);
        check(&series(&mut c, 2, &mut Low), &[120_000.0, 120_000.0]);
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
