//! The endpoint's table of peers ([`Peer`], one entry per IP address and port), with
//! a [`PeerSlot`] that finds an entry again without hashing its address: a request's
//! lookup gives the slot, its exchange keeps it, and the answer reaches the peer's
//! entry through it, so an answered request costs one hash lookup of its peer.
//!
//! A slot is a hint, never trusted: the table may have grown, shrunk or swept since
//! (and a DTLS session's move re-files its peer), so an entry found at a slot is used
//! only when it holds the address asked for; otherwise the address is looked up.

use super::ids::RequestId;
use crate::congestion::{PeerCongestion, States};
use hashbrown::hash_table::Entry;
use hashbrown::{DefaultHashBuilder, HashTable};
use smallvec::SmallVec;
use std::collections::VecDeque;
use std::hash::BuildHasher;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// Everything the endpoint keeps about one peer (IP address and port), found with one
/// lookup per datagram: its message IDs, its requests in progress (for deduplication
/// and admission), whether the dedup store holds messages of it, and its congestion
/// state. What only some peers need (a queue of requests beyond NSTART, message IDs
/// used in more than one block) is in [`PeerRare`], made on first use: a client
/// observing thousands of servers sends each one request, and keeps one small entry
/// per server.
///
/// An entry lives as long as the longer of its two reasons: its own use (for
/// EXCHANGE_LIFETIME, while anything of the peer is in progress) and its congestion
/// state (see [`crate::congestion`]; kept at least 255 s after its last use).
#[derive(Debug)]
pub(super) struct Peer {
    /// Its address: the key it is filed under (see [`PeerEntries`]).
    pub(super) addr: SocketAddr,
    /// Its requests being handled, by message ID, with their exchange: a duplicate
    /// meanwhile is recognised (RFC 7252 §4.5), and their number is what its admission
    /// bound counts ([`EndpointConfig::max_exchanges_per_peer`](super::EndpointConfig::max_exchanges_per_peer)). An answer waiting for
    /// the peer's address to be verified keeps its request here until it is sent.
    pub(super) in_progress: InProgress,
    /// Whether the dedup store may hold handled messages of this peer; until one is
    /// stored, a request needs no look into the store.
    pub(super) stored: bool,
    /// When it was last used (whole seconds since the endpoint's epoch, rounded up,
    /// plus one, as `mid_block_used`): 4 bytes where an `Instant` takes 16, for
    /// every peer of a client observing thousands of devices.
    pub(super) last_used: u32,
    /// Client requests to it sent and not yet answered (at most NSTART).
    pub(super) outstanding: u32,
    /// When a message ID of the block of the last one given out was last used (whole
    /// seconds since the endpoint's epoch, rounded up; 0 = none given out yet).
    pub(super) mid_block_used: u32,
    pub(super) next_mid: u16,
    /// Its retransmission timeouts and NON pacing, for at most
    /// [`EndpointConfig::max_congestion_peers`](super::EndpointConfig::max_congestion_peers)
    /// peers (`None`: none kept).
    pub(super) congestion: Option<PeerCongestion>,
    pub(super) rare: Option<Box<PeerRare>>,
}

/// A peer's requests being handled: each one's message ID and exchange number, two
/// of them inline (a client's requests one after another, and a retransmission
/// of one, never need more).
#[derive(Debug, Default)]
pub(super) struct InProgress(SmallVec<[HandledRequest; 2]>);

/// One request being handled: its message ID and its exchange's number, the number
/// in two 4-byte halves so that the pair takes 12 bytes (as `(u16, u64)` it takes
/// 16, and the peer's entry 8 more).
#[derive(Debug, Clone, Copy)]
struct HandledRequest {
    mid: u16,
    exchange: [u32; 2],
}

impl HandledRequest {
    #[inline]
    fn exchange(&self) -> u64 {
        u64::from(self.exchange[0]) << 32 | u64::from(self.exchange[1])
    }
}

