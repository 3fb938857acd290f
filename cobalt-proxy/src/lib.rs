//! Proxying on Cobalt: a CoAP forward and reverse proxy (RFC 7252 §5.7) with a cache
//! shared by all fronts, and an HTTP→CoAP cross proxy (RFC 8075).
#![warn(missing_docs)]

mod allow;
mod cache;
mod clock;
mod coap;
mod core;
mod exporter;
mod hop;
mod http;
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
pub use mapping::{coap_etag, coap_method, content_format, http_etag, http_status, media_type};
pub use metrics::ProxyMetrics;
pub use target::{
    forward_target, is_proxy_request, reverse_target, uri_string, Refused, MAX_PROXY_URI,
};
