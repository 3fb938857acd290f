//! Non-confirmable messages outside exchanges (NON notifications), CoCoA §5:
//!
//! 1. of any 16 consecutive such messages to a peer at least 2 are confirmable;
//! 2. confirmable ones use the peer's RTO algorithm (as every CON does here);
//! 3. NON packets leave at most once per RTO (the overall estimate at the time),
//!    except that a rate of 1 B/s is always allowed.
//!
//! [`NonPacer`] keeps the per-peer history these rules need and decides for each
//! message; the endpoint upgrades, sends or holds it accordingly. Algorithms without an
//! RTO estimate (Default CoAP) are not paced.

use std::time::{Duration, Instant};

/// Messages in the window of rule 1.
pub const WINDOW: u32 = 16;
/// Confirmable messages required in every window.
pub const MIN_CONFIRMABLE: u32 = 2;

/// What to do with a non-confirmable message outside an exchange.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NonDecision {
    /// Send it as NON now.
    Send,
    /// Send it as CON (rule 1).
    Confirmable,
    /// Hold it until then (rule 3).
    WaitUntil(Instant),
}

/// The last [`WINDOW`] messages outside exchanges to one peer and the last NON's time.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NonPacer {
    /// Bit i set: the message i + 1 messages ago was confirmable (bit 0: the latest).
    history: u16,
    last_non: Option<Instant>,
}

impl NonPacer {
    /// The decision for a NON of `bytes` bytes at `now`, given the peer's RTO, with
    /// `held` earlier NON messages still waiting (they count as sent). Messages missing
    /// from the history (a new peer) count as NON, so the first two messages to a peer
    /// are confirmable.
    pub fn decide(&self, now: Instant, rto: Duration, bytes: usize, held: usize) -> NonDecision {
        let history = self.history.checked_shl(held as u32).unwrap_or(0);
        if (history & 0x7fff).count_ones() < MIN_CONFIRMABLE {
            return NonDecision::Confirmable;
        }
        match self.rate_allows_at(rto, bytes) {
            Some(at) if held > 0 || now < at => NonDecision::WaitUntil(at.max(now)),
            _ if held > 0 => NonDecision::WaitUntil(now),
            _ => NonDecision::Send,
        }
    }

    /// When rule 3 lets a NON of `bytes` bytes leave: one RTO after the previous NON,
    /// or sooner if that keeps to 1 B/s. `None`: no NON sent yet.
    pub fn rate_allows_at(&self, rto: Duration, bytes: usize) -> Option<Instant> {
        let gap = rto.min(Duration::from_secs(bytes as u64));
        self.last_non.map(|last| last + gap)
    }

    /// A message outside an exchange left at `now`.
    pub fn record(&mut self, now: Instant, confirmable: bool) {
        self.history = (self.history << 1) | u16::from(confirmable);
        if !confirmable {
            self.last_non = Some(now);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::congestion::testing::ms;

    #[test]
    fn two_of_every_sixteen_are_confirmable() {
        let t0 = Instant::now();
        let rto = ms(10);
        let mut p = NonPacer::default();
        let mut kinds = Vec::new();
        let mut t = t0;
        for _ in 0..48 {
            t += ms(1000);
            let con = p.decide(t, rto, 40, 0) == NonDecision::Confirmable;
            p.record(t, con);
            kinds.push(con);
        }
        for w in kinds.windows(16) {
            assert!(w.iter().filter(|c| **c).count() >= 2, "{kinds:?}");
        }
        // No more than needed: 2 CON per 16 once started, 6 of 48 in all.
        assert_eq!(kinds.iter().filter(|c| **c).count(), 6);
        assert!(kinds[0] && kinds[1] && !kinds[2]);
    }

    #[test]
    fn non_rate_is_one_per_rto_or_one_byte_per_second() {
        let t0 = Instant::now();
        let mut p = NonPacer::default();
        p.record(t0, true);
        p.record(t0, true);
        assert_eq!(p.decide(t0, ms(2000), 100, 0), NonDecision::Send);
        p.record(t0, false);
        assert_eq!(
            p.decide(t0 + ms(500), ms(2000), 100, 0),
            NonDecision::WaitUntil(t0 + ms(2000))
        );
        assert_eq!(p.decide(t0 + ms(2000), ms(2000), 100, 0), NonDecision::Send);
        // Behind a held message it waits even when the rate would allow it.
        assert_eq!(
            p.decide(t0 + ms(2000), ms(2000), 100, 1),
            NonDecision::WaitUntil(t0 + ms(2000))
        );
        // A 1-byte message at 1 B/s beats a long RTO.
        assert_eq!(
            p.decide(t0 + ms(500), ms(60_000), 1, 0),
            NonDecision::WaitUntil(t0 + ms(1000))
        );
        // Held messages count as NON for rule 1: 2 CON then 13 NON sent, 1 held.
        let mut p = NonPacer::default();
        p.record(t0, true);
        p.record(t0, true);
        for _ in 0..13 {
            p.record(t0, false);
        }
        assert_eq!(
            p.decide(t0, ms(1), 1, 0),
            NonDecision::WaitUntil(t0 + ms(1))
        );
        assert_eq!(p.decide(t0, ms(1), 1, 1), NonDecision::Confirmable);
    }
}
