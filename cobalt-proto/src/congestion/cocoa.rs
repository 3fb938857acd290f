//! CoCoA, CoAP Simple Congestion Control/Advanced (draft-ietf-core-cocoa-03).
//!
//! - Two RFC 6298 estimators, both starting at 2 s (ACK_TIMEOUT): E_strong (K = 4)
//!   fed by exchanges answered without retransmission, E_weak (K = 1) fed by exchanges
//!   answered after one or two retransmissions, timed from the original transmission.
//!   Answers after three or more retransmissions are not used (§4.2).
//! - The overall RTO is blended after each sample: `RTO := 0.5·E_strong + 0.5·RTO` or
//!   `RTO := 0.25·E_weak + 0.75·RTO`.
//! - Blind RTO (§4.1): until the first sample, an exchange started while `n` others to
//!   the same peer are waiting gets 2 s × (n + 1).
//! - Variable backoff factor (§4.2.1, App. A.3), re-evaluated on every backoff from the
//!   exchange's current (undithered) RTO: ×3 below 1 s, ×1.5 above 3 s, else ×2;
//!   truncated at 32 s; each timer is the RTO × a dithering factor in
//!   [1, ACK_RANDOM_FACTOR) drawn once per exchange.
//! - Aging (§4.3, App. A.2), applied lazily whenever the RTO is used: an RTO below 1 s
//!   left without update for 16 × RTO doubles; one above 3 s left for 4 × RTO becomes
//!   1 s + RTO/2; each step counts as an update.
//!
//! Where the draft is silent or its pseudocode slips, this follows RFC 6298: the first
//! sample of an estimator sets SRTT = R and RTTVAR = R/2, and RTTVAR uses |SRTT − R'|
//! (the draft's pseudocode omits the absolute value). There is no lower bound on the
//! RTO; the 32 s truncation also caps the RTO an exchange starts from.
//!
//! [`Algorithm::CocoaStrong`](super::Algorithm::CocoaStrong) is the same without E_weak
//! (as Californium's `COCOA_STRONG`).

use super::{mul, Attempt, Controller, Params, RttEstimator};
use rand::RngCore;
use std::time::{Duration, Instant};

/// Weight of a strong estimate in the overall RTO.
pub const W_STRONG: f64 = 0.5;
/// Weight of a weak estimate in the overall RTO.
pub const W_WEAK: f64 = 0.25;
/// Truncation of the backed-off RTO.
pub const MAX_RTO: Duration = Duration::from_secs(32);
const ONE_S: Duration = Duration::from_secs(1);
const THREE_S: Duration = Duration::from_secs(3);

/// The variable backoff factor for an RTO.
pub fn backoff_factor(rto: Duration) -> f64 {
    if rto < ONE_S {
        3.0
    } else if rto > THREE_S {
        1.5
    } else {
        2.0
    }
}

/// CoCoA's state for one peer.
#[derive(Debug, Clone)]
pub struct Cocoa {
    params: Params,
    strong: RttEstimator,
    weak: RttEstimator,
    /// The overall RTO estimate.
    rto: Duration,
    /// When `rto` last changed by a sample or an aging step.
    last_update: Instant,
    /// False for CoCoA-strong: weak samples are ignored.
    use_weak: bool,
}

impl Cocoa {
    /// The controller for one peer first seen at `now`; `use_weak` false gives CoCoA-strong.
    pub fn new(params: Params, now: Instant, use_weak: bool) -> Cocoa {
        Cocoa {
            params,
            strong: RttEstimator::new(params.ack_timeout, 4.0),
            weak: RttEstimator::new(params.ack_timeout, 1.0),
            rto: params.ack_timeout,
            last_update: now,
            use_weak,
        }
    }

    fn sampled(&self) -> bool {
        self.strong.samples + self.weak.samples > 0
    }

    /// Applies every aging step due by `now`.
    fn age(&mut self, now: Instant) {
        loop {
            let idle = now.saturating_duration_since(self.last_update);
            if self.rto < ONE_S && idle > self.rto * 16 {
                self.last_update += self.rto * 16;
                self.rto *= 2;
            } else if self.rto > THREE_S && idle > self.rto * 4 {
                self.last_update += self.rto * 4;
                self.rto = ONE_S + self.rto / 2;
            } else {
                return;
            }
        }
    }
}

