//! Counters and latency histograms: one [`Recorder`] per load-generator thread, merged
//! into a [`StepResult`] per concurrency step.

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Highest latency the histogram tracks, in nanoseconds (one hour); larger values saturate.
const MAX_LATENCY_NS: u64 = 3_600_000_000_000;

/// The code of an answer: a CoAP response code (the byte, class and detail) or an
/// HTTP status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum AnswerCode {
    /// A CoAP response code, e.g. `0xa3` for 5.03.
    Coap(u8),
    /// An HTTP status, e.g. 503.
    Http(u16),
}

impl AnswerCode {
    /// 2.xx (CoAP) or 2xx (HTTP): the only answers that count as completed requests.
    pub fn is_success(self) -> bool {
        match self {
            AnswerCode::Coap(c) => c >> 5 == 2,
            AnswerCode::Http(s) => (200..300).contains(&s),
        }
    }
}

impl std::fmt::Display for AnswerCode {
    /// `5.03` for CoAP, `503` for HTTP.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AnswerCode::Coap(c) => write!(f, "{}.{:02}", c >> 5, c & 0x1f),
            AnswerCode::Http(s) => write!(f, "{s}"),
        }
    }
}

/// What one load-generator thread counted during the measured window.
#[derive(Debug, Clone)]
pub struct Recorder {
    /// Requests sent.
    pub sent: u64,
    /// Requests answered with a success (CoAP 2.xx, HTTP 2xx).
    pub completed: u64,
    /// Requests answered with any other code, by code (e.g. 5.03 from an overloaded
    /// server). They are not completed and their latency is not recorded.
    pub other_codes: BTreeMap<AnswerCode, u64>,
    /// Requests unanswered after the timeout.
    pub lost: u64,
    /// Socket errors (e.g. ICMP port unreachable) and malformed datagrams.
    pub errors: u64,
    /// Requests answered with RST.
    pub resets: u64,
    /// Latency of completed requests, in nanoseconds.
    pub latency: Histogram<u64>,
}

impl Default for Recorder {
    fn default() -> Self {
        Recorder::new()
    }
}

impl Recorder {
    /// An empty recorder.
    pub fn new() -> Recorder {
        Recorder {
            sent: 0,
            completed: 0,
            other_codes: BTreeMap::new(),
            lost: 0,
            errors: 0,
            resets: 0,
            // 3 significant digits over 1 ns .. 1 h: fixed bounds, so `add` never fails.
            latency: Histogram::new_with_bounds(1, MAX_LATENCY_NS, 3)
                .expect("constant histogram bounds are valid"),
        }
    }

    /// Records one completed request that took `ns` nanoseconds.
    #[inline]
    pub fn complete(&mut self, ns: u64) {
        self.completed += 1;
        self.latency.saturating_record(ns.max(1));
    }

    /// Records an answer with `code` that took `ns` nanoseconds: a success completes
    /// the request, anything else is counted by its code.
    #[inline]
    pub fn answer(&mut self, code: AnswerCode, ns: u64) {
        if code.is_success() {
            self.complete(ns);
        } else {
            *self.other_codes.entry(code).or_default() += 1;
        }
    }

    /// Answers that were not a success, all codes together.
    pub fn other(&self) -> u64 {
        self.other_codes.values().sum()
    }

    /// Adds another recorder's counts into this one.
    pub fn merge(&mut self, other: &Recorder) {
        self.sent += other.sent;
        self.completed += other.completed;
        for (code, n) in &other.other_codes {
            *self.other_codes.entry(*code).or_default() += n;
        }
        self.lost += other.lost;
        self.errors += other.errors;
        self.resets += other.resets;
        // Same bounds on both sides, so this cannot fail; saturate defensively anyway.
        if self.latency.add(&other.latency).is_err() {
            for v in other.latency.iter_recorded() {
                self.latency
                    .saturating_record_n(v.value_iterated_to(), v.count_at_value());
            }
        }
    }
}

/// Server-side figures sampled from /proc for one step.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct ServerUsage {
    /// CPU time (user + system) the server used during the measured window, in seconds.
    pub cpu_s: f64,
    /// Resident set size at the end of the step, in KiB.
    pub rss_kb: Option<u64>,
}

/// The result of one concurrency step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepResult {
    /// Virtual clients.
    pub clients: usize,
    /// Measured seconds (shorter than requested when interrupted).
    pub duration_s: f64,
    /// Completed (2.xx) requests per second.
    pub requests_per_s: f64,
    /// Requests sent during the measured window.
    pub sent: u64,
    /// Requests answered with 2.xx (HTTP: 2xx).
    pub completed: u64,
    /// Requests answered with any other code (4.xx, 5.xx, ...): not completed.
    #[serde(default)]
    pub non_2xx: u64,
    /// [`StepResult::non_2xx`] by code, e.g. `{"5.03": 1234}` (HTTP: `{"503": 1234}`).
    #[serde(default)]
    pub non_2xx_codes: BTreeMap<String, u64>,
    /// Requests unanswered after the timeout.
    pub lost: u64,
    /// Socket errors and malformed datagrams.
    pub errors: u64,
    /// RST answers.
    pub resets: u64,
    /// Mean latency in microseconds.
    pub mean_us: f64,
    /// Median latency in microseconds.
    pub p50_us: f64,
    /// 90th percentile latency in microseconds.
    pub p90_us: f64,
    /// 99th percentile latency in microseconds.
    pub p99_us: f64,
    /// 99.9th percentile latency in microseconds.
    pub p999_us: f64,
    /// Largest latency in microseconds.
    pub max_us: f64,
    /// Server CPU microseconds per completed request (with `--server-pid`).
    pub server_cpu_us_per_req: Option<f64>,
    /// Server CPU utilisation in percent of one core (with `--server-pid`).
    pub server_cpu_percent: Option<f64>,
    /// Server resident set size at the end of the step, in KiB (with `--server-pid`).
    pub server_rss_kb: Option<u64>,
    /// CPU the load generator (this process) used, in percent of one core; near
    /// 100 × `--threads` it, not the server, limits the throughput. Not measured on
    /// `--workers`.
    pub client_cpu_percent: Option<f64>,
    /// True when the step was cut short by Ctrl-C.
    pub partial: bool,
}

