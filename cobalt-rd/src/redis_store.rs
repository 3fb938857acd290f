//! The shared store of a cluster: registrations in one Redis (or Valkey) server that
//! every directory node reads and writes (feature `redis`).
//!
//! Layout, every key under one prefix in a hash tag (default `{cobalt:rd}`), so that
//! any node finds any registration:
//!
//! | Key | Holds |
//! |---|---|
//! | `P:reg:<id>` | hash: `json` (the [`Registration`]), `name` (its (ep, d)), `peer` (its address budget) |
//! | `P:names` | hash: (ep, d) → id |
//! | `P:expiry` | sorted set: id scored by its expiry (seconds since the Unix epoch) |
//! | `P:peers` | hash: address budget → how many registrations it holds |
//! | `P:next-id` | the last id given out (`INCR`) |
//! | `P:format` | the layout's version, checked when connecting |
//! | `P:changes` | pub/sub channel: `s<id>` stored, `r<id>` removed |
//!
//! Every write is one Lua script, so it is atomic against other nodes: a new
//! registration is refused when its (ep, d) is taken (the writer's view was stale),
//! its peer's budget or the directory's is spent; a replacement is refused when the
//! registration is gone; expiry removes only what the sorted set says has run out.
//! Expiry times are absolute, so lifetimes continue across restarts of any node.

use crate::error::StoreError;
use crate::registration::Registration;
use crate::store::{RegistrationStore, StoreChange, StoreFuture, Write, Written};
use futures_util::StreamExt;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{AsyncCommands, Script};
use std::time::Duration;
use tokio::sync::mpsc;

/// The layout version this code reads and writes (`P:format`).
const FORMAT: &str = "1";

/// How long one command may take before the request that needed it fails (the
/// client then retries, and the node stays responsive while Redis is away).
const COMMAND_TIMEOUT: Duration = Duration::from_secs(2);

/// How long the change feed waits before connecting again after losing Redis.
const RECONNECT_DELAY: Duration = Duration::from_secs(1);

/// Changes queued for the directory before the feed waits for it to catch up.
const FEED_DEPTH: usize = 1024;

/// Registrations read per pipelined round trip when loading, and removed per script
/// run (one run blocks the server for its length).
const LOAD_BATCH: usize = 256;

/// Takes registration `id` out of every index and announces it; shared by the
/// scripts that remove.
const DROP_FN: &str = r#"
local function drop(p, id)
  local key = p .. ':reg:' .. id
  local name = redis.call('HGET', key, 'name')
  redis.call('ZREM', p .. ':expiry', id)
  if not name then return false end
  local peer = redis.call('HGET', key, 'peer')
  redis.call('DEL', key)
  if redis.call('HGET', p .. ':names', name) == id then
    redis.call('HDEL', p .. ':names', name)
  end
  if redis.call('HINCRBY', p .. ':peers', peer, -1) <= 0 then
    redis.call('HDEL', p .. ':peers', peer)
  end
  redis.call('PUBLISH', p .. ':changes', 'r' .. id)
  return true
end
"#;

/// ARGV: prefix, mode (`new`|`replace`), id, json, name, peer, expires_at,
/// max_per_peer, max_total. Answers `{'stored'}`, `{'stale', json-or-nil}`,
/// `{'peer-full'}` or `{'full'}`.
const PUT: &str = r#"
local p, mode, id, json, name, peer, exp = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7]
local key = p .. ':reg:' .. id
if mode == 'new' then
  local holder = redis.call('HGET', p .. ':names', name)
  if holder then
    return {'stale', redis.call('HGET', p .. ':reg:' .. holder, 'json')}
  end
  if redis.call('EXISTS', key) == 1 then
    return {'stale', redis.call('HGET', key, 'json')}
  end
  if tonumber(redis.call('HGET', p .. ':peers', peer) or '0') >= tonumber(ARGV[8]) then
    return {'peer-full'}
  end
  if redis.call('ZCARD', p .. ':expiry') >= tonumber(ARGV[9]) then
    return {'full'}
  end
  redis.call('HINCRBY', p .. ':peers', peer, 1)
else
  local old_name = redis.call('HGET', key, 'name')
  if old_name ~= name then
    return {'stale', redis.call('HGET', key, 'json')}
  end
  local old_peer = redis.call('HGET', key, 'peer')
  if old_peer ~= peer then
    if redis.call('HINCRBY', p .. ':peers', old_peer, -1) <= 0 then
      redis.call('HDEL', p .. ':peers', old_peer)
    end
    redis.call('HINCRBY', p .. ':peers', peer, 1)
  end
