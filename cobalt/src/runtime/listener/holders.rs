//! Who holds a listener's places, and who gives one up when the listener is full and a
//! new address needs room.
//!
//! The listener's accept loop owns a [`Holders`]: one entry per connection task, with
//! the connection's address key ([`AddressKey`]) and when a message last arrived on it
//! (a [`LastHeard`] the connection's task stamps). Places are counted per address key,
//! so the per-address budget and the choice of whom to evict read the same counts.
//! When every place is taken and a connection arrives from an address holding fewer
//! connections than the most-represented one, that address's connection heard from least
//! recently is evicted: it leaves the table at once (its place goes to the newcomer)
//! and its task is told to send an Abort and close. The scan that finds it runs only
//! when the listener is full.

use crate::transport::per_ip::IpCounts;
use cobalt_proto::address::{AddressKey, AddressPrefix};
use cobalt_proto::tables::shrink_when_sparse;
use std::collections::HashMap;
use std::hash::Hash;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::oneshot;

/// When a message last arrived on a connection, in milliseconds since the listener
/// started: stamped by the connection's task, read by the accept loop when it looks
/// for the idlest connection.
#[derive(Debug, Clone)]
pub(crate) struct LastHeard {
    epoch: Instant,
    millis: Arc<AtomicU64>,
}

impl LastHeard {
    /// Records that the peer was heard from at `now`.
    pub(crate) fn stamp(&self, now: Instant) {
        let millis = now.saturating_duration_since(self.epoch).as_millis();
        self.millis
            .store(u64::try_from(millis).unwrap_or(u64::MAX), Ordering::Relaxed);
    }

    fn millis(&self) -> u64 {
        self.millis.load(Ordering::Relaxed)
    }
}

/// One connection's place.
#[derive(Debug)]
struct Holder {
    /// The connection's address.
    ip: IpAddr,
    /// The address key the place is counted under.
    key: AddressKey,
    last_heard: LastHeard,
    /// Tells the connection's task that it was evicted.
    evict: oneshot::Sender<()>,
}

/// A place [`Holders::admit`] made for a new connection, held once the connection's task
/// is spawned ([`Holders::hold`]).
#[derive(Debug)]
pub(crate) struct Seat {
    holder: Holder,
    /// Whether another connection was evicted to make the place.
    pub(crate) evicted: bool,
}

/// What the task of an admitted connection keeps of its place.
#[derive(Debug)]
pub(crate) struct Place {
    /// Resolves when the connection is evicted.
    pub(crate) eviction: oneshot::Receiver<()>,
    /// What the task stamps when a message arrives.
    pub(crate) last_heard: LastHeard,
}

/// Why [`Holders::admit`] found no place for a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// The connection's address holds its budget of connections already.
    AddressBudget,
    /// Every place is held, and no address holds more than the newcomer's.
    Full,
}

/// The connections a listener holds, by task (`Id`: the task's id in the listener),
/// counted per address key.
#[derive(Debug)]
pub(crate) struct Holders<Id> {
    epoch: Instant,
    max: usize,
    max_per_key: u32,
    by_task: HashMap<Id, Holder>,
    per_key: IpCounts,
}

impl<Id: Hash + Eq + Copy> Holders<Id> {
    /// An empty table of `max` places, at most `max_per_key` of them per address key
    /// (IPv6 addresses counted by `prefix`); times are kept relative to `epoch`.
    pub(crate) fn new(
        max: usize,
        max_per_key: usize,
        prefix: AddressPrefix,
        epoch: Instant,
    ) -> Holders<Id> {
        Holders {
            epoch,
            max: max.max(1),
            max_per_key: u32::try_from(max_per_key.max(1)).unwrap_or(u32::MAX),
            by_task: HashMap::new(),
            per_key: IpCounts::new(prefix),
        }
    }

