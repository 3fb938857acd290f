//! The bounds of the manager's side of device management.

use std::time::Duration;

/// The bounds of the manager's side: decoding, request time, observations, and how
/// long a client in queue mode stays reachable.
#[derive(Debug, Clone)]
pub struct ManagerLimits {
    /// What a device's answer may hold.
    pub decode: crate::DecodeLimits,
    /// How long one request to a device may take overall.
    pub request_timeout: Duration,
    /// Most observations of devices open at once (over all devices).
    pub max_observations: usize,
    /// How long a client in queue mode (LwM2M 1.1 §6.5) is reachable after it was
    /// last heard from (a registration or an update): MAX_TRANSMIT_WAIT, 93 s. A
    /// request to one asleep waits (up to `request_timeout`) for its next update.
    pub queue_awake: Duration,
}

impl Default for ManagerLimits {
    fn default() -> Self {
        ManagerLimits {
            decode: crate::DecodeLimits::default(),
            request_timeout: Duration::from_secs(30),
            max_observations: 1000,
            queue_awake: Duration::from_secs(93),
        }
    }
}