end
redis.call('HSET', key, 'json', json, 'name', name, 'peer', peer)
redis.call('HSET', p .. ':names', name, id)
redis.call('ZADD', p .. ':expiry', exp, id)
redis.call('PUBLISH', p .. ':changes', 's' .. id)
return {'stored'}
"#;

/// ARGV: prefix, ids... Removes them (unknown ids are ignored).
const REMOVE: &str = r#"
for i = 2, #ARGV do drop(ARGV[1], ARGV[i]) end
return 0
"#;

/// ARGV: prefix, now, ids... Removes those whose stored expiry is at or before
/// `now`; answers their ids.
const REMOVE_EXPIRED: &str = r#"
local removed = {}
for i = 3, #ARGV do
  local score = redis.call('ZSCORE', ARGV[1] .. ':expiry', ARGV[i])
  if score and tonumber(score) <= tonumber(ARGV[2]) then
    drop(ARGV[1], ARGV[i])
    table.insert(removed, ARGV[i])
  end
end
return removed
"#;

/// Registrations in a Redis server shared by several directories. Cheap to clone:
/// clones share one multiplexed connection, which reconnects by itself.
#[derive(Clone)]
pub struct RedisStore {
    client: redis::Client,
    connection: ConnectionManager,
    prefix: String,
    put: std::sync::Arc<Script>,
    remove: std::sync::Arc<Script>,
    remove_expired: std::sync::Arc<Script>,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("server", &self.client.get_connection_info().addr())
            .field("prefix", &self.prefix)
            .finish()
    }
}

fn failed(what: &str, e: impl std::fmt::Display) -> StoreError {
    StoreError(format!("redis: {what}: {e}"))
}

/// The `P:names` field of (ep, d): JSON, so that no pair of names collides.
fn name_field(r: &Registration) -> String {
    serde_json::json!([r.ep, r.sector]).to_string()
}

impl RedisStore {
    /// Connects to the server at `url` (`redis://host:port[/db]`), with the default
    /// key prefix `{cobalt:rd}`.
    pub async fn connect(url: &str) -> Result<RedisStore, StoreError> {
        RedisStore::connect_with_prefix(url, "cobalt:rd").await
    }

    /// Connects with the keys under `{prefix}` (directories that share a prefix share
    /// their registrations; other prefixes on the same server are other directories).
    /// Fails if the server cannot be reached or holds another layout version there.
    pub async fn connect_with_prefix(url: &str, prefix: &str) -> Result<RedisStore, StoreError> {
        let client = redis::Client::open(url)
            .map_err(|e| failed(&format!("{url} is not a Redis URL (redis://HOST:PORT)"), e))?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(COMMAND_TIMEOUT))
            .set_response_timeout(Some(COMMAND_TIMEOUT))
            .set_number_of_retries(2);
        let mut connection = client
            .get_connection_manager_with_config(config)
            .await
            .map_err(|e| {
                failed(
                    &format!("cannot connect to {url} (is redis-server running?)"),
                    e,
                )
            })?;
        let prefix = format!("{{{prefix}}}");
        let format_key = format!("{prefix}:format");
        let _: bool = connection
            .set_nx(&format_key, FORMAT)
            .await
            .map_err(|e| failed("cannot write the layout version", e))?;
        let found: String = connection
            .get(&format_key)
            .await
            .map_err(|e| failed("cannot read the layout version", e))?;
        if found != FORMAT {
            return Err(StoreError(format!(
                "redis: {format_key} says the registrations there are in layout {found:?}; this \
                 version reads layout {FORMAT}: use another --store prefix or migrate them"
            )));
        }
        let script = |body: &str| std::sync::Arc::new(Script::new(&format!("{DROP_FN}{body}")));
        Ok(RedisStore {
            client,
            connection,
            put: script(PUT),
            remove: script(REMOVE),
            remove_expired: script(REMOVE_EXPIRED),
            prefix,
        })
    }

    /// The key prefix, hash tag included (`{cobalt:rd}`).
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    fn key(&self, what: &str) -> String {
        format!("{}:{what}", self.prefix)
    }

    /// The stored registration `id`, if any (an unreadable one counts as none).
    async fn get(&self, id: u64) -> Result<Option<Registration>, StoreError> {
        let mut c = self.connection.clone();
        let json: Option<String> = c
            .hget(self.key(&format!("reg:{id}")), "json")
            .await
            .map_err(|e| failed("cannot read a registration", e))?;
        Ok(json.and_then(|j| decode(id, &j)))
    }

    /// Sends the registrations' changes to `tx` until it is closed: a `Resync` on
    /// every (re)connection, then one change per announcement.
    async fn feed(self, tx: mpsc::Sender<StoreChange>) {
        let channel = self.key("changes");
        while !tx.is_closed() {
            let lost = match self.client.get_async_pubsub().await {
                Ok(mut pubsub) => match pubsub.subscribe(&channel).await {
                    Ok(()) => {
                        if tx.send(StoreChange::Resync).await.is_err() {
                            return;
                        }
                        let mut messages = pubsub.on_message();
                        while let Some(message) = messages.next().await {
                            let Some(change) = self.change(message.get_payload_bytes()).await
                            else {
                                continue;
                            };
                            if tx.send(change).await.is_err() {
                                return;
                            }
                        }
                        tracing::warn!("redis: lost the change feed; reconnecting");
                        "the connection to redis was lost; reconnecting".to_string()
                    }
                    Err(e) => {
                        tracing::warn!("redis: cannot subscribe to {channel}: {e}");
                        format!("cannot subscribe to redis: {e}")
                    }
                },
                Err(e) => {
                    tracing::warn!("redis: cannot open the change feed: {e}");
                    format!("cannot connect to redis: {e}")
                }
            };
            if tx.send(StoreChange::Lost(lost)).await.is_err() {
                return;
            }
            tokio::time::sleep(RECONNECT_DELAY).await;
        }
    }

    /// The change an announcement (`s<id>` or `r<id>`) stands for, read back from
    /// the store so that it is the newest state whatever order announcements come in.
    async fn change(&self, payload: &[u8]) -> Option<StoreChange> {
        let text = std::str::from_utf8(payload).ok()?;
        let id: u64 = text.get(1..)?.parse().ok()?;
        match text.as_bytes()[0] {
            b'r' => Some(StoreChange::Removed(id)),
            b's' => match self.get(id).await {
                Ok(Some(r)) => Some(StoreChange::Stored(r)),
                Ok(None) => Some(StoreChange::Removed(id)),
                // Lost the connection: the next feed connection resyncs.
                Err(e) => {
                    tracing::warn!("{e}; resyncing");
                    Some(StoreChange::Resync)
                }
            },
            _ => None,
        }
    }
}

