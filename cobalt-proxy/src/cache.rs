//! The response cache all fronts share (RFC 7252 §5.6): answers to GET and FETCH keyed
//! by method, target URI and the request options that are part of the cache key,
//! fresh for their Max-Age (60 s when absent), revalidated upstream with their ETag
//! when stale, bounded in bytes with least-recently-used eviction. Time comes from an
//! injected [`Clock`], so freshness is tested in virtual time.

use crate::clock::Clock;
use crate::hop::HOP_LIMIT;
use crate::target::uri_string;
use cobalt::proto::message::option::is_no_cache_key;
use cobalt::proto::message::{opt, Code, Options};
use cobalt::proto::uri::CoapUri;
use cobalt::Response;
use lru::LruCache;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Freshness of a response without Max-Age (RFC 7252 §5.10.5).
pub const DEFAULT_MAX_AGE: u32 = 60;
/// What an entry costs beyond its key, options and payload (bookkeeping, estimated).
const ENTRY_OVERHEAD: usize = 96;

/// What identifies a cached answer: method, target URI, the request options that are
/// part of the cache key, and a FETCH's body.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CacheKey(Vec<u8>);

impl CacheKey {
    /// The key of a request with `method` for `target`, with `options` and `payload`.
    /// Left out, besides the NoCacheKey options (RFC 7252 §5.4.6): the target's own
    /// options (Uri-*, Proxy-*), which the URI already says; validators (ETag), which
    /// the cache answers itself; and what belongs to one hop or one transfer
    /// (Observe, Block1/2, Size1/2, Echo, Request-Tag, Hop-Limit).
    pub fn new(method: Code, target: &CoapUri, options: &Options, payload: &[u8]) -> CacheKey {
        let mut key = vec![method.0];
        key.extend_from_slice(uri_string(target).as_bytes());
        key.push(0);
        for o in options.iter() {
            if !in_key(o.number) {
                continue;
            }
            key.extend_from_slice(&o.number.to_be_bytes());
            key.extend_from_slice(
                &u32::try_from(o.value.len())
                    .unwrap_or(u32::MAX)
                    .to_be_bytes(),
            );
            key.extend_from_slice(o.value);
        }
        if method == Code::FETCH {
            key.extend_from_slice(payload);
        }
        CacheKey(key)
    }

    /// The target URI part of the key.
    fn uri(&self) -> &[u8] {
        let rest = self.0.get(1..).unwrap_or_default();
        let end = rest.iter().position(|b| *b == 0).unwrap_or(rest.len());
        &rest[..end]
    }

    /// The key's size in bytes.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether the key is empty (never: it holds at least the method).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// Whether option `number` of a request is part of the cache key.
fn in_key(number: u16) -> bool {
    !is_no_cache_key(number)
        && !matches!(
            number,
            opt::URI_HOST
                | opt::URI_PORT
                | opt::URI_PATH
                | opt::URI_QUERY
                | opt::PROXY_URI
                | opt::PROXY_SCHEME
                | opt::ETAG
                | opt::OBSERVE
                | opt::BLOCK1
                | opt::BLOCK2
                | opt::SIZE1
                | opt::SIZE2
                | opt::ECHO
                | opt::REQUEST_TAG
                | HOP_LIMIT
        )
}

/// Whether the methods' answers may be cached (RFC 7252 §5.6, RFC 8132 §2: FETCH).
pub fn cacheable_method(method: Code) -> bool {
    method == Code::GET || method == Code::FETCH
}

/// Whether an answer with `code` may be stored: 2.05 Content, and the error classes
/// 4.xx and 5.xx (RFC 7252 §5.9: cacheable, freshness by Max-Age). 2.01, 2.02 and 2.04
/// are not cacheable; 2.03 refreshes a stored answer instead.
pub fn cacheable_code(code: Code) -> bool {
    code == Code::CONTENT || matches!(code.class(), 4 | 5)
}

/// What the cache holds for a key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lookup {
    /// A fresh answer, its Max-Age set to what is left of its freshness.
    Fresh(Response),
    /// A stale answer with an ETag: ask the origin whether it is still valid.
    Stale {
        /// The stored answer's ETag.
        etag: Vec<u8>,
    },
    /// Nothing usable.
    Miss,
}