impl InProgress {
    /// The exchange of the request with message ID `mid`, if it is being handled.
    #[inline]
    pub(super) fn exchange_of(&self, mid: u16) -> Option<u64> {
        self.0
            .iter()
            .find(|r| r.mid == mid)
            .map(HandledRequest::exchange)
    }

    /// The request with message ID `mid` is being handled by `exchange`.
    #[inline]
    pub(super) fn push(&mut self, mid: u16, exchange: u64) {
        let exchange = [(exchange >> 32) as u32, exchange as u32];
        self.0.push(HandledRequest { mid, exchange });
    }

    /// The request with message ID `mid` is no longer being handled.
    #[inline]
    pub(super) fn remove(&mut self, mid: u16) {
        if let Some(i) = self.0.iter().position(|r| r.mid == mid) {
            self.0.swap_remove(i);
        }
    }

    /// Requests being handled.
    pub(super) fn len(&self) -> usize {
        self.0.len()
    }

    /// True when none is.
    #[cfg(test)]
    pub(super) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The exchanges of the requests being handled.
    pub(super) fn exchanges(&self) -> impl Iterator<Item = u64> + '_ {
        self.0.iter().map(HandledRequest::exchange)
    }

    /// Takes the exchanges of the requests being handled out, leaving none.
    pub(super) fn take_exchanges(&mut self) -> impl Iterator<Item = u64> {
        std::mem::take(&mut self.0)
            .into_iter()
            .map(|r| r.exchange())
    }
}

/// What only some peers need, kept apart from [`Peer`] so that the many that do not
/// need it pay one pointer.
#[derive(Debug, Default)]
pub(super) struct PeerRare {
    /// Requests waiting for a place among the NSTART outstanding ones.
    pub(super) queue: VecDeque<RequestId>,
    /// For each block of 4096 message IDs left behind, when one of them was last
    /// used (as `Peer::mid_block_used`): a MID may not be used again within
    /// EXCHANGE_LIFETIME (RFC 7252 §4.4).
    pub(super) mid_blocks: [u32; MID_BLOCKS],
}

impl Peer {
    /// True when no request waits in its NSTART queue.
    pub(super) fn queue_is_empty(&self) -> bool {
        self.rare.as_ref().is_none_or(|r| r.queue.is_empty())
    }

    /// Its NSTART queue, made on first use.
    pub(super) fn queue_mut(&mut self) -> &mut VecDeque<RequestId> {
        &mut self.rare.get_or_insert_with(Box::default).queue
    }

    /// Takes the first request of its NSTART queue.
    pub(super) fn dequeue(&mut self) -> Option<RequestId> {
        self.rare.as_mut()?.queue.pop_front()
    }

    /// Removes `id` from its NSTART queue.
    pub(super) fn unqueue(&mut self, id: RequestId) {
        if let Some(r) = self.rare.as_mut() {
            r.queue.retain(|q| *q != id);
        }
    }

    /// Gives out its next message ID, used at `used` (epoch seconds, as
    /// `mid_block_used`); entering a new block of IDs files the last use of the block
    /// left behind.
    pub(super) fn take_mid(&mut self, used: u32) -> u16 {
        let mid = self.next_mid;
        self.next_mid = mid.wrapping_add(1);
        if mid.is_multiple_of(MID_BLOCK_LEN) && self.mid_block_used != 0 {
            let left = mid_block(mid.wrapping_sub(1));
            self.rare.get_or_insert_with(Box::default).mid_blocks[left] = self.mid_block_used;
        }
        self.mid_block_used = used;
        mid
    }

    /// When a message ID of the block that its next ID begins was last used, if that
    /// ID begins a block left behind before (0 otherwise).
    pub(super) fn next_block_last_used(&self) -> u32 {
        if !self.next_mid.is_multiple_of(MID_BLOCK_LEN) {
            return 0;
        }
        self.rare
            .as_ref()
            .map_or(0, |r| r.mid_blocks[mid_block(self.next_mid)])
    }
}

