//! Karn: TCP's retransmission timer (RFC 6298 with Karn's algorithm) applied to CoAP
//! exchanges, the behaviour that lets CoAP over TCP scale in the congestion study.
//!
//! - RTO = SRTT + max(G, 4·RTTVAR) from unambiguous samples only (exchanges answered
//!   without retransmission, RFC 6298 §3 / RFC 8085 §3.1.1), initially 2 s
//!   (ACK_TIMEOUT), no 1 s floor (CoAP detects loss only by timeout), at most 60 s.
//! - Each exchange's first timer is the RTO dithered by U(1, ACK_RANDOM_FACTOR), so
//!   that many devices do not time out together; each timeout doubles the timer.
//! - **Retention** (RFC 6298 §5.5–5.7): after an exchange that needed retransmissions
//!   (or was given up) the next one starts from the backed-off timer, and keeps backing
//!   off from there, until an unambiguous sample collapses it to the estimate. A device
//!   whose messages keep being dropped thus slows down instead of offering the same
//!   load again with every new exchange, as Default CoAP and CoCoA do.

use super::{mul, Attempt, Controller, Params, RttEstimator};
use rand::RngCore;
use std::time::{Duration, Instant};

/// Upper bound on every timer.
pub const MAX_RTO: Duration = Duration::from_secs(60);

/// The state for one peer.
#[derive(Debug, Clone)]
pub struct Karn {
    params: Params,
    estimator: RttEstimator,
    /// The backed-off timer kept from the last exchange that needed retransmissions.
    retained: Option<Duration>,
}

impl Karn {
    /// The controller for one peer.
    pub fn new(params: Params) -> Karn {
        Karn {
            params,
            estimator: RttEstimator::new(params.ack_timeout.min(MAX_RTO), 4.0),
            retained: None,
        }
    }

    /// The backed-off timer the next exchange starts from, if any.
    pub fn retained(&self) -> Option<Duration> {
        self.retained
    }
}

impl Controller for Karn {
    fn first_timeout(&mut self, now: Instant, _parallel: usize, rng: &mut dyn RngCore) -> Attempt {
        match self.retained {
            // Backed off: no dithering on top of the kept timer.
            Some(t) => Attempt::new(now, t, t, 1.0),
            None => {
                let dither = self.params.dither(rng);
                let t = mul(self.estimator.rto, dither).min(MAX_RTO);
                Attempt::new(now, t, t, dither)
            }
        }
    }

    fn next_timeout(&mut self, _now: Instant, attempt: &mut Attempt) {
        attempt.retransmissions += 1;
        attempt.timeout = attempt.timeout.saturating_mul(2).min(MAX_RTO);
        attempt.base = attempt.timeout;
    }

    fn on_answer(&mut self, now: Instant, attempt: &Attempt) {
        if attempt.retransmissions == 0 {
            self.estimator.sample(attempt.elapsed(now), 0.5);
            self.estimator.rto = self.estimator.rto.min(MAX_RTO);
            self.retained = None;
        } else {
            self.retained = Some(attempt.timeout);
        }
    }

    fn on_abandon(&mut self, _now: Instant, attempt: &Attempt) {
        self.retained = Some(attempt.timeout);
    }

    fn rto(&mut self, _now: Instant) -> Option<Duration> {
        Some(self.retained.unwrap_or(self.estimator.rto))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::congestion::testing::{close, ms, Low, Midpoint};

    fn answered(c: &mut Karn, a: &Attempt, after: Duration) {
        c.on_answer(a.first_sent + after, a);
    }

    #[test]
    fn the_backed_off_timer_is_kept_until_an_unambiguous_sample() {
        let t0 = Instant::now();
        let mut c = Karn::new(Params::default());
        // 2 s × 1.25, doubled twice: answered after the second retransmission.
        let mut a = c.first_timeout(t0, 0, &mut Midpoint);
        close(a.timeout, ms(2500));
        c.next_timeout(t0, &mut a);
        c.next_timeout(t0, &mut a);
        close(a.timeout, ms(10_000));
        answered(&mut c, &a, ms(8000));
        // The next exchange starts from 10 s and backs off from there.
        let mut b = c.first_timeout(t0, 0, &mut Midpoint);
        close(b.timeout, ms(10_000));
        c.next_timeout(t0, &mut b);
        close(b.timeout, ms(20_000));
        answered(&mut c, &b, ms(12_000));
        close(c.first_timeout(t0, 0, &mut Low).timeout, ms(20_000));
        // An unambiguous 1 s sample collapses it: RTO = 1 + 4 × 0.5 = 3 s.
        let d = c.first_timeout(t0, 0, &mut Low);
        answered(&mut c, &d, ms(1000));
        assert_eq!(c.retained(), None);
        close(c.first_timeout(t0, 0, &mut Low).timeout, ms(3000));
        close(c.first_timeout(t0, 0, &mut Midpoint).timeout, ms(3750));
    }

    #[test]
    fn a_given_up_exchange_is_retained_too_and_timers_stop_at_60_s() {
        let t0 = Instant::now();
        let mut c = Karn::new(Params::default());
        let mut a = c.first_timeout(t0, 0, &mut Low);
        for _ in 0..8 {
            c.next_timeout(t0, &mut a);
        }
        close(a.timeout, ms(60_000));
        c.on_abandon(t0, &a);
        close(c.first_timeout(t0, 0, &mut Low).timeout, ms(60_000));
        assert_eq!(c.rto(t0), Some(ms(60_000)));
    }
}
