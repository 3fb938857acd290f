//! `--plot FILE.svg`: throughput (left axis) and p50/p99 latency (right axis) against
//! concurrency, written as plain SVG text. Answers other than 2.xx are drawn as their
//! own rates on the throughput axis, one line per code, so that a server refusing
//! requests quickly never looks fast.

use super::output::RunInfo;
use super::stats::StepResult;
use std::fmt::Write;

const W: f64 = 860.0;
const H: f64 = 500.0;
const LEFT: f64 = 90.0;
const RIGHT: f64 = 90.0;
const TOP: f64 = 60.0;
const BOTTOM: f64 = 70.0;

const THROUGHPUT: &str = "#1f77b4";
const P50: &str = "#2ca02c";
const P99: &str = "#d62728";
/// Colours of the non-2.xx series, in turn.
const OTHER: [&str; 4] = ["#ff7f0e", "#9467bd", "#8c564b", "#e377c2"];

/// Answers per second with `code` in step `s`.
fn code_rate(s: &StepResult, code: &str) -> f64 {
    let n = s.non_2xx_codes.get(code).copied().unwrap_or(0);
    if s.duration_s > 0.0 {
        n as f64 / s.duration_s
    } else {
        0.0
    }
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

/// Renders the SVG document.
pub fn svg(info: &RunInfo, steps: &[StepResult]) -> String {
    let pw = W - LEFT - RIGHT;
    let ph = H - TOP - BOTTOM;
    let xmin = steps.iter().map(|s| s.clients).min().unwrap_or(1).max(1) as f64;
    let xmax = steps.iter().map(|s| s.clients).max().unwrap_or(1).max(1) as f64;
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
    let codes: std::collections::BTreeSet<&str> = steps
        .iter()
        .flat_map(|s| s.non_2xx_codes.keys().map(String::as_str))
        .collect();
    let tmax = nice_ceiling(
        steps
            .iter()
            .flat_map(|s| {
                std::iter::once(s.requests_per_s).chain(codes.iter().map(|c| code_rate(s, c)))
            })
            .fold(0.0, f64::max),
    );
    let lmax = nice_ceiling(
        steps
            .iter()
            .map(|s| s.p99_us.max(s.p50_us))
            .fold(0.0, f64::max),
    );
    let yt = |v: f64| TOP + ph * (1.0 - v / tmax);
    let yl = |v: f64| TOP + ph * (1.0 - v / lmax);

    let mut o = String::new();
    let _ = writeln!(
        o,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(o, r#"<rect width="{W}" height="{H}" fill="white"/>"#);
    let _ = writeln!(
        o,
        r#"<text x="{}" y="24" text-anchor="middle" font-size="16">cobalt bench {} ({} {})</text>"#,
        W / 2.0,
        escape(&info.uri),
        escape(&info.message_type),
        escape(&info.method)
    );
    // Horizontal grid and both y axes.
    for i in 0..=5 {
        let f = i as f64 / 5.0;
        let y = TOP + ph * (1.0 - f);
        let _ = writeln!(
            o,
            r##"<line x1="{LEFT}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#ddd"/>"##,
            LEFT + pw
        );
        let _ = writeln!(
            o,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="end" fill="{THROUGHPUT}">{}</text>"#,
            LEFT - 6.0,
            y + 4.0,
            label(tmax * f)
        );
        let _ = writeln!(
            o,
            r##"<text x="{:.1}" y="{:.1}" fill="#333">{}</text>"##,
            LEFT + pw + 6.0,
            y + 4.0,
            label(lmax * f)
        );
    }
    // X ticks at every step.
    for s in steps {
        let xx = x(s.clients);
        let _ = writeln!(
            o,
            r##"<line x1="{xx:.1}" y1="{:.1}" x2="{xx:.1}" y2="{:.1}" stroke="#999"/>"##,
            TOP + ph,
            TOP + ph + 5.0
        );
        let _ = writeln!(
            o,
            r#"<text x="{xx:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
            TOP + ph + 18.0,
            s.clients
        );
    }
    let _ = writeln!(
        o,
        r##"<rect x="{LEFT}" y="{TOP}" width="{pw}" height="{ph}" fill="none" stroke="#333"/>"##
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
        r#"<text transform="translate(22,{:.1}) rotate(-90)" text-anchor="middle" fill="{THROUGHPUT}">throughput (requests/s)</text>"#,
        TOP + ph / 2.0
    );
    let _ = writeln!(
        o,
        r##"<text transform="translate({:.1},{:.1}) rotate(90)" text-anchor="middle" fill="#333">latency (µs)</text>"##,
        W - 22.0,
        TOP + ph / 2.0
    );
    type YOf<'f> = Box<dyn Fn(&StepResult) -> f64 + 'f>;
    let mut series: Vec<(String, &str, YOf)> = vec![
        (
            "2.xx throughput".into(),
            THROUGHPUT,
            Box::new(|s: &StepResult| yt(s.requests_per_s)),
        ),
        (
            "p50 latency".into(),
            P50,
            Box::new(|s: &StepResult| yl(s.p50_us)),
        ),
        (
            "p99 latency".into(),
            P99,
            Box::new(|s: &StepResult| yl(s.p99_us)),
        ),
    ];
    for (i, code) in codes.iter().enumerate() {
        series.push((
            format!("{code} answers/s"),
            OTHER[i % OTHER.len()],
            Box::new(move |s: &StepResult| yt(code_rate(s, code))),
        ));
    }
    for (i, (name, color, y)) in series.iter().enumerate() {
        let points: Vec<String> = steps
            .iter()
            .map(|s| format!("{:.1},{:.1}", x(s.clients), y(s)))
            .collect();
        let dash = if i == 0 {
            ""
        } else {
            r#" stroke-dasharray="6,3""#
        };
        let _ = writeln!(
            o,
            r#"<polyline points="{}" fill="none" stroke="{color}" stroke-width="2"{dash}/>"#,
            points.join(" ")
        );
        for s in steps {
            let _ = writeln!(
                o,
                r#"<circle cx="{:.1}" cy="{:.1}" r="3.5" fill="{color}"/>"#,
                x(s.clients),
                y(s)
            );
        }
        // Legend: four entries a row above the plot.
        let lx = LEFT + 10.0 + 170.0 * (i % 4) as f64;
        let ly = 40.0 + 14.0 * (i / 4) as f64 - 7.0 * (series.len() > 4) as u8 as f64;
        let _ = writeln!(
            o,
            r#"<line x1="{lx:.1}" y1="{ly:.1}" x2="{:.1}" y2="{ly:.1}" stroke="{color}" stroke-width="2"{dash}/><text x="{:.1}" y="{:.1}">{}</text>"#,
            lx + 24.0,
            lx + 30.0,
            ly + 4.0,
            escape(name)
        );
    }
    o.push_str("</svg>\n");
    o
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::stats::{Recorder, StepResult};

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

    #[test]
    fn svg_has_all_series() {
        let mut steps = Vec::new();
        for (c, lat) in [(1usize, 50u64), (10, 80), (100, 400)] {
            let mut r = Recorder::new();
            for _ in 0..100 {
                r.complete(lat * 1000);
            }
            steps.push(StepResult::from_recorder(c, 1.0, &r, None, false));
        }
        let info = crate::bench::output::RunInfo::sample("coap://h/<x>");
        let s = svg(&info, &steps);
        assert!(s.starts_with("<svg") && s.trim_end().ends_with("</svg>"));
        assert_eq!(s.matches("<polyline").count(), 3);
        assert_eq!(s.matches("<circle").count(), 9);
        assert!(s.contains("&lt;x&gt;") && !s.contains("<x>"));
        assert!(s.contains("(log scale)"));
        // A single step still renders.
        let one = svg(&info, &steps[..1]);
        assert_eq!(one.matches("<circle").count(), 3);
        // Non-2.xx answers get a series per code.
        let mut r = Recorder::new();
        r.complete(1000);
        r.answer(crate::bench::stats::AnswerCode::Coap(0xa3), 1000);
        r.answer(crate::bench::stats::AnswerCode::Coap(0x84), 1000);
        steps.push(StepResult::from_recorder(1000, 1.0, &r, None, false));
        let s = svg(&info, &steps);
        assert_eq!(s.matches("<polyline").count(), 5);
        assert!(s.contains("5.03 answers/s") && s.contains("4.04 answers/s"));
    }
}
