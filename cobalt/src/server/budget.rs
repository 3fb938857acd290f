//! Budgets of state that peers create in the server role, and who is refused when one
//! runs out.
//!
//! The convention and the fair-share rule are `cobalt_proto::budget`'s ([`Refusal`],
//! [`fair_share_exceeded`]); this module keeps the server-wide observer budget and the
//! counters of refusals.
//!
//! [`ObserverBudget`] keeps the observe relations (RFC 7641) of one server per client
//! address key (IPv4 address or IPv6 prefix, [`AddressKey`]) and in total, over all its UDP shards and TCP, TLS and WebSocket
//! connections; the uploads in progress keep their own per-peer ledger
//! (`cobalt_proto::blockwise::uploads`), counting here.

use crate::metrics::LimitCounters;
use cobalt_proto::address::{AddressKey, AddressPrefix};
use cobalt_proto::blockwise::uploads::{UploadCounters, UploadLimits, Uploads};
pub(crate) use cobalt_proto::budget::{fair_share_exceeded, Refusal};
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

/// What the peers of one server hold beyond single exchanges, shared by its shards and
/// listeners: the observe-relation budget, and the counters of refusals and dropped
/// uploads (the uploads themselves are accounted per shard or listener).
#[derive(Debug)]
pub(crate) struct Budgets {
    /// Observe relations per address and in total.
    pub observers: Arc<ObserverBudget>,
    /// Refusals, expiries and evictions, for the metrics.
    pub counters: Arc<LimitCounters>,
}

impl Default for Budgets {
    fn default() -> Self {
        let counters = Arc::new(LimitCounters::default());
        Budgets {
            observers: Arc::new(ObserverBudget::new(counters.clone())),
            counters,
        }
    }
}

impl Budgets {
    /// Counts IPv6 peers by `prefix` in every per-address budget made here from now
    /// on: the observe relations and the upload tables of [`Budgets::uploads`]. The
    /// server sets it from `ipv6_budget_prefix` before it serves anyone.
    pub(crate) fn count_ipv6_by(&self, prefix: AddressPrefix) {
        self.observers.count_ipv6_by(prefix);
    }

    /// An empty upload table within `limits`, counting its refusals here and IPv6
    /// peers as the observe relations do.
    pub(crate) fn uploads(&self, limits: UploadLimits) -> Uploads {
        Uploads::new(limits, self.counters.clone())
            .with_address_prefix(self.observers.address_prefix())
    }
}

/// Counts a refused observe registration.
fn count_observe(c: &LimitCounters, r: Refusal) {
    let n = match r {
        Refusal::PeerBudget => &c.observe_refused_peer,
        Refusal::ServerBound => &c.observe_refused_server,
    };
    n.fetch_add(1, Ordering::Relaxed);
}

/// An upload table counts its refusals and drops in the server's counters.
impl UploadCounters for LimitCounters {
    fn refused(&self, refusal: Refusal) {
        let n = match refusal {
            Refusal::PeerBudget => &self.upload_refused_peer,
            Refusal::ServerBound => &self.upload_refused_server,
        };
        n.fetch_add(1, Ordering::Relaxed);
    }
    fn expired(&self, n: u64) {
        self.uploads_expired.fetch_add(n, Ordering::Relaxed);
    }
    fn evicted(&self) {
        self.uploads_evicted.fetch_add(1, Ordering::Relaxed);
    }
}

/// The observe relations of one server, per client address key and in total.
#[derive(Debug, Default)]
pub(crate) struct ObserverBudget {
    held: Mutex<Held>,
    /// Where refused registrations are counted.
    counters: Arc<LimitCounters>,
}

#[derive(Debug, Default)]
struct Held {
    /// How IPv6 addresses are counted (set when the server starts).
    prefix: AddressPrefix,
    total: usize,
    per_ip: HashMap<AddressKey, usize>,
}

impl ObserverBudget {
    /// An empty budget counting its refusals in `counters`.
    pub(crate) fn new(counters: Arc<LimitCounters>) -> ObserverBudget {
        ObserverBudget {
            held: Mutex::default(),
            counters,
        }
    }