impl StepResult {
    /// Summarises a merged recorder over `duration_s` measured seconds.
    pub fn from_recorder(
        clients: usize,
        duration_s: f64,
        rec: &Recorder,
        server: Option<ServerUsage>,
        partial: bool,
    ) -> StepResult {
        let h = &rec.latency;
        let us = |ns: u64| ns as f64 / 1000.0;
        let pct = |q: f64| {
            if h.is_empty() {
                0.0
            } else {
                us(h.value_at_quantile(q))
            }
        };
        let requests_per_s = if duration_s > 0.0 {
            rec.completed as f64 / duration_s
        } else {
            0.0
        };
        let (cpu_per_req, cpu_pct, rss) = match server {
            Some(s) => (
                (rec.completed > 0).then(|| s.cpu_s * 1e6 / rec.completed as f64),
                (duration_s > 0.0).then(|| s.cpu_s * 100.0 / duration_s),
                s.rss_kb,
            ),
            None => (None, None, None),
        };
        StepResult {
            clients,
            duration_s,
            requests_per_s,
            sent: rec.sent,
            completed: rec.completed,
            non_2xx: rec.other(),
            non_2xx_codes: rec
                .other_codes
                .iter()
                .map(|(c, n)| (c.to_string(), *n))
                .collect(),
            lost: rec.lost,
            errors: rec.errors,
            resets: rec.resets,
            mean_us: if h.is_empty() { 0.0 } else { h.mean() / 1000.0 },
            p50_us: pct(0.5),
            p90_us: pct(0.9),
            p99_us: pct(0.99),
            p999_us: pct(0.999),
            max_us: if h.is_empty() { 0.0 } else { us(h.max()) },
            server_cpu_us_per_req: cpu_per_req,
            server_cpu_percent: cpu_pct,
            server_rss_kb: rss,
            client_cpu_percent: None,
            partial,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= b.abs() * 0.002 + 1e-9
    }

    #[test]
    fn percentiles_of_uniform_latencies() {
        let mut r = Recorder::new();
        for i in 1..=1000u64 {
            r.complete(i * 1000); // 1 µs .. 1000 µs
        }
        let s = StepResult::from_recorder(4, 2.0, &r, None, false);
        assert_eq!(s.completed, 1000);
        assert!(close(s.requests_per_s, 500.0));
        assert!(close(s.p50_us, 500.0), "{}", s.p50_us);
        assert!(close(s.p90_us, 900.0), "{}", s.p90_us);
        assert!(close(s.p99_us, 990.0), "{}", s.p99_us);
        assert!(close(s.p999_us, 999.0), "{}", s.p999_us);
        assert!(close(s.max_us, 1000.0), "{}", s.max_us);
        assert!(close(s.mean_us, 500.5), "{}", s.mean_us);
        assert_eq!(s.server_cpu_us_per_req, None);
    }

    #[test]
    fn merge_adds_counts_and_histograms() {
        let mut a = Recorder::new();
        let mut b = Recorder::new();
        a.sent = 3;
        a.lost = 1;
        a.complete(10_000);
        b.sent = 2;
        b.errors = 4;
        b.resets = 5;
        b.complete(20_000);
        b.complete(u64::MAX); // saturates instead of failing
        a.merge(&b);
        assert_eq!(
            (a.sent, a.completed, a.lost, a.errors, a.resets),
            (5, 3, 1, 4, 5)
        );
        assert_eq!(a.latency.len(), 3);
        assert!(a.latency.max() >= MAX_LATENCY_NS / 2);
    }

    #[test]
    fn empty_step_has_zero_latencies_and_server_figures() {
        let r = Recorder::new();
        let usage = ServerUsage {
            cpu_s: 0.5,
            rss_kb: Some(1234),
        };
        let s = StepResult::from_recorder(1, 1.0, &r, Some(usage), true);
        assert_eq!((s.p50_us, s.max_us, s.requests_per_s), (0.0, 0.0, 0.0));
        assert_eq!(s.server_cpu_us_per_req, None);
        assert_eq!(s.server_cpu_percent, Some(50.0));
        assert_eq!(s.server_rss_kb, Some(1234));
        assert!(s.partial);

        let mut r = Recorder::new();
        for _ in 0..1000 {
            r.complete(1);
        }
        let s = StepResult::from_recorder(1, 1.0, &r, Some(usage), false);
        assert_eq!(s.server_cpu_us_per_req, Some(500.0));
    }
}