impl Controller for Cocoa {
    fn first_timeout(&mut self, now: Instant, parallel: usize, rng: &mut dyn RngCore) -> Attempt {
        self.age(now);
        let base = if self.sampled() {
            self.rto
        } else {
            self.params
                .ack_timeout
                .saturating_mul(u32::try_from(parallel.saturating_add(1)).unwrap_or(u32::MAX))
        }
        .min(MAX_RTO);
        let dither = self.params.dither(rng);
        Attempt::new(now, mul(base, dither), base, dither)
    }

    fn next_timeout(&mut self, _now: Instant, attempt: &mut Attempt) {
        attempt.retransmissions += 1;
        attempt.base = mul(attempt.base, backoff_factor(attempt.base)).min(MAX_RTO);
        attempt.timeout = mul(attempt.base, attempt.dither);
    }

    fn on_answer(&mut self, now: Instant, attempt: &Attempt) {
        self.age(now);
        let r = attempt.elapsed(now);
        match attempt.retransmissions {
            0 => {
                let e = self.strong.sample(r, 0.5);
                self.rto = mul(e, W_STRONG) + mul(self.rto, 1.0 - W_STRONG);
            }
            1 | 2 if self.use_weak => {
                let e = self.weak.sample(r, 0.5);
                self.rto = mul(e, W_WEAK) + mul(self.rto, 1.0 - W_WEAK);
            }
            _ => return,
        }
        self.last_update = now;
    }

