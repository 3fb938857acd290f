//! The identifiers under which the endpoint reports exchanges to the application.

/// Identifies a request received by this endpoint (server role) until it is answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ExchangeId(pub u64);

/// Identifies a request sent by this endpoint (client role).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RequestId(pub u64);

/// A table keyed by the endpoint's own numbers ([`ExchangeId`], [`RequestId`]),
/// hashed by [`IdHasher`].
pub(super) type ById<K, V> = hashbrown::HashMap<K, V, std::hash::BuildHasherDefault<IdHasher>>;

/// Hashes the endpoint's own numbers with one multiplication (by an odd constant, so
/// that consecutive numbers fill consecutive buckets and the top bits, which the
/// table compares first, are mixed), where a general hasher takes some 15 to 20
/// instructions for each of the two lookups of every request. Safe only because the
/// numbers are the endpoint's, counted up one by one: no peer chooses them, so none
/// can make them collide.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct IdHasher(u64);

/// 2^64 divided by the golden ratio, made odd (Fibonacci hashing).
const MIX: u64 = 0x9e37_79b9_7f4a_7c15;

impl std::hash::Hasher for IdHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(MIX);
        }
    }

    #[inline]
    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0 ^ n).wrapping_mul(MIX);
    }

    #[inline]
    fn finish(&self) -> u64 {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::hash::BuildHasher;

    #[test]
    fn consecutive_ids_spread_over_buckets_and_tags() {
        let hasher = std::hash::BuildHasherDefault::<IdHasher>::default();
        let hashes: Vec<u64> = (1000..1256u64)
            .map(|n| hasher.hash_one(ExchangeId(n)))
            .collect();
        let buckets: std::collections::HashSet<u64> = hashes.iter().map(|h| h & 255).collect();
        assert_eq!(buckets.len(), 256, "256 numbers in a row, 256 buckets");
        let tags: std::collections::HashSet<u64> = hashes.iter().map(|h| h >> 57).collect();
        assert!(tags.len() > 64, "top 7 bits mixed: {} of 128", tags.len());
        let mut table: ById<RequestId, u64> = ById::default();
        for n in 0..10_000 {
            table.insert(RequestId(n), n);
        }
        assert!((0..10_000).all(|n| table.get(&RequestId(n)) == Some(&n)));
    }
}
