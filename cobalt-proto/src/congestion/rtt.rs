//! The RTT estimator of RFC 6298 §2, shared by CoCoA's two estimators and FASOR's FastRTO.

use std::time::Duration;

/// Smoothing gain of SRTT (RFC 6298: 1/8).
const ALPHA: f64 = 0.125;
/// Smoothing gain of RTTVAR (RFC 6298: 1/4).
const BETA: f64 = 0.25;
/// Clock granularity G in `SRTT + max(G, K·RTTVAR)`: the 1 ms of the runtime's timers.
pub const GRANULARITY: Duration = Duration::from_millis(1);

/// SRTT and RTTVAR of RFC 6298, with the variance multiplier K of its user.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RttEstimator {
    /// Smoothed RTT (seconds); meaningful once `samples > 0`.
    pub srtt: f64,
    /// RTT variation (seconds).
    pub rttvar: f64,
    /// The estimate `SRTT + max(G, K·RTTVAR)`, or the initial value before any sample.
    pub rto: Duration,
    /// K: 4 in RFC 6298, 1 for CoCoA's weak estimator.
    pub k: f64,
    /// Samples taken.
    pub samples: u64,
}

impl RttEstimator {
    /// An estimator without samples whose estimate is `initial`.
    pub fn new(initial: Duration, k: f64) -> RttEstimator {
        RttEstimator {
            srtt: 0.0,
            rttvar: 0.0,
            rto: initial,
            k,
            samples: 0,
        }
    }

    /// Takes a sample `r` (RFC 6298 §2.2–2.3): the first sets SRTT = R and RTTVAR =
    /// R × `first_var` (RFC 6298: 1/2), later ones smooth with |SRTT − R'|. Returns
    /// the new estimate (not floored at 1 s: CoAP detects loss only by timeout).
    pub fn sample(&mut self, r: Duration, first_var: f64) -> Duration {
        (self.srtt, self.rttvar) = smooth(self.srtt, self.rttvar, self.samples == 0, r, first_var);
        self.samples += 1;
        self.rto = estimate(self.srtt, self.rttvar, self.k);
        self.rto
    }

    /// SRTT as a duration, if sampled.
    pub fn smoothed(&self) -> Option<Duration> {
        (self.samples > 0).then(|| Duration::from_secs_f64(self.srtt))
    }
}

/// SRTT and RTTVAR (seconds) after the sample `r` (RFC 6298 §2.2–2.3): the `first`
/// sets SRTT = R and RTTVAR = R × `first_var`, later ones smooth with |SRTT − R'|.
pub(crate) fn smooth(
    srtt: f64,
    rttvar: f64,
    first: bool,
    r: Duration,
    first_var: f64,
) -> (f64, f64) {
    let r = r.as_secs_f64();
    if first {
        (r, r * first_var)
    } else {
        let rttvar = (1.0 - BETA) * rttvar + BETA * (srtt - r).abs();
        ((1.0 - ALPHA) * srtt + ALPHA * r, rttvar)
    }
}

/// The estimate `SRTT + max(G, K·RTTVAR)` of sampled SRTT and RTTVAR (seconds).
pub(crate) fn estimate(srtt: f64, rttvar: f64, k: f64) -> Duration {
    let var = (k * rttvar).max(GRANULARITY.as_secs_f64());
    Duration::try_from_secs_f64(srtt + var).unwrap_or(Duration::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::congestion::testing::{close, ms};

    #[test]
    fn rfc6298_sequence() {
        let mut e = RttEstimator::new(ms(2000), 4.0);
        // First: SRTT 1.0, RTTVAR 0.5, RTO 1 + 4·0.5 = 3.0.
        close(e.sample(ms(1000), 0.5), ms(3000));
        // Second, R = 2.0: RTTVAR = 0.75·0.5 + 0.25·|1 − 2| = 0.625;
        // SRTT = 0.875 + 0.25 = 1.125; RTO = 1.125 + 2.5 = 3.625.
        close(e.sample(ms(2000), 0.5), ms(3625));
        // Third, R = 1.125: RTTVAR = 0.46875; SRTT unchanged; RTO = 1.125 + 1.875 = 3.0.
        close(e.sample(ms(1125), 0.5), ms(3000));
        assert_eq!(e.samples, 3);
    }

    #[test]
    fn variance_floor_is_the_clock_granularity() {
        let mut e = RttEstimator::new(ms(2000), 1.0);
        e.sample(ms(100), 0.0);
        close(e.rto, ms(101));
    }
}