/// The block of message IDs `mid` is in.
fn mid_block(mid: u16) -> usize {
    usize::from(mid / MID_BLOCK_LEN)
}

/// Message IDs are tracked in this many blocks of `MID_BLOCK_LEN`.
pub(super) const MID_BLOCKS: usize = 16;
/// Message IDs in one block.
pub(super) const MID_BLOCK_LEN: u16 = (65536 / MID_BLOCKS) as u16;

/// Where a peer's entry was found in its [`PeerEntries`] (a bucket of the table): a
/// hint for finding it again, checked against the peer's address on use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct PeerSlot(u32);

impl PeerSlot {
    /// A slot that finds nothing (the address is looked up instead).
    pub(super) const UNKNOWN: PeerSlot = PeerSlot(u32::MAX);

    fn of(bucket: usize) -> PeerSlot {
        u32::try_from(bucket).map_or(PeerSlot::UNKNOWN, PeerSlot)
    }

    fn bucket(self) -> usize {
        self.0 as usize
    }
}

/// The peers with per-peer state, by address.
#[derive(Debug)]
pub(super) struct PeerEntries {
    table: HashTable<Peer>,
    hasher: DefaultHashBuilder,
    /// The endpoint's epoch: what [`Peer::last_used`] counts from.
    epoch: Instant,
    /// The second that [`PeerEntries::secs`] gave out last: the times in
    /// `(start, end]` are `secs`. The datagrams of a turn share their `now`, and a
    /// comparison costs less than the subtraction of two `Instant`s (some 30
    /// instructions, twice per answered request).
    second: (Instant, Instant, u32),
}

/// `addr`'s hash in the table: its IP address and port (and an IPv6 address's scope)
/// packed into one or two words first, which the hasher takes in one or two rounds
/// where the derived `Hash` of a `SocketAddr` feeds it field by field (some 40
/// instructions more, for every datagram). Equal addresses have equal hashes (what
/// `SocketAddr`'s equality compares besides, an IPv6 flow label, is left out).
#[inline]
fn hash_of(hasher: &DefaultHashBuilder, addr: &SocketAddr) -> u64 {
    match addr {
        SocketAddr::V4(a) => {
            hasher.hash_one(u64::from(a.ip().to_bits()) << 16 | u64::from(a.port()))
        }
        SocketAddr::V6(a) => hasher.hash_one((
            a.ip().to_bits(),
            u64::from(a.scope_id()) << 16 | u64::from(a.port()),
        )),
    }
}

/// `now` as seconds since `epoch`: whole seconds, rounded up, plus one (so 0 means
/// never), saturating after 136 years.
pub(super) fn epoch_secs(epoch: Instant, now: Instant) -> u32 {
    let d = now.saturating_duration_since(epoch);
    (d.as_secs() + u64::from(d.subsec_nanos() > 0) + 1).min(u64::from(u32::MAX)) as u32
}

impl PeerEntries {
    /// No peers yet; their last uses count from `epoch`.
    pub(super) fn new(epoch: Instant) -> PeerEntries {
        PeerEntries {
            table: HashTable::new(),
            hasher: DefaultHashBuilder::default(),
            epoch,
            second: (epoch, epoch, 0),
        }
    }

