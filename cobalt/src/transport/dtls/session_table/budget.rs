//! Which sessions a DTLS table keeps, and who gives way when a budget is full (see
//! [`DtlsConfig`](super::DtlsConfig)): handshakes in progress per address and per table,
//! established sessions per address and per table, and the bookkeeping that keeps the
//! counts right and gives the tables' memory back when they empty.
//!
//! Finding who gives way scans the table; it runs only when a budget is full.

use super::{DtlsEvent, OpensslDtls, Role, Session};
use crate::transport::per_ip::IpCounts;
use cobalt_proto::address::{AddressKey, AddressPrefix};
use cobalt_proto::tables::shrink_when_sparse;
use std::net::{IpAddr, SocketAddr};
use std::time::Instant;

impl OpensslDtls {
    /// Counts the handshakes and sessions of IPv6 peers by `prefix` (default /64) in
    /// the per-address budgets; called before the table serves anyone.
    pub fn count_ipv6_by(&mut self, prefix: AddressPrefix) {
        debug_assert!(self.handshakes_per_ip.is_empty());
        debug_assert!(self.sessions_per_ip.is_empty());
        self.handshakes_per_ip = IpCounts::new(prefix);
        self.sessions_per_ip = IpCounts::new(prefix);
    }

    /// Removes `peer`'s session and its place in the counts; shrinks the tables when
    /// they have become sparse (after a flood).
    pub(super) fn remove_session(&mut self, peer: SocketAddr) -> Option<Session> {
        let s = self.sessions.remove(&peer)?;
        if !self.forget_handshake(peer) && self.role == Role::Server {
            self.sessions_per_ip.remove(peer.ip());
            if !s.authenticated {
                self.anonymous = self.anonymous.saturating_sub(1);
            }
        }
        shrink_when_sparse(&mut self.sessions);
        Some(s)
    }

    /// Takes `peer` off the handshakes in progress; returns whether it was one.
    pub(super) fn forget_handshake(&mut self, peer: SocketAddr) -> bool {
        if self.handshaking.remove(&peer).is_none() {
            return false;
        }
        if self.role == Role::Server {
            self.handshakes_per_ip.remove(peer.ip());
        }
        shrink_when_sparse(&mut self.handshaking);
        true
    }

    /// Removes `peer`'s session and reports it: [`DtlsEvent::Closed`] for an
    /// established one, [`DtlsEvent::HandshakeFailed`] for a handshake.
    pub(super) fn end_session(&mut self, peer: SocketAddr, reason: String) {
        if let Some(s) = self.remove_session(peer) {
            self.events.push_back(if s.established {
                DtlsEvent::Closed { peer, reason }
            } else {
                DtlsEvent::HandshakeFailed { peer, reason }
            });
        }
    }

    /// Established sessions.
    fn established_count(&self) -> usize {
        self.sessions.len() - self.handshaking.len()
    }

    /// Server: makes room for a handshake from `peer` within the per-address budget
    /// (its own oldest handshake gives way), then within the table's (the oldest
    /// handshake of the address with the most gives way).
    pub(super) fn make_room_for_handshake(&mut self, peer: SocketAddr) {
        let per_ip = u32::try_from(self.config.max_handshakes_per_ip.max(1)).unwrap_or(u32::MAX);
        while self.handshakes_per_ip.get(peer.ip()) >= per_ip {
            let key = self.handshakes_per_ip.key(peer.ip());
            if !self.displace_oldest_handshake(key, "too many handshakes from this address") {
                break;
            }
        }
        while self.handshaking.len() >= self.config.max_handshakes.max(1) {
            let Some((key, _)) = self.handshakes_per_ip.busiest() else {
                break;
            };
            if !self.displace_oldest_handshake(key, "too many handshakes in progress") {
                break;
            }
        }
    }

    /// Drops the oldest handshake in progress from address key `key`.
    fn displace_oldest_handshake(&mut self, key: AddressKey, why: &str) -> bool {
        let oldest = self
            .handshaking
            .iter()
            .filter(|(p, _)| self.handshakes_per_ip.key(p.ip()) == key)
            .min_by_key(|(_, started)| **started)
            .map(|(p, _)| *p);
        let Some(peer) = oldest else {
            return false;
        };
        self.stats.handshakes_displaced += 1;
        self.end_session(peer, format!("displaced: {why}"));
        true
    }

    /// Server, at a ClientHello from `peer` whose cookie checked out: whether a new
    /// session could find a place once its handshake completes (room, a stale session,
    /// an anonymous one an authenticated peer may take the place of, or one of an
    /// address holding more than `peer`'s).
    pub(super) fn may_admit(&mut self, now: Instant, peer: SocketAddr) -> bool {
        self.established_count() < self.config.max_sessions.max(1)
            || self.anonymous > 0
            || self.busier_than(peer.ip()).is_some()
            || self.stalest_if_stale(now).is_some()
    }

