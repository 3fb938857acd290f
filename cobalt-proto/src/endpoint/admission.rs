//! Admission of new requests: bounds on the requests in progress per peer (IP address
//! and port), per address key (IPv4 address or IPv6 prefix, [`AddressKey`]) and in
//! total, so that one peer's flood is refused without refusing anyone else.
//!
//! A peer over its own bound, or an address over its bound, gets 4.29 Too Many
//! Requests (RFC 8516). At the total bound only addresses that already have requests in
//! progress are refused (5.03): an address with none still gets in, up to an eighth
//! more, so a flood from some addresses cannot lock out the others.
//!
//! A peer's own requests in progress are counted in the endpoint's entry for the peer
//! (found anyway for each datagram); this table counts them in total and, while any
//! bound but the peer's could be reached, per address key. Below that (fewer requests
//! in progress than the per-address bound and the total bound, what a server answering
//! as it goes always has) no address can be over its bound, and a request costs no
//! lookup of its address: the counts per address are made from the requests in
//! progress when the total reaches the lower of the two bounds, and dropped when it
//! falls to half of it (so that making them is paid once per half a bound of
//! requests at most). An address key's count that drops to zero keeps its entry until
//! the next [`Admission::shrink`]: a client with one request at a time would otherwise
//! remove and insert its entry for every request.

use super::EndpointConfig;
use crate::address::AddressKey;
use crate::tables::shrink_when_sparse;
use hashbrown::HashMap;
use std::net::SocketAddr;

/// Why a request was not admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// The peer or its address is over its own bound: 4.29.
    PeerBusy,
    /// The endpoint is at its total bound: 5.03.
    Overloaded,
}

/// Counts of requests in progress in total and, while `counting`, per address key.
#[derive(Debug, Default)]
pub(crate) struct Admission {
    per_ip: HashMap<AddressKey, u32>,
    total: usize,
    /// Whether `per_ip` holds the counts per address key (else it is empty).
    counting: bool,
}

/// The total at which the counts per address key are needed: below it no address can
/// reach its own bound, and the total bound is not reached either.
fn counting_from(cfg: &EndpointConfig) -> usize {
    cfg.max_exchanges_per_ip.min(cfg.max_server_exchanges)
}

impl Admission {
    /// Counts a new request from `peer`, which has `of_peer` in progress already, in,
    /// or says why not. `in_progress` gives the peer of every request in progress (one
    /// item per request), from which the counts per address key are made when they
    /// become needed.
    pub(crate) fn admit<I: Iterator<Item = SocketAddr>>(
        &mut self,
        cfg: &EndpointConfig,
        peer: SocketAddr,
        of_peer: usize,
        in_progress: impl FnOnce() -> I,
    ) -> Result<(), Refusal> {
        if of_peer >= cfg.max_exchanges_per_peer {
            return Err(Refusal::PeerBusy);
        }
        if !self.counting {
            if self.total < counting_from(cfg) {
                self.total += 1;
                return Ok(());
            }
            self.count_per_key(cfg, in_progress());
        }
        let key = AddressKey::of(peer.ip(), cfg.ipv6_budget_prefix);
        let bound = cfg.max_server_exchanges;
        let total = self.total;
        let of_ip = self.per_ip.entry(key).or_insert(0);
        let held = *of_ip as usize;
        let refusal = if held >= cfg.max_exchanges_per_ip {
            Refusal::PeerBusy
        } else if total >= bound && (held > 0 || total >= bound + bound / 8) {
            Refusal::Overloaded
        } else {
            *of_ip += 1;
            self.total += 1;
            return Ok(());
        };
        if held == 0 {
            self.per_ip.remove(&key);
        }
        Err(refusal)
    }

    /// Starts counting per address key, from the peers of the requests in progress.
    fn count_per_key(
        &mut self,
        cfg: &EndpointConfig,
        in_progress: impl Iterator<Item = SocketAddr>,
    ) {
        self.per_ip.clear();
        for peer in in_progress {
            let key = AddressKey::of(peer.ip(), cfg.ipv6_budget_prefix);
            *self.per_ip.entry(key).or_insert(0) += 1;
        }
        self.counting = true;
    }

