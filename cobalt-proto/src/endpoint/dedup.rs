//! Deduplication store (RFC 7252 §4.5): compact entries, O(1) expiry by generation
//! rotation, and a cap.
//!
//! Finished entries go into the newest of a fixed number of generations; every
//! `lifetime / (GENERATIONS - 1)` the oldest generation is dropped whole. An entry thus
//! lives at least `lifetime` and at most `lifetime × GENERATIONS / (GENERATIONS - 1)`,
//! and expiry costs nothing per entry.
//!
//! Memory per entry is kept small: an IPv4 peer and MID pack into one `u64` key, the
//! value is a `u32` offset into the generation's byte arena, where the reply to resend
//! is stored with a two-byte length. About 12 bytes of key and value plus the reply
//! itself (≈ 30 bytes for a small piggybacked response). Requests still being handled
//! live in a separate small map, since there are few of them at any time.

use hashbrown::HashMap;
use hashbrown::{DefaultHashBuilder, HashTable};
use std::hash::BuildHasher;
use std::net::{SocketAddr, SocketAddrV6};
use std::time::{Duration, Instant};

const GENERATIONS: usize = 4;
/// Value marking an entry without a reply to resend (NON, or reply dropped).
const SILENT: u32 = u32::MAX;

/// What the endpoint remembers about a received message ID.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DedupEntry<'a> {
    /// A request whose handler has not answered yet.
    InProgress(u64),
    /// The encoded reply (piggybacked response, RST or empty ACK) to send again on a duplicate.
    Reply(&'a [u8]),
    /// A message whose duplicates are ignored (NON) without reply.
    Silent,
}

/// Key of a received message: the peer and its message ID.
pub type DedupKey = (SocketAddr, u16);

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Compact {
    V4(u64),
    V6(SocketAddrV6, u16),
}

fn compact(key: &DedupKey) -> Compact {
    match key.0 {
        SocketAddr::V4(a) => Compact::V4(
            (u64::from(u32::from(*a.ip())) << 32) | (u64::from(a.port()) << 16) | u64::from(key.1),
        ),
        SocketAddr::V6(a) => Compact::V6(a, key.1),
    }
}

/// One generation. IPv4 entries live in a raw hash table probed with a hash computed
/// once per lookup for all generations (the hasher is randomly seeded per store, so
/// peers cannot aim at collisions); IPv6 entries in an ordinary map.
#[derive(Debug, Default)]
struct Generation {
    v4: HashTable<(u64, u32)>,
    v6: HashMap<(SocketAddrV6, u16), u32>,
    arena: Vec<u8>,
}

impl Generation {
    fn get(&self, k: &Compact, hash: u64) -> Option<u32> {
        match k {
            Compact::V4(x) => self.v4.find(hash, |e| e.0 == *x).map(|e| e.1),
            Compact::V6(a, m) => self.v6.get(&(*a, *m)).copied(),
        }
    }

    fn slot(&mut self, k: &Compact, hash: u64) -> Option<&mut u32> {
        match k {
            Compact::V4(x) => self.v4.find_mut(hash, |e| e.0 == *x).map(|e| &mut e.1),
            Compact::V6(a, m) => self.v6.get_mut(&(*a, *m)),
        }
    }

    fn put(&mut self, k: Compact, v: u32, hash: u64, hasher: &DefaultHashBuilder) {
        match k {
            Compact::V4(x) => match self.v4.find_mut(hash, |e| e.0 == x) {
                Some(e) => e.1 = v,
                None => {
                    self.v4
                        .insert_unique(hash, (x, v), |e| hasher.hash_one(e.0));
                }
            },
            Compact::V6(a, m) => {
                self.v6.insert((a, m), v);
            }
        }
    }

