//! What every front shares: the allow-list check, the cache, the upstream exchange
//! through one [`cobalt::Client`] (every CoAP scheme; it completes block-wise
//! transfers both ways), the mapping of origin failures, and the counters.

use crate::allow::AllowList;
use crate::cache::{cacheable_method, Cache, CacheKey, CacheLimits, Lookup};
use crate::clock::{Clock, SystemClock};
use crate::hop::HOP_LIMIT;
use crate::https::HttpsTrust;
use crate::listeners::Observations;
use crate::metrics::ProxyMetrics;
use crate::target::{uri_string, Refused};
use cobalt::proto::message::{opt, Code, Options};
use cobalt::proto::uri::CoapUri;
use cobalt::transport::credentials::ClientCredentials;
use cobalt::{Client, EndpointConfig, Error, Response};
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::AtomicUsize;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{watch, Semaphore};

/// How a proxy behaves: which origins it reaches, how long it waits for them, what
/// it caches, which path prefixes it serves as a reverse proxy.
#[derive(Debug, Clone)]
pub struct ProxyConfig {
    /// Origins that may be reached (empty: none; see [`AllowList`]).
    pub allow: AllowList,
    /// The proxy's name in 5.08 Hop Limit Reached answers (RFC 8768 §4).
    pub identity: String,
    /// How long an origin has to answer (whole answer, all blocks) before the proxy
    /// answers 5.04 / 504. Shorter than a CoAP client's own patience (93 s over UDP).
    pub upstream_timeout: Duration,
    /// Upstream exchanges in progress at once; beyond, requests are answered 5.03 /
    /// 503 with Max-Age 1.
    pub max_upstream: usize,
    /// Upstream observations open at once (each shared by all its downstream
    /// observers); beyond, new ones are answered 5.03 / 503.
    pub max_observations: usize,
    /// Downstream CoAP observers remembered per upstream observation.
    pub max_observers_per_observation: usize,
    /// The cache's bounds.
    pub cache: CacheLimits,
    /// Reverse routes: requests under a path prefix go to an origin URI.
    pub reverse: Vec<ReverseRoute>,
    /// Client endpoints (each its own socket and message-ID space) that
    /// [`Proxy::new`] makes, used in turn. A CoAP endpoint may send one origin at
    /// most 65,536 messages per EXCHANGE_LIFETIME (247 s, RFC 7252 §4.4) before it
    /// must wait for IDs: about 265 requests per second for long. A proxy speaks for
    /// many clients, so it spreads them over several endpoints.
    pub upstream_endpoints: usize,
    /// Requests each endpoint has outstanding at one origin before further ones queue
    /// (NSTART, RFC 7252 §4.7). With the RFC's default of 1, every client of one
    /// origin would wait behind the others, and a request that loops back through
    /// the proxy would wait for the one it is part of.
    pub upstream_nstart: usize,
    /// How the clients [`Proxy::new`] makes authenticate to `coaps`, `coaps+tcp` and
    /// `coaps+ws` origins (a PSK or certificates); without, such origins fail (5.02)
    /// saying that credentials are missing.
    pub upstream_credentials: Option<ClientCredentials>,
    /// The certificate authorities `https` origins' certificates must chain to (CoAP
    /// → HTTPS); by default the webpki roots.
    pub https_trust: HttpsTrust,
}

impl Default for ProxyConfig {
    fn default() -> Self {
        ProxyConfig {
            allow: AllowList::new(),
            identity: "cobalt-proxy".into(),
            upstream_timeout: Duration::from_secs(20),
            max_upstream: 4096,
            max_observations: 1000,
            max_observers_per_observation: 10_000,
            cache: CacheLimits::default(),
            reverse: Vec::new(),
            upstream_endpoints: 8,
            upstream_nstart: 4,
            upstream_credentials: None,
            https_trust: HttpsTrust::default(),
        }
    }
}

/// A path prefix served as a reverse proxy for an origin: `/sensors` →
/// `coap://10.0.0.7/s` sends `/sensors/temp?u=c` to `coap://10.0.0.7/s/temp?u=c`.
/// The origin is reached whatever the allow-list says (the operator named it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReverseRoute {
    /// The path prefix (`/sensors`), whole segments.
    pub prefix: String,
    /// The origin's base URI.
    pub origin: CoapUri,
}