    /// The peers' congestion states, for the calls of [`crate::congestion::Congestion`].
    pub(super) fn congestion_places(&mut self) -> CongestionPlaces<'_> {
        CongestionPlaces {
            peers: self,
            slot: PeerSlot::UNKNOWN,
        }
    }

    /// `now` as a [`Peer::last_used`] ([`epoch_secs`]).
    #[inline]
    pub(super) fn secs(&mut self, now: Instant) -> u32 {
        let (start, end, secs) = self.second;
        if start < now && now <= end {
            return secs;
        }
        let secs = epoch_secs(self.epoch, now);
        // Times `d` after the epoch with k - 1 < d <= k give k + 1.
        if (2..u32::MAX).contains(&secs) {
            let end = self.epoch + Duration::from_secs(u64::from(secs - 1));
            self.second = (end - Duration::from_secs(1), end, secs);
        }
        secs
    }

    /// The latest [`Peer::last_used`] of a peer unused for `lifetime` at `now` (its
    /// last use is kept to the second, rounded up: it lives up to a second longer,
    /// never less); 0 before any can be.
    pub(super) fn last_used_expired(&self, lifetime: Duration, now: Instant) -> u32 {
        let since = now
            .checked_sub(lifetime)
            .and_then(|t| t.checked_duration_since(self.epoch));
        since.map_or(0, |d| (d.as_secs() + 1).min(u64::from(u32::MAX)) as u32)
    }

    /// `addr`'s entry and its slot, made with `make` if it has none.
    pub(super) fn entry(
        &mut self,
        addr: SocketAddr,
        make: impl FnOnce() -> Peer,
    ) -> (PeerSlot, &mut Peer) {
        let hasher = &self.hasher;
        let found = self.table.entry(
            hash_of(hasher, &addr),
            |p| p.addr == addr,
            |p| hash_of(hasher, &p.addr),
        );
        let entry = match found {
            Entry::Occupied(entry) => entry,
            Entry::Vacant(vacant) => vacant.insert(make()),
        };
        (PeerSlot::of(entry.bucket_index()), entry.into_mut())
    }

    /// Starts loading `addr`'s entry (if it has one) into the CPU's cache without
    /// waiting for it: only the table's control bytes are read, not the entry. Called
    /// for every datagram of a received batch before the first is handled, the cache
    /// misses of the batch's peers overlap instead of stalling each datagram in turn
    /// (with thousands of peers the table outgrows the cache).
    #[inline]
    pub(super) fn prefetch(&self, addr: SocketAddr) {
        if let Some(peer) = self.table.iter_hash(hash_of(&self.hasher, &addr)).next() {
            prefetch_lines(peer);
        }
    }

    /// `addr`'s entry, found at `slot` if it is still there, else by its address; made
    /// with `make` if it has none (so it is `None` never; an `Option` only to share
    /// the found-at-the-slot path with [`PeerEntries::get_at_mut`]).
    pub(super) fn entry_at(
        &mut self,
        slot: PeerSlot,
        addr: SocketAddr,
        make: impl FnOnce() -> Peer,
    ) -> Option<&mut Peer> {
        if self.holds(slot, addr) {
            return self.table.get_bucket_mut(slot.bucket());
        }
        Some(self.entry(addr, make).1)
    }

    /// `addr`'s entry, found at `slot` if it is still there, else by its address.
    pub(super) fn get_at_mut(&mut self, slot: PeerSlot, addr: SocketAddr) -> Option<&mut Peer> {
        if self.holds(slot, addr) {
            return self.table.get_bucket_mut(slot.bucket());
        }
        self.get_mut(&addr)
    }

    /// `addr`'s entry and where it is, found at `slot` if it is still there, else by
    /// its address.
    fn find_at(&mut self, slot: PeerSlot, addr: SocketAddr) -> Option<(PeerSlot, &mut Peer)> {
        if self.holds(slot, addr) {
            return Some((slot, self.table.get_bucket_mut(slot.bucket())?));
        }
        let found = self
            .table
            .find_entry(hash_of(&self.hasher, &addr), |p| p.addr == addr);
        let entry = found.ok()?;
        Some((PeerSlot::of(entry.bucket_index()), entry.into_mut()))
    }

    /// Whether `slot` holds `addr`'s entry.
    fn holds(&self, slot: PeerSlot, addr: SocketAddr) -> bool {
        self.table
            .get_bucket(slot.bucket())
            .is_some_and(|p| p.addr == addr)
    }

    /// `addr`'s entry, if it has one.
    pub(super) fn get(&self, addr: &SocketAddr) -> Option<&Peer> {
        self.table
            .find(hash_of(&self.hasher, addr), |p| p.addr == *addr)
    }

    /// `addr`'s entry, if it has one.
    pub(super) fn get_mut(&mut self, addr: &SocketAddr) -> Option<&mut Peer> {
        self.table
            .find_mut(hash_of(&self.hasher, addr), |p| p.addr == *addr)
    }

    /// Whether `addr` has an entry.
    pub(super) fn contains_key(&self, addr: &SocketAddr) -> bool {
        self.get(addr).is_some()
    }

    /// Takes `addr`'s entry out.
    pub(super) fn remove(&mut self, addr: &SocketAddr) -> Option<Peer> {
        let found = self
            .table
            .find_entry(hash_of(&self.hasher, addr), |p| p.addr == *addr);
        found.ok().map(|entry| entry.remove().0)
    }

    /// Files `peer` under its address, replacing what was there.
    pub(super) fn insert(&mut self, peer: Peer) {
        let addr = peer.addr;
        let mut peer = Some(peer);
        let (_, held) = self.entry(addr, || peer.take().expect("made once"));
        if let Some(peer) = peer {
            *held = peer;
        }
    }

    /// Keeps only the entries for which `keep` is true.
    pub(super) fn retain(&mut self, keep: impl FnMut(&mut Peer) -> bool) {
        self.table.retain(keep);
    }
}