fn decode(id: u64, json: &str) -> Option<Registration> {
    match serde_json::from_str::<Registration>(json) {
        Ok(r) => Some(r),
        Err(e) => {
            tracing::warn!(id, "skipping an unreadable registration in redis: {e}");
            None
        }
    }
}

fn ids(values: &[u64]) -> Vec<String> {
    values.iter().map(u64::to_string).collect()
}

impl RegistrationStore for RedisStore {
    fn load(&self) -> StoreFuture<'_, Vec<Registration>> {
        Box::pin(async move {
            let mut c = self.connection.clone();
            let all: Vec<u64> = c
                .zrange(self.key("expiry"), 0, -1)
                .await
                .map_err(|e| failed("cannot list the registrations", e))?;
            let mut loaded = Vec::with_capacity(all.len());
            for batch in all.chunks(LOAD_BATCH) {
                let mut pipe = redis::pipe();
                for id in batch {
                    pipe.hget(self.key(&format!("reg:{id}")), "json");
                }
                let jsons: Vec<Option<String>> = pipe
                    .query_async(&mut c)
                    .await
                    .map_err(|e| failed("cannot read the registrations", e))?;
                for (id, json) in batch.iter().zip(jsons) {
                    loaded.extend(json.and_then(|j| decode(*id, &j)));
                }
            }
            Ok(loaded)
        })
    }

    fn put(&self, registration: Registration) -> StoreFuture<'_, ()> {
        Box::pin(async move {
            let write = match self.get(registration.id).await? {
                Some(_) => Write::Replace,
                None => Write::New {
                    max_per_peer: usize::MAX,
                    max_total: usize::MAX,
                },
            };
            match self.put_checked(registration, write).await? {
                Written::Stored => Ok(()),
                other => Err(StoreError(format!(
                    "redis: the registration was not stored: {other:?}"
                ))),
            }
        })
    }

    fn remove(&self, ids_to_remove: Vec<u64>) -> StoreFuture<'_, ()> {
        Box::pin(async move {
            let mut c = self.connection.clone();
            for batch in ids_to_remove.chunks(LOAD_BATCH) {
                let _: i64 = self
                    .remove
                    .arg(&self.prefix)
                    .arg(ids(batch))
                    .invoke_async(&mut c)
                    .await
                    .map_err(|e| failed("cannot remove registrations", e))?;
            }
            Ok(())
        })
    }

    fn allocate_id(&self) -> StoreFuture<'_, Option<u64>> {
        Box::pin(async move {
            let mut c = self.connection.clone();
            // Ids start at 0, as a directory on its own numbers them.
            let last: u64 = c
                .incr(self.key("next-id"), 1)
                .await
                .map_err(|e| failed("cannot number a new registration", e))?;
            Ok(Some(last - 1))
        })
    }

    fn put_checked(&self, registration: Registration, write: Write) -> StoreFuture<'_, Written> {
        Box::pin(async move {
            let json = serde_json::to_string(&registration)
                .map_err(|e| failed("cannot encode a registration", e))?;
            let (mode, max_per_peer, max_total) = match write {
                Write::New {
                    max_per_peer,
                    max_total,
                } => ("new", max_per_peer, max_total),
                Write::Replace => ("replace", 0, 0),
            };
            let mut c = self.connection.clone();
            let answer: Vec<Option<String>> = self
                .put
                .arg(&self.prefix)
                .arg(mode)
                .arg(registration.id)
                .arg(json)
                .arg(name_field(&registration))
                .arg(registration.peer_key.to_string())
                .arg(registration.expires_at)
                .arg(max_per_peer)
                .arg(max_total)
                .invoke_async(&mut c)
                .await
                .map_err(|e| failed("cannot store a registration", e))?;
            let mut answer = answer.into_iter();
            match answer.next().flatten().as_deref() {
                Some("stored") => Ok(Written::Stored),
                Some("peer-full") => Ok(Written::PeerFull),
                Some("full") => Ok(Written::Full),
                Some("stale") => {
                    let current = answer.next().flatten();
                    Ok(Written::Stale(current.and_then(|j| {
                        serde_json::from_str::<Registration>(&j).ok()
                    })))
                }
                other => Err(StoreError(format!(
                    "redis: the store script answered {other:?}; is another program writing under {}?",
                    self.prefix
                ))),
            }
        })
    }

    fn remove_expired(&self, candidates: Vec<u64>, now: u64) -> StoreFuture<'_, Vec<u64>> {
        Box::pin(async move {
            let mut c = self.connection.clone();
            let mut removed = Vec::new();
            for batch in candidates.chunks(LOAD_BATCH) {
                let some: Vec<u64> = self
                    .remove_expired
                    .arg(&self.prefix)
                    .arg(now)
                    .arg(ids(batch))
                    .invoke_async(&mut c)
                    .await
                    .map_err(|e| failed("cannot remove expired registrations", e))?;
                removed.extend(some);
            }
            Ok(removed)
        })
    }

    fn subscribe(&self) -> Option<mpsc::Receiver<StoreChange>> {
        let (tx, rx) = mpsc::channel(FEED_DEPTH);
        tokio::spawn(self.clone().feed(tx));
        Some(rx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registration::Owner;
    use cobalt_test_support::peers::{self, PeerServer};
    use std::net::{IpAddr, Ipv4Addr};

    fn registration(id: u64, ep: &str, peer: u8, expires_at: u64) -> Registration {
        let ip = IpAddr::V4(Ipv4Addr::new(192, 0, 2, peer));
        Registration {
            id,
            ep: ep.into(),
            sector: None,
            base: format!("coap://{ip}:5683"),
            lifetime: 100,
            expires_at,
            attrs: Vec::new(),
            links: "</a>".into(),
            owner: Owner::Address(ip),
            peer_key: ip,
        }
    }

    const NEW: Write = Write::New {
        max_per_peer: 2,
        max_total: 3,
    };

    async fn store(server: &PeerServer) -> RedisStore {
        RedisStore::connect(&peers::redis::url(server))
            .await
            .unwrap()
    }

    async fn hlen(s: &RedisStore, what: &str) -> usize {
        let mut c = s.connection.clone();
        c.hlen(s.key(what)).await.unwrap()
    }

    #[tokio::test]
    async fn writes_check_names_budgets_and_staleness_atomically() {
        let Some(server) = peers::redis::start() else {
            return;
        };
        let s = store(&server).await;
        assert_eq!(s.allocate_id().await.unwrap(), Some(0));
        assert_eq!(s.allocate_id().await.unwrap(), Some(1));
        let a = registration(0, "a", 1, 500);
        assert_eq!(
            s.put_checked(a.clone(), NEW).await.unwrap(),
            Written::Stored
        );
        // Another node, unaware of `a`, registers the same name under another id.
        let twin = registration(1, "a", 1, 600);
        assert_eq!(
            s.put_checked(twin, NEW).await.unwrap(),
            Written::Stale(Some(a.clone()))
        );
        let b = registration(2, "b", 1, 700);
        assert_eq!(
            s.put_checked(b.clone(), NEW).await.unwrap(),
            Written::Stored
        );
        assert_eq!(
            s.put_checked(registration(3, "c", 1, 700), NEW)
                .await
                .unwrap(),
            Written::PeerFull
        );
        let c = registration(3, "c", 2, 700);
        assert_eq!(s.put_checked(c, NEW).await.unwrap(), Written::Stored);
        assert_eq!(
            s.put_checked(registration(4, "d", 3, 700), NEW)
                .await
                .unwrap(),
            Written::Full
        );
        // A renewal moves the expiry; the registration's peer may change too.
        let renewed = Registration {
            expires_at: 900,
            ..registration(0, "a", 2, 0)
        };
        assert_eq!(
            s.put_checked(renewed.clone(), Write::Replace)
                .await
                .unwrap(),
            Written::Stored
        );
        s.remove(vec![2, 99]).await.unwrap();
        // Another node renews what was removed meanwhile: refused, nothing comes back.
        assert_eq!(
            s.put_checked(b, Write::Replace).await.unwrap(),
            Written::Stale(None)
        );
        let mut loaded = s.load().await.unwrap();
        loaded.sort_by_key(|r| r.id);
        assert_eq!(
            loaded
                .iter()
                .map(|r| (r.id, r.expires_at))
                .collect::<Vec<_>>(),
            vec![(0, 900), (3, 700)]
        );
        assert_eq!(loaded[0], renewed);
        // Both left are 192.0.2.2's now; the names index holds exactly those two.
        assert_eq!((hlen(&s, "peers").await, hlen(&s, "names").await), (1, 2));
        let mut con = s.connection.clone();
        let count: u64 = con.hget(s.key("peers"), "192.0.2.2").await.unwrap();
        assert_eq!(count, 2);
    }

    #[tokio::test]
    async fn expiry_removes_only_what_ran_out_in_the_store() {
        let Some(server) = peers::redis::start() else {
            return;
        };
        let s = store(&server).await;
        for r in [registration(0, "a", 1, 100), registration(1, "b", 1, 200)] {
            s.put(r).await.unwrap();
        }
        // A node whose view says both ran out at 150: `b` was renewed elsewhere.
        assert_eq!(s.remove_expired(vec![0, 1], 150).await.unwrap(), vec![0]);
        assert_eq!(s.load().await.unwrap(), vec![registration(1, "b", 1, 200)]);
        assert_eq!(s.remove_expired(vec![1], 200).await.unwrap(), vec![1]);
        assert!(s.load().await.unwrap().is_empty());
        assert_eq!((hlen(&s, "peers").await, hlen(&s, "names").await), (0, 0));
    }

    #[tokio::test]
    async fn the_feed_announces_every_nodes_changes_as_stored_now() {
        let Some(server) = peers::redis::start() else {
            return;
        };
        let (here, there) = (store(&server).await, store(&server).await);
        let mut feed = here.subscribe().unwrap();
        assert_eq!(feed.recv().await, Some(StoreChange::Resync));
        let a = registration(0, "a", 1, 100);
        there.put(a.clone()).await.unwrap();
        assert_eq!(feed.recv().await, Some(StoreChange::Stored(a)));
        there.remove(vec![0]).await.unwrap();
        assert_eq!(feed.recv().await, Some(StoreChange::Removed(0)));
    }

    #[tokio::test]
    async fn another_layout_version_or_no_server_is_refused_saying_so() {
        let Some(server) = peers::redis::start() else {
            return;
        };
        let s = store(&server).await;
        let mut c = s.connection.clone();
        let _: () = c.set(s.key("format"), "0").await.unwrap();
        let e = RedisStore::connect(&peers::redis::url(&server))
            .await
            .unwrap_err();
        assert!(e.0.contains("layout \"0\""), "{e}");
        let other = RedisStore::connect_with_prefix(&peers::redis::url(&server), "elsewhere")
            .await
            .unwrap();
        assert!(other.load().await.unwrap().is_empty());
        let port = cobalt_test_support::ports::free_tcp_port(cobalt_test_support::ports::V4);
        let e = RedisStore::connect(&format!("redis://127.0.0.1:{port}/"))
            .await
            .unwrap_err();
        assert!(e.0.contains("is redis-server running?"), "{e}");
    }
}