impl std::str::FromStr for ReverseRoute {
    type Err = String;

    /// Parses `PREFIX=URI`, e.g. `/sensors=coap://10.0.0.7/s`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (prefix, uri) = s.split_once('=').ok_or_else(|| {
            format!("reverse route '{s}': write PREFIX=URI, e.g. /sensors=coap://10.0.0.7/s")
        })?;
        let prefix = format!("/{}", prefix.trim_matches('/'));
        if prefix.contains(['{', '}']) {
            return Err(format!(
                "reverse route '{s}': the prefix is literal path segments"
            ));
        }
        let origin = CoapUri::parse(uri).map_err(|e| format!("reverse route '{s}': {e}"))?;
        Ok(ReverseRoute { prefix, origin })
    }
}

/// Why a request was not answered by an origin.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProxyError {
    /// The request names no target this proxy serves (bad Proxy-Uri, scheme not
    /// proxied, Hop-Limit reached): answered with the refusal's code.
    #[error("{}", .0.reason)]
    Refused(Refused),
    /// The origin is not in the allow-list.
    #[error("origin {origin} is not in this proxy's allow-list (--allow)")]
    Forbidden {
        /// The origin as `host:port`.
        origin: String,
    },
    /// The origin could not be reached, or answered with something unusable.
    #[error("origin unreachable: {0}")]
    Unreachable(String),
    /// The origin did not answer in time.
    #[error("origin did not answer in time: {0}")]
    Timeout(String),
    /// The proxy has as many upstream exchanges or observations open as allowed.
    #[error("the proxy is busy ({0}); try again shortly")]
    Busy(&'static str),
}

impl ProxyError {
    /// The CoAP answer: the refusal's code; 5.05 for a forbidden origin (RFC 7252
    /// §5.7.2: a proxy unwilling to serve a Proxy-Uri answers 5.05); 5.02 for an
    /// unreachable origin, 5.04 for a silent one (§5.9.3.3, §5.9.3.5); 5.03 with
    /// Max-Age 1 when busy. The payload says what happened.
    pub fn to_response(&self) -> Response {
        let code = match self {
            ProxyError::Refused(r) => r.code,
            ProxyError::Forbidden { .. } => Code::PROXYING_NOT_SUPPORTED,
            ProxyError::Unreachable(_) => Code::BAD_GATEWAY,
            ProxyError::Timeout(_) => Code::GATEWAY_TIMEOUT,
            ProxyError::Busy(_) => Code::SERVICE_UNAVAILABLE,
        };
        let mut r = Response::new(code).with_payload(self.to_string());
        if matches!(self, ProxyError::Busy(_)) {
            r = r.with_max_age(1);
        }
        r
    }
}

impl From<Refused> for ProxyError {
    fn from(r: Refused) -> Self {
        ProxyError::Refused(r)
    }
}

/// One request to send to an origin, as a front made it.
#[derive(Debug, Clone)]
pub struct Upstream {
    /// The method.
    pub method: Code,
    /// The origin's URI.
    pub target: CoapUri,
    /// The end-to-end options to send (the target's Uri-* and hop-by-hop options are
    /// set by the proxy).
    pub options: Options,
    /// The body (whole; sent block-wise when large).
    pub payload: Vec<u8>,
    /// The Hop-Limit to send (RFC 8768).
    pub hop_limit: u8,
    /// Reached through a reverse route (the allow-list does not apply).
    pub reverse: bool,
}

/// Whether a request option is copied to the origin: not the target's own (the URI
/// says it), not hop-by-hop (Block1/2, Size1/2, Observe, Echo, Request-Tag and
/// Hop-Limit are the proxy's business on each side).
pub fn end_to_end_request_option(number: u16) -> bool {
    !matches!(
        number,
        opt::URI_HOST
            | opt::URI_PORT
            | opt::URI_PATH
            | opt::URI_QUERY
            | opt::PROXY_URI
            | opt::PROXY_SCHEME
            | opt::BLOCK1
            | opt::BLOCK2
            | opt::SIZE1
            | opt::SIZE2
            | opt::OBSERVE
            | opt::ECHO
            | opt::REQUEST_TAG
            | HOP_LIMIT
    )
}