    /// Connections holding a place.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.by_task.len()
    }

    /// Connections the address key of `ip` holds.
    #[cfg(test)]
    fn held_by(&self, ip: IpAddr) -> u32 {
        self.per_key.get(ip)
    }

    /// A place for a connection from `ip` arriving at `now`. When the listener is full
    /// and `ip`'s address holds fewer connections than the most-represented address (by
    /// more than one, so that two addresses do not evict each other's connections in
    /// turn), that address's connection heard from least recently is evicted: it leaves
    /// the table at once and its task is told to close.
    pub(crate) fn admit(&mut self, ip: IpAddr, now: Instant) -> Result<(Seat, Place), Refusal> {
        let held = self.per_key.get(ip);
        if held >= self.max_per_key {
            return Err(Refusal::AddressBudget);
        }
        let mut evicted = false;
        if self.by_task.len() >= self.max {
            match self.per_key.busiest() {
                Some((busiest, n)) if n > held + 1 => evicted = self.evict_idlest(busiest),
                _ => {}
            }
            if !evicted {
                return Err(Refusal::Full);
            }
        }
        let (evict, eviction) = oneshot::channel();
        let last_heard = LastHeard {
            epoch: self.epoch,
            millis: Arc::default(),
        };
        last_heard.stamp(now);
        let holder = Holder {
            ip,
            key: self.per_key.key(ip),
            last_heard: last_heard.clone(),
            evict,
        };
        Ok((
            Seat { holder, evicted },
            Place {
                eviction,
                last_heard,
            },
        ))
    }

    /// The connection of `seat` holds its place under its task's `id`.
    pub(crate) fn hold(&mut self, id: Id, seat: Seat) {
        self.per_key.add(seat.holder.ip);
        self.by_task.insert(id, seat.holder);
    }

    /// The task `id` ended: its place (if not taken by an eviction) comes back.
    pub(crate) fn release(&mut self, id: Id) {
        if let Some(holder) = self.by_task.remove(&id) {
            self.per_key.remove(holder.ip);
            shrink_when_sparse(&mut self.by_task);
        }
    }

    /// Evicts the connection of address key `key` heard from least recently; returns
    /// whether there was one.
    fn evict_idlest(&mut self, key: AddressKey) -> bool {
        let idlest = self
            .by_task
            .iter()
            .filter(|(_, h)| h.key == key)
            .min_by_key(|(_, h)| h.last_heard.millis())
            .map(|(id, _)| *id);
        let Some(id) = idlest else {
            return false;
        };
        if let Some(holder) = self.by_task.remove(&id) {
            self.per_key.remove(holder.ip);
            // A task that ended meanwhile has nothing left to close.
            let _ = holder.evict.send(());
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([127, 0, 0, last])
    }

    /// Admits a connection from `from` at `at` under task id `id`; returns its place.
    fn connect(holders: &mut Holders<u32>, id: u32, from: IpAddr, at: Instant) -> Place {
        let (seat, place) = holders.admit(from, at).expect("admitted");
        holders.hold(id, seat);
        place
    }

    #[test]
    fn a_full_listener_evicts_the_idlest_connection_of_the_busiest_address() {
        let t0 = Instant::now();
        let mut holders = Holders::new(6, 4, AddressPrefix::default(), t0);
        let mut places = Vec::new();
        // Address .2 holds four connections, .3 two: the listener is full.
        for id in 0..4 {
            places.push(connect(&mut holders, id, ip(2), t0));
        }
        for id in 4..6 {
            places.push(connect(&mut holders, id, ip(3), t0));
        }
        // .2's connections were heard from at 10, 5 (the idlest), 30 and 20 ms.
        for (place, ms) in places.iter().zip([10, 5, 30, 20]) {
            place.last_heard.stamp(t0 + Duration::from_millis(ms));
        }
        let now = t0 + Duration::from_secs(1);
        let (seat, mut place) = holders.admit(ip(9), now).expect("a new address gets in");
        assert!(seat.evicted);
        holders.hold(6, seat);
        assert_eq!(holders.len(), 6, "the listener stays at its size");
        assert_eq!((holders.held_by(ip(2)), holders.held_by(ip(9))), (3, 1));
        let told: Vec<bool> = places
            .iter_mut()
            .map(|p| p.eviction.try_recv().is_ok())
            .collect();
        assert_eq!(told, [false, true, false, false, false, false]);
        assert!(place.eviction.try_recv().is_err(), "the newcomer stays");
        // The evicted task ends later: its place was already given away.
        holders.release(1);
        assert_eq!(holders.len(), 6);
    }

    #[test]
    fn addresses_holding_about_as_many_do_not_evict_each_other() {
        let t0 = Instant::now();
        let mut holders = Holders::new(4, 4, AddressPrefix::default(), t0);
        let _a = connect(&mut holders, 0, ip(2), t0);
        let _b = connect(&mut holders, 1, ip(2), t0);
        let _c = connect(&mut holders, 2, ip(3), t0);
        let _d = connect(&mut holders, 3, ip(4), t0);
        // .3 holds one, the busiest two: no eviction would leave things more even.
        assert_eq!(holders.admit(ip(3), t0).err(), Some(Refusal::Full));
        // A new address (none held) takes one of .2's.
        let (seat, _) = holders.admit(ip(5), t0).expect("a new address gets in");
        assert!(seat.evicted);
        assert_eq!(holders.held_by(ip(2)), 1);
    }

    #[test]
    fn an_address_over_its_budget_is_refused_while_others_are_admitted() {
        let t0 = Instant::now();
        let mut holders = Holders::new(100, 2, AddressPrefix::default(), t0);
        let _a = connect(&mut holders, 0, ip(2), t0);
        let _b = connect(&mut holders, 1, ip(2), t0);
        assert_eq!(holders.admit(ip(2), t0).err(), Some(Refusal::AddressBudget));
        let _c = connect(&mut holders, 2, ip(3), t0);
        holders.release(0);
        assert_eq!(
            holders.held_by(ip(2)),
            1,
            "an ended connection's place came back"
        );
        assert!(holders.admit(ip(2), t0).is_ok());
    }

    #[test]
    fn ipv6_addresses_of_one_prefix_count_as_one() {
        let t0 = Instant::now();
        let mut holders = Holders::new(3, 8, AddressPrefix::default(), t0);
        let host = |n: u16| IpAddr::from([0x2001, 0xdb8, 0, 1, 0, 0, 0, n]);
        for id in 0..3 {
            let _ = connect(&mut holders, id, host(id as u16 + 1), t0);
        }
        // Another address of the same /64 is no new address.
        assert_eq!(holders.admit(host(99), t0).err(), Some(Refusal::Full));
        let other: IpAddr = "2001:db8:0:2::1".parse().unwrap();
        assert!(holders.admit(other, t0).is_ok_and(|(seat, _)| seat.evicted));
    }
}
