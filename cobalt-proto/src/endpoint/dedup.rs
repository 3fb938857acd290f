//! Deduplication store (RFC 7252 §4.5) with O(1) expiry by generation rotation.
//!
//! Entries go into the newest of a fixed number of generations; every
//! `lifetime / (GENERATIONS - 1)` the oldest generation is dropped whole. An entry thus
//! lives at least `lifetime` and at most `lifetime × GENERATIONS / (GENERATIONS - 1)`,
//! and expiry costs nothing per entry.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

const GENERATIONS: usize = 4;

/// What the endpoint remembers about a received message ID.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DedupEntry {
    /// A request whose handler has not answered yet.
    InProgress(u64),
    /// The encoded reply (piggybacked response, RST or empty ACK) to send again on a duplicate.
    Reply(Box<[u8]>),
    /// A message whose duplicates are ignored (NON) without reply.
    Silent,
}

/// Key of a received message: the peer and its message ID.
pub type DedupKey = (SocketAddr, u16);

/// The store.
#[derive(Debug)]
pub struct DedupStore {
    gens: Vec<HashMap<DedupKey, DedupEntry>>,
    rotate_every: Duration,
    next_rotation: Instant,
    cap: usize,
}

impl DedupStore {
    /// A store whose entries live at least `lifetime`, holding at most `cap` entries.
    pub fn new(now: Instant, lifetime: Duration, cap: usize) -> DedupStore {
        let rotate_every = (lifetime / (GENERATIONS as u32 - 1)).max(Duration::from_millis(1));
        DedupStore {
            gens: (0..GENERATIONS).map(|_| HashMap::new()).collect(),
            rotate_every,
            next_rotation: now + rotate_every,
            cap,
        }
    }

    /// The entry for a key, if still remembered.
    pub fn get(&self, key: &DedupKey) -> Option<&DedupEntry> {
        self.gens.iter().find_map(|g| g.get(key))
    }

    /// Replaces the entry of a key where it is stored; returns false if absent.
    pub fn update(&mut self, key: &DedupKey, entry: DedupEntry) -> bool {
        for g in &mut self.gens {
            if let Some(e) = g.get_mut(key) {
                *e = entry;
                return true;
            }
        }
        false
    }

    /// True when no new entry may be inserted.
    pub fn is_full(&self) -> bool {
        self.len() >= self.cap
    }

    /// Inserts a new entry into the newest generation.
    pub fn insert(&mut self, key: DedupKey, entry: DedupEntry) {
        self.gens[0].insert(key, entry);
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.gens.iter().map(HashMap::len).sum()
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.gens.iter().all(HashMap::is_empty)
    }

    /// When the next rotation is due.
    pub fn next_rotation(&self) -> Instant {
        self.next_rotation
    }

    /// Drops expired generations; call when `next_rotation` has passed.
    pub fn rotate(&mut self, now: Instant) {
        if self.is_empty() {
            self.next_rotation = now + self.rotate_every;
            return;
        }
        while now >= self.next_rotation {
            let mut oldest = self.gens.pop().unwrap_or_default();
            oldest.clear();
            if self.gens.iter().all(HashMap::is_empty) {
                // Nothing left anywhere: release the memory of the recycled map too.
                oldest = HashMap::new();
            }
            self.gens.insert(0, oldest);
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
    fn cap_and_update() {
        let t0 = Instant::now();
        let mut d = DedupStore::new(t0, Duration::from_secs(1), 2);
        let a = ("127.0.0.1:1".parse().unwrap(), 1);
        let b = ("127.0.0.1:1".parse().unwrap(), 2);
        d.insert(a, DedupEntry::InProgress(1));
        assert!(!d.is_full());
        d.insert(b, DedupEntry::Silent);
        assert!(d.is_full());
        assert!(d.update(&a, DedupEntry::Reply(vec![1].into())));
        assert_eq!(d.get(&a), Some(&DedupEntry::Reply(vec![1].into())));
    }
}
