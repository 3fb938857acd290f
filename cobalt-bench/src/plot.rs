//! SVG plots of benchmark results against concurrency, written as plain SVG text:
//! `--plot FILE.svg` for the run just made, and `cobalt bench plot a.json b.json …`
//! to overlay the JSON reports of several runs in one figure (the paper's Fig. 3–5
//! comparisons).
//!
//! Left axis (linear): 2.xx throughput, and answers other than 2.xx per second, one
//! line per code, so that a server refusing requests quickly never looks fast. Right
//! axis (logarithmic, µs): p50 and p99 latency, and the server's CPU µs per completed
//! request when the run had `--server-pid`. One run: a colour per metric; several:
//! a colour per run and a line style per metric.

use crate::output::RunInfo;
use crate::stats::StepResult;
use serde::Deserialize;
use std::fmt::Write;

const W: f64 = 900.0;
const H: f64 = 540.0;
const LEFT: f64 = 90.0;
const RIGHT: f64 = 90.0;
const BOTTOM: f64 = 70.0;
/// Height of one row of legend entries.
const LEGEND_ROW: f64 = 16.0;
/// Legend entries per row.
const LEGEND_COLUMNS: usize = 4;

/// Colours: per metric for one run, per run for several.
const PALETTE: [&str; 8] = [
    "#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf",
];

/// One run to draw: a label for the legend and its steps.
pub struct Run<'a> {
    /// The legend's name for it.
    pub label: String,
    /// What was benchmarked.
    pub info: &'a RunInfo,
    /// Its steps.
    pub steps: &'a [StepResult],
}

/// A `cobalt bench --json` report, as read back for `cobalt bench plot`.
#[derive(Debug, Deserialize)]
pub struct Report {
    /// What was benchmarked.
    #[serde(flatten)]
    pub info: RunInfo,
    /// The steps.
    pub steps: Vec<StepResult>,
}

/// Reads a `cobalt bench --json` report; the error names the file.
pub fn read_report(path: &std::path::Path) -> Result<Report, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    serde_json::from_str(&text).map_err(|e| {
        format!(
            "{} is not a `cobalt bench --json` report: {e}",
            path.display()
        )
    })
}

/// A "nice" upper bound (1, 2, 2.5 or 5 times a power of ten) at or above `v`.
fn nice_ceiling(v: f64) -> f64 {
    if v <= 0.0 || !v.is_finite() {
        return 1.0;
    }
    let p = 10f64.powf(v.log10().floor());
    for m in [1.0, 2.0, 2.5, 5.0, 10.0] {
        if m * p >= v {
            return m * p;
        }
    }
    10.0 * p
}

/// Compact number label: 1500 -> "1.5k", 2000000 -> "2M".
fn label(v: f64) -> String {
    let (x, suffix) = if v >= 1e6 {
        (v / 1e6, "M")
    } else if v >= 1e3 {
        (v / 1e3, "k")
    } else {
        (v, "")
    };
    let s = format!("{x:.1}");
    let s = s.strip_suffix(".0").unwrap_or(&s);
    format!("{s}{suffix}")
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// Answers per second with `code` in step `s`.
fn code_rate(s: &StepResult, code: &str) -> f64 {
    let n = s.non_2xx_codes.get(code).copied().unwrap_or(0);
    if s.duration_s > 0.0 {
        n as f64 / s.duration_s
    } else {
        0.0
    }
}

/// Which axis a series is drawn against.
#[derive(Clone, Copy, PartialEq)]
enum Axis {
    /// Left, linear: per second.
    Rate,
    /// Right, logarithmic: microseconds.
    Micros,
}

/// One line of the figure.
struct Series<'a> {
    name: String,
    color: &'a str,
    dash: &'a str,
    axis: Axis,
    /// (clients, value) points; values of 0 or less are left out on the log axis.
    points: Vec<(usize, f64)>,
}

