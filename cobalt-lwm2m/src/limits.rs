//! The bounds of the manager's side of device management.

use std::time::Duration;

/// The bounds of the manager's side: decoding, request time, observations.
#[derive(Debug, Clone)]
pub struct ManagerLimits {
    /// What a device's answer may hold.
    pub decode: crate::DecodeLimits,
    /// How long one request to a device may take overall.
    pub request_timeout: Duration,
    /// Most observations of devices open at once (over all devices).
    pub max_observations: usize,
}

impl Default for ManagerLimits {
    fn default() -> Self {
        ManagerLimits {
            decode: crate::DecodeLimits::default(),
            request_timeout: Duration::from_secs(30),
            max_observations: 1000,
        }
    }
}
