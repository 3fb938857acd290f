//! Budgets per source address: how many handshakes in progress or connections one
//! address may hold, so that one address reaching its budget is refused while others
//! are still served.
//!
//! An address is counted by [`budget_key`]: IPv4 addresses (also when they arrive
//! IPv4-mapped on a dual-stack socket) as they are, IPv6 addresses by their /64 prefix,
//! since one host or one subscriber usually holds a whole /64.
//!
//! [`IpCounts`] is the plain table (one owner, e.g. a DTLS shard); [`IpBudget`] shares
//! one between tasks (TCP, TLS and WebSocket listeners) and hands out [`IpPermit`]s
//! that give their place back when dropped. Both give their memory back when they
//! empty (see [`shrink_when_sparse`]).

use std::collections::HashMap;
use std::hash::Hash;
use std::net::{IpAddr, Ipv6Addr};
use std::sync::{Arc, Mutex};

/// The key `ip` is counted under: IPv4 (IPv4-mapped IPv6 too) as is, IPv6 by /64.
pub fn budget_key(ip: IpAddr) -> IpAddr {
    match ip.to_canonical() {
        IpAddr::V4(v4) => IpAddr::V4(v4),
        IpAddr::V6(v6) => {
            let s = v6.segments();
            IpAddr::V6(Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
        }
    }
}

/// A table is shrunk only above this capacity (below, not worth a reallocation).
const SHRINK_ABOVE: usize = 256;

/// Gives a hash map's memory back when it holds less than a quarter of its capacity:
/// tables grown by a flood shrink once the flood's entries are gone. Amortised O(1)
/// when called after each removal (a shrink halves the capacity at most once per
/// `len` removals).
pub fn shrink_when_sparse<K: Eq + Hash, V>(map: &mut HashMap<K, V>) {
    let cap = map.capacity();
    if cap > SHRINK_ABOVE && map.len() < cap / 4 {
        map.shrink_to((map.len() * 2).max(SHRINK_ABOVE / 4));
    }
}

/// How many things (handshakes, connections) each address key holds.
#[derive(Debug, Default)]
pub struct IpCounts {
    counts: HashMap<IpAddr, u32>,
}

impl IpCounts {
    /// An empty table.
    pub fn new() -> IpCounts {
        IpCounts::default()
    }

    /// What `ip`'s key holds.
    pub fn get(&self, ip: IpAddr) -> u32 {
        self.counts.get(&budget_key(ip)).copied().unwrap_or(0)
    }

    /// Counts one more for `ip`'s key.
    pub fn add(&mut self, ip: IpAddr) {
        *self.counts.entry(budget_key(ip)).or_default() += 1;
    }

    /// Counts one less for `ip`'s key (forgetting keys that reach zero).
    pub fn remove(&mut self, ip: IpAddr) {
        let key = budget_key(ip);
        if let Some(n) = self.counts.get_mut(&key) {
            *n -= 1;
            if *n == 0 {
                self.counts.remove(&key);
                shrink_when_sparse(&mut self.counts);
            }
        }
    }

    /// The key holding the most (any of them on a tie), with its count.
    pub fn busiest(&self) -> Option<(IpAddr, u32)> {
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
    /// A budget of `limit` per address key.
    pub fn new(limit: usize) -> Arc<IpBudget> {
        Arc::new(IpBudget {
            limit: u32::try_from(limit).unwrap_or(u32::MAX),
            counts: Mutex::new(IpCounts::new()),
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

    #[test]
    fn mapped_ipv4_and_ipv6_prefixes_share_a_key() {
        let v4: IpAddr = "127.0.0.2".parse().unwrap();
        let mapped: IpAddr = "::ffff:127.0.0.2".parse().unwrap();
        assert_eq!(budget_key(mapped), v4);
        let a: IpAddr = "2001:db8:1:2:aaaa::1".parse().unwrap();
        let b: IpAddr = "2001:db8:1:2:bbbb::9".parse().unwrap();
        let c: IpAddr = "2001:db8:1:3::1".parse().unwrap();
        assert_eq!(budget_key(a), budget_key(b));
        assert_ne!(budget_key(a), budget_key(c));
    }

    #[test]
    fn budget_refuses_one_address_and_not_another() {
        let budget = IpBudget::new(2);
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
        let mut counts = IpCounts::new();
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
            counts.capacity() <= SHRINK_ABOVE && counts.capacity() < grown,
            "{} after {grown}",
            counts.capacity()
        );
    }
}