    fn rto(&mut self, now: Instant) -> Option<Duration> {
        self.age(now);
        Some(self.rto)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::congestion::testing::{close, ms, Low, Midpoint};

    fn answered(c: &mut Cocoa, t: Instant, rexmits: u32, rtt: Duration) {
        let mut a = Attempt::new(t, ms(1), ms(1), 1.0);
        a.retransmissions = rexmits;
        c.on_answer(t + rtt, &a);
    }

    #[test]
    fn blind_rto_scales_with_parallel_exchanges_until_the_first_sample() {
        let t0 = Instant::now();
        let mut c = Cocoa::new(Params::default(), t0, true);
        close(c.first_timeout(t0, 0, &mut Low).timeout, ms(2000));
        close(c.first_timeout(t0, 0, &mut Midpoint).timeout, ms(2500));
        // Two exchanges running: the third gets 6 s (§4.1's example), dithered.
        close(c.first_timeout(t0, 2, &mut Low).timeout, ms(6000));
        close(c.first_timeout(t0, 2, &mut Midpoint).timeout, ms(7500));
        answered(&mut c, t0, 0, ms(1000));
        // After a sample the RTO is the estimate, whatever runs in parallel.
        close(c.first_timeout(t0, 2, &mut Low).timeout, ms(2500));
    }

    #[test]
    fn strong_and_weak_samples_blend_into_the_overall_rto() {
        let t0 = Instant::now();
        let mut c = Cocoa::new(Params::default(), t0, true);
        // Strong R = 1 s: SRTT 1, RTTVAR 0.5, E_strong = 3; RTO = 0.5·3 + 0.5·2 = 2.5.
        answered(&mut c, t0, 0, ms(1000));
        close(c.rto(t0).unwrap(), ms(2500));
        // Weak R = 4 s (one retransmission): SRTT 4, RTTVAR 2, E_weak = 4 + 1·2 = 6;
        // RTO = 0.25·6 + 0.75·2.5 = 3.375.
        answered(&mut c, t0, 1, ms(4000));
        close(c.rto(t0).unwrap(), ms(3375));
        // Answered after three retransmissions: no sample.
        answered(&mut c, t0, 3, ms(9000));
        close(c.rto(t0).unwrap(), ms(3375));
        // Strong R = 1 s again: RTTVAR = 0.75·0.5 + 0 = 0.375, SRTT 1, E = 2.5;
        // RTO = 0.5·2.5 + 0.5·3.375 = 2.9375.
        answered(&mut c, t0, 0, ms(1000));
        close(c.rto(t0).unwrap(), Duration::from_micros(2_937_500));
    }

    #[test]
    fn weak_estimates_follow_example_a1_of_the_draft() {
        // RTO 1.5 s; a weak sample of RTT 2 s with RTTVAR 1 s (E_weak = 3 s) gives
        // 0.25·3 + 0.75·1.5 = 1.875 s (App. B, Example A.1).
        let t0 = Instant::now();
        let mut c = Cocoa::new(Params::default(), t0, true);
        c.rto = ms(1500);
        c.weak.samples = 0;
        answered(&mut c, t0, 1, ms(2000));
        close(c.rto(t0).unwrap(), ms(1875));
        // The next weak 2 s sample: RTTVAR 0.75, E_weak 2.75; RTO = 0.6875 + 1.40625.
        answered(&mut c, t0, 2, ms(2000));
        close(c.rto(t0).unwrap(), Duration::from_micros(2_093_750));
    }

    #[test]
    fn cocoa_strong_ignores_weak_samples() {
        let t0 = Instant::now();
        let mut c = Cocoa::new(Params::default(), t0, false);
        answered(&mut c, t0, 1, ms(4000));
        close(c.rto(t0).unwrap(), ms(2000));
        // No sample yet, so the blind rule still applies.
        close(c.first_timeout(t0, 1, &mut Low).timeout, ms(4000));
        answered(&mut c, t0, 0, ms(1000));
        close(c.rto(t0).unwrap(), ms(2500));
    }

    #[test]
    fn variable_backoff_is_re_evaluated_on_every_retransmission() {
        // Example B of the draft: RTO 0.3 s → 0.9 s, 2.7 s, then ×2 up to 3 s and
        // ×1.5 above, truncated at 32 s.
        let t0 = Instant::now();
        let mut c = Cocoa::new(Params::default(), t0, true);
        answered(&mut c, t0, 0, ms(100));
        c.rto = ms(300);
        let mut a = c.first_timeout(t0, 0, &mut Low);
        let mut seen = vec![a.timeout];
        for _ in 0..9 {
            c.next_timeout(t0, &mut a);
            seen.push(a.timeout);
        }
        let want = [
            300.0, 900.0, 2700.0, 5400.0, 8100.0, 12150.0, 18225.0, 27337.5, 32000.0, 32000.0,
        ];
        for (s, w) in seen.iter().zip(want) {
            close(*s, Duration::from_secs_f64(w / 1000.0));
        }
        // The dithering factor of the exchange scales every timer.
        let mut a = c.first_timeout(t0, 0, &mut Midpoint);
        c.next_timeout(t0, &mut a);
        close(a.timeout, ms(1125));
    }

    #[test]
    fn small_rtos_age_up_by_doubling() {
        let t0 = Instant::now();
        let mut c = Cocoa::new(Params::default(), t0, true);
        c.rto = ms(300);
        c.strong.samples = 1;
        // Not yet after exactly 16 × 0.3 = 4.8 s; doubled just after it.
        close(c.rto(t0 + ms(4800)).unwrap(), ms(300));
        close(c.rto(t0 + ms(4801)).unwrap(), ms(600));
        // Next step 16 × 0.6 = 9.6 s after the first: 1.2 s, then no more aging.
        close(c.rto(t0 + ms(14_401)).unwrap(), ms(1200));
        close(c.rto(t0 + ms(1_000_000)).unwrap(), ms(1200));
    }

    #[test]
    fn large_rtos_decay_cumulatively() {
        let t0 = Instant::now();
        let mut c = Cocoa::new(Params::default(), t0, true);
        c.rto = ms(10_000);
        // 10 s idle for more than 40 s → 6 s; then 24 s → 4 s; then 16 s → 3 s.
        close(c.rto(t0 + ms(40_000)).unwrap(), ms(10_000));
        close(c.rto(t0 + ms(50_000)).unwrap(), ms(6000));
        close(c.rto(t0 + ms(64_001)).unwrap(), ms(4000));
        close(c.rto(t0 + ms(1_000_000)).unwrap(), ms(3000));
        // Example A.2: 4 s left for 16 s becomes 3 s.
        let mut c = Cocoa::new(Params::default(), t0, true);
        c.rto = ms(4000);
        close(c.rto(t0 + ms(16_001)).unwrap(), ms(3000));
    }

    #[test]
    fn a_sample_resets_the_aging_clock() {
        let t0 = Instant::now();
        let mut c = Cocoa::new(Params::default(), t0, true);
        c.rto = ms(400);
        c.strong.samples = 1;
        c.strong.srtt = 0.2;
        c.strong.rttvar = 0.0;
        // 7 s later (> 16 × 0.4) the RTO has aged to 0.8 before the sample blends in.
        answered(&mut c, t0 + ms(7000) - ms(200), 0, ms(200));
        // E_strong: RTTVAR 0.75·0 + 0.25·0 = 0 → 0.2 + max(G, 0) = 0.201; RTO = 0.1005 + 0.4.
        close(
            c.rto(t0 + ms(7000)).unwrap(),
            Duration::from_micros(500_500),
        );
        // Aging counts from the sample: 8 s < 16 × 0.5005 s.
        close(
            c.rto(t0 + ms(15_000)).unwrap(),
            Duration::from_micros(500_500),
        );
    }
}