    /// Stores reply bytes; `SILENT` if they do not fit the 64 KiB length prefix.
    fn store(&mut self, bytes: &[u8]) -> u32 {
        let (Ok(len), Ok(at)) = (u16::try_from(bytes.len()), u32::try_from(self.arena.len()))
        else {
            return SILENT;
        };
        if at == SILENT {
            return SILENT;
        }
        self.arena.extend_from_slice(&len.to_le_bytes());
        self.arena.extend_from_slice(bytes);
        at
    }

    fn reply(&self, at: u32) -> Option<&[u8]> {
        let at = at as usize;
        let len = u16::from_le_bytes([*self.arena.get(at)?, *self.arena.get(at + 1)?]) as usize;
        self.arena.get(at + 2..at + 2 + len)
    }

    fn len(&self) -> usize {
        self.v4.len() + self.v6.len()
    }

    fn value<'a>(&'a self, v: u32) -> DedupEntry<'a> {
        match v {
            SILENT => DedupEntry::Silent,
            at => self.reply(at).map_or(DedupEntry::Silent, DedupEntry::Reply),
        }
    }
}

/// The store.
#[derive(Debug)]
pub struct DedupStore {
    hasher: DefaultHashBuilder,
    in_progress: HashMap<DedupKey, u64>,
    gens: Vec<Generation>,
    rotate_every: Duration,
    next_rotation: Instant,
    cap: usize,
}

impl DedupStore {
    /// A store whose entries live at least `lifetime`, holding at most `cap` entries.
    pub fn new(now: Instant, lifetime: Duration, cap: usize) -> DedupStore {
        let rotate_every = (lifetime / (GENERATIONS as u32 - 1)).max(Duration::from_millis(1));
        DedupStore {
            hasher: DefaultHashBuilder::default(),
            in_progress: HashMap::new(),
            gens: (0..GENERATIONS).map(|_| Generation::default()).collect(),
            rotate_every,
            next_rotation: now + rotate_every,
            cap,
        }
    }

