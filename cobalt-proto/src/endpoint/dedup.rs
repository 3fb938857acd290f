//! Deduplication (RFC 7252 §4.5) with memory bounded per peer and in bytes.
//!
//! The store remembers, per peer (IP address and port), only the last
//! [`DedupLimits::per_peer`] messages it handled, each for at most EXCHANGE_LIFETIME.
//! That is enough to recognise real duplicates: a peer retransmits only its outstanding
//! confirmable messages — one at a time with NSTART = 1 (§4.7) — so the copies it sends
//! again are among its last few messages. It is also what bounds the memory any one
//! peer can claim, however fast it sends. On top of that the store holds at most
//! [`DedupLimits::max_bytes`] (replies plus a fixed overhead per entry). Once three
//! quarters of that are used, a peer that stores a new message keeps only its last two,
//! so the peers that send most give way first; at the bound itself the oldest entries of
//! all peers go. A flood thus weakens deduplication for old messages instead of
//! refusing anyone.
//!
//! Requests still being handled are not stored here: the endpoint keeps them with the
//! rest of what it knows of their peer (one lookup per datagram), so that a duplicate
//! arriving meanwhile is recognised whatever the windows hold.
//!
//! Expiry and byte eviction share one queue of entries in insertion order: expiring
//! or evicting costs O(1) per entry, and records left behind by entries a peer's window
//! already dropped are compacted away once they make up a fifth of the queue.

use crate::tables::shrink_when_sparse;
use hashbrown::HashMap;
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// Bytes counted per remembered message besides its stored reply: the window slot, its
/// records in the expiry queue and its share of the hash tables.
pub const ENTRY_OVERHEAD: usize = 160;

/// Messages a peer keeps when the store is under pressure.
const PRESSURE_WINDOW: usize = 2;

/// Key of a received message: the peer and its message ID.
pub type DedupKey = (SocketAddr, u16);

/// What the endpoint remembers about a received message ID.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DedupEntry<'a> {
    /// A request whose handler has not answered yet (known to the endpoint, not
    /// stored here).
    InProgress(u64),
    /// The encoded reply (a piggybacked response) to send again on a duplicate.
    Reply(&'a [u8]),
    /// The message was acknowledged with an empty ACK; send it again.
    EmptyAck,
    /// The message was rejected with RST; send it again.
    Reset,
    /// A message whose duplicates are ignored (NON) without reply.
    Silent,
}

/// What to remember about a message once it has been handled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finished<'a> {
    /// The encoded piggybacked response.
    Reply(&'a [u8]),
    /// An empty ACK was sent.
    EmptyAck,
    /// An RST was sent.
    Reset,
    /// Nothing is sent again on a duplicate (NON).
    Silent,
    /// Nothing is remembered: a duplicate is handled as a new message (safe requests,
    /// RFC 7252 §4.5 allows re-processing idempotent ones).
    Forget,
}

/// Bounds of the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DedupLimits {
    /// How long a handled message is remembered (EXCHANGE_LIFETIME).
    pub lifetime: Duration,
    /// Messages remembered per peer (IP address and port).
    pub per_peer: usize,
    /// Bytes all remembered messages may take: replies plus [`ENTRY_OVERHEAD`] each.
    pub max_bytes: usize,
}

/// Counters of the store.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DedupStats {
    /// Entries dropped from a peer's full window before their lifetime ended.
    pub evicted_window: u64,
    /// Entries dropped (oldest first) because the store reached its byte bound.
    pub evicted_bytes: u64,
}

#[derive(Debug)]
enum Stored {
    Reply(Box<[u8]>),
    EmptyAck,
    Reset,
    Silent,
}

#[derive(Debug)]
struct Slot {
    mid: u16,
    at: Instant,
    stored: Stored,
}

impl Slot {
    fn cost(&self) -> usize {
        ENTRY_OVERHEAD
            + match &self.stored {
                Stored::Reply(b) => b.len(),
                _ => 0,
            }
    }

