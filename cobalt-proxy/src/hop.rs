//! Hop-Limit (RFC 8768): a proxy loop ends after a bounded number of hops with 5.08
//! Hop Limit Reached, naming the proxy that stopped it.

use crate::target::Refused;
use cobalt::proto::message::{Code, Options};

/// The Hop-Limit option's number (RFC 8768 §3).
pub const HOP_LIMIT: u16 = 16;
/// The value a proxy inserts when a request has no Hop-Limit (RFC 8768 §3).
pub const DEFAULT_HOP_LIMIT: u8 = 16;
/// 5.08 Hop Limit Reached (RFC 8768 §4).
pub const HOP_LIMIT_REACHED: Code = Code::new(5, 8);

/// The Hop-Limit to forward a request with: the request's value (or
/// [`DEFAULT_HOP_LIMIT`] when it has none) less one. When that is 0 the request must
/// not be forwarded: 5.08 with `identity` (the proxy's name) as payload. A value that
/// is not one byte 1..=255 is malformed: 4.00.
pub fn next_hop_limit(options: &Options, identity: &str) -> Result<u8, Refused> {
    let limit = match options.get(HOP_LIMIT) {
        None => DEFAULT_HOP_LIMIT,
        Some([v]) if *v > 0 => *v,
        Some(v) => {
            return Err(Refused::new(
                Code::BAD_REQUEST,
                format!("Hop-Limit must be one byte 1..=255, got {v:?}"),
            ))
        }
    };
    match limit - 1 {
        0 => Err(Refused::new(HOP_LIMIT_REACHED, identity.to_string())),
        next => Ok(next),
    }
}

/// Sets Hop-Limit `value` in `options` (replacing one already there).
pub fn set_hop_limit(options: &mut Options, value: u8) {
    options.set(HOP_LIMIT, [value]);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn absent_starts_at_16_and_each_hop_takes_one() {
        assert_eq!(next_hop_limit(&Options::new(), "p"), Ok(15));
        let mut o = Options::new();
        set_hop_limit(&mut o, 2);
        assert_eq!(next_hop_limit(&o, "p"), Ok(1));
    }

    #[test]
    fn the_last_hop_answers_5_08_with_the_proxy_identity() {
        let mut o = Options::new();
        set_hop_limit(&mut o, 1);
        let refused = next_hop_limit(&o, "proxy@192.0.2.1").unwrap_err();
        assert_eq!(refused.code, HOP_LIMIT_REACHED);
        assert_eq!(refused.reason, "proxy@192.0.2.1");
    }

    #[test]
    fn malformed_values_are_bad_requests() {
        for bad in [&[0u8][..], &[1, 2][..]] {
            let mut o = Options::new();
            o.set(HOP_LIMIT, bad);
            assert_eq!(next_hop_limit(&o, "p").unwrap_err().code, Code::BAD_REQUEST);
        }
    }
}
