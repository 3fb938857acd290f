//! The time the cache reads: injected, so that tests run freshness in virtual time.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A monotonic clock: the time since some fixed start.
pub trait Clock: Send + Sync + 'static {
    /// Time elapsed since the clock's start.
    fn now(&self) -> Duration;
}

/// The system's monotonic clock (from the moment it was made).
#[derive(Debug, Clone, Copy)]
pub struct SystemClock {
    start: Instant,
}

impl Default for SystemClock {
    fn default() -> Self {
        SystemClock {
            start: Instant::now(),
        }
    }
}

impl Clock for SystemClock {
    fn now(&self) -> Duration {
        self.start.elapsed()
    }
}

/// A clock that moves only when told to ([`ManualClock::advance`]): virtual time for
/// tests and simulations. Clones share the same time.
#[derive(Debug, Clone, Default)]
pub struct ManualClock {
    millis: Arc<AtomicU64>,
}

impl ManualClock {
    /// A clock at time zero.
    pub fn new() -> ManualClock {
        ManualClock::default()
    }

    /// Moves the clock forward by `by`.
    pub fn advance(&self, by: Duration) {
        let ms = u64::try_from(by.as_millis()).unwrap_or(u64::MAX);
        self.millis.fetch_add(ms, Ordering::Relaxed);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Duration {
        Duration::from_millis(self.millis.load(Ordering::Relaxed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_manual_clock_moves_only_when_advanced_and_clones_share_it() {
        let clock = ManualClock::new();
        let other = clock.clone();
        assert_eq!(clock.now(), Duration::ZERO);
        other.advance(Duration::from_secs(61));
        assert_eq!(clock.now(), Duration::from_secs(61));
    }
}
