//! Result formats: an aligned table (default), CSV and JSON. Table and CSV rows are
//! printed as each step finishes; JSON is one document at the end.

use crate::stats::StepResult;
use serde::{Deserialize, Serialize};

/// How results are printed on stdout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// Human-readable, aligned columns.
    Table,
    /// Comma-separated values with a header line.
    Csv,
    /// One JSON document.
    Json,
}

/// What was benchmarked, for the JSON report.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RunInfo {
    /// Target URI as given.
    pub uri: String,
    /// Resolved server address.
    pub target: String,
    /// Request method.
    pub method: String,
    /// The URI scheme: coap, coaps, coap+tcp, coap+ws or http (absent from reports
    /// written before it was added).
    #[serde(default)]
    pub scheme: String,
    /// "CON" or "NON" for CoAP over UDP and DTLS; "RFC 8323 (no message type)" over TCP
    /// and WebSockets; "HTTP/1.1 keep-alive" or "HTTP/1.1 close" for HTTP.
    pub message_type: String,
    /// A new DTLS session or connection for every request (`--new-session`): each
    /// completed request is one handshake, and its latency includes the handshake.
    #[serde(default)]
    pub new_session: bool,
    /// Measured seconds per step.
    pub duration_s: f64,
    /// Warm-up seconds per step.
    pub warmup_s: f64,
    /// Request timeout in seconds.
    pub timeout_s: f64,
    /// Load-generator threads.
    pub threads: usize,
    /// Open-loop target rate in requests/s (`--rate`); absent in the closed loop.
    pub rate: Option<f64>,
    /// `--server-pid`, if given.
    pub server_pid: Option<u32>,
}

#[cfg(test)]
impl RunInfo {
    /// A closed-loop CON GET run of `uri`, for tests.
    pub fn sample(uri: &str) -> RunInfo {
        RunInfo {
            uri: uri.into(),
            target: "127.0.0.1:5683".into(),
            method: "GET".into(),
            scheme: "coap".into(),
            message_type: "CON".into(),
            new_session: false,
            duration_s: 1.0,
            warmup_s: 0.0,
            timeout_s: 10.0,
            threads: 1,
            rate: None,
            server_pid: None,
        }
    }
}

/// The JSON document.
#[derive(Serialize)]
struct Report<'a> {
    #[serde(flatten)]
    info: &'a RunInfo,
    interrupted: bool,
    steps: &'a [StepResult],
}

/// CSV columns, in order.
pub const CSV_COLUMNS: &[&str] = &[
    "clients",
    "duration_s",
    "requests_per_s",
    "sent",
    "completed",
    "lost",
    "errors",
    "resets",
    "mean_us",
    "p50_us",
    "p90_us",
    "p99_us",
    "p999_us",
    "max_us",
    "server_cpu_us_per_req",
    "server_cpu_percent",
    "server_rss_kb",
    "partial",
    "client_cpu_percent",
    "non_2xx",
    "non_2xx_codes",
];

