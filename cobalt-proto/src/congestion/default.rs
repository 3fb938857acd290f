//! Default CoAP (RFC 7252 §4.2): the initial timeout of every exchange is uniform in
//! [ACK_TIMEOUT, ACK_TIMEOUT × ACK_RANDOM_FACTOR) and doubles on each retransmission.
//! Nothing is learnt from answers, so every exchange starts from scratch (the property
//! the congestion study blames for spurious retransmissions under heavy queueing).

use super::{Attempt, Controller, Params};
use rand::RngCore;
use std::time::{Duration, Instant};

/// The longest timeout between two transmissions: the 60 s backoff limit of the congestion-control
/// study. With RFC 7252's parameters (MAX_RETRANSMIT 4) it is never reached (≤ 48 s).
pub const MAX_TIMEOUT: Duration = Duration::from_secs(60);

/// RFC 7252's binary exponential backoff; stateless per peer.
#[derive(Debug, Clone)]
pub struct DefaultRto {
    params: Params,
}

impl DefaultRto {
    /// The controller for one peer.
    pub fn new(params: Params) -> DefaultRto {
        DefaultRto { params }
    }
}

impl Controller for DefaultRto {
    fn first_timeout(&mut self, now: Instant, _parallel: usize, rng: &mut dyn RngCore) -> Attempt {
        let dither = self.params.dither(rng);
        let timeout = super::mul(self.params.ack_timeout, dither).min(MAX_TIMEOUT);
        Attempt::new(now, timeout, self.params.ack_timeout, dither)
    }

    fn next_timeout(&mut self, _now: Instant, attempt: &mut Attempt) {
        attempt.retransmissions += 1;
        attempt.base = attempt.base.saturating_mul(2);
        attempt.timeout = attempt.timeout.saturating_mul(2).min(MAX_TIMEOUT);
    }

    fn on_answer(&mut self, _now: Instant, _attempt: &Attempt) {}

    fn rto(&mut self, _now: Instant) -> Option<Duration> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::congestion::testing::{close, ms, Low, Midpoint};

    #[test]
    fn doubles_from_a_dithered_start_and_stops_at_60_s() {
        let t0 = Instant::now();
        let mut c = DefaultRto::new(Params::default());
        let mut a = c.first_timeout(t0, 0, &mut Midpoint);
        close(a.timeout, ms(2500));
        let mut seen = vec![a.timeout];
        for _ in 0..6 {
            c.next_timeout(t0, &mut a);
            seen.push(a.timeout);
        }
        let want = [2500, 5000, 10_000, 20_000, 40_000, 60_000, 60_000];
        for (s, w) in seen.iter().zip(want) {
            close(*s, ms(w));
        }
        assert_eq!(a.retransmissions, 6);
    }

    #[test]
    fn learns_nothing_from_answers() {
        let t0 = Instant::now();
        let mut c = DefaultRto::new(Params::default());
        let mut a = c.first_timeout(t0, 3, &mut Low);
        close(a.timeout, ms(2000));
        c.next_timeout(t0, &mut a);
        c.on_answer(t0 + ms(7000), &a);
        close(c.first_timeout(t0, 0, &mut Low).timeout, ms(2000));
        assert_eq!(c.rto(t0), None);
    }
}