    fn held(&self) -> std::sync::MutexGuard<'_, Held> {
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Counts IPv6 addresses by `prefix` from now on (the server sets it before it
    /// serves anyone; relations held already stay counted under their old key).
    pub(crate) fn count_ipv6_by(&self, prefix: AddressPrefix) {
        self.held().prefix = prefix;
    }

    /// How IPv6 addresses are counted.
    pub(crate) fn address_prefix(&self) -> AddressPrefix {
        self.held().prefix
    }

    /// Whether `ip` may add a relation now (nothing is taken; a refusal is counted);
    /// see [`ObserverBudget::admit`].
    pub(crate) fn check(&self, ip: IpAddr, per_ip: usize, bound: usize) -> Result<(), Refusal> {
        self.take(ip, per_ip, bound, false)
    }

    /// Takes one relation for `ip` unless it holds `per_ip` already (4.29) or the
    /// server is near `bound` and `ip` holds at least what is left (5.03). Refusals are
    /// counted.
    pub(crate) fn admit(&self, ip: IpAddr, per_ip: usize, bound: usize) -> Result<(), Refusal> {
        self.take(ip, per_ip, bound, true)
    }

    fn take(&self, ip: IpAddr, per_ip: usize, bound: usize, take: bool) -> Result<(), Refusal> {
        let mut held = self.held();
        let key = AddressKey::of(ip, held.prefix);
        let mine = held.per_ip.get(&key).copied().unwrap_or(0);
        let refusal = if mine >= per_ip {
            Some(Refusal::PeerBudget)
        } else if fair_share_exceeded(mine, 1, held.total, bound) {
            Some(Refusal::ServerBound)
        } else {
            None
        };
        if let Some(r) = refusal {
            drop(held);
            count_observe(&self.counters, r);
            return Err(r);
        }
        if take {
            held.total += 1;
            *held.per_ip.entry(key).or_default() += 1;
        }
        Ok(())
    }

    /// Gives back one relation of `ip`.
    pub(crate) fn release(&self, ip: IpAddr) {
        let mut held = self.held();
        let key = AddressKey::of(ip, held.prefix);
        let Some(n) = held.per_ip.get_mut(&key) else {
            return;
        };
        *n -= 1;
        if *n == 0 {
            held.per_ip.remove(&key);
            cobalt_proto::tables::shrink_when_sparse(&mut held.per_ip);
        }
        held.total = held.total.saturating_sub(1);
    }

    /// One relation of `from` counts for `to` from now on (its observer moved: a
    /// DTLS session's new address). Nothing is added, so it is not refused even where
    /// `to` holds its share: its next registration is, until it holds less.
    pub(crate) fn transfer(&self, from: IpAddr, to: IpAddr) {
        let mut held = self.held();
        let (old, new) = (
            AddressKey::of(from, held.prefix),
            AddressKey::of(to, held.prefix),
        );
        if old == new {
            return;
        }
        let Some(n) = held.per_ip.get_mut(&old) else {
            return;
        };
        *n -= 1;
        if *n == 0 {
            held.per_ip.remove(&old);
        }
        *held.per_ip.entry(new).or_default() += 1;
    }

    /// Relations held now, in total.
    #[cfg(test)]
    pub(crate) fn total(&self) -> usize {
        self.held().total
    }

    /// Relations held now by `ip`.
    #[cfg(test)]
    pub(crate) fn of(&self, ip: IpAddr) -> usize {
        let held = self.held();
        let key = AddressKey::of(ip, held.prefix);
        held.per_ip.get(&key).copied().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(n: u8) -> IpAddr {
        IpAddr::from([192, 0, 2, n])
    }

    #[test]
    fn one_address_cannot_take_every_relation() {
        let b = ObserverBudget::default();
        let (per_ip, bound) = (1000, 100);
        let mut taken = 0;
        while b.admit(ip(1), per_ip, bound).is_ok() {
            taken += 1;
        }
        assert_eq!(taken, 50, "an attacker alone stops at half");
        assert_eq!(b.counters.observe_refused_server.load(Ordering::Relaxed), 1);
        // A second address still gets in, and so does a third, with less each.
        let mut second = 0;
        while b.admit(ip(2), per_ip, bound).is_ok() {
            second += 1;
        }
        assert_eq!(second, 25);
        assert!(b.admit(ip(3), per_ip, bound).is_ok());
        assert!(b.check(ip(1), per_ip, bound).is_err());
        for _ in 0..50 {
            b.release(ip(1));
        }
        assert_eq!(b.of(ip(1)), 0);
        assert_eq!(b.total(), 26);
        assert!(b.admit(ip(1), per_ip, bound).is_ok());
    }

    #[test]
    fn addresses_rotating_inside_one_ipv6_prefix_share_one_budget() {
        let b = ObserverBudget::default();
        let at = |s: &str| s.parse::<IpAddr>().unwrap();
        for host in 1..=4 {
            b.admit(at(&format!("2001:db8::{host}")), 4, 1000).unwrap();
        }
        assert_eq!(
            b.admit(at("2001:db8::ffff:5"), 4, 1000),
            Err(Refusal::PeerBudget),
            "the next address of the same /64"
        );
        assert!(
            b.admit(at("2001:db8:0:1::1"), 4, 1000).is_ok(),
            "the next /64"
        );
        assert_eq!(b.of(at("2001:db8::77")), 4);
        // Configurable: by /48, other /64s of the same /48 share the budget too.
        let b = ObserverBudget::default();
        b.count_ipv6_by(AddressPrefix::new(48));
        for net in 1..=4 {
            b.admit(at(&format!("2001:db8:0:{net}::1")), 4, 1000)
                .unwrap();
        }
        assert!(b.admit(at("2001:db8:0:5::1"), 4, 1000).is_err());
        assert!(b.admit(at("2001:db8:1::1"), 4, 1000).is_ok());
    }

    #[test]
    fn the_per_address_budget_answers_4_29() {
        let b = ObserverBudget::default();
        for _ in 0..3 {
            b.admit(ip(1), 3, 1000).unwrap();
        }
        assert_eq!(b.admit(ip(1), 3, 1000), Err(Refusal::PeerBudget));
        assert_eq!(b.check(ip(1), 3, 1000), Err(Refusal::PeerBudget));
        assert_eq!(b.counters.observe_refused_peer.load(Ordering::Relaxed), 2);
        assert!(b.admit(ip(2), 3, 1000).is_ok(), "another address is served");
    }

    #[test]
    fn a_transferred_relation_counts_for_the_new_address_only() {
        let b = ObserverBudget::default();
        b.admit(ip(1), 1, 1000).unwrap();
        b.transfer(ip(1), ip(2));
        assert_eq!((b.of(ip(1)), b.of(ip(2)), b.total()), (0, 1, 1));
        assert!(b.admit(ip(1), 1, 1000).is_ok(), "the old address is free");
        assert_eq!(
            b.admit(ip(2), 1, 1000),
            Err(Refusal::PeerBudget),
            "the new one holds its share"
        );
        b.transfer(ip(3), ip(2));
        assert_eq!(
            b.of(ip(2)),
            1,
            "nothing to move from an address holding none"
        );
    }
}