/// The cache's bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheLimits {
    /// Bytes held by all entries together (keys, options, payloads): least recently
    /// used entries are evicted beyond it. 0 turns the cache off.
    pub max_bytes: usize,
    /// Largest single entry; larger answers are served but not stored.
    pub max_entry_bytes: usize,
}

impl Default for CacheLimits {
    fn default() -> Self {
        CacheLimits {
            max_bytes: 64 << 20,
            max_entry_bytes: 1 << 20,
        }
    }
}

struct Stored {
    response: Response,
    /// When it was stored or last revalidated.
    at: Duration,
    /// Its freshness from then.
    max_age: Duration,
    cost: usize,
}

struct Entries {
    lru: LruCache<CacheKey, Stored>,
    /// The keys stored for each target URI (whatever their method and options), so
    /// that a change to the resource marks them all stale.
    by_uri: HashMap<Vec<u8>, Vec<CacheKey>>,
    bytes: usize,
    evictions: u64,
}

impl Entries {
    fn put(&mut self, key: CacheKey, stored: Stored) {
        self.bytes += stored.cost;
        match self.lru.put(key.clone(), stored) {
            Some(old) => self.bytes -= old.cost,
            None => self.by_uri.entry(key.uri().to_vec()).or_default().push(key),
        }
    }

    fn forget(&mut self, key: &CacheKey, gone: &Stored) {
        self.bytes -= gone.cost;
        if let Some(keys) = self.by_uri.get_mut(key.uri()) {
            keys.retain(|k| k != key);
            if keys.is_empty() {
                self.by_uri.remove(key.uri());
            }
        }
    }

    fn pop(&mut self, key: &CacheKey) {
        if let Some(gone) = self.lru.pop(key) {
            self.forget(key, &gone);
        }
    }

    fn pop_lru(&mut self) -> bool {
        match self.lru.pop_lru() {
            Some((key, gone)) => {
                self.forget(&key, &gone);
                true
            }
            None => false,
        }
    }
}

/// A response cache shared by every front of a proxy; cheap to clone (clones share).
#[derive(Clone)]
pub struct Cache {
    entries: Arc<Mutex<Entries>>,
    limits: CacheLimits,
    clock: Arc<dyn Clock>,
}

impl std::fmt::Debug for Cache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cache")
            .field("limits", &self.limits)
            .field("bytes", &self.bytes())
            .finish()
    }
}

