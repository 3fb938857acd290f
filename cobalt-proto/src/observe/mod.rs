//! Observe (RFC 7641): the rules that are pure functions, the server's relation
//! table with its confirmable-notification policy ([`relations`]), and notifications
//! encoded once per change for many observers ([`encoded`]).

pub mod encoded;
pub mod relations;

use std::time::{Duration, Instant};

/// Observe sequence numbers are 24 bits wide (RFC 7641 §4.4).
pub const SEQ_MASK: u32 = 0x00ff_ffff;

/// RFC 7641 §3.4: is a notification with sequence `v2` received at `t2` newer than
/// the last one, `v1` received at `t1`? Older notifications must not replace newer ones.
pub fn is_fresh(v1: u32, t1: Instant, v2: u32, t2: Instant) -> bool {
    const HALF: u32 = 1 << 23;
    (v1 < v2 && v2 - v1 < HALF) || (v1 > v2 && v1 - v2 > HALF) || t2 > t1 + Duration::from_secs(128)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn freshness_follows_rfc7641_3_4() {
        let t = Instant::now();
        assert!(is_fresh(5, t, 6, t));
        assert!(!is_fresh(6, t, 5, t), "older");
        assert!(!is_fresh(6, t, 6, t), "same");
        assert!(is_fresh(SEQ_MASK - 1, t, 1, t), "24-bit wrap");
        assert!(
            !is_fresh(1, t, SEQ_MASK - 1, t),
            "far behind counts as older"
        );
        assert!(
            is_fresh(6, t, 5, t + Duration::from_secs(129)),
            "after 128 s anything goes"
        );
    }
}
