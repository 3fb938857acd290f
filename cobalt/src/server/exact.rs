//! Static paths by their whole sequence of segments: a request whose Uri-Path is
//! exactly a static route's (the common case) is found with one hash of its segments
//! and one comparison, instead of a walk down the resource tree comparing strings at
//! each level. Segments are compared as bytes (a request's need not be UTF-8 to be
//! looked up; one that is not matches no route's).

use hashbrown::HashTable;

/// One static path and what is kept for it.
#[derive(Debug, Clone)]
struct Entry<T> {
    segments: Box<[Box<str>]>,
    value: T,
}

/// A `T` for each static path (its segments, none for the root).
///
/// Only the routes put paths in; a request only looks one up. So the hash need not
/// resist chosen inputs: paths that collide cost a comparison with each route among
/// them, at worst with every static route, never more. It is made of each segment's
/// length and first and last eight bytes.
#[derive(Debug, Clone)]
pub(crate) struct ExactPaths<T> {
    table: HashTable<Entry<T>>,
}

impl<T> Default for ExactPaths<T> {
    fn default() -> Self {
        ExactPaths {
            table: HashTable::new(),
        }
    }
}

impl<T> ExactPaths<T> {
    /// Forgets every path.
    pub(crate) fn clear(&mut self) {
        self.table.clear();
    }

    /// Keeps `value` for the path `segments`, replacing what was kept for it.
    pub(crate) fn insert(&mut self, segments: Vec<Box<str>>, value: T) {
        let hash = hash_segments(segments.iter().map(|s| s.as_bytes()));
        let rehash = |e: &Entry<T>| hash_segments(e.segments.iter().map(|s| s.as_bytes()));
        let found = self.table.find_mut(hash, |e| *e.segments == *segments);
        match found {
            Some(e) => e.value = value,
            None => {
                let segments = segments.into_boxed_slice();
                self.table
                    .insert_unique(hash, Entry { segments, value }, rehash);
            }
        }
    }

    /// What is kept for the path `segments`.
    #[inline]
    pub(crate) fn get(&self, segments: &[&[u8]]) -> Option<&T> {
        if self.table.is_empty() {
            return None;
        }
        let hash = hash_segments(segments.iter().copied());
        let same = |e: &Entry<T>| {
            e.segments.len() == segments.len()
                && e.segments
                    .iter()
                    .zip(segments)
                    .all(|(a, b)| a.as_bytes() == *b)
        };
        Some(&self.table.find(hash, same)?.value)
    }

    /// How many paths are kept.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.table.len()
    }
}

/// The hash of a sequence of segments (see [`ExactPaths`]).
#[inline]
fn hash_segments<'a>(segments: impl Iterator<Item = &'a [u8]>) -> u64 {
    const K: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut h: u64 = 0;
    for s in segments {
        let (head, tail) = match s.len() {
            0..=7 => {
                let mut b = [0u8; 8];
                b[..s.len()].copy_from_slice(s);
                (u64::from_le_bytes(b), 0)
            }
            n => (first_eight(s), first_eight(&s[n - 8..])),
        };
        h = (h ^ head ^ tail.rotate_left(32) ^ s.len() as u64)
            .wrapping_mul(K)
            .rotate_left(29);
    }
    h.wrapping_mul(K)
}

/// The first eight bytes of `s` (at least eight long) as a number.
#[inline]
fn first_eight(s: &[u8]) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&s[..8]);
    u64::from_le_bytes(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn path(p: &str) -> Vec<Box<str>> {
        p.split('/')
            .filter(|s| !s.is_empty())
            .map(Into::into)
            .collect()
    }

    fn segments<'a>(s: &[&'a str]) -> Vec<&'a [u8]> {
        s.iter().map(|s| s.as_bytes()).collect()
    }

    #[test]
    fn finds_whole_paths_only() {
        let mut paths = ExactPaths::default();
        paths.insert(path("/a/b"), 1);
        paths.insert(path("/ab"), 2);
        paths.insert(vec![], 3);
        assert_eq!(paths.get(&segments(&["a", "b"])), Some(&1));
        assert_eq!(paths.get(&segments(&["ab"])), Some(&2));
        assert_eq!(paths.get(&segments(&[])), Some(&3));
        assert_eq!(paths.get(&segments(&["a"])), None);
        assert_eq!(paths.get(&segments(&["a", "b", "c"])), None);
        assert_eq!(paths.get(&segments(&["a", "b", ""])), None);
        assert_eq!(paths.get(&segments(&["b", "a"])), None);
    }

    #[test]
    fn insert_replaces_and_clear_forgets() {
        let mut paths = ExactPaths::default();
        paths.insert(path("/x"), 1);
        paths.insert(path("/x"), 2);
        assert_eq!(paths.len(), 1);
        assert_eq!(paths.get(&segments(&["x"])), Some(&2));
        paths.clear();
        assert_eq!(paths.get(&segments(&["x"])), None);
        assert_eq!(paths.len(), 0);
    }

    #[test]
    fn paths_whose_hashes_meet_stay_apart() {
        // The same length, first and last eight bytes: the same hash.
        let mut paths = ExactPaths::default();
        let (a, b) = ("0123456789-a-abcdefgh", "0123456789-b-abcdefgh");
        assert_eq!(
            hash_segments(segments(&[a]).into_iter()),
            hash_segments(segments(&[b]).into_iter())
        );
        paths.insert(vec![a.into()], 1);
        paths.insert(vec![b.into()], 2);
        assert_eq!(paths.get(&segments(&[a])), Some(&1));
        assert_eq!(paths.get(&segments(&[b])), Some(&2));
        assert_eq!(paths.get(&segments(&["0123456789-c-abcdefgh"])), None);
    }

    #[test]
    fn many_paths_stay_apart() {
        let mut paths = ExactPaths::default();
        for i in 0..200 {
            paths.insert(vec![format!("r{i}").into(), "v".into()], i);
        }
        for i in 0..200 {
            let seg = format!("r{i}");
            assert_eq!(paths.get(&segments(&[seg.as_str(), "v"])), Some(&i));
        }
        assert_eq!(paths.get(&segments(&["r1v"])), None);
        let not_utf8: [&[u8]; 2] = [b"r1\xff", b"v"];
        assert_eq!(paths.get(&not_utf8), None);
    }
}