    /// A request of `peer` was answered (or dropped).
    pub(crate) fn release(&mut self, cfg: &EndpointConfig, peer: SocketAddr) {
        self.total = self.total.saturating_sub(1);
        if !self.counting {
            return;
        }
        if self.total < counting_from(cfg) / 2 {
            // Counted again from the requests in progress when needed.
            self.counting = false;
            self.per_ip.clear();
            return;
        }
        let key = AddressKey::of(peer.ip(), cfg.ipv6_budget_prefix);
        if let Some(n) = self.per_ip.get_mut(&key) {
            *n = n.saturating_sub(1);
        }
    }

    /// `n` requests in progress of a peer that moved from `from` to `to` (a DTLS
    /// session's new address) count under `to`'s address key from now on. The total
    /// does not change: no request is added, so the move is admitted even where `to`'s
    /// key is at its bound (its next request is refused until these are answered).
    pub(crate) fn transfer(
        &mut self,
        cfg: &EndpointConfig,
        from: SocketAddr,
        to: SocketAddr,
        n: u32,
    ) {
        if n == 0 || !self.counting {
            return;
        }
        let old = AddressKey::of(from.ip(), cfg.ipv6_budget_prefix);
        let new = AddressKey::of(to.ip(), cfg.ipv6_budget_prefix);
        if old == new {
            return;
        }
        let moved = self.per_ip.get_mut(&old).map_or(0, |held| {
            let moved = n.min(*held);
            *held -= moved;
            moved
        });
        *self.per_ip.entry(new).or_insert(0) += moved;
    }

    /// Forgets the address keys with nothing in progress and gives memory back after
    /// a flood.
    pub(crate) fn shrink(&mut self) {
        self.per_ip.retain(|_, n| *n > 0);
        shrink_when_sparse(&mut self.per_ip);
    }