impl Cache {
    /// An empty cache with `limits`, reading time from `clock`.
    pub fn new(limits: CacheLimits, clock: Arc<dyn Clock>) -> Cache {
        Cache {
            entries: Arc::new(Mutex::new(Entries {
                lru: LruCache::unbounded(),
                by_uri: HashMap::new(),
                bytes: 0,
                evictions: 0,
            })),
            limits,
            clock,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Entries> {
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The clock the cache reads.
    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }

    /// What is stored under `key`, now.
    pub fn lookup(&self, key: &CacheKey) -> Lookup {
        let now = self.clock.now();
        let mut entries = self.lock();
        let Some(stored) = entries.lru.get(key) else {
            return Lookup::Miss;
        };
        let age = now.saturating_sub(stored.at);
        if age < stored.max_age {
            let mut response = stored.response.clone();
            let left = (stored.max_age - age).as_secs();
            response
                .options
                .set_uint(opt::MAX_AGE, u32::try_from(left).unwrap_or(u32::MAX));
            return Lookup::Fresh(response);
        }
        match stored.response.options.get(opt::ETAG) {
            Some(etag) => Lookup::Stale {
                etag: etag.to_vec(),
            },
            None => {
                entries.pop(key);
                Lookup::Miss
            }
        }
    }

    /// Stores the origin's `response` under `key` if it may be cached: a cacheable
    /// code, fresh for a while or revalidatable (an ETag), within the entry bound.
    /// Returns whether it was stored.
    pub fn store(&self, key: CacheKey, response: &Response) -> bool {
        if !cacheable_code(response.code) {
            return false;
        }
        let max_age = response
            .options
            .get_uint(opt::MAX_AGE)
            .unwrap_or(DEFAULT_MAX_AGE);
        if max_age == 0 && !response.options.contains(opt::ETAG) {
            return false;
        }
        // The key is held twice: in the LRU and in the index by URI.
        let cost = ENTRY_OVERHEAD
            + 2 * key.len()
            + response.options.as_wire().len()
            + response.payload.len();
        if cost > self.limits.max_entry_bytes || cost > self.limits.max_bytes {
            return false;
        }
        let stored = Stored {
            response: response.clone(),
            at: self.clock.now(),
            max_age: Duration::from_secs(u64::from(max_age)),
            cost,
        };
        let mut entries = self.lock();
        entries.put(key, stored);
        while entries.bytes > self.limits.max_bytes && entries.pop_lru() {
            entries.evictions += 1;
        }
        true
    }

    /// The resource at `target` was created, changed or deleted (a 2.01, 2.04 or 2.02
    /// answer went through): every answer stored for it, whatever the method and
    /// options, is no longer fresh (RFC 7252 §5.9.1.1, .2, .4); one with an ETag is
    /// revalidated on its next use.
    pub fn invalidate(&self, target: &CoapUri) {
        let uri = uri_string(target).into_bytes();
        let mut entries = self.lock();
        let keys = entries.by_uri.get(&uri).cloned().unwrap_or_default();
        for key in keys {
            if let Some(stored) = entries.lru.peek_mut(&key) {
                stored.max_age = Duration::ZERO;
            }
        }
    }

    /// The origin answered `valid` (2.03 Valid) to a revalidation of `key`: when its
    /// ETag is the stored one, the stored answer is fresh again for the Max-Age of
    /// `valid` (the options `valid` carries replace the stored ones, RFC 7252
    /// §5.9.1.3), and is returned as [`Cache::lookup`] would. `None` when nothing with
    /// that ETag is stored.
    pub fn refresh(&self, key: &CacheKey, valid: &Response) -> Option<Response> {
        let now = self.clock.now();
        let mut entries = self.lock();
        let stored = entries.lru.get_mut(key)?;
        if stored.response.options.get(opt::ETAG) != valid.options.get(opt::ETAG) {
            return None;
        }
        let max_age = valid
            .options
            .get_uint(opt::MAX_AGE)
            .unwrap_or(DEFAULT_MAX_AGE);
        for o in valid.options.iter() {
            if o.number != opt::BLOCK2 && o.number != opt::OBSERVE && o.number != opt::SIZE2 {
                stored.response.options.set(o.number, o.value);
            }
        }
        stored.response.options.set_uint(opt::MAX_AGE, max_age);
        stored.at = now;
        stored.max_age = Duration::from_secs(u64::from(max_age));
        Some(stored.response.clone())
    }

    /// Bytes held now.
    pub fn bytes(&self) -> usize {
        self.lock().bytes
    }

    /// Entries held now.
    pub fn len(&self) -> usize {
        self.lock().lru.len()
    }

    /// Whether nothing is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Entries evicted to stay within [`CacheLimits::max_bytes`] so far.
    pub fn evictions(&self) -> u64 {
        self.lock().evictions
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;

    fn cache(max_bytes: usize) -> (Cache, ManualClock) {
        let clock = ManualClock::new();
        let limits = CacheLimits {
            max_bytes,
            max_entry_bytes: max_bytes,
        };
        (Cache::new(limits, Arc::new(clock.clone())), clock)
    }

    fn key(path: &str) -> CacheKey {
        let uri = CoapUri::parse(&format!("coap://h{path}")).unwrap();
        CacheKey::new(Code::GET, &uri, &Options::new(), b"")
    }

    #[test]
    fn fresh_for_max_age_then_gone_without_etag() {
        let (cache, clock) = cache(1 << 20);
        assert!(cache.store(key("/a"), &Response::content("x").with_max_age(10)));
        clock.advance(Duration::from_secs(4));
        let Lookup::Fresh(r) = cache.lookup(&key("/a")) else {
            panic!("fresh expected")
        };
        assert_eq!(
            r.options.get_uint(opt::MAX_AGE),
            Some(6),
            "Max-Age is what is left"
        );
        clock.advance(Duration::from_secs(6));
        assert_eq!(cache.lookup(&key("/a")), Lookup::Miss);
        assert!(cache.is_empty());
    }

    #[test]
    fn default_max_age_is_60_s() {
        let (cache, clock) = cache(1 << 20);
        cache.store(key("/a"), &Response::content("x"));
        clock.advance(Duration::from_secs(59));
        assert!(matches!(cache.lookup(&key("/a")), Lookup::Fresh(_)));
        clock.advance(Duration::from_secs(1));
        assert_eq!(cache.lookup(&key("/a")), Lookup::Miss);
    }

    #[test]
    fn stale_with_etag_is_revalidated_and_refreshed() {
        let (cache, clock) = cache(1 << 20);
        cache.store(
            key("/a"),
            &Response::content("x").with_max_age(5).with_etag(b"e1"),
        );
        clock.advance(Duration::from_secs(5));
        assert_eq!(
            cache.lookup(&key("/a")),
            Lookup::Stale {
                etag: b"e1".to_vec()
            }
        );
        let other = Response::new(Code::VALID).with_etag(b"e2");
        assert_eq!(
            cache.refresh(&key("/a"), &other),
            None,
            "another ETag refreshes nothing"
        );
        let valid = Response::new(Code::VALID).with_etag(b"e1").with_max_age(30);
        let r = cache.refresh(&key("/a"), &valid).unwrap();
        assert_eq!((r.code, r.payload.as_slice()), (Code::CONTENT, &b"x"[..]));
        clock.advance(Duration::from_secs(29));
        assert!(matches!(cache.lookup(&key("/a")), Lookup::Fresh(_)));
    }

    #[test]
    fn a_change_to_the_resource_makes_every_stored_answer_for_it_stale() {
        let (cache, _) = cache(1 << 20);
        let uri = CoapUri::parse("coap://h/a").unwrap();
        let mut accept = Options::new();
        accept.set_uint(opt::ACCEPT, 50);
        let json = CacheKey::new(Code::GET, &uri, &accept, b"");
        cache.store(key("/a"), &Response::content("x"));
        cache.store(json.clone(), &Response::content("{}").with_etag(b"j"));
        cache.store(key("/b"), &Response::content("y"));
        cache.invalidate(&uri);
        assert_eq!(cache.lookup(&key("/a")), Lookup::Miss);
        assert_eq!(
            cache.lookup(&json),
            Lookup::Stale {
                etag: b"j".to_vec()
            }
        );
        assert!(
            matches!(cache.lookup(&key("/b")), Lookup::Fresh(_)),
            "another resource"
        );
        assert_eq!(cache.len(), 2);
    }

    #[test]
    fn only_cacheable_codes_are_stored() {
        let (cache, _) = cache(1 << 20);
        assert!(!cache.store(key("/a"), &Response::new(Code::CHANGED)));
        assert!(!cache.store(key("/a"), &Response::new(Code::CREATED)));
        assert!(!cache.store(key("/a"), &Response::content("x").with_max_age(0)));
        assert!(cache.store(key("/a"), &Response::new(Code::NOT_FOUND)));
        assert!(!cacheable_method(Code::POST));
    }

    #[test]
    fn bytes_are_bounded_by_evicting_the_least_recently_used() {
        let (cache, _) = cache(1000);
        let body = vec![b'x'; 200];
        for p in ["/a", "/b", "/c"] {
            assert!(cache.store(key(p), &Response::content(body.clone())));
        }
        let _ = cache.lookup(&key("/a")); // /b is now the least recently used
        assert!(cache.store(key("/d"), &Response::content(body.clone())));
        assert!(cache.bytes() <= 1000);
        assert_eq!(cache.lookup(&key("/b")), Lookup::Miss);
        assert!(matches!(cache.lookup(&key("/a")), Lookup::Fresh(_)));
        assert_eq!(cache.evictions(), 1);
        assert!(!cache.store(key("/big"), &Response::content(vec![0; 2000])));
    }

    #[test]
    fn keys_leave_out_no_cache_key_and_hop_options() {
        let uri = CoapUri::parse("coap://h/a").unwrap();
        let mut with_hop = Options::new();
        with_hop.set(HOP_LIMIT, [3]);
        with_hop.set(opt::ETAG, b"e");
        with_hop.set_uint(opt::SIZE1, 10);
        assert_eq!(
            CacheKey::new(Code::GET, &uri, &with_hop, b""),
            CacheKey::new(Code::GET, &uri, &Options::new(), b"")
        );
        let mut accept = Options::new();
        accept.set_uint(opt::ACCEPT, 50);
        assert_ne!(
            CacheKey::new(Code::GET, &uri, &accept, b""),
            CacheKey::new(Code::GET, &uri, &Options::new(), b"")
        );
        assert_ne!(
            CacheKey::new(Code::FETCH, &uri, &Options::new(), b"1"),
            CacheKey::new(Code::FETCH, &uri, &Options::new(), b"2")
        );
    }
}