/// The metrics of one run, as series with `color` (one run: `None`, a colour each).
fn run_series<'a>(run: &Run, prefix: &str, color: Option<&'a str>) -> Vec<Series<'a>> {
    let line = |name: &str, i: usize, dash: &'a str, axis, f: &dyn Fn(&StepResult) -> f64| Series {
        name: format!("{prefix}{name}"),
        color: color.unwrap_or(PALETTE[i % PALETTE.len()]),
        dash,
        axis,
        points: run.steps.iter().map(|s| (s.clients, f(s))).collect(),
    };
    let mut out = vec![
        line("2.xx req/s", 0, "", Axis::Rate, &|s| s.requests_per_s),
        line("p50 latency", 2, "6,3", Axis::Micros, &|s| s.p50_us),
        line("p99 latency", 1, "2,3", Axis::Micros, &|s| s.p99_us),
    ];
    if run.steps.iter().any(|s| s.server_cpu_us_per_req.is_some()) {
        out.push(line(
            "server CPU µs/req",
            3,
            "10,3,2,3",
            Axis::Micros,
            &|s| s.server_cpu_us_per_req.unwrap_or(0.0),
        ));
    }
    let codes: std::collections::BTreeSet<&str> = run
        .steps
        .iter()
        .flat_map(|s| s.non_2xx_codes.keys().map(String::as_str))
        .collect();
    for (i, code) in codes.into_iter().enumerate() {
        let name = format!("{code} answers/s");
        out.push(line(&name, 4 + i, "1,2", Axis::Rate, &|s| {
            code_rate(s, code)
        }));
    }
    out
}