    fn entry(&self) -> DedupEntry<'_> {
        match &self.stored {
            Stored::Reply(b) => DedupEntry::Reply(b),
            Stored::EmptyAck => DedupEntry::EmptyAck,
            Stored::Reset => DedupEntry::Reset,
            Stored::Silent => DedupEntry::Silent,
        }
    }
}

/// The store. See the [module documentation](self).
#[derive(Debug)]
pub struct DedupStore {
    limits: DedupLimits,
    windows: HashMap<SocketAddr, VecDeque<Slot>>,
    /// Every stored entry in insertion order (plus stale records of dropped ones).
    order: VecDeque<(Instant, SocketAddr, u16)>,
    live: usize,
    bytes: usize,
    stats: DedupStats,
}

impl DedupStore {
    /// An empty store.
    pub fn new(limits: DedupLimits) -> DedupStore {
        DedupStore {
            limits,
            windows: HashMap::new(),
            order: VecDeque::new(),
            live: 0,
            bytes: 0,
            stats: DedupStats::default(),
        }
    }

    /// The entry for a key, if still remembered at `now`.
    pub fn get(&self, now: Instant, key: &DedupKey) -> Option<DedupEntry<'_>> {
        self.windows
            .get(&key.0)?
            .iter()
            .find(|s| s.mid == key.1 && now < s.at + self.limits.lifetime)
            .map(Slot::entry)
    }

    /// Records how a message was handled.
    pub fn finish(&mut self, now: Instant, key: DedupKey, how: Finished<'_>) {
        let stored = match how {
            Finished::Forget => return,
            Finished::Reply(b) => Stored::Reply(b.into()),
            Finished::EmptyAck => Stored::EmptyAck,
            Finished::Reset => Stored::Reset,
            Finished::Silent => Stored::Silent,
        };
        let slot = Slot {
            mid: key.1,
            at: now,
            stored,
        };
        let cost = slot.cost();
        // Under pressure (three quarters of the bytes used) a peer that stores a new
        // message keeps only its last two: the peers that store most often give way
        // first, and a peer with a message or two outstanding keeps them.
        let keep = if self.bytes >= self.limits.max_bytes / 4 * 3 {
            PRESSURE_WINDOW.min(self.limits.per_peer)
        } else {
            self.limits.per_peer
        }
        .max(1);
        // Room for the window and no more (a deque that grows from empty takes room
        // for four): a client observing 10,000 servers keeps one window for each.
        let window = self
            .windows
            .entry(key.0)
            .or_insert_with(|| VecDeque::with_capacity(keep));
        if let Some(pos) = window.iter().position(|s| s.mid == key.1) {
            let old = window.remove(pos).map_or(0, |s| s.cost());
            self.bytes -= old;
            self.live -= 1;
        }
        while window.len() >= keep {
            let Some(old) = window.pop_front() else {
                break;
            };
            self.bytes -= old.cost();
            self.live -= 1;
            self.stats.evicted_window += 1;
        }
        window.push_back(slot);
        self.order.push_back((now, key.0, key.1));
        self.live += 1;
        self.bytes += cost;
        while self.bytes > self.limits.max_bytes && self.drop_oldest() {
            self.stats.evicted_bytes += 1;
        }
        // A peer that keeps sending leaves a stale record behind with each new one
        // (its window drops its oldest): compact at a quarter of stale records, so
        // that the queue takes some 1.25 records per entry, not 2.
        if self.order.len() > self.live + self.live / 4 + 64 {
            self.compact();
        }
    }

    /// Drops the entries whose lifetime has ended and gives memory back when the
    /// tables have emptied.
    pub fn expire(&mut self, now: Instant) {
        while let Some(&(at, _, _)) = self.order.front() {
            if now < at + self.limits.lifetime {
                break;
            }
            self.drop_oldest();
        }
        shrink_when_sparse(&mut self.windows);
        shrink_when_sparse(&mut self.order);
    }

    /// Removes the oldest record's entry if it is still live; false when the queue is empty.
    fn drop_oldest(&mut self) -> bool {
        let Some((at, peer, mid)) = self.order.pop_front() else {
            return false;
        };
        if let Some(window) = self.windows.get_mut(&peer) {
            if let Some(pos) = window.iter().position(|s| s.mid == mid && s.at == at) {
                if let Some(slot) = window.remove(pos) {
                    self.bytes -= slot.cost();
                    self.live -= 1;
                }
            }
            if window.is_empty() {
                self.windows.remove(&peer);
            }
        }
        true
    }

    /// Drops the queue's records of entries that are no longer stored.
    fn compact(&mut self) {
        let windows = &self.windows;
        self.order.retain(|(at, peer, mid)| {
            windows
                .get(peer)
                .is_some_and(|w| w.iter().any(|s| s.mid == *mid && s.at == *at))
        });
    }

    /// Forgets what is remembered of `peer`.
    pub fn forget(&mut self, peer: SocketAddr) {
        if let Some(window) = self.windows.remove(&peer) {
            self.live -= window.len();
            self.bytes -= window.iter().map(Slot::cost).sum::<usize>();
        }
        // The queue's records of its entries are stale now (`drop_oldest` and
        // `compact` skip records whose entry is gone).
    }

    /// What is remembered of `from` is remembered of `to` from now on (a peer whose
    /// address changed: a DTLS session moved by its Connection ID); what `to` had is
    /// forgotten (another peer's, whose messages IDs mean nothing to this one).
    pub fn move_peer(&mut self, from: SocketAddr, to: SocketAddr) {
        if from == to {
            return;
        }
        self.forget(to);
        let Some(window) = self.windows.remove(&from) else {
            return;
        };
        // The queue's records of `from` are stale now; records for `to` go to its
        // back (expiry order only decides when memory comes back: `get` checks each
        // entry's own time).
        self.order.extend(window.iter().map(|s| (s.at, to, s.mid)));
        self.windows.insert(to, window);
        if self.order.len() > self.live + self.live / 4 + 64 {
            self.compact();
        }
    }

    /// Remembered messages.
    pub fn len(&self) -> usize {
        self.live
    }

    /// True when nothing is remembered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes counted against [`DedupLimits::max_bytes`].
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Peers with remembered messages.
    pub fn peers(&self) -> usize {
        self.windows.len()
    }

    /// When the oldest entry expires, if any is stored.
    pub fn next_expiry(&self) -> Option<Instant> {
        self.order
            .front()
            .map(|(at, _, _)| *at + self.limits.lifetime)
    }

    /// Eviction counters.
    pub fn stats(&self) -> DedupStats {
        self.stats
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(per_peer: usize, max_bytes: usize) -> DedupLimits {
        DedupLimits {
            lifetime: Duration::from_secs(30),
            per_peer,
            max_bytes,
        }
    }

    fn key(s: &str, mid: u16) -> DedupKey {
        (s.parse().unwrap(), mid)
    }

    #[test]
    fn entries_live_the_lifetime_and_then_go() {
        let t0 = Instant::now();
        let mut d = DedupStore::new(limits(8, 1 << 20));
        let k = key("127.0.0.1:1", 7);
        d.finish(t0, k, Finished::Reply(b"abc"));
        let life = Duration::from_secs(30);
        assert_eq!(
            d.get(t0 + life - Duration::from_millis(1), &k),
            Some(DedupEntry::Reply(b"abc"))
        );
        assert_eq!(d.get(t0 + life, &k), None, "not after the lifetime");
        assert_eq!(d.next_expiry(), Some(t0 + life));
        d.expire(t0 + life);
        assert!(d.is_empty());
        assert_eq!((d.bytes(), d.peers()), (0, 0));
    }

    #[test]
    fn finished_messages_are_remembered_and_forgotten_ones_are_not() {
        let t0 = Instant::now();
        let mut d = DedupStore::new(limits(8, 1 << 20));
        let (a, b) = (key("10.0.0.1:1", 1), key("10.0.0.1:1", 2));
        d.finish(t0, a, Finished::EmptyAck);
        d.finish(t0, b, Finished::Forget);
        assert_eq!(d.get(t0, &a), Some(DedupEntry::EmptyAck));
        assert_eq!(d.get(t0, &b), None, "a safe request is not remembered");
        assert_eq!(d.len(), 1);
    }

    #[test]
    fn a_peer_keeps_only_its_last_messages_and_others_are_unaffected() {
        let t0 = Instant::now();
        let mut d = DedupStore::new(limits(4, 1 << 20));
        d.finish(t0, key("10.0.0.2:9", 1), Finished::Silent);
        for mid in 0..1000u16 {
            d.finish(t0, key("10.0.0.1:5", mid), Finished::Reply(&[1; 20]));
        }
        assert_eq!(d.len(), 5, "four of the flooder's, one of the other peer's");
        assert_eq!(d.get(t0, &key("10.0.0.1:5", 995)), None);
        assert!(d.get(t0, &key("10.0.0.1:5", 996)).is_some());
        assert_eq!(d.get(t0, &key("10.0.0.2:9", 1)), Some(DedupEntry::Silent));
        assert_eq!(d.stats().evicted_window, 996);
        assert!(d.order.len() <= d.live + d.live / 4 + 64, "queue compacted");
        assert_eq!(d.bytes(), 5 * ENTRY_OVERHEAD + 4 * 20);
    }

    /// A client observing many servers keeps a window for each: the window takes
    /// room for its bound and no more, and a steady sender leaves few stale records.
    #[test]
    fn windows_and_the_queue_take_room_for_what_they_keep() {
        let t0 = Instant::now();
        let mut d = DedupStore::new(limits(2, 1 << 20));
        for mid in 0..100u16 {
            for peer in 0..100u16 {
                let peer = format!("10.0.{}.{}:5683", peer / 256, peer % 256);
                d.finish(t0, key(&peer, mid), Finished::EmptyAck);
            }
        }
        assert_eq!(d.len(), 200);
        assert!(d.windows.values().all(|w| w.capacity() == 2));
        assert!(d.order.len() <= 200 + 50 + 64, "{}", d.order.len());
    }

    #[test]
    fn the_byte_bound_drops_the_oldest_entries_first() {
        let t0 = Instant::now();
        let max = 10 * (ENTRY_OVERHEAD + 100);
        let mut d = DedupStore::new(limits(8, max));
        for i in 0..100u16 {
            let peer = format!("10.0.{}.{}:7", i / 200, i % 200 + 1);
            let t = t0 + Duration::from_millis(u64::from(i));
            d.finish(t, key(&peer, 1), Finished::Reply(&[0; 100]));
            assert!(d.bytes() <= max);
        }
        assert_eq!(d.len(), 10);
        assert!(d.get(t0, &key("10.0.0.90:7", 1)).is_none());
        assert!(d.get(t0, &key("10.0.0.91:7", 1)).is_some());
        assert_eq!(d.stats().evicted_bytes, 90);
        assert_eq!(d.peers(), 10);
    }

    #[test]
    fn storing_the_same_message_again_replaces_it() {
        let t0 = Instant::now();
        let mut d = DedupStore::new(limits(8, 1 << 20));
        let k = key("[::1]:1", 3);
        d.finish(t0, k, Finished::EmptyAck);
        d.finish(t0, k, Finished::Reply(b"late"));
        assert_eq!(d.get(t0, &k), Some(DedupEntry::Reply(b"late")));
        assert_eq!(d.len(), 1);
        assert_eq!(d.bytes(), ENTRY_OVERHEAD + 4);
        d.expire(t0 + Duration::from_secs(30));
        assert!(d.is_empty());
        assert_eq!(d.bytes(), 0);
    }

    #[test]
    fn same_mid_from_different_ports_are_different_entries() {
        let t0 = Instant::now();
        let mut d = DedupStore::new(limits(8, 1 << 20));
        d.finish(t0, key("10.0.0.1:1000", 5), Finished::Reply(b"a"));
        d.finish(t0, key("10.0.0.1:1001", 5), Finished::Reply(b"b"));
        assert_eq!(
            d.get(t0, &key("10.0.0.1:1000", 5)),
            Some(DedupEntry::Reply(b"a"))
        );
        assert_eq!(
            d.get(t0, &key("10.0.0.1:1001", 5)),
            Some(DedupEntry::Reply(b"b"))
        );
        assert_eq!(d.get(t0, &key("10.0.0.2:1000", 5)), None);
    }
}
