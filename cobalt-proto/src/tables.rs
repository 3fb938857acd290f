//! Tables that give their memory back: a hash map (or a vector) keeps the capacity of its
//! largest size, so after a flood of observers or uploads the memory would stay taken.
//! [`shrink_when_sparse`], called after removals, shrinks a map once it is used to less
//! than a quarter of its capacity, to twice its size (so the cost of rehashing stays
//! proportional to the removals that made it worth it).

use std::collections::HashMap;
use std::hash::{BuildHasher, Hash};

/// Capacities up to this are kept whatever the use.
const KEEP: usize = 64;

/// A table whose capacity can be given back: the standard library's map and
/// hashbrown's (the per-peer tables on the datagram path use the latter's faster
/// default hasher), and a vector.
pub trait Table {
    /// Entries held.
    fn len(&self) -> usize;
    /// Whether it holds nothing.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Entries it can hold without growing.
    fn capacity(&self) -> usize;
    /// Shrinks the capacity to at least `min` (and at least the length).
    fn shrink_to(&mut self, min: usize);
}

impl<K: Eq + Hash, V, S: BuildHasher> Table for HashMap<K, V, S> {
    fn len(&self) -> usize {
        HashMap::len(self)
    }
    fn capacity(&self) -> usize {
        HashMap::capacity(self)
    }
    fn shrink_to(&mut self, min: usize) {
        HashMap::shrink_to(self, min)
    }
}

impl<K: Eq + Hash, V, S: BuildHasher> Table for hashbrown::HashMap<K, V, S> {
    fn len(&self) -> usize {
        hashbrown::HashMap::len(self)
    }
    fn capacity(&self) -> usize {
        hashbrown::HashMap::capacity(self)
    }
    fn shrink_to(&mut self, min: usize) {
        hashbrown::HashMap::shrink_to(self, min)
    }
}

/// Shrinks `map` to twice its length when it uses less than a quarter of its capacity
/// (and holds more than a few entries' worth).
pub fn shrink_when_sparse(map: &mut impl Table) {
    let cap = map.capacity();
    if cap > KEEP && map.len() * 4 < cap {
        map.shrink_to((map.len() * 2).max(KEEP / 2));
    }
}

impl<T> Table for Vec<T> {
    fn len(&self) -> usize {
        Vec::len(self)
    }
    fn capacity(&self) -> usize {
        Vec::capacity(self)
    }
    fn shrink_to(&mut self, min: usize) {
        Vec::shrink_to(self, min)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_map_emptied_after_a_flood_gives_its_capacity_back() {
        let mut m: HashMap<u32, [u8; 64]> = HashMap::new();
        for i in 0..100_000 {
            m.insert(i, [0; 64]);
        }
        let peak = m.capacity();
        for i in 0..100_000 {
            m.remove(&i);
            shrink_when_sparse(&mut m);
        }
        assert!(peak >= 100_000);
        assert!(
            m.capacity() <= KEEP,
            "capacity {} after emptying",
            m.capacity()
        );
        // Small maps are left alone.
        let mut small: HashMap<u32, u32> = (0..10).map(|i| (i, i)).collect();
        let cap = small.capacity();
        small.clear();
        shrink_when_sparse(&mut small);
        assert_eq!(small.capacity(), cap);
    }
}