/// Renders the SVG document for one or more runs.
pub fn svg(runs: &[Run]) -> String {
    let series: Vec<Series> = match runs {
        [one] => run_series(one, "", None),
        many => many
            .iter()
            .enumerate()
            .flat_map(|(i, r)| {
                run_series(
                    r,
                    &format!("{}: ", r.label),
                    Some(PALETTE[i % PALETTE.len()]),
                )
            })
            .collect(),
    };
    let rows = series.len().div_ceil(LEGEND_COLUMNS).max(1);
    let top = 40.0 + LEGEND_ROW * rows as f64 + 10.0;
    let pw = W - LEFT - RIGHT;
    let ph = H - top - BOTTOM;
    let all_clients = || {
        runs.iter()
            .flat_map(|r| r.steps.iter().map(|s| s.clients.max(1)))
    };
    let xmin = all_clients().min().unwrap_or(1) as f64;
    let xmax = all_clients().max().unwrap_or(1) as f64;
    let log_x = xmax / xmin >= 10.0;
    let x = |c: usize| -> f64 {
        let c = c.max(1) as f64;
        if xmax <= xmin {
            LEFT + pw / 2.0
        } else if log_x {
            LEFT + pw * (c.ln() - xmin.ln()) / (xmax.ln() - xmin.ln())
        } else {
            LEFT + pw * (c - xmin) / (xmax - xmin)
        }
    };
    let values = |axis: Axis| {
        series
            .iter()
            .filter(move |s| s.axis == axis)
            .flat_map(|s| s.points.iter().map(|p| p.1))
            .filter(|v| v.is_finite() && *v > 0.0)
    };
    let tmax = nice_ceiling(values(Axis::Rate).fold(0.0, f64::max));
    // Latency axis: whole decades around every positive value.
    let lmin_exp = values(Axis::Micros)
        .fold(f64::INFINITY, f64::min)
        .log10()
        .floor();
    let lmax_exp = values(Axis::Micros).fold(0.0, f64::max).log10().ceil();
    let (lmin_exp, lmax_exp) = if lmin_exp.is_finite() && lmax_exp > lmin_exp {
        (lmin_exp, lmax_exp)
    } else if lmin_exp.is_finite() {
        (lmin_exp, lmin_exp + 1.0)
    } else {
        (0.0, 3.0)
    };
    let y = |axis: Axis, v: f64| -> Option<f64> {
        match axis {
            Axis::Rate => Some(top + ph * (1.0 - v / tmax)),
            Axis::Micros if v > 0.0 && v.is_finite() => {
                Some(top + ph * (1.0 - (v.log10() - lmin_exp) / (lmax_exp - lmin_exp)))
            }
            Axis::Micros => None,
        }
    };

    let mut o = String::new();
    let _ = writeln!(
        o,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(o, r#"<rect width="{W}" height="{H}" fill="white"/>"#);
    let title = match runs {
        [one] => format!(
            "cobalt bench {} ({} {})",
            one.info.uri, one.info.message_type, one.info.method
        ),
        many => format!("cobalt bench: {} runs", many.len()),
    };
    let _ = writeln!(
        o,
        r#"<text x="{}" y="24" text-anchor="middle" font-size="16">{}</text>"#,
        W / 2.0,
        escape(&title)
    );
    // Left axis: five linear divisions, with a grid.
    for i in 0..=5 {
        let f = i as f64 / 5.0;
        let yy = top + ph * (1.0 - f);
        let _ = writeln!(
            o,
            r##"<line x1="{LEFT}" y1="{yy:.1}" x2="{:.1}" y2="{yy:.1}" stroke="#ddd"/><text x="{:.1}" y="{:.1}" text-anchor="end" fill="#333">{}</text>"##,
            LEFT + pw,
            LEFT - 6.0,
            yy + 4.0,
            label(tmax * f)
        );
    }
    // Right axis: a tick per decade.
    let mut e = lmin_exp;
    while e <= lmax_exp {
        if let Some(yy) = y(Axis::Micros, 10f64.powf(e)) {
            let _ = writeln!(
                o,
                r##"<line x1="{:.1}" y1="{yy:.1}" x2="{:.1}" y2="{yy:.1}" stroke="#333"/><text x="{:.1}" y="{:.1}" fill="#333">{}</text>"##,
                LEFT + pw,
                LEFT + pw + 5.0,
                LEFT + pw + 8.0,
                yy + 4.0,
                label(10f64.powf(e))
            );
        }
        e += 1.0;
    }
    // X ticks at every concurrency measured.
    let mut ticks: Vec<usize> = all_clients().collect();
    ticks.sort_unstable();
    ticks.dedup();
    for c in ticks {
        let xx = x(c);
        let _ = writeln!(
            o,
            r##"<line x1="{xx:.1}" y1="{:.1}" x2="{xx:.1}" y2="{:.1}" stroke="#999"/><text x="{xx:.1}" y="{:.1}" text-anchor="middle">{c}</text>"##,
            top + ph,
            top + ph + 5.0,
            top + ph + 18.0
        );
    }
    let _ = writeln!(
        o,
        r##"<rect x="{LEFT}" y="{top}" width="{pw}" height="{ph}" fill="none" stroke="#333"/>"##
    );
    let _ = writeln!(
        o,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">concurrent clients{}</text>"#,
        LEFT + pw / 2.0,
        H - 30.0,
        if log_x { " (log scale)" } else { "" }
    );
    let _ = writeln!(
        o,
        r##"<text transform="translate(22,{:.1}) rotate(-90)" text-anchor="middle" fill="#333">answers per second (2.xx; other codes dotted)</text>"##,
        top + ph / 2.0
    );
    let _ = writeln!(
        o,
        r##"<text transform="translate({:.1},{:.1}) rotate(90)" text-anchor="middle" fill="#333">µs (log scale): latency, server CPU per request</text>"##,
        W - 22.0,
        top + ph / 2.0
    );
    for (i, s) in series.iter().enumerate() {
        let pts: Vec<(f64, f64)> = s
            .points
            .iter()
            .filter_map(|&(c, v)| Some((x(c), y(s.axis, v)?)))
            .collect();
        let dash = if s.dash.is_empty() {
            String::new()
        } else {
            format!(r#" stroke-dasharray="{}""#, s.dash)
        };
        if pts.len() > 1 {
            let line: Vec<String> = pts.iter().map(|(a, b)| format!("{a:.1},{b:.1}")).collect();
            let _ = writeln!(
                o,
                r#"<polyline points="{}" fill="none" stroke="{}" stroke-width="2"{dash}/>"#,
                line.join(" "),
                s.color
            );
        }
        for (a, b) in &pts {
            let _ = writeln!(
                o,
                r#"<circle cx="{a:.1}" cy="{b:.1}" r="3" fill="{}"/>"#,
                s.color
            );
        }
        let lx = LEFT + 10.0 + (pw / LEGEND_COLUMNS as f64) * (i % LEGEND_COLUMNS) as f64;
        let ly = 42.0 + LEGEND_ROW * (i / LEGEND_COLUMNS) as f64;
        let _ = writeln!(
            o,
            r#"<line x1="{lx:.1}" y1="{ly:.1}" x2="{:.1}" y2="{ly:.1}" stroke="{}" stroke-width="2"{dash}/><text x="{:.1}" y="{:.1}">{}</text>"#,
            lx + 24.0,
            s.color,
            lx + 30.0,
            ly + 4.0,
            escape(&s.name)
        );
    }
    o.push_str("</svg>\n");
    o
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::{AnswerCode, Recorder, ServerUsage};

    #[test]
    fn nice_numbers_and_labels() {
        assert_eq!(nice_ceiling(0.0), 1.0);
        assert_eq!(nice_ceiling(7.0), 10.0);
        assert_eq!(nice_ceiling(180.0), 200.0);
        assert_eq!(nice_ceiling(240_000.0), 250_000.0);
        assert_eq!(label(1500.0), "1.5k");
        assert_eq!(label(2_000_000.0), "2M");
        assert_eq!(label(12.0), "12");
    }

    fn steps(server: bool, refusals: bool) -> Vec<StepResult> {
        [(1usize, 50u64), (10, 80), (100, 400)]
            .into_iter()
            .map(|(c, lat)| {
                let mut r = Recorder::new();
                for _ in 0..100 {
                    r.complete(lat * 1000);
                }
                if refusals {
                    r.answer(AnswerCode::Coap(0xa3), 1);
                }
                let usage = server.then_some(ServerUsage {
                    cpu_s: 0.001,
                    rss_kb: None,
                });
                StepResult::from_recorder(c, 1.0, &r, usage, false)
            })
            .collect()
    }

    #[test]
    fn one_run_has_every_series_on_its_axis() {
        let info = RunInfo::sample("coap://h/<x>");
        let steps = steps(true, true);
        let s = svg(&[Run {
            label: "a".into(),
            info: &info,
            steps: &steps,
        }]);
        assert!(s.starts_with("<svg") && s.trim_end().ends_with("</svg>"));
        // Throughput, p50, p99, server CPU, 5.03.
        assert_eq!(s.matches("<polyline").count(), 5);
        assert!(s.contains("server CPU µs/req") && s.contains("5.03 answers/s"));
        assert!(s.contains("&lt;x&gt;") && !s.contains("<x>"));
        assert!(s.contains("concurrent clients (log scale)"));
        // The latency axis is logarithmic: decade ticks 10, 100, 1k.
        assert!(s.contains(">10</text>") && s.contains(">100</text>") && s.contains(">1k</text>"));
        // A single step still renders (points, no lines).
        let one = svg(&[Run {
            label: "a".into(),
            info: &info,
            steps: &steps[..1],
        }]);
        assert_eq!(one.matches("<polyline").count(), 0);
        assert!(one.matches("<circle").count() >= 4);
    }

    #[test]
    fn several_runs_overlay_with_a_colour_each() {
        let info = RunInfo::sample("coap://h/x");
        let (a, b) = (steps(false, false), steps(true, false));
        let s = svg(&[
            Run {
                label: "cobalt".into(),
                info: &info,
                steps: &a,
            },
            Run {
                label: "libcoap".into(),
                info: &info,
                steps: &b,
            },
        ]);
        assert!(s.contains("cobalt bench: 2 runs"));
        assert!(s.contains("cobalt: 2.xx req/s") && s.contains("libcoap: p99 latency"));
        assert!(s.contains("libcoap: server CPU µs/req") && !s.contains("cobalt: server CPU"));
        assert!(s.contains(PALETTE[0]) && s.contains(PALETTE[1]));
    }
}