    /// Server, when the handshake of `peer` completes: makes a place for its session.
    /// Within the address's budget ([`max_sessions_per_ip`](super::DtlsConfig::max_sessions_per_ip))
    /// its own least recently heard-from session gives way; within the table's, a stale
    /// session, else the least recently heard-from anonymous session of the address
    /// holding the most (when that is more than `peer`'s address holds), else for an
    /// `authenticated` newcomer the least recently heard-from anonymous session. A
    /// session that authenticated gives way only to staleness or to a newcomer from its
    /// own address that authenticated too. `false`: no session may give way.
    pub(super) fn make_room_for_session(
        &mut self,
        now: Instant,
        peer: SocketAddr,
        authenticated: bool,
    ) -> bool {
        let per_ip = u32::try_from(self.config.max_sessions_per_ip.max(1)).unwrap_or(u32::MAX);
        if self.sessions_per_ip.get(peer.ip()) >= per_ip {
            let own = self.sessions_per_ip.key(peer.ip());
            let Some(victim) = self.least_recent_of(own, !authenticated) else {
                return false;
            };
            self.evict(victim, "too many DTLS sessions from this address");
        }
        if self.established_count() < self.config.max_sessions.max(1) {
            return true;
        }
        let victim = self
            .stalest_if_stale(now)
            .or_else(|| {
                let busiest = self.busier_than(peer.ip())?;
                self.least_recent_of(busiest, true)
            })
            .or_else(|| {
                authenticated
                    .then(|| self.least_recent_anonymous())
                    .flatten()
            });
        let Some(victim) = victim else {
            return false;
        };
        self.evict(victim, "too many DTLS sessions");
        true
    }

    /// Ends the established session of `peer` to make room, saying `why` (to the
    /// driver; the peer gets a close_notify).
    fn evict(&mut self, peer: SocketAddr, why: &str) {
        self.send_close_notify(peer);
        self.stats.evicted += 1;
        self.end_session(peer, format!("evicted: {why}"));
    }

    /// The address key holding the most established sessions, if it holds more than
    /// one more than `ip`'s (so that two addresses do not displace each other's
    /// sessions in turn).
    fn busier_than(&self, ip: IpAddr) -> Option<AddressKey> {
        let held = self.sessions_per_ip.get(ip);
        self.sessions_per_ip
            .busiest()
            .filter(|(_, n)| *n > held + 1)
            .map(|(key, _)| key)
    }

    /// The established session of address key `key` heard from least recently (only
    /// among the anonymous ones if `anonymous_only`).
    fn least_recent_of(&self, key: AddressKey, anonymous_only: bool) -> Option<SocketAddr> {
        self.sessions
            .iter()
            .filter(|(p, s)| {
                s.established
                    && !(anonymous_only && s.authenticated)
                    && self.sessions_per_ip.key(p.ip()) == key
            })
            .min_by_key(|(_, s)| s.last_seen)
            .map(|(p, _)| *p)
    }

    /// The established session heard from least recently, if it has been silent for
    /// `stale_after`. Scans only when a session can have become stale since the last
    /// scan.
    fn stalest_if_stale(&mut self, now: Instant) -> Option<SocketAddr> {
        if self.no_stale_before.is_some_and(|t| now < t) {
            return None;
        }
        let (peer, seen) = self
            .sessions
            .iter()
            .filter(|(_, s)| s.established)
            .min_by_key(|(_, s)| s.last_seen)
            .map(|(p, s)| (*p, s.last_seen))?;
        if now.saturating_duration_since(seen) >= self.config.stale_after {
            return Some(peer);
        }
        self.no_stale_before = Some(seen + self.config.stale_after);
        None
    }

    /// The anonymous established session heard from least recently.
    fn least_recent_anonymous(&self) -> Option<SocketAddr> {
        self.sessions
            .iter()
            .filter(|(_, s)| s.established && !s.authenticated)
            .min_by_key(|(_, s)| s.last_seen)
            .map(|(p, _)| *p)
    }

    /// Client: evicts the least recently heard-from session when the table is full.
    pub(super) fn make_room_lru(&mut self) {
        while self.sessions.len() >= self.config.max_sessions.max(1) {
            let Some(stalest) = self
                .sessions
                .iter()
                .min_by_key(|(_, s)| s.last_seen)
                .map(|(p, _)| *p)
            else {
                return;
            };
            self.stats.evicted += 1;
            self.end_session(stalest, "evicted: too many DTLS sessions".into());
        }
    }
}