/// Non-2.xx answers by code, e.g. `5.03=120 4.04=3` (no commas, so it fits a CSV cell).
pub fn codes_text(s: &StepResult, sep: &str) -> String {
    s.non_2xx_codes
        .iter()
        .map(|(code, n)| format!("{code}{sep}{n}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// The line printed before the first row, if the format has one.
pub fn header(format: Format, with_server: bool) -> Option<String> {
    match format {
        Format::Table => {
            let mut h = format!(
                "{:>7} {:>11} {:>10} {:>8} {:>7} {:>7} {:>7} {:>9} {:>9} {:>9} {:>9} {:>9}",
                "clients",
                "req/s",
                "completed",
                "non-2xx",
                "lost",
                "errors",
                "resets",
                "p50(us)",
                "p90(us)",
                "p99(us)",
                "p99.9(us)",
                "max(us)"
            );
            if with_server {
                h.push_str(&format!(
                    " {:>11} {:>8} {:>10}",
                    "srv(us/req)", "srv(cpu%)", "srv(RSS kB)"
                ));
            }
            Some(h)
        }
        Format::Csv => Some(CSV_COLUMNS.join(",")),
        Format::Json => None,
    }
}

fn opt_f(v: Option<f64>, prec: usize) -> String {
    v.map(|x| format!("{x:.prec$}")).unwrap_or_default()
}

/// The line printed for one finished step, if the format prints per step.
pub fn row(format: Format, s: &StepResult, with_server: bool) -> Option<String> {
    match format {
        Format::Table => {
            let mut r = format!(
                "{:>7} {:>11.0} {:>10} {:>8} {:>7} {:>7} {:>7} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>9.1}",
                s.clients,
                s.requests_per_s,
                s.completed,
                s.non_2xx,
                s.lost,
                s.errors,
                s.resets,
                s.p50_us,
                s.p90_us,
                s.p99_us,
                s.p999_us,
                s.max_us
            );
            if with_server {
                let na = || "-".to_string();
                r.push_str(&format!(
                    " {:>11} {:>9} {:>11}",
                    s.server_cpu_us_per_req
                        .map(|v| format!("{v:.2}"))
                        .unwrap_or_else(na),
                    s.server_cpu_percent
                        .map(|v| format!("{v:.1}"))
                        .unwrap_or_else(na),
                    s.server_rss_kb.map(|v| v.to_string()).unwrap_or_else(na),
                ));
            }
            if s.non_2xx > 0 {
                r.push_str(&format!("  [{}]", codes_text(s, ": ")));
            }
            if s.partial {
                r.push_str(&format!("  (interrupted after {:.1}s)", s.duration_s));
            }
            Some(r)
        }
        Format::Csv => Some(format!(
            "{},{:.3},{:.1},{},{},{},{},{},{:.3},{:.3},{:.3},{:.3},{:.3},{:.3},{},{},{},{},{},{},{}",
            s.clients,
            s.duration_s,
            s.requests_per_s,
            s.sent,
            s.completed,
            s.lost,
            s.errors,
            s.resets,
            s.mean_us,
            s.p50_us,
            s.p90_us,
            s.p99_us,
            s.p999_us,
            s.max_us,
            opt_f(s.server_cpu_us_per_req, 3),
            opt_f(s.server_cpu_percent, 2),
            s.server_rss_kb.map(|v| v.to_string()).unwrap_or_default(),
            s.partial,
            opt_f(s.client_cpu_percent, 1),
            s.non_2xx,
            codes_text(s, "=")
        )),
        Format::Json => None,
    }
}

/// The whole JSON document.
pub fn json(info: &RunInfo, steps: &[StepResult], interrupted: bool) -> String {
    let report = Report {
        info,
        interrupted,
        steps,
    };
    serde_json::to_string_pretty(&report).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::{AnswerCode, Recorder, ServerUsage, StepResult};

    fn step(server: bool) -> StepResult {
        let mut r = Recorder::new();
        r.sent = 11;
        r.lost = 1;
        for i in 1..=10 {
            r.complete(i * 10_000);
        }
        for _ in 0..3 {
            r.answer(AnswerCode::Coap(0xa3), 1_000);
        }
        r.answer(AnswerCode::Coap(0x84), 1_000);
        let usage = server.then_some(ServerUsage {
            cpu_s: 0.001,
            rss_kb: Some(2048),
        });
        StepResult::from_recorder(10, 1.0, &r, usage, false)
    }

    fn info() -> RunInfo {
        RunInfo::sample("coap://127.0.0.1/x")
    }

    #[test]
    fn csv_header_and_row_line_up() {
        let h = header(Format::Csv, false).unwrap();
        assert!(
            h.starts_with("clients,duration_s,requests_per_s,sent,completed,lost,errors,resets,")
        );
        assert!(h.contains("p50_us,p90_us,p99_us,p999_us,max_us"));
        let cols = h.split(',').count();
        let r = row(Format::Csv, &step(false), false).unwrap();
        assert_eq!(r.split(',').count(), cols);
        assert!(r.starts_with("10,1.000,10.0,11,10,1,0,0,"), "{r}");
        assert!(r.ends_with(",,,,false,,4,4.04=1 5.03=3"), "{r}");
        let r = row(Format::Csv, &step(true), true).unwrap();
        assert_eq!(r.split(',').count(), cols);
        assert!(
            r.ends_with(",100.000,0.10,2048,false,,4,4.04=1 5.03=3"),
            "{r}"
        );
        let mut busy = step(false);
        busy.client_cpu_percent = Some(97.0);
        let r = row(Format::Csv, &busy, false).unwrap();
        assert!(r.ends_with(",false,97.0,4,4.04=1 5.03=3"), "{r}");
    }

    #[test]
    fn json_has_expected_keys() {
        let doc = json(&info(), &[step(true)], false);
        let v: serde_json::Value = serde_json::from_str(&doc).unwrap();
        assert_eq!(v["uri"], "coap://127.0.0.1/x");
        assert_eq!(v["message_type"], "CON");
        assert_eq!(
            (&v["scheme"], &v["new_session"]),
            (&"coap".into(), &false.into())
        );
        assert_eq!(v["interrupted"], false);
        let s = &v["steps"][0];
        for key in CSV_COLUMNS {
            assert!(s.get(key).is_some(), "missing {key}");
        }
        assert_eq!(s["clients"], 10);
        assert_eq!(s["completed"], 10);
        assert_eq!(s["lost"], 1);
        assert_eq!(s["non_2xx"], 4);
        assert_eq!(s["non_2xx_codes"]["5.03"], 3);
        assert_eq!(s["non_2xx_codes"]["4.04"], 1);
        assert_eq!(s["server_rss_kb"], 2048);
        let doc = json(&info(), &[step(false)], true);
        let v: serde_json::Value = serde_json::from_str(&doc).unwrap();
        assert!(v["steps"][0]["server_cpu_us_per_req"].is_null());
        assert_eq!(v["interrupted"], true);
    }

    #[test]
    fn table_columns() {
        let h = header(Format::Table, true).unwrap();
        assert!(h.contains("req/s") && h.contains("p99.9(us)") && h.contains("srv(us/req)"));
        let r = row(Format::Table, &step(true), true).unwrap();
        assert!(r.trim_start().starts_with("10 "));
        assert!(r.contains("100.00") && r.contains("2048"));
        // Completed counts 2.xx only; the other answers are listed by code.
        assert!(r.contains("[4.04: 1 5.03: 3]"), "{r}");
        let cols: Vec<&str> = r.split_whitespace().collect();
        assert_eq!((cols[2], cols[3]), ("10", "4"), "{r}");
        assert!(header(Format::Json, false).is_none());
        assert!(row(Format::Json, &step(false), false).is_none());
    }
}
