//! Proxying on Cobalt: a CoAP forward and reverse proxy (RFC 7252 §5.7) with a cache
//! shared by all fronts, and an HTTP→CoAP cross proxy (RFC 8075).
//!
//! A [`Proxy`] is what the fronts share: the [`ProxyConfig`] (allow-list of origins,
//! upstream timeout, reverse routes, bounds), the [`Cache`], the client that reaches
//! origins over every CoAP scheme, and the counters ([`ProxyMetrics`]). The fronts:
//!
//! - [`CoapFront::install`] puts the CoAP forward proxy on a [`cobalt::Server`] as its
//!   fallback, behind a layer that declares Proxy-Uri, Proxy-Scheme and Hop-Limit (so
//!   the server hands proxy requests on instead of answering 5.05), and one route per
//!   reverse route. Block-wise transfers and observe relations on the downstream side
//!   are the server's own.
//! - [`HttpFront`] serves HTTP/1.1 and HTTP/2 on hyper and maps each request to CoAP
//!   (RFC 8075): `/hc/coap://host/path`, or `/hc?target_uri=...`.
//! - The other way, a CoAP request naming an `http://` or `https://` origin is sent
//!   over HTTP/1.1 ([`Proxy::forward_http`], [`coap_code`] for the status); an
//!   `https` origin's certificate must chain to [`ProxyConfig::https_trust`] (the
//!   webpki roots and CA files added), or the answer is 5.02 saying why.
//!
//! ```
//! use cobalt::proto::message::opt;
//! use cobalt::server::get;
//! use cobalt::{Client, Code, Scheme, Server};
//! use cobalt_proxy::{AllowList, CoapFront, Proxy, ProxyConfig};
//! use std::time::Duration;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> cobalt::Result<()> {
//! let origin = Server::new()
//!     .route("/temp", get(|| async { "21.5" }))
//!     .bind("127.0.0.1:0")
//!     .await?;
//! let origin_addr = origin.local_addr(Scheme::Coap).unwrap();
//!
//! let proxy = Proxy::new(ProxyConfig {
//!     allow: AllowList::parse(["127.0.0.1"]).expect("a valid pattern"),
//!     ..ProxyConfig::default()
//! });
//! let front = CoapFront::new(proxy.clone());
//! let server = front.install(Server::new()).bind("127.0.0.1:0").await?;
//! let proxy_addr = server.local_addr(Scheme::Coap).unwrap();
//!
//! let client = Client::new();
//! for _ in 0..2 {
//!     let answer = client
//!         .request(Code::GET, &format!("coap://{proxy_addr}/"))
//!         .option(opt::PROXY_URI, format!("coap://{origin_addr}/temp"))
//!         .send()
//!         .await?;
//!     assert_eq!(answer.text_payload(), "21.5");
//! }
//! // The second answer came from the cache.
//! assert_eq!(proxy.metrics().cache_hits.load(std::sync::atomic::Ordering::Relaxed), 1);
//! server.shutdown(Duration::ZERO).await;
//! origin.shutdown(Duration::ZERO).await;
//! # Ok(()) }
//! ```
//!
//! What a proxy must refuse it refuses with the RFCs' codes: an origin outside the
//! allow-list (empty by default: an open proxy is an attack tool) 5.05 over CoAP and
//! 403 over HTTP; an unreachable origin 5.02 / 502, a silent one 5.04 / 504; a
//! Proxy-Uri over 1,034 bytes 4.02, a malformed one 4.00; a request whose Hop-Limit
//! (RFC 8768) runs out 5.08 with the proxy's identity. Every table is bounded: cache
//! bytes, upstream exchanges and observations, CoAP observers per observation, HTTP
//! connections, streams, header and body sizes and times.
#![warn(missing_docs)]

mod allow;
mod cache;
mod clock;
mod coap;
mod core;
mod exporter;
mod hop;
mod http;
mod http_origin;
mod https;
mod listeners;
mod mapping;
mod metrics;
mod observe;
mod target;

pub use allow::{AllowList, BadPattern, OriginPattern};
pub use cache::{
    cacheable_code, cacheable_method, Cache, CacheKey, CacheLimits, Lookup, DEFAULT_MAX_AGE,
};
pub use clock::{Clock, ManualClock, SystemClock};
pub use coap::CoapFront;
pub use core::{end_to_end_request_option, Proxy, ProxyConfig, ProxyError, ReverseRoute, Upstream};
pub use exporter::{serve_metrics, MetricsEndpoint, Render};
pub use hop::{next_hop_limit, set_hop_limit, DEFAULT_HOP_LIMIT, HOP_LIMIT, HOP_LIMIT_REACHED};
pub use http::{HttpConfig, HttpFront, HttpServer};
pub use http_origin::{coap_code, http_target, HttpTarget};
pub use https::{BadCa, HttpsTrust};
pub use mapping::{coap_etag, coap_method, content_format, http_etag, http_status, media_type};
pub use metrics::ProxyMetrics;
pub use target::{
    forward_target, is_proxy_request, reverse_target, uri_string, Refused, MAX_PROXY_URI,
};
