//! Tables that give their memory back: a hash map (or a vector) keeps the capacity of its
//! largest size, so after a flood of observers or uploads the memory would stay taken.
//! [`shrink_when_sparse`], called after removals, shrinks a map once it is used to less
//! than a quarter of its capacity, to twice its size (so the cost of rehashing stays
//! proportional to the removals that made it worth it).

use std::collections::HashMap;
use std::hash::{BuildHasher, Hash};

/// Capacities up to this are kept whatever the use.
pub(crate) const KEEP: usize = 64;

/// A table whose capacity can be given back: the standard library's map and
/// hashbrown's (the per-peer tables on the datagram path use the latter's faster
/// default hasher), vectors, queues and heaps.
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

impl<T> Table for std::collections::VecDeque<T> {
    fn len(&self) -> usize {
        std::collections::VecDeque::len(self)
    }
    fn capacity(&self) -> usize {
        std::collections::VecDeque::capacity(self)
    }
    fn shrink_to(&mut self, min: usize) {
        std::collections::VecDeque::shrink_to(self, min)
    }
}

impl<T: Ord> Table for std::collections::BinaryHeap<T> {
    fn len(&self) -> usize {
        std::collections::BinaryHeap::len(self)
    }
    fn capacity(&self) -> usize {
        std::collections::BinaryHeap::capacity(self)
    }
    fn shrink_to(&mut self, min: usize) {
        std::collections::BinaryHeap::shrink_to(self, min)
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

/// A vector that grows in chunks of `CHUNK` elements and gives each chunk back as it
/// empties: growing never copies what it holds or needs twice its memory for a moment
/// (a `Vec` of a million large elements reallocates 150 MB to grow, and the allocator
/// keeps much of the old block for a while), and a shrinking one holds at most one
/// spare chunk beyond its length, none once empty. Removal is by swapping with the
/// last element.
#[derive(Debug)]
pub struct ChunkedVec<T, const CHUNK: usize> {
    chunks: Vec<Vec<T>>,
    len: usize,
    /// An emptied chunk kept for the next push (no churn at a chunk's boundary).
    spare: Option<Vec<T>>,
}

impl<T, const CHUNK: usize> Default for ChunkedVec<T, CHUNK> {
    fn default() -> Self {
        ChunkedVec {
            chunks: Vec::new(),
            len: 0,
            spare: None,
        }
    }
}

impl<T, const CHUNK: usize> ChunkedVec<T, CHUNK> {
    /// Elements held.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds nothing.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Elements it can hold without allocating (its chunks and the spare one).
    pub fn capacity(&self) -> usize {
        (self.chunks.len() + usize::from(self.spare.is_some())) * CHUNK
    }

    /// Appends `value` at index `len()`.
    pub fn push(&mut self, value: T) {
        match self.chunks.last_mut() {
            Some(last) if last.len() < CHUNK => last.push(value),
            _ => {
                let mut chunk = self
                    .spare
                    .take()
                    .unwrap_or_else(|| Vec::with_capacity(CHUNK));
                chunk.push(value);
                self.chunks.push(chunk);
            }
        }
        self.len += 1;
    }

    /// Removes the element at `index` and puts the last one in its place.
    ///
    /// # Panics
    /// If `index` is out of bounds, as `Vec::swap_remove` does.
    pub fn swap_remove(&mut self, index: usize) -> T {
        assert!(
            index < self.len,
            "swap_remove index {index} of {}",
            self.len
        );
        let Some(mut last) = self.chunks.last_mut().and_then(Vec::pop) else {
            unreachable!("a non-empty ChunkedVec has a non-empty last chunk");
        };
        self.len -= 1;
        if index < self.len {
            std::mem::swap(&mut self[index], &mut last);
        }
        if self.chunks.last().is_some_and(Vec::is_empty) {
            // Emptied: nothing is kept at all.
            self.spare = self.chunks.pop().filter(|_| self.len > 0);
        }
        last
    }
}

impl<T, const CHUNK: usize> std::ops::Index<usize> for ChunkedVec<T, CHUNK> {
    type Output = T;
    fn index(&self, index: usize) -> &T {
        &self.chunks[index / CHUNK][index % CHUNK]
    }
}

impl<T, const CHUNK: usize> std::ops::IndexMut<usize> for ChunkedVec<T, CHUNK> {
    fn index_mut(&mut self, index: usize) -> &mut T {
        &mut self.chunks[index / CHUNK][index % CHUNK]
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

    #[test]
    fn a_chunked_vec_swaps_removals_and_gives_chunks_back() {
        let mut v: ChunkedVec<u32, 4> = ChunkedVec::default();
        for i in 0..10 {
            v.push(i);
        }
        assert_eq!((v.len(), v.capacity()), (10, 12));
        assert_eq!(v[9], 9);
        assert_eq!(v.swap_remove(2), 2);
        assert_eq!(v[2], 9, "the last moved into the hole");
        assert_eq!(v.swap_remove(8), 8, "removing the last moves nothing");
        assert_eq!(v.len(), 8);
        // The third chunk emptied: it is the spare, reused by the next push.
        assert_eq!(v.capacity(), 12);
        v.push(100);
        assert_eq!((v[8], v.capacity()), (100, 12));
        while !v.is_empty() {
            v.swap_remove(0);
        }
        assert_eq!(v.capacity(), 0, "an empty one keeps nothing");
    }
}
