//! Static paths by their whole sequence of segments: a request whose Uri-Path is
//! exactly a static route's (the common case) is found with one hash of its segments
//! and one comparison, instead of a walk down the resource tree comparing strings at
//! each level.

use hashbrown::{DefaultHashBuilder, HashTable};
use std::hash::{BuildHasher, Hasher};

/// One static path and what is kept for it.
#[derive(Debug, Clone)]
struct Entry<T> {
    segments: Box<[Box<str>]>,
    value: T,
}

/// A `T` for each static path (its segments, none for the root).
#[derive(Debug, Clone)]
pub(crate) struct ExactPaths<T> {
    table: HashTable<Entry<T>>,
    hasher: DefaultHashBuilder,
}

impl<T> Default for ExactPaths<T> {
    fn default() -> Self {
        ExactPaths {
            table: HashTable::new(),
            hasher: DefaultHashBuilder::default(),
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
        let hash = self.hash(segments.iter().map(|s| &**s));
        let hasher = &self.hasher;
        let rehash = |e: &Entry<T>| hash_segments(hasher, e.segments.iter().map(|s| &**s));
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

    /// What is kept for the path whose segments `path` yields (it is called once to
    /// hash them and, when an entry has that hash, once more to compare them).
    #[inline]
    pub(crate) fn get<'a, I>(&self, path: impl Fn() -> I) -> Option<&T>
    where
        I: Iterator<Item = &'a str>,
    {
        if self.table.is_empty() {
            return None;
        }
        let hash = self.hash(path());
        let e = self
            .table
            .find(hash, |e| path().eq(e.segments.iter().map(|s| &**s)))?;
        Some(&e.value)
    }

    /// How many paths are kept.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.table.len()
    }

    fn hash<'a>(&self, segments: impl Iterator<Item = &'a str>) -> u64 {
        hash_segments(&self.hasher, segments)
    }
}

/// The hash of a sequence of segments: each one's bytes and a byte that no UTF-8 text
/// holds, so that `a/bc` and `ab/c` hash differently.
#[inline]
fn hash_segments<'a>(
    hasher: &DefaultHashBuilder,
    segments: impl Iterator<Item = &'a str>,
) -> u64 {
    let mut h = hasher.build_hasher();
    for s in segments {
        h.write(s.as_bytes());
        h.write_u8(0xff);
    }
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn path(p: &str) -> Vec<Box<str>> {
        p.split('/').filter(|s| !s.is_empty()).map(Into::into).collect()
    }

    #[test]
    fn finds_whole_paths_only() {
        let mut paths = ExactPaths::default();
        paths.insert(path("/a/b"), 1);
        paths.insert(path("/ab"), 2);
        paths.insert(vec![], 3);
        assert_eq!(paths.get(|| ["a", "b"].into_iter()), Some(&1));
        assert_eq!(paths.get(|| ["ab"].into_iter()), Some(&2));
        assert_eq!(paths.get(|| [].into_iter()), Some(&3));
        assert_eq!(paths.get(|| ["a"].into_iter()), None);
        assert_eq!(paths.get(|| ["a", "b", "c"].into_iter()), None);
        assert_eq!(paths.get(|| ["a", "b", ""].into_iter()), None);
        assert_eq!(paths.get(|| ["a", "b"].into_iter().rev()), None);
    }

    #[test]
    fn insert_replaces_and_clear_forgets() {
        let mut paths = ExactPaths::default();
        paths.insert(path("/x"), 1);
        paths.insert(path("/x"), 2);
        assert_eq!(paths.len(), 1);
        assert_eq!(paths.get(|| ["x"].into_iter()), Some(&2));
        paths.clear();
        assert_eq!(paths.get(|| ["x"].into_iter()), None);
        assert_eq!(paths.len(), 0);
    }

    #[test]
    fn many_paths_stay_apart() {
        let mut paths = ExactPaths::default();
        for i in 0..200 {
            paths.insert(vec![format!("r{i}").into(), "v".into()], i);
        }
        for i in 0..200 {
            let seg = format!("r{i}");
            assert_eq!(paths.get(|| [seg.as_str(), "v"].into_iter()), Some(&i));
        }
        assert_eq!(paths.get(|| ["r1v"].into_iter()), None);
    }
}