/// Asks the CPU to load every cache line of `value` (a hint: nothing is read, and
/// where the CPU has no such hint nothing happens).
#[inline]
fn prefetch_lines<T>(value: &T) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        let start = (value as *const T).cast::<i8>();
        for offset in (0..std::mem::size_of::<T>()).step_by(64) {
            // SAFETY: a prefetch is a hint that never faults and reads nothing into
            // the program; the address lies inside `value`.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(start.add(offset)) };
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = value;
}

/// The peers' congestion states ([`crate::congestion::States`]), each in its peer's
/// entry; the entry of the peer asked for last is found again at its slot without
/// hashing. A peer without an entry has no place for congestion state (and runs on
/// throw-away state), which does not happen: every confirmable message takes its
/// message ID from its peer's entry first, and the entry lives while the message is
/// on its way.
pub(super) struct CongestionPlaces<'a> {
    peers: &'a mut PeerEntries,
    slot: PeerSlot,
}

impl States for CongestionPlaces<'_> {
    fn place(&mut self, peer: SocketAddr) -> Option<&mut Option<PeerCongestion>> {
        let (slot, p) = self.peers.find_at(self.slot, peer)?;
        self.slot = slot;
        Some(&mut p.congestion)
    }

    fn for_each_place(&mut self, mut f: impl FnMut(&mut Option<PeerCongestion>)) {
        for p in self.peers.table.iter_mut() {
            f(&mut p.congestion);
        }
    }
}

