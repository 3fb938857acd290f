//! The key every per-address budget counts under: exchanges in progress, uploads,
//! observe relations, connections and DTLS handshakes.
//!
//! A source address is cheap to change inside the network its holder controls: one
//! host or one subscriber usually gets a whole IPv6 /64, so counting IPv6 peers by the
//! full address would give such an attacker 2^64 budgets. [`AddressKey::of`] therefore
//! counts IPv4 addresses (also when they arrive IPv4-mapped on a dual-stack socket) as
//! they are, and IPv6 addresses by their first [`AddressPrefix`] bits (64 by default,
//! the `[endpoint]` setting `ipv6_budget_prefix`).

use std::net::{IpAddr, Ipv6Addr};

/// How many leading bits of an IPv6 address make one budget (0 to 128; default 64).
/// IPv4 addresses are always counted whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize, serde::Deserialize),
    serde(transparent)
)]
pub struct AddressPrefix(u8);

impl AddressPrefix {
    /// The prefix of one IPv6 subnet as handed to a host or subscriber: /64.
    pub const SUBNET: AddressPrefix = AddressPrefix(64);
    /// Every IPv6 address on its own budget (/128).
    pub const HOST: AddressPrefix = AddressPrefix(128);

    /// A prefix of `bits` leading bits, at most 128 (more is taken as 128).
    pub const fn new(bits: u8) -> AddressPrefix {
        AddressPrefix(if bits > 128 { 128 } else { bits })
    }

    /// The number of leading bits kept.
    pub const fn bits(self) -> u8 {
        self.0
    }
}

impl Default for AddressPrefix {
    fn default() -> Self {
        AddressPrefix::SUBNET
    }
}

/// The budget an IP address is counted under (see the [module](self) documentation):
/// IPv4 and IPv4-mapped addresses as they are, IPv6 addresses cut to a prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AddressKey(IpAddr);

impl AddressKey {
    /// The key of `ip` when IPv6 addresses are counted by `prefix`.
    #[inline]
    pub fn of(ip: IpAddr, prefix: AddressPrefix) -> AddressKey {
        match ip {
            IpAddr::V4(_) => AddressKey(ip),
            IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                Some(v4) => AddressKey(IpAddr::V4(v4)),
                None => {
                    let bits = u128::from(v6);
                    let kept = match prefix.bits() {
                        0 => 0,
                        n => bits & (u128::MAX << (128 - u32::from(n))),
                    };
                    AddressKey(IpAddr::V6(Ipv6Addr::from(kept)))
                }
            },
        }
    }

    /// The address that stands for the whole key: the IPv4 address, or the IPv6
    /// prefix with the remaining bits zero.
    pub fn ip(self) -> IpAddr {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn ipv4_and_mapped_ipv4_share_a_key_and_ipv6_is_cut_to_the_prefix() {
        let p = AddressPrefix::default();
        assert_eq!(
            AddressKey::of(ip("::ffff:192.0.2.7"), p),
            AddressKey::of(ip("192.0.2.7"), p)
        );
        assert_ne!(
            AddressKey::of(ip("192.0.2.7"), p),
            AddressKey::of(ip("192.0.2.8"), p)
        );
        let a = AddressKey::of(ip("2001:db8::1"), p);
        assert_eq!(a, AddressKey::of(ip("2001:db8::ffff:2"), p));
        assert_ne!(a, AddressKey::of(ip("2001:db8:0:1::1"), p));
        assert_eq!(a.ip(), ip("2001:db8::"));
    }

    #[test]
    fn the_prefix_is_configurable() {
        let (a, b) = (ip("2001:db8:0:1::1"), ip("2001:db8:0:2::1"));
        assert_ne!(
            AddressKey::of(a, AddressPrefix::SUBNET),
            AddressKey::of(b, AddressPrefix::SUBNET)
        );
        let p48 = AddressPrefix::new(48);
        assert_eq!(AddressKey::of(a, p48), AddressKey::of(b, p48));
        assert_ne!(
            AddressKey::of(ip("2001:db8::1"), AddressPrefix::HOST),
            AddressKey::of(ip("2001:db8::2"), AddressPrefix::HOST)
        );
        assert_eq!(
            AddressKey::of(a, AddressPrefix::new(0)),
            AddressKey::of(ip("fe80::1"), AddressPrefix::new(0))
        );
        assert_eq!(AddressPrefix::new(200), AddressPrefix::HOST);
    }
}