    /// Requests in progress, in total.
    #[cfg(test)]
    pub(crate) fn total(&self) -> usize {
        self.total
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap as Map;

    fn cfg(total: usize, peer: usize, ip: usize) -> EndpointConfig {
        EndpointConfig {
            max_server_exchanges: total,
            max_exchanges_per_peer: peer,
            max_exchanges_per_ip: ip,
            ..Default::default()
        }
    }

    fn at(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    /// The admission table with the per-peer counts the endpoint keeps beside it.
    #[derive(Default)]
    struct Counted {
        a: Admission,
        of_peer: Map<SocketAddr, usize>,
    }

    impl Counted {
        fn admit(&mut self, c: &EndpointConfig, peer: SocketAddr) -> Result<(), Refusal> {
            let n = self.of_peer.get(&peer).copied().unwrap_or(0);
            let of_peer = &self.of_peer;
            let in_progress = || {
                of_peer
                    .iter()
                    .flat_map(|(peer, n)| std::iter::repeat_n(*peer, *n))
            };
            self.a.admit(c, peer, n, in_progress)?;
            self.of_peer.insert(peer, n + 1);
            Ok(())
        }

        fn release(&mut self, c: &EndpointConfig, peer: SocketAddr) {
            self.a.release(c, peer);
            *self.of_peer.get_mut(&peer).unwrap() -= 1;
        }
    }

    #[test]
    fn a_peer_and_an_address_have_their_own_bounds() {
        let c = cfg(100, 2, 3);
        let mut a = Counted::default();
        assert_eq!(a.admit(&c, at("10.0.0.1:1")), Ok(()));
        assert_eq!(a.admit(&c, at("10.0.0.1:1")), Ok(()));
        assert_eq!(a.admit(&c, at("10.0.0.1:1")), Err(Refusal::PeerBusy));
        assert_eq!(a.admit(&c, at("10.0.0.1:2")), Ok(()));
        assert_eq!(
            a.admit(&c, at("10.0.0.1:3")),
            Err(Refusal::PeerBusy),
            "address full"
        );
        assert_eq!(a.admit(&c, at("10.0.0.2:1")), Ok(()), "others unaffected");
        a.release(&c, at("10.0.0.1:1"));
        assert_eq!(a.admit(&c, at("10.0.0.1:3")), Ok(()));
    }

    #[test]
    fn at_the_total_bound_only_busy_addresses_are_refused() {
        let c = cfg(8, 100, 100);
        let mut a = Counted::default();
        for port in 0..8 {
            a.admit(&c, SocketAddr::from(([10, 0, 0, 1], port)))
                .unwrap();
        }
        assert_eq!(a.admit(&c, at("10.0.0.1:99")), Err(Refusal::Overloaded));
        assert_eq!(a.admit(&c, at("10.0.0.2:1")), Ok(()), "a newcomer gets in");
        assert_eq!(a.admit(&c, at("10.0.0.2:2")), Err(Refusal::Overloaded));
        // The reserve is an eighth of the bound: one more newcomer here, then none.
        assert_eq!(a.admit(&c, at("10.0.0.3:1")), Err(Refusal::Overloaded));
        assert_eq!(a.a.per_ip.len(), 2, "a refused newcomer leaves no entry");
        for port in 0..8 {
            a.release(&c, SocketAddr::from(([10, 0, 0, 1], port)));
        }
        a.release(&c, at("10.0.0.2:1"));
        assert_eq!(a.a.total(), 0);
        a.a.shrink();
        assert!(
            a.a.per_ip.is_empty(),
            "idle addresses forgotten at the sweep"
        );
    }

    #[test]
    fn addresses_are_counted_only_while_a_bound_is_within_reach_and_then_exactly() {
        let c = cfg(1000, 100, 10);
        let mut a = Counted::default();
        let port = |i: u16| SocketAddr::from(([10, 0, 0, 1], i));
        for i in 0..9 {
            a.admit(&c, port(i)).unwrap();
            a.admit(&c, at("10.0.0.2:1")).unwrap();
        }
        // 18 in progress (9 of each address): counted per address from here on.
        assert!(a.a.counting);
        assert_eq!(a.admit(&c, port(9)), Ok(()));
        assert_eq!(
            a.admit(&c, port(10)),
            Err(Refusal::PeerBusy),
            "10.0.0.1 full"
        );
        assert_eq!(a.admit(&c, at("10.0.0.2:1")), Ok(()));
        assert_eq!(a.admit(&c, at("10.0.0.2:2")), Err(Refusal::PeerBusy));
        // Answered down to under half the bound: not counted any more...
        for i in 0..8 {
            a.release(&c, port(i));
            a.release(&c, at("10.0.0.2:1"));
        }
        assert_eq!(a.a.total(), 4);
        assert!(!a.a.counting && a.a.per_ip.is_empty());
        // ...until within reach again, counted then from what is in progress.
        for i in 0..6 {
            a.admit(&c, at("10.0.0.3:1")).unwrap();
            a.admit(&c, port(20 + i)).unwrap();
        }
        assert!(a.a.counting);
        assert_eq!(
            a.a.per_ip[&AddressKey::of(port(0).ip(), c.ipv6_budget_prefix)],
            8
        );
        assert_eq!(a.admit(&c, port(30)), Ok(()));
        assert_eq!(a.admit(&c, port(31)), Ok(()));
        assert_eq!(a.admit(&c, port(32)), Err(Refusal::PeerBusy));
    }

    #[test]
    fn addresses_rotating_inside_one_ipv6_prefix_share_one_budget() {
        let c = cfg(1000, 100, 4);
        let mut a = Counted::default();
        for host in 1..=4u16 {
            let peer = SocketAddr::new(format!("2001:db8::{host}").parse().unwrap(), 5683);
            assert_eq!(a.admit(&c, peer), Ok(()));
        }
        assert_eq!(
            a.admit(&c, at("[2001:db8::ffff:5]:5683")),
            Err(Refusal::PeerBusy),
            "the next address of the same /64"
        );
        assert_eq!(
            a.admit(&c, at("[2001:db8:0:1::1]:5683")),
            Ok(()),
            "the next /64"
        );
        let host_wide = EndpointConfig {
            ipv6_budget_prefix: crate::address::AddressPrefix::HOST,
            ..c.clone()
        };
        assert_eq!(
            a.admit(&host_wide, at("[2001:db8::ffff:5]:5683")),
            Ok(()),
            "counted by the whole address with /128"
        );
    }
}
