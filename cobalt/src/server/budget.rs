//! Budgets of state that peers create in the server role, and who is refused when one
//! runs out.
//!
//! The convention (the same for every kind of state): a peer over its own budget gets
//! **4.29 Too Many Requests** (RFC 8516), and a server-wide bound gets **5.03 Service
//! Unavailable** — both with Max-Age, the time after which to try again — and only the
//! peers that cause it are refused. Near a server-wide bound a peer is refused while it
//! holds at least as much as is still free ([`fair_share_exceeded`]): heavy holders stop
//! first, and the room that is left stays open to peers that hold little. With `k`
//! peers growing as fast as they can, each ends up with at most `bound / (k + 1)`, and
//! as much stays free for everyone else.
//!
//! [`ObserverBudget`] keeps the observe relations (RFC 7641) of one server per client
//! IP address and in total, over all its UDP shards and TCP, TLS and WebSocket
//! connections; the uploads in progress keep their own per-peer ledger
//! ([`super::upload`]).

use super::request::Response;
use crate::metrics::LimitCounters;
use cobalt_proto::message::Code;
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

/// Why a peer's request for more state was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// The peer is over its own budget: 4.29.
    PeerBudget,
    /// A server-wide bound is reached (and the peer holds at least its share): 5.03.
    ServerBound,
}

impl Refusal {
    /// The answer: 4.29 or 5.03 with Max-Age `max_age` and a short payload that says
    /// what ran out (`what`, e.g. "observers").
    pub(crate) fn response(self, what: &str, max_age: u32) -> Response {
        // Short: the answer goes to a peer whose address may be unverified.
        let (code, text) = match self {
            Refusal::PeerBudget => (Code::TOO_MANY_REQUESTS, format!("too many {what} here")),
            Refusal::ServerBound => (Code::SERVICE_UNAVAILABLE, format!("server full: {what}")),
        };
        Response::new(code).with_max_age(max_age).with_payload(text)
    }
}

/// True when a peer holding `held` must not get `more` while `used` of `bound` are
/// taken: the bound would be passed, or the peer already holds at least what would be
/// left free.
pub(crate) fn fair_share_exceeded(held: usize, more: usize, used: usize, bound: usize) -> bool {
    let free = bound.saturating_sub(used);
    more > free || (held > 0 && held >= free - more)
}

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

/// Counts a refused observe registration.
fn count_observe(c: &LimitCounters, r: Refusal) {
    let n = match r {
        Refusal::PeerBudget => &c.observe_refused_peer,
        Refusal::ServerBound => &c.observe_refused_server,
    };
    n.fetch_add(1, Ordering::Relaxed);
}

/// Counts a refused upload (or block of one).
pub(crate) fn count_upload(c: &LimitCounters, r: Refusal) {
    let n = match r {
        Refusal::PeerBudget => &c.upload_refused_peer,
        Refusal::ServerBound => &c.upload_refused_server,
    };
    n.fetch_add(1, Ordering::Relaxed);
}

/// The observe relations of one server, per client IP address and in total.
#[derive(Debug, Default)]
pub(crate) struct ObserverBudget {
    held: Mutex<Held>,
    /// Where refused registrations are counted.
    counters: Arc<LimitCounters>,
}

#[derive(Debug, Default)]
struct Held {
    total: usize,
    per_ip: HashMap<IpAddr, usize>,
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
        let mine = held.per_ip.get(&ip).copied().unwrap_or(0);
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
            *held.per_ip.entry(ip).or_default() += 1;
        }
        Ok(())
    }

    /// Gives back one relation of `ip`.
    pub(crate) fn release(&self, ip: IpAddr) {
        let mut held = self.held();
        let Some(n) = held.per_ip.get_mut(&ip) else {
            return;
        };
        *n -= 1;
        if *n == 0 {
            held.per_ip.remove(&ip);
            super::tables::shrink_when_sparse(&mut held.per_ip);
        }
        held.total = held.total.saturating_sub(1);
    }

    /// Relations held now, in total.
    #[cfg(test)]
    pub(crate) fn total(&self) -> usize {
        self.held().total
    }

    /// Relations held now by `ip`.
    #[cfg(test)]
    pub(crate) fn of(&self, ip: IpAddr) -> usize {
        self.held().per_ip.get(&ip).copied().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(n: u8) -> IpAddr {
        IpAddr::from([192, 0, 2, n])
    }

    #[test]
    fn fair_share_keeps_room_for_light_peers() {
        // 100 slots, nothing used: anyone gets one.
        assert!(!fair_share_exceeded(0, 1, 0, 100));
        // 60 used, this peer holds 40 of them: 40 left, it holds as much: refused.
        assert!(fair_share_exceeded(40, 1, 60, 100));
        // A peer holding nothing gets in until the very end.
        assert!(!fair_share_exceeded(0, 1, 99, 100));
        assert!(fair_share_exceeded(0, 1, 100, 100));
        // Bytes: 10 more for a peer holding 5, with 20 free: 10 left after, 5 < 10.
        assert!(!fair_share_exceeded(5, 10, 80, 100));
        assert!(fair_share_exceeded(11, 10, 80, 100));
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
    fn the_per_address_budget_answers_4_29() {
        let b = ObserverBudget::default();
        for _ in 0..3 {
            b.admit(ip(1), 3, 1000).unwrap();
        }
        assert_eq!(b.admit(ip(1), 3, 1000), Err(Refusal::PeerBudget));
        assert_eq!(b.check(ip(1), 3, 1000), Err(Refusal::PeerBudget));
        assert_eq!(b.counters.observe_refused_peer.load(Ordering::Relaxed), 2);
        assert!(b.admit(ip(2), 3, 1000).is_ok(), "another address is served");
        let r = Refusal::PeerBudget.response("observers", 7);
        assert_eq!(r.code, Code::TOO_MANY_REQUESTS);
        assert_eq!(r.options.max_age(), 7);
        let r = Refusal::ServerBound.response("uploads", 7);
        assert_eq!(r.code, Code::SERVICE_UNAVAILABLE);
    }
}