/// `response`'s options that go back to the client: without the hop-by-hop ones the
/// server sets itself (Block1/2, Size1/2, Observe, Echo, Request-Tag) and without
/// options unsafe to forward that this proxy does not know (RFC 7252 §5.7.1).
pub(crate) fn strip_hop_by_hop(response: &mut Response) {
    let mut kept = Options::new();
    for o in response.options.iter() {
        let hop = matches!(
            o.number,
            opt::BLOCK1
                | opt::BLOCK2
                | opt::SIZE1
                | opt::SIZE2
                | opt::OBSERVE
                | opt::ECHO
                | opt::REQUEST_TAG
        );
        let unknown_unsafe = cobalt::proto::message::option::option_def(o.number).is_none()
            && cobalt::proto::message::option::is_unsafe(o.number);
        if !hop && !unknown_unsafe {
            kept.push(o.number, o.value);
        }
    }
    response.options = kept;
}

pub(crate) struct Shared {
    pub config: ProxyConfig,
    pub cache: Cache,
    pub metrics: ProxyMetrics,
    /// The clients that reach origins, used in turn.
    pub clients: Vec<Client>,
    /// Which client the next request takes.
    pub next_client: AtomicUsize,
    /// Cacheable requests on their way to the origin (by key and Hop-Limit), and
    /// their answer once it came.
    pub inflight: Mutex<HashMap<(CacheKey, u8), Answer>>,
    pub permits: Semaphore,
    pub observations: Observations,
    /// The TLS client settings for `https` origins (from [`ProxyConfig::https_trust`]).
    pub https: Arc<rustls::ClientConfig>,
}

/// A proxy's shared part: configuration, cache, upstream client and counters, used by
/// every front ([`CoapFront`](crate::CoapFront), [`HttpFront`](crate::HttpFront)).
/// Cheap to clone (clones share everything).
#[derive(Clone)]
pub struct Proxy {
    pub(crate) shared: Arc<Shared>,
}

impl std::fmt::Debug for Proxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Proxy")
            .field("config", &self.shared.config)
            .field("cache", &self.shared.cache)
            .finish()
    }
}

impl Proxy {
    /// A proxy with `config`, the system clock and
    /// [`ProxyConfig::upstream_endpoints`] new clients (1 to 64), each with NSTART
    /// [`ProxyConfig::upstream_nstart`] (1 to 1024).
    pub fn new(config: ProxyConfig) -> Proxy {
        let endpoint = EndpointConfig {
            nstart: config.upstream_nstart.clamp(1, 1024),
            ..EndpointConfig::default()
        };
        let clients = (0..config.upstream_endpoints.clamp(1, 64))
            .map(|_| {
                let client = Client::with_config(endpoint.clone()).unwrap_or_else(|e| {
                    tracing::warn!(error = %e, "the proxy's client keeps the default settings");
                    Client::new()
                });
                match &config.upstream_credentials {
                    Some(ClientCredentials::Psk(psk)) => {
                        client.with_psk(psk.identity.clone(), psk.key.clone())
                    }
                    Some(ClientCredentials::X509(x509)) => client.with_x509(x509.clone()),
                    None => client,
                }
            })
            .collect();
        Proxy::build(config, Arc::new(SystemClock::default()), clients)
    }

    /// A proxy with `config` that reads time from `clock` (the cache's freshness) and
    /// reaches origins with `client` alone (give one with credentials for `coaps`
    /// origins; [`ProxyConfig::upstream_endpoints`] and `upstream_nstart` are then the
    /// client's business).
    pub fn with_parts(config: ProxyConfig, clock: Arc<dyn Clock>, client: Client) -> Proxy {
        Proxy::build(config, clock, vec![client])
    }