    /// The entry for a key, if still remembered.
    pub fn get(&self, key: &DedupKey) -> Option<DedupEntry<'_>> {
        if let Some(id) = self.in_progress.get(key) {
            return Some(DedupEntry::InProgress(*id));
        }
        let k = compact(key);
        let h = self.hash(&k);
        self.gens
            .iter()
            .find_map(|g| g.get(&k, h).map(|v| g.value(v)))
    }

    fn hash(&self, k: &Compact) -> u64 {
        match k {
            Compact::V4(x) => self.hasher.hash_one(x),
            Compact::V6(..) => 0, // the IPv6 map hashes on its own
        }
    }

    /// Replaces the entry of a key where it is stored; returns false if absent.
    pub fn update(&mut self, key: &DedupKey, entry: DedupEntry<'_>) -> bool {
        if self.in_progress.remove(key).is_some() {
            self.insert(*key, entry);
            return true;
        }
        let k = compact(key);
        let h = self.hash(&k);
        for g in &mut self.gens {
            if g.get(&k, h).is_some() {
                let v = match entry {
                    DedupEntry::Reply(bytes) => g.store(bytes),
                    DedupEntry::Silent => SILENT,
                    DedupEntry::InProgress(id) => {
                        if let Some(slot) = g.slot(&k, h) {
                            *slot = SILENT;
                        }
                        self.in_progress.insert(*key, id);
                        return true;
                    }
                };
                if let Some(slot) = g.slot(&k, h) {
                    *slot = v;
                }
                return true;
            }
        }
        false
    }

    /// True when no new entry may be inserted.
    pub fn is_full(&self) -> bool {
        self.len() >= self.cap
    }

    /// Inserts a new entry (finished ones into the newest generation).
    pub fn insert(&mut self, key: DedupKey, entry: DedupEntry<'_>) {
        let k = compact(&key);
        let h = self.hash(&k);
        let newest = &mut self.gens[0];
        match entry {
            DedupEntry::InProgress(id) => {
                self.in_progress.insert(key, id);
            }
            DedupEntry::Reply(bytes) => {
                let v = newest.store(bytes);
                newest.put(k, v, h, &self.hasher);
            }
            DedupEntry::Silent => newest.put(k, SILENT, h, &self.hasher),
        }
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.in_progress.len() + self.gens.iter().map(Generation::len).sum::<usize>()
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes held by reply arenas (for metrics).
    pub fn arena_bytes(&self) -> usize {
        self.gens.iter().map(|g| g.arena.len()).sum()
    }

    /// When the next rotation is due.
    pub fn next_rotation(&self) -> Instant {
        self.next_rotation
    }

    /// Drops expired generations; call when `next_rotation` has passed.
    /// Requests still in progress are not affected.
    pub fn rotate(&mut self, now: Instant) {
        if self.gens.iter().all(|g| g.len() == 0) {
            self.next_rotation = now + self.rotate_every;
            return;
        }
        while now >= self.next_rotation {
            self.gens.pop();
            self.gens.insert(0, Generation::default());
            self.next_rotation += self.rotate_every;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_live_at_least_the_lifetime_and_then_go() {
        let t0 = Instant::now();
        let life = Duration::from_secs(30);
        let mut d = DedupStore::new(t0, life, 10);
        let key = ("127.0.0.1:1".parse().unwrap(), 7);
        d.insert(key, DedupEntry::Silent);
        let mut t = t0;
        while t < t0 + life {
            d.rotate(t);
            assert!(d.get(&key).is_some(), "expired early at {:?}", t - t0);
            t += Duration::from_millis(500);
        }
        d.rotate(t0 + life + life / 2 + Duration::from_secs(1));
        assert!(d.get(&key).is_none());
        assert!(d.is_empty());
    }

    #[test]
    fn cap_update_and_both_families() {
        let t0 = Instant::now();
        let mut d = DedupStore::new(t0, Duration::from_secs(1), 3);
        let a = ("127.0.0.1:1".parse().unwrap(), 1);
        let b = ("127.0.0.1:1".parse().unwrap(), 2);
        let c = ("[::1]:1".parse().unwrap(), 1);
        d.insert(a, DedupEntry::InProgress(1));
        d.insert(b, DedupEntry::Silent);
        assert!(!d.is_full());
        d.insert(c, DedupEntry::Reply(b"v6"));
        assert!(d.is_full());
        assert_eq!(d.get(&a), Some(DedupEntry::InProgress(1)));
        assert!(d.update(&a, DedupEntry::Reply(&[1, 2, 3])));
        assert_eq!(d.get(&a), Some(DedupEntry::Reply(&[1, 2, 3])));
        assert!(d.update(&a, DedupEntry::Silent));
        assert_eq!(d.get(&a), Some(DedupEntry::Silent));
        assert_eq!(d.get(&c), Some(DedupEntry::Reply(&b"v6"[..])));
        assert_eq!(d.get(&b), Some(DedupEntry::Silent));
        assert!(!d.update(&("127.0.0.1:2".parse().unwrap(), 1), DedupEntry::Silent));
        assert_eq!(d.len(), 3);
    }

    #[test]
    fn same_mid_from_different_ports_are_different_entries() {
        let t0 = Instant::now();
        let mut d = DedupStore::new(t0, Duration::from_secs(1), 10);
        d.insert(
            ("10.0.0.1:1000".parse().unwrap(), 5),
            DedupEntry::Reply(b"a"),
        );
        d.insert(
            ("10.0.0.1:1001".parse().unwrap(), 5),
            DedupEntry::Reply(b"b"),
        );
        assert_eq!(
            d.get(&("10.0.0.1:1000".parse().unwrap(), 5)),
            Some(DedupEntry::Reply(&b"a"[..]))
        );
        assert_eq!(
            d.get(&("10.0.0.1:1001".parse().unwrap(), 5)),
            Some(DedupEntry::Reply(&b"b"[..]))
        );
        assert_eq!(d.get(&("10.0.0.2:1000".parse().unwrap(), 5)), None);
    }
}
