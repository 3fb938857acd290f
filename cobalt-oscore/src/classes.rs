//! Which options travel inside the ciphertext and which outside (RFC 8613 §4.1).

use crate::option::OSCORE;
use cobalt_proto::message::{opt, Options};

/// Hop-Limit (RFC 8768), for proxies: outer only.
const HOP_LIMIT: u16 = 16;

/// Whether option `number` is Class U only (outer, readable by proxies): the URI's
/// host and port, the proxy options, Hop-Limit and OSCORE itself. Every other option,
/// known or not, is Class E (inner); Observe is both (RFC 8613 §4.1.3.5).
pub fn is_outer_only(number: u16) -> bool {
    matches!(
        number,
        opt::URI_HOST | opt::URI_PORT | opt::PROXY_URI | opt::PROXY_SCHEME | HOP_LIMIT | OSCORE
    )
}

/// `options` split into what is encrypted (Class E, Observe included) and what goes
/// outside (Class U, and a copy of Observe), without OSCORE.
pub fn split(options: &Options) -> (Options, Options) {
    let (mut inner, mut outer) = (Options::new(), Options::new());
    for o in options.iter() {
        if o.number == OSCORE {
            continue;
        }
        if is_outer_only(o.number) {
            outer.push(o.number, o.value);
            continue;
        }
        if o.number == opt::OBSERVE {
            outer.push(o.number, o.value);
        }
        inner.push(o.number, o.value);
    }
    (inner, outer)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uri_host_stays_outside_and_observe_goes_both_ways() {
        let mut options = Options::new();
        options.push(opt::URI_HOST, b"localhost");
        options.push(opt::OBSERVE, []);
        options.push(opt::URI_PATH, b"tv1");
        options.push(opt::ECHO, [1, 2]);
        let (inner, outer) = split(&options);
        let numbers = |o: &Options| o.iter().map(|o| o.number).collect::<Vec<_>>();
        assert_eq!(numbers(&inner), [opt::OBSERVE, opt::URI_PATH, opt::ECHO]);
        assert_eq!(numbers(&outer), [opt::URI_HOST, opt::OBSERVE]);
    }
}