    fn build(config: ProxyConfig, clock: Arc<dyn Clock>, clients: Vec<Client>) -> Proxy {
        let cache = Cache::new(config.cache, clock);
        let permits = Semaphore::new(config.max_upstream.max(1));
        let https = config.https_trust.client_config();
        Proxy {
            shared: Arc::new(Shared {
                config,
                cache,
                metrics: ProxyMetrics::default(),
                clients,
                next_client: AtomicUsize::new(0),
                inflight: Mutex::default(),
                permits,
                observations: Observations::default(),
                https,
            }),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &ProxyConfig {
        &self.shared.config
    }

    /// The cache all fronts share.
    pub fn cache(&self) -> &Cache {
        &self.shared.cache
    }

    /// The counters.
    pub fn metrics(&self) -> &ProxyMetrics {
        &self.shared.metrics
    }

    /// Upstream observations open now.
    pub fn observations(&self) -> usize {
        self.shared.observations.len()
    }

    /// Checks `target` against the allow-list (a reverse route's origin is always
    /// allowed) and returns the URI to send to: for a plain-transport origin named by
    /// a host name, the address it resolved to (so that the address checked is the
    /// one reached) and the name for Uri-Host.
    pub(crate) async fn admit(
        &self,
        target: &CoapUri,
        reverse: bool,
    ) -> Result<(CoapUri, Option<String>), ProxyError> {
        let allow = &self.shared.config.allow;
        if let Some(ip) = target.ip() {
            if !reverse && !allow.allows(&target.host, Some(ip), target.port) {
                return Err(self.forbidden(target));
            }
            return Ok((target.clone(), None));
        }
        // Names: refused before resolving when no name pattern can match and no
        // network pattern could either.
        if !reverse && !allow.may_allow_name(&target.host, target.port) {
            return Err(self.forbidden(target));
        }
        let lookup = tokio::net::lookup_host((target.host.as_str(), target.port));
        let ip: IpAddr =
            match tokio::time::timeout(self.shared.config.upstream_timeout, lookup).await {
                Ok(Ok(mut addrs)) => match addrs.next() {
                    Some(a) => a.ip(),
                    None => return Err(self.unreachable(format!("{} has no address", target.host))),
                },
                Ok(Err(e)) => {
                    return Err(self.unreachable(format!("cannot resolve {}: {e}", target.host)))
                }
                Err(_) => return Err(self.timeout(format!("resolving {}", target.host))),
            };
        if !reverse && !allow.allows(&target.host, Some(ip), target.port) {
            return Err(self.forbidden(target));
        }
        if target.scheme.is_secure() {
            // The handshake checks the name: keep it.
            return Ok((target.clone(), None));
        }
        let mut to = target.clone();
        to.host = ip.to_string();
        Ok((to, Some(target.host.clone())))
    }

    fn forbidden(&self, target: &CoapUri) -> ProxyError {
        self.forbidden_origin(&target.host, target.port)
    }

    /// The refusal of the origin `host` on `port` (not in the allow-list), counted.
    pub(crate) fn forbidden_origin(&self, host: &str, port: u16) -> ProxyError {
        self.shared.metrics.refused.fetch_add(1, Relaxed);
        ProxyError::Forbidden {
            origin: format!("{host}:{port}"),
        }
    }

    fn unreachable(&self, why: String) -> ProxyError {
        self.shared
            .metrics
            .upstream_unreachable
            .fetch_add(1, Relaxed);
        ProxyError::Unreachable(why)
    }

    fn timeout(&self, why: String) -> ProxyError {
        self.shared.metrics.upstream_timeouts.fetch_add(1, Relaxed);
        ProxyError::Timeout(why)
    }

    /// The failure `e` of an exchange with `target`, counted.
    pub(crate) fn upstream_error(&self, target: &CoapUri, e: &Error) -> ProxyError {
        let what = format!("{}: {e}", uri_string(target));
        match e {
            Error::Timeout { .. } | Error::Deadline(_) => self.timeout(what),
            _ => self.unreachable(what),
        }
    }

    /// The request to send for `up` to `to` (the admitted URI), with `name` as
    /// Uri-Host when the URI holds an address.
    pub(crate) fn request(
        &self,
        up: &Upstream,
        to: &CoapUri,
        name: Option<&str>,
    ) -> cobalt::RequestBuilder {
        let turn = self.shared.next_client.fetch_add(1, Relaxed);
        let client = &self.shared.clients[turn % self.shared.clients.len()];
        let mut builder = client
            .request(up.method, &uri_string(to))
            .timeout(self.shared.config.upstream_timeout);
        if let Some(name) = name {
            builder = builder.option(opt::URI_HOST, name);
        }
        for o in up.options.iter() {
            if end_to_end_request_option(o.number) {
                builder = builder.option(o.number, o.value);
            }
        }
        builder = builder.option(HOP_LIMIT, [up.hop_limit]);
        if !up.payload.is_empty() {
            builder = builder.payload(up.payload.clone());
        }
        builder
    }

    /// Answers `up`: from the cache when a fresh answer is stored (2.03 Valid when the
    /// client already holds it, by ETag), else from the origin — revalidating a stale
    /// answer with its ETag, storing what may be cached. The answer carries only
    /// end-to-end options; origin failures are [`ProxyError`]s.
    pub async fn forward(&self, up: Upstream) -> Result<Response, ProxyError> {
        let key = cacheable_method(up.method)
            .then(|| CacheKey::new(up.method, &up.target, &up.options, &up.payload));
        let client_etags: Vec<Vec<u8>> =
            up.options.get_all(opt::ETAG).map(<[u8]>::to_vec).collect();
        let mut stale_etag = None;
        if let Some(key) = &key {
            match self.shared.cache.lookup(key) {
                Lookup::Fresh(response) => {
                    self.shared.metrics.cache_hits.fetch_add(1, Relaxed);
                    return Ok(answer_for(response, &client_etags));
                }
                Lookup::Stale { etag } => {
                    self.shared.metrics.revalidations.fetch_add(1, Relaxed);
                    stale_etag = Some(etag);
                }
                Lookup::Miss => {
                    self.shared.metrics.cache_misses.fetch_add(1, Relaxed);
                }
            }
        }
        // Requests for the same key while one is on its way wait for its answer
        // instead of asking the origin again (not those that carry their own ETags:
        // the answer to one client's validators is not another's; none when the cache
        // is off: then every request reaches the origin). The Hop-Limit is
        // part of what must match: a request that came back through a loop must not
        // wait for the one it is part of.
        let Some(key) = key else {
            return self.fetch(&up, None, None, &client_etags).await;
        };
        if !client_etags.is_empty() || self.shared.config.cache.max_bytes == 0 {
            return self.fetch(&up, Some(key), stale_etag, &client_etags).await;
        }
        let leader = {
            let mut inflight = self
                .shared
                .inflight
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            let waiting_for = (key.clone(), up.hop_limit);
            match inflight.get(&waiting_for) {
                Some(answer) => Err(answer.subscribe()),
                None => {
                    let (tx, _) = watch::channel(None);
                    inflight.insert(waiting_for.clone(), tx);
                    Ok(Inflight {
                        proxy: self.clone(),
                        key: waiting_for,
                    })
                }
            }
        };
        match leader {
            Ok(guard) => {
                let result = self.fetch(&up, Some(key), stale_etag, &client_etags).await;
                guard.finish(&result);
                result
            }
            Err(mut answer) => {
                self.shared.metrics.coalesced.fetch_add(1, Relaxed);
                let answered = answer
                    .wait_for(Option::is_some)
                    .await
                    .ok()
                    .and_then(|result| result.clone());
                match answered {
                    Some(result) => result,
                    // The request it waited for was abandoned: ask for itself.
                    None => self.fetch(&up, Some(key), stale_etag, &client_etags).await,
                }
            }
        }
    }

    /// Asks the origin for `up` (with the stored `stale_etag` to revalidate, if any),
    /// and stores under `key` what may be cached.
    async fn fetch(
        &self,
        up: &Upstream,
        key: Option<CacheKey>,
        stale_etag: Option<Vec<u8>>,
        client_etags: &[Vec<u8>],
    ) -> Result<Response, ProxyError> {
        let (to, name) = self.admit(&up.target, up.reverse).await?;
        let _permit = self
            .shared
            .permits
            .try_acquire()
            .map_err(|_| ProxyError::Busy("upstream exchanges"))?;
        let mut builder = self.request(up, &to, name.as_deref());
        if let Some(etag) = &stale_etag {
            if !client_etags.contains(etag) {
                builder = builder.option(opt::ETAG, etag);
            }
        }
        let started = Instant::now();
        let result = builder.send().await;
        self.shared.metrics.upstream_latency(started.elapsed());
        let mut response = result.map_err(|e| self.upstream_error(&up.target, &e))?;
        strip_hop_by_hop(&mut response);
        let Some(key) = key else {
            if matches!(response.code, Code::CREATED | Code::CHANGED | Code::DELETED) {
                self.shared.cache.invalidate(&up.target);
            }
            return Ok(response);
        };
        if response.code == Code::VALID && stale_etag.is_some() {
            if let Some(refreshed) = self.shared.cache.refresh(&key, &response) {
                self.shared.metrics.revalidated.fetch_add(1, Relaxed);
                return Ok(answer_for(refreshed, client_etags));
            }
        }
        self.shared.cache.store(key, &response);
        Ok(response)
    }
}

/// The request under `key` (and Hop-Limit) that others wait for; takes itself out of the table when
/// done or abandoned (dropped), so that nobody waits for it in vain.
struct Inflight {
    proxy: Proxy,
    key: (CacheKey, u8),
}

impl Inflight {
    /// Hands `result` to those waiting.
    fn finish(self, result: &Result<Response, ProxyError>) {
        let inflight = self
            .proxy
            .shared
            .inflight
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if let Some(tx) = inflight.get(&self.key) {
            tx.send_replace(Some(result.clone()));
        }
    }
}

impl Drop for Inflight {
    fn drop(&mut self) {
        let mut inflight = self
            .proxy
            .shared
            .inflight
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        inflight.remove(&self.key);
    }
}

/// Where the answer to a request on its way goes, for those waiting for it.
type Answer = watch::Sender<Option<Result<Response, ProxyError>>>;

/// A stored `response` for a client that holds `etags`: 2.03 Valid with the ETag and
/// Max-Age when one of them is the response's (RFC 7252 §5.10.6.2), else the response.
fn answer_for(response: Response, etags: &[Vec<u8>]) -> Response {
    match response.options.get(opt::ETAG) {
        Some(etag) if response.code == Code::CONTENT && etags.iter().any(|e| e == etag) => {
            let mut valid = Response::new(Code::VALID).with_etag(etag);
            if let Some(age) = response.options.get_uint(opt::MAX_AGE) {
                valid = valid.with_max_age(age);
            }
            valid
        }
        _ => response,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reverse_routes_parse_prefix_and_origin() {
        let r: ReverseRoute = "sensors/=coap://10.0.0.7/s".parse().unwrap();
        assert_eq!(r.prefix, "/sensors");
        assert_eq!(r.origin.path, ["s"]);
        assert!("/x"
            .parse::<ReverseRoute>()
            .unwrap_err()
            .contains("PREFIX=URI"));
        assert!("/x=http://h/".parse::<ReverseRoute>().is_err());
    }

    #[test]
    fn a_client_holding_the_etag_gets_2_03() {
        let stored = Response::content("x").with_etag(b"e").with_max_age(9);
        let r = answer_for(stored.clone(), &[b"e".to_vec()]);
        assert_eq!(r.code, Code::VALID);
        assert!(r.payload.is_empty());
        assert_eq!(r.options.get_uint(opt::MAX_AGE), Some(9));
        assert_eq!(answer_for(stored, &[b"f".to_vec()]).code, Code::CONTENT);
    }

    #[test]
    fn hop_by_hop_and_unknown_unsafe_options_are_not_forwarded() {
        let mut r = Response::content("x").with_etag(b"e");
        r.options.set_uint(opt::BLOCK2, 6);
        r.options.set_uint(opt::OBSERVE, 3);
        r.options.set(2050, b"u"); // unknown, unsafe (bit 1 set)
        r.options.set(2052, b"s"); // unknown, safe to forward
        strip_hop_by_hop(&mut r);
        assert!(r.options.contains(opt::ETAG));
        assert!(!r.options.contains(opt::BLOCK2) && !r.options.contains(opt::OBSERVE));
        assert!(!r.options.contains(2050));
        assert!(r.options.contains(2052));
        assert!(!end_to_end_request_option(opt::PROXY_URI));
        assert!(end_to_end_request_option(opt::ACCEPT));
    }
}
