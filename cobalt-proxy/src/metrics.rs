//! The proxy's counters (cache hits and misses, revalidations, upstream latency and
//! errors, shared observations) and their Prometheus text exposition, next to the
//! server's own ([`cobalt::metrics`]).

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

/// Upper bounds of the upstream latency histogram's buckets, in seconds.
const LATENCY_BUCKETS: [f64; 10] = [0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 5.0, 30.0];

/// Counters of one proxy, over all its fronts. Relaxed atomics: cheap to bump.
#[derive(Debug, Default)]
pub struct ProxyMetrics {
    /// Requests answered through the CoAP front.
    pub coap_requests: AtomicU64,
    /// Requests answered through the HTTP front.
    pub http_requests: AtomicU64,
    /// Answers served from the cache without asking the origin.
    pub cache_hits: AtomicU64,
    /// Cacheable requests that had to ask the origin.
    pub cache_misses: AtomicU64,
    /// Cacheable requests answered with the answer to the same request on its way
    /// to the origin when they came.
    pub coalesced: AtomicU64,
    /// Stale entries the origin was asked to validate (ETag).
    pub revalidations: AtomicU64,
    /// Of those, the ones the origin confirmed (2.03 Valid).
    pub revalidated: AtomicU64,
    /// Requests refused before reaching an origin (allow-list, bad target, Hop-Limit).
    pub refused: AtomicU64,
    /// Origins that could not be reached (answered 5.02 / 502).
    pub upstream_unreachable: AtomicU64,
    /// Origins that did not answer in time (answered 5.04 / 504).
    pub upstream_timeouts: AtomicU64,
    /// Upstream observations open now (each shared by its downstream observers).
    pub upstream_observations: AtomicU64,
    latency_buckets: [AtomicU64; LATENCY_BUCKETS.len()],
    latency_count: AtomicU64,
    latency_micros: AtomicU64,
}

impl ProxyMetrics {
    /// Records one upstream exchange that took `took`.
    pub fn upstream_latency(&self, took: Duration) {
        let secs = took.as_secs_f64();
        for (bound, count) in LATENCY_BUCKETS.iter().zip(&self.latency_buckets) {
            if secs <= *bound {
                count.fetch_add(1, Relaxed);
            }
        }
        self.latency_count.fetch_add(1, Relaxed);
        let micros = u64::try_from(took.as_micros()).unwrap_or(u64::MAX);
        self.latency_micros.fetch_add(micros, Relaxed);
    }

    /// Upstream exchanges measured so far.
    pub fn upstream_exchanges(&self) -> u64 {
        self.latency_count.load(Relaxed)
    }

    /// The counters in the Prometheus text format (families `cobalt_proxy_*`).
    pub fn render_prometheus(&self) -> String {
        let mut out = String::new();
        let counters: [(&str, &str, &AtomicU64); 10] = [
            (
                "cobalt_proxy_requests_total{front=\"coap\"}",
                "Requests answered, by front.",
                &self.coap_requests,
            ),
            (
                "cobalt_proxy_requests_total{front=\"http\"}",
                "",
                &self.http_requests,
            ),
            (
                "cobalt_proxy_cache_hits_total",
                "Answers served from the cache.",
                &self.cache_hits,
            ),
            (
                "cobalt_proxy_coalesced_total",
                "Cache misses answered with the answer to the same request already on its way.",
                &self.coalesced,
            ),
            (
                "cobalt_proxy_cache_misses_total",
                "Cacheable requests sent to the origin.",
                &self.cache_misses,
            ),
            (
                "cobalt_proxy_revalidations_total",
                "Stale entries sent to the origin for validation.",
                &self.revalidations,
            ),
            (
                "cobalt_proxy_revalidated_total",
                "Stale entries the origin confirmed (2.03).",
                &self.revalidated,
            ),
            (
                "cobalt_proxy_refused_total",
                "Requests refused before reaching an origin.",
                &self.refused,
            ),
            (
                "cobalt_proxy_upstream_errors_total{kind=\"unreachable\"}",
                "Origins unreachable or silent.",
                &self.upstream_unreachable,
            ),
            (
                "cobalt_proxy_upstream_errors_total{kind=\"timeout\"}",
                "",
                &self.upstream_timeouts,
            ),
        ];
        for (name, help, value) in counters {
            let family = name.split('{').next().unwrap_or(name);
            if !help.is_empty() {
                let _ = writeln!(out, "# HELP {family} {help}\n# TYPE {family} counter");
            }
            let _ = writeln!(out, "{name} {}", value.load(Relaxed));
        }
        let _ = writeln!(
            out,
            "# HELP cobalt_proxy_upstream_observations Upstream observations open now.\n# TYPE cobalt_proxy_upstream_observations gauge\ncobalt_proxy_upstream_observations {}",
            self.upstream_observations.load(Relaxed)
        );
        let family = "cobalt_proxy_upstream_latency_seconds";
        let _ = writeln!(
            out,
            "# HELP {family} Time to the origin's whole answer.\n# TYPE {family} histogram"
        );
        for (bound, count) in LATENCY_BUCKETS.iter().zip(&self.latency_buckets) {
            let _ = writeln!(
                out,
                "{family}_bucket{{le=\"{bound}\"}} {}",
                count.load(Relaxed)
            );
        }
        let total = self.latency_count.load(Relaxed);
        let _ = writeln!(out, "{family}_bucket{{le=\"+Inf\"}} {total}");
        let sum = self.latency_micros.load(Relaxed) as f64 / 1e6;
        let _ = writeln!(out, "{family}_sum {sum}\n{family}_count {total}");
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_exposition_has_every_family_and_the_histogram_adds_up() {
        let m = ProxyMetrics::default();
        m.cache_hits.fetch_add(3, Relaxed);
        m.upstream_latency(Duration::from_millis(3));
        m.upstream_latency(Duration::from_secs(2));
        let text = m.render_prometheus();
        assert!(text.contains("cobalt_proxy_cache_hits_total 3\n"), "{text}");
        assert!(text.contains("cobalt_proxy_upstream_latency_seconds_bucket{le=\"0.005\"} 1\n"));
        assert!(text.contains("cobalt_proxy_upstream_latency_seconds_bucket{le=\"5\"} 2\n"));
        assert!(text.contains("cobalt_proxy_upstream_latency_seconds_count 2\n"));
        assert_eq!(
            text.matches("# TYPE cobalt_proxy_requests_total").count(),
            1
        );
    }
}