impl crate::tables::Table for PeerEntries {
    fn len(&self) -> usize {
        self.table.len()
    }
    fn capacity(&self) -> usize {
        self.table.capacity()
    }
    fn shrink_to(&mut self, min: usize) {
        let hasher = &self.hasher;
        self.table.shrink_to(min, |p| hash_of(hasher, &p.addr));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tables::Table;

    fn peer(addr: SocketAddr, next_mid: u16) -> Peer {
        Peer {
            addr,
            in_progress: InProgress::default(),
            stored: false,
            last_used: 1,
            outstanding: 0,
            mid_block_used: 0,
            next_mid,
            congestion: None,
            rare: None,
        }
    }

    fn addr(port: u16) -> SocketAddr {
        SocketAddr::from(([10, 0, 0, 1], port))
    }

    #[test]
    fn a_slot_finds_its_entry_again_and_a_stale_one_falls_back_to_the_address() {
        let mut peers = PeerEntries::new(std::time::Instant::now());
        let (slot, _) = peers.entry(addr(1), || peer(addr(1), 7));
        assert_eq!(peers.get_at_mut(slot, addr(1)).map(|p| p.next_mid), Some(7));
        // Growing the table moves entries: the old slot no longer holds peer 1.
        for port in 2..2000 {
            peers.entry(addr(port), || peer(addr(port), port));
        }
        assert_eq!(peers.get_at_mut(slot, addr(1)).map(|p| p.next_mid), Some(7));
        // A slot holding another peer's entry is not taken for this one.
        let (other, _) = peers.entry(addr(5), || unreachable!("peer 5 is filed"));
        assert_eq!(
            peers.get_at_mut(other, addr(1)).map(|p| p.next_mid),
            Some(7)
        );
        assert_eq!(
            peers.get_at_mut(other, addr(5)).map(|p| p.next_mid),
            Some(5)
        );
        // Gone is gone, whatever the slot.
        let (slot, _) = peers.entry(addr(9), || unreachable!("peer 9 is filed"));
        assert!(peers.remove(&addr(9)).is_some());
        assert!(peers.get_at_mut(slot, addr(9)).is_none());
        assert!(peers.get_at_mut(PeerSlot::UNKNOWN, addr(9)).is_none());
        assert_eq!(peers.len(), 1998);
    }

    #[test]
    fn seconds_since_the_epoch_are_rounded_up_in_any_order_of_times() {
        let epoch = Instant::now();
        let mut peers = PeerEntries::new(epoch);
        let at = |ms: u64| epoch + Duration::from_millis(ms);
        for ms in [
            0, 1, 999, 1000, 1001, 5, 2000, 1500, 2001, 999, 0, 3_600_000,
        ] {
            assert_eq!(peers.secs(at(ms)), epoch_secs(epoch, at(ms)), "{ms} ms");
        }
        assert_eq!(
            (peers.secs(at(0)), peers.secs(at(1)), peers.secs(at(1000))),
            (1, 2, 2)
        );
        assert_eq!(peers.secs(at(1001)), 3);
    }

    #[test]
    fn requests_in_progress_keep_their_whole_exchange_number_in_12_bytes() {
        let mut r = InProgress::default();
        let big = (7u64 << 32) | 0xdead_beef;
        r.push(1, big);
        r.push(2, 5);
        r.push(3, u64::MAX);
        assert_eq!(
            (r.exchange_of(1), r.exchange_of(3), r.exchange_of(4)),
            (Some(big), Some(u64::MAX), None)
        );
        r.remove(1);
        assert_eq!(r.exchanges().collect::<Vec<_>>(), [u64::MAX, 5]);
        assert_eq!(r.take_exchanges().count(), 2);
        assert!(r.is_empty());
        assert_eq!(std::mem::size_of::<HandledRequest>(), 12);
        assert!(std::mem::size_of::<InProgress>() <= 32);
    }

    #[test]
    fn prefetching_files_no_entry_and_changes_none() {
        let mut peers = PeerEntries::new(std::time::Instant::now());
        peers.prefetch(addr(1));
        assert!(peers.is_empty());
        for port in 1..100 {
            peers.entry(addr(port), || peer(addr(port), port));
        }
        for port in 1..200 {
            peers.prefetch(addr(port));
        }
        assert_eq!(peers.len(), 99);
        assert_eq!(peers.get(&addr(42)).map(|p| p.next_mid), Some(42));
        assert!(!peers.contains_key(&addr(150)));
    }

    #[test]
    fn entry_at_makes_a_missing_entry_and_insert_replaces_one() {
        let mut peers = PeerEntries::new(std::time::Instant::now());
        let made = peers.entry_at(PeerSlot::UNKNOWN, addr(1), || peer(addr(1), 3));
        assert_eq!(made.map(|p| p.next_mid), Some(3));
        peers.insert(peer(addr(1), 4));
        assert_eq!(peers.get(&addr(1)).map(|p| p.next_mid), Some(4));
        assert_eq!(peers.len(), 1);
        peers.retain(|p| p.next_mid != 4);
        assert!(!peers.contains_key(&addr(1)));
        assert!(peers.is_empty());
    }
}
