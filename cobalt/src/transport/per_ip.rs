//! Budgets per source address: how many handshakes in progress or connections one
//! address may hold, so that one address reaching its budget is refused while others
//! are still served.
//!
//! An address is counted by its [`AddressKey`], as every per-address budget of the
//! server is: IPv4 addresses (also when they arrive IPv4-mapped on a dual-stack
//! socket) as they are, IPv6 addresses by a prefix ([`AddressPrefix`], /64 unless
//! `ipv6_budget_prefix` says otherwise), since one host or one subscriber usually
//! holds a whole /64.
//!
//! [`IpCounts`] is the plain table (one owner, e.g. a DTLS shard); [`IpBudget`] shares
//! one between tasks (TCP, TLS and WebSocket listeners) and hands out [`IpPermit`]s
//! that give their place back when dropped. Both give their memory back when they
//! empty (see [`shrink_when_sparse`]).

use cobalt_proto::address::{AddressKey, AddressPrefix};
use cobalt_proto::tables::shrink_when_sparse;
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

/// How many things (handshakes, connections) each address key holds.
#[derive(Debug, Default)]
pub struct IpCounts {
    /// How IPv6 addresses are counted.
    prefix: AddressPrefix,
    counts: HashMap<AddressKey, u32>,
}

impl IpCounts {
    /// An empty table counting IPv6 addresses by `prefix`.
    pub fn new(prefix: AddressPrefix) -> IpCounts {
        IpCounts {
            prefix,
            counts: HashMap::new(),
        }
    }

    /// The key `ip` is counted under.
    pub fn key(&self, ip: IpAddr) -> AddressKey {
        AddressKey::of(ip, self.prefix)
    }

    /// What `ip`'s key holds.
    pub fn get(&self, ip: IpAddr) -> u32 {
        self.counts.get(&self.key(ip)).copied().unwrap_or(0)
    }

    /// Counts one more for `ip`'s key.
    pub fn add(&mut self, ip: IpAddr) {
        let key = self.key(ip);
        *self.counts.entry(key).or_default() += 1;
    }

    /// Counts one less for `ip`'s key (forgetting keys that reach zero).
    pub fn remove(&mut self, ip: IpAddr) {
        let key = self.key(ip);
        if let Some(n) = self.counts.get_mut(&key) {
            *n -= 1;
            if *n == 0 {
                self.counts.remove(&key);
                shrink_when_sparse(&mut self.counts);
            }
        }
    }

    /// The key holding the most (any of them on a tie), with its count.
    pub fn busiest(&self) -> Option<(AddressKey, u32)> {
        self.counts
            .iter()
            .max_by_key(|(_, n)| **n)
            .map(|(k, n)| (*k, *n))
    }

    /// Keys with a non-zero count.
    pub fn len(&self) -> usize {
        self.counts.len()
    }

    /// Whether no key holds anything.
    pub fn is_empty(&self) -> bool {
        self.counts.is_empty()
    }

    /// The table's capacity (for tests of shrinking).
    pub fn capacity(&self) -> usize {
        self.counts.capacity()
    }
}

/// A per-address limit shared by many tasks: at most `limit` permits per key.
#[derive(Debug)]
pub struct IpBudget {
    limit: u32,
    counts: Mutex<IpCounts>,
}

impl IpBudget {
    /// A budget of `limit` per address key, IPv6 addresses counted by `prefix`.
    pub fn new(limit: usize, prefix: AddressPrefix) -> Arc<IpBudget> {
        Arc::new(IpBudget {
            limit: u32::try_from(limit).unwrap_or(u32::MAX),
            counts: Mutex::new(IpCounts::new(prefix)),
        })
    }

    /// A permit for `ip`, or `None` when its key holds `limit` already.
    pub fn try_acquire(self: &Arc<Self>, ip: IpAddr) -> Option<IpPermit> {
        let mut counts = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        if counts.get(ip) >= self.limit {
            return None;
        }
        counts.add(ip);
        Some(IpPermit {
            budget: self.clone(),
            ip,
        })
    }

    /// What `ip`'s key holds now.
    pub fn held(&self, ip: IpAddr) -> u32 {
        self.counts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(ip)
    }

    /// Address keys holding at least one permit.
    pub fn addresses(&self) -> usize {
        self.counts.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}

/// One place in an [`IpBudget`], given back when dropped.
#[derive(Debug)]
pub struct IpPermit {
    budget: Arc<IpBudget>,
    ip: IpAddr,
}

impl Drop for IpPermit {
    fn drop(&mut self) {
        self.budget
            .counts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(self.ip);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn addresses_rotating_inside_one_ipv6_prefix_share_one_budget() {
        let budget = IpBudget::new(4, AddressPrefix::SUBNET);
        let held: Vec<IpPermit> = (1..=4)
            .map(|host| {
                budget
                    .try_acquire(ip(&format!("2001:db8::{host}")))
                    .unwrap()
            })
            .collect();
        assert!(
            budget.try_acquire(ip("2001:db8::ffff:5")).is_none(),
            "the next address of the same /64"
        );
        assert!(
            budget.try_acquire(ip("2001:db8:0:1::1")).is_some(),
            "the next /64"
        );
        assert_eq!(
            budget.addresses(),
            1,
            "the permit for the next /64 was dropped"
        );
        drop(held);
        assert_eq!(budget.addresses(), 0);
        let per_host = IpBudget::new(1, AddressPrefix::HOST);
        let _a = per_host.try_acquire(ip("2001:db8::1")).unwrap();
        assert!(per_host.try_acquire(ip("2001:db8::2")).is_some(), "/128");
    }

    #[test]
    fn budget_refuses_one_address_and_not_another() {
        let budget = IpBudget::new(2, AddressPrefix::default());
        let (a, b): (IpAddr, IpAddr) = ("127.0.0.2".parse().unwrap(), "127.0.0.3".parse().unwrap());
        let p1 = budget.try_acquire(a).unwrap();
        let _p2 = budget.try_acquire(a).unwrap();
        assert!(
            budget.try_acquire(a).is_none(),
            "a third for the same address"
        );
        let mapped: IpAddr = "::ffff:127.0.0.2".parse().unwrap();
        assert!(
            budget.try_acquire(mapped).is_none(),
            "the same address, mapped"
        );
        assert!(budget.try_acquire(b).is_some(), "another address");
        drop(p1);
        assert_eq!(budget.held(a), 1);
        assert!(budget.try_acquire(a).is_some(), "a place came back");
    }

    #[test]
    fn counts_shrink_after_a_flood() {
        let mut counts = IpCounts::new(AddressPrefix::default());
        let ips: Vec<IpAddr> = (0..10_000u32)
            .map(|i| IpAddr::V4(std::net::Ipv4Addr::from(0x7f00_0000 + i)))
            .collect();
        for ip in &ips {
            counts.add(*ip);
        }
        assert_eq!(counts.busiest().map(|(_, n)| n), Some(1));
        let grown = counts.capacity();
        for ip in &ips {
            counts.remove(*ip);
        }
        assert!(counts.is_empty());
        assert!(
            counts.capacity() <= 256 && counts.capacity() < grown,
            "{} after {grown}",
            counts.capacity()
        );
    }
}
